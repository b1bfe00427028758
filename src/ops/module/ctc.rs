//! Connectionist Temporal Classification (CTC): the loss and its gradient with respect to the
//! log-probabilities, with Burn's semantics (`ModuleOps::ctc_loss`, `ctc_loss_backward`).
//!
//! Both recursions run in log space on the extended label sequence `l'` (the targets with a
//! blank before, between and after them: `2S + 1` positions), one MLX step per time step,
//! each step vectorised over the batch and the label positions; `logaddexp` keeps sums of
//! `-inf` at `-inf`. They run in f32 whatever the input's float type (f64 stays f64): in f16 or
//! bf16 every step of the recursion would be rounded to the half type, and the error compounds
//! over the time steps. The results are cast back to the input's dtype.
//!
//! Two choices keep f32 accurate on long inputs, where the log-probabilities of whole alignments
//! reach -1000 and f32 keeps only 4 or 5 digits after the point: each step's α and β rows are
//! rescaled by their maximum (the scales of α are summed for the loss), and the gradient's
//! alignment posteriors are normalised per time step (they sum to 1 at every step) instead of
//! being formed as `α + β - log p(t, l'[s]) + nll`, which cancels terms of that size. On a
//! `[300, 4, 30]` case (CPU) the f32 gradient is then within 3e-6 of an f64 run, measured as
//! `max |Δ| / (1 + |ref|)` (Burn's composed CTC differentiated by `Autodiff` in f32: 1.4e-4).
//!
//! Semantics, as Burn's composed default (`ctc_loss_default`):
//! - `log_probs` `[T, N, C]`, `targets` `[N, S]`, `input_lengths` and `target_lengths` `[N]`;
//!   the loss is the per-sample `-log p(target | input)`, `[N]`, with no reduction (Burn's
//!   `CTCLoss` module reduces and applies `zero_infinity` on top of this op).
//! - A sample whose target cannot be aligned in its input length has an infinite loss; its
//!   gradient is zero.
//! - The gradient is PyTorch's: `exp(log_probs) · g - Σ_s g · posterior(t, s)` at class `l'[s]`,
//!   zero at time steps `t >= input_length`.
//! - Input lengths are clamped into `[0, T]` and target lengths into `[0, S]`; target labels
//!   outside `[0, C)` are clamped into it (MLX gathers do not check bounds). An input length of
//!   0 reads the loss off the first time step, as Burn's default does.

use super::common::{accumulation_dtype, run, Failure, Res};
use crate::native;
use crate::ops::base::cast_array;
use crate::tensor::MlxTensor;
use mlx_rs::{ops, Array, Dtype};

/// Casts `a` to `dtype` (no copy when it already has it).
fn to_dtype(a: &Array, dtype: Dtype) -> Res {
    Ok(cast_array(a.clone(), dtype)?)
}

/// `log_probs` in the dtype the recursions run in (f32 for f16/bf16) and their lattice, or
/// `None` for an empty batch; shared by the loss and its gradient.
fn setup(
    log_probs: &MlxTensor,
    targets: &MlxTensor,
    input_lengths: &MlxTensor,
    target_lengths: &MlxTensor,
    blank: usize,
) -> Res<Option<(Array, Lattice)>> {
    let lp = to_dtype(
        &log_probs.array,
        accumulation_dtype(log_probs.array.dtype()),
    )?;
    if lp.shape().len() == 3 && lp.shape()[1] == 0 {
        return Ok(None);
    }
    let lat = lattice(
        &lp,
        &targets.array,
        &input_lengths.array,
        &target_lengths.array,
        blank,
    )?;
    Ok(Some((lp, lat)))
}

/// The inputs of both recursions, in the compute dtype.
struct Lattice {
    /// Time steps `T`, batch `N`, extended label positions `L = 2S + 1`.
    t: i32,
    n: i32,
    l: i32,
    /// `l'`, the targets with blanks inserted: `[N, L]`, int32.
    ext: Array,
    /// `log_probs[t, n, l'[n, s]]`, one `[N, L]` row per time step.
    rows: Vec<Array>,
    /// Where the transition `s - 2 -> s` is allowed (`l'[s]` is a label that differs from
    /// `l'[s - 2]`): `[N, L]`, bool.
    skip: Array,
    /// Positions inside each sample's extended target (`s < 2·target_length + 1`): `[N, L]`.
    valid: Array,
    /// The two positions an alignment may end on (`2·target_length` and
    /// `2·target_length - 1`): `[N, L]`, bool.
    end: Array,
    /// Input lengths clamped into `[0, T]`: `[N, 1]`, int32.
    input_len: Array,
    /// `-inf` in the compute dtype (0-d).
    neg_inf: Array,
}

