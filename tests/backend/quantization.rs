//! Quantization on `Mlx`, compared with burn-ndarray through Burn's public API: the bytes of
//! quantized data (values, then scales), dequantized values, layout ops on quantized tensors,
//! and the float ops Burn runs on them.

use burn_mlx::{Mlx, MlxDevice};
use burn_ndarray::NdArray;
use burn_tensor::backend::Backend;
use burn_tensor::quantization::{
    QuantLevel, QuantScheme, QuantStore, QuantValue, QuantizationParameters, QuantizedBytes,
};
use burn_tensor::{s, DType, Int, Tensor, TensorData, Tolerance};

type Nd = NdArray<f32>;

/// Symmetric per-tensor scheme with native storage and the given values.
fn scheme(value: QuantValue) -> QuantScheme {
    QuantScheme::default()
        .with_store(QuantStore::Native)
        .with_value(value)
}

/// `scheme(value)` with blocks of `block`.
fn block_scheme(value: QuantValue, block: &[u8]) -> QuantScheme {
    scheme(value).with_level(QuantLevel::block(block))
}

/// Deterministic values in `[-amp, amp)`.
fn values(n: usize, seed: u64, amp: f32) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let unit = (state >> 40) as f32 / (1u64 << 24) as f32;
            (unit * 2.0 - 1.0) * amp
        })
        .collect()
}

fn data(shape: &[usize], seed: u64) -> TensorData {
    let n = shape.iter().product();
    TensorData::new(values(n, seed, 3.0), shape.to_vec())
}

fn quantize<B: Backend, const D: usize>(data: TensorData, scheme: &QuantScheme) -> Tensor<B, D> {
    Tensor::<B, D>::from_data(data, &Default::default()).quantize_dynamic(scheme)
}

/// The values and the scales of quantized data.
fn split(data: &TensorData) -> (Vec<i8>, Vec<f32>) {
    let DType::QFloat(scheme) = data.dtype else {
        panic!("not quantized: {:?}", data.dtype)
    };
    let (values, params) = QuantizedBytes {
        bytes: data.clone().into_bytes(),
        scheme,
        num_elements: data.num_elements(),
    }
    .into_vec_i8();
    (values, params.scales)
}

/// Same dtype, shape and bytes.
#[track_caller]
fn assert_same_q(mlx: &TensorData, nd: &TensorData) {
    assert_eq!(mlx.dtype, nd.dtype, "dtype");
    assert_eq!(mlx.shape, nd.shape, "shape");
    assert_eq!(split(mlx), split(nd), "values and scales");
    assert_eq!(mlx.as_bytes(), nd.as_bytes(), "bytes");
}

#[track_caller]
fn assert_same_f32(mlx: TensorData, nd: TensorData) {
    assert_eq!(mlx.shape, nd.shape, "shape");
    assert_eq!(
        mlx.to_vec::<f32>().unwrap(),
        nd.to_vec::<f32>().unwrap(),
        "values"
    );
}

/// The i8 values and scale(s) burn-ndarray's formula gives (for schemes NdArray lacks).
fn reference_quantize(x: &[f32], block: usize, value: QuantValue) -> (Vec<i8>, Vec<f32>) {
    let (a, b) = value.range();
    let mut q = Vec::new();
    let mut scales = Vec::new();
    for chunk in x.chunks(block) {
        let alpha = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let min = chunk.iter().cloned().fold(f32::INFINITY, f32::min).abs();
        let max = chunk
            .iter()
            .cloned()
            .fold(f32::NEG_INFINITY, f32::max)
            .abs();
        assert_eq!(alpha, min.max(max));
        let scale = (if min < max { max } else { min } * 2.0) / (b - a);
        let s = if scale == 0.0 { 0.1 } else { scale };
        q.extend(chunk.iter().map(|v| (v / s).round().clamp(a, b) as i8));
        scales.push(scale);
    }
    (q, scales)
}

