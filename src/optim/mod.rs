//! [`Adam`] and [`AdamW`]: burn-optim's optimizers whose update of a bucket of parameters is one
//! kernel.
//!
//! Burn's Adam updates each parameter with about fourteen tensor ops (two moments, the bias
//! corrections, the square root, the division, the step). On a GPU each is a kernel launch and host
//! work, and over a model's parameters the optimizer is half of a Transformer training step's MLX
//! primitives. This Adam computes the same update, in the same order of operations, as one
//! primitive per bucket of up to 8 parameters (of one device, dtype and step number), writing
//! the parameters and both moments: a custom CUDA kernel on MLX's CUDA device (`cuda.rs`, where
//! MLX's compiled function runs as four kernels per parameter), an MLX-compiled function
//! elsewhere. [`AdamConfig::init`] gives the optimizer as a [`FusedAdaptor`], which collects the
//! parameters of a step into buckets; [`AdamConfig::build`] gives the per-parameter
//! `SimpleOptimizer` (a bucket of one each), for burn-optim's own adaptor or
//! [`crate::grad::Trainer`]. It is burn-optim's Adam in every other respect: the same config
//! fields and defaults, the same state record (`AdamState` in burn-optim's adaptor record, so
//! optimizer checkpoints load into either), usable wherever an `Optimizer` is, burn-train's
//! `Learner` included. On backends other than `Mlx` (and on MLX's CPU device, unless
//! [`crate::nn::fuse_on_cpu`] is on) it is burn-optim's Adam.

use burn_core as burn;

mod adaptor;
mod cuda;

pub use adaptor::FusedAdaptor;

use crate::backend::Mlx;
use crate::device::MlxDevice;
use crate::interop::{from_mlx, to_mlx};
use crate::nn::custom;
use crate::tensor::{constant_scalar_array, MlxTensor, OrPanic};
use burn_backend::Scalar;
use burn_core::config::Config;
use burn_core::module::AutodiffModule;
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
    /// The optimizer, for modules `M` on autodiff backend `B`: the parameters' updates run in
    /// buckets ([`FusedAdaptor`]).
    pub fn init<B: AutodiffBackend, M: AutodiffModule<B>>(&self) -> FusedAdaptor<Adam, M, B> {
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

/// Which update rule a step runs.
#[derive(Clone, Copy, Debug)]
enum Rule {
    Adam = 0,
    AdamW = 1,
}

impl Rule {
    /// The number of scalars the rule's update takes.
    fn scalars(self) -> usize {
        match self {
            Rule::Adam => 8,
            Rule::AdamW => 9,
        }
    }
}

/// An optimizer whose update [`FusedAdaptor`] runs for buckets of parameters: [`Adam`] and
/// [`AdamW`]. The methods are the adaptor's view of the optimizer.
pub trait Bucketed<B: Backend>: SimpleOptimizer<B> {
    /// Whether the parameter `tensor`, with `state`, takes the bucketed update (`B` is `Mlx`
    /// on a device where fused ops run, and the state is not AMSGrad's).
    fn bucketed<const D: usize>(tensor: &Tensor<B, D>, state: Option<&Self::State<D>>) -> bool;

    /// The moments of a parameter's state.
    fn into_momentum<const D: usize>(state: Self::State<D>) -> AdaptiveMomentumState<B, D>;

    /// The state holding `momentum`.
    fn from_momentum<const D: usize>(momentum: AdaptiveMomentumState<B, D>) -> Self::State<D>;

    /// The update of a step at learning rate `lr` for parameters at step number `time`.
    fn update_rule(&self, lr: LearningRate, time: usize) -> UpdateRule;
}

/// A step's update rule and its scalars (see [`Bucketed::update_rule`]).
#[derive(Clone, Debug)]
pub struct UpdateRule {
    rule: Rule,
    scalars: Vec<f32>,
}

/// `p`'s shape and dtype filled with zeros: the moments before a parameter's first step, which
/// give exactly burn-optim's first step, `(1 - beta) · g`.
fn zeros_like(p: &MlxTensor) -> MlxTensor {
    p.with(mlx_rs::ops::zeros_like(p.array()).or_panic("Adam", &[p.array()]))
}

/// The moments of a parameter's state (zeros before the first step) and the step number.
fn moments<B: Backend, const D: usize>(
    p: &MlxTensor,
    state: Option<AdaptiveMomentumState<B, D>>,
) -> (usize, MlxTensor, MlxTensor) {
    let as_mlx = |t: Tensor<B, D>| to_mlx(t).unwrap_or_else(|_| unreachable!("B is Mlx"));
    match state {
        Some(s) => (s.time + 1, as_mlx(s.moment_1), as_mlx(s.moment_2)),
        None => {
            let zeros = zeros_like(p);
            (1, zeros.clone(), zeros)
        }
    }
}

/// Whether the update runs as [`cuda::update_bucket`]'s kernel for `p`: on MLX's CUDA device
/// (Linux GPU), for a float parameter with values (fewer than the `i32` grid's 2^31 - 256),
/// unless `BURN_MLX_ADAM_KERNEL=0` (read once) selects the compiled MLX function there too.
fn cuda_kernel(p: &MlxTensor) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    cfg!(target_os = "linux")
        && p.device() == MlxDevice::Gpu
        && crate::dtype::is_float(p.array().dtype())
        && (1..i32::MAX as usize - 256).contains(&p.array().size())
        && *ON.get_or_init(|| std::env::var("BURN_MLX_ADAM_KERNEL").map_or(true, |v| v != "0"))
}

