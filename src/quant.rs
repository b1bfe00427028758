//! Group-wise quantized weight matrices multiplied through MLX's quantized matmul.
//!
//! A [`QuantizedMatrix`] holds a weight matrix `W` (`[out, in]`, the layout of PyTorch's and
//! mlx-lm's linear layers) quantized in groups of `group_size` consecutive values along `in`,
//! with one scale per group, and computes `x · Wᵀ` and embedding lookups (rows of `W`) from it.
//!
//! # The format, and how Burn's quantization reaches it
//!
//! The quantization is Burn's own: a [`QuantScheme`] with symmetric mode, `Q8S` or `Q4S` values
//! and one-dimensional blocks of `group_size` values (see [`quant_scheme`]). Each block gets the
//! scale `s = 2·max|x| / (b − a)` (`[a, b]` is `[-127, 127]` or `[-7, 7]`) and each value
//! `q = clamp(round(x / s), a, b)`, rounding halves away from zero. On [`Mlx`] the weight goes
//! through Burn's API itself ([`Tensor::quantize_dynamic`], which burn-mlx implements bit for bit
//! like burn-ndarray), and the result is converted, exactly, into MLX's group-wise affine format:
//! unsigned values `u = q + 2^(bits−1)` packed into `u32` words (lowest bits first), the scale
//! `s`, and the bias `−2^(bits−1)·s`, so that MLX's `s·u + bias` is `s·q`. Products then run
//! through `mlx_quantized_matmul` (`transpose = true`, as mlx-lm's `QuantizedLinear` calls it),
//! and row lookups through `mlx_dequantize` of the gathered rows.
//!
//! Burn's `q_matmul` (what `Tensor::matmul` calls when an operand is quantized) would not do
//! this by itself: its default dequantizes the operand on every call, and Burn's quantized
//! primitive has no room for MLX's packed form, which has to be built once and kept. Hence this
//! type, which keeps it.
//!
//! # Other backends
//!
//! `QuantizedMatrix<B>` is generic over the backend, so model code written for any backend can
//! use it. On `Autodiff<Mlx>` the packed form is kept too, and a product is one autodiff node:
//! MLX's quantized matmul forward, MLX's vector-Jacobian product of it backward, with the
//! gradient flowing to the input only (the weights are constants): what QLoRA training needs.
//! On a backend not built on MLX (burn-ndarray, burn-flex, burn-candle, ...), the same
//! quantization is computed with plain float tensor ops (those backends do not all implement
//! Burn's 4-bit quantization) and the matrix is kept dequantized (`s·q` in the weight's dtype):
//! the results are those of the quantized weights, with no saving of memory or time.
//!
//! # Precision and the CPU
//!
//! Scales and biases are kept in the weight's dtype on the GPU, as mlx-lm does. On MLX's CPU
//! backend they are kept in f32, and half-precision inputs are multiplied in f32 and rounded
//! once: off Apple silicon, MLX's CPU quantized matmul is a scalar loop that accumulates in the
//! input's dtype. For the same reason, on the CPU a product with more than
//! [`CPU_QMM_MAX_ROWS`] rows (a prompt) dequantizes the weight to f32 and uses the BLAS matmul.

use crate::backend::Mlx;
use crate::device::MlxDevice;
use crate::error::MlxError;
use crate::tensor::describe;
use crate::tensor::MlxTensor;
use burn_backend::quantization::{QuantLevel, QuantMode, QuantScheme, QuantStore, QuantValue};
use burn_backend::TensorPrimitive;
use burn_tensor::backend::Backend;
use burn_tensor::{DType, Int, Tensor};
use mlx_rs::{ops, Array, Dtype};
use std::any::Any;
use std::fmt;

/// The group size mlx-lm uses by default, and that `--quantize` uses.
pub const DEFAULT_GROUP_SIZE: usize = 64;

