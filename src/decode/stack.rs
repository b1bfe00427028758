//! A whole decoder stack's decode step as one kernel.
//!
//! [`attention_mlp_qkv`](super::attention_mlp_qkv) makes a Llama/Qwen block's decode step one
//! kernel, so a step of an `L`-block model is `L + 1` custom kernels. On MLX's CUDA device each
//! launch costs the host far more than the kernel's few dozen microseconds on the GPU (MLX adds a
//! node to its CUDA graph, tracks every input, and later updates and launches the graph), and a
//! decode step is bound by that host work. [`decoder_stack`] runs every block of the step in one
//! launch instead: the same phases as the per-block kernel, in a loop over the blocks, with a
//! grid-wide barrier where one launch ended and the next began. Each block's arrays are inputs of
//! the kernel (MLX passes each as a pointer), and the kernel's body is one call per block of a
//! device function on that block's inputs; the residual stream and each block's heads live in
//! the kernel's scratch output between blocks.

use super::cuda::{counted, counted_inputs, dims_i32};
use super::gemv::Mat;
use super::projection::{Linear, NormQkv};
use super::tail::{
    grid_kernel_on, header, launch_shape, pieces_floats, NextInputs, Sizes, ATTENTION_MLP,
    ATTENTION_MLP_PRELUDE, HEAD_COUNTS, NEXT_QKV,
};
use super::{array_of, kernel_input, At, Gate};
use crate::error::MlxError;
use crate::fast::float_from_mlx;
use crate::native::kernel::{self, CudaKernel, TemplateArg};
use crate::tensor::{MlxTensor, OrPanic};
use burn_tensor::backend::Backend;
use burn_tensor::Tensor;
use mlx_rs::{Array, Dtype};
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::OnceLock;

/// One block of a decoder stack, as [`decoder_stack`] takes it: the block's QKV step (its input
/// norm, fused QKV projection, heads, query/key norms, RoPE at the step's position, and its
/// joint cache, which the step writes), then what
/// [`attention_mlp`](super::attention_mlp) takes.
#[derive(Debug, Clone, Copy)]
pub struct StackBlock<'a, B: Backend> {
    /// The block's QKV step; [`NormQkv::cache`] is the block's joint cache.
    pub qkv: NormQkv<'a, B>,
    /// The output projection, `[heads·head_dim, hidden]`, no bias.
    pub o_proj: Linear<'a, B>,
    /// The post-attention RMS norm's weight, `[hidden]`.
    pub norm: &'a Tensor<B, 1>,
    /// The post-attention RMS norm's epsilon.
    pub eps: f64,
    /// The fused gate/up projection, `[hidden, 2·intermediate]`, no bias.
    pub gate_up: Linear<'a, B>,
    /// The down projection, `[intermediate, hidden]`, no bias.
    pub down: Linear<'a, B>,
}

/// Warps per block: 8 (256 threads). The block function needs up to 255 registers a thread
/// without spilling (NVRTC 13.0 for sm_90, `qwen3-0.6b`'s sizes: bf16 255, f32 253, 8-bit 249,
/// 4-bit 168), which 8 warps a block allow. Blocks of 16 warps, held to 128 registers by launch
/// bounds (and so spilling), decoded `qwen3-0.6b` in bf16 at 676 and 690 tok/s on an H200
/// against 715 and 715 for 8 warps in the same rounds (`benches/decode.md`).
const WARPS: usize = 8;

/// A block's arrays in its row of the kernel's table (see [`table_entries`]).
const SLOTS: usize = 18;

