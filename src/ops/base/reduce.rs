//! Reductions and scans: sums, products and means (f16/bf16 accumulated in f32), max/min and
//! their indices with Burn's NaN rules, cumulative ops, and `any`/`all`.

use super::arith::int_div_trunc;
use super::create::{cast, cast_array, full, zeros};
use super::index::gather;
use super::layout::flatten;
use super::{unary, MlxResult};
use crate::device::MlxDevice;
use crate::dtype::is_float;
use crate::tensor::MlxTensor;
use crate::tensor::{scalar_array, OrPanic};
use burn_backend::{Scalar, Shape};
use mlx_rs::{ops, Array, Dtype};

/// Sum of every element, as a 1-element tensor of the input's dtype.
pub(crate) fn sum(t: MlxTensor) -> MlxTensor {
    let dtype = t.array.dtype();
    unary(t, "sum", |a| {
        cast_array(accumulable(a)?.sum(None)?.reshape(&[1])?, dtype)
    })
}

/// Sum along `dim`, keeping it (floats on the GPU through [`sum_axis_split`]).
pub(crate) fn sum_dim(t: MlxTensor, dim: usize) -> MlxTensor {
    let dtype = t.array.dtype();
    let split = t.device == MlxDevice::Gpu && is_float(dtype);
    unary(t, "sum_dim", |a| {
        cast_array(sum_axis_split(&accumulable(a)?, dim, split)?, dtype)
    })
}

/// `a` summed along `axis`, which is kept with length 1.
///
/// With `split`, a long column reduction that MLX's CUDA backend would give too few thread
/// blocks runs in two passes instead. MLX 0.32's `col_reduce_looped` starts one block per 32
/// output columns and loops each block over every reduced row, so the bias gradient of a
/// `[8192, 512]` activation (512 sums of 8,192 rows) ran on 16 blocks of an H200's 132
/// multiprocessors and took 92 us, where reading its 16 MB takes about 5 us. Here the rows
/// are cut into `k` groups: the first pass sums each group (`k` times as many blocks), the
/// second the `k` partial sums. Sums over the last axis (row reductions), short columns and
/// wide outputs go to MLX as one reduction. On MLX's CUDA device an f32 sum that would be split
/// runs as two custom kernels instead ([`column_sum_cuda`](super::column_sum_cuda)), which take
/// about a third of the time of MLX's two reductions.
pub(crate) fn sum_axis_split(a: &Array, axis: usize, split: bool) -> MlxResult {
    let shape = a.shape();
    let rows = shape[axis] as usize;
    let outer: usize = shape[..axis].iter().map(|&d| d as usize).product();
    let inner: usize = shape[axis + 1..].iter().map(|&d| d as usize).product();
    let groups = if split {
        row_groups(outer, rows, inner)
    } else {
        None
    };
    let Some(k) = groups else {
        return a.sum_axis(axis as i32, true);
    };
    let mut kept = shape.to_vec();
    kept[axis] = 1;
    if a.dtype() == Dtype::Float32
        && super::column_sum_cuda::enabled()
        && crate::native::kernel::default_stream_on_cuda()
    {
        return super::column_sum_cuda::column_sum(a, outer, rows, inner)?.reshape(&kept);
    }
    let split_shape = [outer as i32, k as i32, (rows / k) as i32, inner as i32];
    let partial = a.reshape(&split_shape)?.sum_axis(2, false)?;
    partial.sum_axis(1, false)?.reshape(&kept)
}

/// `a` `[…, d]` summed over every axis but the last, as a `[d]` array of `a`'s dtype (f16/bf16
/// accumulated in f32), through [`sum_axis_split`] when `split` and the rows are many enough: a
/// bias's or a normalization weight's gradient. A sum that is not split is one reduction over
/// the leading axes, with no reshape (which would copy a gradient that is not contiguous).
pub(crate) fn sum_leading_axes(a: &Array, split: bool) -> MlxResult {
    let shape = a.shape();
    let d = *shape.last().unwrap_or(&1);
    let leading = shape.len().saturating_sub(1);
    let rows: usize = shape[..leading].iter().map(|&n| n as usize).product();
    let acc = accumulable(a)?;
    let sum = if split && row_groups(1, rows, d as usize).is_some() {
        sum_axis_split(&acc.reshape(&[-1, d])?, 0, true)?.reshape(&[d])?
    } else {
        let axes: Vec<i32> = (0..leading as i32).collect();
        acc.sum_axes(&axes, false)?
    };
    sum.as_dtype(a.dtype())
}

