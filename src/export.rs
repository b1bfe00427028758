//! Ship a model to MLX: write a function of `Mlx` tensors, with the weights it uses, to an MLX
//! function file (`.mlxfn`), and run such a file from Rust.
//!
//! MLX's function files hold a traced graph and its constants. MLX Python
//! (`mx.import_function`), MLX C++ (`mlx::core::import_function`) and mlx-swift
//! (`importFunction(from:)`) run them without the code that built the graph, so a model trained with
//! `Autodiff<Mlx>` can be served from an app or a Python process that has no Burn in it.
//!
//! - [`export`] traces a closure over Burn tensors (a model's `forward`) for one or more example
//!   inputs and writes every trace to one file; [`export_function`] does the same over
//!   [`MlxTensor`]s.
//! - [`MlxFunction`] reads a file back and calls it with Burn tensors ([`MlxFunction::call`]) or
//!   [`MlxTensor`]s ([`MlxFunction::call_tensors`]).
//!
//! ```no_run
//! use burn_mlx::export::{export, ExportOptions, MlxFunction};
//! use burn_mlx::{Mlx, MlxDevice};
//! use burn_tensor::Tensor;
//!
//! let device = MlxDevice::Cpu;
//! let w = Tensor::<Mlx, 2>::ones([4, 3], &device);
//! let x = Tensor::<Mlx, 2>::ones([2, 4], &device);
//! // One trace for batch 2; `w` is captured, so it is stored in the file.
//! export("linear.mlxfn", [x.clone()], &ExportOptions::default(), |x: Tensor<Mlx, 2>| {
//!     x.matmul(w.clone())
//! })
//! .unwrap();
//! let f = MlxFunction::load("linear.mlxfn").unwrap();
//! let y: Tensor<Mlx, 2> = f.call(x).unwrap();
//! assert_eq!(y.dims(), [2, 3]);
//! ```
//!
//! What a traced function may do, and what the file holds:
//! - It runs once per example input while MLX records the graph. Tensors it captures (weights)
//!   are written as constants with the values they have then; Autodiff models export through
//!   their inner backend (`model.valid()`).
//! - It must not read values (`into_data`, `to_data`, `into_scalar`, evaluation): there are none
//!   while tracing, and the call fails with an error that says so. Control flow that depends on
//!   tensor values belongs outside the exported function.
//! - A trace is valid for its input shapes and dtypes. Give one example per input shape you want
//!   to serve (batch 1 and batch 32, say): MLX picks the trace that matches at call time.
//!   [`ExportOptions::shapeless`] lets one trace serve any shape of the same ranks, but only for
//!   graphs without shape-dependent ops; Burn's `reshape`, `flatten` and most layers record fixed
//!   shapes, so it is off by default.
//! - The device is part of the file: the primitives keep the stream (CPU or GPU) they were
//!   recorded on. Export on the GPU for a file that runs on the GPU; a CPU file runs on the CPU
//!   under every MLX build. burn-mlx's own CPU kernels are not used while exporting, so a file
//!   holds only MLX's primitives and loads in every MLX of the same version or newer.
//! - Ops that MLX cannot write to a file (its `compile`d graphs are expanded while tracing)
//!   fail the export with MLX's message naming the primitive.

use crate::backend::Mlx;
use crate::device::MlxDevice;
use crate::error::MlxError;
use crate::interop::{from_mlx, to_mlx};
use crate::native::export::{self as native, ImportedFunction};
use crate::tensor::MlxTensor;
use crate::trace::{check_not_tracing, ExportGuard};
use burn_tensor::{BasicOps, Tensor, TensorKind};
use mlx_rs::Array;
use std::cell::RefCell;
use std::path::{Path, PathBuf};

/// Options of [`export`] and [`export_function`].
#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    /// Let each trace serve inputs of any shape with the same ranks and dtypes (MLX's
    /// `shapeless`). Only correct for graphs without shape-dependent ops; off by default.
    pub shapeless: bool,
    /// A string stored in the file's header, read back by [`MlxFunction::metadata`] and by
    /// `mx.import_function(path, return_metadata=True)` in Python (a JSON description of the
    /// inputs, say).
    pub metadata: String,
}

