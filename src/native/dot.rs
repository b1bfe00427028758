//! MLX's DOT export of a pending graph (`mlx_export_to_dot`), read back as text.
//!
//! mlx-c writes the graph to a C `FILE*`; an in-memory stream (`open_memstream`) collects it
//! without touching the file system.

use crate::error::MlxError;
use mlx_rs::Array;
use std::os::raw::{c_char, c_int, c_void};

// The C library's in-memory stream (POSIX 2008) and allocator, declared here because `libc`
// is not a dependency of this crate.
unsafe extern "C" {
    fn open_memstream(buffer: *mut *mut c_char, size: *mut usize) -> *mut c_void;
    fn fclose(stream: *mut c_void) -> c_int;
    fn free(ptr: *mut c_void);
}

/// The DOT text MLX writes for the pending graphs of `outputs` (each node once, named by its
/// primitive: `{ ID [label ="Name", shape=rectangle]; }`).
pub(crate) fn export_dot(outputs: &[&Array]) -> Result<String, MlxError> {
    super::thread_init();
    // SAFETY: `open_memstream` gets two writable locals and returns a stream (or null, checked)
    // that `fclose` closes after the export; after `fclose`, `buffer` holds `size` bytes that
    // the C allocator owns, copied and then released with `free`. The vector and namer handles
    // are created, used and freed here; the array handles are live for the call (borrowed from
    // `outputs`), and the vector only adds references to them.
    unsafe {
        let mut buffer: *mut c_char = std::ptr::null_mut();
        let mut size = 0usize;
        let stream = open_memstream(&mut buffer, &mut size);
        if stream.is_null() {
            return Err(MlxError::Device {
                device: "host".into(),
                hint: "open_memstream failed: no memory for the graph text".into(),
            });
        }
        let vec = mlx_sys::mlx_vector_array_new();
        for a in outputs {
            mlx_sys::mlx_vector_array_append_value(vec, a.as_ptr());
        }
        let namer = mlx_sys::mlx_node_namer_new();
        let status = mlx_sys::mlx_export_to_dot(stream.cast(), namer, vec);
        mlx_sys::mlx_node_namer_free(namer);
        mlx_sys::mlx_vector_array_free(vec);
        fclose(stream);
        let text = if buffer.is_null() {
            String::new()
        } else {
            let bytes = std::slice::from_raw_parts(buffer.cast::<u8>(), size);
            let text = String::from_utf8_lossy(bytes).into_owned();
            free(buffer.cast());
            text
        };
        if status != 0 {
            return Err(MlxError::Device {
                device: "host".into(),
                hint: "MLX's export_to_dot failed on these tensors".into(),
            });
        }
        Ok(text)
    }
}
