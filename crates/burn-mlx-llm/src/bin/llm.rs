//! Text generation with a Llama- or Qwen3-family model in Burn, on the MLX backend (or Burn's
//! CPU backends through the same model code).
//!
//! ```text
//! cargo run --release -p burn-mlx-llm --bin llm -- --model DIR --prompt "The capital of France is"
//! cargo run --release -p burn-mlx-llm --bin llm -- --model DIR --prompt-ids 1,450,7483 --max-tokens 32
//! cargo run --release -p burn-mlx-llm --bin llm -- --model DIR --prompt "..." --temp 0.7 --top-p 0.9 --seed 1
//! cargo run --release -p burn-mlx-llm --bin llm -- --model DIR --prompt "Paris is" --prompt "Rome is"
//! cargo run --release -p burn-mlx-llm --bin llm -- --bench --preset qwen3-0.6b --dtype bf16 --batch 16
//! cargo run --release -p burn-mlx-llm --bin llm -- --bench --preset qwen3-0.6b --dtype bf16
//! cargo run --release -p burn-mlx-llm --bin llm -- --bench --preset small --backend ndarray
//! cargo run --release -p burn-mlx-llm --bin llm -- --bench --preset small --quantize q4
//! cargo run --release -p burn-mlx-llm --bin llm -- --model DIR --export step.mlxfn --max-context 512
//! ```
//!
//! `DIR` is a Hugging Face model folder: `config.json`, `model.safetensors` (or shards with
//! `model.safetensors.index.json`) and, for `--prompt`, `tokenizer.json`. Tokens are printed as
//! they are generated, then one summary line (prompt and generated tokens, time to first token,
//! prefill and decode tokens/s, peak memory). `--bench` builds a preset shape with random weights
//! instead, needs no files, and prints the same line after a warm-up run of the same length.
//! `--quantize q8|q4` quantizes the weight matrices (groups of 64) into MLX's affine format and
//! multiplies through MLX's quantized matmul (see `Llm::quantize` and `burn_mlx::quant`).

// burn-candle 0.21 is marked deprecated upstream; issue 22 still asks for it as a CPU peer.
#[allow(deprecated)]
use burn_candle::{Candle, CandleDevice};
use burn_flex::{Flex, FlexDevice};
use burn_mlx::decode::greedy_tokens;
use burn_mlx::quant::QuantBits;
use burn_mlx::Mlx;
use burn_mlx_llm::cli::{DTypeArg, DeviceArg, QuantizeArg};
use burn_mlx_llm::config::{LlmConfig, PRESETS};
use burn_mlx_llm::error::{LlmError, Result};
use burn_mlx_llm::export::export_decode_step;
use burn_mlx_llm::generate::{generate, generate_batch, GenerateOptions};
use burn_mlx_llm::gguf::{decode, is_gguf, GgufFile};
use burn_mlx_llm::model::{Llm, Logits};
use burn_mlx_llm::sampling::Sampler;
use burn_mlx_llm::step::Decoder;
use burn_mlx_llm::tokenizer::{encode, load_tokenizer, TextStream};
use burn_mlx_llm::weights::load_model;
use burn_ndarray::{NdArray, NdArrayDevice};
use burn_tensor::backend::Backend;
use burn_tensor::{DType, Int, Tensor};
use clap::{Parser, ValueEnum};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// The Burn backend to run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    /// burn-mlx (MLX's CPU, Metal or CUDA backend).
    Mlx,
    /// burn-ndarray (f32 only).
    Ndarray,
    /// burn-flex.
    Flex,
    /// burn-candle on the CPU.
    Candle,
}