#[test]
fn per_tensor_q8_matches_ndarray_bytes() {
    for value in [QuantValue::Q8S, QuantValue::Q8F] {
        let sc = scheme(value);
        for (i, shape) in [vec![37], vec![4, 8], vec![2, 3, 5], vec![1]]
            .into_iter()
            .enumerate()
        {
            let d = data(&shape, i as u64);
            let (m, n) = match shape.len() {
                1 => (
                    quantize::<Mlx, 1>(d.clone(), &sc).into_data(),
                    quantize::<Nd, 1>(d, &sc).into_data(),
                ),
                2 => (
                    quantize::<Mlx, 2>(d.clone(), &sc).into_data(),
                    quantize::<Nd, 2>(d, &sc).into_data(),
                ),
                _ => (
                    quantize::<Mlx, 3>(d.clone(), &sc).into_data(),
                    quantize::<Nd, 3>(d, &sc).into_data(),
                ),
            };
            assert_same_q(&m, &n);
        }
    }
}

#[test]
fn per_block_q8_matches_ndarray_bytes() {
    let cases: [(&[usize], &[u8]); 5] = [
        (&[4, 8], &[4]),
        (&[2, 32], &[16]),
        (&[16, 16], &[2, 16]),
        (&[3, 8], &[8]),
        (&[2, 2, 12], &[6]),
    ];
    for value in [QuantValue::Q8S, QuantValue::Q8F] {
        for (i, (shape, block)) in cases.iter().enumerate() {
            let sc = block_scheme(value, block);
            let d = data(shape, 100 + i as u64);
            let (m, n) = if shape.len() == 2 {
                (
                    quantize::<Mlx, 2>(d.clone(), &sc).into_data(),
                    quantize::<Nd, 2>(d, &sc).into_data(),
                )
            } else {
                (
                    quantize::<Mlx, 3>(d.clone(), &sc).into_data(),
                    quantize::<Nd, 3>(d, &sc).into_data(),
                )
            };
            assert_same_q(&m, &n);
        }
    }
}

#[test]
fn burn_suite_dynamic_int8_example() {
    let sc = scheme(QuantValue::Q8S);
    let q = quantize::<Mlx, 1>(TensorData::from([5.0f32, 0., 4., -12.7]), &sc).into_data();
    let expected = TensorData::quantized(vec![50i8, 0, 40, -127], [4], sc, &[0.1]);
    assert_same_q(&q, &expected);
}

#[test]
fn explicit_scales_round_half_away_from_zero_and_clamp() {
    let x = [
        0.25f32, 0.75, -0.25, -1.25, 1.0, 0.0, 1000.0, -1000.0, 0.2499999, 63.75,
    ];
    for value in [QuantValue::Q8S, QuantValue::Q8F] {
        let sc = scheme(value);
        let run = |mlx: bool| {
            if mlx {
                let dev = Default::default();
                let t = Tensor::<Mlx, 1>::from_data(x, &dev);
                let scales = Tensor::<Mlx, 1>::from_data([0.5f32], &dev);
                t.quantize(&sc, QuantizationParameters { scales })
                    .into_data()
            } else {
                let dev = Default::default();
                let t = Tensor::<Nd, 1>::from_data(x, &dev);
                let scales = Tensor::<Nd, 1>::from_data([0.5f32], &dev);
                t.quantize(&sc, QuantizationParameters { scales })
                    .into_data()
            }
        };
        let (m, n) = (run(true), run(false));
        assert_same_q(&m, &n);
        let low = if value == QuantValue::Q8F { -128 } else { -127 };
        assert_eq!(split(&m).0, vec![1, 2, -1, -3, 2, 0, 127, low, 0, 127]);
    }
}

#[test]
fn explicit_block_scales_match_ndarray() {
    let sc = block_scheme(QuantValue::Q8S, &[4]);
    let x = values(16, 7, 2.0);
    let scales = [0.01f32, 0.0, 0.02, 0.5];
    let dev = Default::default();
    let m = Tensor::<Mlx, 2>::from_data(TensorData::new(x.clone(), [4, 4]), &dev).quantize(
        &sc,
        QuantizationParameters {
            scales: Tensor::from_data(scales, &dev),
        },
    );
    let nd_dev = Default::default();
    let n = Tensor::<Nd, 2>::from_data(TensorData::new(x, [4, 4]), &nd_dev).quantize(
        &sc,
        QuantizationParameters {
            scales: Tensor::from_data(scales, &nd_dev),
        },
    );
    assert_same_q(&m.to_data(), &n.to_data());
    assert_same_f32(m.dequantize().into_data(), n.dequantize().into_data());
}

