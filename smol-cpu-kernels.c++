// smol-cpu-kernels.c++ - the CPU kernels declared in smol-cpu-kernels.h,
// but for the matmul: row conversions, activations, vector primitives,
// attention, and each variant's kernel table; the size helpers and the
// run-time choice of a variant.
//
// This source is compiled once per instruction set, with
// SMOL_CPU_VARIANT = generic, avx2 or avx512; each copy lives in the
// namespace smol::cpu::<variant> and exposes kernels_<variant>(). The scalar
// conversions, the size helpers and the run-time choice of a variant exist
// once, in the generic copy. The matmul, half of the kernels, is
// smol-cpu-matmul.c++, compiled per variant the same way; what the two share
// (inline conversions and SIMD helpers, the matmul's declaration) is
// smol-cpu-variant.h.
//
// The variant copies stay C-like (intrinsics, plain loops, functions of their
// own namespace): a std:: template or inline function instantiated here and
// in another translation unit would be merged by the linker into whichever
// copy it keeps, which could be one built for AVX-512. For the same reason
// the math calls are the C ones (expf, fabsf), never std::exp, and the
// helpers of smol-cpu-variant.h are static inline.

#include "smol-cpu-kernels.h"

#include "smol-cpu-variant.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
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
#if defined(__x86_64__) || defined(__i386__) // SMOL_CPU_X86, below
#include <cpuid.h>
#endif
#if defined(__aarch64__) // SMOL_CPU_ARM64, below
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif
#endif

namespace smol::cpu {

// The variants CMake compiles for this target: generic everywhere, the x86
// ones where the compiler targets x86.
#if defined(__x86_64__) || defined(__i386__)
#define SMOL_CPU_X86 1
#else
#define SMOL_CPU_X86 0
#endif
#if defined(__aarch64__)
#define SMOL_CPU_ARM64 1
#else
#define SMOL_CPU_ARM64 0
#endif
const kernels & kernels_generic();
#if SMOL_CPU_X86
const kernels & kernels_avx2();
const kernels & kernels_avx512();
#endif
#if SMOL_CPU_ARM64
const kernels & kernels_dotprod();
const kernels & kernels_i8mm();
#endif

namespace SMOL_CPU_VARIANT {

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
    default:
        smol::dequantize_row(t, src, dst, n); // the other types, scalar
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
    default:
        // The quantized types: smol-quant.c++'s reference quantizers, the
        // same bytes whichever variant asks.
        smol::quantize_row(t, src, dst, n);
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

// The activations of the 256-element types (ggml's q8_K): d = max|x| / 127
// kept in f32, qs = round_even(x * (127 / max|x|)), and the sums of each 16
// codes. Scalar in every variant: a token's row costs little beside the
// matmul that reads it.
static void quant_act_k(const float * x, block_q8_K * y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float amax = 0.0f;
        for (int j = 0; j < QK_K; j++) amax = fmaxf(amax, fabsf(x[j]));
        y[i].d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int j = 16 * g; j < 16 * g + 16; j++) {
                const int q = round_even(x[j] * id);
                y[i].qs[j] = (int8_t)q;
                sum += q;
            }
            y[i].bsums[g] = (int16_t)sum;
        }
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
    case SMOL_TYPE_Q5_0:
    case SMOL_TYPE_Q5_1:
    case SMOL_TYPE_Q8_0:
    case SMOL_TYPE_IQ4_NL:
        quant_act(x, (block_q8_act *)act, K / QK);
        break;
    case SMOL_TYPE_Q2_K:
    case SMOL_TYPE_Q3_K:
    case SMOL_TYPE_Q4_K:
    case SMOL_TYPE_Q5_K:
    case SMOL_TYPE_Q6_K:
    case SMOL_TYPE_IQ4_XS:
        quant_act_k(x, (block_q8_K *)act, K / QK_K);
        break;
    }
}

// --- vector primitives --------------------------------------------------------------
//
// The horizontal sums and exp256 they build on are in smol-cpu-variant.h.

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

static int64_t argmax(const float * x, int64_t n) {
    // The largest value in lanes, then the first index that holds it: two
    // passes, the second over what the first left in cache, most often
    // stopping early.
    float best = -INFINITY;
    int64_t i = 0;
#if defined(__AVX2__)
    // max_ps(x, m) is x > m ? x : m, so a NaN in x is passed over.
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    for (; i + 32 <= n; i += 32) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), m1);
        m2 = _mm256_max_ps(_mm256_loadu_ps(x + i + 16), m2);
        m3 = _mm256_max_ps(_mm256_loadu_ps(x + i + 24), m3);
    }
    const __m256 m = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    best = _mm_cvtss_f32(h);
#else
    // Lanes that compilers may vectorise.
    constexpr int lanes = 16;
    float lm[lanes];
    for (int j = 0; j < lanes; ++j) lm[j] = -INFINITY;
    for (; i + lanes <= n; i += lanes) {
        for (int j = 0; j < lanes; ++j) lm[j] = x[i + j] > lm[j] ? x[i + j] : lm[j];
    }
    for (int j = 0; j < lanes; ++j) best = lm[j] > best ? lm[j] : best;
