//! The fused ops behind [`crate::nn`]'s layers, as functions of Burn tensors for any backend.
//!
//! On [`Mlx`](crate::Mlx) and `Autodiff<Mlx>` on the GPU (and on the CPU after
//! [`fuse_on_cpu`](super::fuse_on_cpu)) each function is one MLX op forward (a fast kernel
//! where MLX has one) and, under autodiff, one compiled vector-Jacobian product backward (see
//! the [module docs](super)). On every other backend it is composed from Burn's ops exactly as
//! burn-nn's layer composes it, so a model gives the same results everywhere.

use super::custom::{self, FusedOp};
use crate::tensor::{constant_scalar_array, MlxTensor, OrPanic};
use burn_backend::Scalar;
use burn_tensor::activation::{log_softmax, softmax};
use burn_tensor::backend::Backend;
use burn_tensor::{Bool, DType, Int, Tensor, TensorPrimitive};
use mlx_rs::error::Exception;
use mlx_rs::{fast, ops, Array};
use std::sync::Arc;

/// `tensor`'s float primitive.
pub(super) fn prim<B: Backend, const D: usize>(
    tensor: Tensor<B, D>,
) -> burn_backend::tensor::FloatTensor<B> {
    tensor.into_primitive().tensor()
}

/// A float tensor of rank `D` from a primitive.
pub(super) fn wrap<B: Backend, const D: usize>(
    p: burn_backend::tensor::FloatTensor<B>,
) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// A non-float tensor of `B` (the Bool or Int primitive of `Mlx` or `Autodiff<Mlx>`, which is
/// the same `MlxTensor`) as an MLX tensor. `None` when `B` is not built on MLX.
fn side_input<B: Backend, const D: usize, K>(tensor: Tensor<B, D, K>) -> Option<MlxTensor>
where
    K: burn_tensor::TensorKind<B> + burn_tensor::BasicOps<B>,
    K::Primitive: 'static,
{
    let boxed: Box<dyn std::any::Any> = Box::new(tensor.into_primitive());
    boxed.downcast::<MlxTensor>().ok().map(|t| *t)
}

/// Layer normalization over the last axis, `(x - mean) / sqrt(var + epsilon) · gamma + beta`
/// with the biased variance: burn-nn's `LayerNorm`.
///
/// On MLX, `mlx::fast::layer_norm` forward and its compiled vector-Jacobian product backward.
///
/// # Panics
///
/// When `gamma` (or `beta`) is not as long as `x`'s last axis.
pub fn layer_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Option<Tensor<B, 1>>,
    epsilon: f64,
) -> Tensor<B, D> {
    let d = x.dims()[D - 1];
    for (name, p) in [("gamma", Some(&gamma)), ("beta", beta.as_ref())] {
        if let Some(p) = p {
            assert_eq!(
                p.dims()[0],
                d,
                "layer_norm: {name} has {} values for an input of shape {:?} (it must be as long \
                 as the last axis)",
                p.dims()[0],
                x.dims()
            );
        }
    }
    let op = Arc::new(LayerNormOp {
        epsilon: epsilon as f32,
        bias: beta.is_some(),
    });
    let mut inputs = vec![prim(x), prim(gamma)];
    inputs.extend(beta.map(prim));
    match custom::apply::<B>(op, inputs) {
        Ok(out) => wrap(out),
        Err(mut inputs) => {
            let beta = (inputs.len() == 3).then(|| inputs.pop().expect("three inputs"));
            let gamma = inputs.pop().expect("gamma");
            let x = inputs.pop().expect("x");
            wrap(B::layer_norm(x, gamma, beta, epsilon))
        }
    }
}

#[derive(Debug)]
struct LayerNormOp {
    epsilon: f32,
    bias: bool,
}

impl FusedOp for LayerNormOp {
    fn name(&self) -> &'static str {
        "layer_norm"
    }

    fn key(&self) -> String {
        format!("layer_norm eps={} bias={}", self.epsilon, self.bias)
    }

    fn forward(&self, xs: &[Array], _: &[Array]) -> Result<Array, Exception> {
        let beta = if self.bias { Some(&xs[2]) } else { None };
        fast::layer_norm(&xs[0], Some(&xs[1]), beta, self.epsilon)
    }

    /// `x`'s gradient is MLX's product for the normalization alone (no weight, no bias) at
    /// `g · gamma`; `gamma`'s and `beta`'s are [`column_sum`]s of `g · x̂` and `g`. MLX's own
    /// product with a weight sums those columns in its CUDA kernel on too few thread blocks.
    /// On MLX's CUDA device, f32 rows of up to 512 values take one custom kernel for all three
    /// ([`norm_cuda`](super::norm_cuda)).
    fn vjp(&self, xs: &[Array], _: &[Array], g: &Array) -> Result<Vec<Array>, Exception> {
        let eps = self.epsilon;
        let (x, gamma) = (&xs[0], &xs[1]);
        let f32s = [x, g, gamma]
            .iter()
            .all(|a| a.dtype() == mlx_rs::Dtype::Float32);
        let d = x.shape().last().copied().unwrap_or(0);
        if f32s
            && d <= super::norm_cuda::MAX_D
            && super::norm_cuda::enabled()
            && crate::native::kernel::default_stream_on_cuda()
        {
            let [dx, dgamma, dbeta] = super::norm_cuda::layer_norm_backward(x, g, gamma, eps)?;
            let mut grads = vec![dx, dgamma];
            if self.bias {
                grads.push(dbeta.as_dtype(xs[2].dtype())?);
            }
            return Ok(grads);
        }
        let normalize = |v: &[Array]| fast::layer_norm(&v[0], None, None, eps);
        let gx = custom::mlx_vjp(normalize, std::slice::from_ref(x), &g.multiply(gamma)?)?;
        let normed = fast::layer_norm(x, None, None, eps)?;
        let mut grads = vec![
            gx.into_iter().next().expect("one gradient"),
            column_sum(&g.multiply(&normed)?, gamma.dtype())?,
        ];
        if self.bias {
            grads.push(column_sum(g, xs[2].dtype())?);
        }
        Ok(grads)
    }
}

