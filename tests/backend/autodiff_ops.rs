//! Differential gradient tests: `Autodiff<Mlx>` against `Autodiff<NdArray>`.
//!
//! Each test builds the same graph on both backends, reduces it with a random weighting
//! (`sum(y * w)`, so every output element gets a distinct upstream gradient), runs `backward()` and
//! compares the forward values and the gradient of every input. This also exercises the
//! `*_backward` ops of `ActivationOps` (relu, gelu, sigmoid, log_sigmoid).

use crate::common::*;
use burn_tensor::activation;
use burn_tensor::{s, DType, IndexingUpdateOp, Tensor};

const F32_F64: [DType; 2] = [DType::F32, DType::F64];

/// One-input gradient test: `grad1!(name, tol, dtypes, shape, dist, |x| expr)`.
macro_rules! grad1 {
    ($name:ident, $tol:expr, $dtypes:expr, $shape:expr, $dist:expr, |$x:ident| $body:expr) => {
        diff_ad!($name, $tol, $dtypes, |ctx| {
            let x0 = ctx.f($shape, $dist).require_grad();
            let $x = x0.clone();
            let y = $body;
            let g = backward_weighted(ctx, y.clone());
            (y, x0.grad(&g))
        });
    };
}

/// Two-input gradient test: `grad2!(name, tol, dtypes, shape_a, dist_a, shape_b, dist_b, |a, b| expr)`.
macro_rules! grad2 {
    ($name:ident, $tol:expr, $dtypes:expr, $sa:expr, $da:expr, $sb:expr, $db:expr,
     |$a:ident, $b:ident| $body:expr) => {
        diff_ad!($name, $tol, $dtypes, |ctx| {
            let a0 = ctx.f($sa, $da).require_grad();
            let b0 = ctx.f($sb, $db).require_grad();
            let ($a, $b) = (a0.clone(), b0.clone());
            let y = $body;
            let g = backward_weighted(ctx, y.clone());
            (y, a0.grad(&g), b0.grad(&g))
        });
    };
}

// ---------------------------------------------------------------------------------------------
// Arithmetic (with broadcasting: gradients must be reduced to the input shapes)
// ---------------------------------------------------------------------------------------------

grad2!(
    grad_add_broadcast,
    Tol::F32,
    [DType::F32, DType::F64, DType::F16],
    [3, 1],
    (-2.0, 2.0),
    [1, 4],
    (-2.0, 2.0),
    |a, b| a + b
);
grad2!(
    grad_sub_broadcast,
    Tol::F32,
    [DType::F32, DType::F64],
    [2, 3, 4],
    (-2.0, 2.0),
    [3, 1],
    (-2.0, 2.0),
    |a, b| a - b.unsqueeze::<3>()
);
grad2!(
    grad_mul_broadcast,
    Tol::F32,
    [DType::F32, DType::F64, DType::BF16],
    [3, 1],
    (-2.0, 2.0),
    [1, 4],
    (-2.0, 2.0),
    |a, b| a * b
);
grad2!(
    grad_div,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [3, 4],
    (-2.0, 2.0),
    [1, 4],
    Dist::nz(-2.0, 2.0, 0.5),
    |a, b| a / b
);
grad2!(
    grad_powf_tensor,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [3, 4],
    (0.2, 3.0),
    [3, 4],
    (-2.0, 2.0),
    |a, b| a.powf(b)
);
grad2!(
    grad_atan2,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [3, 4],
    (-2.0, 2.0),
    [3, 4],
    Dist::nz(-2.0, 2.0, 0.2),
    |a, b| a.atan2(b)
);
grad2!(
    grad_max_min_pair,
    Tol::F32,
    [DType::F32, DType::F64],
    [3, 4],
    (-2.0, 2.0),
    [3, 4],
    (-2.0, 2.0),
    |a, b| a.clone().max_pair(b.clone()) + a.min_pair(b) * 2.0
);
grad2!(
    grad_remainder,
    Tol::F32,
    [DType::F32],
    [3, 4],
    (-5.0, 5.0),
    [3, 4],
    Dist::nz(-2.0, 2.0, 0.5),
    |a, b| a.remainder(b)
);
grad1!(
    grad_scalar_ops,
    Tol::F32,
    [DType::F32, DType::F64],
    [3, 4],
    (-2.0, 2.0),
    |x| { ((x.clone() + 1.5) * -2.0 - 0.5) / 4.0 + x.remainder_scalar(0.7) }
);
grad1!(
    grad_neg_recip,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [3, 4],
    Dist::nz(-2.0, 2.0, 0.3),
    |x| x.clone().neg() + x.recip()
);
grad1!(
    grad_powf_scalar,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [3, 4],
    (0.1, 3.0),
    |x| x.clone().powf_scalar(2.5) + x.clone().powf_scalar(-0.5) + x.powf_scalar(3.0)
);
grad1!(
    grad_powi_scalar_square,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [3, 4],
    (-2.0, 2.0),
    |x| x.clone().powi_scalar(3)
        + x.clone().powi_scalar(2)
        + x.clone().square()
        + x.powi_scalar(-1)
);

