//! The [`Mlx`] backend type.

use crate::device::MlxDevice;
use crate::tensor::MlxTensor;
use burn_backend::quantization::{QuantLevel, QuantMode, QuantScheme, QuantStore, QuantValue};
use burn_backend::{
    Backend, BackendTypes, BoolStore, DType, DTypeUsage, DTypeUsageSet, ExecutionError,
};

/// Burn's backend over MLX: `type B = Mlx;`, or `Autodiff<Mlx>` for training.
///
/// Floats default to f32 and integers to i64; Burn's `set_default_dtypes` selects others.
/// Every tensor kind (float, int, bool, quantized) is an [`MlxTensor`].
#[derive(Clone, Copy, Default, Debug)]
pub struct Mlx;

impl BackendTypes for Mlx {
    type Device = MlxDevice;

    type FloatTensorPrimitive = MlxTensor;
    type FloatElem = f32;

    type IntTensorPrimitive = MlxTensor;
    type IntElem = i64;

    type BoolTensorPrimitive = MlxTensor;
    type BoolElem = bool;

    type QuantizedTensorPrimitive = MlxTensor;
}

impl Backend for Mlx {
    fn name(device: &MlxDevice) -> String {
        match device {
            MlxDevice::Cpu => "mlx<cpu>".into(),
            MlxDevice::Gpu => "mlx<gpu>".into(),
        }
    }

    fn seed(_device: &MlxDevice, seed: u64) {
        crate::rng::seed(seed);
    }

    fn sync(device: &MlxDevice) -> Result<(), ExecutionError> {
        // Ops are lazy and every read evaluates what it needs; waiting for the device's queue
        // finishes any evaluation another thread started. A device MLX lacks is an error.
        device.check().map_err(ExecutionError::from)?;
        crate::trace::check_not_tracing("sync").map_err(ExecutionError::from)?;
        let _guard = crate::tensor::eval_lock();
        crate::native::synchronize().map_err(ExecutionError::from)?;
        device.after_eval();
        Ok(())
    }

    fn memory_cleanup(_device: &MlxDevice) {
        crate::native::clear_cache();
    }

    fn dtype_usage(device: &MlxDevice, dtype: DType) -> DTypeUsageSet {
        match dtype {
            DType::F64 if *device == MlxDevice::Gpu => DTypeUsageSet::empty(),
            DType::F32 | DType::Flex32 | DType::F16 | DType::BF16 => {
                DTypeUsage::general() | DTypeUsage::Accelerated
            }
            DType::F64
            | DType::I64
            | DType::I32
            | DType::I16
            | DType::I8
            | DType::U64
            | DType::U32
            | DType::U16
            | DType::U8
            | DType::Bool(BoolStore::Native) => DTypeUsage::general(),
            DType::Bool(_) => DTypeUsageSet::empty(),
            DType::QFloat(scheme) => {
                if supported_scheme(&scheme) {
                    DTypeUsage::general()
                } else {
                    DTypeUsageSet::empty()
                }
            }
        }
    }

    fn device_count(type_id: u16) -> usize {
        match type_id {
            0 => 1,
            _ => usize::from(MlxDevice::gpu_available()),
        }
    }
}

/// The quantization schemes burn-mlx implements: symmetric 8-bit, per tensor or per block,
/// with values stored natively (one i8 per value).
pub(crate) fn supported_scheme(scheme: &QuantScheme) -> bool {
    matches!(
        scheme,
        QuantScheme {
            level: QuantLevel::Tensor | QuantLevel::Block(_),
            mode: QuantMode::Symmetric,
            value: QuantValue::Q8F | QuantValue::Q8S,
            store: QuantStore::Native,
            ..
        }
    )
}

/// Whether Burn's `attention` op on backend `B` takes keys and values with fewer heads than the
/// query, as long as their number divides the query's (grouped-query attention: query head `i`
/// attends with key/value head `i / (query heads / key heads)`).
///
/// True for [`Mlx`], whose `attention` hands grouped heads to MLX's attention kernels as they
/// are; false for every other backend, including `Autodiff<Mlx>` (Burn's autodiff computes
/// attention from matmuls, which need equal heads). Generic model code can ask this to skip
/// repeating the key/value heads:
///
/// ```
/// use burn_mlx::{supports_grouped_kv_heads, Mlx};
/// assert!(supports_grouped_kv_heads::<Mlx>());
/// assert!(!supports_grouped_kv_heads::<burn_autodiff::Autodiff<Mlx>>());
/// ```
pub fn supports_grouped_kv_heads<B: Backend>() -> bool {
    std::any::TypeId::of::<B>() == std::any::TypeId::of::<Mlx>()
}
