//! The CUDA kernels of [`super`]: their sources, and their launches through MLX's custom
//! kernels (`native::kernel`). Each is one MLX primitive. Values that change from one call to
//! the next (positions, lengths) are integer arrays read on the device; shapes and constants
//! that are fixed for a model (head counts, sizes, `eps`, the attention scale) are template
//! arguments, so MLX compiles each kernel once per model. Floats go in as their bit patterns
//! (`__int_as_float`), since template arguments are integers.

use crate::error::MlxError;
use crate::native::kernel::{self, CudaKernel, TemplateArg};
use mlx_rs::{Array, Dtype};
use std::cell::RefCell;

/// Entries of [`counters`].
pub(super) const COUNTERS: usize = 1024;

/// The thread's kernel counters: `u64`s on the GPU that kernels increment in place, each launch
/// by the same amount whatever its shape, so a launch finds each a multiple of that amount and
/// needs no zeroed memory. Entry 0 is `attention_mlp`'s grid barrier (the grid's size per barrier,
/// one block per multiprocessor); entries from 8 count the finished parts of each head
/// of `norm_qkv_heads` (64 a launch, shared among the head's parts); entries from 512 count the
/// next block's heads of `attention_mlp_qkv` (the head size a launch, topped up to a multiple of
/// 1,024 by the warp that finishes the head). 8 KiB: MLX serves arrays of 8 bytes or less
/// from managed memory advised as read-mostly, where each atomic update would move the page.
pub(super) fn counters() -> Result<Array, MlxError> {
    thread_local! {
        static COUNTERS_ARRAY: RefCell<Option<Array>> = const { RefCell::new(None) };
    }
    COUNTERS_ARRAY.with(|cell| {
        let mut slot = cell.borrow_mut();
        if let Some(a) = slot.as_ref() {
            return Ok(a.clone());
        }
        let fail = |e| MlxError::mlx("decode kernel counters", e);
        let a = mlx_rs::ops::zeros_dtype(&[COUNTERS as i32], Dtype::Uint64).map_err(fail)?;
        a.eval().map_err(fail)?;
        *slot = Some(a.clone());
        Ok(a)
    })
}

thread_local! {
    /// An output of the thread's last launch that took [`counted_inputs`], outside any trace.
    static LAST_COUNTED: RefCell<Option<Array>> = const { RefCell::new(None) };
}

/// The inputs `sync` and `after` of a kernel that uses the thread's [`counters`]: the counters,
/// and an output of the thread's previous such launch (the counters again inside an MLX trace,
/// or for the thread's first launch). The kernel does not read `after`; as its input it makes
/// MLX order the launch after the previous one. MLX orders the nodes of its CUDA graphs only by
/// the arrays they read and write, so two independent kernels could run at once: a grid-wide
/// barrier then waits for blocks that cannot become resident while the other kernel's blocks
/// spin, and two launches counting one head would miscount it.
pub(super) fn counted_inputs() -> Result<[Array; 2], MlxError> {
    let counters = counters()?;
    let after = if crate::trace::is_tracing() {
        None
    } else {
        LAST_COUNTED.with(|cell| cell.borrow().clone())
    };
    let after = after.unwrap_or_else(|| counters.clone());
    Ok([counters, after])
}

/// Records `out`, an output of a launch that took [`counted_inputs`], as the array that the
/// thread's next such launch waits for (not inside a trace, whose arrays stand for values of a
/// later call).
pub(super) fn counted(out: &Array) {
    if !crate::trace::is_tracing() {
        LAST_COUNTED.with(|cell| *cell.borrow_mut() = Some(out.clone()));
    }
}

/// Warp and block reductions shared by the kernels.
pub(super) const HEADER: &str = r#"
__device__ __forceinline__ float bm_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The sum of `v` over the block (at most 32 warps); every thread gets it.
__device__ __forceinline__ float bm_block_sum(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = bm_warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  float total = 0.f;
  for (int w = 0; w < warps; ++w) total += shared[w];
  return total;
}

