//! Tests whose subject is state MLX or burn-mlx keeps for the whole process: the automatic
//! compile pass's thresholds and counters, the seeded random generator, and the resident memory
//! of a long training run; and the fused layers' checks, whose f64 reference needs burn-ndarray's
//! device set to f64 before any other use in the process. Each test holds [`one_at_a_time`], so
//! no other test of this binary evaluates, draws or allocates while it measures. The backend suite (`tests/backend/`) runs
//! in a process of its own, so it cannot disturb them either.

// Burn's `#[derive(Module)]` expands to paths under `burn::`.
extern crate burn_core as burn;

mod auto_compile;
mod fused_layers;
mod memory;
mod random;

use std::sync::{Mutex, MutexGuard};

/// Holds this binary's process-wide state for the calling test until the guard is dropped.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static ALONE: Mutex<()> = Mutex::new(());
    ALONE.lock().unwrap_or_else(|e| e.into_inner())
}