/// One Burn tensor of [`Mlx`] as an input or output of an exported function: any rank, float,
/// int or bool.
pub trait MlxArg: Sized {
    /// The MLX tensor behind `self`.
    fn into_tensor(self) -> MlxTensor;
    /// `tensor` as `Self`, checking its rank and dtype; `what` names it in the error.
    fn from_tensor(tensor: MlxTensor, what: &str) -> Result<Self, MlxError>;
}

impl<const D: usize, K> MlxArg for Tensor<Mlx, D, K>
where
    K: TensorKind<Mlx> + BasicOps<Mlx>,
    K::Primitive: 'static,
{
    fn into_tensor(self) -> MlxTensor {
        match to_mlx(self) {
            Ok(t) => t,
            Err(_) => unreachable!("a Tensor<Mlx, _, _> holds an MLX tensor"),
        }
    }

    fn from_tensor(tensor: MlxTensor, what: &str) -> Result<Self, MlxError> {
        let shape = tensor.array.shape().to_vec();
        let dtype = tensor.array.dtype();
        let kind = K::name();
        let fits = match kind {
            "Float" => dtype.is_float(),
            "Bool" => dtype == mlx_rs::Dtype::Bool,
            _ => !dtype.is_float() && dtype != mlx_rs::Dtype::Bool,
        };
        if shape.len() != D || !fits {
            return Err(MlxError::Shape {
                op: "MlxFunction::call".into(),
                shapes: format!(
                    "{what} is {dtype:?} {shape:?}, asked for as Tensor<Mlx, {D}, {kind}>: give \
                     the output type the rank and kind the function returns"
                ),
            });
        }
        Ok(from_mlx(tensor).unwrap_or_else(|| unreachable!("the backend is Mlx")))
    }
}

/// The inputs or outputs of an exported function: one [`MlxArg`], a tuple of up to four, or a
/// `Vec` of one type.
pub trait MlxArgs: Sized {
    /// The MLX tensors, in order.
    fn into_tensors(self) -> Vec<MlxTensor>;
    /// `Self` from `tensors`, checking their number, ranks and dtypes; `what` names them
    /// ("input", "output") in the error.
    fn from_tensors(tensors: Vec<MlxTensor>, what: &str) -> Result<Self, MlxError>;
}

/// Fails unless `n` tensors were given where `expected` are needed.
fn check_count(what: &str, n: usize, expected: usize) -> Result<(), MlxError> {
    if n == expected {
        return Ok(());
    }
    Err(MlxError::Shape {
        op: "MlxFunction::call".into(),
        shapes: format!(
            "{n} {what}s where {expected} are expected: the Rust type has {expected} tensors"
        ),
    })
}

impl<const D: usize, K> MlxArgs for Tensor<Mlx, D, K>
where
    K: TensorKind<Mlx> + BasicOps<Mlx>,
    K::Primitive: 'static,
{
    fn into_tensors(self) -> Vec<MlxTensor> {
        vec![self.into_tensor()]
    }

    fn from_tensors(tensors: Vec<MlxTensor>, what: &str) -> Result<Self, MlxError> {
        check_count(what, tensors.len(), 1)?;
        let t = tensors.into_iter().next().expect("one tensor");
        Self::from_tensor(t, &format!("{what} 0"))
    }
}

impl<T: MlxArg> MlxArgs for Vec<T> {
    fn into_tensors(self) -> Vec<MlxTensor> {
        self.into_iter().map(MlxArg::into_tensor).collect()
    }

    fn from_tensors(tensors: Vec<MlxTensor>, what: &str) -> Result<Self, MlxError> {
        tensors
            .into_iter()
            .enumerate()
            .map(|(i, t)| T::from_tensor(t, &format!("{what} {i}")))
            .collect()
    }
}

macro_rules! tuple_args {
    ($n:expr; $($t:ident $i:tt),+) => {
        impl<$($t: MlxArg),+> MlxArgs for ($($t,)+) {
            fn into_tensors(self) -> Vec<MlxTensor> {
                vec![$(self.$i.into_tensor()),+]
            }

            fn from_tensors(tensors: Vec<MlxTensor>, what: &str) -> Result<Self, MlxError> {
                check_count(what, tensors.len(), $n)?;
                let mut it = tensors.into_iter();
                Ok(($($t::from_tensor(it.next().expect("counted"), &format!("{what} {}", $i))?,)+))
            }
        }
    };
}