/// Checks the shapes and builds the [`Lattice`] from `log_probs` in the compute dtype.
fn lattice(
    log_probs: &Array,
    targets: &Array,
    input_lengths: &Array,
    target_lengths: &Array,
    blank: usize,
) -> Res<Lattice> {
    let lp_shape = log_probs.shape();
    let tg_shape = targets.shape();
    if lp_shape.len() != 3 || tg_shape.len() != 2 {
        return Err(Failure::from(format!(
            "log_probs must be [T, N, C] and targets [N, S]; got {lp_shape:?} and {tg_shape:?}"
        )));
    }
    let (t, n, c) = (lp_shape[0], lp_shape[1], lp_shape[2]);
    let s_max = tg_shape[1];
    if tg_shape[0] != n || input_lengths.shape() != [n] || target_lengths.shape() != [n] {
        return Err(Failure::from(format!(
            "batch sizes disagree: log_probs {lp_shape:?} ([T, N, C]), targets {tg_shape:?} \
             ([N, S]), input_lengths {:?} and target_lengths {:?} ([N])",
            input_lengths.shape(),
            target_lengths.shape()
        )));
    }
    if t == 0 {
        return Err(Failure::from(format!(
            "log_probs {lp_shape:?} has no time step"
        )));
    }
    if blank >= c as usize {
        return Err(Failure::from(format!(
            "blank index {blank} is not a class of log_probs {lp_shape:?} (C = {c})"
        )));
    }
    let l = 2 * s_max + 1;
    let int = Dtype::Int32;
    let zero = Array::from_int(0);
    let blank_a = Array::from_int(blank as i32);

    // Extended labels: odd positions hold target (s - 1) / 2, even positions the blank.
    let pos = ops::arange::<i32, i32>(None, l, None)?; // [L]
    let is_label = pos.remainder(Array::from_int(2))?.eq(Array::from_int(1))?;
    let ext = if s_max == 0 {
        ops::broadcast_to(&blank_a, &[n, l])?
    } else {
        let tg = ops::clip(targets.as_dtype(int)?, (&zero, &Array::from_int(c - 1)))?;
        let which = ops::clip(
            pos.subtract(Array::from_int(1))?
                .floor_divide(Array::from_int(2))?,
            (&zero, &Array::from_int(s_max - 1)),
        )?;
        let labels = ops::indexing::take_axis(&tg, &which, 1)?; // [N, L]
        ops::select(&is_label.reshape(&[1, l])?, &labels, &blank_a)?
    };

    let lp_ext = ops::indexing::take_along_axis(
        log_probs,
        &ops::broadcast_to(ext.reshape(&[1, n, l])?, &[t, n, l])?,
        2,
    )?;
    let rows = lp_ext
        .split_equal(t, 0)?
        .into_iter()
        .map(|r| r.reshape(&[n, l]))
        .collect::<Result<Vec<_>, _>>()?;

    // `l'[s - 2]`, with the blank in front of position 0 and 1.
    let ext_m2 = if l > 2 {
        ops::concatenate(
            &[
                ops::broadcast_to(&blank_a, &[n, 2])?,
                native::slice(&ext, &[0, 0], &[n, l - 2], &[1, 1])?,
            ],
            1,
        )?
    } else {
        ops::broadcast_to(&blank_a, &[n, l])?
    };
    let skip = ext.ne(&blank_a)?.logical_and(&ext.ne(&ext_m2)?)?;

    let tl = ops::clip(
        target_lengths.as_dtype(int)?,
        (&zero, &Array::from_int(s_max)),
    )?
    .reshape(&[n, 1])?;
    let last = tl.multiply(Array::from_int(2))?; // 2·target_length
    let pos = pos.reshape(&[1, l])?;
    let valid = pos.le(&last)?;
    let end = pos
        .eq(&last)?
        .logical_or(&pos.eq(last.subtract(Array::from_int(1))?)?)?;
    let input_len =
        ops::clip(input_lengths.as_dtype(int)?, (&zero, &Array::from_int(t)))?.reshape(&[n, 1])?;
    let neg_inf = to_dtype(&Array::from_f32(f32::NEG_INFINITY), log_probs.dtype())?;

    Ok(Lattice {
        t,
        n,
        l,
        ext,
        rows,
        skip,
        valid,
        end,
        input_len,
        neg_inf,
    })
}

impl Lattice {
    /// `a` moved `k` positions towards higher `s` (`up`) or lower `s`, `-inf` filling in.
    fn shift(&self, a: &Array, k: i32, up: bool) -> Res {
        let (n, l) = (self.n, self.l);
        let fill = ops::broadcast_to(&self.neg_inf, &[n, k.min(l)])?;
        if k >= l {
            return Ok(fill);
        }
        Ok(if up {
            ops::concatenate(&[fill, native::slice(a, &[0, 0], &[n, l - k], &[1, 1])?], 1)?
        } else {
            ops::concatenate(&[native::slice(a, &[0, k], &[n, l], &[1, 1])?, fill], 1)?
        })
    }

