//! `burn_mlx::compile` / `compile_float`: compiled functions give the values burn-ndarray gives
//! for the same computation, retrace for new shapes, and fail clearly when misused.

use crate::common::op_stream;
use crate::common::{compare, rand_f, Tol};
use burn_mlx::{compile, compile_float, Mlx, MlxDevice, MlxError, MlxOps, MlxTensor};
use burn_ndarray::NdArray;
use burn_tensor::{activation, Tensor, TensorData};

const TOL: Tol = Tol {
    rtol: 1e-5,
    atol: 1e-6,
};

/// The chain the benchmarks compile: four elementwise ops, plus a softmax over the last axis.
fn chain<B: burn_tensor::backend::Backend>(x: Tensor<B, 2>) -> Vec<Tensor<B, 2>> {
    let y = (x.clone() * 0.5 + 1.0).exp() * x;
    vec![y.clone(), activation::softmax(y, 1)]
}

fn oracle(data: &TensorData) -> Vec<TensorData> {
    let x = Tensor::<NdArray, 2>::from_data(data.clone(), &Default::default());
    chain(x).into_iter().map(Tensor::into_data).collect()
}

#[test]
fn compiled_burn_chain_matches_ndarray_on_every_call_and_shape() {
    let device = MlxDevice::default();
    let mut f = compile_float::<2, _>(|x| chain(x[0].clone()), false);
    // Same shape twice (trace, then replay with new values), then a new shape (a new trace).
    for (i, shape) in [[8usize, 33], [8, 33], [3, 1000]].into_iter().enumerate() {
        let data = rand_f(&shape, (-2.0, 2.0), 10 + i as u64);
        let x = Tensor::<Mlx, 2>::from_data(data.clone(), &device);
        let got = f.call(vec![x]).expect("compiled call");
        assert_eq!(got.len(), 2);
        for (k, (e, g)) in oracle(&data).iter().zip(got).enumerate() {
            compare(e, &g.into_data(), TOL, e.dtype)
                .unwrap_or_else(|m| panic!("call {i}, output {k}, shape {shape:?}: {m}"));
        }
    }
}

#[test]
fn shapeless_compile_serves_other_shapes_of_the_same_rank() {
    let device = MlxDevice::default();
    let mut f = compile_float::<2, _>(
        |x| vec![(x[0].clone() * 0.5 + 1.0).exp() * x[0].clone()],
        true,
    );
    for (i, shape) in [[4usize, 4], [16, 7], [1, 129]].into_iter().enumerate() {
        let data = rand_f(&shape, (-2.0, 2.0), 40 + i as u64);
        let got = f
            .call(vec![Tensor::<Mlx, 2>::from_data(data.clone(), &device)])
            .expect("compiled call")
            .remove(0)
            .into_data();
        compare(&oracle(&data)[0], &got, TOL, got.dtype)
            .unwrap_or_else(|m| panic!("shape {shape:?}: {m}"));
    }
}

#[test]
fn compiled_mlx_function_with_two_inputs_and_outputs() {
    let device = MlxDevice::default();
    let mut f = compile(
        |x: &[MlxTensor]| {
            let s = (&x[0]).add(&x[1])?;
            let p = (&x[0]).mul(&x[1]).relu()?;
            Ok(vec![s, p])
        },
        false,
    );
    let a = MlxTensor::from_slice(&[1.0f32, -2.0, 3.0, -4.0], &[2, 2], device).unwrap();
    let b = MlxTensor::from_slice(&[0.5f32, 0.5, -1.0, -1.0], &[2, 2], device).unwrap();
    let out = f.call(&[a, b]).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![1.5, -1.5, 2.0, -5.0]);
    assert_eq!(out[1].to_vec::<f32>().unwrap(), vec![0.5, 0.0, 0.0, 4.0]);
}

