//! The generation loop: prefill the prompt into the cache, then decode one token at a time until
//! an end-of-sequence token or the token budget, handing each token to a callback as soon as it
//! is known (so callers can stream it), and timing the two phases the way `mlx_lm.generate`
//! reports them.

use super::cache::KvCache;
use super::error::{LlmError, Result};
use super::model::Logits;
use super::sampling::Sampler;
use super::step::Decoder;
use burn_tensor::backend::Backend;
use burn_tensor::{BasicOps, DType, Int, Tensor, TensorData};
use std::time::{Duration, Instant};

/// Prompt positions per prefill step: a longer prompt is run in chunks of this many positions
/// (the last chunk may be shorter), which bounds the memory of attention's scores (MLX's
/// attention without a fused kernel holds `heads × chunk × context` of them). mlx-lm's
/// `prefill_step_size` is the same setting (2,048 there).
pub const PREFILL_CHUNK: usize = 512;

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
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated (the end-of-sequence token excluded).
    pub generated_tokens: usize,
    /// From the start of prefill until the first generated token was on the host.
    pub time_to_first_token: Duration,
    /// One-token forward passes after the first token (each produced one token, the
    /// end-of-sequence token included).
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

    /// Decode steps per second (the first token comes out of prefill and is not counted).
    pub fn decode_tokens_per_s(&self) -> f64 {
        if self.decode_steps == 0 || self.decode_time.is_zero() {
            return 0.0;
        }
        self.decode_steps as f64 / self.decode_time.as_secs_f64()
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
        format!(
            "prompt {} tokens, generated {} tokens | time to first token {:.3} s | \
             prefill {:.1} tok/s | decode {:.2} tok/s | {memory}",
            self.prompt_tokens,
            self.generated_tokens,
            self.time_to_first_token.as_secs_f64(),
            self.prefill_tokens_per_s(),
            self.decode_tokens_per_s(),
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

/// Chooses the next token from logits `[1, vocab]`: greedy on the device (one integer comes
/// back), sampling on the host.
pub fn next_token<B: Backend>(logits: Tensor<B, 2>, sampler: &mut Sampler) -> Result<u32> {
    if sampler.is_greedy() {
        return read_token(logits.argmax(1));
    }
    let data = read(logits.cast(DType::F32), "logits")?.convert::<f32>();
    let row = data
        .to_vec::<f32>()
        .map_err(|e| LlmError::Input(format!("logits: {e:?}")))?;
    Ok(sampler.sample(&row))
}

/// Greedy decoding with the device kept busy: each step's graph is built from the previous
/// step's argmax while it is still on the device, and started ([`burn_mlx::fast::start_eval`],
/// which does nothing on backends other than `Mlx`) before that previous token is read back,
/// as `mlx_lm.generate` does. Returns when the first token was on the host. `step_done(i)` runs
/// after the `i`-th token after the first.
///
/// A step built past an end-of-sequence token is taken back out of the cache, so the cache ends
/// as the unpipelined loop leaves it: every generated token but the last written.
fn greedy_pipelined<B: Backend>(
    decoder: &mut Decoder<B>,
    cache: &mut KvCache<B>,
    logits: Tensor<B, 2>,
    options: &GenerateOptions,
    tokens: &mut Vec<u32>,
    on_token: &mut dyn FnMut(u32) -> Result<()>,
    step_done: &mut dyn FnMut(usize),
) -> Result<(Instant, HostTimes)> {
    let mut host = HostTimes::default();
    let start_eval = |t: &Tensor<B, 2, Int>| {
        burn_mlx::fast::start_eval(t)
            .map_err(|e| LlmError::Input(format!("starting a decode step failed: {e}")))
    };
    let mut current = logits.argmax(1);
    start_eval(&current)?;
    let mut first: Option<Instant> = None;
    loop {
        // One more step is needed unless this token fills the budget.
        let t0 = Instant::now();
        let next = if tokens.len() + 1 < options.max_tokens {
            let next = decoder.step(current.clone(), cache)?.argmax(1);
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
        let token = read_token(current)?;
        match first {
            None => first = Some(Instant::now()),
            Some(_) => {
                host.wait += t2.elapsed();
                step_done(tokens.len())
            }
        }
        if options.stop_tokens.contains(&token) {
            if next.is_some() {
                cache.rewind(1);
            }
            break;
        }
        tokens.push(token);
        on_token(token)?;
        match next {
            Some(next) => current = next,
            None => break,
        }
    }
    Ok((first.expect("the loop reads at least one token"), host))
}

/// Reads a token id (`[1, 1]`) back from the device.
fn read_token<B: Backend>(id: Tensor<B, 2, Int>) -> Result<u32> {
    let data = read(id, "argmax")?;
    let id = data
        .iter::<i64>()
        .next()
        .ok_or_else(|| LlmError::Input("argmax returned nothing".into()))?;
    Ok(id as u32)
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
    if options.max_tokens == 0 {
        return Err(LlmError::Input("max_tokens must be at least 1".into()));
    }
    if prompt.is_empty() {
        return Err(LlmError::Input("the prompt has no tokens".into()));
    }
    // Room for the prompt and every token that is fed back (the last one never is).
    let needed = cache.len() + prompt.len() + options.max_tokens - 1;
    if needed > cache.capacity() {
        return Err(LlmError::Input(format!(
            "context full: {} cached + {} prompt + {} new tokens need {needed} positions, the \
             cache holds {} (raise --max-context)",
            cache.len(),
            prompt.len(),
            options.max_tokens,
            cache.capacity()
        )));
    }
    let probe = options.device_memory;
    let mut device_peak = 0u64;
    let sample_memory = |peak: &mut u64| {
        if let Some(probe) = probe {
            *peak = (*peak).max(probe());
        }
    };

    let start = Instant::now();
    // The prompt in chunks of `PREFILL_CHUNK` positions, each started before the next is built:
    // attention's transient scores then scale with the chunk, not with the whole prompt.
    let (head, last) = prompt.split_at(prompt.len() - (prompt.len() - 1) % PREFILL_CHUNK - 1);
    for chunk in head.chunks(PREFILL_CHUNK) {
        let logits = decoder.model().forward(chunk, cache, Logits::Last)?;
        burn_mlx::fast::start_eval(&logits)
            .map_err(|e| LlmError::Input(format!("starting a prefill chunk failed: {e}")))?;
    }
    let logits = decoder.model().forward(last, cache, Logits::Last)?;
    let mut tokens = Vec::with_capacity(options.max_tokens);
    let mut decode_steps = 0;
    let (first_done, host) = if options.sampler.is_greedy() {
        greedy_pipelined(
            decoder,
            cache,
            logits,
            options,
            &mut tokens,
            on_token,
            &mut |i| {
                sample_memory(&mut device_peak);
                decode_steps = i;
            },
        )?
    } else {
        let mut token = next_token(logits, &mut options.sampler)?;
        let first_done = Instant::now();
        sample_memory(&mut device_peak);
        loop {
            if options.stop_tokens.contains(&token) {
                break;
            }
            tokens.push(token);
            on_token(token)?;
            if tokens.len() == options.max_tokens {
                break;
            }
            let ids = Tensor::<B, 2, Int>::from_data(
                TensorData::new(vec![token as i64], [1, 1]),
                decoder.model().device(),
            );
            let logits = decoder.step(ids, cache)?;
            token = next_token(logits, &mut options.sampler)?;
            decode_steps += 1;
            sample_memory(&mut device_peak);
        }
        (first_done, HostTimes::default())
    };
    let decode_time = first_done.elapsed();
    let time_to_first_token = first_done - start;
    let stats = Stats {
        prompt_tokens: prompt.len(),
        generated_tokens: tokens.len(),
        time_to_first_token,
        decode_steps,
        decode_time,
        device_memory_peak: probe.map(|_| device_peak),
        rss_peak: rss_peak_bytes(),
        host,
    };
    Ok((tokens, stats))
}
