//! The benchmark models on burn-ndarray: each forward pass gives the shape its callers expect,
//! the decoder batch is well formed, workload selection by name, and one timed MLP training step
//! through the same code `gpu_bench` and `peers/burn-cuda` run.

use burn_autodiff::Autodiff;
use burn_mlx_models::steps::{self, Timer, Workloads};
use burn_mlx_models::{labels, lm, Cnn, Encoder, LmBatch, Mlp};
use burn_ndarray::{NdArray, NdArrayDevice};
use burn_tensor::{Distribution, Tensor};
use std::time::Duration;

type B = NdArray;
const DEVICE: NdArrayDevice = NdArrayDevice::Cpu;

#[test]
fn mlp_maps_input_to_output_width() {
    let model = Mlp::<B>::new(784, 512, 10, &DEVICE);
    let x = Tensor::<B, 2>::random([3, 784], Distribution::Default, &DEVICE);
    assert_eq!(model.forward(x).dims(), [3, 10]);
}

#[test]
fn cnn_gives_ten_logits_per_image() {
    let model = Cnn::<B>::new(&DEVICE);
    let x = Tensor::<B, 4>::random([2, 1, 28, 28], Distribution::Default, &DEVICE);
    assert_eq!(model.forward(x).dims(), [2, 10]);
}

#[test]
fn encoder_keeps_its_input_shape() {
    let model = Encoder::<B>::new(&DEVICE);
    let shape = [2, 4, Encoder::<B>::D_MODEL];
    let x = Tensor::<B, 3>::random(shape, Distribution::Default, &DEVICE);
    assert_eq!(model.forward(x).dims(), shape);
}

#[test]
fn decoder_batch_has_the_lm_shape() {
    let batch = LmBatch::<B>::new(&DEVICE);
    assert_eq!(batch.ids.dims(), [lm::BATCH, lm::SEQ]);
    assert_eq!(batch.targets.dims(), [lm::BATCH * lm::SEQ]);
    assert_eq!(batch.positions.dims(), [1, lm::SEQ]);
    assert_eq!(batch.causal.dims(), [lm::BATCH, lm::SEQ, lm::SEQ]);
    let ids = batch.ids.into_data().to_vec::<i64>().unwrap();
    assert!(ids.iter().all(|&t| (0..lm::VOCAB as i64).contains(&t)));
}

#[test]
fn labels_cycle_through_ten_classes() {
    let v = labels::<B>(12, &DEVICE)
        .into_data()
        .to_vec::<i64>()
        .unwrap();
    assert_eq!(v, [0, 7, 4, 1, 8, 5, 2, 9, 6, 3, 0, 7]);
}

#[test]
fn workloads_are_selected_by_their_first_word() {
    assert_eq!(steps::select(&[]).unwrap(), steps::ALL.to_vec());
    let picked = steps::select(&["CNN".into(), "decoder".into()]).unwrap();
    assert_eq!(picked, vec![steps::CNN, steps::DECODER]);
    let err = steps::select(&["resnet".into()]).unwrap_err();
    assert!(err.contains("resnet"), "{err}");
}

/// `Workloads::run` runs exactly the selected workloads and reports each one's measured time
/// (no speed is asserted: timings belong in `gpu_bench`).
#[test]
fn run_reports_only_the_selected_workload() {
    let workloads = Workloads::<Autodiff<B>>::new(&DEVICE);
    let mut results = Vec::new();
    workloads.run(
        &[steps::MLP],
        &mut Timer {
            warmup: 0,
            budget: Duration::ZERO,
            on_result: |name: &'static str, secs: f64| results.push((name, secs)),
            probe: (),
        },
    );
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].0, steps::MLP);
    assert!(
        results[0].1.is_finite() && results[0].1 > 0.0,
        "{results:?}"
    );
}
