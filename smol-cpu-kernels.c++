// smol-cpu-kernels.c++ - the CPU kernels declared in smol-cpu-kernels.h.
//
// This one source is compiled once per instruction set, with
// SMOL_CPU_VARIANT = generic, avx2 or avx512; each copy lives in the
// namespace smol::cpu::<variant> and exposes kernels_<variant>(). The scalar
// conversions, the size helpers and the run-time choice of a variant exist
// once, in the generic copy.
//
// The variant copies stay C-like (intrinsics, plain loops, functions of their
// own namespace): a std:: template or inline function instantiated here and
// in another translation unit would be merged by the linker into whichever
// copy it keeps, which could be one built for AVX-512. For the same reason
// the math calls are the C ones (expf, fabsf), never std::exp.

#include "smol-cpu-kernels.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#ifndef SMOL_CPU_VARIANT
#define SMOL_CPU_VARIANT generic
#endif

#define SMOL_CPU_JOIN2(a, b) a##_##b
#define SMOL_CPU_JOIN(a, b)  SMOL_CPU_JOIN2(a, b)
#define SMOL_CPU_STR2(a)     #a
#define SMOL_CPU_STR(a)      SMOL_CPU_STR2(a)
// SMOL_CPU_SHARED is 1 in the generic copy only: the things that must exist
// once are compiled there.
#define SMOL_CPU_IS_generic 1
#define SMOL_CPU_SHARED     SMOL_CPU_JOIN(SMOL_CPU_IS, SMOL_CPU_VARIANT)

#if SMOL_CPU_SHARED
#include <stdio.h>
#include <stdlib.h>
#endif

namespace smol::cpu {

const kernels & kernels_generic();
const kernels & kernels_avx2();
const kernels & kernels_avx512();

namespace SMOL_CPU_VARIANT {

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
static inline float h2f_soft(uint16_t h) {
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
static inline uint16_t f2h_soft(float f) {
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

static inline float bf2f(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

static inline uint16_t f2bf(float f) {
    const uint32_t x = f32_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); // quiet NaN
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

#if defined(__F16C__)
static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t f2h(float f) { return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
#else
static inline float h2f(uint16_t h) { return h2f_soft(h); }
static inline uint16_t f2h(float f) { return f2h_soft(f); }
#endif

static inline uint16_t load_u16(const void * p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

// Round half to even for |x| < 2^22 without a libm call; every variant uses
// the same rule so their activations are bit-identical.
static inline int round_even(float x) {
    const float magic = 12582912.0f; // 1.5 * 2^23
    return (int)((x + magic) - magic);
}

static inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }

static inline size_t block_bytes(smol_type t) {
    switch (t) {
    case SMOL_TYPE_Q4_0: return sizeof(block_q4_0);
    case SMOL_TYPE_Q4_1: return sizeof(block_q4_1);
    case SMOL_TYPE_Q8_0: return sizeof(block_q8_0);
    default: return 0;
    }
}

// --- row conversions ------------------------------------------------------------

static void dequant_q4_0(const block_q4_0 * b, int64_t nb, float * y) {
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = h2f(b[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((b[i].qs[j] & 0x0f) - 8) * d;
            y[j + 16] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void dequant_q4_1(const block_q4_1 * b, int64_t nb, float * y) {
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = h2f(b[i].d);
        const float m = h2f(b[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(b[i].qs[j] & 0x0f) * d + m;
            y[j + 16] = (float)(b[i].qs[j] >> 4) * d + m;
        }
    }
}

static void dequant_q8_0(const block_q8_0 * b, int64_t nb, float * y) {
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = h2f(b[i].d);
        for (int j = 0; j < QK; j++) y[j] = (float)b[i].qs[j] * d;
    }
}

static void f16_to_f32_row(const uint16_t * x, float * y, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
#endif
    for (; i < n; i++) y[i] = h2f(x[i]);
}

static void f32_to_f16_row(const float * x, uint16_t * y, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) y[i] = f2h(x[i]);
}

static void bf16_to_f32_row(const uint16_t * x, float * y, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__)
    for (; i + 8 <= n; i += 8) {
        const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_si256((__m256i *)(y + i), _mm256_slli_epi32(v, 16));
    }
#endif
    for (; i < n; i++) y[i] = bf2f(x[i]);
}

static void f32_to_bf16_row(const float * x, uint16_t * y, int64_t n) {
    // Integer rounding rather than vcvtneps2bf16: that instruction treats
    // denormal inputs as zero, and every variant must write the same bits.
    for (int64_t i = 0; i < n; i++) y[i] = f2bf(x[i]);
}

// ggml's reference quantizers (quantize_row_q*_ref), so that the files smol
// writes are the files llama.cpp would write.
static void quant_q8_0(const float * x, block_q8_0 * y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        for (int j = 0; j < QK; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

static void quant_q4_0(const float * x, block_q4_0 * y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK) {
        float amax = 0.0f, max = 0.0f; // max: the value of largest magnitude
        for (int j = 0; j < QK; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        for (int j = 0; j < 16; j++) {
            const float x0 = x[j] * id;
            const float x1 = x[j + 16] * id;
            int q0 = (int8_t)(x0 + 8.5f);
            int q1 = (int8_t)(x1 + 8.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void quant_q4_1(const float * x, block_q4_1 * y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK) {
        float min = 3.402823466e38f, max = -3.402823466e38f;
        for (int j = 0; j < QK; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        y[i].m = f2h(min);
        for (int j = 0; j < 16; j++) {
            const float x0 = (x[j] - min) * id;
            const float x1 = (x[j + 16] - min) * id;
            int q0 = (int8_t)(x0 + 0.5f);
            int q1 = (int8_t)(x1 + 0.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static void row_to_f32(smol_type t, const void * src, float * dst, int64_t n) {
    switch (t) {
    case SMOL_TYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case SMOL_TYPE_F16: f16_to_f32_row((const uint16_t *)src, dst, n); break;
    case SMOL_TYPE_BF16: bf16_to_f32_row((const uint16_t *)src, dst, n); break;
    case SMOL_TYPE_Q4_0: dequant_q4_0((const block_q4_0 *)src, n / QK, dst); break;
    case SMOL_TYPE_Q4_1: dequant_q4_1((const block_q4_1 *)src, n / QK, dst); break;
    case SMOL_TYPE_Q8_0: dequant_q8_0((const block_q8_0 *)src, n / QK, dst); break;
    }
}

static void row_from_f32(smol_type t, const float * src, void * dst, int64_t n) {
    switch (t) {
    case SMOL_TYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case SMOL_TYPE_F16: f32_to_f16_row(src, (uint16_t *)dst, n); break;
    case SMOL_TYPE_BF16: f32_to_bf16_row(src, (uint16_t *)dst, n); break;
    case SMOL_TYPE_Q4_0: quant_q4_0(src, (block_q4_0 *)dst, n / QK); break;
    case SMOL_TYPE_Q4_1: quant_q4_1(src, (block_q4_1 *)dst, n / QK); break;
    case SMOL_TYPE_Q8_0: quant_q8_0(src, (block_q8_0 *)dst, n / QK); break;
    }
}

// --- activations ------------------------------------------------------------------

// d = max|x| / 127, qs = round_even(x / d) computed as x * (1 / d), and
// s = d * sum(qs). The SIMD path performs the same operations in the same
// order, so every variant produces the same bytes.
static void quant_act(const float * x, block_q8_act * y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK) {
#if defined(__AVX2__)
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 v0 = _mm256_loadu_ps(x);
        __m256 v1 = _mm256_loadu_ps(x + 8);
        __m256 v2 = _mm256_loadu_ps(x + 16);
        __m256 v3 = _mm256_loadu_ps(x + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        const int rn = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, vid), rn));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, vid), rn));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, vid), rn));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, vid), rn));
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        const int sum = _mm_cvtsi128_si32(s4);
        // packs interleave 128-bit lanes; the permute restores element order.
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)y[i].qs, p);
#else
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            const int q = round_even(x[j] * id);
            y[i].qs[j] = (int8_t)q;
            sum += q;
        }
#endif
        y[i].d = d;
        y[i].s = d * (float)sum;
    }
}

static void act_from_f32(smol_type t, const float * x, void * act, int64_t K) {
    switch (t) {
    case SMOL_TYPE_F32:
    case SMOL_TYPE_BF16: memcpy(act, x, (size_t)K * sizeof(float)); break;
    case SMOL_TYPE_F16: f32_to_f16_row(x, (uint16_t *)act, K); break;
    case SMOL_TYPE_Q4_0:
    case SMOL_TYPE_Q4_1:
    case SMOL_TYPE_Q8_0: quant_act(x, (block_q8_act *)act, K / QK); break;
    }
}

// --- vector primitives --------------------------------------------------------------

#if defined(__AVX2__)
static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
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
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(underflow, p);
}
#endif

