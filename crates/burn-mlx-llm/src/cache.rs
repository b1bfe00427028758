//! The key/value cache: per layer, one key and one value tensor `[batch, kv_heads, capacity,
//! head_dim]` allocated once for the whole context. Each step writes its new positions in place
//! with `slice_assign` and attends over the filled prefix, so a token costs neither a
//! concatenation of the cache nor a recomputation of earlier positions.
//!
//! Where `burn_mlx::decode`'s CUDA kernels run, each layer holds its keys and values in one
//! buffer (`[batch, 2·kv_heads, capacity, head_dim]`, [`LayerCache::from_joint`]), and a decode
//! step's kernels write the new position into it themselves (see
//! `burn_mlx::decode::NormQkv::cache`), so the step has no cache update of its own.
//!
//! A step's first position is either known on the host ([`Position::Host`]: prefill and the
//! eager decode step, which attend over the filled prefix) or held in a device tensor
//! ([`Position::Device`]: the fixed-shape decode step of `step.rs`, which attends over the
//! whole buffer with the positions not yet written masked out, so that its graph is the same at
//! every position and MLX can compile it once).

use super::config::LlmConfig;
use super::error::{LlmError, Result};
use burn_mlx::fast::slice_assign_at;
use burn_tensor::backend::Backend;
use burn_tensor::{Bool, DType, Int, Tensor, TensorData};

/// Where the positions of a forward pass start.
#[derive(Debug, Clone)]
pub enum Position<B: Backend> {
    /// Known on the host: the pass attends over the cache's filled prefix.
    Host(usize),
    /// In a device tensor: the pass attends over every cached position, with `bias` (0 for
    /// positions up to the step's own, -inf after) added to the attention scores.
    Device {
        /// The first position, `[1]`.
        offset: Tensor<B, 1, Int>,
        /// The additive attention mask, `[1, 1, 1, capacity]`, in the model's dtype.
        bias: Tensor<B, 4>,
        /// The mask of sliding layers (Gemma 3), which also hides the positions that fell out
        /// of their window.
        sliding_bias: Option<Tensor<B, 4>>,
    },
}

impl<B: Backend> Position<B> {
    /// The device form for one new position at `offset` in a cache of `capacity` positions,
    /// with the mask of sliding layers of `window` positions if the model has them.
    pub fn device(
        offset: Tensor<B, 1, Int>,
        capacity: usize,
        dtype: DType,
        window: Option<usize>,
    ) -> Self {
        let device = offset.device();
        let keys = Tensor::<B, 1, Int>::arange(0..capacity as i64, &device).unsqueeze::<2>();
        let at = offset.clone().unsqueeze::<2>().expand([1, capacity]);
        let bias = |hidden| additive_mask(hidden, &device, dtype);
        let later = keys.clone().greater(at.clone());
        let sliding_bias = window.map(|w| bias(later.clone().bool_or(too_old(keys, at, w))));
        Position::Device {
            offset,
            bias: bias(later),
            sliding_bias,
        }
    }
}

/// Where key position `keys` lies `window` or more positions before query position `queries`
/// (out of a sliding layer's window).
fn too_old<B: Backend>(
    keys: Tensor<B, 2, Int>,
    queries: Tensor<B, 2, Int>,
    window: usize,
) -> Tensor<B, 2, Bool> {
    (keys + window as i64).lower_equal(queries)
}

/// `[1, 1, rows, cols]`: 0 where `hidden` is false, -inf where it is true, in `dtype`.
fn additive_mask<B: Backend>(
    hidden: Tensor<B, 2, Bool>,
    device: &B::Device,
    dtype: DType,
) -> Tensor<B, 4> {
    Tensor::<B, 2>::zeros(hidden.dims(), (device, dtype))
        .mask_fill(hidden, f32::NEG_INFINITY)
        .unsqueeze::<4>()
}

