//! LoRA fine-tuning of the decoder, as mlx-lm's `mlx_lm.lora` does it.
//!
//! A [`Lora`] adds to chosen linear layers of the last `num_layers` blocks a low-rank update
//! `scale · (x·A)·B` ([`LoraUpdate`], `A` `[in, rank]` drawn uniformly in ±1/√in, `B`
//! `[rank, out]` zeros, so training starts from the base model). Only `A` and `B` are trained:
//! the base weights are plain tensors, never marked for gradients, so they get no gradient and
//! no optimizer state, and they may be in f32, bf16, f16 or quantized to 4 or 8 bits (QLoRA:
//! the products with the base stay MLX's quantized matmul).
//!
//! - [`data`]: mlx-lm's JSON Lines formats and its length-sorted, padded batches.
//! - [`train`](mod@train): the training loop on any autodiff backend (`Autodiff<Mlx>` in the
//!   `llm lora` command), with Adam(W), a learning-rate schedule, gradient accumulation,
//!   validation loss and tokens/s.
//! - [`files`]: adapters saved and loaded as mlx-lm writes them (`adapters.safetensors`,
//!   `adapter_config.json`) and as Hugging Face PEFT does (`adapter_model.safetensors`,
//!   `adapter_config.json`), each checked against the model they are loaded into.
//! - [`fuse`]: a Hugging Face folder with the adapters added into the weights.

pub mod data;
pub mod files;
pub mod fuse;
pub mod train;

use crate::config::LlmConfig;
use crate::error::{LlmError, Result};
use crate::model::{Llm, LoraUpdate, LINEAR_KEYS};
use burn_core as burn;
use burn_core::module::{Module, Param};
use burn_tensor::backend::Backend;
use burn_tensor::{DType, Distribution, Tensor};

/// Which layers get adapters and how they are shaped: mlx-lm's `lora_parameters` and
/// `num_layers` (its defaults: rank 8, scale 20, dropout 0, the last 16 blocks, every linear
/// layer of a block).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// The rank `r` of each update.
    pub rank: usize,
    /// The factor on the update (PEFT's `lora_alpha / r`).
    pub scale: f64,
    /// Dropout on the update's input during training.
    pub dropout: f64,
    /// How many blocks, counted from the last, get adapters (more than the model has: all).
    pub num_layers: usize,
    /// The linear layers of a block that get adapters (names from [`LINEAR_KEYS`]); `None`:
    /// all of them.
    pub keys: Option<Vec<String>>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        Self {
            rank: 8,
            scale: 20.0,
            dropout: 0.0,
            num_layers: 16,
            keys: None,
        }
    }
}

impl LoraConfig {
    /// The keys that get adapters, checked against [`LINEAR_KEYS`].
    pub fn keys(&self) -> Result<Vec<String>> {
        match &self.keys {
            None => Ok(LINEAR_KEYS.iter().map(|k| k.to_string()).collect()),
            Some(keys) => {
                if keys.is_empty() {
                    return Err(LlmError::Input(
                        "LoRA keys: the list is empty; name at least one of the block's linear \
                         layers"
                            .into(),
                    ));
                }
                for key in keys {
                    if !LINEAR_KEYS.contains(&key.as_str()) {
                        return Err(LlmError::Input(format!(
                            "LoRA key `{key}` is not a linear layer of a decoder block; the keys \
                             are {}",
                            LINEAR_KEYS.join(", ")
                        )));
                    }
                }
                Ok(keys.clone())
            }
        }
    }

    /// The first block that gets adapters.
    pub fn first_layer(&self, model: &LlmConfig) -> usize {
        model.num_layers.saturating_sub(self.num_layers)
    }

    /// Checks the numbers (rank at least 1, finite scale, dropout in [0, 1)).
    pub fn check(&self) -> Result<()> {
        if self.rank == 0 {
            return Err(LlmError::Input("LoRA rank must be at least 1".into()));
        }
        if !self.scale.is_finite() {
            return Err(LlmError::Input(format!(
                "LoRA scale must be finite, got {}",
                self.scale
            )));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(LlmError::Input(format!(
                "LoRA dropout must be in [0, 1), got {}",
                self.dropout
            )));
        }
        self.keys().map(|_| ())
    }
}

/// One adapted linear layer: its block and key, and its `[out, in]` shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The block index.
    pub layer: usize,
    /// The layer within the block (one of [`LINEAR_KEYS`]).
    pub key: String,
    /// `[out, in]` of the base weight.
    pub dims: [usize; 2],
}

impl Target {
    /// The layer's Hugging Face / mlx-lm name, `model.layers.{layer}.{key}`.
    pub fn name(&self) -> String {
        format!("model.layers.{}.{}", self.layer, self.key)
    }
}

