#!/usr/bin/env bash
# Training step time of `train_distributed` (the MLP on sharded spiral data, global batch 512) on
# this machine's CPU, for 1 and 2 ranks and a stated split of the cores (OPENBLAS_NUM_THREADS
# per rank), with and without a group and with and without the agreement checks. The
# configurations run in turns (the order rotates every round) so that a shared machine's load
# falls on all of them; the table gives the median over the rounds.
#
#   scripts/distributed_steps.sh                   # 5 rounds of 200 steps
#   ROUNDS=9 STEPS=300 scripts/distributed_steps.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
steps=${STEPS:-200}
cargo build --release -p burn-mlx-distributed --bin train_distributed >&2
bin=target/release/train_distributed
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# label | BLAS threads per rank | arguments
configs=(
    "1 process, no group|2|--no-group"
    "1 rank (single-process group)|2|"
    "1 process, no group|1|--no-group"
    "1 rank (single-process group)|1|"
    "2 ranks (ring, loopback)|1|--ranks 2"
    "2 ranks (ring), checks off|1|--ranks 2 --no-check"
)
n=${#configs[@]}
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq 1 "$rounds"); do
    echo "round $round of $rounds (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    for k in $(seq 0 $((n - 1))); do
        i=$(((k + round - 1) % n))
        IFS='|' read -r label threads extra <<<"${configs[$i]}"
        # shellcheck disable=SC2086 # $extra is a list of arguments
        OPENBLAS_NUM_THREADS=$threads "$bin" --steps "$steps" $extra >"$tmp/out" 2>&1 ||
            { cat "$tmp/out" >&2; exit 1; }
        # "global: N rank(s), S samples/s (M ms per global step of B)" and, per rank,
        # "rank r: T steps in X s, M ms/step, S samples/s on its shard".
        awk -v c="$i" '
            / global: / || /^global: / { for (f = 1; f <= NF; f++) if ($f == "samples/s") g = $(f - 1)
                                          for (f = 1; f <= NF; f++) if ($f == "ms" && $(f + 1) == "per") m = substr($(f - 1), 2) }
            /samples\/s on its shard/ { for (f = 1; f <= NF; f++) if ($f == "samples/s") r = r " " $(f - 1) }
            END { print c, m, g, r }' "$tmp/out" >>"$tmp/rows"
    done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

echo "train_distributed --steps $steps (global batch 512, hidden 256; 5 warm-up steps not timed),"
echo "$rounds rounds, configurations in turns; $(nproc) cores; load average (1, 5, 15 min) $load_before"
echo "before, $load_after after. Medians over the rounds; per rank: samples/s of its own shard."
echo
echo "| configuration | BLAS threads per rank | ms per global step | global samples/s | per-rank samples/s |"
echo "|---|---:|---:|---:|---:|"
for i in $(seq 0 $((n - 1))); do
    IFS='|' read -r label threads extra <<<"${configs[$i]}"
    awk -v c="$i" -v label="$label" -v threads="$threads" '
    function median(list,   a, n, i, j, t) {
        n = split(list, a, " ")
        for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
        return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    $1 == c { ms = ms " " $2; g = g " " $3; for (f = 4; f <= NF; f++) r = r " " $f }
    END { printf "| %s | %d | %.2f | %.0f | %.0f |\n", label, threads, median(ms), median(g), median(r) }' "$tmp/rows"
done
