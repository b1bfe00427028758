//! burn-train's data loading and multi-threaded training on `Mlx`.
//!
//! - A `DataLoaderBuilder` with 4 workers whose `Batcher` makes `Autodiff<Mlx>` tensors inside
//!   the worker threads; the main thread consumes the batches as they come (forward, backward,
//!   gradients per batch) and trains on them. Every batch, gradient and the trained weights
//!   must equal a single-threaded run (`num_workers(0)`) and a direct loop without a loader.
//! - 4 threads each training its own model (`Autodiff<Mlx>` + Adam) at once, models created on
//!   the main thread and moved in: the losses and final weights must equal training the same
//!   models one after the other.
//!
//! CI-sized: a few seconds.

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use burn_autodiff::Autodiff;
use burn_mlx::{Mlx, MlxDevice};
use burn_nn::loss::CrossEntropyLossConfig;
use burn_nn::{Linear, LinearConfig, Relu};
use burn_optim::{AdamConfig, GradientsParams, Optimizer, SgdConfig};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::thread::ThreadId;

type B = Autodiff<Mlx>;
const CPU: MlxDevice = MlxDevice::Cpu;
const FEATURES: usize = 8;
const CLASSES: usize = 4;
const ITEMS: usize = 256;
const BATCH: usize = 16;
const WORKERS: usize = 4;

/// One sample: its index, features and label, all derived from the index.
#[derive(Clone, Debug)]
struct Item {
    id: usize,
    x: [f32; FEATURES],
    label: i64,
}

fn item(id: usize) -> Item {
    let mut x = [0f32; FEATURES];
    for (j, v) in x.iter_mut().enumerate() {
        *v = (((id * 31 + j * 17) % 97) as f32 / 97.0 - 0.5) * 2.0;
    }
    // The class is the largest of the first features, so the net can learn it.
    let label = (0..CLASSES).max_by(|&a, &b| x[a].total_cmp(&x[b])).unwrap() as i64;
    Item { id, x, label }
}

/// A batch: tensors made by the batcher, plus where and from what it was made.
#[derive(Clone, Debug)]
struct Batch {
    ids: Vec<usize>,
    thread: ThreadId,
    x: Tensor<B, 2>,
    y: Tensor<B, 1, Int>,
}

/// Makes `Autodiff<Mlx>` tensors on the loader's device, in whatever thread runs it.
#[derive(Clone)]
struct ItemBatcher;

impl Batcher<B, Item, Batch> for ItemBatcher {
    fn batch(&self, items: Vec<Item>, device: &MlxDevice) -> Batch {
        let n = items.len();
        let xs: Vec<f32> = items.iter().flat_map(|i| i.x).collect();
        let ys: Vec<i64> = items.iter().map(|i| i.label).collect();
        // Some work in the worker: normalise the rows, so the batch is a lazy graph and not
        // just a copy of host data.
        let x = Tensor::<B, 2>::from_data(TensorData::new(xs, [n, FEATURES]), device);
        let x = x.clone() - x.mean_dim(1);
        Batch {
            ids: items.iter().map(|i| i.id).collect(),
            thread: std::thread::current().id(),
            x,
            y: Tensor::from_data(TensorData::new(ys, [n]), device),
        }
    }
}

#[derive(Module, Debug)]
struct Net<B: Backend> {
    l1: Linear<B>,
    l2: Linear<B>,
    relu: Relu,
}

impl<B: Backend> Net<B> {
    /// A model with its weights drawn now. Burn initializes parameters lazily, on first use,
    /// and a clone of an unused model draws its own weights: the comparisons below need every
    /// copy to start from the same ones.
    fn new(device: &B::Device) -> Self {
        let net = Self {
            l1: LinearConfig::new(FEATURES, 16).init(device),
            l2: LinearConfig::new(16, CLASSES).init(device),
            relu: Relu::new(),
        };
        for linear in [&net.l1, &net.l2] {
            let _ = linear.weight.val();
            let _ = linear.bias.as_ref().map(|b| b.val());
        }
        net
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.l2.forward(self.relu.forward(self.l1.forward(x)))
    }