/// On MLX's CPU backend, products with more rows than this dequantize the weight and use the
/// BLAS matmul instead of MLX's (scalar) quantized matmul.
pub const CPU_QMM_MAX_ROWS: usize = 8;

/// Bits per quantized value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantBits {
    /// 8 bits: Burn's `Q8S` values (`[-127, 127]`).
    Q8,
    /// 4 bits: Burn's `Q4S` values (`[-7, 7]`).
    Q4,
}

impl QuantBits {
    /// The number of bits.
    pub fn bits(self) -> usize {
        match self {
            QuantBits::Q8 => 8,
            QuantBits::Q4 => 4,
        }
    }

    /// Burn's value type for these bits.
    pub fn value(self) -> QuantValue {
        match self {
            QuantBits::Q8 => QuantValue::Q8S,
            QuantBits::Q4 => QuantValue::Q4S,
        }
    }
}

impl fmt::Display for QuantBits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "q{}", self.bits())
    }
}

/// Burn's quantization scheme of a [`QuantizedMatrix`]: symmetric, [`QuantBits::value`] values,
/// one-dimensional blocks of `group_size` values, f32 scales, values stored natively.
///
/// `group_size` must be 32, 64 or 128 (the group sizes of MLX's quantized matmul).
pub fn quant_scheme(bits: QuantBits, group_size: usize) -> Result<QuantScheme, MlxError> {
    check_group_size("quant_scheme", group_size)?;
    Ok(QuantScheme::default()
        .with_mode(QuantMode::Symmetric)
        .with_value(bits.value())
        .with_level(QuantLevel::block([group_size as u8]))
        .with_store(QuantStore::Native))
}

fn check_group_size(op: &str, group_size: usize) -> Result<(), MlxError> {
    if matches!(group_size, 32 | 64 | 128) {
        Ok(())
    } else {
        Err(MlxError::Shape {
            op: op.into(),
            shapes: format!(
                "group size {group_size} (MLX's quantized matmul takes groups of 32, 64 or 128)"
            ),
        })
    }
}

/// Checks that a `[out, in]` matrix splits into groups of `group_size` along `in`.
fn check_matrix(op: &str, dims: [usize; 2], group_size: usize) -> Result<(), MlxError> {
    check_group_size(op, group_size)?;
    let [out, input] = dims;
    if input == 0 || out == 0 || !input.is_multiple_of(group_size) {
        return Err(MlxError::Shape {
            op: op.into(),
            shapes: format!(
                "weight [out, in] = [{out}, {input}]: `in` ({input}) must be a positive multiple \
                 of the group size {group_size}"
            ),
        });
    }
    Ok(())
}

/// MLX's packed affine form of a matrix (only on [`Mlx`]).
#[derive(Clone)]
struct Packed {
    /// `[out, in · bits / 32]` `u32` words.
    words: MlxTensor,
    /// `[out, in / group_size]`, f32 on the CPU, the weight's dtype on the GPU.
    scales: MlxTensor,
    /// `−2^(bits−1) · scales`, same shape and dtype.
    biases: MlxTensor,
}

#[derive(Clone)]
enum Repr<B: Backend> {
    /// `B` is [`Mlx`]: MLX's packed form.
    Mlx(Packed),
    /// Any other backend: the dequantized matrix `[out, in]`, in the weight's dtype.
    Dequantized(Tensor<B, 2>),
}

/// A weight matrix `[out, in]` quantized in groups along `in` (see the [module](self) docs):
/// through MLX's quantized matmul on [`Mlx`], dequantized on other backends.
#[derive(Clone)]
pub struct QuantizedMatrix<B: Backend> {
    repr: Repr<B>,
    dims: [usize; 2],
    bits: QuantBits,
    group_size: usize,
    dtype: DType,
}

