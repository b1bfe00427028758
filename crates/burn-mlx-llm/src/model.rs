//! The decoder: token embedding, `num_layers` pre-norm blocks (RMSNorm, grouped-query attention
//! with RoPE and, for Qwen3, an RMSNorm over each query and key head; RMSNorm, SwiGLU MLP), a final
//! RMSNorm and the output projection (tied to the embedding or not). Plain Burn tensor ops,
//! generic over the backend; attention goes through `burn_tensor::module::attention`, which on
//! `Mlx` is MLX's fused scaled-dot-product attention.
//!
//! Weights keep the Hugging Face layout (`[out, in]` matrices); a linear layer multiplies by a
//! transposed view of its weight, as PyTorch and mlx-lm do.
//!
//! [`Llm::quantize`] turns the matrices into 8- or 4-bit groups of 64 values
//! ([`burn_mlx::quant::QuantizedMatrix`]): on `Mlx` products run through MLX's quantized matmul;
//! other backends compute with the dequantized matrices (same numbers, no speed-up).

use super::cache::{padded_mask, sliding_band, KvCache, LayerCache, Position};
use super::config::{Architecture, LlmConfig};
use super::error::{LlmError, Result};
use super::rope::{local_rotary_embedding, rotary_embedding};
use burn_mlx::decode::{self, At, Gate, JointHeads, QkvLayout};
use burn_mlx::fast::{rms_norm, RotaryEmbedding};
use burn_mlx::nn::functional;
use burn_mlx::quant::{QuantBits, QuantizedMatrix, DEFAULT_GROUP_SIZE};
use burn_tensor::backend::Backend;
use burn_tensor::module::{attention, embedding};
use burn_tensor::ops::AttentionModuleOptions;
use burn_tensor::{Bool, DType, Distribution, Int, Tensor, TensorData};

/// The score given to masked positions in the training pass's attention (before the softmax).
const MASKED_SCORE: f64 = -1e9;

/// The names of a decoder block's linear layers, relative to the block (`model.layers.{i}.`),
/// as Hugging Face and mlx-lm name them.
pub const LINEAR_KEYS: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

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
    /// Ones, as a buffer of their own like a loaded weight (not `Tensor::ones`, which on `Mlx` is
    /// one broadcast scalar: on CUDA such a scalar sits in memory that the host's writes take
    /// back from the GPU, and a kernel reading it stalls on the page fault).
    fn vector(&mut self, _name: &str, shape: [usize; 1]) -> Result<Tensor<B, 1>> {
        let data = TensorData::new(vec![1.0f32; shape[0]], shape);
        Ok(Tensor::from_data(data, (&self.device, self.dtype)))
    }

    fn matrix(&mut self, _name: &str, shape: [usize; 2]) -> Result<Tensor<B, 2>> {
        Ok(Tensor::random(
            shape,
            Distribution::Normal(0.0, 0.02),
            (&self.device, self.dtype),
        ))
    }
}

/// A weight matrix `W` (`[out, in]`) as a product uses it.
#[derive(Debug, Clone)]
pub enum Weight<B: Backend> {
    /// `Wᵀ`, `[in, out]` (a transposed view of the stored weight).
    Dense(Tensor<B, 2>),
    /// `W` quantized in groups along `in`.
    Quantized(QuantizedMatrix<B>),
}

impl<B: Backend> Weight<B> {
    /// `x·Wᵀ` for `x` of shape `[rows, in]`.
    fn matmul_t(&self, x: Tensor<B, 2>) -> Result<Tensor<B, 2>> {
        match self {
            Weight::Dense(w_t) => Ok(x.matmul(w_t.clone())),
            Weight::Quantized(q) => Ok(q.matmul_t(x)?),
        }
    }

    /// `[out, in]`.
    fn dims(&self) -> [usize; 2] {
        match self {
            Weight::Dense(w_t) => {
                let [input, out] = w_t.dims();
                [out, input]
            }
            Weight::Quantized(q) => q.dims(),
        }
    }

    /// Bytes held: the matrix in its dtype, or the packed values, scales and biases.
    fn bytes(&self) -> usize {
        match self {
            Weight::Dense(w_t) => w_t.shape().num_elements() * w_t.dtype().size(),
            Weight::Quantized(q) => q.bytes(),
        }
    }

    /// Quantizes a dense weight whose `in` is a multiple of the group size; returns it unchanged
    /// (and `false`) otherwise, as mlx-lm leaves such layers in floating point.
    fn quantize(self, bits: QuantBits) -> Result<(Self, bool)> {
        match self {
            Weight::Dense(w_t) if w_t.dims()[0].is_multiple_of(DEFAULT_GROUP_SIZE) => {
                let q = QuantizedMatrix::quantize(w_t.transpose(), bits, DEFAULT_GROUP_SIZE)?;
                Ok((Weight::Quantized(q), true))
            }
            other => Ok((other, false)),
        }
    }
}

/// A low-rank update added to a linear layer's output, `scale · (x·A)·B`, with `A` `[in, rank]`
/// and `B` `[rank, out]` (mlx-lm's layout: LoRA). It is computed in the adapters' dtype and
/// added to the layer's output in `x`'s dtype, as mlx-lm does.
#[derive(Debug, Clone)]
pub struct LoraUpdate<B: Backend> {
    /// `A`, `[in, rank]`.
    pub a: Tensor<B, 2>,
    /// `B`, `[rank, out]`.
    pub b: Tensor<B, 2>,
    /// The factor on the update.
    pub scale: f64,
    /// The probability of dropping an element of the update's input; 0 outside training.
    pub dropout: f64,
}

impl<B: Backend> LoraUpdate<B> {
    /// `scale · (dropout(x)·A)·B` for `x` of shape `[rows, in]`, in `x`'s dtype.
    fn apply(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let (dtype, own) = (x.dtype(), self.a.dtype());
        let x = if dtype == own { x } else { x.cast(own) };
        let x = if self.dropout > 0.0 {
            let keep = 1.0 - self.dropout;
            let mask = x.random_like(Distribution::Bernoulli(keep));
            x * mask / keep
        } else {
            x
        };
        let z = x.matmul(self.a.clone()).matmul(self.b.clone()) * self.scale;
        if dtype == own {
            z
        } else {
            z.cast(dtype)
        }
    }
}