// ---------------------------------------------------------------------------------------------
// Elementwise math
// ---------------------------------------------------------------------------------------------

grad1!(
    grad_exp,
    Tol::TRANS,
    [DType::F32, DType::F64, DType::F16],
    [3, 4],
    (-2.0, 2.0),
    |x| x.exp()
);
grad1!(
    grad_log,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [3, 4],
    (0.1, 4.0),
    |x| x.log()
);
grad1!(
    grad_log1p,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [3, 4],
    (-0.5, 4.0),
    |x| x.log1p()
);
grad1!(
    grad_sqrt,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [3, 4],
    (0.1, 4.0),
    |x| x.sqrt()
);
grad1!(
    grad_abs,
    Tol::F32,
    [DType::F32, DType::F64],
    [3, 4],
    Dist::nz(-2.0, 2.0, 0.1),
    |x| x.abs()
);
grad1!(
    grad_sin_cos_tan,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [3, 4],
    (-1.2, 1.2),
    |x| x.clone().sin() + x.clone().cos() * 2.0 + x.tan() * 3.0
);
grad1!(
    grad_hyperbolic,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [3, 4],
    (-2.0, 2.0),
    |x| x.clone().sinh() + x.clone().cosh() * 2.0 + x.tanh() * 3.0
);
grad1!(
    grad_inverse_trig,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [3, 4],
    (-0.9, 0.9),
    |x| x.clone().asin()
        + x.clone().acos() * 2.0
        + x.clone().atan() * 3.0
        + x.clone().atanh()
        + x.asinh()
);
grad1!(
    grad_acosh,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [3, 4],
    (1.1, 4.0),
    |x| x.acosh()
);
grad1!(
    grad_erf,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [3, 4],
    (-2.0, 2.0),
    |x| x.erf()
);
grad1!(
    grad_round_floor_ceil_sign,
    Tol::F32,
    [DType::F32],
    [3, 4],
    (-3.0, 3.0),
    |x| x.clone().round()
        + x.clone().floor()
        + x.clone().ceil()
        + x.clone().trunc()
        + x.clone().sign()
        + x
);
grad1!(
    grad_clamp,
    Tol::F32,
    [DType::F32, DType::F64],
    [3, 4],
    (-3.0, 3.0),
    |x| x.clone().clamp(-1.0, 1.5) + x.clone().clamp_min(0.5) + x.clamp_max(-0.5)
);

// ---------------------------------------------------------------------------------------------
// Matmul
// ---------------------------------------------------------------------------------------------

grad2!(
    grad_matmul_2d,
    Tol::TRANS,
    [DType::F32, DType::F64, DType::F16],
    [3, 4],
    (-1.0, 1.0),
    [4, 5],
    (-1.0, 1.0),
    |a, b| a.matmul(b)
);
grad2!(
    grad_matmul_batched_broadcast,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [2, 1, 3, 4],
    (-1.0, 1.0),
    [1, 3, 4, 2],
    (-1.0, 1.0),
    |a, b| a.matmul(b)
);
grad2!(
    grad_matmul_transposed_inputs,
    Tol::TRANS,
    [DType::F32],
    [4, 3],
    (-1.0, 1.0),
    [5, 4],
    (-1.0, 1.0),
    |a, b| a.transpose().matmul(b.transpose())
);

