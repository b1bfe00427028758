//! A decode step's projections with their neighbours fused in: the norm before a projection, the
//! residual add after one, the gated activation after the gate/up projection, and the head split,
//! norms and RoPE after the QKV projection. With them a pre-norm decoder layer (Llama, Qwen) is
//! four kernels, the cache write and the attention:
//!
//! ```text
//! q, kv = norm_qkv_heads_joint(x, input_norm, qkv)      // norm, QKV product, heads, norms, RoPE
//! kv    = cache.write(kv)
//! h     = linear_add(decode_attention_joint(q, kv), o_proj, x)
//! x     = linear_add(norm_gated(h, post_norm, gate_up), down_proj, h)
//! ```
//!
//! On [`Mlx`](crate::Mlx)'s CUDA device, for up to [`MAX_FUSED_ROWS`] rows, each is one MLX custom
//! kernel (`src/decode/gemv.rs`), and `norm_qkv_heads_joint` given the cache
//! ([`NormQkv::cache`]) writes the keys and values into it itself, which takes the cache write
//! out; everywhere else they are the composed ops ([`rms_norm`], a
//! matrix product, [`super::qkv_heads`], [`super::gated`]), with the same results within the
//! dtype's rounding.
//!
//! Each takes its layer as a [`Linear`]: [`Dense`] (a weight tensor) or [`Quantized`] (a
//! [`QuantizedMatrix`]). The kernels read a quantized weight's packed values in place, so a
//! quantized model's decode step is as few kernels as a dense one's; the composed path multiplies
//! through MLX's quantized matmul.

use super::gemv::{self, Mat, Projection};
use super::{array_of, cpu_input, gated, heads, kernel_input, writable_cache, At, Gate, QkvLayout};
use crate::fast::{float_from_mlx, float_on_mlx, rms_norm, RotaryEmbedding};
use crate::quant::QuantizedMatrix;
use crate::tensor::{MlxTensor, OrPanic};
use burn_tensor::backend::Backend;
use burn_tensor::Tensor;
use mlx_rs::{Array, Dtype};

/// Most rows (one position of each sequence of a batch) the fused kernels take; more rows take
/// the composed ops, whose matrix products serve them better.
pub const MAX_FUSED_ROWS: usize = gemv::MAX_ROWS;

/// A dense linear layer's parameters as burn-nn's `Linear` holds them: `weight` `[in, out]`
/// (`y = x·weight + bias`). A transposed view of a stored `[out, in]` matrix is read in place.
#[derive(Debug, Clone, Copy)]
pub struct Dense<'a, B: Backend> {
    /// `[in, out]`.
    pub weight: &'a Tensor<B, 2>,
    /// `[out]`, or none.
    pub bias: Option<&'a Tensor<B, 1>>,
}

/// A quantized linear layer's parameters: `y = x·Wᵀ + bias` with `W` (`[out, in]`) held as a
/// [`QuantizedMatrix`] (MLX's 4- or 8-bit affine groups on `Mlx`).
#[derive(Debug, Clone, Copy)]
pub struct Quantized<'a, B: Backend> {
    /// `W`, `[out, in]`.
    pub matrix: &'a QuantizedMatrix<B>,
    /// `[out]`, or none.
    pub bias: Option<&'a Tensor<B, 1>>,
}

/// A linear layer as the decode functions take it: dense or quantized. On CUDA the fused kernels
/// read either form in place (a quantized weight's packed values, scales and biases, without
/// dequantizing it); elsewhere the composed ops use a matrix product or MLX's quantized matmul.
#[derive(Debug, Clone, Copy)]
pub enum Linear<'a, B: Backend> {
    /// A dense weight.
    Dense(Dense<'a, B>),
    /// A quantized weight.
    Quantized(Quantized<'a, B>),
}

impl<'a, B: Backend> From<Dense<'a, B>> for Linear<'a, B> {
    fn from(layer: Dense<'a, B>) -> Self {
        Linear::Dense(layer)
    }
}

impl<'a, B: Backend> From<Quantized<'a, B>> for Linear<'a, B> {
    fn from(layer: Quantized<'a, B>) -> Self {
        Linear::Quantized(layer)
    }
}

