//! `--mlx-autodiff`: the four training steps with MLX's own autodiff (`burn_mlx::grad`) in
//! place of Burn's `Autodiff<Mlx>`, with the same Burn Adam, step by step and with the whole
//! step compiled, for the comparison in benches/nvidia.md and docs/fusion.md.

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn_mlx::grad::{value_and_grad, AdamSettings, CompiledTrainer, Trainer};
use burn_mlx::{pending_primitives, to_mlx, Mlx, MlxTensor};
use burn_mlx_models::steps::median_secs;
use burn_mlx_models::steps::InnerLoss;
use burn_optim::{AdamConfig, GradientsParams};
use burn_tensor::backend::AutodiffBackend;
use burn_tensor::Tensor;
use std::time::Duration;

/// The MLX tensors behind a module's float parameters.
struct Params(Vec<MlxTensor>);

impl ModuleVisitor<Mlx> for Params {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Mlx, D>>) {
        self.0.push(to_mlx(param.val()).expect("an Mlx tensor"));
    }
}

/// A trainer with Burn's default Adam, as `steps::step_secs` uses.
fn trainer<M: Module<Mlx>>(model: M) -> Trainer<M, burn_optim::Adam> {
    Trainer::new(model, AdamConfig::new().build())
}

/// Median seconds per step (forward, MLX's backward, Adam, the loss read back), timed like
/// `steps::step_secs`.
pub fn step_secs<M: Module<Mlx>>(
    model: M,
    warmup: usize,
    budget: Duration,
    loss: &dyn Fn(&M) -> Tensor<Mlx, 1>,
) -> f64 {
    let mut trainer = trainer(model);
    median_secs(warmup, budget, || {
        let value = trainer.step(1e-3, loss).expect("a training step");
        let _ = value.into_scalar();
    })
}

/// Median seconds per step with the whole step compiled by MLX (`CompiledTrainer`, Burn's Adam
/// arithmetic), timed like [`step_secs`]. The workloads' batches never change, so the loss keeps
/// them (a compiled step keeps captured tensors as they were at the first step).
pub fn compiled_step_secs<M: Module<Mlx> + 'static>(
    model: M,
    warmup: usize,
    budget: Duration,
    loss: InnerLoss<M, Mlx>,
) -> f64 {
    let mut trainer = CompiledTrainer::new(model, AdamSettings::default(), move |m: &M, _| loss(m))
        .expect("a model with parameters");
    median_secs(warmup, budget, || {
        let value = trainer.step(1e-3, &[]).expect("a compiled training step");
        let _ = value.into_scalar();
    })
}

/// The compiled step against the step-by-step one: both train a copy of `model` for 3 Adam
/// steps; returns the largest relative difference of their losses and the largest difference
/// of their parameters after the last step.
pub fn compiled_gap<M: Module<Mlx> + 'static>(model: M, loss: InnerLoss<M, Mlx>) -> (f32, f32) {
    let mut plain = trainer(model.clone());
    let traced = loss.clone();
    let mut compiled =
        CompiledTrainer::new(model, AdamSettings::default(), move |m: &M, _| traced(m))
            .expect("a model with parameters");
    let mut loss_gap = 0.0f32;
    for _ in 0..3 {
        let a: f32 = plain.step(1e-3, &*loss).expect("a step").into_scalar();
        let b: f32 = compiled
            .step(1e-3, &[])
            .expect("a compiled step")
            .into_scalar();
        loss_gap = loss_gap.max((a - b).abs() / a.abs().max(f32::MIN_POSITIVE));
    }
    struct Values(Vec<f32>);
    impl ModuleVisitor<Mlx> for Values {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Mlx, D>>) {
            let data = param.val().into_data().convert::<f32>();
            self.0.extend(data.to_vec::<f32>().expect("f32 values"));
        }
    }
    let (mut a, mut b) = (Values(vec![]), Values(vec![]));
    plain.model().visit(&mut a);
    compiled.model().visit(&mut b);
    let param_gap =
        a.0.iter()
            .zip(&b.0)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
    (loss_gap, param_gap)
}

/// Primitives of one steady-state step (the updated parameters and the loss), counted as
/// `main.rs`'s `step_primitives` counts Burn's.
pub fn step_primitives<M: Module<Mlx>>(model: M, loss: &dyn Fn(&M) -> Tensor<Mlx, 1>) -> usize {
    let mut trainer = trainer(model);
    let pending = |trainer: &mut Trainer<M, _>| {
        let value = trainer.step(1e-3, loss).expect("a training step");
        let mut params = Params(vec![to_mlx(value).expect("an Mlx tensor")]);
        trainer.model().visit(&mut params);
        params.0
    };
    for t in pending(&mut trainer) {
        t.eval().expect("the first step evaluates");
    }
    let all = pending(&mut trainer);
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
) -> (f32, f32)
where
    B: AutodiffBackend<InnerBackend = Mlx>,
    M: AutodiffModule<B>,
{
    let burn = GradientsParams::from_grads(loss(model).backward(), model);
    let (_, mlx) = value_and_grad(&model.valid(), inner_loss).expect("MLX's gradients");
    struct Gap<'a>(&'a GradientsParams, &'a GradientsParams, f32, f32);
    impl ModuleVisitor<Mlx> for Gap<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Mlx, D>>) {
            let b = self.0.get::<Mlx, D>(param.id).expect("Burn's gradient");
            let m = self.1.get::<Mlx, D>(param.id).expect("MLX's gradient");
            let diff: f32 = (b.clone() - m).abs().max().into_scalar();
            self.2 = self.2.max(diff);
            self.3 = self.3.max(b.abs().max().into_scalar());
        }
    }
    let mut gap = Gap(&burn, &mlx, 0.0, 0.0);
    model.valid().visit(&mut gap);
    (gap.2, gap.3)
}
