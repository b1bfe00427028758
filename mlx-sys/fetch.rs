//! The MLX wheel cache of mlx-sys's build script (Linux): where the cache lives, downloading the
//! pinned wheel with pip, unpacking it, checking an install and relinking its BLAS.
//!
//! Plain functions that return `Result<_, String>`; the error strings are complete messages for
//! the user (what went wrong, and how to recover). Nothing here prints: notes for the user go
//! through the `log` callback, which the build script turns into `cargo:warning` lines. The
//! file is shared by `build.rs` (`#[path = "fetch.rs"] mod fetch;`) and by the fault tests in
//! `tests/build_faults.rs`, which drive it with fake `python3` scripts.
//!
//! The guarantees, whatever fails:
//! - A cache entry `<root>/<package>-<version>` is only ever created by renaming a fully unpacked
//!   and checked folder into place, with a `.burn-mlx-complete` marker written last, so an
//!   interrupted download or unpack never looks installed.
//! - A lock file (`<root>/<package>-<version>.lock`) serializes builds that share the cache.
//! - Temporary `.<package>-<version>-partial-<pid>` folders are removed on failure, and stale ones
//!   left by a killed build are swept by the next build (which holds the lock).
//! - A cached copy that is marked complete but broken (a missing or truncated `libmlx.so`, a
//!   wrong version) is detected and downloaded again.
//! - A complete cache is used without pip or the network, and without writing to it when the
//!   cache folder is read-only.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The file, inside a cache entry, whose presence marks the entry as complete.
pub const MARKER: &str = ".burn-mlx-complete";

/// The cache folder: `BURN_MLX_CACHE`, else `$XDG_CACHE_HOME/burn-mlx`, else
/// `$HOME/.cache/burn-mlx`. `var` reads an environment variable.
pub fn cache_root(var: &dyn Fn(&str) -> Option<OsString>) -> Result<PathBuf, String> {
    if let Some(dir) = var("BURN_MLX_CACHE").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = var("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir).join("burn-mlx"));
    }
    match var("HOME").filter(|d| !d.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".cache/burn-mlx")),
        None => Err(
            "neither BURN_MLX_CACHE, XDG_CACHE_HOME nor HOME is set: set BURN_MLX_CACHE to a \
             writable folder for the MLX download"
                .into(),
        ),
    }
}

/// The system OpenBLAS, when one is installed in a usual place.
pub fn find_openblas() -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
        "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
        "/usr/lib64/libopenblas.so.0",
        "/usr/lib/libopenblas.so.0",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// Checks that `dir` holds MLX `version` (`lib/libmlx.so`, a whole ELF file, and
/// `include/mlx/version.h` with that version). `from` names where `dir` came from (an
/// environment variable, or "the cached wheel") for the message.
pub fn check_prefix(dir: &Path, from: &str, version: &str) -> Result<PathBuf, String> {
    let lib = dir.join("lib/libmlx.so");
    let version_h = dir.join("include/mlx/version.h");
    // `from` is an environment variable (advice on setting it follows) or a description.
    let env_var = from.chars().all(|c| c.is_ascii_uppercase() || c == '_');
    if !lib.exists() || !version_h.exists() {
        let advice = if env_var {
            format!(
                ". Point {from} at the prefix of an MLX {version} build (for the wheel: the \
                 folder `mlx` inside site-packages), or unset it to let the build download the \
                 pinned wheel"
            )
        } else {
            String::new()
        };
        return Err(format!(
            "{from}={} does not hold an MLX install: expected {} and {}{advice}",
            dir.display(),
            lib.display(),
            version_h.display()
        ));
    }
    check_elf(&lib).map_err(|e| {
        format!(
            "{from}={}: {} is damaged ({e}). Reinstall MLX {version} there",
            dir.display(),
            lib.display()
        )
    })?;
    let text = fs::read_to_string(&version_h).unwrap_or_default();
    let part = |name: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("#define {name} ")))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    let found = format!(
        "{}.{}.{}",
        part("MLX_VERSION_MAJOR"),
        part("MLX_VERSION_MINOR"),
        part("MLX_VERSION_PATCH")
    );
    if found != version {
        let advice = if env_var {
            format!(". Install that version (`pip install mlx-cpu=={version}`) or unset {from}")
        } else {
            String::new()
        };
        return Err(format!(
            "{from}={} holds MLX {found}, but mlx-c 0.7.0 (used by mlx-rs 0.33) needs MLX \
             {version} exactly{advice}",
            dir.display()
        ));
    }
    Ok(dir.to_path_buf())
}

