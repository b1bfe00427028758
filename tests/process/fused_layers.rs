//! `burn_mlx::nn`'s fused layers against burn-nn's on burn-ndarray in f64: each op's forward
//! pass and input gradients, a whole encoder's output and parameter gradients (post-norm and
//! pre-norm, padding and causal masks), records loading both ways, Adam training tracking
//! burn-nn's loss step by step, burn-nn's exact computation on other backends, and overlapped
//! steps giving the same losses as plain ones.
//!
//! These tests live in this binary because their reference depends on process-wide state: Burn
//! fixes a device's default float dtype at its first use in a process (keyed by the device's
//! type, not the backend), and the backend suite's binary uses burn-ndarray's device in f32.
//! Here no other test touches it, and [`setup`] sets it to f64 first.

use burn::module::{Module, ModuleVisitor, Param};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, DType, Distribution, ElementConversion, Int, Tensor, TensorData};
use burn_autodiff::Autodiff;
use burn_mlx::nn::functional;
use burn_mlx::{Mlx, MlxDevice};
use burn_ndarray::{NdArray, NdArrayDevice};
use burn_nn::attention::generate_autoregressive_mask;
use burn_nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn_optim::{AdamConfig, GradientsParams, Optimizer};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::sync::MutexGuard;

type MlxAd = Autodiff<Mlx>;
/// The reference: burn-nn's layers on burn-ndarray in f64 (see [`GRAD_TOL`]).
type NdAd = Autodiff<NdArray<f64>>;

const MD: MlxDevice = MlxDevice::Cpu;
const ND: NdArrayDevice = NdArrayDevice::Cpu;

/// Holds this binary's process-wide state for the calling test ([`crate::one_at_a_time`]), turns
/// the fused path on for this CPU device (these tests check the fused ops themselves) and sets
/// burn-ndarray's device to f64 floats. Panics if that device was already fixed to another dtype.
fn setup() -> MutexGuard<'static, ()> {
    let alone = crate::one_at_a_time();
    burn_mlx::nn::fuse_on_cpu(true);
    let _ = burn::tensor::set_default_dtypes::<NdArray<f64>>(&ND, DType::F64, DType::I64);
    let settings = burn::tensor::get_device_settings::<NdArray<f64>>(&ND);
    assert_eq!(
        DType::from(settings.float_dtype),
        DType::F64,
        "the reference device must compute in f64"
    );
    alone
}

/// The tolerance of an f32 gradient of a fused op against the reference in f64: MLX's are within
/// 2.1e-6 of it (layer norm's weight gradient over 4,800 rows). A reference in f32 is not
/// accurate enough for this bound: on an AMD EPYC host burn-ndarray's f32 gradients of layer
/// norm, attention and the encoder were 1.1e-4 to 8.1e-4 from the f64 values (layer norm's `dx`:
/// 1.9e-4, MLX's 1.8e-7).
const GRAD_TOL: f64 = 1e-5;

/// Uniform data of `shape` in `[lo, hi)` from `seed`.
fn rand_f(shape: &[usize], (lo, hi): (f64, f64), seed: u64) -> TensorData {
    let mut rng = StdRng::seed_from_u64(seed);
    TensorData::random::<f32, _, _>(shape.to_vec(), Distribution::Uniform(lo, hi), &mut rng)
}

/// Integer data of `shape`, uniform in `[lo, hi)`, from `seed`.
fn rand_i(shape: &[usize], lo: i64, hi: i64, seed: u64) -> TensorData {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = shape.iter().product();
    let v: Vec<i64> = (0..n).map(|_| rng.random_range(lo..hi)).collect();
    TensorData::new(v, shape.to_vec())
}

/// Boolean data of `shape`, true with probability `p`, from `seed`.
fn rand_b(shape: &[usize], p: f64, seed: u64) -> TensorData {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = shape.iter().product();
    let v: Vec<bool> = (0..n).map(|_| rng.random_bool(p)).collect();
    TensorData::new(v, shape.to_vec())
}

/// Largest difference between two float tensors' values, relative to `1 + |reference|`.
fn worst(a: TensorData, b: TensorData) -> f64 {
    let a = a.convert::<f32>().to_vec::<f32>().unwrap();
    let b = b.convert::<f32>().to_vec::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|(x, y)| ((x - y).abs() / (1.0 + y.abs())) as f64)
        .fold(0.0, f64::max)
}

fn assert_close(what: &str, a: TensorData, b: TensorData, tol: f64) {
    let w = worst(a, b);
    assert!(w <= tol, "{what}: differs by {w:e} (tolerance {tol:e})");
}

/// A float tensor on each backend, tracked for gradients.
fn pair<const D: usize>(shape: [usize; D], seed: u64) -> (Tensor<MlxAd, D>, Tensor<NdAd, D>) {
    let data = rand_f(&shape, (-2.0, 2.0), seed);
    (
        Tensor::from_data(data.clone(), &MD).require_grad(),
        Tensor::from_data(data, &ND).require_grad(),
    )
}

/// `sum(y · w)` for fixed pseudo-random weights `w`, so that every output element gets its own
/// gradient.
fn weighted_sum<B: Backend, const D: usize>(y: Tensor<B, D>, seed: u64) -> Tensor<B, 1> {
    let w = Tensor::<B, D>::from_data(rand_f(&y.dims(), (-1.0, 1.0), seed), &y.device());
    (y * w).sum()
}

