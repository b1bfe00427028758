//! Between backend-generic Burn code and [`MlxTensor`]: [`to_mlx`] and [`from_mlx`].
//!
//! A model written for any backend `B` sometimes needs MLX itself when `B` is [`Mlx`]: a fused
//! kernel ([`crate::fast`]), a compiled step ([`crate::compile`](mod@crate::compile)), a look at the pending graph
//! ([`crate::pending_primitives`]). These two functions cross over without `unsafe` and without
//! naming the primitive types: they succeed exactly when `B` is `Mlx`.

use crate::backend::Mlx;
use crate::tensor::MlxTensor;
use burn_tensor::backend::Backend;
use burn_tensor::{BasicOps, Tensor, TensorKind, TensorPrimitive};
use std::any::{Any, TypeId};

/// The MLX tensor behind `tensor` (float, quantized, int or bool) when `B` is [`Mlx`];
/// otherwise `tensor`, unchanged.
///
/// A quantized float tensor comes out with its quantization (the packed values and their
/// parameters).
pub fn to_mlx<B: Backend, const D: usize, K: TensorKind<B> + BasicOps<B>>(
    tensor: Tensor<B, D, K>,
) -> Result<MlxTensor, Tensor<B, D, K>>
where
    K::Primitive: 'static,
{
    let boxed: Box<dyn Any> = Box::new(tensor.into_primitive());
    let boxed = match boxed.downcast::<MlxTensor>() {
        Ok(t) => return Ok(*t),
        Err(other) => other,
    };
    match boxed.downcast::<TensorPrimitive<Mlx>>() {
        Ok(p) => match *p {
            TensorPrimitive::Float(t) | TensorPrimitive::QFloat(t) => Ok(t),
        },
        Err(other) => Err(Tensor::from_primitive(
            *other
                .downcast::<K::Primitive>()
                .expect("a failed downcast gives the value back"),
        )),
    }
}

/// A tensor of backend `B` and kind `K` holding `tensor`, when `B` is [`Mlx`] (`None`
/// otherwise). For a float kind, a quantized `tensor` becomes a quantized Burn tensor.
///
/// The caller keeps the rank and kind right: `D` must be `tensor`'s rank, and `K` a kind that
/// fits its dtype, as with [`Tensor::from_primitive`].
pub fn from_mlx<B: Backend, const D: usize, K: TensorKind<B> + BasicOps<B>>(
    tensor: MlxTensor,
) -> Option<Tensor<B, D, K>>
where
    K::Primitive: 'static,
{
    let boxed: Box<dyn Any> = if TypeId::of::<K::Primitive>() == TypeId::of::<MlxTensor>() {
        // Int and bool tensors: the MLX tensor is the primitive.
        Box::new(tensor)
    } else if tensor.quant.is_some() {
        Box::new(TensorPrimitive::<Mlx>::QFloat(tensor))
    } else {
        Box::new(TensorPrimitive::<Mlx>::Float(tensor))
    };
    let primitive = *boxed.downcast::<K::Primitive>().ok()?;
    Some(Tensor::from_primitive(primitive))
}
