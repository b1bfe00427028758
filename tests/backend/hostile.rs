//! Hostile inputs: empty tensors, NaN/Inf, overflowing casts, out-of-range indices and shapes too
//! large to allocate.
//!
//! Where Burn defines the behaviour, burn-mlx is compared with burn-ndarray through the shared
//! differential harness. Where it does not (overflowing casts, where burn-ndarray panics;
//! out-of-range indices, which Burn documents as unspecified), the tests pin burn-mlx's documented,
//! deterministic behaviour and check that nothing crashes or corrupts memory.

use crate::common::*;
use burn_mlx::{Mlx, MlxDevice};
use burn_tensor::module::{avg_pool2d, conv2d, max_pool2d};
use burn_tensor::ops::ConvOptions;
use burn_tensor::{Bool, DType, Distribution, IndexingUpdateOp, Int, Tensor, TensorData};
use std::panic::{catch_unwind, AssertUnwindSafe};

const CPU: MlxDevice = MlxDevice::Cpu;

fn panic_message<T>(f: impl FnOnce() -> T) -> String {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(_) => panic!("expected a panic, but the call returned"),
        Err(e) => e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "(non-string panic)".into()),
    }
}

fn cpu_still_works() {
    let a = Tensor::<Mlx, 2>::from_floats([[1.0, 2.0], [3.0, 4.0]], &CPU);
    let v: Vec<f32> = a.clone().matmul(a).into_data().to_vec().unwrap();
    assert_eq!(v, vec![7.0, 10.0, 15.0, 22.0]);
}

fn floats(t: Tensor<Mlx, 1>) -> Vec<f32> {
    t.into_data().to_vec().unwrap()
}