/// The fewest rows a column sum needs to be split. Shorter columns take one pass: at 2,048 rows
/// one reduction costs the GPU about a quarter of the 92 us measured at 8,192, so the split
/// saves little there, and steps of that size are bound by the host, which pays for the two
/// extra primitives. Measured on an H200 (2026-11-27, `train_bench`, alternating rounds):
/// burn-nn's encoder at batch 16 (2,048 rows) ran at 0.6-0.97x with the split against without.
const SPLIT_MIN_ROWS: usize = 4096;

/// The number of row groups for [`sum_axis_split`]: `None` where MLX's one reduction already
/// has enough thread blocks (an output of 8,192 or more values, 32 per block), the columns are
/// short (under [`SPLIT_MIN_ROWS`] rows) or the axis is the last one, or when
/// `BURN_MLX_SPLIT_SUMS=0` (for A/B measurements); otherwise the divisor of `rows` between 8
/// and 64 closest to 32 (`None` when it has none).
fn row_groups(outer: usize, rows: usize, inner: usize) -> Option<usize> {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *OFF.get_or_init(|| std::env::var("BURN_MLX_SPLIT_SUMS").as_deref() == Ok("0")) {
        return None;
    }
    if inner == 1 || rows < SPLIT_MIN_ROWS || outer * inner >= 8192 {
        return None;
    }
    (8..=64)
        .filter(|&k| rows.is_multiple_of(k))
        .min_by_key(|&k| k.abs_diff(32))
}

/// `a` in a dtype whose sums, products, means and scans are accurate: f16/bf16 widened to f32,
/// other dtypes unchanged. The result is rounded to the input's dtype once, at the end.
///
/// MLX reduces and scans half-precision arrays in their own dtype in places, on the CPU as on
/// the GPU (MLX 0.32.2): a sum of 5,346 f16 ones stopped at 2,048 (f16's spacing there is 2),
/// the mean of 0..1024 overflowed f16 through its running sum, and the CUDA reduction lost 0.07
/// on a bf16 sum of 60 values. burn-ndarray and burn-flex accumulate these in f32.
fn accumulable(a: &Array) -> MlxResult {
    if matches!(a.dtype(), Dtype::Float16 | Dtype::Bfloat16) {
        a.as_dtype(Dtype::Float32)
    } else {
        Ok(a.clone())
    }
}

/// Product of every element.
pub(crate) fn prod(t: MlxTensor) -> MlxTensor {
    let dtype = t.array.dtype();
    unary(t, "prod", |a| {
        cast_array(accumulable(a)?.prod(None)?.reshape(&[1])?, dtype)
    })
}

/// Product along `dim`, keeping it.
pub(crate) fn prod_dim(t: MlxTensor, dim: usize) -> MlxTensor {
    let dtype = t.array.dtype();
    unary(t, "prod_dim", |a| {
        cast_array(accumulable(a)?.prod_axis(dim as i32, true)?, dtype)
    })
}

/// A float mean: `sum` of `a` (f16/bf16 accumulated in f32) divided by its `n` elements, cast
/// to `dtype`. A division, not MLX's `mean` (a product with 1/n): compiled, that product can
/// land 1 ulp from the quotient Burn's backends give (0.99999994 for the mean of 0, 1 and 2).
fn float_mean(
    a: &Array,
    n: usize,
    dtype: Dtype,
    sum: impl FnOnce(&Array) -> MlxResult,
) -> MlxResult {
    let total = sum(&accumulable(a)?)?;
    let count = scalar_array(Scalar::Float(n as f64), total.dtype());
    cast_array(total.divide(&count)?, dtype)
}

/// Mean along `dim`, keeping it (integer means truncate, as Burn's do).
pub(crate) fn mean_dim(t: MlxTensor, dim: usize) -> MlxTensor {
    let dtype = t.array.dtype();
    if is_float(dtype) {
        let n = t.dims()[dim];
        return unary(t, "mean_dim", |a| {
            float_mean(a, n, dtype, |x| x.sum_axis(dim as i32, true))
        });
    }
    let n = t.dims()[dim].max(1) as i64;
    unary(t, "mean_dim", |a| {
        let s = cast_array(a.sum_axis(dim as i32, true)?, dtype)?;
        int_div_trunc(&s, &scalar_array(Scalar::Int(n), dtype))
    })
}

