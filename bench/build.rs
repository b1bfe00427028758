//! Puts an rpath to libmlx on the bench binary (as burn-mlx's build script does for its own
//! tests), so that `cargo bench -p burn-mlx-bench` runs without `LD_LIBRARY_PATH`. The folder
//! comes from mlx-sys's `cargo:libdir`, which Cargo passes only to direct dependents.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MLX_LIBDIR");
    if let Ok(dir) = std::env::var("DEP_MLX_LIBDIR") {
        if !dir.is_empty() {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
    }
}
