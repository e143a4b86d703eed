// test-seed.h - the seed of a test's random inputs: fresh every run, the one
// SMOL_TEST_SEED names when set, so a failure printed with its seed replays.

#ifndef SMOL_TESTS_TEST_SEED_H
#define SMOL_TESTS_TEST_SEED_H

#include <cstdint>
#include <cstdlib>
#include <doctest/doctest.h>
#include <random>

namespace test {

// SMOL_TEST_SEED when set (to replay a failure), else a fresh seed. Prefer
// SMOL_TEST_DRAW_SEED, which also prints the seed with any failing check.
inline uint32_t fresh_seed() {
    if (const char * s = std::getenv("SMOL_TEST_SEED"))
        return uint32_t(std::strtoull(s, nullptr, 0));
    return std::random_device{}();
}

// The i-th further seed of a case that needs several: a function of the one
// drawn seed (splitmix64), so replaying that seed reproduces them all.
inline uint32_t derived_seed(uint32_t seed, uint32_t i) {
    uint64_t z = (uint64_t(seed) << 32 | i) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return uint32_t(z ^ (z >> 31));
}

} // namespace test

// Declares `const uint32_t name`, drawn by test::fresh_seed(), and has doctest
// print it, with how to replay it, beside every failing check in its scope.
#define SMOL_TEST_DRAW_SEED(name)                                                                  \
    const uint32_t name = ::test::fresh_seed();                                                    \
    INFO("seed ", name, " (SMOL_TEST_SEED=", name, " replays it)")

#endif // SMOL_TESTS_TEST_SEED_H
