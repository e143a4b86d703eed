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
#include "smol-log.h"
#include "smol-overrides.h"

#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
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

// The executor's token chunk (see kernels::token_chunk): f32 activations
// of the float kernels in whole tiles of 6 tokens, 512 KiB where the
// 512-bit kernel converts a block of rows once for all of them (a quarter
// of a recent server core's L2), 128 KiB for the others.
static int64_t token_chunk(smol_type t, int64_t K) {
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

static inline size_t block_bytes(smol_type t) {
    switch (t) {
    case SMOL_TYPE_Q4_0:
        return sizeof(block_q4_0);
    case SMOL_TYPE_Q4_1:
        return sizeof(block_q4_1);
    case SMOL_TYPE_Q8_0:
        return sizeof(block_q8_0);
    default:
        return 0;
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

// A product rounded to f32 before it is used: in the AVX2 copies GCC would
// otherwise fuse x * id + 8.5 into one FMA (C++ allows contraction), which
// rounds differently from ggml's reference and from the generic copy.
static inline float rounded(float v) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __asm__("" : "+x"(v));
#else
    volatile float t = v;
    v = t;
#endif
    return v;
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
            const float x0 = rounded(x[j] * id);
            const float x1 = rounded(x[j + 16] * id);
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
            const float x0 = rounded((x[j] - min) * id);
            const float x1 = rounded((x[j + 16] - min) * id);
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
    case SMOL_TYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case SMOL_TYPE_F16:
        f16_to_f32_row((const uint16_t *)src, dst, n);
        break;
    case SMOL_TYPE_BF16:
        bf16_to_f32_row((const uint16_t *)src, dst, n);
        break;
    case SMOL_TYPE_Q4_0:
        dequant_q4_0((const block_q4_0 *)src, n / QK, dst);
        break;
    case SMOL_TYPE_Q4_1:
        dequant_q4_1((const block_q4_1 *)src, n / QK, dst);
        break;
    case SMOL_TYPE_Q8_0:
        dequant_q8_0((const block_q8_0 *)src, n / QK, dst);
        break;
    }
}

static void row_from_f32(smol_type t, const float * src, void * dst, int64_t n) {
    switch (t) {
    case SMOL_TYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case SMOL_TYPE_F16:
        f32_to_f16_row(src, (uint16_t *)dst, n);
        break;
    case SMOL_TYPE_BF16:
        f32_to_bf16_row(src, (uint16_t *)dst, n);
        break;
    case SMOL_TYPE_Q4_0:
        quant_q4_0(src, (block_q4_0 *)dst, n / QK);
        break;
    case SMOL_TYPE_Q4_1:
        quant_q4_1(src, (block_q4_1 *)dst, n / QK);
        break;
    case SMOL_TYPE_Q8_0:
        quant_q8_0(src, (block_q8_0 *)dst, n / QK);
        break;
    }
}

// --- activations ------------------------------------------------------------------

// d = max|x| / 127, qs = round_even(x * (127 / max|x|)) and s = d * sum(qs),
// with d and s then rounded to f16 (ggml's quantize_row_q8_1). The SIMD path
// performs the same operations in the same order, so every variant produces
// the same bytes.
static void quant_act(const float * x, block_q8_act * y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK) {
#if defined(__AVX2__)
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 v0 = _mm256_loadu_ps(x);
        __m256 v1 = _mm256_loadu_ps(x + 8);
        __m256 v2 = _mm256_loadu_ps(x + 16);
        __m256 v3 = _mm256_loadu_ps(x + 24);
        __m256 m =
            _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                          _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f; // as ggml's AVX2 path
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
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            const int q = round_even(x[j] * id);
            y[i].qs[j] = (int8_t)q;
            sum += q;
        }
#endif
        // The scale and the sum are kept at f16 precision, as in ggml's q8_1
        // blocks, so the products match llama.cpp's for the same inputs.
        y[i].d = h2f_soft(f2h_soft(d));
        y[i].s = h2f_soft(f2h_soft(d * (float)sum));
    }
}

static void act_from_f32(smol_type t, const float * x, void * act, int64_t K) {
    switch (t) {
    case SMOL_TYPE_F32:
    case SMOL_TYPE_BF16:
        memcpy(act, x, (size_t)K * sizeof(float));
        break;
    case SMOL_TYPE_F16: {
        // Rounded to f16 (as ggml converts them), kept as f32 so that every
        // thread's tiles read them as they are.
        uint16_t h[256];
        float * y = (float *)act;
        for (int64_t k0 = 0; k0 < K; k0 += 256) {
            const int64_t n = K - k0 < 256 ? K - k0 : 256;
            f32_to_f16_row(x + k0, h, n);
            f16_to_f32_row(h, y + k0, n);
        }
        break;
    }
    case SMOL_TYPE_Q4_0:
    case SMOL_TYPE_Q4_1:
    case SMOL_TYPE_Q8_0:
        quant_act(x, (block_q8_act *)act, K / QK);
        break;
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

static void f32_to_f16(const float * x, uint16_t * y, int64_t n) {
    f32_to_f16_row(x, y, n);
}

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

static float sum_sq(const float * x, int64_t n) {
    return dot_f32(x, x, n);
}

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

// --- attention over the cells of a sequence ---------------------------------------
//
// The queries of one kv head (GQA) share each K and V row they read. For
// query g: scores out[g * ldo + j] = (K row cells[j] . q_g) * scale for
// j < n (q_g = q + g * hd), and mx[g] their largest; values acc[g * hd + d]
// = sum over j of p[g * ldp + j] * V row cells[j][d], in increasing j (one
// FMA per element and cell, cells with p == 0 skipped). Each score and each
// element of acc is computed the same way whatever n, cells and nq are, so a
// query's result depends only on its own cells.

#if defined(__AVX2__)
// G queries x C cells: lane sums over d, then hsum8x8's order, the d tail.
template <int G, int C>
static inline void score_block(const uint16_t * const r[C], int64_t hd, const float * q,
                               float * sums) {
    __m256 acc[G * C];
#pragma GCC unroll 64
    for (int i = 0; i < G * C; i++) acc[i] = _mm256_setzero_ps();
    const int64_t h8 = hd & ~(int64_t)7;
    for (int64_t d = 0; d < h8; d += 8) {
        __m256 kv[C];
        for (int c = 0; c < C; c++)
            kv[c] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r[c] + d)));
        for (int g = 0; g < G; g++) {
            __m256 qv = _mm256_loadu_ps(q + g * hd + d);
            if (C > 1) __asm__("" : "+x"(qv));
            for (int c = 0; c < C; c++) acc[g * C + c] = _mm256_fmadd_ps(kv[c], qv, acc[g * C + c]);
        }
    }
    hsum_lanes<G * C>(acc, sums);
    for (int g = 0; g < G; g++) {
        for (int c = 0; c < C; c++) {
            __m128 v = _mm_set_ss(sums[g * C + c]);
            for (int64_t d = h8; d < hd; d++)
                v = _mm_fmadd_ss(_mm_set_ss(h2f(r[c][d])), _mm_set_ss(q[g * hd + d]), v);
            sums[g * C + c] = _mm_cvtss_f32(v);
        }
    }
}

template <int G, int C>
static void scores_g(const uint16_t * k, const int32_t * cells, int32_t n, int64_t hd,
                     const float * q, float scale, float * out, int64_t ldo, float * mx) {
    for (int g = 0; g < G; g++) mx[g] = -INFINITY;
    for (int32_t j = 0; j < n; j += C) {
        const int m = n - j < C ? (int)(n - j) : C;
        const uint16_t * r[C];
        for (int c = 0; c < C; c++) r[c] = k + (size_t)cells[j + (c < m ? c : 0)] * (size_t)hd;
        alignas(32) float sums[(G * C + 7) / 8 * 8];
        score_block<G, C>(r, hd, q, sums);
        for (int g = 0; g < G; g++) {
            for (int c = 0; c < m; c++) {
                const float s = sums[g * C + c] * scale;
                out[g * ldo + j + c] = s;
                mx[g] = mx[g] > s ? mx[g] : s;
            }
        }
    }
}

