#!/usr/bin/env python3
"""Check that LoRA adapters written by burn-mlx load in mlx-lm and in transformers + PEFT.

Given an HF model folder (f32) and an adapter folder in both layouts

* mlx-lm: ``DIR/adapters.safetensors`` (``model.layers.N.self_attn.q_proj.lora_a`` ``[in, r]``,
  ``...lora_b`` ``[r, out]``) and ``DIR/adapter_config.json``
  (``{"fine_tune_type": "lora", "num_layers": N, "lora_parameters": {"rank", "scale",
  "dropout", "keys"?}}``; mlx-lm adapts the last ``num_layers`` decoder layers);
* PEFT: ``DIR/peft/adapter_model.safetensors``
  (``base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`` ``[r, in]``,
  ``...lora_B.weight`` ``[out, r]``) and ``DIR/peft/adapter_config.json`` (as
  ``LoraConfig.save_pretrained`` writes it),

it computes the logits of ``tokens`` from ``--expected`` (JSON ``{"tokens": [...],
"logits": [[...]]}``, written by burn-mlx) with

(a) transformers + ``PeftModel.from_pretrained(base, DIR/peft)``,
(b) mlx-lm: ``mlx_lm.utils.load_model`` + ``mlx_lm.tuner.utils.load_adapters(model, DIR)``,
(c) with ``--fused FOLDER`` (an HF folder with the adapters merged into the weights):
    transformers and mlx-lm on that folder,

prints max |diff| against the expected logits for each and exits 1 if any exceeds ``--tol``.
Both loaders are also checked to have taken every adapter tensor (mlx-lm silently keeps its
random ``lora_a`` / zero ``lora_b`` for a missing one; PEFT only warns).

``--self-test`` needs no burn-mlx output: for each fixture in
``crates/burn-mlx-llm/tests/data/{qwen3,llama}`` (or ``--model``) it writes the fixture's
``lora/initial.safetensors`` in both layouts into a temporary folder, plus a fused folder
(PEFT ``merge_and_unload``), and checks (a), (b) and (c) against each other and against
``lora/reference.json``'s ``logits_with_adapters``. It also checks mlx-lm's gradients of the
reference loss against ``lora/grads.safetensors`` (a second framework for the fixtures).

mlx-lm 0.32.0's llama ``ModelArgs`` ignores transformers 5's ``rope_parameters`` (it would
silently drop llama3 RoPE scaling); the script passes ``rope_theta`` / ``rope_scaling`` taken
from ``rope_parameters`` to ``load_model`` when config.json has no ``rope_theta``.

Run (CPU; ``pip install torch transformers==5.17.0 peft safetensors numpy "mlx[cpu]==0.32.4"
mlx-lm==0.32.0``):
    CUDA_VISIBLE_DEVICES= python scripts/lora_interop.py --self-test
    CUDA_VISIBLE_DEVICES= python scripts/lora_interop.py --model M --adapters A \\
        [--fused F] --expected logits.json [--tol 1e-4]
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402

DATA = pathlib.Path(__file__).resolve().parent.parent / "crates/burn-mlx-llm/tests/data"
PEFT_PREFIX = "base_model.model."


# ---------------------------------------------------------------------------------------------
# transformers + PEFT


def torch_base(model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def torch_logits(model, tokens):
    import torch

    with torch.no_grad():
        ids = torch.tensor([tokens], dtype=torch.long)
        return model(input_ids=ids).logits[0].float().numpy()


def peft_logits(model_dir, peft_dir, tokens):
    """(a): transformers + PeftModel.from_pretrained; checks every tensor was taken."""
    from peft import PeftModel
    from safetensors.numpy import load_file

    model = PeftModel.from_pretrained(torch_base(model_dir), peft_dir).eval()
    weights = load_file(str(pathlib.Path(peft_dir) / "adapter_model.safetensors"))
    params = {
        n.replace(".default.", "."): p.detach().numpy()
        for n, p in model.named_parameters()
        if ".lora_" in n
    }
    unused = sorted(set(weights) - set(params))
    missing = sorted(set(params) - set(weights))
    if unused or missing:
        raise SystemExit(f"PEFT: adapter tensors not used {unused}, missing {missing}")
    for name, w in weights.items():
        if not np.array_equal(params[name], w):
            raise SystemExit(f"PEFT: {name} was not loaded as written")
    return torch_logits(model, tokens)


# ---------------------------------------------------------------------------------------------
# mlx-lm


def mlx_model(model_dir):
    from mlx_lm.utils import load_config, load_model

    model_dir = pathlib.Path(model_dir)
    config = load_config(model_dir)
    extra = {}
    rope = config.get("rope_parameters")
    if rope and "rope_theta" not in config:
        # mlx-lm 0.32.0's llama ModelArgs has no rope_parameters field (qwen3's has).
        extra["rope_theta"] = rope["rope_theta"]
        if rope.get("rope_type", "default") != "default" and "rope_scaling" not in config:
            extra["rope_scaling"] = dict(rope)
    model, _ = load_model(model_dir, model_config=extra or None)
    return model


def mlx_logits(model, tokens):
    import mlx.core as mx

    out = model(mx.array([tokens], dtype=mx.int32))[0].astype(mx.float32)
    mx.eval(out)
    return np.array(out)


def mlx_with_adapters(model_dir, adapter_dir):
    """(b): mlx_lm load_model + load_adapters; checks every adapter parameter was written."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.utils import load_adapters

    model = mlx_model(model_dir)
    model = load_adapters(model, str(adapter_dir))
    model.eval()
    weights = mx.load(str(pathlib.Path(adapter_dir) / "adapters.safetensors"))
    params = {
        n: p
        for n, p in tree_flatten(model.parameters())
        if n.rsplit(".", 1)[-1] in ("lora_a", "lora_b")
    }
    missing = sorted(set(params) - set(weights))
    if missing:
        raise SystemExit(f"mlx-lm: adapter parameters missing from adapters.safetensors: {missing}")
    for name, w in weights.items():
        if not np.array_equal(np.array(params[name]), np.array(w)):
            raise SystemExit(f"mlx-lm: {name} was not loaded as written")
    return model


