//! Data-parallel training with Burn on burn-mlx over MLX's distributed engine: the glue between
//! Burn's modules and gradients and `burn_mlx::distributed` ([`ddp`]), used by the
//! `train_distributed` command and by this crate's tests. The commands are `train_distributed`
//! (data-parallel training and an all_sum benchmark) and `mlx_launch` (starts the ranks of a
//! program on this machine); the models they train come from burn-mlx-models.

pub mod ddp;
