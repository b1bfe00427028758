//! What the model eats: one image with its class ([`ImageItem`]), and batches of them as
//! tensors ([`ImageBatch`], stacked by [`ImageBatcher`] for burn's data loader). Both datasets
//! (`shapes.rs`, `mnist.rs`) produce these items.

use burn::data::dataloader::batcher::Batcher;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

/// Image side, in pixels.
pub const SIDE: usize = 28;
/// Pixels per image.
pub const PIXELS: usize = SIDE * SIDE;
/// Number of classes in both datasets.
pub const NUM_CLASSES: usize = 10;

/// One grayscale image and its class.
#[derive(Clone, Debug)]
pub struct ImageItem {
    /// Row-major pixels in [0, 1].
    pub pixels: Vec<f32>,
    /// Class index.
    pub label: usize,
}

/// A batch: images `[n, 1, 28, 28]` and class indices `[n]`.
#[derive(Clone, Debug)]
pub struct ImageBatch<B: Backend> {
    /// The images.
    pub images: Tensor<B, 4>,
    /// The classes.
    pub targets: Tensor<B, 1, Int>,
}

/// Stacks [`ImageItem`]s into an [`ImageBatch`] on the requested device.
#[derive(Clone, Default)]
pub struct ImageBatcher;

impl<B: Backend> Batcher<B, ImageItem, ImageBatch<B>> for ImageBatcher {
    fn batch(&self, items: Vec<ImageItem>, device: &B::Device) -> ImageBatch<B> {
        let n = items.len();
        let mut pixels = Vec::with_capacity(n * PIXELS);
        let mut labels = Vec::with_capacity(n);
        for item in &items {
            pixels.extend_from_slice(&item.pixels);
            labels.push(item.label as i64);
        }
        ImageBatch {
            images: Tensor::from_data(TensorData::new(pixels, [n, 1, SIDE, SIDE]), device),
            targets: Tensor::from_data(TensorData::new(labels, [n]), device),
        }
    }
}
