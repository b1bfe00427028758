#!/usr/bin/env python3
"""Reference timings for `gpu_bench` (crates/burn-mlx-bench), on the same GPU and in the same way.

- Matmuls (f32 and bf16, square, the sizes gpu_bench used) through MLX's own Python API: the
  lower bound for Burn + Mlx, since both end in the same MLX kernels.
- The MLP, CNN, Transformer and decoder-LM training steps (forward, backward, Adam, loss read
  back) in PyTorch eager mode and with `torch.compile`, with the same layer shapes as the Burn
  models (`crates/burn-mlx-models`).

Usage (needs `mlx` with `mlx-cuda-13` 0.32.4, and torch with CUDA, in the same Python):

    cargo run --release -p burn-mlx-bench --features cuda --bin gpu_bench -- --json burn.json
    peers/burn-cuda/target/release/burn-cuda-peer --json burn-cuda.json     # optional
    python3 scripts/gpu_reference.py burn.json burn-cuda.json > table.md

It prints two Markdown tables: the matmuls against MLX's Python API, and one row per training
step with every implementation the JSON files hold (Burn + Mlx with and without its automatic
fusion, `MlxFused` (`gpu_bench --op-stream`), `grad::Trainer` and `grad::CompiledTrainer`,
burn-cuda) next to PyTorch eager and `torch.compile` (`--no-compile` leaves the latter
out), and a second table with the ratios of each Burn + Mlx row (default settings, and
`--mlx-autodiff`'s `grad::Trainer` and `grad::CompiledTrainer` rows when the JSON has them) to
PyTorch eager, torch.compile and burn-cuda (above 1: the Burn + Mlx row is faster).

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


def median_secs(fn, budget=2.0, warmup=2):
    """Median seconds per call after `warmup` calls (at least 5, at most 50 timed calls)."""
    for _ in range(warmup):
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


LM_VOCAB, LM_D, LM_HEADS, LM_LAYERS, LM_FF, LM_SEQ, LM_BATCH = 10240, 512, 8, 6, 2048, 256, 8


def decoder_lm(dev, batch=LM_BATCH):
    """The decoder LM of `models.rs` (29.5M parameters) and a batch of `batch` sequences: token
    and learned position embeddings, pre-norm Transformer layers under a causal mask, final
    LayerNorm, untied output layer."""
    import torch
    from torch import nn

    class DecoderLm(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(LM_VOCAB, LM_D)
            self.positions = nn.Embedding(LM_SEQ, LM_D)
            layer = nn.TransformerEncoderLayer(
                d_model=LM_D, nhead=LM_HEADS, dim_feedforward=LM_FF, dropout=0.0,
                activation="gelu", batch_first=True, norm_first=True,
            )
            self.layers = nn.TransformerEncoder(layer, num_layers=LM_LAYERS, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(LM_D)
            self.head = nn.Linear(LM_D, LM_VOCAB)
            self.register_buffer("pos", torch.arange(LM_SEQ)[None])
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(LM_SEQ))

        def forward(self, ids):
            x = self.tokens(ids) + self.positions(self.pos)
            x = self.layers(x, mask=self.mask, is_causal=True)
            return self.head(self.norm(x))

    n = batch * LM_SEQ
    ids = torch.tensor([i * 7919 % LM_VOCAB for i in range(n)], device=dev).reshape(batch, LM_SEQ)
    targets = torch.tensor([(i * 31 + 7) % LM_VOCAB for i in range(n)], device=dev)
    ce = nn.CrossEntropyLoss()
    return DecoderLm().to(dev), ids, lambda o: ce(o.reshape(n, LM_VOCAB), targets)


def encoder(dev, batch):
    """The Transformer encoder of `mlp_encoder.rs` (d_model 256, 8 heads, 2 post-norm layers,
    feed-forward 1024, GELU, no dropout), an input of `batch` sequences of 128 and its MSE loss
    against a random target: (model, input, loss function)."""
    import torch
    from torch import nn

    layer = nn.TransformerEncoderLayer(
        d_model=256, nhead=8, dim_feedforward=1024, dropout=0.0,
        activation="gelu", batch_first=True, norm_first=False,
    )
    enc = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).to(dev)
    target = torch.rand(batch, 128, 256, device=dev)
    return enc, torch.rand(batch, 128, 256, device=dev), lambda o: ((o - target) ** 2).mean()


def torch_models():
    """The four PyTorch workloads: name -> (model, input, loss function)."""
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
    return {
        "MLP step (batch 128)": (mlp, torch.rand(128, 784, device=dev), lambda o: ce(o, y)),
        "CNN step (batch 64)": (cnn, torch.rand(64, 1, 28, 28, device=dev), lambda o: ce(o, y64)),
        "Transformer step (batch 16)": encoder(dev, 16),
        "Decoder LM step (batch 8)": decoder_lm(dev),
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


def torch_steps(compile_too):
    """Median seconds per step of each workload: {name: {"eager": s, "compile": s or error}}."""
    import torch

    out = {}
    for name, (model, x, loss_fn) in torch_models().items():
        # 12 warm-up steps, as gpu_bench and burn-cuda-peer (`STEP_WARMUP`).
        out[name] = {"eager": median_secs(adam_step(model, x, loss_fn), warmup=12)}
        if compile_too:
            try:
                compiled = torch.compile(model)
                out[name]["compile"] = median_secs(adam_step(compiled, x, loss_fn), warmup=12)
            except Exception as e:  # noqa: BLE001 - the table says why the row is missing
                out[name]["compile"] = f"failed: {type(e).__name__}"
        print(f"{name}: {out[name]}", file=sys.stderr)
    return out, torch.__version__, torch.cuda.get_device_name(0)


def ms(secs):
    return f"{secs * 1e3:.3f} ms" if isinstance(secs, float) else (secs or "-")


def main():
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", nargs="*", help="gpu_bench / burn-cuda-peer JSON files")
    parser.add_argument("--profile", action="store_true", help="profile PyTorch's steps instead")
    parser.add_argument("--full-f32", action="store_true", help="PyTorch f32 matmuls and convolutions in full f32")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile column")
    args = parser.parse_args()
    if args.full_f32:
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if args.profile:
        torch_profile()
        return
    if not args.json:
        parser.error("give at least one JSON file")
    burn = [line for path in args.json for line in json.load(open(path))]
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
    steps, torch_version, gpu = torch_steps(not args.no_compile)
    try:
        import mlx.core as mx

        mlx_version = mx.__version__
    except ImportError:  # the training steps need no MLX Python; only the matmul rows do
        mlx_version = "(Python package not installed)"
    print(f"GPU: {gpu}; MLX {mlx_version}; PyTorch {torch_version}\n")
    if rows:
        print("| workload | Burn + Mlx | reference | reference is | ratio |")
        print("|---|---|---|---|---|")
        print("\n".join(rows) + "\n")
    # Columns for every implementation the JSON files hold, in this order.
    labels = {
        "burn-mlx": "Burn + Mlx",
        "burn-mlx unfused": "Burn + Mlx, no fusion",
        "burn-mlx op-stream": "Burn + MlxFused",
        "mlx-autodiff": "grad::Trainer",
        "mlx-compiled": "grad::CompiledTrainer",
        "burn-cuda": "burn-cuda",
    }
    impls = [i for i in labels if any(l["impl"] == i for l in burn)]
    print(
        "| training step | "
        + " | ".join(labels[i] for i in impls)
        + " | PyTorch eager | torch.compile |"
    )
    print("|---|" + "---|" * (len(impls) + 2))
    times = {}
    for name, ref in steps.items():
        ours = {l["impl"]: l["secs"] for l in burn if l["workload"] == name}
        if not ours:
            continue
        times[name] = (ours, ref)
        cells = [ms(ours.get(i)) for i in impls] + [ms(ref["eager"]), ms(ref.get("compile"))]
        print(f"| {name} | " + " | ".join(cells) + " |")
    # Ratios: the peer's time over each burn-mlx variant's (above 1: the burn-mlx variant is faster).
    mine = [i for i in impls if i != "burn-cuda"]
    peers = [("PyTorch eager", lambda o, r: r["eager"])]
    if any("compile" in r for _, r in times.values()):
        peers.append(("torch.compile", lambda o, r: r.get("compile")))
    if "burn-cuda" in impls:
        peers.append(("burn-cuda", lambda o, r: o.get("burn-cuda")))
    print("\n| training step | " + " | ".join(f"{labels[m]} vs {p}" for m in mine for p, _ in peers) + " |")
    print("|---|" + "---|" * (len(mine) * len(peers)))
    for name, (ours, ref) in times.items():
        cells = []
        for m in mine:
            for _, peer in peers:
                other, t = peer(ours, ref), ours.get(m)
                cells.append(f"**{other / t:.2f}x**" if t and isinstance(other, float) else "-")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
