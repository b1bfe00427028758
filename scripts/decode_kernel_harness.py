#!/usr/bin/env python3
"""A standalone CUDA program that times `attention_mlp_qkv` (src/decode/tail.rs) outside MLX.

It assembles the kernel's source the way MLX's `cuda_kernel` does (the headers, then a
`__global__` function whose template arguments are `constexpr` values and whose input shapes
and strides are `__grid_constant__` arrays of 10) for the `qwen3-0.6b` preset in bf16 with
dense weights, and adds a host program that launches it 28 times a token on 28 layers' own
weights (so nothing stays in L2 from one layer to the next), back to back, and prints the time a
launch takes. Each launch writes the next layer's new keys and values into that layer's cache, as
the decode step does. Compiled with `-DPROBES`, each block also records the global timer at the kernel's
start, on each side of every grid barrier and at its end, and the program prints when the first
and the last block passed each point (median over the layers of one token).

    python3 scripts/decode_kernel_harness.py --out am.cu
    nvcc -O3 -arch=sm_90 -std=c++17 -w am.cu -o am          # add -DPROBES for the phase table
    ./am [LENGTH=640] [TOKENS=20]
    python3 scripts/decode_kernel_harness.py --stack --bits 4 --out st.cu   # the stack, 4-bit

The programs need no GPU to build: the `nvidia-cuda-nvcc`, `nvidia-cuda-crt`, `nvidia-cuda-cccl`,
`nvidia-cuda-runtime` and `nvidia-nvvm` 13.0 wheels unpacked into one folder give an nvcc that
builds each in seconds
(`PATH=DIR/nvidia/cu13/bin:$PATH nvcc ... -L DIR/nvidia/cu13/lib`, linking CUDA's static
runtime), so only the timing needs the GPU machine.

With `--stack`, the program times `decoder_stack`'s kernel (src/decode/stack.rs) instead: the
whole stack of 28 blocks in one launch a token, on the same weights, assembled from the same
sources (blocks of 8 warps). With `--bits 4` or `--bits 8` its weights are MLX's affine-quantized
form (packed words of random bits, scales and biases in groups of 64), as `--quantize q4`/`q8`
gives the model. With `-DPROBES` each block records the same points as above in every block of the
stack (the table shows the median over the stack's blocks).

The program's environment chooses where its inputs live, to compare with what MLX gives the
kernel:

- `POOL=1`: the position, the length and both RMS-norm weights (broadcast, stride 0) in one page
  of managed memory advised read-mostly, the way MLX's CUDA allocator keeps arrays of 8 bytes or
  less; the host writes another word of that page once a token. `POOL=2`: also before every
  launch, as a host that builds the next decode step while the kernels run does.
- `HOST_US=N`: the host spends N microseconds after each launch (so its writes fall while
  earlier launches run).
- `WEIGHTS=managed`: the weights in managed memory (filled by the GPU); `WEIGHTS=row`: the
  weights in `[in, out]` row-major order, which the kernel reads value by value.
"""
import argparse
import re
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PRELUDE = r"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
struct Shape { int32_t v[10]; __host__ __device__ int32_t operator[](int i) const { return v[i]; } };
struct Strides { int64_t v[10]; __host__ __device__ int64_t operator[](int i) const { return v[i]; } };
__device__ unsigned long long* g_probe;
// The stack's blocks index their probes by the block of the stack each grid block is in.
__device__ int g_probe_layer[1024];
#ifdef PROBES
#ifdef STACK_MODE
#define BM_PROBE_AT(i) ((size_t)(g_probe_layer[blockIdx.x] * gridDim.x + blockIdx.x) * NPROBE + (i))
#else
#define BM_PROBE_AT(i) ((size_t)blockIdx.x * NPROBE + (i))
#endif
#define BM_PROBE(i) do { __syncthreads(); if (threadIdx.x == 0 && g_probe) { \
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); \
  g_probe[BM_PROBE_AT(i)] = t; } } while (0)
