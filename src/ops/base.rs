//! Op implementations shared by the float, int and bool traits.
//!
//! MLX uses one array type for every dtype, so most ops are written once here, and the trait
//! impls in `float.rs`, `int.rs` and `bool_tensor.rs` forward to them with their dtype rules.

use crate::dtype::{is_float, is_unsigned};
use crate::native;
use crate::tensor::{scalar_array, to_i32_shape, OrPanic};
use crate::{MlxDevice, MlxTensor};
use burn_backend::{Distribution, Scalar, Shape, Slice};
use mlx_rs::error::Exception;
use mlx_rs::{ops, random, Array, Dtype};
use std::sync::Mutex;

/// Result type of mlx-rs ops.
pub(crate) type MlxResult = Result<Array, Exception>;

/// Applies an elementwise MLX op to one tensor.
pub(crate) fn unary(t: MlxTensor, op: &str, f: impl FnOnce(&Array) -> MlxResult) -> MlxTensor {
    let out = t.device.scope(|| f(&t.array)).or_panic(op, &[&t.array]);
    t.with(out)
}

/// Applies a broadcasting MLX op to two tensors.
pub(crate) fn binary(
    lhs: MlxTensor,
    rhs: MlxTensor,
    op: &str,
    f: impl FnOnce(&Array, &Array) -> MlxResult,
) -> MlxTensor {
    let out = lhs
        .device
        .scope(|| f(&lhs.array, &rhs.array))
        .or_panic(op, &[&lhs.array, &rhs.array]);
    lhs.with(out)
}

/// Applies a broadcasting MLX op to a tensor and a scalar of the tensor's dtype.
pub(crate) fn with_scalar(
    lhs: MlxTensor,
    rhs: Scalar,
    op: &str,
    f: impl FnOnce(&Array, &Array) -> MlxResult,
) -> MlxTensor {
    let s = scalar_array(rhs, lhs.array.dtype());
    let out = lhs
        .device
        .scope(|| f(&lhs.array, &s))
        .or_panic(op, &[&lhs.array]);
    lhs.with(out)
}

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

/// Casts to `dtype` (no-op when it already has it).
pub(crate) fn cast(t: MlxTensor, dtype: Dtype) -> MlxTensor {
    if t.array.dtype() == dtype {
        return t;
    }
    unary(t, "cast", |a| a.as_dtype(dtype))
}

/// Casts an array (no-op when it already has the dtype).
pub(crate) fn cast_array(a: Array, dtype: Dtype) -> MlxResult {
    if a.dtype() == dtype {
        Ok(a)
    } else {
        a.as_dtype(dtype)
    }
}

/// A tensor of `shape` filled with `value`.
pub(crate) fn full(shape: &Shape, value: Scalar, dtype: Dtype, device: &MlxDevice) -> MlxTensor {
    let dims = to_i32_shape(shape.as_slice(), "full").unwrap_or_else(|e| panic!("{e}"));
    let v = scalar_array(value, dtype);
    let out = device
        .scope(|| ops::broadcast_to(&v, &dims))
        .or_panic("full", &[]);
    MlxTensor::from_array(out, *device)
}

/// A tensor of zeros.
pub(crate) fn zeros(shape: &Shape, dtype: Dtype, device: &MlxDevice) -> MlxTensor {
    let dims = to_i32_shape(shape.as_slice(), "zeros").unwrap_or_else(|e| panic!("{e}"));
    let out = device
        .scope(|| ops::zeros_dtype(&dims, dtype))
        .or_panic("zeros", &[]);
    MlxTensor::from_array(out, *device)
}

/// Moves a tensor to another device. MLX arrays live in unified memory: only the stream used by
/// later ops changes.
pub(crate) fn to_device(t: MlxTensor, device: &MlxDevice) -> MlxTensor {
    if let Err(e) = device.check() {
        panic!("burn-mlx: `to_device` failed: {e}");
    }
    if t.array.dtype() == Dtype::Float64 && *device == MlxDevice::Gpu {
        panic!(
            "burn-mlx: `to_device`: {}",
            crate::tensor::f64_on_gpu("to_device")
        );
    }
    MlxTensor {
        device: *device,
        ..t
    }
}

/// Reshapes a tensor.
pub(crate) fn reshape(t: MlxTensor, shape: Shape) -> MlxTensor {
    let dims = to_i32_shape(shape.as_slice(), "reshape").unwrap_or_else(|e| panic!("{e}"));
    unary(t, "reshape", |a| a.reshape(&dims))
}

/// Permutes the axes.
pub(crate) fn permute(t: MlxTensor, axes: &[usize]) -> MlxTensor {
    let axes: Vec<i32> = axes.iter().map(|&a| a as i32).collect();
    unary(t, "permute", |a| a.transpose_axes(&axes))
}

/// Swaps two axes.
pub(crate) fn swap_dims(t: MlxTensor, dim1: usize, dim2: usize) -> MlxTensor {
    unary(t, "swap_dims", |a| a.swap_axes(dim1 as i32, dim2 as i32))
}