    fn weights(&self) -> Vec<f32> {
        let mut all: Vec<f32> = self.l1.weight.val().into_data().to_vec().unwrap();
        all.extend(self.l2.weight.val().into_data().to_vec::<f32>().unwrap());
        all.extend(
            self.l2
                .bias
                .as_ref()
                .unwrap()
                .val()
                .into_data()
                .to_vec::<f32>()
                .unwrap(),
        );
        all
    }
}

fn loader(workers: usize) -> Arc<dyn DataLoader<B, Batch>> {
    DataLoaderBuilder::new(ItemBatcher)
        .batch_size(BATCH)
        .num_workers(workers)
        .set_device(CPU)
        .build(InMemDataset::new((0..ITEMS).map(item).collect()))
}

fn host(batch: &Batch) -> (Vec<f32>, Vec<i64>) {
    (
        batch.x.clone().into_data().to_vec().unwrap(),
        batch.y.clone().into_data().to_vec().unwrap(),
    )
}

fn assert_close(what: &str, a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0f32, f32::max);
    assert!(worst <= tol, "{what}: differs by {worst:e}");
}

/// The gradient of `l1.weight` and the loss of a fixed model on one batch.
fn grad_and_loss(model: &Net<B>, batch: &Batch) -> (Vec<f32>, f32) {
    let loss = CrossEntropyLossConfig::new()
        .init(&CPU)
        .forward(model.forward(batch.x.clone()), batch.y.clone());
    let grads = loss.backward();
    let g = model.l1.weight.grad(&grads).unwrap();
    (g.into_data().to_vec().unwrap(), loss.into_scalar())
}

/// Trains a copy of `model` with SGD on `batches` in order; the losses and final weights.
fn train(model: &Net<B>, batches: &[Batch]) -> (Vec<f32>, Vec<f32>) {
    let mut model = model.clone();
    let mut optim = SgdConfig::new().init();
    let loss_fn = CrossEntropyLossConfig::new().init(&CPU);
    let mut losses = Vec::new();
    for _epoch in 0..2 {
        for batch in batches {
            let loss = loss_fn.forward(model.forward(batch.x.clone()), batch.y.clone());
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(0.1, model, grads);
            losses.push(loss.into_scalar());
        }
    }
    (losses, model.weights())
}

#[test]
fn four_worker_loader_matches_single_threaded() {
    <B as Backend>::seed(&CPU, 3);
    let model = Net::<B>::new(&CPU);
    let main = std::thread::current().id();

    // The reference: the same batcher called directly, in order, on this thread.
    let direct: Vec<Batch> = (0..ITEMS / BATCH)
        .map(|b| ItemBatcher.batch((b * BATCH..(b + 1) * BATCH).map(item).collect(), &CPU))
        .collect();
    let single: Vec<Batch> = loader(0).iter().collect();
    assert_eq!(single.len(), ITEMS / BATCH);

    // Stream the multi-threaded loader: each batch is used on arrival, on this thread.
    let multi = loader(WORKERS);
    assert_eq!(multi.num_items(), ITEMS);
    let mut streamed: BTreeMap<usize, (Vec<f32>, f32)> = BTreeMap::new();
    let mut kept = Vec::new();
    let mut threads = BTreeSet::new();
    for batch in multi.iter() {
        assert_eq!(batch.ids.len(), BATCH);
        assert_ne!(batch.thread, main, "a batch was made on the main thread");
        threads.insert(format!("{:?}", batch.thread));
        streamed.insert(batch.ids[0], grad_and_loss(&model, &batch));
        kept.push(batch);
    }
    assert!(
        threads.len() >= 2,
        "the batches came from {} worker thread(s)",
        threads.len()
    );
    eprintln!(
        "dataloader: {} batches from {} worker threads",
        kept.len(),
        threads.len()
    );

    // Same batches (as sets: workers interleave), same data, same gradients.
    kept.sort_by_key(|b| b.ids[0]);
    assert_eq!(kept.len(), direct.len());
    for ((m, s), d) in kept.iter().zip(&single).zip(&direct) {
        assert_eq!(m.ids, d.ids);
        assert_eq!(s.ids, d.ids);
        assert_eq!(host(m), host(d), "batch {}", d.ids[0]);
        assert_eq!(host(s), host(d), "batch {}", d.ids[0]);
        let (g_direct, l_direct) = grad_and_loss(&model, d);
        let (g_multi, l_multi) = &streamed[&d.ids[0]];
        assert_close("gradient", g_multi, &g_direct, 1e-6);
        assert_close("loss", &[*l_multi], &[l_direct], 1e-6);
    }

    // Training on the worker-made batches equals training on the direct ones.
    let (losses_multi, w_multi) = train(&model, &kept);
    let (losses_single, w_single) = train(&model, &single);
    let (losses_direct, w_direct) = train(&model, &direct);
    assert_close("losses (4 workers)", &losses_multi, &losses_direct, 1e-5);
    assert_close("losses (0 workers)", &losses_single, &losses_direct, 1e-5);
    assert_close("weights (4 workers)", &w_multi, &w_direct, 1e-5);
    assert_close("weights (0 workers)", &w_single, &w_direct, 1e-5);
    assert!(
        losses_direct.last().unwrap() < losses_direct.first().unwrap(),
        "training did not lower the loss: {losses_direct:?}"
    );
}

