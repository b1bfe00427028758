//! MLX's fused kernels for backend-generic Burn code: [`rms_norm`], [`RotaryEmbedding`],
//! [`swiglu`], [`slice_assign_at`] and [`start_eval`].
//!
//! Burn has no op for RMS normalization or rotary position embeddings, so a model written for any
//! backend composes them from eight to ten tensor ops each. On a GPU, every one of those ops is a
//! kernel launch and, in MLX, a node of the graph that the host walks on every evaluation; in an
//! LLM's decode step, where each op touches a few kilobytes, those launches are the cost. These
//! functions take and return ordinary `Tensor<B, D>`s. When `B` is [`Mlx`] they run MLX's fused
//! kernels (`mlx::fast::rms_norm`, `mlx::fast::rope`: one kernel each); on every other backend,
//! `Autodiff<Mlx>` included, they compose the same computation from Burn's ops, so that one model
//! runs everywhere and is fast on MLX.
//!
//! [`start_eval`] starts computing a tensor without waiting for it (MLX's `async_eval`): a decode
//! loop builds the graph of its next step while the device computes the current one.
//!
//! [`RotaryEmbedding::apply_at`] and [`slice_assign_at`] take a position as a tensor rather than
//! a host integer. A step whose shapes do not change (an LLM's decode step over its whole
//! cache) can then be traced once and replayed at every position with [`crate::compile()`]: a
//! position known only on the host would be baked into the trace.

#[cfg(doc)]
use crate::backend::Mlx;
use crate::device::MlxDevice;
use crate::error::MlxError;
use crate::interop::{from_mlx, to_mlx};
use crate::ops::base::binary;
use crate::tensor::MlxTensor;
use crate::tensor::OrPanic;
use burn_tensor::backend::Backend;
use burn_tensor::{BasicOps, DType, ElementConversion, Int, Tensor, TensorData, TensorKind};
use mlx_rs::fast;

/// The MLX tensor behind a float tensor of backend `B`, when `B` is [`Mlx`] and the tensor is not
/// quantized; otherwise the tensor, unchanged.
pub(crate) fn float_on_mlx<B: Backend, const D: usize>(
    x: Tensor<B, D>,
) -> Result<MlxTensor, Tensor<B, D>> {
    match to_mlx(x) {
        Ok(t) if t.quant.is_some() => Err(from_mlx(t).expect("B is Mlx")),
        other => other,
    }
}

/// A float tensor of backend `B` (which is [`Mlx`]) from an MLX tensor.
pub(crate) fn float_from_mlx<B: Backend, const D: usize>(t: MlxTensor) -> Tensor<B, D> {
    from_mlx(t).unwrap_or_else(|| unreachable!("called only when B is Mlx"))
}

/// Checks that `offset` holds one position (the message names `op`).
fn check_offset<B: Backend>(op: &str, offset: &Tensor<B, 1, Int>) {
    let [n] = offset.dims();
    assert_eq!(
        n, 1,
        "{op}: the offset must hold one position, got a tensor of {n} values"
    );
}

