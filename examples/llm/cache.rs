//! The key/value cache: per layer, one key and one value tensor `[1, kv_heads, capacity,
//! head_dim]` allocated once for the whole context. Each step writes its new positions in place
//! with `slice_assign` and attends over the filled prefix, so a token costs neither a
//! concatenation of the cache nor a recomputation of earlier positions.

use super::config::LlmConfig;
use super::error::{LlmError, Result};
use burn_tensor::backend::Backend;
use burn_tensor::{DType, Tensor};

/// The cached keys and values of one layer.
#[derive(Debug)]
pub struct LayerCache<B: Backend> {
    // `Option` so that a write can take the tensor out and hand `slice_assign` the only
    // reference: a backend may then update the buffer in place instead of copying it.
    keys: Option<Tensor<B, 4>>,
    values: Option<Tensor<B, 4>>,
}

impl<B: Backend> LayerCache<B> {
    /// Writes `keys`/`values` (`[1, kv_heads, seq, head_dim]`) at positions
    /// `offset..offset + seq` and returns the filled prefix `0..offset + seq` of both.
    pub fn write(
        &mut self,
        keys: Tensor<B, 4>,
        values: Tensor<B, 4>,
        offset: usize,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let [b, h, seq, d] = keys.dims();
        let end = offset + seq;
        let update = |slot: &mut Option<Tensor<B, 4>>, new: Tensor<B, 4>| {
            let cache = slot
                .take()
                .expect("layer cache is always filled between writes");
            let cache = cache.slice_assign([0..b, 0..h, offset..end, 0..d], new);
            let prefix = cache.clone().narrow(2, 0, end);
            *slot = Some(cache);
            prefix
        };
        let k = update(&mut self.keys, keys);
        let v = update(&mut self.values, values);
        (k, v)
    }
}

/// The cache of a whole model for one sequence (batch 1).
#[derive(Debug)]
pub struct KvCache<B: Backend> {
    layers: Vec<LayerCache<B>>,
    len: usize,
    capacity: usize,
    shape: [usize; 4],
}

impl<B: Backend> KvCache<B> {
    /// An empty cache for `capacity` positions, in `dtype` on `device`.
    pub fn new(config: &LlmConfig, capacity: usize, device: &B::Device, dtype: DType) -> Self {
        let shape = [1, config.num_kv_heads, capacity, config.head_dim];
        let layers = (0..config.num_layers)
            .map(|_| LayerCache {
                keys: Some(Tensor::zeros(shape, (device, dtype))),
                values: Some(Tensor::zeros(shape, (device, dtype))),
            })
            .collect();
        Self {
            layers,
            len: 0,
            capacity,
            shape,
        }
    }

    /// Positions filled so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has been written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the cache holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forgets the sequence (the buffers are kept and overwritten by the next prompt).
    pub fn reset(&mut self) {
        self.len = 0;
    }

    /// Forgets the last `n` positions (the next write overwrites them): a pipelined decode loop
    /// that ran one step past the end of the sequence takes it back.
    pub fn rewind(&mut self, n: usize) {
        self.len = self.len.saturating_sub(n);
    }

    /// Bytes the key/value buffers take in `dtype_size`-byte elements.
    pub fn bytes(&self, dtype_size: usize) -> usize {
        2 * self.layers.len() * self.shape.iter().product::<usize>() * dtype_size
    }

    /// Checks that `config` matches this cache and that `seq` more positions fit.
    pub fn check(&self, config: &LlmConfig, seq: usize) -> Result<()> {
        let expected = [1, config.num_kv_heads, self.capacity, config.head_dim];
        if self.layers.len() != config.num_layers || self.shape != expected {
            return Err(LlmError::Input(format!(
                "the cache was made for {} layers of {:?}, the model has {} layers of {:?}",
                self.layers.len(),
                self.shape,
                config.num_layers,
                expected
            )));
        }
        if self.len + seq > self.capacity {
            return Err(LlmError::Input(format!(
                "context full: {} cached + {seq} new positions exceed the cache's capacity of {} \
                 (raise --max-context)",
                self.len, self.capacity
            )));
        }
        Ok(())
    }

    /// The layer caches, for one forward pass.
    pub(super) fn layers(&mut self) -> &mut [LayerCache<B>] {
        &mut self.layers
    }

    /// Marks `seq` more positions as filled (after every layer wrote them).
    pub(super) fn advance(&mut self, seq: usize) {
        self.len += seq;
    }
}
