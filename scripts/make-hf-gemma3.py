#!/usr/bin/env python3
"""Writes a small random Gemma 3 (Gemma3ForCausalLM, text only) in Hugging
Face's own layout, and the truth a converter of it is checked against.

The directory holds config.json (Gemma3TextConfig's fields), the weights as
safetensors (one file or shards with model.safetensors.index.json; norm
weights stored as HF stores them, the offset from 1), tokenizer.model (a
SentencePiece BPE model with byte fallback, trained here on Python's own
documentation, pydoc_data.topics), tokenizer_config.json (a chat template,
special tokens, added_tokens_decoder) and generation_config.json; with
--tokenizer-json also a tokenizer.json in the shape of Gemma's (its
vocabulary, added tokens and the post-processor that adds <bos>), which
llama.cpp's converter reads for special tokens only when tokenizer.model is
there.

reference.json beside them gives, for a few texts, the ids the sentencepiece
library gives, and for a few token sequences the logits of an independent
float64 numpy forward pass written from transformers' modeling_gemma3
(embedding times sqrt(hidden), RMSNorm scaling by 1 + w, per-head q/k norms,
rotate_half RoPE with the local base on sliding-window layers, the window
itself, GeGLU with tanh gelu, post-attention and post-feedforward norms,
attention scale query_pre_attn_scalar**-0.5, tied output, final soft-capping
when set); the logits are in reference-logits.f64 (little-endian float64,
sequence after sequence, position after position, n_vocab each).

    make-hf-gemma3.py OUT_DIR --seed 7 [--dtype bf16] [--shards 2] [--check-transformers]

--check-transformers loads the checkpoint with transformers (torch) in
float64 and fails unless its logits are those of the numpy pass, within
1e-5 of the largest (transformers keeps RoPE's frequencies in float32).

Exit status 77 (a skip for ctest) when numpy, safetensors or sentencepiece
is missing.
"""

import argparse
import json
import os
import sys
import tempfile

try:
    import numpy as np
    import safetensors.numpy  # noqa: F401 (hf_checkpoint writes with it)
    import sentencepiece as spm
except ImportError as e:
    print(f"make-hf-gemma3: skipped: {e.name} is not installed "
          "(pip install numpy safetensors sentencepiece)")
    sys.exit(77)

from hf_checkpoint import rotate_half, stored_and_exact, write_reference, write_weights

EDGE_TEXTS = [
    "Hello world",
    " Hello  world\n\n\tindented",
    "The year 2024 had 366 days; 3.14159 and 1,000,000.",
    "naïve café, Ünïcödé — “quotes” and 日本語のテキスト 🦙🚀",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "def f(x):\n    return x ** 2  # square\n",
    "",
    " ",
    "\n\n\n",
    "  leading spaces and trailing   ",
    "\x00\x01 control bytes \x7f",
]

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")


def pydoc_corpus():
    from pydoc_data import topics
    return [topics.topics[k] for k in sorted(topics.topics)]


def train_tokenizer(out_dir, n_pieces):
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            for doc in pydoc_corpus():
                for line in doc.splitlines():
                    if line.strip():
                        f.write(line + "\n")
        prefix = os.path.join(tmp, "tok")
        spm.SentencePieceTrainer.train(
            input=corpus, model_prefix=prefix, model_type="bpe", vocab_size=n_pieces,
            byte_fallback=True, character_coverage=1.0, split_digits=True,
            add_dummy_prefix=False, remove_extra_whitespaces=False,
            allow_whitespace_only_pieces=True, normalization_rule_name="identity",
            pad_id=0, eos_id=1, bos_id=2, unk_id=3,
            pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
            control_symbols=["<mask>"],
            user_defined_symbols=["<start_of_turn>", "<end_of_turn>"],
            num_threads=1, minloglevel=2)
        with open(prefix + ".model", "rb") as f:
            blob = f.read()
    with open(os.path.join(out_dir, "tokenizer.model"), "wb") as f:
        f.write(blob)
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(blob)
    return sp


def write_tokenizer_json(out_dir, sp, specials):
    """What the converter reads of Gemma's tokenizer.json: added tokens and
    a TemplateProcessing post-processor adding <bos>."""
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in specials.items()]
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<bos>", "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}},
        },
        "decoder": None,
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)


