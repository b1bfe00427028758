//! Batched generation: sequences decoded together, the shorter prompts padded on the left, give
//! each sequence the logits and tokens it gets alone.

use super::{max_diff, rows};
use burn_mlx_llm::generate::{generate, generate_batch, GenerateOptions};
use burn_mlx_llm::model::{Llm, Logits};
use burn_mlx_llm::sampling::Sampler;
use burn_mlx_llm::step::Decoder;
use burn_tensor::backend::Backend;
use burn_tensor::{Int, Tensor, TensorData};

fn greedy(max_tokens: usize, stop_tokens: &[u32]) -> GenerateOptions<'_> {
    GenerateOptions {
        max_tokens,
        stop_tokens,
        sampler: Sampler::greedy(),
        device_memory: None,
    }
}

/// `prompt`'s greedy continuation of `steps` tokens, generated alone (eager steps).
fn alone<B: Backend>(model: &Llm<B>, prompt: &[u32], steps: usize, stop: &[u32]) -> Vec<u32> {
    let mut cache = model.new_cache(prompt.len() + steps);
    let (tokens, _) = generate(
        &mut Decoder::eager(model),
        &mut cache,
        prompt,
        &mut greedy(steps, stop),
        &mut |_| Ok(()),
    )
    .unwrap();
    tokens
}

/// The last-position logits of `prompt` and then of each of `feed`, one token at a time, alone.
fn logits_alone<B: Backend>(model: &Llm<B>, prompt: &[u32], feed: &[u32]) -> Vec<Vec<f32>> {
    let mut cache = model.new_cache(prompt.len() + feed.len());
    let mut out = rows(model.forward(prompt, &mut cache, Logits::Last).unwrap());
    for &t in feed {
        out.extend(rows(model.forward(&[t], &mut cache, Logits::Last).unwrap()));
    }
    out
}

/// The same logits for every prompt at once: one padded prefill, then one step per fed token of
/// every row. Returns them per row.
fn logits_batched<B: Backend>(
    model: &Llm<B>,
    prompts: &[Vec<u32>],
    feeds: &[Vec<u32>],
) -> Vec<Vec<Vec<f32>>> {
    let (batch, width) = (prompts.len(), prompts.iter().map(Vec::len).max().unwrap());
    let steps = feeds[0].len();
    let device = model.device();
    let mut cache = model.new_batch_cache(batch, width + steps);
    let padding: Vec<usize> = prompts.iter().map(|p| width - p.len()).collect();
    cache.set_padding(&padding).unwrap();
    let ids: Vec<i64> = prompts
        .iter()
        .zip(&padding)
        .flat_map(|(p, &pad)| std::iter::repeat_n(0, pad).chain(p.iter().map(|&t| t as i64)))
        .collect();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [batch, width]), device);
    let mut per_row: Vec<Vec<Vec<f32>>> = vec![Vec::new(); batch];
    let mut take = |logits: Tensor<B, 2>| {
        assert_eq!(logits.dims()[0], batch, "one row of logits per sequence");
        for (row, r) in rows(logits).into_iter().enumerate() {
            per_row[row].push(r);
        }
    };
    take(model.forward_ids(ids, &mut cache, Logits::Last).unwrap());
    for step in 0..steps {
        let ids: Vec<i64> = feeds.iter().map(|f| f[step] as i64).collect();
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [batch, 1]), device);
        take(model.forward_ids(ids, &mut cache, Logits::Last).unwrap());
    }
    per_row
}

