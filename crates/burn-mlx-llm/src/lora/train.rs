//! The LoRA training loop: batches from [`super::data`], the loss of
//! [`Llm::loss`] over the target tokens, Burn's autodiff for the adapters' gradients, and
//! burn-mlx's Adam or AdamW (one compiled MLX kernel per parameter update on `Autodiff<Mlx>`,
//! burn-optim's elsewhere).
//!
//! [`train_compiled`] is the same loop on `Mlx` with the whole step (forward, MLX's backward,
//! Adam) traced once per padded batch shape and replayed by MLX (`burn_mlx::grad::CompiledTrainer`),
//! as `mlx_lm.lora` compiles its step: no Burn autodiff graph is built per step.
//!
//! Each optimizer step is started on the device before the host reads anything, and losses are
//! read back only when a report is due, so on MLX the host builds step n+1 while the device runs
//! step n.

use super::data::{Batch, Batches};
use super::{Adapters, Lora};
use crate::error::{LlmError, Result};
use crate::model::{Llm, Logits};
use burn_mlx::grad::{AdamSettings, CompiledTrainer};
use burn_mlx::optim::{Adam, AdamConfig, AdamW, AdamWConfig, FusedAdaptor};
use burn_mlx::{from_mlx, to_mlx, Mlx, MlxError, MlxTensor};
use burn_optim::{GradientsAccumulator, GradientsParams, Optimizer};
use burn_tensor::backend::{AutodiffBackend, Backend};
use burn_tensor::{ElementConversion, Int, Tensor, TensorData};
use std::time::Instant;

/// The optimizer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptimizerKind {
    /// Adam.
    Adam,
    /// AdamW with this decoupled weight decay.
    AdamW {
        /// The decay factor (per unit of learning rate).
        weight_decay: f32,
    },
}

/// The learning rate over optimizer steps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Schedule {
    /// The same rate at every step.
    Constant,
    /// A linear warm-up from 0 over `warmup` steps, then a cosine decay to `end` over the
    /// remaining steps (mlx-lm's `cosine_decay` joined to a `linear_schedule`).
    Cosine {
        /// Warm-up steps.
        warmup: usize,
        /// The final rate.
        end: f64,
    },
}

/// Settings of a training run (mlx-lm's `lora` arguments).
#[derive(Debug, Clone)]
pub struct TrainConfig {
    /// Optimizer steps.
    pub iters: usize,
    /// Sequences per micro-batch.
    pub batch_size: usize,
    /// Micro-batches whose gradients are averaged into one optimizer step.
    pub grad_accumulation: usize,
    /// The peak learning rate.
    pub learning_rate: f64,
    /// How the rate changes over the steps.
    pub schedule: Schedule,
    /// Adam or AdamW.
    pub optimizer: OptimizerKind,
    /// Adam's `beta_1`, `beta_2` and `epsilon`.
    pub betas: (f32, f32),
    /// Adam's epsilon.
    pub epsilon: f32,
    /// Report the training loss every this many steps.
    pub steps_per_report: usize,
    /// Compute the validation loss every this many steps (and after the first and last).
    pub steps_per_eval: usize,
    /// Validation batches per evaluation (`None`: all of them).
    pub val_batches: Option<usize>,
    /// Longest sequence, in tokens (longer ones are truncated).
    pub max_seq_length: usize,
    /// Train on completions only (the prompt tokens get no loss).
    pub mask_prompt: bool,
    /// Seed of the batch order and of the adapters' initial values.
    pub seed: u64,
    /// [`train_compiled`] only: start each step before the previous one has finished on the
    /// device. Faster where the host is the bottleneck; two steps' buffers are then alive at once
    /// (up to 1.8x the peak memory on an H200 at the `qwen3-0.6b` shape). [`train`] always
    /// starts the next step early: Burn's graph building keeps it behind the device.
    pub pipeline: bool,
}

impl Default for TrainConfig {
    /// mlx-lm's defaults: 1,000 iterations of batch 4 at 1e-5, Adam, reports every 10 steps,
    /// validation every 200 steps on 25 batches, sequences up to 2,048 tokens.
    fn default() -> Self {
        Self {
            iters: 1000,
            batch_size: 4,
            grad_accumulation: 1,
            learning_rate: 1e-5,
            schedule: Schedule::Constant,
            optimizer: OptimizerKind::Adam,
            betas: (0.9, 0.999),
            epsilon: 1e-8,
            steps_per_report: 10,
            steps_per_eval: 200,
            val_batches: Some(25),
            max_seq_length: 2048,
            mask_prompt: false,
            seed: 0,
            pipeline: false,
        }
    }
}

