#!/usr/bin/env bash
# Runs Burn's own backend test suite (tracel-ai/burn at tag v0.21.0, crates/burn-backend-tests)
# against burn-mlx's `Mlx` (or, as a peer, against burn-flex) with f32, f16 or bf16 as the float
# element, and prints the passed/failed/ignored counts and the names of the failing tests.
#
#   scripts/burn_suite.sh [options] [-- TEST_FILTER...]
#     --burn DIR        Burn v0.21.0 checkout (default ../burn-v0.21.0 beside this repo); when DIR
#                       does not exist, tag v0.21.0 is cloned into it (needs the network)
#     --backend B       mlx (default), fused (`burn_mlx::MlxFused`: Burn's op stream over Mlx,
#                       recurring blocks compiled by MLX) or flex
#     --float F         f32 (default), f16 or bf16
#     --suite S         tensor (default) or autodiff
#     --gpu             build MLX's CUDA variant (burn-mlx feature `cuda`, where `MlxDevice::default()`
#                       is the GPU) with upstream's GPU skip flags (`metal`: no f64 tests; `cuda`:
#                       the looser LU tolerances); its own target folder
#     --work DIR        where the harness crate is generated (default ../burn-mlx-suite)
#     --threads N       test threads (default: the number of cores)
#     --tol-scale S     every `assert_approx_eq::<FloatElem>` of the suite allows S times its
#                       tolerance (S = 8 scales the tolerances written for f16 to bf16's epsilon,
#                       2^-7 against 2^-10); its own copy of the tests and test targets
#   CARGO_TARGET_DIR    build folder (default WORK/target, or WORK/target-cuda with --gpu)
#
# Nothing of Burn's code goes into this repo. The script writes a small crate in WORK, outside
# both repositories, with a copy of the suite's test files (one call patched, see below); its test
# targets include those files (by `#[path]`) and define the suite's `TestBackend` as a typed backend (`burn_mlx::Mlx` or
# `burn_flex::Flex`; `burn_autodiff::Autodiff<_>` and its checkpointed form for the autodiff
# suite) instead of Burn's `Dispatch`. The float variants set the default float dtype the way the
# suite's own `tensor_f16.rs` does; f16/bf16 run the float tests only, as upstream's f16 files do.
# burn-tensor and burn-autodiff come from crates.io at =0.21.0 (the same sources as the tag; the
# script checks the checkout's version), so that burn-mlx and the tests share one Burn.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
burn_dir="$(dirname "$here")/burn-v0.21.0"
work="$(dirname "$here")/burn-mlx-suite"
backend=mlx
float=f32
suite=tensor
gpu=0
threads="$(nproc 2>/dev/null || echo 2)"
tol_scale=1
filter=()

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --burn) burn_dir="$2"; shift 2 ;;
    --backend) backend="$2"; shift 2 ;;
    --float) float="$2"; shift 2 ;;
    --suite) suite="$2"; shift 2 ;;
    --gpu) gpu=1; shift ;;
    --work) work="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --tol-scale) tol_scale="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    --) shift; filter=("$@"); break ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
done
case "$backend" in mlx|fused|flex) ;; *) echo "--backend must be mlx, fused or flex" >&2; exit 2 ;; esac
case "$float" in f32|f16|bf16) ;; *) echo "--float must be f32, f16 or bf16" >&2; exit 2 ;; esac
case "$suite" in tensor|autodiff) ;; *) echo "--suite must be tensor or autodiff" >&2; exit 2 ;; esac
case "$tol_scale" in ''|*[!0-9]*) echo "--tol-scale must be a whole number" >&2; exit 2 ;; esac
if [ "$gpu" = 1 ] && [ "$backend" = flex ]; then
  echo "--gpu is for --backend mlx or fused (burn-flex runs on the CPU)" >&2; exit 2
fi

# The Burn checkout: a path, or a clone of the tag where the network allows.
if [ ! -d "$burn_dir" ]; then
  echo "== cloning tracel-ai/burn v0.21.0 into $burn_dir"
  git clone --quiet --depth 1 --branch v0.21.0 https://github.com/tracel-ai/burn "$burn_dir"
