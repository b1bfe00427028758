//! Differential tests of Burn's `IntTensorOps` on burn-mlx against burn-ndarray, through Burn's
//! public `Tensor<B, D, Int>` API, over every int dtype (i64 default, i32, i16, i8, u64, u32, u16,
//! u8) where the op takes it.
//!
//! `int_powi_scalar_impl` has no public method and is called through the trait. Int random
//! statistics are checked in `float_ops.rs` (`random_distributions_statistics`).

use crate::common::*;
use burn_tensor::backend::Backend;
use burn_tensor::ElementConversion;
use burn_tensor::{s, DType, FloatDType, IndexingUpdateOp, Int, IntDType, Tensor, TensorData};

// ---------------------------------------------------------------------------------------------
// Creation, data movement, casts
// ---------------------------------------------------------------------------------------------

unary_int!(
    from_data_into_data_all_layouts,
    (-100, 100),
    INTS,
    |ctx, x| x
);

diff_int!(creation_zeros_ones_full_empty, INTS, |ctx| {
    let e = Tensor::<B, 3, Int>::empty([2, 0, 4], ctx.io());
    let e2 = Tensor::<B, 2, Int>::empty([2, 3], ctx.io());
    (
        Tensor::<B, 2, Int>::zeros([2, 3], ctx.io()),
        Tensor::<B, 2, Int>::ones([2, 3], ctx.io()),
        Tensor::<B, 2, Int>::full([2, 3], 7, ctx.io()),
        Tensor::<B, 1, Int>::full([0], 7, ctx.io()),
        ctx.i::<2>([2, 2], 0, 9).zeros_like(),
        ctx.i::<2>([2, 2], 0, 9).ones_like(),
        ctx.i::<2>([2, 2], 0, 9).full_like(5),
        (
            e.dims() == [2, 0, 4],
            e.dtype() == ctx.idt,
            e2.dims() == [2, 3],
            e2.dtype() == ctx.idt,
        ),
    )
});

diff_int!(device_to_device_into_scalar, INTS, |ctx| {
    let x = ctx.i::<2>([3, 4], 0, 100);
    let same = x.device() == ctx.dev;
    let one = ctx.id::<1>([42i64]);
    (x.to_device(&ctx.dev), same, one.into_scalar().elem::<i64>())
});

diff_int!(
    arange_and_arange_step,
    [DType::I64, DType::I32, DType::I16],
    |ctx| (
        Tensor::<B, 1, Int>::arange(0..10, ctx.io()),
        Tensor::<B, 1, Int>::arange(-5..3, ctx.io()),
        Tensor::<B, 1, Int>::arange(3..3, ctx.io()),
        Tensor::<B, 1, Int>::arange_step(0..10, 3, ctx.io()),
        Tensor::<B, 1, Int>::arange_step(-7..8, 5, ctx.io()),
        Tensor::<B, 1, Int>::arange(0..10, &ctx.dev),
    )
);

diff_int!(int_to_int_casts, INTS, |ctx| {
    // 0..100 fits every int dtype.
    let x = ctx.il::<2>([3, 4], 0, 100, Layout::Transposed);
    vec![
        x.clone().cast(IntDType::I64),
        x.clone().cast(IntDType::I32),
        x.clone().cast(IntDType::I16),
        x.clone().cast(IntDType::I8),
        x.clone().cast(IntDType::U64),
        x.clone().cast(IntDType::U32),
        x.clone().cast(IntDType::U16),
        x.cast(IntDType::U8),
    ]
});

diff_int!(signed_casts_negative_values, SINTS, |ctx| {
    let x = ctx.i::<1>([12], -100, 100);
    (
        x.clone().cast(IntDType::I64),
        x.clone().cast(IntDType::I32),
        x.clone().cast(IntDType::I16),
        x.cast(IntDType::I8),
    )
});

