//! The generation loop: prefill the prompt into the cache, then decode one token at a time until
//! an end-of-sequence token or the token budget, handing each token to a callback as soon as it
//! is known (so callers can stream it), and timing the two phases the way `mlx_lm.generate`
//! reports them.

use super::cache::KvCache;
use super::error::{LlmError, Result};
use super::model::Logits;
use super::sampling::Sampler;
use super::step::{mlx_device, Decoder};
use burn_mlx::decode::greedy_tokens;
use burn_tensor::backend::Backend;
use burn_tensor::{BasicOps, DType, Int, Tensor, TensorData};
use std::time::{Duration, Instant};

/// The most prompt positions per prefill step: a longer prompt is run in chunks (the last may
/// be shorter), which bounds the memory of attention's scores (attention without a fused kernel
/// holds `batch × heads × chunk × context` of them). On an MLX GPU every chunk is this long;
/// elsewhere [`prefill_chunk`] may take shorter ones. mlx-lm's `prefill_step_size` is the same
/// setting (2,048 there).
pub const PREFILL_CHUNK: usize = 512;

/// Bytes of attention scores (counted at 4 bytes each) that one prefill chunk may hold off the
/// GPU. With burn-mlx's CPU primitives (fewer, larger ones than MLX's composed ops) more than one
/// layer's scores are in memory at once, likely because MLX's CPU evaluation allocates outputs as
/// it dispatches ahead of its worker thread: at 16 MiB the peak at 2,048 positions of the `small`
/// preset (`--prompt-len 1920 --max-tokens 128`) was 1.33x weights + KV cache, at 8 MiB 1.14x
/// (benches/llm.md, 2026-12-02).
const SCORE_BYTES: usize = 8 << 20;

/// Prompt positions per prefill step for `batch` prompts of `width` positions and `heads` query
/// heads on `device`: [`PREFILL_CHUNK`] on an MLX GPU; elsewhere (MLX's CPU and other backends,
/// whose attention forms its scores as arrays) the largest power of two up to
/// [`PREFILL_CHUNK`], and at least 64, whose scores over the whole prompt fit in 8 MiB. The
/// memory peak then stays near weights + KV cache on a CPU at long prompts, at no measured cost
/// in prefill speed (benches/llm.md, "prefill chunks").
pub fn prefill_chunk<B: Backend>(
    device: &B::Device,
    batch: usize,
    heads: usize,
    width: usize,
) -> usize {
    if mlx_device::<B>(device) == Some(burn_mlx::MlxDevice::Gpu) {
        return PREFILL_CHUNK;
    }
    let fit = SCORE_BYTES / (batch * heads * width * 4).max(1);
    (1usize << fit.max(1).ilog2()).clamp(64, PREFILL_CHUNK)
}

/// How to generate.
pub struct GenerateOptions<'a> {
    /// The most tokens to generate (the end-of-sequence token, when met, is not counted).
    pub max_tokens: usize,
    /// Tokens that end generation (empty: run to `max_tokens`).
    pub stop_tokens: &'a [u32],
    /// How each token is chosen.
    pub sampler: Sampler,
    /// Reads the backend's own memory figure in bytes (on `Mlx`, its allocator's peak), sampled
    /// after every token; `None` when the backend has no such counter and the process's peak RSS
    /// is what is reported.
    pub device_memory: Option<&'a dyn Fn() -> u64>,
}

/// What one generation measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// Sequences generated together (1 but for [`generate_batch`]).
    pub sequences: usize,
    /// Tokens in the prompt (in all prompts, padding excluded).
    pub prompt_tokens: usize,
    /// Tokens generated (in all sequences; end-of-sequence tokens excluded).
    pub generated_tokens: usize,
    /// From the start of prefill until the first generated token was on the host.
    pub time_to_first_token: Duration,
    /// One-token forward passes after the first token (each produced one token per sequence,
    /// the end-of-sequence token included).
    pub decode_steps: usize,
    /// From the first generated token until the last decode step's token was on the host.
    pub decode_time: Duration,
    /// The largest value of [`GenerateOptions::device_memory`] seen, if it was given.
    pub device_memory_peak: Option<u64>,
    /// The process's peak resident set (`VmHWM`), if the platform reports it.
    pub rss_peak: Option<u64>,
    /// Where the host's time went in the greedy decode loop, summed over its steps (zero for
    /// sampled generation).
    pub host: HostTimes,
}

