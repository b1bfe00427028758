//! Differential tests of Burn's `FloatTensorOps` (and `ActivationOps`) on burn-mlx against
//! burn-ndarray, through Burn's public `Tensor` API.
//!
//! Every method of `FloatTensorOps` is reached: most through their public `Tensor` method, and the
//! few without one (`float_powi`, `float_powi_scalar_impl`, `float_powf_scalar_impl`) through the
//! trait. The `*_backward` activation ops are covered in `autodiff_ops.rs`.

use crate::common::*;
use burn_tensor::activation;
use burn_tensor::backend::Backend;
use burn_tensor::ops::{GridSampleOptions, GridSamplePaddingMode, InterpolateMode};
use burn_tensor::ElementConversion;
use burn_tensor::{
    s, DType, Distribution, FloatDType, IndexingUpdateOp, Int, IntDType, Slice, Tensor, TensorData,
    TensorPrimitive,
};

const NAN: f32 = f32::NAN;
const INF: f32 = f32::INFINITY;

/// Special values pushed through every unary op.
const SPECIALS: [f32; 12] = [
    NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 2.5, 1e-30, 1e30,
];

// ---------------------------------------------------------------------------------------------
// Creation and data movement
// ---------------------------------------------------------------------------------------------

unary!(
    from_data_into_data_all_layouts,
    (-5.0, 5.0),
    FLOATS,
    Tol::EXACT,
    |ctx, x| x
);

diff!(creation_zeros_ones_full, Tol::EXACT, FLOATS, |ctx| (
    Tensor::<B, 2>::zeros([2, 3], ctx.fo()),
    Tensor::<B, 2>::ones([2, 3], ctx.fo()),
    Tensor::<B, 3>::full([2, 1, 3], -2.5, ctx.fo()),
    Tensor::<B, 2>::zeros([0, 3], ctx.fo()),
    Tensor::<B, 1>::full([1], 7.0, ctx.fo()),
    ctx.f([2, 2], (-1.0, 1.0)).zeros_like(),
    ctx.f([2, 2], (-1.0, 1.0)).ones_like(),
    ctx.f([2, 2], (-1.0, 1.0)).full_like(3.5),
    Tensor::<B, 2>::eye(3, &ctx.dev).cast(ctx.fdt_eff()),
));

diff!(creation_empty_shape_and_dtype, Tol::EXACT, FLOATS, |ctx| {
    let e = Tensor::<B, 3>::empty([2, 0, 4], ctx.fo());
    let f = Tensor::<B, 2>::empty([3, 2], ctx.fo());
    let dims: Vec<i64> = e
        .dims()
        .iter()
        .chain(f.dims().iter())
        .map(|&d| d as i64)
        .collect();
    (
        TensorData::new(dims, [5]),
        e.dtype() == ctx.fdt_eff(),
        f.dtype() == ctx.fdt_eff(),
    )
});

diff!(device_and_to_device, Tol::EXACT, FLOATS, |ctx| {
    let x = ctx.f([3, 4], (-2.0, 2.0));
    let same = x.device() == ctx.dev;
    (x.to_device(&ctx.dev), same)
});

diff!(into_scalar_values, Tol::EXACT, FLOATS, |ctx| {
    let x = ctx.fd::<2>([[2.5f32]]);
    // Whole numbers, so the sum is exact in every dtype and summation order.
    let y = ctx.f([3, 4], Dist::grid(-2.0, 2.0, 1.0)).sum();
    (x.into_scalar().elem::<f64>(), y.into_scalar().elem::<f64>())
});

diff!(from_data_specials, Tol::EXACT, FLOATS, |ctx| ctx
    .fd::<1>(SPECIALS));

// ---------------------------------------------------------------------------------------------
// Casts
// ---------------------------------------------------------------------------------------------

diff!(cast_float_to_float, Tol::EXACT, |ctx| {
    // Values exact in bf16 and f16 so every path is lossless; then lossy ones.
    let exact = ctx.fd::<2>([[1.0f32, -2.0, 0.5, 0.0], [3.0, -0.25, 8.0, -16.0]]);
    let lossy = ctx.f::<2>([3, 5], (-100.0, 100.0));
    let to_f64 = lossy.clone().cast(widest_float());
    let back = to_f64.clone().cast(FloatDType::F32);
    (
        exact.clone().cast(widest_float()),
        exact.cast(FloatDType::F32),
        to_f64,
        back,
    )
});

diff!(cast_from_each_float_dtype, Tol::EXACT, FLOATS, |ctx| {
    // Source values are representable in the case dtype, so widening casts are exact.
    let x = ctx.fl::<2>([3, 4], (-100.0, 100.0), Layout::Transposed);
    (
        x.clone().cast(FloatDType::F32),
        x.clone().cast(widest_float()),
        x.cast(DType::F32),
    )
});

diff!(cast_float_to_half_values, Tol::EXACT, |ctx| {
    // NdArray cannot hold f16: compare through f32 after a round trip (the rounding step).
    let x = ctx.fd::<1>([1.0f32, 0.1, -3.3, 1000.7, 65504.0, 1e-8, -0.0, 2.5625]);
    if ctx.is_ref {
        let v: Vec<f32> = x.into_data().iter::<f32>().collect();
        let h: Vec<f32> = v
            .iter()
            .map(|&a| burn_tensor::f16::from_f32(a).to_f32())
            .collect();
        let b: Vec<f32> = v
            .iter()
            .map(|&a| burn_tensor::bf16::from_f32(a).to_f32())
            .collect();
        (TensorData::new(h, [8]), TensorData::new(b, [8]))
    } else {
        let h = x
            .clone()
            .cast(FloatDType::F16)
            .cast(FloatDType::F32)
            .into_data();
        let b = x.cast(FloatDType::BF16).cast(FloatDType::F32).into_data();
        (h, b)
    }
});

diff!(cast_float_to_int_all_dtypes, Tol::EXACT, FLOATS, |ctx| {
    // Truncation toward zero; values in range for every int dtype (unsigned: non-negative).
    let s = ctx.fd::<1>([-3.7f32, -1.5, -0.5, 0.0, 0.4, 1.5, 2.9, 100.99]);
    let u = ctx.fd::<1>([0.0f32, 0.4, 1.5, 2.9, 7.99, 100.99, 127.0, 200.5]);
    (
        s.clone().int(),
        s.clone().cast(IntDType::I64),
        s.clone().cast(IntDType::I32),
        s.clone().cast(IntDType::I16),
        s.cast(IntDType::I8),
        vec![
            u.clone().cast(IntDType::U64),
            u.clone().cast(IntDType::U32),
            u.clone().cast(IntDType::U16),
            u.cast(IntDType::U8),
        ],
    )
});

diff!(cast_float_to_int_non_contiguous, Tol::EXACT, |ctx| {
    let x = ctx.fl([3, 4], (-50.0, 50.0), Layout::Transposed);
    (x.clone().int(), x.cast(IntDType::I32))
});

// ---------------------------------------------------------------------------------------------
// Elementwise binary ops (standard configurations: broadcast, empty, strided)
// ---------------------------------------------------------------------------------------------