/// Reverses the order of elements along `axes`.
pub(crate) fn flip(t: MlxTensor, axes: &[usize]) -> MlxTensor {
    if axes.is_empty() {
        return t;
    }
    let dims = t.dims();
    let n = dims.len();
    let start: Vec<i32> = (0..n)
        .map(|i| {
            if axes.contains(&i) {
                dims[i] as i32 - 1
            } else {
                0
            }
        })
        .collect();
    // MLX reads a negative stop as counting from the end; `-(size + 1)` is "before the start".
    let stop: Vec<i32> = (0..n)
        .map(|i| {
            if axes.contains(&i) {
                -(dims[i] as i32) - 1
            } else {
                dims[i] as i32
            }
        })
        .collect();
    let strides: Vec<i32> = (0..n)
        .map(|i| if axes.contains(&i) { -1 } else { 1 })
        .collect();
    let out = t
        .device
        .scope(|| native::slice(&t.array, &start, &stop, &strides))
        .or_panic("flip", &[&t.array]);
    t.with(out)
}

/// Broadcasts to `shape`.
pub(crate) fn expand(t: MlxTensor, shape: Shape) -> MlxTensor {
    let dims = to_i32_shape(shape.as_slice(), "expand").unwrap_or_else(|e| panic!("{e}"));
    unary(t, "expand", |a| ops::broadcast_to(a, &dims))
}

/// The strided slice arguments of Burn slices for a tensor of `dims`, with the axes whose step
/// is negative (handled by reversing afterwards).
struct SliceArgs {
    start: Vec<i32>,
    stop: Vec<i32>,
    strides: Vec<i32>,
    reversed: Vec<usize>,
}

fn slice_args(dims: &[usize], slices: &[Slice]) -> SliceArgs {
    let n = dims.len();
    let mut args = SliceArgs {
        start: vec![0; n],
        stop: dims.iter().map(|&d| d as i32).collect(),
        strides: vec![1; n],
        reversed: Vec::new(),
    };
    for (axis, s) in slices.iter().enumerate().take(n) {
        let range = s.to_range(dims[axis]);
        let len = s.output_size(dims[axis]);
        let step = s.step.unsigned_abs() as i32;
        if len == 0 {
            args.start[axis] = 0;
            args.stop[axis] = 0;
        } else if s.step < 0 {
            // Burn walks backwards from the end of the range: end-1, end-1-step, ...
            // Take the same positions in increasing order, then reverse the axis.
            let last = range.end as i32 - 1;
            let first = last - (len as i32 - 1) * step;
            args.start[axis] = first;
            args.stop[axis] = last + 1;
            args.strides[axis] = step;
            args.reversed.push(axis);
        } else {
            args.start[axis] = range.start as i32;
            args.stop[axis] = range.end as i32;
            args.strides[axis] = step;
        }
    }
    args
}

/// Burn's `slice`: ranges with steps (negative steps walk backwards) on the leading axes.
pub(crate) fn slice(t: MlxTensor, slices: &[Slice]) -> MlxTensor {
    let args = slice_args(&t.dims(), slices);
    let out = t
        .device
        .scope(|| native::slice(&t.array, &args.start, &args.stop, &args.strides))
        .or_panic("slice", &[&t.array]);
    flip(t.with(out), &args.reversed)
}

/// Burn's `slice_assign`: a copy of `t` with the sliced region replaced by `value`.
pub(crate) fn slice_assign(t: MlxTensor, slices: &[Slice], value: MlxTensor) -> MlxTensor {
    let args = slice_args(&t.dims(), slices);
    let value = flip(cast(value, t.array.dtype()), &args.reversed);
    let out = t
        .device
        .scope(|| {
            native::slice_update(
                &t.array,
                &value.array,
                &args.start,
                &args.stop,
                &args.strides,
            )
        })
        .or_panic("slice_assign", &[&t.array, &value.array]);
    t.with(out)
}

/// Burn's `gather`: `out[i][j] = t[i][indices[i][j]]` along `dim`.
pub(crate) fn gather(dim: usize, t: MlxTensor, indices: MlxTensor) -> MlxTensor {
    let out = t
        .device
        .scope(|| {
            let idx = clamp_indices(&indices.array, t.array.shape()[dim])?;
            ops::indexing::take_along_axis(&t.array, &idx, dim as i32)
        })
        .or_panic("gather", &[&t.array, &indices.array]);
    t.with(out)
}

/// Clamps indices into `[0, n - 1]`.
///
/// MLX does not bounds-check gathers and scatters: an out-of-range index reads or writes outside
/// the buffer (garbage values, heap corruption). Burn leaves the result of an out-of-range index
/// unspecified, so burn-mlx clamps them: the result is deterministic and memory stays intact,
/// without evaluating the indices (ops stay lazy).
fn clamp_indices(indices: &Array, n: i32) -> MlxResult {
    if n == 0 && indices.size() > 0 {
        // No index is valid. MLX's CPU refuses such a take, but its CUDA kernels read outside
        // the (empty) buffer, so refuse it here for every device.
        return Err(Exception::custom(
            "an index into a dimension of size 0: no index is valid there",
        ));
    }
    let dtype = indices.dtype();
    let max = match dtype {
        Dtype::Int8 => i8::MAX as i64,
        Dtype::Uint8 => u8::MAX as i64,
        Dtype::Int16 => i16::MAX as i64,
        Dtype::Uint16 => u16::MAX as i64,
        _ => i64::MAX,
    };
    let hi = ((n as i64) - 1).clamp(0, max);
    let lo = Array::from_int(0).as_dtype(dtype)?;
    let hi = Array::from_slice(&[hi], &[]).as_dtype(dtype)?;
    ops::minimum(ops::maximum(indices, &lo)?, &hi)
}

