//! 2-d max, average and adaptive average pooling, forward and backward.
//!
//! The forward passes pad the input and view its windows with `as_strided`
//! (`[N, C, OH, OW, KH, KW]`), then reduce them. Max pooling returns, like burn-ndarray, the index
//! of the maximum in the flattened `H * W` plane of the unpadded input. The backward passes
//! scatter-add the output gradient into the input's shape.

use super::common::{
    accumulation_dtype, float_const, int_const, ints, run, run_many, Failure, Res,
};
use super::interpolate::{separable, separable_transposed};
use crate::backend::Mlx;
use crate::dtype::int_mlx;
use crate::tensor::MlxTensor;
use burn_backend::get_device_settings;
use burn_backend::ops::conv::calculate_pool_output_size;
use mlx_rs::{ops, Array, Dtype};

/// The spatial sizes of a `[N, C, H, W]` array.
fn dims4(a: &Array, op: &str) -> Res<[usize; 4]> {
    let s = a.shape();
    if s.len() != 4 {
        return Err(format!("{op} expects a 4-d [batch, channels, height, width] tensor").into());
    }
    Ok([s[0] as usize, s[1] as usize, s[2] as usize, s[3] as usize])
}

/// The geometry of a pooling: output size and the padded input size that holds every window.
struct Geometry {
    out: [usize; 2],
    padded: [usize; 2],
}

fn geometry(
    input: [usize; 2],
    out: [usize; 2],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
) -> Geometry {
    let padded = std::array::from_fn(|i| {
        let reach = (out[i].max(1) - 1) * stride[i] + dilation[i] * (kernel[i] - 1) + 1;
        (input[i] + 2 * padding[i]).max(reach)
    });
    Geometry { out, padded }
}

fn output_size(
    input: [usize; 2],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    ceil_mode: bool,
) -> [usize; 2] {
    std::array::from_fn(|i| {
        calculate_pool_output_size(
            kernel[i],
            stride[i],
            padding[i],
            dilation[i],
            input[i],
            ceil_mode,
        )
    })
}

/// Pads the spatial axes with `value`: `padding` before, up to `padded` after.
fn pad_spatial(
    x: &Array,
    input: [usize; 2],
    padding: [usize; 2],
    padded: [usize; 2],
    value: f64,
) -> Res {
    let hi: [i32; 2] = std::array::from_fn(|i| (padded[i] - input[i] - padding[i]) as i32);
    if padding == [0, 0] && hi == [0, 0] {
        return Ok(x.clone());
    }
    let widths = [
        (0, 0),
        (0, 0),
        (padding[0] as i32, hi[0]),
        (padding[1] as i32, hi[1]),
    ];
    let v = float_const(&[value], &[], x.dtype())?;
    Ok(ops::pad(x, &widths[..], v, None)?)
}

/// The `[N, C, OH, OW, KH, KW]` windows of a padded `[N, C, Hp, Wp]` array.
fn windows(
    xp: &Array,
    g: &Geometry,
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
) -> Res {
    let s = xp.shape();
    let (n, c) = (s[0] as i64, s[1] as i64);
    let (hp, wp) = (g.padded[0] as i64, g.padded[1] as i64);
    let shape = [
        n as i32,
        c as i32,
        g.out[0] as i32,
        g.out[1] as i32,
        kernel[0] as i32,
        kernel[1] as i32,
    ];
    let strides = [
        c * hp * wp,
        hp * wp,
        stride[0] as i64 * wp,
        stride[1] as i64,
        dilation[0] as i64 * wp,
        dilation[1] as i64,
    ];
    Ok(ops::as_strided(xp, &shape[..], &strides[..], 0)?)
}

/// Max pooling.
pub(super) fn max_pool2d(
    x: MlxTensor,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    ceil_mode: bool,
) -> MlxTensor {
    run("max_pool2d", &[&x], || {
        let [_, _, h, w] = dims4(&x.array, "max_pool2d")?;
        let out = output_size([h, w], kernel, stride, padding, dilation, ceil_mode);
        let g = geometry([h, w], out, kernel, stride, padding, dilation);
        let xp = pad_spatial(&x.array, [h, w], padding, g.padded, f64::NEG_INFINITY)?;
        shifted_reduce(&xp, &g, kernel, stride, dilation, |a, b| ops::maximum(a, b))
    })
}