/// The additive mask `[1, 1, seq, offset + seq]` of a sliding layer for query positions
/// `offset..offset + seq` over the keys `0..offset + seq`: each query sees itself and the
/// `window - 1` positions before it. Built on the device, once per forward pass.
pub fn sliding_band<B: Backend>(
    offset: usize,
    seq: usize,
    window: usize,
    device: &B::Device,
    dtype: DType,
) -> Tensor<B, 4> {
    let end = offset + seq;
    let queries = Tensor::<B, 1, Int>::arange(offset as i64..end as i64, device)
        .reshape([seq, 1])
        .expand([seq, end]);
    let keys = Tensor::<B, 1, Int>::arange(0..end as i64, device)
        .reshape([1, end])
        .expand([seq, end]);
    let later = keys.clone().greater(queries.clone());
    additive_mask(later.bool_or(too_old(keys, queries, window)), device, dtype)
}

/// The additive mask `[batch, 1, seq, offset + seq]` of a padded batch for query positions
/// `offset..offset + seq` over the keys `0..offset + seq`: causal, with the first `padding[i]`
/// keys hidden from row `i` (a padded query still sees itself, so that no row of scores is all
/// `-inf`), and with a sliding layer's `window` if given. Built on the device, once per forward
/// pass.
pub fn padded_mask<B: Backend>(
    offset: usize,
    seq: usize,
    padding: &[usize],
    window: Option<usize>,
    device: &B::Device,
    dtype: DType,
) -> Tensor<B, 4> {
    let (batch, end) = (padding.len(), offset + seq);
    let queries = Tensor::<B, 1, Int>::arange(offset as i64..end as i64, device)
        .reshape([1, seq, 1])
        .expand([batch, seq, end]);
    let keys = Tensor::<B, 1, Int>::arange(0..end as i64, device)
        .reshape([1, 1, end])
        .expand([batch, seq, end]);
    let pads: Vec<i64> = padding.iter().map(|&p| p as i64).collect();
    let pads = Tensor::<B, 1, Int>::from_data(TensorData::new(pads, [batch]), device)
        .reshape([batch, 1, 1])
        .expand([batch, seq, end]);
    let padded = keys
        .clone()
        .lower(pads)
        .bool_and(keys.clone().not_equal(queries.clone()));
    let mut hidden = keys.clone().greater(queries.clone()).bool_or(padded);
    if let Some(w) = window {
        hidden = hidden.bool_or((keys + w as i64).lower_equal(queries));
    }
    Tensor::<B, 3>::zeros([batch, seq, end], (device, dtype))
        .mask_fill(hidden, f32::NEG_INFINITY)
        .unsqueeze_dim::<4>(1)
}

/// The cached keys and values of one layer: two buffers, or one that holds the keys' heads and
/// then the values' ("joint": a decode step then writes both with one update).
#[derive(Debug)]
pub struct LayerCache<B: Backend> {
    // `Option` so that a write can take the tensor out and hand `slice_assign` the only
    // reference: a backend may then update the buffer in place instead of copying it.
    keys: Option<Tensor<B, 4>>,
    values: Option<Tensor<B, 4>>,
    /// `[batch, 2·kv_heads, capacity, head_dim]`, in place of `keys` and `values`.
    joint: Option<Tensor<B, 4>>,
}

const FILLED: &str = "layer cache is always filled between writes";

/// Writes `new` into the buffer in `slot` at `position` along the positions axis (2), and
/// returns the buffer.
fn update<B: Backend>(
    slot: &mut Option<Tensor<B, 4>>,
    new: Tensor<B, 4>,
    position: &Position<B>,
) -> Tensor<B, 4> {
    let [b, h, seq, d] = new.dims();
    let cache = slot.take().expect(FILLED);
    let cache = match position {
        Position::Host(offset) => {
            cache.slice_assign([0..b, 0..h, *offset..offset + seq, 0..d], new)
        }
        Position::Device { offset, .. } => slice_assign_at(cache, new, 2, offset.clone()),
    };
    *slot = Some(cache.clone());
    cache
}

/// The keys and the values of a joint buffer (views of its two halves of heads).
fn halves<B: Backend>(joint: Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let h = joint.dims()[1] / 2;
    (joint.clone().narrow(1, 0, h), joint.narrow(1, h, h))
}

impl<B: Backend> LayerCache<B> {
    /// The key and value buffers of a layer (`[batch, kv_heads, capacity, head_dim]` each).
    pub fn from_tensors(keys: Tensor<B, 4>, values: Tensor<B, 4>) -> Self {
        Self {
            keys: Some(keys),
            values: Some(values),
            joint: None,
        }
    }

