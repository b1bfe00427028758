//! Self-attention's three input projections and the attention itself as one fused op, for
//! training in f32 where attention keeps its probabilities (see
//! [`keeps_probabilities_of`](super::functional::keeps_probabilities_of)).
//!
//! burn-nn's layer projects the query, key and value with three `Linear`s. Each is a GEMM
//! forward and two backward, its bias a column sum, and the input's gradient is the sum of three
//! products. Here the three weights are concatenated into one `[d_model, 3·d_model]` matrix for
//! the step: the projection is one GEMM with the bias in its epilogue, the heads come out of it
//! with one copy, and the backward pass is one GEMM for the input's gradient, one for the
//! weights', one column sum for the biases, and one copy that lays the three head gradients
//! back out as rows. The parameters stay burn-nn's three `Linear`s (same record); their
//! gradients are slices of the joint ones.

use super::custom::{self, FusedOp};
use super::functional::{
    additive_mask_of, attention_grads, column_sum, keeps_probabilities_of, prim, probabilities,
    wrap,
};
use crate::tensor::MlxTensor;
use burn_nn::Linear;
use burn_tensor::backend::Backend;
use burn_tensor::{Bool, DType, Tensor};
use mlx_rs::error::Exception;
use mlx_rs::{ops, Array};
use std::sync::{Arc, Mutex};

/// Self-attention of `x` `[batch, seq, d_model]` over itself with `n_heads` heads: the context
/// `[batch, seq, d_model]` (before the output projection) of `softmax(q·kᵀ·scale + mask)·v`,
/// `q`, `k` and `v` being `x` projected by `query`, `key` and `value`; `mask`
/// `[batch, 1, seq, seq]` (true = hidden) scores `min_float`.
///
/// As one fused op where it pays (see the [module docs](self)): a backend built on MLX that
/// records gradients, on a device where fused ops run, in f32, with biases on all three
/// projections, and for attention that keeps its probabilities. `None` elsewhere: the caller
/// composes the layer.
#[allow(clippy::too_many_arguments)]
pub(super) fn self_attention<B: Backend>(
    x: &Tensor<B, 3>,
    query: &Linear<B>,
    key: &Linear<B>,
    value: &Linear<B>,
    n_heads: usize,
    mask: Option<Tensor<B, 4, Bool>>,
    scale: f64,
    min_float: f64,
) -> Option<Tensor<B, 3>> {
    let device = x.device();
    let [batch, seq, d_model] = x.dims();
    let biases = [&query.bias, &key.bias, &value.bias];
    if !custom::fuses::<B>(&device)
        || x.dtype() != DType::F32
        || n_heads == 0
        || d_model % n_heads != 0
        || biases.iter().any(|b| b.is_none())
        || !keeps_probabilities_of::<B>(&device, x.dtype(), batch * n_heads * seq * seq)
    {
        return None;
    }
    let additive = mask.map(|m| {
        additive_mask_of(
            m,
            min_float,
            mlx_rs::Dtype::Float32,
            "self_attention (mask)",
        )
    });
    let op = SelfAttentionOp {
        heads: n_heads as i32,
        scale: scale as f32,
        mask: additive,
        kept: Mutex::new(None),
    };
    let mut inputs = vec![prim(x.clone())];
    for linear in [query, key, value] {
        inputs.push(prim(linear.weight.val()));
        inputs.push(prim(linear.bias.as_ref().expect("checked above").val()));
    }
    custom::apply::<B>(Arc::new(op), inputs).ok().map(wrap)
}

#[derive(Debug)]
struct SelfAttentionOp {
    heads: i32,
    scale: f32,
    /// The additive mask `[batch, 1, seq, seq]` (0 or `min_float`), in f32.
    mask: Option<MlxTensor>,
    /// What the forward pass keeps for the backward pass: the joint weight, the heads `q`, `k`,
    /// `v`, the probabilities and the attention's output (see [`Kept`]).
    kept: Mutex<Option<Vec<Array>>>,
}

// SAFETY: MLX arrays are reference-counted handles to immutable data; the kept arrays are only
// read and replaced under their mutex.
unsafe impl Send for SelfAttentionOp {}
unsafe impl Sync for SelfAttentionOp {}

/// The arrays of one forward pass that its backward pass reads.
struct Kept {
    /// The joint weight `[d_model, 3·d_model]`.
    w: Array,
    /// The heads `[batch, heads, seq, head_dim]`.
    q: Array,
    k: Array,
    v: Array,
    /// The probabilities `[batch, heads, seq, seq]`.
    p: Array,
    /// The attention's output `[batch, heads, seq, head_dim]`.
    o: Array,
}

impl Kept {
    fn into_vec(self) -> Vec<Array> {
        vec![self.w, self.q, self.k, self.v, self.p, self.o]
    }

    fn from_slice(a: &[Array]) -> Option<Self> {
        match a {
            [w, q, k, v, p, o] => Some(Self {
                w: w.clone(),
                q: q.clone(),
                k: k.clone(),
                v: v.clone(),
                p: p.clone(),
                o: o.clone(),
            }),
            _ => None,
        }
    }
}

