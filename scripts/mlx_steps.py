#!/usr/bin/env python3
"""The four training steps of `gpu_bench` written directly in MLX's Python API: MLX's own ceiling.

burn-mlx reaches MLX through Burn's op-by-op API; this script asks what MLX itself achieves on
the same workloads when written the way MLX's documentation recommends, without Burn in between:

- `eager`: `nn.value_and_grad` and `optimizers.Adam.update`, then `mx.eval` of the loss, the
  parameters and the optimizer state;
- `compiled`: the same step (forward, backward and Adam update) as one function under
  `mx.compile`, with the model and optimizer state as its implicit inputs and outputs: the whole
  step traced once and replayed, the most fusion MLX offers, and what burn-mlx's automatic
  fusion can at best approach (it compiles the graphs that Burn builds, without changing user
  code).

The shapes are those of `crates/burn-mlx-models` (used by `gpu_bench`) and `scripts/gpu_reference.py`'s PyTorch
models (MLP 784-512-512-10 at batch 128; CNN of two 3x3 convolutions at batch 64; a 2-layer
post-norm Transformer encoder, d_model 256, 8 heads, FF 1024, GELU, batch 16 x 128 with an MSE
loss; the 29.5M-parameter pre-norm causal decoder LM, seq 256, batch 8, vocab 10,240). MLX's
`nn.TransformerEncoder` ends with a LayerNorm of its own, one more than the Transformer step's
models have elsewhere (the decoder LM has one there anyway); the CNN is channels-last, MLX's
layout. Timing as
in `gpu_bench` and `gpu_reference.py`: 12 warm-up steps, then the median of at least 5 steps
(at most 50, about 2 s), each step ending when its loss is read back.

Usage (MLX 0.32.4's Python package with the `mlx-cuda-13` libraries on the GPU machine):

    python3 scripts/mlx_steps.py [--json FILE] [--only mlp,cnn,transformer,decoder]

It prints one line per step and mode, and with `--json` writes {step: {mode: seconds}}.
MLX runs f32 matmuls in TF32 on CUDA unless `MLX_ENABLE_TF32=0`, as it does for burn-mlx.
"""

import argparse
import json
import sys

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim

# The PyTorch peers' timing and decoder-LM shape, shared.
from gpu_reference import LM_BATCH, LM_D, LM_FF, LM_HEADS, LM_LAYERS, LM_SEQ, LM_VOCAB, median_secs

WARMUP = 12


class Cnn(nn.Module):
    """Two 3x3 convolutions with ReLU and 2x2 max pooling, then two linear layers (NHWC)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(32 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, 10)

    def __call__(self, x):
        x = self.pool(nn.relu(self.conv1(x)))
        x = self.pool(nn.relu(self.conv2(x)))
        x = x.reshape(x.shape[0], -1)
        return self.fc2(nn.relu(self.fc1(x)))


class Encoder(nn.Module):
    """The Transformer step's model: a 2-layer post-norm encoder, no mask."""

    def __init__(self):
        super().__init__()
        self.layers = nn.TransformerEncoder(
            2, 256, 8, mlp_dims=1024, dropout=0.0, activation=nn.gelu, norm_first=False
        )

    def __call__(self, x):
        return self.layers(x, None)


class DecoderLm(nn.Module):
    """Token and learned position embeddings, pre-norm causal layers, final LayerNorm, untied
    output layer."""

    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(LM_VOCAB, LM_D)
        self.positions = nn.Embedding(LM_SEQ, LM_D)
        self.layers = nn.TransformerEncoder(
            LM_LAYERS, LM_D, LM_HEADS, mlp_dims=LM_FF, dropout=0.0, activation=nn.gelu,
            norm_first=True,
        )
        self.head = nn.Linear(LM_D, LM_VOCAB)

    def __call__(self, ids):
        x = self.tokens(ids) + self.positions(mx.arange(LM_SEQ))
        # nn.TransformerEncoder applies its own final LayerNorm after the layers.
        mask = nn.MultiHeadAttention.create_additive_causal_mask(LM_SEQ)
        return self.head(self.layers(x, mask))


def workloads():
    """name -> (model, input, loss of (model, input))."""
    labels = lambda n: mx.array([(i * 7) % 10 for i in range(n)])
    y128, y64 = labels(128), labels(64)
    mlp = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    target = mx.random.uniform(shape=(16, 128, 256))
    n = LM_BATCH * LM_SEQ
    ids = mx.array([i * 7919 % LM_VOCAB for i in range(n)]).reshape(LM_BATCH, LM_SEQ)
    next_ids = mx.array([(i * 31 + 7) % LM_VOCAB for i in range(n)])
    ce = lambda logits, y: nn.losses.cross_entropy(logits, y, reduction="mean")
    return {
        "mlp": ("MLP step (batch 128)", mlp, mx.random.uniform(shape=(128, 784)), lambda m, x: ce(m(x), y128)),
        "cnn": ("CNN step (batch 64)", Cnn(), mx.random.uniform(shape=(64, 28, 28, 1)), lambda m, x: ce(m(x), y64)),
        "transformer": (
            "Transformer step (batch 16)", Encoder(), mx.random.uniform(shape=(16, 128, 256)),
            lambda m, x: nn.losses.mse_loss(m(x), target, reduction="mean"),
        ),
        "decoder": (
            "Decoder LM step (batch 8)", DecoderLm(), ids,
            lambda m, x: ce(m(x).reshape(n, LM_VOCAB), next_ids),
        ),
    }


def make_step(model, x, loss_fn, compiled):
    """One Adam step (forward, backward, update, loss read back) as a function of no arguments."""
    optimizer = optim.Adam(learning_rate=1e-3)
    optimizer.init(model.trainable_parameters())
    grad_fn = nn.value_and_grad(model, loss_fn)
    state = [model.state, optimizer.state]

    def update(inp):
        loss, grads = grad_fn(model, inp)
        optimizer.update(model, grads)
        return loss

    if compiled:
        update = mx.compile(update, inputs=state, outputs=state)

    def step():
        loss = update(x)
        mx.eval(loss, state)
        loss.item()

    mx.eval(state)
    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write {step: {mode: seconds}} to this file")
    parser.add_argument("--only", default="mlp,cnn,transformer,decoder", help="comma-separated steps")
    args = parser.parse_args()
    chosen = args.only.split(",")
    all_steps = workloads()
    unknown = [c for c in chosen if c not in all_steps]
    if unknown:
        parser.error(f"unknown step(s) {unknown}; choose from {list(all_steps)}")
    out = {}
    for key in chosen:
        name, model, x, loss_fn = all_steps[key]
        out[name] = {}
        for mode in ("eager", "compiled"):
            secs = median_secs(make_step(model, x, loss_fn, mode == "compiled"), warmup=WARMUP)
            out[name][mode] = secs
            print(f"{name:<28} MLX Python {mode:<9} {secs * 1e3:8.3f} ms", flush=True)
    print(f"MLX {mx.__version__} on {mx.default_device()}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