#[test]
fn layer_norm_and_rms_norm_match_burn_nn() {
    let _alone = setup();
    // [8, 600, 16]: 4,800 rows, whose weight and bias gradients are summed in two passes.
    for (shape, bias) in [
        ([2, 5, 16], true),
        ([3, 1, 64], false),
        ([8, 600, 16], true),
    ] {
        let (xm, xn) = pair(shape, 1);
        let (gm, gn) = pair([shape[2]], 2);
        let (bm, bn) = pair([shape[2]], 3);
        let ym = functional::layer_norm(xm.clone(), gm.clone(), bias.then(|| bm.clone()), 1e-5);
        let yn = functional::layer_norm(xn.clone(), gn.clone(), bias.then(|| bn.clone()), 1e-5);
        assert_close("layer_norm", ym.to_data(), yn.to_data(), 1e-5);
        let gm_all = weighted_sum(ym, 4).backward();
        let gn_all = weighted_sum(yn, 4).backward();
        assert_close(
            "layer_norm dx",
            xm.grad(&gm_all).unwrap().to_data(),
            xn.grad(&gn_all).unwrap().to_data(),
            GRAD_TOL,
        );
        assert_close(
            "layer_norm dgamma",
            gm.grad(&gm_all).unwrap().to_data(),
            gn.grad(&gn_all).unwrap().to_data(),
            GRAD_TOL,
        );
        if bias {
            assert_close(
                "layer_norm dbeta",
                bm.grad(&gm_all).unwrap().to_data(),
                bn.grad(&gn_all).unwrap().to_data(),
                GRAD_TOL,
            );
        }

        let ym = functional::rms_norm(xm.clone(), gm.clone(), 1e-6);
        let yn = functional::rms_norm(xn.clone(), gn.clone(), 1e-6);
        assert_close("rms_norm", ym.to_data(), yn.to_data(), 1e-5);
        let gm_all = weighted_sum(ym, 5).backward();
        let gn_all = weighted_sum(yn, 5).backward();
        assert_close(
            "rms_norm dx",
            xm.grad(&gm_all).unwrap().to_data(),
            xn.grad(&gn_all).unwrap().to_data(),
            GRAD_TOL,
        );
        assert_close(
            "rms_norm dgamma",
            gm.grad(&gm_all).unwrap().to_data(),
            gn.grad(&gn_all).unwrap().to_data(),
            GRAD_TOL,
        );
    }
}

/// The gradients of q, k and v on MLX (`gm`) and burn-ndarray (`gn`) agree within [`GRAD_TOL`].
fn assert_qkv_grads_close(
    what: &str,
    mlx: [&Tensor<MlxAd, 4>; 3],
    gm: &<MlxAd as AutodiffBackend>::Gradients,
    nd: [&Tensor<NdAd, 4>; 3],
    gn: &<NdAd as AutodiffBackend>::Gradients,
) {
    for (name, (a, c)) in ["dq", "dk", "dv"].into_iter().zip(mlx.into_iter().zip(nd)) {
        assert_close(
            &format!("{what} {name}"),
            a.grad(gm).unwrap().to_data(),
            c.grad(gn).unwrap().to_data(),
            GRAD_TOL,
        );
    }
}

#[test]
fn attention_matches_composed_attention() {
    let _alone = setup();
    // Grouped-query ratios 1, 2 and 4, with and without a mask, head dims 8 and 16 (ratio 1 is
    // the fused op's own backward, the others MLX's product).
    for (heads, kv_heads, d, masked) in [
        (4, 4, 8, true),
        (4, 4, 16, false),
        (4, 2, 16, false),
        (8, 2, 8, true),
    ] {
        let (b, lq, lk) = (2, 5, 7);
        let (qm, qn) = pair([b, heads, lq, d], 10);
        let (km, kn) = pair([b, kv_heads, lk, d], 11);
        let (vm, vn) = pair([b, kv_heads, lk, d], 12);
        let mask = rand_b(&[b, 1, lq, lk], 0.3, 13);
        let (mm, mn) = if masked {
            (
                Some(Tensor::<MlxAd, 4, Bool>::from_data(mask.clone(), &MD)),
                Some(Tensor::<NdAd, 4, Bool>::from_data(mask, &ND)),
            )
        } else {
            (None, None)
        };
        let scale = 1.0 / (d as f64).sqrt();
        let ym = functional::attention(qm.clone(), km.clone(), vm.clone(), mm, scale, -1e4);
        let yn = functional::attention(qn.clone(), kn.clone(), vn.clone(), mn, scale, -1e4);
        let what = format!("attention (heads {heads}/{kv_heads}, d {d}, mask {masked})");
        assert_close(&what, ym.to_data(), yn.to_data(), 1e-5);
        let gm = weighted_sum(ym, 14).backward();
        let gn = weighted_sum(yn, 14).backward();
        assert_qkv_grads_close(&what, [&qm, &km, &vm], &gm, [&qn, &kn, &vn], &gn);
    }
}

/// Attention in bf16, whose backward recomputes the probabilities (an f32 call of these sizes keeps
/// them from its forward pass instead), against burn-ndarray's (f64) on the same bf16-rounded
/// inputs, within bf16's tolerance.
#[test]
fn attention_in_bf16_recomputes_its_probabilities() {
    let _alone = setup();
    let (b, h, lq, lk, d) = (2, 4, 5, 7, 16);
    let bf16 = |seed| {
        let data = rand_f(&[b, h, lq.max(lk), d], (-2.0, 2.0), seed);
        let rounded = data.convert::<half::bf16>().convert::<f64>();
        let m = Tensor::<MlxAd, 4>::from_data(rounded.clone(), &MD).require_grad();
        (m, Tensor::<NdAd, 4>::from_data(rounded, &ND).require_grad())
    };
    let (qm, qn) = bf16(60);
    let (km, kn) = bf16(61);
    let (vm, vn) = bf16(62);
    let (qm2, qn2) = (qm.clone().narrow(2, 0, lq), qn.clone().narrow(2, 0, lq));
    let mask = rand_b(&[b, 1, lq, lk], 0.3, 63);
    let scale = 1.0 / (d as f64).sqrt();
    let ym = functional::attention(
        qm2.cast(DType::BF16),
        km.clone().narrow(2, 0, lk).cast(DType::BF16),
        vm.clone().narrow(2, 0, lk).cast(DType::BF16),
        Some(Tensor::<MlxAd, 4, Bool>::from_data(mask.clone(), &MD)),
        scale,
        -1e4,
    );
    let yn = functional::attention(
        qn2,
        kn.clone().narrow(2, 0, lk),
        vn.clone().narrow(2, 0, lk),
        Some(Tensor::<NdAd, 4, Bool>::from_data(mask, &ND)),
        scale,
        -1e4,
    );
    assert_close(
        "bf16 attention",
        ym.clone().cast(DType::F32).to_data(),
        yn.to_data(),
        2e-2,
    );
    let gm = weighted_sum(ym.cast(DType::F32), 64).backward();
    let gn = weighted_sum(yn, 64).backward();
    for (name, a, c) in [("dq", &qm, &qn), ("dk", &km, &kn), ("dv", &vm, &vn)] {
        assert_close(
            &format!("bf16 attention {name}"),
            a.grad(&gm).unwrap().to_data(),
            c.grad(&gn).unwrap().to_data(),
            5e-2,
        );
    }
}