diff_ad!(
    grad_mlp_chain,
    Tol::TRANS,
    [DType::F32, DType::F64],
    |ctx| {
        let x = ctx.f::<2>([5, 4], (-1.0, 1.0));
        let w1 = ctx.f::<2>([4, 8], (-0.5, 0.5)).require_grad();
        let b1 = ctx.f::<1>([8], (-0.1, 0.1)).require_grad();
        let w2 = ctx.f::<2>([8, 3], (-0.5, 0.5)).require_grad();
        let h = activation::relu(x.matmul(w1.clone()) + b1.clone().unsqueeze::<2>());
        let logits = h.matmul(w2.clone());
        let loss = activation::log_softmax(logits, 1).mean().neg();
        let g = loss.clone().backward();
        (loss, w1.grad(&g), b1.grad(&g), w2.grad(&g))
    }
);

diff_ad!(
    grad_accumulates_over_uses,
    Tol::TRANS,
    [DType::F32],
    |ctx| {
        let x = ctx.f::<2>([3, 4], (-1.0, 1.0)).require_grad();
        let y = x.clone() * x.clone()
            + x.clone().exp()
            + x.clone()
                .matmul(x.clone().transpose())
                .sum()
                .unsqueeze::<2>();
        let g = backward_weighted(ctx, y.clone());
        (y, x.grad(&g))
    }
);

diff_ad!(grad_detach_stops_flow, Tol::F32, [DType::F32], |ctx| {
    let x = ctx.f::<2>([3, 4], (-1.0, 1.0)).require_grad();
    let d = x.clone().detach();
    let y = x.clone() * d.clone() + d.clone().exp();
    let g = backward_weighted(ctx, y.clone());
    (y, x.grad(&g), x.is_require_grad(), d.is_require_grad())
});

// ---------------------------------------------------------------------------------------------
// Reductions and cumulative ops
// ---------------------------------------------------------------------------------------------

grad1!(
    grad_sum_mean,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [2, 3, 4],
    (-2.0, 2.0),
    |x| x.clone().sum_dim(1) * 2.0
        + x.clone().mean_dim(2)
        + x.clone().sum().unsqueeze::<3>()
        + x.mean().unsqueeze::<3>()
);
grad1!(
    grad_prod,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [3, 4],
    Dist::nz(-1.5, 1.5, 0.3),
    |x| x.clone().prod_dim(1) + x.prod().unsqueeze::<2>()
);
grad1!(
    grad_max_min_dim,
    Tol::F32,
    [DType::F32, DType::F64],
    [3, 5],
    (-2.0, 2.0),
    |x| x.clone().max_dim(1)
        + x.clone().min_dim(1) * 2.0
        + x.clone().max().unsqueeze::<2>()
        + x.min().unsqueeze::<2>() * 3.0
);
grad1!(
    grad_max_dim_with_indices,
    Tol::F32,
    [DType::F32],
    [4, 5],
    (-2.0, 2.0),
    |x| x.clone().max_dim_with_indices(0).0 + x.min_dim_with_indices(0).0 * 2.0
);
grad1!(
    grad_max_abs,
    Tol::F32,
    [DType::F32],
    [4, 5],
    (-2.0, 2.0),
    |x| x.clone().max_abs_dim(1) + x.max_abs().unsqueeze::<2>()
);
grad1!(
    grad_var,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [4, 6],
    (-2.0, 2.0),
    |x| x.clone().var(1) + x.var_bias(0).sum_dim(1).transpose().sum_dim(1)
);
grad1!(
    grad_cumsum,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [3, 5],
    (-2.0, 2.0),
    |x| x.clone().cumsum(1) + x.cumsum(0) * 2.0
);
grad1!(
    grad_cumprod,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [3, 5],
    Dist::nz(-1.5, 1.5, 0.3),
    |x| x.clone().cumprod(1) + x.cumprod(0) * 2.0
);
grad1!(
    grad_cummax_cummin,
    Tol::F32,
    [DType::F32, DType::F64],
    [3, 6],
    (-2.0, 2.0),
    |x| x.clone().cummax(1) + x.cummin(0) * 2.0
);
// (Burn's autodiff has no topk backward: sort only.)
grad1!(
    grad_sort,
    Tol::F32,
    [DType::F32],
    [3, 6],
    (-2.0, 2.0),
    |x| x.clone().sort(1) + x.sort_descending(0) * 2.0
);

