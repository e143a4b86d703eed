// smol-cpu-variant.h - what the two per-variant sources share:
// smol-cpu-kernels.c++ (conversions, activations, vector primitives,
// attention, the kernel table) and smol-cpu-matmul.c++ (the matmuls). Both
// are compiled once per instruction set with SMOL_CPU_VARIANT = generic, avx2
// or avx512, and include this header for the inline f16/bf16 conversions, the
// integer and size helpers, the token chunk, the AVX2 horizontal sums and
// exp, and the declaration of the matmul that one file defines and the
// other's kernel table holds. A header rather than a third source so that
// these small helpers stay inlined where they are used.
//
// Internal to those two sources. Everything defined here is static inline
// and in the namespace smol::cpu::<variant>: internal linkage, so the linker
// never merges a copy built for one instruction set with another's (see
// smol-cpu-kernels.c++). The declared matmul has external linkage, which
// is safe because each variant's names are in its own namespace.

#ifndef SMOL_CPU_VARIANT_H
#define SMOL_CPU_VARIANT_H

#include "smol-cpu-kernels.h"

#include <stdint.h>
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#ifndef SMOL_CPU_VARIANT
#define SMOL_CPU_VARIANT generic
#endif

namespace smol::cpu::SMOL_CPU_VARIANT {

// --- scalar conversions -------------------------------------------------------

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// Portable f16 -> f32; exact for every input, NaN payloads kept.
[[maybe_unused]] static inline float h2f_soft(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t e = (h >> 10) & 0x1f;
    const uint32_t m = h & 0x3ff;
    if (e == 0x1f) return f32_from_bits(sign | 0x7f800000 | (m << 13));
    if (e != 0) return f32_from_bits(sign | ((e + 112) << 23) | (m << 13));
    // Subnormal (or zero): m * 2^-24 is exact in f32.
    const float f = (float)m * 0x1p-24f;
    return sign ? -f : f;
}

// Portable f32 -> f16, round to nearest even. NaN becomes a quiet NaN with
// the top payload bits, as F16C's vcvtps2ph does, so every variant agrees.
[[maybe_unused]] static inline uint16_t f2h_soft(float f) {
    const uint32_t x = f32_bits(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t a = x & 0x7fffffff;
    if (a > 0x7f800000) return sign | 0x7e00 | (uint16_t)((a >> 13) & 0x3ff);
    if (a >= 0x477ff000) return sign | 0x7c00; // 65520 and up round to inf
    if (a >= 0x38800000) {                     // a normal f16
        const uint32_t r = a + 0xfff + ((a >> 13) & 1);
        return sign | (uint16_t)((r - 0x38000000) >> 13);
    }
    // An f16 subnormal: round(value * 2^24), value = mant * 2^(e - 150).
    const uint32_t e = a >> 23;
    if (e < 102) return sign; // below 2^-25: rounds to zero
    const uint32_t mant = (a & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - e; // 14..24
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return sign | (uint16_t)q;
}

static inline float bf2f(uint16_t h) {
    return f32_from_bits((uint32_t)h << 16);
}

static inline uint16_t f2bf(float f) {
    const uint32_t x = f32_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); // quiet NaN
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

#if defined(__F16C__)
static inline float h2f(uint16_t h) {
    return _cvtsh_ss(h);
}
static inline uint16_t f2h(float f) {
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
#elif defined(__aarch64__)
// ARMv8.0's fcvt, exact both ways and rounding to nearest even; a NaN keeps
// its sign and top payload bits and comes out quiet, as f2h_soft's does.
static inline float h2f(uint16_t h) {
    __fp16 v;
    memcpy(&v, &h, 2);
    return (float)v;
}
static inline uint16_t f2h(float f) {
    const __fp16 v = (__fp16)f;
    uint16_t h;
    memcpy(&h, &v, 2);
    return h;
}
#else
static inline float h2f(uint16_t h) {
    return h2f_soft(h);
}
static inline uint16_t f2h(float f) {
    return f2h_soft(f);
}
#endif

[[maybe_unused]] static inline uint16_t load_u16(const void * p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

// Round half to even for |x| < 2^22 without a libm call; every variant uses
// the same rule so their activations are bit-identical.
[[maybe_unused]] static inline int round_even(float x) {
    const float magic = 12582912.0f; // 1.5 * 2^23
    return (int)((x + magic) - magic);
}

[[maybe_unused]] static inline int64_t min_i64(int64_t a, int64_t b) {
    return a < b ? a : b;
}
[[maybe_unused]] static inline int64_t max_i64(int64_t a, int64_t b) {
    return a > b ? a : b;
}

static inline size_t block_bytes(smol_type t) {
    switch (t) {
    case SMOL_TYPE_Q4_0:
        return sizeof(block_q4_0);
    case SMOL_TYPE_Q4_1:
        return sizeof(block_q4_1);
    case SMOL_TYPE_Q8_0:
        return sizeof(block_q8_0);
    case SMOL_TYPE_Q5_0:
        return sizeof(block_q5_0);
    case SMOL_TYPE_Q5_1:
        return sizeof(block_q5_1);
    default:
        return 0;
    }
}

// The executor's token chunk (see kernels::token_chunk), here because the
// kernel table holds it and the float matmul inlines it: f32 activations
// of the float kernels in whole tiles of 6 tokens, 512 KiB where the
// 512-bit kernel converts a block of rows once for all of them (a quarter
// of a recent server core's L2), 128 KiB for the others.
static inline int64_t token_chunk(smol_type t, int64_t K) {
    switch (t) {
    case SMOL_TYPE_F32:
    case SMOL_TYPE_BF16:
    case SMOL_TYPE_F16: {
#if defined(__AVX512F__) && defined(__AVX512DQ__)
        const int64_t bytes = 512 * 1024;
#else
        const int64_t bytes = 128 * 1024;
#endif
        const int64_t n = bytes / (K * (int64_t)sizeof(float)) / 6 * 6;
        return n < 6 ? 6 : n;
    }
    default:
        return INT64_MAX;
    }
}

// --- vector primitives: horizontal sums and exp -----------------------------------

#if defined(__AVX2__)
static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// The lane sums of a[0..7] in one vector (lane i: a[i]), each added in the
// order above, whichever vectors share the call.
static inline __m256 hsum8x8(const __m256 a[8]) {
    const __m256 ab = _mm256_hadd_ps(a[0], a[1]); // a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, ...
    const __m256 cd = _mm256_hadd_ps(a[2], a[3]);
    const __m256 ef = _mm256_hadd_ps(a[4], a[5]);
    const __m256 gh = _mm256_hadd_ps(a[6], a[7]);
    const __m256 abcd = _mm256_hadd_ps(ab, cd); // (a0+a1)+(a2+a3), ... | (a4+a5)+(a6+a7), ...
    const __m256 efgh = _mm256_hadd_ps(ef, gh);
    return _mm256_add_ps(_mm256_permute2f128_ps(abcd, efgh, 0x20),
                         _mm256_permute2f128_ps(abcd, efgh, 0x31));
}

// The lane sums of N accumulators, each in hsum8x8's order, into sums[0, N)
// (a multiple of 8 floats long, 32-byte aligned).
template <int N> static inline void hsum_lanes(const __m256 acc[N], float * sums) {
#pragma GCC unroll 8
    for (int g = 0; g < N; g += 8) {
        __m256 v[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) v[i] = g + i < N ? acc[g + i] : _mm256_setzero_ps();
        _mm256_store_ps(sums + g, hsum8x8(v));
    }
}

// e^x for x in float range: 2^n * e^r with n = round(x / ln 2) and a degree-7
// polynomial (Cephes' expf) for e^r; relative error about 2e-7. Inputs below
// ln(2^-126) give 0, which is what softmax wants for -inf.
static inline __m256 exp256(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654475f);
    const __m256 hi = _mm256_set1_ps(88.0f);
    const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(underflow, p);
}
#endif

// --- defined in smol-cpu-matmul.c++, entered in the kernel table ------------

// kernels::matmul of this variant.
void matmul(smol_type t, const void * w, size_t w_row_bytes, int64_t K, int64_t r0, int64_t r1,
            const void * act, size_t act_row_bytes, int64_t n_tok, float * y, int64_t ldy);

// --- defined in smol-cpu-dots.c++ ---------------------------------------------------

// Whether matmul hands type t to matmul_dots: iq4_nl and the 256-element
// types, and q5_0 and q5_1 where there is no AVX2 (with it they take the
// q4 kernels of smol-cpu-matmul.c++).
static inline bool dots_type(smol_type t) {
    switch (t) {
#if !defined(__AVX2__)
    case SMOL_TYPE_Q5_0:
    case SMOL_TYPE_Q5_1:
#endif
    case SMOL_TYPE_IQ4_NL:
    case SMOL_TYPE_Q2_K:
    case SMOL_TYPE_Q3_K:
    case SMOL_TYPE_Q4_K:
    case SMOL_TYPE_Q5_K:
    case SMOL_TYPE_Q6_K:
    case SMOL_TYPE_IQ4_XS:
        return true;
    default:
        return false;
    }
}
// The matmul of those types, with matmul's arguments.
void matmul_dots(smol_type t, const void * w, size_t w_row_bytes, int64_t K, int64_t r0, int64_t r1,
                 const void * act, size_t act_row_bytes, int64_t n_tok, float * y, int64_t ldy);

} // namespace smol::cpu::SMOL_CPU_VARIANT

#endif // SMOL_CPU_VARIANT_H
