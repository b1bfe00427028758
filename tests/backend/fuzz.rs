//! Differential fuzzing: random programs of tensor ops run on burn-mlx and on burn-ndarray from
//! identical inputs, every intermediate result compared with a tolerance.
//!
//! Programs are drawn by proptest strategies: a rank-3 input of random shape, then 3–8 ops among
//! elementwise unary ops, broadcasting binary ops, reductions (keeping the rank), reshapes,
//! permutes, strided slices, batched matmul, cat, comparisons + `mask_where`, and softmax, and how
//! far into the harness's input stream the values start. Shape-dependent parameters are drawn as
//! raw numbers and resolved against the current shape, identically on both sides. When a program
//! fails, proptest shrinks it (fewer ops, simpler ops, smaller shapes and parameters) and the
//! failure shows the smallest failing program with the command that replays the run.
//!
//! `cargo test --test fuzz` runs a CI-sized number of cases. Environment:
//! - `BURN_MLX_FUZZ_CASES=N`: run N cases (default 2000, about a second in a debug build);
//! - `BURN_MLX_FUZZ_SECONDS=S`: keep going until S seconds have passed, in batches of
//!   `BATCH` cases whose seeds count up from the first (overrides the count);
//! - `BURN_MLX_FUZZ_SEED=X`: the seed of proptest's RNG (ChaCha; default 1). A seed and a case
//!   count always give the same programs, so a failure report names both to replay it.

use crate::common::*;
use burn_tensor::backend::Backend;
use burn_tensor::{activation, DType, Slice, Tensor, TensorData};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestError, TestRng, TestRunner};
use std::time::{Duration, Instant};

/// One op of a program, with raw random parameters resolved against the current shape.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Exp,
    Tanh,
    Sigmoid,
    Abs,
    Relu,
    SqrtAbs,
    Log1pAbs,
    Square,
    AddScalar(f32),
    MulScalar(f32),
    Add(u64),
    Sub(u64),
    Mul(u64),
    Div(u64),
    MaxPair(u64),
    MinPair(u64),
    SumDim(u64),
    MeanDim(u64),
    MaxDim(u64),
    MinDim(u64),
    Reshape(u64),
    Permute(u64),
    Slice(u64),
    Matmul(u64),
    Cat(u64),
    MaskWhere(u64),
    Softmax(u64),
    Clamp,
}

/// Draws one op. Parameters that depend on the current shape are raw `u64`s (see [`apply`]).
fn op_strategy() -> impl Strategy<Value = Op> {
    let p = || any::<u64>();
    let v = || -2.0f32..2.0;
    // Simpler ops first: proptest shrinks a failing op towards the earlier alternatives.
    prop_oneof![
        Just(Op::Exp),
        Just(Op::Tanh),
        Just(Op::Sigmoid),
        Just(Op::Abs),
        Just(Op::Relu),
        Just(Op::SqrtAbs),
        Just(Op::Log1pAbs),
        Just(Op::Square),
        Just(Op::Clamp),
        v().prop_map(Op::AddScalar),
        v().prop_map(Op::MulScalar),
        p().prop_map(Op::Add),
        p().prop_map(Op::Sub),
        p().prop_map(Op::Mul),
        p().prop_map(Op::Div),
        p().prop_map(Op::MaxPair),
        p().prop_map(Op::MinPair),
        p().prop_map(Op::SumDim),
        p().prop_map(Op::MeanDim),
        p().prop_map(Op::MaxDim),
        p().prop_map(Op::MinDim),
        p().prop_map(Op::Reshape),
        p().prop_map(Op::Permute),
        p().prop_map(Op::Slice),
        p().prop_map(Op::Matmul),
        p().prop_map(Op::Cat),
        p().prop_map(Op::MaskWhere),
        p().prop_map(Op::Softmax),
    ]
}

/// A program: the input shape, where its values start, and its ops.
#[derive(Clone, Debug, PartialEq)]
struct Program {
    shape: [usize; 3],
    /// How many seeds of the harness's input stream ([`Ctx::seed`]) to skip before drawing the
    /// inputs, so that programs see different values.
    skip: u8,
    ops: Vec<Op>,
}

/// Draws programs: dimensions 1–4 × 1–5 × 1–5 and 3–8 ops.
fn program_strategy() -> impl Strategy<Value = Program> {
    (
        [1usize..5, 1usize..6, 1usize..6],
        0u8..64,
        vec(op_strategy(), 3..9),
    )
        .prop_map(|(shape, skip, ops)| Program { shape, skip, ops })
}

/// The shape of a second operand that broadcasts onto `dims` (some dims set to 1).
fn bcast_shape(dims: [usize; 3], p: u64) -> [usize; 3] {
    let mut s = dims;
    for (i, d) in s.iter_mut().enumerate() {
        if (p >> (8 + i)) & 3 == 0 {
            *d = 1;
        }
    }
    s
}

