//! Differential tests of `ModuleOps` (linear layers, convolutions, pooling, interpolation,
//! attention, FFT, deformable convolution, embedding, unfold) and of burn-nn's layers: `Mlx`
//! against burn-ndarray, forward values and, through `Autodiff`, gradients of every input.
//!
//! Where burn-ndarray has no implementation the reference is built another way on the reference
//! side: interpolation gradients from the images of basis inputs (interpolation is linear), FFTs
//! as matmuls with DFT matrices.

use crate::common::*;
use burn_core::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn_tensor::backend::{AutodiffBackend, Backend};
use burn_tensor::module;
use burn_tensor::ops::{
    AttentionModuleOptions, ConvOptions, ConvTransposeOptions, DeformConvOptions, InterpolateMode,
    InterpolateOptions, UnfoldOptions,
};
use burn_tensor::{DType, Int, Tensor, TensorData};

/// Sums of a few dozen products: f32 rounding of both backends.
const TOL: Tol = Tol {
    rtol: 1e-4,
    atol: 1e-4,
};

/// Runs every config of a forward/gradient sweep and reports all failures at once.
fn sweep_ad<C: AdCase + std::fmt::Debug>(name: &str, cases: &[C], dtypes: &[DType], tol: Tol) {
    let mut f = Failures::new(name);
    for c in cases {
        for &dt in dtypes {
            f.check_ad(c, &format!("{c:?} {dt:?}"), dt, DType::I64, tol);
        }
    }
    f.finish();
}

/// Runs every config of a forward sweep (no autodiff) and reports all failures at once.
fn sweep<C: Case + std::fmt::Debug>(name: &str, cases: &[C], dtypes: &[DType], tol: Tol) {
    let mut f = Failures::new(name);
    for c in cases {
        for &dt in dtypes {
            f.check(c, &format!("{c:?} {dt:?}"), dt, DType::I64, tol);
        }
    }
    f.finish();
}

// ---------------------------------------------------------------------------------------------
// Linear
// ---------------------------------------------------------------------------------------------

/// `module::linear` on an input of shape `x` (`[..., d_in]`) with a `[d_in, d_out]` weight:
/// `Mlx` folds the leading dimensions into one GEMM, burn-ndarray multiplies batch by batch.
#[derive(Debug, Clone)]
struct Linear<const D: usize> {
    x: [usize; D],
    d_out: usize,
    bias: bool,
}

impl<const D: usize> AdCase for Linear<D> {
    fn run<B: AutodiffBackend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        let x = ctx.f(self.x, (-1.0, 1.0)).require_grad();
        let w = ctx
            .f([self.x[D - 1], self.d_out], (-1.0, 1.0))
            .require_grad();
        let b = self
            .bias
            .then(|| ctx.f([self.d_out], (-1.0, 1.0)).require_grad());
        let y = module::linear(x.clone(), w.clone(), b.clone());
        let g = backward_weighted(ctx, y.clone());
        outs((y, x.grad(&g), w.grad(&g), b.and_then(|b| b.grad(&g))))
    }
}

#[test]
fn linear_forward_and_grads() {
    let dtypes = [DType::F32, DType::F64, DType::F16, DType::BF16];
    let lin = |x, d_out, bias| Linear::<3> { x, d_out, bias };
    sweep_ad(
        "linear 3-d",
        &[
            lin([2, 5, 7], 3, true),
            lin([3, 1, 4], 6, false),
            lin([1, 9, 16], 1, true),
        ],
        &dtypes,
        TOL,
    );
    sweep_ad(
        "linear 1-d",
        &[Linear::<1> {
            x: [6],
            d_out: 4,
            bias: true,
        }],
        &dtypes,
        TOL,
    );
    sweep_ad(
        "linear 2-d",
        &[
            Linear::<2> {
                x: [5, 8],
                d_out: 3,
                bias: true,
            },
            Linear::<2> {
                x: [1, 3],
                d_out: 2,
                bias: false,
            },
        ],
        &dtypes,
        TOL,
    );
    sweep_ad(
        "linear 4-d",
        &[Linear::<4> {
            x: [2, 3, 4, 5],
            d_out: 6,
            bias: true,
        }],
        &dtypes,
        TOL,
    );
}

// ---------------------------------------------------------------------------------------------
// Convolutions
// ---------------------------------------------------------------------------------------------

/// A convolution of N spatial dims: input `[n, c_in, size...]`, `c_out` filters of `kernel`.
#[derive(Debug, Clone)]
struct Conv<const N: usize> {
    n: usize,
    c_in: usize,
    c_out: usize,
    size: [usize; N],
    kernel: [usize; N],
    stride: [usize; N],
    padding: [usize; N],
    dilation: [usize; N],
    groups: usize,
    bias: bool,
}

fn shape<const D: usize>(lead: [usize; 2], rest: &[usize]) -> [usize; D] {
    let mut s = [0; D];
    s[0] = lead[0];
    s[1] = lead[1];
    s[2..].copy_from_slice(rest);
    s
}

macro_rules! conv_case {
    ($n:literal, $d:literal, $f:path) => {
        impl AdCase for Conv<$n> {
            fn run<B: AutodiffBackend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
                let x = ctx
                    .f(shape::<$d>([self.n, self.c_in], &self.size), (-1.0, 1.0))
                    .require_grad();
                let w = ctx
                    .f(
                        shape::<$d>([self.c_out, self.c_in / self.groups], &self.kernel),
                        (-1.0, 1.0),
                    )
                    .require_grad();
                let b = self
                    .bias
                    .then(|| ctx.f([self.c_out], (-1.0, 1.0)).require_grad());
                let opts = ConvOptions::new(self.stride, self.padding, self.dilation, self.groups);
                let y = $f(x.clone(), w.clone(), b.clone(), opts);
                let g = backward_weighted(ctx, y.clone());
                outs((y, x.grad(&g), w.grad(&g), b.and_then(|b| b.grad(&g))))
            }
        }
    };
}
conv_case!(1, 3, conv1d_checked);

/// `conv1d`; on the reference side through `conv2d` with a trailing unit dimension, because
/// burn-ndarray's grouped conv1d gradient fails for strides above the kernel size.
fn conv1d_checked<B: Backend>(
    x: Tensor<B, 3>,
    w: Tensor<B, 3>,
    b: Option<Tensor<B, 1>>,
    opts: ConvOptions<1>,
) -> Tensor<B, 3> {
    if std::any::type_name::<B>().contains("NdArray") {
        let opts2 = ConvOptions::new(
            [opts.stride[0], 1],
            [opts.padding[0], 0],
            [opts.dilation[0], 1],
            opts.groups,
        );
        module::conv2d(x.unsqueeze_dim(3), w.unsqueeze_dim(3), b, opts2).squeeze_dim(3)
    } else {
        module::conv1d(x, w, b, opts)
    }
}
conv_case!(2, 4, module::conv2d);
conv_case!(3, 5, module::conv3d);