/// A deterministic batch for model `m`, step `s`.
fn step_batch(m: usize, s: usize) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    let ids: Vec<usize> = (0..BATCH)
        .map(|i| (m * 1000 + s * BATCH + i) % ITEMS)
        .collect();
    let xs: Vec<f32> = ids.iter().flat_map(|&i| item(i).x).collect();
    let ys: Vec<i64> = ids.iter().map(|&i| item(i).label).collect();
    (
        Tensor::from_data(TensorData::new(xs, [BATCH, FEATURES]), &CPU),
        Tensor::from_data(TensorData::new(ys, [BATCH]), &CPU),
    )
}

/// Trains `model` (model number `m`) with Adam for `steps` steps; the losses and weights.
fn train_own(m: usize, model: Net<B>, steps: usize) -> (Vec<f32>, Vec<f32>) {
    let mut model = model;
    let mut optim = AdamConfig::new().init();
    let loss_fn = CrossEntropyLossConfig::new().init(&CPU);
    let mut losses = Vec::with_capacity(steps);
    for s in 0..steps {
        let (x, y) = step_batch(m, s);
        let loss = loss_fn.forward(model.forward(x), y);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-2, model, grads);
        losses.push(loss.into_scalar());
    }
    (losses, model.weights())
}

#[test]
fn four_threads_train_own_models_like_sequential() {
    const THREADS: usize = 4;
    const STEPS: usize = 40;
    <B as Backend>::seed(&CPU, 5);
    let models: Vec<Net<B>> = (0..THREADS).map(|_| Net::new(&CPU)).collect();

    let sequential: Vec<_> = models
        .iter()
        .enumerate()
        .map(|(m, model)| train_own(m, model.clone(), STEPS))
        .collect();
    let threaded: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = models
            .iter()
            .enumerate()
            .map(|(m, model)| {
                let model = model.clone();
                s.spawn(move || train_own(m, model, STEPS))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (m, ((ls, ws), (lt, wt))) in sequential.iter().zip(&threaded).enumerate() {
        assert_close(&format!("model {m} losses"), lt, ls, 1e-5);
        assert_close(&format!("model {m} weights"), wt, ws, 1e-5);
        assert!(ls[STEPS - 1] < ls[0], "model {m} did not learn: {ls:?}");
    }
    // The models differ from each other (each thread really trained its own).
    assert_ne!(sequential[0].1, sequential[1].1);
    eprintln!("threads: {THREADS} models x {STEPS} Adam steps, threaded == sequential");
}
