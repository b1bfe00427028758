// burn-mlx: vectorized float32 `exp`, `tanh`, `erf` and `sigmoid` for MLX's CPU backend.
//
// The `mlx-cpu` wheel's libmlx is built for baseline x86-64 (no AVX2, no FMA). Its `exp` runs
// one element at a time and calls libm's `fmaf` for every polynomial term; its `tanh` and `erf`
// are libm's scalar functions. In a Transformer training step on the CPU these transcendental
// functions (softmax, cross-entropy, GELU and its backward pass) were about half of the time of
// the thread that runs MLX's kernels (BENCHMARKS.md). This file adds one MLX primitive,
// `BurnMlxFastUnary`, whose CPU kernels are branch-free loops that the compiler vectorizes,
// built twice: for AVX2 + FMA (chosen at run time when the CPU has them) and for the baseline.
//
// The kernels: `exp` reduces x = k ln2 + r with |r| <= ln2/2 and evaluates a degree-6
// polynomial; `tanh` is an odd polynomial below 0.625 and 1 - 2 / (exp(2|x|) + 1) above;
// `erf` is an odd polynomial below 1 and 1 - exp(Q(|x|)) above; `sigmoid` is
// 1 / (1 + exp(-x)). The coefficients are least-squares fits made by
// `scripts/fit_fast_unary.py`, which also replays the kernels' float32 arithmetic against
// double-precision references: largest errors 1.3 ulp (exp, tanh) and 2.4 ulp (erf). NaN in
// gives NaN out, exp(-inf) = 0, exp(+inf) = +inf, tanh(±inf) = ±1, erf(±inf) = ±1.
//
// The primitive is used only for float32 arrays on a CPU stream (`burn_mlx_fast_unary` falls
// back to MLX's own op otherwise, and everywhere when BURN_MLX_FAST_UNARY=0). Its gradients
// are MLX ops, so MLX's autodiff and `compile` handle it like any other primitive (compile
// leaves it unfused).
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/common/unary.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/c/array.h"
#include "mlx/c/private/array.h"
#include "mlx/c/private/stream.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

// Whether this thread is tracing a function for an MLX function file (`export.cpp`).
extern "C" bool burn_mlx_in_export();

