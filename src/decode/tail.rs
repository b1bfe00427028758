//! The second half of a pre-norm decoder block's decode step as one kernel: attention over the
//! cache, the output projection and its residual, the post-attention RMS norm, the gated MLP and
//! its residual.
//!
//! Composed, that is [`decode_attention_joint`], [`linear_add`], [`norm_gated`] and
//! [`linear_add`]: four MLX primitives, each a kernel launch whose few microseconds of work on
//! one position wait on the one before. On [`Mlx`](crate::Mlx)'s CUDA device, for one sequence,
//! [`attention_mlp`] runs them as one MLX custom kernel whose blocks (one per multiprocessor, all
//! resident at once) pass three grid-wide barriers: after the attention (each block takes one
//! split of one head's positions), after the output projection, and after the gate/up
//! projection. [`attention_mlp_qkv`] goes on, after a fourth barrier, to the next block's QKV step
//! on the block's output (the next block's query, key and value heads), so that a decode step of
//! a Llama/Qwen model is one kernel per block: the kernel that makes a block's keys and values
//! also writes them into that block's cache ([`NormQkv::cache`]). [`super::decoder_stack`] runs
//! the same phases (these sources) for every block of a stack in one launch.
//!
//! The barriers count on a 64-bit counter that lives for the process and only grows (a block
//! waits for the next multiple of the grid's size; see [`super::cuda::counters`]), so a launch
//! needs no zeroed memory. Two such kernels must not run at once, nor beside a kernel that holds
//! multiprocessors until this one ends: each launch takes an output of the thread's previous
//! kernel that uses the counters as an input ([`super::cuda::counted_inputs`]), so that MLX,
//! which orders its CUDA graph's nodes only by the arrays they read and write, runs them in
//! turn. `BURN_MLX_DECODE_GRID=0` turns the kernel off (the four kernels run instead).

use super::cuda::{counted, counted_inputs, dims_i32, COUNTERS, HEADER};
use super::gemv::Mat;
use super::gemv::GEMV_HEADER;
use super::projection::{dense_array, JointHeads, Linear, NormQkv};
use super::{
    array_of, decode_attention_joint, kernel_input, linear_add, norm_gated, writable_cache, At,
    Gate,
};
use crate::error::MlxError;
use crate::fast::float_from_mlx;
use crate::native::kernel::{self, CudaKernel, TemplateArg};
use crate::tensor::{MlxTensor, OrPanic};
use burn_tensor::backend::Backend;
use burn_tensor::Tensor;
use mlx_rs::{Array, Dtype};
use std::sync::OnceLock;

/// Warps per block: 16 (512 threads), so that each multiprocessor has that many loads in flight,
/// which allows at most 128 registers a thread (see [`warps`] for the one kernel that needs more).
pub(super) const WARPS: usize = 16;

/// Warps per block of `attention_mlp`'s kernel: [`WARPS`], except for dense f32 weights with the
/// next block's QKV step, which needs up to 138 registers a thread (nvcc 13.0 for sm_90: 136-138
/// with heads of 128 and 256 at hidden sizes of 512, 117 at the 0.6B shape; a 512-thread launch
/// past 128 fails with "too many resources requested for launch") and so runs 8 warps, which
/// allow 255. Every other dtype and weight kind stays within 128 with
/// 16 warps (bf16/f16 at most 104, 4- and 8-bit weights at most 118).
fn warps(dtype: Dtype, wo: &Mat, next: bool) -> usize {
    if dtype == Dtype::Float32 && matches!(wo, Mat::Dense(_)) && next {
        8
    } else {
        WARPS
    }
}

/// Static shared memory a block may use.
const SHARED_BYTES: usize = 48 * 1024;

/// The grid barrier and reads of other blocks' writes, after [`HEADER`] and [`GEMV_HEADER`].
const TAIL_HEADER: &str = r#"
// Waits until every block of the grid has reached this barrier. `counter` only grows: a block
// adds one and waits for the next multiple of the grid's size, which the last block to arrive
// reaches. Writes made before the barrier are visible after it.
__device__ __forceinline__ void bm_grid_sync(unsigned long long* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned long long g = gridDim.x;
    const unsigned long long target = (atomicAdd(counter, 1ull) / g + 1) * g;
    while (*reinterpret_cast<volatile unsigned long long*>(counter) < target) {
    }
    __threadfence();
  }
  __syncthreads();
}

// A value written by another block of this grid, read from L2 (not from a stale L1 line).
template <typename T>
__device__ __forceinline__ T bm_ldcg(const T* p) {
  T out;
  if (sizeof(T) == 4) {
    const unsigned int v = __ldcg(reinterpret_cast<const unsigned int*>(p));
    memcpy(&out, &v, sizeof(T));
  } else {
    const unsigned short v = __ldcg(reinterpret_cast<const unsigned short*>(p));
    memcpy(&out, &v, sizeof(T));
  }
  return out;
}

