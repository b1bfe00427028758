#!/usr/bin/env bash
# llama.cpp reference numbers for burn-mlx's `qwen3-0.6b` preset: decode (and prompt) speed of
# llama.cpp's CUDA backend on a Qwen3ForCausalLM with random weights and exactly the preset's
# shape (crates/burn-mlx-llm/src/config.rs: hidden 1024, 28 layers, 16 heads, 8 KV heads,
# head_dim 128, intermediate 3072, vocab 151936, rope theta 1e6, RMS eps 1e-6, tied embeddings,
# 40960 positions), at bf16, Q8_0 and Q4_0, measured with `llama-bench`. Random weights change
# nothing for speed: every token runs the same kernels over the same bytes.
#
#   scripts/llamacpp_reference.sh LLAMA_SRC PHASE...     PHASE: build | model | bench | all
#
# LLAMA_SRC is a llama.cpp source tree (with convert_hf_to_gguf.py, gguf-py/ and, for the real
# vocabulary, models/ggml-vocab-qwen2.gguf). Every phase is idempotent and resumable, so each can
# be run in its own call of a time-limited machine as long as $LLAMA_WORK survives in between:
#
# * build: CMake + ninja, Release, CUDA for sm_$CUDA_ARCH, only the targets llama-bench and
#   llama-quantize, in $LLAMA_WORK/build. The build stops itself $BUILD_TIMEOUT seconds after
#   the script started (exit 3, "run build again"); the next `build` resumes where it stopped.
# * model: a Hugging Face folder ($LLAMA_WORK/hf-$PRESET: config.json, model.safetensors in
#   bf16, tokenizer.json, tokenizer_config.json), then GGUF files in $LLAMA_WORK/gguf: bf16 and
#   Q8_0 by llama.cpp's own convert_hf_to_gguf.py, Q4_0 by llama-quantize from the bf16 file
#   (llama-quantize's usual Q4_0 mix) and Q4_0 with --pure (every matrix Q4_0).
# * bench: llama-bench -p 512 -n 128 -r 3 -ngl 99 -fa 0,1 -o json on each GGUF file, GPU 0;
#   results in $LLAMA_WORK/results and, packed with the logs and the machine's description, in
#   $OUT/llamacpp.tgz. A summary table (tokens/s) is printed at the end.
#
# The tokenizer. Its content does not change the speed, but convert_hf_to_gguf.py needs a
# tokenizer it recognises, and no Qwen tokenizer can be downloaded on the benchmark machine. The
# llama.cpp tree ships Qwen2's byte-level BPE vocabulary (151643 tokens, 151387 merges) in
# models/ggml-vocab-qwen2.gguf, for its tokenizer tests. This script rebuilds a tokenizers-library
# tokenizer.json from it with Qwen2's pre-tokenizer (NFC, the Qwen split pattern, byte level),
# which the converter recognises as "qwen2", and adds Qwen3's 26 added tokens (<|endoftext|> at
# 151643 ... </think> at 151668); ids 151669..151935 stay unused, as in Qwen3-0.6B. Where that
# file is missing it builds a synthetic byte-level BPE of the same size (256 bytes, then
# merges of byte pairs and of pairs with a third byte), and converts through a small wrapper that
# makes the converter's pre-tokenizer check answer "qwen2" when it does not know the hash (the
# wrapper is also used with the real vocabulary, where the check passes on its own). The same
# wrapper stands in for the sentencepiece package when it is missing: Qwen's converter imports it
# before it finds that the folder has no tokenizer.model and goes on to tokenizer.json.
#
# Environment:
#   LLAMA_WORK     work folder (default /tmp/llama)
#   PYTHON         a Python with torch, transformers, safetensors, tokenizers, numpy
#                  (default /opt/torch/.venv/bin/python if it exists, else python3)
#   WHEELS         a folder of wheels (pyyaml, tqdm) to unpack into $LLAMA_WORK/py when PYTHON
#                  lacks them (the converter's gguf-py imports yaml)
#   PRESET         qwen3-0.6b (default) or small (the 41M-parameter preset, for a quick check)
#   CUDA           ON (default) or OFF (a CPU build, for a check on a machine without a GPU)
#   CUDA_ARCH      90 (default: H100/H200)
#   JOBS           build jobs (default: nproc)
#   BUILD_TIMEOUT  seconds after this script's start by which `build` stops ninja (default 550,
#                  so that configure + build fit a 600 s call; 0: no limit)
#   OUT            where bench puts llamacpp.tgz (default $LLAMA_WORK/out)
#   BENCH_ARGS     extra llama-bench arguments (default none)
#
# Example (the machine has the source tarball in the repo copy):
#   mkdir -p /tmp/llama/src && tar -xJf llama-src.tar.xz -C /tmp/llama/src
#   scripts/llamacpp_reference.sh /tmp/llama/src/llama.cpp build   # repeat until it says done
#   scripts/llamacpp_reference.sh /tmp/llama/src/llama.cpp model bench
set -euo pipefail

