//! `burn_mlx::decode`'s fused decode ops against references composed from Burn ops on
//! burn-ndarray in f32, on random inputs: f32, bf16 and f16; head sizes 64 and 128; 1, 2 and 4
//! query heads per key head; cache lengths 1, 255, 256 and 2,047, with and without a sliding
//! window; the fused projections (`linear_add`, `norm_gated`, `norm_qkv_heads`) with one to six
//! rows, weights read in place as transposed views or stored as they are, with and without biases.
//!
//! They run on the GPU when this build has one (the CUDA kernels), otherwise on MLX's CPU (the
//! composed path the other platforms take).

use crate::common::{device_tol, rand_f, Tol};
use burn_mlx::decode::{self, At, Gate, JointHeads, QkvLayout};
use burn_mlx::fast::RotaryEmbedding;
use burn_mlx::{Mlx, MlxDevice};
use burn_ndarray::{NdArray, NdArrayDevice};
use burn_tensor::activation::{sigmoid, softmax};
use burn_tensor::{DType, Int, Tensor, TensorData};

pub(super) type R = NdArray<f32>;

pub(super) fn device() -> MlxDevice {
    if MlxDevice::gpu_available() {
        MlxDevice::Gpu
    } else {
        MlxDevice::Cpu
    }
}

/// A tensor of `dtype` on the test device, and the same values (rounded to `dtype`) in f32 on
/// burn-ndarray.
pub(super) fn pair<const D: usize>(
    shape: [usize; D],
    seed: u64,
    dtype: DType,
    scale: f32,
) -> (Tensor<Mlx, D>, Tensor<R, D>) {
    let range = (-f64::from(scale), f64::from(scale));
    let data = rand_f(&shape, range, seed).convert::<f32>();
    let t = Tensor::<Mlx, D>::from_data(data, &device()).cast(dtype);
    let rounded = t.clone().cast(DType::F32).into_data();
    (t, Tensor::from_data(rounded, &NdArrayDevice::Cpu))
}

pub(super) fn f32_rows<const D: usize>(t: Tensor<Mlx, D>) -> Vec<f32> {
    t.cast(DType::F32).into_data().to_vec::<f32>().unwrap()
}

pub(super) fn check(label: &str, got: Vec<f32>, want: Vec<f32>, tol: f32) {
    assert_eq!(got.len(), want.len(), "{label}: lengths");
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| {
            assert!(a.is_finite(), "{label}: {a}");
            (a - b).abs() / (1.0 + b.abs())
        })
        .fold(0f32, f32::max);
    assert!(
        worst <= tol,
        "{label}: largest difference {worst:.3e} > {tol:.1e}"
    );
}

pub(super) const DTYPES: [(DType, f32); 3] =
    [(DType::F32, 2e-5), (DType::BF16, 2e-2), (DType::F16, 4e-3)];

pub(super) fn rms_norm_ref<const D: usize>(
    x: Tensor<R, D>,
    w: Tensor<R, 1>,
    eps: f64,
) -> Tensor<R, D> {
    let ms = x.clone().square().mean_dim(D - 1);
    x / (ms + eps).sqrt() * w.unsqueeze::<D>()
}

#[test]
fn add_rms_norm_matches_the_composed_ops() {
    for (dtype, tol) in DTYPES {
        for n in [64, 1024, 3072] {
            for rows in [1, 7] {
                let (x, xr) = pair([rows, n], 1, dtype, 2.0);
                let (r, rr) = pair([rows, n], 2, dtype, 2.0);
                let (w, wr) = pair([n], 3, dtype, 1.0);
                let (h, y) = decode::add_rms_norm(x, r, w, 1e-6);
                let href = xr + rr;
                let label = format!("add_rms_norm {dtype:?} [{rows}, {n}]");
                check(
                    &label,
                    f32_rows(h),
                    href.clone().into_data().to_vec().unwrap(),
                    tol,
                );
                let yref = rms_norm_ref(href, wr, 1e-6);
                check(
                    &label,
                    f32_rows(y),
                    yref.into_data().to_vec().unwrap(),
                    2.0 * tol,
                );
            }
        }
    }
}

/// The inverse frequencies of RoPE with base 10,000 for heads of `d`.
pub(super) fn rope_freqs(d: usize) -> Vec<f64> {
    (0..d / 2)
        .map(|i| 10000f64.powf(-2.0 * i as f64 / d as f64))
        .collect()
}