// G queries x 8 D elements of acc, starting at element d0, in registers
// across all cells.
template <int G, int D>
static void values_g(const uint16_t * v, const int32_t * cells, const float * p, int64_t ldp,
                     int32_t n, int64_t hd, int64_t d0, float * acc) {
    __m256 a[G * D];
#pragma GCC unroll 64
    for (int i = 0; i < G * D; i++) a[i] = _mm256_setzero_ps();
    for (int32_t j = 0; j < n; j++) {
        const uint16_t * r = v + (size_t)cells[j] * (size_t)hd + d0;
        __m256 vv[D];
        for (int i = 0; i < D; i++)
            vv[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 8 * i)));
        for (int g = 0; g < G; g++) {
            const float pj = p[g * ldp + j];
            if (pj == 0.0f) continue;
            const __m256 pv = _mm256_set1_ps(pj);
            for (int i = 0; i < D; i++) a[g * D + i] = _mm256_fmadd_ps(pv, vv[i], a[g * D + i]);
        }
    }
    for (int g = 0; g < G; g++)
        for (int i = 0; i < D; i++) _mm256_storeu_ps(acc + g * hd + d0 + 8 * i, a[g * D + i]);
}
#endif

static void attn_scores(const uint16_t * k, const int32_t * cells, int32_t n, int64_t hd,
                        const float * q, int nq, float scale, float * out, int64_t ldo,
                        float * mx) {
#if defined(__AVX2__)
    for (int g = 0; g < nq;) {
        const int left = nq - g;
        if (left >= 3) {
            scores_g<3, 4>(k, cells, n, hd, q + g * hd, scale, out + g * ldo, ldo, mx + g);
            g += 3;
        } else if (left == 2) {
            scores_g<2, 6>(k, cells, n, hd, q + g * hd, scale, out + g * ldo, ldo, mx + g);
            g += 2;
        } else {
            scores_g<1, 8>(k, cells, n, hd, q + g * hd, scale, out + g * ldo, ldo, mx + g);
            g += 1;
        }
    }
#else
    for (int g = 0; g < nq; g++) {
        mx[g] = -INFINITY;
        for (int32_t j = 0; j < n; j++) {
            const uint16_t * r = k + (size_t)cells[j] * (size_t)hd;
            float sum = 0.0f;
            for (int64_t d = 0; d < hd; d++) sum += h2f(r[d]) * q[g * hd + d];
            out[g * ldo + j] = sum * scale;
            mx[g] = mx[g] > out[g * ldo + j] ? mx[g] : out[g * ldo + j];
        }
    }
#endif
}

static void attn_values(const uint16_t * v, const int32_t * cells, const float * p, int64_t ldp,
                        int nq, int32_t n, int64_t hd, float * acc) {
    int64_t d0 = 0;
#if defined(__AVX2__)
    // 32 elements of acc for up to 3 queries at a time (12 registers).
    for (; d0 + 32 <= hd; d0 += 32) {
        for (int g = 0; g < nq;) {
            const int left = nq - g;
            if (left >= 3) {
                values_g<3, 4>(v, cells, p + g * ldp, ldp, n, hd, d0, acc + g * hd);
                g += 3;
            } else if (left == 2) {
                values_g<2, 4>(v, cells, p + g * ldp, ldp, n, hd, d0, acc + g * hd);
                g += 2;
            } else {
                values_g<1, 4>(v, cells, p + g * ldp, ldp, n, hd, d0, acc + g * hd);
                g += 1;
            }
        }
    }
#endif
    if (d0 == hd) return;
    for (int g = 0; g < nq; g++) {
        for (int64_t d = d0; d < hd; d++) acc[g * hd + d] = 0.0f;
        for (int32_t j = 0; j < n; j++) {
            const float pj = p[g * ldp + j];
            if (pj == 0.0f) continue;
            const uint16_t * r = v + (size_t)cells[j] * (size_t)hd;
            for (int64_t d = d0; d < hd; d++) {
#if defined(__AVX2__)
                acc[g * hd + d] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(pj), _mm_set_ss(h2f(r[d])),
                                                             _mm_set_ss(acc[g * hd + d])));
#else
                acc[g * hd + d] += pj * h2f(r[d]);
#endif
            }
        }
    }
}

// --- matmul: the portable path ----------------------------------------------------
//
// Every variant computes a quantized dot product the same way, as ggml does:
// per block of 32 an exact integer dot product isum of the weight values
// (q - 8 for q4_0, q for q4_1, w for q8_0) with the activation codes, then
// in float  d_w * d_a * isum,  plus  m * s_a  for q4_1. Only the order of
// the float additions differs between variants.

static float dot_q_scalar(smol_type t, const uint8_t * w, const block_q8_act * a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int isum = 0;
        if (t == SMOL_TYPE_Q8_0) {
            const block_q8_0 * blk = (const block_q8_0 *)w + b;
            for (int j = 0; j < QK; j++) isum += blk->qs[j] * a[b].qs[j];
            sum += (float)isum * (h2f(blk->d) * a[b].d);
        } else if (t == SMOL_TYPE_Q4_0) {
            const block_q4_0 * blk = (const block_q4_0 *)w + b;
            for (int j = 0; j < 16; j++)
                isum += ((blk->qs[j] & 0x0f) - 8) * a[b].qs[j] +
                        ((blk->qs[j] >> 4) - 8) * a[b].qs[j + 16];
            sum += (float)isum * (h2f(blk->d) * a[b].d);
        } else {
            const block_q4_1 * blk = (const block_q4_1 *)w + b;
            for (int j = 0; j < 16; j++)
                isum += (blk->qs[j] & 0x0f) * a[b].qs[j] + (blk->qs[j] >> 4) * a[b].qs[j + 16];
            sum += (float)isum * (h2f(blk->d) * a[b].d) + h2f(blk->m) * a[b].s;
        }
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
                const float * x = (const float *)ai;
                const uint16_t * v = (const uint16_t *)wr;
                for (int64_t k = 0; k < K; k++) sum += h2f(v[k]) * x[k];
                break;
            }
            default:
                sum = dot_q_scalar(t, wr, (const block_q8_act *)ai, K / QK);
                break;
            }
            y[i * ldy + r] = sum;
        }
    }
}

#if defined(__AVX2__)

// --- matmul: AVX2 (and AVX-512) -----------------------------------------------------
//
// Prefill multiplies a packed weight panel with several tokens at once; the
// panel is k-major so that each vector holds 8 rows and each token
// contributes a broadcast scalar, an outer product. Nothing is reduced
// horizontally (Zen 3 runs vphadd at a quarter of the rate of vpmaddubsw),
// and a weight is unpacked once per call (per token chunk) however many
// tokens use it.
//
// Quantized types: a panel of 16 rows holds, per block and per group of 4
// elements j, the rows' codes as bytes, 4 per 32-bit lane ("quads"). One
// token's 4 activation codes are broadcast to every lane, vpmaddubsw gives
// each row's two pair sums as int16, and these are summed over the block's
// 8 quads in int16: one side of the product is at most 255 and the other is
// held to 4 bits (at most 16 products of 255 * 8 or 127 * 15, < 32768). One
// vpmaddwd per block and row vector then completes the row's int32 dot
// product, and the block's scales are applied to 8 rows at once. For q4_0
// and q8_0 the weight codes are signed (q - 8; w split into two signed
// nibble planes) and the activations, plus 128, are the unsigned side; the
// 128 * sum(codes) this adds is a per-row constant of the panel, so the
// integer dot products are exact, as in ggml. With AVX-512 VNNI, vpdpbusd
// does the multiply and the int32 sum on all 16 rows at once.
//
// Float types: dot products in one order for every batch size (see "float
// weights" below), the weights read as the file holds them.
//
// Decode and small batches stream each weight once, 8 rows at a time, with
// software prefetch. Scratch lives on the stack: at most ~56 KiB per call.
//
// Batch invariance: every path computes an output element with the same
// float operations in the same order, however many tokens the call has and
// wherever the element falls in a tile. Quantized: per block in order,
// acc = fma(isum, d_w * d_a, acc), then for q4_1 acc = fma(m, s_a, acc).
// Float: acc = fma(w[k], x[k], acc) for k in order. A tile that covers a
// later chunk of K starts from the sum so far instead of adding to it, so
// chunking changes nothing. A token's logits are then the same bits alone or
// in any batch, which continuous batching and prefix reuse rely on.

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
// vpdpbusd multiplies unsigned by signed bytes and adds into int32 lanes in
// one instruction: q8_0 then needs no nibble split (w + 128 is the unsigned
// operand) and a 512-bit vector holds all 16 rows of a quad.
#define SMOL_CPU_VNNI 1
#else
#define SMOL_CPU_VNNI 0
#endif

