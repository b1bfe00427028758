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