// ---------------------------------------------------------------------------------------------
// Activations (the *_backward ops)
// ---------------------------------------------------------------------------------------------

grad1!(
    grad_relu,
    Tol::F32,
    [DType::F32, DType::F64],
    [3, 5],
    Dist::nz(-2.0, 2.0, 0.05),
    |x| activation::relu(x)
);
diff_ad!(
    grad_leaky_relu_prelu,
    Tol::F32,
    [DType::F32, DType::F64],
    |ctx| {
        let x = ctx
            .f::<3>([2, 3, 4], Dist::nz(-2.0, 2.0, 0.05))
            .require_grad();
        let alpha = ctx.f::<1>([3], (0.0, 0.5)).require_grad();
        let y =
            activation::leaky_relu(x.clone(), 0.1) + activation::prelu(x.clone(), alpha.clone());
        let g = backward_weighted(ctx, y.clone());
        (y, x.grad(&g), alpha.grad(&g))
    }
);
grad1!(
    grad_gelu,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [3, 5],
    (-3.0, 3.0),
    |x| activation::gelu(x.clone()) + activation::gelu_approximate(x)
);
grad1!(
    grad_sigmoid_family,
    Tol::TRANS,
    [DType::F32, DType::F64],
    [3, 5],
    (-4.0, 4.0),
    |x| activation::sigmoid(x.clone())
        + activation::log_sigmoid(x.clone()) * 2.0
        + activation::silu(x.clone()) * 3.0
        + activation::hard_sigmoid(x.clone(), 0.2, 0.5)
        + activation::mish(x.clone())
        + activation::softplus(x, 1.0)
);
grad1!(
    grad_log_sigmoid_extreme,
    Tol::TRANS,
    [DType::F32],
    [2, 4],
    (-60.0, 60.0),
    |x| activation::log_sigmoid(x)
);
grad1!(
    grad_softmax_family,
    Tol::TRANS,
    [DType::F32, DType::F64, DType::F16],
    [3, 6],
    (-3.0, 3.0),
    |x| activation::softmax(x.clone(), 1)
        + activation::log_softmax(x.clone(), 0)
        + activation::softmin(x, 1)
);
grad1!(
    grad_tanh_act,
    Tol::TRANS,
    [DType::F32],
    [3, 5],
    (-3.0, 3.0),
    |x| activation::tanh(x)
);

// ---------------------------------------------------------------------------------------------
// Shape ops and indexing
// ---------------------------------------------------------------------------------------------

