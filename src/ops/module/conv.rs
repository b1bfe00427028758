//! Convolutions and transposed convolutions (1d, 2d, 3d) on MLX's `conv_general`.
//!
//! Burn's layouts are channels-first (`[N, C, spatial...]`, weights `[O, I/groups, k...]`);
//! MLX's are channels-last (`[N, spatial..., C]`, weights `[O, k..., I/groups]`). The input and
//! weight are transposed on the way in and the output on the way out.

use super::common::{channels_first, channels_last, ints, run, Res};
use crate::tensor::MlxTensor;
use burn_backend::ops::ConvTransposeOptions;
use mlx_rs::{ops, Array, Dtype};

/// Adds a per-channel bias `[C]` to a channels-first array.
fn add_bias(out: Array, bias: Option<&Array>) -> Res {
    match bias {
        None => Ok(out),
        Some(b) => {
            let mut shape = vec![1i32; out.ndim()];
            shape[1] = -1;
            Ok(out.add(b.reshape(&shape)?)?)
        }
    }
}

/// MLX `conv_general` on channels-last arrays, splitting grouped convolutions of more than two
/// spatial dimensions (which MLX does not support) into one convolution per group.
#[allow(clippy::too_many_arguments)]
fn conv_general_grouped(
    x: &Array,
    w: &Array,
    stride: &[i32],
    padding: &[i32],
    kernel_dilation: &[i32],
    input_dilation: &[i32],
    groups: usize,
    flip: bool,
) -> Res {
    let spatial = x.ndim() - 2;
    if x.dtype() == Dtype::Float64 || w.dtype() == Dtype::Float64 {
        // MLX's convolution kernels have no f64 version.
        return conv_im2col(
            x,
            w,
            stride,
            padding,
            kernel_dilation,
            input_dilation,
            groups,
            flip,
        );
    }
    if groups == 1 || spatial <= 2 {
        return Ok(ops::conv_general(
            x,
            w,
            stride,
            padding,
            kernel_dilation,
            input_dilation,
            groups as i32,
            flip,
        )?);
    }
    let c_in = x.shape()[x.ndim() - 1] / groups as i32;
    let c_out = w.shape()[0] / groups as i32;
    let mut outs = Vec::with_capacity(groups);
    for g in 0..groups as i32 {
        let xg = slice_axis(x, x.ndim() - 1, g * c_in, (g + 1) * c_in)?;
        let wg = slice_axis(w, 0, g * c_out, (g + 1) * c_out)?;
        outs.push(ops::conv_general(
            &xg,
            &wg,
            stride,
            padding,
            kernel_dilation,
            input_dilation,
            1,
            flip,
        )?);
    }
    Ok(ops::concatenate(&outs, x.ndim() as i32 - 1)?)
}

