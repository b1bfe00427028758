//! The CUDA kernels of [`super::projection`]: a decode step's projections (a few rows times a
//! weight matrix) with the work around them fused in, each one MLX custom kernel.
//!
//! A decode step multiplies one row per sequence by each weight: bound by reading the weight,
//! and on MLX by the host's work per primitive. Each kernel here stages its input rows in shared
//! memory (normalized first where the projection follows an RMS norm), lets one warp take one or
//! two output columns at a time (rows of the stored `[out, in]` weight, read with 16-byte loads,
//! eight in flight per lane) and finishes the columns in the same kernel: the residual add, the
//! gated activation, or, for a QKV projection whose block holds one head, the head's RMS norm and
//! RoPE.
//!
//! The weights come as Burn's `[in, out]` view of the stored `[out, in]` matrix, read in place
//! through their strides (the kernels are made without `ensure_row_contiguous`); another layout
//! is read element by element, correctly but slowly. Every value is rounded to the dtype where
//! the composed ops round it (after the product, the bias, the norm), so the results match them
//! within the dtype's rounding.

use super::cuda::{counters, dims_i32, COUNTERS, HEADER};
use crate::error::MlxError;
use crate::native::kernel::{self, CudaKernel, TemplateArg};
use mlx_rs::{Array, Dtype};
use std::sync::OnceLock;

/// Most rows (sequences of a batch) a kernel takes: each warp keeps one sum per row.
pub(super) const MAX_ROWS: usize = 4;

/// Bytes of shared memory a kernel may use for its staged input rows.
const STAGE_BYTES: usize = 32 * 1024;

/// Helpers of the kernels below, after [`HEADER`]'s reductions.
pub(super) const GEMV_HEADER: &str = r#"
// Copies R rows of `x` (element (r, k) at r*xs0 + k*xs1) into `xs` ([R][K], T), by a block of
// THREADS threads. With NORMED each row is RMS-normalized with weight `g` and `eps`, rounded as
// MLX's rms_norm rounds: T(g * T(x * inv)). Contiguous, aligned rows are read 16 bytes per load,
// the row and its weight together, and kept in registers across the block sum, so that staging
// waits on memory once. Ends with a barrier.
template <typename T, int R, int K, bool NORMED, int THREADS>
__device__ void bm_stage_rows(const T* x, long xs0, long xs1, const T* g, long gs, float eps,
                              T* xs, float* red) {
  constexpr int V = 16 / sizeof(T);
  constexpr int CHUNKS = K / V;
  constexpr int PER = (CHUNKS + THREADS - 1) / THREADS;
  const bool vec = xs1 == 1 && K % V == 0 && xs0 % V == 0 &&
                   (reinterpret_cast<size_t>(x) & 15) == 0 &&
                   (!NORMED || (gs == 1 && (reinterpret_cast<size_t>(g) & 15) == 0));
  for (int r = 0; r < R; ++r) {
    if (vec) {
      uint4 xv[PER], gv[PER];
#pragma unroll
      for (int p = 0; p < PER; ++p) {
        const int c = threadIdx.x + p * THREADS;
        if (c < CHUNKS) {
          xv[p] = *reinterpret_cast<const uint4*>(x + r * xs0 + c * V);
          if (NORMED) gv[p] = *reinterpret_cast<const uint4*>(g + c * V);
        }
      }
      float inv = 1.f;
      if (NORMED) {
        float ss = 0.f;
#pragma unroll
        for (int p = 0; p < PER; ++p) {
          if (threadIdx.x + p * THREADS < CHUNKS) {
            const T* e = reinterpret_cast<const T*>(&xv[p]);
#pragma unroll
            for (int j = 0; j < V; ++j) {
              const float f = static_cast<float>(e[j]);
              ss += f * f;
            }
          }
        }
        inv = rsqrtf(bm_block_sum(ss, red) / K + eps);
      }
#pragma unroll
      for (int p = 0; p < PER; ++p) {
        const int c = threadIdx.x + p * THREADS;
        if (c < CHUNKS) {
          uint4 o = xv[p];
          if (NORMED) {
            const T* e = reinterpret_cast<const T*>(&xv[p]);
            const T* ge = reinterpret_cast<const T*>(&gv[p]);
            T* oe = reinterpret_cast<T*>(&o);
#pragma unroll
            for (int j = 0; j < V; ++j) {
              oe[j] = static_cast<T>(static_cast<float>(ge[j]) *
                                     static_cast<float>(static_cast<T>(
                                         static_cast<float>(e[j]) * inv)));
            }
          }
          *reinterpret_cast<uint4*>(xs + r * K + c * V) = o;
        }
      }
    } else {
      float ss = 0.f;
      for (int k = threadIdx.x; k < K; k += THREADS) {
        const T v = x[r * xs0 + k * xs1];
        xs[r * K + k] = v;
        const float f = static_cast<float>(v);
        ss += f * f;
      }
      if (NORMED) {
        // The block sum's barriers also make every thread's copy visible.
        const float inv = rsqrtf(bm_block_sum(ss, red) / K + eps);
        for (int k = threadIdx.x; k < K; k += THREADS) {
          const float f = static_cast<float>(xs[r * K + k]);
          xs[r * K + k] = static_cast<T>(static_cast<float>(g[k * gs]) *
                                         static_cast<float>(static_cast<T>(f * inv)));
        }
      }
    }
  }
  __syncthreads();
}

