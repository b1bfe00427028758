//! Differential fuzzing: random programs of tensor ops run on burn-mlx and on burn-ndarray from
//! identical inputs, every intermediate result compared with a tolerance.
//!
//! A program is drawn from a seed: a rank-3 input of random shape, then 3–8 ops among
//! elementwise unary ops, broadcasting binary ops, reductions (keeping the rank), reshapes,
//! permutes, strided slices, batched matmul, cat, comparisons + `mask_where`, and softmax.
//! Shape-dependent parameters are resolved against the current shape, identically on both sides.
//!
//! `cargo test --test fuzz` runs a CI-sized number of cases. Environment:
//! - `BURN_MLX_FUZZ_CASES=N`: run N cases (default 2000, well under a second);
//! - `BURN_MLX_FUZZ_SECONDS=S`: keep going until S seconds have passed (overrides the count);
//! - `BURN_MLX_FUZZ_SEED=X`: first seed (default 1); a failure report names the seed to replay.
#[macro_use]
mod common;

use burn_tensor::backend::Backend;
use burn_tensor::{activation, DType, Slice, Tensor, TensorData};
use common::*;
use std::time::{Duration, Instant};

/// One op of a program, with raw random parameters resolved against the current shape.
#[derive(Clone, Copy, Debug)]
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

fn draw_op(rng: &mut Rng) -> Op {
    let p = rng.next_u64();
    match rng.int(0, 28) {
        0 => Op::Exp,
        1 => Op::Tanh,
        2 => Op::Sigmoid,
        3 => Op::Abs,
        4 => Op::Relu,
        5 => Op::SqrtAbs,
        6 => Op::Log1pAbs,
        7 => Op::Square,
        8 => Op::AddScalar(rng.uniform(-2.0, 2.0) as f32),
        9 => Op::MulScalar(rng.uniform(-2.0, 2.0) as f32),
        10 => Op::Add(p),
        11 => Op::Sub(p),
        12 => Op::Mul(p),
        13 => Op::Div(p),
        14 => Op::MaxPair(p),
        15 => Op::MinPair(p),
        16 => Op::SumDim(p),
        17 => Op::MeanDim(p),
        18 => Op::MaxDim(p),
        19 => Op::MinDim(p),
        20 => Op::Reshape(p),
        21 => Op::Permute(p),
        22 => Op::Slice(p),
        23 => Op::Matmul(p),
        24 => Op::Cat(p),
        25 => Op::MaskWhere(p),
        26 => Op::Softmax(p),
        _ => Op::Clamp,
    }
}

/// A program: the input shape and its ops.
#[derive(Clone, Debug)]
struct Program {
    shape: [usize; 3],
    ops: Vec<Op>,
}

fn program(seed: u64) -> Program {
    let mut rng = Rng::new(seed);
    let shape = [
        rng.int(1, 5) as usize,
        rng.int(1, 6) as usize,
        rng.int(1, 6) as usize,
    ];
    let n = rng.int(3, 9) as usize;
    Program {
        shape,
        ops: (0..n).map(|_| draw_op(&mut rng)).collect(),
    }
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

/// One fuzz case: a program and its inputs, drawn from the seed.
struct FuzzCase {
    prog: Program,
}

impl Case for FuzzCase {
    fn run<B: Backend>(&self, ctx: &Ctx<B>) -> Vec<TensorData> {
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

#[test]
fn fuzz_op_programs() {
    let first = env_u64("BURN_MLX_FUZZ_SEED").unwrap_or(1);
    let cases = env_u64("BURN_MLX_FUZZ_CASES").unwrap_or(2000);
    let deadline =
        env_u64("BURN_MLX_FUZZ_SECONDS").map(|s| Instant::now() + Duration::from_secs(s));
    let start = Instant::now();
    let mut f = Failures::new("fuzz_op_programs");
    let mut run = 0u64;
    let mut seed = first;
    loop {
        let done = match deadline {
            Some(t) => Instant::now() >= t,
            None => run >= cases,
        };
        if done {
            break;
        }
        let prog = program(seed);
        let label = format!("seed {seed}: {prog:?}");
        f.check(&FuzzCase { prog }, &label, DType::F32, DType::I64, FUZZ_TOL);
        run += 1;
        seed += 1;
    }
    eprintln!(
        "fuzz: {run} cases (seeds {first}..{seed}) in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    f.finish();
}