grad1!(
    grad_reshape_permute_transpose,
    Tol::F32,
    [DType::F32, DType::F64],
    [2, 3, 4],
    (-2.0, 2.0),
    |x| x.clone().reshape([4, 3, 2])
        + x.clone().permute([2, 1, 0]).reshape([4, 3, 2]) * 2.0
        + x.swap_dims(0, 2).transpose().swap_dims(1, 2) * 3.0
);
grad1!(
    grad_flip_expand_repeat,
    Tol::F32,
    [DType::F32, DType::F64],
    [3, 1],
    (-2.0, 2.0),
    |x| x.clone().flip([0]).expand([2, 3, 4]) + x.repeat_dim(1, 4).unsqueeze::<3>()
);
grad1!(
    grad_slice_steps,
    Tol::F32,
    [DType::F32, DType::F64],
    [6, 5],
    (-2.0, 2.0),
    |x| x.clone().slice(s![1..5;2, ..;-2]) + x.slice(s![-2.., 0..3])
);
grad2!(
    grad_slice_assign,
    Tol::F32,
    [DType::F32, DType::F64],
    [6, 5],
    (-2.0, 2.0),
    [2, 3],
    (-2.0, 2.0),
    |a, b| a.slice_assign(s![1..5;2, 0..5;2], b).exp()
);
grad2!(
    grad_cat,
    Tol::F32,
    [DType::F32, DType::F64],
    [2, 3],
    (-2.0, 2.0),
    [2, 4],
    (-2.0, 2.0),
    |a, b| Tensor::cat(vec![a.clone(), b, a], 1)
);
grad1!(
    grad_narrow_chunk_unsqueeze,
    Tol::F32,
    [DType::F32],
    [6, 4],
    (-2.0, 2.0),
    |x| {
        let c = x.clone().chunk(2, 0);
        c[0].clone() * c[1].clone() + x.narrow(0, 1, 3)
    }
);
diff_ad!(
    grad_gather_scatter,
    Tol::F32,
    [DType::F32, DType::F64],
    |ctx| {
        let x = ctx.f::<2>([4, 5], (-2.0, 2.0)).require_grad();
        let v = ctx.f::<2>([6, 5], (-2.0, 2.0)).require_grad();
        let gi = ctx.ri::<2>([4, 7], 5);
        let si = ctx.ri::<2>([6, 5], 4);
        let y = x.clone().gather(1, gi).sum_dim(1)
            + x.clone()
                .scatter(0, si, v.clone(), IndexingUpdateOp::Add)
                .mul_scalar(2.0)
                .sum_dim(1);
        let g = backward_weighted(ctx, y.clone());
        (y, x.grad(&g), v.grad(&g))
    }
);
diff_ad!(
    grad_select_select_assign,
    Tol::F32,
    [DType::F32, DType::F64],
    |ctx| {
        let x = ctx.f::<2>([4, 5], (-2.0, 2.0)).require_grad();
        let v = ctx.f::<2>([4, 3], (-2.0, 2.0)).require_grad();
        let idx = ctx.idx::<1>([4i64, 0, 4]);
        let y = x.clone().select(1, idx.clone()) * 3.0
            + x.clone()
                .select_assign(1, idx, v.clone(), IndexingUpdateOp::Add)
                .slice(s![.., 0..3]);
        let g = backward_weighted(ctx, y.clone());
        (y, x.grad(&g), v.grad(&g))
    }
);
diff_ad!(
    grad_mask_where_fill,
    Tol::F32,
    [DType::F32, DType::F64],
    |ctx| {
        let x = ctx.f::<2>([3, 4], (-2.0, 2.0)).require_grad();
        let v = ctx.f::<2>([1, 4], (-2.0, 2.0)).require_grad();
        let m = ctx.b::<2>([3, 4], 0.5);
        let y = x.clone().mask_where(m.clone(), v.clone().expand([3, 4]))
            + x.clone().mask_fill(m.bool_not(), 5.0) * 2.0;
        let g = backward_weighted(ctx, y.clone());
        (y, x.grad(&g), v.grad(&g))
    }
);
diff_ad!(
    grad_mask_where_broadcast_value,
    Tol::F32,
    [DType::F32],
    |ctx| {
        let x = ctx.f::<2>([3, 4], (-2.0, 2.0)).require_grad();
        let v = ctx.f::<2>([1, 4], (-2.0, 2.0)).require_grad();
        let y = x.clone().mask_where(ctx.b([3, 4], 0.5), v.clone());
        let g = backward_weighted(ctx, y.clone());
        (y, x.grad(&g), v.grad(&g))
    }
);
diff_ad!(
    grad_argmax_path_and_cross,
    Tol::TRANS,
    [DType::F32, DType::F64],
    |ctx| {
        // argmax itself has no gradient: use it to gather, which does.
        let x = ctx.f::<2>([4, 5], (-2.0, 2.0)).require_grad();
        let a = ctx.f::<2>([4, 3], (-2.0, 2.0)).require_grad();
        let b = ctx.f::<2>([4, 3], (-2.0, 2.0)).require_grad();
        let idx = x.clone().argmax(1);
        let picked = x.clone().gather(1, idx);
        let c = a.clone().cross(b.clone(), 1);
        let y = Tensor::cat(vec![picked, c], 1);
        let g = backward_weighted(ctx, y.clone());
        (y, x.grad(&g), a.grad(&g), b.grad(&g))
    }
);
diff_ad!(grad_non_contiguous_leaf_views, Tol::TRANS, F32_F64, |ctx| {
    let x = ctx.f::<3>([2, 3, 4], (-1.0, 1.0)).require_grad();
    let t = x
        .clone()
        .permute([2, 0, 1])
        .slice(s![..;-1, .., 1..3])
        .flip([1]);
    let y = (t.clone().exp() * t).sum_dim(0);
    let g = backward_weighted(ctx, y.clone());
    (y, x.grad(&g))
});