/// `a` `[…, d]` summed over every axis but the last, in two passes where MLX's one column
/// reduction would use too few thread blocks, as a `[d]` array of `dtype`: the gradient of a
/// normalization's weight or bias.
pub(super) fn column_sum(a: &Array, dtype: mlx_rs::Dtype) -> Result<Array, Exception> {
    // In f32 throughout, rounded to `dtype` once (a half-precision `a` would otherwise be
    // rounded to its own dtype first).
    crate::ops::base::sum_leading_axes(&a.as_dtype(mlx_rs::Dtype::Float32)?, true)?.as_dtype(dtype)
}

/// Root-mean-square normalization over the last axis, `x / sqrt(mean(x²) + epsilon) · gamma`,
/// with the mean square in f32: burn-nn's `RmsNorm`.
///
/// On MLX, `mlx::fast::rms_norm` forward and its compiled vector-Jacobian product backward.
///
/// # Panics
///
/// When `gamma` is not as long as `x`'s last axis.
pub fn rms_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    epsilon: f64,
) -> Tensor<B, D> {
    assert_eq!(
        gamma.dims()[0],
        x.dims()[D - 1],
        "rms_norm: gamma has {} values for an input of shape {:?} (it must be as long as the \
         last axis)",
        gamma.dims()[0],
        x.dims()
    );
    let op = Arc::new(RmsNormOp {
        epsilon: epsilon as f32,
    });
    match custom::apply::<B>(op, vec![prim(x), prim(gamma)]) {
        Ok(out) => wrap(out),
        Err(mut inputs) => {
            let gamma: Tensor<B, 1> = wrap(inputs.pop().expect("gamma"));
            let x: Tensor<B, D> = wrap(inputs.pop().expect("x"));
            let dtype = x.dtype();
            let rms = (x.clone().cast(DType::F32).square().mean_dim(D - 1) + epsilon).sqrt();
            (x / rms.cast(dtype)) * gamma.unsqueeze()
        }
    }
}

#[derive(Debug)]
struct RmsNormOp {
    epsilon: f32,
}

impl FusedOp for RmsNormOp {
    fn name(&self) -> &'static str {
        "rms_norm"
    }

    fn key(&self) -> String {
        format!("rms_norm eps={}", self.epsilon)
    }

    fn forward(&self, xs: &[Array], _: &[Array]) -> Result<Array, Exception> {
        fast::rms_norm(&xs[0], Some(&xs[1]), self.epsilon)
    }

    /// As [`LayerNormOp`]'s: MLX's product for the normalization alone at `g · gamma`, and a
    /// [`column_sum`] for `gamma`.
    fn vjp(&self, xs: &[Array], _: &[Array], g: &Array) -> Result<Vec<Array>, Exception> {
        let eps = self.epsilon;
        let (x, gamma) = (&xs[0], &xs[1]);
        let normalize = |v: &[Array]| fast::rms_norm(&v[0], None, eps);
        let gx = custom::mlx_vjp(normalize, std::slice::from_ref(x), &g.multiply(gamma)?)?;
        let normed = fast::rms_norm(x, None, eps)?;
        Ok(vec![
            gx.into_iter().next().expect("one gradient"),
            column_sum(&g.multiply(&normed)?, gamma.dtype())?,
        ])
    }
}

/// GELU, `x · (1 + erf(x / √2)) / 2`, with Burn's gradient (the derivative of the tanh
/// approximation, which every Burn backend computes): burn-nn's `Gelu`.
///
/// On MLX on the GPU, one MLX-compiled function forward and its compiled gradient backward, one
/// fused kernel each, where Burn's ops make five and twelve. Burn's own `gelu` on `Mlx` stays
/// composed so that graphs of Burn's ops stay open to the automatic fusion pass; this op is for
/// graphs that hold fused ops already (burn-mlx's [`TransformerEncoder`](super::TransformerEncoder)
/// uses it for a GELU feed-forward network).
pub fn gelu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let any: &dyn std::any::Any = &x.device();
    let gpu = any.downcast_ref::<crate::MlxDevice>() == Some(&crate::MlxDevice::Gpu);
    match custom::apply::<B>(Arc::new(GeluOp { gpu }), vec![prim(x)]) {
        Ok(out) => wrap(out),
        Err(mut inputs) => burn_tensor::activation::gelu(wrap(inputs.pop().expect("x"))),
    }
}

#[derive(Debug)]
struct GeluOp {
    /// Whether the input is on MLX's GPU (where the forward pass is compiled).
    gpu: bool,
}

impl FusedOp for GeluOp {
    fn name(&self) -> &'static str {
        "gelu"
    }

    fn key(&self) -> String {
        "gelu".to_string()
    }

    fn forward(&self, xs: &[Array], _: &[Array]) -> Result<Array, Exception> {
        crate::ops::activation::compiled_on_gpu("gelu", xs, self.gpu, crate::ops::activation::gelu)
    }

    /// Burn's gradient, as `Mlx`'s `gelu_backward` computes it.
    fn vjp(&self, xs: &[Array], _: &[Array], g: &Array) -> Result<Vec<Array>, Exception> {
        Ok(vec![crate::ops::activation::gelu_backward(&[
            xs[0].clone(),
            g.clone(),
        ])?])
    }
}