/// Applies one op. Values are kept bounded (exp of clamped inputs, tanh before squaring…) so that
/// long programs stay within f32 tolerance.
fn apply<B: Backend>(ctx: &Ctx<B>, x: Tensor<B, 3>, op: Op) -> Tensor<B, 3> {
    let dims = x.dims();
    let dim = |p: u64| (p % 3) as usize;
    match op {
        Op::Exp => x.clamp(-4.0, 4.0).exp(),
        Op::Tanh => x.tanh(),
        Op::Sigmoid => activation::sigmoid(x),
        Op::Abs => x.abs(),
        Op::Relu => activation::relu(x),
        Op::SqrtAbs => x.abs().sqrt(),
        Op::Log1pAbs => (x.abs() + 1.0).log(),
        Op::Square => x.tanh().powf_scalar(2.0),
        Op::AddScalar(v) => x + v,
        Op::MulScalar(v) => x * v,
        Op::Add(p) => x + ctx.f(bcast_shape(dims, p), (-2.0, 2.0)),
        Op::Sub(p) => x - ctx.f(bcast_shape(dims, p), (-2.0, 2.0)),
        Op::Mul(p) => x * ctx.f(bcast_shape(dims, p), (-2.0, 2.0)),
        Op::Div(p) => x / ctx.f(bcast_shape(dims, p), Dist::nz(-2.0, 2.0, 0.5)),
        Op::MaxPair(p) => {
            let y = ctx.f(bcast_shape(dims, p), Dist::grid(-2.0, 2.0, 8.0));
            x.max_pair(y.expand(dims))
        }
        Op::MinPair(p) => {
            let y = ctx.f(bcast_shape(dims, p), Dist::grid(-2.0, 2.0, 8.0));
            x.min_pair(y.expand(dims))
        }
        Op::SumDim(p) => x.sum_dim(dim(p)),
        Op::MeanDim(p) => x.mean_dim(dim(p)),
        Op::MaxDim(p) => x.max_dim(dim(p)),
        Op::MinDim(p) => x.min_dim(dim(p)),
        Op::Reshape(p) => {
            let [a, b, c] = dims;
            let target = match p % 4 {
                0 => [a * b, c, 1],
                1 => [1, a, b * c],
                2 => [c, b, a],
                _ => [b, 1, a * c],
            };
            x.reshape(target)
        }
        Op::Permute(p) => {
            const PERMS: [[isize; 3]; 5] = [[0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]];
            x.permute(PERMS[(p % 5) as usize])
        }
        Op::Slice(p) => {
            let d = dim(p);
            let n = dims[d] as i64;
            let start = ((p >> 8) % n as u64) as i64;
            let end = start + 1 + ((p >> 16) % (n - start) as u64) as i64;
            let step = [1i64, 2, -1, -2][((p >> 24) % 4) as usize];
            x.slice_dim(
                d,
                Slice::new(start as isize, Some(end as isize), step as isize),
            )
        }
        Op::Matmul(p) => {
            let k = 1 + (p >> 8) as usize % 5;
            let batch = if (p >> 16) & 1 == 0 { dims[0] } else { 1 };
            let y = ctx.f([batch, dims[2], k], (-1.0, 1.0));
            // (burn-ndarray broadcasts the batch of one side only.)
            x.matmul(ctx.ref_expand(y, [dims[0], dims[2], k]))
        }
        Op::Cat(p) => {
            let d = dim(p);
            let mut s = dims;
            s[d] = 1 + (p >> 8) as usize % 3;
            let y = ctx.f(s, (-2.0, 2.0));
            if (p >> 12) & 1 == 0 {
                Tensor::cat(vec![x, y], d)
            } else {
                Tensor::cat(vec![y, x], d)
            }
        }
        Op::MaskWhere(p) => {
            // The mask compares fresh inputs (identical on both sides), so near-ties of computed
            // values cannot flip it.
            let a = ctx.f(dims, Dist::grid(-1.0, 1.0, 4.0));
            let b = ctx.f(bcast_shape(dims, p), Dist::grid(-1.0, 1.0, 4.0));
            let mask = match (p >> 4) % 4 {
                0 => a.greater(b.expand(dims)),
                1 => a.lower_equal(b.expand(dims)),
                2 => a.equal(b.expand(dims)),
                _ => a.greater_elem(0.25),
            };
            let v = ctx.f(dims, (-2.0, 2.0));
            x.mask_where(mask, v)
        }
        Op::Softmax(p) => activation::softmax(x, dim(p)),
        Op::Clamp => x.clamp(-3.0, 3.0),
    }
}

/// One fuzz case: a program, run on each side.
struct FuzzCase<'a> {
    prog: &'a Program,
}

impl Case for FuzzCase<'_> {
    fn run<B: Backend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
        for _ in 0..self.prog.skip {
            ctx.seed();
        }
        let mut x = ctx.f(self.prog.shape, (-2.0, 2.0));
        let mut out = vec![x.clone().into_data()];
        for &op in &self.prog.ops {
            x = apply(ctx, x, op);
            out.push(x.clone().into_data());
        }
        out
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Tolerance for programs of several f32 ops (matmul and reductions included).
const FUZZ_TOL: Tol = Tol {
    rtol: 1e-3,
    atol: 1e-3,
};

