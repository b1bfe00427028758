//! Burn's `ModuleOps` for [`Mlx`]: convolutions, pooling, interpolation, attention and FFT.
//!
//! Burn lays out images as NCHW with OIHW weights; MLX convolutions are channels-last (NHWC input,
//! OHWI weights), so the convolution ops transpose at the boundary. Pooling builds the windows
//! with `as_strided` and reduces them; the backward passes scatter-add into the input's shape.
//! Interpolation and adaptive pooling are separable linear maps, applied as two matmuls with
//! per-axis matrices (their backward passes are the transposed matmuls).
//!
//! The op families live in sibling files: `conv.rs`, `pool.rs`, `interpolate.rs`,
//! `attention.rs`, `fft.rs` and `deform_conv.rs`.

#[path = "attention.rs"]
mod attention;
#[path = "conv.rs"]
mod conv;
#[path = "deform_conv.rs"]
mod deform_conv;
#[path = "fft.rs"]
mod fft;
#[path = "interpolate.rs"]
mod interpolate;
#[path = "pool.rs"]
mod pool;

use crate::tensor::OrPanic;
use crate::{Mlx, MlxError, MlxTensor};
use burn_backend::ops::{
    AttentionModuleOptions, ConvOptions, ConvTransposeOptions, DeformConv2dBackward,
    DeformConvOptions, InterpolateOptions, MaxPool2dBackward, MaxPool2dWithIndices, ModuleOps,
};
use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype};
use std::fmt;

