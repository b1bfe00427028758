//! Ops defined by one MLX function, forward and backward, for every backend built on [`Mlx`].
//!
//! A [`FusedOp`] maps float inputs to one float output with MLX ops (a fast kernel such as
//! `mlx::fast::layer_norm`, or a short composition). [`apply`] runs it:
//!
//! - on [`Mlx`], as the MLX function itself;
//! - on `Autodiff<Mlx, C>` (both of burn-autodiff's checkpoint strategies), as one node of
//!   Burn's autodiff graph whose backward pass is MLX's own vector-Jacobian product of the same
//!   function (`mlx::core::vjp`), compiled by MLX (`mlx::core::compile`, once per op and input
//!   signature) so that its elementwise runs become fused kernels: the op is one primitive
//!   forward and a few backward in the step's graph, where Burn's decomposition records dozens;
//! - on any other backend it gives the inputs back, and the caller composes the op from Burn's
//!   ops.

use crate::backend::Mlx;
use crate::device::MlxDevice;
use crate::tensor::{MlxTensor, OrPanic};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::{
    BalancedCheckpointing, CheckpointStrategy, NoCheckpointing,
};
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_autodiff::Autodiff;
use burn_backend::tensor::FloatTensor;
use burn_backend::Backend;
use mlx_rs::Array;
use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A differentiable function of float MLX arrays to one float array.
///
/// The inputs that the op does not differentiate (masks, class indices) are
/// [`side_inputs`](Self::side_inputs); settings (epsilon, scale) are fields, named by
/// [`key`](Self::key).
pub(crate) trait FusedOp: Send + Sync + Debug + 'static {
    /// The op's name in error messages.
    fn name(&self) -> &'static str;

    /// The op's name and every setting that [`forward`](Self::forward) bakes in: ops with the
    /// same key share one compiled backward function.
    fn key(&self) -> String;

    /// The inputs that are not differentiated, passed to [`forward`](Self::forward) as `side`.
    fn side_inputs(&self) -> Vec<Array> {
        Vec::new()
    }

    /// The output, built from MLX ops on the differentiable `inputs` and the `side` inputs
    /// (called for the forward pass, and traced by MLX for the backward pass).
    fn forward(&self, inputs: &[Array], side: &[Array]) -> Result<Array, mlx_rs::error::Exception>;

    /// The gradients of the differentiable `inputs` for the output's `cotangent`, built from MLX
    /// ops (traced once per input signature and compiled by MLX). By default MLX's own
    /// vector-Jacobian product of [`forward`](Self::forward); an op overrides it where MLX's
    /// product runs slowly on some device.
    fn vjp(
        &self,
        inputs: &[Array],
        side: &[Array],
        cotangent: &Array,
    ) -> Result<Vec<Array>, mlx_rs::error::Exception> {
        mlx_vjp(|xs| self.forward(xs, side), inputs, cotangent)
    }

    /// Arrays that [`forward`](Self::forward) computed and kept for the backward pass (a
    /// reduction that would otherwise be recomputed from a large input), passed to
    /// [`vjp`](Self::vjp) after the side inputs. Empty by default.
    fn saved(&self) -> Vec<Array> {
        Vec::new()
    }

    /// Whether [`forward`](Self::forward) runs compiled by MLX (once per key and input
    /// signature), so that its elementwise runs become fused kernels: for a forward of several
    /// primitives; one that is a single fast kernel gains nothing.
    fn compile_forward(&self) -> bool {
        false
    }

    /// Whether MLX's own transforms take [`vjp`](Self::vjp) as the op's backward on plain
    /// [`Mlx`] ([`crate::grad::value_and_grad`], [`crate::grad::CompiledTrainer`]), instead of
    /// differentiating [`forward`](Self::forward)'s primitives: for an op whose written-out
    /// backward keeps less memory than MLX's product. The forward then runs through mlx-c's
    /// `mlx_custom_vjp`, with the [`saved`](Self::saved) arrays as extra outputs.
    fn vjp_in_mlx_transforms(&self) -> bool {
        false
    }
}

/// MLX's vector-Jacobian product of `f` at `primals` for `cotangent`.
pub(crate) fn mlx_vjp(
    f: impl FnMut(&[Array]) -> Result<Array, mlx_rs::error::Exception>,
    primals: &[Array],
    cotangent: &Array,
) -> Result<Vec<Array>, mlx_rs::error::Exception> {
    let mut f = f;
    mlx_rs::transforms::fallible_vjp(
        |xs: &[Array]| f(xs).map(|y| vec![y]),
        primals,
        std::slice::from_ref(cotangent),
    )
    .map(|(_, grads)| grads)
}

/// A function compiled by MLX: arrays in, arrays out.
type CompiledFn = Box<dyn FnMut(&[Array]) -> Result<Vec<Array>, mlx_rs::error::Exception>>;

