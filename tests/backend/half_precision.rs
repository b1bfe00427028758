//! Half precision (f16 and bf16) for each op family: `Mlx` against burn-ndarray in f32.
//!
//! Every case runs the same body on both sides (tests/common): on `Mlx` in the half type, on the
//! reference in f32 from inputs already rounded to the half type, so the inputs are the same
//! numbers and only the arithmetic differs.
//!
//! **Tolerance rule.** A value passes when `|got - ref| <= k·ε·(1 + |ref|)`, where ε is the
//! dtype's machine epsilon (2^-10 for f16, 2^-7 for bf16) and `k` counts the half-precision
//! roundings the op's result may carry on a backend that rounds each op's output once and
//! accumulates in f32: `k = 4` for one elementwise op or one accumulated reduction (the output
//! rounding plus the inputs' rounding carried through the function's condition number, kept near
//! 1 by the input ranges), `k = 8` for composite ops (softmax, fmod, attention, pooling) and
//! gradients (a few rounded intermediates; CTC too, whose recursions run in f32). The harness
//! never allows less than its half-precision floors (`Tol::F16` ≈ 10ε, `Tol::BF16` ≈ 5ε), so
//! for f16 the effective bound is `max(k, 10.24)·ε`.
//!
//! A backend that accumulates in the half type fails these cases by far more than the bound: a
//! sum of 5,346 f16 ones stops at 2,048, the mean of 0..1024 overflows f16, a 2,048-long cumulative
//! sum drifts by tens of ulps. Those shapes are here on purpose.

use crate::common::*;
use burn_tensor::backend::{AutodiffBackend, Backend};
use burn_tensor::ops::{AttentionModuleOptions, ConvOptions, ConvTransposeOptions};
use burn_tensor::{activation, module, DType, Int, Tensor, TensorData};

/// The dtypes of this file.
const HALF: [DType; 2] = [DType::F16, DType::BF16];

/// The dtype's machine epsilon (the gap between 1 and the next value).
fn eps(d: DType) -> f64 {
    match d {
        DType::F16 => f64::powi(2.0, -10),
        DType::BF16 => f64::powi(2.0, -7),
        _ => f64::from(f32::EPSILON),
    }
}

/// The tolerance of the rule above: `k` roundings of the dtype.
fn eps_tol(d: DType, k: f64) -> Tol {
    Tol {
        rtol: k * eps(d),
        atol: k * eps(d),
    }
}

/// Runs `case` in f16 and bf16 against the f32 reference with `k` roundings allowed.
fn check<C: Case>(name: &str, case: &C, k: f64) {
    let mut f = Failures::new(name);
    for d in HALF {
        f.check(case, &format!("{d:?}"), d, DType::I64, eps_tol(d, k));
    }
    f.finish();
}

/// [`check`] through `Autodiff` (forward values and gradients).
fn check_ad<C: AdCase>(name: &str, case: &C, k: f64) {
    let mut f = Failures::new(name);
    for d in HALF {
        f.check_ad(case, &format!("{d:?}"), d, DType::I64, eps_tol(d, k));
    }
    f.finish();
}

/// A forward case from a closure-like body: `case!(name, k, |ctx| body)`.
macro_rules! case {
    ($name:ident, $k:expr, |$ctx:ident| $body:expr) => {
        #[test]
        fn $name() {
            struct C;
            impl Case for C {
                fn run<B: Backend>(&self, $ctx: &Ctx<B>) -> Vec<TensorData> {
                    outs($body)
                }
            }
            check(stringify!($name), &C, $k);
        }
    };
}

/// A gradient case: `case_ad!(name, k, |ctx| body)` with `B: AutodiffBackend`.
macro_rules! case_ad {
    ($name:ident, $k:expr, |$ctx:ident| $body:expr) => {
        #[test]
        fn $name() {
            struct C;
            impl AdCase for C {
                fn run<B: AutodiffBackend>(&self, $ctx: &Ctx<B>) -> Vec<TensorData> {
                    outs($body)
                }
            }
            check_ad(stringify!($name), &C, $k);
        }
    };
}