/// `y = x·Wᵀ (+ b)` with `W` stored `[out, in]`, plus a [`LoraUpdate`] when one is set.
#[derive(Debug, Clone)]
pub struct Linear<B: Backend> {
    weight: Weight<B>,
    bias: Option<Tensor<B, 1>>,
    lora: Option<LoraUpdate<B>>,
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
            weight: Weight::Dense(weight.transpose()),
            bias,
            lora: None,
        })
    }

    /// `[out, in]`.
    pub fn dims(&self) -> [usize; 2] {
        self.weight.dims()
    }

    /// The weight `W` (`[out, in]`) when it is not quantized.
    pub fn dense_weight(&self) -> Option<Tensor<B, 2>> {
        match &self.weight {
            Weight::Dense(w_t) => Some(w_t.clone().transpose()),
            Weight::Quantized(_) => None,
        }
    }

    /// The layer as [`decode::Linear`] (its dense `[in, out]` or quantized weight, and the bias)
    /// when it has no low-rank update: what the fused decode-step kernels take.
    fn decode_layer(&self) -> Option<decode::Linear<'_, B>> {
        let bias = self.bias.as_ref();
        match (&self.weight, &self.lora) {
            (Weight::Dense(w_t), None) => {
                Some(decode::Linear::Dense(decode::Dense { weight: w_t, bias }))
            }
            (Weight::Quantized(matrix), None) => {
                Some(decode::Linear::Quantized(decode::Quantized {
                    matrix,
                    bias,
                }))
            }
            _ => None,
        }
    }

    /// Whether the weight is quantized.
    pub fn is_quantized(&self) -> bool {
        matches!(self.weight, Weight::Quantized(_))
    }

    /// Sets (or with `None`, removes) the layer's low-rank update.
    pub fn set_lora(&mut self, lora: Option<LoraUpdate<B>>) {
        self.lora = lora;
    }

    /// The layer's low-rank update, if set.
    pub fn lora(&self) -> Option<&LoraUpdate<B>> {
        self.lora.as_ref()
    }

    /// Applies the layer to `[seq, in]` (the hidden states of one sequence).
    ///
    /// A 2-D product against the transposed view, which BLAS and MLX take without a copy; the
    /// model keeps its hidden states 2-D (batch 1) so that no reshape surrounds it (on a GPU every
    /// op of a decode step is host work, and the reshapes were a quarter of them).
    pub fn forward(&self, x: Tensor<B, 2>) -> Result<Tensor<B, 2>> {
        // Without dropout the layer and its update are one op ([`functional::lora_linear`]:
        // one autodiff node on `Autodiff<Mlx>`).
        if let Some(lora) = self.lora.as_ref().filter(|l| l.dropout == 0.0) {
            let weight = match &self.weight {
                Weight::Dense(w_t) => functional::FrozenWeight::Dense(w_t),
                Weight::Quantized(q) => functional::FrozenWeight::Quantized(q),
            };
            let y = functional::lora_linear(x, weight, lora.a.clone(), lora.b.clone(), lora.scale)?;
            return Ok(match &self.bias {
                Some(bias) => y + bias.clone().unsqueeze::<2>(),
                None => y,
            });
        }
        let update = self.lora.as_ref().map(|lora| lora.apply(x.clone()));
        let y = self.weight.matmul_t(x)?;
        let y = match &self.bias {
            Some(bias) => y + bias.clone().unsqueeze::<2>(),
            None => y,
        };
        Ok(match update {
            Some(update) => y + update,
            None => y,
        })
    }

    /// The layer with its weight quantized (see [`Weight::quantize`]), counting it in `report`
    /// under `name`.
    fn quantize(self, bits: QuantBits, name: &str, report: &mut QuantReport) -> Result<Self> {
        let dims = self.weight.dims();
        let (weight, done) = self.weight.quantize(bits)?;
        report.note(name, dims, done);
        Ok(Self { weight, ..self })
    }
}

/// `N` linear layers that take the same input: each on its own, or fused into one layer whose
/// output is theirs side by side ([`Llm::fuse_projections`]), one matrix product instead of `N`.
#[derive(Debug, Clone)]
pub enum Packed<B: Backend, const N: usize> {
    /// One layer each.
    Separate([Linear<B>; N]),
    /// One layer, and the output widths of the layers it holds.
    Fused(Linear<B>, [usize; N]),
}

impl<B: Backend, const N: usize> Packed<B, N> {
    /// Layer `i` when the layers are separate.
    fn part(&self, i: usize) -> Option<&Linear<B>> {
        match self {
            Packed::Separate(parts) => parts.get(i),
            Packed::Fused(..) => None,
        }
    }

    /// [`part`](Self::part), mutable.
    fn part_mut(&mut self, i: usize) -> Option<&mut Linear<B>> {
        match self {
            Packed::Separate(parts) => parts.get_mut(i),
            Packed::Fused(..) => None,
        }
    }

    /// The layers as one: their weights (and biases) concatenated along the output axis, when
    /// every one is dense and has no low-rank update; otherwise `self` as it is.
    fn fuse(self) -> Self {
        let parts = match self {
            Packed::Separate(parts) => parts,
            fused => return fused,
        };
        let fusable = parts.iter().all(|l| l.lora.is_none() && !l.is_quantized())
            && (parts.iter().all(|l| l.bias.is_some()) || parts.iter().all(|l| l.bias.is_none()));
        let weights: Option<Vec<Tensor<B, 2>>> = parts.iter().map(Linear::dense_weight).collect();
        match weights {
            Some(weights) if fusable => {
                let widths = std::array::from_fn(|i| parts[i].dims()[0]);
                let bias = parts[0]
                    .bias
                    .as_ref()
                    .map(|_| Tensor::cat(parts.iter().flat_map(|l| l.bias.clone()).collect(), 0));
                let weight = Tensor::cat(weights, 0);
                Packed::Fused(
                    Linear {
                        weight: Weight::Dense(weight.transpose()),
                        bias,
                        lora: None,
                    },
                    widths,
                )
            }
            _ => Packed::Separate(parts),
        }
    }

    /// The fused layer as [`decode::Linear`] (see [`Linear::decode_layer`]); `None` when the
    /// layers are separate.
    fn fused_layer(&self) -> Option<decode::Linear<'_, B>> {
        match self {
            Packed::Fused(layer, _) => layer.decode_layer(),
            Packed::Separate(_) => None,
        }
    }

    /// Every layer's output for `x`, `[rows, width]` each.
    fn forward_each(&self, x: Tensor<B, 2>) -> Result<[Tensor<B, 2>; N]> {
        match self {
            Packed::Separate(parts) => {
                let mut outs = Vec::with_capacity(N);
                for part in parts {
                    outs.push(part.forward(x.clone())?);
                }
                Ok(outs
                    .try_into()
                    .unwrap_or_else(|_| unreachable!("N outputs")))
            }
            Packed::Fused(layer, widths) => {
                let y = layer.forward(x)?;
                let mut start = 0;
                Ok(std::array::from_fn(|i| {
                    let part = y.clone().narrow(1, start, widths[i]);
                    start += widths[i];
                    part
                }))
            }
        }
    }

    /// The layers with their weights quantized; a fused layer is one matrix (its rows are the
    /// layers' rows, and groups run along the shared input axis, so each layer's values are
    /// those it would have alone).
    fn quantize(
        self,
        bits: QuantBits,
        names: [String; N],
        report: &mut QuantReport,
    ) -> Result<Self> {
        match self {
            Packed::Separate(parts) => {
                let mut out = Vec::with_capacity(N);
                for (part, name) in parts.into_iter().zip(names) {
                    out.push(part.quantize(bits, &name, report)?);
                }
                Ok(Packed::Separate(
                    out.try_into().unwrap_or_else(|_| unreachable!("N layers")),
                ))
            }
            Packed::Fused(layer, widths) => Ok(Packed::Fused(
                layer.quantize(bits, &names.join("+"), report)?,
                widths,
            )),
        }
    }

    /// The layers, for counting bytes.
    fn layers(&self) -> Vec<&Linear<B>> {
        match self {
            Packed::Separate(parts) => parts.iter().collect(),
            Packed::Fused(layer, _) => vec![layer],
        }
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

    /// Normalizes `x` over its last axis (in f32; one fused kernel on `Mlx`).
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        rms_norm(x, self.weight.clone(), self.eps)
    }

    /// [`forward`](Self::forward) for training: on `Autodiff<Mlx>` MLX's fused kernel with its
    /// compiled backward ([`functional::rms_norm`]), elsewhere the same numbers composed.
    fn forward_train<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        functional::rms_norm(x, self.weight.clone(), self.eps)
    }
}

