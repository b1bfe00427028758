//! Burn's `TransactionOps` on MLX.
//!
//! Burn's default reads each tensor of the transaction in turn; every read goes through
//! `MlxTensor::to_data`, which evaluates under the shared evaluation lock.

use crate::backend::Mlx;
use burn_backend::ops::TransactionOps;

impl TransactionOps<Self> for Mlx {}
