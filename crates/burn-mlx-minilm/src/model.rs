//! The BERT encoder of all-MiniLM-L6-v2 and the sentence-transformers pooling on top of it.

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Int, Tensor};
use burn_nn::{Embedding, EmbeddingConfig, Gelu, LayerNorm, LayerNormConfig, Linear, LinearConfig};

/// The hyper-parameters read from the model's `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    /// Number of word-piece tokens.
    pub vocab_size: usize,
    /// Width of the hidden states.
    pub hidden_size: usize,
    /// Number of encoder layers.
    pub num_layers: usize,
    /// Number of attention heads per layer.
    pub num_heads: usize,
    /// Width of the feed-forward block.
    pub intermediate_size: usize,
    /// Number of learned positions.
    pub max_position_embeddings: usize,
    /// Number of token types (segments).
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
}

impl BertConfig {
    /// Parses the numeric fields of a Hugging Face BERT `config.json` (a flat JSON object).
    pub fn from_json(text: &str) -> Result<Self, String> {
        let int = |key: &str| -> Result<usize, String> {
            let v = json_number(text, key)?;
            if v < 0.0 || v.fract() != 0.0 {
                return Err(format!(
                    "config.json: `{key}` = {v} is not a non-negative integer"
                ));
            }
            Ok(v as usize)
        };
        let act = json_string(text, "hidden_act").unwrap_or_else(|| "gelu".into());
        if act != "gelu" {
            return Err(format!(
                "config.json: hidden_act `{act}` is not supported (only exact `gelu`)"
            ));
        }
        let config = Self {
            vocab_size: int("vocab_size")?,
            hidden_size: int("hidden_size")?,
            num_layers: int("num_hidden_layers")?,
            num_heads: int("num_attention_heads")?,
            intermediate_size: int("intermediate_size")?,
            max_position_embeddings: int("max_position_embeddings")?,
            type_vocab_size: int("type_vocab_size")?,
            layer_norm_eps: json_number(text, "layer_norm_eps")?,
        };
        if config.num_heads == 0 || !config.hidden_size.is_multiple_of(config.num_heads) {
            return Err(format!(
                "config.json: hidden_size {} is not a multiple of num_attention_heads {}",
                config.hidden_size, config.num_heads
            ));
        }
        Ok(config)
    }

    /// A model with these dimensions and freshly initialized weights (load real ones after).
    pub fn init<B: Backend>(&self, device: &B::Device) -> BertModel<B> {
        let norm = || {
            LayerNormConfig::new(self.hidden_size)
                .with_epsilon(self.layer_norm_eps)
                .init(device)
        };
        BertModel {
            embeddings: Embeddings {
                word_embeddings: EmbeddingConfig::new(self.vocab_size, self.hidden_size)
                    .init(device),
                position_embeddings: EmbeddingConfig::new(
                    self.max_position_embeddings,
                    self.hidden_size,
                )
                .init(device),
                token_type_embeddings: EmbeddingConfig::new(self.type_vocab_size, self.hidden_size)
                    .init(device),
                norm: norm(),
            },
            layers: (0..self.num_layers)
                .map(|_| EncoderLayer {
                    attention: SelfAttention {
                        query: LinearConfig::new(self.hidden_size, self.hidden_size).init(device),
                        key: LinearConfig::new(self.hidden_size, self.hidden_size).init(device),
                        value: LinearConfig::new(self.hidden_size, self.hidden_size).init(device),
                        output: LinearConfig::new(self.hidden_size, self.hidden_size).init(device),
                        num_heads: self.num_heads,
                    },
                    attention_norm: norm(),
                    ffn_up: LinearConfig::new(self.hidden_size, self.intermediate_size)
                        .init(device),
                    ffn_down: LinearConfig::new(self.intermediate_size, self.hidden_size)
                        .init(device),
                    ffn_norm: norm(),
                    gelu: Gelu::new(),
                })
                .collect(),
        }
    }
}