/// Causal attention (MLX's causal mode, no mask array) against burn-ndarray's composed attention
/// under an explicit mask hiding later keys: as many queries as keys, and fewer queries (the last
/// positions), for grouped-query ratios 1 and 4.
#[test]
fn causal_attention_matches_masked_attention() {
    let _alone = setup();
    for (heads, kv_heads, lq, lk) in [(4, 4, 6, 6), (8, 2, 6, 6), (4, 4, 3, 7), (8, 2, 1, 5)] {
        let (b, d) = (2, 16);
        let (qm, qn) = pair([b, heads, lq, d], 30);
        let (km, kn) = pair([b, kv_heads, lk, d], 31);
        let (vm, vn) = pair([b, kv_heads, lk, d], 32);
        let later: Vec<bool> = (0..lq)
            .flat_map(|i| (0..lk).map(move |j| j > i + lk - lq))
            .collect();
        let mask = Tensor::<NdAd, 4, Bool>::from_data(TensorData::new(later, [1, 1, lq, lk]), &ND);
        let scale = 1.0 / (d as f64).sqrt();
        let ym = functional::causal_attention(qm.clone(), km.clone(), vm.clone(), scale);
        let yn = functional::attention(qn.clone(), kn.clone(), vn.clone(), Some(mask), scale, -1e9);
        let what = format!("causal attention (heads {heads}/{kv_heads}, {lq} over {lk})");
        assert_close(&what, ym.to_data(), yn.to_data(), 1e-5);
        // burn-ndarray's own causal attention (the mask built inside) gives the same.
        let yc = functional::causal_attention(qn.clone(), kn.clone(), vn.clone(), scale);
        assert_close(
            &format!("{what} on ndarray"),
            yc.to_data(),
            yn.to_data(),
            1e-6,
        );
        let gm = weighted_sum(ym, 33).backward();
        let gn = weighted_sum(yn, 33).backward();
        assert_qkv_grads_close(&what, [&qm, &km, &vm], &gm, [&qn, &kn, &vn], &gn);
    }
}

/// SwiGLU as one fused node against Burn's `silu(gate) · up` on burn-ndarray: the output and
/// both input gradients.
#[test]
fn swiglu_matches_burn_silu_times_up() {
    let _alone = setup();
    let (gm_in, gn_in) = pair([5, 12], 40);
    let (um, un) = pair([5, 12], 41);
    let ym = functional::swiglu(gm_in.clone(), um.clone());
    let yn = burn::tensor::activation::silu(gn_in.clone()) * un.clone();
    assert_close("swiglu", ym.to_data(), yn.to_data(), 1e-6);
    let gm = weighted_sum(ym, 42).backward();
    let gn = weighted_sum(yn, 42).backward();
    for (name, a, c) in [("dgate", &gm_in, &gn_in), ("dup", &um, &un)] {
        assert_close(
            &format!("swiglu {name}"),
            a.grad(&gm).unwrap().to_data(),
            c.grad(&gn).unwrap().to_data(),
            1e-5,
        );
    }
}

#[test]
fn cross_entropy_matches_burn_nn() {
    let _alone = setup();
    let (lm, ln) = pair([6, 11], 20);
    let targets = rand_i(&[6], 0, 11, 21);
    let tm = Tensor::<MlxAd, 1, Int>::from_data(targets.clone(), &MD);
    let tn = Tensor::<NdAd, 1, Int>::from_data(targets, &ND);
    let ym = functional::cross_entropy(lm.clone(), tm);
    let reference = burn_nn::loss::CrossEntropyLossConfig::new()
        .init(&ND)
        .forward(ln.clone(), tn);
    assert_close("cross_entropy", ym.to_data(), reference.to_data(), 1e-6);
    let gm = ym.backward();
    let gn = reference.backward();
    assert_close(
        "cross_entropy dlogits",
        lm.grad(&gm).unwrap().to_data(),
        ln.grad(&gn).unwrap().to_data(),
        1e-6,
    );
}

/// The half-precision loss: the logits rounded to bf16, the loss and the gradient computed in
/// f32 (the gradient then rounded to bf16), against burn-nn's f32 loss of the same rounded values.
#[test]
fn cross_entropy_f32_of_bf16_logits_matches_burn_nn() {
    let _alone = setup();
    let data = rand_f(&[7, 300], (-6.0, 6.0), 22);
    let targets = rand_i(&[7], 0, 300, 23);
    let lm = Tensor::<MlxAd, 2>::from_data(data, &MD)
        .cast(burn::tensor::DType::BF16)
        .require_grad();
    let rounded = lm.to_data().convert::<f32>();
    let ln = Tensor::<NdAd, 2>::from_data(rounded, &ND).require_grad();
    let ym = functional::cross_entropy_f32(lm.clone(), Tensor::from_data(targets.clone(), &MD));
    assert_eq!(ym.dtype(), burn::tensor::DType::F32);
    let reference = burn_nn::loss::CrossEntropyLossConfig::new()
        .init(&ND)
        .forward(ln.clone(), Tensor::from_data(targets, &ND));
    assert_close("cross_entropy_f32", ym.to_data(), reference.to_data(), 1e-6);
    let gm = ym.backward();
    let gn = reference.backward();
    let grad = lm.grad(&gm).unwrap();
    assert_eq!(grad.dtype(), burn::tensor::DType::BF16);
    // Each gradient is below 1/7 in magnitude; bf16 keeps 8 significant bits.
    assert_close(
        "cross_entropy_f32 dlogits",
        grad.to_data(),
        ln.grad(&gn).unwrap().to_data(),
        1e-3,
    );
}