/// SwiGLU, `silu(gate) · up = gate · sigmoid(gate) · up`, elementwise over tensors of one shape:
/// the gated activation of Llama-family MLPs.
///
/// On `Autodiff<Mlx>` (where fused ops run) this is one autodiff node: one compiled kernel
/// forward on the GPU, and one compiled backward, `dgate = g · up · s · (1 + gate · (1 - s))` and `dup = g · gate · s`
/// with `s = sigmoid(gate)`, keeping only `gate` and `up` for it, where Burn's ops record three
/// nodes and keep four `[rows, intermediate]` tensors. Elsewhere (`Mlx` itself included) it is
/// [`crate::fast::swiglu`].
///
/// # Panics
///
/// When `gate` and `up` differ in shape.
pub fn swiglu<B: Backend, const D: usize>(gate: Tensor<B, D>, up: Tensor<B, D>) -> Tensor<B, D> {
    crate::fast::check_swiglu_shapes(&gate, &up);
    if std::any::TypeId::of::<B>() == std::any::TypeId::of::<crate::Mlx>() {
        // No autodiff: MLX's compiled kernel as it is, shape-agnostic.
        return crate::fast::swiglu(gate, up);
    }
    let any: &dyn std::any::Any = &gate.device();
    let gpu = any.downcast_ref::<crate::MlxDevice>() == Some(&crate::MlxDevice::Gpu);
    match custom::apply::<B>(Arc::new(SwigluOp { gpu }), vec![prim(gate), prim(up)]) {
        Ok(out) => wrap(out),
        Err(mut inputs) => {
            let up = wrap(inputs.pop().expect("up"));
            crate::fast::swiglu(wrap(inputs.pop().expect("gate")), up)
        }
    }
}

#[derive(Debug)]
struct SwigluOp {
    /// Whether the inputs are on MLX's GPU (where the forward pass is compiled).
    gpu: bool,
}

impl FusedOp for SwigluOp {
    fn name(&self) -> &'static str {
        "swiglu"
    }

    fn key(&self) -> String {
        "swiglu".to_string()
    }

    fn forward(&self, xs: &[Array], _: &[Array]) -> Result<Array, Exception> {
        use crate::ops::activation::{compiled_on_gpu, swiglu};
        compiled_on_gpu("swiglu", xs, self.gpu, swiglu)
    }

    fn vjp(&self, xs: &[Array], _: &[Array], g: &Array) -> Result<Vec<Array>, Exception> {
        let (gate, up) = (&xs[0], &xs[1]);
        let s = ops::sigmoid(gate)?;
        let one = constant_scalar_array(Scalar::Float(1.0), gate.dtype());
        let dsilu = s.multiply(one.add(gate.multiply(one.subtract(&s)?)?)?)?;
        let dgate = g.multiply(up)?.multiply(&dsilu)?;
        let dup = g.multiply(gate.multiply(&s)?)?;
        Ok(vec![dgate, dup])
    }
}

/// Scaled dot-product attention, `softmax(q kᵀ · scale, masked) v`, over `[batch, heads, seq,
/// head_dim]` tensors; `k` and `v` may have fewer heads than `q` (grouped-query attention) when
/// their head count divides `q`'s.
///
/// `mask` (true = masked), broadcastable to `[batch, heads, seq_q, seq_k]`, sets the masked
/// scores to `min_float` before the softmax, as burn-nn's `MultiHeadAttention` does (it uses
/// -1e4). On MLX this is `mlx::fast::scaled_dot_product_attention` forward (MLX's fused kernel
/// where the device has one for these shapes) and its compiled vector-Jacobian product
/// backward, with the mask added to the scores: a row whose every key is masked therefore
/// attends as if unmasked instead of uniformly, the one case where the two differ.
///
/// # Panics
///
/// When the shapes do not fit together (the message gives them).
pub fn attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Option<Tensor<B, 4, Bool>>,
    scale: f64,
    min_float: f64,
) -> Tensor<B, 4> {
    let [b, h, _, d] = q.dims();
    let [bk, hk, lk, dk] = k.dims();
    let [bv, hv, lv, _] = v.dims();
    assert!(
        bk == b && bv == b && hk == hv && hk > 0 && h % hk == 0 && dk == d && lv == lk,
        "attention: q {:?}, k {:?} and v {:?} do not fit ([batch, heads, seq, head_dim], with \
         k's and v's head count dividing q's)",
        q.dims(),
        k.dims(),
        v.dims()
    );
    if custom::fuses::<B>(&q.device()) {
        // The additive mask in q's dtype, made once per call (the forward pass and the
        // backward's trace take it as it is).
        let dtype = crate::dtype::to_mlx(q.dtype());
        let additive = mask
            .clone()
            .map(|m| additive_mask_of(m, min_float, dtype, "attention (mask)"));
        let op = AttentionOp::new(scale, additive, false, &q, &k);
        if let Some(out) = op.apply(&q, &k, &v) {
            return out;
        }
    }
    let groups = h / hk;
    let (k, v) = if groups > 1 {
        let expand = |t: Tensor<B, 4>| {
            let [b, hk, l, d] = t.dims();
            t.reshape([b, hk, 1, l, d])
                .expand([b, hk, groups, l, d])
                .reshape([b, hk * groups, l, d])
        };
        (expand(k), expand(v))
    } else {
        (k, v)
    };
    let mut scores = q.matmul(k.transpose()).mul_scalar(scale);
    if let Some(mask) = mask {
        scores = scores.mask_fill(mask, min_float);
    }
    softmax(scores, 3).matmul(v)
}