static float dot_f16_f32(const uint16_t * a, const float * b, int64_t n) {
    int64_t i = 0;
    float sum = 0.0f;
#if defined(__AVX2__)
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i))),
                             _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i + 8))),
                             _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i))),
                             _mm256_loadu_ps(b + i), s0);
    sum = hsum256(_mm256_add_ps(s0, s1));
#endif
    for (; i < n; i++) sum += h2f(a[i]) * b[i];
    return sum;
}

static void axpy_f16(float a, const uint16_t * x, float * y, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__)
    const __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8) {
        const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, xv, _mm256_loadu_ps(y + i)));
    }
#endif
    for (; i < n; i++) y[i] += a * h2f(x[i]);
}

static void f32_to_f16(const float * x, uint16_t * y, int64_t n) { f32_to_f16_row(x, y, n); }

static float dot_f32(const float * a, const float * b, int64_t n) {
    int64_t i = 0;
    float sum = 0.0f;
#if defined(__AVX2__)
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    __m256 s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    sum = hsum256(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
#endif
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

static float sum_sq(const float * x, int64_t n) { return dot_f32(x, x, n); }

static void scale(float * y, const float * x, float s, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__)
    const __m256 vs = _mm256_set1_ps(s);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(vs, _mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++) y[i] = s * x[i];
}

static void mul(float * y, const float * a, const float * b, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
#endif
    for (; i < n; i++) y[i] = a[i] * b[i];
}

static void add(float * y, const float * a, const float * b, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
#endif
    for (; i < n; i++) y[i] = a[i] + b[i];
}

static void swiglu(float * y, const float * g, const float * u, int64_t n) {
    int64_t i = 0;
#if defined(__AVX2__)
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 neg = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 e = exp256(_mm256_xor_ps(gv, neg));
        const __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static float softmax_exp(float * y, const float * x, float max, int64_t n) {
    int64_t i = 0;
    float sum = 0.0f;
#if defined(__AVX2__)
    const __m256 vmax = _mm256_set1_ps(max);
    __m256 s = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax));
        _mm256_storeu_ps(y + i, e);
        s = _mm256_add_ps(s, e);
    }
    sum = hsum256(s);
