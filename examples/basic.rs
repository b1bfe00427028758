//! Tensor basics on the MLX backend: creation, arithmetic, reductions, math functions, shape
//! manipulation, comparisons and integer/boolean tensors, through Burn's `Tensor<Mlx, D>`.
//!
//! ```text
//! cargo run --release --example basic
//! ```
//!
//! Every result is also checked against the expected values, so the example doubles as a
//! smoke test: it exits non-zero if the backend computes something wrong.

use burn_mlx::{Mlx, MlxDevice};
use burn_tensor::backend::Backend;
use burn_tensor::{activation, Bool, Distribution, Int, Tensor, TensorData, Tolerance};

fn main() {
    let device = MlxDevice::default();
    println!("burn-mlx basic example on {device:?}\n");
    run::<Mlx>(&device);
    println!("\nall checks passed");
}

/// Asserts that `tensor` holds `expected` (f32, within 1e-5 relative).
fn check<B: Backend, const D: usize>(name: &str, tensor: &Tensor<B, D>, expected: TensorData) {
    tensor
        .to_data()
        .assert_approx_eq::<f32>(&expected, Tolerance::rel_abs(1e-5, 1e-5));
    println!(
        "{name:<28} {:?} {:?}",
        tensor.dims(),
        short(tensor.to_data())
    );
}

/// The values of `data`, as f32, at most 8 of them.
fn short(data: TensorData) -> Vec<f32> {
    let values = data.convert::<f32>().to_vec::<f32>().expect("f32 data");
    values.into_iter().take(8).collect()
}

/// The values of an integer tensor's `data`, as i64.
fn ints_of(data: TensorData) -> Vec<i64> {
    data.convert::<i64>().to_vec::<i64>().expect("i64 data")
}