/// Self-attention with grouped key/value heads and rotary positions.
#[derive(Debug, Clone)]
pub struct Attention<B: Backend> {
    /// `q_proj`, `k_proj` and `v_proj`.
    qkv: Packed<B, 3>,
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
            Architecture::Qwen3 | Architecture::Gemma3 => Some((
                RmsNorm::load(src, &format!("{prefix}.q_norm.weight"), d, c.rms_norm_eps)?,
                RmsNorm::load(src, &format!("{prefix}.k_norm.weight"), d, c.rms_norm_eps)?,
            )),
            Architecture::Llama => None,
        };
        Ok(Self {
            qkv: Packed::Separate([
                Linear::load(src, &format!("{prefix}.q_proj"), h, q_out, bias)?,
                Linear::load(src, &format!("{prefix}.k_proj"), h, kv_out, bias)?,
                Linear::load(src, &format!("{prefix}.v_proj"), h, kv_out, bias)?,
            ]),
            o_proj: Linear::load(src, &format!("{prefix}.o_proj"), q_out, h, bias)?,
            qk_norm,
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: d,
        })
    }

    /// Attends `x` (`[batch·seq, hidden]`: `batch` sequences, the cache's, whose positions
    /// start at `position`) over the cached prefix and itself, writing its keys and values into
    /// `cache`. With `window`, a query sees only itself and the `window - 1` positions before it
    /// (Gemma 3's sliding layers); `masks` replace that rule and the causal one where given (a
    /// host position with several queries past the window, [`sliding_band`]; a padded batch,
    /// [`padded_mask`]).
    ///
    /// With fused projections, the heads come from [`decode::qkv_heads`] (split, norms and RoPE
    /// in one kernel on CUDA). A decode step (one position, known on the
    /// host or the device) with fused projections and no padding attends through
    /// [`decode::decode_attention`] over the cache's buffers up to its length, with no slice of
    /// them and no mask.
    fn forward(
        &self,
        x: Tensor<B, 2>,
        cache: &mut LayerCache<B>,
        rope: &RotaryEmbedding<B>,
        position: &Position<B>,
        window: Option<usize>,
        masks: &PassMasks<B>,
    ) -> Result<Tensor<B, 2>> {
        let batch = cache.batch();
        let seq = x.dims()[0] / batch;
        let (hq, hkv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let scale = 1.0 / (d as f64).sqrt();
        let (q, k, v) = match &self.qkv {
            Packed::Fused(layer, _) => {
                let at = decode_position(position);
                let norms = self.qk_norm.as_ref().map(|(q, k)| (&q.weight, &k.weight));
                let eps = self.qk_norm.as_ref().map_or(0.0, |(q, _)| q.eps);
                let layout = QkvLayout {
                    heads: hq,
                    kv_heads: hkv,
                    head_dim: d,
                };
                let qkv = layer.forward(x)?;
                if !cache.is_joint() {
                    let [q, k, v] = decode::qkv_heads(qkv, batch, layout, norms, eps, rope, &at);
                    (q, k, v)
                } else {
                    // One buffer of keys and values: a decode step writes it with one update
                    // and attends over it in place; several positions (or a mask) take its two
                    // halves.
                    let [q, kv] =
                        decode::qkv_heads_joint(qkv, batch, layout, norms, eps, rope, &at);
                    let kv = cache.write_joint(kv, position);
                    if seq == 1 && masks.pick(window).is_none() {
                        let len = decode_length(position);
                        let out = decode::decode_attention_joint(q, kv, &len, scale, window);
                        return self.o_proj.forward(out);
                    }
                    let (k, v) = (kv.clone().narrow(1, 0, hkv), kv.narrow(1, hkv, hkv));
                    let (k, v) = match position {
                        Position::Host(offset) => {
                            (k.narrow(2, 0, offset + seq), v.narrow(2, 0, offset + seq))
                        }
                        Position::Device { .. } => (k, v),
                    };
                    return self.attend(q, k, v, position, window, masks);
                }
            }
            Packed::Separate(_) => {
                // `[batch·seq, heads·d]` to `[batch, heads, seq, d]`: for one position (a decode
                // step) a reshape alone; for several, a reshape and a transpose.
                let heads_first = |t: Tensor<B, 2>, heads: usize| {
                    if seq == 1 {
                        t.reshape([batch, heads, 1, d])
                    } else {
                        t.reshape([batch, seq, heads, d]).swap_dims(1, 2)
                    }
                };
                let [q, k, v] = self.qkv.forward_each(x)?;
                let (q, k, v) = (heads_first(q, hq), heads_first(k, hkv), heads_first(v, hkv));
                let (q, k) = match &self.qk_norm {
                    Some((q_norm, k_norm)) => (q_norm.forward(q), k_norm.forward(k)),
                    None => (q, k),
                };
                let (q, k) = match position {
                    Position::Host(offset) => (rope.apply(q, *offset), rope.apply(k, *offset)),
                    Position::Device { offset, .. } => (
                        rope.apply_at(q, offset.clone()),
                        rope.apply_at(k, offset.clone()),
                    ),
                };
                (q, k, v)
            }
        };
        if let (1, Packed::Fused(..), None) = (seq, &self.qkv, masks.pick(window)) {
            let (k, v) = cache.write_whole(k, v, position);
            let out = decode::decode_attention(q, k, v, &decode_length(position), scale, window);
            return self.o_proj.forward(out);
        }
        let (k, v) = cache.write(k, v, position);
        self.attend(q, k, v, position, window, masks)
    }

    /// Attention of `q` (`[batch, heads, seq, d]`) over the keys and values that the cache gave
    /// back (the filled prefix for a host position, the whole buffers for a device one), then
    /// the output projection.
    fn attend(
        &self,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        position: &Position<B>,
        window: Option<usize>,
        masks: &PassMasks<B>,
    ) -> Result<Tensor<B, 2>> {
        let [batch, _, seq, _] = q.dims();
        let (hq, d) = (self.num_heads, self.head_dim);
        let scale = 1.0 / (d as f64).sqrt();
        let given = masks.pick(window);
        let bias = match position {
            Position::Host(_) => given.cloned(),
            Position::Device {
                bias, sliding_bias, ..
            } => match (window, sliding_bias) {
                (Some(_), Some(sliding)) => Some(sliding.clone()),
                _ => Some(bias.clone()),
            },
        };
        // A sliding layer whose filled prefix is longer than its window, with no mask given:
        // one query position reads the window's keys alone.
        let (k, v) = match (position, window, given) {
            (Position::Host(offset), Some(w), None) if seq == 1 && offset + 1 > w => {
                let start = offset + 1 - w;
                (k.narrow(2, start, w), v.narrow(2, start, w))
            }
            _ => (k, v),
        };
        let out = grouped_attention(q, k, v, bias, scale);
        let out = if seq == 1 {
            out.reshape([batch, hq * d])
        } else {
            out.swap_dims(1, 2).reshape([batch * seq, hq * d])
        };
        self.o_proj.forward(out)
    }

    /// Attends `x` (`[batch·seq, hidden]`, `batch` sequences of `seq` positions from 0, no
    /// cache) with `mask` (`[1, 1, seq, seq]`, true where a query must not see a key), or
    /// causally without a mask array when `mask` is `None`: the training pass. Norms and
    /// attention go through [`burn_mlx::nn::functional`], whose ops on `Autodiff<Mlx>` are one
    /// MLX kernel forward and one compiled backward each.
    fn forward_batch(
        &self,
        x: Tensor<B, 2>,
        [batch, seq]: [usize; 2],
        rope: &RotaryEmbedding<B>,
        mask: Option<&Tensor<B, 4, Bool>>,
    ) -> Result<Tensor<B, 2>> {
        let (hq, hkv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let heads_first =
            |t: Tensor<B, 2>, heads: usize| t.reshape([batch, seq, heads, d]).swap_dims(1, 2);
        let [q, k, v] = self.qkv.forward_each(x)?;
        let (q, k, v) = (heads_first(q, hq), heads_first(k, hkv), heads_first(v, hkv));
        let (q, k) = match &self.qk_norm {
            Some((q_norm, k_norm)) => (q_norm.forward_train(q), k_norm.forward_train(k)),
            None => (q, k),
        };
        let (q, k) = (rope.apply(q, 0), rope.apply(k, 0));
        let scale = 1.0 / (d as f64).sqrt();
        let out = match mask {
            Some(mask) => functional::attention(q, k, v, Some(mask.clone()), scale, MASKED_SCORE),
            None => functional::causal_attention(q, k, v, scale),
        };
        self.o_proj
            .forward(out.swap_dims(1, 2).reshape([batch * seq, hq * d]))
    }

    fn quantize(self, bits: QuantBits, prefix: &str, report: &mut QuantReport) -> Result<Self> {
        let names = ["q_proj", "k_proj", "v_proj"].map(|n| format!("{prefix}.{n}"));
        let qkv = self.qkv.quantize(bits, names, report)?;
        let o_proj = self
            .o_proj
            .quantize(bits, &format!("{prefix}.o_proj"), report)?;
        Ok(Self {
            qkv,
            o_proj,
            ..self
        })
    }
}

/// The first position of a pass, as the decode kernels take it.
fn decode_position<B: Backend>(position: &Position<B>) -> At<B> {
    match position {
        Position::Host(offset) => At::Host(*offset),
        Position::Device { offset, .. } => At::Device(offset.clone()),
    }
}

/// The number of cached positions a decode step (one position at `position`) attends over.
fn decode_length<B: Backend>(position: &Position<B>) -> At<B> {
    match position {
        Position::Host(offset) => At::Host(offset + 1),
        Position::Device { offset, .. } => At::Device(offset.clone() + 1),
    }
}

/// Scaled dot-product attention of `q` (`[b, hq, s, d]`) over `k`, `v` (`[b, hkv, t, d]`).
/// Without `bias`, the last `s` keys are the queries' own positions and attention is causal
/// when `s > 1`; with `bias` (`[1, 1, s, t]`, added to the scores), the bias alone says which
/// keys each query sees.
///
/// Burn's attention op wants as many key heads as query heads, except on `Mlx`, which takes the
/// grouped heads as they are ([`burn_mlx::supports_grouped_kv_heads`]) and hands them to MLX's
/// attention kernels. Elsewhere, for one query position (decode) the `hq / hkv` query heads that
/// share a key head are folded into the query-length axis, which needs no mask and no copy of
/// the cache; for several (prefill) the key and value heads are repeated.
pub fn grouped_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    bias: Option<Tensor<B, 4>>,
    scale: f64,
) -> Tensor<B, 4> {
    let [b, hq, s, d] = q.dims();
    let [_, hkv, t, _] = k.dims();
    let groups = hq / hkv;
    let causal = s > 1 && bias.is_none();
    let options = |is_causal| AttentionModuleOptions {
        scale: Some(scale),
        softcap: None,
        is_causal,
    };
    if groups == 1 || burn_mlx::supports_grouped_kv_heads::<B>() {
        let bias = bias.map(|m| m.expand([b, hq, s, t]));
        return attention(q, k, v, None, bias, options(causal));
    }
    if s == 1 {
        let folded = q.reshape([b, hkv, groups, d]);
        let bias = bias.map(|m| m.expand([b, hkv, groups, t]));
        return attention(folded, k, v, None, bias, options(false)).reshape([b, hq, 1, d]);
    }
    let repeat = |x: Tensor<B, 4>| {
        x.unsqueeze_dim::<5>(2)
            .expand([b, hkv, groups, t, d])
            .reshape([b, hq, t, d])
    };
    let bias = bias.map(|m| m.expand([b, hq, s, t]));
    attention(q, repeat(k), repeat(v), None, bias, options(causal))
}