diff_int!(int_into_float, INTS, |ctx| {
    let x = ctx.il::<2>([3, 4], 0, 100, Layout::Flipped);
    (
        x.clone().float(),
        x.clone().cast(widest_float()),
        x.cast(FloatDType::F32),
    )
});

diff!(
    int_into_half_float,
    Tol::EXACT,
    [DType::F16, DType::BF16],
    |ctx| {
        // Small ints are exact in f16/bf16; the reference casts to f32.
        let x = ctx.i_as::<2>([3, 4], -100, 100, DType::I32);
        x.cast(FloatDType::from(ctx.fdt_eff()))
    }
);

// ---------------------------------------------------------------------------------------------
// Arithmetic
// ---------------------------------------------------------------------------------------------

binary_int!(add_signed, (-50, 50), (-50, 50), SINTS, |ctx, a, b| a + b);
binary_int!(
    add_unsigned,
    (0, 100),
    (0, 100),
    [DType::U8, DType::U16, DType::U32, DType::U64],
    |ctx, a, b| a + b
);
binary_int!(sub_signed, (-50, 50), (-50, 50), SINTS, |ctx, a, b| a - b);
binary_int!(
    sub_unsigned,
    (100, 200),
    (0, 100),
    [DType::U8, DType::U16, DType::U32, DType::U64],
    |ctx, a, b| a - b
);
binary_int!(mul, (-10, 10), (-10, 10), INTS, |ctx, a, b| a * b);
binary_int!(div_trunc_signs, (-100, 100), (1, 9), SINTS, |ctx, a, b| (
    a.clone() / b.clone(),
    a / b.neg(),
));
binary_int!(
    div_unsigned,
    (0, 200),
    (1, 9),
    [DType::U8, DType::U16, DType::U32, DType::U64],
    |ctx, a, b| a / b
);
binary_int!(remainder_signs, (-100, 100), (1, 9), SINTS, |ctx, a, b| (
    a.clone().remainder(b.clone()),
    a % b.neg(),
));
binary_int!(
    remainder_unsigned,
    (0, 200),
    (1, 9),
    [DType::U8, DType::U16, DType::U32, DType::U64],
    |ctx, a, b| a.remainder(b)
);
binary_int!(max_min_pair, (-5, 5), (-5, 5), INTS, |ctx, a, b| (
    a.clone().max_pair(b.clone()),
    a.min_pair(b),
));
binary_int!(powi_tensor, (-3, 4), (0, 4), SINTS, |ctx, a, b| a.powi(b));
binary_int!(comparisons, (-3, 3), (-3, 3), INTS, |ctx, a, b| (
    a.clone().equal(b.clone()),
    a.clone().not_equal(b.clone()),
    a.clone().greater(b.clone()),
    a.clone().greater_equal(b.clone()),
    a.clone().lower(b.clone()),
    a.lower_equal(b),
));

diff_int!(div_remainder_exact_cases, SINTS, |ctx| {
    let a = ctx.id::<1>([7i64, -7, 7, -7, 6, -6, 0, 1, -1, 100, -100, 5]);
    let b = ctx.id::<1>([2i64, 2, -2, -2, 3, 3, 5, 1, 1, 7, 7, -3]);
    (
        a.clone() / b.clone(),
        a.clone().remainder(b.clone()),
        a.clone().div_scalar(2),
        a.clone().div_scalar(-2),
        a.clone().remainder_scalar(3),
        a.remainder_scalar(-3),
    )
});

