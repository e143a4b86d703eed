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
                  positions, plus how much llama.cpp moves across batch sizes,
                  thread counts, KV types and flash attention.
  greedy.json     prompt ids and 32 argmax-decoded tokens per prompt.

Both logits.json and greedy.json also carry an exact-math reference: the same
dequantized weights run through the Llama forward pass in float64 numpy
(class Reference). llama.cpp quantizes activations to 8-bit blocks for its
quantized matmuls and stores the KV cache in f16, so on this small model its
logits sit about 0.7 (median row max) and up to ~2.5 away from exact math, and
a few positions tip into a different state altogether (logits.json
"unstable_rows"). An engine that computes in f32 should track the f64
reference far more tightly than it can track llama.cpp.

Needs the llama-cpp-python venv that scripts/peers.sh makes (with numpy and
the vendored gguf-py); about 15 minutes on 2 cores, most of it the float64
greedy decodes.

Requantized files (--requant Q4_K_M --requant Q5_K_M --requant Q6_K): the
same model requantized by llama.cpp's own llama-quantize --allow-requantize;
for each, tests/fixtures/requant/TYPE/ gets logits.json and greedy.json for
that file, plus tensors.json: each tensor's type and a hash of its bytes
(spread_hash, as tests/spread-hash.h), so a test can rebuild the file with
smol's quantizer and know it is llama-quantize's, byte for byte.

Without the venv, the sources and libllama of scripts/peers.sh serve too:
    PYTHONPATH=/work/peers/llama_cpp_python-0.3.36 \
    LLAMA_CPP_LIB_PATH=/work/peers/build-cpu/bin python3 scripts/make-fixtures.py
