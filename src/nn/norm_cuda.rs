//! Layer norm's backward pass on MLX's CUDA device as one custom kernel (see `native::kernel`)
//! plus the column totals of [`crate::ops::base::column_sum_cuda`].
//!
//! Composed from MLX's ops, the backward pass of `y = x̂ · gamma + beta` normalizes `x` again,
//! multiplies `g · gamma`, runs MLX's normalization VJP, multiplies `g · x̂` and sums two
//! columns: on an H200 (decoder LM, `[8192, 512]`) about 120 us a layer norm in eight kernels.
//! This kernel reads `x` and `g` once: each warp takes a row, computes its mean and reciprocal
//! standard deviation, writes `dx = rstd · (ĝ - mean(ĝ) - x̂ · mean(ĝ · x̂))` with `ĝ = g · gamma`,
//! and keeps the row's `g · x̂` and `g` in per-column sums; each block writes its sums as one
//! group of partial sums, and the totals kernel adds the groups in a fixed order.

use crate::native::kernel::{with_kernel, TemplateArg};
use crate::ops::base::column_sum_cuda::column_totals;
use mlx_rs::error::Exception;
use mlx_rs::ops::indexing::IndexOp;
use mlx_rs::{Array, Dtype};

/// Whether layer norm's backward takes this kernel on MLX's CUDA device: on by default, off with
/// `BURN_MLX_NORM_KERNEL=0` (read once) for A/B measurements against the composed backward.
pub(super) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("BURN_MLX_NORM_KERNEL").map_or(true, |v| v != "0"))
}

/// The widest rows the kernel takes: each lane holds five values per 32 columns in registers.
pub(super) const MAX_D: i32 = 512;

/// Thread blocks of the kernel (eight warps each): two per multiprocessor of an H100/H200.
const BLOCKS: i32 = 264;

/// Inputs `x`, `g` (`[rows, D]` f32), `gamma` (`[D]` f32), `eps` (`[1]` f32); outputs `dx`
/// (`[rows, D]`) and `part` (`[2, gridDim.x, D]`: the groups' sums of `g · x̂`, then of `g`).
const BACKWARD: &str = r#"
  constexpr int J = (D + 31) / 32;
  const int rows = x_shape[0];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int groups = gridDim.x;
  const float e = eps[0];
  float gam[J], dgam[J], dbet[J];
  #pragma unroll
  for (int j = 0; j < J; ++j) {
    const int c = lane + 32 * j;
    gam[j] = c < D ? gamma[c] : 0.f;
    dgam[j] = 0.f;
    dbet[j] = 0.f;
  }
  for (int r = blockIdx.x * 8 + warp; r < rows; r += groups * 8) {
    const float* xr = x + (size_t)r * D;
    const float* gr = g + (size_t)r * D;
    float xv[J], gv[J];
    float sum = 0.f;
    #pragma unroll
    for (int j = 0; j < J; ++j) {
      const int c = lane + 32 * j;
      xv[j] = c < D ? xr[c] : 0.f;
      gv[j] = c < D ? gr[c] : 0.f;
      sum += xv[j];
    }
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffff, sum, o);
    const float mean = sum / D;
    float var = 0.f;
    #pragma unroll
    for (int j = 0; j < J; ++j) {
      const int c = lane + 32 * j;
      const float t = c < D ? xv[j] - mean : 0.f;
      var += t * t;
    }
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) var += __shfl_xor_sync(0xffffffff, var, o);
    const float rstd = rsqrtf(var / D + e);
    float dot = 0.f, total = 0.f;
    #pragma unroll
    for (int j = 0; j < J; ++j) {
      const int c = lane + 32 * j;
      if (c < D) {
        const float xh = (xv[j] - mean) * rstd;
        xv[j] = xh;
        const float gg = gv[j] * gam[j];
        dot += gg * xh;
        total += gg;
        dgam[j] += gv[j] * xh;
        dbet[j] += gv[j];
      }
    }
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      dot += __shfl_xor_sync(0xffffffff, dot, o);
      total += __shfl_xor_sync(0xffffffff, total, o);
    }
    dot /= D;
    total /= D;
    float* dr = dx + (size_t)r * D;
    #pragma unroll
    for (int j = 0; j < J; ++j) {
      const int c = lane + 32 * j;
      if (c < D) dr[c] = rstd * (gv[j] * gam[j] - total - xv[j] * dot);
    }
  }
  __shared__ float sums[8][32];
  #pragma unroll
  for (int j = 0; j < J; ++j) {
    const int c = lane + 32 * j;
    #pragma unroll
    for (int which = 0; which < 2; ++which) {
      sums[warp][lane] = which == 0 ? dgam[j] : dbet[j];
      __syncthreads();
      if (warp == 0 && c < D) {
        float s = 0.f;
        for (int w = 0; w < 8; ++w) s += sums[w][lane];
        part[((size_t)which * groups + blockIdx.x) * D + c] = s;
      }
      __syncthreads();
    }
  }