/// Mean of every element, as a 1-element tensor.
pub(crate) fn mean(t: MlxTensor) -> MlxTensor {
    let dtype = t.array.dtype();
    if is_float(dtype) {
        let n = t.array.size();
        return unary(t, "mean", |a| {
            float_mean(a, n, dtype, |x| x.sum(None)?.reshape(&[1]))
        });
    }
    let n = t.array.size().max(1) as i64;
    unary(t, "mean", |a| {
        let s = cast_array(a.sum(None)?.reshape(&[1])?, dtype)?;
        int_div_trunc(&s, &scalar_array(Scalar::Int(n), dtype))
    })
}

/// Maximum of every element.
///
/// Floats follow Burn's definition (`max_dim` of the flattened tensor, so NaN handling is
/// `argmax`'s); integers use MLX's reduction directly.
pub(crate) fn max(t: MlxTensor) -> MlxTensor {
    if is_float(t.array.dtype()) {
        return max_dim(flatten(t), 0);
    }
    unary(t, "max", |a| a.max(None)?.reshape(&[1]))
}

/// Minimum of every element (see [`max`] for NaN handling).
pub(crate) fn min(t: MlxTensor) -> MlxTensor {
    if is_float(t.array.dtype()) {
        return min_dim(flatten(t), 0);
    }
    unary(t, "min", |a| a.min(None)?.reshape(&[1]))
}

/// Maximum along `dim`, keeping it.
///
/// For floats this is the value at `argmax`, which is how Burn defines `max_dim`: a NaN is
/// skipped unless it comes first along `dim`, exactly as burn-ndarray does. MLX's own reduction
/// would propagate every NaN.
pub(crate) fn max_dim(t: MlxTensor, dim: usize) -> MlxTensor {
    if is_float(t.array.dtype()) && t.array.size() == 0 {
        return empty_reduction(&t, dim, f64::NEG_INFINITY);
    }
    if is_float(t.array.dtype()) {
        let idx = argmax(t.clone(), dim, Dtype::Int32);
        return take_along(t, idx, dim, "max_dim");
    }
    unary(t, "max_dim", |a| a.max_axis(dim as i32, true))
}

/// Minimum along `dim`, keeping it (see [`max_dim`] for NaN handling).
pub(crate) fn min_dim(t: MlxTensor, dim: usize) -> MlxTensor {
    if is_float(t.array.dtype()) && t.array.size() == 0 {
        return empty_reduction(&t, dim, f64::INFINITY);
    }
    if is_float(t.array.dtype()) {
        let idx = argmin(t.clone(), dim, Dtype::Int32);
        return take_along(t, idx, dim, "min_dim");
    }
    unary(t, "min_dim", |a| a.min_axis(dim as i32, true))
}

/// A float reduction along `dim` of a tensor with no elements: the reduced shape filled with the
/// reduction's identity (`-inf` for max, `+inf` for min), so that expressions such as
/// `x - x.max_dim(d)` stay empty instead of failing. MLX refuses to reduce empty arrays.
fn empty_reduction(t: &MlxTensor, dim: usize, identity: f64) -> MlxTensor {
    let mut shape = t.dims();
    shape[dim] = 1;
    full(
        &Shape::from(shape),
        Scalar::Float(identity),
        t.array.dtype(),
        &t.device,
    )
}

/// `t`'s values at `idx` along `dim` (`idx` already has `t`'s rank).
fn take_along(t: MlxTensor, idx: MlxTensor, dim: usize, op: &str) -> MlxTensor {
    let out = t
        .device
        .scope(|| ops::indexing::take_along_axis(&t.array, &idx.array, dim as i32))
        .or_panic(op, &[&t.array, &idx.array]);
    t.with(out)
}

/// Output of an index reduction over an input with no elements: an empty tensor of the reduced
/// shape, or a panic when the reduced dimension itself is empty (there is no index to return).
fn arg_reduce_empty(t: &MlxTensor, dim: usize, out: Dtype, op: &str) -> Option<MlxTensor> {
    if t.array.size() != 0 {
        return None;
    }
    let mut shape = t.dims();
    if shape[dim] == 0 {
        panic!(
            "burn-mlx: `{op}` along dimension {dim} of a tensor of shape {shape:?}: the dimension \
             is empty, so there is no index to return"
        );
    }
    shape[dim] = 1;
    Some(zeros(&Shape::from(shape), out, &t.device))
}

