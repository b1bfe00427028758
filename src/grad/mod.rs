//! Training with MLX's own reverse-mode autodiff: the fast path on `Mlx`.
//!
//! `Autodiff<Mlx>` is Burn's autodiff over burn-mlx: it records a backward node for every Burn
//! op and builds the gradient from Burn's formulas, one Burn op at a time, so a softmax, a
//! LayerNorm or a cross-entropy loss are differentiated as the many small ops Burn composes
//! them from. This module differentiates the MLX graph that Burn's forward pass on plain `Mlx`
//! builds, with MLX's own rules (`mlx::core::value_and_grad`): MLX's softmax, log-sum-exp and
//! attention primitives get their fused gradients, and Burn's autodiff bookkeeping is not paid.
//! `gpu_bench --mlx-autodiff` measures its four training steps (MLP, CNN, Transformer encoder,
//! decoder LM, with the same Burn Adam and automatic fusion) this way and through
//! `Autodiff<Mlx>`; docs/training.md gives the H100 figures (2026-11-25), where this path was
//! the faster one for all four steps by the medians.
//! The gradients agree with Burn's to within 1e-6 of gradients up to 3e-2.
//!
//! [`CompiledTrainer`] goes further: it compiles the whole step (forward, MLX's backward and
//! Adam, with the step count as an array) with MLX's `compile`, as MLX programs wrap their step
//! in `mx.compile`, so that later steps replay one traced graph instead of building one. On an
//! H100 (2026-11-25, `gpu_bench --mlx-autodiff`; docs/training.md) it ran the four steps faster
//! than both PyTorch eager (TF32) and `Autodiff<Mlx>`, by the medians of 3 rounds.
//!
//! It works on any Burn [`Module`](burn_core::module::Module) of `Mlx` and any Burn
//! [`SimpleOptimizer`](burn_optim::SimpleOptimizer) (Adam, AdamW, SGD and the others'
//! `build()`), but it is called, not typed: the loss is a closure of the model, as in MLX's
//! `nn.value_and_grad`.
//!
//! ```
//! use burn_core::module::Module;
//! use burn_mlx::grad::{value_and_grad, Trainer};
//! use burn_mlx::{Mlx, MlxDevice};
//! use burn_nn::{Linear, LinearConfig};
//! use burn_optim::AdamConfig;
//! use burn_tensor::{Distribution, Tensor};
//!
//! let device = MlxDevice::Cpu;
//! let model: Linear<Mlx> = LinearConfig::new(4, 2).init(&device);
//! let x = Tensor::<Mlx, 2>::random([8, 4], Distribution::Default, &device);
//! let loss = |m: &Linear<Mlx>| m.forward(x.clone()).powi_scalar(2).mean();
//!
//! // The loss and every parameter's gradient, as Burn's `GradientsParams`.
//! let (value, grads) = value_and_grad(&model, loss).unwrap();
//! assert_eq!(grads.len(), 2); // weight and bias
//!
//! // Or whole steps: forward, MLX's backward, the optimizer's update.
//! let mut trainer = Trainer::new(model, AdamConfig::new().build());
//! for _ in 0..3 {
//!     let value = trainer.step(1e-2, loss).unwrap();
//!     assert!(value.into_scalar().is_finite());
//! }
//! let trained: Linear<Mlx> = trainer.into_model();
//! ```
//!
//! What differs from `Autodiff<Mlx>`:
//! - Every float parameter gets a gradient, zeros for those the loss does not use (Burn gives
//!   them none, and its optimizers then leave them alone; here the optimizer sees zeros, so
//!   momentum still moves them). Freeze a parameter by leaving it out of the model passed in.
//! - The loss closure is traced by MLX: it may read values (MLX keeps the graph while it
//!   traces), but [`MlxTensor::start_eval`](crate::MlxTensor::start_eval) and other
//!   asynchronous evaluation inside it fail with MLX's message.
//! - Gradients are MLX's: at points where a function has no derivative (`abs` or `relu` at 0,
//!   ties of `max`), MLX's convention can differ from Burn's.

mod compiled;
mod params;
mod trainer;
mod value_and_grad;

pub use compiled::{AdamSettings, CompiledTrainer};
pub use trainer::Trainer;
pub use value_and_grad::value_and_grad;
