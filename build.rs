//! Link settings for burn-mlx's own tests, examples and benches with the CUDA variant of MLX.
//!
//! On the CPU nothing is needed: mlx-sys links `libmlxc.so` by its absolute path, so every binary
//! that depends on burn-mlx finds MLX without an rpath or `LD_LIBRARY_PATH` (see mlx-sys's build
//! script). With the CUDA variant (`DEP_MLX_CUDA=1`), libmlx's own CUDA dependencies are left for
//! the loader (the build machine need not have a GPU driver), and the folders listed in
//! `BURN_MLX_CUDA_LIBS` at build time go on the rpath. A crate of yours that uses the `cuda`
//! feature needs the same two lines in its build script (docs/cuda.md).
fn main() {
    for var in ["DEP_MLX_CUDA", "DEP_MLX_CUDA_LIBS"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if std::env::var("DEP_MLX_CUDA").is_ok_and(|v| v == "1") {
        println!("cargo:rustc-link-arg=-Wl,--allow-shlib-undefined");
        let dirs = std::env::var("DEP_MLX_CUDA_LIBS").unwrap_or_default();
        for dir in dirs.split(':').filter(|d| !d.is_empty()) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
    }
}