// ---------------------------------------------------------------------------------------------
// Elementwise and unary math
// ---------------------------------------------------------------------------------------------

case!(unary_math, 4.0, |ctx| {
    let x = ctx.f([64, 33], (-3.0, 3.0));
    let p = ctx.f([64, 33], (0.1, 4.0));
    (
        x.clone().exp(),
        p.clone().log(),
        p.clone().sqrt(),
        x.clone().tanh(),
        x.clone().erf(),
        activation::sigmoid(x.clone()),
        p.powf_scalar(1.5),
        x.abs().neg(),
    )
});

case!(trig, 4.0, |ctx| {
    // Ranges where each function's condition number stays near 1.
    let x = ctx.f([48, 40], (-3.0, 3.0));
    let t = ctx.f([48, 40], (-1.2, 1.2));
    let u = ctx.f([48, 40], (-0.9, 0.9));
    let y = ctx.f([48, 40], Dist::nz(-2.0, 2.0, 0.2));
    (
        x.clone().sin(),
        x.clone().cos(),
        t.clone().tan(),
        u.clone().asin(),
        u.clone().acos(),
        x.clone().atan(),
        t.clone().sinh(),
        x.clone().cosh(),
        u.atanh(),
        x.atan2(y),
    )
});

case_ad!(trig_grads, 8.0, |ctx| {
    let x = ctx.f([24, 20], (-1.2, 1.2)).require_grad();
    let y = x.clone().sin() + x.clone().cos() * x.clone().tan() + x.clone().atan();
    let g = backward_weighted(ctx, y.clone());
    (y, x.grad(&g))
});

// ---------------------------------------------------------------------------------------------
// Reductions: accumulated in f32, rounded once
// ---------------------------------------------------------------------------------------------

case!(sum_of_many_ones, 4.0, |ctx| {
    // 5,346 = 11 · 18 · 27, the output size of the conv_transpose3d below; past 2,048 an f16
    // accumulator can no longer add 1.
    let x: Tensor<_, 3> = ctx.fd(TensorData::ones::<f32, _>([11, 18, 27]));
    (
        x.clone().sum(),
        x.clone().reshape([5346]).sum_dim(0),
        x.clone().sum_dim(1).sum_dim(2),
        x.mean(),
    )
});

case!(mean_past_the_half_maximum, 4.0, |ctx| {
    // The running sum of 0..1024 (523,776) passes f16's maximum (65,504); the mean does not.
    let x = ctx.fd::<1>(TensorData::new(
        (0..1024).map(|v| v as f32).collect(),
        [1024],
    ));
    let y = x.clone().reshape([2, 2, 256]).permute([1, 2, 0]);
    (
        x.clone().mean(),
        x.reshape([4, 256]).mean_dim(1),
        y.mean_dim(0).mean_dim(1),
    )
});

case!(reductions_random, 4.0, |ctx| {
    let x = ctx.f([8, 4096], (0.0, 1.0));
    let s = ctx.f([4096, 8], (-1.0, 1.0));
    let p = ctx.f([6, 40], (0.95, 1.05));
    (
        x.clone().sum_dim(1),
        x.clone().mean_dim(1),
        x.swap_dims(0, 1).sum_dim(0),
        s.mean_dim(0),
        p.clone().prod_dim(1),
        p.prod(),
    )
});

case_ad!(reduction_grads, 4.0, |ctx| {
    let x = ctx.f([16, 3000], (-1.0, 1.0)).require_grad();
    let y = x.clone().sum_dim(1) + x.clone().mean_dim(1);
    let g = backward_weighted(ctx, y.clone());
    (y, x.grad(&g))
});

// ---------------------------------------------------------------------------------------------
// Cumulative ops
// ---------------------------------------------------------------------------------------------