(needs pip's diskcache, jinja2 and numpy).

Options: --model PATH, --out DIR, --only {tokenizer,logits,greedy},
--requant TYPE (repeatable), --llama-quantize PATH.
"""

import argparse
import ctypes
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

import llama_cpp
from llama_cpp import Llama

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spread_hash import spread_hash_bytes  # noqa: E402

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
         vocab_only=False, flash_attn=False, kv_f32=False):
    kv = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32} if kv_f32 else {}
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
        **kv,
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
    control = {}
    for t in range(n_vocab):
        attr = llama_cpp.llama_vocab_get_attr(llm._model.vocab, t)
        if attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL:
            control[t] = piece(llm, t, True).decode("utf-8", "replace")
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
        "control_tokens": {str(k): v for k, v in sorted(control.items())},
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
# Exact-math reference: the same GGUF weights, dequantized, run through the
# Llama forward pass in float64 numpy. llama.cpp quantizes activations to
# Q8 blocks for its quantized matmuls and keeps the KV cache in f16, so it
# is itself only an approximation; this shows by how much.

def import_gguf():
    try:
        import gguf  # noqa: F401
    except ImportError:
        import glob
        peers = os.environ.get("PEERS_DIR", "/work/peers")
        for path in sorted(glob.glob(f"{peers}/llama_cpp_python-*/vendor/llama.cpp/gguf-py")):
            sys.path.insert(0, path)
    from gguf import GGUFReader
    from gguf.quants import dequantize
    return GGUFReader, dequantize


class Reference:
    def __init__(self, model):
        GGUFReader, dequantize = import_gguf()
        r = GGUFReader(model)

        def field(name):
            return r.fields[name].contents()

        arch = field("general.architecture")
        self.n_layer = int(field(f"{arch}.block_count"))
        self.n_head = int(field(f"{arch}.attention.head_count"))
        self.n_head_kv = int(field(f"{arch}.attention.head_count_kv"))
        self.n_embd = int(field(f"{arch}.embedding_length"))
        self.head_dim = self.n_embd // self.n_head
        self.eps = float(field(f"{arch}.attention.layer_norm_rms_epsilon"))
        self.rope_base = float(field(f"{arch}.rope.freq_base"))
        self.w = {}
        for t in r.tensors:
            shape = [int(x) for x in reversed(t.shape.tolist())]
            self.w[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
        if "output.weight" not in self.w:
            self.w["output.weight"] = self.w["token_embd.weight"]
        self.inv_freq = self.rope_base ** (-np.arange(0, self.head_dim, 2) / self.head_dim)

    def _rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def _rope(self, x, pos):
        # llama.cpp's "normal" rope: rotate adjacent pairs (x[2i], x[2i+1]).
        ang = pos[:, None] * self.inv_freq[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def new_cache(self):
        return [[np.zeros((0, self.n_head_kv, self.head_dim))] * 2 for _ in range(self.n_layer)]

    def forward(self, ids, cache, all_logits=True):
        w, hd = self.w, self.head_dim
        n_past = cache[0][0].shape[0]
        T = len(ids)
        pos = np.arange(n_past, n_past + T, dtype=np.float64)
        x = w["token_embd.weight"][np.asarray(ids)]
        mask = np.triu(np.full((T, n_past + T), -np.inf), n_past + 1)
        group = self.n_head // self.n_head_kv
        for l in range(self.n_layer):
            p = f"blk.{l}."
            h = self._rms(x, w[p + "attn_norm.weight"])
            q = self._rope((h @ w[p + "attn_q.weight"].T).reshape(T, self.n_head, hd), pos)
            k = self._rope((h @ w[p + "attn_k.weight"].T).reshape(T, self.n_head_kv, hd), pos)
            v = (h @ w[p + "attn_v.weight"].T).reshape(T, self.n_head_kv, hd)
            cache[l][0] = k = np.concatenate([cache[l][0], k])
            cache[l][1] = v = np.concatenate([cache[l][1], v])
            o = np.empty((T, self.n_head, hd))
            for hh in range(self.n_head):
                sc = q[:, hh, :] @ k[:, hh // group, :].T / np.sqrt(hd) + mask
                sc = np.exp(sc - sc.max(-1, keepdims=True))
                sc /= sc.sum(-1, keepdims=True)
                o[:, hh, :] = sc @ v[:, hh // group, :]
            x = x + o.reshape(T, -1) @ w[p + "attn_output.weight"].T
            h = self._rms(x, w[p + "ffn_norm.weight"])
            g = h @ w[p + "ffn_gate.weight"].T
            u = h @ w[p + "ffn_up.weight"].T
            x = x + (g / (1.0 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
        if not all_logits:
            x = x[-1:]
        return self._rms(x, w["output_norm.weight"]) @ w["output.weight"].T

    def logits(self, ids):
        return self.forward(ids, self.new_cache())

    def greedy(self, ids, n):
        cache = self.new_cache()
        row = self.forward(ids, cache, all_logits=False)[0]
        out, margins = [], []
        for _ in range(n):
            order = np.argsort(-row, kind="stable")[:2]
            out.append(int(order[0]))
            margins.append(float(row[order[0]] - row[order[1]]))
            row = self.forward([out[-1]], cache, all_logits=False)[0]
        return out, margins


_REFERENCE = None


def reference(model):
    global _REFERENCE
    if _REFERENCE is None:
        _REFERENCE = Reference(model)
    return _REFERENCE


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


def row_record(row):
    top = np.argsort(-row, kind="stable")[:TOP_K]
    return {
        "top": [[int(t), float(row[t])] for t in top],
        "summary": summary(row),
        "probe": [float(row[t]) for t in PROBE_IDS],
    }


def diff_stats(got, ref):
    got = got.astype(np.float64)
    ref = ref.astype(np.float64)
    d = np.abs(got - ref)
    std = ref.std(axis=1, keepdims=True)
    centered = np.abs((got - got.mean(axis=1, keepdims=True)) - (ref - ref.mean(axis=1, keepdims=True)))
    return {
        "row_max": d.max(axis=1),
        "row_max_centered": centered.max(axis=1),
        "sum_abs": float(d.sum()),
        "sum_sq": float((d * d).sum()),
        "count": d.size,
        "max_over_std": float((d / std).max()),
        "argmax_mismatches": int((got.argmax(axis=1) != ref.argmax(axis=1)).sum()),
    }


def merge_stats(parts):
    row_max = np.concatenate([p["row_max"] for p in parts.values()])
    row_max_c = np.concatenate([p["row_max_centered"] for p in parts.values()])
    count = sum(p["count"] for p in parts.values())
    return {
        "max_abs_diff": float(row_max.max()),
        "p50_row_max_abs_diff": float(np.percentile(row_max, 50)),
        "p99_row_max_abs_diff": float(np.percentile(row_max, 99)),
        "p50_row_max_abs_diff_mean_removed": float(np.percentile(row_max_c, 50)),
        "p99_row_max_abs_diff_mean_removed": float(np.percentile(row_max_c, 99)),
        "mean_abs_diff": sum(p["sum_abs"] for p in parts.values()) / count,
        "rms_diff": float(np.sqrt(sum(p["sum_sq"] for p in parts.values()) / count)),
        "max_abs_diff_over_row_std": max(p["max_over_std"] for p in parts.values()),
        "argmax_mismatches": sum(p["argmax_mismatches"] for p in parts.values()),
        "rows": int(row_max.size),
        "max_abs_diff_per_prompt": {k: float(p["row_max"].max()) for k, p in parts.items()},
    }


def describe_stats(e):
    return (f"max |d| = {e['max_abs_diff']:.4g}, median row max = {e['p50_row_max_abs_diff']:.4g}, "
            f"p99 row max = {e['p99_row_max_abs_diff']:.4g} "
            f"({e['p99_row_max_abs_diff_mean_removed']:.4g} mean removed), "
            f"mean |d| = {e['mean_abs_diff']:.4g}, "
            f"argmax mismatches {e['argmax_mismatches']}/{e['rows']}")


UNSTABLE_ROW = 3.0


def make_logits(model, out_dir, sha):
    llm = load(model)
    check_template(llm)
    ref_model = reference(model)
    prompts = []
    baseline = {}
    f64_parts = {}
    unstable = []
    for name, prompt in LOGIT_PROMPTS:
        text = prompt_text(llm, prompt)
        ids = tokenize(llm, text, False, True)
        logits = run_logits(llm, ids)
        exact = ref_model.logits(ids)
        baseline[name] = (ids, logits)
        f64_parts[name] = diff_stats(logits, exact)
        entries = []
        for p in positions_for(len(ids)):
            entry = {"pos": p}
            entry.update(row_record(logits[p]))
            entry["f64"] = row_record(exact[p])
            entries.append(entry)
        prompts.append({"name": name, "text": text, "ids": ids, "positions": entries})
        for p in np.nonzero(f64_parts[name]["row_max"] > UNSTABLE_ROW)[0]:
            unstable.append({"prompt": name, "pos": int(p),
                             "max_abs_diff_vs_f64": float(f64_parts[name]["row_max"][p])})
        print(f"logits: {name}: {len(ids)} tokens; llama.cpp vs float64 reference: "
              f"max |d| = {f64_parts[name]['row_max'].max():.4g}")
    del llm

    variation = self_variation(model, baseline)
    f64 = {"config": "numpy float64 reference (dequantized weights, exact math)"}
    f64.update(merge_stats(f64_parts))
    print(f"llama.cpp vs float64 reference: {describe_stats(f64)}")
    variation.append(f64)

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
            "f64: the same three, from a float64 numpy forward pass over the dequantized "
            "weights (no activation quantization, f64 KV): exact math for these weights.",
            "self_variation: differences between the baseline llama.cpp run and another "
            "llama.cpp configuration (or the f64 reference), over every position and every "
            "vocab entry of all prompts; *_row_max_*: percentiles over rows (positions) of "
            "each row's largest |difference|; *_mean_removed: the same after subtracting each "
            "row's mean logit (a constant shift does not change the softmax).",
            f"unstable_rows: positions where llama.cpp and the f64 reference differ by more "
            f"than {UNSTABLE_ROW} somewhere in the row; there llama.cpp's activation "
            "quantization tips the model into a different state (batching and flash attention "
            "move these rows by a similar amount), so neither side is a good target.",
        ],
        "probe_ids": PROBE_IDS,
        "self_variation": variation,
        "unstable_rows": unstable,
        "prompts": prompts,
    })


def self_variation(model, baseline):
    configs = [
        {"name": "n_threads=1", "n_batch": N_BATCH, "n_threads": 1},
        {"name": "n_batch=n_ubatch=1 (token by token)", "n_batch": 1, "n_threads": N_THREADS},
        {"name": "n_batch=n_ubatch=7", "n_batch": 7, "n_threads": N_THREADS},
        {"name": "n_batch=512 n_ubatch=32", "n_batch": N_BATCH, "n_ubatch": 32,
         "n_threads": N_THREADS},
        {"name": "type_k=type_v=f32", "n_batch": N_BATCH, "n_threads": N_THREADS, "kv_f32": True},
        {"name": "flash_attn=on", "n_batch": N_BATCH, "n_threads": N_THREADS, "flash_attn": True},
        {"name": "repeat of baseline", "n_batch": N_BATCH, "n_threads": N_THREADS},
    ]
    out = []
    for cfg in configs:
        llm = load(model, n_batch=cfg["n_batch"], n_ubatch=cfg.get("n_ubatch"),
                   n_threads=cfg["n_threads"], flash_attn=cfg.get("flash_attn", False),
                   kv_f32=cfg.get("kv_f32", False))
        parts = {name: diff_stats(run_logits(llm, ids), ref)
                 for name, (ids, ref) in baseline.items()}
        del llm
        entry = {"config": cfg["name"]}
        entry.update(merge_stats(parts))
        print(f"self variation: {cfg['name']}: {describe_stats(entry)}")
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
    ref_model = reference(model)
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
        f64_out, f64_margins = ref_model.greedy(ids, GREEDY_TOKENS)
        agree = next((i for i, (a, b) in enumerate(zip(out, f64_out)) if a != b), len(out))
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
            "f64_tokens": f64_out,
            "f64_top1_margin": f64_margins,
            "f64_agrees_for": agree,
            "f64_text": b"".join(piece(llm, t, True) for t in f64_out).decode("utf-8", "replace"),
        })
        print(f"greedy: {name}: {cases[-1]['text_until_eog']!r} (float64 reference agrees for "
              f"{agree}/{GREEDY_TOKENS} tokens)")
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
            "f64_*: the same greedy decode with the float64 numpy reference (exact math on the "
            "dequantized weights); f64_agrees_for counts the leading tokens on which it and "
            "llama.cpp agree.",
            "chat prompts come from the GGUF's tokenizer.chat_template (which inserts the "
            "default system prompt when there is none) and are tokenized with parse_special.",
        ],
        "cases": cases,
    })


# ----------------------------------------------------------------------------
# Requantized files

def make_requant(model, file_type, quantizer, out_root):
    out_dir = os.path.join(out_root, "requant", file_type.lower())
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"model-{file_type}.gguf")
        cmd = [quantizer, "--allow-requantize", model, path, file_type, str(N_THREADS)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        GGUFReader, _ = import_gguf()
        r = GGUFReader(path)
        tensors = {t.name: [t.tensor_type.name,
                            str(spread_hash_bytes(np.asarray(t.data).tobytes()))]
                   for t in r.tensors}
        del r
        made_by = ("llama-quantize --allow-requantize MODEL OUT " + file_type + " "
                   + str(N_THREADS) + f" ({engine_name()}); MODEL: {os.path.basename(model)}")
        write_json(os.path.join(out_dir, "tensors.json"), {
            "source_sha256": sha256_of(model),
            "file_type": file_type,
            "made_by": made_by,
            "file_bytes": os.path.getsize(path),
            "notes": ["tensors: name -> [type, spread_hash of its bytes as stored, "
                      "as a decimal string]"],
            "tensors": tensors,
        })
        sha = sha256_of(path)
        make_logits(path, out_dir, sha)
        make_greedy(path, out_dir, sha)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures"))
    ap.add_argument("--only", choices=["tokenizer", "logits", "greedy"], action="append")
    ap.add_argument("--requant", action="append", metavar="TYPE",
                    help="only the fixtures of the model requantized to TYPE by llama-quantize")
    ap.add_argument("--llama-quantize", default=os.path.join(
        os.environ.get("PEERS_DIR", "/work/peers"), "build-cpu", "bin", "llama-quantize"))
    args = ap.parse_args()
    if not os.path.exists(args.model):
        raise SystemExit(f"{args.model} is missing; run scripts/fetch-model.sh")
    if llama_cpp.__version__ != PINNED_PY_VERSION:
        print(f"warning: llama-cpp-python {llama_cpp.__version__}, the fixtures were made "
              f"with {PINNED_PY_VERSION}", file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    if args.requant:
        for file_type in args.requant:
            make_requant(args.model, file_type, args.llama_quantize, args.out)
        return
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
