//! [`MlxFused`]: Burn's op-stream recorder (burn-fusion) over [`Mlx`], whose recurring blocks of
//! ops run as MLX-compiled functions.
//!
//! With plain `Mlx`, every Burn op builds MLX arrays at once, and a training step builds its
//! whole graph again on every step: thousands of arrays, each a heap allocation in MLX's C++ and
//! a node in Burn's bookkeeping (docs/fusion.md measures where that host time goes). With
//! `MlxFused` (`burn_fusion::Fusion<Mlx>`), Burn records each op as a small description in its
//! fusion stream instead. burn-fusion groups the stream into blocks, recognizes a block it has
//! seen before by its structure (shapes relative, scalar values left out) and hands it to the
//! optimization that [`MlxFusionRuntime`] provides:
//!
//! - The first time a block runs, its ops run one by one on `Mlx` (as without recording), while
//!   the scalar arrays they create are noted (`src/scalar_tape.rs`) and each is bound to the
//!   Burn scalar of its op when their values agree.
//! - The next time, MLX's `compile` traces one function that runs the block's ops on its inputs
//!   (the tensors the block reads, then the bound scalars), and calls it.
//! - From then on the compiled function is called directly: no MLX graph is built for the
//!   block's ops, only the compiled function's outputs.
//!
//! Scalars that are not bound (an op that branches on a value, or derives a constant from it)
//! are checked against the values the function was traced with, and so are the shapes of the
//! block's tensors (burn-fusion's relative form keeps no shapes). A run that fits no recording
//! runs op by op and is recorded as another variant of the block, compiled when a later run fits
//! it: an epoch's smaller last batch gets its own compiled function beside the full batches'.
//! A block keeps 4 variants (the least recently used goes) and stays op by op after 12
//! recordings. Random ops (a compiled function
//! would repeat a trace's random draws), slices (the relative form keeps no slice ranges),
//! quantized tensors and custom ops end a block and run op by op. A block ends
//! after 256 ops (`BURN_MLX_OP_STREAM_OPS`, 0 for no limit), and a compiled block's outputs start
//! evaluating at once (`BURN_MLX_OP_STREAM_LAUNCH=0` turns that off), so that the device works
//! while Burn records the next block.
//!
//! **Measured, not the default.** On an H200 `Autodiff<MlxFused>` ran the `gpu_bench` training
//! steps at 0.73x / 1.06x / 0.80x / 1.07x the speed of `Autodiff<Mlx>` (MLP / CNN / Transformer /
//! decoder LM, medians of four processes): burn-fusion's recording costs more host time per op
//! than building MLX arrays, and the compiled blocks still launch as many kernels as Burn's
//! backward graph has. docs/fusion.md gives the breakdown; `gpu_bench --op-stream` reproduces it.
//! On this project's 2-core CPU, one process of an early version ran the MLP step slower than
//! `Autodiff<Mlx>` (13.3 against 9.2 ms). Use it where it measures faster
//! (the CNN and decoder LM steps, narrowly), or as the base for experiments with Burn's op stream.
//!
//! ```no_run
//! use burn_autodiff::Autodiff;
//! use burn_mlx::MlxFused;
//! type TrainBackend = Autodiff<MlxFused>;
//! ```

mod block;
mod fuser;
mod step;

use crate::backend::Mlx;
use crate::device::MlxDevice;
use crate::tensor::MlxTensor;
use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor, QuantizedTensor};
use burn_backend::DType;
use burn_fusion::{FusionBackend, FusionRuntime, OperationFuser};
use burn_ir::{BackendIr, TensorHandle};

pub use step::{op_stream_stats, OpStreamStats, StepOptimization};

/// How blocks are cut and launched, read once from the environment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// `BURN_MLX_OP_STREAM_OPS`: the most ops in one block (default 256; 0: a block runs until an
    /// op that cannot be compiled, or until a value is read).
    pub max_ops: usize,
    /// `BURN_MLX_OP_STREAM_LAUNCH` (default 1; 0: off): start evaluating a compiled block's
    /// outputs as soon as it has run (MLX's `async_eval`), so that the device works while later
    /// ops are recorded.
    pub launch: bool,
}

pub(crate) fn settings() -> Settings {
    static SETTINGS: std::sync::OnceLock<Settings> = std::sync::OnceLock::new();
    *SETTINGS.get_or_init(|| Settings {
        max_ops: std::env::var("BURN_MLX_OP_STREAM_OPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(256),
        launch: std::env::var("BURN_MLX_OP_STREAM_LAUNCH").map_or(true, |v| v != "0"),
    })
}

/// Burn's fusion backend over [`Mlx`]: ops are recorded, and recurring blocks of them run as
/// MLX-compiled functions (see the [module docs](self)).
pub type MlxFused = burn_fusion::Fusion<Mlx>;

/// The [`FusionRuntime`] of [`MlxFused`]: MLX arrays as handles, and one fuser that takes every
/// op it can compile.
#[derive(Debug)]
pub struct MlxFusionRuntime;

impl FusionRuntime for MlxFusionRuntime {
    type OptimizationState = Vec<burn_ir::OperationIr>;
    type Optimization = StepOptimization;
    type FusionHandle = MlxTensor;
    type FusionDevice = MlxDevice;

    fn fusers(device: MlxDevice) -> Vec<Box<dyn OperationFuser<StepOptimization>>> {
        vec![Box::new(fuser::StepFuser::new(device))]
    }
}

impl BackendIr for Mlx {
    type Handle = MlxTensor;

    fn float_tensor(handle: TensorHandle<MlxTensor>) -> FloatTensor<Self> {
        handle.handle
    }

    fn int_tensor(handle: TensorHandle<MlxTensor>) -> IntTensor<Self> {
        handle.handle
    }

    fn bool_tensor(handle: TensorHandle<MlxTensor>) -> BoolTensor<Self> {
        handle.handle
    }

    fn quantized_tensor(handle: TensorHandle<MlxTensor>) -> QuantizedTensor<Self> {
        handle.handle
    }

    fn float_tensor_handle(tensor: FloatTensor<Self>) -> MlxTensor {
        tensor
    }

    fn int_tensor_handle(tensor: IntTensor<Self>) -> MlxTensor {
        tensor
    }

    fn bool_tensor_handle(tensor: BoolTensor<Self>) -> MlxTensor {
        tensor
    }

    fn quantized_tensor_handle(tensor: QuantizedTensor<Self>) -> MlxTensor {
        tensor
    }
}

impl FusionBackend for Mlx {
    type FusionRuntime = MlxFusionRuntime;
    type FullPrecisionBackend = Mlx;

    fn cast_float(tensor: FloatTensor<Self>, dtype: DType) -> MlxTensor {
        <Mlx as burn_backend::ops::FloatTensorOps<Mlx>>::float_cast(tensor, dtype.into())
    }
}