/// The number after `"key":` in a flat JSON object.
fn json_number(text: &str, key: &str) -> Result<f64, String> {
    let rest = json_value(text, key).ok_or_else(|| format!("config.json: no `{key}`"))?;
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || "+-.eE".contains(c)))
        .unwrap_or(rest.len());
    rest[..end]
        .parse()
        .map_err(|e| format!("config.json: `{key}` is not a number: {e}"))
}

/// The string after `"key":` in a flat JSON object.
fn json_string(text: &str, key: &str) -> Option<String> {
    let rest = json_value(text, key)?.strip_prefix('"')?;
    Some(rest[..rest.find('"')?].to_string())
}

/// The text right after `"key":` (leading blanks skipped).
fn json_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let pattern = format!("\"{key}\"");
    let at = text.find(&pattern)? + pattern.len();
    Some(text[at..].trim_start().strip_prefix(':')?.trim_start())
}

/// Word + position + token-type embeddings, then LayerNorm.
#[derive(Module, Debug)]
pub struct Embeddings<B: Backend> {
    /// Word-piece embeddings `[vocab, hidden]`.
    pub word_embeddings: Embedding<B>,
    /// Absolute position embeddings `[max_positions, hidden]`.
    pub position_embeddings: Embedding<B>,
    /// Segment embeddings `[type_vocab, hidden]`.
    pub token_type_embeddings: Embedding<B>,
    /// LayerNorm over the sum (HF `embeddings.LayerNorm`).
    pub norm: LayerNorm<B>,
}

impl<B: Backend> Embeddings<B> {
    /// `[batch, seq]` token and type ids to `[batch, seq, hidden]`.
    pub fn forward(&self, ids: Tensor<B, 2, Int>, type_ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [_, seq] = ids.dims();
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &ids.device()).reshape([1, seq]);
        let sum = self.word_embeddings.forward(ids)
            + self.position_embeddings.forward(positions)
            + self.token_type_embeddings.forward(type_ids);
        self.norm.forward(sum)
    }
}

/// Multi-head self-attention with its output projection (HF `attention.self` + `attention.output.dense`).
#[derive(Module, Debug)]
pub struct SelfAttention<B: Backend> {
    /// Query projection.
    pub query: Linear<B>,
    /// Key projection.
    pub key: Linear<B>,
    /// Value projection.
    pub value: Linear<B>,
    /// Output projection.
    pub output: Linear<B>,
    /// Number of heads.
    pub num_heads: usize,
}

impl<B: Backend> SelfAttention<B> {
    /// `x`: `[batch, seq, hidden]`; `mask_bias`: `[batch, 1, 1, seq]`, 0 on real tokens and a large
    /// negative value on padding, added to the attention scores.
    pub fn forward(&self, x: Tensor<B, 3>, mask_bias: Tensor<B, 4>) -> Tensor<B, 3> {
        let [batch, seq, hidden] = x.dims();
        let head_dim = hidden / self.num_heads;
        let heads = |t: Tensor<B, 3>| {
            t.reshape([batch, seq, self.num_heads, head_dim])
                .swap_dims(1, 2)
        };
        let q = heads(self.query.forward(x.clone()));
        let k = heads(self.key.forward(x.clone()));
        let v = heads(self.value.forward(x));
        let scores = q
            .matmul(k.swap_dims(2, 3))
            .mul_scalar(1.0 / (head_dim as f64).sqrt())
            + mask_bias;
        let context = softmax(scores, 3)
            .matmul(v)
            .swap_dims(1, 2)
            .reshape([batch, seq, hidden]);
        self.output.forward(context)
    }
}

