//! The `--device cpu|gpu` flag of the examples' command lines (clap), shared by `train`, `embed`
//! and `gpu_bench`, which include this file with `#[path]`.

use burn_mlx::MlxDevice;
use clap::ValueEnum;
use std::fmt;

/// The MLX device a `--device` flag names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceFlag {
    /// MLX's CPU backend (MlxDevice::Cpu).
    Cpu,
    /// MLX's GPU backend (MlxDevice::Gpu: Metal on Apple Silicon, CUDA on NVIDIA).
    Gpu,
}

impl From<DeviceFlag> for MlxDevice {
    fn from(flag: DeviceFlag) -> Self {
        match flag {
            DeviceFlag::Cpu => MlxDevice::Cpu,
            DeviceFlag::Gpu => MlxDevice::Gpu,
        }
    }
}

/// Writes the flag as it is spelled on the command line (`cpu`, `gpu`).
impl fmt::Display for DeviceFlag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceFlag::Cpu => "cpu",
            DeviceFlag::Gpu => "gpu",
        })
    }
}
