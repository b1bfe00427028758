//! Automatic fusion: graphs that recur are evaluated through MLX's `compile`, with no change to
//! user code.
//!
//! Burn code builds the same MLX graph again each time a training step or an inference call
//! runs: the same primitives, shapes and dtypes, wired the same way. Every evaluation burn-mlx
//! performs (a data read, [`MlxTensor::eval`](crate::MlxTensor::eval),
//! [`fast::start_eval`](crate::fast::start_eval)) goes through a pass in burn-mlx's native layer
//! (`mlx-sys/fusion.cpp`) that walks the pending graph, hashes its structure and counts how often
//! it has been seen. When a structure has been seen [`threshold`] times (5 by default), the pass
//! records it (primitives and wiring, no data) and gives MLX's `compile` a function that replays
//! it; MLX fuses its elementwise chains into single kernels and merges repeated subexpressions.
//! From then on, each graph of that structure (checked node by node, primitive parameters
//! included) is evaluated through the compiled function; a graph whose top matches the structure
//! that last ran compiled is checked against it in one walk that records nothing
//! ([`FusionStats::recognized`]), and walked in full only if it differs. The arrays the program
//! still holds (parameters, optimizer state, activations kept for the backward pass) stay
//! outputs, so they are materialized as a plain evaluation would.
//!
//! Fusion is not always faster: MLX's fused kernels cost host time per launch too, which is
//! what a GPU step is often bound by. So each structure is measured: its plain evaluations
//! before compiling (all but the first) and its first compiled ones (all but the first, which
//! builds the kernels) are timed, and the compiled graph is kept only if it was faster
//! ([`FusionStats::slower`] counts those dropped).
//!
//! One-off graphs cost one walk of the graph; graphs whose shapes change every time (an eager
//! decode loop whose cache grows) are never compiled.
//!
//! The pass is on for GPU graphs and off for CPU graphs by default: on MLX's CPU each fused
//! kernel is built with the system C++ compiler the first time (then cached under the temporary
//! directory), and the CPU Transformer step was not faster with it (BENCHMARKS.md; the MLP and
//! CNN steps gained 13-18 %). MLX
//! skips compilation when there is no compiler, and evaluation is then plain.
//!
//! Control it with the `BURN_MLX_FUSION` environment variable (read once, at the first
//! evaluation): `gpu` (the default), `on` (GPU and CPU), `off` or `0`, or a number `n` (both
//! devices, compiling a structure at its `n`-th sighting); or call [`set_threshold`] at run
//! time. [`stats`] says what the pass did.

use crate::device::MlxDevice;
use crate::error::MlxError;
use crate::native::fusion as native;
use mlx_rs::Array;
use std::sync::Once;

/// What the fusion pass has done in this process (see [`stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FusionStats {
    /// Evaluations that went through the pass.
    pub evaluations: u64,
    /// Evaluations that ran through a compiled graph.
    pub fused: u64,
    /// Graph structures compiled.
    pub compiled: u64,
    /// Structures whose compilation failed (they are evaluated plainly from then on).
    pub failed: u64,
    /// Primitives of the original graphs that ran through compiled graphs.
    pub primitives: u64,
    /// Primitives of the compiled graphs that replaced them (fused kernels, matmuls, the
    /// buffer-sharing copies of the outputs), summed over the fused evaluations.
    pub fused_primitives: u64,
    /// Structures whose compiled graph was measured slower than their plain evaluation, and
    /// dropped (they are evaluated plainly from then on).
    pub slower: u64,
    /// Host time the pass itself spent, in nanoseconds, before handing graphs to MLX's
    /// evaluation: walking and hashing each graph, checking it against a recorded structure,
    /// calling the compiled function, pointing the arrays the program holds at its results and
    /// releasing the original graph. The device waits meanwhile.
    pub pass_nanos: u64,
    /// The part of `pass_nanos` spent inside MLX's compiled functions: their cache lookup and
    /// building the compiled graph for the current inputs (its first call traces and compiles).
    pub call_nanos: u64,
    /// Fused evaluations whose graph was recognized as the compiled structure last evaluated
    /// with the same top, by one check against its recipe instead of a full walk, hash and
    /// match (`BURN_MLX_FUSION_RECOGNIZE=0` turns this off).
    pub recognized: u64,
}