/// `values` with zeros where `indices` (same shape) is outside `[0, n)`: a scatter-add then
/// drops the updates of out-of-range indices instead of adding them at a clamped position.
fn drop_out_of_range(values: &Array, indices: &Array, n: i32) -> MlxResult {
    let idx = indices.as_dtype(Dtype::Int64)?;
    let ok = ops::logical_and(
        &idx.ge(Array::from_slice(&[0i64], &[]))?,
        &idx.lt(Array::from_slice(&[n as i64], &[]))?,
    )?;
    let zero = Array::from_int(0).as_dtype(values.dtype())?;
    ops::select(&ok, values, &zero)
}

/// Burn's `scatter_add`: adds `value` into `t` at `indices` along `dim`.
pub(crate) fn scatter_add(
    dim: usize,
    t: MlxTensor,
    indices: MlxTensor,
    value: MlxTensor,
) -> MlxTensor {
    let value = cast(value, t.array.dtype());
    let out = t
        .device
        .scope(|| {
            let n = t.array.shape()[dim];
            let value = drop_out_of_range(&value.array, &indices.array, n)?;
            let idx = clamp_indices(&indices.array, n)?;
            native::scatter_add_axis(&t.array, &idx, &value, dim as i32)
                .map_err(|e| Exception::custom(e.to_string()))
        })
        .or_panic("scatter_add", &[&t.array, &indices.array, &value.array]);
    t.with(out)
}

/// Burn's `select`: the slices of `t` at `indices` (1-d) along `dim`.
pub(crate) fn select(t: MlxTensor, dim: usize, indices: MlxTensor) -> MlxTensor {
    let out = t
        .device
        .scope(|| {
            let idx = clamp_indices(&indices.array, t.array.shape()[dim])?;
            ops::indexing::take_axis(&t.array, &idx, dim as i32)
        })
        .or_panic("select", &[&t.array, &indices.array]);
    t.with(out)
}

/// Burn's `select_add`: adds the slices of `value` to `t` at `indices` (1-d) along `dim`.
pub(crate) fn select_add(
    t: MlxTensor,
    dim: usize,
    indices: MlxTensor,
    value: MlxTensor,
) -> MlxTensor {
    let value = cast(value, t.array.dtype());
    let rank = value.array.ndim();
    let out = t
        .device
        .scope(|| {
            let mut idx_shape = vec![1i32; rank];
            idx_shape[dim] = indices.array.size() as i32;
            let idx = indices.array.reshape(&idx_shape)?;
            let idx = ops::broadcast_to(&idx, value.array.shape())?;
            let n = t.array.shape()[dim];
            let value = drop_out_of_range(&value.array, &idx, n)?;
            let idx = clamp_indices(&idx, n)?;
            native::scatter_add_axis(&t.array, &idx, &value, dim as i32)
                .map_err(|e| Exception::custom(e.to_string()))
        })
        .or_panic("select_add", &[&t.array, &indices.array, &value.array]);
    t.with(out)
}

/// Burn's `mask_where`: `value` where `mask` is true, else `t` (broadcasting).
pub(crate) fn mask_where(t: MlxTensor, mask: MlxTensor, value: MlxTensor) -> MlxTensor {
    let value = cast(value, t.array.dtype());
    let out = t
        .device
        .scope(|| ops::select(&mask.array, &value.array, &t.array))
        .or_panic("mask_where", &[&t.array, &mask.array, &value.array]);
    t.with(out)
}

/// Burn's `mask_fill`: `value` where `mask` is true, else `t` (the shapes broadcast).
pub(crate) fn mask_fill(t: MlxTensor, mask: MlxTensor, value: Scalar) -> MlxTensor {
    let v = scalar_array(value, t.array.dtype());
    let out = t
        .device
        .scope(|| ops::select(&mask.array, &v, &t.array))
        .or_panic("mask_fill", &[&t.array, &mask.array]);
    t.with(out)
}

/// Concatenates along `dim`.
pub(crate) fn cat(tensors: Vec<MlxTensor>, dim: usize) -> MlxTensor {
    let device = tensors
        .first()
        .map(|t| t.device)
        .unwrap_or_else(|| panic!("burn-mlx: `cat` needs at least one tensor"));
    let dtype = tensors[0].array.dtype();
    let arrays: Vec<Array> = tensors.into_iter().map(|t| cast(t, dtype).array).collect();
    let refs: Vec<&Array> = arrays.iter().collect();
    let out = device
        .scope(|| ops::concatenate(&arrays, dim as i32))
        .or_panic("cat", &refs);
    MlxTensor::from_array(out, device)
}

