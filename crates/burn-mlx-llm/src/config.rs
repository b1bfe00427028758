//! The model's hyper-parameters, read from a Hugging Face `config.json` (Llama, Qwen3 and Gemma 3
//! text, in the transformers 4 form with `rope_theta`/`rope_scaling` and the transformers 5 form
//! with `rope_parameters`), or taken from a named preset for random-weight benchmarks.

use super::error::{LlmError, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The model families this decoder implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM` (Llama 2/3 and the many models that share its layout).
    Llama,
    /// `Qwen3ForCausalLM`: Llama's layout plus an RMSNorm over each query and key head.
    Qwen3,
    /// Gemma 3 (text; `Gemma3ForCausalLM`, `model_type` `gemma3_text`), from a Hugging Face
    /// folder or a llama.cpp GGUF file (`gguf.rs`): Qwen3's q/k norms, RMSNorms also after
    /// attention and around the MLP, a GELU (tanh) gated MLP, embeddings scaled by
    /// `sqrt(hidden)`, and sliding-window layers with their own RoPE base. Its RMSNorms multiply
    /// by `1 + w`; the model multiplies by the stored vector, which GGUF files hold as `1 + w`
    /// and Hugging Face folders as `w` (`weights.rs` adds the 1 when it loads one).
    Gemma3,
}

impl Architecture {
    /// The Hugging Face class names and `model_type` values that map to each family.
    const NAMES: &'static [(&'static str, Architecture)] = &[
        ("LlamaForCausalLM", Architecture::Llama),
        ("llama", Architecture::Llama),
        ("Qwen3ForCausalLM", Architecture::Qwen3),
        ("qwen3", Architecture::Qwen3),
        ("Gemma3ForCausalLM", Architecture::Gemma3),
        ("gemma3_text", Architecture::Gemma3),
    ];

    /// Looks a class name or `model_type` up.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, arch)| arch)
    }

    /// Every accepted name, for error messages.
    pub fn supported() -> Vec<String> {
        Self::NAMES.iter().map(|(n, _)| n.to_string()).collect()
    }
}

/// How rotary frequencies are rescaled for long contexts (`rope_scaling`/`rope_parameters`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE (`rope_type` absent or `default`).
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// Llama 3.1's rule: long wavelengths divided by `factor`, short ones kept, a smooth blend
    /// in between.
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context length the model was pre-trained with.
        original_max_position_embeddings: f64,
    },
}

/// Everything the decoder needs to know about its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmConfig {
    /// The model family.
    pub architecture: Architecture,
    /// Number of tokens.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_layers: usize,
    /// Number of query heads.
    pub num_heads: usize,
    /// Number of key/value heads (grouped-query attention when below `num_heads`).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE rescaling.
    pub rope_scaling: RopeScaling,
    /// Whether the output projection reuses the token embedding.
    pub tie_word_embeddings: bool,
    /// Whether q/k/v/o projections have biases (`attention_bias`).
    pub attention_bias: bool,
    /// Whether the MLP projections have biases (`mlp_bias`, Llama only).
    pub mlp_bias: bool,
    /// The longest context the model was trained for (caps the cache by default).
    pub max_position_embeddings: usize,
    /// Tokens that end generation.
    pub eos_token_ids: Vec<u32>,
    /// Sliding-window attention (Gemma 3): the window, the layers that use it (the others
    /// attend to the whole context) and their RoPE base. `None` for full attention everywhere.
    pub sliding: Option<SlidingWindow>,
}

/// Gemma 3's local attention layers.
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    /// Positions a query of a sliding layer sees (itself and the `window - 1` before it).
    pub window: usize,
    /// Whether each layer slides (the others attend to every position).
    pub layers: Vec<bool>,
    /// The RoPE base of the sliding layers (`rope_theta` is the global layers').
    pub rope_theta: f64,
}

/// The random-weight presets of `--bench`, by name.
pub const PRESETS: &[&str] = &["qwen3-0.6b", "llama3.2-1b", "small"];

impl LlmConfig {
    /// Reads `dir/config.json`, adding the end-of-sequence ids of `dir/generation_config.json`
    /// when that file exists.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let mut config = Self::from_file(&dir.join("config.json"))?;
        let gen_path = dir.join("generation_config.json");
        if let Ok(text) = std::fs::read_to_string(&gen_path) {
            let json: Value = serde_json::from_str(&text).map_err(|e| LlmError::Config {
                path: gen_path.clone(),
                message: format!("not valid JSON: {e}"),
            })?;
            let ids = match json.get("eos_token_id") {
                Some(Value::Array(ids)) => ids.iter().filter_map(Value::as_u64).collect(),
                Some(v) => v.as_u64().into_iter().collect(),
                None => vec![],
            };
            for id in ids {
                if !config.eos_token_ids.contains(&(id as u32)) {
                    config.eos_token_ids.push(id as u32);
                }
            }
        }
        Ok(config)
    }

    /// Reads and checks `path` (a Hugging Face `config.json`).
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| LlmError::Io {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Self::from_json(&text, path)
    }

    /// Parses the text of a `config.json`; `path` only names it in errors.
    pub fn from_json(text: &str, path: &Path) -> Result<Self> {
        let err = |message: String| LlmError::Config {
            path: path.to_path_buf(),
            message,
        };
        let json: Value =
            serde_json::from_str(text).map_err(|e| err(format!("not valid JSON: {e}")))?;
        let obj = json
            .as_object()
            .ok_or_else(|| err("not a JSON object".into()))?;

        // The family: `architectures[0]`, else `model_type`.
        let arch_name = match obj.get("architectures").and_then(Value::as_array) {
            Some(list) if !list.is_empty() => list[0]
                .as_str()
                .ok_or_else(|| err("`architectures` holds a non-string".into()))?
                .to_string(),
            _ => obj
                .get("model_type")
                .and_then(Value::as_str)
                .ok_or_else(|| err("neither `architectures` nor `model_type` is given".into()))?
                .to_string(),
        };
        let architecture =
            Architecture::from_name(&arch_name).ok_or_else(|| LlmError::UnknownArchitecture {
                path: path.to_path_buf(),
                found: arch_name.clone(),
                supported: Architecture::supported(),
            })?;

        let present = |key: &str| obj.get(key).filter(|v| !v.is_null());
        let usize_of = |key: &str, v: &Value| -> Result<usize> {
            v.as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| err(format!("`{key}` = {v} is not a non-negative integer")))
        };
        let int = |key: &str| -> Result<usize> {
            let v = present(key).ok_or_else(|| err(format!("`{key}` is missing")))?;
            usize_of(key, v)
        };
        let int_or = |key: &str, default: usize| -> Result<usize> {
            present(key).map_or(Ok(default), |v| usize_of(key, v))
        };
        let float_or = |key: &str, default: f64| -> Result<f64> {
            present(key).map_or(Ok(default), |v| {
                v.as_f64()
                    .ok_or_else(|| err(format!("`{key}` = {v} is not a number")))
            })
        };
        let bool_or = |key: &str, default: bool| -> Result<bool> {
            present(key).map_or(Ok(default), |v| {
                v.as_bool()
                    .ok_or_else(|| err(format!("`{key}` = {v} is not a boolean")))
            })
        };

        let gemma3 = architecture == Architecture::Gemma3;
        if !gemma3 {
            let act = present("hidden_act")
                .and_then(Value::as_str)
                .unwrap_or("silu");
            if act != "silu" {
                return Err(err(format!(
                    "`hidden_act` = `{act}` is not supported (only `silu`, the SwiGLU MLP)"
                )));
            }
            if bool_or("use_sliding_window", false)? {
                return Err(err(
                    "`use_sliding_window` = true is not supported (full attention only)".into(),
                ));
            }
            if let Some(types) = present("layer_types").and_then(Value::as_array) {
                if let Some(other) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
                    return Err(err(format!(
                        "`layer_types` holds {other}; only `full_attention` layers are supported"
                    )));
                }
            }
        }

        let hidden_size = int("hidden_size")?;
        let num_heads = int("num_attention_heads")?;
        let num_kv_heads = int_or("num_key_value_heads", num_heads)?;
        if num_heads == 0 || num_kv_heads == 0 || !num_heads.is_multiple_of(num_kv_heads) {
            return Err(err(format!(
                "`num_attention_heads` = {num_heads} is not a positive multiple of \
                 `num_key_value_heads` = {num_kv_heads}"
            )));
        }
        let head_dim = match present("head_dim") {
            Some(v) => usize_of("head_dim", v)?,
            // transformers' `Gemma3TextConfig` default, which does not follow from the width.
            None if gemma3 => GEMMA3_DEFAULTS.head_dim,
            None if hidden_size.is_multiple_of(num_heads) => hidden_size / num_heads,
            None => {
                return Err(err(format!(
                    "no `head_dim`, and `hidden_size` = {hidden_size} is not a multiple of \
                     `num_attention_heads` = {num_heads}"
                )))
            }
        };
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(err(format!(
                "`head_dim` = {head_dim} must be even and positive for RoPE"
            )));
        }

        let num_layers = int("num_hidden_layers")?;
        let (rope_theta, rope_scaling, sliding) = if gemma3 {
            // Gemma 3: two RoPE bases, the sliding window, and the fields it refuses.
            let g = gemma3_fields(obj, num_layers, head_dim).map_err(err)?;
            (g.rope_theta, g.rope_scaling, Some(g.sliding))
        } else {
            // RoPE: transformers 5 nests theta and scaling in `rope_parameters`; 4.x has
            // `rope_theta` and an optional `rope_scaling` object.
            let (rope_theta, rope_obj) = match present("rope_parameters") {
                Some(Value::Object(p)) => {
                    let theta = p.get("rope_theta").filter(|v| !v.is_null());
                    let theta = match theta {
                        Some(v) => v.as_f64().ok_or_else(|| {
                            err(format!(
                                "`rope_parameters.rope_theta` = {v} is not a number"
                            ))
                        })?,
                        None => float_or("rope_theta", 10_000.0)?,
                    };
                    (theta, Some(p.clone()))
                }
                Some(other) => {
                    return Err(err(format!("`rope_parameters` = {other} is not an object")))
                }
                None => {
                    let scaling = match present("rope_scaling") {
                        Some(Value::Object(s)) => Some(s.clone()),
                        Some(other) => {
                            return Err(err(format!("`rope_scaling` = {other} is not an object")))
                        }
                        None => None,
                    };
                    (float_or("rope_theta", 10_000.0)?, scaling)
                }
            };
            let rope_scaling = match rope_obj {
                Some(p) => parse_rope_scaling(&p).map_err(err)?,
                None => RopeScaling::None,
            };
            (rope_theta, rope_scaling, None)
        };

        let eos_token_ids = match present("eos_token_id") {
            None => vec![],
            Some(Value::Array(ids)) => ids
                .iter()
                .map(|v| usize_of("eos_token_id", v).map(|n| n as u32))
                .collect::<Result<_>>()?,
            Some(v) => vec![usize_of("eos_token_id", v)? as u32],
        };

        let config = Self {
            architecture,
            vocab_size: int("vocab_size")?,
            hidden_size,
            intermediate_size: int("intermediate_size")?,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: float_or("rms_norm_eps", 1e-6)?,
            rope_theta,
            rope_scaling,
            // Gemma 3 ties its embeddings unless told otherwise (transformers' default).
            tie_word_embeddings: bool_or("tie_word_embeddings", gemma3)?,
            attention_bias: bool_or("attention_bias", false)?,
            mlp_bias: bool_or("mlp_bias", false)?,
            max_position_embeddings: int_or(
                "max_position_embeddings",
                if gemma3 {
                    GEMMA3_DEFAULTS.max_position_embeddings
                } else {
                    4096
                },
            )?,
            eos_token_ids,
            sliding,
        };
        if config.vocab_size == 0 || config.hidden_size == 0 || config.num_layers == 0 {
            return Err(err(
                "`vocab_size`, `hidden_size` and `num_hidden_layers` must be positive".into(),
            ));
        }
        Ok(config)
    }

    /// A named preset shape for random-weight benchmarks (see [`PRESETS`]).
    pub fn preset(name: &str) -> Result<Self> {
        let qwen3 = |hidden, layers, heads, kv_heads, head_dim, inter, vocab| Self {
            architecture: Architecture::Qwen3,
            vocab_size: vocab,
            hidden_size: hidden,
            intermediate_size: inter,
            num_layers: layers,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            rms_norm_eps: 1e-6,
            rope_theta: 1_000_000.0,
            rope_scaling: RopeScaling::None,
            tie_word_embeddings: true,
            attention_bias: false,
            mlp_bias: false,
            max_position_embeddings: 40_960,
            eos_token_ids: vec![],
            sliding: None,
        };
        match name {
            // Qwen/Qwen3-0.6B's config.json.
            "qwen3-0.6b" => Ok(qwen3(1024, 28, 16, 8, 128, 3072, 151_936)),
            // meta-llama/Llama-3.2-1B's config.json.
            "llama3.2-1b" => Ok(Self {
                architecture: Architecture::Llama,
                vocab_size: 128_256,
                hidden_size: 2048,
                intermediate_size: 8192,
                num_layers: 16,
                num_heads: 32,
                num_kv_heads: 8,
                head_dim: 64,
                rms_norm_eps: 1e-5,
                rope_theta: 500_000.0,
                rope_scaling: RopeScaling::Llama3 {
                    factor: 32.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 8192.0,
                },
                tie_word_embeddings: true,
                attention_bias: false,
                mlp_bias: false,
                max_position_embeddings: 131_072,
                eos_token_ids: vec![],
                sliding: None,
            }),
            // A Qwen3-shaped model of about 41M parameters that runs quickly on a small CPU.
            "small" => Ok(qwen3(512, 8, 8, 4, 64, 1536, 32_000)),
            other => Err(LlmError::Config {
                path: PathBuf::from("--preset"),
                message: format!("unknown preset `{other}` (known: {})", PRESETS.join(", ")),
            }),
        }
    }

    /// Query heads per key/value head.
    pub fn groups(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// Number of parameters (tied embeddings counted once).
    pub fn num_params(&self) -> usize {
        let (h, d) = (self.hidden_size, self.head_dim);
        let attn = h * self.num_heads * d * 2 + h * self.num_kv_heads * d * 2;
        let mlp = 3 * h * self.intermediate_size;
        let norms = match self.architecture {
            Architecture::Llama => 2 * h,
            Architecture::Qwen3 => 2 * h + 2 * d,
            // Four norms around attention and the MLP, and the q/k norms.
            Architecture::Gemma3 => 4 * h + 2 * d,
        };
        let head = if self.tie_word_embeddings {
            0
        } else {
            self.vocab_size * h
        };
        self.vocab_size * h + self.num_layers * (attn + mlp + norms) + h + head
    }
}

/// Reads the scaling part of a `rope_scaling`/`rope_parameters` object.
fn parse_rope_scaling(
    p: &serde_json::Map<String, Value>,
) -> std::result::Result<RopeScaling, String> {
    let kind = p
        .get("rope_type")
        .or_else(|| p.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let num = |key: &str| -> std::result::Result<f64, String> {
        p.get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("rope scaling `{kind}` needs a numeric `{key}`"))
    };
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => {
            let factor = num("factor")?;
            if factor <= 0.0 {
                return Err(format!(
                    "rope scaling `linear`: factor {factor} must be positive"
                ));
            }
            Ok(RopeScaling::Linear { factor })
        }
        "llama3" => {
            let scaling = RopeScaling::Llama3 {
                factor: num("factor")?,
                low_freq_factor: num("low_freq_factor")?,
                high_freq_factor: num("high_freq_factor")?,
                original_max_position_embeddings: num("original_max_position_embeddings")?,
            };
            if let RopeScaling::Llama3 {
                low_freq_factor,
                high_freq_factor,
                ..
            } = scaling
            {
                if high_freq_factor <= low_freq_factor || low_freq_factor <= 0.0 {
                    return Err(format!(
                        "rope scaling `llama3`: need 0 < low_freq_factor ({low_freq_factor}) < \
                         high_freq_factor ({high_freq_factor})"
                    ));
                }
            }
            Ok(scaling)
        }
        other => Err(format!(
            "unsupported rope scaling type `{other}` (supported: default, linear, llama3)"
        )),
    }
}

/// transformers' `Gemma3TextConfig` defaults, for the fields a Gemma 3 `config.json` may omit.
struct Gemma3Defaults {
    head_dim: usize,
    max_position_embeddings: usize,
    sliding_window: usize,
    /// Every `sliding_window_pattern`-th layer attends globally (the older configs' field).
    sliding_window_pattern: usize,
    /// The global layers' RoPE base.
    rope_theta: f64,
    /// The sliding layers' RoPE base.
    rope_local_base_freq: f64,
    query_pre_attn_scalar: f64,
}

const GEMMA3_DEFAULTS: Gemma3Defaults = Gemma3Defaults {
    head_dim: 256,
    max_position_embeddings: 131_072,
    sliding_window: 4096,
    sliding_window_pattern: 6,
    rope_theta: 1_000_000.0,
    rope_local_base_freq: 10_000.0,
    query_pre_attn_scalar: 256.0,
};

/// What a Gemma 3 `config.json` says beyond the fields every family shares.
struct Gemma3Fields {
    /// The global layers' RoPE base.
    rope_theta: f64,
    /// The global layers' RoPE rescaling (the sliding layers' RoPE is plain).
    rope_scaling: RopeScaling,
    sliding: SlidingWindow,
}

/// Reads Gemma 3's activation, sliding window, layer pattern and two RoPE bases, in the flat form
/// (`rope_theta`, `rope_local_base_freq`, `rope_scaling`, `sliding_window_pattern`) and in
/// transformers 5's (`rope_parameters` keyed by `full_attention`/`sliding_attention`,
/// `layer_types`), and refuses what the decoder does not implement: another activation, logit
/// soft-capping, an attention scale other than `1/sqrt(head_dim)`, bidirectional attention, and
/// RoPE rescaling of a kind `parse_rope_scaling` does not know (or any on the sliding layers).
fn gemma3_fields(
    obj: &serde_json::Map<String, Value>,
    num_layers: usize,
    head_dim: usize,
) -> std::result::Result<Gemma3Fields, String> {
    let d = &GEMMA3_DEFAULTS;
    let present = |key: &str| obj.get(key).filter(|v| !v.is_null());
    let number = |key: &str, v: &Value| {
        v.as_f64()
            .ok_or_else(|| format!("`{key}` = {v} is not a number"))
    };
    let positive = |key: &str, default: usize| match present(key) {
        None => Ok(default),
        Some(v) => v
            .as_u64()
            .filter(|&n| n > 0)
            .map(|n| n as usize)
            .ok_or_else(|| format!("`{key}` = {v} is not a positive integer")),
    };

    // transformers names the field `hidden_activation`; older configs also carry `hidden_act`.
    let (act_key, act) = match present("hidden_activation") {
        Some(v) => ("hidden_activation", v),
        None => match present("hidden_act") {
            Some(v) => ("hidden_act", v),
            None => ("hidden_activation", &Value::Null),
        },
    };
    let act = if act.is_null() {
        "gelu_pytorch_tanh"
    } else {
        act.as_str()
            .ok_or_else(|| format!("`{act_key}` = {act} is not a string"))?
    };
    if act != "gelu_pytorch_tanh" {
        return Err(format!(
            "`{act_key}` = `{act}` is not supported for Gemma 3 (only `gelu_pytorch_tanh`)"
        ));
    }
    for key in ["final_logit_softcapping", "attn_logit_softcapping"] {
        if let Some(v) = present(key) {
            return Err(format!(
                "`{key}` = {v} is not supported: this decoder does not soft-cap logits (Gemma 3 \
                 sets it to null)"
            ));
        }
    }
    let scalar = match present("query_pre_attn_scalar") {
        Some(v) => number("query_pre_attn_scalar", v)?,
        None => d.query_pre_attn_scalar,
    };
    if scalar != head_dim as f64 {
        return Err(format!(
            "`query_pre_attn_scalar` = {scalar} differs from `head_dim` = {head_dim}: this \
             decoder scales attention scores by 1/sqrt(head_dim) only"
        ));
    }
    if present("use_bidirectional_attention").and_then(Value::as_bool) == Some(true) {
        return Err(
            "`use_bidirectional_attention` = true is not supported (causal attention only)".into(),
        );
    }

    let window = positive("sliding_window", d.sliding_window)?;
    let layers: Vec<bool> = match present("layer_types") {
        Some(Value::Array(types)) => {
            if types.len() != num_layers {
                return Err(format!(
                    "`layer_types` has {} entries for `num_hidden_layers` = {num_layers}",
                    types.len()
                ));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(format!(
                        "`layer_types` holds {t}; only `sliding_attention` and `full_attention` \
                         are supported"
                    )),
                })
                .collect::<std::result::Result<_, _>>()?
        }
        Some(other) => return Err(format!("`layer_types` = {other} is not a list")),
        None => {
            let every = positive("sliding_window_pattern", d.sliding_window_pattern)?;
            (0..num_layers).map(|i| (i + 1) % every != 0).collect()
        }
    };

    // The flat fields, which the nested `rope_parameters` entries override.
    let flat_theta = match present("rope_theta") {
        Some(v) => number("rope_theta", v)?,
        None => d.rope_theta,
    };
    let flat_local = match present("rope_local_base_freq") {
        Some(v) => number("rope_local_base_freq", v)?,
        None => d.rope_local_base_freq,
    };
    let object = |key: &str, v: &Value| match v {
        Value::Object(o) => Ok(o.clone()),
        other => Err(format!("`{key}` = {other} is not an object")),
    };
    let (global, local) = match present("rope_parameters") {
        Some(Value::Object(p))
            if p.contains_key("full_attention") || p.contains_key("sliding_attention") =>
        {
            let entry = |key: &str| {
                p.get(key)
                    .filter(|v| !v.is_null())
                    .map(|v| object(&format!("rope_parameters.{key}"), v))
                    .transpose()
            };
            (entry("full_attention")?, entry("sliding_attention")?)
        }
        // One object for the global layers, as Llama and Qwen3 have it.
        Some(v) => (Some(object("rope_parameters", v)?), None),
        None => (
            present("rope_scaling")
                .map(|v| object("rope_scaling", v))
                .transpose()?,
            None,
        ),
    };
    let theta_in = |p: &Option<serde_json::Map<String, Value>>, key: &str, default: f64| match p
        .as_ref()
        .and_then(|p| p.get("rope_theta"))
        .filter(|v| !v.is_null())
    {
        Some(v) => number(&format!("{key}.rope_theta"), v),
        None => Ok(default),
    };
    let rope_theta = theta_in(&global, "rope_parameters.full_attention", flat_theta)?;
    let local_theta = theta_in(&local, "rope_parameters.sliding_attention", flat_local)?;
    let rope_scaling = match &global {
        Some(p) => parse_rope_scaling(p)?,
        None => RopeScaling::None,
    };
    if let Some(p) = &local {
        let scaling = parse_rope_scaling(p)?;
        if scaling != RopeScaling::None {
            return Err(format!(
                "`rope_parameters.sliding_attention` rescales RoPE ({scaling:?}); only the \
                 global layers' RoPE may be rescaled"
            ));
        }
    }
    Ok(Gemma3Fields {
        rope_theta,
        rope_scaling,
        sliding: SlidingWindow {
            window,
            layers,
            rope_theta: local_theta,
        },
    })
}
