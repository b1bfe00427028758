//! [`MlxTensor`]: the tensor primitive of the [`Mlx`](crate::Mlx) backend, and the helpers the
//! op files share.

use crate::device::MlxDevice;
use crate::dtype::{from_mlx, to_mlx};
use crate::error::MlxError;
use burn_backend::quantization::QuantScheme;
use burn_backend::{DType, QTensorPrimitive, Scalar, Shape, TensorData, TensorMetadata};
use mlx_rs::{Array, Dtype};
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard};

/// A lazily evaluated MLX array, used by Burn for float, int, bool and quantized tensors.
///
/// Operations only build MLX's graph; the values are computed when data leaves MLX (`to_vec`,
/// `into_data`), on [`MlxTensor::eval`], or when Burn needs a shape that depends on the data.
///
/// The type comes in two forms over the same array:
/// - `MlxTensor`, that is `MlxTensor<`[`Dynamic`]`>`, is Burn's tensor primitive. Its element
///   type is the array's dtype, known at run time, and its ops return `Result`s (see
///   [`MlxOps`](crate::MlxOps)).
/// - `MlxTensor<E>` for an [`MlxElement`](crate::MlxElement) `E` such as `f32` is typed, as the
///   earlier burn-mlx crate's `MlxTensor<E>` was, and code written for that crate compiles
///   once [`MlxTyped`](crate::MlxTyped) is in scope (it is in the prelude). Its ops return the
///   tensor and panic on errors, with a message naming the op, shapes, element types and
///   device, as Burn's `Tensor` does; evaluation and reads return `Result`s.
///
/// ```
/// use burn_mlx::prelude::*;
///
/// let device = MlxDevice::Cpu;
/// let a = MlxTensor::<f32>::ones(&[64, 64], device);
/// let b = MlxTensor::<f32>::ones(&[64, 64], device);
/// let c = a.matmul(&b);
/// let d = c.relu();
/// let e = d.softmax();
/// e.eval().expect("evaluation failed");
/// assert!(e.to_vec().unwrap().iter().all(|&v| (v - 1.0 / 64.0).abs() < 1e-6));
///
/// // The same values in the dynamic, Result-returning form, and back.
/// let dynamic: MlxTensor = e.into_dynamic();
/// let total = (&dynamic).sum()?.to_vec::<f32>()?;
/// assert!((total[0] - 64.0).abs() < 1e-3);
/// let typed = MlxTensor::<f32>::try_from_dynamic(dynamic)?;
/// assert_eq!(typed.shape(), vec![64, 64]);
/// # Ok::<(), MlxError>(())
/// ```
///
/// Why one type with a defaulted parameter, and why the typed constructors are trait items: see
/// [`MlxTyped`](crate::MlxTyped).
pub struct MlxTensor<E = Dynamic> {
    pub(crate) array: Array,
    pub(crate) device: MlxDevice,
    pub(crate) quant: Option<Arc<QuantParams>>,
    /// The element type (`Dynamic`: the array's own). `fn() -> E` keeps `Send`/`Sync` and
    /// auto traits independent of `E`.
    pub(crate) elem: PhantomData<fn() -> E>,
}

/// The element-type parameter of the dynamic [`MlxTensor`]: the element type is the MLX array's
/// own dtype, known only at run time. `MlxTensor` without a parameter means
/// `MlxTensor<Dynamic>`.
///
/// It has no values; it only marks the type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dynamic {}

impl<E> Clone for MlxTensor<E> {
    fn clone(&self) -> Self {
        Self {
            array: self.array.clone(),
            device: self.device,
            quant: self.quant.clone(),
            elem: PhantomData,
        }
    }
}

/// What a quantized tensor carries besides its quantized values.
#[derive(Debug)]
pub(crate) struct QuantParams {
    /// Burn's description of the quantization.
    pub scheme: QuantScheme,
    /// The f32 scales, as Burn gives them (a zero scale is read as 0.1 when values are computed,
    /// as burn-ndarray does). Without `per_element`: one value per tensor (shape `[1]`), or one
    /// per block (shape `[num_blocks]`), blocks being consecutive runs of `block_size` elements
    /// in the row-major order of the tensor's logical shape.
    pub scales: Array,
    /// Set once a layout op (permute, slice, select, flip, expand, gather…) has moved the values
    /// of a block-quantized tensor out of their blocks: `scales` then has the tensor's own shape
    /// and holds each value's scale (see `src/ops/qtensor.rs`).
    pub per_element: bool,
}

