//! Burn on `Mlx` against Burn on NdArray and against raw mlx-rs (the lower bound on overhead),
//! workload by workload, in one run. Prints a table and writes `BENCHMARKS.md`.
//!
//! ```text
//! cargo bench --bench backends                 # everything, writes BENCHMARKS.md
//! cargo bench --bench backends -- conv matmul  # only workloads whose name contains a word
//! ```
//!
//! Each workload is timed as the median of several runs after a warm-up run. A run ends when the
//! result is computed: `eval` on MLX (its graphs are lazy), the op itself on NdArray (eager).
//! Ratios are `time(peer) / time(Mlx)`: above 1 means `Mlx` is faster. The numbers are from
//! the machine the command ran on; ratios are the thing to compare, since machines are noisy.

extern crate burn_core as burn;

use burn::module::{AutodiffModule, Module};
use burn_autodiff::Autodiff;
use burn_mlx::{Mlx, MlxDevice};
use burn_ndarray::NdArray;
use burn_nn::conv::{Conv2d, Conv2dConfig};
use burn_nn::loss::CrossEntropyLossConfig;
use burn_nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn_nn::transformer::{TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput};
use burn_nn::{Linear, LinearConfig, PaddingConfig2d, Relu};
use burn_optim::{AdamConfig, GradientsParams, Optimizer};
use burn_tensor::backend::{AutodiffBackend, Backend};
use burn_tensor::module::{conv2d, max_pool2d};
use burn_tensor::ops::ConvOptions;
use burn_tensor::{activation, DType, Distribution, Int, Tensor, TensorData};
use mlx_rs::Array;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Median seconds of `f` over runs after one warm-up, taking at least 3 runs and stopping after
/// `budget` (or 30 runs).
fn median_secs(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut times = Vec::new();
    while times.len() < 3 || (start.elapsed() < budget && times.len() < 30) {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(|a, b| a.total_cmp(b));
    times[times.len() / 2]
}

/// Forces a Burn tensor's value: MLX evaluates its graph; NdArray has computed it already.
fn force<B: Backend, const D: usize>(t: Tensor<B, D>) {
    // Reading one element makes every backend finish the op that produced `t` (MLX evaluates
    // whole primitives, so the full result is computed).
    let flat = t.reshape([-1]);
    let n = flat.dims()[0];
    if n > 0 {
        let _ = flat.narrow(0, 0, 1).into_data();
    }
}

/// One measured workload: seconds per run for each implementation that has it.
struct Row {
    name: String,
    mlx: f64,
    ndarray: Option<f64>,
    raw: Option<f64>,
}

/// Every workload, run in one process.
struct Bench {
    filters: Vec<String>,
    budget: Duration,
    rows: Vec<Row>,
}

impl Bench {
    fn wants(&self, name: &str) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| name.contains(f.as_str()))
    }

    fn record(&mut self, name: &str, mlx: f64, ndarray: Option<f64>, raw: Option<f64>) {
        let ratio = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.2}x", v / mlx));
        println!(
            "{name:<44} mlx {:>10}  ndarray {:>10} ({:>7})  mlx-rs {:>10} ({:>6})",
            fmt_secs(mlx),
            ndarray.map_or("-".into(), fmt_secs),
            ratio(ndarray),
            raw.map_or("-".into(), fmt_secs),
            ratio(raw),
        );
        self.rows.push(Row {
            name: name.to_string(),
            mlx,
            ndarray,
            raw,
        });
    }

    /// A workload on a Burn backend, as a closure generic over it.
    fn burn_pair(
        &mut self,
        name: &str,
        with_ndarray: bool,
        mlx: impl FnMut(),
        nd: impl FnMut(),
        raw: Option<Box<dyn FnMut() + '_>>,
    ) {
        let budget = self.budget;
        let m = median_secs(budget, mlx);
        let n = with_ndarray.then(|| median_secs(budget, nd));
        let r = raw.map(|f| median_secs(budget, f));
        self.record(name, m, n, r);
    }
}

fn fmt_secs(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} us", s * 1e6)
    }
}

fn raw_uniform(shape: &[i32]) -> Array {
    let a = mlx_rs::random::uniform::<_, f32>(-1.0f32, 1.0f32, shape, None).unwrap();
    a.eval().unwrap();
    a
}

