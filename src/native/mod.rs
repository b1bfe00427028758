//! Every raw call into MLX's C layer: the mlx-c functions that mlx-rs 0.33 does not wrap and
//! burn-mlx's own native entries (`mlx-sys/*.cpp`), each behind a safe function with mlx-rs's
//! conventions.
//!
//! No file outside this module names `mlx_sys`; the rest of the crate uses the safe functions
//! here or mlx-rs itself. This file holds the process set-up (error handler, exit guard, shared
//! streams), device and memory queries and synchronization; the submodules hold the calls of one
//! feature each:
//!
//! - `array`: the array ops mlx-rs does not wrap (bitwise ops, strided slices, slice updates,
//!   scatter-add) and burn-mlx's vectorized CPU kernels, re-exported here as `native::slice`,
//!   `native::exp` and so on;
//! - [`cpu_layers`]: burn-mlx's CPU primitives for RMS norm, RoPE and a decode step's QKV heads,
//!   attention and gated activation;
//! - [`fusion`]: the evaluation entry that runs graphs through the automatic compile pass
//!   ([`crate::compile::auto`]), and that pass's settings and counters;
//! - [`custom_vjp`]: functions with a backward pass of burn-mlx's own inside MLX's transforms;
//! - [`dot`]: MLX's DOT export of a pending graph (for [`crate::pending_primitives`]);
//! - [`export`]: MLX function files, written and read (for [`crate::export`]);
//! - [`distributed`]: mlx-c's distributed groups and collectives (for [`crate::distributed`]).
//!
//! Every `unsafe` block says in a `// SAFETY:` comment why the call is sound: which handles are
//! live for the call, who owns what it returns, which buffers it may write.

mod array;
pub(crate) mod cpu_layers;
pub(crate) mod custom_vjp;
pub(crate) mod distributed;
pub(crate) mod dot;
pub(crate) mod export;
pub(crate) mod fusion;
pub(crate) mod kernel;

pub(crate) use array::{
    bitwise_and, bitwise_invert, bitwise_or, bitwise_xor, erf, exp, int_constant,
    is_row_contiguous, left_shift, logsumexp, right_shift, scatter_add_axis, sigmoid, slice,
    slice_update, slice_update_dynamic, softmax, tanh,
};

use crate::error::MlxError;
use mlx_rs::{DeviceType, Stream};
use mlx_sys::mlx_stream;
use std::sync::Once;

/// Makes sure mlx-rs has installed its MLX error handler, so that an MLX error is returned to
/// the caller instead of ending the process (mlx-c's default handler exits).
pub(crate) fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        configure_cuda_graphs();
        // SAFETY: installs a process-wide C++ terminate handler; no arguments, idempotent.
        #[cfg(target_os = "linux")]
        unsafe {
            mlx_sys::burn_mlx_install_terminate_guard();
        }
        // Any mlx-rs call that goes through its error guard installs the handler.
        let _ = mlx_rs::Device::try_default();
    });
}

/// Called after each GPU evaluation (through `MlxDevice::after_eval`): GPU evaluations number
/// 1, 2, 4, 8, … (re)install the exit guard.
///
/// Exit handlers run in reverse order of registration, and MLX creates CUDA objects lazily (the
/// first convolution, the first attention, …), so the guard is registered again at growing
/// intervals to stay behind the objects created since: a handful of registrations per process.
pub(crate) fn after_gpu_eval() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static GPU_EVALS: AtomicU64 = AtomicU64::new(0);
    if cfg!(not(target_os = "macos")) {
        let n = GPU_EVALS.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            install_exit_guard();
        }
    }
}

/// Ends the process at `exit` before MLX's CUDA state is torn down.
///
/// MLX 0.32.2's CUDA backend keeps streams and handles in static objects. At `exit`, the CUDA
/// runtime shuts down before some of them are destroyed; their destructors then fail with
/// "driver shutting down" and throw, and the C++ runtime aborts the process, so a program (or a
/// test binary) that succeeded exits with SIGABRT. Handlers registered with `on_exit` run in
/// reverse order, so one registered after the first GPU evaluation runs before that teardown:
/// it flushes C stdio and ends the process with its exit status, skipping the destructors that
/// would abort. Rust's own stdout is flushed before `exit` is called. Handlers that other code
/// registered earlier are skipped too; set `BURN_MLX_CLEAN_EXIT=1` to keep the normal exit.
fn install_exit_guard() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::raw::{c_int, c_void};
        extern "C" {
            fn on_exit(f: extern "C" fn(c_int, *mut c_void), arg: *mut c_void) -> c_int;
            fn fflush(stream: *mut c_void) -> c_int;
            fn _exit(status: c_int) -> !;
        }
        extern "C" fn quick_exit(status: c_int, _arg: *mut c_void) {
            // SAFETY: flushing all C streams and ending the process are valid at exit time.
            unsafe {
                fflush(std::ptr::null_mut());
                _exit(status)
            }
        }
        if std::env::var_os("BURN_MLX_CLEAN_EXIT").is_some_and(|v| v != "0") {
            return;
        }
        // SAFETY: `quick_exit` is a valid handler for the life of the process.
        unsafe {
            on_exit(quick_exit, std::ptr::null_mut());
        }
    }
}

