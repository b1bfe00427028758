"""Issue 22's CPU table: `llm --bench` on every Burn backend against mlx-lm on MLX's CPU wheel.

Both sides run a Qwen3-shaped model with random weights of one preset shape (`small`: hidden 512,
8 layers, 8 query / 4 KV heads, head dim 64, intermediate 1536, vocab 32000, tied embeddings; or
`qwen3-0.6b`), batch 1, greedy, in one dtype. Each runner does a warm-up generation of the same
lengths and then a measured one, and reports prefill tokens/s (prompt tokens over the time to the
first new token) and decode tokens/s (the other new tokens over the time after the first). The
runners take turns, round after round, and the table gives each one's median over the rounds, so
that the load of this shared machine falls on all of them alike.

mlx-lm runs on the pip `mlx-cpu` wheel of the same MLX version, whose libmlx calls the wheel's
reference BLAS. It is started with `LD_PRELOAD` of burn-mlx's BLAS forwarding library (burn-mlx's
matrix-vector loops and OpenBLAS, see mlx-sys/blas.rs), so both runners multiply through the same
BLAS and the comparison measures the runners.

Usage (after `cargo build --release -p burn-mlx-llm --bin llm`):
    python3 -m venv /tmp/mlxpy && /tmp/mlxpy/bin/pip install "mlx[cpu]==0.32.4" "mlx-lm==0.32.2"
    /tmp/mlxpy/bin/python scripts/llm_cpu_compare.py --preset small --dtype f32 --rounds 3
"""

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

# The shapes of the presets in crates/burn-mlx-llm/src/config.rs (all Qwen3: q/k norm, tied embeddings).
PRESETS = {
    "small": dict(hidden=512, layers=8, heads=8, kv_heads=4, head_dim=64, inter=1536, vocab=32000),
    "qwen3-0.6b": dict(
        hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, inter=3072, vocab=151936
    ),
}
BACKENDS = ["mlx", "flex", "ndarray", "candle"]
REPO = Path(__file__).resolve().parent.parent


def mlx_lm_peer(args) -> dict:
    """One warm-up and one measured generation with mlx-lm's `generate_step` (this process)."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.generate import generate_step
    from mlx_lm.models import qwen3

    mx.set_default_device(mx.cpu)
    p = PRESETS[args.preset]
    model = qwen3.Model(
        qwen3.ModelArgs(
            model_type="qwen3",
            hidden_size=p["hidden"],
            num_hidden_layers=p["layers"],
            intermediate_size=p["inter"],
            num_attention_heads=p["heads"],
            rms_norm_eps=1e-6,
            vocab_size=p["vocab"],
            num_key_value_heads=p["kv_heads"],
            max_position_embeddings=40960,
            head_dim=p["head_dim"],
            tie_word_embeddings=True,
            rope_theta=1_000_000.0,
        )
    )
    dtype = {"f32": mx.float32, "bf16": mx.bfloat16, "f16": mx.float16}[args.dtype]
    model.update(tree_map(lambda a: a.astype(dtype), model.parameters()))
    mx.eval(model.parameters())
    mx.random.seed(args.seed)
    prompt = mx.random.randint(0, p["vocab"], (args.prompt_len,))

    def once():
        start = time.perf_counter()
        first, count = None, 0
        for _ in generate_step(prompt, model, max_tokens=args.max_tokens):
            count += 1
            if first is None:
                first = time.perf_counter() - start
        return first, time.perf_counter() - start, count

    once()
    first, total, count = once()
    return dict(prefill=args.prompt_len / first, decode=(count - 1) / (total - first))


def blas_forwarder() -> str:
    """burn-mlx's BLAS forwarding library in the wheel cache (see mlx-sys/fetch.rs)."""
    cache = os.environ.get("BURN_MLX_CACHE", os.path.expanduser("~/.cache/burn-mlx"))
    found = sorted(glob.glob(f"{cache}/mlx-cpu-*/*.libs/libburn_mlx_blas.so"))
    if not found:
        sys.exit(
            f"no libburn_mlx_blas.so under {cache}: build burn-mlx first "
            "(cargo build --release -p burn-mlx-llm --bin llm), without BURN_MLX_BLAS=reference"
        )
    return found[-1]


