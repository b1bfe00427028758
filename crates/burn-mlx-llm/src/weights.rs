//! Hugging Face safetensors checkpoints: one `model.safetensors`, or shards listed by
//! `model.safetensors.index.json`, read with the `safetensors` crate. Every tensor is checked
//! (present, F32/BF16/F16, the shape the config implies) before it becomes a Burn tensor, and a
//! failure is an [`LlmError`] naming the file, the tensor and the shapes.
//!
//! Gemma 3's RMSNorms multiply by `1 + w`, and its Hugging Face checkpoints store `w`; the decoder
//! multiplies by the stored vector (llama.cpp's GGUF files already hold `1 + w`), so
//! [`load_model`] reads a Gemma 3 folder through [`GemmaNorms`], which adds the 1.

use super::config::{Architecture, LlmConfig};
use super::error::{LlmError, Result};
use super::model::{Llm, ParamSource};
use burn_tensor::backend::Backend;
use burn_tensor::{bf16, f16, DType, Tensor, TensorData};
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The single-file weights name.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// One weights file, read into memory with its parsed header.
struct WeightFile {
    path: PathBuf,
    bytes: Vec<u8>,
    /// Where the data section starts (after the 8-byte length and the JSON header).
    data_start: usize,
    metadata: Metadata,
}

impl WeightFile {
    /// Reads and validates `path`.
    fn open(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| LlmError::Io {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        let (header_len, metadata) = SafeTensors::read_metadata(&bytes).map_err(|e| {
            let mut reason = format!("{e:?}");
            if let Some(declared) = declared_size(&bytes) {
                if declared != bytes.len() as u64 {
                    reason = format!(
                        "its header describes {declared} bytes, the file has {} (truncated?); {reason}",
                        bytes.len()
                    );
                }
            }
            LlmError::BadWeights {
                path: path.to_path_buf(),
                size: bytes.len() as u64,
                reason,
            }
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            data_start: 8 + header_len,
            bytes,
            metadata,
        })
    }

    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.metadata.info(name)
    }
}

/// The size a safetensors file's header promises (8 + header + the end of the last tensor), or
/// `None` when even the header cannot be read.
fn declared_size(bytes: &[u8]) -> Option<u64> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let header = bytes.get(8..8usize.checked_add(n as usize)?)?;
    let json: serde_json::Value = serde_json::from_slice(header).ok()?;
    let end = json
        .as_object()?
        .iter()
        .filter(|(k, _)| k.as_str() != "__metadata__")
        .filter_map(|(_, v)| v.get("data_offsets")?.get(1)?.as_u64())
        .max()
        .unwrap_or(0);
    Some(8 + n + end)
}

/// A checkpoint folder's weights, converted on request into Burn tensors of one dtype.
pub struct SafetensorsParams<B: Backend> {
    files: Vec<WeightFile>,
    /// Tensor name → index into `files`.
    location: HashMap<String, usize>,
    /// What a missing tensor's error names: the single file, or the index.
    source: PathBuf,
    device: B::Device,
    dtype: DType,
}

impl<B: Backend> SafetensorsParams<B> {
    /// Opens `dir/model.safetensors.index.json` and its shards if present, else
    /// `dir/model.safetensors`. Tensors will be made in `dtype` on `device`.
    pub fn open(dir: &Path, device: &B::Device, dtype: DType) -> Result<Self> {
        let index_path = dir.join(INDEX_FILE);
        let (paths, source) = if index_path.is_file() {
            (shard_paths(&index_path)?, index_path)
        } else {
            let single = dir.join(SINGLE_FILE);
            if !single.is_file() {
                return Err(LlmError::Io {
                    path: single,
                    reason: format!("no {SINGLE_FILE} or {INDEX_FILE} in this folder"),
                });
            }
            (vec![single.clone()], single)
        };
        let mut files = Vec::with_capacity(paths.len());
        let mut location = HashMap::new();
        for (i, path) in paths.iter().enumerate() {
            let file = WeightFile::open(path)?;
            for name in file.metadata.tensors().keys() {
                location.insert(name.clone(), i);
            }
            files.push(file);
        }
        Ok(Self {
            files,
            location,
            source,
            device: device.clone(),
            dtype,
        })
    }

    /// Opens one safetensors file (an adapter file, or one shard).
    pub fn open_file(path: &Path, device: &B::Device, dtype: DType) -> Result<Self> {
        let file = WeightFile::open(path)?;
        let location = file
            .metadata
            .tensors()
            .keys()
            .map(|name| (name.clone(), 0))
            .collect();
        Ok(Self {
            files: vec![file],
            location,
            source: path.to_path_buf(),
            device: device.clone(),
            dtype,
        })
    }