unary_int!(scalar_arith_signed, (-50, 50), SINTS, |ctx, x| (
    x.clone().add_scalar(3),
    x.clone().sub_scalar(-4),
    x.clone().mul_scalar(-2),
    x.clone().div_scalar(3),
    x.clone().div_scalar(-3),
    x.clone().remainder_scalar(4),
    x.clone().remainder_scalar(-4),
    x.clone() + 1,
    x.clone() * 2,
    x.clone() - 1,
    x.clone() / 2,
    x % 3,
));
unary_int!(
    scalar_arith_unsigned,
    (20, 100),
    [DType::U8, DType::U16, DType::U32, DType::U64],
    |ctx, x| (
        x.clone().add_scalar(3),
        x.clone().sub_scalar(4),
        x.clone().mul_scalar(2),
        x.clone().div_scalar(3),
        x.remainder_scalar(7),
    )
);
unary_int!(powi_scalar, (-3, 4), SINTS, |ctx, x| (
    x.clone().powi_scalar(0),
    x.clone().powi_scalar(1),
    x.clone().powi_scalar(2),
    x.powi_scalar(3),
));
diff_int!(int_powi_scalar_impl_trait, SINTS, |ctx| {
    let x = ctx.i::<2>([3, 4], -3, 4);
    let p = B::int_powi_scalar_impl(x.into_primitive(), 3i64.into());
    Tensor::<B, 2, Int>::from_primitive(p)
});
unary_int!(neg_abs_sign, (-50, 50), SINTS, |ctx, x| (
    x.clone().neg(),
    x.clone().abs(),
    x.sign()
));
unary_int!(
    abs_sign_unsigned,
    (0, 50),
    [DType::U8, DType::U16, DType::U32, DType::U64],
    |ctx, x| {
        // burn-ndarray's sign of an unsigned tensor returns a bool tensor: the reference is
        // (x > 0) as the same int dtype.
        let sign = if ctx.is_ref {
            x.clone()
                .greater_elem(0)
                .int()
                .cast(IntDType::from(ctx.idt))
        } else {
            x.clone().sign()
        };
        (x.abs(), sign)
    }
);
unary_int!(clamp, (-50, 50), SINTS, |ctx, x| (
    x.clone().clamp(-10, 20),
    x.clone().clamp_min(0),
    x.clone().clamp_max(-5),
));
unary_int!(
    clamp_unsigned,
    (0, 100),
    [DType::U8, DType::U16, DType::U32, DType::U64],
    |ctx, x| (
        x.clone().clamp(10, 20),
        x.clone().clamp_min(50),
        x.clamp_max(30),
    )
);
unary_int!(compare_elem, (-3, 3), SINTS, |ctx, x| (
    x.clone().equal_elem(1),
    x.clone().not_equal_elem(1),
    x.clone().greater_elem(0),
    x.clone().greater_equal_elem(0),
    x.clone().lower_elem(-1),
    x.lower_equal_elem(-1),
));
unary_int!(
    compare_elem_unsigned,
    (0, 6),
    [DType::U8, DType::U16, DType::U32, DType::U64],
    |ctx, x| (
        x.clone().equal_elem(1),
        x.clone().greater_elem(2),
        x.lower_equal_elem(3),
    )
);

diff_int!(matmul, [DType::I64, DType::I32, DType::I16], |ctx| (
    ctx.i::<2>([3, 4], -5, 5).matmul(ctx.i([4, 5], -5, 5)),
    ctx.i::<3>([2, 3, 4], -5, 5).matmul(ctx.i([2, 4, 2], -5, 5)),
    ctx.i::<3>([1, 3, 4], -5, 5).matmul(ctx.i([3, 4, 2], -5, 5)),
    ctx.il::<2>([3, 4], -5, 5, Layout::Transposed)
        .matmul(ctx.il([4, 2], -5, 5, Layout::Stepped)),
    // burn-ndarray divides by zero on an empty inner dim: the reference is zeros.
    if ctx.is_ref {
        Tensor::<B, 2, Int>::zeros([2, 3], ctx.io())
    } else {
        ctx.i::<2>([2, 0], -5, 5).matmul(ctx.i([0, 3], -5, 5))
    },
));
diff_int!(matmul_unsigned, [DType::U8, DType::U32], |ctx| {
    ctx.i::<2>([3, 4], 0, 5).matmul(ctx.i([4, 5], 0, 5))
});

// ---------------------------------------------------------------------------------------------
// Bitwise ops and shifts
// ---------------------------------------------------------------------------------------------

