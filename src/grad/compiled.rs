//! A whole training step (forward, MLX's backward, Adam) compiled by MLX as one function.

use super::params::Replace;
use super::value_and_grad::loss_and_grads;
use crate::backend::Mlx;
use crate::compile::function::{compile, Compiled};
use crate::device::MlxDevice;
use crate::error::MlxError;
use crate::interop::from_mlx;
use crate::tensor::MlxTensor;
use burn_core::module::Module;
use burn_tensor::Tensor;
use mlx_rs::{ops, Array};
use std::rc::Rc;

/// Adam's settings for [`CompiledTrainer`], with the defaults of Burn's `AdamConfig`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamSettings {
    /// Decay of the first moment (Burn's default 0.9).
    pub beta_1: f32,
    /// Decay of the second moment (Burn's default 0.999).
    pub beta_2: f32,
    /// Added to the second moment's root (Burn's default 1e-5).
    pub epsilon: f32,
    /// Decoupled weight decay, as Burn's `AdamW`: each step first multiplies the parameter by
    /// `1 - lr · weight_decay` (0, the default: Adam).
    pub weight_decay: f32,
}

impl Default for AdamSettings {
    fn default() -> Self {
        Self {
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-5,
            weight_decay: 0.0,
        }
    }
}

/// The loss of a [`CompiledTrainer`]: the model and the batch to a one-value loss, or an error.
type Loss<M> = dyn Fn(&M, &[MlxTensor]) -> Result<Tensor<Mlx, 1>, MlxError>;

/// Trains a model with Adam (or AdamW), the whole step compiled by MLX: the forward pass, MLX's backward
/// pass and the update are traced once per batch signature and replayed, as MLX programs do with
/// `mx.compile` around their step. Adam's arithmetic is Burn's (`AdamConfig` without weight
/// decay or AMSGrad: bias-corrected moments, epsilon added to the root), with its step count
/// kept as an array so that the trace serves every step.
///
/// The loss takes the model and the batch. Everything that changes from step to step must come
/// in through `batch`: tensors the loss captures are frozen into the trace at the first step.
/// The loss cannot read values (a trace has none yet), and a new batch shape or dtype traces the
/// step again. Like [`Compiled`], a trainer belongs to the thread that made it (not `Send`).
///
/// ```
/// use burn_core::module::Module;
/// use burn_mlx::grad::{AdamSettings, CompiledTrainer};
/// use burn_mlx::{from_mlx, to_mlx, Mlx, MlxDevice, MlxTensor};
/// use burn_nn::{Linear, LinearConfig};
/// use burn_tensor::{Distribution, Tensor};
///
/// let device = MlxDevice::Cpu;
/// let model: Linear<Mlx> = LinearConfig::new(4, 1).init(&device);
/// let mut trainer = CompiledTrainer::new(model, AdamSettings::default(), |m: &Linear<Mlx>, batch: &[MlxTensor]| {
///     let x: Tensor<Mlx, 2> = from_mlx(batch[0].clone()).unwrap();
///     let y: Tensor<Mlx, 2> = from_mlx(batch[1].clone()).unwrap();
///     (m.forward(x) - y).powi_scalar(2).mean()
/// })
/// .unwrap();
/// for _ in 0..3 {
///     let x = Tensor::<Mlx, 2>::random([8, 4], Distribution::Default, &device);
///     let y = x.clone().sum_dim(1);
///     let batch = [to_mlx(x).unwrap(), to_mlx(y).unwrap()];
///     assert!(trainer.step(1e-2, &batch).unwrap().into_scalar().is_finite());
/// }
/// let trained: Linear<Mlx> = trainer.model();
/// ```
pub struct CompiledTrainer<M> {
    template: Rc<M>,
    compiled: Compiled,
    params: Vec<MlxTensor>,
    moment_1: Vec<MlxTensor>,
    moment_2: Vec<MlxTensor>,
    /// Steps taken, as an f32 scalar array.
    time: MlxTensor,
    device: MlxDevice,
}

