//! Op implementations shared by the float, int and bool traits.
//!
//! MLX uses one array type for every dtype, so most ops are written once here, and the trait
//! impls in `float.rs`, `int.rs` and `bool_tensor.rs` forward to them with their dtype rules.
//!
//! The helpers are grouped by what they do: [`create`] (constants, casts, device moves, random
//! tensors), [`arith`] (arithmetic adapted to Burn's definitions), [`layout`] (shape and layout),
//! [`index`] (gathers, scatters, selects, masks), [`reduce`] (reductions and scans) and
//! [`sort`] (sorting and top-k). This file keeps the three appliers every op goes through
//! ([`unary`], [`binary`], [`with_scalar`]) and re-exports the groups' helpers, so callers name
//! them `base::name`.

mod arith;
pub(crate) mod column_sum_cuda;
mod create;
mod index;
mod layout;
mod reduce;
mod sort;

pub(crate) use arith::{bitwise_not, int_div_trunc, matmul_add, remainder};
pub(crate) use create::{cast, cast_array, full, random, to_device, zeros};
pub(crate) use index::{
    gather, gather_nd, mask_fill, mask_where, scatter_add, scatter_nd, select, select_add,
};
pub(crate) use layout::{
    cat, expand, flip, permute, repeat_dim, reshape, slice, slice_assign, swap_dims, unfold,
};
pub(crate) use reduce::{
    all, all_dim, any, any_dim, argmax, argmin, cumulative, float_cum_extreme, max, max_dim,
    max_dim_with_indices, mean, mean_dim, min, min_dim, min_dim_with_indices, prod, prod_dim, sum,
    sum_dim, sum_leading_axes,
};
pub(crate) use sort::{argsort, argtopk, sort, sort_with_indices, topk};

use crate::tensor::MlxTensor;
use crate::tensor::{scalar_array, OrPanic};
use burn_backend::Scalar;
use mlx_rs::error::Exception;
use mlx_rs::Array;

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