fn bits(d: DType) -> i64 {
    match d {
        DType::I8 | DType::U8 => 8,
        DType::I16 | DType::U16 => 16,
        DType::I32 | DType::U32 => 32,
        _ => 64,
    }
}

binary_int!(
    bitwise_and_or_xor,
    (-128, 127),
    (-128, 127),
    INTS,
    |ctx, a, b| (
        a.clone().bitwise_and(b.clone()),
        a.clone().bitwise_or(b.clone()),
        a.bitwise_xor(b),
    )
);
/// Host-computed int reference: `f` on each value (as i128), wrapped to the dtype's width.
/// burn-ndarray computes bitwise ops in i64 and converts back with a checked cast, so it panics
/// where the true result wraps (unsigned `not`, left shifts that overflow).
fn host_int<B: Backend, const D: usize>(
    x: Tensor<B, D, Int>,
    f: impl Fn(i128) -> i128,
) -> Tensor<B, D, Int> {
    let dev = x.device();
    let data = x.into_data();
    let shape = data.shape.clone();
    let dtype = data.dtype;
    let vals: Vec<i128> = match dtype {
        DType::U64 => data.iter::<u64>().map(|v| v as i128).collect(),
        _ => data.iter::<i64>().map(|v| v as i128).collect(),
    };
    let out: Vec<i128> = vals.into_iter().map(f).collect();
    let td = match dtype {
        DType::I64 => TensorData::new(out.iter().map(|&v| v as i64).collect::<Vec<_>>(), shape),
        DType::I32 => TensorData::new(out.iter().map(|&v| v as i32).collect::<Vec<_>>(), shape),
        DType::I16 => TensorData::new(out.iter().map(|&v| v as i16).collect::<Vec<_>>(), shape),
        DType::I8 => TensorData::new(out.iter().map(|&v| v as i8).collect::<Vec<_>>(), shape),
        DType::U64 => TensorData::new(out.iter().map(|&v| v as u64).collect::<Vec<_>>(), shape),
        DType::U32 => TensorData::new(out.iter().map(|&v| v as u32).collect::<Vec<_>>(), shape),
        DType::U16 => TensorData::new(out.iter().map(|&v| v as u16).collect::<Vec<_>>(), shape),
        DType::U8 => TensorData::new(out.iter().map(|&v| v as u8).collect::<Vec<_>>(), shape),
        d => panic!("host_int: not an int dtype {d:?}"),
    };
    Tensor::from_data(td, (&dev, dtype))
}

