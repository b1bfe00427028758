//! Rotary position embeddings in the Hugging Face ("rotate half") layout: the frequencies, with
//! linear or Llama 3 rescaling, are computed on the host in f64; cosine and sine tables for every
//! position up to the cache's capacity are built once, and each step slices the rows it needs.

use super::config::{LlmConfig, RopeScaling};
use burn_tensor::backend::Backend;
use burn_tensor::{DType, Tensor, TensorData};

/// The inverse frequencies `1 / theta^(2i/d)` for `i < d/2`, rescaled as the config says.
pub fn inverse_frequencies(config: &LlmConfig) -> Vec<f64> {
    let d = config.head_dim;
    let base: Vec<f64> = (0..d / 2)
        .map(|i| 1.0 / config.rope_theta.powf((2 * i) as f64 / d as f64))
        .collect();
    match config.rope_scaling {
        RopeScaling::None => base,
        RopeScaling::Linear { factor } => base.into_iter().map(|f| f / factor).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: context,
        } => {
            // Wavelengths longer than `context / low_freq_factor` are slowed down by `factor`,
            // those shorter than `context / high_freq_factor` are kept, and the band between
            // blends the two linearly in `context / wavelength`.
            let long = context / low_freq_factor;
            let short = context / high_freq_factor;
            base.into_iter()
                .map(|f| {
                    let wavelength = 2.0 * std::f64::consts::PI / f;
                    if wavelength > long {
                        f / factor
                    } else if wavelength < short {
                        f
                    } else {
                        let t = (context / wavelength - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - t) * f / factor + t * f
                    }
                })
                .collect()
        }
    }
}

/// Cosine and signed sine tables, `[capacity, head_dim]`, in the model's dtype.
///
/// Row `p` of `cos` is `cos(p·f_i)` for both halves of a head; `sin` holds `-sin(p·f_i)` in its
/// first half and `sin(p·f_i)` in its second, so that rotating `x = [x1, x2]` is
/// `x·cos + [x2, x1]·sin` (Hugging Face's `x·cos + rotate_half(x)·sin`).
#[derive(Debug, Clone)]
pub struct RopeTables<B: Backend> {
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    capacity: usize,
}

impl<B: Backend> RopeTables<B> {
    /// The tables for positions `0..capacity`.
    pub fn new(config: &LlmConfig, capacity: usize, device: &B::Device, dtype: DType) -> Self {
        let freqs = inverse_frequencies(config);
        let (half, d) = (freqs.len(), config.head_dim);
        let mut cos = Vec::with_capacity(capacity * d);
        let mut sin = Vec::with_capacity(capacity * d);
        for p in 0..capacity {
            let angles = freqs.iter().map(|f| p as f64 * f);
            let (c, s): (Vec<f64>, Vec<f64>) = angles.map(|a| (a.cos(), a.sin())).unzip();
            cos.extend(c.iter().chain(&c).map(|&v| v as f32));
            sin.extend(s.iter().map(|&v| -v as f32));
            sin.extend(s.iter().map(|&v| v as f32));
        }
        debug_assert_eq!(cos.len(), capacity * 2 * half);
        let table = |v: Vec<f32>| {
            Tensor::<B, 2>::from_data(TensorData::new(v, [capacity, d]), (device, dtype))
        };
        Self {
            cos: table(cos),
            sin: table(sin),
            capacity,
        }
    }

    /// Positions the tables cover.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Rotates `x` (`[batch, heads, seq, head_dim]`) whose first position is `offset`.
    /// The caller guarantees `offset + seq <= capacity`.
    pub fn apply(&self, x: Tensor<B, 4>, offset: usize) -> Tensor<B, 4> {
        let [_, _, seq, d] = x.dims();
        let rows = |t: &Tensor<B, 2>| t.clone().narrow(0, offset, seq).reshape([1, 1, seq, d]);
        let half = d / 2;
        let swapped = Tensor::cat(
            vec![
                x.clone().narrow(3, half, half),
                x.clone().narrow(3, 0, half),
            ],
            3,
        );
        x * rows(&self.cos) + swapped * rows(&self.sin)
    }
}
