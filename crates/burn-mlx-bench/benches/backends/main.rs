//! Burn on `Mlx` against Burn's CPU backends (NdArray, Flex, Candle) and against raw mlx-rs
//! (the lower bound on Burn's overhead), workload by workload, with criterion.
//!
//! ```text
//! cargo bench -p burn-mlx-bench                         # everything; writes BENCHMARKS.md and benches/plot.svg
//! cargo bench -p burn-mlx-bench -- matmul_f32           # only benchmark ids (workload/backend) matching
//! cargo bench -p burn-mlx-bench -- 'softmax_1024/mlx$'  # a trailing `$` anchors the end
//! ```
//!
//! Criterion ids: group = workload, function = backend (`mlx`, `mlx-compiled`, `ndarray`, `flex`,
//! `candle`, `mlx-rs`). A run ends when its result is computed: `eval` on MLX (its graphs are lazy), a
//! read-back of one element of the result on the other backends. A backend whose first run of a
//! workload panics (a dtype or op it lacks) is reported as "n/a" with the panic message.
//!
//! After a full run, [`report`] writes `BENCHMARKS.md` and [`plot`] draws `benches/plot.svg`, both
//! at the workspace root. The MLP, CNN and Transformer encoder are burn-mlx-models', the same
//! models `gpu_bench` trains.

// burn-candle 0.21 is marked deprecated upstream; it is still one of the CPU peers asked for.
#![allow(deprecated)]

extern crate burn_core as burn;

mod plot;
mod report;

use burn::module::{AutodiffModule, Module, ModuleMapper, Param};
use burn_autodiff::Autodiff;
use burn_candle::{Candle, CandleDevice};
use burn_flex::{Flex, FlexDevice};
use burn_mlx::{compile_float, Mlx, MlxDevice};
use burn_mlx_models::{labels, Cnn, Encoder, Mlp};
use burn_ndarray::{NdArray, NdArrayDevice};
use burn_nn::loss::CrossEntropyLossConfig;
use burn_optim::{AdamConfig, GradientsParams, Optimizer};
use burn_tensor::backend::{AutodiffBackend, Backend};
use burn_tensor::module::{conv2d, max_pool2d};
use burn_tensor::ops::ConvOptions;
use burn_tensor::{activation, DType, Distribution, Tensor};
use criterion::{Criterion, SamplingMode};
use mlx_rs::Array;
use report::{NotApplicable, RunInfo, Workload};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// One timed run of a workload on one implementation.
type Job = Box<dyn FnMut()>;
/// Builds a [`Job`] (inputs, model, optimizer), outside the timed region.
type Maker = Box<dyn FnOnce() -> Job>;

/// Runs workloads through criterion and remembers what the report needs.
struct Suite {
    c: Criterion,
    filter: Option<String>,
    workloads: Vec<Workload>,
    not_applicable: Vec<NotApplicable>,
}

impl Suite {
    /// Benchmarks one workload on each `(backend id, maker)`. Each job is built and run once
    /// first (a backend that panics there cannot run the workload and is recorded as n/a).
    fn run(&mut self, id: &str, label: &str, training: bool, jobs: Vec<(&'static str, Maker)>) {
        self.workloads.push(Workload {
            id: id.to_string(),
            label: label.to_string(),
            training,
        });
        let mut group = self.c.benchmark_group(id);
        // Training steps get more samples: their ratios are the ones the issue judges, and this
        // machine's run-to-run noise is larger than the differences between them.
        let (samples, millis) = if training { (20, 4000) } else { (10, 1500) };
        group
            .sample_size(samples)
            .sampling_mode(SamplingMode::Flat)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_millis(millis));
        for (backend, make) in jobs {
            let full = format!("{id}/{backend}");
            if let Some(f) = &self.filter {
                // As criterion reads it (a regex): a trailing `$` anchors the end of the id.
                let wanted = match f.strip_suffix('$') {
                    Some(exact) => full.ends_with(exact),
                    None => full.contains(f.as_str()),
                };
                if !wanted {
                    continue;
                }
            }
            let probe = catch_unwind(AssertUnwindSafe(move || {
                let mut job = make();
                job();
                job
            }));
            match probe {
                Ok(mut job) => {
                    group.bench_function(backend, |b| b.iter(&mut job));
                }
                Err(e) => {
                    let reason = e
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "panicked".into());
                    let reason = reason.lines().next().unwrap_or("").to_string();
                    println!("{full}: n/a ({reason})");
                    self.not_applicable.push(NotApplicable {
                        workload: id.to_string(),
                        backend: backend.to_string(),
                        reason,
                    });
                }
            }
        }
        group.finish();
    }
}

