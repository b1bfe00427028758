//! Link settings for burn-mlx's own tests, examples and benches with the CUDA variant of MLX.
//!
//! On the CPU nothing is needed: mlx-sys links `libmlxc.so` by its absolute path, so every binary
//! that depends on burn-mlx finds MLX without an rpath or `LD_LIBRARY_PATH` (see mlx-sys's build
//! script). With the CUDA variant, libmlx's own CUDA dependencies are left for the loader (the
//! build machine need not have a GPU driver), and the folders listed in `BURN_MLX_CUDA_LIBS` at
//! build time go on the rpath: `burn_mlx_cache::link` says how. A crate of yours that links the
//! `cuda` variant needs the same build script (docs/cuda.md).
fn main() {
    for line in burn_mlx_cache::link::cuda_link_lines(&|name| std::env::var(name).ok()) {
        println!("{line}");
    }
}