// Copies the N values at `src` (written by other blocks) into `xs`; with NORMED, RMS-normalized
// with weight `g` as MLX's rms_norm rounds: T(g * T(x * inv)). Ends with a barrier.
template <typename T, int N, bool NORMED>
__device__ void bm_stage_shared(const T* src, const T* g, long gs, float eps, T* xs,
                                float* red) {
  float ss = 0.f;
  for (int k = threadIdx.x; k < N; k += blockDim.x) {
    const T v = bm_ldcg(src + k);
    xs[k] = v;
    const float f = static_cast<float>(v);
    ss += f * f;
  }
  if (NORMED) {
    const float inv = rsqrtf(bm_block_sum(ss, red) / N + eps);
    for (int k = threadIdx.x; k < N; k += blockDim.x) {
      const float f = static_cast<float>(xs[k]);
      xs[k] = static_cast<T>(static_cast<float>(g[k * gs]) *
                             static_cast<float>(static_cast<T>(f * inv)));
    }
  }
  __syncthreads();
}

// Loads the first CH 16-byte pieces of columns first, first + dc, ... (C of them) of `m` when
// they can be read so (bm_mat_vec) and `first` (the warp's first column) is below N: a phase's
// weights, issued before the barrier ahead of it.
template <typename T, int Q, int GS, int K, int C, int CH>
__device__ __forceinline__ void bm_preload(const bm_mat<T, Q, GS>& m, long first, long dc, long N,
                                           bm_cols<T, Q, C, CH>& wv) {
  if (first < N && bm_mat_vec<T, Q, GS, K>(m, first, dc)) {
    bm_mat_load<T, Q, GS, K, C, CH>(m, first, dc, 0, wv);
  }
}

// A warp's weight pieces for its rounds over the columns first, first + step, ... below N of a
// bm_mat (C columns dc apart a round): `cur` holds the round's pieces. Quantized pieces take few
// registers, so they are loaded two rounds ahead (`next` holds the next round's) and a round
// waits on no load but those of the first two rounds, issued before the phase's barrier. Dense
// pieces are loaded at the top of each round after the first.
template <typename T, int Q, int C, int CH, bool AHEAD>
struct bm_stream {
  bm_cols<T, Q, C, CH> cur, next;
};

// Issues the loads of the first rounds of `s` (before the barrier ahead of the phase).
template <typename T, int Q, int GS, int K, int C, int CH, bool AHEAD>
__device__ __forceinline__ void bm_stream_start(const bm_mat<T, Q, GS>& m, long first, long step,
                                                long dc, long N, bm_stream<T, Q, C, CH, AHEAD>& s) {
  bm_preload<T, Q, GS, K, C, CH>(m, first, dc, N, s.cur);
  if (AHEAD) bm_preload<T, Q, GS, K, C, CH>(m, first + step, dc, N, s.next);
}

// Makes `s.cur` hold the pieces of the round at column n (loading them, for dense weights, in
// the rounds after the first).
template <typename T, int Q, int GS, int K, int C, int CH, bool AHEAD>
__device__ __forceinline__ void bm_stream_at(const bm_mat<T, Q, GS>& m, long n, long first,
                                             long dc, bool vec, bm_stream<T, Q, C, CH, AHEAD>& s) {
  if (!AHEAD && vec && n != first) bm_mat_load<T, Q, GS, K, C, CH>(m, n, dc, 0, s.cur);
}

// After the round at column n has used `s.cur`: for quantized weights `cur` takes the next
// round's pieces and the loads of the round after it are issued.
template <typename T, int Q, int GS, int K, int C, int CH, bool AHEAD>
__device__ __forceinline__ void bm_stream_next(const bm_mat<T, Q, GS>& m, long n, long step,
                                               long dc, long N, bm_stream<T, Q, C, CH, AHEAD>& s) {
  if (AHEAD) {
    s.cur = s.next;
    bm_preload<T, Q, GS, K, C, CH>(m, n + 2 * step, dc, N, s.next);
  }
}

// out[n] = T(res[n·rs] + T(xs · column n of m)) (rounded as linear_add rounds) for the columns
// n = gw, gw + GW, ... below N of `m` (KK values a column), one warp each, reading the weights
// through `s` (started with bm_stream_start). With RES_L2 the residual was written by other
// blocks of the grid.
template <typename T, int Q, int GS, int KK, int N, bool RES_L2>
__device__ void bm_columns_add(const bm_mat<T, Q, GS>& m, const T* xs, const T* res, long rs,
                               T* out, bm_stream<T, Q, 1, 8, false>& s, long gw, long GW) {
  for (long n = gw; n < N; n += GW) {
    const bool vec = bm_mat_vec<T, Q, GS, KK>(m, n, 0);
    bm_stream_at<T, Q, GS, KK, 1, 8, false>(m, n, gw, 0, vec, s);
    float acc[1][1];
    bm_mat_dot<T, Q, GS, 1, KK, 1, 8>(m, n, 0, xs, vec, s.cur, acc);
    bm_stream_next<T, Q, GS, KK, 1, 8, false>(m, n, GW, 0, N, s);
    if ((threadIdx.x & 31) == 0) {
      const float v = static_cast<float>(static_cast<T>(acc[0][0]));
      const float r = static_cast<float>(RES_L2 ? bm_ldcg(res + n * rs) : res[n * rs]);
      out[n] = static_cast<T>(r + v);
    }
  }
}
"#;