// One lane's E values of a key or value row, held as raw words: loaded with one or two
// vector loads when the row's values are consecutive and aligned (the caches' layout), else
// value by value.
template <int BYTES> struct bm_word { typedef unsigned short type; };
template <> struct bm_word<4> { typedef unsigned int type; };
template <> struct bm_word<8> { typedef uint2 type; };
template <> struct bm_word<16> { typedef uint4 type; };
template <typename T, int E>
struct bm_row {
  static constexpr int BYTES = E * (int)sizeof(T);
  static constexpr int WB = BYTES % 16 == 0 ? 16 : BYTES % 8 == 0 ? 8 : BYTES % 4 == 0 ? 4 : 2;
  typedef typename bm_word<WB>::type W;
  W w[BYTES / WB];
  __device__ __forceinline__ void load(const T* p, long es, bool vec) {
    if (vec) {
#pragma unroll
      for (int i = 0; i < BYTES / WB; ++i) w[i] = reinterpret_cast<const W*>(p)[i];
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) reinterpret_cast<T*>(w)[e] = p[e * es];
    }
  }
  __device__ __forceinline__ float at(int e) const {
    return static_cast<float>(reinterpret_cast<const T*>(w)[e]);
  }
};

// Whether rows at `p`, `p + ts`, ... can be loaded by bm_row's vector loads.
template <typename T, int E>
__device__ __forceinline__ bool bm_rows_vec(const T* p, long ts, long es) {
  constexpr int WB = bm_row<T, E>::WB;
  return es == 1 && reinterpret_cast<unsigned long long>(p) % WB == 0 &&
         (ts * (long)sizeof(T)) % WB == 0;
}

// The keys (and with VALUES the values) of positions t0 .. t0 + U - 1 below `hi` (others are
// left unloaded).
template <typename T, int E, int U, bool VALUES>
__device__ __forceinline__ void bm_attend_load(const T* kb, const T* vb, long ts, long es, bool vec,
                                               int t0, int hi, bm_row<T, E> (&kr)[U],
                                               bm_row<T, E> (&vr)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (t0 + u < hi) {
      kr[u].load(kb + (long)(t0 + u) * ts, es, vec);
      if (VALUES) vr[u].load(vb + (long)(t0 + u) * ts, es, vec);
    }
  }
}

// One warp's online softmax over positions first, first + STEP, ... (U at a time) below `hi`:
// this lane's E query values `qr` (scaled) against the keys at `kb` and the values at `vb`
// (position t at t·ts, this lane's values es apart). Updates the running maximum `m`, the sum
// `l` (every lane holds them) and this lane's E weighted value sums `acc`. Where a lane's part of
// a row is at most 16 bytes (JOINT) the keys and values of a run are loaded together, so a warp
// waits on memory once a run, not twice (larger rows, f32 heads of 256, would take blocks of 16
// warps past their 128 registers a thread); with NEXT the next run's are loaded while this one is
// summed, at the cost of U·E·sizeof(T) more registers (by default only where a lane's part of a
// row is at most 8 bytes).
template <typename T, int E, int U, int STEP, bool NEXT = (E * sizeof(T) <= 8)>
__device__ __forceinline__ void bm_attend(const float (&qr)[E], const T* kb, const T* vb, long ts,
                                          long es, int first, int hi, float& m, float& l,
                                          float (&acc)[E]) {
  constexpr bool JOINT = NEXT || E * sizeof(T) <= 16;
  const bool vec = bm_rows_vec<T, E>(kb, ts, es) && bm_rows_vec<T, E>(vb, ts, es);
  bm_row<T, E> kr[U], vr[U];
  if (NEXT) bm_attend_load<T, E, U, true>(kb, vb, ts, es, vec, first, hi, kr, vr);
  for (int t0 = first; t0 < hi; t0 += STEP) {
    bm_row<T, E> kn[U], vn[U];
    if (NEXT) {
      bm_attend_load<T, E, U, true>(kb, vb, ts, es, vec, t0 + STEP, hi, kn, vn);
    } else {
      bm_attend_load<T, E, U, JOINT>(kb, vb, ts, es, vec, t0, hi, kr, vr);
    }
    float s[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      s[u] = 0.f;
      if (t0 + u < hi) {
#pragma unroll
        for (int e = 0; e < E; ++e) s[u] += qr[e] * kr[u].at(e);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) s[u] = bm_warp_sum(s[u]);
    float m_new = m;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (t0 + u < hi) m_new = fmaxf(m_new, s[u]);
    }
    const float corr = expf(m - m_new);
    l *= corr;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] *= corr;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (t0 + u < hi) {
        const float p = expf(s[u] - m_new);
        l += p;
        if (!JOINT) vr[u].load(vb + (long)(t0 + u) * ts, es, vec);
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] += p * vr[u].at(e);
      }
    }
    m = m_new;
    if (NEXT) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        kr[u] = kn[u];
        vr[u] = vn[u];
      }
    }
  }
}
"#;

