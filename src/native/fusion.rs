//! The native side of the automatic compile pass ([`crate::compile::auto`], in
//! `mlx-sys/fusion.cpp`): the evaluation entry every burn-mlx evaluation goes through, and the
//! pass's settings and counters.

use crate::error::MlxError;
use mlx_rs::Array;

/// How many counters [`counters`] returns, in the order of
/// [`FusionStats`](crate::compile::auto::FusionStats)'s fields.
pub(crate) const COUNTERS: usize = 10;

/// The pass's counters so far, in the order the native pass keeps them.
pub(crate) fn counters() -> [u64; COUNTERS] {
    let mut out = [0u64; COUNTERS];
    // SAFETY: `out` is a writable buffer of exactly the 10 counters the function writes.
    unsafe { mlx_sys::burn_mlx_fusion_stats(out.as_mut_ptr()) };
    out
}

/// Sets the sightings after which a structure is compiled, for GPU graphs (`gpu`) or CPU graphs;
/// the native pass keeps it as a C `int`, so `n` saturates at `i32::MAX`.
pub(crate) fn set_threshold(gpu: bool, n: u32) {
    // SAFETY: plain store of a setting (an atomic in the native pass); no pointers.
    unsafe { mlx_sys::burn_mlx_fusion_set_threshold(gpu, n.min(i32::MAX as u32) as i32) };
}

/// The sightings after which a structure on the GPU (`gpu`) or the CPU is compiled.
pub(crate) fn threshold(gpu: bool) -> u32 {
    // SAFETY: plain load of a setting (an atomic in the native pass); no pointers.
    unsafe { mlx_sys::burn_mlx_fusion_threshold(gpu) }.max(0) as u32
}

/// Forgets every recorded structure and compiled function.
pub(crate) fn clear() {
    // SAFETY: no arguments; the native pass takes its own lock while it clears its tables.
    unsafe { mlx_sys::burn_mlx_fusion_clear() };
}

/// Evaluates `arrays` through the native pass: waits for them when `wait`, otherwise starts
/// them (MLX's `async_eval`). A failure carries MLX's message, under the name `op`.
pub(crate) fn eval(op: &str, arrays: &[&Array], wait: bool) -> Result<(), MlxError> {
    let handles: Vec<mlx_sys::mlx_array> = arrays.iter().map(|a| a.as_ptr()).collect();
    let mut err = [0 as std::os::raw::c_char; 1024];
    // SAFETY: the handles are live for the call (borrowed from `arrays`); `err` is a writable
    // buffer of the given length, NUL-terminated by the callee on error.
    let rc = unsafe {
        mlx_sys::burn_mlx_eval(
            handles.as_ptr(),
            handles.len(),
            wait,
            err.as_mut_ptr(),
            err.len(),
        )
    };
    if rc == 0 {
        return Ok(());
    }
    // SAFETY: on failure the callee wrote a NUL-terminated message into `err`, which outlives
    // the borrow (it is copied by `to_string_lossy`).
    let message = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) };
    Err(MlxError::mlx(op, message.to_string_lossy()))
}
