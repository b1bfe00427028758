//! Shared helpers for the differential tests: the backend under test ([`TestB`], burn-mlx) against
//! the oracle ([`RefB`], burn-ndarray).
//!
//! A test is a body generic over the backend, run once on each side through a [`Case`]. Inputs come
//! from a seeded generator held by [`Ctx`], so both sides see the same values. Outputs are collected
//! as [`TensorData`] and compared: floats with an absolute + relative tolerance ([`Tol`]), ints and
//! bools exactly, dtypes and shapes always.
//!
//! burn-ndarray has no f16/bf16: on the reference side a half-precision case runs in f32 on inputs
//! already rounded to the half type, and the comparison uses the half type's tolerance.
//!
//! Test modules use the [`diff!`] / [`diff_ad!`] macros (declared first in `main.rs`, so every
//! module sees them), or implement [`Case`] / [`AdCase`] directly and call [`Failures::check`].
#![allow(dead_code, unused_macros, unused_imports)]

pub mod ndarray_rng;
pub mod op_stream;

use burn_backend::tensor::BasicOps;
use burn_tensor::backend::{AutodiffBackend, Backend};
use burn_tensor::{BoolStore, DType, Shape, Slice, Tensor, TensorData};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// `sum(y * w)` for a random `w` of y's shape, then backward: gradients that weigh every
/// output element differently.
pub fn backward_weighted<B: AutodiffBackend, const D: usize>(
    ctx: &Ctx<B>,
    y: Tensor<B, D>,
) -> B::Gradients {
    let w = ctx.f_like(&y, (-1.0, 1.0));
    (y * w).sum().backward()
}

/// The oracle backend.
pub type RefB = burn_ndarray::NdArray<f32>;
/// The backend under test.
pub type TestB = burn_mlx::Mlx;
/// Autodiff over the oracle.
pub type RefAd = burn_autodiff::Autodiff<RefB>;
/// Autodiff over the backend under test.
pub type TestAd = burn_autodiff::Autodiff<TestB>;

// ---------------------------------------------------------------------------------------------
// Seeded generator
// ---------------------------------------------------------------------------------------------

/// A small xorshift64* generator: deterministic, no dependencies.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Self {
        let mut s = seed
            .wrapping_add(0x9E37_79B9_7F4A_7C15)
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
        s ^= s >> 31;
        Rng(s | 1)
    }
    /// Next raw 64-bit value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
    /// Uniform integer in [lo, hi) (hi > lo).
    pub fn int(&mut self, lo: i64, hi: i64) -> i64 {
        assert!(hi > lo, "Rng::int: empty range {lo}..{hi}");
        lo + (self.next_u64() % ((hi - lo) as u64)) as i64
    }
    /// True with probability p.
    pub fn bool(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

/// How float test values are drawn.
#[derive(Clone, Copy, Debug)]
pub struct Dist {
    /// Lower bound.
    pub lo: f64,
    /// Upper bound.
    pub hi: f64,
    /// Values with |v| below this are pushed away from zero by it (0: off).
    pub away: f64,
    /// Round the values to this many steps per unit (0: off); creates exact ties.
    pub grid: f64,
}

impl Dist {
    /// Uniform in [lo, hi).
    pub const fn u(lo: f64, hi: f64) -> Self {
        Dist {
            lo,
            hi,
            away: 0.0,
            grid: 0.0,
        }
    }
    /// Uniform in [lo, hi), magnitudes of at least `away`.
    pub const fn nz(lo: f64, hi: f64, away: f64) -> Self {
        Dist {
            lo,
            hi,
            away,
            grid: 0.0,
        }
    }
    /// Uniform in [lo, hi), rounded to multiples of 1/steps (ties and exact integers).
    pub const fn grid(lo: f64, hi: f64, steps: f64) -> Self {
        Dist {
            lo,
            hi,
            away: 0.0,
            grid: steps,
        }
    }
    fn sample(&self, rng: &mut Rng) -> f64 {
        let mut v = rng.uniform(self.lo, self.hi);
        if self.grid > 0.0 {
            v = (v * self.grid).round() / self.grid;
        }
        if self.away > 0.0 && v.abs() < self.away {
            v = if v >= 0.0 {
                v + self.away
            } else {
                v - self.away
            };
        }
        v
    }
}

impl From<(f64, f64)> for Dist {
    fn from((lo, hi): (f64, f64)) -> Self {
        Dist::u(lo, hi)
    }
}

/// Random f64 data of `shape` from `dist`.
pub fn rand_f(shape: &[usize], dist: impl Into<Dist>, seed: u64) -> TensorData {
    let dist = dist.into();
    let mut rng = Rng::new(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|_| dist.sample(&mut rng)).collect();
    TensorData::new(v, shape.to_vec())
}

/// Random i64 data of `shape`, uniform in [lo, hi).
pub fn rand_i(shape: &[usize], lo: i64, hi: i64, seed: u64) -> TensorData {
    let mut rng = Rng::new(seed);
    let n: usize = shape.iter().product();
    let v: Vec<i64> = (0..n).map(|_| rng.int(lo, hi)).collect();
    TensorData::new(v, shape.to_vec())
}

/// Random bool data of `shape`, true with probability p.
pub fn rand_b(shape: &[usize], p: f64, seed: u64) -> TensorData {
    let mut rng = Rng::new(seed);
    let n: usize = shape.iter().product();
    let v: Vec<bool> = (0..n).map(|_| rng.bool(p)).collect();
    TensorData::new(v, shape.to_vec())
}

/// Replace some values of float data by the given specials (NaN, inf, -0.0, …), deterministically.
pub fn sprinkle(data: TensorData, specials: &[f64], every: usize, seed: u64) -> TensorData {
    let shape = data.shape.clone();
    let mut v: Vec<f64> = data.iter::<f64>().collect();
    let mut rng = Rng::new(seed ^ 0x5151);
    let mut k = 0;
    for (i, x) in v.iter_mut().enumerate() {
        if i % every.max(1) == (seed as usize) % every.max(1) {
            *x = specials[(k + rng.int(0, specials.len() as i64) as usize) % specials.len()];
            k += 1;
        }
    }
    TensorData::new(v, shape)
}

/// The float dtypes that tests sweep by default (f64 only where the device supports it: CPU).
pub const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];
/// f32 only.
pub const F32_ONLY: [DType; 1] = [DType::F32];
/// f32 and the half types.
pub const F32_HALF: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
/// Signed int dtypes.
pub const SINTS: [DType; 4] = [DType::I64, DType::I32, DType::I16, DType::I8];
/// All int dtypes Burn has.
pub const INTS: [DType; 8] = [
    DType::I64,
    DType::I32,
    DType::I16,
    DType::I8,
    DType::U64,
    DType::U32,
    DType::U16,
    DType::U8,
];

/// Whether the dtype is f16 or bf16.
pub fn is_half(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16)
}

/// Whether the dtype is an unsigned int.
pub fn is_unsigned(d: DType) -> bool {
    matches!(d, DType::U8 | DType::U16 | DType::U32 | DType::U64)
}