#endif
    for (; i < n; i++) {
        y[i] = expf(x[i] - max);
        sum += y[i];
    }
    return sum;
}

// --- matmul: the portable path ----------------------------------------------------
//
// Every variant computes a quantized dot product the same way: per block of
// 32 an exact integer dot product of the weight codes with the activation
// codes, then in float  d_w * d_a * isum + off_w * s_a,  where off_w is
// -8 * d_w for q4_0 (codes are stored with a +8 bias), m for q4_1 and 0 for
// q8_0. Only the order of the float additions differs between variants.

static float dot_q_scalar(smol_type t, const uint8_t * w, const block_q8_act * a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int isum = 0;
        float dw, off;
        if (t == SMOL_TYPE_Q8_0) {
            const block_q8_0 * blk = (const block_q8_0 *)w + b;
            for (int j = 0; j < QK; j++) isum += blk->qs[j] * a[b].qs[j];
            dw = h2f(blk->d);
            off = 0.0f;
        } else {
            const uint8_t * qs;
            if (t == SMOL_TYPE_Q4_0) {
                const block_q4_0 * blk = (const block_q4_0 *)w + b;
                qs = blk->qs;
                dw = h2f(blk->d);
                off = -8.0f * dw;
            } else {
                const block_q4_1 * blk = (const block_q4_1 *)w + b;
                qs = blk->qs;
                dw = h2f(blk->d);
                off = h2f(blk->m);
            }
            for (int j = 0; j < 16; j++)
                isum += (qs[j] & 0x0f) * a[b].qs[j] + (qs[j] >> 4) * a[b].qs[j + 16];
        }
        sum += (float)isum * (dw * a[b].d) + off * a[b].s;
    }
    return sum;
}

static void matmul_scalar(smol_type t, const void * w, size_t w_row_bytes, int64_t K, int64_t r0,
                          int64_t r1, const void * act, size_t act_row_bytes, int64_t n_tok,
                          float * y, int64_t ldy) {
    const uint8_t * wb = (const uint8_t *)w;
    const uint8_t * ab = (const uint8_t *)act;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t * wr = wb + (size_t)r * w_row_bytes;
        for (int64_t i = 0; i < n_tok; i++) {
            const uint8_t * ai = ab + (size_t)i * act_row_bytes;
            float sum = 0.0f;
            switch (t) {
            case SMOL_TYPE_F32: {
                const float * x = (const float *)ai;
                const float * v = (const float *)wr;
                for (int64_t k = 0; k < K; k++) sum += v[k] * x[k];
                break;
            }
            case SMOL_TYPE_BF16: {
                const float * x = (const float *)ai;
                const uint16_t * v = (const uint16_t *)wr;
                for (int64_t k = 0; k < K; k++) sum += bf2f(v[k]) * x[k];
                break;
            }
            case SMOL_TYPE_F16: {
                const uint16_t * x = (const uint16_t *)ai;
                const uint16_t * v = (const uint16_t *)wr;
                for (int64_t k = 0; k < K; k++) sum += h2f(v[k]) * h2f(x[k]);
                break;
            }
            default: sum = dot_q_scalar(t, wr, (const block_q8_act *)ai, K / QK); break;
            }
            y[i * ldy + r] = sum;
        }
    }
}

#if defined(__AVX2__)

// --- matmul: AVX2 (and AVX-512) -----------------------------------------------------
//
// Prefill: weights are unpacked once into a small row panel on the stack (4
// rows of int8 codes for the quantized types, 3 rows of f32 for the float
// types) and the panel is swept over every token of an L2-sized token chunk
// with a register tile (4 rows x 2 tokens, or 3 rows x 4 tokens). Decode
// (one token): the weights are streamed once, 8 rows at a time.
//
// For the quantized types, the eight (row, token) dot products of a tile
// are reduced together: per block, maddubs gives each pair's 16 products
// sums, a tree of horizontal adds folds the eight pairs into one vector of
// eight int32, and the block's scales are applied to all eight lanes with
// one multiply and one FMA, instead of per pair.

// Aim the per-chunk activations at about half of a 512 KiB L2.
constexpr int64_t act_chunk_bytes = 192 * 1024;
// Blocks (of 32) per panel: K chunks of up to 2048 elements.
constexpr int64_t q_panel_blocks = 64;
// Floats per f32 panel row: 3 rows of 1024 = 12 KiB, with room in L1 for
// the token tile's activations.
constexpr int64_t f_panel_elems = 1024;

