//! 2-d interpolation (nearest, bilinear, bicubic, Lanczos3), forward and backward.
//!
//! Every mode is a separable linear map: `out = Mh · x · Mwᵀ` with one `[out, in]` matrix per
//! spatial axis, built on the CPU from the sizes alone with burn-ndarray's coordinate rules. The
//! backward pass is the transposed map, `grad_x = Mhᵀ · grad · Mw`. Nearest's forward pass is a
//! gather instead.

use super::common::{float_const, int_const, ints, run, Res};
use crate::tensor::MlxTensor;
use burn_backend::ops::{InterpolateMode, InterpolateOptions};
use mlx_rs::Array;

/// `mh · x · mwᵀ` over the last two axes of `x`.
pub(super) fn separable(x: &Array, mh: &Array, mw: &Array) -> Res {
    let t = x.matmul(mw.transpose()?)?;
    Ok(mh.matmul(&t)?)
}

/// `mhᵀ · g · mw` over the last two axes of `g` (the transpose of [`separable`]).
pub(super) fn separable_transposed(g: &Array, mh: &Array, mw: &Array) -> Res {
    let t = g.matmul(mw)?;
    Ok(mh.transpose()?.matmul(&t)?)
}

/// The source coordinate of output position `o` (burn-ndarray's convention).
fn source_coord(o: usize, input: usize, out: usize, align_corners: bool) -> f64 {
    if align_corners {
        let ratio = (input - 1) as f64 / (out.max(2) - 1) as f64;
        ratio * o as f64
    } else {
        (o as f64 + 0.5) * (input as f64 / out as f64) - 0.5
    }
}

/// The source index nearest-neighbour interpolation reads for output position `o`.
fn nearest_index(o: usize, input: usize, out: usize) -> usize {
    let ratio = input as f64 / out as f64;
    ((ratio * o as f64).floor() as usize).min(input - 1)
}

fn cubic_weights(t: f64) -> [f64; 4] {
    const A: f64 = -0.75;
    let near = |x: f64| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let far = |x: f64| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

fn lanczos3(x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    if x.abs() >= 3.0 {
        return 0.0;
    }
    let pi_x = std::f64::consts::PI * x;
    (pi_x.sin() * (pi_x / 3.0).sin()) / (pi_x * (pi_x / 3.0))
}

/// The `[out, input]` interpolation matrix of one axis.
fn axis_matrix(mode: &InterpolateMode, input: usize, out: usize, align_corners: bool) -> Vec<f64> {
    let mut m = vec![0.0; out * input];
    let last = input as isize - 1;
    for o in 0..out {
        let row = &mut m[o * input..(o + 1) * input];
        match mode {
            InterpolateMode::Nearest => row[nearest_index(o, input, out)] = 1.0,
            InterpolateMode::Bilinear => {
                let mut f = source_coord(o, input, out, align_corners);
                if !align_corners {
                    f = f.clamp(0.0, (input - 1) as f64);
                }
                let lo = f.floor();
                let hi = f.ceil().min((input - 1) as f64);
                let t = f - lo;
                row[lo as usize] += 1.0 - t;
                row[hi as usize] += t;
            }
            InterpolateMode::Bicubic => {
                let f = source_coord(o, input, out, align_corners);
                let lo = f.floor();
                let weights = cubic_weights(f - lo);
                for (j, wgt) in weights.iter().enumerate() {
                    let i = (lo as isize - 1 + j as isize).clamp(0, last);
                    row[i as usize] += wgt;
                }
            }
            InterpolateMode::Lanczos3 => {
                let f = source_coord(o, input, out, align_corners);
                let lo = f.floor();
                let mut sum = 0.0;
                for k in -2..=3isize {
                    let i = lo as isize + k;
                    if i < 0 || i > last {
                        continue;
                    }
                    let wgt = lanczos3(f - (lo + k as f64));
                    row[i as usize] += wgt;
                    sum += wgt;
                }
                if sum != 0.0 {
                    row.iter_mut().for_each(|v| *v /= sum);
                }
            }
        }
    }
    m
}

/// The per-axis matrices `(mh, mw)` for an `[.., h, w]` input and `[oh, ow]` output.
fn matrices(
    options: &InterpolateOptions,
    input: [usize; 2],
    out: [usize; 2],
    dtype: mlx_rs::Dtype,
) -> Res<(Array, Array)> {
    let mh = axis_matrix(&options.mode, input[0], out[0], options.align_corners);
    let mw = axis_matrix(&options.mode, input[1], out[1], options.align_corners);
    Ok((
        float_const(&mh, &ints(&[out[0], input[0]]), dtype)?,
        float_const(&mw, &ints(&[out[1], input[1]]), dtype)?,
    ))
}

fn spatial(a: &Array, op: &str) -> Res<[usize; 2]> {
    let s = a.shape();
    if s.len() != 4 || s[2] == 0 || s[3] == 0 {
        return Err(format!(
            "{op} expects a [batch, channels, height, width] tensor with non-empty spatial dims"
        )
        .into());
    }
    Ok([s[2] as usize, s[3] as usize])
}

/// Resamples `[N, C, H, W]` to `[N, C, out_h, out_w]`.
pub(super) fn interpolate(
    x: MlxTensor,
    output_size: [usize; 2],
    options: &InterpolateOptions,
) -> MlxTensor {
    run("interpolate", &[&x], || {
        let input = spatial(&x.array, "interpolate")?;
        if let InterpolateMode::Nearest = options.mode {
            let ih: Vec<i32> = (0..output_size[0])
                .map(|o| nearest_index(o, input[0], output_size[0]) as i32)
                .collect();
            let iw: Vec<i32> = (0..output_size[1])
                .map(|o| nearest_index(o, input[1], output_size[1]) as i32)
                .collect();
            let rows = x.array.take_axis(int_const(&ih, &[ih.len() as i32]), 2)?;
            return Ok(rows.take_axis(int_const(&iw, &[iw.len() as i32]), 3)?);
        }
        let (mh, mw) = matrices(options, input, output_size, x.array.dtype())?;
        separable(&x.array, &mh, &mw)
    })
}

/// The gradient of [`interpolate`] with respect to its input.
pub(super) fn interpolate_backward(
    x: MlxTensor,
    grad: MlxTensor,
    output_size: [usize; 2],
    options: &InterpolateOptions,
) -> MlxTensor {
    run("interpolate_backward", &[&grad, &x], || {
        let input = spatial(&x.array, "interpolate_backward")?;
        let (mh, mw) = matrices(options, input, output_size, grad.array.dtype())?;
        separable_transposed(&grad.array, &mh, &mw)
    })
}