#[test]
fn zeros_quantize_to_zero_with_zero_scale() {
    let sc = scheme(QuantValue::Q8S);
    let d = TensorData::new(vec![0f32; 6], [2, 3]);
    let m = quantize::<Mlx, 2>(d.clone(), &sc);
    let n = quantize::<Nd, 2>(d, &sc);
    assert_same_q(&m.to_data(), &n.to_data());
    assert_eq!(split(&m.to_data()).1, vec![0.0]);
    assert_same_f32(m.dequantize().into_data(), n.dequantize().into_data());
}

#[test]
fn dequantize_matches_ndarray_exactly() {
    let schemes = [
        scheme(QuantValue::Q8S),
        scheme(QuantValue::Q8F),
        block_scheme(QuantValue::Q8S, &[8]),
        block_scheme(QuantValue::Q8F, &[4]),
    ];
    for (i, sc) in schemes.iter().enumerate() {
        let d = data(&[4, 8], 200 + i as u64);
        let m = quantize::<Mlx, 2>(d.clone(), sc).dequantize();
        let n = quantize::<Nd, 2>(d.clone(), sc).dequantize();
        assert_eq!(m.dtype(), DType::F32);
        let m = m.into_data();
        assert_same_f32(m.clone(), n.into_data());
        // Within half a quantization step of the input (scale <= 3 / 127).
        m.assert_approx_eq::<f32>(&d, Tolerance::absolute(3.0 / 127.0 * 0.5 + 1e-6));
    }
}

#[test]
fn from_data_round_trips() {
    for sc in [
        scheme(QuantValue::Q8S),
        scheme(QuantValue::Q8F),
        block_scheme(QuantValue::Q8S, &[8]),
    ] {
        let nd = quantize::<Nd, 2>(data(&[4, 8], 300), &sc).into_data();
        let m = Tensor::<Mlx, 2>::from_data(nd.clone(), &Default::default());
        assert_same_q(&m.to_data(), &nd);
        let back = Tensor::<Nd, 2>::from_data(nd.clone(), &Default::default());
        assert_same_f32(m.dequantize().into_data(), back.dequantize().into_data());
    }
}

#[test]
fn burn_suite_data_examples() {
    let per_tensor = TensorData::quantized(
        vec![-127i8, -71, 0, 35],
        [4],
        scheme(QuantValue::Q8S),
        &[0.014_173_228],
    );
    let t = Tensor::<Mlx, 1>::from_data(per_tensor.clone(), &Default::default());
    assert_same_q(&t.into_data(), &per_tensor);

    let per_block = TensorData::quantized(
        vec![
            -127i8, -71, 0, 35, -127, -71, 0, 35, -32, -63, -95, -127, -32, -63, -95, -127,
        ],
        [16],
        block_scheme(QuantValue::Q8S, &[8]),
        &[0.014_173_228, 0.000_314_96],
    );
    let t = Tensor::<Mlx, 1>::from_data(per_block.clone(), &Default::default());
    assert_same_q(&t.into_data(), &per_block);
}

#[test]
fn packed_u32_q8_data_round_trips() {
    let packed = scheme(QuantValue::Q8S).with_store(QuantStore::PackedU32(0));
    let d = TensorData::quantized(vec![-127i8, -71, 0, 35, 1, 2, 3, 4], [2, 4], packed, &[0.5]);
    let m = Tensor::<Mlx, 2>::from_data(d.clone(), &Default::default());
    // The same data back (burn-ndarray gives the same bytes with a `Native` store).
    assert_same_q(&m.to_data(), &d);
    let n = Tensor::<Nd, 2>::from_data(d, &Default::default()).into_data();
    assert_eq!(m.to_data().as_bytes(), n.as_bytes());
    assert_eq!(split(&m.to_data()), split(&n));
    let nd_deq = Tensor::<Nd, 2>::from_data(n, &Default::default()).dequantize();
    assert_same_f32(m.dequantize().into_data(), nd_deq.into_data());
}

