//! Fused kernels for a decoder's generation step, backend-generic.
//!
//! One token of LLM decode touches a few kilobytes per op, so on a GPU its cost is the number of
//! ops: each is a node the host builds and MLX walks, then a kernel launch. These functions do
//! the work of several Burn ops each:
//!
//! | function | replaces |
//! |---|---|
//! | [`add_rms_norm`] | the residual add and the next RMS norm (both results) |
//! | [`qkv_heads`] | the split of a fused QKV projection, its reshapes, the query/key RMS norms and RoPE |
//! | [`qkv_heads_joint`] | the same, with keys and values side by side for a cache that holds both in one buffer |
//! | [`decode_attention`] | the slice of the cache's filled prefix (or the mask of a fixed-shape step) and attention |
//! | [`decode_attention_joint`] | the same over a cache of keys and values in one buffer |
//! | [`gated`] | the split of a fused gate/up projection and SwiGLU (or GeGLU) |
//! | [`norm_qkv_heads`], [`norm_qkv_heads_joint`] | for one position per sequence: the RMS norm before the QKV projection, the projection, and [`qkv_heads`]'s work |
//! | [`linear_add`] | for one position per sequence: a projection and the residual add after it |
//! | [`norm_gated`] | for one position per sequence: the RMS norm before the gate/up projection, the projection and [`gated`]'s work |
//! | [`attention_mlp`] | for one position of one sequence, once the new position is in the cache: [`decode_attention_joint`], [`linear_add`], [`norm_gated`] and [`linear_add`] |
//! | [`attention_mlp_qkv`] | [`attention_mlp`] and the next block's [`norm_qkv_heads_joint`], which writes that block's keys and values into its cache |
//!
//! On [`Mlx`](crate::Mlx)'s CUDA device each is one MLX custom kernel (one primitive, one
//! launch; `src/decode/cuda.rs`), compiled by MLX on its first use in a process. On MLX's CPU,
//! [`qkv_heads`], [`qkv_heads_joint`], [`decode_attention`], [`decode_attention_joint`] and
//! [`gated`] are one primitive each of burn-mlx's own (`mlx-sys/cpu_layers.cpp`), and the others
//! are composed from them, MLX's matmul (with the residual add as one `addmm` where the
//! projection is dense without bias) and burn-mlx's CPU RMS norm ([`crate::fast::rms_norm`]).
//! Everywhere else (Metal, other backends, `Autodiff`) they are composed from Burn ops and
//! burn-mlx's other fused ops, with the same results within the dtype's rounding. Inside a
//! function traced by [`crate::compile()`] the kernels are recorded like any MLX op; a function
//! written to a file by [`crate::export`] gets the composed ops. `BURN_MLX_DECODE_KERNELS=0` (or
//! [`set_kernels`]) selects the composed path on CUDA and on the CPU.
//!
//! Positions and lengths come as [`At`]: a host integer (which the CUDA kernels read from a
//! table of positions made on the device, not from host memory), or an integer tensor on the
//! device, which a traced fixed-shape step reads at run time. Projections come as [`Linear`]: a
//! [`Dense`] weight or a [`Quantized`] one (MLX's 4- and 8-bit affine groups), which the kernels
//! read in place.

mod cuda;
mod gemv;
mod projection;
mod stack;
mod tail;

pub use projection::{
    linear_add, norm_gated, norm_qkv_heads, norm_qkv_heads_joint, Dense, JointHeads, Linear,
    NormQkv, Quantized, MAX_FUSED_ROWS,
};
pub use stack::{decoder_stack, StackBlock};
pub use tail::{attention_mlp, attention_mlp_qkv};

use crate::fast::{float_from_mlx, float_on_mlx, rms_norm, swiglu, RotaryEmbedding};
use crate::interop::to_mlx;
use crate::native::cpu_layers;
use crate::tensor::{MlxTensor, OrPanic};
use crate::MlxDevice;
use burn_tensor::backend::Backend;
use burn_tensor::module::attention;
use burn_tensor::ops::AttentionModuleOptions;
use burn_tensor::{Int, Tensor};
use mlx_rs::Array;
use std::sync::atomic::{AtomicU8, Ordering};