/// Every prompt's logits in a batch, at the prefill and at `steps` decode steps, against the
/// prompt alone, within `tol`; with `exact_tokens`, also `generate_batch`'s greedy tokens against
/// each prompt's own (with and without a stop token that ends some rows early).
pub fn check_batch<B: Backend>(
    model: &Llm<B>,
    prompts: &[Vec<u32>],
    steps: usize,
    tol: f32,
    exact_tokens: bool,
    label: &str,
) {
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| alone(model, p, steps, &[]))
        .collect();
    let feeds: Vec<Vec<u32>> = want.iter().map(|w| w[..steps - 1].to_vec()).collect();
    let batched = logits_batched(model, prompts, &feeds);
    for (i, (prompt, got)) in prompts.iter().zip(&batched).enumerate() {
        let reference = logits_alone(model, prompt, &feeds[i]);
        let diff = max_diff(&format!("{label}: row {i}"), got, &reference);
        println!(
            "{label}: batched row {i} (prompt {}) max |diff| {diff:.3e}",
            prompt.len()
        );
        assert!(
            diff <= tol,
            "{label}: row {i} of the batch differs from the sequence alone by {diff}"
        );
    }
    if !exact_tokens {
        return;
    }
    let prompt_refs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let width = prompts.iter().map(Vec::len).max().unwrap();
    for stop in [vec![], vec![want[0][2]]] {
        let mut cache = model.new_batch_cache(prompts.len(), width + steps);
        let mut streamed = vec![Vec::new(); prompts.len()];
        let (tokens, stats) = generate_batch(
            &mut Decoder::best(model),
            &mut cache,
            &prompt_refs,
            &mut greedy(steps, &stop),
            &mut |row, t| {
                streamed[row].push(t);
                Ok(())
            },
        )
        .unwrap();
        let expected: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| alone(model, p, steps, &stop))
            .collect();
        assert_eq!(
            tokens, expected,
            "{label}: batched greedy tokens (stop {stop:?})"
        );
        assert_eq!(
            streamed, tokens,
            "{label}: every token reaches the callback"
        );
        assert_eq!(stats.sequences, prompts.len());
        assert_eq!(
            stats.generated_tokens,
            expected.iter().map(Vec::len).sum::<usize>()
        );
        assert_eq!(
            stats.prompt_tokens,
            prompts.iter().map(Vec::len).sum::<usize>()
        );
    }
}

/// Prompts of three lengths cut from `prompt` (which has at least 9 tokens).
pub fn ragged(prompt: &[u32]) -> Vec<Vec<u32>> {
    vec![prompt.to_vec(), prompt[..4].to_vec(), prompt[2..9].to_vec()]
}

/// Prompts of one length (no padding: on CUDA the decode attention kernel serves the batch).
pub fn even(prompt: &[u32]) -> Vec<Vec<u32>> {
    vec![prompt[..8].to_vec(), prompt[1..9].to_vec()]
}

/// Bad requests to `generate_batch` are clear errors.
pub fn check_batch_errors<B: Backend>(model: &Llm<B>) {
    let options = || greedy(2, &[]);
    let prompts: [&[u32]; 2] = [&[1, 2, 3], &[]];
    let err = |cache: &mut burn_mlx_llm::cache::KvCache<B>, prompts: &[&[u32]]| {
        generate_batch(
            &mut Decoder::eager(model),
            cache,
            prompts,
            &mut options(),
            &mut |_, _| Ok(()),
        )
        .unwrap_err()
        .to_string()
    };
    let msg = err(&mut model.new_batch_cache(3, 8), &prompts);
    assert!(msg.contains("2 prompts for a cache of 3"), "{msg}");
    let msg = err(&mut model.new_batch_cache(2, 8), &prompts);
    assert!(msg.contains("prompt 1 of the batch has no tokens"), "{msg}");
    let msg = err(&mut model.new_batch_cache(2, 3), &[&[1, 2, 3], &[4]]);
    assert!(msg.contains("context full"), "{msg}");
    let mut cache = model.new_batch_cache(2, 8);
    let msg = generate(
        &mut Decoder::eager(model),
        &mut cache,
        &[1, 2],
        &mut options(),
        &mut |_| Ok(()),
    )
    .unwrap_err()
    .to_string();
    assert!(msg.contains("generate_batch"), "{msg}");
    let mut cache = model.new_batch_cache(2, 8);
    let msg = cache.set_padding(&[1]).unwrap_err().to_string();
    assert!(msg.contains("1 rows of padding for a cache of 2"), "{msg}");
}
