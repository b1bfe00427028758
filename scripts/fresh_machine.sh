#!/usr/bin/env bash
# Proves the README's fresh-machine claim: the two Quick start commands, run in a clean clone of
# HEAD with a new target folder and a new burn-mlx cache, succeed with nothing from the system's
# package manager beyond Rust, python3 with pip and a C++ compiler.
#
# libclang and OpenBLAS from Debian are hidden: in a private mount namespace (root and `unshare`
# needed; otherwise they are only checked to be absent), every libclang*, libopenblas*, libblas*
# and liblapack* file under /usr/lib and /usr/local/lib is covered by an empty file, and
# LIBCLANG_PATH points at nothing. Afterwards the binaries' BLAS is checked to come from the
# burn-mlx cache.
#
# Usage: scripts/fresh_machine.sh [WORKDIR]   (default: a new folder under /tmp; about 40 min
# on 2 cores, almost all of it the two builds)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d /tmp/burn-mlx-fresh.XXXXXX)}
mkdir -p "$work"
git clone --quiet "$repo" "$work/burn-mlx"
export BURN_MLX_CACHE="$work/cache" CARGO_TARGET_DIR="$work/target"
export LIBCLANG_PATH=/nonexistent-libclang
unset MLX_DIR BURN_MLX_MINILM_DIR LD_LIBRARY_PATH

hidden=$(find /usr/lib /usr/local/lib \( -name 'libclang*.so*' -o -name 'libopenblas*.so*' \
  -o -name 'libblas*.so*' -o -name 'liblapack*.so*' \) \( -type f -o -type l \) 2>/dev/null || true)
cat > "$work/commands.sh" <<'INNER'
set -euo pipefail
for f in $HIDDEN; do mount --bind /dev/null "$f"; done
cd "$WORK/burn-mlx"
echo "== hidden system libraries: ${HIDDEN:-none installed}"
start=$(date +%s)
echo "== 1. cargo run --release --example train"
cargo run --release --example train 2>&1 | tee "$WORK/train.log" | grep -vE '^\s+(Compiling|Downloaded|Downloading)'
mid=$(date +%s)
echo "== 2. cargo test"
cargo test 2>&1 | tee "$WORK/test.log" | grep -E '^(test result|error|warning: mlx-sys)|FAILED|panicked'
end=$(date +%s)
echo "== train: $((mid - start)) s (with its build), test: $((end - mid)) s (with its build)"
lib=$(find "$BURN_MLX_CACHE" -name 'libblas-*' ! -name '*.orig' | head -1)
echo "== MLX's BLAS: $lib -> $(readlink "$lib")"
bin=$(ls "$CARGO_TARGET_DIR"/release/examples/train)
ldd "$bin" | grep -E 'mlx|blas|lapack' || true
if ldd "$bin" | grep -E 'blas|lapack' | grep -q '/usr/'; then echo "BLAS from the system" >&2; exit 1; fi
INNER
if [ "$(id -u)" = 0 ] && unshare --mount --propagation private true 2>/dev/null; then
  HIDDEN="$hidden" WORK="$work" unshare --mount --propagation private bash "$work/commands.sh"
else
  [ -z "$hidden" ] || { echo "cannot hide $hidden without root and unshare" >&2; exit 1; }
  HIDDEN="" WORK="$work" bash "$work/commands.sh"
fi
grep -E 'validation accuracy' "$work/train.log" | tail -1
grep -E '^test result' "$work/test.log" | awk '{p+=$4; f+=$6} END {print "cargo test: " p " passed, " f " failed"}'
