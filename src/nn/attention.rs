//! [`MultiHeadAttention`]: burn-nn's attention layer over MLX's fused attention.

use super::functional;
use super::self_attention::self_attention;
use burn_core as burn;

use burn::config::Config;
use burn::module::{Initializer, Module};
use burn_nn::activation::Gelu;
use burn_nn::{Dropout, Linear};
use burn_tensor::backend::Backend;
use burn_tensor::{Bool, Tensor};

/// Configuration of a [`MultiHeadAttention`]; the fields and defaults of burn-nn's
/// `MultiHeadAttentionConfig`.
#[derive(Config, Debug)]
pub struct MultiHeadAttentionConfig {
    /// The size of each linear layer.
    pub d_model: usize,
    /// The number of heads.
    pub n_heads: usize,
    /// Dropout on the attention scores during training. Default: 0.1.
    #[config(default = 0.1)]
    pub dropout: f64,
    /// The score given to masked positions. Default: -1.0e4.
    #[config(default = -1.0e4)]
    pub min_float: f64,
    /// Softmax with an extra zero logit, so that a head can attend to nothing. Default: false.
    #[config(default = false)]
    pub quiet_softmax: bool,
    /// How the linear layers are initialized (burn-nn's default).
    #[config(
        default = "Initializer::KaimingUniform { gain: 1.0 / 3.0f64.sqrt(), fan_out_only: false }"
    )]
    pub initializer: Initializer,
}

impl MultiHeadAttentionConfig {
    /// A new layer on `device`, initialized as burn-nn initializes its own.
    pub fn init<B: Backend>(&self, device: &B::Device) -> MultiHeadAttention<B> {
        burn_nn::attention::MultiHeadAttentionConfig::new(self.d_model, self.n_heads)
            .with_dropout(self.dropout)
            .with_min_float(self.min_float)
            .with_quiet_softmax(self.quiet_softmax)
            .with_initializer(self.initializer.clone())
            .init(device)
            .into()
    }
}

/// Multi-head attention, as burn-nn's `MultiHeadAttention`, whose fields and record it has.
///
/// On `Mlx` and `Autodiff<Mlx>` the attention itself (scores, masks, softmax, weighted sum) is
/// MLX's fused scaled-dot-product attention, forward and backward
/// ([`functional::attention`]); the four projections are burn-nn's `Linear`. When training in
/// f32 on self-attention input ([`MhaInput::self_attn`]), the query, key and value projections
/// and the attention are one op instead, whose projection is one GEMM over the three weights
/// joined, forward and backward (`nn/self_attention.rs`). The attention
/// weights are then never formed, and [`MhaOutput::weights`] is `None`. burn-nn's computation
/// runs instead, with the weights, on other backends, with dropout during training
/// (`dropout > 0` on an autodiff backend) and with `quiet_softmax`.
#[derive(Module, Debug)]
pub struct MultiHeadAttention<B: Backend> {
    /// Query projection.
    pub query: Linear<B>,
    /// Key projection.
    pub key: Linear<B>,
    /// Value projection.
    pub value: Linear<B>,
    /// Output projection.
    pub output: Linear<B>,
    /// Dropout on the attention scores.
    pub dropout: Dropout,
    /// Kept for burn-nn's record layout (burn-nn's layer does not use it either).
    pub activation: Gelu,
    /// The size of each linear layer.
    pub d_model: usize,
    /// The number of heads.
    pub n_heads: usize,
    /// The size of each head.
    pub d_k: usize,
    /// The score given to masked positions.
    pub min_float: f64,
    /// Whether the softmax has an extra zero logit.
    pub quiet_softmax: bool,
}

impl<B: Backend> From<burn_nn::attention::MultiHeadAttention<B>> for MultiHeadAttention<B> {
    fn from(m: burn_nn::attention::MultiHeadAttention<B>) -> Self {
        Self {
            query: m.query,
            key: m.key,
            value: m.value,
            output: m.output,
            dropout: m.dropout,
            activation: m.activation,
            d_model: m.d_model,
            n_heads: m.n_heads,
            d_k: m.d_k,
            min_float: m.min_float,
            quiet_softmax: m.quiet_softmax,
        }
    }
}

impl<B: Backend> From<MultiHeadAttention<B>> for burn_nn::attention::MultiHeadAttention<B> {
    fn from(m: MultiHeadAttention<B>) -> Self {
        Self {
            query: m.query,
            key: m.key,
            value: m.value,
            output: m.output,
            dropout: m.dropout,
            activation: m.activation,
            d_model: m.d_model,
            n_heads: m.n_heads,
            d_k: m.d_k,
            min_float: m.min_float,
            quiet_softmax: m.quiet_softmax,
        }
    }
}

