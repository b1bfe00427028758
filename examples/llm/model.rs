//! The decoder: token embedding, `num_layers` pre-norm blocks (RMSNorm, grouped-query attention
//! with RoPE and, for Qwen3, an RMSNorm over each query and key head; RMSNorm, SwiGLU MLP), a final
//! RMSNorm and the output projection (tied to the embedding or not). Plain Burn tensor ops,
//! generic over the backend; attention goes through `burn_tensor::module::attention`, which on
//! `Mlx` is MLX's fused scaled-dot-product attention.
//!
//! Weights keep the Hugging Face layout (`[out, in]` matrices); a linear layer multiplies by a
//! transposed view of its weight, as PyTorch and mlx-lm do.

use super::cache::{KvCache, LayerCache};
use super::config::{Architecture, LlmConfig};
use super::error::{LlmError, Result};
use super::rope::RopeTables;
use burn_tensor::activation::silu;
use burn_tensor::backend::Backend;
use burn_tensor::module::{attention, embedding};
use burn_tensor::ops::AttentionModuleOptions;
use burn_tensor::{DType, Distribution, Int, Tensor, TensorData};

/// Where a model's parameters come from: a checkpoint or a random initializer.
pub trait ParamSource<B: Backend> {
    /// The vector `name` of length `shape[0]`.
    fn vector(&mut self, name: &str, shape: [usize; 1]) -> Result<Tensor<B, 1>>;
    /// The matrix `name` of shape `shape` (Hugging Face layout: `[out, in]`).
    fn matrix(&mut self, name: &str, shape: [usize; 2]) -> Result<Tensor<B, 2>>;
}

/// Random parameters for benchmarks: matrices drawn from N(0, 0.02²), norm weights 1.
pub struct RandomParams<B: Backend> {
    device: B::Device,
    dtype: DType,
}

impl<B: Backend> RandomParams<B> {
    /// Parameters in `dtype` on `device`.
    pub fn new(device: &B::Device, dtype: DType) -> Self {
        Self {
            device: device.clone(),
            dtype,
        }
    }
}

impl<B: Backend> ParamSource<B> for RandomParams<B> {
    fn vector(&mut self, _name: &str, shape: [usize; 1]) -> Result<Tensor<B, 1>> {
        Ok(Tensor::ones(shape, (&self.device, self.dtype)))
    }

    fn matrix(&mut self, _name: &str, shape: [usize; 2]) -> Result<Tensor<B, 2>> {
        Ok(Tensor::random(
            shape,
            Distribution::Normal(0.0, 0.02),
            (&self.device, self.dtype),
        ))
    }
}

/// `y = x·Wᵀ (+ b)` with `W` stored `[out, in]`.
#[derive(Debug, Clone)]
pub struct Linear<B: Backend> {
    /// `Wᵀ`, `[in, out]` (a transposed view of the stored weight).
    weight_t: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
}

impl<B: Backend> Linear<B> {
    /// Loads `{prefix}.weight` (`[out, in]`) and, with `bias`, `{prefix}.bias`.
    fn load(
        src: &mut dyn ParamSource<B>,
        prefix: &str,
        input: usize,
        output: usize,
        bias: bool,
    ) -> Result<Self> {
        let weight = src.matrix(&format!("{prefix}.weight"), [output, input])?;
        let bias = if bias {
            Some(src.vector(&format!("{prefix}.bias"), [output])?)
        } else {
            None
        };
        Ok(Self {
            weight_t: weight.transpose(),
            bias,
        })
    }

    /// Applies the layer to `[batch, seq, in]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [b, s, input] = x.dims();
        // A 2-D product against the transposed view: BLAS and MLX take it without a copy.
        let y = x.reshape([b * s, input]).matmul(self.weight_t.clone());
        let y = match &self.bias {
            Some(bias) => y + bias.clone().unsqueeze::<2>(),
            None => y,
        };
        let out = y.dims()[1];
        y.reshape([b, s, out])
    }
}

