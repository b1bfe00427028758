//! LoRA fine-tuning against PyTorch + PEFT (fixtures `tests/data/{qwen3,llama}/lora/`,
//! written by `scripts/lora_reference.py`): rank 4, scale 2, adapters on the seven linear
//! layers of the last block, initial `B` non-zero so that every gradient is.
//!
//! On `Autodiff<Mlx>` (MLX's CPU device): the loss of one batch and the gradient of every
//! adapter tensor within 1e-4; 20 Adam steps through the crate's training loop tracking PEFT's
//! loss curve within 1e-3 relative; base weights bit-identical after training; adapters saved
//! in mlx-lm's and PEFT's layouts read back identical; fused weights giving the adapted model's
//! logits; and adapter files that do not fit the model rejected with errors naming the file and
//! tensor.

use super::{fixture, max_diff, rows};
use burn_autodiff::Autodiff;
use burn_mlx::{Mlx, MlxDevice};
use burn_mlx_llm::config::LlmConfig;
use burn_mlx_llm::lora::data::{Batch, Batches, Example};
use burn_mlx_llm::lora::files::{self, SaveInfo};
use burn_mlx_llm::lora::fuse::fuse;
use burn_mlx_llm::lora::train::{train, train_compiled, BatchTensors, Event, TrainConfig};
use burn_mlx_llm::lora::{targets, Adapters, Lora, LoraConfig};
use burn_mlx_llm::model::{Llm, Logits, LINEAR_KEYS};
use burn_mlx_llm::weights::{load_model, SafetensorsParams};
use burn_optim::GradientsParams;
use burn_tensor::backend::Backend;
use burn_tensor::{DType, ElementConversion, Tensor};
use std::path::{Path, PathBuf};

type Ad = Autodiff<Mlx>;

/// One-step loss and gradients against PEFT.
const TOL: f32 = 1e-4;

/// What PEFT computed for a fixture.
struct Reference {
    tokens: Vec<Vec<u32>>,
    lengths: Vec<usize>,
    offsets: Vec<usize>,
    loss: f64,
    losses: Vec<f64>,
    lr: f64,
    logits: Vec<Vec<f32>>,
}

