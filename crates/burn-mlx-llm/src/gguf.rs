//! llama.cpp's GGUF files, for Gemma 3: the hyper-parameters from the file's metadata, every
//! tensor read and dequantized to f32 with the `candle-core` crate's GGUF reader (which knows
//! llama.cpp's k-quants: Q4_K, Q5_0, Q6_K, Q8_0, ...), then converted to the model's dtype, under
//! the Hugging Face names the decoder asks for. The weights are held dequantized (GGUF's block
//! formats are not MLX's; `--quantize` re-quantizes them to MLX's format if asked).
//!
//! Gemma 3 is the one architecture read from GGUF: llama.cpp stores Llama-family query and key
//! matrices with their rows permuted for its own RoPE layout, which this loader does not undo, so
//! other architectures are refused with an error. llama.cpp also stores Gemma's RMSNorm weights
//! as `1 + w` (Gemma multiplies by `1 + w`); the decoder multiplies by the stored value.

use super::config::{Architecture, LlmConfig, RopeScaling, SlidingWindow};
use super::error::{LlmError, Result};
use super::model::{Llm, ParamSource};
use burn_tensor::backend::Backend;
use burn_tensor::{DType, Tensor, TensorData};
use candle_core::quantized::gguf_file::{Content, Value};
use std::fs::File;
use std::path::{Path, PathBuf};

/// Gemma 3's pattern: every sixth layer attends globally, the others over the sliding window.
const GEMMA3_GLOBAL_EVERY: usize = 6;
/// Gemma 3's RoPE base for the sliding layers (transformers' `rope_local_base_freq`; llama.cpp
/// does not store it).
const GEMMA3_LOCAL_ROPE_THETA: f64 = 10_000.0;