/// An input and a norm weight as a module, for MLX's own transforms.
#[derive(Module, Debug)]
struct NormRope<B: Backend> {
    x: Param<Tensor<B, 4>>,
    w: Param<Tensor<B, 1>>,
}

/// `fast::rms_norm` and `fast::RotaryEmbedding` (at a host and at a device position), weighted
/// and summed: on plain `Mlx` on the CPU these are burn-mlx's CPU primitives
/// (`mlx-sys/cpu_layers.cpp`), elsewhere Burn's ops.
fn norm_rope_loss<B: Backend>(x: Tensor<B, 4>, w: Tensor<B, 1>, freqs: &[f64]) -> Tensor<B, 1> {
    let device = x.device();
    let rope = burn_mlx::fast::RotaryEmbedding::<B>::new(freqs, &device);
    let at = Tensor::<B, 1, Int>::from_ints([300], &device);
    let normed = burn_mlx::fast::rms_norm(x.clone(), w, 1e-6);
    weighted_sum(normed, 41)
        + weighted_sum(rope.apply(x.clone(), 37), 42)
        + weighted_sum(rope.apply_at(x, at), 43)
}

/// The gradients of burn-mlx's CPU RMS norm and RoPE primitives inside MLX's own transforms
/// (`burn_mlx::grad::value_and_grad` on plain `Mlx`) match Burn's autodiff of the composed ops on
/// burn-ndarray in f64, for the input and the norm's weight.
#[test]
fn cpu_norm_and_rope_gradients_match_the_composed_ops() {
    let _alone = setup();
    let shape = [2, 3, 5, 64];
    let freqs: Vec<f64> = (0..32)
        .map(|i| 10_000f64.powf(-2.0 * i as f64 / 64.0))
        .collect();
    let (xd, wd) = (
        rand_f(&shape, (-2.0, 2.0), 44),
        rand_f(&[64], (0.5, 1.5), 45),
    );
    let xn = Tensor::<NdAd, 4>::from_data(xd.clone(), &ND).require_grad();
    let wn = Tensor::<NdAd, 1>::from_data(wd.clone(), &ND).require_grad();
    let want = norm_rope_loss(xn.clone(), wn.clone(), &freqs);
    let grads = want.backward();
    let (want_dx, want_dw) = (
        xn.grad(&grads).unwrap().to_data(),
        wn.grad(&grads).unwrap().to_data(),
    );

    let model = NormRope {
        x: Param::from_tensor(Tensor::<Mlx, 4>::from_data(xd, &MD)),
        w: Param::from_tensor(Tensor::<Mlx, 1>::from_data(wd, &MD)),
    };
    // The loss on plain Mlx is built from burn-mlx's primitives, not MLX's composed ops: what
    // the gradients below differentiate.
    let graph = burn_mlx::to_mlx(norm_rope_loss(model.x.val(), model.w.val(), &freqs))
        .expect("a tensor of Mlx");
    let kinds = burn_mlx::pending_primitives(&[&graph]).expect("the pending graph");
    assert_eq!(kinds.get("BurnMlxRmsNorm"), Some(&1), "{kinds:?}");
    assert_eq!(kinds.get("BurnMlxRope"), Some(&2), "{kinds:?}");
    let (loss, grads) = burn_mlx::grad::value_and_grad(&model, |m: &NormRope<Mlx>| {
        norm_rope_loss(m.x.val(), m.w.val(), &freqs)
    })
    .expect("value_and_grad");
    let dx: Tensor<Mlx, 4> = grads.get(model.x.id).expect("dx");
    let dw: Tensor<Mlx, 1> = grads.get(model.w.id).expect("dw");
    // Positions up to 304 turn angles by up to 304 radians: f32's rounding of the angle costs
    // about 2e-5.
    assert_close("loss", loss.to_data(), want.to_data(), 1e-4);
    assert_close("dx", dx.to_data(), want_dx, 1e-4);
    assert_close("dw", dw.to_data(), want_dw, 1e-4);
}

/// Logits as a module, for MLX's own transforms (`burn_mlx::grad::value_and_grad`).
#[derive(Module, Debug)]
struct Logits<B: Backend> {
    value: Param<Tensor<B, 2>>,
}