/// The blocks of `blocks` on `x` (`[1, hidden]`, one position of one sequence): for each block
/// in turn, its QKV step writes the new keys and values into its cache at the step's position,
/// then attention over the first `len` positions of the cache with `scale`, the output
/// projection and residual, the post-attention norm, the gated MLP with `gate` and its residual;
/// returns the last block's output, `[1, hidden]`. Block by block that is:
///
/// ```text
/// heads = block.qkv.heads_joint_cached(x)       // writes the cache
/// x = attention_mlp(heads.q, cache, len, scale, x, o_proj, norm, eps, gate_up, down, gate)
/// ```
///
/// On MLX's CUDA device, when every block has the same sizes, weights of one kind (all dense or
/// all quantized alike, no biases but the QKV projection's), the same norms' epsilons, one
/// rotary embedding and position, norms in the rows' dtype, and a cache the kernel may write in
/// place, this is one kernel (see the module's docs; `BURN_MLX_DECODE_STACK=0` turns it off).
/// Otherwise `x` comes back unchanged (`Err`) and nothing has been written: the caller runs the
/// blocks one by one. Each block must have a cache of its own.
pub fn decoder_stack<B: Backend>(
    x: Tensor<B, 2>,
    blocks: &[StackBlock<'_, B>],
    len: &At<B>,
    scale: f64,
    gate: Gate,
) -> Result<Tensor<B, 2>, Tensor<B, 2>> {
    let [rows, _] = x.dims();
    if rows != 1 || blocks.is_empty() || !grid_kernel_on() || !stack_kernel_on() {
        return Err(x);
    }
    let t = kernel_input(x)?;
    match StackInputs::of(blocks, &t) {
        Some(inputs) => {
            let arrays = [&t.array, inputs.blocks[0].qkv.w.inputs()[0]];
            let out = t
                .device
                .scope(|| launch(&t.array, &inputs, len.array(), scale as f32, gate))
                .or_panic("decoder_stack", &arrays);
            Ok(float_from_mlx(t.with(out)))
        }
        None => Err(float_from_mlx(t)),
    }
}

/// Whether `BURN_MLX_DECODE_STACK` leaves the kernel on (it is unless set to `0`; off, the
/// caller runs the blocks one by one).
fn stack_kernel_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("BURN_MLX_DECODE_STACK").map_or(true, |v| v != "0"))
}

/// One block's arrays as the kernel reads them.
struct BlockInputs {
    qkv: NextInputs,
    cache: Array,
    wo: Mat,
    norm: Array,
    wgu: Mat,
    wd: Mat,
}

/// The arrays and constants of one launch.
struct StackInputs {
    blocks: Vec<BlockInputs>,
    sizes: Sizes,
    /// Blocks of the launch and splits of each head's positions.
    shape: (usize, usize),
    /// The post-attention norms' epsilon.
    eps: f32,
}

impl StackInputs {
    /// The launch's arrays when the kernel runs for `blocks` on the rows `t` (see
    /// [`decoder_stack`]).
    fn of<B: Backend>(blocks: &[StackBlock<'_, B>], t: &MlxTensor) -> Option<Self> {
        let dtype = t.array.dtype();
        let first = &blocks[0];
        let l = first.qkv.layout;
        let [k, width] = first.gate_up.dims();
        let sizes = Sizes {
            k,
            hq: l.heads,
            hkv: l.kv_heads,
            d: l.head_dim,
            i: width / 2,
        };
        let same = |b: &StackBlock<'_, B>| {
            let q = &b.qkv;
            q.layout == l
                && q.eps == first.qkv.eps
                && q.qk_eps == first.qkv.qk_eps
                && q.qk_norms.is_some() == first.qkv.qk_norms.is_some()
                && q.layer.bias().is_some() == first.qkv.layer.bias().is_some()
                && std::ptr::eq(q.rope, first.qkv.rope)
                && std::ptr::eq(q.offset, first.qkv.offset)
                && b.eps == first.eps
                && q.layer.dims() == [k, l.width()]
                && q.norm.dims() == [k]
                && b.o_proj.dims() == [l.heads * l.head_dim, k]
                && b.gate_up.dims() == [k, width]
                && b.down.dims() == [width / 2, k]
                && b.norm.dims() == [k]
                && [&b.o_proj, &b.gate_up, &b.down]
                    .iter()
                    .all(|p| p.bias().is_none())
        };
        let hidden = t.array.shape().last().map(|&h| h as usize);
        if !blocks.iter().all(same)
            || l.width() / l.head_dim > kernel_head_counts()
            || hidden != Some(k)
        {
            return None;
        }
        let mut inputs = Vec::with_capacity(blocks.len());
        for b in blocks {
            let qkv = NextInputs::of(&b.qkv, t)?;
            let cache = qkv.cache.clone()?;
            inputs.push(BlockInputs {
                qkv,
                cache,
                wo: b.o_proj.mat(dtype)?,
                norm: array_of(b.norm),
                wgu: b.gate_up.mat(dtype)?,
                wd: b.down.mat(dtype)?,
            });
        }
        let head = &inputs[0];
        // One launch takes one `Q` and `GS`, the strides of the first block's weights and cache
        // for every block's, and norms read with unit stride.
        let alike = |b: &BlockInputs| {
            let mats = [
                (&b.qkv.w, &head.qkv.w),
                (&b.wo, &head.wo),
                (&b.wgu, &head.wgu),
                (&b.wd, &head.wd),
            ];
            // The table holds pointers: a norm or bias is read as the rows' dtype, with unit
            // stride.
            let unit = |a: &Array| a.strides() == [1] && a.dtype() == dtype;
            mats.iter().all(|(m, h)| {
                m.same_kind(&head.wo) && m.inputs()[0].strides() == h.inputs()[0].strides()
            }) && b.cache.strides() == head.cache.strides()
                && b.cache.shape() == head.cache.shape()
                && unit(&b.norm)
                && unit(&b.qkv.norm)
                && b.qkv.bias.as_ref().is_none_or(unit)
                && b.qkv.qk.as_ref().is_none_or(|(q, k)| unit(q) && unit(k))
        };
        if !inputs.iter().all(alike) {
            return None;
        }
        let table = blocks.len() * SLOTS * std::mem::size_of::<u64>();
        let shape = launch_shape(&sizes, dtype, WARPS, table)?;
        Some(StackInputs {
            blocks: inputs,
            sizes,
            shape,
            eps: first.eps as f32,
        })
    }
}

