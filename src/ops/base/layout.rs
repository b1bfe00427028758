//! Shape and layout: reshapes, axis moves, flips, broadcasts, Burn's strided slices and slice
//! assignment, concatenation, tiling and sliding windows. None of these reads values.

use super::create::cast;
use super::unary;
use crate::native;
use crate::tensor::MlxTensor;
use crate::tensor::{to_i32_shape, OrPanic};
use burn_backend::{Shape, Slice};
use mlx_rs::{ops, Array};

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

/// The tensor as one dimension.
pub(super) fn flatten(t: MlxTensor) -> MlxTensor {
    let n = t.array.size();
    unary(t, "flatten", |a| a.reshape(&[n as i32]))
}
