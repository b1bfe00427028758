//! Burn's `QTensorOps` on MLX: symmetric quantization, per tensor or per block.
//!
//! A quantized tensor is an [`MlxTensor`] whose array holds the quantized values as `i8` in the
//! tensor's logical shape, and whose `quant` holds Burn's [`QuantScheme`] and the f32 scales
//! (see [`QuantParams`]). The arithmetic follows burn-ndarray bit for bit:
//! `q = clamp(round(x / scale), a, b)` with `round` rounding halves away from zero and `[a, b]`
//! the range of the scheme's value type, and `x = scale * q`, in f32. A zero scale (a block of
//! zeros) is read as 0.1, as burn-ndarray does.
//!
//! Blocks are consecutive runs of `block_size.num_elements()` values in the row-major order of
//! the tensor's logical shape, as Burn's `compute_range` and burn-ndarray define them. Layout ops
//! that keep that order (reshape) keep the block scales. Ops that move values between blocks
//! (permute, slice, select, flip, expand, gather) carry a per-element scale array through the
//! same op, so the values stay exact; `q_into_data` turns it back into one scale per block (and
//! requantizes a block only when its values came from blocks with different scales).
//!
//! Supported: symmetric mode, per-tensor and per-block levels, the integer values Q8F, Q8S, Q4F,
//! Q4S, Q2F and Q2S (held as `i8`), stored natively or packed in u32 along the innermost
//! dimension (`QuantStore::PackedU32(0)`, used by `q_into_data`'s byte layout). The float8/float4
//! values (E4M3, E5M2, E2M1) and `QuantStore::PackedNative` panic with a message naming the
//! scheme. See [`supports_scheme`].

use super::base;
use crate::backend::Mlx;
use crate::device::MlxDevice;
use crate::dtype::float_mlx;
use crate::tensor::MlxTensor;
use crate::tensor::{to_i32_shape, OrPanic, QuantParams};
use burn_backend::ops::QTensorOps;
use burn_backend::quantization::{
    QuantLevel, QuantMode, QuantScheme, QuantStore, QuantValue, QuantizationParametersPrimitive,
    QuantizedBytes,
};
use burn_backend::tensor::{FloatTensor, IntTensor, QuantizedTensor};
use burn_backend::{Bytes, DType, ExecutionError, FloatDType, Shape, Slice, TensorData};
use mlx_rs::{ops, Array, Dtype};
use std::sync::Arc;

/// Whether burn-mlx can quantize to, hold and read back tensors of `scheme`.
///
/// True for symmetric per-tensor or per-block schemes with Q8F, Q8S, Q4F, Q4S, Q2F or Q2S values,
/// stored natively or packed in u32 on the innermost dimension, with any scale precision (scales
/// are held as f32, as in burn-ndarray). `Backend::dtype_usage` reports these schemes.
pub(crate) fn supports_scheme(scheme: &QuantScheme) -> bool {
    matches!(
        scheme,
        QuantScheme {
            mode: QuantMode::Symmetric,
            value: QuantValue::Q8F
                | QuantValue::Q8S
                | QuantValue::Q4F
                | QuantValue::Q4S
                | QuantValue::Q2F
                | QuantValue::Q2S,
            store: QuantStore::Native | QuantStore::PackedU32(0),
            ..
        }
    )
}

/// Panics, naming `op` and the scheme, when burn-mlx does not support `scheme`.
fn check_scheme(scheme: &QuantScheme, op: &str) {
    if !supports_scheme(scheme) {
        panic!(
            "burn-mlx: `{op}` does not support the quantization scheme {scheme:?}: burn-mlx \
             supports symmetric per-tensor and per-block quantization with Q8F, Q8S, Q4F, Q4S, \
             Q2F or Q2S values, stored natively (QuantStore::Native) or packed in u32 on the \
             innermost dimension (QuantStore::PackedU32(0))"
        );
    }
}

