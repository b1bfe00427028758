//! Long column sums on MLX's CUDA device as two custom kernels (see `native::kernel`): the
//! gradients of biases and normalization weights, `[rows, d]` summed over its rows.
//!
//! MLX 0.32's CUDA column reduction gives such a sum one thread block per 32 columns, each looping
//! over every row, so [`super::reduce::sum_axis_split`] cuts the rows into groups and reduces
//! twice. On an H200 (decoder LM, 8,192 rows of 512 to 2,048 columns) the two MLX reductions
//! still took about 12 and 10 us: the second, over a few dozen partial sums, runs on a single
//! block. Here the first kernel reads each group of rows with 32 x 8 threads per 32 columns
//! (coalesced 128-byte rows, about four blocks per multiprocessor in all) and writes one partial
//! sum per group and column; the second adds a column's partial sums with one thread per column.
//! Both add in a fixed order, so the result does not vary from run to run.

use crate::native::kernel::with_kernel;
use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype};

/// Sums of groups of rows: `a` `[outer, rows, inner]` (f32, row-contiguous) to `part`
/// `[outer, G, inner]` with `G = gridDim.y`; block `(32, 8)`, grid `(inner / 32, G, outer)` blocks.
const PARTIALS: &str = r#"
  const int rows = a_shape[1];
  const int inner = a_shape[2];
  const int groups = gridDim.y;
  const int col = blockIdx.x * 32 + threadIdx.x;
  const int per_group = (rows + groups - 1) / groups;
  const int r0 = blockIdx.y * per_group;
  const int r1 = min(rows, r0 + per_group);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  if (col < inner) {
    const float* base = a + (size_t)blockIdx.z * rows * inner + col;
    int r = r0 + threadIdx.y;
    for (; r + 24 < r1; r += 32) {
      acc[0] += base[(size_t)r * inner];
      acc[1] += base[(size_t)(r + 8) * inner];
      acc[2] += base[(size_t)(r + 16) * inner];
      acc[3] += base[(size_t)(r + 24) * inner];
    }
    for (; r < r1; r += 8) acc[0] += base[(size_t)r * inner];
  }
  __shared__ float sums[8][33];
  sums[threadIdx.y][threadIdx.x] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  __syncthreads();
  if (threadIdx.y == 0 && col < inner) {
    float s = 0.f;
    for (int j = 0; j < 8; ++j) s += sums[j][threadIdx.x];
    part[((size_t)blockIdx.z * groups + blockIdx.y) * inner + col] = s;
  }
"#;

/// The column totals of `part` `[outer, G, inner]` to `out` `[outer, 1, inner]`, one thread per
/// output value.
const TOTALS: &str = r#"
  const int outer = part_shape[0];
  const int groups = part_shape[1];
  const int inner = part_shape[2];
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)outer * inner) return;
  const size_t o = i / inner;
  const size_t c = i % inner;
  const float* p = part + o * groups * inner + c;
  float s = 0.f;
  for (int g = 0; g < groups; ++g) s += p[(size_t)g * inner];
  out[i] = s;
"#;

/// The thread blocks the first pass aims at: about four per multiprocessor of an H100/H200 (132),
/// enough to keep their memory bandwidth busy.
const TARGET_BLOCKS: usize = 528;

/// The fewest rows a group sums: shorter groups spend more on the second pass than they save.
const MIN_GROUP_ROWS: usize = 64;

/// Whether long column sums take these kernels: on by default, off with
/// `BURN_MLX_SUM_KERNEL=0` (read once) for A/B measurements against MLX's two reductions.
pub(super) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("BURN_MLX_SUM_KERNEL").map_or(true, |v| v != "0"))
}

/// The number of row groups for `outer · ceil(inner / 32)` column tiles of `rows` rows.
fn groups(outer: usize, rows: usize, inner: usize) -> usize {
    let tiles = outer * inner.div_ceil(32);
    TARGET_BLOCKS
        .div_ceil(tiles)
        .clamp(1, (rows / MIN_GROUP_ROWS).max(1))
}

