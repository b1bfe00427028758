//! LoRA fine-tuning of a Llama/Qwen3/Gemma 3 model with Burn on MLX, as `mlx_lm.lora` does it,
//! writing adapters that mlx-lm and Hugging Face PEFT load.
//!
//! ```text
//! cargo run --release -p burn-mlx-llm --bin lora -- --model DIR --data DATA --iters 600
//! cargo run --release -p burn-mlx-llm --bin lora -- --model DIR --data DATA --quantize q4 --mask-prompt
//! cargo run --release -p burn-mlx-llm --bin llm -- --model DIR --adapter adapters --prompt "..."
//! cargo run --release -p burn-mlx-llm --bin lora -- --model DIR --adapter-path adapters --fuse fused
//! ```
//!
//! `DIR` is a Hugging Face model folder (`config.json`, safetensors weights, `tokenizer.json`,
//! and `tokenizer_config.json` for a chat template); `DATA` holds `train.jsonl` and
//! `valid.jsonl` (and optionally `test.jsonl`) in mlx-lm's formats (`text`, `prompt` and
//! `completion`, or `messages`). Adapters go to `--adapter-path` (default `adapters/`) in
//! mlx-lm's layout, and to its `peft/` subfolder in PEFT's. Without `--data` nothing is
//! trained: `--fuse` alone writes the model with the adapters of `--adapter-path` fused in.
//!
//! `--bench` times training steps on random weights of a preset shape and random tokens
//! (no files needed) and prints one JSON line: target tokens/s and MLX's peak memory, the
//! figures `scripts/lora_bench.py` prints for mlx-lm and PyTorch + PEFT on the same shape.
//! ```text
//! cargo run --release -p burn-mlx-llm --bin lora -- --bench --preset qwen3-0.6b --dtype bf16
//! cargo run --release -p burn-mlx-llm --bin lora -- --bench --preset small --backend flex
//! ```

use burn_autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn_autodiff::Autodiff;
use burn_flex::{Flex, FlexDevice};
use burn_mlx::{Mlx, MlxDevice};
use burn_mlx_llm::cli::{DTypeArg, DeviceArg, QuantizeArg};
use burn_mlx_llm::config::{LlmConfig, PRESETS};
use burn_mlx_llm::error::{LlmError, Result};
use burn_mlx_llm::lora::data::Batches as BatchIter;
use burn_mlx_llm::lora::data::Example;
use burn_mlx_llm::lora::data::{load_dir, Batches, ChatTemplate};
use burn_mlx_llm::lora::files::{self, SaveInfo};
use burn_mlx_llm::lora::fuse::fuse;
use burn_mlx_llm::lora::train::{
    evaluate, train, train_compiled, Event, OptimizerKind, Schedule, TrainConfig,
};
use burn_mlx_llm::lora::{Lora, LoraConfig};
use burn_mlx_llm::model::Llm;
use burn_mlx_llm::tokenizer::load_tokenizer;
use burn_mlx_llm::weights::load_model;
use burn_tensor::backend::Backend;
use burn_tensor::DType;
use clap::{Parser, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// The Burn backend (under Burn's autodiff).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    /// burn-mlx.
    Mlx,
    /// burn-flex (CPU; with --bench, the CPU peer).
    Flex,
}

/// The learning-rate schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ScheduleArg {
    /// The same rate throughout.
    Constant,
    /// Linear warm-up (`--warmup` steps), then cosine decay to `--min-lr`.
    Cosine,
}

/// How a training step runs on MLX.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum TrainerArg {
    /// Burn's autodiff (Autodiff<Mlx>): every option, a graph built per step.
    Autodiff,
    /// The whole step traced once per batch shape and replayed by MLX (as mlx_lm.lora does):
    /// faster on an H200, with more memory (docs/lora.md); one batch per step, no adapter
    /// dropout, no --grad-checkpoint.
    Compiled,
}

