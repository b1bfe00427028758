//! `burn_mlx::distributed` on the CPU: 2 ranks over MLX's ring backend on loopback.
//!
//! Each test starts ranks of this same test binary with `burn_mlx::distributed::launch` (the
//! launcher under test: generated hostfile, `MLX_RANK`, output capture, killing, a time bound),
//! running the ignored [`worker`] test with `BURN_MLX_DIST_WORKER=<mode>`. The worker does one
//! job as a rank (collectives, training, a fault) and prints its results; the test reads them.
//! Every rank runs under the launcher's time bound and is killed when it passes or when the
//! test panics, so nothing is left running. Tests take a lock so that only one set of ranks
//! runs at a time (2 cores).
//!
//! - collectives: all_sum / all_max / all_min / all_gather / broadcast / send-recv for f32,
//!   bf16, i32 (and f16, f64, i64, u8, bool), shapes whose size is not a multiple of the rank
//!   count, empty tensors, and the bucketed gradient mean;
//! - parity: 20 Adam steps of an MLP, each rank on half of every batch with averaged gradients,
//!   against one process on the full batches: both ranks hold the same parameters bit for bit,
//!   within 1e-5 (relative) of the single process;
//! - faults: a rank killed mid-training (the other fails with a clear error, by itself, within
//!   30 s), a rank that stops responding (the watchdog's timeout), ranks that call different
//!   collectives, and set-up errors (malformed or missing hostfile, bad rank, no backend, a peer
//!   that never starts).

extern crate burn_core as burn;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, DType, Float, Int, Tensor, TensorData};
use burn_autodiff::Autodiff;
use burn_mlx::distributed::launch::{launch, LaunchOptions, LaunchReport, RankOutcome};
use burn_mlx::distributed::{
    self, CommBackend, DistributedError, GradientAllReduce, Group, Hostfile, InitOptions,
    INIT_TIMEOUT_ENV, TIMEOUT_ENV,
};
use burn_mlx::{Mlx, MlxDevice, MlxTensor};
use burn_mlx_distributed::ddp;
use burn_mlx_models::Mlp;
use burn_optim::{AdamConfig, GradientsParams, Optimizer};
use half::{bf16, f16};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

type Train = Autodiff<Mlx>;

/// The variable that turns the [`worker`] test into a rank, and says which job it does.
const WORKER_ENV: &str = "BURN_MLX_DIST_WORKER";
/// Worker settings for the fault tests.
const FAULT_ENV: &str = "BURN_MLX_DIST_FAULT";
const DEVICE: MlxDevice = MlxDevice::Cpu;
/// The exit code of a worker that ends with a `DistributedError`.
const ERROR_EXIT: i32 = 3;

/// One set of ranks at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The arguments that make this test binary run only the worker test, output uncaptured.
fn worker_args() -> Vec<&'static str> {
    vec![
        "worker",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]
}

/// Starts `n` ranks of the worker in `mode` and waits for them (at most `limit`).
fn run_ranks(mode: &str, n: usize, extra_env: &[(&str, &str)], limit: Duration) -> LaunchReport {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut options = LaunchOptions::new(n, exe, worker_args());
    options.env = [
        (WORKER_ENV, mode),
        (TIMEOUT_ENV, "30"),
        (INIT_TIMEOUT_ENV, "30"),
    ]
    .iter()
    .chain(extra_env)
    .map(|(k, v)| (k.into(), v.into()))
    .collect();
    options.timeout = Some(limit);
    options.grace = Duration::from_secs(5);
    options.forward_output = false;
    let report = launch(&options).expect("the ranks start");
    eprintln!(
        "{mode}: {} (run {:.1} s)",
        report.summary().replace('\n', "; "),
        report.seconds
    );
    report
}

/// Panics with every rank's output.
fn fail_with(report: &LaunchReport, what: &str) -> ! {
    let outputs: Vec<String> = report
        .ranks
        .iter()
        .map(|r| {
            format!(
                "--- rank {} ({:?}, killed {}):\n{}",
                r.rank,
                r.status,
                r.killed,
                r.output()
            )
        })
        .collect();
    panic!("{what}\n{}\n{}", report.summary(), outputs.join("\n"));
}

/// Asserts that every rank ended by itself with status 0.
fn assert_success(report: &LaunchReport) {
    if !report.success() {
        fail_with(report, "a rank failed");
    }
}

// ------------------------------------------------------------------------------------------
// The worker (one rank)
// ------------------------------------------------------------------------------------------