binary!(
    add,
    (-10.0, 10.0),
    (-10.0, 10.0),
    FLOATS,
    Tol::F32,
    |ctx, a, b| a + b
);
binary!(
    sub,
    (-10.0, 10.0),
    (-10.0, 10.0),
    FLOATS,
    Tol::F32,
    |ctx, a, b| a - b
);
binary!(
    mul,
    (-10.0, 10.0),
    (-10.0, 10.0),
    FLOATS,
    Tol::F32,
    |ctx, a, b| a * b
);
binary!(
    div,
    (-10.0, 10.0),
    Dist::nz(-4.0, 4.0, 0.25),
    FLOATS,
    Tol::F32,
    |ctx, a, b| a / b
);
binary!(
    remainder_signs,
    (-10.0, 10.0),
    Dist::nz(-4.0, 4.0, 0.5),
    FLOATS,
    Tol::F32,
    |ctx, a, b| a.remainder(b)
);
binary!(
    powf_tensor,
    (0.1, 4.0),
    (-2.5, 2.5),
    FLOATS,
    Tol::TRANS,
    |ctx, a, b| a.powf(b)
);
binary!(
    atan2,
    (-3.0, 3.0),
    (-3.0, 3.0),
    FLOATS,
    Tol::TRANS,
    |ctx, a, b| a.atan2(b)
);
binary!(
    max_min_pair,
    Dist::grid(-3.0, 3.0, 2.0),
    Dist::grid(-3.0, 3.0, 2.0),
    FLOATS,
    Tol::EXACT,
    |ctx, a, b| (a.clone().max_pair(b.clone()), a.min_pair(b))
);
binary!(
    compare_equal_not_equal,
    Dist::grid(-2.0, 2.0, 2.0),
    Dist::grid(-2.0, 2.0, 2.0),
    FLOATS,
    Tol::EXACT,
    |ctx, a, b| (a.clone().equal(b.clone()), a.not_equal(b))
);
binary!(
    compare_greater_lower,
    Dist::grid(-2.0, 2.0, 2.0),
    Dist::grid(-2.0, 2.0, 2.0),
    FLOATS,
    Tol::EXACT,
    |ctx, a, b| (
        a.clone().greater(b.clone()),
        a.clone().greater_equal(b.clone()),
        a.clone().lower(b.clone()),
        a.lower_equal(b),
    )
);
binary!(
    fmod_tensor,
    (-10.0, 10.0),
    Dist::nz(-4.0, 4.0, 0.5),
    F32_ONLY,
    Tol::F32,
    |ctx, a, b| a.fmod(b)
);

diff!(binary_ops_with_specials, Tol::F32, F32_ONLY, |ctx| {
    let a = ctx.fd::<1>(SPECIALS);
    let b = ctx.fd::<1>([
        1.0f32, INF, INF, NAN, 0.0, 0.0, -INF, -0.0, 2.0, -2.0, 1e30, 1e-30,
    ]);
    (
        a.clone() + b.clone(),
        a.clone() * b.clone(),
        a.clone() / b.clone(),
        a.clone().max_pair(b.clone()),
        a.clone().min_pair(b.clone()),
        a.clone().equal(b.clone()),
        a.clone().not_equal(b.clone()),
        a.clone().greater(b.clone()),
        a.clone().lower_equal(b.clone()),
        a.clone().atan2(b.clone()),
    )
});

diff!(remainder_specials_and_edges, Tol::F32, F32_ONLY, |ctx| {
    let a = ctx.fd::<1>([
        5.0f32, -5.0, 5.0, -5.0, 0.0, -0.0, 3.0, INF, 1.0, 7.5, -7.5, 6.0,
    ]);
    let b = ctx.fd::<1>([
        3.0f32, 3.0, -3.0, -3.0, 2.0, 2.0, 0.0, 2.0, INF, 2.5, 2.5, -3.0,
    ]);
    (
        a.clone().remainder(b.clone()),
        a.clone().remainder_scalar(-2.0),
        a.remainder_scalar(2.5),
    )
});

// ---------------------------------------------------------------------------------------------
// Scalar ops
// ---------------------------------------------------------------------------------------------

unary!(
    add_sub_mul_div_scalar,
    (-10.0, 10.0),
    FLOATS,
    Tol::F32,
    |ctx, x| (
        x.clone().add_scalar(2.5),
        x.clone().sub_scalar(-1.25),
        x.clone().mul_scalar(-3.0),
        x.clone().div_scalar(4.0),
        x.clone().div_scalar(-0.3),
        x.clone() + 1.0,
        x.clone() * 0.5,
        x.clone() - 2,
        x / 3,
    )
);
unary!(
    remainder_scalar_signs,
    (-10.0, 10.0),
    FLOATS,
    Tol::F32,
    |ctx, x| (
        x.clone().remainder_scalar(3.0),
        x.clone().remainder_scalar(-3.0),
        x.clone().remainder_scalar(0.7),
        x.clone() % 2.0,
        x.fmod_scalar(-2.5),
    )
);
unary!(
    compare_elem,
    Dist::grid(-3.0, 3.0, 2.0),
    FLOATS,
    Tol::EXACT,
    |ctx, x| (
        x.clone().equal_elem(0.5),
        x.clone().not_equal_elem(0.5),
        x.clone().greater_elem(0.0),
        x.clone().greater_equal_elem(0.5),
        x.clone().lower_elem(-1.0),
        x.lower_equal_elem(-1.0),
    )
);
unary!(clamp, (-5.0, 5.0), FLOATS, Tol::EXACT, |ctx, x| (
    x.clone().clamp(-1.5, 2.0),
    x.clone().clamp_min(0.25),
    x.clone().clamp_max(-0.5),
    x.clamp(1.0, 1.0),
));
diff!(clamp_specials, Tol::EXACT, F32_ONLY, |ctx| {
    let x = ctx.fd::<1>(SPECIALS);
    (
        x.clone().clamp(-1.0, 1.0),
        x.clone().clamp_min(0.0),
        x.clamp_max(0.0),
    )
});

unary!(
    powf_scalar_fractional,
    (0.0, 4.0),
    FLOATS,
    Tol::TRANS,
    |ctx, x| (
        x.clone().powf_scalar(2.5),
        x.clone().powf_scalar(0.5),
        x.clone().powf_scalar(-0.5),
        x.powf_scalar(0.0),
    )
);
unary!(
    powf_scalar_integer_negative_base,
    (-3.0, 3.0),
    FLOATS,
    Tol::TRANS,
    |ctx, x| (
        x.clone().powf_scalar(2.0),
        x.clone().powf_scalar(3.0),
        ctx.ref_f64(x.clone(), |t| t.powf_scalar(-1.0)),
        x.clone().powf_scalar(1.0),
        x.clone().powf_scalar(0.0),
        x.powf_scalar(4.0),
    )
);
unary!(powi_scalar, (-3.0, 3.0), FLOATS, Tol::TRANS, |ctx, x| (
    x.clone().powi_scalar(0),
    x.clone().powi_scalar(1),
    x.clone().powi_scalar(2),
    x.clone().powi_scalar(3),
    x.clone().powi_scalar(5),
    ctx.ref_f64(x.clone(), |t| t.powi_scalar(-1)),
    ctx.ref_f64(x.clone(), |t| t.powi_scalar(-2)),
    x.square(),
));
diff!(pow_specials, Tol::TRANS, F32_ONLY, |ctx| {
    let x = ctx.fd::<1>(SPECIALS);
    (
        x.clone().powf_scalar(2.0),
        x.clone().powf_scalar(0.5),
        ctx.ref_f64(x.clone(), |t| t.powf_scalar(-1.0)),
        x.clone().powi_scalar(3),
        x.clone().powi_scalar(0),
        x.clone().powf(ctx.fd::<1>([2.0f32; 12])),
        x.powf_scalar(0.0),
    )
});

// Trait-only entry points (no public Tensor method reaches them directly).
diff!(float_powi_trait, Tol::TRANS, FLOATS, |ctx| {
    let x = ctx.f::<2>([3, 4], (-3.0, 3.0));
    let e = ctx.i_as::<2>([3, 4], -3, 5, DType::I64);
    let p = B::float_powi(x.clone().into_primitive().tensor(), e.into_primitive());
    let s1 = B::float_powi_scalar_impl(x.clone().into_primitive().tensor(), 3i64.into());
    let xp = x.abs().add_scalar(0.1);
    let s2 = B::float_powf_scalar_impl(xp.into_primitive().tensor(), 1.5f64.into());
    (
        Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(p)),
        Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(s1)),
        Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(s2)),
    )
});

// ---------------------------------------------------------------------------------------------
// Elementwise unary math
// ---------------------------------------------------------------------------------------------

