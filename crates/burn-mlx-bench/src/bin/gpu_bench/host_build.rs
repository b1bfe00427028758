//! `--host-build`: the host time of building one training step's lazy graph, by phase, with
//! nothing evaluated. On a GPU this time is spent before the device gets any work; it is the part
//! of a step that an evaluation-time pass (burn-mlx's fusion) cannot remove (docs/fusion.md,
//! "The table in one machine, and where a step's graph-building time goes").

use crate::AD;
use burn::module::AutodiffModule;
use burn_mlx::Mlx;
use burn_mlx_models::steps::{InnerLoss, StepVisitor};
use burn_optim::{AdamConfig, GradientsParams, Optimizer};
use burn_tensor::Tensor;
use std::time::{Duration, Instant};

/// Builds each workload's Adam step (forward, backward, `GradientsParams`, Adam) from the same
/// weights and Adam state again and again, drops it unevaluated, and prints the median of each
/// phase.
pub struct HostBuild {
    /// How long each workload's builds run (at least 5 builds).
    pub budget: Duration,
}

impl StepVisitor<AD> for HostBuild {
    fn visit<M: AutodiffModule<AD>>(
        &mut self,
        name: &'static str,
        model: M,
        loss: &dyn Fn(&M) -> Tensor<AD, 1>,
        _inner_loss: InnerLoss<M::InnerModule, Mlx>,
    ) where
        M::InnerModule: 'static,
    {
        // One evaluated step first, so that Adam has its moments, as in every later step.
        let mut optim = AdamConfig::new().init::<AD, M>();
        let l = loss(&model);
        let grads = GradientsParams::from_grads(l.backward(), &model);
        let model = optim.step(1e-3, model, grads);
        let _ = l.into_scalar();

        let mut phases: Vec<[Duration; 4]> = Vec::new();
        let start = Instant::now();
        while phases.len() < 5 || start.elapsed() < self.budget {
            let t = Instant::now();
            let l = loss(&model);
            let forward = t.elapsed();
            let grads = l.backward();
            let backward = t.elapsed();
            let grads = GradientsParams::from_grads(grads, &model);
            let mut step_optim = optim.clone();
            let stepped = step_optim.step(1e-3, model.clone(), grads);
            let adam = t.elapsed();
            drop((stepped, step_optim, l));
            let dropped = t.elapsed();
            phases.push([forward, backward - forward, adam - backward, dropped - adam]);
        }
        let median = |i: usize| {
            let mut v: Vec<f64> = phases.iter().map(|p| p[i].as_secs_f64() * 1e3).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!(
            "{name:<28} graph built in ms (medians of {} builds, nothing evaluated): forward \
             {:.3}, backward {:.3}, Adam {:.3}, dropping it {:.3}",
            phases.len(),
            median(0),
            median(1),
            median(2),
            median(3)
        );
    }
}