impl<B: Backend> fmt::Debug for QuantizedMatrix<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuantizedMatrix")
            .field("dims", &self.dims)
            .field("bits", &self.bits)
            .field("group_size", &self.group_size)
            .field("dtype", &self.dtype)
            .field("mlx_packed", &self.is_mlx_packed())
            .finish()
    }
}

/// `value` as a `U` when `T` and `U` are the same type.
fn same_type<T: 'static, U: 'static>(value: T) -> Option<U> {
    let mut slot = Some(value);
    (&mut slot as &mut dyn Any)
        .downcast_mut::<Option<U>>()
        .and_then(Option::take)
}

/// Whether `B` is [`Mlx`] itself.
fn is_mlx<B: Backend>() -> bool {
    std::any::TypeId::of::<B>() == std::any::TypeId::of::<Mlx>()
}

/// Whether `B` is `Autodiff<Mlx>` (either checkpoint strategy): the packed form is kept, and
/// products are one autodiff node whose backward pass is MLX's ([`QuantizedMatmulOp`]).
fn is_autodiff_mlx<B: Backend>() -> bool {
    crate::nn::custom::is_mlx::<B>() && !is_mlx::<B>()
}

/// A float tensor of `B` = `Autodiff<Mlx>` that autodiff does not track, from an MLX array.
fn untracked<B: Backend, const D: usize>(array: Array, device: MlxDevice) -> Tensor<B, D> {
    use burn_autodiff::checkpoint::strategy::{BalancedCheckpointing, NoCheckpointing};
    use burn_autodiff::Autodiff;
    use burn_tensor::backend::AutodiffBackend;
    let inner = MlxTensor::from_array(array, device);
    let id = std::any::TypeId::of::<B>();
    let boxed: Box<dyn Any> = if id == std::any::TypeId::of::<Autodiff<Mlx, NoCheckpointing>>() {
        Box::new(<Autodiff<Mlx, NoCheckpointing> as AutodiffBackend>::from_inner(inner))
    } else {
        Box::new(<Autodiff<Mlx, BalancedCheckpointing> as AutodiffBackend>::from_inner(inner))
    };
    let primitive = *boxed
        .downcast::<burn_backend::tensor::FloatTensor<B>>()
        .unwrap_or_else(|_| unreachable!("B is Autodiff<Mlx>"));
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

/// `x · Wᵀ` with MLX's packed `W` as one differentiable op (the gradient flows to `x` only; the
/// weights are constants): on `Autodiff<Mlx>` the forward pass is MLX's quantized matmul and
/// the backward pass MLX's own vector-Jacobian product of it (a quantized matmul with the
/// transposed weight), so the base of a LoRA model stays quantized while adapters train.
#[derive(Debug)]
struct QuantizedMatmulOp {
    /// Words, scales and biases.
    packed: [Array; 3],
    group_size: i32,
    bits: i32,
    /// MLX's CPU with more than [`CPU_QMM_MAX_ROWS`] rows: dequantize and use BLAS.
    dequantize: bool,
}

// SAFETY: MLX arrays are reference-counted handles to immutable data; the op only reads them,
// as every other fused op does with its side inputs.
unsafe impl Send for QuantizedMatmulOp {}
unsafe impl Sync for QuantizedMatmulOp {}

impl crate::nn::custom::FusedOp for QuantizedMatmulOp {
    fn name(&self) -> &'static str {
        "QuantizedMatrix::matmul_t"
    }

    fn key(&self) -> String {
        format!(
            "quantized_matmul gs={} bits={} dequantize={}",
            self.group_size, self.bits, self.dequantize
        )
    }

    fn side_inputs(&self) -> Vec<Array> {
        self.packed.to_vec()
    }

    fn forward(&self, xs: &[Array], side: &[Array]) -> Result<Array, mlx_rs::error::Exception> {
        let (x, w, s, b) = (&xs[0], &side[0], &side[1], &side[2]);
        let compute = s.dtype();
        let y = if self.dequantize {
            let w = ops::dequantize(w, s, b, self.group_size, self.bits)?;
            x.as_dtype(compute)?.matmul(w.t())?
        } else {
            ops::quantized_matmul(
                x.as_dtype(compute)?,
                w,
                s,
                b,
                true,
                self.group_size,
                self.bits,
            )?
        };
        y.as_dtype(x.dtype())
    }
}

