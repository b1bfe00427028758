//! The array ops that mlx-rs does not wrap: mlx-c's bitwise ops, strided slices, slice updates
//! and axis scatter-add, and burn-mlx's vectorized CPU kernels (`mlx-sys/fast_unary.cpp`:
//! `exp`, `tanh`, `erf`, `sigmoid`, `softmax`, `logsumexp`). Each runs on the thread's default
//! stream and returns an `Array` that owns its result.

use super::init;
use crate::error::MlxError;
use mlx_rs::{Array, Stream};
use mlx_sys::{mlx_array, mlx_stream};

/// Runs an mlx-c op that writes one array, on the thread's default stream.
fn array_op(
    op: &str,
    f: impl FnOnce(*mut mlx_array, mlx_stream) -> std::os::raw::c_int,
) -> Result<Array, MlxError> {
    init();
    let stream = Stream::thread_local_or_default();
    // SAFETY: `res` is a fresh mlx-c array handle that the op writes; on success it is owned by
    // the returned `Array`, which frees it on drop; on failure it is freed here.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let rc = f(&mut res, stream.as_ptr());
        if rc != 0 {
            mlx_sys::mlx_array_free(res);
            return Err(MlxError::mlx(
                op,
                "MLX rejected the operation (see the shapes and dtypes of its inputs)",
            ));
        }
        Ok(Array::from_ptr(res))
    }
}

macro_rules! binary_ffi {
    ($(#[$doc:meta] $name:ident => $raw:ident),* $(,)?) => {$(
        #[$doc]
        pub(crate) fn $name(a: &Array, b: &Array) -> Result<Array, MlxError> {
            // SAFETY: both inputs are live arrays for the duration of the call.
            array_op(stringify!($name), |res, s| unsafe {
                mlx_sys::$raw(res, a.as_ptr(), b.as_ptr(), s)
            })
        }
    )*};
}

binary_ffi! {
    /// Elementwise bitwise AND of two integer (or bool) arrays, with broadcasting.
    bitwise_and => mlx_bitwise_and,
    /// Elementwise bitwise OR.
    bitwise_or => mlx_bitwise_or,
    /// Elementwise bitwise XOR.
    bitwise_xor => mlx_bitwise_xor,
    /// Elementwise left shift.
    left_shift => mlx_left_shift,
    /// Elementwise right shift (arithmetic for signed types).
    right_shift => mlx_right_shift,
}

/// [`array_op`] for the entries of `mlx-sys/fast_unary.cpp`: on failure, the error carries
/// MLX's own message (which those entries keep per thread), not only the op's name.
pub(super) fn fast_op(
    op: &str,
    f: impl FnOnce(*mut mlx_array, mlx_stream) -> std::os::raw::c_int,
) -> Result<Array, mlx_rs::error::Exception> {
    array_op(op, f).map_err(|e| {
        let what = fast_last_error();
        if what.is_empty() {
            mlx_rs::error::Exception::custom(e.to_string())
        } else {
            mlx_rs::error::Exception::custom(MlxError::mlx(op, what).to_string())
        }
    })
}

/// The calling thread's last failure message from burn-mlx's native entries
/// (`burn_mlx_fast_last_error`), or "" if none.
pub(super) fn fast_last_error() -> String {
    // SAFETY: the entry returns a NUL-terminated string owned by this thread, unchanged until
    // this thread's next failing call; it is copied here.
    let what = unsafe { std::ffi::CStr::from_ptr(mlx_sys::burn_mlx_fast_last_error()) };
    what.to_string_lossy().into_owned()
}

macro_rules! fast_unary_ffi {
    ($(#[$doc:meta] $name:ident => $op:literal),* $(,)?) => {$(
        #[$doc]
        ///
        /// On a CPU stream, float32 goes through burn-mlx's vectorized kernel
        /// (`mlx-sys/fast_unary.cpp`: MLX's CPU build evaluates these functions one element at a
        /// time); anything else through MLX's own op.
        pub(crate) fn $name(a: &Array) -> Result<Array, mlx_rs::error::Exception> {
            // SAFETY: the input is live for the call.
            fast_op(stringify!($name), |res, s| unsafe {
                mlx_sys::burn_mlx_fast_unary(res, a.as_ptr(), $op, s)
            })
        }
    )*};
}

