//! Conversions between Burn's and MLX's element types.

use burn_backend::{BoolStore, DType, FloatDType, IntDType};
use mlx_rs::Dtype;

/// MLX dtype for a Burn dtype. Quantized dtypes map to their storage (handled by the caller).
pub(crate) fn to_mlx(dtype: DType) -> Dtype {
    match dtype {
        DType::F64 => Dtype::Float64,
        DType::F32 | DType::Flex32 => Dtype::Float32,
        DType::F16 => Dtype::Float16,
        DType::BF16 => Dtype::Bfloat16,
        DType::I64 => Dtype::Int64,
        DType::I32 => Dtype::Int32,
        DType::I16 => Dtype::Int16,
        DType::I8 => Dtype::Int8,
        DType::U64 => Dtype::Uint64,
        DType::U32 => Dtype::Uint32,
        DType::U16 => Dtype::Uint16,
        DType::U8 => Dtype::Uint8,
        DType::Bool(_) => Dtype::Bool,
        DType::QFloat(_) => Dtype::Int8,
    }
}

/// Burn dtype of an MLX dtype.
pub(crate) fn from_mlx(dtype: Dtype) -> DType {
    match dtype {
        Dtype::Float64 => DType::F64,
        Dtype::Float32 => DType::F32,
        Dtype::Float16 => DType::F16,
        Dtype::Bfloat16 => DType::BF16,
        Dtype::Int64 => DType::I64,
        Dtype::Int32 => DType::I32,
        Dtype::Int16 => DType::I16,
        Dtype::Int8 => DType::I8,
        Dtype::Uint64 => DType::U64,
        Dtype::Uint32 => DType::U32,
        Dtype::Uint16 => DType::U16,
        Dtype::Uint8 => DType::U8,
        Dtype::Bool => DType::Bool(BoolStore::Native),
        // Burn has no complex dtype; burn-mlx never creates complex arrays outside the FFT ops,
        // which split them into real and imaginary parts.
        Dtype::Complex64 => DType::F32,
    }
}

/// MLX dtype of a Burn float dtype.
pub(crate) fn float_mlx(dtype: FloatDType) -> Dtype {
    to_mlx(dtype.into())
}

/// MLX dtype of a Burn int dtype.
pub(crate) fn int_mlx(dtype: IntDType) -> Dtype {
    to_mlx(dtype.into())
}

/// Whether the MLX dtype is a floating-point type.
pub(crate) fn is_float(dtype: Dtype) -> bool {
    matches!(
        dtype,
        Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32 | Dtype::Float64
    )
}

/// Whether the MLX dtype is an unsigned integer type.
pub(crate) fn is_unsigned(dtype: Dtype) -> bool {
    matches!(
        dtype,
        Dtype::Uint8 | Dtype::Uint16 | Dtype::Uint32 | Dtype::Uint64
    )
}