/// Rotate-half RoPE of `x` (`[1, heads, seq, d]`) at positions `offset..`, in f32.
pub(super) fn rope_ref(x: Tensor<R, 4>, freqs: &[f64], offset: usize) -> Tensor<R, 4> {
    let [_, _, seq, d] = x.dims();
    let half = d / 2;
    let dev = NdArrayDevice::Cpu;
    let angles: Vec<f32> = (0..seq)
        .flat_map(|p| freqs.iter().map(move |f| ((offset + p) as f64 * f) as f32))
        .collect();
    let a = Tensor::<R, 2>::from_data(TensorData::new(angles, [seq, half]), &dev);
    let (cos, sin) = (
        a.clone().cos().reshape([1, 1, seq, half]),
        a.sin().reshape([1, 1, seq, half]),
    );
    let x1 = x.clone().narrow(3, 0, half);
    let x2 = x.narrow(3, half, half);
    Tensor::cat(
        vec![
            x1.clone() * cos.clone() - x2.clone() * sin.clone(),
            x2 * cos + x1 * sin,
        ],
        3,
    )
}

/// The query, key and value heads of a reference QKV output (`[rows, (hq + 2·hkv)·d]`, laid out
/// by `heads`), the query and key heads RMS-normalized with `norms` where given.
pub(super) fn heads_ref(
    qkv: Tensor<R, 2>,
    [hq, hkv, d]: [usize; 3],
    heads: impl Fn(Tensor<R, 2>, usize) -> Tensor<R, 4>,
    norms: Option<(&Tensor<R, 1>, &Tensor<R, 1>)>,
) -> [Tensor<R, 4>; 3] {
    let q = heads(qkv.clone().narrow(1, 0, hq * d), hq);
    let k = heads(qkv.clone().narrow(1, hq * d, hkv * d), hkv);
    let v = heads(qkv.narrow(1, (hq + hkv) * d, hkv * d), hkv);
    match norms {
        Some((qw, kw)) => [
            rms_norm_ref(q, qw.clone(), 1e-6),
            rms_norm_ref(k, kw.clone(), 1e-6),
            v,
        ],
        None => [q, k, v],
    }
}

#[test]
fn qkv_heads_match_the_composed_ops() {
    for (dtype, tol) in DTYPES {
        for d in [64, 128] {
            for (hq, hkv) in [(4, 4), (4, 2), (8, 2)] {
                for (batch, seq, offset) in
                    [(1, 1, 0), (1, 1, 300), (1, 5, 2040), (3, 1, 300), (2, 5, 7)]
                {
                    for norm in [false, true] {
                        let layout = QkvLayout {
                            heads: hq,
                            kv_heads: hkv,
                            head_dim: d,
                        };
                        let (qkv, qkv_r) = pair([batch * seq, layout.width()], 4, dtype, 2.0);
                        let (qw, qw_r) = pair([d], 5, dtype, 1.0);
                        let (kw, kw_r) = pair([d], 6, dtype, 1.0);
                        let freqs = rope_freqs(d);
                        let rope = RotaryEmbedding::<Mlx>::new(&freqs, &device());
                        let norms = norm.then_some((&qw, &kw));
                        let [q, k, v] = decode::qkv_heads(
                            qkv.clone(),
                            batch,
                            layout,
                            norms,
                            1e-6,
                            &rope,
                            &At::Host(offset),
                        );
                        let [qj, kv] = decode::qkv_heads_joint(
                            qkv,
                            batch,
                            layout,
                            norms,
                            1e-6,
                            &rope,
                            &At::Host(offset),
                        );
                        let joint = f32_rows(Tensor::cat(vec![k.clone(), v.clone()], 1));
                        check("qkv_heads_joint q", f32_rows(qj), f32_rows(q.clone()), 0.0);
                        check("qkv_heads_joint kv", f32_rows(kv), joint, 0.0);
                        let heads = |t: Tensor<R, 2>, n: usize| {
                            t.reshape([batch, seq, n, d]).swap_dims(1, 2)
                        };
                        let [qr, kr, vr] =
                            heads_ref(qkv_r, [hq, hkv, d], heads, norm.then_some((&qw_r, &kw_r)));
                        let label = format!(
                            "qkv_heads {dtype:?} d {d} heads {hq}/{hkv} batch {batch} seq {seq} at {offset} norm {norm}"
                        );
                        // Positions up to 2,045 turn angles by up to 2,045 radians: f32's
                        // rounding of the angle costs about 1e-4.
                        let tol = tol.max(4e-4) * 2.0;
                        let want = |t: Tensor<R, 4>| t.into_data().to_vec::<f32>().unwrap();
                        check(&label, f32_rows(q), want(rope_ref(qr, &freqs, offset)), tol);
                        check(&label, f32_rows(k), want(rope_ref(kr, &freqs, offset)), tol);
                        check(&label, f32_rows(v), want(vr), 0.0);
                    }
                }
            }
        }
    }
}