case!(cumulative, 4.0, |ctx| {
    let x = ctx.f([4, 2048], (0.0, 1.0));
    let p = ctx.f([4, 64], (0.97, 1.03));
    let m = ctx.f([4, 300], (-1.0, 1.0));
    (
        x.clone().cumsum(1),
        x.swap_dims(0, 1).cumsum(0),
        p.cumprod(1),
        m.clone().cummax(1),
        m.cummin(1),
    )
});

case_ad!(cumsum_grads, 4.0, |ctx| {
    let x = ctx.f([3, 1500], (0.0, 1.0)).require_grad();
    let y = x.clone().cumsum(1);
    let g = backward_weighted(ctx, y.clone());
    (y, x.grad(&g))
});

// ---------------------------------------------------------------------------------------------
// Matmul
// ---------------------------------------------------------------------------------------------

case_ad!(matmul, 4.0, |ctx| {
    let a = ctx.f([2, 48, 512], (-1.0, 1.0)).require_grad();
    let b = ctx.f([2, 512, 40], (-1.0, 1.0)).require_grad();
    // 512 products per output: one rounding at the end when the sum is accumulated in f32.
    let y = a.clone().matmul(b.clone()).div_scalar(16.0);
    let g = backward_weighted(ctx, y.clone());
    (y, a.grad(&g), b.grad(&g))
});

// ---------------------------------------------------------------------------------------------
// Softmax and activations
// ---------------------------------------------------------------------------------------------

case!(softmax_and_activations, 8.0, |ctx| {
    let x = ctx.f([6, 1000], (-6.0, 6.0));
    (
        activation::softmax(x.clone(), 1),
        activation::log_softmax(x.clone(), 1),
        activation::softmax(x.clone(), 0),
        activation::gelu(x.clone()),
        activation::silu(x.clone()),
        activation::log_sigmoid(x),
    )
});

case_ad!(softmax_grads, 8.0, |ctx| {
    let x = ctx.f([4, 700], (-4.0, 4.0)).require_grad();
    let y = activation::softmax(x.clone(), 1) * 100.0 + activation::log_softmax(x.clone(), 1);
    let g = backward_weighted(ctx, y.clone());
    (y, x.grad(&g))
});

// ---------------------------------------------------------------------------------------------
// Convolutions (forward and gradients)
// ---------------------------------------------------------------------------------------------

case_ad!(conv2d_grads, 8.0, |ctx| {
    let x = ctx.f([2, 4, 14, 13], (-1.0, 1.0)).require_grad();
    let w = ctx.f([6, 2, 3, 3], (-0.5, 0.5)).require_grad();
    let b = ctx.f([6], (-1.0, 1.0)).require_grad();
    let opts = ConvOptions::new([2, 1], [1, 2], [1, 2], 2);
    let y = module::conv2d(x.clone(), w.clone(), Some(b.clone()), opts);
    let g = backward_weighted(ctx, y.clone());
    (y, x.grad(&g), w.grad(&g), b.grad(&g))
});

case_ad!(conv_transpose2d_grads, 8.0, |ctx| {
    let x = ctx.f([2, 4, 9, 8], (-1.0, 1.0)).require_grad();
    let w = ctx.f([4, 3, 3, 4], (-0.5, 0.5)).require_grad();
    let b = ctx.f([6], (-1.0, 1.0)).require_grad();
    let opts = ConvTransposeOptions::new([2, 3], [1, 2], [1, 0], [1, 2], 2);
    let y = module::conv_transpose2d(x.clone(), w.clone(), Some(b.clone()), opts);
    let g = backward_weighted(ctx, y.clone());
    (y, x.grad(&g), w.grad(&g), b.grad(&g))
});

case_ad!(conv_transpose3d_groups_grads, 8.0, |ctx| {
    // Burn's `test_conv_transpose3d_complex_groups` configuration: the bias gradient sums
    // 11 · 18 · 27 = 5,346 output gradients per channel.
    let x = ctx.f([1, 4, 6, 6, 6], (-1.0, 1.0)).require_grad();
    let w = ctx.f([4, 1, 2, 3, 4], (-0.5, 0.5)).require_grad();
    let b = ctx.f([2], (-1.0, 1.0)).require_grad();
    let opts = ConvTransposeOptions::new([2, 3, 4], [1, 2, 3], [1, 2, 3], [1, 2, 3], 2);
    let y = module::conv_transpose3d(x.clone(), w.clone(), Some(b.clone()), opts);
    // Plain `sum` (every upstream gradient 1), as Burn's test does.
    let g = y.clone().sum().backward();
    (y, x.grad(&g), w.grad(&g), b.grad(&g))
});

