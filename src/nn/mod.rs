//! Training layers with fused kernels: burn-nn's [`TransformerEncoder`], [`MultiHeadAttention`],
//! [`LayerNorm`] and [`RmsNorm`], and a fused [`cross_entropy`](functional::cross_entropy), each
//! one MLX op forward and one backward on `Autodiff<Mlx>`; and [`start_step`], which lets a
//! training loop's host work overlap the device's.
//!
//! # Why
//!
//! Burn's autodiff records every tensor op of a layer, and decomposes layer norm, softmax and
//! attention: an encoder layer's step is hundreds of MLX primitives, and on a GPU each costs
//! microseconds of host time, which at small batch sizes is most of the step. These layers
//! register their own backward pass with burn-autodiff (its `Backward` trait, as Burn's book
//! shows for custom kernels): the forward pass is MLX's fast op (`fast::layer_norm`,
//! `fast::rms_norm`, `fast::scaled_dot_product_attention`: one primitive, a fused kernel where
//! the device has one) and the backward pass is MLX's vector-Jacobian product of the same
//! function, compiled by MLX so that its elementwise runs are fused kernels. (Under MLX's
//! autodiff a fast op differentiates its reference composition; MLX 0.32's CUDA backend also
//! runs attention fused only for a single query position, so training attention is composed on
//! CUDA either way.) With `optim::Adam`, a 2-layer encoder's overlapped step at batch 128 goes
//! from 1,306 MLX primitives (burn-nn's layers, burn-optim's Adam) to 231 (BENCHMARKS.md,
//! "Training steps at real batch sizes", 2026-11-28).
//!
//! # Drop-in
//!
//! Each layer has burn-nn's fields, config (same fields and defaults) and record, so a model
//! switches with an import, and records saved from either load into the other:
//!
//! ```
//! use burn_mlx::nn::{TransformerEncoderConfig, TransformerEncoderInput};
//! use burn_mlx::{Mlx, MlxDevice};
//! use burn_tensor::{Distribution, Tensor};
//!
//! let device = MlxDevice::Cpu;
//! let encoder = TransformerEncoderConfig::new(64, 128, 4, 2)
//!     .with_dropout(0.0)
//!     .init::<Mlx>(&device);
//! let x = Tensor::<Mlx, 3>::random([2, 10, 64], Distribution::Default, &device);
//! let y = encoder.forward(TransformerEncoderInput::new(x));
//! assert_eq!(y.dims(), [2, 10, 64]);
//! ```
//!
//! On every backend other than `Mlx` and `Autodiff<Mlx>`, and on MLX's CPU device unless
//! [`fuse_on_cpu`] is on, the layers compute exactly what burn-nn's do, with burn-nn's ops.
//! Where MLX's fused kernels cannot do what the layer is configured for (dropout on attention
//! scores during training, quiet softmax), the layer runs burn-nn's computation on MLX too.
//!
//! # Overlapped steps
//!
//! MLX computes lazily and asynchronously. A loop that reads its loss right after building a
//! step makes the host wait for the device, then the device wait while the host builds the next
//! step. [`start_step`] starts computing the updated model and the loss without waiting; read
//! the previous step's loss after starting the next one, and the host builds step n+1 while the
//! device computes step n. The values are the same; only the order of waiting changes.

mod attention;
pub(crate) mod custom;
pub mod functional;
mod norm;
mod norm_cuda;
mod self_attention;
mod transformer;

pub use attention::{MhaInput, MhaOutput, MultiHeadAttention, MultiHeadAttentionConfig};
pub use norm::{LayerNorm, LayerNormConfig, RmsNorm, RmsNormConfig};
pub use transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput, TransformerEncoderLayer,
};

use crate::error::MlxError;

/// Whether the fused layers run fused on MLX's CPU device too (off by default).
///
/// MLX has fused kernels for layer norm, RMS norm and attention on Metal and CUDA; on the CPU
/// its fast ops are compositions of ordinary ops, and training through them (forward, then
/// MLX's VJP of the composition) measured slower than burn-nn's computation on the 2-core CPU
/// of `benches/training.md` (the encoder 0.85×, the decoder LM 0.70×). So on the CPU the layers compute
/// burn-nn's way unless this is switched on; the results are the same within rounding either
/// way. The setting is process-wide.
pub fn fuse_on_cpu(on: bool) {
    custom::set_fuse_on_cpu(on);
}
use burn_core::module::{Module, ModuleVisitor, Param};
use burn_tensor::backend::Backend;
use burn_tensor::Tensor;

/// Starts computing `module`'s float parameters and `outputs` (a step's loss, metrics) on the
/// device, and returns without waiting (MLX's `async_eval` over all of them at once). On
/// backends other than `Mlx` and `Autodiff<Mlx>` it does nothing.
///
/// Call it after the optimizer step, then read the previous step's loss:
///
/// ```no_run
/// # use burn_mlx::{Mlx, MlxDevice};
/// # use burn_autodiff::Autodiff;
/// # use burn_nn::{Linear, LinearConfig};
/// # use burn_optim::{AdamConfig, GradientsParams, Optimizer};
/// # use burn_tensor::{Distribution, Tensor};
/// # type B = Autodiff<Mlx>;
/// # let device = MlxDevice::default();
/// # let mut model: Linear<B> = LinearConfig::new(8, 1).init(&device);
/// # let mut optim = AdamConfig::new().init();
/// # let x = Tensor::<B, 2>::random([32, 8], Distribution::Default, &device);
/// let mut pending: Option<Tensor<B, 1>> = None;
/// for step in 0..100 {
///     let loss = model.forward(x.clone()).powi_scalar(2).mean();
///     let grads = GradientsParams::from_grads(loss.backward(), &model);
///     model = optim.step(1e-3, model, grads);
///     burn_mlx::nn::start_step(&model, std::slice::from_ref(&loss))?;
///     // The device computes this step while the previous loss is read and the next step built.
///     if let Some(previous) = pending.replace(loss) {
///         println!("step {}: {}", step - 1, previous.into_scalar());
///     }
/// }
/// # Ok::<(), burn_mlx::MlxError>(())
/// ```
///
/// # Errors
///
/// When MLX fails to schedule the computation.
pub fn start_step<B: Backend, M: Module<B>, const D: usize>(
    module: &M,
    outputs: &[Tensor<B, D>],
) -> Result<(), MlxError> {
    if !custom::is_mlx::<B>() {
        return Ok(());
    }
    let mut arrays = Arrays::default();
    module.visit(&mut arrays);
    for t in outputs {
        arrays.push(t.clone());
    }
    if arrays.arrays.is_empty() {
        return Ok(());
    }
    crate::trace::check_not_tracing("start_step")?;
    let refs: Vec<&mlx_rs::Array> = arrays.arrays.iter().collect();
    let _guard = crate::tensor::eval_lock();
    crate::compile::auto::eval("start_step", &refs, false)?;
    if let Some(device) = arrays.device {
        device.after_eval();
    }
    Ok(())
}

/// The MLX arrays of a module's float parameters.
#[derive(Default)]
struct Arrays {
    arrays: Vec<mlx_rs::Array>,
    device: Option<crate::MlxDevice>,
}

impl Arrays {
    fn push<B: Backend, const D: usize>(&mut self, tensor: Tensor<B, D>) {
        if let Some(t) = custom::mlx_array::<B>(tensor.into_primitive().tensor()) {
            self.device.get_or_insert(t.device());
            self.arrays.push(t.into_array());
        }
    }
}

impl<B: Backend> ModuleVisitor<B> for Arrays {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.push(param.val());
    }
}