#[test]
fn decode_attention_matches_the_composed_ops() {
    for (dtype, tol) in DTYPES {
        for d in [64, 128] {
            for (hq, hkv) in [(4, 4), (4, 2), (8, 2)] {
                for len in [1, 255, 256, 2047] {
                    for window in [None, Some(100)] {
                        let cap = 2048;
                        let (q, q_r) = pair([1, hq, 1, d], 7, dtype, 1.0);
                        let (k, k_r) = pair([1, hkv, cap, d], 8, dtype, 1.0);
                        let (v, v_r) = pair([1, hkv, cap, d], 9, dtype, 1.0);
                        let scale = 1.0 / (d as f64).sqrt();
                        let label = format!(
                            "decode_attention {dtype:?} d {d} heads {hq}/{hkv} len {len} window {window:?}"
                        );
                        let host = decode::decode_attention(
                            q.clone(),
                            k.clone(),
                            v.clone(),
                            &At::Host(len),
                            scale,
                            window,
                        );
                        let at = Tensor::<Mlx, 1, Int>::from_ints([len as i32], &device());
                        let kv = Tensor::cat(vec![k.clone(), v.clone()], 1);
                        let joint = decode::decode_attention_joint(
                            q.clone(),
                            kv,
                            &At::Device(at.clone()),
                            scale,
                            window,
                        );
                        let dev = decode::decode_attention(q, k, v, &At::Device(at), scale, window);
                        let start = window.map_or(0, |w| len.saturating_sub(w));
                        let groups = hq / hkv;
                        let k_r = k_r.narrow(2, start, len - start);
                        let v_r = v_r.narrow(2, start, len - start);
                        let q_r = q_r.reshape([1, hkv, groups, d]);
                        let scores = q_r.matmul(k_r.swap_dims(2, 3)) * scale;
                        let want = softmax(scores, 3).matmul(v_r).reshape([1, hq * d]);
                        let want = want.into_data().to_vec::<f32>().unwrap();
                        check(&label, f32_rows(host), want.clone(), tol);
                        check(
                            &format!("{label}, device length"),
                            f32_rows(dev),
                            want.clone(),
                            tol,
                        );
                        check(&format!("{label}, one buffer"), f32_rows(joint), want, tol);
                    }
                }
            }
        }
    }
}

#[test]
fn gated_activations_match_the_composed_ops() {
    for (dtype, tol) in DTYPES {
        for (rows, i) in [(1, 3072), (6, 640)] {
            for gate in [Gate::Silu, Gate::GeluTanh] {
                let (gu, gu_r) = pair([rows, 2 * i], 10, dtype, 4.0);
                let y = decode::gated(gu, gate);
                let (g, u) = (gu_r.clone().narrow(1, 0, i), gu_r.narrow(1, i, i));
                let act = match gate {
                    Gate::Silu => g.clone() * sigmoid(g),
                    Gate::GeluTanh => decode::gelu_tanh(g),
                };
                let want = (act * u).into_data().to_vec::<f32>().unwrap();
                check(
                    &format!("gated {dtype:?} {gate:?} [{rows}, {i}]"),
                    f32_rows(y),
                    want,
                    2.0 * tol,
                );
            }
        }
    }
}

#[test]
#[should_panic(expected = "decode_attention: length 0 is outside")]
fn decode_attention_rejects_an_empty_length() {
    let q = Tensor::<Mlx, 4>::zeros([1, 2, 1, 64], &device());
    let k = Tensor::<Mlx, 4>::zeros([1, 2, 8, 64], &device());
    decode::decode_attention(q, k.clone(), k, &At::Host(0), 0.125, None);
}

#[test]
#[should_panic(expected = "qkv_heads: the projection is 100 wide")]
fn qkv_heads_rejects_a_wrong_width() {
    let x = Tensor::<Mlx, 2>::zeros([1, 100], &device());
    let rope = RotaryEmbedding::<Mlx>::new(&[1.0; 32], &device());
    let layout = QkvLayout {
        heads: 2,
        kv_heads: 1,
        head_dim: 64,
    };
    decode::qkv_heads(x, 1, layout, None, 1e-6, &rope, &At::Host(0));
}

/// A weight as the LLM runner holds it, `[in, out]` as a transposed view of a stored `[out, in]`
/// matrix (`transposed`), or stored `[in, out]`; values in ±`1/sqrt(in)`, so that products of
/// normalized rows stay near 1.
fn weight_pair(
    [input, out]: [usize; 2],
    seed: u64,
    dtype: DType,
    transposed: bool,
) -> (Tensor<Mlx, 2>, Tensor<R, 2>) {
    let scale = 1.7 / (input as f32).sqrt();
    if transposed {
        let (w, w_r) = pair([out, input], seed, dtype, scale);
        (w.transpose(), w_r.transpose())
    } else {
        pair([input, out], seed, dtype, scale)
    }
}

/// The fused projections' cases: (rows, in, out): one to four rows run the CUDA kernels, six the
/// composed ops; input widths of whole 16-byte loads per lane (1,024), with a remainder (2,056),
/// and the widest here (3,072).
const PROJECTION_CASES: [(usize, usize, usize); 4] = [
    (1, 1024, 1024),
    (2, 2056, 520),
    (4, 3072, 256),
    (6, 200, 72),
];

