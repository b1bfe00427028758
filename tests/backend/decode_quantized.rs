//! `burn_mlx::decode`'s fused ops with quantized weights (`decode::Quantized`, MLX's affine 4-
//! and 8-bit groups) against references composed on burn-ndarray in f32 from the dequantized
//! weights: bf16, f16 and f32 rows; 4 and 8 bits; groups of 32, 64 and 128.
//!
//! On the GPU the CUDA kernels read the packed weights in place; on MLX's CPU the composed path
//! runs MLX's quantized matmul.

use super::decode::{
    block_ref, check, device, f32_rows, heads_ref, pair, projection_tol, rms_norm_ref, rope_freqs,
    rope_ref, DTYPES, R,
};
use burn_mlx::decode::{self, At, Gate, JointHeads, QkvLayout};
use burn_mlx::fast::RotaryEmbedding;
use burn_mlx::quant::{QuantBits, QuantizedMatrix};
use burn_mlx::Mlx;
use burn_ndarray::NdArrayDevice;
use burn_tensor::activation::sigmoid;
use burn_tensor::{DType, Int, Tensor, TensorData};

/// (dtype index in [`DTYPES`], bits, group size): each dtype, both widths and every group size
/// appear; not every combination, as each is one more set of kernels for NVRTC on CUDA.
const QUANT_CASES: [(usize, QuantBits, usize); 4] = [
    (1, QuantBits::Q4, 64),
    (1, QuantBits::Q8, 64),
    (2, QuantBits::Q4, 32),
    (0, QuantBits::Q8, 128),
];

/// A layer's weight `[input, out]`, stored `[out, input]` as the LLM runner holds it, quantized to
/// `bits` in groups of `group` along `input`; and its dequantized values in f32 on burn-ndarray,
/// `[input, out]`.
fn quantized_pair(
    [input, out]: [usize; 2],
    seed: u64,
    dtype: DType,
    (bits, group): (QuantBits, usize),
) -> (QuantizedMatrix<Mlx>, Tensor<R, 2>) {
    let (w, _) = pair([out, input], seed, dtype, 1.7 / (input as f32).sqrt());
    let q = QuantizedMatrix::quantize(w, bits, group).expect("quantize");
    let values = q
        .dequantize()
        .expect("dequantize")
        .cast(DType::F32)
        .into_data();
    let w_r = Tensor::<R, 2>::from_data(values, &NdArrayDevice::Cpu).transpose();
    (q, w_r)
}

fn layer(matrix: &QuantizedMatrix<Mlx>) -> decode::Quantized<'_, Mlx> {
    decode::Quantized { matrix, bias: None }
}

