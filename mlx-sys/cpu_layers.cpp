// burn-mlx: CPU primitives for the pieces of a transformer layer that MLX's CPU backend runs as
// many small ops: RMS norm, rotary embeddings (RoPE), the split of a fused QKV projection into
// normalized and rotated heads, one query position's attention over a key/value cache, and the
// gated activations of a fused gate/up projection.
//
// MLX's CPU build has no kernels for `fast::rms_norm` and `fast::rope`: both fall back to their
// composed definitions (an RMS norm is `Square`, `Sum` and a fused elementwise op; a RoPE call
// is `Arange`, `Cos`, `Sin`, slices, products and a `Concatenate`, its angles computed again at
// every call). Each primitive costs MLX's evaluation a few microseconds of host work besides its
// arithmetic, and an LLM decode step on the CPU is a few kilobytes of work per op, so these
// ops were about a third of a decode step's 564 primitives and of its time. Each primitive here
// is one pass over its data on the CPU stream's thread, in float32 arithmetic (float16 and
// bfloat16 inputs are widened as they are read and rounded once where MLX's own ops round).
//
// The C entries at the end take these primitives on a CPU stream for float32, float16 and
// bfloat16 (unless BURN_MLX_CPU_KERNELS=0, or while a graph is traced for an MLX function file,
// which must hold only MLX's own primitives); `burn_mlx_rms_norm` and `burn_mlx_rope` give MLX's
// own op otherwise. RMS norm and RoPE have gradients (as MLX ops), so MLX's transforms and
// `compile` handle them like any primitive; the decode primitives are for inference and say so
// if asked for a gradient.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/c/array.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/stream.h"
#include "mlx/c/private/vector.h"
#include "mlx/fast.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

// Whether this thread is tracing a function for an MLX function file (`export.cpp`).
extern "C" bool burn_mlx_in_export();
// Keeps `what` for `burn_mlx_fast_last_error` and returns 1 (`fast_unary.cpp`).
int burn_mlx_fast_fail(const char* what);

namespace {

using Arrays = std::vector<mx::array>;

// ---------------------------------------------------------------------------------------------
// Element access

// Calls `f` with a value of the C++ type of `dtype` (float, float16_t or bfloat16_t).
template <class F>
void by_float_dtype(mx::Dtype dtype, const char* op, F&& f) {
  if (dtype == mx::float32) {
    f(float{});
  } else if (dtype == mx::float16) {
    f(mx::float16_t{});
  } else if (dtype == mx::bfloat16) {
    f(mx::bfloat16_t{});
  } else {
    throw std::invalid_argument(
        std::string("[") + op + "] takes float32, float16 or bfloat16 arrays");
  }
}

template <typename T>
[[gnu::always_inline]] inline float widen(T v) {
  return static_cast<float>(v);
}

// `v` rounded to T and widened again: the value a T array holds after storing `v`.
template <typename T>
[[gnu::always_inline]] inline float round_to(float v) {
  return static_cast<float>(static_cast<T>(v));
}

// The elements of `a` (dtype T) in row-major order: its own buffer where it is row-contiguous,
// otherwise a copy gathered through its strides into `scratch`.
template <typename T>
const T* row_major(const mx::array& a, std::vector<T>& scratch) {
  if (a.flags().row_contiguous) {
    return a.data<T>();
  }
  scratch.resize(a.size());
  const T* src = a.data<T>();
  const auto& shape = a.shape();
  const auto& strides = a.strides();
  const int nd = static_cast<int>(shape.size());
  std::vector<int64_t> index(nd, 0);
  for (size_t i = 0; i < a.size(); i++) {
    int64_t offset = 0;
    for (int d = 0; d < nd; d++) {
      offset += index[d] * strides[d];
    }
    scratch[i] = src[offset];
    for (int d = nd - 1; d >= 0; d--) {
      if (++index[d] < shape[d]) {
        break;
      }
      index[d] = 0;
    }
  }
  return scratch.data();
}

// The one value of an integer array of one element (a position or a length).
int64_t one_integer(const mx::array& a, const char* op) {
  if (a.size() != 1) {
    throw std::invalid_argument(
        std::string("[") + op + "] expects a position of one element, got " +
        std::to_string(a.size()));
  }
  switch (a.dtype()) {
    case mx::int32:
      return *a.data<int32_t>();
    case mx::int64:
      return *a.data<int64_t>();
    case mx::uint32:
      return *a.data<uint32_t>();
    case mx::uint64:
      return static_cast<int64_t>(*a.data<uint64_t>());
    case mx::int16:
      return *a.data<int16_t>();
    case mx::uint16:
      return *a.data<uint16_t>();
    case mx::int8:
      return *a.data<int8_t>();
    case mx::uint8:
      return *a.data<uint8_t>();
    default:
      throw std::invalid_argument(
          std::string("[") + op + "] expects an integer position");
  }
}

// The sum of x[i]^2 over `n` values, in eight lanes (a single running sum would keep the loop
// from being vectorized).
template <typename T>
float sum_squares(const T* x, int n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; j++) {
      float v = widen(x[i + j]);
      lanes[j] += v * v;
    }
  }
  float s = 0;
  for (int j = 0; j < 8; j++) {
    s += lanes[j];
  }
  for (; i < n; i++) {
    float v = widen(x[i]);
    s += v * v;
  }
  return s;
}

