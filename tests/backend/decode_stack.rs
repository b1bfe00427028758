//! `burn_mlx::decode::decoder_stack` (a whole decoder stack's decode step as one CUDA kernel)
//! against the same blocks run one at a time (`NormQkv::heads_joint`, a cache write,
//! `attention_mlp`): dense weights in f32, bf16 and f16, and 4- and 8-bit weights in bf16;
//! grouped and ungrouped heads; with and without a QKV bias and query/key norms.
//!
//! On the GPU the stack runs as one kernel and writes every block's cache in place; on MLX's CPU
//! it does not run (`Err` gives the input back) and writes nothing.

use super::decode::{check, device, f32_rows, pair, rope_freqs, DTYPES};
use burn_mlx::decode::{self, At, Gate, QkvLayout};
use burn_mlx::fast::RotaryEmbedding;
use burn_mlx::quant::{QuantBits, QuantizedMatrix};
use burn_mlx::Mlx;
use burn_tensor::{DType, Int, Tensor};

/// One block's parameters: dense weights are `[in, out]` views of stored `[out, in]` matrices,
/// quantized ones the stored matrices in MLX's 4- or 8-bit groups of 64.
struct Block {
    g_in: Tensor<Mlx, 1>,
    qkv: Weight,
    bias: Tensor<Mlx, 1>,
    qn: Tensor<Mlx, 1>,
    kn: Tensor<Mlx, 1>,
    o: Weight,
    g_post: Tensor<Mlx, 1>,
    gate_up: Weight,
    down: Weight,
}

enum Weight {
    Dense(Tensor<Mlx, 2>),
    Quantized(QuantizedMatrix<Mlx>),
}

impl Weight {
    fn new([input, out]: [usize; 2], seed: u64, dtype: DType, bits: Option<QuantBits>) -> Self {
        let (w, _) = pair([out, input], seed, dtype, 1.7 / (input as f32).sqrt());
        match bits {
            Some(bits) => {
                Weight::Quantized(QuantizedMatrix::quantize(w, bits, 64).expect("quantize"))
            }
            None => Weight::Dense(w.transpose()),
        }
    }

    fn linear(&self) -> decode::Linear<'_, Mlx> {
        match self {
            Weight::Dense(weight) => decode::Linear::Dense(decode::Dense { weight, bias: None }),
            Weight::Quantized(matrix) => {
                decode::Linear::Quantized(decode::Quantized { matrix, bias: None })
            }
        }
    }
}

/// (dtype index in [`DTYPES`], head size, query heads, key/value heads, hidden size, MLP width,
/// blocks, quantized bits (`None`: dense), QKV bias, query/key norms)
type Case = (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    Option<QuantBits>,
    bool,
    bool,
);

/// The quantized cases of `qwen3-0.6b`'s sizes give each warp of the kernel several rounds of
/// QKV and gate/up columns (on a GPU of up to 140 multiprocessors), so that the weights loaded
/// two rounds ahead are checked.
const CASES: [Case; 6] = [
    (1, 128, 16, 8, 1024, 3072, 3, None, false, true),
    (0, 64, 4, 2, 256, 512, 2, None, true, false),
    (2, 64, 4, 4, 256, 512, 2, None, false, true),
    (1, 64, 8, 2, 512, 1024, 2, Some(QuantBits::Q4), false, true),
    (
        1,
        128,
        16,
        8,
        1024,
        3072,
        2,
        Some(QuantBits::Q4),
        true,
        true,
    ),
    (
        1,
        128,
        16,
        8,
        1024,
        3072,
        2,
        Some(QuantBits::Q8),
        false,
        true,
    ),
];

/// Block `b`'s QKV step, with a bias and query/key norms where `bias` and `norms` say.
fn b_qkv<'a>(
    b: &'a Block,
    cache: Option<&'a Tensor<Mlx, 4>>,
    layout: QkvLayout,
    (bias, norms): (bool, bool),
    rope: &'a RotaryEmbedding<Mlx>,
    offset: &'a At<Mlx>,
) -> decode::NormQkv<'a, Mlx> {
    let bias = bias.then_some(&b.bias);
    let layer = match &b.qkv {
        Weight::Dense(weight) => decode::Linear::Dense(decode::Dense { weight, bias }),
        Weight::Quantized(matrix) => decode::Linear::Quantized(decode::Quantized { matrix, bias }),
    };
    decode::NormQkv {
        norm: &b.g_in,
        eps: 1e-6,
        layer,
        layout,
        qk_norms: norms.then_some((&b.qn, &b.kn)),
        qk_eps: 1e-6,
        rope,
        offset,
        cache,
    }
}

