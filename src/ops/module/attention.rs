//! Scaled dot-product attention on MLX's fused `fast::scaled_dot_product_attention`, with a
//! composed path (`softmax(QKᵀ·scale + mask)·V`) for soft-capping, which the kernel lacks.
//!
//! Burn's bool mask marks positions to drop (`true` = masked); it becomes an additive mask of
//! `-inf`. Rows whose every score is masked give zeros, as Burn's reference implementation
//! does (a plain softmax would give NaN).

use super::common::{float_const, run, Res};
use crate::tensor::MlxTensor;
use burn_backend::ops::AttentionModuleOptions;
use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask};
use mlx_rs::{ops, Array, Dtype};

/// The additive causal mask `[q_len, k_len]`: `-inf` where the key comes after the query
/// (aligned at the bottom-right corner, as Burn does for `k_len != q_len`).
fn causal_mask(q_len: i32, k_len: i32, dtype: Dtype) -> Res {
    let rows = ops::arange::<i32, i32>(None, q_len, None)?
        .reshape(&[q_len, 1])?
        .add(Array::from_int(k_len - q_len))?;
    let cols = ops::arange::<i32, i32>(None, k_len, None)?.reshape(&[1, k_len])?;
    let masked = cols.gt(&rows)?;
    Ok(ops::select(
        &masked,
        float_const(&[f64::NEG_INFINITY], &[], dtype)?,
        float_const(&[0.0], &[], dtype)?,
    )?)
}

/// Attention over `[batch, heads, seq, dim]` tensors.
/// Unmasked attention of a few (2 or 3) query positions per head, as one query position on each
/// of `heads · q_len` query heads that share their key/value head: MLX's grouped-query form.
///
/// The result is the same: with no mask, each query position attends to every key independently.
/// The point is the kernel. In MLX 0.32's CUDA source, half-precision attention with more than
/// one query position goes to cuDNN, which builds (and caches) a graph per key length, so a
/// decode loop whose cache grows by one position per step builds one per token; one query
/// position per head goes to MLX's own vector kernel instead. Models that fold the query heads of
/// a key/value group into the query axis for decoding (as the LLM example does) hit this case.
/// (Read from the source, and the likely cause of the slow bf16 decode in `benches/nvidia.md`;
/// not yet timed on a GPU.)
fn few_queries(q: &Array, k: &Array, v: &Array, scale: f32) -> Res {
    let shape = q.shape().to_vec();
    let (b, h, s, d) = (shape[0], shape[1], shape[2], shape[3]);
    let out = scaled_dot_product_attention(
        q.reshape(&[b, h * s, 1, d])?,
        k,
        v,
        scale,
        None::<ScaledDotProductAttentionMask>,
        None,
    )?;
    Ok(out.reshape(&[b, h, s, v.shape()[3]])?)
}

/// `kv` (`[b, h, t, d]`) with each head repeated to `heads` heads, in the grouped-query order
/// (query head `i` reads key/value head `i / (heads / h)`).
fn repeat_heads(kv: &Array, heads: i32) -> Res {
    let s = kv.shape().to_vec();
    if s[1] == heads {
        return Ok(kv.clone());
    }
    let groups = heads / s[1];
    Ok(ops::broadcast_to(
        kv.reshape(&[s[0], s[1], 1, s[2], s[3]])?,
        &[s[0], s[1], groups, s[2], s[3]],
    )?
    .reshape(&[s[0], heads, s[2], s[3]])?)
}

