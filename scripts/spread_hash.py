"""The hash tests/spread-hash.h takes of a byte string, for the scripts that
hold smol to numpy's values or llama.cpp's bytes (check-quants.py,
make-fixtures.py): the sum, modulo 2^64, of splitmix64(word | index << 32)
over the little-endian 32-bit words of the bytes (the last one zero-padded).
"""

import numpy as np


def spread_hash_bytes(data) -> int:
    raw = np.frombuffer(bytes(data), dtype=np.uint8)
    if raw.size % 4:
        raw = np.concatenate([raw, np.zeros(4 - raw.size % 4, dtype=np.uint8)])
    words = raw.view("<u4")
    total = np.uint64(0)
    with np.errstate(over="ignore"):
        for i0 in range(0, words.size, 1 << 24):
            z = words[i0:i0 + (1 << 24)].astype(np.uint64)
            z |= np.arange(i0, i0 + z.size, dtype=np.uint64) << np.uint64(32)
            z += np.uint64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z ^= z >> np.uint64(31)
            total += z.sum(dtype=np.uint64)
    return int(total)


def spread_hash(v: np.ndarray) -> int:
    """The same over an array of float32 values' bits."""
    return spread_hash_bytes(np.ascontiguousarray(v, dtype=np.float32).tobytes())