fi
burn_dir="$(cd "$burn_dir" && pwd)"
tests="$burn_dir/crates/burn-backend-tests/tests"
if [ ! -f "$tests/autodiff/mod.rs" ] || [ ! -f "$tests/tensor/float/mod.rs" ]; then
  echo "$burn_dir has no crates/burn-backend-tests/tests: not a Burn checkout" >&2; exit 2
fi
if ! grep -q '^version = "0.21.0"' "$burn_dir/Cargo.toml"; then
  echo "$burn_dir is not Burn 0.21.0 (its Cargo.toml says otherwise): check out tag v0.21.0" >&2
  exit 2
fi

# The harness crate (regenerated on each run; unchanged files keep cargo's cache valid).
mkdir -p "$work/tests"
# The suite's test files, copied from the checkout (only the ones that changed) and patched in
# one place: the quantization tests call `TestBackend::default_quant_scheme`, an inherent method
# of Burn's `Dispatch`; here it is a trait method for any backend, called by its trait.
# With --tol-scale, a second copy whose approximate comparisons go through the harness's scaled
# check instead (see `ScaledApproxEq` below).
copy="$work/upstream"
suffix=""
if [ "$tol_scale" != 1 ]; then copy="$work/upstream-tol$tol_scale"; suffix="_tol$tol_scale"; fi
mkdir -p "$copy"
cp -ru "$tests/." "$copy/"
{ grep -rl 'TestBackend::default_quant_scheme(' "$copy" || true; } | while read -r f; do
  sed -i 's/TestBackend::default_quant_scheme(/<TestBackend as crate::DefaultQuantScheme>::default_quant_scheme(/g' "$f"
done
if [ "$tol_scale" != 1 ]; then
  { grep -rl 'assert_approx_eq::<FloatElem>(' "$copy" || true; } | while read -r f; do
    sed -i 's/assert_approx_eq::<FloatElem>(/assert_approx_eq_scaled::<FloatElem>(/g' "$f"
  done
fi
tests="$copy"
write() { # write FILE only when its content changes, so that cargo does not rebuild for nothing
  local tmp; tmp="$(mktemp)"; cat >"$tmp"
  if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv "$tmp" "$1"; fi
}
write "$work/Cargo.toml" <<EOF
# Generated by burn-mlx's scripts/burn_suite.sh: Burn's backend suite against typed backends.
[package]
name = "burn-mlx-suite"
version = "0.0.0"
edition = "2024"
publish = false

# The suite's files import burn_backend_tests::might_panic from their own crate's library.
[lib]
name = "burn_backend_tests"

[workspace]

[features]
default = ["std", "quantization"]
# cfg names the suite's files test for.
std = []
quantization = []
distributed = []
# Upstream's GPU skip flags, with MLX's CUDA build (--gpu).
metal = []
cuda = ["burn-mlx/cuda"]

[dependencies]
burn-mlx = { path = "$here" }
burn-tensor = { version = "=0.21.0" }
burn-autodiff = { version = "=0.21.0", features = ["export_tests"] }
burn-flex = { version = "=0.21.0" }
burn-tensor-testgen = { version = "=0.21.0" }
num-traits = { version = "0.2.19", default-features = false, features = ["std"] }
serial_test = "3.2.0"
ctor = "0.10.1"

[patch.crates-io]
mlx-sys = { path = "$here/mlx-sys" }

[profile.dev]
opt-level = 1
incremental = false

[profile.dev.package."*"]
opt-level = 2
EOF
mkdir -p "$work/src"
write "$work/src/lib.rs" <<'EOF'
//! The suite's helper crate (generated by burn-mlx's scripts/burn_suite.sh): the tests live in
//! tests/ and import this macro from here.
pub use burn_tensor_testgen::might_panic;
EOF
# Pin the dependency versions burn-mlx is tested with.
if [ ! -f "$work/Cargo.lock" ] && [ -f "$here/Cargo.lock" ]; then cp "$here/Cargo.lock" "$work/Cargo.lock"; fi