// Up to this many tokens, the quantized matmul streams the weights row group
// by row group (decode, small batches) instead of packing panels (measured
// crossover on Zen 3).
constexpr int64_t gemv_max_tokens_q = 4;

constexpr int64_t q_panel_rows = 16;
// Blocks per q panel: 24 keeps a 4-bit panel within ~15 KiB of L1; q8_0
// panels hold two nibble planes, and 18 blocks (all of K = 576) measured
// better than splitting K further.
constexpr int64_t q_panel_blocks = 24;
constexpr int64_t q8_panel_blocks = 18;
// Activation bytes per token chunk: about half of Zen 3's 512 KiB L2.
constexpr int64_t act_chunk_bytes = 256 * 1024;

static inline __m256i unpack_nibbles(const uint8_t * qs) {
    const __m128i x = _mm_loadu_si128((const __m128i *)qs);
    const __m256i v = _mm256_insertf128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

// 8 rows of 8 32-bit lanes -> 8 columns: r[j] lane i = old r[i] lane j.
static inline void transpose8_epi32(__m256i r[8]) {
    const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]);
    const __m256i t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]);
    const __m256i t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    const __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]);
    const __m256i t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    const __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]);
    const __m256i t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2);
    const __m256i u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3);
    const __m256i u3 = _mm256_unpackhi_epi64(t1, t3);
    const __m256i u4 = _mm256_unpacklo_epi64(t4, t6);
    const __m256i u5 = _mm256_unpackhi_epi64(t4, t6);
    const __m256i u6 = _mm256_unpacklo_epi64(t5, t7);
    const __m256i u7 = _mm256_unpackhi_epi64(t5, t7);
    r[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
    r[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
    r[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
    r[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
    r[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
    r[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
    r[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
    r[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

struct q_panel {
    // q[b][j][v]: rows 8v..8v+7, elements 4j..4j+3 of block b, as the
    // operand vpmaddubsw / vpdpbusd multiplies with the activation codes.
    // With AVX2 (int16 sums, so both sides must stay small):
    //   q4_1: the codes 0..15 (unsigned; the activations are the signed side);
    //   q4_0: q - 8 (signed; the activations, plus 128, the unsigned side);
    //   q8_0: w = 16 h + l split into two signed planes, l = ((w + 8) mod 16)
    //         - 8 in q and h in [-8, 8] in h, with the activations as q4_0.
    // With VNNI (int32 sums; the activations stay signed so that they can be
    // broadcast from memory): the codes 0..15, or w + 128 for q8_0.
    alignas(64) int8_t q[q_panel_blocks][8][2][32];
    alignas(64) int8_t h[q_panel_blocks][8][2][32];
    alignas(64) float d[q_panel_blocks][q_panel_rows];
    // q4_1: m, the coefficient of the activation sum s.
    alignas(64) float m[q_panel_blocks][q_panel_rows];
    // AVX2 q4_0, q8_0: 128 * (sum of the row's signed codes in the block),
    // what the +128 on the activations added to the integer dot product.
    alignas(64) int32_t corr[q_panel_blocks][q_panel_rows];
};

// True for the types whose panel holds signed codes (activations + 128 on
// the unsigned side): their dot products are exact integers, as ggml's
// q4_0 x q8_0 and q8_0 x q8_0, with no use of the rounded activation sum.
constexpr bool signed_codes(smol_type t) {
    return t == SMOL_TYPE_Q4_0 || t == SMOL_TYPE_Q8_0;
}

// The sum of 32 signed bytes.
static inline int32_t sum_i8x32(__m256i v) {
    const __m256i s =
        _mm256_sad_epu8(_mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
    const __m128i t = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    return (int32_t)(_mm_cvtsi128_si64(t) + _mm_extract_epi64(t, 1)) - 32 * 128;
}

// Packs blocks kb0..kb0+nbk of 16 rows into p.
static void q_panel_fill(smol_type t, q_panel * p, const uint8_t * const rows[16], int64_t kb0,
                         int64_t nbk) {
    const size_t bs = block_bytes(t);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int64_t b = 0; b < nbk; b++) {
        const size_t o = (size_t)(kb0 + b) * bs;
        for (int v = 0; v < 2; v++) {
            __m256i lo[8], hi[8];
            for (int i = 0; i < 8; i++) {
                const uint8_t * src = rows[8 * v + i] + o;
                const int r = 8 * v + i;
                p->d[b][r] = h2f(load_u16(src));
                if (t == SMOL_TYPE_Q8_0) {
                    const __m256i w = _mm256_loadu_si256((const __m256i *)(src + 2));
                    if (SMOL_CPU_VNNI) {
                        lo[i] = _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80)); // w + 128
                    } else {
                        p->corr[b][r] = 128 * sum_i8x32(w);
                        // l = (w mod 16) - 16 carry, h = (w >> 4) + carry,
                        // carry = (w mod 16) >= 8.
                        const __m256i l4 = _mm256_and_si256(w, m4);
                        const __m256i carry = _mm256_cmpgt_epi8(l4, _mm256_set1_epi8(7)); // -1 or 0
                        lo[i] = _mm256_add_epi8(l4, _mm256_and_si256(carry, _mm256_set1_epi8(-16)));
                        const __m256i h4 = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
                        const __m256i sh =
                            _mm256_sub_epi8(_mm256_xor_si256(h4, _mm256_set1_epi8(8)),
                                            _mm256_set1_epi8(8)); // w >> 4
                        hi[i] = _mm256_sub_epi8(sh, carry);
                    }
                } else if (t == SMOL_TYPE_Q4_0) {
                    if (SMOL_CPU_VNNI) {
                        lo[i] = unpack_nibbles(src + 2);
                    } else {
                        lo[i] = _mm256_sub_epi8(unpack_nibbles(src + 2), _mm256_set1_epi8(8));
                        p->corr[b][r] = 128 * sum_i8x32(lo[i]);
                    }
                } else {
                    lo[i] = unpack_nibbles(src + 4);
                    p->m[b][r] = h2f(load_u16(src + 2));
                }
            }
            transpose8_epi32(lo);
            for (int j = 0; j < 8; j++) _mm256_store_si256((__m256i *)p->q[b][j][v], lo[j]);
            if (t == SMOL_TYPE_Q8_0 && !SMOL_CPU_VNNI) {
                transpose8_epi32(hi);
                for (int j = 0; j < 8; j++) _mm256_store_si256((__m256i *)p->h[b][j][v], hi[j]);
            }
        }
    }
}

// One token's 4 activation codes at p, in every 32-bit lane; with signed
// weight codes, shifted by 128 to be the unsigned operand.
// The activation codes of NT tokens as the tile reads them: as they are, or,
// for signed weight codes, shifted by 128 into xa (the unsigned side of the
// multiply) once per tile so that the inner loop broadcasts from memory.
// Block b of token t is at x[t] + b * stride.
template <smol_type T, int NT>
static inline int64_t tile_act(const block_q8_act * const a[NT], int64_t nbk, int8_t * xa,
                               const int8_t * x[NT]) {
    if (!signed_codes(T)) {
        for (int t = 0; t < NT; t++) x[t] = a[t][0].qs;
        return (int64_t)sizeof(block_q8_act);
    }
    const __m256i bias = _mm256_set1_epi8((char)0x80);
    for (int t = 0; t < NT; t++) {
        int8_t * dst = xa + t * nbk * QK;
        for (int64_t b = 0; b < nbk; b++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)a[t][b].qs);
            _mm256_storeu_si256((__m256i *)(dst + b * QK), _mm256_xor_si256(v, bias));
        }
        x[t] = dst;
    }
    return QK;
}

[[maybe_unused]] static inline __m256i bcast_quad(const int8_t * p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

// Row vectors v0..v0+NV-1 of the panel (8 rows each) x NT tokens over nbk
// blocks; out[t * 16 + 8 * v + i] for row 8 v + i.
// With init, the sums start from init[t * 16 + r] (a later chunk of K).
template <smol_type T, int NT, int NV>
__attribute__((noinline)) static void q_tile(const q_panel * p, int v0, int64_t nbk,
                                             const block_q8_act * const a[NT], const float * init,
                                             float * out) {
    const __m256i ones = _mm256_set1_epi16(1);
    alignas(32) int8_t xa[NT * q_panel_blocks * QK];
    const int8_t * xq[NT];
    const int64_t xs = tile_act<T, NT>(a, nbk, xa, xq);
    __m256 acc[NT][NV];
    for (int t = 0; t < NT; t++)
        for (int v = 0; v < NV; v++)
            acc[t][v] = init ? _mm256_loadu_ps(init + t * 16 + 8 * (v0 + v)) : _mm256_setzero_ps();
    for (int64_t b = 0; b < nbk; b++) {
        __m256i sl[NT][NV], sh[NT][NV];
        for (int t = 0; t < NT; t++) {
            for (int v = 0; v < NV; v++) {
                sl[t][v] = _mm256_setzero_si256();
                if (T == SMOL_TYPE_Q8_0) sh[t][v] = _mm256_setzero_si256();
            }
        }
        // Not unrolled: unrolled, GCC sums the 8 quads as a tree and spills.
#pragma GCC unroll 1
        for (int j = 0; j < 8; j++) {
            __m256i wl[NV], wh[NV];
            for (int v = 0; v < NV; v++) {
                wl[v] = _mm256_load_si256((const __m256i *)p->q[b][j][v0 + v]);
                if (T == SMOL_TYPE_Q8_0)
                    wh[v] = _mm256_load_si256((const __m256i *)p->h[b][j][v0 + v]);
            }
            for (int t = 0; t < NT; t++) {
                const __m256i x = bcast_quad(xq[t] + b * xs + 4 * j);
                for (int v = 0; v < NV; v++) {
                    // vpmaddubsw: first operand unsigned, second signed.
                    const __m256i pl = signed_codes(T) ? _mm256_maddubs_epi16(x, wl[v])
                                                       : _mm256_maddubs_epi16(wl[v], x);
                    sl[t][v] = _mm256_add_epi16(sl[t][v], pl);
                    if (T == SMOL_TYPE_Q8_0)
                        sh[t][v] = _mm256_add_epi16(sh[t][v], _mm256_maddubs_epi16(x, wh[v]));
                }
            }
        }
        for (int v = 0; v < NV; v++) {
            const __m256 d = _mm256_load_ps(p->d[b] + 8 * (v0 + v));
            for (int t = 0; t < NT; t++) {
                __m256i i = _mm256_madd_epi16(sl[t][v], ones);
                if (T == SMOL_TYPE_Q8_0)
                    i = _mm256_add_epi32(i, _mm256_madd_epi16(sh[t][v], _mm256_set1_epi16(16)));
                if (signed_codes(T))
                    i = _mm256_sub_epi32(
                        i, _mm256_load_si256((const __m256i *)(p->corr[b] + 8 * (v0 + v))));
                const __m256 da = _mm256_broadcast_ss(&a[t][b].d);
                acc[t][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(d, da), acc[t][v]);
                if (T == SMOL_TYPE_Q4_1) {
                    const __m256 m = _mm256_load_ps(p->m[b] + 8 * (v0 + v));
                    acc[t][v] = _mm256_fmadd_ps(m, _mm256_broadcast_ss(&a[t][b].s), acc[t][v]);
                }
            }
        }
    }
    for (int t = 0; t < NT; t++)
        for (int v = 0; v < NV; v++) _mm256_storeu_ps(out + t * 16 + 8 * (v0 + v), acc[t][v]);
}

#if SMOL_CPU_VNNI
// The panel's 16 rows x NT tokens with vpdpbusd on 512-bit vectors (the two
// 8-row halves of a quad are adjacent in the panel); out[t * 16 + r]. The
// weight codes carry a bias for q4_0 (+8) and q8_0 (+128), taken back out
// exactly with the activations' integer sums: corr[t][b] is the bias times
// token t's sum of codes in block b.
constexpr int32_t vnni_bias(smol_type t) {
    return t == SMOL_TYPE_Q8_0 ? 128 : t == SMOL_TYPE_Q4_0 ? 8 : 0;
}

template <smol_type T, int NT>
__attribute__((noinline)) static void
q_tile_vnni(const q_panel * p, int64_t nbk, const block_q8_act * const a[NT],
            const int32_t * const corr[NT], const float * init, float * out) {
    __m512 acc[NT];
#pragma GCC unroll 16
    for (int t = 0; t < NT; t++)
        acc[t] = init ? _mm512_loadu_ps(init + t * 16) : _mm512_setzero_ps();
    for (int64_t b = 0; b < nbk; b++) {
        __m512i s[NT];
#pragma GCC unroll 16
        for (int t = 0; t < NT; t++) s[t] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            const __m512i w = _mm512_load_si512((const void *)p->q[b][j]);
            for (int t = 0; t < NT; t++) {
                int32_t x;
                memcpy(&x, a[t][b].qs + 4 * j, 4);
                // vpdpbusd: second operand unsigned, third signed.
                s[t] = _mm512_dpbusd_epi32(s[t], w, _mm512_set1_epi32(x));
            }
        }
        const __m512 d = _mm512_load_ps(p->d[b]);
        for (int t = 0; t < NT; t++) {
            __m512i i = s[t];
            if (vnni_bias(T) != 0) i = _mm512_sub_epi32(i, _mm512_set1_epi32(corr[t][b]));
            const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(a[t][b].d));
            // The maskz form: GCC 12 warns about the plain one's undefined
            // pass-through operand.
            const __m512 f = _mm512_maskz_cvtepi32_ps((__mmask16)0xffff, i);
            acc[t] = _mm512_fmadd_ps(f, scale, acc[t]);
            if (T == SMOL_TYPE_Q4_1)
                acc[t] =
                    _mm512_fmadd_ps(_mm512_load_ps(p->m[b]), _mm512_set1_ps(a[t][b].s), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) _mm512_storeu_ps(out + t * 16, acc[t]);
}
#endif

// Writes an nt x nr corner of a tile (out[t * 16 + r]) into y.
static void store_tile(const float * out, int64_t nt, int64_t nr, float * y, int64_t ldy) {
    for (int64_t t = 0; t < nt; t++) {
        float * yt = y + t * ldy;
        const float * o = out + t * 16;
        if (nr == 16) {
            _mm256_storeu_ps(yt, _mm256_loadu_ps(o));
            _mm256_storeu_ps(yt + 8, _mm256_loadu_ps(o + 8));
        } else {
            for (int64_t r = 0; r < nr; r++) yt[r] = o[r];
        }
    }
}

// The sums so far of an nt x nr corner of y, as a tile's starting values
// (init[t * 16 + r]; the rest zero), for a later chunk of K.
static void load_tile(const float * y, int64_t nt, int64_t nr, int64_t ldy, int64_t nt_max,
                      float * init) {
    for (int64_t t = 0; t < nt_max; t++)
        for (int64_t r = 0; r < 16; r++)
            init[t * 16 + r] = t < nt && r < nr ? y[t * ldy + r] : 0.0f;
}

template <smol_type T>
static void matmul_q_tiles(const uint8_t * wb, size_t w_row_bytes, int64_t K, int64_t r0,
                           int64_t r1, const uint8_t * ab, size_t act_row_bytes, int64_t n_tok,
                           float * y, int64_t ldy) {
    // Three tokens per tile for the 4-bit types; q8_0 keeps two nibble
    // accumulators per row vector, so two tokens fit in the registers. With
    // VNNI and 32 registers, six.
    constexpr int NT = SMOL_CPU_VNNI ? 6 : T == SMOL_TYPE_Q8_0 ? 2 : 3;
    q_panel panel;
    const int64_t nb = K / QK;
    constexpr int64_t max_kc =
        T == SMOL_TYPE_Q8_0 && !SMOL_CPU_VNNI ? q8_panel_blocks : q_panel_blocks;
    const int64_t n_kc = (nb + max_kc - 1) / max_kc;
    const int64_t kc = (nb + n_kc - 1) / n_kc;
    int64_t tc = max_i64(NT, act_chunk_bytes / (nb * (int64_t)sizeof(block_q8_act)));
#if SMOL_CPU_VNNI
    // The activation sums a token chunk's tiles need, computed once per
    // chunk rather than once per row group.
    constexpr int64_t corr_tokens = 128;
    int32_t corr[corr_tokens * q_panel_blocks];
    tc = min_i64(tc, corr_tokens);
#endif
    for (int64_t t0 = 0; t0 < n_tok; t0 += tc) {
        const int64_t t1 = min_i64(n_tok, t0 + tc);
        for (int64_t kb0 = 0; kb0 < nb; kb0 += kc) {
            const int64_t nbk = min_i64(kc, nb - kb0);
#if SMOL_CPU_VNNI
            if (vnni_bias(T) != 0) {
                for (int64_t i = t0; i < t1; i++) {
                    const block_q8_act * a =
                        (const block_q8_act *)(ab + (size_t)i * act_row_bytes) + kb0;
                    for (int64_t b = 0; b < nbk; b++)
                        corr[(i - t0) * nbk + b] =
                            vnni_bias(T) * sum_i8x32(_mm256_loadu_si256((const __m256i *)a[b].qs));
                }
            }
#endif
            for (int64_t r = r0; r < r1; r += q_panel_rows) {
                // Rows past r1 repeat the last row, so a tile never reads
                // past the matrix; their results are dropped.
                const uint8_t * rows[q_panel_rows];
                for (int i = 0; i < q_panel_rows; i++)
                    rows[i] = wb + (size_t)min_i64(r + i, r1 - 1) * w_row_bytes;
                q_panel_fill(T, &panel, rows, kb0, nbk);
                const int64_t nr = min_i64(q_panel_rows, r1 - r);
                for (int64_t i = t0; i < t1; i += NT) {
                    const int64_t nt = min_i64(NT, t1 - i);
                    const block_q8_act * a[NT];
                    for (int j = 0; j < NT; j++)
                        a[j] = (const block_q8_act *)(ab + (size_t)min_i64(i + j, t1 - 1) *
                                                               act_row_bytes) +
                               kb0;
                    float out[NT * 16], init[NT * 16];
                    if (kb0 > 0) load_tile(y + i * ldy + r, nt, nr, ldy, NT, init);
                    const float * in = kb0 > 0 ? init : nullptr;
#if SMOL_CPU_VNNI
                    const int32_t * c[NT];
                    for (int j = 0; j < NT; j++) c[j] = corr + (min_i64(i + j, t1 - 1) - t0) * nbk;
                    q_tile_vnni<T, NT>(&panel, nbk, a, c, in, out);
#else
                    q_tile<T, NT, 2>(&panel, 0, nbk, a, in, out);
#endif
                    store_tile(out, nt, nr, y + i * ldy + r, ldy);
                }
            }
        }
    }
}

// Decode reads each weight once, from memory. Where decode_prefetch() says
// so, the kernels ask for the rows ahead a cache line at a time, in address
// order, as they move along their own rows: on Zen 3, 8 rows read side by
// side were 8 streams the hardware prefetcher served poorly, lines asked
// for one from each row in turn did less than the same lines asked for in
// order, and lines about 8 KiB ahead more than 16-48 KiB ahead. The
// distance in rows, a multiple of 8; 0: no prefetch.
static inline int64_t prefetch_distance(size_t row_bytes) {
    if (!decode_prefetch()) return 0;
    const int64_t rows = (int64_t)((8u << 10) / row_bytes) & ~(int64_t)7;
    return rows < 8 ? 8 : rows > 64 ? 64 : rows;
}

// Step s (from 0) of a kernel that has moved 64 bytes further along each of
// its rows asks for the next RM lines of the RM rows at pf (contiguous): over
// a row's length the steps cover all of them, in order. Non-temporal: the
// weights are read once a token, and what the caches hold besides them
// (activations, the KV cache) stays (F16 decode on Zen 3 gained about 6%).
template <int RM> static inline void prefetch_lines(const uint8_t * pf, size_t s) {
    const char * p = (const char *)pf + s * RM * 64;
    for (int i = 0; i < RM; i++) _mm_prefetch(p + i * 64, _MM_HINT_NTA);
}

// Decode, quantized: 8 rows x 1 token, streaming the weights. Two rows
// share each vpmaddubsw (row r's low-nibble half in the low 128 bits, row
// r+1's in the high), and three vphaddd fold the four pair vectors into
// the 8 rows' sums, in the lane order {0, 2, 4, 6, 1, 3, 5, 7}.
// pf, when given, is 8 rows further on (prefetch_distance), asked for
// 8 lines each time the kernel passes another 64 bytes of its rows (blocks
// of 34 or 20 bytes do not line up with lines).
static void q_gemv_8(smol_type t, const uint8_t * const rows[8], const block_q8_act * a, int64_t nb,
                     float * out, const uint8_t * pf) {
    const size_t bs = block_bytes(t);
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    // Lane l of the result holds row order[l].
    static const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    __m256 acc = _mm256_setzero_ps();
    size_t pf_next = 0; // row bytes covered by the lines asked for so far
    for (int64_t b = 0; b < nb; b++) {
        const size_t o = (size_t)b * bs;
        if (pf && pf_next < o + bs) {
            prefetch_lines<8>(pf, pf_next / 64);
            pf_next += 64;
        }
        __m256i pr[4];
        if (t == SMOL_TYPE_Q8_0) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)a[b].qs);
            for (int k = 0; k < 4; k++) {
                const __m256i w0 = _mm256_loadu_si256((const __m256i *)(rows[2 * k] + o + 2));
                const __m256i w1 = _mm256_loadu_si256((const __m256i *)(rows[2 * k + 1] + o + 2));
                const __m256i p0 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(_mm256_sign_epi8(w0, w0), _mm256_sign_epi8(x, w0)), ones);
                const __m256i p1 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(_mm256_sign_epi8(w1, w1), _mm256_sign_epi8(x, w1)), ones);
                // Row 2k's 4 partial sums in the low lane, row 2k+1's in the high.
                pr[k] = _mm256_hadd_epi32(_mm256_permute2x128_si256(p0, p1, 0x20),
                                          _mm256_permute2x128_si256(p0, p1, 0x31));
            }
        } else {
            const __m128i xl = _mm_loadu_si128((const __m128i *)a[b].qs);
            const __m128i xh = _mm_loadu_si128((const __m128i *)(a[b].qs + 16));
            const __m256i x_lo = _mm256_insertf128_si256(_mm256_castsi128_si256(xl), xl, 1);
            const __m256i x_hi = _mm256_insertf128_si256(_mm256_castsi128_si256(xh), xh, 1);
            const size_t qo = o + (t == SMOL_TYPE_Q4_0 ? 2 : 4);
            for (int k = 0; k < 4; k++) {
                const __m256i v = _mm256_insertf128_si256(
                    _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(rows[2 * k] + qo))),
                    _mm_loadu_si128((const __m128i *)(rows[2 * k + 1] + qo)), 1);
                const __m256i lo = _mm256_and_si256(v, m4);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, x_lo),
                                                   _mm256_maddubs_epi16(hi, x_hi));
                pr[k] = _mm256_madd_epi16(s, ones);
            }
        }
        // pr[k]: [row 2k: 4 partials | row 2k+1: 4 partials].
        __m256i v =
            _mm256_hadd_epi32(_mm256_hadd_epi32(pr[0], pr[1]), _mm256_hadd_epi32(pr[2], pr[3]));
        if (t == SMOL_TYPE_Q4_0) {
            // Codes carry a +8 bias: subtract 8 * sum(a), exactly.
            const int32_t sa = sum_i8x32(_mm256_loadu_si256((const __m256i *)a[b].qs));
            v = _mm256_sub_epi32(v, _mm256_set1_epi32(8 * sa));
        }
        const __m128i dh = _mm_setr_epi16(
            (short)load_u16(rows[order[0]] + o), (short)load_u16(rows[order[1]] + o),
            (short)load_u16(rows[order[2]] + o), (short)load_u16(rows[order[3]] + o),
            (short)load_u16(rows[order[4]] + o), (short)load_u16(rows[order[5]] + o),
            (short)load_u16(rows[order[6]] + o), (short)load_u16(rows[order[7]] + o));
        const __m256 dw = _mm256_cvtph_ps(dh);
        acc =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(dw, _mm256_set1_ps(a[b].d)), acc);
        if (t == SMOL_TYPE_Q4_1) {
            const __m128i mh = _mm_setr_epi16(
                (short)load_u16(rows[order[0]] + o + 2), (short)load_u16(rows[order[1]] + o + 2),
                (short)load_u16(rows[order[2]] + o + 2), (short)load_u16(rows[order[3]] + o + 2),
                (short)load_u16(rows[order[4]] + o + 2), (short)load_u16(rows[order[5]] + o + 2),
                (short)load_u16(rows[order[6]] + o + 2), (short)load_u16(rows[order[7]] + o + 2));
            acc = _mm256_fmadd_ps(_mm256_cvtph_ps(mh), _mm256_set1_ps(a[b].s), acc);
        }
    }
    float res[8];
    _mm256_storeu_ps(res, acc);
    for (int l = 0; l < 8; l++) out[order[l]] = res[l];
}

