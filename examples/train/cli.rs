//! The command line of the training example, parsed by clap: every flag, its default and its
//! `--help` line.

use burn_mlx::MlxDevice;
use clap::{Parser, ValueEnum};
use std::path::PathBuf;

/// Which backend runs the training.
#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
pub enum BackendKind {
    /// Burn on MLX (burn-mlx's Mlx).
    Mlx,
    /// burn-ndarray, the reference CPU backend.
    #[value(name = "ndarray")]
    NdArray,
}

/// Which dataset to train on.
#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
pub enum DatasetKind {
    /// The generated shapes dataset (needs no files).
    Shapes,
    /// MNIST, read from uncompressed IDX files.
    Mnist,
}

/// Trains a small CNN classifier with Autodiff<Mlx> through burn-train's Learner.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "train",
    override_usage = "cargo run --release --example train -- [OPTIONS]"
)]
pub struct Args {
    /// Generated shapes (offline) or MNIST IDX files.
    #[arg(long, value_enum, default_value_t = DatasetKind::Shapes)]
    pub dataset: DatasetKind,
    /// Directory holding the uncompressed MNIST IDX files (needed with --dataset mnist).
    #[arg(long, value_name = "DIR", required_if_eq("dataset", "mnist"))]
    pub data_dir: Option<PathBuf>,
    /// Training epochs.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = at_least_one)]
    pub epochs: usize,
    /// Batch size.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = at_least_one)]
    pub batch_size: usize,
    /// Adam learning rate.
    #[arg(long, value_name = "X", default_value_t = 2e-3)]
    pub lr: f64,
    /// MLX device [default: the GPU when MLX has one, otherwise the CPU].
    #[arg(long, value_name = "cpu|gpu")]
    pub device: Option<MlxDevice>,
    /// Output directory.
    #[arg(long, value_name = "DIR", default_value = "artifacts/train")]
    pub out: PathBuf,
    /// Training images (MNIST: at most 60000).
    #[arg(long, value_name = "N", default_value_t = 12_000, value_parser = at_least_one)]
    pub train_size: usize,
    /// Validation images (MNIST: at most 10000).
    #[arg(long, value_name = "N", default_value_t = 2_000, value_parser = at_least_one)]
    pub valid_size: usize,
    /// Seed of the data generator, the shuffling and the weights.
    #[arg(long, value_name = "N", default_value_t = 42)]
    pub seed: u64,
    /// Burn backend (ndarray is the reference CPU backend).
    #[arg(long, value_enum, default_value_t = BackendKind::Mlx)]
    pub backend: BackendKind,
    /// Skip training: load DIR/model.mpk on --backend, recompute the validation accuracy and
    /// classify new images.
    #[arg(long, value_name = "DIR")]
    pub predict: Option<PathBuf>,
    /// After training (or with --predict), write the model's forward pass to FILE as an MLX
    /// function file (.mlxfn) that MLX Python, C++ and Swift load, plus reference images and
    /// logits beside it (FILE with extension .examples.safetensors).
    #[arg(long, value_name = "FILE")]
    pub export: Option<PathBuf>,
}

/// Parses a count that must be at least 1 (epochs, batch size, dataset sizes).
fn at_least_one(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("`{value}` is not a valid number: {e}")),
    }
}

impl Args {
    /// The MLX device chosen by `--device`, checked to be usable.
    pub fn mlx_device(&self) -> Result<MlxDevice, String> {
        let device = self.device.unwrap_or_default();
        device.check().map_err(|e| e.to_string())?;
        Ok(device)
    }
}