/// The host's time in the greedy decode loop, summed over steps.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostTimes {
    /// Building each step's graph (the model's forward pass and the argmax, through Burn).
    pub build: Duration,
    /// Starting each step ([`burn_mlx::fast::start_eval`]: on MLX's CUDA backend, where the
    /// step's kernels are launched).
    pub start: Duration,
    /// Waiting for each token to reach the host.
    pub wait: Duration,
}

impl Stats {
    /// Prompt tokens per second of time to first token.
    pub fn prefill_tokens_per_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.time_to_first_token.as_secs_f64()
    }

    /// Decode steps per second, the tokens per second of each sequence (the first token comes
    /// out of prefill and is not counted).
    pub fn decode_tokens_per_s(&self) -> f64 {
        if self.decode_steps == 0 || self.decode_time.is_zero() {
            return 0.0;
        }
        self.decode_steps as f64 / self.decode_time.as_secs_f64()
    }

    /// Decoded tokens per second over all sequences: [`decode_tokens_per_s`]
    /// (Self::decode_tokens_per_s) times the batch (a finished sequence keeps its row until the
    /// batch ends, so this counts the rows the steps computed).
    pub fn total_decode_tokens_per_s(&self) -> f64 {
        self.decode_tokens_per_s() * self.sequences as f64
    }

    /// The host's time per decode step, by phase (`None` when the loop was not the greedy one).
    pub fn host_per_step(&self) -> Option<String> {
        if self.decode_steps == 0 || self.host == HostTimes::default() {
            return None;
        }
        let us = |d: Duration| d.as_secs_f64() * 1e6 / self.decode_steps as f64;
        Some(format!(
            "host per decode step: build {:.0} us, start {:.0} us, wait {:.0} us",
            us(self.host.build),
            us(self.host.start),
            us(self.host.wait)
        ))
    }

    /// One line: prompt and generated tokens, time to first token, prefill and decode rates,
    /// peak memory.
    pub fn summary(&self) -> String {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let memory = match (self.device_memory_peak, self.rss_peak) {
            (Some(dev), Some(rss)) => format!(
                "peak memory {:.1} MiB (backend's peak; process RSS peak {:.1} MiB)",
                mib(dev),
                mib(rss)
            ),
            (Some(dev), None) => format!("peak memory {:.1} MiB (backend)", mib(dev)),
            (None, Some(rss)) => format!("peak memory {:.1} MiB (process RSS)", mib(rss)),
            (None, None) => "peak memory unknown".to_string(),
        };
        let decode = if self.sequences > 1 {
            format!(
                "batch {} | decode {:.2} tok/s per sequence, {:.1} tok/s in all",
                self.sequences,
                self.decode_tokens_per_s(),
                self.total_decode_tokens_per_s()
            )
        } else {
            format!("decode {:.2} tok/s", self.decode_tokens_per_s())
        };
        format!(
            "prompt {} tokens, generated {} tokens | time to first token {:.3} s | \
             prefill {:.1} tok/s | {decode} | {memory}",
            self.prompt_tokens,
            self.generated_tokens,
            self.time_to_first_token.as_secs_f64(),
            self.prefill_tokens_per_s(),
        )
    }
}

/// The process's peak resident set size in bytes (`VmHWM` of `/proc/self/status`).
pub fn rss_peak_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Reads a tensor back, turning a backend failure into an error.
fn read<B: Backend, const D: usize, K: BasicOps<B>>(
    t: Tensor<B, D, K>,
    what: &str,
) -> Result<TensorData> {
    t.try_into_data()
        .map_err(|e| LlmError::Input(format!("reading the {what} back failed: {e:?}")))
}