fn matmul(b: &mut Bench) {
    for n in [64usize, 256, 1024, 2048] {
        let name = format!("matmul f32 {n}x{n}");
        if !b.wants(&name) {
            continue;
        }
        let (mx, nd) = (MlxDevice::Cpu, Default::default());
        let (a1, b1) = (rand::<Mlx, 2>([n, n], &mx), rand::<Mlx, 2>([n, n], &mx));
        let (a2, b2) = (
            rand::<NdArray, 2>([n, n], &nd),
            rand::<NdArray, 2>([n, n], &nd),
        );
        let (ra, rb) = (
            raw_uniform(&[n as i32, n as i32]),
            raw_uniform(&[n as i32, n as i32]),
        );
        b.burn_pair(
            &name,
            true,
            || force(a1.clone().matmul(b1.clone())),
            || force(a2.clone().matmul(b2.clone())),
            Some(Box::new(|| ra.matmul(&rb).unwrap().eval().unwrap())),
        );
    }
    let name = "batched matmul f32 16x[256x256]";
    if b.wants(name) {
        let (mx, nd) = (MlxDevice::Cpu, Default::default());
        let (a1, b1) = (
            rand::<Mlx, 3>([16, 256, 256], &mx),
            rand::<Mlx, 3>([16, 256, 256], &mx),
        );
        let (a2, b2) = (
            rand::<NdArray, 3>([16, 256, 256], &nd),
            rand::<NdArray, 3>([16, 256, 256], &nd),
        );
        let (ra, rb) = (raw_uniform(&[16, 256, 256]), raw_uniform(&[16, 256, 256]));
        b.burn_pair(
            name,
            true,
            || force(a1.clone().matmul(b1.clone())),
            || force(a2.clone().matmul(b2.clone())),
            Some(Box::new(|| ra.matmul(&rb).unwrap().eval().unwrap())),
        );
    }
}

fn rand<B: Backend, const D: usize>(shape: [usize; D], device: &B::Device) -> Tensor<B, D> {
    let t = Tensor::<B, D>::random(shape, Distribution::Uniform(-1.0, 1.0), device);
    force(t.clone());
    t
}

/// `exp(x * 0.5 + 1) * x`: three elementwise ops and a multiply, one graph on MLX.
fn chain<B: Backend>(x: &Tensor<B, 1>) -> Tensor<B, 1> {
    (x.clone() * 0.5 + 1.0).exp() * x.clone()
}

fn elementwise(b: &mut Bench) {
    for n in [10_000usize, 1_000_000, 16_000_000] {
        let name = format!("elementwise add/mul/exp chain, {n} f32");
        if !b.wants(&name) {
            continue;
        }
        let (mx, nd) = (MlxDevice::Cpu, Default::default());
        let x1 = rand::<Mlx, 1>([n], &mx);
        let x2 = rand::<NdArray, 1>([n], &nd);
        let rx = raw_uniform(&[n as i32]);
        b.burn_pair(
            &name,
            true,
            || force(chain(&x1)),
            || force(chain(&x2)),
            Some(Box::new(|| {
                let y = rx
                    .multiply(Array::from_f32(0.5))
                    .unwrap()
                    .add(Array::from_f32(1.0))
                    .unwrap()
                    .exp()
                    .unwrap()
                    .multiply(&rx)
                    .unwrap();
                y.eval().unwrap();
            })),
        );
    }
}

fn reductions(b: &mut Bench) {
    let (mx, nd) = (MlxDevice::Cpu, Default::default());
    let x1 = rand::<Mlx, 2>([1024, 1024], &mx);
    let x2 = rand::<NdArray, 2>([1024, 1024], &nd);
    let rx = raw_uniform(&[1024, 1024]);
    if b.wants("sum_dim 1024x1024 (last axis)") {
        b.burn_pair(
            "sum_dim 1024x1024 (last axis)",
            true,
            || force(x1.clone().sum_dim(1)),
            || force(x2.clone().sum_dim(1)),
            Some(Box::new(|| rx.sum_axis(1, true).unwrap().eval().unwrap())),
        );
    }
    if b.wants("max_dim 1024x1024 (last axis)") {
        b.burn_pair(
            "max_dim 1024x1024 (last axis)",
            true,
            || force(x1.clone().max_dim(1)),
            || force(x2.clone().max_dim(1)),
            Some(Box::new(|| rx.max_axis(1, true).unwrap().eval().unwrap())),
        );
    }
    if b.wants("softmax 1024x1024 (last axis)") {
        b.burn_pair(
            "softmax 1024x1024 (last axis)",
            true,
            || force(activation::softmax(x1.clone(), 1)),
            || force(activation::softmax(x2.clone(), 1)),
            Some(Box::new(|| {
                mlx_rs::ops::softmax_axis(&rx, 1, true)
                    .unwrap()
                    .eval()
                    .unwrap()
            })),
        );
    }
}