if [ $# -lt 2 ]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 2
fi
SRC=$(cd "$1" && pwd)
shift
WORK=${LLAMA_WORK:-/tmp/llama}
BUILD=$WORK/build
PRESET=${PRESET:-qwen3-0.6b}
CUDA=${CUDA:-ON}
CUDA_ARCH=${CUDA_ARCH:-90}
JOBS=${JOBS:-$(nproc)}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-550}
OUT=${OUT:-$WORK/out}
if [ -z "${PYTHON:-}" ]; then
    if [ -x /opt/torch/.venv/bin/python ]; then PYTHON=/opt/torch/.venv/bin/python; else PYTHON=python3; fi
fi
HF=$WORK/hf-$PRESET
GGUF=$WORK/gguf
RESULTS=$WORK/results
mkdir -p "$WORK"

log() { printf '[%s %s] %s\n' "$(date +%H:%M:%S)" "${PHASE:-}" "$*"; }
die() { log "ERROR: $*"; exit 1; }

[ -f "$SRC/CMakeLists.txt" ] || die "$SRC is not a llama.cpp source tree"

phase_build() {
    if [ -x "$BUILD/bin/llama-bench" ] && [ -x "$BUILD/bin/llama-quantize" ] && [ -f "$BUILD/.done" ]; then
        log "already built: $BUILD/bin/llama-bench, llama-quantize"
        return 0
    fi
    command -v cmake >/dev/null || die "cmake not found"
    local gen=()
    if command -v ninja >/dev/null; then gen=(-G Ninja); fi
    if [ ! -f "$BUILD/CMakeCache.txt" ] || { [ ! -f "$BUILD/build.ninja" ] && [ ! -f "$BUILD/Makefile" ]; }; then
        log "configure (CUDA=$CUDA, arch $CUDA_ARCH) in $BUILD"
        local cuda_opts=(-DGGML_CUDA=OFF)
        if [ "$CUDA" = ON ]; then
            cuda_opts=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH" -DGGML_CUDA_NCCL=OFF)
            if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
                export PATH=/usr/local/cuda/bin:$PATH
            fi
        fi
        # Only what llama-bench and llama-quantize need: no tests, examples, server, web UI,
        # unified app, HTTPS or curl; static libraries so the binaries run from anywhere.
        cmake -S "$SRC" -B "$BUILD" "${gen[@]}" \
            -DCMAKE_BUILD_TYPE=Release \
            "${cuda_opts[@]}" \
            -DGGML_NATIVE=ON \
            -DGGML_CCACHE=OFF \
            -DBUILD_SHARED_LIBS=OFF \
            -DLLAMA_CURL=OFF \
            -DLLAMA_OPENSSL=OFF \
            -DLLAMA_BUILD_COMMON=ON \
            -DLLAMA_BUILD_TOOLS=ON \
            -DLLAMA_BUILD_TESTS=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF \
            -DLLAMA_BUILD_SERVER=OFF \
            -DLLAMA_BUILD_APP=OFF \
            -DLLAMA_BUILD_UI=OFF
    else
        log "configured already; resuming the build"
    fi
    local t0=$SECONDS rc=0 left=$((BUILD_TIMEOUT - SECONDS))
    [ "$left" -ge 30 ] || left=30
    [ "$BUILD_TIMEOUT" -gt 0 ] || left=none
    log "build llama-bench llama-quantize with $JOBS jobs (time left: ${left}s)"
    local cmd=(cmake --build "$BUILD" --config Release -j "$JOBS" --target llama-bench llama-quantize)
    if [ "$BUILD_TIMEOUT" -gt 0 ]; then
        timeout --signal=INT "$left" "${cmd[@]}" || rc=$?
    else
        "${cmd[@]}" || rc=$?
    fi
    if [ $rc -eq 124 ] || [ $rc -eq 130 ]; then
        log "stopped after $((SECONDS - t0))s, not finished: run the build phase again to resume"
        exit 3
    elif [ $rc -ne 0 ]; then
        die "build failed (exit $rc)"
    fi
    touch "$BUILD/.done"
    log "built in $((SECONDS - t0))s: $(ls "$BUILD/bin")"
}