/// The constants, shared memory and indices of [`ATTENTION_MLP`]'s blocks, which do not depend on
/// the block's arrays (the decoder stack's kernel declares them once for all its blocks). `work`
/// holds the attention's partial softmaxes (`HQ·S` of `D + 2` floats), then `h` and the
/// activation in `T`.
pub(super) const ATTENTION_MLP_PRELUDE: &str = r#"
  constexpr int E = D / 32;
  constexpr int U = 4;
  constexpr int KA = HQ * D;
  constexpr int PART = D + 2;
  constexpr int M1 = KA > K ? KA : K;
  constexpr int STAGE = M1 > I ? M1 : I;
  // Whether the QKV and gate/up phases load quantized weights two rounds ahead (bm_stream): the
  // registers allow it with 8 warps a block, not with 16.
  constexpr bool AHEAD = Q != 0 && WARPS <= 8;
  // Whether each warp's attention loads its next run of keys and values while it sums the
  // current one: where a lane's part of a row is at most 8 bytes (bm_attend's default), but not
  // where 8-bit weights loaded two rounds ahead already take every register (it would spill).
  constexpr bool ATT_NEXT = E * sizeof(T) <= 8 && !(AHEAD && Q == 8);
  constexpr long H_OFF = ((long)HQ * S * PART + 3) / 4 * 4;
  constexpr long A_OFF = H_OFF + ((long)K * sizeof(T) + 15) / 16 * 4;
  __shared__ __align__(16) T xs[STAGE];
  __shared__ float red[32];
  __shared__ float s_m[WARPS];
  __shared__ float s_l[WARPS];
  __shared__ float s_acc[WARPS][D];
  __shared__ float s_pm[HQ * S];
  __shared__ float s_pl[HQ * S];
  __shared__ float s_hm[HQ];
  __shared__ float s_hd[HQ];
  const float NEG_INF = -__int_as_float(0x7f800000);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int G = gridDim.x;
  const long gw = (long)blockIdx.x * WARPS + warp;
  const long GW = (long)G * WARPS;
  unsigned long long* bar = (unsigned long long*)(sync);
  float* parts = work;
  T* hbuf = reinterpret_cast<T*>(work + H_OFF);
  T* abuf = reinterpret_cast<T*>(work + A_OFF);
"#;

/// `y = h + down(act(gate) · up)` with `[gate | up] = rms_norm(h)·Wgu` and
/// `h = x + attention(q, kv[..len])·Wo`, for one position (`x` `[1, K]`, `q` `[1, HQ, 1, D]`,
/// `kv` `[1, 2·HKV, cap, D]`, keys then values), after [`ATTENTION_MLP_PRELUDE`]. Blocks of
/// `WARPS` warps. `q` and `x` are read from L2, so they may have been written by other blocks of
/// the same launch (as in the decoder stack's kernel).
pub(super) const ATTENTION_MLP: &str = r#"
  const auto mo = bm_mat_of<T, Q, GS, KA>(wo, wo_strides, wo_scales, wo_biases);
  const auto mgu = bm_mat_of<T, Q, GS, K>(wgu, wgu_strides, wgu_scales, wgu_biases);
  const auto md = bm_mat_of<T, Q, GS, I>(wd, wd_strides, wd_scales, wd_biases);

  // Attention: block item = (query head, split of the positions); each warp takes U positions
  // at a time with an online softmax; the block's warps are combined into one partial.
  {
    const int cap = kv_shape[2];
    int L = static_cast<int>(len[0]);
    L = L < cap ? L : cap;
    const int chunk = (L + S - 1) / S;
    const float scale = __int_as_float(SCALE);
    for (int item = blockIdx.x; item < HQ * S; item += G) {
      const int hq = item / S, sp = item % S;
      const int kvh = hq / (HQ / HKV);
      const int lo = sp * chunk;
      const int hi = lo + chunk < L ? lo + chunk : L;
      float qr[E];
      const T* qp = q + hq * q_strides[1] + lane * E * q_strides[3];
#pragma unroll
      for (int e = 0; e < E; ++e) qr[e] = static_cast<float>(bm_ldcg(qp + e * q_strides[3])) * scale;
      const long ks = kv_strides[2], es = kv_strides[3];
      const T* kb = kv + kvh * kv_strides[1] + lane * E * es;
      const T* vb = kv + (HKV + kvh) * kv_strides[1] + lane * E * es;
      float m = NEG_INF, l = 0.f;
      float acc[E];
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] = 0.f;
      bm_attend<T, E, U, WARPS * U, ATT_NEXT>(qr, kb, vb, ks, es, lo + warp * U, hi, m, l, acc);
      if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
      }