fn conv_pool(b: &mut Bench) {
    let (mx, nd) = (MlxDevice::Cpu, Default::default());
    let name = "conv2d 3x3, 64->64 ch, 56x56, batch 8";
    if b.wants(name) {
        let x1 = rand::<Mlx, 4>([8, 64, 56, 56], &mx);
        let w1 = rand::<Mlx, 4>([64, 64, 3, 3], &mx);
        let x2 = rand::<NdArray, 4>([8, 64, 56, 56], &nd);
        let w2 = rand::<NdArray, 4>([64, 64, 3, 3], &nd);
        // MLX's own layout: channels last, weights [out, kh, kw, in].
        let rx = raw_uniform(&[8, 56, 56, 64]);
        let rw = raw_uniform(&[64, 3, 3, 64]);
        let opts = || ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
        b.burn_pair(
            name,
            true,
            || force(conv2d(x1.clone(), w1.clone(), None, opts())),
            || force(conv2d(x2.clone(), w2.clone(), None, opts())),
            Some(Box::new(|| {
                mlx_rs::ops::conv2d(&rx, &rw, (1, 1), (1, 1), (1, 1), 1)
                    .unwrap()
                    .eval()
                    .unwrap()
            })),
        );
    }
    let name = "max_pool2d 3x3 stride 2, 64 ch, 56x56, batch 8";
    if b.wants(name) {
        let x1 = rand::<Mlx, 4>([8, 64, 56, 56], &mx);
        let x2 = rand::<NdArray, 4>([8, 64, 56, 56], &nd);
        b.burn_pair(
            name,
            true,
            || {
                force(max_pool2d(
                    x1.clone(),
                    [3, 3],
                    [2, 2],
                    [1, 1],
                    [1, 1],
                    false,
                ))
            },
            || {
                force(max_pool2d(
                    x2.clone(),
                    [3, 3],
                    [2, 2],
                    [1, 1],
                    [1, 1],
                    false,
                ))
            },
            None,
        );
    }
}

/// The issue's MLP: 784 → 512 → 512 → 10.
#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    l1: Linear<B>,
    l2: Linear<B>,
    l3: Linear<B>,
    relu: Relu,
}

impl<B: Backend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            l1: LinearConfig::new(784, 512).init(device),
            l2: LinearConfig::new(512, 512).init(device),
            l3: LinearConfig::new(512, 10).init(device),
            relu: Relu::new(),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let x = self.relu.forward(self.l1.forward(x));
        let x = self.relu.forward(self.l2.forward(x));
        self.l3.forward(x)
    }
}

/// The example CNN (`examples/train.rs`): conv3x3(1→16) → ReLU → maxpool2 → conv3x3(16→32) →
/// ReLU → maxpool2 → linear(1568→64) → ReLU → linear(64→10).
#[derive(Module, Debug)]
struct Cnn<B: Backend> {
    conv1: Conv2d<B>,
    conv2: Conv2d<B>,
    pool: MaxPool2d,
    fc1: Linear<B>,
    fc2: Linear<B>,
    relu: Relu,
}

