//! burn-mlx used from another crate: one `Autodiff<Mlx>` training step through Burn's tensor API,
//! and the low-level `MlxTensor` API in both of its forms. It exits non-zero, with a message, if
//! any result is wrong.

use burn_autodiff::Autodiff;
use burn_mlx::{Mlx, MlxDevice, MlxOps, MlxTensor, MlxTyped};
use burn_tensor::{Tensor, TensorData};

type B = Autodiff<Mlx>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = MlxDevice::Cpu;

    // One gradient-descent step of a linear model y = x·w on Autodiff<Mlx>.
    let x = Tensor::<B, 2>::from_data(
        TensorData::new(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]),
        &device,
    );
    let y = Tensor::<B, 2>::from_data(TensorData::new(vec![1.0f32, 0.0], [2, 1]), &device);
    let w = Tensor::<B, 2>::from_data(TensorData::new(vec![0.5f32, -0.5], [2, 1]), &device)
        .require_grad();
    let loss = (x.clone().matmul(w.clone()) - y.clone())
        .powf_scalar(2.0)
        .mean();
    let loss_before: f32 = loss.clone().into_scalar();
    let grads = loss.backward();
    let grad = w.grad(&grads).ok_or("no gradient for w")?;
    // d/dw mean((xw - y)^2) = 2/n · xᵀ(xw - y), with n = 2 and xw - y = [-1.5, -0.5].
    let expected = [-3.0f32, -5.0];
    let got: Vec<f32> = grad.to_data().to_vec()?;
    check("gradient", &got, &expected)?;
    let w_next = w.inner() - grad.mul_scalar(0.02);
    let x = x.inner();
    let y = y.inner();
    let loss_after: f32 = (x.matmul(w_next) - y).powf_scalar(2.0).mean().into_scalar();
    println!("Autodiff<Mlx> step: loss {loss_before:.4} -> {loss_after:.4}");
    if loss_after >= loss_before {
        return Err(
            format!("the step did not lower the loss ({loss_before} -> {loss_after})").into(),
        );
    }

    // The low-level API, Result-returning form.
    let a = MlxTensor::ones::<f32>(&[64, 64], device)?;
    let b = MlxTensor::full::<f32>(&[64, 64], 0.5, device)?;
    let s = a.matmul(&b).relu().softmax().eval()?;
    let values: Vec<f32> = s.to_vec()?;
    check("softmax row", &values[..4], &[1.0 / 64.0; 4])?;
    println!("MlxTensor: 64x64 matmul -> relu -> softmax, row sums to 1");

    // The older burn-mlx crate's typed form.
    let a = MlxTensor::<f32>::ones(&[64, 64], device);
    let b = MlxTensor::<f32>::ones(&[64, 64], device);
    let c = a.matmul(&b);
    let d = c.relu();
    let e = d.softmax();
    e.eval()?;
    check("typed softmax row", &e.to_vec()?[..4], &[1.0 / 64.0; 4])?;
    println!("MlxTensor::<f32>: the older crate's form gives the same result");
    Ok(())
}

/// Compares `got` with `expected` within 1e-5.
fn check(what: &str, got: &[f32], expected: &[f32]) -> Result<(), String> {
    let close =
        got.len() == expected.len() && got.iter().zip(expected).all(|(g, e)| (g - e).abs() <= 1e-5);
    if close {
        Ok(())
    } else {
        Err(format!("{what}: got {got:?}, expected {expected:?}"))
    }
}
