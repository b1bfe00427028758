//! Data-parallel training: [`GradientAllReduce`] averages (or sums, or broadcasts) many tensors
//! across the ranks in a few large collectives instead of one per tensor.
//!
//! Each rank computes the gradients of its own shard of the batch; averaging them over the
//! ranks gives every rank the gradient of the whole batch (for a loss that is a mean over
//! equally sized shards), so the optimizer step, and the parameters after it, are the same on
//! every rank. The tensors are flattened and concatenated into buckets of up to
//! [`bucket_bytes`](GradientAllReduce::bucket_bytes) (one dtype per bucket, in the order given),
//! each bucket is summed with one all_sum, and the results are split back into tensors of the
//! original shapes. All buckets go to MLX in one evaluation, under one watchdog.
//!
//! Burn's `GradientsParams` (burn-optim) holds gradients by parameter id with the tensor rank as
//! a type parameter, so the glue that takes them out in the module's order and puts the
//! averages back is a `ModuleVisitor`; `crates/burn-mlx-distributed/src/ddp.rs` has it (about 60
//! lines) and shows its use in a hand-written loop and in burn-train's `TrainStep`.

use super::collectives::{bits_dtype, describe, shape_text, OpCode};
use super::{DistributedError, Group};
use crate::native::distributed as raw;
use crate::tensor::MlxTensor;
use mlx_rs::{Array, Dtype};

/// The bucket size when none is given: 64 MiB.
const DEFAULT_BUCKET_BYTES: usize = 64 << 20;

/// Bucketed collectives over many tensors: flattened into buckets of one dtype, one all_sum per
/// bucket, all buckets in one evaluation under the group's watchdog.
///
/// ```no_run
/// use burn_mlx::distributed::{self, CommBackend, GradientAllReduce};
/// # fn grads() -> Vec<burn_mlx::MlxTensor> { Vec::new() }
///
/// let group = distributed::init(CommBackend::Any)?;
/// let reducer = GradientAllReduce::new();
/// let averaged = reducer.all_mean(&group, grads())?; // same order and shapes as given
/// # Ok::<(), distributed::DistributedError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GradientAllReduce {
    bucket_bytes: usize,
}

impl Default for GradientAllReduce {
    fn default() -> Self {
        Self::new()
    }
}

/// How the values of one bucket are combined.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Mean,
    Sum,
    Broadcast(usize),
}

/// Tensors of one dtype that travel together.
struct Bucket {
    dtype: Dtype,
    members: Vec<usize>,
    elements: usize,
}

impl GradientAllReduce {
    /// Buckets of up to 64 MiB.
    pub fn new() -> Self {
        GradientAllReduce {
            bucket_bytes: DEFAULT_BUCKET_BYTES,
        }
    }

    /// Sets the largest bucket, in bytes (a tensor larger than this travels alone). Smaller
    /// buckets need less extra memory (each bucket is a copy of its tensors); larger ones fewer
    /// collectives.
    pub fn bucket_bytes(mut self, bytes: usize) -> Self {
        self.bucket_bytes = bytes.max(1);
        self
    }

    /// The largest bucket, in bytes.
    pub fn bucket_size(&self) -> usize {
        self.bucket_bytes
    }

    /// The elementwise mean of each tensor over the ranks (float tensors), in the order given.
    /// Every rank must pass the same number of tensors with the same shapes and dtypes.
    pub fn all_mean(
        &self,
        group: &Group,
        tensors: Vec<MlxTensor>,
    ) -> Result<Vec<MlxTensor>, DistributedError> {
        self.run(group, "all_reduce_mean", Mode::Mean, tensors)
    }

    /// The elementwise sum of each tensor over the ranks, in the order given.
    pub fn all_sum(
        &self,
        group: &Group,
        tensors: Vec<MlxTensor>,
    ) -> Result<Vec<MlxTensor>, DistributedError> {
        self.run(group, "all_reduce_sum", Mode::Sum, tensors)
    }