/// The weighted loss with weights `1/count` on some rows and 0 on the others is burn-nn's mean
/// loss over those rows: on Autodiff<Mlx>, on burn-ndarray (the composed path), and inside MLX's
/// own transforms on plain Mlx, where the op's written-out backward goes in through
/// `mlx_custom_vjp`; also from bf16 logits.
#[test]
fn weighted_cross_entropy_is_the_mean_over_its_rows() {
    let _alone = setup();
    let data = rand_f(&[7, 300], (-6.0, 6.0), 24);
    let targets = rand_i(&[7], 0, 300, 25);
    let rows = [0i64, 2, 3, 5];
    let weights: Vec<f32> = (0..7i64)
        .map(|r| match rows.contains(&r) {
            true => 1.0 / rows.len() as f32,
            false => 0.0,
        })
        .collect();
    let weights = TensorData::new(weights, [7]);
    let ln = Tensor::<NdAd, 2>::from_data(data.clone(), &ND).require_grad();
    let picked = Tensor::<NdAd, 1, Int>::from_data(TensorData::new(rows.to_vec(), [4]), &ND);
    let reference = burn_nn::loss::CrossEntropyLossConfig::new()
        .init(&ND)
        .forward(
            ln.clone().select(0, picked.clone()),
            Tensor::from_data(targets.clone(), &ND).select(0, picked),
        );
    let want_grad = ln.grad(&reference.backward()).unwrap().to_data();
    let want = reference.to_data();

    let lm = Tensor::<MlxAd, 2>::from_data(data.clone(), &MD).require_grad();
    let ym = functional::cross_entropy_f32_weighted(
        lm.clone(),
        Tensor::from_data(targets.clone(), &MD),
        Tensor::from_data(weights.clone(), &MD),
    );
    assert_close(
        "weighted loss (Autodiff<Mlx>)",
        ym.to_data(),
        want.clone(),
        1e-6,
    );
    let grad = lm.grad(&ym.backward()).unwrap();
    assert_close(
        "weighted dlogits (Autodiff<Mlx>)",
        grad.to_data(),
        want_grad.clone(),
        1e-6,
    );

    let ln2 = Tensor::<NdAd, 2>::from_data(data.clone(), &ND).require_grad();
    let yn = functional::cross_entropy_f32_weighted(
        ln2.clone(),
        Tensor::from_data(targets.clone(), &ND),
        Tensor::from_data(weights.clone(), &ND),
    );
    assert_close("weighted loss (composed)", yn.to_data(), want.clone(), 1e-6);
    let grad = ln2.grad(&yn.backward()).unwrap();
    assert_close(
        "weighted dlogits (composed)",
        grad.to_data(),
        want_grad.clone(),
        1e-6,
    );

    for dtype in [burn::tensor::DType::F32, burn::tensor::DType::BF16] {
        let value = Tensor::<Mlx, 2>::from_data(data.clone(), &MD).cast(dtype);
        let model = Logits {
            value: Param::from_tensor(value),
        };
        let (t, w) = (
            Tensor::<Mlx, 1, Int>::from_data(targets.clone(), &MD),
            Tensor::<Mlx, 1>::from_data(weights.clone(), &MD),
        );
        let (loss, grads) = burn_mlx::grad::value_and_grad(&model, |m: &Logits<Mlx>| {
            functional::cross_entropy_f32_weighted(m.value.val(), t.clone(), w.clone())
        })
        .expect("value_and_grad");
        let grad: Tensor<Mlx, 2> = grads.get(model.value.id).expect("a gradient");
        assert_eq!(grad.dtype(), dtype);
        // bf16 logits: the loss of the rounded values; each gradient below 1/4 in magnitude
        // with 8 significant bits.
        let (tol_loss, tol_grad) = match dtype {
            burn::tensor::DType::F32 => (1e-6, 1e-6),
            _ => (5e-2, 2e-3),
        };
        assert_close(
            "weighted loss (MLX transforms)",
            loss.to_data(),
            want.clone(),
            tol_loss,
        );
        assert_close(
            "weighted dlogits (MLX transforms)",
            grad.to_data().convert::<f32>(),
            want_grad.clone(),
            tol_grad,
        );
    }
}

const VOCAB: usize = 16;
const SEQ: usize = 9;
const D_MODEL: usize = 32;

/// One model, written twice: with burn-nn's encoder (`NnLm`) and with burn-mlx's (`FusedLm`).
/// The two have the same record layout.
macro_rules! tiny_lm {
    ($name:ident, $encoder:ty, $config:ty, $input:ty, $loss:expr) => {
        #[derive(Module, Debug)]
        struct $name<B: Backend> {
            tokens: Embedding<B>,
            encoder: $encoder,
            head: Linear<B>,
        }

        impl<B: Backend> $name<B> {
            fn new(norm_first: bool, device: &B::Device) -> Self {
                Self {
                    tokens: EmbeddingConfig::new(VOCAB, D_MODEL).init(device),
                    encoder: <$config>::new(D_MODEL, 48, 4, 2)
                        .with_dropout(0.0)
                        .with_norm_first(norm_first)
                        .init(device),
                    head: LinearConfig::new(D_MODEL, VOCAB).init(device),
                }
            }

            /// Logits `[batch, seq, vocab]` under a causal mask and a padding mask.
            fn logits(&self, tokens: Tensor<B, 2, Int>, pad: Tensor<B, 2, Bool>) -> Tensor<B, 3> {
                let [batch, seq] = tokens.dims();
                let device = tokens.device();
                let x = self.tokens.forward(tokens);
                let causal = generate_autoregressive_mask::<B>(batch, seq, &device);
                let h = self
                    .encoder
                    .forward(<$input>::new(x).mask_attn(causal).mask_pad(pad));
                self.head.forward(h)
            }

            /// Mean next-token cross-entropy.
            fn loss(&self, tokens: Tensor<B, 2, Int>, pad: Tensor<B, 2, Bool>) -> Tensor<B, 1> {
                let [batch, seq] = tokens.dims();
                let logits = self
                    .logits(tokens.clone(), pad)
                    .slice([0..batch, 0..seq - 1])
                    .reshape([batch * (seq - 1), VOCAB]);
                let targets = tokens
                    .slice([0..batch, 1..seq])
                    .reshape([batch * (seq - 1)]);
                $loss(logits, targets)
            }
        }
    };
}

tiny_lm!(
    NnLm,
    burn_nn::transformer::TransformerEncoder<B>,
    burn_nn::transformer::TransformerEncoderConfig,
    burn_nn::transformer::TransformerEncoderInput<B>,
    |logits: Tensor<B, 2>, targets: Tensor<B, 1, Int>| {
        let device = logits.device();
        burn_nn::loss::CrossEntropyLossConfig::new()
            .init(&device)
            .forward(logits, targets)
    }
);
tiny_lm!(
    FusedLm,
    burn_mlx::nn::TransformerEncoder<B>,
    burn_mlx::nn::TransformerEncoderConfig,
    burn_mlx::nn::TransformerEncoderInput<B>,
    functional::cross_entropy
);