/// Root-mean-square normalization of `x` over its last axis, scaled by `weight` (as long as that
/// axis): `x / sqrt(mean(x²) + eps) · weight`, the normalization of Llama, Qwen and Gemma-style
/// models.
///
/// The mean square and the division are computed in f32 whatever `x`'s dtype; the result has
/// `x`'s dtype. On [`Mlx`] this is MLX's fused `rms_norm` kernel on the GPU (one kernel; it also
/// applies `weight` in f32, before the result is rounded, where Hugging Face's half-precision
/// modules round first: the two differ by at most one rounding of the result), and on the CPU
/// one primitive of burn-mlx's (`mlx-sys/cpu_layers.cpp`, rounding as MLX's composed CPU form
/// does; MLX's CPU runs `fast::rms_norm` as three ops; `BURN_MLX_CPU_KERNELS=0` selects those).
/// Elsewhere it is composed from Burn's ops (eight of them).
///
/// # Panics
///
/// When `weight`'s length is not the size of `x`'s last axis.
///
/// ```
/// use burn_mlx::{fast, Mlx, MlxDevice};
/// use burn_tensor::Tensor;
///
/// let device = MlxDevice::Cpu;
/// let x = Tensor::<Mlx, 2>::from_floats([[3.0, 4.0]], &device);
/// let y = fast::rms_norm(x, Tensor::from_floats([1.0, 2.0], &device), 0.0);
/// // mean(9, 16) = 12.5, so y = [3, 8] / sqrt(12.5).
/// y.into_data().assert_approx_eq::<f32>(
///     &burn_tensor::TensorData::from([[0.8485281, 2.2627417]]),
///     burn_tensor::Tolerance::default(),
/// );
/// ```
pub fn rms_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, D> {
    let [n] = weight.dims();
    let last = x.dims()[D - 1];
    assert_eq!(
        n,
        last,
        "rms_norm: weight has {n} values, x's last axis {last} (x is {:?})",
        x.dims()
    );
    let x = match float_on_mlx(x) {
        Ok(x) => {
            let w = float_on_mlx(weight).unwrap_or_else(|_| unreachable!("same backend as x"));
            let out = binary(x, w, "rms_norm", |x, w| {
                crate::native::cpu_layers::rms_norm(x, w, eps as f32)
            });
            return float_from_mlx(out);
        }
        Err(x) => x,
    };
    let dtype = x.dtype();
    let x32 = if dtype == DType::F32 {
        x
    } else {
        x.cast(DType::F32)
    };
    let mean_square = x32.clone().square().mean_dim(D - 1);
    // A division rather than `recip()`: burn-ndarray's reciprocal is approximate (relative error
    // 5e-5 on an AVX-512 CPU), enough to move an LLM's logits by 1e-4 from run to run.
    let normed = x32 / (mean_square + eps).sqrt();
    let normed = if dtype == DType::F32 {
        normed
    } else {
        normed.cast(dtype)
    };
    normed * weight.unsqueeze::<D>()
}

/// `silu(gate) · up` (elementwise; `silu(x) = x · sigmoid(x)`), the gated activation of Llama-
/// and Qwen-style MLPs, in the inputs' dtype.
///
/// On [`Mlx`] this is one fused kernel: the three elementwise ops compiled by MLX (traced once
/// per thread for every shape, as mlx-lm compiles its `swiglu`), instead of three kernels and two
/// intermediate arrays. Inside a function that is itself being compiled it is the three ops,
/// which that compilation fuses. Elsewhere it is composed from Burn's ops.
///
/// # Panics
///
/// When `gate` and `up` differ in shape.
///
/// ```
/// use burn_mlx::{fast, Mlx, MlxDevice};
/// use burn_tensor::Tensor;
///
/// let device = MlxDevice::Cpu;
/// let gate = Tensor::<Mlx, 1>::from_floats([0.0, 1.0], &device);
/// let up = Tensor::<Mlx, 1>::from_floats([5.0, 2.0], &device);
/// // silu(0) = 0; silu(1) = 1 / (1 + e^-1) = 0.7310586.
/// fast::swiglu(gate, up).into_data().assert_approx_eq::<f32>(
///     &burn_tensor::TensorData::from([0.0, 1.4621172]),
///     burn_tensor::Tolerance::default(),
/// );
/// ```
pub fn swiglu<B: Backend, const D: usize>(gate: Tensor<B, D>, up: Tensor<B, D>) -> Tensor<B, D> {
    check_swiglu_shapes(&gate, &up);
    let gate = match float_on_mlx(gate) {
        Ok(gate) => {
            let up = float_on_mlx(up).unwrap_or_else(|_| unreachable!("same backend as gate"));
            return float_from_mlx(swiglu_mlx(gate, up));
        }
        Err(gate) => gate,
    };
    burn_tensor::activation::silu(gate) * up
}

/// Panics, naming both shapes, unless `gate` and `up` have one shape (for every SwiGLU entry
/// point).
pub(crate) fn check_swiglu_shapes<B: Backend, const D: usize>(
    gate: &Tensor<B, D>,
    up: &Tensor<B, D>,
) {
    assert_eq!(
        gate.dims(),
        up.dims(),
        "swiglu: gate is {:?}, up is {:?}; they must have one shape",
        gate.dims(),
        up.dims()
    );
}

