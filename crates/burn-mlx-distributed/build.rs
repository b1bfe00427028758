//! Link settings for this crate's binaries and tests with the CUDA variant of MLX (the `cuda`
//! feature): see `burn_mlx_cache::link`. Nothing is printed for the CPU variant.
fn main() {
    for line in burn_mlx_cache::link::cuda_link_lines(&|name| std::env::var(name).ok()) {
        println!("{line}");
    }
}
