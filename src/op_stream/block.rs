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
}

impl BlockFlow {
    /// Follows the tensors through `ops`.
    pub(crate) fn of(ops: &[OperationIr]) -> Self {
        let mut flow = BlockFlow::default();
        let mut created: HashSet<TensorId> = HashSet::new();
        let mut seen_inputs: HashSet<TensorId> = HashSet::new();
        let mut gone: HashSet<TensorId> = HashSet::new();
        for op in ops {
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