#pragma unroll
      for (int e = 0; e < E; ++e) s_acc[warp][lane * E + e] = acc[e];
      __syncthreads();
      float mx = NEG_INF;
      for (int i = 0; i < WARPS; ++i) mx = fmaxf(mx, s_m[i]);
      float* part = parts + (size_t)item * PART;
      for (int j = threadIdx.x; j < D; j += blockDim.x) {
        float num = 0.f, den = 0.f;
        for (int i = 0; i < WARPS; ++i) {
          const float f = s_m[i] == NEG_INF ? 0.f : expf(s_m[i] - mx);
          num += f * s_acc[i][j];
          den += f * s_l[i];
        }
        part[2 + j] = num;
        if (j == 0) {
          part[0] = mx;
          part[1] = den;
        }
      }
      __syncthreads();
    }
  }
  // Each phase's first weight columns are loaded before the barrier ahead of it (the weights do
  // not depend on what the barrier waits for), so their latency hides the barrier's. With 8
  // warps a block (the decoder stack's kernel) the registers allow quantized weights of the
  // phases of several rounds (QKV, gate/up) to be loaded two rounds ahead (bm_stream).
  bm_stream<T, Q, 1, 8, false> wv_o;
  bm_stream_start<T, Q, GS, KA, 1, 8, false>(mo, gw, GW, 0, K, wv_o);
  bm_grid_sync(bar);

  // The heads' outputs (every block combines the splits itself), then h = x + out·Wo.
  for (int it = threadIdx.x; it < HQ * S; it += blockDim.x) {
    s_pm[it] = __ldcg(parts + (size_t)it * PART);
    s_pl[it] = __ldcg(parts + (size_t)it * PART + 1);
  }
  __syncthreads();
  for (int h = threadIdx.x; h < HQ; h += blockDim.x) {
    float mx = NEG_INF;
    for (int sp = 0; sp < S; ++sp) mx = fmaxf(mx, s_pm[h * S + sp]);
    float den = 0.f;
    for (int sp = 0; sp < S; ++sp) {
      const float ms = s_pm[h * S + sp];
      if (ms != NEG_INF) den += expf(ms - mx) * s_pl[h * S + sp];
    }
    s_hm[h] = mx;
    s_hd[h] = den;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < KA; idx += blockDim.x) {
    const int h = idx / D, j = idx % D;
    const float* ph = parts + (size_t)h * S * PART + 2 + j;
    float num = 0.f;
#pragma unroll
    for (int sp = 0; sp < S; ++sp) {
      const float ms = s_pm[h * S + sp];
      const float f = ms == NEG_INF ? 0.f : expf(ms - s_hm[h]);
      num += f * __ldcg(ph + sp * PART);
    }
    xs[idx] = static_cast<T>(num / s_hd[h]);
  }
  __syncthreads();
  bm_columns_add<T, Q, GS, KA, K, true>(mo, xs, x, x_strides[1], hbuf, wv_o, gw, GW);
  bm_stream<T, Q, 2, 4, AHEAD> wv_gu;
  bm_stream_start<T, Q, GS, K, 2, 4, AHEAD>(mgu, gw, GW, I, I, wv_gu);
  bm_grid_sync(bar);

  // act = act(gate) · up of rms_norm(h)·Wgu.
  bm_stage_shared<T, K, true>(hbuf, g, g_strides[0], __int_as_float(EPS), xs, red);
  for (long j = gw; j < I; j += GW) {
    const bool vec = bm_mat_vec<T, Q, GS, K>(mgu, j, I);
    bm_stream_at<T, Q, GS, K, 2, 4, AHEAD>(mgu, j, gw, I, vec, wv_gu);
    float acc[2][1];
    bm_mat_dot<T, Q, GS, 1, K, 2, 4>(mgu, j, I, xs, vec, wv_gu.cur, acc);
    bm_stream_next<T, Q, GS, K, 2, 4, AHEAD>(mgu, j, GW, I, I, wv_gu);
    if (lane == 0) {
      const float gv = static_cast<float>(static_cast<T>(acc[0][0]));
      const float uv = static_cast<float>(static_cast<T>(acc[1][0]));
      float a;
      if (GELU) {
        a = 0.5f * gv * (1.f + tanhf(0.7978845608028654f * (gv + 0.044715f * gv * gv * gv)));
      } else {
        a = gv / (1.f + expf(-gv));
      }
      abuf[j] = static_cast<T>(a * uv);
    }
  }
  bm_stream<T, Q, 1, 8, false> wv_d;
  bm_stream_start<T, Q, GS, I, 1, 8, false>(md, gw, GW, 0, K, wv_d);
  bm_grid_sync(bar);

  // y = h + act·Wd.
  bm_stage_shared<T, I, false>(abuf, g, 0, 0.f, xs, red);
  bm_columns_add<T, Q, GS, I, K, true>(md, xs, hbuf, 1, y, wv_d, gw, GW);
"#;