static inline __m256i unpack_nibbles(const uint8_t * qs) {
    const __m128i x = _mm_loadu_si128((const __m128i *)qs);
    const __m256i v = _mm256_insertf128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

// Eight vectors of 16 int16 (|value| <= 3810, so sums of four still fit) ->
// one vector of the eight int32 totals, in order.
static inline __m256i reduce8_i16(__m256i v0, __m256i v1, __m256i v2, __m256i v3, __m256i v4,
                                  __m256i v5, __m256i v6, __m256i v7) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i g0 = _mm256_hadd_epi16(_mm256_hadd_epi16(v0, v1), _mm256_hadd_epi16(v2, v3));
    const __m256i g1 = _mm256_hadd_epi16(_mm256_hadd_epi16(v4, v5), _mm256_hadd_epi16(v6, v7));
    // Per 128-bit half: the partial sums of pairs 0..3 (m0) and 4..7 (m1).
    const __m256i m0 = _mm256_madd_epi16(g0, ones);
    const __m256i m1 = _mm256_madd_epi16(g1, ones);
    return _mm256_add_epi32(_mm256_blend_epi32(m0, m1, 0xf0), _mm256_permute2x128_si256(m0, m1, 0x21));
}

// The same for eight vectors of 8 int32.
static inline __m256i reduce8_i32(__m256i v0, __m256i v1, __m256i v2, __m256i v3, __m256i v4,
                                  __m256i v5, __m256i v6, __m256i v7) {
    const __m256i m0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    const __m256i m1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v4, v5), _mm256_hadd_epi32(v6, v7));
    return _mm256_add_epi32(_mm256_blend_epi32(m0, m1, 0xf0), _mm256_permute2x128_si256(m0, m1, 0x21));
}

// The int32 dot product of one q8_0 block with activation codes: maddubs
// wants one unsigned operand, so the weight's sign moves to the activation.
static inline __m256i dot_q8_block(__m256i w_abs, __m256i w, __m256i a) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w_abs, _mm256_sign_epi8(a, w));
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(a, w)), _mm256_set1_epi16(1));
#endif
}

// A panel of 4 weight rows over up to q_panel_blocks blocks: codes as bytes
// (q4: 0..15; q8: |w| in q and w in s), scales as floats.
struct q_panel {
    alignas(32) uint8_t q[q_panel_blocks][4][32];
    alignas(32) int8_t s[q_panel_blocks][4][32];
    alignas(16) float d[q_panel_blocks][4];
    alignas(16) float off[q_panel_blocks][4];
};

static void q_panel_fill(smol_type t, q_panel * p, const uint8_t * const rows[4], int64_t kb0,
                         int64_t nbk) {
    const size_t bs = block_bytes(t);
    for (int i = 0; i < 4; i++) {
        const uint8_t * src = rows[i] + (size_t)kb0 * bs;
        for (int64_t b = 0; b < nbk; b++, src += bs) {
            const float d = h2f(load_u16(src));
            p->d[b][i] = d;
            if (t == SMOL_TYPE_Q8_0) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(src + 2));
                _mm256_store_si256((__m256i *)p->q[b][i], _mm256_sign_epi8(w, w));
                _mm256_store_si256((__m256i *)p->s[b][i], w);
                p->off[b][i] = 0.0f;
            } else if (t == SMOL_TYPE_Q4_0) {
                _mm256_store_si256((__m256i *)p->q[b][i], unpack_nibbles(src + 2));
                p->off[b][i] = -8.0f * d;
            } else {
                _mm256_store_si256((__m256i *)p->q[b][i], unpack_nibbles(src + 4));
                p->off[b][i] = h2f(load_u16(src + 2));
            }
        }
    }
}

static inline __m256 pair_scalars(const float * t0, const float * t1) {
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_broadcast_ss(t0)), _mm_broadcast_ss(t1), 1);
}

// 4 rows x 2 tokens over nbk blocks of the panel. out[t * 4 + i] is row i,
// token t.
static void q_tile_4x2(smol_type t, const q_panel * p, int64_t nbk, const block_q8_act * a0,
                       const block_q8_act * a1, float * out) {
    __m256 acc = _mm256_setzero_ps();
    __m256 acc_off = _mm256_setzero_ps();
    if (t == SMOL_TYPE_Q8_0) {
        for (int64_t b = 0; b < nbk; b++) {
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)a0[b].qs);
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)a1[b].qs);
            const __m256i q0 = _mm256_load_si256((const __m256i *)p->q[b][0]);
            const __m256i q1 = _mm256_load_si256((const __m256i *)p->q[b][1]);
            const __m256i q2 = _mm256_load_si256((const __m256i *)p->q[b][2]);
            const __m256i q3 = _mm256_load_si256((const __m256i *)p->q[b][3]);
            const __m256i s0 = _mm256_load_si256((const __m256i *)p->s[b][0]);
            const __m256i s1 = _mm256_load_si256((const __m256i *)p->s[b][1]);
            const __m256i s2 = _mm256_load_si256((const __m256i *)p->s[b][2]);
            const __m256i s3 = _mm256_load_si256((const __m256i *)p->s[b][3]);
            const __m256i v = reduce8_i32(dot_q8_block(q0, s0, x0), dot_q8_block(q1, s1, x0),
                                          dot_q8_block(q2, s2, x0), dot_q8_block(q3, s3, x0),
                                          dot_q8_block(q0, s0, x1), dot_q8_block(q1, s1, x1),
                                          dot_q8_block(q2, s2, x1), dot_q8_block(q3, s3, x1));
            const __m256 dw = _mm256_broadcast_ps((const __m128 *)p->d[b]);
            const __m256 da = pair_scalars(&a0[b].d, &a1[b].d);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(dw, da), acc);
        }
    } else {
        for (int64_t b = 0; b < nbk; b++) {
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)a0[b].qs);
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)a1[b].qs);
            const __m256i q0 = _mm256_load_si256((const __m256i *)p->q[b][0]);
            const __m256i q1 = _mm256_load_si256((const __m256i *)p->q[b][1]);
            const __m256i q2 = _mm256_load_si256((const __m256i *)p->q[b][2]);
            const __m256i q3 = _mm256_load_si256((const __m256i *)p->q[b][3]);
            const __m256i v = reduce8_i16(
                _mm256_maddubs_epi16(q0, x0), _mm256_maddubs_epi16(q1, x0), _mm256_maddubs_epi16(q2, x0),
                _mm256_maddubs_epi16(q3, x0), _mm256_maddubs_epi16(q0, x1), _mm256_maddubs_epi16(q1, x1),
                _mm256_maddubs_epi16(q2, x1), _mm256_maddubs_epi16(q3, x1));
            const __m256 dw = _mm256_broadcast_ps((const __m128 *)p->d[b]);
            const __m256 da = pair_scalars(&a0[b].d, &a1[b].d);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(dw, da), acc);
            const __m256 ow = _mm256_broadcast_ps((const __m128 *)p->off[b]);
            acc_off = _mm256_fmadd_ps(ow, pair_scalars(&a0[b].s, &a1[b].s), acc_off);
        }
    }
    _mm256_storeu_ps(out, _mm256_add_ps(acc, acc_off));
}