/// Generate text with a Llama/Qwen3 model in Burn (MLX backend by default).
#[derive(Debug, Parser)]
#[command(name = "llm")]
struct Args {
    /// Model folder (config.json, model.safetensors or shards and their index, tokenizer.json),
    /// or a llama.cpp `.gguf` file of Gemma 3 (with --prompt-ids).
    #[arg(long, required_unless_present = "bench")]
    model: Option<PathBuf>,
    /// Prompt text (needs the folder's tokenizer.json). Given several times, the prompts are
    /// generated together as one batch (left-padded; see `generate_batch`) and each completion
    /// is printed when the batch ends.
    #[arg(long, conflicts_with = "prompt_ids")]
    prompt: Vec<String>,
    /// Prompt as comma-separated token ids (bypasses the tokenizer).
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Most tokens to generate [default: 256, 128 with --bench].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_tokens: Option<u64>,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, alias = "temperature", default_value_t = 0.0)]
    temp: f32,
    /// Nucleus sampling: keep the most likely tokens up to this probability mass.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Seed of the sampler (and of --bench's random prompt).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Cache capacity in positions [default: prompt + max tokens].
    #[arg(long)]
    max_context: Option<usize>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Burn backend.
    #[arg(long, value_enum, default_value = "mlx")]
    backend: BackendArg,
    /// MLX device (with --backend mlx).
    #[arg(long, value_enum, default_value = "auto")]
    device: DeviceArg,
    /// Dtype of weights, activations and cache.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: DTypeArg,
    /// Quantize the weight matrices (MLX's group-wise affine format, groups of 64) and multiply
    /// through MLX's quantized matmul; other backends compute with the dequantized weights.
    #[arg(long, value_enum)]
    quantize: Option<QuantizeArg>,
    /// Measure prefill and decode speed on random weights of a preset shape (no files needed).
    #[arg(long)]
    bench: bool,
    /// The --bench shape: qwen3-0.6b, llama3.2-1b, or small (a 41M-parameter Qwen3 for CPUs).
    #[arg(long, default_value = "qwen3-0.6b", value_parser = clap::builder::PossibleValuesParser::new(PRESETS.iter().copied()))]
    preset: String,
    /// Prompt length of --bench (random token ids).
    #[arg(long, default_value_t = 512)]
    prompt_len: usize,
    /// Sequences --bench generates together (random prompts of --prompt-len tokens each): the
    /// summary gives decode tokens/s per sequence and over the batch.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    batch: u64,
    /// With --bench on `Mlx`: also count the MLX primitives of one decode step (by kind), the
    /// launches a token pays for.
    #[arg(long)]
    count_primitives: bool,
    /// How decode steps run: `auto` (compiled on MLX's CPU, eager on an MLX GPU and on other
    /// backends: the faster of the two as measured), `compiled` (the fixed-shape step over the
    /// whole cache; MLX-compiled on `Mlx`, run uncompiled elsewhere) or `eager` (a new graph per
    /// token over the filled cache).
    #[arg(long, value_enum, default_value = "auto")]
    decode_step: DecodeStepArg,
    /// Write one decode step of the loaded model (weights inside; a cache of --max-context
    /// positions, default 1024) to FILE as an MLX function file that MLX Python, C++ and Swift
    /// run without Burn (scripts/mlxfn_generate.py generates with it), then exit. Mlx only.
    #[arg(long, value_name = "FILE")]
    export: Option<PathBuf>,
    /// Keep each block's q/k/v and gate/up projections as separate layers instead of fusing them
    /// (`Llm::fuse_projections`, the default without --adapter): the fused layers take one matrix
    /// product each, and on CUDA the decode kernels of `burn_mlx::decode`.
    #[arg(long)]
    separate_projections: bool,
    /// LoRA adapters to add to the model: a folder written by the `lora` command or by mlx-lm
    /// (`adapters.safetensors`), or by Hugging Face PEFT (`adapter_model.safetensors`).
    #[arg(long, value_name = "DIR", alias = "adapter-path")]
    adapter: Option<PathBuf>,
    /// Write the logits of every prompt position to FILE as JSON (`{"tokens": [...],
    /// "logits": [[...], ...]}`) and exit: the input of scripts/lora_interop.py.
    #[arg(long, value_name = "FILE")]
    logits_out: Option<PathBuf>,
}

/// `--decode-step`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DecodeStepArg {
    Auto,
    Compiled,
    Eager,
}

