"""What make-hf-checkpoint.py and make-hf-gemma3.py share: weights kept as
a Hugging Face checkpoint stores them (f32, f16, or bf16 bits, which numpy
cannot hold as floats) beside the float64 values the reference pass uses,
written as safetensors in one file or shards with
model.safetensors.index.json, and the reference files (reference.json and
the float64 logits) the converter's test reads. Needs numpy and
safetensors; the scripts import it after checking for them."""

import json
import os
import struct

import numpy as np
import safetensors.numpy


def to_bf16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def stored_and_exact(x, dtype):
    """A float32 tensor as the checkpoint stores it in dtype, and the
    float64 value of what is stored."""
    if dtype == "f16":
        s = x.astype(np.float16)
        return s, s.astype(np.float64)
    if dtype == "bf16":
        s = to_bf16_bits(x)
        return s, from_bf16_bits(s).astype(np.float64)
    return x, x.astype(np.float64)


def write_bf16(path, tensors):
    """safetensors with BF16 tensors, written by hand from uint16 arrays
    holding the bits."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        data = tensors[name].astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def write_weights(out, stored, dtype, shards):
    """The stored tensors as model.safetensors, or as shards (tensors dealt
    round-robin in name order) with their index. Returns the tensor names
    and their bytes."""
    names = sorted(stored)
    if shards == 1:
        parts = {"model.safetensors": names}
    else:
        parts = {f"model-{s + 1:05d}-of-{shards:05d}.safetensors": names[s::shards]
                 for s in range(shards)}
    weight_map, total = {}, 0
    for part, part_names in parts.items():
        subset = {n: stored[n] for n in part_names}
        if dtype == "bf16":
            write_bf16(os.path.join(out, part), subset)
        else:
            safetensors.numpy.save_file(subset, os.path.join(out, part),
                                        metadata={"format": "pt"})
        for n in part_names:
            weight_map[n] = part
            total += stored[n].nbytes
    if shards > 1:
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return names, total


def write_reference(out, seed, dtype, n_vocab, tokenized, seqs, logits_of):
    """reference.json (the texts' ids, the sequences) and the sequences'
    float64 logits, logits_of(ids) each, in reference-logits.f64. Returns
    the largest |logit|."""
    largest = 0.0
    with open(os.path.join(out, "reference-logits.f64"), "wb") as f:
        for ids in seqs:
            y = logits_of(ids)
            f.write(y.astype("<f8").tobytes())
            largest = max(largest, float(np.abs(y).max()))
    with open(os.path.join(out, "reference.json"), "w", encoding="utf-8") as f:
        json.dump({"seed": seed, "dtype": dtype, "n_vocab": n_vocab, "texts": tokenized,
                   "sequences": seqs, "logits_file": "reference-logits.f64"}, f,
                  ensure_ascii=False)
    return largest