// Whether C weight columns from `w` (`cs` apart, each K values `wk` apart) can be read 16 bytes
// per load: contiguous and aligned.
template <typename T, int K>
__device__ __forceinline__ bool bm_vec_cols(const T* w, long cs, long wk) {
  constexpr int V = 16 / sizeof(T);
  return wk == 1 && K % V == 0 && cs % V == 0 && (reinterpret_cast<size_t>(w) & 15) == 0;
}

// Loads the 16-byte pieces i0 .. i0 + CH of C contiguous columns (piece i of a column holds,
// for this lane, values i*32*V + lane*V .. + V).
template <typename T, int K, int C, int CH>
__device__ __forceinline__ void bm_load_cols(const T* w, long cs, int i0, uint4 (&wv)[C][CH]) {
  constexpr int V = 16 / sizeof(T);
  constexpr int STEP = 32 * V;
  constexpr int ITERS = K / STEP;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = 0; c < C; ++c) {
#pragma unroll
    for (int i = 0; i < CH; ++i) {
      if (i0 + i < ITERS) {
        wv[c][i] = *reinterpret_cast<const uint4*>(w + c * cs + (i0 + i) * STEP + lane * V);
      }
    }
  }
}

// acc[c][r] = sum over k of xs[r][k] * w[c * cs + k * wk]: C weight columns against R staged
// rows, by one warp; every lane gets the sums. With `vec` (see bm_vec_cols) the columns are read
// CH pieces at a time, the first CH already in `wv` (loaded by the caller before staging, so that
// the weights' latency hides the staging's); otherwise element by element.
template <typename T, int R, int K, int C, int CH>
__device__ void bm_cols_dot(const T* w, long cs, long wk, const T* xs, bool vec,
                            uint4 (&wv)[C][CH], float (&acc)[C][R]) {
  constexpr int V = 16 / sizeof(T);
  constexpr int STEP = 32 * V;
  constexpr int ITERS = K / STEP;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = 0; c < C; ++c) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[c][r] = 0.f;
  }
  if (vec) {
    for (int i0 = 0; i0 < ITERS; i0 += CH) {
      if (i0 > 0) bm_load_cols<T, K, C, CH>(w, cs, i0, wv);
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        if (i0 + i < ITERS) {
          const int k0 = (i0 + i) * STEP + lane * V;
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const uint4 xv = *reinterpret_cast<const uint4*>(xs + r * K + k0);
            const T* xe = reinterpret_cast<const T*>(&xv);
#pragma unroll
            for (int c = 0; c < C; ++c) {
              const T* we = reinterpret_cast<const T*>(&wv[c][i]);
#pragma unroll
              for (int j = 0; j < V; ++j) {
                acc[c][r] += static_cast<float>(we[j]) * static_cast<float>(xe[j]);
              }
            }
          }
        }
      }
    }
    // The last K % STEP values: one 16-byte load for the lanes that have one.
    const int k0 = ITERS * STEP + lane * V;
    if (k0 < K) {
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const uint4 t = *reinterpret_cast<const uint4*>(w + c * cs + k0);
        const T* we = reinterpret_cast<const T*>(&t);
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
          for (int j = 0; j < V; ++j) {
            acc[c][r] += static_cast<float>(we[j]) * static_cast<float>(xs[r * K + k0 + j]);
          }
        }
      }
    }
  } else {
    for (int k = lane; k < K; k += 32) {
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const float t = static_cast<float>(w[c * cs + k * wk]);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[c][r] += t * static_cast<float>(xs[r * K + k]);
      }
    }
  }