impl<B: Backend> Linear<'_, B> {
    /// `[in, out]`.
    pub fn dims(&self) -> [usize; 2] {
        match self {
            Linear::Dense(d) => d.weight.dims(),
            Linear::Quantized(q) => {
                let [out, input] = q.matrix.dims();
                [input, out]
            }
        }
    }

    /// The bias, if any.
    pub fn bias(&self) -> Option<&Tensor<B, 1>> {
        match self {
            Linear::Dense(d) => d.bias,
            Linear::Quantized(q) => q.bias,
        }
    }

    /// `x·W + bias`, composed.
    ///
    /// # Panics
    ///
    /// When MLX fails a quantized product (its error names the op and the shapes).
    pub(super) fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let y = match self {
            Linear::Dense(d) => x.matmul(d.weight.clone()),
            Linear::Quantized(q) => q
                .matrix
                .matmul_t(x)
                .unwrap_or_else(|e| panic!("decode: quantized projection: {e}")),
        };
        match self.bias() {
            Some(b) => y + b.clone().unsqueeze::<2>(),
            None => y,
        }
    }

    /// Checks that `x` (`[rows, in]`) fits, naming `op`.
    pub(super) fn check(&self, op: &str, x: &Tensor<B, 2>) {
        let [_, k] = x.dims();
        let [input, out] = self.dims();
        assert_eq!(
            k, input,
            "{op}: the input rows hold {k} values, the weight [{input}, {out}] takes {input}"
        );
        if let Some(b) = self.bias() {
            assert_eq!(
                b.dims()[0],
                out,
                "{op}: the bias has {} values, the weight [{input}, {out}] makes {out}",
                b.dims()[0]
            );
        }
    }

    /// The weight as the kernels read it, for input rows of `dtype`: a dense weight of `dtype`,
    /// or MLX's packed form with scales and biases of `dtype` laid out as the kernels read them.
    pub(super) fn mat(&self, dtype: Dtype) -> Option<Mat> {
        match self {
            Linear::Dense(d) => dense_array(d.weight.clone(), dtype).map(Mat::Dense),
            Linear::Quantized(q) => {
                let [words, scales, biases] = q.matrix.packed_arrays()?;
                let [out, input] = q.matrix.dims();
                let bits = q.matrix.bits().bits();
                let group = q.matrix.group_size();
                let row_major = |a: &Array, cols: usize| {
                    a.shape() == [out as i32, cols as i32] && a.strides() == [cols, 1]
                };
                let fits = words.dtype() == Dtype::Uint32
                    && words.shape() == [out as i32, (input * bits / 32) as i32]
                    && words.strides()[1] == 1
                    && scales.dtype() == dtype
                    && biases.dtype() == dtype
                    && row_major(&scales, input / group)
                    && row_major(&biases, input / group);
                fits.then(|| Mat::Quantized {
                    words,
                    scales,
                    biases,
                    bits: bits as i32,
                    group: group as i32,
                })
            }
        }
    }
}

/// The MLX arrays of `x` and `layer` when a fused kernel runs for them: `x` on the CUDA device
/// with [`MAX_FUSED_ROWS`] rows or fewer, the weight as [`Linear::mat`] takes it and the bias in
/// `x`'s dtype.
fn fused_inputs<B: Backend>(
    x: Tensor<B, 2>,
    layer: &Linear<B>,
) -> Result<(MlxTensor, Mat, Option<Array>), Tensor<B, 2>> {
    let t = kernel_input(x)?;
    let [rows, k] = rows_cols(&t);
    let dtype = t.array.dtype();
    let weight = layer.mat(dtype);
    let bias = layer.bias().map(|b| dense_array(b.clone(), dtype));
    match (weight, bias) {
        (Some(w), None) if gemv::fits(rows, k, dtype) => Ok((t, w, None)),
        (Some(w), Some(Some(b))) if gemv::fits(rows, k, dtype) => Ok((t, w, Some(b))),
        _ => Err(float_from_mlx(t)),
    }
}

/// The MLX array of `t` when it is dense (not quantized) and of `dtype`.
pub(super) fn dense_array<B: Backend, const D: usize>(
    t: Tensor<B, D>,
    dtype: Dtype,
) -> Option<Array> {
    match float_on_mlx(t) {
        Ok(t) if t.array.dtype() == dtype => Some(t.array),
        _ => None,
    }
}

/// `[rows, columns]` of a 2-D MLX tensor.
fn rows_cols(t: &MlxTensor) -> [usize; 2] {
    let shape = t.array.shape();
    [shape[0] as usize, shape[1] as usize]
}

