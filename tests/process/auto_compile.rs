//! Automatic compilation (`burn_mlx::compile::auto`): recurring graphs evaluated through MLX's
//! `compile` give the same values as plain evaluation, arrays the program still holds keep their
//! values,
//! structures that differ only in a primitive's parameters are told apart, a graph the pass
//! gave up on does not keep another with the same top from being fused, and a recurring graph is
//! recognized without a full walk but never taken for another with the same top.
//!
//! The pass is off for CPU graphs by default; these tests turn it on for the CPU (MLX builds the
//! fused CPU kernels with the system C++ compiler, once, and caches them under the temporary
//! directory). The pass's state is process-wide, so the tests take turns.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Distribution, Tensor, TensorData, Tolerance};
use burn_autodiff::Autodiff;
use burn_mlx::compile::auto::{self, FusionStats};
use burn_mlx::{Mlx, MlxDevice};
use burn_nn::{Linear, LinearConfig, Relu};
use burn_optim::{AdamConfig, GradientsParams, Optimizer};
use std::sync::MutexGuard;

type Ad = Autodiff<Mlx>;

/// One test at a time: thresholds and counters are process-wide.
fn exclusive() -> MutexGuard<'static, ()> {
    let guard = crate::one_at_a_time();
    auto::clear();
    guard
}

/// The counters gained since `before`.
fn since(before: FusionStats) -> FusionStats {
    auto::stats().since(&before)
}

/// Runs `body` with CPU graphs compiled at their first sighting, then turns CPU fusion off
/// again; returns the counters gained meanwhile.
fn fused_on_cpu(body: impl FnOnce(&MlxDevice)) -> FusionStats {
    let device = MlxDevice::Cpu;
    auto::set_threshold(device, 1);
    let before = auto::stats();
    body(&device);
    let gained = since(before);
    auto::set_threshold(device, 0);
    gained
}

#[derive(Module, Debug)]
struct Mlp<B: burn::tensor::backend::Backend> {
    l1: Linear<B>,
    l2: Linear<B>,
    relu: Relu,
}

impl<B: burn::tensor::backend::Backend> Mlp<B> {
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.l2.forward(self.relu.forward(self.l1.forward(x)))
    }
}

/// Collects a module's float parameters as host data.
struct Values(Vec<TensorData>);

impl ModuleVisitor<Ad> for Values {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Ad, D>>) {
        self.0.push(param.val().into_data());
    }
}

/// Trains a copy of `model` for `steps` Adam steps with the pass compiling structures at their
/// `threshold`-th sighting (0: off); returns the losses and the final parameters.
fn train(model: &Mlp<Ad>, threshold: u32, steps: usize) -> (Vec<f32>, Vec<TensorData>) {
    let device = MlxDevice::Cpu;
    auto::set_threshold(device, threshold);
    let x = Tensor::<Ad, 2>::from_data(
        TensorData::new(
            (0..32).map(|i| ((i * 7 % 11) as f32) / 11.0).collect(),
            [4, 8],
        ),
        &device,
    );
    let y = Tensor::<Ad, 2>::from_data(
        TensorData::new(
            (0..16).map(|i| ((i * 5 % 3) as f32) - 1.0).collect(),
            [4, 4],
        ),
        &device,
    );
    let mut model = model.clone();
    let mut optim = AdamConfig::new().init::<Ad, Mlp<Ad>>();
    let mut losses = Vec::new();
    for _ in 0..steps {
        let loss = (model.forward(x.clone()) - y.clone()).powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-2, model, grads);
        losses.push(loss.into_scalar());
    }
    let mut values = Values(Vec::new());
    model.visit(&mut values);
    auto::set_threshold(device, 0);
    (losses, values.0)
}