/// `conv_general` composed from strided windows and a matmul, for the dtypes MLX's convolution
/// kernels lack (f64). Same arguments and layouts as [`conv_general_grouped`]; the padding may be
/// negative (cropping).
#[allow(clippy::too_many_arguments)]
fn conv_im2col(
    x: &Array,
    w: &Array,
    stride: &[i32],
    padding: &[i32],
    kernel_dilation: &[i32],
    input_dilation: &[i32],
    groups: usize,
    flip: bool,
) -> Res {
    let spatial = x.ndim() - 2;
    let at = |v: &[i32], i: usize| if v.len() == 1 { v[0] } else { v[i] };
    let wshape = w.shape().to_vec();
    let kernel = &wshape[1..=spatial];
    let w = if flip {
        let n = wshape.len();
        let start: Vec<i32> = (0..n)
            .map(|i| {
                if (1..=spatial).contains(&i) {
                    wshape[i] - 1
                } else {
                    0
                }
            })
            .collect();
        let stop: Vec<i32> = (0..n)
            .map(|i| {
                if (1..=spatial).contains(&i) {
                    -wshape[i] - 1
                } else {
                    wshape[i]
                }
            })
            .collect();
        let strides: Vec<i32> = (0..n)
            .map(|i| if (1..=spatial).contains(&i) { -1 } else { 1 })
            .collect();
        crate::native::slice(w, &start, &stop, &strides)?
    } else {
        w.clone()
    };

    let mut a = x.clone();
    for i in 0..spatial {
        let axis = i + 1;
        // Input dilation: interleave `d - 1` zeros between the elements.
        let d = at(input_dilation, i);
        let len = a.shape()[axis];
        if d > 1 && len > 1 {
            let e = ops::expand_dims(&a, axis as i32 + 1)?;
            let mut widths = vec![(0, 0); e.ndim()];
            widths[axis + 1] = (0, d - 1);
            let e = ops::pad(&e, &widths[..], None, None)?;
            let mut shape = a.shape().to_vec();
            shape[axis] = len * d;
            a = slice_axis(&e.reshape(&shape)?, axis, 0, (len - 1) * d + 1)?;
        }
        // Padding (negative: cropping).
        let p = at(padding, i);
        if p > 0 {
            let mut widths = vec![(0, 0); a.ndim()];
            widths[axis] = (p, p);
            a = ops::pad(&a, &widths[..], None, None)?;
        } else if p < 0 {
            let len = a.shape()[axis];
            a = slice_axis(&a, axis, -p, len + p)?;
        }
    }

    let shape = a.shape().to_vec();
    let c = shape[spatial + 1] as i64;
    let mut row = vec![0i64; spatial];
    let mut acc = c;
    for i in (0..spatial).rev() {
        row[i] = acc;
        acc *= shape[i + 1] as i64;
    }
    let out: Vec<i32> = (0..spatial)
        .map(|i| {
            let reach = at(kernel_dilation, i) * (kernel[i] - 1) + 1;
            (shape[i + 1] - reach) / at(stride, i) + 1
        })
        .collect();
    if out.iter().any(|&o| o <= 0) {
        return Err("convolution output would be empty".to_string().into());
    }
    let n = shape[0];
    let mut wshape_full = vec![n];
    wshape_full.extend(&out);
    wshape_full.extend(kernel);
    wshape_full.push(c as i32);
    let mut wstrides = vec![acc];
    wstrides.extend((0..spatial).map(|i| at(stride, i) as i64 * row[i]));
    wstrides.extend((0..spatial).map(|i| at(kernel_dilation, i) as i64 * row[i]));
    wstrides.push(1);
    let windows = ops::as_strided(&a, &wshape_full[..], &wstrides[..], 0)?;

    let g = groups as i32;
    let positions: i32 = n * out.iter().product::<i32>();
    let taps: i32 = kernel.iter().product();
    let cg = c as i32 / g;
    let o = wshape[0];
    // [positions, taps, g, cg] -> [g, positions, taps * cg]
    let cols = windows
        .reshape(&[positions, taps, g, cg])?
        .transpose_axes(&[2, 0, 1, 3])?
        .reshape(&[g, positions, taps * cg])?;
    // [o, k..., cg] -> [g, taps * cg, o / g]
    let wm = w
        .reshape(&[g, o / g, taps * cg])?
        .transpose_axes(&[0, 2, 1])?;
    let res = cols.matmul(&wm)?.transpose_axes(&[1, 0, 2])?;
    let mut oshape = vec![n];
    oshape.extend(&out);
    oshape.push(o);
    Ok(res.reshape(&oshape)?)
}

/// `a[start:stop]` along one axis.
pub(crate) fn slice_axis(a: &Array, axis: usize, start: i32, stop: i32) -> Res {
    let shape = a.shape();
    let mut lo = vec![0; shape.len()];
    let mut hi = shape.to_vec();
    lo[axis] = start;
    hi[axis] = stop;
    let strides = vec![1; shape.len()];
    Ok(crate::native::slice(a, &lo, &hi, &strides)?)
}

