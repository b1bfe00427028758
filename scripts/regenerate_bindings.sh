#!/usr/bin/env bash
# Regenerates mlx-sys/bindings/<target>.rs, the committed Rust bindings of mlx-c 0.7.0, with
# bindgen, for the machine's own target (x86_64-unknown-linux-gnu here).
#
# The build uses the committed file so that it needs no libclang. Run this after changing the
# mlx-c version. libclang comes from the `libclang` wheel on PyPI (pinned below), downloaded into
# a temporary folder; clang's own headers (float.h, stddef.h) are not in that wheel, so GCC's are
# used.
set -euo pipefail
cd "$(dirname "$0")/.."
target=$(rustc -vV | sed -n 's/^host: //p')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: libclang==18.1.1 -d "$tmp/wheel"
python3 -m zipfile -e "$tmp"/wheel/*.whl "$tmp/libclang"
libclang_dir=$(dirname "$(find "$tmp/libclang" -name 'libclang*.so*' | head -1)")
gcc_include=$(dirname "$(gcc -print-file-name=include/stddef.h)")
LIBCLANG_PATH="$libclang_dir" \
  BINDGEN_EXTRA_CLANG_ARGS="-I$gcc_include" \
  BURN_MLX_BINDINGS_OUT="$PWD/mlx-sys/bindings/$target.rs" \
  CARGO_TARGET_DIR="$tmp/target" \
  cargo build -p mlx-sys --features bindgen
echo "wrote mlx-sys/bindings/$target.rs ($(wc -l < "mlx-sys/bindings/$target.rs") lines)"
git diff --stat -- "mlx-sys/bindings/$target.rs" || true
