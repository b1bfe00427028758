//! all-MiniLM-L6-v2 (a 6-layer BERT with mean pooling) written with burn-nn modules, generic over
//! the backend, plus what it needs around it: finding the model files, loading the Hugging Face
//! safetensors weights through burn-store, and tokenizing with the shipped `tokenizer.json`.
//!
//! Shared by `examples/embed.rs` and `tests/minilm.rs` (both include this folder with `#[path]`).
#![allow(dead_code)]

pub mod load;
pub mod locate;
pub mod model;
