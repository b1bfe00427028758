//! MLX function files (`mlx-sys/export.cpp`), for [`crate::export`]: tracing a Rust closure into
//! a file, reading a file back and applying it.

use crate::error::MlxError;
use mlx_rs::Array;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

/// The traced function as the C side sees it: arrays in, arrays out. The closure's own error
/// (or panic message) is kept by [`export_function`]'s caller through the closure.
pub(crate) type TraceFn<'a> = dyn FnMut(Vec<Array>) -> Result<Vec<Array>, ()> + 'a;

/// The payload handed to the C callback: the closure, behind a thin pointer.
struct Payload<'a, 'b> {
    f: &'a mut TraceFn<'b>,
}

/// The C callback: wraps the input handles (owned from here on), calls the closure, appends its
/// outputs to `outputs`. A panic in the closure is caught here (it must not cross into C++) and
/// reported as a failure; the closure records what went wrong before it returns `Err`.
unsafe extern "C" fn trampoline(
    payload: *mut c_void,
    inputs: *const mlx_sys::mlx_array,
    n: usize,
    outputs: mlx_sys::mlx_vector_array,
) -> c_int {
    // SAFETY: `payload` is the `Payload` that `export_function` passed for this call, alive
    // and not otherwise borrowed while MLX runs the trace.
    let payload = unsafe { &mut *(payload as *mut Payload<'_, '_>) };
    // SAFETY: MLX passes `n` fresh handles that this side owns; `from_ptr` takes each one over
    // (it is freed when the `Array` drops).
    let arrays: Vec<Array> = (0..n)
        .map(|i| unsafe { Array::from_ptr(*inputs.add(i)) })
        .collect();
    let result = catch_unwind(AssertUnwindSafe(|| (payload.f)(arrays)));
    match result {
        Ok(Ok(outs)) => {
            for a in &outs {
                // SAFETY: `outputs` is the live vector the C side created for this call; the
                // append copies the handle (a reference to the same array).
                if unsafe { mlx_sys::mlx_vector_array_append_value(outputs, a.as_ptr()) } != 0 {
                    return 1;
                }
            }
            0
        }
        Ok(Err(())) | Err(_) => 1,
    }
}

/// Converts `path` for C, or fails naming `op` and the path.
fn c_path(op: &str, path: &Path) -> Result<CString, MlxError> {
    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| MlxError::File {
        op: op.into(),
        path: path.display().to_string(),
        message: "the path contains a NUL byte".into(),
    })
}

/// Reads the NUL-terminated message the C side wrote into `err`.
fn message(err: &[c_char]) -> String {
    // SAFETY: the C side NUL-terminates what it writes, within the buffer's length; the
    // buffer starts zeroed, so it is terminated even if nothing was written.
    unsafe { CStr::from_ptr(err.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Traces `f` once for each input list of `signatures` and writes the traces to `path`, with
/// `metadata` in the file's header. On failure returns MLX's message (the closure's own failure
/// shows as "the traced function failed").
pub(crate) fn export_function(
    path: &Path,
    f: &mut TraceFn<'_>,
    signatures: &[Vec<Array>],
    shapeless: bool,
    metadata: &str,
) -> Result<(), String> {
    let file = c_path("export", path).map_err(|e| e.to_string())?;
    let metadata = CString::new(metadata).map_err(|_| "the metadata contains a NUL byte")?;
    let handles: Vec<mlx_sys::mlx_array> = signatures
        .iter()
        .flat_map(|s| s.iter().map(Array::as_ptr))
        .collect();
    let counts: Vec<usize> = signatures.iter().map(Vec::len).collect();
    let mut payload = Payload { f };
    let mut err = [0 as c_char; 4096];
    // SAFETY: `file` and `metadata` are NUL-terminated and outlive the call; `handles` are live
    // array handles borrowed from `signatures`, `counts` sums to their number; `payload` is
    // exclusively borrowed for the call and only `trampoline` reads it; `err` is a writable
    // buffer of the given length.
    let rc = unsafe {
        mlx_sys::burn_mlx_export_function(
            file.as_ptr(),
            trampoline,
            &mut payload as *mut Payload<'_, '_> as *mut c_void,
            handles.as_ptr(),
            counts.as_ptr(),
            counts.len(),
            shapeless,
            metadata.as_ptr(),
            err.as_mut_ptr(),
            err.len(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(message(&err))
    }
}

/// A function read from an MLX function file (owned C++ `ImportedFunction`).
pub(crate) struct ImportedFunction(*mut c_void);

// SAFETY: MLX's `ImportedFunction` is immutable once read (applying it only reads its tables and
// builds new arrays); burn-mlx applies it under its evaluation lock.
unsafe impl Send for ImportedFunction {}
// SAFETY: as above.
unsafe impl Sync for ImportedFunction {}

impl Drop for ImportedFunction {
    fn drop(&mut self) {
        // SAFETY: the handle came from `burn_mlx_import_function` and is freed once, here.
        unsafe { mlx_sys::burn_mlx_imported_function_free(self.0) }
    }
}

impl ImportedFunction {
    /// Reads `path`; on failure returns MLX's message.
    pub(crate) fn read(path: &Path) -> Result<Self, String> {
        let file = c_path("import", path).map_err(|e| e.to_string())?;
        let mut err = [0 as c_char; 4096];
        // SAFETY: `file` is NUL-terminated and outlives the call; `err` is a writable buffer of
        // the given length.
        let handle = unsafe {
            mlx_sys::burn_mlx_import_function(file.as_ptr(), err.as_mut_ptr(), err.len())
        };
        if handle.is_null() {
            Err(message(&err))
        } else {
            Ok(ImportedFunction(handle))
        }
    }

    /// The metadata string stored in the file ("" if none).
    pub(crate) fn metadata(&self) -> String {
        // SAFETY: the handle is live; the string it returns lives as long as the handle and is
        // copied here.
        unsafe { CStr::from_ptr(mlx_sys::burn_mlx_imported_function_metadata(self.0)) }
            .to_string_lossy()
            .into_owned()
    }

    /// Applies the function to `inputs`, giving its lazy outputs; on failure returns MLX's
    /// message (no signature in the file matches the inputs).
    pub(crate) fn call(&self, inputs: &[Array]) -> Result<Vec<Array>, String> {
        let handles: Vec<mlx_sys::mlx_array> = inputs.iter().map(Array::as_ptr).collect();
        let mut out = mlx_sys::mlx_vector_array {
            ctx: std::ptr::null_mut(),
        };
        let mut err = [0 as c_char; 4096];
        // SAFETY: the function handle is live; `handles` are live arrays borrowed from
        // `inputs`; `out` is written only on success; `err` is a writable buffer of the given
        // length.
        let rc = unsafe {
            mlx_sys::burn_mlx_imported_function_call(
                self.0,
                handles.as_ptr(),
                handles.len(),
                &mut out,
                err.as_mut_ptr(),
                err.len(),
            )
        };
        if rc != 0 {
            return Err(message(&err));
        }
        // SAFETY: on success `out` is a new vector that this side owns: each element is copied
        // out into a fresh handle that `from_ptr` takes over, then the vector is freed once.
        unsafe {
            let n = mlx_sys::mlx_vector_array_size(out);
            let mut arrays = Vec::with_capacity(n);
            for i in 0..n {
                let mut a = mlx_sys::mlx_array_new();
                mlx_sys::mlx_vector_array_get(&mut a, out, i);
                arrays.push(Array::from_ptr(a));
            }
            mlx_sys::mlx_vector_array_free(out);
            Ok(arrays)
        }
    }
}
