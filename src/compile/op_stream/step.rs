//! [`StepOptimization`]: one recurring block of recorded ops, run op by op the first time and as
//! one MLX-compiled function afterwards.

use super::block::BlockFlow;
use super::MlxFusionRuntime;
use crate::device::MlxDevice;
use crate::scalar_tape::{same, Captured, Tape};
use crate::tensor::constant_scalar_array;
use crate::tensor::MlxTensor;
use crate::trace::TraceGuard;
use burn_backend::{Scalar, Shape};
use burn_fusion::stream::{Context, OrderedExecution, ScalarId};
use burn_fusion::{NumOperations, Optimization};
use burn_ir::{HandleContainer, OperationIr, ScalarIr, TensorId};
use mlx_rs::error::Exception;
use mlx_rs::{Array, Dtype};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

/// How many recorded variants (shapes and fixed scalars) a block keeps; a new one beyond them
/// replaces the one used least recently.
const MAX_VARIANTS: usize = 4;

/// How many times a block may be recorded (a first sighting, or a run that no kept variant fits)
/// before it stays op by op for good: a block whose fixed scalars change on every run never
/// compiles, and recording it costs more than running it.
const MAX_RECORDINGS: u32 = 12;

/// Counters over every [`MlxFused`](super::MlxFused) block in the process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpStreamStats {
    /// Blocks run through their compiled function.
    pub compiled_runs: u64,
    /// Blocks run op by op (first sightings, re-recordings, and blocks that cannot compile).
    pub unfused_runs: u64,
    /// Traces of a block into a compiled function (a new block, or new input shapes).
    pub traces: u64,
    /// Blocks that stopped compiling: a failed trace, or scalars that kept changing.
    pub given_up: u64,
    /// Host time in compiled calls (and their launches), nanoseconds.
    pub call_nanos: u64,
}

static COMPILED_RUNS: AtomicU64 = AtomicU64::new(0);
static UNFUSED_RUNS: AtomicU64 = AtomicU64::new(0);
static TRACES: AtomicU64 = AtomicU64::new(0);
static GIVEN_UP: AtomicU64 = AtomicU64::new(0);
static CALL_NANOS: AtomicU64 = AtomicU64::new(0);

/// The counters so far (see [`OpStreamStats`]).
pub fn op_stream_stats() -> OpStreamStats {
    OpStreamStats {
        compiled_runs: COMPILED_RUNS.load(Ordering::Relaxed),
        unfused_runs: UNFUSED_RUNS.load(Ordering::Relaxed),
        traces: TRACES.load(Ordering::Relaxed),
        given_up: GIVEN_UP.load(Ordering::Relaxed),
        call_nanos: CALL_NANOS.load(Ordering::Relaxed),
    }
}

/// Which scalars of the block are inputs of its compiled function, and which are fixed.
#[derive(Debug, Clone)]
struct Bindings {
    /// Every scalar array the block's ops created, in order, with the scalar position it is
    /// bound to (then it is an input of the compiled function).
    captures: Vec<(Captured, Option<u64>)>,
    /// The bound positions and their arrays' dtypes, in input order.
    bound: Vec<(u64, Dtype)>,
    /// The scalars the trace keeps as constants, with their recorded values.
    fixed: Vec<(u64, ScalarIr)>,
    /// The shapes of the block's tensors when it was recorded ([`BlockFlow::tensors`]).
    shapes: Vec<Shape>,
}

type ArrayFn = Box<dyn FnMut(&[Array]) -> Result<Vec<Array>, Exception>>;

/// An MLX-compiled function.
struct CompiledFn(ArrayFn);

// SAFETY: the function is only called by the fusion server that owns the optimization, one call
// at a time (burn-fusion hands the optimization `&mut`), under burn-mlx's evaluation lock; the
// traced closure itself captures nothing (it reads the current block from a thread-local set
// for the duration of the call).
unsafe impl Send for CompiledFn {}

/// One recording of a block: the shapes and fixed scalars it holds for, and its compiled
/// function once a second run has fitted it.
struct Variant {
    bindings: Bindings,
    /// `None` until a run fits the recording a second time.
    function: Option<CompiledFn>,
    /// The block's run count when this variant last ran (for replacing the least recently used).
    last_used: u64,
}

