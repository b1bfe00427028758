//! [`Adam`] and [`AdamW`]: burn-optim's optimizers whose update of a parameter is one kernel.
//!
//! Burn's Adam updates each parameter with about fourteen tensor ops (two moments, the bias
//! corrections, the square root, the division, the step). On a GPU each is a kernel launch and host
//! work, and over a model's parameters the optimizer is half of a Transformer training step's MLX
//! primitives. This Adam computes the same update, in the same order of operations, as one
//! primitive per parameter writing the parameter and both moments: a custom CUDA kernel on MLX's
//! CUDA device (`cuda.rs`, where MLX's compiled function runs as four kernels), an MLX-compiled
//! function elsewhere. It is burn-optim's Adam in every other respect: the same config fields and
//! defaults, the same state record (`AdamState`, so optimizer checkpoints load into either), usable
//! wherever an `Optimizer` is, burn-train's `Learner` included. On backends other than `Mlx` (and
//! on MLX's CPU device, unless [`crate::nn::fuse_on_cpu`] is on) it is burn-optim's Adam.

use burn_core as burn;

mod cuda;

use crate::backend::Mlx;
use crate::device::MlxDevice;
use crate::interop::{from_mlx, to_mlx};
use crate::nn::custom;
use crate::tensor::{constant_scalar_array, MlxTensor, OrPanic};
use burn_backend::Scalar;
use burn_core::config::Config;
use burn_core::module::AutodiffModule;
use burn_optim::adaptor::OptimizerAdaptor;
use burn_optim::decay::WeightDecayConfig;
use burn_optim::grad_clipping::GradientClippingConfig;
use burn_optim::{AdamState, AdamWState, AdaptiveMomentumState, LearningRate, SimpleOptimizer};
use burn_tensor::backend::{AutodiffBackend, Backend};
use burn_tensor::Tensor;
use mlx_rs::error::Exception;
use mlx_rs::Array;
use std::any::TypeId;
use std::cell::RefCell;

/// Configuration of [`Adam`]: burn-optim's `AdamConfig` fields and defaults (without
/// `amsgrad`).
#[derive(Config, Debug)]
pub struct AdamConfig {
    /// Decay of the first moment. Default: 0.9.
    #[config(default = 0.9)]
    pub beta_1: f32,
    /// Decay of the second moment. Default: 0.999.
    #[config(default = 0.999)]
    pub beta_2: f32,
    /// Added to the second moment's square root. Default: 1e-5.
    #[config(default = 1e-5)]
    pub epsilon: f32,
    /// L2 weight decay, added to the gradient.
    pub weight_decay: Option<WeightDecayConfig>,
    /// Gradient clipping, applied before the update.
    pub grad_clipping: Option<GradientClippingConfig>,
}

impl AdamConfig {
    /// The optimizer, for modules `M` on autodiff backend `B`.
    pub fn init<B: AutodiffBackend, M: AutodiffModule<B>>(&self) -> OptimizerAdaptor<Adam, M, B> {
        adaptor(self.build(), self.grad_clipping.as_ref())
    }

    /// The per-parameter optimizer.
    pub fn build(&self) -> Adam {
        Adam {
            reference: burn_optim::AdamConfig::new()
                .with_beta_1(self.beta_1)
                .with_beta_2(self.beta_2)
                .with_epsilon(self.epsilon)
                .with_weight_decay(self.weight_decay.clone())
                .build(),
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            penalty: self.weight_decay.as_ref().map(|w| w.penalty),
        }
    }
}

/// Adam with one compiled MLX kernel per parameter update (see the [module docs](self)).
#[derive(Clone)]
pub struct Adam {
    /// burn-optim's Adam with the same settings: the update on other backends.
    reference: burn_optim::Adam,
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    penalty: Option<f32>,
}

/// A compiled MLX function of arrays.
type ArrayFn = Box<dyn FnMut(&[Array]) -> Result<Vec<Array>, Exception>>;

thread_local! {
    /// The compiled updates, Adam's and AdamW's (MLX keeps one trace per input signature),
    /// made once per thread.
    static UPDATE: RefCell<[Option<ArrayFn>; 2]> = const { RefCell::new([None, None]) };
}