fast_unary_ffi! {
    /// Elementwise `exp`.
    exp => 0,
    /// Elementwise `tanh`.
    tanh => 1,
    /// Elementwise `erf`.
    erf => 2,
    /// Elementwise logistic sigmoid, `1 / (1 + exp(-x))`.
    sigmoid => 3,
}

/// Softmax over `axis`: on a CPU stream, float32 is composed as exp(x - max) / sum with the
/// vectorized `exp` (MLX's CPU `Softmax` kernel evaluates its `exp` one element at a time);
/// anything else goes through MLX's precise `softmax`.
pub(crate) fn softmax(a: &Array, axis: i32) -> Result<Array, mlx_rs::error::Exception> {
    // SAFETY: the input is live for the call.
    fast_op("softmax", |res, s| unsafe {
        mlx_sys::burn_mlx_softmax(res, a.as_ptr(), axis, s)
    })
}

/// `log(sum(exp(a)))` over `axis`, the axis kept as size 1 when `keepdims`: on a CPU stream,
/// float32 is composed as max + log(sum(exp(x - max))) with the vectorized `exp` (MLX's CPU
/// `LogSumExp` kernel evaluates its `exp` one element at a time); anything else goes through
/// MLX's `logsumexp`. Rows whose max is infinite give that max, as MLX's does.
pub(crate) fn logsumexp(
    a: &Array,
    axis: i32,
    keepdims: bool,
) -> Result<Array, mlx_rs::error::Exception> {
    // SAFETY: the input is live for the call.
    fast_op("logsumexp", |res, s| unsafe {
        mlx_sys::burn_mlx_logsumexp(res, a.as_ptr(), axis, keepdims, s)
    })
}

/// Elementwise bitwise NOT.
pub(crate) fn bitwise_invert(a: &Array) -> Result<Array, MlxError> {
    // SAFETY: the input is live for the call.
    array_op("bitwise_not", |res, s| unsafe {
        mlx_sys::mlx_bitwise_invert(res, a.as_ptr(), s)
    })
}

/// `a[start:stop:strides]` over every axis (negative strides walk backwards).
pub(crate) fn slice(
    a: &Array,
    start: &[i32],
    stop: &[i32],
    strides: &[i32],
) -> Result<Array, MlxError> {
    // SAFETY: the slices outlive the call and their lengths are passed with them.
    array_op("slice", |res, s| unsafe {
        mlx_sys::mlx_slice(
            res,
            a.as_ptr(),
            start.as_ptr(),
            start.len(),
            stop.as_ptr(),
            stop.len(),
            strides.as_ptr(),
            strides.len(),
            s,
        )
    })
}

/// A copy of `src` with `src[start:stop:strides] = update`.
pub(crate) fn slice_update(
    src: &Array,
    update: &Array,
    start: &[i32],
    stop: &[i32],
    strides: &[i32],
) -> Result<Array, MlxError> {
    // SAFETY: as in `slice`.
    array_op("slice_assign", |res, s| unsafe {
        mlx_sys::mlx_slice_update(
            res,
            src.as_ptr(),
            update.as_ptr(),
            start.as_ptr(),
            start.len(),
            stop.as_ptr(),
            stop.len(),
            strides.as_ptr(),
            strides.len(),
            s,
        )
    })
}

/// A copy of `src` with `update` written at the positions `start` (an integer array, one value
/// per axis in `axes`) along `axes`: the start is read on the device, so one graph (a compiled
/// step) serves every position.
pub(crate) fn slice_update_dynamic(
    src: &Array,
    update: &Array,
    start: &Array,
    axes: &[i32],
) -> Result<Array, MlxError> {
    // SAFETY: the inputs are live for the call; `axes` outlives it and its length goes with it.
    array_op("slice_assign_at", |res, s| unsafe {
        mlx_sys::mlx_slice_update_dynamic(
            res,
            src.as_ptr(),
            update.as_ptr(),
            start.as_ptr(),
            axes.as_ptr(),
            axes.len(),
            s,
        )
    })
}