#endif
    for (; i < n; i++) best = x[i] > best ? x[i] : best;
    if (!(best > -INFINITY)) return 0;
    int64_t k = 0;
#if defined(__AVX2__)
    const __m256 vb = _mm256_set1_ps(best);
    for (; k + 8 <= n; k += 8) {
        const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + k), vb, _CMP_EQ_OQ));
        if (eq) return k + __builtin_ctz(unsigned(eq));
    }
#endif
    for (; k < n; k++) {
        if (x[k] == best) return k;
    }
    return 0;
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

#if defined(__AVX2__)
// A block's 32 integers as four vectors of 8 floats, element order; the
// block's scale is applied by the caller.
static inline __m256 ints8_ps(__m128i x) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x));
}
static inline void block_ints(const block_q8_0 & b, __m256 v[4]) {
    for (int i = 0; i < 4; i++) v[i] = ints8_ps(_mm_loadl_epi64((const __m128i *)(b.qs + 8 * i)));
}
static inline void block_ints(const block_q4_0 & b, __m256 v[4]) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)b.qs);
    const __m128i m = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, m), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m), eight);
    v[0] = ints8_ps(lo);
    v[1] = ints8_ps(_mm_srli_si128(lo, 8));
    v[2] = ints8_ps(hi);
    v[3] = ints8_ps(_mm_srli_si128(hi, 8));
}

// Scores of G queries against each row: per block, the integers (unpacked
// once for the G) times q, then times the block's scale into the row's sum.
template <int G, typename B>
static void scores_blocks(const B * rows, size_t nb, const int32_t * cells, int32_t n,
                          const float * q, int64_t hd, float scale, float * out, int64_t ldo,
                          float * mx) {
    for (int32_t j = 0; j < n; j++) {
        const B * row = rows + (size_t)cells[j] * nb;
        __m256 acc[G];
        for (int g = 0; g < G; g++) acc[g] = _mm256_setzero_ps();
        for (size_t b = 0; b < nb; b++) {
            __m256 v[4];
            block_ints(row[b], v);
            const __m256 d = _mm256_set1_ps(h2f(row[b].d));
            for (int g = 0; g < G; g++) {
                const float * qb = q + g * hd + 32 * b;
                __m256 s = _mm256_mul_ps(v[0], _mm256_loadu_ps(qb));
                for (int i = 1; i < 4; i++)
                    s = _mm256_fmadd_ps(v[i], _mm256_loadu_ps(qb + 8 * i), s);
                acc[g] = _mm256_fmadd_ps(d, s, acc[g]);
            }
        }
        for (int g = 0; g < G; g++) {
            const float sc = hsum256(acc[g]) * scale;
            out[g * ldo + j] = sc;
            mx[g] = mx[g] > sc ? mx[g] : sc;
        }
    }
}

template <typename B>
static void scores_blocks_all(const B * rows, size_t nb, const int32_t * cells, int32_t n,
                              const float * q, int64_t hd, int nq, float scale, float * out,
                              int64_t ldo, float * mx) {
    for (int g = 0; g < nq;) {
        const int left = nq - g;
        const float * qg = q + g * hd;
        if (left >= 3) {
            scores_blocks<3>(rows, nb, cells, n, qg, hd, scale, out + g * ldo, ldo, mx + g);
            g += 3;
        } else if (left == 2) {
            scores_blocks<2>(rows, nb, cells, n, qg, hd, scale, out + g * ldo, ldo, mx + g);
            g += 2;
        } else {
            scores_blocks<1>(rows, nb, cells, n, qg, hd, scale, out + g * ldo, ldo, mx + g);
            g += 1;
        }
    }
}

// acc_g += (p_g * scale) * integers, block by block, in increasing j; a
// block's integers unpacked once for every query.
template <typename B>
static void values_blocks(const B * rows, size_t nb, const int32_t * cells, const float * p,
                          int64_t ldp, int nq, int32_t n, int64_t hd, float * acc) {
    for (int32_t j = 0; j < n; j++) {
        const B * row = rows + (size_t)cells[j] * nb;
        bool any = false;
        for (int g = 0; g < nq; g++) any |= p[g * ldp + j] != 0.0f;
        if (!any) continue;
        for (size_t b = 0; b < nb; b++) {
            __m256 v[4];
            block_ints(row[b], v);
            const float d = h2f(row[b].d);
            for (int g = 0; g < nq; g++) {
                const float pj = p[g * ldp + j];
                if (pj == 0.0f) continue;
                const __m256 w = _mm256_set1_ps(pj * d);
                float * ab = acc + g * hd + 32 * b;
                for (int i = 0; i < 4; i++)
                    _mm256_storeu_ps(ab + 8 * i,
                                     _mm256_fmadd_ps(w, v[i], _mm256_loadu_ps(ab + 8 * i)));
            }
        }
    }
}
#endif