    /// `a` minus its row maximum (`[N, L]`), and that maximum (`[N, 1]`; 0 for a row of `-inf`).
    ///
    /// The recursions keep each step's row rescaled this way, so the values stay within a few
    /// units of 0 instead of growing with `t` (to -1000 over a few hundred steps), where f32
    /// would keep only 4 or 5 digits after the point.
    fn rescale(&self, a: &Array) -> Res<(Array, Array)> {
        let m = a.max_axis(1, true)?;
        let zero = Array::from_int(0).as_dtype(m.dtype())?;
        let m = ops::select(&m.eq(&self.neg_inf)?, &zero, &m)?;
        Ok((a.subtract(&m)?, m))
    }

    /// The forward variables, rescaled: `log α̂[t] = log α[t] - Σ_{t' <= t} c[t']` (`[N, L]`
    /// each) for `t < T`, and the log scale `Σ c[t']` over each sample's input length (`[N]`).
    /// Once `t` reaches a sample's input length its row stays at `α̂[input_length - 1]`, so the
    /// last row holds every sample's final α̂.
    fn alphas(&self) -> Res<(Vec<Array>, Array)> {
        let starts = ops::arange::<i32, i32>(None, self.l, None)?.lt(Array::from_int(2))?;
        let first = ops::select(
            &self.valid.logical_and(&starts)?,
            &self.rows[0],
            &self.neg_inf,
        )?;
        let (first, mut scale) = self.rescale(&first)?;
        let zero = ops::zeros_like(&scale)?;
        let mut out = Vec::with_capacity(self.t as usize);
        out.push(first);
        for t in 1..self.t {
            let prev = &out[t as usize - 1];
            let two = ops::select(&self.skip, self.shift(prev, 2, true)?, &self.neg_inf)?;
            let sum = ops::logaddexp(ops::logaddexp(prev, self.shift(prev, 1, true)?)?, two)?;
            let next = ops::select(&self.valid, sum.add(&self.rows[t as usize])?, &self.neg_inf)?;
            let (next, c) = self.rescale(&next)?;
            let active = self.input_len.gt(Array::from_int(t))?;
            scale = scale.add(ops::select(&active, &c, &zero)?)?;
            out.push(ops::select(&active, &next, prev)?);
        }
        Ok((out, scale.reshape(&[self.n])?))
    }

    /// The per-sample loss `-log p` (`[N]`) from the last α̂ row and the log scale.
    fn nll(&self, last_alpha: &Array, scale: &Array) -> Res {
        // Both end positions in one reduction: log(exp(a) + exp(b)) over the row, shifted by
        // their maximum (0 when both are -inf: the target is unreachable, the loss +inf).
        let at_end = ops::select(&self.end, last_alpha, &self.neg_inf)?;
        let (shifted, m) = self.rescale(&at_end)?;
        let p = shifted.exp()?.sum_axis(1, true)?.log()?.add(&m)?;
        Ok(p.reshape(&[self.n])?.add(scale)?.negative()?)
    }

    /// The backward variables, rescaled per step like α̂ (the scale cancels in the posterior):
    /// `log β̂[t, s]` (`[N, L]` each, `t < T`) sums the alignments of the target's rest from
    /// position `s` at step `t` (including step `t`'s probability) to the end at step
    /// `input_length - 1`; `-inf` from `input_length` on.
    fn betas(&self) -> Res<Vec<Array>> {
        // `s -> s + 2` is allowed where `s + 2` was a skip target.
        let skip_down = if self.l > 2 {
            ops::concatenate(
                &[
                    native::slice(&self.skip, &[0, 2], &[self.n, self.l], &[1, 1])?,
                    ops::zeros_dtype(&[self.n, 2], Dtype::Bool)?,
                ],
                1,
            )?
        } else {
            ops::zeros_dtype(&[self.n, self.l], Dtype::Bool)?
        };
        let last_step = self.input_len.subtract(Array::from_int(1))?;
        let mut next = ops::broadcast_to(&self.neg_inf, &[self.n, self.l])?;
        let mut out = Vec::with_capacity(self.t as usize);
        for t in (0..self.t).rev() {
            let row = &self.rows[t as usize];
            let two = ops::select(&skip_down, self.shift(&next, 2, false)?, &self.neg_inf)?;
            let sum = ops::logaddexp(ops::logaddexp(&next, self.shift(&next, 1, false)?)?, two)?;
            let inner = sum.add(row)?;
            let start = ops::select(&self.end, row, &self.neg_inf)?;
            let cur = ops::select(&last_step.eq(Array::from_int(t))?, &start, &inner)?;
            let (cur, _) = self.rescale(&cur)?;
            out.push(cur.clone());
            next = cur;
        }
        out.reverse();
        Ok(out)
    }
}