// Decode: 8 rows x 1 token, streaming the weights.
static void q_gemv_8(smol_type t, const uint8_t * const rows[8], const block_q8_act * a, int64_t nb,
                     float * out) {
    const size_t bs = block_bytes(t);
    __m256 acc = _mm256_setzero_ps();
    __m256 acc_off = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const size_t o = (size_t)b * bs;
        const __m256i x = _mm256_loadu_si256((const __m256i *)a[b].qs);
        const __m128i dh = _mm_setr_epi16(
            (short)load_u16(rows[0] + o), (short)load_u16(rows[1] + o), (short)load_u16(rows[2] + o),
            (short)load_u16(rows[3] + o), (short)load_u16(rows[4] + o), (short)load_u16(rows[5] + o),
            (short)load_u16(rows[6] + o), (short)load_u16(rows[7] + o));
        const __m256 dw = _mm256_cvtph_ps(dh);
        __m256i v;
        if (t == SMOL_TYPE_Q8_0) {
            __m256i w[8];
            for (int i = 0; i < 8; i++) w[i] = _mm256_loadu_si256((const __m256i *)(rows[i] + o + 2));
            v = reduce8_i32(dot_q8_block(_mm256_sign_epi8(w[0], w[0]), w[0], x),
                            dot_q8_block(_mm256_sign_epi8(w[1], w[1]), w[1], x),
                            dot_q8_block(_mm256_sign_epi8(w[2], w[2]), w[2], x),
                            dot_q8_block(_mm256_sign_epi8(w[3], w[3]), w[3], x),
                            dot_q8_block(_mm256_sign_epi8(w[4], w[4]), w[4], x),
                            dot_q8_block(_mm256_sign_epi8(w[5], w[5]), w[5], x),
                            dot_q8_block(_mm256_sign_epi8(w[6], w[6]), w[6], x),
                            dot_q8_block(_mm256_sign_epi8(w[7], w[7]), w[7], x));
        } else {
            const size_t qo = o + (t == SMOL_TYPE_Q4_0 ? 2 : 4);
            v = reduce8_i16(_mm256_maddubs_epi16(unpack_nibbles(rows[0] + qo), x),
                            _mm256_maddubs_epi16(unpack_nibbles(rows[1] + qo), x),
                            _mm256_maddubs_epi16(unpack_nibbles(rows[2] + qo), x),
                            _mm256_maddubs_epi16(unpack_nibbles(rows[3] + qo), x),
                            _mm256_maddubs_epi16(unpack_nibbles(rows[4] + qo), x),
                            _mm256_maddubs_epi16(unpack_nibbles(rows[5] + qo), x),
                            _mm256_maddubs_epi16(unpack_nibbles(rows[6] + qo), x),
                            _mm256_maddubs_epi16(unpack_nibbles(rows[7] + qo), x));
            __m256 ow;
            if (t == SMOL_TYPE_Q4_0) {
                ow = _mm256_mul_ps(dw, _mm256_set1_ps(-8.0f));
            } else {
                const __m128i mh = _mm_setr_epi16(
                    (short)load_u16(rows[0] + o + 2), (short)load_u16(rows[1] + o + 2),
                    (short)load_u16(rows[2] + o + 2), (short)load_u16(rows[3] + o + 2),
                    (short)load_u16(rows[4] + o + 2), (short)load_u16(rows[5] + o + 2),
                    (short)load_u16(rows[6] + o + 2), (short)load_u16(rows[7] + o + 2));
                ow = _mm256_cvtph_ps(mh);
            }
            acc_off = _mm256_fmadd_ps(ow, _mm256_set1_ps(a[b].s), acc_off);
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(dw, _mm256_set1_ps(a[b].d)), acc);
    }
    _mm256_storeu_ps(out, _mm256_add_ps(acc, acc_off));
}