/// The quantization parameters of a quantized tensor; panics (naming `op`) on a float tensor.
fn params<'a>(tensor: &'a MlxTensor, op: &str) -> &'a Arc<QuantParams> {
    match &tensor.quant {
        Some(q) => q,
        None => panic!(
            "burn-mlx: `{op}` expects a quantized tensor, got a {:?} tensor of shape {:?}",
            tensor.array.dtype(),
            tensor.array.shape()
        ),
    }
}

/// The quantized values as a plain (non-quantized) `i8` tensor.
fn values_of(tensor: &MlxTensor) -> MlxTensor {
    tensor.with(tensor.array.clone())
}

/// Elements per block, for block-level schemes.
fn block_elems(scheme: &QuantScheme) -> Option<usize> {
    match scheme.level {
        QuantLevel::Tensor => None,
        QuantLevel::Block(block_size) => Some(block_size.num_elements()),
    }
}

/// Burn's dimensions as MLX's, panicking with `op` when they do not fit in `i32`.
fn mlx_dims(dims: &[usize], op: &str) -> Vec<i32> {
    to_i32_shape(dims, op).unwrap_or_else(|e| panic!("burn-mlx: {e}"))
}

/// The scales with zeros read as 0.1 (burn-ndarray's `valid_scale`).
fn valid_scales(scales: &Array) -> Result<Array, mlx_rs::error::Exception> {
    let zero = scales.eq(Array::from_f32(0.0))?;
    ops::select(&zero, Array::from_f32(0.1), scales)
}

/// `clamp(round(x / scale), a, b)` in f32, rounding halves away from zero like `f32::round`.
fn quantize_values(
    x: &Array,
    scale: &Array,
    (a, b): (f32, f32),
) -> Result<Array, mlx_rs::error::Exception> {
    let v = x.divide(scale)?;
    let magnitude = v.abs()?;
    let floor = magnitude.floor()?;
    // `magnitude - floor` is exact in f32 (Sterbenz), so ties are detected exactly.
    let round_up = magnitude.subtract(&floor)?.ge(Array::from_f32(0.5))?;
    let rounded = ops::select(&round_up, floor.add(Array::from_f32(1.0))?, &floor)?;
    let signed = rounded.multiply(ops::sign(&v)?)?;
    let clamped = ops::minimum(
        ops::maximum(&signed, Array::from_f32(a))?,
        Array::from_f32(b),
    )?;
    clamped.as_dtype(Dtype::Int8)
}

/// The scale of each value, in the tensor's shape (f32).
fn element_scales(tensor: &MlxTensor, q: &QuantParams, op: &str) -> Array {
    if q.per_element {
        return q.scales.clone();
    }
    let dims = mlx_dims(&tensor.dims(), op);
    let numel = tensor.array.size() as i32;
    let scales = &q.scales;
    let out = tensor.device.scope(|| match block_elems(&q.scheme) {
        None => ops::broadcast_to(scales.reshape(&[])?, &dims),
        Some(block) => {
            let block = block as i32;
            let blocks = numel / block;
            let columns = scales.reshape(&[blocks, 1])?;
            ops::broadcast_to(&columns, &[blocks, block])?.reshape(&dims)
        }
    });
    out.or_panic(op, &[&tensor.array, scales])
}

/// Applies a layout op to a quantized tensor. `keeps_blocks`: the op keeps the row-major order
/// of the values (a reshape), so block scales stay valid; otherwise block-level tensors carry
/// per-element scales through the same op.
fn layout_op(
    tensor: MlxTensor,
    op: &str,
    keeps_blocks: bool,
    f: impl Fn(MlxTensor) -> MlxTensor,
) -> MlxTensor {
    let q = params(&tensor, op).clone();
    let values = f(values_of(&tensor));
    let quant = match q.scheme.level {
        QuantLevel::Tensor => q,
        QuantLevel::Block(_) if keeps_blocks && !q.per_element => q,
        QuantLevel::Block(_) => {
            let scales = element_scales(&tensor, &q, op);
            let scales = f(tensor.with(scales)).array;
            Arc::new(QuantParams {
                scheme: q.scheme,
                scales,
                per_element: true,
            })
        }
    };
    MlxTensor {
        quant: Some(quant),
        ..values
    }
}