/// A position or a length: known on the host, or held by a one-element integer tensor.
#[derive(Debug, Clone)]
pub enum At<B: Backend> {
    /// Known on the host.
    Host(usize),
    /// `[1]`, on the device: read by the kernels (or the composed ops) at run time.
    Device(Tensor<B, 1, Int>),
}

impl<B: Backend> At<B> {
    /// The value as an MLX integer array `[1]`. A host value's array is a view into
    /// [`position_table`] (made on the device, so no host memory is read), made once and reused
    /// while it is among the last few values asked for: every layer of a decode step reads the
    /// same position.
    fn array(&self) -> Array {
        match self {
            At::Host(v) => {
                thread_local! {
                    static RECENT: std::cell::RefCell<Vec<(usize, Array)>> =
                        const { std::cell::RefCell::new(Vec::new()) };
                }
                RECENT.with(|cell| {
                    let mut recent = cell.borrow_mut();
                    if let Some((_, a)) = recent.iter().find(|(k, _)| k == v) {
                        return a.clone();
                    }
                    let a = position_table(*v);
                    recent.insert(0, (*v, a.clone()));
                    recent.truncate(4);
                    a
                })
            }
            At::Device(t) => {
                to_mlx(t.clone())
                    .unwrap_or_else(|_| unreachable!("called only when B is Mlx"))
                    .array
            }
        }
    }
}

/// `[v]` as an `int32` MLX array in device memory: element `v` of a table `0, 1, ..., n - 1`
/// made on the device (made again, twice as long, when `v` passes its end), as a one-element
/// view that no kernel copies.
///
/// Why not `Array::from_slice(&[v])`: on MLX's CUDA backend an array of 8 bytes or less made on
/// the host lives in a small pool of managed memory, where MLX also puts every scalar the host
/// makes. While the host builds the next step, each such write moves the pool's pages back to
/// the host, and a kernel reading the position then stalls on a page fault: 35 us a fault on an
/// H200, which made the fused layer kernel 2.3x slower inside a decode loop than on its own.
fn position_table(v: usize) -> Array {
    thread_local! {
        static TABLE: std::cell::RefCell<Option<(usize, Array)>> =
            const { std::cell::RefCell::new(None) };
    }
    TABLE.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|(len, _)| v >= *len) {
            // Evaluated now, so that every later step reads it as data. Where that is not
            // allowed (inside a function MLX is tracing, whose call already holds the evaluation
            // lock), the position is a host array.
            if crate::trace::is_tracing() {
                return Array::from_slice(&[v as i32], &[1]);
            }
            let len = (v + 1).next_power_of_two().max(8192);
            let table = mlx_rs::ops::arange::<_, i32>(0, len as i32, 1).and_then(|t| {
                let _guard = crate::tensor::eval_lock();
                t.eval().map(|()| t)
            });
            match table {
                Ok(t) => *slot = Some((len, t)),
                Err(_) => return Array::from_slice(&[v as i32], &[1]),
            }
        }
        let (_, table) = slot.as_ref().expect("made above");
        let at = v as i32;
        crate::native::slice(table, &[at], &[at + 1], &[1]).or_panic("decode position table", &[])
    })
}

/// A zeroed cache buffer of `shape` (`[rows, 2·kv_heads, capacity, head_dim]` for the keys and
/// values side by side) that the CUDA kernels may write new positions into in place
/// ([`NormQkv::cache`]): on MLX, a buffer of its own, made now; elsewhere `Tensor::zeros`.
///
/// A cache written in place is shared by every handle to it: a handle kept from an earlier
/// step sees the positions written since (positions before its step's are never rewritten).
pub fn cache_buffer<B: Backend>(
    shape: [usize; 4],
    device: &B::Device,
    dtype: burn_tensor::DType,
) -> Tensor<B, 4> {
    let zeros = Tensor::<B, 4>::zeros(shape, (device, dtype));
    match float_on_mlx(zeros) {
        Ok(t) => {
            // Evaluated now: a buffer of its own, whatever shares the zeros' lazy form.
            if !crate::trace::is_tracing() {
                t.eval().or_panic("cache_buffer", &[&t.array]);
            }
            float_from_mlx(t)
        }
        Err(zeros) => zeros,
    }
}