static void matmul_q(smol_type t, const void * w, size_t w_row_bytes, int64_t K, int64_t r0, int64_t r1,
                     const void * act, size_t act_row_bytes, int64_t n_tok, float * y, int64_t ldy) {
    const uint8_t * wb = (const uint8_t *)w;
    const uint8_t * ab = (const uint8_t *)act;
    const int64_t nb = K / QK;
    if (n_tok == 1) {
        const block_q8_act * a = (const block_q8_act *)ab;
        for (int64_t r = r0; r < r1; r += 8) {
            // Rows past r1 repeat the last row, so the tile never reads past
            // the matrix; their results are dropped.
            const uint8_t * rows[8];
            for (int i = 0; i < 8; i++) rows[i] = wb + (size_t)min_i64(r + i, r1 - 1) * w_row_bytes;
            float out[8];
            q_gemv_8(t, rows, a, nb, out);
            const int64_t n = min_i64(8, r1 - r);
            for (int64_t i = 0; i < n; i++) y[r + i] = out[i];
        }
        return;
    }
    q_panel panel;
    const int64_t n_kc = (nb + q_panel_blocks - 1) / q_panel_blocks;
    const int64_t kc = (nb + n_kc - 1) / n_kc;
    int64_t tc = act_chunk_bytes / (kc * (int64_t)sizeof(block_q8_act));
    tc = max_i64(2, tc & ~(int64_t)1);
    for (int64_t t0 = 0; t0 < n_tok; t0 += tc) {
        const int64_t t1 = min_i64(n_tok, t0 + tc);
        for (int64_t kb0 = 0; kb0 < nb; kb0 += kc) {
            const int64_t nbk = min_i64(kc, nb - kb0);
            for (int64_t r = r0; r < r1; r += 4) {
                const uint8_t * rows[4];
                for (int i = 0; i < 4; i++) rows[i] = wb + (size_t)min_i64(r + i, r1 - 1) * w_row_bytes;
                q_panel_fill(t, &panel, rows, kb0, nbk);
                const int64_t nr = min_i64(4, r1 - r);
                for (int64_t i = t0; i < t1; i += 2) {
                    const int64_t nt = min_i64(2, t1 - i);
                    const block_q8_act * a0 = (const block_q8_act *)(ab + (size_t)i * act_row_bytes) + kb0;
                    const block_q8_act * a1 =
                        (const block_q8_act *)(ab + (size_t)(i + nt - 1) * act_row_bytes) + kb0;
                    float out[8];
                    q_tile_4x2(t, &panel, nbk, a0, a1, out);
                    for (int64_t j = 0; j < nt; j++) {
                        float * yj = y + (i + j) * ldy + r;
                        if (kb0 == 0)
                            for (int64_t k = 0; k < nr; k++) yj[k] = out[j * 4 + k];
                        else
                            for (int64_t k = 0; k < nr; k++) yj[k] += out[j * 4 + k];
                    }
                }
            }
        }
    }
}

// Float weights. Activations are f32, or f16 for f16 weights.
static inline __m256 load8(const float * p) { return _mm256_loadu_ps(p); }
static inline __m256 load8(const uint16_t * p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

// Four vectors -> their four horizontal sums.
static inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

// 3 panel rows (stride ws floats) x 4 tokens over n elements (a multiple of
// 8). out[i * 4 + t] is row i, token t.
template <class X>
static void f_tile_3x4(const float * w, int64_t ws, const X * const x[4], int64_t n, float * out) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c03 = c00;
    __m256 c10 = c00, c11 = c00, c12 = c00, c13 = c00;
    __m256 c20 = c00, c21 = c00, c22 = c00, c23 = c00;
    const float * w0 = w;
    const float * w1 = w + ws;
    const float * w2 = w + 2 * ws;
    const X * x0 = x[0];
    const X * x1 = x[1];
    const X * x2 = x[2];
    const X * x3 = x[3];
    for (int64_t k = 0; k < n; k += 8) {
        const __m256 a0 = _mm256_loadu_ps(w0 + k);
        const __m256 a1 = _mm256_loadu_ps(w1 + k);
        const __m256 a2 = _mm256_loadu_ps(w2 + k);
        __m256 b = load8(x0 + k);
        c00 = _mm256_fmadd_ps(a0, b, c00);
        c10 = _mm256_fmadd_ps(a1, b, c10);
        c20 = _mm256_fmadd_ps(a2, b, c20);
        b = load8(x1 + k);
        c01 = _mm256_fmadd_ps(a0, b, c01);
        c11 = _mm256_fmadd_ps(a1, b, c11);
        c21 = _mm256_fmadd_ps(a2, b, c21);
        b = load8(x2 + k);
        c02 = _mm256_fmadd_ps(a0, b, c02);
        c12 = _mm256_fmadd_ps(a1, b, c12);
        c22 = _mm256_fmadd_ps(a2, b, c22);
        b = load8(x3 + k);
        c03 = _mm256_fmadd_ps(a0, b, c03);
        c13 = _mm256_fmadd_ps(a1, b, c13);
        c23 = _mm256_fmadd_ps(a2, b, c23);
    }
    _mm_storeu_ps(out + 0, hsum4(c00, c01, c02, c03));
    _mm_storeu_ps(out + 4, hsum4(c10, c11, c12, c13));
    _mm_storeu_ps(out + 8, hsum4(c20, c21, c22, c23));
}

static inline float to_f32(float v) { return v; }
static inline float to_f32(uint16_t v) { return h2f(v); }