/// Checks that `path` is a whole ELF file: the magic number, and a section header table that
/// ends inside the file (it is written last, so a truncated copy fails this).
pub fn check_elf(path: &Path) -> Result<(), String> {
    let mut file = fs::File::open(path).map_err(|e| format!("cannot open it: {e}"))?;
    let len = file
        .metadata()
        .map_err(|e| format!("cannot stat it: {e}"))?
        .len();
    let mut header = [0u8; 64];
    let got = file
        .read(&mut header)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if got < 52 || header[..4] != *b"\x7fELF" {
        return Err(format!("not an ELF shared library ({len} bytes)"));
    }
    let big = header[5] == 2;
    let num = |at: usize, size: usize| -> u64 {
        let bytes = &header[at..at + size];
        let fold = |acc: u64, b: &u8| (acc << 8) | u64::from(*b);
        if big {
            bytes.iter().fold(0, fold)
        } else {
            bytes.iter().rev().fold(0, fold)
        }
    };
    let (shoff, shentsize, shnum) = match header[4] {
        1 => (num(0x20, 4), num(0x2E, 2), num(0x30, 2)),
        2 if got == 64 => (num(0x28, 8), num(0x3A, 2), num(0x3C, 2)),
        _ => return Err("an ELF header of an unknown class".into()),
    };
    let end = shoff + shentsize * shnum;
    if end > len {
        return Err(format!(
            "truncated: {len} bytes, but its section headers end at byte {end}"
        ));
    }
    // The last byte must be readable too (a sparse or short file on some file systems).
    if len > 0 {
        file.seek(SeekFrom::Start(len - 1))
            .and_then(|_| file.read_exact(&mut [0u8; 1]))
            .map_err(|e| format!("cannot read its end: {e}"))?;
    }
    Ok(())
}

/// Checks a cache entry: the marker, the MLX install under `mlx/`, and the size of `libmlx.so`
/// recorded in the marker.
fn check_entry(dest: &Path, version: &str) -> Result<PathBuf, String> {
    let marker = fs::read_to_string(dest.join(MARKER))
        .map_err(|e| format!("cannot read {}: {e}", dest.join(MARKER).display()))?;
    let prefix = check_prefix(&dest.join("mlx"), "the cached wheel", version)?;
    let recorded = marker
        .lines()
        .find_map(|l| l.strip_prefix("libmlx.so "))
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(size) = recorded {
        let lib = prefix.join("lib/libmlx.so");
        let actual = fs::metadata(&lib).map(|m| m.len()).unwrap_or(0);
        if actual != size {
            return Err(format!(
                "{} has {actual} bytes, but {size} were installed",
                lib.display()
            ));
        }
    }
    Ok(prefix)
}

