//! `--mlx-autodiff`: what MLX's own reverse-mode autodiff would give Burn + `Mlx`, measured on
//! the same four training steps (docs/fusion.md, "MLX's own autodiff in place of Burn's").
//!
//! Burn's `Autodiff<Mlx>` records a backward node per Burn op and builds the gradient from
//! Burn's formulas, op by op. Here Burn's forward pass runs on plain `Mlx` under
//! `mlx_rs::transforms::vjp`, which differentiates the MLX graph with MLX's own rules (one
//! `Softmax` primitive and its gradient instead of Burn's composed softmax, for example). The
//! gradients go to Burn's own Adam (`AdamConfig::build`, a `SimpleOptimizer`), parameter by
//! parameter, so the update is the same ops as in the `Autodiff<Mlx>` step. This is a
//! measurement, not a backend: a user would call it instead of `backward()`.

use crate::steps::median_secs;
use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn_mlx::{from_mlx, pending_primitives, to_mlx, Mlx, MlxDevice, MlxTensor};
use burn_optim::{Adam, AdamConfig, GradientsParams, SimpleOptimizer};
use burn_tensor::backend::AutodiffBackend;
use burn_tensor::Tensor;
use mlx_rs::Array;
use std::any::Any;
use std::time::Duration;

/// The MLX arrays behind a module's float parameters, in visiting order.
struct Arrays(Vec<Array>);

impl ModuleVisitor<Mlx> for Arrays {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Mlx, D>>) {
        let t = to_mlx(param.val()).expect("an Mlx tensor");
        self.0.push(t.array().clone());
    }
}

/// Puts `arrays` in place of a module's float parameters, in visiting order.
struct Replace<'a> {
    arrays: &'a [Array],
    next: usize,
    device: MlxDevice,
}

impl ModuleMapper<Mlx> for Replace<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<Mlx, D>>) -> Param<Tensor<Mlx, D>> {
        let (id, _, mapper) = param.consume();
        let array = self.arrays[self.next].clone();
        self.next += 1;
        let t = from_mlx(MlxTensor::from_array(array, self.device)).expect("a float tensor");
        Param::from_mapped_value(id, t, mapper)
    }
}

/// Burn's Adam applied to every float parameter with its gradient (by visiting order); each
/// parameter's optimizer state is kept at its position, whatever its rank.
struct AdamUpdate<'a> {
    adam: &'a Adam,
    lr: f64,
    grads: &'a [Array],
    states: &'a mut Vec<Option<Box<dyn Any>>>,
    next: usize,
    device: MlxDevice,
}

impl ModuleMapper<Mlx> for AdamUpdate<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<Mlx, D>>) -> Param<Tensor<Mlx, D>> {
        let (id, tensor, mapper) = param.consume();
        let i = self.next;
        self.next += 1;
        let grad = from_mlx(MlxTensor::from_array(self.grads[i].clone(), self.device))
            .expect("a float tensor");
        let state = self.states[i].take().map(|s| {
            *s.downcast::<<Adam as SimpleOptimizer<Mlx>>::State<D>>()
                .expect("the same parameter's state")
        });
        let (tensor, state) = SimpleOptimizer::<Mlx>::step(self.adam, self.lr, tensor, grad, state);
        self.states[i] = state.map(|s| Box::new(s) as Box<dyn Any>);
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// A model trained with MLX's autodiff and Burn's Adam.
pub struct MlxAutodiffStep<M> {
    model: M,
    adam: Adam,
    states: Vec<Option<Box<dyn Any>>>,
    device: MlxDevice,
}

impl<M: Module<Mlx> + Clone> MlxAutodiffStep<M> {
    /// Starts from `model` with a fresh Adam (Burn's defaults, as in `step_secs`).
    pub fn new(model: M, device: MlxDevice) -> Self {
        Self {
            model,
            adam: AdamConfig::new().build(),
            states: Vec::new(),
            device,
        }
    }

    /// The loss and the gradient of every float parameter (visiting order), through MLX's vjp.
    pub fn loss_and_grads(&self, loss: &dyn Fn(&M) -> Tensor<Mlx, 1>) -> (Array, Vec<Array>) {
        let mut arrays = Arrays(Vec::new());
        self.model.visit(&mut arrays);
        let f = |xs: &[Array]| {
            let m = self.model.clone().map(&mut Replace {
                arrays: xs,
                next: 0,
                device: self.device,
            });
            vec![to_mlx(loss(&m)).expect("an Mlx tensor").array().clone()]
        };
        let seed = Array::from_slice(&[1.0f32], &[1]);
        let (mut out, grads) =
            mlx_rs::transforms::vjp(f, &arrays.0, &[seed]).expect("MLX's vjp of the loss");
        (out.remove(0), grads)
    }