#[test]
fn conv1d_forward_and_grads() {
    let c = |n, c_in, c_out, size, kernel, stride, padding, dilation, groups, bias| Conv::<1> {
        n,
        c_in,
        c_out,
        size: [size],
        kernel: [kernel],
        stride: [stride],
        padding: [padding],
        dilation: [dilation],
        groups,
        bias,
    };
    let cases = [
        c(2, 3, 4, 9, 3, 1, 1, 1, 1, true),
        c(1, 4, 6, 11, 2, 3, 2, 2, 2, true),
        c(3, 6, 6, 7, 1, 4, 0, 1, 3, false),
        c(1, 2, 3, 5, 3, 1, 4, 1, 1, true),
    ];
    sweep_ad("conv1d", &cases, &[DType::F32, DType::F64], TOL);
}

#[test]
fn conv2d_forward_and_grads() {
    let c = |n, c_in, c_out, size, kernel, stride, padding, dilation, groups, bias| Conv::<2> {
        n,
        c_in,
        c_out,
        size,
        kernel,
        stride,
        padding,
        dilation,
        groups,
        bias,
    };
    let cases = [
        c(2, 3, 4, [7, 6], [3, 3], [1, 1], [1, 1], [1, 1], 1, true),
        // stride > kernel, dilation, groups
        c(1, 4, 6, [9, 8], [3, 2], [2, 3], [2, 1], [1, 2], 2, true),
        c(2, 6, 6, [5, 5], [1, 1], [3, 3], [0, 0], [1, 1], 3, false),
        // padding > kernel
        c(1, 2, 3, [4, 5], [2, 3], [1, 1], [3, 3], [1, 1], 1, true),
        // depthwise, odd sizes
        c(3, 4, 4, [8, 7], [3, 3], [2, 2], [1, 2], [2, 1], 4, true),
        c(1, 1, 1, [1, 1], [1, 1], [1, 1], [0, 0], [1, 1], 1, false),
    ];
    sweep_ad("conv2d", &cases, &[DType::F32, DType::F64], TOL);
}

#[test]
fn conv3d_forward_and_grads() {
    let c = |n, c_in, c_out, size, kernel, stride, padding, dilation, groups, bias| Conv::<3> {
        n,
        c_in,
        c_out,
        size,
        kernel,
        stride,
        padding,
        dilation,
        groups,
        bias,
    };
    let cases = [
        c(
            2,
            2,
            3,
            [4, 5, 4],
            [2, 3, 2],
            [1, 1, 1],
            [1, 1, 0],
            [1, 1, 1],
            1,
            true,
        ),
        c(
            1,
            4,
            6,
            [6, 5, 7],
            [3, 2, 2],
            [2, 3, 1],
            [1, 0, 2],
            [1, 2, 1],
            2,
            true,
        ),
        c(
            1,
            3,
            3,
            [3, 4, 3],
            [1, 2, 1],
            [2, 1, 3],
            [0, 1, 1],
            [1, 1, 1],
            3,
            false,
        ),
    ];
    sweep_ad("conv3d", &cases, &[DType::F32], TOL);
}

/// A transposed convolution of N spatial dims.
#[derive(Debug, Clone)]
struct ConvT<const N: usize> {
    n: usize,
    c_in: usize,
    c_out: usize,
    size: [usize; N],
    kernel: [usize; N],
    stride: [usize; N],
    padding: [usize; N],
    padding_out: [usize; N],
    dilation: [usize; N],
    groups: usize,
    bias: bool,
}

macro_rules! conv_t_case {
    ($n:literal, $d:literal, $f:path) => {
        impl AdCase for ConvT<$n> {
            fn run<B: AutodiffBackend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
                let x = ctx
                    .f(shape::<$d>([self.n, self.c_in], &self.size), (-1.0, 1.0))
                    .require_grad();
                let w = ctx
                    .f(
                        shape::<$d>([self.c_in, self.c_out / self.groups], &self.kernel),
                        (-1.0, 1.0),
                    )
                    .require_grad();
                let b = self
                    .bias
                    .then(|| ctx.f([self.c_out], (-1.0, 1.0)).require_grad());
                let opts = ConvTransposeOptions::new(
                    self.stride,
                    self.padding,
                    self.padding_out,
                    self.dilation,
                    self.groups,
                );
                let y = $f(x.clone(), w.clone(), b.clone(), opts);
                let g = backward_weighted(ctx, y.clone());
                outs((y, x.grad(&g), w.grad(&g), b.and_then(|b| b.grad(&g))))
            }
        }
    };
}
conv_t_case!(1, 3, module::conv_transpose1d);
conv_t_case!(2, 4, module::conv_transpose2d);
conv_t_case!(3, 5, module::conv_transpose3d);

#[test]
fn conv_transpose1d_forward_and_grads() {
    let c =
        |n, c_in, c_out, size, kernel, stride, padding, padding_out, dilation, groups| ConvT::<1> {
            n,
            c_in,
            c_out,
            size: [size],
            kernel: [kernel],
            stride: [stride],
            padding: [padding],
            padding_out: [padding_out],
            dilation: [dilation],
            groups,
            bias: true,
        };
    let cases = [
        c(2, 3, 4, 6, 3, 1, 0, 0, 1, 1),
        c(1, 4, 6, 7, 3, 2, 1, 1, 2, 2),
        c(2, 2, 2, 5, 2, 3, 1, 2, 1, 2),
    ];
    sweep_ad("conv_transpose1d", &cases, &[DType::F32, DType::F64], TOL);
}

