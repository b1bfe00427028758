//! Convolution and pooling on the MLX backend: a hand-set edge detector, then a small
//! conv2d + maxpool2d feature extractor built from burn-nn modules.
//!
//! ```text
//! cargo run --release --example conv
//! ```
//!
//! Burn tensors are NCHW with OIHW weights; burn-mlx converts to MLX's channels-last layout
//! inside the ops, so nothing changes for Burn code.

extern crate burn_core as burn;

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::module::{conv2d, max_pool2d};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Distribution, Tensor, TensorData, Tolerance};
use burn_mlx::{Mlx, MlxDevice};
use burn_nn::conv::{Conv2d, Conv2dConfig};
use burn_nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn_nn::{PaddingConfig2d, Relu};
use std::time::Instant;

/// Two conv3×3 → ReLU → maxpool2 stages: `[n, 3, H, W]` → `[n, 32, H/4, W/4]`.
#[derive(Module, Debug)]
struct FeatureExtractor<B: Backend> {
    conv1: Conv2d<B>,
    conv2: Conv2d<B>,
    pool: MaxPool2d,
    relu: Relu,
}

impl<B: Backend> FeatureExtractor<B> {
    /// A freshly initialized extractor for 3-channel images.
    fn new(device: &B::Device) -> Self {
        let conv = |cin, cout| {
            Conv2dConfig::new([cin, cout], [3, 3])
                .with_padding(PaddingConfig2d::Same)
                .init(device)
        };
        Self {
            conv1: conv(3, 16),
            conv2: conv(16, 32),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            relu: Relu::new(),
        }
    }

    /// Feature maps `[n, 32, H/4, W/4]` for images `[n, 3, H, W]`.
    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let x = self.pool.forward(self.relu.forward(self.conv1.forward(x)));
        self.pool.forward(self.relu.forward(self.conv2.forward(x)))
    }
}

/// Runs both demonstrations on `Mlx`.
fn main() {
    let device = MlxDevice::default();
    println!("burn-mlx conv example on {device:?}\n");
    edge_detector::<Mlx>(&device);
    feature_extractor::<Mlx>(&device);
}

/// A horizontal Sobel filter finds the vertical edges of a bright square; max pooling keeps
/// the strongest response of each 2×2 window.
fn edge_detector<B: Backend>(device: &B::Device) {
    // 8×8 image: a bright 4×4 square at rows/columns 2..6.
    let mut pixels = vec![0.0f32; 64];
    for y in 2..6 {
        for x in 2..6 {
            pixels[y * 8 + x] = 1.0;
        }
    }
    let image = Tensor::<B, 4>::from_data(TensorData::new(pixels, [1, 1, 8, 8]), device);
    let sobel_x = Tensor::<B, 4>::from_data(
        TensorData::new(
            vec![-1.0f32, 0., 1., -2., 0., 2., -1., 0., 1.],
            [1, 1, 3, 3],
        ),
        device,
    );
    let edges = conv2d(
        image,
        sobel_x,
        None,
        ConvOptions::new([1, 1], [1, 1], [1, 1], 1),
    );
    let values = edges.to_data().to_vec::<f32>().expect("f32 edges");
    println!("Sobel-x response of an 8×8 image holding a bright square:");
    for row in values.chunks(8) {
        let line: Vec<String> = row.iter().map(|v| format!("{v:4.0}")).collect();
        println!("  {}", line.join(""));
    }
    // Left edge (columns 1..2) is +, right edge (columns 5..6) is −, the inside is 0.
    assert_eq!(values[3 * 8 + 1], 4.0);
    assert_eq!(values[3 * 8 + 2], 4.0);
    assert_eq!(values[3 * 8 + 5], -4.0);
    assert_eq!(values[3 * 8 + 3], 0.0);

    let pooled = max_pool2d(edges.abs(), [2, 2], [2, 2], [0, 0], [1, 1], false);
    println!("|response| after 2×2 max pooling: dims {:?}", pooled.dims());
    pooled.to_data().assert_approx_eq::<f32>(
        &TensorData::from([[[
            [1.0f32, 1., 1., 1.],
            [4., 4., 4., 4.],
            [4., 4., 4., 4.],
            [1., 1., 1., 1.],
        ]]]),
        Tolerance::rel_abs(1e-6, 1e-6),
    );
    println!("{}\n", pooled.squeeze_dims::<2>(&[0, 1]));
}

/// Random images through a small CNN trunk: output shape, statistics and timing.
fn feature_extractor<B: Backend>(device: &B::Device) {
    B::seed(device, 3);
    let model = FeatureExtractor::<B>::new(device);
    println!(
        "feature extractor ({} parameters):\n{model}",
        model.num_params()
    );
    let images = Tensor::<B, 4>::random([16, 3, 64, 64], Distribution::Uniform(0.0, 1.0), device);
    let features = model.forward(images.clone());
    assert_eq!(features.dims(), [16, 32, 16, 16]);
    let min = features.clone().min().into_scalar();
    let mean = features.clone().mean().into_scalar();
    let active = features
        .clone()
        .greater_elem(0.0)
        .float()
        .mean()
        .into_scalar();
    println!(
        "input {:?} -> features {:?}: min {:.4}, mean {:.4}, {:.1}% active",
        images.dims(),
        features.dims(),
        num(min),
        num(mean),
        100.0 * num(active)
    );
    assert!(num(min) >= 0.0, "ReLU then max pooling cannot be negative");

    // Flattened embedding per image, e.g. for a classifier head.
    let embedding: Tensor<B, 2> = features.flatten(1, 3);
    println!("flattened embedding: {:?}", embedding.dims());

    let runs = 10;
    let start = Instant::now();
    for _ in 0..runs {
        let _ = model.forward(images.clone()).sum().into_data();
    }
    let ms = start.elapsed().as_secs_f64() * 1e3 / runs as f64;
    println!("forward pass of 16×3×64×64: {ms:.2} ms");
}

/// Reads an element as f64.
fn num<E: burn::tensor::ElementConversion>(value: E) -> f64 {
    value.elem::<f64>()
}
