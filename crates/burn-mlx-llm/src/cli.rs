//! The flag values the `llm` and `lora` commands share (clap `ValueEnum`s) and what they map to.

use crate::error::{LlmError, Result};
use burn_mlx::quant::QuantBits;
use burn_mlx::MlxDevice;
use burn_tensor::DType;
use clap::ValueEnum;

/// MLX's device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// The GPU when MLX has one, else the CPU.
    Auto,
    /// MLX's CPU backend.
    Cpu,
    /// MLX's GPU backend (Metal, or CUDA with the `cuda` feature).
    Gpu,
}

impl DeviceArg {
    /// The MLX device; an error when `gpu` is asked of a build without one.
    pub fn device(self) -> Result<MlxDevice> {
        Ok(match self {
            DeviceArg::Auto => MlxDevice::default(),
            DeviceArg::Cpu => MlxDevice::Cpu,
            DeviceArg::Gpu if MlxDevice::gpu_available() => MlxDevice::Gpu,
            DeviceArg::Gpu => {
                return Err(LlmError::Input(
                    "--device gpu: this MLX build has no GPU (CPU-only wheel; build with \
                     --features cuda on NVIDIA, or run on Apple silicon)"
                        .into(),
                ))
            }
        })
    }
}

/// Weights, activations and cache dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DTypeArg {
    /// 32-bit float.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
}

impl From<DTypeArg> for DType {
    fn from(d: DTypeArg) -> Self {
        match d {
            DTypeArg::F32 => DType::F32,
            DTypeArg::Bf16 => DType::BF16,
            DTypeArg::F16 => DType::F16,
        }
    }
}

/// Weight quantization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum QuantizeArg {
    /// 8 bits per weight, groups of 64.
    Q8,
    /// 4 bits per weight, groups of 64.
    Q4,
}

impl From<QuantizeArg> for QuantBits {
    fn from(q: QuantizeArg) -> Self {
        match q {
            QuantizeArg::Q8 => QuantBits::Q8,
            QuantizeArg::Q4 => QuantBits::Q4,
        }
    }
}