/// Cases per run of the runner under `BURN_MLX_FUZZ_SECONDS`.
const BATCH: u32 = 500;

/// Runs a program on both backends and compares every intermediate (tests/common's harness).
fn check_program(prog: &Program) -> Result<(), TestCaseError> {
    let mut f = Failures::new("fuzz_op_programs");
    // A program with a matmul runs it in TF32 on CUDA (tests/common's `device_tol`).
    let has_matmul = prog.ops.iter().any(|op| matches!(op, Op::Matmul(_)));
    let tol = device_tol(
        if has_matmul {
            "matmul program"
        } else {
            "program"
        },
        DType::F32,
        FUZZ_TOL,
    );
    f.check(&FuzzCase { prog }, "program", DType::F32, DType::I64, tol);
    // `finish` panics with the differences; proptest catches the panic as this case's failure.
    f.finish();
    Ok(())
}

/// Proptest's RNG for `seed`: ChaCha, whose sequence proptest keeps the same across systems and
/// versions.
fn rng_for(seed: u64) -> TestRng {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..16].copy_from_slice(b"burn-mlx");
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

/// Runs `cases` programs drawn with `seed` through `check`. On a failure, the error holds the
/// smallest failing program proptest found, its failure, and the command that replays the run.
fn run_programs(
    seed: u64,
    cases: u32,
    check: impl Fn(&Program) -> Result<(), TestCaseError>,
) -> Result<(), String> {
    let config = Config {
        cases,
        // Replays come from the seed; nothing is written next to the sources.
        failure_persistence: None,
        rng_algorithm: RngAlgorithm::ChaCha,
        // Bounds the time spent shrinking a failure (each step runs both backends).
        max_shrink_iters: 2048,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(config, rng_for(seed));
    match runner.run(&program_strategy(), |prog| check(&prog)) {
        Ok(()) => Ok(()),
        Err(TestError::Fail(reason, smallest)) => Err(format!(
            "a program failed; the smallest failing program found is\n  {smallest:?}\nwith: \
             {reason}\nReplay: BURN_MLX_FUZZ_SEED={seed} BURN_MLX_FUZZ_CASES={cases} cargo test \
             --test fuzz"
        )),
        Err(TestError::Abort(reason)) => Err(format!(
            "proptest stopped: {reason} (BURN_MLX_FUZZ_SEED={seed} BURN_MLX_FUZZ_CASES={cases})"
        )),
    }
}

#[test]
fn fuzz_op_programs() {
    let first = env_u64("BURN_MLX_FUZZ_SEED").unwrap_or(1);
    let cases = env_u64("BURN_MLX_FUZZ_CASES").unwrap_or(2000);
    let cases = u32::try_from(cases).unwrap_or(u32::MAX);
    let deadline =
        env_u64("BURN_MLX_FUZZ_SECONDS").map(|s| Instant::now() + Duration::from_secs(s));
    let start = Instant::now();
    let (mut seed, mut run) = (first, 0u64);
    loop {
        let n = if deadline.is_some() { BATCH } else { cases };
        if let Err(e) = run_programs(seed, n, check_program) {
            panic!("fuzz_op_programs: {e}");
        }
        run += n as u64;
        seed += 1;
        match deadline {
            Some(t) if Instant::now() < t => {}
            _ => break,
        }
    }
    eprintln!(
        "fuzz: {run} cases (seeds {first}..{seed}) in {:.1} s",
        start.elapsed().as_secs_f64()
    );
}

/// A seed gives the same programs every time, and another seed other programs: what makes a
/// reported seed replayable.
#[test]
fn programs_are_reproducible_from_the_seed() {
    let draw = |seed: u64| {
        let mut runner = TestRunner::new_with_rng(Config::default(), rng_for(seed));
        (0..20)
            .map(|_| {
                program_strategy()
                    .new_tree(&mut runner)
                    .expect("a program")
                    .current()
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(draw(7), draw(7));
    assert_ne!(draw(7), draw(8));
}

/// A failing property is reported with a shrunk program and the replay command (here a stand-in
/// property, so that the check does not depend on a backend bug): every program with a matmul
/// fails, and the smallest such program is a matmul among ops that shrank to the simplest one.
#[test]
fn failures_name_the_smallest_program_and_the_replay() {
    let err = run_programs(3, 500, |prog| {
        if prog.ops.iter().any(|op| matches!(op, Op::Matmul(_))) {
            Err(TestCaseError::fail("has a matmul"))
        } else {
            Ok(())
        }
    })
    .expect_err("500 programs include a matmul");
    assert!(
        err.contains("Replay: BURN_MLX_FUZZ_SEED=3 BURN_MLX_FUZZ_CASES=500")
            && err.contains("has a matmul"),
        "{err}"
    );
    let smallest = "shape: [1, 1, 1], skip: 0, ops: [";
    assert!(err.contains(smallest), "not shrunk: {err}");
    assert_eq!(err.matches("Matmul(0)").count(), 1, "{err}");
    assert_eq!(err.matches("Exp").count(), 2, "{err}");
}