/// The four Burn backends, each building `$f::<Backend>(&device, args...)`.
macro_rules! burn_peers {
    ($f:ident $(, $arg:expr)*) => {
        vec![
            ("mlx", Box::new(move || $f::<Mlx>(&MlxDevice::Cpu $(, $arg)*)) as Maker),
            ("ndarray", Box::new(move || $f::<NdArray>(&NdArrayDevice::Cpu $(, $arg)*)) as Maker),
            ("flex", Box::new(move || $f::<Flex>(&FlexDevice $(, $arg)*)) as Maker),
            ("candle", Box::new(move || $f::<Candle>(&CandleDevice::Cpu $(, $arg)*)) as Maker),
        ]
    };
}

/// The four Burn backends under `Autodiff`, each building `$f::<Autodiff<Backend>>(...)`.
macro_rules! train_peers {
    ($f:ident $(, $arg:expr)*) => {
        vec![
            ("mlx", Box::new(move || $f::<Autodiff<Mlx>>(&MlxDevice::Cpu $(, $arg)*)) as Maker),
            ("ndarray", Box::new(move || $f::<Autodiff<NdArray>>(&NdArrayDevice::Cpu $(, $arg)*)) as Maker),
            ("flex", Box::new(move || $f::<Autodiff<Flex>>(&FlexDevice $(, $arg)*)) as Maker),
            ("candle", Box::new(move || $f::<Autodiff<Candle>>(&CandleDevice::Cpu $(, $arg)*)) as Maker),
        ]
    };
}