unary_int!(bitwise_not_and_scalars, (-128, 127), INTS, |ctx, x| {
    let not = if ctx.is_ref && is_unsigned(ctx.idt) {
        host_int(x.clone(), |v| !v)
    } else {
        x.clone().bitwise_not()
    };
    (
        not,
        x.clone().bitwise_and_scalar((0x5a).elem()),
        x.clone().bitwise_or_scalar((0x21).elem()),
        x.bitwise_xor_scalar((0x7f).elem()),
    )
});
diff_int!(bitwise_shifts, INTS, |ctx| {
    let n = bits(ctx.idt);
    let signed = !is_unsigned(ctx.idt);
    let lo = if signed { -100 } else { 0 };
    let x = ctx.i::<2>([4, 6], lo, 100);
    // Left shifts of values in [-8, 16) by at most 3 fit every dtype.
    let small_x = ctx.i::<2>([4, 6], if signed { -8 } else { 0 }, 16);
    let sh = ctx.i::<2>([4, 6], 0, n);
    let small = ctx.i::<2>([4, 6], 0, 4);
    (
        small_x.clone().bitwise_left_shift(small),
        x.clone().bitwise_right_shift(sh),
        small_x.clone().bitwise_left_shift_scalar((3).elem()),
        x.clone().bitwise_right_shift_scalar((1).elem()),
        x.bitwise_right_shift_scalar((n - 1).elem()),
        small_x.bitwise_left_shift(ctx.i::<2>([1, 6], 0, 3)),
    )
});
diff_int!(bitwise_shift_wrapping, INTS, |ctx| {
    // Extremes: left shifts that overflow wrap (two's complement); right shifts of negative
    // values are arithmetic.
    let n = bits(ctx.idt) as u32;
    let (min, max) = int_range(ctx.idt, i64::MIN, i64::MAX);
    let x = ctx.id::<1>([min, max, min + 1, max - 1, 1, 0]);
    let mask: i128 = (1i128 << n) - 1;
    let signed = !is_unsigned(ctx.idt);
    let wrap = move |v: i128| {
        let u = v & mask;
        if signed && (u >> (n - 1)) & 1 == 1 {
            u - (1i128 << n)
        } else {
            u
        }
    };
    let shl1 = if ctx.is_ref {
        host_int(x.clone(), move |v| wrap(v << 1))
    } else {
        x.clone().bitwise_left_shift_scalar((1).elem())
    };
    let shl3 = if ctx.is_ref {
        host_int(x.clone(), move |v| wrap(v << 3))
    } else {
        x.clone().bitwise_left_shift(ctx.id::<1>([3i64; 6]))
    };
    let not = if ctx.is_ref {
        host_int(x.clone(), move |v| wrap(!v))
    } else {
        x.clone().bitwise_not()
    };
    (
        shl1,
        shl3,
        not,
        x.clone().bitwise_right_shift_scalar((1).elem()),
        x.bitwise_right_shift_scalar(((n - 1) as i64).elem()),
    )
});

// ---------------------------------------------------------------------------------------------
// Shape ops
// ---------------------------------------------------------------------------------------------

unary_int!(
    reshape_transpose_permute_flip,
    (-100, 100),
    INTS,
    |ctx, x| {
        let n = x.shape().num_elements();
        let mut v: Vec<TensorData> = Vec::new();
        if n > 0 {
            v.extend(outs(x.clone().reshape::<1, _>([n as i64])));
        }
        v.extend(outs(x.clone().flip([0])));
        v.extend(outs(x.clone().flip([-1])));
        if D >= 2 {
            v.extend(outs(x.clone().transpose()));
            v.extend(outs(x.clone().swap_dims(0, D - 1)));
            let mut rev = [0usize; D];
            for (i, r) in rev.iter_mut().enumerate() {
                *r = D - 1 - i;
            }
            v.extend(outs(x.clone().permute(rev)));
            v.extend(outs(x.clone().flip([0, 1])));
        }
        v
    }
);
diff_int!(expand_repeat_cat, INTS, |ctx| {
    let a = ctx.i::<2>([3, 1], 0, 100);
    let b = ctx.il::<2>([3, 4], 0, 100, Layout::Transposed);
    let e = ctx.i::<2>([3, 0], 0, 100);
    (
        a.clone().expand([3, 4]),
        a.clone().expand([2, 3, 5]),
        a.clone().repeat_dim(1, 3),
        b.clone().repeat_dim(0, 2),
        b.clone().repeat(&[2, 2]),
        Tensor::cat(vec![a, b.clone(), e], 1),
        Tensor::cat(vec![b.clone(), b], 0),
    )
});
diff_int!(unfold_windows, INTS, |ctx| {
    let x = ctx.i::<2>([3, 8], 0, 100);
    (x.clone().unfold::<3, _>(1, 3, 2), x.unfold::<3, _>(0, 2, 1))
});

// ---------------------------------------------------------------------------------------------
// Slicing, indexing, masks
// ---------------------------------------------------------------------------------------------

