//! Data-parallel training of an MLP (or a Transformer encoder) with `Autodiff<Mlx>` over MLX's
//! distributed engine, each rank on its own shard of the data, and a benchmark of all_sum
//! between ranks.
//!
//! ```text
//! cargo run --release -p burn-mlx-distributed --bin train_distributed -- --ranks 2          # 2 local ranks
//! cargo run --release -p burn-mlx-distributed --bin train_distributed                       # 1 process
//! cargo run --release -p burn-mlx-distributed --bin mlx_launch -- -n 2 target/release/train_distributed
//! cargo run --release -p burn-mlx-distributed --bin train_distributed -- --ranks 2 --bench  # all_sum bandwidth
//! scripts/allsum_compare.sh      # --bench against MLX Python's all_sum, alternating runs
//! scripts/distributed_steps.sh   # step time: 1 and 2 ranks, --no-group, --no-check
//!
//! # NVIDIA GPUs, one rank per GPU over NCCL (a `--features cuda` build):
//! train_distributed --ranks 2 --backend nccl --device gpu --steps 20 --parity
//! train_distributed --ranks 2 --backend nccl --device gpu --model transformer --batch 256
//! train_distributed --ranks 2 --backend nccl --device gpu --bench --bench-max-mb 1024
//! python3 crates/burn-mlx-distributed/src/bin/train_distributed/torch_ddp.py step --world 1 2 --batch 128  # PyTorch DDP
//! ```
//!
//! `--model transformer` trains `gpu_bench`'s Transformer step (d_model 256, 8 heads, 2 layers,
//! sequences of 128) on a fixed random regression batch, each rank on its `1 / n` of it.
//! `--parity` checks data parallelism itself: after training, rank 0 trains the same model from
//! the same start alone on every step's whole global batch and compares the parameters
//! (tolerance relative to each tensor's largest value, 1e-5 on the CPU, 2e-2 on the GPU).
//!
//! Task: the three arms of a generated 2-D spiral (the custom_training_loop example's data, larger
//! and with a wider MLP). Every rank generates the same points and keeps every `size`-th one
//! (its shard); each step, every rank takes `batch / size` points of its shard, computes its
//! gradients, and `ddp::all_reduce_gradients` averages them over the ranks (a few bucketed
//! all_sums), so that Adam takes the same step on every rank. Rank 0's parameters are broadcast
//! first, so every rank starts from the same model.
//!
//! It prints each rank's throughput (samples per second of its own shard) and the global one
//! (all ranks' samples over the slowest rank's time). With `--ranks N` and no
//! `OPENBLAS_NUM_THREADS` set, each rank gets `cores / N` BLAS threads, so that N ranks share the
//! machine's cores instead of oversubscribing them.

extern crate burn_core as burn;

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use burn_autodiff::Autodiff;
use burn_mlx::distributed::launch::{launch, LaunchOptions};
use burn_mlx::distributed::{self, CommBackend, DistributedError, GradientAllReduce, Group};
use burn_mlx::{Mlx, MlxDevice};
use burn_mlx_distributed::ddp;
use burn_mlx_models::{Encoder, Mlp};
use burn_nn::loss::{CrossEntropyLoss, CrossEntropyLossConfig};
use burn_optim::{AdamConfig, GradientsParams, Optimizer};
use clap::{Parser, ValueEnum};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::time::{Duration, Instant};

/// The models `--model` picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ModelFlag {
    /// The MLP on the spiral (`--hidden`, `--points`).
    Mlp,
    /// The Transformer encoder of `gpu_bench`'s Transformer step.
    Transformer,
}

/// The training backend: MLX with Burn's autodiff decorator.
type Train = Autodiff<Mlx>;