#[test]
fn conv_transpose2d_forward_and_grads() {
    let c = |n, c_in, c_out, size, kernel, stride, padding, padding_out, dilation, groups, bias| {
        ConvT::<2> {
            n,
            c_in,
            c_out,
            size,
            kernel,
            stride,
            padding,
            padding_out,
            dilation,
            groups,
            bias,
        }
    };
    let cases = [
        c(
            2,
            3,
            4,
            [5, 4],
            [3, 3],
            [1, 1],
            [0, 0],
            [0, 0],
            [1, 1],
            1,
            true,
        ),
        c(
            1,
            4,
            6,
            [5, 6],
            [3, 2],
            [2, 3],
            [1, 1],
            [1, 2],
            [2, 1],
            2,
            true,
        ),
        c(
            2,
            6,
            3,
            [3, 4],
            [2, 2],
            [2, 2],
            [1, 0],
            [0, 1],
            [1, 1],
            3,
            false,
        ),
        // padding larger than the kernel reach
        c(
            1,
            2,
            2,
            [6, 6],
            [2, 2],
            [3, 3],
            [2, 2],
            [0, 0],
            [1, 1],
            1,
            true,
        ),
        c(
            1,
            1,
            1,
            [1, 1],
            [1, 1],
            [1, 1],
            [0, 0],
            [0, 0],
            [1, 1],
            1,
            true,
        ),
    ];
    sweep_ad("conv_transpose2d", &cases, &[DType::F32, DType::F64], TOL);
}

#[test]
fn conv_transpose3d_forward_and_grads() {
    let c =
        |n, c_in, c_out, size, kernel, stride, padding, padding_out, dilation, groups| ConvT::<3> {
            n,
            c_in,
            c_out,
            size,
            kernel,
            stride,
            padding,
            padding_out,
            dilation,
            groups,
            bias: true,
        };
    let cases = [
        c(
            1,
            2,
            3,
            [3, 4, 3],
            [2, 2, 3],
            [1, 1, 1],
            [0, 1, 1],
            [0, 0, 0],
            [1, 1, 1],
            1,
        ),
        c(
            2,
            4,
            4,
            [3, 3, 4],
            [2, 3, 2],
            [2, 1, 2],
            [1, 1, 0],
            [1, 0, 1],
            [1, 2, 1],
            2,
        ),
    ];
    sweep_ad("conv_transpose3d", &cases, &[DType::F32], TOL);
}

// ---------------------------------------------------------------------------------------------
// Pooling
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct MaxPool {
    shape: [usize; 4],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    ceil: bool,
}

impl AdCase for MaxPool {
    fn run<B: AutodiffBackend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        let x = ctx.f(self.shape, (-1.0, 1.0)).require_grad();
        let y = module::max_pool2d(
            x.clone(),
            self.kernel,
            self.stride,
            self.padding,
            self.dilation,
            self.ceil,
        );
        let g = backward_weighted(ctx, y.clone());
        outs((y, x.grad(&g)))
    }
}

impl Case for MaxPool {
    fn run<B: Backend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        let x = ctx.f(self.shape, (-1.0, 1.0));
        let (y, idx) = module::max_pool2d_with_indices(
            x,
            self.kernel,
            self.stride,
            self.padding,
            self.dilation,
            self.ceil,
        );
        outs((y, idx))
    }
}

fn max_pool_cases() -> Vec<MaxPool> {
    let c = |shape, kernel, stride, padding, dilation, ceil| MaxPool {
        shape,
        kernel,
        stride,
        padding,
        dilation,
        ceil,
    };
    vec![
        c([2, 3, 8, 8], [2, 2], [2, 2], [0, 0], [1, 1], false),
        c([1, 2, 7, 9], [3, 2], [2, 3], [1, 1], [1, 1], false),
        c([2, 2, 7, 9], [3, 3], [2, 2], [1, 1], [1, 1], true),
        c([1, 3, 9, 8], [3, 2], [1, 2], [1, 0], [2, 3], false),
        // stride > kernel
        c([1, 2, 10, 11], [2, 2], [3, 4], [0, 1], [1, 1], true),
        c([3, 1, 5, 5], [5, 5], [1, 1], [2, 2], [1, 1], false),
        c([1, 1, 1, 1], [1, 1], [1, 1], [0, 0], [1, 1], false),
    ]
}

#[test]
fn max_pool2d_forward_and_grads() {
    sweep_ad(
        "max_pool2d",
        &max_pool_cases(),
        &[DType::F32, DType::F64],
        TOL,
    );
}

#[test]
fn max_pool2d_with_indices_matches() {
    sweep(
        "max_pool2d_with_indices",
        &max_pool_cases(),
        &[DType::F32],
        TOL,
    );
}

#[derive(Debug, Clone)]
struct AvgPool {
    shape: [usize; 4],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    include_pad: bool,
    ceil: bool,
}

impl AdCase for AvgPool {
    fn run<B: AutodiffBackend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        let x = ctx.f(self.shape, (-1.0, 1.0)).require_grad();
        let y = module::avg_pool2d(
            x.clone(),
            self.kernel,
            self.stride,
            self.padding,
            self.include_pad,
            self.ceil,
        );
        let g = backward_weighted(ctx, y.clone());
        outs((y, x.grad(&g)))
    }
}

#[test]
fn avg_pool2d_forward_and_grads() {
    let mut cases = Vec::new();
    for include_pad in [true, false] {
        for ceil in [false, true] {
            let c = |shape, kernel, stride, padding| AvgPool {
                shape,
                kernel,
                stride,
                padding,
                include_pad,
                ceil,
            };
            cases.push(c([2, 3, 8, 8], [2, 2], [2, 2], [0, 0]));
            cases.push(c([1, 2, 7, 9], [3, 2], [2, 3], [1, 1]));
            cases.push(c([2, 2, 7, 6], [3, 3], [2, 2], [1, 1]));
            // (with ceil_mode, every window still starts inside the padded input)
            cases.push(c([1, 2, 12, 12], [2, 3], [3, 4], [1, 1]));
            cases.push(c([1, 1, 5, 4], [5, 4], [1, 1], [2, 2]));
        }
    }
    sweep_ad("avg_pool2d", &cases, &[DType::F32, DType::F64], TOL);
}

#[derive(Debug, Clone)]
struct AdaptivePool {
    shape: [usize; 4],
    out: [usize; 2],
}

impl AdCase for AdaptivePool {
    fn run<B: AutodiffBackend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        let x = ctx.f(self.shape, (-1.0, 1.0)).require_grad();
        let y = module::adaptive_avg_pool2d(x.clone(), self.out);
        let g = backward_weighted(ctx, y.clone());
        outs((y, x.grad(&g)))
    }
}

#[test]
fn adaptive_avg_pool2d_forward_and_grads() {
    let c = |shape, out| AdaptivePool { shape, out };
    let cases = [
        c([2, 3, 8, 8], [4, 2]),
        c([2, 3, 8, 8], [1, 1]),
        c([1, 2, 7, 9], [3, 4]),
        c([1, 2, 5, 5], [7, 6]),
        c([3, 1, 6, 7], [6, 7]),
        c([1, 1, 1, 1], [2, 3]),
    ];
    sweep_ad(
        "adaptive_avg_pool2d",
        &cases,
        &[DType::F32, DType::F64],
        TOL,
    );
}