fn reference(model: &str) -> Reference {
    let path = fixture(model).join("lora/reference.json");
    let text = std::fs::read_to_string(&path).expect("lora reference.json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let nums = |v: &serde_json::Value| -> Vec<f64> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|x| x.as_f64().expect("number"))
            .collect()
    };
    let b = &json["batch"];
    Reference {
        tokens: b["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .map(|row| nums(row).into_iter().map(|t| t as u32).collect())
            .collect(),
        lengths: nums(&b["lengths"])
            .into_iter()
            .map(|x| x as usize)
            .collect(),
        offsets: nums(&b["offsets"])
            .into_iter()
            .map(|x| x as usize)
            .collect(),
        loss: json["loss"].as_f64().expect("loss"),
        losses: nums(&json["losses"]),
        lr: json["adam"]["lr"].as_f64().expect("lr"),
        logits: json["logits_with_adapters"]
            .as_array()
            .expect("logits")
            .iter()
            .map(|row| nums(row).into_iter().map(|x| x as f32).collect())
            .collect(),
    }
}

/// The fixture's LoRA settings: rank 4, scale 2, the last block, every linear layer.
fn lora_config() -> LoraConfig {
    LoraConfig {
        rank: 4,
        scale: 2.0,
        dropout: 0.0,
        num_layers: 1,
        keys: None,
    }
}

/// Adapters read from a fixture file in mlx-lm's naming (`initial`, `grads`, `trained`).
fn fixture_adapters<B: Backend>(model: &str, file: &str, config: &LlmConfig) -> Lora<B> {
    let device = Default::default();
    let path = fixture(model).join(format!("lora/{file}.safetensors"));
    let params = SafetensorsParams::<B>::open_file(&path, &device, DType::F32).expect("open");
    let lora_config = lora_config();
    let targets = targets(config, &lora_config).expect("targets");
    let (mut a, mut b) = (vec![], vec![]);
    for t in &targets {
        let [out, input] = t.dims;
        let r = lora_config.rank;
        a.push(burn_core::module::Param::from_tensor(
            params
                .tensor::<2>(&format!("{}.lora_a", t.name()), [input, r])
                .expect("lora_a"),
        ));
        b.push(burn_core::module::Param::from_tensor(
            params
                .tensor::<2>(&format!("{}.lora_b", t.name()), [r, out])
                .expect("lora_b"),
        ));
    }
    Lora {
        config: lora_config,
        targets,
        adapters: Adapters { a, b },
    }
}

fn batch(r: &Reference) -> Batch {
    let seq = r.tokens[0].len();
    Batch {
        tokens: r.tokens.iter().flatten().copied().collect(),
        batch: r.tokens.len(),
        seq,
        lengths: r.lengths.clone(),
        offsets: r.offsets.clone(),
        truncated: 0,
    }
}

fn values<B: Backend>(t: Tensor<B, 2>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec().expect("f32")
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn one_step_matches_peft(model_name: &str) {
    let device = MlxDevice::Cpu;
    let r = reference(model_name);
    let mut model = load_model::<Ad>(&fixture(model_name), &device, DType::F32).expect("model");
    let lora = fixture_adapters::<Ad>(model_name, "initial", model.config());
    lora.install(&mut model, true).expect("install");
    let t = BatchTensors::<Ad>::new(&batch(&r), &device).expect("batch");
    let loss = model.loss(t.tokens, t.rows, t.targets).expect("loss");
    let got: f32 = loss.clone().into_scalar();
    assert!(
        (got as f64 - r.loss).abs() < TOL as f64,
        "{model_name}: loss {got}, PEFT {}",
        r.loss
    );
    let grads = GradientsParams::from_grads(loss.backward(), &lora.adapters);
    let want = fixture_adapters::<Mlx>(model_name, "grads", model.config());
    let mut worst = 0.0f32;
    for (i, t) in lora.targets.iter().enumerate() {
        for (which, p, w) in [
            ("a", &lora.adapters.a[i], &want.adapters.a[i]),
            ("b", &lora.adapters.b[i], &want.adapters.b[i]),
        ] {
            let g = grads
                .get::<Mlx, 2>(p.id)
                .unwrap_or_else(|| panic!("{}.lora_{which} has no gradient", t.name()));
            let (g, w) = (values(g), values(w.val()));
            let d = max_abs(&g, &w);
            let scale = w.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            assert!(
                scale > 1e-3,
                "{}.lora_{which}: PEFT's gradient is ~0",
                t.name()
            );
            assert!(
                d < TOL,
                "{model_name}: gradient of {}.lora_{which} differs from PEFT's by {d}",
                t.name()
            );
            worst = worst.max(d);
        }
    }
    eprintln!(
        "{model_name}: loss {got} (PEFT {}), worst gradient diff {worst:e}",
        r.loss
    );

    // The adapted model's logits through the generation path (cache, no batch).
    let served = load_model::<Mlx>(&fixture(model_name), &device, DType::F32).expect("model");
    let mut served = served;
    fixture_adapters::<Mlx>(model_name, "initial", served.config())
        .install(&mut served, false)
        .expect("install");
    let seq = r.logits.len();
    let mut cache = served.new_cache(seq);
    let logits = served
        .forward(&r.tokens[0][..seq], &mut cache, Logits::All)
        .expect("forward");
    let d = max_diff(model_name, &rows(logits), &r.logits);
    assert!(
        d < TOL,
        "{model_name}: adapted logits differ from PEFT's by {d}"
    );
}

#[test]
fn qwen3_one_step_matches_peft() {
    one_step_matches_peft("qwen3");
}

#[test]
fn llama_one_step_matches_peft() {
    one_step_matches_peft("llama");
}

/// Every dense weight of every block, as f32 values.
fn base_weights<B: Backend>(model: &Llm<B>) -> Vec<Vec<f32>> {
    (0..model.config().num_layers)
        .flat_map(|l| LINEAR_KEYS.iter().map(move |k| (l, *k)))
        .map(|(l, k)| {
            values(
                model
                    .linear(l, k)
                    .expect("layer")
                    .dense_weight()
                    .expect("dense"),
            )
        })
        .collect()
}

/// A LoRA training loop ([`train`] or [`train_compiled`]).
type Fit<B> = fn(
    &mut Llm<B>,
    &mut Lora<B>,
    &mut Batches,
    &Batches,
    &TrainConfig,
    &mut dyn FnMut(&Event),
    &mut dyn FnMut(usize, &Lora<B>) -> burn_mlx_llm::error::Result<()>,
) -> burn_mlx_llm::error::Result<()>;

fn adam_tracks_peft<B: Backend<Device = MlxDevice>>(model_name: &str, fit: Fit<B>) {
    let device = MlxDevice::Cpu;
    let r = reference(model_name);
    let mut model = load_model::<B>(&fixture(model_name), &device, DType::F32).expect("model");
    let before = base_weights(&model);
    let mut lora = fixture_adapters::<B>(model_name, "initial", model.config());
    let examples: Vec<Example> = r
        .tokens
        .iter()
        .zip(&r.lengths)
        .zip(&r.offsets)
        .map(|((t, &len), &off)| Example {
            tokens: t[..len].to_vec(),
            prompt_len: off,
        })
        .collect();
    let mut batches = Batches::new(&examples, 2, 64, true, 0).expect("batches");
    let valid = Batches::new(&examples, 2, 64, true, 0).expect("batches");
    let config = TrainConfig {
        iters: r.losses.len(),
        batch_size: 2,
        learning_rate: r.lr,
        steps_per_report: 1,
        steps_per_eval: 0,
        mask_prompt: true,
        ..TrainConfig::default()
    };
    let mut losses = vec![];
    fit(
        &mut model,
        &mut lora,
        &mut batches,
        &valid,
        &config,
        &mut |e| {
            if let Event::Train { loss, .. } = e {
                losses.push(*loss)
            }
        },
        &mut |_, _| Ok(()),
    )
    .expect("train");
    assert_eq!(losses.len(), r.losses.len());
    for (step, (got, want)) in losses.iter().zip(&r.losses).enumerate() {
        let rel = (got - want).abs() / want.abs();
        assert!(
            rel < 1e-3,
            "{model_name}: step {step} loss {got}, PEFT {want} (relative {rel:e})"
        );
    }
    assert!(
        losses.last() < losses.first(),
        "{model_name}: the loss did not fall: {losses:?}"
    );
    let after = base_weights(&model);
    assert!(
        before == after,
        "{model_name}: a base weight changed during training"
    );
    let want = fixture_adapters::<Mlx>(model_name, "trained", model.config());
    for i in 0..lora.targets.len() {
        let d = max_abs(
            &values(lora.adapters.a[i].val()),
            &values(want.adapters.a[i].val()),
        );
        assert!(
            d < 1e-3,
            "{model_name}: trained A[{i}] differs from PEFT's by {d}"
        );
    }
}

#[test]
fn qwen3_adam_tracks_peft() {
    adam_tracks_peft::<Ad>("qwen3", train);
}

#[test]
fn llama_adam_tracks_peft() {
    adam_tracks_peft::<Ad>("llama", train);
}

/// The compiled step (MLX's own backward, the cross-entropy's written-out one through
/// `mlx_custom_vjp`, Adam traced into the step) trains as PEFT does too.
#[test]
fn qwen3_compiled_trainer_tracks_peft() {
    adam_tracks_peft::<Mlx>("qwen3", train_compiled);
}

#[test]
fn llama_compiled_trainer_tracks_peft() {
    adam_tracks_peft::<Mlx>("llama", train_compiled);
}

/// A scratch folder under the system's temporary folder, emptied first and removed when the
/// test ends (passed or not).
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("burn-mlx-lora-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    Scratch(dir)
}

#[test]
fn adapter_files_round_trip_in_both_layouts() {
    let device = MlxDevice::Cpu;
    let config = LlmConfig::from_dir(&fixture("qwen3")).expect("config");
    let lora = fixture_adapters::<Mlx>("qwen3", "initial", &config);
    let dir = scratch("roundtrip");
    files::save(&lora, &dir, &SaveInfo::default()).expect("save");
    for path in [dir.to_path_buf(), dir.join(files::PEFT_DIR)] {
        let back = files::load::<Mlx>(&path, &config, &device, DType::F32).expect("load");
        assert_eq!(back.config, lora.config, "{}", path.display());
        assert_eq!(back.targets, lora.targets);
        for i in 0..lora.targets.len() {
            assert_eq!(
                values(back.adapters.a[i].val()),
                values(lora.adapters.a[i].val())
            );
            assert_eq!(
                values(back.adapters.b[i].val()),
                values(lora.adapters.b[i].val())
            );
        }
    }
    let peft: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("peft").join(files::CONFIG)).expect("peft config"),
    )
    .expect("JSON");
    assert_eq!(peft["r"], 4);
    assert_eq!(peft["lora_alpha"], 8.0);
    assert_eq!(peft["layers_to_transform"], serde_json::json!([1]));
}

