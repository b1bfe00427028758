//! Rotary position embeddings in the Hugging Face ("rotate half") layout: the frequencies, with
//! linear or Llama 3 rescaling, are computed on the host in f64, and
//! [`burn_mlx::fast::RotaryEmbedding`] applies them (one fused kernel on `Mlx`).

use super::config::{LlmConfig, RopeScaling};
use burn_mlx::fast::RotaryEmbedding;
use burn_tensor::backend::Backend;

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

/// The model's rotary embedding: [`burn_mlx::fast::RotaryEmbedding`] with the config's
/// frequencies (MLX's fused `rope` kernel on `Mlx`, composed from Burn's ops elsewhere).
pub fn rotary_embedding<B: Backend>(config: &LlmConfig, device: &B::Device) -> RotaryEmbedding<B> {
    RotaryEmbedding::new(&inverse_frequencies(config), device)
}

/// The sliding layers' rotary embedding (Gemma 3: plain RoPE with the local base), if the model
/// has sliding layers.
pub fn local_rotary_embedding<B: Backend>(
    config: &LlmConfig,
    device: &B::Device,
) -> Option<RotaryEmbedding<B>> {
    let sliding = config.sliding.as_ref()?;
    let local = LlmConfig {
        rope_theta: sliding.rope_theta,
        rope_scaling: RopeScaling::None,
        ..config.clone()
    };
    Some(rotary_embedding(&local, device))
}