#pragma unroll
  for (int c = 0; c < C; ++c) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[c][r] = bm_warp_sum(acc[c][r]);
  }
}

// The product's value of column n as the composed ops leave it: rounded, plus the bias, rounded.
template <typename T, bool BIAS>
__device__ __forceinline__ float bm_column(float acc, const T* bias, long bs, long n) {
  float y = static_cast<float>(static_cast<T>(acc));
  if (BIAS) y = static_cast<float>(static_cast<T>(y + static_cast<float>(bias[n * bs])));
  return y;
}

// One head's D projected values (f32 at `src`; with GLOBAL written by other blocks, so read from
// L2) to `dst`, by one warp. A value head (`rotate` false) is copied; a query or key head is
// RMS-normalized with weight `w` and `eps` when NORM (rounded where the composed ops round) and
// rotated by rotate-half RoPE at position `p` with inverse frequencies `freqs`.
template <typename T, int D, bool NORM, bool GLOBAL, typename W, typename F>
__device__ void bm_head_out(const float* src, T* dst, bool rotate, const W* w, float eps,
                            float p, const F* freqs) {
  constexpr int HALF = D / 2;
  constexpr int PER = (HALF + 31) / 32;
  const int lane = threadIdx.x & 31;
  auto at = [&](int i) { return GLOBAL ? __ldcg(src + i) : src[i]; };
  if (!rotate) {
    for (int i = lane; i < D; i += 32) dst[i] = static_cast<T>(at(i));
    return;
  }
  float a[PER], b[PER];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = lane + 32 * j;
    a[j] = 0.f;
    b[j] = 0.f;
    if (i < HALF) {
      a[j] = at(i);
      b[j] = at(i + HALF);
      ss += a[j] * a[j] + b[j] * b[j];
    }
  }
  if (NORM) {
    const float inv = rsqrtf(bm_warp_sum(ss) / D + eps);
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int i = lane + 32 * j;
      if (i < HALF) {
        a[j] = static_cast<float>(static_cast<T>(a[j] * inv * static_cast<float>(w[i])));
        b[j] = static_cast<float>(static_cast<T>(b[j] * inv * static_cast<float>(w[i + HALF])));
      }
    }
  }
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
}
"#;

/// `y = res + x·W (+ b)`: `x` `[R, K]`, `W` as `[K, N]`, `res` `[R, N]`. One warp per column,
/// 8 per block; each warp loads its column's first half kilobyte per lane before staging `x`.
const LINEAR_ADD: &str = r#"
  constexpr int CH = 8;
  __shared__ __align__(16) T xs[R * K];
  __shared__ float red[32];
  const int lane = threadIdx.x & 31;
  const long n = (long)blockIdx.x * 8 + (threadIdx.x >> 5);
  const bool live = n < N;
  const T* col = w + (live ? n : 0) * w_strides[1];
  const bool vec = bm_vec_cols<T, K>(col, 0, w_strides[0]);
  uint4 wv[1][CH];
  if (live && vec) bm_load_cols<T, K, 1, CH>(col, 0, 0, wv);
  bm_stage_rows<T, R, K, false, 256>(x, x_strides[0], x_strides[1], x, 0, 0.f, xs, red);
  if (!live) return;
  float acc[1][R];
  bm_cols_dot<T, R, K, 1, CH>(col, 0, w_strides[0], xs, vec, wv, acc);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = bm_column<T, BIAS>(acc[0][r], bias, bias_strides[0], n);
      const float s = static_cast<float>(res[r * res_strides[0] + n * res_strides[1]]);
      y[r * N + n] = static_cast<T>(s + v);
    }
  }