/// The MLX array of `cache` when a kernel launched for `rows` (an input of that kernel) may write
/// keys and values into it at `offset` in place: `[rows, heads, capacity, head_dim]` (`shape`
/// with any capacity) on the same device in the rows' dtype, laid out row-contiguous, with a
/// host offset inside the capacity, outside any MLX trace (a traced function's inputs stand for
/// the arrays of each later call, which the kernel must not write).
///
/// MLX reports an unevaluated array's strides as row-contiguous whatever its op will make, so
/// the layout check holds for what [`cache_buffer`] makes (evaluated) and for the results of
/// updating it (MLX's slice updates write row-contiguous buffers); a lazily broadcast or
/// transposed tensor passed as [`NormQkv::cache`] is outside that contract.
fn writable_cache<B: Backend>(
    cache: &Tensor<B, 4>,
    rows: &MlxTensor,
    [r, heads, d]: [usize; 3],
    offset: &At<B>,
) -> Option<Array> {
    if crate::trace::is_tracing() {
        return None;
    }
    let c = float_on_mlx(cache.clone()).ok()?;
    let [cr, ch, cap, cd] = cache.dims();
    let contiguous = c.array.strides() == [ch * cap * cd, cap * cd, cd, 1];
    let inside = match offset {
        At::Host(v) => *v < cap,
        At::Device(_) => true,
    };
    let fits = (cr, ch, cd) == (r, heads, d)
        && c.device == rows.device
        && c.quant.is_none()
        && c.array.dtype() == rows.array.dtype()
        && contiguous
        && inside;
    fits.then(|| c.array.clone())
}

/// The index of the largest value of each row of `logits` (`[rows, vocab]`), as `[rows, 1]`:
/// greedy decoding's next tokens. `logits.argmax(1)`, except on MLX's GPU, where it is MLX's
/// `argmax` alone: Burn's rule for NaN (a NaN wins only in the first position), which `argmax`
/// keeps there with five more ops and three host-made scalars, is left out, so a row holding a
/// NaN gives the position of one of its NaNs or of its largest number.
pub fn greedy_tokens<B: Backend>(logits: Tensor<B, 2>) -> Tensor<B, 2, Int> {
    match float_on_mlx(logits) {
        Ok(t) if t.device == MlxDevice::Gpu && t.quant.is_none() => {
            let idx = t
                .device
                .scope(|| {
                    mlx_rs::ops::indexing::argmax_axis(&t.array, 1, true)
                        .and_then(|i| i.as_dtype(mlx_rs::Dtype::Int64))
                })
                .or_panic("greedy_tokens", &[&t.array]);
            crate::interop::from_mlx(t.with(idx))
                .unwrap_or_else(|| unreachable!("the logits are on Mlx"))
        }
        Ok(t) => float_from_mlx(t).argmax(1),
        Err(logits) => logits.argmax(1),
    }
}

/// 0: not read yet; 1: off; 2: on.
static KERNELS: AtomicU8 = AtomicU8::new(0);

/// Whether the kernels (CUDA's, and the CPU primitives) run where they can (on by default;
/// `BURN_MLX_DECODE_KERNELS=0` turns them off).
pub fn kernels() -> bool {
    match KERNELS.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var("BURN_MLX_DECODE_KERNELS").map_or(true, |v| v != "0");
            KERNELS.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
        v => v == 2,
    }
}

