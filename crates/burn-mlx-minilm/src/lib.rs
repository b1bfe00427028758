//! all-MiniLM-L6-v2 (a 6-layer BERT with mean pooling) written with burn-nn modules, generic over
//! the backend, plus what it needs around it: finding the model files, loading the Hugging Face
//! safetensors weights through burn-store, and tokenizing with the shipped `tokenizer.json`.
//!
//! The `embed` command (`src/bin/embed.rs`) embeds sentences with it (and `--export` writes it as
//! an MLX function file, `src/export.rs`); `tests/minilm.rs` checks it
//! against the PyTorch / sentence-transformers reference.

extern crate burn_core as burn;

pub mod export;
pub mod load;
pub mod locate;
pub mod model;