/// The tolerance of a fused projection of `rows` rows of `input` values: the dtype's, or the
/// suite's TF32 bound ([`device_tol`]) where the composed ops run the product on CUDA in f32 (more
/// rows than the kernels take, or more than the 32 KiB of input rows they stage).
pub(super) fn projection_tol(dtype: DType, tol: f32, rows: usize, input: usize) -> f32 {
    let composed = rows > decode::MAX_FUSED_ROWS || rows * input * 4 > 32 * 1024;
    if !composed {
        return tol;
    }
    let t = f64::from(tol);
    device_tol("matmul", dtype, Tol { rtol: t, atol: t }).rtol as f32
}

#[test]
fn linear_add_matches_the_composed_ops() {
    for (dtype, tol) in DTYPES {
        for (rows, input, out) in PROJECTION_CASES {
            for (transposed, bias) in [(true, false), (false, true)] {
                let (x, x_r) = pair([rows, input], 11, dtype, 2.0);
                let (w, w_r) = weight_pair([input, out], 12, dtype, transposed);
                let (b, b_r) = pair([out], 13, dtype, 0.5);
                let (res, res_r) = pair([rows, out], 14, dtype, 2.0);
                let dense = decode::Dense {
                    weight: &w,
                    bias: bias.then_some(&b),
                };
                let y = decode::linear_add(x, dense, res);
                let mut want = res_r + x_r.matmul(w_r);
                if bias {
                    want = want + b_r.unsqueeze::<2>();
                }
                check(
                    &format!("linear_add {dtype:?} [{rows}, {input}] x [{input}, {out}] transposed {transposed} bias {bias}"),
                    f32_rows(y),
                    want.into_data().to_vec().unwrap(),
                    2.0 * projection_tol(dtype, tol, rows, input),
                );
            }
        }
    }
}

#[test]
fn norm_gated_matches_the_composed_ops() {
    for (dtype, tol) in DTYPES {
        for (rows, input, i) in PROJECTION_CASES {
            for gate in [Gate::Silu, Gate::GeluTanh] {
                let bias = gate == Gate::GeluTanh;
                let (x, x_r) = pair([rows, input], 15, dtype, 3.0);
                let (g, g_r) = pair([input], 16, dtype, 1.5);
                let (w, w_r) = weight_pair([input, 2 * i], 17, dtype, true);
                let (b, b_r) = pair([2 * i], 18, dtype, 0.5);
                let dense = decode::Dense {
                    weight: &w,
                    bias: bias.then_some(&b),
                };
                let y = decode::norm_gated(x, &g, 1e-6, dense, gate);
                let mut gu = rms_norm_ref(x_r, g_r, 1e-6).matmul(w_r);
                if bias {
                    gu = gu + b_r.unsqueeze::<2>();
                }
                let (gv, u) = (gu.clone().narrow(1, 0, i), gu.narrow(1, i, i));
                let act = match gate {
                    Gate::Silu => gv.clone() * sigmoid(gv),
                    Gate::GeluTanh => decode::gelu_tanh(gv),
                };
                check(
                    &format!("norm_gated {dtype:?} {gate:?} [{rows}, {input}] to {i}"),
                    f32_rows(y),
                    (act * u).into_data().to_vec().unwrap(),
                    3.0 * projection_tol(dtype, tol, rows, input),
                );
            }
        }
    }
}

/// `norm_qkv_heads`' cases: (dtype index in [`DTYPES`], head size, query heads, key heads). Every
/// dtype, head size and grouping appears; not every combination, as each is one more kernel for
/// NVRTC to compile on CUDA.
const QKV_CASES: [(usize, usize, usize, usize); 7] = [
    (0, 64, 4, 4),
    (0, 128, 8, 2),
    (1, 64, 4, 2),
    (1, 128, 4, 4),
    (1, 128, 8, 2),
    (2, 64, 8, 2),
    (2, 128, 4, 2),
];

