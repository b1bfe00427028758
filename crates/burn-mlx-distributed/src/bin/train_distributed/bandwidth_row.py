"""One row of the all-reduce bandwidth table that `allsum_bench.py` (MLX Python) and
`torch_ddp.py allreduce` (PyTorch) print in the same columns as `train_distributed --bench`."""


HEADER = (
    f"{'bytes':>10} {'size':>8} {'iters':>6} {'ms (median)':>11} {'ms (min)':>8} "
    f"{'algbw GB/s':>11} {'busbw GB/s':>11} {'best algbw':>13}"
)


def size_text(nbytes):
    """`nbytes` as `N MiB`, `N KiB` or `N B`."""
    if nbytes >= 1 << 20 and nbytes % (1 << 20) == 0:
        return f"{nbytes >> 20} MiB"
    if nbytes >= 1 << 10 and nbytes % (1 << 10) == 0:
        return f"{nbytes >> 10} KiB"
    return f"{nbytes} B"


def bandwidth_row(nbytes, times, world):
    """The row for `len(times)` timed calls (seconds) of an all-reduce of `nbytes` over `world`
    ranks: size, calls, median and fastest ms, algorithm and bus bandwidth at the median, and
    algorithm bandwidth at the fastest (GB/s)."""
    times = sorted(times)
    median = times[len(times) // 2]
    algbw = nbytes / median / 1e9
    busbw = algbw * 2 * (world - 1) / world
    return (
        f"{nbytes:>10} {size_text(nbytes):>8} {len(times):>6} {median * 1e3:>11.3f} "
        f"{times[0] * 1e3:>8.3f} {algbw:>11.3f} {busbw:>11.3f} "
        f"{nbytes / times[0] / 1e9:>13.3f}"
    )