thread_local! {
    /// The compiled forward and backward functions, by pass, op key and how the inputs split
    /// (MLX keeps one trace per input signature in each). Burn runs a backward pass on the
    /// thread that calls `backward`.
    static COMPILED: RefCell<HashMap<String, CompiledFn>> = RefCell::new(HashMap::new());
}

/// Calls the compiled function of `key` on `all`, compiling `f` for it on first use.
fn call_compiled(
    key: String,
    all: &[Array],
    f: impl FnMut(&[Array]) -> Result<Vec<Array>, mlx_rs::error::Exception> + 'static,
) -> Result<Vec<Array>, mlx_rs::error::Exception> {
    COMPILED.with(|cell| {
        let mut map = cell.borrow_mut();
        let compiled = map
            .entry(key)
            .or_insert_with(|| Box::new(mlx_rs::transforms::compile::compile(f, false)));
        compiled(all)
    })
}

/// [`FusedOp::forward`] compiled by MLX once per op key and input signature.
fn forward_compiled(
    op: &Arc<dyn FusedOp>,
    inputs: &[Array],
    side: &[Array],
) -> Result<Array, mlx_rs::error::Exception> {
    let mut all: Vec<Array> = inputs.to_vec();
    all.extend(side.iter().cloned());
    let n = inputs.len();
    let key = format!("forward {} ({n} inputs, {} side)", op.key(), side.len());
    let op = op.clone();
    let forward = move |all: &[Array]| {
        let (inputs, side) = all.split_at(n);
        op.forward(inputs, side).map(|y| vec![y])
    };
    call_compiled(key, &all, forward).map(|mut out| out.remove(0))
}

/// The gradients of `op`'s differentiable inputs `primals` for the output's `cotangent`:
/// [`FusedOp::vjp`] (by default MLX's vector-Jacobian product of [`FusedOp::forward`]), compiled
/// by MLX once per op key and input signature so that its elementwise runs become fused kernels.
fn vjp_compiled(
    op: &Arc<dyn FusedOp>,
    primals: &[Array],
    cotangent: &Array,
) -> Result<Vec<Array>, mlx_rs::error::Exception> {
    let mut side = op.side_inputs();
    side.extend(op.saved());
    let mut all: Vec<Array> = primals.to_vec();
    all.extend(side.iter().cloned());
    all.push(cotangent.clone());
    // The split of the inputs is part of the key: an op's saved arrays may be absent.
    let (n, m) = (primals.len(), side.len());
    let key = format!("backward {} ({n} inputs, {m} side)", op.key());
    let op = op.clone();
    let backward = move |all: &[Array]| {
        let (primals, rest) = all.split_at(n);
        let (side, cotangent) = rest.split_at(m);
        op.vjp(primals, side, &cotangent[0])
    };
    call_compiled(key, &all, backward)
}

/// Whether fused ops run on the CPU too (see [`crate::nn::fuse_on_cpu`]).
static FUSE_ON_CPU: AtomicBool = AtomicBool::new(false);

/// Sets whether fused ops run on MLX's CPU device (see [`crate::nn::fuse_on_cpu`]).
pub(crate) fn set_fuse_on_cpu(on: bool) {
    FUSE_ON_CPU.store(on, Ordering::Relaxed);
}

/// Whether a fused op on `device` runs fused.
fn fused_on(device: MlxDevice) -> bool {
    device == MlxDevice::Gpu || FUSE_ON_CPU.load(Ordering::Relaxed)
}

/// Runs `op` on `inputs` when `B` is [`Mlx`] or `Autodiff<Mlx>` (either checkpoint strategy) on
/// a device where fused ops run; otherwise hands the inputs back unchanged. Quantized inputs are
/// handed back too.
pub(crate) fn apply<B: Backend>(
    op: Arc<dyn FusedOp>,
    inputs: Vec<FloatTensor<B>>,
) -> Result<FloatTensor<B>, Vec<FloatTensor<B>>> {
    apply_on::<B>(op, inputs, false)
}

/// [`apply`] on every MLX device, the CPU included whatever [`crate::nn::fuse_on_cpu`] says:
/// for ops that have no composed equivalent on `B` (a product with MLX's packed quantized
/// weights).
pub(crate) fn apply_anywhere<B: Backend>(
    op: Arc<dyn FusedOp>,
    inputs: Vec<FloatTensor<B>>,
) -> Result<FloatTensor<B>, Vec<FloatTensor<B>>> {
    apply_on::<B>(op, inputs, true)
}