/// `a` plus `values` added at `indices` along `axis` (Burn's `scatter_add`).
pub(crate) fn scatter_add_axis(
    a: &Array,
    indices: &Array,
    values: &Array,
    axis: i32,
) -> Result<Array, MlxError> {
    // SAFETY: the inputs are live for the call.
    array_op("scatter_add", |res, s| unsafe {
        mlx_sys::mlx_scatter_add_axis(res, a.as_ptr(), indices.as_ptr(), values.as_ptr(), axis, s)
    })
}

/// Whether `a`'s data is laid out in row-major order without gaps, so that its buffer can be
/// read as a flat slice. Only meaningful once `a` is evaluated (MLX sets the flags then).
pub(crate) fn is_row_contiguous(a: &Array) -> bool {
    let mut res = false;
    // SAFETY: `a` is a live array handle for the call; `res` is a writable bool.
    let rc = unsafe { mlx_sys::_mlx_array_is_row_contiguous(&mut res, a.as_ptr()) };
    rc == 0 && res
}

/// How many values [`int_constant`] keeps per thread.
const MAX_CONSTANTS: usize = 64;

/// `value` as a 0-d integer array of `dtype` (an operand of a GPU kernel, such as a clamp's
/// bounds). On the GPU (`gpu`), a view into a 16-byte buffer that the device writes, made once
/// per thread and value (evaluated with the first graph that reads it) and kept for the first
/// [`MAX_CONSTANTS`] values: an array of 8 bytes or less made on the host lives in MLX's small
/// pool of managed memory, where MLX also puts every other host-made scalar, and a kernel reading
/// it stalls on a page fault whenever the host has written the pool since (as it does while
/// building the next step of a loop). Elsewhere, inside an MLX trace (whose arrays must not
/// outlive it), or past that count, a host scalar.
pub(crate) fn int_constant(
    value: i64,
    dtype: mlx_rs::Dtype,
    gpu: bool,
) -> Result<Array, mlx_rs::error::Exception> {
    let host = || Array::from_slice(&[value], &[]).as_dtype(dtype);
    if !gpu || crate::trace::is_tracing() {
        return host();
    }
    thread_local! {
        static MADE: std::cell::RefCell<Vec<(i64, mlx_rs::Dtype, Array)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    MADE.with(|cell| {
        let mut made = cell.borrow_mut();
        if let Some((.., a)) = made.iter().find(|(v, d, _)| *v == value && *d == dtype) {
            return Ok(a.clone());
        }
        let scalar = host()?;
        if made.len() >= MAX_CONSTANTS {
            return Ok(scalar);
        }
        // A copy of the broadcast scalar is a buffer the GPU writes (device memory, more than
        // 8 bytes), and its first element a view of it.
        let n = (16 / scalar.item_size()).max(1) as i32;
        let made_here = mlx_rs::ops::broadcast_to(&scalar, &[n])
            .and_then(|b| b.contiguous())
            .ok()
            .and_then(|buffer| slice(&buffer, &[0], &[1], &[1]).ok())
            .and_then(|first| first.reshape(&[]).ok());
        match made_here {
            Some(c) => {
                made.push((value, dtype, c.clone()));
                Ok(c)
            }
            None => Ok(scalar),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MlxDevice;
    use crate::graph::pending_primitives;
    use crate::tensor::MlxTensor;
    use mlx_rs::ops;

    type Op = fn(&Array) -> Result<Array, mlx_rs::error::Exception>;

    /// Inputs that cover each kernel's branches, their edges and the special values.
    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (-40_000..=40_000).map(|i| i as f32 * 0.0025).collect();
        v.extend((-300..=300).map(|i| i as f32 * 0.5));
        v.extend((-45..=38).map(|e| 10f32.powi(e)));
        v.extend((-45..=38).map(|e| -(10f32.powi(e))));
        v.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            88.72,
            88.73,
            88.8,
            -87.33,
            -103.9,
            -104.5,
            0.624_999_9,
            0.625,
            0.999_999_9,
            1.0,
            3.999_999_8,
            4.0,
            f32::MIN_POSITIVE,
            f32::MAX,
            f32::MIN,
        ]);
        v
    }

    /// Runs `f` on the inputs on the CPU and returns the values and the primitives it built.
    fn run_cpu(
        f: impl Fn(&Array) -> Result<Array, mlx_rs::error::Exception>,
    ) -> (Vec<f32>, Vec<String>) {
        let x = inputs();
        let (out, names) = MlxDevice::Cpu.scope(|| {
            let a = Array::from_slice(&x, &[x.len() as i32]);
            let out = MlxTensor::from_array(f(&a).unwrap(), MlxDevice::Cpu);
            let names = pending_primitives(&[&out]).unwrap().into_keys().collect();
            (out, names)
        });
        out.array.eval().unwrap();
        (out.array.as_slice::<f32>().to_vec(), names)
    }

    /// Whether `a` and `b` agree to `ulps` units in the last place of the larger, or both are
    /// NaN, or both are tiny.
    fn close(a: f32, b: f32, ulps: f32) -> bool {
        if a.is_nan() || b.is_nan() {
            return a.is_nan() && b.is_nan();
        }
        if a == b {
            return true;
        }
        // Below 1e-30 only the absolute difference counts: MLX's own `exp` loses digits as
        // it nears the subnormal range (exp(-87.335): 1.1773172e-38 against 1.1773127e-38,
        // which double precision confirms).
        let scale = a.abs().max(b.abs());
        if scale < 1e-30 {
            return (a - b).abs() < 1e-36;
        }
        (a - b).abs() <= ulps * scale * f32::EPSILON
    }

    #[test]
    fn fast_cpu_kernels_are_used_on_the_cpu() {
        let ops: [(&str, Op); 4] = [
            ("Exp", exp),
            ("Tanh", tanh),
            ("Erf", erf),
            ("Sigmoid", sigmoid),
        ];
        for (name, fast) in ops {
            let (_, prims) = run_cpu(fast);
            assert!(
                prims.contains(&format!("BurnMlxFast{name}")),
                "{name}: the fast kernel was not used: {prims:?}"
            );
        }
    }

    #[test]
    fn fast_exp_tanh_and_sigmoid_match_double_precision() {
        // (MLX's own CPU `exp` is less accurate than this at large negative arguments:
        // exp(-70.32) is 2.88678e-31 there, 2.8867699e-31 correctly rounded and here.)
        let x = inputs();
        type Reference = fn(f64) -> f64;
        let cases: [(&str, Op, Reference); 3] = [
            ("exp", exp, f64::exp),
            ("tanh", tanh, f64::tanh),
            ("sigmoid", sigmoid, |v| 1.0 / (1.0 + (-v).exp())),
        ];
        for (name, fast, reference) in cases {
            let (got, _) = run_cpu(fast);
            for (&xi, &g) in x.iter().zip(&got) {
                let want = reference(xi as f64) as f32;
                assert!(close(g, want, 3.0), "{name}({xi:e}) = {g:e}, want {want:e}");
            }
        }
    }

    /// erf in double precision by its Taylor series (|x| <= 4.5; ±1 beyond, as in float32):
    /// the reference for the float32 kernel. Rust's standard library has no `erf`, and MLX's
    /// own CPU `erf` is off by up to about 5 ulps (erf(-0.3425): -0.37187523 there,
    /// -0.37187538 correctly rounded).
    fn erf_f64(x: f64) -> f64 {
        if x.is_nan() {
            return x;
        }
        if x.abs() > 4.5 {
            return x.signum();
        }
        let (mut sum, mut power, mut factorial) = (0.0f64, x, 1.0f64);
        for n in 0..200 {
            let term = power / (factorial * (2 * n + 1) as f64);
            sum += if n % 2 == 0 { term } else { -term };
            if term.abs() < 1e-18 * sum.abs().max(1e-300) {
                break;
            }
            power *= x * x;
            factorial *= (n + 1) as f64;
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    }

    #[test]
    fn fast_erf_matches_double_precision() {
        let x = inputs();
        let (got, _) = run_cpu(erf);
        for (&xi, &g) in x.iter().zip(&got) {
            let want = erf_f64(xi as f64) as f32;
            assert!(close(g, want, 3.0), "erf({xi:e}) = {g:e}, want {want:e}");
        }
    }

    /// Rows of 4 for the reductions: large, equal, -inf and all -inf entries.
    fn reduction_rows() -> Vec<f32> {
        let ninf = f32::NEG_INFINITY;
        vec![
            1.0, 2.0, 3.0, -1.0, 1000.0, 1000.0, -1000.0, 0.0, ninf, 0.5, 2.0, -3.0, ninf, ninf,
            ninf, ninf,
        ]
    }

    #[test]
    fn cpu_softmax_matches_mlx_softmax() {
        // The rows of `reduction_rows`, over both axes.
        let x = reduction_rows();
        MlxDevice::Cpu.scope(|| {
            let a = Array::from_slice(&x, &[4, 4]);
            let t = MlxTensor::from_array(softmax(&a, -1).unwrap(), MlxDevice::Cpu);
            let prims = pending_primitives(&[&t]).unwrap();
            assert!(prims.contains_key("BurnMlxFastExp"), "{prims:?}");
            for axis in [-1, 0] {
                let got = softmax(&a, axis).unwrap();
                let want = ops::softmax_axis(&a, axis, true).unwrap();
                let got = got.as_slice::<f32>().to_vec();
                let want = want.as_slice::<f32>().to_vec();
                for (g, w) in got.iter().zip(&want) {
                    assert!(close(*g, *w, 4.0), "axis {axis}: {got:?} against {want:?}");
                }
            }
        });
    }

    #[test]
    fn cpu_logsumexp_matches_mlx_logsumexp() {
        // The rows of `reduction_rows` and rows with +inf and NaN, over both axes, with and
        // without the reduced axis; and its gradient (the softmax) through MLX's autodiff.
        let mut x = reduction_rows();
        x.extend([
            1.0,
            f32::INFINITY,
            2.0,
            f32::NEG_INFINITY,
            0.0,
            f32::NAN,
            1.0,
            2.0,
        ]);
        MlxDevice::Cpu.scope(|| {
            let a = Array::from_slice(&x, &[6, 4]);
            let t = MlxTensor::from_array(logsumexp(&a, -1, true).unwrap(), MlxDevice::Cpu);
            let prims = pending_primitives(&[&t]).unwrap();
            assert!(prims.contains_key("BurnMlxFastExp"), "{prims:?}");
            for (axis, keepdims) in [(-1, true), (1, false), (0, true), (0, false)] {
                let got = logsumexp(&a, axis, keepdims).unwrap();
                let want = ops::logsumexp_axis(&a, axis, keepdims).unwrap();
                assert_eq!(
                    got.shape(),
                    want.shape(),
                    "axis {axis}, keepdims {keepdims}"
                );
                let got = got.as_slice::<f32>().to_vec();
                let want = want.as_slice::<f32>().to_vec();
                for (g, w) in got.iter().zip(&want) {
                    assert!(close(*g, *w, 4.0), "axis {axis}: {got:?} against {want:?}");
                }
            }
            // The gradient of a sum of logsumexps is each row's softmax: against f64. Rounding
            // x - max to f32 (spacing 1.9e-6 at 29.6) already moves exp(x - max) by up to about
            // 1e-6 relative; measured here 7.6e-7 (MLX's own logsumexp: 2.4e-6).
            let rows = [[-2.0f32, -0.3, 0.0], [0.4, 1.7, 30.0]];
            let finite = Array::from_slice(rows.as_flattened(), &[2, 3]);
            let mut g = mlx_rs::transforms::grad(|a: &Array| logsumexp(a, -1, true)?.sum(None));
            let got = g(&finite).unwrap().as_slice::<f32>().to_vec();
            let want: Vec<f64> = rows
                .iter()
                .flat_map(|r| {
                    let m = r.iter().fold(f64::MIN, |m, &v| m.max(v as f64));
                    let s: f64 = r.iter().map(|&v| (v as f64 - m).exp()).sum();
                    r.iter().map(move |&v| (v as f64 - m).exp() / s)
                })
                .collect();
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (*g as f64 - w).abs() <= 1.5e-6 * w.abs(),
                    "{got:?} against {want:?}"
                );
            }
        });
    }

    #[test]
    fn fast_entries_report_mlx_messages() {
        // An axis out of range: MLX's own text (which names the axis) reaches the caller, on
        // the fast path (float32) and on MLX's path (float16) alike.
        MlxDevice::Cpu.scope(|| {
            let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
            for x in [a.clone(), a.as_dtype(mlx_rs::Dtype::Float16).unwrap()] {
                let e = softmax(&x, 5).unwrap_err().to_string();
                assert!(e.contains("softmax") && e.contains("axis"), "{e}");
            }
            // SAFETY: the input is live for the call.
            let e = fast_op("exp", |res, s| unsafe {
                mlx_sys::burn_mlx_fast_unary(res, a.as_ptr(), 9, s)
            })
            .unwrap_err()
            .to_string();
            assert!(e.contains("unknown op code 9"), "{e}");
        });
    }

    #[test]
    fn fast_kernels_read_strided_inputs() {
        // A transposed view and a broadcast (stride 0) are not contiguous in memory: the kernel
        // gathers them first.
        MlxDevice::Cpu.scope(|| {
            let base = Array::from_slice(&[-3.0f32, -0.5, 0.0, 0.7, 2.0, 9.0], &[2, 3]);
            let t = base.transpose().unwrap();
            let row = Array::from_slice(&[-1.5f32, 0.25, 3.0], &[1, 3]);
            let b = ops::broadcast_to(&row, &[4, 3]).unwrap();
            for view in [t, b] {
                let got = exp(&view).unwrap();
                let want = view.exp().unwrap();
                // A transposed input gives a transposed output: read both in row order.
                let got = got.reshape(&[-1]).unwrap().as_slice::<f32>().to_vec();
                let want = want.reshape(&[-1]).unwrap().as_slice::<f32>().to_vec();
                assert_eq!(got.len(), want.len());
                for (g, w) in got.iter().zip(&want) {
                    assert!(close(*g, *w, 4.0), "{got:?} against {want:?}");
                }
            }
        });
    }

    #[test]
    fn mlx_autodiff_differentiates_the_fast_kernels() {
        MlxDevice::Cpu.scope(|| {
            let x = Array::from_slice(&[-2.0f32, -0.3, 0.0, 0.4, 1.7], &[5]);
            let cases: [(Op, Op); 4] = [
                (exp, |a| a.exp()),
                (tanh, |a| ops::tanh(a)),
                (erf, |a| ops::erf(a)),
                (sigmoid, |a| ops::sigmoid(a)),
            ];
            for (fast, mlx) in cases {
                let grad = |f: Op| {
                    let mut g = mlx_rs::transforms::grad(move |a: &Array| f(a)?.sum(None));
                    let out = g(&x).unwrap();
                    out.as_slice::<f32>().to_vec()
                };
                let got = grad(fast);
                let want = grad(mlx);
                for (g, w) in got.iter().zip(&want) {
                    assert!(close(*g, *w, 8.0), "{got:?} against {want:?}");
                }
            }
        });
    }

    /// The device-made form (asked for with `gpu`; it builds on any stream, so the CPU runs it
    /// too) and the host form hold the value in the dtype, as a 0-d array, and a value asked for
    /// again is the same buffer.
    #[test]
    fn int_constants_hold_their_value_and_dtype() {
        let device = if MlxDevice::gpu_available() {
            MlxDevice::Gpu
        } else {
            MlxDevice::Cpu
        };
        device.scope(|| {
            for gpu in [true, false] {
                for (value, dtype) in [
                    (7_001, mlx_rs::Dtype::Int64),
                    (151_935, mlx_rs::Dtype::Int64),
                    (-3, mlx_rs::Dtype::Int32),
                    (255, mlx_rs::Dtype::Uint8),
                ] {
                    let c = int_constant(value, dtype, gpu).unwrap();
                    assert_eq!((c.shape(), c.dtype()), (&[][..], dtype), "gpu {gpu}");
                    let read = c.as_dtype(mlx_rs::Dtype::Int64).unwrap();
                    assert_eq!(read.item_exact::<i64>(), value, "{dtype:?}, gpu {gpu}");
                }
            }
            // Both held at once, so that a freed buffer cannot come back as the second one.
            let (first, again) = (
                int_constant(7_001, mlx_rs::Dtype::Int64, true).unwrap(),
                int_constant(7_001, mlx_rs::Dtype::Int64, true).unwrap(),
            );
            first.eval().unwrap();
            again.eval().unwrap();
            assert_eq!(
                first.as_slice::<i64>().as_ptr(),
                again.as_slice::<i64>().as_ptr(),
                "a kept constant is one buffer"
            );
        });
    }
}
