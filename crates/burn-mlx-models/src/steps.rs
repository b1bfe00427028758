//! The four training-step workloads (forward, backward, Adam update, loss read back), generic
//! over the autodiff backend, and their timing. `gpu_bench` runs them on `Autodiff<Mlx>`,
//! `peers/burn-cuda` on `Autodiff<Cuda>`; both print and write the same workload names, which
//! `scripts/gpu_reference.py` matches with its PyTorch rows.

use crate::{labels, lm, Cnn, DecoderLm, Encoder, LmBatch, Mlp};
use burn::module::AutodiffModule;
use burn_nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig};
use burn_optim::{AdamConfig, GradientsParams, Optimizer};
use burn_tensor::backend::AutodiffBackend;
use burn_tensor::{Distribution, Int, Tensor};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Name of the MLP workload.
pub const MLP: &str = "MLP step (batch 128)";
/// Name of the CNN workload.
pub const CNN: &str = "CNN step (batch 64)";
/// Name of the Transformer-encoder workload.
pub const TRANSFORMER: &str = "Transformer step (batch 16)";
/// Name of the decoder-LM workload.
pub const DECODER: &str = "Decoder LM step (batch 8)";
/// The workloads in the order they run.
pub const ALL: [&str; 4] = [MLP, CNN, TRANSFORMER, DECODER];

/// The workloads that `names` pick, by the first word of their name (`mlp`, `cnn`,
/// `transformer`, `decoder`, any case); all of them when `names` is empty.
pub fn select(names: &[String]) -> Result<Vec<&'static str>, String> {
    let first = |w: &str| w.split(' ').next().unwrap_or_default().to_lowercase();
    if let Some(bad) = names
        .iter()
        .find(|n| !ALL.iter().any(|w| first(w) == n.to_lowercase()))
    {
        return Err(format!(
            "`{bad}` names no training step (mlp, cnn, transformer, decoder)"
        ));
    }
    Ok(ALL
        .into_iter()
        .filter(|w| names.is_empty() || names.iter().any(|n| n.to_lowercase() == first(w)))
        .collect())
}

/// Warm-up steps before a training step is timed: enough for burn-mlx's automatic fusion to
/// settle (it compiles a structure at its 5th sighting and times the compiled graph over the
/// next 6 evaluations) and for burn-cuda's autotuning and fusion exploration.
pub const STEP_WARMUP: usize = 12;