/// Reads an array's values (evaluating it) as `E`.
fn read<E: burn_backend::Element>(
    array: Array,
    device: MlxDevice,
) -> Result<Vec<E>, ExecutionError> {
    let data = MlxTensor::from_array(array, device).to_data()?;
    data.into_vec::<E>()
        .map_err(|e| ExecutionError::WithContext {
            reason: format!("burn-mlx: `q_into_data` could not read the values: {e:?}"),
        })
}

/// One scale per block from per-element scales; a block whose values carry different scales
/// (they came from different blocks) is requantized with Burn's min-max formula.
fn block_scales_from_elements(
    values: &mut [i8],
    elem_scales: &[f32],
    block: usize,
    (a, b): (f32, f32),
) -> Vec<f32> {
    let valid = |s: f32| if s == 0.0 { 0.1 } else { s };
    values
        .chunks_mut(block)
        .zip(elem_scales.chunks(block))
        .map(|(vals, scales)| {
            let first = scales[0];
            if scales.iter().all(|s| s.to_bits() == first.to_bits()) {
                return first;
            }
            let floats: Vec<f32> = vals
                .iter()
                .zip(scales)
                .map(|(&v, &s)| valid(s) * v as f32)
                .collect();
            let alpha = floats.iter().fold(0f32, |m, x| m.max(x.abs()));
            let scale = (alpha * 2.0) / (b - a);
            let s = valid(scale);
            for (v, x) in vals.iter_mut().zip(&floats) {
                *v = (x / s).round().clamp(a, b) as i8;
            }
            scale
        })
        .collect()
}

/// Packs i8 values of `bits` bits each into u32 words, lowest bits first (the layout Burn's
/// `QuantizedBytes` unpacks).
fn pack_u32(values: &[i8], bits: usize) -> Vec<u32> {
    let per_word = 32 / bits;
    let mask = (1u32 << bits) - 1;
    values
        .chunks(per_word)
        .map(|chunk| {
            chunk.iter().enumerate().fold(0u32, |word, (i, &v)| {
                word | ((v as u8 as u32 & mask) << (i * bits))
            })
        })
        .collect()
}

/// Evaluates a quantized tensor into Burn's layout: the values, then the f32 scales.
fn q_to_data(tensor: MlxTensor) -> Result<TensorData, ExecutionError> {
    let q = params(&tensor, "q_into_data").clone();
    let scheme = q.scheme;
    check_scheme(&scheme, "q_into_data");
    let dims = tensor.dims();
    let values_array = if tensor.array.dtype() == Dtype::Int8 {
        tensor.array.clone()
    } else {
        tensor
            .array
            .as_dtype(Dtype::Int8)
            .or_panic("q_into_data", &[&tensor.array])
    };
    let mut values = read::<i8>(values_array, tensor.device)?;
    let scales_f32 = q
        .scales
        .as_dtype(Dtype::Float32)
        .or_panic("q_into_data", &[&q.scales]);
    let scales = read::<f32>(scales_f32, tensor.device)?;
    let scales = match block_elems(&scheme) {
        Some(block) if q.per_element => {
            if !values.len().is_multiple_of(block) {
                return Err(ExecutionError::WithContext {
                    reason: format!(
                        "burn-mlx: `q_into_data`: a tensor of shape {dims:?} cannot be split into \
                         blocks of {block} values ({scheme:?})"
                    ),
                });
            }
            block_scales_from_elements(&mut values, &scales, block, scheme.value.range())
        }
        _ => scales,
    };
    let packed_bits = match (scheme.store, scheme.value) {
        (QuantStore::PackedU32(_), QuantValue::Q4F | QuantValue::Q4S) => Some(4),
        (QuantStore::PackedU32(_), QuantValue::Q2F | QuantValue::Q2S) => Some(2),
        _ => None,
    };
    Ok(match packed_bits {
        None => TensorData::quantized(values, dims, scheme, &scales),
        Some(bits) => {
            let mut words = pack_u32(&values, bits);
            words.extend(scales.iter().map(|s| s.to_bits()));
            TensorData::from_bytes(Bytes::from_elems(words), dims, DType::QFloat(scheme))
        }
    })
}