/// A convolution with any number of spatial dimensions (1, 2 or 3).
#[allow(clippy::too_many_arguments)]
pub(super) fn conv(
    x: MlxTensor,
    weight: MlxTensor,
    bias: Option<MlxTensor>,
    stride: &[usize],
    padding: &[usize],
    dilation: &[usize],
    groups: usize,
    op: &str,
) -> MlxTensor {
    let mut inputs = vec![&x, &weight];
    if let Some(b) = &bias {
        inputs.push(b);
    }
    run(op, &inputs, || {
        let xl = channels_last(&x.array)?;
        let wl = channels_last(&weight.array)?;
        let out = conv_general_grouped(
            &xl,
            &wl,
            &ints(stride),
            &ints(padding),
            &ints(dilation),
            &vec![1; stride.len()],
            groups,
            false,
        )?;
        add_bias(channels_first(&out)?, bias.as_ref().map(|b| &b.array))
    })
}

/// A transposed convolution with any number of spatial dimensions, composed on `conv_general`:
/// the input is dilated by the stride, padded by `dilation * (kernel - 1) - padding` (plus the
/// output padding at the end) and convolved with the spatially flipped kernel.
pub(super) fn conv_transpose<const N: usize>(
    x: MlxTensor,
    weight: MlxTensor,
    bias: Option<MlxTensor>,
    options: &ConvTransposeOptions<N>,
    op: &str,
) -> MlxTensor {
    let mut inputs = vec![&x, &weight];
    if let Some(b) = &bias {
        inputs.push(b);
    }
    run(op, &inputs, || {
        let groups = options.groups;
        let wdims = weight.dims();
        if wdims.len() != N + 2 || !wdims[0].is_multiple_of(groups) {
            return Err(format!(
                "weight must be [channels_in, channels_out / groups, kernel...] with channels_in \
                 divisible by groups = {groups}"
            )
            .into());
        }
        let (c_in, c_out_g) = (wdims[0], wdims[1]);
        let kernel = &wdims[2..];
        // Burn's [C_in, C_out/g, k...] -> MLX's [C_out, k..., C_in/g], group by group.
        let mut split = vec![groups as i32, (c_in / groups) as i32, c_out_g as i32];
        split.extend(ints(kernel));
        let w = weight.array.reshape(&split)?;
        let mut axes = vec![0, 2];
        axes.extend(3..(N as i32 + 3));
        axes.push(1);
        let w = w.transpose_axes(&axes)?;
        let mut wshape = vec![(groups * c_out_g) as i32];
        wshape.extend(ints(kernel));
        wshape.push((c_in / groups) as i32);
        let w = w.reshape(&wshape)?;

        // Symmetric padding of `lo + padding_out` on each side, then the first `padding_out`
        // outputs are dropped: that is padding `lo` before and `lo + padding_out` after. A
        // negative padding crops instead; MLX would apply it before the input dilation, so the
        // convolution runs unpadded and the output is cropped.
        let pad: Vec<i32> = (0..N)
            .map(|i| {
                (options.dilation[i] * (kernel[i] - 1)) as i32 - options.padding[i] as i32
                    + options.padding_out[i] as i32
            })
            .collect();
        let conv_pad: Vec<i32> = pad.iter().map(|&p| p.max(0)).collect();
        let xl = channels_last(&x.array)?;
        let out = conv_general_grouped(
            &xl,
            &w,
            &vec![1; N],
            &conv_pad,
            &ints(&options.dilation),
            &ints(&options.stride),
            groups,
            true,
        )?;
        let crop: Vec<i32> = (0..N)
            .map(|i| (-pad[i]).max(0) + options.padding_out[i] as i32)
            .collect();
        let out = if crop.iter().any(|&c| c > 0) || pad.iter().any(|&p| p < 0) {
            let shape = out.shape().to_vec();
            let mut lo = vec![0; shape.len()];
            let mut hi = shape.clone();
            for i in 0..N {
                lo[i + 1] = crop[i];
                hi[i + 1] = shape[i + 1] - (-pad[i]).max(0);
            }
            crate::native::slice(&out, &lo, &hi, &vec![1; shape.len()])?
        } else {
            out
        };
        add_bias(channels_first(&out)?, bias.as_ref().map(|b| &b.array))
    })
}

