//! Whether this thread is inside an MLX trace (a function being compiled by
//! [`compile`](fn@crate::compile) or written to a file by [`crate::export`]), and the check that
//! evaluations and data reads make.
//!
//! This state has its own module so that `tensor.rs` (which reads it before every evaluation)
//! and `compile/function.rs` (which sets it while tracing, and uses tensors) do not import each
//! other.

use crate::error::MlxError;
use std::cell::Cell;

thread_local! {
    /// Set while MLX traces a compiled function on this thread.
    static TRACING: Cell<bool> = const { Cell::new(false) };
    /// Set while the trace is for a function file ([`crate::export`]), which must hold only
    /// MLX's own primitives (no custom kernels).
    static EXPORTING: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is tracing a function for a file ([`crate::export`]).
pub(crate) fn is_exporting() -> bool {
    EXPORTING.with(Cell::get)
}

/// Marks this thread as tracing for a function file (and as tracing) for its lifetime.
pub(crate) struct ExportGuard(bool, #[allow(dead_code)] TraceGuard);

impl ExportGuard {
    /// Enters an export trace on this thread.
    pub(crate) fn enter() -> Self {
        let tracing = TraceGuard::enter();
        ExportGuard(EXPORTING.with(|t| t.replace(true)), tracing)
    }
}

impl Drop for ExportGuard {
    fn drop(&mut self) {
        let previous = self.0;
        EXPORTING.with(|t| t.set(previous));
    }
}

/// Fails with a clear error when `op` (an evaluation or data read) is called inside a function
/// that is being compiled: MLX cannot compute values while tracing, and the evaluation lock is
/// already held by the compiled call.
pub(crate) fn check_not_tracing(op: &str) -> Result<(), MlxError> {
    if is_tracing() {
        return Err(MlxError::Mlx {
            op: op.into(),
            message: "values cannot be read or evaluated inside a function that MLX traces \
                      (burn_mlx::compile, compile_float, or export): return the tensor from the \
                      function and evaluate the result instead, and keep decisions that depend \
                      on tensor values out of the traced function"
                .into(),
        });
    }
    Ok(())
}

/// Whether this thread is inside an MLX trace.
pub(crate) fn is_tracing() -> bool {
    TRACING.with(Cell::get)
}

/// Marks this thread as tracing for its lifetime, and restores the previous state when dropped,
/// also by a panic.
pub(crate) struct TraceGuard(bool);

impl TraceGuard {
    /// Enters a trace on this thread.
    pub(crate) fn enter() -> Self {
        TraceGuard(TRACING.with(|t| t.replace(true)))
    }
}

impl Drop for TraceGuard {
    fn drop(&mut self) {
        let previous = self.0;
        TRACING.with(|t| t.set(previous));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_sets_and_restores_the_flag() {
        assert!(check_not_tracing("eval").is_ok());
        {
            let _outer = TraceGuard::enter();
            let err = check_not_tracing("eval").unwrap_err().to_string();
            assert!(err.contains("eval") && err.contains("compile"), "{err}");
            {
                let _inner = TraceGuard::enter();
                assert!(check_not_tracing("into_data").is_err());
            }
            // Leaving the inner trace keeps the outer one.
            assert!(check_not_tracing("into_data").is_err());
        }
        assert!(check_not_tracing("eval").is_ok());
    }

    #[test]
    fn guard_restores_the_flag_after_a_panic() {
        let r = std::panic::catch_unwind(|| {
            let _g = TraceGuard::enter();
            panic!("inside a trace");
        });
        assert!(r.is_err());
        assert!(check_not_tracing("eval").is_ok());
    }
}
