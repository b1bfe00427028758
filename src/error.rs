//! Errors of the low-level [`MlxTensor`](crate::MlxTensor) API.

/// An error from MLX or from a check burn-mlx makes before calling it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MlxError {
    /// MLX rejected an operation (shape, dtype, device, memory…).
    #[error("MLX error in `{op}`: {message}")]
    Mlx {
        /// The operation that failed.
        op: String,
        /// MLX's own message.
        message: String,
    },
    /// The operation does not accept the given dtype.
    #[error("`{op}` does not support dtype {dtype}: {hint}")]
    Dtype {
        /// The operation.
        op: String,
        /// The dtype it was given.
        dtype: String,
        /// What to do instead.
        hint: String,
    },
    /// The shapes do not fit the operation.
    #[error("`{op}`: incompatible shapes {shapes}")]
    Shape {
        /// The operation.
        op: String,
        /// The shapes it was given.
        shapes: String,
    },
    /// The result would need more memory than the machine has.
    #[error(
        "`{op}`: a tensor of shape {shape} needs {bytes} bytes, more than this machine's memory \
         and swap ({available} bytes)"
    )]
    Memory {
        /// The operation.
        op: String,
        /// The shape and dtype of the tensor it would create.
        shape: String,
        /// The bytes the tensor needs.
        bytes: u64,
        /// The bytes of memory and swap the machine has.
        available: u64,
    },
    /// A file could not be written or read, or is not what the operation expects.
    #[error("`{op}` {path}: {message}")]
    File {
        /// The operation.
        op: String,
        /// The file.
        path: String,
        /// What went wrong, and what to do.
        message: String,
    },
    /// The requested device is not available in this build or on this machine.
    #[error("device {device} is not available: {hint}")]
    Device {
        /// The device asked for.
        device: String,
        /// Why, and what to do.
        hint: String,
    },
}

impl MlxError {
    /// Wraps an MLX exception raised by `op`.
    pub(crate) fn mlx(op: &str, e: impl std::fmt::Display) -> Self {
        MlxError::Mlx {
            op: op.to_string(),
            message: e.to_string(),
        }
    }
}

/// Converts an MLX error into Burn's execution error (for fallible Burn calls).
impl From<MlxError> for burn_backend::ExecutionError {
    fn from(e: MlxError) -> Self {
        burn_backend::ExecutionError::WithContext {
            reason: e.to_string(),
        }
    }
}