#[test]
fn a_recurring_training_step_runs_fused_and_matches_plain_evaluation() {
    let _turn = exclusive();
    let device = MlxDevice::Cpu;
    let model = Mlp::<Ad> {
        l1: LinearConfig::new(8, 16).init(&device),
        l2: LinearConfig::new(16, 4).init(&device),
        relu: Relu::new(),
    };
    // Parameters are initialized lazily: initialize them once, so that both runs start alike.
    model.visit(&mut Values(Vec::new()));
    let (plain_losses, plain_params) = train(&model, 0, 8);
    let before = auto::stats();
    let (fused_losses, fused_params) = train(&model, 2, 8);
    let gained = since(before);
    assert!(
        gained.fused >= 4,
        "the step should run through a compiled graph from its second sighting on: {gained:?}"
    );
    assert_eq!(gained.failed, 0, "{gained:?}");
    assert!(
        gained.fused_primitives < gained.primitives,
        "compiled graphs should have fewer primitives: {gained:?}"
    );
    for (step, (a, b)) in plain_losses.iter().zip(&fused_losses).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs().max(1.0),
            "loss at step {step}: plain {a}, fused {b}"
        );
    }
    for (a, b) in plain_params.iter().zip(&fused_params) {
        a.assert_approx_eq::<f32>(b, Tolerance::absolute(1e-5));
    }
}

/// A chain of 20 elementwise ops (enough primitives for the pass), keeping its midpoint.
fn chain(x: Tensor<Mlx, 2>) -> (Tensor<Mlx, 2>, Tensor<Mlx, 2>) {
    let mut mid = x;
    for i in 0..10 {
        mid = mid * 0.5 + (i as f32) * 0.1;
    }
    let mut out = mid.clone();
    for _ in 0..10 {
        out = (out.clone() * out).sqrt() + 1.0;
    }
    (mid, out)
}

#[test]
fn arrays_held_by_the_program_keep_their_values() {
    let _turn = exclusive();
    let gained = fused_on_cpu(|device| {
        for round in 0..4 {
            let x = Tensor::<Mlx, 2>::random([3, 5], Distribution::Default, device);
            let host: Vec<f32> = x.to_data().to_vec().unwrap();
            let (mid, out) = chain(x);
            // Reading `out` evaluates a graph whose midpoint `mid` is still held here.
            let out: Vec<f32> = out.into_data().to_vec().unwrap();
            let mid: Vec<f32> = mid.into_data().to_vec().unwrap();
            for (i, &v) in host.iter().enumerate() {
                let mut m = v;
                for k in 0..10 {
                    m = m * 0.5 + (k as f32) * 0.1;
                }
                let mut o = m;
                for _ in 0..10 {
                    o = (o * o).sqrt() + 1.0;
                }
                assert!(
                    (mid[i] - m).abs() < 1e-5,
                    "round {round}: mid {} vs {m}",
                    mid[i]
                );
                assert!(
                    (out[i] - o).abs() < 1e-4,
                    "round {round}: out {} vs {o}",
                    out[i]
                );
            }
        }
    });
    assert!(gained.fused >= 4, "{gained:?}");
    // The first round compiles the structure; the later ones are recognized without a full walk.
    assert!(gained.recognized >= 3, "{gained:?}");
}

/// Two held arrays that compute the same expression, which MLX's `compile` may merge into one
/// result (its common-subexpression pass): both must still get the values. Also checks that the
/// pass's host-time counters move.
#[test]
fn held_arrays_that_compile_to_one_result_both_get_it() {
    let _turn = exclusive();
    let tanh_chain = |x: Tensor<Mlx, 2>| {
        let mut y = x;
        for i in 0..10 {
            y = (y * 0.5 + (i as f32) * 0.25).tanh();
        }
        y
    };
    let gained = fused_on_cpu(|device| {
        for round in 0..3 {
            let x = Tensor::<Mlx, 2>::random([2, 6], Distribution::Default, device);
            let host: Vec<f32> = x.to_data().to_vec().unwrap();
            let (a, b) = (tanh_chain(x.clone()), tanh_chain(x));
            let sum: Vec<f32> = (a.clone() + b.clone()).into_data().to_vec().unwrap();
            let a: Vec<f32> = a.into_data().to_vec().unwrap();
            let b: Vec<f32> = b.into_data().to_vec().unwrap();
            for (i, &v) in host.iter().enumerate() {
                let mut y = v as f64;
                for k in 0..10 {
                    y = (y * 0.5 + k as f64 * 0.25).tanh();
                }
                for (name, got) in [("a", a[i]), ("b", b[i]), ("a+b", sum[i] / 2.0)] {
                    assert!(
                        (got as f64 - y).abs() < 1e-5,
                        "round {round}, element {i}: {name} {got} vs {y}"
                    );
                }
            }
        }
    });
    assert!(gained.fused >= 2, "{gained:?}");
    assert!(
        gained.fused_primitives < gained.primitives,
        "compiled graphs should have fewer primitives: {gained:?}"
    );
    assert!(
        gained.pass_nanos > 0 && gained.call_nanos > 0 && gained.call_nanos < gained.pass_nanos,
        "the pass's host time includes its compiled-function calls: {gained:?}"
    );
}