def run_peer(args) -> dict:
    env = dict(os.environ, LD_PRELOAD=blas_forwarder())
    cmd = [sys.executable, __file__, "--peer", "--preset", args.preset, "--dtype", args.dtype]
    cmd += ["--prompt-len", str(args.prompt_len), "--max-tokens", str(args.max_tokens)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"mlx-lm peer failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_burn(args, backend: str) -> dict:
    exe = Path(args.llm)
    if not exe.exists():
        sys.exit(f"{exe} is missing: run `cargo build --release -p burn-mlx-llm --bin llm` first")
    cmd = [str(exe), "--bench", "--preset", args.preset, "--backend", backend]
    cmd += ["--dtype", args.dtype, "--prompt-len", str(args.prompt_len)]
    cmd += ["--max-tokens", str(args.max_tokens), "--seed", str(args.seed)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    # The result line starts with "bench" (a line of host times per decode step may follow).
    lines = [l for l in out.stdout.splitlines() if l.startswith("bench ")]
    line = lines[-1] if lines else ""
    m = re.search(r"prefill ([\d.]+) tok/s \| decode ([\d.]+) tok/s", line)
    if out.returncode != 0 or not m:
        # The panic message (the line after "panicked at"), or the last line of stderr.
        lines = out.stderr.strip().splitlines() or ["no output"]
        at = [i for i, l in enumerate(lines) if "panicked at" in l]
        return dict(error=lines[at[0] + 1] if at and at[0] + 1 < len(lines) else lines[-1])
    return dict(prefill=float(m[1]), decode=float(m[2]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="small")
    parser.add_argument("--dtype", choices=["f32", "bf16", "f16"], default="f32")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument(
        "--llm",
        default=str(REPO / "target" / "release" / "llm"),
        help="the llm example's binary",
    )
    parser.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        print(json.dumps(mlx_lm_peer(args)), flush=True)
        return

    backends = [b for b in args.backends.split(",") if b]
    if args.dtype != "f32" and "ndarray" in backends:
        backends.remove("ndarray")  # burn-ndarray runs in f32 only
    runners = ["mlx-lm"] + [f"burn-{b}" for b in backends]
    results = {r: [] for r in runners}
    errors = {}
    load = os.getloadavg()[0]
    for rnd in range(args.rounds):
        for r in runners:
            res = run_peer(args) if r == "mlx-lm" else run_burn(args, r[5:])
            if "error" in res:
                errors[r] = res["error"]
            else:
                results[r].append(res)
            print(f"round {rnd + 1}: {r}: {res}", file=sys.stderr, flush=True)

    med = {
        r: (statistics.median(x["prefill"] for x in v), statistics.median(x["decode"] for x in v))
        for r, v in results.items()
        if v
    }
    print(
        f"preset {args.preset}, {args.dtype}, prompt {args.prompt_len}, {args.max_tokens} new "
        f"tokens, greedy, batch 1; median of {args.rounds} rounds; load average at start "
        f"{load:.2f}, at end {os.getloadavg()[0]:.2f}"
    )
    print()
    print("| runner | prefill tok/s | decode tok/s | Burn + Mlx decode is |")
    print("|---|---:|---:|---:|")
    ours = med.get("burn-mlx")
    for r in runners:
        if r not in med:
            print(f"| {r} | n/a | n/a | {errors.get(r, 'no result')} |")
            continue
        pre, dec = med[r]
        ratio = "-" if r == "burn-mlx" or not ours else f"{ours[1] / dec:.2f}x"
        print(f"| {r} | {pre:,.1f} | {dec:,.1f} | {ratio} |")


if __name__ == "__main__":
    main()