/// Whether `path` names a GGUF file (by its extension).
pub fn is_gguf(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// An open GGUF file: its header, and the file to read tensors from.
pub struct GgufFile {
    path: PathBuf,
    file: File,
    content: Content,
}

impl GgufFile {
    /// Opens `path` and reads its header (metadata and tensor table).
    pub fn open(path: &Path) -> Result<Self> {
        let io = |e: std::io::Error| LlmError::Io {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        let mut file = File::open(path).map_err(io)?;
        let size = file.metadata().map_err(io)?.len();
        let content = Content::read(&mut file).map_err(|e| LlmError::BadWeights {
            path: path.to_path_buf(),
            size,
            reason: format!("not a readable GGUF file: {e}"),
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            content,
        })
    }

    fn bad(&self, reason: String) -> LlmError {
        LlmError::Config {
            path: self.path.clone(),
            message: reason,
        }
    }

    fn meta(&self, key: &str) -> Result<&Value> {
        self.content
            .metadata
            .get(key)
            .ok_or_else(|| self.bad(format!("metadata `{key}` is missing")))
    }

    fn int(&self, key: &str) -> Result<usize> {
        let v = self.meta(key)?;
        v.to_u32()
            .map(|n| n as usize)
            .or_else(|_| v.to_u64().map(|n| n as usize))
            .or_else(|_| v.to_i32().map(|n| n.max(0) as usize))
            .map_err(|_| self.bad(format!("metadata `{key}` = {v:?} is not an integer")))
    }

    fn float(&self, key: &str) -> Result<f64> {
        let v = self.meta(key)?;
        v.to_f32()
            .map(f64::from)
            .map_err(|_| self.bad(format!("metadata `{key}` = {v:?} is not a number")))
    }

    /// The model's hyper-parameters, from the metadata.
    pub fn config(&self) -> Result<LlmConfig> {
        let arch = self
            .meta("general.architecture")?
            .to_string()
            .map_err(|_| self.bad("`general.architecture` is not a string".into()))?
            .clone();
        if arch != "gemma3" {
            return Err(LlmError::UnknownArchitecture {
                path: self.path.clone(),
                found: format!("{arch} (GGUF)"),
                supported: vec!["gemma3 (GGUF)".into()],
            });
        }
        let k = |name: &str| format!("gemma3.{name}");
        let num_layers = self.int(&k("block_count"))?;
        let num_heads = self.int(&k("attention.head_count"))?;
        let num_kv_heads = self.int(&k("attention.head_count_kv"))?;
        let head_dim = self.int(&k("attention.key_length"))?;
        let value_dim = self.int(&k("attention.value_length"))?;
        if value_dim != head_dim || num_kv_heads == 0 || !num_heads.is_multiple_of(num_kv_heads) {
            return Err(self.bad(format!(
                "unsupported attention shape: {num_heads} query heads, {num_kv_heads} key/value \
                 heads, key length {head_dim}, value length {value_dim}"
            )));
        }
        let vocab_size = self
            .meta("tokenizer.ggml.tokens")?
            .to_vec()
            .map_err(|_| self.bad("`tokenizer.ggml.tokens` is not an array".into()))?
            .len();
        let eos = self.int("tokenizer.ggml.eos_token_id")? as u32;
        let window = self.int(&k("attention.sliding_window"))?;
        Ok(LlmConfig {
            architecture: Architecture::Gemma3,
            vocab_size,
            hidden_size: self.int(&k("embedding_length"))?,
            intermediate_size: self.int(&k("feed_forward_length"))?,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: self.float(&k("attention.layer_norm_rms_epsilon"))?,
            rope_theta: self.float(&k("rope.freq_base"))?,
            rope_scaling: RopeScaling::None,
            tie_word_embeddings: !self.content.tensor_infos.contains_key("output.weight"),
            attention_bias: false,
            mlp_bias: false,
            max_position_embeddings: self.int(&k("context_length"))?,
            eos_token_ids: vec![eos],
            sliding: Some(SlidingWindow {
                window,
                layers: (0..num_layers)
                    .map(|i| (i + 1) % GEMMA3_GLOBAL_EVERY != 0)
                    .collect(),
                rope_theta: GEMMA3_LOCAL_ROPE_THETA,
            }),
        })
    }

    /// The file's vocabulary (`tokenizer.ggml.tokens`), to print generated tokens as text.
    pub fn vocabulary(&self) -> Result<Vec<String>> {
        let tokens = self
            .meta("tokenizer.ggml.tokens")?
            .to_vec()
            .map_err(|_| self.bad("`tokenizer.ggml.tokens` is not an array".into()))?;
        Ok(tokens
            .iter()
            .map(|t| t.to_string().cloned().unwrap_or_default())
            .collect())
    }

    /// The tensor `gguf_name` dequantized to f32, checked against `shape` (row-major).
    fn read(&mut self, hf_name: &str, gguf_name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let path = self.path.clone();
        let missing = || LlmError::MissingTensor {
            path: path.clone(),
            tensor: format!("{gguf_name} (for {hf_name})"),
            expected: shape.to_vec(),
        };
        let info = self
            .content
            .tensor_infos
            .get(gguf_name)
            .ok_or_else(missing)?;
        let found: Vec<usize> = info.shape.dims().to_vec();
        if found != shape {
            return Err(LlmError::WrongShape {
                path: self.path.clone(),
                tensor: gguf_name.to_string(),
                expected: shape.to_vec(),
                found,
            });
        }
        let cpu = candle_core::Device::Cpu;
        let fail = |e: candle_core::Error| LlmError::BadWeights {
            path: path.clone(),
            size: 0,
            reason: format!("tensor `{gguf_name}` could not be read or dequantized: {e}"),
        };
        let q = self
            .content
            .tensor(&mut self.file, gguf_name, &cpu)
            .map_err(fail)?;
        q.dequantize(&cpu)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(fail)
    }
}

/// llama.cpp's name of the tensor Hugging Face calls `name` (Gemma 3 layout).
fn gguf_name(name: &str) -> Option<String> {
    let fixed = match name {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, leaf) = rest.split_once('.')?;
    let leaf = match leaf {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "post_attention_norm.weight",
        "pre_feedforward_layernorm.weight" => "ffn_norm.weight",
        "post_feedforward_layernorm.weight" => "post_ffw_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        _ => return None,
    };
    Some(format!("blk.{layer}.{leaf}"))
}

/// Parameters read from a GGUF file, in the model's dtype on its device.
struct GgufParams<'a, B: Backend> {
    file: &'a mut GgufFile,
    device: B::Device,
    dtype: DType,
}

impl<B: Backend> GgufParams<'_, B> {
    fn tensor<const D: usize>(&mut self, name: &str, shape: [usize; D]) -> Result<Tensor<B, D>> {
        let gguf = gguf_name(name).ok_or_else(|| LlmError::MissingTensor {
            path: self.file.path.clone(),
            tensor: format!("{name} (no GGUF name for it)"),
            expected: shape.to_vec(),
        })?;
        let values = self.file.read(name, &gguf, &shape)?;
        Ok(Tensor::from_data(
            TensorData::new(values, shape),
            (&self.device, self.dtype),
        ))
    }
}

impl<B: Backend> ParamSource<B> for GgufParams<'_, B> {
    fn vector(&mut self, name: &str, shape: [usize; 1]) -> Result<Tensor<B, 1>> {
        self.tensor(name, shape)
    }

    fn matrix(&mut self, name: &str, shape: [usize; 2]) -> Result<Tensor<B, 2>> {
        self.tensor(name, shape)
    }
}

impl GgufFile {
    /// The file's model as a decoder in `dtype` on `device`.
    pub fn load_model<B: Backend>(&mut self, device: &B::Device, dtype: DType) -> Result<Llm<B>> {
        let config = self.config()?;
        let mut params = GgufParams::<B> {
            file: self,
            device: device.clone(),
            dtype,
        };
        Llm::build(config, &mut params, device, dtype)
    }
}

/// Loads a Gemma 3 GGUF file as a decoder in `dtype` on `device`.
pub fn load_gguf<B: Backend>(path: &Path, device: &B::Device, dtype: DType) -> Result<Llm<B>> {
    GgufFile::open(path)?.load_model(device, dtype)
}

/// Text of `tokens` from a GGUF vocabulary (SentencePiece pieces: `▁` is a space, `<0xNN>` a
/// byte).
pub fn decode(vocabulary: &[String], tokens: &[u32]) -> String {
    let mut bytes = Vec::new();
    for &t in tokens {
        let piece = vocabulary.get(t as usize).map_or("", String::as_str);
        match piece
            .strip_prefix("<0x")
            .and_then(|h| h.strip_suffix('>'))
            .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            Some(byte) => bytes.push(byte),
            None => bytes.extend_from_slice(piece.replace('\u{2581}', " ").as_bytes()),
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}
