"""PyTorch's peer of `train_distributed` on NVIDIA GPUs: data-parallel training of the same
Transformer encoder with DDP over NCCL, and all_reduce bandwidth between the GPUs, timed the way
`train_distributed` times its own (see that example's docs).

    python3 torch_ddp.py step --world 1 2 --batch 128 --steps 110 --warmup 10
    python3 torch_ddp.py allreduce --world 2 --min-mb 1 --max-mb 1024

`step`: for each world size, one process per GPU (`torch.multiprocessing`, NCCL); world 1 trains
the plain model (no DDP, no communication), as `train_distributed` without a launcher does;
world n > 1 wraps it in `DistributedDataParallel`. `--batch` is the per-GPU batch. The model is
`train_distributed --model transformer`'s: `nn.TransformerEncoder` with d_model 256, 8 heads,
2 layers, feed-forward 1024, GELU, post-norm, no dropout, on sequences of 128, regressing a
fixed random target (mean squared error), Adam. Steps after `--warmup` are timed between two
device synchronizations; the global throughput is all ranks' samples over the slowest rank's
time. f32 matmuls run as TF32, as MLX's do on CUDA (`--no-tf32` for full f32).

`allreduce`: for f32 tensors of `--min-mb` to `--max-mb` MiB (doubling), each call timed after
a barrier (a one-element all_reduce) from the call to the end of a device synchronization; the
median and the fastest of 20 calls up to 16 MiB, fewer above (at least 3), as
`train_distributed --bench` does.

NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0 unless the environment sets it.
`--gloo --cpu` runs either mode on the CPU with the gloo backend, as a check of the script.
"""

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from bandwidth_row import HEADER, bandwidth_row


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def device_of(args, rank):
    return torch.device("cpu") if args.cpu else torch.device("cuda", rank)


def sync(args):
    if not args.cpu:
        torch.cuda.synchronize()


def step_worker(rank, world, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dev = device_of(args, rank)
    if not args.cpu:
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
    if world > 1:
        dist.init_process_group(
            "gloo" if args.gloo else "nccl", rank=rank, world_size=world, device_id=None if args.cpu else dev
        )
    torch.manual_seed(1)  # the same start on every rank (DDP broadcasts rank 0's anyway)
    layer = nn.TransformerEncoderLayer(
        d_model=256, nhead=8, dim_feedforward=1024, dropout=0.0,
        activation="gelu", batch_first=True, norm_first=False,
    )
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).to(dev)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=None if args.cpu else [rank])
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.rand(args.batch, args.seq, 256, generator=gen).to(dev)
    target = torch.rand(args.batch, args.seq, 256, generator=gen).to(dev)
    start = None
    for step in range(args.steps):
        if step == args.warmup:
            sync(args)
            start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = ((model(x) - target) ** 2).mean()
        loss.backward()
        opt.step()
    sync(args)
    seconds = time.perf_counter() - start
    timed = args.steps - args.warmup
    if world > 1:
        t = torch.tensor([seconds], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        seconds = t.item()
    if rank == 0:
        rate = world * args.batch * timed / seconds
        print(
            f"torch {torch.__version__}: world {world}, per-GPU batch {args.batch}, "
            f"{'DDP' if world > 1 else 'no DDP'}, tf32 {args.tf32}: {rate:.1f} samples/s "
            f"({1e3 * seconds / timed:.3f} ms per step, {timed} timed steps), "
            f"final loss {loss.item():.6f}",
            flush=True,
        )
    if world > 1:
        dist.destroy_process_group()


def allreduce_worker(rank, world, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dev = device_of(args, rank)
    if not args.cpu:
        torch.cuda.set_device(dev)
    dist.init_process_group(
        "gloo" if args.gloo else "nccl", rank=rank, world_size=world, device_id=None if args.cpu else dev
    )
    one = torch.ones(1, device=dev)

    def barrier():
        dist.all_reduce(one)
        sync(args)

    if rank == 0:
        print(
            f"torch {torch.__version__} (NCCL {'.'.join(map(str, torch.cuda.nccl.version())) if not args.cpu else '-'}): "
            f"all_reduce of f32 tensors between {world} ranks; algbw = bytes / time, "
            "busbw = algbw * 2 (n - 1) / n, best algbw from the fastest call"
        )
        print(HEADER, flush=True)
    mb = max(args.min_mb, 1)
    while mb <= args.max_mb:
        nbytes = mb << 20
        x = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
        dist.all_reduce(x)  # warm-up
        sync(args)
        iters = min(20, max(3, (256 << 20) // nbytes))
        times = []
        for _ in range(iters):
            barrier()
            t = time.perf_counter()
            dist.all_reduce(x)
            sync(args)
            times.append(time.perf_counter() - t)
        if rank == 0:
            print(bandwidth_row(nbytes, times, world), flush=True)
        del x
        mb *= 2
    barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["step", "allreduce"])
    p.add_argument("--world", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch", type=int, default=128, help="per-GPU batch")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=110)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--no-tf32", dest="tf32", action="store_false")
    p.add_argument("--min-mb", type=int, default=1)
    p.add_argument("--max-mb", type=int, default=1024)
    p.add_argument("--cpu", action="store_true", help="tensors on the CPU (with --gloo)")
    p.add_argument("--gloo", action="store_true", help="gloo instead of NCCL")
    args = p.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    worker = step_worker if args.mode == "step" else allreduce_worker
    for world in args.world:
        mp.spawn(worker, args=(world, args, free_port()), nprocs=world, join=True)


if __name__ == "__main__":
    main()