/// Root-mean-square normalization over the last axis, computed in f32 and scaled by a learned
/// weight (Hugging Face's `LlamaRMSNorm`/`Qwen3RMSNorm`).
#[derive(Debug, Clone)]
pub struct RmsNorm<B: Backend> {
    weight: Tensor<B, 1>,
    eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    /// Loads `{name}` of length `dim`.
    fn load(src: &mut dyn ParamSource<B>, name: &str, dim: usize, eps: f64) -> Result<Self> {
        Ok(Self {
            weight: src.vector(name, [dim])?,
            eps,
        })
    }

    /// Normalizes `x` over its last axis.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let dtype = x.dtype();
        let x = if dtype == DType::F32 {
            x
        } else {
            x.cast(DType::F32)
        };
        let mean_square = x.clone().square().mean_dim(D - 1);
        // A division rather than `recip()`: burn-ndarray's reciprocal is approximate (relative
        // error 5e-5 measured on this AVX-512 CPU, exact division 0), which moved the Qwen3
        // fixture's logits by 7e-5, and by a different amount from run to run.
        let normed = x / (mean_square + self.eps).sqrt();
        let normed = if dtype == DType::F32 {
            normed
        } else {
            normed.cast(dtype)
        };
        normed * self.weight.clone().unsqueeze::<D>()
    }
}

/// Self-attention with grouped key/value heads and rotary positions.
#[derive(Debug, Clone)]
pub struct Attention<B: Backend> {
    q_proj: Linear<B>,
    k_proj: Linear<B>,
    v_proj: Linear<B>,
    o_proj: Linear<B>,
    /// Qwen3's per-head RMSNorms of queries and keys (before RoPE).
    qk_norm: Option<(RmsNorm<B>, RmsNorm<B>)>,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
}

impl<B: Backend> Attention<B> {
    fn load(src: &mut dyn ParamSource<B>, prefix: &str, c: &LlmConfig) -> Result<Self> {
        let (h, d) = (c.hidden_size, c.head_dim);
        let (q_out, kv_out) = (c.num_heads * d, c.num_kv_heads * d);
        let bias = c.attention_bias;
        let qk_norm = match c.architecture {
            Architecture::Qwen3 => Some((
                RmsNorm::load(src, &format!("{prefix}.q_norm.weight"), d, c.rms_norm_eps)?,
                RmsNorm::load(src, &format!("{prefix}.k_norm.weight"), d, c.rms_norm_eps)?,
            )),
            Architecture::Llama => None,
        };
        Ok(Self {
            q_proj: Linear::load(src, &format!("{prefix}.q_proj"), h, q_out, bias)?,
            k_proj: Linear::load(src, &format!("{prefix}.k_proj"), h, kv_out, bias)?,
            v_proj: Linear::load(src, &format!("{prefix}.v_proj"), h, kv_out, bias)?,
            o_proj: Linear::load(src, &format!("{prefix}.o_proj"), q_out, h, bias)?,
            qk_norm,
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: d,
        })
    }

