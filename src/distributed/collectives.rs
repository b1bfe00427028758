//! The collectives of a [`Group`] on Burn tensors of the [`Mlx`] backend (`Tensor<Mlx, D, K>` for
//! float, int and bool tensors) and on the [`MlxTensor`] primitive: all_sum, all_max, all_min,
//! all_gather, broadcast, send/recv and barrier.
//!
//! Each call is eager: it computes its input, communicates, and returns an evaluated result (or
//! an error), bounded by the group's timeout. Every rank must call the same collectives in the
//! same order, with the same shapes and dtypes; with the group's checks on (the default), ranks
//! that do not fail with [`DistributedError::Mismatch`] naming what each passed.
//!
//! Dtypes: MLX's ring backend moves every dtype (bool, u8..u64, i8..i64, f16, bf16, f32, f64).
//! all_sum adds in the tensor's own dtype (integers wrap around on overflow; bool gives the
//! logical OR); all_gather, broadcast and send/recv copy the bits exactly.

use super::{DistributedError, Group};
use crate::backend::Mlx;
use crate::device::MlxDevice;
use crate::native::distributed::{self as raw, RawGroup};
use crate::tensor::MlxTensor;
use burn_tensor::{BasicOps, Bool, DType, Float, Int, Tensor, TensorPrimitive};
use mlx_rs::{Array, Dtype, Stream};
use std::sync::atomic::Ordering;

mod sealed {
    /// Keeps [`CollectiveTensor`](super::CollectiveTensor) and
    /// [`CollectiveKind`](super::CollectiveKind) closed to burn-mlx's types.
    pub trait Sealed {}
}

/// Why a quantized tensor is refused.
const QUANTIZED: &str = "quantized tensors cannot be communicated: call `dequantize()` first \
                         (or communicate the quantized values and scales as int and float \
                         tensors)";

/// A tensor the collectives take and return: `Tensor<Mlx, D, K>` for K = Float, Int or Bool,
/// and the [`MlxTensor`] primitive.
pub trait CollectiveTensor: sealed::Sealed + Sized {
    /// The MLX tensor underneath, or why it cannot be communicated.
    #[doc(hidden)]
    fn into_mlx(self) -> Result<MlxTensor, &'static str>;
    /// The tensor of this type around an MLX tensor.
    #[doc(hidden)]
    fn from_mlx(tensor: MlxTensor) -> Self;
}

impl sealed::Sealed for MlxTensor {}

impl CollectiveTensor for MlxTensor {
    fn into_mlx(self) -> Result<MlxTensor, &'static str> {
        if self.quant.is_some() {
            Err(QUANTIZED)
        } else {
            Ok(self)
        }
    }

    fn from_mlx(tensor: MlxTensor) -> Self {
        tensor
    }
}

/// The tensor kinds (Float, Int, Bool) whose `Tensor<Mlx, D, K>` the collectives take.
pub trait CollectiveKind: sealed::Sealed + BasicOps<Mlx> {
    /// The MLX tensor of a primitive of this kind, or why it cannot be communicated.
    #[doc(hidden)]
    fn primitive_into_mlx(p: Self::Primitive) -> Result<MlxTensor, &'static str>;
    /// The primitive of this kind around an MLX tensor.
    #[doc(hidden)]
    fn primitive_from_mlx(t: MlxTensor) -> Self::Primitive;
}

impl sealed::Sealed for Float {}
impl sealed::Sealed for Int {}
impl sealed::Sealed for Bool {}

impl CollectiveKind for Float {
    fn primitive_into_mlx(p: TensorPrimitive<Mlx>) -> Result<MlxTensor, &'static str> {
        match p {
            TensorPrimitive::Float(t) => t.into_mlx(),
            TensorPrimitive::QFloat(_) => Err(QUANTIZED),
        }
    }

    fn primitive_from_mlx(t: MlxTensor) -> TensorPrimitive<Mlx> {
        TensorPrimitive::Float(t)
    }
}

impl CollectiveKind for Int {
    fn primitive_into_mlx(p: MlxTensor) -> Result<MlxTensor, &'static str> {
        p.into_mlx()
    }

    fn primitive_from_mlx(t: MlxTensor) -> MlxTensor {
        t
    }
}

