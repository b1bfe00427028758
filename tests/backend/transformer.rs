//! A tiny Transformer encoder (burn-nn: embeddings, multi-head attention with a causal mask,
//! layer norm, GELU feed-forward, dropout) trained on `Autodiff<Mlx>`.
//!
//! - `transformer_loss_falls_on_mlx`: with dropout 0.1, a few dozen Adam steps of next-token
//!   prediction on a deterministic sequence task make the loss fall.
//! - `transformer_parity_*`: with dropout 0 (dropout masks come from each backend's own random
//!   generator, so they cannot match), the same initial record and batches give the same losses
//!   on `Autodiff<Mlx>` and `Autodiff<NdArray>`, step by step, within [`LOSS_TOL`], and the
//!   trained models give the same loss on new sequences. With SGD the final parameters must also
//!   agree within [`PARAM_TOL`]. With Adam they are not compared one by one: the key projection's
//!   bias has an exactly zero gradient in exact arithmetic (softmax ignores a shift shared by all
//!   keys), so each backend's rounding noise, divided by its own RMS, moves it by up to a whole
//!   step in a random direction. It does not change what the model computes.

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use burn_autodiff::Autodiff;
use burn_mlx::{Mlx, MlxDevice};
use burn_ndarray::{NdArray, NdArrayDevice};
use burn_nn::attention::generate_autoregressive_mask;
use burn_nn::loss::CrossEntropyLossConfig;
use burn_nn::transformer::{TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput};
use burn_nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn_optim::momentum::MomentumConfig;
use burn_optim::{AdamConfig, GradientsParams, Optimizer, SgdConfig};

type MlxAd = Autodiff<Mlx>;
type NdAd = Autodiff<NdArray>;

const VOCAB: usize = 12;
const SEQ: usize = 10;
const D_MODEL: usize = 32;
/// Relative (and absolute floor) tolerance for the loss at each parity step.
const LOSS_TOL: (f64, f64) = (1e-4, 1e-6);
/// Relative and absolute tolerance for the parameters after the parity steps.
const PARAM_TOL: (f64, f64) = (1e-3, 1e-4);

/// Token + position embeddings → encoder (2 layers, 4 heads) → vocabulary logits.
#[derive(Module, Debug)]
struct TinyLm<B: Backend> {
    tokens: Embedding<B>,
    positions: Embedding<B>,
    encoder: TransformerEncoder<B>,
    head: Linear<B>,
}

impl<B: Backend> TinyLm<B> {
    fn new(dropout: f64, device: &B::Device) -> Self {
        Self {
            tokens: EmbeddingConfig::new(VOCAB, D_MODEL).init(device),
            positions: EmbeddingConfig::new(SEQ, D_MODEL).init(device),
            encoder: TransformerEncoderConfig::new(D_MODEL, 64, 4, 2)
                .with_dropout(dropout)
                .init(device),
            head: LinearConfig::new(D_MODEL, VOCAB).init(device),
        }
    }

    /// Mean next-token cross-entropy of `tokens` `[batch, SEQ]`.
    fn loss(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        let device = tokens.device();
        let [batch, seq] = tokens.dims();
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &device)
            .reshape([1, seq])
            .repeat_dim(0, batch);
        let x = self.tokens.forward(tokens.clone()) + self.positions.forward(positions);
        let mask = generate_autoregressive_mask::<B>(batch, seq, &device);
        let h = self
            .encoder
            .forward(TransformerEncoderInput::new(x).mask_attn(mask));
        let logits = self.head.forward(h); // [batch, seq, vocab]
        let inputs = logits
            .slice([0..batch, 0..seq - 1])
            .reshape([batch * (seq - 1), VOCAB]);
        let targets = tokens
            .slice([0..batch, 1..seq])
            .reshape([batch * (seq - 1)]);
        CrossEntropyLossConfig::new()
            .init(&device)
            .forward(inputs, targets)
    }
}

/// Batches of a learnable sequence task: each row counts up by a row-specific step modulo
/// VOCAB, so the next token follows from the previous two.
fn batches(batch: usize, count: usize, seed: u64) -> Vec<TensorData> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state >> 33
    };
    (0..count)
        .map(|_| {
            let mut tokens = Vec::with_capacity(batch * SEQ);
            for _ in 0..batch {
                let start = next() as usize % VOCAB;
                let step = 1 + next() as usize % 3;
                tokens.extend((0..SEQ).map(|i| ((start + i * step) % VOCAB) as i64));
            }
            TensorData::new(tokens, [batch, SEQ])
        })
        .collect()
}

fn train<B: AutodiffBackend, O: Optimizer<TinyLm<B>, B>>(
    mut model: TinyLm<B>,
    mut optim: O,
    data: &[TensorData],
    lr: f64,
    device: &B::Device,
) -> (Vec<f64>, TinyLm<B>) {
    let mut losses = Vec::new();
    for tokens in data {
        let tokens = Tensor::<B, 2, Int>::from_data(tokens.clone(), device);
        let loss = model.loss(tokens);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        losses.push(loss.into_scalar().elem::<f64>());
        model = optim.step(lr, model, grads);
    }
    (losses, model)
}

fn close(a: f64, b: f64, (rel, abs): (f64, f64)) -> bool {
    (a - b).abs() <= abs + rel * b.abs()
}