# Python packages the converter needs beyond the torch venv (gguf-py imports yaml, and tqdm for
# its progress bar). Wheels are unpacked into $LLAMA_WORK/py (a wheel is a zip; no pip needed,
# the venv is left alone); yaml falls back to a stub when no wheel fits this Python (gguf-py only
# parses YAML from a model card, which the random-weight folder does not have).
python_env() {
    export PYTHONPATH="$WORK/py${PYTHONPATH:+:$PYTHONPATH}"
    if "$PYTHON" -c 'import yaml, tqdm' 2>/dev/null; then return 0; fi
    mkdir -p "$WORK/py"
    log "$PYTHON lacks yaml or tqdm: unpacking wheels from ${WHEELS:-(none)} into $WORK/py"
    "$PYTHON" - "${WHEELS:-}" "$WORK/py" <<'PY'
import glob, os, sys, zipfile
wheels, target = sys.argv[1], sys.argv[2]
tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
for want in ("yaml", "tqdm"):
    try:
        __import__(want)
        continue
    except ImportError:
        pass
    dist = {"yaml": "pyyaml", "tqdm": "tqdm"}[want]
    found = [w for w in sorted(glob.glob(os.path.join(wheels, "*.whl"))) if wheels
             and os.path.basename(w).lower().startswith(dist + "-")
             and ("-py3-none-any" in w or f"-{tag}-{tag}-" in w)]
    if found:
        zipfile.ZipFile(found[-1]).extractall(target)
        print(f"  {want}: unpacked {os.path.basename(found[-1])}")
    elif want == "yaml":
        with open(os.path.join(target, "yaml.py"), "w") as f:
            f.write("def safe_load(*a, **k):\n    raise RuntimeError('yaml stub')\n")
        print("  yaml: no wheel for", tag, "- wrote a stub module")
    else:
        sys.exit(f"  {want}: no wheel for {tag} in {wheels!r}")
PY
    "$PYTHON" -c 'import yaml, tqdm' || die "yaml/tqdm still not importable"
}

write_helpers() {
    mkdir -p "$WORK"
    # The Hugging Face folder: tokenizer (see the header) and a random-weight Qwen3ForCausalLM.
    cat > "$WORK/make_hf.py" <<'PY'
import json, os, sys, time

SHAPES = {  # burn-mlx-llm's presets (crates/burn-mlx-llm/src/config.rs)
    "qwen3-0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                       vocab_size=151936),
    "small": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=4, head_dim=64, intermediate_size=1536, vocab_size=32000),
}
COMMON = dict(rms_norm_eps=1e-6, rope_theta=1_000_000.0, tie_word_embeddings=True,
              attention_bias=False, max_position_embeddings=40960, hidden_act="silu")
