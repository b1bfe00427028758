//! Tensors made from nothing or from another dtype or device: constants, casts, device moves
//! and random tensors (keyed from the process-wide random state in [`crate::rng`]).

use super::{unary, MlxResult};
use crate::device::MlxDevice;
use crate::dtype::is_float;
use crate::rng::next_key;
use crate::tensor::MlxTensor;
use crate::tensor::{scalar_array, to_i32_shape, OrPanic};
use burn_backend::{Distribution, Scalar, Shape};
use mlx_rs::{ops, random, Array, Dtype};

/// Casts to `dtype` (no-op when it already has it).
pub(crate) fn cast(t: MlxTensor, dtype: Dtype) -> MlxTensor {
    if t.array.dtype() == dtype {
        return t;
    }
    unary(t, "cast", |a| a.as_dtype(dtype))
}

/// Casts an array (no-op when it already has the dtype).
pub(crate) fn cast_array(a: Array, dtype: Dtype) -> MlxResult {
    if a.dtype() == dtype {
        Ok(a)
    } else {
        a.as_dtype(dtype)
    }
}

/// A tensor of `shape` filled with `value`.
pub(crate) fn full(shape: &Shape, value: Scalar, dtype: Dtype, device: &MlxDevice) -> MlxTensor {
    let dims = to_i32_shape(shape.as_slice(), "full").unwrap_or_else(|e| panic!("{e}"));
    let v = scalar_array(value, dtype);
    let out = device
        .scope(|| ops::broadcast_to(&v, &dims))
        .or_panic("full", &[]);
    MlxTensor::from_array(out, *device)
}

/// A tensor of zeros.
pub(crate) fn zeros(shape: &Shape, dtype: Dtype, device: &MlxDevice) -> MlxTensor {
    let dims = to_i32_shape(shape.as_slice(), "zeros").unwrap_or_else(|e| panic!("{e}"));
    let out = device
        .scope(|| ops::zeros_dtype(&dims, dtype))
        .or_panic("zeros", &[]);
    MlxTensor::from_array(out, *device)
}

/// Moves a tensor to another device. MLX arrays live in unified memory: only the stream used by
/// later ops changes.
pub(crate) fn to_device(t: MlxTensor, device: &MlxDevice) -> MlxTensor {
    if let Err(e) = device.check() {
        panic!("burn-mlx: `to_device` failed: {e}");
    }
    if t.array.dtype() == Dtype::Float64 && *device == MlxDevice::Gpu {
        panic!(
            "burn-mlx: `to_device`: {}",
            crate::tensor::f64_on_gpu("to_device")
        );
    }
    MlxTensor {
        device: *device,
        ..t
    }
}

/// Random values of `dtype` drawn from Burn's `distribution`.
pub(crate) fn random(
    shape: &Shape,
    distribution: Distribution,
    dtype: Dtype,
    device: &MlxDevice,
) -> MlxTensor {
    let dims = to_i32_shape(shape.as_slice(), "random").unwrap_or_else(|e| panic!("{e}"));
    let key = next_key();
    let out = device
        .scope(|| -> MlxResult {
            let values = match distribution {
                Distribution::Default => {
                    random::uniform::<_, f32>(0.0f32, 1.0f32, &dims[..], Some(&key))?
                }
                Distribution::Uniform(low, high) => {
                    if is_float(dtype) {
                        random::uniform::<_, f32>(low as f32, high as f32, &dims[..], Some(&key))?
                    } else {
                        // Integers: uniform over [low, high), as Burn draws them.
                        let u = random::uniform::<_, f32>(0.0f32, 1.0f32, &dims[..], Some(&key))?;
                        let span = Array::from_f32((high - low) as f32);
                        let v = u.multiply(&span)?.floor()?;
                        let v = v.add(Array::from_f32(low as f32))?;
                        ops::minimum(&v, Array::from_f32((high - 1.0).max(low) as f32))?
                    }
                }
                Distribution::Bernoulli(p) => {
                    let u = random::uniform::<_, f32>(0.0f32, 1.0f32, &dims[..], Some(&key))?;
                    u.lt(Array::from_f32(p as f32))?
                }
                Distribution::Normal(mean, std) => {
                    random::normal::<f32>(&dims[..], mean as f32, std as f32, Some(&key))?
                }
            };
            cast_array(values, dtype)
        })
        .or_panic("random", &[]);
    MlxTensor::from_array(out, *device)
}
