//! [`TransformerEncoder`]: burn-nn's Transformer encoder over the fused attention and layer
//! norm.

use super::attention::{MhaInput, MultiHeadAttention};
use super::norm::LayerNorm;
use burn_core as burn;

use burn::config::Config;
use burn::module::{Initializer, Module};
use burn_nn::activation::{Activation, ActivationConfig};
use burn_nn::transformer::PositionWiseFeedForward;
use burn_nn::Dropout;
use burn_tensor::backend::Backend;
use burn_tensor::{Bool, Tensor};

/// Configuration of a [`TransformerEncoder`]; the fields and defaults of burn-nn's
/// `TransformerEncoderConfig`.
#[derive(Config, Debug)]
pub struct TransformerEncoderConfig {
    /// The size of the model.
    pub d_model: usize,
    /// The size of the position-wise feed-forward network.
    pub d_ff: usize,
    /// The number of attention heads.
    pub n_heads: usize,
    /// The number of layers.
    pub n_layers: usize,
    /// The dropout rate. Default: 0.1.
    #[config(default = 0.1)]
    pub dropout: f64,
    /// Layer norm before each sub-layer (pre-norm) instead of after it. Default: false.
    #[config(default = false)]
    pub norm_first: bool,
    /// Softmax with an extra zero logit in attention. Default: false.
    #[config(default = false)]
    pub quiet_softmax: bool,
    /// How the linear layers are initialized (burn-nn's default).
    #[config(
        default = "Initializer::KaimingUniform { gain: 1.0 / 3.0f64.sqrt(), fan_out_only: false }"
    )]
    pub initializer: Initializer,
    /// The feed-forward network's activation. Default: GELU.
    #[config(default = "ActivationConfig::Gelu")]
    pub activation: ActivationConfig,
    /// The layer norms' epsilon. Default: 1e-5.
    #[config(default = 1e-5)]
    pub layer_norm_eps: f64,
}

impl TransformerEncoderConfig {
    /// burn-nn's configuration with the same settings.
    pub fn to_burn_nn(&self) -> burn_nn::transformer::TransformerEncoderConfig {
        burn_nn::transformer::TransformerEncoderConfig::new(
            self.d_model,
            self.d_ff,
            self.n_heads,
            self.n_layers,
        )
        .with_dropout(self.dropout)
        .with_norm_first(self.norm_first)
        .with_quiet_softmax(self.quiet_softmax)
        .with_initializer(self.initializer.clone())
        .with_activation(self.activation.clone())
        .with_layer_norm_eps(self.layer_norm_eps)
    }

    /// A new encoder on `device`, initialized as burn-nn initializes its own (the same draws,
    /// in the same order).
    pub fn init<B: Backend>(&self, device: &B::Device) -> TransformerEncoder<B> {
        TransformerEncoder::from_burn_nn(self.to_burn_nn().init(device), self.layer_norm_eps)
    }
}

/// A stack of Transformer encoder layers, as burn-nn's `TransformerEncoder`, whose fields and
/// record it has.
///
/// Each layer's attention and layer norms are [`MultiHeadAttention`] and [`LayerNorm`]: MLX's
/// fast ops with their own backward passes on `Mlx` and `Autodiff<Mlx>`, burn-nn's
/// computation elsewhere. The feed-forward network and dropout are burn-nn's.
#[derive(Module, Debug)]
pub struct TransformerEncoder<B: Backend> {
    /// The layers.
    pub layers: Vec<TransformerEncoderLayer<B>>,
    /// The size of the model.
    pub d_model: usize,
    /// The size of the position-wise feed-forward network.
    pub d_ff: usize,
    /// The number of attention heads.
    pub n_heads: usize,
    /// The number of layers.
    pub n_layers: usize,
    /// The dropout rate.
    pub dropout: f64,
    /// Whether layer norm comes before each sub-layer.
    pub norm_first: bool,
    /// Whether attention uses quiet softmax.
    pub quiet_softmax: bool,
}

impl<B: Backend> TransformerEncoder<B> {
    /// The same encoder as burn-nn's `encoder` (its parameters, not copies); `layer_norm_eps`
    /// is the epsilon it was configured with (burn-nn keeps it private).
    pub fn from_burn_nn(
        encoder: burn_nn::transformer::TransformerEncoder<B>,
        layer_norm_eps: f64,
    ) -> Self {
        Self {
            layers: encoder
                .layers
                .into_iter()
                .map(|l| TransformerEncoderLayer {
                    mha: l.mha.into(),
                    pwff: l.pwff,
                    norm_1: LayerNorm::from_burn_nn(l.norm_1, layer_norm_eps),
                    norm_2: LayerNorm::from_burn_nn(l.norm_2, layer_norm_eps),
                    dropout: l.dropout,
                    norm_first: l.norm_first,
                })
                .collect(),
            d_model: encoder.d_model,
            d_ff: encoder.d_ff,
            n_heads: encoder.n_heads,
            n_layers: encoder.n_layers,
            dropout: encoder.dropout,
            norm_first: encoder.norm_first,
            quiet_softmax: encoder.quiet_softmax,
        }
    }

