//! Memory stability: long training runs must not leak, and `Backend::memory_cleanup` must hand
//! MLX's cached buffers back.
//!
//! `training_memory_is_stable` trains the 784-512-512-10 MLP with `Autodiff<Mlx>` + Adam, reads
//! the resident set size from `/proc/self/statm` after a warm-up and at the end, and requires the
//! growth to stay under 5 %. It runs 500 steps by default; `BURN_MLX_MEMORY_STEPS=10000` runs a
//! long soak.

use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor};
use burn_autodiff::Autodiff;
use burn_mlx::{memory_stats, Mlx, MlxDevice};
use burn_mlx_models::Mlp;
use burn_nn::loss::CrossEntropyLossConfig;
use burn_optim::{AdamConfig, GradientsParams, Optimizer};

type B = Autodiff<Mlx>;
const CPU: MlxDevice = MlxDevice::Cpu;

/// The resident set size of this process, in bytes (Linux).
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[test]
fn training_memory_is_stable() {
    let _serial = crate::one_at_a_time();
    let steps: usize = std::env::var("BURN_MLX_MEMORY_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let warmup = (steps / 10).clamp(50, 1000);
    let batch = 16;
    let trace = std::env::var_os("BURN_MLX_MEMORY_TRACE").is_some();
    let Some(_) = rss_bytes() else {
        eprintln!("no /proc/self/statm: skipped");
        return;
    };

    <B as Backend>::seed(&CPU, 7);
    // 784 → 512 → ReLU → 512 → ReLU → 10, the MNIST-sized MLP of the benchmarks.
    let mut model = Mlp::<B>::new(784, 512, 10, &CPU);
    let mut optim = AdamConfig::new().init();
    let loss_fn = CrossEntropyLossConfig::new().init(&CPU);
    let mut checkpoint = 0u64;
    let mut first_loss = f32::NAN;
    let mut last_loss = f32::NAN;
    let start = std::time::Instant::now();
    for step in 0..steps {
        let x = Tensor::<B, 2>::random([batch, 784], Distribution::Uniform(0.0, 1.0), &CPU);
        // Labels that depend on the input, so the loss can go down.
        let y = x
            .clone()
            .inner()
            .slice([0..batch, 0..10])
            .argmax(1)
            .reshape([batch]);
        let y = Tensor::<B, 1, Int>::from_inner(y);
        let loss = loss_fn.forward(model.forward(x), y);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model, grads);
        // Reading the loss evaluates the step (as a training loop that logs it does).
        let l = loss.into_scalar();
        if step == 0 {
            first_loss = l;
        }
        last_loss = l;
        if trace && step % 100 == 0 {
            let (active, cache) = memory_stats();
            eprintln!(
                "step {step}: RSS {:.1} MiB, MLX active {:.1} MiB, cache {:.1} MiB",
                rss_bytes().unwrap() as f64 / 1048576.0,
                active as f64 / 1048576.0,
                cache as f64 / 1048576.0
            );
        }
        if step + 1 == warmup {
            checkpoint = rss_bytes().unwrap();
        }
    }
    let end = rss_bytes().unwrap();
    let growth = (end as f64 - checkpoint as f64) / checkpoint as f64 * 100.0;
    let (active, cache) = memory_stats();
    eprintln!(
        "memory: {steps} steps in {:.1} s, RSS after {warmup} warm-up steps {:.1} MiB, at the end \
         {:.1} MiB: growth {growth:+.2} %; MLX active {:.1} MiB, cache {:.1} MiB; loss {first_loss} \
         -> {last_loss}",
        start.elapsed().as_secs_f64(),
        checkpoint as f64 / 1048576.0,
        end as f64 / 1048576.0,
        active as f64 / 1048576.0,
        cache as f64 / 1048576.0,
    );
    assert!(last_loss.is_finite(), "the loss diverged: {last_loss}");
    assert!(
        growth < 5.0,
        "resident memory grew by {growth:.2} % between step {warmup} and step {steps}"
    );
}

#[test]
fn memory_cleanup_frees_the_cache() {
    let _serial = crate::one_at_a_time();
    // Build and evaluate some large intermediates, then drop everything.
    {
        let a = Tensor::<Mlx, 2>::random([512, 512], Distribution::Default, &CPU);
        let mut x = a.clone();
        for _ in 0..8 {
            x = (x.matmul(a.clone()) * 1e-3).tanh();
        }
        let _ = x.into_data();
    }
    let (active_before, cache_before) = memory_stats();
    assert!(
        cache_before > 0,
        "MLX kept no cached buffers (active {active_before}): nothing to test"
    );
    Mlx::memory_cleanup(&CPU);
    let (active_after, cache_after) = memory_stats();
    assert_eq!(
        cache_after, 0,
        "memory_cleanup left {cache_after} bytes cached (was {cache_before})"
    );
    assert!(active_after <= active_before);
    // The backend keeps working, and the cache refills on use.
    let v: Vec<f32> = (Tensor::<Mlx, 1>::ones([4], &CPU) * 2.0)
        .into_data()
        .to_vec()
        .unwrap();
    assert_eq!(v, vec![2.0; 4]);
}

/// `peak_memory` sees the arrays that live only inside an evaluation: here a 16 MiB product
/// reduced to one number, which memory sampled before and after the evaluation never shows.
#[test]
fn peak_memory_sees_transient_arrays() {
    let _guard = crate::one_at_a_time();
    // Random values: MLX keeps a product of constants (`ones`) as one broadcast element.
    let a = Tensor::<Mlx, 2>::random([2048, 1], Distribution::Uniform(1.0, 2.0), &CPU);
    let b = Tensor::<Mlx, 2>::random([1, 2048], Distribution::Uniform(1.0, 2.0), &CPU);
    let _ = (a.clone() + b.clone()).sum().into_data(); // materializes a and b
    burn_mlx::reset_peak_memory();
    let (active_before, _) = memory_stats();
    let start = burn_mlx::peak_memory();
    let total: f32 = (a * b).sum().into_scalar();
    assert!(total > (2048 * 2048) as f32, "sum {total}");
    let peak = burn_mlx::peak_memory();
    let (active_after, _) = memory_stats();
    let product = 2048 * 2048 * 4;
    assert!(
        peak >= start + product,
        "peak {peak} B after reset at {start} B: the 16 MiB product was not counted"
    );
    assert!(
        active_after < active_before + product,
        "the product outlived its evaluation (active {active_before} -> {active_after} B)"
    );
}