/// A value range [lo, hi) that fits the int dtype and keeps `lo..hi` when it can.
pub fn int_range(d: DType, lo: i64, hi: i64) -> (i64, i64) {
    let (min, max) = match d {
        DType::I8 => (-128, 127),
        DType::I16 => (-32768, 32767),
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        DType::U8 => (0, 255),
        DType::U16 => (0, 65535),
        DType::U32 => (0, u32::MAX as i64),
        DType::U64 => (0, i64::MAX),
        _ => (i64::MIN, i64::MAX),
    };
    let lo2 = lo.max(min);
    let hi2 = hi.min(max);
    if hi2 > lo2 {
        (lo2, hi2)
    } else {
        (min.max(0), (min.max(0) + 10).min(max))
    }
}

// ---------------------------------------------------------------------------------------------
// Tolerances
// ---------------------------------------------------------------------------------------------

/// Comparison tolerance: |got - expected| <= atol + rtol * |expected|.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tol {
    /// Relative part.
    pub rtol: f64,
    /// Absolute part.
    pub atol: f64,
}

impl Tol {
    /// Bit-exact for floats.
    pub const EXACT: Tol = Tol {
        rtol: 0.0,
        atol: 0.0,
    };
    /// f32 arithmetic.
    pub const F32: Tol = Tol {
        rtol: 1e-5,
        atol: 1e-6,
    };
    /// Transcendental functions, reductions over a few hundred values.
    pub const TRANS: Tol = Tol {
        rtol: 1e-4,
        atol: 1e-5,
    };
    /// Long reductions, matmul with accumulation, composite activations.
    pub const LOOSE: Tol = Tol {
        rtol: 1e-3,
        atol: 1e-4,
    };
    /// Floor for f16 results (eps 9.8e-4; one or two roundings of inputs to the result).
    pub const F16: Tol = Tol {
        rtol: 1e-2,
        atol: 1e-2,
    };
    /// Floor for bf16 results (eps 7.8e-3).
    pub const BF16: Tol = Tol {
        rtol: 4e-2,
        atol: 4e-2,
    };

