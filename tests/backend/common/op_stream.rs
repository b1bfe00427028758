//! The op stream's counters (`burn_mlx::op_stream_stats`) are process-wide, so the tests that read
//! them hold one lock and run one at a time: each one then counts only its own blocks.

use std::sync::{Mutex, MutexGuard};

static OP_STREAM: Mutex<()> = Mutex::new(());

/// Holds the op stream's counters for the calling test until the guard is dropped.
pub fn op_stream_alone() -> MutexGuard<'static, ()> {
    OP_STREAM.lock().unwrap_or_else(|e| e.into_inner())
}

/// Checks that some of the op stream's blocks ran compiled since `before`, and that none gave up
/// (the caller holds [`op_stream_alone`]). Returns the counters now.
pub fn assert_compiled(name: &str, before: burn_mlx::OpStreamStats) -> burn_mlx::OpStreamStats {
    let after = burn_mlx::op_stream_stats();
    println!("{name}: op stream {before:?} -> {after:?}");
    assert!(
        after.compiled_runs > before.compiled_runs,
        "{name}: no block of the op stream ran compiled ({before:?} -> {after:?})"
    );
    assert_eq!(
        after.given_up, before.given_up,
        "{name}: a block of the op stream gave up compiling ({before:?} -> {after:?})"
    );
    after
}
