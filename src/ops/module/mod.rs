//! Burn's `ModuleOps` for [`Mlx`]: linear layers, convolutions, pooling, interpolation, attention,
//! FFT and CTC.
//!
//! Burn lays out images as NCHW with OIHW weights; MLX convolutions are channels-last (NHWC input,
//! OHWI weights), so the convolution ops transpose at the boundary. Pooling builds the windows
//! with `as_strided` and reduces them; the backward passes scatter-add into the input's shape.
//! Interpolation and adaptive pooling are separable linear maps, applied as two matmuls with
//! per-axis matrices (their backward passes are the transposed matmuls).
//!
//! The op families live in the submodules `linear`, `conv`, `pool`, `interpolate`, `attention`,
//! `fft`, `deform_conv` and `ctc` (CTC loss and its gradient, computed in f32 for
//! half-precision inputs); `common` holds the checks and conversions they share.

mod attention;
mod common;
mod conv;
mod ctc;
mod deform_conv;
mod fft;
mod interpolate;
mod linear;
mod pool;

use crate::backend::Mlx;
use crate::tensor::MlxTensor;
use burn_backend::ops::{
    AttentionModuleOptions, ConvOptions, ConvTransposeOptions, DeformConv2dBackward,
    DeformConvOptions, InterpolateOptions, MaxPool2dBackward, MaxPool2dWithIndices, ModuleOps,
};

impl ModuleOps<Mlx> for Mlx {
    fn linear(x: MlxTensor, weight: MlxTensor, bias: Option<MlxTensor>) -> MlxTensor {
        linear::linear(x, weight, bias)
    }

    fn linear_x_backward(weight: MlxTensor, output_grad: MlxTensor) -> MlxTensor {
        linear::linear_x_backward(weight, output_grad)
    }

    fn linear_weight_backward(x: MlxTensor, output_grad: MlxTensor) -> MlxTensor {
        linear::linear_weight_backward(x, output_grad)
    }

    fn linear_bias_backward(output_grad: MlxTensor) -> MlxTensor {
        linear::linear_bias_backward(output_grad)
    }

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

    fn ctc_loss(
        log_probs: MlxTensor,
        targets: MlxTensor,
        input_lengths: MlxTensor,
        target_lengths: MlxTensor,
        blank: usize,
    ) -> MlxTensor {
        ctc::ctc_loss(log_probs, targets, input_lengths, target_lengths, blank)
    }

    fn has_ctc_loss_backward() -> bool {
        true
    }

    fn ctc_loss_backward(
        log_probs: MlxTensor,
        targets: MlxTensor,
        input_lengths: MlxTensor,
        target_lengths: MlxTensor,
        grad_loss: MlxTensor,
        blank: usize,
    ) -> MlxTensor {
        ctc::ctc_loss_backward(
            log_probs,
            targets,
            input_lengths,
            target_lengths,
            grad_loss,
            blank,
        )
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