namespace {

enum class FastOp : int { Exp = 0, Tanh = 1, Erf = 2, Sigmoid = 3 };

// a * b + c, as one fused operation where the kernel is built for FMA.
template <bool Fma>
[[gnu::always_inline]] inline float madd(float a, float b, float c) {
  if constexpr (Fma) {
    return __builtin_fmaf(a, b, c);
  } else {
    return a * b + c;
  }
}

// Degree-6 fit of exp(r) on [-ln2/2, ln2/2], highest power first.
constexpr float kExp[7] = {
    1.382942055e-03f,
    8.374771520e-03f,
    4.166835803e-02f,
    1.666642083e-01f,
    4.999999149e-01f,
    1.000000036e+00f,
    1.000000001e+00f};

// tanh(x) = x + x^3 P(x^2) for |x| < 0.625.
constexpr float kTanhSmall[5] = {
    -5.718978859e-03f,
    2.065314083e-02f,
    -5.374466363e-02f,
    1.333151275e-01f,
    -3.333328522e-01f};

// erf(x) = x P(x^2) for |x| < 1.
constexpr float kErfSmall[7] = {
    7.898202233e-05f,
    -8.024351400e-04f,
    5.190053215e-03f,
    -2.685480830e-02f,
    1.128361242e-01f,
    -3.761262884e-01f,
    1.128379167e+00f};

// erf(x) = 1 - exp(Q(x)) for 1 <= x <= 4 (erf rounds to 1 in float32 beyond).
constexpr float kErfLarge[11] = {
    -2.792213271e-07f,
    5.997032960e-06f,
    -5.541894172e-05f,
    2.703179677e-04f,
    -5.343698156e-04f,
    -2.037385538e-03f,
    2.195978454e-02f,
    -1.051673021e-01f,
    -6.353028944e-01f,
    -1.128805867e+00f,
    6.190784501e-05f};

// c[0] x^(N-1) + ... + c[N-1], by Horner's rule (unrolled: a loop here would keep the
// element loop from being vectorized).
template <bool Fma, int N>
[[gnu::always_inline]] inline float horner(const float (&c)[N], float x) {
  float p = c[0];
#pragma GCC unroll 16
  for (int i = 1; i < N; i++) {
    p = madd<Fma>(p, x, c[i]);
  }
  return p;
}

[[gnu::always_inline]] inline float select_nan(float x, float y) {
  return x != x ? x : y;
}

[[gnu::always_inline]] inline float copy_sign(float magnitude, float sign) {
  uint32_t m = std::bit_cast<uint32_t>(magnitude) & 0x7fffffffu;
  uint32_t s = std::bit_cast<uint32_t>(sign) & 0x80000000u;
  return std::bit_cast<float>(m | s);
}

template <bool Fma>
[[gnu::always_inline]] inline float fast_exp(float x) {
  // Clamped so that 2^k below stays in range; exp(88.8) overflows and exp(-104) underflows
  // to 0 as the exact results do. (Comparisons, not fminf/fmaxf, so that the loop vectorizes.)
  float xc = x < -104.0f ? -104.0f : x;
  xc = xc > 88.8f ? 88.8f : xc;
  xc = xc == xc ? xc : 0.0f; // NaN: any finite value; the result is replaced below
  // k = round(x / ln2) by the 1.5 * 2^23 trick (round to nearest, no libm call).
  const float magic = 12582912.0f;
  float t = madd<Fma>(xc, 1.44269504088896341f, magic);
  float k = t - magic;
  // r = x - k ln2, with ln2 split so that k * ln2_hi is exact.
  float r = madd<Fma>(k, -0.693145751953125f, xc);
  r = madd<Fma>(k, -1.42860682030941723212e-6f, r);
  float p = horner<Fma>(kExp, r);
  // 2^k as two factors, so that k from -150 to 128 builds normal floats.
  int32_t ki = static_cast<int32_t>(k);
  int32_t k1 = ki >> 1;
  int32_t k2 = ki - k1;
  float s1 = std::bit_cast<float>(static_cast<uint32_t>(k1 + 127) << 23);
  float s2 = std::bit_cast<float>(static_cast<uint32_t>(k2 + 127) << 23);
  return select_nan(x, (p * s1) * s2);
}

template <bool Fma>
[[gnu::always_inline]] inline float fast_tanh(float x) {
  float t = std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0x7fffffffu);
  float s = t * t;
  float small = madd<Fma>(t * s, horner<Fma>(kTanhSmall, s), t);
  float e = fast_exp<Fma>(t + t);
  float large = 1.0f - 2.0f / (e + 1.0f);
  float y = t < 0.625f ? small : large;
  return select_nan(x, copy_sign(y, x));
}

template <bool Fma>
[[gnu::always_inline]] inline float fast_erf(float x) {
  float t = std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0x7fffffffu);
  float small = t * horner<Fma>(kErfSmall, t * t);
  float tc = t < 4.0f ? t : 4.0f;
  float large = 1.0f - fast_exp<Fma>(horner<Fma>(kErfLarge, tc));
  float y = t < 1.0f ? small : large;
  return select_nan(x, copy_sign(y, x));
}

template <bool Fma>
[[gnu::always_inline]] inline float fast_sigmoid(float x) {
  return 1.0f / (1.0f + fast_exp<Fma>(-x));
}

template <FastOp Op, bool Fma>
[[gnu::always_inline]] inline void apply(const float* in, float* out, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float x = in[i];
    float y;
    if constexpr (Op == FastOp::Exp) {
      y = fast_exp<Fma>(x);
    } else if constexpr (Op == FastOp::Tanh) {
      y = fast_tanh<Fma>(x);
    } else if constexpr (Op == FastOp::Erf) {
      y = fast_erf<Fma>(x);
    } else {
      y = fast_sigmoid<Fma>(x);
    }
    out[i] = y;
  }
}