impl CollectiveKind for Bool {
    fn primitive_into_mlx(p: MlxTensor) -> Result<MlxTensor, &'static str> {
        p.into_mlx()
    }

    fn primitive_from_mlx(t: MlxTensor) -> MlxTensor {
        t
    }
}

impl<const D: usize, K: CollectiveKind> sealed::Sealed for Tensor<Mlx, D, K> {}

impl<const D: usize, K: CollectiveKind> CollectiveTensor for Tensor<Mlx, D, K> {
    fn into_mlx(self) -> Result<MlxTensor, &'static str> {
        K::primitive_into_mlx(self.into_primitive())
    }

    fn from_mlx(tensor: MlxTensor) -> Self {
        Tensor::from_primitive(K::primitive_from_mlx(tensor))
    }
}

/// What a rank tells the others about a collective before it runs (see [`Group::set_check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i64)]
pub(crate) enum OpCode {
    AllSum = 1,
    AllMax = 2,
    AllMin = 3,
    AllGather = 4,
    Broadcast = 5,
    Message = 6,
    AllReduceMean = 7,
    AllReduceSum = 8,
    Barrier = 9,
    BroadcastMany = 10,
}

impl OpCode {
    fn name(code: i64) -> &'static str {
        match code {
            1 => "all_sum",
            2 => "all_max",
            3 => "all_min",
            4 => "all_gather",
            5 => "broadcast",
            6 => "send/recv",
            7 => "all_reduce_mean",
            8 => "all_reduce_sum",
            9 => "barrier",
            10 => "broadcast_many",
            _ => "an unknown collective",
        }
    }
}

/// The length of a description: `[op, seq, dtype, ndim, numel, extra, d0..d5]`.
pub(crate) const DESC_LEN: usize = 12;

/// Describes a collective: which one, this rank's count, dtype (`-1`: several), rank and size
/// of the shape, an op-specific value (the root of a broadcast), and the first 6 dimensions.
pub(crate) fn describe(
    op: OpCode,
    seq: i64,
    dtype: Option<Dtype>,
    dims: &[usize],
    extra: i64,
) -> [i64; DESC_LEN] {
    let mut d = [0i64; DESC_LEN];
    d[0] = op as i64;
    d[1] = seq;
    d[2] = dtype.map_or(-1, |t| u32::from(t) as i64);
    d[3] = dims.len() as i64;
    d[4] = dims.iter().product::<usize>() as i64;
    d[5] = extra;
    for (slot, &dim) in d[6..].iter_mut().zip(dims) {
        *slot = dim as i64;
    }
    d
}

/// A description in words: `all_sum #3 of [2, 3] Float32`.
fn describe_row(row: &[i64]) -> String {
    let dtype = match row[2] {
        -1 => "mixed dtypes".to_string(),
        code => u32::try_from(code)
            .ok()
            .and_then(|c| Dtype::try_from(c).ok())
            .map_or_else(|| format!("dtype #{code}"), |t| format!("{t:?}")),
    };
    let ndim = row[3].max(0) as usize;
    let mut dims: Vec<String> = row[6..6 + ndim.min(6)]
        .iter()
        .map(|d| d.to_string())
        .collect();
    if ndim > 6 {
        dims.push("...".into());
    }
    let shape = format!("[{}] ({} elements)", dims.join(", "), row[4]);
    let extra = match row[0] {
        5 | 10 => format!(" from root {}", row[5]),
        7 | 8 => format!(" in {} tensors", row[5]),
        _ => String::new(),
    };
    format!(
        "{} #{} of {shape} {dtype}{extra}",
        OpCode::name(row[0]),
        row[1]
    )
}

/// `[2, 3] Float32` for error messages.
pub(crate) fn shape_text(t: &MlxTensor) -> String {
    format!("{:?} {:?}", t.dims(), t.mlx_dtype())
}

impl Group {
    /// The MLX tensor of `x`, or an [`DistributedError::Invalid`] for `op`.
    fn take<T: CollectiveTensor>(&self, op: &str, x: T) -> Result<MlxTensor, DistributedError> {
        x.into_mlx().map_err(|m| self.invalid(op, m.to_string()))
    }

    /// A [`DistributedError::Invalid`] for `op`.
    pub(crate) fn invalid(&self, op: &str, message: String) -> DistributedError {
        DistributedError::Invalid {
            op: op.into(),
            rank: self.rank(),
            size: self.size(),
            message,
        }
    }

