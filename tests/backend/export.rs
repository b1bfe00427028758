//! MLX function files (`burn_mlx::export`): a Burn model written with [`export`] and read back
//! with [`MlxFunction`] gives the model's own outputs; several signatures share a file; captured
//! views (transposes, broadcasts) come back with their values; int, bool and tuple arguments
//! round-trip; and every bad input fails with an error naming the file and the problem.

use burn::module::Module;
use burn::tensor::{Bool, Int, Tensor, TensorData, Tolerance};
use burn_mlx::export::{export, export_function, ExportOptions, MlxFunction};
use burn_mlx::{Mlx, MlxDevice, MlxError, MlxOps, MlxTensor};
use burn_nn::conv::{Conv2d, Conv2dConfig};
use burn_nn::{Gelu, LayerNorm, LayerNormConfig, Linear, LinearConfig, PaddingConfig2d, Relu};
use std::path::PathBuf;

const DEVICE: MlxDevice = MlxDevice::Cpu;

/// A fresh path for this test's file, in the temporary directory.
fn file(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "burn-mlx-export-{}-{name}.mlxfn",
        std::process::id()
    ))
}

/// A small CNN with the layers of the `train` example and a Transformer block's
/// normalisation and activation: conv, ReLU, flatten, linear, layer norm, GELU, softmax.
#[derive(Module, Debug)]
struct Net<B: burn::tensor::backend::Backend> {
    conv: Conv2d<B>,
    relu: Relu,
    fc: Linear<B>,
    norm: LayerNorm<B>,
    gelu: Gelu,
    out: Linear<B>,
}

