//! How decode steps run ([`Decoder`]): eagerly ([`Llm::forward_ids`], a new graph per position, attending
//! over the filled prefix) or as the fixed-shape step ([`Llm::fixed_step`], the same graph at
//! every position, attending over the whole cache with later positions masked), which on `Mlx`
//! is traced once and compiled by MLX ([`burn_mlx::compile`]).
//!
//! Compiling removes most of the host's work of building the step's graph through Burn and lets
//! MLX fuse the elementwise ops between the matmuls; the price is attention over every cached
//! position instead of the filled ones, and on CUDA MLX's composed attention instead of its fused
//! one (MLX 0.32's fused decode kernels take no mask array). Which wins depends on the device:
//! see [`Decoder::best`].

use super::cache::{KvCache, LayerCache};
use super::error::{LlmError, Result};
use super::model::{Llm, Logits};
use burn_mlx::{compile, from_mlx, to_mlx, Compiled, Mlx, MlxDevice, MlxError, MlxTensor};
use burn_tensor::backend::Backend;
use burn_tensor::{Int, Tensor, TensorData};
use std::any::Any;

/// A model and the way its decode steps (one token after the cached ones) run.
pub struct Decoder<B: Backend> {
    model: Llm<B>,
    kind: Kind,
}

/// How the steps run.
enum Kind {
    Eager,
    /// The fixed-shape step, compiled when `B` is `Mlx`.
    Fixed(Option<Compiled>),
}

impl<B: Backend> std::fmt::Debug for Decoder<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

impl<B: Backend> Decoder<B> {
    /// Eager steps: [`Llm::forward_ids`].
    pub fn eager(model: &Llm<B>) -> Self {
        Self {
            model: model.clone(),
            kind: Kind::Eager,
        }
    }

    /// Fixed-shape steps ([`Llm::fixed_step`]), compiled by MLX when `B` is `Mlx`.
    pub fn fixed(model: &Llm<B>) -> Self {
        let any: Box<dyn Any> = Box::new(model.clone());
        let compiled = any.downcast::<Llm<Mlx>>().ok().map(|m| compile_step(*m));
        Self {
            model: model.clone(),
            kind: Kind::Fixed(compiled),
        }
    }

    /// The faster way for this backend and device, as measured (`benches/nvidia.md`,
    /// `benches/decode.md`): compiled fixed-shape steps on `Mlx`'s CPU (1.14x the eager step on
    /// the `small` preset), eager steps on an MLX GPU (with fused projections and the decode
    /// kernels of `burn_mlx::decode`, the compiled step ran at 0.75-0.79x the eager one on an
    /// H200: a replayed trace still evaluates one MLX primitive per traced op, and MLX's
    /// evaluation of the replayed step took 3.9-4.3 ms of host time against the eager step's
    /// 2.8-2.9 ms) and on every other backend (which has no compiler).
    pub fn best(model: &Llm<B>) -> Self {
        match mlx_device::<B>(model.device()) {
            Some(MlxDevice::Cpu) => Self::fixed(model),
            _ => Self::eager(model),
        }
    }

    /// The model.
    pub fn model(&self) -> &Llm<B> {
        &self.model
    }

    /// What runs the steps, for the summary.
    pub fn describe(&self) -> &'static str {
        match &self.kind {
            Kind::Eager => "eager decode steps",
            Kind::Fixed(Some(_)) => "compiled decode steps (MLX compile, fixed shapes)",
            Kind::Fixed(None) => "fixed-shape decode steps (not compiled)",
        }
    }

    /// Runs `ids` (`[1, 1]`, on the device) after the cached positions, writes its keys and
    /// values into `cache`, and returns its logits (`[1, vocab]`).
    pub fn step(&mut self, ids: Tensor<B, 2, Int>, cache: &mut KvCache<B>) -> Result<Tensor<B, 2>> {
        let step_model = &self.model;
        let compiled = match &mut self.kind {
            Kind::Eager => return step_model.forward_ids(ids, cache, Logits::Last),
            Kind::Fixed(compiled) => compiled,
        };
        let [batch, seq] = ids.dims();
        if batch != 1 || seq != 1 {
            return Err(LlmError::Input(format!(
                "decode step: token ids must be [1, 1], got [{batch}, {seq}]"
            )));
        }
        cache.check(step_model.config(), 1)?;
        let offset = Tensor::<B, 1, Int>::from_data(
            TensorData::new(vec![cache.len() as i64], [1]),
            step_model.device(),
        );
        let layers = cache.take_layers();
        let kept: Vec<(Tensor<B, 4>, Tensor<B, 4>)> = match compiled {
            // Kept only to restore the cache if the compiled call fails.
            Some(_) => layers.iter().map(LayerCache::tensors).collect(),
            None => Vec::new(),
        };
        let result = match compiled {
            Some(compiled) => call_compiled(compiled, ids, offset, layers),
            None => step_model.fixed_step(ids, offset, layers),
        };
        match result {
            Ok((logits, layers)) => {
                drop(kept);
                cache.put_layers(layers);
                cache.advance(1);
                Ok(logits)
            }
            Err(e) => {
                cache.put_layers(
                    kept.into_iter()
                        .map(|(k, v)| LayerCache::from_tensors(k, v))
                        .collect(),
                );
                Err(e)
            }
        }
    }
}