unary!(neg, (-10.0, 10.0), FLOATS, Tol::EXACT, |ctx, x| -x);
unary!(
    recip,
    Dist::nz(-4.0, 4.0, 0.1),
    FLOATS,
    Tol::F32,
    |ctx, x| ctx.ref_f64(x, |t| t.recip())
);
unary!(abs, (-10.0, 10.0), FLOATS, Tol::EXACT, |ctx, x| x.abs());
unary!(
    sign,
    Dist::grid(-2.0, 2.0, 1.0),
    FLOATS,
    Tol::EXACT,
    |ctx, x| x.sign()
);
unary!(exp, (-5.0, 5.0), FLOATS, Tol::TRANS, |ctx, x| x.exp());
unary!(log, (0.01, 10.0), FLOATS, Tol::TRANS, |ctx, x| x.log());
unary!(log1p, (-0.9, 5.0), FLOATS, Tol::TRANS, |ctx, x| x.log1p());
unary!(
    log1p_tiny,
    (-1e-6, 1e-6),
    [DType::F32, DType::F64],
    Tol::TRANS,
    |ctx, x| x.log1p()
);
unary!(sqrt, (0.0, 10.0), FLOATS, Tol::TRANS, |ctx, x| x.sqrt());
unary!(cos, (-6.0, 6.0), FLOATS, Tol::TRANS, |ctx, x| x.cos());
unary!(sin, (-6.0, 6.0), FLOATS, Tol::TRANS, |ctx, x| x.sin());
unary!(tan, (-1.4, 1.4), FLOATS, Tol::TRANS, |ctx, x| x.tan());
unary!(cosh, (-4.0, 4.0), FLOATS, Tol::TRANS, |ctx, x| x.cosh());
unary!(sinh, (-4.0, 4.0), FLOATS, Tol::TRANS, |ctx, x| x.sinh());
unary!(tanh, (-4.0, 4.0), FLOATS, Tol::TRANS, |ctx, x| x.tanh());
unary!(acos, (-1.0, 1.0), FLOATS, Tol::TRANS, |ctx, x| x.acos());
unary!(acosh, (1.0, 5.0), FLOATS, Tol::TRANS, |ctx, x| x.acosh());
unary!(asin, (-1.0, 1.0), FLOATS, Tol::TRANS, |ctx, x| x.asin());
unary!(asinh, (-5.0, 5.0), FLOATS, Tol::TRANS, |ctx, x| x.asinh());
unary!(atan, (-5.0, 5.0), FLOATS, Tol::TRANS, |ctx, x| x.atan());
unary!(atanh, (-0.99, 0.99), FLOATS, Tol::TRANS, |ctx, x| x.atanh());
unary!(erf, (-3.0, 3.0), FLOATS, Tol::TRANS, |ctx, x| x.erf());
unary!(
    round_half_even,
    Dist::grid(-4.0, 4.0, 2.0),
    FLOATS,
    Tol::EXACT,
    |ctx, x| x.round()
);
unary!(round_random, (-4.0, 4.0), FLOATS, Tol::EXACT, |ctx, x| x
    .round());
unary!(
    floor,
    Dist::grid(-4.0, 4.0, 4.0),
    FLOATS,
    Tol::EXACT,
    |ctx, x| x.floor()
);
unary!(
    ceil,
    Dist::grid(-4.0, 4.0, 4.0),
    FLOATS,
    Tol::EXACT,
    |ctx, x| x.ceil()
);
unary!(
    trunc,
    Dist::grid(-4.0, 4.0, 4.0),
    FLOATS,
    Tol::EXACT,
    |ctx, x| x.trunc()
);
unary!(deg_rad, (-400.0, 400.0), FLOATS, Tol::F32, |ctx, x| (
    x.clone().deg2rad(),
    x.rad2deg()
));

diff!(
    unary_math_specials,
    Tol::TRANS,
    [DType::F32, DType::F64],
    |ctx| {
        let x = || ctx.fd::<1>(SPECIALS);
        vec![
            -x(),
            ctx.ref_f64(x(), |t| t.recip()),
            x().abs(),
            x().sign(),
            x().exp(),
            x().log(),
            x().log1p(),
            x().sqrt(),
            x().cos(),
            x().sin(),
            x().tan(),
            x().cosh(),
            x().sinh(),
            x().tanh(),
            x().acos(),
            x().acosh(),
            x().asin(),
            x().asinh(),
            x().atan(),
            x().atanh(),
            x().erf(),
            x().round(),
            x().floor(),
            x().ceil(),
            x().trunc(),
        ]
    }
);

diff!(is_nan_is_inf_is_finite, Tol::EXACT, FLOATS, |ctx| {
    let x = ctx.fd::<2>([[NAN, INF, -INF, 0.0], [-0.0, 1.0, 1e30, NAN]]);
    let r = ctx.fl::<2>([3, 4], (-1.0, 1.0), Layout::Transposed);
    (
        x.clone().is_nan(),
        x.clone().is_inf(),
        x.clone().is_finite(),
        x.contains_nan(),
        r.clone().is_nan(),
        r.contains_nan(),
    )
});

diff!(is_close_all_close, Tol::EXACT, F32_ONLY, |ctx| {
    let a = ctx.fd::<1>([1.0f32, 2.0, NAN, INF, 0.0]);
    let b = ctx.fd::<1>([1.0f32 + 1e-7, 2.1, NAN, INF, 1e-9]);
    (
        a.clone().is_close(b.clone(), None, None),
        a.all_close(b, None, None),
    )
});

// ---------------------------------------------------------------------------------------------
// Matmul and cross
// ---------------------------------------------------------------------------------------------

diff!(matmul_shapes, Tol::TRANS, FLOATS, |ctx| (
    ctx.f::<2>([3, 4], (-1.0, 1.0))
        .matmul(ctx.f([4, 5], (-1.0, 1.0))),
    ctx.f::<2>([1, 4], (-1.0, 1.0))
        .matmul(ctx.f([4, 1], (-1.0, 1.0))),
    ctx.f::<3>([2, 3, 4], (-1.0, 1.0))
        .matmul(ctx.f([2, 4, 5], (-1.0, 1.0))),
    ctx.f::<4>([2, 1, 3, 4], (-1.0, 1.0))
        .matmul(ctx.f([1, 3, 4, 2], (-1.0, 1.0))),
    ctx.f::<3>([1, 3, 4], (-1.0, 1.0))
        .matmul(ctx.f([5, 4, 2], (-1.0, 1.0))),
    ctx.f::<2>([16, 33], (-1.0, 1.0))
        .matmul(ctx.f([33, 17], (-1.0, 1.0))),
));

diff!(matmul_non_contiguous, Tol::TRANS, FLOATS, |ctx| (
    ctx.fl::<2>([3, 4], (-1.0, 1.0), Layout::Transposed)
        .matmul(ctx.fl([4, 5], (-1.0, 1.0), Layout::Transposed)),
    ctx.fl::<2>([3, 4], (-1.0, 1.0), Layout::Stepped)
        .matmul(ctx.fl([4, 5], (-1.0, 1.0), Layout::Flipped)),
    ctx.fl::<3>([2, 3, 4], (-1.0, 1.0), Layout::Permuted)
        .matmul(ctx.fl([2, 4, 3], (-1.0, 1.0), Layout::Broadcast)),
));

// One row or one column: on the CPU these go to burn-mlx's matrix-vector loops (mlx-sys/
// blas_gemv.c; products of 2^16 weights or more split over two threads), for each storage order
// of the two operands, small and large, batched, and with a strided operand.
diff!(matmul_vector_shapes, Tol::TRANS, FLOATS, |ctx| {
    let lay = [Layout::Contig, Layout::Transposed];
    let mut rows = Vec::new();
    for la in lay {
        for lb in lay {
            rows.push(ctx.fl::<2>([1, 33], (-1.0, 1.0), la).matmul(ctx.fl(
                [33, 17],
                (-1.0, 1.0),
                lb,
            )));
            rows.push(
                ctx.fl::<2>([19, 33], (-1.0, 1.0), la)
                    .matmul(ctx.fl([33, 1], (-1.0, 1.0), lb))
                    .transpose(),
            );
            // 300 x 257 weights: split between two threads.
            rows.push(ctx.fl::<2>([1, 300], (-1.0, 1.0), la).matmul(ctx.fl(
                [300, 257],
                (-1.0, 1.0),
                lb,
            )));
            rows.push(
                ctx.fl::<2>([257, 300], (-1.0, 1.0), la)
                    .matmul(ctx.fl([300, 1], (-1.0, 1.0), lb))
                    .transpose(),
            );
        }
    }
    (
        Tensor::cat(rows, 1),
        ctx.f::<3>([3, 1, 40], (-1.0, 1.0)).matmul(ctx.fl(
            [3, 40, 9],
            (-1.0, 1.0),
            Layout::Permuted,
        )),
        ctx.fl::<2>([6, 5], (-1.0, 1.0), Layout::Stepped)
            .matmul(ctx.fl([5, 1], (-1.0, 1.0), Layout::NegStepped)),
        ctx.f::<2>([1, 1], (-1.0, 1.0))
            .matmul(ctx.f([1, 1], (-1.0, 1.0))),
    )
});