/// The inputs of [`MultiHeadAttention::forward`] (burn-nn's `MhaInput`, with the same
/// builder).
#[derive(Debug, Clone)]
pub struct MhaInput<B: Backend> {
    query: Tensor<B, 3>,
    key: Tensor<B, 3>,
    value: Tensor<B, 3>,
    mask_pad: Option<Tensor<B, 2, Bool>>,
    mask_attn: Option<Tensor<B, 3, Bool>>,
    /// Made by [`MhaInput::self_attn`]: the query, key and value are one tensor.
    self_attention: bool,
}

impl<B: Backend> MhaInput<B> {
    /// Self-attention: `tensor` `[batch, seq, d_model]` is the query, key and value.
    pub fn self_attn(tensor: Tensor<B, 3>) -> Self {
        Self {
            self_attention: true,
            ..Self::new(tensor.clone(), tensor.clone(), tensor)
        }
    }

    /// Query `[batch, seq_q, d_model]`, key and value `[batch, seq_k, d_model]`.
    pub fn new(query: Tensor<B, 3>, key: Tensor<B, 3>, value: Tensor<B, 3>) -> Self {
        Self {
            query,
            key,
            value,
            mask_pad: None,
            mask_attn: None,
            self_attention: false,
        }
    }

    /// Padding mask `[batch, seq_k]`: true marks a key position no query attends to.
    pub fn mask_pad(mut self, mask_pad: Tensor<B, 2, Bool>) -> Self {
        self.mask_pad = Some(mask_pad);
        self
    }

    /// Attention mask `[batch, seq_q, seq_k]`: true marks a pair not attended (e.g. causal).
    pub fn mask_attn(mut self, mask_attn: Tensor<B, 3, Bool>) -> Self {
        self.mask_attn = Some(mask_attn);
        self
    }
}

/// The result of [`MultiHeadAttention::forward`].
#[derive(Debug, Clone)]
pub struct MhaOutput<B: Backend> {
    /// The attention weights `[batch, heads, seq_q, seq_k]`, when the computation formed them
    /// (burn-nn's path); `None` on MLX's fused attention.
    pub weights: Option<Tensor<B, 4>>,
    /// The context `[batch, seq_q, d_model]`.
    pub context: Tensor<B, 3>,
}

impl<B: Backend> MultiHeadAttention<B> {
    /// Attention of `input`'s queries over its keys and values, projected back to `d_model`.
    pub fn forward(&self, input: MhaInput<B>) -> MhaOutput<B> {
        let dropout_active = B::ad_enabled(&input.query.device()) && self.dropout.prob > 0.0;
        if self.quiet_softmax || dropout_active || !super::custom::fuses::<B>(&input.query.device())
        {
            return self.forward_with_weights(input);
        }
        let [batch, seq_q, d_model] = input.query.dims();
        let [_, seq_k, _] = input.key.dims();
        let pad = input.mask_pad.map(|m| m.reshape([batch, 1, 1, seq_k]));
        let attn = input.mask_attn.map(|m| m.reshape([batch, 1, seq_q, seq_k]));
        let mask = match (pad, attn) {
            (Some(p), Some(a)) => Some(p.expand([batch, 1, seq_q, seq_k]).bool_or(a)),
            (p, a) => p.or(a),
        };
        let scale = 1.0 / (self.d_k as f64).sqrt();
        if input.self_attention {
            let context = self_attention(
                &input.query,
                &self.query,
                &self.key,
                &self.value,
                self.n_heads,
                mask.clone(),
                scale,
                self.min_float,
            );
            if let Some(context) = context {
                return MhaOutput {
                    weights: None,
                    context: self.output.forward(context),
                };
            }
        }
        let q = self.heads(input.query, &self.query);
        let k = self.heads(input.key, &self.key);
        let v = self.heads(input.value, &self.value);
        let context = functional::attention(q, k, v, mask, scale, self.min_float)
            .swap_dims(1, 2)
            .reshape([batch, seq_q, d_model]);
        MhaOutput {
            weights: None,
            context: self.output.forward(context),
        }
    }

    /// burn-nn's computation, which forms the attention weights and returns them.
    pub fn forward_with_weights(&self, input: MhaInput<B>) -> MhaOutput<B> {
        let layer: burn_nn::attention::MultiHeadAttention<B> = self.clone().into();
        let mut nn_input = burn_nn::attention::MhaInput::new(input.query, input.key, input.value);
        if let Some(m) = input.mask_pad {
            nn_input = nn_input.mask_pad(m);
        }
        if let Some(m) = input.mask_attn {
            nn_input = nn_input.mask_attn(m);
        }
        let out = layer.forward(nn_input);
        MhaOutput {
            weights: Some(out.weights),
            context: out.context,
        }
    }

    /// `x` `[batch, seq, d_model]` projected by `linear` and split into heads
    /// `[batch, heads, seq, d_k]`.
    fn heads(&self, x: Tensor<B, 3>, linear: &Linear<B>) -> Tensor<B, 4> {
        let [batch, seq, _] = x.dims();
        linear
            .forward(x)
            .reshape([batch, seq, self.n_heads, self.d_k])
            .swap_dims(1, 2)
    }
}