fn parameters<B: Backend, M: Module<B>>(module: &M) -> Vec<Vec<f32>> {
    struct Collect(Vec<Vec<f32>>);
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0
                .push(param.val().into_data().convert::<f32>().to_vec().unwrap());
        }
    }
    let mut collect = Collect(Vec::new());
    module.visit(&mut collect);
    collect.0
}

#[test]
fn transformer_loss_falls_on_mlx() {
    let device = MlxDevice::Cpu;
    MlxAd::seed(&device, 21);
    let model = TinyLm::<MlxAd>::new(0.1, &device);
    let data = batches(16, 40, 5);
    let optim = AdamConfig::new().init::<MlxAd, TinyLm<MlxAd>>();
    let (losses, model) = train(model, optim, &data, 3e-3, &device);
    let first: f64 = losses[..5].iter().sum::<f64>() / 5.0;
    let last: f64 = losses[losses.len() - 5..].iter().sum::<f64>() / 5.0;
    println!("losses: {losses:.3?}");
    assert!(
        losses.iter().all(|l| l.is_finite()),
        "non-finite loss: {losses:?}"
    );
    assert!(
        last < 0.75 * first,
        "the loss should fall: first five {first:.4}, last five {last:.4}"
    );
    // Evaluation mode (no dropout, no autodiff) on fresh data also beats chance (ln 12 ≈ 2.48).
    let eval = model.valid();
    let tokens = Tensor::<Mlx, 2, Int>::from_data(batches(16, 1, 77).remove(0), &device);
    let eval_loss = eval.loss(tokens).into_scalar().elem::<f64>();
    println!("evaluation loss on new sequences: {eval_loss:.4}");
    assert!(
        eval_loss < (VOCAB as f64).ln() * 0.85,
        "eval loss {eval_loss}"
    );
}

/// The same initial weights on both backends.
fn initial_pair(seed: u64) -> (TinyLm<MlxAd>, TinyLm<NdAd>) {
    let (dm, dn) = (MlxDevice::Cpu, NdArrayDevice::Cpu);
    let nd = {
        let _rng = crate::common::ndarray_rng::ndarray_rng();
        NdAd::seed(&dn, seed);
        // Materialize the lazily initialized parameters before cloning (a clone of an
        // uninitialized module draws its own weights).
        let nd = TinyLm::<NdAd>::new(0.0, &dn);
        parameters(&nd);
        nd
    };
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = recorder.record(nd.clone().into_record(), ()).unwrap();
    let record = BinBytesRecorder::<FullPrecisionSettings>::default()
        .load(bytes, &dm)
        .unwrap();
    (TinyLm::<MlxAd>::new(0.0, &dm).load_record(record), nd)
}

/// Checks the per-step losses, then the trained models' loss on new sequences.
fn compare_runs(
    name: &str,
    (losses_mx, model_mx): &(Vec<f64>, TinyLm<MlxAd>),
    (losses_nd, model_nd): &(Vec<f64>, TinyLm<NdAd>),
) {
    println!("{name}: mlx losses {losses_mx:?}\n{name}: nd  losses {losses_nd:?}");
    for (step, (a, b)) in losses_mx.iter().zip(losses_nd).enumerate() {
        assert!(
            close(*a, *b, LOSS_TOL),
            "{name}: step {step}: loss {a} on Mlx vs {b} on NdArray (tolerance {LOSS_TOL:?})"
        );
    }
    let probe = batches(8, 1, 123).remove(0);
    let a = model_mx
        .valid()
        .loss(Tensor::from_data(probe.clone(), &MlxDevice::Cpu))
        .into_scalar()
        .elem::<f64>();
    let b = model_nd
        .valid()
        .loss(Tensor::from_data(probe, &NdArrayDevice::Cpu))
        .into_scalar()
        .elem::<f64>();
    println!("{name}: loss of the trained models on new sequences: {a} (Mlx), {b} (NdArray)");
    assert!(
        close(a, b, LOSS_TOL),
        "{name}: trained models differ on new data: {a} on Mlx vs {b} on NdArray"
    );
}

#[test]
fn transformer_parity_adam() {
    let (mx, nd) = initial_pair(22);
    let data = batches(8, 5, 9);
    let a = train(mx, AdamConfig::new().init(), &data, 3e-3, &MlxDevice::Cpu);
    let b = train(
        nd,
        AdamConfig::new().init(),
        &data,
        3e-3,
        &NdArrayDevice::Cpu,
    );
    compare_runs("adam", &a, &b);
}

#[test]
fn transformer_parity_sgd() {
    let (mx, nd) = initial_pair(23);
    let data = batches(8, 5, 10);
    let sgd = SgdConfig::new().with_momentum(Some(MomentumConfig::new()));
    let a = train(mx, sgd.init(), &data, 0.05, &MlxDevice::Cpu);
    let b = train(nd, sgd.init(), &data, 0.05, &NdArrayDevice::Cpu);
    compare_runs("sgd", &a, &b);
    let mut worst = 0.0f64;
    for (i, (p, q)) in parameters(&a.1).iter().zip(&parameters(&b.1)).enumerate() {
        assert_eq!(p.len(), q.len());
        for (j, (x, y)) in p.iter().zip(q).enumerate() {
            let (x, y) = (*x as f64, *y as f64);
            worst = worst.max((x - y).abs());
            assert!(
                close(x, y, PARAM_TOL),
                "sgd: parameter {i}[{j}]: {x} on Mlx vs {y} on NdArray (tolerance {PARAM_TOL:?})"
            );
        }
    }
    println!("sgd: largest parameter difference {worst:e}");
}
