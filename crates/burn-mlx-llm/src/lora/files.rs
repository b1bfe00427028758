//! Adapter files, in the two layouts people load:
//!
//! - **mlx-lm**: `adapters.safetensors` with `model.layers.{i}.{key}.lora_a` (`[in, rank]`) and
//!   `.lora_b` (`[rank, out]`), and `adapter_config.json` with `fine_tune_type`, `num_layers`
//!   and `lora_parameters` (`rank`, `scale`, `dropout`, and `keys` when not every linear layer
//!   is adapted). `mlx_lm.generate --adapter-path` and `mlx_lm.utils.load(..., adapter_path=)`
//!   read it.
//! - **PEFT**: `adapter_model.safetensors` with
//!   `base_model.model.model.layers.{i}.{key}.lora_A.weight` (`[rank, in]`) and `.lora_B.weight`
//!   (`[out, rank]`), and PEFT's `adapter_config.json` (`peft_type` LORA, `r`, `lora_alpha =
//!   scale · r`, `target_modules`, `layers_to_transform`). `PeftModel.from_pretrained` reads it.
//!
//! [`save`] writes the mlx-lm layout into a folder and the PEFT layout into its `peft/`
//! subfolder; [`load`] reads either (a folder with `adapters.safetensors`, or one with
//! `adapter_model.safetensors`) and checks every tensor against the model: a name the model
//! does not have, a missing tensor, a wrong shape or rank are errors naming the file and tensor.

use super::{Adapters, Lora, LoraConfig, Target};
use crate::config::LlmConfig;
use crate::error::{LlmError, Result};
use crate::model::LINEAR_KEYS;
use crate::weights::SafetensorsParams;
use burn_core::module::Param;
use burn_tensor::backend::Backend;
use burn_tensor::{DType, Tensor};
use safetensors::tensor::TensorView;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// mlx-lm's weights file.
pub const MLX_WEIGHTS: &str = "adapters.safetensors";
/// PEFT's weights file.
pub const PEFT_WEIGHTS: &str = "adapter_model.safetensors";
/// The config file of both layouts.
pub const CONFIG: &str = "adapter_config.json";
/// The subfolder [`save`] writes the PEFT layout into.
pub const PEFT_DIR: &str = "peft";

/// Which layout a folder holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// mlx-lm's.
    Mlx,
    /// Hugging Face PEFT's.
    Peft,
}

