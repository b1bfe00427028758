//! Differential tests of Burn's `BoolTensorOps` on burn-mlx against burn-ndarray, through Burn's
//! public `Tensor<B, D, Bool>` API.

use crate::common::*;
use burn_tensor::ElementConversion;
use burn_tensor::{s, Bool, DType, FloatDType, IndexingUpdateOp, IntDType, Tensor, TensorData};

// ---------------------------------------------------------------------------------------------
// Creation, data movement, conversion
// ---------------------------------------------------------------------------------------------

unary_bool!(from_data_into_data_all_layouts, |ctx, x| x);

diff!(creation_zeros_ones_empty, Tol::EXACT, |ctx| {
    let e = Tensor::<B, 3, Bool>::empty([2, 0, 3], &ctx.dev);
    let e2 = Tensor::<B, 2, Bool>::empty([2, 3], &ctx.dev);
    (
        Tensor::<B, 2, Bool>::zeros([2, 3], &ctx.dev),
        Tensor::<B, 2, Bool>::ones([2, 3], &ctx.dev),
        Tensor::<B, 1, Bool>::ones([0], &ctx.dev),
        Tensor::<B, 2, Bool>::full([2, 2], true, &ctx.dev),
        ctx.b::<2>([2, 3], 0.5).zeros_like(),
        ctx.b::<2>([2, 3], 0.5).ones_like(),
        (
            e.dims() == [2, 0, 3],
            e2.dims() == [2, 3],
            e.dtype() == e2.dtype(),
        ),
    )
});

diff!(device_to_device_into_scalar, Tol::EXACT, |ctx| {
    let x = ctx.b::<2>([3, 4], 0.5);
    let same = x.device() == ctx.dev;
    (
        x.to_device(&ctx.dev),
        same,
        ctx.bd::<1>([true]).into_scalar().elem::<bool>(),
        ctx.bd::<2>([[false]]).into_scalar().elem::<bool>(),
    )
});

unary_bool!(into_int_and_float, |ctx, x| (
    x.clone().int(),
    x.clone().float(),
    x.clone().cast(IntDType::I32),
    x.clone().cast(IntDType::U8),
    x.clone().cast(IntDType::I8),
    x.clone().cast(widest_float()),
    x.cast(FloatDType::F32),
));

diff!(
    into_half_float,
    Tol::EXACT,
    [DType::F16, DType::BF16],
    |ctx| {
        let x = ctx.bl::<2>([3, 4], 0.5, Layout::Transposed);
        x.cast(FloatDType::from(ctx.fdt_eff()))
    }
);

diff!(from_numeric, Tol::EXACT, |ctx| {
    let f = ctx.fd::<1>([0.0f32, -0.0, 1.0, f32::NAN, -2.5, 1e-30]);
    let i = ctx.idx::<1>([0i64, 1, -1, 0, 7]);
    (f.bool(), i.bool())
});

// ---------------------------------------------------------------------------------------------
// Logic
// ---------------------------------------------------------------------------------------------

unary_bool!(not, |ctx, x| x.bool_not());
binary_bool!(and_or_xor, |ctx, a, b| (
    a.clone().bool_and(b.clone()),
    a.clone().bool_or(b.clone()),
    a.bool_xor(b),
));
binary_bool!(equal_not_equal, |ctx, a, b| (
    a.clone().equal(b.clone()),
    a.not_equal(b)
));
unary_bool!(equal_elem, |ctx, x| (
    x.clone().equal_elem(true),
    x.clone().equal_elem(false),
    x.clone().not_equal_elem(true),
    x.not_equal_elem(false),
));

// ---------------------------------------------------------------------------------------------
// Reductions
// ---------------------------------------------------------------------------------------------

unary_bool!(any_all_dims, |ctx, x| {
    let mut v = outs((x.clone().any(), x.clone().all()));
    for d in 0..D {
        v.extend(outs((x.clone().any_dim(d), x.clone().all_dim(d))));
    }
    v
});
diff!(any_all_extremes, Tol::EXACT, |ctx| {
    let t = Tensor::<B, 2, Bool>::ones([3, 4], &ctx.dev);
    let f = Tensor::<B, 2, Bool>::zeros([3, 4], &ctx.dev);
    let e = Tensor::<B, 2, Bool>::zeros([0, 4], &ctx.dev);
    (
        (t.clone().any(), t.clone().all(), f.clone().any(), f.all()),
        (
            e.clone().any(),
            e.clone().all(),
            e.clone().any_dim(0),
            e.all_dim(0),
        ),
        (t.clone().any_dim(1), t.all_dim(0)),
    )
});

// ---------------------------------------------------------------------------------------------
// argwhere / nonzero (data-dependent shapes)
// ---------------------------------------------------------------------------------------------

unary_bool!(argwhere_nonzero, |ctx, x| (
    x.clone().argwhere(),
    x.nonzero()
));
diff!(argwhere_all_false_all_true, Tol::EXACT, |ctx| (
    Tensor::<B, 2, Bool>::zeros([3, 4], &ctx.dev).argwhere(),
    Tensor::<B, 2, Bool>::ones([2, 3], &ctx.dev).argwhere(),
    Tensor::<B, 3, Bool>::ones([1, 1, 1], &ctx.dev).argwhere(),
));

