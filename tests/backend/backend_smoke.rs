//! A first end-to-end check of the Burn backend: ops through `Tensor<Mlx, D>` by value.
use burn_mlx::{Mlx, MlxDevice};
use burn_tensor::{Int, Tensor, TensorData};

#[test]
fn tensor_api_runs_on_mlx() {
    let device = MlxDevice::Cpu;
    let a = Tensor::<Mlx, 2>::from_data([[1.0f32, 2.0], [3.0, 4.0]], &device);
    let b = a.clone().matmul(a.clone()) + 1.0;
    assert_eq!(
        b.to_data(),
        TensorData::from([[8.0f32, 11.0], [16.0, 23.0]])
    );
    let s = a.clone().sum_dim(1);
    assert_eq!(s.to_data(), TensorData::from([[3.0f32], [7.0]]));
    let i = Tensor::<Mlx, 1, Int>::from_data([-7i64, 7, -7, 7], &device);
    let d = Tensor::<Mlx, 1, Int>::from_data([2i64, -2, -2, 2], &device);
    assert_eq!(
        i.clone().div(d.clone()).to_data(),
        TensorData::from([-3i64, -3, 3, 3])
    );
    assert_eq!(
        i.remainder(d).to_data(),
        TensorData::from([1i64, -1, -1, 1])
    );
    let t = a.transpose().slice([0..2, 1..2]);
    assert_eq!(t.to_data(), TensorData::from([[3.0f32], [4.0]]));
}

/// Reading a tensor back: arrays MLX keeps as views (transposed, broadcast, sliced) come back in
/// row-major order, and a tensor started with `start_eval` reads its own values while later
/// work is queued behind it.
#[test]
fn into_data_reads_views_and_started_tensors() {
    let device = MlxDevice::Cpu;
    let a = Tensor::<Mlx, 2>::from_data([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &device);
    assert_eq!(
        a.clone().transpose().to_data(),
        TensorData::from([[1.0f32, 4.0], [2.0, 5.0], [3.0, 6.0]])
    );
    assert_eq!(
        a.clone().slice([0..2, 1..2]).expand([2, 3]).to_data(),
        TensorData::from([[2.0f32, 2.0, 2.0], [5.0, 5.0, 5.0]])
    );
    assert_eq!(
        a.clone().slice([1..2, 0..3]).to_data(),
        TensorData::from([[4.0f32, 5.0, 6.0]])
    );
    let ids = Tensor::<Mlx, 2, Int>::from_data([[1i64, 2], [3, 4]], &device);
    assert_eq!(
        ids.transpose().to_data(),
        TensorData::from([[1i64, 3], [2, 4]])
    );
    let mask = a.clone().greater_elem(2.5).transpose();
    assert_eq!(
        mask.to_data(),
        TensorData::from([[false, true], [false, true], [true, true]])
    );

    let first = a.clone() * 2.0;
    burn_mlx::fast::start_eval(&first).unwrap();
    let second = first.clone().matmul(a.transpose()).argmax(1);
    burn_mlx::fast::start_eval(&second).unwrap();
    assert_eq!(
        first.to_data(),
        TensorData::from([[2.0f32, 4.0, 6.0], [8.0, 10.0, 12.0]])
    );
    assert_eq!(second.to_data(), TensorData::from([[1i64], [1]]));
}