/// Runs the update `rule` with `scalars` on a bucket of `[p, g, m, v]` (one device and dtype):
/// one CUDA kernel on MLX's CUDA device ([`cuda::update_bucket`]), elsewhere one compiled MLX
/// function (scalars as 0-d arrays of the parameters' dtype). Returns each parameter's new value
/// and moments.
fn run_bucket(rule: Rule, bucket: &[[&MlxTensor; 4]], scalars: &[f32]) -> Vec<[MlxTensor; 3]> {
    let device = bucket[0][0].device();
    let dtype = bucket[0][0].array().dtype();
    let arrays: Vec<[&Array; 4]> = bucket.iter().map(|e| e.map(|t| t.array())).collect();
    let outputs = device.scope(|| {
        if bucket.iter().all(|e| cuda_kernel(e[0])) {
            return cuda::update_bucket(rule, &arrays, scalars).map_err(|e| e.to_string());
        }
        let mut inputs: Vec<Array> = arrays.iter().flatten().map(|&a| a.clone()).collect();
        // Scalars made in the parameters' dtype: no cast primitive per scalar and step.
        inputs.extend(
            scalars
                .iter()
                .map(|&s| constant_scalar_array(Scalar::Float(s as f64), dtype)),
        );
        UPDATE.with(|cell| {
            let mut fns = cell.borrow_mut();
            let f = fns[rule as usize].get_or_insert_with(|| match rule {
                Rule::Adam => Box::new(mlx_rs::transforms::compile::compile(update_each, true)),
                Rule::AdamW => Box::new(mlx_rs::transforms::compile::compile(update_w_each, true)),
            });
            let flat = f(&inputs).map_err(|e| e.to_string())?;
            let mut it = flat.into_iter();
            Ok((0..bucket.len())
                .map(|_| std::array::from_fn(|_| it.next().expect("three outputs a parameter")))
                .collect())
        })
    });
    let refs: Vec<&Array> = arrays.iter().flatten().copied().collect();
    outputs
        .or_panic("Adam update", &refs)
        .into_iter()
        .map(|out| out.map(|a| MlxTensor::from_array(a, device)))
        .collect()
}