#[test]
#[ignore = "a rank of the other tests, which start it with BURN_MLX_DIST_WORKER set"]
fn worker() {
    let mode = std::env::var(WORKER_ENV).expect(
        "this is the rank process of tests/distributed.rs, started by its other tests with \
         BURN_MLX_DIST_WORKER=<mode>; it does nothing on its own",
    );
    let result = match mode.as_str() {
        "collectives" => collectives(),
        "parity" => parity(),
        "train" => train_with_fault(),
        "mismatch" => mismatch(),
        "config" => config_errors(),
        other => panic!("unknown worker mode {other}"),
    };
    if let Err(e) = result {
        eprintln!("ERROR: {e}");
        std::process::exit(ERROR_EXIT);
    }
}

fn floats<const D: usize>(values: Vec<f32>, shape: [usize; D]) -> Tensor<Mlx, D> {
    tensor(TensorData::new(values, shape))
}

/// A tensor with the data's own dtype (Burn's `from_data` alone converts to the default one).
fn tensor<const D: usize, K: burn::tensor::BasicOps<Mlx>>(data: TensorData) -> Tensor<Mlx, D, K> {
    let dtype = data.dtype;
    Tensor::from_data(data, (&DEVICE, dtype))
}

fn values<T: burn::tensor::Element, const D: usize, K>(t: Tensor<Mlx, D, K>) -> Vec<T>
where
    K: burn::tensor::BasicOps<Mlx>,
{
    t.into_data()
        .convert::<T>()
        .to_vec::<T>()
        .expect("readable")
}

