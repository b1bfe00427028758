//! Several processes that train together, over MLX's own distributed engine.
//!
//! MLX runs one rank per process and connects the processes with one of its backends: ring
//! (TCP sockets, in every MLX build, also between processes of one machine over loopback), MPI,
//! NCCL (MLX's CUDA build) or JACCL (RDMA between Macs). This module brings that engine to Burn
//! tensors of the [`Mlx`](crate::Mlx) backend:
//!
//! - [`init`](crate::distributed::init) / [`InitOptions`](crate::distributed::InitOptions) set a [`Group`](crate::distributed::Group) up from the environment the backend reads
//!   (checked first, with clear errors), within a time limit;
//! - the group's collectives, [`Group::all_sum`](crate::distributed::Group::all_sum), [`all_max`](crate::distributed::Group::all_max),
//!   [`all_min`](crate::distributed::Group::all_min), [`all_gather`](crate::distributed::Group::all_gather),
//!   [`broadcast`](crate::distributed::Group::broadcast), [`send`](crate::distributed::Group::send) / [`recv`](crate::distributed::Group::recv) and
//!   [`barrier`](crate::distributed::Group::barrier), take `Tensor<Mlx, D, K>` (float, int or bool) or the
//!   [`MlxTensor`](crate::MlxTensor) primitive, in every dtype, and are bounded in time by a
//!   watchdog (a peer that hangs gives [`DistributedError::Timeout`](crate::distributed::DistributedError::Timeout), one that dies
//!   [`DistributedError::PeerLost`](crate::distributed::DistributedError::PeerLost));
//! - [`GradientAllReduce`](crate::distributed::GradientAllReduce) averages a model's gradients in a few bucketed collectives, for
//!   data-parallel training;
//! - [`launch()`](crate::distributed::launch::launch) starts `n` local ranks with a generated hostfile (the
//!   `mlx_launch` program of crates/burn-mlx-distributed is its command line), and documents the variables for several hosts.
//!
//! ```no_run
//! use burn_mlx::distributed::{self, CommBackend};
//! use burn_mlx::{Mlx, MlxDevice};
//! use burn_tensor::Tensor;
//!
//! // `cargo run -p burn-mlx-distributed --bin mlx_launch -- -n 2 <this program>` starts two
//! // ranks; started alone, the program is rank 0 of 1 and the collectives return their input.
//! let group = distributed::init(CommBackend::Any)?;
//! let x = Tensor::<Mlx, 1>::from_floats([group.rank() as f32], &MlxDevice::Cpu);
//! let everyone = group.all_gather(x)?; // [0, 1, ..., n - 1] on every rank
//! # Ok::<(), distributed::DistributedError>(())
//! ```
//!
//! Why not Burn's own `DistributedBackend`: it and burn-collective assume several devices in
//! one process, with Burn doing the communication; MLX's engine runs one rank per process and
//! communicates inside MLX's graph. So each process is an ordinary single-device Burn program,
//! and the gradients are averaged between `backward()` and the optimizer step.

mod collectives;
mod error;
mod grads;
mod group;
mod hostfile;
pub mod launch;

pub use collectives::{CollectiveKind, CollectiveTensor};
pub use error::DistributedError;
pub use grads::GradientAllReduce;
pub use group::{
    init, is_available, CommBackend, Group, InitOptions, INIT_TIMEOUT_ENV, TIMEOUT_ENV,
};
pub use hostfile::Hostfile;