/// Repeats the whole tensor `times` along `dim` (Burn's `repeat_dim`: tiling).
pub(crate) fn repeat_dim(t: MlxTensor, dim: usize, times: usize) -> MlxTensor {
    let mut reps = vec![1i32; t.array.ndim()];
    reps[dim] = times as i32;
    unary(t, "repeat_dim", |a| ops::tile(a, &reps))
}

/// Burn's `unfold`: windows of `size` with `step` along `dim`, the window as a new last axis.
pub(crate) fn unfold(t: MlxTensor, dim: usize, size: usize, step: usize) -> MlxTensor {
    let dims = t.dims();
    let windows = if dims[dim] >= size {
        (dims[dim] - size) / step + 1
    } else {
        0
    };
    let idx: Vec<i32> = (0..windows)
        .flat_map(|w| (0..size).map(move |k| (w * step + k) as i32))
        .collect();
    let mut out_shape: Vec<i32> = dims.iter().map(|&d| d as i32).collect();
    out_shape[dim] = windows as i32;
    out_shape.insert(dim + 1, size as i32);
    let rank = out_shape.len() as i32;
    unary(t, "unfold", |a| {
        let idx = Array::from_slice(&idx, &[idx.len() as i32]);
        let taken = ops::indexing::take_axis(a, &idx, dim as i32)?;
        let taken = taken.reshape(&out_shape)?;
        ops::move_axis(&taken, dim as i32 + 1, rank - 1)
    })
}

/// Sum of every element, as a 1-element tensor of the input's dtype.
pub(crate) fn sum(t: MlxTensor) -> MlxTensor {
    let dtype = t.array.dtype();
    unary(t, "sum", |a| {
        cast_array(accumulable(a)?.sum(None)?.reshape(&[1])?, dtype)
    })
}

/// Sum along `dim`, keeping it.
pub(crate) fn sum_dim(t: MlxTensor, dim: usize) -> MlxTensor {
    let dtype = t.array.dtype();
    unary(t, "sum_dim", |a| {
        cast_array(accumulable(a)?.sum_axis(dim as i32, true)?, dtype)
    })
}

/// `a` in a dtype whose sums, products, means and scans are accurate: f16/bf16 widened to f32,
/// other dtypes unchanged. The result is rounded to the input's dtype once, at the end.
///
/// MLX reduces and scans half-precision arrays in their own dtype in places, on the CPU as on
/// the GPU (MLX 0.32.2): a sum of 5,346 f16 ones stopped at 2,048 (f16's spacing there is 2),
/// the mean of 0..1024 overflowed f16 through its running sum, and the CUDA reduction lost 0.07
/// on a bf16 sum of 60 values. burn-ndarray and burn-flex accumulate these in f32.
fn accumulable(a: &Array) -> MlxResult {
    if matches!(a.dtype(), Dtype::Float16 | Dtype::Bfloat16) {
        a.as_dtype(Dtype::Float32)
    } else {
        Ok(a.clone())
    }
}

/// Product of every element.
pub(crate) fn prod(t: MlxTensor) -> MlxTensor {
    let dtype = t.array.dtype();
    unary(t, "prod", |a| {
        cast_array(accumulable(a)?.prod(None)?.reshape(&[1])?, dtype)
    })
}

/// Product along `dim`, keeping it.
pub(crate) fn prod_dim(t: MlxTensor, dim: usize) -> MlxTensor {
    let dtype = t.array.dtype();
    unary(t, "prod_dim", |a| {
        cast_array(accumulable(a)?.prod_axis(dim as i32, true)?, dtype)
    })
}

/// A float mean: `sum` of `a` (f16/bf16 accumulated in f32) divided by its `n` elements, cast
/// to `dtype`. A division, not MLX's `mean` (a product with 1/n): compiled, that product can
/// land 1 ulp from the quotient Burn's backends give (0.99999994 for the mean of 0, 1 and 2).
fn float_mean(
    a: &Array,
    n: usize,
    dtype: Dtype,
    sum: impl FnOnce(&Array) -> MlxResult,
) -> MlxResult {
    let total = sum(&accumulable(a)?)?;
    let count = scalar_array(Scalar::Float(n as f64), total.dtype());
    cast_array(total.divide(&count)?, dtype)
}

/// Mean along `dim`, keeping it (integer means truncate, as Burn's do).
pub(crate) fn mean_dim(t: MlxTensor, dim: usize) -> MlxTensor {
    let dtype = t.array.dtype();
    if is_float(dtype) {
        let n = t.dims()[dim];
        return unary(t, "mean_dim", |a| {
            float_mean(a, n, dtype, |x| x.sum_axis(dim as i32, true))
        });
    }
    let n = t.dims()[dim].max(1) as i64;
    unary(t, "mean_dim", |a| {
        let s = cast_array(a.sum_axis(dim as i32, true)?, dtype)?;
        int_div_trunc(&s, &scalar_array(Scalar::Int(n), dtype))
    })
}