# --- the forward pass, after transformers' modeling_gemma3 -----------------

def gemma_rms_norm(x, w, eps):
    # Gemma3RMSNorm: x / rms(x), times (1 + w).
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def rope_tables(T, hd, base, factor=1.0):
    # Linear scaling (global layers only, as transformers applies it)
    # divides the frequencies.
    inv = 1.0 / base ** (np.arange(0, hd, 2, dtype=np.float64) / hd) / factor
    ang = np.outer(np.arange(T, dtype=np.float64), inv)
    emb = np.concatenate([ang, ang], axis=-1)
    return np.cos(emb), np.sin(emb)


def forward(w, cfg, ids):
    E, H, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps = cfg["head_dim"], cfg["rms_norm_eps"]
    T = len(ids)
    x = w["model.embed_tokens.weight"][ids] * np.sqrt(E)
    scaling = cfg.get("rope_scaling") or {}
    factor = scaling.get("factor", 1.0) if scaling.get("rope_type") == "linear" else 1.0
    tables = {"full_attention": rope_tables(T, hd, cfg["rope_theta"], factor),
              "sliding_attention": rope_tables(T, hd, cfg["rope_local_base_freq"])}
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    causal = j <= i
    masks = {"full_attention": np.where(causal, 0.0, -np.inf),
             "sliding_attention": np.where(causal & (j > i - cfg["sliding_window"]), 0.0, -np.inf)}
    scale = cfg["query_pre_attn_scalar"] ** -0.5
    for l, kind in enumerate(cfg["layer_types"]):
        p = f"model.layers.{l}."
        cos, sin = tables[kind]
        h = gemma_rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, hd)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, KV, hd)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, KV, hd)
        q = gemma_rms_norm(q, w[p + "self_attn.q_norm.weight"], eps).transpose(1, 0, 2)
        k = gemma_rms_norm(k, w[p + "self_attn.k_norm.weight"], eps).transpose(1, 0, 2)
        v = v.transpose(1, 0, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = np.repeat(k, H // KV, axis=0)
        v = np.repeat(v, H // KV, axis=0)
        s = q @ k.transpose(0, 2, 1) * scale + masks[kind]
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        o = (s @ v).transpose(1, 0, 2).reshape(T, H * hd) @ w[p + "self_attn.o_proj.weight"].T
        x = x + gemma_rms_norm(o, w[p + "post_attention_layernorm.weight"], eps)
        h = gemma_rms_norm(x, w[p + "pre_feedforward_layernorm.weight"], eps)
        g = gelu_tanh(h @ w[p + "mlp.gate_proj.weight"].T)
        u = h @ w[p + "mlp.up_proj.weight"].T
        f = (g * u) @ w[p + "mlp.down_proj.weight"].T
        x = x + gemma_rms_norm(f, w[p + "post_feedforward_layernorm.weight"], eps)
    x = gemma_rms_norm(x, w["model.norm.weight"], eps)
    y = x @ w["model.embed_tokens.weight"].T
    if cfg.get("final_logit_softcapping"):
        c = cfg["final_logit_softcapping"]
        y = np.tanh(y / c) * c
    return y


def check_transformers(out_dir, seqs):
    """The numpy pass against transformers' own Gemma3ForCausalLM."""
    import torch
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(out_dir, torch_dtype=torch.float64,
                                             attn_implementation="eager").eval()
    ref = np.fromfile(os.path.join(out_dir, "reference-logits.f64"), "<f8")
    at, worst = 0, 0.0
    for ids in seqs:
        with torch.no_grad():
            y = m(torch.tensor([ids])).logits[0].numpy()
        r = ref[at:at + y.size].reshape(y.shape)
        at += y.size
        worst = max(worst, float(np.abs(y - r).max() / np.abs(r).max()))
    print(f"make-hf-gemma3: transformers' logits within {worst:.1e} of the numpy pass's")
    if worst > 1e-5:
        sys.exit("make-hf-gemma3: the numpy forward pass disagrees with transformers")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--ff", type=int, default=128)
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--pieces", type=int, default=3000)
    ap.add_argument("--vocab-pad", type=int, default=6,
                    help="config.json's vocab_size past the tokenizer's pieces")
    ap.add_argument("--softcap", type=float, default=None)
    ap.add_argument("--rope-linear", type=float, default=None,
                    help="rope_scaling {rope_type: linear, factor: F} for the global layers")
    ap.add_argument("--tokenizer-json", action="store_true")
    ap.add_argument("--check-transformers", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    print(f"make-hf-gemma3: seed {a.seed}, {a.dtype}, {a.shards} shard(s) -> {a.out}")

    sp = train_tokenizer(a.out, a.pieces)
    n_vocab = sp.get_piece_size() + a.vocab_pad
    specials = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>",
                5: "<start_of_turn>", 6: "<end_of_turn>"}
    tok_config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True} for i, t in specials.items()},
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1000000000000000019884624838656,
        "spaces_between_special_tokens": False,
        "tokenizer_class": "GemmaTokenizer",
        "use_default_system_prompt": False,
    }
    with open(os.path.join(a.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tok_config, f, indent=2, ensure_ascii=False)

    if a.tokenizer_json:
        write_tokenizer_json(a.out, sp, specials)

    E, L, H, KV, F, hd = a.hidden, a.layers, a.heads, a.kv_heads, a.ff, a.head_dim
    pattern = 6
    layer_types = ["sliding_attention" if (l + 1) % pattern else "full_attention"
                   for l in range(L)]
    cfg = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": None,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
        "final_logit_softcapping": a.softcap,
        "head_dim": hd,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": E,
        "initializer_range": 0.02,
        "intermediate_size": F,
        "layer_types": layer_types,
        "max_position_embeddings": 32768,
        "num_attention_heads": H,
        "num_hidden_layers": L,
        "num_key_value_heads": KV,
        "query_pre_attn_scalar": hd,
        "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": a.rope_linear} if a.rope_linear
        else None,
        "rope_theta": 1000000.0,
        "sliding_window": a.window,
        "sliding_window_pattern": pattern,
        "tie_word_embeddings": True,
        "torch_dtype": {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[a.dtype],
        "transformers_version": "4.57.6",
        "use_bidirectional_attention": False,
        "use_cache": True,
        "vocab_size": n_vocab,
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 2, "eos_token_id": [1, 6], "pad_token_id": 0, "top_k": 64,
                   "top_p": 0.95, "transformers_version": "4.57.6"}, f, indent=2)

    rng = np.random.default_rng(a.seed)
    shapes = {"model.embed_tokens.weight": (n_vocab, E), "model.norm.weight": (E,)}
    for l in range(L):
        p = f"model.layers.{l}."
        shapes.update({
            p + "input_layernorm.weight": (E,),
            p + "post_attention_layernorm.weight": (E,),
            p + "pre_feedforward_layernorm.weight": (E,),
            p + "post_feedforward_layernorm.weight": (E,),
            p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,),
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
            x = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif name == "model.embed_tokens.weight":
            x = (0.08 * rng.standard_normal(shape)).astype(np.float32)
        else:
            x = ((1.0 / np.sqrt(shape[1])) * rng.standard_normal(shape)).astype(np.float32)
        stored[name], exact[name] = stored_and_exact(x, a.dtype)

    names, total = write_weights(a.out, stored, a.dtype, a.shards)

    texts = EDGE_TEXTS + [d[:1500] for d in pydoc_corpus()[:8]]
    tokenized = [{"text": t, "ids": sp.encode(t)} for t in texts]
    seqs = [[2] + tokenized[0]["ids"], [2] + tokenized[2]["ids"][:23], tokenized[4]["ids"],
            [int(i) for i in rng.integers(0, sp.get_piece_size(), 20)]]
    largest = write_reference(a.out, a.seed, a.dtype, n_vocab, tokenized, seqs,
                              lambda ids: forward(exact, cfg, ids))
    if a.check_transformers:
        check_transformers(a.out, seqs)
    print(f"make-hf-gemma3: {len(names)} tensors, {total / 2**20:.1f} MiB, "
          f"{sp.get_piece_size()} pieces; {len(texts)} texts, {len(seqs)} sequences "
          f"(largest |logit| {largest:.3f})")


if __name__ == "__main__":
    main()