#[test]
fn graphs_that_differ_only_in_parameters_are_told_apart() {
    let _turn = exclusive();
    let data: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let gained = fused_on_cpu(|device| {
        for round in 0..4 {
            // The same primitives, shapes and wiring; only the scanned axis differs.
            let axis = round % 2;
            let x = Tensor::<Mlx, 2>::from_data(TensorData::new(data.clone(), [4, 4]), device);
            let mut y = x;
            for _ in 0..8 {
                y = y * 1.0 + 0.0;
            }
            let sums: Vec<f32> = y.cumsum(axis).into_data().to_vec().unwrap();
            let expected: Vec<f32> = (0..16)
                .map(|i| {
                    let (r, c) = (i / 4, i % 4);
                    (0..=if axis == 0 { r } else { c })
                        .map(|k| {
                            if axis == 0 {
                                data[k * 4 + c]
                            } else {
                                data[r * 4 + k]
                            }
                        })
                        .sum()
                })
                .collect();
            assert_eq!(sums, expected, "round {round}, axis {axis}");
        }
    });
    assert!(gained.fused >= 2, "{gained:?}");
}

/// The first op of [`long_tail`]'s graphs.
type FirstOp = fn(Tensor<Mlx, 2>) -> Tensor<Mlx, 2>;

/// `first(x)`, then `ops` elementwise ops, summed to a scalar: graphs whose tops agree for the
/// last `ops` ops and differ only in `first`.
fn long_tail(x: Tensor<Mlx, 2>, first: FirstOp, ops: usize) -> f32 {
    let mut y = first(x);
    for i in 0..ops {
        y = y * 0.99 + (i % 3) as f32;
    }
    y.sum().into_scalar()
}

/// Evaluates the `exp` graph `rounds` times after the `log1p` one (which the pass gives up on:
/// MLX cannot compare `Log1p` primitives) and returns the evaluations that ran fused.
fn fused_after_a_given_up_graph(ops: usize, rounds: usize) -> u64 {
    let device = MlxDevice::Cpu;
    auto::set_threshold(device, 1);
    let x = Tensor::<Mlx, 2>::from_data(
        TensorData::new((0..15).map(|i| i as f32 / 15.0).collect(), [3, 5]),
        &device,
    );
    for _ in 0..2 {
        long_tail(x.clone(), |x| x.log1p(), ops);
    }
    // The `exp` graph's value, computed on the host.
    let expected: f64 = (0..15)
        .map(|i| {
            let mut y = (i as f64 / 15.0).exp();
            for k in 0..ops {
                y = y * 0.99 + (k % 3) as f64;
            }
            y
        })
        .sum();
    let before = auto::stats();
    for round in 0..rounds {
        let v = long_tail(x.clone(), |x| x.exp(), ops) as f64;
        assert!(
            (v - expected).abs() <= 1e-4 * expected.abs(),
            "round {round}: {v} vs {expected}"
        );
    }
    let fused = since(before).fused;
    auto::set_threshold(device, 0);
    fused
}

#[test]
fn a_graph_given_up_on_does_not_block_another_with_the_same_loss_on_top() {
    let _turn = exclusive();
    // 12 ops: the two graphs differ within the fingerprint's 64 nodes.
    let fused = fused_after_a_given_up_graph(12, 3);
    assert!(fused >= 2, "{fused} of 3 evaluations fused");
}