    /// The tolerance for a case in dtype `d`: `self`, or the half-precision floor if larger.
    pub fn for_dtype(self, d: DType) -> Tol {
        let floor = match d {
            DType::F16 => Tol::F16,
            DType::BF16 => Tol::BF16,
            _ => return self,
        };
        Tol {
            rtol: self.rtol.max(floor.rtol),
            atol: self.atol.max(floor.atol),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Layouts: the same logical values, stored contiguously or as a strided view.
// ---------------------------------------------------------------------------------------------

/// How an input is laid out before the op sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Built directly.
    Contig,
    /// Built with the last two dims swapped, then `swap_dims` back.
    Transposed,
    /// Built with all dims reversed, then `permute` back.
    Permuted,
    /// Built twice as long on dim 0, then sliced with step 2.
    Stepped,
    /// Built twice as long on dim 0, then sliced with step -2.
    NegStepped,
    /// Built, then flipped on dim 0.
    Flipped,
    /// Built with size 1 on dim 0, then `expand`ed.
    Broadcast,
}

/// All layouts.
pub const LAYOUTS: [Layout; 7] = [
    Layout::Contig,
    Layout::Transposed,
    Layout::Permuted,
    Layout::Stepped,
    Layout::NegStepped,
    Layout::Flipped,
    Layout::Broadcast,
];

/// Builds a tensor of logical `shape` in `layout`; `make` creates a contiguous tensor of a shape.
pub fn arrange<B: Backend, const D: usize, K: BasicOps<B>>(
    layout: Layout,
    shape: [usize; D],
    make: impl FnOnce([usize; D]) -> Tensor<B, D, K>,
) -> Tensor<B, D, K> {
    match layout {
        Layout::Transposed if D >= 2 => {
            let mut s = shape;
            s.swap(D - 2, D - 1);
            make(s).swap_dims(D - 2, D - 1)
        }
        Layout::Permuted if D >= 2 => {
            let mut s = shape;
            s.reverse();
            let mut axes = [0isize; D];
            for (i, a) in axes.iter_mut().enumerate() {
                *a = (D - 1 - i) as isize;
            }
            make(s).permute(axes)
        }
        Layout::Stepped | Layout::NegStepped => {
            let mut s = shape;
            s[0] *= 2;
            let step = if layout == Layout::Stepped { 2 } else { -2 };
            make(s).slice_dim(0, Slice::new(0, None, step))
        }
        Layout::Flipped => make(shape).flip([0]),
        Layout::Broadcast if shape[0] > 1 => {
            let mut s = shape;
            s[0] = 1;
            make(s).expand(shape)
        }
        _ => make(shape),
    }
}

/// The broadcast of several shapes (a 0 beats a 1).
pub fn broadcast_shape<const D: usize>(shapes: &[[usize; D]]) -> [usize; D] {
    let mut out = [1usize; D];
    for (i, o) in out.iter_mut().enumerate() {
        for s in shapes {
            if s[i] != 1 {
                *o = s[i];
            }
        }
    }
    out
}

/// Broadcasts `x` to `target` (size-1 dims only), zero-size targets included.
pub fn broadcast_to<B: Backend, const D: usize, K: BasicOps<B>>(
    x: Tensor<B, D, K>,
    target: [usize; D],
) -> Tensor<B, D, K> {
    if target.contains(&0) {
        // (burn-ndarray's slice to an empty f64 tensor returns f32: build it directly.)
        return Tensor::empty(target, (&x.device(), x.dtype()));
    }
    let dims = x.dims();
    if dims == target {
        return x;
    }
    let mut args = [-1i64; D];
    for i in 0..D {
        if dims[i] != target[i] {
            args[i] = target[i] as i64;
        }
    }
    x.expand(args)
}

/// On the reference side, broadcasts all inputs to their common shape: burn-ndarray's
/// elementwise ops (atan2, powf, remainder, …) only broadcast one side, if any.
pub fn ref_broadcast<B: Backend, const D: usize, K: BasicOps<B>>(
    is_ref: bool,
    xs: Vec<Tensor<B, D, K>>,
) -> Vec<Tensor<B, D, K>> {
    if !is_ref || xs.len() < 2 {
        return xs;
    }
    let shapes: Vec<[usize; D]> = xs.iter().map(|x| x.dims()).collect();
    let target = broadcast_shape(&shapes);
    xs.into_iter().map(|x| broadcast_to(x, target)).collect()
}

// ---------------------------------------------------------------------------------------------
// Per-side context
// ---------------------------------------------------------------------------------------------

/// What a test body sees: the device, which side it runs on, the case dtypes and the seed stream.
pub struct Ctx<B: Backend> {
    /// The device of this side.
    pub dev: B::Device,
    /// True on the reference (NdArray) side: bodies use it to build a reference another way where
    /// burn-ndarray lacks or mis-implements an op. (Also true on the tested side under
    /// `DIFF_SELFCHECK`, where NdArray stands in for the tested backend to validate the harness.)
    pub is_ref: bool,
    /// The float dtype of the case.
    pub fdt: DType,
    /// The int dtype of the case.
    pub idt: DType,
    /// Whether half types run as f32 on this side (the reference side; both sides when the
    /// environment sets `DIFF_SELFCHECK`, to validate the harness with NdArray as the tested side).
    pub emulate_half: bool,
    seed: Cell<u64>,
}

impl<B: Backend> Ctx<B> {
    /// A context on the default device.
    pub fn new(is_ref: bool, fdt: DType, idt: DType) -> Self {
        let is_ref = is_ref || std::env::var_os("DIFF_SELFCHECK").is_some();
        let emulate_half = is_ref;
        Ctx {
            dev: Default::default(),
            is_ref,
            fdt,
            idt,
            emulate_half,
            seed: Cell::new(0x1234),
        }
    }

    /// The next seed of the stream (same sequence on both sides).
    pub fn seed(&self) -> u64 {
        let s = self.seed.get();
        self.seed.set(s.wrapping_add(0x9E37_79B9));
        s
    }

    /// The float dtype tensors really get on this side (half → f32 on the reference side).
    pub fn fdt_eff(&self) -> DType {
        self.eff(self.fdt)
    }

    /// The dtype `d` maps to on this side (half → f32 on the reference side).
    pub fn eff(&self, d: DType) -> DType {
        if self.emulate_half && is_half(d) {
            DType::F32
        } else {
            d
        }
    }

    /// On the reference side only, `expand`s `t` to `shape`: for ops where burn-ndarray supports
    /// less broadcasting than Burn's contract (the backend under test gets the original).
    pub fn ref_expand<const D: usize, K: BasicOps<B>>(
        &self,
        t: Tensor<B, D, K>,
        shape: [usize; D],
    ) -> Tensor<B, D, K> {
        if self.is_ref {
            t.expand(shape)
        } else {
            t
        }
    }

    /// Applies `f`; on the reference side, in f64 and cast back. burn-ndarray's f32 `recip` uses an
    /// approximate SIMD reciprocal (relative error ~1e-4, and it differs between contiguous and
    /// strided inputs), so ops that reach it get their reference computed in f64.
    pub fn ref_f64<const D: usize>(
        &self,
        x: Tensor<B, D>,
        f: impl FnOnce(Tensor<B, D>) -> Tensor<B, D>,
    ) -> Tensor<B, D> {
        if self.is_ref && x.dtype() != DType::F64 {
            let dt = x.dtype();
            f(x.cast(DType::F64)).cast(dt)
        } else {
            f(x)
        }
    }

    /// On the reference side, copies `t` into a fresh contiguous tensor. burn-ndarray's SIMD
    /// unary kernels (abs, bitwise_not, recip, …) give wrong values on some strided views (rank-4
    /// with swapped last dims), so the oracle gets the same values laid out contiguously.
    pub fn oracle_contiguous<const D: usize, K: BasicOps<B>>(
        &self,
        t: Tensor<B, D, K>,
    ) -> Tensor<B, D, K> {
        if self.is_ref {
            let dtype = t.dtype();
            Tensor::from_data(t.into_data(), (&self.dev, dtype))
        } else {
            t
        }
    }

    /// Creation options for float tensors of the case dtype.
    pub fn fo(&self) -> (&B::Device, DType) {
        (&self.dev, self.fdt_eff())
    }

    /// Creation options for int tensors of the case dtype.
    pub fn io(&self) -> (&B::Device, DType) {
        (&self.dev, self.idt)
    }

    /// Float tensor from data, converted to dtype `d` (rounded through it on the reference side).
    pub fn fdata_as<const D: usize>(&self, data: impl Into<TensorData>, d: DType) -> Tensor<B, D> {
        let data: TensorData = data.into();
        let data = data.convert_dtype(d);
        let eff = self.eff(d);
        let data = data.convert_dtype(eff);
        Tensor::from_data(data, (&self.dev, eff))
    }

    /// Float tensor of the case dtype from data (literals, `TensorData`).
    pub fn fd<const D: usize>(&self, data: impl Into<TensorData>) -> Tensor<B, D> {
        self.fdata_as(data, self.fdt)
    }

    /// Random float tensor of the case dtype.
    pub fn f<const D: usize>(&self, shape: [usize; D], dist: impl Into<Dist>) -> Tensor<B, D> {
        self.fdata_as(rand_f(&shape, dist, self.seed()), self.fdt)
    }

    /// Random float tensor of dtype `d`.
    pub fn f_as<const D: usize>(
        &self,
        shape: [usize; D],
        dist: impl Into<Dist>,
        d: DType,
    ) -> Tensor<B, D> {
        self.fdata_as(rand_f(&shape, dist, self.seed()), d)
    }

    /// Random float tensor of the case dtype in the given layout.
    pub fn fl<const D: usize>(
        &self,
        shape: [usize; D],
        dist: impl Into<Dist>,
        layout: Layout,
    ) -> Tensor<B, D> {
        let dist = dist.into();
        self.oracle_contiguous(arrange(layout, shape, |s| self.f(s, dist)))
    }

    /// Random float tensor with the shape of `like`.
    pub fn f_like<const D: usize, K: BasicOps<B>>(
        &self,
        like: &Tensor<B, D, K>,
        dist: impl Into<Dist>,
    ) -> Tensor<B, D> {
        self.f(like.dims(), dist)
    }

    /// Int tensor from data, converted to dtype `d`.
    pub fn idata_as<const D: usize>(
        &self,
        data: impl Into<TensorData>,
        d: DType,
    ) -> Tensor<B, D, burn_tensor::Int> {
        let data: TensorData = data.into();
        Tensor::from_data(data.convert_dtype(d), (&self.dev, d))
    }

    /// Int tensor of the case int dtype from data.
    pub fn id<const D: usize>(
        &self,
        data: impl Into<TensorData>,
    ) -> Tensor<B, D, burn_tensor::Int> {
        self.idata_as(data, self.idt)
    }

    /// Int tensor of the default int dtype (i64) from data: for indices.
    pub fn idx<const D: usize>(
        &self,
        data: impl Into<TensorData>,
    ) -> Tensor<B, D, burn_tensor::Int> {
        self.idata_as(data, DType::I64)
    }

    /// Random int tensor of the case int dtype, values in [lo, hi) clipped to the dtype.
    pub fn i<const D: usize>(
        &self,
        shape: [usize; D],
        lo: i64,
        hi: i64,
    ) -> Tensor<B, D, burn_tensor::Int> {
        let (lo, hi) = int_range(self.idt, lo, hi);
        self.idata_as(rand_i(&shape, lo, hi, self.seed()), self.idt)
    }

    /// Random int tensor of dtype `d`, values in [lo, hi) clipped to the dtype.
    pub fn i_as<const D: usize>(
        &self,
        shape: [usize; D],
        lo: i64,
        hi: i64,
        d: DType,
    ) -> Tensor<B, D, burn_tensor::Int> {
        let (lo, hi) = int_range(d, lo, hi);
        self.idata_as(rand_i(&shape, lo, hi, self.seed()), d)
    }

    /// Random int tensor of the case int dtype in the given layout.
    pub fn il<const D: usize>(
        &self,
        shape: [usize; D],
        lo: i64,
        hi: i64,
        layout: Layout,
    ) -> Tensor<B, D, burn_tensor::Int> {
        self.oracle_contiguous(arrange(layout, shape, |s| self.i(s, lo, hi)))
    }

    /// Random index tensor (i64) in [0, n).
    pub fn ri<const D: usize>(
        &self,
        shape: [usize; D],
        n: usize,
    ) -> Tensor<B, D, burn_tensor::Int> {
        self.idata_as(rand_i(&shape, 0, n.max(1) as i64, self.seed()), DType::I64)
    }

    /// Bool tensor from data.
    pub fn bd<const D: usize>(
        &self,
        data: impl Into<TensorData>,
    ) -> Tensor<B, D, burn_tensor::Bool> {
        Tensor::from_data(data.into(), &self.dev)
    }

    /// Random bool tensor, true with probability p.
    pub fn b<const D: usize>(&self, shape: [usize; D], p: f64) -> Tensor<B, D, burn_tensor::Bool> {
        self.bd(rand_b(&shape, p, self.seed()))
    }

    /// Random bool tensor in the given layout.
    pub fn bl<const D: usize>(
        &self,
        shape: [usize; D],
        p: f64,
        layout: Layout,
    ) -> Tensor<B, D, burn_tensor::Bool> {
        self.oracle_contiguous(arrange(layout, shape, |s| self.b(s, p)))
    }
}

// ---------------------------------------------------------------------------------------------
// Outputs
// ---------------------------------------------------------------------------------------------

/// Something a test body returns: one or more tensors or values to compare.
pub trait IntoOuts {
    /// Appends this output's data.
    fn push_outs(self, out: &mut Vec<TensorData>);
}

impl<B: Backend, const D: usize, K: BasicOps<B>> IntoOuts for Tensor<B, D, K> {
    fn push_outs(self, out: &mut Vec<TensorData>) {
        out.push(self.into_data());
    }
}
impl IntoOuts for TensorData {
    fn push_outs(self, out: &mut Vec<TensorData>) {
        out.push(self);
    }
}
impl<T: IntoOuts> IntoOuts for Vec<T> {
    fn push_outs(self, out: &mut Vec<TensorData>) {
        for t in self {
            t.push_outs(out);
        }
    }
}
impl<T: IntoOuts> IntoOuts for Option<T> {
    fn push_outs(self, out: &mut Vec<TensorData>) {
        match self {
            Some(t) => t.push_outs(out),
            None => out.push(TensorData::new(Vec::<i64>::new(), [0, 0, 0])),
        }
    }
}
macro_rules! scalar_outs {
    ($($t:ty),*) => {$(
        impl IntoOuts for $t {
            fn push_outs(self, out: &mut Vec<TensorData>) {
                out.push(TensorData::new(vec![self], [1]));
            }
        }
    )*};
}
scalar_outs!(f32, f64, i64, i32, bool);
macro_rules! tuple_outs {
    ($($n:ident),*) => {
        impl<$($n: IntoOuts),*> IntoOuts for ($($n,)*) {
            #[allow(non_snake_case)]
            fn push_outs(self, out: &mut Vec<TensorData>) {
                let ($($n,)*) = self;
                $($n.push_outs(out);)*
            }
        }
    };
}
tuple_outs!(A, B2);
tuple_outs!(A, B2, C);
tuple_outs!(A, B2, C, D2);
tuple_outs!(A, B2, C, D2, E);
tuple_outs!(A, B2, C, D2, E, F);
tuple_outs!(A, B2, C, D2, E, F, G);
tuple_outs!(A, B2, C, D2, E, F, G, H);
tuple_outs!(A, B2, C, D2, E, F, G, H, I);
tuple_outs!(A, B2, C, D2, E, F, G, H, I, J);
tuple_outs!(A, B2, C, D2, E, F, G, H, I, J, K);
tuple_outs!(A, B2, C, D2, E, F, G, H, I, J, K, L);

/// Collects a body's outputs.
pub fn outs(x: impl IntoOuts) -> Vec<TensorData> {
    let mut v = Vec::new();
    x.push_outs(&mut v);
    v
}

// ---------------------------------------------------------------------------------------------
// Comparison
// ---------------------------------------------------------------------------------------------

fn is_bool(d: DType) -> bool {
    matches!(d, DType::Bool(_))
}

/// The values of bool data, whatever its storage.
pub fn bool_values(d: &TensorData) -> Vec<bool> {
    match d.dtype {
        DType::Bool(BoolStore::U32) => d
            .as_bytes()
            .chunks(4)
            .map(|c| c.iter().any(|&b| b != 0))
            .collect(),
        _ => d.as_bytes().iter().map(|&b| b != 0).collect(),
    }
}

fn fmt_index(shape: &Shape, mut flat: usize) -> String {
    let dims = shape.as_slice();
    let mut idx = vec![0; dims.len()];
    for i in (0..dims.len()).rev() {
        if dims[i] > 0 {
            idx[i] = flat % dims[i];
            flat /= dims[i];
        }
    }
    format!("{idx:?}")
}

fn short(v: &[String]) -> String {
    if v.len() <= 12 {
        format!("[{}]", v.join(", "))
    } else {
        format!("[{}, … ({} values)]", v[..12].join(", "), v.len())
    }
}

/// Compares one output: `expected` from the oracle, `got` from the backend under test.
///
/// `fdt` is the case float dtype: when it is a half type, an f32 reference output stands for it.
pub fn compare(
    expected: &TensorData,
    got: &TensorData,
    tol: Tol,
    fdt: DType,
) -> Result<(), String> {
    let dtype_ok = expected.dtype == got.dtype
        || (is_half(fdt) && expected.dtype == DType::F32 && got.dtype == fdt)
        || (is_bool(expected.dtype) && is_bool(got.dtype));
    if !dtype_ok {
        return Err(format!(
            "dtype: expected {:?}, got {:?}",
            expected.dtype, got.dtype
        ));
    }
    if expected.shape != got.shape {
        return Err(format!(
            "shape: expected {:?}, got {:?}",
            expected.shape, got.shape
        ));
    }
    let mut bad: Vec<String> = Vec::new();
    let mut nbad = 0usize;
    if is_bool(expected.dtype) {
        let e = bool_values(expected);
        let g = bool_values(got);
        for (i, (a, b)) in e.iter().zip(&g).enumerate() {
            if a != b {
                nbad += 1;
                if bad.len() < 6 {
                    bad.push(format!(
                        "at {}: expected {a}, got {b}",
                        fmt_index(&expected.shape, i)
                    ));
                }
            }
        }
    } else if expected.dtype.is_float() {
        let tol = tol.for_dtype(got.dtype);
        let e: Vec<f64> = expected.iter::<f64>().collect();
        let g: Vec<f64> = got.iter::<f64>().collect();
        for (i, (&a, &b)) in e.iter().zip(&g).enumerate() {
            let ok = if a.is_nan() || b.is_nan() {
                a.is_nan() && b.is_nan()
            } else if a.is_infinite() || b.is_infinite() {
                a == b
            } else {
                (a - b).abs() <= tol.atol + tol.rtol * a.abs()
            };
            if !ok {
                nbad += 1;
                if bad.len() < 6 {
                    bad.push(format!(
                        "at {}: expected {a:e}, got {b:e}",
                        fmt_index(&expected.shape, i)
                    ));
                }
            }
        }
    } else {
        let e: Vec<i128> = int_values(expected);
        let g: Vec<i128> = int_values(got);
        for (i, (a, b)) in e.iter().zip(&g).enumerate() {
            if a != b {
                nbad += 1;
                if bad.len() < 6 {
                    bad.push(format!(
                        "at {}: expected {a}, got {b}",
                        fmt_index(&expected.shape, i)
                    ));
                }
            }
        }
    }
    if nbad == 0 {
        Ok(())
    } else {
        Err(format!(
            "{nbad} of {} values differ (shape {:?}, {:?}, tol {:?}): {}",
            expected.num_elements(),
            expected.shape.as_slice(),
            got.dtype,
            tol,
            bad.join("; ")
        ))
    }
}

fn int_values(d: &TensorData) -> Vec<i128> {
    match d.dtype {
        DType::U64 => d.iter::<u64>().map(|x| x as i128).collect(),
        _ => d.iter::<i64>().map(|x| x as i128).collect(),
    }
}

/// The values of data as display strings (for reports).
pub fn show(d: &TensorData) -> String {
    let v: Vec<String> = if is_bool(d.dtype) {
        bool_values(d).iter().map(|b| b.to_string()).collect()
    } else if d.dtype.is_float() {
        d.iter::<f64>().map(|x| format!("{x}")).collect()
    } else {
        int_values(d).iter().map(|x| x.to_string()).collect()
    };
    format!("{:?} {:?} {}", d.dtype, d.shape.as_slice(), short(&v))
}

fn panic_msg(e: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = e.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = e.downcast_ref::<&str>() {
        s.to_string()
    } else {
        "(non-string panic)".into()
    }
}

// ---------------------------------------------------------------------------------------------
// Cases and runners
// ---------------------------------------------------------------------------------------------

/// A test body, generic over the backend.
pub trait Case {
    /// Runs the body on backend `B` and returns the outputs to compare.
    fn run<B: Backend>(&self, ctx: &Ctx<B>) -> Vec<TensorData>;
}

/// A test body over an autodiff backend (gradients).
pub trait AdCase {
    /// Runs the body on autodiff backend `B` and returns the outputs to compare.
    fn run<B: AutodiffBackend>(&self, ctx: &Ctx<B>) -> Vec<TensorData>;
}

/// Runs `f` on both sides and compares the outputs.
fn diff_with(
    label: &str,
    fdt: DType,
    tol: Tol,
    run_ref: impl FnOnce() -> Vec<TensorData>,
    run_test: impl FnOnce() -> Vec<TensorData>,
) -> Result<(), String> {
    let expected = match catch_unwind(AssertUnwindSafe(run_ref)) {
        Ok(v) => v,
        Err(e) => {
            return Err(format!(
                "{label}: REFERENCE (ndarray) panicked: {}",
                panic_msg(e)
            ))
        }
    };
    let got = match catch_unwind(AssertUnwindSafe(run_test)) {
        Ok(v) => v,
        Err(e) => return Err(format!("{label}: panicked: {}", panic_msg(e))),
    };
    if expected.len() != got.len() {
        return Err(format!(
            "{label}: {} outputs expected, got {}",
            expected.len(),
            got.len()
        ));
    }
    let mut errs = Vec::new();
    for (i, (e, g)) in expected.iter().zip(&got).enumerate() {
        if let Err(m) = compare(e, g, tol, fdt) {
            let detail = if e.num_elements() <= 24 {
                format!("\n      expected {}\n      got      {}", show(e), show(g))
            } else {
                String::new()
            };
            errs.push(format!("{label}: output {i}: {m}{detail}"));
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("\n"))
    }
}

/// Whether the tested backend's default device is a GPU (CUDA or Metal). MLX has no f64
/// there, so f64 cases are skipped (tests/errors.rs checks the error they give instead).
pub fn on_gpu() -> bool {
    burn_mlx::MlxDevice::default() == burn_mlx::MlxDevice::Gpu
}

/// The widest float dtype the tested device has: f64 on the CPU, f32 on a GPU. Cases that cast
/// "to f64" use it, so that they still run (as f32) on a GPU.
pub fn widest_float() -> burn_tensor::FloatDType {
    if on_gpu() {
        burn_tensor::FloatDType::F32
    } else {
        burn_tensor::FloatDType::F64
    }
}

/// Whether f32 matmuls and convolutions run in TF32 (10-bit mantissa inputs): MLX's CUDA
/// backend does so for every f32 GEMM and cuDNN convolution, as PyTorch does for convolutions.
pub fn tf32() -> bool {
    on_gpu() && cfg!(not(target_os = "macos"))
}

/// Tests whose f32 results go through a GEMM or a convolution (matched by name).
const TF32_FAMILY: [&str; 15] = [
    "cov",
    "adaptive",
    "accumulates",
    "matmul",
    "interpolate",
    "conv",
    "deform",
    "attention",
    "linear",
    "dot",
    "nn_",
    "quantiz",
    "grid_sample",
    "embedding",
    "cross",
];

/// The tolerance for `name` in dtype `fdt` on the tested device: TF32-level for f32 GEMM and
/// convolution tests on CUDA (relative error about 2^-11 per input rounding), `tol` otherwise.
pub fn device_tol(name: &str, fdt: DType, tol: Tol) -> Tol {
    if tf32() && fdt == DType::F32 && TF32_FAMILY.iter().any(|f| name.contains(f)) {
        Tol {
            rtol: tol.rtol.max(5e-3),
            atol: tol.atol.max(5e-3),
        }
    } else {
        tol
    }
}

/// Collects the failures of one test over its sweep and panics with all of them at the end.
pub struct Failures {
    name: String,
    errs: Vec<String>,
    cases: usize,
}

impl Failures {
    /// A collector for test `name`.
    pub fn new(name: &str) -> Self {
        Failures {
            name: name.to_string(),
            errs: Vec::new(),
            cases: 0,
        }
    }

    /// Runs `case` on both backends with the given dtypes and compares.
    pub fn check<C: Case>(&mut self, case: &C, label: &str, fdt: DType, idt: DType, tol: Tol) {
        if fdt == DType::F64 && on_gpu() {
            return;
        }
        if matches!(idt, DType::I64 | DType::U64) && on_gpu() && self.name.contains("scatter") {
            // MLX's CUDA `Scatter` takes no 64-bit integers (MLX 0.32.4: int64 and uint64): a
            // clear error, listed in docs/cuda.md.
            return;
        }
        let tol = device_tol(&self.name, fdt, tol);
        self.cases += 1;
        let r = diff_with(
            label,
            fdt,
            tol,
            || case.run::<RefB>(&Ctx::new(true, fdt, idt)),
            || case.run::<TestB>(&Ctx::new(false, fdt, idt)),
        );
        if let Err(e) = r {
            self.errs.push(e);
        }
    }

    /// Runs `case` on both autodiff backends with the given dtypes and compares.
    pub fn check_ad<C: AdCase>(&mut self, case: &C, label: &str, fdt: DType, idt: DType, tol: Tol) {
        if fdt == DType::F64 && on_gpu() {
            return;
        }
        if matches!(idt, DType::I64 | DType::U64) && on_gpu() && self.name.contains("scatter") {
            // MLX's CUDA `Scatter` takes no 64-bit integers (MLX 0.32.4: int64 and uint64): a
            // clear error, listed in docs/cuda.md.
            return;
        }
        let tol = device_tol(&self.name, fdt, tol);
        self.cases += 1;
        let r = diff_with(
            label,
            fdt,
            tol,
            || case.run::<RefAd>(&Ctx::new(true, fdt, idt)),
            || case.run::<TestAd>(&Ctx::new(false, fdt, idt)),
        );
        if let Err(e) = r {
            self.errs.push(e);
        }
    }

    /// Records a failure found by other means.
    pub fn fail(&mut self, msg: String) {
        self.errs.push(msg);
    }

    /// Counts a check done by other means.
    pub fn count(&mut self) {
        self.cases += 1;
    }

    /// Panics with every failure, if any.
    pub fn finish(self) {
        if !self.errs.is_empty() {
            if let Ok(path) = std::env::var("DIFF_LOG") {
                use std::io::Write;
                if let Ok(mut f) = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                {
                    for e in &self.errs {
                        let _ = writeln!(f, "[{}] {}", self.name, e);
                    }
                }
            }
            panic!(
                "{}: {} of {} cases failed:\n  {}",
                self.name,
                self.errs.len(),
                self.cases,
                self.errs.join("\n  ")
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Sweeps over shapes, layouts and ranks
// ---------------------------------------------------------------------------------------------

/// One input configuration for an elementwise sweep.
#[derive(Clone, Debug)]
pub struct Cfg {
    /// Logical shapes of the inputs (same rank).
    pub shapes: Vec<Vec<usize>>,
    /// Layout of each input.
    pub layouts: Vec<Layout>,
}

fn cfg1(s: &[usize], l: Layout) -> Cfg {
    Cfg {
        shapes: vec![s.to_vec()],
        layouts: vec![l],
    }
}
fn cfg2(a: &[usize], la: Layout, b: &[usize], lb: Layout) -> Cfg {
    Cfg {
        shapes: vec![a.to_vec(), b.to_vec()],
        layouts: vec![la, lb],
    }
}

/// The standard single-input configurations: ranks 1–4, empty, scalar-like, strided views.
pub fn unary_cfgs() -> Vec<Cfg> {
    use Layout::*;
    vec![
        cfg1(&[0], Contig),
        cfg1(&[2, 0, 3], Contig),
        cfg1(&[1], Contig),
        cfg1(&[7], Contig),
        cfg1(&[3, 4], Contig),
        cfg1(&[3, 4], Transposed),
        cfg1(&[3, 4], Stepped),
        cfg1(&[3, 4], NegStepped),
        cfg1(&[3, 4], Flipped),
        cfg1(&[3, 4], Broadcast),
        cfg1(&[2, 3, 4], Permuted),
        cfg1(&[2, 3, 2, 5], Transposed),
    ]
}

/// The standard two-input configurations: equal shapes, broadcasting, empty, strided views.
pub fn binary_cfgs() -> Vec<Cfg> {
    use Layout::*;
    vec![
        cfg2(&[0], Contig, &[0], Contig),
        cfg2(&[0, 3], Contig, &[1, 3], Contig),
        cfg2(&[1], Contig, &[1], Contig),
        cfg2(&[7], Contig, &[7], Contig),
        cfg2(&[5], Contig, &[1], Contig),
        cfg2(&[3, 1], Contig, &[1, 4], Contig),
        cfg2(&[3, 4], Transposed, &[3, 4], Stepped),
        cfg2(&[3, 4], Flipped, &[1, 4], Contig),
        cfg2(&[2, 3, 4], Permuted, &[2, 3, 4], NegStepped),
        cfg2(&[2, 1, 4, 1], Contig, &[1, 3, 1, 5], Contig),
        cfg2(&[2, 3, 2, 5], Broadcast, &[2, 3, 2, 5], Transposed),
    ]
}

fn arr<const D: usize>(s: &[usize]) -> [usize; D] {
    let mut a = [0; D];
    a.copy_from_slice(s);
    a
}

/// An op on float tensors of any rank (used by the sweep helpers).
pub trait FloatOp {
    /// Applies the op to the inputs (one or two, by the sweep).
    fn apply<B: Backend, const D: usize>(ctx: &Ctx<B>, x: Vec<Tensor<B, D>>) -> Vec<TensorData>;
}

/// An op on int tensors of any rank (used by the sweep helpers).
pub trait IntOp {
    /// Applies the op to the inputs (one or two, by the sweep).
    fn apply<B: Backend, const D: usize>(
        ctx: &Ctx<B>,
        x: Vec<Tensor<B, D, burn_tensor::Int>>,
    ) -> Vec<TensorData>;
}

/// An op on bool tensors of any rank (used by the sweep helpers).
pub trait BoolOp {
    /// Applies the op to the inputs (one or two, by the sweep).
    fn apply<B: Backend, const D: usize>(
        ctx: &Ctx<B>,
        x: Vec<Tensor<B, D, burn_tensor::Bool>>,
    ) -> Vec<TensorData>;
}

/// Float sweep case: inputs drawn from `dists`, one per input.
pub struct FloatSweep<O> {
    /// The input configuration.
    pub cfg: Cfg,
    /// One distribution per input.
    pub dists: Vec<Dist>,
    /// The op.
    pub op: std::marker::PhantomData<O>,
}

impl<O: FloatOp> FloatSweep<O> {
    fn run_d<B: Backend, const D: usize>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        let xs = self
            .cfg
            .shapes
            .iter()
            .zip(&self.cfg.layouts)
            .zip(&self.dists)
            .map(|((s, l), d)| ctx.fl::<D>(arr(s), *d, *l))
            .collect();
        O::apply::<B, D>(ctx, ref_broadcast(ctx.is_ref, xs))
    }
}

impl<O: FloatOp> Case for FloatSweep<O> {
    fn run<B: Backend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        match self.cfg.shapes[0].len() {
            1 => self.run_d::<B, 1>(ctx),
            2 => self.run_d::<B, 2>(ctx),
            3 => self.run_d::<B, 3>(ctx),
            4 => self.run_d::<B, 4>(ctx),
            r => panic!("rank {r} not swept"),
        }
    }
}

/// Int sweep case: inputs in [lo, hi) (clipped to the dtype), one range per input.
pub struct IntSweep<O> {
    /// The input configuration.
    pub cfg: Cfg,
    /// One range per input.
    pub ranges: Vec<(i64, i64)>,
    /// The op.
    pub op: std::marker::PhantomData<O>,
}

impl<O: IntOp> IntSweep<O> {
    fn run_d<B: Backend, const D: usize>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        let xs = self
            .cfg
            .shapes
            .iter()
            .zip(&self.cfg.layouts)
            .zip(&self.ranges)
            .map(|((s, l), r)| ctx.il::<D>(arr(s), r.0, r.1, *l))
            .collect();
        O::apply::<B, D>(ctx, ref_broadcast(ctx.is_ref, xs))
    }
}

impl<O: IntOp> Case for IntSweep<O> {
    fn run<B: Backend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        match self.cfg.shapes[0].len() {
            1 => self.run_d::<B, 1>(ctx),
            2 => self.run_d::<B, 2>(ctx),
            3 => self.run_d::<B, 3>(ctx),
            4 => self.run_d::<B, 4>(ctx),
            r => panic!("rank {r} not swept"),
        }
    }
}

/// Bool sweep case.
pub struct BoolSweep<O> {
    /// The input configuration.
    pub cfg: Cfg,
    /// The op.
    pub op: std::marker::PhantomData<O>,
}

impl<O: BoolOp> BoolSweep<O> {
    fn run_d<B: Backend, const D: usize>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        let xs = self
            .cfg
            .shapes
            .iter()
            .zip(&self.cfg.layouts)
            .map(|(s, l)| ctx.bl::<D>(arr(s), 0.5, *l))
            .collect();
        O::apply::<B, D>(ctx, ref_broadcast(ctx.is_ref, xs))
    }
}

impl<O: BoolOp> Case for BoolSweep<O> {
    fn run<B: Backend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        match self.cfg.shapes[0].len() {
            1 => self.run_d::<B, 1>(ctx),
            2 => self.run_d::<B, 2>(ctx),
            3 => self.run_d::<B, 3>(ctx),
            4 => self.run_d::<B, 4>(ctx),
            r => panic!("rank {r} not swept"),
        }
    }
}