"#;

/// `y = act(g) · u` with `[g | u] = rms_norm(x)·W (+ b)`: `x` `[R, K]`, `W` as `[K, 2·I]` (gate
/// columns, then up). One warp per output column (its gate and up columns), 8 per block.
const NORM_GATED: &str = r#"
  constexpr int CH = 4;
  __shared__ __align__(16) T xs[R * K];
  __shared__ float red[32];
  const int lane = threadIdx.x & 31;
  const long j = (long)blockIdx.x * 8 + (threadIdx.x >> 5);
  const bool live = j < I;
  const T* col = w + (live ? j : 0) * w_strides[1];
  const long cs = I * w_strides[1];
  const bool vec = bm_vec_cols<T, K>(col, cs, w_strides[0]);
  uint4 wv[2][CH];
  if (live && vec) bm_load_cols<T, K, 2, CH>(col, cs, 0, wv);
  bm_stage_rows<T, R, K, true, 256>(x, x_strides[0], x_strides[1], g, g_strides[0],
                                    __int_as_float(EPS), xs, red);
  if (!live) return;
  float acc[2][R];
  bm_cols_dot<T, R, K, 2, CH>(col, cs, w_strides[0], xs, vec, wv, acc);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float gv = bm_column<T, BIAS>(acc[0][r], bias, bias_strides[0], j);
      const float uv = bm_column<T, BIAS>(acc[1][r], bias, bias_strides[0], j + I);
      float act;
      if (GELU) {
        act = 0.5f * gv * (1.f + tanhf(0.7978845608028654f * (gv + 0.044715f * gv * gv * gv)));
      } else {
        act = gv / (1.f + expf(-gv));
      }
      y[r * I + j] = static_cast<T>(act * uv);
    }
  }
"#;

