//! One decode step as an MLX function file: MLX Python, C++ or Swift run the model's generation
//! loop from it without Burn (`scripts/mlxfn_generate.py` is such a loop in Python).
//!
//! The file holds the fixed-shape step ([`Llm::fixed_step`]) with the weights inside. Inputs, in
//! order: the token `[1, 1]` and its position `[1]` (Burn's int dtype, int64; the number of tokens already in the
//! cache), then the keys and values of every layer, `[1, kv heads, capacity, head dim]` each, in
//! the model's dtype. Outputs: the logits `[1, vocab]`, then every layer's keys and values with
//! this position written. A prompt goes in one token per step; the position counts up from 0 and
//! stays below the capacity. The file's metadata is JSON with these shapes.

use crate::error::{LlmError, Result};
use crate::model::Llm;
use crate::step::step_function;
use burn_mlx::export::{export_function, ExportOptions};
use burn_mlx::{to_mlx, Mlx, MlxOps, MlxTensor};
use burn_tensor::{Int, Tensor, TensorData};
use std::path::Path;

/// The inputs of one step at position 0 with an empty cache of `capacity` positions.
pub fn step_inputs(model: &Llm<Mlx>, capacity: usize) -> Vec<MlxTensor> {
    let device = model.device();
    // Ids and positions as the decode loop makes them (`Decoder::step`): Burn's int dtype.
    let zero = |shape: &[usize]| {
        let t = Tensor::<Mlx, 1, Int>::from_data(TensorData::new(vec![0i64], [1]), device);
        let t = to_mlx(t).unwrap_or_else(|_| unreachable!("the backend is Mlx"));
        (&t).reshape(shape).expect("one element")
    };
    let mut inputs = vec![zero(&[1, 1]), zero(&[1])];
    let mut cache = model.new_cache(capacity);
    for layer in cache.take_layers() {
        let (k, v) = layer.into_tensors();
        for t in [k, v] {
            inputs.push(to_mlx(t).unwrap_or_else(|_| unreachable!("the backend is Mlx")));
        }
    }
    inputs
}

/// Writes one decode step of `model` over a cache of `capacity` positions to `file`.
pub fn export_decode_step(model: &Llm<Mlx>, capacity: usize, file: &Path) -> Result<()> {
    if capacity == 0 {
        return Err(LlmError::Input(
            "--export: the cache capacity (--max-context) must be at least 1".into(),
        ));
    }
    let c = model.config();
    let inputs = step_inputs(model, capacity);
    let int = format!("{:?}", inputs[0].mlx_dtype()).to_lowercase();
    let dtype = format!("{:?}", inputs[2].mlx_dtype()).to_lowercase();
    let metadata = format!(
        "{{\"model\": \"burn-mlx-llm decode step\", \"architecture\": \"{:?}\", \
         \"layers\": {}, \"kv_heads\": {}, \"head_dim\": {}, \"capacity\": {capacity}, \
         \"vocab\": {}, \"dtype\": \"{dtype}\", \"int_dtype\": \"{int}\", \
         \"eos_token_ids\": {:?}, \
         \"inputs\": \"token {int} [1, 1], position {int} [1], then keys and values of each \
         layer [1, kv_heads, capacity, head_dim]\", \"outputs\": \"logits [1, vocab], then the \
         keys and values of each layer\"}}",
        c.architecture, c.num_layers, c.num_kv_heads, c.head_dim, c.vocab_size, c.eos_token_ids
    );
    let options = ExportOptions {
        metadata,
        ..ExportOptions::default()
    };
    export_function(file, &[inputs], &options, |x| step_function(model, x))
        .map_err(|e| LlmError::Input(format!("--export {}: {e}", file.display())))
}