/// Burn's `ctc_loss`: the per-sample negative log-likelihood `[N]`, in `log_probs`' dtype.
pub(super) fn ctc_loss(
    log_probs: MlxTensor,
    targets: MlxTensor,
    input_lengths: MlxTensor,
    target_lengths: MlxTensor,
    blank: usize,
) -> MlxTensor {
    let inputs = [&log_probs, &targets, &input_lengths, &target_lengths];
    run("ctc_loss", &inputs, || {
        let dtype = log_probs.array.dtype();
        let Some((_, lat)) = setup(&log_probs, &targets, &input_lengths, &target_lengths, blank)?
        else {
            return Ok(ops::zeros_dtype(&[0], dtype)?);
        };
        let (alphas, scale) = lat.alphas()?;
        let nll = lat.nll(alphas.last().expect("T > 0"), &scale)?;
        to_dtype(&nll, dtype)
    })
}

/// Burn's `ctc_loss_backward`: the gradient of `Σ_n grad_loss[n] · loss[n]` with respect to
/// `log_probs` (`[T, N, C]`, in `log_probs`' dtype), as PyTorch defines it (see the module
/// doc).
pub(super) fn ctc_loss_backward(
    log_probs: MlxTensor,
    targets: MlxTensor,
    input_lengths: MlxTensor,
    target_lengths: MlxTensor,
    grad_loss: MlxTensor,
    blank: usize,
) -> MlxTensor {
    let inputs = [
        &log_probs,
        &targets,
        &input_lengths,
        &target_lengths,
        &grad_loss,
    ];
    run("ctc_loss_backward", &inputs, || {
        let dtype = log_probs.array.dtype();
        let Some((lp, lat)) = setup(&log_probs, &targets, &input_lengths, &target_lengths, blank)?
        else {
            return Ok(ops::zeros_dtype(log_probs.array.shape(), dtype)?);
        };
        let cdt = lp.dtype();
        let (t, n, l) = (lat.t, lat.n, lat.l);
        if grad_loss.array.shape() != [n] {
            return Err(Failure::from(format!(
                "grad_loss must be [N] = [{n}]; got {:?}",
                grad_loss.array.shape()
            )));
        }
        let (alphas, scale) = lat.alphas()?;
        let nll = lat.nll(alphas.last().expect("T > 0"), &scale)?;
        let alpha = ops::stack(&alphas, 0)?; // [T, N, L]
        let beta = ops::stack(&lat.betas()?, 0)?;
        let lp_ext = ops::stack(&lat.rows, 0)?;

        // Posterior of position s at step t: α·β / (p(t, l'[s]) · p(target)). Every alignment
        // passes through exactly one position at each step t < input_length, so the posteriors
        // of a step sum to 1: normalising each step's row gives them without p(target) and
        // without the rescaling of α̂ and β̂ (the unscaled form, α + β - log p(t, l'[s]) + nll,
        // cancels terms near ±1000 on long inputs and loses f32 digits). Where α or β is -inf
        // the posterior is 0, and a row with none (t >= input_length, unreachable targets) is 0.
        let reached = alpha
            .gt(&lat.neg_inf)?
            .logical_and(&beta.gt(&lat.neg_inf)?)?;
        let zero = Array::from_int(0).as_dtype(cdt)?;
        let log_post = ops::select(&reached, alpha.add(&beta)?.subtract(&lp_ext)?, &lat.neg_inf)?;
        let m = log_post.max_axis(2, true)?;
        let m = ops::select(&m.eq(&lat.neg_inf)?, &zero, &m)?;
        let e = log_post.subtract(&m)?.exp()?;
        let z = e.sum_axis(2, true)?;
        let has = z.gt(&zero)?;
        let z = ops::select(&has, &z, Array::from_int(1).as_dtype(cdt)?)?;
        let post = e.divide(&z)?;

        let g = to_dtype(&grad_loss.array, cdt)?.reshape(&[1, n, 1])?;
        let idx = ops::broadcast_to(lat.ext.reshape(&[1, n, l])?, &[t, n, l])?;
        let per_class = native::scatter_add_axis(&ops::zeros_like(&lp)?, &idx, &post, 2)?;
        let grad = lp.exp()?.subtract(&per_class)?.multiply(&g)?;

        // Zero past each sample's input length and for samples with an infinite loss.
        let steps = ops::arange::<i32, i32>(None, t, None)?.reshape(&[t, 1, 1])?;
        let past = steps.ge(lat.input_len.reshape(&[1, n, 1])?)?;
        let unreachable = nll.is_inf()?.reshape(&[1, n, 1])?;
        let grad = ops::select(&past.logical_or(&unreachable)?, &zero, &grad)?;
        to_dtype(&grad, dtype)
    })
}