fn ints(t: Tensor<Mlx, 1, Int>) -> Vec<i64> {
    t.into_data().convert::<i64>().to_vec().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Empty tensors (a zero-size dimension) through each op family
// ---------------------------------------------------------------------------------------------

diff!(empty_elementwise, Tol::F32, F32_HALF, |ctx| {
    let a = ctx.f([2, 0, 3], (-1.0, 1.0));
    let b = ctx.f([2, 0, 3], Dist::nz(-1.0, 1.0, 0.1));
    let c = ctx.f([2, 1, 3], (-1.0, 1.0));
    (
        a.clone().exp(),
        a.clone() + b.clone(),
        a.clone() / b.clone(),
        a.clone() * c,
        a.clone() * 2.0,
        a.clone().greater(b.clone()),
        a.clone().equal_elem(0.0),
        a.clone().mask_where(a.clone().lower(b.clone()), b),
        a.clone().clamp(-0.5, 0.5),
        burn_tensor::activation::softmax(a.clone(), 2),
    )
});

#[test]
fn empty_matmul() {
    // burn-ndarray divides by zero on any empty matmul dimension; Burn's contract is the math:
    // k = 0 gives a matrix of zeros, m = 0 or n = 0 an empty matrix.
    let m = |a: [usize; 3], b: [usize; 3]| {
        Tensor::<Mlx, 3>::ones(a, &CPU)
            .matmul(Tensor::<Mlx, 3>::ones(b, &CPU))
            .into_data()
    };
    let k0 = m([1, 2, 0], [1, 0, 3]);
    assert_eq!(k0.shape.as_slice(), &[1, 2, 3]);
    assert_eq!(k0.to_vec::<f32>().unwrap(), vec![0.0; 6]);
    let k0b = m([3, 2, 0], [3, 0, 4]);
    assert_eq!(k0b.to_vec::<f32>().unwrap(), vec![0.0; 24]);
    for (a, b, out) in [
        ([1, 0, 4], [1, 4, 3], [1, 0, 3]),
        ([1, 2, 4], [1, 4, 0], [1, 2, 0]),
        ([0, 2, 3], [0, 3, 4], [0, 2, 4]),
    ] {
        let d = m(a, b);
        assert_eq!(d.shape.as_slice(), &out);
        assert!(d.to_vec::<f32>().unwrap().is_empty());
    }
    let h = Tensor::<Mlx, 2>::ones([2, 0], (&CPU, DType::F16))
        .matmul(Tensor::<Mlx, 2>::ones([0, 3], (&CPU, DType::F16)))
        .into_data();
    assert_eq!(h.convert::<f32>().to_vec::<f32>().unwrap(), vec![0.0; 6]);
}

diff!(empty_reductions, Tol::F32, |ctx| {
    let a = ctx.f([2, 0, 3], (-1.0, 1.0));
    (
        // Over the empty dim: the identity of the reduction.
        a.clone().sum_dim(1),
        a.clone().prod_dim(1),
        a.clone().sum(),
        a.clone().prod(),
        // Over a non-empty dim: empty results.
        a.clone().sum_dim(0),
        a.clone().mean_dim(2),
        a.clone().max_dim(0),
        a.clone().min_dim(2),
        a.clone().argmax(0),
        a.cumsum(2),
    )
});

diff!(empty_int_and_bool, Tol::EXACT, |ctx| {
    let a = ctx.i([0, 4], -5, 5);
    let m = ctx.b([3, 0], 0.5);
    (
        a.clone() + 1,
        a.clone().sum_dim(0),
        a.clone().sum(),
        a.clone().max_dim(1),
        a.float(),
        m.clone().bool_not(),
        m.clone().any(),
        m.clone().all(),
        m.int().sum_dim(1),
    )
});

diff!(empty_layout_ops, Tol::EXACT, |ctx| {
    let x = ctx.f([2, 3], (-1.0, 1.0));
    let e = ctx.f([0, 3], (-1.0, 1.0));
    (
        Tensor::cat(vec![x.clone(), e.clone()], 0),
        Tensor::cat(vec![e.clone(), e.clone()], 0),
        Tensor::cat(vec![x.clone(), ctx.f([2, 0], (-1.0, 1.0))], 1),
        x.clone().slice([1..1, 0..3]),
        x.clone().slice([0..2, 2..2]),
        e.clone().slice([0..0, 1..2]),
        e.clone().permute([1, 0]),
        e.clone().flip([0]),
        Tensor::stack::<3>(vec![e.clone(), e.clone()], 1),
        e.transpose(),
    )
});

diff!(empty_indexing, Tol::EXACT, |ctx| {
    let x = ctx.f([2, 3], (-1.0, 1.0));
    let e = ctx.f([0, 3], (-1.0, 1.0));
    let none = ctx.idx::<1>(TensorData::new(Vec::<i64>::new(), [0]));
    (
        // No indices: empty results, unchanged targets.
        x.clone().select(0, none.clone()),
        x.clone()
            .gather(1, ctx.idx::<2>(TensorData::new(Vec::<i64>::new(), [2, 0]))),
        x.clone().select_assign(
            0,
            none.clone(),
            ctx.f([0, 3], (-1.0, 1.0)),
            IndexingUpdateOp::Add,
        ),
        x.clone().scatter(
            1,
            ctx.idx::<2>(TensorData::new(Vec::<i64>::new(), [2, 0])),
            ctx.f([2, 0], (-1.0, 1.0)),
            IndexingUpdateOp::Add,
        ),
        // Indexing into an empty tensor along a non-empty dim.
        e.clone()
            .select(1, ctx.idx::<1>(TensorData::new(vec![0i64, 2], [2]))),
        e.gather(1, ctx.idx::<2>(TensorData::new(Vec::<i64>::new(), [0, 2]))),
    )
});

diff!(empty_batch_conv_pool, Tol::F32, |ctx| {
    let x = ctx.f([0, 2, 5, 5], (-1.0, 1.0));
    let w = ctx.f([3, 2, 3, 3], (-1.0, 1.0));
    let b = ctx.f([3], (-1.0, 1.0));
    (
        conv2d(
            x.clone(),
            w,
            Some(b),
            ConvOptions::new([1, 1], [1, 1], [1, 1], 1),
        ),
        max_pool2d(x.clone(), [2, 2], [2, 2], [0, 0], [1, 1], false),
        avg_pool2d(x, [2, 2], [2, 2], [0, 0], true, false),
    )
});

// ---------------------------------------------------------------------------------------------
// NaN and infinities through comparisons
// ---------------------------------------------------------------------------------------------

const SPECIALS: [f32; 7] = [
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    0.0,
    -0.0,
    1.0,
    -1.0,
];

diff!(nan_inf_comparisons, Tol::EXACT, FLOATS, |ctx| {
    // Every ordered pair of specials.
    let n = SPECIALS.len();
    let (mut va, mut vb) = (Vec::new(), Vec::new());
    for &x in &SPECIALS {
        for &y in &SPECIALS {
            va.push(x);
            vb.push(y);
        }
    }
    let a = ctx.fd::<1>(TensorData::new(va, [n * n]));
    let b = ctx.fd::<1>(TensorData::new(vb, [n * n]));
    (
        a.clone().greater(b.clone()),
        a.clone().greater_equal(b.clone()),
        a.clone().lower(b.clone()),
        a.clone().lower_equal(b.clone()),
        a.clone().greater_elem(0.0),
        a.clone().lower_elem(f32::INFINITY),
        a.clone().greater_equal_elem(f32::NEG_INFINITY),
    )
});

#[test]
fn nan_inf_equality_is_ieee() {
    // burn-ndarray 0.21 treats NaN as equal to every value (`equal`, `not_equal`, `equal_elem`,
    // and so `is_nan` and `is_inf`, which it builds from them), so these are checked against IEEE
    // 754, which Burn's GPU backends and MLX follow: NaN compares unequal to everything.
    let (mut va, mut vb) = (Vec::new(), Vec::new());
    for &x in &SPECIALS {
        for &y in &SPECIALS {
            va.push(x);
            vb.push(y);
        }
    }
    let n = va.len();
    let a = Tensor::<Mlx, 1>::from_data(TensorData::new(va.clone(), [n]), &CPU);
    let b = Tensor::<Mlx, 1>::from_data(TensorData::new(vb.clone(), [n]), &CPU);
    let bools = |t: Tensor<Mlx, 1, Bool>| -> Vec<bool> { t.into_data().to_vec().unwrap() };
    let pairs = || va.iter().zip(&vb);
    assert_eq!(
        bools(a.clone().equal(b.clone())),
        pairs().map(|(x, y)| x == y).collect::<Vec<_>>()
    );
    assert_eq!(
        bools(a.clone().not_equal(b.clone())),
        pairs().map(|(x, y)| x != y).collect::<Vec<_>>()
    );
    assert_eq!(bools(a.clone().equal_elem(f32::NAN)), vec![false; n]);
    assert_eq!(
        bools(a.clone().equal_elem(f32::INFINITY)),
        va.iter().map(|&x| x == f32::INFINITY).collect::<Vec<_>>()
    );
    assert_eq!(
        bools(a.clone().is_nan()),
        va.iter().map(|x| x.is_nan()).collect::<Vec<_>>()
    );
    assert_eq!(
        bools(a.clone().is_inf()),
        va.iter().map(|x| x.is_infinite()).collect::<Vec<_>>()
    );
    let picked = floats(a.clone().mask_where(a.clone().is_nan(), b));
    for i in 0..n {
        let want = if va[i].is_nan() { vb[i] } else { va[i] };
        assert!(
            picked[i] == want || (picked[i].is_nan() && want.is_nan()),
            "at {i}"
        );
    }
}

diff!(nan_inf_arithmetic, Tol::F32, |ctx| {
    let n = SPECIALS.len();
    let (mut va, mut vb) = (Vec::new(), Vec::new());
    for &x in &SPECIALS {
        for &y in &SPECIALS {
            va.push(x);
            vb.push(y);
        }
    }
    let a = ctx.fd::<1>(TensorData::new(va, [n * n]));
    let b = ctx.fd::<1>(TensorData::new(vb, [n * n]));
    (
        a.clone() + b.clone(),
        a.clone() - b.clone(),
        a.clone() * b.clone(),
        a.clone() / b,
        a.clone().exp(),
        a.clone().abs(),
        a.clone().sum(),
        a.sign(),
    )
});

// ---------------------------------------------------------------------------------------------
// Overflowing casts. burn-ndarray panics ("cannot be represented in the target type"); Burn does
// not define a result. burn-mlx follows MLX's C++ casts, pinned here.
// ---------------------------------------------------------------------------------------------

#[test]
fn int_to_narrower_int_wraps_like_rust_as() {
    let v: Vec<i64> = vec![
        300,
        -129,
        128,
        65536,
        -1,
        1 << 40,
        i64::MIN,
        i64::MAX,
        0,
        127,
    ];
    let t = Tensor::<Mlx, 1, Int>::from_data(TensorData::new(v.clone(), [v.len()]), &CPU);
    let cast = |d: DType| ints(t.clone().cast(d));
    assert_eq!(
        cast(DType::I8),
        v.iter().map(|&x| x as i8 as i64).collect::<Vec<_>>()
    );
    assert_eq!(
        cast(DType::I16),
        v.iter().map(|&x| x as i16 as i64).collect::<Vec<_>>()
    );
    assert_eq!(
        cast(DType::I32),
        v.iter().map(|&x| x as i32 as i64).collect::<Vec<_>>()
    );
    assert_eq!(
        cast(DType::U8),
        v.iter().map(|&x| x as u8 as i64).collect::<Vec<_>>()
    );
    assert_eq!(
        cast(DType::U16),
        v.iter().map(|&x| x as u16 as i64).collect::<Vec<_>>()
    );
    let u32s: Vec<u32> = t.clone().cast(DType::U32).into_data().to_vec().unwrap();
    assert_eq!(u32s, v.iter().map(|&x| x as u32).collect::<Vec<_>>());
    let u64s: Vec<u64> = t.clone().cast(DType::U64).into_data().to_vec().unwrap();
    assert_eq!(u64s, v.iter().map(|&x| x as u64).collect::<Vec<_>>());
}

#[test]
fn float_to_int_truncates_in_range_and_is_deterministic_out_of_range() {
    let inr = [
        2.7f32, -2.7, 0.5, -0.5, 300.0, -129.0, 1e9, -1e9, 16777216.0,
    ];
    let t = Tensor::<Mlx, 1>::from_floats(inr, &CPU);
    assert_eq!(
        ints(t.int()),
        inr.iter().map(|&x| x as i64).collect::<Vec<_>>()
    );
    // Out of range of i64, NaN and infinities: C++ leaves the conversion undefined; MLX's CPU
    // kernel gives the hardware's answer. It must at least be the same every time.
    let oor = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, -1e30];
    let run = || ints(Tensor::<Mlx, 1>::from_floats(oor, &CPU).int());
    let first = run();
    for _ in 0..3 {
        assert_eq!(run(), first);
    }
    #[cfg(target_arch = "x86_64")]
    assert_eq!(
        first,
        vec![i64::MIN; 5],
        "x86-64's cvttss2si 'integer indefinite' value"
    );
    #[cfg(target_arch = "aarch64")]
    assert_eq!(
        first,
        vec![0, i64::MAX, i64::MIN, i64::MAX, i64::MIN],
        "arm64 saturates"
    );
    // Narrower int dtypes from float go through i64 first (Burn's `int()`), then wrap.
    let t = Tensor::<Mlx, 1>::from_floats([300.0, -129.0, 3e9], &CPU);
    assert_eq!(
        ints(t.clone().int().cast(DType::I8)),
        vec![44, 127, 3e9 as i64 as i8 as i64]
    );
    assert_eq!(
        ints(t.int().cast(DType::I32)),
        vec![300, -129, 3e9 as i64 as i32 as i64]
    );
}