/// The 1-d pooling ops (Burn's defaults, through the 2-d ops).
#[derive(Debug, Clone)]
struct Pool1d {
    shape: [usize; 3],
    kernel: usize,
    stride: usize,
    padding: usize,
}

impl AdCase for Pool1d {
    fn run<B: AutodiffBackend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        let x = ctx.f(self.shape, (-1.0, 1.0)).require_grad();
        let (k, s, p) = (self.kernel, self.stride, self.padding);
        let a = module::max_pool1d(x.clone(), k, s, p, 1, false);
        let b = module::avg_pool1d(x.clone(), k, s, p, true, false);
        let c = module::adaptive_avg_pool1d(x.clone(), 3);
        let y = Tensor::cat(vec![a.clone(), b.clone()], 2);
        let g = backward_weighted(ctx, Tensor::cat(vec![y, c.clone()], 2));
        outs((a, b, c, x.grad(&g)))
    }
}

#[test]
fn pool1d_forward_and_grads() {
    let c = |shape, kernel, stride, padding| Pool1d {
        shape,
        kernel,
        stride,
        padding,
    };
    let cases = [c([2, 3, 9], 3, 2, 1), c([1, 2, 10], 2, 3, 0)];
    sweep_ad("pool1d", &cases, &[DType::F32], TOL);
}

// ---------------------------------------------------------------------------------------------
// Interpolation
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Interp {
    shape: [usize; 4],
    out: [usize; 2],
    mode: u8,
    align: bool,
}

fn interp_options(mode: u8, align: bool) -> InterpolateOptions {
    let mode = match mode {
        0 => InterpolateMode::Nearest,
        1 => InterpolateMode::Bilinear,
        2 => InterpolateMode::Bicubic,
        _ => InterpolateMode::Lanczos3,
    };
    InterpolateOptions::new(mode).with_align_corners(align)
}

impl AdCase for Interp {
    fn run<B: AutodiffBackend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        let opts = || interp_options(self.mode, self.align);
        let x = ctx.f(self.shape, (-1.0, 1.0)).require_grad();
        let y = module::interpolate(x.clone(), self.out, opts());
        let w = ctx.f_like(&y, (-1.0, 1.0));
        let [n, c, h, wd] = self.shape;
        let [oh, ow] = self.out;
        let grad = if ctx.is_ref {
            // burn-ndarray has no interpolate backward for most modes: the gradient is the
            // transpose of the linear map, read off the images of the basis inputs.
            let k = h * wd;
            let mut eye = vec![0.0f64; k * k];
            for i in 0..k {
                eye[i * k + i] = 1.0;
            }
            let basis: Tensor<B, 4> = ctx.fd(TensorData::new(eye, [k, 1, h, wd]));
            let images = module::interpolate(basis, self.out, opts()).reshape([k, oh * ow]);
            w.clone()
                .reshape([n * c, oh * ow])
                .matmul(images.transpose())
                .reshape([n, c, h, wd])
                .into_data()
        } else {
            let g = (y.clone() * w).sum().backward();
            x.grad(&g).expect("interpolate: no gradient").into_data()
        };
        outs((y, grad))
    }
}

#[test]
fn interpolate_forward_and_grads() {
    let mut cases = Vec::new();
    for mode in 0..4u8 {
        for align in [true, false] {
            for (shape, out) in [
                ([2, 3, 5, 7], [9, 4]),
                ([1, 2, 8, 6], [3, 11]),
                ([1, 1, 4, 4], [4, 4]),
                ([2, 1, 3, 5], [1, 2]),
                ([1, 2, 1, 1], [3, 2]),
            ] {
                cases.push(Interp {
                    shape,
                    out,
                    mode,
                    align,
                });
            }
        }
    }
    sweep_ad("interpolate", &cases, &[DType::F32, DType::F64], TOL);
}

// ---------------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Attn {
    b: usize,
    h: usize,
    /// Key/value heads (0: as many as `h`). Fewer is grouped-query attention, which `Mlx` takes
    /// as it is and the reference gets with the heads repeated.
    kv_h: usize,
    lq: usize,
    lk: usize,
    d: usize,
    dv: usize,
    mask: bool,
    /// Also mask every key of the first query row.
    dead_row: bool,
    bias: bool,
    causal: bool,
    scale: Option<f64>,
    softcap: Option<f64>,
}

impl Attn {
    #[allow(clippy::type_complexity)]
    fn inputs<B: Backend>(
        &self,
        ctx: &Ctx<B>,
    ) -> (
        Tensor<B, 4>,
        Tensor<B, 4>,
        Tensor<B, 4>,
        Option<Tensor<B, 4, burn_tensor::Bool>>,
        Option<Tensor<B, 4>>,
        AttentionModuleOptions,
    ) {
        let kv_h = if self.kv_h == 0 { self.h } else { self.kv_h };
        let q = ctx.f([self.b, self.h, self.lq, self.d], (-1.0, 1.0));
        let k: Tensor<B, 4> = ctx.f([self.b, kv_h, self.lk, self.d], (-1.0, 1.0));
        let v: Tensor<B, 4> = ctx.f([self.b, kv_h, self.lk, self.dv], (-1.0, 1.0));
        let repeat = |x: Tensor<B, 4>| {
            let [b, kh, t, d] = x.dims();
            if !ctx.is_ref || kh == self.h {
                return x;
            }
            x.unsqueeze_dim::<5>(2)
                .expand([b, kh, self.h / kh, t, d])
                .reshape([b, self.h, t, d])
        };
        let (k, v) = (repeat(k), repeat(v));
        let mask = self.mask.then(|| {
            let shape = [self.b, self.h, self.lq, self.lk];
            let mut data = rand_b(&shape, 0.3, ctx.seed());
            if self.dead_row {
                let mut v: Vec<bool> = data.iter::<bool>().collect();
                for bh in 0..self.b * self.h {
                    for j in 0..self.lk {
                        v[bh * self.lq * self.lk + j] = true;
                    }
                }
                data = TensorData::new(v, shape);
            }
            ctx.bd(data)
        });
        let bias = self
            .bias
            .then(|| ctx.f([self.b, self.h, self.lq, self.lk], (-1.0, 1.0)));
        let options = AttentionModuleOptions {
            scale: self.scale,
            softcap: self.softcap,
            is_causal: self.causal,
        };
        (q, k, v, mask, bias, options)
    }
}

