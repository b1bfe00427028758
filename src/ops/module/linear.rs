//! Burn's linear layer (`ModuleOps::linear` and its three backward ops) as single MLX GEMMs.
//!
//! Burn's default implementation reshapes the weight `[d_in, d_out]` to `[1, …, 1, d_in, d_out]`
//! and multiplies batch entry by batch entry; its weight gradient is one product per batch entry
//! (`[batch, d_in, d_out]`), summed over the batch afterwards, and the bias is added and reduced
//! one dimension at a time. Here the leading dimensions of the input are folded into the rows of
//! one matrix (a reshape: no copy for a contiguous input), so the forward pass and each gradient is
//! one GEMM, the bias rides in the forward GEMM (MLX's `addmm`, a bias epilogue on CUDA), and the
//! bias gradient is one reduction: 3 MLX primitives fewer per 3-D layer and training step (counted:
//! the decoder LM's step, 37 such layers, 4,266 -> 4,155), and the weight gradient no longer
//! materializes a `[batch, d_in, d_out]` tensor.
//!
//! Half precision follows `float_matmul` (both use [`matmul_add`]): on MLX's CPU, which has no
//! half-precision GEMM, f16 and bf16 products run in f32 and are rounded once; the bias gradient
//! is summed in f32 for f16 and bf16 on every device, as `float_sum_dim` does.

use super::common::{run, Res};
use crate::device::MlxDevice;
use crate::ops::base::{matmul_add, sum_leading_axes};
use crate::tensor::MlxTensor;
use mlx_rs::Array;

/// `[d0, …, dk, n]` as `[d0·…·dk, n]`: the rows of every leading dimension, one matrix.
fn rows(a: &Array) -> Res {
    let shape = a.shape();
    if shape.len() == 2 {
        return Ok(a.clone());
    }
    let (lead, n) = shape.split_at(shape.len() - 1);
    Ok(a.reshape(&[lead.iter().product(), n[0]])?)
}

/// `[m, n]` back to the leading dimensions of `like` (`[d0, …, dk, _]`) with `n` columns.
fn unrows(a: Array, like: &[i32]) -> Res {
    if like.len() == 2 {
        return Ok(a);
    }
    let mut shape = like.to_vec();
    let last = shape.len() - 1;
    shape[last] = a.shape()[1];
    Ok(a.reshape(&shape)?)
}

/// `x · weight + bias` over the last dimension of `x` (`[…, d_in]`), weight `[d_in, d_out]`.
pub(crate) fn linear(x: MlxTensor, weight: MlxTensor, bias: Option<MlxTensor>) -> MlxTensor {
    let mut inputs = vec![&x, &weight];
    inputs.extend(bias.as_ref());
    run("linear", &inputs, || {
        let y = matmul_add(
            &rows(&x.array)?,
            &weight.array,
            bias.as_ref().map(|b| &b.array),
            x.device,
        )?;
        unrows(y, x.array.shape())
    })
}

/// The input's gradient `output_grad · weightᵀ`.
pub(crate) fn linear_x_backward(weight: MlxTensor, output_grad: MlxTensor) -> MlxTensor {
    run("linear_x_backward", &[&output_grad, &weight], || {
        let weight_t = weight.array.t();
        let dx = matmul_add(
            &rows(&output_grad.array)?,
            &weight_t,
            None,
            output_grad.device,
        )?;
        unrows(dx, output_grad.array.shape())
    })
}

/// The weight's gradient `xᵀ · output_grad`, summed over every leading dimension by the GEMM.
pub(crate) fn linear_weight_backward(x: MlxTensor, output_grad: MlxTensor) -> MlxTensor {
    run("linear_weight_backward", &[&x, &output_grad], || {
        let x_t = rows(&x.array)?.t();
        Ok(matmul_add(
            &x_t,
            &rows(&output_grad.array)?,
            None,
            x.device,
        )?)
    })
}

/// The bias's gradient: `output_grad` summed over every dimension but the last (on the GPU in
/// two passes where MLX's one column reduction would use too few thread blocks: see
/// [`sum_axis_split`](crate::ops::base::sum_axis_split)).
pub(crate) fn linear_bias_backward(output_grad: MlxTensor) -> MlxTensor {
    run("linear_bias_backward", &[&output_grad], || {
        let split = output_grad.device == MlxDevice::Gpu;
        Ok(sum_leading_axes(&output_grad.array, split)?)
    })
}
