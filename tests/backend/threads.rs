//! Tensors shared between threads: the `Send + Sync` argument of `MlxTensor` under load.
//!
//! Eight threads each run a chain of mixed ops on tensors created on the main thread (shared by
//! reference and by clone), evaluate and read them, and drop them; every result is compared with
//! the same chain run on one thread.
use burn_mlx::{Mlx, MlxDevice};
use burn_tensor::{activation, Int, Tensor, TensorData};
use std::sync::Arc;

const THREADS: usize = 8;
const STEPS: usize = 125; // 8 ops a step: 8 threads x 1,000 ops

fn chain(
    a: &Tensor<Mlx, 2>,
    b: &Tensor<Mlx, 2>,
    idx: &Tensor<Mlx, 1, Int>,
    seed: usize,
) -> TensorData {
    let mut x = a.clone();
    for step in 0..STEPS {
        let k = ((seed + step) % 7) as f32 * 0.1;
        x = x.matmul(b.clone()) * 0.05; // 1
        x = x.add_scalar(k); // 2
        x = activation::relu(x.clone()) - x.clone().exp().mul_scalar(1e-3); // 3, 4
        x = x.select(0, idx.clone()); // 5
        x = activation::softmax(x, 1) + a.clone(); // 6, 7
        if step % 25 == 0 {
            // A read in the middle: evaluation from many threads at once.
            let _ = x.clone().sum().into_scalar();
        }
        x = x.clamp(-10.0, 10.0); // 8
    }
    x.into_data()
}

#[test]
fn eight_threads_share_tensors_and_match_one_thread() {
    let device = MlxDevice::Cpu;
    let a = Tensor::<Mlx, 2>::random([16, 16], burn_tensor::Distribution::Default, &device);
    let b = Tensor::<Mlx, 2>::random([16, 16], burn_tensor::Distribution::Default, &device);
    let idx = Tensor::<Mlx, 1, Int>::from_data(
        [15i64, 3, 2, 1, 0, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 4],
        &device,
    );
    let expected: Vec<TensorData> = (0..THREADS).map(|s| chain(&a, &b, &idx, s)).collect();

    let shared = Arc::new((a, b, idx));
    let handles: Vec<_> = (0..THREADS)
        .map(|s| {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || {
                let (a, b, idx) = &*shared;
                chain(a, b, idx, s)
            })
        })
        .collect();
    for (s, h) in handles.into_iter().enumerate() {
        let got = h.join().expect("thread panicked");
        got.assert_approx_eq::<f32>(&expected[s], burn_tensor::Tolerance::default());
    }
}

#[test]
fn tensors_move_between_threads() {
    let device = MlxDevice::Cpu;
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            std::thread::spawn(move || {
                Tensor::<Mlx, 1>::from_data([i as f32, 1.0, 2.0], &device) * 2.0
            })
        })
        .collect();
    let tensors: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let total = Tensor::cat(tensors, 0).sum().into_scalar();
    let expect: f32 = (0..THREADS).map(|i| 2.0 * (i as f32 + 3.0)).sum();
    assert_eq!(total, expect);
}