tuple_args!(1; A 0);
tuple_args!(2; A 0, B 1);
tuple_args!(3; A 0, B 1, C 2);
tuple_args!(4; A 0, B 1, C 2, D 3);

/// The text of a panic payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Fails unless every tensor of every signature is an unquantized tensor on one device; returns
/// that device.
fn check_inputs(op: &str, signatures: &[&[MlxTensor]]) -> Result<MlxDevice, MlxError> {
    let device = signatures
        .iter()
        .flat_map(|s| s.iter())
        .next()
        .map(|t| t.device)
        .unwrap_or_default();
    for (s, inputs) in signatures.iter().copied().enumerate() {
        for (i, t) in inputs.iter().enumerate() {
            if t.device != device {
                return Err(MlxError::Device {
                    device: format!("{:?}", t.device),
                    hint: format!(
                        "`{op}`: input {i} of example {s} is on {:?}, the first input on \
                         {device:?}; put every input on one device",
                        t.device
                    ),
                });
            }
            if t.quant.is_some() {
                return Err(MlxError::Dtype {
                    op: op.into(),
                    dtype: format!("quantized (input {i} of example {s})"),
                    hint: "pass dequantized inputs; quantized weights inside the function are \
                           fine"
                        .into(),
                });
            }
        }
    }
    device.check()?;
    Ok(device)
}

/// Writes `f`, traced once for each input list of `examples`, to the MLX function file `path`
/// (see the [module docs](self) for what `f` may do).
///
/// The file is replaced if it exists, once the new one is complete: a failed export leaves an
/// earlier file as it was. Errors name the file: a failure of `f` (its error, or its panic
/// message), a value read inside `f`, an op MLX cannot write, a file that cannot be created.
pub fn export_function<F>(
    path: impl AsRef<Path>,
    examples: &[Vec<MlxTensor>],
    options: &ExportOptions,
    mut f: F,
) -> Result<(), MlxError>
where
    F: FnMut(&[MlxTensor]) -> Result<Vec<MlxTensor>, MlxError>,
{
    let path = path.as_ref();
    let file_error = |message: String| MlxError::File {
        op: "export".into(),
        path: path.display().to_string(),
        message,
    };
    check_not_tracing("export")?;
    if examples.is_empty() {
        return Err(file_error(
            "no example inputs: give at least one list of inputs to trace with".into(),
        ));
    }
    let lists: Vec<&[MlxTensor]> = examples.iter().map(Vec::as_slice).collect();
    // MLX traces with stand-in arrays of the examples' shapes and dtypes: their values are not
    // needed, so lazy examples stay lazy.
    let device = check_inputs("export", &lists)?;
    let failure: RefCell<Option<MlxError>> = RefCell::new(None);
    let mut traced = |arrays: Vec<Array>| -> Result<Vec<Array>, ()> {
        let _tracing = ExportGuard::enter();
        let inputs: Vec<MlxTensor> = arrays
            .into_iter()
            .map(|a| MlxTensor::from_array(a, device))
            .collect();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&inputs)));
        let error = match result {
            Ok(Ok(outputs)) => match outputs.iter().position(|t| t.quant.is_some()) {
                None => return Ok(outputs.into_iter().map(MlxTensor::into_array).collect()),
                Some(i) => MlxError::Dtype {
                    op: "export".into(),
                    dtype: format!("quantized (output {i})"),
                    hint: "dequantize the output inside the function".into(),
                },
            },
            Ok(Err(e)) => e,
            Err(panic) => MlxError::Mlx {
                op: "export".into(),
                message: format!(
                    "the function panicked while MLX traced it: {}",
                    panic_message(panic.as_ref())
                ),
            },
        };
        *failure.borrow_mut() = Some(error);
        Err(())
    };
    let arrays: Vec<Vec<Array>> = examples
        .iter()
        .map(|s| s.iter().map(|t| t.array.clone()).collect())
        .collect();
    // MLX writes beside the target, and the file is renamed into place once complete: a failed
    // export leaves no half-written file, and an earlier file of that name as it was.
    let name = path
        .file_name()
        .ok_or_else(|| file_error("not a file path".into()))?;
    let mut partial_name = std::ffi::OsString::from(".");
    partial_name.push(name);
    partial_name.push(".partial");
    let partial = path.with_file_name(partial_name);
    let written = {
        // The exporter evaluates constants; one thread evaluates at a time.
        let _guard = crate::tensor::eval_lock();
        device.scope(|| {
            native::export_function(
                &partial,
                &mut traced,
                &arrays,
                options.shapeless,
                &options.metadata,
            )
        })
    };
    match written {
        Ok(()) => std::fs::rename(&partial, path).map_err(|e| {
            let _ = std::fs::remove_file(&partial);
            file_error(format!(
                "cannot move the written file {} into place: {e}",
                partial.display()
            ))
        }),
        Err(message) => {
            let _ = std::fs::remove_file(&partial);
            match failure.into_inner() {
                Some(e) => Err(e),
                None if message.contains("Unable to serialize primitive") => {
                    Err(file_error(format!(
                        "{message}: MLX 0.32 cannot write this op to a function file (LU \
                         factorization, segmented matmuls and `contiguous` among others); \
                         compute it outside the exported function, or write it with other ops"
                    )))
                }
                None => Err(file_error(message)),
            }
        }
    }
}

