//! Adapters fused into a model: a new Hugging Face folder whose weights are `W + scale·(A·B)ᵀ`
//! for every adapted layer, which transformers, mlx-lm and this crate load as a plain model.

use super::files;
use crate::config::LlmConfig;
use crate::error::{LlmError, Result};
use crate::weights::{SafetensorsParams, INDEX_FILE, SINGLE_FILE};
use burn_tensor::backend::Backend;
use burn_tensor::{DType, Tensor};
use safetensors::tensor::TensorView;
use std::collections::HashMap;
use std::path::Path;

/// What [`fuse`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FuseReport {
    /// Weight matrices that received an update.
    pub fused: usize,
    /// Tensors written in all.
    pub tensors: usize,
    /// Other files copied from the model folder (config, tokenizer...).
    pub copied: Vec<String>,
}

fn io(path: &Path, e: impl std::fmt::Display) -> LlmError {
    LlmError::Io {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// Writes into `out` a copy of the Hugging Face folder `model_dir` with the adapters of
/// `adapter_dir` (either layout, see [`files`]) fused into its weights: every tensor keeps its
/// name and stored dtype (the sum is computed in f32 and rounded once), the other files
/// (`config.json`, tokenizer files, ...) are copied, and the weights go into one
/// `model.safetensors`. Runs on `device` of backend `B`.
pub fn fuse<B: Backend>(
    model_dir: &Path,
    adapter_dir: &Path,
    out: &Path,
    device: &B::Device,
) -> Result<FuseReport> {
    if out.canonicalize().ok() == model_dir.canonicalize().ok() && out.exists() {
        return Err(LlmError::Input(format!(
            "fuse: the output folder {} is the model folder; give another one",
            out.display()
        )));
    }
    let config = LlmConfig::from_dir(model_dir)?;
    let lora = files::load::<B>(adapter_dir, &config, device, DType::F32)?;
    let params = SafetensorsParams::<B>::open(model_dir, device, DType::F32)?;
    let mut updates: HashMap<String, Tensor<B, 2>> = HashMap::new();
    for (i, t) in lora.targets.iter().enumerate() {
        // `(A·B)ᵀ = Bᵀ·Aᵀ`, `[out, in]`, as the weight is stored.
        let delta = lora.adapters.b[i]
            .val()
            .transpose()
            .matmul(lora.adapters.a[i].val().transpose())
            * lora.config.scale;
        updates.insert(format!("{}.weight", t.name()), delta);
    }
    std::fs::create_dir_all(out).map_err(|e| io(out, e))?;
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = vec![];
    let mut fused = 0;
    for name in params.names() {
        let (shape, dtype) = params.info(&name).expect("listed names have info");
        let stored = match dtype {
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::BF16 => DType::BF16,
            safetensors::Dtype::F16 => DType::F16,
            other => {
                return Err(LlmError::UnsupportedDtype {
                    path: params.path_of(&name).to_path_buf(),
                    tensor: name,
                    dtype: format!("{other:?}"),
                })
            }
        };
        let bytes = match updates.remove(&name) {
            Some(delta) => {
                let [out_dim, in_dim] = delta.dims();
                let w = params.tensor::<2>(&name, [out_dim, in_dim])?;
                fused += 1;
                (w + delta).cast(stored).into_data().as_bytes().to_vec()
            }
            None => read_flat(&params, &name, &shape)?
                .cast(stored)
                .into_data()
                .as_bytes()
                .to_vec(),
        };
        tensors.push((name, dtype, shape, bytes));
    }
    if let Some(name) = updates.keys().next() {
        return Err(LlmError::MissingTensor {
            path: model_dir.to_path_buf(),
            tensor: name.clone(),
            expected: vec![],
        });
    }
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            TensorView::new(*dtype, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| io(out, format!("tensor `{name}`: {e:?}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
    let weights = out.join(SINGLE_FILE);
    let bytes =
        safetensors::serialize(views, metadata).map_err(|e| io(&weights, format!("{e:?}")))?;
    std::fs::write(&weights, bytes).map_err(|e| io(&weights, e))?;
    let mut copied = vec![];
    for entry in std::fs::read_dir(model_dir).map_err(|e| io(model_dir, e))? {
        let entry = entry.map_err(|e| io(model_dir, e))?;
        let name = entry.file_name().to_string_lossy().to_string();
        let is_weights = name.ends_with(".safetensors") || name == INDEX_FILE;
        if entry.path().is_file() && !is_weights {
            std::fs::copy(entry.path(), out.join(&name)).map_err(|e| io(&entry.path(), e))?;
            copied.push(name);
        }
    }
    copied.sort();
    Ok(FuseReport {
        fused,
        tensors: tensors.len(),
        copied,
    })
}

/// A tensor of rank 1 to 4, read with its own shape (which [`SafetensorsParams::tensor`]
/// checks) and flattened.
fn read_flat<B: Backend>(
    params: &SafetensorsParams<B>,
    name: &str,
    shape: &[usize],
) -> Result<Tensor<B, 1>> {
    let n: usize = shape.iter().product();
    Ok(match *shape {
        [a] => params.tensor::<1>(name, [a])?,
        [a, b] => params.tensor::<2>(name, [a, b])?.reshape([n]),
        [a, b, c] => params.tensor::<3>(name, [a, b, c])?.reshape([n]),
        [a, b, c, d] => params.tensor::<4>(name, [a, b, c, d])?.reshape([n]),
        _ => {
            return Err(LlmError::WrongShape {
                path: params.path_of(name).to_path_buf(),
                tensor: name.to_string(),
                expected: vec![n],
                found: shape.to_vec(),
            })
        }
    })
}
