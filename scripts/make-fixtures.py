#!/usr/bin/env python3
"""Writes the external-truth fixtures that smol's tests compare against.

The truth comes from llama.cpp (through llama-cpp-python) running the real
SmolLM2-135M-Instruct Q4_1 model on the CPU. To regenerate:

    scripts/fetch-model.sh            # only if models/ lacks the .gguf
    scripts/peers.sh && /work/peers/venv/bin/python scripts/make-fixtures.py

Outputs (all under tests/fixtures/):
  tokenizer.json  text -> token ids (llama_tokenize) for many strings, with the
                  bytes of each token's piece (llama_token_to_piece) as hex.
  logits.json     prompt ids, top-10 logits and full-vocab summaries at a few
                  positions, plus the run-to-run self variation of llama.cpp
                  across batch sizes and thread counts.
  greedy.json     prompt ids and 32 argmax-decoded tokens per prompt.

Options: --model PATH, --out DIR, --only {tokenizer,logits,greedy}.
"""

import argparse
import ctypes
import hashlib
import json
import os
import sys

import numpy as np

import llama_cpp
from llama_cpp import Llama

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
PINNED_PY_VERSION = "0.3.36"
LLAMA_CPP_COMMIT = "0c1e57098"  # vendor/llama.cpp of llama-cpp-python 0.3.36

N_CTX = 2048
N_BATCH = 512
N_THREADS = 2
TOP_K = 10
GREEDY_TOKENS = 32


def engine_name():
    return f"llama.cpp {LLAMA_CPP_COMMIT} (llama-cpp-python {llama_cpp.__version__})"


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load(model, n_batch=N_BATCH, n_ubatch=None, n_threads=N_THREADS, logits_all=True,
         vocab_only=False, flash_attn=False):
    return Llama(
        model_path=model,
        n_ctx=N_CTX,
        n_batch=n_batch,
        n_ubatch=n_ubatch if n_ubatch is not None else n_batch,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        n_gpu_layers=0,
        logits_all=logits_all,
        vocab_only=vocab_only,
        flash_attn=flash_attn,
        seed=0,
        verbose=False,
    )


def piece(llm, token, special):
    """Bytes of one token as llama_token_to_piece renders it."""
    vocab = llm._model.vocab
    size = 256
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, size, 0, special)
    if n < 0:
        size = -n
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, size, 0, special)
    return buf.raw[:n]


def tokenize(llm, text, add_special, parse_special):
    return llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(path, ROOT)} ({os.path.getsize(path)} bytes)")


# ----------------------------------------------------------------------------
# Tokenizer

TOKENIZER_TEXTS = [
    # empty and whitespace
    "",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\n\n\n",
    " \t ",
    "\r",
    "\r\n",
    "a\rb",
    "line one\r\nline two\r\n",
    " " * 40,
    "\n" * 17,
    "\t\t\tx",
    # prose
    "Hello",
    "hello world",
    "Hello, world!",
    " Hello world",
    "Hello world ",
    "Hello   world",
    "  leading and trailing  ",
    "The quick brown fox jumps over the lazy dog.",
    "A paragraph.\n\nAnother paragraph, after a blank line.\n",
    "SmolLM2 is a family of compact language models available in three sizes: 135M, 360M, and 1.7B parameters.",
    "ALL CAPS SENTENCE WITH SHOUTING",
    "camelCaseIdentifier snake_case_identifier kebab-case-identifier",
    # numbers
    "12345",
    "3.14159",
    "1,000,000",
    "-42 +17 0x1F 1e-9",
    "In 2024, 7 of 10 people earned $45,678.90.",
    "phone: +1 (555) 010-9999",
    # contractions
    "don't",
    "I'M",
    "we'll",
    "She's, they're, I've, he'd, it's",
    "DON'T STOP, WE'LL SEE",
    "'s 't 're",
    "rock 'n' roll",
    # unicode
    "café naïve résumé",
    "Ünïcödé wörds: straße, ÆØÅ",
    "日本語のテキスト",
    "中文文本，标点符号。",
    "한국어 문장입니다",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "Привет, мир!",
    "Ελληνικά γράμματα",
    "e\u0301 a\u0308 n\u0303",
    "zero\u200bwidth\u200cjoiner\u200d",
    "\u00a0non-breaking\u00a0space",
    "\u3000ideographic space",
    "°C ± ≤ ≥ ∞ π √ ∑ ∫",
    # emoji
    "😀",
    "I love 🍕 and 🎉!",
    "👨\u200d👩\u200d👧\u200d👦",
    "🇫🇷🇯🇵",
    "👍🏽",
    "❤️",
    # code
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n\tif i % 2 == 0:\n\t\tprint(i)\n",
    "#include <vector>\n\nint main() {\n    std::vector<int> v{1, 2, 3};\n    return v.size();\n}\n",
    "x = {'key': [1, 2.5, None], \"s\": True}",
    "if (a != b && c <= d) { x->y = z[i++]; }",
    "    indented four\n        indented eight",
    # URLs and markup
    "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?x=1&y=two#frag",
    "mailto:someone@example.com",
    "<div class=\"a\">text</div>",
    "**bold** _italic_ `code` [link](http://x.y)",
    # punctuation runs
    "...",
    "!!!???",
    "----------",
    "=====",
    "Wait... what?!",
    "@#$%^&*()_+",
    "\"quoted\" 'single' `back`",
    # special tokens (tested with parse_special true and false)
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text<|endoftext|>more",
    "<|im_start|><|im_end|>",
    " <|im_start|> spaced ",
    "<|im_start",
    "<file_sep>main.py",
    "<repo_name>smol<filename>a.c",
    # repetition
    "a" * 64,
    "ab" * 30,
    "hahahahahahahahaha",
]