/// Runs a float op over `cfgs` × `dtypes`.
pub fn sweep_float<O: FloatOp>(
    name: &str,
    cfgs: &[Cfg],
    dists: &[Dist],
    dtypes: &[DType],
    tol: Tol,
) {
    let mut f = Failures::new(name);
    for &dt in dtypes {
        for cfg in cfgs {
            let case = FloatSweep::<O> {
                cfg: cfg.clone(),
                dists: dists.to_vec(),
                op: std::marker::PhantomData,
            };
            let label = format!("{dt:?} shapes={:?} layouts={:?}", cfg.shapes, cfg.layouts);
            f.check(&case, &label, dt, DType::I64, tol);
        }
    }
    f.finish();
}

/// Runs an int op over `cfgs` × `dtypes`.
pub fn sweep_int<O: IntOp>(name: &str, cfgs: &[Cfg], ranges: &[(i64, i64)], dtypes: &[DType]) {
    let mut f = Failures::new(name);
    for &dt in dtypes {
        for cfg in cfgs {
            let case = IntSweep::<O> {
                cfg: cfg.clone(),
                ranges: ranges.to_vec(),
                op: std::marker::PhantomData,
            };
            let label = format!("{dt:?} shapes={:?} layouts={:?}", cfg.shapes, cfg.layouts);
            f.check(&case, &label, DType::F32, dt, Tol::EXACT);
        }
    }
    f.finish();
}

