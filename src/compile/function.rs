//! MLX compilation of functions over tensors, by hand ([`compile`], [`compile_float`]).
//!
//! MLX's `compile` traces a function once per input signature (shapes and dtypes), simplifies the
//! traced graph and fuses runs of elementwise ops into single kernels; later calls with the same
//! signature replay that graph. burn-mlx's ops are already lazy, so an uncompiled chain of `n`
//! elementwise ops still becomes one MLX graph, but one with `n` kernels and `n - 1` intermediate
//! arrays. Compiling removes the intermediates and the per-op dispatch, which pays for long
//! elementwise chains (activations, normalisation arithmetic, optimizer updates) that run many
//! times with the same shapes.
//!
//! These functions compile one function by hand, on any device. Graphs that Burn code builds
//! again and again (a training step) are also compiled without asking, on the GPU: see
//! [`auto`](super::auto).
//!
//! Rules for the compiled function, checked where they can be:
//! - it must be a pure function of its inputs: tensors it captures are baked into the trace as
//!   constants (of the values they have at the first call), and side effects run only while
//!   tracing;
//! - it must not read values: `eval`, `to_data`, `into_data` or `to_vec` inside it fail with a
//!   clear error (MLX cannot evaluate while tracing);
//! - all inputs lie on one device; the outputs are on that device;
//! - Burn's `Autodiff<Mlx>` tensors cannot be traced (their backward graph lives in Burn, not in
//!   MLX): compile the inner `Mlx` computation only.
//!
//! On the CPU, MLX builds its fused kernels with the system's `g++` at run time; without one,
//! MLX runs the traced graph unfused (still correct). On Metal and CUDA, MLX generates GPU
//! kernels itself.

use crate::backend::Mlx;
use crate::device::MlxDevice;
use crate::error::MlxError;
use crate::tensor::MlxTensor;
use crate::trace::{check_not_tracing, TraceGuard};
use burn_tensor::{Tensor, TensorPrimitive};
use mlx_rs::error::Exception;
use mlx_rs::Array;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

type ArrayFn = Box<dyn for<'a> FnMut(&'a [Array]) -> Result<Vec<Array>, Exception>>;

/// A function over [`MlxTensor`]s compiled by MLX (see [`compile`]).
///
/// Not `Send`: a compiled function belongs to the thread that made it.
pub struct Compiled {
    call: ArrayFn,
    /// The device of the current call's inputs, read by the traced function.
    device: Rc<Cell<MlxDevice>>,
    /// The error the user's function returned during the last trace, given back intact.
    failure: Rc<RefCell<Option<MlxError>>>,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled").finish_non_exhaustive()
    }
}

/// Compiles `f` with MLX: the first call with a given input signature traces `f` and fuses its
/// graph; later calls replay it.
///
/// With `shapeless` set, one trace serves inputs of every shape with the same dtypes and rank
/// (only valid when `f`'s graph does not depend on shapes: no reshapes to fixed sizes, no
/// shape-dependent broadcasting).
///
/// ```no_run
/// use burn_mlx::{compile, MlxDevice, MlxOps, MlxTensor};
///
/// let gelu_like = compile(
///     |x: &[MlxTensor]| Ok(vec![(&x[0]).mul(&(&x[0]).sigmoid().scale(1.702)?)?]),
///     false,
/// );
/// # let _ = gelu_like;
/// ```
pub fn compile<F>(mut f: F, shapeless: bool) -> Compiled
where
    F: FnMut(&[MlxTensor]) -> Result<Vec<MlxTensor>, MlxError> + 'static,
{
    crate::native::thread_init();
    let device = Rc::new(Cell::new(MlxDevice::default()));
    let failure: Rc<RefCell<Option<MlxError>>> = Rc::new(RefCell::new(None));
    let (dev, fail) = (device.clone(), failure.clone());
    let traced = move |arrays: &[Array]| -> Result<Vec<Array>, Exception> {
        let _tracing = TraceGuard::enter();
        let d = dev.get();
        let inputs: Vec<MlxTensor> = arrays
            .iter()
            .map(|a| MlxTensor::from_array(a.clone(), d))
            .collect();
        match f(&inputs) {
            Ok(outputs) => Ok(outputs.into_iter().map(MlxTensor::into_array).collect()),
            Err(e) => {
                let message = e.to_string();
                *fail.borrow_mut() = Some(e);
                Err(Exception::custom(message))
            }
        }
    };
    let mut compiled = mlx_rs::transforms::compile::compile(traced, shapeless);
    Compiled {
        call: Box::new(move |args: &[Array]| compiled(args)),
        device,
        failure,
    }
}