/// Mean of every element, as a 1-element tensor.
pub(crate) fn mean(t: MlxTensor) -> MlxTensor {
    let dtype = t.array.dtype();
    if is_float(dtype) {
        let n = t.array.size();
        return unary(t, "mean", |a| {
            float_mean(a, n, dtype, |x| x.sum(None)?.reshape(&[1]))
        });
    }
    let n = t.array.size().max(1) as i64;
    unary(t, "mean", |a| {
        let s = cast_array(a.sum(None)?.reshape(&[1])?, dtype)?;
        int_div_trunc(&s, &scalar_array(Scalar::Int(n), dtype))
    })
}

/// Maximum of every element.
///
/// Floats follow Burn's definition (`max_dim` of the flattened tensor, so NaN handling is
/// `argmax`'s); integers use MLX's reduction directly.
pub(crate) fn max(t: MlxTensor) -> MlxTensor {
    if is_float(t.array.dtype()) {
        return max_dim(flatten(t), 0);
    }
    unary(t, "max", |a| a.max(None)?.reshape(&[1]))
}

/// Minimum of every element (see [`max`] for NaN handling).
pub(crate) fn min(t: MlxTensor) -> MlxTensor {
    if is_float(t.array.dtype()) {
        return min_dim(flatten(t), 0);
    }
    unary(t, "min", |a| a.min(None)?.reshape(&[1]))
}

/// The tensor as one dimension.
fn flatten(t: MlxTensor) -> MlxTensor {
    let n = t.array.size();
    unary(t, "flatten", |a| a.reshape(&[n as i32]))
}

/// Maximum along `dim`, keeping it.
///
/// For floats this is the value at `argmax`, which is how Burn defines `max_dim`: a NaN is
/// skipped unless it comes first along `dim`, exactly as burn-ndarray does. MLX's own reduction
/// would propagate every NaN.
pub(crate) fn max_dim(t: MlxTensor, dim: usize) -> MlxTensor {
    if is_float(t.array.dtype()) && t.array.size() == 0 {
        return empty_reduction(&t, dim, f64::NEG_INFINITY);
    }
    if is_float(t.array.dtype()) {
        let idx = argmax(t.clone(), dim, Dtype::Int32);
        return take_along(t, idx, dim, "max_dim");
    }
    unary(t, "max_dim", |a| a.max_axis(dim as i32, true))
}

/// Minimum along `dim`, keeping it (see [`max_dim`] for NaN handling).
pub(crate) fn min_dim(t: MlxTensor, dim: usize) -> MlxTensor {
    if is_float(t.array.dtype()) && t.array.size() == 0 {
        return empty_reduction(&t, dim, f64::INFINITY);
    }
    if is_float(t.array.dtype()) {
        let idx = argmin(t.clone(), dim, Dtype::Int32);
        return take_along(t, idx, dim, "min_dim");
    }
    unary(t, "min_dim", |a| a.min_axis(dim as i32, true))
}

/// A float reduction along `dim` of a tensor with no elements: the reduced shape filled with the
/// reduction's identity (`-inf` for max, `+inf` for min), so that expressions such as
/// `x - x.max_dim(d)` stay empty instead of failing. MLX refuses to reduce empty arrays.
fn empty_reduction(t: &MlxTensor, dim: usize, identity: f64) -> MlxTensor {
    let mut shape = t.dims();
    shape[dim] = 1;
    full(
        &Shape::from(shape),
        Scalar::Float(identity),
        t.array.dtype(),
        &t.device,
    )
}

/// `t`'s values at `idx` along `dim` (`idx` already has `t`'s rank).
fn take_along(t: MlxTensor, idx: MlxTensor, dim: usize, op: &str) -> MlxTensor {
    let out = t
        .device
        .scope(|| ops::indexing::take_along_axis(&t.array, &idx.array, dim as i32))
        .or_panic(op, &[&t.array, &idx.array]);
    t.with(out)
}

/// Output of an index reduction over an input with no elements: an empty tensor of the reduced
/// shape, or a panic when the reduced dimension itself is empty (there is no index to return).
fn arg_reduce_empty(t: &MlxTensor, dim: usize, out: Dtype, op: &str) -> Option<MlxTensor> {
    if t.array.size() != 0 {
        return None;
    }
    let mut shape = t.dims();
    if shape[dim] == 0 {
        panic!(
            "burn-mlx: `{op}` along dimension {dim} of a tensor of shape {shape:?}: the dimension \
             is empty, so there is no index to return"
        );
    }
    shape[dim] = 1;
    Some(zeros(&Shape::from(shape), out, &t.device))
}

/// Index of the maximum along `dim` (the first one on ties), keeping the dim.
pub(crate) fn argmax(t: MlxTensor, dim: usize, out: Dtype) -> MlxTensor {
    if let Some(empty) = arg_reduce_empty(&t, dim, out, "argmax") {
        return empty;
    }
    let gpu = t.device == MlxDevice::Gpu;
    unary(t, "argmax", |a| {
        let idx = if gpu && is_float(a.dtype()) {
            arg_extreme_nan_first(a, dim as i32, f64::NEG_INFINITY, |x, d| {
                ops::indexing::argmax_axis(x, d, true)
            })?
        } else {
            ops::indexing::argmax_axis(a, dim as i32, true)?
        };
        idx.as_dtype(out)
    })
}

