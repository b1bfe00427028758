//! Inference with a two-layer MLP and softmax on the MLX backend.
//!
//! ```text
//! cargo run --release --example inference
//! ```
//!
//! Builds the model on `Mlx`, classifies a batch, then moves the weights to burn-ndarray through
//! a record (records are backend-neutral) and checks that both backends agree. Finally it times
//! batched inference.

extern crate burn_core as burn;

use burn::module::Module;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor, Tolerance};
use burn_mlx::{Mlx, MlxDevice};
use burn_ndarray::{NdArray, NdArrayDevice};
use burn_nn::{Linear, LinearConfig, Relu};
use std::time::Instant;

/// input → linear → ReLU → linear → class logits.
#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    hidden: Linear<B>,
    output: Linear<B>,
    relu: Relu,
}

impl<B: Backend> Mlp<B> {
    /// A freshly initialized `inputs → hidden → classes` network.
    fn new(inputs: usize, hidden: usize, classes: usize, device: &B::Device) -> Self {
        Self {
            hidden: LinearConfig::new(inputs, hidden).init(device),
            output: LinearConfig::new(hidden, classes).init(device),
            relu: Relu::new(),
        }
    }

    /// Class probabilities, `[batch, classes]`.
    fn predict(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let logits = self
            .output
            .forward(self.relu.forward(self.hidden.forward(x)));
        softmax(logits, 1)
    }
}

/// Input features.
const INPUTS: usize = 16;
/// Hidden layer width.
const HIDDEN: usize = 64;
/// Output classes.
const CLASSES: usize = 4;

/// Predicts on `Mlx`, cross-checks against `NdArray`, then times batched inference.
fn main() {
    let device = MlxDevice::default();
    println!("burn-mlx inference example on {device:?}");
    Mlx::seed(&device, 7);
    let model = Mlp::<Mlx>::new(INPUTS, HIDDEN, CLASSES, &device);
    println!("model: {} parameters\n{model}", model.num_params());

    let batch = Tensor::<Mlx, 2>::random([5, INPUTS], Distribution::Normal(0.0, 1.0), &device);
    let probs = model.predict(batch.clone());
    let classes = probs.clone().argmax(1);
    let rows = probs.to_data().to_vec::<f32>().expect("f32 probabilities");
    let classes = classes
        .to_data()
        .convert::<i64>()
        .to_vec::<i64>()
        .expect("classes");
    println!("\nclass probabilities:");
    for (i, (p, c)) in rows.chunks(CLASSES).zip(&classes).enumerate() {
        let sum: f32 = p.iter().sum();
        println!("  sample {i}: {p:.3?} -> class {c} (sum {sum:.4})");
        assert!((sum - 1.0).abs() < 1e-5, "softmax rows must sum to 1");
    }

    // Same weights on burn-ndarray, through an in-memory record.
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = recorder
        .record(model.clone().into_record(), ())
        .expect("record the MLX model");
    let nd_device = NdArrayDevice::Cpu;
    let record = BinBytesRecorder::<FullPrecisionSettings>::default()
        .load(bytes.clone(), &nd_device)
        .expect("load the record on NdArray");
    let nd_model = Mlp::<NdArray>::new(INPUTS, HIDDEN, CLASSES, &nd_device).load_record(record);
    let nd_batch = Tensor::<NdArray, 2>::from_data(batch.to_data(), &nd_device);
    let nd_probs = nd_model.predict(nd_batch);
    nd_probs.to_data().assert_approx_eq::<f32>(
        &model.predict(batch).to_data(),
        Tolerance::rel_abs(1e-4, 1e-6),
    );
    println!(
        "\nrecord: {} bytes; NdArray with the same record gives the same probabilities",
        bytes.len()
    );

    // Batched throughput.
    let big = Tensor::<Mlx, 2>::random([4096, INPUTS], Distribution::Normal(0.0, 1.0), &device);
    let _ = model.predict(big.clone()).into_data(); // warm-up
    let runs = 20;
    let start = Instant::now();
    for _ in 0..runs {
        let _ = model.predict(big.clone()).argmax(1).into_data();
    }
    let secs = start.elapsed().as_secs_f64() / runs as f64;
    println!(
        "batch of 4096: {:.2} ms per forward pass ({:.0} samples/s)",
        secs * 1e3,
        4096.0 / secs
    );
}