fn io(path: &Path, e: impl std::fmt::Display) -> LlmError {
    LlmError::Io {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

fn adapter_err(path: &Path, message: impl Into<String>) -> LlmError {
    LlmError::Adapter {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// The values of a 2-D tensor as f32, row-major.
fn values<B: Backend>(t: Tensor<B, 2>) -> Vec<f32> {
    t.cast(DType::F32)
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("an f32 tensor's data is f32")
}

/// Writes `tensors` (name → shape and f32 values) as a safetensors file.
fn write_safetensors(
    path: &Path,
    tensors: &BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
        .iter()
        .map(|(name, (shape, v))| {
            let b = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (name.clone(), b, shape.clone())
        })
        .collect();
    let views = bytes
        .iter()
        .map(|(name, b, shape)| {
            TensorView::new(safetensors::Dtype::F32, shape.clone(), b)
                .map(|v| (name.clone(), v))
                .map_err(|e| io(path, format!("tensor `{name}`: {e:?}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let out = safetensors::serialize(views, metadata).map_err(|e| io(path, format!("{e:?}")))?;
    std::fs::write(path, out).map_err(|e| io(path, e))
}

/// The transpose of a `[rows, cols]` row-major matrix.
fn transpose(v: &[f32], [rows, cols]: [usize; 2]) -> Vec<f32> {
    let mut t = vec![0.0; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = v[r * cols + c];
        }
    }
    t
}

/// What [`save`] records besides the adapters: the base model and the training settings, as
/// mlx-lm's `adapter_config.json` records its command's arguments.
#[derive(Debug, Clone, Default)]
pub struct SaveInfo {
    /// The base model folder (PEFT's `base_model_name_or_path`, mlx-lm's `model`).
    pub base_model: String,
    /// Further settings for mlx-lm's config (iterations, batch size, learning rate...).
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// Writes `lora` into `dir` in mlx-lm's layout and into `dir/peft/` in PEFT's (see the
/// [module docs](self)). The tensors are stored in f32.
pub fn save<B: Backend>(lora: &Lora<B>, dir: &Path, info: &SaveInfo) -> Result<()> {
    let peft_dir = dir.join(PEFT_DIR);
    std::fs::create_dir_all(&peft_dir).map_err(|e| io(&peft_dir, e))?;
    let (mut mlx, mut peft) = (BTreeMap::new(), BTreeMap::new());
    for (i, t) in lora.targets.iter().enumerate() {
        let [out, input] = t.dims;
        let r = lora.config.rank;
        let a = values(lora.adapters.a[i].val());
        let b = values(lora.adapters.b[i].val());
        let name = t.name();
        peft.insert(
            format!("base_model.model.{name}.lora_A.weight"),
            (vec![r, input], transpose(&a, [input, r])),
        );
        peft.insert(
            format!("base_model.model.{name}.lora_B.weight"),
            (vec![out, r], transpose(&b, [r, out])),
        );
        mlx.insert(format!("{name}.lora_a"), (vec![input, r], a));
        mlx.insert(format!("{name}.lora_b"), (vec![r, out], b));
    }
    let format = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
    write_safetensors(&dir.join(MLX_WEIGHTS), &mlx, None)?;
    write_safetensors(&peft_dir.join(PEFT_WEIGHTS), &peft, format)?;

    let c = &lora.config;
    let mut params = serde_json::json!({
        "rank": c.rank,
        "scale": c.scale,
        "dropout": c.dropout,
    });
    if let Some(keys) = &c.keys {
        params["keys"] = serde_json::json!(keys);
    }
    let mut mlx_config = info.extra.clone();
    mlx_config.insert("model".into(), info.base_model.clone().into());
    mlx_config.insert("fine_tune_type".into(), "lora".into());
    mlx_config.insert("num_layers".into(), c.num_layers.into());
    mlx_config.insert("lora_parameters".into(), params);
    write_json(&dir.join(CONFIG), &serde_json::Value::Object(mlx_config))?;

    let mut layers: Vec<usize> = lora.targets.iter().map(|t| t.layer).collect();
    layers.dedup();
    let keys = c.keys()?;
    let peft_config = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": info.base_model,
        "r": c.rank,
        "lora_alpha": c.scale * c.rank as f64,
        "lora_dropout": c.dropout,
        "target_modules": keys,
        "layers_to_transform": layers,
        "layers_pattern": "layers",
        "bias": "none",
        "fan_in_fan_out": false,
        "use_rslora": false,
        "use_dora": false,
        "init_lora_weights": true,
        "inference_mode": true,
        "modules_to_save": null,
        "rank_pattern": {},
        "alpha_pattern": {},
    });
    write_json(&peft_dir.join(CONFIG), &peft_config)
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    std::fs::write(path, text + "\n").map_err(|e| io(path, e))
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|e| io(path, e))?;
    serde_json::from_str(&text).map_err(|e| adapter_err(path, format!("not valid JSON: {e}")))
}

/// The layout of the adapter folder `dir` (also accepted: the path of its weights file).
pub fn detect(dir: &Path) -> Result<(Layout, PathBuf)> {
    let dir = if dir.is_file() {
        dir.parent().unwrap_or(Path::new(".")).to_path_buf()
    } else {
        dir.to_path_buf()
    };
    if dir.join(MLX_WEIGHTS).is_file() {
        Ok((Layout::Mlx, dir))
    } else if dir.join(PEFT_WEIGHTS).is_file() {
        Ok((Layout::Peft, dir))
    } else {
        Err(adapter_err(
            &dir,
            format!(
                "no adapters here: an adapter folder holds {MLX_WEIGHTS} (mlx-lm) or \
                 {PEFT_WEIGHTS} (PEFT), with {CONFIG}"
            ),
        ))
    }
}

/// Reads the adapter folder `dir` (either layout) for a model of shape `model`, checking every
/// tensor against the model's layers; the adapters are made in `dtype` on `device`.
pub fn load<B: Backend>(
    dir: &Path,
    model: &LlmConfig,
    device: &B::Device,
    dtype: DType,
) -> Result<Lora<B>> {
    let (layout, dir) = detect(dir)?;
    let config_path = dir.join(CONFIG);
    let json = read_json(&config_path)?;
    let field = |v: &serde_json::Value, key: &str| -> Result<serde_json::Value> {
        v.get(key)
            .cloned()
            .ok_or_else(|| adapter_err(&config_path, format!("no `{key}` key")))
    };
    let as_f64 = |v: serde_json::Value, key: &str| -> Result<f64> {
        v.as_f64()
            .ok_or_else(|| adapter_err(&config_path, format!("`{key}` is not a number: {v}")))
    };
    let as_usize = |v: serde_json::Value, key: &str| -> Result<usize> {
        v.as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| adapter_err(&config_path, format!("`{key}` is not a whole number: {v}")))
    };
    let strings = |v: &serde_json::Value| -> Option<Vec<String>> {
        v.as_array()?
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    let n = model.num_layers;
    let (config, weights_path) = match layout {
        Layout::Mlx => {
            let kind = json
                .get("fine_tune_type")
                .and_then(|v| v.as_str())
                .unwrap_or("lora");
            if kind != "lora" {
                return Err(adapter_err(
                    &config_path,
                    format!("fine_tune_type `{kind}`: only LoRA adapters are supported"),
                ));
            }
            let p = field(&json, "lora_parameters")?;
            let config = LoraConfig {
                rank: as_usize(field(&p, "rank")?, "lora_parameters.rank")?,
                scale: as_f64(field(&p, "scale")?, "lora_parameters.scale")?,
                dropout: p.get("dropout").and_then(|v| v.as_f64()).unwrap_or(0.0),
                num_layers: as_usize(field(&json, "num_layers")?, "num_layers")?,
                keys: p.get("keys").filter(|k| !k.is_null()).and_then(strings),
            };
            (config, dir.join(MLX_WEIGHTS))
        }
        Layout::Peft => {
            let kind = json.get("peft_type").and_then(|v| v.as_str()).unwrap_or("");
            if kind != "LORA" {
                return Err(adapter_err(
                    &config_path,
                    format!("peft_type `{kind}`: only LoRA adapters are supported"),
                ));
            }
            if json.get("use_dora").and_then(|v| v.as_bool()) == Some(true)
                || json.get("use_rslora").and_then(|v| v.as_bool()) == Some(true)
            {
                return Err(adapter_err(
                    &config_path,
                    "use_dora / use_rslora adapters are not supported (plain LoRA only)",
                ));
            }
            let r = as_usize(field(&json, "r")?, "r")?;
            let alpha = as_f64(field(&json, "lora_alpha")?, "lora_alpha")?;
            let modules = match json.get("target_modules") {
                Some(v) if v.is_string() => vec![v.as_str().unwrap_or_default().to_string()],
                Some(v) => strings(v).ok_or_else(|| {
                    adapter_err(&config_path, "`target_modules` is not a list of names")
                })?,
                None => return Err(adapter_err(&config_path, "no `target_modules` key")),
            };
            // PEFT names modules by suffix (`q_proj` or `self_attn.q_proj`).
            let keys: Vec<String> = LINEAR_KEYS
                .iter()
                .filter(|k| {
                    modules
                        .iter()
                        .any(|m| **k == m || k.ends_with(&format!(".{m}")))
                })
                .map(|k| k.to_string())
                .collect();
            let layers: Option<Vec<usize>> = match json.get("layers_to_transform") {
                Some(v) if v.is_u64() => v.as_u64().map(|l| vec![l as usize]),
                Some(v) if v.is_array() => Some(
                    v.as_array()
                        .into_iter()
                        .flatten()
                        .map(|l| l.as_u64().map(|l| l as usize))
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| {
                            adapter_err(&config_path, "`layers_to_transform` is not a list")
                        })?,
                ),
                _ => None,
            };
            let first = layers.as_ref().and_then(|l| l.iter().min().copied());
            let config = LoraConfig {
                rank: r,
                scale: alpha / r.max(1) as f64,
                dropout: json
                    .get("lora_dropout")
                    .and_then(|v| v.as_f64())
                    .unwrap_or(0.0),
                num_layers: first.map_or(n, |f| n.saturating_sub(f)),
                keys: (keys.len() < LINEAR_KEYS.len()).then_some(keys),
            };
            if let Some(layers) = &layers {
                let expected: Vec<usize> = (config.first_layer(model)..n).collect();
                if *layers != expected {
                    return Err(adapter_err(
                        &config_path,
                        format!(
                            "layers_to_transform {layers:?}: only a run of the last blocks is \
                             supported ({expected:?} for this model)"
                        ),
                    ));
                }
            }
            (config, dir.join(PEFT_WEIGHTS))
        }
    };
    let targets =
        super::targets(model, &config).map_err(|e| adapter_err(&config_path, e.to_string()))?;
    let file = SafetensorsParams::<B>::open_file(&weights_path, device, dtype)?;
    let r = config.rank;
    let name_of = |t: &Target, which: char| match layout {
        Layout::Mlx => format!("{}.lora_{which}", t.name()),
        Layout::Peft => format!(
            "base_model.model.{}.lora_{}.weight",
            t.name(),
            which.to_ascii_uppercase()
        ),
    };
    let mut expected_names = vec![];
    let (mut a, mut b) = (vec![], vec![]);
    for t in &targets {
        let [out, input] = t.dims;
        let (a_name, b_name) = (name_of(t, 'a'), name_of(t, 'b'));
        let (ta, tb) = match layout {
            Layout::Mlx => (
                file.tensor::<2>(&a_name, [input, r])?,
                file.tensor::<2>(&b_name, [r, out])?,
            ),
            Layout::Peft => (
                file.tensor::<2>(&a_name, [r, input])?.transpose(),
                file.tensor::<2>(&b_name, [out, r])?.transpose(),
            ),
        };
        a.push(Param::from_tensor(ta));
        b.push(Param::from_tensor(tb));
        expected_names.push(a_name);
        expected_names.push(b_name);
    }
    if let Some(extra) = file
        .names()
        .into_iter()
        .find(|name| !expected_names.contains(name))
    {
        return Err(adapter_err(
            &weights_path,
            format!(
                "tensor `{extra}` is not an adapter of this model's layers (the config \
                 {} adapts {} layers: blocks {}..{} of a {n}-block model, keys {}); is the \
                 adapter for another model?",
                config_path.display(),
                targets.len(),
                config.first_layer(model),
                n,
                config.keys()?.join(", ")
            ),
        ));
    }
    Ok(Lora {
        config,
        targets,
        adapters: Adapters { a, b },
    })
}
