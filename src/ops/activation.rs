//! Burn's `ActivationOps` on MLX: native kernels where MLX has them.

use super::base::{binary, unary};
use crate::backend::Mlx;
use crate::native;
use crate::tensor::scalar_array;
use burn_backend::ops::ActivationOps;
use burn_backend::tensor::FloatTensor;
use mlx_rs::error::Exception;
use mlx_rs::{ops, Array, Dtype};
use std::cell::RefCell;
use std::collections::HashMap;

impl ActivationOps<Self> for Mlx {
    fn relu(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        let zero = scalar_array(burn_backend::Scalar::Float(0.0), tensor.array.dtype());
        unary(tensor, "relu", |a| ops::maximum(a, &zero))
    }

    fn relu_backward(output: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        binary(output, grad, "relu_backward", |out, g| {
            let zero = Array::from_f32(0.0).as_dtype(g.dtype())?;
            ops::select(&out.gt(&zero)?, g, &zero)
        })
    }

    fn gelu(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        unary(tensor, "gelu", |x| gelu(std::slice::from_ref(x)))
    }

    fn gelu_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        binary(x, grad, "gelu_backward", |x, g| {
            gelu_backward(&[x.clone(), g.clone()])
        })
    }

    fn sigmoid(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        unary(tensor, "sigmoid", native::sigmoid)
    }

    fn sigmoid_backward(output: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        binary(output, grad, "sigmoid_backward", |s, g| {
            let one = Array::from_f32(1.0).as_dtype(s.dtype())?;
            s.multiply(&one.subtract(s)?)?.multiply(g)
        })
    }

    fn log_sigmoid(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
        // log(sigmoid(x)) = -softplus(-x) = min(x, 0) - log1p(exp(-|x|)), stable for any x.
        unary(tensor, "log_sigmoid", |x| {
            let zero = Array::from_f32(0.0).as_dtype(x.dtype())?;
            let m = ops::minimum(x, &zero)?;
            m.subtract(&x.abs()?.negative()?.exp()?.log1p()?)
        })
    }

    fn softmax(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        if tensor.array.size() == 0 {
            return tensor;
        }
        // `precise`: half-precision inputs accumulate in f32.
        unary(tensor, "softmax", |a| native::softmax(a, dim as i32))
    }

    fn log_softmax(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
        if tensor.array.size() == 0 {
            return tensor;
        }
        // x - logsumexp(x) cancels catastrophically in f16/bf16 for large logits (the spacing of
        // f16 at 1000 is 0.5), so half precision is computed in f32 and rounded once.
        unary(tensor, "log_softmax", |a| {
            let dtype = a.dtype();
            if matches!(dtype, Dtype::Float16 | Dtype::Bfloat16) {
                let x = a.as_dtype(Dtype::Float32)?;
                x.subtract(&native::logsumexp(&x, dim as i32, true)?)?
                    .as_dtype(dtype)
            } else {
                a.subtract(&native::logsumexp(a, dim as i32, true)?)
            }
        })
    }
}

/// `x · (1 + erf(x / √2)) / 2`, the exact GELU Burn defines.
///
/// Composed from MLX ops here, so that a graph of Burn's ops stays open to burn-mlx's
/// automatic fusion pass (which leaves alone any graph holding an MLX-compiled function);
/// `nn::functional::gelu` runs it compiled where the graph already holds such functions.
pub(crate) fn gelu(xs: &[Array]) -> Result<Array, Exception> {
    let x = &xs[0];
    let c = |v: f64| scalar_array(burn_backend::Scalar::Float(v), x.dtype());
    let e = native::erf(&x.multiply(c(std::f64::consts::FRAC_1_SQRT_2))?)?;
    x.multiply(&e.add(c(1.0))?)?.multiply(c(0.5))
}

/// SwiGLU on `[gate, up]`: `gate · sigmoid(gate) · up` (`nn::functional::swiglu`'s forward).
pub(crate) fn swiglu(xs: &[Array]) -> Result<Array, Exception> {
    let (gate, up) = (&xs[0], &xs[1]);
    gate.multiply(ops::sigmoid(gate)?)?.multiply(up)
}

/// Burn's gradient for GELU (every backend's, burn-ndarray's included), which is the
/// derivative of the tanh approximation: with u = c2 x + c1 x^3 and v = c4 x + c3 x^3,
/// `y = 0.5 (1 + tanh u) + v (1 - tanh^2 u) = (1 + t) (0.5 + v (1 - t))`, `t = tanh u`, times
/// the incoming gradient. Burn's default builds it from 14 ops with `powi(x, 3)` (a libm `pow`
/// per element on MLX's CPU); here x^2 is computed once and the polynomial is factored.
pub(crate) fn gelu_backward(xs: &[Array]) -> Result<Array, Exception> {
    let (x, g) = (&xs[0], &xs[1]);
    let c = |v: f64| scalar_array(burn_backend::Scalar::Float(v), x.dtype());
    let (one, half) = (c(1.0), c(0.5));
    let x2 = x.square()?;
    let u = x.multiply(&x2.multiply(c(0.035_677_4))?.add(c(0.797_885))?)?;
    let v = x.multiply(&x2.multiply(c(0.053_516_1))?.add(c(0.398_942))?)?;
    let t = native::tanh(&u)?;
    let right = v.multiply(&one.subtract(&t)?)?.add(&half)?;
    one.add(&t)?.multiply(&right)?.multiply(g)
}

/// A compiled MLX function of arrays.
type ArrayFn = Box<dyn FnMut(&[Array]) -> Result<Vec<Array>, Exception>>;

thread_local! {
    /// The compiled elementwise functions of [`compiled_on_gpu`], by name (MLX keeps one trace
    /// per input dtype).
    static COMPILED: RefCell<HashMap<&'static str, ArrayFn>> = RefCell::new(HashMap::new());
}

/// `f` on `inputs`: on the GPU as one MLX-compiled function, whose elementwise ops MLX runs as
/// one fused kernel (GELU's forward is five kernels composed, its gradient twelve, each a pass
/// over the feed-forward activations); on the CPU, where burn-mlx's vectorized `erf` and `tanh`
/// are faster than MLX's compiled CPU code, and while burn-mlx records a trace or an export,
/// `f` itself.
pub(crate) fn compiled_on_gpu(
    name: &'static str,
    inputs: &[Array],
    gpu: bool,
    f: fn(&[Array]) -> Result<Array, Exception>,
) -> Result<Array, Exception> {
    if !gpu || crate::trace::is_tracing() || crate::trace::is_exporting() {
        return f(inputs);
    }
    COMPILED.with(|cell| {
        let mut map = cell.borrow_mut();
        let compiled = map.entry(name).or_insert_with(|| {
            let traced = move |xs: &[Array]| f(xs).map(|y| vec![y]);
            Box::new(mlx_rs::transforms::compile::compile(traced, true))
        });
        compiled(inputs).map(|mut out| out.remove(0))
    })
}