/// A batch of tokens and a padding mask (the last key of the second row is padding).
fn batch<B: Backend>(seed: u64, device: &B::Device) -> (Tensor<B, 2, Int>, Tensor<B, 2, Bool>) {
    let tokens = Tensor::from_data(rand_i(&[3, SEQ], 0, VOCAB as i64, seed), device);
    let mut pad = vec![false; 3 * SEQ];
    pad[2 * SEQ - 1] = true;
    (
        tokens,
        Tensor::from_data(TensorData::new(pad, [3, SEQ]), device),
    )
}

fn parameters<B: Backend, M: Module<B>>(module: &M) -> Vec<TensorData> {
    struct Collect(Vec<TensorData>);
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.val().to_data());
        }
    }
    let mut c = Collect(Vec::new());
    module.visit(&mut c);
    c.0
}

fn gradients<B: AutodiffBackend, M: Module<B>>(
    module: &M,
    grads: &B::Gradients,
) -> Vec<TensorData> {
    struct Collect<'a, B: AutodiffBackend>(Vec<TensorData>, &'a B::Gradients);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(
                param
                    .val()
                    .grad(self.1)
                    .expect("every parameter has a gradient")
                    .to_data(),
            );
        }
    }
    let mut c = Collect(Vec::new(), grads);
    module.visit(&mut c);
    c.0
}

/// A burn-nn model on burn-ndarray and the fused model on `Autodiff<Mlx>` with the same weights,
/// moved through burn-nn's record. The record holds f32 values and both models are loaded from
/// it, so that the f64 reference holds exactly the fused model's parameters.
fn models(norm_first: bool, seed: u64) -> (FusedLm<MlxAd>, NnLm<NdAd>) {
    models_on(norm_first, seed, &MD)
}

/// [`models`] with the fused model on `device`.
fn models_on(norm_first: bool, seed: u64, device: &MlxDevice) -> (FusedLm<MlxAd>, NnLm<NdAd>) {
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    NdAd::seed(&ND, seed);
    let drawn = NnLm::<NdAd>::new(norm_first, &ND);
    let bytes = recorder.record(drawn.into_record(), ()).unwrap();
    let nn =
        NnLm::<NdAd>::new(norm_first, &ND).load_record(recorder.load(bytes.clone(), &ND).unwrap());
    let record = recorder
        .load(bytes, device)
        .expect("burn-nn's record loads into the fused model");
    (
        FusedLm::<MlxAd>::new(norm_first, device).load_record(record),
        nn,
    )
}

/// The fused encoder's logits and parameter gradients on `device` against burn-nn's in f64,
/// post-norm and pre-norm, within `tol` and `grad_tol`.
fn check_encoder(device: &MlxDevice, tol: f64, grad_tol: f64) {
    for norm_first in [false, true] {
        let (fused, nn) = models_on(norm_first, 31, device);
        let (tm, pm) = batch::<MlxAd>(32, device);
        let (tn, pn) = batch::<NdAd>(32, &ND);
        let ym = fused.logits(tm, pm);
        let yn = nn.logits(tn, pn);
        let what = format!("encoder on {device:?} (norm_first {norm_first})");
        assert_close(&what, ym.to_data(), yn.to_data(), tol);
        let gm = weighted_sum(ym, 33).backward();
        let gn = weighted_sum(yn, 33).backward();
        let (a, b) = (gradients(&fused, &gm), gradients(&nn, &gn));
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.into_iter().zip(b).enumerate() {
            assert_close(
                &format!("{what}: gradient of parameter {i}"),
                x,
                y,
                grad_tol,
            );
        }
    }
}

#[test]
fn fused_encoder_matches_burn_nn_with_masks() {
    let _alone = setup();
    check_encoder(&MD, 1e-5, GRAD_TOL);
}

/// Whether MLX has a GPU here; without one, says that `what` is checked on a GPU machine. The GPU
/// tests of this file return early on such a host.
fn gpu_here(what: &str) -> bool {
    let here = MlxDevice::gpu_available();
    if !here {
        println!("no MLX GPU here: {what} is checked on a GPU machine");
    }
    here
}

/// The TF32 bound of the GPU checks: MLX's CUDA GEMMs round f32 inputs to TF32 (10-bit
/// mantissa, about 5e-4 relative), and the encoder chains a dozen of them per gradient.
const TF32_TOL: f64 = 1e-2;

/// The same check on MLX's CUDA device, where the fused layers run their CUDA kernels (layer
/// norm's backward, the column sums) and TF32 GEMMs, at [`TF32_TOL`]. The GPU test machine runs
/// it; without a GPU it checks nothing and says so.
#[test]
fn fused_encoder_on_the_gpu_matches_burn_nn() {
    let _alone = setup();
    if !gpu_here("the fused encoder on CUDA") {
        return;
    }
    check_encoder(&MlxDevice::Gpu, TF32_TOL, TF32_TOL);
}

#[test]
fn records_load_both_ways() {
    let _alone = setup();
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let (fused, nn) = models(false, 41);
    // Fused → burn-nn: the fused model's record loads into a burn-nn model with the same values.
    let bytes = recorder.record(fused.clone().into_record(), ()).unwrap();
    let back: NnLm<NdAd> =
        { NnLm::<NdAd>::new(false, &ND).load_record(recorder.load(bytes, &ND).unwrap()) };
    let (a, b) = (parameters(&back), parameters(&nn));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.into_iter().zip(b) {
        assert_eq!(x.convert::<f32>(), y.convert::<f32>());
    }
    // And the fused config's init draws burn-nn's weights: the same seed, the same encoder.
    NdAd::seed(&ND, 42);
    // (Burn draws a parameter's initial values when it is first read.)
    let ours =
        parameters(&burn_mlx::nn::TransformerEncoderConfig::new(8, 16, 2, 1).init::<NdAd>(&ND));
    NdAd::seed(&ND, 42);
    let theirs = parameters(
        &burn_nn::transformer::TransformerEncoderConfig::new(8, 16, 2, 1).init::<NdAd>(&ND),
    );
    assert_eq!(ours.len(), theirs.len());
    for (x, y) in ours.into_iter().zip(theirs) {
        assert_eq!(x, y);
    }
}

