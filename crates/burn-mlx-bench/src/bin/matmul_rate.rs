//! Prints the f32 matmul rate (GFLOP/s) at 1024² and 2048² through raw mlx-rs, through Burn on
//! `Mlx`, and through Burn on NdArray as the reference, in one run.
//!
//! `cargo run --release -p burn-mlx-bench --bin matmul_rate`
use burn_mlx::{Mlx, MlxDevice};
use burn_ndarray::NdArray;
use burn_tensor::{backend::Backend, Distribution, Tensor};
use std::time::Instant;

/// Median seconds of `runs` calls of `f` after one warm-up call.
fn median_secs(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(|a, b| a.total_cmp(b));
    times[times.len() / 2]
}

fn burn_rate<B: Backend>(n: usize, device: &B::Device, runs: usize) -> f64 {
    let a = Tensor::<B, 2>::random([n, n], Distribution::Default, device);
    let b = Tensor::<B, 2>::random([n, n], Distribution::Default, device);
    let secs = median_secs(runs, || {
        // Reading one value forces the whole product to be computed.
        let c = a.clone().matmul(b.clone());
        let _ = c.slice([0..1, 0..1]).into_scalar();
    });
    2.0 * (n as f64).powi(3) / secs / 1e9
}

fn mlx_rs_rate(n: usize, runs: usize) -> f64 {
    let key = mlx_rs::random::key(0).unwrap();
    let shape = [n as i32, n as i32];
    let a = mlx_rs::random::uniform::<_, f32>(0.0f32, 1.0f32, &shape[..], Some(&key)).unwrap();
    let b = mlx_rs::random::uniform::<_, f32>(0.0f32, 1.0f32, &shape[..], Some(&key)).unwrap();
    a.eval().unwrap();
    b.eval().unwrap();
    let secs = median_secs(runs, || {
        let c = a.matmul(&b).unwrap();
        c.eval().unwrap();
    });
    2.0 * (n as f64).powi(3) / secs / 1e9
}

fn main() {
    let device = MlxDevice::Cpu;
    println!("f32 matmul, GFLOP/s (median of 5; higher is better)");
    println!(
        "{:>6} {:>10} {:>10} {:>10} {:>14} {:>14}",
        "n", "mlx-rs", "burn+mlx", "ndarray", "mlx/ndarray", "burn+mlx/mlx-rs"
    );
    for n in [1024usize, 2048] {
        let raw = mlx_rs_rate(n, 5);
        let burn = burn_rate::<Mlx>(n, &device, 5);
        let nd = burn_rate::<NdArray>(n, &Default::default(), if n > 1024 { 2 } else { 5 });
        println!(
            "{n:>6} {raw:>10.1} {burn:>10.1} {nd:>10.1} {:>13.1}x {:>13.2}x",
            raw / nd,
            burn / raw
        );
    }
    // OpenBLAS (the scipy-openblas32 wheel) picks its kernels for the CPU when it loads, unless
    // the environment forces them.
    if let Some(core) = std::env::var_os("OPENBLAS_CORETYPE") {
        println!(
            "(OPENBLAS_CORETYPE={} forces OpenBLAS's kernels; unset it to let OpenBLAS choose)",
            core.to_string_lossy()
        );
    }
}
