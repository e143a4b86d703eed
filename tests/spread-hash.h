// spread-hash.h - an order-aware hash of a byte string that numpy computes as
// readily as C++ (scripts/check-quants.py, scripts/make-fixtures.py), so a
// test can hold smol's bytes or values to a fixture's without the data.

#ifndef SMOL_TESTS_SPREAD_HASH_H
#define SMOL_TESTS_SPREAD_HASH_H

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace test {

// The sum, modulo 2^64, of splitmix64(word | index << 32) over the
// little-endian 32-bit words of data[0, n) (the last one zero-padded).
inline uint64_t spread_hash_bytes(const void * data, size_t n) {
    const auto * p = static_cast<const uint8_t *>(data);
    uint64_t total = 0;
    for (size_t i = 0; 4 * i < n; i++) {
        uint32_t word = 0;
        for (size_t k = 0; k < 4 && 4 * i + k < n; k++) word |= uint32_t(p[4 * i + k]) << (8 * k);
        uint64_t z = (uint64_t(word) | (uint64_t(i) << 32)) + 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        total += z ^ (z >> 31);
    }
    return total;
}

// The same over n floats' bits.
inline uint64_t spread_hash(const float * v, size_t n) {
    return spread_hash_bytes(v, n * sizeof(float));
}

} // namespace test

#endif // SMOL_TESTS_SPREAD_HASH_H