/// `a` (f32) `[outer, rows, inner]` summed over its rows, as `[outer, 1, inner]` f32, on the
/// thread's default stream (which must be MLX's CUDA device).
pub(super) fn column_sum(
    a: &Array,
    outer: usize,
    rows: usize,
    inner: usize,
) -> Result<Array, Exception> {
    let dims = |v: [usize; 3]| v.map(|d| d as i32);
    let a = a.reshape(&dims([outer, rows, inner]))?;
    let g = groups(outer, rows, inner);
    let part_shape = dims([outer, g, inner]);
    let part = with_kernel(
        "burn_mlx_column_partials",
        &["a"],
        &["part"],
        || PARTIALS.to_string(),
        "",
        |k| {
            k.apply(
                &[&a],
                &[(&part_shape, Dtype::Float32)],
                &[],
                [
                    (inner.div_ceil(32) * 32) as i32,
                    (g * 8) as i32,
                    outer as i32,
                ],
                [32, 8, 1],
            )
        },
    )
    .map_err(launch_error)?
    .pop()
    .expect("one output");
    column_totals(&part)
}

/// The column totals of `part` (f32 `[outer, groups, inner]`, row-contiguous) over its groups,
/// as `[outer, 1, inner]` f32, in a fixed order, on the thread's default stream (which must be
/// MLX's CUDA device): the second pass of [`column_sum`] and of other kernels that write
/// partial sums per group of rows.
pub(crate) fn column_totals(part: &Array) -> Result<Array, Exception> {
    let shape = part.shape();
    let (outer, inner) = (shape[0], shape[2]);
    let n = (outer * inner) as usize;
    let out_shape = [outer, 1, inner];
    Ok(with_kernel(
        "burn_mlx_column_totals",
        &["part"],
        &["out"],
        || TOTALS.to_string(),
        "",
        |k| {
            k.apply(
                &[part],
                &[(&out_shape, Dtype::Float32)],
                &[],
                [(n.div_ceil(256) * 256) as i32, 1, 1],
                [256, 1, 1],
            )
        },
    )
    .map_err(launch_error)?
    .pop()
    .expect("one output"))
}

/// A rejected launch as MLX's error type, which the reductions return.
fn launch_error(e: crate::error::MlxError) -> Exception {
    Exception::custom(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::{column_sum, groups};
    use crate::device::MlxDevice;
    use mlx_rs::random;

    /// On MLX's CUDA device the kernels give MLX's own reduction (to f32 rounding) for bias-like
    /// sums, sums between leading and trailing axes, a ragged last group and a transposed
    /// (not row-contiguous) input. Without a GPU this checks nothing and says so.
    #[test]
    fn kernels_match_one_reduction_on_the_gpu() {
        if !MlxDevice::gpu_available() || !cfg!(target_os = "linux") {
            println!("no CUDA GPU here: the column-sum kernels are checked on a GPU machine");
            return;
        }
        MlxDevice::Gpu.scope(|| {
            assert!(crate::native::kernel::default_stream_on_cuda());
            for (shape, transpose) in [
                ([1, 8192, 512], false),
                ([1, 8192, 16], false),
                ([1, 4801, 33], false),
                ([3, 4800, 5], false),
                ([2, 4096, 12], false),
                ([1, 512, 8192], true),
            ] {
                let mut a = random::normal::<f32>(&shape, None, None, None).unwrap();
                if transpose {
                    a = a.transpose_axes(&[0, 2, 1]).unwrap();
                }
                let s = a.shape().iter().map(|&d| d as usize).collect::<Vec<_>>();
                let got = column_sum(&a, s[0], s[1], s[2]).unwrap();
                let want = a.sum_axis(1, true).unwrap();
                assert_eq!(got.shape(), want.shape(), "{shape:?}");
                let diff = got
                    .subtract(&want)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max(None)
                    .unwrap();
                let scale = want.abs().unwrap().max(None).unwrap();
                let (diff, scale) = (diff.item_cast::<f32>(), scale.item_cast::<f32>());
                assert!(diff <= 1e-5 * (1.0 + scale), "{shape:?}: {diff} of {scale}");
            }
        });
    }

    /// The first pass aims at about four blocks per multiprocessor, with at least 64 rows a group.
    #[test]
    fn row_groups_fill_the_gpu() {
        // A [8192, 512] bias gradient: 16 column tiles, 33 groups of 249 rows.
        assert_eq!(groups(1, 8192, 512), 33);
        // [8192, 2048]: 64 tiles, 9 groups.
        assert_eq!(groups(1, 8192, 2048), 9);
        // Few rows: groups of no fewer than 64 rows.
        assert_eq!(groups(1, 4096, 16), 64);
        assert_eq!(groups(1, 100, 16), 1);
    }
}
