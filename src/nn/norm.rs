//! [`LayerNorm`] and [`RmsNorm`]: burn-nn's normalization layers over the fused ops.

use super::functional;
use burn_core as burn;

use burn::config::Config;
use burn::module::{Module, Param};
use burn_tensor::backend::Backend;
use burn_tensor::Tensor;

/// Configuration of a [`LayerNorm`]; the fields and defaults of burn-nn's `LayerNormConfig`.
#[derive(Config, Debug)]
pub struct LayerNormConfig {
    /// The size of the input features.
    pub d_model: usize,
    /// Added to the variance before the square root. Default: 1e-5.
    #[config(default = 1e-5)]
    pub epsilon: f64,
    /// Whether the layer has a bias (`beta`). Default: true.
    #[config(default = true)]
    pub bias: bool,
}

impl LayerNormConfig {
    /// A new layer norm on `device`, initialized as burn-nn initializes its own (`gamma` ones,
    /// `beta` zeros).
    pub fn init<B: Backend>(&self, device: &B::Device) -> LayerNorm<B> {
        let inner = burn_nn::LayerNormConfig::new(self.d_model)
            .with_epsilon(self.epsilon)
            .with_bias(self.bias)
            .init(device);
        LayerNorm::from_burn_nn(inner, self.epsilon)
    }
}

/// Layer normalization over the last axis, `(x - mean) / sqrt(var + epsilon) · gamma + beta`.
///
/// The fields, and so the record, are those of burn-nn's `LayerNorm`: records load into either.
/// On `Mlx` and `Autodiff<Mlx>` the forward pass is MLX's fused layer norm and its backward
/// pass MLX's own ([`functional::layer_norm`]); elsewhere it is burn-nn's computation.
#[derive(Module, Debug)]
pub struct LayerNorm<B: Backend> {
    /// The learnable scale.
    pub gamma: Param<Tensor<B, 1>>,
    /// The learnable bias, if the layer has one.
    pub beta: Option<Param<Tensor<B, 1>>>,
    /// Added to the variance before the square root.
    pub epsilon: f64,
}

impl<B: Backend> LayerNorm<B> {
    /// The same layer as burn-nn's `layer` (its parameters, not copies), whose epsilon burn-nn
    /// keeps private: pass the one it was configured with.
    pub fn from_burn_nn(layer: burn_nn::LayerNorm<B>, epsilon: f64) -> Self {
        Self {
            gamma: layer.gamma,
            beta: layer.beta,
            epsilon,
        }
    }

    /// Normalizes `input` `[..., d_model]`.
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        functional::layer_norm(
            input,
            self.gamma.val(),
            self.beta.as_ref().map(|b| b.val()),
            self.epsilon,
        )
    }
}

/// Configuration of an [`RmsNorm`]; the fields and defaults of burn-nn's `RmsNormConfig`.
#[derive(Config, Debug)]
pub struct RmsNormConfig {
    /// The size of the input features.
    pub d_model: usize,
    /// Added to the mean square before the square root. Default: 1e-5.
    #[config(default = 1e-5)]
    pub epsilon: f64,
}

impl RmsNormConfig {
    /// A new RMS norm on `device` (`gamma` ones, as burn-nn initializes it).
    pub fn init<B: Backend>(&self, device: &B::Device) -> RmsNorm<B> {
        let inner = burn_nn::RmsNormConfig::new(self.d_model)
            .with_epsilon(self.epsilon)
            .init(device);
        RmsNorm::from(inner)
    }
}

/// Root-mean-square normalization over the last axis, `x / sqrt(mean(x²) + epsilon) · gamma`.
///
/// The fields and record are burn-nn's `RmsNorm`'s. On `Mlx` and `Autodiff<Mlx>`, MLX's fused
/// RMS norm forward and backward ([`functional::rms_norm`]); elsewhere burn-nn's computation.
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    /// The learnable scale.
    pub gamma: Param<Tensor<B, 1>>,
    /// Added to the mean square before the square root.
    pub epsilon: f64,
}

impl<B: Backend> From<burn_nn::RmsNorm<B>> for RmsNorm<B> {
    fn from(layer: burn_nn::RmsNorm<B>) -> Self {
        Self {
            gamma: layer.gamma,
            epsilon: layer.epsilon,
        }
    }
}

impl<B: Backend> From<RmsNorm<B>> for burn_nn::RmsNorm<B> {
    fn from(layer: RmsNorm<B>) -> Self {
        Self {
            gamma: layer.gamma,
            epsilon: layer.epsilon,
        }
    }
}

impl<B: Backend> RmsNorm<B> {
    /// Normalizes `input` `[..., d_model]`.
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        functional::rms_norm(input, self.gamma.val(), self.epsilon)
    }
}