/// The MLX tensor under a float `Tensor<B, D>` when `B` is [`Mlx`].
fn mlx_float<B: Backend, const D: usize>(x: Tensor<B, D>, op: &str) -> Result<MlxTensor, MlxError> {
    let x: Tensor<Mlx, D> = same_type(x).ok_or_else(|| not_mlx::<B>(op))?;
    Ok(x.into_primitive().tensor())
}

/// A float `Tensor<B, D>` from an MLX array when `B` is [`Mlx`], or an untracked one when `B`
/// is `Autodiff<Mlx>`.
fn from_mlx<B: Backend, const D: usize>(
    array: Array,
    device: MlxDevice,
    op: &str,
) -> Result<Tensor<B, D>, MlxError> {
    if is_autodiff_mlx::<B>() {
        return Ok(untracked(array, device));
    }
    let t = Tensor::<Mlx, D>::from_primitive(TensorPrimitive::Float(MlxTensor::from_array(
        array, device,
    )));
    same_type(t).ok_or_else(|| not_mlx::<B>(op))
}

fn not_mlx<B: Backend>(op: &str) -> MlxError {
    MlxError::Dtype {
        op: op.into(),
        dtype: std::any::type_name::<B>().into(),
        hint: "MLX's packed form is only held for the Mlx backend".into(),
    }
}

/// Wraps an MLX failure of `op` on `inputs`.
fn mlx_err(op: &str, inputs: &[&Array]) -> impl FnOnce(mlx_rs::error::Exception) -> MlxError {
    let context = describe(inputs);
    let op = op.to_string();
    move |e| MlxError::Mlx {
        message: format!("{e} (inputs {context})"),
        op,
    }
}

/// The f32 scale tensor of Burn's quantization, with zero scales read as 0.1 (as Burn does).
fn valid_scales<B: Backend>(amax: Tensor<B, 2>, (a, b): (f32, f32)) -> Tensor<B, 2> {
    let scales = amax.mul_scalar(2.0).div_scalar(b - a);
    let zero = scales.clone().equal_elem(0.0);
    scales.mask_fill(zero, 0.1)
}

/// Burn's symmetric block quantization followed by dequantization, in plain f32 tensor ops
/// (for backends without Burn's quantized tensors): `[out, in]` → `s·q`, `[out, in]`, f32.
fn fake_quantize<B: Backend>(
    weight: Tensor<B, 2>,
    bits: QuantBits,
    group_size: usize,
) -> Tensor<B, 2> {
    let [out, input] = weight.dims();
    let groups = out * input / group_size;
    let range = bits.value().range();
    let x = weight.cast(DType::F32).reshape([groups, group_size]);
    let amax = x.clone().abs().max_dim(1);
    let scales = valid_scales(amax, range);
    let v = x / scales.clone();
    // Round halves away from zero: `|v| − floor(|v|)` is exact in f32, so ties are found exactly.
    let magnitude = v.clone().abs();
    let floor = magnitude.clone().floor();
    let up = (magnitude - floor.clone()).greater_equal_elem(0.5).float();
    let q = ((floor + up) * v.sign()).clamp(range.0, range.1);
    (q * scales).reshape([out, input])
}