/// `device` as MLX's device when backend `B` runs on MLX (`Mlx`, or an `Autodiff` of it).
pub(crate) fn mlx_device<B: Backend>(device: &B::Device) -> Option<MlxDevice> {
    let device: &dyn Any = device;
    device.downcast_ref::<MlxDevice>().copied()
}

/// The step as an MLX-compiled function of `[ids, offset, keys 0, values 0, keys 1, ...]`
/// returning `[logits, keys 0, values 0, ...]`; the model's weights are constants of the trace.
fn compile_step(model: Llm<Mlx>) -> Compiled {
    compile(
        move |inputs: &[MlxTensor]| step_function(&model, inputs),
        false,
    )
}

/// The fixed-shape step over MLX tensors: `[ids [1, 1], offset [1], keys 0, values 0, keys 1,
/// ...]` (each cache `[1, kv heads, capacity, head dim]`) to `[logits [1, vocab], keys 0,
/// values 0, ...]`, the caches with this position written. What [`compile_step`] compiles and
/// [`crate::export::export_decode_step`] writes to a file.
pub(crate) fn step_function(
    model: &Llm<Mlx>,
    inputs: &[MlxTensor],
) -> std::result::Result<Vec<MlxTensor>, MlxError> {
    let fail = |e: LlmError| MlxError::Mlx {
        op: "decode step".into(),
        message: e.to_string(),
    };
    let expected = 2 + 2 * model.config().num_layers;
    if inputs.len() != expected {
        return Err(fail(LlmError::Input(format!(
            "the step takes {expected} inputs (ids, offset, keys and values of {} layers), got {}",
            model.config().num_layers,
            inputs.len()
        ))));
    }
    let ids: Tensor<Mlx, 2, Int> = Tensor::from_primitive(inputs[0].clone());
    let offset: Tensor<Mlx, 1, Int> = Tensor::from_primitive(inputs[1].clone());
    let float = |t: &MlxTensor| {
        Tensor::<Mlx, 4>::from_primitive(burn_tensor::TensorPrimitive::Float(t.clone()))
    };
    let layers = inputs[2..]
        .chunks(2)
        .map(|kv| LayerCache::from_tensors(float(&kv[0]), float(&kv[1])))
        .collect();
    let (logits, layers) = model.fixed_step(ids, offset, layers).map_err(fail)?;
    let mut outputs = vec![logits.into_primitive().tensor()];
    for layer in layers {
        let (k, v) = layer.into_tensors();
        outputs.push(k.into_primitive().tensor());
        outputs.push(v.into_primitive().tensor());
    }
    Ok(outputs)
}

/// The MLX tensor behind a tensor of backend `B`, which is `Mlx` here.
fn mlx<B: Backend, const D: usize, K>(t: Tensor<B, D, K>) -> MlxTensor
where
    K: burn_tensor::TensorKind<B> + burn_tensor::BasicOps<B>,
    K::Primitive: 'static,
{
    to_mlx(t).unwrap_or_else(|_| unreachable!("compiled only on Mlx"))
}

/// Calls the compiled step with tensors of backend `B` (which is `Mlx`).
fn call_compiled<B: Backend>(
    compiled: &mut Compiled,
    ids: Tensor<B, 2, Int>,
    offset: Tensor<B, 1, Int>,
    layers: Vec<LayerCache<B>>,
) -> Result<(Tensor<B, 2>, Vec<LayerCache<B>>)> {
    let mut inputs = vec![mlx(ids), mlx(offset)];
    for layer in layers {
        let (k, v) = layer.into_tensors();
        inputs.push(mlx(k));
        inputs.push(mlx(v));
    }
    let outputs = compiled
        .call(&inputs)
        .map_err(|e| LlmError::Input(format!("the compiled decode step failed: {e}")))?;
    // The inputs go before the outputs are evaluated: each cache buffer is then referenced only
    // by its update, which MLX performs in place.
    drop(inputs);
    let back = |t: MlxTensor| from_mlx::<B, 4, burn_tensor::Float>(t).expect("B is Mlx");
    let mut outputs = outputs.into_iter();
    let logits = outputs.next().expect("the step returns logits");
    let logits = from_mlx::<B, 2, burn_tensor::Float>(logits).expect("B is Mlx");
    let mut layers = Vec::new();
    while let (Some(k), Some(v)) = (outputs.next(), outputs.next()) {
        layers.push(LayerCache::from_tensors(back(k), back(v)));
    }
    Ok((logits, layers))
}
