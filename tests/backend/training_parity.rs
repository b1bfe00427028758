//! Training parity between `Autodiff<Mlx>` and `Autodiff<NdArray>` (the reference), and
//! records that move between the two backends.
//!
//! Each parity test builds one model on NdArray from a fixed seed, copies its record into the
//! MLX model (so both start from identical weights), feeds both the same batches and runs the
//! same optimizer for a few steps. The losses must agree step by step within [`LOSS_TOL`]
//! (relative) and the final parameters within [`PARAM_TOL`] (SGD) or [`ADAM_PARAM_TOL`] (Adam),
//! one by one, and within [`MOVE_SHARE`] of how far training moved them, tensor by tensor. The
//! starting weights come from burn-ndarray's seeded generator under one lock
//! (`common/ndarray_rng.rs`), so they are the same on every run.

use crate::common::ndarray_rng::ndarray_rng;
use crate::common::op_stream;
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::record::{
    BinBytesRecorder, CompactRecorder, FileRecorder, FullPrecisionSettings, NamedMpkFileRecorder,
    Recorder,
};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData, Tolerance};
use burn_autodiff::Autodiff;
use burn_mlx::{Mlx, MlxDevice};
use burn_ndarray::{NdArray, NdArrayDevice};
use burn_nn::conv::{Conv2d, Conv2dConfig};
use burn_nn::loss::CrossEntropyLossConfig;
use burn_nn::pool::{AvgPool2d, AvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
use burn_nn::{Linear, LinearConfig, PaddingConfig2d, Relu};
use burn_optim::momentum::MomentumConfig;
use burn_optim::{AdamConfig, GradientsParams, Optimizer, SgdConfig};
use std::path::PathBuf;

type MlxAd = Autodiff<Mlx>;
type FusedAd = Autodiff<burn_mlx::MlxFused>;
type NdAd = Autodiff<NdArray>;

/// Relative (and absolute floor) tolerance for the loss at each step.
const LOSS_TOL: (f64, f64) = (1e-4, 1e-6);
/// Relative and absolute tolerance for every parameter after the last SGD step.
const PARAM_TOL: (f64, f64) = (1e-3, 1e-4);
/// The same after the last Adam step (learning rate 1e-2). Adam divides each gradient by its
/// running RMS, so for a weight whose gradient is tiny (1e-6 against an epsilon of 1e-5) the
/// float rounding differences of the two backends' matmuls become a visible fraction of a full
/// step, which moves a weight by up to the learning rate. Over 30 starting weights of the MLP
/// the largest such difference was 5.2e-4 (most below 1e-4), one CI run drew weights that gave
/// 6.4e-4; 1e-3 is 10 % of one step. [`MOVE_SHARE`] bounds the whole tensor tightly.
const ADAM_PARAM_TOL: (f64, f64) = (1e-3, 1e-3);
/// Largest L2 distance between a parameter's final values on the two backends, as a share of the
/// L2 distance the reference moved it from its start. An error in every weight of some share of
/// its movement (a wrong bias correction or learning rate, a missed term) shows at that share,
/// which [`ADAM_PARAM_TOL`] alone would let through up to 10 % of a step; the rounding it allows
/// for lives in a few weights. Over 30 starting weights of the MLP the largest share was 6.0e-3
/// (its 64 output weights, one of them ill-conditioned).
const MOVE_SHARE: f64 = 2e-2;
/// Optimizer steps per run.
const STEPS: usize = 5;

// ------------------------------------------------------------------------------------------
// Models
// ------------------------------------------------------------------------------------------

/// A classifier of flat `[batch, features]` inputs.
trait Classifier<B: Backend>: Module<B> {
    fn logits(&self, x: Tensor<B, 2>) -> Tensor<B, 2>;
}

/// 12 → 16 → ReLU → 4.
#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    l1: Linear<B>,
    l2: Linear<B>,
    relu: Relu,
}

impl<B: Backend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            l1: LinearConfig::new(12, 16).init(device),
            l2: LinearConfig::new(16, 4).init(device),
            relu: Relu::new(),
        }
    }
}

impl<B: Backend> Classifier<B> for Mlp<B> {
    fn logits(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.l2.forward(self.relu.forward(self.l1.forward(x)))
    }
}

