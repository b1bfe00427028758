//! What evaluating tensors would run: the MLX primitives of their pending (lazy) graph, counted
//! by name ([`pending_primitives`]) and grouped into kinds ([`PrimitiveKind`]).
//!
//! On a GPU every primitive that computes values is (at least) one kernel launch, so these counts
//! say where a training or decode step spends its launches, with no profiler: this is how
//! `benches/nvidia.md` breaks a step down. MLX writes the graph with its `export_to_dot`; the
//! counts are read back from that text.

use crate::error::MlxError;
use crate::tensor::MlxTensor;
use std::collections::BTreeMap;

/// The kinds a step's primitives fall into, for a profile table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PrimitiveKind {
    /// Matrix products and convolutions (GEMM kernels).
    Gemm,
    /// Reductions, softmax, normalizations, arg-reductions and scans.
    Reduction,
    /// Elementwise arithmetic and activations (one pass over the data each).
    Elementwise,
    /// Data movement that writes memory: copies, casts, concatenation, gathers, scatters,
    /// slice updates, padding.
    Copy,
    /// Views (reshape, transpose, broadcast, slice): no kernel on MLX's GPU backends unless a
    /// later op needs the data contiguous.
    View,
    /// Random number generation.
    Random,
    /// Anything else (fused kernels such as attention, custom kernels, FFT, ...).
    Other,
}

impl PrimitiveKind {
    /// The kind of an MLX primitive, from the name MLX gives it.
    pub fn of(name: &str) -> Self {
        // The names MLX 0.32's primitives give themselves (`Primitive::name`).
        const GEMM: &[&str] = &[
            "Matmul",
            "AddMM",
            "BlockMaskedMM",
            "GatherMM",
            "SegmentedMM",
            "QuantizedMatmul",
            "QQMatmul",
            "GatherQMM",
            "GatherQQMM",
            "Convolution",
        ];
        const REDUCTION: &[&str] = &[
            "Sum",
            "Prod",
            "Min",
            "Max",
            "And",
            "Or",
            "ArgReduce",
            "Softmax",
            "LogSumExp",
            "CumSum",
            "CumProd",
            "CumMin",
            "CumMax",
            "CumLogAddExp",
            "RMSNorm",
            "RMSNormVJP",
            "LayerNorm",
            "LayerNormVJP",
            "Sort",
            "ArgSort",
            "Partition",
            "ArgPartition",
        ];
        const COPY: &[&str] = &[
            "Copy",
            "Contiguous",
            "AsType",
            "Concatenate",
            "Gather",
            "GatherAxis",
            "Scatter",
            "ScatterAxis",
            "MaskedScatter",
            "SliceUpdate",
            "DynamicSlice",
            "DynamicSliceUpdate",
            "Pad",
            "Full",
            "Arange",
            "Split",
        ];
        const VIEW: &[&str] = &[
            "Reshape",
            "Transpose",
            "Broadcast",
            "BroadcastAxes",
            "Slice",
            "Squeeze",
            "ExpandDims",
            "Flatten",
            "Unflatten",
            "AsStrided",
            "StopGradient",
            "Depends",
        ];
        const ELEMENTWISE: &[&str] = &[
            "Abs",
            // burn-mlx's vectorized CPU kernels (`mlx-sys/fast_unary.cpp`).
            "BurnMlxFastExp",
            "BurnMlxFastTanh",
            "BurnMlxFastErf",
            "BurnMlxFastSigmoid",
            "Add",
            "ArcCos",
            "ArcCosh",
            "ArcSin",
            "ArcSinh",
            "ArcTan",
            "ArcTan2",
            "ArcTanh",
            "BitwiseAnd",
            "BitwiseOr",
            "BitwiseXor",
            "LeftShift",
            "RightShift",
            "BitwiseInvert",
            "Ceil",
            "Compiled",
            "Conjugate",
            "Cos",
            "Cosh",
            "Divide",
            "DivMod",
            "Equal",
            "NaNEqual",
            "Erf",
            "ErfInv",
            "Exp",
            "Expm1",
            "Floor",
            "Greater",
            "GreaterEqual",
            "Imag",
            "Less",
            "LessEqual",
            "Log",
            "Log2",
            "Log10",
            "Log1p",
            "LogAddExp",
            "LogicalAnd",
            "LogicalNot",
            "LogicalOr",
            "Maximum",
            "Minimum",
            "Multiply",
            "Negative",
            "NotEqual",
            "Power",
            "Real",
            "Remainder",
            "Round",
            "Rsqrt",
            "Select",
            "Sigmoid",
            "Sign",
            "Sin",
            "Sinh",
            "Sqrt",
            "Square",
            "Subtract",
            "Tan",
            "Tanh",
        ];
        let is = |list: &[&str]| list.contains(&name);
        if is(GEMM) {
            PrimitiveKind::Gemm
        } else if is(REDUCTION) {
            PrimitiveKind::Reduction
        } else if is(VIEW) {
            PrimitiveKind::View
        } else if is(COPY) {
            PrimitiveKind::Copy
        } else if name == "RandomBits" {
            PrimitiveKind::Random
        } else if is(ELEMENTWISE) {
            PrimitiveKind::Elementwise
        } else {
            PrimitiveKind::Other
        }
    }
}