/// The optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OptimizerArg {
    /// Adam.
    Adam,
    /// AdamW (decoupled weight decay, `--weight-decay`).
    Adamw,
}

/// Fine-tune a model with LoRA adapters (Burn on MLX); mlx-lm's `lora` command's flags.
#[derive(Debug, Parser)]
#[command(name = "lora")]
struct Args {
    /// Hugging Face model folder.
    #[arg(long, required_unless_present = "bench")]
    model: Option<PathBuf>,
    /// Data folder with train.jsonl and valid.jsonl (test.jsonl optional). Without it, no
    /// training (use with --fuse or --test).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Where the adapters are written (and read, for --fuse without --data).
    #[arg(long, default_value = "adapters")]
    adapter_path: PathBuf,
    /// Start from these adapters (either layout) instead of new ones.
    #[arg(long, value_name = "DIR")]
    resume_adapter: Option<PathBuf>,
    /// Optimizer steps.
    #[arg(long, default_value_t = 1000)]
    iters: usize,
    /// Sequences per batch.
    #[arg(long, default_value_t = 4)]
    batch_size: usize,
    /// Batches whose gradients are averaged into one step.
    #[arg(long, default_value_t = 1)]
    grad_accumulation_steps: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 1e-5)]
    learning_rate: f64,
    /// Learning-rate schedule.
    #[arg(long, value_enum, default_value = "constant")]
    lr_schedule: ScheduleArg,
    /// Warm-up steps of the cosine schedule.
    #[arg(long, default_value_t = 0)]
    warmup: usize,
    /// Final rate of the cosine schedule.
    #[arg(long, default_value_t = 0.0)]
    min_lr: f64,
    /// Optimizer.
    #[arg(long, value_enum, default_value = "adam")]
    optimizer: OptimizerArg,
    /// AdamW's weight decay.
    #[arg(long, default_value_t = 0.01)]
    weight_decay: f32,
    /// Blocks, counted from the last, that get adapters.
    #[arg(long, default_value_t = 16)]
    num_layers: usize,
    /// Rank of each adapter.
    #[arg(long, default_value_t = 8)]
    rank: usize,
    /// Factor on the adapters' output (PEFT's lora_alpha / r).
    #[arg(long, default_value_t = 20.0)]
    scale: f64,
    /// Dropout on the adapters' input while training.
    #[arg(long, default_value_t = 0.0)]
    dropout: f64,
    /// Linear layers of a block to adapt (comma-separated, e.g.
    /// self_attn.q_proj,self_attn.v_proj) [default: all seven].
    #[arg(long, value_delimiter = ',')]
    keys: Option<Vec<String>>,
    /// Longest sequence in tokens; longer ones are truncated.
    #[arg(long, default_value_t = 2048)]
    max_seq_length: usize,
    /// Compute the loss on completions only (the prompt / earlier turns get none).
    #[arg(long)]
    mask_prompt: bool,
    /// Report the training loss every N steps.
    #[arg(long, default_value_t = 10)]
    steps_per_report: usize,
    /// Compute the validation loss every N steps (0: never).
    #[arg(long, default_value_t = 200)]
    steps_per_eval: usize,
    /// Validation batches per evaluation (-1: all).
    #[arg(long, default_value_t = 25, allow_hyphen_values = true)]
    val_batches: i64,
    /// Save the adapters every N steps (and at the end).
    #[arg(long, default_value_t = 100)]
    save_every: usize,
    /// After training, report the loss and perplexity on test.jsonl.
    #[arg(long)]
    test: bool,
    /// Test batches (-1: all).
    #[arg(long, default_value_t = 500, allow_hyphen_values = true)]
    test_batches: i64,
    /// Recompute activations in the backward pass instead of keeping them (Burn's balanced
    /// checkpointing): less memory, more time.
    #[arg(long)]
    grad_checkpoint: bool,
    /// The base model's dtype (the adapters are f32).
    #[arg(long, value_enum, default_value = "f32")]
    dtype: DTypeArg,
    /// Quantize the base model's matrices (QLoRA); the adapters stay in f32.
    #[arg(long, value_enum)]
    quantize: Option<QuantizeArg>,
    /// MLX device.
    #[arg(long, value_enum, default_value = "auto")]
    device: DeviceArg,
    /// Seed of the adapters' initial values and of the batch order.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write a Hugging Face folder with the adapters fused into the weights to DIR.
    #[arg(long, value_name = "DIR")]
    fuse: Option<PathBuf>,
    /// Burn backend.
    #[arg(long, value_enum, default_value = "mlx")]
    backend: BackendArg,
    /// How steps run on MLX (docs/lora.md compares the two).
    #[arg(long, value_enum, default_value = "autodiff")]
    trainer: TrainerArg,
    /// With --trainer compiled: start each step before the last one has finished (faster where
    /// the host is the bottleneck; up to twice the memory of a step).
    #[arg(long)]
    pipeline: bool,
    /// Time training steps on random weights of --preset and random tokens; print one JSON line.
    #[arg(long)]
    bench: bool,
    /// The --bench shape.
    #[arg(long, default_value = "qwen3-0.6b", value_parser = clap::builder::PossibleValuesParser::new(PRESETS.iter().copied()))]
    preset: String,
    /// Tokens per sequence in --bench (every sequence this long, no padding).
    #[arg(long, default_value_t = 512)]
    seq_len: usize,
    /// Untimed steps before the timed --iters in --bench.
    #[arg(long, default_value_t = 3)]
    warmup_steps: usize,
    /// Run burn-mlx's fused training ops on MLX's CPU device too (`burn_mlx::nn::fuse_on_cpu`),
    /// so that a CPU run builds the graphs a GPU run builds (slower on the CPU; for profiling).
    #[arg(long)]
    fuse_on_cpu: bool,
}