    /// This rank's count of collectives, after counting one more.
    pub(crate) fn next_seq(&self) -> i64 {
        self.inner.seq.fetch_add(1, Ordering::Relaxed) as i64 + 1
    }

    /// Computes the inputs of a collective (not timed by the watchdog: this is local work).
    pub(crate) fn eval_inputs(
        &self,
        op: &str,
        shapes: &str,
        arrays: &[&Array],
        device: MlxDevice,
    ) -> Result<(), DistributedError> {
        crate::trace::check_not_tracing(op).map_err(|e| self.failed(op, shapes, e.to_string()))?;
        let _guard = crate::tensor::eval_lock();
        mlx_rs::transforms::eval(arrays.iter().copied()).map_err(|e| {
            self.failed(
                op,
                shapes,
                format!("computing the input failed: {}", e.what()),
            )
        })?;
        device.after_eval();
        Ok(())
    }

    /// The device and stream this group communicates on (see `Group::comm_device`).
    pub(crate) fn comm_stream(&self) -> (MlxDevice, Stream) {
        let dev = self.comm_device();
        (dev, dev.stream())
    }

    /// Computes `inputs` (the tensors the collective sends) and, with checks on, exchanges
    /// `desc` with every rank in the same evaluation and fails when they differ.
    ///
    /// One evaluation for both saves a wake-up of this thread per collective, which a loaded
    /// machine charges a scheduler tick for; the watchdog then also times the computation of the
    /// inputs, which the peers wait for anyway.
    pub(crate) fn agree(
        &self,
        op: &str,
        shapes: &str,
        desc: [i64; DESC_LEN],
        device: MlxDevice,
        inputs: &[&Array],
    ) -> Result<(), DistributedError> {
        if !self.check() || self.size() == 1 {
            return match inputs {
                [] => Ok(()),
                _ => self.eval_inputs(op, shapes, inputs, device),
            };
        }
        let (dev, stream) = self.comm_stream();
        let local = Array::from_slice(&desc, &[DESC_LEN as i32]);
        let gathered = raw::all_gather(&local, &self.inner.raw, &stream)
            .map_err(|m| self.failed(op, shapes, m))?;
        // The inputs first: MLX runs an evaluation's outputs in the order given, so each rank
        // computes before it waits for the others' descriptions, and the exchange absorbs the
        // ranks' skew (the collective that follows then starts with every rank ready).
        let mut arrays: Vec<Array> = inputs.iter().map(|&a| a.clone()).collect();
        arrays.push(gathered);
        let out = self.guarded_eval(op, shapes, arrays, dev)?;
        if !inputs.is_empty() && device != dev {
            device.after_eval();
        }
        let all = out
            .last()
            .expect("the check is the last output")
            .try_as_slice::<i64>()
            .map_err(|e| self.failed(op, shapes, format!("reading the check failed: {e}")))?;
        if all.chunks(DESC_LEN).all(|row| row == desc) {
            return Ok(());
        }
        let detail = all
            .chunks(DESC_LEN)
            .enumerate()
            .map(|(r, row)| format!("rank {r} called {}", describe_row(row)))
            .collect::<Vec<_>>()
            .join("; ");
        let e = DistributedError::Mismatch {
            op: op.into(),
            rank: self.rank(),
            size: self.size(),
            detail,
            hint: "Every rank must call the same collectives in the same order, with the same \
                   shapes, dtypes and root (give every rank a data shard with the same number of \
                   batches, and the same batch shape)"
                .into(),
        };
        self.mark_broken(&e);
        Err(e)
    }

    /// all_sum / all_max / all_min.
    fn all_reduce<T: CollectiveTensor>(
        &self,
        op: &str,
        code: OpCode,
        x: T,
        build: fn(&Array, &RawGroup, &Stream) -> Result<Array, String>,
    ) -> Result<T, DistributedError> {
        let x = self.take(op, x)?;
        if self.size() == 1 {
            return Ok(T::from_mlx(x));
        }
        self.ensure_usable(op)?;
        let shapes = shape_text(&x);
        let seq = self.next_seq();
        self.agree(
            op,
            &shapes,
            describe(code, seq, Some(x.mlx_dtype()), &x.dims(), 0),
            x.device(),
            &[x.array()],
        )?;
        if x.array().size() == 0 {
            return Ok(T::from_mlx(x));
        }
        let (dev, stream) = self.comm_stream();
        let lazy =
            build(x.array(), &self.inner.raw, &stream).map_err(|m| self.failed(op, &shapes, m))?;
        let mut out = self.guarded_eval(op, &shapes, vec![lazy], dev)?;
        Ok(T::from_mlx(MlxTensor::from_array(
            out.remove(0),
            x.device(),
        )))
    }