/// Appended to [`ATTENTION_MLP`] by [`attention_mlp_qkv`]: the next block's query, key and value
/// heads from `y`, as `norm_qkv_heads_joint` makes them (`rms_norm(y)·Wqkv (+ bias)`, each
/// query/key head normalized with `qw`/`kw` when `NORM` and rotated at `pos[0]`), into `q2`
/// (`[1, HQ, 1, D]`) and `kv2` (`[1, 2·HKV, 1, D]`), and with `CACHE` also into row `pos[0]` of
/// the next block's cache `kvc` (`[1, 2·HKV, capacity, D]`, written in place). Each warp takes
/// two columns at a time and publishes them to `raw`; a head's count (in `sync` from
/// `HEAD_COUNTS`) grows by `D` a launch, and the warp that finishes a head's last columns tops the
/// count up to the next multiple of `ROUND` and writes the head.
pub(super) const NEXT_QKV: &str = r#"
  {
    constexpr int N = (HQ + 2 * HKV) * D;
    constexpr int C = 2;
    constexpr int CH = 4;
    constexpr unsigned long long ROUND = 1024;
    constexpr long R_OFF = A_OFF + ((long)I * sizeof(T) + 15) / 16 * 4;
    float* raw = work + R_OFF;
    const auto mq = bm_mat_of<T, Q, GS, K>(wqkv, wqkv_strides, wqkv_scales, wqkv_biases);
    const long first = gw * C;
    bm_stream<T, Q, C, CH, AHEAD> wv;
    bm_stream_start<T, Q, GS, K, C, CH, AHEAD>(mq, first, GW * C, 1, N, wv);
    bm_grid_sync(bar);
    bm_stage_shared<T, K, true>(y, g2, g2_strides[0], __int_as_float(EPS2), xs, red);
    for (long n = first; n < N; n += GW * C) {
      const bool vec = bm_mat_vec<T, Q, GS, K>(mq, n, 1);
      bm_stream_at<T, Q, GS, K, C, CH, AHEAD>(mq, n, first, 1, vec, wv);
      float acc[C][1];
      bm_mat_dot<T, Q, GS, 1, K, C, CH>(mq, n, 1, xs, vec, wv.cur, acc);
      bm_stream_next<T, Q, GS, K, C, CH, AHEAD>(mq, n, GW * C, 1, N, wv);
      const int head = static_cast<int>(n / D);
      int last = 0;
      if (lane == 0) {
#pragma unroll
        for (int c = 0; c < C; ++c) {
          raw[n + c] = bm_column<T, BIAS>(acc[c][0], bias2, bias2_strides[0], n + c);
        }
        __threadfence();
        unsigned long long* count = bar + HEAD_COUNTS + head;
        const unsigned long long old = atomicAdd(count, (unsigned long long)C);
        last = old % ROUND == D - C;
        if (last) atomicAdd(count, ROUND - D);
      }
      if (__shfl_sync(0xffffffffu, last, 0)) {
        __threadfence();
        const float* src = raw + (long)head * D;
        if (head < HQ) {
          bm_head_out<T, D, NORM, true>(src, q2 + (long)head * D, true, qw,
                                        __int_as_float(QK_EPS), static_cast<float>(pos[0]),
                                        freqs);
        } else {
          // Keys then values, as the joint cache holds them; with CACHE also into the next
          // block's cache at `pos[0]`.
          T* dst = kv2 + (long)(head - HQ) * D;
          bm_head_out<T, D, NORM, true>(src, dst, head < HQ + HKV, kw, __int_as_float(QK_EPS),
                                        static_cast<float>(pos[0]), freqs);
          if (CACHE) {
            bm_cache_row<T, D>(dst, kvc, kvc_strides, kvc_shape[2], 0, head - HQ, pos[0]);
          }
        }
      }
    }
  }
"#;

/// The header of the grid kernels: [`HEADER`], [`GEMV_HEADER`] and [`TAIL_HEADER`], joined once
/// per process.
pub(super) fn header() -> &'static str {
    static JOINED: OnceLock<String> = OnceLock::new();
    JOINED.get_or_init(|| format!("{HEADER}{GEMV_HEADER}{TAIL_HEADER}"))
}

/// Whether `BURN_MLX_DECODE_GRID` leaves the kernel on (it is unless set to `0`).
pub(super) fn grid_kernel_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("BURN_MLX_DECODE_GRID").map_or(true, |v| v != "0"))
}

/// The sizes of one [`attention_mlp`] launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sizes {
    /// Hidden size.
    pub k: usize,
    /// Query heads.
    pub hq: usize,
    /// Key/value heads.
    pub hkv: usize,
    /// Head size.
    pub d: usize,
    /// The MLP's width.
    pub i: usize,
}

impl Sizes {
    /// The floats of [`ATTENTION_MLP`]'s scratch `work` (values of `size` bytes, `splits` splits
    /// of each head's positions), as its offsets lay it out: the attention's partials, then `h`
    /// and the activation in 16-byte pieces, and with `next` [`NEXT_QKV`]'s raw columns.
    pub(super) fn scratch_floats(&self, size: usize, splits: usize, next: bool) -> usize {
        let part = self.hq * splits * (self.d + 2);
        let raw = if next {
            (self.hq + 2 * self.hkv) * self.d
        } else {
            0
        };
        part.div_ceil(4) * 4 + pieces_floats(self.k, size) + pieces_floats(self.i, size) + raw
    }

    /// The template arguments `K`, `HQ`, `HKV`, `D`, `I` and `S` (`splits` of each head's
    /// positions) of the kernels that run [`ATTENTION_MLP`].
    pub(super) fn template_args(&self, splits: usize) -> [TemplateArg; 6] {
        [
            TemplateArg::Int("K", self.k as i32),
            TemplateArg::Int("HQ", self.hq as i32),
            TemplateArg::Int("HKV", self.hkv as i32),
            TemplateArg::Int("D", self.d as i32),
            TemplateArg::Int("I", self.i as i32),
            TemplateArg::Int("S", splits as i32),
        ]
    }
}

/// The blocks of a launch (one per multiprocessor) and the splits of each head's positions, when
/// the kernel (blocks of `warps` warps, with `extra` bytes of shared memory of its own) fits this
/// GPU and these sizes.
pub(super) fn launch_shape(
    s: &Sizes,
    dtype: Dtype,
    warps: usize,
    extra: usize,
) -> Option<(usize, usize)> {
    let size = match dtype {
        Dtype::Float32 => 4,
        Dtype::Bfloat16 | Dtype::Float16 => 2,
        _ => return None,
    };
    let blocks = kernel::multiprocessors()?;
    let stage = (s.hq * s.d).max(s.k).max(s.i) * size;
    let splits = (blocks / s.hq).max(1);
    let shared = stage + (warps * s.d + 2 * warps + 32 + 2 * s.hq * splits + 2 * s.hq) * 4 + extra;
    let fits = s.d.is_multiple_of(32)
        && s.d <= 256
        && s.hkv > 0
        && s.hq.is_multiple_of(s.hkv)
        && shared <= SHARED_BYTES
        && s.k.is_multiple_of(8)
        && s.i.is_multiple_of(8);
    fits.then_some((blocks, splits))
}