/// Input `[batch, 1·8·8]`: conv3×3(1→4, same) → ReLU → maxpool2 (4×4) → conv3×3(4→6, valid,
/// 2×2) → ReLU → avgpool2 (1×1) → linear(6 → 4).
#[derive(Module, Debug)]
struct SmallCnn<B: Backend> {
    conv1: Conv2d<B>,
    conv2: Conv2d<B>,
    max_pool: MaxPool2d,
    avg_pool: AvgPool2d,
    fc: Linear<B>,
    relu: Relu,
}

impl<B: Backend> SmallCnn<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            conv1: Conv2dConfig::new([1, 4], [3, 3])
                .with_padding(PaddingConfig2d::Same)
                .init(device),
            conv2: Conv2dConfig::new([4, 6], [3, 3]).init(device),
            max_pool: MaxPool2dConfig::new([2, 2]).init(),
            avg_pool: AvgPool2dConfig::new([2, 2]).init(),
            fc: LinearConfig::new(6, 4).init(device),
            relu: Relu::new(),
        }
    }
}

impl<B: Backend> Classifier<B> for SmallCnn<B> {
    fn logits(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let [n, _] = x.dims();
        let x = x.reshape([n, 1, 8, 8]);
        let x = self
            .max_pool
            .forward(self.relu.forward(self.conv1.forward(x))); // [n, 4, 4, 4]
        let x = self.relu.forward(self.conv2.forward(x)); // [n, 6, 2, 2]
        let x = self.avg_pool.forward(x); // [n, 6, 1, 1]
        self.fc.forward(x.reshape([n, 6]))
    }
}

// ------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------

/// Deterministic batches: inputs uniform in [-1, 1], labels from a fixed rule of the inputs
/// (so the task is learnable and the loss moves).
fn batches(
    features: usize,
    batch: usize,
    count: usize,
    seed: u64,
) -> Vec<(TensorData, TensorData)> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    (0..count)
        .map(|_| {
            let x: Vec<f32> = (0..batch * features).map(|_| next()).collect();
            let y: Vec<i64> = x
                .chunks(features)
                .map(|row| {
                    let a: f32 = row.iter().step_by(2).sum();
                    let b: f32 = row.iter().skip(1).step_by(2).sum();
                    i64::from(a > 0.0) * 2 + i64::from(b > 0.0)
                })
                .collect();
            (
                TensorData::new(x, [batch, features]),
                TensorData::new(y, [batch]),
            )
        })
        .collect()
}

/// Initializes every parameter of `module` in place and returns it.
///
/// Burn 0.21 initializes parameters lazily, and a clone of a module whose parameters are still
/// uninitialized initializes them on its own, drawing other random values. Tests that clone a
/// fresh model and expect the same weights must materialize it first.
fn materialize<B: Backend, M: Module<B>>(module: M) -> M {
    parameters(&module);
    module
}

/// Builds a model on NdArray (plain or `Autodiff`) from `seed` and initializes its parameters,
/// holding [`ndarray_rng`] throughout.
fn seeded<B, M>(seed: u64, new: impl FnOnce(&NdArrayDevice) -> M) -> M
where
    B: Backend<Device = NdArrayDevice>,
    M: Module<B>,
{
    let _rng = ndarray_rng();
    let device = NdArrayDevice::Cpu;
    B::seed(&device, seed);
    materialize(new(&device))
}

/// Copies a module's weights to another backend through an in-memory full-precision record
/// (`from` must be [`materialize`]d).
fn transfer<B1: Backend, B2: Backend, M1: Module<B1>, M2: Module<B2>>(
    from: &M1,
    to: M2,
    device: &B2::Device,
) -> M2
where
    M2::Record: 'static,
    M1::Record: 'static,
{
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = recorder
        .record(from.clone().into_record(), ())
        .expect("serialize the record");
    let record: M2::Record = BinBytesRecorder::<FullPrecisionSettings>::default()
        .load(bytes, device)
        .expect("deserialize the record on the other backend");
    to.load_record(record)
}