#[test]
fn fused_model_gives_the_adapted_logits() {
    let device = MlxDevice::Cpu;
    let r = reference("llama");
    let dir = scratch("fuse");
    let config = LlmConfig::from_dir(&fixture("llama")).expect("config");
    let lora = fixture_adapters::<Mlx>("llama", "initial", &config);
    files::save(&lora, &dir.join("adapters"), &SaveInfo::default()).expect("save");
    let report = fuse::<Mlx>(
        &fixture("llama"),
        &dir.join("adapters"),
        &dir.join("fused"),
        &device,
    )
    .expect("fuse");
    assert_eq!(report.fused, 7);
    let fused = load_model::<Mlx>(&dir.join("fused"), &device, DType::F32).expect("fused model");
    let seq = r.logits.len();
    let mut cache = fused.new_cache(seq);
    let logits = fused
        .forward(&r.tokens[0][..seq], &mut cache, Logits::All)
        .expect("forward");
    let d = max_diff("fused", &rows(logits), &r.logits);
    assert!(
        d < TOL,
        "fused model's logits differ from PEFT's adapted model by {d}"
    );
}

fn load_err(dir: &Path, config: &LlmConfig) -> String {
    match files::load::<Mlx>(dir, config, &MlxDevice::Cpu, DType::F32) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn adapters_that_do_not_fit_are_clear_errors() {
    let qwen3 = LlmConfig::from_dir(&fixture("qwen3")).expect("config");
    let lora = fixture_adapters::<Mlx>("qwen3", "initial", &qwen3);
    let dir = scratch("errors");
    files::save(&lora, &dir, &SaveInfo::default()).expect("save");

    // Another model: the same adapters against a config with a wider hidden size.
    let mut wide = qwen3.clone();
    wide.hidden_size = 128;
    let e = load_err(&dir, &wide);
    assert!(
        e.contains("adapters.safetensors") && e.contains("lora_a") && e.contains("[128, 4]"),
        "{e}"
    );

    // A deeper model: the config's last block is another layer, the file's tensor is not.
    let mut deep = qwen3.clone();
    deep.num_layers = 3;
    let e = load_err(&dir, &deep);
    assert!(
        e.contains("model.layers.2") || e.contains("model.layers.1"),
        "{e}"
    );

    // No adapter files.
    let empty = scratch("empty");
    let e = load_err(&empty, &qwen3);
    assert!(
        e.contains("adapters.safetensors") && e.contains("adapter_model.safetensors"),
        "{e}"
    );

    // A rank the file does not have.
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(files::CONFIG)).expect("config"))
            .expect("JSON");
    config["lora_parameters"]["rank"] = 8.into();
    std::fs::write(dir.join(files::CONFIG), config.to_string()).expect("write");
    let e = load_err(&dir, &qwen3);
    assert!(e.contains("[64, 8]") && e.contains("[64, 4]"), "{e}");

    // An unknown key.
    let bad = LoraConfig {
        keys: Some(vec!["self_attn.qkv".into()]),
        ..lora_config()
    };
    let e = targets(&qwen3, &bad).expect_err("bad key").to_string();
    assert!(
        e.contains("self_attn.qkv") && e.contains("self_attn.q_proj"),
        "{e}"
    );

    // A model whose projections are fused has no separate layers for the adapters.
    let mut fused = load_model::<Mlx>(&fixture("qwen3"), &MlxDevice::Cpu, DType::F32)
        .expect("model")
        .fuse_projections();
    let e = lora
        .install(&mut fused, false)
        .expect_err("fused")
        .to_string();
    assert!(e.contains("fused") && e.contains("q_proj"), "{e}");
}

