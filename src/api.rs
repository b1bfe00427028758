//! The low-level [`MlxTensor`] API: MLX's lazy arrays without Burn's tensor layer.
//!
//! Every op returns a new lazy tensor wrapped in `Result<MlxTensor, MlxError>`. The [`MlxOps`]
//! trait is implemented both for tensors and for those results, so chains read naturally and the
//! first error travels to the end of the chain:
//!
//! ```no_run
//! use burn_mlx::{MlxDevice, MlxOps, MlxTensor};
//!
//! # fn main() -> Result<(), burn_mlx::MlxError> {
//! let device = MlxDevice::Cpu;
//! let a = MlxTensor::ones::<f32>(&[256, 256], device)?;
//! let b = MlxTensor::random_uniform(&[256, 256], 0.0, 1.0, device)?;
//! let c = a.matmul(&b).relu().softmax().eval()?;
//! let values: Vec<f32> = c.to_vec()?;
//! # Ok(()) }
//! ```

use crate::tensor::to_i32_shape;
use crate::{MlxDevice, MlxError, MlxTensor};
use mlx_rs::{ops, Array, Dtype};

/// Element types that MLX arrays can be built from and read into.
pub trait MlxElement: Copy + Send + Sync + 'static {
    /// The MLX dtype of this element type.
    const DTYPE: Dtype;
}

macro_rules! mlx_element {
    ($($t:ty => $d:ident),*) => {$(
        impl MlxElement for $t {
            const DTYPE: Dtype = Dtype::$d;
        }
    )*};
}

mlx_element!(
    f32 => Float32, f64 => Float64, half::f16 => Float16, half::bf16 => Bfloat16,
    i8 => Int8, i16 => Int16, i32 => Int32, i64 => Int64,
    u8 => Uint8, u16 => Uint16, u32 => Uint32, u64 => Uint64, bool => Bool
);

fn shape_i32(shape: &[usize], op: &str) -> Result<Vec<i32>, MlxError> {
    to_i32_shape(shape, op)
}

fn check_dtype(dtype: Dtype, device: MlxDevice, op: &str) -> Result<(), MlxError> {
    device.check()?;
    if dtype == Dtype::Float64 && device == MlxDevice::Gpu {
        return Err(crate::tensor::f64_on_gpu(op));
    }
    Ok(())
}

impl MlxTensor {
    /// A lazy tensor of zeros: `MlxTensor::zeros::<f32>(&[2, 3], device)`.
    pub fn zeros<T: MlxElement>(shape: &[usize], device: MlxDevice) -> Result<Self, MlxError> {
        check_dtype(T::DTYPE, device, "zeros")?;
        let dims = shape_i32(shape, "zeros")?;
        let a = device
            .scope(|| ops::zeros_dtype(&dims, T::DTYPE))
            .map_err(|e| MlxError::mlx("zeros", e))?;
        crate::tensor::check_alloc(&a, device, "zeros")?;
        Ok(Self::from_array(a, device))
    }

    /// A lazy tensor of ones.
    pub fn ones<T: MlxElement>(shape: &[usize], device: MlxDevice) -> Result<Self, MlxError> {
        Self::full::<T>(shape, 1.0, device)
    }

    /// A lazy tensor filled with `value` (converted to `T`).
    pub fn full<T: MlxElement>(
        shape: &[usize],
        value: f64,
        device: MlxDevice,
    ) -> Result<Self, MlxError> {
        check_dtype(T::DTYPE, device, "full")?;
        let dims = shape_i32(shape, "full")?;
        // The scalar is made in `T` on the host: a cast from f64 would be an op on the device,
        // and GPUs have no f64.
        let v = crate::tensor::scalar_array(burn_backend::Scalar::Float(value), T::DTYPE);
        let a = device
            .scope(|| ops::broadcast_to(&v, &dims))
            .map_err(|e| MlxError::mlx("full", e))?;
        crate::tensor::check_alloc(&a, device, "full")?;
        Ok(Self::from_array(a, device))
    }