/// Adds the compiled `Mlx` job to a list of Burn peers.
fn with_compiled(
    mut jobs: Vec<(&'static str, Maker)>,
    compiled: Maker,
) -> Vec<(&'static str, Maker)> {
    jobs.insert(1, ("mlx-compiled", compiled));
    jobs
}

/// Adds raw mlx-rs's job to a list of Burn peers.
fn with_raw(mut jobs: Vec<(&'static str, Maker)>, raw: Maker) -> Vec<(&'static str, Maker)> {
    jobs.push(("mlx-rs", raw));
    jobs
}

/// Forces a Burn tensor's value: MLX evaluates the graph that produces it (whole primitives, so
/// the full result); the eager backends have computed it and hand back one element.
fn force<B: Backend, const D: usize>(t: Tensor<B, D>) {
    let flat = t.reshape([-1]);
    if flat.dims()[0] > 0 {
        let _ = flat.narrow(0, 0, 1).into_data();
    }
}

fn rand<B: Backend, const D: usize>(shape: [usize; D], device: &B::Device) -> Tensor<B, D> {
    let t = Tensor::<B, D>::random(shape, Distribution::Uniform(-1.0, 1.0), device);
    force(t.clone());
    t
}

fn raw_uniform(shape: &[i32]) -> Array {
    let a = mlx_rs::random::uniform::<_, f32>(-1.0f32, 1.0f32, shape, None).unwrap();
    a.eval().unwrap();
    a
}

fn raw_dtype(dt: DType) -> mlx_rs::Dtype {
    match dt {
        DType::F16 => mlx_rs::Dtype::Float16,
        DType::BF16 => mlx_rs::Dtype::Bfloat16,
        _ => mlx_rs::Dtype::Float32,
    }
}

// ---------------------------------------------------------------- tensor workloads

/// `[batch, n, n] @ [batch, n, n]` (plain 2-D when `batch` is 1) in dtype `dt`.
fn matmul_job<B: Backend>(d: &B::Device, batch: usize, n: usize, dt: DType) -> Job {
    if batch == 1 {
        let a = rand::<B, 2>([n, n], d).cast(dt);
        let b = rand::<B, 2>([n, n], d).cast(dt);
        force(a.clone());
        force(b.clone());
        Box::new(move || force(a.clone().matmul(b.clone())))
    } else {
        let a = rand::<B, 3>([batch, n, n], d).cast(dt);
        let b = rand::<B, 3>([batch, n, n], d).cast(dt);
        force(a.clone());
        force(b.clone());
        Box::new(move || force(a.clone().matmul(b.clone())))
    }
}

fn raw_matmul(batch: usize, n: usize, dt: DType) -> Maker {
    Box::new(move || {
        let shape: Vec<i32> = if batch == 1 {
            vec![n as i32, n as i32]
        } else {
            vec![batch as i32, n as i32, n as i32]
        };
        let a = raw_uniform(&shape).as_dtype(raw_dtype(dt)).unwrap();
        let b = raw_uniform(&shape).as_dtype(raw_dtype(dt)).unwrap();
        a.eval().unwrap();
        b.eval().unwrap();
        Box::new(move || a.matmul(&b).unwrap().eval().unwrap())
    })
}

/// `exp(x * 0.5 + 1) * x`: four elementwise ops, one graph on MLX.
fn chain_job<B: Backend>(d: &B::Device, n: usize) -> Job {
    let x = rand::<B, 1>([n], d);
    Box::new(move || force((x.clone() * 0.5 + 1.0).exp() * x.clone()))
}

/// [`chain_job`] on `Mlx` with the chain compiled by `burn_mlx::compile_float` (one fused kernel).
fn compiled_chain(n: usize) -> Maker {
    Box::new(move || {
        let x = rand::<Mlx, 1>([n], &MlxDevice::Cpu);
        let mut f = compile_float::<1, _>(
            |x| vec![(x[0].clone() * 0.5 + 1.0).exp() * x[0].clone()],
            false,
        );
        Box::new(move || force(f.call(vec![x.clone()]).expect("compiled chain").remove(0)))
    })
}

fn raw_chain(n: usize) -> Maker {
    Box::new(move || {
        let x = raw_uniform(&[n as i32]);
        Box::new(move || {
            let y = x
                .multiply(Array::from_f32(0.5))
                .unwrap()
                .add(Array::from_f32(1.0))
                .unwrap()
                .exp()
                .unwrap()
                .multiply(&x)
                .unwrap();
            y.eval().unwrap();
        })
    })
}

/// 0: sum over the last axis, 1: max over the last axis, 2: softmax over the last axis, 3:
/// log-softmax over the last axis.
fn reduce_job<B: Backend>(d: &B::Device, which: u8) -> Job {
    let x = rand::<B, 2>([1024, 1024], d);
    match which {
        0 => Box::new(move || force(x.clone().sum_dim(1))),
        1 => Box::new(move || force(x.clone().max_dim(1))),
        2 => Box::new(move || force(activation::softmax(x.clone(), 1))),
        _ => Box::new(move || force(activation::log_softmax(x.clone(), 1))),
    }
}

fn raw_reduce(which: u8) -> Maker {
    Box::new(move || {
        let x = raw_uniform(&[1024, 1024]);
        match which {
            0 => Box::new(move || x.sum_axis(1, true).unwrap().eval().unwrap()),
            1 => Box::new(move || x.max_axis(1, true).unwrap().eval().unwrap()),
            2 => Box::new(move || {
                mlx_rs::ops::softmax_axis(&x, 1, true)
                    .unwrap()
                    .eval()
                    .unwrap()
            }),
            // What Burn + Mlx computes, with MLX's own `logsumexp`.
            _ => Box::new(move || {
                let lse = mlx_rs::ops::logsumexp_axis(&x, 1, true).unwrap();
                x.subtract(&lse).unwrap().eval().unwrap()
            }),
        }
    })
}

fn conv_job<B: Backend>(d: &B::Device) -> Job {
    let x = rand::<B, 4>([8, 64, 56, 56], d);
    let w = rand::<B, 4>([64, 64, 3, 3], d);
    Box::new(move || {
        let opts = ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
        force(conv2d(x.clone(), w.clone(), None, opts))
    })
}

fn raw_conv() -> Maker {
    Box::new(|| {
        // MLX's own layout: channels last, weights [out, kh, kw, in].
        let x = raw_uniform(&[8, 56, 56, 64]);
        let w = raw_uniform(&[64, 3, 3, 64]);
        Box::new(move || {
            mlx_rs::ops::conv2d(&x, &w, (1, 1), (1, 1), (1, 1), 1)
                .unwrap()
                .eval()
                .unwrap()
        })
    })
}

fn pool_job<B: Backend>(d: &B::Device) -> Job {
    let x = rand::<B, 4>([8, 64, 56, 56], d);
    Box::new(move || force(max_pool2d(x.clone(), [3, 3], [2, 2], [1, 1], [1, 1], false)))
}

// ---------------------------------------------------------------- training steps

/// Casts every float parameter of a module to a dtype, as fresh trainable leaves.
struct CastParams(DType);

impl<B: Backend> ModuleMapper<B> for CastParams {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let cast = tensor.cast(self.0).detach().require_grad();
        Param::from_mapped_value(id, cast, mapper)
    }
}

/// One Adam step per run: forward, backward, update, loss read back. Reading the loss evaluates
/// this step's forward pass and, through the parameters, the previous step's update.
fn step_job<B, M>(model: M, loss: impl Fn(&M) -> Tensor<B, 1> + 'static) -> Job
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + 'static,
{
    let mut model = Some(model);
    let mut optim = AdamConfig::new().init::<B, M>();
    Box::new(move || {
        let m = model.take().expect("model is put back after every step");
        let l = loss(&m);
        let grads = GradientsParams::from_grads(l.backward(), &m);
        let m = optim.step(1e-3, m, grads);
        let _ = l.into_data();
        model = Some(m);
    })
}

fn mlp_job<B: AutodiffBackend>(d: &B::Device, dt: DType) -> Job {
    let x = Tensor::<B, 2>::random([128, 784], Distribution::Default, d).cast(dt);
    let y = labels::<B>(128, d);
    let ce = CrossEntropyLossConfig::new().init(d);
    let model = Mlp::<B>::new(784, 512, 10, d);
    let model = if dt == DType::F32 {
        model
    } else {
        model.map(&mut CastParams(dt))
    };
    step_job(model, move |m| ce.forward(m.forward(x.clone()), y.clone()))
}

fn cnn_job<B: AutodiffBackend>(d: &B::Device) -> Job {
    let x = Tensor::<B, 4>::random([64, 1, 28, 28], Distribution::Default, d);
    let y = labels::<B>(64, d);
    let ce = CrossEntropyLossConfig::new().init(d);
    step_job(Cnn::<B>::new(d), move |m| {
        ce.forward(m.forward(x.clone()), y.clone())
    })
}

fn transformer_job<B: AutodiffBackend>(d: &B::Device) -> Job {
    let model = Encoder::<B>::new(d);
    let x = Tensor::<B, 3>::random([16, 128, 256], Distribution::Default, d);
    let target = Tensor::<B, 3>::random([16, 128, 256], Distribution::Default, d);
    step_job(model, move |m| {
        let out = m.forward(x.clone());
        (out - target.clone()).powi_scalar(2).mean()
    })
}

/// The MLP step in raw mlx-rs: the same layers, cross-entropy and Adam update, written directly
/// against MLX arrays with `value_and_grad` (the lower bound for Burn + Mlx).
fn raw_mlp() -> Maker {
    Box::new(|| {
        use mlx_rs::error::Exception;
        use mlx_rs::ops;
        let mut params: Vec<Array> = Vec::new();
        for (i, o) in [(784, 512), (512, 512), (512, 10)] {
            let a = 1.0 / (i as f32).sqrt();
            params.push(mlx_rs::random::uniform::<_, f32>(-a, a, &[i, o][..], None).unwrap());
            params.push(ops::zeros::<f32>(&[o]).unwrap());
        }
        let x = raw_uniform(&[128, 784]);
        let y: Vec<i32> = (0..128).map(|i| i * 7 % 10).collect();
        let y = Array::from_slice(&y, &[128, 1]);
        let loss = |args: &[Array]| -> Result<Vec<Array>, Exception> {
            let mut h = args[6].clone();
            for l in 0..3 {
                h = h.matmul(&args[2 * l])?.add(&args[2 * l + 1])?;
                if l < 2 {
                    h = ops::maximum(&h, Array::from_f32(0.0))?;
                }
            }
            let lse = ops::logsumexp_axis(&h, 1, true)?;
            let picked = ops::indexing::take_along_axis(&h, &args[7], 1)?;
            Ok(vec![lse.subtract(&picked)?.mean(None)?])
        };
        static ARGNUMS: [i32; 6] = [0, 1, 2, 3, 4, 5];
        let mut vg = mlx_rs::transforms::value_and_grad_with_argnums(loss, &ARGNUMS[..]);
        let zeros = |p: &Array| ops::zeros_like(p).unwrap();
        let mut m: Vec<Array> = params.iter().map(zeros).collect();
        let mut v: Vec<Array> = params.iter().map(zeros).collect();
        let (b1, b2, lr, eps) = (0.9f32, 0.999f32, 1e-3f32, 1e-5f32);
        let mut t = 0;
        Box::new(move || {
            t += 1;
            let mut args = params.clone();
            args.push(x.clone());
            args.push(y.clone());
            let (value, grads) = vg(&args).unwrap();
            let c1 = 1.0 - b1.powi(t);
            let c2 = 1.0 - b2.powi(t);
            for i in 0..params.len() {
                let g = &grads[i];
                m[i] = m[i]
                    .multiply(Array::from_f32(b1))
                    .unwrap()
                    .add(g.multiply(Array::from_f32(1.0 - b1)).unwrap())
                    .unwrap();
                v[i] = v[i]
                    .multiply(Array::from_f32(b2))
                    .unwrap()
                    .add(
                        g.square()
                            .unwrap()
                            .multiply(Array::from_f32(1.0 - b2))
                            .unwrap(),
                    )
                    .unwrap();
                let step = m[i]
                    .divide(Array::from_f32(c1))
                    .unwrap()
                    .divide(
                        v[i].divide(Array::from_f32(c2))
                            .unwrap()
                            .sqrt()
                            .unwrap()
                            .add(Array::from_f32(eps))
                            .unwrap(),
                    )
                    .unwrap();
                params[i] = params[i]
                    .subtract(step.multiply(Array::from_f32(lr)).unwrap())
                    .unwrap();
            }
            let _ = value[0].item_exact::<f32>();
        })
    })
}

/// The overhead workload's 100 ops (25 rounds of mul, add, exp, sub).
fn hundred_ops<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 2> {
    let mut y = x;
    for i in 0..25 {
        y = (y * 0.5 + 1.0).exp() - (i as f32) * 1e-3;
    }
    y
}

/// Per-op overhead: 100 elementwise ops on a 16x16 tensor, then eval (Mlx, compiled Mlx and raw
/// mlx-rs only).
fn overhead_jobs() -> Vec<(&'static str, Maker)> {
    let mlx: Maker = Box::new(|| {
        let x = rand::<Mlx, 2>([16, 16], &MlxDevice::Cpu);
        Box::new(move || {
            hundred_ops(x.clone())
                .into_primitive()
                .tensor()
                .eval()
                .unwrap();
        })
    });
    let compiled: Maker = Box::new(|| {
        let x = rand::<Mlx, 2>([16, 16], &MlxDevice::Cpu);
        let mut f = compile_float::<2, _>(|x| vec![hundred_ops(x[0].clone())], false);
        Box::new(move || {
            let y = f.call(vec![x.clone()]).expect("compiled ops").remove(0);
            y.into_primitive().tensor().eval().unwrap();
        })
    });
    let raw: Maker = Box::new(|| {
        let x = raw_uniform(&[16, 16]);
        Box::new(move || {
            let mut y = x.clone();
            for i in 0..25 {
                y = y
                    .multiply(Array::from_f32(0.5))
                    .unwrap()
                    .add(Array::from_f32(1.0))
                    .unwrap()
                    .exp()
                    .unwrap()
                    .subtract(Array::from_f32(i as f32 * 1e-3))
                    .unwrap();
            }
            y.eval().unwrap();
        })
    });
    vec![("mlx", mlx), ("mlx-compiled", compiled), ("mlx-rs", raw)]
}

fn all(s: &mut Suite) {
    let f32_ = DType::F32;
    for n in [64usize, 256, 1024, 2048] {
        s.run(
            &format!("matmul_f32_{n}"),
            &format!("matmul f32 {n}x{n}"),
            false,
            with_raw(burn_peers!(matmul_job, 1, n, f32_), raw_matmul(1, n, f32_)),
        );
    }
    s.run(
        "matmul_f32_batched_16x256",
        "batched matmul f32 16x[256x256]",
        false,
        with_raw(
            burn_peers!(matmul_job, 16, 256, f32_),
            raw_matmul(16, 256, f32_),
        ),
    );
    for (dt, name) in [(DType::F16, "f16"), (DType::BF16, "bf16")] {
        s.run(
            &format!("matmul_{name}_1024"),
            &format!("matmul {name} 1024x1024"),
            false,
            with_raw(
                burn_peers!(matmul_job, 1, 1024, dt),
                raw_matmul(1, 1024, dt),
            ),
        );
    }
    for (n, name) in [(10_000usize, "10k"), (1_000_000, "1m"), (16_000_000, "16m")] {
        s.run(
            &format!("elementwise_chain_{name}"),
            &format!("elementwise add/mul/exp chain, {n} f32"),
            false,
            with_raw(
                with_compiled(burn_peers!(chain_job, n), compiled_chain(n)),
                raw_chain(n),
            ),
        );
    }
    for (which, id, label) in [
        (0u8, "sum_dim_1024", "sum_dim 1024x1024 (last axis)"),
        (1, "max_dim_1024", "max_dim 1024x1024 (last axis)"),
        (2, "softmax_1024", "softmax 1024x1024 (last axis)"),
        (3, "log_softmax_1024", "log_softmax 1024x1024 (last axis)"),
    ] {
        s.run(
            id,
            label,
            false,
            with_raw(burn_peers!(reduce_job, which), raw_reduce(which)),
        );
    }
    s.run(
        "conv2d_3x3_64ch_56_b8",
        "conv2d 3x3, 64->64 ch, 56x56, batch 8",
        false,
        with_raw(burn_peers!(conv_job), raw_conv()),
    );
    s.run(
        "max_pool2d_3x3_s2_64ch_56_b8",
        "max_pool2d 3x3 stride 2, 64 ch, 56x56, batch 8",
        false,
        burn_peers!(pool_job),
    );
    s.run(
        "train_mlp_f32",
        "MLP train step 784-512-512-10, batch 128, Adam, f32",
        true,
        with_raw(train_peers!(mlp_job, f32_), raw_mlp()),
    );
    for (dt, name) in [(DType::F16, "f16"), (DType::BF16, "bf16")] {
        s.run(
            &format!("train_mlp_{name}"),
            &format!("MLP train step 784-512-512-10, batch 128, Adam, {name}"),
            true,
            train_peers!(mlp_job, dt),
        );
    }
    s.run(
        "train_cnn",
        "CNN train step (example CNN), batch 64, Adam",
        true,
        train_peers!(cnn_job),
    );
    s.run(
        "train_transformer",
        "Transformer encoder train step (2 layers, d_model 256, seq 128, batch 16), Adam",
        true,
        train_peers!(transformer_job),
    );
    s.run(
        "overhead_100_small_ops",
        "100 small elementwise ops (16x16) + eval",
        false,
        overhead_jobs(),
    );
}

fn main() {
    let start = Instant::now();
    let load_at_start = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into());
    // The workspace root, two levels above this crate: BENCHMARKS.md, benches/ and target/.
    let root = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let criterion_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("criterion");
    // Criterion's own flags start with '-'; `--bench` comes from cargo. A bare word is a filter
    // (criterion applies it to ids `workload/backend`; setup is skipped for what it excludes).
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filter = args
        .iter()
        .enumerate()
        .find(|(i, a)| {
            let prev_takes_value = *i > 0
                && matches!(
                    args[i - 1].as_str(),
                    "--save-baseline"
                        | "--baseline"
                        | "--load-baseline"
                        | "--profile-time"
                        | "--sample-size"
                        | "--warm-up-time"
                        | "--measurement-time"
                        | "--nresamples"
                        | "--noise-threshold"
                        | "--confidence-level"
                        | "--significance-level"
                        | "--output-format"
                        | "--color"
                        | "--format"
                        | "--plotting-backend"
                );
            !a.starts_with('-') && !prev_takes_value
        })
        .map(|(_, a)| a.clone());
    let c = Criterion::default()
        .output_directory(&criterion_dir)
        .without_plots()
        .configure_from_args();
    let mut suite = Suite {
        c,
        filter,
        workloads: Vec::new(),
        not_applicable: Vec::new(),
    };
    all(&mut suite);
    suite.c.final_summary();
    if suite.filter.is_some() {
        println!("(a filtered run does not rewrite BENCHMARKS.md)");
        return;
    }
    // `--list` and criterion's `--test` mode measure nothing: the estimates on disk would be
    // whatever an earlier, possibly partial, run left, so they must not become the report.
    if args.iter().any(|a| a == "--list" || a == "--test") {
        println!("(a listing or test run does not rewrite BENCHMARKS.md)");
        return;
    }
    let info = RunInfo {
        total_secs: start.elapsed().as_secs_f64(),
        load_at_start,
    };
    match report::write_report(
        &root,
        &criterion_dir,
        &suite.workloads,
        &suite.not_applicable,
        &info,
    ) {
        Ok((md, svg)) => println!("wrote {} and {}", md.display(), svg.display()),
        Err(e) => eprintln!("could not write the report: {e}"),
    }
}