// The dot product of `a` (float) and `b` (T) over `n` values, in eight lanes.
template <typename T>
float dot(const float* a, const T* b, int n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; j++) {
      lanes[j] += a[i + j] * widen(b[i + j]);
    }
  }
  float s = 0;
  for (int j = 0; j < 8; j++) {
    s += lanes[j];
  }
  for (; i < n; i++) {
    s += a[i] * widen(b[i]);
  }
  return s;
}

// cos and sin of (offset + s) * freqs[i] for s < seq, i < half, row by row; sin negated for
// the inverse rotation.
void angles(
    int64_t offset,
    int seq,
    const float* freqs,
    int half,
    bool inverse,
    std::vector<float>& cos_out,
    std::vector<float>& sin_out) {
  cos_out.resize(static_cast<size_t>(seq) * half);
  sin_out.resize(static_cast<size_t>(seq) * half);
  for (int s = 0; s < seq; s++) {
    const float p = static_cast<float>(offset + s);
    for (int i = 0; i < half; i++) {
      const float a = p * freqs[i];
      cos_out[s * half + i] = std::cos(a);
      sin_out[s * half + i] = inverse ? -std::sin(a) : std::sin(a);
    }
  }
}

// Rotates the halves (a, b) of one head: out = (a cos - b sin, b cos + a sin), rounded to T.
template <typename T>
[[gnu::always_inline]] inline void rotate(
    const float* a,
    const float* b,
    const float* c,
    const float* s,
    int half,
    T* out) {
  for (int i = 0; i < half; i++) {
    out[i] = static_cast<T>(a[i] * c[i] - b[i] * s[i]);
    out[i + half] = static_cast<T>(b[i] * c[i] + a[i] * s[i]);
  }
}

// Allocates each output's buffer and registers the arrays with the CPU stream's encoder.
mx::cpu::CommandEncoder& prepare(
    const mx::Stream& stream,
    const std::vector<mx::array>& inputs,
    std::vector<mx::array>& outputs) {
  for (auto& o : outputs) {
    o.set_data(mx::allocator::malloc(o.nbytes()));
  }
  auto& encoder = mx::cpu::get_command_encoder(stream);
  for (const auto& a : inputs) {
    encoder.set_input_array(a);
  }
  for (auto& o : outputs) {
    encoder.set_output_array(o);
  }
  return encoder;
}

std::vector<mx::array> weak_copies(const std::vector<mx::array>& arrays) {
  std::vector<mx::array> out;
  out.reserve(arrays.size());
  for (const auto& a : arrays) {
    out.push_back(mx::array::unsafe_weak_copy(a));
  }
  return out;
}

// The base of the primitives below: CPU only, with a clear message on the GPU.
class CpuPrimitive : public mx::Primitive {
 public:
  explicit CpuPrimitive(mx::Stream stream) : mx::Primitive(stream) {}

 protected:
  // Allocates the outputs and runs `body(T{}, inputs, outputs)` on the CPU stream's thread, T the
  // C++ type of the first input's dtype (the arrays as weak copies: MLX keeps their buffers alive
  // until the task has run).
  template <class Body>
  void run_on_stream(
      const std::vector<mx::array>& inputs,
      std::vector<mx::array>& outputs,
      Body body) {
    auto& encoder = prepare(stream(), inputs, outputs);
    encoder.dispatch([in = weak_copies(inputs),
                      out = weak_copies(outputs),
                      op = name(),
                      body]() mutable {
      by_float_dtype(in[0].dtype(), op, [&](auto t) { body(t, in, out); });
    });
  }

 public:

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error(
        std::string("[") + name() +
        "] is a CPU kernel; burn-mlx uses MLX's own ops or its CUDA kernels on the GPU");
  }
};