    /// Attends `x` (`[1, seq, hidden]`, positions `offset..offset + seq`) over the cached prefix
    /// and itself, writing its keys and values into `cache`.
    fn forward(
        &self,
        x: Tensor<B, 3>,
        cache: &mut LayerCache<B>,
        rope: &RopeTables<B>,
        offset: usize,
    ) -> Tensor<B, 3> {
        let [b, seq, _] = x.dims();
        let (hq, hkv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let q = self.q_proj.forward(x.clone()).reshape([b, seq, hq, d]);
        let k = self.k_proj.forward(x.clone()).reshape([b, seq, hkv, d]);
        let v = self.v_proj.forward(x).reshape([b, seq, hkv, d]);
        let (q, k) = match &self.qk_norm {
            Some((q_norm, k_norm)) => (q_norm.forward(q), k_norm.forward(k)),
            None => (q, k),
        };
        let q = rope.apply(q.swap_dims(1, 2), offset);
        let k = rope.apply(k.swap_dims(1, 2), offset);
        let (k, v) = cache.write(k, v.swap_dims(1, 2), offset);
        let out = grouped_attention(q, k, v, 1.0 / (d as f64).sqrt());
        self.o_proj
            .forward(out.swap_dims(1, 2).reshape([b, seq, hq * d]))
    }
}

/// Scaled dot-product attention of `q` (`[b, hq, s, d]`) over `k`, `v` (`[b, hkv, t, d]`,
/// `t >= s`, the last `s` keys being the queries' own positions), causal when `s > 1`.
///
/// Burn's attention op wants as many key heads as query heads. For one query position (decode)
/// the `hq / hkv` query heads that share a key head are folded into the query-length axis, which
/// needs no mask and no copy of the cache; for several (prefill) the key and value heads are
/// repeated.
pub fn grouped_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    scale: f64,
) -> Tensor<B, 4> {
    let [b, hq, s, d] = q.dims();
    let [_, hkv, t, _] = k.dims();
    let groups = hq / hkv;
    let options = |is_causal| AttentionModuleOptions {
        scale: Some(scale),
        softcap: None,
        is_causal,
    };
    if groups == 1 {
        return attention(q, k, v, None, None, options(s > 1));
    }
    if s == 1 {
        let folded = q.reshape([b, hkv, groups, d]);
        return attention(folded, k, v, None, None, options(false)).reshape([b, hq, 1, d]);
    }
    let repeat = |x: Tensor<B, 4>| {
        x.unsqueeze_dim::<5>(2)
            .expand([b, hkv, groups, t, d])
            .reshape([b, hq, t, d])
    };
    attention(q, repeat(k), repeat(v), None, None, options(true))
}

/// SwiGLU: `down(silu(gate(x)) · up(x))`.
#[derive(Debug, Clone)]
pub struct Mlp<B: Backend> {
    gate_proj: Linear<B>,
    up_proj: Linear<B>,
    down_proj: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    fn load(src: &mut dyn ParamSource<B>, prefix: &str, c: &LlmConfig) -> Result<Self> {
        let (h, i, bias) = (c.hidden_size, c.intermediate_size, c.mlp_bias);
        Ok(Self {
            gate_proj: Linear::load(src, &format!("{prefix}.gate_proj"), h, i, bias)?,
            up_proj: Linear::load(src, &format!("{prefix}.up_proj"), h, i, bias)?,
            down_proj: Linear::load(src, &format!("{prefix}.down_proj"), i, h, bias)?,
        })
    }

    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let gated = silu(self.gate_proj.forward(x.clone())) * self.up_proj.forward(x);
        self.down_proj.forward(gated)
    }
}

/// One pre-norm decoder block.
#[derive(Debug, Clone)]
pub struct DecoderLayer<B: Backend> {
    input_layernorm: RmsNorm<B>,
    self_attn: Attention<B>,
    post_attention_layernorm: RmsNorm<B>,
    mlp: Mlp<B>,
}

impl<B: Backend> DecoderLayer<B> {
    fn load(src: &mut dyn ParamSource<B>, i: usize, c: &LlmConfig) -> Result<Self> {
        let p = format!("model.layers.{i}");
        let (h, eps) = (c.hidden_size, c.rms_norm_eps);
        Ok(Self {
            input_layernorm: RmsNorm::load(src, &format!("{p}.input_layernorm.weight"), h, eps)?,
            self_attn: Attention::load(src, &format!("{p}.self_attn"), c)?,
            post_attention_layernorm: RmsNorm::load(
                src,
                &format!("{p}.post_attention_layernorm.weight"),
                h,
                eps,
            )?,
            mlp: Mlp::load(src, &format!("{p}.mlp"), c)?,
        })
    }