/// `h = x + r` (rounded to `T`), `y = h / sqrt(mean(h²) + eps) · w`: one block per row.
const ADD_RMS_NORM: &str = r#"
  __shared__ float shared[32];
  const size_t row = blockIdx.x;
  const T* xr = x + row * N;
  const T* rr = r + row * N;
  T* hr = h + row * N;
  T* yr = y + row * N;
  float ss = 0.f;
  for (int i = threadIdx.x; i < N; i += blockDim.x) {
    const T s = static_cast<T>(static_cast<float>(xr[i]) + static_cast<float>(rr[i]));
    hr[i] = s;
    const float f = static_cast<float>(s);
    ss += f * f;
  }
  const float total = bm_block_sum(ss, shared);
  const float inv = rsqrtf(total / N + __int_as_float(EPS));
  for (int i = threadIdx.x; i < N; i += blockDim.x) {
    yr[i] = static_cast<T>(static_cast<float>(hr[i]) * inv * static_cast<float>(w[i]));
  }
"#;

/// Splits `qkv` (`[rows, (HQ + 2·HKV)·D]`: `BATCH` sequences of `rows / BATCH` positions, row
/// `s` of a sequence at position `pos[0] + s`) into heads-first `q`, `k`, `v` (`[BATCH, HQ or
/// HKV, seq, D]`; or `q` and `kv`, `[BATCH, 2·HKV, seq, D]`, keys then values, where `K_OUT` and
/// `V_OUT` say, see [`qkv_outputs`]), normalizing each query and key head (RMS, with
/// `qw`/`kw`, when `NORM`) and rotating it ("rotate half" RoPE with inverse frequencies
/// `freqs`, `[D/2]`). One warp per (row, head).
const QKV_NORM_ROPE: &str = r#"
  constexpr int HEADS = HQ + 2 * HKV;
  constexpr int HALF = D / 2;
  constexpr int PER = (HALF + 31) / 32;
  const int rows = qkv_shape[0];
  const int seq = rows / BATCH;
  const int lane = threadIdx.x & 31;
  const int gw = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (gw >= rows * HEADS) return;
  const int row = gw / HEADS, head = gw % HEADS;
  const int bi = row / seq, s = row % seq;
  const T* src = qkv + (size_t)row * HEADS * D + (size_t)head * D;
  if (head >= HQ + HKV) {
    T* dst = V_OUT(head - HQ - HKV);
    for (int i = lane; i < D; i += 32) dst[i] = src[i];
    return;
  }
  const bool is_q = head < HQ;
  const int hh = is_q ? head : head - HQ;
  T* dst = is_q ? q + (((size_t)bi * HQ + hh) * seq + s) * D : K_OUT(hh);
  float a[PER], b[PER];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = lane + 32 * j;
    a[j] = 0.f;
    b[j] = 0.f;
    if (i < HALF) {
      a[j] = static_cast<float>(src[i]);
      b[j] = static_cast<float>(src[i + HALF]);
      ss += a[j] * a[j] + b[j] * b[j];
    }
  }
  if (NORM) {
    const float inv = rsqrtf(bm_warp_sum(ss) / D + __int_as_float(EPS));
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int i = lane + 32 * j;
      if (i < HALF) {
        const float wa = static_cast<float>(is_q ? qw[i] : kw[i]);
        const float wb = static_cast<float>(is_q ? qw[i + HALF] : kw[i + HALF]);
        a[j] = static_cast<float>(static_cast<T>(a[j] * inv * wa));
        b[j] = static_cast<float>(static_cast<T>(b[j] * inv * wb));
      }
    }
  }
  const float p = static_cast<float>(pos[0] + s);
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = lane + 32 * j;
    if (i < HALF) {
      float s, c;
      sincosf(p * static_cast<float>(freqs[i]), &s, &c);
      dst[i] = static_cast<T>(a[j] * c - b[j] * s);
      dst[i + HALF] = static_cast<T>(b[j] * c + a[j] * s);
    }
  }