// The base of the decode primitives, which have no gradient.
class InferencePrimitive : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;

  std::vector<mx::array> vjp(
      const std::vector<mx::array>&,
      const std::vector<mx::array>&,
      const std::vector<int>&,
      const std::vector<mx::array>&) override {
    throw std::runtime_error(
        std::string("[") + name() +
        "] is an inference kernel of a decode step and has no gradient; differentiate the "
        "composed ops (burn_mlx::decode::set_kernels(false), or BURN_MLX_DECODE_KERNELS=0)");
  }
};

// ---------------------------------------------------------------------------------------------
// RMS norm

// y = w * (x / sqrt(mean(x^2) + eps)) over the last axis, rounded as MLX's `fast::rms_norm`
// rounds: T(w * T(x * inv)).
class BurnMlxRmsNorm : public CpuPrimitive {
 public:
  BurnMlxRmsNorm(mx::Stream stream, float eps) : CpuPrimitive(stream), eps_(eps) {}

  void eval_cpu(const Arrays& inputs, Arrays& outputs) override {
    run_on_stream(inputs, outputs, [eps = eps_](auto t, Arrays& in, Arrays& outs) {
      using T = decltype(t);
      mx::array& out = outs[0];
      std::vector<T> xs, ws;
      const T* x = row_major(in[0], xs);
      const T* w = row_major(in[1], ws);
      T* y = out.data<T>();
      const int n = in[0].shape().back();
      const size_t rows = n == 0 ? 0 : in[0].size() / n;
      for (size_t r = 0; r < rows; r++) {
        const T* xr = x + r * n;
        T* yr = y + r * n;
        const float inv = 1.0f / std::sqrt(sum_squares(xr, n) / n + eps);
        for (int i = 0; i < n; i++) {
          yr[i] = static_cast<T>(widen(w[i]) * round_to<T>(widen(xr[i]) * inv));
        }
      }
    });
  }

  // The gradients as MLX ops, in float32: with r = 1/sqrt(mean(x^2) + eps), n = x r and
  // g' = g w, dx = r (g' - n mean(g' n)) and dw = the sum of g n over every axis but the last.
  std::vector<mx::array> vjp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>& argnums,
      const std::vector<mx::array>&) override {
    auto s = stream();
    const auto& x = primals[0];
    const auto& w = primals[1];
    auto xf = mx::astype(x, mx::float32, s);
    auto wf = mx::astype(w, mx::float32, s);
    auto g = mx::astype(cotangents[0], mx::float32, s);
    auto r = mx::rsqrt(
        mx::add(mx::mean(mx::square(xf, s), -1, true, s), mx::array(eps_, mx::float32), s), s);
    auto normed = mx::multiply(xf, r, s);
    std::vector<mx::array> grads;
    for (int arg : argnums) {
      if (arg == 0) {
        auto gw = mx::multiply(g, wf, s);
        auto mean = mx::mean(mx::multiply(gw, normed, s), -1, true, s);
        auto dx = mx::multiply(r, mx::subtract(gw, mx::multiply(normed, mean, s), s), s);
        grads.push_back(mx::astype(dx, x.dtype(), s));
      } else {
        auto gn = mx::multiply(g, normed, s);
        auto flat = mx::reshape(gn, {-1, x.shape().back()}, s);
        grads.push_back(mx::astype(mx::sum(flat, 0, false, s), w.dtype(), s));
      }
    }
    return grads;
  }

  const char* name() const override {
    return "BurnMlxRmsNorm";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const BurnMlxRmsNorm*>(&other);
    return o != nullptr && o->eps_ == eps_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  float eps_;
};

// ---------------------------------------------------------------------------------------------
// RoPE

// "Rotate half" RoPE over the last axis of x ([..., seq, d]): position offset + s for row s,
// inverse frequencies `freqs` ([d/2], float32), computed in float32 and rounded once. With
// `inverse`, the rotation by the opposite angles (its transpose: the gradient).
class BurnMlxRope : public CpuPrimitive {
 public:
  BurnMlxRope(mx::Stream stream, bool inverse) : CpuPrimitive(stream), inverse_(inverse) {}