diff!(matmul_empty, Tol::EXACT, F32_ONLY, |ctx| {
    // burn-ndarray divides by zero on empty operands: the reference is zeros of the output shape.
    fn mm<B: Backend, const D: usize>(
        ctx: &Ctx<B>,
        a: Tensor<B, D>,
        b: Tensor<B, D>,
    ) -> Tensor<B, D> {
        if ctx.is_ref {
            let mut out = a.dims();
            out[D - 1] = b.dims()[D - 1];
            Tensor::zeros(out, ctx.fo())
        } else {
            a.matmul(b)
        }
    }
    (
        mm(
            ctx,
            ctx.f::<2>([0, 4], (-1.0, 1.0)),
            ctx.f([4, 3], (-1.0, 1.0)),
        ),
        mm(
            ctx,
            ctx.f::<2>([3, 0], (-1.0, 1.0)),
            ctx.f([0, 2], (-1.0, 1.0)),
        ),
        mm(
            ctx,
            ctx.f::<3>([0, 2, 3], (-1.0, 1.0)),
            ctx.f([0, 3, 2], (-1.0, 1.0)),
        ),
    )
});

diff!(matmul_specials, Tol::TRANS, F32_ONLY, |ctx| {
    let a = ctx.fd::<2>([[1.0f32, NAN], [INF, 0.0], [1.0, 2.0]]);
    let b = ctx.fd::<2>([[1.0f32, 0.0], [2.0, 3.0]]);
    a.matmul(b)
});

diff!(dot_vectors, Tol::TRANS, FLOATS, |ctx| {
    ctx.f::<1>([7], (-1.0, 1.0)).dot(ctx.f([7], (-1.0, 1.0)))
});

diff!(cross_product, Tol::TRANS, FLOATS, |ctx| (
    ctx.f::<2>([4, 3], (-2.0, 2.0))
        .cross(ctx.f([4, 3], (-2.0, 2.0)), 1),
    ctx.f::<2>([3, 5], (-2.0, 2.0))
        .cross(ctx.f([3, 5], (-2.0, 2.0)), 0),
    ctx.f::<3>([2, 3, 4], (-2.0, 2.0))
        .cross(ctx.f([2, 3, 4], (-2.0, 2.0)), -2),
    ctx.fl::<2>([4, 3], (-2.0, 2.0), Layout::Flipped)
        .cross(ctx.fl([4, 3], (-2.0, 2.0), Layout::Stepped), 1),
));

diff!(cross_broadcast, Tol::TRANS, F32_ONLY, |ctx| {
    ctx.f::<2>([1, 3], (-2.0, 2.0))
        .cross(ctx.f([4, 3], (-2.0, 2.0)), 1)
});

// ---------------------------------------------------------------------------------------------
// Shape ops
// ---------------------------------------------------------------------------------------------

unary!(
    transpose_swap_dims,
    (-5.0, 5.0),
    FLOATS,
    Tol::EXACT,
    |ctx, x| {
        let mut v = Vec::new();
        if D >= 2 {
            v.push(x.clone().transpose());
            v.push(x.clone().t());
            v.push(x.clone().swap_dims(0, D - 1));
            v.push(x.clone().swap_dims(D - 1, 0));
        }
        v.push(x.clone().swap_dims(0, 0));
        v
    }
);
unary!(permute_all, (-5.0, 5.0), FLOATS, Tol::EXACT, |ctx, x| {
    let mut rev = [0isize; D];
    let mut rot = [0isize; D];
    for i in 0..D {
        rev[i] = (D - 1 - i) as isize;
        rot[i] = ((i + 1) % D) as isize;
    }
    let mut neg = rot;
    neg[0] -= D as isize;
    (
        x.clone().permute(rev),
        x.clone().permute(rot),
        x.permute(neg),
    )
});
unary!(flip_axes, (-5.0, 5.0), FLOATS, Tol::EXACT, |ctx, x| {
    let mut v = vec![x.clone().flip([0]), x.clone().flip([-1])];
    if D >= 2 {
        v.push(x.clone().flip([0, 1]));
        v.push(x.clone().flip([-1, 0]));
    }
    v.push(x.flip::<0>([]));
    v
});
unary!(
    reshape_flatten,
    (-5.0, 5.0),
    FLOATS,
    Tol::EXACT,
    |ctx, x| {
        let n = x.shape().num_elements();
        let mut v: Vec<TensorData> = Vec::new();
        if n > 0 {
            v.extend(outs(x.clone().reshape::<1, _>([n as i64])));
        }
        v.extend(outs(x.clone().flatten::<1>(0, D - 1)));
        if n > 0 {
            v.extend(outs(x.clone().reshape::<4, _>([1, 1, 1, n as i64])));
            v.extend(outs(x.clone().reshape::<2, _>([-1, 1])));
            v.extend(outs(x.clone().reshape::<3, _>([1, -1, 1])));
        }
        v
    }
);
diff!(squeeze_unsqueeze_movedim, Tol::EXACT, F32_ONLY, |ctx| {
    let x = ctx.fl::<3>([2, 1, 4], (-5.0, 5.0), Layout::Transposed);
    let y = ctx.f::<4>([2, 3, 4, 5], (-5.0, 5.0));
    (
        x.clone().unsqueeze_dim::<4>(0),
        x.clone().unsqueeze_dim::<4>(3),
        x.clone().unsqueeze::<5>(),
        x.clone().squeeze_dim::<2>(1),
        x.clone().squeeze::<2>(),
        y.clone().movedim(0, 3),
        y.clone().movedim(-1, 1),
        y.flatten::<2>(1, 3),
    )
});
diff!(expand_new_leading_dims, Tol::EXACT, FLOATS, |ctx| (
    ctx.f::<1>([4], (-1.0, 1.0)).expand([3, 4]),
    ctx.f::<2>([3, 1], (-1.0, 1.0)).expand([2, 3, 5]),
    ctx.fl::<2>([3, 4], (-1.0, 1.0), Layout::Transposed)
        .expand([2, -1, -1]),
    ctx.f::<3>([1, 2, 1], (-1.0, 1.0)).expand([2, 2, 2, 3]),
));
diff!(expand_size_one_dims, Tol::EXACT, FLOATS, |ctx| (
    ctx.f::<2>([3, 1], (-1.0, 1.0)).expand([3, 4]),
    ctx.f::<2>([1, 4], (-1.0, 1.0)).expand([3, -1]),
    ctx.f::<3>([2, 1, 1], (-1.0, 1.0)).expand([2, 3, 4]),
    ctx.f::<1>([1], (-1.0, 1.0)).expand([5]),
    ctx.fl::<2>([3, 1], (-1.0, 1.0), Layout::Flipped)
        .expand([2, 3, 4]),
));

diff!(repeat_dim_and_repeat, Tol::EXACT, FLOATS, |ctx| {
    let x = ctx.f::<3>([2, 3, 2], (-5.0, 5.0));
    let t = ctx.fl::<2>([3, 4], (-5.0, 5.0), Layout::Transposed);
    (
        x.clone().repeat_dim(0, 3),
        x.clone().repeat_dim(1, 2),
        x.clone().repeat_dim(2, 1),
        x.clone().repeat_dim(1, 0),
        x.repeat(&[2, 1, 3]),
        t.repeat_dim(1, 2),
    )
});