"#;

/// One query position per (batch, head) over the first `len[0]` cached positions of `keys` and
/// `values` (each batch entry `HSTRIDE` heads of `cap` positions, the values' heads from `VOFF`:
/// two buffers, or one that holds keys then values) (the last
/// `WINDOW` of them when `WINDOW > 0`): `out = softmax(q·kᵀ·scale)·v`, with an online softmax
/// in f32. One block of 16 warps per (batch, query head); warp `w` takes positions in runs of
/// `U` (`w·U ..`, then `16·U` further), so that `U` keys and values are loaded at once; each
/// lane holds `D / 32` consecutive elements of a head vector. The warps' partial results are
/// combined through shared memory.
const DECODE_ATTENTION: &str = r#"
  constexpr int WARPS = 16;
  constexpr int U = 4;
  constexpr int E = D / 32;
  __shared__ float s_m[WARPS];
  __shared__ float s_l[WARPS];
  __shared__ float s_acc[WARPS][D];
  const float NEG_INF = -__int_as_float(0x7f800000);
  const int bh = blockIdx.x;
  const int b = bh / HQ, hq = bh % HQ;
  const int kvh = hq / (HQ / HKV);
  const int cap = keys_shape[2];
  int L = static_cast<int>(len[0]);
  L = L < cap ? L : cap;
  const int start = (WINDOW > 0 && L > WINDOW) ? L - WINDOW : 0;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const float scale = __int_as_float(SCALE);
  float qr[E];
  const T* qp = q + (size_t)bh * D + lane * E;
#pragma unroll
  for (int e = 0; e < E; ++e) qr[e] = static_cast<float>(qp[e]) * scale;
  const size_t kbase = ((size_t)b * HSTRIDE + kvh) * (size_t)cap * D + lane * E;
  const size_t vbase = ((size_t)b * HSTRIDE + VOFF + kvh) * (size_t)cap * D + lane * E;
  float m = NEG_INF, l = 0.f;
  float acc[E];
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
  bm_attend<T, E, U, WARPS * U>(qr, keys + kbase, values + vbase, D, 1, start + w * U, L, m, l,
                                acc);
  if (lane == 0) {
    s_m[w] = m;
    s_l[w] = l;
  }
#pragma unroll
  for (int e = 0; e < E; ++e) s_acc[w][lane * E + e] = acc[e];
  __syncthreads();
  float mx = NEG_INF;
  for (int i = 0; i < WARPS; ++i) mx = fmaxf(mx, s_m[i]);
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    float num = 0.f, den = 0.f;
    for (int i = 0; i < WARPS; ++i) {
      const float f = s_m[i] == NEG_INF ? 0.f : expf(s_m[i] - mx);
      num += f * s_acc[i][j];
      den += f * s_l[i];
    }
    out[(size_t)bh * D + j] = static_cast<T>(num / den);
  }
"#;