# Qwen3's added tokens, in id order from 151643; the second field says "special".
ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
         ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
         ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
         ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
         ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
         ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
         ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
         ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
         ("<think>", False), ("</think>", False)]
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def byte_alphabet():
    """GPT-2's byte-to-character map (printable stand-ins for the 256 bytes), in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def qwen2_vocab(src):
    """Qwen2's BPE vocabulary and merges from llama.cpp's test file, or None."""
    path = os.path.join(src, "models", "ggml-vocab-qwen2.gguf")
    if not os.path.isfile(path):
        return None
    sys.path.insert(0, os.path.join(src, "gguf-py"))
    import gguf
    r = gguf.GGUFReader(path)
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    vocab = {t: i for i, (t, ty) in enumerate(zip(toks, types)) if ty == 1}  # NORMAL tokens
    assert sorted(vocab.values()) == list(range(len(vocab))), "normal tokens are not 0..n-1"
    return vocab, [tuple(m.split(" ")) for m in merges], "qwen2 (models/ggml-vocab-qwen2.gguf)"


def synthetic_vocab(n):
    """A byte-level BPE of n tokens: the 256 bytes, then byte pairs, then byte triples."""
    alpha = byte_alphabet()
    vocab = {c: i for i, c in enumerate(alpha)}
    merges = []
    for a in alpha:
        for b in alpha:
            if len(vocab) >= n:
                break
            vocab[a + b] = len(vocab)
            merges.append((a, b))
    for a in alpha:
        for b in alpha:
            for c in alpha:
                if len(vocab) >= n:
                    return vocab, merges, "synthetic"
                vocab[a + b + c] = len(vocab)
                merges.append((a + b, c))
    return vocab, merges, "synthetic"


def tokenizer(src, out, vocab_size):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, processors
    n_bpe = vocab_size - 293 if vocab_size > 100000 else vocab_size - len(ADDED)
    got = qwen2_vocab(src) if vocab_size == 151936 else None
    vocab, merges, kind = got or synthetic_vocab(n_bpe)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    first = len(vocab)
    decoder = {}
    for i, (text, special) in enumerate(ADDED):
        added = AddedToken(text, special=special, normalized=False, single_word=False,
                           lstrip=False, rstrip=False)
        (tok.add_special_tokens if special else tok.add_tokens)([added])
        assert tok.token_to_id(text) == first + i, (text, tok.token_to_id(text))
        decoder[str(first + i)] = dict(content=text, lstrip=False, normalized=False,
                                       rstrip=False, single_word=False, special=special)
    assert first + len(ADDED) <= vocab_size
    tok.save(os.path.join(out, "tokenizer.json"))
    config = dict(tokenizer_class="PreTrainedTokenizerFast", added_tokens_decoder=decoder,
                  bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                  unk_token=None, add_bos_token=False, add_prefix_space=False,
                  clean_up_tokenization_spaces=False, errors="replace",
                  model_max_length=COMMON["max_position_embeddings"], split_special_tokens=False)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"tokenizer: {kind}, {len(vocab)} BPE tokens, {len(merges)} merges, "
          f"{len(ADDED)} added tokens at {first}..{first + len(ADDED) - 1}", flush=True)
    return first


def model(out, preset, eos):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    shape = SHAPES[preset]
    bos = 151643 if shape["vocab_size"] > 151643 else eos  # Qwen3: bos <|endoftext|>
    config = Qwen3Config(**shape, **COMMON, bos_token_id=bos, eos_token_id=eos)
    config.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(0)
    t0 = time.time()
    torch.set_default_dtype(torch.bfloat16)
    m = Qwen3ForCausalLM(config).to(torch.bfloat16).eval()
    n = sum(p.numel() for p in m.parameters())
    print(f"model: {preset}, {n / 1e6:.1f}M parameters, random init in {time.time() - t0:.1f}s",
          flush=True)
    m.save_pretrained(out, safe_serialization=True)
    # Write the shape fields as plain keys too, whichever way this transformers version spells
    # the rope settings (the converter reads either).
    path = os.path.join(out, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.update(shape, **COMMON)
    cfg["architectures"] = ["Qwen3ForCausalLM"]
    cfg["torch_dtype"] = cfg["dtype"] = "bfloat16"
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)


def main():
    src, out, preset = sys.argv[1], sys.argv[2], sys.argv[3]
    tokenizer_only = "--tokenizer-only" in sys.argv[4:]
    os.makedirs(out, exist_ok=True)
    vocab_size = SHAPES[preset]["vocab_size"]
    first = tokenizer(src, out, vocab_size)
    eos = first + 2  # <|im_end|>
    if not tokenizer_only:
        model(out, preset, eos)


main()
PY
    # convert_hf_to_gguf.py behind two patches. (1) An unknown BPE pre-tokenizer hash (the
    # synthetic vocabulary's) is taken as Qwen2's instead of raising NotImplementedError; the real
    # Qwen2 vocabulary passes the converter's check without it. (2) Without the sentencepiece
    # package, a stand-in module: Qwen's converter imports it before it looks for tokenizer.model,
    # and only a missing file (FileNotFoundError) sends it on to the BPE tokenizer.json.
    cat > "$WORK/convert.py" <<'PY'
import importlib.machinery, os, runpy, sys, types

src = sys.argv[1]
sys.argv = [os.path.join(src, "convert_hf_to_gguf.py")] + sys.argv[2:]
sys.path.insert(0, src)
sys.path.insert(1, os.path.join(src, "gguf-py"))
from conversion import base  # noqa: E402  (the package convert_hf_to_gguf.py imports)

try:
    import sentencepiece  # noqa: F401
except ImportError:
    # After transformers' import, which probes for the package itself.
    stub = types.ModuleType("sentencepiece")
    stub.__spec__ = importlib.machinery.ModuleSpec("sentencepiece", None)

    class SentencePieceProcessor:  # never constructed: the folder has no tokenizer.model
        def __init__(self, *args, **kwargs):
            raise RuntimeError("sentencepiece is not installed")

    stub.SentencePieceProcessor = SentencePieceProcessor
    sys.modules["sentencepiece"] = stub

original = base.TextModel.get_vocab_base_pre


def get_vocab_base_pre(self, tokenizer):
    try:
        return original(self, tokenizer)
    except NotImplementedError:
        print("convert.py: pre-tokenizer hash unknown (synthetic vocabulary): using 'qwen2'",
              flush=True)
        return "qwen2"


base.TextModel.get_vocab_base_pre = get_vocab_base_pre
runpy.run_path(sys.argv[0], run_name="__main__")
PY
}

phase_model() {
    python_env
    write_helpers
    local qbin=$BUILD/bin/llama-quantize
    if [ -f "$HF/.done" ]; then
        log "HF folder ready: $HF"
    else
        log "HF folder $HF ($PRESET, random weights, bf16) with $PYTHON"
        rm -rf "$HF.tmp"
        "$PYTHON" "$WORK/make_hf.py" "$SRC" "$HF.tmp" "$PRESET"
        rm -rf "$HF"
        mv "$HF.tmp" "$HF"
        touch "$HF/.done"
        ls -la "$HF"
    fi
    mkdir -p "$GGUF"
    local t
    for t in bf16 q8_0; do
        local f=$GGUF/$PRESET-$t.gguf
        if [ -s "$f" ]; then log "have $f"; continue; fi
        log "convert_hf_to_gguf.py --outtype $t -> $f"
        local t0=$SECONDS
        "$PYTHON" "$WORK/convert.py" "$SRC" "$HF" --outtype "$t" --outfile "$f.tmp"
        mv "$f.tmp" "$f"
        log "$(du -h "$f" | cut -f1) in $((SECONDS - t0))s: $f"
    done
    [ -x "$qbin" ] || die "no $qbin: run the build phase first"
    local name extra
    for name in q4_0 q4_0-pure; do
        local f=$GGUF/$PRESET-$name.gguf
        if [ -s "$f" ]; then log "have $f"; continue; fi
        extra=()
        [ "$name" = q4_0-pure ] && extra=(--pure)
        log "llama-quantize ${extra[*]} bf16 -> Q4_0: $f"
        "$qbin" "${extra[@]}" "$GGUF/$PRESET-bf16.gguf" "$f.tmp" Q4_0 "$JOBS" > "$f.log" 2>&1 \
            || { tail -30 "$f.log"; die "llama-quantize failed"; }
        tail -4 "$f.log"
        mv "$f.tmp" "$f"
    done
    log "GGUF files:"
    ls -la "$GGUF"
}

phase_bench() {
    local bbin=$BUILD/bin/llama-bench
    [ -x "$bbin" ] || die "no $bbin: run the build phase first"
    mkdir -p "$RESULTS" "$OUT"
    export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
    {
        date -u
        uname -a
        command -v nvidia-smi >/dev/null && nvidia-smi \
            --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
        command -v nvcc >/dev/null && nvcc --version | tail -2
        echo "llama.cpp source: $SRC"
        [ -f "$SRC/LLAMA_COMMIT" ] && cat "$SRC/LLAMA_COMMIT"
        grep -E '^(GGML_CUDA|CMAKE_CUDA_ARCHITECTURES|GGML_NATIVE|CMAKE_BUILD_TYPE)[:=]' \
            "$BUILD/CMakeCache.txt" || true
    } > "$RESULTS/machine.txt" 2>&1
    cat "$RESULTS/machine.txt"
    local name f fa_opts=(-fa 0,1) ngl=(-ngl 99)
    [ "$CUDA" = ON ] || ngl=(-ngl 0)
    for name in bf16 q8_0 q4_0 q4_0-pure; do
        f=$GGUF/$PRESET-$name.gguf
        [ -s "$f" ] || { log "skip $name: no $f (run the model phase)"; continue; }
        if [ -s "$RESULTS/$name.json" ] && [ "${FORCE:-0}" != 1 ]; then
            log "have $RESULTS/$name.json (FORCE=1 reruns)"; continue
        fi
        log "llama-bench $name"
        # shellcheck disable=SC2086
        "$bbin" -m "$f" -p 512 -n 128 -r 3 "${ngl[@]}" "${fa_opts[@]}" -o json ${BENCH_ARGS:-} \
            > "$RESULTS/$name.json.tmp" 2> "$RESULTS/$name.log" \
            || { tail -30 "$RESULTS/$name.log"; die "llama-bench failed on $name"; }
        mv "$RESULTS/$name.json.tmp" "$RESULTS/$name.json"
    done
    "$PYTHON" - "$RESULTS" <<'PY' | tee "$RESULTS/summary.txt"
import json, os, sys
d = sys.argv[1]
print(f"{'model':<10} {'fa':>3} {'test':>6} {'tok/s':>10} {'+-':>8}  size")
for name in ["bf16", "q8_0", "q4_0", "q4_0-pure"]:
    p = os.path.join(d, name + ".json")
    if not os.path.exists(p):
        continue
    for r in json.load(open(p)):
        test = f"pp{r['n_prompt']}" if r.get("n_prompt") else f"tg{r['n_gen']}"
        print(f"{name:<10} {r.get('flash_attn')!s:>3} {test:>6} {r['avg_ts']:>10.1f} "
              f"{r['stddev_ts']:>8.1f}  {r.get('model_size', 0) / 2**20:.0f} MiB "
              f"({r.get('model_type', '')}, {r.get('gpu_info', '')}, {r.get('build_commit', '')})")
PY
    tar -czf "$OUT/llamacpp.tgz" -C "$WORK" results
    log "wrote $OUT/llamacpp.tgz"
}

for PHASE in "$@"; do
    case $PHASE in
        build) phase_build ;;
        model) phase_model ;;
        bench) phase_bench ;;
        all) PHASE=build phase_build; PHASE=model phase_model; PHASE=bench phase_bench ;;
        *) die "unknown phase $PHASE (build, model, bench, all)" ;;
    esac
done
