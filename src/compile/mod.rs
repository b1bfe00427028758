//! The ways burn-mlx has MLX compile graphs.
//!
//! | Path | Default | Device | What it compiles | Use it when |
//! |------|---------|--------|------------------|-------------|
//! | [`auto`] | on for GPU graphs, off for CPU graphs (`BURN_MLX_FUSION`) | GPU (CPU on request) | every graph an evaluation meets that recurs with the same structure, behind the program's back, and kept only where measured faster | nothing to do on the GPU: plain Burn code on `Mlx` gets it unchanged (`BURN_MLX_FUSION=off` to compare, `on` to try it on the CPU) |
//! | [`function`] ([`compile`](function::compile), [`compile_float`](function::compile_float)) | off: called by hand | any | one Rust function over tensors, traced once per input signature and replayed | a pure elementwise-heavy function called many times with the same shapes (an activation, an optimizer update) |
//! | [`CompiledTrainer`](crate::grad::CompiledTrainer) (in [`grad`](crate::grad)) | off: called by hand | any | a whole training step: forward, MLX's backward and Adam | training on plain `Mlx` with Adam, where the step's shapes repeat: the fastest training step in burn-mlx's benchmarks |
//! | [`op_stream`] ([`MlxFused`](op_stream::MlxFused)) | off: a backend of its own, `Fusion<Mlx>` | any | the recurring blocks of ops that Burn's burn-fusion records, each as one MLX-compiled function | experiments with Burn's op stream, and the steps where it measures faster than `Mlx` |
//!
//! All of them end in MLX's `compile`, which traces a graph, simplifies it and fuses runs of
//! elementwise ops into single kernels. They differ in what is traced and who decides: [`auto`]
//! works on the MLX graph at evaluation time, [`function`] and `CompiledTrainer` on a function
//! the program hands over, and [`op_stream`] on Burn's own record of the ops. They compose: a
//! graph built by a compiled function or by `MlxFused` is still evaluated through [`auto`].

pub mod auto;
pub mod function;
pub mod op_stream;