/// One post-LayerNorm BERT encoder layer.
#[derive(Module, Debug)]
pub struct EncoderLayer<B: Backend> {
    /// Self-attention block.
    pub attention: SelfAttention<B>,
    /// LayerNorm after the attention residual (HF `attention.output.LayerNorm`).
    pub attention_norm: LayerNorm<B>,
    /// Feed-forward expansion (HF `intermediate.dense`).
    pub ffn_up: Linear<B>,
    /// Feed-forward projection back (HF `output.dense`).
    pub ffn_down: Linear<B>,
    /// LayerNorm after the feed-forward residual (HF `output.LayerNorm`).
    pub ffn_norm: LayerNorm<B>,
    /// Exact (erf) GELU.
    pub gelu: Gelu,
}

impl<B: Backend> EncoderLayer<B> {
    /// `[batch, seq, hidden]` to `[batch, seq, hidden]`.
    pub fn forward(&self, x: Tensor<B, 3>, mask_bias: Tensor<B, 4>) -> Tensor<B, 3> {
        let x = self
            .attention_norm
            .forward(x.clone() + self.attention.forward(x, mask_bias));
        let ffn = self
            .ffn_down
            .forward(self.gelu.forward(self.ffn_up.forward(x.clone())));
        self.ffn_norm.forward(x + ffn)
    }
}

/// The BERT encoder plus sentence-transformers mean pooling and L2 normalization.
#[derive(Module, Debug)]
pub struct BertModel<B: Backend> {
    /// Input embeddings.
    pub embeddings: Embeddings<B>,
    /// Encoder layers (HF `encoder.layer.N`).
    pub layers: Vec<EncoderLayer<B>>,
}

impl<B: Backend> BertModel<B> {
    /// The float dtype the model's parameters are held in.
    pub fn dtype(&self) -> burn::tensor::DType {
        self.embeddings.word_embeddings.weight.val().dtype()
    }

    /// Last hidden states `[batch, seq, hidden]` for `[batch, seq]` ids, type ids and attention
    /// mask (1 on real tokens, 0 on padding).
    pub fn encode(
        &self,
        ids: Tensor<B, 2, Int>,
        type_ids: Tensor<B, 2, Int>,
        mask: Tensor<B, 2, Int>,
    ) -> Tensor<B, 3> {
        let [batch, seq] = mask.dims();
        // 0 on tokens, -1e4 on padding: exp() of it underflows to 0 in f32, f16 and bf16 alike.
        let bias = mask
            .float()
            .cast(self.dtype())
            .sub_scalar(1.0)
            .mul_scalar(1.0e4)
            .reshape([batch, 1, 1, seq]);
        let mut x = self.embeddings.forward(ids, type_ids);
        for layer in &self.layers {
            x = layer.forward(x, bias.clone());
        }
        x
    }

    /// Sentence embeddings `[batch, hidden]`: mean of the hidden states over the real tokens,
    /// then divided by its L2 norm (sentence-transformers `Pooling` + `Normalize`).
    pub fn embed(
        &self,
        ids: Tensor<B, 2, Int>,
        type_ids: Tensor<B, 2, Int>,
        mask: Tensor<B, 2, Int>,
    ) -> Tensor<B, 2> {
        let [batch, seq] = mask.dims();
        let hidden = self.encode(ids, type_ids, mask.clone());
        let weights = mask.float().cast(self.dtype()).reshape([batch, seq, 1]);
        let summed = (hidden * weights.clone()).sum_dim(1).squeeze_dim::<2>(1);
        let counts = weights.sum_dim(1).squeeze_dim::<2>(1).clamp_min(1e-9);
        let pooled = summed / counts;
        let norm = pooled
            .clone()
            .powi_scalar(2)
            .sum_dim(1)
            .sqrt()
            .clamp_min(1e-12);
        pooled / norm
    }

    /// The same model with every float parameter cast to `dtype` (e.g. f16/bf16 inference).
    pub fn cast(self, dtype: FloatDType) -> Self {
        self.map(&mut CastParams { dtype })
    }
}

/// Casts every float parameter of a module to one dtype.
struct CastParams {
    dtype: FloatDType,
}

impl<B: Backend> ModuleMapper<B> for CastParams {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let dtype = self.dtype;
        param.map(|t| t.cast(dtype))
    }
}