impl<B: Backend> QuantizedMatrix<B> {
    /// Quantizes `weight` (`[out, in]`) in groups of `group_size` values along `in`, keeping the
    /// weight's dtype for the results of products and lookups.
    ///
    /// Errors (naming the op and the shape) when `group_size` is not 32, 64 or 128, or when `in`
    /// is not a multiple of it; on [`Mlx`], also when MLX fails.
    pub fn quantize(
        weight: Tensor<B, 2>,
        bits: QuantBits,
        group_size: usize,
    ) -> Result<Self, MlxError> {
        const OP: &str = "QuantizedMatrix::quantize";
        let dims = weight.dims();
        check_matrix(OP, dims, group_size)?;
        let dtype = weight.dtype();
        if is_autodiff_mlx::<B>() {
            let inner = crate::nn::custom::mlx_array::<B>(weight.into_primitive().tensor())
                .expect("B is Autodiff<Mlx>");
            let inner = Tensor::<Mlx, 2>::from_primitive(TensorPrimitive::Float(inner));
            let q = QuantizedMatrix::<Mlx>::quantize(inner, bits, group_size)?;
            let Repr::Mlx(packed) = q.repr else {
                unreachable!("Mlx keeps the packed form")
            };
            return Ok(Self {
                repr: Repr::Mlx(packed),
                dims,
                bits,
                group_size,
                dtype,
            });
        }
        if is_mlx::<B>() {
            let scheme = quant_scheme(bits, group_size)?;
            // Burn's quantization API (burn-mlx's `QTensorOps`), from f32 values.
            let quantized = weight.cast(DType::F32).quantize_dynamic(&scheme);
            Self::from_quantized(quantized, dtype)
        } else {
            let matrix = fake_quantize(weight, bits, group_size).cast(dtype);
            Ok(Self {
                repr: Repr::Dequantized(matrix),
                dims,
                bits,
                group_size,
                dtype,
            })
        }
    }

    /// Takes a matrix Burn has already quantized (`[out, in]`, a quantized tensor whose scheme
    /// is the one [`quant_scheme`] describes, values `Q8S`/`Q8F` or `Q4S`/`Q4F`) and converts
    /// it into MLX's packed form on [`Mlx`]; `dtype` is the dtype of results. On other backends
    /// the matrix is dequantized with Burn's `dequantize`.
    ///
    /// Errors when the tensor is not quantized, its scheme does not map onto MLX's format
    /// (asymmetric, per-tensor, other values, multi-dimensional blocks, a group size other than
    /// 32, 64 or 128), or `in` is not a multiple of the group size.
    pub fn from_quantized(weight: Tensor<B, 2>, dtype: DType) -> Result<Self, MlxError> {
        const OP: &str = "QuantizedMatrix::from_quantized";
        let dims = weight.dims();
        let primitive = weight.into_primitive();
        let scheme = match &primitive {
            TensorPrimitive::QFloat(q) => *burn_backend::QTensorPrimitive::scheme(q),
            TensorPrimitive::Float(_) => {
                return Err(MlxError::Dtype {
                    op: OP.into(),
                    dtype: format!("{dtype:?} (not quantized), shape {dims:?}"),
                    hint: "quantize it first (Tensor::quantize_dynamic), or use \
                           QuantizedMatrix::quantize"
                        .into(),
                })
            }
        };
        let (bits, group_size) = mapped_scheme(&scheme).ok_or_else(|| MlxError::Dtype {
            op: OP.into(),
            dtype: format!("{scheme:?}"),
            hint: "MLX's affine format takes symmetric Q8S, Q8F, Q4S or Q4F values in \
                   one-dimensional blocks of 32, 64 or 128"
                .into(),
        })?;
        check_matrix(OP, dims, group_size)?;
        let weight = Tensor::<B, 2>::from_primitive(primitive);
        if !is_mlx::<B>() {
            return Ok(Self {
                repr: Repr::Dequantized(weight.dequantize().cast(dtype)),
                dims,
                bits,
                group_size,
                dtype,
            });
        }
        let weight: Tensor<Mlx, 2> = same_type(weight).ok_or_else(|| not_mlx::<B>(OP))?;
        let q = match weight.into_primitive() {
            TensorPrimitive::QFloat(q) => q,
            TensorPrimitive::Float(_) => return Err(not_mlx::<B>(OP)),
        };
        let packed = pack(&q, dims, bits, group_size, dtype)?;
        Ok(Self {
            repr: Repr::Mlx(packed),
            dims,
            bits,
            group_size,
            dtype,
        })
    }