// SAFETY: `Sync` holds because an `MlxTensor`, whatever its element-type marker `E` (a
// `PhantomData<fn() -> E>` that holds no value and is itself `Send + Sync`), owns a reference-counted handle to an immutable
// MLX array node (mlx-rs already declares `Array: Send`). Shared access only reads the node's shape
// and dtype, which never change, or clones the handle (an atomic reference count), or builds new
// graph nodes that point at it. The one mutation MLX performs on a node is evaluation, which fills
// in its data and detaches its inputs; burn-mlx performs every evaluation and every data read while
// holding `EVAL_LOCK` (see `MlxTensor::eval` and `into_data`), so two threads never evaluate
// concurrently. The multi-threaded stress test in tests/threads.rs exercises this.
unsafe impl<E> Sync for MlxTensor<E> {}

// SAFETY: the same argument as for `MlxTensor`: the scales array is immutable once built, and
// evaluating it happens under `EVAL_LOCK`.
unsafe impl Sync for QuantParams {}

/// Serializes MLX graph evaluation and data reads across threads (see the `Sync` argument above).
static EVAL_LOCK: Mutex<()> = Mutex::new(());

pub(crate) fn eval_lock() -> MutexGuard<'static, ()> {
    crate::native::thread_init();
    EVAL_LOCK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<E> fmt::Debug for MlxTensor<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MlxTensor")
            .field("shape", &self.array.shape())
            .field("dtype", &self.array.dtype())
            .field("device", &self.device)
            .field("quantized", &self.quant.is_some())
            .finish()
    }
}

impl TensorMetadata for MlxTensor {
    fn dtype(&self) -> DType {
        match &self.quant {
            Some(q) => DType::QFloat(q.scheme),
            None => from_mlx(self.array.dtype()),
        }
    }

    fn shape(&self) -> Shape {
        Shape::from(self.dims())
    }

    fn rank(&self) -> usize {
        self.array.ndim()
    }
}

impl QTensorPrimitive for MlxTensor {
    fn scheme(&self) -> &QuantScheme {
        static DEFAULT: std::sync::OnceLock<QuantScheme> = std::sync::OnceLock::new();
        match &self.quant {
            Some(q) => &q.scheme,
            None => DEFAULT.get_or_init(QuantScheme::default),
        }
    }
}

/// What dynamic and typed tensors share: the array, device, shape and evaluation. These are
/// defined once for every element-type marker, so that paths such as `MlxTensor::eval(&t)` name
/// one function (a second `eval` in another impl would make such paths ambiguous).
impl<E> MlxTensor<E> {
    /// The wrapped MLX array.
    pub fn array(&self) -> &Array {
        &self.array
    }

    /// Unwraps the MLX array.
    pub fn into_array(self) -> Array {
        self.array
    }

    /// The device the tensor's ops run on.
    pub fn device(&self) -> MlxDevice {
        self.device
    }

    /// The dimensions, as Burn counts them.
    pub fn dims(&self) -> Vec<usize> {
        self.array.shape().iter().map(|&d| d as usize).collect()
    }

    /// The MLX dtype.
    pub fn mlx_dtype(&self) -> Dtype {
        self.array.dtype()
    }

    /// Computes the pending graph of this tensor.
    pub fn eval(&self) -> Result<(), MlxError> {
        crate::trace::check_not_tracing("eval")?;
        let _guard = eval_lock();
        crate::compile::auto::eval("eval", &[&self.array], true)?;
        self.device.after_eval();
        Ok(())
    }

    /// Starts computing the pending graph of this tensor and returns without waiting (MLX's
    /// `async_eval`); a later read or [`eval`](Self::eval) waits only for what is not done.
    pub fn start_eval(&self) -> Result<(), MlxError> {
        crate::trace::check_not_tracing("start_eval")?;
        let _guard = eval_lock();
        crate::compile::auto::eval("start_eval", &[&self.array], false)?;
        self.device.after_eval();
        Ok(())
    }