    /// The elementwise sum of `x` over all ranks, on every rank.
    ///
    /// ```no_run
    /// use burn_mlx::{distributed, Mlx, MlxDevice};
    /// use burn_tensor::Tensor;
    ///
    /// let group = distributed::init(distributed::CommBackend::Any)?;
    /// let x = Tensor::<Mlx, 1>::from_floats([1.0, 2.0, 3.0], &MlxDevice::Cpu);
    /// let total = group.all_sum(x)?; // [n, 2n, 3n] on every one of n ranks
    /// # Ok::<(), distributed::DistributedError>(())
    /// ```
    pub fn all_sum<T: CollectiveTensor>(&self, x: T) -> Result<T, DistributedError> {
        self.all_reduce("all_sum", OpCode::AllSum, x, raw::all_sum)
    }

    /// The elementwise maximum of `x` over all ranks, on every rank.
    pub fn all_max<T: CollectiveTensor>(&self, x: T) -> Result<T, DistributedError> {
        self.all_reduce("all_max", OpCode::AllMax, x, raw::all_max)
    }

    /// The elementwise minimum of `x` over all ranks, on every rank.
    pub fn all_min<T: CollectiveTensor>(&self, x: T) -> Result<T, DistributedError> {
        self.all_reduce("all_min", OpCode::AllMin, x, raw::all_min)
    }

    /// Every rank's `x` concatenated along the first axis in rank order, on every rank: shape
    /// `[size * d0, d1, ...]` for inputs of shape `[d0, d1, ...]` (the same on every rank).
    pub fn all_gather<T: CollectiveTensor>(&self, x: T) -> Result<T, DistributedError> {
        let op = "all_gather";
        let x = self.take(op, x)?;
        if self.size() == 1 {
            return Ok(T::from_mlx(x));
        }
        self.ensure_usable(op)?;
        let shapes = shape_text(&x);
        let seq = self.next_seq();
        let dims = x.dims();
        self.agree(
            op,
            &shapes,
            describe(OpCode::AllGather, seq, Some(x.mlx_dtype()), &dims, 0),
            x.device(),
            &[x.array()],
        )?;
        let (dev, stream) = self.comm_stream();
        if x.array().size() == 0 {
            let mut shape: Vec<i32> = x.array().shape().to_vec();
            match shape.first_mut() {
                Some(d0) => *d0 *= self.size() as i32,
                None => shape.push(self.size() as i32),
            }
            let zeros =
                mlx_rs::with_stream(&stream, || mlx_rs::ops::zeros_dtype(&shape, x.mlx_dtype()))
                    .map_err(|e| self.failed(op, &shapes, e.what().to_string()))?;
            return Ok(T::from_mlx(MlxTensor::from_array(zeros, x.device())));
        }
        let lazy = raw::all_gather(x.array(), &self.inner.raw, &stream)
            .map_err(|m| self.failed(op, &shapes, m))?;
        let mut out = self.guarded_eval(op, &shapes, vec![lazy], dev)?;
        Ok(T::from_mlx(MlxTensor::from_array(
            out.remove(0),
            x.device(),
        )))
    }

