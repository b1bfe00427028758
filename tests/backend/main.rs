//! burn-mlx's backend suite, as one test binary: every op family, autodiff and module op of
//! `Mlx` against burn-ndarray, hostile inputs and error paths, then training and the ways MLX
//! compiles graphs, against burn-ndarray or plain evaluation.
//!
//! One binary, as Burn's own backend tests are: each test file of the suite is a module here,
//! and the helpers in [`common`] are compiled once. Tests whose subject is process-wide state
//! (thresholds and counters of the automatic compile pass, the seeded random generator, the
//! resident memory) are in `tests/process/`, where they run one at a time.

// Burn's `#[derive(Module)]` expands to paths under `burn::`.
extern crate burn_core as burn;

#[macro_use]
mod common;

// Ops, autodiff and modules, against burn-ndarray.
mod autodiff_ops;
mod backend_smoke;
mod bool_ops;
mod decode;
mod decode_quantized;
mod decode_stack;
mod errors;
mod export;
mod float_ops;
mod fuzz;
mod half_precision;
mod hostile;
mod int_ops;
mod module_ops;
mod quantization;
mod smoke;
mod threads;

// Training, data loading and the compile paths.
mod compile;
mod dataloader;
mod training_parity;
mod transformer;