impl QTensorOps<Self> for Mlx {
    fn q_from_data(data: TensorData, device: &MlxDevice) -> QuantizedTensor<Self> {
        let scheme = match data.dtype {
            DType::QFloat(scheme) => scheme,
            other => panic!(
                "burn-mlx: `q_from_data` expects quantized data (DType::QFloat), got {other:?}"
            ),
        };
        check_scheme(&scheme, "q_from_data");
        if let Err(e) = device.check() {
            panic!("burn-mlx: `q_from_data` failed: {e}");
        }
        let dims = data.shape.as_slice().to_vec();
        let shape = mlx_dims(&dims, "q_from_data");
        let num_elements = data.num_elements();
        let (values, qparams) = QuantizedBytes {
            bytes: data.into_bytes(),
            scheme,
            num_elements,
        }
        .into_vec_i8();
        let array = if values.is_empty() {
            device
                .scope(|| ops::zeros_dtype(&shape, Dtype::Int8))
                .or_panic("q_from_data", &[])
        } else {
            Array::from_slice(&values, &shape)
        };
        let scales = Array::from_slice(&qparams.scales, &[qparams.scales.len() as i32]);
        MlxTensor {
            array,
            device: *device,
            quant: Some(Arc::new(QuantParams {
                // The values are held unpacked either way; keeping the store makes `q_into_data`
                // give back the same layout (burn-ndarray switches to `Native` here, which only
                // matters for strict dtype comparisons when the store was `PackedU32`).
                scheme,
                scales,
                per_element: false,
            })),
            elem: std::marker::PhantomData,
        }
    }

    fn quantize(
        tensor: FloatTensor<Self>,
        scheme: &QuantScheme,
        qparams: QuantizationParametersPrimitive<Self>,
    ) -> QuantizedTensor<Self> {
        const OP: &str = "quantize";
        check_scheme(scheme, OP);
        let dims = tensor.dims();
        let shape = mlx_dims(&dims, OP);
        let numel = tensor.array.size();
        let scales_in = &qparams.scales.array;
        let num_scales = scales_in.size();
        let expected = match block_elems(scheme) {
            None => 1,
            Some(block) => {
                if !numel.is_multiple_of(block) {
                    panic!(
                        "burn-mlx: `{OP}`: a tensor of shape {dims:?} cannot be split into blocks \
                         of {block} values ({scheme:?})"
                    );
                }
                numel / block
            }
        };
        if num_scales != expected {
            panic!(
                "burn-mlx: `{OP}`: {scheme:?} on a tensor of shape {dims:?} needs {expected} \
                 scale(s), got a scales tensor of shape {:?}",
                scales_in.shape()
            );
        }
        let x = &tensor.array;
        let (values, scales) = tensor
            .device
            .scope(|| {
                let x = x.as_dtype(Dtype::Float32)?;
                let scales = scales_in
                    .as_dtype(Dtype::Float32)?
                    .reshape(&[expected as i32])?;
                let range = scheme.value.range();
                let values = match block_elems(scheme) {
                    None => quantize_values(&x, &valid_scales(&scales.reshape(&[])?)?, range)?,
                    Some(block) => {
                        let blocks = x.reshape(&[expected as i32, block as i32])?;
                        let s = valid_scales(&scales.reshape(&[expected as i32, 1])?)?;
                        quantize_values(&blocks, &s, range)?.reshape(&shape)?
                    }
                };
                Ok::<_, mlx_rs::error::Exception>((values, scales))
            })
            .or_panic(OP, &[x, scales_in]);
        MlxTensor {
            array: values,
            device: tensor.device,
            quant: Some(Arc::new(QuantParams {
                scheme: *scheme,
                scales,
                per_element: false,
            })),
            elem: std::marker::PhantomData,
        }
    }