# One test target per backend, float and suite, so that switching does not rebuild the others.
for b in mlx fused flex; do
  case "$b" in mlx) inner='burn_mlx::Mlx' ;; fused) inner='burn_mlx::MlxFused' ;; flex) inner='burn_flex::Flex' ;; esac
  for f in f32 f16 bf16; do
    case "$f" in f32) elem=f32 ;; f16) elem='burn_tensor::f16' ;; bf16) elem='burn_tensor::bf16' ;; esac
    # The part both suites share: element types, the backend, the default dtypes, the prelude.
    common=$(cat <<EOF
// Generated by burn-mlx's scripts/burn_suite.sh.
#![recursion_limit = "256"]
#![allow(clippy::all, unused)]
extern crate alloc;

pub type FloatElem = $elem;
pub type IntElem = i32;
const TOL_SCALE: u32 = $tol_scale;
EOF
)
    prelude=$(cat <<'EOF'
#[ctor::ctor]
fn init_device_settings() {
    let device = Default::default();
    burn_tensor::set_default_dtypes::<TestBackend>(
        &device,
        <FloatElem as burn_tensor::Element>::dtype(),
        <IntElem as burn_tensor::Element>::dtype(),
    )
    .unwrap();
}

/// Burn's `Dispatch::default_quant_scheme`, an inherent method of Burn's dispatch backend that
/// the quantization tests call on `TestBackend`, given to typed backends as a trait method.
pub trait DefaultQuantScheme: burn_tensor::backend::Backend {
    fn default_quant_scheme(_device: &Self::Device) -> burn_tensor::quantization::QuantScheme {
        <Self::QuantizedTensorPrimitive as burn_tensor::quantization::QTensorPrimitive>::default_scheme()
    }
}
impl<B: burn_tensor::backend::Backend> DefaultQuantScheme for B {}

/// `TensorData::assert_approx_eq` with the tolerance widened TOL_SCALE times: a pair `(x, y)`
/// passes when `(x, x + (y - x) / TOL_SCALE)` passes the test's own tolerance.
pub trait ScaledApproxEq {
    fn assert_approx_eq_scaled<F: num_traits::Float + burn_tensor::Element>(
        &self,
        other: &burn_tensor::TensorData,
        tolerance: burn_tensor::Tolerance<F>,
    );
}
impl ScaledApproxEq for burn_tensor::TensorData {
    fn assert_approx_eq_scaled<F: num_traits::Float + burn_tensor::Element>(
        &self,
        other: &burn_tensor::TensorData,
        tolerance: burn_tensor::Tolerance<F>,
    ) {
        assert_eq!(self.shape, other.shape, "shapes differ");
        let scale = TOL_SCALE as f64;
        let mut bad = Vec::new();
        for (i, (x, y)) in self.iter::<f64>().zip(other.iter::<f64>()).enumerate() {
            if x == y || (x.is_nan() && y.is_nan()) {
                continue;
            }
            let y_scaled = x + (y - x) / scale;
            let ok = match (F::from(x), F::from(y_scaled)) {
                (Some(a), Some(b)) => tolerance.approx_eq(a, b),
                _ => false,
            };
            if !ok {
                bad.push(format!("position {i}: {x} != {y}"));
            }
        }
        assert!(
            bad.is_empty(),
            "not approx eq with the tolerance x{}: {}",
            TOL_SCALE,
            bad.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
        );
    }
}

pub mod prelude {
    pub use super::{DefaultQuantScheme, ScaledApproxEq, TestBackend};
    pub use burn_tensor::Tensor;
    pub type TestTensor<const D: usize> = Tensor<TestBackend, D>;
    pub type TestTensorInt<const D: usize> = Tensor<TestBackend, D, burn_tensor::Int>;
    pub type TestTensorBool<const D: usize> = Tensor<TestBackend, D, burn_tensor::Bool>;
}
pub use prelude::*;
EOF
)
    if [ "$f" = f32 ]; then
      tensor_mods=$(cat <<EOF
#[path = "$tests/tensor/clone_invariance.rs"]
mod clone_invariance;
#[cfg(feature = "std")]
#[path = "$tests/tensor/multi_threads.rs"]
mod multi_threads;
#[path = "$tests/tensor/float/mod.rs"]
mod float;
#[path = "$tests/tensor/int/mod.rs"]
mod int;
#[path = "$tests/tensor/bool/mod.rs"]
mod bool;
EOF
)
    else
      tensor_mods=$(cat <<EOF
#[path = "$tests/tensor/float/mod.rs"]
mod $f;
EOF
)
    fi
    write "$work/tests/${b}_tensor_${f}${suffix}.rs" <<EOF