fn apply_on<B: Backend>(
    op: Arc<dyn FusedOp>,
    inputs: Vec<FloatTensor<B>>,
    anywhere: bool,
) -> Result<FloatTensor<B>, Vec<FloatTensor<B>>> {
    let Some(device) = inputs.first().and_then(|t| mlx_device::<B>(t)) else {
        return Err(inputs);
    };
    if !anywhere && !fused_on(device) {
        return Err(inputs);
    }
    let id = TypeId::of::<B>();
    if id == TypeId::of::<Mlx>() {
        let tensors: Vec<MlxTensor> = inputs.into_iter().map(cast).collect();
        if tensors.iter().any(|t| t.quant.is_some()) {
            return Err(tensors.into_iter().map(cast).collect());
        }
        return Ok(cast(forward_mlx(&op, &tensors)));
    }
    if id == TypeId::of::<Autodiff<Mlx, NoCheckpointing>>() {
        return Ok(apply_autodiff::<NoCheckpointing, B>(op, inputs));
    }
    Ok(apply_autodiff::<BalancedCheckpointing, B>(op, inputs))
}

/// The device of a float primitive of `B` when `B` is [`Mlx`] or `Autodiff<Mlx>`.
fn mlx_device<B: Backend>(tensor: &FloatTensor<B>) -> Option<MlxDevice> {
    let any: &dyn Any = tensor;
    if let Some(t) = any.downcast_ref::<MlxTensor>() {
        return Some(t.device());
    }
    if let Some(t) = any.downcast_ref::<FloatTensor<Autodiff<Mlx, NoCheckpointing>>>() {
        return Some(t.primitive.device());
    }
    any.downcast_ref::<FloatTensor<Autodiff<Mlx, BalancedCheckpointing>>>()
        .map(|t| t.primitive.device())
}

/// Whether fused ops run for a tensor of backend `B` on `device`: `B` is built on MLX and the
/// device is one where fused ops run.
pub(crate) fn fuses<B: Backend>(device: &B::Device) -> bool {
    if !is_mlx::<B>() {
        return false;
    }
    let any: &dyn Any = device;
    any.downcast_ref::<MlxDevice>()
        .is_some_and(|d| fused_on(*d))
}

/// Whether [`apply`] runs fused ops for backend `B`.
pub(crate) fn is_mlx<B: Backend>() -> bool {
    let id = TypeId::of::<B>();
    id == TypeId::of::<Mlx>()
        || id == TypeId::of::<Autodiff<Mlx, NoCheckpointing>>()
        || id == TypeId::of::<Autodiff<Mlx, BalancedCheckpointing>>()
}

/// `value` as type `T`, which the caller has checked to be its type.
fn cast<T: 'static, U: 'static>(value: T) -> U {
    let boxed: Box<dyn Any> = Box::new(value);
    *boxed
        .downcast::<U>()
        .unwrap_or_else(|_| unreachable!("the caller compared the type ids"))
}

/// The op's output on MLX tensors (all on the first input's device).
fn forward_mlx(op: &Arc<dyn FusedOp>, inputs: &[MlxTensor]) -> MlxTensor {
    let device = inputs[0].device();
    let arrays: Vec<Array> = inputs.iter().map(|t| t.array().clone()).collect();
    let refs: Vec<&Array> = arrays.iter().collect();
    let side = op.side_inputs();
    // While burn-mlx records a trace or an export, the forward goes into it as plain ops (as in
    // `ops::activation::compiled_on_gpu`).
    let compiled =
        op.compile_forward() && !crate::trace::is_tracing() && !crate::trace::is_exporting();
    // An export holds MLX's own primitives only, so there the op's backward is not attached.
    let custom = op.vjp_in_mlx_transforms() && !crate::trace::is_exporting();
    let out = device
        .scope(|| match (custom, compiled) {
            (true, _) => forward_with_vjp(op, &arrays, &side),
            (false, true) => forward_compiled(op, &arrays, &side),
            (false, false) => op.forward(&arrays, &side),
        })
        .or_panic(op.name(), &refs);
    MlxTensor::from_array(out, device)
}

/// [`FusedOp::forward`] with [`FusedOp::vjp`] as its backward inside MLX's transforms. The side
/// inputs go in as inputs (a trace may have made them, and MLX must see them as part of its
/// graph); they get zero gradients. The saved arrays come out as extra outputs, so that the
/// backward receives the ones this call computed.
fn forward_with_vjp(
    op: &Arc<dyn FusedOp>,
    inputs: &[Array],
    side: &[Array],
) -> Result<Array, mlx_rs::error::Exception> {
    let n = inputs.len();
    let mut all: Vec<Array> = inputs.to_vec();
    all.extend(side.iter().cloned());
    let forward_op = op.clone();
    let forward = move |all: &[Array]| {
        let (inputs, side) = all.split_at(n);
        let y = forward_op.forward(inputs, side)?;
        Ok(std::iter::once(y).chain(forward_op.saved()).collect())
    };
    let backward_op = op.clone();
    let backward = move |all: &[Array], cotangents: &[Array], outputs: &[Array]| {
        let (inputs, side) = all.split_at(n);
        let mut side = side.to_vec();
        side.extend(outputs[1..].iter().cloned());
        let mut grads = backward_op.vjp(inputs, &side, &cotangents[0])?;
        for s in &all[n..] {
            grads.push(mlx_rs::ops::zeros_like(s)?);
        }
        Ok(grads)
    };
    let mut out = crate::native::custom_vjp::apply(Box::new(forward), Box::new(backward), &all)?;
    Ok(out.swap_remove(0))
}