/// The new values and moments of `entries` under `optim`'s rule at learning rate `lr`, in their
/// order: the entries of one device, dtype and step number in buckets of up to
/// [`cuda::bucket_max`] parameters and [`cuda::BUCKET_VALUES_MAX`] values, one [`run_bucket`]
/// each.
fn update_buckets<B: Backend, O: Bucketed<B>>(
    optim: &O,
    lr: LearningRate,
    entries: &[adaptor::Entry],
) -> Vec<[MlxTensor; 3]> {
    type Key = (MlxDevice, mlx_rs::Dtype, usize, bool);
    // Open buckets by key, and every bucket's entries (indices) in order of opening.
    let mut open: Vec<(Key, usize)> = Vec::new();
    let mut buckets: Vec<(Key, Vec<usize>, usize)> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let key = (e.p.device(), e.p.array().dtype(), e.time, cuda_kernel(&e.p));
        let size = e.p.array().size();
        let slot = open.iter().position(|(k, _)| *k == key);
        let fits = slot.is_some_and(|s| {
            let (_, members, values) = &buckets[open[s].1];
            members.len() < cuda::bucket_max() && values + size <= cuda::BUCKET_VALUES_MAX
        });
        match (slot, fits) {
            (Some(s), true) => {
                let b = &mut buckets[open[s].1];
                b.1.push(i);
                b.2 += size;
            }
            (slot, _) => {
                buckets.push((key, vec![i], size));
                let index = buckets.len() - 1;
                match slot {
                    Some(s) => open[s].1 = index,
                    None => open.push((key, index)),
                }
            }
        }
    }
    let mut results: Vec<Option<[MlxTensor; 3]>> = (0..entries.len()).map(|_| None).collect();
    for ((_, _, time, _), members, _) in buckets {
        let rule = optim.update_rule(lr, time);
        let bucket: Vec<[&MlxTensor; 4]> = members
            .iter()
            .map(|&i| {
                let e = &entries[i];
                [&e.p, &e.g, &e.m, &e.v]
            })
            .collect();
        for (i, out) in members
            .into_iter()
            .zip(run_bucket(rule.rule, &bucket, &rule.scalars))
        {
            results[i] = Some(out);
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every entry is in a bucket"))
        .collect()
}

/// [`update`] for each parameter of a bucket: inputs `[p0, g0, m0, v0, p1, …, scalars…]`,
/// outputs `[p0, m0, v0, p1, …]`.
fn update_each(xs: &[Array]) -> Result<Vec<Array>, Exception> {
    each(xs, Rule::Adam.scalars(), update)
}

/// [`update_w`] for each parameter of a bucket, as [`update_each`].
fn update_w_each(xs: &[Array]) -> Result<Vec<Array>, Exception> {
    each(xs, Rule::AdamW.scalars(), update_w)
}

/// `f` applied to each `[p, g, m, v]` of `xs` with the `scalars` last values of `xs`.
fn each(
    xs: &[Array],
    scalars: usize,
    f: fn(&[Array]) -> Result<Vec<Array>, Exception>,
) -> Result<Vec<Array>, Exception> {
    if xs.len() < scalars || !(xs.len() - scalars).is_multiple_of(4) {
        return Err(Exception::custom(format!(
            "Adam update: {} inputs are not groups of 4 and {scalars} scalars",
            xs.len()
        )));
    }
    let (params, s) = xs.split_at(xs.len() - scalars);
    let mut out = Vec::with_capacity(params.len() / 4 * 3);
    for group in params.chunks(4) {
        let mut args = group.to_vec();
        args.extend_from_slice(s);
        out.extend(f(&args)?);
    }
    Ok(out)
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
    let [p, m, v] = run_bucket(rule, &[[&p, &g, &m, &v]], &scalars(time as i32))
        .pop()
        .expect("one parameter");
    (back(p), AdaptiveMomentumState::new(time, back(m), back(v)))
}

/// The bucketing adaptor around `optim`, with gradient clipping when configured.
fn adaptor<O: Bucketed<B::InnerBackend>, B: AutodiffBackend, M: AutodiffModule<B>>(
    optim: O,
    clipping: Option<&GradientClippingConfig>,
) -> FusedAdaptor<O, M, B> {
    let optim = FusedAdaptor::new(optim);
    match clipping {
        Some(config) => optim.with_grad_clipping(config.init()),
        None => optim,
    }
}

impl<B: Backend> Bucketed<B> for Adam {
    fn bucketed<const D: usize>(tensor: &Tensor<B, D>, state: Option<&AdamState<B, D>>) -> bool {
        fused_update(tensor, state.map(|s| &s.momentum))
    }

    fn into_momentum<const D: usize>(state: AdamState<B, D>) -> AdaptiveMomentumState<B, D> {
        state.momentum
    }

    fn from_momentum<const D: usize>(momentum: AdaptiveMomentumState<B, D>) -> AdamState<B, D> {
        AdamState::new(momentum)
    }

    fn update_rule(&self, lr: LearningRate, time: usize) -> UpdateRule {
        UpdateRule {
            rule: Rule::Adam,
            scalars: self.scalars(lr, time as i32),
        }
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
    /// The optimizer, for modules `M` on autodiff backend `B`: the parameters' updates run in
    /// buckets ([`FusedAdaptor`]).
    pub fn init<B: AutodiffBackend, M: AutodiffModule<B>>(&self) -> FusedAdaptor<AdamW, M, B> {
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

impl<B: Backend> Bucketed<B> for AdamW {
    fn bucketed<const D: usize>(tensor: &Tensor<B, D>, state: Option<&AdamWState<B, D>>) -> bool {
        fused_update(tensor, state.map(|s| &s.momentum))
    }

    fn into_momentum<const D: usize>(state: AdamWState<B, D>) -> AdaptiveMomentumState<B, D> {
        state.momentum
    }

    fn from_momentum<const D: usize>(momentum: AdaptiveMomentumState<B, D>) -> AdamWState<B, D> {
        AdamWState::new(momentum)
    }

    fn update_rule(&self, lr: LearningRate, time: usize) -> UpdateRule {
        UpdateRule {
            rule: Rule::AdamW,
            scalars: self.scalars(lr, time as i32),
        }
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