// Weight row -> f32 panel row.
static void f_panel_row(smol_type t, const uint8_t * src, int64_t k0, int64_t n, float * dst) {
    if (t == SMOL_TYPE_F16)
        f16_to_f32_row((const uint16_t *)src + k0, dst, n);
    else if (t == SMOL_TYPE_BF16)
        bf16_to_f32_row((const uint16_t *)src + k0, dst, n);
    else
        memcpy(dst, (const float *)src + k0, (size_t)n * sizeof(float));
}

// Decode for float weights: 8 rows x 1 token, x already f32.
static void f_gemv_8(smol_type t, const uint8_t * const rows[8], int64_t k0, const float * x, int64_t n,
                     float * out) {
    __m256 c[8];
    for (int i = 0; i < 8; i++) c[i] = _mm256_setzero_ps();
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t k = 0; k < n8; k += 8) {
        const __m256 xv = _mm256_loadu_ps(x + k);
        for (int i = 0; i < 8; i++) {
            __m256 wv;
            if (t == SMOL_TYPE_F16) {
                wv = load8((const uint16_t *)rows[i] + k0 + k);
            } else if (t == SMOL_TYPE_BF16) {
                const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)rows[i] + k0 + k));
                wv = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
            } else {
                wv = _mm256_loadu_ps((const float *)rows[i] + k0 + k);
            }
            c[i] = _mm256_fmadd_ps(wv, xv, c[i]);
        }
    }
    __m128 lo = hsum4(c[0], c[1], c[2], c[3]);
    __m128 hi = hsum4(c[4], c[5], c[6], c[7]);
    _mm_storeu_ps(out, lo);
    _mm_storeu_ps(out + 4, hi);
    for (int64_t k = n8; k < n; k++) {
        for (int i = 0; i < 8; i++) {
            float wv;
            if (t == SMOL_TYPE_F16)
                wv = h2f(((const uint16_t *)rows[i])[k0 + k]);
            else if (t == SMOL_TYPE_BF16)
                wv = bf2f(((const uint16_t *)rows[i])[k0 + k]);
            else
                wv = ((const float *)rows[i])[k0 + k];
            out[i] += wv * x[k];
        }
    }
}

template <class X>
static void matmul_f_tiles(smol_type t, const uint8_t * wb, size_t w_row_bytes, int64_t K, int64_t r0,
                           int64_t r1, const uint8_t * ab, size_t act_row_bytes, int64_t n_tok, float * y,
                           int64_t ldy) {
    alignas(32) float panel[3 * f_panel_elems];
    const int64_t n_kc = (K + f_panel_elems - 1) / f_panel_elems;
    const int64_t kc = (((K + n_kc - 1) / n_kc) + 7) & ~(int64_t)7;
    int64_t tc = act_chunk_bytes / (kc * (int64_t)sizeof(X));
    tc = max_i64(4, tc & ~(int64_t)3);
    for (int64_t t0 = 0; t0 < n_tok; t0 += tc) {
        const int64_t t1 = min_i64(n_tok, t0 + tc);
        for (int64_t k0 = 0; k0 < K; k0 += kc) {
            const int64_t n = min_i64(kc, K - k0);
            const int64_t n8 = n & ~(int64_t)7;
            for (int64_t r = r0; r < r1; r += 3) {
                const int64_t nr = min_i64(3, r1 - r);
                const uint8_t * rows[3];
                for (int i = 0; i < 3; i++) rows[i] = wb + (size_t)min_i64(r + i, r1 - 1) * w_row_bytes;
                for (int i = 0; i < 3; i++) f_panel_row(t, rows[i], k0, n, panel + i * kc);
                for (int64_t i = t0; i < t1; i += 4) {
                    const int64_t nt = min_i64(4, t1 - i);
                    const X * x[4];
                    for (int j = 0; j < 4; j++)
                        x[j] = (const X *)(ab + (size_t)min_i64(i + j, t1 - 1) * act_row_bytes) + k0;
                    float out[12];
                    f_tile_3x4(panel, kc, x, n8, out);
                    for (int64_t k = n8; k < n; k++)
                        for (int ri = 0; ri < 3; ri++)
                            for (int j = 0; j < 4; j++) out[ri * 4 + j] += panel[ri * kc + k] * to_f32(x[j][k]);
                    for (int64_t j = 0; j < nt; j++) {
                        float * yj = y + (i + j) * ldy + r;
                        if (k0 == 0)
                            for (int64_t ri = 0; ri < nr; ri++) yj[ri] = out[ri * 4 + j];
                        else
                            for (int64_t ri = 0; ri < nr; ri++) yj[ri] += out[ri * 4 + j];
                    }
                }
            }
        }
    }
}