#[test]
fn norm_qkv_heads_match_the_composed_ops() {
    for (dtype_index, d, hq, hkv) in QKV_CASES {
        let (dtype, tol) = DTYPES[dtype_index];
        for (rows, offset, norm, bias) in [
            (1, 2040, true, true),
            (3, 300, false, false),
            (6, 7, true, false),
        ] {
            let layout = QkvLayout {
                heads: hq,
                kv_heads: hkv,
                head_dim: d,
            };
            let input = 1024;
            let width = layout.width();
            let (x, x_r) = pair([rows, input], 19, dtype, 2.0);
            let (g, g_r) = pair([input], 20, dtype, 1.5);
            let (w, w_r) = weight_pair([input, width], 21, dtype, true);
            let (b, b_r) = pair([width], 22, dtype, 0.5);
            let (qw, qw_r) = pair([d], 23, dtype, 1.0);
            let (kw, kw_r) = pair([d], 24, dtype, 1.0);
            let freqs = rope_freqs(d);
            let rope = RotaryEmbedding::<Mlx>::new(&freqs, &device());
            let dense = decode::Dense {
                weight: &w,
                bias: bias.then_some(&b),
            };
            let norms = norm.then_some((&qw, &kw));
            let at = At::Host(offset);
            let [q, k, v] =
                decode::norm_qkv_heads(x.clone(), &g, 1e-6, dense, layout, norms, 1e-6, &rope, &at);
            let device_at =
                At::Device(Tensor::<Mlx, 1, Int>::from_ints([offset as i32], &device()));
            let [qj, kv] = decode::norm_qkv_heads_joint(
                x, &g, 1e-6, dense, layout, norms, 1e-6, &rope, &device_at,
            );
            let joint = f32_rows(Tensor::cat(vec![k.clone(), v.clone()], 1));
            check(
                "norm_qkv_heads_joint q",
                f32_rows(qj),
                f32_rows(q.clone()),
                0.0,
            );
            check("norm_qkv_heads_joint kv", f32_rows(kv), joint, 0.0);
            let mut qkv_r = rms_norm_ref(x_r, g_r, 1e-6).matmul(w_r);
            if bias {
                qkv_r = qkv_r + b_r.unsqueeze::<2>();
            }
            let heads = |t: Tensor<R, 2>, n: usize| t.reshape([rows, n, 1, d]);
            let [qr, kr, vr] =
                heads_ref(qkv_r, [hq, hkv, d], heads, norm.then_some((&qw_r, &kw_r)));
            let label = format!(
                        "norm_qkv_heads {dtype:?} d {d} heads {hq}/{hkv} rows {rows} at {offset} norm {norm} bias {bias}"
                    );
            let tol = projection_tol(dtype, tol, rows, input).max(4e-4) * 3.0;
            let want = |t: Tensor<R, 4>| t.into_data().to_vec::<f32>().unwrap();
            // `rope_ref` rotates `[1, heads, seq, d]`: the rows are sequences here.
            let rope_rows = |t: Tensor<R, 4>| {
                let [_, n, _, _] = t.dims();
                rope_ref(t.reshape([1, rows * n, 1, d]), &freqs, offset)
            };
            check(&label, f32_rows(q), want(rope_rows(qr)), tol);
            check(&label, f32_rows(k), want(rope_rows(kr)), tol);
            check(&label, f32_rows(v), want(vr), tol);
        }
    }
}

#[test]
#[should_panic(expected = "linear_add: the input rows hold 100 values, the weight [64, 32]")]
fn linear_add_rejects_a_wrong_input_width() {
    let x = Tensor::<Mlx, 2>::zeros([1, 100], &device());
    let w = Tensor::<Mlx, 2>::zeros([64, 32], &device());
    let res = Tensor::<Mlx, 2>::zeros([1, 32], &device());
    let dense = decode::Dense {
        weight: &w,
        bias: None,
    };
    decode::linear_add(x, dense, res);
}

/// `attention_mlp`'s cases: (dtype index in [`DTYPES`], head size, query heads, key heads,
/// hidden size, MLP width): the Qwen3-0.6B block in bf16, every dtype, grouped and ungrouped
/// heads, a hidden size that is not a whole number of 16-byte loads per lane, and f32 heads of
/// 256.
const TAIL_CASES: [(usize, usize, usize, usize, usize, usize); 5] = [
    (0, 64, 4, 4, 256, 512),
    (1, 128, 16, 8, 1024, 3072),
    (2, 128, 8, 2, 512, 1024),
    (1, 64, 4, 2, 2056, 1024),
    (0, 256, 4, 1, 512, 1024),
];

/// One query's attention over the first `len` positions of a joint cache, `[1, hq·d]`.
pub(super) fn joint_attention_ref(
    q: Tensor<R, 4>,
    kv: Tensor<R, 4>,
    len: usize,
    scale: f64,
) -> Tensor<R, 2> {
    let [_, hq, _, d] = q.dims();
    let hkv = kv.dims()[1] / 2;
    let k = kv.clone().narrow(1, 0, hkv).narrow(2, 0, len);
    let v = kv.narrow(1, hkv, hkv).narrow(2, 0, len);
    let q = q.reshape([1, hkv, hq / hkv, d]);
    let scores = q.matmul(k.swap_dims(2, 3)) * scale;
    softmax(scores, 3).matmul(v).reshape([1, hq * d])
}

