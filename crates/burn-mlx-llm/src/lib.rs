//! A decoder-only language model (the Llama and Qwen3 families) written with Burn tensor ops,
//! generic over the backend, and what runs it: the Hugging Face `config.json` and safetensors
//! weights, a key/value cache preallocated to a maximum context, rotary position embeddings,
//! greedy and sampled generation with timing, and random-weight presets for benchmarks.
//!
//! The `llm` command (`src/bin/llm.rs`) runs it from the command line; `tests/llm.rs` checks it
//! against Hugging Face transformers.

pub mod cache;
pub mod cli;
pub mod config;
pub mod error;
pub mod export;
pub mod generate;
pub mod gguf;
pub mod lora;
pub mod model;
pub mod rope;
pub mod sampling;
pub mod step;
pub mod tokenizer;
pub mod weights;