static void matmul_f(smol_type t, const void * w, size_t w_row_bytes, int64_t K, int64_t r0, int64_t r1,
                     const void * act, size_t act_row_bytes, int64_t n_tok, float * y, int64_t ldy) {
    const uint8_t * wb = (const uint8_t *)w;
    const uint8_t * ab = (const uint8_t *)act;
    if (n_tok == 1) {
        constexpr int64_t xc = 4096; // f16 activations are widened in chunks
        alignas(32) float xbuf[xc];
        for (int64_t k0 = 0; k0 < K; k0 += xc) {
            const int64_t n = min_i64(xc, K - k0);
            const float * x;
            if (t == SMOL_TYPE_F16) {
                f16_to_f32_row((const uint16_t *)ab + k0, xbuf, n);
                x = xbuf;
            } else {
                x = (const float *)ab + k0;
            }
            for (int64_t r = r0; r < r1; r += 8) {
                const uint8_t * rows[8];
                for (int i = 0; i < 8; i++) rows[i] = wb + (size_t)min_i64(r + i, r1 - 1) * w_row_bytes;
                float out[8];
                f_gemv_8(t, rows, k0, x, n, out);
                const int64_t nr = min_i64(8, r1 - r);
                for (int64_t i = 0; i < nr; i++) y[r + i] = k0 == 0 ? out[i] : y[r + i] + out[i];
            }
        }
        return;
    }
    if (t == SMOL_TYPE_F16)
        matmul_f_tiles<uint16_t>(t, wb, w_row_bytes, K, r0, r1, ab, act_row_bytes, n_tok, y, ldy);
    else
        matmul_f_tiles<float>(t, wb, w_row_bytes, K, r0, r1, ab, act_row_bytes, n_tok, y, ldy);
}

#endif // __AVX2__

static void matmul(smol_type t, const void * w, size_t w_row_bytes, int64_t K, int64_t r0, int64_t r1,
                   const void * act, size_t act_row_bytes, int64_t n_tok, float * y, int64_t ldy) {
    if (r1 <= r0 || n_tok <= 0) return;
#if defined(__AVX2__)
    switch (t) {
    case SMOL_TYPE_Q4_0:
    case SMOL_TYPE_Q4_1:
    case SMOL_TYPE_Q8_0:
        matmul_q(t, w, w_row_bytes, K, r0, r1, act, act_row_bytes, n_tok, y, ldy);
        return;
    case SMOL_TYPE_F32:
    case SMOL_TYPE_F16:
    case SMOL_TYPE_BF16:
        matmul_f(t, w, w_row_bytes, K, r0, r1, act, act_row_bytes, n_tok, y, ldy);
        return;
    }
#endif
    matmul_scalar(t, w, w_row_bytes, K, r0, r1, act, act_row_bytes, n_tok, y, ldy);
}

} // namespace SMOL_CPU_VARIANT

const kernels & SMOL_CPU_JOIN(kernels, SMOL_CPU_VARIANT)() {
    namespace v = SMOL_CPU_VARIANT;
    static const kernels k = {
        SMOL_CPU_STR(SMOL_CPU_VARIANT),
        v::row_to_f32,
        v::row_from_f32,
        v::act_from_f32,
        v::matmul,
        v::dot_f16_f32,
        v::axpy_f16,
        v::f32_to_f16,
        v::dot_f32,
        v::sum_sq,
        v::scale,
        v::mul,
        v::add,
        v::swiglu,
        v::softmax_exp,
    };
    return k;
}

#if SMOL_CPU_SHARED

// --- the parts that exist once ------------------------------------------------------

float fp16_to_fp32(uint16_t h) { return generic::h2f_soft(h); }
uint16_t fp32_to_fp16(float f) { return generic::f2h_soft(f); }
float bf16_to_fp32(uint16_t h) { return generic::bf2f(h); }
uint16_t fp32_to_bf16(float f) { return generic::f2bf(f); }

int64_t block_elems(smol_type t) {
    switch (t) {
    case SMOL_TYPE_Q4_0:
    case SMOL_TYPE_Q4_1:
    case SMOL_TYPE_Q8_0: return QK;
    default: return 1;
    }
}

size_t row_bytes(smol_type t, int64_t n) {
    switch (t) {
    case SMOL_TYPE_F32: return (size_t)n * 4;
    case SMOL_TYPE_F16:
    case SMOL_TYPE_BF16: return (size_t)n * 2;
    default: return (size_t)(n / QK) * generic::block_bytes(t);
    }
}

size_t act_bytes(smol_type t, int64_t K) {
    switch (t) {
    case SMOL_TYPE_F32:
    case SMOL_TYPE_BF16: return (size_t)K * sizeof(float);
    case SMOL_TYPE_F16: return (size_t)K * sizeof(uint16_t);
    default: return (size_t)(K / QK) * sizeof(block_q8_act);
    }
}

static bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
#else
    return false;
#endif
}

static bool cpu_has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
}

std::vector<const kernels *> kernels_available() {
    std::vector<const kernels *> v;
    v.push_back(&kernels_generic());
    if (cpu_has_avx2()) v.push_back(&kernels_avx2());
    if (cpu_has_avx512()) v.push_back(&kernels_avx512());
    return v;
}

static const kernels & choose_kernels() {
    const std::vector<const kernels *> avail = kernels_available();
    const kernels * best = avail.back();
    const char * want = getenv("SMOL_CPU_KERNELS");
    if (want && *want) {
        for (const kernels * k : avail)
            if (strcmp(k->name, want) == 0) return *k;
        // A forced variant this CPU cannot run would crash; say so once.
        fprintf(stderr,
                "smol: SMOL_CPU_KERNELS=%s is not available on this CPU (use generic, avx2 or "
                "avx512 where supported); using %s\n",
                want, best->name);
    }
    return *best;
}

const kernels & kernels_best() {
    static const kernels & k = choose_kernels();
    return k;
}

#endif // SMOL_CPU_SHARED

} // namespace smol::cpu