/// The gated MLP `down(act(gate(x)) · up(x))`: SwiGLU (`act` = SiLU; [`functional::swiglu`],
/// one fused kernel on `Mlx`) for Llama and Qwen3, GeGLU with the tanh form of GELU for Gemma 3.
#[derive(Debug, Clone)]
pub struct Mlp<B: Backend> {
    /// `gate_proj` and `up_proj`.
    gate_up: Packed<B, 2>,
    down_proj: Linear<B>,
    /// GELU (tanh approximation, transformers' `gelu_pytorch_tanh`) instead of SiLU.
    gelu: bool,
}

impl<B: Backend> Mlp<B> {
    fn load(src: &mut dyn ParamSource<B>, prefix: &str, c: &LlmConfig) -> Result<Self> {
        let (h, i, bias) = (c.hidden_size, c.intermediate_size, c.mlp_bias);
        Ok(Self {
            gate_up: Packed::Separate([
                Linear::load(src, &format!("{prefix}.gate_proj"), h, i, bias)?,
                Linear::load(src, &format!("{prefix}.up_proj"), h, i, bias)?,
            ]),
            down_proj: Linear::load(src, &format!("{prefix}.down_proj"), i, h, bias)?,
            gelu: c.architecture == Architecture::Gemma3,
        })
    }

    /// `down(act(gate(x)) · up(x))`; with the gate and up projections fused, the activation is
    /// [`decode::gated`] (one kernel on CUDA).
    fn forward(&self, x: Tensor<B, 2>) -> Result<Tensor<B, 2>> {
        let gated = match &self.gate_up {
            Packed::Fused(layer, _) => {
                let gate = if self.gelu {
                    Gate::GeluTanh
                } else {
                    Gate::Silu
                };
                decode::gated(layer.forward(x)?, gate)
            }
            Packed::Separate(_) => {
                let [gate, up] = self.gate_up.forward_each(x)?;
                if self.gelu {
                    decode::gelu_tanh(gate) * up
                } else {
                    functional::swiglu(gate, up)
                }
            }
        };
        self.down_proj.forward(gated)
    }

    fn quantize(self, bits: QuantBits, prefix: &str, report: &mut QuantReport) -> Result<Self> {
        let names = ["gate_proj", "up_proj"].map(|n| format!("{prefix}.{n}"));
        let gate_up = self.gate_up.quantize(bits, names, report)?;
        let down_proj = self
            .down_proj
            .quantize(bits, &format!("{prefix}.down_proj"), report)?;
        Ok(Self {
            gate_up,
            down_proj,
            ..self
        })
    }
}