/// Every collective on several dtypes, checked against values computed locally.
fn collectives() -> Result<(), DistributedError> {
    let group = distributed::init(CommBackend::Ring)?;
    let (rank, size) = (group.rank(), group.size());
    assert_eq!(size, 2, "the test starts 2 ranks");
    let r = rank as f32;
    // What rank `q` contributes at element `i`.
    let v = |q: usize, i: usize| (q * 100 + i) as f32 - 50.0;

    // all_sum, f32, 21 elements (not a multiple of 2) and 1 element.
    for shape in [[7usize, 3], [1, 1]] {
        let n = shape[0] * shape[1];
        let x = floats((0..n).map(|i| v(rank, i)).collect(), shape);
        let got = values::<f32, 2, _>(group.all_sum(x)?);
        let want: Vec<f32> = (0..n).map(|i| (0..size).map(|q| v(q, i)).sum()).collect();
        assert_eq!(got, want, "all_sum f32 {shape:?}");
    }
    // all_sum bf16 (values exact in bf16), 5 elements.
    let x = tensor::<1, Float>(TensorData::new(
        (0..5).map(|i| bf16::from_f32(v(rank, i))).collect(),
        [5],
    ));
    let got = values::<f32, 1, _>(group.all_sum(x)?);
    let want: Vec<f32> = (0..5)
        .map(|i| bf16::from_f32((0..size).map(|q| v(q, i)).sum()).to_f32())
        .collect();
    assert_eq!(got, want, "all_sum bf16");
    // f16 and f64.
    let x = tensor::<1, Float>(TensorData::new(vec![f16::from_f32(r + 0.5); 3], [3]));
    assert_eq!(
        values::<f32, 1, _>(group.all_sum(x)?),
        vec![2.0; 3],
        "all_sum f16"
    );
    let x = tensor::<1, Float>(TensorData::new(vec![r as f64 + 0.25; 3], [3]));
    assert_eq!(
        values::<f64, 1, _>(group.all_sum(x)?),
        vec![1.5; 3],
        "all_sum f64"
    );

    // i32: sum, max, min on 9 elements; i64 and u8.
    let ints = |q: usize| -> Vec<i32> { (0..9).map(|i| (i - 4) * (q as i32 * 2 - 1)).collect() };
    let x = || tensor::<2, Int>(TensorData::new(ints(rank), [3, 3]));
    let (a, b) = (ints(0), ints(1));
    let sum: Vec<i32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    let max: Vec<i32> = a.iter().zip(&b).map(|(x, y)| *x.max(y)).collect();
    let min: Vec<i32> = a.iter().zip(&b).map(|(x, y)| *x.min(y)).collect();
    assert_eq!(values::<i32, 2, _>(group.all_sum(x())?), sum, "all_sum i32");
    assert_eq!(values::<i32, 2, _>(group.all_max(x())?), max, "all_max i32");
    assert_eq!(values::<i32, 2, _>(group.all_min(x())?), min, "all_min i32");
    let x = tensor::<1, Int>(TensorData::new(vec![1i64 << 40; 3], [3]));
    assert_eq!(
        values::<i64, 1, _>(group.all_sum(x)?),
        vec![1i64 << 41; 3],
        "all_sum i64"
    );
    let x = tensor::<1, Int>(TensorData::new(vec![rank as u8 + 1; 3], [3]));
    assert_eq!(
        values::<u8, 1, _>(group.all_sum(x)?),
        vec![3u8; 3],
        "all_sum u8"
    );
    // bool: all_sum is a logical OR.
    let x = tensor::<1, Bool>(TensorData::new(vec![rank == 0, rank == 1, false], [3]));
    assert_eq!(
        values::<bool, 1, _>(group.all_sum(x)?),
        vec![true, true, false],
        "all_sum bool"
    );

    // all_gather: rank order along axis 0, for f32 [3, 2], bf16 [3], i32 [5], bool [3].
    let x = floats((0..6).map(|i| v(rank, i)).collect(), [3, 2]);
    let got = group.all_gather(x)?;
    assert_eq!(got.dims(), [6, 2]);
    let want: Vec<f32> = (0..size)
        .flat_map(|q| (0..6).map(move |i| v(q, i)))
        .collect();
    assert_eq!(values::<f32, 2, _>(got), want, "all_gather f32");
    let x = tensor::<1, Float>(TensorData::new(vec![bf16::from_f32(r + 0.5); 3], [3]));
    assert_eq!(
        values::<f32, 1, _>(group.all_gather(x)?),
        vec![0.5, 0.5, 0.5, 1.5, 1.5, 1.5],
        "all_gather bf16"
    );
    let x = tensor::<1, Int>(TensorData::new(vec![rank as i32; 5], [5]));
    assert_eq!(
        values::<i32, 1, _>(group.all_gather(x)?),
        vec![0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
    );
    let x = tensor::<1, Bool>(TensorData::new(vec![rank == 1; 3], [3]));
    assert_eq!(
        values::<bool, 1, _>(group.all_gather(x)?),
        vec![false, false, false, true, true, true]
    );

    // broadcast from rank 1, bit for bit (-0.0, NaN with a payload, infinity), and bf16, i32,
    // bool from rank 0.
    let special = [
        -0.0f32,
        f32::from_bits(0x7fc0_1234),
        f32::INFINITY,
        1.0e-40,
        3.5,
    ];
    let mine: Vec<f32> = if rank == 1 {
        special.to_vec()
    } else {
        vec![9.0; 5]
    };
    let got = values::<f32, 1, _>(group.broadcast(floats(mine, [5]), 1)?);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&special), "broadcast f32 bits");
    let x = tensor::<1, Float>(TensorData::new(vec![bf16::from_f32(r * 3.0 + 1.0); 3], [3]));
    assert_eq!(
        values::<f32, 1, _>(group.broadcast(x, 0)?),
        vec![1.0; 3],
        "broadcast bf16"
    );
    let x = tensor::<2, Int>(TensorData::new(vec![rank as i32 - 7; 7], [7, 1]));
    assert_eq!(
        values::<i32, 2, _>(group.broadcast(x, 0)?),
        vec![-7; 7],
        "broadcast i32"
    );
    let x = tensor::<1, Bool>(TensorData::new(vec![rank == 0, false], [2]));
    assert_eq!(
        values::<bool, 1, _>(group.broadcast(x, 0)?),
        vec![true, false],
        "broadcast bool"
    );

    // send / recv: i32 from 0 to 1, then f16 [3, 3] back.
    if rank == 0 {
        group.send(
            tensor::<1, Int>(TensorData::new(vec![5i32, -6, 7, 8], [4])),
            1,
        )?;
        let back = group.recv(&[3, 3], DType::F16, DEVICE, 1)?;
        let back = Tensor::<Mlx, 2>::from_primitive(burn::tensor::TensorPrimitive::Float(back));
        assert_eq!(values::<f32, 2, _>(back), vec![0.25; 9], "recv f16");
    } else {
        let got = group.recv_like(tensor::<1, Int>(TensorData::new(vec![0i32; 4], [4])), 0)?;
        assert_eq!(values::<i32, 1, _>(got), vec![5, -6, 7, 8], "recv i32");
        let x = tensor::<2, Float>(TensorData::new(vec![f16::from_f32(0.25); 9], [3, 3]));
        group.send(x, 0)?;
    }

    // Empty tensors: nothing to move, shapes as MLX gives them.
    let x = floats(vec![], [0, 3]);
    assert_eq!(group.all_sum(x)?.dims(), [0, 3]);
    assert_eq!(group.all_gather(floats(vec![], [0, 3]))?.dims(), [0, 3]);

    // The bucketed mean: f32 and bf16 tensors, 64-byte buckets so that there are several.
    let reducer = GradientAllReduce::new().bucket_bytes(64);
    let a = floats((0..12).map(|i| v(rank, i)).collect(), [3, 4]);
    let b = tensor::<1, Float>(TensorData::new(vec![bf16::from_f32(r * 2.0); 5], [5]));
    let c = floats((0..21).map(|i| v(rank, i) * 0.5).collect(), [21]);
    let prim = |t: Tensor<Mlx, 1>| t.into_primitive().tensor();
    let out = reducer.all_mean(&group, vec![a.into_primitive().tensor(), prim(b), prim(c)])?;
    let read = |t: &MlxTensor| -> Vec<f32> {
        t.to_data()
            .expect("readable")
            .convert::<f32>()
            .to_vec()
            .expect("f32")
    };
    let mean = |i: usize| (0..size).map(|q| v(q, i)).sum::<f32>() / size as f32;
    assert_eq!(out[0].dims(), vec![3, 4]);
    assert_eq!(
        read(&out[0]),
        (0..12).map(mean).collect::<Vec<_>>(),
        "mean f32 [3, 4]"
    );
    assert_eq!(read(&out[1]), vec![1.0; 5], "mean bf16 [5]");
    assert_eq!(
        read(&out[2]),
        (0..21).map(|i| mean(i) * 0.5).collect::<Vec<_>>(),
        "mean f32 [21]"
    );

    group.barrier()?;
    println!("collectives ok on rank {rank}");
    Ok(())
}