#[test]
fn reading_values_inside_a_compiled_function_is_a_clear_error() {
    let device = MlxDevice::default();
    let mut f = compile(
        |x: &[MlxTensor]| {
            let y = (&x[0]).exp()?;
            MlxTensor::eval(&y)?;
            Ok(vec![y])
        },
        false,
    );
    let a = MlxTensor::ones::<f32>(&[3], device).unwrap();
    let err = f.call(std::slice::from_ref(&a)).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(&err, MlxError::Mlx { op, .. } if op == "eval")
            && msg.contains("inside a function that MLX traces")
            && msg.contains("burn_mlx::compile"),
        "{msg}"
    );
    // The failed trace leaves nothing behind: evaluation outside still works.
    assert_eq!(
        a.exp().eval().unwrap().to_vec::<f32>().unwrap()[0],
        1f32.exp()
    );
}

#[test]
fn an_error_of_the_traced_function_comes_back_intact() {
    let device = MlxDevice::default();
    let mut f = compile(|x: &[MlxTensor]| Ok(vec![(&x[0]).matmul(&x[1])?]), false);
    let a = MlxTensor::ones::<f32>(&[2, 3], device).unwrap();
    let b = MlxTensor::ones::<f32>(&[2, 3], device).unwrap();
    let err = f.call(&[a.clone(), b]).unwrap_err();
    assert!(
        matches!(&err, MlxError::Mlx { op, .. } if op == "matmul"),
        "{err}"
    );
    // The same compiled function still works for inputs that fit.
    let c = MlxTensor::ones::<f32>(&[3, 4], device).unwrap();
    let out = f.call(&[a, c]).unwrap();
    assert_eq!(out[0].dims(), vec![2, 4]);
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![3.0; 8]);
}

#[test]
fn compiled_mean_is_the_quotient_burn_gives() {
    // MLX's `mean` multiplies by 1/n, and compiled that gave 0.99999994 for the mean of 0, 1, 2
    // (Burn's suite compares this exactly); burn-mlx divides the sum by n instead.
    let device = MlxDevice::default();
    let x = || Tensor::<Mlx, 2>::from_floats([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], &device);
    let mut f = compile_float::<2, _>(|v| vec![v[0].clone().mean_dim(1)], false);
    let mut g = compile_float::<2, _>(|v| vec![v[0].clone().mean().reshape([1, 1])], false);
    let dim = f.call(vec![x()]).expect("compiled mean_dim");
    let all = g.call(vec![x()]).expect("compiled mean");
    assert_eq!(
        dim[0].clone().into_data().to_vec::<f32>().unwrap(),
        [1.0, 4.0]
    );
    assert_eq!(all[0].clone().into_data().to_vec::<f32>().unwrap(), [2.5]);
    assert_eq!(
        x().mean_dim(1).into_data().to_vec::<f32>().unwrap(),
        [1.0, 4.0]
    );
}

/// The program of [`op_stream_follows_every_steps_scalars_and_shapes`]: scalar ops whose values
/// change from call to call (`powf_scalar`'s exponent also picks a different MLX op for 1, 2
/// and 0.5), a mask fill and a reduction.
fn scalar_program<B: burn_tensor::backend::Backend>(
    x: Tensor<B, 2>,
    (a, e, c): (f64, f64, f64),
) -> Tensor<B, 2> {
    let y = (x.clone() * a + 1.0).abs().powf_scalar(e);
    let y = y.clamp(-c, c);
    let y = y.clone().mask_fill(x.clone().greater_elem(a), -a) - x / (a + 2.0);
    y.clone().sum_dim(1) * 0.5 + y
}

/// [`scalar_program`] on `MlxFused` against burn-ndarray.
fn check_scalar_program(label: &str, shape: [usize; 2], scalars: (f64, f64, f64), seed: u64) {
    let data = rand_f(&shape, (-2.0, 2.0), seed);
    let expected = scalar_program(
        Tensor::<NdArray, 2>::from_data(data.clone(), &Default::default()),
        scalars,
    )
    .into_data();
    let x = Tensor::<burn_mlx::MlxFused, 2>::from_data(data, &MlxDevice::default());
    let got = scalar_program(x, scalars).into_data();
    let tol = Tol {
        rtol: 1e-4,
        atol: 1e-5,
    };
    compare(&expected, &got, tol, expected.dtype)
        .unwrap_or_else(|m| panic!("{label}, shape {shape:?}, scalars {scalars:?}: {m}"));
}