impl<M: Module<Mlx> + 'static> CompiledTrainer<M> {
    /// Prepares `model` for training with Adam (`adam`) on `loss`; nothing is traced before
    /// the first [`step`](Self::step).
    ///
    /// # Errors
    ///
    /// [`MlxError::Mlx`] when `model` has no float parameter.
    pub fn new(
        model: M,
        adam: AdamSettings,
        loss: impl Fn(&M, &[MlxTensor]) -> Tensor<Mlx, 1> + 'static,
    ) -> Result<Self, MlxError> {
        Self::try_new(model, adam, move |m: &M, batch: &[MlxTensor]| {
            Ok(loss(m, batch))
        })
    }

    /// [`new`](Self::new) with a loss that can fail (a model whose forward pass checks its
    /// inputs): an error while the step is traced is returned by [`step`](Self::step).
    ///
    /// # Errors
    ///
    /// [`MlxError::Mlx`] when `model` has no float parameter.
    pub fn try_new(
        model: M,
        adam: AdamSettings,
        loss: impl Fn(&M, &[MlxTensor]) -> Result<Tensor<Mlx, 1>, MlxError> + 'static,
    ) -> Result<Self, MlxError> {
        let mut arrays = super::params::Arrays::default();
        model.visit(&mut arrays);
        let Some(device) = arrays.device else {
            return Err(MlxError::mlx(
                "CompiledTrainer",
                "the model has no float parameter to train",
            ));
        };
        let n = arrays.arrays.len();
        let zeros = |a: &Array| {
            device
                .scope(|| ops::zeros_like(a))
                .map(|z| MlxTensor::from_array(z, device))
                .map_err(|e| MlxError::mlx("CompiledTrainer", e))
        };
        let moment_1 = arrays.arrays.iter().map(zeros).collect::<Result<_, _>>()?;
        let moment_2 = arrays.arrays.iter().map(zeros).collect::<Result<_, _>>()?;
        let params = arrays
            .arrays
            .into_iter()
            .map(|a| MlxTensor::from_array(a, device))
            .collect();
        let template = Rc::new(model);
        let traced = template.clone();
        let compiled = compile(
            move |inputs: &[MlxTensor]| step_graph(traced.as_ref(), &loss, adam, n, inputs),
            false,
        );
        Ok(Self {
            template,
            compiled,
            params,
            moment_1,
            moment_2,
            time: MlxTensor::from_array(Array::from_f32(0.0), device),
            device,
        })
    }

    /// One step at learning rate `lr` on `batch` (the tensors the loss reads). Returns the loss
    /// (lazy); the parameters and Adam's moments stay lazy until the next step or a read.
    ///
    /// # Errors
    ///
    /// As [`value_and_grad`](super::value_and_grad), and an error when `batch` is on another
    /// device than the model; the trainer is left as it was.
    pub fn step(&mut self, lr: f64, batch: &[MlxTensor]) -> Result<Tensor<Mlx, 1>, MlxError> {
        let lr = MlxTensor::from_array(Array::from_f32(lr as f32), self.device);
        let mut inputs: Vec<MlxTensor> =
            Vec::with_capacity(3 * self.params.len() + 2 + batch.len());
        inputs.extend(self.params.iter().cloned());
        inputs.extend(self.moment_1.iter().cloned());
        inputs.extend(self.moment_2.iter().cloned());
        inputs.push(self.time.clone());
        inputs.push(lr);
        inputs.extend(batch.iter().cloned());
        let mut outputs = self.compiled.call(&inputs)?.into_iter();
        let n = self.params.len();
        let mut next = |k: usize| outputs.by_ref().take(k).collect::<Vec<_>>();
        let value = next(1).remove(0);
        self.params = next(n);
        self.moment_1 = next(n);
        self.moment_2 = next(n);
        self.time = next(1).remove(0);
        Ok(from_mlx(value).unwrap_or_else(|| unreachable!("a float tensor")))
    }

    /// Starts evaluating, without waiting, the parameters, Adam's state and `outputs` (the
    /// losses the caller will read): the device runs the last step while the host prepares the
    /// next, and the next step's graph does not hold the previous one's. The next step then
    /// allocates its buffers while this one still holds its own.
    ///
    /// # Errors
    ///
    /// When MLX fails to schedule the evaluation, or inside a traced function.
    pub fn start(&self, outputs: &[Tensor<Mlx, 1>]) -> Result<(), MlxError> {
        self.evaluate("CompiledTrainer::start", outputs, false)
    }

    /// Evaluates the parameters, Adam's state and `outputs`, and waits until the device is done
    /// with them: a step's buffers are free before the next step allocates its own (as MLX
    /// programs do, evaluating their state after each step).
    ///
    /// # Errors
    ///
    /// When MLX fails to evaluate, or inside a traced function.
    pub fn finish(&self, outputs: &[Tensor<Mlx, 1>]) -> Result<(), MlxError> {
        self.evaluate("CompiledTrainer::finish", outputs, true)
    }

    fn evaluate(&self, op: &str, outputs: &[Tensor<Mlx, 1>], wait: bool) -> Result<(), MlxError> {
        crate::trace::check_not_tracing(op)?;
        let mut arrays: Vec<&Array> = Vec::with_capacity(3 * self.params.len() + 1);
        let state = self
            .params
            .iter()
            .chain(&self.moment_1)
            .chain(&self.moment_2);
        arrays.extend(state.chain(std::iter::once(&self.time)).map(|t| &t.array));
        let outputs: Vec<MlxTensor> = outputs
            .iter()
            .filter_map(|t| crate::interop::to_mlx(t.clone()).ok())
            .collect();
        arrays.extend(outputs.iter().map(|t| &t.array));
        let _guard = crate::tensor::eval_lock();
        crate::compile::auto::eval(op, &arrays, wait)?;
        self.device.after_eval();
        Ok(())
    }

    /// The model with the parameters trained so far.
    pub fn model(&self) -> M {
        let arrays: Vec<Array> = self.params.iter().map(|t| t.array.clone()).collect();
        (*self.template).clone().map(&mut Replace {
            arrays: &arrays,
            next: 0,
            device: self.device,
        })
    }
}

