//! The optimizers' update of a bucket of parameters as one custom CUDA kernel (MLX's custom
//! kernels, see `native::kernel`), on MLX's CUDA device.
//!
//! MLX compiles the update function of [`super`] into four kernels per parameter on CUDA (it
//! splits the fusion at the two moments, which are outputs and inputs of later ops), so a
//! 29.5M-parameter decoder LM's Adam step launched 408 kernels; one kernel per parameter still
//! launched 102, most of them over a few hundred values (biases, norm weights). This kernel
//! updates a bucket of parameters of one dtype (up to [`bucket_max`]): each thread finds its parameter among
//! the bucket's running offsets, reads the parameter, its gradient and both moments once and
//! writes the three results. It computes in f32 and rounds the results to the parameter's
//! dtype; the step's scalars are one small f32 array shared by every bucket of the step.

use super::Rule;
use crate::error::MlxError;
use crate::native::kernel::{with_kernel, TemplateArg};
use mlx_rs::Array;
use std::cell::RefCell;
use std::fmt::Write;

/// The most parameters one kernel launch can update: 7 pointers each in the kernel's arguments.
pub(super) const BUCKET_MAX: usize = 32;

/// The parameters a bucket holds by default. Measured on an H200 (2026-11-28, `train_bench`,
/// four alternating rounds of buckets of 1, 32 and 8): buckets of 8 ran the fused encoder at
/// batch 128 at 1.06-1.17x the per-parameter update and 1.02-1.10x buckets of 32, and the decoder
/// LM at batch 32 at 1.02-1.08x the per-parameter update, as fast as buckets of 32. A bucket is
/// one MLX primitive with three outputs per parameter, each listing the others as siblings, so
/// larger buckets cost the host more.
const BUCKET_DEFAULT: usize = 8;

/// The most parameters a bucket holds: [`BUCKET_DEFAULT`], or `BURN_MLX_ADAM_BUCKET` (1 to
/// [`BUCKET_MAX`], read once; 1 updates each parameter alone, for A/B measurements).
pub(super) fn bucket_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("BURN_MLX_ADAM_BUCKET")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(BUCKET_DEFAULT, |n| n.clamp(1, BUCKET_MAX))
    })
}

/// The most values one bucket holds: its offsets and thread indices are `uint32`.
pub(super) const BUCKET_VALUES_MAX: usize = 1 << 30;

/// The update of one value, `j`, of the parameter at `P, G, M, V` into `PO, MO, VO`: Adam
/// (`RULE` 0; scalars `b1, 1 - b1, b2, 1 - b2, penalty, factor, eps, lr`, in the order of
/// operations of [`super::update`]) and AdamW (`RULE` 1; scalars `b1, 1 - b1, b2, 1 - b2,
/// 1 - b1^t, 1 - b2^t, eps, 1 - lr · decay, lr`, as [`super::update_w`]).
const UPDATE: &str = r#"
  const float pi = static_cast<float>(P[j]);
  float gi = static_cast<float>(G[j]);
  if (RULE == 0) gi = pi * s[4] + gi;
  const float mi = static_cast<float>(M[j]) * s[0] + gi * s[1];
  const float vi = static_cast<float>(V[j]) * s[2] + gi * gi * s[3];
  float po;
  if (RULE == 0) {
    po = pi - mi * s[5] / (sqrtf(vi) + s[6]) * s[7];
  } else {
    po = pi * s[7] - (mi / s[4]) / (sqrtf(vi / s[5]) + s[6]) * s[8];
  }
  PO[j] = static_cast<T>(po);
  MO[j] = static_cast<T>(mi);
  VO[j] = static_cast<T>(vi);
"#;

/// The kernel's argument names for a bucket of `n`: `p0.. g0.. m0.. v0..`, the scalars `s` and
/// the running offsets `off` (`n + 1` values); outputs `po0.. mo0.. vo0..`. Made once per size.
fn names(n: usize) -> (&'static [&'static str], &'static [&'static str]) {
    type Names = (Vec<&'static str>, Vec<&'static str>);
    static NAMES: std::sync::OnceLock<Vec<Names>> = std::sync::OnceLock::new();
    let all = NAMES.get_or_init(|| {
        (1..=BUCKET_MAX)
            .map(|n| {
                // Leaked once per bucket size: the kernels live as long as the process.
                let list = |prefixes: &[&str]| -> Vec<&'static str> {
                    prefixes
                        .iter()
                        .flat_map(|p| (0..n).map(move |i| format!("{p}{i}")))
                        .map(|s| &*Box::leak(s.into_boxed_str()))
                        .collect()
                };
                let mut inputs = list(&["p", "g", "m", "v"]);
                inputs.extend(["s", "off"]);
                (inputs, list(&["po", "mo", "vo"]))
            })
            .collect()
    });
    let (ins, outs) = &all[n - 1];
    (ins, outs)
}