// ---------------------------------------------------------------------------------------------
// Out-of-range indices. Burn: "out of bounds indices could lead to unexpected results instead
// of panicking". MLX does no bounds check (it read garbage and corrupted the heap); burn-mlx
// clamps gather/select indices into range and drops scatter-add updates at out-of-range indices.
// ---------------------------------------------------------------------------------------------

#[test]
fn out_of_range_gather_and_select_are_clamped() {
    let t = Tensor::<Mlx, 1>::from_floats([1.0, 2.0, 3.0], &CPU);
    let idx = Tensor::<Mlx, 1, Int>::from_ints([0, 5, 100_000, -1, 2], &CPU);
    for _ in 0..3 {
        assert_eq!(
            floats(t.clone().gather(0, idx.clone())),
            vec![1.0, 3.0, 3.0, 1.0, 3.0]
        );
        assert_eq!(
            floats(t.clone().select(0, idx.clone())),
            vec![1.0, 3.0, 3.0, 1.0, 3.0]
        );
    }
    let i = Tensor::<Mlx, 1, Int>::from_ints([10, 20, 30], &CPU);
    assert_eq!(ints(i.gather(0, idx.clone())), vec![10, 30, 30, 10, 30]);
    let b = Tensor::<Mlx, 1, Bool>::from_bool(TensorData::from([true, false, false]), &CPU);
    let got: Vec<bool> = b.select(0, idx).into_data().to_vec().unwrap();
    assert_eq!(got, vec![true, false, false, true, false]);
    // 2-d, along each dim, with i32 indices.
    let m = Tensor::<Mlx, 2>::from_floats([[1.0, 2.0], [3.0, 4.0]], &CPU);
    let gi = Tensor::<Mlx, 2, Int>::from_data(TensorData::new(vec![0i32, 9, -7, 1], [2, 2]), &CPU);
    let g: Vec<f32> = m.clone().gather(1, gi).into_data().to_vec().unwrap();
    assert_eq!(g, vec![1.0, 2.0, 3.0, 4.0]);
    let nd = Tensor::<Mlx, 2, Int>::from_ints([[0, 1], [5, 5], [-3, 0]], &CPU);
    let g: Vec<f32> = m.gather_nd::<2, 1>(nd).into_data().to_vec().unwrap();
    assert_eq!(g.len(), 3);
    assert_eq!(g[0], 2.0);
    cpu_still_works();
}

