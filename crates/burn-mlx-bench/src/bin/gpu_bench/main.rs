//! Speed of Burn + `Mlx` on the GPU (CUDA on NVIDIA, Metal on Apple Silicon), against raw
//! mlx-rs in the same process.
//!
//! ```text
//! cargo run --release -p burn-mlx-bench --features cuda --bin gpu_bench          # Linux + NVIDIA
//! cargo run --release -p burn-mlx-bench --bin gpu_bench                          # macOS (Metal)
//! cargo run --release -p burn-mlx-bench --bin gpu_bench -- --device cpu --quick # anywhere, as a check
//! ```
//!
//! Workloads: square matmuls in f32 and bf16 from 1024 to 8192 (Burn + `Mlx` and raw mlx-rs),
//! an elementwise chain op by op, compiled with `burn_mlx::compile_float`, and in raw mlx-rs,
//! and one full training step (forward, backward, Adam) of four models (burn-mlx-models): the MLP,
//! the example CNN, the small Transformer encoder of `cargo bench` (this crate's `benches/backends/`) and a
//! 29.5M-parameter causal decoder language model (6 layers, d_model 512, seq 256, batch 8;
//! left out by `--quick`). `--mlx-autodiff` also trains them with MLX's own autodiff
//! (`burn_mlx::grad`), step by step and with the whole step compiled. `peers/burn-cuda` times the
//! same four steps on burn-cuda. `--host-build` instead measures, by phase, the host time of
//! building each training step's lazy graph with nothing evaluated. Each line prints the median
//! over timed runs after a warm-up, and `--json FILE` writes the same numbers for
//! `scripts/gpu_reference.py`, which measures MLX's Python API and PyTorch eager on the same
//! workloads and prints the comparison table.

extern crate burn_core as burn;

mod host_build;
mod mlx_autodiff;

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn_autodiff::Autodiff;
use burn_flex::{Flex, FlexDevice};
use burn_mlx::compile::auto::{FusionStats, DEFAULT_THRESHOLD};
use burn_mlx::{compile_float, pending_primitives, Mlx, MlxDevice, MlxFused, PrimitiveKind};
use burn_mlx_models::steps::{
    self, median_secs, InnerLoss, StepVisitor, TimedSteps, Timer, Workloads,
};
use burn_optim::{AdamConfig, GradientsParams, Optimizer};
use burn_tensor::backend::Backend;
use burn_tensor::{DType, Distribution, Tensor};
use clap::Parser;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

type AD = Autodiff<Mlx>;

/// Evaluates `t` and waits for the device: reading one element back forces the whole graph
/// that produced it (MLX evaluates whole primitives).
fn force<const D: usize, B: Backend>(t: Tensor<B, D>) {
    let _ = t.reshape([-1]).narrow(0, 0, 1).into_data();
}

/// Prints, for the evaluations since `before` that ran through compiled graphs, the primitives
/// per evaluation before and after fusion; returns the counters now.
fn fused_counts(name: &str, before: FusionStats) -> FusionStats {
    let now = burn_mlx::compile::auto::stats();
    let gained = now.since(&before);
    if gained.fused > 0 {
        println!(
            "{name:<28} fusion: {} evaluations through compiled graphs, {:.0} primitives \
             each before fusion, {:.0} after",
            gained.fused,
            gained.primitives as f64 / gained.fused as f64,
            gained.fused_primitives as f64 / gained.fused as f64
        );
    }
    now
}

/// Prints burn-mlx's fusion pass over a workload's timed steps: host time per step, the part
/// inside compiled functions, and evaluations per step.
#[derive(Default)]
struct FusionProbe(Option<FusionStats>);

impl TimedSteps for FusionProbe {
    fn start(&mut self) {
        self.0 = Some(burn_mlx::compile::auto::stats());
    }