case_ad!(conv_transpose3d_grads, 8.0, |ctx| {
    let x = ctx.f([2, 2, 4, 4, 4], (-1.0, 1.0)).require_grad();
    let w = ctx.f([2, 2, 3, 3, 3], (-0.5, 0.5)).require_grad();
    let b = ctx.f([2], (-1.0, 1.0)).require_grad();
    let opts = ConvTransposeOptions::new([1, 1, 1], [0, 0, 0], [0, 0, 0], [1, 1, 1], 1);
    let y = module::conv_transpose3d(x.clone(), w.clone(), Some(b.clone()), opts);
    let g = backward_weighted(ctx, y.clone());
    (y, x.grad(&g), w.grad(&g), b.grad(&g))
});

// ---------------------------------------------------------------------------------------------
// Pooling
// ---------------------------------------------------------------------------------------------

case_ad!(pooling_grads, 8.0, |ctx| {
    let x = ctx.f([2, 3, 17, 16], (-2.0, 2.0)).require_grad();
    let avg = module::avg_pool2d(x.clone(), [3, 3], [2, 2], [1, 1], true, false);
    let avg_ex = module::avg_pool2d(x.clone(), [3, 2], [2, 2], [1, 1], false, true);
    let adaptive = module::adaptive_avg_pool2d(x.clone(), [5, 7]);
    let max = module::max_pool2d(x.clone(), [3, 3], [2, 2], [1, 1], [1, 1], false);
    let y = avg.clone().sum() + avg_ex.clone().sum() + adaptive.clone().sum() + max.clone().sum();
    let g = y.backward();
    (avg, avg_ex, adaptive, max, x.grad(&g))
});

// ---------------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------------

case!(attention, 8.0, |ctx| {
    let q = ctx.f([2, 3, 20, 16], (-1.0, 1.0));
    let k = ctx.f([2, 3, 24, 16], (-1.0, 1.0));
    let v = ctx.f([2, 3, 24, 8], (-1.0, 1.0));
    let mask = ctx.b([2, 3, 20, 24], 0.2);
    let bias = ctx.f([2, 3, 20, 24], (-0.5, 0.5));
    let plain = module::attention(
        q.clone(),
        k.clone(),
        v.clone(),
        None,
        None,
        AttentionModuleOptions::default(),
    );
    let masked = module::attention(
        q.clone(),
        k.clone(),
        v.clone(),
        Some(mask),
        Some(bias),
        AttentionModuleOptions::default(),
    );
    let causal = AttentionModuleOptions {
        is_causal: true,
        softcap: Some(2.0),
        ..Default::default()
    };
    let causal = module::attention(q, k, v, None, None, causal);
    (plain, masked, causal)
});

// ---------------------------------------------------------------------------------------------
// fmod and remainder
// ---------------------------------------------------------------------------------------------

/// Dividends `a = b·q` whose quotients `q` keep at least 0.15 from every integer.
///
/// Burn composes `fmod` as `a - b·trunc(a / b)` from tensor ops, so each step is rounded to the
/// half type, on any backend. A quotient within half an ulp of an integer then truncates to the
/// other side and the result jumps by a whole `b` (seen on `Mlx` and burn-flex alike): that is the
/// half type's resolution, not an op error, so the inputs stay away from those points.
/// With `divisor`, every `b` is that value.
fn fmod_operands(shape: [usize; 2], divisor: Option<f64>, seed: u64) -> (TensorData, TensorData) {
    let b = match divisor {
        Some(d) => TensorData::full(shape.to_vec(), d),
        None => rand_f(&shape, Dist::nz(-3.0, 3.0, 0.5), seed),
    };
    let q = rand_f(&shape, (-6.0, 6.0), seed ^ 0xF00D);
    let a: Vec<f64> = b
        .iter::<f64>()
        .zip(q.iter::<f64>())
        .map(|(b, q)| {
            let whole = q.trunc();
            let frac = 0.15 + 0.7 * (q - whole).abs();
            b * (whole + frac.copysign(q))
        })
        .collect();
    (TensorData::new(a, shape.to_vec()), b)
}

