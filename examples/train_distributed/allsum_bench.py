"""MLX Python's peer of `train_distributed --bench`: all_sum bandwidth between ranks, for f32
tensors of 1 MiB to 256 MiB, timed the same way (median of 3-20 calls, each after a barrier,
from the call to the end of the evaluation).

Started as ranks by burn-mlx's launcher, against the same MLX wheel burn-mlx builds with:

    python3 -m venv /tmp/mlxpy && /tmp/mlxpy/bin/pip install "mlx[cpu]==0.32.2"
    cargo run --release --example mlx_launch -- -n 2 --env OPENBLAS_NUM_THREADS=1 \
        /tmp/mlxpy/bin/python examples/train_distributed/allsum_bench.py
"""

import sys
import time

import mlx.core as mx


def main():
    group = mx.distributed.init(strict=True, backend="ring")
    rank, size = group.rank(), group.size()
    low, high = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (1, 256)

    def barrier():
        mx.eval(mx.distributed.all_sum(mx.array([1], dtype=mx.int32), group=group, stream=mx.cpu))

    if rank == 0:
        print(f"MLX {mx.__version__} Python: all_sum of f32 tensors between {size} ranks")
        print(
            f"{'MiB':>8} {'iters':>6} {'ms (median)':>11} {'ms (min)':>8} {'algbw GB/s':>11} "
            f"{'busbw GB/s':>11} {'best algbw':>13}"
        )
    mb = low
    while mb <= high:
        n = mb * (1 << 20) // 4
        x = mx.ones((n,), dtype=mx.float32)
        mx.eval(mx.distributed.all_sum(x, group=group, stream=mx.cpu))
        iters = min(20, max(3, 256 // mb))
        times = []
        for _ in range(iters):
            barrier()
            t = time.perf_counter()
            y = mx.distributed.all_sum(x, group=group, stream=mx.cpu)
            mx.eval(y)
            times.append(time.perf_counter() - t)
            del y
        times.sort()
        median = times[len(times) // 2]
        algbw = n * 4 / median / 1e9
        busbw = algbw * 2 * (size - 1) / size
        if rank == 0:
            print(
                f"{mb:>8} {iters:>6} {median * 1e3:>11.2f} {times[0] * 1e3:>8.2f} {algbw:>11.3f} "
                f"{busbw:>11.3f} {n * 4 / times[0] / 1e9:>13.3f}"
            )
        mb *= 2
    barrier()


if __name__ == "__main__":
    main()
