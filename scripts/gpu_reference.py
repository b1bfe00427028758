#!/usr/bin/env python3
"""Reference timings for `examples/gpu_bench.rs`, on the same GPU and in the same way.

- Matmuls (f32 and bf16, square, the sizes gpu_bench used) through MLX's own Python API: the
  lower bound for Burn + Mlx, since both end in the same MLX kernels.
- The MLP, CNN and Transformer training steps (forward, backward, Adam, loss read back) in
  PyTorch eager mode, with the same layer shapes as the Burn models.

Usage (needs `mlx` with `mlx-cuda-13` 0.32.2, and torch with CUDA, in the same Python):

    cargo run --release --features cuda --example gpu_bench -- --json burn.json
    python3 scripts/gpu_reference.py burn.json > table.md

It prints a Markdown table that compares each workload with the reference.

    python3 scripts/gpu_reference.py --profile

With `--full-f32` (before the file name), PyTorch's f32 matmuls and convolutions run in full f32
(`torch.backends.cuda.matmul.allow_tf32` and `torch.backends.cudnn.allow_tf32` off): the peer of
Burn + Mlx run with `MLX_ENABLE_TF32=0`. Without it PyTorch keeps its defaults (full-f32
matmuls, TF32 convolutions).

profiles one PyTorch step of each model instead (after a warm-up step) with `torch.profiler`:
the CUDA kernels it launches and their GPU time, grouped by kind (GEMM, elementwise, reduction
and normalization, optimizer, copy), the counterpart of `gpu_bench --count-primitives`.
"""

import json
import statistics
import sys
import time


def median_secs(fn, budget=2.0):
    """Median seconds per call after two warm-up calls (at least 5, at most 50 calls)."""
    fn()
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < 5 or (time.perf_counter() - start < budget and len(times) < 50):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def mlx_matmul(n, dtype_name):
    import mlx.core as mx

    dtype = {"f32": mx.float32, "bf16": mx.bfloat16}[dtype_name]
    a = mx.random.uniform(shape=(n, n)).astype(dtype)
    b = mx.random.uniform(shape=(n, n)).astype(dtype)
    mx.eval(a, b)
    return median_secs(lambda: mx.eval(a @ b))


def torch_models():
    """The three PyTorch workloads: name -> (model, input, loss function)."""
    import torch
    from torch import nn

    dev = torch.device("cuda")
    labels = lambda n: torch.tensor([(i * 7) % 10 for i in range(n)], device=dev)
    ce = nn.CrossEntropyLoss()
    mlp = nn.Sequential(
        nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    ).to(dev)
    y = labels(128)
    cnn = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, 10),
    ).to(dev)
    y64 = labels(64)
    layer = nn.TransformerEncoderLayer(
        d_model=256, nhead=8, dim_feedforward=1024, dropout=0.0,
        activation="gelu", batch_first=True, norm_first=False,
    )
    enc = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).to(dev)
    target = torch.rand(16, 128, 256, device=dev)
    return {
        "MLP step (batch 128)": (mlp, torch.rand(128, 784, device=dev), lambda o: ce(o, y)),
        "CNN step (batch 64)": (cnn, torch.rand(64, 1, 28, 28, device=dev), lambda o: ce(o, y64)),
        "Transformer step (batch 16)": (
            enc, torch.rand(16, 128, 256, device=dev), lambda o: ((o - target) ** 2).mean()
        ),
    }


def kernel_kind(name):
    """The kind of a CUDA kernel, from its name."""
    n = name.lower()
    if any(k in n for k in ("adam", "multi_tensor", "foreach")):
        return "optimizer"
    if any(k in n for k in ("gemm", "cutlass", "xmma", "sm90_", "sm80_", "cublas", "conv", "winograd", "implicit")):
        return "GEMM/conv"
    if any(k in n for k in ("softmax", "norm", "reduce", "sum", "mean", "nll", "max_pool", "argmax")):
        return "reduction/normalization"
    if any(k in n for k in ("copy", "cat", "memcpy", "memset", "transpose", "index", "gather", "scatter", "fill")):
        return "copy"
    if any(k in n for k in ("elementwise", "vectorized", "unrolled", "pointwise")):
        return "elementwise"
    return "other"


def torch_profile():
    """One profiled step per model: kernel launches and GPU time by kind."""
    import collections
    import torch
    from torch.profiler import ProfilerActivity, profile

    for name, (model, x, loss_fn) in torch_models().items():
        step = adam_step(model, x, loss_fn)
        step()
        step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        count = collections.Counter()
        micros = collections.Counter()
        for evt in prof.events():
            if evt.device_type != torch.autograd.DeviceType.CUDA:
                continue
            kind = kernel_kind(evt.name)
            count[kind] += 1
            micros[kind] += evt.device_time
        total = sum(count.values())
        cells = ", ".join(
            f"{k} {count[k]} ({micros[k]:.0f} us)" for k in sorted(count, key=lambda k: -count[k])
        )
        print(f"{name}: {total} CUDA kernels/copies, {sum(micros.values()):.0f} us GPU time: {cells}")


def adam_step(model, x, loss_fn):
    """One training step (forward, backward, Adam, loss read back) as a function."""
    import torch

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x))
        loss.backward()
        opt.step()
        loss.item()

    return step


def torch_steps():
    import torch

    out = {
        name: median_secs(adam_step(model, x, loss_fn))
        for name, (model, x, loss_fn) in torch_models().items()
    }
    return out, torch.__version__, torch.cuda.get_device_name(0)


def main():
    if "--full-f32" in sys.argv[1:]:
        import torch

        sys.argv.remove("--full-f32")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if sys.argv[1:] == ["--profile"]:
        torch_profile()
        return
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    burn = json.load(open(sys.argv[1]))
    rows = []
    for line in burn:
        if line["impl"] != "burn-mlx" or not line["workload"].startswith("matmul"):
            continue
        _, dtype_name, n = line["workload"].split()
        n = int(n)
        ref = mlx_matmul(n, dtype_name)
        raw = next(
            (l["secs"] for l in burn if l["workload"] == line["workload"] and l["impl"] == "mlx-rs"),
            None,
        )
        tflops = lambda s: 2 * n**3 / s / 1e12
        rows.append(
            f"| {line['workload']} | {line['secs'] * 1e3:.3f} ms ({tflops(line['secs']):.0f} TFLOP/s) "
            f"| {ref * 1e3:.3f} ms ({tflops(ref):.0f} TFLOP/s) | MLX Python "
            f"| **{ref / line['secs'] * 100:.1f} %** of MLX's rate"
            + (f"; raw mlx-rs {raw * 1e3:.3f} ms" if raw else "")
            + " |"
        )
    steps, torch_version, gpu = torch_steps()
    for line in burn:
        if line["workload"] in steps:
            ref = steps[line["workload"]]
            label = line["workload"] + ("" if line["impl"] == "burn-mlx" else f" ({line['impl']})")
            rows.append(
                f"| {label} | {line['secs'] * 1e3:.3f} ms | {ref * 1e3:.3f} ms "
                f"| PyTorch {torch_version} eager | **{ref / line['secs']:.2f}x** "
                f"(PyTorch time / Burn+Mlx time) |"
            )
    import mlx.core as mx

    print(f"GPU: {gpu}; MLX {mx.__version__}; PyTorch {torch_version}\n")
    print("| workload | Burn + Mlx | reference | reference is | ratio |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