/// An error inside a module op, turned into a panic (naming the op and its inputs) at the
/// op boundary.
#[derive(Debug)]
pub(crate) struct Failure(String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<Exception> for Failure {
    fn from(e: Exception) -> Self {
        Failure(e.what().to_string())
    }
}

impl From<MlxError> for Failure {
    fn from(e: MlxError) -> Self {
        Failure(e.to_string())
    }
}

impl From<String> for Failure {
    fn from(e: String) -> Self {
        Failure(e)
    }
}

/// The result type of the helpers of the module ops.
pub(crate) type Res<T = Array> = Result<T, Failure>;

/// Runs `f` on the stream of the first input's device and wraps the result as a tensor on that
/// device; on failure, panics with `op` and the inputs' shapes and dtypes.
#[track_caller]
pub(crate) fn run(op: &str, inputs: &[&MlxTensor], f: impl FnOnce() -> Res) -> MlxTensor {
    let device = inputs[0].device;
    let arrays: Vec<&Array> = inputs.iter().map(|t| &t.array).collect();
    let out = device.scope(f).or_panic(op, &arrays);
    MlxTensor::from_array(out, device)
}

/// Like [`run`], for ops with several outputs.
#[track_caller]
pub(crate) fn run_many<T>(op: &str, inputs: &[&MlxTensor], f: impl FnOnce() -> Res<T>) -> T {
    let device = inputs[0].device;
    let arrays: Vec<&Array> = inputs.iter().map(|t| &t.array).collect();
    device.scope(f).or_panic(op, &arrays)
}

/// Converts sizes to MLX's `i32`.
pub(crate) fn ints(v: &[usize]) -> Vec<i32> {
    v.iter().map(|&x| x as i32).collect()
}

/// A constant float array built on the CPU, in `dtype` (f32 values unless `dtype` is f64).
pub(crate) fn float_const(values: &[f64], shape: &[i32], dtype: Dtype) -> Res {
    if dtype == Dtype::Float64 {
        return Ok(Array::from_slice_f64(values, shape));
    }
    let v: Vec<f32> = values.iter().map(|&x| x as f32).collect();
    let a = Array::from_slice(&v, shape);
    Ok(if dtype == Dtype::Float32 {
        a
    } else {
        a.as_dtype(dtype)?
    })
}

/// A constant `i32` array built on the CPU.
pub(crate) fn int_const(values: &[i32], shape: &[i32]) -> Array {
    Array::from_slice(values, shape)
}

/// Moves axis 1 (channels) to the end: NC... -> N...C.
pub(crate) fn channels_last(a: &Array) -> Res {
    let r = a.ndim() as i32;
    let mut axes = vec![0];
    axes.extend(2..r);
    axes.push(1);
    Ok(a.transpose_axes(&axes)?)
}

/// Moves the last axis (channels) to position 1: N...C -> NC....
pub(crate) fn channels_first(a: &Array) -> Res {
    let r = a.ndim() as i32;
    let mut axes = vec![0, r - 1];
    axes.extend(1..r - 1);
    Ok(a.transpose_axes(&axes)?)
}

impl ModuleOps<Mlx> for Mlx {
    fn conv1d(
        x: MlxTensor,
        weight: MlxTensor,
        bias: Option<MlxTensor>,
        options: ConvOptions<1>,
    ) -> MlxTensor {
        conv::conv(
            x,
            weight,
            bias,
            &options.stride,
            &options.padding,
            &options.dilation,
            options.groups,
            "conv1d",
        )
    }

    fn conv1d_weight_backward(
        x: MlxTensor,
        weight: MlxTensor,
        output_grad: MlxTensor,
        options: ConvOptions<1>,
    ) -> MlxTensor {
        conv::conv_weight_backward(x, weight, output_grad, &options, "conv1d_weight_backward")
    }

    fn conv_transpose1d_weight_backward(
        x: MlxTensor,
        weight: MlxTensor,
        output_grad: MlxTensor,
        options: ConvTransposeOptions<1>,
    ) -> MlxTensor {
        conv::conv_transpose_weight_backward(
            x,
            weight,
            output_grad,
            &options,
            "conv_transpose1d_weight_backward",
        )
    }

    fn conv2d_weight_backward(
        x: MlxTensor,
        weight: MlxTensor,
        output_grad: MlxTensor,
        options: ConvOptions<2>,
    ) -> MlxTensor {
        conv::conv_weight_backward(x, weight, output_grad, &options, "conv2d_weight_backward")
    }

    fn conv_transpose2d_weight_backward(
        x: MlxTensor,
        weight: MlxTensor,
        output_grad: MlxTensor,
        options: ConvTransposeOptions<2>,
    ) -> MlxTensor {
        conv::conv_transpose_weight_backward(
            x,
            weight,
            output_grad,
            &options,
            "conv_transpose2d_weight_backward",
        )
    }

    fn conv3d_weight_backward(
        x: MlxTensor,
        weight: MlxTensor,
        output_grad: MlxTensor,
        options: ConvOptions<3>,
    ) -> MlxTensor {
        conv::conv_weight_backward(x, weight, output_grad, &options, "conv3d_weight_backward")
    }

    fn conv_transpose3d_weight_backward(
        x: MlxTensor,
        weight: MlxTensor,
        output_grad: MlxTensor,
        options: ConvTransposeOptions<3>,
    ) -> MlxTensor {
        conv::conv_transpose_weight_backward(
            x,
            weight,
            output_grad,
            &options,
            "conv_transpose3d_weight_backward",
        )
    }

    fn conv2d(
        x: MlxTensor,
        weight: MlxTensor,
        bias: Option<MlxTensor>,
        options: ConvOptions<2>,
    ) -> MlxTensor {
        conv::conv(
            x,
            weight,
            bias,
            &options.stride,
            &options.padding,
            &options.dilation,
            options.groups,
            "conv2d",
        )
    }

    fn conv3d(
        x: MlxTensor,
        weight: MlxTensor,
        bias: Option<MlxTensor>,
        options: ConvOptions<3>,
    ) -> MlxTensor {
        conv::conv(
            x,
            weight,
            bias,
            &options.stride,
            &options.padding,
            &options.dilation,
            options.groups,
            "conv3d",
        )
    }

    fn conv_transpose1d(
        x: MlxTensor,
        weight: MlxTensor,
        bias: Option<MlxTensor>,
        options: ConvTransposeOptions<1>,
    ) -> MlxTensor {
        conv::conv_transpose(x, weight, bias, &options, "conv_transpose1d")
    }

    fn conv_transpose2d(
        x: MlxTensor,
        weight: MlxTensor,
        bias: Option<MlxTensor>,
        options: ConvTransposeOptions<2>,
    ) -> MlxTensor {
        conv::conv_transpose(x, weight, bias, &options, "conv_transpose2d")
    }

    fn conv_transpose3d(
        x: MlxTensor,
        weight: MlxTensor,
        bias: Option<MlxTensor>,
        options: ConvTransposeOptions<3>,
    ) -> MlxTensor {
        conv::conv_transpose(x, weight, bias, &options, "conv_transpose3d")
    }

    fn deform_conv2d(
        x: MlxTensor,
        offset: MlxTensor,
        weight: MlxTensor,
        mask: Option<MlxTensor>,
        bias: Option<MlxTensor>,
        options: DeformConvOptions<2>,
    ) -> MlxTensor {
        deform_conv::forward(x, offset, weight, mask, bias, options)
    }

    fn deform_conv2d_backward(
        x: MlxTensor,
        offset: MlxTensor,
        weight: MlxTensor,
        mask: Option<MlxTensor>,
        bias: Option<MlxTensor>,
        output_grad: MlxTensor,
        options: DeformConvOptions<2>,
    ) -> DeformConv2dBackward<Mlx> {
        deform_conv::backward(x, offset, weight, mask, bias, output_grad, options)
    }

    fn avg_pool2d(
        x: MlxTensor,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        count_include_pad: bool,
        ceil_mode: bool,
    ) -> MlxTensor {
        pool::avg_pool2d(
            x,
            kernel_size,
            stride,
            padding,
            count_include_pad,
            ceil_mode,
        )
    }

    fn avg_pool2d_backward(
        x: MlxTensor,
        grad: MlxTensor,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        count_include_pad: bool,
        ceil_mode: bool,
    ) -> MlxTensor {
        pool::avg_pool2d_backward(
            x,
            grad,
            kernel_size,
            stride,
            padding,
            count_include_pad,
            ceil_mode,
        )
    }

    fn adaptive_avg_pool2d(x: MlxTensor, output_size: [usize; 2]) -> MlxTensor {
        pool::adaptive_avg_pool2d(x, output_size)
    }

    fn adaptive_avg_pool2d_backward(x: MlxTensor, grad: MlxTensor) -> MlxTensor {
        pool::adaptive_avg_pool2d_backward(x, grad)
    }

    fn max_pool2d(
        x: MlxTensor,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> MlxTensor {
        pool::max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode)
    }

    fn max_pool2d_with_indices(
        x: MlxTensor,
        kernel_size: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        ceil_mode: bool,
    ) -> MaxPool2dWithIndices<Mlx> {
        let (output, indices) =
            pool::max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode);
        MaxPool2dWithIndices::new(output, indices)
    }

    fn max_pool2d_with_indices_backward(
        x: MlxTensor,
        _kernel_size: [usize; 2],
        _stride: [usize; 2],
        _padding: [usize; 2],
        _dilation: [usize; 2],
        _ceil_mode: bool,
        output_grad: MlxTensor,
        indices: MlxTensor,
    ) -> MaxPool2dBackward<Mlx> {
        MaxPool2dBackward::new(pool::max_pool2d_backward(x, output_grad, indices))
    }

    fn interpolate(
        x: MlxTensor,
        output_size: [usize; 2],
        options: InterpolateOptions,
    ) -> MlxTensor {
        interpolate::interpolate(x, output_size, &options)
    }

    fn interpolate_backward(
        x: MlxTensor,
        grad: MlxTensor,
        output_size: [usize; 2],
        options: InterpolateOptions,
    ) -> MlxTensor {
        interpolate::interpolate_backward(x, grad, output_size, &options)
    }

    fn attention(
        query: MlxTensor,
        key: MlxTensor,
        value: MlxTensor,
        mask: Option<MlxTensor>,
        attn_bias: Option<MlxTensor>,
        options: AttentionModuleOptions,
    ) -> MlxTensor {
        attention::attention(query, key, value, mask, attn_bias, options)
    }

    fn rfft(signal: MlxTensor, dim: usize, n: Option<usize>) -> (MlxTensor, MlxTensor) {
        fft::rfft(signal, dim, n)
    }

    fn irfft(
        spectrum_re: MlxTensor,
        spectrum_im: MlxTensor,
        dim: usize,
        n: Option<usize>,
    ) -> MlxTensor {
        fft::irfft(spectrum_re, spectrum_im, dim, n)
    }
}
