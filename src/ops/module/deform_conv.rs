//! Deformable 2-d convolution (v1 and, with a mask, v2), forward and backward, composed from
//! gathers, scatter-adds and matmuls.
//!
//! Each kernel tap `(kh, kw)` of output position `(oh, ow)` samples the input at
//! `(oh·s + kh·d - p + Δy, ow·s + kw·d - p + Δx)` with bilinear interpolation (zero outside the
//! image), optionally scaled by the mask. The samples form an im2col matrix
//! `[N, C·KH·KW, OH·OW]` that a grouped matmul with the weights turns into the output. The
//! backward pass differentiates that composition: the weight and column gradients are matmuls,
//! the input gradient scatter-adds the column gradient to the four bilinear corners, and the
//! offset and mask gradients reduce over the channels of each offset group.

use super::common::{float_const, run_many, Res};
use crate::backend::Mlx;
use crate::tensor::MlxTensor;
use burn_backend::ops::conv::calculate_conv_output_size;
use burn_backend::ops::{DeformConv2dBackward, DeformConvOptions};
use mlx_rs::{ops, Array, Dtype};

/// Sizes shared by the forward and backward passes.
struct Dims {
    n: i32,
    c: i32,
    h: i32,
    w: i32,
    o: i32,
    kh: i32,
    kw: i32,
    oh: i32,
    ow: i32,
    /// Offset groups.
    og: i32,
    /// Weight groups.
    wg: i32,
}

impl Dims {
    fn new(x: &Array, weight: &Array, offset: &Array, options: &DeformConvOptions<2>) -> Res<Self> {
        let (xs, ws, os) = (x.shape(), weight.shape(), offset.shape());
        if xs.len() != 4 || ws.len() != 4 || os.len() != 4 {
            return Err("deform_conv2d expects 4-d input, weight and offset"
                .to_string()
                .into());
        }
        let (kh, kw) = (ws[2], ws[3]);
        let oh = calculate_conv_output_size(
            kh as usize,
            options.stride[0],
            options.padding[0],
            options.dilation[0],
            xs[2] as usize,
        ) as i32;
        let ow = calculate_conv_output_size(
            kw as usize,
            options.stride[1],
            options.padding[1],
            options.dilation[1],
            xs[3] as usize,
        ) as i32;
        let d = Dims {
            n: xs[0],
            c: xs[1],
            h: xs[2],
            w: xs[3],
            o: ws[0],
            kh,
            kw,
            oh,
            ow,
            og: options.offset_groups as i32,
            wg: options.weight_groups as i32,
        };
        if d.c % d.og != 0 || d.c % d.wg != 0 || d.o % d.wg != 0 {
            return Err("deform_conv2d: channels must be divisible by the groups"
                .to_string()
                .into());
        }
        if os[1] != 2 * d.og * kh * kw || os[2] != oh || os[3] != ow {
            return Err(format!(
                "deform_conv2d: offset must be [batch, 2 * offset_groups * kh * kw, {oh}, {ow}]"
            )
            .into());
        }
        Ok(d)
    }

    /// Kernel taps times output positions: the length of a sampling row.
    fn len(&self) -> i32 {
        self.kh * self.kw * self.oh * self.ow
    }

    /// Channels per offset group.
    fn cg(&self) -> i32 {
        self.c / self.og
    }
}

/// The four bilinear corners of every sampling point.
struct Samples {
    /// Per corner: the flat `H * W` index, clamped into the image, `[N, og, 1, L]`.
    index: Vec<Array>,
    /// Per corner: the input values, zero outside the image, `[N, og, Cg, L]`.
    value: Vec<Array>,
    /// Per corner: the bilinear weight, zero outside the image, `[N, og, 1, L]`.
    weight: Vec<Array>,
    /// Fractional parts of the coordinates, `[N, og, 1, L]`.
    ly: Array,
    lx: Array,
}