/// How many heads the QKV phase can count (the entries of [`super::cuda::counters`] from
/// [`HEAD_COUNTS`]).
fn kernel_head_counts() -> usize {
    super::cuda::COUNTERS - HEAD_COUNTS
}

/// The names of a block's arrays, in the order of its row of the kernel's table, and
/// whether the launch has each (where not, another array of the block stands in, unread: see
/// [`stand_in`]).
fn table_entries(quantized: bool, bias: bool, norms: bool) -> [(&'static str, bool); SLOTS] {
    [
        ("gi", true),
        ("wqkv", true),
        ("wqkv_scales", quantized),
        ("wqkv_biases", quantized),
        ("bqkv", bias),
        ("qn", norms),
        ("kn", norms),
        ("kvc", true),
        ("wo", true),
        ("wo_scales", quantized),
        ("wo_biases", quantized),
        ("gp", true),
        ("wgu", true),
        ("wgu_scales", quantized),
        ("wgu_biases", quantized),
        ("wd", true),
        ("wd_scales", quantized),
        ("wd_biases", quantized),
    ]
}

/// A block's arrays in the order of [`table_entries`] (`None`: not an input of the launch).
fn block_arrays(b: &BlockInputs) -> [Option<&Array>; SLOTS] {
    fn q(m: &Mat) -> [Option<&Array>; 3] {
        let [w, s, bi] = m.inputs();
        match m {
            Mat::Dense(_) => [Some(w), None, None],
            Mat::Quantized { .. } => [Some(w), Some(s), Some(bi)],
        }
    }
    let [wq, wq_s, wq_b] = q(&b.qkv.w);
    let [wo, wo_s, wo_b] = q(&b.wo);
    let [wgu, wgu_s, wgu_b] = q(&b.wgu);
    let [wd, wd_s, wd_b] = q(&b.wd);
    let (qn, kn) = match &b.qkv.qk {
        Some((qn, kn)) => (Some(qn), Some(kn)),
        None => (None, None),
    };
    [
        Some(&b.qkv.norm),
        wq,
        wq_s,
        wq_b,
        b.qkv.bias.as_ref(),
        qn,
        kn,
        Some(&b.cache),
        wo,
        wo_s,
        wo_b,
        Some(&b.norm),
        wgu,
        wgu_s,
        wgu_b,
        wd,
        wd_s,
        wd_b,
    ]
}

/// The head of `bm_stack_block`, the device function that runs one block of the stack (placed
/// in the kernel's header): its parameters, then the locals that [`NEXT_QKV`] and
/// [`ATTENTION_MLP`] read under their per-block kernels' input names, the block's arrays taken
/// from its row `tab` of the kernel's table. The block's QKV phase ([`NEXT_QKV`], whose first
/// barrier also ends the previous block) makes its heads from the residual stream into
/// `qbuf`/`kvbuf` and its cache; after a barrier, the attention and MLP phases update the
/// residual stream in place (`xbuf`; the first block reads `hidden`, the last writes `out`).
/// Every array that other blocks of the grid write within the launch is read from L2 by those
/// sources.
const STACK_BLOCK_HEAD: &str = r#"
template <typename T, int Q, int GS, int K, int HQ, int HKV, int D, int I, int S, int SCALE,
          int EPS, int GELU, int WARPS, int EPS2, int QK_EPS, int NORM, int BIAS, int HEAD_COUNTS,
          int CACHE, typename LT, typename PT, typename FT, typename SH, typename ST>
__device__ __noinline__ void bm_stack_block(bool first, bool last, const void* const* tab,
                                            const T* hidden, T* out, const LT* len, const PT* pos,
                                            const FT* freqs, const uint64_t* sync, float* work,
                                            const SH& kvc_shape, const ST& kvc_strides,
                                            const ST& wqkv_strides, const ST& wo_strides,
                                            const ST& wgu_strides, const ST& wd_strides) {
"#;

/// After [`ATTENTION_MLP_PRELUDE`] in `bm_stack_block`: the block's QKV phase's locals, before
/// [`NEXT_QKV`].
const STACK_BLOCK_QKV: &str = r#"
  constexpr long R_END = A_OFF + ((long)I * sizeof(T) + 15) / 16 * 4 + (long)(HQ + 2 * HKV) * D;
  constexpr long Q_OFF = R_END;
  constexpr long KV_OFF = Q_OFF + ((long)HQ * D * sizeof(T) + 15) / 16 * 4;
  constexpr long X_OFF = KV_OFF + ((long)2 * HKV * D * sizeof(T) + 15) / 16 * 4;
  T* qbuf = reinterpret_cast<T*>(work + Q_OFF);
  T* kvbuf = reinterpret_cast<T*>(work + KV_OFF);
  T* xbuf = reinterpret_cast<T*>(work + X_OFF);
  const long q_strides[4] = {(long)HQ * D, D, D, 1};
  const long x_strides[2] = {K, 1};
  const long g_strides[1] = {1};
  const long g2_strides[1] = {1};
  const long bias2_strides[1] = {1};
  const auto& kv_shape = kvc_shape;
  const auto& kv_strides = kvc_strides;
  {
    const T* y = first ? hidden : xbuf;
    const T* g2 = static_cast<const T*>(tab[0]);
    const void* wqkv = tab[1];
    const T* wqkv_scales = static_cast<const T*>(tab[2]);
    const T* wqkv_biases = static_cast<const T*>(tab[3]);
    const T* bias2 = static_cast<const T*>(tab[4]);
    const T* qw = static_cast<const T*>(tab[5]);
    const T* kw = static_cast<const T*>(tab[6]);
    const T* kvc = static_cast<const T*>(tab[7]);
    T* q2 = qbuf;
    T* kv2 = kvbuf;
"#;

/// Between [`NEXT_QKV`] and [`ATTENTION_MLP`] in `bm_stack_block`.
const STACK_BLOCK_MLP: &str = r#"
  }
  bm_grid_sync(bar);
  {
    const T* q = qbuf;
    const T* kv = static_cast<const T*>(tab[7]);
    const T* x = first ? hidden : xbuf;
    const void* wo = tab[8];
    const T* wo_scales = static_cast<const T*>(tab[9]);
    const T* wo_biases = static_cast<const T*>(tab[10]);
    const T* g = static_cast<const T*>(tab[11]);
    const void* wgu = tab[12];
    const T* wgu_scales = static_cast<const T*>(tab[13]);
    const T* wgu_biases = static_cast<const T*>(tab[14]);
    const void* wd = tab[15];
    const T* wd_scales = static_cast<const T*>(tab[16]);
    const T* wd_biases = static_cast<const T*>(tab[17]);
    T* y = last ? out : xbuf;
"#;

/// The kernel's loop over the blocks, after the table. The block function is not inlined, so the
/// kernel holds its code once: inlined once per block, the kernel for 28 blocks took NVRTC 13.0
/// over a minute to compile. Inlined or not, the loop needs about twice the registers of one
/// block alone (see [`WARPS`]).
const STACK_LOOP: &str = r#"
#pragma unroll 1
  for (int layer = 0; layer < L; ++layer) {
    bm_stack_block<T, Q, GS, K, HQ, HKV, D, I, S, SCALE, EPS, GELU, WARPS, EPS2, QK_EPS, NORM,
                   BIAS, HEAD_COUNTS, CACHE>(
        layer == 0, layer == L - 1, bm_tab[layer], hidden, out, len, pos, freqs, sync, work,
        kvc_0_shape, kvc_0_strides, wqkv_0_strides, wo_0_strides, wgu_0_strides, wd_0_strides);
  }
"#;

/// The kernel's header: the grid kernels' header ([`header`]) and `bm_stack_block`, joined once
/// per process.
fn stack_header() -> &'static str {
    static JOINED: OnceLock<String> = OnceLock::new();
    JOINED.get_or_init(|| {
        let mut s = String::with_capacity(64 * 1024);
        s.push_str(header());
        s.push_str(STACK_BLOCK_HEAD);
        s.push_str(ATTENTION_MLP_PRELUDE);
        s.push_str(STACK_BLOCK_QKV);
        s.push_str(NEXT_QKV);
        s.push_str(STACK_BLOCK_MLP);
        s.push_str(ATTENTION_MLP);
        s.push_str("  }\n}\n");
        s
    })
}

/// The kernel's source for `blocks` blocks with the given entries: the table of each block's
/// arrays (in shared memory) filled from the inputs, then the loop over the blocks.
fn source(blocks: usize, entries: &[(&str, bool); SLOTS], quantized: bool) -> String {
    let mut s = String::with_capacity(blocks * 1024);
    let _ = writeln!(s, "  __shared__ const void* bm_tab[L][{SLOTS}];");
    s.push_str("  if (threadIdx.x == 0) {\n");
    for b in 0..blocks {
        for (slot, (name, present)) in entries.iter().enumerate() {
            let from = if *present {
                name
            } else {
                stand_in(name, quantized)
            };
            let _ = writeln!(s, "    bm_tab[{b}][{slot}] = {};", input_name(from, b));
        }
    }
    s.push_str("  }\n  __syncthreads();\n");
    s.push_str(STACK_LOOP);
    s
}

/// The entry that stands in (unread) for `name` where the launch lacks it: an array of the same
/// type of the same block. A missing scale or bias of a dense weight is the weight itself; a
/// missing QKV bias or query/key norm (in the rows' dtype) is the QKV weight when dense, its
/// scales when quantized.
fn stand_in(name: &str, quantized: bool) -> &'static str {
    match name {
        "bqkv" | "qn" | "kn" if quantized => "wqkv_scales",
        "wqkv_scales" | "wqkv_biases" | "bqkv" | "qn" | "kn" => "wqkv",
        "wo_scales" | "wo_biases" => "wo",
        "wgu_scales" | "wgu_biases" => "wgu",
        _ => "wd",
    }
}

/// The kernel input of entry `name` of block `b`: `NAME_b`, or `W_b_scales` for a weight's scales.
fn input_name(name: &str, b: usize) -> String {
    match name.split_once('_') {
        Some((w, part)) if part == "scales" || part == "biases" => format!("{w}_{b}_{part}"),
        _ => format!("{name}_{b}"),
    }
}

/// The kernel's name for a launch of `blocks` blocks with these entries (one kernel object, with
/// its own input names, per distinct set), interned for the process.
fn kernel_name(blocks: usize, quantized: bool, bias: bool, norms: bool) -> &'static str {
    type Key = (usize, bool, bool, bool);
    thread_local! {
        static NAMES: RefCell<HashMap<Key, &'static str>> = RefCell::new(HashMap::new());
    }
    NAMES.with(|cell| {
        *cell
            .borrow_mut()
            .entry((blocks, quantized, bias, norms))
            .or_insert_with(|| {
                let name = format!(
                    "burn_mlx_decoder_stack_{blocks}_{}{}{}",
                    u8::from(quantized),
                    u8::from(bias),
                    u8::from(norms)
                );
                Box::leak(name.into_boxed_str())
            })
    })
}