    /// The same array with another element-type marker (no check: callers check the dtype).
    pub(crate) fn retag<F>(self) -> MlxTensor<F> {
        MlxTensor {
            array: self.array,
            device: self.device,
            quant: self.quant,
            elem: PhantomData,
        }
    }
}

impl MlxTensor {
    /// Wraps an MLX array that lives on `device`.
    ///
    /// # Panics
    ///
    /// On the CPU, when the array needs more bytes than the machine's memory and swap hold:
    /// MLX's CPU allocator does not report such a failure, and computing the array would crash.
    pub fn from_array(array: Array, device: MlxDevice) -> Self {
        if let Err(e) = check_alloc(&array, device, "allocate") {
            panic!("burn-mlx: {e}");
        }
        Self {
            array,
            device,
            quant: None,
            elem: PhantomData,
        }
    }

    /// A tensor with the same device whose array is `array`.
    pub(crate) fn with(&self, array: Array) -> Self {
        Self::from_array(array, self.device)
    }

    /// Builds a tensor from Burn's `TensorData` (the bytes are copied into MLX).
    pub fn from_data(data: TensorData, device: MlxDevice) -> Result<Self, MlxError> {
        device.check()?;
        let dtype = match data.dtype {
            DType::QFloat(_) => {
                return Err(MlxError::Dtype {
                    op: "from_data".into(),
                    dtype: format!("{:?}", data.dtype),
                    hint: "quantized data goes through `q_from_data`".into(),
                })
            }
            DType::Bool(burn_backend::BoolStore::U8) => Dtype::Uint8,
            DType::Bool(burn_backend::BoolStore::U32) => Dtype::Uint32,
            other => to_mlx(other),
        };
        if dtype == Dtype::Float64 && device == MlxDevice::Gpu {
            return Err(f64_on_gpu("from_data"));
        }
        let shape = to_i32_shape(data.shape.as_slice(), "from_data")?;
        let bytes = data.as_bytes();
        let array = if bytes.is_empty() {
            device
                .scope(|| mlx_rs::ops::zeros_dtype(&shape, dtype))
                .map_err(|e| MlxError::mlx("from_data", e))?
        } else {
            // SAFETY: `bytes` holds `prod(shape)` elements of `dtype` (TensorData's invariant),
            // and MLX copies them before this call returns.
            unsafe { Array::from_raw_data(bytes.as_ptr().cast(), &shape, dtype) }
        };
        let array = match data.dtype {
            DType::Bool(burn_backend::BoolStore::U8 | burn_backend::BoolStore::U32) => device
                .scope(|| array.as_dtype(Dtype::Bool))
                .map_err(|e| MlxError::mlx("from_data", e))?,
            _ => array,
        };
        Ok(Self::from_array(array, device))
    }