    /// `[out, in]`.
    pub fn dims(&self) -> [usize; 2] {
        self.dims
    }

    /// MLX's packed words, scales and biases, when the matrix holds them.
    pub(crate) fn packed_arrays(&self) -> Option<[Array; 3]> {
        match &self.repr {
            Repr::Mlx(p) => Some([
                p.words.array.clone(),
                p.scales.array.clone(),
                p.biases.array.clone(),
            ]),
            Repr::Dequantized(_) => None,
        }
    }

    /// Bits per value.
    pub fn bits(&self) -> QuantBits {
        self.bits
    }

    /// Values per group (and per scale).
    pub fn group_size(&self) -> usize {
        self.group_size
    }

    /// The dtype of results.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Whether the matrix is held in MLX's packed form (the backend is [`Mlx`] or
    /// `Autodiff<Mlx>`).
    pub fn is_mlx_packed(&self) -> bool {
        matches!(self.repr, Repr::Mlx(_))
    }

    /// Bytes the matrix occupies: packed values, scales and biases on [`Mlx`]; the dequantized
    /// matrix elsewhere.
    pub fn bytes(&self) -> usize {
        match &self.repr {
            Repr::Mlx(p) => [&p.words, &p.scales, &p.biases]
                .iter()
                .map(|t| t.array.nbytes())
                .sum(),
            Repr::Dequantized(m) => m.shape().num_elements() * m.dtype().size(),
        }
    }

    /// The dequantized matrix `s·q`, `[out, in]`, in [`dtype`](Self::dtype).
    pub fn dequantize(&self) -> Result<Tensor<B, 2>, MlxError> {
        const OP: &str = "QuantizedMatrix::dequantize";
        match &self.repr {
            Repr::Dequantized(m) => Ok(m.clone()),
            Repr::Mlx(p) => {
                let w = self.dequantized_array(p, OP)?;
                let w = w
                    .as_dtype(crate::dtype::to_mlx(self.dtype))
                    .map_err(mlx_err(OP, &[&w]))?;
                from_mlx(w, p.words.device, OP)
            }
        }
    }

    fn dequantized_array(&self, p: &Packed, op: &str) -> Result<Array, MlxError> {
        let (w, s, b) = (&p.words.array, &p.scales.array, &p.biases.array);
        p.words
            .device
            .scope(|| ops::dequantize(w, s, b, self.group_size as i32, self.bits.bits() as i32))
            .map_err(mlx_err(op, &[w, s, b]))
    }