    fn finish(&mut self, steps: usize) {
        let Some(before) = self.0.take() else {
            return;
        };
        let pass = burn_mlx::compile::auto::stats().since(&before);
        if pass.fused > 0 && steps > 0 {
            let per_step = |n: u64| n as f64 / steps as f64;
            println!(
                "{:<28} fusion pass: {:.3} ms of host time per timed step, {:.3} ms of it in \
                 compiled functions ({:.0} evaluations per step, {:.0} through compiled graphs, \
                 {:.0} of them recognized without a full walk)",
                "",
                per_step(pass.pass_nanos) / 1e6,
                per_step(pass.call_nanos) / 1e6,
                per_step(pass.evaluations),
                per_step(pass.fused),
                per_step(pass.recognized)
            );
        }
    }
}

/// Prints the op stream's compiled blocks per timed step and their host time.
#[derive(Default)]
struct OpStreamProbe(Option<burn_mlx::OpStreamStats>);

impl TimedSteps for OpStreamProbe {
    fn start(&mut self) {
        self.0 = Some(burn_mlx::op_stream_stats());
    }

    fn finish(&mut self, steps: usize) {
        let (Some(before), true) = (self.0.take(), steps > 0) else {
            return;
        };
        let now = burn_mlx::op_stream_stats();
        let per_step = |a: u64, b: u64| (a - b) as f64 / steps as f64;
        println!(
            "{:<28} op stream per timed step: {:.1} compiled blocks ({:.3} ms of host time in \
             their calls), {:.1} blocks op by op",
            "",
            per_step(now.compiled_runs, before.compiled_runs),
            per_step(now.call_nanos, before.call_nanos) / 1e6,
            per_step(now.unfused_runs, before.unfused_runs)
        );
    }
}

/// Collects the MLX tensors behind a module's float parameters.
struct Params(Vec<burn_mlx::MlxTensor>);

impl ModuleVisitor<AD> for Params {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AD, D>>) {
        self.0.push(param.val().inner().into_primitive().tensor());
    }
}

/// The MLX primitives of one training step (forward, backward, Adam), counted by kind: one step
/// is run and evaluated first, so that the count covers a steady-state step (parameter
/// initialization and the optimizer's first-step state excluded).
fn step_primitives<M: AutodiffModule<AD>>(
    model: M,
    loss: &dyn Fn(&M) -> Tensor<AD, 1>,
) -> BTreeMap<String, usize> {
    let mut optim = AdamConfig::new().init::<AD, M>();
    let mut step = |m: M| {
        let l = loss(&m);
        let grads = GradientsParams::from_grads(l.backward(), &m);
        (optim.step(1e-3, m, grads), l)
    };
    let (m, l) = step(model);
    let mut params = Params(vec![]);
    m.visit(&mut params);
    params.0.push(l.inner().into_primitive().tensor());
    for t in &params.0 {
        t.eval().expect("the first step evaluates");
    }
    let (m, l) = step(m);
    let mut params = Params(vec![]);
    m.visit(&mut params);
    params.0.push(l.inner().into_primitive().tensor());
    let refs: Vec<&burn_mlx::MlxTensor> = params.0.iter().collect();
    pending_primitives(&refs).expect("counting the step's primitives")
}

/// Prints one row of the primitive-count table (by kind), then the ten most frequent primitives.
fn print_counts(name: &str, counts: &BTreeMap<String, usize>) {
    let mut kinds: BTreeMap<PrimitiveKind, usize> = BTreeMap::new();
    for (primitive, n) in counts {
        *kinds.entry(PrimitiveKind::of(primitive)).or_insert(0) += n;
    }
    let total: usize = kinds.values().sum();
    let without_views = total - kinds.get(&PrimitiveKind::View).copied().unwrap_or(0);
    let cells: Vec<String> = kinds.iter().map(|(k, n)| format!("{k:?} {n}")).collect();
    println!(
        "{name:<28} primitives {total:>5} (computing {without_views:>5}): {}",
        cells.join(", ")
    );
    let mut top: Vec<(&String, &usize)> = counts.iter().collect();
    top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let cells: Vec<String> = top
        .iter()
        .take(10)
        .map(|(p, n)| format!("{p} {n}"))
        .collect();
    println!("{:<28}   most frequent: {}", "", cells.join(", "));
}

/// One result line: workload, implementation, median seconds.
struct Line {
    workload: String,
    implementation: &'static str,
    secs: f64,
}