/// Burn's attention op on `Mlx`. Unlike Burn's reference, the key and value may have fewer
/// heads than the query, as long as they divide it (grouped-query attention, MLX's native form):
/// see [`crate::supports_grouped_kv_heads`].
pub(super) fn attention(
    query: MlxTensor,
    key: MlxTensor,
    value: MlxTensor,
    mask: Option<MlxTensor>,
    attn_bias: Option<MlxTensor>,
    options: AttentionModuleOptions,
) -> MlxTensor {
    if let Some(softcap) = options.softcap {
        assert!(
            softcap > 0.0,
            "attention: softcap must be positive, got {softcap}"
        );
    }
    let mut inputs = vec![&query, &key, &value];
    if let Some(m) = &mask {
        inputs.push(m);
    }
    if let Some(b) = &attn_bias {
        inputs.push(b);
    }
    run("attention", &inputs, || {
        let (q, k, v) = (&query.array, &key.array, &value.array);
        if q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4 {
            return Err("attention expects [batch, heads, seq, dim] tensors"
                .to_string()
                .into());
        }
        let (q_heads, kv_heads) = (q.shape()[1], k.shape()[1]);
        if v.shape()[1] != kv_heads || kv_heads == 0 || q_heads % kv_heads != 0 {
            return Err(format!(
                "attention: key and value need the same number of heads, dividing the query's \
                 (grouped-query attention), got query {:?}, key {:?}, value {:?}",
                q.shape(),
                k.shape(),
                v.shape()
            )
            .into());
        }
        let dtype = q.dtype();
        let head_dim = q.shape()[3];
        let (q_len, k_len) = (q.shape()[2], k.shape()[2]);
        let scale = options
            .scale
            .unwrap_or_else(|| 1.0 / (head_dim as f64).sqrt());

        // MLX's causal mode matches Burn's when no row is fully masked (k_len >= q_len) and
        // nothing else is added; otherwise the causal mask is built explicitly.
        let native_causal =
            options.is_causal && mask.is_none() && attn_bias.is_none() && k_len >= q_len;

        // Everything that is added to the scores, as one additive mask.
        let mut additive: Option<Array> = None;
        let mut push = |a: Array| -> Res<()> {
            additive = Some(match additive.take() {
                None => a,
                Some(prev) => prev.add(&a)?,
            });
            Ok(())
        };
        if let Some(m) = &mask {
            push(ops::select(
                &m.array.as_dtype(Dtype::Bool)?,
                float_const(&[f64::NEG_INFINITY], &[], dtype)?,
                float_const(&[0.0], &[], dtype)?,
            )?)?;
        }
        if let Some(b) = &attn_bias {
            push(b.array.as_dtype(dtype)?)?;
        }
        if options.is_causal && !native_causal {
            push(causal_mask(q_len, k_len, dtype)?)?;
        }

        let out = if let Some(softcap) = options.softcap {
            let (k, v) = (&repeat_heads(k, q_heads)?, &repeat_heads(v, q_heads)?);
            let scores =
                q.matmul(k.swap_axes(2, 3)?)?
                    .multiply(float_const(&[scale], &[], dtype)?)?;
            let cap = float_const(&[softcap], &[], dtype)?;
            let scores = ops::tanh(scores.divide(&cap)?)?.multiply(&cap)?;
            let scores = match &additive {
                Some(a) => scores.add(a)?,
                None => scores,
            };
            let scores = if native_causal {
                scores.add(causal_mask(q_len, k_len, dtype)?)?
            } else {
                scores
            };
            ops::softmax_axis(&scores, -1, true)?.matmul(v)?
        } else {
            let mask_arg = match (&additive, native_causal) {
                (Some(a), _) => Some(ScaledDotProductAttentionMask::Array(a)),
                (None, true) => Some(ScaledDotProductAttentionMask::Causal),
                (None, false) => None,
            };
            match mask_arg {
                None if (2..4).contains(&q_len) => few_queries(q, k, v, scale as f32)?,
                mask_arg => scaled_dot_product_attention(q, k, v, scale as f32, mask_arg, None)?,
            }
        };

        // Rows whose every position is masked give zeros (Burn's convention).
        match &additive {
            Some(a) => {
                let dead = a.is_neg_inf()?.all_axis(-1, true)?;
                Ok(ops::select(
                    &dead,
                    float_const(&[0.0], &[], out.dtype())?,
                    &out,
                )?)
            }
            None => Ok(out),
        }
    })
}