/// The heads of `rms_norm(x)·W (+ b)` (`x` `[R, K]`, one position of each of `R` sequences at
/// `pos[0]`; `W` as `[K, (HQ + 2·HKV)·D]`): `P` blocks per head, each computing `D/P` of its
/// columns with `WARPS` warps of up to 8 columns at a time (their first loads issued before
/// staging). With `P > 1` the parts meet in `raw` (`[R, HQ + 2·HKV, D]`, f32) and the last
/// part of a head to finish (counted in `counts`, see [`super::cuda::counters`]: each launch adds
/// `TICKS` to a head's count, whatever its `P`) takes the whole head on: a query or key head is
/// normalized with `qw`/`kw` (when `NORM`) and rotated, as [`super::cuda`]'s `QKV_NORM_ROPE` does. Writes `q` `[R, HQ, 1, D]` and keys and values as
/// `K_OUT`/`V_OUT` say (one `kv` buffer or two).
const NORM_QKV_HEADS: &str = r#"
  constexpr int COLS = D / P;
  constexpr int C = COLS / WARPS < 8 ? COLS / WARPS : 8;
  constexpr int CH = 16 / C;
  constexpr int HEADS = HQ + 2 * HKV;
  __shared__ __align__(16) T xs[R * K];
  __shared__ float red[32];
  __shared__ float o[R][D];
  __shared__ int last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int head = blockIdx.x / P, part = blockIdx.x % P;
  const int c0 = part * COLS;
  const long ws = w_strides[1];
  const T* col = w + ((long)head * D + c0 + warp * C) * ws;
  const bool vec = bm_vec_cols<T, K>(col, ws, w_strides[0]);
  uint4 wv[C][CH];
  if (vec) bm_load_cols<T, K, C, CH>(col, ws, 0, wv);
  bm_stage_rows<T, R, K, true, WARPS * 32>(x, x_strides[0], x_strides[1], g, g_strides[0],
                                           __int_as_float(EPS), xs, red);
  for (int c = c0 + warp * C; c < c0 + COLS; c += WARPS * C) {
    const long n = (long)head * D + c;
    float acc[C][R];
    if (c != c0 + warp * C && vec) bm_load_cols<T, K, C, CH>(w + n * ws, ws, 0, wv);
    bm_cols_dot<T, R, K, C, CH>(w + n * ws, ws, w_strides[0], xs, vec, wv, acc);
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < C; ++i) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          o[r][c + i] = bm_column<T, BIAS>(acc[i][r], bias, bias_strides[0], n + i);
        }
      }
    }
  }
  if (P > 1) {
    // Publish this part's columns and count the head's finished parts: the last to finish
    // reads the others' and goes on with the whole head.
    __syncthreads();
    for (int i = threadIdx.x; i < R * COLS; i += blockDim.x) {
      const int r = i / COLS, c = c0 + i % COLS;
      raw[((size_t)r * HEADS + head) * D + c] = o[r][c];
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      // Each part adds TICKS / P, so a launch adds TICKS to its head's count whatever its P
      // (launches with other P share the counts), and the last part sees TICKS - TICKS / P.
      constexpr unsigned long long STEP = TICKS / P;
      unsigned long long* count = (unsigned long long*)(counts) + 8 + head;
      last = atomicAdd(count, STEP) % TICKS == TICKS - STEP;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int i = threadIdx.x; i < R * D; i += blockDim.x) {
      const int r = i / D, c = i % D;
      o[r][c] = __ldcg(raw + ((size_t)r * HEADS + head) * D + c);
    }
  }
  __syncthreads();
  if (warp >= R) return;
  const int bi = warp;
  const float* src = o[bi];
  if (head >= HQ + HKV) {
    bm_head_out<T, D, false, false>(src, V_OUT(head - HQ - HKV), false, qw, 0.f, 0.f, freqs);
    return;
  }
  const bool is_q = head < HQ;
  const int hh = is_q ? head : head - HQ;
  T* dst = is_q ? q + ((size_t)bi * HQ + hh) * D : K_OUT(hh);
  bm_head_out<T, D, NORM, false>(src, dst, true, is_q ? qw : kw, __int_as_float(QK_EPS),
                                 static_cast<float>(pos[0]), freqs);
"#;

/// Warps per block of [`NORM_QKV_HEADS`]. Sixteen (512 threads, at most 128 registers each)
/// for one row of 16-bit values and heads of 128, the decode step of a Llama or Qwen model in
/// bf16 or f16, whose kernel fits them; eight elsewhere (256 threads, which the 255 registers a
/// thread may have always fit: an f32 kernel asks for more than 128).
fn qkv_warps(rows: usize, d: usize, dtype: Dtype) -> i32 {
    if rows == 1 && d == 128 && dtype != Dtype::Float32 {
        16
    } else {
        8
    }
}

/// What one launch of [`NORM_QKV_HEADS`] adds to each head's count, split evenly among the head's
/// parts: the most parts a head may have.
const QKV_TICKS: usize = 64;

/// Blocks per head of [`NORM_QKV_HEADS`] for `heads` heads of `d` columns and `warps` warps a
/// block: the most (a power of two, at most [`QKV_TICKS`]) that keeps the grid within the GPU's
/// multiprocessors and gives every warp at least one column; one where the multiprocessors are
/// unknown.
fn qkv_parts(heads: usize, d: usize, warps: usize) -> usize {
    let Some(sms) = kernel::multiprocessors() else {
        return 1;
    };
    // Its counts are entries 8.. of the lower half; `attention_mlp_qkv` counts in the upper half.
    if heads + 8 > COUNTERS / 2 {
        return 1;
    }
    let mut parts = 1;
    while 2 * parts <= QKV_TICKS && 2 * parts * heads <= sms && d.is_multiple_of(2 * parts * warps)
    {
        parts *= 2;
    }
    parts
}