/// Runs a bool op over `cfgs`.
pub fn sweep_bool<O: BoolOp>(name: &str, cfgs: &[Cfg]) {
    let mut f = Failures::new(name);
    for cfg in cfgs {
        let case = BoolSweep::<O> {
            cfg: cfg.clone(),
            op: std::marker::PhantomData,
        };
        let label = format!("shapes={:?} layouts={:?}", cfg.shapes, cfg.layouts);
        f.check(&case, &label, DType::F32, DType::I64, Tol::EXACT);
    }
    f.finish();
}

// ---------------------------------------------------------------------------------------------
// Macros
// ---------------------------------------------------------------------------------------------

/// A differential test from a body: `diff!(name, tol, [dtypes], |ctx| body);`.
///
/// The body sees `ctx: &Ctx<B>` (with `ctx.fdt` set to each listed float dtype in turn) and the
/// backend type `B`; it returns anything [`IntoOuts`]: a tensor, a tuple, a `Vec`.
/// `diff!(name, tol, ints [dtypes], |ctx| body)` sweeps `ctx.idt` instead.
macro_rules! diff {
    ($name:ident, $tol:expr, |$ctx:ident| $body:expr) => {
        diff!($name, $tol, [burn_tensor::DType::F32], |$ctx| $body);
    };
    ($name:ident, $tol:expr, [$($dt:expr),* $(,)?], |$ctx:ident| $body:expr) => {
        #[test]
        fn $name() {
            struct C;
            impl $crate::common::Case for C {
                #[allow(unused_variables)]
                fn run<B: burn_tensor::backend::Backend>(
                    &self,
                    $ctx: &$crate::common::Ctx<B>,
                ) -> Vec<burn_tensor::TensorData> {
                    $crate::common::outs($body)
                }
            }
            let mut f = $crate::common::Failures::new(stringify!($name));
            for dt in [$($dt),*] {
                f.check(&C, &format!("{dt:?}"), dt, burn_tensor::DType::I64, $tol);
            }
            f.finish();
        }
    };
    ($name:ident, $tol:expr, $list:expr, |$ctx:ident| $body:expr) => {
        #[test]
        fn $name() {
            struct C;
            impl $crate::common::Case for C {
                #[allow(unused_variables)]
                fn run<B: burn_tensor::backend::Backend>(
                    &self,
                    $ctx: &$crate::common::Ctx<B>,
                ) -> Vec<burn_tensor::TensorData> {
                    $crate::common::outs($body)
                }
            }
            let mut f = $crate::common::Failures::new(stringify!($name));
            for dt in $list {
                f.check(&C, &format!("{dt:?}"), dt, burn_tensor::DType::I64, $tol);
            }
            f.finish();
        }
    };
}