// ---------------------------------------------------------------------------------------------
// Shape ops
// ---------------------------------------------------------------------------------------------

unary_bool!(reshape_transpose_permute_flip, |ctx, x| {
    let n = x.shape().num_elements();
    let mut v: Vec<TensorData> = Vec::new();
    if n > 0 {
        v.extend(outs(x.clone().reshape::<1, _>([n as i64])));
    }
    v.extend(outs(x.clone().flip([0])));
    if D >= 2 {
        v.extend(outs(x.clone().transpose()));
        v.extend(outs(x.clone().swap_dims(0, D - 1)));
        let mut rev = [0usize; D];
        for (i, r) in rev.iter_mut().enumerate() {
            *r = D - 1 - i;
        }
        v.extend(outs(x.clone().permute(rev)));
        v.extend(outs(x.clone().flip([-1, 0])));
    }
    v
});
diff!(expand_repeat_cat_unfold, Tol::EXACT, |ctx| {
    let a = ctx.b::<2>([3, 1], 0.5);
    let b = ctx.bl::<2>([3, 4], 0.5, Layout::Transposed);
    (
        a.clone().expand([3, 4]),
        a.clone().expand([2, 3, 4]),
        a.clone().repeat_dim(1, 3),
        b.clone().repeat_dim(0, 2),
        b.clone().repeat(&[1, 3]),
        Tensor::cat(vec![a, b.clone(), ctx.b([3, 0], 0.5)], 1),
        Tensor::cat(vec![b.clone(), b.clone()], 0),
        b.clone().unfold::<3, _>(1, 2, 1),
        b.unfold::<3, _>(0, 2, 2),
    )
});

// ---------------------------------------------------------------------------------------------
// Slicing, indexing, masks
// ---------------------------------------------------------------------------------------------

diff!(slice_and_slice_assign, Tol::EXACT, |ctx| {
    let x = || ctx.b::<3>([6, 5, 4], 0.5);
    (
        x().slice(s![1..4, .., 2..]),
        x().slice(s![-3.., ..;-2, -1]),
        x().slice_assign(s![0..6;2, 1..3, ..], ctx.b([3, 2, 4], 0.5)),
        x().slice_assign(s![..;-1, -1, 1..3], ctx.b([6, 1, 2], 0.5)),
        x().slice_fill(s![2..4, .., 0..4;3], true),
    )
});
diff!(gather_scatter_or_select_or, Tol::EXACT, |ctx| {
    let x = ctx.b::<2>([4, 5], 0.3);
    let dup = ctx.idx::<1>([1i64, 3, 1, 0]);
    (
        x.clone().gather(1, ctx.ri([4, 6], 5)),
        x.clone().gather(0, ctx.ri([2, 5], 4)),
        x.clone().scatter(
            0,
            ctx.ri([6, 5], 4),
            ctx.b([6, 5], 0.5),
            IndexingUpdateOp::Add,
        ),
        x.clone().scatter(
            1,
            ctx.ri([4, 2], 5),
            ctx.b([4, 2], 0.5),
            IndexingUpdateOp::Add,
        ),
        x.clone().select(0, dup.clone()),
        x.clone().select(1, dup.clone()),
        x.clone()
            .select_assign(0, dup.clone(), ctx.b([4, 5], 0.5), IndexingUpdateOp::Add),
        x.select_assign(1, dup, ctx.b([4, 4], 0.5), IndexingUpdateOp::Add),
    )
});
diff!(mask_where_mask_fill, Tol::EXACT, |ctx| {
    let x = ctx.b::<2>([3, 4], 0.5);
    (
        x.clone().mask_where(ctx.b([3, 4], 0.5), ctx.b([3, 4], 0.5)),
        x.clone().mask_where(
            ctx.ref_expand(ctx.b([3, 1], 0.5), [3, 4]),
            ctx.b([1, 4], 0.5),
        ),
        x.clone().mask_fill(ctx.b([3, 4], 0.5), true),
        x.clone().mask_fill(ctx.b([1, 4], 0.5), false),
        ctx.bl::<2>([3, 4], 0.5, Layout::Permuted)
            .mask_fill(ctx.bl([3, 4], 0.5, Layout::Stepped), true),
    )
});

diff!(tri_diag_masks, Tol::EXACT, |ctx| (
    Tensor::<B, 2, Bool>::triu_mask([4, 5], 0, &ctx.dev),
    Tensor::<B, 2, Bool>::triu_mask([4, 5], -1, &ctx.dev),
    Tensor::<B, 2, Bool>::tril_mask([4, 5], 1, &ctx.dev),
    Tensor::<B, 2, Bool>::diag_mask([4, 4], 0, &ctx.dev),
));

// Bool results of other kinds' ops, fed back into bool ops (dtype / storage consistency).
diff!(comparison_results_compose, Tol::EXACT, |ctx| {
    let a = ctx.f::<2>([3, 4], (-1.0, 1.0));
    let b = ctx.i::<2>([3, 4], -2, 2);
    let m1 = a.clone().greater_elem(0.0);
    let m2 = b.equal_elem(0);
    let both = m1.clone().bool_and(m2.clone());
    (
        both.clone(),
        both.clone().int().sum(),
        m1.bool_xor(m2).float(),
        a.mask_fill(both, 9.0),
    )
});