/// Rows in one full batch.
const BATCH: usize = 64;

/// Batch `step`: inputs `[64, 8]` and regression targets `[64, 4]` (deterministic).
fn batch(step: usize) -> (Vec<f32>, Vec<f32>) {
    let mut state =
        0x9e37_79b9_7f4a_7c15u64 ^ (step as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let x: Vec<f32> = (0..BATCH * 8).map(|_| next()).collect();
    let y: Vec<f32> = (0..BATCH)
        .flat_map(|r| {
            let row = &x[r * 8..r * 8 + 8];
            [
                (row[0] * 2.0 + row[1]).sin(),
                row[2] * row[3],
                (row[4] - row[5]).abs(),
                row[6] + 0.5 * row[7],
            ]
        })
        .collect();
    (x, y)
}

/// This rank's rows of batch `step` as tensors.
fn shard(group: &Group, step: usize) -> (Tensor<Train, 2>, Tensor<Train, 2>) {
    let (x, y) = batch(step);
    let rows = BATCH / group.size();
    let r0 = group.rank() * rows;
    let x = x[r0 * 8..(r0 + rows) * 8].to_vec();
    let y = y[r0 * 4..(r0 + rows) * 4].to_vec();
    (
        Tensor::from_data(TensorData::new(x, [rows, 8]), &DEVICE),
        Tensor::from_data(TensorData::new(y, [rows, 4]), &DEVICE),
    )
}

/// One data-parallel Adam step; returns the loss averaged over the ranks.
fn ddp_step(
    group: &Group,
    reducer: &GradientAllReduce,
    model: Mlp<Train>,
    optim: &mut impl Optimizer<Mlp<Train>, Train>,
    step: usize,
) -> Result<(Mlp<Train>, f32), DistributedError> {
    let (x, y) = shard(group, step);
    let diff = model.forward(x) - y;
    let loss = (diff.clone() * diff).mean();
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let grads = ddp::all_reduce_gradients(group, reducer, &model, grads)?;
    let model = optim.step(1e-2, model, grads);
    let global = group.all_sum(loss.inner())?;
    Ok((model, values::<f32, 1, _>(global)[0] / group.size() as f32))
}

/// Prints every parameter as `PARAM <index> <values...>` (shortest round-trip decimals).
struct PrintParams(usize);

impl<B: AutodiffBackend> ModuleVisitor<B> for PrintParams {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let v: Vec<f32> = param
            .val()
            .into_data()
            .convert::<f32>()
            .to_vec()
            .expect("f32");
        let text: Vec<String> = v.iter().map(|x| format!("{x:?}")).collect();
        println!("PARAM {} {}", self.0, text.join(" "));
        self.0 += 1;
    }
}

