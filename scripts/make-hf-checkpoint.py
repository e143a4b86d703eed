#!/usr/bin/env python3
"""Writes a small random Llama in Hugging Face's own layout, and the truth a
converter of it is checked against.

The directory holds config.json, the weights as safetensors (one file, or
shards with model.safetensors.index.json) in HF's layout (q_proj and k_proj
rows half-split for rotate_half RoPE, as transformers stores them),
tokenizer.json (a `tokenizers` BPE built from the vocabulary and merges of a
real SmolLM2 GGUF, with SmolLM2's pre-tokenizer and special tokens),
tokenizer_config.json (SmolLM2's chat template and special tokens) and
generation_config.json (sampling settings).

reference.json beside them gives, for a few texts, the ids the HF
`tokenizers` library gives, and for a few token sequences the logits of an
independent float64 numpy forward pass (RMSNorm, rotate_half RoPE, GQA
attention, SwiGLU, tied output) over the weights as stored; the logits are
in reference-logits.f64 (little-endian float64, sequence after sequence,
position after position, n_vocab each).

    make-hf-checkpoint.py OUT_DIR --vocab-from SmolLM2.gguf --seed 7 [--dtype bf16] [--shards 2]

Exit status 77 (a skip for ctest) when numpy, gguf, safetensors or
tokenizers is missing.
"""

import argparse
import json
import os
import sys

try:
    import gguf
    import numpy as np
    import safetensors.numpy  # noqa: F401 (hf_checkpoint writes with it)
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, processors
except ImportError as e:
    print(f"make-hf-checkpoint: skipped: {e.name} is not installed "
          "(pip install numpy gguf safetensors tokenizers)")
    sys.exit(77)

from hf_checkpoint import rotate_half, stored_and_exact, write_reference, write_weights

# Texts whose ids the converted model's tokenizer must reproduce: real prose
# and code, and the edges of byte-level BPE.
EDGE_TEXTS = [
    "Hello world",
    " Hello  world\n\n\tindented",
    "The year 2024 had 366 days; 3.14159 and 1,000,000.",
    "naïve café, Ünïcödé — “quotes” and 日本語のテキスト 🦙🚀",
    "<|im_start|>user\nHi there<|im_end|>\n",
    "def f(x):\n    return x ** 2  # square\n",
    "",
    " ",
    "\n\n\n",
    "I've been 'told he's there, 'RE you sure? We'Ve a'lL",
]


def pydoc_texts(n):
    """Some paragraphs of Python's own documentation (a skip when absent)."""
    try:
        from pydoc_data import topics
    except ImportError:
        return []
    out = []
    for key in sorted(topics.topics)[:n]:
        out.append(topics.topics[key][:1500])
    return out


def build_tokenizer(vocab_gguf):
    r = gguf.GGUFReader(vocab_gguf)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    chat_template = r.fields["tokenizer.chat_template"].contents()
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges],
                     fuse_unk=False, byte_fallback=False)
    tok = tokenizers.Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = [tokens[i] for i, t in enumerate(types) if t == 3]
    tok.add_special_tokens(specials)
    return tok, tokens, chat_template


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def forward(w, cfg, ids):
    """Logits of every position, float64, in HF's layout and formulas."""
    E, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = E // H
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    T = len(ids)
    x = w["model.embed_tokens.weight"][ids]
    inv = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.outer(np.arange(T, dtype=np.float64), inv)
    emb = np.concatenate([ang, ang], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, hd).transpose(1, 0, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, KV, hd).transpose(1, 0, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, KV, hd).transpose(1, 0, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = np.repeat(k, H // KV, axis=0)
        v = np.repeat(v, H // KV, axis=0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        o = (s @ v).transpose(1, 0, 2).reshape(T, E)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = h @ w[p + "mlp.gate_proj.weight"].T
        u = h @ w[p + "mlp.up_proj.weight"].T
        x = x + ((g / (1.0 + np.exp(-g))) * u) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    return x @ w["model.embed_tokens.weight"].T


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--vocab-from", required=True, help="a SmolLM2 GGUF whose tokenizer is used")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ff", type=int, default=256)
    a = ap.parse_args()
    if not os.path.isfile(a.vocab_from):
        print(f"make-hf-checkpoint: skipped: {a.vocab_from} is absent (scripts/fetch-model.sh)")
        sys.exit(77)
    os.makedirs(a.out, exist_ok=True)
    print(f"make-hf-checkpoint: seed {a.seed}, {a.dtype}, {a.shards} shard(s) -> {a.out}")

    tok, tokens, chat_template = build_tokenizer(a.vocab_from)
    n_vocab = len(tokens)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    tok_config = {
        "add_prefix_space": False,
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 8192,
        "tokenizer_class": "GPT2Tokenizer",
        "vocab_size": n_vocab,
    }
    with open(os.path.join(a.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tok_config, f, indent=2, ensure_ascii=False)

    E, L, H, KV, F = a.hidden, a.layers, a.heads, a.kv_heads, a.ff
    hd = E // H
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": E,
        "initializer_range": 0.02,
        "intermediate_size": F,
        "max_position_embeddings": 8192,
        "mlp_bias": False,
        "num_attention_heads": H,
        "num_hidden_layers": L,
        "num_key_value_heads": KV,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
        "torch_dtype": {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[a.dtype],
        "transformers_version": "4.42.3",
        "use_cache": True,
        "vocab_size": n_vocab,
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "temperature": 0.2, "top_p": 0.9,
                   "repetition_penalty": 1.1, "transformers_version": "4.42.3"}, f, indent=2)

    rng = np.random.default_rng(a.seed)
    shapes = {"model.embed_tokens.weight": (n_vocab, E), "model.norm.weight": (E,)}
    for l in range(L):
        p = f"model.layers.{l}."
        shapes.update({
            p + "input_layernorm.weight": (E,),
            p + "post_attention_layernorm.weight": (E,),
            p + "self_attn.q_proj.weight": (H * hd, E),
            p + "self_attn.k_proj.weight": (KV * hd, E),
            p + "self_attn.v_proj.weight": (KV * hd, E),
            p + "self_attn.o_proj.weight": (E, H * hd),
            p + "mlp.gate_proj.weight": (F, E),
            p + "mlp.up_proj.weight": (F, E),
            p + "mlp.down_proj.weight": (E, F),
        })
    stored, exact = {}, {}
    for name in sorted(shapes):
        shape = shapes[name]
        if len(shape) == 1:
            x = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            x = (0.08 * rng.standard_normal(shape)).astype(np.float32)
        stored[name], exact[name] = stored_and_exact(x, a.dtype)

    names, total = write_weights(a.out, stored, a.dtype, a.shards)

    texts = EDGE_TEXTS + pydoc_texts(6)
    tokenized = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in texts]
    seqs = [tokenized[0]["ids"], tokenized[2]["ids"][:24], tokenized[4]["ids"],
            [int(i) for i in rng.integers(0, n_vocab, 16)]]
    largest = write_reference(a.out, a.seed, a.dtype, n_vocab, tokenized, seqs,
                              lambda ids: forward(exact, cfg, ids))
    print(f"make-hf-checkpoint: {len(names)} tensors, {total / 2**20:.1f} MiB; "
          f"{len(texts)} texts, {len(seqs)} sequences (largest |logit| {largest:.3f})")


if __name__ == "__main__":
    main()
