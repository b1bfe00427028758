//! Puts an rpath to libmlx on burn-mlx's own tests, examples and benches, so that they run
//! without `LD_LIBRARY_PATH`. Crates that depend on burn-mlx read the same folder from
//! `DEP_MLX_LIBDIR` in their build script, or set `LD_LIBRARY_PATH` (see the README).
//!
//! With the CUDA variant of MLX (`DEP_MLX_CUDA=1`), libmlx's own CUDA dependencies are left for
//! the loader (the build machine need not have a GPU driver), and the folders listed in
//! `BURN_MLX_CUDA_LIBS` at build time go on the rpath too.
fn main() {
    for var in ["DEP_MLX_LIBDIR", "DEP_MLX_CUDA", "DEP_MLX_CUDA_LIBS"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if let Ok(dir) = std::env::var("DEP_MLX_LIBDIR") {
        if !dir.is_empty() {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
    }
    if std::env::var("DEP_MLX_CUDA").is_ok_and(|v| v == "1") {
        println!("cargo:rustc-link-arg=-Wl,--allow-shlib-undefined");
        let dirs = std::env::var("DEP_MLX_CUDA_LIBS").unwrap_or_default();
        for dir in dirs.split(':').filter(|d| !d.is_empty()) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
    }
}
