//! [`FusedAdaptor`]: burn-optim's `OptimizerAdaptor` for [`Adam`](super::Adam) and
//! [`AdamW`](super::AdamW), updating the parameters in buckets.
//!
//! burn-optim's adaptor hands the optimizer one parameter at a time, so an update that is one
//! kernel per parameter still launches one per parameter: over a Transformer's hundred
//! parameters, most of them biases and norm weights of a few hundred values, the launches and
//! their host work cost more than the arithmetic. This adaptor first collects every parameter
//! that has a gradient, then updates those of one device, dtype and step number together
//! ([`update_buckets`](super::update_buckets): one custom CUDA kernel per bucket of up to 8 on
//! MLX's CUDA device, one MLX-compiled function per bucket elsewhere), then puts the results
//! back into the module. The values are those of the per-parameter update.
//!
//! Its record is burn-optim's (`HashMap<ParamId, AdaptorRecord<O, B>>`), so optimizer
//! checkpoints move between it and burn-optim's `OptimizerAdaptor` of the same optimizer.
//! Parameters that cannot take the bucketed update (another backend, MLX's CPU device without
//! [`crate::nn::fuse_on_cpu`], AMSGrad state) take the optimizer's own per-parameter step.

use super::{update_buckets, Bucketed};
use crate::interop::{from_mlx, to_mlx};
use crate::tensor::MlxTensor;
use burn_core::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn_optim::adaptor::GradAdaptor;
use burn_optim::grad_clipping::GradientClipping;
use burn_optim::record::AdaptorRecord;
use burn_optim::{
    AdaptiveMomentumState, GradientsParams, LearningRate, MultiGradientsParams, Optimizer,
};
use burn_tensor::backend::AutodiffBackend;
use burn_tensor::Tensor;
use hashbrown::HashMap;
use std::any::Any;
use std::marker::PhantomData;

/// An optimizer over modules `M` of autodiff backend `B` whose update runs for buckets of
/// parameters: each step collects the parameters that have a gradient, updates those of one
/// device, dtype and step number together (one kernel or compiled MLX function a bucket), and
/// puts the results back, with the values of the per-parameter update. Its record is
/// burn-optim's adaptor record, so checkpoints move between it and burn-optim's
/// `OptimizerAdaptor`. Made by [`AdamConfig::init`](super::AdamConfig::init) and
/// [`AdamWConfig::init`](super::AdamWConfig::init).
#[derive(Clone)]
pub struct FusedAdaptor<O, M, B>
where
    O: Bucketed<B::InnerBackend>,
    M: AutodiffModule<B>,
    B: AutodiffBackend,
{
    optim: O,
    records: HashMap<ParamId, AdaptorRecord<O, B>>,
    grad_clipping: Option<GradientClipping>,
    module: PhantomData<M>,
}

impl<O, M, B> FusedAdaptor<O, M, B>
where
    O: Bucketed<B::InnerBackend>,
    M: AutodiffModule<B>,
    B: AutodiffBackend,
{
    /// The adaptor of `optim`, with no state yet.
    pub fn new(optim: O) -> Self {
        Self {
            optim,
            records: HashMap::new(),
            grad_clipping: None,
            module: PhantomData,
        }
    }

    /// The adaptor clipping each gradient with `clipping` before the update.
    pub fn with_grad_clipping(mut self, clipping: GradientClipping) -> Self {
        self.grad_clipping = Some(clipping);
        self
    }

    /// The per-parameter optimizer.
    pub fn optim(&self) -> &O {
        &self.optim
    }

    fn step_common(&mut self, lr: LearningRate, module: M, mut grads: GradAdaptor) -> M {
        let mut collect = Collect::<O, B> {
            optim: &self.optim,
            records: &mut self.records,
            grads: &mut grads,
            clipping: self.grad_clipping.as_ref(),
            lr,
            bucketed: Vec::new(),
            done: HashMap::new(),
        };
        module.visit(&mut collect);
        let Collect {
            bucketed, mut done, ..
        } = collect;
        let updated = update_buckets(&self.optim, lr, &bucketed);
        let mut results: HashMap<ParamId, Updated> = HashMap::with_capacity(bucketed.len());
        for (entry, [p, m, v]) in bucketed.into_iter().zip(updated) {
            results.insert(
                entry.id,
                Updated {
                    p,
                    m,
                    v,
                    time: entry.time,
                },
            );
        }
        module.map(&mut Replace::<O, B> {
            records: &mut self.records,
            results: &mut results,
            done: &mut done,
        })
    }
}

