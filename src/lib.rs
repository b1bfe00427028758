//! # burn-mlx
//!
//! Apple's [MLX](https://github.com/ml-explore/mlx) as a backend for the
//! [Burn](https://burn.dev) deep-learning framework, **Burn 0.21.0**. Write `type B = Mlx;` and
//! your Burn models, `Autodiff<Mlx>` training loops, optimizers and records run on MLX: on Apple
//! Silicon through Metal, on Linux through MLX's CPU backend, and on NVIDIA GPUs through MLX's
//! CUDA backend (the `cuda` feature).
//!
//! ```no_run
//! use burn_mlx::{Mlx, MlxDevice};
//! use burn_tensor::{activation::softmax, Distribution, Tensor};
//!
//! let device = MlxDevice::default(); // the GPU when MLX has one, else the CPU
//! let x = Tensor::<Mlx, 2>::random([64, 128], Distribution::Default, &device);
//! let w = Tensor::<Mlx, 2>::ones([128, 10], &device);
//! let y = softmax(x.matmul(w), 1);
//! println!("{}", y.sum());
//! ```
//!
//! Ops build MLX's lazy graph; values are computed when data is read or
//! [`Backend::sync`](burn_backend::Backend::sync) is called. When you want MLX itself,
//! [`MlxTensor`] gives you its lazy arrays directly:
//!
//! ```no_run
//! use burn_mlx::{MlxDevice, MlxOps, MlxTensor};
//!
//! # fn main() -> Result<(), burn_mlx::MlxError> {
//! let device = MlxDevice::Cpu;
//! let a = MlxTensor::ones::<f32>(&[256, 256], device)?;
//! let b = MlxTensor::random_uniform(&[256, 256], -1.0, 1.0, device)?;
//! let y = a.matmul(&b).relu().softmax().eval()?; // lazy until `eval`
//! let values: Vec<f32> = y.to_vec()?;
//! # Ok(())
//! # }
//! ```
//!
//! Where to go next:
//! - burn-nn's Transformer layers and burn-optim's Adam with fused MLX kernels for
//!   `Autodiff<Mlx>`, and overlapped training steps: [`nn`], [`optim`];
//! - training faster with MLX's own autodiff: [`grad`]; the ways MLX compiles graphs:
//!   [`compile`](mod@compile); data-parallel training: [`distributed`]; quantized weights: [`quant`];
//! - the README (the two commands, using burn-mlx from your crate with its one `[patch]` line,
//!   platforms, results) and `docs/` (architecture, CUDA, LLM inference, performance).
//!
//! Burn 0.22 removed the backend parameter from `Tensor`, so `type B = Mlx` exists only on Burn
//! 0.21; burn-mlx pins `=0.21.0` (the README's "Burn versions" says what a Burn 0.22 user can do).
#![warn(missing_docs)]

#[cfg(all(feature = "jemalloc", target_os = "linux"))]
mod alloc;
mod api;
mod backend;
pub mod compile;
pub mod decode;
mod device;
/// Data-parallel training over MLX's distributed engine (ring, MPI, NCCL): groups,
/// collectives on `Tensor<Mlx, D, K>`, bucketed gradient averaging, and a local launcher.
pub mod distributed;
mod dtype;
mod error;
pub mod export;
pub mod fast;
pub mod grad;
mod graph;
mod interop;
mod native;
pub mod nn;
mod ops;
pub mod optim;
pub mod quant;
mod rng;
mod scalar_tape;
mod tensor;
mod trace;

pub use api::{MlxElement, MlxOps, MlxTyped};
pub use backend::{supports_grouped_kv_heads, Mlx};
pub use compile::function::{compile, compile_float, Compiled, CompiledFloat};
pub use compile::op_stream::{
    op_stream_stats, MlxFused, MlxFusionRuntime, OpStreamStats, StepOptimization,
};
pub use device::MlxDevice;
pub use error::MlxError;
pub use graph::{pending_by_kind, pending_primitives, PrimitiveKind};
pub use interop::{from_mlx, to_mlx};
pub use native::{memory_stats, peak_memory, reset_peak_memory};
pub use tensor::{Dynamic, MlxTensor};

/// The types most programs need, and the traits of the low-level API ([`MlxOps`] for the
/// dynamic `MlxTensor`, [`MlxTyped`] for the typed `MlxTensor<E>`).
pub mod prelude {
    pub use crate::{Mlx, MlxDevice, MlxError, MlxOps, MlxTensor, MlxTyped};
}
