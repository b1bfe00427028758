//! Build script of burn-mlx's `mlx-sys`.
//!
//! On Linux it links a prebuilt MLX 0.32.2 (from `MLX_DIR`, or from the pinned PyPI wheel that it
//! downloads once into a cache outside the repository), compiles the mlx-c 0.7.0 sources taken
//! from the published `mlx-sys` package with `cc`, and generates bindings with bindgen.
//! On macOS it builds mlx-c (and MLX through mlx-c's CMake) with Metal and Accelerate, as the
//! published crate does.
//!
//! Every failure ends with a message that says what is missing and how to fix it, never with a
//! panic backtrace.

use std::env;
use std::fmt::Display;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The MLX wheel cache (Linux): download, unpack, check, repair. Shared with
/// `tests/build_faults.rs`.
#[path = "fetch.rs"]
mod fetch;

/// The MLX release mlx-c 0.7.0 is written against. Other versions do not compile with it.
const MLX_VERSION: &str = "0.32.2";
/// The published mlx-sys package whose `src/mlx-c` we compile.
const MLX_C_CRATE: &str = "mlx-sys-0.7.0";

fn main() {
    for var in [
        "MLX_DIR",
        "BURN_MLX_CACHE",
        "BURN_MLX_CUDA",
        "BURN_MLX_PYTHON",
        "XDG_CACHE_HOME",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");

    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mlx_c = mlx_c_sources(&out_dir);

    if target_os == "macos" {
        macos::build(&mlx_c);
    } else {
        linux::build(&mlx_c, &out_dir);
    }
    generate_bindings(&mlx_c, &out_dir);
}

/// Stops the build with a message for the user (no backtrace).
fn fail(what: impl Display) -> ! {
    eprintln!("\nerror: burn-mlx could not build its native layer (mlx-sys):\n  {what}\n");
    println!(
        "cargo:warning=mlx-sys: {}",
        what.to_string().replace('\n', " ")
    );
    std::process::exit(1);
}

/// Runs a command and returns its stdout, or stops the build with `hint`.
fn run(cmd: &mut Command, hint: &str) -> String {
    match cmd.output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        Ok(out) => fail(format!(
            "`{cmd:?}` failed ({}).\n  {}\n  {hint}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => fail(format!("could not start `{cmd:?}`: {e}.\n  {hint}")),
    }
}

/// Finds mlx-c in the published mlx-sys 0.7.0 package, fetching it with cargo when needed.
///
/// Cargo keeps downloaded packages in `$CARGO_HOME/registry/{src,cache}`; the repository holds
/// none of mlx-c's files.
fn mlx_c_sources(out_dir: &Path) -> PathBuf {
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| fail("neither CARGO_HOME nor HOME is set"));
    let find = || -> Option<PathBuf> {
        let registry = cargo_home.join("registry");
        for entry in fs::read_dir(registry.join("src")).ok()?.flatten() {
            let dir = entry.path().join(MLX_C_CRATE).join("src/mlx-c");
            if dir.join("mlx/c/mlx.h").exists() {
                return Some(dir);
            }
        }
        for entry in fs::read_dir(registry.join("cache")).ok()?.flatten() {
            let archive = entry.path().join(format!("{MLX_C_CRATE}.crate"));
            if archive.exists() {
                let dest = out_dir.join("mlx-c-src");
                let _ = fs::remove_dir_all(&dest);
                fs::create_dir_all(&dest).ok()?;
                run(
                    Command::new("tar")
                        .arg("xzf")
                        .arg(&archive)
                        .arg("-C")
                        .arg(&dest),
                    "tar is needed to unpack the mlx-c sources",
                );
                return Some(dest.join(MLX_C_CRATE).join("src/mlx-c"));
            }
        }
        None
    };
    if let Some(dir) = find() {
        return dir;
    }

    // Not downloaded yet: let cargo fetch it, through a throwaway manifest of its own.
    let fetch_dir = out_dir.join("mlx-c-fetch");
    fs::create_dir_all(fetch_dir.join("src")).unwrap_or_else(|e| fail(e));
    fs::write(
        fetch_dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"mlx-c-fetch\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n\
             [dependencies]\nmlx-sys = \"={}\"\n\n[workspace]\n",
            &MLX_C_CRATE["mlx-sys-".len()..]
        ),
    )
    .unwrap_or_else(|e| fail(e));
    fs::write(fetch_dir.join("src/lib.rs"), "").unwrap_or_else(|e| fail(e));
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run(
        Command::new(cargo)
            .arg("fetch")
            .arg("--manifest-path")
            .arg(fetch_dir.join("Cargo.toml")),
        "mlx-c comes from the published mlx-sys 0.7.0 package on crates.io: check the network \
         (or run `cargo fetch` once online), then build again",
    );
    find().unwrap_or_else(|| {
        fail(format!(
            "cargo fetched {MLX_C_CRATE}, but its sources are not under {}",
            cargo_home.join("registry").display()
        ))
    })
}

