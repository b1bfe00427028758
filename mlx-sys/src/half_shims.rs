//! Half-precision items that mlx-c declares only when the C compiler has `__fp16`/`__bf16`
//! (ARM), defined here on top of the 16-bit unsigned accessors.
//!
//! MLX's `item<T>()` and `data<T>()` reinterpret the array's buffer without checking the dtype,
//! so reading a float16 or bfloat16 array through the `uint16` accessors returns its raw bits,
//! which is exactly what mlx-rs expects (`f16::from_bits`, `bf16::from_bits`).

use super::{mlx_array, mlx_array_data_uint16, mlx_array_item_uint16};

/// The bits of an IEEE 754 half-precision float, as mlx-rs reads them (`.0`).
#[repr(transparent)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct float16_t(pub u16);

/// The bits of a bfloat16 value.
pub type bfloat16_t = u16;

/// Reads the single element of a float16 array.
///
/// # Safety
/// `res` must be valid for a write; `arr` must be a live mlx-c array.
#[no_mangle]
pub unsafe extern "C" fn mlx_array_item_float16(
    res: *mut float16_t,
    arr: mlx_array,
) -> ::std::os::raw::c_int {
    mlx_array_item_uint16(res as *mut u16, arr)
}

/// Reads the single element of a bfloat16 array.
///
/// # Safety
/// `res` must be valid for a write; `arr` must be a live mlx-c array.
#[no_mangle]
pub unsafe extern "C" fn mlx_array_item_bfloat16(
    res: *mut bfloat16_t,
    arr: mlx_array,
) -> ::std::os::raw::c_int {
    mlx_array_item_uint16(res, arr)
}

/// The data of an evaluated float16 array (null if it is not evaluated).
///
/// # Safety
/// `arr` must be a live mlx-c array.
#[no_mangle]
pub unsafe extern "C" fn mlx_array_data_float16(arr: mlx_array) -> *const float16_t {
    mlx_array_data_uint16(arr) as *const float16_t
}

/// The data of an evaluated bfloat16 array (null if it is not evaluated).
///
/// # Safety
/// `arr` must be a live mlx-c array.
#[no_mangle]
pub unsafe extern "C" fn mlx_array_data_bfloat16(arr: mlx_array) -> *const bfloat16_t {
    mlx_array_data_uint16(arr)
}

/// Monotonic nanoseconds, standing in for the Mach call that mlx-rs seeds its random state with.
///
/// # Safety
/// Always safe to call; `unsafe` only to match the foreign declaration mlx-rs uses.
#[no_mangle]
pub unsafe extern "C" fn mach_approximate_time() -> u64 {
    let mut ts = libc_timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to a valid pointer.
    if clock_gettime(CLOCK_MONOTONIC, &mut ts) != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

#[repr(C)]
struct libc_timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

const CLOCK_MONOTONIC: i32 = 1;

extern "C" {
    fn clock_gettime(clock: i32, ts: *mut libc_timespec) -> i32;
}