impl<O, M, B> Optimizer<M, B> for FusedAdaptor<O, M, B>
where
    O: Bucketed<B::InnerBackend>,
    M: AutodiffModule<B>,
    B: AutodiffBackend,
{
    type Record = HashMap<ParamId, AdaptorRecord<O, B>>;

    fn step(&mut self, lr: LearningRate, module: M, grads: GradientsParams) -> M {
        self.step_common(lr, module, grads.into())
    }

    fn step_multi(&mut self, lr: LearningRate, module: M, grads: MultiGradientsParams) -> M {
        self.step_common(lr, module, grads.into())
    }

    fn to_record(&self) -> Self::Record {
        self.records.clone()
    }

    fn load_record(mut self, record: Self::Record) -> Self {
        self.records = record;
        self
    }
}

/// A parameter that takes the bucketed update: its value, gradient, moments (zeros before its
/// first step) and the step number of this update.
pub(super) struct Entry {
    pub(super) id: ParamId,
    pub(super) p: MlxTensor,
    pub(super) g: MlxTensor,
    pub(super) m: MlxTensor,
    pub(super) v: MlxTensor,
    pub(super) time: usize,
}

/// A parameter's new value and moments, and its step number.
struct Updated {
    p: MlxTensor,
    m: MlxTensor,
    v: MlxTensor,
    time: usize,
}

/// The first pass: takes each parameter's gradient and state, and either collects it for the
/// buckets or runs the optimizer's own step on it (kept in `done` as `(Tensor<Inner, D>,
/// require_grad)`).
struct Collect<'a, O: Bucketed<B::InnerBackend>, B: AutodiffBackend> {
    optim: &'a O,
    records: &'a mut HashMap<ParamId, AdaptorRecord<O, B>>,
    grads: &'a mut GradAdaptor,
    clipping: Option<&'a GradientClipping>,
    lr: LearningRate,
    bucketed: Vec<Entry>,
    done: HashMap<ParamId, Box<dyn Any>>,
}

impl<O: Bucketed<B::InnerBackend>, B: AutodiffBackend> ModuleVisitor<B> for Collect<'_, O, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let id = param.id;
        let Some((grad, device)) = self.grads.remove::<B::InnerBackend, D>(id) else {
            return;
        };
        let tensor = param.val().inner();
        let tensor = if tensor.device() != device {
            tensor.to_device(&device)
        } else {
            tensor
        };
        let grad = match self.clipping {
            Some(c) => c.clip_gradient(grad),
            None => grad,
        };
        let state = self
            .records
            .remove(&id)
            .map(|r| O::to_device(r.into_state::<D>(), &device));
        if O::bucketed(&tensor, state.as_ref()) {
            let as_mlx = |t: Tensor<B::InnerBackend, D>| {
                to_mlx(t).unwrap_or_else(|_| unreachable!("bucketed parameters are Mlx's"))
            };
            let p = as_mlx(tensor);
            let (time, m, v) = super::moments(&p, state.map(O::into_momentum));
            self.bucketed.push(Entry {
                id,
                p,
                g: as_mlx(grad),
                m,
                v,
                time,
            });
        } else {
            let (tensor, state) = self.optim.step(self.lr, tensor, grad, state);
            if let Some(state) = state {
                self.records.insert(id, AdaptorRecord::from_state(state));
            }
            self.done.insert(id, Box::new(tensor));
        }
    }
}

/// The second pass: puts the new values into the module (as tensors that require gradients,
/// as burn-optim's adaptor does) and the new states into the records.
struct Replace<'a, O: Bucketed<B::InnerBackend>, B: AutodiffBackend> {
    records: &'a mut HashMap<ParamId, AdaptorRecord<O, B>>,
    results: &'a mut HashMap<ParamId, Updated>,
    done: &'a mut HashMap<ParamId, Box<dyn Any>>,
}

impl<O: Bucketed<B::InnerBackend>, B: AutodiffBackend> ModuleMapper<B> for Replace<'_, O, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let inner = if let Some(u) = self.results.remove(&id) {
            let back = |t: MlxTensor| {
                from_mlx::<B::InnerBackend, D, burn_tensor::Float>(t)
                    .unwrap_or_else(|| unreachable!("bucketed parameters are Mlx's"))
            };
            let momentum = AdaptiveMomentumState::new(u.time, back(u.m), back(u.v));
            self.records
                .insert(id, AdaptorRecord::from_state(O::from_momentum(momentum)));
            Some(back(u.p))
        } else {
            self.done.remove(&id).map(|t| {
                *t.downcast::<Tensor<B::InnerBackend, D>>()
                    .unwrap_or_else(|_| unreachable!("the first pass kept this parameter's rank"))
            })
        };
        let tensor = match inner {
            Some(inner) => {
                let require_grad = tensor.is_require_grad();
                let t = Tensor::from_inner(inner);
                if require_grad {
                    t.require_grad()
                } else {
                    t
                }
            }
            None => tensor,
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}