#else
#define BM_PROBE(i) do {} while (0)
#endif
"""

HOST = r"""
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  printf("CUDA error %s at line %d: %s\n", #x, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)
typedef __nv_bfloat16 bf16;
__global__ void fill(bf16* p, size_t n, unsigned seed, float a) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed * 2246822519u;
    h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    p[i] = __float2bfloat16(a * ((h & 0xffffff) / 8388608.f - 1.f));
  }
}
static bool g_managed_weights = false;
// n random values in (-a, a): device memory, or managed memory for weights with WEIGHTS=managed.
static bf16* random_values(size_t n, unsigned seed, float a, bool weight = false) {
  bf16* p;
  if (weight && g_managed_weights) CK(cudaMallocManaged(&p, n * 2)); else CK(cudaMalloc(&p, n * 2));
  fill<<<256, 256>>>(p, n, seed, a);
  return p;
}
static Shape shape(std::vector<int> v) { Shape s{}; for (size_t i = 0; i < v.size(); ++i) s.v[i] = v[i]; return s; }
static Strides strides(std::vector<long long> v) { Strides s{}; for (size_t i = 0; i < v.size(); ++i) s.v[i] = v[i]; return s; }
static double env_f(const char* k) { const char* v = getenv(k); return v ? atof(v) : 0.0; }