    /// One buffer of a layer's keys and values, `[batch, 2·kv_heads, capacity, head_dim]` (the keys'
    /// heads, then the values').
    pub fn from_joint(kv: Tensor<B, 4>) -> Self {
        Self {
            keys: None,
            values: None,
            joint: Some(kv),
        }
    }

    /// The buffer of keys and values side by side, when the layer has one
    /// ([`from_joint`](Self::from_joint)).
    pub fn joint(&self) -> Option<&Tensor<B, 4>> {
        self.joint.as_ref()
    }

    /// Whether the keys and values are one buffer ([`from_joint`](Self::from_joint)).
    pub fn is_joint(&self) -> bool {
        self.joint.is_some()
    }

    /// Sequences the buffers hold.
    pub fn batch(&self) -> usize {
        self.joint
            .as_ref()
            .or(self.keys.as_ref())
            .expect(FILLED)
            .dims()[0]
    }

    /// Positions the buffers hold.
    pub fn capacity(&self) -> usize {
        self.joint
            .as_ref()
            .or(self.keys.as_ref())
            .expect(FILLED)
            .dims()[2]
    }

    /// The key and value buffers, shared (the cache keeps them).
    pub fn tensors(&self) -> (Tensor<B, 4>, Tensor<B, 4>) {
        match &self.joint {
            Some(joint) => halves(joint.clone()),
            None => (
                self.keys.clone().expect(FILLED),
                self.values.clone().expect(FILLED),
            ),
        }
    }

    /// The key and value buffers.
    pub fn into_tensors(self) -> (Tensor<B, 4>, Tensor<B, 4>) {
        match self.joint {
            Some(joint) => halves(joint),
            None => (self.keys.expect(FILLED), self.values.expect(FILLED)),
        }
    }

    /// Writes `kv` (`[batch, 2·kv_heads, seq, head_dim]`, keys then values) at the positions
    /// starting at `position` into a joint buffer, with one update, and returns the whole
    /// buffer.
    ///
    /// # Panics
    ///
    /// When the cache is not joint.
    pub fn write_joint(&mut self, kv: Tensor<B, 4>, position: &Position<B>) -> Tensor<B, 4> {
        assert!(
            self.is_joint(),
            "write_joint: the layer cache is two buffers"
        );
        update(&mut self.joint, kv, position)
    }

    /// Writes `keys`/`values` (`[batch, kv_heads, seq, head_dim]`) at the positions starting at
    /// `position` and returns the whole buffers (`[batch, kv_heads, capacity, head_dim]`), for an
    /// attention that reads the filled length itself ([`burn_mlx::decode::decode_attention`]).
    pub fn write_whole(
        &mut self,
        keys: Tensor<B, 4>,
        values: Tensor<B, 4>,
        position: &Position<B>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        if self.is_joint() {
            return halves(self.write_joint(Tensor::cat(vec![keys, values], 1), position));
        }
        let k = update(&mut self.keys, keys, position);
        let v = update(&mut self.values, values, position);
        (k, v)
    }

    /// Writes `keys`/`values` like [`write_whole`](Self::write_whole) and returns what attention
    /// reads: with a host position, the filled prefix `0..offset + seq` of both; with a device
    /// position, the whole buffers.
    pub fn write(
        &mut self,
        keys: Tensor<B, 4>,
        values: Tensor<B, 4>,
        position: &Position<B>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let seq = keys.dims()[2];
        let (k, v) = self.write_whole(keys, values, position);
        match position {
            Position::Host(offset) => (k.narrow(2, 0, offset + seq), v.narrow(2, 0, offset + seq)),
            Position::Device { .. } => (k, v),
        }
    }
}

/// The cache of a whole model for a batch of sequences (`[batch, kv_heads, capacity,
/// head_dim]` per layer), one sequence unless made with [`with_batch`](Self::with_batch).
///
/// The sequences of a batch share their positions: shorter prompts are padded on the left
/// ([`set_padding`](Self::set_padding)), and attention hides each row's padded positions. Since
/// rotary embeddings depend only on the distance between a query and a key, a row shifted right
/// by its padding attends as it would alone.
#[derive(Debug)]
pub struct KvCache<B: Backend> {
    layers: Vec<LayerCache<B>>,
    len: usize,
    capacity: usize,
    shape: [usize; 4],
    /// Padded positions at the start of each row.
    padding: Vec<usize>,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache for `capacity` positions, in `dtype` on `device`.
    pub fn new(config: &LlmConfig, capacity: usize, device: &B::Device, dtype: DType) -> Self {
        Self::with_layout(config, capacity, device, dtype, false)
    }