/// Writes `f`, traced once for each of `examples`, to the MLX function file `path`: the Burn
/// tensor form of [`export_function`].
///
/// The inputs and outputs are Burn tensors of [`Mlx`] of any rank and kind: one tensor, a tuple
/// of up to four, or a `Vec` (see [`MlxArgs`]).
///
/// ```no_run
/// # use burn_mlx::export::{export, ExportOptions};
/// # use burn_mlx::{Mlx, MlxDevice};
/// # use burn_tensor::{Int, Tensor};
/// # let device = MlxDevice::Cpu;
/// let ids = Tensor::<Mlx, 2, Int>::zeros([1, 8], &device);
/// let mask = Tensor::<Mlx, 2, Int>::ones([1, 8], &device);
/// export("encoder.mlxfn", [(ids, mask)], &ExportOptions::default(), |(ids, mask)| {
///     // model.forward(ids, mask)
///     (ids * mask).float()
/// })
/// .unwrap();
/// ```
pub fn export<I, O, F>(
    path: impl AsRef<Path>,
    examples: impl IntoIterator<Item = I>,
    options: &ExportOptions,
    mut f: F,
) -> Result<(), MlxError>
where
    I: MlxArgs,
    O: MlxArgs,
    F: FnMut(I) -> O,
{
    let examples: Vec<Vec<MlxTensor>> = examples.into_iter().map(I::into_tensors).collect();
    export_function(path, &examples, options, |inputs| {
        let args = I::from_tensors(inputs.to_vec(), "input")?;
        Ok(f(args).into_tensors())
    })
}

/// A function read from an MLX function file, called with Burn tensors or [`MlxTensor`]s.
///
/// Files written by [`export`] and by MLX Python's `mx.export_function` alike. The outputs are
/// lazy, like every other op's; the weights are read from the file when first needed, so the
/// file must stay in place while the function is in use.
pub struct MlxFunction {
    inner: ImportedFunction,
    path: PathBuf,
}

impl std::fmt::Debug for MlxFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MlxFunction")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Checks that `path` starts as an MLX function file does: the MLX version that wrote it (a
/// length-prefixed string such as "0.32.2"), the number of traces, the `shapeless` flag.
fn check_header(path: &Path) -> Result<(), String> {
    use std::io::Read;
    let mut head = Vec::with_capacity(64);
    std::fs::File::open(path)
        .and_then(|f| f.take(64).read_to_end(&mut head))
        .map_err(|e| format!("cannot read the file: {e}"))?;
    let not_mlxfn = || {
        "not an MLX function file: it does not start with the MLX version that wrote it \
         (write one with burn_mlx::export::export or mx.export_function)"
            .to_string()
    };
    if head.len() < 8 {
        return Err(not_mlxfn());
    }
    let len = u64::from_le_bytes(head[..8].try_into().expect("8 bytes")) as usize;
    let version = match head.get(8..8 + len) {
        Some(v) if (1..=32).contains(&len) => v,
        _ => return Err(not_mlxfn()),
    };
    let plausible = version[0].is_ascii_digit()
        && version
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'+'));
    if !plausible {
        return Err(not_mlxfn());
    }
    let count = head
        .get(8 + len..12 + len)
        .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")));
    match count {
        Some(n) if n >= 1 => Ok(()),
        Some(_) => Err("the file holds no traced function".into()),
        None => Err("the file is truncated: it ends inside its header".into()),
    }
}