    fn dequantize(tensor: QuantizedTensor<Self>, dtype: FloatDType) -> FloatTensor<Self> {
        const OP: &str = "dequantize";
        let q = params(&tensor, OP).clone();
        let dims = tensor.dims();
        let shape = mlx_dims(&dims, OP);
        let values = &tensor.array;
        let out = tensor
            .device
            .scope(|| {
                let x = values.as_dtype(Dtype::Float32)?;
                let scales = valid_scales(&q.scales.as_dtype(Dtype::Float32)?)?;
                let out = match block_elems(&q.scheme) {
                    _ if q.per_element => x.multiply(&scales)?,
                    None => x.multiply(scales.reshape(&[])?)?,
                    Some(block) => {
                        let blocks = scales.size() as i32;
                        x.reshape(&[blocks, block as i32])?
                            .multiply(scales.reshape(&[blocks, 1])?)?
                            .reshape(&shape)?
                    }
                };
                out.as_dtype(float_mlx(dtype))
            })
            .or_panic(OP, &[values, &q.scales]);
        tensor.with(out)
    }

    fn q_device(tensor: &QuantizedTensor<Self>) -> MlxDevice {
        tensor.device
    }

    fn q_to_device(tensor: QuantizedTensor<Self>, device: &MlxDevice) -> QuantizedTensor<Self> {
        if let Err(e) = device.check() {
            panic!("burn-mlx: `q_to_device` failed: {e}");
        }
        MlxTensor {
            device: *device,
            ..tensor
        }
    }

    fn q_reshape(tensor: QuantizedTensor<Self>, shape: Shape) -> QuantizedTensor<Self> {
        layout_op(tensor, "q_reshape", true, |t| {
            base::reshape(t, shape.clone())
        })
    }

    async fn q_into_data(tensor: QuantizedTensor<Self>) -> Result<TensorData, ExecutionError> {
        q_to_data(tensor)
    }

    fn q_expand(tensor: QuantizedTensor<Self>, shape: Shape) -> QuantizedTensor<Self> {
        layout_op(tensor, "q_expand", false, |t| {
            base::expand(t, shape.clone())
        })
    }

    fn q_swap_dims(
        tensor: QuantizedTensor<Self>,
        dim1: usize,
        dim2: usize,
    ) -> QuantizedTensor<Self> {
        layout_op(tensor, "q_swap_dims", false, |t| {
            base::swap_dims(t, dim1, dim2)
        })
    }

    fn q_permute(tensor: QuantizedTensor<Self>, axes: &[usize]) -> QuantizedTensor<Self> {
        layout_op(tensor, "q_permute", false, |t| base::permute(t, axes))
    }

    fn q_flip(tensor: QuantizedTensor<Self>, axes: &[usize]) -> QuantizedTensor<Self> {
        layout_op(tensor, "q_flip", false, |t| base::flip(t, axes))
    }

    fn q_select(
        tensor: QuantizedTensor<Self>,
        dim: usize,
        indices: IntTensor<Self>,
    ) -> QuantizedTensor<Self> {
        layout_op(tensor, "q_select", false, |t| {
            base::select(t, dim, indices.clone())
        })
    }

    fn q_slice(tensor: QuantizedTensor<Self>, slices: &[Slice]) -> QuantizedTensor<Self> {
        layout_op(tensor, "q_slice", false, |t| base::slice(t, slices))
    }

    fn q_gather(
        dim: usize,
        tensor: QuantizedTensor<Self>,
        indices: IntTensor<Self>,
    ) -> QuantizedTensor<Self> {
        // Like burn-ndarray, gather the quantized values themselves (no requantization).
        layout_op(tensor, "q_gather", false, |t| {
            base::gather(dim, t, indices.clone())
        })
    }
}