SPECIAL_MARKERS = ("<|", "<file_sep>", "<repo_name>", "<filename>")


def make_tokenizer(model, out_dir, sha):
    llm = load(model, vocab_only=True, logits_all=False)
    cases = []
    seen = set()

    def add(text, add_special, parse_special):
        key = (text, add_special, parse_special)
        if key in seen:
            return
        seen.add(key)
        ids = tokenize(llm, text, add_special, parse_special)
        pieces = [piece(llm, t, True).hex() for t in ids]
        detok = b"".join(piece(llm, t, False) for t in ids)
        cases.append({
            "text": text,
            "add_special": add_special,
            "parse_special": parse_special,
            "ids": ids,
            "pieces": pieces,
            "detok_hex": detok.hex(),
        })

    for text in TOKENIZER_TEXTS:
        add(text, False, False)
        if any(m in text for m in SPECIAL_MARKERS):
            add(text, False, True)
    # add_special=True: this model's tokenizer.ggml.add_bos_token is false, so
    # llama.cpp adds nothing; these cases pin that down.
    for text in ["", "Hello world", "<|im_start|>user\nhi<|im_end|>"]:
        add(text, True, False)
        add(text, True, True)

    n_vocab = llm.n_vocab()
    types = {}
    for t in range(n_vocab):
        attr = llama_cpp.llama_vocab_get_attr(llm._model.vocab, t)
        if attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL:
            types[t] = piece(llm, t, True).decode("utf-8", "replace")
    write_json(os.path.join(out_dir, "tokenizer.json"), {
        "model_sha256": sha,
        "engine": engine_name(),
        "pre_tokenizer": "smollm",
        "notes": [
            "ids from llama_tokenize(text, add_special, parse_special).",
            "pieces: hex bytes of llama_token_to_piece(id, special=true) for each id.",
            "detok_hex: concatenated llama_token_to_piece(id, special=false); control "
            "tokens render as empty there.",
            "add_bos_token is false in this GGUF, so add_special adds no BOS.",
        ],
        "n_vocab": n_vocab,
        "control_tokens": {str(k): v for k, v in sorted(types.items())},
        "cases": cases,
    })
    del llm


# ----------------------------------------------------------------------------
# Chat template

def render_chat(llm, messages, add_generation_prompt=True):
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    tmpl = llm.metadata["tokenizer.chat_template"]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(tmpl).render(messages=messages,
                                        add_generation_prompt=add_generation_prompt)


DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def check_template(llm):
    got = render_chat(llm, [{"role": "user", "content": "What is the capital of France?"}])
    want = ("<|im_start|>system\n" + DEFAULT_SYSTEM + "<|im_end|>\n"
            "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
            "<|im_start|>assistant\n")
    if got != want:
        raise SystemExit(f"chat template renders unexpectedly:\n{got!r}")


# ----------------------------------------------------------------------------
# Logits

LOGIT_PROMPTS = [
    ("plain", "The capital of France is"),
    ("prose", "Once upon a time, in a small village nestled between two mountains, there lived "
              "an old clockmaker who repaired every clock in town. One winter morning, a "
              "stranger arrived carrying a broken pocket watch and"),
    ("chat", [{"role": "user", "content": "What is the capital of France?"}]),
    ("chat_system", [{"role": "system", "content": "You are a pirate. Answer in one sentence."},
                     {"role": "user", "content": "Why is the sky blue?"}]),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n"
             "        return n\n    return"),
    ("unicode", "Les élèves ont mangé 3 pommes et 12 poires à 9h45. 日本語も少し。 Привет!"),
    ("long", ("Photosynthesis is the process by which green plants, algae and some bacteria "
              "convert light energy into chemical energy. During this process, carbon dioxide "
              "and water are combined, using the energy of sunlight, to produce glucose and "
              "oxygen. ") * 4 + "In summary, photosynthesis"),
]

