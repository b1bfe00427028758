//! The low-level [`MlxTensor`] API: MLX's lazy arrays without Burn's tensor layer.
//!
//! It comes in two forms over the same MLX array.
//!
//! **The dynamic form**, `MlxTensor` (short for `MlxTensor<Dynamic>`), is the tensor Burn itself
//! uses: its element type is the array's dtype, known at run time. Every op returns a new lazy
//! tensor wrapped in `Result<MlxTensor, MlxError>`. The [`MlxOps`] trait is implemented both for
//! tensors and for those results, so chains read naturally and the first error travels to the end
//! of the chain:
//!
//! ```
//! use burn_mlx::{MlxDevice, MlxOps, MlxTensor};
//!
//! # fn main() -> Result<(), burn_mlx::MlxError> {
//! let device = MlxDevice::Cpu;
//! let a = MlxTensor::ones::<f32>(&[64, 64], device)?;
//! let b = MlxTensor::random_uniform(&[64, 64], 0.0, 1.0, device)?;
//! let c = a.matmul(&b).relu().softmax().eval()?;
//! let values: Vec<f32> = c.to_vec()?;
//! assert_eq!(values.len(), 64 * 64);
//! # Ok(()) }
//! ```
//!
//! **The typed form**, `MlxTensor<E>` for an [`MlxElement`] `E` such as `f32`, is the form of the
//! earlier burn-mlx crate (0.1), whose `MlxTensor<E>` was generic over its element type. Code
//! written for it compiles as it was, with [`MlxTyped`] in scope (it is in
//! [`prelude`](crate::prelude)). Its ops take `&self` and return the tensor itself, as Burn's
//! `Tensor` does; only evaluation and reads return a `Result`:
//!
//! ```
//! use burn_mlx::prelude::*;
//!
//! let device = MlxDevice::Cpu;
//! let a = MlxTensor::<f32>::ones(&[64, 64], device);
//! let b = MlxTensor::<f32>::ones(&[64, 64], device);
//! let c = a.matmul(&b); // every entry is 64
//! let d = c.relu();
//! let e = d.softmax(); // a row of equal values: each 1/64
//! e.eval().expect("evaluation failed");
//! let values = e.to_vec().unwrap();
//! assert!(values.iter().all(|&v| (v - 1.0 / 64.0).abs() < 1e-6));
//! ```
//!
//! Typed ops are thin wrappers over the dynamic ones and do not fail silently: on an error (shapes
//! that do not fit, [`MlxDevice::Gpu`] where MLX has no GPU, an op whose MLX result is another
//! dtype than `E`) they panic with a message that names the op, the inputs' shapes, element types
//! and device, and what to do. Use the dynamic form where errors must be values.
//! [`MlxTensor::into_dynamic`] and [`MlxTensor::try_from_dynamic`] convert between the forms
//! without copying.
//!
//! **Why the type has a defaulted parameter**, `pub struct MlxTensor<E = Dynamic>`: Burn needs one
//! tensor type for every dtype (its backend primitive), and the old crate's users wrote
//! `MlxTensor::<f32>`. With the default, `MlxTensor` in type position still names the dynamic
//! tensor, so Burn's backend and every `impl MlxTensor` block are unchanged, and in expressions
//! `MlxTensor::from_array(..)` still finds its one definition (as `HashMap::new` does). The marker
//! is a `PhantomData<fn() -> E>`, so `Send` and `Sync` do not depend on `E`.
//!
//! Two rules follow from Rust's name lookup, which sees every inherent impl of `MlxTensor` when a
//! path leaves the parameter out:
//! - Names that both forms need with different signatures cannot both be inherent:
//!   `MlxTensor::ones::<f32>(..)` would then find two `ones` (error E0034). The dynamic
//!   constructors (`zeros`, `ones`, `full`, `from_slice`, `random_uniform`, `random_normal`) and
//!   `to_vec` stay inherent; the typed ones are the [`MlxTyped`] trait's, which a path through
//!   `MlxTensor::<f32>` reaches because the dynamic impl does not apply to `MlxTensor<f32>`.
//! - Methods that mean the same for both forms (`eval`, `dims`, `device`, `array`,
//!   `into_array`, `mlx_dtype`) are defined once for every `E`.
//!
//! Inherent typed methods such as `matmul` apply only to `MlxTensor<E: MlxElement>`, so a method
//! call on a dynamic tensor still reaches [`MlxOps`].

