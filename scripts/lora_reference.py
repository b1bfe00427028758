#!/usr/bin/env python3
"""PyTorch + PEFT reference for LoRA fine-tuning of the tiny decoder fixtures.

For each of the two tiny models written by ``scripts/llm_reference.py`` (``qwen3`` and ``llama``
under ``crates/burn-mlx-llm/tests/data/``: f32, 2 layers, hidden 64, vocab 256), it loads the
model with ``AutoModelForCausalLM.from_pretrained(dir, dtype=torch.float32)`` and wraps it with
PEFT LoRA in mlx-lm's setup:

* rank 4, scale 2.0 (PEFT ``r=4, lora_alpha=8``: scaling = alpha / r = 2.0; no rsLoRA),
  dropout 0, bias none;
* adapters on all seven linear projections (``q_proj k_proj v_proj o_proj gate_proj up_proj
  down_proj``) of the last layer only (``layers_to_transform=[1]``, mlx-lm ``num_layers=1``);
* initial adapters drawn with a fixed torch seed: ``lora_A ~ U(-1/sqrt(in), 1/sqrt(in))`` (as
  mlx-lm draws ``lora_a``) and ``lora_B ~ N(0, 0.2²)``; B is non-zero so that the gradient of A
  is non-zero too.

The batch (the same for both models) is 2 right-padded rows of random ids in [1, 256) drawn with
the same seed, lengths 14 and 10, padded with 0 to 14, prompt offsets 0 and 4. The loss is
mlx-lm's ``default_loss``: for row r with length L and offset o, the targets are the token
positions j with ``max(o, 1) <= j < L``, each predicted from the logits at position j - 1; the
loss is the sum of their cross-entropies over both rows divided by the number of targets
(token-weighted mean), in float32. Right padding with a causal mask cannot touch valid
positions; the script asserts it by recomputing row 1 alone.

It writes, under ``OUT/<model>/lora/``:

* ``initial.safetensors``: the initial adapters in mlx-lm layout and naming, f32:
  ``model.layers.1.self_attn.q_proj.lora_a`` = PEFT ``lora_A.weight``ᵀ (``[in, r]``) and
  ``...lora_b`` = ``lora_B.weight``ᵀ (``[r, out]``); mlx-lm computes
  ``y = x Wᵀ + scale · (x · lora_a) · lora_b``;
* ``grads.safetensors``: d loss / d adapter at the initial adapters, same layout and names;
* ``trained.safetensors``: the adapters after 20 steps of ``torch.optim.Adam`` (adapter
  parameters only, lr 1e-2, betas (0.9, 0.999), eps 1e-8, no weight decay, PyTorch's
  bias-corrected Adam) on that batch, same layout and names;
* ``reference.json``: seed, rank, scale, lora_alpha, num_layers, layers, keys, the batch, the
  loss definition (``loss_note``: how it differs from mlx-lm 0.32.0's ``default_loss``), the loss
  at the initial adapters (``loss``), the Adam settings, the loss before each of the 20 steps
  (``losses``; ``losses[0] == loss``), the loss after them (``loss_after_training``), the
  logits of row 0 (all 14
  tokens) at the initial adapters (``[14][256]``, 7 significant digits) and the versions used.

The script asserts that the base weights have ``requires_grad`` False and are bit-identical after
training.

Regenerate (CPU only; ``pip install torch transformers==5.17.0 peft safetensors numpy``):
    CUDA_VISIBLE_DEVICES= python scripts/lora_reference.py --out crates/burn-mlx-llm/tests/data
"""

import argparse
import json
import math
import os
import pathlib
import platform

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import peft  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