PROBE_IDS = list(range(0, 49152, 1536)) + [17, 198, 216, 4040, 49151]


def prompt_text(llm, prompt):
    return prompt if isinstance(prompt, str) else render_chat(llm, prompt)


def run_logits(llm, ids):
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids), :], dtype=np.float32, copy=True)


def positions_for(n):
    return sorted(set([0, n // 3, (2 * n) // 3, n - 1]))


def summary(row):
    r = row.astype(np.float64)
    return {"max": float(r.max()), "min": float(r.min()), "mean": float(r.mean()),
            "std": float(r.std()), "argmax": int(r.argmax())}


def make_logits(model, out_dir, sha):
    llm = load(model)
    check_template(llm)
    prompts = []
    baseline = {}
    for name, prompt in LOGIT_PROMPTS:
        text = prompt_text(llm, prompt)
        ids = tokenize(llm, text, False, True)
        logits = run_logits(llm, ids)
        baseline[name] = (ids, logits)
        entries = []
        for p in positions_for(len(ids)):
            row = logits[p]
            top = np.argsort(-row, kind="stable")[:TOP_K]
            entries.append({
                "pos": p,
                "top": [[int(t), float(row[t])] for t in top],
                "summary": summary(row),
                "probe": [float(row[t]) for t in PROBE_IDS],
            })
        prompts.append({"name": name, "text": text, "ids": ids, "positions": entries})
        print(f"logits: {name}: {len(ids)} tokens")
    del llm

    variation = self_variation(model, baseline)

    write_json(os.path.join(out_dir, "logits.json"), {
        "model_sha256": sha,
        "engine": engine_name(),
        "settings": {
            "backend": "CPU",
            "system_info": llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(),
            "n_ctx": N_CTX, "n_batch": N_BATCH, "n_ubatch": N_BATCH,
            "n_threads": N_THREADS, "n_threads_batch": N_THREADS,
            "type_k": "f16", "type_v": "f16", "flash_attn": False,
            "logits_all": True, "add_special": False, "parse_special": True,
            "whole_prompt_in_one_decode": True,
        },
        "notes": [
            "top: the 10 largest logits [id, logit] at that position, descending.",
            "summary: statistics over all n_vocab logits of that row (float64).",
            "probe: logits of the ids in probe_ids at that position.",
            "self_variation: max |logit difference| between the baseline settings and "
            "another llama.cpp configuration, over every position and every vocab entry.",
        ],
        "probe_ids": PROBE_IDS,
        "self_variation": variation,
        "prompts": prompts,
    })


def self_variation(model, baseline):
    configs = [
        {"name": "n_threads=1", "n_batch": N_BATCH, "n_threads": 1},
        {"name": "n_batch=n_ubatch=1 (token by token)", "n_batch": 1, "n_threads": N_THREADS},
        {"name": "n_batch=n_ubatch=7", "n_batch": 7, "n_threads": N_THREADS},
        {"name": "n_batch=512 n_ubatch=32", "n_batch": N_BATCH, "n_ubatch": 32,
         "n_threads": N_THREADS},
        {"name": "flash_attn=on", "n_batch": N_BATCH, "n_threads": N_THREADS, "flash_attn": True},
        {"name": "repeat of baseline", "n_batch": N_BATCH, "n_threads": N_THREADS},
    ]
    out = []
    for cfg in configs:
        llm = load(model, n_batch=cfg["n_batch"], n_ubatch=cfg.get("n_ubatch"),
                   n_threads=cfg["n_threads"], flash_attn=cfg.get("flash_attn", False))
        worst = 0.0
        worst_rel = 0.0
        argmax_mismatch = 0
        rows = 0
        per_prompt = {}
        for name, (ids, ref) in baseline.items():
            got = run_logits(llm, ids)
            d = np.abs(got.astype(np.float64) - ref.astype(np.float64))
            m = float(d.max())
            per_prompt[name] = m
            worst = max(worst, m)
            std = ref.astype(np.float64).std(axis=1, keepdims=True)
            worst_rel = max(worst_rel, float((d / std).max()))
            argmax_mismatch += int((got.argmax(axis=1) != ref.argmax(axis=1)).sum())
            rows += len(ids)
        del llm
        entry = {"config": cfg["name"], "max_abs_diff": worst,
                 "max_abs_diff_over_row_std": worst_rel,
                 "argmax_mismatches": argmax_mismatch, "rows": rows,
                 "max_abs_diff_per_prompt": per_prompt}
        print(f"self variation: {cfg['name']}: max |d| = {worst:.6g}, "
              f"max |d|/std = {worst_rel:.3g}, argmax mismatches {argmax_mismatch}/{rows}")
        out.append(entry)
    return out


# ----------------------------------------------------------------------------
# Greedy decoding

GREEDY_PROMPTS = [
    ("chat_france", [{"role": "user", "content": "What is the capital of France?"}]),
    ("chat_system", [{"role": "system", "content": "You are a concise assistant."},
                     {"role": "user", "content": "List three primary colors."}]),
    ("chat_multiturn", [{"role": "user", "content": "Hi!"},
                        {"role": "assistant", "content": "Hello! How can I help you today?"},
                        {"role": "user", "content": "Write a haiku about the sea."}]),
    ("chat_math", [{"role": "user", "content": "What is 12 times 7? Explain briefly."}]),
    ("plain_fox", "The quick brown fox"),
    ("plain_story", "Once upon a time, there was a little robot who"),
    ("plain_code", "def fibonacci(n):\n"),
]


def make_greedy(model, out_dir, sha):
    llm = load(model)
    check_template(llm)
    cases = []
    for name, prompt in GREEDY_PROMPTS:
        text = prompt_text(llm, prompt)
        ids = tokenize(llm, text, False, True)
        llm.reset()
        llm.eval(ids)
        out, margins = [], []
        for _ in range(GREEDY_TOKENS):
            row = np.array(llm.scores[llm.n_tokens - 1, :], dtype=np.float32)
            order = np.argsort(-row, kind="stable")[:2]
            tok = int(order[0])
            out.append(tok)
            margins.append(float(row[order[0]] - row[order[1]]))
            llm.eval([tok])
        first_eog = next((i for i, t in enumerate(out)
                          if llama_cpp.llama_vocab_is_eog(llm._model.vocab, t)), None)
        shown = out if first_eog is None else out[:first_eog]
        cases.append({
            "name": name,
            "messages": None if isinstance(prompt, str) else prompt,
            "prompt": text,
            "prompt_ids": ids,
            "tokens": out,
            "top1_margin": margins,
            "first_eog": first_eog,
            "text": b"".join(piece(llm, t, True) for t in out).decode("utf-8", "replace"),
            "text_until_eog": b"".join(piece(llm, t, False) for t in shown).decode("utf-8", "replace"),
        })
        print(f"greedy: {name}: {cases[-1]['text_until_eog']!r}")
    write_json(os.path.join(out_dir, "greedy.json"), {
        "model_sha256": sha,
        "engine": engine_name(),
        "settings": {
            "backend": "CPU", "n_ctx": N_CTX, "n_batch": N_BATCH, "n_ubatch": N_BATCH,
            "n_threads": N_THREADS, "type_k": "f16", "type_v": "f16", "flash_attn": False,
            "sampling": "argmax over the raw logits (no temperature, no penalties); "
                        "ties broken by lowest id",
            "prompt_in_one_decode_then_one_token_per_decode": True,
            "n_generated": GREEDY_TOKENS,
        },
        "notes": [
            "tokens: always 32 argmax tokens; generation does not stop at an "
            "end-of-generation token, first_eog gives the index of the first one (or null).",
            "top1_margin[i]: logit(tokens[i]) - second-best logit at that step; a small "
            "margin means a numerically close call.",
            "chat prompts come from the GGUF's tokenizer.chat_template (which inserts the "
            "default system prompt when there is none) and are tokenized with parse_special.",
        ],
        "cases": cases,
    })


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures"))
    ap.add_argument("--only", choices=["tokenizer", "logits", "greedy"], action="append")
    args = ap.parse_args()
    if not os.path.exists(args.model):
        raise SystemExit(f"{args.model} is missing; run scripts/fetch-model.sh")
    if llama_cpp.__version__ != PINNED_PY_VERSION:
        print(f"warning: llama-cpp-python {llama_cpp.__version__}, the fixtures were made "
              f"with {PINNED_PY_VERSION}", file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    sha = sha256_of(args.model)
    todo = args.only or ["tokenizer", "logits", "greedy"]
    if "tokenizer" in todo:
        make_tokenizer(args.model, args.out, sha)
    if "logits" in todo:
        make_logits(args.model, args.out, sha)
    if "greedy" in todo:
        make_greedy(args.model, args.out, sha)


if __name__ == "__main__":
    main()