/// Data-parallel training (an MLP, or a Transformer encoder) over MLX's distributed engine
/// (see the file's docs).
#[derive(Parser, Debug, Clone)]
#[command(name = "train_distributed")]
struct Args {
    /// Start this many local ranks of this program (through burn_mlx::distributed::launch).
    #[arg(long, default_value_t = 1)]
    ranks: usize,
    /// MLX backend: any, ring, mpi, nccl.
    #[arg(long, default_value = "any")]
    backend: CommBackend,
    /// The device every rank trains on (the ring backend communicates through the CPU).
    #[arg(long, default_value = "cpu")]
    device: MlxDevice,
    /// Optimizer steps.
    #[arg(long, default_value_t = 300)]
    steps: usize,
    /// Global batch size (split evenly over the ranks).
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Width of the two hidden layers.
    #[arg(long, default_value_t = 256)]
    hidden: usize,
    /// Adam's learning rate.
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Points per spiral arm (3 arms).
    #[arg(long, default_value_t = 10_000)]
    points: usize,
    /// Seconds each collective may take before the rank fails.
    #[arg(long, default_value_t = 120.0)]
    timeout: f64,
    /// Skip the agreement check before each collective (`Group::set_check(false)`), to measure
    /// what it costs.
    #[arg(long)]
    no_check: bool,
    /// Train as one process without setting a group up (no `distributed::init`), to measure
    /// what the group costs a single process.
    #[arg(long, conflicts_with_all = ["ranks", "bench"])]
    no_group: bool,
    /// The model: the MLP on the spiral, or the Transformer encoder of the GPU benchmark's
    /// Transformer step (d_model 256, 8 heads, 2 layers, feed-forward 1024, sequences of 128)
    /// regressing a fixed random target.
    #[arg(long, value_enum, default_value_t = ModelFlag::Mlp)]
    model: ModelFlag,
    /// Steps not timed at the start (warm-up: kernel compilation, allocation).
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// After training, rank 0 trains the same model from the same start alone on every step's
    /// whole global batch and compares the parameters (fails beyond --parity-tol).
    #[arg(long)]
    parity: bool,
    /// Largest difference `--parity` accepts, relative to each parameter tensor's largest value
    /// (default 1e-5 on the CPU, 2e-2 on the GPU, where MLX runs f32 matmuls as TF32).
    #[arg(long)]
    parity_tol: Option<f32>,
    /// Measure all_sum bandwidth instead of training.
    #[arg(long)]
    bench: bool,
    /// Smallest all_sum of the benchmark, in MiB.
    #[arg(long, default_value_t = 1)]
    bench_min_mb: usize,
    /// Largest all_sum of the benchmark, in MiB.
    #[arg(long, default_value_t = 256)]
    bench_max_mb: usize,
    /// Also time small all_sums (4 B, 4 KiB, 64 KiB, 256 KiB), the latency of one call.
    #[arg(long)]
    bench_small: bool,
}

/// `per_class` points on each of three spiral arms, with noise, shuffled (deterministic: every
/// rank generates the same list).
fn spiral(per_class: usize) -> (Vec<f32>, Vec<i64>) {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    let mut rows = Vec::with_capacity(3 * per_class);
    for class in 0..3 {
        for i in 0..per_class {
            let r = i as f32 / per_class as f32;
            let theta =
                class as f32 * 2.0 * std::f32::consts::PI / 3.0 + r * 4.0 + (next() - 0.5) * 0.2;
            rows.push(([r * theta.cos(), r * theta.sin()], class as i64));
        }
    }
    for i in (1..rows.len()).rev() {
        let j = (next() * (i + 1) as f32) as usize % (i + 1);
        rows.swap(i, j);
    }
    let points = rows.iter().flat_map(|(p, _)| *p).collect();
    let labels = rows.iter().map(|(_, l)| *l).collect();
    (points, labels)
}

/// Percentage of `labels` that `model` predicts from `points`.
fn accuracy(model: &Mlp<Mlx>, points: &[f32], labels: &[i64], device: &MlxDevice) -> f64 {
    let n = labels.len();
    let x = Tensor::<Mlx, 2>::from_data(TensorData::new(points.to_vec(), [n, 2]), device);
    let y = Tensor::<Mlx, 1, Int>::from_data(TensorData::new(labels.to_vec(), [n]), device);
    let predicted = model.forward(x).argmax(1).flatten::<1>(0, 1);
    let correct: i64 = predicted.equal(y).int().sum().into_scalar().elem();
    100.0 * correct as f64 / n as f64
}

fn main() {
    let args = Args::parse();
    // As the launcher: start `--ranks` copies of this program, which see MLX_RANK and train.
    if args.ranks > 1 && std::env::var_os("MLX_RANK").is_none() {
        std::process::exit(launch_ranks(&args));
    }
    let result = if args.bench {
        bench(&args)
    } else {
        train(&args)
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(3);
    }
}