/// One pre-norm decoder block. For Llama and Qwen3, `post_attention_layernorm` is the norm
/// before the MLP; Gemma 3 normalizes the attention's output with it, and has two more norms,
/// before and after the MLP (`feedforward_norms`).
#[derive(Debug, Clone)]
pub struct DecoderLayer<B: Backend> {
    input_layernorm: RmsNorm<B>,
    self_attn: Attention<B>,
    post_attention_layernorm: RmsNorm<B>,
    mlp: Mlp<B>,
    /// Gemma 3's `pre_feedforward_layernorm` and `post_feedforward_layernorm`.
    feedforward_norms: Option<(RmsNorm<B>, RmsNorm<B>)>,
    /// The window of a sliding layer (Gemma 3's local layers); `None` for full attention.
    window: Option<usize>,
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
            feedforward_norms: match c.architecture {
                Architecture::Gemma3 => Some((
                    RmsNorm::load(
                        src,
                        &format!("{p}.pre_feedforward_layernorm.weight"),
                        h,
                        eps,
                    )?,
                    RmsNorm::load(
                        src,
                        &format!("{p}.post_feedforward_layernorm.weight"),
                        h,
                        eps,
                    )?,
                )),
                Architecture::Llama | Architecture::Qwen3 => None,
            },
            window: c.sliding.as_ref().filter(|s| s.layers[i]).map(|s| s.window),
        })
    }

    /// The block on `normed` (its input, `x`, already through `input_layernorm`): returns its
    /// output and that output through `next_norm` (the next block's input norm, or the final
    /// norm). Each residual connection and the norm after it are one [`decode::add_rms_norm`]
    /// (one kernel on CUDA).
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        x: Tensor<B, 2>,
        normed: Tensor<B, 2>,
        next_norm: &RmsNorm<B>,
        cache: &mut LayerCache<B>,
        rope: &RotaryEmbedding<B>,
        position: &Position<B>,
        masks: &PassMasks<B>,
    ) -> Result<(Tensor<B, 2>, Tensor<B, 2>)> {
        let attended = self
            .self_attn
            .forward(normed, cache, rope, position, self.window, masks)?;
        let add_norm =
            |x, y, norm: &RmsNorm<B>| decode::add_rms_norm(x, y, norm.weight.clone(), norm.eps);
        Ok(match &self.feedforward_norms {
            None => {
                let (h, normed) = add_norm(x, attended, &self.post_attention_layernorm);
                let out = self.mlp.forward(normed)?;
                add_norm(h, out, next_norm)
            }
            Some((pre, post)) => {
                let attended = self.post_attention_layernorm.forward(attended);
                let (h, normed) = add_norm(x, attended, pre);
                let out = post.forward(self.mlp.forward(normed)?);
                add_norm(h, out, next_norm)
            }
        })
    }

    /// The layer's QKV, output, gate/up and down projections as [`decode::Linear`] when a decode
    /// step can run it through [`step`](Self::step): a Llama or Qwen block (pre-norm, no sliding
    /// window, no Gemma norms) whose QKV and gate/up projections are fused, every projection
    /// without a low-rank update (dense or quantized).
    fn step_parts(&self) -> Option<[decode::Linear<'_, B>; 4]> {
        if self.feedforward_norms.is_some() || self.window.is_some() {
            return None;
        }
        Some([
            self.self_attn.qkv.fused_layer()?,
            self.self_attn.o_proj.decode_layer()?,
            self.mlp.gate_up.fused_layer()?,
            self.mlp.down_proj.decode_layer()?,
        ])
    }

    /// The attention scale (`1/sqrt(head_dim)`) and the MLP's gate of the block's decode step.
    fn attention_scale_and_gate(&self) -> (f64, Gate) {
        let gate = if self.mlp.gelu {
            Gate::GeluTanh
        } else {
            Gate::Silu
        };
        (1.0 / (self.self_attn.head_dim as f64).sqrt(), gate)
    }

    /// The block's QKV step at `at` (its input norm, fused projection, heads, query/key norms and
    /// RoPE), for [`decode::NormQkv::heads_joint_cached`] or the previous block's
    /// [`decode::attention_mlp_qkv`], writing the keys and values into `cache` (the block's joint
    /// cache) where the kernel runs. Only for a block that [`step_parts`](Self::step_parts)
    /// accepts.
    fn qkv_step<'a>(
        &'a self,
        rope: &'a RotaryEmbedding<B>,
        at: &'a At<B>,
        cache: Option<&'a Tensor<B, 4>>,
    ) -> Option<decode::NormQkv<'a, B>> {
        let [qkv, ..] = self.step_parts()?;
        let attn = &self.self_attn;
        Some(decode::NormQkv {
            norm: &self.input_layernorm.weight,
            eps: self.input_layernorm.eps,
            layer: qkv,
            layout: QkvLayout {
                heads: attn.num_heads,
                kv_heads: attn.num_kv_heads,
                head_dim: attn.head_dim,
            },
            qk_norms: attn.qk_norm.as_ref().map(|(q, k)| (&q.weight, &k.weight)),
            qk_eps: attn.qk_norm.as_ref().map_or(0.0, |(q, _)| q.eps),
            rope,
            offset: at,
            cache,
        })
    }

    /// One decode step of the block on `x` (`[batch, hidden]`: the newest position of each of the
    /// cache's sequences, at `position`, with no padding; `at` and `len` are that position and
    /// the length attended over): the block's output, and with `next` (the next block and its
    /// cache), the next block's heads. `heads` are this block's, when the previous block made
    /// them. Each projection carries its neighbours ([`decode::norm_qkv_heads_joint`],
    /// [`decode::linear_add`], [`decode::norm_gated`]); with a joint cache everything once the
    /// new position is in the cache is [`decode::attention_mlp_qkv`] (with the next block's QKV
    /// step where there is a next block), and on CUDA the kernel that makes a block's keys and
    /// values also writes them into its cache, so the block is one kernel.
    ///
    /// Only for a block that [`step_parts`](Self::step_parts) accepts.
    #[allow(clippy::too_many_arguments)]
    fn step(
        &self,
        x: Tensor<B, 2>,
        heads: Option<JointHeads<B>>,
        next: Option<(&DecoderLayer<B>, &LayerCache<B>)>,
        cache: &mut LayerCache<B>,
        rope: &RotaryEmbedding<B>,
        position: &Position<B>,
        (at, len): (&At<B>, &At<B>),
    ) -> Result<(Tensor<B, 2>, Option<JointHeads<B>>)> {
        let (Some([_, o_proj, gate_up, down_proj]), Some(own)) =
            (self.step_parts(), self.qkv_step(rope, at, None))
        else {
            return Err(LlmError::Input(
                "DecoderLayer::step: the block has no fused projections free of low-rank updates"
                    .into(),
            ));
        };
        let (scale, gate) = self.attention_scale_and_gate();
        let post = &self.post_attention_layernorm;
        if cache.is_joint() {
            let heads = heads.unwrap_or_else(|| {
                let own = decode::NormQkv {
                    cache: cache.joint(),
                    ..own
                };
                own.heads_joint_cached(x.clone())
            });
            let kv = match cache.joint() {
                Some(buffer) if heads.cached => buffer.clone(),
                _ => cache.write_joint(heads.kv, position),
            };
            let next = next.and_then(|(n, c)| n.qkv_step(rope, at, c.joint()));
            return Ok(decode::attention_mlp_qkv(
                heads.q,
                kv,
                len,
                scale,
                x,
                o_proj,
                &post.weight,
                post.eps,
                gate_up,
                down_proj,
                gate,
                next.as_ref(),
            ));
        }
        let [q, k, v] = own.heads(x.clone());
        let (k, v) = cache.write_whole(k, v, position);
        let attended = decode::decode_attention(q, k, v, len, scale, None);
        let h = decode::linear_add(attended, o_proj, x);
        let act = decode::norm_gated(h.clone(), &post.weight, post.eps, gate_up, gate);
        Ok((decode::linear_add(act, down_proj, h), None))
    }

    /// [`forward`](Self::forward) for `batch` sequences of `seq` positions from 0 without a
    /// cache (training): causal attention, or the `sliding` mask where the layer has a window.
    fn forward_batch(
        &self,
        x: Tensor<B, 2>,
        shape: [usize; 2],
        rope: &RotaryEmbedding<B>,
        sliding: Option<&Tensor<B, 4, Bool>>,
    ) -> Result<Tensor<B, 2>> {
        let mask = match self.window {
            Some(_) => sliding,
            None => None,
        };
        let attended = self.self_attn.forward_batch(
            self.input_layernorm.forward_train(x.clone()),
            shape,
            rope,
            mask,
        )?;
        match &self.feedforward_norms {
            None => {
                let h = x + attended;
                let normed = self.post_attention_layernorm.forward_train(h.clone());
                Ok(h + self.mlp.forward(normed)?)
            }
            Some((pre, post)) => {
                let h = x + self.post_attention_layernorm.forward_train(attended);
                let out = self.mlp.forward(pre.forward_train(h.clone()))?;
                Ok(h + post.forward_train(out))
            }
        }
    }

    fn quantize(self, bits: QuantBits, i: usize, report: &mut QuantReport) -> Result<Self> {
        let p = format!("model.layers.{i}");
        Ok(Self {
            self_attn: self
                .self_attn
                .quantize(bits, &format!("{p}.self_attn"), report)?,
            mlp: self.mlp.quantize(bits, &format!("{p}.mlp"), report)?,
            ..self
        })
    }
}

/// What [`Llm::quantize`] did: which matrices it quantized and which it left in floating point
/// (their `in` is not a multiple of the group size).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuantReport {
    /// Bits per value, once quantized.
    pub bits: Option<QuantBits>,
    /// Names of the quantized matrices.
    pub quantized: Vec<String>,
    /// Names and `[out, in]` shapes of the matrices left in floating point.
    pub kept: Vec<(String, [usize; 2])>,
    /// Whether the quantized matrices are held in MLX's packed form (on `Mlx`); other backends
    /// hold them dequantized.
    pub mlx_packed: bool,
}