/// [`swiglu`] on MLX tensors.
fn swiglu_mlx(gate: MlxTensor, up: MlxTensor) -> MlxTensor {
    use crate::api::MlxOps;
    let composed = |x: &[MlxTensor]| (&x[0]).mul(&(&x[0]).sigmoid()?).mul(&x[1]);
    if crate::trace::is_tracing() {
        return composed(&[gate.clone(), up.clone()]).or_panic("swiglu", &[&gate.array, &up.array]);
    }
    thread_local! {
        static COMPILED: std::cell::RefCell<Option<crate::compile::function::Compiled>> =
            const { std::cell::RefCell::new(None) };
    }
    COMPILED
        .with(|cell| {
            let mut slot = cell.borrow_mut();
            let compiled = slot.get_or_insert_with(|| {
                crate::compile::function::compile(move |x| Ok(vec![composed(x)?]), true)
            });
            compiled.call(&[gate.clone(), up.clone()])
        })
        .map(|mut out| out.remove(0))
        .or_panic("swiglu", &[&gate.array, &up.array])
}

/// Rotary position embeddings in the "rotate half" layout of Hugging Face's Llama and Qwen
/// models: for a head vector `x` of size `d` at position `p`, element `i < d/2` becomes
/// `x[i]·cos(p·f[i]) − x[i + d/2]·sin(p·f[i])` and element `i + d/2` becomes
/// `x[i + d/2]·cos(p·f[i]) + x[i]·sin(p·f[i])`, with `f` the inverse frequencies (any scaling
/// already applied to them).
///
/// On [`Mlx`]'s GPU, [`apply`](Self::apply) is MLX's fused `rope` kernel (one kernel); on its
/// CPU, one primitive of burn-mlx's (`mlx-sys/cpu_layers.cpp`: MLX's CPU runs `fast::rope` as
/// about a dozen ops that compute the angles again at every call; `BURN_MLX_CPU_KERNELS=0`
/// selects those), with the angles `p·f[i]` computed in f32; elsewhere it is composed from
/// Burn's ops, with the angles computed in f32 as transformers does.
#[derive(Debug, Clone)]
pub struct RotaryEmbedding<B: Backend> {
    /// `f`, `[d/2]`, f32.
    inverse_frequencies: Tensor<B, 1>,
    /// `1/f`, `[d/2]`, f32: what MLX's kernel takes.
    periods: Tensor<B, 1>,
}

impl<B: Backend> RotaryEmbedding<B> {
    /// Rotary embeddings with the given inverse frequencies (`d/2` of them for head size `d`).
    ///
    /// # Panics
    ///
    /// When `inverse_frequencies` is empty or holds a value that is not finite and positive.
    pub fn new(inverse_frequencies: &[f64], device: &B::Device) -> Self {
        assert!(
            !inverse_frequencies.is_empty()
                && inverse_frequencies
                    .iter()
                    .all(|f| f.is_finite() && *f > 0.0),
            "RotaryEmbedding: inverse frequencies must be finite and positive, got {inverse_frequencies:?}"
        );
        let n = inverse_frequencies.len();
        let vector =
            |v: Vec<f32>| Tensor::<B, 1>::from_data(TensorData::new(v, [n]), (device, DType::F32));
        Self {
            inverse_frequencies: vector(inverse_frequencies.iter().map(|&f| f as f32).collect()),
            periods: vector(
                inverse_frequencies
                    .iter()
                    .map(|&f| (1.0 / f) as f32)
                    .collect(),
            ),
        }
    }

    /// The inverse frequencies `f`, `[d/2]`, f32.
    pub(crate) fn inverse_frequencies(&self) -> &Tensor<B, 1> {
        &self.inverse_frequencies
    }

    /// The head size this embedding rotates (twice the number of frequencies).
    pub fn head_dim(&self) -> usize {
        2 * self.inverse_frequencies.dims()[0]
    }