impl Case for Attn {
    fn run<B: Backend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        let (q, k, v, mask, bias, options) = self.inputs(ctx);
        outs(module::attention(q, k, v, mask, bias, options))
    }
}

impl AdCase for Attn {
    fn run<B: AutodiffBackend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        let (q, k, v, mask, bias, options) = self.inputs(ctx);
        let (q, k, v) = (q.require_grad(), k.require_grad(), v.require_grad());
        let y = module::attention(q.clone(), k.clone(), v.clone(), mask, bias, options);
        let g = backward_weighted(ctx, y.clone());
        outs((y, q.grad(&g), k.grad(&g), v.grad(&g)))
    }
}

fn attn_cases() -> Vec<Attn> {
    let base = Attn {
        b: 2,
        h: 3,
        kv_h: 0,
        lq: 5,
        lk: 7,
        d: 8,
        dv: 8,
        mask: false,
        dead_row: false,
        bias: false,
        causal: false,
        scale: None,
        softcap: None,
    };
    vec![
        base.clone(),
        Attn {
            mask: true,
            ..base.clone()
        },
        Attn {
            mask: true,
            dead_row: true,
            ..base.clone()
        },
        Attn {
            bias: true,
            ..base.clone()
        },
        Attn {
            mask: true,
            bias: true,
            ..base.clone()
        },
        Attn {
            causal: true,
            ..base.clone()
        },
        Attn {
            causal: true,
            lq: 7,
            ..base.clone()
        },
        // more queries than keys: the first rows are fully masked
        Attn {
            causal: true,
            lq: 9,
            ..base.clone()
        },
        Attn {
            causal: true,
            mask: true,
            bias: true,
            ..base.clone()
        },
        Attn {
            scale: Some(0.3),
            dv: 5,
            ..base.clone()
        },
        Attn {
            softcap: Some(2.0),
            mask: true,
            ..base.clone()
        },
        Attn {
            softcap: Some(1.5),
            causal: true,
            ..base.clone()
        },
        Attn {
            b: 1,
            h: 1,
            lq: 1,
            lk: 1,
            d: 3,
            dv: 2,
            ..base.clone()
        },
        // 2 and 3 unmasked queries: Mlx runs them as one query on each of h·lq heads
        Attn {
            lq: 2,
            dv: 5,
            ..base.clone()
        },
        Attn {
            lq: 3,
            scale: Some(0.3),
            ..base
        },
    ]
}

#[test]
fn attention_forward() {
    sweep("attention", &attn_cases(), &[DType::F32], TOL);
}

/// Grouped-query attention (key/value heads dividing the query heads), forward only: Burn's
/// autodiff computes attention from matmuls, which need equal heads.
#[test]
fn attention_grouped_heads() {
    let base = Attn {
        h: 6,
        kv_h: 2,
        ..attn_cases()[0].clone()
    };
    let cases = vec![
        base.clone(),
        Attn {
            causal: true,
            lq: 7,
            ..base.clone()
        },
        Attn {
            mask: true,
            bias: true,
            ..base.clone()
        },
        Attn {
            softcap: Some(2.0),
            causal: true,
            ..base.clone()
        },
        Attn {
            lq: 1,
            kv_h: 3,
            ..base.clone()
        },
        Attn {
            lq: 2,
            kv_h: 1,
            ..base
        },
    ];
    sweep("attention_grouped", &cases, &[DType::F32], TOL);
}

#[test]
fn attention_grads() {
    sweep_ad("attention_grads", &attn_cases(), &[DType::F32], TOL);
}

// ---------------------------------------------------------------------------------------------
// burn_mlx::fast: MLX's fused kernels on `Mlx`, Burn's ops composed on the reference (and under
// autodiff, where the composed form runs on both sides)
// ---------------------------------------------------------------------------------------------

/// `fast::rms_norm`, `fast::RotaryEmbedding` (at a host and at a device position) and
/// `fast::swiglu` on `[b, h, s, d]`, rope at position `offset`; `fast::slice_assign_at` into a
/// longer buffer.
#[derive(Debug, Clone)]
struct Fast {
    shape: [usize; 4],
    offset: usize,
    /// Inverse frequencies `theta^(-2i/d)`, scaled by `scale` on the upper half (a stand-in
    /// for Llama 3's rescaling: frequencies that are not a geometric series).
    theta: f64,
    scale: f64,
}

impl Fast {
    fn frequencies(&self) -> Vec<f64> {
        let d = self.shape[3];
        (0..d / 2)
            .map(|i| {
                let f = self.theta.powf(-((2 * i) as f64) / d as f64);
                if i >= d / 4 {
                    f / self.scale
                } else {
                    f
                }
            })
            .collect()
    }

    fn inputs<B: Backend>(&self, ctx: &Ctx<B>) -> (Tensor<B, 4>, Tensor<B, 1>) {
        let x = ctx.f(self.shape, (-2.0, 2.0));
        let w = ctx.f([self.shape[3]], (0.5, 1.5));
        (x, w)
    }

    fn outputs<B: Backend>(
        &self,
        x: Tensor<B, 4>,
        w: Tensor<B, 1>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
        let device = x.device();
        let rope = burn_mlx::fast::RotaryEmbedding::<B>::new(&self.frequencies(), &device);
        let normed = burn_mlx::fast::rms_norm(x.clone(), w, 1e-6);
        let at = Tensor::<B, 1, Int>::from_ints([self.offset as i32], &device);
        let gated = burn_mlx::fast::swiglu(x.clone(), normed.clone());
        (
            normed,
            rope.apply(x.clone(), self.offset),
            rope.apply_at(x, at),
            gated,
        )
    }
}

impl Case for Fast {
    fn run<B: Backend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        let (x, w) = self.inputs(ctx);
        // The position-as-tensor write: `x` into a longer buffer along axis 2 at position 2.
        let [a, b, s, d] = self.shape;
        let buffer = ctx.f([a, b, s + 3, d], (-1.0, 1.0));
        let device = x.device();
        let written = burn_mlx::fast::slice_assign_at(
            buffer,
            x.clone(),
            2,
            Tensor::<B, 1, Int>::from_ints([2], &device),
        );
        let (normed, rotated, rotated_at, gated) = self.outputs(x, w);
        outs((normed, rotated, rotated_at, gated, written))
    }
}