/// The body for a bucket of `n` parameters, one thread per value of the bucket.
fn source(n: usize) -> String {
    let mut src = String::from("  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;\n");
    let _ = writeln!(src, "  if (i >= off[{n}]) return;");
    // The parameter `t` with off[t] <= i < off[t + 1], by binary search.
    let _ = writeln!(src, "  int t = 0, hi = {n};");
    src.push_str("  while (hi - t > 1) {\n    const int mid = (t + hi) / 2;\n");
    src.push_str("    if (i >= off[mid]) t = mid; else hi = mid;\n  }\n");
    src.push_str("  const uint32_t j = i - off[t];\n");
    src.push_str("  const T *P, *G, *M, *V; T *PO, *MO, *VO;\n  switch (t) {\n");
    for i in 0..n {
        let _ = writeln!(
            src,
            "    case {i}: P = p{i}; G = g{i}; M = m{i}; V = v{i}; PO = po{i}; MO = mo{i}; \
             VO = vo{i}; break;"
        );
    }
    src.push_str("    default: return;\n  }\n");
    src.push_str(UPDATE);
    src
}

thread_local! {
    /// The scalars of the last step (their bits, and the array): every bucket of a step shares
    /// one array.
    static SCALARS: RefCell<Option<(Vec<u32>, Array)>> = const { RefCell::new(None) };
    /// The running offsets of the buckets seen so far, by their sizes: a training loop updates
    /// the same buckets every step.
    static OFFSETS: RefCell<std::collections::HashMap<Vec<u32>, Array>> =
        RefCell::new(std::collections::HashMap::new());
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

/// The running offsets `[0, n0, n0 + n1, …]` of parameters of `sizes` values, as a `uint32`
/// array, made once per distinct bucket.
fn offsets(sizes: &[u32]) -> Array {
    OFFSETS.with(|cell| {
        cell.borrow_mut()
            .entry(sizes.to_vec())
            .or_insert_with(|| {
                let mut off = Vec::with_capacity(sizes.len() + 1);
                let mut total = 0u32;
                off.push(0);
                for &n in sizes {
                    total += n;
                    off.push(total);
                }
                Array::from_slice(&off, &[off.len() as i32])
            })
            .clone()
    })
}

/// The new parameters and moments of a bucket of `[p, g, m, v]` (one dtype; each its own
/// shape, at most [`BUCKET_MAX`] of them and [`BUCKET_VALUES_MAX`] values in all) under `rule`
/// with `scalars`, on the thread's default stream (the GPU's): one kernel launch.
pub(super) fn update_bucket(
    rule: Rule,
    bucket: &[[&Array; 4]],
    scalars: &[f32],
) -> Result<Vec<[Array; 3]>, MlxError> {
    let n = bucket.len();
    debug_assert!((1..=BUCKET_MAX).contains(&n));
    let s = scalar_array(scalars);
    let dtype = bucket[0][0].dtype();
    let sizes: Vec<u32> = bucket.iter().map(|e| e[0].size() as u32).collect();
    let total: usize = sizes.iter().map(|&n| n as usize).sum();
    let off = offsets(&sizes);
    let mut inputs: Vec<&Array> = (0..4)
        .flat_map(|k| bucket.iter().map(move |e| e[k]))
        .collect();
    inputs.push(&s);
    inputs.push(&off);
    let shapes: Vec<&[i32]> = bucket.iter().map(|e| e[0].shape()).collect();
    let outputs: Vec<(&[i32], mlx_rs::Dtype)> = (0..3)
        .flat_map(|_| shapes.iter().map(|&shape| (shape, dtype)))
        .collect();
    let name = kernel_name(n);
    let (ins, outs) = names(n);
    let out = with_kernel(
        name,
        ins,
        outs,
        || source(n),
        "",
        |k| {
            k.apply(
                &inputs,
                &outputs,
                &[
                    TemplateArg::Dtype("T", dtype),
                    TemplateArg::Int("RULE", rule as i32),
                ],
                [(total.div_ceil(256) * 256) as i32, 1, 1],
                [256, 1, 1],
            )
        },
    )?;
    let mut it = out.into_iter();
    let mut take = |count: usize| -> Vec<Array> { it.by_ref().take(count).collect() };
    let (ps, ms, vs) = (take(n), take(n), take(n));
    Ok(ps
        .into_iter()
        .zip(ms)
        .zip(vs)
        .map(|((p, m), v)| [p, m, v])
        .collect())
}

/// The kernel's name for a bucket of `n` (MLX caches a kernel by its name and source; the
/// source differs by bucket size).
fn kernel_name(n: usize) -> &'static str {
    static NAMES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| {
        (1..=BUCKET_MAX)
            .map(|n| format!("burn_mlx_adam_bucket_{n}"))
            .collect()
    })[n - 1]
        .as_str()
}
