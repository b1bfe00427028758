//! Choosing the next token from a row of logits: greedy (temperature 0), or sampling at a
//! temperature from the smallest set of tokens whose probability reaches `top_p` (nucleus
//! sampling), with a seeded generator so that a run can be repeated.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// How the next token is chosen.
#[derive(Debug)]
pub struct Sampler {
    temperature: f32,
    top_p: f32,
    rng: StdRng,
}

impl Sampler {
    /// Greedy when `temperature <= 0`; otherwise sampling at `temperature` from the top-`top_p`
    /// probability mass (`top_p >= 1` keeps every token), seeded with `seed`.
    pub fn new(temperature: f32, top_p: f32, seed: u64) -> Self {
        Self {
            temperature,
            top_p,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// The greedy sampler.
    pub fn greedy() -> Self {
        Self::new(0.0, 1.0, 0)
    }

    /// Whether this sampler always takes the most likely token.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Picks a token from `logits` (one row over the vocabulary).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.is_greedy() {
            return argmax(logits);
        }
        let inv_t = 1.0 / self.temperature as f64;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let mut probs: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, ((l as f64 - max) * inv_t).exp()))
            .collect();
        let total: f64 = probs.iter().map(|p| p.1).sum();
        // Most likely first; keep tokens until their mass reaches top_p (at least one).
        probs.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
        let (mut kept, mut mass) = (0, 0.0);
        for &(_, p) in &probs {
            kept += 1;
            mass += p / total;
            if mass >= self.top_p as f64 {
                break;
            }
        }
        probs.truncate(kept);
        let kept_total: f64 = probs.iter().map(|p| p.1).sum();
        let mut r = self.rng.random::<f64>() * kept_total;
        for &(token, p) in &probs {
            if r < p {
                return token;
            }
            r -= p;
        }
        probs[probs.len() - 1].0
    }
}

/// The index of the largest logit (the first one on ties; NaN never wins).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    best as u32
}
