#!/usr/bin/env bash
# Where Burn + Mlx spends its time on this CPU: runs workloads of the benchmark suite
# (crates/burn-mlx-bench/benches/backends/) under `perf` and writes benches/cpu_profile.md (share of CPU samples per
# library and per function), which `python3 scripts/benchmarks_md.py` puts into BENCHMARKS.md.
#
#   scripts/profile_cpu.sh                      # the default workloads below
#   scripts/profile_cpu.sh softmax_1024/mlx     # chosen criterion ids (workload/backend)
#
# Needs `perf` (Debian: apt-get install linux-perf) and permission to use it (root, or
# kernel.perf_event_paranoid <= 1).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v perf >/dev/null || { echo "profile_cpu.sh: perf is missing (apt-get install linux-perf)" >&2; exit 1; }
ids=("$@")
[ ${#ids[@]} -gt 0 ] || ids=(elementwise_chain_1m/mlx softmax_1024/mlx train_mlp_f32/mlx train_transformer/mlx)
secs=${PROFILE_SECS:-6}
cargo bench -p burn-mlx-bench --bench backends --no-run 2>/dev/null
bin=$(ls -t target/release/deps/backends-* | grep -v '\.d$' | head -1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=benches/cpu_profile.md
{
  echo "## Where the CPU time goes (perf profile of Burn + Mlx)"
  echo
  echo "Written by \`scripts/profile_cpu.sh\` on $(date -u '+%Y-%m-%d') ($(nproc) cores): each workload ran for"
  echo "${secs} s under \`perf record\`; shares are of all CPU samples of the process, both cores. \"idle spin\""
  echo "is OpenBLAS's worker threads waiting for the next GEMM (\`sched_yield\`), which only burns the"
  echo "otherwise idle core. \"Burn + burn-mlx (Rust)\" is everything in the benchmark binary itself:"
  echo "Burn's autodiff and optimizer, burn-mlx's op layer and mlx-rs."
  echo
} > "$out"
for id in "${ids[@]}"; do
  echo "== profiling $id" >&2
  perf record -F 499 -o "$tmp/perf.data" -- "$bin" --bench "${id}\$" --profile-time "$secs" >/dev/null 2>&1
  perf report -i "$tmp/perf.data" --stdio --no-children --sort dso,symbol 2>/dev/null > "$tmp/report.txt"
  python3 - "$id" "$tmp/report.txt" "$(basename "$bin")" >> "$out" <<'PY'
import re, sys
workload, path, binary = sys.argv[1], sys.argv[2], sys.argv[3]
rows = []
for line in open(path, encoding="utf-8", errors="replace"):
    m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)", line)
    if m:
        rows.append((float(m.group(1)), m.group(2), m.group(4).strip()))
def group(dso, sym):
    if dso.startswith("[kernel") or "sched_yield" in sym:
        return "idle spin and kernel" if ("sched" in sym or "yield" in sym) else "kernel (page faults, syscalls)"
    if "openblas" in dso:
        return "OpenBLAS (GEMM)"
    if dso.startswith("libmlx") or dso.startswith("libm.") or dso.startswith("libm-"):
        return "MLX CPU kernels (libmlx, libm)"
    if dso.startswith(binary[:12]):
        return "Burn + burn-mlx (Rust)"
    return "other (" + dso + ")"
groups = {}
for pct, dso, sym in rows:
    g = group(dso, sym)
    groups[g] = groups.get(g, 0.0) + pct
print(f"### `{workload}`\n")
print("| where | share |\n|---|---:|")
for g, p in sorted(groups.items(), key=lambda kv: -kv[1]):
    print(f"| {g} | {p:.1f} % |")
print("\n| top functions | library | share |\n|---|---|---:|")
for pct, dso, sym in sorted(rows, key=lambda r: -r[0])[:8]:
    sym = re.sub(r"\(.*", "", sym).strip()[:90].replace("|", "\\|")
    print(f"| `{sym}` | {dso} | {pct:.1f} % |")
print()
PY
done
echo "wrote $out" >&2