/// Which compiled update [`run_update`] calls.
#[derive(Clone, Copy)]
enum Rule {
    Adam = 0,
    AdamW = 1,
}

/// The moments of a parameter's state (zeros before the first step, which gives exactly
/// burn-optim's first step, `(1 - beta) · g`) and the step number.
fn moments<B: Backend, const D: usize>(
    p: &MlxTensor,
    state: Option<AdaptiveMomentumState<B, D>>,
) -> (usize, MlxTensor, MlxTensor) {
    let as_mlx = |t: Tensor<B, D>| to_mlx(t).unwrap_or_else(|_| unreachable!("B is Mlx"));
    match state {
        Some(s) => (s.time + 1, as_mlx(s.moment_1), as_mlx(s.moment_2)),
        None => {
            let zeros = p.with(mlx_rs::ops::zeros_like(p.array()).or_panic("Adam", &[p.array()]));
            (1, zeros.clone(), zeros)
        }
    }
}

/// Whether the update runs as [`cuda::update`]'s kernel for `p`: on MLX's CUDA device (Linux GPU),
/// for a float parameter with values (fewer than the `i32` grid's 2^31 - 256), unless
/// `BURN_MLX_ADAM_KERNEL=0` (read once) selects the compiled MLX function there too.
fn cuda_kernel(p: &MlxTensor) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    cfg!(target_os = "linux")
        && p.device() == MlxDevice::Gpu
        && crate::dtype::is_float(p.array().dtype())
        && (1..i32::MAX as usize - 256).contains(&p.array().size())
        && *ON.get_or_init(|| std::env::var("BURN_MLX_ADAM_KERNEL").map_or(true, |v| v != "0"))
}

/// Runs the update `rule` on `[p, g, m, v]` and `scalars`: one CUDA kernel on MLX's CUDA device
/// ([`cuda::update`]), elsewhere the compiled MLX function (scalars as 0-d arrays of `p`'s
/// dtype). Returns the new parameter and moments.
fn run_update(rule: Rule, arrays: [&MlxTensor; 4], scalars: &[f32]) -> [MlxTensor; 3] {
    let [p, g, m, v] = arrays;
    let dtype = p.array().dtype();
    let device = p.device();
    let outputs = device.scope(|| {
        if cuda_kernel(p) {
            let arrays = [p.array(), g.array(), m.array(), v.array()];
            return cuda::update(rule, arrays, scalars).map_err(|e| e.to_string());
        }
        let mut inputs: Vec<Array> = arrays.iter().map(|t| t.array().clone()).collect();
        // Scalars made in the parameter's dtype: no cast primitive per scalar and step.
        inputs.extend(
            scalars
                .iter()
                .map(|&s| constant_scalar_array(Scalar::Float(s as f64), dtype)),
        );
        UPDATE.with(|cell| {
            let mut fns = cell.borrow_mut();
            let f = fns[rule as usize].get_or_insert_with(|| match rule {
                Rule::Adam => Box::new(mlx_rs::transforms::compile::compile(update, true)),
                Rule::AdamW => Box::new(mlx_rs::transforms::compile::compile(update_w, true)),
            });
            f(&inputs).map_err(|e| e.to_string())
        })
    });
    let mut out = outputs
        .or_panic("Adam update", &[p.array(), g.array(), m.array(), v.array()])
        .into_iter()
        .map(|a| MlxTensor::from_array(a, device));
    std::array::from_fn(|_| out.next().expect("three outputs"))
}

/// The update, with scalars as 0-d inputs so that one trace serves every step and setting:
/// inputs `[param, grad, m, v, beta_1, 1 - beta_1, beta_2, 1 - beta_2, penalty, factor, eps,
/// lr]`, outputs `[param, m, v]`, burn-optim's order of operations.
fn update(xs: &[Array]) -> Result<Vec<Array>, Exception> {
    let [p, g, m, v, b1, c1, b2, c2, penalty, factor, eps, lr] = xs else {
        return Err(Exception::custom("Adam update: 12 inputs expected"));
    };
    let g = p.multiply(penalty)?.add(g)?;
    let m = m.multiply(b1)?.add(&g.multiply(c1)?)?;
    let v = v.multiply(b2)?.add(&g.square()?.multiply(c2)?)?;
    let step = m
        .multiply(factor)?
        .divide(&v.sqrt()?.add(eps)?)?
        .multiply(lr)?;
    Ok(vec![p.subtract(&step)?, m, v])
}