use crate::device::MlxDevice;
use crate::error::MlxError;
use crate::tensor::MlxTensor;
use crate::tensor::{to_i32_shape, Dynamic};
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
        self.map("exp", crate::native::exp)
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
        self.map("tanh", crate::native::tanh)
    }
    /// `max(x, 0)`.
    fn relu(self) -> Result<MlxTensor, MlxError> {
        self.map("relu", |a| {
            ops::maximum(a, Array::from_f32(0.0).as_dtype(a.dtype())?)
        })
    }
    /// The logistic sigmoid.
    fn sigmoid(self) -> Result<MlxTensor, MlxError> {
        self.map("sigmoid", crate::native::sigmoid)
    }
    /// Softmax over the last axis.
    fn softmax(self) -> Result<MlxTensor, MlxError> {
        self.map("softmax", |a| crate::native::softmax(a, -1))
    }
    /// Softmax over `axis`.
    fn softmax_axis(self, axis: i32) -> Result<MlxTensor, MlxError> {
        self.map("softmax", |a| crate::native::softmax(a, axis))
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

// ---------------------------------------------------------------------------------------------
// The typed form: `MlxTensor<E>`
// ---------------------------------------------------------------------------------------------

/// The Rust name of an element dtype, for messages.
fn elem_name(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Bool => "bool",
        Dtype::Uint8 => "u8",
        Dtype::Uint16 => "u16",
        Dtype::Uint32 => "u32",
        Dtype::Uint64 => "u64",
        Dtype::Int8 => "i8",
        Dtype::Int16 => "i16",
        Dtype::Int32 => "i32",
        Dtype::Int64 => "i64",
        Dtype::Float16 => "f16",
        Dtype::Bfloat16 => "bf16",
        Dtype::Float32 => "f32",
        Dtype::Float64 => "f64",
        Dtype::Complex64 => "complex64",
    }
}

