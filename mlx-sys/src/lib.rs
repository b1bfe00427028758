//! Raw bindings to mlx-c 0.7.0 (MLX 0.32.4 on Linux, with one call adapted; 0.32.2 on macOS),
//! generated at build time.
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
    /// `burn_mlx_fast_unary`, `burn_mlx_softmax`, `burn_mlx_logsumexp` or an entry of
    /// `cpu_layers.cpp` on the calling thread, or "" if none. The
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
    /// burn-mlx's addition (`cpu_layers.cpp`): RMS norm of `x` over its last axis with the
    /// weight `w` (`[n]`) and `eps`, through burn-mlx's CPU primitive for float dtypes on a CPU
    /// stream (unless `BURN_MLX_CPU_KERNELS=0`), MLX's `fast::rms_norm` otherwise. Returns 0, or
    /// 1 with MLX's message for `burn_mlx_fast_last_error`.
    pub fn burn_mlx_rms_norm(
        res: *mut mlx_array,
        x: mlx_array,
        w: mlx_array,
        eps: f32,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;
    /// burn-mlx's addition (`cpu_layers.cpp`): "rotate half" RoPE of `x` (`[..., seq, d]`) over
    /// its last axis, row `s` at position `offset + s` (`offset`: one integer), through
    /// burn-mlx's CPU primitive with the inverse frequencies `inv_freqs` (`[d/2]`) for float
    /// dtypes on a CPU stream (unless `BURN_MLX_CPU_KERNELS=0`), MLX's `fast::rope` with the
    /// periods `periods` otherwise. Returns 0, or 1 with the message kept.
    pub fn burn_mlx_rope(
        res: *mut mlx_array,
        x: mlx_array,
        inv_freqs: mlx_array,
        periods: mlx_array,
        offset: mlx_array,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;
    /// burn-mlx's addition (`cpu_layers.cpp`): the query, key and value heads of a fused QKV
    /// projection's output `qkv` (`[batch·seq, (hq + 2·hkv)·d]`) on a CPU stream, the query and
    /// key heads RMS-normalized with `qw`, `kw` (read only with `norm`) and rotated (inverse
    /// frequencies `freqs`, positions from `pos`), written to `res`: `q`, `k`, `v`, or `q` and
    /// `kv` (keys then values) with `joint`. Returns 0, or 1 with the message kept.
    pub fn burn_mlx_cpu_qkv_heads(
        res: *mut mlx_vector_array,
        qkv: mlx_array,
        qw: mlx_array,
        kw: mlx_array,
        freqs: mlx_array,
        pos: mlx_array,
        batch: ::std::os::raw::c_int,
        hq: ::std::os::raw::c_int,
        hkv: ::std::os::raw::c_int,
        d: ::std::os::raw::c_int,
        eps: f32,
        norm: bool,
        joint: bool,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;
    /// burn-mlx's addition (`cpu_layers.cpp`): attention of one query position (`q`: `[batch,
    /// hq, 1, d]`) over the first `len` positions of `keys` and `values` (`[batch, hkv, cap,
    /// d]`, or with `joint` one buffer `[batch, 2·hkv, cap, d]` given twice), the last `window`
    /// of them when `window > 0`, on a CPU stream; `[batch, hq·d]`. Returns 0, or 1 with the
    /// message kept.
    pub fn burn_mlx_cpu_decode_attention(
        res: *mut mlx_array,
        q: mlx_array,
        keys: mlx_array,
        values: mlx_array,
        len: mlx_array,
        batch: ::std::os::raw::c_int,
        hq: ::std::os::raw::c_int,
        hkv: ::std::os::raw::c_int,
        d: ::std::os::raw::c_int,
        scale: f32,
        window: ::std::os::raw::c_int,
        joint: bool,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;
    /// burn-mlx's addition (`cpu_layers.cpp`): `act(gate) · up` of `gu` (`[rows, 2·i]`, the
    /// gate's columns then up's) on a CPU stream, GELU's tanh form with `gelu`, SiLU otherwise;
    /// `[rows, i]`. Returns 0, or 1 with the message kept.
    pub fn burn_mlx_cpu_gated(
        res: *mut mlx_array,
        gu: mlx_array,
        gelu: bool,
        s: mlx_stream,
    ) -> ::std::os::raw::c_int;
}

/// The traced function of [`burn_mlx_export_function`]: called with `n` input handles, which it
/// owns, and a vector to append its outputs to; returns 0, or non-zero if it failed.
pub type burn_mlx_export_callback = unsafe extern "C" fn(
    payload: *mut ::std::os::raw::c_void,
    inputs: *const mlx_array,
    n: usize,
    outputs: mlx_vector_array,
) -> ::std::os::raw::c_int;

unsafe extern "C" {
    /// burn-mlx's addition (`export.cpp`, compiled into libmlxc): traces `fun` once for each of
    /// `n_signatures` input lists (back to back in `args`, `counts[i]` long each) and writes the
    /// traces, with the arrays they capture, and `metadata` to the MLX function file `file`.
    /// Returns 0, or 1 with the message written to `err`.
    pub fn burn_mlx_export_function(
        file: *const ::std::os::raw::c_char,
        fun: burn_mlx_export_callback,
        payload: *mut ::std::os::raw::c_void,
        args: *const mlx_array,
        counts: *const usize,
        n_signatures: usize,
        shapeless: bool,
        metadata: *const ::std::os::raw::c_char,
        err: *mut ::std::os::raw::c_char,
        err_len: usize,
    ) -> ::std::os::raw::c_int;
    /// Reads an MLX function file: an owned handle, or null with the message written to `err`.
    pub fn burn_mlx_import_function(
        file: *const ::std::os::raw::c_char,
        err: *mut ::std::os::raw::c_char,
        err_len: usize,
    ) -> *mut ::std::os::raw::c_void;
    /// Frees a handle from [`burn_mlx_import_function`].
    pub fn burn_mlx_imported_function_free(function: *mut ::std::os::raw::c_void);
    /// The metadata string of an imported function, valid while its handle lives.
    pub fn burn_mlx_imported_function_metadata(
        function: *mut ::std::os::raw::c_void,
    ) -> *const ::std::os::raw::c_char;
    /// Applies an imported function to `n` inputs, writing a new vector of its outputs to `out`.
    /// Returns 0, or 1 with the message written to `err` (no signature matches the inputs).
    pub fn burn_mlx_imported_function_call(
        function: *mut ::std::os::raw::c_void,
        args: *const mlx_array,
        n: usize,
        out: *mut mlx_vector_array,
        err: *mut ::std::os::raw::c_char,
        err_len: usize,
    ) -> ::std::os::raw::c_int;
}