/// A training loop: [`train`] on an autodiff backend, or [`train_compiled`] on `Mlx`.
type Fit<B> = fn(
    &mut Llm<B>,
    &mut Lora<B>,
    &mut BatchIter,
    &BatchIter,
    &TrainConfig,
    &mut dyn FnMut(&Event),
    &mut dyn FnMut(usize, &Lora<B>) -> Result<()>,
) -> Result<()>;

fn main() -> ExitCode {
    let args = Args::parse();
    if args.fuse_on_cpu {
        burn_mlx::nn::fuse_on_cpu(true);
    }
    let result = match (args.backend, args.device.device()) {
        (BackendArg::Flex, _) if args.device != DeviceArg::Auto => Err(LlmError::Input(
            "--device chooses MLX's device; it applies to --backend mlx only".into(),
        )),
        (BackendArg::Flex, _) if args.trainer == TrainerArg::Compiled || args.pipeline => {
            Err(LlmError::Input(
                "--trainer compiled and --pipeline run on MLX; they apply to --backend mlx only"
                    .into(),
            ))
        }
        (BackendArg::Flex, _) if args.grad_checkpoint => {
            run::<Autodiff<Flex, BalancedCheckpointing>>(&args, &FlexDevice, "flex", train)
        }
        (BackendArg::Flex, _) => run::<Autodiff<Flex>>(&args, &FlexDevice, "flex", train),
        (BackendArg::Mlx, Ok(device)) => match trainer(&args) {
            Err(e) => Err(e),
            Ok(TrainerArg::Compiled) => run::<Mlx>(&args, &device, "mlx", train_compiled),
            Ok(_) if args.grad_checkpoint => {
                run::<Autodiff<Mlx, BalancedCheckpointing>>(&args, &device, "mlx", train)
            }
            Ok(_) => run::<Autodiff<Mlx>>(&args, &device, "mlx", train),
        },
        (BackendArg::Mlx, Err(e)) => Err(e),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The trainer `--trainer` names; an error when `compiled` is asked for with an option it does
/// not have, or `--pipeline` without it.
fn trainer(args: &Args) -> Result<TrainerArg> {
    let unsupported = if args.grad_checkpoint {
        Some("--grad-checkpoint")
    } else if args.grad_accumulation_steps != 1 {
        Some("--grad-accumulation-steps above 1")
    } else if args.dropout != 0.0 {
        Some("--dropout")
    } else {
        None
    };
    if let (TrainerArg::Compiled, Some(option)) = (args.trainer, unsupported) {
        return Err(LlmError::Input(format!(
            "--trainer compiled does not take {option}: use --trainer autodiff"
        )));
    }
    if args.pipeline && args.trainer != TrainerArg::Compiled {
        return Err(LlmError::Input(
            "--pipeline applies to the compiled trainer (the autodiff one always starts the next \
             step early)"
                .into(),
        ));
    }
    Ok(args.trainer)
}

/// `-1` → all, else that many.
fn limit(n: i64) -> Option<usize> {
    (n >= 0).then_some(n as usize)
}

fn run<B: Backend>(args: &Args, device: &B::Device, backend: &str, fit: Fit<B>) -> Result<()> {
    let config = train_config(args);
    if args.bench {
        return bench::<B>(args, &config, device, backend, fit);
    }
    let model_dir = args
        .model
        .as_ref()
        .expect("clap requires --model without --bench");
    let Some(data) = &args.data else {
        if args.fuse.is_none() {
            return Err(LlmError::Input(
                "nothing to do: give --data DIR to train, or --fuse DIR to fuse the adapters of \
                 --adapter-path into the model"
                    .into(),
            ));
        }
        return fuse_into(args);
    };
    config.check()?;
    let start = Instant::now();
    let mut model = load_model::<B>(model_dir, device, dtype(args))?;
    if let Some(q) = args.quantize {
        model = model.quantize(q.into())?;
    }
    let tokenizer = load_tokenizer(model_dir, true)?.expect("required");
    let template = ChatTemplate::from_model_dir(model_dir)?;
    let splits = load_dir(data, &tokenizer, template.as_ref())?;
    eprintln!(
        "loaded {} ({} layers, {:.1}M parameters, {:?}{}) on {backend} and {} ({} train, {} \
         valid examples) in {:.1} s",
        model_dir.display(),
        model.config().num_layers,
        model.config().num_params() as f64 / 1e6,
        dtype(args),
        args.quantize
            .map(|q| format!(", base quantized to {q:?}"))
            .unwrap_or_default(),
        data.display(),
        splits.train.len(),
        splits.valid.len(),
        start.elapsed().as_secs_f64()
    );
    B::seed(device, args.seed);
    let mut lora: Lora<B> = match &args.resume_adapter {
        Some(dir) => files::load(dir, model.config(), device, DType::F32)?,
        None => Lora::init(&model, lora_config(args), DType::F32)?,
    };
    let total = model.config().num_params() as f64;
    eprintln!(
        "trainable parameters: {:.3}% ({:.3}M / {:.3}M), {} adapted layers",
        lora.num_params() as f64 * 100.0 / total,
        lora.num_params() as f64 / 1e6,
        total / 1e6,
        lora.targets.len()
    );
    let mut train_batches = Batches::new(
        &splits.train,
        config.batch_size,
        config.max_seq_length,
        config.mask_prompt,
        config.seed,
    )?;
    let valid_batches = Batches::new(
        &splits.valid,
        config.batch_size.min(splits.valid.len().max(1)),
        config.max_seq_length,
        config.mask_prompt,
        config.seed,
    )?;
    let info = SaveInfo {
        base_model: model_dir.display().to_string(),
        extra: serde_json::json!({
            "iters": args.iters,
            "batch_size": args.batch_size,
            "learning_rate": args.learning_rate,
            "max_seq_length": args.max_seq_length,
            "mask_prompt": args.mask_prompt,
            "grad_accumulation_steps": args.grad_accumulation_steps,
            "seed": args.seed,
            "data": data.display().to_string(),
        })
        .as_object()
        .cloned()
        .unwrap_or_default(),
    };
    let mut on_event = |event: &Event| match event {
        Event::Train {
            step,
            loss,
            learning_rate,
            steps_per_sec,
            tokens_per_sec,
            trained_tokens,
            peak_memory,
        } => eprintln!(
            "Iter {step}: Train loss {loss:.3}, Learning Rate {learning_rate:.3e}, It/sec \
             {steps_per_sec:.3}, Tokens/sec {tokens_per_sec:.1}, Trained Tokens \
             {trained_tokens}, Peak mem {:.3} GB",
            *peak_memory as f64 / 1e9
        ),
        Event::Validation {
            step,
            loss,
            seconds,
        } => eprintln!(
            "Iter {step}: Val loss {loss:.3}, Val ppl {:.3}, Val took {seconds:.3}s",
            loss.exp()
        ),
    };
    let save_every = args.save_every;
    let adapter_path = args.adapter_path.clone();
    let iters = args.iters;
    let mut on_step = |step: usize, lora: &Lora<B>| -> Result<()> {
        if (save_every > 0 && step.is_multiple_of(save_every)) || step == iters {
            files::save(lora, &adapter_path, &info)?;
            eprintln!(
                "Iter {step}: Saved adapter weights to {}",
                adapter_path.join(files::MLX_WEIGHTS).display()
            );
        }
        Ok(())
    };
    fit(
        &mut model,
        &mut lora,
        &mut train_batches,
        &valid_batches,
        &config,
        &mut on_event,
        &mut on_step,
    )?;
    if args.test {
        let test = splits.test.as_ref().ok_or_else(|| LlmError::Data {
            path: data.clone(),
            line: None,
            message: "--test: the data folder has no test.jsonl".into(),
        })?;
        let batches = Batches::new(
            test,
            config.batch_size.min(test.len().max(1)),
            config.max_seq_length,
            config.mask_prompt,
            config.seed,
        )?;
        let (loss, tokens) = evaluate(&model, &batches.all(), limit(args.test_batches))?;
        eprintln!(
            "Test loss {loss:.3}, Test ppl {:.3} ({tokens} tokens)",
            loss.exp()
        );
    }
    if args.fuse.is_some() {
        fuse_into(args)?;
    }
    Ok(())
}

/// The training settings the flags give.
fn train_config(args: &Args) -> TrainConfig {
    TrainConfig {
        iters: args.iters,
        batch_size: args.batch_size,
        grad_accumulation: args.grad_accumulation_steps,
        learning_rate: args.learning_rate,
        schedule: match args.lr_schedule {
            ScheduleArg::Constant => Schedule::Constant,
            ScheduleArg::Cosine => Schedule::Cosine {
                warmup: args.warmup,
                end: args.min_lr,
            },
        },
        optimizer: match args.optimizer {
            OptimizerArg::Adam => OptimizerKind::Adam,
            OptimizerArg::Adamw => OptimizerKind::AdamW {
                weight_decay: args.weight_decay,
            },
        },
        steps_per_report: args.steps_per_report,
        steps_per_eval: args.steps_per_eval,
        val_batches: limit(args.val_batches),
        max_seq_length: args.max_seq_length,
        mask_prompt: args.mask_prompt,
        seed: args.seed,
        pipeline: args.pipeline,
        ..TrainConfig::default()
    }
}

/// `--fuse`: writes the model with the adapters of `--adapter-path` fused in.
fn fuse_into(args: &Args) -> Result<()> {
    let out = args.fuse.as_ref().expect("called with --fuse");
    let model = args
        .model
        .as_ref()
        .expect("clap requires --model without --bench");
    let report = fuse::<Mlx>(model, &args.adapter_path, out, &MlxDevice::Cpu)?;
    eprintln!(
        "fused {} adapted matrices into {} ({} tensors; copied {})",
        report.fused,
        out.display(),
        report.tensors,
        report.copied.join(", ")
    );
    Ok(())
}

fn dtype(args: &Args) -> DType {
    args.dtype.into()
}

fn lora_config(args: &Args) -> LoraConfig {
    LoraConfig {
        rank: args.rank,
        scale: args.scale,
        dropout: args.dropout,
        num_layers: args.num_layers,
        keys: args.keys.clone(),
    }
}

/// `--bench`: `--warmup-steps` untimed steps, then `--iters` timed ones, on a random model of
/// `--preset` and `--batch-size` random sequences of `--seq-len` tokens (no padding, every
/// next token a target); prints one JSON line.
fn bench<B: Backend>(
    args: &Args,
    config: &TrainConfig,
    device: &B::Device,
    backend: &str,
    fit: Fit<B>,
) -> Result<()> {
    let shape = LlmConfig::preset(&args.preset)?;
    let trainer_name = match B::ad_enabled(device) {
        true => "autodiff",
        false => "compiled",
    };
    B::seed(device, args.seed);
    let mut model = Llm::<B>::random(shape.clone(), device, dtype(args))?;
    if let Some(q) = args.quantize {
        model = model.quantize(q.into())?;
    }
    let mut lora = Lora::init(&model, lora_config(args), DType::F32)?;
    // The peak from here on, as the peers reset theirs once the model is built: the model's
    // weights (alive throughout) and the training steps' transients.
    burn_mlx::reset_peak_memory();
    let mut state = args.seed | 1;
    let mut next = || {
        // xorshift64: a fixed, dependency-free stream of token ids.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % shape.vocab_size as u64) as u32
    };
    let examples: Vec<Example> = (0..config.batch_size)
        .map(|_| Example {
            tokens: (0..args.seq_len).map(|_| next()).collect(),
            prompt_len: 0,
        })
        .collect();
    let make = || Batches::new(&examples, config.batch_size, args.seq_len, false, args.seed);
    let mut run = |iters: usize| -> Result<Option<Event>> {
        let config = TrainConfig {
            iters,
            steps_per_report: iters,
            steps_per_eval: 0,
            max_seq_length: args.seq_len,
            ..config.clone()
        };
        let mut last = None;
        fit(
            &mut model,
            &mut lora,
            &mut make()?,
            &make()?,
            &config,
            &mut |e| last = Some(e.clone()),
            &mut |_, _| Ok(()),
        )?;
        Ok(last)
    };
    if args.warmup_steps > 0 {
        run(args.warmup_steps)?;
    }
    let Some(Event::Train {
        tokens_per_sec,
        steps_per_sec,
        trained_tokens,
        peak_memory,
        ..
    }) = run(config.iters)?
    else {
        return Err(LlmError::Input("--bench: no step was timed".into()));
    };
    let json = serde_json::json!({
        "framework": format!("burn-{backend}"),
        "trainer": trainer_name,
        "pipeline": args.pipeline,
        "preset": args.preset,
        "dtype": format!("{:?}", dtype(args)).to_lowercase(),
        "quantize": args.quantize.map(|q| format!("{q:?}").to_lowercase()),
        "device": format!("{device:?}").to_lowercase(),
        "batch_size": config.batch_size,
        "seq_len": args.seq_len,
        "targets_per_step": trained_tokens / config.iters,
        "steps": config.iters,
        "seconds": config.iters as f64 / steps_per_sec,
        "tokens_per_sec": tokens_per_sec,
        "peak_memory_bytes": peak_memory,
        "adapted_layers": lora.targets.len(),
    });
    println!("{json}");
    Ok(())
}