/// All float parameters of a module, in visiting order.
fn parameters<B: Backend, M: Module<B>>(module: &M) -> Vec<TensorData> {
    struct Collect(Vec<TensorData>);
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.val().into_data().convert::<f32>());
        }
    }
    let mut collect = Collect(Vec::new());
    module.visit(&mut collect);
    collect.0
}

/// Runs `STEPS` optimizer steps and returns the loss of each step and the trained model.
fn train<B, C, O>(
    mut model: C,
    mut optim: O,
    lr: f64,
    data: &[(TensorData, TensorData)],
    device: &B::Device,
) -> (Vec<f64>, C)
where
    B: AutodiffBackend,
    C: Classifier<B> + AutodiffModule<B>,
    O: Optimizer<C, B>,
{
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let mut losses = Vec::new();
    for (x, y) in data.iter().take(STEPS) {
        let x = Tensor::<B, 2>::from_data(x.clone(), device);
        let y = Tensor::<B, 1, Int>::from_data(y.clone(), device);
        let loss = loss_fn.forward(model.logits(x), y);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        losses.push(loss.into_scalar().elem::<f64>());
        model = optim.step(lr, model, grads);
    }
    (losses, model)
}

/// [`train`] with MLX's own autodiff (`burn_mlx::grad::Trainer`) on plain `Mlx` in place of
/// `Autodiff<Mlx>` and Burn's `Optimizer`.
fn train_mlx_grad<C, O>(
    model: C,
    optimizer: O,
    lr: f64,
    data: &[(TensorData, TensorData)],
    device: &MlxDevice,
) -> (Vec<f64>, C)
where
    C: Classifier<Mlx>,
    O: burn_optim::SimpleOptimizer<Mlx>,
{
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let mut trainer = burn_mlx::grad::Trainer::new(model, optimizer);
    let mut losses = Vec::new();
    for (x, y) in data.iter().take(STEPS) {
        let x = Tensor::<Mlx, 2>::from_data(x.clone(), device);
        let y = Tensor::<Mlx, 1, Int>::from_data(y.clone(), device);
        let loss = trainer
            .step(lr, |m: &C| loss_fn.forward(m.logits(x.clone()), y.clone()))
            .expect("a training step with MLX's autodiff");
        losses.push(loss.into_scalar().elem::<f64>());
    }
    (losses, trainer.into_model())
}

fn close(a: f64, b: f64, (rel, abs): (f64, f64)) -> bool {
    (a - b).abs() <= abs + rel * b.abs()
}

/// Compares two runs: losses step by step and every final parameter.
///
/// `initial` are the parameters both runs started from: training must have moved them.
fn compare<B1: Backend, B2: Backend, M1: Module<B1>, M2: Module<B2>>(
    name: &str,
    param_tol: (f64, f64),
    initial: Vec<TensorData>,
    (losses_mlx, model_mlx): (Vec<f64>, M1),
    (losses_nd, model_nd): (Vec<f64>, M2),
) {
    println!("{name}: mlx losses {losses_mlx:?}");
    println!("{name}: nd  losses {losses_nd:?}");
    assert_eq!(losses_mlx.len(), STEPS);
    for (step, (a, b)) in losses_mlx.iter().zip(&losses_nd).enumerate() {
        assert!(
            close(*a, *b, LOSS_TOL),
            "{name}: step {step}: loss {a} on Mlx vs {b} on NdArray (tolerance {LOSS_TOL:?})"
        );
    }
    let params_mlx = parameters(&model_mlx);
    let params_nd = parameters(&model_nd);
    assert_eq!(params_mlx.len(), params_nd.len());
    assert_eq!(params_mlx.len(), initial.len());
    let mut worst = 0.0f64;
    let mut worst_at = String::new();
    let mut worst_share = 0.0f64;
    let mut moved = 0.0f64;
    for (i, ((a, b), start)) in params_mlx.iter().zip(&params_nd).zip(&initial).enumerate() {
        assert_eq!(a.shape, b.shape, "{name}: parameter {i} shape");
        let a = a.to_vec::<f32>().unwrap();
        let b = b.to_vec::<f32>().unwrap();
        let start = start.to_vec::<f32>().unwrap();
        let (mut gap, mut path) = (0.0f64, 0.0f64);
        for (j, ((x, y), s)) in a.iter().zip(&b).zip(&start).enumerate() {
            let (x, y, s) = (*x as f64, *y as f64, *s as f64);
            if (x - y).abs() > worst {
                worst = (x - y).abs();
                worst_at = format!("parameter {i}[{j}]: {x} vs {y}");
            }
            assert!(
                close(x, y, param_tol),
                "{name}: parameter {i}[{j}]: {x} on Mlx vs {y} on NdArray (tolerance {param_tol:?})"
            );
            gap += (x - y).powi(2);
            path += (y - s).powi(2);
            moved = moved.max((x - s).abs());
        }
        let share = gap.sqrt() / path.sqrt().max(f64::MIN_POSITIVE);
        worst_share = worst_share.max(share);
        assert!(
            share <= MOVE_SHARE,
            "{name}: parameter {i}: the two runs end {:e} apart (L2), {share:e} of the {:e} that \
             training moved it on NdArray (allowed: {MOVE_SHARE:e})",
            gap.sqrt(),
            path.sqrt()
        );
    }
    println!("{name}: largest parameter difference {worst:e} ({worst_at})");
    println!(
        "{name}: largest L2 difference per parameter, as a share of its movement {worst_share:e}"
    );
    assert!(
        moved > 1e-3,
        "{name}: the parameters did not move (largest change {moved})"
    );
}