diff!(cat_and_stack, Tol::EXACT, FLOATS, |ctx| {
    let a = ctx.f::<3>([2, 3, 2], (-5.0, 5.0));
    let b = ctx.f::<3>([2, 1, 2], (-5.0, 5.0));
    let c = ctx.fl::<3>([2, 4, 2], (-5.0, 5.0), Layout::Permuted);
    let e = ctx.f::<3>([2, 0, 2], (-5.0, 5.0));
    (
        Tensor::cat(vec![a.clone(), b.clone(), c, e], 1),
        Tensor::cat(vec![a.clone(), a.clone()], 0),
        Tensor::cat(vec![a.clone(), a.clone()], 2),
        Tensor::cat(vec![a.clone()], 0),
        Tensor::<B, 3>::stack::<4>(vec![a.clone(), a.clone().neg()], 3),
        Tensor::<B, 3>::stack::<4>(vec![b.clone(), b], 0),
    )
});

diff!(narrow_chunk_split, Tol::EXACT, F32_ONLY, |ctx| {
    let x = ctx.f::<2>([7, 5], (-5.0, 5.0));
    (
        x.clone().narrow(0, 2, 3),
        x.clone().chunk(3, 0),
        x.clone().split(2, 1),
        x.clone().split_with_sizes(vec![1, 4, 2], 0),
        x.clone().roll_dim(2, 0),
        x.roll(&[-1, 3], &[0, 1]),
    )
});

diff!(unfold_windows, Tol::EXACT, FLOATS, |ctx| {
    let x = ctx.f::<2>([3, 8], (-5.0, 5.0));
    let y = ctx.fl::<3>([2, 7, 3], (-5.0, 5.0), Layout::Permuted);
    (
        x.clone().unfold::<3, _>(1, 3, 1),
        x.clone().unfold::<3, _>(1, 3, 2),
        x.clone().unfold::<3, _>(1, 8, 1),
        x.unfold::<3, _>(0, 2, 1),
        y.unfold::<4, _>(1, 4, 3),
    )
});

diff!(triu_tril_pad, Tol::EXACT, F32_ONLY, |ctx| {
    let x = ctx.f::<2>([4, 5], (-5.0, 5.0));
    (
        x.clone().triu(0),
        x.clone().triu(1),
        x.clone().tril(-1),
        x.pad((1, 2, 0, 1), burn_tensor::ops::PadMode::Constant(0.5)),
    )
});

// ---------------------------------------------------------------------------------------------
// Slicing
// ---------------------------------------------------------------------------------------------

diff!(slice_ranges_steps_negative, Tol::EXACT, FLOATS, |ctx| {
    let x = ctx.f::<3>([6, 5, 4], (-5.0, 5.0));
    vec![
        x.clone().slice(s![1..4, .., 2..]),
        x.clone().slice(s![-3.., ..-1, -2]),
        x.clone().slice(s![0..6;2, 1..5;3, ..]),
        x.clone().slice(s![..;-1, .., ..]),
        x.clone().slice(s![1..5;-2, ..;-2, 1..3]),
        x.clone().slice(s![-1, -1, -1]),
        x.clone().slice(s![2..2, .., ..]),
        x.clone().slice(s![0..=3, 1..=1]),
        x.clone()
            .slice([Slice::new(-5, Some(-1), 2), Slice::new(0, None, -3)]),
        x.clone().slice_dim(2, s![1..;2]),
        x.clone().slice(s![3]),
    ]
});

diff!(slice_non_contiguous, Tol::EXACT, FLOATS, |ctx| {
    let x = ctx.fl::<3>([4, 6, 5], (-5.0, 5.0), Layout::Permuted);
    let y = ctx.fl::<2>([6, 4], (-5.0, 5.0), Layout::NegStepped);
    (
        x.clone().slice(s![1..3, 0..6;2, ..;-1]),
        x.slice(s![-1.., 2..5, 1..2]),
        y.slice(s![..;3, -3..]),
    )
});

diff!(slice_assign_and_fill, Tol::EXACT, FLOATS, |ctx| {
    let x = || ctx.f::<3>([6, 5, 4], (-5.0, 5.0));
    vec![
        x().slice_assign(s![1..4, .., 2..], ctx.f([3, 5, 2], (10.0, 20.0))),
        x().slice_assign(s![0..6;2, 1..5;3, ..], ctx.f([3, 2, 4], (10.0, 20.0))),
        x().slice_assign(s![..;-1, -2.., ..], ctx.f([6, 2, 4], (10.0, 20.0))),
        x().slice_assign(s![1..5;-2, .., -1], ctx.f([2, 5, 1], (10.0, 20.0))),
        x().slice_assign(s![2..2, .., ..], ctx.f([0, 5, 4], (10.0, 20.0))),
        x().slice_assign(
            s![1..3, 0..2, 0..4],
            ctx.fl([2, 2, 4], (10.0, 20.0), Layout::Transposed),
        ),
        x().slice_fill(s![1..4, 0..5;2, ..], -7.5),
        x().slice_fill(s![-1, .., 1..;2], 3.0),
    ]
});

diff!(
    slice_assign_non_contiguous_target,
    Tol::EXACT,
    F32_ONLY,
    |ctx| {
        let x = ctx.fl::<2>([5, 6], (-5.0, 5.0), Layout::Transposed);
        let v = ctx.f::<2>([2, 3], (10.0, 20.0));
        x.slice_assign(s![1..5;2, 0..6;2], v)
    }
);

// ---------------------------------------------------------------------------------------------
// Indexing: gather / scatter / select / gather_nd / scatter_nd / take
// ---------------------------------------------------------------------------------------------

diff!(gather_dims, Tol::EXACT, FLOATS, |ctx| {
    let x = ctx.f::<2>([4, 5], (-5.0, 5.0));
    let y = ctx.fl::<3>([2, 3, 4], (-5.0, 5.0), Layout::Permuted);
    (
        x.clone().gather(0, ctx.ri([3, 5], 4)),
        x.clone().gather(1, ctx.ri([4, 7], 5)),
        x.gather(1, ctx.ri([4, 0], 5)),
        y.clone().gather(2, ctx.ri([2, 3, 2], 4)),
        y.gather(0, ctx.ri([1, 3, 4], 2)),
    )
});

diff!(gather_index_dtypes, Tol::EXACT, F32_ONLY, |ctx| {
    let x = ctx.f::<2>([4, 5], (-5.0, 5.0));
    let i = ctx.ri::<2>([3, 5], 4);
    (
        x.clone().gather(0, i.clone().cast(IntDType::I32)),
        x.gather(0, i.cast(IntDType::U8)),
    )
});

diff!(scatter_add_duplicates, Tol::F32, FLOATS, |ctx| {
    let x = ctx.f::<2>([4, 5], (-5.0, 5.0));
    let y = ctx.f::<3>([2, 3, 4], (-5.0, 5.0));
    (
        x.clone().scatter(
            0,
            ctx.ri([6, 5], 4),
            ctx.f([6, 5], (-1.0, 1.0)),
            IndexingUpdateOp::Add,
        ),
        x.clone().scatter(
            1,
            ctx.ri([4, 3], 5),
            ctx.f([4, 3], (-1.0, 1.0)),
            IndexingUpdateOp::Add,
        ),
        x.scatter(
            1,
            ctx.ri([4, 0], 5),
            ctx.f([4, 0], (-1.0, 1.0)),
            IndexingUpdateOp::Add,
        ),
        y.scatter(
            2,
            ctx.ri([2, 3, 6], 4),
            ctx.fl([2, 3, 6], (-1.0, 1.0), Layout::Flipped),
            IndexingUpdateOp::Add,
        ),
    )
});