#[test]
fn a_graph_that_shares_a_given_up_fingerprint_is_fused_after_a_probe() {
    let _turn = exclusive();
    // 60 ops: the difference lies deeper than the fingerprint looks, so the `exp` graph is
    // skipped as given up until a probe (every 16th evaluation) walks it and lifts the mark.
    let fused = fused_after_a_given_up_graph(60, 24);
    assert!(fused >= 4, "{fused} of 24 evaluations fused");
}

/// Graphs with the same top (the fingerprint) and a different body, in runs of three: the first
/// graph of each run is told apart from the structure recognized before it (a wrong match would
/// give the other function's value), and the rest of the run is recognized.
#[test]
fn a_recognized_structure_is_not_taken_for_another_with_the_same_top() {
    let _turn = exclusive();
    // 40 ops: the bodies differ deeper than the fingerprint's 64 arrays (a depth-first walk
    // down the chain, two arrays per op), and the first op still weighs 0.99^40 in the value,
    // so exp and sin give sums that differ.
    let ops = 40;
    let data: Vec<f32> = (0..15).map(|i| i as f32 / 15.0).collect();
    let expected = |first: fn(f64) -> f64| -> f64 {
        data.iter()
            .map(|&v| {
                let mut y = first(v as f64);
                for k in 0..ops {
                    y = y * 0.99 + (k % 3) as f64;
                }
                y
            })
            .sum()
    };
    let runs: [(FirstOp, f64); 3] = [
        (|x| x.exp(), expected(f64::exp)),
        (|x| x.sin(), expected(f64::sin)),
        (|x| x.exp(), expected(f64::exp)),
    ];
    let gained = fused_on_cpu(|device| {
        let x = Tensor::<Mlx, 2>::from_data(TensorData::new(data.clone(), [3, 5]), device);
        for (run, (first, want)) in runs.iter().enumerate() {
            for round in 0..3 {
                let v = long_tail(x.clone(), *first, ops) as f64;
                assert!(
                    (v - want).abs() <= 1e-4 * want.abs(),
                    "run {run}, round {round}: {v} vs {want}"
                );
            }
        }
    });
    assert_eq!(gained.fused, 9, "{gained:?}");
    assert_eq!(gained.recognized, 6, "{gained:?}");
}

/// On MLX's CUDA device a recurring graph that holds one of burn-mlx's custom kernels (the
/// column sum of a bias-like gradient, 8,192 rows) is compiled and fused like any other, with
/// plain evaluation's values: MLX's custom kernels do not implement `is_equivalent`, and the pass
/// compares them by their state instead. Without a CUDA GPU this checks nothing and says so.
#[test]
fn a_graph_holding_a_custom_kernel_is_fused_on_the_gpu() {
    let _turn = exclusive();
    if !MlxDevice::gpu_available() || !cfg!(target_os = "linux") {
        println!("no CUDA GPU here: fusion around custom kernels is checked on a GPU machine");
        return;
    }
    let device = MlxDevice::Gpu;
    let default = auto::threshold(device);
    let x = Tensor::<Mlx, 2>::random([8192, 64], Distribution::Default, &device);
    let run = |threshold: u32| -> (Vec<TensorData>, FusionStats) {
        auto::set_threshold(device, threshold);
        let before = auto::stats();
        let sums = (0..6)
            .map(|i| {
                // Enough primitives for the pass (it leaves graphs of fewer than 16 to MLX).
                let mut y = x.clone() + i as f64;
                for _ in 0..8 {
                    y = (y * 0.5).tanh() + 0.25;
                }
                (y.sum_dim(0) * 0.5 - 3.0).into_data()
            })
            .collect();
        (sums, since(before))
    };
    let (plain, _) = run(0);
    let (fused, gained) = run(1);
    auto::set_threshold(device, default);
    assert!(
        gained.compiled >= 1 && gained.fused >= 1,
        "the graph should be compiled and run fused: {gained:?}"
    );
    assert_eq!(gained.failed, 0, "{gained:?}");
    for (a, b) in plain.iter().zip(&fused) {
        a.assert_approx_eq::<f32>(b, Tolerance::relative(1e-5));
    }
}