/// The arrays of one launch; the weights are all dense or all quantized alike
/// ([`Mat::same_kind`]).
struct Inputs<'a> {
    q: &'a Array,
    kv: &'a Array,
    len: &'a Array,
    x: &'a Array,
    wo: &'a Mat,
    norm: &'a Array,
    wgu: &'a Mat,
    wd: &'a Mat,
}

/// The arrays and constants of the next block's QKV step ([`NEXT_QKV`]).
pub(super) struct NextInputs {
    pub norm: Array,
    pub w: Mat,
    pub bias: Option<Array>,
    pub qk: Option<(Array, Array)>,
    pub freqs: Array,
    pub pos: Array,
    pub eps: f32,
    pub qk_eps: f32,
    /// The next block's cache, to write its keys and values into ([`NormQkv::cache`]).
    pub cache: Option<Array>,
}

impl NextInputs {
    /// The arrays of `n` for a kernel whose input rows are `rows`, when its weight (and bias)
    /// can be read in the rows' dtype; the cache only where the kernel may write it in place
    /// ([`writable_cache`]).
    pub(super) fn of<B: Backend>(n: &NormQkv<B>, rows: &MlxTensor) -> Option<Self> {
        let dtype = rows.array.dtype();
        let bias = match n.layer.bias() {
            None => None,
            Some(b) => Some(dense_array(b.clone(), dtype)?),
        };
        let l = n.layout;
        Some(NextInputs {
            norm: array_of(n.norm),
            w: n.layer.mat(dtype)?,
            bias,
            qk: n.qk_norms.map(|(q, k)| (array_of(q), array_of(k))),
            freqs: array_of(n.rope.inverse_frequencies()),
            pos: n.offset.array(),
            eps: n.eps as f32,
            qk_eps: n.qk_eps as f32,
            cache: n
                .cache
                .and_then(|c| writable_cache(c, rows, [1, 2 * l.kv_heads, l.head_dim], n.offset)),
        })
    }
}

/// `attention_mlp`'s kernel on `a` (and, with `next`, the next block's QKV step), launched on
/// `blocks` blocks with `splits` splits of each head's positions: the block's output (and the
/// next block's queries and keys/values).
#[allow(clippy::too_many_arguments)]
fn launch(
    a: &Inputs,
    s: &Sizes,
    (blocks, splits): (usize, usize),
    scale: f32,
    eps: f32,
    gelu: bool,
    next: Option<&NextInputs>,
) -> Result<Vec<Array>, MlxError> {
    let dtype = a.x.dtype();
    let warps = warps(dtype, a.wo, next.is_some());
    let size = if dtype == Dtype::Float32 { 4 } else { 2 };
    let work = s.scratch_floats(size, splits, next.is_some());
    let [counter, after] = counted_inputs()?;
    let y_shape = dims_i32(&[1, s.k]);
    let work_shape = dims_i32(&[work]);
    let [q, gs] = a.wo.template_args();
    let mut targs = vec![TemplateArg::Dtype("T", dtype), q, gs];
    targs.extend(s.template_args(splits));
    targs.extend([
        TemplateArg::Int("SCALE", scale.to_bits() as i32),
        TemplateArg::Int("EPS", eps.to_bits() as i32),
        TemplateArg::Int("GELU", gelu as i32),
        TemplateArg::Int("WARPS", warps as i32),
    ]);
    let grid = [(blocks * warps * 32) as i32, 1, 1];
    let block = [(warps * 32) as i32, 1, 1];
    let header = header();
    let mut names = vec![
        "q",
        "kv",
        "len",
        "x",
        "wo",
        "wo_scales",
        "wo_biases",
        "g",
        "wgu",
        "wgu_scales",
        "wgu_biases",
        "wd",
        "wd_scales",
        "wd_biases",
        "sync",
        "after",
    ];
    let [wo, wo_s, wo_b] = a.wo.inputs();
    let [wgu, wgu_s, wgu_b] = a.wgu.inputs();
    let [wd, wd_s, wd_b] = a.wd.inputs();
    let mut inputs = vec![
        a.q, a.kv, a.len, a.x, wo, wo_s, wo_b, a.norm, wgu, wgu_s, wgu_b, wd, wd_s, wd_b, &counter,
        &after,
    ];
    let mut outputs: Vec<(&[i32], Dtype)> = vec![(&y_shape, dtype)];
    let mut output_names = vec!["y"];
    let q_shape = dims_i32(&[1, s.hq, 1, s.d]);
    let kv_shape = dims_i32(&[1, 2 * s.hkv, 1, s.d]);
    if let Some(n) = next {
        // Without a bias or norms their arrays are not read: an array of the rows' dtype and the
        // frequencies stand in for them.
        let bias = n.bias.as_ref().unwrap_or(n.w.stand_in());
        let (qw, kw) = n.qk.as_ref().map_or((&n.freqs, &n.freqs), |(q, k)| (q, k));
        let [w, w_s, w_b] = n.w.inputs();
        names.extend([
            "g2",
            "wqkv",
            "wqkv_scales",
            "wqkv_biases",
            "bias2",
            "qw",
            "kw",
            "freqs",
            "pos",
            "kvc",
        ]);
        // Without a cache to write, the block's input rows stand in for it, unread.
        let kvc = n.cache.as_ref().unwrap_or(a.x);
        inputs.extend([&n.norm, w, w_s, w_b, bias, qw, kw, &n.freqs, &n.pos, kvc]);
        outputs.extend([(&q_shape[..], dtype), (&kv_shape[..], dtype)]);
        output_names.extend(["q2", "kv2"]);
        targs.extend([
            TemplateArg::Int("EPS2", n.eps.to_bits() as i32),
            TemplateArg::Int("QK_EPS", n.qk_eps.to_bits() as i32),
            TemplateArg::Int("NORM", n.qk.is_some() as i32),
            TemplateArg::Int("BIAS", n.bias.is_some() as i32),
            TemplateArg::Int("HEAD_COUNTS", HEAD_COUNTS as i32),
            TemplateArg::Int("CACHE", n.cache.is_some() as i32),
        ]);
    }
    outputs.push((&work_shape, Dtype::Float32));
    output_names.push("work");
    let name = match next {
        None => "burn_mlx_attention_mlp",
        Some(_) => "burn_mlx_attention_mlp_qkv",
    };
    // The source is read only on the kernel's first use in the process.
    let source = || match next {
        None => format!("{ATTENTION_MLP_PRELUDE}{ATTENTION_MLP}"),
        Some(_) => format!("{ATTENTION_MLP_PRELUDE}{ATTENTION_MLP}{NEXT_QKV}"),
    };
    kernel::with_strided_kernel(
        name,
        &names,
        &output_names,
        source,
        header,
        |k: &CudaKernel| k.apply(&inputs, &outputs, &targs, grid, block),
    )
    .map(|mut out| {
        // `work` is scratch; the thread's next counted launch waits for it.
        if let Some(work) = out.pop() {
            counted(&work);
        }
        out
    })
}