    /// Rotates `x`, `[batch, heads, seq, head_dim]`, whose sequence positions are
    /// `offset..offset + seq`. The result has `x`'s dtype.
    ///
    /// # Panics
    ///
    /// When `x`'s last axis is not [`head_dim`](Self::head_dim).
    pub fn apply(&self, x: Tensor<B, 4>, offset: usize) -> Tensor<B, 4> {
        let [_, _, seq, d] = x.dims();
        self.check_head_dim("apply", &x);
        let x = match float_on_mlx(x) {
            // On the CPU, burn-mlx's RoPE primitive, which takes the position as an array.
            Ok(x) if x.device == MlxDevice::Cpu => {
                let x = float_from_mlx(x);
                let position = Tensor::<B, 1, Int>::from_ints([offset as i32], &x.device());
                return self.apply_at(x, position);
            }
            Ok(x) => {
                let periods = float_on_mlx(self.periods.clone())
                    .unwrap_or_else(|_| unreachable!("same backend as x"));
                let out = binary(x, periods, "rope", |x, periods| {
                    fast::rope(x, d as i32, false, None, 1.0, offset as i32, periods)
                });
                return float_from_mlx(out);
            }
            Err(x) => x,
        };
        // `Autodiff<Mlx>` where fused ops run: MLX's kernel forward, its VJP backward.
        if crate::nn::custom::fuses::<B>(&x.device()) {
            let op = std::sync::Arc::new(RopeOp {
                dims: d as i32,
                offset: offset as i32,
                periods: crate::nn::custom::mlx_array::<B>(
                    self.periods.clone().into_primitive().tensor(),
                )
                .expect("B is built on MLX")
                .array()
                .clone(),
            });
            match crate::nn::custom::apply::<B>(op, vec![x.into_primitive().tensor()]) {
                Ok(out) => return Tensor::from_primitive(burn_tensor::TensorPrimitive::Float(out)),
                Err(mut inputs) => {
                    let x = Tensor::from_primitive(burn_tensor::TensorPrimitive::Float(
                        inputs.pop().expect("one input"),
                    ));
                    let positions = Tensor::<B, 1, Int>::arange(
                        offset as i64..(offset + seq) as i64,
                        &x.device(),
                    );
                    return self.rotate_composed(x, positions);
                }
            }
        }
        let positions =
            Tensor::<B, 1, Int>::arange(offset as i64..(offset + seq) as i64, &x.device());
        self.rotate_composed(x, positions)
    }