impl QuantReport {
    fn note(&mut self, name: &str, dims: [usize; 2], done: bool) {
        if done {
            self.quantized.push(name.to_string());
        } else {
            self.kept.push((name.to_string(), dims));
        }
    }

    /// One line for the user: what was quantized, what was kept, and why.
    pub fn summary(&self) -> String {
        let Some(bits) = self.bits else {
            return "not quantized".into();
        };
        let how = if self.mlx_packed {
            "MLX's affine format, products through MLX's quantized matmul"
        } else {
            "held dequantized: this backend has no quantized matmul"
        };
        let mut line = format!(
            "quantized {} matrices to {bits} (groups of {DEFAULT_GROUP_SIZE}, {how})",
            self.quantized.len()
        );
        if !self.kept.is_empty() {
            let mut shapes: Vec<String> = Vec::new();
            for (_, [out, input]) in &self.kept {
                let s = format!("[{out}, {input}]");
                if !shapes.contains(&s) {
                    shapes.push(s);
                }
            }
            line.push_str(&format!(
                "; kept {} in floating point (`in` not a multiple of {DEFAULT_GROUP_SIZE}: {})",
                self.kept.len(),
                shapes.join(", ")
            ));
        }
        line
    }
}

/// The token embedding table `[vocab, hidden]`, dense or quantized.
#[derive(Debug, Clone)]
pub enum Embedding<B: Backend> {
    /// The table in the model's dtype.
    Dense(Tensor<B, 2>),
    /// The table quantized in groups along `hidden` (mlx-lm's `QuantizedEmbedding`).
    Quantized(QuantizedMatrix<B>),
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
    embed_tokens: Embedding<B>,
    layers: Vec<DecoderLayer<B>>,
    norm: RmsNorm<B>,
    /// The output projection, `[vocab, hidden]` (the embedding table itself when tied).
    lm_head: Weight<B>,
    /// Rotary position embeddings, shared by every layer (but Gemma 3's sliding layers).
    rope: RotaryEmbedding<B>,
    /// The sliding layers' rotary embeddings (Gemma 3: another base).
    rope_local: Option<RotaryEmbedding<B>>,
    device: B::Device,
    dtype: DType,
    quant: QuantReport,
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
        let rope = rotary_embedding(&config, device);
        let rope_local = local_rotary_embedding(&config, device);
        Ok(Self {
            config,
            embed_tokens: Embedding::Dense(embed_tokens),
            layers,
            norm,
            lm_head: Weight::Dense(lm_head_t),
            rope,
            rope_local,
            device: device.clone(),
            dtype,
            quant: QuantReport::default(),
        })
    }

    /// The model with its matrices quantized to `bits` in groups of 64 values along their input
    /// dimension: every attention and MLP projection whose input size is a multiple of 64 (the
    /// others stay in floating point, as mlx-lm leaves them), the embedding table and the
    /// output projection (both quantized, as mlx-lm does; when tied, they are one quantized
    /// matrix). Norm weights stay in the model's dtype. On `Mlx` the products then run through
    /// MLX's quantized matmul; see [`burn_mlx::quant`] for other backends.
    ///
    /// Errors when the hidden size is not a multiple of 64 (the embedding, the output projection
    /// and most projections could not be quantized), or when the model is already quantized.
    pub fn quantize(self, bits: QuantBits) -> Result<Self> {
        let h = self.config.hidden_size;
        if let Some(done) = self.quant.bits {
            return Err(LlmError::Input(format!(
                "quantize to {bits}: the model is already quantized to {done}"
            )));
        }
        if !h.is_multiple_of(DEFAULT_GROUP_SIZE) {
            return Err(LlmError::Input(format!(
                "quantize to {bits}: hidden size {h} is not a multiple of the group size \
                 {DEFAULT_GROUP_SIZE} (MLX's quantized matmul groups each weight matrix [out, in] \
                 along `in`; embed_tokens is [{}, {h}])",
                self.config.vocab_size
            )));
        }
        let mut report = QuantReport {
            bits: Some(bits),
            ..QuantReport::default()
        };
        let layers = self
            .layers
            .into_iter()
            .enumerate()
            .map(|(i, layer)| layer.quantize(bits, i, &mut report))
            .collect::<Result<Vec<_>>>()?;
        let embed = match self.embed_tokens {
            Embedding::Dense(table) => QuantizedMatrix::quantize(table, bits, DEFAULT_GROUP_SIZE)?,
            Embedding::Quantized(q) => q,
        };
        report.note("model.embed_tokens", embed.dims(), true);
        report.mlx_packed = embed.is_mlx_packed();
        let lm_head = if self.config.tie_word_embeddings {
            Weight::Quantized(embed.clone())
        } else {
            let dims = self.lm_head.dims();
            let (w, done) = self.lm_head.quantize(bits)?;
            report.note("lm_head", dims, done);
            w
        };
        Ok(Self {
            embed_tokens: Embedding::Quantized(embed),
            layers,
            lm_head,
            quant: report,
            ..self
        })
    }

    /// The model with each block's query, key and value projections fused into one layer, and
    /// its gate and up projections into another: a decode step then runs two matrix products
    /// where it ran five, and the split, norms and RoPE of the heads, and the gated activation,
    /// go through [`burn_mlx::decode`]'s kernels. The outputs are the same within rounding.
    ///
    /// Projections that are quantized or carry a low-rank update stay separate, so fuse before
    /// [`quantize`](Self::quantize) (which keeps the fusion) and not for LoRA training, whose
    /// adapters name the separate layers ([`linear`](Self::linear) returns `None` for a fused
    /// one).
    pub fn fuse_projections(self) -> Self {
        let layers = self
            .layers
            .into_iter()
            .map(|mut layer| {
                layer.self_attn.qkv = layer.self_attn.qkv.fuse();
                layer.mlp.gate_up = layer.mlp.gate_up.fuse();
                layer
            })
            .collect();
        Self { layers, ..self }
    }

    /// Whether every block's projections are fused ([`fuse_projections`](Self::fuse_projections)).
    pub fn projections_fused(&self) -> bool {
        self.layers.iter().all(|l| {
            matches!(l.self_attn.qkv, Packed::Fused(..))
                && matches!(l.mlp.gate_up, Packed::Fused(..))
        })
    }

    /// What [`quantize`](Self::quantize) did (`bits` is `None` for a model in floating point).
    pub fn quantization(&self) -> &QuantReport {
        &self.quant
    }

    /// Bytes of the weights as held (quantized matrices count their packed values, scales and
    /// biases; a tied output projection is not counted twice).
    pub fn weight_bytes(&self) -> usize {
        let vector = |t: &Tensor<B, 1>| t.shape().num_elements() * t.dtype().size();
        let norm = |n: &RmsNorm<B>| vector(&n.weight);
        let linear = |l: &Linear<B>| l.weight.bytes() + l.bias.as_ref().map_or(0, vector);
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                let a = &l.self_attn;
                let qk = a.qk_norm.as_ref().map_or(0, |(q, k)| norm(q) + norm(k));
                a.qkv
                    .layers()
                    .into_iter()
                    .chain([&a.o_proj])
                    .chain(l.mlp.gate_up.layers())
                    .chain([&l.mlp.down_proj])
                    .map(linear)
                    .sum::<usize>()
                    + qk
                    + norm(&l.input_layernorm)
                    + norm(&l.post_attention_layernorm)
            })
            .sum();
        let embed = match &self.embed_tokens {
            Embedding::Dense(t) => t.shape().num_elements() * t.dtype().size(),
            Embedding::Quantized(q) => q.bytes(),
        };
        let head = if self.config.tie_word_embeddings {
            0
        } else {
            self.lm_head.bytes()
        };
        layers + embed + head + norm(&self.norm)
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

    /// A cache for `capacity` positions that fits this model. With fused projections where
    /// [`burn_mlx::decode`]'s kernels run, each layer's keys and values share one buffer, which a
    /// decode step updates once.
    pub fn new_cache(&self, capacity: usize) -> KvCache<B> {
        self.new_batch_cache(1, capacity)
    }

    /// A cache for `batch` sequences of `capacity` positions each, decoded together
    /// ([`crate::generate::generate_batch`]), in the layout of [`new_cache`](Self::new_cache).
    pub fn new_batch_cache(&self, batch: usize, capacity: usize) -> KvCache<B> {
        let joint = self.projections_fused() && decode::kernels_run::<B>(&self.device);
        KvCache::with_batch(
            &self.config,
            batch,
            capacity,
            &self.device,
            self.dtype,
            joint,
        )
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
        let ids: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, seq]), &self.device);
        self.forward_ids(ids, cache, which)
    }

    /// [`forward`](Self::forward) for token ids already on the device (`[batch, seq]`, `batch`
    /// the cache's: see [`KvCache::with_batch`]), such as the argmax of the previous step's
    /// logits: the step's graph can then be built before that token is known on the host. The
    /// ids must lie inside the vocabulary (unchecked here). Logits are `[batch·seq, vocab]`
    /// (rows of a sequence together) or, for the last positions, `[batch, vocab]`.
    pub fn forward_ids(
        &self,
        ids: Tensor<B, 2, Int>,
        cache: &mut KvCache<B>,
        which: Logits,
    ) -> Result<Tensor<B, 2>> {
        let [batch, seq] = ids.dims();
        if batch != cache.batch() || seq == 0 {
            return Err(LlmError::Input(format!(
                "forward: token ids must be [{}, seq] with seq >= 1 (the cache holds {} \
                 sequences), got [{batch}, {seq}]",
                cache.batch(),
                cache.batch()
            )));
        }
        cache.check(&self.config, seq)?;
        let position = Position::Host(cache.len());
        let padding = cache.padding().to_vec();
        let logits = self.forward_layers(ids, cache.layers(), &position, &padding, which)?;
        cache.advance(seq);
        Ok(logits)
    }

    /// The decode step of fixed shape: one token (`ids`, `[1, 1]`) at position `offset` (`[1]`,
    /// on the device), attending over the whole of each layer's key/value buffers in `layers`
    /// (the positions after `offset` masked out), which it returns with the new keys and values
    /// written, after the logits (`[1, vocab]`). Its graph is the same at every position, so
    /// on `Mlx` it is traced and compiled once (`step.rs`); on other backends it runs as it is.
    ///
    /// The offset must leave room in the buffers (the caller checks; see
    /// [`burn_mlx::fast::slice_assign_at`]).
    pub fn fixed_step(
        &self,
        ids: Tensor<B, 2, Int>,
        offset: Tensor<B, 1, Int>,
        mut layers: Vec<LayerCache<B>>,
    ) -> Result<(Tensor<B, 2>, Vec<LayerCache<B>>)> {
        let capacity = match layers.first() {
            Some(layer) => layer.capacity(),
            None => return Err(LlmError::Input("fixed_step: no layer caches".into())),
        };
        let window = self.config.sliding.as_ref().map(|s| s.window);
        let position = Position::device(offset, capacity, self.dtype, window);
        let logits = self.forward_layers(ids, &mut layers, &position, &[], Logits::Last)?;
        Ok((logits, layers))
    }

    /// The linear layer `key` (one of [`LINEAR_KEYS`]) of block `layer`; `None` for an unknown
    /// key or block, and for a projection fused with others ([`fuse_projections`](Self::fuse_projections)).
    pub fn linear(&self, layer: usize, key: &str) -> Option<&Linear<B>> {
        let l = self.layers.get(layer)?;
        match key {
            "self_attn.q_proj" => l.self_attn.qkv.part(0),
            "self_attn.k_proj" => l.self_attn.qkv.part(1),
            "self_attn.v_proj" => l.self_attn.qkv.part(2),
            "self_attn.o_proj" => Some(&l.self_attn.o_proj),
            "mlp.gate_proj" => l.mlp.gate_up.part(0),
            "mlp.up_proj" => l.mlp.gate_up.part(1),
            "mlp.down_proj" => Some(&l.mlp.down_proj),
            _ => None,
        }
    }

    /// [`linear`](Self::linear), mutable (to set its [`LoraUpdate`]).
    pub fn linear_mut(&mut self, layer: usize, key: &str) -> Option<&mut Linear<B>> {
        let l = self.layers.get_mut(layer)?;
        match key {
            "self_attn.q_proj" => l.self_attn.qkv.part_mut(0),
            "self_attn.k_proj" => l.self_attn.qkv.part_mut(1),
            "self_attn.v_proj" => l.self_attn.qkv.part_mut(2),
            "self_attn.o_proj" => Some(&mut l.self_attn.o_proj),
            "mlp.gate_proj" => l.mlp.gate_up.part_mut(0),
            "mlp.up_proj" => l.mlp.gate_up.part_mut(1),
            "mlp.down_proj" => Some(&mut l.mlp.down_proj),
            _ => None,
        }
    }

    /// The final hidden states (after the last norm) of `batch` sequences `tokens`
    /// (`[batch, seq]`, all starting at position 0; right padding does not reach earlier
    /// positions, since attention is causal), as `[batch·seq, hidden]`: the training pass,
    /// without a cache.
    pub fn hidden_batch(&self, tokens: Tensor<B, 2, Int>) -> Result<Tensor<B, 2>> {
        let [batch, seq] = tokens.dims();
        let h = self.config.hidden_size;
        if batch == 0 || seq == 0 {
            return Err(LlmError::Input(format!(
                "hidden_batch: tokens must be [batch, seq] with both >= 1, got [{batch}, {seq}]"
            )));
        }
        let x = match &self.embed_tokens {
            Embedding::Dense(table) => embedding(table.clone(), tokens),
            Embedding::Quantized(q) => q.rows(tokens)?,
        };
        let mut x = x.reshape([batch * seq, h]);
        if self.config.architecture == Architecture::Gemma3 {
            x = x * (h as f32).sqrt();
        }
        // Full-attention layers attend causally with no mask array (right padding needs none:
        // a real position never sees a later one); sliding layers also hide keys a window back.
        let sliding = self.config.sliding.as_ref().map(|s| {
            let queries = Tensor::<B, 1, Int>::arange(0..seq as i64, &self.device)
                .reshape([seq, 1])
                .expand([seq, seq]);
            let keys = Tensor::<B, 1, Int>::arange(0..seq as i64, &self.device)
                .reshape([1, seq])
                .expand([seq, seq]);
            let later = keys.clone().greater(queries.clone());
            let too_old = queries.sub(keys).greater_equal_elem(s.window as i64);
            later.bool_or(too_old).reshape([1, 1, seq, seq])
        });
        for layer in &self.layers {
            let rope = match (&self.rope_local, layer.window) {
                (Some(local), Some(_)) => local,
                _ => &self.rope,
            };
            x = layer.forward_batch(x, [batch, seq], rope, sliding.as_ref())?;
        }
        Ok(self.norm.forward_train(x))
    }

    /// Logits (in the model's dtype) of the rows `rows` of
    /// [`hidden_batch`](Self::hidden_batch)'s output.
    pub fn logits_of_rows(
        &self,
        hidden: Tensor<B, 2>,
        rows: Tensor<B, 1, Int>,
    ) -> Result<Tensor<B, 2>> {
        self.lm_head.matmul_t(hidden.select(0, rows))
    }

    /// The mean cross-entropy of predicting `targets` from the logits of flat positions
    /// `rows` (`row·seq + position`) of `tokens` (`[batch, seq]`): the language-model loss
    /// of a batch, over the target tokens only. Computed in f32.
    pub fn loss(
        &self,
        tokens: Tensor<B, 2, Int>,
        rows: Tensor<B, 1, Int>,
        targets: Tensor<B, 1, Int>,
    ) -> Result<Tensor<B, 1>> {
        let logits = self.logits_of_rows(self.hidden_batch(tokens)?, rows)?;
        Ok(functional::cross_entropy_f32(logits, targets))
    }

    /// The weighted sum of the cross-entropies of predicting `targets[p]` from the logits of
    /// every flat position `p` (`row·seq + position`) of `tokens` (`[batch, seq]`), weighted by
    /// `weights[p]` (see [`functional::cross_entropy_f32_weighted`]): [`loss`](Self::loss) with
    /// weights `1/count` on the positions that predict a target and 0 elsewhere, from tensors whose
    /// shapes depend only on the batch's padded shape. Computed in f32.
    pub fn loss_weighted(
        &self,
        tokens: Tensor<B, 2, Int>,
        targets: Tensor<B, 1, Int>,
        weights: Tensor<B, 1>,
    ) -> Result<Tensor<B, 1>> {
        let [batch, seq] = tokens.dims();
        let [n] = targets.dims();
        if n != batch * seq || weights.dims() != [n] {
            return Err(LlmError::Input(format!(
                "loss_weighted: tokens {:?} need {} targets and weights (one per position), got \
                 {n} targets and {:?} weights",
                tokens.dims(),
                batch * seq,
                weights.dims()
            )));
        }
        let logits = self.lm_head.matmul_t(self.hidden_batch(tokens)?)?;
        Ok(functional::cross_entropy_f32_weighted(
            logits, targets, weights,
        ))
    }

    /// Every block's decode step on `x` through [`decode::decoder_stack`] (one kernel on CUDA),
    /// with joint caches; `x` back where it does not run.
    fn decoder_stack(
        &self,
        x: Tensor<B, 2>,
        caches: &[LayerCache<B>],
        at: &At<B>,
        len: &At<B>,
    ) -> std::result::Result<Tensor<B, 2>, Tensor<B, 2>> {
        if !decode::kernels_run::<B>(&self.device) {
            return Err(x);
        }
        let blocks: Option<Vec<decode::StackBlock<'_, B>>> = self
            .layers
            .iter()
            .zip(caches)
            .map(|(layer, cache)| {
                let [_, o_proj, gate_up, down] = layer.step_parts()?;
                let post = &layer.post_attention_layernorm;
                Some(decode::StackBlock {
                    qkv: layer.qkv_step(&self.rope, at, Some(cache.joint()?))?,
                    o_proj,
                    norm: &post.weight,
                    eps: post.eps,
                    gate_up,
                    down,
                })
            })
            .collect();
        let (Some(blocks), Some(first)) = (blocks, self.layers.first()) else {
            return Err(x);
        };
        let (scale, gate) = first.attention_scale_and_gate();
        decode::decoder_stack(x, &blocks, len, scale, gate)
    }

    /// Embeds `ids` (`[batch, seq]`), runs every layer with its cache, and projects to logits.
    /// `padding` gives each row's padded positions (empty, or all 0: none).
    fn forward_layers(
        &self,
        ids: Tensor<B, 2, Int>,
        caches: &mut [LayerCache<B>],
        position: &Position<B>,
        padding: &[usize],
        which: Logits,
    ) -> Result<Tensor<B, 2>> {
        let [batch, seq] = ids.dims();
        let x = match &self.embed_tokens {
            Embedding::Dense(table) => embedding(table.clone(), ids),
            Embedding::Quantized(q) => q.rows(ids)?,
        };
        let mut x = x.reshape([batch * seq, self.config.hidden_size]);
        if self.config.architecture == Architecture::Gemma3 {
            // Gemma scales the embeddings by sqrt(hidden), rounded to the weights' dtype.
            x = x * (self.config.hidden_size as f32).sqrt();
        }
        let window = self.config.sliding.as_ref().map(|s| s.window);
        let masks = match position {
            // A padded batch: every layer takes a mask that hides each row's padding.
            Position::Host(offset) if padding.iter().any(|&p| p > 0) => {
                let mask = |w| padded_mask::<B>(*offset, seq, padding, w, &self.device, self.dtype);
                PassMasks {
                    full: Some(mask(None)),
                    sliding: window.map(|w| mask(Some(w))),
                }
            }
            // The sliding layers' banded mask, when several positions run past the window.
            Position::Host(offset) => PassMasks {
                full: None,
                sliding: window
                    .filter(|&w| seq > 1 && offset + seq > w)
                    .map(|w| sliding_band::<B>(*offset, seq, w, &self.device, self.dtype)),
            },
            Position::Device { .. } => PassMasks::default(),
        };
        // One position per sequence, a few sequences, no masks: each block a decode step of
        // fused projections, where every block has them.
        let step = seq == 1
            && batch <= decode::MAX_FUSED_ROWS
            && masks.full.is_none()
            && masks.sliding.is_none()
            && self.layers.iter().all(|l| l.step_parts().is_some());
        if step {
            let (at, len) = (decode_position(position), decode_length(position));
            // With joint caches each block's kernel also makes the next block's heads.
            let joint = caches.iter().all(LayerCache::is_joint);
            if joint {
                // The whole stack as one kernel where it runs (it writes every cache itself).
                match self.decoder_stack(x, caches, &at, &len) {
                    Ok(y) => return self.lm_head.matmul_t(self.norm.forward(y)),
                    Err(back) => x = back,
                }
            }
            let mut heads = None;
            for (i, layer) in self.layers.iter().enumerate() {
                let (done, rest) = caches.split_at_mut(i + 1);
                let next = self.layers.get(i + 1).filter(|_| joint).zip(rest.first());
                (x, heads) = layer.step(
                    x,
                    heads,
                    next,
                    &mut done[i],
                    &self.rope,
                    position,
                    (&at, &len),
                )?;
            }
            return self.lm_head.matmul_t(self.norm.forward(x));
        }
        let mut normed = match self.layers.first() {
            Some(first) => first.input_layernorm.forward(x.clone()),
            None => self.norm.forward(x.clone()),
        };
        for (i, (layer, layer_cache)) in self.layers.iter().zip(caches).enumerate() {
            let rope = match (&self.rope_local, layer.window) {
                (Some(local), Some(_)) => local,
                _ => &self.rope,
            };
            let next_norm = self
                .layers
                .get(i + 1)
                .map_or(&self.norm, |next| &next.input_layernorm);
            (x, normed) =
                layer.forward(x, normed, next_norm, layer_cache, rope, position, &masks)?;
        }
        let x = normed;
        let x = match which {
            Logits::All => x,
            Logits::Last if batch == 1 => x.narrow(0, seq - 1, 1),
            Logits::Last => {
                let h = self.config.hidden_size;
                x.reshape([batch, seq, h])
                    .narrow(1, seq - 1, 1)
                    .reshape([batch, h])
            }
        };
        self.lm_head.matmul_t(x)
    }
}

/// The additive attention masks of one forward pass over a host position that replace
/// attention's own rules (causal, and a sliding layer's window), for the full-attention layers
/// and for the sliding ones; `None` where the rules apply.
#[derive(Debug)]
struct PassMasks<B: Backend> {
    full: Option<Tensor<B, 4>>,
    sliding: Option<Tensor<B, 4>>,
}

impl<B: Backend> Default for PassMasks<B> {
    fn default() -> Self {
        Self {
            full: None,
            sliding: None,
        }
    }
}

impl<B: Backend> PassMasks<B> {
    /// The mask of a layer with sliding `window` (or of full attention).
    fn pick(&self, window: Option<usize>) -> Option<&Tensor<B, 4>> {
        match window {
            Some(_) => self.sliding.as_ref(),
            None => self.full.as_ref(),
        }
    }
}