static void matmul_q(smol_type t, const void * w, size_t w_row_bytes, int64_t K, int64_t r0,
                     int64_t r1, const void * act, size_t act_row_bytes, int64_t n_tok, float * y,
                     int64_t ldy) {
    const uint8_t * wb = (const uint8_t *)w;
    const uint8_t * ab = (const uint8_t *)act;
    if (n_tok <= gemv_max_tokens_q) {
        // Few tokens: packing a panel would cost more than it saves; each
        // token reads the group's rows again, from L1.
        const int64_t pf_rows = prefetch_distance(row_bytes(t, K));
        for (int64_t r = r0; r < r1; r += 8) {
            const uint8_t * rows[8];
            for (int i = 0; i < 8; i++) rows[i] = wb + (size_t)min_i64(r + i, r1 - 1) * w_row_bytes;
            const int64_t n = min_i64(8, r1 - r);
            const uint8_t * pf = pf_rows > 0 && r + pf_rows + 8 <= r1
                                     ? wb + (size_t)(r + pf_rows) * w_row_bytes
                                     : nullptr;
            for (int64_t j = 0; j < n_tok; j++) {
                float out[8];
                q_gemv_8(t, rows, (const block_q8_act *)(ab + (size_t)j * act_row_bytes), K / QK,
                         out, j == 0 ? pf : nullptr);
                for (int64_t i = 0; i < n; i++) y[j * ldy + r + i] = out[i];
            }
        }
        return;
    }
    switch (t) {
    case SMOL_TYPE_Q4_0:
        matmul_q_tiles<SMOL_TYPE_Q4_0>(wb, w_row_bytes, K, r0, r1, ab, act_row_bytes, n_tok, y,
                                       ldy);
        break;
    case SMOL_TYPE_Q4_1:
        matmul_q_tiles<SMOL_TYPE_Q4_1>(wb, w_row_bytes, K, r0, r1, ab, act_row_bytes, n_tok, y,
                                       ldy);
        break;
    default:
        matmul_q_tiles<SMOL_TYPE_Q8_0>(wb, w_row_bytes, K, r0, r1, ab, act_row_bytes, n_tok, y,
                                       ldy);
        break;
    }
}