/// Index of the minimum along `dim` (the first one on ties), keeping the dim.
pub(crate) fn argmin(t: MlxTensor, dim: usize, out: Dtype) -> MlxTensor {
    if let Some(empty) = arg_reduce_empty(&t, dim, out, "argmin") {
        return empty;
    }
    let gpu = t.device == MlxDevice::Gpu;
    unary(t, "argmin", |a| {
        let idx = if gpu && is_float(a.dtype()) {
            arg_extreme_nan_first(a, dim as i32, f64::INFINITY, |x, d| {
                ops::indexing::argmin_axis(x, d, true)
            })?
        } else {
            ops::indexing::argmin_axis(a, dim as i32, true)?
        };
        idx.as_dtype(out)
    })
}

/// Burn's float `argmax`/`argmin` on devices whose MLX kernel treats NaN differently.
///
/// Burn (burn-ndarray) scans from the first element and keeps it while no later value compares
/// greater (less), so a NaN wins only when it comes first along the axis, and later NaNs are
/// skipped. MLX's CPU kernel scans the same way; its CUDA kernel reduces in a tree and may pick
/// any NaN. Here every NaN becomes `skip` (which never wins over the first element on ties),
/// and a NaN in the first position wins outright.
fn arg_extreme_nan_first(
    a: &Array,
    axis: i32,
    skip: f64,
    arg: impl Fn(&Array, i32) -> MlxResult,
) -> MlxResult {
    let filler = Array::from_f32(skip as f32).as_dtype(a.dtype())?;
    let cleaned = ops::select(&a.is_nan()?, &filler, a)?;
    let idx = arg(&cleaned, axis)?;
    let first = a.take_axis(Array::from_slice(&[0i32], &[1]), axis)?;
    let zero = Array::from_int(0).as_dtype(idx.dtype())?;
    ops::select(&first.is_nan()?, &zero, &idx)
}

/// An integer key whose order is `a`'s total order (`f32::total_cmp`: -NaN < -inf < … < -0 <
/// +0 < … < +inf < +NaN), the order Burn's sorts use for floats.
///
/// The float's bits read as a signed integer already order the non-negative values; flipping
/// every bit but the sign reverses the negative ones.
fn total_order_key(a: &Array) -> MlxResult {
    let (int, max) = match a.dtype() {
        Dtype::Float16 | Dtype::Bfloat16 => (Dtype::Int16, Array::from_int(i16::MAX as i32)),
        Dtype::Float64 => (Dtype::Int64, Array::from_slice(&[i64::MAX], &[])),
        _ => (Dtype::Int32, Array::from_int(i32::MAX)),
    };
    // A strided input is made contiguous first: MLX's CUDA `view` reads a permuted array in
    // storage order (seen on MLX 0.32.2), while the CPU copies.
    let bits = a.contiguous()?.view_dtype(int)?;
    let max = max.as_dtype(int)?;
    let zero = Array::from_int(0).as_dtype(int)?;
    let flipped = native::bitwise_xor(&bits, &max).map_err(|e| Exception::custom(e.to_string()))?;
    ops::select(&bits.lt(&zero)?, &flipped, &bits)
}

/// A sort key whose ascending order is `a`'s descending order.
fn descending_key(a: &Array) -> MlxResult {
    let invert =
        |k: &Array| native::bitwise_invert(k).map_err(|e| Exception::custom(e.to_string()));
    match a.dtype() {
        Dtype::Bool => ops::logical_not(a),
        d if is_float(d) => invert(&total_order_key(a)?),
        // `!x` reverses the order of every integer type without overflow.
        _ => invert(a),
    }
}

/// Indices that sort `a` along `axis`, floats in their total order (NaN after +inf).
fn argsort_array(a: &Array, axis: i32, descending: bool) -> MlxResult {
    // MLX's CUDA sort reads a permuted (strided) input in storage order (MLX 0.32.2).
    let a = &a.contiguous()?;
    if descending {
        ops::argsort_axis(&descending_key(a)?, axis)
    } else if is_float(a.dtype()) {
        ops::argsort_axis(&total_order_key(a)?, axis)
    } else {
        ops::argsort_axis(a, axis)
    }
}

/// Burn's `argsort`.
pub(crate) fn argsort(t: MlxTensor, dim: usize, descending: bool, out: Dtype) -> MlxTensor {
    unary(t, "argsort", |a| {
        argsort_array(a, dim as i32, descending)?.as_dtype(out)
    })
}

/// Burn's `sort`.
pub(crate) fn sort(t: MlxTensor, dim: usize, descending: bool) -> MlxTensor {
    if !descending {
        return unary(t, "sort", |a| ops::sort_axis(a.contiguous()?, dim as i32));
    }
    unary(t, "sort", |a| {
        let idx = argsort_array(a, dim as i32, true)?;
        ops::indexing::take_along_axis(a, &idx, dim as i32)
    })
}