# ---------------------------------------------------------------------------------------------
# comparison


def compare(results, expected, tol):
    failed = []
    for label, logits in results:
        if logits.shape != expected.shape:
            print(f"  {label}: shape {logits.shape} != expected {expected.shape}")
            failed.append(label)
            continue
        diff = float(np.abs(logits - expected).max())
        ok = diff <= tol
        print(f"  {label}: max |diff| {diff:.3g} {'ok' if ok else f'> tol {tol}'}")
        if not ok:
            failed.append(label)
    return failed


def check(model_dir, adapter_dir, fused_dir, tokens, expected, tol):
    adapter_dir = pathlib.Path(adapter_dir)
    results = [
        ("(a) transformers+PEFT", peft_logits(model_dir, adapter_dir / "peft", tokens)),
        ("(b) mlx-lm+adapters", mlx_logits(mlx_with_adapters(model_dir, adapter_dir), tokens)),
    ]
    if fused_dir:
        results.append(("(c) transformers fused", torch_logits(torch_base(fused_dir), tokens)))
        results.append(("(c) mlx-lm fused", mlx_logits(mlx_model(fused_dir), tokens)))
    return compare(results, expected, tol)


# ---------------------------------------------------------------------------------------------
# self-test: both layouts written from a fixture's initial.safetensors


def peft_config(reference):
    from peft import LoraConfig

    return LoraConfig(
        r=reference["rank"],
        lora_alpha=reference["lora_alpha"],
        lora_dropout=0.0,
        target_modules=[k.split(".")[-1] for k in reference["keys"]],
        layers_to_transform=reference["layers"],
        bias="none",
        use_rslora=False,
        task_type="CAUSAL_LM",
    )


def write_layouts(fixture, out, reference, with_keys=True):
    """Writes mlx-lm and PEFT layouts of FIXTURE/lora/initial.safetensors into OUT."""
    from safetensors.numpy import load_file, save_file

    initial = load_file(str(fixture / "lora" / "initial.safetensors"))
    out.mkdir(parents=True, exist_ok=True)
    save_file(initial, str(out / "adapters.safetensors"))
    lora_parameters = {"rank": reference["rank"], "scale": reference["scale"], "dropout": 0.0}
    if with_keys:
        lora_parameters["keys"] = reference["keys"]
    mlx_config = {
        "fine_tune_type": "lora",
        "num_layers": reference["num_layers"],
        "lora_parameters": lora_parameters,
    }
    (out / "adapter_config.json").write_text(json.dumps(mlx_config, indent=2) + "\n")

    peft_dir = out / "peft"
    peft_config(reference).save_pretrained(str(peft_dir))
    peft_weights = {}
    for name, w in initial.items():
        prefix, leaf = name.rsplit(".", 1)
        peft_leaf = {"lora_a": "lora_A", "lora_b": "lora_B"}[leaf]
        peft_weights[f"{PEFT_PREFIX}{prefix}.{peft_leaf}.weight"] = np.ascontiguousarray(w.T)
    save_file(peft_weights, str(peft_dir / "adapter_model.safetensors"))
    return initial