#[test]
fn out_of_range_scatter_updates_are_dropped() {
    let t = Tensor::<Mlx, 1>::from_floats([1.0, 2.0, 3.0], &CPU);
    let idx = Tensor::<Mlx, 1, Int>::from_ints([0, 5, 100_000, -1, 2], &CPU);
    let ones = Tensor::<Mlx, 1>::ones([5], &CPU);
    let s = t
        .clone()
        .scatter(0, idx.clone(), ones.clone(), IndexingUpdateOp::Add);
    assert_eq!(floats(s), vec![2.0, 2.0, 4.0]);
    let s = t.select_assign(0, idx.clone(), ones, IndexingUpdateOp::Add);
    assert_eq!(floats(s), vec![2.0, 2.0, 4.0]);
    let i = Tensor::<Mlx, 1, Int>::from_ints([1, 1, 1], &CPU);
    let s = i.scatter(0, idx, Tensor::ones([5], &CPU), IndexingUpdateOp::Add);
    assert_eq!(ints(s), vec![2, 1, 2]);
    // scatter_nd: positions are clamped into the tensor (memory-safe; the result is Burn's
    // "unexpected result").
    let m = Tensor::<Mlx, 2>::zeros([2, 2], &CPU);
    let nd = Tensor::<Mlx, 2, Int>::from_ints([[0, 0], [7, 7], [-9, -9]], &CPU);
    let v = Tensor::<Mlx, 1>::ones([3], &CPU);
    let out: Vec<f32> = m
        .scatter_nd(nd, v, IndexingUpdateOp::Add)
        .into_data()
        .to_vec()
        .unwrap();
    assert_eq!(out.iter().sum::<f32>(), 3.0);
    assert_eq!(out[0], 2.0);
    cpu_still_works();
}