#[test]
fn other_backends_compute_exactly_what_burn_nn_does() {
    let _alone = setup();
    let (fused_mlx, nn) = models(true, 51);
    let fused_nd: FusedLm<NdAd> = {
        let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
        let bytes = recorder.record(fused_mlx.into_record(), ()).unwrap();
        FusedLm::<NdAd>::new(true, &ND).load_record(recorder.load(bytes, &ND).unwrap())
    };
    let (t, p) = batch::<NdAd>(52, &ND);
    let a = fused_nd.logits(t.clone(), p.clone());
    let b = nn.logits(t, p);
    assert_eq!(a.to_data(), b.to_data());
}

/// Adam steps of a model: the loss at each step.
fn train<B: AutodiffBackend, M, O>(
    mut model: M,
    mut optim: O,
    steps: usize,
    device: &B::Device,
    loss: impl Fn(&M, Tensor<B, 2, Int>, Tensor<B, 2, Bool>) -> Tensor<B, 1>,
    overlap: bool,
) -> Vec<f64>
where
    M: burn::module::AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    let mut losses = Vec::new();
    let mut pending = None;
    for step in 0..steps {
        // Two batches in turn, which the model learns by heart.
        let (tokens, pad) = batch::<B>(100 + step as u64 % 2, device);
        let l = loss(&model, tokens, pad);
        let grads = GradientsParams::from_grads(l.backward(), &model);
        model = optim.step(3e-3, model, grads);
        if overlap {
            burn_mlx::nn::start_step(&model, std::slice::from_ref(&l)).unwrap();
            if let Some(previous) = pending.replace(l) {
                losses.push(Tensor::<B, 1>::into_scalar(previous).elem::<f64>());
            }
        } else {
            losses.push(l.into_scalar().elem::<f64>());
        }
    }
    if let Some(last) = pending {
        losses.push(Tensor::<B, 1>::into_scalar(last).elem::<f64>());
    }
    losses
}

#[test]
fn adam_training_tracks_burn_nn_and_overlap_changes_nothing() {
    let _alone = setup();
    for norm_first in [false, true] {
        let (fused, nn) = models(norm_first, 61);
        let ours = train(
            fused.clone(),
            burn_mlx::optim::AdamConfig::new().init(),
            20,
            &MD,
            |m: &FusedLm<MlxAd>, t, p| m.loss(t, p),
            false,
        );
        let theirs = train(
            nn,
            AdamConfig::new().init(),
            20,
            &ND,
            |m: &NnLm<NdAd>, t, p| m.loss(t, p),
            false,
        );
        println!("norm_first {norm_first}\n fused  {ours:?}\n burn-nn {theirs:?}");
        for (step, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs(),
                "norm_first {norm_first}, step {step}: loss {a} (fused, Mlx) against {b} \
                 (burn-nn, NdArray)"
            );
        }
        assert!(ours[19] < 0.9 * ours[0], "the loss falls: {ours:?}");
        let overlapped = train(
            fused,
            burn_mlx::optim::AdamConfig::new().init(),
            20,
            &MD,
            |m: &FusedLm<MlxAd>, t, p| m.loss(t, p),
            true,
        );
        assert_eq!(overlapped, ours, "overlapped steps change the losses");
    }
}

#[test]
fn adamw_tracks_burn_optim() {
    let _alone = setup();
    let (fused, nn) = models(true, 71);
    let config = burn_mlx::optim::AdamWConfig::new().with_weight_decay(0.05);
    let ours = train(
        fused,
        config.init(),
        12,
        &MD,
        |m: &FusedLm<MlxAd>, t, p| m.loss(t, p),
        false,
    );
    let theirs = train(
        nn,
        burn_optim::AdamWConfig::new()
            .with_weight_decay(0.05)
            .init(),
        12,
        &ND,
        |m: &NnLm<NdAd>, t, p| m.loss(t, p),
        false,
    );
    println!(" fused AdamW {ours:?}\n burn-optim  {theirs:?}");
    for (step, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs(),
            "step {step}: loss {a} (fused AdamW, Mlx) against {b} (burn-optim AdamW, NdArray)"
        );
    }
}

/// Two parameters whose gradients depend on their values, for the optimizer checks.
#[derive(Module, Debug)]
struct Quadratic<B: Backend> {
    w: Param<Tensor<B, 2>>,
    b: Param<Tensor<B, 1>>,
}

impl<B: Backend> Quadratic<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            w: Param::from_data(rand_f(&[300, 7], (-1.0, 1.0), 81), device),
            b: Param::from_data(rand_f(&[5], (-1.0, 1.0), 82), device),
        }
    }

    /// `sum(w² · c) + sum(b³)` for fixed `c`.
    fn loss(&self) -> Tensor<B, 1> {
        let device = self.w.val().device();
        let c = Tensor::<B, 2>::from_data(rand_f(&[300, 7], (0.5, 2.0), 83), &device);
        (self.w.val().powi_scalar(2) * c).sum() + self.b.val().powi_scalar(3).sum()
    }
}

/// The parameters after `steps` steps of `optim` on [`Quadratic`].
fn optimized<B: AutodiffBackend, O: Optimizer<Quadratic<B>, B>>(
    mut optim: O,
    steps: usize,
    device: &B::Device,
) -> Vec<TensorData> {
    let mut model = Quadratic::<B>::new(device);
    for _ in 0..steps {
        let grads = GradientsParams::from_grads(model.loss().backward(), &model);
        model = optim.step(1e-2, model, grads);
    }
    vec![model.w.val().to_data(), model.b.val().to_data()]
}