/// Burn's `sort_with_indices`.
pub(crate) fn sort_with_indices(
    t: MlxTensor,
    dim: usize,
    descending: bool,
    out: Dtype,
) -> (MlxTensor, MlxTensor) {
    let idx = t
        .device
        .scope(|| argsort_array(&t.array, dim as i32, descending))
        .or_panic("sort_with_indices", &[&t.array]);
    let values = t
        .device
        .scope(|| ops::indexing::take_along_axis(&t.array, &idx, dim as i32))
        .or_panic("sort_with_indices", &[&t.array]);
    let idx = cast_array(idx, out).or_panic("sort_with_indices", &[&t.array]);
    (t.with(values), t.with(idx))
}

/// Indices of the `k` largest values along `dim`, largest first (ties: lowest index first).
pub(crate) fn argtopk(t: MlxTensor, dim: usize, k: usize, out: Dtype) -> MlxTensor {
    let idx = argsort(t, dim, true, out);
    let mut slices: Vec<Slice> = (0..idx.array.ndim()).map(|_| Slice::full()).collect();
    slices[dim] = Slice::new(0, Some(k as isize), 1);
    slice(idx, &slices)
}

/// The `k` largest values along `dim`, largest first.
pub(crate) fn topk(t: MlxTensor, dim: usize, k: usize) -> MlxTensor {
    let idx = argtopk(t.clone(), dim, k, Dtype::Int32);
    gather(dim, t, idx)
}

/// `max_dim` and the index of the first maximum.
pub(crate) fn max_dim_with_indices(t: MlxTensor, dim: usize, out: Dtype) -> (MlxTensor, MlxTensor) {
    let idx = argmax(t.clone(), dim, Dtype::Int32);
    let values = gather(dim, t, idx.clone());
    (values, cast(idx, out))
}

/// `min_dim` and the index of the first minimum.
pub(crate) fn min_dim_with_indices(t: MlxTensor, dim: usize, out: Dtype) -> (MlxTensor, MlxTensor) {
    let idx = argmin(t.clone(), dim, Dtype::Int32);
    let values = gather(dim, t, idx.clone());
    (values, cast(idx, out))
}

/// Cumulative op along `dim`, keeping the input dtype (f16/bf16 scanned in f32, see
/// [`accumulable`]).
pub(crate) fn cumulative(
    t: MlxTensor,
    dim: usize,
    op: &str,
    f: impl FnOnce(&Array, i32) -> MlxResult,
) -> MlxTensor {
    let dtype = t.array.dtype();
    unary(t, op, |a| {
        cast_array(f(&accumulable(a)?, dim as i32)?, dtype)
    })
}

/// Burn's float `cummax`/`cummin`: a NaN stays where it is and does not spread to later
/// positions (MLX's scans would carry it forward); `fill` is the identity of the scan.
pub(crate) fn float_cum_extreme(
    t: MlxTensor,
    dim: usize,
    op: &str,
    fill: f32,
    f: impl FnOnce(&Array, i32) -> MlxResult,
) -> MlxTensor {
    unary(t, op, |a| {
        let nan = ops::is_nan(a)?;
        let fill = Array::from_f32(fill).as_dtype(a.dtype())?;
        let scanned = f(&ops::select(&nan, &fill, a)?, dim as i32)?;
        ops::select(&nan, a, &scanned)
    })
}

/// Whether any element is true (non-zero), as a 1-element bool tensor.
pub(crate) fn any(t: MlxTensor) -> MlxTensor {
    unary(t, "any", |a| a.any(None)?.reshape(&[1]))
}

/// Whether every element is true (non-zero), as a 1-element bool tensor.
pub(crate) fn all(t: MlxTensor) -> MlxTensor {
    unary(t, "all", |a| a.all(None)?.reshape(&[1]))
}

/// `any` along `dim`, keeping it.
pub(crate) fn any_dim(t: MlxTensor, dim: usize) -> MlxTensor {
    unary(t, "any_dim", |a| a.any_axis(dim as i32, true))
}