/// Causal scaled dot-product attention, `softmax(q kᵀ · scale) v` with each query attending to
/// its own position and the keys before it (the last `seq_q` keys are the queries' positions),
/// over `[batch, heads, seq, head_dim]` tensors; `k` and `v` may have fewer heads than `q` (as in
/// [`attention`]).
///
/// The same as [`attention`] with a mask hiding the later keys, without the mask: on MLX this is
/// `mlx::fast::scaled_dot_product_attention` in its causal mode, so MLX's fused kernels (cuDNN's
/// on NVIDIA GPUs, forward and backward) skip the hidden half of the scores and read no mask
/// array. Elsewhere it is [`attention`] with the mask built here.
///
/// # Panics
///
/// When the shapes do not fit together (the message gives them), or `q` has more positions than
/// `k`.
pub fn causal_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    scale: f64,
) -> Tensor<B, 4> {
    let [_, _, sq, _] = q.dims();
    let [_, _, sk, _] = k.dims();
    assert!(
        sq <= sk,
        "causal_attention: {sq} queries over {sk} keys (the queries must be the last of the keys' \
         positions); q {:?}, k {:?}",
        q.dims(),
        k.dims()
    );
    if custom::fuses::<B>(&q.device()) {
        let op = AttentionOp::new(scale, None, true, &q, &k);
        if let Some(out) = op.apply(&q, &k, &v) {
            return out;
        }
    }
    let device = q.device();
    let queries =
        Tensor::<B, 1, Int>::arange((sk - sq) as i64..sk as i64, &device).reshape([sq, 1]);
    let keys = Tensor::<B, 1, Int>::arange(0..sk as i64, &device).reshape([1, sk]);
    let later = keys.greater(queries).reshape([1, 1, sq, sk]);
    attention(q, k, v, Some(later), scale, f64::from(f32::MIN))
}

/// The additive causal mask `[sq, sk]` in `dtype`: 0 where key `j` is at or before query `i`'s
/// position (`j <= i + sk - sq`), the dtype's lowest value after it.
fn causal_bias(sq: i32, sk: i32, dtype: mlx_rs::Dtype) -> Result<Array, Exception> {
    let queries = Array::arange::<_, i32>(sk - sq, sk, None)?.reshape(&[sq, 1])?;
    let keys = Array::arange::<_, i32>(None, sk, None)?.reshape(&[1, sk])?;
    additive_mask(&keys.gt(&queries)?, f64::from(f32::MIN), dtype)
}

/// The attention probabilities `softmax(q·scale·kᵀ + mask)` from MLX ops, with the additive
/// `mask` where given and the causal bias when `causal`, and the scale as a 0-d array of q's
/// dtype.
pub(super) fn probabilities(
    q: &Array,
    k: &Array,
    mask: Option<&Array>,
    causal: bool,
    scale: f32,
) -> Result<(Array, Array), Exception> {
    let scale = constant_scalar_array(Scalar::Float(scale as f64), q.dtype());
    let mut scores = q.multiply(&scale)?.matmul(&k.swap_axes(-1, -2)?)?;
    if let Some(mask) = mask {
        scores = scores.add(mask)?;
    }
    if causal {
        scores = scores.add(causal_bias(q.shape()[2], k.shape()[2], q.dtype())?)?;
    }
    Ok((ops::softmax_axis(&scores, -1, true)?, scale))
}

/// A boolean mask tensor of a backend built on MLX as an additive MLX tensor in `dtype`
/// ([`additive_mask`]); `op` names the caller in errors.
pub(super) fn additive_mask_of<B: Backend, const D: usize>(
    mask: Tensor<B, D, Bool>,
    fill: f64,
    dtype: mlx_rs::Dtype,
    op: &str,
) -> MlxTensor {
    let m = side_input(mask).expect("B is built on MLX");
    let device = m.device();
    let additive = device
        .scope(|| additive_mask(m.array(), fill, dtype))
        .or_panic(op, &[m.array()]);
    MlxTensor::from_array(additive, device)
}

/// A boolean mask (true = hidden) as an additive one in `dtype`: `fill` where hidden, else 0.
fn additive_mask(hidden: &Array, fill: f64, dtype: mlx_rs::Dtype) -> Result<Array, Exception> {
    let fill = constant_scalar_array(Scalar::Float(fill), dtype);
    let zero = constant_scalar_array(Scalar::Float(0.0), dtype);
    ops::select(hidden, &fill, &zero)
}

#[derive(Debug)]
struct AttentionOp {
    scale: f32,
    /// The additive mask (0 or `min_float`), in the queries' dtype.
    mask: Option<MlxTensor>,
    /// Causal attention with no mask array (MLX's causal mode).
    causal: bool,
    /// The forward pass forms the probabilities with MLX ops and keeps them, with its output,
    /// for the backward pass (see [`keeps_probabilities`]).
    keep: bool,
    /// The probabilities `[batch, heads, seq_q, seq_k]` and the output, kept by the forward pass.
    kept: std::sync::Mutex<Option<[Array; 2]>>,
}

// SAFETY: MLX arrays are reference-counted handles to immutable data; the kept arrays are only
// read and replaced under their mutex.
unsafe impl Send for AttentionOp {}
unsafe impl Sync for AttentionOp {}

/// The most probabilities (`batch · heads · seq_q · seq_k`) an attention call keeps from its
/// forward pass for its backward: 2^26, 256 MB in f32. Larger calls recompute them.
const KEPT_PROBABILITIES_MAX: usize = 1 << 26;