diff!(select_and_select_add, Tol::F32, FLOATS, |ctx| {
    let x = ctx.f::<3>([4, 3, 5], (-5.0, 5.0));
    let t = ctx.fl::<2>([4, 6], (-5.0, 5.0), Layout::Transposed);
    let dup = ctx.idx::<1>([2i64, 0, 2, 3, 2]);
    (
        x.clone().select(0, dup.clone()),
        x.clone().select(2, ctx.idx([4i64, 0])),
        x.clone()
            .select(1, ctx.idx(TensorData::new(Vec::<i64>::new(), [0]))),
        x.clone().select(-1, ctx.idx([1i64])),
        t.clone().select(1, dup.clone()),
        x.clone().select_assign(
            0,
            dup.clone(),
            ctx.f([5, 3, 5], (-1.0, 1.0)),
            IndexingUpdateOp::Add,
        ),
        x.select_assign(
            2,
            ctx.idx([4i64, 4]),
            ctx.f([4, 3, 2], (-1.0, 1.0)),
            IndexingUpdateOp::Add,
        ),
        t.select_assign(1, dup, ctx.f([4, 5], (-1.0, 1.0)), IndexingUpdateOp::Add),
    )
});

diff!(select_index_dtypes, Tol::EXACT, F32_ONLY, |ctx| {
    let x = ctx.f::<2>([4, 5], (-5.0, 5.0));
    let i = ctx.idx::<1>([3i64, 0, 1]);
    (
        x.clone().select(0, i.clone().cast(IntDType::I32)),
        x.select(1, i.cast(IntDType::U16)),
    )
});

diff!(gather_nd_and_scatter_nd, Tol::F32, FLOATS, |ctx| {
    let x = ctx.f::<3>([4, 5, 3], (-5.0, 5.0));
    let i2 = ctx.idx::<2>([[0i64, 1], [3, 4], [2, 0]]);
    let i1 = ctx.idx::<2>([[1i64], [3], [1]]);
    let i3 = ctx.idx::<2>([[0i64, 1, 2], [3, 4, 0]]);
    let g1: Tensor<B, 2> = x.clone().gather_nd::<2, 2>(i2.clone());
    let g2: Tensor<B, 3> = x.clone().gather_nd::<2, 3>(i1.clone());
    let g3: Tensor<B, 1> = x.clone().gather_nd::<2, 1>(i3.clone());
    let ops = [
        IndexingUpdateOp::Assign,
        IndexingUpdateOp::Add,
        IndexingUpdateOp::Mul,
        IndexingUpdateOp::Min,
        IndexingUpdateOp::Max,
    ];
    let mut scattered = Vec::new();
    for op in ops {
        // Duplicate row index 1 in i1 only matters for reductions; Assign uses i2 (no dups).
        scattered.push(
            x.clone()
                .scatter_nd::<2, 2>(i2.clone(), ctx.f([3, 3], (-1.0, 1.0)), op),
        );
        if op != IndexingUpdateOp::Assign {
            scattered.push(x.clone().scatter_nd::<2, 3>(
                i1.clone(),
                ctx.f([3, 5, 3], (-1.0, 1.0)),
                op,
            ));
        }
    }
    (g1, g2, g3, scattered)
});

diff!(take_indices, Tol::EXACT, F32_ONLY, |ctx| {
    let x = ctx.f::<2>([4, 5], (-5.0, 5.0));
    let i = ctx.idx::<2>([[0i64, 3], [2, 2]]);
    let t: Tensor<B, 3> = x.take::<2, 3>(1, i);
    t
});

// ---------------------------------------------------------------------------------------------
// Masks
// ---------------------------------------------------------------------------------------------

diff!(mask_where_broadcast, Tol::EXACT, FLOATS, |ctx| {
    let x = ctx.f::<2>([3, 4], (-5.0, 5.0));
    let v = ctx.f::<2>([3, 4], (10.0, 20.0));
    (
        x.clone().mask_where(ctx.b([3, 4], 0.5), v.clone()),
        // burn-ndarray broadcasts only tensor and value to the mask's shape: its reference
        // gets the mask expanded.
        x.clone()
            .mask_where(ctx.ref_expand(ctx.b([3, 1], 0.5), [3, 4]), v.clone()),
        x.clone()
            .mask_where(ctx.b([3, 4], 0.5), ctx.f([1, 4], (10.0, 20.0))),
        x.clone().mask_where(
            ctx.ref_expand(ctx.b([1, 4], 0.5), [3, 4]),
            ctx.f([1, 1], (10.0, 20.0)),
        ),
        ctx.f::<3>([1, 2, 2], (-5.0, 5.0))
            .mask_where(ctx.b([4, 2, 2], 0.5), ctx.f([4, 2, 2], (10.0, 20.0))),
        ctx.fl::<2>([3, 4], (-5.0, 5.0), Layout::Transposed)
            .mask_where(
                ctx.bl([3, 4], 0.5, Layout::Flipped),
                ctx.fl([3, 4], (9.0, 10.0), Layout::Stepped),
            ),
        ctx.fd::<1>([NAN, 1.0, NAN])
            .mask_where(ctx.bd([true, false, false]), ctx.fd([2.0f32, NAN, 3.0])),
    )
});

diff!(mask_fill_broadcast, Tol::EXACT, FLOATS, |ctx| {
    let x = ctx.f::<2>([3, 4], (-5.0, 5.0));
    (
        x.clone().mask_fill(ctx.b([3, 4], 0.5), 2.5),
        x.clone().mask_fill(ctx.b([3, 1], 0.5), -1.0),
        ctx.f::<4>([1, 4, 2, 2], (-1.0, 1.0))
            .mask_fill(ctx.b([1, 1, 2, 2], 0.5), 7.0),
        // burn-ndarray broadcasts only the mask: its reference gets the tensor expanded.
        ctx.ref_expand(ctx.f::<3>([1, 2, 2], (-1.0, 1.0)), [3, 2, 2])
            .mask_fill(ctx.b([3, 2, 2], 0.5), 7.0),
        ctx.fl::<2>([3, 4], (-5.0, 5.0), Layout::Permuted)
            .mask_fill(ctx.bl([3, 4], 0.5, Layout::Transposed), NAN),
        x.mask_fill(ctx.b([3, 4], 0.5), f32::NEG_INFINITY),
    )
});

// ---------------------------------------------------------------------------------------------
// Reductions
// ---------------------------------------------------------------------------------------------

unary!(
    sum_mean_all_dims,
    (-5.0, 5.0),
    FLOATS,
    Tol::TRANS,
    |ctx, x| {
        // burn-ndarray panics on the mean of an empty tensor: its reference is sum / count (NaN).
        let empty = x.shape().num_elements() == 0;
        let mean = if ctx.is_ref && empty {
            x.clone().sum().div_scalar(0.0)
        } else {
            x.clone().mean()
        };
        let mut v = outs((x.clone().sum(), mean));
        for d in 0..D {
            let m = if ctx.is_ref && empty {
                x.clone().sum_dim(d).div_scalar(x.dims()[d] as f64)
            } else {
                x.clone().mean_dim(d)
            };
            v.extend(outs((x.clone().sum_dim(d), m)));
        }
        v
    }
);
unary!(prod_all_dims, (-1.6, 1.6), FLOATS, Tol::TRANS, |ctx, x| {
    let mut v = outs(x.clone().prod());
    for d in 0..D {
        v.extend(outs(x.clone().prod_dim(d)));
    }
    v
});
diff!(prod_with_zeros_and_negatives, Tol::TRANS, FLOATS, |ctx| {
    let x = ctx.fd::<2>([[1.5f32, -2.0, 0.0], [-1.0, -3.0, 0.5]]);
    (x.clone().prod(), x.clone().prod_dim(0), x.prod_dim(1))
});
unary!(
    max_min_all_dims,
    (-5.0, 5.0),
    FLOATS,
    Tol::EXACT,
    |ctx, x| {
        let mut v = Vec::new();
        if x.shape().num_elements() > 0 {
            v.extend(outs((
                x.clone().max(),
                x.clone().min(),
                x.clone().max_abs(),
            )));
        }
        for d in 0..D {
            if x.dims()[d] > 0 {
                v.extend(outs((
                    x.clone().max_dim(d),
                    x.clone().min_dim(d),
                    x.clone().max_abs_dim(d),
                )));
            }
        }
        v
    }
);
unary!(
    max_min_with_indices_ties,
    Dist::grid(-2.0, 2.0, 1.0),
    FLOATS,
    Tol::EXACT,
    |ctx, x| {
        let mut v = Vec::new();
        for d in 0..D {
            if x.dims()[d] > 0 {
                let (a, ai) = x.clone().max_dim_with_indices(d);
                let (b, bi) = x.clone().min_dim_with_indices(d);
                v.push((a, ai, b, bi, x.clone().argmax(d), x.clone().argmin(d)));
            }
        }
        v
    }
);
diff!(argmax_argmin_nan, Tol::EXACT, FLOATS, |ctx| {
    let x = ctx.fd::<2>([
        [1.0f32, NAN, 3.0, 2.0],
        [NAN, NAN, 0.0, 1.0],
        [INF, 2.0, INF, -INF],
        [-INF, -INF, 0.0, -0.0],
    ]);
    (
        x.clone().argmax(1),
        x.clone().argmin(1),
        x.clone().argmax(0),
        x.clone().argmin(0),
        x.clone().max_dim(1),
        x.clone().min_dim(1),
        x.clone().max_dim_with_indices(1),
        x.clone().min_dim_with_indices(0),
        x.clone().max(),
        x.clone().min(),
        x.max_abs(),
    )
});
diff!(reductions_with_specials, Tol::TRANS, F32_ONLY, |ctx| {
    let x = ctx.fd::<2>([[1.0f32, NAN, 3.0], [INF, 2.0, -INF], [1.0, 2.0, INF]]);
    (
        x.clone().sum_dim(1),
        x.clone().mean_dim(0),
        x.clone().prod_dim(1),
        x.clone().cumsum(1),
        x.clone().cummax(1),
        x.cummin(0),
    )
});