    /// Evaluates the tensor and copies its values into Burn's `TensorData`.
    pub fn to_data(&self) -> Result<TensorData, MlxError> {
        crate::trace::check_not_tracing("into_data")?;
        let dims = self.dims();
        let dtype = self.array.dtype();
        let burn_dtype = from_mlx(dtype);
        if self.array.size() == 0 {
            return Ok(TensorData::from_bytes_vec(Vec::new(), dims, burn_dtype));
        }
        crate::native::thread_init();
        check_alloc(&self.array, self.device, "into_data")?;
        let _guard = eval_lock();
        // The array itself is evaluated first, and read in place when it is row-major. A new op
        // (MLX's `contiguous`) would be ordered on the stream after everything started since,
        // so reading an array started with `start_eval` would also wait for the work queued
        // behind it, which is what a pipelined loop (start step n+1, then read step n) must
        // not do.
        crate::compile::auto::eval("into_data", &[&self.array], true)?;
        self.device.after_eval();
        let contiguous = if crate::native::is_row_contiguous(&self.array) {
            self.array.clone()
        } else {
            let copy = self
                .device
                .scope(|| self.array.contiguous())
                .map_err(|e| MlxError::mlx("into_data", e))?;
            crate::compile::auto::eval("into_data", &[&copy], true)?;
            self.device.after_eval();
            copy
        };
        let bytes = match dtype {
            Dtype::Bool => raw_bytes(contiguous.try_as_slice::<bool>()),
            Dtype::Uint8 => raw_bytes(contiguous.try_as_slice::<u8>()),
            Dtype::Uint16 => raw_bytes(contiguous.try_as_slice::<u16>()),
            Dtype::Uint32 => raw_bytes(contiguous.try_as_slice::<u32>()),
            Dtype::Uint64 => raw_bytes(contiguous.try_as_slice::<u64>()),
            Dtype::Int8 => raw_bytes(contiguous.try_as_slice::<i8>()),
            Dtype::Int16 => raw_bytes(contiguous.try_as_slice::<i16>()),
            Dtype::Int32 => raw_bytes(contiguous.try_as_slice::<i32>()),
            Dtype::Int64 => raw_bytes(contiguous.try_as_slice::<i64>()),
            Dtype::Float16 => raw_bytes(contiguous.try_as_slice::<half::f16>()),
            Dtype::Bfloat16 => raw_bytes(contiguous.try_as_slice::<half::bf16>()),
            Dtype::Float32 => raw_bytes(contiguous.try_as_slice::<f32>()),
            Dtype::Float64 => raw_bytes(contiguous.try_as_slice::<f64>()),
            Dtype::Complex64 => {
                return Err(MlxError::Dtype {
                    op: "into_data".into(),
                    dtype: "complex64".into(),
                    hint: "Burn has no complex dtype; take the real and imaginary parts".into(),
                })
            }
        }
        .map_err(|e| MlxError::mlx("into_data", e))?;
        Ok(TensorData::from_bytes_vec(bytes, dims, burn_dtype))
    }
}

/// Copies a typed slice into bytes.
fn raw_bytes<T: Copy, E>(slice: Result<&[T], E>) -> Result<Vec<u8>, E> {
    let slice = slice?;
    // SAFETY: any initialized `T: Copy` value is readable as bytes.
    let bytes = unsafe {
        std::slice::from_raw_parts(slice.as_ptr().cast::<u8>(), std::mem::size_of_val(slice))
    };
    Ok(bytes.to_vec())
}

/// Bytes of physical memory plus swap on this machine (Linux: `/proc/meminfo`), read once.
fn cpu_memory_bytes() -> Option<u64> {
    static BYTES: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        let info = std::fs::read_to_string("/proc/meminfo").ok()?;
        let kib = |key: &str| -> Option<u64> {
            let line = info.lines().find(|l| l.starts_with(key))?;
            line.split_whitespace().nth(1)?.parse().ok()
        };
        Some((kib("MemTotal:")? + kib("SwapTotal:").unwrap_or(0)) * 1024)
    })
}

/// Checks that a CPU array's buffer could fit in memory at all.
///
/// MLX's CPU allocator does not report a failed allocation: the kernel that fills the buffer
/// then writes through a null pointer and the process dies with SIGSEGV. A buffer larger than
/// the machine's RAM plus swap can never be allocated, so such arrays are refused when they are
/// built (the check reads only the shape and dtype, so ops stay lazy).
pub(crate) fn check_alloc(array: &Array, device: MlxDevice, op: &str) -> Result<(), MlxError> {
    if device != MlxDevice::Cpu {
        return Ok(());
    }
    let Some(limit) = cpu_memory_bytes() else {
        return Ok(());
    };
    let bytes = (array.size() as u128) * (array.item_size() as u128);
    if bytes > limit as u128 {
        return Err(MlxError::Memory {
            op: op.into(),
            shape: format!("{:?} {:?}", array.shape(), array.dtype()),
            bytes: bytes.min(u64::MAX as u128) as u64,
            available: limit,
        });
    }
    Ok(())
}

/// The error for f64 on a GPU, which MLX does not support there.
pub(crate) fn f64_on_gpu(op: &str) -> MlxError {
    MlxError::Dtype {
        op: op.into(),
        dtype: "f64".into(),
        hint: "MLX supports f64 only on the CPU: use MlxDevice::Cpu, or f32".into(),
    }
}

/// Converts Burn dimensions to MLX's `i32` dimensions.
pub(crate) fn to_i32_shape(dims: &[usize], op: &str) -> Result<Vec<i32>, MlxError> {
    dims.iter()
        .map(|&d| {
            i32::try_from(d).map_err(|_| MlxError::Shape {
                op: op.into(),
                shapes: format!("{dims:?} (MLX dimensions are limited to 2^31 - 1)"),
            })
        })
        .collect()
}