fn devices() -> (MlxDevice, NdArrayDevice) {
    (MlxDevice::Cpu, NdArrayDevice::Cpu)
}

// ------------------------------------------------------------------------------------------
// Parity tests
// ------------------------------------------------------------------------------------------

#[test]
fn mlp_adam_parity() {
    let (dm, dn) = devices();
    let nd = seeded(1, Mlp::<NdAd>::new);
    let mx = transfer(&nd, Mlp::<MlxAd>::new(&dm), &dm);
    let init = parameters(&nd);
    let data = batches(12, 32, STEPS, 11);
    let adam = AdamConfig::new();
    let a = train(mx, adam.init::<MlxAd, Mlp<MlxAd>>(), 1e-2, &data, &dm);
    let b = train(nd, adam.init::<NdAd, Mlp<NdAd>>(), 1e-2, &data, &dn);
    compare("mlp/adam", ADAM_PARAM_TOL, init, a, b);
}

/// Adam parity of a model trained on plain `Mlx` by `train_mx` (MLX's own autodiff) against the
/// same model on `Autodiff<NdArray>` with Burn's Adam, from the same weights (`seed`) and batches
/// (`features`, `batch`, `data_seed`).
fn adam_parity_on_plain_mlx<Mx, Nd>(
    name: &str,
    seed: u64,
    (features, batch, data_seed): (usize, usize, u64),
    new_nd: fn(&NdArrayDevice) -> Nd,
    new_mx: fn(&MlxDevice) -> Mx,
    train_mx: impl FnOnce(Mx, &[(TensorData, TensorData)], &MlxDevice) -> (Vec<f64>, Mx),
) where
    Mx: Classifier<Mlx>,
    Nd: Classifier<NdAd> + AutodiffModule<NdAd>,
    Mx::Record: 'static,
    Nd::Record: 'static,
{
    let (dm, dn) = devices();
    let nd = seeded(seed, new_nd);
    let mx = transfer(&nd, new_mx(&dm), &dm);
    let init = parameters(&nd);
    let data = batches(features, batch, STEPS, data_seed);
    let a = train_mx(mx, &data, &dm);
    let b = train(nd, AdamConfig::new().init::<NdAd, Nd>(), 1e-2, &data, &dn);
    compare(name, ADAM_PARAM_TOL, init, a, b);
}

#[test]
fn mlp_adam_parity_with_mlx_autodiff() {
    adam_parity_on_plain_mlx(
        "mlp/adam/mlx-autodiff",
        1,
        (12, 32, 11),
        Mlp::<NdAd>::new,
        Mlp::<Mlx>::new,
        |mx, data, dm| train_mlx_grad(mx, AdamConfig::new().build(), 1e-2, data, dm),
    );
}

#[test]
fn cnn_adam_parity_with_mlx_autodiff() {
    adam_parity_on_plain_mlx(
        "cnn/adam/mlx-autodiff",
        3,
        (64, 16, 13),
        SmallCnn::<NdAd>::new,
        SmallCnn::<Mlx>::new,
        |mx, data, dm| train_mlx_grad(mx, AdamConfig::new().build(), 1e-2, data, dm),
    );
}

