//! Training throughput at real batch sizes: the Transformer encoder and the decoder LM of
//! burn-mlx-models' shapes, each with burn-nn's layers and with `burn_mlx::nn`'s fused layers,
//! with the loss read every step or overlapped (`burn_mlx::nn::start_step`). The fused rows
//! use `burn_mlx::optim::Adam` (one compiled kernel per parameter update), the others
//! burn-optim's Adam.
//!
//! ```text
//! cargo run --release -p burn-mlx-bench --features cuda --bin train_bench -- --json mlx.json
//! python3 scripts/train_reference.py mlx.json          # PyTorch eager and torch.compile, same shapes
//! cargo run --release -p burn-mlx-bench --bin train_bench -- --device cpu --quick   # CPU, with burn-flex
//! ```
//!
//! Rows: the encoder (d_model 256, 8 heads, 2 post-norm layers, feed-forward 1024, sequence 128,
//! MSE against a random target) at batch 16 and 128, and the decoder LM (6 pre-norm layers,
//! d_model 512, sequence 256, vocabulary 10,240, cross-entropy) at batch 8 and 32. Every row is
//! an Adam step (forward, backward, update, loss read). Per row and variant it prints samples
//! per second and the median step time, the host time split (building the step's graph,
//! starting the device, waiting for the loss) and the MLX primitives of one step's graph.

extern crate burn_core as burn;

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn_autodiff::Autodiff;
use burn_flex::{Flex, FlexDevice};
use burn_mlx::nn::functional::cross_entropy;
use burn_mlx::{pending_primitives, to_mlx, Mlx, MlxDevice, MlxTensor};
use burn_mlx_models::{lm, Encoder};
use burn_nn::attention::generate_autoregressive_mask;
use burn_nn::loss::CrossEntropyLossConfig;
use burn_nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn_optim::{AdamConfig, GradientsParams, Optimizer};
use burn_tensor::backend::{AutodiffBackend, Backend};
use burn_tensor::{Bool, Distribution, ElementConversion, Int, Tensor, TensorData};
use clap::Parser;
use std::path::PathBuf;
use std::time::Instant;

/// The encoder workload's model and the decoder LM, each written once for a layer family by
/// this macro: `$enc` is the encoder type, `$cfg` its config, `$input` its input type, `$norm`
/// and `$norm_cfg` the final layer norm's, `$ce` the cross-entropy.
macro_rules! models {
    ($module:ident, $enc:ident, $cfg:path, $input:ident, $norm:ident, $norm_cfg:path, $ce:expr) => {
        mod $module {
            use super::*;
            use $cfg as EncoderConfig;
            use $norm_cfg as NormConfig;

            /// The encoder of the Transformer rows.
            #[derive(Module, Debug)]
            pub struct EncoderModel<B: Backend> {
                encoder: $enc<B>,
            }

            impl<B: Backend> EncoderModel<B> {
                pub fn new(device: &B::Device) -> Self {
                    Self {
                        encoder: EncoderConfig::new(Encoder::<B>::D_MODEL, 1024, 8, 2)
                            .with_dropout(0.0)
                            .init(device),
                    }
                }

                pub fn loss(&self, x: Tensor<B, 3>, target: Tensor<B, 3>) -> Tensor<B, 1> {
                    let y = self.encoder.forward($input::new(x));
                    (y - target).powi_scalar(2).mean()
                }
            }

            /// The decoder LM of the decoder rows.
            #[derive(Module, Debug)]
            pub struct DecoderModel<B: Backend> {
                tokens: Embedding<B>,
                positions: Embedding<B>,
                layers: $enc<B>,
                norm: $norm<B>,
                head: Linear<B>,
            }

            impl<B: Backend> DecoderModel<B> {
                pub fn new(device: &B::Device) -> Self {
                    Self {
                        tokens: EmbeddingConfig::new(lm::VOCAB, lm::D_MODEL).init(device),
                        positions: EmbeddingConfig::new(lm::SEQ, lm::D_MODEL).init(device),
                        layers: EncoderConfig::new(lm::D_MODEL, lm::D_FF, lm::HEADS, lm::LAYERS)
                            .with_dropout(0.0)
                            .with_norm_first(true)
                            .init(device),
                        norm: NormConfig::new(lm::D_MODEL).init(device),
                        head: LinearConfig::new(lm::D_MODEL, lm::VOCAB).init(device),
                    }
                }

                pub fn loss(&self, batch: &super::LmData<B>) -> Tensor<B, 1> {
                    let [b, s] = batch.ids.dims();
                    let x = self.tokens.forward(batch.ids.clone())
                        + self.positions.forward(batch.positions.clone());
                    let x = self
                        .layers
                        .forward($input::new(x).mask_attn(batch.causal.clone()));
                    let logits = self.head.forward(self.norm.forward(x));
                    $ce(logits.reshape([b * s, lm::VOCAB]), batch.targets.clone())
                }
            }
        }
    };
}