/// `residual + x·weight (+ bias)`: a projection and the residual connection after it.
///
/// # Panics
///
/// When `x` (`[rows, in]`), the layer and `residual` (`[rows, out]`) do not fit together.
pub fn linear_add<'a, B: Backend>(
    x: Tensor<B, 2>,
    layer: impl Into<Linear<'a, B>>,
    residual: Tensor<B, 2>,
) -> Tensor<B, 2> {
    let layer = layer.into();
    layer.check("linear_add", &x);
    let [rows, _] = x.dims();
    let [_, n] = layer.dims();
    assert_eq!(
        residual.dims(),
        [rows, n],
        "linear_add: the residual is {:?}, the projection makes [{rows}, {n}]",
        residual.dims()
    );
    let x = match fused_inputs(x, &layer) {
        Ok((t, w, b)) => {
            let r = array_of(&residual);
            let [rows, k] = rows_cols(&t);
            let p = Projection {
                x: &t.array,
                w: &w,
                bias: b.as_ref(),
                rows,
                k,
            };
            let y = t
                .device
                .scope(|| gemv::linear_add(&p, n, &r))
                .or_panic("linear_add", &[&t.array, w.inputs()[0]]);
            return float_from_mlx(t.with(y));
        }
        Err(x) => x,
    };
    // On MLX's CPU a dense projection without bias and its residual add are one `addmm`
    // (BLAS's accumulate into the residual), one primitive instead of two.
    let x = match (cpu_input(x), &layer) {
        (Ok(t), Linear::Dense(Dense { weight, bias: None })) => {
            let (w, r) = (array_of(weight), array_of(&residual));
            let y = t
                .device
                .scope(|| mlx_rs::ops::addmm(&r, &t.array, &w, 1.0, 1.0))
                .or_panic("linear_add", &[&t.array, &w]);
            return float_from_mlx(t.with(y));
        }
        (Ok(t), _) => float_from_mlx(t),
        (Err(x), _) => x,
    };
    residual + layer.forward(x)
}

/// `act(gate) · up` of `rms_norm(x, norm, eps)·weight (+ bias)`, the gate/up projection's output
/// (`[rows, 2·i]`: the gate's `i` columns, then the up projection's): a pre-norm gated MLP up to
/// its down projection. Returns `[rows, i]`.
///
/// # Panics
///
/// When `x` (`[rows, in]`), `norm` (`[in]`) and the layer do not fit together, or the layer's
/// width is odd.
pub fn norm_gated<'a, B: Backend>(
    x: Tensor<B, 2>,
    norm: &Tensor<B, 1>,
    eps: f64,
    layer: impl Into<Linear<'a, B>>,
    gate: Gate,
) -> Tensor<B, 2> {
    let layer = layer.into();
    layer.check("norm_gated", &x);
    check_norm("norm_gated", &x, norm);
    let [_, width] = layer.dims();
    assert!(
        width % 2 == 0,
        "norm_gated: the gate/up projection's width {width} is odd"
    );
    let x = match fused_inputs(x, &layer) {
        Ok((t, w, b)) => {
            let g = array_of(norm);
            let [rows, k] = rows_cols(&t);
            let p = Projection {
                x: &t.array,
                w: &w,
                bias: b.as_ref(),
                rows,
                k,
            };
            let gelu = gate == Gate::GeluTanh;
            let y = t
                .device
                .scope(|| gemv::norm_gated(&p, &g, eps as f32, width / 2, gelu))
                .or_panic("norm_gated", &[&t.array, w.inputs()[0]]);
            return float_from_mlx(t.with(y));
        }
        Err(x) => x,
    };
    gated(layer.forward(rms_norm(x, norm.clone(), eps)), gate)
}