impl MlxFunction {
    /// Reads the MLX function file `path`.
    ///
    /// Fails naming the file if it is missing, is not an MLX function file, or is truncated or
    /// damaged.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, MlxError> {
        let path = path.as_ref();
        let file_error = |message: String| MlxError::File {
            op: "MlxFunction::load".into(),
            path: path.display().to_string(),
            message,
        };
        check_header(path).map_err(file_error)?;
        crate::native::thread_init();
        let inner = ImportedFunction::read(path).map_err(|m| {
            file_error(format!(
                "the file is truncated or damaged (MLX could not read it back: {m})"
            ))
        })?;
        Ok(MlxFunction {
            inner,
            path: path.to_path_buf(),
        })
    }

    /// The metadata string stored with the function ("" if none).
    pub fn metadata(&self) -> String {
        self.inner.metadata()
    }

    /// Calls the function with `inputs` (all on one device, which the outputs report as theirs).
    ///
    /// Fails if no trace in the file matches the inputs' number, shapes and dtypes; the error
    /// lists the signatures the file has.
    pub fn call_tensors(&self, inputs: &[MlxTensor]) -> Result<Vec<MlxTensor>, MlxError> {
        check_not_tracing("MlxFunction::call")?;
        let device = check_inputs("MlxFunction::call", &[inputs])?;
        let arrays: Vec<Array> = inputs.iter().map(|t| t.array.clone()).collect();
        // Building the graph reads the file's constants, which an evaluation on another thread
        // may be loading and detaching: one thread at a time, as for evaluation.
        let called = {
            let _guard = crate::tensor::eval_lock();
            self.inner.call(&arrays)
        };
        let outputs = called.map_err(|m| MlxError::File {
            op: "MlxFunction::call".into(),
            path: self.path.display().to_string(),
            message: m,
        })?;
        Ok(outputs
            .into_iter()
            .map(|a| MlxTensor::from_array(a, device))
            .collect())
    }

    /// Calls the function with Burn tensors, giving Burn tensors: `O` must have the number,
    /// ranks and kinds of the function's outputs.
    pub fn call<I: MlxArgs, O: MlxArgs>(&self, inputs: I) -> Result<O, MlxError> {
        let outputs = self.call_tensors(&inputs.into_tensors())?;
        O::from_tensors(outputs, "output")
    }
}

/// Where [`save_examples`] puts the reference of the function file `file` by convention:
/// `model.mlxfn` → `model.examples.safetensors`, beside it.
pub fn examples_path(file: impl AsRef<Path>) -> PathBuf {
    file.as_ref().with_extension("examples.safetensors")
}

/// Saves example inputs and the outputs they should give to the safetensors file `path`, as
/// `input.0`, `input.1`, … and `output.0`, …: the reference that a deployment of an exported
/// function is checked against (`scripts/check_mlxfn.py` runs the function in MLX Python on the
/// inputs and compares the outputs).
pub fn save_examples(
    path: impl AsRef<Path>,
    inputs: &[MlxTensor],
    outputs: &[MlxTensor],
) -> Result<(), MlxError> {
    let path = path.as_ref();
    let named = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("input.{i}"), t))
        .chain(
            outputs
                .iter()
                .enumerate()
                .map(|(i, t)| (format!("output.{i}"), t)),
        );
    let mut arrays = Vec::new();
    for (name, t) in named {
        if t.quant.is_some() {
            return Err(MlxError::Dtype {
                op: "save_examples".into(),
                dtype: format!("quantized ({name})"),
                hint: "dequantize it first".into(),
            });
        }
        arrays.push((name, t.array.clone()));
    }
    check_not_tracing("save_examples")?;
    // MLX evaluates the arrays as it writes them; one thread evaluates at a time.
    let _guard = crate::tensor::eval_lock();
    Array::save_safetensors(arrays, None, path).map_err(|e| MlxError::File {
        op: "save_examples".into(),
        path: path.display().to_string(),
        message: e.to_string(),
    })
}