diff_int!(slice_and_slice_assign, INTS, |ctx| {
    let x = || ctx.i::<3>([6, 5, 4], 0, 100);
    (
        x().slice(s![1..4, .., 2..]),
        x().slice(s![-3.., ..-1, -2]),
        x().slice(s![0..6;2, ..;-1, 1..4;2]),
        x().slice_assign(s![1..5;2, 1..3, ..], ctx.i([2, 2, 4], 0, 100)),
        x().slice_assign(s![..;-1, -1, ..], ctx.i([6, 1, 4], 0, 100)),
        x().slice_fill(s![2..4, .., 0..4;3], 9),
    )
});
diff_int!(gather_scatter_select, INTS, |ctx| {
    let x = ctx.i::<2>([4, 5], 0, 50);
    let dup = ctx.idx::<1>([1i64, 3, 1, 0]);
    (
        x.clone().gather(1, ctx.ri([4, 6], 5)),
        x.clone().gather(0, ctx.ri([2, 5], 4)),
        x.clone().scatter(
            0,
            ctx.ri([6, 5], 4),
            ctx.i([6, 5], 0, 10),
            IndexingUpdateOp::Add,
        ),
        x.clone().scatter(
            1,
            ctx.ri([4, 2], 5),
            ctx.i([4, 2], 0, 10),
            IndexingUpdateOp::Add,
        ),
        x.clone().select(0, dup.clone()),
        x.clone().select(1, dup.clone()),
        x.clone()
            .select_assign(0, dup.clone(), ctx.i([4, 5], 0, 10), IndexingUpdateOp::Add),
        x.select_assign(1, dup, ctx.i([4, 4], 0, 10), IndexingUpdateOp::Add),
    )
});
diff_int!(
    gather_nd_scatter_nd,
    [DType::I64, DType::I32, DType::U64, DType::U8],
    |ctx| {
        let x = ctx.i::<3>([4, 5, 3], 0, 20);
        let i2 = ctx.idx::<2>([[0i64, 1], [3, 4], [2, 0]]);
        let i1 = ctx.idx::<2>([[1i64], [3], [1]]);
        let g: Tensor<B, 2, Int> = x.clone().gather_nd::<2, 2>(i2.clone());
        let mut v = vec![x.clone().scatter_nd::<2, 2>(
            i2.clone(),
            ctx.i([3, 3], 0, 5),
            IndexingUpdateOp::Assign,
        )];
        for op in [
            IndexingUpdateOp::Add,
            IndexingUpdateOp::Mul,
            IndexingUpdateOp::Min,
            IndexingUpdateOp::Max,
        ] {
            v.push(
                x.clone()
                    .scatter_nd::<2, 3>(i1.clone(), ctx.i([3, 5, 3], 0, 5), op),
            );
        }
        (g, v)
    }
);
diff_int!(mask_where_mask_fill, INTS, |ctx| {
    let x = ctx.i::<2>([3, 4], 0, 50);
    (
        x.clone()
            .mask_where(ctx.b([3, 4], 0.5), ctx.i([3, 4], 50, 100)),
        x.clone().mask_where(
            ctx.ref_expand(ctx.b([3, 1], 0.5), [3, 4]),
            ctx.i([1, 4], 50, 100),
        ),
        x.clone().mask_fill(ctx.b([3, 4], 0.5), 77),
        x.mask_fill(ctx.b([1, 4], 0.5), 5),
        ctx.il::<2>([3, 4], 0, 50, Layout::Transposed)
            .mask_fill(ctx.bl([3, 4], 0.5, Layout::Flipped), 1),
    )
});

// ---------------------------------------------------------------------------------------------
// Reductions, cumulative ops, sorting
// ---------------------------------------------------------------------------------------------

