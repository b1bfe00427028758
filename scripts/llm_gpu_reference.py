"""The peers of `cargo run --release -p burn-mlx-llm --features cuda --bin llm -- --bench` on a GPU.

Issue 22's speed table: a Qwen3-0.6B-shaped model (hidden 1024, 28 layers, 16 query / 8 KV heads,
head dim 128, intermediate 3072, vocab 151936, tied embeddings) with random weights, batch 1, a
512-token prompt and 128 greedy new tokens, in bf16, timed with

- mlx-lm (MLX's own LLM runner, Python), on the same MLX CUDA wheel (0.32.4) as burn-mlx, and
- Hugging Face transformers, eager attention, `generate`.

The weights are written once by transformers (`Qwen3ForCausalLM` with random initialisation,
saved as bf16 safetensors with its config.json) into `--model-dir`, and both peers load that
folder; `llm --model DIR --prompt-ids ...` loads the same files into Burn. The prompt ids go to
`DIR/prompt_ids.txt` (comma-separated) for that.

Each peer does one warm-up generation and then one measured generation, and prints one JSON line:
prefill tokens/s (prompt tokens over the time to the first new token) and decode tokens/s (the
remaining new tokens over the time after the first).

With `--mlx-lm-batches 4,16`, mlx-lm's `BatchGenerator` also decodes that many random prompts
together (the peer of `llm --bench --batch N`).

Usage (on the GPU machine; mlx-lm's and MLX's wheels on PYTHONPATH):
    python scripts/llm_gpu_reference.py --model-dir /tmp/qwen3-0.6b-random [--skip-transformers]
        [--mlx-lm-variants bf16,f32,q8,q4] [--mlx-lm-batches 4,16]
"""

import argparse
import json
import os
import random
import time
from pathlib import Path

QWEN3_06B = dict(
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    bos_token_id=151643,
    eos_token_id=151645,
)


def write_model(model_dir: Path, prompt_len: int, seed: int) -> list:
    """Random bf16 weights and config.json with transformers, and a random prompt."""
    ids_path = model_dir / "prompt_ids.txt"
    if (model_dir / "model.safetensors").exists() and ids_path.exists():
        return [int(t) for t in ids_path.read_text().split(",")]
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(**QWEN3_06B, torch_dtype="bfloat16")
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(model_dir, safe_serialization=True)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, QWEN3_06B["vocab_size"], (prompt_len,), generator=gen).tolist()
    ids_path.write_text(",".join(str(i) for i in ids))
    return ids


# name: (hidden, layers, heads, kv_heads, head_dim, intermediate, vocab), as `LlmConfig::preset`
# (rms eps 1e-6, RoPE base 1e6, tied embeddings, no biases).
PRESETS = {
    "qwen3-0.6b": (1024, 28, 16, 8, 128, 3072, 151_936),
    "small": (512, 8, 8, 4, 64, 1536, 32_000),
}