/// The traced step: `inputs` are the `n` parameters, their `n` first and `n` second moments,
/// the step count, the learning rate and the batch; the outputs the loss, the new parameters,
/// the new moments and the new step count.
fn step_graph<M: Module<Mlx>>(
    template: &M,
    loss: &Loss<M>,
    adam: AdamSettings,
    n: usize,
    inputs: &[MlxTensor],
) -> Result<Vec<MlxTensor>, MlxError> {
    let fail = |e| MlxError::mlx("CompiledTrainer", e);
    let device = inputs[0].device;
    let array = |t: &MlxTensor| t.array.clone();
    let params: Vec<Array> = inputs[..n].iter().map(array).collect();
    let (time, lr) = (&inputs[3 * n].array, &inputs[3 * n + 1].array);
    let batch = &inputs[3 * n + 2..];
    let model = template.clone().map(&mut Replace {
        arrays: &params,
        next: 0,
        device,
    });
    // The loss's error, if any, is kept here and returned once MLX's transform is done (its
    // closure must give MLX a value: a zero that is never used).
    let failed = std::cell::RefCell::new(None);
    let (value, grads, _) = loss_and_grads(&model, &|m: &M| match loss(m, batch) {
        Ok(value) => value,
        Err(e) => {
            failed.borrow_mut().get_or_insert(e);
            Tensor::zeros([1], &device)
        }
    })?;
    if let Some(e) = failed.into_inner() {
        return Err(e);
    }
    let scalar = Array::from_f32;
    let time = time.add(scalar(1.0)).map_err(fail)?;
    // 1 - beta^t, on the device: the step count is an input, not a constant of the trace.
    let correction = |beta: f32| -> Result<Array, MlxError> {
        scalar(1.0)
            .subtract(ops::power(scalar(beta), &time).map_err(fail)?)
            .map_err(fail)
    };
    let (c1, c2) = (correction(adam.beta_1)?, correction(adam.beta_2)?);
    let mut new = (Vec::new(), Vec::new(), Vec::new());
    for (i, g) in grads.iter().enumerate() {
        let (p, m, v) = (&params[i], &inputs[n + i].array, &inputs[2 * n + i].array);
        let update = || -> Result<(Array, Array, Array), mlx_rs::error::Exception> {
            // Every constant in the parameter's dtype: an f32 scalar would promote an f16 or
            // bf16 parameter (and its moments) to f32, as Burn's Adam does not.
            let dtype = p.dtype();
            let k = |x: f32| scalar(x).as_dtype(dtype);
            let m = m
                .multiply(k(adam.beta_1)?)?
                .add(g.multiply(k(1.0 - adam.beta_1)?)?)?;
            let v = v
                .multiply(k(adam.beta_2)?)?
                .add(g.square()?.multiply(k(1.0 - adam.beta_2)?)?)?;
            let root = v
                .divide(c2.as_dtype(dtype)?)?
                .sqrt()?
                .add(k(adam.epsilon)?)?;
            let delta = m.divide(c1.as_dtype(dtype)?)?.divide(&root)?;
            let lr = lr.as_dtype(dtype)?;
            let p = match adam.weight_decay {
                0.0 => p.clone(),
                decay => p.multiply(k(1.0)?.subtract(lr.multiply(k(decay)?)?)?)?,
            };
            Ok((p.subtract(delta.multiply(&lr)?)?, m, v))
        };
        let (p, m, v) = update().map_err(fail)?;
        new.0.push(p);
        new.1.push(m);
        new.2.push(v);
    }
    let outputs = std::iter::once(value)
        .chain(new.0)
        .chain(new.1)
        .chain(new.2)
        .chain(std::iter::once(time));
    Ok(outputs.map(|a| MlxTensor::from_array(a, device)).collect())
}