/// The primitives that evaluating `outputs` would run now, counted by MLX's name for them
/// (`"Matmul"`, `"Add"`, `"Reshape"`, ...): every node of their pending graphs, each shared node
/// once. Tensors already evaluated contribute nothing.
///
/// ```
/// use burn_mlx::{pending_primitives, MlxDevice, MlxOps, MlxTensor};
///
/// let a = MlxTensor::ones::<f32>(&[4, 4], MlxDevice::Cpu).unwrap();
/// let b = a.clone().matmul(&a).relu().unwrap();
/// let counts = pending_primitives(&[&b]).unwrap();
/// assert_eq!(counts.get("Matmul"), Some(&1));
/// ```
pub fn pending_primitives(outputs: &[&MlxTensor]) -> Result<BTreeMap<String, usize>, MlxError> {
    let arrays: Vec<_> = outputs.iter().map(|t| &t.array).collect();
    let dot = crate::native::dot::export_dot(&arrays)?;
    Ok(count_dot(&dot))
}

/// Counts the primitive nodes of MLX's DOT text (`{ ID [label ="Name", shape=rectangle]; }`),
/// each node id once.
fn count_dot(dot: &str) -> BTreeMap<String, usize> {
    let mut seen = std::collections::HashSet::new();
    let mut counts = BTreeMap::new();
    for line in dot.lines() {
        let Some(rest) = line.strip_prefix("{ ") else {
            continue;
        };
        let Some((id, label)) = rest.split_once(" [label =\"") else {
            continue;
        };
        let Some((name, _)) = label.split_once('"') else {
            continue;
        };
        if seen.insert(id.to_string()) {
            *counts.entry(name.to_string()).or_insert(0) += 1;
        }
    }
    counts
}

/// [`pending_primitives`] summed by [`PrimitiveKind`].
pub fn pending_by_kind(outputs: &[&MlxTensor]) -> Result<BTreeMap<PrimitiveKind, usize>, MlxError> {
    let mut kinds = BTreeMap::new();
    for (name, n) in pending_primitives(outputs)? {
        *kinds.entry(PrimitiveKind::of(&name)).or_insert(0) += n;
    }
    Ok(kinds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_lines_are_counted_once_per_node() {
        let dot = "digraph {\n{ rank=source; \"A\"; }\n{ 7 [label =\"Add\", shape=rectangle]; }\n\
                   \"A\" -> 7\n{ 7 [label =\"Add\", shape=rectangle]; }\n\
                   { 9 [label =\"Matmul\", shape=rectangle]; }\n}";
        let counts = count_dot(dot);
        assert_eq!(counts.get("Add"), Some(&1));
        assert_eq!(counts.get("Matmul"), Some(&1));
        assert_eq!(PrimitiveKind::of("Matmul"), PrimitiveKind::Gemm);
        assert_eq!(PrimitiveKind::of("Reshape"), PrimitiveKind::View);
        assert_eq!(PrimitiveKind::of("Multiply"), PrimitiveKind::Elementwise);
    }
}