/// Turns MLX's CUDA graphs off unless the user chose (`MLX_USE_CUDA_GRAPHS`), before MLX reads it.
///
/// MLX's CUDA backend records each evaluation into a CUDA graph by stream capture. A capture is
/// broken by memory management that another thread does meanwhile (creating a tensor from host
/// data, dropping one), which Burn's data loaders and multi-threaded training do all the time:
/// Burn's backend suite, run with 16 threads on MLX 0.32.2, failed with "cudaStreamEndCapture
/// ... failed" with graphs on and passed with them off. burn-mlx already serializes evaluation,
/// so without graphs each kernel is launched directly, at some launch overhead (BENCHMARKS.md
/// has the measured cost). Programs that use tensors from one thread only can set
/// `MLX_USE_CUDA_GRAPHS=1`.
fn configure_cuda_graphs() {
    if cfg!(not(target_os = "macos")) && std::env::var_os("MLX_USE_CUDA_GRAPHS").is_none() {
        // Edition 2021: `set_var` is safe; this runs once, before burn-mlx creates MLX state.
        std::env::set_var("MLX_USE_CUDA_GRAPHS", "0");
    }
}

/// Whether MLX can use a device of this type.
pub(crate) fn device_available(kind: DeviceType) -> bool {
    init();
    // SAFETY: the device handle is created, queried and freed here.
    unsafe {
        let dev = mlx_sys::mlx_device_new_type(kind as u32, 0);
        let mut avail = false;
        let rc = mlx_sys::mlx_device_is_available(&mut avail, dev);
        mlx_sys::mlx_device_free(dev);
        rc == 0 && avail
    }
}

/// Frees the buffers MLX keeps cached for reuse.
pub(crate) fn clear_cache() {
    init();
    // SAFETY: no arguments; MLX synchronizes its allocator internally.
    unsafe {
        mlx_sys::mlx_clear_cache();
    }
}

/// Bytes of memory MLX has allocated and not released (active, cache).
pub fn memory_stats() -> (usize, usize) {
    init();
    let (mut active, mut cache) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    unsafe {
        mlx_sys::mlx_get_active_memory(&mut active);
        mlx_sys::mlx_get_cache_memory(&mut cache);
    }
    (active, cache)
}

/// The most bytes MLX has had allocated for arrays (active memory, not its buffer cache) at any
/// moment since the process started or since the last [`reset_peak_memory`], on every device.
///
/// Unlike sampling [`memory_stats`] between steps, this sees the transient arrays inside an
/// evaluation (a prefill's attention scores, a training step's activations).
pub fn peak_memory() -> usize {
    init();
    let mut peak = 0usize;
    // SAFETY: a valid out-pointer.
    unsafe {
        mlx_sys::mlx_get_peak_memory(&mut peak);
    }
    peak
}

/// Starts a new measurement of [`peak_memory`] from the memory allocated now.
pub fn reset_peak_memory() {
    init();
    // SAFETY: no arguments; MLX synchronizes its allocator internally.
    unsafe {
        mlx_sys::mlx_reset_peak_memory();
    }
}

/// Waits until every evaluation queued on the default stream has finished.
pub(crate) fn synchronize() -> Result<(), MlxError> {
    init();
    let stream = Stream::thread_local_or_default();
    // SAFETY: the stream handle is live for the call.
    let rc = unsafe { mlx_sys::mlx_synchronize(stream.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(MlxError::mlx(
            "sync",
            "MLX could not synchronize the stream",
        ))
    }
}

/// A stream handle that lives for the whole process.
struct SharedStream(mlx_stream);

// SAFETY: an `mlx_stream` is a handle to an immutable (index, device) pair. MLX creates these
// with `new_thread_unsafe_stream`, which it documents as usable from any thread; burn-mlx
// serializes evaluation on them with its evaluation lock.
unsafe impl Send for SharedStream {}
// SAFETY: as above; the handle itself is never mutated after creation.
unsafe impl Sync for SharedStream {}

/// The process-wide streams (CPU, GPU), created once.
fn shared_streams() -> &'static [Option<SharedStream>; 2] {
    static STREAMS: std::sync::OnceLock<[Option<SharedStream>; 2]> = std::sync::OnceLock::new();
    STREAMS.get_or_init(|| {
        init();
        let make = |kind: DeviceType| {
            if !device_available(kind) {
                return None;
            }
            // SAFETY: the device handle is created and freed here; the stream handle is kept
            // for the life of the process.
            unsafe {
                let dev = mlx_sys::mlx_device_new_type(kind as u32, 0);
                let s = mlx_sys::mlx_stream_new_thread_unsafe(dev);
                mlx_sys::mlx_device_free(dev);
                Some(SharedStream(s))
            }
        };
        [make(DeviceType::Cpu), make(DeviceType::Gpu)]
    })
}

/// Makes the process-wide streams this thread's default MLX streams (once per thread).
///
/// MLX 0.32 gives every thread its own default streams, and an array built on one thread's
/// stream cannot be evaluated on another thread ("There is no Stream(cpu, N) in current thread").
/// Burn moves tensors between threads freely (data loaders, training threads), so burn-mlx builds
/// every graph on one stream per device that any thread may use, and serializes evaluation.
pub(crate) fn thread_init() {
    thread_local! {
        static DONE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if DONE.with(|d| d.get()) {
        return;
    }
    for s in shared_streams().iter().flatten() {
        // SAFETY: `s.0` is a live stream handle; MLX copies it into the thread's defaults.
        unsafe {
            mlx_sys::mlx_set_default_stream(s.0);
        }
    }
    DONE.with(|d| d.set(true));
}