unary!(
    any_all_dims,
    Dist::grid(-1.0, 1.0, 1.0),
    FLOATS,
    Tol::EXACT,
    |ctx, x| {
        let mut v = outs((x.clone().any(), x.clone().all()));
        for d in 0..D {
            v.extend(outs((x.clone().any_dim(d), x.clone().all_dim(d))));
        }
        v
    }
);
diff!(any_all_nan, Tol::EXACT, F32_ONLY, |ctx| {
    let x = ctx.fd::<2>([[NAN, 0.0], [0.0, 0.0], [-0.0, 1.0]]);
    (
        x.clone().any(),
        x.clone().all(),
        x.clone().any_dim(1),
        x.all_dim(0),
    )
});

unary!(
    cumulative_all_dims,
    (-1.5, 1.5),
    FLOATS,
    Tol::TRANS,
    |ctx, x| {
        let mut v = Vec::new();
        for d in 0..D {
            v.push(x.clone().cumsum(d));
            v.push(x.clone().cumprod(d));
            v.push(x.clone().cummin(d));
            v.push(x.clone().cummax(d));
        }
        v
    }
);

diff!(var_median_cov, Tol::TRANS, F32_ONLY, |ctx| {
    let x = ctx.f::<2>([5, 7], (-5.0, 5.0));
    (
        x.clone().var(1),
        x.clone().var_bias(0),
        x.clone().var_mean(1),
        x.clone().median(1),
        x.clone().median_with_indices(0),
        x.cov(1, 1),
    )
});

// ---------------------------------------------------------------------------------------------
// Sorting and top-k
// ---------------------------------------------------------------------------------------------

unary!(
    sort_argsort_ties,
    Dist::grid(-2.0, 2.0, 1.0),
    FLOATS,
    Tol::EXACT,
    |ctx, x| {
        // Burn's sorts are unstable: the order of equal values' indices is unspecified. So the
        // indices are checked by what they select (the sorted values) and by being a
        // permutation (sorted, they are 0..n), not by their order among ties.
        let mut v = Vec::new();
        for d in 0..D {
            let (asc, asc_i) = x.clone().sort_with_indices(d);
            let (desc, desc_i) = x.clone().sort_descending_with_indices(d);
            let arg = x.clone().argsort(d);
            let arg_desc = x.clone().argsort_descending(d);
            v.extend(outs((
                asc,
                desc,
                x.clone().sort(d),
                x.clone().sort_descending(d),
                x.clone().gather(d, asc_i.clone()),
                x.clone().gather(d, desc_i.clone()),
                x.clone().gather(d, arg.clone()),
                x.clone().gather(d, arg_desc.clone()),
                asc_i.sort(d),
                desc_i.sort(d),
                arg.sort(d),
                arg_desc.sort(d),
            )));
        }
        v
    }
);
diff!(sort_nan_inf, Tol::EXACT, F32_ONLY, |ctx| {
    let x = ctx.fd::<1>([3.0f32, NAN, -INF, 1.0, INF, -0.0, 0.0, NAN, 1.0]);
    (
        x.clone().sort_with_indices(0),
        x.clone().sort_descending_with_indices(0),
        x.clone().argsort(0),
        x.argsort_descending(0),
    )
});
diff!(topk_and_argtopk, Tol::EXACT, FLOATS, |ctx| {
    let x = ctx.f::<2>([4, 7], Dist::grid(-3.0, 3.0, 2.0));
    // burn-ndarray has no argtopk: its reference is argsort_descending sliced to k.
    let argtopk = if ctx.is_ref {
        x.clone().argsort_descending(1).slice(s![.., 0..3])
    } else {
        x.clone().argtopk(3, 1)
    };
    let argtopk0 = if ctx.is_ref {
        x.clone().argsort_descending(0).slice(s![0..2, ..])
    } else {
        x.clone().argtopk(2, 0)
    };
    (
        x.clone().topk(3, 1),
        x.clone().topk(1, 0),
        x.clone().topk_with_indices(3, 1),
        argtopk,
        argtopk0,
    )
});

// ---------------------------------------------------------------------------------------------
// Activations (ActivationOps and the composite ones)
// ---------------------------------------------------------------------------------------------

unary!(
    act_relu_leaky_prelu,
    (-3.0, 3.0),
    FLOATS,
    Tol::F32,
    |ctx, x| {
        let n = if D >= 2 { x.dims()[1] } else { 1 };
        let alpha = ctx.f::<1>([n.max(1)], (0.0, 0.5));
        let alpha = if n == 0 {
            ctx.f::<1>([1], (0.0, 0.5))
        } else {
            alpha
        };
        (
            activation::relu(x.clone()),
            activation::leaky_relu(x.clone(), 0.1),
            activation::prelu(x.clone(), alpha),
            activation::prelu(x, ctx.fd([0.25f32])),
        )
    }
);
unary!(
    act_gelu_sigmoid_family,
    (-5.0, 5.0),
    FLOATS,
    Tol::TRANS,
    |ctx, x| (
        activation::gelu(x.clone()),
        activation::gelu_approximate(x.clone()),
        activation::sigmoid(x.clone()),
        activation::hard_sigmoid(x.clone(), 0.2, 0.5),
        activation::log_sigmoid(x.clone()),
        activation::silu(x.clone()),
        activation::mish(x.clone()),
        activation::softplus(x.clone(), 1.0),
        activation::tanh(x.clone()),
        activation::hard_swish(x),
    )
);
unary!(
    act_softmax_family,
    (-5.0, 5.0),
    FLOATS,
    Tol::TRANS,
    |ctx, x| {
        let mut v = Vec::new();
        if ctx.is_ref && x.shape().num_elements() == 0 {
            // burn-ndarray panics on empty input; the result is an empty tensor of the same shape.
            for _ in 0..D {
                v.extend(vec![x.clone(), x.clone(), x.clone(), x.clone()]);
            }
            return outs(v);
        }
        for d in 0..D {
            v.push(activation::softmax(x.clone(), d));
            v.push(activation::log_softmax(x.clone(), d));
            v.push(activation::softmin(x.clone(), d));
            v.push(activation::quiet_softmax(x.clone(), d));
        }
        v
    }
);
diff!(act_extreme_values, Tol::TRANS, F32_ONLY, |ctx| {
    let x = ctx.fd::<2>([[-100.0f32, 0.0, 100.0, 88.0], [-INF, 1.0, 2.0, 3.0]]);
    (
        activation::sigmoid(x.clone()),
        {
            // Burn's default log_sigmoid (burn-ndarray's) gives NaN at -inf, an artifact of its
            // log-sum-exp rewrite; Mlx gives the limit, -inf. The reference is set to the limit.
            let ls = activation::log_sigmoid(x.clone());
            if ctx.is_ref {
                let at_neg_inf = x.clone().equal_elem(f32::NEG_INFINITY);
                ls.mask_fill(at_neg_inf, f32::NEG_INFINITY)
            } else {
                ls
            }
        },
        activation::softmax(x.clone(), 1),
        activation::log_softmax(x.clone(), 1),
        activation::gelu(x.clone()),
        activation::relu(x),
    )
});
diff!(act_softmax_large_logits, Tol::TRANS, FLOATS, |ctx| {
    let x = ctx.f::<2>([3, 40], (-60.0, 60.0));
    (
        activation::softmax(x.clone(), 1),
        activation::log_softmax(x, 1),
    )
});
unary!(act_misc, (-3.0, 3.0), F32_ONLY, Tol::TRANS, |ctx, x| (
    activation::elu(x.clone(), 1.0),
    activation::celu(x.clone(), 0.5),
    activation::selu(x.clone()),
    activation::softsign(x.clone()),
    activation::hard_shrink(x.clone(), 0.5),
    activation::soft_shrink(x.clone(), 0.5),
    activation::thresholded_relu(x, 0.5),
));