impl<B: Backend> Cnn<B> {
    fn new(device: &B::Device) -> Self {
        let conv = |cin, cout| {
            Conv2dConfig::new([cin, cout], [3, 3])
                .with_padding(PaddingConfig2d::Same)
                .init(device)
        };
        Self {
            conv1: conv(1, 16),
            conv2: conv(16, 32),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            fc1: LinearConfig::new(32 * 7 * 7, 64).init(device),
            fc2: LinearConfig::new(64, 10).init(device),
            relu: Relu::new(),
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = self.pool.forward(self.relu.forward(self.conv1.forward(x)));
        let x = self.pool.forward(self.relu.forward(self.conv2.forward(x)));
        let x: Tensor<B, 2> = x.flatten(1, 3);
        self.fc2.forward(self.relu.forward(self.fc1.forward(x)))
    }
}

/// Seconds per Adam step (forward, backward, update, loss read back) of `model`.
///
/// Reading the loss evaluates this step's forward pass and, through the parameters, the
/// previous step's update: in steady state every step is fully computed once.
fn step_secs<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: M,
    budget: Duration,
    loss: impl Fn(&M) -> Tensor<B, 1>,
) -> f64 {
    let mut model = Some(model);
    let mut optim = AdamConfig::new().init::<B, M>();
    median_secs(budget, || {
        let m = model.take().unwrap();
        let l = loss(&m);
        let grads = GradientsParams::from_grads(l.backward(), &m);
        let m = optim.step(1e-3, m, grads);
        let _ = l.into_scalar();
        model = Some(m);
    })
}

/// Class labels `0..10` for a batch.
fn labels<B: Backend>(n: usize, device: &B::Device) -> Tensor<B, 1, Int> {
    let v: Vec<i64> = (0..n).map(|i| (i * 7 % 10) as i64).collect();
    Tensor::from_data(TensorData::new(v, [n]), device)
}

fn mlp_step<B: AutodiffBackend>(device: &B::Device, budget: Duration) -> f64 {
    let x = Tensor::<B, 2>::random([128, 784], Distribution::Default, device);
    let y = labels::<B>(128, device);
    let ce = CrossEntropyLossConfig::new().init(device);
    step_secs(Mlp::<B>::new(device), budget, |m| {
        ce.forward(m.forward(x.clone()), y.clone())
    })
}

fn cnn_step<B: AutodiffBackend>(device: &B::Device, budget: Duration) -> f64 {
    let x = Tensor::<B, 4>::random([64, 1, 28, 28], Distribution::Default, device);
    let y = labels::<B>(64, device);
    let ce = CrossEntropyLossConfig::new().init(device);
    step_secs(Cnn::<B>::new(device), budget, |m| {
        ce.forward(m.forward(x.clone()), y.clone())
    })
}

fn transformer_step<B: AutodiffBackend>(device: &B::Device, budget: Duration) -> f64 {
    let model: TransformerEncoder<B> = TransformerEncoderConfig::new(256, 1024, 8, 2)
        .with_dropout(0.0)
        .init(device);
    let x = Tensor::<B, 3>::random([16, 128, 256], Distribution::Default, device);
    let target = Tensor::<B, 3>::random([16, 128, 256], Distribution::Default, device);
    step_secs(model, budget, |m| {
        let out = m.forward(TransformerEncoderInput::new(x.clone()));
        (out - target.clone()).powi_scalar(2).mean()
    })
}

