//! Burn's `BoolTensorOps` on MLX (native MLX bool arrays).

use super::base::{self, binary, cast, unary, with_scalar};
use crate::backend::Mlx;
use crate::device::MlxDevice;
use crate::dtype::{float_mlx, int_mlx};
use crate::tensor::MlxTensor;
use burn_backend::ops::BoolTensorOps;
use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor};
use burn_backend::{
    BoolDType, ExecutionError, FloatDType, IntDType, Scalar, Shape, Slice, TensorData,
};
use mlx_rs::Dtype;

impl BoolTensorOps<Self> for Mlx {
    fn bool_empty(shape: Shape, device: &MlxDevice, _dtype: BoolDType) -> BoolTensor<Self> {
        base::zeros(&shape, Dtype::Bool, device)
    }

    fn bool_zeros(shape: Shape, device: &MlxDevice, _dtype: BoolDType) -> BoolTensor<Self> {
        base::zeros(&shape, Dtype::Bool, device)
    }

    fn bool_ones(shape: Shape, device: &MlxDevice, _dtype: BoolDType) -> BoolTensor<Self> {
        base::full(&shape, Scalar::Bool(true), Dtype::Bool, device)
    }

    async fn bool_into_data(tensor: BoolTensor<Self>) -> Result<TensorData, ExecutionError> {
        Ok(tensor.to_data()?)
    }

    fn bool_from_data(data: TensorData, device: &MlxDevice) -> BoolTensor<Self> {
        MlxTensor::from_data(data, *device).unwrap_or_else(|e| panic!("burn-mlx: {e}"))
    }

    fn bool_into_int(tensor: BoolTensor<Self>, out_dtype: IntDType) -> IntTensor<Self> {
        cast(tensor, int_mlx(out_dtype))
    }

    fn bool_into_float(tensor: BoolTensor<Self>, out_dtype: FloatDType) -> FloatTensor<Self> {
        cast(tensor, float_mlx(out_dtype))
    }

    fn bool_device(tensor: &BoolTensor<Self>) -> MlxDevice {
        tensor.device
    }

    fn bool_to_device(tensor: BoolTensor<Self>, device: &MlxDevice) -> BoolTensor<Self> {
        base::to_device(tensor, device)
    }

    fn bool_reshape(tensor: BoolTensor<Self>, shape: Shape) -> BoolTensor<Self> {
        base::reshape(tensor, shape)
    }

    fn bool_slice(tensor: BoolTensor<Self>, slices: &[Slice]) -> BoolTensor<Self> {
        base::slice(tensor, slices)
    }

    fn bool_slice_assign(
        tensor: BoolTensor<Self>,
        slices: &[Slice],
        value: BoolTensor<Self>,
    ) -> BoolTensor<Self> {
        base::slice_assign(tensor, slices, value)
    }

    fn bool_mask_where(
        tensor: BoolTensor<Self>,
        mask: BoolTensor<Self>,
        value: BoolTensor<Self>,
    ) -> BoolTensor<Self> {
        base::mask_where(tensor, mask, value)
    }

    fn bool_mask_fill(
        tensor: BoolTensor<Self>,
        mask: BoolTensor<Self>,
        value: Scalar,
    ) -> BoolTensor<Self> {
        base::mask_fill(tensor, mask, value)
    }

    fn bool_gather(
        dim: usize,
        tensor: BoolTensor<Self>,
        indices: IntTensor<Self>,
    ) -> BoolTensor<Self> {
        base::gather(dim, tensor, indices)
    }

    fn bool_scatter_or(
        dim: usize,
        tensor: BoolTensor<Self>,
        indices: IntTensor<Self>,
        value: BoolTensor<Self>,
    ) -> BoolTensor<Self> {
        // Count the true values landing on each position, then OR with the tensor.
        let counts = base::zeros(
            &burn_backend::TensorMetadata::shape(&tensor),
            Dtype::Int32,
            &tensor.device,
        );
        let counts = base::scatter_add(dim, counts, indices, cast(value, Dtype::Int32));
        binary(tensor, counts, "bool_scatter_or", |t, c| {
            t.logical_or(&c.gt(mlx_rs::Array::from_int(0))?)
        })
    }

    fn bool_select(
        tensor: BoolTensor<Self>,
        dim: usize,
        indices: IntTensor<Self>,
    ) -> BoolTensor<Self> {
        base::select(tensor, dim, indices)
    }