/// Generates Rust bindings for every mlx-c header.
fn generate_bindings(mlx_c: &Path, out_dir: &Path) {
    let mut headers: Vec<PathBuf> = fs::read_dir(mlx_c.join("mlx/c"))
        .unwrap_or_else(|e| fail(format!("cannot read the mlx-c headers: {e}")))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "h"))
        .collect();
    headers.sort();
    let builder = headers.iter().fold(
        bindgen::Builder::default()
            .clang_arg(format!("-I{}", mlx_c.display()))
            .blocklist_function("malloc")
            .blocklist_function("realloc")
            .layout_tests(false),
        |b, h| b.header(h.to_string_lossy()),
    );
    // bindgen panics when it cannot load libclang; turn that into an actionable message.
    std::panic::set_hook(Box::new(|_| {}));
    let generated = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| builder.generate()));
    let _ = std::panic::take_hook();
    let bindings = generated.unwrap_or_else(|_| {
        fail(
            "bindgen could not load libclang. Install it (Debian/Ubuntu: `apt-get install \
             libclang-dev`), or point LIBCLANG_PATH at the folder holding libclang.so",
        )
    });
    let bindings =
        bindings.unwrap_or_else(|e| fail(format!("bindgen failed on the mlx-c headers: {e}")));
    bindings
        .write_to_file(out_dir.join("bindings.rs"))
        .unwrap_or_else(|e| fail(format!("cannot write the bindings: {e}")));
}

#[cfg(not(target_os = "macos"))]
mod macos {
    use std::path::Path;

    pub fn build(_mlx_c: &Path) {
        super::fail("this build script was compiled on a non-macOS host for a macOS target; cross-compiling MLX is not supported");
    }
}

#[cfg(target_os = "macos")]
mod macos {
    //! macOS: build mlx-c with CMake, which fetches and builds MLX with Metal and Accelerate,
    //! and link everything statically, like the published crate.
    use std::path::Path;

    pub fn build(mlx_c: &Path) {
        let metal = std::env::var_os("CARGO_FEATURE_METAL").is_some();
        let accelerate = std::env::var_os("CARGO_FEATURE_ACCELERATE").is_some();
        let on_off = |b: bool| if b { "ON" } else { "OFF" };
        let dst = cmake::Config::new(mlx_c)
            .define("MLX_BUILD_METAL", on_off(metal))
            .define("MLX_BUILD_ACCELERATE", on_off(accelerate))
            .define("CMAKE_INSTALL_PREFIX", ".")
            .build();
        println!("cargo:rustc-link-search=native={}/build/lib", dst.display());
        println!(
            "cargo:rustc-link-search=native={}/build/_deps/mlx-build",
            dst.display()
        );
        println!("cargo:rustc-link-lib=static=mlx");
        println!("cargo:rustc-link-lib=static=mlxc");
        println!("cargo:rustc-link-lib=c++");
        println!("cargo:rustc-link-lib=framework=Foundation");
        if metal {
            println!("cargo:rustc-link-lib=framework=Metal");
        }
        if accelerate {
            println!("cargo:rustc-link-lib=framework=Accelerate");
        }
        println!("cargo:libdir=");
    }
}

mod linux {
    //! Linux: a prebuilt libmlx (from `MLX_DIR` or the pinned wheel) and mlx-c compiled here.
    use super::{fail, fetch, MLX_VERSION};
    use std::env;
    use std::fs;
    use std::path::{Path, PathBuf};

    pub fn build(mlx_c: &Path, out_dir: &Path) {
        let cuda = env::var_os("CARGO_FEATURE_CUDA").is_some()
            || env::var("BURN_MLX_CUDA").is_ok_and(|v| !v.is_empty() && v != "0");
        let prefix = match env::var_os("MLX_DIR") {
            Some(dir) => check_prefix(Path::new(&dir), "MLX_DIR"),
            None => wheel_prefix(cuda),
        };
        let include = prefix.join("include");
        let libdir = prefix.join("lib");

        compile_mlx_c(mlx_c, &include, out_dir);

        println!("cargo:rustc-link-search=native={}", libdir.display());
        println!("cargo:rustc-link-lib=dylib=mlx");
        println!("cargo:rustc-link-lib=dylib=stdc++");
        // This crate's own tests and examples; dependents read `DEP_MLX_LIBDIR` for theirs.
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", libdir.display());
        println!("cargo:libdir={}", libdir.display());
        println!("cargo:include={}", include.display());
        println!("cargo:cuda={}", if cuda { 1 } else { 0 });
        if cuda {
            link_cuda();
        }
    }