  void eval_cpu(const Arrays& inputs, Arrays& outputs) override {
    run_on_stream(inputs, outputs, [inverse = inverse_](auto t, Arrays& in, Arrays& outs) {
      using T = decltype(t);
      mx::array& out = outs[0];
      std::vector<T> xs;
      std::vector<float> fs, c, sn;
      const T* x = row_major(in[0], xs);
      const float* f = row_major(in[1], fs);
      const int64_t offset = one_integer(in[2], "BurnMlxRope");
      const auto& shape = in[0].shape();
      const int d = shape.back();
      const int seq = shape[shape.size() - 2];
      const int half = d / 2;
      const size_t lead = seq * d == 0 ? 0 : in[0].size() / (static_cast<size_t>(seq) * d);
      angles(offset, seq, f, half, inverse, c, sn);
      std::vector<float> a(half), b(half);
      T* y = out.data<T>();
      for (size_t l = 0; l < lead; l++) {
        for (int s = 0; s < seq; s++) {
          const size_t row = (l * seq + s) * d;
          for (int i = 0; i < half; i++) {
            a[i] = widen(x[row + i]);
            b[i] = widen(x[row + half + i]);
          }
          rotate(a.data(), b.data(), &c[s * half], &sn[s * half], half, y + row);
        }
      }
    });
  }

  std::vector<mx::array> vjp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>& argnums,
      const std::vector<mx::array>&) override {
    std::vector<mx::array> grads;
    for (int arg : argnums) {
      if (arg == 0) {
        grads.push_back(of(cotangents[0], primals[1], primals[2], stream(), !inverse_));
      } else {
        // The frequencies and the position are not differentiated.
        grads.push_back(mx::zeros_like(primals[arg], stream()));
      }
    }
    return grads;
  }

  static mx::array of(
      const mx::array& x,
      const mx::array& freqs,
      const mx::array& offset,
      mx::Stream stream,
      bool inverse) {
    return mx::array(
        x.shape(), x.dtype(), std::make_shared<BurnMlxRope>(stream, inverse), {x, freqs, offset});
  }

  const char* name() const override {
    return "BurnMlxRope";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const BurnMlxRope*>(&other);
    return o != nullptr && o->inverse_ == inverse_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  bool inverse_;
};

// ---------------------------------------------------------------------------------------------
// QKV heads

// The head layout and options of `BurnMlxQkvHeads`.
struct QkvParams {
  int batch, hq, hkv, d;
  float eps;
  bool norm, joint;

  bool operator==(const QkvParams&) const = default;
};

// Splits qkv ([batch * seq, (hq + 2 hkv) d], sequence by sequence, row s of a sequence at
// position pos + s) into heads-first q ([batch, hq, seq, d]) and k, v ([batch, hkv, seq, d]),
// or q and kv ([batch, 2 hkv, seq, d], keys then values) when `joint`; normalizes each query
// and key head (RMS with the weights qw, kw, [d], when `norm`; rounded to T once, as the CUDA
// kernel does) and rotates it (RoPE with the inverse frequencies `freqs`, [d/2]).
// Inputs: qkv, qw, kw, freqs, pos.
class BurnMlxQkvHeads : public InferencePrimitive {
 public:
  BurnMlxQkvHeads(mx::Stream stream, QkvParams p) : InferencePrimitive(stream), p_(p) {}

  void eval_cpu(const Arrays& inputs, Arrays& outputs) override {
    run_on_stream(inputs, outputs, [p = p_](auto t, Arrays& in, Arrays& out) {
      using T = decltype(t);
      run<T>(in, out, p);
    });
  }

  const char* name() const override {
    return "BurnMlxQkvHeads";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const BurnMlxQkvHeads*>(&other);
    return o != nullptr && o->p_ == p_;
  }

