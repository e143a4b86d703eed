#!/usr/bin/env python3
"""smol's dequantization against the PyPI gguf package's, bit for bit.

Reads what test-quant wrote into DIR:
- quants.gguf (random blocks of every quantized type) and quants-smol.gguf
  (smol's dequantization of them, f32): gguf.quants.dequantize must give
  the same float32 bits for every tensor;
- real-hashes.json, where a real Q4_K_M file was present: the hash of
  numpy's dequantization of each tensor (spread_hash) must equal smol's.

    scripts/check-quants.py build/tests
"""

import json
import os
import sys

import numpy as np

try:
    import gguf
    from gguf.quants import dequantize
except ImportError:
    sys.exit("check-quants: the Python package 'gguf' is missing (scripts/setup.sh installs it)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spread_hash import spread_hash  # noqa: E402


def main():
    d = sys.argv[1]
    failures = []
    blocks = gguf.GGUFReader(os.path.join(d, "quants.gguf"))
    smol = {t.name: t for t in gguf.GGUFReader(os.path.join(d, "quants-smol.gguf")).tensors}
    for t in blocks.tensors:
        want = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        got = np.asarray(smol[t.name].data, dtype=np.float32).reshape(-1)
        same = want.shape == got.shape and np.array_equal(want.view(np.uint32), got.view(np.uint32))
        n_diff = int(np.count_nonzero(want.view(np.uint32) != got.view(np.uint32))) \
            if want.shape == got.shape else -1
        print(f"  {'ok  ' if same else 'FAIL'} {t.tensor_type.name:8s} {got.size} values"
              + ("" if same else f", {n_diff} differ"))
        if not same:
            failures.append(t.name)
    real = os.path.join(d, "real-hashes.json")
    if os.path.exists(real):
        spec = json.load(open(real))
        reader = gguf.GGUFReader(spec["file"])
        n = 0
        for t in reader.tensors:
            if t.name not in spec["tensors"]:
                continue
            kind, h = spec["tensors"][t.name]
            v = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
            mine = spread_hash(v)
            n += 1
            if mine != int(h):
                failures.append(f"{t.name} ({kind})")
                print(f"  FAIL {t.name} ({kind}): hashes differ")
        print(f"  {'ok  ' if n and not failures else 'FAIL'} {n} tensors of "
              f"{os.path.basename(spec['file'])} hash as smol's")
    else:
        print("  skip the real Q4_K_M file's tensors: not fetched (scripts/fetch-model.sh "
              "gemma3-270m)")
    if failures:
        sys.exit(f"check-quants: {len(failures)} FAILED: " + ", ".join(failures[:10]))
    print("check-quants: all equal")


if __name__ == "__main__":
    main()