impl TrainConfig {
    /// The learning rate of optimizer step `step` (from 0).
    pub fn lr_at(&self, step: usize) -> f64 {
        match self.schedule {
            Schedule::Constant => self.learning_rate,
            Schedule::Cosine { warmup, end } => {
                if step < warmup {
                    return self.learning_rate * step as f64 / warmup as f64;
                }
                let decay = self.iters.saturating_sub(warmup).max(1);
                let t = (step - warmup).min(decay) as f64 / decay as f64;
                end + 0.5 * (self.learning_rate - end) * (1.0 + (std::f64::consts::PI * t).cos())
            }
        }
    }

    /// Checks the settings.
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(LlmError::Input(m));
        if self.iters == 0 || self.batch_size == 0 || self.grad_accumulation == 0 {
            return bad(format!(
                "iters ({}), batch size ({}) and gradient accumulation steps ({}) must be at \
                 least 1",
                self.iters, self.batch_size, self.grad_accumulation
            ));
        }
        if !(self.learning_rate > 0.0 && self.learning_rate.is_finite()) {
            return bad(format!(
                "learning rate must be positive, got {}",
                self.learning_rate
            ));
        }
        if self.max_seq_length < 2 {
            return bad(format!(
                "max sequence length must be at least 2 tokens, got {}",
                self.max_seq_length
            ));
        }
        Ok(())
    }
}

/// What the loop reports.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The mean training loss since the last report (token-weighted), with throughput.
    Train {
        /// Optimizer steps done.
        step: usize,
        /// Mean loss per target token.
        loss: f64,
        /// The learning rate of the last step.
        learning_rate: f64,
        /// Optimizer steps per second since the last report.
        steps_per_sec: f64,
        /// Target tokens per second since the last report.
        tokens_per_sec: f64,
        /// Target tokens trained on so far.
        trained_tokens: usize,
        /// MLX's allocator peak so far, bytes (0 off MLX).
        peak_memory: usize,
    },
    /// The validation loss.
    Validation {
        /// Optimizer steps done.
        step: usize,
        /// Mean loss per target token.
        loss: f64,
        /// Seconds the evaluation took.
        seconds: f64,
    },
}

/// The tensors of a batch: tokens `[batch, seq]`, the flat rows whose logits predict a target,
/// and the targets.
pub struct BatchTensors<B: Backend> {
    /// `[batch, seq]`.
    pub tokens: Tensor<B, 2, Int>,
    /// Flat positions `row·seq + j - 1` of the logits that predict each target.
    pub rows: Tensor<B, 1, Int>,
    /// The target ids.
    pub targets: Tensor<B, 1, Int>,
    /// How many targets.
    pub count: usize,
}

impl<B: Backend> BatchTensors<B> {
    /// `batch` on `device`. Errors when the batch has no target token.
    pub fn new(batch: &Batch, device: &B::Device) -> Result<Self> {
        let targets = batch.targets();
        if targets.is_empty() {
            return Err(no_targets(batch));
        }
        let ids: Vec<i64> = batch.tokens.iter().map(|&t| t as i64).collect();
        let count = targets.len();
        let rows: Vec<i64> = targets.iter().map(|&(r, _)| r as i64).collect();
        let tgt: Vec<i64> = targets.iter().map(|&(_, t)| t as i64).collect();
        Ok(Self {
            tokens: Tensor::from_data(TensorData::new(ids, [batch.batch, batch.seq]), device),
            rows: Tensor::from_data(TensorData::new(rows, [count]), device),
            targets: Tensor::from_data(TensorData::new(tgt, [count]), device),
            count,
        })
    }
}

/// The tensors of a batch for a step whose shapes depend only on the batch's padded shape
/// ([`Llm::loss_weighted`], [`train_compiled`]): tokens `[batch, seq]`, and for every flat
/// position `row·seq + j` the token it predicts and a weight, `1/count` where that token is a
/// target and 0 elsewhere.
pub struct WeightedBatch<B: Backend> {
    /// `[batch, seq]`.
    pub tokens: Tensor<B, 2, Int>,
    /// `[batch·seq]`: the token at the next position (0 where there is none).
    pub targets: Tensor<B, 1, Int>,
    /// `[batch·seq]`.
    pub weights: Tensor<B, 1>,
    /// How many targets.
    pub count: usize,
}

