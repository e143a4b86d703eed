#!/usr/bin/env python3
"""Reads a random-weight model that `smol-quantize --random` (or the
test-random-model suite) wrote, with the PyPI `gguf` package, which shares no
code with smol: the llama metadata must describe the tensors' shapes, the
file must say that its weights are random, and every tensor dequantized by
gguf's own code must have the statistics asked for (matmul weights: mean 0,
standard deviation --std; norms: mean 1). A quantization block laid out
differently from GGUF's would fail the last check.

    check-random-gguf.py FILE.gguf --type q4_1 [--std 0.02]
"""

import argparse
import sys

try:
    import gguf
    import numpy as np
    from gguf.quants import dequantize
except ImportError:
    sys.exit("check-random-gguf: the python packages `gguf` and `numpy` are needed "
             "(scripts/setup.sh installs them)")


def field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    return f.contents()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--type", required=True, help="type of the 2-D weights: f16, bf16, q8_0, ...")
    ap.add_argument("--std", type=float, default=0.02)
    a = ap.parse_args()

    r = gguf.GGUFReader(a.file)
    problems = []
    if field(r, "general.architecture") != "llama":
        problems.append("general.architecture is not llama")
    if field(r, "smol.random_weights") is not True:
        problems.append("smol.random_weights is not true")
    name = field(r, "general.name") or ""
    if "random weights" not in name:
        problems.append(f"general.name {name!r} does not say 'random weights'")
    E = field(r, "llama.embedding_length")
    F = field(r, "llama.feed_forward_length")
    L = field(r, "llama.block_count")
    H = field(r, "llama.attention.head_count")
    KV = field(r, "llama.attention.head_count_kv")
    V = len(field(r, "tokenizer.ggml.tokens") or [])
    kvd = E // H * KV
    want_shapes = {"token_embd.weight": [E, V], "output_norm.weight": [E]}
    for i in range(L):
        p = f"blk.{i}."
        want_shapes.update({
            p + "attn_norm.weight": [E], p + "ffn_norm.weight": [E],
            p + "attn_q.weight": [E, E], p + "attn_k.weight": [E, kvd],
            p + "attn_v.weight": [E, kvd], p + "attn_output.weight": [E, E],
            p + "ffn_gate.weight": [E, F], p + "ffn_up.weight": [E, F],
            p + "ffn_down.weight": [F, E],
        })
    seen = set()
    want_type = gguf.GGMLQuantizationType[a.type.upper()]
    for t in r.tensors:
        seen.add(t.name)
        shape = [int(x) for x in t.shape]
        if want_shapes.get(t.name) != shape:
            problems.append(f"{t.name}: shape {shape}, expected {want_shapes.get(t.name)}")
            continue
        vals = dequantize(t.data, t.tensor_type).astype(np.float64).ravel()
        if len(shape) == 1:
            if t.tensor_type != gguf.GGMLQuantizationType.F32 or abs(vals.mean() - 1) > 0.05:
                problems.append(f"{t.name}: a norm should be f32 around 1, "
                                f"{t.tensor_type.name} mean {vals.mean():.4f}")
            continue
        if t.tensor_type != want_type:
            problems.append(f"{t.name}: type {t.tensor_type.name}, expected {want_type.name}")
        # 4-bit blocks round coarsely; the spread still has to be near std.
        tol = 0.25 if a.type.startswith("q4") else 0.05
        if abs(vals.mean()) > 0.1 * a.std or abs(vals.std() / a.std - 1) > tol:
            problems.append(f"{t.name}: mean {vals.mean():.5f} std {vals.std():.5f}, "
                            f"expected 0 and {a.std}")
    missing = set(want_shapes) - seen
    if missing:
        problems.append(f"missing tensors: {sorted(missing)[:5]}")
    for p in problems[:30]:
        print("check-random-gguf:", p)
    if problems:
        sys.exit(1)
    print(f"check-random-gguf: {a.file}: {len(r.tensors)} tensors of the expected shapes, "
          f"{a.type} weights with std {a.std}, read by gguf-py")


if __name__ == "__main__":
    main()
