//! Data-parallel training of an MLP with `Autodiff<Mlx>` over MLX's distributed engine, each
//! rank on its own shard of the data, and a benchmark of all_sum between ranks.
//!
//! ```text
//! cargo run --release --example train_distributed -- --ranks 2          # 2 local ranks
//! cargo run --release --example train_distributed                       # 1 process
//! cargo run --release --example mlx_launch -- -n 2 target/release/examples/train_distributed
//! cargo run --release --example train_distributed -- --ranks 2 --bench  # all_sum bandwidth
//! scripts/allsum_compare.sh      # --bench against MLX Python's all_sum, alternating runs
//! scripts/distributed_steps.sh   # step time: 1 and 2 ranks, --no-group, --no-check
//! ```
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

mod ddp;
#[path = "../common/device_flag.rs"]
mod device_flag;
mod model;

use burn::module::AutodiffModule;
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use burn_autodiff::Autodiff;
use burn_mlx::distributed::launch::{launch, LaunchOptions};
use burn_mlx::distributed::{self, CommBackend, DistributedError, GradientAllReduce, Group};
use burn_mlx::{Mlx, MlxDevice};
use burn_nn::loss::CrossEntropyLossConfig;
use burn_optim::{AdamConfig, GradientsParams, Optimizer};
use clap::Parser;
use device_flag::DeviceFlag;
use model::Mlp;
use std::time::{Duration, Instant};

/// The training backend: MLX with Burn's autodiff decorator.
type Train = Autodiff<Mlx>;

/// Data-parallel MLP training over MLX's distributed engine (see the file's docs).
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
    #[arg(long, value_enum, default_value_t = DeviceFlag::Cpu)]
    device: DeviceFlag,
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
    if let Err(e) = MlxDevice::from(args.device).check() {
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
    let device = MlxDevice::from(args.device);
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
    let local_batch = args.batch / size;

    // Every rank generates the same points and keeps every `size`-th one.
    let (points, labels) = spiral(args.points);
    let shard: Vec<usize> = (rank..labels.len()).step_by(size).collect();
    let shard_points: Vec<f32> = shard
        .iter()
        .flat_map(|&i| [points[2 * i], points[2 * i + 1]])
        .collect();
    let shard_labels: Vec<i64> = shard.iter().map(|&i| labels[i]).collect();
    let x_all =
        Tensor::<Train, 2>::from_data(TensorData::new(shard_points, [shard.len(), 2]), &device);
    let y_all =
        Tensor::<Train, 1, Int>::from_data(TensorData::new(shard_labels, [shard.len()]), &device);
    println!(
        "rank {rank}: shard of {} points, {local_batch} per step (global batch {})",
        shard.len(),
        args.batch
    );

    Train::seed(&device, 1 + rank as u64);
    let reducer = GradientAllReduce::new();
    let mut model = Mlp::<Train>::new(2, args.hidden, 3, &device);
    if let Some(group) = &group {
        model = ddp::broadcast_module(group, &reducer, model, 0)?;
    }
    let mut optim = AdamConfig::new().init::<Train, Mlp<Train>>();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);

    let warmup = 5.min(args.steps);
    let mut start = Instant::now();
    for step in 0..args.steps {
        if step == warmup {
            Mlx::sync(&device).expect("sync");
            start = Instant::now();
        }
        let offset = (step * local_batch) % shard.len();
        let idx: Vec<i64> = (0..local_batch)
            .map(|i| ((offset + i) % shard.len()) as i64)
            .collect();
        let idx = Tensor::<Train, 1, Int>::from_data(TensorData::new(idx, [local_batch]), &device);
        let logits = model.forward(x_all.clone().select(0, idx.clone()));
        let loss = loss_fn.forward(logits, y_all.clone().select(0, idx));
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let grads = match &group {
            Some(group) => ddp::all_reduce_gradients(group, &reducer, &model, grads)?,
            None => grads,
        };
        model = optim.step(args.lr, model, grads);
        if step % 50 == 0 || step + 1 == args.steps {
            let global = match &group {
                Some(group) => group.all_sum(loss.inner())?,
                None => loss.inner(),
            };
            let global: f32 = global.into_scalar().elem::<f32>() / size as f32;
            if rank == 0 {
                println!("step {step:>5}  loss {global:.4} (mean over ranks)");
            }
        }
    }
    Mlx::sync(&device).expect("sync");
    let seconds = start.elapsed().as_secs_f64();
    let timed_steps = args.steps - warmup;
    let samples = (timed_steps * local_batch) as f64;
    println!(
        "rank {rank}: {timed_steps} steps in {seconds:.2} s, {:.1} ms/step, {:.0} samples/s on its shard",
        1e3 * seconds / timed_steps.max(1) as f64,
        samples / seconds
    );
    // Global throughput: every rank's samples over the slowest rank's time.
    let (total, slowest) = match &group {
        Some(group) => {
            let stats = Tensor::<Mlx, 1>::from_floats([samples as f32], &device);
            let total: f32 = group.all_sum(stats)?.into_scalar().elem();
            let slowest: f32 = group
                .all_max(Tensor::<Mlx, 1>::from_floats([seconds as f32], &device))?
                .into_scalar()
                .elem();
            (total, slowest)
        }
        None => (samples as f32, seconds as f32),
    };
    if rank == 0 {
        println!(
            "global: {size} rank(s), {:.0} samples/s ({:.1} ms per global step of {})",
            total / slowest,
            1e3 * slowest / timed_steps.max(1) as f32,
            args.batch
        );
        let acc = accuracy(&model.valid(), &points, &labels, &device);
        println!("accuracy on all {} points: {acc:.1}%", labels.len());
    }
    if let Some(group) = &group {
        group.barrier()?;
    }
    Ok(())
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
    let device = MlxDevice::from(args.device);
    if rank == 0 {
        println!(
            "all_sum of f32 tensors between {size} ranks (ring, loopback); algbw = bytes / time, \
             busbw = algbw * 2 (n - 1) / n, best algbw from the fastest call"
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