"#;

/// The gradients of layer norm (biased variance, `eps`) at `x` (`[…, d]` f32) for `g`, with the
/// weight `gamma` (`[d]` f32): `[dx, dgamma, dbeta]`, on the thread's default stream (which must
/// be MLX's CUDA device). `d` is at most [`MAX_D`].
pub(super) fn layer_norm_backward(
    x: &Array,
    g: &Array,
    gamma: &Array,
    eps: f32,
) -> Result<[Array; 3], Exception> {
    let shape = x.shape().to_vec();
    let d = *shape.last().expect("layer norm of at least one axis");
    let rows: i32 = shape[..shape.len() - 1].iter().product();
    let x2 = x.reshape(&[rows, d])?;
    let g2 = g.reshape(&[rows, d])?;
    let eps = Array::from_slice(&[eps], &[1]);
    let blocks = BLOCKS.min((rows + 7) / 8).max(1);
    let part_shape = [2, blocks, d];
    let mut outs = with_kernel(
        "burn_mlx_layer_norm_backward",
        &["x", "g", "gamma", "eps"],
        &["dx", "part"],
        || BACKWARD.to_string(),
        "",
        |k| {
            k.apply(
                &[&x2, &g2, gamma, &eps],
                &[(&[rows, d], Dtype::Float32), (&part_shape, Dtype::Float32)],
                &[TemplateArg::Int("D", d)],
                [blocks * 256, 1, 1],
                [256, 1, 1],
            )
        },
    )
    .map_err(|e| Exception::custom(e.to_string()))?;
    let part = outs.pop().expect("two outputs");
    let dx = outs.pop().expect("two outputs").reshape(&shape)?;
    let totals = column_totals(&part)?;
    let dgamma = totals.index(0).reshape(&[d])?;
    let dbeta = totals.index(1).reshape(&[d])?;
    Ok([dx, dgamma, dbeta])
}

#[cfg(test)]
mod tests {
    use super::layer_norm_backward;
    use crate::device::MlxDevice;
    use mlx_rs::{fast, random, Array};

    /// On MLX's CUDA device the kernel gives MLX's own gradients of `layer_norm(x, gamma, beta)`
    /// (to f32 rounding): rows of 64, 48 (not a multiple of 32), 256 and 512 values, a few rows
    /// and 8,192, a transposed (not row-contiguous) input. Without a GPU this checks nothing and
    /// says so.
    #[test]
    fn kernel_matches_mlx_gradients_on_the_gpu() {
        if !MlxDevice::gpu_available() || !cfg!(target_os = "linux") {
            println!(
                "no CUDA GPU here: the layer-norm backward kernel is checked on a GPU machine"
            );
            return;
        }
        MlxDevice::Gpu.scope(|| {
            for (shape, transpose) in [
                (vec![3, 5, 64], false),
                (vec![2, 7, 48], false),
                (vec![4, 33, 256], false),
                (vec![8192, 512], false),
                (vec![512, 300], true),
            ] {
                let mut x = random::normal::<f32>(&shape, None, None, None).unwrap();
                if transpose {
                    x = x.t();
                }
                let d = *x.shape().last().unwrap();
                let g = random::normal::<f32>(x.shape(), None, None, None).unwrap();
                let gamma = random::normal::<f32>(&[d], None, None, None).unwrap();
                let beta = random::normal::<f32>(&[d], None, None, None).unwrap();
                let got = layer_norm_backward(&x, &g, &gamma, 1e-5).unwrap();
                let want = crate::nn::custom::mlx_vjp(
                    |v: &[Array]| fast::layer_norm(&v[0], Some(&v[1]), Some(&v[2]), 1e-5),
                    &[x.clone(), gamma.clone(), beta.clone()],
                    &g,
                )
                .unwrap();
                for (name, a, b) in [
                    ("dx", &got[0], &want[0]),
                    ("dgamma", &got[1], &want[1]),
                    ("dbeta", &got[2], &want[2]),
                ] {
                    assert_eq!(a.shape(), b.shape(), "{name} {shape:?}");
                    let diff = a.subtract(b).unwrap().abs().unwrap().max(None).unwrap();
                    let scale = b.abs().unwrap().max(None).unwrap();
                    let (diff, scale) = (diff.item_cast::<f32>(), scale.item_cast::<f32>());
                    assert!(
                        diff <= 2e-5 * (1.0 + scale),
                        "{name} {shape:?} transposed {transpose}: {diff} of {scale}"
                    );
                }
            }
        });
    }
}