/// Whether a kernel here takes `rows` input rows of `k` values of `dtype`.
pub(super) fn fits(rows: usize, k: usize, dtype: Dtype) -> bool {
    let size = match dtype {
        Dtype::Float32 => 4,
        Dtype::Bfloat16 | Dtype::Float16 => 2,
        _ => return false,
    };
    (1..=MAX_ROWS).contains(&rows) && rows * k * size <= STAGE_BYTES
}

/// [`kernel::with_strided_kernel`] with [`HEADER`]'s reductions and this module's helpers as the
/// header, joined once per process (every decode step calls the kernels, and only a kernel's
/// first use reads the header).
fn with_kernel<T>(
    name: &'static str,
    inputs: &[&str],
    outputs: &[&str],
    source: impl FnOnce() -> String,
    f: impl FnOnce(&CudaKernel) -> T,
) -> T {
    static JOINED: OnceLock<String> = OnceLock::new();
    let header = JOINED.get_or_init(|| format!("{HEADER}{GEMV_HEADER}"));
    kernel::with_strided_kernel(name, inputs, outputs, source, header, f)
}

/// The arrays and sizes of one projection: input rows `x` (`[rows, k]`), the weight `w` (as
/// `[k, n]`) and its bias (`None`: no bias).
pub(super) struct Projection<'a> {
    pub x: &'a Array,
    pub w: &'a Array,
    pub bias: Option<&'a Array>,
    pub rows: usize,
    pub k: usize,
}

impl Projection<'_> {
    /// The bias, or (unread) the weight standing in for it.
    fn bias_or_weight(&self) -> &Array {
        self.bias.unwrap_or(self.w)
    }
}

/// `residual + x·w (+ bias)`, `[rows, n]`.
pub(super) fn linear_add(p: &Projection, n: usize, residual: &Array) -> Result<Array, MlxError> {
    let dtype = p.x.dtype();
    let shape = dims_i32(&[p.rows, n]);
    with_kernel(
        "burn_mlx_linear_add",
        &["x", "w", "bias", "res"],
        &["y"],
        || LINEAR_ADD.to_string(),
        |k| {
            k.apply(
                &[p.x, p.w, p.bias_or_weight(), residual],
                &[(&shape, dtype)],
                &[
                    TemplateArg::Dtype("T", dtype),
                    TemplateArg::Int("R", p.rows as i32),
                    TemplateArg::Int("K", p.k as i32),
                    TemplateArg::Int("N", n as i32),
                    TemplateArg::Int("BIAS", p.bias.is_some() as i32),
                ],
                [n.div_ceil(8) as i32 * 256, 1, 1],
                [256, 1, 1],
            )
        },
    )
    .map(|mut out| out.remove(0))
}

/// `act(gate) · up` of `rms_norm(x, norm, eps)·w (+ bias)` (`w` as `[k, 2·i]`), `[rows, i]`.
pub(super) fn norm_gated(
    p: &Projection,
    norm: &Array,
    eps: f32,
    i: usize,
    gelu: bool,
) -> Result<Array, MlxError> {
    let dtype = p.x.dtype();
    let shape = dims_i32(&[p.rows, i]);
    with_kernel(
        "burn_mlx_norm_gated",
        &["x", "g", "w", "bias"],
        &["y"],
        || NORM_GATED.to_string(),
        |k| {
            k.apply(
                &[p.x, norm, p.w, p.bias_or_weight()],
                &[(&shape, dtype)],
                &[
                    TemplateArg::Dtype("T", dtype),
                    TemplateArg::Int("R", p.rows as i32),
                    TemplateArg::Int("K", p.k as i32),
                    TemplateArg::Int("I", i as i32),
                    TemplateArg::Int("EPS", eps.to_bits() as i32),
                    TemplateArg::Int("BIAS", p.bias.is_some() as i32),
                    TemplateArg::Int("GELU", gelu as i32),
                ],
                [i.div_ceil(8) as i32 * 256, 1, 1],
                [256, 1, 1],
            )
        },
    )
    .map(|mut out| out.remove(0))
}