int main(int argc, char** argv) {
  const int K = @K@, HQ = @HQ@, HKV = @HKV@, D = @D@, I = @I@, SMS = @SMS@, NP = @NP@;
  const int LAYERS = 28, CAP = 2048, NQKV = (HQ + 2 * HKV) * D;
  const int L = argc > 1 ? atoi(argv[1]) : 640;
  const int TOKENS = argc > 2 ? atoi(argv[2]) : 20;
  const int pool = (int)env_f("POOL");
  const double host_us = env_f("HOST_US");
  const char* weights = getenv("WEIGHTS");
  g_managed_weights = weights && !strcmp(weights, "managed");
  const bool row_major = weights && !strcmp(weights, "row");
  int sms = 0; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (sms != SMS) printf("note: the device has %d multiprocessors, the kernel was made for %d\n", sms, SMS);
  printf("length %d, POOL=%d, HOST_US=%g, WEIGHTS=%s\n", L, pool, host_us, weights ? weights : "device");

  // With BITS (4 or 8) the weights are MLX's packed words ([out, in·BITS/32] u32, held here as
  // bf16 pairs of random bits) with scales and biases ([out, in/64]).
  const int BITS = @BITS@;
  struct Layer {
    bf16 *kv, *wo, *g, *wgu, *wd, *wqkv, *qw, *kw;
    bf16 *wo_s, *wo_b, *wgu_s, *wgu_b, *wd_s, *wd_b, *wqkv_s, *wqkv_b;  // quantized only
  };
  auto weight = [&](size_t in, size_t out, unsigned& seed, bf16*& s, bf16*& b) {
    if (BITS == 0) { s = b = nullptr; return random_values(in * out, seed++, 0.02f, true); }
    s = random_values(out * in / 64, seed++, 0.002f, true);
    b = random_values(out * in / 64, seed++, 0.01f, true);
    return random_values(out * in * BITS / 16, seed++, 1.f, true);
  };
  std::vector<Layer> layers(LAYERS);
  unsigned seed = 1;
  for (auto& l : layers) {
    l.kv = random_values((size_t)2 * HKV * CAP * D, seed++, 1.f, true);
    l.wo = weight((size_t)HQ * D, K, seed, l.wo_s, l.wo_b);
    l.g = random_values(K, seed++, 1.f);
    l.wgu = weight(K, (size_t)2 * I, seed, l.wgu_s, l.wgu_b);
    l.wd = weight(I, K, seed, l.wd_s, l.wd_b);
    l.wqkv = weight(K, NQKV, seed, l.wqkv_s, l.wqkv_b);
    l.qw = random_values(D, seed++, 1.f);
    l.kw = random_values(D, seed++, 1.f);
  }
  bf16* xs[2] = {random_values(K, 99, 1.f), random_values(K, 98, 1.f)};
  bf16* qs[2] = {random_values(HQ * D, 97, 1.f), random_values(HQ * D, 96, 1.f)};
  bf16* kv2_p = random_values(2 * HKV * D, 95, 1.f);
  bf16* bias2_p = random_values(NQKV, 94, 0.f);
  float* freqs_p; CK(cudaMalloc(&freqs_p, D / 2 * 4));
  {
    std::vector<float> f(D / 2);
    for (int i = 0; i < D / 2; ++i) f[i] = powf(1e6f, -2.f * i / D);
    CK(cudaMemcpy(freqs_p, f.data(), D / 2 * 4, cudaMemcpyHostToDevice));
  }
  int32_t *len_p, *pos_p;
  volatile int32_t* page = nullptr;
  bf16* pool_norm = nullptr;
  if (pool) {
    char* p; CK(cudaMallocManaged(&p, 1 << 16));
    cudaMemLocation loc{}; loc.type = cudaMemLocationTypeDevice; loc.id = 0;
    CK(cudaMemAdvise(p, 1 << 16, cudaMemAdviseSetReadMostly, loc));
    len_p = (int32_t*)p; pos_p = (int32_t*)(p + 8); pool_norm = (bf16*)(p + 16);
    *len_p = L; *pos_p = L - 1; *pool_norm = __float2bfloat16(1.f);
    page = (volatile int32_t*)(p + 64);
  } else {
    CK(cudaMalloc(&len_p, 4)); CK(cudaMalloc(&pos_p, 4));
    int32_t lv = L, pv = L - 1;
    CK(cudaMemcpy(len_p, &lv, 4, cudaMemcpyHostToDevice)); CK(cudaMemcpy(pos_p, &pv, 4, cudaMemcpyHostToDevice));
  }
  uint64_t* sync_p; CK(cudaMalloc(&sync_p, 1024 * 8)); CK(cudaMemset(sync_p, 0, 1024 * 8));
  float* work_p; CK(cudaMalloc(&work_p, (size_t)@WORK@ * 4));
  unsigned long long* probes; CK(cudaMalloc(&probes, (size_t)LAYERS * SMS * NP * 8));
  CK(cudaDeviceSynchronize());

  // Shapes and strides as MLX passes them: weights are Burn's [in, out] views of the stored
  // [out, in] matrices (or, with WEIGHTS=row, row-major [in, out] arrays).
  Shape q_shape = shape({1, HQ, 1, D}); Strides q_strides = strides({HQ * D, D, D, 1});
  Shape kv_shape = shape({1, 2 * HKV, CAP, D});
  Strides kv_strides = strides({(long long)2 * HKV * CAP * D, (long long)CAP * D, D, 1});
  Shape x_shape = shape({1, K}); Strides x_strides = strides({K, 1});
  Shape wo_shape = shape({HQ * D, K}); Strides wo_strides = row_major ? strides({K, 1}) : strides({1, HQ * D});
  Shape g_shape = shape({K}); Strides g_strides = strides({pool ? 0 : 1});
  Shape wgu_shape = shape({K, 2 * I}); Strides wgu_strides = row_major ? strides({2 * I, 1}) : strides({1, K});
  Shape wd_shape = shape({I, K}); Strides wd_strides = row_major ? strides({K, 1}) : strides({1, I});
  Shape g2_shape = g_shape; Strides g2_strides = g_strides;
  Shape wqkv_shape = shape({K, NQKV}); Strides wqkv_strides = row_major ? strides({NQKV, 1}) : strides({1, K});
  Shape bias2_shape = shape({NQKV}); Strides bias2_strides = strides({1});
  Shape kvc_shape = kv_shape; Strides kvc_strides = kv_strides;
  if (BITS != 0) {
    // MLX's packed words, [out, in·BITS/32], row-contiguous.
    wo_shape = shape({K, HQ * D * BITS / 32}); wo_strides = strides({HQ * D * BITS / 32, 1});
    wgu_shape = shape({2 * I, K * BITS / 32}); wgu_strides = strides({K * BITS / 32, 1});
    wd_shape = shape({K, I * BITS / 32}); wd_strides = strides({I * BITS / 32, 1});
    wqkv_shape = shape({NQKV, K * BITS / 32}); wqkv_strides = strides({K * BITS / 32, 1});
  }
  @UNUSED@
  auto token = [&](bool probe) {
    if (page) page[0] = L;
#ifdef STACK_MODE
    {
      unsigned long long* pp = probe ? probes : nullptr;
      CK(cudaMemcpyToSymbolAsync(g_probe, &pp, sizeof(pp)));
    }
    @STACK_LAUNCH@
    return;
#endif
    for (int li = 0; li < LAYERS; ++li) {
      const Layer& l = layers[li];
      const Layer& next = layers[(li + 1) % LAYERS];
      if (pool >= 2) page[1 + (li & 7)] = li;
      const bf16 *q = qs[li & 1], *kv = l.kv, *x = xs[li & 1];
      const bf16 *wo = l.wo, *wo_scales = l.wo, *wo_biases = l.wo, *g = pool ? pool_norm : l.g;
      const bf16 *wgu = l.wgu, *wgu_scales = l.wgu, *wgu_biases = l.wgu;
      const bf16 *wd = l.wd, *wd_scales = l.wd, *wd_biases = l.wd;
      const bf16 *g2 = pool ? pool_norm : next.g, *wqkv = next.wqkv, *wqkv_scales = next.wqkv;
      const bf16 *wqkv_biases = next.wqkv, *bias2 = bias2_p, *qw = next.qw, *kw = next.kw;
      const bf16* kvc = next.kv;  // the next block's keys and values land in its cache
      const float* freqs = freqs_p;
      const int32_t *len = len_p, *pos = pos_p;
      const uint64_t* sync = sync_p;
      bf16 *y = xs[(li + 1) & 1], *q2 = qs[(li + 1) & 1], *kv2 = kv2_p;
      float* work = work_p;
      unsigned long long* pp = probe ? probes + (size_t)li * SMS * NP : nullptr;
      CK(cudaMemcpyToSymbolAsync(g_probe, &pp, sizeof(pp)));
      attention_mlp_qkv<<<SMS, 512>>>(@ARGS@);
      CK(cudaGetLastError());
      if (host_us > 0) {
        const auto t0 = std::chrono::steady_clock::now();
        while (std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() < host_us) {}
      }
    }
  };
  for (int i = 0; i < 3; ++i) token(false);
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  for (int round = 0; round < 3; ++round) {
    CK(cudaEventRecord(e0));
    for (int t = 0; t < TOKENS; ++t) token(false);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
    printf("%.2f us a layer (with the gap to the next launch), %.3f ms a token of %d layers\n",
           ms * 1000 / (TOKENS * LAYERS), ms / TOKENS, LAYERS);
  }
#ifdef PROBES
  token(true);
  CK(cudaDeviceSynchronize());
  std::vector<unsigned long long> h((size_t)LAYERS * SMS * NP);
  CK(cudaMemcpy(h.data(), probes, h.size() * 8, cudaMemcpyDeviceToHost));
  std::vector<std::vector<double>> first(NP), last(NP);
  for (int li = 2; li < LAYERS; ++li) {
    const unsigned long long* p = h.data() + (size_t)li * SMS * NP;
    unsigned long long t0 = ~0ull;
    for (int b = 0; b < SMS; ++b) t0 = std::min(t0, p[b * NP]);
    for (int i = 0; i < NP; ++i) {
      unsigned long long a = ~0ull, z = 0;
      for (int b = 0; b < SMS; ++b) { a = std::min(a, p[b * NP + i]); z = std::max(z, p[b * NP + i]); }
      first[i].push_back((a - t0) / 1000.0); last[i].push_back((z - t0) / 1000.0);
    }
  }
  auto median = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  printf("point: first block, last block (us after the first block's start; median over layers)\n");
  for (int i = 0; i < NP; ++i) printf("  %-22s %8.2f %8.2f\n", POINTS[i], median(first[i]), median(last[i]));
#endif
  return 0;
}
"""


# The shapes and strides the host program declares for every input of the per-layer kernel.
HOST_SHAPES = [f"{n}_{p}" for n in ("q", "kv", "x", "wo", "g", "wgu", "wd", "g2", "wqkv", "bias2", "kvc")
               for p in ("shape", "strides")]


def raw_strings(path: Path) -> dict:
    """The `const NAME: &str = r#"..."#;` constants of a Rust file."""
    return dict(re.findall(r'const (\w+): &str = r#"(.*?)"#;', path.read_text(), re.S))


def float_bits(f: float) -> int:
    return struct.unpack("<i", struct.pack("<f", f))[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="attention_mlp_qkv.cu", help="the CUDA file to write")
    ap.add_argument("--sms", type=int, default=132, help="multiprocessors (blocks), 132 on an H100/H200")
    ap.add_argument("--stack", action="store_true", help="time decoder_stack's kernel (one launch a token)")
    ap.add_argument("--bits", type=int, choices=(0, 4, 8), default=0,
                    help="with --stack: quantized weights of this many bits (0: dense bf16)")
    args = ap.parse_args()
    if args.bits and not args.stack:
        ap.error("--bits is for --stack (the per-layer program has dense weights)")

    src = ROOT / "src" / "decode"
    cuda, gemv, tail, stack = (raw_strings(src / f) for f in ("cuda.rs", "gemv.rs", "tail.rs", "stack.rs"))
    header = cuda["HEADER"] + gemv["GEMV_HEADER"] + tail["TAIL_HEADER"]
    if args.stack:
        write_stack(args, header, tail, stack)
        return
    body = tail["ATTENTION_MLP_PRELUDE"] + tail["ATTENTION_MLP"] + tail["NEXT_QKV"]
    body, points = with_probes(body)
    body = "BM_PROBE(0);\n" + body + f"\nBM_PROBE({len(points) - 1});\n"

    k, hq, hkv, d, i = 1024, 16, 8, 128, 3072
    splits = max(1, args.sms // hq)
    inputs = [("q", "T"), ("kv", "T"), ("len", "int32_t"), ("x", "T"), ("wo", "T"), ("wo_scales", "T"),
              ("wo_biases", "T"), ("g", "T"), ("wgu", "T"), ("wgu_scales", "T"), ("wgu_biases", "T"),
              ("wd", "T"), ("wd_scales", "T"), ("wd_biases", "T"), ("sync", "uint64_t"), ("g2", "T"),
              ("wqkv", "T"), ("wqkv_scales", "T"), ("wqkv_biases", "T"), ("bias2", "T"), ("qw", "T"),
              ("kw", "T"), ("freqs", "float"), ("pos", "int32_t"), ("kvc", "T")]
    outputs = [("y", "T"), ("q2", "T"), ("kv2", "T"), ("work", "float")]
    ctype = lambda t: "__nv_bfloat16" if t == "T" else t
    params, call, declared = [], [], []
    for name, t in inputs:
        params.append(f"const {ctype(t)}* {name}")
        call.append(name)
        # MLX passes an input's shape and strides when the kernel's source names them.
        for part, ty in (("shape", "Shape"), ("strides", "Strides")):
            if f"{name}_{part}" in body:
                params.append(f"const __grid_constant__ {ty} {name}_{part}")
                call.append(f"{name}_{part}")
                declared.append(f"{name}_{part}")
    for name, t in outputs:
        params.append(f"{ctype(t)}* {name}")
        call.append(name)
    consts = [("Q", 0), ("GS", 64), ("K", k), ("HQ", hq), ("HKV", hkv), ("D", d), ("I", i), ("S", splits),
              ("SCALE", float_bits(d ** -0.5)), ("EPS", float_bits(1e-6)), ("GELU", 0), ("WARPS", 16),
              ("EPS2", float_bits(1e-6)), ("QK_EPS", float_bits(1e-6)), ("NORM", 1), ("BIAS", 0),
              ("HEAD_COUNTS", 512), ("CACHE", 1)]
    kernel = "__global__ void attention_mlp_qkv(\n    " + ",\n    ".join(params) + ") {\n"
    kernel += "  using T = __nv_bfloat16;\n" + "".join(f"  constexpr int {n} = {v};\n" for n, v in consts)
    kernel += body + "\n}\n"
    work = (hq * splits * (d + 2) + 3) // 4 * 4 + (k * 2 + 15) // 16 * 4 + (i * 2 + 15) // 16 * 4 + (hq + 2 * hkv) * d
    # Shapes and strides the kernel does not name are declared for every input; mark the rest used.
    unused = " ".join(f"(void){n};" for n in HOST_SHAPES if n not in declared)
    host = HOST
    for key, val in {"K": k, "HQ": hq, "HKV": hkv, "D": d, "I": i, "SMS": args.sms, "NP": len(points),
                     "WORK": work, "ARGS": ", ".join(call), "UNUSED": unused, "STACK_LAUNCH": "",
                     "BITS": 0}.items():
        host = host.replace(f"@{key}@", str(val))
    names = "static const char* POINTS[] = {" + ", ".join(f'"{p}"' for p in points) + "};\n"
    Path(args.out).write_text(PRELUDE + f"#define NPROBE {len(points)}\n" + names + header + kernel + host)
    print(f"wrote {args.out}: {len(points)} probe points, {splits} splits of each head's positions")


def with_probes(code: str):
    """`code` with a probe on each side of every grid barrier, and the probe points' names (the
    first is the start, and the caller adds the end)."""
    points = ["start"]

    def probe(_m):
        n = (len(points) + 1) // 2
        points.extend([f"barrier {n}, arrive", f"barrier {n}, leave"])
        return f"BM_PROBE({len(points) - 2}); bm_grid_sync(bar); BM_PROBE({len(points) - 1});"

    code = re.sub(r"bm_grid_sync\(bar\);", probe, code)
    points.append("end")
    return code, points


WEIGHTS = ("wqkv", "wo", "wgu", "wd")
# The host array the program passes for each entry of a block's row of the table; the program's
# blocks have query/key norms and no QKV bias.
HOSTS = {"gi": "g", "qn": "qw", "kn": "kw", "kvc": "kv", "gp": "g", **{w: w for w in WEIGHTS},
         **{f"{w}_{p}": f"{w}_{p[0]}" for w in WEIGHTS for p in ("scales", "biases")}}


def stack_entries(stack_rs: str, quantized: bool) -> list:
    """A block's entries in decoder_stack's table, in the order of `table_entries` in stack.rs, each
    with the host array the program passes for it, or `=ENTRY`: the entry that stands in for it
    (stack.rs's `stand_in`: a dense weight for its own scales and biases, and for the missing QKV
    bias its weight, or its scales when quantized)."""
    body = re.search(r"fn table_entries\(.*?\n\}", stack_rs, re.S).group(0)
    names = re.findall(r'\("(\w+)", ', body)
    out = []
    for name in names:
        if name == "bqkv":
            out.append((name, "=wqkv_scales" if quantized else "=wqkv"))
        elif name.endswith(("_scales", "_biases")) and not quantized:
            out.append((name, "=" + name.split("_")[0]))
        else:
            out.append((name, HOSTS[name]))
    return out


def input_name(entry: str, block: int) -> str:
    """The kernel input of `entry` of `block`, as stack.rs names it: `wo_3`, `wo_3_scales`."""
    weight, _, part = entry.partition("_")
    return f"{weight}_{block}_{part}" if part in ("scales", "biases") else f"{entry}_{block}"


def write_stack(args, header: str, tail: dict, stack: dict) -> None:
    """The program for `--stack`: decoder_stack's kernel as MLX assembles it, launched once a token."""
    layers, k, hq, hkv, d, i, warps = 28, 1024, 16, 8, 128, 3072, 8
    splits = max(1, args.sms // hq)
    entries = stack_entries((ROOT / "src" / "decode" / "stack.rs").read_text(), args.bits != 0)
    block, points = with_probes(stack["STACK_BLOCK_QKV"] + tail["NEXT_QKV"] + stack["STACK_BLOCK_MLP"]
                                + tail["ATTENTION_MLP"])
    header += (stack["STACK_BLOCK_HEAD"] + tail["ATTENTION_MLP_PRELUDE"] + "  BM_PROBE(0);\n" + block
               + f"  }}\n  BM_PROBE({len(points) - 1});\n}}\n")
    body = f"  __shared__ const void* bm_tab[L][{len(entries)}];\n  if (threadIdx.x == 0) {{\n"
    for b in range(layers):
        for slot, (entry, host) in enumerate(entries):
            body += f"    bm_tab[{b}][{slot}] = {input_name(host[1:] if host.startswith('=') else entry, b)};\n"
    loop = stack["STACK_LOOP"]
    assert loop.count("bm_stack_block<") == 1
    loop = loop.replace("bm_stack_block<", "if (threadIdx.x == 0) g_probe_layer[blockIdx.x] = layer;\n"
                        "    bm_stack_block<")
    body += "  }\n  __syncthreads();\n" + loop
    # Inputs as MLX orders them, with the shapes and strides the body names; host expressions.
    inputs = [("hidden", "bf16", "xs[0]"), ("len", "int32_t", "len_p"), ("pos", "int32_t", "pos_p"),
              ("freqs", "float", "freqs_p"), ("sync", "uint64_t", "sync_p")]
    for b in range(layers):
        for entry, host in entries:
            if not host.startswith("="):
                t = "uint32_t" if args.bits and entry in WEIGHTS else "bf16"
                inputs.append((input_name(entry, b), t, f"layers[{b}].{host}"))
    host_of = {"kvc_0": "kvc", "wqkv_0": "wqkv", "wo_0": "wo", "wgu_0": "wgu", "wd_0": "wd"}
    params, call = [], []
    for n, t, h in inputs:
        params.append(f"const {'__nv_bfloat16' if t == 'bf16' else t}* {n}")
        call.append(f"(const {t}*){h}")
        for part, ty in (("shape", "Shape"), ("strides", "Strides")):
            if f"{n}_{part}" in body:
                params.append(f"const __grid_constant__ {ty} {n}_{part}")
                call.append(f"{host_of[n]}_{part}")
    params += ["__nv_bfloat16* out", "float* work"]
    call += ["xs[1]", "work_p"]
    consts = [("Q", args.bits), ("GS", 64), ("L", layers), ("K", k), ("HQ", hq), ("HKV", hkv), ("D", d), ("I", i),
              ("S", splits), ("SCALE", float_bits(d ** -0.5)), ("EPS", float_bits(1e-6)), ("GELU", 0),
              ("WARPS", warps), ("EPS2", float_bits(1e-6)), ("QK_EPS", float_bits(1e-6)), ("NORM", 1),
              ("BIAS", 0), ("HEAD_COUNTS", 512), ("CACHE", 1)]
    kernel = "__global__ void decoder_stack(\n    " + ",\n    ".join(params) + ") {\n"
    kernel += "  using T = __nv_bfloat16;\n" + "".join(f"  constexpr int {n} = {v};\n" for n, v in consts)
    kernel += body + "}\n"
    t4 = lambda n: (n * 2 + 15) // 16 * 4
    work = ((hq * splits * (d + 2) + 3) // 4 * 4 + t4(k) + t4(i) + (hq + 2 * hkv) * d + t4(hq * d)
            + t4(2 * hkv * d) + t4(k))
    launch = (f"decoder_stack<<<SMS, {warps * 32}>>>({', '.join(call)});\n    CK(cudaGetLastError());")
    host = HOST
    for key, val in {"K": k, "HQ": hq, "HKV": hkv, "D": d, "I": i, "SMS": args.sms, "NP": len(points),
                     "WORK": work, "ARGS": "", "UNUSED": " ".join(f"(void){n};" for n in HOST_SHAPES),
                     "STACK_LAUNCH": launch, "BITS": args.bits}.items():
        host = host.replace(f"@{key}@", str(val))
    # The per-layer launch is compiled but never reached; it names a kernel of that mode only.
    host = host.replace("attention_mlp_qkv<<<SMS, 512>>>();", "")
    names = "static const char* POINTS[] = {" + ", ".join(f'"{p}"' for p in points) + "};\n"
    Path(args.out).write_text(PRELUDE.replace("#ifdef PROBES", "#define STACK_MODE\n#ifdef PROBES", 1)
                              + f"#define NPROBE {len(points)}\n" + names + header + kernel + host)
    print(f"wrote {args.out}: the stack of {layers} blocks ({args.bits or 16}-bit weights), {len(points)} "
          f"probe points, {splits} splits of each head's positions")


if __name__ == "__main__":
    main()