    /// A tensor holding a copy of `data`, laid out row-major in `shape`.
    pub fn from_slice<T: MlxElement>(
        data: &[T],
        shape: &[usize],
        device: MlxDevice,
    ) -> Result<Self, MlxError> {
        check_dtype(T::DTYPE, device, "from_slice")?;
        let n: usize = shape.iter().product();
        if n != data.len() {
            return Err(MlxError::Shape {
                op: "from_slice".into(),
                shapes: format!("{} values for shape {shape:?} ({n} elements)", data.len()),
            });
        }
        let dims = shape_i32(shape, "from_slice")?;
        let a = if n == 0 {
            ops::zeros_dtype(&dims, T::DTYPE).map_err(|e| MlxError::mlx("from_slice", e))?
        } else {
            // SAFETY: `data` holds exactly `n` values of `T`, whose layout is MLX's `T::DTYPE`;
            // MLX copies them before returning.
            unsafe { Array::from_raw_data(data.as_ptr().cast(), &dims, T::DTYPE) }
        };
        Ok(Self::from_array(a, device))
    }

    /// Uniform f32 values in `[low, high)`, from a fresh key of the backend's random state
    /// (reproducible after `Mlx::seed`).
    pub fn random_uniform(
        shape: &[usize],
        low: f32,
        high: f32,
        device: MlxDevice,
    ) -> Result<Self, MlxError> {
        device.check()?;
        let shape = burn_backend::Shape::from(shape.to_vec());
        Ok(crate::ops::base::random(
            &shape,
            burn_backend::Distribution::Uniform(low as f64, high as f64),
            Dtype::Float32,
            &device,
        ))
    }

    /// Normally distributed f32 values.
    pub fn random_normal(
        shape: &[usize],
        mean: f32,
        std: f32,
        device: MlxDevice,
    ) -> Result<Self, MlxError> {
        device.check()?;
        let shape = burn_backend::Shape::from(shape.to_vec());
        Ok(crate::ops::base::random(
            &shape,
            burn_backend::Distribution::Normal(mean as f64, std as f64),
            Dtype::Float32,
            &device,
        ))
    }

    /// Evaluates the tensor and copies its values out, row-major.
    ///
    /// `T` must be the tensor's dtype (`MlxError::Dtype` otherwise; cast with [`MlxOps::cast`]).
    pub fn to_vec<T: MlxElement>(&self) -> Result<Vec<T>, MlxError> {
        if self.array.dtype() != T::DTYPE {
            return Err(MlxError::Dtype {
                op: "to_vec".into(),
                dtype: format!("{:?}", self.array.dtype()),
                hint: format!("the tensor is not {:?}: cast it first", T::DTYPE),
            });
        }
        let data = self.to_data()?;
        let bytes = data.as_bytes();
        let n = bytes.len() / std::mem::size_of::<T>();
        let mut out = Vec::<T>::with_capacity(n);
        // SAFETY: `bytes` holds `n` values of `T` (checked dtype), copied into fresh capacity.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                out.as_mut_ptr().cast::<u8>(),
                bytes.len(),
            );
            out.set_len(n);
        }
        Ok(out)
    }
}

/// Chainable lazy ops on [`MlxTensor`], also implemented for `Result<MlxTensor, MlxError>` so
/// that errors flow to the end of a chain.
pub trait MlxOps: Sized {
    /// The tensor, or the first error of the chain.
    fn tensor(self) -> Result<MlxTensor, MlxError>;

    /// Applies an mlx-rs function to the wrapped array.
    fn map(
        self,
        op: &str,
        f: impl FnOnce(&Array) -> Result<Array, mlx_rs::error::Exception>,
    ) -> Result<MlxTensor, MlxError> {
        let t = self.tensor()?;
        let out = t.device.scope(|| f(&t.array)).map_err(|e| {
            MlxError::mlx(
                op,
                format!("{e} (input {})", crate::tensor::describe(&[&t.array])),
            )
        })?;
        crate::tensor::check_alloc(&out, t.device, op)?;
        Ok(t.with(out))
    }

    /// Applies a binary mlx-rs function with `other`.
    fn zip(
        self,
        other: &MlxTensor,
        op: &str,
        f: impl FnOnce(&Array, &Array) -> Result<Array, mlx_rs::error::Exception>,
    ) -> Result<MlxTensor, MlxError> {
        let t = self.tensor()?;
        let out = t.device.scope(|| f(&t.array, &other.array)).map_err(|e| {
            MlxError::mlx(
                op,
                format!(
                    "{e} (inputs {})",
                    crate::tensor::describe(&[&t.array, &other.array])
                ),
            )
        })?;
        crate::tensor::check_alloc(&out, t.device, op)?;
        Ok(t.with(out))
    }