    /// One training step (forward, backward, Adam), leaving the update lazy as Burn's loop
    /// does; returns the loss, not yet evaluated.
    pub fn step(&mut self, loss: &dyn Fn(&M) -> Tensor<Mlx, 1>) -> Tensor<Mlx, 1> {
        let (value, grads) = self.loss_and_grads(loss);
        self.states.resize_with(grads.len(), || None);
        self.model = self.model.clone().map(&mut AdamUpdate {
            adam: &self.adam,
            lr: 1e-3,
            grads: &grads,
            states: &mut self.states,
            next: 0,
            device: self.device,
        });
        from_mlx(MlxTensor::from_array(value, self.device)).expect("a float tensor")
    }

    /// The model's parameters, as MLX tensors (to count or evaluate them).
    pub fn params(&self) -> Vec<MlxTensor> {
        let mut arrays = Arrays(Vec::new());
        self.model.visit(&mut arrays);
        arrays
            .0
            .into_iter()
            .map(|a| MlxTensor::from_array(a, self.device))
            .collect()
    }
}

/// Median seconds per step of [`MlxAutodiffStep`], timed like `steps::step_secs` (the loss read
/// back each step, `warmup` untimed steps first).
pub fn step_secs<M: Module<Mlx> + Clone>(
    model: M,
    device: MlxDevice,
    warmup: usize,
    budget: Duration,
    loss: &dyn Fn(&M) -> Tensor<Mlx, 1>,
) -> f64 {
    let mut trainer = MlxAutodiffStep::new(model, device);
    median_secs(warmup, budget, || {
        let _ = trainer.step(loss).into_scalar();
    })
}

/// Primitives of one steady-state step (forward, backward, Adam: the updated parameters and
/// the loss), as `main.rs`'s `step_primitives` counts Burn's.
pub fn step_primitives<M: Module<Mlx> + Clone>(
    model: M,
    device: MlxDevice,
    loss: &dyn Fn(&M) -> Tensor<Mlx, 1>,
) -> usize {
    let mut trainer = MlxAutodiffStep::new(model, device);
    let l = to_mlx(trainer.step(loss)).expect("an Mlx tensor");
    for t in trainer.params().iter().chain([&l]) {
        t.eval().expect("the first step evaluates");
    }
    let l = to_mlx(trainer.step(loss)).expect("an Mlx tensor");
    let mut all = trainer.params();
    all.push(l);
    let refs: Vec<&MlxTensor> = all.iter().collect();
    pending_primitives(&refs)
        .expect("counting the step's primitives")
        .values()
        .sum()
}

/// The largest difference between Burn's gradients (`Autodiff`) and MLX's for the same model
/// and batch, and the largest gradient, over every float parameter.
pub fn gradient_gap<B, M>(
    model: &M,
    loss: &dyn Fn(&M) -> Tensor<B, 1>,
    inner_loss: &dyn Fn(&M::InnerModule) -> Tensor<Mlx, 1>,
    device: MlxDevice,
) -> (f32, f32)
where
    B: AutodiffBackend<InnerBackend = Mlx>,
    M: AutodiffModule<B>,
{
    let grads = GradientsParams::from_grads(loss(model).backward(), model);
    // Burn's gradients, in the same visiting order as the inner module's parameters.
    struct Burn<'a, B: AutodiffBackend>(
        &'a GradientsParams,
        Vec<Option<Array>>,
        std::marker::PhantomData<B>,
    );
    impl<B: AutodiffBackend<InnerBackend = Mlx>> ModuleVisitor<B> for Burn<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let g = self.0.get::<Mlx, D>(param.id);
            self.1
                .push(g.map(|g| to_mlx(g).expect("an Mlx tensor").array().clone()));
        }
    }
    let mut burn = Burn::<B>(&grads, Vec::new(), std::marker::PhantomData);
    model.visit(&mut burn);
    let (_, mlx) = MlxAutodiffStep::new(model.valid(), device).loss_and_grads(inner_loss);
    let (mut gap, mut scale) = (0.0f32, 0.0f32);
    for (b, m) in burn.1.iter().zip(&mlx) {
        let b = b.as_ref().expect("every parameter has a Burn gradient");
        let max = |a: &Array| {
            a.abs()
                .and_then(|a| a.max(None))
                .and_then(|a| a.as_dtype(mlx_rs::Dtype::Float32))
                .expect("the largest magnitude")
                .item_exact::<f32>()
        };
        gap = gap.max(max(&b.subtract(m).expect("same shapes")));
        scale = scale.max(max(b));
    }
    (gap, scale)
}