/// The query, key and value heads of `rms_norm(x, norm, eps)·w (+ bias)` for one position of
/// each of `rows` sequences at `pos`; see [`NORM_QKV_HEADS`]. `qk_norms` are the query and key
/// norms' weights (with `qk_eps`). With `joint`, `[q, kv]` (`kv`: `[rows, 2·hkv, 1, d]`), else
/// `[q, k, v]`.
#[allow(clippy::too_many_arguments)]
pub(super) fn norm_qkv_heads(
    p: &Projection,
    norm: &Array,
    eps: f32,
    [hq, hkv, d]: [usize; 3],
    qk_norms: Option<(&Array, &Array)>,
    qk_eps: f32,
    freqs: &Array,
    pos: &Array,
    joint: bool,
) -> Result<Vec<Array>, MlxError> {
    let dtype = p.x.dtype();
    let rows = p.rows;
    // Without norms their weights are not read: the frequencies stand in for them.
    let (qw, kw) = qk_norms.unwrap_or((freqs, freqs));
    let q_shape = dims_i32(&[rows, hq, 1, d]);
    let kv_shape = dims_i32(&[rows, 2 * hkv, 1, d]);
    let warps = qkv_warps(rows, d, dtype);
    let threads = warps * 32;
    let parts = qkv_parts(hq + 2 * hkv, d, warps as usize);
    let raw_len = if parts > 1 {
        rows * (hq + 2 * hkv) * d
    } else {
        1
    };
    let raw_shape = dims_i32(&[raw_len]);
    let counts = counters()?;
    let k_shape = dims_i32(&[rows, hkv, 1, d]);
    // The head layout macros of `QKV_NORM_ROPE`, for one position per sequence.
    let (name, outputs, shapes, layout): (_, &[&str], Vec<(&[i32], Dtype)>, _) = if joint {
        (
            "burn_mlx_norm_qkv_heads_joint",
            &["q", "kv", "raw"],
            vec![
                (&q_shape, dtype),
                (&kv_shape, dtype),
                (&raw_shape, Dtype::Float32),
            ],
            "#define K_OUT(h) (kv + ((size_t)bi * 2 * HKV + (h)) * D)\n\
             #define V_OUT(h) (kv + ((size_t)bi * 2 * HKV + HKV + (h)) * D)\n",
        )
    } else {
        (
            "burn_mlx_norm_qkv_heads",
            &["q", "k", "v", "raw"],
            vec![
                (&q_shape, dtype),
                (&k_shape, dtype),
                (&k_shape, dtype),
                (&raw_shape, Dtype::Float32),
            ],
            "#define K_OUT(h) (k + ((size_t)bi * HKV + (h)) * D)\n\
             #define V_OUT(h) (v + ((size_t)bi * HKV + (h)) * D)\n",
        )
    };
    with_kernel(
        name,
        &["x", "g", "w", "bias", "qw", "kw", "freqs", "pos", "counts"],
        outputs,
        || format!("{layout}{NORM_QKV_HEADS}"),
        |k| {
            k.apply(
                &[
                    p.x,
                    norm,
                    p.w,
                    p.bias_or_weight(),
                    qw,
                    kw,
                    freqs,
                    pos,
                    &counts,
                ],
                &shapes,
                &[
                    TemplateArg::Dtype("T", dtype),
                    TemplateArg::Int("R", rows as i32),
                    TemplateArg::Int("K", p.k as i32),
                    TemplateArg::Int("HQ", hq as i32),
                    TemplateArg::Int("HKV", hkv as i32),
                    TemplateArg::Int("D", d as i32),
                    TemplateArg::Int("EPS", eps.to_bits() as i32),
                    TemplateArg::Int("QK_EPS", qk_eps.to_bits() as i32),
                    TemplateArg::Int("NORM", qk_norms.is_some() as i32),
                    TemplateArg::Int("BIAS", p.bias.is_some() as i32),
                    TemplateArg::Int("WARPS", warps),
                    TemplateArg::Int("P", parts as i32),
                    TemplateArg::Int("TICKS", QKV_TICKS as i32),
                ],
                [(parts * (hq + 2 * hkv)) as i32 * threads, 1, 1],
                [threads, 1, 1],
            )
        },
    )
    .map(|mut out| {
        out.pop();
        out
    })
}