/// Whether an attention call over `q` and `k` forms its probabilities with MLX ops and keeps
/// them, and its output, for the backward pass, which then needs neither the scores' GEMM, the
/// mask, the softmax nor the output's GEMM again: on a backend that records gradients (without
/// one, MLX's own attention runs, with its fused kernel for a single query on CUDA), in f32
/// with as many key heads as query heads
/// (the written-out backward of [`AttentionOp::vjp`]), where MLX computes f32 attention from its
/// own ops anyway (its CPU and CUDA devices; Metal has a fused f32 kernel), and for at most
/// [`KEPT_PROBABILITIES_MAX`] probabilities. On an H200 the decoder LM of `train_bench` at batch
/// 32 (six layers, 8 heads, sequence 256: 67 MB a layer) ran about 1.3 ms of its 17 ms of
/// kernels in the recomputation. `BURN_MLX_ATTENTION_KEEP=0` recomputes always (A/B runs).
fn keeps_probabilities<B: Backend>(q: &Tensor<B, 4>, k: &Tensor<B, 4>) -> bool {
    let [b, h, sq, _] = q.dims();
    let [_, hk, sk, _] = k.dims();
    h == hk && keeps_probabilities_of::<B>(&q.device(), q.dtype(), b * h * sq * sk)
}

/// [`keeps_probabilities`] for attention on `device` in `dtype` with as many key heads as query
/// heads, over `probabilities` (`batch · heads · seq_q · seq_k`).
pub(super) fn keeps_probabilities_of<B: Backend>(
    device: &B::Device,
    dtype: DType,
    probabilities: usize,
) -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *OFF.get_or_init(|| std::env::var("BURN_MLX_ATTENTION_KEEP").as_deref() == Ok("0")) {
        return false;
    }
    let any: &dyn std::any::Any = device;
    let metal = cfg!(target_os = "macos")
        && any.downcast_ref::<crate::MlxDevice>() == Some(&crate::MlxDevice::Gpu);
    B::ad_enabled(device)
        && !metal
        && dtype == DType::F32
        && probabilities <= KEPT_PROBABILITIES_MAX
}

impl AttentionOp {
    /// The op of one attention call over `q` and `k`.
    fn new<B: Backend>(
        scale: f64,
        mask: Option<MlxTensor>,
        causal: bool,
        q: &Tensor<B, 4>,
        k: &Tensor<B, 4>,
    ) -> Self {
        Self {
            scale: scale as f32,
            mask,
            causal,
            keep: keeps_probabilities(q, k),
            kept: std::sync::Mutex::new(None),
        }
    }

    /// The attention probabilities `softmax(q·scale·kᵀ + mask)` from MLX ops, with the mask
    /// (`mask`, the additive mask or none) and the causal bias where the op has them, and the
    /// scale as an array of q's dtype.
    fn probabilities(
        &self,
        q: &Array,
        k: &Array,
        mask: Option<&Array>,
    ) -> Result<(Array, Array), Exception> {
        probabilities(q, k, mask, self.causal, self.scale)
    }

    /// The op on `q`, `k`, `v` where fused ops run (`None` elsewhere).
    fn apply<B: Backend>(
        self,
        q: &Tensor<B, 4>,
        k: &Tensor<B, 4>,
        v: &Tensor<B, 4>,
    ) -> Option<Tensor<B, 4>> {
        let inputs = vec![prim(q.clone()), prim(k.clone()), prim(v.clone())];
        custom::apply::<B>(Arc::new(self), inputs).ok().map(wrap)
    }
}

impl FusedOp for AttentionOp {
    fn name(&self) -> &'static str {
        "attention"
    }

    fn key(&self) -> String {
        format!(
            "attention scale={} mask={} causal={}",
            self.scale,
            self.mask.is_some(),
            self.causal
        )
    }

    fn side_inputs(&self) -> Vec<Array> {
        self.mask.iter().map(|m| m.array().clone()).collect()
    }

    fn forward(&self, xs: &[Array], side: &[Array]) -> Result<Array, Exception> {
        if self.keep {
            let (p, _) = self.probabilities(&xs[0], &xs[1], side.first())?;
            let o = p.matmul(&xs[2])?;
            if let Ok(mut kept) = self.kept.lock() {
                *kept = Some([p, o.clone()]);
            }
            return Ok(o);
        }
        let mask = match self.causal {
            true => Some(fast::ScaledDotProductAttentionMask::Causal),
            false => side.first().map(fast::ScaledDotProductAttentionMask::Array),
        };
        fast::scaled_dot_product_attention(&xs[0], &xs[1], &xs[2], self.scale, mask, None)
    }

    fn saved(&self) -> Vec<Array> {
        let kept = self.kept.lock().ok().and_then(|k| k.clone());
        kept.map(Vec::from).unwrap_or_default()
    }

    /// For as many key heads as query heads: the gradients from the probabilities `p` and the
    /// output `o`, kept by the forward pass or recomputed (two GEMMs and a softmax), `dv = pᵀ·g`,
    /// `dp = g·vᵀ`, `ds = p·(dp - rowsum(g·o))`, `dq = ds·k·scale`, `dk = dsᵀ·q·scale`: at most
    /// three elementwise passes over the `[batch, heads, seq, seq]` scores (the mask, the
    /// softmax, `ds`; one when the probabilities are kept), in place of MLX's product of its
    /// composed attention (MLX 0.32's CUDA attention kernels take no f32 and no gradient), which
    /// also differentiates the scaling and the mask. Grouped-query attention, and half precision in
    /// the shapes of MLX's cuDNN attention (query length a multiple of 128, head size a multiple of
    /// 8 up to 128: a fused backward of its own), keep MLX's product.
    fn vjp(&self, xs: &[Array], side: &[Array], g: &Array) -> Result<Vec<Array>, Exception> {
        let (q, k, v) = (&xs[0], &xs[1], &xs[2]);
        // `side`: the additive mask where the op has one, then the kept arrays where it has them.
        let masks = self.mask.is_some() as usize;
        let mask = side[..masks].first();
        let (p, o, scale) = match &side[masks..] {
            [p, o] => {
                let scale = constant_scalar_array(Scalar::Float(self.scale as f64), q.dtype());
                (p.clone(), o.clone(), scale)
            }
            _ => {
                let shape = q.shape();
                let fused_half =
                    matches!(q.dtype(), mlx_rs::Dtype::Float16 | mlx_rs::Dtype::Bfloat16)
                        && shape[2] % 128 == 0
                        && shape[3] % 8 == 0
                        && shape[3] <= 128;
                if shape[1] != k.shape()[1] || fused_half {
                    return custom::mlx_vjp(|xs| self.forward(xs, side), xs, g);
                }
                let (p, scale) = self.probabilities(q, k, mask)?;
                let o = p.matmul(v)?;
                (p, o, scale)
            }
        };
        Ok(attention_grads(&p, &o, q, k, v, g, &scale)?.to_vec())
    }
}

