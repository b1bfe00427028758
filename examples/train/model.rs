//! The classifier: a small CNN for 28×28 grayscale images, with burn-train's training and
//! inference steps (logits and cross-entropy loss per batch).

use crate::data::{ImageBatch, SIDE};
use burn::config::Config;
use burn::module::Module;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;
use burn_nn::conv::{Conv2d, Conv2dConfig};
use burn_nn::loss::CrossEntropyLossConfig;
use burn_nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn_nn::{Linear, LinearConfig, PaddingConfig2d, Relu};
use burn_train::{ClassificationOutput, InferenceStep, TrainOutput, TrainStep};

/// Hyper-parameters of [`Cnn`].
#[derive(Config, Debug)]
pub struct CnnConfig {
    /// Output classes.
    #[config(default = 10)]
    pub num_classes: usize,
    /// Channels of the first convolution.
    #[config(default = 16)]
    pub channels1: usize,
    /// Channels of the second convolution.
    #[config(default = 32)]
    pub channels2: usize,
    /// Width of the hidden fully connected layer.
    #[config(default = 64)]
    pub hidden: usize,
}

/// conv3×3 → ReLU → maxpool2 → conv3×3 → ReLU → maxpool2 → linear → ReLU → linear.
#[derive(Module, Debug)]
pub struct Cnn<B: Backend> {
    conv1: Conv2d<B>,
    conv2: Conv2d<B>,
    pool: MaxPool2d,
    fc1: Linear<B>,
    fc2: Linear<B>,
    relu: Relu,
}

impl CnnConfig {
    /// Builds the model with freshly initialized weights.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Cnn<B> {
        let conv = |cin, cout| {
            Conv2dConfig::new([cin, cout], [3, 3])
                .with_padding(PaddingConfig2d::Same)
                .init(device)
        };
        let flat = self.channels2 * (SIDE / 4) * (SIDE / 4);
        Cnn {
            conv1: conv(1, self.channels1),
            conv2: conv(self.channels1, self.channels2),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            fc1: LinearConfig::new(flat, self.hidden).init(device),
            fc2: LinearConfig::new(self.hidden, self.num_classes).init(device),
            relu: Relu::new(),
        }
    }
}

impl<B: Backend> Cnn<B> {
    /// Class logits, `[batch, classes]`, for images `[batch, 1, 28, 28]` with values in [0, 1].
    pub fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = self
            .pool
            .forward(self.relu.forward(self.conv1.forward(images)));
        let x = self.pool.forward(self.relu.forward(self.conv2.forward(x)));
        let x: Tensor<B, 2> = x.flatten(1, 3);
        self.fc2.forward(self.relu.forward(self.fc1.forward(x)))
    }

    /// Logits and cross-entropy loss for a batch.
    pub fn forward_classification(&self, batch: ImageBatch<B>) -> ClassificationOutput<B> {
        let logits = self.forward(batch.images);
        let loss = CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits.clone(), batch.targets.clone());
        ClassificationOutput::new(loss, logits, batch.targets)
    }
}

impl<B: AutodiffBackend> TrainStep for Cnn<B> {
    type Input = ImageBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: ImageBatch<B>) -> TrainOutput<ClassificationOutput<B>> {
        let item = self.forward_classification(batch);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl<B: Backend> InferenceStep for Cnn<B> {
    type Input = ImageBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: ImageBatch<B>) -> ClassificationOutput<B> {
        self.forward_classification(batch)
    }
}