$common
pub type TestBackend = $inner;
$prelude

$tensor_mods
EOF
    write "$work/tests/${b}_autodiff_${f}${suffix}.rs" <<EOF
$common
pub type TestBackend = burn_autodiff::Autodiff<$inner>;
$prelude

mod autodiff {
    pub use super::*;

    /// The device the suite's autodiff tests build their tensors on.
    pub struct AutodiffDevice;
    impl AutodiffDevice {
        #[allow(clippy::new_ret_no_self)]
        pub fn new() -> burn_tensor::Device<TestBackend> {
            Default::default()
        }
    }

    #[path = "$tests/autodiff/mod.rs"]
    mod base;

    /// The same tests with balanced checkpointing, as upstream's common/autodiff.rs runs them.
    mod checkpointing {
        pub use super::{DefaultQuantScheme, FloatElem, IntElem, ScaledApproxEq};
        pub type TestBackend =
            burn_autodiff::Autodiff<$inner, burn_autodiff::checkpoint::strategy::BalancedCheckpointing>;
        pub use burn_tensor::Tensor;
        pub type TestTensor<const D: usize> = Tensor<TestBackend, D>;
        pub type TestTensorInt<const D: usize> = Tensor<TestBackend, D, burn_tensor::Int>;
        pub type TestTensorBool<const D: usize> = Tensor<TestBackend, D, burn_tensor::Bool>;

        pub struct AutodiffDevice;
        impl AutodiffDevice {
            #[allow(clippy::new_ret_no_self)]
            pub fn new() -> burn_tensor::Device<TestBackend> {
                Default::default()
            }
        }

        #[path = "$tests/autodiff/mod.rs"]
        mod base;
    }
}
EOF
  done
done

features=()
target_default="$work/target"
where=""
if [ "$gpu" = 1 ]; then
  features=(--features "cuda metal")
  target_default="$work/target-cuda"
  where="-gpu"
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$target_default}"
name="${backend}_${suite}_${float}${suffix}"
log="$work/${name}${where}.log"

echo "== Burn $(git -C "$burn_dir" describe --tags 2>/dev/null || echo 0.21.0) suite: $suite, float $float, backend $backend${where}, target $CARGO_TARGET_DIR"
cargo build --manifest-path "$work/Cargo.toml" --test "$name" "${features[@]}" 2>&1 | tail -3
set +e
cargo test --manifest-path "$work/Cargo.toml" --test "$name" "${features[@]}" -- \
  --test-threads="$threads" "${filter[@]}" >"$log" 2>&1
rc=$?
set -e

result="$(grep '^test result:' "$log" | tail -1)"
if [ -z "$result" ]; then
  tail -30 "$log"
  echo "== no test result (exit $rc); full log: $log" >&2
  exit 1
fi
passed=$(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"$result")
failed=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$result")
ignored=$(sed -E 's/.* ([0-9]+) ignored.*/\1/' <<<"$result")
echo "== $name: $passed passed, $failed failed, $ignored ignored (log: $log)"
# The failing tests, as the test harness lists them after its "failures:" heading.
awk '/^failures:$/ {n++; next} n == 2 && /^    / {print} /^test result:/ {n = 0}' "$log" | sed 's/^ *//'
[ "$failed" = 0 ]