/// On MLX's CUDA device the update is one custom kernel per bucket of parameters: Adam and AdamW
/// (with weight decay) give burn-optim's parameters on NdArray. The GPU test machine runs it; without
/// a GPU it checks nothing and says so.
#[test]
fn optimizer_update_on_the_gpu_matches_burn_optim() {
    let _alone = setup();
    if !gpu_here("the CUDA update kernel") {
        return;
    }
    let gpu = MlxDevice::Gpu;
    let ours = optimized::<MlxAd, _>(burn_mlx::optim::AdamConfig::new().init(), 8, &gpu);
    let theirs = optimized::<NdAd, _>(AdamConfig::new().init(), 8, &ND);
    for (a, b) in ours.into_iter().zip(theirs) {
        assert_close("Adam on the GPU", a, b, 1e-5);
    }
    let config = burn_mlx::optim::AdamWConfig::new().with_weight_decay(0.1);
    let ours = optimized::<MlxAd, _>(config.init(), 8, &gpu);
    let reference = burn_optim::AdamWConfig::new().with_weight_decay(0.1);
    let theirs = optimized::<NdAd, _>(reference.init(), 8, &ND);
    for (a, b) in ours.into_iter().zip(theirs) {
        assert_close("AdamW on the GPU", a, b, 1e-5);
    }
}

/// Steps of `optim` on the fused model on `device`, where the parameters of the second encoder
/// layer get no gradient at steps 1 and 2 (so parameters reach different step numbers and fall
/// into different buckets): every parameter afterwards, and the record.
fn uneven_steps<O: Optimizer<FusedLm<MlxAd>, MlxAd>>(
    mut optim: O,
    device: &MlxDevice,
) -> (Vec<TensorData>, Vec<burn::module::ParamId>, O::Record) {
    let (mut model, _) = models_on(true, 91, device);
    for step in 0..5 {
        let (tokens, pad) = batch::<MlxAd>(92 + step, device);
        let l = model.loss(tokens, pad);
        let mut grads = GradientsParams::from_grads(l.backward(), &model);
        if step == 1 || step == 2 {
            for id in param_ids::<MlxAd, _>(&model.encoder.layers[1]) {
                grads.remove::<Mlx, 1>(id);
                grads.remove::<Mlx, 2>(id);
            }
        }
        model = optim.step(3e-3, model, grads);
    }
    (parameters(&model), param_ids(&model), optim.to_record())
}

/// The ids of a module's float parameters.
fn param_ids<B: Backend, M: Module<B>>(module: &M) -> Vec<burn::module::ParamId> {
    struct Ids(Vec<burn::module::ParamId>);
    impl<B: Backend> ModuleVisitor<B> for Ids {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.id);
        }
    }
    let mut ids = Ids(Vec::new());
    module.visit(&mut ids);
    ids.0
}

/// The bucketed adaptor (35 parameters: buckets of 8, split further by step number)
/// gives the per-parameter update's values exactly, and its record is burn-optim's adaptor's.
fn check_buckets(device: &MlxDevice) {
    use burn_optim::adaptor::OptimizerAdaptor;
    let config = burn_mlx::optim::AdamConfig::new();
    let (bucketed, ids, record) = uneven_steps(config.init(), device);
    let per_parameter: OptimizerAdaptor<burn_mlx::optim::Adam, FusedLm<MlxAd>, MlxAd> =
        OptimizerAdaptor::from(config.build());
    let (single, single_ids, single_record) = uneven_steps(per_parameter, device);
    assert_eq!(bucketed.len(), 35);
    for (i, (a, b)) in bucketed.iter().zip(&single).enumerate() {
        assert_eq!(
            a, b,
            "parameter {i} on {device:?}: bucketed against per parameter"
        );
    }
    // The records hold the same states, parameter by parameter: the step numbers, and the
    // moments, equal on the CPU and within 1e-6 on CUDA, where the kernel is compiled once per
    // bucket size and NVRTC may contract the moments' multiply-adds differently (measured on an
    // H200: 2.3e-10).
    let tol = if *device == MlxDevice::Cpu { 0.0 } else { 1e-6 };
    assert_eq!(record.len(), single_record.len());
    for (i, (id, single_id)) in ids.iter().zip(&single_ids).enumerate() {
        let ours = record.get(id).expect("every parameter has state");
        let theirs = single_record
            .get(single_id)
            .expect("every parameter has state");
        let rank = bucketed[i].shape.len();
        let (a, b) = (moments_of(ours, rank), moments_of(theirs, rank));
        assert_eq!(a.0, b.0, "the step number of parameter {i} on {device:?}");
        for (what, x, y) in [("first", &a.1, &b.1), ("second", &a.2, &b.2)] {
            let w = worst(x.clone(), y.clone());
            println!("parameter {i} on {device:?}: {what} moment differs by {w:e}");
            assert!(
                w <= tol,
                "the {what} moment of parameter {i} on {device:?} differs by {w:e}"
            );
        }
    }
}

/// The step number and moments of an Adam state record of a parameter of `rank`.
fn moments_of(
    record: &burn_optim::record::AdaptorRecord<burn_mlx::optim::Adam, MlxAd>,
    rank: usize,
) -> (usize, TensorData, TensorData) {
    match rank {
        1 => {
            let m = record.clone().into_state::<1>().momentum;
            (m.time, m.moment_1.to_data(), m.moment_2.to_data())
        }
        2 => {
            let m = record.clone().into_state::<2>().momentum;
            (m.time, m.moment_1.to_data(), m.moment_2.to_data())
        }
        r => panic!("no parameter of rank {r} here"),
    }
}

#[test]
fn bucketed_adam_matches_the_per_parameter_update() {
    let _alone = setup();
    check_buckets(&MD);
}

/// [`check_buckets`] on MLX's CUDA device, where each bucket is one custom kernel launch. The GPU
/// test machine runs it; without a GPU it checks nothing and says so.
#[test]
fn bucketed_adam_on_the_gpu_matches_the_per_parameter_update() {
    let _alone = setup();
    if !gpu_here("the bucketed CUDA update") {
        return;
    }
    check_buckets(&MlxDevice::Gpu);
}