/// Chooses the next token of each row of logits `[rows, vocab]`: greedy on the device (one
/// integer per row comes back), sampling on the host.
pub fn next_tokens<B: Backend>(logits: Tensor<B, 2>, sampler: &mut Sampler) -> Result<Vec<u32>> {
    if sampler.is_greedy() {
        return read_tokens(greedy_tokens(logits));
    }
    let [_, vocab] = logits.dims();
    let data = read(logits.cast(DType::F32), "logits")?.convert::<f32>();
    let values = data
        .to_vec::<f32>()
        .map_err(|e| LlmError::Input(format!("logits: {e:?}")))?;
    Ok(values
        .chunks(vocab)
        .map(|row| sampler.sample(row))
        .collect())
}

/// Greedy decoding with the device kept busy, for one or several sequences (`tokens.len()`
/// rows): each step's graph is built by `step` from the previous step's argmax while it is
/// still on the device, and started ([`burn_mlx::fast::start_eval`], which does nothing on
/// backends other than `Mlx`) before that previous token is read back, as `mlx_lm.generate`
/// does. A row ends at a stop token (its later tokens are dropped); the loop ends when every row
/// has, or at the token budget. Returns when the first tokens were on the host, the host's
/// times, and whether a step was built past the end (its position is to be taken back out of
/// the cache). `step_done(i)` runs after the `i`-th tokens after the first.
fn greedy_pipelined<B: Backend>(
    step: &mut dyn FnMut(Tensor<B, 2, Int>) -> Result<Tensor<B, 2>>,
    logits: Tensor<B, 2>,
    options: &GenerateOptions,
    tokens: &mut [Vec<u32>],
    on_token: &mut dyn FnMut(usize, u32) -> Result<()>,
    step_done: &mut dyn FnMut(usize),
) -> Result<(Instant, HostTimes, bool)> {
    let mut host = HostTimes::default();
    let start_eval = |t: &Tensor<B, 2, Int>| {
        burn_mlx::fast::start_eval(t)
            .map_err(|e| LlmError::Input(format!("starting a decode step failed: {e}")))
    };
    let mut current = greedy_tokens(logits);
    start_eval(&current)?;
    let mut first: Option<Instant> = None;
    let mut done = vec![false; tokens.len()];
    let mut read = 0;
    loop {
        // One more step is needed unless these tokens fill the budget.
        let t0 = Instant::now();
        let next = if read + 1 < options.max_tokens {
            let next = greedy_tokens(step(current.clone())?);
            let t1 = Instant::now();
            start_eval(&next)?;
            if first.is_some() {
                host.build += t1 - t0;
                host.start += t1.elapsed();
            }
            Some(next)
        } else {
            None
        };
        let t2 = Instant::now();
        let ids = read_tokens(current)?;
        match first {
            None => first = Some(Instant::now()),
            Some(_) => {
                host.wait += t2.elapsed();
                step_done(read)
            }
        }
        read += 1;
        hand_out(&ids, options.stop_tokens, &mut done, tokens, on_token)?;
        let first = first.expect("the loop reads at least one token");
        match next {
            Some(_) if done.iter().all(|&d| d) => return Ok((first, host, true)),
            Some(next) => current = next,
            None => return Ok((first, host, false)),
        }
    }
}

/// Gives each unfinished row its token (`ids[row]`): a stop token finishes the row, any other is
/// kept and handed to `on_token`.
fn hand_out(
    ids: &[u32],
    stop_tokens: &[u32],
    done: &mut [bool],
    tokens: &mut [Vec<u32>],
    on_token: &mut dyn FnMut(usize, u32) -> Result<()>,
) -> Result<()> {
    for (row, &token) in ids.iter().enumerate() {
        if done[row] {
            continue;
        }
        if stop_tokens.contains(&token) {
            done[row] = true;
            continue;
        }
        tokens[row].push(token);
        on_token(row, token)?;
    }
    Ok(())
}

/// Reads token ids (`[rows, 1]`) back from the device.
fn read_tokens<B: Backend>(ids: Tensor<B, 2, Int>) -> Result<Vec<u32>> {
    let rows = ids.dims()[0];
    let data = read(ids, "argmax")?;
    let ids: Vec<u32> = data.iter::<i64>().map(|id| id as u32).collect();
    if ids.len() != rows {
        return Err(LlmError::Input(format!(
            "argmax returned {} ids for {rows} rows",
            ids.len()
        )));
    }
    Ok(ids)
}

