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
//! is read element by element, correctly but slowly. A quantized weight (MLX's affine format: 4- or
//! 8-bit values packed into `u32` words along each stored row, a scale and a bias per group of 32,
//! 64 or 128) is read the same way, a 16-byte piece of packed values per load, and each piece's
//! sum is `scale · Σ x·u + bias · Σ x` (a piece lies within one group); the template arguments `Q`
//! (bits, 0 for a dense weight) and `GS` (the group size) pick the reading. Every value is rounded to the dtype where
//! the composed ops round it (after the product, the bias, the norm), so the results match them
//! within the dtype's rounding.

use super::cuda::{counted, counted_inputs, dims_i32, COUNTERS, HEADER};
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

// Whether C dense weight columns from `w` (`cs` apart, each K values `wk` apart) can be read 16
// bytes per load: contiguous and aligned.
template <typename T, int K>
__device__ __forceinline__ bool bm_vec_cols(const T* w, long cs, long wk) {
  constexpr int V = 16 / sizeof(T);
  return wk == 1 && K % V == 0 && cs % V == 0 && (reinterpret_cast<size_t>(w) & 15) == 0;
}

// A weight matrix read a column at a time: column n holds the K values that multiply an input
// row. Dense (Q = 0): value k of column n is w[n*wn + k*wk], a T. Quantized (Q = 4 or 8, MLX's
// affine format): column n's values are packed Q bits each, lowest bits first, into K*Q/32 u32
// words from word n*wn, and value k is s*u + b, with u its bits and s, b the scale and bias of its
// group of GS values, at s[n*gn + k/GS] and b[n*gn + k/GS].
template <typename T, int Q, int GS>
struct bm_mat {
  const void* w;
  long wn, wk;
  const T* s;
  const T* b;
  long gn;
};

// A kernel's weight input `w` (strides `ws`) as a bm_mat of columns of K values: dense, Burn's
// [K, N] view (values ws[0] apart, columns ws[1]); quantized, MLX's packed [N, K*Q/32] words
// (rows ws[0] apart) with row-contiguous scales `s` and biases `b`, [N, K/GS].
template <typename T, int Q, int GS, int K, typename P, typename S>
__device__ __forceinline__ bm_mat<T, Q, GS> bm_mat_of(const P* w, const S& ws, const T* s,
                                                      const T* b) {
  bm_mat<T, Q, GS> m;
  m.w = w;
  m.s = s;
  m.b = b;
  if (Q == 0) {
    m.wn = ws[1];
    m.wk = ws[0];
    m.gn = 0;
  } else {
    m.wn = ws[0];
    m.wk = 1;
    m.gn = K / GS;
  }
  return m;
}

// Values in one 16-byte piece of a column: 16 bytes of T, or of packed Q-bit values.
template <typename T, int Q>
struct bm_piece {
  static constexpr int V = Q == 0 ? 16 / (int)sizeof(T) : 128 / (Q == 0 ? 32 : Q);
};

// Whether columns n, n + dc, ... of `m` can be read a 16-byte piece per load: contiguous and
// aligned (packed words always are contiguous within a column).
template <typename T, int Q, int GS, int K>
__device__ __forceinline__ bool bm_mat_vec(const bm_mat<T, Q, GS>& m, long n, long dc) {
  if (Q == 0) return bm_vec_cols<T, K>(static_cast<const T*>(m.w) + n * m.wn, dc * m.wn, m.wk);
  const uint32_t* p = static_cast<const uint32_t*>(m.w) + n * m.wn;
  return K % GS == 0 && m.wn % 4 == 0 && (reinterpret_cast<size_t>(p) & 15) == 0;
}

// The 16-byte piece of column `col` that starts at value k (k a multiple of bm_piece's V).
template <typename T, int Q, int GS>
__device__ __forceinline__ const uint4* bm_mat_piece(const bm_mat<T, Q, GS>& m, long col, long k) {
  constexpr int QB = Q == 0 ? 32 : Q;
  if (Q == 0) return reinterpret_cast<const uint4*>(static_cast<const T*>(m.w) + col * m.wn + k);
  return reinterpret_cast<const uint4*>(static_cast<const uint32_t*>(m.w) + col * m.wn +
                                        k * QB / 32);
}