impl<B: Backend> WeightedBatch<B> {
    /// `batch` on `device`. Errors when the batch has no target token.
    pub fn new(batch: &Batch, device: &B::Device) -> Result<Self> {
        let found = batch.targets();
        if found.is_empty() {
            return Err(no_targets(batch));
        }
        let n = batch.batch * batch.seq;
        let (mut targets, mut weights) = (vec![0i64; n], vec![0f32; n]);
        let weight = 1.0 / found.len() as f32;
        for &(row, token) in &found {
            targets[row] = token as i64;
            weights[row] = weight;
        }
        let ids: Vec<i64> = batch.tokens.iter().map(|&t| t as i64).collect();
        Ok(Self {
            tokens: Tensor::from_data(TensorData::new(ids, [batch.batch, batch.seq]), device),
            targets: Tensor::from_data(TensorData::new(targets, [n]), device),
            weights: Tensor::from_data(TensorData::new(weights, [n]), device),
            count: found.len(),
        })
    }
}

/// The error for a batch without a target token.
fn no_targets(batch: &Batch) -> LlmError {
    LlmError::Input(format!(
        "a batch of {} sequences has no target token (every token is prompt, or the sequences \
         have one token each)",
        batch.batch
    ))
}

/// Adam or AdamW over the adapters.
enum Optim<B: AutodiffBackend> {
    Adam(FusedAdaptor<Adam, Adapters<B>, B>),
    AdamW(FusedAdaptor<AdamW, Adapters<B>, B>),
}

impl<B: AutodiffBackend> Optim<B> {
    fn new(config: &TrainConfig) -> Self {
        let (b1, b2) = config.betas;
        match config.optimizer {
            OptimizerKind::Adam => Optim::Adam(
                AdamConfig::new()
                    .with_beta_1(b1)
                    .with_beta_2(b2)
                    .with_epsilon(config.epsilon)
                    .init(),
            ),
            OptimizerKind::AdamW { weight_decay } => Optim::AdamW(
                AdamWConfig::new()
                    .with_beta_1(b1)
                    .with_beta_2(b2)
                    .with_epsilon(config.epsilon)
                    .with_weight_decay(weight_decay)
                    .init(),
            ),
        }
    }

    fn step(&mut self, lr: f64, adapters: Adapters<B>, grads: GradientsParams) -> Adapters<B> {
        match self {
            Optim::Adam(o) => o.step(lr, adapters, grads),
            Optim::AdamW(o) => o.step(lr, adapters, grads),
        }
    }
}

/// The mean loss per target token of `model` (adapters installed) over `batches` (at most
/// `limit` of them), and the number of target tokens.
pub fn evaluate<B: Backend>(
    model: &Llm<B>,
    batches: &[Batch],
    limit: Option<usize>,
) -> Result<(f64, usize)> {
    let (mut sum, mut total) = (0.0f64, 0usize);
    for batch in batches.iter().take(limit.unwrap_or(usize::MAX)) {
        let t = BatchTensors::<B>::new(batch, model.device())?;
        // Read per batch: one batch's activations alive at a time, not every batch's at once.
        let loss: f64 = model
            .loss(t.tokens, t.rows, t.targets)?
            .into_scalar()
            .elem();
        sum += loss * t.count as f64;
        total += t.count;
    }
    if total == 0 {
        return Err(LlmError::Input("validation: no batch to evaluate".into()));
    }
    Ok((sum / total as f64, total))
}

/// The losses and tokens since the last report, and the clock.
struct Progress<B: Backend> {
    /// Each micro-batch's summed loss (mean times its target count), unread.
    pending: Vec<Tensor<B, 1>>,
    pending_tokens: usize,
    trained_tokens: usize,
    since: Instant,
    steps_since: usize,
}

impl<B: Backend> Progress<B> {
    fn new() -> Self {
        Self {
            pending: vec![],
            pending_tokens: 0,
            trained_tokens: 0,
            since: Instant::now(),
            steps_since: 0,
        }
    }

    /// Records a micro-batch's mean loss over `count` targets (not read here).
    fn add(&mut self, loss: Tensor<B, 1>, count: usize) {
        self.pending.push(loss * count as f64);
        self.pending_tokens += count;
    }