    /// [`apply`](Self::apply) with the first position given as a tensor of one integer on `x`'s
    /// device: the position is read by the kernel, not by the host, so a traced step
    /// ([`crate::compile()`]) serves every position. On [`Mlx`] this is MLX's fused `rope` with an
    /// array offset.
    ///
    /// # Panics
    ///
    /// When `x`'s last axis is not [`head_dim`](Self::head_dim), or `offset` does not hold one
    /// value.
    pub fn apply_at(&self, x: Tensor<B, 4>, offset: Tensor<B, 1, Int>) -> Tensor<B, 4> {
        let [_, _, seq, d] = x.dims();
        self.check_head_dim("apply_at", &x);
        check_offset("RotaryEmbedding::apply_at", &offset);
        // Decided by `x`: under `Autodiff<Mlx>` the integer offset is an MLX tensor while the
        // float `x` is not.
        let x = match float_on_mlx(x) {
            Ok(x) => {
                let offset = to_mlx(offset).unwrap_or_else(|_| unreachable!("B is Mlx"));
                let periods = float_on_mlx(self.periods.clone())
                    .unwrap_or_else(|_| unreachable!("same backend as x"));
                // On the CPU, one primitive of burn-mlx's (MLX computes the angles, slices and
                // concatenates in a dozen ops there).
                if x.device == MlxDevice::Cpu {
                    let inverse = float_on_mlx(self.inverse_frequencies.clone())
                        .unwrap_or_else(|_| unreachable!("same backend as x"));
                    let out = x
                        .device
                        .scope(|| {
                            crate::native::cpu_layers::rope(
                                &x.array,
                                &inverse.array,
                                &periods.array,
                                &offset.array,
                            )
                        })
                        .or_panic("rope", &[&x.array, &offset.array]);
                    return float_from_mlx(x.with(out));
                }
                let out = x
                    .device
                    .scope(|| {
                        // A 0-d offset: MLX 0.32.2's CUDA kernel reads a 1-d offset with its
                        // stride per batch entry, even when it holds one value, so batch entries
                        // after the first read past it (found by `tests/module_ops.rs` on an H100).
                        let offset = offset.array.reshape(&[])?;
                        fast::rope_dynamic(
                            &x.array,
                            d as i32,
                            false,
                            None,
                            1.0,
                            &offset,
                            &periods.array,
                        )
                    })
                    .or_panic("rope", &[&x.array, &offset.array]);
                return float_from_mlx(x.with(out));
            }
            Err(x) => x,
        };
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &x.device()) + offset;
        self.rotate_composed(x, positions)
    }

    /// Panics unless `x`'s last axis is the embedding's head size.
    fn check_head_dim(&self, op: &str, x: &Tensor<B, 4>) {
        assert_eq!(
            x.dims()[3],
            self.head_dim(),
            "RotaryEmbedding::{op}: x is {:?}, the embedding rotates heads of {}",
            x.dims(),
            self.head_dim()
        );
    }

    /// The rotation composed from Burn's ops, for the sequence positions `positions` (`[seq]`),
    /// with the angles in f32.
    fn rotate_composed(&self, x: Tensor<B, 4>, positions: Tensor<B, 1, Int>) -> Tensor<B, 4> {
        let [_, _, seq, d] = x.dims();
        let half = d / 2;
        let positions = positions.float().cast(DType::F32).reshape([seq, 1]);
        let angles = positions * self.inverse_frequencies.clone().reshape([1, half]);
        let dtype = x.dtype();
        let table = |t: Tensor<B, 2>| t.cast(dtype).reshape([1, 1, seq, d]);
        let cos = angles.clone().cos();
        let sin = angles.sin();
        let cos = table(Tensor::cat(vec![cos.clone(), cos], 1));
        let sin = table(Tensor::cat(vec![sin.clone().neg(), sin], 1));
        let swapped = Tensor::cat(
            vec![
                x.clone().narrow(3, half, half),
                x.clone().narrow(3, 0, half),
            ],
            3,
        );
        x * cos + swapped * sin
    }
}

/// [`RotaryEmbedding::apply`] as one differentiable op on `Autodiff<Mlx>`: MLX's `rope`
/// kernel forward and its vector-Jacobian product (the inverse rotation) backward, instead of
/// the dozen composed ops and their backward.
#[derive(Debug)]
struct RopeOp {
    dims: i32,
    offset: i32,
    /// `1/f`, `[d/2]`, f32.
    periods: mlx_rs::Array,
}

// SAFETY: an MLX array is a reference-counted handle to immutable data, only read here (as the
// other fused ops do with their side inputs).
unsafe impl Send for RopeOp {}
unsafe impl Sync for RopeOp {}

impl crate::nn::custom::FusedOp for RopeOp {
    fn name(&self) -> &'static str {
        "rope"
    }

    fn key(&self) -> String {
        format!("rope dims={} offset={}", self.dims, self.offset)
    }

    fn side_inputs(&self) -> Vec<mlx_rs::Array> {
        vec![self.periods.clone()]
    }

    fn forward(
        &self,
        xs: &[mlx_rs::Array],
        side: &[mlx_rs::Array],
    ) -> Result<mlx_rs::Array, mlx_rs::error::Exception> {
        fast::rope(&xs[0], self.dims, false, None, 1.0, self.offset, &side[0])
    }
}