/// A block of recorded ops that runs as one MLX-compiled function (see [`super`]).
///
/// burn-fusion finds a block by its relative description, which leaves out shapes, so the same
/// block serves every batch size (an epoch's smaller last batch, say). The block keeps one
/// `Variant` per recording, up to `MAX_VARIANTS` (4), and each run uses the one it fits.
pub struct StepOptimization {
    device: MlxDevice,
    ops: Vec<OperationIr>,
    flow: BlockFlow,
    variants: Vec<Variant>,
    /// Runs op by op for good (nothing to compile, a failed trace, or too many recordings).
    unfused: bool,
    recordings: u32,
    runs: u64,
}

impl std::fmt::Debug for StepOptimization {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let compiled = self.variants.iter().filter(|v| v.function.is_some());
        f.debug_struct("StepOptimization")
            .field("ops", &self.ops.len())
            .field("inputs", &self.flow.inputs.len())
            .field("outputs", &self.flow.outputs.len())
            .field("unfused", &self.unfused)
            .field("variants", &self.variants.len())
            .field("compiled_variants", &compiled.count())
            .field("recordings", &self.recordings)
            .finish()
    }
}

impl StepOptimization {
    pub(crate) fn new(device: MlxDevice, ops: Vec<OperationIr>) -> Self {
        let flow = BlockFlow::of(&ops);
        // A block that leaves nothing behind has nothing to compile.
        let unfused = flow.outputs.is_empty();
        Self {
            device,
            ops,
            flow,
            variants: Vec::new(),
            unfused,
            recordings: 0,
            runs: 0,
        }
    }

    /// Runs the ops one by one on the handles, recording their scalars when asked; returns the
    /// captures and, for each op, where its captures start.
    fn run_unfused(
        &self,
        context: &mut Context<MlxTensor>,
        execution: &OrderedExecution<MlxFusionRuntime>,
        record: bool,
    ) -> Option<(Vec<Captured>, Vec<usize>)> {
        UNFUSED_RUNS.fetch_add(1, Ordering::Relaxed);
        let tape = record.then(Tape::record);
        let mut starts = Vec::with_capacity(self.ops.len() + 1);
        for i in 0..self.ops.len() {
            starts.push(tape.as_ref().map_or(0, Tape::len));
            execution
                .operation_within_optimization(i)
                .execute(&mut context.handles);
        }
        let tape = tape?;
        starts.push(tape.len());
        Some((tape.finish(), starts))
    }

    /// Runs op by op, records, and keeps the recording as a new variant (replacing the least
    /// recently used one when [`MAX_VARIANTS`] are kept), or gives up after [`MAX_RECORDINGS`].
    fn record(
        &mut self,
        context: &mut Context<MlxTensor>,
        execution: &OrderedExecution<MlxFusionRuntime>,
    ) {
        self.recordings += 1;
        let (captures, starts) = self
            .run_unfused(context, execution, true)
            .expect("a recording run returns its captures");
        if self.recordings > MAX_RECORDINGS {
            GIVEN_UP.fetch_add(1, Ordering::Relaxed);
            return self.give_up();
        }
        let Some(shapes) = self.shapes(context) else {
            return self.give_up();
        };
        let mut bindings = bind(&self.flow.scalars, captures, &starts, |p| {
            context.scalars.get(&ScalarId { value: p }).copied()
        });
        bindings.shapes = shapes;
        if self.variants.len() >= MAX_VARIANTS {
            let oldest = (0..self.variants.len())
                .min_by_key(|&k| self.variants[k].last_used)
                .expect("a full list has a variant");
            self.variants.swap_remove(oldest);
        }
        self.variants.push(Variant {
            bindings,
            function: None,
            last_used: self.runs,
        });
    }

    /// From now on the block runs op by op; its compiled functions are dropped.
    fn give_up(&mut self) {
        self.unfused = true;
        self.variants.clear();
    }

    /// The shapes of the block's tensors in this run.
    fn shapes(&self, context: &Context<MlxTensor>) -> Option<Vec<Shape>> {
        self.flow
            .tensors
            .iter()
            .map(|r| context.tensors.get(r).map(|t| t.shape.clone()))
            .collect()
    }