#[test]
fn mlp_adam_parity_with_compiled_step() {
    adam_parity_on_plain_mlx(
        "mlp/adam/compiled-step",
        1,
        (12, 32, 11),
        Mlp::<NdAd>::new,
        Mlp::<Mlx>::new,
        |mx, data, dm| {
            let loss_fn = CrossEntropyLossConfig::new().init(dm);
            let mut trainer = burn_mlx::grad::CompiledTrainer::new(
                mx,
                burn_mlx::grad::AdamSettings::default(),
                move |m: &Mlp<Mlx>, batch: &[burn_mlx::MlxTensor]| {
                    let x: Tensor<Mlx, 2> = burn_mlx::from_mlx(batch[0].clone()).unwrap();
                    let y: Tensor<Mlx, 1, Int> = burn_mlx::from_mlx(batch[1].clone()).unwrap();
                    loss_fn.forward(m.logits(x), y)
                },
            )
            .expect("a model with parameters");
            let mut losses = Vec::new();
            for (x, y) in data.iter().take(STEPS) {
                let x = Tensor::<Mlx, 2>::from_data(x.clone(), dm);
                let y = Tensor::<Mlx, 1, Int>::from_data(y.clone(), dm);
                let batch = [burn_mlx::to_mlx(x).unwrap(), burn_mlx::to_mlx(y).unwrap()];
                let loss = trainer.step(1e-2, &batch).expect("a compiled step");
                losses.push(loss.into_scalar().elem::<f64>());
            }
            (losses, trainer.model())
        },
    );
}

/// `value_and_grad` refuses a loss of more than one value and a model without parameters,
/// with errors that say so.
#[test]
fn mlx_autodiff_errors() {
    let dm = MlxDevice::Cpu;
    let model = Mlp::<Mlx>::new(&dm);
    let x = Tensor::<Mlx, 2>::ones([3, 12], &dm);
    let err =
        burn_mlx::grad::value_and_grad(&model, |m: &Mlp<Mlx>| m.logits(x.clone()).reshape([-1]))
            .expect_err("a loss of 12 values");
    let text = err.to_string();
    assert!(
        text.contains("value_and_grad") && text.contains("[12]"),
        "{text}"
    );
    let err = burn_mlx::grad::value_and_grad(&Relu::new(), |_: &Relu| x.clone().sum())
        .expect_err("no parameter");
    assert!(err.to_string().contains("no float parameter"), "{err}");
    // The gradients Burn's optimizers take, one per parameter.
    let (value, grads) =
        burn_mlx::grad::value_and_grad(&model, |m: &Mlp<Mlx>| m.logits(x.clone()).mean())
            .expect("a one-value loss");
    assert!(value.into_scalar().is_finite());
    assert_eq!(grads.len(), 4);
}

/// The compiled step keeps a half-precision model in its dtype (its Adam constants follow the
/// parameter's dtype, as Burn's Adam does).
#[test]
fn compiled_step_keeps_f16() {
    use burn::tensor::DType;
    let dm = MlxDevice::Cpu;
    let weight = Tensor::<Mlx, 2>::ones([3, 2], &dm).cast(DType::F16);
    let model = Linear {
        weight: Param::from_tensor(weight),
        bias: None,
    };
    let mut trainer = burn_mlx::grad::CompiledTrainer::new(
        model,
        burn_mlx::grad::AdamSettings::default(),
        |m: &Linear<Mlx>, batch: &[burn_mlx::MlxTensor]| {
            let x: Tensor<Mlx, 2> = burn_mlx::from_mlx(batch[0].clone()).unwrap();
            m.forward(x).powi_scalar(2).mean()
        },
    )
    .expect("a model with parameters");
    let x = Tensor::<Mlx, 2>::ones([4, 3], &dm).cast(DType::F16);
    let batch = [burn_mlx::to_mlx(x).unwrap()];
    for _ in 0..2 {
        let loss = trainer.step(1e-2, &batch).expect("a compiled step");
        assert_eq!(loss.dtype(), DType::F16);
    }
    let weight = trainer.model().weight.val();
    assert_eq!(weight.dtype(), DType::F16);
    let w: Vec<f32> = weight.into_data().convert::<f32>().to_vec().unwrap();
    assert!(
        w.iter().all(|&v| v < 1.0),
        "Adam moved every weight down: {w:?}"
    );
}