impl SelfAttentionOp {
    /// The forward pass on `xs` (`[x, wq, bq, wk, bk, wv, bv]`) with the additive `mask`: the
    /// context `[batch, seq, d_model]` and what the backward pass reads.
    fn run(&self, xs: &[Array], mask: Option<&Array>) -> Result<(Array, Kept), Exception> {
        let [x, wq, bq, wk, bk, wv, bv] = xs else {
            return Err(Exception::custom("self_attention: 7 inputs expected"));
        };
        let &[b, s, d] = x.shape() else {
            return Err(Exception::custom(format!(
                "self_attention: x {:?} is not [batch, seq, d_model]",
                x.shape()
            )));
        };
        let h = self.heads;
        let w = ops::concatenate(&[wq, wk, wv], 1)?;
        let bias = ops::concatenate(&[bq, bk, bv], 0)?;
        let y = ops::addmm(&bias, x.reshape(&[b * s, d])?, &w, None, None)?;
        // [b·s, 3·d] as [3, b, h, s, head_dim], made contiguous by one copy (the flatten), so
        // that each of q, k, v is a contiguous slice for the GEMMs.
        let heads = y
            .reshape(&[b, s, 3, h, d / h])?
            .transpose_axes(&[2, 0, 3, 1, 4])?
            .flatten(None, None)?
            .reshape(&[3, b, h, s, d / h])?;
        let mut qkv = heads
            .split_equal(3, 0)?
            .into_iter()
            .map(|a| a.reshape(&[b, h, s, d / h]));
        let mut next = || qkv.next().expect("three parts");
        let (q, k, v) = (next()?, next()?, next()?);
        let (p, _) = probabilities(&q, &k, mask, false, self.scale)?;
        let o = p.matmul(&v)?;
        let context = o.swap_axes(1, 2)?.reshape(&[b, s, d])?;
        Ok((context, Kept { w, q, k, v, p, o }))
    }
}

impl FusedOp for SelfAttentionOp {
    fn name(&self) -> &'static str {
        "self_attention"
    }

    fn key(&self) -> String {
        format!(
            "self_attention heads={} scale={} mask={}",
            self.heads,
            self.scale,
            self.mask.is_some()
        )
    }

    fn side_inputs(&self) -> Vec<Array> {
        self.mask.iter().map(|m| m.array().clone()).collect()
    }

    fn forward(&self, xs: &[Array], side: &[Array]) -> Result<Array, Exception> {
        let (context, kept) = self.run(xs, side.first())?;
        if let Ok(mut slot) = self.kept.lock() {
            *slot = Some(kept.into_vec());
        }
        Ok(context)
    }

    fn saved(&self) -> Vec<Array> {
        self.kept
            .lock()
            .ok()
            .and_then(|k| k.clone())
            .unwrap_or_default()
    }

    /// The attention's gradients ([`attention_grads`]) laid out as rows `[b·s, 3·d]` (one copy),
    /// then `dx = dy·wᵀ`, `dw = xᵀ·dy` and `db` = the column sums of `dy`, split per projection.
    fn vjp(&self, xs: &[Array], side: &[Array], g: &Array) -> Result<Vec<Array>, Exception> {
        let masks = self.mask.is_some() as usize;
        let kept = match Kept::from_slice(&side[masks..]) {
            Some(kept) => kept,
            None => self.run(xs, side[..masks].first())?.1,
        };
        let x = &xs[0];
        let &[b, s, d] = x.shape() else {
            unreachable!("the forward pass checked x's rank")
        };
        let h = self.heads;
        // The context's cotangent as heads, made contiguous once for the GEMMs that read it.
        let g = g
            .reshape(&[b, s, h, d / h])?
            .swap_axes(1, 2)?
            .flatten(None, None)?
            .reshape(&[b, h, s, d / h])?;
        let scale = crate::tensor::constant_scalar_array(
            burn_backend::Scalar::Float(self.scale as f64),
            kept.q.dtype(),
        );
        let grads = attention_grads(&kept.p, &kept.o, &kept.q, &kept.k, &kept.v, &g, &scale)?;
        let rows = grads
            .iter()
            .map(|a| a.swap_axes(1, 2))
            .collect::<Result<Vec<_>, _>>()?;
        let dy = ops::stack(&rows, 2)?.reshape(&[b * s, 3 * d])?;
        let dx = dy.matmul(kept.w.t())?.reshape(&[b, s, d])?;
        let dw = x.reshape(&[b * s, d])?.t().matmul(&dy)?;
        let db = column_sum(&dy, dy.dtype())?;
        let dws = dw.split_equal(3, 1)?;
        let dbs = db.split_equal(3, 0)?;
        let mut out = vec![dx];
        for (dw, db) in dws.into_iter().zip(dbs) {
            out.push(dw);
            out.push(db);
        }
        Ok(out)
    }
}