    /// The compiled function's inputs for this run (the block's input tensors, then its bound
    /// scalars), or `None` when this run cannot use the compiled function.
    fn inputs(&self, context: &Context<MlxTensor>, bindings: &Bindings) -> Option<Vec<Array>> {
        let same_shapes = self.flow.tensors.len() == bindings.shapes.len()
            && self
                .flow
                .tensors
                .iter()
                .zip(&bindings.shapes)
                .all(|(r, s)| context.tensors.get(r).is_some_and(|t| &t.shape == s));
        if !same_shapes {
            return None;
        }
        for (p, value) in &bindings.fixed {
            let now = context.scalars.get(&ScalarId { value: *p })?;
            if !same(now, value) {
                return None;
            }
        }
        let mut arrays = Vec::with_capacity(self.flow.inputs.len() + bindings.bound.len());
        for r in &self.flow.inputs {
            let id = context.tensors.get(r)?.id;
            let handle = context.handles.get_handle_ref(&id)?;
            if handle.quant.is_some() || handle.device != self.device {
                return None;
            }
            arrays.push(handle.array.clone());
        }
        for (p, dtype) in &bindings.bound {
            let value = context.scalars.get(&ScalarId { value: *p })?;
            arrays.push(constant_scalar_array(Scalar::from(*value), *dtype));
        }
        Some(arrays)
    }

    /// Calls the compiled function (tracing it first when MLX has no trace for these input
    /// shapes) and puts its outputs in place of the block's ops' results.
    fn run_compiled(
        &mut self,
        context: &mut Context<MlxTensor>,
        execution: &OrderedExecution<MlxFusionRuntime>,
        variant: usize,
        arrays: Vec<Array>,
    ) -> Result<(), String> {
        let Variant {
            bindings, function, ..
        } = &mut self.variants[variant];
        let function = function.get_or_insert_with(|| CompiledFn(compiled_block()));
        let global = |r: &TensorId| context.tensors.get(r).map(|t| t.id);
        let inputs: Option<Vec<TensorId>> = self.flow.inputs.iter().map(global).collect();
        let outputs: Option<Vec<TensorId>> = self.flow.outputs.iter().map(global).collect();
        let consumed: Option<Vec<TensorId>> = self.flow.consumed.iter().map(global).collect();
        let (Some(inputs), Some(outputs), Some(consumed)) = (inputs, outputs, consumed) else {
            return Err("a tensor of the block is missing from the stream's context".into());
        };
        let scalars_now: Vec<Option<ScalarIr>> = bindings
            .captures
            .iter()
            .map(|(_, b)| b.and_then(|p| context.scalars.get(&ScalarId { value: p }).copied()))
            .collect();
        let mut job = TraceJob {
            execution,
            n_ops: self.ops.len(),
            inputs,
            outputs: outputs.clone(),
            device: self.device,
            captures: &bindings.captures,
            scalars_now,
            error: None,
        };
        let device = self.device;
        let started = std::time::Instant::now();
        let result = {
            let _guard = crate::tensor::eval_lock();
            let _job = JobGuard::set(&mut job);
            device.scope(|| (function.0)(&arrays))
        };
        let results = match result {
            Ok(r) => r,
            Err(e) => return Err(job.error.take().unwrap_or_else(|| e.what().to_string())),
        };
        if results.len() != outputs.len() {
            return Err(format!(
                "the compiled block returned {} arrays for {} outputs",
                results.len(),
                outputs.len()
            ));
        }
        COMPILED_RUNS.fetch_add(1, Ordering::Relaxed);
        if super::settings().launch {
            let refs: Vec<&Array> = results.iter().collect();
            let _guard = crate::tensor::eval_lock();
            crate::compile::auto::eval("op stream launch", &refs, false)
                .map_err(|e| e.to_string())?;
        }
        CALL_NANOS.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        for (id, array) in outputs.into_iter().zip(results) {
            context
                .handles
                .register_handle(id, MlxTensor::from_array(array, device));
        }
        for id in consumed {
            context.handles.remove_handle(id);
        }
        Ok(())
    }
}

impl NumOperations for StepOptimization {
    fn len(&self) -> usize {
        self.ops.len()
    }

    fn name(&self) -> &'static str {
        "mlx-compiled-block"
    }
}

impl Optimization<MlxFusionRuntime> for StepOptimization {
    fn execute(
        &mut self,
        context: &mut Context<MlxTensor>,
        execution: &OrderedExecution<MlxFusionRuntime>,
    ) {
        if self.unfused {
            self.run_unfused(context, execution, false);
            return;
        }
        self.runs += 1;
        let fits = self
            .variants
            .iter()
            .enumerate()
            .find_map(|(k, v)| self.inputs(context, &v.bindings).map(|a| (k, a)));
        let Some((variant, arrays)) = fits else {
            // A first sighting, or new shapes or fixed scalars (or an input quantized or
            // elsewhere): record a new variant.
            return self.record(context, execution);
        };
        self.variants[variant].last_used = self.runs;
        if let Err(message) = self.run_compiled(context, execution, variant, arrays) {
            // Nothing of the failed call reached the handles: run the block op by op, and keep
            // it that way.
            if std::env::var_os("BURN_MLX_OP_STREAM_LOG").is_some() {
                eprintln!(
                    "burn-mlx: a block of {} ops stays uncompiled: {message}",
                    self.ops.len()
                );
            }
            GIVEN_UP.fetch_add(1, Ordering::Relaxed);
            self.give_up();
            self.run_unfused(context, execution, false);
        }
    }