/// Describes typed inputs for a panic message: `[64, 32] f32 on Cpu, [16, 64] f32 on Cpu`.
fn describe_typed<E>(inputs: &[&MlxTensor<E>]) -> String {
    inputs
        .iter()
        .map(|t| {
            format!(
                "{:?} {} on {:?}",
                t.dims(),
                elem_name(t.array.dtype()),
                t.device
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Turns the result of a dynamic op into a typed tensor, or panics with a message naming the op,
/// the inputs (built only on failure) and what to do.
#[track_caller]
fn typed<E: MlxElement>(
    op: &str,
    inputs: impl FnOnce() -> String,
    result: Result<MlxTensor, MlxError>,
) -> MlxTensor<E> {
    let e = elem_name(E::DTYPE);
    match result {
        Ok(t) if t.quant.is_none() && t.array.dtype() == E::DTYPE => t.retag(),
        Ok(t) => panic!(
            "burn-mlx: `MlxTensor::<{e}>::{op}` on {}: MLX computes {} values here, which a \
             MlxTensor<{e}> cannot hold. Cast the input first (for example `.cast::<f32>()`), \
             or use the dynamic MlxTensor (`into_dynamic()`), whose dtype follows MLX's.",
            inputs(),
            elem_name(t.array.dtype()),
        ),
        Err(err) => {
            let stop = if err.to_string().ends_with('.') {
                ""
            } else {
                "."
            };
            let device_hint = if matches!(err, MlxError::Device { .. }) {
                " (`MlxDevice::default()` is the GPU only where one is usable.)"
            } else {
                ""
            };
            panic!(
                "burn-mlx: `MlxTensor::<{e}>::{op}` failed on {}: {err}{stop}{device_hint} \
                 The typed MlxTensor<{e}> API panics on errors; the dynamic API returns them as \
                 MlxError values (`MlxTensor::ones::<{e}>(shape, device)?`, ops through \
                 `MlxOps`, `into_dynamic()` to convert).",
                inputs()
            )
        }
    }
}

/// The input of a typed constructor, for messages.
fn describe_new(shape: &[usize], device: MlxDevice) -> String {
    format!("shape {shape:?} on {device:?}")
}

/// The items of the typed `MlxTensor<E>` whose names the dynamic `MlxTensor` also has as
/// inherent items, with other signatures: the constructors and `to_vec`.
///
/// Why a trait: `MlxTensor` is one struct with a defaulted parameter, `MlxTensor<E = Dynamic>`,
/// so that `MlxTensor` in type position stays the dynamic tensor Burn uses while the earlier
/// crate's `MlxTensor::<f32>` names the typed one. A path that leaves the parameter out, such as
/// the dynamic API's `MlxTensor::ones::<f32>(..)`, is looked up in every inherent impl of the
/// struct; were the typed `ones` inherent too, it would find two (error E0034). The dynamic items
/// stay inherent, and inherent items come before trait items, so that path keeps meaning the
/// dynamic `ones`; `MlxTensor::<f32>::ones(..)` names a type the dynamic impl does not cover and
/// reaches this trait's. Bring it into scope with `use burn_mlx::prelude::*` or
/// `use burn_mlx::MlxTyped`. Items that mean the same in both forms (`eval`, `dims`, `device`,
/// `array`) are defined once for every element type; the typed ops (`matmul`, `relu`, …) are
/// inherent methods of `MlxTensor<E: MlxElement>` only, so method calls on a dynamic tensor
/// still reach [`MlxOps`].
///
/// Constructors panic on errors, like the typed ops.
///
/// ```
/// use burn_mlx::{MlxDevice, MlxTensor, MlxTyped};
///
/// let x = MlxTensor::<f32>::from_slice(&[1.0, -2.0, 3.0, -4.0], &[2, 2], MlxDevice::Cpu);
/// assert_eq!(x.relu().to_vec().unwrap(), vec![1.0, 0.0, 3.0, 0.0]);
/// assert_eq!(x.sum().to_vec().unwrap(), vec![-2.0]);
/// ```
pub trait MlxTyped: Sized {
    /// The element type.
    type Elem: MlxElement;

    /// A lazy tensor of zeros.
    fn zeros(shape: &[usize], device: MlxDevice) -> Self;

    /// A lazy tensor of ones.
    fn ones(shape: &[usize], device: MlxDevice) -> Self;

    /// A lazy tensor filled with `value`.
    fn full(shape: &[usize], value: Self::Elem, device: MlxDevice) -> Self;

    /// A tensor holding a copy of `data`, laid out row-major in `shape`.
    fn from_slice(data: &[Self::Elem], shape: &[usize], device: MlxDevice) -> Self;

    /// Uniform values in `[low, high)`, drawn in f32 and converted to the element type, which
    /// must be a float type. Reproducible after `Mlx::seed`.
    fn random_uniform(shape: &[usize], low: f32, high: f32, device: MlxDevice) -> Self;

    /// Normally distributed values, drawn in f32 and converted to the element type, which must be
    /// a float type.
    fn random_normal(shape: &[usize], mean: f32, std: f32, device: MlxDevice) -> Self;

    /// Evaluates the tensor and copies its values out, row-major.
    fn to_vec(&self) -> Result<Vec<Self::Elem>, MlxError>;
}

impl<E: MlxElement> MlxTyped for MlxTensor<E> {
    type Elem = E;

    #[track_caller]
    fn zeros(shape: &[usize], device: MlxDevice) -> Self {
        typed(
            "zeros",
            || describe_new(shape, device),
            MlxTensor::zeros::<E>(shape, device),
        )
    }

    #[track_caller]
    fn ones(shape: &[usize], device: MlxDevice) -> Self {
        typed(
            "ones",
            || describe_new(shape, device),
            MlxTensor::ones::<E>(shape, device),
        )
    }

    #[track_caller]
    fn full(shape: &[usize], value: E, device: MlxDevice) -> Self {
        // One value made in `E` on the host, broadcast: `E` need not convert to f64.
        let result = shape_i32(shape, "full").and_then(|dims| {
            // (`MlxOps::map` by name: `Result` has a `map` of its own.)
            MlxOps::map(MlxTensor::from_slice(&[value], &[], device), "full", |a| {
                ops::broadcast_to(a, &dims)
            })
        });
        typed("full", || describe_new(shape, device), result)
    }

    #[track_caller]
    fn from_slice(data: &[E], shape: &[usize], device: MlxDevice) -> Self {
        typed(
            "from_slice",
            || format!("{} values, {}", data.len(), describe_new(shape, device)),
            MlxTensor::from_slice(data, shape, device),
        )
    }

    #[track_caller]
    fn random_uniform(shape: &[usize], low: f32, high: f32, device: MlxDevice) -> Self {
        let result = float_only::<E>("random_uniform")
            .and_then(|()| MlxTensor::random_uniform(shape, low, high, device))
            .cast::<E>();
        typed("random_uniform", || describe_new(shape, device), result)
    }

    #[track_caller]
    fn random_normal(shape: &[usize], mean: f32, std: f32, device: MlxDevice) -> Self {
        let result = float_only::<E>("random_normal")
            .and_then(|()| MlxTensor::random_normal(shape, mean, std, device))
            .cast::<E>();
        typed("random_normal", || describe_new(shape, device), result)
    }

    fn to_vec(&self) -> Result<Vec<E>, MlxError> {
        <MlxTensor>::to_vec::<E>(&self.to_dynamic())
    }
}

/// An error unless `E` is a float type (for the random constructors).
fn float_only<E: MlxElement>(op: &str) -> Result<(), MlxError> {
    match E::DTYPE {
        Dtype::Float32 | Dtype::Float64 | Dtype::Float16 | Dtype::Bfloat16 => Ok(()),
        other => Err(MlxError::Dtype {
            op: op.into(),
            dtype: elem_name(other).into(),
            hint: "random values are drawn for float element types: use f32, f64, f16 or bf16 \
                   and cast"
                .into(),
        }),
    }
}

/// The typed ops: each runs the dynamic op of the same name (see [`MlxOps`]) and panics on an
/// error, naming the op, the inputs and what to do.
impl<E: MlxElement> MlxTensor<E> {
    /// Checks that a dynamic tensor holds `E` values and takes it as a typed tensor (no copy).
    ///
    /// An `MlxError::Dtype` when its dtype is another one (cast it first with
    /// [`MlxOps::cast`]) or it is quantized.
    pub fn try_from_dynamic(tensor: MlxTensor) -> Result<Self, MlxError> {
        let dtype = tensor.array.dtype();
        if tensor.quant.is_some() || dtype != E::DTYPE {
            let what = if tensor.quant.is_some() {
                "quantized values".to_string()
            } else {
                elem_name(dtype).to_string()
            };
            return Err(MlxError::Dtype {
                op: "try_from_dynamic".into(),
                dtype: what,
                hint: format!(
                    "a MlxTensor<{e}> holds {e} values: cast the tensor first (`.cast::<{e}>()`)",
                    e = elem_name(E::DTYPE)
                ),
            });
        }
        Ok(tensor.retag())
    }

    /// The same tensor as a dynamic `MlxTensor`, for Burn and the Result-returning API (no copy).
    pub fn into_dynamic(self) -> MlxTensor {
        self.retag()
    }

    /// A dynamic `MlxTensor` sharing this tensor's array (no copy).
    pub fn to_dynamic(&self) -> MlxTensor {
        self.clone().retag()
    }

    /// The dimensions (the same as [`MlxTensor::dims`]).
    pub fn shape(&self) -> Vec<usize> {
        self.dims()
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        self.array.ndim()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.array.size()
    }

    #[track_caller]
    fn unary(&self, op: &str, result: Result<MlxTensor, MlxError>) -> Self {
        typed(op, || describe_typed(&[self]), result)
    }

    #[track_caller]
    fn binary(&self, other: &Self, op: &str, result: Result<MlxTensor, MlxError>) -> Self {
        typed(op, || describe_typed(&[self, other]), result)
    }

    /// Matrix product (batched over leading axes).
    #[track_caller]
    pub fn matmul(&self, other: &Self) -> Self {
        let r = MlxOps::matmul(self.to_dynamic(), &other.to_dynamic());
        self.binary(other, "matmul", r)
    }

    /// Elementwise sum, broadcasting.
    #[track_caller]
    pub fn add(&self, other: &Self) -> Self {
        let r = MlxOps::add(self.to_dynamic(), &other.to_dynamic());
        self.binary(other, "add", r)
    }

    /// Elementwise difference, broadcasting.
    #[track_caller]
    pub fn sub(&self, other: &Self) -> Self {
        let r = MlxOps::sub(self.to_dynamic(), &other.to_dynamic());
        self.binary(other, "sub", r)
    }

    /// Elementwise product, broadcasting.
    #[track_caller]
    pub fn mul(&self, other: &Self) -> Self {
        let r = MlxOps::mul(self.to_dynamic(), &other.to_dynamic());
        self.binary(other, "mul", r)
    }

    /// Elementwise quotient, broadcasting (MLX's integer division for integer types).
    #[track_caller]
    pub fn div(&self, other: &Self) -> Self {
        let r = MlxOps::div(self.to_dynamic(), &other.to_dynamic());
        self.binary(other, "div", r)
    }

    /// Multiplies every element by `value`.
    #[track_caller]
    pub fn scale(&self, value: f32) -> Self {
        self.unary("scale", MlxOps::scale(self.to_dynamic(), value))
    }

    /// `e^x` (float element types).
    #[track_caller]
    pub fn exp(&self) -> Self {
        self.unary("exp", MlxOps::exp(self.to_dynamic()))
    }

    /// Natural logarithm (float element types).
    #[track_caller]
    pub fn log(&self) -> Self {
        self.unary("log", MlxOps::log(self.to_dynamic()))
    }

    /// Square root (float element types).
    #[track_caller]
    pub fn sqrt(&self) -> Self {
        self.unary("sqrt", MlxOps::sqrt(self.to_dynamic()))
    }

    /// `tanh` (float element types).
    #[track_caller]
    pub fn tanh(&self) -> Self {
        self.unary("tanh", MlxOps::tanh(self.to_dynamic()))
    }

    /// `max(x, 0)`.
    #[track_caller]
    pub fn relu(&self) -> Self {
        self.unary("relu", MlxOps::relu(self.to_dynamic()))
    }

    /// The logistic sigmoid (float element types).
    #[track_caller]
    pub fn sigmoid(&self) -> Self {
        self.unary("sigmoid", MlxOps::sigmoid(self.to_dynamic()))
    }

    /// Softmax over the last axis (float element types).
    #[track_caller]
    pub fn softmax(&self) -> Self {
        self.unary("softmax", MlxOps::softmax(self.to_dynamic()))
    }

    /// Softmax over `axis` (negative counts from the end).
    #[track_caller]
    pub fn softmax_axis(&self, axis: i32) -> Self {
        self.unary(
            "softmax_axis",
            MlxOps::softmax_axis(self.to_dynamic(), axis),
        )
    }

    /// Sum of all elements (a 0-d tensor).
    #[track_caller]
    pub fn sum(&self) -> Self {
        self.unary("sum", MlxOps::sum(self.to_dynamic()))
    }

    /// Sum over `axis`, keeping it.
    #[track_caller]
    pub fn sum_axis(&self, axis: i32) -> Self {
        self.unary("sum_axis", MlxOps::sum_axis(self.to_dynamic(), axis))
    }

    /// Mean of all elements (a 0-d tensor; float element types).
    #[track_caller]
    pub fn mean(&self) -> Self {
        self.unary("mean", MlxOps::mean(self.to_dynamic()))
    }

    /// Maximum over `axis`, keeping it.
    #[track_caller]
    pub fn max_axis(&self, axis: i32) -> Self {
        self.unary("max_axis", MlxOps::max_axis(self.to_dynamic(), axis))
    }

    /// Reshapes (the element count must match).
    #[track_caller]
    pub fn reshape(&self, shape: &[usize]) -> Self {
        let r = MlxOps::reshape(self.to_dynamic(), shape);
        typed(
            "reshape",
            || format!("{} to {shape:?}", describe_typed(&[self])),
            r,
        )
    }

    /// Reverses the axis order.
    #[track_caller]
    pub fn transpose(&self) -> Self {
        self.unary("transpose", MlxOps::transpose(self.to_dynamic()))
    }

    /// Converts to another element type.
    #[track_caller]
    pub fn cast<T: MlxElement>(&self) -> MlxTensor<T> {
        typed(
            "cast",
            || describe_typed(&[self]),
            MlxOps::cast::<T>(self.to_dynamic()),
        )
    }
}

/// A typed tensor as the dynamic tensor Burn uses (no copy).
impl<E: MlxElement> From<MlxTensor<E>> for MlxTensor<Dynamic> {
    fn from(tensor: MlxTensor<E>) -> Self {
        tensor.into_dynamic()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    /// The message of the panic `f` raises (it must panic).
    fn panic_message<T>(f: impl FnOnce() -> T) -> String {
        let payload = match catch_unwind(AssertUnwindSafe(f)) {
            Ok(_) => panic!("expected a panic"),
            Err(p) => p,
        };
        if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else if let Some(s) = payload.downcast_ref::<&str>() {
            s.to_string()
        } else {
            String::from("<non-string panic>")
        }
    }

    #[test]
    fn typed_chain_matches_the_dynamic_one() {
        let device = MlxDevice::Cpu;
        let data: Vec<f32> = (0..12).map(|i| i as f32 * 0.25 - 1.0).collect();
        let a = MlxTensor::<f32>::from_slice(&data, &[3, 4], device);
        let b = a.transpose();
        let typed = a
            .matmul(&b)
            .add(&MlxTensor::<f32>::full(&[3, 3], 0.5, device))
            .relu()
            .softmax();
        let da = <MlxTensor>::from_slice(&data, &[3, 4], device).unwrap();
        let dynamic = (&da)
            .matmul(&da.clone().transpose().unwrap())
            .add(&MlxTensor::full::<f32>(&[3, 3], 0.5, device).unwrap())
            .relu()
            .softmax()
            .unwrap();
        assert_eq!(typed.shape(), vec![3, 3]);
        assert_eq!(typed.to_vec().unwrap(), dynamic.to_vec::<f32>().unwrap());
        // Each row of a softmax sums to 1.
        let rows = typed.sum_axis(-1).to_vec().unwrap();
        assert!(rows.iter().all(|&r| (r - 1.0).abs() < 1e-5), "{rows:?}");
    }

    #[test]
    fn typed_values_by_hand() {
        let device = MlxDevice::Cpu;
        let x = MlxTensor::<f32>::from_slice(&[1.0, 4.0, 9.0, 16.0], &[2, 2], device);
        assert_eq!(x.sqrt().to_vec().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(x.sub(&x).to_vec().unwrap(), vec![0.0; 4]);
        assert_eq!(x.div(&x).to_vec().unwrap(), vec![1.0; 4]);
        assert_eq!(x.mul(&x).sum().to_vec().unwrap(), vec![354.0]);
        assert_eq!(x.mean().to_vec().unwrap(), vec![7.5]);
        assert_eq!(x.max_axis(0).to_vec().unwrap(), vec![9.0, 16.0]);
        assert_eq!(x.scale(0.5).to_vec().unwrap(), vec![0.5, 2.0, 4.5, 8.0]);
        assert_eq!(x.reshape(&[4]).shape(), vec![4]);
        assert_eq!((x.ndim(), x.numel()), (2, 4));
        let i = x.cast::<i32>();
        assert_eq!(i.to_vec().unwrap(), vec![1, 4, 9, 16]);
        assert_eq!(i.sum().to_vec().unwrap(), vec![30]);
        let z = MlxTensor::<i64>::zeros(&[3], device);
        assert_eq!(z.to_vec().unwrap(), vec![0i64; 3]);
        let f = MlxTensor::<i64>::full(&[2], i64::MAX, device);
        assert_eq!(f.to_vec().unwrap(), vec![i64::MAX; 2]);
        let h = MlxTensor::<half::f16>::ones(&[2], device);
        assert_eq!(h.to_vec().unwrap(), vec![half::f16::ONE; 2]);
        let r = MlxTensor::<f32>::random_uniform(&[256], -1.0, 1.0, device);
        let v = r.to_vec().unwrap();
        assert!(v.iter().all(|&x| (-1.0..1.0).contains(&x)), "{v:?}");
        assert!(v.iter().any(|&x| x != v[0]));
        let n = MlxTensor::<half::bf16>::random_normal(&[8], 0.0, 1.0, device);
        assert_eq!(n.mlx_dtype(), Dtype::Bfloat16);
    }

    #[test]
    fn conversions_check_the_dtype() {
        let device = MlxDevice::Cpu;
        let d = MlxTensor::ones::<f32>(&[2], device).unwrap();
        let t = MlxTensor::<f32>::try_from_dynamic(d.clone()).unwrap();
        let back: MlxTensor = t.clone().into();
        assert_eq!(back.to_vec::<f32>().unwrap(), vec![1.0, 1.0]);
        assert_eq!(t.to_dynamic().dims(), vec![2]);
        let err = MlxTensor::<i32>::try_from_dynamic(d).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, MlxError::Dtype { .. }) && msg.contains("f32") && msg.contains("i32"),
            "{msg}"
        );
    }

    #[test]
    fn typed_errors_panic_naming_op_shapes_and_remedy() {
        let device = MlxDevice::Cpu;
        let a = MlxTensor::<f32>::ones(&[2, 3], device);
        let b = MlxTensor::<f32>::ones(&[4, 5], device);
        let msg = panic_message(|| a.matmul(&b));
        for part in [
            "matmul",
            "[2, 3] f32 on Cpu",
            "[4, 5] f32 on Cpu",
            "MlxError",
        ] {
            assert!(msg.contains(part), "missing {part:?} in: {msg}");
        }
        let msg = panic_message(|| MlxTensor::<f32>::from_slice(&[1.0, 2.0], &[3], device));
        assert!(msg.contains("from_slice") && msg.contains("[3]"), "{msg}");
        // MLX's exp of an int tensor is a float tensor, which a MlxTensor<i32> cannot hold.
        let i = MlxTensor::<i32>::ones(&[2], device);
        let msg = panic_message(|| i.exp());
        for part in ["MlxTensor::<i32>::exp", "f32", "cast"] {
            assert!(msg.contains(part), "missing {part:?} in: {msg}");
        }
        let msg = panic_message(|| MlxTensor::<i32>::random_uniform(&[2], 0.0, 1.0, device));
        assert!(
            msg.contains("random_uniform") && msg.contains("float"),
            "{msg}"
        );
    }

    #[test]
    fn typed_gpu_without_gpu_panics_with_a_clear_message() {
        if MlxDevice::Gpu.is_available() {
            eprintln!("skipped: this MLX build has a usable GPU");
            return;
        }
        let msg = panic_message(|| MlxTensor::<f32>::ones(&[64, 64], MlxDevice::Gpu));
        for part in [
            "MlxTensor::<f32>::ones",
            "shape [64, 64] on Gpu",
            "not available",
            "MlxDevice::Cpu",
            "MlxDevice::default()",
        ] {
            assert!(msg.contains(part), "missing {part:?} in: {msg}");
        }
        // The dynamic API returns the same error as a value.
        let err = MlxTensor::ones::<f32>(&[64, 64], MlxDevice::Gpu).unwrap_err();
        assert!(matches!(err, MlxError::Device { .. }), "{err}");
    }
}