def random_preset(name: str):
    """An mlx-lm Qwen3 of preset `name` with random bf16 weights, made in MLX (no files, no
    PyTorch): the CPU peer, where transformers is not installed."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.models import qwen3

    h, n_layers, heads, kv, hd, inter, vocab = PRESETS[name]
    model = qwen3.Model(qwen3.ModelArgs(
        model_type="qwen3", hidden_size=h, num_hidden_layers=n_layers, intermediate_size=inter,
        num_attention_heads=heads, rms_norm_eps=1e-6, vocab_size=vocab, num_key_value_heads=kv,
        max_position_embeddings=40_960, head_dim=hd, tie_word_embeddings=True, rope_theta=1e6))
    params = [(k, mx.ones(v.shape, mx.bfloat16) if k.endswith("norm.weight")
               else (0.02 * mx.random.normal(v.shape)).astype(mx.bfloat16))
              for k, v in tree_flatten(model.parameters())]
    model.update(tree_unflatten(params))
    return model


def load_mlx_lm(model_dir, variant: str):
    """The model in mlx-lm, from a folder or (`model_dir` a preset name) random weights, in
    `variant`: `bf16` (the file's dtype), `f32` (weights cast, as `llm --dtype f32` does), or
    `q8`/`q4` (MLX's affine quantization, group size 64, of every Linear and of the embedding,
    which serves as the tied output projection: what `mlx_lm.convert -q` makes). The weights are
    evaluated and the peak memory reset."""
    import mlx.core as mx
    import mlx.nn as nn

    if isinstance(model_dir, str):
        model = random_preset(model_dir)
    else:
        from mlx_lm.utils import load_model

        model, _ = load_model(model_dir)
    if variant == "f32":
        model.set_dtype(mx.float32)
    elif variant in ("q8", "q4"):
        nn.quantize(
            model,
            group_size=64,
            bits=int(variant[1]),
            class_predicate=lambda _, m: hasattr(m, "to_quantized")
            and m.weight.shape[-1] % 64 == 0,
        )
    elif variant != "bf16":
        raise SystemExit(f"unknown mlx-lm variant {variant!r} (bf16, f32, q8, q4)")
    mx.eval(model.parameters())
    mx.reset_peak_memory()
    return model


def time_mlx_lm(model_dir, ids: list, new_tokens: int, variant: str) -> dict:
    """mlx-lm's generate_step, greedy, as mlx_lm.generate times it."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    model = load_mlx_lm(model_dir, variant)
    prompt = mx.array(ids)

    def once(n):
        start = time.perf_counter()
        first = None
        count = 0
        for _token, _ in generate_step(prompt, model, max_tokens=n):
            count += 1
            if first is None:
                first = time.perf_counter() - start
        total = time.perf_counter() - start
        return first, total, count

    once(8)
    first, total, count = once(new_tokens)
    return dict(
        runner="mlx-lm",
        variant=variant,
        device=str(mx.default_device()),
        prompt_tokens=len(ids),
        new_tokens=count,
        ttft_s=first,
        prefill_tok_s=len(ids) / first,
        decode_tok_s=(count - 1) / (total - first),
        peak_memory_gb=mx.get_peak_memory() / 1e9,
    )


def time_mlx_lm_batch(
    model_dir, batch: int, prompt_len: int, new_tokens: int, variant: str, seed: int, vocab: int
) -> dict:
    """mlx-lm's `BatchGenerator` (what `mlx_lm.batch_generate` runs), greedy, over `batch` random
    prompts of `prompt_len` tokens, all prefilled and decoded as one batch (prefill and
    completion batch sizes set to `batch`), with no stop token: the peer of `llm --bench
    --batch N`. Reports mlx-lm's own statistics: prompt tokens/s, and generated tokens/s over
    the whole batch."""
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator

    model = load_mlx_lm(model_dir, variant)
    rng = random.Random(seed)
    prompts = [
        [rng.randrange(vocab) for _ in range(prompt_len)]
        for _ in range(batch)
    ]

    def once(n):
        gen = BatchGenerator(
            model, stop_tokens=[], prefill_batch_size=batch, completion_batch_size=batch
        )
        gen.insert(prompts, [n] * batch)
        with gen.stats() as stats:
            while gen.next_generated():
                pass
        gen.close()
        return stats

    once(new_tokens)
    mx.reset_peak_memory()
    stats = once(new_tokens)
    return dict(
        runner="mlx-lm-batch",
        variant=variant,
        device=str(mx.default_device()),
        batch=batch,
        prompt_tokens=stats.prompt_tokens,
        new_tokens=stats.generation_tokens,
        prefill_tok_s=stats.prompt_tps,
        total_decode_tok_s=stats.generation_tps,
        peak_memory_gb=stats.peak_memory,
    )


def time_transformers(model_dir: Path, ids: list, new_tokens: int) -> dict:
    """transformers eager `generate`, greedy, with the prefill timed as a forward pass."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, torch_dtype=torch.bfloat16, attn_implementation="eager"
    ).cuda()
    model.eval()
    inputs = torch.tensor([ids], device="cuda")

    def once(n):
        with torch.no_grad():
            torch.cuda.synchronize()
            start = time.perf_counter()
            model(inputs)
            torch.cuda.synchronize()
            prefill = time.perf_counter() - start
            start = time.perf_counter()
            out = model.generate(
                inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False
            )
            torch.cuda.synchronize()
            total = time.perf_counter() - start
        return prefill, total, out.shape[1] - len(ids)

    once(4)
    prefill, total, count = once(new_tokens)
    return dict(
        runner="transformers-eager",
        device=torch.cuda.get_device_name(),
        prompt_tokens=len(ids),
        new_tokens=count,
        ttft_s=prefill,
        prefill_tok_s=len(ids) / prefill,
        decode_tok_s=(count - 1) / (total - prefill),
        peak_memory_gb=torch.cuda.max_memory_allocated() / 1e9,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="mlx-lm only, instead of --model-dir: random weights of this `llm --preset` shape "
        "made in MLX (with --device cpu: the CPU peer, no PyTorch needed)",
    )
    parser.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--skip-mlx-lm", action="store_true")
    parser.add_argument(
        "--mlx-lm-variants",
        default="bf16",
        help="comma-separated mlx-lm runs: bf16, f32, q8, q4 (default bf16)",
    )
    parser.add_argument(
        "--mlx-lm-batches",
        default="",
        help="comma-separated batch sizes for mlx-lm's BatchGenerator runs (in each variant)",
    )
    args = parser.parse_args()
    if (args.model_dir is None) == (args.preset is None):
        parser.error("give one of --model-dir and --preset")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.device == "cpu":
        import mlx.core as mx

        mx.set_default_device(mx.cpu)
    if args.preset:
        args.skip_transformers = True
        source, vocab = args.preset, PRESETS[args.preset][6]
        rng = random.Random(args.seed)
        ids = [rng.randrange(vocab) for _ in range(args.prompt_len)]
    else:
        source, vocab = args.model_dir, QWEN3_06B["vocab_size"]
        ids = write_model(args.model_dir, args.prompt_len, args.seed)
    if not args.skip_mlx_lm:
        for variant in args.mlx_lm_variants.split(","):
            result = time_mlx_lm(source, ids, args.new_tokens, variant)
            print(json.dumps(result), flush=True)
            for batch in filter(None, args.mlx_lm_batches.split(",")):
                result = time_mlx_lm_batch(
                    source,
                    int(batch),
                    args.prompt_len,
                    args.new_tokens,
                    variant,
                    args.seed,
                    vocab,
                )
                print(json.dumps(result), flush=True)
    if not args.skip_transformers:
        print(json.dumps(time_transformers(args.model_dir, ids, args.new_tokens)), flush=True)


if __name__ == "__main__":
    main()
