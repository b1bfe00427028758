//! Puts an rpath to libmlx on burn-mlx's own tests, examples and benches, so that they run
//! without `LD_LIBRARY_PATH`. Crates that depend on burn-mlx read the same folder from
//! `DEP_MLX_LIBDIR` in their build script, or set `LD_LIBRARY_PATH` (see the README).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIBDIR");
    if let Ok(dir) = std::env::var("DEP_MLX_LIBDIR") {
        if !dir.is_empty() {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
    }
}