/// 20 data-parallel Adam steps (or single-process ones, in a group of 1).
fn parity() -> Result<(), DistributedError> {
    let group = distributed::init(CommBackend::Any)?;
    let picked = if group.size() == 1 {
        CommBackend::Any
    } else {
        CommBackend::Ring
    };
    assert_eq!(group.backend(), picked, "the backend Any resolved to");
    // Different initial weights per rank: the broadcast from rank 0 must make them equal.
    Train::seed(&DEVICE, 7 + group.rank() as u64);
    let reducer = GradientAllReduce::new();
    let model = ddp::broadcast_module(&group, &reducer, Mlp::<Train>::new(8, 16, 4, &DEVICE), 0)?;
    let mut optim = AdamConfig::new().init::<Train, Mlp<Train>>();
    let mut model = model;
    for step in 0..20 {
        let (m, loss) = ddp_step(&group, &reducer, model, &mut optim, step)?;
        model = m;
        println!("LOSS {step} {loss:?}");
    }
    model.visit(&mut PrintParams(0));
    Ok(())
}

/// Data-parallel training for many steps, where one rank kills itself or stalls at step 5
/// (`BURN_MLX_DIST_FAULT=kill|stall`).
fn train_with_fault() -> Result<(), DistributedError> {
    let fault = std::env::var(FAULT_ENV).unwrap_or_default();
    let group = distributed::init(CommBackend::Ring)?;
    Train::seed(&DEVICE, 7);
    let reducer = GradientAllReduce::new();
    let mut model =
        ddp::broadcast_module(&group, &reducer, Mlp::<Train>::new(8, 16, 4, &DEVICE), 0)?;
    let mut optim = AdamConfig::new().init::<Train, Mlp<Train>>();
    for step in 0..400 {
        if step == 5 && group.rank() == 1 {
            println!("rank 1: fault `{fault}` at step {step}");
            match fault.as_str() {
                "kill" => {
                    let pid = std::process::id().to_string();
                    let _ = Command::new("kill").args(["-KILL", &pid]).status();
                    std::thread::sleep(Duration::from_secs(60));
                }
                "stall" => std::thread::sleep(Duration::from_secs(600)),
                other => panic!("unknown fault {other:?}"),
            }
        }
        let (m, loss) = match ddp_step(&group, &reducer, model, &mut optim, step % 20) {
            Ok(v) => v,
            Err(e) => {
                // The group is gone, but MLX must still work in this process (to save a
                // checkpoint, say): the watchdog freed the stream the collective held.
                let sum: f32 = floats(vec![1.0, 2.0], [2]).sum().into_scalar();
                println!("after the failure, MLX still computes: 1 + 2 = {sum}");
                return Err(e);
            }
        };
        model = m;
        println!("step {step} loss {loss:.5}");
    }
    Ok(())
}

/// Rank 0 sums a [3] tensor while rank 1 sums a [4] one.
fn mismatch() -> Result<(), DistributedError> {
    let group = distributed::init(CommBackend::Ring)?;
    let n = 3 + group.rank();
    group.all_sum(floats(vec![1.0; n], [n]))?;
    Ok(())
}

