//! The fuser that burn-fusion offers each recorded op: it takes every op a compiled MLX function
//! can run and closes the block at the first one it cannot.

use super::step::StepOptimization;
use crate::device::MlxDevice;
use burn_backend::DType;
use burn_fusion::{FuserProperties, FuserStatus, OperationFuser};
use burn_ir::{BaseOperationIr, FloatOperationIr, NumericOperationIr, OperationIr};

/// Collects a block of ops for one [`StepOptimization`].
#[derive(Clone)]
pub(crate) struct StepFuser {
    device: MlxDevice,
    ops: Vec<OperationIr>,
    status: FuserStatus,
    /// The most ops in one block (0: no limit; `BURN_MLX_OP_STREAM_OPS`).
    max_ops: usize,
}

impl StepFuser {
    pub(crate) fn new(device: MlxDevice) -> Self {
        Self {
            device,
            ops: Vec::new(),
            status: FuserStatus::Open,
            max_ops: super::settings().max_ops,
        }
    }
}

/// Whether a compiled MLX function can run `op`: not random ops (a compiled function would repeat
/// the draws of its trace), not quantized tensors (their scales live beside the array), not
/// custom ops or tensor initialization (handles from outside the stream), and not slices:
/// burn-fusion's relative form of a slice drops its ranges, so two slices of one tensor with
/// different ranges would be taken for the same block.
pub(crate) fn compilable(op: &OperationIr) -> bool {
    let plain = !matches!(
        op,
        OperationIr::BaseFloat(BaseOperationIr::Slice(_) | BaseOperationIr::SliceAssign(_))
            | OperationIr::BaseInt(BaseOperationIr::Slice(_) | BaseOperationIr::SliceAssign(_))
            | OperationIr::BaseBool(BaseOperationIr::Slice(_) | BaseOperationIr::SliceAssign(_))
            | OperationIr::Init(_)
            | OperationIr::Custom(_)
            | OperationIr::Float(_, FloatOperationIr::Random(_))
            | OperationIr::Float(_, FloatOperationIr::Quantize(_))
            | OperationIr::Float(_, FloatOperationIr::Dequantize(_))
            | OperationIr::NumericInt(_, NumericOperationIr::IntRandom(_))
            | OperationIr::NumericFloat(_, NumericOperationIr::IntRandom(_))
    );
    plain
        && op
            .nodes()
            .iter()
            .all(|t| !matches!(t.dtype, DType::QFloat(_)))
}

impl OperationFuser<StepOptimization> for StepFuser {
    fn fuse(&mut self, operation: &OperationIr) {
        if self.status == FuserStatus::Closed {
            return;
        }
        if compilable(operation) {
            self.ops.push(operation.clone());
            if self.ops.len() == self.max_ops {
                self.status = FuserStatus::Closed;
            }
        } else {
            self.status = FuserStatus::Closed;
        }
    }

    fn finish(&mut self) -> StepOptimization {
        StepOptimization::new(self.device, self.ops.clone())
    }

    fn reset(&mut self) {
        self.ops.clear();
        self.status = FuserStatus::Open;
    }

    fn status(&self) -> FuserStatus {
        self.status
    }

    fn properties(&self) -> FuserProperties {
        FuserProperties {
            score: self.ops.len() as u64,
            ready: !self.ops.is_empty(),
        }
    }

    fn len(&self) -> usize {
        self.ops.len()
    }

    fn clone_dyn(&self) -> Box<dyn OperationFuser<StepOptimization>> {
        Box::new(self.clone())
    }
}
