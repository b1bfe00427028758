//! Burn's op traits for [`Mlx`](crate::Mlx), one file per trait or op family.

pub(crate) mod activation;
pub(crate) mod base;
mod bool_tensor;
mod float;
mod int;
mod module;
mod qtensor;
mod transaction;
