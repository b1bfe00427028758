//! The loss and every parameter's gradient, through MLX's `value_and_grad`.

use super::params::{tensor, Arrays, Register, Replace};
use crate::backend::Mlx;
use crate::device::MlxDevice;
use crate::error::MlxError;
use crate::interop::to_mlx;
use burn_core::module::Module;
use burn_optim::GradientsParams;
use burn_tensor::Tensor;
use mlx_rs::Array;
use std::cell::RefCell;

/// The loss of `model` and the gradient of every float parameter of it, registered under the
/// parameter's id as Burn's [`GradientsParams`], computed by MLX's reverse-mode autodiff over
/// the graph that `loss` builds (see the [module docs](super)).
///
/// `loss` is called once, on a copy of `model` whose parameters MLX traces; it must return
/// one value (shape `[1]`, as Burn's losses and `.mean()` do). The loss is returned lazy, like
/// the gradients.
///
/// # Errors
///
/// [`MlxError::Shape`] when the loss holds more than one value, [`MlxError::Mlx`] when
/// `model` has no float parameter or MLX cannot differentiate the graph (its message names the
/// primitive). A panic inside `loss` is resumed as a panic.
pub fn value_and_grad<M: Module<Mlx>>(
    model: &M,
    loss: impl Fn(&M) -> Tensor<Mlx, 1>,
) -> Result<(Tensor<Mlx, 1>, GradientsParams), MlxError> {
    let (value, grads, device) = loss_and_grads(model, &loss)?;
    let mut register = Register {
        grads: &grads,
        next: 0,
        device,
        out: GradientsParams::new(),
    };
    model.visit(&mut register);
    Ok((tensor(value, device), register.out))
}

/// The loss's array, the gradients' arrays (visiting order) and the parameters' device.
pub(crate) fn loss_and_grads<M: Module<Mlx>>(
    model: &M,
    loss: &dyn Fn(&M) -> Tensor<Mlx, 1>,
) -> Result<(Array, Vec<Array>, MlxDevice), MlxError> {
    const OP: &str = "value_and_grad";
    let mut params = Arrays::default();
    model.visit(&mut params);
    let Some(device) = params.device else {
        return Err(MlxError::Mlx {
            op: OP.into(),
            message: "the model has no float parameter to differentiate".into(),
        });
    };
    let shape: RefCell<Option<Vec<i32>>> = RefCell::new(None);
    let f = |xs: &[Array]| {
        let traced = model.clone().map(&mut Replace {
            arrays: xs,
            next: 0,
            device,
        });
        let value = to_mlx(loss(&traced)).unwrap_or_else(|_| unreachable!("a float tensor"));
        let value = value.array();
        *shape.borrow_mut() = Some(value.shape().to_vec());
        // MLX differentiates a scalar: Burn's one-value `[1]` loss is handed over as one.
        match value.reshape(&[]) {
            Ok(scalar) if value.size() == 1 => vec![scalar],
            _ => vec![value.clone()],
        }
    };
    let argnums: Vec<i32> = (0..params.arrays.len() as i32).collect();
    let result = {
        let mut value_and_grad = mlx_rs::transforms::value_and_grad_with_argnums(f, &argnums[..]);
        device.scope(|| value_and_grad(&params.arrays))
    };
    match result {
        Ok((values, grads)) => {
            let value = values[0].reshape(&[1]).map_err(|e| MlxError::Mlx {
                op: OP.into(),
                message: e.what().to_string(),
            })?;
            Ok((value, grads, device))
        }
        Err(e) => match shape.take() {
            Some(s) if s.iter().product::<i32>() != 1 => Err(MlxError::Shape {
                op: OP.into(),
                shapes: format!(
                    "loss {s:?}: the loss must hold one value (reduce it with `.mean()` or \
                     `.sum()`)"
                ),
            }),
            _ => Err(MlxError::Mlx {
                op: OP.into(),
                message: e.what().to_string(),
            }),
        },
    }
}
