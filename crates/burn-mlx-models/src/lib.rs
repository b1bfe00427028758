//! The models of burn-mlx's training-step benchmarks, generic over the Burn backend, so that the
//! same code runs on Burn + `Mlx` (`gpu_bench`, `cargo bench`, `train_distributed`) and on
//! burn-cuda (`peers/burn-cuda`): the MLP, the example CNN, the Transformer encoder and a decoder
//! language model, plus the four training-step workloads built from them ([`steps`]).
//! `scripts/gpu_reference.py` builds the same layers in PyTorch.
//!
//! This crate depends on Burn only (burn-core, burn-nn, burn-optim, burn-tensor), not on
//! burn-mlx, so that another backend's benchmark can use it.

extern crate burn_core as burn;

use burn::module::Module;
use burn_nn::attention::generate_autoregressive_mask;
use burn_nn::conv::{Conv2d, Conv2dConfig};
use burn_nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn_nn::transformer::{TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput};
use burn_nn::{
    Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig, PaddingConfig2d,
    Relu,
};
use burn_tensor::backend::Backend;
use burn_tensor::{Bool, Int, Tensor, TensorData};

mod mlp_encoder;
pub mod steps;

/// The MLP (784 → 512 → 512 → 10 in the benchmarks; `train_distributed` picks its own sizes) and
/// the Transformer encoder (d_model 256, 8 heads, 2 post-norm layers, feed-forward 1024, GELU, no
/// dropout) of `gpu_bench`, `cargo bench` and `train_distributed`.
pub use mlp_encoder::{Encoder, Mlp};

/// The CNN of the `train` example (`examples/train/model.rs`, at its default sizes): two 3×3 conv + ReLU + 2×2 max-pool stages, then
/// two linear layers.
#[derive(Module, Debug)]
pub struct Cnn<B: Backend> {
    conv1: Conv2d<B>,
    conv2: Conv2d<B>,
    pool: MaxPool2d,
    fc1: Linear<B>,
    fc2: Linear<B>,
    relu: Relu,
}

impl<B: Backend> Cnn<B> {
    /// A freshly initialized CNN on `device`.
    pub fn new(device: &B::Device) -> Self {
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

    /// Logits `[batch, 10]` of images `[batch, 1, 28, 28]`.
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = self.pool.forward(self.relu.forward(self.conv1.forward(x)));
        let x = self.pool.forward(self.relu.forward(self.conv2.forward(x)));
        let x: Tensor<B, 2> = x.flatten(1, 3);
        self.fc2.forward(self.relu.forward(self.fc1.forward(x)))
    }
}

/// Shape of the decoder language model of the fourth workload (29.5M parameters).
pub mod lm {
    /// Vocabulary size.
    pub const VOCAB: usize = 10_240;
    /// Width of the residual stream.
    pub const D_MODEL: usize = 512;
    /// Attention heads per layer.
    pub const HEADS: usize = 8;
    /// Decoder layers.
    pub const LAYERS: usize = 6;
    /// Feed-forward width.
    pub const D_FF: usize = 2048;
    /// Positions per sequence (also the number of learned position embeddings).
    pub const SEQ: usize = 256;
    /// Sequences per training step.
    pub const BATCH: usize = 8;
}

/// A GPT-style causal decoder language model: token and learned position embeddings,
/// [`lm::LAYERS`] pre-norm Transformer layers under a causal mask (GELU, no dropout), a final
/// LayerNorm and an untied output projection to the vocabulary.
#[derive(Module, Debug)]
pub struct DecoderLm<B: Backend> {
    tokens: Embedding<B>,
    positions: Embedding<B>,
    layers: TransformerEncoder<B>,
    norm: LayerNorm<B>,
    head: Linear<B>,
}

impl<B: Backend> DecoderLm<B> {
    /// A freshly initialized model of the [`lm`] shape on `device`.
    pub fn new(device: &B::Device) -> Self {
        Self {
            tokens: EmbeddingConfig::new(lm::VOCAB, lm::D_MODEL).init(device),
            positions: EmbeddingConfig::new(lm::SEQ, lm::D_MODEL).init(device),
            layers: TransformerEncoderConfig::new(lm::D_MODEL, lm::D_FF, lm::HEADS, lm::LAYERS)
                .with_dropout(0.0)
                .with_norm_first(true)
                .init(device),
            norm: LayerNormConfig::new(lm::D_MODEL).init(device),
            head: LinearConfig::new(lm::D_MODEL, lm::VOCAB).init(device),
        }
    }

    /// Next-token logits `[batch, seq, vocab]` of `input`'s token ids `[batch, seq]`.
    pub fn forward(&self, input: &LmBatch<B>) -> Tensor<B, 3> {
        let x = self.tokens.forward(input.ids.clone())
            + self.positions.forward(input.positions.clone());
        let x = self
            .layers
            .forward(TransformerEncoderInput::new(x).mask_attn(input.causal.clone()));
        self.head.forward(self.norm.forward(x))
    }
}

/// One batch of the decoder workload: token ids, the ids they should predict, position ids
/// and the causal mask.
#[derive(Clone, Debug)]
pub struct LmBatch<B: Backend> {
    /// Input token ids `[batch, seq]`.
    pub ids: Tensor<B, 2, Int>,
    /// Target token ids, flattened `[batch * seq]`.
    pub targets: Tensor<B, 1, Int>,
    /// Position ids `[1, seq]`: 0, 1, …
    pub positions: Tensor<B, 2, Int>,
    /// Causal mask `[batch, seq, seq]` (true = masked).
    pub causal: Tensor<B, 3, Bool>,
}

impl<B: Backend> LmBatch<B> {
    /// A fixed pseudo-random batch of the [`lm`] shape on `device`.
    pub fn new(device: &B::Device) -> Self {
        let n = lm::BATCH * lm::SEQ;
        let ids: Vec<i64> = (0..n).map(|i| (i * 7_919 % lm::VOCAB) as i64).collect();
        let targets: Vec<i64> = (0..n).map(|i| ((i * 31 + 7) % lm::VOCAB) as i64).collect();
        let positions: Vec<i64> = (0..lm::SEQ as i64).collect();
        Self {
            ids: Tensor::from_data(TensorData::new(ids, [lm::BATCH, lm::SEQ]), device),
            targets: Tensor::from_data(TensorData::new(targets, [n]), device),
            positions: Tensor::from_data(TensorData::new(positions, [1, lm::SEQ]), device),
            causal: generate_autoregressive_mask(lm::BATCH, lm::SEQ, device),
        }
    }
}

/// Class labels 0..10 for a batch of `n`, the same as `scripts/gpu_reference.py`'s.
pub fn labels<B: Backend>(n: usize, device: &B::Device) -> Tensor<B, 1, Int> {
    let v: Vec<i64> = (0..n).map(|i| (i * 7 % 10) as i64).collect();
    Tensor::from_data(TensorData::new(v, [n]), device)
}