/// The stack's kernel on the rows `hidden` (`[1, K]`): the last block's output.
fn launch(
    hidden: &Array,
    a: &StackInputs,
    len: Array,
    scale: f32,
    gate: Gate,
) -> Result<Array, MlxError> {
    let s = &a.sizes;
    let dtype = hidden.dtype();
    let size = if dtype == Dtype::Float32 { 4 } else { 2 };
    let (blocks, splits) = a.shape;
    let n = a.blocks.len();
    let head = &a.blocks[0];
    let quantized = matches!(head.wo, Mat::Quantized { .. });
    let (bias, norms) = (head.qkv.bias.is_some(), head.qkv.qk.is_some());
    let entries = table_entries(quantized, bias, norms);
    // `attention_mlp_qkv`'s scratch, then the heads (`qbuf`, `kvbuf`) and the residual stream
    // (`xbuf`) between blocks, as STACK_BLOCK_QKV lays them out.
    let work = s.scratch_floats(size, splits, true)
        + pieces_floats(s.hq * s.d, size)
        + pieces_floats(2 * s.hkv * s.d, size)
        + pieces_floats(s.k, size);
    let [counter, after] = counted_inputs()?;
    let mut names: Vec<String> = ["hidden", "len", "pos", "freqs", "sync", "after"]
        .map(String::from)
        .to_vec();
    let mut inputs: Vec<&Array> = vec![
        hidden,
        &len,
        &head.qkv.pos,
        &head.qkv.freqs,
        &counter,
        &after,
    ];
    for (b, block) in a.blocks.iter().enumerate() {
        for ((name, _), array) in entries.iter().zip(block_arrays(block)) {
            if let Some(array) = array {
                names.push(input_name(name, b));
                inputs.push(array);
            }
        }
    }
    let [q, gs] = head.wo.template_args();
    let mut targs = vec![
        TemplateArg::Dtype("T", dtype),
        q,
        gs,
        TemplateArg::Int("L", n as i32),
    ];
    targs.extend(s.template_args(splits));
    targs.extend([
        TemplateArg::Int("SCALE", scale.to_bits() as i32),
        TemplateArg::Int("EPS", a.eps.to_bits() as i32),
        TemplateArg::Int("GELU", (gate == Gate::GeluTanh) as i32),
        TemplateArg::Int("WARPS", WARPS as i32),
        TemplateArg::Int("EPS2", head.qkv.eps.to_bits() as i32),
        TemplateArg::Int("QK_EPS", head.qkv.qk_eps.to_bits() as i32),
        TemplateArg::Int("NORM", norms as i32),
        TemplateArg::Int("BIAS", bias as i32),
        TemplateArg::Int("HEAD_COUNTS", HEAD_COUNTS as i32),
        TemplateArg::Int("CACHE", 1),
    ]);
    let out_shape = dims_i32(&[1, s.k]);
    let work_shape = dims_i32(&[work]);
    let outputs: [(&[i32], Dtype); 2] = [(&out_shape, dtype), (&work_shape, Dtype::Float32)];
    let grid = [(blocks * WARPS * 32) as i32, 1, 1];
    let block = [(WARPS * 32) as i32, 1, 1];
    let name = kernel_name(n, quantized, bias, norms);
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    kernel::with_strided_kernel(
        name,
        &name_refs,
        &["out", "work"],
        || source(n, &entries, quantized),
        stack_header(),
        |k: &CudaKernel| k.apply(&inputs, &outputs, &targs, grid, block),
    )
    .map(|mut out| {
        // `work` is scratch; the thread's next counted launch waits for it.
        if let Some(work) = out.pop() {
            counted(&work);
        }
        out.remove(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_entry_is_an_input_of_its_own_block() {
        for (quantized, bias, norms) in [
            (false, false, true),
            (true, false, false),
            (true, true, true),
        ] {
            let entries = table_entries(quantized, bias, norms);
            let src = source(3, &entries, quantized);
            let mut seen = 0;
            for line in src
                .lines()
                .filter(|l| l.trim_start().starts_with("bm_tab[") && l.contains('='))
            {
                let (lhs, rhs) = line.split_once('=').unwrap();
                let idx: Vec<usize> = lhs
                    .trim()
                    .trim_start_matches("bm_tab[")
                    .trim_end_matches(']')
                    .split("][")
                    .map(|v| v.parse().unwrap())
                    .collect();
                let (b, slot) = (idx[0], idx[1]);
                let (name, present) = entries[slot];
                let from = if present {
                    name
                } else {
                    stand_in(name, quantized)
                };
                let arg = rhs.trim().trim_end_matches(';');
                assert_eq!(arg, input_name(from, b), "block {b}, {name}");
                // A stand-in is itself an input of the launch.
                let base = entries.iter().find(|(n, _)| input_name(n, b) == arg);
                assert!(
                    base.is_some_and(|(_, p)| *p),
                    "block {b}: {arg} is not an input"
                );
                seen += 1;
            }
            assert_eq!(seen, 3 * SLOTS);
            assert_eq!(input_name("wo_scales", 3), "wo_3_scales");
            assert_eq!(input_name("kvc", 3), "kvc_3");
        }
    }
}