impl AdCase for Fast {
    fn run<B: AutodiffBackend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        let (x, w) = self.inputs(ctx);
        let (x, w) = (x.require_grad(), w.require_grad());
        let (normed, rotated, rotated_at, gated) = self.outputs(x.clone(), w.clone());
        let sum = normed.clone() + rotated.clone() + rotated_at.clone() + gated.clone();
        let g = backward_weighted(ctx, sum);
        outs((normed, rotated, rotated_at, gated, x.grad(&g), w.grad(&g)))
    }
}

fn fast_cases() -> Vec<Fast> {
    let base = Fast {
        shape: [1, 3, 5, 8],
        offset: 0,
        theta: 10_000.0,
        scale: 1.0,
    };
    vec![
        base.clone(),
        Fast {
            offset: 37,
            ..base.clone()
        },
        Fast {
            shape: [2, 4, 1, 64],
            offset: 1000,
            theta: 1_000_000.0,
            scale: 8.0,
        },
        Fast {
            shape: [1, 2, 9, 128],
            offset: 3,
            theta: 500_000.0,
            scale: 4.0,
        },
    ]
}

#[test]
fn fast_kernels_match_composed_ops() {
    // Angles up to ~1000 rad in f32: both sides round them alike only to ~1e-4.
    sweep(
        "fast",
        &fast_cases(),
        &[DType::F32, DType::F16, DType::BF16],
        Tol::LOOSE,
    );
}

/// `slice_assign_at` with an offset that would run past the end: clamped on `Mlx` (MLX's op
/// does not check), a clear panic on a backend that reads the offset on the host.
#[test]
fn slice_assign_at_past_the_end() {
    fn write<B: Backend>(device: &B::Device) -> Vec<f32> {
        let buffer = Tensor::<B, 2>::zeros([1, 4], device);
        let update = Tensor::<B, 2>::from_floats([[1.0, 2.0]], device);
        let at = Tensor::<B, 1, Int>::from_ints([10], device);
        burn_mlx::fast::slice_assign_at(buffer, update, 1, at)
            .into_data()
            .to_vec::<f32>()
            .unwrap()
    }
    assert_eq!(write::<TestB>(&Default::default()), [0.0, 0.0, 1.0, 2.0]);
    let err = std::panic::catch_unwind(|| write::<RefB>(&Default::default())).unwrap_err();
    let message = err.downcast_ref::<String>().expect("a formatted panic");
    assert!(
        message.contains("offset 10 + 2 positions run past"),
        "{message}"
    );
}

#[test]
fn fast_kernels_grads() {
    sweep_ad("fast_grads", &fast_cases(), &[DType::F32], Tol::LOOSE);
}

// ---------------------------------------------------------------------------------------------
// FFT (burn-ndarray has none: the reference is a DFT by matmul)
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Fft {
    shape: [usize; 3],
    dim: usize,
    n: Option<usize>,
}

/// `x` with `dim` resized to `len` (truncated, or zero-padded at the end).
fn resize_dim<B: Backend>(x: Tensor<B, 3>, dim: usize, len: usize) -> Tensor<B, 3> {
    let cur = x.dims()[dim];
    if len <= cur {
        x.slice_dim(dim, 0..len)
    } else {
        let mut s = x.dims();
        s[dim] = len - cur;
        let z = Tensor::zeros(s, (&x.device(), x.dtype()));
        Tensor::cat(vec![x, z], dim)
    }
}

/// Applies `[in, out]` matrix `m` along `dim` of `x`.
fn along<B: Backend>(x: Tensor<B, 3>, dim: usize, m: Tensor<B, 2>) -> Tensor<B, 3> {
    let x = x.swap_dims(dim, 2);
    let [a, b, c] = x.dims();
    let out = m.dims()[1];
    x.reshape([a * b, c])
        .matmul(m)
        .reshape([a, b, out])
        .swap_dims(dim, 2)
}

impl Case for Fft {
    fn run<B: Backend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        let x = ctx.f(self.shape, (-1.0, 1.0));
        let len = self.n.unwrap_or(self.shape[self.dim]);
        let bins = len / 2 + 1;
        // A spectrum to invert: random, with real DC and Nyquist bins.
        let mut sshape = self.shape;
        sshape[self.dim] = bins;
        let sre = ctx.f(sshape, (-1.0, 1.0));
        let mut im: Vec<f64> = rand_f(&sshape, (-1.0, 1.0), ctx.seed())
            .iter::<f64>()
            .collect();
        let strides = [sshape[1] * sshape[2], sshape[2], 1];
        for (i, v) in im.iter_mut().enumerate() {
            let k = (i / strides[self.dim]) % bins;
            if k == 0 || (len.is_multiple_of(2) && k == len / 2) {
                *v = 0.0;
            }
        }
        let sim: Tensor<B, 3> = ctx.fd(TensorData::new(im, sshape));
        if ctx.is_ref {
            let tau = std::f64::consts::TAU;
            let (mut c, mut s) = (Vec::new(), Vec::new());
            for t in 0..len {
                for k in 0..bins {
                    let a = tau * (k * t) as f64 / len as f64;
                    c.push(a.cos());
                    s.push(-a.sin());
                }
            }
            let cm: Tensor<B, 2> = ctx.fd(TensorData::new(c, [len, bins]));
            let sm: Tensor<B, 2> = ctx.fd(TensorData::new(s, [len, bins]));
            let xr = resize_dim(x, self.dim, len);
            let re = along(xr.clone(), self.dim, cm);
            let imag = along(xr, self.dim, sm);
            let (mut ic, mut is) = (Vec::new(), Vec::new());
            for k in 0..bins {
                let wgt = if k == 0 || (len.is_multiple_of(2) && k == len / 2) {
                    1.0
                } else {
                    2.0
                };
                for t in 0..len {
                    let a = tau * (k * t) as f64 / len as f64;
                    ic.push(wgt * a.cos() / len as f64);
                    is.push(-wgt * a.sin() / len as f64);
                }
            }
            let icm: Tensor<B, 2> = ctx.fd(TensorData::new(ic, [bins, len]));
            let ism: Tensor<B, 2> = ctx.fd(TensorData::new(is, [bins, len]));
            let inv = along(sre, self.dim, icm) + along(sim, self.dim, ism);
            outs((re, imag, inv))
        } else {
            let (re, imag) = burn_tensor::signal::rfft(x, self.dim, self.n);
            let inv = burn_tensor::signal::irfft(sre, sim, self.dim, self.n);
            outs((re, imag, inv))
        }
    }
}