/// Speed of Burn + Mlx on the GPU against raw mlx-rs (median ms per run of each workload).
#[derive(Debug, Parser)]
#[command(name = "gpu_bench")]
struct Args {
    /// MLX device.
    #[arg(long, default_value = "gpu")]
    device: MlxDevice,
    /// Small sizes and short timings (matmuls 256 and 512, a 1M-element chain, 0.2 s per
    /// workload, no decoder LM step), as a check that everything runs.
    #[arg(long)]
    quick: bool,
    /// Also write the numbers as JSON to FILE (for `scripts/gpu_reference.py`).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Instead of timing, count the MLX primitives of one training step of each model (forward,
    /// backward, Adam update), by kind: the kernel launches a step pays for.
    #[arg(long)]
    count_primitives: bool,
    /// burn-mlx's automatic fusion for the training steps: `both` times each step without it,
    /// then with it.
    #[arg(long, value_enum, default_value_t = FusionFlag::Both)]
    fusion: FusionFlag,
    /// Time the training steps only (no matmuls, no elementwise chain).
    #[arg(long)]
    steps_only: bool,
    /// Only these training steps (by the first word of their name: mlp, cnn, transformer,
    /// decoder); by default all four (`--quick`: all but the decoder).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Also time the training steps on burn-flex (Burn's fastest CPU backend, on the CPU),
    /// through the same model code: the CPU comparison of BENCHMARKS.md.
    #[arg(long)]
    flex: bool,
    /// Also run each training step with MLX's own autodiff in place of Burn's
    /// (`burn_mlx::grad`: `Trainer` with Burn's Adam, rows "mlx-autodiff", and the whole step
    /// compiled, `CompiledTrainer`, rows "mlx-compiled"): timed beside the `Autodiff<Mlx>` rows,
    /// and with `--count-primitives` counted, with the largest difference from Burn's
    /// gradients.
    #[arg(long)]
    mlx_autodiff: bool,
    /// Instead of timing, measure the host time of building each training step's graph
    /// (forward, backward, Adam, and dropping it), nothing evaluated (`host_build.rs`).
    #[arg(long)]
    host_build: bool,
    /// Also time the training steps on `Autodiff<MlxFused>` (rows "burn-mlx op-stream"): the
    /// same model code with Burn's op stream recorded and its recurring blocks run as
    /// MLX-compiled functions (`src/op_stream`).
    #[arg(long)]
    op_stream: bool,
}

/// Which training-step rows to time: without automatic fusion, with it, or both.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum FusionFlag {
    Both,
    On,
    Off,
}

/// How much each workload measures: the full run or `--quick`'s.
struct Sizes {
    /// Sides of the square matmuls.
    matmul: Vec<usize>,
    /// Time budget of each workload's timed runs.
    budget: Duration,
    /// Elements of the elementwise-chain workload.
    chain_len: usize,
}

impl Sizes {
    /// The sizes of a full run, or with `quick` of a short check.
    fn new(quick: bool) -> Self {
        if quick {
            Sizes {
                matmul: vec![256, 512],
                budget: Duration::from_millis(200),
                chain_len: 1_000_000,
            }
        } else {
            Sizes {
                matmul: vec![1024, 2048, 4096, 8192],
                budget: Duration::from_secs(2),
                chain_len: 16_000_000,
            }
        }
    }
}

/// `--count-primitives`: prints the primitive counts of one step of each training workload
/// (with `mlx_autodiff`, also those of the step with MLX's autodiff).
struct Counter {
    mlx_autodiff: bool,
}

