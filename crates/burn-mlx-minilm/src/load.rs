//! Loading all-MiniLM-L6-v2 from its folder: `config.json`, the Hugging Face `model.safetensors`
//! (through burn-store, with key remapping and the PyTorch layout adapter) and `tokenizer.json`.

use super::model::{BertConfig, BertModel};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use burn_store::{ModuleSnapshot, PyTorchToBurnAdapter, SafetensorsStore};
use std::path::Path;
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

/// sentence-transformers' `max_seq_length` for this model (`sentence_bert_config.json`).
pub const MAX_SEQ_LEN: usize = 256;

/// Hugging Face names (left) to this crate's module paths (right). Everything else keeps its name
/// (`embeddings.word_embeddings.weight`, ...). LayerNorm `weight`/`bias` become `gamma`/`beta` and
/// Linear weights are transposed by burn-store's [`PyTorchToBurnAdapter`].
const KEY_REMAP: &[(&str, &str)] = &[
    (r"^embeddings\.LayerNorm\.", "embeddings.norm."),
    (
        r"^encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.",
        "layers.$1.attention.$2.",
    ),
    (
        r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.",
        "layers.$1.attention.output.",
    ),
    (
        r"^encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.",
        "layers.$1.attention_norm.",
    ),
    (
        r"^encoder\.layer\.(\d+)\.intermediate\.dense\.",
        "layers.$1.ffn_up.",
    ),
    (
        r"^encoder\.layer\.(\d+)\.output\.dense\.",
        "layers.$1.ffn_down.",
    ),
    (
        r"^encoder\.layer\.(\d+)\.output\.LayerNorm\.",
        "layers.$1.ffn_norm.",
    ),
];

/// Builds the model from `dir/config.json` and loads `dir/model.safetensors` into it (f32).
/// Every parameter of the model must be found in the file; file tensors the model does not use
/// (`pooler.*`, `embeddings.position_ids`) are ignored.
pub fn load_model<B: Backend>(dir: &Path, device: &B::Device) -> Result<BertModel<B>, String> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path)
        .map_err(|e| format!("cannot read {}: {e}", config_path.display()))?;
    let config = BertConfig::from_json(&text)?;
    let mut model = config.init::<B>(device);
    let weights = dir.join("model.safetensors");
    if !weights.is_file() {
        return Err(format!("no weights at {}", weights.display()));
    }
    let mut store = SafetensorsStore::from_file(&weights).with_from_adapter(PyTorchToBurnAdapter);
    for (from, to) in KEY_REMAP {
        store = store.with_key_remapping(*from, *to);
    }
    let result = model
        .load_from(&mut store)
        .map_err(|e| format!("loading {}: {e}", weights.display()))?;
    if !result.errors.is_empty() || !result.missing.is_empty() {
        return Err(format!(
            "loading {}: {} errors {:?}, missing {:?}",
            weights.display(),
            result.errors.len(),
            result.errors,
            result.missing
        ));
    }
    Ok(model)
}

/// How to pad a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Padding {
    /// Pad to the longest sentence, truncate at [`MAX_SEQ_LEN`] (what sentence-transformers does).
    Longest,
    /// Pad or truncate every sentence to exactly this many tokens (throughput runs).
    Fixed(usize),
}

/// The shipped `tokenizer.json`, with the padding/truncation of `padding` (the file's own settings,
/// fixed 128, are replaced).
pub fn load_tokenizer(dir: &Path, padding: Padding) -> Result<Tokenizer, String> {
    let path = dir.join("tokenizer.json");
    let mut tokenizer =
        Tokenizer::from_file(&path).map_err(|e| format!("cannot load {}: {e}", path.display()))?;
    let (strategy, max_length) = match padding {
        Padding::Longest => (PaddingStrategy::BatchLongest, MAX_SEQ_LEN),
        Padding::Fixed(n) => (PaddingStrategy::Fixed(n), n),
    };
    let pad = tokenizer.get_padding().cloned().unwrap_or_default();
    tokenizer.with_padding(Some(PaddingParams { strategy, ..pad }));
    tokenizer
        .with_truncation(Some(TruncationParams {
            max_length,
            ..Default::default()
        }))
        .map_err(|e| format!("tokenizer truncation: {e}"))?;
    Ok(tokenizer)
}

/// A tokenized, padded batch as flat row-major `[batch, seq]` arrays.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Token ids.
    pub ids: Vec<i64>,
    /// Token type ids.
    pub type_ids: Vec<i64>,
    /// Attention mask: 1 on real tokens, 0 on padding.
    pub mask: Vec<i64>,
    /// Number of sentences.
    pub batch: usize,
    /// Padded length.
    pub seq: usize,
}

impl Batch {
    /// Tokenizes `sentences` (with special tokens) into one padded batch.
    pub fn encode(tokenizer: &Tokenizer, sentences: &[String]) -> Result<Self, String> {
        let encodings = tokenizer
            .encode_batch(sentences.to_vec(), true)
            .map_err(|e| format!("tokenizing: {e}"))?;
        let seq = encodings.first().map_or(0, |e| e.get_ids().len());
        let mut batch = Self {
            ids: vec![],
            type_ids: vec![],
            mask: vec![],
            batch: encodings.len(),
            seq,
        };
        for e in &encodings {
            if e.get_ids().len() != seq {
                return Err(format!(
                    "tokenizer padded unevenly: {} vs {seq}",
                    e.get_ids().len()
                ));
            }
            batch.ids.extend(e.get_ids().iter().map(|&v| v as i64));
            batch
                .type_ids
                .extend(e.get_type_ids().iter().map(|&v| v as i64));
            batch
                .mask
                .extend(e.get_attention_mask().iter().map(|&v| v as i64));
        }
        Ok(batch)
    }

    /// The `(ids, type_ids, mask)` tensors on `device`.
    pub fn tensors<B: Backend>(
        &self,
        device: &B::Device,
    ) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>, Tensor<B, 2, Int>) {
        let t = |v: &Vec<i64>| {
            Tensor::<B, 2, Int>::from_data(
                TensorData::new(v.clone(), [self.batch, self.seq]),
                device,
            )
        };
        (t(&self.ids), t(&self.type_ids), t(&self.mask))
    }
}

/// Embeds `sentences` with `model` and returns one `Vec<f32>` per sentence.
pub fn embed_sentences<B: Backend>(
    model: &BertModel<B>,
    tokenizer: &Tokenizer,
    sentences: &[String],
    device: &B::Device,
) -> Result<Vec<Vec<f32>>, String> {
    let batch = Batch::encode(tokenizer, sentences)?;
    let (ids, types, mask) = batch.tensors::<B>(device);
    let out = model.embed(ids, types, mask);
    let [n, dim] = out.dims();
    let values: Vec<f32> = out
        .cast(burn::tensor::FloatDType::F32)
        .into_data()
        .convert::<f32>()
        .to_vec()
        .map_err(|e| format!("reading embeddings: {e:?}"))?;
    Ok((0..n)
        .map(|i| values[i * dim..(i + 1) * dim].to_vec())
        .collect())
}

/// Cosine similarity of two vectors.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}