/// Index of the maximum along `dim` (the first one on ties), keeping the dim.
pub(crate) fn argmax(t: MlxTensor, dim: usize, out: Dtype) -> MlxTensor {
    if let Some(empty) = arg_reduce_empty(&t, dim, out, "argmax") {
        return empty;
    }
    unary(t, "argmax", |a| {
        let idx = if is_float(a.dtype()) {
            arg_extreme_nan_first(a, dim as i32, f64::NEG_INFINITY, |x, d| {
                ops::indexing::argmax_axis(x, d, true)
            })?
        } else {
            ops::indexing::argmax_axis(a, dim as i32, true)?
        };
        idx.as_dtype(out)
    })
}

/// Index of the minimum along `dim` (the first one on ties), keeping the dim.
pub(crate) fn argmin(t: MlxTensor, dim: usize, out: Dtype) -> MlxTensor {
    if let Some(empty) = arg_reduce_empty(&t, dim, out, "argmin") {
        return empty;
    }
    unary(t, "argmin", |a| {
        let idx = if is_float(a.dtype()) {
            arg_extreme_nan_first(a, dim as i32, f64::INFINITY, |x, d| {
                ops::indexing::argmin_axis(x, d, true)
            })?
        } else {
            ops::indexing::argmin_axis(a, dim as i32, true)?
        };
        idx.as_dtype(out)
    })
}

/// Burn's float `argmax`/`argmin`, whose NaN rule MLX's kernels do not follow.
///
/// Burn (burn-ndarray) scans from the first element and keeps it while no later value compares
/// greater (less), so a NaN wins only when it comes first along the axis, and later NaNs are
/// skipped. MLX 0.32.4's kernels take the first NaN wherever it is (the CPU's scan) or any NaN
/// (CUDA's tree reduction). Here every NaN becomes `skip` (which never wins over the first
/// element on ties), and a NaN in the first position wins outright.
fn arg_extreme_nan_first(
    a: &Array,
    axis: i32,
    skip: f64,
    arg: impl Fn(&Array, i32) -> MlxResult,
) -> MlxResult {
    let filler = Array::from_f32(skip as f32).as_dtype(a.dtype())?;
    let cleaned = ops::select(&a.is_nan()?, &filler, a)?;
    let idx = arg(&cleaned, axis)?;
    let first = a.take_axis(Array::from_slice(&[0i32], &[1]), axis)?;
    let zero = Array::from_int(0).as_dtype(idx.dtype())?;
    ops::select(&first.is_nan()?, &zero, &idx)
}

/// `max_dim` and the index of the first maximum.
pub(crate) fn max_dim_with_indices(t: MlxTensor, dim: usize, out: Dtype) -> (MlxTensor, MlxTensor) {
    let idx = argmax(t.clone(), dim, Dtype::Int32);
    let values = gather(dim, t, idx.clone());
    (values, cast(idx, out))
}

/// `min_dim` and the index of the first minimum.
pub(crate) fn min_dim_with_indices(t: MlxTensor, dim: usize, out: Dtype) -> (MlxTensor, MlxTensor) {
    let idx = argmin(t.clone(), dim, Dtype::Int32);
    let values = gather(dim, t, idx.clone());
    (values, cast(idx, out))
}

/// Cumulative op along `dim`, keeping the input dtype (f16/bf16 scanned in f32, see
/// [`accumulable`]).
pub(crate) fn cumulative(
    t: MlxTensor,
    dim: usize,
    op: &str,
    f: impl FnOnce(&Array, i32) -> MlxResult,
) -> MlxTensor {
    let dtype = t.array.dtype();
    unary(t, op, |a| {
        cast_array(f(&accumulable(a)?, dim as i32)?, dtype)
    })
}

/// Burn's float `cummax`/`cummin`: a NaN stays where it is and does not spread to later
/// positions (MLX's scans would carry it forward); `fill` is the identity of the scan.
pub(crate) fn float_cum_extreme(
    t: MlxTensor,
    dim: usize,
    op: &str,
    fill: f32,
    f: impl FnOnce(&Array, i32) -> MlxResult,
) -> MlxTensor {
    unary(t, op, |a| {
        let nan = ops::is_nan(a)?;
        let fill = Array::from_f32(fill).as_dtype(a.dtype())?;
        let scanned = f(&ops::select(&nan, &fill, a)?, dim as i32)?;
        ops::select(&nan, a, &scanned)
    })
}