/// Median seconds per call of `f`, after `warmup` untimed calls, over at least 5 calls and until
/// `budget` has passed (at most 50 calls).
pub fn median_secs(warmup: usize, budget: Duration, mut f: impl FnMut()) -> f64 {
    for _ in 0..warmup {
        f();
    }
    let start = Instant::now();
    let mut times = Vec::new();
    while times.len() < 5 || (start.elapsed() < budget && times.len() < 50) {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(|a, b| a.total_cmp(b));
    times[times.len() / 2]
}

/// A workload's loss on the inner backend's module, owning what it reads (so that MLX's
/// `compile` can keep it).
pub type InnerLoss<M, B> = Rc<dyn Fn(&M) -> Tensor<B, 1>>;

/// What is done with each workload: its model and its loss are handed over.
pub trait StepVisitor<B: AutodiffBackend> {
    /// Called once per workload, in the order of [`ALL`]. `inner_loss` is the same loss on the
    /// inner backend's module (`model.valid()`), without Burn's autodiff.
    fn visit<M: AutodiffModule<B>>(
        &mut self,
        name: &'static str,
        model: M,
        loss: &dyn Fn(&M) -> Tensor<B, 1>,
        inner_loss: InnerLoss<M::InnerModule, B::InnerBackend>,
    ) where
        M::InnerModule: 'static;
}

/// The inputs of the four workloads (made once, reused by every step).
pub struct Workloads<B: AutodiffBackend> {
    device: B::Device,
    ce: CrossEntropyLoss<B>,
    ce_inner: CrossEntropyLoss<B::InnerBackend>,
    mlp_x: Tensor<B, 2>,
    mlp_y: Tensor<B, 1, Int>,
    cnn_x: Tensor<B, 4>,
    cnn_y: Tensor<B, 1, Int>,
    enc_x: Tensor<B, 3>,
    enc_target: Tensor<B, 3>,
    lm: LmBatch<B>,
    lm_inner: LmBatch<B::InnerBackend>,
}

impl<B: AutodiffBackend> Workloads<B> {
    /// Random inputs of each workload's batch on `device`.
    pub fn new(device: &B::Device) -> Self {
        // The Transformer's input and target: batch 16.
        let enc_shape = [16, Encoder::<B>::SEQ, Encoder::<B>::D_MODEL];
        Self {
            device: device.clone(),
            ce: CrossEntropyLossConfig::new().init(device),
            ce_inner: CrossEntropyLossConfig::new().init(device),
            mlp_x: Tensor::random([128, 784], Distribution::Default, device),
            mlp_y: labels(128, device),
            cnn_x: Tensor::random([64, 1, 28, 28], Distribution::Default, device),
            cnn_y: labels(64, device),
            enc_x: Tensor::random(enc_shape, Distribution::Default, device),
            enc_target: Tensor::random(enc_shape, Distribution::Default, device),
            lm: LmBatch::new(device),
            lm_inner: LmBatch::new(device),
        }
    }

    /// Hands each workload `only` names (all when empty) to `visitor`, with a freshly
    /// initialized model.
    pub fn run(&self, only: &[&str], visitor: &mut impl StepVisitor<B>) {
        let wanted = |name: &str| only.is_empty() || only.contains(&name);
        let device = &self.device;
        if wanted(MLP) {
            visitor.visit(
                MLP,
                Mlp::<B>::new(784, 512, 10, device),
                &|m: &Mlp<B>| {
                    self.ce
                        .forward(m.forward(self.mlp_x.clone()), self.mlp_y.clone())
                },
                {
                    let ce = self.ce_inner.clone();
                    let (x, y) = (self.mlp_x.clone().inner(), self.mlp_y.clone().inner());
                    Rc::new(move |m: &Mlp<B::InnerBackend>| {
                        ce.forward(m.forward(x.clone()), y.clone())
                    })
                },
            );
        }
        if wanted(CNN) {
            visitor.visit(
                CNN,
                Cnn::<B>::new(device),
                &|m: &Cnn<B>| {
                    self.ce
                        .forward(m.forward(self.cnn_x.clone()), self.cnn_y.clone())
                },
                {
                    let ce = self.ce_inner.clone();
                    let (x, y) = (self.cnn_x.clone().inner(), self.cnn_y.clone().inner());
                    Rc::new(move |m: &Cnn<B::InnerBackend>| {
                        ce.forward(m.forward(x.clone()), y.clone())
                    })
                },
            );
        }
        if wanted(TRANSFORMER) {
            visitor.visit(
                TRANSFORMER,
                Encoder::<B>::new(device),
                &|m: &Encoder<B>| {
                    let out = m.forward(self.enc_x.clone());
                    (out - self.enc_target.clone()).powi_scalar(2).mean()
                },
                {
                    let (x, target) = (self.enc_x.clone().inner(), self.enc_target.clone().inner());
                    Rc::new(move |m: &Encoder<B::InnerBackend>| {
                        (m.forward(x.clone()) - target.clone())
                            .powi_scalar(2)
                            .mean()
                    })
                },
            );
        }
        if wanted(DECODER) {
            visitor.visit(
                DECODER,
                DecoderLm::<B>::new(device),
                &|m: &DecoderLm<B>| {
                    let logits = m
                        .forward(&self.lm)
                        .reshape([lm::BATCH * lm::SEQ, lm::VOCAB]);
                    self.ce.forward(logits, self.lm.targets.clone())
                },
                {
                    let (ce, batch) = (self.ce_inner.clone(), self.lm_inner.clone());
                    Rc::new(move |m: &DecoderLm<B::InnerBackend>| {
                        let logits = m.forward(&batch).reshape([lm::BATCH * lm::SEQ, lm::VOCAB]);
                        ce.forward(logits, batch.targets.clone())
                    })
                },
            );
        }
    }
}

/// Times each workload's Adam step ([`step_secs`]) and hands the median to a callback.
pub struct Timer<F, P = ()> {
    /// Untimed steps before each workload's timed ones ([`STEP_WARMUP`] for a full run).
    pub warmup: usize,
    /// Time budget of each workload's timed steps.
    pub budget: Duration,
    /// Called with each workload's name and median seconds per step.
    pub on_result: F,
    /// Called around each workload's timed steps.
    pub probe: P,
}

impl<B: AutodiffBackend, F: FnMut(&'static str, f64), P: TimedSteps> StepVisitor<B>
    for Timer<F, P>
{
    fn visit<M: AutodiffModule<B>>(
        &mut self,
        name: &'static str,
        model: M,
        loss: &dyn Fn(&M) -> Tensor<B, 1>,
        _inner_loss: InnerLoss<M::InnerModule, B::InnerBackend>,
    ) where
        M::InnerModule: 'static,
    {
        let secs = step_secs(model, self.warmup, self.budget, loss, &mut self.probe);
        (self.on_result)(name, secs);
    }
}

/// Called around a workload's timed steps, after its warm-up: `gpu_bench` reads burn-mlx's
/// fusion counters there (the one-time compilations fall in the warm-up); other backends have no
/// such counters (`()`).
pub trait TimedSteps {
    /// Before the first timed step.
    fn start(&mut self) {}
    /// After the last timed step, with the number of steps timed.
    fn finish(&mut self, _steps: usize) {}
}

impl TimedSteps for () {}

/// Median seconds per Adam step (forward, backward, update, loss read back) of `model`, after
/// `warmup` untimed steps; `probe` is called around the timed ones.
pub fn step_secs<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: M,
    warmup: usize,
    budget: Duration,
    loss: &dyn Fn(&M) -> Tensor<B, 1>,
    probe: &mut dyn TimedSteps,
) -> f64 {
    let mut model = Some(model);
    let mut optim = AdamConfig::new().init::<B, M>();
    // `GPU_BENCH_TRACE=1`: every step's time, and how much of it went to building the lazy
    // graph (forward, backward, optimizer) before the loss was read back.
    let trace = std::env::var_os("GPU_BENCH_TRACE").is_some();
    let mut step = || {
        let t = Instant::now();
        let m = model
            .take()
            .expect("the model is put back after every step");
        let l = loss(&m);
        let grads = GradientsParams::from_grads(l.backward(), &m);
        let m = optim.step(1e-3, m, grads);
        let built = t.elapsed();
        let _ = l.into_scalar();
        model = Some(m);
        if trace {
            eprintln!(
                "step {:.3} ms (graph built in {:.3} ms)",
                t.elapsed().as_secs_f64() * 1e3,
                built.as_secs_f64() * 1e3
            );
        }
    };
    for _ in 0..warmup {
        step();
    }
    probe.start();
    let mut steps = 0usize;
    let secs = median_secs(0, budget, || {
        steps += 1;
        step();
    });
    probe.finish(steps);
    secs
}