 private:
  template <typename T>
  static void run(std::vector<mx::array>& in, std::vector<mx::array>& out, const QkvParams& p) {
    std::vector<T> qkv_s, qw_s, kw_s;
    std::vector<float> f_s, c, sn;
    const T* qkv = row_major(in[0], qkv_s);
    const T* qw = p.norm ? row_major(in[1], qw_s) : nullptr;
    const T* kw = p.norm ? row_major(in[2], kw_s) : nullptr;
    const float* f = row_major(in[3], f_s);
    const int64_t pos = one_integer(in[4], "BurnMlxQkvHeads");
    const int rows = in[0].shape(0);
    const int seq = rows / p.batch;
    const int heads = p.hq + 2 * p.hkv;
    const int d = p.d, half = d / 2;
    angles(pos, seq, f, half, false, c, sn);
    T* q = out[0].data<T>();
    T* k = out[1].data<T>();
    T* v = p.joint ? k : out[2].data<T>();
    // Where head h of sequence `bi`, row `s` goes in a [batch, heads_out, seq, d] array.
    auto at = [&](T* base, int heads_out, int bi, int h, int s) {
      return base + ((static_cast<size_t>(bi) * heads_out + h) * seq + s) * d;
    };
    const int kv_heads_out = p.joint ? 2 * p.hkv : p.hkv;
    const int v_first = p.joint ? p.hkv : 0;
    std::vector<float> a(half), b(half);
    for (int row = 0; row < rows; row++) {
      const int bi = row / seq, s = row % seq;
      const T* src_row = qkv + static_cast<size_t>(row) * heads * d;
      for (int head = 0; head < heads; head++) {
        const T* src = src_row + static_cast<size_t>(head) * d;
        if (head >= p.hq + p.hkv) {
          std::copy(src, src + d, at(v, kv_heads_out, bi, v_first + head - p.hq - p.hkv, s));
          continue;
        }
        const bool is_q = head < p.hq;
        T* dst = is_q ? at(q, p.hq, bi, head, s) : at(k, kv_heads_out, bi, head - p.hq, s);
        for (int i = 0; i < half; i++) {
          a[i] = widen(src[i]);
          b[i] = widen(src[i + half]);
        }
        if (p.norm) {
          const T* w = is_q ? qw : kw;
          const float inv = 1.0f / std::sqrt(sum_squares(src, d) / d + p.eps);
          for (int i = 0; i < half; i++) {
            a[i] = round_to<T>(a[i] * inv * widen(w[i]));
            b[i] = round_to<T>(b[i] * inv * widen(w[i + half]));
          }
        }
        rotate(a.data(), b.data(), &c[s * half], &sn[s * half], half, dst);
      }
    }
  }

  QkvParams p_;
};

// ---------------------------------------------------------------------------------------------
// Decode attention

struct AttentionParams {
  int batch, hq, hkv, d, window;
  float scale;
  bool joint;

  bool operator==(const AttentionParams&) const = default;
};

// One query position per (batch entry, query head) (q: [batch, hq, 1, d]) over the first
// len positions of the cache (the last `window` of them when window > 0): keys and values
// [batch, hkv, capacity, d], or with `joint` one array [batch, 2 hkv, capacity, d] (keys, then
// values) given twice. out = softmax(q k^T scale) v, [batch, hq d], in float32. The query heads
// that share a key head are done together, so each cached row is read once.
// Inputs: q, keys, values, len.
class BurnMlxDecodeAttention : public InferencePrimitive {
 public:
  BurnMlxDecodeAttention(mx::Stream stream, AttentionParams p)
      : InferencePrimitive(stream), p_(p) {}

  void eval_cpu(const Arrays& inputs, Arrays& outputs) override {
    run_on_stream(inputs, outputs, [p = p_](auto t, Arrays& in, Arrays& out) {
      using T = decltype(t);
      run<T>(in, out[0], p);
    });
  }

  const char* name() const override {
    return "BurnMlxDecodeAttention";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const BurnMlxDecodeAttention*>(&other);
    return o != nullptr && o->p_ == p_;
  }