/// `y = act(gu[:, :I]) · gu[:, I:]` with `act` SiLU, or GELU's tanh form when `GELU`, in f32
/// and rounded once. One thread per output element.
const GATED: &str = r#"
  const size_t rows = gu_shape[0];
  const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= rows * I) return;
  const size_t r = idx / I, i = idx % I;
  const float g = static_cast<float>(gu[r * 2 * I + i]);
  const float u = static_cast<float>(gu[r * 2 * I + I + i]);
  float act;
  if (GELU) {
    act = 0.5f * g * (1.f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
  } else {
    act = g / (1.f + expf(-g));
  }
  y[idx] = static_cast<T>(act * u);
"#;

/// [`kernel::with_kernel`] with this module's helpers as the header.
fn with_kernel<T>(
    name: &'static str,
    inputs: &[&str],
    outputs: &[&str],
    source: impl FnOnce() -> String,
    f: impl FnOnce(&CudaKernel) -> T,
) -> T {
    kernel::with_kernel(name, inputs, outputs, source, HEADER, f)
}

/// Threads per block for a row of `n` values.
fn row_block(n: usize) -> i32 {
    match n {
        0..=1024 => 128,
        1025..=4096 => 256,
        _ => 512,
    }
}

pub(super) fn dims_i32(dims: &[usize]) -> Vec<i32> {
    dims.iter().map(|&d| d as i32).collect()
}

/// `(x + r, rms_norm(x + r) · w)` over rows of `n` values (`x`, `r`: `[rows, n]`).
pub(super) fn add_rms_norm(
    x: &Array,
    r: &Array,
    w: &Array,
    dims: &[usize],
    eps: f32,
) -> Result<(Array, Array), MlxError> {
    let n = *dims.last().expect("at least one axis");
    let rows: usize = dims[..dims.len() - 1].iter().product();
    let shape = dims_i32(dims);
    let dtype = x.dtype();
    let block = row_block(n);
    let mut out = with_kernel(
        "burn_mlx_add_rms_norm",
        &["x", "r", "w"],
        &["h", "y"],
        || ADD_RMS_NORM.to_string(),
        |k| {
            k.apply(
                &[x, r, w],
                &[(&shape, dtype), (&shape, dtype)],
                &[
                    TemplateArg::Dtype("T", dtype),
                    TemplateArg::Int("N", n as i32),
                    TemplateArg::Int("EPS", eps.to_bits() as i32),
                ],
                [rows as i32 * block, 1, 1],
                [block, 1, 1],
            )
        },
    )?;
    let y = out.pop().expect("two outputs");
    let h = out.pop().expect("two outputs");
    Ok((h, y))
}

/// Where [`QKV_NORM_ROPE`] writes key head `h` and value head `h` of position `s` of sequence
/// `bi`: into `k` and `v`, or into one `kv` (keys, then values).
fn qkv_outputs(joint: bool) -> &'static str {
    if joint {
        "#define K_OUT(h) (kv + (((size_t)bi * 2 * HKV + (h)) * seq + s) * D)\n\
         #define V_OUT(h) (kv + (((size_t)bi * 2 * HKV + HKV + (h)) * seq + s) * D)\n"
    } else {
        "#define K_OUT(h) (k + (((size_t)bi * HKV + (h)) * seq + s) * D)\n\
         #define V_OUT(h) (v + (((size_t)bi * HKV + (h)) * seq + s) * D)\n"
    }
}

/// The query, key and value heads of `qkv` (`[batch·seq, (hq + 2·hkv)·d]`), normed and
/// rotated; see [`QKV_NORM_ROPE`]. `norms` are the query and key norms' weights. With `joint`,
/// the keys and values come out as one array `[batch, 2·hkv, seq, d]` (two outputs in all), else
/// apart.
#[allow(clippy::too_many_arguments)]
pub(super) fn qkv_norm_rope(
    qkv: &Array,
    batch: usize,
    [hq, hkv, d]: [usize; 3],
    norms: Option<(&Array, &Array)>,
    eps: f32,
    freqs: &Array,
    pos: &Array,
    joint: bool,
) -> Result<Vec<Array>, MlxError> {
    let rows = qkv.shape()[0] as usize;
    let dtype = qkv.dtype();
    // Without norms the weights are not read: the frequencies stand in for them.
    let (qw, kw) = norms.unwrap_or((freqs, freqs));
    let seq = rows / batch;
    let warps = rows * (hq + 2 * hkv);
    let q_shape = dims_i32(&[batch, hq, seq, d]);
    let kv_shape = dims_i32(&[batch, 2 * hkv, seq, d]);
    let k_shape = dims_i32(&[batch, hkv, seq, d]);
    let (name, outputs, shapes): (_, &[&str], Vec<(&[i32], Dtype)>) = if joint {
        (
            "burn_mlx_qkv_norm_rope_joint",
            &["q", "kv"],
            vec![(&q_shape, dtype), (&kv_shape, dtype)],
        )
    } else {
        (
            "burn_mlx_qkv_norm_rope",
            &["q", "k", "v"],
            vec![(&q_shape, dtype), (&k_shape, dtype), (&k_shape, dtype)],
        )
    };
    with_kernel(
        name,
        &["qkv", "qw", "kw", "freqs", "pos"],
        outputs,
        || format!("{}{QKV_NORM_ROPE}", qkv_outputs(joint)),
        |k| {
            k.apply(
                &[qkv, qw, kw, freqs, pos],
                &shapes,
                &[
                    TemplateArg::Dtype("T", dtype),
                    TemplateArg::Int("HQ", hq as i32),
                    TemplateArg::Int("HKV", hkv as i32),
                    TemplateArg::Int("D", d as i32),
                    TemplateArg::Int("EPS", eps.to_bits() as i32),
                    TemplateArg::Int("NORM", norms.is_some() as i32),
                    TemplateArg::Int("BATCH", batch as i32),
                ],
                [(warps * 32).div_ceil(128) as i32 * 128, 1, 1],
                [128, 1, 1],
            )
        },
    )
}