template <bool Fma>
[[gnu::always_inline]] inline void run(FastOp op, const float* in, float* out, size_t n) {
  switch (op) {
    case FastOp::Exp:
      apply<FastOp::Exp, Fma>(in, out, n);
      break;
    case FastOp::Tanh:
      apply<FastOp::Tanh, Fma>(in, out, n);
      break;
    case FastOp::Erf:
      apply<FastOp::Erf, Fma>(in, out, n);
      break;
    case FastOp::Sigmoid:
      apply<FastOp::Sigmoid, Fma>(in, out, n);
      break;
  }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void run_avx2(
    FastOp op,
    const float* in,
    float* out,
    size_t n) {
  run<true>(op, in, out, n);
}

void run_baseline(FastOp op, const float* in, float* out, size_t n) {
  run<false>(op, in, out, n);
}

bool has_avx2_fma() {
  static const bool yes =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

void run_best(FastOp op, const float* in, float* out, size_t n) {
  if (has_avx2_fma()) {
    run_avx2(op, in, out, n);
  } else {
    run_baseline(op, in, out, n);
  }
}
#else
// ARM64 (and others): FMA is part of the base instruction set.
void run_best(FastOp op, const float* in, float* out, size_t n) {
  run<true>(op, in, out, n);
}
#endif

// Copies a strided float32 array into a row-contiguous buffer.
void gather_strided(const mx::array& a, float* out) {
  const float* src = a.data<float>();
  const auto& shape = a.shape();
  const auto& strides = a.strides();
  int nd = static_cast<int>(shape.size());
  std::vector<int64_t> index(nd, 0);
  size_t total = a.size();
  for (size_t i = 0; i < total; i++) {
    int64_t offset = 0;
    for (int d = 0; d < nd; d++) {
      offset += index[d] * strides[d];
    }
    out[i] = src[offset];
    for (int d = nd - 1; d >= 0; d--) {
      if (++index[d] < shape[d]) {
        break;
      }
      index[d] = 0;
    }
  }
}

class BurnMlxFastUnary : public mx::UnaryPrimitive {
 public:
  BurnMlxFastUnary(mx::Stream stream, FastOp op)
      : mx::UnaryPrimitive(stream), op_(op) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    const mx::array& a = inputs[0];
    if (a.dtype() != mx::float32) {
      throw std::invalid_argument(
          std::string("[") + name() + "] expects float32 input");
    }
    bool contiguous = a.flags().contiguous;
    if (contiguous) {
      mx::set_unary_output_data(a, out);
    } else {
      out.set_data(mx::allocator::malloc(out.nbytes()));
    }
    auto& encoder = mx::cpu::get_command_encoder(stream());
    encoder.set_input_array(a);
    encoder.set_output_array(out);
    encoder.dispatch([a = mx::array::unsafe_weak_copy(a),
                      out = mx::array::unsafe_weak_copy(out),
                      op = op_,
                      contiguous]() mutable {
      float* dst = out.data<float>();
      if (contiguous) {
        run_best(op, a.data<float>(), dst, a.data_size());
      } else {
        gather_strided(a, dst);
        run_best(op, dst, dst, out.size());
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, mx::array&) override {
    throw std::runtime_error(
        std::string("[") + name() +
        "] is a CPU kernel; burn-mlx uses MLX's own op on the GPU");
  }

  std::vector<mx::array> vjp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& cotangents,
      const std::vector<int>&,
      const std::vector<mx::array>& outputs) override {
    return {derivative_times(primals[0], outputs[0], cotangents[0])};
  }

  std::vector<mx::array> jvp(
      const std::vector<mx::array>& primals,
      const std::vector<mx::array>& tangents,
      const std::vector<int>&) override {
    mx::array out = of(primals[0], stream(), op_);
    return {derivative_times(primals[0], out, tangents[0])};
  }

  std::pair<std::vector<mx::array>, std::vector<int>> vmap(
      const std::vector<mx::array>& inputs,
      const std::vector<int>& axes) override {
    return {{of(inputs[0], stream(), op_)}, axes};
  }

  // `op` of `x` as a lazy array of this primitive.
  static mx::array of(const mx::array& x, mx::Stream stream, FastOp op) {
    return mx::array(
        x.shape(),
        x.dtype(),
        std::make_shared<BurnMlxFastUnary>(stream, op),
        {x});
  }

  const char* name() const override {
    switch (op_) {
      case FastOp::Exp:
        return "BurnMlxFastExp";
      case FastOp::Tanh:
        return "BurnMlxFastTanh";
      case FastOp::Erf:
        return "BurnMlxFastErf";
      case FastOp::Sigmoid:
        return "BurnMlxFastSigmoid";
    }
    return "BurnMlxFastUnary";
  }

  bool is_equivalent(const mx::Primitive& other) const override {
    auto* o = dynamic_cast<const BurnMlxFastUnary*>(&other);
    return o != nullptr && o->op_ == op_;
  }

  std::vector<mx::Shape> output_shapes(
      const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  // The derivative at x (with y = f(x) already computed) times `v`, as MLX ops.
  mx::array derivative_times(
      const mx::array& x,
      const mx::array& y,
      const mx::array& v) {
    auto s = stream();
    switch (op_) {
      case FastOp::Exp:
        return mx::multiply(v, y, s);
      case FastOp::Tanh:
        return mx::multiply(
            v, mx::subtract(mx::array(1.0f), mx::square(y, s), s), s);
      case FastOp::Erf: {
        // d/dx erf(x) = 2 / sqrt(pi) * exp(-x^2)
        auto e = mx::exp(mx::negative(mx::square(x, s), s), s);
        return mx::multiply(
            v, mx::multiply(mx::array(1.1283791670955126f), e, s), s);
      }
      case FastOp::Sigmoid:
        return mx::multiply(
            v, mx::multiply(y, mx::subtract(mx::array(1.0f), y, s), s), s);
    }
    throw std::logic_error("BurnMlxFastUnary: unknown op");
  }

  FastOp op_;
};

// BURN_MLX_FAST_UNARY=0 turns the kernels off (MLX's own ops everywhere), for comparisons.
bool fast_unary_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("BURN_MLX_FAST_UNARY");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

// Whether `x` on `stream` takes the fast kernels: float32 on a CPU stream, unless turned off.
bool takes_fast_path(const mx::array& x, const mx::Stream& stream) {
  // A graph traced for export must hold only MLX's own primitives: the file is run by MLX
  // builds that do not have this one.
  return stream.device == mx::Device::cpu && x.dtype() == mx::float32 &&
      fast_unary_enabled() && !burn_mlx_in_export();
}

// The message of the last exception caught by the C entries below, on this thread.
thread_local std::string last_error;

// Records `what` for `burn_mlx_fast_last_error` and returns the entries' failure code.
int fail(const char* what) {
  last_error = what;
  return 1;
}

} // namespace

// Keeps `what` as the calling thread's last failure and returns 1: for the entries of
// `cpu_layers.cpp`, which report through `burn_mlx_fast_last_error` too.
int burn_mlx_fast_fail(const char* what) {
  return fail(what);
}

// The message of the last failure of `burn_mlx_fast_unary`, `burn_mlx_softmax` or
// `burn_mlx_logsumexp` on the calling thread (MLX's exception text), or "" if none; valid until the thread's next failing call.
extern "C" const char* burn_mlx_fast_last_error() {
  return last_error.c_str();
}

namespace {

// The frame of the C entries below: `fast(x, stream)` when `a` takes the fast kernels, `mlx(x,
// stream)` (MLX's own op) otherwise, written to `res`. Returns 0, or 1 with MLX's message kept
// for `burn_mlx_fast_last_error` if MLX rejected the input.
template <class Fast, class Mlx>
int run_entry(
    mlx_array* res,
    const mlx_array a,
    const mlx_stream s,
    Fast fast,
    Mlx mlx) {
  try {
    const mx::array& x = mlx_array_get_(a);
    const mx::Stream& stream = mlx_stream_get_(s);
    mlx_array_set_(
        *res, takes_fast_path(x, stream) ? fast(x, stream) : mlx(x, stream));
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}

// MLX's own op for `op`.
mx::array mlx_unary(FastOp op, const mx::array& x, const mx::Stream& stream) {
  switch (op) {
    case FastOp::Exp:
      return mx::exp(x, stream);
    case FastOp::Tanh:
      return mx::tanh(x, stream);
    case FastOp::Erf:
      return mx::erf(x, stream);
    case FastOp::Sigmoid:
      break;
  }
  return mx::sigmoid(x, stream);
}

} // namespace

// Applies `exp` (op 0), `tanh` (1), `erf` (2) or `sigmoid` (3) to `a` on stream `s`: through
// BurnMlxFastUnary for float32 on a CPU stream, through MLX's own op otherwise. Returns 0, or 1
// if MLX rejected the input (the message: `burn_mlx_fast_last_error`).
extern "C" int burn_mlx_fast_unary(
    mlx_array* res,
    const mlx_array a,
    int op,
    const mlx_stream s) {
  if (op < 0 || op > 3) {
    return fail(
        ("burn_mlx_fast_unary: unknown op code " + std::to_string(op) +
         " (0 exp, 1 tanh, 2 erf, 3 sigmoid)")
            .c_str());
  }
  auto fop = static_cast<FastOp>(op);
  return run_entry(
      res,
      a,
      s,
      [fop](const mx::array& x, const mx::Stream& stream) {
        return BurnMlxFastUnary::of(x, stream, fop);
      },
      [fop](const mx::array& x, const mx::Stream& stream) {
        return mlx_unary(fop, x, stream);
      });
}

namespace {

// exp(x - max) with the vectorized `exp`, the max over `axis` kept as size 1 and held constant
// for autodiff (the shift changes neither softmax nor logsumexp); returns {max, exp}.
std::pair<mx::array, mx::array>
shifted_exp(const mx::array& x, int axis, const mx::Stream& stream) {
  auto max = mx::stop_gradient(mx::max(x, axis, true, stream), stream);
  mx::array e =
      BurnMlxFastUnary::of(mx::subtract(x, max, stream), stream, FastOp::Exp);
  return {max, e};
}

} // namespace

// Softmax of `a` over `axis` on stream `s`: for float32 on a CPU stream, composed as
// exp(x - max) / sum with the vectorized `exp` above (MLX's own CPU `Softmax` kernel calls its
// scalar `exp`); MLX's `softmax` (precise) otherwise. Returns 0, or 1 if MLX rejected the input.
extern "C" int burn_mlx_softmax(
    mlx_array* res,
    const mlx_array a,
    int axis,
    const mlx_stream s) {
  return run_entry(
      res,
      a,
      s,
      [axis](const mx::array& x, const mx::Stream& stream) {
        auto [max, e] = shifted_exp(x, axis, stream);
        return mx::divide(e, mx::sum(e, axis, true, stream), stream);
      },
      [axis](const mx::array& x, const mx::Stream& stream) {
        return mx::softmax(x, std::vector<int>{axis}, true, stream);
      });
}

// log(sum(exp(a))) over `axis` on stream `s`, the axis kept as size 1 when `keepdims`: for
// float32 on a CPU stream composed as max + log(sum(exp(x - max))) with the vectorized `exp`
// (MLX's CPU `LogSumExp` kernel calls its scalar `exp`), and where the max is infinite, the max
// itself (a row of -inf gives -inf, a row with +inf gives +inf), as MLX's `logsumexp` does;
// MLX's `logsumexp` otherwise. Returns 0, or 1 if MLX rejected the input.
extern "C" int burn_mlx_logsumexp(
    mlx_array* res,
    const mlx_array a,
    int axis,
    bool keepdims,
    const mlx_stream s) {
  return run_entry(
      res,
      a,
      s,
      [axis, keepdims](const mx::array& x, const mx::Stream& stream) {
        auto [max, e] = shifted_exp(x, axis, stream);
        auto out = mx::add(
            mx::log(mx::sum(e, axis, true, stream), stream), max, stream);
        out = mx::where(mx::isinf(max, stream), max, out, stream);
        return keepdims ? out : mx::squeeze(out, axis, stream);
      },
      [axis, keepdims](const mx::array& x, const mx::Stream& stream) {
        return mx::logsumexp(x, axis, keepdims, stream);
      });
}