/// The MLP step in raw mlx-rs: the same layers, cross-entropy and Adam update, written directly
/// against MLX arrays with `value_and_grad` (the lower bound for Burn + Mlx).
fn raw_mlp_step(budget: Duration) -> f64 {
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
    median_secs(budget, || {
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
}

fn training(b: &mut Bench) {
    let budget = b.budget;
    let name = "MLP train step 784-512-512-10, batch 128, Adam";
    if b.wants(name) {
        let m = mlp_step::<Autodiff<Mlx>>(&MlxDevice::Cpu, budget);
        let n = mlp_step::<Autodiff<NdArray>>(&Default::default(), budget);
        let r = raw_mlp_step(budget);
        b.record(name, m, Some(n), Some(r));
    }
    let name = "CNN train step (example CNN), batch 64, Adam";
    if b.wants(name) {
        let m = cnn_step::<Autodiff<Mlx>>(&MlxDevice::Cpu, budget);
        let n = cnn_step::<Autodiff<NdArray>>(&Default::default(), budget);
        b.record(name, m, Some(n), None);
    }
    let name = "Transformer encoder train step (2x256, seq 128, batch 16), Adam";
    if b.wants(name) {
        let m = transformer_step::<Autodiff<Mlx>>(&MlxDevice::Cpu, budget);
        let n = transformer_step::<Autodiff<NdArray>>(&Default::default(), budget);
        b.record(name, m, Some(n), None);
    }
}

/// f16 and bf16 matmul on `Mlx` against raw mlx-rs (NdArray has no half-precision matmul kernel).
fn half_matmul(b: &mut Bench) {
    for (dt, raw_dt, label) in [
        (DType::F16, mlx_rs::Dtype::Float16, "f16"),
        (DType::BF16, mlx_rs::Dtype::Bfloat16, "bf16"),
    ] {
        let name = format!("matmul {label} 1024x1024");
        if !b.wants(&name) {
            continue;
        }
        let mx = MlxDevice::Cpu;
        let a = rand::<Mlx, 2>([1024, 1024], &mx).cast(dt);
        let c = rand::<Mlx, 2>([1024, 1024], &mx).cast(dt);
        let ra = raw_uniform(&[1024, 1024]).as_dtype(raw_dt).unwrap();
        let rc = raw_uniform(&[1024, 1024]).as_dtype(raw_dt).unwrap();
        ra.eval().unwrap();
        rc.eval().unwrap();
        let budget = b.budget;
        let m = median_secs(budget, || force(a.clone().matmul(c.clone())));
        let r = median_secs(budget, || ra.matmul(&rc).unwrap().eval().unwrap());
        b.record(&name, m, None, Some(r));
    }
}

/// Per-op overhead: 100 elementwise ops on a 16x16 tensor, then eval.
fn overhead(b: &mut Bench) {
    let name = "100 small elementwise ops (16x16) + eval";
    if !b.wants(name) {
        return;
    }
    let mx = MlxDevice::Cpu;
    let x = rand::<Mlx, 2>([16, 16], &mx);
    let rx = raw_uniform(&[16, 16]);
    let mlx = || {
        let mut y = x.clone();
        for i in 0..25 {
            y = (y * 0.5 + 1.0).exp() - (i as f32) * 1e-3;
        }
        y.into_primitive().tensor().eval().unwrap();
    };
    let raw = || {
        let mut y = rx.clone();
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
    };
    let budget = b.budget;
    let m = median_secs(budget, mlx);
    let r = median_secs(budget, raw);
    b.record(name, m, None, Some(r));
}

fn write_report(rows: &[Row]) -> std::io::Result<std::path::PathBuf> {
    let mut md = String::new();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    writeln!(md, "# Benchmarks\n").unwrap();
    writeln!(
        md,
        "Written by `cargo bench --bench backends` (see `benches/backends.rs`). Median time per run; \
         a ratio is the peer's time divided by Burn on `Mlx`'s, so above 1.00x means `Mlx` is faster. \
         For raw mlx-rs (the same MLX work without Burn) a ratio below 1.00x is Burn's overhead.\n"
    )
    .unwrap();
    writeln!(
        md,
        "Machine: {cpu}, {cores} cores, MLX CPU backend. Versions: burn 0.21.0, mlx-rs 0.33.0, MLX 0.32.2, burn-ndarray 0.21.0.\n"
    )
    .unwrap();
    writeln!(
        md,
        "| workload | Burn + Mlx | Burn + NdArray | NdArray / Mlx | raw mlx-rs | mlx-rs / Mlx |"
    )
    .unwrap();
    writeln!(md, "|---|---:|---:|---:|---:|---:|").unwrap();
    for r in rows {
        let peer = |x: Option<f64>| {
            x.map_or(("-".to_string(), "-".to_string()), |v| {
                (fmt_secs(v), format!("{:.2}x", v / r.mlx))
            })
        };
        let (nd, ndr) = peer(r.ndarray);
        let (raw, rawr) = peer(r.raw);
        writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} |",
            r.name,
            fmt_secs(r.mlx),
            nd,
            ndr,
            raw,
            rawr
        )
        .unwrap();
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("BENCHMARKS.md");
    std::fs::write(&path, md)?;
    Ok(path)
}

fn main() {
    // `cargo bench` passes `--bench`; other arguments are name filters.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let whole = filters.is_empty();
    let mut b = Bench {
        filters,
        budget: Duration::from_secs(3),
        rows: Vec::new(),
    };
    matmul(&mut b);
    elementwise(&mut b);
    reductions(&mut b);
    conv_pool(&mut b);
    half_matmul(&mut b);
    training(&mut b);
    overhead(&mut b);
    if whole {
        match write_report(&b.rows) {
            Ok(path) => println!("wrote {}", path.display()),
            Err(e) => eprintln!("could not write BENCHMARKS.md: {e}"),
        }
    } else {
        println!("(a filtered run does not rewrite BENCHMARKS.md)");
    }
}
