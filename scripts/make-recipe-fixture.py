#!/usr/bin/env python3
"""Writes tests/fixtures/recipes.json: the type llama.cpp's llama-quantize
gives each tensor of SmolLM2's three shapes in every file type smol-quantize
writes (llama-quantize --dry-run, which reports its choices without writing
a file), with the tensor lists and shapes the rules read. test-quant checks
that smol's recipes choose the same.

The 135M is the real SmolLM2-135M-Instruct; the 360M and 1.7B are random
f16 files of their exact shapes, written here by smol-quantize --random
(the rules read names and shapes only).

    scripts/make-recipe-fixture.py [--peers /work/peers] [--smol build]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import gguf

RECIPES = ["Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_1",
           "Q4_0", "IQ4_NL", "IQ4_XS", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K", "F16", "BF16"]
LINE = re.compile(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[.*\], type =\s+(\S+),.*?(?:\((\S+)\))?\s*$")


def tensors_of(path):
    r = gguf.GGUFReader(path)
    f = {k: r.fields[k].contents() for k in ("llama.block_count", "llama.attention.head_count",
                                             "llama.attention.head_count_kv")}
    ts = [[t.name, len(t.shape), int(t.shape[0]), t.tensor_type.name.lower()] for t in r.tensors]
    return {"n_layer": f["llama.block_count"], "n_head": f["llama.attention.head_count"],
            "n_head_kv": f["llama.attention.head_count_kv"], "tensors": ts}


def choices(quantize, path, recipe):
    out = subprocess.run([quantize, "--allow-requantize", "--dry-run", path, recipe, "1"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"llama-quantize {recipe} failed:\n{out.stderr[-2000:]}")
    got = {}
    for line in (out.stdout + out.stderr).splitlines():
        m = LINE.match(line.strip())
        if m:
            got[m.group(1)] = (m.group(3) or m.group(2)).lower()
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", default="/work/peers")
    ap.add_argument("--smol", default="build")
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    quantize = os.path.join(a.peers, "build-cpu", "bin", "llama-quantize")
    real = os.path.join(root, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    fixture = {"about": "llama-quantize --dry-run's type for each tensor (scripts/"
                        "make-recipe-fixture.py)", "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        files = {"135M": real}
        for shape in ("360M", "1.7B"):
            f = os.path.join(tmp, shape + ".gguf")
            subprocess.run([os.path.join(a.smol, "examples", "smol-quantize"), "--random", shape,
                            "--type", "f16", "--vocab-from", real, f], check=True,
                           stdout=subprocess.DEVNULL)
            files[shape] = f
        for shape, path in files.items():
            entry = tensors_of(path)
            entry["recipes"] = {}
            for r in RECIPES:
                entry["recipes"][r] = choices(quantize, path, r)
                print(f"{shape} {r}: {len(entry['recipes'][r])} tensors", flush=True)
            fixture["models"][shape] = entry
    out = os.path.join(root, "tests", "fixtures", "recipes.json")
    with open(out, "w") as f:
        json.dump(fixture, f, indent=0, sort_keys=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
