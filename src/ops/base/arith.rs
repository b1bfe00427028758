//! Arithmetic whose MLX op differs from Burn's definition on some inputs: the product with an
//! optional bias (f16/bf16 on the CPU computed in f32), integer division that truncates,
//! Burn's remainder, and bitwise NOT in a form MLX can write to a function file.

use super::MlxResult;
use crate::device::MlxDevice;
use crate::dtype::{is_float, is_unsigned};
use crate::error::MlxError;
use mlx_rs::{ops, Array, Dtype};

/// `a · b`, plus `c` when given (MLX's `addmm`: on CUDA a GEMM with a bias epilogue), on
/// `device`. MLX's CPU backend has no half-precision GEMM (measured at 1024²: f16 960 ms, bf16
/// 720 ms, f32 through BLAS 12 ms), so on the CPU f16/bf16 products are computed in f32 and
/// rounded once, which is also at least as accurate; the GPU keeps its native kernels.
pub(crate) fn matmul_add(a: &Array, b: &Array, c: Option<&Array>, device: MlxDevice) -> MlxResult {
    let dtype = a.dtype();
    let wide = device == MlxDevice::Cpu && matches!(dtype, Dtype::Float16 | Dtype::Bfloat16);
    let widen = |x: &Array| {
        if wide {
            x.as_dtype(Dtype::Float32)
        } else {
            Ok(x.clone())
        }
    };
    let (a, b) = (widen(a)?, widen(b)?);
    let out = match c {
        Some(c) => ops::addmm(widen(c)?, &a, &b, None, None)?,
        None => a.matmul(&b)?,
    };
    if wide {
        out.as_dtype(dtype)
    } else {
        Ok(out)
    }
}

/// Integer division truncating toward zero (Rust's `/`, which Burn's integer division follows).
///
/// Written so that it holds whether MLX's integer `floor_divide` floors or truncates: a floored
/// quotient leaves a remainder whose sign differs from the dividend's, and is one too low.
pub(crate) fn int_div_trunc(a: &Array, b: &Array) -> MlxResult {
    let q = ops::floor_divide(a, b)?;
    if is_unsigned(a.dtype()) {
        return Ok(q);
    }
    let r = a.subtract(&q.multiply(b)?)?;
    let zero = Array::from_int(0).as_dtype(a.dtype())?;
    let floored = r.ne(&zero)?.logical_and(&r.lt(&zero)?.ne(&a.lt(&zero)?)?)?;
    let one = Array::from_int(1).as_dtype(q.dtype())?;
    ops::select(&floored, &q.add(&one)?, &q)
}

/// Burn's remainder: `a - b * floor(a / b)` (the sign of the divisor).
///
/// MLX's remainder is exact; two things are adapted to Burn: an infinite divisor gives NaN for
/// floats (Burn's formula multiplies it by zero), and f16/bf16 are computed in f32 and rounded
/// once, as Burn's reference computes them, instead of rounding the divisor and every step.
pub(crate) fn remainder(a: &Array, b: &Array) -> MlxResult {
    let dtype = a.dtype();
    if !is_float(dtype) {
        return ops::remainder(a, b);
    }
    let wide = matches!(dtype, Dtype::Float16 | Dtype::Bfloat16);
    let (a32, b32);
    let (a, b) = if wide {
        a32 = a.as_dtype(Dtype::Float32)?;
        b32 = b.as_dtype(Dtype::Float32)?;
        (&a32, &b32)
    } else {
        (a, b)
    };
    let r = ops::remainder(a, b)?;
    let nan = Array::from_f32(f32::NAN).as_dtype(r.dtype())?;
    let r = ops::select(&ops::is_inf(b)?, &nan, &r)?;
    if wide {
        r.as_dtype(dtype)
    } else {
        Ok(r)
    }
}

/// Bitwise NOT of an integer array: MLX's `bitwise_invert`, or, inside a traced function, xor
/// with every bit set (-1 cast to `a`'s integer type), which is the same: MLX 0.32 cannot write
/// its `BitwiseInvert` primitive to a function file ([`crate::export`]).
pub(crate) fn bitwise_not(a: &Array) -> Result<Array, MlxError> {
    if crate::trace::is_tracing() {
        let ones = Array::from_int(-1)
            .as_dtype(a.dtype())
            .map_err(|e| MlxError::mlx("bitwise_not", e))?;
        return crate::native::bitwise_xor(a, &ones);
    }
    crate::native::bitwise_invert(a)
}
