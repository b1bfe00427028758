//! Safe wrappers over mlx-c's distributed API (`mlx/c/distributed.h`,
//! `mlx/c/distributed_group.h`), with the conventions of [`crate::native`]: every raw `mlx_sys` call
//! of the distributed module lives here.
//!
//! MLX reports a failed call through its error handler, a process-wide callback that mlx-rs
//! installs and that stashes the message for mlx-rs's own calls. The distributed calls need that
//! message too ("[ring] Couldn't connect", "[ring] connection to a peer was lost"), so
//! [`capture_errors`] installs a handler that keeps a copy for the calling thread and then
//! passes the message on to mlx-rs's handler unchanged.

use mlx_rs::{Array, Dtype, Stream};
use mlx_sys::{mlx_array, mlx_distributed_group, mlx_stream};
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::os::raw::c_int;
use std::sync::Once;

thread_local! {
    /// The last MLX error message raised on this thread (see [`capture_errors`]).
    static LAST_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
}

extern "C" {
    /// mlx-rs's MLX error handler (exported by mlx-rs under this unmangled name): it stashes the
    /// message where mlx-rs's own fallible calls read it.
    fn default_mlx_error_handler(msg: *const c_char, data: *mut c_void);
}

/// Keeps a copy of the message for this thread, then hands it to mlx-rs's handler.
extern "C" fn chained_error_handler(msg: *const c_char, data: *mut c_void) {
    if !msg.is_null() {
        // SAFETY: MLX passes a NUL-terminated message that lives for the call.
        let text = unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned();
        LAST_ERROR.with(|last| *last.borrow_mut() = Some(text));
    }
    // SAFETY: the same arguments MLX gave us, passed on within the call.
    unsafe { default_mlx_error_handler(msg, data) }
}

/// Installs the chained error handler once, after mlx-rs has installed its own.
pub(crate) fn capture_errors() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        super::init();
        // SAFETY: the handler is a plain function valid for the life of the process; it needs
        // no data and no destructor.
        unsafe {
            mlx_sys::mlx_set_error_handler(Some(chained_error_handler), std::ptr::null_mut(), None)
        }
    });
}

/// Takes the last MLX error message raised on this thread, or `fallback`.
fn take_error(fallback: &str) -> String {
    LAST_ERROR
        .with(|last| last.borrow_mut().take())
        .unwrap_or_else(|| fallback.to_string())
}

/// Forgets any message left on this thread by an earlier call.
fn clear_error() {
    LAST_ERROR.with(|last| *last.borrow_mut() = None);
}

/// An owned mlx-c group handle.
pub(crate) struct RawGroup(mlx_distributed_group);

// SAFETY: the handle owns a heap-allocated `mlx::core::distributed::Group`, which holds a
// `shared_ptr` to the backend's group object. Its rank and size never change; the collectives
// only read the pointer to build graph nodes, and burn-mlx evaluates those under its evaluation
// lock. Freeing happens once, on drop.
unsafe impl Send for RawGroup {}
// SAFETY: as above: shared access only reads the handle.
unsafe impl Sync for RawGroup {}

impl Drop for RawGroup {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `mlx_distributed_init` and is freed once.
        unsafe {
            mlx_sys::mlx_distributed_group_free(self.0);
        }
    }
}

impl RawGroup {
    /// This process's rank in the group.
    pub(crate) fn rank(&self) -> usize {
        // SAFETY: a live group handle.
        unsafe { mlx_sys::mlx_distributed_group_rank(self.0) }.max(0) as usize
    }

    /// The number of processes in the group.
    pub(crate) fn size(&self) -> usize {
        // SAFETY: a live group handle.
        unsafe { mlx_sys::mlx_distributed_group_size(self.0) }.max(1) as usize
    }
}

/// Whether MLX was built with the backend named `name` (`any`, `ring`, `mpi`, `nccl`, `jaccl`).
pub(crate) fn is_available(name: &str) -> bool {
    capture_errors();
    let name = CString::new(name).expect("backend names have no NUL byte");
    // SAFETY: a NUL-terminated string that outlives the call.
    unsafe { mlx_sys::mlx_distributed_is_available(name.as_ptr()) }
}