    /// After optimizer step `done` (from 1) at rate `lr`: reports the training loss when one
    /// is due (reading the pending losses), then the validation loss when one is due.
    fn after_step(
        &mut self,
        done: usize,
        lr: f64,
        config: &TrainConfig,
        on_event: &mut dyn FnMut(&Event),
        validate: &mut dyn FnMut() -> Result<Event>,
    ) -> Result<()> {
        self.steps_since += 1;
        if done.is_multiple_of(config.steps_per_report.max(1)) || done == config.iters {
            let sum: f64 = Tensor::cat(std::mem::take(&mut self.pending), 0)
                .sum()
                .into_scalar()
                .elem();
            let seconds = self.since.elapsed().as_secs_f64();
            self.trained_tokens += self.pending_tokens;
            on_event(&Event::Train {
                step: done,
                loss: sum / self.pending_tokens as f64,
                learning_rate: lr,
                steps_per_sec: self.steps_since as f64 / seconds,
                tokens_per_sec: self.pending_tokens as f64 / seconds,
                trained_tokens: self.trained_tokens,
                peak_memory: burn_mlx::peak_memory(),
            });
            self.pending_tokens = 0;
            self.steps_since = 0;
            self.since = Instant::now();
        }
        if config.steps_per_eval > 0
            && (done.is_multiple_of(config.steps_per_eval) || done == config.iters)
        {
            on_event(&validate()?);
            self.since = Instant::now();
        }
        Ok(())
    }
}

