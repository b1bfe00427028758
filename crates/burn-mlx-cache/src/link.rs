//! The link settings of a program built against MLX's CUDA wheel, for build scripts.
//!
//! With the CUDA variant (`mlx-sys`'s `cuda` feature), `libmlx.so` needs the CUDA 13 libraries
//! and the driver's `libcuda.so.1`, which a build machine without a GPU does not have: the link
//! must leave libmlx's own dependencies to the loader (`--allow-shlib-undefined`), and the
//! folders named by `BURN_MLX_CUDA_LIBS` at build time go on the run path. Cargo passes one
//! crate's link arguments to that crate's own targets only, so every crate with binaries, tests
//! or examples that link MLX's CUDA variant prints these lines from its build script. mlx-sys
//! publishes what they need as `DEP_MLX_CUDA` and `DEP_MLX_CUDA_LIBS`, which cargo gives to the
//! build scripts of the crates that depend on mlx-sys directly.

/// The `cargo:` lines a build script prints for its crate's binaries: none for the CPU variant;
/// for the CUDA variant `--allow-shlib-undefined` and one rpath entry per folder of
/// `DEP_MLX_CUDA_LIBS`. `var` reads the environment (`|name| std::env::var(name).ok()`).
pub fn cuda_link_lines(var: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let mut lines: Vec<String> = ["DEP_MLX_CUDA", "DEP_MLX_CUDA_LIBS"]
        .iter()
        .map(|name| format!("cargo:rerun-if-env-changed={name}"))
        .collect();
    if var("DEP_MLX_CUDA").is_some_and(|v| v == "1") {
        lines.push("cargo:rustc-link-arg=-Wl,--allow-shlib-undefined".to_string());
        let dirs = var("DEP_MLX_CUDA_LIBS").unwrap_or_default();
        for dir in dirs.split(':').filter(|d| !d.is_empty()) {
            lines.push(format!("cargo:rustc-link-arg=-Wl,-rpath,{dir}"));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::cuda_link_lines;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn cpu_variant_links_as_usual() {
        let lines = cuda_link_lines(&env(&[]));
        assert!(lines
            .iter()
            .all(|l| l.starts_with("cargo:rerun-if-env-changed=")));
    }

    #[test]
    fn cuda_variant_defers_libmlx_dependencies_and_sets_the_run_path() {
        let lines = cuda_link_lines(&env(&[
            ("DEP_MLX_CUDA", "1"),
            (
                "DEP_MLX_CUDA_LIBS",
                "/opt/nvidia/cu13/lib::/opt/nvidia/cudnn/lib",
            ),
        ]));
        let args: Vec<&str> = lines
            .iter()
            .filter_map(|l| l.strip_prefix("cargo:rustc-link-arg="))
            .collect();
        assert_eq!(
            args,
            [
                "-Wl,--allow-shlib-undefined",
                "-Wl,-rpath,/opt/nvidia/cu13/lib",
                "-Wl,-rpath,/opt/nvidia/cudnn/lib"
            ]
        );
    }
}
