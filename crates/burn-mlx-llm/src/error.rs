//! The one error type of the LLM example: every failure names what it concerns (file, tensor,
//! config key, shapes) so that a bad checkpoint is a readable message rather than a panic deep
//! inside a tensor op.

use std::path::PathBuf;

/// What went wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// A file could not be read.
    #[error("cannot read {}: {reason}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's message.
        reason: String,
    },
    /// `config.json` is malformed, lacks a key, or asks for something this model does not do.
    #[error("{}: {message}", path.display())]
    Config {
        /// The config file (or a preset name).
        path: PathBuf,
        /// What is wrong, naming the key.
        message: String,
    },
    /// The config names an architecture this model does not implement.
    #[error(
        "{}: unknown architecture `{found}` (supported: {})",
        path.display(),
        supported.join(", ")
    )]
    UnknownArchitecture {
        /// The config file.
        path: PathBuf,
        /// The `architectures`/`model_type` value found.
        found: String,
        /// What is supported.
        supported: Vec<String>,
    },
    /// A safetensors file is not valid (truncated, damaged header, bad offsets).
    #[error("{}: not a valid safetensors file ({size} bytes): {reason}", path.display())]
    BadWeights {
        /// The weights file.
        path: PathBuf,
        /// Its size on disk.
        size: u64,
        /// What the safetensors reader found.
        reason: String,
    },
    /// A tensor the model needs is in none of the weight files.
    #[error("{}: tensor `{tensor}` (shape {expected:?}) is missing", path.display())]
    MissingTensor {
        /// The weights file (or the sharded index) that should hold it.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The shape the model expects.
        expected: Vec<usize>,
    },
    /// A tensor has a shape the config does not imply.
    #[error(
        "{}: tensor `{tensor}` has shape {found:?}, the config implies {expected:?}",
        path.display()
    )]
    WrongShape {
        /// The weights file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The shape the model expects.
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },
    /// A tensor is stored in a dtype other than f32, bf16 or f16.
    #[error(
        "{}: tensor `{tensor}` is stored as {dtype}; only F32, BF16 and F16 are supported",
        path.display()
    )]
    UnsupportedDtype {
        /// The weights file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The dtype in the file.
        dtype: String,
    },
    /// The tokenizer could not be loaded or could not encode/decode.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A request the model cannot serve (token id out of the vocabulary, context full, ...).
    #[error("{0}")]
    Input(String),
    /// A training or validation data file is missing or holds a line that cannot be used.
    #[error("{}{}: {message}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
    Data {
        /// The data file (or folder).
        path: PathBuf,
        /// The 1-based line number, for a bad line of a JSON Lines file.
        line: Option<usize>,
        /// What is wrong, naming the key.
        message: String,
    },
    /// An adapter file does not fit the model (another model, wrong shapes, missing tensors,
    /// an unreadable `adapter_config.json`).
    #[error("{}: {message}", path.display())]
    Adapter {
        /// The adapter file or folder.
        path: PathBuf,
        /// What is wrong, naming the tensor or key.
        message: String,
    },
    /// An MLX operation failed: quantizing the weights, a product with quantized weights, or
    /// starting a training step on the device (the message names the op and the shapes).
    #[error("MLX: {0}")]
    Mlx(#[from] burn_mlx::MlxError),
}

/// Shorthand for results of this example.
pub type Result<T> = std::result::Result<T, LlmError>;
