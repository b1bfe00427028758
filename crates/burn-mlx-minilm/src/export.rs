//! The sentence embedder as an MLX function file: token ids, type ids and attention mask in,
//! normalized embeddings out, runnable by MLX Python, C++ and Swift without Burn.

use crate::load::Batch;
use crate::model::BertModel;
use burn::tensor::{Int, Tensor};
use burn_mlx::export::{examples_path, export, save_examples, ExportOptions, MlxFunction};
use burn_mlx::{Mlx, MlxDevice};
use std::path::Path;

/// What [`export_embedder`] wrote and measured.
#[derive(Debug, Clone)]
pub struct Exported {
    /// The sentence embeddings of `batch` computed by the file read back, `[batch][hidden]`.
    pub embeddings: Vec<Vec<f32>>,
    /// The largest difference between those and the model's own embeddings.
    pub max_diff: f32,
    /// The file's size in bytes.
    pub bytes: u64,
}

/// Writes `model.embed` to `file` for inputs of `batch`'s shape and of one sentence at the same
/// length (`[1, seq]` and `[batch, seq]` int64 ids, type ids and mask), reads the file back,
/// embeds `batch` with it, and saves `batch` and the model's own embeddings beside the file
/// ([`examples_path`]: `minilm.mlxfn` → `minilm.examples.safetensors`) for
/// `scripts/check_mlxfn.py`.
pub fn export_embedder(
    model: &BertModel<Mlx>,
    batch: &Batch,
    file: &Path,
    device: &MlxDevice,
) -> Result<Exported, String> {
    let (ids, types, mask) = batch.tensors::<Mlx>(device);
    let first = |t: &Tensor<Mlx, 2, Int>| t.clone().narrow(0, 0, 1);
    let one = (first(&ids), first(&types), first(&mask));
    let all = (ids.clone(), types.clone(), mask.clone());
    let options = ExportOptions {
        metadata: format!(
            "{{\"model\": \"sentence-transformers/all-MiniLM-L6-v2\", \"inputs\": [\"input_ids\", \
             \"token_type_ids\", \"attention_mask\"], \"input_dtype\": \"int64\", \"input_shapes\": \
             [[1, {seq}], [{n}, {seq}]], \"output\": \"embeddings, L2-normalized, [N, 384]\", \
             \"tokenizer\": \"tokenizer.json of the model, padded to {seq} tokens\"}}",
            seq = batch.seq,
            n = batch.batch
        ),
        ..ExportOptions::default()
    };
    type Inputs = (
        Tensor<Mlx, 2, Int>,
        Tensor<Mlx, 2, Int>,
        Tensor<Mlx, 2, Int>,
    );
    export(file, [one, all.clone()], &options, |(i, t, m): Inputs| {
        model.embed(i, t, m)
    })
    .map_err(|e| e.to_string())?;

    let own = model.embed(ids.clone(), types.clone(), mask.clone());
    let imported: Tensor<Mlx, 2> = MlxFunction::load(file)
        .and_then(|f| f.call(all))
        .map_err(|e| e.to_string())?;
    let max_diff: f32 = (imported.clone() - own.clone()).abs().max().into_scalar();
    let [n, dim] = imported.dims();
    let values: Vec<f32> = imported
        .into_data()
        .to_vec()
        .map_err(|e| format!("reading embeddings: {e:?}"))?;
    save_examples(
        examples_path(file),
        &[ids, types, mask].map(|t| t.into_primitive()),
        &[own.into_primitive().tensor()],
    )
    .map_err(|e| e.to_string())?;
    Ok(Exported {
        embeddings: (0..n)
            .map(|i| values[i * dim..(i + 1) * dim].to_vec())
            .collect(),
        max_diff,
        bytes: std::fs::metadata(file).map(|m| m.len()).unwrap_or(0),
    })
}