#[test]
fn out_of_range_indices_do_not_corrupt_memory() {
    // Before the clamp, far out-of-range scatters wrote outside MLX's buffers and glibc aborted
    // the process ("free(): invalid next size"). Hammer it, then allocate and compute.
    for k in 0..200i64 {
        let t = Tensor::<Mlx, 1>::zeros([4], &CPU);
        let idx =
            Tensor::<Mlx, 1, Int>::from_ints([k * 1_000_003, -k * 7_919, 3, i32::MAX as i64], &CPU);
        let v = Tensor::<Mlx, 1>::ones([4], &CPU);
        let s = floats(t.scatter(0, idx.clone(), v, IndexingUpdateOp::Add));
        assert_eq!(s.iter().sum::<f32>(), if k == 0 { 3.0 } else { 1.0 });
        let big = Tensor::<Mlx, 1>::random([4096], Distribution::Default, &CPU);
        let _ = big.clone().gather(0, idx).into_data();
        let _ = (big.clone() * big).sum().into_data();
    }
    cpu_still_works();
}

#[test]
fn gather_from_an_empty_dim_is_an_error_or_empty() {
    // No valid index exists: MLX refuses a non-empty take from an empty axis.
    let e = Tensor::<Mlx, 2>::zeros([2, 0], &CPU);
    let idx = Tensor::<Mlx, 2, Int>::from_ints([[0], [0]], &CPU);
    let r = catch_unwind(AssertUnwindSafe(|| e.gather(1, idx).into_data()));
    if let Err(err) = r {
        let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("gather"), "{msg}");
    }
    cpu_still_works();
}