impl Compiled {
    /// Runs the compiled function (tracing it first for a new input signature). The outputs are
    /// lazy, like every other op's.
    pub fn call(&mut self, inputs: &[MlxTensor]) -> Result<Vec<MlxTensor>, MlxError> {
        check_not_tracing("compiled call")?;
        let device = match inputs.first() {
            Some(t) => t.device,
            None => MlxDevice::default(),
        };
        if let Some(other) = inputs.iter().find(|t| t.device != device) {
            return Err(MlxError::Device {
                device: format!("{:?}", other.device),
                hint: format!(
                    "a compiled function takes inputs on one device; the first input is on \
                     {device:?}: move the others there"
                ),
            });
        }
        if let Some(q) = inputs.iter().position(|t| t.quant.is_some()) {
            return Err(MlxError::Dtype {
                op: "compiled call".into(),
                dtype: format!("quantized (input {q})"),
                hint: "dequantize the input before passing it to a compiled function".into(),
            });
        }
        device.check()?;
        self.device.set(device);
        self.failure.borrow_mut().take();
        let arrays: Vec<Array> = inputs.iter().map(|t| t.array.clone()).collect();
        let result = {
            // MLX's compile cache is process-wide: one thread compiles or replays at a time.
            let _guard = crate::tensor::eval_lock();
            device.scope(|| (self.call)(&arrays))
        };
        match result {
            Ok(outputs) => Ok(outputs
                .into_iter()
                .map(|a| MlxTensor::from_array(a, device))
                .collect()),
            Err(e) => Err(self
                .failure
                .borrow_mut()
                .take()
                .unwrap_or_else(|| MlxError::mlx("compiled call", e))),
        }
    }
}

/// A function over Burn `Mlx` float tensors of rank `D` compiled by MLX (see [`compile_float`]).
pub struct CompiledFloat<const D: usize> {
    inner: Compiled,
}

impl<const D: usize> std::fmt::Debug for CompiledFloat<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledFloat").finish_non_exhaustive()
    }
}

/// Compiles a function over Burn float tensors on [`Mlx`], for repeated elementwise chains
/// written with Burn's tensor API (see [`compile`] for the rules).
///
/// Burn's ops panic on errors; a panic while tracing reaches the caller of
/// [`CompiledFloat::call`].
///
/// ```no_run
/// use burn_mlx::{compile_float, Mlx, MlxDevice};
/// use burn_tensor::Tensor;
///
/// let mut swish = compile_float::<2, _>(|x| vec![x[0].clone() * burn_tensor::activation::sigmoid(x[0].clone())], false);
/// let x = Tensor::<Mlx, 2>::ones([4, 4], &MlxDevice::default());
/// let y = swish.call(vec![x]).unwrap().remove(0);
/// # let _ = y;
/// ```
pub fn compile_float<const D: usize, F>(mut f: F, shapeless: bool) -> CompiledFloat<D>
where
    F: FnMut(&[Tensor<Mlx, D>]) -> Vec<Tensor<Mlx, D>> + 'static,
{
    let inner = compile(
        move |inputs: &[MlxTensor]| {
            let tensors: Vec<Tensor<Mlx, D>> = inputs
                .iter()
                .map(|t| Tensor::from_primitive(TensorPrimitive::Float(t.clone())))
                .collect();
            Ok(f(&tensors)
                .into_iter()
                .map(|t| t.into_primitive().tensor())
                .collect())
        },
        shapeless,
    );
    CompiledFloat { inner }
}

impl<const D: usize> CompiledFloat<D> {
    /// Runs the compiled function on `inputs` (all of rank `D`, on one device).
    pub fn call(&mut self, inputs: Vec<Tensor<Mlx, D>>) -> Result<Vec<Tensor<Mlx, D>>, MlxError> {
        let prims: Vec<MlxTensor> = inputs
            .into_iter()
            .map(|t| t.into_primitive().tensor())
            .collect();
        Ok(self
            .inner
            .call(&prims)?
            .into_iter()
            .map(|t| Tensor::from_primitive(TensorPrimitive::Float(t)))
            .collect())
    }
}
