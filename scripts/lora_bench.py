#!/usr/bin/env python3
"""LoRA training throughput of the peers (mlx-lm, PyTorch + PEFT) on burn-mlx-llm's shapes.

Model: the ``qwen3-0.6b`` or ``small`` preset of ``LlmConfig::preset``
(crates/burn-mlx-llm/src/config.rs) with random weights (normal std 0.02, norm weights 1, tied
embeddings). LoRA rank 8, scale 20 (PEFT ``lora_alpha = 20·r``), dropout 0, on q/k/v/o/gate/up/down
of the last ``--layers`` blocks (at most all of them); adapters stay float32 on both sides.
Batch: ``--batch-size`` rows of ``--seq-len`` random ids (numpy seed ``--seed``), no padding; the
loss is the mean cross-entropy over the ``batch·(seq_len-1)`` next-token targets. Adam, lr 1e-5.

What is timed (``--warmup`` untimed steps first, then ``--iters`` timed ones):

* ``--framework mlx-lm``: ``mlx_lm.models.qwen3.Model`` (optionally ``mlx.nn.quantize``'d with
  group size 64, 4 or 8 bits, embedding included, as ``mlx_lm.convert`` does), ``model.freeze()``,
  ``mlx_lm.tuner.utils.linear_to_lora_layers``, and ``mlx_lm.tuner.trainer.train`` itself with
  ``mlx.optimizers.Adam`` on an in-memory dataset of the rows. ``max_seq_length = seq_len`` so that
  ``iterate_batches`` builds an unpadded ``[batch, seq_len]`` array; mlx-lm's ``default_loss``
  then runs the model on ``batch[:, :-1]`` (seq_len-1 positions) against ``batch[:, 1:]``. The
  step is mlx-lm's ``mx.compile``'d step; ``steps_per_report=1`` so the training callback gets
  each step's ``train_time`` (its own timer: step + ``mx.eval`` of the state, excluding batch
  assembly and reporting), summed over the steps after warm-up. Peak = ``mx.get_peak_memory()``.
* ``--framework peft``: ``transformers.Qwen3ForCausalLM`` (sdpa attention) in the dtype, PEFT
  ``get_peft_model`` (default ``autocast_adapter_dtype=True``), ``torch.optim.Adam`` over the
  adapters; eager steps ``loss = model(input_ids=x, labels=x).loss`` (HF shifts internally: the
  model runs on seq_len positions, the mean is over the same targets), ``backward``, ``step``,
  ``zero_grad``; wall time of the timed steps between ``torch.cuda.synchronize()`` calls. Peak =
  ``torch.cuda.max_memory_allocated`` (GPU) or ``ru_maxrss`` (CPU). ``--quantize q4`` loads the
  random model through bitsandbytes NF4 (linears of the blocks only; embedding / head stay in the
  dtype); without bitsandbytes (or for q8) it prints an ``unavailable`` JSON line and exits 0.

Output: one JSON line on stdout; everything else goes to stderr. On the GPU machine, with the
mlx-cuda / mlx-lm / peft wheels installed into PREFIX via ``pip install --no-deps --target PREFIX``:
    PYTHONPATH=PREFIX /opt/torch/.venv/bin/python scripts/lora_bench.py --framework mlx-lm
    PYTHONPATH=PREFIX /opt/torch/.venv/bin/python scripts/lora_bench.py --framework peft
(defaults: qwen3-0.6b, bf16, batch 4 × 512, 3 warm-up + 10 timed steps, GPU). CPU smoke test:
    python scripts/lora_bench.py --framework mlx-lm --device cpu --preset small --seq-len 64 \
        --iters 2 --warmup 1
"""

import argparse
import contextlib
import glob
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np

