//! `--export FILE`: the trained CNN as an MLX function file, which MLX Python
//! (`mx.import_function`), MLX C++ and mlx-swift run without Burn; beside it, reference inputs
//! and logits to check a deployment against (`scripts/check_mlxfn.py`).

use crate::cli::Args;
use crate::data::{ImageBatch, ImageBatcher, SIDE};
use crate::mnist::load_mnist;
use crate::predict::load_checkpoint;
use crate::shapes::{generate_validation_shapes, SHAPE_NAMES};
use burn::data::dataloader::batcher::Batcher;
use burn::tensor::Tensor;
use burn_mlx::export::{examples_path, export, save_examples, ExportOptions, MlxFunction};
use burn_mlx::{Mlx, MlxDevice};
use std::path::Path;

/// How many validation images the reference file holds (and the second exported batch size).
const CHECK_IMAGES: usize = 100;

/// Loads `dir/model.mpk` on `Mlx`, writes its forward pass to `file` for batches of 1 and of
/// [`CHECK_IMAGES`] images, reads the file back and checks it against the model on the
/// validation images, and saves those images and logits beside it.
pub fn export_checkpoint(
    dir: &Path,
    file: &Path,
    args: &Args,
    device: MlxDevice,
) -> Result<(), String> {
    let (config, model) = load_checkpoint::<Mlx>(dir, &device)?;
    let n = CHECK_IMAGES.min(config.valid_size);
    let items = if config.dataset == "mnist" {
        let data_dir = args
            .data_dir
            .as_deref()
            .ok_or("--export of an MNIST model needs --data-dir for its validation images")?;
        load_mnist(data_dir, "t10k", n)?
    } else {
        generate_validation_shapes(n, config.seed)
    };
    let batch: ImageBatch<Mlx> = ImageBatcher.batch(items, &device);
    let images = batch.images;
    let one = images.clone().narrow(0, 0, 1);

    let classes: Vec<String> = if config.dataset == "shapes" {
        SHAPE_NAMES.iter().map(|s| format!("\"{s}\"")).collect()
    } else {
        (0..10).map(|d| format!("\"{d}\"")).collect()
    };
    let options = ExportOptions {
        metadata: format!(
            "{{\"model\": \"burn-mlx train example CNN\", \"dataset\": \"{}\", \
             \"input\": \"images, float32 [N, 1, {SIDE}, {SIDE}], values in [0, 1]\", \
             \"output\": \"logits, float32 [N, {}]\", \"batch_sizes\": [1, {n}], \
             \"classes\": [{}]}}",
            config.dataset,
            classes.len(),
            classes.join(", ")
        ),
        ..ExportOptions::default()
    };
    export(
        file,
        [one, images.clone()],
        &options,
        |x: Tensor<Mlx, 4>| model.forward(x),
    )
    .map_err(|e| e.to_string())?;

    // The file read back, against the model itself.
    let logits = model.forward(images.clone());
    let imported: Tensor<Mlx, 2> = MlxFunction::load(file)
        .and_then(|f| f.call(images.clone()))
        .map_err(|e| e.to_string())?;
    let diff: f32 = (imported - logits.clone()).abs().max().into_scalar();
    let examples = examples_path(file);
    save_examples(
        &examples,
        &[images.into_primitive().tensor()],
        &[logits.into_primitive().tensor()],
    )
    .map_err(|e| e.to_string())?;
    let bytes = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
    println!(
        "exported: {} ({bytes} bytes; batches of 1 and {n} images on {device:?}); read back, its \
         logits on {n} validation images differ from the model's by at most {diff:.2e}",
        file.display()
    );
    println!(
        "MLX Python check: python3 scripts/check_mlxfn.py {} {}",
        file.display(),
        examples.display()
    );
    Ok(())
}
