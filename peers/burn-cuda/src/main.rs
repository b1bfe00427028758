//! The training steps of burn-mlx's `gpu_bench` (MLP, CNN, Transformer encoder, decoder LM)
//! on burn-cuda 0.21, Burn's own CUDA backend with its fusion (`burn_cuda::Cuda` with default
//! features), through the same model code (burn-mlx-models).
//!
//! ```text
//! cd peers/burn-cuda
//! CUDARC_CUDA_VERSION=13000 cargo build --release    # no CUDA toolkit needed to build
//! ./target/release/burn-cuda-peer --json burn-cuda.json
//! python3 ../../scripts/gpu_reference.py burn-mlx.json burn-cuda.json
//! ```
//!
//! At run time it needs the NVIDIA driver and NVRTC (CUDA 13), found by the dynamic loader
//! (`LD_LIBRARY_PATH`). f32 matmuls on tensor cores run in TF32 (cubek-matmul stages f32
//! operands as tf32 where the device supports it), as MLX's do by default.

use burn_autodiff::Autodiff;
use burn_cuda::{Cuda, CudaDevice};
use burn_mlx_models::steps::{self, Timer, Workloads};
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

/// The four training steps of `gpu_bench` on burn-cuda (median ms per step).
#[derive(Debug, Parser)]
#[command(name = "burn-cuda-peer")]
struct Args {
    /// Also write the numbers as JSON to FILE (for `scripts/gpu_reference.py`).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Time budget of each workload's timed steps, in seconds.
    #[arg(long, default_value_t = 2.0)]
    budget: f64,
    /// Only these workloads (by the first word of their name: mlp, cnn, transformer, decoder).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// CUDA device index.
    #[arg(long, default_value_t = 0)]
    device: usize,
}

fn main() {
    let args = Args::parse();
    let device = CudaDevice::new(args.device);
    let only = steps::select(&args.only).unwrap_or_else(|e| {
        eprintln!("burn-cuda-peer: --only: {e}");
        std::process::exit(2);
    });
    // burn-cuda panics when no driver or device is there; say so in one line instead.
    let workloads = std::panic::catch_unwind(|| Workloads::<Autodiff<Cuda>>::new(&device))
        .unwrap_or_else(|_| {
            eprintln!(
                "burn-cuda-peer: burn-cuda could not start on CUDA device {} (see the panic \
                 above): it needs an NVIDIA GPU, its driver and NVRTC on LD_LIBRARY_PATH",
                args.device
            );
            std::process::exit(1);
        });
    let mut lines: Vec<(&'static str, f64)> = Vec::new();
    let mut timer = Timer {
        warmup: steps::STEP_WARMUP,
        budget: Duration::from_secs_f64(args.budget),
        on_result: |name: &'static str, secs: f64| {
            println!("{name:<28} {:<16} {:>10.3} ms", "burn-cuda", secs * 1e3);
            lines.push((name, secs));
        },
        probe: (),
    };
    workloads.run(&only, &mut timer);
    if let Some(path) = args.json {
        let body: Vec<String> = lines
            .iter()
            .map(|(name, secs)| {
                format!(
                    "  {{\"workload\": \"{name}\", \"impl\": \"burn-cuda\", \"secs\": {secs:e}}}"
                )
            })
            .collect();
        if let Err(e) = std::fs::write(&path, format!("[\n{}\n]\n", body.join(",\n"))) {
            eprintln!("burn-cuda-peer: cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}
