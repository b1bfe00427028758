//! The raw bindings against the MLX this crate links: arrays made, computed on MLX's CPU stream
//! and read back through mlx-c alone, checked by value. A build whose bindings do not match the
//! library (a wrong struct layout, a missing symbol, a BLAS that does not answer) fails here
//! before any layer above it is involved.

use mlx_sys::*;
use std::os::raw::c_int;

/// An f32 array of `shape` holding `values` (mlx-c copies the buffer).
fn array(values: &[f32], shape: &[c_int]) -> mlx_array {
    assert_eq!(values.len() as c_int, shape.iter().product::<c_int>());
    // SAFETY: `values` holds as many f32 as `shape` describes; mlx-c copies them before returning.
    unsafe {
        mlx_array_new_data(
            values.as_ptr().cast(),
            shape.as_ptr(),
            shape.len() as c_int,
            mlx_dtype__MLX_FLOAT32,
        )
    }
}

/// Evaluates `a` and copies its f32 values out.
fn values(a: mlx_array) -> Vec<f32> {
    // SAFETY: `a` is a live array; after a successful eval its data pointer holds `size` f32
    // values (checked dtype), valid until the array is freed, which happens after the copy.
    unsafe {
        assert_eq!(mlx_array_eval(a), 0, "mlx_array_eval failed");
        assert_eq!(mlx_array_dtype(a), mlx_dtype__MLX_FLOAT32);
        let n = mlx_array_size(a);
        std::slice::from_raw_parts(mlx_array_data_float32(a), n).to_vec()
    }
}

#[test]
fn matmul_and_sum_through_mlx_c() {
    // SAFETY: every array and the stream are created here, passed to mlx-c by value as its API
    // takes them, and freed once at the end; results are written into fresh `mlx_array_new()`
    // handles.
    unsafe {
        let stream = mlx_default_cpu_stream_new();
        let a = array(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
        let b = array(&[5.0, 6.0, 7.0, 8.0], &[2, 2]);

        let mut product = mlx_array_new();
        assert_eq!(
            mlx_matmul(&mut product, a, b, stream),
            0,
            "mlx_matmul failed"
        );
        assert_eq!(values(product), [19.0, 22.0, 43.0, 50.0]);
        assert_eq!(mlx_array_ndim(product), 2);
        let shape = std::slice::from_raw_parts(mlx_array_shape(product), 2);
        assert_eq!(shape, [2, 2]);

        let mut sum = mlx_array_new();
        assert_eq!(
            mlx_sum(&mut sum, product, false, stream),
            0,
            "mlx_sum failed"
        );
        let mut total = 0f32;
        assert_eq!(mlx_array_item_float32(&mut total, sum), 0);
        assert_eq!(total, 134.0);

        let mut added = mlx_array_new();
        assert_eq!(mlx_add(&mut added, a, b, stream), 0, "mlx_add failed");
        assert_eq!(values(added), [6.0, 8.0, 10.0, 12.0]);

        for arr in [a, b, product, sum, added] {
            assert_eq!(mlx_array_free(arr), 0);
        }
        assert_eq!(mlx_stream_free(stream), 0);
    }
}

#[test]
fn burn_mlx_eval_evaluates_a_pending_graph() {
    // SAFETY: as above; `burn_mlx_eval` reads `n` handles from the pointer and writes at most
    // `err.len()` bytes of message into `err`.
    unsafe {
        let stream = mlx_default_cpu_stream_new();
        let a = array(&[1.5, -2.0, 0.25], &[3]);
        let mut doubled = mlx_array_new();
        assert_eq!(mlx_add(&mut doubled, a, a, stream), 0);
        let mut err = [0 as std::os::raw::c_char; 256];
        let status = burn_mlx_eval(&doubled, 1, true, err.as_mut_ptr(), err.len());
        assert_eq!(status, 0, "burn_mlx_eval failed");
        assert_eq!(values(doubled), [3.0, -4.0, 0.5]);
        mlx_array_free(a);
        mlx_array_free(doubled);
        mlx_stream_free(stream);
    }
}