/// Set-up errors, one after the other, in one process.
fn config_errors() -> Result<(), DistributedError> {
    let dir = std::env::temp_dir().join(format!("burn-mlx-dist-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    /// Removes the folder however the checks end.
    struct RemoveDir(std::path::PathBuf);
    impl Drop for RemoveDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = RemoveDir(dir.clone());
    let file = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        p
    };
    // Edition 2021: set_var is safe; this process has a single thread here.
    let set = |hostfile: Option<&std::path::Path>, rank: Option<&str>| {
        match hostfile {
            Some(h) => std::env::set_var("MLX_HOSTFILE", h),
            None => std::env::remove_var("MLX_HOSTFILE"),
        }
        match rank {
            Some(r) => std::env::set_var("MLX_RANK", r),
            None => std::env::remove_var("MLX_RANK"),
        }
    };
    let ring = || {
        InitOptions::new(CommBackend::Ring)
            .init_timeout(Duration::from_secs(2))
            .init()
    };
    let expect = |case: &str, result: Result<Group, DistributedError>, needles: &[&str]| {
        let e = match result {
            Ok(g) => panic!("{case}: expected an error, got {g:?}"),
            Err(e) => e.to_string(),
        };
        println!("{case}: {e}");
        for n in needles {
            assert!(e.contains(n), "{case}: the error should say {n:?}: {e}");
        }
    };

    // NCCL is in MLX's CUDA build only: elsewhere the error says which build has it; in the CUDA
    // build, with nothing configured, it names the variables NCCL needs.
    let nccl_needles: &[&str] = if distributed::is_available(CommBackend::Nccl) {
        &["MLX_RANK", "MLX_WORLD_SIZE", "NCCL_HOST_IP", "NCCL_PORT"]
    } else {
        &["`nccl` is not available", "cuda"]
    };
    expect("nccl", distributed::init(CommBackend::Nccl), nccl_needles);
    // Nothing configured: Any is a single-process group, Ring an error.
    set(None, None);
    let single = distributed::init(CommBackend::Any)?;
    assert_eq!((single.rank(), single.size()), (0, 1));
    let x = floats(vec![1.0, 2.0], [2]);
    assert_eq!(values::<f32, 1, _>(single.all_sum(x)?), vec![1.0, 2.0]);
    expect(
        "ring without variables",
        ring(),
        &["MLX_HOSTFILE and MLX_RANK are not set", "launcher"],
    );
    // A missing hostfile.
    set(Some(&dir.join("missing.json")), Some("0"));
    expect(
        "missing hostfile",
        ring(),
        &["missing.json", "cannot be read", "MLX_HOSTFILE"],
    );
    // Malformed JSON, and JSON of the wrong shape.
    let bad = file("bad.json", "[[\"127.0.0.1:5000\"],\n [\"127.0.0.1:5001\"");
    set(Some(&bad), Some("0"));
    expect(
        "malformed hostfile",
        ring(),
        &["bad.json", "line 2", "end of the file", "\"ip:port\""],
    );
    let object = file("object.json", "{\"hosts\": [\"127.0.0.1:5000\"]}");
    set(Some(&object), Some("0"));
    expect(
        "object hostfile",
        ring(),
        &["line 1, column 1", "expected `[`", "found `{`"],
    );
    let names = file("names.json", "[[\"localhost:5000\"], [\"localhost:5001\"]]");
    set(Some(&names), Some("0"));
    expect("host names", ring(), &["\"localhost:5000\"", "IPv4"]);
    let one = file("one.json", "[[\"127.0.0.1:5000\"]]");
    set(Some(&one), Some("0"));
    expect("one rank", ring(), &["at least 2"]);
    // Bad ranks.
    let hosts = Hostfile::local(2, 1).expect("free ports");
    let good = dir.join("good.json");
    hosts.write(&good).expect("write");
    set(Some(&good), Some("5"));
    expect(
        "rank out of range",
        ring(),
        &["MLX_RANK=5", "lists 2 ranks"],
    );
    set(Some(&good), Some("one"));
    expect(
        "rank not a number",
        ring(),
        &["MLX_RANK=\"one\" is not a rank"],
    );
    // A peer that never starts: rank 0 waits for rank 1 at most the init timeout.
    set(Some(&good), Some("0"));
    let start = Instant::now();
    expect(
        "peer never started",
        ring(),
        &["rank 0 of 2 waited 2.0 s", "Start all 2 ranks"],
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "bounded by the init timeout"
    );
    println!("config ok");
    Ok(())
}

// ------------------------------------------------------------------------------------------
// The tests
// ------------------------------------------------------------------------------------------

#[test]
fn collectives_two_ranks() {
    let _serial = serial();
    let report = run_ranks("collectives", 2, &[], Duration::from_secs(120));
    assert_success(&report);
    for r in &report.ranks {
        assert!(
            r.stdout
                .iter()
                .any(|l| l.contains(&format!("collectives ok on rank {}", r.rank))),
            "rank {} did not finish its checks:\n{}",
            r.rank,
            r.output()
        );
    }
}

/// The `PARAM` lines of a rank, as vectors.
fn params(report: &LaunchReport, rank: usize) -> Vec<Vec<f32>> {
    report.ranks[rank]
        .stdout
        .iter()
        .filter_map(|l| Some(&l[l.find("PARAM ")? + 6..]))
        .map(|l| {
            l.split(' ')
                .skip(1)
                .map(|v| v.parse().expect("a float"))
                .collect()
        })
        .collect()
}

/// The `LOSS` values of a rank.
fn losses(report: &LaunchReport, rank: usize) -> Vec<f32> {
    report.ranks[rank]
        .stdout
        .iter()
        .filter_map(|l| Some(&l[l.find("LOSS ")? + 5..]))
        .map(|l| {
            l.split(' ')
                .nth(1)
                .expect("a value")
                .parse()
                .expect("a float")
        })
        .collect()
}

#[test]
fn data_parallel_adam_matches_one_process() {
    let _serial = serial();
    let two = run_ranks("parity", 2, &[], Duration::from_secs(180));
    assert_success(&two);
    let one = run_ranks("parity", 1, &[], Duration::from_secs(180));
    assert_success(&one);
    let (p0, p1, single) = (params(&two, 0), params(&two, 1), params(&one, 0));
    assert_eq!(
        p0.len(),
        6,
        "3 weights and 3 biases:\n{}",
        two.ranks[0].output()
    );
    assert_eq!(
        p0, p1,
        "both ranks must hold the same parameters, bit for bit"
    );
    let mut worst = 0.0f64;
    for (i, (a, b)) in p0.iter().zip(&single).enumerate() {
        assert_eq!(a.len(), b.len(), "parameter {i}");
        let diff: f64 = a
            .iter()
            .zip(b)
            .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
            .sum();
        let norm: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
        let rel = (diff / norm).sqrt();
        let max_abs = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        eprintln!(
            "parameter {i}: {} values, relative L2 difference {rel:.2e}, max |diff| {max_abs:.2e}",
            a.len()
        );
        worst = worst.max(rel);
    }
    assert!(
        worst <= 1e-5,
        "2 ranks vs 1 process: relative difference {worst:.2e} > 1e-5"
    );
    let (l2, l1) = (losses(&two, 0), losses(&one, 0));
    assert_eq!(l2.len(), 20);
    for (step, (a, b)) in l2.iter().zip(&l1).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs().max(1e-3),
            "loss at step {step}: {a} vs {b}"
        );
    }
    assert!(l1[19] < l1[0] * 0.8, "the loss should fall: {l1:?}");
}