/// Moves the batch axis of `a` (`[N, C, spatial...]`) to the end as the channel axis, with the
/// channel axis split as `[groups, C / groups]`: `[C / groups, spatial..., groups * N]`.
fn batch_as_channels(a: &Array, groups: i32) -> Res {
    let s = a.shape().to_vec();
    let r = s.len() as i32;
    let mut split = vec![s[0], groups, s[1] / groups];
    split.extend(&s[2..]);
    let a = a.reshape(&split)?;
    // [N, g, Cg, S...] -> [Cg, S..., g, N]
    let mut axes = vec![2];
    axes.extend(3..r + 1);
    axes.push(1);
    axes.push(0);
    let a = a.transpose_axes(&axes)?;
    let mut shape = vec![s[1] / groups];
    shape.extend(&s[2..]);
    shape.push(groups * s[0]);
    Ok(a.reshape(&shape)?)
}

/// Keeps the first `kernel` elements of each spatial axis of a channels-last array.
fn crop_kernel(out: &Array, kernel: &[i32]) -> Res {
    let shape = out.shape().to_vec();
    let mut hi = shape.clone();
    hi[1..=kernel.len()].copy_from_slice(kernel);
    let lo = vec![0; shape.len()];
    Ok(crate::native::slice(out, &lo, &hi, &vec![1; shape.len()])?)
}

/// The gradient of a convolution with respect to its weight, as one (grouped) convolution of
/// the input with the output gradient, the batch playing the role of the channels.
pub(super) fn conv_weight_backward<const N: usize>(
    x: MlxTensor,
    weight: MlxTensor,
    output_grad: MlxTensor,
    options: &burn_backend::ops::ConvOptions<N>,
    op: &str,
) -> MlxTensor {
    let (stride, padding, dilation) = (
        &options.stride[..],
        &options.padding[..],
        &options.dilation[..],
    );
    let groups = options.groups;
    run(op, &[&x, &weight, &output_grad], || {
        let g = groups as i32;
        let n = stride.len();
        // Input [Cg_in, S..., g·N]; "weight" [O, T..., N] (each output group reads its g·N slice).
        let xin = batch_as_channels(&x.array, g)?;
        let gw = channels_last(&output_grad.array.swap_axes(0, 1)?)?;
        let out = conv_general_grouped(
            &xin,
            &gw,
            &ints(dilation),
            &ints(padding),
            &ints(stride),
            &vec![1; n],
            groups,
            false,
        )?;
        // [Cg_in, K'..., O] -> [O, Cg_in, K...]
        let kernel = &weight.array.shape()[2..];
        let out = crop_kernel(&out, kernel)?;
        let out = channels_first(&out)?.swap_axes(0, 1)?;
        Ok(out)
    })
}

/// The gradient of a transposed convolution with respect to its weight: one (grouped)
/// convolution of the output gradient with the input, the batch playing the role of the
/// channels.
pub(super) fn conv_transpose_weight_backward<const N: usize>(
    x: MlxTensor,
    weight: MlxTensor,
    output_grad: MlxTensor,
    options: &ConvTransposeOptions<N>,
    op: &str,
) -> MlxTensor {
    run(op, &[&x, &weight, &output_grad], || {
        let g = options.groups as i32;
        // Input: the output gradient [Og, J..., g·N]; "weight": the input [C_in, T..., N].
        let gin = batch_as_channels(&output_grad.array, g)?;
        let xw = channels_last(&x.array.swap_axes(0, 1)?)?;
        let out = conv_general_grouped(
            &gin,
            &xw,
            &ints(&options.dilation),
            &ints(&options.padding),
            &ints(&options.stride),
            &vec![1; N],
            options.groups,
            false,
        )?;
        // [Og, K'..., C_in] -> [C_in, Og, K...]
        let kernel = &weight.array.shape()[2..];
        let out = crop_kernel(&out, kernel)?;
        let out = channels_first(&out)?.swap_axes(0, 1)?;
        Ok(out)
    })
}
