//! Burn's `IntTensorOps` on MLX.

use super::base::{self, binary, cast, cast_array, unary, with_scalar};
use crate::backend::Mlx;
use crate::device::MlxDevice;
use crate::dtype::{float_mlx, int_mlx};
use crate::native;
use crate::tensor::scalar_array;
use crate::tensor::MlxTensor;
use burn_backend::ops::IntTensorOps;
use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor};
use burn_backend::{
    BoolDType, Distribution, ExecutionError, FloatDType, IntDType, Scalar, Shape, Slice, TensorData,
};
use mlx_rs::error::Exception;
use mlx_rs::{ops, Array};
use std::ops::Range;

/// The dtype of the indices that `int_argmax`/`int_argmin` (and the `*_with_indices` reductions
/// built on them) return: the device's default int dtype, as burn-ndarray returns its `IntElem`
/// whatever the input's int dtype.
fn index_dtype(device: &MlxDevice) -> mlx_rs::Dtype {
    int_mlx(burn_backend::get_device_settings::<Mlx>(device).int_dtype)
}

/// Maps a [`native`](crate::native) error into mlx-rs's error type inside op closures.
fn ffi_err(e: crate::error::MlxError) -> Exception {
    Exception::custom(e.to_string())
}

/// Integer comparisons, tensor and scalar forms.
macro_rules! compare_int {
    ($($name:ident, $name_elem:ident => $m:ident;)*) => {$(
        fn $name(lhs: IntTensor<Self>, rhs: IntTensor<Self>, _out: BoolDType) -> BoolTensor<Self> {
            binary(lhs, rhs, stringify!($name), |a, b| a.$m(b))
        }
        fn $name_elem(lhs: IntTensor<Self>, rhs: Scalar, _out: BoolDType) -> BoolTensor<Self> {
            with_scalar(lhs, rhs, stringify!($name_elem), |a, b| a.$m(b))
        }
    )*};
}

