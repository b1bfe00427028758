//! The low-level `MlxTensor` API: direct, lazily evaluated MLX work with explicit `eval()`,
//! and moving tensors between Burn's `Tensor<Mlx, D>` and `MlxTensor`.
//!
//! ```text
//! cargo run --release --example low_level
//! ```
//!
//! MLX records operations in a graph and computes nothing until a value is needed. Building
//! `relu(x @ w + b)` below is instantaneous; `eval()` (or reading the data) runs it.

use burn_mlx::{Mlx, MlxDevice, MlxError, MlxTensor};
use burn_tensor::{Tensor, TensorData, TensorPrimitive, Tolerance};
use mlx_rs::ops::indexing::argmax_axis;
use mlx_rs::ops::{matmul, maximum, softmax_axis};
use mlx_rs::Array;
use std::time::Instant;

/// Walks through the low-level API; returns MLX errors instead of panicking.
fn main() -> Result<(), MlxError> {
    let device = MlxDevice::default();
    println!("burn-mlx low-level example on {device:?}\n");

    // 1. From Burn data to an MlxTensor, and back.
    let x = MlxTensor::from_data(
        TensorData::new(vec![1.0f32, -2.0, 3.0, -4.0, 5.0, -6.0], [2, 3]),
        device,
    )?;
    let w = MlxTensor::from_data(
        TensorData::new(vec![0.5f32, -1.0, 1.0, 0.25, -0.5, 2.0], [3, 2]),
        device,
    )?;
    let b = MlxTensor::from_data(TensorData::new(vec![0.1f32, -0.1], [2]), device)?;
    println!("x: {:?} {:?}, w: {:?}", x.dims(), x.mlx_dtype(), w.dims());

    // 2. Build a graph with MLX ops on the wrapped arrays: nothing is computed yet.
    let mlx = |op: &str, e: mlx_rs::error::Exception| MlxError::Mlx {
        op: op.into(),
        message: e.to_string(),
    };
    let zero = Array::from_f32(0.0);
    let hidden = matmul(x.array(), w.array()).map_err(|e| mlx("matmul", e))?;
    let hidden = hidden.add(b.array()).map_err(|e| mlx("add", e))?;
    let hidden = maximum(&hidden, &zero).map_err(|e| mlx("relu", e))?;
    let probs = softmax_axis(&hidden, -1, None).map_err(|e| mlx("softmax", e))?;
    let probs = MlxTensor::from_array(probs, device);

    // 3. Evaluate explicitly, then read the values.
    probs.eval()?;
    let values = probs.to_data()?;
    println!(
        "softmax(relu(x @ w + b)) = {:?}",
        values.to_vec::<f32>().unwrap()
    );
    // The same computation in plain Rust.
    let (xs, ws, bs) = (
        [1.0f32, -2.0, 3.0, -4.0, 5.0, -6.0],
        [0.5f32, -1.0, 1.0, 0.25, -0.5, 2.0],
        [0.1f32, -0.1],
    );
    let mut want = Vec::new();
    for row in 0..2 {
        let h: Vec<f32> = (0..2)
            .map(|col| {
                let dot: f32 = (0..3).map(|k| xs[row * 3 + k] * ws[k * 2 + col]).sum();
                (dot + bs[col]).max(0.0)
            })
            .collect();
        let m = h[0].max(h[1]);
        let z: f32 = h.iter().map(|v| (v - m).exp()).sum();
        want.extend(h.iter().map(|v| (v - m).exp() / z));
    }
    values.assert_approx_eq::<f32>(
        &TensorData::new(want, [2, 2]),
        Tolerance::rel_abs(1e-5, 1e-6),
    );
    println!("matches the same computation in plain Rust");

    // 4. From Burn's Tensor<Mlx, D> to MlxTensor and back, without copying.
    let t = Tensor::<Mlx, 2>::from_floats([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]], &device) * 2.0;
    let raw: MlxTensor = t.into_primitive().tensor();
    let best = argmax_axis(raw.array(), 1, None).map_err(|e| mlx("argmax", e))?;
    let best = MlxTensor::from_array(best, device).to_data()?;
    println!(
        "argmax per row of a Burn tensor, computed by MLX directly: {:?}",
        best.convert::<i64>().to_vec::<i64>().unwrap()
    );
    let back = Tensor::<Mlx, 2>::from_primitive(TensorPrimitive::Float(raw));
    println!("back in Burn: sum = {}", back.sum().into_scalar());

    // 5. Laziness: building a long chain costs almost nothing; eval() does the work.
    let n = 512;
    let a = MlxTensor::from_data(
        TensorData::new(
            (0..n * n)
                .map(|i| ((i % 7) as f32 - 3.0) * 0.01)
                .collect::<Vec<_>>(),
            [n, n],
        ),
        device,
    )?;
    let start = Instant::now();
    let mut acc = a.array().clone();
    for _ in 0..8 {
        acc = matmul(&acc, a.array()).map_err(|e| mlx("matmul", e))?;
    }
    let acc = MlxTensor::from_array(acc, device);
    let built = start.elapsed();
    acc.eval()?;
    let evaluated = start.elapsed();
    println!(
        "8 chained {n}x{n} matmuls: graph built in {:.3} ms, evaluated after {:.1} ms",
        built.as_secs_f64() * 1e3,
        evaluated.as_secs_f64() * 1e3
    );
    let (active, cache) = burn_mlx::memory_stats();
    println!("MLX memory: {active} bytes active, {cache} bytes cached");
    Ok(())
}