/// Rank 0's error names every one of `needles`, and MLX still computed on rank 0 after it.
fn assert_failed_and_recovered(r0: &RankOutcome, needles: &[&str]) {
    let err = r0.stderr.join("\n");
    for needle in needles {
        assert!(
            err.contains(needle),
            "rank 0's error should say {needle:?}:\n{err}"
        );
    }
    assert!(
        r0.stdout
            .iter()
            .any(|l| l.contains("MLX still computes: 1 + 2 = 3")),
        "MLX should still work on rank 0 after the failure:\n{}",
        r0.output()
    );
}

#[test]
fn killed_rank_fails_the_other_within_30s() {
    let _serial = serial();
    let report = run_ranks("train", 2, &[(FAULT_ENV, "kill")], Duration::from_secs(120));
    let (r0, r1) = (&report.ranks[0], &report.ranks[1]);
    let signal = |r: &burn_mlx::distributed::launch::RankOutcome| {
        use std::os::unix::process::ExitStatusExt;
        r.status.and_then(|s| s.signal())
    };
    if signal(r1) != Some(9)
        || r1.killed
        || r0.killed
        || r0.status.and_then(|s| s.code()) != Some(ERROR_EXIT)
    {
        fail_with(
            &report,
            "rank 1 should die by SIGKILL and rank 0 end by itself with a distributed error",
        );
    }
    assert_failed_and_recovered(
        r0,
        &[
            "rank 0 of 2",
            "connection to a peer was lost",
            "Another rank exited",
        ],
    );
    let after = r0.seconds - r1.seconds;
    eprintln!("rank 0 failed {after:.2} s after rank 1 died");
    assert!(after < 30.0, "rank 0 took {after:.1} s to fail");
}

#[test]
fn stalled_rank_times_out_on_the_other() {
    let _serial = serial();
    let report = run_ranks(
        "train",
        2,
        &[(FAULT_ENV, "stall"), (TIMEOUT_ENV, "5")],
        Duration::from_secs(120),
    );
    let (r0, r1) = (&report.ranks[0], &report.ranks[1]);
    if report.first_failure != Some(0)
        || r0.killed
        || r0.status.and_then(|s| s.code()) != Some(ERROR_EXIT)
        || !r1.killed
    {
        fail_with(
            &report,
            "rank 0 should time out by itself and the launcher kill stalled rank 1",
        );
    }
    assert_failed_and_recovered(
        r0,
        &[
            "on rank 0 of 2 did not finish within",
            "burn-mlx closed this rank's",
        ],
    );
    let stalled_at = r1
        .stdout
        .iter()
        .position(|l| l.contains("fault `stall`"))
        .expect("rank 1 reached the fault");
    assert!(stalled_at > 0);
    assert!(r0.seconds < 60.0, "rank 0 ended after {:.1} s", r0.seconds);
}