// Value k of column `col`, one at a time (the path for weights bm_mat_vec rejects).
template <typename T, int Q, int GS>
__device__ __forceinline__ float bm_mat_at(const bm_mat<T, Q, GS>& m, long col, long k) {
  constexpr int QB = Q == 0 ? 32 : Q;
  if (Q == 0) return static_cast<float>(static_cast<const T*>(m.w)[col * m.wn + k * m.wk]);
  const uint32_t word = static_cast<const uint32_t*>(m.w)[col * m.wn + k * QB / 32];
  const uint32_t u = (word >> ((k % (32 / QB)) * QB)) & ((1u << (QB % 32)) - 1u);
  const long gi = col * m.gn + k / GS;
  return static_cast<float>(m.s[gi]) * static_cast<float>(u) + static_cast<float>(m.b[gi]);
}

// The pieces of C columns that a warp holds: CH 16-byte pieces of each, and for quantized
// weights each piece's scale and bias, loaded with the piece (so that a column's sums wait on
// memory once, not once for the pieces and again for their groups' scales).
template <typename T, int Q, int C, int CH>
struct bm_cols {
  uint4 w[C][CH];
  T s[C][CH];
  T b[C][CH];
};

// Loads the 16-byte pieces i0 .. i0 + CH of columns n, n + dc, ... (C of them) of `m`, with their
// scales and biases when quantized; piece i of a column holds, for this lane, values
// i*32*V + lane*V .. + V (one group: V divides GS).
template <typename T, int Q, int GS, int K, int C, int CH>
__device__ __forceinline__ void bm_mat_load(const bm_mat<T, Q, GS>& m, long n, long dc, int i0,
                                            bm_cols<T, Q, C, CH>& wv) {
  constexpr int V = bm_piece<T, Q>::V;
  constexpr int STEP = 32 * V;
  constexpr int ITERS = K / STEP;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = 0; c < C; ++c) {
#pragma unroll
    for (int i = 0; i < CH; ++i) {
      if (i0 + i < ITERS) {
        const long col = n + c * dc, k = (long)(i0 + i) * STEP + lane * V;
        wv.w[c][i] = *bm_mat_piece(m, col, k);
        if (Q != 0) {
          wv.s[c][i] = m.s[col * m.gn + k / GS];
          wv.b[c][i] = m.b[col * m.gn + k / GS];
        }
      }
    }
  }
}

// acc[c][r] += the pieces p[c] (values k0 .. k0 + V of columns n + c*dc) times row r of `xs`
// ([R][K]) there. A quantized piece's sum is s * sum(x*u) + b * sum(x): its V values share one
// group (V divides GS).
template <typename T, int Q, int R, int K, int C>
__device__ __forceinline__ void bm_piece_acc(long k0, const uint4 (&p)[C], const T (&ps)[C],
                                             const T (&pb)[C], const T* xs,
                                             float (&acc)[C][R]) {
  constexpr int VT = 16 / sizeof(T);
  if (Q == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint4 xv = *reinterpret_cast<const uint4*>(xs + r * K + k0);
      const T* xe = reinterpret_cast<const T*>(&xv);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const T* we = reinterpret_cast<const T*>(&p[c]);
#pragma unroll
        for (int j = 0; j < VT; ++j) {
          acc[c][r] += static_cast<float>(we[j]) * static_cast<float>(xe[j]);
        }
      }
    }
    return;
  }
  constexpr int QB = Q == 0 ? 32 : Q;
  constexpr int V = 128 / QB;
  constexpr int PER = 32 / QB;
  constexpr uint32_t MASK = (1u << (QB % 32)) - 1u;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float sx = 0.f;
    float d[C];
#pragma unroll
    for (int c = 0; c < C; ++c) d[c] = 0.f;
#pragma unroll
    for (int h = 0; h < V / VT; ++h) {
      const uint4 xv = *reinterpret_cast<const uint4*>(xs + r * K + k0 + h * VT);
      const T* xe = reinterpret_cast<const T*>(&xv);
#pragma unroll
      for (int j = 0; j < VT; ++j) {
        const int kk = h * VT + j;
        const float f = static_cast<float>(xe[j]);
        sx += f;
#pragma unroll
        for (int c = 0; c < C; ++c) {
          const uint32_t word = reinterpret_cast<const uint32_t*>(&p[c])[kk / PER];
          d[c] += f * static_cast<float>((word >> ((kk % PER) * QB)) & MASK);
        }
      }
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
      acc[c][r] += static_cast<float>(ps[c]) * d[c] + static_cast<float>(pb[c]) * sx;
    }
  }
}

