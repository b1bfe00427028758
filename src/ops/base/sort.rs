//! Sorting and top-k, floats in their total order (NaN after +inf), as Burn's sorts order them.

use super::create::cast_array;
use super::index::gather;
use super::layout::slice;
use super::{unary, MlxResult};
use crate::dtype::is_float;
use crate::native;
use crate::tensor::MlxTensor;
use crate::tensor::OrPanic;
use burn_backend::Slice;
use mlx_rs::error::Exception;
use mlx_rs::{ops, Array, Dtype};

/// `a` with row-major strides: MLX's `contiguous`, or, inside a traced function, a flatten and a
/// reshape back, which copy a strided array the same way: MLX 0.32 cannot write its `Contiguous`
/// primitive to a function file ([`crate::export`]).
fn row_major(a: &Array) -> MlxResult {
    if crate::trace::is_tracing() {
        return a.flatten(None, None)?.reshape(a.shape());
    }
    a.contiguous()
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
    let bits = row_major(a)?.view_dtype(int)?;
    let max = max.as_dtype(int)?;
    let zero = Array::from_int(0).as_dtype(int)?;
    let flipped = native::bitwise_xor(&bits, &max).map_err(|e| Exception::custom(e.to_string()))?;
    ops::select(&bits.lt(&zero)?, &flipped, &bits)
}

/// A sort key whose ascending order is `a`'s descending order.
fn descending_key(a: &Array) -> MlxResult {
    let invert =
        |k: &Array| super::arith::bitwise_not(k).map_err(|e| Exception::custom(e.to_string()));
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
    let a = &row_major(a)?;
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
        return unary(t, "sort", |a| ops::sort_axis(row_major(a)?, dim as i32));
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