# name: (hidden, layers, heads, kv_heads, head_dim, intermediate, vocab); rms eps 1e-6,
# rope theta 1e6, tied embeddings, max positions 40960, no biases (LlmConfig::preset).
PRESETS = {
    "qwen3-0.6b": (1024, 28, 16, 8, 128, 3072, 151_936),
    "small": (512, 8, 8, 4, 64, 1536, 32_000),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LR = 1e-5


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def emit(args, fields):
    base = {k: getattr(args, k) for k in ("framework", "preset", "dtype", "quantize", "device")}
    base.update(batch_size=args.batch_size, seq_len=args.seq_len)
    base.update(fields)
    print(json.dumps(base), flush=True)


def batch_ids(args, vocab):
    rng = np.random.default_rng(args.seed)
    return rng.integers(0, vocab, size=(args.batch_size, args.seq_len), dtype=np.int64)


def run_mlx_lm(args):
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    import mlx_lm
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.models import qwen3
    from mlx_lm.tuner.callbacks import TrainingCallback
    from mlx_lm.tuner.trainer import TrainingArgs, train
    from mlx_lm.tuner.utils import linear_to_lora_layers

    mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    mx.random.seed(args.seed)
    h, n_layers, heads, kv, hd, inter, vocab = PRESETS[args.preset]
    dtype = {"bf16": mx.bfloat16, "f32": mx.float32}[args.dtype]
    model = qwen3.Model(qwen3.ModelArgs(
        model_type="qwen3", hidden_size=h, num_hidden_layers=n_layers, intermediate_size=inter,
        num_attention_heads=heads, rms_norm_eps=1e-6, vocab_size=vocab, num_key_value_heads=kv,
        max_position_embeddings=40_960, head_dim=hd, tie_word_embeddings=True, rope_theta=1e6))
    params = [(k, mx.ones(v.shape, dtype) if k.endswith("norm.weight")
               else (0.02 * mx.random.normal(v.shape)).astype(dtype))
              for k, v in tree_flatten(model.parameters())]
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    if args.quantize != "none":
        nn.quantize(model, group_size=64, bits={"q4": 4, "q8": 8}[args.quantize])
        mx.eval(model.parameters())
    model.freeze()
    n_lora = min(args.layers, n_layers)
    linear_to_lora_layers(model, n_lora, {"rank": args.rank, "scale": 20.0, "dropout": 0.0})
    mx.eval(model.parameters())
    trainable = tree_flatten(model.trainable_parameters())
    n_train = sum(v.size for _, v in trainable)
    adapter_dtypes = sorted({str(v.dtype) for _, v in trainable})
    log(f"mlx-lm: {len(trainable)} adapter tensors ({n_train} params, {adapter_dtypes}) "
        f"on the last {n_lora} of {n_layers} blocks; device {mx.default_device()}")

    ids = batch_ids(args, vocab)
    dataset = [(row.tolist(), 0) for row in ids]  # (tokens, prompt offset) items

    class Capture(TrainingCallback):
        def __init__(self):
            self.reports = []

        def on_train_loss_report(self, info):
            self.reports.append(dict(info))

    cap = Capture()
    total = args.warmup + args.iters
    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArgs(
            batch_size=args.batch_size, iters=total, val_batches=0, steps_per_report=1,
            steps_per_eval=10**9, steps_per_save=10**9, max_seq_length=args.seq_len,
            adapter_file=f"{tmp}/adapters.safetensors", grad_checkpoint=False,
            grad_accumulation_steps=1)
        mx.reset_peak_memory()
        with contextlib.redirect_stdout(sys.stderr):  # mlx-lm's progress UI prints to stdout
            train(model=model, optimizer=optim.Adam(learning_rate=LR), train_dataset=dataset,
                  val_dataset=None, args=targs, training_callback=cap)
    reps = cap.reports
    assert [r["iteration"] for r in reps] == list(range(1, total + 1)), reps
    per_step = np.diff([0] + [r["trained_tokens"] for r in reps])
    targets = args.batch_size * (args.seq_len - 1)
    assert all(int(t) == targets for t in per_step), f"targets per step {per_step} != {targets}"
    timed = reps[args.warmup:]
    seconds = sum(1.0 / r["iterations_per_second"] for r in timed)
    log("mlx-lm step seconds:", [round(1.0 / r["iterations_per_second"], 4) for r in reps],
        "losses:", [round(r["train_loss"], 4) for r in reps])
    emit(args, {
        "targets_per_step": targets, "steps": len(timed), "seconds": seconds,
        "tokens_per_sec": targets * len(timed) / seconds,
        "peak_memory_bytes": int(mx.get_peak_memory()),
        "trainable_params": int(n_train), "adapter_dtype": adapter_dtypes,
        "final_loss": reps[-1]["train_loss"],
        "versions": {"mlx": mx.__version__, "mlx_lm": mlx_lm.__version__,
                     "python": platform.python_version(),
                     "device": str(mx.default_device())},
    })


def run_peft(args):
    if args.quantize == "q8":
        emit(args, {"unavailable": "q8 is not benchmarked for PEFT (only bitsandbytes NF4 q4)"})
        return
    if args.quantize == "q4":
        try:
            import bitsandbytes  # noqa: F401
        except Exception as e:  # noqa: BLE001
            emit(args, {"unavailable": f"bitsandbytes does not import: {e!r}"})
            return
    import peft
    import torch
    import transformers
    from transformers import Qwen3Config, Qwen3ForCausalLM

    gpu = args.device == "gpu"
    dev = torch.device("cuda" if gpu else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(args.seed)
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    h, n_layers, heads, kv, hd, inter, vocab = PRESETS[args.preset]
    cfg = Qwen3Config(
        vocab_size=vocab, hidden_size=h, intermediate_size=inter, num_hidden_layers=n_layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6}, tie_word_embeddings=True,
        max_position_embeddings=40_960, initializer_range=0.02, attention_bias=False,
        use_cache=False, attn_implementation="sdpa")
    with torch.device(dev if args.quantize == "none" else "cpu"):
        model = Qwen3ForCausalLM(cfg).to(dtype)  # HF init: normal(0, 0.02), norms 1
    extra = {}
    if args.quantize == "q4":
        import bitsandbytes
        bnb = transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype)
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            del model
            model = Qwen3ForCausalLM.from_pretrained(
                tmp, quantization_config=bnb, dtype=dtype, attn_implementation="sdpa",
                device_map={"": dev.index or 0} if gpu else {"": "cpu"})
        extra["bitsandbytes"] = bitsandbytes.__version__
    log("attention:", model.config._attn_implementation)
    n_lora = min(args.layers, n_layers)
    lcfg = peft.LoraConfig(
        r=args.rank, lora_alpha=20 * args.rank, lora_dropout=0.0, target_modules=TARGETS,
        layers_to_transform=list(range(n_layers - n_lora, n_layers)), bias="none",
        task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, lcfg)  # autocast_adapter_dtype=True (default)
    model.train()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    n_train = sum(p.numel() for _, p in trainable)
    adapter_dtypes = sorted({str(p.dtype).removeprefix("torch.") for _, p in trainable})
    assert len(trainable) == 2 * len(TARGETS) * n_lora, len(trainable)
    log(f"peft: {len(trainable)} adapter tensors ({n_train} params, {adapter_dtypes}) "
        f"on the last {n_lora} of {n_layers} blocks; device {dev}")
    opt = torch.optim.Adam([p for _, p in trainable], lr=LR)
    x = torch.from_numpy(batch_ids(args, vocab)).to(dev)
    targets = args.batch_size * (args.seq_len - 1)

    def sync():
        if gpu:
            torch.cuda.synchronize()

    def step():
        loss = model(input_ids=x, labels=x).loss  # mean over the b·(s-1) shifted targets
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    if gpu:
        torch.cuda.reset_peak_memory_stats(dev)  # drop the f32 construction copy from the peak
    losses = []
    for _ in range(args.warmup):
        losses.append(step().item())
    sync()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        losses.append(step().detach())
    sync()
    seconds = time.perf_counter() - t0
    losses = [float(v) for v in losses]
    log("peft losses:", [round(v, 4) for v in losses])
    if gpu:
        peak = torch.cuda.max_memory_allocated(dev)
        extra["gpu"] = torch.cuda.get_device_name(dev)
    else:
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    emit(args, {
        "targets_per_step": targets, "steps": args.iters, "seconds": seconds,
        "tokens_per_sec": targets * args.iters / seconds, "peak_memory_bytes": int(peak),
        "trainable_params": int(n_train), "adapter_dtype": adapter_dtypes,
        "final_loss": losses[-1],
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "peft": peft.__version__, "cuda": torch.version.cuda,
                     "python": platform.python_version(), **extra},
    })


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--framework", required=True, choices=["mlx-lm", "peft"])
    p.add_argument("--preset", default="qwen3-0.6b", choices=sorted(PRESETS))
    p.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    p.add_argument("--quantize", default="none", choices=["none", "q4", "q8"])
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument(
        "--burn-blas",
        action="store_true",
        help="mlx-lm on the CPU: multiply through burn-mlx's OpenBLAS forwarding library (the "
        "wheel's own BLAS is the reference BLAS), so both sides use the same BLAS",
    )
    args = p.parse_args()
    if args.iters < 1 or args.warmup < 0 or args.seq_len < 2:
        p.error("need --iters >= 1, --warmup >= 0, --seq-len >= 2")
    if args.burn_blas and "libburn_mlx_blas" not in os.environ.get("LD_PRELOAD", ""):
        cache = os.environ.get("BURN_MLX_CACHE", os.path.expanduser("~/.cache/burn-mlx"))
        found = sorted(glob.glob(f"{cache}/mlx-cpu-*/*.libs/libburn_mlx_blas.so"))
        if not found:
            p.error(f"no libburn_mlx_blas.so under {cache}: build burn-mlx first (cargo build)")
        env = dict(os.environ, LD_PRELOAD=found[-1])
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    (run_mlx_lm if args.framework == "mlx-lm" else run_peft)(args)


if __name__ == "__main__":
    main()