#[test]
fn quantized_projections_match_their_dequantized_weights() {
    for (di, bits, group) in QUANT_CASES {
        let (dtype, tol) = DTYPES[di];
        let quant = (bits, group);
        let label = format!("{dtype:?} {bits} groups of {group}");
        for rows in [1, 3] {
            // linear_add, with a bias for three rows.
            let bias = rows == 3;
            let (x, x_r) = pair([rows, 1024], 51, dtype, 2.0);
            let (w, w_r) = quantized_pair([1024, 520], 52, dtype, quant);
            let (b, b_r) = pair([520], 53, dtype, 0.5);
            let (res, res_r) = pair([rows, 520], 54, dtype, 2.0);
            let q = decode::Quantized {
                matrix: &w,
                bias: bias.then_some(&b),
            };
            let mut want = res_r + x_r.matmul(w_r);
            if bias {
                want = want + b_r.unsqueeze::<2>();
            }
            check(
                &format!("linear_add {label} rows {rows}"),
                f32_rows(decode::linear_add(x, q, res)),
                want.into_data().to_vec().unwrap(),
                2.0 * projection_tol(dtype, tol, rows, 1024),
            );

            // norm_gated over 2,048 inputs.
            let (x, x_r) = pair([rows, 2048], 55, dtype, 3.0);
            let (g, g_r) = pair([2048], 56, dtype, 1.5);
            let (w, w_r) = quantized_pair([2048, 512], 57, dtype, quant);
            let y = decode::norm_gated(x, &g, 1e-6, layer(&w), Gate::Silu);
            let gu = rms_norm_ref(x_r, g_r, 1e-6).matmul(w_r);
            let (gv, u) = (gu.clone().narrow(1, 0, 256), gu.narrow(1, 256, 256));
            check(
                &format!("norm_gated {label} rows {rows}"),
                f32_rows(y),
                (gv.clone() * sigmoid(gv) * u).into_data().to_vec().unwrap(),
                3.0 * projection_tol(dtype, tol, rows, 2048),
            );

            // norm_qkv_heads_joint with a bias and query/key norms.
            let (d, hq, hkv, offset) = (128, 4, 2, 300);
            let layout = QkvLayout {
                heads: hq,
                kv_heads: hkv,
                head_dim: d,
            };
            let (x, x_r) = pair([rows, 1024], 58, dtype, 2.0);
            let (g, g_r) = pair([1024], 59, dtype, 1.5);
            let (w, w_r) = quantized_pair([1024, layout.width()], 60, dtype, quant);
            let (b, b_r) = pair([layout.width()], 61, dtype, 0.5);
            let (qw, qw_r) = pair([d], 62, dtype, 1.0);
            let (kw, kw_r) = pair([d], 63, dtype, 1.0);
            let rope = rope(d);
            let q = decode::Quantized {
                matrix: &w,
                bias: Some(&b),
            };
            let [qh, kv] = decode::norm_qkv_heads_joint(
                x,
                &g,
                1e-6,
                q,
                layout,
                Some((&qw, &kw)),
                1e-6,
                &rope,
                &At::Host(offset),
            );
            let qkv_r = rms_norm_ref(x_r, g_r, 1e-6).matmul(w_r) + b_r.unsqueeze::<2>();
            let [q_want, kv_want] = heads_want(qkv_r, rows, layout, (&qw_r, &kw_r), offset);
            let heads_tol = 3.0 * projection_tol(dtype, tol, rows, 1024).max(4e-4);
            let label = format!("norm_qkv_heads_joint {label} rows {rows}");
            check(&label, f32_rows(qh), q_want, heads_tol);
            check(&label, f32_rows(kv), kv_want, heads_tol);
        }
    }
}