    /// The names of every tensor, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.location.keys().cloned().collect();
        names.sort();
        names
    }

    /// The shape and stored dtype of tensor `name`.
    pub fn info(&self, name: &str) -> Option<(Vec<usize>, Dtype)> {
        let file = &self.files[*self.location.get(name)?];
        file.info(name).map(|i| (i.shape.clone(), i.dtype))
    }

    /// The file that holds tensor `name` (or the checkpoint's source when it is missing).
    pub fn path_of(&self, name: &str) -> &Path {
        match self.location.get(name) {
            Some(&i) => &self.files[i].path,
            None => &self.source,
        }
    }

    /// The tensor `name`, checked against `expected` and converted to a Burn tensor.
    pub fn tensor<const D: usize>(&self, name: &str, expected: [usize; D]) -> Result<Tensor<B, D>> {
        let data = self.data(name, &expected)?;
        Ok(Tensor::from_data(data, (&self.device, self.dtype)))
    }

    /// The values of tensor `name` in its stored dtype, checked against `expected`.
    fn data(&self, name: &str, expected: &[usize]) -> Result<TensorData> {
        let missing = || LlmError::MissingTensor {
            path: self.source.clone(),
            tensor: name.to_string(),
            expected: expected.to_vec(),
        };
        let file = &self.files[*self.location.get(name).ok_or_else(missing)?];
        let info = file.info(name).ok_or_else(missing)?;
        if info.shape != expected {
            return Err(LlmError::WrongShape {
                path: file.path.clone(),
                tensor: name.to_string(),
                expected: expected.to_vec(),
                found: info.shape.clone(),
            });
        }
        let (start, end) = info.data_offsets;
        let bytes = file
            .bytes
            .get(file.data_start + start..file.data_start + end)
            .ok_or_else(|| LlmError::BadWeights {
                path: file.path.clone(),
                size: file.bytes.len() as u64,
                reason: format!("tensor `{name}`'s data lies outside the file"),
            })?;
        let expected = expected.to_vec();
        Ok(match info.dtype {
            Dtype::F32 => TensorData::new(decode(bytes, f32::from_le_bytes), expected),
            Dtype::BF16 => TensorData::new(
                decode(bytes, |b: [u8; 2]| bf16::from_bits(u16::from_le_bytes(b))),
                expected,
            ),
            Dtype::F16 => TensorData::new(
                decode(bytes, |b: [u8; 2]| f16::from_bits(u16::from_le_bytes(b))),
                expected,
            ),
            other => {
                return Err(LlmError::UnsupportedDtype {
                    path: file.path.clone(),
                    tensor: name.to_string(),
                    dtype: format!("{other:?}"),
                })
            }
        })
    }
}

/// Little-endian elements of `N` bytes.
fn decode<const N: usize, T>(bytes: &[u8], from: impl Fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .map(|c| from(c.try_into().expect("chunks_exact yields N bytes")))
        .collect()
}

/// The shard files an index names, in first-mention order.
fn shard_paths(index: &Path) -> Result<Vec<PathBuf>> {
    let err = |message: String| LlmError::Config {
        path: index.to_path_buf(),
        message,
    };
    let text = std::fs::read_to_string(index).map_err(|e| LlmError::Io {
        path: index.to_path_buf(),
        reason: e.to_string(),
    })?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| err(format!("not valid JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| err("no `weight_map` object".into()))?;
    let dir = index.parent().unwrap_or(Path::new("."));
    let mut paths: Vec<PathBuf> = vec![];
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| err(format!("`weight_map.{tensor}` is not a file name")))?;
        let path = dir.join(file);
        if !paths.contains(&path) {
            paths.push(path);
        }
    }
    if paths.is_empty() {
        return Err(err("`weight_map` is empty".into()));
    }
    Ok(paths)
}

impl<B: Backend> ParamSource<B> for SafetensorsParams<B> {
    fn vector(&mut self, name: &str, shape: [usize; 1]) -> Result<Tensor<B, 1>> {
        self.tensor(name, shape)
    }

    fn matrix(&mut self, name: &str, shape: [usize; 2]) -> Result<Tensor<B, 2>> {
        self.tensor(name, shape)
    }
}

/// A Hugging Face Gemma 3 checkpoint's parameters as the decoder takes them: every RMSNorm
/// weight (`*norm.weight`: the four norms of each layer, `q_norm`, `k_norm` and `model.norm`)
/// becomes `1 + w`, added in f32 before the conversion to the model's dtype, as transformers
/// computes `1 + w` in f32; every other parameter passes through unchanged.
pub struct GemmaNorms<'a, B: Backend> {
    params: &'a SafetensorsParams<B>,
}

impl<'a, B: Backend> GemmaNorms<'a, B> {
    /// Wraps a Gemma 3 folder's parameters.
    pub fn new(params: &'a SafetensorsParams<B>) -> Self {
        Self { params }
    }
}

impl<B: Backend> ParamSource<B> for GemmaNorms<'_, B> {
    fn vector(&mut self, name: &str, shape: [usize; 1]) -> Result<Tensor<B, 1>> {
        if !name.ends_with("norm.weight") {
            return self.params.tensor(name, shape);
        }
        let data = self.params.data(name, &shape)?;
        let values: Vec<f32> = data.iter::<f32>().map(|w| 1.0 + w).collect();
        Ok(Tensor::from_data(
            TensorData::new(values, shape),
            (&self.params.device, self.params.dtype),
        ))
    }

    fn matrix(&mut self, name: &str, shape: [usize; 2]) -> Result<Tensor<B, 2>> {
        self.params.tensor(name, shape)
    }
}

/// Loads a Hugging Face checkpoint folder (`config.json` and safetensors weights) in `dtype`;
/// a Gemma 3 folder's norm weights are read through [`GemmaNorms`].
pub fn load_model<B: Backend>(dir: &Path, device: &B::Device, dtype: DType) -> Result<Llm<B>> {
    let config = LlmConfig::from_dir(dir)?;
    let mut params = SafetensorsParams::<B>::open(dir, device, dtype)?;
    if config.architecture == Architecture::Gemma3 {
        return Llm::build(config, &mut GemmaNorms::new(&params), device, dtype);
    }
    Llm::build(config, &mut params, device, dtype)
}