/// A pre-norm block's decode step after the cache write, in f32 on burn-ndarray: attention of `q`
/// over the first `len` positions of the joint cache `kv`, the output projection `wo` and the
/// residual `x`, the RMS norm `g`, the SwiGLU MLP (`wgu`, `wd`) and its residual; `[1, hidden]`.
pub(super) fn block_ref(
    [q, kv]: [&Tensor<R, 4>; 2],
    x: &Tensor<R, 2>,
    [wo, wgu, wd]: [&Tensor<R, 2>; 3],
    g: &Tensor<R, 1>,
    len: usize,
    scale: f64,
) -> Tensor<R, 2> {
    let width = wd.dims()[0];
    let attended = joint_attention_ref(q.clone(), kv.clone(), len, scale);
    let h = x.clone() + attended.matmul(wo.clone());
    let gu = rms_norm_ref(h.clone(), g.clone(), 1e-6).matmul(wgu.clone());
    let (gv, u) = (gu.clone().narrow(1, 0, width), gu.narrow(1, width, width));
    h + (gv.clone() * sigmoid(gv) * u).matmul(wd.clone())
}

/// A tensor on the test device and its burn-ndarray copy.
type Pair<const D: usize> = (Tensor<Mlx, D>, Tensor<R, D>);

/// `attention_mlp`'s inputs for one of [`TAIL_CASES`] (a 2,048-position cache), from seeds
/// `seed..seed + 7`.
struct TailInputs {
    q: Pair<4>,
    kv: Pair<4>,
    x: Pair<2>,
    wo: Pair<2>,
    g: Pair<1>,
    wgu: Pair<2>,
    wd: Pair<2>,
}

fn tail_inputs(dtype: DType, [d, hq, hkv, hidden, width]: [usize; 5], seed: u64) -> TailInputs {
    TailInputs {
        q: pair([1, hq, 1, d], seed, dtype, 1.0),
        kv: pair([1, 2 * hkv, 2048, d], seed + 1, dtype, 1.0),
        x: pair([1, hidden], seed + 2, dtype, 2.0),
        wo: weight_pair([hq * d, hidden], seed + 3, dtype, true),
        g: pair([hidden], seed + 4, dtype, 1.5),
        wgu: weight_pair([hidden, 2 * width], seed + 5, dtype, true),
        wd: weight_pair([width, hidden], seed + 6, dtype, true),
    }
}

#[test]
fn attention_mlp_matches_the_composed_ops() {
    for (di, d, hq, hkv, hidden, width) in TAIL_CASES {
        let (dtype, tol) = DTYPES[di];
        let TailInputs {
            q: (q, q_r),
            kv: (kv, kv_r),
            x: (x, x_r),
            wo: (wo, wo_r),
            g: (g, g_r),
            wgu: (wgu, wgu_r),
            wd: (wd, wd_r),
        } = tail_inputs(dtype, [d, hq, hkv, hidden, width], 21);
        let dense = |w| decode::Dense {
            weight: w,
            bias: None,
        };
        let scale = 1.0 / (d as f64).sqrt();
        for len in [1, 255, 2047] {
            let label = format!(
                "attention_mlp {dtype:?} d {d} heads {hq}/{hkv} hidden {hidden} width {width} len {len}"
            );
            let at = Tensor::<Mlx, 1, Int>::from_ints([len as i32], &device());
            for (how, at) in [("host", At::Host(len)), ("device", At::Device(at))] {
                let run = || {
                    decode::attention_mlp(
                        q.clone(),
                        kv.clone(),
                        &at,
                        scale,
                        x.clone(),
                        dense(&wo),
                        &g,
                        1e-6,
                        dense(&wgu),
                        dense(&wd),
                        Gate::Silu,
                    )
                };
                let fused = f32_rows(run());
                // The same block through the four functions it stands for.
                let attended =
                    decode::decode_attention_joint(q.clone(), kv.clone(), &at, scale, None);
                let h = decode::linear_add(attended, dense(&wo), x.clone());
                let act = decode::norm_gated(h.clone(), &g, 1e-6, dense(&wgu), Gate::Silu);
                let steps = f32_rows(decode::linear_add(act, dense(&wd), h));
                check(
                    &format!("{label} ({how} length) against the four steps"),
                    fused.clone(),
                    steps,
                    2.0 * tol,
                );
                // And against burn-ndarray in f32: four ops rounded to the dtype, so four times a
                // projection's tolerance (the composed path on the CPU stays within one).
                let want = block_ref(
                    [&q_r, &kv_r],
                    &x_r,
                    [&wo_r, &wgu_r, &wd_r],
                    &g_r,
                    len,
                    scale,
                );
                check(
                    &format!("{label} ({how} length)"),
                    fused.clone(),
                    want.into_data().to_vec().unwrap(),
                    4.0 * projection_tol(dtype, tol, 1, hidden),
                );
                // Another run reads the same cache and gives the same values (on CUDA: the
                // barrier counters it finds are those the first run left).
                assert_eq!(f32_rows(run()), fused, "{label}: two runs differ");
            }
        }
    }
}