impl FusionStats {
    /// The counts gained between `earlier` (an older [`stats`]) and `self`.
    pub fn since(&self, earlier: &FusionStats) -> FusionStats {
        FusionStats {
            evaluations: self.evaluations - earlier.evaluations,
            fused: self.fused - earlier.fused,
            compiled: self.compiled - earlier.compiled,
            failed: self.failed - earlier.failed,
            primitives: self.primitives - earlier.primitives,
            fused_primitives: self.fused_primitives - earlier.fused_primitives,
            slower: self.slower - earlier.slower,
            pass_nanos: self.pass_nanos - earlier.pass_nanos,
            call_nanos: self.call_nanos - earlier.call_nanos,
            recognized: self.recognized - earlier.recognized,
        }
    }
}

/// The pass's counters so far.
pub fn stats() -> FusionStats {
    let out = native::counters();
    FusionStats {
        evaluations: out[0],
        fused: out[1],
        compiled: out[2],
        failed: out[3],
        primitives: out[4],
        fused_primitives: out[5],
        slower: out[6],
        pass_nanos: out[7],
        call_nanos: out[8],
        recognized: out[9],
    }
}

/// Compiles a graph structure at its `n`-th sighting, for graphs on `device`; `0` turns the
/// pass off there (plain MLX evaluation). Overrides `BURN_MLX_FUSION`.
pub fn set_threshold(device: MlxDevice, n: u32) {
    configure();
    native::set_threshold(device == MlxDevice::Gpu, n);
}

/// The sightings after which a structure on `device` is compiled (`0`: the pass is off there).
pub fn threshold(device: MlxDevice) -> u32 {
    configure();
    native::threshold(device == MlxDevice::Gpu)
}

/// Forgets every recorded structure and compiled function (their memory is released).
pub fn clear() {
    native::clear();
}

/// The thresholds (GPU, CPU) a `BURN_MLX_FUSION` value asks for.
fn parse_threshold(v: &str) -> Result<(u32, u32), String> {
    match v.trim() {
        "off" | "0" => Ok((0, 0)),
        "gpu" | "" => Ok((DEFAULT_THRESHOLD, 0)),
        "on" => Ok((DEFAULT_THRESHOLD, DEFAULT_THRESHOLD)),
        n => n.parse::<u32>().map(|n| (n, n)).map_err(|_| {
            format!("BURN_MLX_FUSION={v:?}: expected `off`, `gpu`, `on` or a number of sightings")
        }),
    }
}

/// The default number of sightings before a structure is compiled on the GPU: the first is not
/// timed (one-time costs), the next three give the plain time the compiled graph has to beat.
pub const DEFAULT_THRESHOLD: u32 = 5;

/// Reads `BURN_MLX_FUSION` once.
fn configure() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Ok(value) = std::env::var("BURN_MLX_FUSION") else {
            return;
        };
        match parse_threshold(&value) {
            Ok((gpu, cpu)) => {
                native::set_threshold(true, gpu);
                native::set_threshold(false, cpu);
            }
            Err(message) => eprintln!("burn-mlx: {message}; keeping the default"),
        }
    });
}

/// Evaluates `arrays` through the pass: waits for them when `wait`, otherwise starts them
/// (MLX's `async_eval`). Callers hold burn-mlx's evaluation lock.
pub(crate) fn eval(op: &str, arrays: &[&Array], wait: bool) -> Result<(), MlxError> {
    configure();
    native::eval(op, arrays, wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_environment_variable() {
        assert_eq!(parse_threshold("off"), Ok((0, 0)));
        assert_eq!(parse_threshold("0"), Ok((0, 0)));
        assert_eq!(parse_threshold("gpu"), Ok((5, 0)));
        assert_eq!(parse_threshold("on"), Ok((5, 5)));
        assert_eq!(parse_threshold(" 3 "), Ok((3, 3)));
        assert!(parse_threshold("always")
            .unwrap_err()
            .contains("BURN_MLX_FUSION"));
    }
}