/// The loss and adapter gradients of `lora` on `model` for `batch`.
fn loss_and_grads<B: burn_tensor::backend::AutodiffBackend>(
    model: &mut Llm<B>,
    lora: &Lora<B>,
    batch: &Batch,
) -> (f32, Vec<Vec<f32>>) {
    lora.install(model, true).expect("install");
    let t = BatchTensors::<B>::new(batch, model.device()).expect("batch");
    let loss = model.loss(t.tokens, t.rows, t.targets).expect("loss");
    let value: f32 = loss.clone().into_scalar().elem();
    let grads = GradientsParams::from_grads(loss.backward(), &lora.adapters);
    let all = lora
        .adapters
        .a
        .iter()
        .chain(&lora.adapters.b)
        .map(|p| values(grads.get::<B::InnerBackend, 2>(p.id).expect("gradient")))
        .collect();
    (value, all)
}

#[test]
fn qlora_keeps_the_base_quantized_and_matches_dequantized_weights() {
    use burn_ndarray::{NdArray, NdArrayDevice};
    let r = reference("qwen3");
    // Both the CPU's two product paths: many rows (dequantized, BLAS) and few (MLX's quantized
    // matmul), through the same autodiff node.
    let short = Batch {
        tokens: r.tokens[0][..6].to_vec(),
        batch: 1,
        seq: 6,
        lengths: vec![6],
        offsets: vec![0],
        truncated: 0,
    };
    for (label, batch) in [("batch", batch(&r)), ("six rows", short)] {
        for bits in [
            burn_mlx::quant::QuantBits::Q8,
            burn_mlx::quant::QuantBits::Q4,
        ] {
            let mut packed = load_model::<Ad>(&fixture("qwen3"), &MlxDevice::Cpu, DType::F32)
                .expect("model")
                .quantize(bits)
                .expect("quantize");
            assert!(
                packed.quantization().mlx_packed,
                "Autodiff<Mlx> keeps MLX's packed form"
            );
            type Nd = Autodiff<NdArray>;
            let mut plain = load_model::<Nd>(&fixture("qwen3"), &NdArrayDevice::Cpu, DType::F32)
                .expect("model")
                .quantize(bits)
                .expect("quantize");
            let lora_p = fixture_adapters::<Ad>("qwen3", "initial", packed.config());
            let lora_n = fixture_adapters::<Nd>("qwen3", "initial", plain.config());
            let (lp, gp) = loss_and_grads(&mut packed, &lora_p, &batch);
            let (ln, gn) = loss_and_grads(&mut plain, &lora_n, &batch);
            assert!((lp - ln).abs() < TOL, "{label} {bits}: loss {lp} vs {ln}");
            for (i, (a, b)) in gp.iter().zip(&gn).enumerate() {
                let d = max_abs(a, b);
                assert!(d < TOL, "{label} {bits}: gradient {i} differs by {d}");
            }
        }
    }
}

/// The fused path the GPU takes (`lora_linear`, RoPE, norms and attention as single autodiff
/// nodes with MLX's compiled VJPs), forced on MLX's CPU device: the same checks against PEFT.
/// Fusion stays on for the rest of the process; every other test passes either way.
#[test]
fn fused_path_matches_peft() {
    burn_mlx::nn::fuse_on_cpu(true);
    one_step_matches_peft("qwen3");
    one_step_matches_peft("llama");
    adam_tracks_peft::<Ad>("qwen3", train);
    adam_tracks_peft::<Mlx>("qwen3", train_compiled);
    qlora_keeps_the_base_quantized_and_matches_dequantized_weights();
}
