//! The MLX devices a Burn tensor can live on.

use burn_backend::{DeviceId, DeviceOps};
use mlx_rs::{DeviceType, Stream};
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

/// An MLX device: the CPU, or the GPU (Metal on Apple Silicon, CUDA on NVIDIA).
///
/// The default is the GPU when this build of MLX has one and the machine offers it, otherwise
/// the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MlxDevice {
    /// MLX's CPU backend (BLAS/LAPACK for linear algebra).
    Cpu,
    /// MLX's GPU backend: Metal on macOS, CUDA with the `cuda` build on Linux.
    Gpu,
}

impl Default for MlxDevice {
    fn default() -> Self {
        if MlxDevice::gpu_available() {
            MlxDevice::Gpu
        } else {
            MlxDevice::Cpu
        }
    }
}

/// Parses a device as a command line spells it: `cpu` or `gpu` (any case), so that a clap
/// `--device` argument can be an `MlxDevice`.
impl FromStr for MlxDevice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "cpu" => Ok(MlxDevice::Cpu),
            "gpu" => Ok(MlxDevice::Gpu),
            _ => Err(format!("unknown MLX device `{s}`: expected `cpu` or `gpu`")),
        }
    }
}

/// Writes the device as [`FromStr`] reads it: `cpu` or `gpu`.
impl fmt::Display for MlxDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MlxDevice::Cpu => "cpu",
            MlxDevice::Gpu => "gpu",
        })
    }
}

impl MlxDevice {
    /// Whether this MLX build can run on a GPU here (checked once).
    pub fn gpu_available() -> bool {
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| crate::native::device_available(DeviceType::Gpu))
    }

    /// Whether this device can be used in this process.
    pub fn is_available(&self) -> bool {
        match self {
            MlxDevice::Cpu => true,
            MlxDevice::Gpu => MlxDevice::gpu_available(),
        }
    }

    /// Returns an error saying why the device cannot be used, if it cannot.
    pub fn check(&self) -> Result<(), crate::error::MlxError> {
        if self.is_available() {
            Ok(())
        } else {
            Err(crate::error::MlxError::Device {
                device: format!("{self:?}"),
                hint: "this MLX build has no usable GPU (on Linux, build with the `cuda` \
                       feature or BURN_MLX_CUDA=1 on a machine with an NVIDIA GPU; on macOS, use \
                       Apple Silicon). Use MlxDevice::Cpu."
                    .into(),
            })
        }
    }

    /// The process-wide MLX stream of this device (see `native::thread_init`).
    pub(crate) fn stream(&self) -> Stream {
        crate::native::thread_init();
        let device = match self {
            MlxDevice::Cpu => mlx_rs::Device::cpu(),
            MlxDevice::Gpu => mlx_rs::Device::gpu(),
        };
        Stream::try_default_on_device(&device)
            .unwrap_or_else(|e| panic!("burn-mlx: no MLX stream for {self:?}: {e}"))
    }

    /// Bookkeeping after an evaluation on this device (the GPU exit guard, see
    /// `native::after_gpu_eval`).
    pub(crate) fn after_eval(&self) {
        if *self == MlxDevice::Gpu {
            crate::native::after_gpu_eval();
        }
    }

    /// Runs `f` with this device's stream as the default for MLX ops on this thread.
    ///
    /// Ops on the process-wide default device skip the thread-local switch.
    pub(crate) fn scope<T>(&self, f: impl FnOnce() -> T) -> T {
        crate::native::thread_init();
        if *self == MlxDevice::default() {
            f()
        } else {
            if let Err(e) = self.check() {
                panic!("{e}");
            }
            mlx_rs::with_stream(&self.stream(), f)
        }
    }
}

impl burn_backend::Device for MlxDevice {
    fn from_id(device_id: DeviceId) -> Self {
        match device_id.type_id {
            0 => MlxDevice::Cpu,
            _ => MlxDevice::Gpu,
        }
    }

    fn to_id(&self) -> DeviceId {
        DeviceId {
            type_id: match self {
                MlxDevice::Cpu => 0,
                MlxDevice::Gpu => 1,
            },
            index_id: 0,
        }
    }
}

impl DeviceOps for MlxDevice {}