/// Computes the sampling points and gathers their corner values.
fn sample(x: &Array, offset: &Array, d: &Dims, options: &DeformConvOptions<2>) -> Res<Samples> {
    let dtype = x.dtype();
    let l = d.len();
    // Offsets: [N, og, KH, KW, 2, OH, OW] -> dy, dx as [N, og, KH, KW, OH, OW].
    let off = offset.reshape(&[d.n, d.og, d.kh, d.kw, 2, d.oh, d.ow])?;
    let pick = |i: i32| -> Res {
        let a = off.take_axis(Array::from_int(i), 4)?;
        Ok(a)
    };
    let (dy, dx) = (pick(0)?, pick(1)?);

    let base = |k: i32, out: i32, axis: usize| -> Vec<f64> {
        let mut v = Vec::with_capacity((k * out) as usize);
        for ki in 0..k as usize {
            for oi in 0..out as usize {
                v.push(
                    (oi * options.stride[axis] + ki * options.dilation[axis]) as f64
                        - options.padding[axis] as f64,
                );
            }
        }
        v
    };
    let by = float_const(&base(d.kh, d.oh, 0), &[1, 1, d.kh, 1, d.oh, 1], dtype)?;
    let bx = float_const(&base(d.kw, d.ow, 1), &[1, 1, 1, d.kw, 1, d.ow], dtype)?;
    let y = dy.add(&by)?.reshape(&[d.n, d.og, 1, l])?;
    let xc = dx.add(&bx)?.reshape(&[d.n, d.og, 1, l])?;

    let y0 = ops::floor(&y)?;
    let x0 = ops::floor(&xc)?;
    let ly = y.subtract(&y0)?;
    let lx = xc.subtract(&x0)?;
    let one = float_const(&[1.0], &[], dtype)?;
    let hy = one.subtract(&ly)?;
    let hx = one.subtract(&lx)?;
    let y0 = y0.as_dtype(Dtype::Int32)?;
    let x0 = x0.as_dtype(Dtype::Int32)?;
    let y1 = y0.add(Array::from_int(1))?;
    let x1 = x0.add(Array::from_int(1))?;

    let xg = x.reshape(&[d.n, d.og, d.cg(), d.h * d.w])?;
    let full = [d.n, d.og, d.cg(), l];
    let corners = [
        (&y0, &x0, hy.multiply(&hx)?),
        (&y0, &x1, hy.multiply(&lx)?),
        (&y1, &x0, ly.multiply(&hx)?),
        (&y1, &x1, ly.multiply(&lx)?),
    ];
    let mut s = Samples {
        index: Vec::with_capacity(4),
        value: Vec::with_capacity(4),
        weight: Vec::with_capacity(4),
        ly: ly.clone(),
        lx: lx.clone(),
    };
    for (yc, xc, wgt) in corners {
        let inside = |a: &Array, size: i32| -> Res {
            let ge = a.ge(Array::from_int(0))?;
            Ok(ge.logical_and(a.lt(Array::from_int(size))?)?)
        };
        let valid = inside(yc, d.h)?.logical_and(inside(xc, d.w)?)?;
        let clamp = |a: &Array, size: i32| -> Res {
            let a = ops::maximum(a, Array::from_int(0))?;
            Ok(ops::minimum(&a, Array::from_int(size - 1))?)
        };
        let idx = clamp(yc, d.h)?
            .multiply(Array::from_int(d.w))?
            .add(clamp(xc, d.w)?)?;
        let gathered = xg.take_along_axis(ops::broadcast_to(&idx, &full)?, 3)?;
        let validf = valid.as_dtype(dtype)?;
        s.value.push(gathered.multiply(&validf)?);
        s.weight.push(wgt.multiply(&validf)?);
        s.index.push(idx);
    }
    Ok(s)
}

/// The bilinear samples `Σ_corner weight · value`, `[N, og, Cg, L]`.
fn interpolated(s: &Samples) -> Res {
    let mut acc = s.value[0].multiply(&s.weight[0])?;
    for i in 1..4 {
        acc = acc.add(s.value[i].multiply(&s.weight[i])?)?;
    }
    Ok(acc)
}

/// The mask as `[N, og, 1, L]`.
fn mask_rows(mask: &Array, d: &Dims) -> Res {
    Ok(mask.reshape(&[d.n, d.og, 1, d.len()])?)
}

/// Forward pass.
pub(super) fn forward(
    x: MlxTensor,
    offset: MlxTensor,
    weight: MlxTensor,
    mask: Option<MlxTensor>,
    bias: Option<MlxTensor>,
    options: DeformConvOptions<2>,
) -> MlxTensor {
    let mut inputs = vec![&x, &offset, &weight];
    if let Some(m) = &mask {
        inputs.push(m);
    }
    if let Some(b) = &bias {
        inputs.push(b);
    }
    let out = run_many("deform_conv2d", &inputs, || {
        let d = Dims::new(&x.array, &weight.array, &offset.array, &options)?;
        let s = sample(&x.array, &offset.array, &d, &options)?;
        let mut cols = interpolated(&s)?;
        if let Some(m) = &mask {
            cols = cols.multiply(mask_rows(&m.array, &d)?)?;
        }
        let p = d.oh * d.ow;
        let k = d.kh * d.kw;
        // [N, og, Cg, K·P] -> [N, wg, (C/wg)·K, P]
        let cols = cols.reshape(&[d.n, d.wg, (d.c / d.wg) * k, p])?;
        let wm = weight
            .array
            .reshape(&[d.wg, d.o / d.wg, (d.c / d.wg) * k])?;
        let out = wm.matmul(&cols)?.reshape(&[d.n, d.o, d.oh, d.ow])?;
        match &bias {
            Some(b) => Ok(out.add(b.array.reshape(&[1, d.o, 1, 1])?)?),
            None => Ok(out),
        }
    });
    x.with(out)
}

