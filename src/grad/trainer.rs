//! Whole training steps with MLX's autodiff and a Burn optimizer.

use super::params::tensor;
use super::value_and_grad::loss_and_grads;
use crate::backend::Mlx;
use crate::device::MlxDevice;
use crate::error::MlxError;
use burn_core::module::{Module, ModuleMapper, Param};
use burn_optim::{LearningRate, SimpleOptimizer};
use burn_tensor::Tensor;
use mlx_rs::Array;
use std::any::Any;

/// A model, a Burn [`SimpleOptimizer`] and the optimizer's state per parameter: each
/// [`step`](Self::step) runs the loss, MLX's backward pass and the optimizer's update (see the
/// [module docs](super)). Like Burn's loop on `Autodiff<Mlx>`, a step builds the update lazily:
/// reading the loss evaluates this step's forward and backward passes, and the update is
/// evaluated with the next step or when the model is read.
pub struct Trainer<M, O> {
    model: M,
    optimizer: O,
    /// Each parameter's optimizer state, by visiting order (`None` before its first update).
    states: Vec<Option<Box<dyn Any + Send>>>,
}

impl<M: Module<Mlx>, O: SimpleOptimizer<Mlx>> Trainer<M, O> {
    /// Trains `model` with `optimizer` (for example `AdamConfig::new().build()`).
    pub fn new(model: M, optimizer: O) -> Self {
        Self {
            model,
            optimizer,
            states: Vec::new(),
        }
    }

    /// One step at learning rate `lr`: the loss of the current model, the gradient of every
    /// float parameter, and the optimizer's update of each. Returns the loss (lazy).
    ///
    /// # Errors
    ///
    /// As [`value_and_grad`](super::value_and_grad); the model is left as it was.
    pub fn step(
        &mut self,
        lr: LearningRate,
        loss: impl Fn(&M) -> Tensor<Mlx, 1>,
    ) -> Result<Tensor<Mlx, 1>, MlxError> {
        let (value, grads, device) = loss_and_grads(&self.model, &loss)?;
        self.states.resize_with(grads.len(), || None);
        let mut update = Update {
            optimizer: &self.optimizer,
            lr,
            grads: &grads,
            states: &mut self.states,
            next: 0,
            device,
        };
        self.model = self.model.clone().map(&mut update);
        Ok(tensor(value, device))
    }

    /// The model as trained so far.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The trained model.
    pub fn into_model(self) -> M {
        self.model
    }
}

/// The optimizer's update of every float parameter with its gradient (visiting order); each
/// parameter's state is kept at its position, whatever the parameter's rank.
struct Update<'a, O> {
    optimizer: &'a O,
    lr: LearningRate,
    grads: &'a [Array],
    states: &'a mut Vec<Option<Box<dyn Any + Send>>>,
    next: usize,
    device: MlxDevice,
}

impl<O: SimpleOptimizer<Mlx>> ModuleMapper<Mlx> for Update<'_, O> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<Mlx, D>>) -> Param<Tensor<Mlx, D>> {
        let (id, value, mapper) = param.consume();
        let i = self.next;
        self.next += 1;
        let grad = tensor::<D>(self.grads[i].clone(), self.device);
        let state = self.states[i].take().map(|s| {
            *s.downcast::<O::State<D>>()
                .unwrap_or_else(|_| unreachable!("parameter {i} keeps its rank"))
        });
        let (value, state) = self.optimizer.step(self.lr, value, grad, state);
        self.states[i] = state.map(|s| Box::new(s) as Box<dyn Any + Send>);
        Param::from_mapped_value(id, value, mapper)
    }
}