/// Returns the prefix (`…/mlx`) of the unpacked pinned wheel `package==version` in the cache
/// `root`, downloading it with `python -m pip download` when the cache has no complete, sound
/// copy, and relinking its BLAS to `openblas` (see [`link_blas`]). Notes for the user go to
/// `log`.
pub fn wheel_prefix(
    package: &str,
    version: &str,
    root: &Path,
    python: &OsStr,
    openblas: Option<&Path>,
    log: &mut dyn FnMut(&str),
) -> Result<PathBuf, String> {
    let name = format!("{package}-{version}");
    let dest = root.join(&name);
    let recover =
        format!("Set BURN_MLX_CACHE to a writable folder, or MLX_DIR to an MLX {version} install");
    let lock = fs::create_dir_all(root)
        .map_err(|e| format!("cannot create the MLX cache folder {}: {e}", root.display()))
        .and_then(|_| {
            fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(root.join(format!("{name}.lock")))
                .map_err(|e| format!("the MLX cache {} is not writable ({e})", root.display()))
        });
    let lock = match lock {
        Ok(lock) => lock,
        Err(e) => {
            // A complete copy in a read-only cache (one prepared for several users, say) is
            // fine: nothing needs writing.
            if let Ok(prefix) = check_entry(&dest, version) {
                log(&format!(
                    "{e}; using its complete copy of {package} {version} without locking"
                ));
                if let Err(e) = link_blas(&dest, openblas, log) {
                    log(&e);
                }
                return Ok(prefix);
            }
            return Err(format!("{e}. {recover}"));
        }
    };
    lock.lock().map_err(|e| {
        format!(
            "cannot lock {}: {e}",
            root.join(format!("{name}.lock")).display()
        )
    })?;

    // Under the lock, any partial folder is the remains of a killed build.
    let partial = format!(".{name}-partial-");
    for entry in fs::read_dir(root).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with(&partial) {
            let path = entry.path();
            log(&format!(
                "removing {}, left by an interrupted build",
                path.display()
            ));
            fs::remove_dir_all(&path).map_err(|e| {
                format!(
                    "cannot remove the stale partial download {}: {e}. Delete it and build again",
                    path.display()
                )
            })?;
        }
    }

    if dest.join(MARKER).exists() {
        match check_entry(&dest, version) {
            Ok(prefix) => {
                if let Err(e) = link_blas(&dest, openblas, log) {
                    log(&e);
                }
                return Ok(prefix);
            }
            Err(e) => log(&format!(
                "the cached MLX in {} is damaged ({e}); downloading it again",
                dest.display()
            )),
        }
    } else if dest.exists() {
        log(&format!(
            "{} has no {MARKER} marker (an unfinished install); downloading MLX again",
            dest.display()
        ));
    }
    if dest.exists() {
        fs::remove_dir_all(&dest).map_err(|e| {
            format!(
                "cannot remove the damaged MLX cache entry {}: {e}. Delete that folder and build \
                 again. {recover}",
                dest.display()
            )
        })?;
    }

    install_wheel(package, version, root, &dest, python, log)?;
    let prefix = check_entry(&dest, version).map_err(|e| {
        format!(
            "the freshly installed MLX is not usable: {e}. Delete {} and build again",
            dest.display()
        )
    })?;
    if let Err(e) = link_blas(&dest, openblas, log) {
        log(&e);
    }
    drop(lock);
    Ok(prefix)
}

/// Runs a command; its stdout on success, else a message ending with `hint`.
fn run(cmd: &mut Command, hint: &str) -> Result<String, String> {
    match cmd.output() {
        Ok(out) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        Ok(out) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let lines: Vec<&str> = stderr.trim().lines().collect();
            let tail = lines[lines.len().saturating_sub(8)..].join("\n    ");
            Err(format!(
                "`{cmd:?}` failed ({}).\n    {tail}\n  {hint}",
                out.status
            ))
        }
        Err(e) => Err(format!("could not start `{cmd:?}`: {e}.\n  {hint}")),
    }
}