 private:
  template <typename T>
  static void run(std::vector<mx::array>& in, mx::array& out, const AttentionParams& p) {
    std::vector<T> q_s, k_s, v_s;
    const T* q = row_major(in[0], q_s);
    const T* keys = row_major(in[1], k_s);
    // One buffer given twice (`joint`) is read in place once.
    const bool same = in[2].data<T>() == in[1].data<T>() && in[1].flags().row_contiguous &&
        in[2].flags().row_contiguous;
    const T* values = same ? keys : row_major(in[2], v_s);
    const int cap = in[1].shape(2);
    const int64_t n = one_integer(in[3], "BurnMlxDecodeAttention");
    const int len = static_cast<int>(std::clamp<int64_t>(n, 0, cap));
    const int start = (p.window > 0 && len > p.window) ? len - p.window : 0;
    const int span = len - start;
    const int groups = p.hq / p.hkv;
    const int d = p.d;
    const int hstride = p.joint ? 2 * p.hkv : p.hkv;
    const int voff = p.joint ? p.hkv : 0;
    std::vector<float> qs(static_cast<size_t>(groups) * d);
    std::vector<float> scores(static_cast<size_t>(groups) * std::max(span, 1));
    std::vector<float> acc(static_cast<size_t>(groups) * d);
    T* y = out.data<T>();
    for (int bi = 0; bi < p.batch; bi++) {
      for (int kvh = 0; kvh < p.hkv; kvh++) {
        const T* kb = keys + ((static_cast<size_t>(bi) * hstride + kvh) * cap) * d;
        const T* vb = values + ((static_cast<size_t>(bi) * hstride + voff + kvh) * cap) * d;
        for (int g = 0; g < groups; g++) {
          const T* qr = q + (static_cast<size_t>(bi) * p.hq + kvh * groups + g) * d;
          for (int j = 0; j < d; j++) {
            qs[g * d + j] = widen(qr[j]) * p.scale;
          }
        }
        for (int t = 0; t < span; t++) {
          const T* kr = kb + static_cast<size_t>(start + t) * d;
          for (int g = 0; g < groups; g++) {
            scores[static_cast<size_t>(g) * span + t] = dot(&qs[g * d], kr, d);
          }
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        std::vector<float> total(groups, 0.0f);
        for (int g = 0; g < groups; g++) {
          float* sg = &scores[static_cast<size_t>(g) * span];
          float m = -INFINITY;
          for (int t = 0; t < span; t++) {
            m = std::max(m, sg[t]);
          }
          for (int t = 0; t < span; t++) {
            sg[t] = std::exp(sg[t] - m);
            total[g] += sg[t];
          }
        }
        for (int t = 0; t < span; t++) {
          const T* vr = vb + static_cast<size_t>(start + t) * d;
          for (int g = 0; g < groups; g++) {
            const float w = scores[static_cast<size_t>(g) * span + t];
            float* ag = &acc[g * d];
            for (int j = 0; j < d; j++) {
              ag[j] += w * widen(vr[j]);
            }
          }
        }
        for (int g = 0; g < groups; g++) {
          // An empty span (a length of 0) gives 0 / 0: NaN, as a softmax over nothing does.
          const float inv = 1.0f / total[g];
          T* yr = y + (static_cast<size_t>(bi) * p.hq + kvh * groups + g) * d;
          for (int j = 0; j < d; j++) {
            yr[j] = static_cast<T>(acc[g * d + j] * inv);
          }
        }
      }
    }
  }

  AttentionParams p_;
};

// ---------------------------------------------------------------------------------------------
// Gated activations

// act(gate) * up for gu ([rows, 2 i]: the gate's i columns, then up's): silu(g) = g / (1 +
// exp(-g)), or GELU's tanh form; [rows, i], computed in float32 and rounded once.
class BurnMlxGated : public InferencePrimitive {
 public:
  BurnMlxGated(mx::Stream stream, bool gelu) : InferencePrimitive(stream), gelu_(gelu) {}

  void eval_cpu(const Arrays& inputs, Arrays& outputs) override {
    run_on_stream(inputs, outputs, [gelu = gelu_](auto t, Arrays& in, Arrays& out) {
      using T = decltype(t);
      std::vector<T> gu_s;
      const T* gu = row_major(in[0], gu_s);
      const size_t rows = in[0].shape(0);
      const size_t i_n = in[0].shape(1) / 2;
      T* y = out[0].data<T>();
      for (size_t r = 0; r < rows; r++) {
        const T* g = gu + r * 2 * i_n;
        const T* u = g + i_n;
        T* yr = y + r * i_n;
        for (size_t i = 0; i < i_n; i++) {
          const float x = widen(g[i]);
          const float act = gelu
              ? 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)))
              : x / (1.0f + std::exp(-x));
          yr[i] = static_cast<T>(act * widen(u[i]));
        }
      }
    });
  }

  const char* name() const override {
    return "BurnMlxGated";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const BurnMlxGated*>(&other);
    return o != nullptr && o->gelu_ == gelu_;
  }

 private:
  bool gelu_;
};

// ---------------------------------------------------------------------------------------------
// Entries

// BURN_MLX_CPU_KERNELS=0 turns the RMS norm and RoPE primitives off (MLX's own ops everywhere),
// for comparisons. (The decode primitives follow `burn_mlx::decode::kernels`.)
bool cpu_kernels_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("BURN_MLX_CPU_KERNELS");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

bool float_dtype(mx::Dtype t) {
  return t == mx::float32 || t == mx::float16 || t == mx::bfloat16;
}

// Whether `x` on `stream` takes this file's primitives.
bool takes_cpu_kernel(const mx::array& x, const mx::Stream& stream) {
  return stream.device == mx::Device::cpu && float_dtype(x.dtype()) && !burn_mlx_in_export();
}

// Runs `f`, turning an exception into the entries' failure code (its message kept for
// `burn_mlx_fast_last_error`).
template <class F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    return burn_mlx_fast_fail(e.what());
  }
}

void check(bool ok, const std::string& what) {
  if (!ok) {
    throw std::invalid_argument(what);
  }
}

std::string shape_of(const mx::array& a) {
  std::string s = "[";
  for (size_t i = 0; i < a.ndim(); i++) {
    s += (i ? ", " : "") + std::to_string(a.shape(i));
  }
  return s + "]";
}

} // namespace