#[test]
fn attention_mlp_qkv_matches_the_composed_ops() {
    for (di, d, hq, hkv, hidden, width) in TAIL_CASES {
        let (dtype, tol) = DTYPES[di];
        let TailInputs {
            q: (q, _),
            kv: (kv, _),
            x: (x, _),
            wo: (wo, _),
            g: (g, _),
            wgu: (wgu, _),
            wd: (wd, _),
        } = tail_inputs(dtype, [d, hq, hkv, hidden, width], 31);
        let layout = QkvLayout {
            heads: hq,
            kv_heads: hkv,
            head_dim: d,
        };
        let (g2, g2_r) = pair([hidden], 38, dtype, 1.5);
        let (wqkv, wqkv_r) = weight_pair([hidden, layout.width()], 39, dtype, true);
        let (b2, b2_r) = pair([layout.width()], 40, dtype, 0.5);
        let (qw, qw_r) = pair([d], 41, dtype, 1.0);
        let (kw, kw_r) = pair([d], 42, dtype, 1.0);
        let freqs = rope_freqs(d);
        let rope = RotaryEmbedding::<Mlx>::new(&freqs, &device());
        let dense = |w| decode::Dense {
            weight: w,
            bias: None,
        };
        let scale = 1.0 / (d as f64).sqrt();
        // The next block with a bias and query/key norms, then without either.
        for (len, bias, norm) in [(1, true, true), (2047, false, false), (255, true, false)] {
            let label = format!(
                "attention_mlp_qkv {dtype:?} d {d} heads {hq}/{hkv} hidden {hidden} width {width} \
                 len {len} bias {bias} norm {norm}"
            );
            let at = At::Device(Tensor::<Mlx, 1, Int>::from_ints([len as i32], &device()));
            let offset = At::Host(len - 1);
            let next = decode::NormQkv {
                norm: &g2,
                eps: 1e-6,
                layer: decode::Linear::Dense(decode::Dense {
                    weight: &wqkv,
                    bias: bias.then_some(&b2),
                }),
                layout,
                qk_norms: norm.then_some((&qw, &kw)),
                qk_eps: 1e-6,
                rope: &rope,
                offset: &offset,
                cache: None,
            };
            let run_with = |next: &decode::NormQkv<Mlx>| {
                decode::attention_mlp_qkv(
                    q.clone(),
                    kv.clone(),
                    &at,
                    scale,
                    x.clone(),
                    dense(&wo),
                    &g,
                    1e-6,
                    dense(&wgu),
                    dense(&wd),
                    Gate::Silu,
                    Some(next),
                )
            };
            let run = || run_with(&next);
            let (y, Some(JointHeads { q: q2, kv: kv2, .. })) = run() else {
                panic!("{label}: no heads for the next block");
            };
            // The block's output as `attention_mlp` makes it (on CUDA: the same kernel up to the
            // next block's heads).
            let alone = decode::attention_mlp(
                q.clone(),
                kv.clone(),
                &at,
                scale,
                x.clone(),
                dense(&wo),
                &g,
                1e-6,
                dense(&wgu),
                dense(&wd),
                Gate::Silu,
            );
            let y_rows = f32_rows(y.clone());
            check(&format!("{label}: y"), y_rows.clone(), f32_rows(alone), tol);
            // The next block's heads against `norm_qkv_heads_joint` on the same output...
            let [q_want, kv_want] = next.heads_joint(y.clone());
            let heads_tol = 2.0 * projection_tol(dtype, tol, 1, hidden).max(4e-4);
            let (q_rows, kv_rows) = (f32_rows(q2), f32_rows(kv2));
            check(
                &format!("{label}: queries against norm_qkv_heads_joint"),
                q_rows.clone(),
                f32_rows(q_want),
                heads_tol,
            );
            check(
                &format!("{label}: keys and values against norm_qkv_heads_joint"),
                kv_rows.clone(),
                f32_rows(kv_want),
                heads_tol,
            );
            // ...and against burn-ndarray in f32 from the same output.
            let y_r = Tensor::<R, 2>::from_data(
                TensorData::new(y_rows.clone(), [1, hidden]),
                &NdArrayDevice::Cpu,
            );
            let mut qkv_r = rms_norm_ref(y_r, g2_r.clone(), 1e-6).matmul(wqkv_r.clone());
            if bias {
                qkv_r = qkv_r + b2_r.clone().unsqueeze::<2>();
            }
            let heads = |t: Tensor<R, 2>, n: usize| t.reshape([1, n, 1, d]);
            let [qr, kr, vr] =
                heads_ref(qkv_r, [hq, hkv, d], heads, norm.then_some((&qw_r, &kw_r)));
            let rows = |t: Tensor<R, 4>| {
                let [_, n, _, _] = t.dims();
                let t = rope_ref(t.reshape([1, n, 1, d]), &freqs, len - 1);
                t.into_data().to_vec::<f32>().unwrap()
            };
            let mut kv_ref = rows(kr);
            kv_ref.extend(vr.into_data().to_vec::<f32>().unwrap());
            let ref_tol = 3.0 * projection_tol(dtype, tol, 1, hidden).max(4e-4);
            check(&label, q_rows.clone(), rows(qr), ref_tol);
            check(&label, kv_rows.clone(), kv_ref, ref_tol);
            // Another run gives the same values (on CUDA: the head counts it finds are those the
            // first run left).
            let (
                y_again,
                Some(JointHeads {
                    q: q_again,
                    kv: kv_again,
                    ..
                }),
            ) = run()
            else {
                panic!("{label}: no heads for the next block");
            };
            assert_eq!(f32_rows(y_again), y_rows, "{label}: two runs differ (y)");
            assert_eq!(f32_rows(q_again), q_rows, "{label}: two runs differ (q)");
            assert_eq!(f32_rows(kv_again), kv_rows, "{label}: two runs differ (kv)");
            // With the next block's cache, the kernel also writes its keys and values there, at
            // the offset; the composed path leaves the cache to the caller.
            let cache = decode::cache_buffer::<Mlx>([1, 2 * hkv, len + 1, d], &device(), dtype);
            let with_cache = decode::NormQkv {
                cache: Some(&cache),
                ..next
            };
            let (y_cached, Some(heads)) = run_with(&with_cache) else {
                panic!("{label}: no heads for the next block");
            };
            assert_eq!(f32_rows(y_cached), y_rows, "{label}: y with a cache");
            assert_eq!(
                f32_rows(heads.kv.clone()),
                kv_rows,
                "{label}: kv with a cache"
            );
            check_cache_row(&label, &cache, &heads, len - 1);
        }
    }
}