/// `target` with `update` written along `axis` at positions `offset..offset + len` (`len` being
/// `update`'s size on that axis; every other axis of the two must match), where `offset` is a
/// tensor of one integer on the device: the write of a key/value cache in a step that is traced
/// once and replayed at every position ([`crate::compile()`]).
///
/// On [`Mlx`] this is one MLX op (a slice update whose start is read on the device); when
/// `target` is the only reference to its buffer, MLX writes in place. MLX's op does not check
/// the offset, so it is clamped on the device first: an offset that would write past the end
/// writes the update at the end of `target` instead (the caller, which knows how full its
/// cache is, checks that on the host). On other backends the offset is read back to the host
/// and checked (it panics when the update does not fit), and the write is Burn's
/// `slice_assign`.
///
/// # Panics
///
/// When the shapes do not fit (see above), `axis` is out of range, or `offset` does not hold one
/// value.
///
/// ```
/// use burn_mlx::{fast, Mlx, MlxDevice};
/// use burn_tensor::{Int, Tensor};
///
/// let device = MlxDevice::Cpu;
/// let cache = Tensor::<Mlx, 2>::zeros([2, 4], &device);
/// let new = Tensor::<Mlx, 2>::ones([2, 1], &device);
/// let at = Tensor::<Mlx, 1, Int>::from_ints([2], &device);
/// let cache = fast::slice_assign_at(cache, new, 1, at);
/// assert_eq!(
///     cache.into_data().to_vec::<f32>().unwrap(),
///     [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
/// );
/// ```
pub fn slice_assign_at<B: Backend, const D: usize>(
    target: Tensor<B, D>,
    update: Tensor<B, D>,
    axis: usize,
    offset: Tensor<B, 1, Int>,
) -> Tensor<B, D> {
    let (t, u) = (target.dims(), update.dims());
    let fits = axis < D
        && (0..D).all(|i| {
            if i == axis {
                u[i] <= t[i]
            } else {
                u[i] == t[i]
            }
        });
    assert!(
        fits,
        "slice_assign_at: cannot write an update of shape {u:?} into {t:?} along axis {axis} \
         (every other axis must match, and the update must be no longer than the target)"
    );
    check_offset("slice_assign_at", &offset);
    // Decided by `target`, as in `RotaryEmbedding::apply_at`.
    let target = match float_on_mlx(target) {
        Ok(target) => {
            let offset = to_mlx(offset).unwrap_or_else(|_| unreachable!("B is Mlx"));
            let update = float_on_mlx(update).unwrap_or_else(|_| unreachable!("same backend"));
            let out = target
                .device
                .scope(|| -> Result<_, MlxError> {
                    let update =
                        crate::ops::base::cast_array(update.array.clone(), target.array.dtype())
                            .map_err(|e| MlxError::mlx("slice_assign_at", e))?;
                    let last = (t[axis] - u[axis]) as i32;
                    let start = mlx_rs::ops::clip(&offset.array, (0i32, last))
                        .map_err(|e| MlxError::mlx("slice_assign_at", e))?;
                    crate::native::slice_update_dynamic(
                        &target.array,
                        &update,
                        &start,
                        &[axis as i32],
                    )
                })
                .or_panic(
                    "slice_assign_at",
                    &[&target.array, &update.array, &offset.array],
                );
            return float_from_mlx(target.with(out));
        }
        Err(target) => target,
    };
    let start = offset.into_scalar().elem::<i64>();
    let len = u[axis];
    assert!(
        start >= 0 && start as usize + len <= t[axis],
        "slice_assign_at: offset {start} + {len} positions run past axis {axis} of {t:?}"
    );
    let ranges: [std::ops::Range<usize>; D] = std::array::from_fn(|i| {
        if i == axis {
            start as usize..start as usize + len
        } else {
            0..t[i]
        }
    });
    target.slice_assign(ranges, update)
}

/// Starts computing `tensor` on its device and returns without waiting (MLX's `async_eval`).
/// Reading the tensor later waits only for what is not finished yet. On backends other than
/// [`Mlx`] this does nothing (their reads compute what they need).
///
/// A decode loop uses it to keep the device busy while the host builds the next step: build the
/// step whose input is the token tensor just produced, start it, then read that token. The read
/// waits for the token's own step only, not for the step started after it (a row-major tensor
/// is read in place, without a new op that MLX would queue behind the later work).
///
/// # Errors
///
/// When MLX fails to schedule the computation (see [`MlxTensor::start_eval`]).
pub fn start_eval<B: Backend, const D: usize, K: TensorKind<B> + BasicOps<B>>(
    tensor: &Tensor<B, D, K>,
) -> Result<(), MlxError>
where
    K::Primitive: 'static,
{
    let mlx = to_mlx(tensor.clone()).ok();
    match mlx {
        Some(t) => t.start_eval(),
        None => Ok(()),
    }
}