    /// `root`'s `x` on every rank, bit for bit (the other ranks' `x` gives only the shape and
    /// dtype, which must match the root's).
    ///
    /// Built from one all_sum of the bits: the root contributes its tensor viewed as unsigned
    /// integers of the same width, the others zeros, so the sum is the root's bits exactly
    /// (-0.0 and NaN payloads included).
    pub fn broadcast<T: CollectiveTensor>(&self, x: T, root: usize) -> Result<T, DistributedError> {
        let op = "broadcast";
        let x = self.take(op, x)?;
        if root >= self.size() {
            return Err(self.invalid(
                op,
                format!(
                    "root {root} is not a rank of this group (0..{})",
                    self.size()
                ),
            ));
        }
        if self.size() == 1 {
            return Ok(T::from_mlx(x));
        }
        self.ensure_usable(op)?;
        let shapes = shape_text(&x);
        let seq = self.next_seq();
        let inputs: &[&Array] = if self.rank() == root {
            &[x.array()]
        } else {
            &[]
        };
        self.agree(
            op,
            &shapes,
            describe(
                OpCode::Broadcast,
                seq,
                Some(x.mlx_dtype()),
                &x.dims(),
                root as i64,
            ),
            x.device(),
            inputs,
        )?;
        if x.array().size() == 0 {
            return Ok(T::from_mlx(x));
        }
        let dtype = x.mlx_dtype();
        let bits = bits_dtype(x.array().item_size())
            .ok_or_else(|| self.invalid(op, format!("dtype {dtype:?} has no unsigned view")))?;
        let (dev, stream) = self.comm_stream();
        let shape = x.array().shape().to_vec();
        let contribution = mlx_rs::with_stream(&stream, || {
            if self.rank() == root {
                x.array().view_dtype(bits)
            } else {
                mlx_rs::ops::zeros_dtype(&shape, bits)
            }
        })
        .map_err(|e| self.failed(op, &shapes, e.what().to_string()))?;
        let lazy = raw::all_sum(&contribution, &self.inner.raw, &stream)
            .map_err(|m| self.failed(op, &shapes, m))?;
        let mut out = self.guarded_eval(op, &shapes, vec![lazy], dev)?;
        let summed = out.remove(0);
        let result = mlx_rs::with_stream(&stream, || summed.view_dtype(dtype))
            .map_err(|e| self.failed(op, &shapes, e.what().to_string()))?;
        Ok(T::from_mlx(MlxTensor::from_array(result, x.device())))
    }

    /// Waits until every rank has reached this call.
    pub fn barrier(&self) -> Result<(), DistributedError> {
        let op = "barrier";
        if self.size() == 1 {
            return Ok(());
        }
        self.ensure_usable(op)?;
        let seq = self.next_seq();
        self.agree(
            op,
            "[1] Int32",
            describe(OpCode::Barrier, seq, Some(Dtype::Int32), &[1], 0),
            MlxDevice::Cpu,
            &[],
        )?;
        let (dev, stream) = self.comm_stream();
        let one = Array::from_slice(&[1i32], &[1]);
        let lazy = raw::all_sum(&one, &self.inner.raw, &stream)
            .map_err(|m| self.failed(op, "[1] Int32", m))?;
        self.guarded_eval(op, "[1] Int32", vec![lazy], dev)?;
        Ok(())
    }

    /// Checks that `peer` is another rank that this backend can reach directly.
    fn check_peer(&self, op: &str, peer: usize, role: &str) -> Result<(), DistributedError> {
        let (rank, size) = (self.rank(), self.size());
        if size == 1 {
            return Err(self.invalid(
                op,
                "a single-process group has no peer: start several ranks (the launcher)".into(),
            ));
        }
        if peer >= size || peer == rank {
            return Err(self.invalid(
                op,
                format!("{role} {peer} must be another rank of this group (0..{size}, not {rank})"),
            ));
        }
        let neighbours = [(rank + 1) % size, (rank + size - 1) % size];
        if self.backend() == super::CommBackend::Ring && !neighbours.contains(&peer) {
            return Err(self.invalid(
                op,
                format!(
                    "the ring backend sends only to a rank's neighbours ({} and {}), not to {peer}; \
                     forward through the ranks in between",
                    neighbours[1], neighbours[0]
                ),
            ));
        }
        Ok(())
    }

    /// Sends `x` to rank `dst`, which must call [`recv`](Self::recv) or
    /// [`recv_like`](Self::recv_like) with the same shape and dtype. Returns once the data is
    /// handed to the transport.
    ///
    /// The ring backend connects each rank to its two neighbours only (`rank ± 1`, wrapping).
    /// Two ranks that send large tensors to each other at the same time both wait for the other
    /// to receive: order the calls (even ranks send first, odd ranks receive first).
    pub fn send<T: CollectiveTensor>(&self, x: T, dst: usize) -> Result<(), DistributedError> {
        let op = "send";
        let x = self.take(op, x)?;
        self.check_peer(op, dst, "destination")?;
        self.ensure_usable(op)?;
        let shapes = shape_text(&x);
        self.eval_inputs(op, &shapes, &[x.array()], x.device())?;
        let n = self.inner.sent[dst].fetch_add(1, Ordering::Relaxed) as i64 + 1;
        let (dev, stream) = self.comm_stream();
        if self.check() {
            let header = describe(
                OpCode::Message,
                n,
                Some(x.mlx_dtype()),
                &x.dims(),
                self.rank() as i64,
            );
            let header = Array::from_slice(&header, &[DESC_LEN as i32]);
            let lazy = raw::send(&header, dst, &self.inner.raw, &stream)
                .map_err(|m| self.failed(op, &shapes, m))?;
            self.guarded_eval(op, &shapes, vec![lazy], dev)?;
        }
        if x.array().size() == 0 {
            return Ok(());
        }
        let lazy = raw::send(x.array(), dst, &self.inner.raw, &stream)
            .map_err(|m| self.failed(op, &shapes, m))?;
        self.guarded_eval(op, &shapes, vec![lazy], dev)?;
        Ok(())
    }