/// The floats of scratch that hold `values` values of `size` bytes in whole 16-byte pieces, as
/// the kernels' scratch offsets round them.
pub(super) fn pieces_floats(values: usize, size: usize) -> usize {
    (values * size).div_ceil(16) * 4
}

/// The first entry of [`super::cuda::counters`] that [`NEXT_QKV`] counts heads in (below it: the
/// barrier and `norm_qkv_heads`'s counts).
pub(super) const HEAD_COUNTS: usize = COUNTERS / 2;

/// The arguments of [`attention_mlp`], for the paths it and [`attention_mlp_qkv`] share.
struct Block<'a, B: Backend> {
    q: Tensor<B, 4>,
    kv: Tensor<B, 4>,
    len: &'a At<B>,
    scale: f64,
    x: Tensor<B, 2>,
    o_proj: Linear<'a, B>,
    norm: &'a Tensor<B, 1>,
    eps: f64,
    gate_up: Linear<'a, B>,
    down: Linear<'a, B>,
    gate: Gate,
}

impl<B: Backend> Block<'_, B> {
    /// The block through the kernel (with `next`: also the next block's heads, see
    /// [`attention_mlp_qkv`]) when it runs here: its outputs, and whether the next block's keys
    /// and values went into its cache; `self` back otherwise.
    fn fused(mut self, next: Option<&NormQkv<B>>) -> Result<(Vec<MlxTensor>, bool), Self> {
        let [b, hq, _, d] = self.q.dims();
        let [_, heads, _, _] = self.kv.dims();
        let [_, k] = self.x.dims();
        let [_, width] = self.gate_up.dims();
        let sizes = Sizes {
            k,
            hq,
            hkv: heads / 2,
            d,
            i: width / 2,
        };
        let (o_proj, gate_up, down) =
            (self.o_proj.clone(), self.gate_up.clone(), self.down.clone());
        let next_fits = next.is_none_or(|n| {
            let l = n.layout;
            (l.heads, l.kv_heads, l.head_dim) == (hq, heads / 2, d)
                && n.layer.dims() == [k, l.width()]
                && n.norm.dims() == [k]
                && l.width() / d <= COUNTERS - HEAD_COUNTS
        });
        let fits = b == 1
            && grid_kernel_on()
            && next_fits
            && o_proj.dims() == [hq * d, k]
            && down.dims() == [width / 2, k]
            && gate_up.dims()[0] == k
            && self.norm.dims() == [k]
            && [&o_proj, &gate_up, &down]
                .iter()
                .all(|p| p.bias().is_none());
        if !fits {
            return Err(self);
        }
        let t = match kernel_input(self.q) {
            Ok(t) => t,
            Err(q) => {
                self.q = q;
                return Err(self);
            }
        };
        let dtype = t.array.dtype();
        let weights = (o_proj.mat(dtype), gate_up.mat(dtype), down.mat(dtype));
        let xa = array_of(&self.x);
        let next = next.map(|n| NextInputs::of(n, &t));
        // With the most warps a launch takes, an upper bound of its shared memory.
        let shape = launch_shape(&sizes, dtype, WARPS, 0);
        // Every weight read as the kernel reads it, and all of one kind (one launch takes one
        // `Q` and `GS`).
        let (Some(wo), Some(wgu), Some(wd)) = weights else {
            self.q = float_from_mlx(t);
            return Err(self);
        };
        // `next` given but not fused (its weight not readable in `dtype`): none of it runs here.
        let next = match next {
            None => None,
            Some(Some(n)) => Some(n),
            Some(None) => {
                self.q = float_from_mlx(t);
                return Err(self);
            }
        };
        let one_kind = wo.same_kind(&wgu)
            && wo.same_kind(&wd)
            && next.as_ref().is_none_or(|n| wo.same_kind(&n.w));
        if !one_kind {
            self.q = float_from_mlx(t);
            return Err(self);
        }
        let (Some(shape), true) = (shape, xa.dtype() == dtype) else {
            self.q = float_from_mlx(t);
            return Err(self);
        };
        let kva = array_of(&self.kv);
        let n = self.len.array();
        let g = array_of(self.norm);
        let inputs = Inputs {
            q: &t.array,
            kv: &kva,
            len: &n,
            x: &xa,
            wo: &wo,
            norm: &g,
            wgu: &wgu,
            wd: &wd,
        };
        let gelu = self.gate == Gate::GeluTanh;
        let (scale, eps) = (self.scale as f32, self.eps as f32);
        let out = t
            .device
            .scope(|| launch(&inputs, &sizes, shape, scale, eps, gelu, next.as_ref()))
            .or_panic("attention_mlp", &[&t.array, &kva, &xa, wo.inputs()[0]]);
        let cached = next.as_ref().is_some_and(|n| n.cache.is_some());
        Ok((out.into_iter().map(|a| t.with(a)).collect(), cached))
    }

    /// The block through the four functions it stands for.
    fn composed(self) -> Tensor<B, 2> {
        let attended = decode_attention_joint(self.q, self.kv, self.len, self.scale, None);
        let h = linear_add(attended, self.o_proj, self.x);
        let act = norm_gated(h.clone(), self.norm, self.eps, self.gate_up, self.gate);
        linear_add(act, self.down, h)
    }
}