// ---------------------------------------------------------------------------------------------
// grid_sample_2d
// ---------------------------------------------------------------------------------------------

diff!(
    grid_sample_2d_modes,
    Tol::TRANS,
    [DType::F32, DType::F64],
    |ctx| {
        let x = ctx.f::<4>([2, 3, 5, 6], (-2.0, 2.0));
        let grid = ctx.f::<4>([2, 4, 7, 2], (-1.2, 1.2));
        let mut v = Vec::new();
        // burn-ndarray implements only bilinear grid sampling (nearest/bicubic are todo!()).
        for mode in [InterpolateMode::Bilinear] {
            for padding_mode in [
                GridSamplePaddingMode::Zeros,
                GridSamplePaddingMode::Border,
                GridSamplePaddingMode::Reflection,
            ] {
                for align_corners in [false, true] {
                    let opts = GridSampleOptions {
                        mode: mode.clone(),
                        padding_mode,
                        align_corners,
                    };
                    v.push(x.clone().grid_sample_2d(grid.clone(), opts));
                }
            }
        }
        v
    }
);

// ---------------------------------------------------------------------------------------------
// Detach / require_grad on the inner backend
// ---------------------------------------------------------------------------------------------

diff!(detach_require_grad_inner, Tol::EXACT, F32_ONLY, |ctx| {
    let x = ctx.f::<2>([2, 3], (-1.0, 1.0));
    let y = x.clone().detach();
    let z = x.set_require_grad(true);
    // Inner (non-autodiff) backends never track gradients.
    let flag = z.is_require_grad();
    (y, z, flag)
});

// ---------------------------------------------------------------------------------------------
// Random: statistics and seeding (backend under test only)
// ---------------------------------------------------------------------------------------------

fn stats(d: TensorData) -> (f64, f64, f64, f64) {
    let v: Vec<f64> = d.iter::<f64>().collect();
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    let min = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    (mean, var.sqrt(), min, max)
}

fn check_stats(
    what: &str,
    dt: DType,
    t: Tensor<TestB, 2>,
    want: (f64, f64, f64, f64),
) -> Vec<String> {
    let (m, s, lo, hi) = want;
    let mut errs = Vec::new();
    if t.dtype() != dt {
        errs.push(format!("{what} {dt:?}: dtype {:?}", t.dtype()));
    }
    let n = t.shape().num_elements() as f64;
    let (mean, std, min, max) = stats(t.into_data());
    // Standard error of the mean is std/sqrt(n); allow 5 sigma plus the dtype's rounding.
    let tol_m = 5.0 * s / n.sqrt() + 0.01 * (m.abs() + s);
    let ok =
        (mean - m).abs() <= tol_m && (std - s).abs() <= 0.03 * s + 0.01 && min >= lo && max <= hi;
    if !ok {
        errs.push(format!(
            "{what} {dt:?}: mean {mean:.4} (want {m}±{tol_m:.4}), std {std:.4} (want {s:.4}), \
             range [{min}, {max}] (want within [{lo}, {hi}])"
        ));
    }
    errs
}

fn run_stats(
    f: &mut Failures,
    what: &str,
    dt: DType,
    t: Tensor<TestB, 2>,
    want: (f64, f64, f64, f64),
) {
    f.count();
    for e in check_stats(what, dt, t, want) {
        f.fail(e);
    }
}

#[test]
fn random_distributions_statistics() {
    let dev = Default::default();
    let mut f = Failures::new("random_distributions_statistics");
    let n = [200, 250];
    let u01 = 1.0 / 12f64.sqrt();
    for dt in FLOATS {
        if dt == DType::F64 && on_gpu() {
            continue;
        }
        let opts = (&dev, dt);
        let u = Tensor::<TestB, 2>::random(n, Distribution::Uniform(-2.0, 3.0), opts);
        run_stats(&mut f, "uniform(-2,3)", dt, u, (0.5, 5.0 * u01, -2.0, 3.0));
        let d = Tensor::<TestB, 2>::random(n, Distribution::Default, opts);
        run_stats(&mut f, "default", dt, d, (0.5, u01, 0.0, 1.0));
        let g = Tensor::<TestB, 2>::random(n, Distribution::Normal(1.0, 2.0), opts);
        let inf = f64::INFINITY;
        run_stats(&mut f, "normal(1,2)", dt, g, (1.0, 2.0, -inf, inf));
        let b = Tensor::<TestB, 2>::random(n, Distribution::Bernoulli(0.3), opts);
        if !b
            .clone()
            .into_data()
            .iter::<f64>()
            .all(|v| v == 0.0 || v == 1.0)
        {
            f.fail(format!("bernoulli(0.3) {dt:?}: values other than 0 and 1"));
        }
        run_stats(
            &mut f,
            "bernoulli(0.3)",
            dt,
            b,
            (0.3, 0.21f64.sqrt(), 0.0, 1.0),
        );
        let like = Tensor::<TestB, 2>::zeros(n, opts).random_like(Distribution::Uniform(0.0, 1.0));
        run_stats(
            &mut f,
            "random_like uniform(0,1)",
            dt,
            like,
            (0.5, u01, 0.0, 1.0),
        );
    }
    // Int random: uniform over [0, 10).
    for dt in [DType::I64, DType::I32, DType::U8] {
        f.count();
        let t = Tensor::<TestB, 2, Int>::random(n, Distribution::Uniform(0.0, 10.0), (&dev, dt));
        if t.dtype() != dt {
            f.fail(format!("int random {dt:?}: dtype {:?}", t.dtype()));
        }
        let v: Vec<i64> = t.into_data().iter::<i64>().collect();
        let mean = v.iter().sum::<i64>() as f64 / v.len() as f64;
        let (lo, hi) = (*v.iter().min().unwrap(), *v.iter().max().unwrap());
        if lo < 0 || hi > 9 || (mean - 4.5).abs() > 0.1 {
            f.fail(format!(
                "int random uniform[0,10) {dt:?}: mean {mean}, range [{lo}, {hi}]"
            ));
        }
    }
    f.finish();
}

// ---------------------------------------------------------------------------------------------
// Multi-op chains on strided views (laziness/aliasing)
// ---------------------------------------------------------------------------------------------

diff!(chain_views_do_not_alias, Tol::TRANS, FLOATS, |ctx| {
    let x = ctx.f::<2>([4, 6], (-2.0, 2.0));
    let t = x.clone().transpose();
    let s = x.clone().slice(s![1..3, ..]);
    let y = x
        .clone()
        .slice_assign(s![0..2, 0..3], ctx.f([2, 3], (5.0, 6.0)));
    // x must be unchanged by slice_assign on a clone.
    (x.clone(), t.exp(), s.sum_dim(1), y, x.mul_scalar(2.0))
});