    /// Receives from rank `src` a tensor of `shape` and Burn `dtype` on `device` (the sender
    /// calls [`send`](Self::send)).
    pub fn recv(
        &self,
        shape: &[usize],
        dtype: DType,
        device: MlxDevice,
        src: usize,
    ) -> Result<MlxTensor, DistributedError> {
        let op = "recv";
        let mlx_dtype = match dtype {
            DType::QFloat(_) => return Err(self.invalid(op, QUANTIZED.into())),
            other => crate::dtype::to_mlx(other),
        };
        let shapes = format!("{shape:?} {mlx_dtype:?}");
        self.check_peer(op, src, "source")?;
        self.ensure_usable(op)?;
        let dims =
            crate::tensor::to_i32_shape(shape, op).map_err(|e| self.invalid(op, e.to_string()))?;
        let n = self.inner.received[src].fetch_add(1, Ordering::Relaxed) as i64 + 1;
        let (dev, stream) = self.comm_stream();
        if self.check() {
            let expected = describe(OpCode::Message, n, Some(mlx_dtype), shape, src as i64);
            let lazy = raw::recv(
                &[DESC_LEN as i32],
                Dtype::Int64,
                src,
                &self.inner.raw,
                &stream,
            )
            .map_err(|m| self.failed(op, &shapes, m))?;
            let out = self.guarded_eval(op, &shapes, vec![lazy], dev)?;
            let header = out[0]
                .try_as_slice::<i64>()
                .map_err(|e| self.failed(op, &shapes, format!("reading the header failed: {e}")))?;
            if header != expected {
                let e = DistributedError::Mismatch {
                    op: op.into(),
                    rank: self.rank(),
                    size: self.size(),
                    detail: format!(
                        "rank {src} sent {}, but rank {} expects {}",
                        describe_row(header),
                        self.rank(),
                        describe_row(&expected)
                    ),
                    hint: "Pair every send with a recv of the same shape and dtype, in the same \
                           order"
                        .into(),
                };
                self.mark_broken(&e);
                return Err(e);
            }
        }
        let array = if shape.iter().product::<usize>() == 0 {
            mlx_rs::with_stream(&stream, || mlx_rs::ops::zeros_dtype(&dims, mlx_dtype))
                .map_err(|e| self.failed(op, &shapes, e.what().to_string()))?
        } else {
            let lazy = raw::recv(&dims, mlx_dtype, src, &self.inner.raw, &stream)
                .map_err(|m| self.failed(op, &shapes, m))?;
            self.guarded_eval(op, &shapes, vec![lazy], dev)?.remove(0)
        };
        Ok(MlxTensor::from_array(array, device))
    }

    /// Receives from rank `src` a tensor with the shape, dtype and device of `template` (whose
    /// values are not used).
    pub fn recv_like<T: CollectiveTensor>(
        &self,
        template: T,
        src: usize,
    ) -> Result<T, DistributedError> {
        let t = self.take("recv", template)?;
        let dtype = crate::dtype::from_mlx(t.mlx_dtype());
        self.recv(&t.dims(), dtype, t.device(), src)
            .map(T::from_mlx)
    }
}

/// The unsigned dtype of the same width, for moving bits.
pub(crate) fn bits_dtype(item_size: usize) -> Option<Dtype> {
    match item_size {
        1 => Some(Dtype::Uint8),
        2 => Some(Dtype::Uint16),
        4 => Some(Dtype::Uint32),
        8 => Some(Dtype::Uint64),
        _ => None,
    }
}