/// Like [`diff!`] but sweeping the int dtype: `diff_int!(name, [dtypes], |ctx| body);`.
macro_rules! diff_int {
    ($name:ident, $list:expr, |$ctx:ident| $body:expr) => {
        #[test]
        fn $name() {
            struct C;
            impl $crate::common::Case for C {
                #[allow(unused_variables)]
                fn run<B: burn_tensor::backend::Backend>(
                    &self,
                    $ctx: &$crate::common::Ctx<B>,
                ) -> Vec<burn_tensor::TensorData> {
                    $crate::common::outs($body)
                }
            }
            let mut f = $crate::common::Failures::new(stringify!($name));
            for dt in $list {
                f.check(
                    &C,
                    &format!("{dt:?}"),
                    burn_tensor::DType::F32,
                    dt,
                    $crate::common::Tol::EXACT,
                );
            }
            f.finish();
        }
    };
}

/// A gradient test: `diff_ad!(name, tol, [dtypes], |ctx| body);` with `B: AutodiffBackend`.
macro_rules! diff_ad {
    ($name:ident, $tol:expr, |$ctx:ident| $body:expr) => {
        diff_ad!($name, $tol, [burn_tensor::DType::F32], |$ctx| $body);
    };
    ($name:ident, $tol:expr, [$($dt:expr),* $(,)?], |$ctx:ident| $body:expr) => {
        #[test]
        fn $name() {
            struct C;
            impl $crate::common::AdCase for C {
                #[allow(unused_variables)]
                fn run<B: burn_tensor::backend::AutodiffBackend>(
                    &self,
                    $ctx: &$crate::common::Ctx<B>,
                ) -> Vec<burn_tensor::TensorData> {
                    $crate::common::outs($body)
                }
            }
            let mut f = $crate::common::Failures::new(stringify!($name));
            for dt in [$($dt),*] {
                f.check_ad(&C, &format!("{dt:?}"), dt, burn_tensor::DType::I64, $tol);
            }
            f.finish();
        }
    };
    ($name:ident, $tol:expr, $list:expr, |$ctx:ident| $body:expr) => {
        #[test]
        fn $name() {
            struct C;
            impl $crate::common::AdCase for C {
                #[allow(unused_variables)]
                fn run<B: burn_tensor::backend::AutodiffBackend>(
                    &self,
                    $ctx: &$crate::common::Ctx<B>,
                ) -> Vec<burn_tensor::TensorData> {
                    $crate::common::outs($body)
                }
            }
            let mut f = $crate::common::Failures::new(stringify!($name));
            for dt in $list {
                f.check_ad(&C, &format!("{dt:?}"), dt, burn_tensor::DType::I64, $tol);
            }
            f.finish();
        }
    };
}