/// The heads of a pre-norm QKV projection for one position of each sequence: `x` (`[batch, in]`,
/// the sequences' newest positions, all at `offset`) is normalized with `norm` and `eps`,
/// projected, and split as [`super::qkv_heads`] does (with the query/key `qk_norms` and `rope`).
/// Returns `[queries, keys, values]`, `[batch, heads, 1, head_dim]` each.
///
/// # Panics
///
/// When the shapes do not fit together (see [`super::qkv_heads`]).
#[allow(clippy::too_many_arguments)]
pub fn norm_qkv_heads<'a, B: Backend>(
    x: Tensor<B, 2>,
    norm: &Tensor<B, 1>,
    eps: f64,
    layer: impl Into<Linear<'a, B>>,
    layout: QkvLayout,
    qk_norms: Option<(&Tensor<B, 1>, &Tensor<B, 1>)>,
    qk_eps: f64,
    rope: &RotaryEmbedding<B>,
    offset: &At<B>,
) -> [Tensor<B, 4>; 3] {
    let step = NormQkv {
        norm,
        eps,
        layer: layer.into(),
        layout,
        qk_norms,
        qk_eps,
        rope,
        offset,
        cache: None,
    };
    step.heads(x)
}

/// [`norm_qkv_heads`] with the keys and values in one tensor, `[batch, 2 · kv_heads, 1,
/// head_dim]` (as [`super::qkv_heads_joint`] makes them). Returns `[queries, keys and values]`.
///
/// # Panics
///
/// As [`norm_qkv_heads`].
#[allow(clippy::too_many_arguments)]
pub fn norm_qkv_heads_joint<'a, B: Backend>(
    x: Tensor<B, 2>,
    norm: &Tensor<B, 1>,
    eps: f64,
    layer: impl Into<Linear<'a, B>>,
    layout: QkvLayout,
    qk_norms: Option<(&Tensor<B, 1>, &Tensor<B, 1>)>,
    qk_eps: f64,
    rope: &RotaryEmbedding<B>,
    offset: &At<B>,
) -> [Tensor<B, 4>; 2] {
    let step = NormQkv {
        norm,
        eps,
        layer: layer.into(),
        layout,
        qk_norms,
        qk_eps,
        rope,
        offset,
        cache: None,
    };
    step.heads_joint(x)
}

/// The arguments of [`norm_qkv_heads`] and [`norm_qkv_heads_joint`] (see them), for a call that
/// takes a block's QKV step as one value ([`super::attention_mlp_qkv`]).
#[derive(Debug, Clone, Copy)]
pub struct NormQkv<'a, B: Backend> {
    /// The RMS norm's weight before the projection, `[in]`.
    pub norm: &'a Tensor<B, 1>,
    /// The RMS norm's epsilon.
    pub eps: f64,
    /// The fused QKV projection, `[in, (heads + 2·kv_heads)·head_dim]`.
    pub layer: Linear<'a, B>,
    /// The heads of the projection's output.
    pub layout: QkvLayout,
    /// The query and key heads' RMS norm weights (`[head_dim]` each), or none.
    pub qk_norms: Option<(&'a Tensor<B, 1>, &'a Tensor<B, 1>)>,
    /// The query/key norms' epsilon.
    pub qk_eps: f64,
    /// The rotary embedding of the query and key heads.
    pub rope: &'a RotaryEmbedding<B>,
    /// The position of the rows.
    pub offset: &'a At<B>,
    /// A cache of keys and values side by side (`[rows, 2·kv_heads, capacity, head_dim]`, made by
    /// [`super::cache_buffer`] or updated from such a buffer) that the CUDA kernel writes the
    /// keys and values into at `offset`, in place, so that no cache update follows; see
    /// [`NormQkv::heads_joint_cached`]. Elsewhere it is not written.
    pub cache: Option<&'a Tensor<B, 4>>,
}

/// A block's query heads and its keys and values side by side, from
/// [`NormQkv::heads_joint_cached`] or [`super::attention_mlp_qkv`].
#[derive(Debug, Clone)]
pub struct JointHeads<B: Backend> {
    /// `[rows, heads, 1, head_dim]`.
    pub q: Tensor<B, 4>,
    /// `[rows, 2·kv_heads, 1, head_dim]`: the keys' heads, then the values'.
    pub kv: Tensor<B, 4>,
    /// Whether `kv` is already in the step's [`NormQkv::cache`] at its offset (the kernel that
    /// made it wrote it there); when not, the caller writes it.
    pub cached: bool,
}

