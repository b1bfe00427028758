//! Data-parallel glue between Burn's modules and optimizer gradients and
//! `burn_mlx::distributed`: average a step's `GradientsParams` over the ranks, and start every
//! rank from rank 0's parameters.
//!
//! burn-optim's `GradientsParams` keeps each gradient under its parameter id, with the tensor
//! rank as a type parameter, so the gradients are taken out and put back by visiting the module
//! (the same order on every rank, since every rank runs the same model code), and averaged in
//! between by [`GradientAllReduce`], a few bucketed all_sums for the whole model.
//!
//! In a hand-written loop:
//!
//! ```ignore
//! let grads = GradientsParams::from_grads(loss.backward(), &model);
//! let grads = all_reduce_gradients(&group, &reducer, &model, grads)?;
//! model = optim.step(lr, model, grads); // the same step on every rank
//! ```
//!
//! With burn-train's `Learner`: call [`all_reduce_gradients`] at the end of the model's
//! `TrainStep::step`, before returning `TrainOutput::new(self, grads, item)`, and give each
//! rank's data loader its own shard (for example `PartialDataset` over
//! `rank * n / size..(rank + 1) * n / size`). The Learner stays a single-device Learner on each
//! rank; its optimizer then sees averaged gradients. What it does not do by itself: stop ranks
//! other than 0 from writing checkpoints and metrics (give them another artifact folder), and
//! keep the number of batches per epoch equal on every rank (equal shard sizes, `drop_last`);
//! `step` cannot return an error, so a failed all-reduce there panics with the error's message.
//! Burn's own multi-device strategies (`LearningStrategy::MultiDevice`, burn-collective) do not
//! apply: they assume every device in one process.

use burn_core::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn_core::tensor::backend::AutodiffBackend;
use burn_core::tensor::{Tensor, TensorPrimitive};
use burn_mlx::distributed::{DistributedError, GradientAllReduce, Group};
use burn_mlx::{Mlx, MlxTensor};
use burn_optim::GradientsParams;
use std::collections::HashMap;
use std::marker::PhantomData;

/// Averages `grads` (of `module`'s parameters) over the ranks of `group`: afterwards every rank
/// holds the mean of all ranks' gradients, so the optimizer takes the same step everywhere.
/// Every rank must call it at the same point with the same model.
pub fn all_reduce_gradients<B, M>(
    group: &Group,
    reducer: &GradientAllReduce,
    module: &M,
    mut grads: GradientsParams,
) -> Result<GradientsParams, DistributedError>
where
    B: AutodiffBackend<InnerBackend = Mlx>,
    M: AutodiffModule<B>,
{
    if group.size() == 1 {
        return Ok(grads);
    }
    let mut take = TakeGrads::<B> {
        grads: &mut grads,
        ids: Vec::new(),
        tensors: Vec::new(),
        backend: PhantomData,
    };
    module.visit(&mut take);
    let (ids, tensors) = (take.ids, take.tensors);
    let averaged = reducer.all_mean(group, tensors)?;
    let mut put = PutGrads::<B> {
        grads: &mut grads,
        by_id: ids.into_iter().zip(averaged).collect(),
        backend: PhantomData,
    };
    module.visit(&mut put);
    Ok(grads)
}

/// Replaces every float parameter of `module` with rank `root`'s value (bit for bit), so that
/// all ranks start from the same model whatever their own initialisation was.
pub fn broadcast_module<B, M>(
    group: &Group,
    reducer: &GradientAllReduce,
    module: M,
    root: usize,
) -> Result<M, DistributedError>
where
    B: AutodiffBackend<InnerBackend = Mlx>,
    M: AutodiffModule<B>,
{
    if group.size() == 1 {
        return Ok(module);
    }
    let mut collect = CollectParams::<B> {
        tensors: Vec::new(),
        backend: PhantomData,
    };
    module.visit(&mut collect);
    let synced = reducer.broadcast(group, collect.tensors, root)?;
    let mut replace = ReplaceParams::<B> {
        next: synced.into_iter(),
        backend: PhantomData,
    };
    Ok(module.map(&mut replace))
}

/// Takes each parameter's gradient out of `GradientsParams`, in the module's order.
struct TakeGrads<'a, B> {
    grads: &'a mut GradientsParams,
    ids: Vec<ParamId>,
    tensors: Vec<MlxTensor>,
    backend: PhantomData<B>,
}

impl<B: AutodiffBackend<InnerBackend = Mlx>> ModuleVisitor<B> for TakeGrads<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(grad) = self.grads.remove::<Mlx, D>(param.id) {
            self.ids.push(param.id);
            self.tensors.push(grad.into_primitive().tensor());
        }
    }
}

/// Puts the averaged gradients back under their parameter ids, with their tensor rank.
struct PutGrads<'a, B> {
    grads: &'a mut GradientsParams,
    by_id: HashMap<ParamId, MlxTensor>,
    backend: PhantomData<B>,
}

impl<B: AutodiffBackend<InnerBackend = Mlx>> ModuleVisitor<B> for PutGrads<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(grad) = self.by_id.remove(&param.id) {
            let grad = Tensor::<Mlx, D>::from_primitive(TensorPrimitive::Float(grad));
            self.grads.register::<Mlx, D>(param.id, grad);
        }
    }
}

/// The float parameters' values, in the module's order.
struct CollectParams<B> {
    tensors: Vec<MlxTensor>,
    backend: PhantomData<B>,
}

impl<B: AutodiffBackend<InnerBackend = Mlx>> ModuleVisitor<B> for CollectParams<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.tensors
            .push(param.val().inner().into_primitive().tensor());
    }
}

/// Replaces the float parameters, in the module's order, keeping ids and `require_grad`.
struct ReplaceParams<B> {
    next: std::vec::IntoIter<MlxTensor>,
    backend: PhantomData<B>,
}

impl<B: AutodiffBackend<InnerBackend = Mlx>> ModuleMapper<B> for ReplaceParams<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let value = self
            .next
            .next()
            .expect("the module has as many parameters as were collected from it");
        param.map(|old| {
            let inner = Tensor::<Mlx, D>::from_primitive(TensorPrimitive::Float(value));
            let new = Tensor::<B, D>::from_inner(inner);
            if old.is_require_grad() {
                new.require_grad()
            } else {
                new
            }
        })
    }
}