    fn to_state(&self) -> Vec<OperationIr> {
        self.ops.clone()
    }

    fn from_state(device: &MlxDevice, state: Vec<OperationIr>) -> Self {
        Self::new(*device, state)
    }
}

/// Binds each op's captured scalars (`captures[starts[i]..starts[i + 1]]` for op `i`) to the
/// op's own scalars (`positions[i]`, whose values `value_of` gives) when they agree one to one,
/// in order and by value; every other scalar of the block is fixed at its current value.
fn bind(
    positions: &[Vec<u64>],
    captures: Vec<Captured>,
    starts: &[usize],
    value_of: impl Fn(u64) -> Option<ScalarIr>,
) -> Bindings {
    let mut bound_to: Vec<Option<u64>> = vec![None; captures.len()];
    let mut fixed = Vec::new();
    for (i, positions) in positions.iter().enumerate() {
        let own = &captures[starts[i]..starts[i + 1]];
        let Some(values) = positions
            .iter()
            .map(|p| value_of(*p))
            .collect::<Option<Vec<_>>>()
        else {
            continue;
        };
        let agree = !positions.is_empty()
            && own.len() == positions.len()
            && own.iter().zip(&values).all(|(c, v)| same(&c.value, v));
        if agree {
            for (k, p) in positions.iter().enumerate() {
                bound_to[starts[i] + k] = Some(*p);
            }
        } else {
            fixed.extend(positions.iter().copied().zip(values));
        }
    }
    let bound = captures
        .iter()
        .zip(&bound_to)
        .filter_map(|(c, b)| b.map(|p| (p, c.dtype)))
        .collect();
    Bindings {
        captures: captures.into_iter().zip(bound_to).collect(),
        bound,
        fixed,
        shapes: Vec::new(),
    }
}

/// What the traced function needs from the run that traces it.
struct TraceJob<'a> {
    execution: &'a OrderedExecution<MlxFusionRuntime>,
    n_ops: usize,
    /// Global ids of the block's inputs and outputs in this run.
    inputs: Vec<TensorId>,
    outputs: Vec<TensorId>,
    device: MlxDevice,
    captures: &'a [(Captured, Option<u64>)],
    /// The current value of each bound capture's scalar.
    scalars_now: Vec<Option<ScalarIr>>,
    /// Why the trace failed, in words.
    error: Option<String>,
}

thread_local! {
    /// The run being traced on this thread (null outside a compiled call).
    static JOB: Cell<*mut TraceJob<'static>> = const { Cell::new(std::ptr::null_mut()) };
}

/// Publishes a job to the traced function for the duration of a compiled call.
struct JobGuard(*mut TraceJob<'static>);

impl JobGuard {
    fn set(job: &mut TraceJob<'_>) -> Self {
        let ptr = (job as *mut TraceJob<'_>).cast::<TraceJob<'static>>();
        JobGuard(JOB.with(|j| j.replace(ptr)))
    }
}

impl Drop for JobGuard {
    fn drop(&mut self) {
        JOB.with(|j| j.set(self.0));
    }
}

/// A new compiled function whose trace runs the current job's ops on its inputs.
fn compiled_block() -> ArrayFn {
    crate::native::thread_init();
    let traced = |arrays: &[Array]| -> Result<Vec<Array>, Exception> {
        let ptr = JOB.with(Cell::get);
        if ptr.is_null() {
            return Err(Exception::custom(
                "a compiled block was traced outside its run",
            ));
        }
        // SAFETY: the pointer was set by `JobGuard::set` from a job that outlives the compiled
        // call this trace happens in, on this thread.
        let job = unsafe { &mut *ptr };
        match catch_unwind(AssertUnwindSafe(|| trace(job, arrays))) {
            Ok(Ok(outputs)) => Ok(outputs),
            Ok(Err(message)) => {
                job.error = Some(message.clone());
                Err(Exception::custom(message))
            }
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "an op panicked while tracing".into());
                job.error = Some(message.clone());
                Err(Exception::custom(message))
            }
        }
    };
    let mut compiled = mlx_rs::transforms::compile::compile(traced, false);
    Box::new(move |args: &[Array]| compiled(args))
}

