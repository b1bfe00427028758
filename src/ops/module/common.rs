//! Helpers shared by the module op families (`conv`, `pool`, `interpolate`, `attention`, `fft`,
//! `deform_conv`, `ctc`, `linear`): the error type that becomes a panic at the op boundary,
//! running on a tensor's device, constants and channel moves.
//!
//! They live apart from `mod.rs` so that the op files and the `ModuleOps` impl that calls them
//! do not import each other.

use crate::error::MlxError;
use crate::tensor::MlxTensor;
use crate::tensor::OrPanic;
use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype};
use std::fmt;

/// An error inside a module op, turned into a panic (naming the op and its inputs) at the
/// op boundary.
#[derive(Debug)]
pub(crate) struct Failure(String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<Exception> for Failure {
    fn from(e: Exception) -> Self {
        Failure(e.what().to_string())
    }
}

impl From<MlxError> for Failure {
    fn from(e: MlxError) -> Self {
        Failure(e.to_string())
    }
}

impl From<String> for Failure {
    fn from(e: String) -> Self {
        Failure(e)
    }
}

/// The result type of the helpers of the module ops.
pub(crate) type Res<T = Array> = Result<T, Failure>;

/// Runs `f` on the stream of the first input's device and wraps the result as a tensor on that
/// device; on failure, panics with `op` and the inputs' shapes and dtypes.
#[track_caller]
pub(crate) fn run(op: &str, inputs: &[&MlxTensor], f: impl FnOnce() -> Res) -> MlxTensor {
    let device = inputs[0].device;
    let arrays: Vec<&Array> = inputs.iter().map(|t| &t.array).collect();
    let out = device.scope(f).or_panic(op, &arrays);
    MlxTensor::from_array(out, device)
}

/// Like [`run`], for ops with several outputs.
#[track_caller]
pub(crate) fn run_many<T>(op: &str, inputs: &[&MlxTensor], f: impl FnOnce() -> Res<T>) -> T {
    let device = inputs[0].device;
    let arrays: Vec<&Array> = inputs.iter().map(|t| &t.array).collect();
    device.scope(f).or_panic(op, &arrays)
}

/// The dtype half-precision work is accumulated in: f32 for f16/bf16, the dtype itself
/// otherwise (pooling gradients, CTC's recursions).
pub(crate) fn accumulation_dtype(dtype: Dtype) -> Dtype {
    if matches!(dtype, Dtype::Float16 | Dtype::Bfloat16) {
        Dtype::Float32
    } else {
        dtype
    }
}

/// Converts sizes to MLX's `i32`.
pub(crate) fn ints(v: &[usize]) -> Vec<i32> {
    v.iter().map(|&x| x as i32).collect()
}

/// A constant float array built on the CPU, in `dtype` (f32 values unless `dtype` is f64).
pub(crate) fn float_const(values: &[f64], shape: &[i32], dtype: Dtype) -> Res {
    if dtype == Dtype::Float64 {
        return Ok(Array::from_slice_f64(values, shape));
    }
    let v: Vec<f32> = values.iter().map(|&x| x as f32).collect();
    let a = Array::from_slice(&v, shape);
    Ok(if dtype == Dtype::Float32 {
        a
    } else {
        a.as_dtype(dtype)?
    })
}

/// A constant `i32` array built on the CPU.
pub(crate) fn int_const(values: &[i32], shape: &[i32]) -> Array {
    Array::from_slice(values, shape)
}

/// Moves axis 1 (channels) to the end: NC... -> N...C.
pub(crate) fn channels_last(a: &Array) -> Res {
    let r = a.ndim() as i32;
    let mut axes = vec![0];
    axes.extend(2..r);
    axes.push(1);
    Ok(a.transpose_axes(&axes)?)
}

/// Moves the last axis (channels) to position 1: N...C -> NC....
pub(crate) fn channels_first(a: &Array) -> Res {
    let r = a.ndim() as i32;
    let mut axes = vec![0, r - 1];
    axes.extend(1..r - 1);
    Ok(a.transpose_axes(&axes)?)
}
