//! Real MLX ops through mlx-rs, checked by value: the native layer works.
use mlx_rs::{ops, random, Array};

#[test]
fn matmul_reduction_and_random_run_on_mlx() {
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    let b = Array::from_slice(&[5.0f32, 6.0, 7.0, 8.0], &[2, 2]);
    let c = a.matmul(&b).unwrap();
    assert_eq!(c.as_slice::<f32>(), &[19.0, 22.0, 43.0, 50.0]);

    let s = c.sum(None).unwrap();
    assert_eq!(s.item_exact::<f32>(), 134.0);
    let m = ops::max_axis(&c, 1, None).unwrap();
    assert_eq!(m.as_slice::<f32>(), &[22.0, 50.0]);

    let key = random::key(42).unwrap();
    let u = random::uniform::<_, f32>(0.0, 1.0, &[10_000], Some(&key)).unwrap();
    let mean = u.mean(None).unwrap().item_exact::<f32>();
    assert!((mean - 0.5).abs() < 0.02, "uniform mean {mean}");
    let u2 = random::uniform::<_, f32>(0.0, 1.0, &[10_000], Some(&key)).unwrap();
    assert_eq!(
        u.as_slice::<f32>(),
        u2.as_slice::<f32>(),
        "same key, same values"
    );
}

#[test]
fn half_precision_round_trips() {
    use half::{bf16, f16};
    let a = Array::from_slice(&[1.5f32, -2.25], &[2]);
    let h = a.as_dtype(mlx_rs::Dtype::Float16).unwrap();
    assert_eq!(
        h.as_slice::<f16>(),
        &[f16::from_f32(1.5), f16::from_f32(-2.25)]
    );
    let b = a.as_dtype(mlx_rs::Dtype::Bfloat16).unwrap();
    assert_eq!(
        b.as_slice::<bf16>(),
        &[bf16::from_f32(1.5), bf16::from_f32(-2.25)]
    );
    let one = Array::from_slice(&[3.0f32], &[1])
        .as_dtype(mlx_rs::Dtype::Float16)
        .unwrap();
    assert_eq!(one.item_exact::<f16>(), f16::from_f32(3.0));
}

#[test]
// `inv_device` pins the CPU stream, where MLX's LAPACK ops run; its replacement needs a scope.
#[allow(deprecated)]
fn lapack_inverse_works() {
    let a = Array::from_slice(&[4.0f32, 7.0, 2.0, 6.0], &[2, 2]);
    let inv = mlx_rs::linalg::inv_device(&a, mlx_rs::StreamOrDevice::cpu()).unwrap();
    let expect = [0.6f32, -0.7, -0.2, 0.4];
    for (x, e) in inv.as_slice::<f32>().iter().zip(expect) {
        assert!((x - e).abs() < 1e-5, "{x} vs {e}");
    }
}