#[test]
fn op_stream_follows_every_steps_scalars_and_shapes() {
    // `Mlx` through Burn's op stream: the first call of a block runs op by op, later ones
    // through its compiled function, whose scalars are inputs (bound) or checked (fixed).
    type Fused = burn_mlx::MlxFused;
    let device = MlxDevice::default();
    let _alone = op_stream::op_stream_alone();
    let before = burn_mlx::op_stream_stats();
    let steps = [
        ([6usize, 9], (0.5, 2.0, 3.0)),
        ([6, 9], (1.5, 3.0, 2.5)),
        ([6, 9], (-0.75, 3.0, 4.0)),
        ([6, 9], (2.0, 1.0, 1.5)),
        ([6, 9], (0.25, 0.5, 9.0)),
        ([6, 9], (1.25, 2.5, 2.0)),
        ([4, 17], (0.8, 2.5, 3.5)),
        ([4, 17], (-1.1, 2.5, 0.7)),
        ([6, 9], (0.3, 3.0, 5.0)),
        ([6, 9], (0.6, 3.0, 5.0)),
    ];
    for (i, (shape, scalars)) in steps.into_iter().enumerate() {
        check_scalar_program(&format!("step {i}"), shape, scalars, 40 + i as u64);
    }
    // Blocks whose only differences are in shapes given to ops (not in input shapes) or in slice
    // ranges, which burn-fusion's relative form leaves out: each call must get its own values.
    for (i, (n, k)) in [(2usize, 1usize), (3, 2), (2, 2), (5, 1), (3, 3), (3, 1)]
        .into_iter()
        .enumerate()
    {
        let x = Tensor::<Fused, 2>::ones([n, n], &device) * (i as f64 + 1.0) + 0.5;
        let y = x.clone().slice([0..k, 0..n]).sum_dim(0) - x.slice([n - k..n, 0..n]).mean_dim(0);
        let expected = vec![(k as f32 - 1.0) * (i as f32 + 1.5); n];
        assert_eq!(y.dims(), [1, n], "call {i}: shape");
        let got = y.into_data().to_vec::<f32>().expect("f32 values");
        assert_eq!(
            got, expected,
            "call {i}: ones([{n}, {n}]), slices of {k} rows"
        );
    }
    op_stream::assert_compiled("scalar program, shapes and slices", before);
}

#[test]
fn op_stream_compiles_a_smaller_last_batch_beside_the_full_ones() {
    // Four epochs of three full batches and a smaller last one: burn-fusion hands every batch the
    // same block (its relative form has no shapes), which keeps one compiled variant per shape
    // instead of recording again at each change of shape (and giving up after a few epochs).
    let _alone = op_stream::op_stream_alone();
    let before = burn_mlx::op_stream_stats();
    let mut calls = 0u64;
    for epoch in 0..4 {
        for (b, rows) in [8usize, 8, 8, 3].into_iter().enumerate() {
            let step = (epoch * 4 + b) as f64;
            let scalars = (0.5 + 0.1 * step, 2.0, 1.0 + 0.25 * step);
            let label = format!("epoch {epoch}, batch {b}");
            check_scalar_program(&label, [rows, 5], scalars, 90 + step as u64);
            calls += 1;
        }
    }
    let after = op_stream::assert_compiled("smaller last batch", before);
    // Each shape runs op by op once (its recording); every later call fits a compiled variant.
    let compiled = after.compiled_runs - before.compiled_runs;
    assert!(
        compiled >= calls - 2,
        "{compiled} of {calls} calls ran compiled: {before:?} -> {after:?}"
    );
}