/// Starts `args.ranks` ranks of this program and returns the exit code.
fn launch_ranks(args: &Args) -> i32 {
    let exe = std::env::current_exe().expect("this program's path");
    let mut options = LaunchOptions::new(args.ranks, exe, std::env::args_os().skip(1));
    // NCCL: one GPU per rank, rendezvous on loopback (the launcher sets NCCL's variables).
    options.nccl = args.backend == CommBackend::Nccl;
    if std::env::var_os("OPENBLAS_NUM_THREADS").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = (cores / args.ranks).max(1);
        println!(
            "launching {} ranks on {cores} cores: OPENBLAS_NUM_THREADS={threads} per rank",
            args.ranks
        );
        options
            .env
            .push(("OPENBLAS_NUM_THREADS".into(), threads.to_string().into()));
    }
    match launch(&options) {
        Ok(report) if report.success() => 0,
        Ok(report) => {
            eprintln!("[launch] failed:\n{}", report.summary());
            1
        }
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

/// Ends the program when `--device` is not usable here.
fn check_device(args: &Args) {
    if let Err(e) = args.device.check() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}

/// Sets the group up with the example's timeout.
fn group(args: &Args) -> Result<Group, DistributedError> {
    check_device(args);
    let group = distributed::InitOptions::new(args.backend)
        .timeout(Duration::from_secs_f64(args.timeout))
        .check(!args.no_check)
        .init()?;
    let threads = std::env::var("OPENBLAS_NUM_THREADS").unwrap_or_else(|_| "default".into());
    println!(
        "rank {} of {} ({} backend), OPENBLAS_NUM_THREADS={threads}, agreement checks {}",
        group.rank(),
        group.size(),
        group.backend(),
        if group.check() { "on" } else { "off" }
    );
    Ok(group)
}

/// The training run.
fn train(args: &Args) -> Result<(), DistributedError> {
    let group = if args.no_group {
        check_device(args);
        let threads = std::env::var("OPENBLAS_NUM_THREADS").unwrap_or_else(|_| "default".into());
        println!("one process, no group (--no-group), OPENBLAS_NUM_THREADS={threads}");
        None
    } else {
        Some(group(args)?)
    };
    let (rank, size) = group.as_ref().map_or((0, 1), |g| (g.rank(), g.size()));
    if !args.batch.is_multiple_of(size) {
        return Err(DistributedError::Invalid {
            op: "train".into(),
            rank,
            size,
            message: format!(
                "--batch {} is not a multiple of the {size} ranks: pick a multiple",
                args.batch
            ),
        });
    }
    let device = args.device;
    match args.model {
        ModelFlag::Mlp => {
            let task = SpiralTask::new(args, &device);
            run(args, group.as_ref(), &task, &device)
        }
        ModelFlag::Transformer => {
            let task = EncoderTask::new(args, rank, size, &device);
            run(args, group.as_ref(), &task, &device)
        }
    }
}

/// What `run` trains: a model, its loss on this rank's part of a step's global batch, and what
/// to report at the end.
trait Task: Sized {
    /// The model.
    type Model: AutodiffModule<Train> + Clone;
    /// A freshly initialised model (from the backend's seeded generator).
    fn model(&self, device: &MlxDevice) -> Self::Model;
    /// The loss of `model` on rank `rank`'s `1 / size` of step `step`'s global batch, a mean
    /// over its samples (so that the mean over the ranks is the global batch's loss).
    fn loss(&self, model: &Self::Model, step: usize, rank: usize, size: usize) -> Tensor<Train, 1>;
    /// Printed by rank 0 after training (the MLP's accuracy).
    fn report(&self, _model: &Self::Model) {}
    /// For `--parity`'s one-process reference: a task that holds the whole global batch, when
    /// this one holds only its rank's part (`None`: this one serves, as rank 0 of 1).
    fn whole_batch(&self, _args: &Args, _device: &MlxDevice) -> Option<Self> {
        None
    }
}

/// The MLP on the spiral: every rank holds all points; global batch `s` is the points
/// `s * batch .. (s + 1) * batch` (cyclically), and rank `r` of `n` takes every `n`-th of them
/// from the `r`-th, so that the ranks' parts make up the same global batch as one process's.
struct SpiralTask {
    points: Vec<f32>,
    labels: Vec<i64>,
    x: Tensor<Train, 2>,
    y: Tensor<Train, 1, Int>,
    batch: usize,
    hidden: usize,
    loss_fn: CrossEntropyLoss<Train>,
    device: MlxDevice,
}

impl SpiralTask {
    fn new(args: &Args, device: &MlxDevice) -> Self {
        let (points, labels) = spiral(args.points);
        let n = labels.len();
        let x = Tensor::<Train, 2>::from_data(TensorData::new(points.clone(), [n, 2]), device);
        let y = Tensor::<Train, 1, Int>::from_data(TensorData::new(labels.clone(), [n]), device);
        SpiralTask {
            points,
            labels,
            x,
            y,
            batch: args.batch,
            hidden: args.hidden,
            loss_fn: CrossEntropyLossConfig::new().init(device),
            device: *device,
        }
    }
}

impl Task for SpiralTask {
    type Model = Mlp<Train>;

    fn model(&self, device: &MlxDevice) -> Mlp<Train> {
        Mlp::new(2, self.hidden, 3, device)
    }

    fn loss(&self, model: &Mlp<Train>, step: usize, rank: usize, size: usize) -> Tensor<Train, 1> {
        let n = self.labels.len();
        let local = self.batch / size;
        let idx: Vec<i64> = (0..local)
            .map(|i| ((step * self.batch + i * size + rank) % n) as i64)
            .collect();
        let idx = Tensor::<Train, 1, Int>::from_data(TensorData::new(idx, [local]), &self.device);
        let logits = model.forward(self.x.clone().select(0, idx.clone()));
        self.loss_fn.forward(logits, self.y.clone().select(0, idx))
    }

    fn report(&self, model: &Mlp<Train>) {
        let acc = accuracy(&model.valid(), &self.points, &self.labels, &self.device);
        println!("accuracy on all {} points: {acc:.1}%", self.labels.len());
    }
}

/// The Transformer encoder regressing a fixed random target from a fixed random input (as
/// `gpu_bench`'s Transformer step): global sample `i` is generated from its index alone, and
/// rank `r` of `n` holds samples `r * batch / n .. (r + 1) * batch / n` of the global batch,
/// the same every step.
struct EncoderTask {
    x: Tensor<Train, 3>,
    target: Tensor<Train, 3>,
    /// The first global sample this task holds.
    first: usize,
}

impl EncoderTask {
    /// The samples of rank `rank` of `size`.
    fn new(args: &Args, rank: usize, size: usize, device: &MlxDevice) -> Self {
        let local = args.batch / size;
        Self::samples(rank * local, local, device)
    }

    /// Samples `first .. first + count` of the global batch.
    fn samples(first: usize, count: usize, device: &MlxDevice) -> Self {
        let (s, d) = (Encoder::<Train>::SEQ, Encoder::<Train>::D_MODEL);
        let values = |offset: u64| -> Vec<f32> {
            (first..first + count)
                .flat_map(|i| uniform(2 * i as u64 + offset, s * d))
                .collect()
        };
        let x = TensorData::new(values(0), [count, s, d]);
        let target = TensorData::new(values(1), [count, s, d]);
        EncoderTask {
            x: Tensor::from_data(x, device),
            target: Tensor::from_data(target, device),
            first,
        }
    }
}

impl Task for EncoderTask {
    type Model = Encoder<Train>;

    fn model(&self, device: &MlxDevice) -> Encoder<Train> {
        Encoder::new(device)
    }

    fn loss(
        &self,
        model: &Encoder<Train>,
        _step: usize,
        rank: usize,
        size: usize,
    ) -> Tensor<Train, 1> {
        let held = self.x.dims()[0];
        // A task built for one rank holds just that rank's samples; the one-process reference
        // of `--parity` holds the whole global batch and passes rank 0 of 1.
        debug_assert!(size == 1 || self.first == rank * held);
        let out = model.forward(self.x.clone());
        (out - self.target.clone()).powi_scalar(2).mean()
    }

    fn whole_batch(&self, args: &Args, device: &MlxDevice) -> Option<Self> {
        Some(Self::samples(0, args.batch, device))
    }
}

/// `n` values uniform in [0, 1), from seed `seed` (`rand`'s seeded `StdRng`: every rank, and
/// the one-process reference of `--parity`, draws the same values for the same sample).
fn uniform(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random::<f32>()).collect()
}