/// Turns the kernels (CUDA's, and the CPU primitives) on or off for the process (the composed
/// path is used when off).
pub fn set_kernels(on: bool) {
    KERNELS.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// Whether the kernels can run for `t`: a float MLX tensor on the CUDA device, outside a trace
/// for a function file (which holds only MLX's own primitives; a compiled function may hold
/// custom kernels).
fn on_cuda(t: &MlxTensor) -> bool {
    cfg!(target_os = "linux")
        && t.device == MlxDevice::Gpu
        && t.quant.is_none()
        && kernels()
        && !crate::trace::is_exporting()
        && cuda::float_dtype(t.array.dtype())
}

/// The MLX tensor behind `x` when the kernels can run for it; `x` back otherwise.
fn kernel_input<B: Backend, const D: usize>(x: Tensor<B, D>) -> Result<MlxTensor, Tensor<B, D>> {
    match float_on_mlx(x) {
        Ok(t) if on_cuda(&t) => Ok(t),
        Ok(t) => Err(float_from_mlx(t)),
        Err(x) => Err(x),
    }
}

/// The MLX tensor behind `x` when burn-mlx's CPU primitives can run for it (`mlx-sys/
/// cpu_layers.cpp`: a float MLX tensor on MLX's CPU device, with [`kernels`] on, outside a trace
/// for a function file); `x` back otherwise.
fn cpu_input<B: Backend, const D: usize>(x: Tensor<B, D>) -> Result<MlxTensor, Tensor<B, D>> {
    match float_on_mlx(x) {
        Ok(t)
            if t.device == MlxDevice::Cpu
                && t.quant.is_none()
                && kernels()
                && !crate::trace::is_exporting()
                && cuda::float_dtype(t.array.dtype()) =>
        {
            Ok(t)
        }
        Ok(t) => Err(float_from_mlx(t)),
        Err(x) => Err(x),
    }
}

/// The MLX array behind a float tensor of the same backend as a kernel input.
fn array_of<B: Backend, const D: usize>(t: &Tensor<B, D>) -> Array {
    float_on_mlx(t.clone())
        .unwrap_or_else(|_| unreachable!("same backend as the kernel input"))
        .array
}

/// `h = x + residual` and `rms_norm(h, weight, eps)` (see [`crate::fast::rms_norm`]): a
/// pre-norm block's residual connection and the norm of the next block, as `(h, normed)`.
///
/// # Panics
///
/// When `x` and `residual` differ in shape, or `weight` is not as long as their last axis.
pub fn add_rms_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    residual: Tensor<B, D>,
    weight: Tensor<B, 1>,
    eps: f64,
) -> (Tensor<B, D>, Tensor<B, D>) {
    let dims = x.dims();
    assert_eq!(
        dims,
        residual.dims(),
        "add_rms_norm: x is {dims:?}, residual {:?}; they must have one shape",
        residual.dims()
    );
    assert_eq!(
        weight.dims()[0],
        dims[D - 1],
        "add_rms_norm: weight has {} values, the rows {}",
        weight.dims()[0],
        dims[D - 1]
    );
    let x = match kernel_input(x) {
        Ok(t) if t.array.dtype() == array_of(&residual).dtype() => {
            let (r, w) = (array_of(&residual), array_of(&weight));
            let (h, y) = t
                .device
                .scope(|| cuda::add_rms_norm(&t.array, &r, &w, &dims, eps as f32))
                .or_panic("add_rms_norm", &[&t.array, &r]);
            return (float_from_mlx(t.with(h)), float_from_mlx(t.with(y)));
        }
        Ok(t) => float_from_mlx(t),
        Err(x) => x,
    };
    let h = x + residual;
    (h.clone(), rms_norm(h, weight, eps))
}

/// The head layout of a fused QKV projection's output: `heads` query heads, then `kv_heads`
/// key heads, then `kv_heads` value heads, each `head_dim` wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QkvLayout {
    /// Query heads.
    pub heads: usize,
    /// Key (and value) heads.
    pub kv_heads: usize,
    /// Size of a head.
    pub head_dim: usize,
}

impl QkvLayout {
    /// `(heads + 2 · kv_heads) · head_dim`, the width of the fused projection's output.
    pub fn width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }
}

