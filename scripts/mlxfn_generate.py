#!/usr/bin/env python3
"""Greedy text generation in MLX Python from a decode step exported by burn-mlx-llm, with no Burn
and no model code.

    cargo run --release -p burn-mlx-llm --bin llm -- --model DIR --export step.mlxfn --max-context 512
    python3 scripts/mlxfn_generate.py step.mlxfn --prompt-ids 9707,11,1879 --max-tokens 20

The file's metadata (JSON) gives the layer count, the cache shape and the dtypes. Each step takes
the token, its position and every layer's key and value cache, and returns the logits and the
caches with that position written; the prompt goes through one token per step. Prints the
generated token ids, separated by spaces, as `llm --prompt-ids ... --temp 0` does for a model
folder without a tokenizer, then the decode rate on stderr. Stops at an end-of-sequence id unless
`--ignore-eos`.

Needs only MLX (`pip install mlx[cpu]`, `mlx` on a Mac, `mlx[cuda13]` for NVIDIA GPUs).
"""

import argparse
import json
import sys
import time

import mlx.core as mx


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("function", help="the exported decode step (.mlxfn)")
    parser.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--ignore-eos", action="store_true")
    args = parser.parse_args()

    step, metadata = mx.import_function(args.function, return_metadata=True)
    try:
        info = json.loads(metadata)
        layers, kv_heads, head_dim = info["layers"], info["kv_heads"], info["head_dim"]
        capacity, dtype, eos = info["capacity"], info["dtype"], set(info["eos_token_ids"])
        int_dtype = {"int64": mx.int64, "int32": mx.int32}[info["int_dtype"]]
    except (ValueError, KeyError) as e:
        print(f"{args.function}: not a burn-mlx-llm decode step (metadata: {e})", file=sys.stderr)
        return 1
    float_dtype = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}[dtype]
    prompt = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
    if not prompt:
        print("--prompt-ids is empty", file=sys.stderr)
        return 1
    if len(prompt) + args.max_tokens > capacity + 1:
        print(f"the prompt and --max-tokens need {len(prompt) + args.max_tokens - 1} cache "
              f"positions; the file's cache holds {capacity}", file=sys.stderr)
        return 1

    shape = (1, kv_heads, capacity, head_dim)
    cache = [mx.zeros(shape, dtype=float_dtype) for _ in range(2 * layers)]

    def run(token, position):
        nonlocal cache
        out = step(mx.array([[token]], dtype=int_dtype), mx.array([position], dtype=int_dtype), *cache)
        cache = out[1:]
        return mx.argmax(out[0], axis=-1)

    for position, token in enumerate(prompt[:-1]):
        mx.eval(run(token, position), *cache)
    generated = []
    token, position = prompt[-1], len(prompt) - 1
    start = time.perf_counter()
    for _ in range(args.max_tokens):
        nxt = run(token, position)
        mx.eval(nxt, *cache)
        token, position = nxt.item(), position + 1
        generated.append(token)
        print(token, end=" ", flush=True)
        if token in eos and not args.ignore_eos:
            break
    elapsed = time.perf_counter() - start
    print()
    print(f"{len(generated)} tokens, {len(generated) / elapsed:.1f} tok/s (MLX {mx.__version__}, "
          f"{mx.default_device()})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