impl StepVisitor<AD> for Counter {
    fn visit<M: AutodiffModule<AD>>(
        &mut self,
        name: &'static str,
        model: M,
        loss: &dyn Fn(&M) -> Tensor<AD, 1>,
        inner_loss: InnerLoss<M::InnerModule, Mlx>,
    ) where
        M::InnerModule: 'static,
    {
        if self.mlx_autodiff {
            let (gap, scale) = mlx_autodiff::gradient_gap(&model, loss, &*inner_loss);
            let n = mlx_autodiff::step_primitives(model.valid(), &*inner_loss);
            println!(
                "{name:<28} with MLX's autodiff: primitives {n:>5}; gradients differ from \
                 Burn's by at most {gap:.2e} (largest gradient {scale:.2e})"
            );
            let (loss_gap, param_gap) = mlx_autodiff::compiled_gap(model.valid(), inner_loss);
            println!(
                "{name:<28} compiled step against step by step, 3 Adam steps: losses differ \
                 by at most {loss_gap:.2e} (relative), parameters by {param_gap:.2e}"
            );
        }
        print_counts(name, &step_primitives(model, loss));
    }
}

/// `--mlx-autodiff`: times each training step with MLX's autodiff (`mlx_autodiff.rs`), step by
/// step or (`compiled`) with the whole step compiled.
struct MlxAutodiffTimer<F> {
    compiled: bool,
    warmup: usize,
    budget: Duration,
    on_result: F,
}

impl<F: FnMut(&'static str, f64)> StepVisitor<AD> for MlxAutodiffTimer<F> {
    fn visit<M: AutodiffModule<AD>>(
        &mut self,
        name: &'static str,
        model: M,
        _loss: &dyn Fn(&M) -> Tensor<AD, 1>,
        inner_loss: InnerLoss<M::InnerModule, Mlx>,
    ) where
        M::InnerModule: 'static,
    {
        let secs = if self.compiled {
            mlx_autodiff::compiled_step_secs(model.valid(), self.warmup, self.budget, inner_loss)
        } else {
            mlx_autodiff::step_secs(model.valid(), self.warmup, self.budget, &*inner_loss)
        };
        (self.on_result)(name, secs);
    }
}