/// A float sweep test over the standard unary configurations:
/// `unary!(name, dist, [dtypes], tol, |ctx, x| expr)` where `x: Tensor<B, D>`.
macro_rules! unary {
    ($name:ident, $dist:expr, $dtypes:expr, $tol:expr, |$ctx:ident, $x:ident| $body:expr) => {
        #[test]
        fn $name() {
            struct O;
            impl $crate::common::FloatOp for O {
                #[allow(unused_variables)]
                fn apply<B: burn_tensor::backend::Backend, const D: usize>(
                    $ctx: &$crate::common::Ctx<B>,
                    xs: Vec<burn_tensor::Tensor<B, D>>,
                ) -> Vec<burn_tensor::TensorData> {
                    let $x = xs.into_iter().next().unwrap();
                    $crate::common::outs($body)
                }
            }
            $crate::common::sweep_float::<O>(
                stringify!($name),
                &$crate::common::unary_cfgs(),
                &[$crate::common::Dist::from($dist)],
                &$dtypes,
                $tol,
            );
        }
    };
}

/// A float sweep test over the standard binary configurations (broadcasting included):
/// `binary!(name, dist_a, dist_b, [dtypes], tol, |ctx, a, b| expr)`.
macro_rules! binary {
    ($name:ident, $da:expr, $db:expr, $dtypes:expr, $tol:expr, |$ctx:ident, $a:ident, $b:ident| $body:expr) => {
        #[test]
        fn $name() {
            struct O;
            impl $crate::common::FloatOp for O {
                #[allow(unused_variables)]
                fn apply<B: burn_tensor::backend::Backend, const D: usize>(
                    $ctx: &$crate::common::Ctx<B>,
                    xs: Vec<burn_tensor::Tensor<B, D>>,
                ) -> Vec<burn_tensor::TensorData> {
                    let mut it = xs.into_iter();
                    let $a = it.next().unwrap();
                    let $b = it.next().unwrap();
                    $crate::common::outs($body)
                }
            }
            $crate::common::sweep_float::<O>(
                stringify!($name),
                &$crate::common::binary_cfgs(),
                &[
                    $crate::common::Dist::from($da),
                    $crate::common::Dist::from($db),
                ],
                &$dtypes,
                $tol,
            );
        }
    };
}

