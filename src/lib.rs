//! # burn-mlx
//!
//! Apple's [MLX](https://github.com/ml-explore/mlx) as a backend for the
//! [Burn](https://burn.dev) deep-learning framework.
//!
//! ```no_run
//! use burn_mlx::{Mlx, MlxDevice};
//! use burn_tensor::Tensor;
//!
//! let device = MlxDevice::default();
//! let a = Tensor::<Mlx, 2>::ones([2, 3], &device);
//! let b = a.clone() * 2.0 + a;
//! println!("{}", b);
//! ```
//!
//! MLX runs on Apple Silicon (Metal), on Linux CPUs and on NVIDIA GPUs (CUDA). Ops build MLX's
//! lazy graph; values are computed when data is read or [`Backend::sync`](burn_backend::Backend::sync)
//! is called. [`MlxTensor`] gives direct access to the MLX arrays.
#![warn(missing_docs)]

#[cfg(all(feature = "jemalloc", target_os = "linux"))]
mod alloc;
mod api;
mod backend;
pub mod compile;
mod device;
/// Data-parallel training over MLX's distributed engine (ring, MPI, NCCL): groups,
/// collectives on `Tensor<Mlx, D, K>`, bucketed gradient averaging, and a local launcher.
pub mod distributed;
mod dtype;
mod error;
pub mod fast;
pub mod grad;
mod graph;
mod interop;
mod native;
mod ops;
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
