//! The small MLP that `train_distributed` trains and `tests/distributed.rs` checks for parity:
//! `input → hidden → hidden → output` with ReLU.

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
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