impl<B: Backend> NormQkv<'_, B> {
    /// [`norm_qkv_heads`] of `x`: `[queries, keys, values]`.
    pub fn heads(&self, x: Tensor<B, 2>) -> [Tensor<B, 4>; 3] {
        let mut out = self.run(x, false).0.into_iter();
        let mut next = || out.next().expect("three outputs");
        [next(), next(), next()]
    }

    /// [`norm_qkv_heads_joint`] of `x`: `[queries, keys and values]` (see
    /// [`heads_joint_cached`](Self::heads_joint_cached) for what happens to `cache`).
    pub fn heads_joint(&self, x: Tensor<B, 2>) -> [Tensor<B, 4>; 2] {
        let JointHeads { q, kv, .. } = self.heads_joint_cached(x);
        [q, kv]
    }

    /// [`norm_qkv_heads_joint`] of `x`; where the heads come from the CUDA kernel and
    /// [`cache`](Self::cache) is a buffer it can write (see [`super::cache_buffer`]), the keys and
    /// values also land in the cache at `offset`, and [`JointHeads::cached`] says so.
    pub fn heads_joint_cached(&self, x: Tensor<B, 2>) -> JointHeads<B> {
        let (out, cached) = self.run(x, true);
        let mut out = out.into_iter();
        let mut next = || out.next().expect("two outputs");
        JointHeads {
            q: next(),
            kv: next(),
            cached,
        }
    }

    /// Checks the shapes for `x` (`[rows, in]`), naming `op`.
    pub(super) fn check(&self, op: &str, x: &Tensor<B, 2>) {
        self.layer.check(op, x);
        check_norm(op, x, self.norm);
        let QkvLayout {
            heads: hq,
            kv_heads: hkv,
            head_dim: d,
        } = self.layout;
        let [_, width] = self.layer.dims();
        assert_eq!(
            width,
            self.layout.width(),
            "{op}: the projection is {width} wide, the layout ({hq} + 2·{hkv} heads of {d}) \
             needs {}",
            self.layout.width()
        );
        assert_eq!(
            self.rope.head_dim(),
            d,
            "{op}: the rotary embedding is for heads of {}, the layout's are {d}",
            self.rope.head_dim()
        );
    }

    /// The heads, and whether the keys and values were also written into `cache`.
    fn run(&self, x: Tensor<B, 2>, joint: bool) -> (Vec<Tensor<B, 4>>, bool) {
        let op = "norm_qkv_heads";
        self.check(op, &x);
        let QkvLayout {
            heads: hq,
            kv_heads: hkv,
            head_dim: d,
        } = self.layout;
        let [batch, _] = x.dims();
        let x = match fused_inputs(x, &self.layer) {
            Ok((t, w, b)) if d % 16 == 0 && d <= 256 => {
                let g = array_of(self.norm);
                let qk = self.qk_norms.map(|(q, k)| (array_of(q), array_of(k)));
                let freqs = array_of(self.rope.inverse_frequencies());
                let pos = self.offset.array();
                let [rows, k] = rows_cols(&t);
                let cache = self
                    .cache
                    .filter(|_| joint)
                    .and_then(|c| writable_cache(c, &t, [rows, 2 * hkv, d], self.offset));
                let p = Projection {
                    x: &t.array,
                    w: &w,
                    bias: b.as_ref(),
                    rows,
                    k,
                };
                let out = t
                    .device
                    .scope(|| {
                        gemv::norm_qkv_heads(
                            &p,
                            &g,
                            self.eps as f32,
                            [hq, hkv, d],
                            qk.as_ref().map(|(q, k)| (q, k)),
                            self.qk_eps as f32,
                            &freqs,
                            &pos,
                            joint,
                            cache.as_ref(),
                        )
                    })
                    .or_panic(op, &[&t.array, w.inputs()[0]]);
                let out = out.into_iter().map(|a| float_from_mlx(t.with(a))).collect();
                return (out, cache.is_some());
            }
            Ok((t, ..)) => float_from_mlx(t),
            Err(x) => x,
        };
        let qkv = self.layer.forward(rms_norm(x, self.norm.clone(), self.eps));
        let out = heads(
            qkv,
            batch,
            self.layout,
            self.qk_norms,
            self.qk_eps,
            self.rope,
            self.offset,
            joint,
        );
        (out, false)
    }
}

/// Checks that `norm` is as long as `x`'s rows (the message names `op`).
fn check_norm<B: Backend>(op: &str, x: &Tensor<B, 2>, norm: &Tensor<B, 1>) {
    let [_, k] = x.dims();
    assert_eq!(
        norm.dims()[0],
        k,
        "{op}: the norm's weight has {} values, the input rows {k}",
        norm.dims()[0]
    );
}