/// Splits `qkv` (`[batch·seq, width]`: `batch` sequences of `seq` positions each, row by row,
/// whose positions start at `offset`) into query, key and value heads, `[batch, heads, seq,
/// head_dim]` each; normalizes each query and key head with `norms` (RMS norm with the query and
/// key weights, `[head_dim]`, as Qwen3 and Gemma 3 do) and rotates them with `rope`.
///
/// # Panics
///
/// When `qkv`'s width is not `layout.width()`, its rows are not a multiple of `batch`, or `rope`
/// is for another head size.
pub fn qkv_heads<B: Backend>(
    qkv: Tensor<B, 2>,
    batch: usize,
    layout: QkvLayout,
    norms: Option<(&Tensor<B, 1>, &Tensor<B, 1>)>,
    eps: f64,
    rope: &RotaryEmbedding<B>,
    offset: &At<B>,
) -> [Tensor<B, 4>; 3] {
    let mut out = heads(qkv, batch, layout, norms, eps, rope, offset, false).into_iter();
    let mut next = || out.next().expect("three outputs");
    [next(), next(), next()]
}

/// [`qkv_heads`] with the keys and values in one tensor, `[batch, 2 · kv_heads, seq, head_dim]`
/// (keys, then values): what a cache that holds both in one buffer writes with one update
/// ([`decode_attention_joint`]). Returns `[queries, keys and values]`.
///
/// # Panics
///
/// As [`qkv_heads`].
pub fn qkv_heads_joint<B: Backend>(
    qkv: Tensor<B, 2>,
    batch: usize,
    layout: QkvLayout,
    norms: Option<(&Tensor<B, 1>, &Tensor<B, 1>)>,
    eps: f64,
    rope: &RotaryEmbedding<B>,
    offset: &At<B>,
) -> [Tensor<B, 4>; 2] {
    let mut out = heads(qkv, batch, layout, norms, eps, rope, offset, true).into_iter();
    let mut next = || out.next().expect("two outputs");
    [next(), next()]
}

