//! The MLP (`input → hidden → hidden → output` with ReLU), which `train_distributed` trains and
//! burn-mlx-distributed's tests check for parity, and the Transformer encoder of the GPU
//! benchmark's Transformer step.

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use burn_nn::transformer::{TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput};
use burn_nn::{Linear, LinearConfig, Relu};

/// `input → hidden → hidden → output`, ReLU between the layers.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    l1: Linear<B>,
    l2: Linear<B>,
    l3: Linear<B>,
    relu: Relu,
}

impl<B: Backend> Mlp<B> {
    /// A freshly initialised MLP on `device`.
    pub fn new(input: usize, hidden: usize, output: usize, device: &B::Device) -> Self {
        Self {
            l1: LinearConfig::new(input, hidden).init(device),
            l2: LinearConfig::new(hidden, hidden).init(device),
            l3: LinearConfig::new(hidden, output).init(device),
            relu: Relu::new(),
        }
    }

    /// `[batch, input]` → `[batch, output]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let x = self.relu.forward(self.l1.forward(x));
        let x = self.relu.forward(self.l2.forward(x));
        self.l3.forward(x)
    }
}

/// The Transformer encoder of `gpu_bench`'s Transformer step (and of `cargo bench`'s): d_model
/// 256, 8 heads, 2 layers, feed-forward 1024, no dropout, regressing a random target
/// (`torch_ddp.py` builds PyTorch's `nn.TransformerEncoder` of the same shape).
#[derive(Module, Debug)]
pub struct Encoder<B: Backend> {
    encoder: TransformerEncoder<B>,
}

impl<B: Backend> Encoder<B> {
    /// Model width (`d_model`), and the feature size of each position of the input.
    pub const D_MODEL: usize = 256;
    /// Positions per sequence.
    pub const SEQ: usize = 128;

    /// A freshly initialised encoder on `device`.
    pub fn new(device: &B::Device) -> Self {
        Self {
            encoder: TransformerEncoderConfig::new(Self::D_MODEL, 1024, 8, 2)
                .with_dropout(0.0)
                .init(device),
        }
    }

    /// `[batch, SEQ, D_MODEL]` → the same shape.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.encoder.forward(TransformerEncoderInput::new(x))
    }
}