/// The rest of a pre-norm decoder block's decode step once the new position is in the cache:
/// attention of `q` (`[batch, heads, 1, head_dim]`) over the first `len` positions of `kv`
/// (`[batch, 2·kv_heads, capacity, head_dim]`, keys then values, as
/// [`decode_attention_joint`] takes them) with `scale`, the output projection `o_proj` and the
/// residual `x` (`[batch, hidden]`), then the post-attention RMS norm (`norm`, `eps`), the
/// gate/up projection with `gate`, and the down projection with its residual. Returns the
/// block's output, `[batch, hidden]`:
///
/// ```text
/// h = linear_add(decode_attention_joint(q, kv, len, scale), o_proj, x)
/// y = linear_add(norm_gated(h, norm, eps, gate_up, gate), down, h)
/// ```
///
/// On MLX's CUDA device, for one sequence and projections without biases, one kernel (see the
/// module's docs); elsewhere those four functions.
///
/// # Panics
///
/// When the shapes do not fit together (see the four functions).
#[allow(clippy::too_many_arguments)]
pub fn attention_mlp<'a, B: Backend>(
    q: Tensor<B, 4>,
    kv: Tensor<B, 4>,
    len: &At<B>,
    scale: f64,
    x: Tensor<B, 2>,
    o_proj: impl Into<Linear<'a, B>>,
    norm: &Tensor<B, 1>,
    eps: f64,
    gate_up: impl Into<Linear<'a, B>>,
    down: impl Into<Linear<'a, B>>,
    gate: Gate,
) -> Tensor<B, 2> {
    let (y, _) = attention_mlp_qkv(
        q, kv, len, scale, x, o_proj, norm, eps, gate_up, down, gate, None,
    );
    y
}

/// [`attention_mlp`], and with `next` the next block's QKV step on its output: returns the
/// block's output `y` and, with `next`, `next.heads_joint_cached(y)` (the next block's queries,
/// keys and values, see [`NormQkv`]). On MLX's CUDA device, where [`attention_mlp`] is one kernel
/// and the next block has the same heads, the QKV step runs inside that kernel after a fourth
/// barrier, and writes the next block's keys and values into `next.cache` where it is given, so
/// a decoder block's decode step is one kernel.
///
/// # Panics
///
/// When the shapes do not fit together (see [`attention_mlp`] and [`super::norm_qkv_heads`]).
#[allow(clippy::too_many_arguments)]
pub fn attention_mlp_qkv<'a, B: Backend>(
    q: Tensor<B, 4>,
    kv: Tensor<B, 4>,
    len: &At<B>,
    scale: f64,
    x: Tensor<B, 2>,
    o_proj: impl Into<Linear<'a, B>>,
    norm: &Tensor<B, 1>,
    eps: f64,
    gate_up: impl Into<Linear<'a, B>>,
    down: impl Into<Linear<'a, B>>,
    gate: Gate,
    next: Option<&NormQkv<B>>,
) -> (Tensor<B, 2>, Option<JointHeads<B>>) {
    if let Some(n) = next {
        n.check("attention_mlp_qkv", &x);
    }
    let block = Block {
        q,
        kv,
        len,
        scale,
        x,
        o_proj: o_proj.into(),
        norm,
        eps,
        gate_up: gate_up.into(),
        down: down.into(),
        gate,
    };
    match block.fused(next) {
        Ok((out, cached)) => {
            let mut out = out.into_iter();
            let y = float_from_mlx(out.next().expect("the block's output"));
            let heads = next.map(|_| {
                let mut take = || float_from_mlx(out.next().expect("the next block's heads"));
                JointHeads {
                    q: take(),
                    kv: take(),
                    cached,
                }
            });
            (y, heads)
        }
        Err(block) => {
            let y = block.composed();
            let heads = next.map(|n| n.heads_joint_cached(y.clone()));
            (y, heads)
        }
    }
}
