//! A per-thread record of the scalar arrays that ops create from Burn scalars, and the means to
//! hand ops other arrays in their place.
//!
//! [`crate::compile::op_stream`] compiles a recurring block of Burn ops into one MLX function. The Burn
//! scalars in those ops (a learning rate, Adam's bias corrections) change from step to step, so
//! they must be inputs of the compiled function rather than constants traced into it. Every op
//! turns a Burn scalar into an MLX array through `tensor::scalar_array`, which calls
//! [`capture`]: while a tape is recording, it notes each scalar; while a tape is replacing, it
//! returns the traced function's input in place of the constant for the scalars bound to one.
//!
//! Its own module, so that `tensor.rs` (which calls it) and `op_stream` (which sets it) do not
//! import each other.

use burn_backend::Scalar;
use burn_ir::ScalarIr;
use mlx_rs::{Array, Dtype};
use std::cell::RefCell;

/// One scalar an op turned into an array: its value and the dtype of the array.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Captured {
    pub value: ScalarIr,
    pub dtype: Dtype,
}

/// Whether two scalars are the same value of the same kind (floats compared bit for bit, so a
/// NaN equals itself and 0.0 differs from -0.0).
pub(crate) fn same(a: &ScalarIr, b: &ScalarIr) -> bool {
    match (a, b) {
        (ScalarIr::Float(x), ScalarIr::Float(y)) => x.to_bits() == y.to_bits(),
        _ => a == b,
    }
}

/// What the tape does with each scalar array an op asks for.
enum Mode {
    /// Notes every scalar; ops get their constant arrays as usual.
    Record(Vec<Captured>),
    /// The `n`-th scalar asked for gets `arrays[n]` when it is `Some` (an input of the function
    /// being traced), its constant otherwise; every scalar is noted, so that the caller can check
    /// that the ops asked for the same scalars in the same order as when they were recorded.
    Replace {
        arrays: Vec<Option<Array>>,
        seen: Vec<Captured>,
    },
}

thread_local! {
    static TAPE: RefCell<Option<Mode>> = const { RefCell::new(None) };
}

/// Called by `tensor::scalar_array` with the array it would build (`make`).
pub(crate) fn capture(value: Scalar, dtype: Dtype, make: impl FnOnce() -> Array) -> Array {
    TAPE.with(|tape| {
        let mut tape = tape.borrow_mut();
        let value = ScalarIr::from(value);
        match tape.as_mut() {
            None => make(),
            Some(Mode::Record(seen)) => {
                seen.push(Captured { value, dtype });
                make()
            }
            Some(Mode::Replace { arrays, seen }) => {
                let index = seen.len();
                seen.push(Captured { value, dtype });
                match arrays.get(index) {
                    Some(Some(input)) if input.dtype() == dtype => input.clone(),
                    _ => make(),
                }
            }
        }
    })
}

/// A tape active on this thread until it is finished or dropped; it restores whatever tape was
/// active before it.
pub(crate) struct Tape {
    previous: Option<Mode>,
    active: bool,
}

impl Tape {
    /// Starts recording the scalars asked for.
    pub(crate) fn record() -> Self {
        Self::start(Mode::Record(Vec::new()))
    }

    /// Starts handing `arrays[n]` (where `Some`) to the `n`-th scalar asked for.
    pub(crate) fn replace(arrays: Vec<Option<Array>>) -> Self {
        Self::start(Mode::Replace {
            arrays,
            seen: Vec::new(),
        })
    }

    fn start(mode: Mode) -> Self {
        Tape {
            previous: TAPE.with(|t| t.replace(Some(mode))),
            active: true,
        }
    }

    /// The number of scalars asked for so far.
    pub(crate) fn len(&self) -> usize {
        TAPE.with(|t| match t.borrow().as_ref() {
            Some(Mode::Record(seen)) | Some(Mode::Replace { seen, .. }) => seen.len(),
            None => 0,
        })
    }

    /// Stops the tape and returns the scalars asked for while it was active.
    pub(crate) fn finish(mut self) -> Vec<Captured> {
        self.active = false;
        let previous = self.previous.take();
        match TAPE.with(|t| t.replace(previous)) {
            Some(Mode::Record(seen)) | Some(Mode::Replace { seen, .. }) => seen,
            None => Vec::new(),
        }
    }
}

impl Drop for Tape {
    fn drop(&mut self) {
        if self.active {
            let previous = self.previous.take();
            TAPE.with(|t| t.replace(previous));
        }
    }
}