/// The validation loss of `model` with `lora` installed (without dropout) after `step` steps.
fn validation<B: Backend>(
    model: &mut Llm<B>,
    lora: &Lora<B>,
    batches: &[Batch],
    config: &TrainConfig,
    step: usize,
) -> Result<Event> {
    let start = Instant::now();
    lora.install(model, false)?;
    let (loss, _) = evaluate(model, batches, config.val_batches)?;
    Ok(Event::Validation {
        step,
        loss,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Trains `lora`'s adapters on `model` (base weights frozen) for `config.iters` optimizer
/// steps over `train`, evaluating on `valid`, calling `on_event` with each report; after each
/// step `on_step(step, &lora)` may save a checkpoint. Leaves the trained adapters installed
/// in `model` (without dropout).
pub fn train<B: AutodiffBackend>(
    model: &mut Llm<B>,
    lora: &mut Lora<B>,
    train: &mut Batches,
    valid: &Batches,
    config: &TrainConfig,
    on_event: &mut dyn FnMut(&Event),
    on_step: &mut dyn FnMut(usize, &Lora<B>) -> Result<()>,
) -> Result<()> {
    config.check()?;
    let device = model.device().clone();
    let valid_batches = valid.all();
    let mut optim = Optim::<B>::new(config);
    if config.steps_per_eval > 0 {
        on_event(&validation(model, lora, &valid_batches, config, 0)?);
    }
    lora.install(model, true)?;
    let mut progress = Progress::new();
    for step in 0..config.iters {
        let lr = config.lr_at(step);
        let mut accumulator = GradientsAccumulator::<Adapters<B>>::new();
        for _ in 0..config.grad_accumulation {
            let batch = train.next_batch();
            let t = BatchTensors::<B>::new(&batch, &device)?;
            let loss = model.loss(t.tokens, t.rows, t.targets)?;
            // Start the forward pass on the device before the backward graph is built: the
            // host builds the backward while the device runs the forward, and the forward's
            // transients (the f32 copy of the logits for their log-sum-exp) are freed before
            // the backward's are allocated. On the H200 this took the qwen3-0.6b step's peak
            // from 8.4-11.4 GB to 6.8-7.8 GB.
            burn_mlx::fast::start_eval(&loss.clone().inner())?;
            let scaled = loss.clone() / config.grad_accumulation as f64;
            let grads = GradientsParams::from_grads(scaled.backward(), &lora.adapters);
            accumulator.accumulate(&lora.adapters, grads);
            progress.add(loss.detach(), t.count);
        }
        let adapters = std::mem::replace(
            &mut lora.adapters,
            Adapters {
                a: vec![],
                b: vec![],
            },
        );
        lora.adapters = optim.step(lr, adapters, accumulator.grads());
        lora.install(model, true)?;
        burn_mlx::nn::start_step(&lora.adapters, &progress.pending)?;
        let done = step + 1;
        progress.after_step(done, lr, config, on_event, &mut || {
            let event = validation(model, lora, &valid_batches, config, done)?;
            lora.install(model, true)?;
            Ok(event)
        })?;
        on_step(done, lora)?;
    }
    lora.install(model, false)
}

/// [`train`] on `Mlx` with each step compiled whole by MLX
/// ([`burn_mlx::grad::CompiledTrainer`]): the forward pass, MLX's own backward pass and the Adam
/// or AdamW update are traced at the first batch of each padded shape and replayed for the next
/// ones, so the host builds no graph per step (as `mlx_lm.lora` compiles its step). The loss is
/// [`Llm::loss_weighted`], the same mean over the target tokens as [`train`]'s. Same events, same
/// checkpoints, same result; leaves the trained adapters installed in `model`. Each step finishes
/// on the device before the next starts unless `config.pipeline` is set.
///
/// # Errors
///
/// As [`train`]; also when `config` asks for gradient accumulation or `lora` for dropout, which
/// this loop does not do (use [`train`] on `Autodiff<Mlx>`).
pub fn train_compiled(
    model: &mut Llm<Mlx>,
    lora: &mut Lora<Mlx>,
    train: &mut Batches,
    valid: &Batches,
    config: &TrainConfig,
    on_event: &mut dyn FnMut(&Event),
    on_step: &mut dyn FnMut(usize, &Lora<Mlx>) -> Result<()>,
) -> Result<()> {
    config.check()?;
    if config.grad_accumulation != 1 || lora.config.dropout != 0.0 {
        return Err(LlmError::Input(format!(
            "the compiled trainer takes one batch per step and no adapter dropout (asked: {} \
             accumulated batches, dropout {}): train on Autodiff<Mlx> (`lora --trainer autodiff`)",
            config.grad_accumulation, lora.config.dropout
        )));
    }
    let device = *model.device();
    let valid_batches = valid.all();
    if config.steps_per_eval > 0 {
        on_event(&validation(model, lora, &valid_batches, config, 0)?);
    }
    let (b1, b2) = config.betas;
    let adam = AdamSettings {
        beta_1: b1,
        beta_2: b2,
        epsilon: config.epsilon,
        weight_decay: match config.optimizer {
            OptimizerKind::Adam => 0.0,
            OptimizerKind::AdamW { weight_decay } => weight_decay,
        },
    };
    // The traced loss adds the adapters it is given to a copy of the base model (the model's
    // weights are constants of the trace; only the adapters are its parameters). A weight still
    // lazy when the step is traced (random, quantized or concatenated at load) would be traced
    // with the ops that make it and remade at every step: a one-token forward pass reads every
    // weight, and evaluating it gives each its values.
    let mut probe = model.new_cache(1);
    model.forward(&[0], &mut probe, Logits::Last)?.into_data();
    let mut base = model.clone();
    lora.uninstall(&mut base);
    let (lora_config, targets) = (lora.config.clone(), lora.targets.clone());
    let step_loss = move |adapters: &Adapters<Mlx>, batch: &[MlxTensor]| {
        let fail = |message: String| MlxError::Mlx {
            op: "LoRA training step".into(),
            message,
        };
        let adapted = Lora {
            config: lora_config.clone(),
            targets: targets.clone(),
            adapters: adapters.clone(),
        };
        let mut model = base.clone();
        adapted
            .install(&mut model, true)
            .map_err(|e| fail(e.to_string()))?;
        let missing = || fail("the batch is tokens, targets and weights".into());
        let tokens = from_mlx::<Mlx, 2, Int>(batch[0].clone()).ok_or_else(missing)?;
        let targets = from_mlx::<Mlx, 1, Int>(batch[1].clone()).ok_or_else(missing)?;
        let weights =
            from_mlx::<Mlx, 1, burn_tensor::Float>(batch[2].clone()).ok_or_else(missing)?;
        model
            .loss_weighted(tokens, targets, weights)
            .map_err(|e| fail(e.to_string()))
    };
    let mut trainer = CompiledTrainer::try_new(lora.adapters.clone(), adam, step_loss)?;
    let mut progress = Progress::<Mlx>::new();
    for step in 0..config.iters {
        let lr = config.lr_at(step);
        let batch = train.next_batch();
        let t = WeightedBatch::<Mlx>::new(&batch, &device)?;
        let inputs = [
            mlx_of(to_mlx(t.tokens)),
            mlx_of(to_mlx(t.targets)),
            mlx_of(to_mlx(t.weights)),
        ];
        let loss = trainer.step(lr, &inputs)?;
        progress.add(loss, t.count);
        match config.pipeline {
            true => trainer.start(&progress.pending)?,
            false => trainer.finish(&progress.pending)?,
        }
        lora.adapters = trainer.model();
        let done = step + 1;
        progress.after_step(done, lr, config, on_event, &mut || {
            validation(model, lora, &valid_batches, config, done)
        })?;
        on_step(done, lora)?;
    }
    lora.install(model, false)
}

/// The MLX tensor of an `Mlx` tensor ([`to_mlx`] never hands an `Mlx` tensor back).
fn mlx_of<T>(converted: std::result::Result<MlxTensor, T>) -> MlxTensor {
    converted.unwrap_or_else(|_| unreachable!("an Mlx tensor is an MLX tensor"))
}
