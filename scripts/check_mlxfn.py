#!/usr/bin/env python3
"""Runs an MLX function file in MLX Python, with no Burn code, and checks it against reference
outputs.

    python3 scripts/check_mlxfn.py MODEL.mlxfn MODEL.examples.safetensors [--tol 1e-5]

The reference file holds `input.0`, `input.1`, ... and `output.0`, ... (written by
`burn_mlx::export::save_examples`, e.g. by `cargo run --release --example train -- --export
cnn.mlxfn`). The script imports the function with `mx.import_function`, calls it on the inputs
and compares every output with the reference: the largest absolute difference, divided by the
reference's largest magnitude, must be at most `--tol` (`--absolute`: the difference itself).
For a 2-D float output it also reports how many rows have the same argmax (the same predicted
class). Exits with status 1 if any output differs by more than the tolerance.

MLX's CPU wheel multiplies matrices with the reference BLAS, burn-mlx with OpenBLAS: their
float32 sums differ in the last bits (about 1e-6 of the values). `--burn-blas` runs the check
through burn-mlx's OpenBLAS forwarding library (from burn-mlx's wheel cache, built by any burn-mlx
build on Linux), so both sides multiply alike and a CPU file gives identical outputs.

Needs only MLX: `pip install mlx[cpu]` on Linux, `pip install mlx` on a Mac, `pip install
mlx[cuda13]` for NVIDIA GPUs.
"""

import argparse
import glob
import os
import sys

import mlx.core as mx


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("function", help="the .mlxfn file")
    parser.add_argument("examples", help="the reference .safetensors file")
    parser.add_argument("--tol", type=float, default=1e-5,
                        help="largest |difference| / max |reference| allowed (see --absolute)")
    parser.add_argument("--absolute", action="store_true", help="compare the |difference| itself")
    parser.add_argument("--burn-blas", action="store_true", help="multiply through burn-mlx's OpenBLAS (Linux CPU)")
    args = parser.parse_args()
    if args.burn_blas and "libburn_mlx_blas" not in os.environ.get("LD_PRELOAD", ""):
        cache = os.environ.get("BURN_MLX_CACHE", os.path.expanduser("~/.cache/burn-mlx"))
        found = sorted(glob.glob(f"{cache}/mlx-cpu-*/*.libs/libburn_mlx_blas.so"))
        if not found:
            print(f"no libburn_mlx_blas.so under {cache}: build burn-mlx first (cargo build)")
            return 1
        env = dict(os.environ, LD_PRELOAD=found[-1])
        os.execve(sys.executable, [sys.executable] + sys.argv, env)

    fn, metadata = mx.import_function(args.function, return_metadata=True)
    ref = mx.load(args.examples)
    inputs = [ref[f"input.{i}"] for i in range(len(ref)) if f"input.{i}" in ref]
    expected = [ref[f"output.{i}"] for i in range(len(ref)) if f"output.{i}" in ref]
    blas = "burn-mlx's OpenBLAS" if "libburn_mlx_blas" in os.environ.get("LD_PRELOAD", "") else "the wheel's BLAS"
    print(f"MLX {mx.__version__}, default device {mx.default_device()}, {blas}")
    if metadata:
        print(f"metadata: {metadata}")
    print("inputs: " + ", ".join(f"{x.dtype} {list(x.shape)}" for x in inputs))

    outputs = fn(*inputs)
    mx.eval(outputs)
    if len(outputs) != len(expected):
        print(f"FAIL: the function gave {len(outputs)} outputs, the reference has {len(expected)}")
        return 1
    ok = True
    for i, (got, want) in enumerate(zip(outputs, expected)):
        if got.shape != want.shape:
            print(f"FAIL output {i}: shape {list(got.shape)}, reference {list(want.shape)}")
            ok = False
            continue
        diff = mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item()
        scale = mx.abs(want.astype(mx.float32)).max().item()
        line = f"output {i}: {got.dtype} {list(got.shape)}, largest absolute difference {diff:.3e}"
        line += f" (largest |reference| {scale:.3g}, relative {diff / max(scale, 1e-30):.3e})"
        if not args.absolute:
            diff = diff / max(scale, 1e-30)
        if got.ndim == 2 and mx.issubdtype(got.dtype, mx.floating):
            same = (mx.argmax(got, axis=1) == mx.argmax(want, axis=1)).sum().item()
            line += f", same argmax in {same}/{got.shape[0]} rows"
        passed = diff <= args.tol
        print(("ok   " if passed else "FAIL ") + line + f" (tolerance {args.tol:g})")
        ok = ok and passed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