use burn_nn::transformer::{TransformerEncoder, TransformerEncoderInput};
use burn_nn::LayerNorm;
models!(
    nn_layers,
    TransformerEncoder,
    burn_nn::transformer::TransformerEncoderConfig,
    TransformerEncoderInput,
    LayerNorm,
    burn_nn::LayerNormConfig,
    |logits: Tensor<B, 2>, targets: Tensor<B, 1, Int>| {
        let device = logits.device();
        CrossEntropyLossConfig::new()
            .init(&device)
            .forward(logits, targets)
    }
);

mod fused_types {
    pub use burn_mlx::nn::{LayerNorm, TransformerEncoder, TransformerEncoderInput};
}
use fused_types::{
    LayerNorm as FusedLayerNorm, TransformerEncoder as FusedEncoder,
    TransformerEncoderInput as FusedInput,
};
models!(
    fused_layers,
    FusedEncoder,
    burn_mlx::nn::TransformerEncoderConfig,
    FusedInput,
    FusedLayerNorm,
    burn_mlx::nn::LayerNormConfig,
    cross_entropy
);

/// A decoder batch: ids `[batch, seq]`, targets, positions and the causal mask.
#[derive(Clone, Debug)]
pub struct LmData<B: Backend> {
    ids: Tensor<B, 2, Int>,
    targets: Tensor<B, 1, Int>,
    positions: Tensor<B, 2, Int>,
    causal: Tensor<B, 3, Bool>,
}

impl<B: Backend> LmData<B> {
    fn new(batch: usize, device: &B::Device) -> Self {
        let n = batch * lm::SEQ;
        let ids: Vec<i64> = (0..n).map(|i| (i * 7_919 % lm::VOCAB) as i64).collect();
        let targets: Vec<i64> = (0..n).map(|i| ((i * 31 + 7) % lm::VOCAB) as i64).collect();
        let positions: Vec<i64> = (0..lm::SEQ as i64).collect();
        Self {
            ids: Tensor::from_data(TensorData::new(ids, [batch, lm::SEQ]), device),
            targets: Tensor::from_data(TensorData::new(targets, [n]), device),
            positions: Tensor::from_data(TensorData::new(positions, [1, lm::SEQ]), device),
            causal: generate_autoregressive_mask(batch, lm::SEQ, device),
        }
    }
}

#[derive(Parser, Debug)]
#[command(
    about = "Training steps at real batch sizes: burn-nn layers against burn-mlx's fused layers, plain and overlapped"
)]
struct Args {
    /// `gpu` (the default when MLX has one) or `cpu`.
    #[arg(long)]
    device: Option<String>,
    /// Smaller batches (encoder 16 and 32, decoder 2 and 4) and fewer steps, for the CPU.
    #[arg(long)]
    quick: bool,
    /// Timed steps per row and variant (after the warm-up steps).
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Also time burn-nn's layers on burn-flex (the CPU peer).
    #[arg(long)]
    flex: bool,
    /// Write the rows as JSON here (for scripts/train_reference.py).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run only these rows, as `WORKLOAD:BATCH` (e.g. `decoder:32`); all rows when empty.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Run only these variants (`burn-nn`, `burn-nn+overlap`, `fused`, `fused+overlap`); all
    /// when empty.
    #[arg(long, value_delimiter = ',')]
    variants: Vec<String>,
    /// Untimed steps before the timed ones (the step counted for primitives is the last of
    /// them).
    #[arg(long, default_value_t = 12)]
    warmup: usize,
    /// Print the MLX primitives of the counted step by kind, most frequent first.
    #[arg(long)]
    primitives: bool,
    /// Run the fused layers on MLX's CPU device too (`burn_mlx::nn::fuse_on_cpu`), so that a CPU
    /// run builds the GPU's graphs.
    #[arg(long)]
    fuse_on_cpu: bool,
}