#[test]
fn packed_u32_q8_quantize_keeps_scheme_and_values() {
    let packed = scheme(QuantValue::Q8S).with_store(QuantStore::PackedU32(0));
    let d = data(&[3, 8], 400);
    let m = quantize::<Mlx, 2>(d.clone(), &packed).into_data();
    let n = quantize::<Nd, 2>(d, &scheme(QuantValue::Q8S)).into_data();
    assert_eq!(m.dtype, DType::QFloat(packed));
    assert_eq!(split(&m), split(&n));
}

#[test]
fn sub_byte_native_values_follow_the_formula() {
    for value in [
        QuantValue::Q4S,
        QuantValue::Q4F,
        QuantValue::Q2S,
        QuantValue::Q2F,
    ] {
        for (level, block) in [(QuantLevel::Tensor, 32), (QuantLevel::block([8]), 8)] {
            let sc = scheme(value).with_level(level);
            let d = data(&[4, 8], 500);
            let x = d.to_vec::<f32>().unwrap();
            let q = quantize::<Mlx, 2>(d, &sc);
            let out = q.to_data();
            assert_eq!(out.dtype, DType::QFloat(sc));
            let expected = reference_quantize(&x, block, value);
            assert_eq!(split(&out), expected, "{value:?} {level:?}");
            // Dequantized: scale * q.
            let deq = q.dequantize().into_data().to_vec::<f32>().unwrap();
            let want: Vec<f32> = expected
                .0
                .iter()
                .enumerate()
                .map(|(i, &v)| expected.1[i / block] * v as f32)
                .collect();
            assert_eq!(deq, want);
        }
    }
}

#[test]
fn sub_byte_packed_u32_round_trips() {
    for value in [QuantValue::Q4S, QuantValue::Q2F] {
        for shape in [[4usize, 8], [3, 5]] {
            let native = scheme(value);
            let packed = native.with_store(QuantStore::PackedU32(0));
            let d = data(&shape, 600);
            let n = quantize::<Mlx, 2>(d.clone(), &native).into_data();
            let p = quantize::<Mlx, 2>(d, &packed).into_data();
            assert_eq!(p.dtype, DType::QFloat(packed));
            let words = (shape[0] * shape[1]).div_ceil(32 / value.size_bits());
            assert_eq!(p.as_bytes().len(), 4 * (words + 1));
            assert_eq!(split(&p), split(&n), "{value:?} {shape:?}");
            // Packed data loads back and reads out unchanged.
            let back = Tensor::<Mlx, 2>::from_data(p.clone(), &Default::default()).into_data();
            assert_same_q(&back, &p);
        }
    }
}

/// Layout ops on a quantized `[2, 3, 4]` tensor; each result read back as quantized data.
fn layout_cases<B: Backend>(q: Tensor<B, 3>) -> Vec<(&'static str, Tensor<B, 3>)> {
    let dev = q.device();
    let idx = Tensor::<B, 1, Int>::from_data([2, 0, 2], &dev);
    let gather_idx = Tensor::<B, 3, Int>::from_data(
        TensorData::new(
            (0..24).map(|i| (i * 7 % 4) as i64).collect::<Vec<_>>(),
            [2, 3, 4],
        ),
        &dev,
    );
    vec![
        ("reshape", q.clone().reshape([3, 2, 4])),
        ("permute", q.clone().permute([2, 0, 1])),
        ("swap_dims", q.clone().swap_dims(0, 2)),
        ("transpose", q.clone().transpose()),
        ("flip", q.clone().flip([0, 2])),
        ("slice", q.clone().slice([0..2, 1..3, 0..4])),
        ("slice_step", q.clone().slice(s![.., ..;2, 1..;-2])),
        ("select", q.clone().select(2, idx)),
        (
            "expand",
            q.clone().slice([0..1, 0..3, 0..4]).expand([3, 3, 4]),
        ),
        ("gather", q.clone().gather(2, gather_idx)),
        ("max_dim", q.clone().max_dim(1)),
        ("chain", q.permute([1, 0, 2]).flip([1]).reshape([6, 4, 1])),
    ]
}