/// `all` along `dim`, keeping it.
pub(crate) fn all_dim(t: MlxTensor, dim: usize) -> MlxTensor {
    unary(t, "all_dim", |a| a.all_axis(dim as i32, true))
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

/// The process-wide random state: `Mlx::seed` sets it; every random tensor takes a fresh key.
static RNG: Mutex<Option<(u64, u64)>> = Mutex::new(None);

/// Seeds the random state of every device.
pub(crate) fn seed(seed: u64) {
    *RNG.lock().unwrap_or_else(|p| p.into_inner()) = Some((seed, 0));
}

/// The next random key (a lazy MLX key array).
fn next_key() -> Array {
    native::thread_init();
    let mut state = RNG.lock().unwrap_or_else(|p| p.into_inner());
    let (seed, counter) = state.get_or_insert_with(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        (now, 0)
    });
    // SplitMix64 of (seed, counter): independent, reproducible keys.
    let mut z = seed.wrapping_add(counter.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    *counter += 1;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    random::key(z).or_panic("random", &[])
}

/// Random values of `dtype` drawn from Burn's `distribution`.
pub(crate) fn random(
    shape: &Shape,
    distribution: Distribution,
    dtype: Dtype,
    device: &MlxDevice,
) -> MlxTensor {
    let dims = to_i32_shape(shape.as_slice(), "random").unwrap_or_else(|e| panic!("{e}"));
    let key = next_key();
    let out = device
        .scope(|| -> MlxResult {
            let values = match distribution {
                Distribution::Default => {
                    random::uniform::<_, f32>(0.0f32, 1.0f32, &dims[..], Some(&key))?
                }
                Distribution::Uniform(low, high) => {
                    if is_float(dtype) {
                        random::uniform::<_, f32>(low as f32, high as f32, &dims[..], Some(&key))?
                    } else {
                        // Integers: uniform over [low, high), as Burn draws them.
                        let u = random::uniform::<_, f32>(0.0f32, 1.0f32, &dims[..], Some(&key))?;
                        let span = Array::from_f32((high - low) as f32);
                        let v = u.multiply(&span)?.floor()?;
                        let v = v.add(Array::from_f32(low as f32))?;
                        ops::minimum(&v, Array::from_f32((high - 1.0).max(low) as f32))?
                    }
                }
                Distribution::Bernoulli(p) => {
                    let u = random::uniform::<_, f32>(0.0f32, 1.0f32, &dims[..], Some(&key))?;
                    u.lt(Array::from_f32(p as f32))?
                }
                Distribution::Normal(mean, std) => {
                    random::normal::<f32>(&dims[..], mean as f32, std as f32, Some(&key))?
                }
            };
            cast_array(values, dtype)
        })
        .or_panic("random", &[]);
    MlxTensor::from_array(out, *device)
}

/// Row-major positions in the first `K` axes of `dims` addressed by `indices[..., K]`, flattened
/// to `[M]`, with the batch shape `indices.shape[..-1]`.
fn nd_positions(dims: &[i32], indices: &Array) -> Result<(Array, Vec<i32>), Exception> {
    let ishape = indices.shape();
    let k = *ishape.last().unwrap_or(&0) as usize;
    let batch = ishape[..ishape.len().saturating_sub(1)].to_vec();
    let mut strides = vec![1i64; k];
    for i in (0..k.saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1] as i64;
    }
    let strides = Array::from_slice(&strides, &[k as i32]);
    let linear = indices
        .as_dtype(Dtype::Int64)?
        .multiply(&strides)?
        .sum_axis(-1, false)?;
    let m: i32 = batch.iter().product();
    Ok((linear.reshape(&[m])?, batch))
}

/// `data` seen as `[prod(dims[..k]), dims[k..]...]`.
fn nd_flatten(data: &Array, k: usize) -> MlxResult {
    let dims = data.shape();
    let n: i32 = dims[..k].iter().product();
    let mut flat = vec![n];
    flat.extend_from_slice(&dims[k..]);
    data.reshape(&flat)
}

/// Burn's `gather_nd`: `out[b...] = data[indices[b..., 0], ..., indices[b..., K-1], ...]`.
pub(crate) fn gather_nd(data: MlxTensor, indices: MlxTensor) -> MlxTensor {
    let idx = indices.array.clone();
    unary(data, "gather_nd", move |a| {
        let dims = a.shape().to_vec();
        let k = *idx.shape().last().unwrap_or(&0) as usize;
        let (linear, batch) = nd_positions(&dims, &idx)?;
        let flat = nd_flatten(a, k)?;
        let linear = clamp_indices(&linear, flat.shape()[0])?;
        let taken = ops::indexing::take_axis(&flat, &linear, 0)?;
        let mut out = batch;
        out.extend_from_slice(&dims[k..]);
        taken.reshape(&out)
    })
}

/// Burn's `scatter_nd`: combines `values` into `data` at the positions `indices` address.
pub(crate) fn scatter_nd(
    data: MlxTensor,
    indices: MlxTensor,
    values: MlxTensor,
    reduction: burn_backend::tensor::IndexingUpdateOp,
) -> MlxTensor {
    use burn_backend::tensor::IndexingUpdateOp as Op;
    let values = cast(values, data.array.dtype());
    let (idx, vals) = (indices.array.clone(), values.array.clone());
    unary(data, "scatter_nd", move |a| {
        let dims = a.shape().to_vec();
        let k = *idx.shape().last().unwrap_or(&0) as usize;
        let (linear, _) = nd_positions(&dims, &idx)?;
        let mut upd_shape = vec![linear.shape()[0], 1];
        upd_shape.extend_from_slice(&dims[k..]);
        let updates = vals.reshape(&upd_shape)?;
        let flat = nd_flatten(a, k)?;
        let linear = clamp_indices(&linear, flat.shape()[0])?;
        let out = match reduction {
            Op::Assign => ops::indexing::scatter_single(&flat, &linear, &updates, 0)?,
            Op::Add => ops::indexing::scatter_add_single(&flat, &linear, &updates, 0)?,
            Op::Mul => ops::indexing::scatter_prod_single(&flat, &linear, &updates, 0)?,
            Op::Min => ops::indexing::scatter_min_single(&flat, &linear, &updates, 0)?,
            Op::Max => ops::indexing::scatter_max_single(&flat, &linear, &updates, 0)?,
        };
        out.reshape(&dims)
    })
}
