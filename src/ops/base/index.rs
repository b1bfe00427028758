//! Indexing by tensors of indices or masks: gathers, scatters, selects, masked fills, and the
//! n-dimensional `gather_nd`/`scatter_nd`. MLX does not bounds-check indices, so every index
//! is clamped (or its update dropped) before it reaches MLX.

use super::create::cast;
use super::{unary, MlxResult};
use crate::native;
use crate::tensor::MlxTensor;
use crate::tensor::{scalar_array, OrPanic};
use crate::MlxDevice;
use burn_backend::Scalar;
use mlx_rs::error::Exception;
use mlx_rs::{ops, Array, Dtype};

/// Burn's `gather`: `out[i][j] = t[i][indices[i][j]]` along `dim`.
pub(crate) fn gather(dim: usize, t: MlxTensor, indices: MlxTensor) -> MlxTensor {
    let out = t
        .device
        .scope(|| {
            let idx = clamp_indices(
                &indices.array,
                t.array.shape()[dim],
                t.device == MlxDevice::Gpu,
            )?;
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
/// On the GPU (`gpu`) the bounds are device-made constants ([`native::int_constant`]).
fn clamp_indices(indices: &Array, n: i32, gpu: bool) -> MlxResult {
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
    let lo = native::int_constant(0, dtype, gpu)?;
    let hi = native::int_constant(hi, dtype, gpu)?;
    ops::minimum(ops::maximum(indices, &lo)?, &hi)
}

/// `values` with zeros where `indices` (broadcasting to its shape) is outside `[0, n)`: a
/// scatter-add then drops the updates of out-of-range indices instead of adding them at a
/// clamped position.
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
            let idx = clamp_indices(&indices.array, n, t.device == MlxDevice::Gpu)?;
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
            let idx = clamp_indices(
                &indices.array,
                t.array.shape()[dim],
                t.device == MlxDevice::Gpu,
            )?;
            ops::indexing::take_axis(&t.array, &idx, dim as i32)
        })
        .or_panic("select", &[&t.array, &indices.array]);
    t.with(out)
}

/// Burn's `select_add`: adds the slices of `value` to `t` at `indices` (1-d) along `dim`.
///
/// One MLX scatter of whole slices (`scatter_add` with `indices` `[n]` and the updates
/// `[n, …, 1, …]`): the indices are checked and clamped as the `n` values they are, and the
/// slices of out-of-range indices are zeroed, instead of broadcasting the indices to `value`'s
/// shape first. For an embedding's gradient (`[8192, 512]` values) that is the difference between
/// one pass over the values and five passes over 64-bit indices of the same size.
pub(crate) fn select_add(
    t: MlxTensor,
    dim: usize,
    indices: MlxTensor,
    value: MlxTensor,
) -> MlxTensor {
    let value = cast(value, t.array.dtype());
    if indices.array.size() == 0 {
        return t;
    }
    let rank = value.array.ndim();
    let out = t
        .device
        .scope(|| {
            let n = t.array.shape()[dim];
            let idx = indices.array.reshape(&[-1])?;
            let count = idx.shape()[0];
            // The slices as updates `[count, …, 1 at dim, …]`.
            let moved = if dim == 0 {
                value.array.clone()
            } else {
                ops::move_axis(&value.array, dim as i32, 0)?
            };
            let mut shape = moved.shape().to_vec();
            shape.insert(dim + 1, 1);
            let updates = moved.reshape(&shape)?;
            // The checks on the `[count]` indices, broadcast over each slice.
            let mut per_slice = vec![1i32; rank + 1];
            per_slice[0] = count;
            let updates = drop_out_of_range(&updates, &idx.reshape(&per_slice)?, n)?;
            let idx = clamp_indices(&idx, n, t.device == MlxDevice::Gpu)?;
            ops::indexing::scatter_add_single(&t.array, &idx, &updates, dim as i32)
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
    let gpu = data.device == MlxDevice::Gpu;
    unary(data, "gather_nd", move |a| {
        let dims = a.shape().to_vec();
        let k = *idx.shape().last().unwrap_or(&0) as usize;
        let (linear, batch) = nd_positions(&dims, &idx)?;
        let flat = nd_flatten(a, k)?;
        let linear = clamp_indices(&linear, flat.shape()[0], gpu)?;
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
    let gpu = data.device == MlxDevice::Gpu;
    unary(data, "scatter_nd", move |a| {
        let dims = a.shape().to_vec();
        let k = *idx.shape().last().unwrap_or(&0) as usize;
        let (linear, _) = nd_positions(&dims, &idx)?;
        let mut upd_shape = vec![linear.shape()[0], 1];
        upd_shape.extend_from_slice(&dims[k..]);
        let updates = vals.reshape(&upd_shape)?;
        let flat = nd_flatten(a, k)?;
        let linear = clamp_indices(&linear, flat.shape()[0], gpu)?;
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