#[test]
fn ranks_that_disagree_fail_with_both_shapes() {
    let _serial = serial();
    let report = run_ranks("mismatch", 2, &[], Duration::from_secs(60));
    for r in &report.ranks {
        if r.killed || r.status.and_then(|s| s.code()) != Some(ERROR_EXIT) {
            fail_with(&report, "both ranks should fail with a mismatch");
        }
        let err = r.stderr.join("\n");
        for needle in [
            "the ranks disagree",
            "rank 0 called all_sum #1 of [3]",
            "rank 1 called all_sum #1 of [4]",
        ] {
            assert!(
                err.contains(needle),
                "rank {}'s error should say {needle:?}:\n{err}",
                r.rank
            );
        }
    }
}

#[test]
fn setup_errors_are_clear() {
    let _serial = serial();
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = Command::new(exe)
        .args(worker_args())
        .env(WORKER_ENV, "config")
        .env_remove("MLX_RANK")
        .env_remove("MLX_HOSTFILE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the worker");
    let deadline = Instant::now() + Duration::from_secs(90);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the set-up checks did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("output");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && text.contains("config ok"), "{text}");
}

/// With `nccl`, the launcher gives each rank NCCL's variables (rendezvous on loopback, one GPU
/// each) and no hostfile; no GPU is needed to check that.
#[test]
fn launcher_sets_nccl_variables() {
    let script = "echo vars $MLX_RANK $MLX_WORLD_SIZE $NCCL_HOST_IP $NCCL_PORT \
                  ${CUDA_VISIBLE_DEVICES:-none} ${MLX_HOSTFILE:-nohostfile}";
    let mut options = LaunchOptions::new(2, "sh", ["-c", script]);
    options.nccl = true;
    options.forward_output = false;
    options.timeout = Some(Duration::from_secs(30));
    let report = launch(&options).expect("the ranks start");
    assert!(report.success(), "{}", report.summary());
    let vars: Vec<Vec<String>> = report
        .ranks
        .iter()
        .map(|r| {
            let line = r
                .stdout
                .iter()
                .find(|l| l.starts_with("vars "))
                .expect("the vars line");
            line.split_whitespace()
                .skip(1)
                .map(str::to_string)
                .collect()
        })
        .collect();
    let own_gpus = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    for (rank, v) in vars.iter().enumerate() {
        assert_eq!(v[0], rank.to_string(), "{v:?}");
        assert_eq!(&v[1..3], ["2", "127.0.0.1"], "{v:?}");
        assert!(v[3].parse::<u16>().is_ok_and(|p| p > 0), "{v:?}");
        assert_eq!(v[3], vars[0][3], "one rendezvous port: {vars:?}");
        if own_gpus.is_none() {
            assert_eq!(v[4], rank.to_string(), "rank r on GPU r: {v:?}");
        }
        assert_eq!(v[5], "nohostfile", "{v:?}");
    }
}

#[test]
fn hostfile_reader() {
    let h = Hostfile::parse("[[\"127.0.0.1:5000\"],\n [\"127.0.0.1:5001\"]]").expect("valid");
    assert_eq!(h.size(), 2);
    assert_eq!(Hostfile::parse(&h.to_json()).expect("round trip"), h);
    let err = |text: &str| Hostfile::parse(text).expect_err(text);
    let e = err("[[\"127.0.0.1:5000\"],\n {\"a\": 1}]");
    assert!(
        e.contains("line 2, column 2") && e.contains("found `{`"),
        "{e}"
    );
    let e = err("[[\"127.0.0.1:5000\", \"127.0.0.1:5002\"], [\"127.0.0.1:5001\"]]");
    assert!(e.contains("same number"), "{e}");
    let e = err("[[\"127.0.0.1:5000\"], [\"127.0.0.1:5000\"]]");
    assert!(e.contains("twice"), "{e}");
    assert!(err("[]").contains("at least 2"));
    assert!(err("[[\"127.0.0.1:5000\"], []]").contains("no address for rank 1"));
    let hosts = Hostfile::for_hosts(
        &["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()],
        5000,
        2,
    );
    assert_eq!(
        hosts.to_json(),
        "[\n  [\"10.0.0.1:5000\", \"10.0.0.1:5001\"],\n  [\"10.0.0.2:5000\", \"10.0.0.2:5001\"]\n]\n"
    );
    let local = Hostfile::local(3, 2).expect("free ports");
    let mut ports: Vec<u16> = local.ranks.iter().flatten().map(|a| a.port()).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 6, "distinct ports");
}