#[test]
fn per_tensor_layout_ops_match_ndarray() {
    for value in [QuantValue::Q8S, QuantValue::Q8F] {
        let sc = scheme(value);
        let d = data(&[2, 3, 4], 700);
        let m = layout_cases(quantize::<Mlx, 3>(d.clone(), &sc));
        let n = layout_cases(quantize::<Nd, 3>(d, &sc));
        for ((name, m), (_, n)) in m.into_iter().zip(n) {
            let (md, nd) = (m.to_data(), n.to_data());
            assert_eq!(md.shape, nd.shape, "{name}");
            if name == "expand" {
                // Burn's `Tensor::expand` dequantizes first, on every backend.
                assert_eq!((md.dtype, nd.dtype), (DType::F32, DType::F32));
                assert_same_f32(md, nd);
                continue;
            }
            assert_same_q(&md, &nd);
            assert_same_f32(m.dequantize().into_data(), n.dequantize().into_data());
        }
    }
}

/// Float versions of `layout_cases` (applied to dequantized values).
fn float_layout_cases<B: Backend>(t: Tensor<B, 3>) -> Vec<Tensor<B, 3>> {
    let dev = t.device();
    let idx = Tensor::<B, 1, Int>::from_data([2, 0, 2], &dev);
    let gather_idx = Tensor::<B, 3, Int>::from_data(
        TensorData::new(
            (0..24).map(|i| (i * 7 % 4) as i64).collect::<Vec<_>>(),
            [2, 3, 4],
        ),
        &dev,
    );
    vec![
        t.clone().reshape([3, 2, 4]),
        t.clone().permute([2, 0, 1]),
        t.clone().swap_dims(0, 2),
        t.clone().transpose(),
        t.clone().flip([0, 2]),
        t.clone().slice([0..2, 1..3, 0..4]),
        t.clone().slice(s![.., ..;2, 1..;-2]),
        t.clone().select(2, idx),
        t.clone().slice([0..1, 0..3, 0..4]).expand([3, 3, 4]),
        t.clone().gather(2, gather_idx),
        t.clone().max_dim(1),
        t.permute([1, 0, 2]).flip([1]).reshape([6, 4, 1]),
    ]
}

#[test]
fn per_block_layout_ops_keep_each_value_and_its_scale() {
    // Blocks of 4 along the last axis, each with its own scale: permuting moves values across
    // blocks. (burn-ndarray keeps the old scale list in the new order here, so it is not the
    // reference: the dequantized float op is.)
    let sc = block_scheme(QuantValue::Q8S, &[4]);
    let x: Vec<f32> = (0..24)
        .map(|i| (i as f32 - 11.0) * (1.0 + (i / 4) as f32))
        .collect();
    let d = TensorData::new(x, [2, 3, 4]);
    let q = quantize::<Mlx, 3>(d.clone(), &sc);
    let reference = float_layout_cases(q.clone().dequantize());
    let names = layout_cases(q.clone());
    for ((name, out), want) in names.into_iter().zip(reference) {
        let want = want.into_data();
        assert_same_f32(out.clone().dequantize().into_data(), want.clone());
        if name == "expand" {
            // Burn's `Tensor::expand` dequantizes first.
            continue;
        }
        if !out.shape().num_elements().is_multiple_of(4) {
            // Burn's layout has no room for a partial block.
            let err = out.try_into_data().expect_err(name);
            assert!(err.to_string().contains("blocks of 4"), "{name}: {err}");
            continue;
        }
        // Read back in Burn's layout and loaded elsewhere, within the scheme's error.
        let data = out.into_data();
        let (values, scales) = split(&data);
        assert_eq!(scales.len(), data.num_elements() / 4, "{name}");
        assert_eq!(values.len(), data.num_elements(), "{name}");
        let loaded = Tensor::<Nd, 3>::from_data(data, &Default::default()).dequantize();
        let tol = scales.iter().cloned().fold(0f32, f32::max) * 0.5 + 1e-5;
        loaded
            .into_data()
            .assert_approx_eq::<f32>(&want, Tolerance::absolute(tol));
    }
}