def write_fused(fixture, adapter_dir, out):
    """HF folder with the adapters merged into the weights (PEFT merge_and_unload)."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(torch_base(fixture), str(adapter_dir / "peft"))
    merged = model.merge_and_unload()
    merged.save_pretrained(str(out), safe_serialization=True)


def reference_loss_grads(model, reference):
    """mlx: the reference loss (lora/reference.json) and its grads wrt the adapters."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    batch = reference["batch"]
    tokens = mx.array(batch["tokens"], dtype=mx.int32)
    lengths = mx.array(batch["lengths"])[:, None]
    offsets = mx.array(batch["offsets"])[:, None]

    def loss_fn(m):
        logits = m(tokens[:, :-1]).astype(mx.float32)
        targets = tokens[:, 1:]
        j = mx.arange(1, targets.shape[1] + 1)[None, :]
        mask = mx.logical_and(j >= mx.maximum(offsets, 1), j < lengths)
        ce = nn.losses.cross_entropy(logits, targets) * mask
        return ce.sum() / mask.sum()

    model.freeze()
    model.unfreeze(keys=["lora_a", "lora_b"], strict=False)
    loss, grads = nn.value_and_grad(model, loss_fn)(model)
    mx.eval(loss, grads)
    return float(loss.item()), {n: np.array(g) for n, g in tree_flatten(grads)}


def self_test(models, tol):
    from safetensors.numpy import load_file

    failed = []
    for fixture in models:
        fixture = pathlib.Path(fixture)
        reference = json.loads((fixture / "lora" / "reference.json").read_text())
        tokens = reference["batch"]["tokens"][0][: reference["batch"]["lengths"][0]]
        expected = np.array(reference["logits_with_adapters"], dtype=np.float32)
        with tempfile.TemporaryDirectory() as tmp:
            tmp = pathlib.Path(tmp)
            adapters = tmp / "adapters"
            write_layouts(fixture, adapters, reference)
            fused = tmp / "fused"
            write_fused(fixture, adapters, fused)
            mlx_config = json.loads((adapters / "adapter_config.json").read_text())
            peft_json = json.loads((adapters / "peft" / "adapter_config.json").read_text())
            print(f"{fixture.name}: mlx-lm adapter_config.json {json.dumps(mlx_config)}")
            peft_text = json.dumps(peft_json, sort_keys=True)
            print(f"{fixture.name}: PEFT adapter_config.json {peft_text}")
            print(f"{fixture.name}: against lora/reference.json logits_with_adapters")
            failed += [
                f"{fixture.name} {f}"
                for f in check(fixture, adapters, fused, tokens, expected, tol)
            ]

            a = peft_logits(fixture, adapters / "peft", tokens)
            model = mlx_with_adapters(fixture, adapters)
            b = mlx_logits(model, tokens)
            print(f"{fixture.name}: (a) against (b)")
            if compare([("(b) mlx-lm", b)], a, tol):
                failed.append(f"{fixture.name} (a)-(b)")

            # mlx-lm's default keys (every Linear of the layer) give the same adapters.
            nokeys = tmp / "nokeys"
            write_layouts(fixture, nokeys, reference, with_keys=False)
            c = mlx_logits(mlx_with_adapters(fixture, nokeys), tokens)
            print(f"{fixture.name}: mlx-lm without lora_parameters.keys")
            if compare([("(b) no keys", c)], expected, tol):
                failed.append(f"{fixture.name} no keys")

            # A second framework for the fixtures: mlx loss and grads.
            loss, grads = reference_loss_grads(model, reference)
            ref_grads = load_file(str(fixture / "lora" / "grads.safetensors"))
            if set(grads) != set(ref_grads):
                failed.append(f"{fixture.name} grad names {sorted(set(grads) ^ set(ref_grads))}")
            gdiff = max(
                float(np.abs(grads[n] - ref_grads[n]).max() / (np.abs(ref_grads[n]).max()))
                for n in ref_grads if n in grads
            )
            ldiff = abs(loss - reference["loss"])
            ok = ldiff <= tol and gdiff <= 1e-3
            print(
                f"{fixture.name}: mlx loss {loss:.9g} vs {reference['loss']:.9g} "
                f"(|diff| {ldiff:.3g}); grads max |diff|/max|g| {gdiff:.3g} "
                f"{'ok' if ok else 'FAIL'}"
            )
            if not ok:
                failed.append(f"{fixture.name} loss/grads")
    return failed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="HF model folder (config.json + model.safetensors, f32)")
    parser.add_argument("--adapters", help="adapter folder: mlx-lm layout, PEFT layout in peft/")
    parser.add_argument("--fused", help="HF folder with the adapters fused into the weights")
    parser.add_argument("--expected", help='JSON {"tokens": [...], "logits": [[...]]}')
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument(
        "--self-test", action="store_true",
        help="write both layouts from the fixtures' lora/initial.safetensors and check them",
    )
    args = parser.parse_args()

    if args.self_test:
        models = [args.model] if args.model else [DATA / "qwen3", DATA / "llama"]
        failed = self_test(models, args.tol)
    else:
        if not (args.model and args.adapters and args.expected):
            parser.error("--model, --adapters and --expected are needed (or --self-test)")
        expected = json.loads(pathlib.Path(args.expected).read_text())
        failed = check(
            args.model, args.adapters, args.fused, expected["tokens"],
            np.array(expected["logits"], dtype=np.float32), args.tol,
        )
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        sys.exit(1)
    print("all logits agree")


if __name__ == "__main__":
    main()