/// [`qkv_heads`] and [`qkv_heads_joint`].
#[allow(clippy::too_many_arguments)]
fn heads<B: Backend>(
    qkv: Tensor<B, 2>,
    batch: usize,
    layout: QkvLayout,
    norms: Option<(&Tensor<B, 1>, &Tensor<B, 1>)>,
    eps: f64,
    rope: &RotaryEmbedding<B>,
    offset: &At<B>,
    joint: bool,
) -> Vec<Tensor<B, 4>> {
    let [rows, width] = qkv.dims();
    assert!(
        batch > 0 && rows.is_multiple_of(batch),
        "qkv_heads: {rows} rows do not split into {batch} sequences"
    );
    let seq = rows / batch;
    let QkvLayout {
        heads: hq,
        kv_heads: hkv,
        head_dim: d,
    } = layout;
    assert_eq!(
        width,
        layout.width(),
        "qkv_heads: the projection is {width} wide, the layout ({hq} + 2·{hkv} heads of {d}) \
         needs {}",
        layout.width()
    );
    assert_eq!(
        rope.head_dim(),
        d,
        "qkv_heads: the rotary embedding is for heads of {}, the layout's are {d}",
        rope.head_dim()
    );
    let qkv = match kernel_input(qkv) {
        Ok(t) => {
            let norm_arrays = norms.map(|(q, k)| (array_of(q), array_of(k)));
            let freqs = array_of(rope.inverse_frequencies());
            let pos = offset.array();
            let out = t
                .device
                .scope(|| {
                    cuda::qkv_norm_rope(
                        &t.array,
                        batch,
                        [hq, hkv, d],
                        norm_arrays.as_ref().map(|(q, k)| (q, k)),
                        eps as f32,
                        &freqs,
                        &pos,
                        joint,
                    )
                })
                .or_panic("qkv_heads", &[&t.array]);
            return out.into_iter().map(|a| float_from_mlx(t.with(a))).collect();
        }
        Err(qkv) => qkv,
    };
    let qkv = match cpu_input(qkv) {
        Ok(t) => {
            let none = || array_of(rope.inverse_frequencies());
            let (qw, kw) =
                norms.map_or_else(|| (none(), none()), |(q, k)| (array_of(q), array_of(k)));
            let freqs = array_of(rope.inverse_frequencies());
            let pos = offset.array();
            let params = cpu_layers::QkvHeads {
                batch,
                heads: [hq, hkv, d],
                eps: eps as f32,
                norm: norms.is_some(),
                joint,
            };
            let out = t
                .device
                .scope(|| cpu_layers::qkv_heads(&t.array, [&qw, &kw], &freqs, &pos, params))
                .or_panic("qkv_heads", &[&t.array]);
            return out.into_iter().map(|a| float_from_mlx(t.with(a))).collect();
        }
        Err(qkv) => qkv,
    };
    let heads_first = |t: Tensor<B, 2>, heads: usize| {
        if seq == 1 {
            t.reshape([batch, heads, 1, d])
        } else {
            t.reshape([batch, seq, heads, d]).swap_dims(1, 2)
        }
    };
    let q = heads_first(qkv.clone().narrow(1, 0, hq * d), hq);
    let k = heads_first(qkv.clone().narrow(1, hq * d, hkv * d), hkv);
    let v = heads_first(qkv.narrow(1, (hq + hkv) * d, hkv * d), hkv);
    let (q, k) = match norms {
        Some((qw, kw)) => (rms_norm(q, qw.clone(), eps), rms_norm(k, kw.clone(), eps)),
        None => (q, k),
    };
    let (q, k) = match offset {
        At::Host(o) => (rope.apply(q, *o), rope.apply(k, *o)),
        At::Device(o) => (rope.apply_at(q, o.clone()), rope.apply_at(k, o.clone())),
    };
    if joint {
        vec![q, Tensor::cat(vec![k, v], 1)]
    } else {
        vec![q, k, v]
    }
}

/// Attention of one query position per sequence (`q`: `[batch, heads, 1, head_dim]`) over the
/// first `len` positions of a key/value cache (`keys`, `values`: `[batch, kv_heads, capacity,
/// head_dim]`, `heads` a multiple of `kv_heads`), or over the last `window` of them: a decode
/// step's attention, whose query is the newest position. Returns `[batch, heads · head_dim]`.
///
/// With a device `len`, the shapes do not depend on it, so a traced step serves every position.
///
/// # Panics
///
/// When the shapes do not fit together, or a host `len` is 0 or more than the capacity.
pub fn decode_attention<B: Backend>(
    q: Tensor<B, 4>,
    keys: Tensor<B, 4>,
    values: Tensor<B, 4>,
    len: &At<B>,
    scale: f64,
    window: Option<usize>,
) -> Tensor<B, 2> {
    let [b, hq, s, d] = q.dims();
    let [kb, hkv, cap, kd] = keys.dims();
    assert!(
        s == 1 && kb == b && kd == d && hkv > 0 && hq % hkv == 0 && values.dims() == keys.dims(),
        "decode_attention: q {:?} (one position), keys {:?} and values {:?} (same batch and head \
         size, query heads a multiple of key heads) do not fit",
        q.dims(),
        keys.dims(),
        values.dims()
    );
    check_length("decode_attention", len, cap);
    let q = match attention_kernel(q, [&keys, &values], len, hkv, scale, window, false) {
        Ok(out) => return out,
        Err(q) => q,
    };
    let groups = hq / hkv;
    let options = AttentionModuleOptions {
        scale: Some(scale),
        softcap: None,
        is_causal: false,
    };
    // The query heads that share a key head are folded into the query axis: no copy of the
    // cache, no mask between them.
    let folded = q.reshape([b, hkv, groups, d]);
    let out = match len {
        At::Host(n) => {
            let start = window.map_or(0, |w| n.saturating_sub(w));
            let k = keys.narrow(2, start, n - start);
            let v = values.narrow(2, start, n - start);
            attention(folded, k, v, None, None, options)
        }
        At::Device(n) => {
            let device = keys.device();
            let positions = Tensor::<B, 1, Int>::arange(0..cap as i64, &device).unsqueeze::<2>();
            let n = n.clone().unsqueeze::<2>().expand([1, cap]);
            let mut hidden = positions.clone().greater_equal(n.clone());
            if let Some(w) = window {
                hidden = hidden.bool_or((positions + w as i64).lower(n));
            }
            let bias = Tensor::<B, 2>::zeros([1, cap], (&device, keys.dtype()))
                .mask_fill(hidden, f32::NEG_INFINITY)
                .reshape([1, 1, 1, cap])
                .expand([b, hkv, groups, cap]);
            attention(folded, keys, values, None, Some(bias), options)
        }
    };
    out.reshape([b, hq * d])
}