/// A reduction over each window of a padded `[N, C, Hp, Wp]` array (`combine` is `maximum` or
/// `add`), folded over the `KH * KW` strided views, one per kernel offset, each `[N, C, OH, OW]`.
///
/// Same result as reducing the `as_strided` windows, but MLX's CPU backend copies those windows
/// into a `KH * KW` times larger array before reducing; the views are read in place (measured on
/// the ResNet-like 3x3/2 max pool of 8x64x56x56: 29.6 ms before, 3.3 ms after).
fn shifted_reduce(
    xp: &Array,
    g: &Geometry,
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    combine: impl Fn(&Array, &Array) -> Result<Array, mlx_rs::error::Exception>,
) -> Res {
    let s = xp.shape();
    let mut acc: Option<Array> = None;
    for i in 0..kernel[0] {
        for j in 0..kernel[1] {
            let (h0, w0) = ((i * dilation[0]) as i32, (j * dilation[1]) as i32);
            let h1 = h0 + ((g.out[0].max(1) - 1) * stride[0]) as i32 + 1;
            let w1 = w0 + ((g.out[1].max(1) - 1) * stride[1]) as i32 + 1;
            let view = crate::native::slice(
                xp,
                &[0, 0, h0, w0],
                &[s[0], s[1], h1, w1],
                &[1, 1, stride[0] as i32, stride[1] as i32],
            )?;
            acc = Some(match acc {
                None => view,
                Some(a) => combine(&a, &view)?,
            });
        }
    }
    let out = acc.ok_or_else(|| Failure::from("pooling with an empty kernel".to_string()))?;
    if g.out.contains(&0) {
        // An empty output: the views above had one position; take none of it.
        let shape = [s[0], s[1], g.out[0] as i32, g.out[1] as i32];
        return Ok(ops::zeros_dtype(&shape[..], out.dtype())?);
    }
    Ok(out)
}

/// Max pooling that also returns the flat `H * W` index of each maximum.
pub(super) fn max_pool2d_with_indices(
    x: MlxTensor,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    ceil_mode: bool,
) -> (MlxTensor, MlxTensor) {
    let int_dtype = int_mlx(get_device_settings::<Mlx>(&x.device).int_dtype);
    let (out, idx) = run_many("max_pool2d_with_indices", &[&x], || {
        let [n, c, h, w] = dims4(&x.array, "max_pool2d_with_indices")?;
        let out = output_size([h, w], kernel, stride, padding, dilation, ceil_mode);
        let g = geometry([h, w], out, kernel, stride, padding, dilation);
        let xp = pad_spatial(&x.array, [h, w], padding, g.padded, f64::NEG_INFINITY)?;
        let win = windows(&xp, &g, kernel, stride, dilation)?;
        let k = (kernel[0] * kernel[1]) as i32;
        let win = win.reshape(&[n as i32, c as i32, out[0] as i32, out[1] as i32, k])?;
        let values = win.max_axis(4, false)?;
        let arg = ops::indexing::argmax_axis(&win, 4, false)?;

        // Position of each kernel element relative to the window's origin.
        let off_h: Vec<i32> = (0..k as usize)
            .map(|i| ((i / kernel[1]) * dilation[0]) as i32)
            .collect();
        let off_w: Vec<i32> = (0..k as usize)
            .map(|i| ((i % kernel[1]) * dilation[1]) as i32)
            .collect();
        let origin_h: Vec<i32> = (0..out[0])
            .map(|o| (o * stride[0]) as i32 - padding[0] as i32)
            .collect();
        let origin_w: Vec<i32> = (0..out[1])
            .map(|o| (o * stride[1]) as i32 - padding[1] as i32)
            .collect();
        let ih = ops::indexing::take_axis(int_const(&off_h, &[k]), &arg, 0)?
            .add(int_const(&origin_h, &[out[0] as i32, 1]))?;
        let iw = ops::indexing::take_axis(int_const(&off_w, &[k]), &arg, 0)?
            .add(int_const(&origin_w, &[1, out[1] as i32]))?;
        let clamp = |a: Array, hi: usize| -> Res {
            let a = ops::maximum(&a, Array::from_int(0))?;
            Ok(ops::minimum(&a, Array::from_int(hi as i32 - 1))?)
        };
        let ih = clamp(ih, h)?;
        let iw = clamp(iw, w)?;
        let idx = ih.multiply(Array::from_int(w as i32))?.add(&iw)?;
        // burn-ndarray reports index 0 for a window without any value above -inf.
        let idx = ops::select(&values.is_neg_inf()?, Array::from_int(0), &idx)?;
        Ok((values, idx.as_dtype(int_dtype)?))
    });
    (x.with(out), x.with(idx))
}