/// Bitwise ops, tensor and scalar forms, through the mlx-c wrappers.
macro_rules! bitwise {
    ($($name:ident, $name_scalar:ident => $f:path;)*) => {$(
        fn $name(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
            let dtype = lhs.array.dtype();
            let rhs = cast(rhs, dtype);
            binary(lhs, rhs, stringify!($name), |a, b| $f(a, b).map_err(ffi_err))
        }
        fn $name_scalar(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self> {
            with_scalar(lhs, rhs, stringify!($name_scalar), |a, b| $f(a, b).map_err(ffi_err))
        }
    )*};
}

impl IntTensorOps<Self> for Mlx {
    fn int_empty(shape: Shape, device: &MlxDevice, dtype: IntDType) -> IntTensor<Self> {
        base::zeros(&shape, int_mlx(dtype), device)
    }

    async fn int_into_data(tensor: IntTensor<Self>) -> Result<TensorData, ExecutionError> {
        Ok(tensor.to_data()?)
    }

    fn int_from_data(data: TensorData, device: &MlxDevice) -> IntTensor<Self> {
        MlxTensor::from_data(data, *device).unwrap_or_else(|e| panic!("burn-mlx: {e}"))
    }

    fn int_device(tensor: &IntTensor<Self>) -> MlxDevice {
        tensor.device
    }

    fn int_to_device(tensor: IntTensor<Self>, device: &MlxDevice) -> IntTensor<Self> {
        base::to_device(tensor, device)
    }

    fn int_reshape(tensor: IntTensor<Self>, shape: Shape) -> IntTensor<Self> {
        base::reshape(tensor, shape)
    }

    fn int_slice(tensor: IntTensor<Self>, slices: &[Slice]) -> IntTensor<Self> {
        base::slice(tensor, slices)
    }

    fn int_slice_assign(
        tensor: IntTensor<Self>,
        slices: &[Slice],
        value: IntTensor<Self>,
    ) -> IntTensor<Self> {
        base::slice_assign(tensor, slices, value)
    }

    fn int_into_float(tensor: IntTensor<Self>, out_dtype: FloatDType) -> FloatTensor<Self> {
        cast(tensor, float_mlx(out_dtype))
    }

    fn int_mask_where(
        tensor: IntTensor<Self>,
        mask: BoolTensor<Self>,
        value: IntTensor<Self>,
    ) -> IntTensor<Self> {
        base::mask_where(tensor, mask, value)
    }

    fn int_mask_fill(
        tensor: IntTensor<Self>,
        mask: BoolTensor<Self>,
        value: Scalar,
    ) -> IntTensor<Self> {
        base::mask_fill(tensor, mask, value)
    }

    fn int_gather(
        dim: usize,
        tensor: IntTensor<Self>,
        indices: IntTensor<Self>,
    ) -> IntTensor<Self> {
        base::gather(dim, tensor, indices)
    }

    fn int_scatter_add(
        dim: usize,
        tensor: IntTensor<Self>,
        indices: IntTensor<Self>,
        value: IntTensor<Self>,
    ) -> IntTensor<Self> {
        base::scatter_add(dim, tensor, indices, value)
    }

    fn int_gather_nd(data: IntTensor<Self>, indices: IntTensor<Self>) -> IntTensor<Self> {
        base::gather_nd(data, indices)
    }

    fn int_scatter_nd(
        data: IntTensor<Self>,
        indices: IntTensor<Self>,
        values: IntTensor<Self>,
        reduction: burn_backend::tensor::IndexingUpdateOp,
    ) -> IntTensor<Self> {
        base::scatter_nd(data, indices, values, reduction)
    }

    fn int_select(
        tensor: IntTensor<Self>,
        dim: usize,
        indices: IntTensor<Self>,
    ) -> IntTensor<Self> {
        base::select(tensor, dim, indices)
    }

    fn int_select_add(
        tensor: IntTensor<Self>,
        dim: usize,
        indices: IntTensor<Self>,
        value: IntTensor<Self>,
    ) -> IntTensor<Self> {
        base::select_add(tensor, dim, indices, value)
    }

    compare_int! {
        int_equal, int_equal_elem => eq;
        int_not_equal, int_not_equal_elem => ne;
        int_greater, int_greater_elem => gt;
        int_greater_equal, int_greater_equal_elem => ge;
        int_lower, int_lower_elem => lt;
        int_lower_equal, int_lower_equal_elem => le;
    }

    fn int_add(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        binary(lhs, rhs, "int_add", |a, b| a.add(b))
    }

    fn int_add_scalar(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self> {
        with_scalar(lhs, rhs, "int_add_scalar", |a, b| a.add(b))
    }

    fn int_sub(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        binary(lhs, rhs, "int_sub", |a, b| a.subtract(b))
    }

    fn int_sub_scalar(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self> {
        with_scalar(lhs, rhs, "int_sub_scalar", |a, b| a.subtract(b))
    }

    fn int_mul(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        binary(lhs, rhs, "int_mul", |a, b| a.multiply(b))
    }

    fn int_mul_scalar(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self> {
        with_scalar(lhs, rhs, "int_mul_scalar", |a, b| a.multiply(b))
    }

    fn int_div(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        binary(lhs, rhs, "int_div", base::int_div_trunc)
    }

    fn int_div_scalar(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self> {
        with_scalar(lhs, rhs, "int_div_scalar", base::int_div_trunc)
    }

    fn int_remainder(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        binary(lhs, rhs, "int_remainder", base::remainder)
    }

    fn int_remainder_scalar(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self> {
        with_scalar(lhs, rhs, "int_remainder_scalar", base::remainder)
    }

    fn int_matmul(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        // MLX's matmul is floating-point only: multiply and reduce over the shared axis instead,
        // which keeps integer results exact.
        let dtype = lhs.array.dtype();
        binary(lhs, rhs, "int_matmul", |a, b| {
            let a = ops::expand_dims(a, -1)?;
            let b = ops::expand_dims(b, -3)?;
            cast_array(a.multiply(&b)?.sum_axis(-2, false)?, dtype)
        })
    }

    fn int_sum(tensor: IntTensor<Self>) -> IntTensor<Self> {
        base::sum(tensor)
    }

    fn int_sum_dim(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        base::sum_dim(tensor, dim)
    }

    fn int_prod(tensor: IntTensor<Self>) -> IntTensor<Self> {
        base::prod(tensor)
    }

    fn int_prod_dim(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        base::prod_dim(tensor, dim)
    }

    fn int_mean(tensor: IntTensor<Self>) -> IntTensor<Self> {
        base::mean(tensor)
    }

    fn int_mean_dim(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        base::mean_dim(tensor, dim)
    }

    fn int_cumsum(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        base::cumulative(tensor, dim, "int_cumsum", |a, d| a.cumsum(d, false, true))
    }

    fn int_cumprod(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        base::cumulative(tensor, dim, "int_cumprod", |a, d| a.cumprod(d, false, true))
    }

    fn int_cummin(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        base::cumulative(tensor, dim, "int_cummin", |a, d| a.cummin(d, false, true))
    }

    fn int_cummax(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        base::cumulative(tensor, dim, "int_cummax", |a, d| a.cummax(d, false, true))
    }

    fn int_argmax(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        let out = index_dtype(&tensor.device);
        base::argmax(tensor, dim, out)
    }

    fn int_argmin(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        let out = index_dtype(&tensor.device);
        base::argmin(tensor, dim, out)
    }

    fn int_argtopk(tensor: IntTensor<Self>, dim: usize, k: usize) -> IntTensor<Self> {
        let out = tensor.array.dtype();
        base::argtopk(tensor, dim, k, out)
    }

    fn int_topk(tensor: IntTensor<Self>, dim: usize, k: usize) -> IntTensor<Self> {
        base::topk(tensor, dim, k)
    }

    fn int_abs(tensor: IntTensor<Self>) -> IntTensor<Self> {
        unary(tensor, "int_abs", |a| a.abs())
    }

    fn int_swap_dims(tensor: IntTensor<Self>, dim1: usize, dim2: usize) -> IntTensor<Self> {
        base::swap_dims(tensor, dim1, dim2)
    }

    fn int_permute(tensor: IntTensor<Self>, axes: &[usize]) -> IntTensor<Self> {
        base::permute(tensor, axes)
    }

    fn int_flip(tensor: IntTensor<Self>, axes: &[usize]) -> IntTensor<Self> {
        base::flip(tensor, axes)
    }

    fn int_random(
        shape: Shape,
        distribution: Distribution,
        device: &MlxDevice,
        dtype: IntDType,
    ) -> IntTensor<Self> {
        base::random(&shape, distribution, int_mlx(dtype), device)
    }

    fn int_expand(tensor: IntTensor<Self>, shape: Shape) -> IntTensor<Self> {
        base::expand(tensor, shape)
    }

    bitwise! {
        bitwise_and, bitwise_and_scalar => native::bitwise_and;
        bitwise_or, bitwise_or_scalar => native::bitwise_or;
        bitwise_xor, bitwise_xor_scalar => native::bitwise_xor;
        bitwise_left_shift, bitwise_left_shift_scalar => native::left_shift;
        bitwise_right_shift, bitwise_right_shift_scalar => native::right_shift;
    }

    fn bitwise_not(tensor: IntTensor<Self>) -> IntTensor<Self> {
        unary(tensor, "bitwise_not", |a| {
            base::bitwise_not(a).map_err(ffi_err)
        })
    }

    fn int_cast(tensor: IntTensor<Self>, dtype: IntDType) -> IntTensor<Self> {
        cast(tensor, int_mlx(dtype))
    }

    fn int_unfold(
        tensor: IntTensor<Self>,
        dim: usize,
        size: usize,
        step: usize,
    ) -> IntTensor<Self> {
        base::unfold(tensor, dim, size, step)
    }

    fn int_repeat_dim(tensor: IntTensor<Self>, dim: usize, times: usize) -> IntTensor<Self> {
        base::repeat_dim(tensor, dim, times)
    }

    fn int_cat(tensors: Vec<IntTensor<Self>>, dim: usize) -> IntTensor<Self> {
        base::cat(tensors, dim)
    }

    fn int_powi(lhs: IntTensor<Self>, rhs: IntTensor<Self>) -> IntTensor<Self> {
        let dtype = lhs.array.dtype();
        let rhs = cast(rhs, dtype);
        binary(lhs, rhs, "int_powi", |a, b| a.power(b))
    }

    fn int_powi_scalar(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self> {
        with_scalar(lhs, rhs, "int_powi_scalar", |a, b| a.power(b))
    }

    fn int_powi_scalar_impl(lhs: IntTensor<Self>, rhs: Scalar) -> IntTensor<Self> {
        with_scalar(lhs, rhs, "int_powi_scalar", |a, b| a.power(b))
    }

    fn int_clamp_min(tensor: IntTensor<Self>, min: Scalar) -> IntTensor<Self> {
        with_scalar(tensor, min, "int_clamp_min", |a, b| ops::maximum(a, b))
    }

    fn int_clamp_max(tensor: IntTensor<Self>, max: Scalar) -> IntTensor<Self> {
        with_scalar(tensor, max, "int_clamp_max", |a, b| ops::minimum(a, b))
    }

    fn int_clamp(tensor: IntTensor<Self>, min: Scalar, max: Scalar) -> IntTensor<Self> {
        let dtype = tensor.array.dtype();
        let (lo, hi) = (scalar_array(min, dtype), scalar_array(max, dtype));
        unary(tensor, "int_clamp", |a| ops::clip(a, (&lo, &hi)))
    }

    fn int_neg(tensor: IntTensor<Self>) -> IntTensor<Self> {
        unary(tensor, "int_neg", |a| a.negative())
    }

    fn int_zeros(shape: Shape, device: &MlxDevice, dtype: IntDType) -> IntTensor<Self> {
        base::zeros(&shape, int_mlx(dtype), device)
    }

    fn int_ones(shape: Shape, device: &MlxDevice, dtype: IntDType) -> IntTensor<Self> {
        base::full(&shape, Scalar::Int(1), int_mlx(dtype), device)
    }

    fn int_full(
        shape: Shape,
        fill_value: Scalar,
        device: &MlxDevice,
        dtype: IntDType,
    ) -> IntTensor<Self> {
        base::full(&shape, fill_value, int_mlx(dtype), device)
    }

    fn int_max(tensor: IntTensor<Self>) -> IntTensor<Self> {
        base::max(tensor)
    }

    fn int_max_dim(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        base::max_dim(tensor, dim)
    }

    fn int_max_dim_with_indices(
        tensor: IntTensor<Self>,
        dim: usize,
    ) -> (IntTensor<Self>, IntTensor<Self>) {
        let out = index_dtype(&tensor.device);
        base::max_dim_with_indices(tensor, dim, out)
    }

    fn int_max_abs(tensor: IntTensor<Self>) -> IntTensor<Self> {
        unary(tensor, "int_max_abs", |a| a.abs()?.max(None)?.reshape(&[1]))
    }

    fn int_max_abs_dim(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        unary(tensor, "int_max_abs_dim", |a| {
            a.abs()?.max_axis(dim as i32, true)
        })
    }

    fn int_min(tensor: IntTensor<Self>) -> IntTensor<Self> {
        base::min(tensor)
    }

    fn int_min_dim(tensor: IntTensor<Self>, dim: usize) -> IntTensor<Self> {
        base::min_dim(tensor, dim)
    }

    fn int_min_dim_with_indices(
        tensor: IntTensor<Self>,
        dim: usize,
    ) -> (IntTensor<Self>, IntTensor<Self>) {
        let out = index_dtype(&tensor.device);
        base::min_dim_with_indices(tensor, dim, out)
    }

    fn int_transpose(tensor: IntTensor<Self>) -> IntTensor<Self> {
        let n = tensor.array.ndim();
        if n < 2 {
            return tensor;
        }
        base::swap_dims(tensor, n - 2, n - 1)
    }

    fn int_arange_step(
        range: Range<i64>,
        step: usize,
        device: &MlxDevice,
        dtype: IntDType,
    ) -> IntTensor<Self> {
        let dtype = int_mlx(dtype);
        let (start, end, step) = (range.start, range.end, step as i64);
        let out = device
            .scope(|| {
                if end <= start {
                    return ops::zeros_dtype(&[0], dtype);
                }
                let n = (end - start + step - 1) / step;
                let idx = ops::arange::<_, i64>(0, n, 1)?;
                let v = idx
                    .multiply(Array::from_slice(&[step], &[]))?
                    .add(Array::from_slice(&[start], &[]))?;
                cast_array(v, dtype)
            })
            .unwrap_or_else(|e| panic!("burn-mlx: `int_arange_step` {start}..{end}: {e}"));
        MlxTensor::from_array(out, *device)
    }

    fn int_arange(range: Range<i64>, device: &MlxDevice, dtype: IntDType) -> IntTensor<Self> {
        Self::int_arange_step(range, 1, device, dtype)
    }

    fn int_any(tensor: IntTensor<Self>, _out: BoolDType) -> BoolTensor<Self> {
        base::any(tensor)
    }

    fn int_any_dim(tensor: IntTensor<Self>, dim: usize, _out: BoolDType) -> BoolTensor<Self> {
        base::any_dim(tensor, dim)
    }

    fn int_all(tensor: IntTensor<Self>, _out: BoolDType) -> BoolTensor<Self> {
        base::all(tensor)
    }

    fn int_all_dim(tensor: IntTensor<Self>, dim: usize, _out: BoolDType) -> BoolTensor<Self> {
        base::all_dim(tensor, dim)
    }

    fn int_sign(tensor: IntTensor<Self>) -> IntTensor<Self> {
        unary(tensor, "int_sign", |a| ops::sign(a))
    }

    fn int_sort(tensor: IntTensor<Self>, dim: usize, descending: bool) -> IntTensor<Self> {
        base::sort(tensor, dim, descending)
    }

    fn int_sort_with_indices(
        tensor: IntTensor<Self>,
        dim: usize,
        descending: bool,
    ) -> (IntTensor<Self>, IntTensor<Self>) {
        let out = tensor.array.dtype();
        base::sort_with_indices(tensor, dim, descending, out)
    }

    fn int_argsort(tensor: IntTensor<Self>, dim: usize, descending: bool) -> IntTensor<Self> {
        let out = tensor.array.dtype();
        base::argsort(tensor, dim, descending, out)
    }
}