case!(fmod_and_remainder, 8.0, |ctx| {
    let (a, b) = fmod_operands([40, 30], None, 7);
    let (a, b) = (ctx.fd::<2>(a), ctx.fd::<2>(b));
    let (s, _) = fmod_operands([40, 30], Some(1.75), 8);
    let s = ctx.fd::<2>(s);
    // `remainder` is one backend op (computed in f32 and rounded once): any inputs.
    let x = ctx.f([40, 30], (-8.0, 8.0));
    let y = ctx.f([40, 30], Dist::nz(-3.0, 3.0, 0.5));
    (
        a.clone().fmod(b.clone()),
        a.remainder(b),
        s.fmod_scalar(1.75),
        x.clone().remainder(y),
        x.remainder_scalar(-2.5),
    )
});

// ---------------------------------------------------------------------------------------------
// CTC loss and its gradient
// ---------------------------------------------------------------------------------------------

case_ad!(ctc_loss_grads, 8.0, |ctx| {
    // T = 12, N = 3, C = 5 with mixed input and target lengths (Burn's
    // `test_ctc_loss_grad_mixed_input_lengths` shapes), on random logits. (k was 16 while the
    // recursion ran in the half type.)
    let logits = ctx.f([12, 3, 5], (-1.0, 1.0)).require_grad();
    let log_probs = activation::log_softmax(logits.clone(), 2);
    let targets: Tensor<_, 2, Int> = ctx.idx(TensorData::new(
        vec![1i64, 2, 1, 0, 3, 4, 0, 0, 2, 2, 3, 1],
        [3, 4],
    ));
    let input_lengths: Tensor<_, 1, Int> = ctx.idx([12i64, 7, 10]);
    let target_lengths: Tensor<_, 1, Int> = ctx.idx([3i64, 2, 4]);
    let loss = module::ctc_loss(log_probs, targets, input_lengths, target_lengths, 0);
    let g = loss.clone().sum().backward();
    (loss, logits.grad(&g))
});

case_ad!(ctc_loss_grads_long_repeated, 8.0, |ctx| {
    // Burn's composed CTC runs its alpha recursion in the tensor's dtype; `Mlx` runs both CTC
    // recursions in f32 for half inputs (src/ops/module/ctc.rs), so the only half roundings left are
    // log_softmax's output, the loss and gradient outputs and log_softmax's backward: k = 8,
    // over 48 time steps, with repeated labels (no skip transition) and mixed lengths.
    let logits = ctx.f([48, 3, 6], (-2.0, 2.0)).require_grad();
    let log_probs = activation::log_softmax(logits.clone(), 2);
    let targets: Tensor<_, 2, Int> = ctx.idx(TensorData::new(
        vec![
            1i64, 1, 2, 3, 3, 3, 5, 4, 2, 2, 0, 0, //
            5, 5, 5, 5, 1, 2, 1, 2, 0, 0, 0, 0, //
            2, 4, 2, 4, 1, 1, 3, 5, 5, 2, 3, 1,
        ],
        [3, 12],
    ));
    let input_lengths: Tensor<_, 1, Int> = ctx.idx([48i64, 31, 40]);
    let target_lengths: Tensor<_, 1, Int> = ctx.idx([10i64, 8, 12]);
    let loss = module::ctc_loss(log_probs, targets, input_lengths, target_lengths, 0);
    let g = loss.clone().sum().backward();
    (loss, logits.grad(&g))
});