#[test]
fn decoder_stack_matches_the_blocks_one_at_a_time() {
    for (di, d, hq, hkv, hidden, width, n, bits, bias, norms) in CASES {
        let (dtype, tol) = DTYPES[di];
        let layout = QkvLayout {
            heads: hq,
            kv_heads: hkv,
            head_dim: d,
        };
        let blocks: Vec<Block> = (0..n as u64)
            .map(|b| {
                let s = 100 + 20 * b;
                Block {
                    g_in: pair([hidden], s, dtype, 1.5).0,
                    qkv: Weight::new([hidden, layout.width()], s + 1, dtype, bits),
                    bias: pair([layout.width()], s + 2, dtype, 0.5).0,
                    qn: pair([d], s + 3, dtype, 1.0).0,
                    kn: pair([d], s + 4, dtype, 1.0).0,
                    o: Weight::new([hq * d, hidden], s + 5, dtype, bits),
                    g_post: pair([hidden], s + 6, dtype, 1.5).0,
                    gate_up: Weight::new([hidden, 2 * width], s + 7, dtype, bits),
                    down: Weight::new([width, hidden], s + 8, dtype, bits),
                }
            })
            .collect();
        let rope = RotaryEmbedding::<Mlx>::new(&rope_freqs(d), &device());
        let (x, _) = pair([1, hidden], 99, dtype, 2.0);
        let scale = 1.0 / (d as f64).sqrt();
        // At 1,000 positions, in the cases with 16 query heads, each warp of the stack's
        // attention takes several runs of positions (the next loaded while one is summed).
        let cap = 1024;
        for len in [1, 256, 1000] {
            let label = format!(
                "decoder_stack {dtype:?} d {d} heads {hq}/{hkv} hidden {hidden} blocks {n} \
                 bits {bits:?} bias {bias} norms {norms} len {len}"
            );
            let pos = len - 1;
            let offset = At::Host(pos);
            let at = At::Device(Tensor::<Mlx, 1, Int>::from_ints([len as i32], &device()));
            // Each block's cache: random rows, and zeros from `pos` on.
            let caches = |seed: u64| -> Vec<Tensor<Mlx, 4>> {
                (0..n as u64)
                    .map(|b| {
                        let (rows, _) = pair([1, 2 * hkv, cap, d], seed + b, dtype, 1.0);
                        let keep = Tensor::<Mlx, 1, Int>::arange(0..cap as i64, &device())
                            .lower_elem(pos as i64)
                            .float()
                            .cast(dtype)
                            .reshape([1, 1, cap, 1]);
                        rows * keep
                    })
                    .collect()
            };
            let stack_caches = caches(7);
            let ref_caches = caches(7);
            let qkv_step = |b, cache| b_qkv(b, cache, layout, (bias, norms), &rope, &offset);
            let stack: Vec<decode::StackBlock<Mlx>> = blocks
                .iter()
                .zip(&stack_caches)
                .map(|(b, c)| decode::StackBlock {
                    qkv: qkv_step(b, Some(c)),
                    o_proj: b.o.linear(),
                    norm: &b.g_post,
                    eps: 1e-6,
                    gate_up: b.gate_up.linear(),
                    down: b.down.linear(),
                })
                .collect();
            let before = stack_caches
                .iter()
                .map(|c| f32_rows(c.clone()))
                .collect::<Vec<_>>();
            let got = decode::decoder_stack(x.clone(), &stack, &at, scale, Gate::Silu);
            assert_eq!(
                got.is_ok(),
                decode::kernels_run::<Mlx>(&device()),
                "{label}: one kernel exactly where the kernels run"
            );
            let y = match got {
                Ok(y) => y,
                Err(back) => {
                    // Nothing ran: the input comes back and no cache was written.
                    assert_eq!(f32_rows(back), f32_rows(x.clone()), "{label}: input back");
                    for (c, b) in stack_caches.iter().zip(&before) {
                        assert_eq!(&f32_rows(c.clone()), b, "{label}: a cache was written");
                    }
                    continue;
                }
            };
            // The blocks one at a time, writing each block's keys and values into its cache.
            let mut want = x.clone();
            let mut written = Vec::new();
            for (b, cache) in blocks.iter().zip(&ref_caches) {
                let [q, kv] = qkv_step(b, None).heads_joint(want.clone());
                let cache = cache
                    .clone()
                    .slice_assign([0..1, 0..2 * hkv, pos..pos + 1, 0..d], kv);
                want = decode::attention_mlp(
                    q,
                    cache.clone(),
                    &at,
                    scale,
                    want,
                    b.o.linear(),
                    &b.g_post,
                    1e-6,
                    b.gate_up.linear(),
                    b.down.linear(),
                    Gate::Silu,
                );
                written.push(cache);
            }
            // Rounding differs only in the order of f32 sums (the stack's blocks have fewer
            // warps), and grows with each block.
            let stack_tol = tol * n as f32;
            check(
                &format!("{label}: output"),
                f32_rows(y),
                f32_rows(want),
                stack_tol,
            );
            for (i, (c, w)) in stack_caches.iter().zip(&written).enumerate() {
                check(
                    &format!("{label}: cache of block {i}"),
                    f32_rows(c.clone()),
                    f32_rows(w.clone()),
                    stack_tol,
                );
            }
        }
    }
}