    /// Matrix product (batched over leading axes).
    fn matmul(self, other: &MlxTensor) -> Result<MlxTensor, MlxError> {
        self.zip(other, "matmul", |a, b| a.matmul(b))
    }
    /// Elementwise sum, broadcasting.
    fn add(self, other: &MlxTensor) -> Result<MlxTensor, MlxError> {
        self.zip(other, "add", |a, b| a.add(b))
    }
    /// Elementwise difference, broadcasting.
    fn sub(self, other: &MlxTensor) -> Result<MlxTensor, MlxError> {
        self.zip(other, "sub", |a, b| a.subtract(b))
    }
    /// Elementwise product, broadcasting.
    fn mul(self, other: &MlxTensor) -> Result<MlxTensor, MlxError> {
        self.zip(other, "mul", |a, b| a.multiply(b))
    }
    /// Elementwise quotient, broadcasting.
    fn div(self, other: &MlxTensor) -> Result<MlxTensor, MlxError> {
        self.zip(other, "div", |a, b| a.divide(b))
    }
    /// Multiplies every element by `value`.
    fn scale(self, value: f32) -> Result<MlxTensor, MlxError> {
        self.map("scale", |a| {
            a.multiply(Array::from_f32(value).as_dtype(a.dtype())?)
        })
    }
    /// `e^x`.
    fn exp(self) -> Result<MlxTensor, MlxError> {
        self.map("exp", |a| a.exp())
    }
    /// Natural logarithm.
    fn log(self) -> Result<MlxTensor, MlxError> {
        self.map("log", |a| a.log())
    }
    /// Square root.
    fn sqrt(self) -> Result<MlxTensor, MlxError> {
        self.map("sqrt", |a| a.sqrt())
    }
    /// `tanh`.
    fn tanh(self) -> Result<MlxTensor, MlxError> {
        self.map("tanh", |a| ops::tanh(a))
    }
    /// `max(x, 0)`.
    fn relu(self) -> Result<MlxTensor, MlxError> {
        self.map("relu", |a| {
            ops::maximum(a, Array::from_f32(0.0).as_dtype(a.dtype())?)
        })
    }
    /// The logistic sigmoid.
    fn sigmoid(self) -> Result<MlxTensor, MlxError> {
        self.map("sigmoid", |a| ops::sigmoid(a))
    }
    /// Softmax over the last axis.
    fn softmax(self) -> Result<MlxTensor, MlxError> {
        self.map("softmax", |a| ops::softmax_axis(a, -1, true))
    }
    /// Softmax over `axis`.
    fn softmax_axis(self, axis: i32) -> Result<MlxTensor, MlxError> {
        self.map("softmax", |a| ops::softmax_axis(a, axis, true))
    }
    /// Sum of all elements (a 0-d tensor).
    fn sum(self) -> Result<MlxTensor, MlxError> {
        self.map("sum", |a| a.sum(None))
    }
    /// Sum over `axis`, keeping it.
    fn sum_axis(self, axis: i32) -> Result<MlxTensor, MlxError> {
        self.map("sum_axis", |a| a.sum_axis(axis, true))
    }
    /// Mean of all elements (a 0-d tensor).
    fn mean(self) -> Result<MlxTensor, MlxError> {
        self.map("mean", |a| a.mean(None))
    }
    /// Maximum over `axis`, keeping it.
    fn max_axis(self, axis: i32) -> Result<MlxTensor, MlxError> {
        self.map("max_axis", |a| a.max_axis(axis, true))
    }
    /// Reshapes (the element count must match).
    fn reshape(self, shape: &[usize]) -> Result<MlxTensor, MlxError> {
        let dims = shape_i32(shape, "reshape")?;
        self.map("reshape", |a| a.reshape(&dims))
    }
    /// Reverses the axis order.
    fn transpose(self) -> Result<MlxTensor, MlxError> {
        self.map("transpose", |a| a.transpose())
    }
    /// Converts to another element type.
    fn cast<T: MlxElement>(self) -> Result<MlxTensor, MlxError> {
        self.map("cast", |a| a.as_dtype(T::DTYPE))
    }
    /// Computes the pending graph, returning the tensor.
    fn eval(self) -> Result<MlxTensor, MlxError> {
        let t = self.tensor()?;
        MlxTensor::eval(&t)?;
        Ok(t)
    }
}

impl MlxOps for MlxTensor {
    fn tensor(self) -> Result<MlxTensor, MlxError> {
        Ok(self)
    }
}

impl MlxOps for &MlxTensor {
    fn tensor(self) -> Result<MlxTensor, MlxError> {
        Ok(self.clone())
    }
}

impl MlxOps for Result<MlxTensor, MlxError> {
    fn tensor(self) -> Result<MlxTensor, MlxError> {
        self
    }
}