impl DecodeStepArg {
    /// The decoder this choice makes for `model`.
    fn decoder<B: Backend>(self, model: &Llm<B>) -> Decoder<B> {
        match self {
            DecodeStepArg::Auto => Decoder::best(model),
            DecodeStepArg::Compiled => Decoder::fixed(model),
            DecodeStepArg::Eager => Decoder::eager(model),
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match dispatch(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs on the chosen backend.
#[allow(deprecated)] // burn-candle, as above.
fn dispatch(args: &Args) -> Result<()> {
    if args.backend != BackendArg::Mlx && args.device != DeviceArg::Auto {
        return Err(LlmError::Input(
            "--device chooses MLX's device; it applies to --backend mlx only".into(),
        ));
    }
    if args.backend == BackendArg::Ndarray && args.dtype != DTypeArg::F32 {
        return Err(LlmError::Input(
            "--backend ndarray runs in f32 only (--dtype f32)".into(),
        ));
    }
    match args.backend {
        BackendArg::Mlx => {
            let device = args.device.device()?;
            // MLX's allocator peak (arrays alive at once, since the process started), the figure
            // mlx-lm reports: it includes the transients inside a prefill, which sampling the
            // active memory between tokens would miss, and not MLX's cache of free buffers.
            let probe: &dyn Fn() -> u64 = &|| burn_mlx::peak_memory() as u64;
            let name = format!("mlx ({device:?})").to_lowercase();
            run::<Mlx>(args, &device, &name, Some(probe))
        }
        BackendArg::Ndarray => run::<NdArray>(args, &NdArrayDevice::Cpu, "ndarray", None),
        BackendArg::Flex => run::<Flex>(args, &FlexDevice, "flex", None),
        BackendArg::Candle => run::<Candle>(args, &CandleDevice::Cpu, "candle (cpu)", None),
    }
}

/// Loads (or, with --bench, makes) the model and generates.
fn run<B: Backend>(
    args: &Args,
    device: &B::Device,
    backend_name: &str,
    device_memory: Option<&dyn Fn() -> u64>,
) -> Result<()> {
    let dtype = DType::from(args.dtype);
    if args.bench {
        return bench::<B>(args, device, backend_name, dtype, device_memory);
    }
    let dir = args
        .model
        .as_deref()
        .ok_or_else(|| LlmError::Input("--model DIR is required without --bench".into()))?;
    let start = Instant::now();
    // A llama.cpp GGUF file (Gemma 3) carries its vocabulary but no tokenizer.json: prompts go
    // in as ids, tokens come out as the vocabulary's pieces.
    let (model, tokenizer, vocabulary) = if is_gguf(dir) {
        let mut file = GgufFile::open(dir)?;
        let vocabulary = file.vocabulary()?;
        let model = file.load_model::<B>(device, dtype)?;
        if !args.prompt.is_empty() {
            return Err(LlmError::Tokenizer(format!(
                "{} is a GGUF file: this example does not build a tokenizer from it; give \
                 --prompt-ids",
                dir.display()
            )));
        }
        (model, None, Some(vocabulary))
    } else {
        let model = load_model::<B>(dir, device, dtype)?;
        (model, load_tokenizer(dir, !args.prompt.is_empty())?, None)
    };
    let mut model = prepare(model, args)?;
    if let Some(adapter) = &args.adapter {
        let lora =
            burn_mlx_llm::lora::files::load::<B>(adapter, model.config(), device, DType::F32)?;
        lora.install(&mut model, false)?;
        eprintln!(
            "adapters {}: {} layers, rank {}, scale {}",
            adapter.display(),
            lora.targets.len(),
            lora.config.rank,
            lora.config.scale
        );
    }
    let config = model.config();
    eprintln!(
        "loaded {} ({:?}, {} layers, {:.1}M parameters) on {backend_name} in {:?} in {:.2} s",
        dir.display(),
        config.architecture,
        config.num_layers,
        config.num_params() as f64 / 1e6,
        dtype,
        start.elapsed().as_secs_f64()
    );

    if args.quantize.is_some() {
        eprintln!("{}", model.quantization().summary());
    }
    if let Some(file) = &args.export {
        let any: &dyn std::any::Any = &model;
        let model = any.downcast_ref::<Llm<Mlx>>().ok_or_else(|| {
            LlmError::Input("--export writes an MLX function file: use --backend mlx".into())
        })?;
        let capacity = args.max_context.unwrap_or(1024);
        export_decode_step(model, capacity, file)?;
        let bytes = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
        eprintln!(
            "exported one decode step to {} ({bytes} bytes, a cache of {capacity} positions); \
             generate with it in MLX Python:\n  python3 scripts/mlxfn_generate.py {} \
             --prompt-ids 1,2,3",
            file.display(),
            file.display()
        );
        return Ok(());
    }

    if args.batch != 1 {
        return Err(LlmError::Input(
            "--batch sets --bench's batch; to generate a batch of your own prompts, give \
             --prompt several times"
                .into(),
        ));
    }
    let prompts: Vec<Vec<u32>> = match (&args.prompt_ids, &args.prompt[..], &tokenizer) {
        (Some(ids), _, _) => vec![ids.clone()],
        (None, [], _) => {
            return Err(LlmError::Input(
                "give a prompt: --prompt TEXT or --prompt-ids 1,2,3".into(),
            ))
        }
        (None, texts, Some(tok)) => texts
            .iter()
            .map(|text| encode(tok, text))
            .collect::<Result<_>>()?,
        (None, _, None) => {
            return Err(LlmError::Tokenizer(
                "no tokenizer.json for --prompt; give --prompt-ids".into(),
            ))
        }
    };
    let prompt = prompts[0].clone();
    if let Some(file) = &args.logits_out {
        let mut cache = model.new_cache(prompt.len());
        let logits = model.forward(&prompt, &mut cache, Logits::All)?;
        let [seq, vocab] = logits.dims();
        let values = logits
            .cast(DType::F32)
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .map_err(|e| LlmError::Input(format!("reading logits: {e:?}")))?;
        let rows: Vec<&[f32]> = values.chunks(vocab).collect();
        let json = serde_json::json!({ "tokens": prompt, "logits": rows });
        std::fs::write(file, json.to_string()).map_err(|e| LlmError::Io {
            path: file.clone(),
            reason: e.to_string(),
        })?;
        eprintln!("wrote the logits of {seq} positions to {}", file.display());
        return Ok(());
    }
    let max_tokens = args.max_tokens.unwrap_or(256) as usize;
    let width = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let capacity = args.max_context.unwrap_or(width + max_tokens);
    let stop = if args.ignore_eos {
        vec![]
    } else {
        config.eos_token_ids.clone()
    };
    let mut options = GenerateOptions {
        max_tokens,
        stop_tokens: &stop,
        sampler: Sampler::new(args.temp, args.top_p, args.seed),
        device_memory,
    };
    let mut decoder = args.decode_step.decoder(&model);
    if prompts.len() > 1 {
        let mut cache = model.new_batch_cache(prompts.len(), capacity);
        let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        let (outputs, stats) = generate_batch(
            &mut decoder,
            &mut cache,
            &refs,
            &mut options,
            &mut |_, _| Ok(()),
        )?;
        for (i, (text, tokens)) in args.prompt.iter().zip(&outputs).enumerate() {
            let tok = tokenizer.as_ref().expect("several prompts are text");
            let completion = tok
                .decode(tokens, true)
                .map_err(|e| LlmError::Tokenizer(format!("decoding completion {i}: {e}")))?;
            println!("[{i}] {text}{completion}");
        }
        println!("{}", stats.summary());
        return Ok(());
    }
    let mut cache = model.new_cache(capacity);
    let mut stream = tokenizer.as_ref().map(TextStream::new);
    let (_, stats) =
        generate(
            &mut decoder,
            &mut cache,
            &prompt,
            &mut options,
            &mut |t| match &vocabulary {
                Some(v) => print_text(&decode(v, &[t])),
                None => print_token(stream.as_mut(), t),
            },
        )?;
    println!();
    println!("{}", stats.summary());
    Ok(())
}

/// `model` with its projections fused (unless `--separate-projections` or `--adapter`, whose
/// adapters name the separate layers), then quantized as `--quantize` asks.
fn prepare<B: Backend>(model: Llm<B>, args: &Args) -> Result<Llm<B>> {
    let model = if args.separate_projections || args.adapter.is_some() {
        model
    } else {
        model.fuse_projections()
    };
    match args.quantize {
        Some(q) => model.quantize(q.into()),
        None => Ok(model),
    }
}

/// Streams tokens to stdout: decoded text when there is a tokenizer, else the ids.
fn print_token(stream: Option<&mut TextStream>, token: u32) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let io = |e: std::io::Error| LlmError::Input(format!("writing to stdout: {e}"));
    match stream {
        Some(stream) => write!(out, "{}", stream.push(token)?).map_err(io)?,
        None => write!(out, "{token} ").map_err(io)?,
    }
    out.flush().map_err(io)
}

/// Writes `text` to stdout at once.
fn print_text(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let io = |e: std::io::Error| LlmError::Input(format!("writing to stdout: {e}"));
    write!(out, "{text}").map_err(io)?;
    out.flush().map_err(io)
}

/// The MLX primitives pending behind `t` (an error on backends other than `Mlx`).
fn pending<B: Backend>(t: Tensor<B, 2, Int>) -> Result<BTreeMap<String, usize>> {
    let t = burn_mlx::to_mlx(t).map_err(|_| {
        LlmError::Input("--count-primitives counts MLX graphs: use it with --backend mlx".into())
    })?;
    burn_mlx::pending_primitives(&[&t])
        .map_err(|e| LlmError::Input(format!("counting MLX primitives failed: {e}")))
}

/// `--count-primitives`: prints the MLX primitives of one decode step (run by `decoder`) after
/// `prompt`: the prompt is prefilled and evaluated (cache included), then the step's graph is
/// built and its pending primitives counted.
fn count_decode_primitives<B: Backend>(decoder: &mut Decoder<B>, prompt: &[u32]) -> Result<()> {
    let model = decoder.model().clone();
    let mut cache = model.new_cache(prompt.len() + 1);
    let first = greedy_tokens(model.forward(prompt, &mut cache, Logits::Last)?);
    first
        .clone()
        .try_into_data()
        .map_err(|e| LlmError::Input(format!("prefill failed: {e:?}")))?;
    let counts = pending(greedy_tokens(decoder.step(first, &mut cache)?))?;
    let mut step: Vec<(String, usize)> = counts.into_iter().collect();
    step.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for (name, n) in &step {
        *kinds
            .entry(format!("{:?}", burn_mlx::PrimitiveKind::of(name)))
            .or_insert(0) += n;
    }
    let total: usize = step.iter().map(|(_, n)| n).sum();
    let names: Vec<String> = step.iter().map(|(p, n)| format!("{p} {n}")).collect();
    println!(
        "one decode step: {total} MLX primitives; by kind {kinds:?}; {}",
        names.join(", ")
    );
    Ok(())
}

/// `--bench`: random weights of a preset shape, a random prompt, one warm-up run, one measured
/// run, one line of results.
fn bench<B: Backend>(
    args: &Args,
    device: &B::Device,
    backend_name: &str,
    dtype: DType,
    device_memory: Option<&dyn Fn() -> u64>,
) -> Result<()> {
    let config = LlmConfig::preset(&args.preset)?;
    let max_tokens = args.max_tokens.unwrap_or(128) as usize;
    if args.prompt_len == 0 {
        return Err(LlmError::Input("--prompt-len must be at least 1".into()));
    }
    let mut rng = StdRng::seed_from_u64(args.seed);
    let batch = args.batch as usize;
    let prompts: Vec<Vec<u32>> = (0..batch)
        .map(|_| {
            (0..args.prompt_len)
                .map(|_| rng.random_range(0..config.vocab_size as u32))
                .collect()
        })
        .collect();
    let prompt = prompts[0].clone();
    let params = config.num_params();
    let model = prepare(Llm::<B>::random(config, device, dtype)?, args)?;

    // Warm-up: the same prompt length and number of tokens as the measured run, as the mlx-lm
    // peer in `scripts/llm_gpu_reference.py` does. It materializes the (lazily generated)
    // weights, and every shape-keyed cache a backend keeps (compiled kernels, cuDNN graphs per
    // key length, CUDA graphs) is filled before timing, on both sides alike.
    let mut decoder = args.decode_step.decoder(&model);
    let capacity = prompt.len() + max_tokens;
    let new_cache = || match batch {
        1 => model.new_cache(capacity),
        _ => model.new_batch_cache(batch, capacity),
    };
    let refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let run_once =
        |decoder: &mut Decoder<B>, cache: &mut _, options: &mut GenerateOptions| match batch {
            1 => generate(decoder, cache, &prompt, options, &mut |_| Ok(())).map(|(_, s)| s),
            _ => generate_batch(decoder, cache, &refs, options, &mut |_, _| Ok(())).map(|(_, s)| s),
        };
    let mut warm = GenerateOptions {
        max_tokens,
        stop_tokens: &[],
        sampler: Sampler::greedy(),
        device_memory: None,
    };
    run_once(&mut decoder, &mut new_cache(), &mut warm)?;
    // The measured run's peak: weights, cache and the run's own transients, without the warm-up
    // or the one-off buffers of quantizing the weights (mlx-lm quantizes at conversion time).
    if device_memory.is_some() {
        burn_mlx::reset_peak_memory();
    }

    if args.count_primitives {
        count_decode_primitives(&mut decoder, &prompt)?;
    }

    let mut cache = new_cache();
    let mut options = GenerateOptions {
        max_tokens,
        stop_tokens: &[],
        sampler: Sampler::new(args.temp, args.top_p, args.seed),
        device_memory,
    };
    let stats = run_once(&mut decoder, &mut cache, &mut options)?;
    let elem = match dtype {
        DType::F32 => 4,
        _ => 2,
    };
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    let quant = args
        .quantize
        .map_or(String::new(), |q| format!(" {}", QuantBits::from(q)));
    println!(
        "bench {} ({:.1}M params) on {backend_name} {:?}{quant}, {}: {} | weights {:.1} MiB + KV cache {:.1} MiB",
        args.preset,
        params as f64 / 1e6,
        dtype,
        if batch > 1 {
            "eager decode steps (a batch always runs them)"
        } else {
            decoder.describe()
        },
        stats.summary(),
        mib(model.weight_bytes()),
        mib(cache.bytes(elem)),
    );
    if let Some(host) = stats.host_per_step() {
        println!("{host}");
    }
    Ok(())
}