fn main() {
    let args = Args::parse();
    let device = args.device;
    if let Err(e) = device.check() {
        eprintln!("gpu_bench: {e}");
        std::process::exit(1);
    }
    // The allocator is part of the host time every step pays (README, "Allocator").
    if cfg!(all(feature = "jemalloc", target_os = "linux")) {
        println!("allocator: jemalloc (burn-mlx's `jemalloc` feature)");
    } else {
        println!("allocator: the system's malloc");
    }
    let workloads = Workloads::<AD>::new(&device);
    // The decoder LM's step takes seconds on a CPU: `--quick` leaves it out.
    let only = match steps::select(&args.only) {
        Ok(_) if args.quick && args.only.is_empty() => {
            vec![steps::MLP, steps::CNN, steps::TRANSFORMER]
        }
        Ok(only) => only,
        Err(e) => {
            eprintln!("gpu_bench: --only: {e}");
            std::process::exit(2);
        }
    };
    if args.host_build {
        let budget = Sizes::new(args.quick).budget;
        workloads.run(&only, &mut host_build::HostBuild { budget });
        return;
    }
    if args.count_primitives {
        workloads.run(
            &only,
            &mut Counter {
                mlx_autodiff: args.mlx_autodiff,
            },
        );
        return;
    }
    let sizes = Sizes::new(args.quick);
    let budget = sizes.budget;
    let mut lines: Vec<Line> = Vec::new();
    let mut push = |workload: String, implementation: &'static str, secs: f64| {
        println!(
            "{workload:<28} {implementation:<16} {:>10.3} ms",
            secs * 1e3
        );
        lines.push(Line {
            workload,
            implementation,
            secs,
        });
    };

    let raw_device = match device {
        MlxDevice::Cpu => mlx_rs::Device::cpu(),
        MlxDevice::Gpu => mlx_rs::Device::gpu(),
    };
    let raw_stream = mlx_rs::Stream::try_default_on_device(&raw_device).expect("an MLX stream");
    if !args.steps_only {
        for (dt, raw_dt, label) in [
            (DType::F32, mlx_rs::Dtype::Float32, "f32"),
            (DType::BF16, mlx_rs::Dtype::Bfloat16, "bf16"),
        ] {
            for &n in &sizes.matmul {
                let name = format!("matmul {label} {n}");
                let a = Tensor::<Mlx, 2>::random([n, n], Distribution::Default, &device).cast(dt);
                let b = Tensor::<Mlx, 2>::random([n, n], Distribution::Default, &device).cast(dt);
                force(a.clone() + b.clone());
                let t = median_secs(2, budget, || force(a.clone().matmul(b.clone())));
                push(name.clone(), "burn-mlx", t);

                let (ra, rb) = mlx_rs::with_stream(&raw_stream, || {
                    let shape = [n as i32, n as i32];
                    let ra = mlx_rs::random::uniform::<_, f32>(0.0, 1.0, &shape, None)
                        .and_then(|x| x.as_dtype(raw_dt))
                        .expect("raw operand");
                    let rb = mlx_rs::random::uniform::<_, f32>(0.0, 1.0, &shape, None)
                        .and_then(|x| x.as_dtype(raw_dt))
                        .expect("raw operand");
                    (ra, rb)
                });
                ra.eval().expect("eval");
                rb.eval().expect("eval");
                let t = median_secs(2, budget, || {
                    mlx_rs::with_stream(&raw_stream, || {
                        let c = ra.matmul(&rb).expect("raw matmul");
                        c.eval().expect("eval");
                    })
                });
                push(name, "mlx-rs", t);
            }
        }

        // An elementwise chain, op by op (lazy, one kernel per op), compiled by MLX
        // (`burn_mlx::compile_float`: fused), and in raw mlx-rs.
        let n = sizes.chain_len;
        let name = format!("chain exp(x*0.5+1)*x {n}");
        let x = Tensor::<Mlx, 1>::random([n], Distribution::Default, &device);
        force(x.clone());
        let chain = |x: Tensor<Mlx, 1>| (x.clone() * 0.5 + 1.0).exp() * x;
        push(
            name.clone(),
            "burn-mlx",
            median_secs(2, budget, || force(chain(x.clone()))),
        );
        let mut compiled = compile_float::<1, _>(move |x| vec![chain(x[0].clone())], false);
        let t = median_secs(2, budget, || {
            force(
                compiled
                    .call(vec![x.clone()])
                    .expect("compiled chain")
                    .remove(0),
            )
        });
        push(name.clone(), "compiled", t);
        let rx = mlx_rs::with_stream(&raw_stream, || {
            mlx_rs::random::uniform::<_, f32>(0.0, 1.0, &[n as i32], None).expect("raw operand")
        });
        rx.eval().expect("eval");
        let t = median_secs(2, budget, || {
            mlx_rs::with_stream(&raw_stream, || {
                let y = rx
                    .multiply(mlx_rs::Array::from_f32(0.5))
                    .and_then(|y| y.add(mlx_rs::Array::from_f32(1.0)))
                    .and_then(|y| y.exp())
                    .and_then(|y| y.multiply(&rx))
                    .expect("raw chain");
                y.eval().expect("eval");
            })
        });
        push(name, "mlx-rs", t);
    }

    // The training steps, with burn-mlx's automatic fusion off ("burn-mlx unfused") and on
    // ("burn-mlx", the default), one after the other in this process.
    let settings: &[(u32, &'static str)] = match args.fusion {
        FusionFlag::Both => &[(0, "burn-mlx unfused"), (DEFAULT_THRESHOLD, "burn-mlx")],
        FusionFlag::On => &[(DEFAULT_THRESHOLD, "burn-mlx")],
        FusionFlag::Off => &[(0, "burn-mlx unfused")],
    };
    for &(threshold, implementation) in settings {
        burn_mlx::compile::auto::set_threshold(device, threshold);
        let mut before = burn_mlx::compile::auto::stats();
        let mut timer = Timer {
            warmup: if args.quick { 2 } else { steps::STEP_WARMUP },
            budget,
            on_result: |name: &'static str, secs| {
                push(name.into(), implementation, secs);
                before = fused_counts(name, before);
            },
            probe: FusionProbe::default(),
        };
        workloads.run(&only, &mut timer);
        if args.mlx_autodiff {
            let implementation = if threshold == 0 {
                "mlx-autodiff unfused"
            } else {
                "mlx-autodiff"
            };
            let mut timer = MlxAutodiffTimer {
                compiled: false,
                warmup: if args.quick { 2 } else { steps::STEP_WARMUP },
                budget,
                on_result: |name: &'static str, secs| {
                    push(name.into(), implementation, secs);
                    before = fused_counts(name, before);
                },
            };
            workloads.run(&only, &mut timer);
        }
    }
    if args.mlx_autodiff {
        // The whole step compiled by MLX (`burn_mlx::grad::CompiledTrainer`); graphs that hold
        // a compiled function are left alone by the fusion pass.
        let mut timer = MlxAutodiffTimer {
            compiled: true,
            warmup: if args.quick { 2 } else { steps::STEP_WARMUP },
            budget,
            on_result: |name: &'static str, secs| push(name.into(), "mlx-compiled", secs),
        };
        workloads.run(&only, &mut timer);
    }
    if args.op_stream {
        let before = burn_mlx::op_stream_stats();
        let mut timer = Timer {
            warmup: if args.quick { 2 } else { steps::STEP_WARMUP },
            budget,
            on_result: |name: &'static str, secs| push(name.into(), "burn-mlx op-stream", secs),
            probe: OpStreamProbe::default(),
        };
        Workloads::<Autodiff<MlxFused>>::new(&device).run(&only, &mut timer);
        let after = burn_mlx::op_stream_stats();
        println!(
            "op stream: {} blocks ran compiled ({:.1} ms of host time in compiled calls), {} op \
             by op, {} traces, {} blocks gave up",
            after.compiled_runs - before.compiled_runs,
            (after.call_nanos - before.call_nanos) as f64 / 1e6,
            after.unfused_runs - before.unfused_runs,
            after.traces - before.traces,
            after.given_up - before.given_up
        );
    }
    if args.flex {
        let mut timer = Timer {
            warmup: if args.quick { 2 } else { steps::STEP_WARMUP },
            budget,
            on_result: |name: &'static str, secs| push(name.into(), "burn-flex", secs),
            probe: (),
        };
        Workloads::<Autodiff<Flex>>::new(&FlexDevice).run(&only, &mut timer);
    }
    let stats = burn_mlx::compile::auto::stats();
    println!(
        "fusion: {} of {} evaluations ran through {} compiled graphs ({} failed to compile, \
         {} dropped as slower)",
        stats.fused, stats.evaluations, stats.compiled, stats.failed, stats.slower
    );
    for workload in steps::ALL {
        let secs = |implementation: &str| {
            lines
                .iter()
                .find(|l| l.workload == workload && l.implementation == implementation)
                .map(|l| l.secs)
        };
        if let (Some(plain), Some(fused)) = (secs("burn-mlx unfused"), secs("burn-mlx")) {
            println!("{workload:<28} fused is {:.2}x unfused", plain / fused);
        }
        for (theirs, ours) in [
            ("burn-mlx unfused", "mlx-autodiff unfused"),
            ("burn-mlx", "mlx-autodiff"),
            ("burn-mlx", "mlx-compiled"),
            ("burn-mlx unfused", "mlx-compiled"),
            ("burn-mlx", "burn-mlx op-stream"),
            ("mlx-compiled", "burn-mlx op-stream"),
        ] {
            if let (Some(burn), Some(mlx)) = (secs(theirs), secs(ours)) {
                println!("{workload:<28} {ours} is {:.2}x {theirs}", burn / mlx);
            }
        }
        for implementation in ["burn-mlx", "burn-mlx unfused", "burn-mlx op-stream"] {
            if let (Some(ours), Some(flex)) = (secs(implementation), secs("burn-flex")) {
                println!(
                    "{workload:<28} {implementation} is {:.2}x burn-flex",
                    flex / ours
                );
            }
        }
    }

    if let Some(path) = args.json {
        let body: Vec<String> = lines
            .iter()
            .map(|l| {
                format!(
                    "  {{\"workload\": \"{}\", \"impl\": \"{}\", \"secs\": {:e}}}",
                    l.workload, l.implementation, l.secs
                )
            })
            .collect();
        let text = format!("[\n{}\n]\n", body.join(",\n"));
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("gpu_bench: cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}