/// `mlx_distributed_init(strict, name)`. Blocks while the backend connects to its peers.
pub(crate) fn init(strict: bool, name: &str) -> Result<RawGroup, String> {
    capture_errors();
    clear_error();
    let name = CString::new(name).expect("backend names have no NUL byte");
    // SAFETY: `res` is a fresh empty handle that the call fills; it is owned by the returned
    // `RawGroup`, or freed here on failure.
    unsafe {
        let mut res = mlx_sys::mlx_distributed_group_new();
        let rc = mlx_sys::mlx_distributed_init(&mut res, strict, name.as_ptr());
        if rc != 0 || res.ctx.is_null() {
            mlx_sys::mlx_distributed_group_free(res);
            return Err(take_error(
                "MLX could not initialise the distributed backend",
            ));
        }
        Ok(RawGroup(res))
    }
}

/// Runs an mlx-c op that writes one array, returning MLX's message on failure.
fn array_op(fallback: &str, f: impl FnOnce(*mut mlx_array) -> c_int) -> Result<Array, String> {
    capture_errors();
    clear_error();
    // SAFETY: `res` is a fresh array handle that the op writes; on success it is owned by the
    // returned `Array`, on failure it is freed here.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        if f(&mut res) != 0 {
            mlx_sys::mlx_array_free(res);
            return Err(take_error(fallback));
        }
        Ok(Array::from_ptr(res))
    }
}

/// The signature shared by mlx-c's all-reduce and all-gather functions.
type Collective =
    unsafe extern "C" fn(*mut mlx_array, mlx_array, mlx_distributed_group, mlx_stream) -> c_int;

/// Builds (lazily) the collective `f` of `x` over `group` on `stream`.
fn collective(
    f: Collective,
    x: &Array,
    group: &RawGroup,
    stream: &Stream,
) -> Result<Array, String> {
    // SAFETY: the input array, group and stream are live for the call.
    array_op("MLX rejected the collective", |res| unsafe {
        f(res, x.as_ptr(), group.0, stream.as_ptr())
    })
}

/// The elementwise sum of `x` over all ranks (lazy).
pub(crate) fn all_sum(x: &Array, group: &RawGroup, stream: &Stream) -> Result<Array, String> {
    collective(mlx_sys::mlx_distributed_all_sum, x, group, stream)
}

/// The elementwise maximum of `x` over all ranks (lazy).
pub(crate) fn all_max(x: &Array, group: &RawGroup, stream: &Stream) -> Result<Array, String> {
    collective(mlx_sys::mlx_distributed_all_max, x, group, stream)
}

/// The elementwise minimum of `x` over all ranks (lazy).
pub(crate) fn all_min(x: &Array, group: &RawGroup, stream: &Stream) -> Result<Array, String> {
    collective(mlx_sys::mlx_distributed_all_min, x, group, stream)
}

/// Every rank's `x` concatenated along axis 0, in rank order (lazy).
pub(crate) fn all_gather(x: &Array, group: &RawGroup, stream: &Stream) -> Result<Array, String> {
    collective(mlx_sys::mlx_distributed_all_gather, x, group, stream)
}

/// An array whose evaluation sends `x` to rank `dst` (lazy).
pub(crate) fn send(
    x: &Array,
    dst: usize,
    group: &RawGroup,
    stream: &Stream,
) -> Result<Array, String> {
    // SAFETY: the input array, group and stream are live for the call.
    array_op("MLX rejected the send", |res| unsafe {
        mlx_sys::mlx_distributed_send(res, x.as_ptr(), dst as c_int, group.0, stream.as_ptr())
    })
}

/// An array of `shape` and `dtype` whose evaluation receives it from rank `src` (lazy).
pub(crate) fn recv(
    shape: &[i32],
    dtype: Dtype,
    src: usize,
    group: &RawGroup,
    stream: &Stream,
) -> Result<Array, String> {
    // SAFETY: the shape slice, group and stream outlive the call.
    array_op("MLX rejected the recv", |res| unsafe {
        mlx_sys::mlx_distributed_recv(
            res,
            shape.as_ptr(),
            shape.len(),
            dtype as mlx_sys::mlx_dtype,
            src as c_int,
            group.0,
            stream.as_ptr(),
        )
    })
}
