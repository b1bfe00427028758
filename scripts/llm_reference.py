#!/usr/bin/env python3
"""Hugging Face transformers reference for the LLM example and tests (issue 22).

Builds two tiny random-weight decoder models with transformers, in float32 on the CPU:

* ``qwen3``: Qwen3ForCausalLM, 2 layers, hidden 64, 4 query / 2 KV heads, head_dim 16,
  intermediate 96, vocab 256, per-head q/k RMSNorm, tied embeddings, rope_theta 1e6, no scaling.
* ``llama``: LlamaForCausalLM, the same sizes without q/k norm, untied ``lm_head``, rope_theta 1e4
  and ``rope_scaling`` of type ``llama3`` (factor 8, low/high frequency factors 1 and 4,
  original_max_position_embeddings 32, so that with head_dim 16 the high-, medium- and
  low-frequency branches of the llama3 rule are all used).

All weights are drawn at random (linear and embedding weights N(0, 0.15²), RMSNorm weights
1 + N(0, 0.1²)) so that logits spread over a few units and greedy choices have clear margins.
For each model it writes, under ``OUT/<name>/``:

* ``config.json`` and ``model.safetensors`` (f32), from ``save_pretrained``;
* ``reference.json``: the prompt ids, the prefill logits of every prompt position
  (``[len(prompt)][vocab]``, 9 significant digits, exact for f32), the 20 greedy tokens of
  ``generate(do_sample=False)`` with EOS disabled, the smallest top-1/top-2 logit margin over
  those 20 choices and the versions used. The script re-draws the weights until that margin is
  above 1e-2 (so that float rounding cannot flip a greedy choice) and the 20 tokens hold at least
  8 distinct ids (so that a broken KV cache cannot hide behind a repeated token).

The Rust side is ``crates/burn-mlx-llm/tests/llm.rs`` (fixtures in
``crates/burn-mlx-llm/tests/data/``).

Regenerate (transformers and torch are in /opt/torch/.venv on the device machine; CPU only):
    CUDA_VISIBLE_DEVICES= /opt/torch/.venv/bin/python scripts/llm_reference.py --out crates/burn-mlx-llm/tests/data
or anywhere with ``pip install torch transformers safetensors``.
"""

import argparse
import inspect
import json
import os
import pathlib
import platform

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

PROMPT = [1, 17, 42, 99, 7, 200, 3, 150, 64, 31, 255, 128]
NEW_TOKENS = 20
MIN_MARGIN = 1e-2
# A greedy run that repeats one token would let a broken cache pass unnoticed.
MIN_DISTINCT = 8

COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    bos_token_id=0,
    eos_token_id=2,
    pad_token_id=0,
    attention_bias=False,
    hidden_act="silu",
)


def rope_kwargs(cls, theta, scaling):
    """RoPE settings in whichever form this transformers version takes.

    transformers 5 reads ``rope_parameters`` (theta inside); 4.x reads ``rope_theta`` and
    ``rope_scaling``. The Rust loader accepts both forms of config.json.
    """
    params = inspect.signature(cls.__init__).parameters
    if "rope_parameters" in params:
        rope = {"rope_type": "default", "rope_theta": theta}
        if scaling:
            rope.update(scaling)
        return {"rope_parameters": rope}
    kwargs = {"rope_theta": theta}
    if scaling:
        kwargs["rope_scaling"] = dict(scaling)
    return kwargs


def make_qwen3():
    config = Qwen3Config(
        **COMMON,
        head_dim=16,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
        **rope_kwargs(Qwen3Config, 1e6, None),
    )
    return Qwen3ForCausalLM, config


def make_llama():
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }
    config = LlamaConfig(
        **COMMON,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        mlp_bias=False,
        **rope_kwargs(LlamaConfig, 1e4, scaling),
    )
    return LlamaForCausalLM, config


def randomize(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.15 * noise)


def build(name, maker, out):
    cls, config = maker()
    config._attn_implementation = "eager"
    prompt = torch.tensor([PROMPT], dtype=torch.long)
    for seed in range(100):
        torch.manual_seed(seed)
        model = cls(config).to(torch.float32).eval()
        randomize(model, 1000 + seed)
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        with torch.no_grad():
            prefill = model(prompt).logits[0]
            out_ids = model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )[0]
            greedy = out_ids[len(PROMPT):].tolist()
            assert len(greedy) == NEW_TOKENS, f"{name}: generate gave {len(greedy)} tokens"
            # Full recompute of the whole sequence: every greedy choice must be its argmax, and
            # its margin over the runner-up tells how safe the comparison is.
            full = model(out_ids[None, :-1]).logits[0, len(PROMPT) - 1:]
        top2 = torch.topk(full, 2, dim=-1).values
        margin = float((top2[:, 0] - top2[:, 1]).min())
        agrees = full.argmax(-1).tolist() == greedy
        distinct = len(set(greedy))
        print(
            f"{name}: seed {seed} min margin {margin:.4g}, {distinct} distinct tokens, "
            f"full recompute agrees: {agrees}"
        )
        if agrees and margin > MIN_MARGIN and distinct >= MIN_DISTINCT:
            break
    else:
        raise SystemExit(f"{name}: no seed gave a margin above {MIN_MARGIN} and {MIN_DISTINCT} tokens")

    folder = pathlib.Path(out) / name
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    # Only config.json and model.safetensors are fixtures.
    (folder / "generation_config.json").unlink(missing_ok=True)
    reference = {
        "model": cls.__name__,
        "seed": seed,
        "prompt": PROMPT,
        "prefill_logits": [[float(format(v, ".9g")) for v in row] for row in prefill.tolist()],
        "greedy": greedy,
        "greedy_min_margin": margin,
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
    }
    (folder / "reference.json").write_text(json.dumps(reference, separators=(",", ":")) + "\n")
    sizes = {p.name: p.stat().st_size for p in sorted(folder.iterdir())}
    print(f"{name}: wrote {folder}: {sizes}")
    print(f"{name}: greedy {greedy}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="crates/burn-mlx-llm/tests/data", help="output folder")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    build("qwen3", make_qwen3, args.out)
    build("llama", make_llama, args.out)


if __name__ == "__main__":
    main()