/// Generates after `prompt`, which is written into `cache` (it must be empty or hold the
/// sequence `prompt` continues) by `decoder`'s model; the prompt is prefilled eagerly, and
/// every later token runs as a step of `decoder`. `on_token` receives every generated token as
/// soon as it is known, and may stop generation by returning an error.
pub fn generate<B: Backend>(
    decoder: &mut Decoder<B>,
    cache: &mut KvCache<B>,
    prompt: &[u32],
    options: &mut GenerateOptions,
    on_token: &mut dyn FnMut(u32) -> Result<()>,
) -> Result<(Vec<u32>, Stats)> {
    if cache.batch() != 1 {
        return Err(LlmError::Input(format!(
            "generate: the cache holds {} sequences; generate_batch decodes a batch",
            cache.batch()
        )));
    }
    let (mut tokens, stats) = run(decoder, cache, &[prompt], options, &mut |_, t| on_token(t))?;
    Ok((tokens.remove(0), stats))
}

/// Generates after each of `prompts` together, as `mlx_lm.batch_generate` does: one forward
/// pass per step for the whole batch, so that the host's work per step (the bound of a small
/// model's decoding on a GPU) is shared by the sequences. `cache` must be empty and made for
/// `prompts.len()` sequences ([`Llm::new_batch_cache`](super::model::Llm::new_batch_cache)).
///
/// Shorter prompts are padded on the left, and attention hides the padding
/// ([`KvCache::set_padding`]), so each sequence gets the tokens it would get alone, within
/// rounding. Steps are eager ([`Llm::forward_ids`]) whatever `decoder`'s kind: the fixed-shape
/// step is for one sequence. A sequence that meets a stop token is finished, and its row keeps
/// running until every sequence is finished or `max_tokens` are generated. `on_token(i, token)`
/// receives the tokens of sequence `i` as they are known.
pub fn generate_batch<B: Backend>(
    decoder: &mut Decoder<B>,
    cache: &mut KvCache<B>,
    prompts: &[&[u32]],
    options: &mut GenerateOptions,
    on_token: &mut dyn FnMut(usize, u32) -> Result<()>,
) -> Result<(Vec<Vec<u32>>, Stats)> {
    if prompts.len() != cache.batch() {
        return Err(LlmError::Input(format!(
            "generate_batch: {} prompts for a cache of {} sequences (make it with \
             Llm::new_batch_cache({}, ...))",
            prompts.len(),
            cache.batch(),
            prompts.len()
        )));
    }
    if !cache.is_empty() {
        return Err(LlmError::Input(format!(
            "generate_batch: the cache already holds {} positions; reset it first",
            cache.len()
        )));
    }
    run(decoder, cache, prompts, options, on_token)
}

/// Runs one decode step of `decoder` over `ids` (`[batch, 1]`): the decoder's own step for one
/// sequence, an eager step for several.
fn decode_step<B: Backend>(
    decoder: &mut Decoder<B>,
    cache: &mut KvCache<B>,
    ids: Tensor<B, 2, Int>,
) -> Result<Tensor<B, 2>> {
    if cache.batch() == 1 {
        decoder.step(ids, cache)
    } else {
        decoder.model().forward_ids(ids, cache, Logits::Last)
    }
}