impl<B: burn::tensor::backend::Backend> Net<B> {
    fn new(device: &B::Device) -> Self {
        Net {
            conv: Conv2dConfig::new([1, 4], [3, 3])
                .with_padding(PaddingConfig2d::Same)
                .init(device),
            relu: Relu::new(),
            fc: LinearConfig::new(4 * 6 * 6, 16).init(device),
            norm: LayerNormConfig::new(16).init(device),
            gelu: Gelu::new(),
            out: LinearConfig::new(16, 5).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = self.relu.forward(self.conv.forward(x));
        let x = self.fc.forward(x.flatten(1, 3));
        let x = self.gelu.forward(self.norm.forward(x));
        burn::tensor::activation::softmax(self.out.forward(x), 1)
    }
}

fn images(batch: usize, seed: u64) -> Tensor<Mlx, 4> {
    Tensor::from_data(
        crate::common::rand_f(&[batch, 1, 6, 6], (-1.0, 1.0), seed),
        &DEVICE,
    )
}

#[test]
fn exported_model_gives_the_models_outputs_at_each_exported_batch_size() {
    let model = Net::<Mlx>::new(&DEVICE);
    let path = file("net");
    let (x1, x3) = (images(1, 1), images(3, 2));
    export(
        &path,
        [x1.clone(), x3.clone()],
        &ExportOptions::default(),
        |x: Tensor<Mlx, 4>| model.forward(x),
    )
    .unwrap();
    let f = MlxFunction::load(&path).unwrap();
    for x in [x1, x3, images(3, 3)] {
        let got: Tensor<Mlx, 2> = f.call(x.clone()).unwrap();
        // The model's own forward uses burn-mlx's CPU exp and erf kernels; the file holds
        // MLX's, which differ by an ulp or two.
        got.into_data()
            .assert_approx_eq::<f32>(&model.forward(x).into_data(), Tolerance::absolute(1e-5));
    }
    // Batch 2 was not exported: the error lists the file's signatures.
    let err = f
        .call::<_, Tensor<Mlx, 2>>(images(2, 4))
        .unwrap_err()
        .to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(
        err.contains("(1,1,6,6)") && err.contains("(3,1,6,6)"),
        "{err}"
    );
    let _ = std::fs::remove_file(path);
}

#[test]
fn captured_views_are_written_with_their_values() {
    // A transposed view, a broadcast and a column-major result of an elementwise op: all
    // evaluated, none a dense row-major buffer.
    let w = Tensor::<Mlx, 2>::from_data(crate::common::rand_f(&[3, 4], (-1.0, 1.0), 7), &DEVICE);
    let wt = w.clone().transpose();
    let bias = Tensor::<Mlx, 1>::from_data([0.5f32, -1.0, 2.0], &DEVICE)
        .reshape([1, 3])
        .expand([2, 3]);
    let scaled = wt.clone() * 2.0;
    // Each is evaluated, and its strides are not row-major: the case the export must repair.
    for (name, t, row_major) in [
        ("transpose", wt.clone(), [3, 1]),
        ("column-major product", scaled.clone(), [3, 1]),
        ("broadcast", bias.clone(), [3, 1]),
    ] {
        let t = t.into_primitive().tensor();
        MlxTensor::eval(&t).unwrap();
        assert_ne!(t.array().strides(), row_major, "{name} is row-major");
    }
    let path = file("views");
    let x = Tensor::<Mlx, 2>::from_data(crate::common::rand_f(&[2, 4], (-1.0, 1.0), 8), &DEVICE);
    let f =
        |x: Tensor<Mlx, 2>| x.clone().matmul(wt.clone()) + bias.clone() + x.matmul(scaled.clone());
    export(&path, [x.clone()], &ExportOptions::default(), f).unwrap();
    let got: Tensor<Mlx, 2> = MlxFunction::load(&path).unwrap().call(x.clone()).unwrap();
    got.into_data()
        .assert_approx_eq::<f32>(&f(x).into_data(), Tolerance::absolute(1e-6));
    let _ = std::fs::remove_file(path);
}

#[test]
fn int_and_bool_arguments_and_tuples_round_trip() {
    let path = file("kinds");
    let ids = Tensor::<Mlx, 2, Int>::from_data([[1i64, 2, 3], [4, 5, 6]], &DEVICE);
    let mask =
        Tensor::<Mlx, 2, Bool>::from_data([[true, false, true], [false, true, true]], &DEVICE);
    let table =
        Tensor::<Mlx, 2>::from_data(crate::common::rand_f(&[8, 2], (-1.0, 1.0), 9), &DEVICE);
    let f = |(ids, mask): (Tensor<Mlx, 2, Int>, Tensor<Mlx, 2, Bool>)| {
        let kept = ids.clone().mask_fill(mask.bool_not(), 0);
        let emb = burn::tensor::module::embedding(table.clone(), kept.clone());
        (emb.sum_dim(2).squeeze_dim::<2>(2), kept * 10)
    };
    let options = ExportOptions {
        metadata: r#"{"inputs": ["ids", "mask"]}"#.into(),
        ..Default::default()
    };
    export(&path, [(ids.clone(), mask.clone())], &options, f).unwrap();
    let func = MlxFunction::load(&path).unwrap();
    assert_eq!(func.metadata(), options.metadata);
    let (emb, kept): (Tensor<Mlx, 2>, Tensor<Mlx, 2, Int>) =
        func.call((ids.clone(), mask.clone())).unwrap();
    let (emb_ref, kept_ref) = f((ids.clone(), mask.clone()));
    emb.into_data()
        .assert_approx_eq::<f32>(&emb_ref.into_data(), Tolerance::absolute(1e-6));
    kept.into_data().assert_eq(&kept_ref.into_data(), true);

    // Outputs asked for with the wrong rank or kind, or the wrong number of them.
    let err = func
        .call::<_, (Tensor<Mlx, 3>, Tensor<Mlx, 2, Int>)>((ids.clone(), mask.clone()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("output 0") && err.contains("Tensor<Mlx, 3, Float>"),
        "{err}"
    );
    let err = func
        .call::<_, (Tensor<Mlx, 2, Int>, Tensor<Mlx, 2, Int>)>((ids.clone(), mask.clone()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("output 0") && err.contains("Int"), "{err}");
    let err = func
        .call::<_, Tensor<Mlx, 2>>((ids.clone(), mask.clone()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("2 outputs where 1"), "{err}");
    // Inputs of the wrong dtype or number: MLX finds no matching trace.
    let err = func
        .call::<_, (Tensor<Mlx, 2>, Tensor<Mlx, 2, Int>)>((ids.clone().float(), mask.clone()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("No imported function found"), "{err}");
    let err = func
        .call::<_, (Tensor<Mlx, 2>, Tensor<Mlx, 2, Int>)>(ids)
        .unwrap_err()
        .to_string();
    assert!(err.contains("Called with 1 positional"), "{err}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn shapeless_export_serves_other_shapes() {
    let path = file("shapeless");
    let options = ExportOptions {
        shapeless: true,
        ..Default::default()
    };
    let f = |x: Tensor<Mlx, 2>| burn::tensor::activation::sigmoid(x.clone()) * x;
    export(
        &path,
        [Tensor::<Mlx, 2>::ones([2, 2], &DEVICE)],
        &options,
        f,
    )
    .unwrap();
    let func = MlxFunction::load(&path).unwrap();
    let x = Tensor::<Mlx, 2>::from_data(crate::common::rand_f(&[5, 7], (-3.0, 3.0), 11), &DEVICE);
    let got: Tensor<Mlx, 2> = func.call(x.clone()).unwrap();
    got.into_data()
        .assert_approx_eq::<f32>(&f(x).into_data(), Tolerance::absolute(1e-6));
    let _ = std::fs::remove_file(path);
}

#[test]
fn reading_values_while_tracing_fails_and_leaves_no_file_behind() {
    let path = file("host-read");
    let x = Tensor::<Mlx, 1>::ones([3], &DEVICE);
    let err = export(
        &path,
        [x],
        &ExportOptions::default(),
        |x: Tensor<Mlx, 1>| {
            // A data-dependent decision: needs a value that does not exist while tracing.
            let total: f32 = x.clone().sum().into_scalar();
            if total > 0.0 {
                x
            } else {
                -x
            }
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("traces") && err.contains("export"), "{err}");
    assert!(!path.exists(), "a failed export left {}", path.display());

    // A failed export over an earlier file leaves that file as it was.
    let x = Tensor::<Mlx, 1>::from_data([1.0f32, -2.0, 3.0], &DEVICE);
    export(
        &path,
        [x.clone()],
        &ExportOptions::default(),
        |x: Tensor<Mlx, 1>| x * 2.0,
    )
    .unwrap();
    let before = std::fs::read(&path).unwrap();
    let failed = export(
        &path,
        [x.clone()],
        &ExportOptions::default(),
        |x: Tensor<Mlx, 1>| {
            let _: f32 = x.clone().sum().into_scalar();
            x
        },
    );
    assert!(failed.is_err());
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the earlier file changed"
    );
    let doubled: Tensor<Mlx, 1> = MlxFunction::load(&path).unwrap().call(x).unwrap();
    doubled
        .into_data()
        .assert_eq(&TensorData::from([2.0f32, -4.0, 6.0]), true);
    let _ = std::fs::remove_file(&path);

    // The closure's own error comes back unchanged.
    let t = MlxTensor::from_slice(&[1.0f32, 2.0], &[2], DEVICE).unwrap();
    let err = export_function(&path, &[vec![t]], &ExportOptions::default(), |x| {
        Ok(vec![(&x[0]).reshape(&[3])?])
    })
    .unwrap_err();
    assert!(matches!(err, MlxError::Mlx { .. }), "{err}");
    assert!(!path.exists());
}

#[test]
fn sorts_bitwise_not_and_scans_export() {
    // burn-mlx's sorts copy strided inputs to row-major order first, and its descending sorts
    // and `bitwise_not` invert bits; MLX cannot write its `Contiguous` and `BitwiseInvert`
    // primitives, so traced functions do both another way. The transposed input makes the copy
    // necessary.
    let path = file("sorts");
    let x = Tensor::<Mlx, 2>::from_data(crate::common::rand_f(&[4, 5], (-2.0, 2.0), 13), &DEVICE);
    let f = |x: Tensor<Mlx, 2>| {
        let t = x.transpose();
        let (values, indices) = t.clone().sort_descending_with_indices(1);
        let top = t.clone().topk(2, 1);
        (values + top.sum_dim(1), indices.bitwise_not(), t.cumsum(0))
    };
    export(&path, [x.clone()], &ExportOptions::default(), f).unwrap();
    let (v, i, c): (Tensor<Mlx, 2>, Tensor<Mlx, 2, Int>, Tensor<Mlx, 2>) =
        MlxFunction::load(&path).unwrap().call(x.clone()).unwrap();
    let (v_ref, i_ref, c_ref) = f(x);
    v.into_data()
        .assert_approx_eq::<f32>(&v_ref.into_data(), Tolerance::absolute(1e-6));
    i.into_data().assert_eq(&i_ref.into_data(), true);
    c.into_data()
        .assert_approx_eq::<f32>(&c_ref.into_data(), Tolerance::absolute(1e-6));
    let _ = std::fs::remove_file(path);
}

#[test]
fn an_op_mlx_cannot_write_fails_naming_it() {
    // MLX 0.32 cannot write its LU factorization to a function file.
    let path = file("lu");
    let x = MlxTensor::from_slice(&[4.0f32, 3.0, 6.0, 3.0], &[2, 2], DEVICE).unwrap();
    let err = export_function(&path, &[vec![x]], &ExportOptions::default(), |x| {
        let (lu, _pivots) = mlx_rs::linalg::lu_factor(x[0].array()).map_err(|e| MlxError::Mlx {
            op: "lu_factor".into(),
            message: e.to_string(),
        })?;
        Ok(vec![MlxTensor::from_array(lu, DEVICE)])
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(
        err.contains("LUF") && err.contains("outside the exported function"),
        "{err}"
    );
    assert!(!path.exists(), "a failed export left {}", path.display());
}

#[test]
fn bad_files_and_bad_calls_fail_with_clear_errors() {
    let missing = file("missing");
    let err = MlxFunction::load(&missing).unwrap_err().to_string();
    assert!(
        err.contains("cannot read the file") && err.contains("missing"),
        "{err}"
    );

    let not_mlxfn = file("not-mlxfn");
    std::fs::write(&not_mlxfn, b"{\"weights\": [1, 2, 3]}").unwrap();
    let err = MlxFunction::load(&not_mlxfn).unwrap_err().to_string();
    assert!(err.contains("not an MLX function file"), "{err}");
    let _ = std::fs::remove_file(not_mlxfn);

    // A good file cut short at several places.
    let path = file("truncate");
    let w = Tensor::<Mlx, 2>::from_data(crate::common::rand_f(&[16, 16], (-1.0, 1.0), 12), &DEVICE);
    let x = Tensor::<Mlx, 2>::ones([2, 16], &DEVICE);
    export(
        &path,
        [x.clone()],
        &ExportOptions::default(),
        |x: Tensor<Mlx, 2>| burn::tensor::activation::relu(x.matmul(w.clone())),
    )
    .unwrap();
    let bytes = std::fs::read(&path).unwrap();
    for keep in [
        4,
        12,
        bytes.len() / 3,
        bytes.len() / 2,
        bytes.len() - 8,
        bytes.len() - 1,
    ] {
        let cut = file(&format!("truncated-{keep}"));
        std::fs::write(&cut, &bytes[..keep]).unwrap();
        // Reading the file fails, naming it: the cut is found before any call.
        let err = MlxFunction::load(&cut).unwrap_err().to_string();
        assert!(
            err.contains(&cut.display().to_string())
                && (err.contains("truncated") || err.contains("not an MLX function file")),
            "cut at {keep} of {}: {err}",
            bytes.len()
        );
        let _ = std::fs::remove_file(cut);
    }

    // An export with no examples.
    let err = export_function(&path, &[], &ExportOptions::default(), |x| Ok(x.to_vec()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no example inputs"), "{err}");
    let _ = std::fs::remove_file(path);
}