    /// Rank `root`'s tensors on every rank, bit for bit (to start every rank from the same
    /// parameters). The other ranks' tensors give only the shapes and dtypes.
    pub fn broadcast(
        &self,
        group: &Group,
        tensors: Vec<MlxTensor>,
        root: usize,
    ) -> Result<Vec<MlxTensor>, DistributedError> {
        if root >= group.size() {
            return Err(group.invalid(
                "broadcast_many",
                format!(
                    "root {root} is not a rank of this group (0..{})",
                    group.size()
                ),
            ));
        }
        self.run(group, "broadcast_many", Mode::Broadcast(root), tensors)
    }

    /// Splits the tensors into buckets, in order, one dtype per bucket.
    fn plan(&self, dtypes: &[Dtype], sizes: &[usize]) -> Vec<Bucket> {
        let mut buckets: Vec<Bucket> = Vec::new();
        // The open bucket of each dtype, as an index into `buckets`.
        let mut open: Vec<(Dtype, usize)> = Vec::new();
        for (i, (&dtype, &n)) in dtypes.iter().zip(sizes).enumerate() {
            let item = mlx_item_size(dtype);
            let slot = open.iter().position(|(d, _)| *d == dtype);
            let fits = slot.is_some_and(|s| {
                let b = &buckets[open[s].1];
                (b.elements + n) * item <= self.bucket_bytes
            });
            if fits {
                let b = &mut buckets[open[slot.expect("checked above")].1];
                b.members.push(i);
                b.elements += n;
            } else {
                buckets.push(Bucket {
                    dtype,
                    members: vec![i],
                    elements: n,
                });
                let index = buckets.len() - 1;
                match slot {
                    Some(s) => open[s].1 = index,
                    None => open.push((dtype, index)),
                }
            }
        }
        buckets
    }

