//! What a block of recorded ops reads, leaves behind and consumes, from its relative op
//! descriptions (burn-fusion's relative form: tensor ids and scalar positions numbered from the
//! start of the stream segment, so that the same structure gives the same description).

use burn_ir::{OperationIr, TensorId, TensorIr, TensorStatus};
use std::collections::HashSet;

/// The data flow of one block of ops.
#[derive(Debug, Clone, Default)]
pub(crate) struct BlockFlow {
    /// Tensors the block reads that exist before it, in order of first use (relative ids).
    pub inputs: Vec<TensorId>,
    /// Tensors the block creates that are still alive after it (relative ids).
    pub outputs: Vec<TensorId>,
    /// Inputs the block consumes (last use, or dropped): their handles go once it has run.
    pub consumed: Vec<TensorId>,
    /// For each op, the positions of its scalars in the segment's scalar list, in the order they
    /// appear in the op.
    pub scalars: Vec<Vec<u64>>,
    /// Every tensor the block touches (relative ids, in order of first appearance): the relative
    /// form keeps no shapes, so a compiled function is valid only for the shapes these had when
    /// it was recorded.
    pub tensors: Vec<TensorId>,
}

impl BlockFlow {
    /// Follows the tensors through `ops`.
    pub(crate) fn of(ops: &[OperationIr]) -> Self {
        let mut flow = BlockFlow::default();
        let mut created: HashSet<TensorId> = HashSet::new();
        let mut seen_inputs: HashSet<TensorId> = HashSet::new();
        let mut gone: HashSet<TensorId> = HashSet::new();
        let mut touched: HashSet<TensorId> = HashSet::new();
        for op in ops {
            for t in op.nodes() {
                if touched.insert(t.id) {
                    flow.tensors.push(t.id);
                }
            }
            let reads: Vec<&TensorIr> = op.inputs().collect();
            let dropped = matches!(op, OperationIr::Drop(_));
            for t in reads {
                if !created.contains(&t.id) && seen_inputs.insert(t.id) {
                    flow.inputs.push(t.id);
                }
                if dropped || t.status == TensorStatus::ReadWrite {
                    gone.insert(t.id);
                }
            }
            for t in op.outputs() {
                created.insert(t.id);
            }
            flow.scalars.push(scalar_positions(op));
        }
        let mut outputs: Vec<TensorId> = created
            .into_iter()
            .filter(|id| !gone.contains(id))
            .collect();
        outputs.sort_by_key(|id| id.value());
        flow.outputs = outputs;
        flow.consumed = flow
            .inputs
            .iter()
            .copied()
            .filter(|id| gone.contains(id))
            .collect();
        flow
    }
}

/// The scalar positions in a relative op: burn-fusion replaces every `ScalarIr` of an op with
/// `ScalarIr::UInt(position)`, and `ScalarIr` is the only type in burn-ir with a `UInt` variant,
/// so the positions are the numbers in `UInt(..)` in the op's debug form, in field order.
fn scalar_positions(op: &OperationIr) -> Vec<u64> {
    let text = format!("{op:?}");
    let mut positions = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("UInt(") {
        rest = &rest[at + 5..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if rest[digits.len()..].starts_with(')') {
            if let Ok(p) = digits.parse() {
                positions.push(p);
            }
        }
    }
    positions
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_backend::{DType, Shape};
    use burn_ir::{NumericOperationIr, ScalarIr, ScalarOpIr, TensorIr};

    fn tensor(id: u64, status: TensorStatus) -> TensorIr {
        TensorIr {
            id: TensorId::new(id),
            shape: Shape::new([2, 3]),
            status,
            dtype: DType::F32,
        }
    }

    fn add_scalar(lhs: TensorIr, out: u64, position: u64) -> OperationIr {
        OperationIr::NumericFloat(
            DType::F32,
            NumericOperationIr::AddScalar(ScalarOpIr {
                lhs,
                rhs: ScalarIr::UInt(position),
                out: tensor(out, TensorStatus::NotInit),
            }),
        )
    }

    #[test]
    fn flow_follows_inputs_outputs_and_scalars() {
        // t1 = t0 + s0 (t0 read, kept); t2 = t1 + s1 (t1's last use); t3 = t0 + s2 (t0's last
        // use); t4 = t2 + s3, then t4 dropped. Left behind: t2 and t3.
        let ops = vec![
            add_scalar(tensor(0, TensorStatus::ReadOnly), 1, 0),
            add_scalar(tensor(1, TensorStatus::ReadWrite), 2, 1),
            add_scalar(tensor(0, TensorStatus::ReadWrite), 3, 2),
            add_scalar(tensor(2, TensorStatus::ReadOnly), 4, 3),
            OperationIr::Drop(tensor(4, TensorStatus::ReadWrite)),
        ];
        let flow = BlockFlow::of(&ops);
        assert_eq!(flow.inputs, [TensorId::new(0)]);
        assert_eq!(flow.outputs, [TensorId::new(2), TensorId::new(3)]);
        assert_eq!(flow.consumed, [TensorId::new(0)]);
        assert_eq!(flow.scalars, [vec![0], vec![1], vec![2], vec![3], vec![]]);
        let ids: Vec<u64> = (0..5).collect();
        assert_eq!(
            flow.tensors,
            ids.into_iter().map(TensorId::new).collect::<Vec<_>>()
        );
    }
}