/// Describes arrays for error messages: `[2, 3] f32, [3] i64`.
pub(crate) fn describe(arrays: &[&Array]) -> String {
    arrays
        .iter()
        .map(|a| format!("{:?} {:?}", a.shape(), a.dtype()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Unwraps an MLX result inside an infallible Burn op, panicking with the op, shapes and dtypes.
pub(crate) trait OrPanic<T> {
    /// Panics with a message naming `op` and describing `inputs` when `self` is an error.
    fn or_panic(self, op: &str, inputs: &[&Array]) -> T;
}

impl<T, E: fmt::Display> OrPanic<T> for Result<T, E> {
    #[track_caller]
    fn or_panic(self, op: &str, inputs: &[&Array]) -> T {
        match self {
            Ok(v) => v,
            Err(e) => panic!(
                "burn-mlx: `{op}` failed for inputs [{}]: {e}",
                describe(inputs)
            ),
        }
    }
}

/// A 0-d MLX array holding `value` converted to `dtype`.
pub(crate) fn scalar_array(value: Scalar, dtype: Dtype) -> Array {
    crate::scalar_tape::capture(value, dtype, || constant_scalar_array(value, dtype))
}

/// A 0-d MLX array holding `value` converted to `dtype`, never replaced by a tape (see
/// [`crate::scalar_tape`]).
pub(crate) fn constant_scalar_array(value: Scalar, dtype: Dtype) -> Array {
    match dtype {
        Dtype::Bool => Array::from_bool(scalar_bool(value)),
        Dtype::Float64 => Array::from_slice_f64(&[scalar_f64(value)], &[]),
        Dtype::Float32 => Array::from_f32(scalar_f64(value) as f32),
        Dtype::Float16 => Array::from_slice(&[half::f16::from_f64(scalar_f64(value))], &[]),
        Dtype::Bfloat16 => Array::from_slice(&[half::bf16::from_f64(scalar_f64(value))], &[]),
        Dtype::Int64 => Array::from_slice(&[scalar_i64(value)], &[]),
        Dtype::Int32 => Array::from_int(scalar_i64(value) as i32),
        Dtype::Int16 => Array::from_slice(&[scalar_i64(value) as i16], &[]),
        Dtype::Int8 => Array::from_slice(&[scalar_i64(value) as i8], &[]),
        Dtype::Uint64 => Array::from_slice(&[scalar_u64(value)], &[]),
        Dtype::Uint32 => Array::from_slice(&[scalar_u64(value) as u32], &[]),
        Dtype::Uint16 => Array::from_slice(&[scalar_u64(value) as u16], &[]),
        Dtype::Uint8 => Array::from_slice(&[scalar_u64(value) as u8], &[]),
        Dtype::Complex64 => Array::from_f32(scalar_f64(value) as f32),
    }
}

/// The scalar as f64.
pub(crate) fn scalar_f64(value: Scalar) -> f64 {
    match value {
        Scalar::Float(v) => v,
        Scalar::Int(v) => v as f64,
        Scalar::UInt(v) => v as f64,
        Scalar::Bool(v) => v as u8 as f64,
    }
}

/// The scalar as i64 (floats truncate toward zero).
pub(crate) fn scalar_i64(value: Scalar) -> i64 {
    match value {
        Scalar::Float(v) => v as i64,
        Scalar::Int(v) => v,
        Scalar::UInt(v) => v as i64,
        Scalar::Bool(v) => v as i64,
    }
}

/// The scalar as u64 (negative values wrap, as a cast does).
pub(crate) fn scalar_u64(value: Scalar) -> u64 {
    match value {
        Scalar::Float(v) => v as u64,
        Scalar::Int(v) => v as u64,
        Scalar::UInt(v) => v,
        Scalar::Bool(v) => v as u64,
    }
}

/// The scalar as bool (non-zero is true).
pub(crate) fn scalar_bool(value: Scalar) -> bool {
    match value {
        Scalar::Float(v) => v != 0.0,
        Scalar::Int(v) => v != 0,
        Scalar::UInt(v) => v != 0,
        Scalar::Bool(v) => v,
    }
}