/// AdamW's update: inputs `[param, grad, m, v, beta_1, 1 - beta_1, beta_2, 1 - beta_2,
/// 1 - beta_1^t, 1 - beta_2^t, eps, 1 - lr · decay, lr]`, outputs `[param, m, v]`, burn-optim's
/// order of operations.
fn update_w(xs: &[Array]) -> Result<Vec<Array>, Exception> {
    let [p, g, m, v, b1, c1, b2, c2, bias1, bias2, eps, keep, lr] = xs else {
        return Err(Exception::custom("AdamW update: 13 inputs expected"));
    };
    let m = m.multiply(b1)?.add(&g.multiply(c1)?)?;
    let v = v.multiply(b2)?.add(&g.square()?.multiply(c2)?)?;
    let delta = m
        .divide(bias1)?
        .divide(&v.divide(bias2)?.sqrt()?.add(eps)?)?;
    let p = p.multiply(keep)?.subtract(&delta.multiply(lr)?)?;
    Ok(vec![p, m, v])
}

impl Adam {
    /// The scalar inputs of [`update`] at step `t`.
    fn scalars(&self, lr: LearningRate, t: i32) -> Vec<f32> {
        let bias2_sqrt = (1.0 - self.beta_2.powi(t)).sqrt();
        vec![
            self.beta_1,
            1.0 - self.beta_1,
            self.beta_2,
            1.0 - self.beta_2,
            self.penalty.unwrap_or(0.0),
            bias2_sqrt / (1.0 - self.beta_1.powi(t)),
            self.epsilon * bias2_sqrt,
            lr as f32,
        ]
    }
}

/// Whether a parameter of backend `B` with this momentum state is updated by a compiled kernel:
/// `B` is `Mlx` on a device where fused ops run, and the state is not AMSGrad's.
fn fused_update<B: Backend, const D: usize>(
    tensor: &Tensor<B, D>,
    momentum: Option<&AdaptiveMomentumState<B, D>>,
) -> bool {
    TypeId::of::<B>() == TypeId::of::<Mlx>()
        && custom::fuses::<B>(&tensor.device())
        && momentum.is_none_or(|m| m.max_moment_2.is_none())
}

/// One parameter's update by the compiled `rule`, `B` being `Mlx`: `scalars` gives the rule's
/// scalar inputs for the step number.
fn fused_step<B: Backend, const D: usize>(
    rule: Rule,
    tensor: Tensor<B, D>,
    grad: Tensor<B, D>,
    momentum: Option<AdaptiveMomentumState<B, D>>,
    scalars: impl Fn(i32) -> Vec<f32>,
) -> (Tensor<B, D>, AdaptiveMomentumState<B, D>) {
    let as_mlx = |t: Tensor<B, D>| to_mlx(t).unwrap_or_else(|_| unreachable!("B is Mlx"));
    let back = |t: MlxTensor| from_mlx::<B, D, burn_tensor::Float>(t).expect("B is Mlx");
    let (p, g) = (as_mlx(tensor), as_mlx(grad));
    let (time, m, v) = moments(&p, momentum);
    let [p, m, v] = run_update(rule, [&p, &g, &m, &v], &scalars(time as i32));
    (back(p), AdaptiveMomentumState::new(time, back(m), back(v)))
}

/// burn-optim's adaptor around `optim`, with gradient clipping when configured.
fn adaptor<O: SimpleOptimizer<B::InnerBackend>, B: AutodiffBackend, M: AutodiffModule<B>>(
    optim: O,
    clipping: Option<&GradientClippingConfig>,
) -> OptimizerAdaptor<O, M, B> {
    let optim = OptimizerAdaptor::from(optim);
    match clipping {
        Some(config) => optim.with_grad_clipping(config.init()),
        None => optim,
    }
}

