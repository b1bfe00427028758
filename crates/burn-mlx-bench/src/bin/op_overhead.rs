//! Per-op overhead of the Burn → mlx-rs path: a chain of 100 small elementwise ops on
//! `Tensor<Mlx, 2>` against the same chain in raw mlx-rs, in one run.
//!
//! `cargo run --release -p burn-mlx-bench --bin op_overhead`
use burn_mlx::{Mlx, MlxDevice};
use burn_tensor::{Distribution, Tensor};
use mlx_rs::Array;
use std::time::Instant;

const OPS: usize = 100;
const REPS: usize = 200;

fn median_micros(mut f: impl FnMut()) -> f64 {
    for _ in 0..10 {
        f();
    }
    let mut t: Vec<f64> = (0..REPS)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    t[t.len() / 2]
}

fn main() {
    let device = MlxDevice::Cpu;
    for n in [16usize, 1024] {
        // Random (not `ones`): MLX stores a filled tensor as one broadcast value, and elementwise
        // ops on it compute a single element, which would not be the same work as below.
        let x = Tensor::<Mlx, 2>::random([n, n], Distribution::Default, &device);
        let burn = median_micros(|| {
            let mut y = x.clone();
            for i in 0..OPS / 4 {
                y = (y * 0.5 + 1.0).exp() - (i as f32) * 1e-3;
            }
            let _ = Mlx::sync_all(&y);
        });
        let a = mlx_rs::random::uniform::<_, f32>(0.0f32, 1.0f32, &[n as i32, n as i32][..], None)
            .unwrap();
        a.eval().unwrap();
        let raw = median_micros(|| {
            let mut y = a.clone();
            for i in 0..OPS / 4 {
                y = y
                    .multiply(Array::from_f32(0.5))
                    .unwrap()
                    .add(Array::from_f32(1.0))
                    .unwrap()
                    .exp()
                    .unwrap()
                    .subtract(Array::from_f32(i as f32 * 1e-3))
                    .unwrap();
            }
            y.eval().unwrap();
        });
        println!(
            "{n}x{n}, chain of {OPS} elementwise ops + eval: burn+mlx {burn:.0} us, raw mlx-rs {raw:.0} us, ratio {:.2}x",
            burn / raw
        );
    }
}

/// Evaluates a Burn tensor's graph without reading it back.
trait SyncAll {
    fn sync_all(t: &Tensor<Mlx, 2>) -> Result<(), burn_mlx::MlxError>;
}

impl SyncAll for Mlx {
    fn sync_all(t: &Tensor<Mlx, 2>) -> Result<(), burn_mlx::MlxError> {
        t.clone().into_primitive().tensor().eval()
    }
}