// RMS norm of `x` over its last axis with the weight `w` (`[n]`, cast to x's dtype) and `eps`:
// BurnMlxRmsNorm on a CPU stream for float dtypes, MLX's `fast::rms_norm` otherwise. Returns 0,
// or 1 with the message kept for `burn_mlx_fast_last_error`.
extern "C" int burn_mlx_rms_norm(
    mlx_array* res,
    const mlx_array x_,
    const mlx_array w_,
    float eps,
    const mlx_stream s_) {
  return guarded([&] {
    const mx::array& x = mlx_array_get_(x_);
    const mx::Stream& s = mlx_stream_get_(s_);
    mx::array w = mx::astype(mlx_array_get_(w_), x.dtype(), s);
    if (!takes_cpu_kernel(x, s) || !cpu_kernels_enabled()) {
      mlx_array_set_(*res, mx::fast::rms_norm(x, w, eps, s));
      return;
    }
    check(
        x.ndim() >= 1 && w.ndim() == 1 && w.shape(0) == x.shape(-1),
        "[rms_norm] the weight " + shape_of(w) + " must be as long as the last axis of " +
            shape_of(x));
    mlx_array_set_(
        *res, mx::array(x.shape(), x.dtype(), std::make_shared<BurnMlxRmsNorm>(s, eps), {x, w}));
  });
}

// "Rotate half" RoPE of `x` (`[..., seq, d]`) over its whole last axis, row s at position
// `offset + s` (`offset`: an integer array of one element): BurnMlxRope with the inverse
// frequencies `inv_freqs` (`[d/2]`, float32) on a CPU stream for float dtypes; MLX's
// `fast::rope` with the periods `periods` (`1 / inv_freqs`) otherwise. Returns 0, or 1 with the
// message kept.
extern "C" int burn_mlx_rope(
    mlx_array* res,
    const mlx_array x_,
    const mlx_array inv_freqs_,
    const mlx_array periods_,
    const mlx_array offset_,
    const mlx_stream s_) {
  return guarded([&] {
    const mx::array& x = mlx_array_get_(x_);
    const mx::array& inv = mlx_array_get_(inv_freqs_);
    const mx::array& offset = mlx_array_get_(offset_);
    const mx::Stream& s = mlx_stream_get_(s_);
    check(x.ndim() >= 2, "[rope] expects [..., seq, d], got " + shape_of(x));
    const int d = x.shape(-1);
    if (!takes_cpu_kernel(x, s) || !cpu_kernels_enabled()) {
      mlx_array_set_(
          *res,
          mx::fast::rope(
              x, d, false, std::nullopt, 1.0f, mx::reshape(offset, {}, s),
              mlx_array_get_(periods_), s));
      return;
    }
    check(
        d % 2 == 0 && inv.ndim() == 1 && inv.shape(0) == d / 2,
        "[rope] heads of " + std::to_string(d) + " need " + std::to_string(d / 2) +
            " frequencies, got " + shape_of(inv));
    check(offset.size() == 1, "[rope] the offset must hold one integer, got " + shape_of(offset));
    mlx_array_set_(
        *res, BurnMlxRope::of(x, mx::astype(inv, mx::float32, s), offset, s, false));
  });
}