/// Downloads and unpacks the wheel into `dest`, through a temporary folder in `root` that is
/// renamed into place only when the copy is complete and checked. The temporary folder is
/// removed whatever happens.
fn install_wheel(
    package: &str,
    version: &str,
    root: &Path,
    dest: &Path,
    python: &OsStr,
    log: &mut dyn FnMut(&str),
) -> Result<(), String> {
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    let tmp = root.join(format!(".{name}-partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
    let result = install_into(package, version, root, dest, &tmp, python, log);
    let _ = fs::remove_dir_all(&tmp);
    result
}

fn install_into(
    package: &str,
    version: &str,
    root: &Path,
    dest: &Path,
    tmp: &Path,
    python: &OsStr,
    log: &mut dyn FnMut(&str),
) -> Result<(), String> {
    let spec = format!("{package}=={version}");
    log(&format!(
        "downloading {spec} from PyPI into {}",
        root.display()
    ));
    run(
        Command::new(python)
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:"])
            .arg("--dest")
            .arg(tmp)
            .arg(&spec),
        &format!(
            "burn-mlx downloads {spec} once, with python3's pip, into {}. Check the network \
             (or PIP_INDEX_URL / the proxy), install pip if it is missing (Debian: `apt-get \
             install python3-pip`), or set MLX_DIR to an MLX {version} install; then build \
             again. Nothing was installed (the partial download was removed)",
            root.display()
        ),
    )?;
    let wheel = fs::read_dir(tmp)
        .ok()
        .and_then(|d| {
            d.flatten()
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|x| x == "whl"))
        })
        .ok_or_else(|| {
            format!(
                "pip reported success but left no wheel for {spec}; nothing was installed. \
                 Build again, or set MLX_DIR to an MLX {version} install"
            )
        })?;
    let unpacked = tmp.join("unpacked");
    run(
        Command::new(python)
            .args(["-m", "zipfile", "-e"])
            .arg(&wheel)
            .arg(&unpacked),
        &format!(
            "the downloaded wheel {} is not a valid archive; nothing was installed (it was \
             removed). Build again; if this repeats, pip's cache holds a bad copy: run \
             `{} -m pip cache purge`",
            wheel.file_name().unwrap_or_default().to_string_lossy(),
            python.to_string_lossy()
        ),
    )?;
    let _ = fs::remove_file(&wheel);
    let prefix =
        check_prefix(&unpacked.join("mlx"), "the downloaded wheel", version).map_err(|e| {
            format!(
                "{e}. Nothing was installed; build again, or set MLX_DIR to an MLX {version} \
                 install"
            )
        })?;
    let size = fs::metadata(prefix.join("lib/libmlx.so"))
        .map(|m| m.len())
        .map_err(|e| e.to_string())?;
    fs::File::create(unpacked.join(MARKER))
        .and_then(|mut f| {
            f.write_all(format!("{spec}\nlibmlx.so {size}\n").as_bytes())?;
            f.sync_all()
        })
        .map_err(|e| format!("cannot write the install marker in {}: {e}", tmp.display()))?;
    fs::rename(&unpacked, dest).map_err(|e| {
        format!(
            "cannot move the unpacked wheel into {}: {e}. Nothing was installed",
            dest.display()
        )
    })
}

/// Points the wheel's reference BLAS and LAPACK (`<dest>/*.libs/lib{blas,lapack}-*`) at the
/// system OpenBLAS when `openblas` is given (about 40× faster matmuls), and restores the wheel's
/// own copies when it is not. The wheel's files are kept as `*.orig`. Does nothing when the
/// links are already as wanted, so a read-only complete cache needs no write. An error leaves
/// the library in place (the original is restored) and says what happened.
pub fn link_blas(
    dest: &Path,
    openblas: Option<&Path>,
    log: &mut dyn FnMut(&str),
) -> Result<(), String> {
    let Some(libs) = fs::read_dir(dest).ok().and_then(|d| {
        d.flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().ends_with(".libs"))
    }) else {
        return Ok(());
    };
    let mut blas_found = false;
    for entry in fs::read_dir(&libs).into_iter().flatten().flatten() {
        let path = entry.path();
        let file = entry.file_name().to_string_lossy().into_owned();
        if file.ends_with(".orig")
            || !(file.starts_with("libblas-") || file.starts_with("liblapack-"))
        {
            continue;
        }
        blas_found = true;
        let orig = libs.join(format!("{file}.orig"));
        let link = fs::read_link(&path).ok();
        let wanted = match openblas {
            Some(target) => link.as_deref() == Some(target),
            None => link.is_none() && orig.exists(),
        };
        if wanted || (openblas.is_none() && !orig.exists()) {
            continue;
        }
        let relink = || -> std::io::Result<()> {
            if !orig.exists() {
                fs::rename(&path, &orig)?;
            } else {
                fs::remove_file(&path)?;
            }
            let made = match openblas {
                Some(target) => std::os::unix::fs::symlink(target, &path),
                None => fs::copy(&orig, &path).map(|_| ()),
            };
            if made.is_err() && !path.exists() {
                let _ = fs::copy(&orig, &path);
            }
            made
        };
        relink().map_err(|e| {
            format!(
                "cannot relink {} ({e}); MLX keeps the wheel's reference BLAS (slower matmuls)",
                path.display()
            )
        })?;
    }
    if blas_found && openblas.is_none() {
        log(
            "OpenBLAS not found; MLX uses the wheel's reference BLAS and matmuls run about 40x \
             slower. Install it (Debian: `apt-get install libopenblas0`) and rebuild (`touch \
             mlx-sys/build.rs` or `cargo clean -p mlx-sys`)",
        );
    }
    Ok(())
}