    /// `input`'s tensor `[batch, seq, d_model]` through every layer.
    pub fn forward(&self, input: TransformerEncoderInput<B>) -> Tensor<B, 3> {
        let mut x = input.tensor;
        for layer in &self.layers {
            x = layer.forward(x, input.mask_pad.clone(), input.mask_attn.clone());
        }
        x
    }
}

/// One encoder layer: self-attention and a feed-forward network, each with a residual
/// connection and a layer norm (after the sub-layer, or before it with `norm_first`).
#[derive(Module, Debug)]
pub struct TransformerEncoderLayer<B: Backend> {
    /// Multi-head self-attention.
    pub mha: MultiHeadAttention<B>,
    /// Position-wise feed-forward network.
    pub pwff: PositionWiseFeedForward<B>,
    /// The layer norm around the feed-forward sub-layer.
    pub norm_1: LayerNorm<B>,
    /// The layer norm around the attention sub-layer.
    pub norm_2: LayerNorm<B>,
    /// Dropout on each sub-layer's output.
    pub dropout: Dropout,
    /// Whether layer norm comes before each sub-layer.
    pub norm_first: bool,
}

impl<B: Backend> TransformerEncoderLayer<B> {
    /// `input` `[batch, seq, d_model]` through the layer, in burn-nn's order of operations.
    pub fn forward(
        &self,
        input: Tensor<B, 3>,
        mask_pad: Option<Tensor<B, 2, Bool>>,
        mask_attn: Option<Tensor<B, 3, Bool>>,
    ) -> Tensor<B, 3> {
        let x = input;
        let attn_in = if self.norm_first {
            self.norm_2.forward(x.clone())
        } else {
            x.clone()
        };
        let mut mha_input = MhaInput::self_attn(attn_in);
        if let Some(m) = mask_pad {
            mha_input = mha_input.mask_pad(m);
        }
        if let Some(m) = mask_attn {
            mha_input = mha_input.mask_attn(m);
        }
        let attn = self.dropout.forward(self.mha.forward(mha_input).context);
        let mut x = x + attn;
        let ff_in = if self.norm_first {
            self.norm_1.forward(x.clone())
        } else {
            x = self.norm_1.forward(x);
            x.clone()
        };
        let ff = self.dropout.forward(feed_forward(&self.pwff, ff_in));
        let x = x + ff;
        if self.norm_first {
            x
        } else {
            self.norm_2.forward(x)
        }
    }
}

/// The inputs of [`TransformerEncoder::forward`] (burn-nn's `TransformerEncoderInput`, with the
/// same builder).
#[derive(Debug, Clone)]
pub struct TransformerEncoderInput<B: Backend> {
    tensor: Tensor<B, 3>,
    mask_pad: Option<Tensor<B, 2, Bool>>,
    mask_attn: Option<Tensor<B, 3, Bool>>,
}

impl<B: Backend> TransformerEncoderInput<B> {
    /// The input sequence `[batch, seq, d_model]`.
    pub fn new(tensor: Tensor<B, 3>) -> Self {
        Self {
            tensor,
            mask_pad: None,
            mask_attn: None,
        }
    }

    /// Padding mask `[batch, seq]`: true marks a padded position.
    pub fn mask_pad(mut self, mask_pad: Tensor<B, 2, Bool>) -> Self {
        self.mask_pad = Some(mask_pad);
        self
    }

    /// Attention mask `[batch, seq, seq]`: true marks a pair not attended (e.g. causal).
    pub fn mask_attn(mut self, mask_attn: Tensor<B, 3, Bool>) -> Self {
        self.mask_attn = Some(mask_attn);
        self
    }
}

/// burn-nn's feed-forward network on `x`, with a GELU activation as
/// [`functional::gelu`](super::functional::gelu) (one fused op where the layers fuse).
fn feed_forward<B: Backend>(pwff: &PositionWiseFeedForward<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    if !matches!(pwff.activation, Activation::Gelu(_)) {
        return pwff.forward(x);
    }
    let x = pwff.linear_inner.forward(x);
    let x = pwff.dropout.forward(super::functional::gelu(x));
    pwff.linear_outer.forward(x)
}
