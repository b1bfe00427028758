//! mlx-c's `mlx_custom_vjp`: a function whose vector-Jacobian product, inside MLX's own
//! transforms (`value_and_grad`, and `compile` around it), is one that burn-mlx supplies instead
//! of MLX's product of the function's primitives.
//!
//! [`apply`] wraps a forward and a backward closure into an MLX function and calls it on the
//! inputs. MLX keeps the backward closure in the graph (a `CustomTransforms` primitive), so it is
//! owned by the graph: boxed, and freed by mlx-c through the payload's destructor.

use mlx_rs::error::Exception;
use mlx_rs::Array;
use std::cell::RefCell;
use std::ffi::c_void;
use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The function: its inputs to its outputs.
pub(crate) type Forward = Box<dyn Fn(&[Array]) -> Result<Vec<Array>, Exception>>;

/// The product: `(primals, cotangents, outputs)` to one cotangent per primal.
pub(crate) type Backward =
    Box<dyn Fn(&[Array], &[Array], &[Array]) -> Result<Vec<Array>, Exception>>;

thread_local! {
    /// The message of the last closure that failed on this thread (mlx-c replaces it with a
    /// generic one).
    static FAILED: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// `forward(inputs)`, with `backward` as its vector-Jacobian product for MLX's transforms.
pub(crate) fn apply(
    forward: Forward,
    backward: Backward,
    inputs: &[Array],
) -> Result<Vec<Array>, Exception> {
    FAILED.with(|f| f.borrow_mut().take());
    let forward = Box::into_raw(Box::new(forward)) as *mut c_void;
    let backward = Box::into_raw(Box::new(backward)) as *mut c_void;
    // SAFETY: each payload is a leaked `Box<Forward>` / `Box<Backward>` that mlx-c owns from here
    // on and frees through the matching destructor when the last copy of its closure is dropped
    // (the backward one lives as long as the graph node that holds it). The closures, the custom
    // function and the vectors are created, used and freed here; each output handle is taken
    // into an `Array` that owns it.
    let result = unsafe {
        let fun = mlx_sys::mlx_closure_new_func_payload(
            Some(call_forward),
            forward,
            Some(drop_payload::<Forward>),
        );
        let vjp = mlx_sys::mlx_closure_custom_new_func_payload(
            Some(call_backward),
            backward,
            Some(drop_payload::<Backward>),
        );
        let mut custom = mlx_sys::mlx_closure_new();
        let made = mlx_sys::mlx_custom_vjp(&mut custom, fun, vjp) == 0;
        let mut out = Vec::new();
        let ok = made && {
            let handles: Vec<mlx_sys::mlx_array> = inputs.iter().map(|a| a.as_ptr()).collect();
            let vin = mlx_sys::mlx_vector_array_new_data(handles.as_ptr(), handles.len());
            let mut vout = mlx_sys::mlx_vector_array_new();
            let ok = mlx_sys::mlx_closure_apply(&mut vout, custom, vin) == 0;
            if ok {
                out = read(vout);
            }
            mlx_sys::mlx_vector_array_free(vout);
            mlx_sys::mlx_vector_array_free(vin);
            ok
        };
        mlx_sys::mlx_closure_free(custom);
        mlx_sys::mlx_closure_custom_free(vjp);
        mlx_sys::mlx_closure_free(fun);
        ok.then_some(out)
    };
    result.ok_or_else(|| {
        let message = FAILED
            .with(|f| f.borrow_mut().take())
            .unwrap_or_else(|| "MLX rejected a function with a custom backward pass".into());
        Exception::custom(message)
    })
}

/// The arrays of an mlx-c vector, each a new handle owned by its `Array`.
///
/// # Safety
///
/// `v` must be a live vector.
pub(super) unsafe fn read(v: mlx_sys::mlx_vector_array) -> Vec<Array> {
    let n = mlx_sys::mlx_vector_array_size(v);
    (0..n)
        .map(|i| {
            let mut a = mlx_sys::mlx_array_new();
            mlx_sys::mlx_vector_array_get(&mut a, v, i);
            Array::from_ptr(a)
        })
        .collect()
}

/// Writes `arrays` into the result vector `res`; 0 on success, as mlx-c's closures return.
///
/// # Safety
///
/// `res` must point to a live vector.
unsafe fn write(res: *mut mlx_sys::mlx_vector_array, arrays: &[Array]) -> c_int {
    let handles: Vec<mlx_sys::mlx_array> = arrays.iter().map(|a| a.as_ptr()).collect();
    mlx_sys::mlx_vector_array_set_data(res, handles.as_ptr(), handles.len())
}

/// Runs `f` (a closure's body), recording its error or panic for [`apply`]; 0 on success.
fn guarded(f: impl FnOnce() -> Result<c_int, Exception>) -> c_int {
    let message = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(status)) => return status,
        Ok(Err(e)) => e.what().to_string(),
        Err(_) => "a custom backward pass panicked".to_string(),
    };
    FAILED.with(|f| *f.borrow_mut() = Some(message));
    1
}

unsafe extern "C" fn call_forward(
    res: *mut mlx_sys::mlx_vector_array,
    input: mlx_sys::mlx_vector_array,
    payload: *mut c_void,
) -> c_int {
    // SAFETY: mlx-c passes the payload given in `apply` (a live `Forward`), a live input vector
    // and a live result vector.
    guarded(|| unsafe {
        let f = &*(payload as *const Forward);
        let outputs = f(&read(input))?;
        Ok(write(res, &outputs))
    })
}

unsafe extern "C" fn call_backward(
    res: *mut mlx_sys::mlx_vector_array,
    primals: mlx_sys::mlx_vector_array,
    cotangents: mlx_sys::mlx_vector_array,
    outputs: mlx_sys::mlx_vector_array,
    payload: *mut c_void,
) -> c_int {
    // SAFETY: as in `call_forward`, with a live `Backward` and three live input vectors.
    guarded(|| unsafe {
        let f = &*(payload as *const Backward);
        let grads = f(&read(primals), &read(cotangents), &read(outputs))?;
        Ok(write(res, &grads))
    })
}

unsafe extern "C" fn drop_payload<T>(payload: *mut c_void) {
    // SAFETY: the payload is the `Box<T>` leaked in `apply`, freed once by mlx-c.
    drop(unsafe { Box::from_raw(payload as *mut T) });
}