/// Runs every demonstration on `B`, panicking on the first wrong result.
fn run<B: Backend>(device: &B::Device) {
    // --- Creation ---------------------------------------------------------------------------
    let a = Tensor::<B, 2>::from_data([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], device);
    let b = Tensor::<B, 2>::from_floats([[0.5, -1.0, 2.0], [1.5, 0.0, -2.0]], device);
    check(
        "from_data",
        &a,
        TensorData::from([[1.0f32, 2., 3.], [4., 5., 6.]]),
    );
    check(
        "zeros",
        &Tensor::<B, 1>::zeros([3], device),
        TensorData::from([0.0f32; 3]),
    );
    check(
        "ones",
        &Tensor::<B, 1>::ones([2], device),
        TensorData::from([1.0f32; 2]),
    );
    check(
        "full",
        &Tensor::<B, 1>::full([2], 7.5, device),
        TensorData::from([7.5f32; 2]),
    );
    let range = Tensor::<B, 1, Int>::arange(0..6, device);
    let range = ints_of(range.to_data());
    assert_eq!(range, vec![0, 1, 2, 3, 4, 5]);
    println!("{:<28} {range:?}", "arange (int)");
    let noise = Tensor::<B, 2>::random([256, 256], Distribution::Normal(0.0, 1.0), device);
    let (var, mean) = noise.clone().var_mean(1);
    let mean = mean.mean().into_scalar();
    let var = var.mean().into_scalar();
    println!(
        "{:<28} mean {:.4}, variance {:.4}",
        "random normal 256x256", mean, var
    );
    assert!(num(mean).abs() < 0.05 && (num(var) - 1.0).abs() < 0.05);

    // --- Arithmetic -------------------------------------------------------------------------
    check(
        "a + b",
        &(a.clone() + b.clone()),
        TensorData::from([[1.5f32, 1., 5.], [5.5, 5., 4.]]),
    );
    check(
        "a - b",
        &(a.clone() - b.clone()),
        TensorData::from([[0.5f32, 3., 1.], [2.5, 5., 8.]]),
    );
    check(
        "a * b",
        &(a.clone() * b.clone()),
        TensorData::from([[0.5f32, -2., 6.], [6., 0., -12.]]),
    );
    check(
        "a / 2",
        &(a.clone() / 2.0),
        TensorData::from([[0.5f32, 1., 1.5], [2., 2.5, 3.]]),
    );
    check(
        "2a + 1",
        &(a.clone() * 2.0 + 1.0),
        TensorData::from([[3.0f32, 5., 7.], [9., 11., 13.]]),
    );
    check(
        "-b",
        &(-b.clone()),
        TensorData::from([[-0.5f32, 1., -2.], [-1.5, 0., 2.]]),
    );
    let row = Tensor::<B, 1>::from_floats([10.0, 20.0, 30.0], device);
    check(
        "broadcast a + row",
        &(a.clone() + row.unsqueeze::<2>()),
        TensorData::from([[11.0f32, 22., 33.], [14., 25., 36.]]),
    );
    check(
        "matmul a @ aᵀ",
        &a.clone().matmul(a.clone().transpose()),
        TensorData::from([[14.0f32, 32.], [32., 77.]]),
    );
    check(
        "powf_scalar a^2",
        &a.clone().powf_scalar(2.0),
        TensorData::from([[1.0f32, 4., 9.], [16., 25., 36.]]),
    );
    check(
        "clamp b to [-1, 1]",
        &b.clone().clamp(-1.0, 1.0),
        TensorData::from([[0.5f32, -1., 1.], [1., 0., -1.]]),
    );

    // --- Reductions -------------------------------------------------------------------------
    check("sum", &a.clone().sum(), TensorData::from([21.0f32]));
    check("mean", &a.clone().mean(), TensorData::from([3.5f32]));
    check(
        "sum_dim(0)",
        &a.clone().sum_dim(0),
        TensorData::from([[5.0f32, 7., 9.]]),
    );
    check(
        "mean_dim(1)",
        &a.clone().mean_dim(1),
        TensorData::from([[2.0f32], [5.]]),
    );
    check("max", &b.clone().max(), TensorData::from([2.0f32]));
    check(
        "min_dim(1)",
        &b.clone().min_dim(1),
        TensorData::from([[-1.0f32], [-2.]]),
    );
    check("prod", &a.clone().prod(), TensorData::from([720.0f32]));
    let argmax = b.clone().argmax(1);
    assert_eq!(argmax.dims(), [2, 1]);
    let argmax = ints_of(argmax.to_data());
    assert_eq!(argmax, vec![2, 0]);
    println!("{:<28} {argmax:?}", "argmax(1)");

    // --- Math functions ---------------------------------------------------------------------
    let x = Tensor::<B, 1>::from_floats([0.0, 1.0, 2.0], device);
    let e = std::f32::consts::E;
    check(
        "exp",
        &x.clone().exp(),
        TensorData::from([1.0f32, e, e * e]),
    );
    check(
        "log(exp(x))",
        &x.clone().exp().log(),
        TensorData::from([0.0f32, 1., 2.]),
    );
    check(
        "sqrt",
        &Tensor::<B, 1>::from_floats([4.0, 9.0], device).sqrt(),
        TensorData::from([2.0f32, 3.]),
    );
    check(
        "tanh",
        &x.clone().tanh(),
        TensorData::from([0.0f32, 1f32.tanh(), 2f32.tanh()]),
    );
    check(
        "sin",
        &x.clone().sin(),
        TensorData::from([0.0f32, 1f32.sin(), 2f32.sin()]),
    );
    check(
        "abs",
        &b.clone().abs(),
        TensorData::from([[0.5f32, 1., 2.], [1.5, 0., 2.]]),
    );
    check(
        "sigmoid(0)",
        &activation::sigmoid(Tensor::<B, 1>::zeros([1], device)),
        TensorData::from([0.5f32]),
    );
    check(
        "relu",
        &activation::relu(b.clone()),
        TensorData::from([[0.5f32, 0., 2.], [1.5, 0., 0.]]),
    );
    let sm = activation::softmax(
        Tensor::<B, 2>::from_floats([[1.0, 1.0], [0.0, 2f32.ln()]], device),
        1,
    );
    check(
        "softmax(dim 1)",
        &sm,
        TensorData::from([[0.5f32, 0.5], [1. / 3., 2. / 3.]]),
    );

    // --- Shapes -----------------------------------------------------------------------------
    let t = Tensor::<B, 1>::from_floats([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], device);
    let m = t.clone().reshape([2, 3]);
    check(
        "reshape [2, 3]",
        &m,
        TensorData::from([[0.0f32, 1., 2.], [3., 4., 5.]]),
    );
    check(
        "transpose",
        &m.clone().transpose(),
        TensorData::from([[0.0f32, 3.], [1., 4.], [2., 5.]]),
    );
    check(
        "slice [0..2, 1..3]",
        &m.clone().slice([0..2, 1..3]),
        TensorData::from([[1.0f32, 2.], [4., 5.]]),
    );
    check(
        "cat dim 0",
        &Tensor::cat(vec![m.clone(), m.clone() * 10.0], 0),
        TensorData::from([
            [0.0f32, 1., 2.],
            [3., 4., 5.],
            [0., 10., 20.],
            [30., 40., 50.],
        ]),
    );
    let stacked = Tensor::stack::<3>(vec![m.clone(), m.clone()], 0);
    assert_eq!(stacked.dims(), [2, 2, 3]);
    println!("{:<28} {:?}", "stack -> dims", stacked.dims());
    let flat: Tensor<B, 1> = stacked.flatten(0, 2);
    assert_eq!(flat.dims(), [12]);
    let expanded = Tensor::<B, 2>::from_floats([[1.0], [2.0]], device).expand([2, 4]);
    check(
        "expand [2,1] -> [2,4]",
        &expanded,
        TensorData::from([[1.0f32; 4], [2.0; 4]]),
    );
    let permuted = Tensor::<B, 3>::ones([2, 3, 4], device).permute([2, 0, 1]);
    assert_eq!(permuted.dims(), [4, 2, 3]);
    println!("{:<28} {:?}", "permute [2,0,1] -> dims", permuted.dims());
    let gathered = m
        .clone()
        .gather(1, Tensor::<B, 2, Int>::from_ints([[2, 0], [1, 1]], device));
    check(
        "gather(1)",
        &gathered,
        TensorData::from([[2.0f32, 0.], [4., 4.]]),
    );
    check(
        "select(1, [2, 0])",
        &m.clone()
            .select(1, Tensor::<B, 1, Int>::from_ints([2, 0], device)),
        TensorData::from([[2.0f32, 0.], [5., 3.]]),
    );

    // --- Comparisons, masks, int and bool tensors -------------------------------------------
    let mask: Tensor<B, 2, Bool> = m.clone().greater_elem(2.5);
    assert_eq!(
        mask.to_data().to_vec::<bool>().unwrap(),
        vec![false, false, false, true, true, true]
    );
    println!(
        "{:<28} {:?}",
        "m > 2.5",
        mask.to_data().to_vec::<bool>().unwrap()
    );
    check(
        "mask_fill(m > 2.5, -1)",
        &m.clone().mask_fill(mask.clone(), -1.0),
        TensorData::from([[0.0f32, 1., 2.], [-1., -1., -1.]]),
    );
    check(
        "mask_where",
        &m.clone().mask_where(mask.clone(), m.clone() * 100.0),
        TensorData::from([[0.0f32, 1., 2.], [300., 400., 500.]]),
    );
    let ints = Tensor::<B, 1, Int>::from_ints([7, -3, 12], device);
    let sum = (ints.clone() * 2 + 1).sum().into_scalar();
    assert_eq!(num(sum) as i64, 35);
    println!("{:<28} {}", "int (2x+1).sum()", num(sum) as i64);
    check(
        "int -> float",
        &ints.float(),
        TensorData::from([7.0f32, -3., 12.]),
    );
    let count = mask.int().sum().into_scalar();
    assert_eq!(num(count) as i64, 3);
    println!("{:<28} {}", "bool.int().sum()", num(count) as i64);
    let any_negative = b.clone().lower_elem(0.0).any().into_scalar();
    assert!(burn_tensor::ElementConversion::elem::<bool>(any_negative));
}

/// Reads an element as f64.
fn num<E: burn_tensor::ElementConversion>(value: E) -> f64 {
    value.elem::<f64>()
}