/// Whether `--primitives` was given.
static SHOW_PRIMITIVES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// One timed row.
struct Row {
    workload: String,
    batch: usize,
    variant: &'static str,
    ms: f64,
    samples_per_s: f64,
    build_ms: f64,
    start_ms: f64,
    wait_ms: f64,
    primitives: Option<usize>,
}

/// The MLX arrays of a module's parameters (for counting the primitives of a step).
struct Arrays(Vec<MlxTensor>);

impl<B: Backend> ModuleVisitor<B> for Arrays {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Ok(t) = to_mlx(param.val()) {
            self.0.push(t);
        }
    }
}

/// Median of `v`.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Times Adam steps of `model` on `loss`; `overlap` reads each loss after the next step has
/// started.
fn time_steps<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: M,
    loss: &dyn Fn(&M) -> Tensor<B, 1>,
    (warmup, steps): (usize, usize),
    variant: &str,
) -> (f64, f64, f64, f64, Option<usize>) {
    let overlap = variant.ends_with("overlap");
    if variant.starts_with("fused") {
        let optim = burn_mlx::optim::AdamConfig::new().init::<B, M>();
        time_with(model, optim, loss, (warmup, steps), overlap)
    } else {
        time_with(
            model,
            AdamConfig::new().init::<B, M>(),
            loss,
            (warmup, steps),
            overlap,
        )
    }
}

/// [`time_steps`] with optimizer `optim`.
fn time_with<B: AutodiffBackend, M: AutodiffModule<B>, O: Optimizer<M, B>>(
    mut model: M,
    mut optim: O,
    loss: &dyn Fn(&M) -> Tensor<B, 1>,
    (warmup, steps): (usize, usize),
    overlap: bool,
) -> (f64, f64, f64, f64, Option<usize>) {
    let show_primitives = SHOW_PRIMITIVES.load(std::sync::atomic::Ordering::Relaxed);
    let (mut total, mut build, mut start, mut wait) = (vec![], vec![], vec![], vec![]);
    let mut pending: Option<Tensor<B, 1>> = None;
    let mut primitives = None;
    for i in 0..warmup + steps {
        let t0 = Instant::now();
        let l = loss(&model);
        let grads = GradientsParams::from_grads(l.backward(), &model);
        model = optim.step(1e-3, model, grads);
        let t1 = Instant::now();
        if i + 1 == warmup {
            // One step's graph, counted before it is evaluated (the parameters and the loss).
            let mut arrays = Arrays(vec![]);
            model.valid().visit(&mut arrays);
            if let Ok(t) = to_mlx(l.clone().inner()) {
                arrays.0.push(t);
            }
            let refs: Vec<&MlxTensor> = arrays.0.iter().collect();
            let counts = pending_primitives(&refs).ok();
            if show_primitives {
                if let Some(counts) = &counts {
                    let mut by_count: Vec<_> = counts.iter().collect();
                    by_count.sort_by(|a, b| b.1.cmp(a.1));
                    let list: Vec<String> =
                        by_count.iter().map(|(k, n)| format!("{k} {n}")).collect();
                    println!("  primitives: {}", list.join(", "));
                }
            }
            primitives = counts.map(|m| m.values().sum::<usize>());
        }
        let t2;
        if overlap {
            burn_mlx::nn::start_step(&model, std::slice::from_ref(&l)).expect("start_step");
            t2 = Instant::now();
            if let Some(prev) = pending.replace(l) {
                let _ = prev.into_scalar().elem::<f64>();
            }
        } else {
            t2 = Instant::now();
            let _ = l.into_scalar().elem::<f64>();
        }
        let t3 = Instant::now();
        if i >= warmup {
            total.push((t3 - t0).as_secs_f64());
            build.push((t1 - t0).as_secs_f64());
            start.push((t2 - t1).as_secs_f64());
            wait.push((t3 - t2).as_secs_f64());
        }
    }
    if let Some(prev) = pending {
        let _ = prev.into_scalar().elem::<f64>();
    }
    (
        median(total) * 1e3,
        median(build) * 1e3,
        median(start) * 1e3,
        median(wait) * 1e3,
        primitives,
    )
}