#[test]
fn per_block_reshape_matches_ndarray_bytes() {
    let sc = block_scheme(QuantValue::Q8F, &[8]);
    let d = data(&[4, 8], 800);
    let m = quantize::<Mlx, 2>(d.clone(), &sc).reshape([2, 16]);
    let n = quantize::<Nd, 2>(d, &sc).reshape([2, 16]);
    assert_same_q(&m.to_data(), &n.to_data());
    // Slicing whole blocks keeps their scales exactly.
    let m = m.slice([1..2, 0..16]).into_data();
    let n = quantize::<Nd, 2>(data(&[4, 8], 800), &sc)
        .dequantize()
        .slice([2..4, 0..8])
        .reshape([1, 16]);
    let (_, scales) = split(&m);
    assert_eq!(scales.len(), 2);
    let loaded = Tensor::<Nd, 2>::from_data(m, &Default::default()).dequantize();
    assert_same_f32(loaded.into_data(), n.into_data());
}

/// Float ops Burn runs on quantized tensors (dequantize, float op, maybe requantize).
fn float_op_cases<B: Backend>(a: Tensor<B, 2>, b: Tensor<B, 2>) -> Vec<(&'static str, TensorData)> {
    vec![
        ("add", (a.clone() + b.clone()).dequantize().into_data()),
        ("mul_scalar", (a.clone() * 3.0).dequantize().into_data()),
        (
            "matmul",
            a.clone()
                .matmul(b.clone().transpose())
                .dequantize()
                .into_data(),
        ),
        ("sum_dim", a.clone().sum_dim(1).dequantize().into_data()),
        ("mean", a.clone().mean().dequantize().into_data()),
        ("exp", a.clone().exp().dequantize().into_data()),
        ("abs", a.clone().abs().dequantize().into_data()),
        ("argmax", a.clone().argmax(1).float().into_data()),
        (
            "cat",
            Tensor::cat(vec![a.clone(), b.clone()], 0)
                .dequantize()
                .into_data(),
        ),
        ("clamp", a.clamp(-1.0, 1.0).dequantize().into_data()),
    ]
}

#[test]
fn float_ops_on_quantized_tensors_match_ndarray() {
    for sc in [scheme(QuantValue::Q8S), block_scheme(QuantValue::Q8S, &[4])] {
        let (da, db) = (data(&[3, 8], 900), data(&[3, 8], 901));
        let m = float_op_cases(
            quantize::<Mlx, 2>(da.clone(), &sc),
            quantize::<Mlx, 2>(db.clone(), &sc),
        );
        let n = float_op_cases(quantize::<Nd, 2>(da, &sc), quantize::<Nd, 2>(db, &sc));
        for ((name, m), (_, n)) in m.into_iter().zip(n) {
            assert_eq!(m.shape, n.shape, "{name}");
            if matches!(name, "matmul" | "argmax") && sc.level != QuantLevel::Tensor {
                // burn-ndarray transposes block-quantized values without moving their scales,
                // and takes argmax over the raw values of blocks with different scales.
                // (Both are checked against dequantized references in other tests.)
                continue;
            }
            m.assert_approx_eq::<f32>(&n, gemm_tol(name == "matmul"));
        }
    }
}