/// Data-parallel training of `task` on every rank of `group` (or alone), with the throughput
/// report and, with `--parity`, the comparison against one process on the whole global batch.
fn run<T: Task>(
    args: &Args,
    group: Option<&Group>,
    task: &T,
    device: &MlxDevice,
) -> Result<(), DistributedError> {
    let (rank, size) = group.map_or((0, 1), |g| (g.rank(), g.size()));
    let local_batch = args.batch / size;
    println!(
        "rank {rank}: {:?}, {local_batch} samples per step (global batch {})",
        args.model, args.batch
    );

    Train::seed(device, 1 + rank as u64);
    let reducer = GradientAllReduce::new();
    let mut model = task.model(device);
    if let Some(group) = group {
        model = ddp::broadcast_module(group, &reducer, model, 0)?;
    }
    let mut optim = AdamConfig::new().init::<Train, T::Model>();

    let warmup = args.warmup.min(args.steps);
    let mut start = Instant::now();
    for step in 0..args.steps {
        if step == warmup {
            Mlx::sync(device).expect("sync");
            start = Instant::now();
        }
        let loss = task.loss(&model, step, rank, size);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let grads = match group {
            Some(group) => ddp::all_reduce_gradients(group, &reducer, &model, grads)?,
            None => grads,
        };
        model = optim.step(args.lr, model, grads);
        // On a GPU, start the device on this step (its collectives included) before the next
        // one is built: the host builds step n+1 while the GPU computes step n. On the CPU the
        // host and MLX's kernels share the cores, and overlapping measured slower
        // (benches/training.md, "CPU").
        if matches!(device, MlxDevice::Gpu) {
            burn_mlx::nn::start_step(&model, std::slice::from_ref(&loss)).map_err(|e| {
                DistributedError::Collective {
                    op: "start_step".into(),
                    rank,
                    size,
                    shapes: "the step's parameters and loss".into(),
                    message: e.to_string(),
                }
            })?;
        }
        if step % 50 == 0 || step + 1 == args.steps {
            let global = match group {
                Some(group) => group.all_sum(loss.inner())?,
                None => loss.inner(),
            };
            let global: f32 = global.into_scalar().elem::<f32>() / size as f32;
            if rank == 0 {
                println!("step {step:>5}  loss {global:.6} (mean over ranks)");
            }
        }
    }
    Mlx::sync(device).expect("sync");
    let seconds = start.elapsed().as_secs_f64();
    let timed_steps = args.steps - warmup;
    let samples = (timed_steps * local_batch) as f64;
    println!(
        "rank {rank}: {timed_steps} steps in {seconds:.2} s, {:.1} ms/step, {:.0} samples/s on its shard",
        1e3 * seconds / timed_steps.max(1) as f64,
        samples / seconds
    );
    // Global throughput: every rank's samples over the slowest rank's time.
    let (total, slowest) = match group {
        Some(group) => {
            let stats = Tensor::<Mlx, 1>::from_floats([samples as f32], device);
            let total: f32 = group.all_sum(stats)?.into_scalar().elem();
            let slowest: f32 = group
                .all_max(Tensor::<Mlx, 1>::from_floats([seconds as f32], device))?
                .into_scalar()
                .elem();
            (total, slowest)
        }
        None => (samples as f32, seconds as f32),
    };
    if rank == 0 {
        println!(
            "global: {size} rank(s), {:.0} samples/s ({:.3} ms per global step of {})",
            total / slowest,
            1e3 * slowest / timed_steps.max(1) as f32,
            args.batch
        );
        task.report(&model);
    }
    let mut failed = None;
    if args.parity && rank == 0 {
        failed = parity::<T>(args, task, &model, device).err();
    }
    if let Some(group) = group {
        group.barrier()?;
    }
    match failed {
        Some(message) => Err(DistributedError::Invalid {
            op: "parity".into(),
            rank,
            size,
            message,
        }),
        None => Ok(()),
    }
}