    /// [`new`](Self::new), with each layer's keys and values in one buffer
    /// ([`LayerCache::from_joint`]) when `joint`.
    pub fn with_layout(
        config: &LlmConfig,
        capacity: usize,
        device: &B::Device,
        dtype: DType,
        joint: bool,
    ) -> Self {
        Self::with_batch(config, 1, capacity, device, dtype, joint)
    }

    /// [`with_layout`](Self::with_layout) for `batch` sequences decoded together.
    ///
    /// # Panics
    ///
    /// When `batch` is 0.
    pub fn with_batch(
        config: &LlmConfig,
        batch: usize,
        capacity: usize,
        device: &B::Device,
        dtype: DType,
        joint: bool,
    ) -> Self {
        assert!(
            batch > 0,
            "KvCache::with_batch: the batch must hold a sequence"
        );
        let shape = [batch, config.num_kv_heads, capacity, config.head_dim];
        let layers = (0..config.num_layers)
            .map(|_| {
                if joint {
                    // A buffer that the decode kernels can write new positions into in place.
                    let [b, h, c, d] = shape;
                    LayerCache::from_joint(burn_mlx::decode::cache_buffer(
                        [b, 2 * h, c, d],
                        device,
                        dtype,
                    ))
                } else {
                    LayerCache::from_tensors(
                        Tensor::zeros(shape, (device, dtype)),
                        Tensor::zeros(shape, (device, dtype)),
                    )
                }
            })
            .collect();
        Self {
            layers,
            len: 0,
            capacity,
            shape,
            padding: vec![0; batch],
        }
    }

    /// Sequences in the batch.
    pub fn batch(&self) -> usize {
        self.shape[0]
    }

    /// Padded positions at the start of each row (all 0 unless
    /// [`set_padding`](Self::set_padding) said otherwise).
    pub fn padding(&self) -> &[usize] {
        &self.padding
    }

    /// Whether some row starts with padded positions.
    pub fn is_padded(&self) -> bool {
        self.padding.iter().any(|&p| p > 0)
    }

    /// Says that row `i`'s first `padding[i]` positions are padding, which attention then hides
    /// from that row's queries: a batch of prompts of different lengths is padded on the left.
    pub fn set_padding(&mut self, padding: &[usize]) -> Result<()> {
        if padding.len() != self.batch() {
            return Err(LlmError::Input(format!(
                "set_padding: {} rows of padding for a cache of {} sequences",
                padding.len(),
                self.batch()
            )));
        }
        if let Some(&too_long) = padding.iter().find(|&&p| p >= self.capacity) {
            return Err(LlmError::Input(format!(
                "set_padding: {too_long} padded positions leave no room in a cache of {}",
                self.capacity
            )));
        }
        self.padding = padding.to_vec();
        Ok(())
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

    /// Forgets the sequences and their padding (the buffers are kept and overwritten by the
    /// next prompts).
    pub fn reset(&mut self) {
        self.len = 0;
        self.padding.iter_mut().for_each(|p| *p = 0);
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
        let expected = [
            self.batch(),
            config.num_kv_heads,
            self.capacity,
            config.head_dim,
        ];
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

    /// Takes the layer caches out (a compiled step consumes them and gives back new ones, with
    /// [`put_layers`](Self::put_layers)); the cache holds none until then.
    pub(super) fn take_layers(&mut self) -> Vec<LayerCache<B>> {
        std::mem::take(&mut self.layers)
    }

    /// Puts back the layer caches [`take_layers`](Self::take_layers) took.
    pub(super) fn put_layers(&mut self, layers: Vec<LayerCache<B>>) {
        self.layers = layers;
    }

    /// Marks `seq` more positions as filled (after every layer wrote them).
    pub(super) fn advance(&mut self, seq: usize) {
        self.len += seq;
    }
}