#[test]
fn rfft_irfft_match_dft() {
    let c = |shape, dim, n| Fft { shape, dim, n };
    let cases = [
        c([2, 3, 8], 2, None),
        c([4, 16, 3], 1, None),
        c([8, 2, 3], 0, None),
        c([2, 3, 8], 2, Some(4)),
        c([2, 3, 8], 2, Some(16)),
        c([2, 5, 3], 1, Some(8)),
        c([1, 1, 2], 2, None),
    ];
    sweep("rfft", &cases, &[DType::F32], TOL);
}

// ---------------------------------------------------------------------------------------------
// Deformable convolution
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Deform {
    n: usize,
    c_in: usize,
    c_out: usize,
    size: [usize; 2],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    weight_groups: usize,
    offset_groups: usize,
    mask: bool,
    bias: bool,
}

impl AdCase for Deform {
    fn run<B: AutodiffBackend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        let [kh, kw] = self.kernel;
        let out: [usize; 2] = std::array::from_fn(|i| {
            (self.size[i] + 2 * self.padding[i] - self.dilation[i] * (self.kernel[i] - 1) - 1)
                / self.stride[i]
                + 1
        });
        let x = ctx
            .f([self.n, self.c_in, self.size[0], self.size[1]], (-1.0, 1.0))
            .require_grad();
        let offset = ctx
            .f(
                [self.n, 2 * self.offset_groups * kh * kw, out[0], out[1]],
                (-2.5, 2.5),
            )
            .require_grad();
        let w = ctx
            .f(
                [self.c_out, self.c_in / self.weight_groups, kh, kw],
                (-1.0, 1.0),
            )
            .require_grad();
        let mask = self.mask.then(|| {
            ctx.f(
                [self.n, self.offset_groups * kh * kw, out[0], out[1]],
                (0.0, 1.0),
            )
            .require_grad()
        });
        let b = self
            .bias
            .then(|| ctx.f([self.c_out], (-1.0, 1.0)).require_grad());
        let opts = DeformConvOptions::new(
            self.stride,
            self.padding,
            self.dilation,
            self.weight_groups,
            self.offset_groups,
        );
        let y = if ctx.is_ref && self.offset_groups > 1 {
            // burn-ndarray's offset and mask gradients read the wrong channels when there are
            // several offset groups: the reference splits the convolution per offset group.
            self.split_reference(&x, &offset, &w, mask.as_ref(), b.as_ref(), opts)
        } else {
            module::deform_conv2d(
                x.clone(),
                offset.clone(),
                w.clone(),
                mask.clone(),
                b.clone(),
                opts,
            )
        };
        let g = backward_weighted(ctx, y.clone());
        outs((
            y,
            x.grad(&g),
            offset.grad(&g),
            w.grad(&g),
            mask.and_then(|m| m.grad(&g)),
            b.and_then(|b| b.grad(&g)),
        ))
    }
}

impl Deform {
    /// The deformable convolution as one convolution per offset group (each with a single
    /// offset group), for `weight_groups` equal to 1 or to `offset_groups`.
    fn split_reference<B: Backend>(
        &self,
        x: &Tensor<B, 4>,
        offset: &Tensor<B, 4>,
        w: &Tensor<B, 4>,
        mask: Option<&Tensor<B, 4>>,
        b: Option<&Tensor<B, 1>>,
        opts: DeformConvOptions<2>,
    ) -> Tensor<B, 4> {
        let og = self.offset_groups;
        let cg = self.c_in / og;
        let taps = self.kernel[0] * self.kernel[1];
        assert!(self.weight_groups == 1 || self.weight_groups == og);
        let one = DeformConvOptions::new(opts.stride, opts.padding, opts.dilation, 1, 1);
        let parts: Vec<Tensor<B, 4>> = (0..og)
            .map(|g| {
                let xg = x.clone().slice_dim(1, g * cg..(g + 1) * cg);
                let og_off = offset
                    .clone()
                    .slice_dim(1, g * 2 * taps..(g + 1) * 2 * taps);
                let mg = mask.map(|m| m.clone().slice_dim(1, g * taps..(g + 1) * taps));
                let wg = if self.weight_groups == 1 {
                    w.clone().slice_dim(1, g * cg..(g + 1) * cg)
                } else {
                    let oc = self.c_out / og;
                    w.clone().slice_dim(0, g * oc..(g + 1) * oc)
                };
                module::deform_conv2d(xg, og_off, wg, mg, None, one.clone())
            })
            .collect();
        let y = if self.weight_groups == 1 {
            parts.into_iter().reduce(|a, c| a + c).unwrap()
        } else {
            Tensor::cat(parts, 1)
        };
        match b {
            Some(b) => y + b.clone().reshape([1, self.c_out, 1, 1]),
            None => y,
        }
    }
}

#[test]
fn deform_conv2d_forward_and_grads() {
    let base = Deform {
        n: 2,
        c_in: 3,
        c_out: 4,
        size: [6, 5],
        kernel: [3, 3],
        stride: [1, 1],
        padding: [1, 1],
        dilation: [1, 1],
        weight_groups: 1,
        offset_groups: 1,
        mask: false,
        bias: true,
    };
    let cases = [
        base.clone(),
        Deform {
            mask: true,
            ..base.clone()
        },
        Deform {
            c_in: 4,
            c_out: 6,
            size: [7, 6],
            kernel: [2, 3],
            stride: [2, 1],
            padding: [0, 2],
            dilation: [1, 2],
            weight_groups: 2,
            offset_groups: 2,
            mask: true,
            bias: false,
            ..base.clone()
        },
        Deform {
            n: 1,
            c_in: 2,
            c_out: 2,
            size: [4, 4],
            stride: [3, 3],
            ..base
        },
    ];
    sweep_ad("deform_conv2d", &cases, &[DType::F32], TOL);
}

// ---------------------------------------------------------------------------------------------
// Embedding and unfold (Burn's default compositions)
// ---------------------------------------------------------------------------------------------

diff_ad!(embedding_forward_and_grads, TOL, [DType::F32], |ctx| {
    let w = ctx.f([7, 5], (-1.0, 1.0)).require_grad();
    let idx = ctx.ri([3, 4], 7);
    let y = module::embedding(w.clone(), idx);
    let g = backward_weighted(ctx, y.clone());
    (y, w.grad(&g))
});