/// Times every variant of the four rows on backend `B`; `variants` lists which.
fn run_rows<B: AutodiffBackend>(
    device: &B::Device,
    args: &Args,
    variants: &[&'static str],
    rows: &mut Vec<Row>,
) {
    let (enc_batches, dec_batches) = if args.quick {
        ([16, 32], [2, 4])
    } else {
        ([16, 128], [8, 32])
    };
    let mut record = |workload: &str,
                      batch: usize,
                      variant: &'static str,
                      r: (f64, f64, f64, f64, Option<usize>)| {
        let row = Row {
            workload: workload.to_string(),
            batch,
            variant,
            ms: r.0,
            samples_per_s: batch as f64 / (r.0 / 1e3),
            build_ms: r.1,
            start_ms: r.2,
            wait_ms: r.3,
            primitives: r.4,
        };
        println!(
            "{:<12} batch {:>3}  {:<16} {:>9.1} samples/s  {:>7.2} ms/step  (build {:.2}, start {:.2}, wait {:.2} ms; {} primitives)",
            row.workload,
            row.batch,
            row.variant,
            row.samples_per_s,
            row.ms,
            row.build_ms,
            row.start_ms,
            row.wait_ms,
            row.primitives.map_or("-".into(), |p| p.to_string())
        );
        rows.push(row);
    };
    let wanted = |workload: &str, batch: usize| {
        args.only.is_empty()
            || args
                .only
                .iter()
                .any(|o| *o == format!("{workload}:{batch}"))
    };
    let variants: Vec<&'static str> = variants
        .iter()
        .copied()
        .filter(|v| args.variants.is_empty() || args.variants.iter().any(|w| w == v))
        .collect();
    let counts = (args.warmup, args.steps);
    let shape = |b: usize| [b, Encoder::<B>::SEQ, Encoder::<B>::D_MODEL];
    for b in enc_batches.into_iter().filter(|&b| wanted("encoder", b)) {
        let x = Tensor::<B, 3>::random(shape(b), Distribution::Default, device);
        let target = Tensor::<B, 3>::random(shape(b), Distribution::Default, device);
        for &v in &variants {
            let r = if v.starts_with("fused") {
                let m = fused_layers::EncoderModel::<B>::new(device);
                time_steps(m, &|m| m.loss(x.clone(), target.clone()), counts, v)
            } else {
                let m = nn_layers::EncoderModel::<B>::new(device);
                time_steps(m, &|m| m.loss(x.clone(), target.clone()), counts, v)
            };
            record("encoder", b, v, r);
        }
    }
    for b in dec_batches.into_iter().filter(|&b| wanted("decoder", b)) {
        let data = LmData::<B>::new(b, device);
        for &v in &variants {
            let r = if v.starts_with("fused") {
                let m = fused_layers::DecoderModel::<B>::new(device);
                time_steps(m, &|m| m.loss(&data), counts, v)
            } else {
                let m = nn_layers::DecoderModel::<B>::new(device);
                time_steps(m, &|m| m.loss(&data), counts, v)
            };
            record("decoder", b, v, r);
        }
    }
}

fn main() {
    let args = Args::parse();
    let device = match args.device.as_deref() {
        Some("cpu") => MlxDevice::Cpu,
        Some("gpu") => MlxDevice::Gpu,
        None => MlxDevice::default(),
        Some(other) => {
            eprintln!("train_bench: unknown device `{other}` (gpu or cpu)");
            std::process::exit(2);
        }
    };
    println!(
        "Burn 0.21.0 + Mlx on {device:?}; {} timed steps per row after {} warm-up steps",
        args.steps, args.warmup
    );
    SHOW_PRIMITIVES.store(args.primitives, std::sync::atomic::Ordering::Relaxed);
    if args.fuse_on_cpu {
        burn_mlx::nn::fuse_on_cpu(true);
    }
    let mut rows = Vec::new();
    run_rows::<Autodiff<Mlx>>(
        &device,
        &args,
        &["burn-nn", "burn-nn+overlap", "fused", "fused+overlap"],
        &mut rows,
    );
    if args.flex {
        let mut flex_rows = Vec::new();
        run_rows::<Autodiff<Flex>>(&FlexDevice, &args, &["burn-flex"], &mut flex_rows);
        rows.extend(flex_rows);
    }
    if let Some(path) = &args.json {
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "workload": r.workload, "batch": r.batch, "variant": r.variant,
                    "ms": r.ms, "samples_per_s": r.samples_per_s, "build_ms": r.build_ms,
                    "start_ms": r.start_ms, "wait_ms": r.wait_ms, "primitives": r.primitives,
                })
            })
            .collect();
        let text = serde_json::json!({ "device": format!("{device:?}"), "rows": rows });
        if let Err(e) = std::fs::write(path, format!("{text:#}\n")) {
            eprintln!("train_bench: cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}