/// `--parity`: trains the same model from the same start alone, on the whole global batch of
/// every step, for the same steps, and compares its parameters with `trained`'s (rank 0's after
/// data-parallel training). Fails when they differ by more than the tolerance.
fn parity<T: Task>(
    args: &Args,
    task: &T,
    trained: &T::Model,
    device: &MlxDevice,
) -> Result<(), String> {
    let tol = args.parity_tol.unwrap_or(match args.device {
        MlxDevice::Cpu => 1e-5,
        MlxDevice::Gpu => 2e-2,
    });
    // The one-process reference needs the whole global batch (the MLP's task holds it anyway).
    let whole = task.whole_batch(args, device);
    let reference = whole.as_ref().unwrap_or(task);
    Train::seed(device, 1);
    let mut model = task.model(device);
    let mut optim = AdamConfig::new().init::<Train, T::Model>();
    for step in 0..args.steps {
        let loss = reference.loss(&model, step, 0, 1);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(args.lr, model, grads);
    }
    let ours = ParamValues::of(trained);
    let theirs = ParamValues::of(&model);
    let (mut max_abs, mut max_rel, mut worst) = (0f32, 0f32, 0usize);
    for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        let diff = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        let scale = b.iter().map(|y| y.abs()).fold(0f32, f32::max).max(1e-12);
        max_abs = max_abs.max(diff);
        if diff / scale > max_rel {
            (max_rel, worst) = (diff / scale, i);
        }
    }
    let count: usize = theirs.iter().map(Vec::len).sum();
    let verdict = if max_rel <= tol { "ok" } else { "FAILED" };
    println!(
        "parity after {} steps: max |data-parallel - one process| = {max_abs:.3e}, relative to \
         the tensor's largest value {max_rel:.3e} (parameter tensor {worst} of {}, {count} \
         values); tolerance {tol:.1e}: {verdict}",
        args.steps,
        theirs.len()
    );
    if max_rel <= tol {
        Ok(())
    } else {
        Err(format!(
            "the parameters differ from one process's by {max_rel:.3e} (relative), above {tol:.1e}"
        ))
    }
}