#[test]
fn mlp_adam_parity_on_fused() {
    let (dm, dn) = devices();
    let _alone = op_stream::op_stream_alone();
    let before = burn_mlx::op_stream_stats();
    let nd = seeded(5, Mlp::<NdAd>::new);
    let mx = transfer(&nd, Mlp::<FusedAd>::new(&dm), &dm);
    let init = parameters(&nd);
    let data = batches(12, 32, STEPS, 15);
    let adam = AdamConfig::new();
    let a = train(mx, adam.init::<FusedAd, Mlp<FusedAd>>(), 1e-2, &data, &dm);
    let b = train(nd, adam.init::<NdAd, Mlp<NdAd>>(), 1e-2, &data, &dn);
    compare("fused mlp/adam", ADAM_PARAM_TOL, init, a, b);
    op_stream::assert_compiled("fused mlp/adam", before);
}

#[test]
fn cnn_adam_parity_on_fused() {
    let (dm, dn) = devices();
    let _alone = op_stream::op_stream_alone();
    let before = burn_mlx::op_stream_stats();
    let nd = seeded(6, SmallCnn::<NdAd>::new);
    let mx = transfer(&nd, SmallCnn::<FusedAd>::new(&dm), &dm);
    let init = parameters(&nd);
    let data = batches(64, 16, STEPS, 16);
    let adam = AdamConfig::new();
    let a = train(
        mx,
        adam.init::<FusedAd, SmallCnn<FusedAd>>(),
        1e-2,
        &data,
        &dm,
    );
    let b = train(nd, adam.init::<NdAd, SmallCnn<NdAd>>(), 1e-2, &data, &dn);
    compare("fused cnn/adam", ADAM_PARAM_TOL, init, a, b);
    op_stream::assert_compiled("fused cnn/adam", before);
}

#[test]
fn mlp_sgd_momentum_parity() {
    let (dm, dn) = devices();
    let nd = seeded(2, Mlp::<NdAd>::new);
    let mx = transfer(&nd, Mlp::<MlxAd>::new(&dm), &dm);
    let init = parameters(&nd);
    let data = batches(12, 32, STEPS, 12);
    let sgd = SgdConfig::new().with_momentum(Some(MomentumConfig::new()));
    let a = train(mx, sgd.init::<MlxAd, Mlp<MlxAd>>(), 0.1, &data, &dm);
    let b = train(nd, sgd.init::<NdAd, Mlp<NdAd>>(), 0.1, &data, &dn);
    compare("mlp/sgd", PARAM_TOL, init, a, b);
}

#[test]
fn cnn_adam_parity() {
    let (dm, dn) = devices();
    let nd = seeded(3, SmallCnn::<NdAd>::new);
    let mx = transfer(&nd, SmallCnn::<MlxAd>::new(&dm), &dm);
    let init = parameters(&nd);
    let data = batches(64, 16, STEPS, 13);
    let adam = AdamConfig::new();
    let a = train(mx, adam.init::<MlxAd, SmallCnn<MlxAd>>(), 1e-2, &data, &dm);
    let b = train(nd, adam.init::<NdAd, SmallCnn<NdAd>>(), 1e-2, &data, &dn);
    compare("cnn/adam", ADAM_PARAM_TOL, init, a, b);
}

#[test]
fn cnn_sgd_parity() {
    let (dm, dn) = devices();
    let nd = seeded(4, SmallCnn::<NdAd>::new);
    let mx = transfer(&nd, SmallCnn::<MlxAd>::new(&dm), &dm);
    let init = parameters(&nd);
    let data = batches(64, 16, STEPS, 14);
    let sgd = SgdConfig::new();
    let a = train(mx, sgd.init::<MlxAd, SmallCnn<MlxAd>>(), 0.1, &data, &dm);
    let b = train(nd, sgd.init::<NdAd, SmallCnn<NdAd>>(), 0.1, &data, &dn);
    compare("cnn/sgd", PARAM_TOL, init, a, b);
}