/// The gradients `[dq, dk, dv]` of attention `o = p·v`, `p = softmax(q·kᵀ·scale + mask)`, for
/// the output's cotangent `g`, from the probabilities `p` and the output `o`: `dv = pᵀ·g`,
/// `dp = g·vᵀ`, `ds = p·(dp - rowsum(g·o))·scale`, `dq = ds·k`, `dk = dsᵀ·q`. The scale rides
/// in `ds`'s elementwise kernel, so neither `dq` nor `dk` takes a pass of its own. `scale` is a
/// 0-d array of q's dtype.
pub(super) fn attention_grads(
    p: &Array,
    o: &Array,
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    scale: &Array,
) -> Result<[Array; 3], Exception> {
    let dv = p.swap_axes(-1, -2)?.matmul(g)?;
    let dp = g.matmul(&v.swap_axes(-1, -2)?)?;
    let row = g.multiply(o)?.sum_axis(-1, true)?;
    let ds = p.multiply(&dp.subtract(&row)?)?.multiply(scale)?;
    let dq = ds.matmul(k)?;
    let dk = ds.swap_axes(-1, -2)?.matmul(q)?;
    Ok([dq, dk, dv])
}

/// The mean cross-entropy of `logits` `[batch, classes]` against class indices `targets`
/// `[batch]`: `mean(logsumexp(logits) - logits[target])`, burn-nn's `CrossEntropyLoss` with its
/// defaults (logits in, no smoothing, no weights, no padding).
///
/// On MLX, forward and backward are a few MLX ops each (the backward is `softmax - one_hot`),
/// instead of Burn's decomposed log-softmax, gather and mean.
///
/// # Panics
///
/// When `targets` is not as long as `logits`' batch.
pub fn cross_entropy<B: Backend>(logits: Tensor<B, 2>, targets: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    if let Some(loss) = fused_cross_entropy("cross_entropy", &logits, &targets, None, false, false)
    {
        return loss;
    }
    let [n, _] = logits.dims();
    log_softmax(logits, 1)
        .gather(1, targets.reshape([n, 1]))
        .mean()
        .neg()
}

/// Checks the shapes of a cross-entropy (`op` names it in the panic message) and computes it
/// as one [`CrossEntropyOp`] where fused ops run, or on every MLX device when `anywhere`;
/// `None` elsewhere.
fn fused_cross_entropy<B: Backend>(
    op: &str,
    logits: &Tensor<B, 2>,
    targets: &Tensor<B, 1, Int>,
    weights: Option<&Tensor<B, 1>>,
    in_f32: bool,
    anywhere: bool,
) -> Option<Tensor<B, 1>> {
    let [n, _] = logits.dims();
    let [t] = targets.dims();
    assert_eq!(
        n,
        t,
        "{op}: {t} targets for logits of shape {:?} (one class index per row)",
        logits.dims()
    );
    if let Some(weights) = weights {
        assert_eq!(
            weights.dims(),
            [n],
            "{op}: {:?} weights for logits of shape {:?} (one weight per row)",
            weights.dims(),
            logits.dims()
        );
    }
    let runs = match anywhere {
        true => custom::is_mlx::<B>(),
        false => custom::fuses::<B>(&logits.device()),
    };
    if !runs {
        return None;
    }
    let ids = side_input(targets.clone()).expect("B is built on MLX");
    let weights = match weights {
        Some(w) => Some(custom::mlx_array::<B>(prim(w.clone().detach()))?),
        None => None,
    };
    let fused = Arc::new(CrossEntropyOp {
        targets: ids,
        weights,
        in_f32,
        lse: std::sync::Mutex::new(None),
    });
    let out = match anywhere {
        true => custom::apply_anywhere::<B>(fused, vec![prim(logits.clone())]),
        false => custom::apply::<B>(fused, vec![prim(logits.clone())]),
    };
    out.ok().map(wrap)
}