    /// Link settings for the CUDA variant of MLX.
    ///
    /// `libmlx.so` from `mlx-cuda-13` needs the CUDA 13 runtime libraries (cuBLAS, cuDNN 9, cuFFT,
    /// NVRTC, NCCL) and the driver's `libcuda.so.1`. The driver exists only on machines with an
    /// NVIDIA GPU, so the link must not resolve libmlx's own dependencies: they are found when the
    /// program starts. `BURN_MLX_CUDA_LIBS` (folders separated by `:`) adds those folders to the
    /// run path, so that no `LD_LIBRARY_PATH` is needed at run time.
    fn link_cuda() {
        // This crate's own tests; dependents read `DEP_MLX_CUDA` and `DEP_MLX_CUDA_LIBS`.
        println!("cargo:rustc-link-arg=-Wl,--allow-shlib-undefined");
        println!("cargo:rerun-if-env-changed=BURN_MLX_CUDA_LIBS");
        let dirs = env::var("BURN_MLX_CUDA_LIBS").unwrap_or_default();
        for dir in dirs.split(':').filter(|d| !d.is_empty()) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
        println!("cargo:cuda_libs={dirs}");
    }

    /// Checks that `dir` holds MLX 0.32.2 (`lib/libmlx.so`, `include/mlx/version.h`).
    fn check_prefix(dir: &Path, from: &str) -> PathBuf {
        fetch::check_prefix(dir, from, MLX_VERSION).unwrap_or_else(|e| fail(e))
    }

    /// The MLX download cache (see `fetch::cache_root`).
    fn cache_root() -> PathBuf {
        fetch::cache_root(&|name| env::var_os(name)).unwrap_or_else(|e| fail(e))
    }

    /// Returns the prefix of the unpacked pinned wheel, downloading it once (see
    /// `fetch::wheel_prefix`: a lock file, a temporary folder renamed into place when complete,
    /// broken or partial copies repaired) and relinking its BLAS to the system OpenBLAS.
    fn wheel_prefix(cuda: bool) -> PathBuf {
        let package = if cuda { "mlx-cuda-13" } else { "mlx-cpu" };
        let python = env::var_os("BURN_MLX_PYTHON").unwrap_or_else(|| "python3".into());
        let openblas = fetch::find_openblas();
        fetch::wheel_prefix(
            package,
            MLX_VERSION,
            &cache_root(),
            &python,
            openblas.as_deref(),
            &mut |note| println!("cargo:warning=mlx-sys: {}", note.replace('\n', " ")),
        )
        .unwrap_or_else(|e| fail(e))
    }

    /// Compiles mlx-c's C++ sources into a static library.
    fn compile_mlx_c(mlx_c: &Path, mlx_include: &Path, out_dir: &Path) {
        // GCC 12 has no <format>: mlx-c's private/io.h uses std::format for two error messages.
        let shim = out_dir.join("burn_mlx_format_shim.h");
        fs::write(&shim, FORMAT_SHIM).unwrap_or_else(|e| fail(e));
        let mut sources: Vec<PathBuf> = fs::read_dir(mlx_c.join("mlx/c"))
            .unwrap_or_else(|e| fail(e))
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "cpp"))
            .collect();
        sources.sort();
        let mut build = cc::Build::new();
        build
            .cpp(true)
            .std("c++20")
            .include(mlx_c)
            .include(mlx_include)
            .flag("-include")
            .flag(shim.to_str().unwrap())
            .warnings(false)
            .extra_warnings(false)
            .flag_if_supported("-w")
            .files(&sources);
        if let Err(e) = build.try_compile("mlxc") {
            fail(format!(
                "compiling mlx-c failed: {e}. A C++20 compiler is needed (g++ 12 or newer, or \
                 clang 15 or newer); set CXX to choose one"
            ));
        }
    }

    /// A minimal `std::format` for compilers without `<format>`: replaces each `{}` in order.
    const FORMAT_SHIM: &str = r#"
#pragma once
#if defined(__cplusplus)
#if __has_include(<format>)
#include <format>
#endif
#if !defined(__cpp_lib_format)
#include <sstream>
#include <string>
#include <string_view>
namespace std {
inline void burn_mlx_format_rest(std::ostringstream& os, std::string_view f) { os << f; }
template <typename T, typename... Rest>
void burn_mlx_format_rest(std::ostringstream& os, std::string_view f, const T& v, const Rest&... rest) {
  auto pos = f.find("{}");
  if (pos == std::string_view::npos) { os << f; return; }
  os << f.substr(0, pos) << v;
  burn_mlx_format_rest(os, f.substr(pos + 2), rest...);
}
template <typename... Args>
std::string format(std::string_view f, const Args&... args) {
  std::ostringstream os;
  burn_mlx_format_rest(os, f, args...);
  return os.str();
}
} // namespace std
#endif
#endif
"#;
}