/// [`decode_attention`] over a cache that holds keys and values in one buffer, `kv`: `[batch,
/// 2 · kv_heads, capacity, head_dim]`, keys then values (as [`qkv_heads_joint`] makes them).
///
/// # Panics
///
/// As [`decode_attention`].
pub fn decode_attention_joint<B: Backend>(
    q: Tensor<B, 4>,
    kv: Tensor<B, 4>,
    len: &At<B>,
    scale: f64,
    window: Option<usize>,
) -> Tensor<B, 2> {
    let [b, hq, s, d] = q.dims();
    let [kb, heads, cap, kd] = kv.dims();
    let hkv = heads / 2;
    assert!(
        s == 1 && kb == b && kd == d && heads % 2 == 0 && hkv > 0 && hq % hkv == 0,
        "decode_attention_joint: q {:?} (one position) and kv {:?} (keys then values: an even \
         number of heads, query heads a multiple of half of them) do not fit",
        q.dims(),
        kv.dims()
    );
    check_length("decode_attention_joint", len, cap);
    let q = match attention_kernel(q, [&kv, &kv], len, hkv, scale, window, true) {
        Ok(out) => return out,
        Err(q) => q,
    };
    let (keys, values) = (kv.clone().narrow(1, 0, hkv), kv.narrow(1, hkv, hkv));
    decode_attention(q, keys, values, len, scale, window)
}

/// Checks that a host length lies in `1..=capacity` (the message names `op`).
fn check_length<B: Backend>(op: &str, len: &At<B>, capacity: usize) {
    if let At::Host(n) = len {
        assert!(
            *n >= 1 && *n <= capacity,
            "{op}: length {n} is outside the cache's 1..={capacity} positions"
        );
    }
}

/// The CUDA kernel of [`decode_attention`] (two buffers) and [`decode_attention_joint`] (one
/// buffer, given twice, with `joint`) when it can run for `q` (head sizes that are multiples of
/// 32, up to 256); `q` back otherwise.
fn attention_kernel<B: Backend>(
    q: Tensor<B, 4>,
    [keys, values]: [&Tensor<B, 4>; 2],
    len: &At<B>,
    hkv: usize,
    scale: f64,
    window: Option<usize>,
    joint: bool,
) -> Result<Tensor<B, 2>, Tensor<B, 4>> {
    let [b, hq, _, d] = q.dims();
    match kernel_input(q) {
        Ok(t) if d % 32 == 0 && d <= 256 => {
            let (k, v) = (array_of(keys), array_of(values));
            let n = len.array();
            let dims = [b, hq, hkv, d];
            let out = t
                .device
                .scope(|| {
                    let w = window.unwrap_or(0);
                    cuda::decode_attention(&t.array, &k, &v, &n, dims, scale as f32, w, joint)
                })
                .or_panic("decode_attention", &[&t.array, &k]);
            Ok(float_from_mlx(t.with(out)))
        }
        Ok(t) => Err(float_from_mlx(t)),
        Err(q) => match cpu_input(q) {
            Ok(t) => {
                let (k, v) = (array_of(keys), array_of(values));
                let n = len.array();
                let out = t
                    .device
                    .scope(|| {
                        let w = window.unwrap_or(0);
                        let dims = [b, hq, hkv, d];
                        cpu_layers::decode_attention(
                            &t.array,
                            &k,
                            &v,
                            &n,
                            dims,
                            scale as f32,
                            w,
                            joint,
                        )
                    })
                    .or_panic("decode_attention", &[&t.array, &k]);
                Ok(float_from_mlx(t.with(out)))
            }
            Err(q) => Err(q),
        },
    }
}

