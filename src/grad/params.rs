//! A module's float parameters as MLX arrays, and back.

use crate::backend::Mlx;
use crate::device::MlxDevice;
use crate::interop::{from_mlx, to_mlx};
use crate::tensor::MlxTensor;
use burn_core::module::{ModuleMapper, ModuleVisitor, Param, ParamId};
use burn_optim::GradientsParams;
use burn_tensor::Tensor;
use mlx_rs::Array;

/// The MLX arrays behind a module's float parameters, in visiting order, and the device of the
/// first.
#[derive(Default)]
pub(crate) struct Arrays {
    pub(crate) arrays: Vec<Array>,
    pub(crate) device: Option<MlxDevice>,
}

impl ModuleVisitor<Mlx> for Arrays {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Mlx, D>>) {
        let t = to_mlx(param.val()).unwrap_or_else(|_| unreachable!("a float tensor of Mlx"));
        self.device.get_or_insert(t.device);
        self.arrays.push(t.array().clone());
    }
}

/// Wraps an array as a float tensor of rank `D` on `device`.
pub(crate) fn tensor<const D: usize>(array: Array, device: MlxDevice) -> Tensor<Mlx, D> {
    from_mlx(MlxTensor::from_array(array, device))
        .unwrap_or_else(|| unreachable!("an MlxTensor is an Mlx float tensor"))
}

/// Puts `arrays` in place of a module's float parameters, in visiting order (ids kept).
pub(crate) struct Replace<'a> {
    pub(crate) arrays: &'a [Array],
    pub(crate) next: usize,
    pub(crate) device: MlxDevice,
}

impl ModuleMapper<Mlx> for Replace<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<Mlx, D>>) -> Param<Tensor<Mlx, D>> {
        let (id, _, mapper) = param.consume();
        let t = tensor(self.arrays[self.next].clone(), self.device);
        self.next += 1;
        Param::from_mapped_value(id, t, mapper)
    }
}

/// Registers `grads` (visiting order) under their parameters' ids.
pub(crate) struct Register<'a> {
    pub(crate) grads: &'a [Array],
    pub(crate) next: usize,
    pub(crate) device: MlxDevice,
    pub(crate) out: GradientsParams,
}

impl ModuleVisitor<Mlx> for Register<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Mlx, D>>) {
        let id: ParamId = param.id;
        let g = tensor::<D>(self.grads[self.next].clone(), self.device);
        self.next += 1;
        self.out.register(id, g);
    }
}