/// [`cross_entropy`] computed in f32 whatever the logits' dtype, with an f32 result: the
/// language-model loss over a large vocabulary. On MLX (every device, the CPU included) it is
/// one op: the logits are converted inside it, forward and backward, so no f32 copy of them is
/// kept between the two passes (for a 151,936-token vocabulary and 2,048 positions, 1.2 GB), the
/// backward reuses the forward's log-sum-exp, and the gradient has the logits' dtype.
///
/// # Panics
///
/// When `targets` is not as long as `logits`' batch.
pub fn cross_entropy_f32<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
) -> Tensor<B, 1> {
    let in_f32 = logits.dtype() != DType::F32;
    match fused_cross_entropy("cross_entropy_f32", &logits, &targets, None, in_f32, true) {
        Some(loss) => loss,
        None if in_f32 => cross_entropy(logits.cast(DType::F32), targets),
        None => cross_entropy(logits, targets),
    }
}

/// The weighted sum of the rows' cross-entropies, `Σᵢ wᵢ · (logsumexp(logitsᵢ) -
/// logitsᵢ[targetᵢ])`, in f32 as [`cross_entropy_f32`] computes it: with `weights` `1/count` on
/// the rows that have a target and 0 elsewhere, the mean loss over the targets, from arrays whose
/// shapes do not depend on how many targets a batch has (a traced training step is then replayed
/// for every batch of the same padded length). The weights are not differentiated.
///
/// On MLX it is the same single op as [`cross_entropy_f32`], with its written-out backward also
/// inside MLX's own transforms ([`crate::grad::value_and_grad`], [`crate::grad::CompiledTrainer`]);
/// elsewhere it is composed from Burn's ops.
///
/// # Panics
///
/// When `targets` or `weights` is not as long as `logits`' batch.
pub fn cross_entropy_f32_weighted<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    weights: Tensor<B, 1>,
) -> Tensor<B, 1> {
    let in_f32 = logits.dtype() != DType::F32;
    let name = "cross_entropy_f32_weighted";
    if let Some(loss) = fused_cross_entropy(name, &logits, &targets, Some(&weights), in_f32, true) {
        return loss;
    }
    let [n, _] = logits.dims();
    let logits = if in_f32 {
        logits.cast(DType::F32)
    } else {
        logits
    };
    let picked = log_softmax(logits, 1).gather(1, targets.reshape([n, 1]));
    (picked.reshape([n]) * weights.detach().cast(DType::F32))
        .sum()
        .neg()
}

#[derive(Debug)]
struct CrossEntropyOp {
    targets: MlxTensor,
    /// Each row's weight `[n]`: the loss is the weighted sum of the rows' losses (without, the
    /// mean).
    weights: Option<MlxTensor>,
    /// Convert the logits to f32 first.
    in_f32: bool,
    /// Each row's log-sum-exp `[n, 1]`, kept by the forward pass for the backward pass.
    lse: std::sync::Mutex<Option<Array>>,
}

// SAFETY: MLX arrays are reference-counted handles to immutable data; the saved log-sum-exp is
// only read and replaced under its mutex.
unsafe impl Send for CrossEntropyOp {}
unsafe impl Sync for CrossEntropyOp {}

impl FusedOp for CrossEntropyOp {
    fn name(&self) -> &'static str {
        "cross_entropy"
    }

    fn key(&self) -> String {
        format!("cross_entropy in_f32={}", self.in_f32)
    }

    fn side_inputs(&self) -> Vec<Array> {
        let weights = self.weights.iter().map(|w| w.array().clone());
        std::iter::once(self.targets.array().clone())
            .chain(weights)
            .collect()
    }

    /// The written-out backward keeps no f32 copy of the logits, inside MLX's transforms too.
    fn vjp_in_mlx_transforms(&self) -> bool {
        true
    }

    fn forward(&self, xs: &[Array], side: &[Array]) -> Result<Array, Exception> {
        let converted;
        let logits = if self.in_f32 {
            converted = xs[0].as_dtype(mlx_rs::Dtype::Float32)?;
            &converted
        } else {
            &xs[0]
        };
        let ids = side[0].as_dtype(mlx_rs::Dtype::Int32)?;
        let n = ids.shape()[0];
        let picked = logits.take_along_axis(&ids.reshape(&[n, 1])?, 1)?;
        let lse = logits.logsumexp_axis(1, true)?;
        if let Ok(mut saved) = self.lse.lock() {
            *saved = Some(lse.clone());
        }
        let losses = lse.subtract(&picked)?;
        match self.weights {
            Some(_) => {
                let w = side[1].as_dtype(losses.dtype())?.reshape(&[n, 1])?;
                losses.multiply(&w)?.sum(false)?.reshape(&[1])
            }
            None => losses.mean(false)?.reshape(&[1]),
        }
    }

    fn saved(&self) -> Vec<Array> {
        self.lse
            .lock()
            .ok()
            .and_then(|s| s.clone())
            .into_iter()
            .collect()
    }

    /// `(softmax(logits) - onehot(targets)) · g / n` (`· g · wᵢ` with weights), written out rather than left to MLX's
    /// product of [`forward`](Self::forward): that one scatters the picked logits' gradient into
    /// a zero f32 array and adds the log-sum-exp's, holding several f32 copies of the logits at
    /// once (each 1.2 GB for 2,048 positions of a 151,936-token vocabulary). Here the one-hot is
    /// a comparison with the class index and the log-sum-exp is the forward pass's (after the
    /// targets and weights in `side`, recomputed when absent), so after MLX's compile the gradient is one elementwise kernel
    /// that reads the half-precision logits and writes their gradient, with no f32 copy.
    fn vjp(&self, xs: &[Array], side: &[Array], g: &Array) -> Result<Vec<Array>, Exception> {
        let logits = &xs[0];
        let x = if self.in_f32 {
            logits.as_dtype(mlx_rs::Dtype::Float32)?
        } else {
            logits.clone()
        };
        let [n, classes] = [x.shape()[0], x.shape()[1]];
        let ids = side[0].as_dtype(mlx_rs::Dtype::Int32)?.reshape(&[n, 1])?;
        let weighted = self.weights.is_some();
        let lse = match side.get(1 + weighted as usize) {
            Some(lse) => lse.clone(),
            None => x.logsumexp_axis(1, true)?,
        };
        let p = x.subtract(&lse)?.exp()?;
        let g = g.reshape(&[1, 1])?;
        let scale = match weighted {
            true => g.multiply(side[1].reshape(&[n, 1])?)?,
            false => g.divide(Array::from_f32(n as f32))?,
        };
        let scale = scale.as_dtype(x.dtype())?;
        let class = Array::arange::<_, i32>(None, classes, None)?.reshape(&[1, classes])?;
        let onehot = class.eq(&ids)?.as_dtype(x.dtype())?;
        let grad = p.subtract(&onehot)?.multiply(&scale)?;
        Ok(vec![grad.as_dtype(logits.dtype())?])
    }
}