    /// `x · Wᵀ`: `x` is `[..., in]`, the result `[..., out]` in `x`'s dtype.
    ///
    /// Errors (naming the shapes) when `x`'s last dimension is not `in`.
    pub fn matmul_t<const D: usize>(&self, x: Tensor<B, D>) -> Result<Tensor<B, D>, MlxError> {
        const OP: &str = "QuantizedMatrix::matmul_t";
        let dims = x.dims();
        let [out, input] = self.dims;
        if D == 0 || dims[D - 1] != input {
            return Err(MlxError::Shape {
                op: OP.into(),
                shapes: format!("x {dims:?} against weight [out, in] = [{out}, {input}]"),
            });
        }
        let p = match &self.repr {
            Repr::Dequantized(m) => {
                let m = m.clone().cast(x.dtype());
                let rows = dims[..D - 1].iter().product::<usize>();
                let y = x.reshape([rows, input]).matmul(m.transpose());
                let mut out_dims = dims;
                out_dims[D - 1] = out;
                return Ok(y.reshape(out_dims));
            }
            Repr::Mlx(p) => p,
        };
        if is_autodiff_mlx::<B>() {
            let rows = dims[..D - 1].iter().product::<usize>();
            let op = std::sync::Arc::new(QuantizedMatmulOp {
                packed: [
                    p.words.array.clone(),
                    p.scales.array.clone(),
                    p.biases.array.clone(),
                ],
                group_size: self.group_size as i32,
                bits: self.bits.bits() as i32,
                dequantize: p.words.device == MlxDevice::Cpu && rows > CPU_QMM_MAX_ROWS,
            });
            let out = crate::nn::custom::apply_anywhere::<B>(op, vec![x.into_primitive().tensor()])
                .unwrap_or_else(|_| unreachable!("B is Autodiff<Mlx> on an MLX device"));
            return Ok(Tensor::from_primitive(TensorPrimitive::Float(out)));
        }
        let x = mlx_float(x, OP)?;
        let a = &x.array;
        let dtype = a.dtype();
        let rows = a.size() / input.max(1);
        let (words, scales, biases) = (&p.words.array, &p.scales.array, &p.biases.array);
        let device = p.words.device;
        let y = device
            .scope(|| {
                let compute = scales.dtype();
                if device == MlxDevice::Cpu && rows > CPU_QMM_MAX_ROWS {
                    let w = ops::dequantize(
                        words,
                        scales,
                        biases,
                        self.group_size as i32,
                        self.bits.bits() as i32,
                    )?;
                    a.as_dtype(compute)?.matmul(w.t())?.as_dtype(dtype)
                } else {
                    ops::quantized_matmul(
                        a.as_dtype(compute)?,
                        words,
                        scales,
                        biases,
                        true,
                        self.group_size as i32,
                        self.bits.bits() as i32,
                    )?
                    .as_dtype(dtype)
                }
            })
            .map_err(mlx_err(OP, &[a, words, scales, biases]))?;
        from_mlx(y, device, OP)
    }

    /// Rows of `W` (an embedding lookup): `ids` `[batch, seq]` → `[batch, seq, in]`, in
    /// [`dtype`](Self::dtype). Ids must be below `out`.
    pub fn rows(&self, ids: Tensor<B, 2, Int>) -> Result<Tensor<B, 3>, MlxError> {
        const OP: &str = "QuantizedMatrix::rows";
        let [batch, seq] = ids.dims();
        let input = self.dims[1];
        let p = match &self.repr {
            Repr::Dequantized(m) => return Ok(burn_tensor::module::embedding(m.clone(), ids)),
            Repr::Mlx(p) => p,
        };
        // The Int primitive of `Mlx` and of `Autodiff<Mlx>` alike.
        let boxed: Box<dyn Any> = Box::new(ids.into_primitive());
        let ids = *boxed
            .downcast::<MlxTensor>()
            .map_err(|_| not_mlx::<B>(OP))?;
        let (words, scales, biases) = (&p.words.array, &p.scales.array, &p.biases.array);
        let device = p.words.device;
        let target = crate::dtype::to_mlx(self.dtype);
        let shape = [batch as i32, seq as i32, input as i32];
        let y = device
            .scope(|| {
                let flat = ids.array.reshape(&[-1])?;
                ops::dequantize(
                    words.take_axis(&flat, 0)?,
                    scales.take_axis(&flat, 0)?,
                    &biases.take_axis(&flat, 0)?,
                    self.group_size as i32,
                    self.bits.bits() as i32,
                )?
                .as_dtype(target)?
                .reshape(&shape)
            })
            .map_err(mlx_err(OP, &[&ids.array, words, scales, biases]))?;
        from_mlx(y, device, OP)
    }
}