unary_int!(sum_prod_mean_dims, (-4, 5), SINTS, |ctx, x| {
    // The integer mean of an empty tensor (0/0) has no value: only sums are compared there.
    let empty = x.shape().num_elements() == 0;
    let mut v = outs(x.clone().sum());
    if !empty {
        v.extend(outs(x.clone().mean()));
    }

    for d in 0..D {
        v.extend(outs(x.clone().sum_dim(d)));
        if x.dims()[d] > 0 {
            v.extend(outs(x.clone().mean_dim(d)));
        }
    }
    v
});
unary_int!(
    sum_mean_unsigned,
    (0, 9),
    [DType::U8, DType::U16, DType::U32, DType::U64],
    |ctx, x| {
        let n = x.shape().num_elements();
        let mut v = Vec::new();
        if n > 0 {
            v.extend(outs(x.clone().mean()));
        }
        if n <= 20 {
            v.extend(outs(x.clone().sum()));
        }
        for d in 0..D {
            if x.dims()[d] > 0 {
                v.extend(outs(x.clone().mean_dim(d)));
            }
        }
        v
    }
);
unary_int!(prod_dims, (-2, 3), SINTS, |ctx, x| {
    // |values| <= 2 over at most 6 factors: fits i8.
    let mut v = Vec::new();
    if x.shape().num_elements() <= 6 {
        v.extend(outs(x.clone().prod()));
    }
    for d in 0..D {
        if x.dims()[d] <= 6 {
            v.extend(outs(x.clone().prod_dim(d)));
        }
    }
    v
});
diff_int!(mean_rounding, SINTS, |ctx| {
    // Integer mean of values whose true mean is not an integer (negative included).
    let x = ctx.id::<2>([[1i64, 2, 2], [-1, -2, -2], [3, 4, -4]]);
    (x.clone().mean(), x.clone().mean_dim(1), x.mean_dim(0))
});
unary_int!(max_min_argmax_ties, (-3, 3), INTS, |ctx, x| {
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
                x.clone().max_dim_with_indices(d),
                x.clone().min_dim_with_indices(d),
                (x.clone().argmax(d), x.clone().argmin(d)),
            )));
        }
    }
    v
});
unary_int!(any_all, (0, 2), INTS, |ctx, x| {
    let mut v = outs((x.clone().any(), x.clone().all()));
    for d in 0..D {
        v.extend(outs((x.clone().any_dim(d), x.clone().all_dim(d))));
    }
    v
});
unary_int!(cumulative, (-3, 4), SINTS, |ctx, x| {
    let mut v = Vec::new();
    for d in 0..D {
        v.extend(outs((
            x.clone().cumsum(d),
            x.clone().cumprod(d),
            x.clone().cummin(d),
            x.clone().cummax(d),
        )));
    }
    v
});
unary_int!(
    cumulative_unsigned,
    (0, 4),
    [DType::U8, DType::U32],
    |ctx, x| {
        let mut v = Vec::new();
        for d in 0..D {
            v.extend(outs((
                x.clone().cumsum(d),
                x.clone().cummin(d),
                x.clone().cummax(d),
            )));
        }
        v
    }
);
unary_int!(sort_argsort_ties, (-3, 3), INTS, |ctx, x| {
    let mut v = Vec::new();
    for d in 0..D {
        v.extend(outs((
            x.clone().sort_with_indices(d),
            x.clone().sort_descending_with_indices(d),
            x.clone().sort(d),
            x.clone().sort_descending(d),
            x.clone().argsort(d),
            x.clone().argsort_descending(d),
        )));
    }
    v
});
diff_int!(topk_and_argtopk, INTS, |ctx| {
    let x = ctx.i::<2>([4, 7], 0, 5);
    let argtopk = if ctx.is_ref {
        x.clone().argsort_descending(1).slice(s![.., 0..3])
    } else {
        x.clone().argtopk(3, 1)
    };
    (
        x.clone().topk(3, 1),
        x.clone().topk(2, 0),
        x.topk_with_indices(3, 1),
        argtopk,
    )
});

// ---------------------------------------------------------------------------------------------
// Composite ops built on int ops
// ---------------------------------------------------------------------------------------------

diff_int!(one_hot_and_cartesian, [DType::I64, DType::I32], |ctx| {
    let x = ctx.i::<1>([6], 0, 4);
    let oh: Tensor<B, 2, Int> = x.one_hot(4);
    let tri = ctx.i::<2>([4, 4], 0, 9);
    (oh, tri.clone().triu(1), tri.tril(0))
});