    fn bool_select_or(
        tensor: BoolTensor<Self>,
        dim: usize,
        indices: IntTensor<Self>,
        value: BoolTensor<Self>,
    ) -> BoolTensor<Self> {
        let counts = base::zeros(
            &burn_backend::TensorMetadata::shape(&tensor),
            Dtype::Int32,
            &tensor.device,
        );
        let counts = base::select_add(counts, dim, indices, cast(value, Dtype::Int32));
        binary(tensor, counts, "bool_select_or", |t, c| {
            t.logical_or(&c.gt(mlx_rs::Array::from_int(0))?)
        })
    }

    fn bool_repeat_dim(tensor: BoolTensor<Self>, dim: usize, times: usize) -> BoolTensor<Self> {
        base::repeat_dim(tensor, dim, times)
    }

    fn bool_cat(tensors: Vec<BoolTensor<Self>>, dim: usize) -> BoolTensor<Self> {
        base::cat(tensors, dim)
    }

    fn bool_equal(lhs: BoolTensor<Self>, rhs: BoolTensor<Self>) -> BoolTensor<Self> {
        binary(lhs, rhs, "bool_equal", |a, b| a.eq(b))
    }

    fn bool_not_equal(lhs: BoolTensor<Self>, rhs: BoolTensor<Self>) -> BoolTensor<Self> {
        binary(lhs, rhs, "bool_not_equal", |a, b| a.ne(b))
    }

    fn bool_equal_elem(lhs: BoolTensor<Self>, rhs: Scalar) -> BoolTensor<Self> {
        with_scalar(lhs, rhs, "bool_equal_elem", |a, b| a.eq(b))
    }

    fn bool_not_equal_elem(lhs: BoolTensor<Self>, rhs: Scalar) -> BoolTensor<Self> {
        with_scalar(lhs, rhs, "bool_not_equal_elem", |a, b| a.ne(b))
    }

    fn bool_not(tensor: BoolTensor<Self>) -> BoolTensor<Self> {
        unary(tensor, "bool_not", |a| a.logical_not())
    }

    fn bool_and(lhs: BoolTensor<Self>, rhs: BoolTensor<Self>) -> BoolTensor<Self> {
        binary(lhs, rhs, "bool_and", |a, b| a.logical_and(b))
    }

    fn bool_or(lhs: BoolTensor<Self>, rhs: BoolTensor<Self>) -> BoolTensor<Self> {
        binary(lhs, rhs, "bool_or", |a, b| a.logical_or(b))
    }

    fn bool_xor(lhs: BoolTensor<Self>, rhs: BoolTensor<Self>) -> BoolTensor<Self> {
        binary(lhs, rhs, "bool_xor", |a, b| a.ne(b))
    }

    fn bool_transpose(tensor: BoolTensor<Self>) -> BoolTensor<Self> {
        let n = tensor.array.ndim();
        if n < 2 {
            return tensor;
        }
        base::swap_dims(tensor, n - 2, n - 1)
    }

    fn bool_swap_dims(tensor: BoolTensor<Self>, dim1: usize, dim2: usize) -> BoolTensor<Self> {
        base::swap_dims(tensor, dim1, dim2)
    }

    fn bool_permute(tensor: BoolTensor<Self>, axes: &[usize]) -> BoolTensor<Self> {
        base::permute(tensor, axes)
    }

    fn bool_flip(tensor: BoolTensor<Self>, axes: &[usize]) -> BoolTensor<Self> {
        base::flip(tensor, axes)
    }

    fn bool_any(tensor: BoolTensor<Self>) -> BoolTensor<Self> {
        base::any(tensor)
    }

    fn bool_any_dim(tensor: BoolTensor<Self>, dim: usize) -> BoolTensor<Self> {
        base::any_dim(tensor, dim)
    }

    fn bool_all(tensor: BoolTensor<Self>) -> BoolTensor<Self> {
        base::all(tensor)
    }

    fn bool_all_dim(tensor: BoolTensor<Self>, dim: usize) -> BoolTensor<Self> {
        base::all_dim(tensor, dim)
    }

    fn bool_expand(tensor: BoolTensor<Self>, shape: Shape) -> BoolTensor<Self> {
        base::expand(tensor, shape)
    }

    fn bool_unfold(
        tensor: BoolTensor<Self>,
        dim: usize,
        size: usize,
        step: usize,
    ) -> BoolTensor<Self> {
        base::unfold(tensor, dim, size, step)
    }
}
