"""MLX Python's peer of `train_distributed --bench`: all_sum bandwidth between ranks, for f32
tensors of 1 MiB to 256 MiB (and, with a third argument `small`, of 4 B to 256 KiB first), timed
the same way (median of the calls, each after a barrier, from the call to the end of the
evaluation; 100 calls below 1 MiB, 3-20 above).

Started as ranks by burn-mlx's launcher, against the same MLX wheel burn-mlx builds with:

    python3 -m venv /tmp/mlxpy && /tmp/mlxpy/bin/pip install "mlx[cpu]==0.32.4"
    cargo run --release -p burn-mlx-distributed --bin mlx_launch -- -n 2 --env OPENBLAS_NUM_THREADS=1 \
        /tmp/mlxpy/bin/python crates/burn-mlx-distributed/src/bin/train_distributed/allsum_bench.py [MIN_MB MAX_MB [small]]

`scripts/allsum_compare.sh` runs this and `train_distributed --bench` in turns and prints the
comparison.
"""

import sys
import time

import mlx.core as mx
from bandwidth_row import HEADER, bandwidth_row


def main():
    group = mx.distributed.init(strict=True, backend="ring")
    rank, size = group.rank(), group.size()
    low, high = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (1, 256)
    small = len(sys.argv) > 3 and sys.argv[3] == "small"

    def barrier():
        mx.eval(mx.distributed.all_sum(mx.array([1], dtype=mx.int32), group=group, stream=mx.cpu))

    if rank == 0:
        print(f"MLX {mx.__version__} Python: all_sum of f32 tensors between {size} ranks")
        print(HEADER)
    sizes = [4, 4 << 10, 64 << 10, 256 << 10] if small else []
    mb = max(low, 1)
    while mb <= high:
        sizes.append(mb << 20)
        mb *= 2
    for nbytes in sizes:
        n = nbytes // 4
        x = mx.ones((n,), dtype=mx.float32)
        mx.eval(mx.distributed.all_sum(x, group=group, stream=mx.cpu))
        iters = 100 if nbytes < 1 << 20 else min(20, max(3, (256 << 20) // nbytes))
        times = []
        for _ in range(iters):
            barrier()
            t = time.perf_counter()
            y = mx.distributed.all_sum(x, group=group, stream=mx.cpu)
            mx.eval(y)
            times.append(time.perf_counter() - t)
            del y
        if rank == 0:
            print(bandwidth_row(nbytes, times, size))
    barrier()


if __name__ == "__main__":
    main()