/// Attention of one query position per batch entry and head (`q`: `[b, hq, 1, d]`) over the
/// first `len` positions of `keys` and `values` (`[b, hkv, capacity, d]`); `[b, hq·d]`.
///
/// With `joint`, `keys` and `values` are one array `[b, 2·hkv, capacity, d]` (keys, then values)
/// given twice.
#[allow(clippy::too_many_arguments)]
pub(super) fn decode_attention(
    q: &Array,
    keys: &Array,
    values: &Array,
    len: &Array,
    [b, hq, hkv, d]: [usize; 4],
    scale: f32,
    window: usize,
    joint: bool,
) -> Result<Array, MlxError> {
    let dtype = q.dtype();
    let shape = dims_i32(&[b, hq * d]);
    with_kernel(
        "burn_mlx_decode_attention",
        &["q", "keys", "values", "len"],
        &["out"],
        || DECODE_ATTENTION.to_string(),
        |k| {
            k.apply(
                &[q, keys, values, len],
                &[(&shape, dtype)],
                &[
                    TemplateArg::Dtype("T", dtype),
                    TemplateArg::Int("HQ", hq as i32),
                    TemplateArg::Int("HKV", hkv as i32),
                    TemplateArg::Int("D", d as i32),
                    TemplateArg::Int("WINDOW", window as i32),
                    TemplateArg::Int("HSTRIDE", (if joint { 2 } else { 1 } * hkv) as i32),
                    TemplateArg::Int("VOFF", if joint { hkv as i32 } else { 0 }),
                    TemplateArg::Int("SCALE", scale.to_bits() as i32),
                ],
                [(b * hq) as i32 * 512, 1, 1],
                [512, 1, 1],
            )
        },
    )
    .map(|mut out| out.remove(0))
}

/// `act(gate) · up` of `gu` (`[rows, 2·i]`, gate then up), `[rows, i]`.
pub(super) fn gated(gu: &Array, gelu: bool) -> Result<Array, MlxError> {
    let shape = gu.shape();
    let (rows, i) = (shape[0] as usize, shape[1] as usize / 2);
    let dtype = gu.dtype();
    let out_shape = dims_i32(&[rows, i]);
    let total = rows * i;
    with_kernel(
        "burn_mlx_gated",
        &["gu"],
        &["y"],
        || GATED.to_string(),
        |k| {
            k.apply(
                &[gu],
                &[(&out_shape, dtype)],
                &[
                    TemplateArg::Dtype("T", dtype),
                    TemplateArg::Int("I", i as i32),
                    TemplateArg::Int("GELU", gelu as i32),
                ],
                [total.div_ceil(256) as i32 * 256, 1, 1],
                [256, 1, 1],
            )
        },
    )
    .map(|mut out| out.remove(0))
}

/// Whether `dtype` is one the kernels take.
pub(super) fn float_dtype(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::Float32 | Dtype::Bfloat16 | Dtype::Float16)
}