impl<B: Backend> SimpleOptimizer<B> for Adam {
    type State<const D: usize> = AdamState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        if !fused_update(&tensor, state.as_ref().map(|s| &s.momentum)) {
            return SimpleOptimizer::<B>::step(&self.reference, lr, tensor, grad, state);
        }
        let momentum = state.map(|s| s.momentum);
        let (p, m) = fused_step(Rule::Adam, tensor, grad, momentum, |t| self.scalars(lr, t));
        (p, Some(AdamState::new(m)))
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        <burn_optim::Adam as SimpleOptimizer<B>>::to_device(state, device)
    }
}

/// Configuration of [`AdamW`]: burn-optim's `AdamWConfig` fields and defaults (without
/// `amsgrad` and cautious weight decay).
#[derive(Config, Debug)]
pub struct AdamWConfig {
    /// Decay of the first moment. Default: 0.9.
    #[config(default = 0.9)]
    pub beta_1: f32,
    /// Decay of the second moment. Default: 0.999.
    #[config(default = 0.999)]
    pub beta_2: f32,
    /// Added to the bias-corrected second moment's square root. Default: 1e-5.
    #[config(default = 1e-5)]
    pub epsilon: f32,
    /// Decoupled weight decay: each step multiplies the parameter by `1 - lr · weight_decay`.
    /// Default: 1e-4.
    #[config(default = 1e-4)]
    pub weight_decay: f32,
    /// Gradient clipping, applied before the update.
    pub grad_clipping: Option<GradientClippingConfig>,
}

impl AdamWConfig {
    /// The optimizer, for modules `M` on autodiff backend `B`.
    pub fn init<B: AutodiffBackend, M: AutodiffModule<B>>(&self) -> OptimizerAdaptor<AdamW, M, B> {
        adaptor(self.build(), self.grad_clipping.as_ref())
    }

    /// The per-parameter optimizer.
    pub fn build(&self) -> AdamW {
        AdamW {
            reference: burn_optim::AdamWConfig::new()
                .with_beta_1(self.beta_1)
                .with_beta_2(self.beta_2)
                .with_epsilon(self.epsilon)
                .with_weight_decay(self.weight_decay)
                .build(),
            beta_1: self.beta_1,
            beta_2: self.beta_2,
            epsilon: self.epsilon,
            weight_decay: self.weight_decay,
        }
    }
}

/// AdamW (decoupled weight decay) with one compiled MLX kernel per parameter update; burn-optim's
/// `AdamW` in every other respect, its `AdamWState` record included (see the
/// [module docs](self)).
#[derive(Clone)]
pub struct AdamW {
    /// burn-optim's AdamW with the same settings: the update on other backends.
    reference: burn_optim::AdamW,
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    weight_decay: f32,
}

impl AdamW {
    /// The scalar inputs of [`update_w`] at step `t`.
    fn scalars(&self, lr: LearningRate, t: i32) -> Vec<f32> {
        vec![
            self.beta_1,
            1.0 - self.beta_1,
            self.beta_2,
            1.0 - self.beta_2,
            1.0 - self.beta_1.powi(t),
            1.0 - self.beta_2.powi(t),
            self.epsilon,
            (1.0 - lr * self.weight_decay as f64) as f32,
            lr as f32,
        ]
    }
}

impl<B: Backend> SimpleOptimizer<B> for AdamW {
    type State<const D: usize> = AdamWState<B, D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<B, D>, Option<Self::State<D>>) {
        if !fused_update(&tensor, state.as_ref().map(|s| &s.momentum)) {
            return SimpleOptimizer::<B>::step(&self.reference, lr, tensor, grad, state);
        }
        let momentum = state.map(|s| s.momentum);
        let (p, m) = fused_step(Rule::AdamW, tensor, grad, momentum, |t| self.scalars(lr, t));
        (p, Some(AdamWState::new(m)))
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        <burn_optim::AdamW as SimpleOptimizer<B>>::to_device(state, device)
    }
}