// --- float weights ---
//
// Every output is one dot product computed in one order, whatever the
// number of tokens: lane l of an 8-float accumulator sums w[k] x[k] for
// k = l, l + 8, l + 16, ... in increasing k (one FMA each); the lanes are
// added as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)); the last
// K mod 8 products are added after that, in order. Decode (one token,
// 8 rows at a time) and prefill (tiles of 2 rows x 6 tokens; with AVX-512,
// 8 rows x 6 tokens in 16-float halves, below) run those same steps per
// output, so a token's result does not depend on its batch. Decode reads
// the weights in their own layout; activations are f32 (for f16 weights,
// rounded to f16 when converted).

static inline __m256 load8_f16(const uint16_t * p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline __m256 load8_bf16(const uint16_t * p) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

template <smol_type T> static inline __m256 load_w8(const uint8_t * row, int64_t k) {
    if (T == SMOL_TYPE_F16) return load8_f16((const uint16_t *)row + k);
    if (T == SMOL_TYPE_BF16) return load8_bf16((const uint16_t *)row + k);
    return _mm256_loadu_ps((const float *)row + k);
}

template <smol_type T> static inline float load_w1(const uint8_t * row, int64_t k) {
    if (T == SMOL_TYPE_F16) return h2f(((const uint16_t *)row)[k]);
    if (T == SMOL_TYPE_BF16) return bf2f(((const uint16_t *)row)[k]);
    return ((const float *)row)[k];
}

// RM rows x RN tokens: y[j * ldy + i] = weight row i . token j (f32), K
// long; rows ws bytes apart from w, tokens ldx bytes apart from x.
// Not inlined: GCC keeps the 12 accumulators of the 2 x 6 tile in registers
// only when the tile is a function of its own.
template <smol_type T, int RM, int RN>
__attribute__((noinline)) static void f_tile(const uint8_t * w0, size_t ws, const uint8_t * x0,
                                             size_t ldx, int64_t K, float * y, int64_t ldy,
                                             const uint8_t * pf = nullptr) {
    const uint8_t * w[RM];
    for (int i = 0; i < RM; i++) w[i] = w0 + (size_t)i * ws;
    const float * x[RN];
    for (int j = 0; j < RN; j++) x[j] = (const float *)(x0 + (size_t)j * ldx);
    __m256 acc[RN * RM];
#pragma GCC unroll 64
    for (int i = 0; i < RN * RM; i++) acc[i] = _mm256_setzero_ps();
    const int64_t K8 = K & ~(int64_t)7;
    constexpr int64_t el = T == SMOL_TYPE_F32 ? 4 : 2;
    for (int64_t k = 0; k < K8; k += 8) {
        // Decode streams the weights: pf, when given, is RM rows further on.
        if (pf && (k * el) % 64 == 0) prefetch_lines<RM>(pf, (size_t)(k * el) / 64);
        __m256 wv[RM];
        for (int i = 0; i < RM; i++) wv[i] = load_w8<T>(w[i], k);
        for (int j = 0; j < RN; j++) {
            __m256 xv = _mm256_loadu_ps(x[j] + k);
            // In a register: folded into each FMA, it would be loaded RM
            // times, and the loads (two per cycle) would bound the loop.
            if (RM > 1) __asm__("" : "+x"(xv));
            for (int i = 0; i < RM; i++)
                acc[j * RM + i] = _mm256_fmadd_ps(wv[i], xv, acc[j * RM + i]);
        }
    }
    alignas(32) float sums[(RN * RM + 7) / 8 * 8];
    hsum_lanes<RN * RM>(acc, sums);
    if (K8 == K) {
        // No tail: a token's RM sums are adjacent in y.
        for (int j = 0; j < RN; j++) memcpy(y + j * ldy, sums + j * RM, RM * sizeof(float));
        return;
    }
    for (int j = 0; j < RN; j++) {
        for (int i = 0; i < RM; i++) {
            __m128 s = _mm_set_ss(sums[j * RM + i]);
            for (int64_t k = K8; k < K; k++)
                s = _mm_fmadd_ss(_mm_set_ss(load_w1<T>(w[i], k)), _mm_set_ss(x[j][k]), s);
            y[j * ldy + i] = _mm_cvtss_f32(s);
        }
    }
}

// Calls f.template operator()<M>() with M = m, the tokens of a prefill
// tile (1 <= m <= 6): the tile kernels take their token count as a
// template argument.
template <class F> static inline void with_tile_tokens(int64_t m, F && f) {
    switch (m) {
    case 1:
        f.template operator()<1>();
        break;
    case 2:
        f.template operator()<2>();
        break;
    case 3:
        f.template operator()<3>();
        break;
    case 4:
        f.template operator()<4>();
        break;
    case 5:
        f.template operator()<5>();
        break;
    default:
        f.template operator()<6>();
        break;
    }
}

// RM rows from w0 x m tokens from x0, 1 <= m <= 6: one tile of that size.
template <smol_type T, int RM>
static void f_tile_m(const uint8_t * w0, size_t ws, const uint8_t * x0, size_t ldx, int64_t m,
                     int64_t K, float * y, int64_t ldy) {
    with_tile_tokens(m, [&]<int RN>() { f_tile<T, RM, RN>(w0, ws, x0, ldx, K, y, ldy); });
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// Prefill with 512-bit FMAs, in the order above: a 16-float accumulator
// holds two outputs, weight rows i and i + 1 against one token, each half
// summing its row's 8 lanes exactly as the 8-float tiles do. The rows of a
// block are first converted to f32 and packed in pairs (pair_rows: 8
// floats of row i, the same 8 of row i + 1, the next 8 of row i, ...), so
// the conversion is paid once per block and token chunk, not once a tile.

constexpr int64_t f_pack_floats = 65536; // 256 KiB of packed rows, on the stack

template <smol_type T>
static void pair_rows(const uint8_t * w0, const uint8_t * w1, int64_t K8, float * p) {
    for (int64_t k = 0; k < K8; k += 8) {
        _mm256_store_ps(p + 2 * k, load_w8<T>(w0, k));
        _mm256_store_ps(p + 2 * k + 8, load_w8<T>(w1, k));
    }
}

// RP packed row pairs (ps floats apart from p) x RN tokens, the first K8
// products of each output: sums[j * 2 * RP + i] = row i . token j, summed
// in hsum8x8's order. Not inlined, as f_tile.
template <int RP, int RN>
__attribute__((noinline)) static void f_tile_pairs(const float * p, int64_t ps, const uint8_t * x0,
                                                   size_t ldx, int64_t K8, float * sums) {
    const float * x[RN];
    for (int j = 0; j < RN; j++) x[j] = (const float *)(x0 + (size_t)j * ldx);
    __m512 acc[RN * RP];
#pragma GCC unroll 64
    for (int i = 0; i < RN * RP; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K8; k += 8) {
        __m512 wv[RP];
        for (int i = 0; i < RP; i++) wv[i] = _mm512_load_ps(p + i * ps + 2 * k);
        for (int j = 0; j < RN; j++) {
            __m512 xv = _mm512_maskz_broadcast_f32x8(0xffff, _mm256_loadu_ps(x[j] + k));
            if (RP > 1) __asm__("" : "+v"(xv));
            for (int i = 0; i < RP; i++)
                acc[j * RP + i] = _mm512_fmadd_ps(wv[i], xv, acc[j * RP + i]);
        }
    }
    __m256 half[2 * RN * RP];
#pragma GCC unroll 64
    for (int i = 0; i < RN * RP; i++) {
        half[2 * i] = _mm512_maskz_extractf32x8_ps(0xff, acc[i], 0);
        half[2 * i + 1] = _mm512_maskz_extractf32x8_ps(0xff, acc[i], 1);
    }
    hsum_lanes<2 * RN * RP>(half, sums);
}

// 2 * RP rows from w0 (ws bytes apart; their pairs packed at p) x m
// tokens: the packed sums, then each output's last K mod 8 products from
// its own row, as f_tile adds them.
template <smol_type T, int RP>
static void f_pairs_out(const float * p, int64_t ps, const uint8_t * w0, size_t ws,
                        const uint8_t * x0, size_t ldx, int64_t m, int64_t K, float * y,
                        int64_t ldy) {
    const int64_t K8 = K & ~(int64_t)7;
    alignas(32) float sums[(2 * RP * 6 + 7) / 8 * 8];
    with_tile_tokens(m, [&]<int RN>() { f_tile_pairs<RP, RN>(p, ps, x0, ldx, K8, sums); });
    for (int64_t j = 0; j < m; j++) {
        const float * x = (const float *)(x0 + (size_t)j * ldx);
        for (int i = 0; i < 2 * RP; i++) {
            __m128 s = _mm_set_ss(sums[j * 2 * RP + i]);
            for (int64_t k = K8; k < K; k++)
                s = _mm_fmadd_ss(_mm_set_ss(load_w1<T>(w0 + (size_t)i * ws, k)), _mm_set_ss(x[k]),
                                 s);
            y[j * ldy + i] = _mm_cvtss_f32(s);
        }
    }
}

// The np packed pairs of rows from w0 x m tokens: tiles of 4 pairs, then
// of 2 and 1.
template <smol_type T>
static void f_pairs(const float * p, int64_t ps, int64_t np, const uint8_t * w0, size_t ws,
                    const uint8_t * x0, size_t ldx, int64_t m, int64_t K, float * y, int64_t ldy) {
    int64_t q = 0;
    auto at = [&](int64_t i) { return w0 + (size_t)(2 * i) * ws; };
    for (; q + 4 <= np; q += 4)
        f_pairs_out<T, 4>(p + q * ps, ps, at(q), ws, x0, ldx, m, K, y + 2 * q, ldy);
    for (; q + 2 <= np; q += 2)
        f_pairs_out<T, 2>(p + q * ps, ps, at(q), ws, x0, ldx, m, K, y + 2 * q, ldy);
    for (; q < np; q++) f_pairs_out<T, 1>(p + q * ps, ps, at(q), ws, x0, ldx, m, K, y + 2 * q, ldy);
}
#endif

template <smol_type T>
static void matmul_f(const uint8_t * wb, size_t w_row_bytes, int64_t K, int64_t r0, int64_t r1,
                     const uint8_t * ab, size_t act_row_bytes, int64_t n_tok, float * y,
                     int64_t ldy) {
    constexpr int NT = 6;                // tokens per prefill tile
    constexpr int64_t f_block_rows = 64; // rows per block
    auto row = [&](int64_t r) { return wb + (size_t)r * w_row_bytes; };
    auto tok = [&](int64_t t) { return ab + (size_t)t * act_row_bytes; };
    if (n_tok == 1) {
        const int64_t pf_rows = prefetch_distance(row_bytes(T, K));
        int64_t r = r0;
        for (; r + 8 <= r1; r += 8)
            f_tile<T, 8, 1>(row(r), w_row_bytes, ab, act_row_bytes, K, y + r, ldy,
                            pf_rows > 0 && r + pf_rows + 8 <= r1 ? row(r + pf_rows) : nullptr);
        for (; r < r1; r++) f_tile<T, 1, 1>(row(r), w_row_bytes, ab, act_row_bytes, K, y + r, ldy);
        return;
    }
    // Token chunks whose activations stay in L2 while the thread's row
    // blocks sweep them; in a chunk, a block of rows (in L2) meets one tile
    // of tokens (in L1) after another: each activation load feeds two FMAs.
    const int64_t tc = token_chunk(T, K);
#if defined(__AVX512F__) && defined(__AVX512DQ__)
    const int64_t K8 = K & ~(int64_t)7;
    if (K8 > 0 && 2 * K8 <= f_pack_floats) {
        const int64_t ps = 2 * K8; // floats a packed pair
        const int64_t block =
            max_i64(2, min_i64(f_block_rows, f_pack_floats / ps * 2) & ~(int64_t)7);
        alignas(64) float pack[f_pack_floats];
        for (int64_t t0 = 0; t0 < n_tok; t0 += tc) {
            const int64_t t1 = min_i64(n_tok, t0 + tc);
            for (int64_t rb = r0; rb < r1; rb += block) {
                const int64_t re = min_i64(r1, rb + block);
                const int64_t np = (re - rb) / 2;
                for (int64_t q = 0; q < np; q++)
                    pair_rows<T>(row(rb + 2 * q), row(rb + 2 * q + 1), K8, pack + q * ps);
                for (int64_t j = t0; j < t1; j += NT) {
                    const int64_t m = min_i64(NT, t1 - j);
                    f_pairs<T>(pack, ps, np, row(rb), w_row_bytes, tok(j), act_row_bytes, m, K,
                               y + j * ldy + rb, ldy);
                    if (rb + 2 * np < re)
                        f_tile_m<T, 1>(row(re - 1), w_row_bytes, tok(j), act_row_bytes, m, K,
                                       y + j * ldy + re - 1, ldy);
                }
            }
        }
        return;
    }
#endif
    for (int64_t t0 = 0; t0 < n_tok; t0 += tc) {
        const int64_t t1 = min_i64(n_tok, t0 + tc);
        for (int64_t rb = r0; rb < r1; rb += f_block_rows) {
            const int64_t re = min_i64(r1, rb + f_block_rows);
            for (int64_t j = t0; j < t1; j += NT) {
                const int64_t m = min_i64(NT, t1 - j);
                int64_t r = rb;
                for (; r + 2 <= re; r += 2)
                    f_tile_m<T, 2>(row(r), w_row_bytes, tok(j), act_row_bytes, m, K,
                                   y + j * ldy + r, ldy);
                for (; r < re; r++)
                    f_tile_m<T, 1>(row(r), w_row_bytes, tok(j), act_row_bytes, m, K,
                                   y + j * ldy + r, ldy);
            }
        }
    }
}

#endif // __AVX2__

static void matmul(smol_type t, const void * w, size_t w_row_bytes, int64_t K, int64_t r0,
                   int64_t r1, const void * act, size_t act_row_bytes, int64_t n_tok, float * y,
                   int64_t ldy) {
    if (r1 <= r0 || n_tok <= 0) return;
#if defined(__AVX2__)
    switch (t) {
    case SMOL_TYPE_Q4_0:
    case SMOL_TYPE_Q4_1:
    case SMOL_TYPE_Q8_0:
        matmul_q(t, w, w_row_bytes, K, r0, r1, act, act_row_bytes, n_tok, y, ldy);
        return;
    case SMOL_TYPE_F32:
        matmul_f<SMOL_TYPE_F32>((const uint8_t *)w, w_row_bytes, K, r0, r1, (const uint8_t *)act,
                                act_row_bytes, n_tok, y, ldy);
        return;
    case SMOL_TYPE_F16:
        matmul_f<SMOL_TYPE_F16>((const uint8_t *)w, w_row_bytes, K, r0, r1, (const uint8_t *)act,
                                act_row_bytes, n_tok, y, ldy);
        return;
    case SMOL_TYPE_BF16:
        matmul_f<SMOL_TYPE_BF16>((const uint8_t *)w, w_row_bytes, K, r0, r1, (const uint8_t *)act,
                                 act_row_bytes, n_tok, y, ldy);
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
        v::token_chunk,
        v::f32_to_f16,
        v::dot_f32,
        v::sum_sq,
        v::scale,
        v::mul,
        v::add,
        v::swiglu,
        v::softmax_exp,
        v::attn_scores,
        v::attn_values,
    };
    return k;
}

#if SMOL_CPU_SHARED

// --- the parts that exist once ------------------------------------------------------

float fp16_to_fp32(uint16_t h) {
    return generic::h2f_soft(h);
}
uint16_t fp32_to_fp16(float f) {
    return generic::f2h_soft(f);
}
float bf16_to_fp32(uint16_t h) {
    return generic::bf2f(h);
}
uint16_t fp32_to_bf16(float f) {
    return generic::f2bf(f);
}

int64_t block_elems(smol_type t) {
    switch (t) {
    case SMOL_TYPE_Q4_0:
    case SMOL_TYPE_Q4_1:
    case SMOL_TYPE_Q8_0:
        return QK;
    default:
        return 1;
    }
}

size_t row_bytes(smol_type t, int64_t n) {
    switch (t) {
    case SMOL_TYPE_F32:
        return (size_t)n * 4;
    case SMOL_TYPE_F16:
    case SMOL_TYPE_BF16:
        return (size_t)n * 2;
    default:
        return (size_t)(n / QK) * generic::block_bytes(t);
    }
}

size_t act_bytes(smol_type t, int64_t K) {
    switch (t) {
    case SMOL_TYPE_F32:
    case SMOL_TYPE_BF16:
    case SMOL_TYPE_F16:
        return (size_t)K * sizeof(float);
    default:
        return (size_t)(K / QK) * sizeof(block_q8_act);
    }
}

static bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports
    // does not know the name. The builtin checks that the OS saves AVX state.
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("bmi2");
#else
    return false;
#endif
}

static bool cpu_has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni") &&
           __builtin_cpu_supports("avx512bf16");
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

bool decode_prefetch() {
    static const bool on = [] {
        if (const int forced = cpu_prefetch_override(); forced >= 0) return forced != 0;
#if defined(__x86_64__) || defined(__i386__)
        unsigned a = 0, b = 0, c = 0, d = 0;
        // "AuthenticAMD" in EBX, EDX, ECX of leaf 0.
        return __get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541u && d == 0x69746e65u &&
               c == 0x444d4163u;
#else
        return false;
#endif
    }();
    return on;
}

static const kernels & choose_kernels() {
    const std::vector<const kernels *> avail = kernels_available();
    const kernels * best = avail.back();
    const std::string want = cpu_kernels_override();
    if (!want.empty()) {
        for (const kernels * k : avail)
            if (want == k->name) return *k;
        // A forced variant this CPU cannot run would crash; say so once.
        log_warn("SMOL_CPU_KERNELS=" + want +
                 " is not available on this CPU (use generic, avx2 or avx512 where supported); "
                 "using " +
                 best->name);
    }
    return *best;
}

const kernels & kernels_best() {
    static const kernels & k = choose_kernels();
    return k;
}

#endif // SMOL_CPU_SHARED

} // namespace smol::cpu