static void attn_scores_q(smol_type t, const void * k, const int32_t * cells, int32_t n, int64_t hd,
                          const float * q, int nq, float scale, float * out, int64_t ldo,
                          float * mx) {
    for (int g = 0; g < nq; g++) mx[g] = -INFINITY;
#if defined(__AVX2__)
    const size_t nb = (size_t)hd / QK;
    if (t == SMOL_TYPE_Q8_0)
        return scores_blocks_all((const block_q8_0 *)k, nb, cells, n, q, hd, nq, scale, out, ldo,
                                 mx);
    return scores_blocks_all((const block_q4_0 *)k, nb, cells, n, q, hd, nq, scale, out, ldo, mx);
#else
    const size_t rb = smol::type_row_bytes(t, hd);
    float row[1024];
    for (int32_t j = 0; j < n; j++) {
        row_to_f32(t, (const uint8_t *)k + (size_t)cells[j] * rb, row, hd);
        for (int g = 0; g < nq; g++) {
            const float s = dot_f32(row, q + g * hd, hd) * scale;
            out[g * ldo + j] = s;
            mx[g] = mx[g] > s ? mx[g] : s;
        }
    }
#endif
}

static void attn_values_q(smol_type t, const void * v, const int32_t * cells, const float * p,
                          int64_t ldp, int nq, int32_t n, int64_t hd, float * acc) {
    for (int64_t i = 0; i < nq * hd; i++) acc[i] = 0.0f;
#if defined(__AVX2__)
    const size_t nb = (size_t)hd / QK;
    if (t == SMOL_TYPE_Q8_0)
        return values_blocks((const block_q8_0 *)v, nb, cells, p, ldp, nq, n, hd, acc);
    return values_blocks((const block_q4_0 *)v, nb, cells, p, ldp, nq, n, hd, acc);
#else
    const size_t rb = smol::type_row_bytes(t, hd);
    float row[1024];
    for (int32_t j = 0; j < n; j++) {
        bool any = false;
        for (int g = 0; g < nq; g++) any |= p[g * ldp + j] != 0.0f;
        if (!any) continue;
        row_to_f32(t, (const uint8_t *)v + (size_t)cells[j] * rb, row, hd);
        for (int g = 0; g < nq; g++) {
            const float pj = p[g * ldp + j];
            if (pj == 0.0f) continue;
            float * a = acc + g * hd;
            for (int64_t d = 0; d < hd; d++) a[d] += pj * row[d];
        }
    }
#endif
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
        v::argmax,
        v::attn_scores,
        v::attn_values,
        v::attn_scores_q,
        v::attn_values_q,
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
    const int64_t n = smol::type_block_elems(t);
    return n > 0 ? n : 1;
}

size_t row_bytes(smol_type t, int64_t n) {
    return smol::type_row_bytes(t, n);
}

size_t act_bytes(smol_type t, int64_t K) {
    switch (t) {
    case SMOL_TYPE_F32:
    case SMOL_TYPE_BF16:
    case SMOL_TYPE_F16:
        return (size_t)K * sizeof(float);
    default:
        return block_elems(t) == QK_K ? (size_t)(K / QK_K) * sizeof(block_q8_K)
                                      : (size_t)(K / QK) * sizeof(block_q8_act);
    }
}

#if SMOL_CPU_X86
static bool cpu_has_avx2() {
    __builtin_cpu_init();
    // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports
    // does not know the name. The builtin checks that the OS saves AVX state.
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("bmi2");
}

static bool cpu_has_avx512() {
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni") &&
           __builtin_cpu_supports("avx512bf16");
}
#endif

std::vector<const kernels *> kernels_available() {
    std::vector<const kernels *> v;
    v.push_back(&kernels_generic());
#if SMOL_CPU_X86
    if (cpu_has_avx2()) v.push_back(&kernels_avx2());
    if (cpu_has_avx512()) v.push_back(&kernels_avx512());
#endif
#if SMOL_CPU_ARM64
    // sdot and udot (ARMv8.2 and later: Pi 5, Graviton 2 and up, Apple M).
    const bool dotprod = getauxval(AT_HWCAP) & HWCAP_ASIMDDP;
    if (dotprod) v.push_back(&kernels_dotprod());
    // smmla (ARMv8.6, optional from 8.2: Graviton 3 and up, Apple M2 and up).
    if (dotprod && (getauxval(AT_HWCAP2) & HWCAP2_I8MM)) v.push_back(&kernels_i8mm());
#endif
    return v;
}

bool decode_prefetch() {
    static const bool on = [] {
        if (const int forced = cpu_prefetch_override(); forced >= 0) return forced != 0;
#if SMOL_CPU_X86
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
                 " is not available on this CPU (use generic, avx2 or avx512 on x86, "
                 "dotprod or i8mm on ARM, where supported); "
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
