//! [`Adam`]: burn-optim's Adam whose update of a parameter is one compiled MLX kernel.
//!
//! Burn's Adam updates each parameter with about fourteen tensor ops (two moments, the bias
//! corrections, the square root, the division, the step). On a GPU each is a kernel launch and
//! host work, and over a model's parameters the optimizer is half of a Transformer training
//! step's MLX primitives. This Adam computes the same update, in the same order of operations,
//! as one MLX-compiled function per parameter: one fused kernel writing the parameter and both
//! moments. It is burn-optim's Adam in every other respect: the same config fields and defaults,
//! the same state record (`AdamState`, so optimizer checkpoints load into either), usable
//! wherever an `Optimizer` is, burn-train's `Learner` included. On backends other than `Mlx`
//! (and on MLX's CPU device, unless [`crate::nn::fuse_on_cpu`] is on) it is burn-optim's Adam.

use burn_core as burn;

use crate::backend::Mlx;
use crate::interop::{from_mlx, to_mlx};
use crate::nn::custom;
use crate::tensor::{MlxTensor, OrPanic};
use burn_core::config::Config;
use burn_core::module::AutodiffModule;
use burn_optim::adaptor::OptimizerAdaptor;
use burn_optim::decay::WeightDecayConfig;
use burn_optim::grad_clipping::GradientClippingConfig;
use burn_optim::{AdamState, AdaptiveMomentumState, LearningRate, SimpleOptimizer};
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
        let mut optim = OptimizerAdaptor::from(self.build());
        if let Some(config) = &self.grad_clipping {
            optim = optim.with_grad_clipping(config.init());
        }
        optim
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
    /// The compiled update (MLX keeps one trace per input signature), made once per thread.
    static UPDATE: RefCell<Option<ArrayFn>> = const { RefCell::new(None) };
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

impl Adam {
    /// The fused update on MLX tensors; `None` when `B` is not [`Mlx`].
    fn step_mlx<B: Backend, const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<B, D>,
        grad: Tensor<B, D>,
        state: Option<AdamState<B, D>>,
    ) -> (Tensor<B, D>, Option<AdamState<B, D>>) {
        let as_mlx = |t: Tensor<B, D>| to_mlx(t).unwrap_or_else(|_| unreachable!("B is Mlx"));
        let back = |t: MlxTensor| from_mlx::<B, D, burn_tensor::Float>(t).expect("B is Mlx");
        let p = as_mlx(tensor);
        let g = as_mlx(grad);
        let (time, m, v) = match state {
            Some(s) => (
                s.momentum.time + 1,
                as_mlx(s.momentum.moment_1),
                as_mlx(s.momentum.moment_2),
            ),
            // Zero moments give exactly burn-optim's first step ((1 - beta) · g).
            None => {
                let zeros =
                    p.with(mlx_rs::ops::zeros_like(p.array()).or_panic("Adam", &[p.array()]));
                (1, zeros.clone(), zeros)
            }
        };
        let t = time as i32;
        let bias2_sqrt = (1.0 - self.beta_2.powi(t)).sqrt();
        let factor = bias2_sqrt / (1.0 - self.beta_1.powi(t));
        let dtype = p.array().dtype();
        let device = p.device();
        let outputs = device.scope(|| {
            let scalar = |x: f32| Array::from_f32(x).as_dtype(dtype);
            let mut inputs = vec![
                p.array().clone(),
                g.array().clone(),
                m.array().clone(),
                v.array().clone(),
            ];
            for s in [
                self.beta_1,
                1.0 - self.beta_1,
                self.beta_2,
                1.0 - self.beta_2,
                self.penalty.unwrap_or(0.0),
                factor,
                self.epsilon * bias2_sqrt,
                lr as f32,
            ] {
                inputs.push(scalar(s)?);
            }
            UPDATE.with(|cell| {
                let mut f = cell.borrow_mut();
                let f = f.get_or_insert_with(|| {
                    Box::new(mlx_rs::transforms::compile::compile(update, true))
                });
                f(&inputs)
            })
        });
        let mut outputs = outputs
            .or_panic("Adam update", &[p.array(), g.array()])
            .into_iter()
            .map(|a| MlxTensor::from_array(a, device));
        let (p, m, v) = (
            outputs.next().expect("three outputs"),
            outputs.next().expect("three outputs"),
            outputs.next().expect("three outputs"),
        );
        let state = AdamState::new(AdaptiveMomentumState::new(time, back(m), back(v)));
        (back(p), Some(state))
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
        let fused = TypeId::of::<B>() == TypeId::of::<Mlx>()
            && custom::fuses::<B>(&tensor.device())
            && state
                .as_ref()
                .is_none_or(|s| s.momentum.max_moment_2.is_none());
        if fused {
            self.step_mlx(lr, tensor, grad, state)
        } else {
            SimpleOptimizer::<B>::step(&self.reference, lr, tensor, grad, state)
        }
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &B::Device) -> Self::State<D> {
        <burn_optim::Adam as SimpleOptimizer<B>>::to_device(state, device)
    }
}