    fn forward(
        &self,
        x: Tensor<B, 3>,
        cache: &mut LayerCache<B>,
        rope: &RopeTables<B>,
        offset: usize,
    ) -> Tensor<B, 3> {
        let h = x.clone()
            + self
                .self_attn
                .forward(self.input_layernorm.forward(x), cache, rope, offset);
        h.clone() + self.mlp.forward(self.post_attention_layernorm.forward(h))
    }
}

/// Which positions [`Llm::forward`] returns logits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Every position of the input (`[seq, vocab]`): parity tests.
    All,
    /// The last position only (`[1, vocab]`): generation, which needs nothing else, and skips
    /// the output projection of the rest of the prompt.
    Last,
}

/// A Llama- or Qwen3-family decoder.
#[derive(Debug, Clone)]
pub struct Llm<B: Backend> {
    config: LlmConfig,
    embed_tokens: Tensor<B, 2>,
    layers: Vec<DecoderLayer<B>>,
    norm: RmsNorm<B>,
    /// The output projection transposed, `[hidden, vocab]` (a view of `embed_tokens` when tied).
    lm_head_t: Tensor<B, 2>,
    device: B::Device,
    dtype: DType,
}

impl<B: Backend> Llm<B> {
    /// Builds the model for `config`, taking every parameter (Hugging Face names) from `src`.
    pub fn build(
        config: LlmConfig,
        src: &mut dyn ParamSource<B>,
        device: &B::Device,
        dtype: DType,
    ) -> Result<Self> {
        let (v, h) = (config.vocab_size, config.hidden_size);
        let embed_tokens = src.matrix("model.embed_tokens.weight", [v, h])?;
        let layers = (0..config.num_layers)
            .map(|i| DecoderLayer::load(src, i, &config))
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::load(src, "model.norm.weight", h, config.rms_norm_eps)?;
        let lm_head_t = if config.tie_word_embeddings {
            embed_tokens.clone().transpose()
        } else {
            src.matrix("lm_head.weight", [v, h])?.transpose()
        };
        Ok(Self {
            config,
            embed_tokens,
            layers,
            norm,
            lm_head_t,
            device: device.clone(),
            dtype,
        })
    }

    /// A model of shape `config` with random weights (benchmarks).
    pub fn random(config: LlmConfig, device: &B::Device, dtype: DType) -> Result<Self> {
        Self::build(config, &mut RandomParams::new(device, dtype), device, dtype)
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &LlmConfig {
        &self.config
    }

    /// The device the weights live on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// The dtype of weights, activations and cache.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// A cache for `capacity` positions that fits this model.
    pub fn new_cache(&self, capacity: usize) -> KvCache<B> {
        KvCache::new(&self.config, capacity, &self.device, self.dtype)
    }

    /// Runs `tokens` (batch 1) after the `cache.len()` positions already cached, writes their
    /// keys and values into `cache`, and returns float logits (`[seq, vocab]` or `[1, vocab]`).
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache<B>,
        which: Logits,
    ) -> Result<Tensor<B, 2>> {
        let seq = tokens.len();
        if seq == 0 {
            return Err(LlmError::Input("forward: no tokens".into()));
        }
        if let Some(&bad) = tokens
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            return Err(LlmError::Input(format!(
                "token id {bad} is outside the vocabulary of {} tokens",
                self.config.vocab_size
            )));
        }
        cache.check(&self.config, seq)?;
        let offset = cache.len();
        let ids: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, seq]), &self.device);
        let mut x = embedding(self.embed_tokens.clone(), ids);
        {
            let (layer_caches, rope) = cache.parts();
            for (layer, layer_cache) in self.layers.iter().zip(layer_caches) {
                x = layer.forward(x, layer_cache, rope, offset);
            }
        }
        cache.advance(seq);
        let x = self.norm.forward(x);
        let x = match which {
            Logits::All => x,
            Logits::Last => x.narrow(1, seq - 1, 1),
        };
        let rows = x.dims()[1];
        Ok(x.reshape([rows, self.config.hidden_size])
            .matmul(self.lm_head_t.clone()))
    }
}