/// Whether any element is true (non-zero), as a 1-element bool tensor.
pub(crate) fn any(t: MlxTensor) -> MlxTensor {
    unary(t, "any", |a| a.any(None)?.reshape(&[1]))
}

/// Whether every element is true (non-zero), as a 1-element bool tensor.
pub(crate) fn all(t: MlxTensor) -> MlxTensor {
    unary(t, "all", |a| a.all(None)?.reshape(&[1]))
}

/// `any` along `dim`, keeping it.
pub(crate) fn any_dim(t: MlxTensor, dim: usize) -> MlxTensor {
    unary(t, "any_dim", |a| a.any_axis(dim as i32, true))
}

/// `all` along `dim`, keeping it.
pub(crate) fn all_dim(t: MlxTensor, dim: usize) -> MlxTensor {
    unary(t, "all_dim", |a| a.all_axis(dim as i32, true))
}

#[cfg(test)]
mod tests {
    use super::{row_groups, sum_axis_split, sum_leading_axes};
    use mlx_rs::random;
    use mlx_rs::Dtype;

    /// The two-pass sum equals MLX's one reduction (to f32 rounding) on the shapes it splits,
    /// and is MLX's reduction itself on those it does not.
    #[test]
    fn split_sums_match_one_reduction() {
        for (shape, axis, splits) in [
            (vec![8192, 16], 0, true),
            (vec![3, 4800, 5], 1, true),
            (vec![2, 4096, 3, 4], 1, true),
            (vec![2048, 16], 0, false),
            (vec![4099, 16], 0, false),
            (vec![16, 8192], 1, false),
            (vec![2048, 8192], 0, false),
        ] {
            let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
            let outer: usize = dims[..axis].iter().product();
            let inner: usize = dims[axis + 1..].iter().product();
            assert_eq!(
                row_groups(outer, dims[axis], inner).is_some(),
                splits,
                "{shape:?}"
            );
            let a = random::normal::<f32>(&shape, None, None, None).unwrap();
            let two = sum_axis_split(&a, axis, true).unwrap();
            let one = a.sum_axis(axis as i32, true).unwrap();
            assert_eq!(two.shape(), one.shape());
            let diff = two
                .subtract(&one)
                .unwrap()
                .abs()
                .unwrap()
                .max(None)
                .unwrap();
            let scale = one.abs().unwrap().max(None).unwrap();
            let (diff, scale) = (diff.item_cast::<f32>(), scale.item_cast::<f32>());
            assert!(
                diff <= 1e-5 * (1.0 + scale),
                "{shape:?} axis {axis}: {diff} of {scale}"
            );
        }
    }

    /// A bias gradient's sum over the leading axes, split (4,800 rows) or not (2,400), equals
    /// MLX's one reduction over those axes, in f32 and (accumulated in f32) in bf16.
    #[test]
    fn leading_axes_sum_like_one_reduction() {
        for shape in [[4, 600, 16], [8, 600, 16]] {
            for dtype in [Dtype::Float32, Dtype::Bfloat16] {
                let a = random::normal::<f32>(&shape, None, None, None)
                    .unwrap()
                    .as_dtype(dtype)
                    .unwrap();
                let want = a
                    .as_dtype(Dtype::Float32)
                    .unwrap()
                    .sum_axes(&[0, 1], false)
                    .unwrap();
                for split in [false, true] {
                    let got = sum_leading_axes(&a, split).unwrap();
                    assert_eq!(got.shape(), &[16], "{shape:?}");
                    assert_eq!(got.dtype(), dtype, "{shape:?}");
                    let diff = got
                        .as_dtype(Dtype::Float32)
                        .unwrap()
                        .subtract(&want)
                        .unwrap()
                        .abs()
                        .unwrap()
                        .max(None)
                        .unwrap()
                        .item_cast::<f32>();
                    // bf16 keeps 8 significant bits: a sum under 256 in size rounds by 0.5 at most.
                    let tol = if dtype == Dtype::Float32 { 1e-3 } else { 0.5 };
                    assert!(diff <= tol, "{shape:?} {dtype:?} split {split}: {diff}");
                }
            }
        }
    }
}