diff!(in_range_indexing_still_matches, Tol::EXACT, |ctx| {
    // The clamp must not change in-range results, for narrow index dtypes too (i8 indices on a
    // dim longer than i8::MAX).
    let x = ctx.f([200, 3], (-1.0, 1.0));
    let i8s = ctx.idata_as::<1>(TensorData::new(vec![0i64, 127, 5, 127, 0], [5]), DType::I8);
    let i32s = ctx.idata_as::<2>(
        TensorData::new(vec![199i64, 0, 1, 2, 198, 0], [2, 3]),
        DType::I32,
    );
    (
        x.clone().select(0, i8s.clone()),
        x.clone().gather(0, i32s.clone()),
        x.clone()
            .select_assign(0, i8s, ctx.f([5, 3], (-1.0, 1.0)), IndexingUpdateOp::Add),
        x.scatter(0, i32s, ctx.f([2, 3], (-1.0, 1.0)), IndexingUpdateOp::Add),
    )
});

// ---------------------------------------------------------------------------------------------
// Shapes too large to allocate: a clear panic, never a crash
// ---------------------------------------------------------------------------------------------

#[test]
fn dimensions_beyond_i32_panic_clearly() {
    let msg = panic_message(|| Tensor::<Mlx, 1>::zeros([1usize << 40], &CPU));
    assert!(msg.contains("zeros") && msg.contains("2^31"), "{msg}");
    let msg = panic_message(|| Tensor::<Mlx, 2, Int>::ones([1usize << 31, 2], &CPU));
    assert!(msg.contains("2^31"), "{msg}");
    cpu_still_works();
}

#[test]
fn buffers_larger_than_memory_panic_clearly() {
    let huge = [1usize << 20, 1 << 20];
    let check = |msg: String| {
        assert!(
            msg.contains("bytes") && msg.contains("memory") && msg.contains("[1048576, 1048576]"),
            "{msg}"
        );
    };
    check(panic_message(|| Tensor::<Mlx, 2>::zeros(huge, &CPU)));
    check(panic_message(|| Tensor::<Mlx, 2>::ones(huge, &CPU).exp()));
    check(panic_message(|| {
        Tensor::<Mlx, 2>::random(huge, Distribution::Default, &CPU)
    }));
    check(panic_message(|| Tensor::<Mlx, 2, Int>::zeros(huge, &CPU)));
    check(panic_message(|| {
        Tensor::<Mlx, 2, Bool>::empty(huge, &CPU).into_data()
    }));
    // Outputs of ops, not only creation.
    check(panic_message(|| {
        let col = Tensor::<Mlx, 2>::ones([1 << 20, 1], &CPU);
        let row = Tensor::<Mlx, 2>::ones([1, 1 << 20], &CPU);
        col.matmul(row)
    }));
    check(panic_message(|| {
        Tensor::<Mlx, 2>::ones([1, 1 << 20], &CPU).expand(huge)
    }));
    cpu_still_works();
}