// acc[c][r] = sum over k of xs[r][k] * (value k of column n + c*dc of `m`): C columns against R
// staged rows, by one warp; every lane gets the sums. With `vec` (see bm_mat_vec) the columns
// are read CH pieces at a time, the first CH already in `wv` (loaded by the caller before
// staging, so that the weights' latency hides the staging's; the later ones are loaded into
// `wv` here); otherwise value by value.
template <typename T, int Q, int GS, int R, int K, int C, int CH>
__device__ void bm_mat_dot(const bm_mat<T, Q, GS>& m, long n, long dc, const T* xs, bool vec,
                           bm_cols<T, Q, C, CH>& wv, float (&acc)[C][R]) {
  constexpr int V = bm_piece<T, Q>::V;
  constexpr int STEP = 32 * V;
  constexpr int ITERS = K / STEP;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = 0; c < C; ++c) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[c][r] = 0.f;
  }
  if (vec) {
    // Not unrolled: a later round's loads hoisted above this one's sums would hold twice the
    // registers, past what 16 warps a block may have.
#pragma unroll 1
    for (int i0 = 0; i0 < ITERS; i0 += CH) {
      if (i0 > 0) bm_mat_load<T, Q, GS, K, C, CH>(m, n, dc, i0, wv);
#pragma unroll
      for (int i = 0; i < CH; ++i) {
        if (i0 + i < ITERS) {
          uint4 p[C];
          T ps[C], pb[C];
#pragma unroll
          for (int c = 0; c < C; ++c) {
            p[c] = wv.w[c][i];
            ps[c] = wv.s[c][i];
            pb[c] = wv.b[c][i];
          }
          bm_piece_acc<T, Q, R, K, C>((long)(i0 + i) * STEP + lane * V, p, ps, pb, xs, acc);
        }
      }
    }
    // The last K % STEP values: one piece for the lanes that have one.
    const long k0 = (long)ITERS * STEP + lane * V;
    if (k0 < K) {
      uint4 p[C];
      T ps[C], pb[C];
#pragma unroll
      for (int c = 0; c < C; ++c) {
        p[c] = *bm_mat_piece(m, n + c * dc, k0);
        if (Q != 0) {
          ps[c] = m.s[(n + c * dc) * m.gn + k0 / GS];
          pb[c] = m.b[(n + c * dc) * m.gn + k0 / GS];
        }
      }
      bm_piece_acc<T, Q, R, K, C>(k0, p, ps, pb, xs, acc);
    }
  } else {
    for (int k = lane; k < K; k += 32) {
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const float t = bm_mat_at(m, n + c * dc, k);
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

// Copies the D values at `src` (just written by this warp) into row `p` of head `h` of sequence
// `b` of a cache `[rows, heads, capacity, D]` that the kernel takes as an input (`cs`: its
// strides, `cap`: its capacity) and writes in place; a row past the capacity is not written.
template <typename T, int D, typename S>
__device__ __forceinline__ void bm_cache_row(const T* src, const T* cache, const S& cs, int cap,
                                             int b, int h, int p) {
  __syncwarp();
  if (p < 0 || p >= cap) return;
  T* dst = const_cast<T*>(cache) + (long)b * cs[0] + (long)h * cs[1] + (long)p * cs[2];
  for (int i = threadIdx.x & 31; i < D; i += 32) dst[i * cs[3]] = src[i];
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
  const long col = live ? n : 0;
  const auto m = bm_mat_of<T, Q, GS, K>(w, w_strides, w_scales, w_biases);
  const bool vec = bm_mat_vec<T, Q, GS, K>(m, col, 0);
  bm_cols<T, Q, 1, CH> wv;
  if (live && vec) bm_mat_load<T, Q, GS, K, 1, CH>(m, col, 0, 0, wv);
  bm_stage_rows<T, R, K, false, 256>(x, x_strides[0], x_strides[1], x, 0, 0.f, xs, red);
  if (!live) return;
  float acc[1][R];
  bm_mat_dot<T, Q, GS, R, K, 1, CH>(m, col, 0, xs, vec, wv, acc);
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
  const long col = live ? j : 0;
  const auto m = bm_mat_of<T, Q, GS, K>(w, w_strides, w_scales, w_biases);
  const bool vec = bm_mat_vec<T, Q, GS, K>(m, col, I);
  bm_cols<T, Q, 2, CH> wv;
  if (live && vec) bm_mat_load<T, Q, GS, K, 2, CH>(m, col, I, 0, wv);
  bm_stage_rows<T, R, K, true, 256>(x, x_strides[0], x_strides[1], g, g_strides[0],
                                    __int_as_float(EPS), xs, red);
  if (!live) return;
  float acc[2][R];
  bm_mat_dot<T, Q, GS, R, K, 2, CH>(m, col, I, xs, vec, wv, acc);
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
  const auto m = bm_mat_of<T, Q, GS, K>(w, w_strides, w_scales, w_biases);
  const long n0 = (long)head * D + c0 + warp * C;
  const bool vec = bm_mat_vec<T, Q, GS, K>(m, n0, 1);
  bm_cols<T, Q, C, CH> wv;
  if (vec) bm_mat_load<T, Q, GS, K, C, CH>(m, n0, 1, 0, wv);
  bm_stage_rows<T, R, K, true, WARPS * 32>(x, x_strides[0], x_strides[1], g, g_strides[0],
                                           __int_as_float(EPS), xs, red);
  for (int c = c0 + warp * C; c < c0 + COLS; c += WARPS * C) {
    const long n = (long)head * D + c;
    float acc[C][R];
    if (n != n0 && vec) bm_mat_load<T, Q, GS, K, C, CH>(m, n, 1, 0, wv);
    bm_mat_dot<T, Q, GS, R, K, C, CH>(m, n, 1, xs, vec, wv, acc);
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
    T* dst = V_OUT(head - HQ - HKV);
    bm_head_out<T, D, false, false>(src, dst, false, qw, 0.f, 0.f, freqs);
    CACHE_ROW(dst, head - HQ);
    return;
  }
  const bool is_q = head < HQ;
  const int hh = is_q ? head : head - HQ;
  T* dst = is_q ? q + ((size_t)bi * HQ + hh) * D : K_OUT(hh);
  bm_head_out<T, D, NORM, false>(src, dst, true, is_q ? qw : kw, __int_as_float(QK_EPS),
                                 static_cast<float>(pos[0]), freqs);
  if (!is_q) {
    CACHE_ROW(dst, hh);
  }
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

/// A weight's MLX arrays as the kernels read them (`bm_mat` in [`GEMV_HEADER`]).
pub(super) enum Mat {
    /// Burn's `[k, n]` view of the weight, read through its strides.
    Dense(Array),
    /// MLX's affine form of the stored `[n, k]` matrix: `words` `[n, k·bits/32]` (`u32`, unit
    /// stride along a row), `scales` and `biases` `[n, k/group]` (row-contiguous, in the input
    /// rows' dtype).
    Quantized {
        words: Array,
        scales: Array,
        biases: Array,
        bits: i32,
        group: i32,
    },
}

impl Mat {
    /// The kernel inputs `W`, `W_scales` and `W_biases` (a dense weight stands in, unread, for
    /// the scales and biases it does not have).
    pub(super) fn inputs(&self) -> [&Array; 3] {
        match self {
            Mat::Dense(w) => [w, w, w],
            Mat::Quantized {
                words,
                scales,
                biases,
                ..
            } => [words, scales, biases],
        }
    }

    /// An array of the input rows' dtype, to stand in (unread) for an absent input of that dtype.
    pub(super) fn stand_in(&self) -> &Array {
        match self {
            Mat::Dense(w) => w,
            Mat::Quantized { scales, .. } => scales,
        }
    }

    /// The template arguments `Q` (bits per value, 0 when dense) and `GS` (the group size; 64,
    /// unread, when dense).
    pub(super) fn template_args(&self) -> [TemplateArg; 2] {
        let (q, gs) = match self {
            Mat::Dense(_) => (0, 64),
            Mat::Quantized { bits, group, .. } => (*bits, *group),
        };
        [TemplateArg::Int("Q", q), TemplateArg::Int("GS", gs)]
    }

    /// Whether two weights take the same template arguments (one launch reads both).
    pub(super) fn same_kind(&self, other: &Mat) -> bool {
        let key = |m: &Mat| match m {
            Mat::Dense(_) => (0, 0),
            Mat::Quantized { bits, group, .. } => (*bits, *group),
        };
        key(self) == key(other)
    }
}

/// The arrays and sizes of one projection: input rows `x` (`[rows, k]`), the weight `w` and its
/// bias (`None`: no bias).
pub(super) struct Projection<'a> {
    pub x: &'a Array,
    pub w: &'a Mat,
    pub bias: Option<&'a Array>,
    pub rows: usize,
    pub k: usize,
}

impl Projection<'_> {
    /// The kernel inputs `w`, `w_scales`, `w_biases` and `bias` (see [`Mat::inputs`]; without a
    /// bias an array of the rows' dtype stands in for it, unread).
    fn weight_inputs(&self) -> [&Array; 4] {
        let [w, s, b] = self.w.inputs();
        [w, s, b, self.bias.unwrap_or(self.w.stand_in())]
    }
}

/// `residual + x·w (+ bias)`, `[rows, n]`.
pub(super) fn linear_add(p: &Projection, n: usize, residual: &Array) -> Result<Array, MlxError> {
    let dtype = p.x.dtype();
    let shape = dims_i32(&[p.rows, n]);
    with_kernel(
        "burn_mlx_linear_add",
        &["x", "w", "w_scales", "w_biases", "bias", "res"],
        &["y"],
        || LINEAR_ADD.to_string(),
        |k| {
            let [w, ws, wb, bias] = p.weight_inputs();
            let [q, gs] = p.w.template_args();
            k.apply(
                &[p.x, w, ws, wb, bias, residual],
                &[(&shape, dtype)],
                &[
                    TemplateArg::Dtype("T", dtype),
                    q,
                    gs,
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
        &["x", "g", "w", "w_scales", "w_biases", "bias"],
        &["y"],
        || NORM_GATED.to_string(),
        |k| {
            let [w, ws, wb, bias] = p.weight_inputs();
            let [q, gs] = p.w.template_args();
            k.apply(
                &[p.x, norm, w, ws, wb, bias],
                &[(&shape, dtype)],
                &[
                    TemplateArg::Dtype("T", dtype),
                    q,
                    gs,
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
/// `[q, k, v]`. With `joint` and `cache` (`[rows, 2·hkv, capacity, d]`, a buffer of its own), the
/// keys and values are also written into `cache` at `pos`, in place.
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
    cache: Option<&Array>,
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
    let [counts, after] = counted_inputs()?;
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
             #define V_OUT(h) (kv + ((size_t)bi * 2 * HKV + HKV + (h)) * D)\n\
             #define CACHE_ROW(src, h) if (CACHE) \
               bm_cache_row<T, D>(src, kvc, kvc_strides, kvc_shape[2], bi, h, pos[0])\n",
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
             #define V_OUT(h) (v + ((size_t)bi * HKV + (h)) * D)\n\
             #define CACHE_ROW(src, h)\n",
        )
    };
    let mut names = vec![
        "x", "g", "w", "w_scales", "w_biases", "bias", "qw", "kw", "freqs", "pos", "counts",
        "after",
    ];
    if joint {
        names.push("kvc");
    }
    with_kernel(
        name,
        &names,
        outputs,
        || format!("{layout}{NORM_QKV_HEADS}"),
        |k| {
            let [w, ws, wb, bias] = p.weight_inputs();
            let [q, gs] = p.w.template_args();
            let mut inputs = vec![
                p.x, norm, w, ws, wb, bias, qw, kw, freqs, pos, &counts, &after,
            ];
            if joint {
                // Without a cache the input rows stand in for it, unread.
                inputs.push(cache.unwrap_or(p.x));
            }
            k.apply(
                &inputs,
                &shapes,
                &[
                    TemplateArg::Dtype("T", dtype),
                    q,
                    gs,
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
                    TemplateArg::Int("CACHE", (joint && cache.is_some()) as i32),
                ],
                [(parts * (hq + 2 * hkv)) as i32 * threads, 1, 1],
                [threads, 1, 1],
            )
        },
    )
    .map(|mut out| {
        // `raw` is scratch; the thread's next counted launch waits for it.
        if let Some(raw) = out.pop() {
            counted(&raw);
        }
        out
    })
}