#[test]
fn quantized_attention_mlp_qkv_matches_its_dequantized_weights() {
    let (d, hq, hkv, hidden, width) = (128, 8, 2, 1024, 1024);
    let layout = QkvLayout {
        heads: hq,
        kv_heads: hkv,
        head_dim: d,
    };
    for (di, bits, group) in QUANT_CASES {
        let (dtype, tol) = DTYPES[di];
        let quant = (bits, group);
        let (q, q_r) = pair([1, hq, 1, d], 71, dtype, 1.0);
        let (kv, kv_r) = pair([1, 2 * hkv, 2048, d], 72, dtype, 1.0);
        let (x, x_r) = pair([1, hidden], 73, dtype, 2.0);
        let (g, g_r) = pair([hidden], 74, dtype, 1.5);
        let (wo, wo_r) = quantized_pair([hq * d, hidden], 75, dtype, quant);
        let (wgu, wgu_r) = quantized_pair([hidden, 2 * width], 76, dtype, quant);
        let (wd, wd_r) = quantized_pair([width, hidden], 77, dtype, quant);
        let (g2, g2_r) = pair([hidden], 78, dtype, 1.5);
        let (wqkv, wqkv_r) = quantized_pair([hidden, layout.width()], 79, dtype, quant);
        let (qw, qw_r) = pair([d], 80, dtype, 1.0);
        let (kw, kw_r) = pair([d], 81, dtype, 1.0);
        let rope = rope(d);
        let scale = 1.0 / (d as f64).sqrt();
        for len in [1, 2047] {
            let label = format!("attention_mlp_qkv {dtype:?} {bits} groups of {group} len {len}");
            let at = At::Device(Tensor::<Mlx, 1, Int>::from_ints([len as i32], &device()));
            let offset = At::Host(len - 1);
            let next = decode::NormQkv {
                norm: &g2,
                eps: 1e-6,
                layer: layer(&wqkv).into(),
                layout,
                qk_norms: Some((&qw, &kw)),
                qk_eps: 1e-6,
                rope: &rope,
                offset: &offset,
                cache: None,
            };
            let (y, Some(JointHeads { q: q2, kv: kv2, .. })) = decode::attention_mlp_qkv(
                q.clone(),
                kv.clone(),
                &at,
                scale,
                x.clone(),
                layer(&wo),
                &g,
                1e-6,
                layer(&wgu),
                layer(&wd),
                Gate::Silu,
                Some(&next),
            ) else {
                panic!("{label}: no heads for the next block");
            };
            // The block's output: four ops rounded to the dtype (see the dense test).
            let y_rows = f32_rows(y);
            let want = block_ref(
                [&q_r, &kv_r],
                &x_r,
                [&wo_r, &wgu_r, &wd_r],
                &g_r,
                len,
                scale,
            );
            check(
                &label,
                y_rows.clone(),
                want.into_data().to_vec().unwrap(),
                4.0 * projection_tol(dtype, tol, 1, hidden),
            );
            // The next block's heads from the same output.
            let y_r = Tensor::<R, 2>::from_data(
                TensorData::new(y_rows, [1, hidden]),
                &NdArrayDevice::Cpu,
            );
            let qkv_r = rms_norm_ref(y_r, g2_r.clone(), 1e-6).matmul(wqkv_r.clone());
            let [q_want, kv_want] = heads_want(qkv_r, 1, layout, (&qw_r, &kw_r), len - 1);
            let heads_tol = 3.0 * projection_tol(dtype, tol, 1, hidden).max(4e-4);
            check(
                &format!("{label}: queries"),
                f32_rows(q2),
                q_want,
                heads_tol,
            );
            check(
                &format!("{label}: keys and values"),
                f32_rows(kv2),
                kv_want,
                heads_tol,
            );
        }
    }
}

/// The rotary embedding of heads of `d` (base 10,000).
fn rope(d: usize) -> RotaryEmbedding<Mlx> {
    RotaryEmbedding::new(&rope_freqs(d), &device())
}

/// The reference queries and joint keys/values of a QKV output `[rows, width]` (one position of
/// each of `rows` sequences at `offset`), normalized with `norms` and rotated, as rows of f32.
fn heads_want(
    qkv: Tensor<R, 2>,
    rows: usize,
    layout: QkvLayout,
    (qw, kw): (&Tensor<R, 1>, &Tensor<R, 1>),
    offset: usize,
) -> [Vec<f32>; 2] {
    let QkvLayout {
        heads: hq,
        kv_heads: hkv,
        head_dim: d,
    } = layout;
    let freqs = rope_freqs(d);
    let heads = |t: Tensor<R, 2>, n: usize| t.reshape([rows, n, 1, d]);
    let [q, k, v] = heads_ref(qkv, [hq, hkv, d], heads, Some((qw, kw)));
    let rotate = |t: Tensor<R, 4>| {
        let [_, n, _, _] = t.dims();
        rope_ref(t.reshape([1, rows * n, 1, d]), &freqs, offset).reshape([rows, n, 1, d])
    };
    let kv = Tensor::cat(vec![rotate(k), v], 1);
    let rows_of = |t: Tensor<R, 4>| t.into_data().to_vec::<f32>().unwrap();
    [rows_of(rotate(q)), rows_of(kv)]
}