/// The trainable tensors: `A` and `B` of every target, in [`Lora::targets`]' order. A Burn
/// module, so that Burn's optimizers and gradients address them.
#[derive(Module, Debug)]
pub struct Adapters<B: Backend> {
    /// `A` of each target, `[in, rank]`.
    pub a: Vec<Param<Tensor<B, 2>>>,
    /// `B` of each target, `[rank, out]`.
    pub b: Vec<Param<Tensor<B, 2>>>,
}

/// A model's LoRA adapters: the configuration, the adapted layers and their tensors.
#[derive(Debug)]
pub struct Lora<B: Backend> {
    /// Rank, scale, dropout and which layers.
    pub config: LoraConfig,
    /// The adapted layers.
    pub targets: Vec<Target>,
    /// `A` and `B` of each target.
    pub adapters: Adapters<B>,
}

/// `[out, in]` of linear layer `key` (one of [`LINEAR_KEYS`]) of a block of `model`.
pub fn linear_dims(model: &LlmConfig, key: &str) -> Option<[usize; 2]> {
    let (h, i, d) = (model.hidden_size, model.intermediate_size, model.head_dim);
    let (q, kv) = (model.num_heads * d, model.num_kv_heads * d);
    Some(match key {
        "self_attn.q_proj" => [q, h],
        "self_attn.k_proj" | "self_attn.v_proj" => [kv, h],
        "self_attn.o_proj" => [h, q],
        "mlp.gate_proj" | "mlp.up_proj" => [i, h],
        "mlp.down_proj" => [h, i],
        _ => return None,
    })
}

/// The layers `config` adapts in a model of shape `model`, in block order, then
/// [`LINEAR_KEYS`] order.
pub fn targets(model: &LlmConfig, config: &LoraConfig) -> Result<Vec<Target>> {
    config.check()?;
    let keys = config.keys()?;
    let mut targets = vec![];
    for layer in config.first_layer(model)..model.num_layers {
        for key in LINEAR_KEYS.iter().filter(|k| keys.iter().any(|x| x == *k)) {
            targets.push(Target {
                layer,
                key: key.to_string(),
                dims: linear_dims(model, key).expect("LINEAR_KEYS have dims"),
            });
        }
    }
    Ok(targets)
}

impl<B: Backend> Lora<B> {
    /// New adapters for `model`, as mlx-lm draws them: `A` uniform in ±1/√in, `B` zeros, in
    /// `dtype` (f32 unless the user asks otherwise; mlx-lm's are f32 whatever the base).
    /// The draws use Burn's random generator on `B` (seed it with `B::seed`).
    pub fn init(model: &Llm<B>, config: LoraConfig, dtype: DType) -> Result<Self> {
        let targets = targets(model.config(), &config)?;
        let device = model.device();
        let (mut a, mut b) = (vec![], vec![]);
        for t in &targets {
            let [out, input] = t.dims;
            let bound = 1.0 / (input as f64).sqrt();
            a.push(Param::from_tensor(Tensor::random(
                [input, config.rank],
                Distribution::Uniform(-bound, bound),
                (device, dtype),
            )));
            b.push(Param::from_tensor(Tensor::zeros(
                [config.rank, out],
                (device, dtype),
            )));
        }
        Ok(Self {
            config,
            targets,
            adapters: Adapters { a, b },
        })
    }

    /// Sets every target layer of `model` to add its update. With `training`, the updates
    /// apply the configured dropout; without, none (generation, validation).
    pub fn install(&self, model: &mut Llm<B>, training: bool) -> Result<()> {
        let dropout = if training { self.config.dropout } else { 0.0 };
        // Outside training the update is detached, so that no autodiff graph is recorded.
        let value = |p: &Param<Tensor<B, 2>>| if training { p.val() } else { p.val().detach() };
        for (i, t) in self.targets.iter().enumerate() {
            let update = LoraUpdate {
                a: value(&self.adapters.a[i]),
                b: value(&self.adapters.b[i]),
                scale: self.config.scale,
                dropout,
            };
            let fused = model.projections_fused();
            model
                .linear_mut(t.layer, &t.key)
                .ok_or_else(|| {
                    LlmError::Input(if fused {
                        format!(
                            "{}: the model's projections are fused (Llm::fuse_projections), and \
                             adapters name the separate layers: add the adapters to a model \
                             that is not fused",
                            t.name()
                        )
                    } else {
                        format!("model has no layer {}", t.name())
                    })
                })?
                .set_lora(Some(update));
        }
        Ok(())
    }

    /// Removes every update from `model` (the base model again).
    pub fn uninstall(&self, model: &mut Llm<B>) {
        for t in &self.targets {
            if let Some(linear) = model.linear_mut(t.layer, &t.key) {
                linear.set_lora(None);
            }
        }
    }

    /// The number of trainable values (`A` and `B` of every target).
    pub fn num_params(&self) -> usize {
        self.targets
            .iter()
            .map(|t| self.config.rank * (t.dims[0] + t.dims[1]))
            .sum()
    }
}