/// Every float parameter's values, in the module's order.
struct ParamValues(Vec<Vec<f32>>);

impl ParamValues {
    fn of<M: AutodiffModule<Train>>(model: &M) -> Vec<Vec<f32>> {
        let mut values = ParamValues(Vec::new());
        model.visit(&mut values);
        values.0
    }
}

impl ModuleVisitor<Train> for ParamValues {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Train, D>>) {
        let data = param.val().inner().into_data().convert::<f32>();
        self.0.push(data.to_vec().expect("f32 parameters"));
    }
}

/// `bytes` in words: `4 B`, `64 KiB`, `16 MiB`.
fn size_text(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// all_sum bandwidth between the ranks, for f32 tensors of `--bench-min-mb` to `--bench-max-mb`
/// MiB (and, with `--bench-small`, of 4 B to 256 KiB first: the latency of one call).
fn bench(args: &Args) -> Result<(), DistributedError> {
    let group = group(args)?;
    let (rank, size) = (group.rank(), group.size());
    // The agreement check adds one small all_gather per call: off, to time all_sum alone.
    group.set_check(false);
    let device = args.device;
    if rank == 0 {
        println!(
            "all_sum of f32 tensors between {size} ranks ({} backend, {} device); algbw = bytes / \
             time, busbw = algbw * 2 (n - 1) / n, best algbw from the fastest call",
            group.backend(),
            args.device
        );
        println!(
            "{:>10} {:>8} {:>6} {:>11} {:>8} {:>11} {:>11} {:>13}",
            "bytes",
            "size",
            "iters",
            "ms (median)",
            "ms (min)",
            "algbw GB/s",
            "busbw GB/s",
            "best algbw"
        );
    }
    let mut sizes: Vec<usize> = Vec::new();
    if args.bench_small {
        sizes.extend([4, 4 << 10, 64 << 10, 256 << 10]);
    }
    let mut mb = args.bench_min_mb.max(1);
    while mb <= args.bench_max_mb {
        sizes.push(mb << 20);
        mb *= 2;
    }
    for bytes in sizes {
        let n = bytes / 4;
        // Ones in memory, as MLX Python's `mx.ones` (a `Full` node) gives. burn-mlx's `ones` is a
        // broadcast view of one value, which MLX's all_sum copies to contiguous memory on every
        // call: an extra pass over the tensor that MLX Python's peer does not make.
        let x = Tensor::<Mlx, 1>::from_data(TensorData::new(vec![1.0f32; n], [n]), &device);
        let _ = group.all_sum(x.clone())?; // warm-up
        let iters = if bytes < 1 << 20 {
            100
        } else {
            ((256 << 20) / bytes).clamp(3, 20)
        };
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            group.barrier()?;
            let t = Instant::now();
            let y = group.all_sum(x.clone())?;
            times.push(t.elapsed().as_secs_f64());
            drop(y);
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let algbw = bytes as f64 / median / 1e9;
        let busbw = algbw * 2.0 * (size as f64 - 1.0) / size as f64;
        if rank == 0 {
            println!(
                "{bytes:>10} {:>8} {iters:>6} {:>11.3} {:>8.3} {algbw:>11.3} {busbw:>11.3} {:>13.3}",
                size_text(bytes),
                median * 1e3,
                times[0] * 1e3,
                bytes as f64 / times[0] / 1e9
            );
        }
    }
    group.barrier()?;
    Ok(())
}
