//! Burn's `FloatTensorOps` on MLX.

use super::base::{self, binary, cast, unary, with_scalar};
use crate::backend::Mlx;
use crate::device::MlxDevice;
use crate::dtype::{float_mlx, int_mlx};
use crate::native;
use crate::tensor::MlxTensor;
use crate::tensor::{scalar_array, scalar_f64};
use burn_backend::ops::FloatTensorOps;
use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor};
use burn_backend::{
    BoolDType, Distribution, ExecutionError, FloatDType, IntDType, Scalar, Shape, Slice, TensorData,
};
use mlx_rs::{ops, Array, Dtype};

/// Elementwise float ops that map one-to-one onto an MLX function.
macro_rules! unary_float {
    ($($(#[$doc:meta])* $name:ident => $f:expr;)*) => {$(
        fn $name(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
            unary(tensor, stringify!($name), $f)
        }
    )*};
}

/// Float comparisons, tensor and scalar forms.
macro_rules! compare_float {
    ($($name:ident, $name_elem:ident => $m:ident;)*) => {$(
        fn $name(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>, _out: BoolDType) -> BoolTensor<Self> {
            binary(lhs, rhs, stringify!($name), |a, b| a.$m(b))
        }
        fn $name_elem(lhs: FloatTensor<Self>, rhs: Scalar, _out: BoolDType) -> BoolTensor<Self> {
            with_scalar(lhs, rhs, stringify!($name_elem), |a, b| a.$m(b))
        }
    )*};
}

/// Float tensors keep floats through integer-only MLX ops.
fn float_like(t: &MlxTensor) -> Dtype {
    t.array.dtype()
}

impl FloatTensorOps<Self> for Mlx {
    fn float_from_data(data: TensorData, device: &MlxDevice) -> FloatTensor<Self> {
        MlxTensor::from_data(data, *device).unwrap_or_else(|e| panic!("burn-mlx: {e}"))
    }

    fn float_random(
        shape: Shape,
        distribution: Distribution,
        device: &MlxDevice,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        base::random(&shape, distribution, float_mlx(dtype), device)
    }

    fn float_zeros(shape: Shape, device: &MlxDevice, dtype: FloatDType) -> FloatTensor<Self> {
        base::zeros(&shape, float_mlx(dtype), device)
    }

    fn float_ones(shape: Shape, device: &MlxDevice, dtype: FloatDType) -> FloatTensor<Self> {
        base::full(&shape, Scalar::Float(1.0), float_mlx(dtype), device)
    }

    fn float_full(
        shape: Shape,
        fill_value: Scalar,
        device: &MlxDevice,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        base::full(&shape, fill_value, float_mlx(dtype), device)
    }

    async fn float_into_data(tensor: FloatTensor<Self>) -> Result<TensorData, ExecutionError> {
        Ok(tensor.to_data()?)
    }

    fn float_device(tensor: &FloatTensor<Self>) -> MlxDevice {
        tensor.device
    }

    fn float_to_device(tensor: FloatTensor<Self>, device: &MlxDevice) -> FloatTensor<Self> {
        base::to_device(tensor, device)
    }

    fn float_into_int(tensor: FloatTensor<Self>, out_dtype: IntDType) -> IntTensor<Self> {
        cast(tensor, int_mlx(out_dtype))
    }

    fn float_empty(shape: Shape, device: &MlxDevice, dtype: FloatDType) -> FloatTensor<Self> {
        base::zeros(&shape, float_mlx(dtype), device)
    }

    fn float_repeat_dim(tensor: FloatTensor<Self>, dim: usize, times: usize) -> FloatTensor<Self> {
        base::repeat_dim(tensor, dim, times)
    }

    fn float_add(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        binary(lhs, rhs, "float_add", |a, b| a.add(b))
    }

    fn float_add_scalar(lhs: FloatTensor<Self>, rhs: Scalar) -> FloatTensor<Self> {
        with_scalar(lhs, rhs, "float_add_scalar", |a, b| a.add(b))
    }

    fn float_clamp_min(tensor: FloatTensor<Self>, min: Scalar) -> FloatTensor<Self> {
        with_scalar(tensor, min, "float_clamp_min", |a, b| ops::maximum(a, b))
    }

    fn float_clamp_max(tensor: FloatTensor<Self>, max: Scalar) -> FloatTensor<Self> {
        with_scalar(tensor, max, "float_clamp_max", |a, b| ops::minimum(a, b))
    }

    fn float_clamp(tensor: FloatTensor<Self>, min: Scalar, max: Scalar) -> FloatTensor<Self> {
        let dtype = float_like(&tensor);
        let (lo, hi) = (scalar_array(min, dtype), scalar_array(max, dtype));
        unary(tensor, "float_clamp", |a| ops::clip(a, (&lo, &hi)))
    }

    fn float_sub(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        binary(lhs, rhs, "float_sub", |a, b| a.subtract(b))
    }

    fn float_sub_scalar(lhs: FloatTensor<Self>, rhs: Scalar) -> FloatTensor<Self> {
        with_scalar(lhs, rhs, "float_sub_scalar", |a, b| a.subtract(b))
    }

    fn float_mul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        binary(lhs, rhs, "float_mul", |a, b| a.multiply(b))
    }

    fn float_mul_scalar(lhs: FloatTensor<Self>, rhs: Scalar) -> FloatTensor<Self> {
        with_scalar(lhs, rhs, "float_mul_scalar", |a, b| a.multiply(b))
    }

    fn float_div(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        binary(lhs, rhs, "float_div", |a, b| a.divide(b))
    }

    fn float_div_scalar(lhs: FloatTensor<Self>, rhs: Scalar) -> FloatTensor<Self> {
        with_scalar(lhs, rhs, "float_div_scalar", |a, b| a.divide(b))
    }

    fn float_remainder(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        binary(lhs, rhs, "float_remainder", base::remainder)
    }

    fn float_remainder_scalar(lhs: FloatTensor<Self>, rhs: Scalar) -> FloatTensor<Self> {
        // The divisor keeps f32 precision for half-precision tensors (see `base::remainder`).
        let dtype = lhs.array.dtype();
        let wide = match dtype {
            Dtype::Float16 | Dtype::Bfloat16 => Dtype::Float32,
            d => d,
        };
        let divisor = scalar_array(rhs, wide);
        unary(lhs, "float_remainder_scalar", |a| {
            base::remainder(a, &divisor)
        })
    }

    fn float_matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        let device = lhs.device;
        binary(lhs, rhs, "float_matmul", |a, b| {
            base::matmul_add(a, b, None, device)
        })
    }

    fn float_cross(
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        dim: usize,
    ) -> FloatTensor<Self> {
        binary(lhs, rhs, "float_cross", |a, b| {
            let d = dim as i32;
            let comp =
                |x: &Array, i: i32| ops::indexing::take_axis(x, Array::from_slice(&[i], &[1]), d);
            let (a0, a1, a2) = (comp(a, 0)?, comp(a, 1)?, comp(a, 2)?);
            let (b0, b1, b2) = (comp(b, 0)?, comp(b, 1)?, comp(b, 2)?);
            let c0 = a1.multiply(&b2)?.subtract(&a2.multiply(&b1)?)?;
            let c1 = a2.multiply(&b0)?.subtract(&a0.multiply(&b2)?)?;
            let c2 = a0.multiply(&b1)?.subtract(&a1.multiply(&b0)?)?;
            ops::concatenate(&[c0, c1, c2], d)
        })
    }

    fn float_neg(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        unary(tensor, "float_neg", |a| a.negative())
    }

    fn float_recip(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        unary(tensor, "float_recip", |a| a.reciprocal())
    }

    fn float_transpose(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        let n = tensor.array.ndim();
        if n < 2 {
            return tensor;
        }
        base::swap_dims(tensor, n - 2, n - 1)
    }

    fn float_swap_dims(tensor: FloatTensor<Self>, dim1: usize, dim2: usize) -> FloatTensor<Self> {
        base::swap_dims(tensor, dim1, dim2)
    }

    fn float_permute(tensor: FloatTensor<Self>, axes: &[usize]) -> FloatTensor<Self> {
        base::permute(tensor, axes)
    }

    fn float_flip(tensor: FloatTensor<Self>, axes: &[usize]) -> FloatTensor<Self> {
        base::flip(tensor, axes)
    }

    fn float_reshape(tensor: FloatTensor<Self>, shape: Shape) -> FloatTensor<Self> {
        base::reshape(tensor, shape)
    }

    fn float_gather(
        dim: usize,
        tensor: FloatTensor<Self>,
        indices: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        base::gather(dim, tensor, indices)
    }

    fn float_scatter_add(
        dim: usize,
        tensor: FloatTensor<Self>,
        indices: IntTensor<Self>,
        value: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        base::scatter_add(dim, tensor, indices, value)
    }

    fn float_gather_nd(data: FloatTensor<Self>, indices: IntTensor<Self>) -> FloatTensor<Self> {
        base::gather_nd(data, indices)
    }

    fn float_scatter_nd(
        data: FloatTensor<Self>,
        indices: IntTensor<Self>,
        values: FloatTensor<Self>,
        reduction: burn_backend::tensor::IndexingUpdateOp,
    ) -> FloatTensor<Self> {
        base::scatter_nd(data, indices, values, reduction)
    }

    fn float_select(
        tensor: FloatTensor<Self>,
        dim: usize,
        indices: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        base::select(tensor, dim, indices)
    }

    fn float_select_add(
        tensor: FloatTensor<Self>,
        dim: usize,
        indices: IntTensor<Self>,
        value: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        base::select_add(tensor, dim, indices, value)
    }

    fn float_slice(tensor: FloatTensor<Self>, slices: &[Slice]) -> FloatTensor<Self> {
        base::slice(tensor, slices)
    }

    fn float_slice_assign(
        tensor: FloatTensor<Self>,
        slices: &[Slice],
        value: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        base::slice_assign(tensor, slices, value)
    }

    fn float_mask_where(
        tensor: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        value: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        base::mask_where(tensor, mask, value)
    }

    fn float_mask_fill(
        tensor: FloatTensor<Self>,
        mask: BoolTensor<Self>,
        value: Scalar,
    ) -> FloatTensor<Self> {
        base::mask_fill(tensor, mask, value)
    }

    compare_float! {
        float_equal, float_equal_elem => eq;
        float_not_equal, float_not_equal_elem => ne;
        float_greater, float_greater_elem => gt;
        float_greater_equal, float_greater_equal_elem => ge;
        float_lower, float_lower_elem => lt;
        float_lower_equal, float_lower_equal_elem => le;
    }

    fn float_sum(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        base::sum(tensor)
    }

    fn float_sum_dim(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        base::sum_dim(tensor, dim)
    }

    fn float_prod(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        base::prod(tensor)
    }

    fn float_prod_dim(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        base::prod_dim(tensor, dim)
    }

    fn float_mean(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        base::mean(tensor)
    }

    fn float_mean_dim(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        base::mean_dim(tensor, dim)
    }

    fn float_cumsum(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        base::cumulative(tensor, dim, "float_cumsum", |a, d| a.cumsum(d, false, true))
    }

    fn float_cumprod(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        base::cumulative(tensor, dim, "float_cumprod", |a, d| {
            a.cumprod(d, false, true)
        })
    }

    fn float_cummin(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        base::float_cum_extreme(tensor, dim, "float_cummin", f32::INFINITY, |a, d| {
            a.cummin(d, false, true)
        })
    }

    fn float_cummax(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        base::float_cum_extreme(tensor, dim, "float_cummax", f32::NEG_INFINITY, |a, d| {
            a.cummax(d, false, true)
        })
    }

    fn float_cast(tensor: FloatTensor<Self>, dtype: FloatDType) -> FloatTensor<Self> {
        let target = float_mlx(dtype);
        if target == Dtype::Float64 && tensor.device == MlxDevice::Gpu {
            panic!("burn-mlx: {}", crate::tensor::f64_on_gpu("float_cast"));
        }
        cast(tensor, target)
    }

    unary_float! {
        float_exp => native::exp;
        float_log => |a| a.log();
        float_log1p => |a| a.log1p();
        float_sqrt => |a| a.sqrt();
        float_abs => |a| a.abs();
        float_cos => |a| a.cos();
        float_sin => |a| a.sin();
        float_tan => |a| ops::tan(a);
        float_cosh => |a| ops::cosh(a);
        float_sinh => |a| ops::sinh(a);
        float_tanh => native::tanh;
        float_acos => |a| ops::acos(a);
        float_acosh => |a| ops::acosh(a);
        float_asin => |a| ops::asin(a);
        float_asinh => |a| ops::asinh(a);
        float_atan => |a| ops::atan(a);
        float_atanh => |a| ops::atanh(a);
        float_round => |a| a.round(None);
        float_floor => |a| a.floor();
        float_ceil => |a| ops::ceil(a);
        float_trunc => |a| {
            let zero = Array::from_f32(0.0).as_dtype(a.dtype())?;
            ops::select(&a.lt(&zero)?, &ops::ceil(a)?, &a.floor()?)
        };
        float_erf => native::erf;
        // Burn's sign is 0 for ±0, else ±1 by the sign bit: a (positive) NaN gives 1, not NaN.
        float_sign => |a| {
            let one = Array::from_f32(1.0).as_dtype(a.dtype())?;
            ops::select(&ops::is_nan(a)?, &one, &ops::sign(a)?)
        };
    }

    fn float_atan2(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        binary(lhs, rhs, "float_atan2", |a, b| ops::atan2(a, b))
    }

    fn float_powf(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        binary(lhs, rhs, "float_powf", |a, b| a.power(b))
    }

    fn float_powf_scalar_impl(tensor: FloatTensor<Self>, value: Scalar) -> FloatTensor<Self> {
        with_scalar(tensor, value, "float_powf_scalar", |a, b| a.power(b))
    }

    fn float_powf_scalar(tensor: FloatTensor<Self>, value: Scalar) -> FloatTensor<Self> {
        let v = scalar_f64(value);
        if v == 1.0 {
            // pow(x, 1) is x for every x (NaN and infinities included). Autodiff's backward of
            // `powf_scalar(x, 2)` asks for it on every step; MLX's CPU `power` is a libm call.
            return tensor;
        }
        if v == 2.0 {
            return unary(tensor, "float_powf_scalar", |a| a.square());
        }
        if v == 0.5 {
            // pow(x, 0.5) is sqrt(x) except at -inf, where pow gives +inf.
            return unary(tensor, "float_powf_scalar", |a| {
                let inf = Array::from_f32(f32::INFINITY).as_dtype(a.dtype())?;
                ops::select(&a.eq(&inf.negative()?)?, &inf, &a.sqrt()?)
            });
        }
        Self::float_powf_scalar_impl(tensor, value)
    }

    fn float_powi(lhs: FloatTensor<Self>, rhs: IntTensor<Self>) -> FloatTensor<Self> {
        let dtype = lhs.array.dtype();
        let rhs = cast(rhs, dtype);
        binary(lhs, rhs, "float_powi", |a, b| a.power(b))
    }

    fn float_powi_scalar(lhs: FloatTensor<Self>, rhs: Scalar) -> FloatTensor<Self> {
        Self::float_powf_scalar(lhs, rhs)
    }

    fn float_powi_scalar_impl(lhs: FloatTensor<Self>, rhs: Scalar) -> FloatTensor<Self> {
        Self::float_powf_scalar_impl(lhs, rhs)
    }

    fn float_cat(tensors: Vec<FloatTensor<Self>>, dim: usize) -> FloatTensor<Self> {
        base::cat(tensors, dim)
    }

    fn float_argmax(tensor: FloatTensor<Self>, dim: usize, out: IntDType) -> IntTensor<Self> {
        base::argmax(tensor, dim, int_mlx(out))
    }

    fn float_argmin(tensor: FloatTensor<Self>, dim: usize, out: IntDType) -> IntTensor<Self> {
        base::argmin(tensor, dim, int_mlx(out))
    }

    fn float_argtopk(
        tensor: FloatTensor<Self>,
        dim: usize,
        k: usize,
        out: IntDType,
    ) -> IntTensor<Self> {
        base::argtopk(tensor, dim, k, int_mlx(out))
    }

    fn float_topk(tensor: FloatTensor<Self>, dim: usize, k: usize) -> FloatTensor<Self> {
        base::topk(tensor, dim, k)
    }

    fn float_max(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        base::max(tensor)
    }

    fn float_max_dim(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        base::max_dim(tensor, dim)
    }

    fn float_max_dim_with_indices(
        tensor: FloatTensor<Self>,
        dim: usize,
        out: IntDType,
    ) -> (FloatTensor<Self>, IntTensor<Self>) {
        base::max_dim_with_indices(tensor, dim, int_mlx(out))
    }

    fn float_min(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        base::min(tensor)
    }

    fn float_min_dim(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        base::min_dim(tensor, dim)
    }

    fn float_min_dim_with_indices(
        tensor: FloatTensor<Self>,
        dim: usize,
        out: IntDType,
    ) -> (FloatTensor<Self>, IntTensor<Self>) {
        base::min_dim_with_indices(tensor, dim, int_mlx(out))
    }

    fn float_max_abs(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        base::max(Self::float_abs(tensor))
    }

    fn float_max_abs_dim(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        base::max_dim(Self::float_abs(tensor), dim)
    }

    fn float_any(tensor: FloatTensor<Self>, _out: BoolDType) -> BoolTensor<Self> {
        base::any(tensor)
    }

    fn float_any_dim(tensor: FloatTensor<Self>, dim: usize, _out: BoolDType) -> BoolTensor<Self> {
        base::any_dim(tensor, dim)
    }

    fn float_all(tensor: FloatTensor<Self>, _out: BoolDType) -> BoolTensor<Self> {
        base::all(tensor)
    }

    fn float_all_dim(tensor: FloatTensor<Self>, dim: usize, _out: BoolDType) -> BoolTensor<Self> {
        base::all_dim(tensor, dim)
    }

    fn float_expand(tensor: FloatTensor<Self>, shape: Shape) -> FloatTensor<Self> {
        base::expand(tensor, shape)
    }

    fn float_sort(tensor: FloatTensor<Self>, dim: usize, descending: bool) -> FloatTensor<Self> {
        base::sort(tensor, dim, descending)
    }

    fn float_sort_with_indices(
        tensor: FloatTensor<Self>,
        dim: usize,
        descending: bool,
        out: IntDType,
    ) -> (FloatTensor<Self>, IntTensor<Self>) {
        base::sort_with_indices(tensor, dim, descending, int_mlx(out))
    }

    fn float_argsort(
        tensor: FloatTensor<Self>,
        dim: usize,
        descending: bool,
        out: IntDType,
    ) -> IntTensor<Self> {
        base::argsort(tensor, dim, descending, int_mlx(out))
    }

    fn float_unfold(
        tensor: FloatTensor<Self>,
        dim: usize,
        size: usize,
        step: usize,
    ) -> FloatTensor<Self> {
        base::unfold(tensor, dim, size, step)
    }

    fn float_is_nan(tensor: FloatTensor<Self>, _out: BoolDType) -> BoolTensor<Self> {
        unary(tensor, "float_is_nan", |a| ops::is_nan(a))
    }

    fn float_is_inf(tensor: FloatTensor<Self>, _out: BoolDType) -> BoolTensor<Self> {
        unary(tensor, "float_is_inf", |a| ops::is_inf(a))
    }
}