/// The backward pass of max pooling: the output gradient, added at the saved indices.
pub(super) fn max_pool2d_backward(x: MlxTensor, grad: MlxTensor, indices: MlxTensor) -> MlxTensor {
    run(
        "max_pool2d_with_indices_backward",
        &[&grad, &indices, &x],
        || {
            let [n, c, h, w] = dims4(&x.array, "max_pool2d_with_indices_backward")?;
            let [_, _, oh, ow] = dims4(&grad.array, "max_pool2d_with_indices_backward")?;
            let flat = [n as i32, c as i32, (oh * ow) as i32];
            let idx = indices.array.reshape(&flat)?;
            let vals = grad.array.reshape(&flat)?;
            let acc = ops::zeros_dtype(&[n as i32, c as i32, (h * w) as i32], grad.array.dtype())?;
            let out = crate::native::scatter_add_axis(&acc, &idx, &vals, 2)?;
            Ok(out.reshape(&ints(&[n, c, h, w]))?)
        },
    )
}

/// The number of elements each average-pooling window divides by, per output position along
/// one axis (burn-ndarray's rule: positions inside the padded input when `count_include_pad`,
/// otherwise positions inside the input).
fn avg_counts(
    input: usize,
    out: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    include_pad: bool,
) -> Vec<usize> {
    (0..out)
        .map(|o| {
            let start = o * stride;
            let end = start + kernel;
            if include_pad {
                end.min(input + 2 * padding).saturating_sub(start)
            } else {
                end.min(input + padding).saturating_sub(start.max(padding))
            }
        })
        .collect()
}

/// The `[OH, OW]` divisors of average pooling.
fn avg_divisors(
    input: [usize; 2],
    out: [usize; 2],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    include_pad: bool,
    dtype: Dtype,
) -> Res {
    let ch = avg_counts(
        input[0],
        out[0],
        kernel[0],
        stride[0],
        padding[0],
        include_pad,
    );
    let cw = avg_counts(
        input[1],
        out[1],
        kernel[1],
        stride[1],
        padding[1],
        include_pad,
    );
    let values: Vec<f64> = ch
        .iter()
        .flat_map(|&a| cw.iter().map(move |&b| (a * b) as f64))
        .collect();
    float_const(&values, &[out[0] as i32, out[1] as i32], dtype)
}

/// Average pooling.
pub(super) fn avg_pool2d(
    x: MlxTensor,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    count_include_pad: bool,
    ceil_mode: bool,
) -> MlxTensor {
    run("avg_pool2d", &[&x], || {
        let [_, _, h, w] = dims4(&x.array, "avg_pool2d")?;
        let out = output_size([h, w], kernel, stride, padding, [1, 1], ceil_mode);
        let g = geometry([h, w], out, kernel, stride, padding, [1, 1]);
        let xp = pad_spatial(&x.array, [h, w], padding, g.padded, 0.0)?;
        let sum = shifted_reduce(&xp, &g, kernel, stride, [1, 1], |a, b| a.add(b))?;
        let div = avg_divisors(
            [h, w],
            out,
            kernel,
            stride,
            padding,
            count_include_pad,
            x.array.dtype(),
        )?;
        Ok(sum.divide(&div)?)
    })
}

