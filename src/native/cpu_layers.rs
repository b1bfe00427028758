//! burn-mlx's CPU primitives for a transformer layer's pieces (`mlx-sys/cpu_layers.cpp`): RMS
//! norm and RoPE (which MLX's CPU backend runs as a dozen small ops each), and a decode step's
//! QKV heads, attention and gated activation. Each runs on the thread's default stream; errors
//! carry MLX's message.

use super::array::{fast_last_error, fast_op};
use super::init;
use crate::error::MlxError;
use mlx_rs::{Array, Stream};

/// RMS norm of `x` over its last axis with `weight` (`[n]`) and `eps`: one burn-mlx primitive
/// for float dtypes on a CPU stream (unless `BURN_MLX_CPU_KERNELS=0`), MLX's `fast::rms_norm`
/// otherwise.
pub(crate) fn rms_norm(
    x: &Array,
    weight: &Array,
    eps: f32,
) -> Result<Array, mlx_rs::error::Exception> {
    // SAFETY: the inputs are live for the call.
    fast_op("rms_norm", |res, s| unsafe {
        mlx_sys::burn_mlx_rms_norm(res, x.as_ptr(), weight.as_ptr(), eps, s)
    })
}

/// "Rotate half" RoPE of `x` (`[..., seq, d]`) over its last axis, row `s` at position `offset
/// + s` (`offset`: an integer array of one element): one burn-mlx primitive with the inverse
/// frequencies `inverse_frequencies` (`[d/2]`) for float dtypes on a CPU stream (unless
/// `BURN_MLX_CPU_KERNELS=0`), MLX's `fast::rope` with `periods` (their reciprocals) otherwise.
pub(crate) fn rope(
    x: &Array,
    inverse_frequencies: &Array,
    periods: &Array,
    offset: &Array,
) -> Result<Array, mlx_rs::error::Exception> {
    // SAFETY: the inputs are live for the call.
    fast_op("rope", |res, s| unsafe {
        mlx_sys::burn_mlx_rope(
            res,
            x.as_ptr(),
            inverse_frequencies.as_ptr(),
            periods.as_ptr(),
            offset.as_ptr(),
            s,
        )
    })
}

/// The layout and options of [`qkv_heads`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct QkvHeads {
    /// Sequences in the rows.
    pub batch: usize,
    /// Query heads, key (and value) heads, head size.
    pub heads: [usize; 3],
    /// The query/key norms' epsilon.
    pub eps: f32,
    /// Whether the query and key heads are RMS-normalized.
    pub norm: bool,
    /// Keys and values as one output (keys, then values).
    pub joint: bool,
}

/// The query, key and value heads of a fused QKV projection's output `qkv` (`[batch·seq, (hq +
/// 2·hkv)·d]`) on a CPU stream: `[q, k, v]`, or `[q, kv]` when joint, heads first; query and
/// key heads normalized with `qw`, `kw` when `norm`, and rotated at positions `pos + s`.
pub(crate) fn qkv_heads(
    qkv: &Array,
    [qw, kw]: [&Array; 2],
    freqs: &Array,
    pos: &Array,
    p: QkvHeads,
) -> Result<Vec<Array>, MlxError> {
    init();
    let stream = Stream::thread_local_or_default();
    let [hq, hkv, d] = p.heads.map(|v| v as i32);
    // SAFETY: the inputs are live for the call; `res` is a fresh vector that the entry fills
    // and that is freed here after its arrays get handles of their own.
    unsafe {
        let mut res = mlx_sys::mlx_vector_array_new();
        let rc = mlx_sys::burn_mlx_cpu_qkv_heads(
            &mut res,
            qkv.as_ptr(),
            qw.as_ptr(),
            kw.as_ptr(),
            freqs.as_ptr(),
            pos.as_ptr(),
            p.batch as i32,
            hq,
            hkv,
            d,
            p.eps,
            p.norm,
            p.joint,
            stream.as_ptr(),
        );
        let out = if rc == 0 {
            Ok(super::custom_vjp::read(res))
        } else {
            Err(MlxError::mlx("qkv_heads", fast_last_error()))
        };
        mlx_sys::mlx_vector_array_free(res);
        out
    }
}

/// Attention of one query position (`q`: `[batch, hq, 1, d]`) over the first `len` positions
/// of `keys` and `values` (`[batch, hkv, capacity, d]`; with `joint`, one buffer `[batch,
/// 2·hkv, capacity, d]` given twice), the last `window` of them when `window > 0`, on a CPU
/// stream: `[batch, hq·d]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_attention(
    q: &Array,
    keys: &Array,
    values: &Array,
    len: &Array,
    [b, hq, hkv, d]: [usize; 4],
    scale: f32,
    window: usize,
    joint: bool,
) -> Result<Array, mlx_rs::error::Exception> {
    // SAFETY: the inputs are live for the call.
    fast_op("decode_attention", |res, s| unsafe {
        mlx_sys::burn_mlx_cpu_decode_attention(
            res,
            q.as_ptr(),
            keys.as_ptr(),
            values.as_ptr(),
            len.as_ptr(),
            b as i32,
            hq as i32,
            hkv as i32,
            d as i32,
            scale,
            window as i32,
            joint,
            s,
        )
    })
}

/// `act(gate) · up` of `gu` (`[rows, 2·i]`) on a CPU stream, GELU's tanh form with `gelu`,
/// SiLU otherwise: `[rows, i]`.
pub(crate) fn gated(gu: &Array, gelu: bool) -> Result<Array, mlx_rs::error::Exception> {
    // SAFETY: the input is live for the call.
    fast_op("gated", |res, s| unsafe {
        mlx_sys::burn_mlx_cpu_gated(res, gu.as_ptr(), gelu, s)
    })
}