// The query, key and value heads of `qkv` on a CPU stream (BurnMlxQkvHeads; see there),
// written to `res`: q, k, v, or q and kv with `joint`. `qw`, `kw` are read only with `norm`.
// Returns 0, or 1 with the message kept.
extern "C" int burn_mlx_cpu_qkv_heads(
    mlx_vector_array* res,
    const mlx_array qkv_,
    const mlx_array qw_,
    const mlx_array kw_,
    const mlx_array freqs_,
    const mlx_array pos_,
    int batch,
    int hq,
    int hkv,
    int d,
    float eps,
    bool norm,
    bool joint,
    const mlx_stream s_) {
  return guarded([&] {
    const mx::array& qkv = mlx_array_get_(qkv_);
    const mx::Stream& s = mlx_stream_get_(s_);
    check(
        qkv.ndim() == 2 && batch > 0 && hq > 0 && hkv > 0 && d > 0 && d % 2 == 0 &&
            qkv.shape(0) % batch == 0 && qkv.shape(1) == (hq + 2 * hkv) * d &&
            takes_cpu_kernel(qkv, s),
        "[qkv_heads] " + shape_of(qkv) + " does not split into " + std::to_string(batch) +
            " sequences of " + std::to_string(hq) + " + 2 x " + std::to_string(hkv) +
            " heads of " + std::to_string(d) + " (float, on the CPU)");
    const int seq = qkv.shape(0) / batch;
    // Without norms the weights are not read: `qkv` stands in for them (no cast to add).
    auto qw = norm ? mx::astype(mlx_array_get_(qw_), qkv.dtype(), s) : qkv;
    auto kw = norm ? mx::astype(mlx_array_get_(kw_), qkv.dtype(), s) : qkv;
    auto freqs = mx::astype(mlx_array_get_(freqs_), mx::float32, s);
    if (norm) {
      check(
          qw.size() == static_cast<size_t>(d) && kw.size() == static_cast<size_t>(d),
          "[qkv_heads] the norms' weights " + shape_of(qw) + ", " + shape_of(kw) +
              " must hold " + std::to_string(d) + " values");
    }
    check(
        freqs.size() == static_cast<size_t>(d / 2),
        "[qkv_heads] " + std::to_string(d / 2) + " frequencies needed, got " + shape_of(freqs));
    std::vector<mx::Shape> shapes = {{batch, hq, seq, d}};
    if (joint) {
      shapes.push_back({batch, 2 * hkv, seq, d});
    } else {
      shapes.push_back({batch, hkv, seq, d});
      shapes.push_back({batch, hkv, seq, d});
    }
    std::vector<mx::Dtype> dtypes(shapes.size(), qkv.dtype());
    auto outs = mx::array::make_arrays(
        std::move(shapes),
        dtypes,
        std::make_shared<BurnMlxQkvHeads>(s, QkvParams{batch, hq, hkv, d, eps, norm, joint}),
        {qkv, qw, kw, freqs, mlx_array_get_(pos_)});
    mlx_vector_array_set_(*res, outs);
  });
}

// Attention of one query position over the first `len` cached positions on a CPU stream
// (BurnMlxDecodeAttention; see there), written to `res` as [batch, hq d]. Returns 0, or 1 with
// the message kept.
extern "C" int burn_mlx_cpu_decode_attention(
    mlx_array* res,
    const mlx_array q_,
    const mlx_array keys_,
    const mlx_array values_,
    const mlx_array len_,
    int batch,
    int hq,
    int hkv,
    int d,
    float scale,
    int window,
    bool joint,
    const mlx_stream s_) {
  return guarded([&] {
    const mx::array& q = mlx_array_get_(q_);
    const mx::array& keys = mlx_array_get_(keys_);
    const mx::array& values = mlx_array_get_(values_);
    const mx::Stream& s = mlx_stream_get_(s_);
    const int hstride = joint ? 2 * hkv : hkv;
    check(
        q.ndim() == 4 && keys.ndim() == 4 && hkv > 0 && hq % hkv == 0 &&
            q.shape() == mx::Shape{batch, hq, 1, d} && keys.shape(0) == batch &&
            keys.shape(1) == hstride && keys.shape(3) == d && values.shape() == keys.shape() &&
            keys.dtype() == q.dtype() && values.dtype() == q.dtype() && takes_cpu_kernel(q, s),
        "[decode_attention] q " + shape_of(q) + " and the cache " + shape_of(keys) + ", " +
            shape_of(values) + " do not fit (float, on the CPU)");
    mlx_array_set_(
        *res,
        mx::array(
            {batch, hq * d},
            q.dtype(),
            std::make_shared<BurnMlxDecodeAttention>(
                s, AttentionParams{batch, hq, hkv, d, window, scale, joint}),
            {q, keys, values, mlx_array_get_(len_)}));
  });
}

// act(gate) * up of `gu` ([rows, 2 i]) on a CPU stream (BurnMlxGated; GELU's tanh form with
// `gelu`, SiLU otherwise), written to `res` as [rows, i]. Returns 0, or 1 with the message kept.
extern "C" int burn_mlx_cpu_gated(
    mlx_array* res,
    const mlx_array gu_,
    bool gelu,
    const mlx_stream s_) {
  return guarded([&] {
    const mx::array& gu = mlx_array_get_(gu_);
    const mx::Stream& s = mlx_stream_get_(s_);
    check(
        gu.ndim() == 2 && gu.shape(1) % 2 == 0 && takes_cpu_kernel(gu, s),
        "[gated] expects [rows, 2 i] of floats on the CPU, got " + shape_of(gu));
    mlx_array_set_(
        *res,
        mx::array(
            {gu.shape(0), gu.shape(1) / 2},
            gu.dtype(),
            std::make_shared<BurnMlxGated>(s, gelu),
            {gu}));
  });
}