/// The op on `Autodiff<Mlx, C>`, whose float primitive `B` is: dispatches on the number of inputs
/// (burn-autodiff's nodes have a fixed number of parents).
fn apply_autodiff<C: CheckpointStrategy, B: Backend>(
    op: Arc<dyn FusedOp>,
    inputs: Vec<FloatTensor<B>>,
) -> FloatTensor<B> {
    let inputs: Vec<FloatTensor<Autodiff<Mlx, C>>> = inputs.into_iter().map(cast).collect();
    let out = match inputs.len() {
        1 => node::<C, 1>(op, inputs),
        2 => node::<C, 2>(op, inputs),
        3 => node::<C, 3>(op, inputs),
        4 => node::<C, 4>(op, inputs),
        5 => node::<C, 5>(op, inputs),
        6 => node::<C, 6>(op, inputs),
        7 => node::<C, 7>(op, inputs),
        n => unreachable!("fused ops take 1 to 7 differentiable inputs, not {n}"),
    };
    cast(out)
}

/// The backward step of a fused op: MLX's vector-Jacobian product of [`FusedOp::forward`] at the
/// saved inputs.
#[derive(Debug)]
struct VjpBackward;

/// What the backward step keeps: the op and its inputs (MLX arrays are reference-counted
/// handles; keeping them is what Burn's own ops do with their saved tensors).
#[derive(Debug, Clone)]
struct VjpState {
    op: Arc<dyn FusedOp>,
    inputs: Vec<MlxTensor>,
}

impl<const N: usize> Backward<Mlx, N> for VjpBackward {
    type State = VjpState;

    fn backward(self, ops: Ops<VjpState, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad: MlxTensor = grads.consume::<Mlx>(&ops.node);
        let VjpState { op, inputs } = ops.state;
        let device = inputs[0].device();
        let primals: Vec<Array> = inputs.iter().map(|t| t.array().clone()).collect();
        let cotangent = grad.array().clone();
        let name = op.name();
        let result = device.scope(|| vjp_compiled(&op, &primals, &cotangent));
        let mut refs: Vec<&Array> = primals.iter().collect();
        refs.push(&cotangent);
        let input_grads = result.or_panic(name, &refs);
        for (parent, g) in ops.parents.iter().zip(input_grads) {
            if let Some(node) = parent {
                grads.register::<Mlx>(node.id, MlxTensor::from_array(g, device));
            }
        }
    }
}

/// One autodiff node of `N` parents computing `op`.
fn node<C: CheckpointStrategy, const N: usize>(
    op: Arc<dyn FusedOp>,
    inputs: Vec<FloatTensor<Autodiff<Mlx, C>>>,
) -> FloatTensor<Autodiff<Mlx, C>> {
    let nodes: [_; N] = std::array::from_fn(|i| inputs[i].node.clone());
    let primitives: Vec<MlxTensor> = inputs.into_iter().map(|t| t.primitive).collect();
    let output = forward_mlx(&op, &primitives);
    match Backward::<Mlx, N>::prepare::<C>(VjpBackward, nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            VjpState {
                op,
                inputs: primitives,
            },
            output,
        ),
        OpsKind::UnTracked(prep) => prep.finish(output),
    }
}

/// The MLX array behind a float primitive of `B` when `B` is [`Mlx`] or `Autodiff<Mlx>`.
pub(crate) fn mlx_array<B: Backend>(tensor: FloatTensor<B>) -> Option<MlxTensor> {
    let id = TypeId::of::<B>();
    if id == TypeId::of::<Mlx>() {
        Some(cast(tensor))
    } else if id == TypeId::of::<Autodiff<Mlx, NoCheckpointing>>() {
        Some(cast::<_, FloatTensor<Autodiff<Mlx, NoCheckpointing>>>(tensor).primitive)
    } else if id == TypeId::of::<Autodiff<Mlx, BalancedCheckpointing>>() {
        Some(cast::<_, FloatTensor<Autodiff<Mlx, BalancedCheckpointing>>>(tensor).primitive)
    } else {
        None
    }
}