/// `(bits, group size)` of a Burn scheme that maps onto MLX's affine format.
fn mapped_scheme(scheme: &QuantScheme) -> Option<(QuantBits, usize)> {
    let bits = match scheme.value {
        QuantValue::Q8S | QuantValue::Q8F => QuantBits::Q8,
        QuantValue::Q4S | QuantValue::Q4F => QuantBits::Q4,
        _ => return None,
    };
    if scheme.mode != QuantMode::Symmetric {
        return None;
    }
    let block = match scheme.level {
        QuantLevel::Block(block) => block,
        QuantLevel::Tensor => return None,
    };
    // One-dimensional blocks (leading ones are no dimension).
    let sizes: Vec<usize> = block
        .as_slice()
        .iter()
        .map(|&s| s as usize)
        .skip_while(|&s| s == 1)
        .collect();
    match sizes.as_slice() {
        [g] if matches!(g, 32 | 64 | 128) => Some((bits, *g)),
        _ => None,
    }
}

/// Converts burn-mlx's quantized tensor (i8 values in the logical shape, f32 block scales) into
/// MLX's packed affine form, and computes it.
fn pack(
    q: &MlxTensor,
    [out, input]: [usize; 2],
    bits: QuantBits,
    group_size: usize,
    dtype: DType,
) -> Result<Packed, MlxError> {
    const OP: &str = "QuantizedMatrix::from_quantized";
    let params = match &q.quant {
        Some(p) if !p.per_element => p.clone(),
        _ => {
            return Err(MlxError::Shape {
                op: OP.into(),
                shapes: format!(
                    "{:?}: the values were moved out of their blocks by a layout op (transpose, \
                     slice, ...); quantize the `[out, in]` matrix itself",
                    q.array.shape()
                ),
            })
        }
    };
    let device = q.device;
    let nbits = bits.bits();
    let per_word = 32 / nbits;
    let offset = 1i32 << (nbits - 1);
    // On the CPU, scales stay f32 (see the module docs); on the GPU they take the weight's dtype.
    let scale_dtype = if device == MlxDevice::Cpu {
        Dtype::Float32
    } else {
        crate::dtype::to_mlx(dtype)
    };
    let (values, raw_scales) = (&q.array, &params.scales);
    let (o, i, g, w) = (out as i32, input as i32, group_size as i32, per_word as i32);
    let (words, scales, biases) = device
        .scope(|| {
            let unsigned = values
                .as_dtype(Dtype::Int32)?
                .add(Array::from_int(offset))?
                .as_dtype(Dtype::Uint32)?
                .reshape(&[o, i / w, w])?;
            let shifts: Vec<u32> = (0..per_word).map(|k| 1u32 << (k * nbits)).collect();
            let shifts = Array::from_slice(&shifts, &[w]);
            let words = unsigned
                .multiply(&shifts)?
                .sum_axis(-1, false)?
                .as_dtype(Dtype::Uint32)?;
            let scales = raw_scales.as_dtype(Dtype::Float32)?;
            let zero = scales.eq(Array::from_f32(0.0))?;
            let scales = ops::select(&zero, Array::from_f32(0.1), &scales)?.reshape(&[o, i / g])?;
            let biases = scales.multiply(Array::from_f32(-(offset as f32)))?;
            let scales = scales.as_dtype(scale_dtype)?;
            let biases = biases.as_dtype(scale_dtype)?;
            Ok::<_, mlx_rs::error::Exception>((words, scales, biases))
        })
        .map_err(mlx_err(OP, &[values, raw_scales]))?;
    {
        // Packing evaluates; inside a traced function (compile, export) that must be an error,
        // not a second lock of the evaluation lock the trace holds.
        crate::trace::check_not_tracing(OP)?;
        let _guard = crate::tensor::eval_lock();
        mlx_rs::transforms::eval([&words, &scales, &biases])
            .map_err(mlx_err(OP, &[values, raw_scales]))?;
        device.after_eval();
    }
    Ok(Packed {
        words: MlxTensor::from_array(words, device),
        scales: MlxTensor::from_array(scales, device),
        biases: MlxTensor::from_array(biases, device),
    })
}