/// Whether this crate's CUDA kernels run for tensors of backend `B` on `device` (the CUDA device
/// of `Mlx`, with [`kernels`] on): a caller can then pick the layouts they are fastest with, such
/// as one buffer for a layer's cached keys and values, written in place. (The CPU primitives
/// take either layout and write no cache in place.)
pub fn kernels_run<B: Backend>(device: &B::Device) -> bool {
    let any: &dyn std::any::Any = device;
    std::any::TypeId::of::<B>() == std::any::TypeId::of::<crate::Mlx>()
        && cfg!(target_os = "linux")
        && any.downcast_ref::<MlxDevice>() == Some(&MlxDevice::Gpu)
        && kernels()
}

/// The activation of a gated MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// `silu(gate) · up` (Llama, Qwen).
    Silu,
    /// `gelu_tanh(gate) · up` (Gemma).
    GeluTanh,
}

/// `act(gate) · up` for `gate_up` (`[rows, 2·i]`: the gate's `i` columns, then the up
/// projection's), the output of a fused gate/up projection; `[rows, i]`.
///
/// # Panics
///
/// When `gate_up`'s width is odd.
pub fn gated<B: Backend>(gate_up: Tensor<B, 2>, gate: Gate) -> Tensor<B, 2> {
    let [_, width] = gate_up.dims();
    assert!(
        width % 2 == 0,
        "gated: the gate/up projection's width {width} is odd"
    );
    let i = width / 2;
    let gate_up = match kernel_input(gate_up) {
        Ok(t) => {
            let out = t
                .device
                .scope(|| cuda::gated(&t.array, gate == Gate::GeluTanh))
                .or_panic("gated", &[&t.array]);
            return float_from_mlx(t.with(out));
        }
        Err(x) => x,
    };
    let gate_up = match cpu_input(gate_up) {
        Ok(t) => {
            let out = t
                .device
                .scope(|| cpu_layers::gated(&t.array, gate == Gate::GeluTanh))
                .or_panic("gated", &[&t.array]);
            return float_from_mlx(t.with(out));
        }
        Err(x) => x,
    };
    let (g, up) = (gate_up.clone().narrow(1, 0, i), gate_up.narrow(1, i, i));
    match gate {
        Gate::Silu => swiglu(g, up),
        Gate::GeluTanh => gelu_tanh(g) * up,
    }
}

/// GELU in its tanh form: `x/2 · (1 + tanh(sqrt(2/π) · (x + 0.044715 x³)))`.
pub fn gelu_tanh<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let inner =
        (x.clone() + x.clone().powi_scalar(3) * 0.044715) * (2.0 / std::f64::consts::PI).sqrt();
    x * (inner.tanh() + 1.0) * 0.5
}

#[cfg(test)]
mod tests {
    use super::position_table;
    use crate::device::MlxDevice;
    use mlx_rs::Dtype;

    /// Each position is a one-element `int32` view holding its value, past the table's first
    /// length (which makes it again, longer) and back below it.
    #[test]
    fn positions_are_views_of_the_table() {
        MlxDevice::Cpu.scope(|| {
            for v in [0, 1, 511, 8191, 8192, 20_000, 3] {
                let a = position_table(v);
                a.eval().unwrap();
                assert_eq!(a.shape(), [1], "position {v}");
                assert_eq!(a.dtype(), Dtype::Int32, "position {v}");
                assert_eq!(a.as_slice::<i32>(), [v as i32], "position {v}");
            }
        });
    }
}