    fn run(
        &self,
        group: &Group,
        op: &str,
        mode: Mode,
        tensors: Vec<MlxTensor>,
    ) -> Result<Vec<MlxTensor>, DistributedError> {
        if group.size() == 1 || tensors.is_empty() {
            return Ok(tensors);
        }
        group.ensure_usable(op)?;
        for (i, t) in tensors.iter().enumerate() {
            if t.quant.is_some() {
                return Err(group.invalid(
                    op,
                    format!("tensor {i} is quantized: call `dequantize()` first"),
                ));
            }
            if mode == Mode::Mean
                && !matches!(
                    t.mlx_dtype(),
                    Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32 | Dtype::Float64
                )
            {
                return Err(group.invalid(
                    op,
                    format!(
                        "tensor {i} ({}) is not a float tensor; a mean needs floats (use \
                         all_sum for integers)",
                        shape_text(t)
                    ),
                ));
            }
        }
        let device = tensors[0].device();
        if let Some(i) = tensors.iter().position(|t| t.device() != device) {
            return Err(group.invalid(
                op,
                format!(
                    "tensor {i} is on {:?} but tensor 0 on {device:?}; move them to one device",
                    tensors[i].device()
                ),
            ));
        }
        let dtypes: Vec<Dtype> = tensors.iter().map(|t| t.mlx_dtype()).collect();
        let sizes: Vec<usize> = tensors.iter().map(|t| t.array().size()).collect();
        let total: usize = sizes.iter().sum();
        let shapes = format!(
            "{} tensors, {total} elements, first {}",
            tensors.len(),
            shape_text(&tensors[0])
        );

        // The inputs (the backward pass, for gradients) are computed with the agreement check.
        let root_only = matches!(mode, Mode::Broadcast(root) if root != group.rank());
        let inputs: Vec<&Array> = if root_only {
            Vec::new()
        } else {
            tensors.iter().map(|t| t.array()).collect()
        };

        let buckets = self.plan(&dtypes, &sizes);
        let seq = group.next_seq();
        // The check compares the number of tensors, the buckets and a digest of every shape
        // and dtype, so that ranks whose models or batches differ fail with a clear error.
        let mut digest: u64 = 0xcbf2_9ce4_8422_2325;
        for t in &tensors {
            for v in t
                .dims()
                .into_iter()
                .chain([u32::from(t.mlx_dtype()) as usize, usize::MAX])
            {
                digest = (digest ^ v as u64).wrapping_mul(0x1000_0000_01b3);
            }
        }
        let code = match mode {
            Mode::Mean => OpCode::AllReduceMean,
            Mode::Sum => OpCode::AllReduceSum,
            Mode::Broadcast(_) => OpCode::BroadcastMany,
        };
        let mut desc = describe(code, seq, None, &[buckets.len(), total], 0);
        desc[5] = match mode {
            Mode::Broadcast(root) => root as i64,
            _ => tensors.len() as i64,
        };
        desc[8] = digest as i64;
        group.agree(op, &shapes, desc, device, &inputs)?;

        let (dev, stream) = group.comm_stream();
        let mlx = |e: mlx_rs::error::Exception| group.failed(op, &shapes, e.what().to_string());
        let mut lazy = Vec::with_capacity(buckets.len());
        for b in &buckets {
            let flat = mlx_rs::with_stream(&stream, || {
                let parts = b
                    .members
                    .iter()
                    .map(|&i| tensors[i].array().reshape(&[-1]))
                    .collect::<Result<Vec<Array>, _>>()?;
                let flat = if parts.len() == 1 {
                    parts.into_iter().next().expect("one part")
                } else {
                    mlx_rs::ops::concatenate(&parts, 0)?
                };
                match mode {
                    Mode::Broadcast(root) => {
                        let bits = bits_dtype(flat.item_size()).expect("fixed-width dtype");
                        if root == group.rank() {
                            flat.view_dtype(bits)
                        } else {
                            mlx_rs::ops::zeros_dtype(&[b.elements as i32], bits)
                        }
                    }
                    _ => Ok(flat),
                }
            })
            .map_err(mlx)?;
            lazy.push(
                raw::all_sum(&flat, &group.inner.raw, &stream)
                    .map_err(|m| group.failed(op, &shapes, m))?,
            );
        }
        let summed = group.guarded_eval(op, &shapes, lazy, dev)?;

        let mut out: Vec<Option<MlxTensor>> = vec![None; tensors.len()];
        let scale = 1.0 / group.size() as f32;
        for (b, flat) in buckets.iter().zip(summed) {
            let flat = mlx_rs::with_stream(&stream, || match mode {
                Mode::Mean => {
                    let s = Array::from_f32(scale).as_dtype(b.dtype)?;
                    flat.multiply(&s)
                }
                Mode::Sum => Ok(flat),
                Mode::Broadcast(_) => flat.view_dtype(b.dtype),
            })
            .map_err(mlx)?;
            let mut offset = 0usize;
            for &i in &b.members {
                let n = sizes[i];
                let shape: Vec<i32> = tensors[i].array().shape().to_vec();
                let piece = mlx_rs::with_stream(&stream, || {
                    if b.members.len() == 1 {
                        flat.reshape(&shape).map_err(mlx)
                    } else {
                        let end = (offset + n) as i32;
                        crate::native::slice(&flat, &[offset as i32], &[end], &[1])
                            .map_err(|e| group.failed(op, &shapes, e.to_string()))?
                            .reshape(&shape)
                            .map_err(mlx)
                    }
                })?;
                offset += n;
                out[i] = Some(MlxTensor::from_array(piece, tensors[i].device()));
            }
        }
        Ok(out
            .into_iter()
            .map(|t| t.expect("every tensor is in one bucket"))
            .collect())
    }
}

/// Bytes per element of an MLX dtype.
fn mlx_item_size(dtype: Dtype) -> usize {
    match dtype {
        Dtype::Bool | Dtype::Uint8 | Dtype::Int8 => 1,
        Dtype::Uint16 | Dtype::Int16 | Dtype::Float16 | Dtype::Bfloat16 => 2,
        Dtype::Uint32 | Dtype::Int32 | Dtype::Float32 => 4,
        Dtype::Uint64 | Dtype::Int64 | Dtype::Float64 | Dtype::Complex64 => 8,
    }
}