/// The frozen weight of a [`lora_linear`] product.
#[derive(Debug, Clone, Copy)]
pub enum FrozenWeight<'a, B: Backend> {
    /// `Wᵀ`, `[in, out]` (a transposed view of the stored `[out, in]` weight).
    Dense(&'a Tensor<B, 2>),
    /// `W`, quantized ([`crate::quant::QuantizedMatrix`]).
    Quantized(&'a crate::quant::QuantizedMatrix<B>),
}

/// A linear layer with a low-rank (LoRA) update, `x·Wᵀ + scale · ((x·A)·B)`, for `x`
/// `[rows, in]`, `A` `[in, rank]`, `B` `[rank, out]`. The update is computed in `A`'s dtype and
/// added in `x`'s, as mlx-lm's `LoRALinear` does.
///
/// On `Autodiff<Mlx>` (where fused ops run) this is one autodiff node: the MLX ops of the whole
/// layer forward (`W` a constant, dense or MLX's packed quantized form) and one compiled
/// vector-Jacobian product backward, giving the gradients of `x`, `A` and `B`, instead of about
/// seven recorded ops and their backward. Elsewhere it is composed from Burn's ops.
///
/// # Errors
///
/// When a quantized product fails (the message names the shapes).
pub fn lora_linear<B: Backend>(
    x: Tensor<B, 2>,
    weight: FrozenWeight<'_, B>,
    a: Tensor<B, 2>,
    b: Tensor<B, 2>,
    scale: f64,
) -> Result<Tensor<B, 2>, crate::MlxError> {
    if custom::fuses::<B>(&x.device()) && custom::is_mlx::<B>() {
        let side = match weight {
            FrozenWeight::Dense(w_t) => {
                custom::mlx_array::<B>(prim(w_t.clone())).map(|t| (vec![t.array().clone()], None))
            }
            FrozenWeight::Quantized(q) => q.packed_arrays().map(|p| {
                (
                    p.to_vec(),
                    Some((q.group_size() as i32, q.bits().bits() as i32)),
                )
            }),
        };
        if let Some((side, quantized)) = side {
            let op = Arc::new(LoraLinearOp {
                side,
                quantized,
                scale: scale as f32,
            });
            match custom::apply::<B>(op, vec![prim(x), prim(a), prim(b)]) {
                Ok(out) => return Ok(wrap(out)),
                Err(_) => unreachable!("fuses() said the op runs on this device"),
            }
        }
    }
    let y = match weight {
        FrozenWeight::Dense(w_t) => x.clone().matmul(w_t.clone()),
        FrozenWeight::Quantized(q) => q.matmul_t(x.clone())?,
    };
    let (dtype, own) = (x.dtype(), a.dtype());
    let x = if dtype == own { x } else { x.cast(own) };
    let z = x.matmul(a).matmul(b) * scale;
    Ok(y + if dtype == own { z } else { z.cast(dtype) })
}

#[derive(Debug)]
struct LoraLinearOp {
    /// `Wᵀ` `[in, out]`, or MLX's packed words, scales and biases of `W`.
    side: Vec<Array>,
    /// Group size and bits when `W` is quantized.
    quantized: Option<(i32, i32)>,
    scale: f32,
}

// SAFETY: MLX arrays are reference-counted handles to immutable data, only read here (as every
// fused op does with its side inputs).
unsafe impl Send for LoraLinearOp {}
unsafe impl Sync for LoraLinearOp {}

impl FusedOp for LoraLinearOp {
    fn name(&self) -> &'static str {
        "lora_linear"
    }

    fn key(&self) -> String {
        format!(
            "lora_linear scale={} quantized={:?}",
            self.scale, self.quantized
        )
    }

    fn side_inputs(&self) -> Vec<Array> {
        self.side.clone()
    }

    /// The scaling, the casts and the sum after the three products become one kernel.
    fn compile_forward(&self) -> bool {
        true
    }

    fn forward(&self, xs: &[Array], side: &[Array]) -> Result<Array, Exception> {
        let (x, a, b) = (&xs[0], &xs[1], &xs[2]);
        let base = match self.quantized {
            None => x.matmul(&side[0])?,
            Some((group_size, bits)) => {
                let compute = side[1].dtype();
                ops::quantized_matmul(
                    x.as_dtype(compute)?,
                    &side[0],
                    &side[1],
                    &side[2],
                    true,
                    group_size,
                    bits,
                )?
                .as_dtype(x.dtype())?
            }
        };
        let update = x
            .as_dtype(a.dtype())?
            .matmul(a)?
            .matmul(b)?
            .multiply(Array::from_f32(self.scale))?
            .as_dtype(x.dtype())?;
        base.add(&update)
    }
}
