//! Inference from a trained output folder: the model loaded from `model.mpk` on any backend,
//! its validation accuracy recomputed, and a few new images classified.

use crate::data::{ImageBatch, ImageBatcher, ImageItem, NUM_CLASSES};
use crate::learner::{recorder, TrainingConfig};
use crate::model::Cnn;
use crate::shapes::{generate_shapes, generate_validation_shapes, SHAPE_NAMES};
use burn::config::Config;
use burn::data::dataloader::batcher::Batcher;
use burn::module::Module;
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use std::path::Path;

/// Percentage of `items` the model classifies correctly.
pub fn accuracy<B: Backend>(model: &Cnn<B>, items: &[ImageItem], device: &B::Device) -> f64 {
    let mut correct = 0usize;
    for chunk in items.chunks(500) {
        let batch: ImageBatch<B> = ImageBatcher.batch(chunk.to_vec(), device);
        let predicted = model.forward(batch.images).argmax(1).flatten::<1>(0, 1);
        let hits = predicted.equal(batch.targets).int().sum().into_scalar();
        correct += burn::tensor::ElementConversion::elem::<i64>(hits) as usize;
    }
    100.0 * correct as f64 / items.len() as f64
}

/// Reads `dir/config.json` and loads `dir/model.mpk` on backend `B`.
pub fn load_checkpoint<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(TrainingConfig, Cnn<B>), String> {
    let config = TrainingConfig::load(dir.join("config.json"))
        .map_err(|e| format!("reading {}: {e}", dir.join("config.json").display()))?;
    let model = config
        .model
        .init(device)
        .load_file(dir.join("model"), &recorder(), device)
        .map_err(|e| format!("loading {}: {e}", dir.join("model.mpk").display()))?;
    Ok((config, model))
}

/// Loads `dir/model.mpk` on backend `B`, recomputes the validation accuracy (shapes dataset:
/// the validation images are regenerated from the seed in `config.json`), and classifies a few
/// freshly generated images. The record is backend-neutral, so a model trained on `Mlx` loads
/// on `NdArray` and gives the same results.
pub fn predict_from_checkpoint<B: Backend>(
    dir: &Path,
    device: &B::Device,
    seed: u64,
) -> Result<(), String> {
    let (config, model) = load_checkpoint::<B>(dir, device)?;
    println!(
        "loaded {} (trained {} epochs on {}, validation accuracy {:.2}%)",
        dir.join("model.mpk").display(),
        config.epochs,
        config.dataset,
        config.valid_accuracy
    );
    if config.dataset != "shapes" {
        println!("(predictions are shown for the generated shapes dataset only)");
        return Ok(());
    }
    let valid_items = generate_validation_shapes(config.valid_size, config.seed);
    println!(
        "validation accuracy recomputed with the loaded weights: {:.2}% ({} images)",
        accuracy(&model, &valid_items, device),
        valid_items.len()
    );
    // Images no training or validation run has seen: another seed of the generator.
    let items = generate_shapes(NUM_CLASSES, seed.wrapping_mul(31).wrapping_add(7_777));
    let batch: ImageBatch<B> = ImageBatcher.batch(items.clone(), device);
    let probs = softmax(model.forward(batch.images), 1);
    let probs: Vec<f32> = probs
        .into_data()
        .to_vec()
        .map_err(|e| format!("reading predictions: {e:?}"))?;
    let mut correct = 0;
    println!("predictions on {} new images:", items.len());
    for (item, p) in items.iter().zip(probs.chunks(NUM_CLASSES)) {
        let (best, prob) =
            p.iter().enumerate().fold(
                (0, f32::MIN),
                |acc, (i, &v)| if v > acc.1 { (i, v) } else { acc },
            );
        correct += usize::from(best == item.label);
        println!(
            "  {:<16} -> {:<16} p={:.3} {}",
            SHAPE_NAMES[item.label],
            SHAPE_NAMES[best],
            prob,
            if best == item.label { "ok" } else { "WRONG" }
        );
    }
    println!("  {correct}/{} correct", items.len());
    Ok(())
}