// ------------------------------------------------------------------------------------------
// Records across backends
// ------------------------------------------------------------------------------------------

/// A fresh directory for one test's files; removed by [`TempDir`]'s `Drop`.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("burn-mlx-parity-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn file(&self) -> PathBuf {
        self.0.join("model")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn probe<B: Backend>(device: &B::Device) -> Tensor<B, 2> {
    let (x, _) = batches(64, 5, 1, 99).remove(0);
    Tensor::from_data(x, device)
}

/// Saves `model` (on `B1`) with `recorder`, loads it on `B2`, and checks equal outputs.
fn round_trip<B1: Backend, B2: Backend, FR>(
    model: SmallCnn<B1>,
    d1: &B1::Device,
    d2: &B2::Device,
    recorder: FR,
    name: &str,
    tol: Tolerance<f32>,
) where
    FR: FileRecorder<B1> + FileRecorder<B2>,
{
    let dir = TempDir::new(name);
    let path = dir.file();
    model
        .clone()
        .save_file(&path, &recorder)
        .expect("save the record");
    let loaded = {
        // B2 may be NdArray, whose fresh modules draw from its generator while they load.
        let _rng = ndarray_rng();
        SmallCnn::<B2>::new(d2)
            .load_file(&path, &recorder, d2)
            .expect("load the record on the other backend")
    };
    let expected = model.logits(probe::<B1>(d1)).into_data();
    let actual = loaded.logits(probe::<B2>(d2)).into_data();
    actual.assert_approx_eq::<f32>(&expected, tol);
    let (p1, p2) = (parameters(&model), parameters(&loaded));
    assert_eq!(p1.len(), p2.len());
}

#[test]
fn record_saved_on_mlx_loads_on_ndarray() {
    let (dm, dn) = devices();
    Mlx::seed(&dm, 5);
    let model = materialize(SmallCnn::<Mlx>::new(&dm));
    let full = NamedMpkFileRecorder::<FullPrecisionSettings>::new();
    round_trip::<Mlx, NdArray, _>(
        model.clone(),
        &dm,
        &dn,
        full,
        "mlx-full",
        Tolerance::rel_abs(1e-5, 1e-6),
    );
    // Half precision: both sides read the same f16 values, so only rounding of the (f32)
    // forward pass differs from the f32 original; compare loosely against it.
    round_trip::<Mlx, NdArray, _>(
        model,
        &dm,
        &dn,
        CompactRecorder::new(),
        "mlx-half",
        Tolerance::rel_abs(2e-2, 2e-3),
    );
}

#[test]
fn record_saved_on_ndarray_loads_on_mlx() {
    let (dm, dn) = devices();
    let model = seeded(6, SmallCnn::<NdArray>::new);
    let full = NamedMpkFileRecorder::<FullPrecisionSettings>::new();
    round_trip::<NdArray, Mlx, _>(
        model.clone(),
        &dn,
        &dm,
        full,
        "nd-full",
        Tolerance::rel_abs(1e-5, 1e-6),
    );
    round_trip::<NdArray, Mlx, _>(
        model,
        &dn,
        &dm,
        CompactRecorder::new(),
        "nd-half",
        Tolerance::rel_abs(2e-2, 2e-3),
    );
}

#[test]
fn half_precision_record_loads_identically_on_both() {
    let (dm, dn) = devices();
    Mlx::seed(&dm, 7);
    let model = materialize(SmallCnn::<Mlx>::new(&dm));
    let dir = TempDir::new("both-half");
    let path = dir.file();
    model.save_file(&path, &CompactRecorder::new()).unwrap();
    let on_mlx = SmallCnn::<Mlx>::new(&dm)
        .load_file(&path, &CompactRecorder::new(), &dm)
        .unwrap();
    let on_nd = {
        let _rng = ndarray_rng();
        SmallCnn::<NdArray>::new(&dn)
            .load_file(&path, &CompactRecorder::new(), &dn)
            .unwrap()
    };
    for (a, b) in parameters(&on_mlx).iter().zip(&parameters(&on_nd)) {
        assert_eq!(a, b, "the same f16 record must give the same f32 weights");
    }
}
