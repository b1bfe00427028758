#!/usr/bin/env bash
# all_sum bandwidth between local ranks over MLX's ring backend (loopback): burn-mlx
# (`train_distributed --bench`) against MLX Python's `mx.distributed.all_sum`
# (`crates/burn-mlx-distributed/src/bin/train_distributed/allsum_bench.py`, started by the same launcher), same MLX wheel,
# same run. The two runners alternate (Burn first in odd rounds, Python first in even ones) so
# that a shared machine's load falls on both; the table gives, per size, the median over the
# rounds of each run's median call time, the ratio Burn / Python of the bandwidths, and the
# median of the rounds' own ratios (each round's two runs saw about the same load).
#
#   scripts/allsum_compare.sh                       # 5 rounds, 1 to 256 MiB, 2 ranks
#   ROUNDS=9 MIN_MB=1 MAX_MB=64 SMALL=1 scripts/allsum_compare.sh  # also 4 B to 256 KiB
#
# MLX Python: the `mlx[cpu]` wheel of the version burn-mlx builds with (MLX 0.32.4), in a venv:
#   python3 -m venv /tmp/mlxpy && /tmp/mlxpy/bin/pip install "mlx[cpu]==0.32.4"
# MLXPY names that venv's python (default /tmp/mlxpy/bin/python). Every rank gets
# OPENBLAS_NUM_THREADS=1 (2 ranks on a 2-core machine); RANKS, ROUNDS, MIN_MB, MAX_MB, SMALL
# (1: also the small sizes, the latency of one call) as above; ROWS=file keeps every run's rows
# (runner, bytes, median ms, fastest ms, round).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${MLXPY:-/tmp/mlxpy/bin/python}
rounds=${ROUNDS:-5}
min_mb=${MIN_MB:-1}
max_mb=${MAX_MB:-256}
ranks=${RANKS:-2}
small_burn=()
small_py=()
if [ "${SMALL:-0}" = 1 ]; then
    small_burn=(--bench-small)
    small_py=(small)
fi
"$py" -c 'import mlx.core' 2>/dev/null || {
    echo "allsum_compare.sh: $py cannot import mlx.core; create the venv (see the top of this script)" >&2
    exit 1
}
cargo build --release -p burn-mlx-distributed --bin train_distributed --bin mlx_launch >&2
bin=target/release
export OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run_burn() {
    "$bin/train_distributed" --ranks "$ranks" --bench --bench-min-mb "$min_mb" \
        --bench-max-mb "$max_mb" "${small_burn[@]}" >"$tmp/out" 2>&1 || { cat "$tmp/out" >&2; exit 1; }
    # Rank 0's table rows: bytes, size (2 words), iters, median ms, min ms, ...
    awk '$1 == "[rank" && $2 == "0]" && $3 ~ /^[0-9]+$/ { print "burn", $3, $7, $8, r }' r="$round" "$tmp/out"
}
run_python() {
    "$bin/mlx_launch" -n "$ranks" "$py" crates/burn-mlx-distributed/src/bin/train_distributed/allsum_bench.py \
        "$min_mb" "$max_mb" "${small_py[@]}" >"$tmp/out" 2>&1 || { cat "$tmp/out" >&2; exit 1; }
    awk '$1 == "[rank" && $2 == "0]" && $3 ~ /^[0-9]+$/ { print "python", $3, $7, $8, r }' r="$round" "$tmp/out"
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
version=$("$py" -c 'import mlx.core as mx; print(mx.__version__)')
for round in $(seq 1 "$rounds"); do
    echo "round $round of $rounds (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    if [ $((round % 2)) -eq 1 ]; then
        run_burn >>"$tmp/rows"
        run_python >>"$tmp/rows"
    else
        run_python >>"$tmp/rows"
        run_burn >>"$tmp/rows"
    fi
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
[ -z "${ROWS:-}" ] || cp "$tmp/rows" "$ROWS"

echo "all_sum of f32 tensors between $ranks ranks (ring, loopback, OPENBLAS_NUM_THREADS=1 per rank),"
echo "MLX $version; $rounds rounds, runners alternating; $(nproc) cores; load average (1, 5, 15 min)"
echo "$load_before before, $load_after after. Per size: the median over the rounds of each run's"
echo "median call (ms) and the bandwidth it gives (bytes / time); Burn / Python = Python's time /"
echo "Burn's; paired = the median over the rounds of that round's own ratio; fastest = the fastest"
echo "single call of all rounds (ms)."
echo
echo "| size | Burn ms | Python ms | Burn GB/s | Python GB/s | Burn / Python | paired | fastest Burn / Python |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
awk '
function median(list,   a, n, i, j, t) {
    n = split(list, a, " ")
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{
    med[$1, $2] = med[$1, $2] " " $3
    if (!(($1, $2) in best) || $4 < best[$1, $2]) best[$1, $2] = $4
    sizes[$2] = 1
    run[$1, $2, $5] = $3
    rounds[$5] = 1
}
END {
    n = 0
    for (s in sizes) order[++n] = s + 0
    for (i = 2; i <= n; i++) { t = order[i]; for (j = i - 1; j >= 1 && order[j] > t; j--) order[j + 1] = order[j]; order[j + 1] = t }
    for (i = 1; i <= n; i++) {
        s = order[i]
        if (!(("burn", s) in med) || !(("python", s) in med)) continue
        b = median(med["burn", s]); p = median(med["python", s])
        ratios = ""
        for (r in rounds)
            if ((("burn", s, r) in run) && (("python", s, r) in run) && run["burn", s, r] > 0)
                ratios = ratios " " run["python", s, r] / run["burn", s, r]
        if (s >= 1048576 && s % 1048576 == 0) label = (s / 1048576) " MiB"
        else if (s >= 1024 && s % 1024 == 0) label = (s / 1024) " KiB"
        else label = s " B"
        printf "| %s | %.3f | %.3f | %.3f | %.3f | %.2f | %.2f | %.3f / %.3f |\n", label, b, p, s / b / 1e6, s / p / 1e6, p / b, median(ratios), best["burn", s], best["python", s]
    }
}' "$tmp/rows"
