//! The optimizers' update as one custom CUDA kernel per parameter (MLX's custom kernels, see
//! `native::kernel`), on MLX's CUDA device.
//!
//! MLX compiles the update function of [`super`] into four kernels per parameter on CUDA (it
//! splits the fusion at the two moments, which are outputs and inputs of later ops), so a
//! 29.5M-parameter decoder LM's Adam step launched 408 kernels. This kernel reads the parameter,
//! its gradient and both moments once and writes the three results: one launch per parameter.
//! It computes in f32 and rounds the results to the parameter's dtype; the step's scalars are
//! one small f32 array shared by every parameter of the step.

use super::Rule;
use crate::error::MlxError;
use crate::native::kernel::{with_kernel, TemplateArg};
use mlx_rs::Array;
use std::cell::RefCell;

/// Adam (`RULE` 0; scalars `b1, 1 - b1, b2, 1 - b2, penalty, factor, eps, lr`, in the order of
/// operations of [`super::update`]) and AdamW (`RULE` 1; scalars `b1, 1 - b1, b2, 1 - b2,
/// 1 - b1^t, 1 - b2^t, eps, 1 - lr · decay, lr`, as [`super::update_w`]), one thread per value.
const UPDATE: &str = r#"
  size_t n = 1;
  for (int d = 0; d < p_ndim; ++d) n *= p_shape[d];
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float pi = static_cast<float>(p[i]);
  float gi = static_cast<float>(g[i]);
  if (RULE == 0) gi = pi * s[4] + gi;
  const float mi = static_cast<float>(m[i]) * s[0] + gi * s[1];
  const float vi = static_cast<float>(v[i]) * s[2] + gi * gi * s[3];
  float po;
  if (RULE == 0) {
    po = pi - mi * s[5] / (sqrtf(vi) + s[6]) * s[7];
  } else {
    po = pi * s[7] - (mi / s[4]) / (sqrtf(vi / s[5]) + s[6]) * s[8];
  }
  p_out[i] = static_cast<T>(po);
  m_out[i] = static_cast<T>(mi);
  v_out[i] = static_cast<T>(vi);
"#;

thread_local! {
    /// The scalars of the last step (their bits, and the array): every parameter of a step
    /// shares one array.
    static SCALARS: RefCell<Option<(Vec<u32>, Array)>> = const { RefCell::new(None) };
}

/// The scalars as an f32 array, made once per distinct set.
fn scalar_array(scalars: &[f32]) -> Array {
    let bits: Vec<u32> = scalars.iter().map(|s| s.to_bits()).collect();
    SCALARS.with(|cell| {
        let mut last = cell.borrow_mut();
        match last.as_ref() {
            Some((b, a)) if *b == bits => a.clone(),
            _ => {
                let a = Array::from_slice(scalars, &[scalars.len() as i32]);
                *last = Some((bits, a.clone()));
                a
            }
        }
    })
}

/// The new parameter and moments of `[p, g, m, v]` (one dtype, one shape) under `rule` with
/// `scalars`, on the thread's default stream (the GPU's).
pub(super) fn update(
    rule: Rule,
    arrays: [&Array; 4],
    scalars: &[f32],
) -> Result<Vec<Array>, MlxError> {
    let [p, g, m, v] = arrays;
    let s = scalar_array(scalars);
    let dtype = p.dtype();
    let shape = p.shape().to_vec();
    let n: usize = shape.iter().map(|&d| d as usize).product();
    with_kernel(
        "burn_mlx_adam_update",
        &["p", "g", "m", "v", "s"],
        &["p_out", "m_out", "v_out"],
        || UPDATE.to_string(),
        "",
        |k| {
            k.apply(
                &[p, g, m, v, &s],
                &[(&shape, dtype), (&shape, dtype), (&shape, dtype)],
                &[
                    TemplateArg::Dtype("T", dtype),
                    TemplateArg::Int("RULE", rule as i32),
                ],
                [(n.div_ceil(256) * 256) as i32, 1, 1],
                [256, 1, 1],
            )
        },
    )
}