diff_ad!(unfold4d_forward_and_grads, TOL, [DType::F32], |ctx| {
    let x = ctx.f([2, 3, 7, 6], (-1.0, 1.0)).require_grad();
    let a = module::unfold4d(
        x.clone(),
        [2, 3],
        UnfoldOptions::new([1, 2], [0, 0], [1, 1]),
    );
    let b = module::unfold4d(
        x.clone(),
        [3, 2],
        UnfoldOptions::new([2, 1], [1, 2], [2, 1]),
    );
    let g = backward_weighted(ctx, Tensor::cat(vec![a.clone(), b.clone()], 2));
    (a, b, x.grad(&g))
});

// ---------------------------------------------------------------------------------------------
// burn-nn layers on Mlx against NdArray
// ---------------------------------------------------------------------------------------------

/// Replaces every float parameter with seeded random values (the same on both backends).
struct Reinit {
    seed: u64,
}

impl<B: Backend> ModuleMapper<B> for Reinit {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, _) = param.consume();
        self.seed = self.seed.wrapping_add(0x9E37_79B9);
        let data = rand_f(&tensor.dims(), (-0.5, 0.5), self.seed).convert_dtype(tensor.dtype());
        let fresh = Tensor::from_data(data, (&tensor.device(), tensor.dtype()));
        Param::initialized(id, fresh.require_grad())
    }
}

/// Collects the gradient of every float parameter.
struct GradsOf<'a, B: AutodiffBackend> {
    grads: &'a B::Gradients,
    out: Vec<TensorData>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradsOf<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let g = param
            .val()
            .grad(self.grads)
            .expect("parameter without gradient");
        self.out.push(g.into_data());
    }
}

/// Forward output, input gradient and parameter gradients of a layer.
fn layer_outputs<B: AutodiffBackend, M: Module<B>, const D: usize, const E: usize>(
    ctx: &Ctx<B>,
    layer: M,
    input: [usize; D],
    forward: impl Fn(&M, Tensor<B, D>) -> Tensor<B, E>,
) -> Vec<TensorData> {
    let layer = layer.map(&mut Reinit { seed: 7 });
    let x = ctx.f(input, (-1.0, 1.0)).require_grad();
    let y = forward(&layer, x.clone());
    let g = backward_weighted(ctx, y.clone());
    let mut visitor = GradsOf::<B> {
        grads: &g,
        out: Vec::new(),
    };
    layer.visit(&mut visitor);
    let mut v = outs((y, x.grad(&g)));
    v.extend(visitor.out);
    v
}

diff_ad!(nn_conv2d, TOL, [DType::F32], |ctx| {
    let layer = burn_nn::conv::Conv2dConfig::new([4, 6], [3, 2])
        .with_stride([2, 1])
        .with_dilation([1, 2])
        .with_groups(2)
        .with_padding(burn_nn::PaddingConfig2d::Explicit(1, 2, 2, 1))
        .init::<B>(&ctx.dev);
    layer_outputs(ctx, layer, [2, 4, 9, 8], |m, x| m.forward(x))
});

diff_ad!(nn_conv_transpose2d, TOL, [DType::F32], |ctx| {
    let layer = burn_nn::conv::ConvTranspose2dConfig::new([4, 6], [3, 3])
        .with_stride([2, 2])
        .with_padding([1, 1])
        .with_padding_out([1, 0])
        .with_groups(2)
        .init::<B>(&ctx.dev);
    layer_outputs(ctx, layer, [2, 4, 5, 6], |m, x| m.forward(x))
});

diff_ad!(nn_pools, TOL, [DType::F32], |ctx| {
    let max = burn_nn::pool::MaxPool2dConfig::new([3, 3])
        .with_strides([2, 2])
        .with_padding(burn_nn::PaddingConfig2d::Explicit(1, 1, 1, 1))
        .init();
    let avg = burn_nn::pool::AvgPool2dConfig::new([2, 3])
        .with_strides([2, 2])
        .with_count_include_pad(false)
        .init();
    let adaptive = burn_nn::pool::AdaptiveAvgPool2dConfig::new([3, 5]).init();
    let x = ctx.f([2, 3, 9, 10], (-1.0, 1.0)).require_grad();
    let a = max.forward(x.clone());
    let b = avg.forward(x.clone());
    let c = adaptive.forward(x.clone());
    let y = Tensor::cat(
        vec![
            a.clone().flatten::<2>(1, 3),
            b.clone().flatten(1, 3),
            c.clone().flatten(1, 3),
        ],
        1,
    );
    let g = backward_weighted(ctx, y);
    (a, b, c, x.grad(&g))
});

diff!(nn_interpolate, TOL, [DType::F32], |ctx| {
    let x = ctx.f([2, 3, 5, 6], (-1.0, 1.0));
    use burn_nn::interpolate::InterpolateMode as M;
    let modes = [M::Nearest, M::Linear, M::Cubic];
    modes
        .into_iter()
        .map(|mode| {
            burn_nn::interpolate::Interpolate2dConfig::new()
                .with_output_size(Some([8, 4]))
                .with_mode(mode)
                .init()
                .forward(x.clone())
        })
        .collect::<Vec<_>>()
});

diff_ad!(nn_embedding, TOL, [DType::F32], |ctx| {
    let layer = burn_nn::EmbeddingConfig::new(11, 6).init::<B>(&ctx.dev);
    let layer = layer.map(&mut Reinit { seed: 3 });
    let idx = ctx.ri([3, 5], 11);
    let y = layer.forward(idx);
    let g = backward_weighted(ctx, y.clone());
    let mut visitor = GradsOf::<B> {
        grads: &g,
        out: Vec::new(),
    };
    layer.visit(&mut visitor);
    (y, visitor.out)
});

diff_ad!(nn_multi_head_attention, TOL, [DType::F32], |ctx| {
    let layer = burn_nn::attention::MultiHeadAttentionConfig::new(12, 3)
        .with_dropout(0.0)
        .init::<B>(&ctx.dev);
    let layer = layer.map(&mut Reinit { seed: 11 });
    let q = ctx.f([2, 5, 12], (-1.0, 1.0)).require_grad();
    let kv = ctx.f([2, 6, 12], (-1.0, 1.0)).require_grad();
    let mask = ctx.b([2, 6], 0.3);
    let input = burn_nn::attention::MhaInput::new(q.clone(), kv.clone(), kv.clone()).mask_pad(mask);
    let y = layer.forward(input).context;
    let g = backward_weighted(ctx, y.clone());
    let mut visitor = GradsOf::<B> {
        grads: &g,
        out: Vec::new(),
    };
    layer.visit(&mut visitor);
    (y, q.grad(&g), kv.grad(&g), visitor.out)
});