/// Backward pass: the gradients for the input, offset, weight, mask and bias.
pub(super) fn backward(
    x: MlxTensor,
    offset: MlxTensor,
    weight: MlxTensor,
    mask: Option<MlxTensor>,
    bias: Option<MlxTensor>,
    output_grad: MlxTensor,
    options: DeformConvOptions<2>,
) -> DeformConv2dBackward<Mlx> {
    let mut inputs = vec![&output_grad, &x, &offset, &weight];
    if let Some(m) = &mask {
        inputs.push(m);
    }
    let (gx, goff, gw, gmask, gbias) = run_many("deform_conv2d_backward", &inputs, || {
        let d = Dims::new(&x.array, &weight.array, &offset.array, &options)?;
        let s = sample(&x.array, &offset.array, &d, &options)?;
        let l = d.len();
        let p = d.oh * d.ow;
        let k = d.kh * d.kw;
        let cpg = (d.c / d.wg) * k;
        let vals = interpolated(&s)?;
        let m = match &mask {
            Some(m) => Some(mask_rows(&m.array, &d)?),
            None => None,
        };
        let cols = match &m {
            Some(m) => vals.multiply(m)?,
            None => vals.clone(),
        };

        // out = W · cols per weight group.
        let gout = output_grad.array.reshape(&[d.n, d.wg, d.o / d.wg, p])?;
        let cols_g = cols.reshape(&[d.n, d.wg, cpg, p])?;
        let gw = gout
            .matmul(cols_g.swap_axes(2, 3)?)?
            .sum_axis(0, false)?
            .reshape(&[d.o, d.c / d.wg, d.kh, d.kw])?;
        let wm = weight.array.reshape(&[d.wg, d.o / d.wg, cpg])?;
        let gcols = wm
            .swap_axes(1, 2)?
            .matmul(&gout)?
            .reshape(&[d.n, d.og, d.cg(), l])?;

        let gmask = match &m {
            Some(_) => Some(gcols.multiply(&vals)?.sum_axis(2, false)?.reshape(&[
                d.n,
                d.og * k,
                d.oh,
                d.ow,
            ])?),
            None => None,
        };
        let gvals = match &m {
            Some(m) => gcols.multiply(m)?,
            None => gcols,
        };

        // Input: scatter-add to the four corners.
        let full = [d.n, d.og, d.cg(), l];
        let mut idx = Vec::with_capacity(4);
        let mut upd = Vec::with_capacity(4);
        for i in 0..4 {
            idx.push(ops::broadcast_to(&s.index[i], &full)?);
            upd.push(gvals.multiply(&s.weight[i])?);
        }
        let idx = ops::concatenate(&idx, 3)?;
        let upd = ops::concatenate(&upd, 3)?;
        let acc = ops::zeros_dtype(&[d.n, d.og, d.cg(), d.h * d.w], x.array.dtype())?;
        let gx =
            crate::native::scatter_add_axis(&acc, &idx, &upd, 3)?.reshape(&[d.n, d.c, d.h, d.w])?;

        // Offsets: derivative of the bilinear weights along y and x.
        let [v00, v01, v10, v11] = [&s.value[0], &s.value[1], &s.value[2], &s.value[3]];
        let one = float_const(&[1.0], &[], x.array.dtype())?;
        let dy = one
            .subtract(&s.lx)?
            .multiply(v10.subtract(v00)?)?
            .add(s.lx.multiply(v11.subtract(v01)?)?)?;
        let dx = one
            .subtract(&s.ly)?
            .multiply(v01.subtract(v00)?)?
            .add(s.ly.multiply(v11.subtract(v10)?)?)?;
        let shape = [d.n, d.og, d.kh, d.kw, 1, d.oh, d.ow];
        let goy = gvals.multiply(&dy)?.sum_axis(2, false)?.reshape(&shape)?;
        let gox = gvals.multiply(&dx)?.sum_axis(2, false)?.reshape(&shape)?;
        let goff = ops::concatenate(&[goy, gox], 4)?.reshape(&[d.n, d.og * k * 2, d.oh, d.ow])?;

        let gbias = match &bias {
            Some(_) => Some(output_grad.array.sum_axes(&[0, 2, 3], false)?),
            None => None,
        };
        Ok((gx, goff, gw, gmask, gbias))
    });
    DeformConv2dBackward::new(
        x.with(gx),
        x.with(goff),
        x.with(gw),
        gmask.map(|a| x.with(a)),
        gbias.map(|a| x.with(a)),
    )
}