/// [`generate`] and [`generate_batch`]: prefill of the left-padded prompts, then the decode
/// loop.
fn run<B: Backend>(
    decoder: &mut Decoder<B>,
    cache: &mut KvCache<B>,
    prompts: &[&[u32]],
    options: &mut GenerateOptions,
    on_token: &mut dyn FnMut(usize, u32) -> Result<()>,
) -> Result<(Vec<Vec<u32>>, Stats)> {
    if options.max_tokens == 0 {
        return Err(LlmError::Input("max_tokens must be at least 1".into()));
    }
    if let Some(i) = prompts.iter().position(|p| p.is_empty()) {
        return Err(LlmError::Input(if prompts.len() == 1 {
            "the prompt has no tokens".into()
        } else {
            format!("prompt {i} of the batch has no tokens")
        }));
    }
    let vocab = decoder.model().config().vocab_size;
    if let Some(&bad) = prompts
        .iter()
        .flat_map(|p| p.iter())
        .find(|&&t| t as usize >= vocab)
    {
        return Err(LlmError::Input(format!(
            "token id {bad} is outside the vocabulary of {vocab} tokens"
        )));
    }
    let width = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    // Room for the prompts and every token that is fed back (the last one never is).
    let needed = cache.len() + width + options.max_tokens - 1;
    if needed > cache.capacity() {
        return Err(LlmError::Input(format!(
            "context full: {} cached + {width} prompt + {} new tokens need {needed} positions, \
             the cache holds {} (raise --max-context)",
            cache.len(),
            options.max_tokens,
            cache.capacity()
        )));
    }
    let batch = prompts.len();
    let padding: Vec<usize> = prompts.iter().map(|p| width - p.len()).collect();
    if batch > 1 {
        cache.set_padding(&padding)?;
    }
    // The prompts as rows of `width` ids, padded on the left with id 0 (hidden from attention).
    let rows: Vec<i64> = prompts
        .iter()
        .zip(&padding)
        .flat_map(|(p, &pad)| std::iter::repeat_n(0, pad).chain(p.iter().map(|&t| t as i64)))
        .collect();
    let device = decoder.model().device().clone();
    let chunk_ids = |range: std::ops::Range<usize>| {
        let ids: Vec<i64> = (0..batch)
            .flat_map(|b| rows[b * width + range.start..b * width + range.end].to_vec())
            .collect();
        Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [batch, range.len()]), &device)
    };
    let probe = options.device_memory;
    let mut device_peak = 0u64;
    let sample_memory = |peak: &mut u64| {
        if let Some(probe) = probe {
            *peak = (*peak).max(probe());
        }
    };

    let start = Instant::now();
    // The prompts in chunks, each started before the next is built: attention's transient
    // scores then scale with the chunk, not with the whole prompt.
    let heads = decoder.model().config().num_heads;
    let chunk = prefill_chunk::<B>(&device, batch, heads, width);
    let last = width - (width - 1) % chunk - 1;
    for begin in (0..last).step_by(chunk) {
        let end = (begin + chunk).min(last);
        let logits = decoder
            .model()
            .forward_ids(chunk_ids(begin..end), cache, Logits::Last)?;
        burn_mlx::fast::start_eval(&logits)
            .map_err(|e| LlmError::Input(format!("starting a prefill chunk failed: {e}")))?;
    }
    let logits = decoder
        .model()
        .forward_ids(chunk_ids(last..width), cache, Logits::Last)?;
    let mut tokens = vec![Vec::with_capacity(options.max_tokens); batch];
    let mut decode_steps = 0;
    let (first_done, host) = if options.sampler.is_greedy() {
        let (first_done, host, ran_past) = greedy_pipelined(
            &mut |ids| decode_step(decoder, cache, ids),
            logits,
            options,
            &mut tokens,
            on_token,
            &mut |i| {
                sample_memory(&mut device_peak);
                decode_steps = i;
            },
        )?;
        if ran_past {
            cache.rewind(1);
        }
        (first_done, host)
    } else {
        let mut next = next_tokens(logits, &mut options.sampler)?;
        let first_done = Instant::now();
        sample_memory(&mut device_peak);
        let mut done = vec![false; batch];
        for step in 1.. {
            hand_out(&next, options.stop_tokens, &mut done, &mut tokens, on_token)?;
            if step == options.max_tokens || done.iter().all(|&d| d) {
                break;
            }
            let ids: Vec<i64> = next.iter().map(|&t| t as i64).collect();
            let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [batch, 1]), &device);
            let logits = decode_step(decoder, cache, ids)?;
            next = next_tokens(logits, &mut options.sampler)?;
            decode_steps += 1;
            sample_memory(&mut device_peak);
        }
        (first_done, HostTimes::default())
    };
    let decode_time = first_done.elapsed();
    let time_to_first_token = first_done - start;
    let stats = Stats {
        sequences: batch,
        prompt_tokens: prompts.iter().map(|p| p.len()).sum(),
        generated_tokens: tokens.iter().map(Vec::len).sum(),
        time_to_first_token,
        decode_steps,
        decode_time,
        device_memory_peak: probe.map(|_| device_peak),
        rss_peak: rss_peak_bytes(),
        host,
    };
    Ok((tokens, stats))
}