/// The backward pass of average pooling: each output gradient, divided by its window's count,
/// is added to every input position of its window.
pub(super) fn avg_pool2d_backward(
    x: MlxTensor,
    grad: MlxTensor,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    count_include_pad: bool,
    _ceil_mode: bool,
) -> MlxTensor {
    run("avg_pool2d_backward", &[&grad, &x], || {
        let [n, c, h, w] = dims4(&x.array, "avg_pool2d_backward")?;
        let [_, _, oh, ow] = dims4(&grad.array, "avg_pool2d_backward")?;
        let out = [oh, ow];
        let g = geometry([h, w], out, kernel, stride, padding, [1, 1]);
        // f16/bf16 gradients are divided and summed over the overlapping windows in f32 and
        // rounded once (rounding `g / count` and every partial sum put 2/3 one bf16 ulp low).
        let out_dtype = grad.array.dtype();
        let dtype = accumulation_dtype(out_dtype);
        let grad_array = grad.array.as_dtype(dtype)?;
        let div = avg_divisors(
            [h, w],
            out,
            kernel,
            stride,
            padding,
            count_include_pad,
            dtype,
        )?;
        let scaled = grad_array.divide(&div)?;
        let (kh, kw) = (kernel[0], kernel[1]);
        let len = oh * ow * kh * kw;
        let expanded = scaled.reshape(&ints(&[n, c, oh, ow, 1, 1]))?;
        let vals = ops::broadcast_to(&expanded, &ints(&[n, c, oh, ow, kh, kw]))?
            .reshape(&ints(&[n, c, len]))?;
        let wp = g.padded[1];
        let mut idx = Vec::with_capacity(len);
        for o_h in 0..oh {
            for o_w in 0..ow {
                for k_h in 0..kh {
                    for k_w in 0..kw {
                        let ih = o_h * stride[0] + k_h;
                        let iw = o_w * stride[1] + k_w;
                        idx.push((ih * wp + iw) as i32);
                    }
                }
            }
        }
        let idx = ops::broadcast_to(int_const(&idx, &[1, 1, len as i32]), &ints(&[n, c, len]))?;
        let acc = ops::zeros_dtype(&ints(&[n, c, g.padded[0] * wp]), dtype)?;
        let acc = crate::native::scatter_add_axis(&acc, &idx, &vals, 2)?;
        let acc = acc.reshape(&ints(&[n, c, g.padded[0], wp]))?;
        let lo = [0, 0, padding[0] as i32, padding[1] as i32];
        let hi = ints(&[n, c, padding[0] + h, padding[1] + w]);
        Ok(crate::native::slice(&acc, &lo, &hi, &[1, 1, 1, 1])?.as_dtype(out_dtype)?)
    })
}

/// The `[out, input]` averaging matrix of adaptive pooling along one axis.
fn adaptive_matrix(input: usize, out: usize) -> Vec<f64> {
    let mut m = vec![0.0; out * input];
    for o in 0..out {
        let start = (o * input) / out;
        let end = ((o + 1) * input).div_ceil(out).min(input);
        let len = (end - start) as f64;
        for i in start..end {
            m[o * input + i] = 1.0 / len;
        }
    }
    m
}

/// Adaptive average pooling.
pub(super) fn adaptive_avg_pool2d(x: MlxTensor, output_size: [usize; 2]) -> MlxTensor {
    run("adaptive_avg_pool2d", &[&x], || {
        let [n, c, h, w] = dims4(&x.array, "adaptive_avg_pool2d")?;
        let [oh, ow] = output_size;
        if oh > 0 && ow > 0 && h % oh == 0 && w % ow == 0 {
            // Equal, disjoint windows: a reshape and a mean.
            let r = x.array.reshape(&ints(&[n, c, oh, h / oh, ow, w / ow]))?;
            return Ok(r.mean_axes(&[3, 5], false)?);
        }
        let dtype = x.array.dtype();
        let mh = float_const(&adaptive_matrix(h, oh), &ints(&[oh, h]), dtype)?;
        let mw = float_const(&adaptive_matrix(w, ow), &ints(&[ow, w]), dtype)?;
        separable(&x.array, &mh, &mw)
    })
}

/// The backward pass of adaptive average pooling.
pub(super) fn adaptive_avg_pool2d_backward(x: MlxTensor, grad: MlxTensor) -> MlxTensor {
    run("adaptive_avg_pool2d_backward", &[&grad, &x], || {
        let [n, c, h, w] = dims4(&x.array, "adaptive_avg_pool2d_backward")?;
        let [_, _, oh, ow] = dims4(&grad.array, "adaptive_avg_pool2d_backward")?;
        // f16/bf16: the averaging weights (1/3 is not a half-precision number) and the sums over
        // overlapping windows in f32, rounded once.
        let out_dtype = grad.array.dtype();
        let dtype = accumulation_dtype(out_dtype);
        let grad_array = grad.array.as_dtype(dtype)?;
        if oh > 0 && ow > 0 && h % oh == 0 && w % ow == 0 {
            let (kh, kw) = (h / oh, w / ow);
            let scale = float_const(&[1.0 / (kh * kw) as f64], &[], dtype)?;
            let g = grad_array
                .multiply(&scale)?
                .reshape(&ints(&[n, c, oh, 1, ow, 1]))?;
            let g = ops::broadcast_to(&g, &ints(&[n, c, oh, kh, ow, kw]))?;
            return Ok(g.reshape(&ints(&[n, c, h, w]))?.as_dtype(out_dtype)?);
        }
        let mh = float_const(&adaptive_matrix(h, oh), &ints(&[oh, h]), dtype)?;
        let mw = float_const(&adaptive_matrix(w, ow), &ints(&[ow, w]), dtype)?;
        Ok(separable_transposed(&grad_array, &mh, &mw)?.as_dtype(out_dtype)?)
    })
}
