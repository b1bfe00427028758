//! Training: the data, burn-train's `Learner` with Adam and the loss and accuracy metrics, then
//! the trained model and its `config.json` written to the output folder.

use crate::cli::{Args, DatasetKind};
use crate::data::ImageBatcher;
use crate::mnist::load_mnist;
use crate::model::{Cnn, CnnConfig};
use crate::predict::{accuracy, predict_from_checkpoint};
use crate::progress::EpochRenderer;
use crate::shapes::{generate_shapes, generate_validation_shapes};
use burn::config::Config;
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::AutodiffBackend;
use burn_optim::AdamConfig;
use burn_train::metric::{AccuracyMetric, LossMetric};
use burn_train::{Learner, SupervisedTraining};
use std::time::Instant;

/// What `config.json` in the output directory holds.
#[derive(Config, Debug)]
pub struct TrainingConfig {
    /// The model's hyper-parameters.
    pub model: CnnConfig,
    /// "shapes" or "mnist".
    pub dataset: String,
    /// Epochs trained.
    pub epochs: usize,
    /// Batch size.
    pub batch_size: usize,
    /// Adam's learning rate.
    pub lr: f64,
    /// Seed of data, shuffling and weights.
    pub seed: u64,
    /// Training images.
    pub train_size: usize,
    /// Validation images.
    pub valid_size: usize,
    /// Final validation accuracy, in percent.
    pub valid_accuracy: f64,
}

/// The recorder of every file this example writes: named MessagePack, full precision.
pub fn recorder() -> NamedMpkFileRecorder<FullPrecisionSettings> {
    NamedMpkFileRecorder::<FullPrecisionSettings>::new()
}

/// Generates or loads the data, trains with burn-train's `Learner`, saves the model and the
/// configuration, then reloads the checkpoint and predicts.
pub fn train<B: AutodiffBackend>(
    args: &Args,
    device: B::Device,
    backend_name: &str,
) -> Result<(), String> {
    let wall = Instant::now();
    let (train_items, valid_items) = match args.dataset {
        DatasetKind::Shapes => (
            generate_shapes(args.train_size, args.seed),
            generate_validation_shapes(args.valid_size, args.seed),
        ),
        DatasetKind::Mnist => {
            let dir = args
                .data_dir
                .as_deref()
                .expect("clap requires --data-dir with --dataset mnist");
            (
                load_mnist(dir, "train", args.train_size)?,
                load_mnist(dir, "t10k", args.valid_size)?,
            )
        }
    };
    println!(
        "burn-mlx training example: {backend_name} on {device:?}, dataset {:?}: {} training / {} \
         validation images, {} epochs, batch {}, Adam lr {}",
        args.dataset,
        train_items.len(),
        valid_items.len(),
        args.epochs,
        args.batch_size,
        args.lr
    );
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;

    B::seed(&device, args.seed);
    let model_config = CnnConfig::new();
    let model: Cnn<B> = model_config.init(&device);
    println!("model: {} parameters", model.num_params());

    let valid_set = InMemDataset::new(valid_items.clone());
    let loader_train = DataLoaderBuilder::new(ImageBatcher)
        .batch_size(args.batch_size)
        .shuffle(args.seed)
        .set_device(device.clone())
        .build(InMemDataset::new(train_items));
    let loader_valid = DataLoaderBuilder::new(ImageBatcher)
        .batch_size(args.batch_size.max(256))
        .set_device(device.clone())
        .build(valid_set);

    let training = SupervisedTraining::new(&args.out, loader_train, loader_valid)
        .metric_train_numeric(LossMetric::new())
        .metric_valid_numeric(LossMetric::new())
        .metric_train_numeric(AccuracyMetric::new())
        .metric_valid_numeric(AccuracyMetric::new())
        .with_file_checkpointer(recorder())
        .renderer(EpochRenderer::new())
        .num_epochs(args.epochs);
    let train_start = Instant::now();
    let result = training.launch(Learner::new(model, AdamConfig::new().init(), args.lr));
    let train_secs = train_start.elapsed().as_secs_f64();
    let model = result.model;

    // Exact accuracy over the whole validation set with the final weights.
    let valid_accuracy = accuracy(&model, &valid_items, &device);
    let model_path = args.out.join("model");
    model
        .clone()
        .save_file(&model_path, &recorder())
        .map_err(|e| format!("saving {}: {e}", model_path.display()))?;
    let config = TrainingConfig::new(
        model_config,
        format!("{:?}", args.dataset).to_lowercase(),
        args.epochs,
        args.batch_size,
        args.lr,
        args.seed,
        args.train_size,
        valid_items.len(),
        valid_accuracy,
    );
    config
        .save(args.out.join("config.json"))
        .map_err(|e| format!("saving config.json: {e}"))?;
    println!(
        "checkpoint: {} (+ config.json, burn-train checkpoints in {})",
        model_path.with_extension("mpk").display(),
        args.out.join("checkpoint").display()
    );

    // Inference from the checkpoint on disk, as a separate program would do it.
    if args.dataset == DatasetKind::Shapes {
        predict_from_checkpoint::<B::InnerBackend>(&args.out, &device, args.seed)?;
    }

    println!(
        "final validation accuracy: {valid_accuracy:.2}% ({} images); training {train_secs:.1}s, \
         wall time {:.1}s",
        valid_items.len(),
        wall.elapsed().as_secs_f64()
    );
    Ok(())
}