/// An int sweep over the standard unary configurations:
/// `unary_int!(name, (lo, hi), [dtypes], |ctx, x| expr)`.
macro_rules! unary_int {
    ($name:ident, $r:expr, $dtypes:expr, |$ctx:ident, $x:ident| $body:expr) => {
        #[test]
        fn $name() {
            struct O;
            impl $crate::common::IntOp for O {
                #[allow(unused_variables)]
                fn apply<B: burn_tensor::backend::Backend, const D: usize>(
                    $ctx: &$crate::common::Ctx<B>,
                    xs: Vec<burn_tensor::Tensor<B, D, burn_tensor::Int>>,
                ) -> Vec<burn_tensor::TensorData> {
                    let $x = xs.into_iter().next().unwrap();
                    $crate::common::outs($body)
                }
            }
            $crate::common::sweep_int::<O>(
                stringify!($name),
                &$crate::common::unary_cfgs(),
                &[$r],
                &$dtypes,
            );
        }
    };
}

/// An int sweep over the standard binary configurations:
/// `binary_int!(name, (lo, hi), (lo, hi), [dtypes], |ctx, a, b| expr)`.
macro_rules! binary_int {
    ($name:ident, $ra:expr, $rb:expr, $dtypes:expr, |$ctx:ident, $a:ident, $b:ident| $body:expr) => {
        #[test]
        fn $name() {
            struct O;
            impl $crate::common::IntOp for O {
                #[allow(unused_variables)]
                fn apply<B: burn_tensor::backend::Backend, const D: usize>(
                    $ctx: &$crate::common::Ctx<B>,
                    xs: Vec<burn_tensor::Tensor<B, D, burn_tensor::Int>>,
                ) -> Vec<burn_tensor::TensorData> {
                    let mut it = xs.into_iter();
                    let $a = it.next().unwrap();
                    let $b = it.next().unwrap();
                    $crate::common::outs($body)
                }
            }
            $crate::common::sweep_int::<O>(
                stringify!($name),
                &$crate::common::binary_cfgs(),
                &[$ra, $rb],
                &$dtypes,
            );
        }
    };
}

/// A bool sweep over the standard unary configurations: `unary_bool!(name, |ctx, x| expr)`.
macro_rules! unary_bool {
    ($name:ident, |$ctx:ident, $x:ident| $body:expr) => {
        #[test]
        fn $name() {
            struct O;
            impl $crate::common::BoolOp for O {
                #[allow(unused_variables)]
                fn apply<B: burn_tensor::backend::Backend, const D: usize>(
                    $ctx: &$crate::common::Ctx<B>,
                    xs: Vec<burn_tensor::Tensor<B, D, burn_tensor::Bool>>,
                ) -> Vec<burn_tensor::TensorData> {
                    let $x = xs.into_iter().next().unwrap();
                    $crate::common::outs($body)
                }
            }
            $crate::common::sweep_bool::<O>(stringify!($name), &$crate::common::unary_cfgs());
        }
    };
}

/// A bool sweep over the standard binary configurations: `binary_bool!(name, |ctx, a, b| expr)`.
macro_rules! binary_bool {
    ($name:ident, |$ctx:ident, $a:ident, $b:ident| $body:expr) => {
        #[test]
        fn $name() {
            struct O;
            impl $crate::common::BoolOp for O {
                #[allow(unused_variables)]
                fn apply<B: burn_tensor::backend::Backend, const D: usize>(
                    $ctx: &$crate::common::Ctx<B>,
                    xs: Vec<burn_tensor::Tensor<B, D, burn_tensor::Bool>>,
                ) -> Vec<burn_tensor::TensorData> {
                    let mut it = xs.into_iter();
                    let $a = it.next().unwrap();
                    let $b = it.next().unwrap();
                    $crate::common::outs($body)
                }
            }
            $crate::common::sweep_bool::<O>(stringify!($name), &$crate::common::binary_cfgs());
        }
    };
}