#[test]
fn block_quantized_transpose_matmul_uses_each_values_scale() {
    let sc = block_scheme(QuantValue::Q8S, &[4]);
    let (da, db) = (data(&[3, 8], 910), data(&[5, 8], 911));
    let a = quantize::<Mlx, 2>(da, &sc);
    let b = quantize::<Mlx, 2>(db, &sc);
    let got = a.clone().matmul(b.clone().transpose()).into_data();
    let nd_dev = Default::default();
    let fa = Tensor::<Nd, 2>::from_data(a.dequantize().into_data(), &nd_dev);
    let fb = Tensor::<Nd, 2>::from_data(b.dequantize().into_data(), &nd_dev);
    let want = fa.matmul(fb.transpose()).into_data();
    got.assert_approx_eq::<f32>(&want, gemm_tol(true));
}

/// 1e-5, or TF32-level for a GEMM on CUDA, where MLX rounds f32 GEMM inputs to TF32.
fn gemm_tol(gemm: bool) -> Tolerance<f32> {
    let cuda = MlxDevice::default() == MlxDevice::Gpu && cfg!(not(target_os = "macos"));
    if gemm && cuda {
        Tolerance::rel_abs(5e-3, 5e-3)
    } else {
        Tolerance::rel_abs(1e-5, 1e-5)
    }
}

#[test]
fn block_quantized_argmax_and_max_dim_use_dequantized_values() {
    let sc = block_scheme(QuantValue::Q8S, &[4]);
    // Blocks with very different scales: raw quantized values would point elsewhere.
    let x = [0.1f32, 0.2, 0.3, 0.05, 10.0, 0.0, 0.0, 5.0];
    let q = quantize::<Mlx, 2>(TensorData::new(x.to_vec(), [1, 8]), &sc);
    let arg = q.clone().argmax(1).into_data();
    assert_eq!(arg.to_vec::<i64>().unwrap(), vec![4]);
    let max = q.max_dim(1).dequantize().into_data();
    assert_eq!(max.to_vec::<f32>().unwrap(), vec![10.0]);
}

#[test]
fn quantize_transposed_input_round_trips() {
    // As Burn's suite does: quantize a transposed (non-contiguous) tensor.
    for sc in [
        scheme(QuantValue::Q8S),
        block_scheme(QuantValue::Q8S, &[32]),
    ] {
        let dev = Default::default();
        let t = Tensor::<Mlx, 1, Int>::arange(0..2048, &dev)
            .float()
            .div_scalar(2048.)
            .reshape([32, 64]);
        let out = t
            .clone()
            .transpose()
            .quantize_dynamic(&sc)
            .dequantize()
            .transpose();
        t.into_data()
            .assert_approx_eq::<f32>(&out.into_data(), Tolerance::rel_abs(1e-2, 1e-1));
    }
}

#[test]
fn quantized_tensor_reports_its_dtype_and_device() {
    let sc = block_scheme(QuantValue::Q8S, &[4]);
    let q = quantize::<Mlx, 2>(data(&[2, 4], 1000), &sc);
    assert_eq!(q.dtype(), DType::QFloat(sc));
    assert_eq!(q.device(), burn_mlx::MlxDevice::default());
    let moved = q.clone().to_device(&burn_mlx::MlxDevice::Cpu);
    assert_same_q(&moved.into_data(), &q.into_data());
}

#[test]
#[should_panic(expected = "E4M3")]
fn float8_values_panic_with_the_scheme() {
    let _ = quantize::<Mlx, 1>(data(&[8], 1), &scheme(QuantValue::E4M3)).into_data();
}

#[test]
#[should_panic(expected = "PackedNative")]
fn packed_native_store_panics_with_the_scheme() {
    let sc = scheme(QuantValue::Q8S).with_store(QuantStore::PackedNative(0));
    let _ = quantize::<Mlx, 1>(data(&[8], 1), &sc).into_data();
}

#[test]
#[should_panic(expected = "blocks of 8")]
fn block_size_must_divide_the_tensor() {
    let sc = block_scheme(QuantValue::Q8S, &[8]);
    let d = data(&[12], 1);
    let dev = Default::default();
    let t = Tensor::<Mlx, 1>::from_data(d, &dev);
    let _ = t
        .quantize(
            &sc,
            QuantizationParameters {
                scales: Tensor::from_data([0.1f32, 0.1], &dev),
            },
        )
        .into_data();
}
