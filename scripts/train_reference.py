"""PyTorch's side of `train_bench`: the same training steps at real batch sizes, eager and
torch.compile, and the table comparing them with Burn + Mlx.

    python3 scripts/train_reference.py --out torch.json            # time PyTorch (CUDA)
    python3 scripts/train_reference.py --table mlx1.json torch1.json mlx2.json torch2.json ...

The first form times an Adam step (forward, backward, update, `loss.item()`) of the encoder at
batch 16 and 128 and the decoder LM at batch 8 and 32 (the models of `gpu_reference.py`, which
are `burn-mlx-models`' shapes), eager and compiled, with TF32 matmuls (the precision MLX's CUDA
backend uses for f32). The second reads the JSON of alternating rounds (train_bench's
`--json` and this script's `--out`) and prints, per row, each Burn + Mlx variant's samples/s
and its ratio to PyTorch eager and torch.compile in the same round (above 1: Burn + Mlx is
faster), then the median ratio over the rounds.
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_reference import adam_step, decoder_lm, encoder, median_secs  # noqa: E402

ROWS = [("encoder", 16), ("encoder", 128), ("decoder", 8), ("decoder", 32)]


def time_torch(compile_too):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device("cuda")
    rows = []
    for workload, batch in ROWS:
        model, x, loss_fn = encoder(dev, batch) if workload == "encoder" else decoder_lm(dev, batch)
        kinds = [("torch eager", model)]
        if compile_too:
            kinds.append(("torch.compile", torch.compile(model)))
        for name, m in kinds:
            try:
                secs = median_secs(adam_step(m, x, loss_fn), warmup=12)
            except Exception as e:  # noqa: BLE001 - the table says why the row is missing
                print(f"{workload} {batch} {name}: failed: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            row = {"workload": workload, "batch": batch, "variant": name,
                   "ms": secs * 1e3, "samples_per_s": batch / secs}
            print(f"{workload:<8} batch {batch:>3}  {name:<14} {row['samples_per_s']:>9.1f} samples/s "
                  f"{row['ms']:>7.2f} ms/step", file=sys.stderr)
            rows.append(row)
    return {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}


def table(paths):
    rounds = []
    for mlx_path, torch_path in zip(paths[::2], paths[1::2]):
        mlx, torch = json.load(open(mlx_path)), json.load(open(torch_path))
        rounds.append((mlx["rows"], torch["rows"]))
    print(f"{len(rounds)} rounds; PyTorch {json.load(open(paths[1]))['torch']} on "
          f"{json.load(open(paths[1]))['device']}\n")
    print("| row | variant | samples/s by round | ms/step | host build / start / wait ms | "
          "primitives | × eager by round (median) | × torch.compile (median) |")
    print("|---|---|---|---|---|---|---|---|")
    for workload, batch in ROWS:
        variants = [r["variant"] for r in rounds[0][0] if (r["workload"], r["batch"]) == (workload, batch)]
        for v in variants:
            cells, eager, comp, ms, split, prims = [], [], [], [], [], None
            for mlx, torch in rounds:
                r = next(r for r in mlx if (r["workload"], r["batch"], r["variant"]) == (workload, batch, v))
                cells.append(f"{r['samples_per_s']:,.0f}")
                ms.append(r["ms"])
                split.append((r["build_ms"], r["start_ms"], r["wait_ms"]))
                prims = r.get("primitives")
                for name, out in (("torch eager", eager), ("torch.compile", comp)):
                    t = [t for t in torch if (t["workload"], t["batch"], t["variant"]) == (workload, batch, name)]
                    if t:
                        out.append(r["samples_per_s"] / t[0]["samples_per_s"])
            b, s, w = (statistics.median(x[i] for x in split) for i in range(3))
            fmt = lambda xs: (" / ".join(f"{x:.2f}" for x in xs) + f" ({statistics.median(xs):.2f}×)") if xs else "-"
            print(f"| {workload} b{batch} | {v} | {' / '.join(cells)} | {statistics.median(ms):.2f} | "
                  f"{b:.2f} / {s:.2f} / {w:.2f} | {prims if prims is not None else '-'} | {fmt(eager)} | {fmt(comp)} |")
    print("\n| row | PyTorch | samples/s by round |\n|---|---|---|")
    for workload, batch in ROWS:
        for name in ("torch eager", "torch.compile"):
            xs = [t["samples_per_s"] for _, torch in rounds for t in torch
                  if (t["workload"], t["batch"], t["variant"]) == (workload, batch, name)]
            if xs:
                print(f"| {workload} b{batch} | {name} | {' / '.join(f'{x:,.0f}' for x in xs)} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="time PyTorch and write its rows here")
    parser.add_argument("--no-compile", action="store_true", help="leave out torch.compile")
    parser.add_argument("--table", nargs="+", help="train_bench and PyTorch JSON files, alternating")
    args = parser.parse_args()
    if args.table:
        if len(args.table) % 2:
            parser.error("--table takes pairs: a train_bench JSON, then the PyTorch JSON of the same round")
        table(args.table)
    elif args.out:
        with open(args.out, "w") as f:
            json.dump(time_torch(not args.no_compile), f, indent=1)
    else:
        parser.error("give --out FILE or --table FILES")


if __name__ == "__main__":
    main()