/// Checks `heads.cached` against where the kernels run (`decode::kernels_run`) and the cache it
/// speaks of: with it, row `at` of every head of `cache` holds `heads.kv` and every other row is
/// still zero; without it, the whole cache is still zero.
fn check_cache_row(label: &str, cache: &Tensor<Mlx, 4>, heads: &JointHeads<Mlx>, at: usize) {
    assert_eq!(
        heads.cached,
        decode::kernels_run::<Mlx>(&device()),
        "{label}: written in place only where the kernels run"
    );
    let [rows, h, cap, d] = cache.dims();
    let got = f32_rows(cache.clone());
    let kv = f32_rows(heads.kv.clone());
    for r in 0..rows {
        for head in 0..h {
            for p in 0..cap {
                let start = ((r * h + head) * cap + p) * d;
                let row = &got[start..start + d];
                if heads.cached && p == at {
                    let k = (r * h + head) * d;
                    assert_eq!(row, &kv[k..k + d], "{label}: cache row {p} of head {head}");
                } else {
                    assert!(
                        row.iter().all(|&v| v == 0.0),
                        "{label}: cache row {p} of head {head} was written"
                    );
                }
            }
        }
    }
}

#[test]
fn norm_qkv_heads_joint_writes_its_cache_in_place() {
    // (dtype index, head size, query heads, key/value heads, hidden size, rows)
    for (di, d, hq, hkv, hidden, rows) in [(1, 128, 16, 8, 1024, 1), (0, 64, 4, 2, 256, 3)] {
        let (dtype, _) = DTYPES[di];
        let layout = QkvLayout {
            heads: hq,
            kv_heads: hkv,
            head_dim: d,
        };
        let (x, _) = pair([rows, hidden], 51, dtype, 2.0);
        let (g, _) = pair([hidden], 52, dtype, 1.5);
        let (w, _) = weight_pair([hidden, layout.width()], 53, dtype, true);
        let (qw, _) = pair([d], 54, dtype, 1.0);
        let (kw, _) = pair([d], 55, dtype, 1.0);
        let rope = RotaryEmbedding::<Mlx>::new(&rope_freqs(d), &device());
        for at in [0, 6] {
            let label = format!("norm_qkv_heads_joint {dtype:?} d {d} rows {rows} at {at}");
            let offset = At::Host(at);
            let cache = decode::cache_buffer::<Mlx>([rows, 2 * hkv, 7, d], &device(), dtype);
            let step = decode::NormQkv {
                norm: &g,
                eps: 1e-6,
                layer: decode::Linear::Dense(decode::Dense {
                    weight: &w,
                    bias: None,
                }),
                layout,
                qk_norms: Some((&qw, &kw)),
                qk_eps: 1e-6,
                rope: &rope,
                offset: &offset,
                cache: Some(&cache),
            };
            let heads = step.heads_joint_cached(x.clone());
            // The same heads as without a cache...
            let [q, kv] = decode::NormQkv {
                cache: None,
                ..step
            }
            .heads_joint(x.clone());
            assert_eq!(f32_rows(heads.q.clone()), f32_rows(q), "{label}: queries");
            assert_eq!(
                f32_rows(heads.kv.clone()),
                f32_rows(kv),
                "{label}: keys and values"
            );
            // ...and, where the kernel ran, in the cache at the offset.
            check_cache_row(&label, &cache, &heads, at);
        }
    }
}