MODELS = ["qwen3", "llama"]
SEED = 20240
RANK = 4
SCALE = 2.0
LORA_ALPHA = RANK * SCALE  # PEFT scaling = lora_alpha / r
LAYERS = [1]
B_STD = 0.2
# Module paths inside a decoder layer, as mlx-lm writes them ("keys" of lora_parameters).
KEYS = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
]
TARGET_MODULES = [k.split(".")[-1] for k in KEYS]
LENGTHS = [14, 10]
OFFSETS = [0, 4]
SEQ = max(LENGTHS)
STEPS = 20
ADAM = {"lr": 1e-2, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
LOSS_DEFINITION = (
    "mlx-lm default_loss: for row r with length L and prompt offset o, the targets are the token "
    "positions j with max(o, 1) <= j < L; target j is tokens[r][j], predicted from the logits at "
    "position j - 1 (causal; right padding with id 0 never reaches valid positions). "
    "loss = (sum over both rows of the cross-entropies log_softmax over the 256 logits of every "
    "target) / (number of targets), a token-weighted mean computed in float32."
)
# mlx-lm 0.32.0's default_loss masks `steps <= lengths` and so also counts position L (a padding
# id 0) as a target of every padded row; this reference keeps j < L.
LOSS_NOTE = (
    "mlx-lm 0.32.0 default_loss uses steps <= length, which adds one padding target (id 0) per "
    "padded row; this reference counts only j < L."
)


def draw_batch(gen):
    tokens = torch.zeros((len(LENGTHS), SEQ), dtype=torch.long)
    for r, length in enumerate(LENGTHS):
        tokens[r, :length] = torch.randint(1, 256, (length,), generator=gen)
    return tokens


def loss_fn(model, tokens):
    """Token-weighted mean cross-entropy over the targets (see LOSS_DEFINITION)."""
    logits = model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits.float()
    total = torch.zeros((), dtype=torch.float32)
    count = 0
    for r, (length, offset) in enumerate(zip(LENGTHS, OFFSETS)):
        j = torch.arange(max(offset, 1), length)
        total = total + torch.nn.functional.cross_entropy(
            logits[r, j - 1], tokens[r, j], reduction="sum"
        )
        count += len(j)
    return total / count, logits


def lora_modules(model):
    """{key: (lora_A Linear, lora_B Linear)} of layer LAYERS[0] in the PEFT model."""
    layer = model.base_model.model.model.layers[LAYERS[0]]
    out = {}
    for key in KEYS:
        module = layer.get_submodule(key)
        out[key] = (module.lora_A["default"], module.lora_B["default"])
    return out


def mlx_tensors(modules, what):
    """The adapters (``what="weight"``) or their grads (``what="grad"``), mlx-lm names/layout."""
    tensors = {}
    for key, (a, b) in modules.items():
        ta = a.weight if what == "weight" else a.weight.grad
        tb = b.weight if what == "weight" else b.weight.grad
        prefix = f"model.layers.{LAYERS[0]}.{key}"
        tensors[f"{prefix}.lora_a"] = ta.detach().T.contiguous().to(torch.float32)
        tensors[f"{prefix}.lora_b"] = tb.detach().T.contiguous().to(torch.float32)
    return tensors


def sig(x, digits):
    return float(format(x, f".{digits}g"))


def build(name, data):
    folder = pathlib.Path(data) / name
    base = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    config = LoraConfig(
        r=RANK,
        lora_alpha=LORA_ALPHA,
        lora_dropout=0.0,
        target_modules=TARGET_MODULES,
        layers_to_transform=LAYERS,
        bias="none",
        use_rslora=False,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, config).eval()
    modules = lora_modules(model)

    gen = torch.Generator().manual_seed(SEED)
    tokens = draw_batch(gen)
    with torch.no_grad():
        for key in KEYS:
            a, b = modules[key]
            r, fan_in = a.weight.shape
            out_dim = b.weight.shape[0]
            assert r == RANK and b.weight.shape == (out_dim, RANK)
            bound = 1.0 / math.sqrt(fan_in)
            a.weight.copy_((torch.rand((RANK, fan_in), generator=gen) * 2 - 1) * bound)
            b.weight.copy_(torch.randn((out_dim, RANK), generator=gen) * B_STD)
    scaling = {
        key: model.base_model.model.model.layers[LAYERS[0]].get_submodule(key).scaling["default"]
        for key in KEYS
    }
    assert all(s == SCALE for s in scaling.values()), scaling

    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert len(trainable) == 2 * len(KEYS), [n for n, _ in trainable]
    assert all(".lora_A." in n or ".lora_B." in n for n, _ in trainable)
    base_params = {
        n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad
    }
    assert all("lora_" not in n for n in base_params)

    initial = mlx_tensors(modules, "weight")

    # Loss, logits and grads at the initial adapters.
    loss, logits = loss_fn(model, tokens)
    loss.backward()
    grads = mlx_tensors(modules, "grad")
    with torch.no_grad():
        # Right padding cannot reach valid positions: row 1 alone gives the same logits.
        alone = model(input_ids=tokens[1:, : LENGTHS[1]]).logits[0]
        diff = (alone - logits[1, : LENGTHS[1]]).abs().max().item()
        assert diff < 1e-5, f"{name}: padding changed row 1 logits by {diff}"
    logits0 = logits[0, : LENGTHS[0]].detach()
    loss0 = loss.item()

    # 20 Adam steps on the same batch.
    model.zero_grad(set_to_none=True)
    params = [p for _, p in trainable]
    opt = torch.optim.Adam(
        params, lr=ADAM["lr"], betas=tuple(ADAM["betas"]), eps=ADAM["eps"],
        weight_decay=ADAM["weight_decay"],
    )
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss, _ = loss_fn(model, tokens)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    assert losses[0] == loss0, (losses[0], loss0)
    with torch.no_grad():
        final_loss, _ = loss_fn(model, tokens)
    trained = mlx_tensors(modules, "weight")

    for n, p in model.named_parameters():
        if n in base_params:
            assert not p.requires_grad, n
            assert torch.equal(p.detach(), base_params[n]), f"{name}: base weight {n} changed"

    out = folder / "lora"
    out.mkdir(parents=True, exist_ok=True)
    # One metadata key, as mx.save_safetensors writes (several would come out in any order).
    meta = {"format": "mlx"}
    save_file(initial, out / "initial.safetensors", metadata=meta)
    save_file(grads, out / "grads.safetensors", metadata=meta)
    save_file(trained, out / "trained.safetensors", metadata=meta)
    reference = {
        "model": name,
        "seed": SEED,
        "init": (
            f"torch.Generator().manual_seed(seed): first the batch ids (row 0 then row 1, "
            f"randint(1, 256)), then for each key in order lora_A = (rand([r, in]) * 2 - 1) / "
            f"sqrt(in) and lora_B = {B_STD} * randn([out, r]) (PEFT layout)"
        ),
        "rank": RANK,
        "scale": SCALE,
        "lora_alpha": LORA_ALPHA,
        "num_layers": len(LAYERS),
        "layers": LAYERS,
        "keys": KEYS,
        "batch": {"tokens": tokens.tolist(), "lengths": LENGTHS, "offsets": OFFSETS},
        "loss_definition": LOSS_DEFINITION,
        "loss_note": LOSS_NOTE,
        "loss": sig(loss0, 10),
        "adam": {**ADAM, "amsgrad": False, "bias_correction": True},
        "losses": [sig(v, 10) for v in losses],
        "loss_after_training": sig(final_loss.item(), 10),
        "logits_with_adapters": [[sig(v, 7) for v in row] for row in logits0.tolist()],
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "python": platform.python_version(),
        },
    }
    (out / "reference.json").write_text(json.dumps(reference, separators=(",", ":")) + "\n")

    sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    print(f"{name}: wrote {out}: {sizes} (total {sum(sizes.values())} bytes)")
    print(
        f"{name}: loss {loss0:.9g}; losses[0] {losses[0]:.9g}, losses[-1] {losses[-1]:.9g}, "
        f"after {STEPS} steps {final_loss.item():.9g}"
    )
    gnorm = {k: v.norm().item() for k, v in grads.items()}
    print(f"{name}: grad norms " + ", ".join(
        f"{k.removeprefix(f'model.layers.{LAYERS[0]}.')} {v:.3g}" for k, v in gnorm.items()
    ))
    assert min(gnorm.values()) > 0, f"{name}: a zero gradient"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", default="crates/burn-mlx-llm/tests/data",
        help="data folder holding <model>/config.json; writes <model>/lora/",
    )
    args = parser.parse_args()
    torch.use_deterministic_algorithms(True)
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"peft {peft.__version__}"
    )
    for name in MODELS:
        build(name, args.out)


if __name__ == "__main__":
    main()