/// The body of the traced function: the block's ops on the traced inputs.
fn trace(job: &mut TraceJob<'_>, arrays: &[Array]) -> Result<Vec<Array>, String> {
    TRACES.fetch_add(1, Ordering::Relaxed);
    let n_in = job.inputs.len();
    if arrays.len() < n_in {
        return Err("the compiled block got fewer inputs than it reads".into());
    }
    let mut handles: HandleContainer<MlxTensor> = HandleContainer::new();
    for (id, a) in job.inputs.iter().zip(arrays) {
        handles.register_handle(*id, MlxTensor::from_array(a.clone(), job.device));
    }
    let mut next = n_in;
    let replacements: Vec<Option<Array>> = job
        .captures
        .iter()
        .map(|(_, b)| {
            b.map(|_| {
                next += 1;
                arrays[next - 1].clone()
            })
        })
        .collect();
    if next != arrays.len() {
        return Err("the compiled block got a different number of scalar inputs".into());
    }
    let seen = {
        let tape = Tape::replace(replacements);
        let _tracing = TraceGuard::enter();
        for i in 0..job.n_ops {
            job.execution
                .operation_within_optimization(i)
                .execute(&mut handles);
        }
        tape.finish()
    };
    // The ops must have asked for the recorded scalars, in order: the bound ones with this
    // run's values, the others with the recorded ones.
    let agrees = seen.len() == job.captures.len()
        && seen
            .iter()
            .zip(job.captures)
            .zip(&job.scalars_now)
            .all(|((s, (c, b)), now)| {
                s.dtype == c.dtype
                    && match (b, now) {
                        (Some(_), Some(now)) => same(&s.value, now),
                        (Some(_), None) => false,
                        (None, _) => same(&s.value, &c.value),
                    }
            });
    if !agrees {
        return Err("the block's ops asked for other scalars than when they were recorded".into());
    }
    job.outputs
        .iter()
        .map(|id| {
            handles
                .get_handle_ref(id)
                .map(|t| t.array.clone())
                .ok_or_else(|| format!("the block did not produce its output {id:?}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(value: ScalarIr) -> Captured {
        Captured {
            value,
            dtype: Dtype::Float32,
        }
    }

    #[test]
    fn scalars_bind_only_to_their_own_ops_one_to_one() {
        // op 0: one scalar, one capture of its value: bound.
        // op 1: one scalar, two captures (a derived constant beside it): fixed.
        // op 2: one scalar, one capture of another value (derived from it): fixed.
        // op 3: no scalar, one capture (an op's own constant): a constant, not bound.
        // op 4: two scalars captured in order: both bound.
        let values = [0.1, 2.0, 3.0, 4.0, 5.0];
        let positions = vec![vec![0], vec![1], vec![2], vec![], vec![3, 4]];
        let captures = vec![
            captured(ScalarIr::Float(0.1)),
            captured(ScalarIr::Float(2.0)),
            captured(ScalarIr::Float(1.0)),
            captured(ScalarIr::Float(1.0 / 3.0)),
            captured(ScalarIr::Float(4.0)),
            captured(ScalarIr::Float(4.0)),
            captured(ScalarIr::Float(5.0)),
        ];
        let starts = [0, 1, 3, 4, 5, 7];
        let b = bind(&positions, captures, &starts, |p| {
            values.get(p as usize).map(|v| ScalarIr::Float(*v))
        });
        let bound_to: Vec<Option<u64>> = b.captures.iter().map(|(_, p)| *p).collect();
        assert_eq!(
            bound_to,
            [Some(0), None, None, None, None, Some(3), Some(4)]
        );
        assert_eq!(
            b.bound,
            [
                (0, Dtype::Float32),
                (3, Dtype::Float32),
                (4, Dtype::Float32)
            ]
        );
        let fixed: Vec<u64> = b.fixed.iter().map(|(p, _)| *p).collect();
        assert_eq!(fixed, [1, 2]);
    }

    #[test]
    fn same_compares_floats_bit_for_bit() {
        assert!(same(&ScalarIr::Float(f64::NAN), &ScalarIr::Float(f64::NAN)));
        assert!(!same(&ScalarIr::Float(0.0), &ScalarIr::Float(-0.0)));
        assert!(!same(&ScalarIr::Float(1.0), &ScalarIr::Int(1)));
        assert!(same(&ScalarIr::Int(3), &ScalarIr::Int(3)));
    }
}
