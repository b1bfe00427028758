//! Raw bindings to mlx-c 0.7.0 (MLX 0.32.2), generated at build time.
//!
//! This crate stands in for the published `mlx-sys` 0.7.0 (patched in by the workspace) so that
//! the published `mlx-rs` 0.33.0 builds unchanged on Linux. Besides the generated bindings it
//! provides the few items that mlx-c only declares on ARM, and that mlx-rs expects everywhere.
#![allow(non_upper_case_globals)]
#![allow(non_camel_case_types)]
#![allow(non_snake_case)]
#![allow(clippy::all)]
#![allow(missing_docs)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

#[cfg(not(any(target_arch = "aarch64", target_os = "macos")))]
mod half_shims;
#[cfg(not(any(target_arch = "aarch64", target_os = "macos")))]
pub use half_shims::*;

#[cfg(target_os = "linux")]
unsafe extern "C" {
    /// burn-mlx's addition (`exit_guard.cpp`, compiled into libmlxc): installs a
    /// `std::terminate` handler that parks a non-main thread whose exception comes from the
    /// destructor of an MLX CUDA handle (MLX's CUDA worker threads at process exit) instead of
    /// aborting the process; every other terminate goes to the previous handler. Idempotent.
    /// Linux only (the CUDA builds; on macOS mlx-c is built by CMake without it).
    pub fn burn_mlx_install_terminate_guard();
}

unsafe extern "C" {
    /// burn-mlx's addition (`fusion.cpp`, compiled into libmlxc): evaluates `n` arrays (waiting
    /// when `wait`, otherwise as `mlx_async_eval`), through an MLX-compiled replay of their
    /// graph when its structure recurs. Returns 0, or 1 with the message written to `err`.
    pub fn burn_mlx_eval(
        arrays: *const mlx_array,
        n: usize,
        wait: bool,
        err: *mut ::std::os::raw::c_char,
        err_len: usize,
    ) -> ::std::os::raw::c_int;
    /// How many times a graph structure must be seen before it is compiled, for graphs on the
    /// GPU (`gpu`) or the CPU (0: never).
    pub fn burn_mlx_fusion_set_threshold(gpu: bool, n: ::std::os::raw::c_int);
    /// The current threshold for the GPU (`gpu`) or the CPU.
    pub fn burn_mlx_fusion_threshold(gpu: bool) -> ::std::os::raw::c_int;
    /// Writes 10 counters: evaluations, fused evaluations, structures compiled, failed
    /// compilations, primitives of the original graphs evaluated through compiled graphs, the
    /// primitives of the compiled graphs that replaced them, structures whose compiled graph
    /// was measured slower and dropped, nanoseconds of the pass's own host time, the
    /// nanoseconds of it spent inside compiled functions, and the evaluations recognized as a
    /// compiled structure without a full walk.
    pub fn burn_mlx_fusion_stats(out: *mut u64);
    /// Forgets every recorded structure and compiled function.
    pub fn burn_mlx_fusion_clear();
    /// burn-mlx's addition (`fast_unary.cpp`): `exp` (op 0), `tanh` (1), `erf` (2) or
    /// `sigmoid` (3) of `a` on stream `s`, through vectorized CPU kernels for float32 on a CPU
    /// stream and through MLX's own op otherwise. Returns 0, or 1 if MLX rejected the input.
    pub fn burn_mlx_fast_unary(
        res: *mut mlx_array,
        a: mlx_array,
        op: ::std::os::raw::c_int,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;
    /// burn-mlx's addition (`fast_unary.cpp`): MLX's message for the last failure of
    /// `burn_mlx_fast_unary`, `burn_mlx_softmax` or `burn_mlx_logsumexp` on the calling thread, or "" if none. The
    /// string belongs to the thread and lives until its next failing call: copy it at once.
    pub fn burn_mlx_fast_last_error() -> *const ::std::os::raw::c_char;
    /// burn-mlx's addition (`fast_unary.cpp`): softmax of `a` over `axis` on stream `s`,
    /// composed with the vectorized `exp` for float32 on a CPU stream, MLX's precise `softmax`
    /// otherwise. Returns 0, or 1 if MLX rejected the input.
    pub fn burn_mlx_softmax(
        res: *mut mlx_array,
        a: mlx_array,
        axis: ::std::os::raw::c_int,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;
    /// burn-mlx's addition (`fast_unary.cpp`): `log(sum(exp(a)))` over `axis` on stream `s`,
    /// the axis kept as size 1 when `keepdims`; composed with the vectorized `exp` for float32
    /// on a CPU stream, MLX's `logsumexp` otherwise. Returns 0, or 1 if MLX rejected the input.
    pub fn burn_mlx_logsumexp(
        res: *mut mlx_array,
        a: mlx_array,
        axis: ::std::os::raw::c_int,
        keepdims: bool,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;
}
