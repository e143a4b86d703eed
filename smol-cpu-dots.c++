// smol-cpu-dots.c++ - the matmul of the weight types multiplied one row at a
// time: iq4_nl (and, in the generic variant, q5_0 and q5_1; blocks of 32,
// activations in block_q8_act) and the super-block types q2_K, q3_K, q4_K,
// q5_K, q6_K and iq4_xs (256 elements, activations in block_q8_K), with
// q4_K, q5_K and q6_K taking four tokens per pass over a row (AVX2), and
// q4_K and q5_K four rows per pass over a token (ARM dotprod; smol-cpu-
// matmul.c++ takes iq4_nl, q5_0 and q5_1 there), and q4_K, q5_K and q6_K
// in tiles of four rows and four tokens (ARM i8mm's smmla). Compiled once
// per instruction set, as smol-cpu-matmul.c++ (whose rules hold here),
// which hands these types to matmul_dots.
//
// Each dot product is an exact integer sum per block (per super-block: the
// sub-blocks' code products times their integer scales, and for the types
// with mins the integer mins times the activations' block sums), then one
// or two fused multiply-adds per block in block order:
//   acc = fma(isum, d_w * d_a, acc)           every type
//   acc = fma(m_w, s_a, acc)                  q5_1 (s_a = d_a * sum of codes)
//   acc = fma(msum, -(dmin_w * d_a), acc)     q2_K, q4_K, q5_K
// The generic variant's integer parts are exact, and so are the vector
// variants' (AVX2, and AVX-512 with VNNI's vpdpbusd). For q4_K the vector
// variants add a super-block's integer sums to exact totals and take the
// scalar steps above, so every variant gives the generic one's bits, and so
// does the AVX-512 prefill kernel (k_tile, 16 rows at a time); the other
// types keep a block's integer sums in eight int32 lanes and add them,
// converted, with one fused multiply-add per lane into eight float lanes,
// summed at the end in a fixed order, which q6_K's AVX-512 prefill kernel
// (q6_tile) reproduces for 16 rows at a time. Either way an output is
// computed the same way whatever batch it is in and whichever thread
// computes it.

#include "smol-cpu-kernels.h"
#include "smol-cpu-variant.h"

#include <algorithm>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
#endif

namespace smol::cpu::SMOL_CPU_VARIANT {

namespace {

#if defined(__ARM_FEATURE_DOTPROD)
// ARM's dotprod variant takes sdot's exact code products: the loops'
// integers, so the generic variant's bits.
//
// Bytes of v shifted right by n (0-7), as the loops' >> on each byte.
static inline uint8x16_t shr_u8(uint8x16_t v, int n) {
    return vshlq_u8(v, vdupq_n_s8((int8_t)-n));
}
#endif

#if defined(__ARM_FEATURE_DOTPROD)
// The lane sums of d[0..3] and of d[4..7], in order: eight groups' totals
// from their four-lane code products, by pairwise adds.
static inline void totals8(const int32x4_t d[8], int32x4_t & t03, int32x4_t & t47) {
    t03 = vpaddq_s32(vpaddq_s32(d[0], d[1]), vpaddq_s32(d[2], d[3]));
    t47 = vpaddq_s32(vpaddq_s32(d[4], d[5]), vpaddq_s32(d[6], d[7]));
}
#endif

// --- the 32-element types --------------------------------------------------------

static float dot_q5_0(const block_q5_0 * w, const block_q8_act * a, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        uint32_t qh;
        memcpy(&qh, w[b].qh, 4);
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            const int lo = ((w[b].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4)) - 16;
            const int hi = ((w[b].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - 16;
            isum += lo * a[b].qs[j] + hi * a[b].qs[j + 16];
        }
        acc = fmaf((float)isum, h2f(w[b].d) * a[b].d, acc);
    }
    return acc;
}

static float dot_q5_1(const block_q5_1 * w, const block_q8_act * a, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        uint32_t qh;
        memcpy(&qh, w[b].qh, 4);
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            const int lo = (w[b].qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
            const int hi = (w[b].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
            isum += lo * a[b].qs[j] + hi * a[b].qs[j + 16];
        }
        acc = fmaf((float)isum, h2f(w[b].d) * a[b].d, acc);
        acc = fmaf(h2f(w[b].m), a[b].s, acc);
    }
    return acc;
}

static float dot_iq4_nl(const block_iq4_nl * w, const block_q8_act * a, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int isum = 0;
        for (int j = 0; j < 16; j++)
            isum += kvalues_iq4nl[w[b].qs[j] & 0xF] * a[b].qs[j] +
                    kvalues_iq4nl[w[b].qs[j] >> 4] * a[b].qs[j + 16];
        acc = fmaf((float)isum, h2f(w[b].d) * a[b].d, acc);
    }
    return acc;
}

// --- the super-block types -------------------------------------------------------

static float dot_q2_K(const block_q2_K * w, const block_q8_K * a, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int isum = 0, msum = 0;
#if defined(__ARM_FEATURE_DOTPROD)
        // Group j (16 elements): bits 2t of qs[32h + c0 + c], h = j / 8,
        // t = (j % 8) / 2, c0 = 16 (j % 2); its code products in four lanes,
        // pairwise sums to sixteen totals, which meet the scales (low
        // nibbles) in four multiplies; the mins (high nibbles) meet the
        // activations' group sums in two widening multiplies.
        int32x4_t tot[4];
        for (int h = 0; h < 2; h++) {
            const uint8x16_t q[2] = {vld1q_u8(w[b].qs + 32 * h), vld1q_u8(w[b].qs + 32 * h + 16)};
            int32x4_t d[8];
            for (int k = 0; k < 8; k++) {
                const int t = k / 2, half = k % 2;
                const uint8x16_t c = vandq_u8(shr_u8(q[half], 2 * t), vdupq_n_u8(3));
                d[k] = vdotq_s32(vdupq_n_s32(0), vreinterpretq_s8_u8(c),
                                 vld1q_s8(a[b].qs + 16 * (8 * h + k)));
            }
            totals8(d, tot[2 * h], tot[2 * h + 1]);
        }
        const uint8x16_t sc = vld1q_u8(w[b].scales);
        const int16x8_t s16_lo =
            vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(vandq_u8(sc, vdupq_n_u8(0xF)))));
        const int16x8_t s16_hi =
            vreinterpretq_s16_u16(vmovl_high_u8(vandq_u8(sc, vdupq_n_u8(0xF))));
        int32x4_t iv = vmulq_s32(tot[0], vmovl_s16(vget_low_s16(s16_lo)));
        iv = vmlaq_s32(iv, tot[1], vmovl_high_s16(s16_lo));
        iv = vmlaq_s32(iv, tot[2], vmovl_s16(vget_low_s16(s16_hi)));
        iv = vmlaq_s32(iv, tot[3], vmovl_high_s16(s16_hi));
        isum = vaddvq_s32(iv);
        const uint8x16_t mn = vshrq_n_u8(sc, 4);
        const int16x8_t m_lo = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mn)));
        const int16x8_t m_hi = vreinterpretq_s16_u16(vmovl_high_u8(mn));
        const int16x8_t b_lo = vld1q_s16(a[b].bsums), b_hi = vld1q_s16(a[b].bsums + 8);
        int32x4_t mv = vmull_s16(vget_low_s16(m_lo), vget_low_s16(b_lo));
        mv = vmlal_high_s16(mv, m_lo, b_lo);
        mv = vmlal_s16(mv, vget_low_s16(m_hi), vget_low_s16(b_hi));
        mv = vmlal_high_s16(mv, m_hi, b_hi);
        msum = vaddvq_s32(mv);
#else
        for (int j = 0; j < 16; j++) {
            const int h = j / 8, t = (j % 8) / 2, c0 = 16 * (j % 2);
            int s = 0;
            for (int c = c0; c < c0 + 16; c++)
                s += ((w[b].qs[32 * h + c] >> (2 * t)) & 3) * a[b].qs[16 * j + c - c0];
            isum += (w[b].scales[j] & 0xF) * s;
            msum += (w[b].scales[j] >> 4) * a[b].bsums[j];
        }
#endif
        acc = fmaf((float)isum, h2f(w[b].d) * a[b].d, acc);
        acc = fmaf((float)msum, -(h2f(w[b].dmin) * a[b].d), acc);
    }
    return acc;
}

static float dot_q3_K(const block_q3_K * w, const block_q8_K * a, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int isum = 0;
#if defined(__ARM_FEATURE_DOTPROD)
        // Group j (16 elements) as q2_K's, less 4 where bit j / 2 of its
        // hmask bytes is clear; totals and scales as dot_q2_K's.
        const uint8x16_t hm[2] = {vld1q_u8(w[b].hmask), vld1q_u8(w[b].hmask + 16)};
        int32x4_t tot[4];
        for (int h = 0; h < 2; h++) {
            const uint8x16_t q[2] = {vld1q_u8(w[b].qs + 32 * h), vld1q_u8(w[b].qs + 32 * h + 16)};
            int32x4_t d[8];
            for (int k = 0; k < 8; k++) {
                const int t = k / 2, half = k % 2, u = 4 * h + t;
                const uint8x16_t lo = vandq_u8(shr_u8(q[half], 2 * t), vdupq_n_u8(3));
                const uint8x16_t set = vtstq_u8(hm[half], vdupq_n_u8((uint8_t)(1 << u)));
                const int8x16_t c = vsubq_s8(vreinterpretq_s8_u8(lo),
                                             vreinterpretq_s8_u8(vbicq_u8(vdupq_n_u8(4), set)));
                d[k] = vdotq_s32(vdupq_n_s32(0), c, vld1q_s8(a[b].qs + 16 * (8 * h + k)));
            }
            totals8(d, tot[2 * h], tot[2 * h + 1]);
        }
        int32_t sc[16];
        for (int j = 0; j < 16; j++) sc[j] = q3_K_scale(w[b].scales, j);
        int32x4_t iv = vmulq_s32(tot[0], vld1q_s32(sc));
        for (int g = 1; g < 4; g++) iv = vmlaq_s32(iv, tot[g], vld1q_s32(sc + 4 * g));
        isum = vaddvq_s32(iv);
#else
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int k = 0; k < 16; k++) {
                const int e = 16 * j + k;
                const int h = e / 128, t = (e % 128) / 32, c = e % 32;
                const int lo = (w[b].qs[32 * h + c] >> (2 * t)) & 3;
                const int q = lo - (((w[b].hmask[c] >> (e / 32)) & 1) ? 0 : 4);
                s += q * a[b].qs[e];
            }
            isum += q3_K_scale(w[b].scales, j) * s;
        }
#endif
        acc = fmaf((float)isum, h2f(w[b].d) * a[b].d, acc);
    }
    return acc;
}

#if defined(__ARM_FEATURE_DOTPROD)
// One super-block of NR rows of q4_K (bits 4) or q5_K (bits 5) with one
// token's activations: each row's isum (its sub-blocks' code products times
// their scales) and msum (their mins times the activation sums), the same
// integers as dot_k_type1's loops. A sub-block's code products land in four
// lanes (two sdot); pairwise sums give the eight sub-blocks' totals, which
// meet the scales in two multiplies and one horizontal sum. The rows share
// the activation loads.
template <int bits, int NR, class Block>
static inline void k_type1_ints(const Block * const * w, const block_q8_K & a, int * isum,
                                int * msum) {
    // t[r][0], t[r][1]: row r's totals of sub-blocks 0-3 and 4-7.
    int32x4_t t[NR][2], pair[NR];
    for (int r = 0; r < NR; r++) pair[r] = vdupq_n_s32(0);
    for (int p = 0; p < 4; p++) {
        // Sub-blocks 2p (low nibbles) and 2p + 1 (high) share 32 code bytes.
        int8x16_t x[4];
        for (int k = 0; k < 4; k++) x[k] = vld1q_s8(a.qs + 64 * p + 16 * k);
        for (int r = 0; r < NR; r++) {
            const uint8x16_t q0 = vld1q_u8(w[r]->qs + 32 * p),
                             q1 = vld1q_u8(w[r]->qs + 32 * p + 16);
            uint8x16_t v[4] = {vandq_u8(q0, vdupq_n_u8(0xF)), vandq_u8(q1, vdupq_n_u8(0xF)),
                               vshrq_n_u8(q0, 4), vshrq_n_u8(q1, 4)};
            if constexpr (bits == 5) {
                const block_q5_K * w5 = (const block_q5_K *)w[r];
                const uint8x16_t h0 = vld1q_u8(w5->qh), h1 = vld1q_u8(w5->qh + 16);
                const uint8x16_t h = vdupq_n_u8(0x10);
                for (int half = 0; half < 2; half++) {
                    const uint8x16_t bit = vdupq_n_u8((uint8_t)(1 << (2 * p + half)));
                    v[2 * half] = vorrq_u8(v[2 * half], vandq_u8(vtstq_u8(h0, bit), h));
                    v[2 * half + 1] = vorrq_u8(v[2 * half + 1], vandq_u8(vtstq_u8(h1, bit), h));
                }
            }
            const int32x4_t e =
                vdotq_s32(vdotq_s32(vdupq_n_s32(0), vreinterpretq_s8_u8(v[0]), x[0]),
                          vreinterpretq_s8_u8(v[1]), x[1]);
            const int32x4_t o =
                vdotq_s32(vdotq_s32(vdupq_n_s32(0), vreinterpretq_s8_u8(v[2]), x[2]),
                          vreinterpretq_s8_u8(v[3]), x[3]);
            const int32x4_t eo = vpaddq_s32(e, o);
            if (p % 2 == 0)
                pair[r] = eo;
            else
                t[r][p / 2] = vpaddq_s32(pair[r], eo);
        }
    }
    const int16x8_t bsum = vpaddq_s16(vld1q_s16(a.bsums), vld1q_s16(a.bsums + 8));
    for (int r = 0; r < NR; r++) {
        uint64_t sc, m;
        scales_mins_k4(w[r]->scales, sc, m);
        const int16x8_t scv = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(sc)));
        const int16x8_t mv = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(m)));
        isum[r] = vaddvq_s32(vmlaq_s32(vmulq_s32(t[r][0], vmovl_s16(vget_low_s16(scv))), t[r][1],
                                       vmovl_high_s16(scv)));
        msum[r] =
            vaddvq_s32(vmlal_high_s16(vmull_s16(vget_low_s16(bsum), vget_low_s16(mv)), bsum, mv));
    }
}

// NR rows of q4_K or q5_K with one token, as NR calls of dot_k_type1.
template <int bits, int NR, class Block>
static void dot_k_type1_rows(const Block * const * w, const block_q8_K * a, int64_t nb,
                             float * out) {
    float acc[NR];
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const Block * wb[NR];
        for (int r = 0; r < NR; r++) wb[r] = w[r] + b;
        int isum[NR], msum[NR];
        k_type1_ints<bits, NR>(wb, a[b], isum, msum);
        for (int r = 0; r < NR; r++) {
            acc[r] = fmaf((float)isum[r], h2f(wb[r]->d) * a[b].d, acc[r]);
            acc[r] = fmaf((float)msum[r], -(h2f(wb[r]->dmin) * a[b].d), acc[r]);
        }
    }
    for (int r = 0; r < NR; r++) out[r] = acc[r];
}
#endif

#if defined(__ARM_FEATURE_MATMUL_INT8)
// ARM's i8mm variant: q4_K and q5_K prefill in tiles of 4 rows and 4 tokens,
// as smol-cpu-matmul.c++'s q_tile_mmla for the 32-element types. Four smmla
// give a pair of rows and a pair of tokens a sub-block's four exact code
// products [r0 t0, r0 t1, r1 t0, r1 t1], which meet the two rows' scales
// of that sub-block (looked up into [s0, s0, s1, s1]) in one multiply-add;
// the mins meet the tokens' sub-block sums in widening multiplies and
// pairwise sums. These are the integers of k_type1_ints, whatever the
// order, and each lane then takes dot_k_type1's two float steps, so the
// outputs are its bits. A row's codes are decoded once for four tokens.
//
// Lanes [v[2h], v[2h], v[2h + 1], v[2h + 1]]: row pair h's values, each
// once for both tokens.
static inline float32x4_t k_row_pair(float32x4_t v, int h) {
    const float32x4_t u = h ? vextq_f32(v, v, 2) : v;
    return vzip1q_f32(u, u);
}

// Rows w[0..3] times tokens a[0..3], all stored: y[j * ldy + r].
template <int bits, class Block>
__attribute__((noinline)) static void k_tile_mmla(const Block * const w[4],
                                                  const block_q8_K * const a[4], int64_t nb,
                                                  float * y, int64_t ldy) {
    // Table indices of sub-block s's scale of row pair's rows 0 and 1 (bytes
    // s and 8 + s of the pair's table) into int32 lanes [s0, s0, s1, s1];
    // 0xff looks up 0.
    uint8x16_t idx[8];
    for (int s = 0; s < 8; s++) {
        const uint32_t lo = (uint32_t)s | 0xffffff00u, hi = (uint32_t)(8 + s) | 0xffffff00u;
        const uint32x4_t v = {lo, lo, hi, hi};
        idx[s] = vreinterpretq_u8_u32(v);
    }
    // acc[rp][tp]: rows 2 rp, 2 rp + 1 with tokens 2 tp, 2 tp + 1.
    float32x4_t acc[2][2];
    for (int rp = 0; rp < 2; rp++)
        for (int tp = 0; tp < 2; tp++) acc[rp][tp] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        const Block * wb[4] = {w[0] + b, w[1] + b, w[2] + b, w[3] + b};
        const block_q8_K * ak[4] = {a[0] + b, a[1] + b, a[2] + b, a[3] + b};
        // tab[rp]: the scales of rows 2 rp (bytes 0-7) and 2 rp + 1 (8-15).
        uint8x16_t tab[2];
        int16x8_t mins[4];
        for (int rp = 0; rp < 2; rp++) {
            uint64_t sc0, m0, sc1, m1;
            scales_mins_k4(wb[2 * rp]->scales, sc0, m0);
            scales_mins_k4(wb[2 * rp + 1]->scales, sc1, m1);
            tab[rp] = vcombine_u8(vcreate_u8(sc0), vcreate_u8(sc1));
            mins[2 * rp] = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(m0)));
            mins[2 * rp + 1] = vreinterpretq_s16_u16(vmovl_u8(vcreate_u8(m1)));
        }
        int32x4_t isum[2][2];
        for (int rp = 0; rp < 2; rp++)
            for (int tp = 0; tp < 2; tp++) isum[rp][tp] = vdupq_n_s32(0);
        for (int p = 0; p < 4; p++) {
            // Sub-blocks 2p (low nibbles) and 2p + 1 (high) share 32 code
            // bytes; c[rp][half][k]: elements 8k..8k+7 of that sub-block of
            // rows 2 rp and 2 rp + 1.
            int8x16_t c[2][2][4];
            for (int rp = 0; rp < 2; rp++) {
                const uint8_t * q0 = wb[2 * rp]->qs + 32 * p;
                const uint8_t * q1 = wb[2 * rp + 1]->qs + 32 * p;
                uint8x16_t z[4];
                for (int h = 0; h < 2; h++) {
                    const uint64x2_t u0 = vreinterpretq_u64_u8(vld1q_u8(q0 + 16 * h));
                    const uint64x2_t u1 = vreinterpretq_u64_u8(vld1q_u8(q1 + 16 * h));
                    z[2 * h] = vreinterpretq_u8_u64(vzip1q_u64(u0, u1));
                    z[2 * h + 1] = vreinterpretq_u8_u64(vzip2q_u64(u0, u1));
                }
                for (int k = 0; k < 4; k++) {
                    uint8x16_t lo = vandq_u8(z[k], vdupq_n_u8(0xF)), hi = vshrq_n_u8(z[k], 4);
                    if constexpr (bits == 5) {
                        // The fifth bits: bit s of qh[j] for element j of
                        // sub-block s, in the codes' byte order.
                        const block_q5_K * h0 = (const block_q5_K *)wb[2 * rp];
                        const block_q5_K * h1 = (const block_q5_K *)wb[2 * rp + 1];
                        const uint64x2_t g0 = vreinterpretq_u64_u8(vld1q_u8(h0->qh + 16 * (k / 2)));
                        const uint64x2_t g1 = vreinterpretq_u64_u8(vld1q_u8(h1->qh + 16 * (k / 2)));
                        const uint8x16_t hz =
                            vreinterpretq_u8_u64(k % 2 ? vzip2q_u64(g0, g1) : vzip1q_u64(g0, g1));
                        const uint8x16_t f = vdupq_n_u8(0x10);
                        lo = vorrq_u8(
                            lo, vandq_u8(vtstq_u8(hz, vdupq_n_u8((uint8_t)(1 << (2 * p)))), f));
                        hi = vorrq_u8(
                            hi, vandq_u8(vtstq_u8(hz, vdupq_n_u8((uint8_t)(2 << (2 * p)))), f));
                    }
                    c[rp][0][k] = vreinterpretq_s8_u8(lo);
                    c[rp][1][k] = vreinterpretq_s8_u8(hi);
                }
            }
            for (int half = 0; half < 2; half++) {
                const int s = 2 * p + half;
                // x[tp][k]: elements 8k..8k+7 of sub-block s of tokens 2 tp
                // and 2 tp + 1.
                int8x16_t x[2][4];
                for (int tp = 0; tp < 2; tp++) {
                    for (int h = 0; h < 2; h++) {
                        const int64x2_t u0 =
                            vreinterpretq_s64_s8(vld1q_s8(ak[2 * tp]->qs + 32 * s + 16 * h));
                        const int64x2_t u1 =
                            vreinterpretq_s64_s8(vld1q_s8(ak[2 * tp + 1]->qs + 32 * s + 16 * h));
                        x[tp][2 * h] = vreinterpretq_s8_s64(vzip1q_s64(u0, u1));
                        x[tp][2 * h + 1] = vreinterpretq_s8_s64(vzip2q_s64(u0, u1));
                    }
                }
                for (int rp = 0; rp < 2; rp++) {
                    const int32x4_t sc = vreinterpretq_s32_u8(vqtbl1q_u8(tab[rp], idx[s]));
                    for (int tp = 0; tp < 2; tp++) {
                        int32x4_t d = vdupq_n_s32(0);
                        for (int k = 0; k < 4; k++) d = vmmlaq_s32(d, c[rp][half][k], x[tp][k]);
                        isum[rp][tp] = vmlaq_s32(isum[rp][tp], d, sc);
                    }
                }
            }
        }
        int16x8_t bs[4];
        for (int j = 0; j < 4; j++)
            bs[j] = vpaddq_s16(vld1q_s16(ak[j]->bsums), vld1q_s16(ak[j]->bsums + 8));
        float32x4_t dw, dmin;
        {
            uint16x4_t v = vdup_n_u16(0), m = vdup_n_u16(0);
            v = vld1_lane_u16(&wb[0]->d, v, 0);
            v = vld1_lane_u16(&wb[1]->d, v, 1);
            v = vld1_lane_u16(&wb[2]->d, v, 2);
            v = vld1_lane_u16(&wb[3]->d, v, 3);
            m = vld1_lane_u16(&wb[0]->dmin, m, 0);
            m = vld1_lane_u16(&wb[1]->dmin, m, 1);
            m = vld1_lane_u16(&wb[2]->dmin, m, 2);
            m = vld1_lane_u16(&wb[3]->dmin, m, 3);
            dw = vcvt_f32_f16(vreinterpret_f16_u16(v));
            dmin = vcvt_f32_f16(vreinterpret_f16_u16(m));
        }
        for (int tp = 0; tp < 2; tp++) {
            const float d0 = ak[2 * tp]->d, d1 = ak[2 * tp + 1]->d;
            const float32x4_t da = {d0, d1, d0, d1};
            for (int rp = 0; rp < 2; rp++) {
                int32x4_t m[4];
                for (int k = 0; k < 4; k++) {
                    const int16x8_t mv = mins[2 * rp + k / 2], bv = bs[2 * tp + k % 2];
                    m[k] = vmlal_high_s16(vmull_s16(vget_low_s16(bv), vget_low_s16(mv)), bv, mv);
                }
                const int32x4_t msum = vpaddq_s32(vpaddq_s32(m[0], m[1]), vpaddq_s32(m[2], m[3]));
                const float32x4_t dd = vmulq_f32(k_row_pair(dw, rp), da);
                const float32x4_t dm = vnegq_f32(vmulq_f32(k_row_pair(dmin, rp), da));
                acc[rp][tp] = vfmaq_f32(acc[rp][tp], vcvtq_f32_s32(isum[rp][tp]), dd);
                acc[rp][tp] = vfmaq_f32(acc[rp][tp], vcvtq_f32_s32(msum), dm);
            }
        }
    }
    for (int rp = 0; rp < 2; rp++) {
        for (int tp = 0; tp < 2; tp++) {
            float o[4];
            vst1q_f32(o, acc[rp][tp]);
            for (int k = 0; k < 4; k++) y[(2 * tp + k % 2) * ldy + 2 * rp + k / 2] = o[k];
        }
    }
}

// q6_K likewise: a 16-element group's four exact code products from two
// smmla, times the rows' signed group scales (looked up into the top
// bytes of [s0, s0, s1, s1] and shifted down), the integers of dot_q6_K,
// then its one float step per lane.
__attribute__((noinline)) static void q6_tile_mmla(const block_q6_K * const w[4],
                                                   const block_q8_K * const a[4], int64_t nb,
                                                   float * y, int64_t ldy) {
    uint8x16_t idx[16];
    for (int j = 0; j < 16; j++) {
        const uint32_t lo = (uint32_t)j << 24 | 0xffffffu,
                       hi = (uint32_t)(16 + j) << 24 | 0xffffffu;
        const uint32x4_t v = {lo, lo, hi, hi};
        idx[j] = vreinterpretq_u8_u32(v);
    }
    float32x4_t acc[2][2];
    for (int rp = 0; rp < 2; rp++)
        for (int tp = 0; tp < 2; tp++) acc[rp][tp] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        const block_q6_K * wb[4] = {w[0] + b, w[1] + b, w[2] + b, w[3] + b};
        const block_q8_K * ak[4] = {a[0] + b, a[1] + b, a[2] + b, a[3] + b};
        int8x16x2_t tab[2];
        for (int rp = 0; rp < 2; rp++)
            tab[rp] = {{vld1q_s8(wb[2 * rp]->scales), vld1q_s8(wb[2 * rp + 1]->scales)}};
        int32x4_t isum[2][2];
        for (int rp = 0; rp < 2; rp++)
            for (int tp = 0; tp < 2; tp++) isum[rp][tp] = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            // zl[rp][k][e], zh[rp][k][e]: bytes 8e..8e+7 of ql's vector k
            // and qh's vector k of this half, rows 2 rp then 2 rp + 1.
            uint8x16_t zl[2][4][2], zh[2][2][2];
            for (int rp = 0; rp < 2; rp++) {
                const block_q6_K * w0 = wb[2 * rp];
                const block_q6_K * w1 = wb[2 * rp + 1];
                for (int k = 0; k < 4; k++) {
                    const uint64x2_t u0 = vreinterpretq_u64_u8(vld1q_u8(w0->ql + 64 * h + 16 * k));
                    const uint64x2_t u1 = vreinterpretq_u64_u8(vld1q_u8(w1->ql + 64 * h + 16 * k));
                    zl[rp][k][0] = vreinterpretq_u8_u64(vzip1q_u64(u0, u1));
                    zl[rp][k][1] = vreinterpretq_u8_u64(vzip2q_u64(u0, u1));
                }
                for (int k = 0; k < 2; k++) {
                    const uint64x2_t u0 = vreinterpretq_u64_u8(vld1q_u8(w0->qh + 32 * h + 16 * k));
                    const uint64x2_t u1 = vreinterpretq_u64_u8(vld1q_u8(w1->qh + 32 * h + 16 * k));
                    zh[rp][k][0] = vreinterpretq_u8_u64(vzip1q_u64(u0, u1));
                    zh[rp][k][1] = vreinterpretq_u8_u64(vzip2q_u64(u0, u1));
                }
            }
            for (int jj = 0; jj < 8; jj++) {
                const int j = 8 * h + jj;
                // x[tp][e]: elements 8e..8e+7 of group j of tokens 2 tp and
                // 2 tp + 1.
                int8x16_t x[2][2];
                for (int tp = 0; tp < 2; tp++) {
                    const int64x2_t u0 = vreinterpretq_s64_s8(vld1q_s8(ak[2 * tp]->qs + 16 * j));
                    const int64x2_t u1 =
                        vreinterpretq_s64_s8(vld1q_s8(ak[2 * tp + 1]->qs + 16 * j));
                    x[tp][0] = vreinterpretq_s8_s64(vzip1q_s64(u0, u1));
                    x[tp][1] = vreinterpretq_s8_s64(vzip2q_s64(u0, u1));
                }
                for (int rp = 0; rp < 2; rp++) {
                    // As dot_q6_K's group jj, on the zipped bytes.
                    int8x16_t c[2];
                    for (int e = 0; e < 2; e++) {
                        const uint8x16_t lo = jj < 4 ? vandq_u8(zl[rp][jj][e], vdupq_n_u8(0xF))
                                                     : vshrq_n_u8(zl[rp][jj - 4][e], 4);
                        const uint8x16_t hi =
                            vandq_u8(shr_u8(zh[rp][jj % 2][e], 2 * (jj / 2)), vdupq_n_u8(3));
                        c[e] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8(hi, 4))),
                                        vdupq_n_s8(32));
                    }
                    const int32x4_t sc =
                        vshrq_n_s32(vreinterpretq_s32_s8(vqtbl2q_s8(tab[rp], idx[j])), 24);
                    for (int tp = 0; tp < 2; tp++) {
                        const int32x4_t d =
                            vmmlaq_s32(vmmlaq_s32(vdupq_n_s32(0), c[0], x[tp][0]), c[1], x[tp][1]);
                        isum[rp][tp] = vmlaq_s32(isum[rp][tp], d, sc);
                    }
                }
            }
        }
        uint16x4_t v = vld1_dup_u16(&wb[0]->d);
        v = vld1_lane_u16(&wb[1]->d, v, 1);
        v = vld1_lane_u16(&wb[2]->d, v, 2);
        v = vld1_lane_u16(&wb[3]->d, v, 3);
        const float32x4_t dw = vcvt_f32_f16(vreinterpret_f16_u16(v));
        for (int tp = 0; tp < 2; tp++) {
            const float d0 = ak[2 * tp]->d, d1 = ak[2 * tp + 1]->d;
            const float32x4_t da = {d0, d1, d0, d1};
            for (int rp = 0; rp < 2; rp++)
                acc[rp][tp] = vfmaq_f32(acc[rp][tp], vcvtq_f32_s32(isum[rp][tp]),
                                        vmulq_f32(k_row_pair(dw, rp), da));
        }
    }
    for (int rp = 0; rp < 2; rp++) {
        for (int tp = 0; tp < 2; tp++) {
            float o[4];
            vst1q_f32(o, acc[rp][tp]);
            for (int k = 0; k < 4; k++) y[(2 * tp + k % 2) * ldy + 2 * rp + k / 2] = o[k];
        }
    }
}
#endif

// q4_K (bits 4) and q5_K (bits 5).
template <int bits, class Block>
static float dot_k_type1(const Block * w, const block_q8_K * a, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int isum = 0, msum = 0;
#if defined(__ARM_FEATURE_DOTPROD)
        const Block * wb = w + b;
        k_type1_ints<bits, 1>(&wb, a[b], &isum, &msum);
#else
        for (int s = 0; s < 8; s++) {
            uint8_t sc, m;
            scale_min_k4(s, w[b].scales, sc, m);
            const uint8_t * q = w[b].qs + 32 * (s / 2);
            const int shift = 4 * (s % 2);
            int d = 0;
            for (int j = 0; j < 32; j++) {
                int v = (q[j] >> shift) & 0xF;
                if constexpr (bits == 5) {
                    const block_q5_K * w5 = (const block_q5_K *)(w + b);
                    v |= ((w5->qh[j] >> s) & 1) << 4;
                }
                d += v * a[b].qs[32 * s + j];
            }
            isum += sc * d;
            msum += m * (a[b].bsums[2 * s] + a[b].bsums[2 * s + 1]);
        }
#endif
        acc = fmaf((float)isum, h2f(w[b].d) * a[b].d, acc);
        acc = fmaf((float)msum, -(h2f(w[b].dmin) * a[b].d), acc);
    }
    return acc;
}

static float dot_q6_K(const block_q6_K * w, const block_q8_K * a, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int isum = 0;
#if defined(__ARM_FEATURE_DOTPROD)
        // Each half of 128 elements: group jj (16 elements at r = 16 jj)
        // takes the low or high nibbles of ql's vector jj % 4 and two bits
        // of qh's vector jj % 2; its code products in four lanes, times
        // its scale into the super-block's four lanes.
        int32x4_t iv = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            uint8x16_t ql[4], qh[2];
            for (int k = 0; k < 4; k++) ql[k] = vld1q_u8(w[b].ql + 64 * h + 16 * k);
            for (int k = 0; k < 2; k++) qh[k] = vld1q_u8(w[b].qh + 32 * h + 16 * k);
            for (int jj = 0; jj < 8; jj++) {
                const int j = 8 * h + jj;
                const uint8x16_t lo =
                    jj < 4 ? vandq_u8(ql[jj], vdupq_n_u8(0xF)) : vshrq_n_u8(ql[jj - 4], 4);
                const uint8x16_t hi = vandq_u8(shr_u8(qh[jj % 2], 2 * (jj / 2)), vdupq_n_u8(3));
                const int8x16_t q =
                    vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8(hi, 4))), vdupq_n_s8(32));
                const int32x4_t d = vdotq_s32(vdupq_n_s32(0), q, vld1q_s8(a[b].qs + 16 * j));
                iv = vmlaq_n_s32(iv, d, w[b].scales[j]);
            }
        }
        isum = vaddvq_s32(iv);
#else
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int k = 0; k < 16; k++) {
                const int e = 16 * j + k;
                const int h = e / 128, r = e % 128;
                const int lo = (w[b].ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
                const int hi = (w[b].qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
                s += ((lo | (hi << 4)) - 32) * a[b].qs[e];
            }
            isum += w[b].scales[j] * s;
        }
#endif
        acc = fmaf((float)isum, h2f(w[b].d) * a[b].d, acc);
    }
    return acc;
}

static float dot_iq4_xs(const block_iq4_xs * w, const block_q8_K * a, int64_t nb) {
    float acc = 0.0f;
#if defined(__ARM_FEATURE_DOTPROD)
    const int8x16_t kv = vld1q_s8(kvalues_iq4nl);
#endif
    for (int64_t b = 0; b < nb; b++) {
        int isum = 0;
#if defined(__ARM_FEATURE_DOTPROD)
        // Sub-block s's code products in four lanes (its nibbles looked up
        // in the table); pairwise sums give the eight totals, which meet the
        // scales in two multiplies and one horizontal sum.
        int32x4_t d[8];
        for (int s = 0; s < 8; s++) {
            const uint8x16_t q = vld1q_u8(w[b].qs + 16 * s);
            const int8x16_t lo = vqtbl1q_s8(kv, vandq_u8(q, vdupq_n_u8(0xF)));
            const int8x16_t hi = vqtbl1q_s8(kv, vshrq_n_u8(q, 4));
            d[s] = vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, vld1q_s8(a[b].qs + 32 * s)), hi,
                             vld1q_s8(a[b].qs + 32 * s + 16));
        }
        int32_t sc[8];
        for (int s = 0; s < 8; s++) sc[s] = iq4_xs_scale(w[b], s);
        int32x4_t t03, t47;
        totals8(d, t03, t47);
        isum = vaddvq_s32(vmlaq_s32(vmulq_s32(t03, vld1q_s32(sc)), t47, vld1q_s32(sc + 4)));
#else
        for (int s = 0; s < 8; s++) {
            const uint8_t * q = w[b].qs + 16 * s;
            const int8_t * x = a[b].qs + 32 * s;
            int d = 0;
            for (int j = 0; j < 16; j++)
                d += kvalues_iq4nl[q[j] & 0xF] * x[j] + kvalues_iq4nl[q[j] >> 4] * x[j + 16];
            isum += iq4_xs_scale(w[b], s) * d;
        }
#endif
        acc = fmaf((float)isum, h2f(w[b].d) * a[b].d, acc);
    }
    return acc;
}

#if defined(__AVX2__)

// --- AVX2 (and AVX-512 with VNNI) -------------------------------------------------

// Sums of products of 32 unsigned bytes u and signed bytes s, in 8 int32
// lanes (4 products each). u <= 127 or |s| small enough that a pair of
// products fits int16: vpmaddubsw saturates.
static inline __m256i dot_u8_i8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// The sum of 8 int32 lanes.
static inline int hsum_i32(__m256i v) {
    const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i t = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1)));
}

// Sums of products of 32 unsigned bytes u (at most 63) and signed bytes s,
// in 8 int32 lanes, each lane's two pair sums times its int16 scale: the
// exact integers of a scaled sub-block dot product, in two instructions.
static inline __m256i dot_scaled(__m256i u, __m256i s, __m256i scale16) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scale16);
}

// The same for two signed operands (|x| <= 127): |x| times s with x's sign.
static inline __m256i dot_i8_i8(__m256i x, __m256i s) {
    return dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(s, x));
}

// 16 bytes of codes: the low nibbles (elements 0-15) in the low half, the
// high nibbles (16-31) in the high half.
static inline __m256i nibbles32(const uint8_t * qs) {
    const __m128i x = _mm_loadu_si128((const __m128i *)qs);
    const __m256i v = _mm256_insertf128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

// IQ4's 16 values, looked up by 4-bit index in every 128-bit half.
static inline __m256i iq4_values(__m256i idx) {
    const __m128i t = _mm_loadu_si128((const __m128i *)kvalues_iq4nl);
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(t), idx);
}

static inline __m256i load32(const void * p) {
    return _mm256_loadu_si256((const __m256i *)p);
}

static float dot_iq4_nl_avx2(const block_iq4_nl * w, const block_q8_act * a, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m256i s = dot_i8_i8(iq4_values(nibbles32(w[b].qs)), load32(a[b].qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[b].d) * a[b].d), _mm256_cvtepi32_ps(s), acc);
    }
    return hsum256(acc);
}

// q4_K (bits 4) and q5_K (bits 5): per pair of sub-blocks, 32 bytes of
// codes give the low nibbles (the even sub-block) and the high (the odd);
// each sub-block's sums times its scale; the mins with the activations'
// block sums, in the scalar accumulator. NT tokens share each block's
// decoding; each token's arithmetic is the one-token kernel's, so its
// result has the same bits in any batch.
template <int bits, class Block, int NT>
static void dot_k_type1_avx2(const Block * w, const block_q8_K * const a[NT], int64_t nb,
                             float * out) {
    // q4_K takes exact totals and scalar steps, as k_tile does; q5_K keeps
    // eight float lanes.
    constexpr bool totals = bits == 4;
    float acc[NT], mins[NT];
    __m256 lanes[NT];
    for (int t = 0; t < NT; t++) {
        acc[t] = mins[t] = 0.0f;
        lanes[t] = _mm256_setzero_ps();
    }
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t sc[8], m[8];
        scales_mins_k4(w[b].scales, sc, m);
        // Each min twice: one for each of its sub-block's two bsums.
        const __m256i m16 = _mm256_cvtepu8_epi16(
            _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)m),
                             _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)));
        __m256i qh = _mm256_setzero_si256();
        if constexpr (bits == 5) qh = load32(((const block_q5_K *)(w + b))->qh);
        __m256i isum[NT];
        for (int t = 0; t < NT; t++) isum[t] = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i q = load32(w[b].qs + 32 * j);
            __m256i lo = _mm256_and_si256(q, low4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
            if constexpr (bits == 5) {
                const __m256i one = _mm256_set1_epi8(1);
                lo = _mm256_or_si256(
                    lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), one), 4));
                hi = _mm256_or_si256(
                    hi,
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j + 1), one), 4));
            }
            const __m256i slo = _mm256_set1_epi16(sc[2 * j]),
                          shi = _mm256_set1_epi16(sc[2 * j + 1]);
            for (int t = 0; t < NT; t++) {
                const __m256i plo = dot_scaled(lo, load32(a[t][b].qs + 64 * j), slo);
                const __m256i phi = dot_scaled(hi, load32(a[t][b].qs + 64 * j + 32), shi);
                isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(plo, phi));
            }
        }
        const float d = h2f(w[b].d), dmin = h2f(w[b].dmin);
        for (int t = 0; t < NT; t++) {
            const int msum = hsum_i32(_mm256_madd_epi16(load32(a[t][b].bsums), m16));
            if constexpr (totals) {
                acc[t] = fmaf((float)hsum_i32(isum[t]), d * a[t][b].d, acc[t]);
                acc[t] = fmaf((float)msum, -(dmin * a[t][b].d), acc[t]);
            } else {
                lanes[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[t][b].d),
                                           _mm256_cvtepi32_ps(isum[t]), lanes[t]);
                mins[t] = fmaf((float)msum, -(dmin * a[t][b].d), mins[t]);
            }
        }
    }
    for (int t = 0; t < NT; t++) out[t] = totals ? acc[t] : hsum256(lanes[t]) + mins[t];
}

// q6_K: codes plus 32 (0-63) as the unsigned operand, their sums times the
// scales, less 32 times the scales times the activations' block sums; NT
// tokens as above.
template <int NT>
static void dot_q6_K_avx2(const block_q6_K * w, const block_q8_K * const a[NT], int64_t nb,
                          float * out) {
    __m256 acc[NT];
    for (int t = 0; t < NT; t++) acc[t] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < nb; b++) {
        __m256i isum[NT];
        for (int t = 0; t < NT; t++) isum[t] = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i qa = load32(w[b].ql + 64 * h), qb = load32(w[b].ql + 64 * h + 32);
            const __m256i qh = load32(w[b].qh + 32 * h);
            const __m256i lo[4] = {_mm256_and_si256(qa, low4), _mm256_and_si256(qb, low4),
                                   _mm256_and_si256(_mm256_srli_epi16(qa, 4), low4),
                                   _mm256_and_si256(_mm256_srli_epi16(qb, 4), low4)};
            for (int u = 0; u < 4; u++) {
                const __m256i hi2 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * u), two);
                const __m256i q = _mm256_or_si256(lo[u], _mm256_slli_epi16(hi2, 4));
                const int g = 8 * h + 2 * u; // scale groups g (bytes 0-15) and g + 1
                const __m256i scale = _mm256_setr_m128i(_mm_set1_epi16(w[b].scales[g]),
                                                        _mm_set1_epi16(w[b].scales[g + 1]));
                for (int t = 0; t < NT; t++)
                    isum[t] = _mm256_add_epi32(
                        isum[t], dot_scaled(q, load32(a[t][b].qs + 128 * h + 32 * u), scale));
            }
        }
        const float d = h2f(w[b].d);
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[b].scales));
        for (int t = 0; t < NT; t++) {
            const int corr = hsum_i32(_mm256_madd_epi16(load32(a[t][b].bsums), sc16));
            const __m256i i =
                _mm256_sub_epi32(isum[t], _mm256_setr_epi32(32 * corr, 0, 0, 0, 0, 0, 0, 0));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[t][b].d), _mm256_cvtepi32_ps(i), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) out[t] = hsum256(acc[t]);
}

// NT tokens' dot products with one row of the types whose kernels take
// several tokens at once (q4_K, q5_K, q6_K); false for the others.
template <int NT>
static bool dot_row_n(smol_type t, const void * w, const block_q8_K * const a[NT], int64_t K,
                      float * out) {
    switch (t) {
    case SMOL_TYPE_Q4_K:
        dot_k_type1_avx2<4, block_q4_K, NT>((const block_q4_K *)w, a, K / QK_K, out);
        return true;
    case SMOL_TYPE_Q5_K:
        dot_k_type1_avx2<5, block_q5_K, NT>((const block_q5_K *)w, a, K / QK_K, out);
        return true;
    case SMOL_TYPE_Q6_K:
        dot_q6_K_avx2<NT>((const block_q6_K *)w, a, K / QK_K, out);
        return true;
    default:
        return false;
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
// --- prefill: q4_K panels of 16 rows -------------------------------------------------
//
// Batches of more than a few tokens multiply a panel of 16 rows, unpacked
// once per token chunk, with NT tokens at a time: per sub-block, eight
// vpdpbusd (16 rows' codes of 4 elements, one broadcast quad of a token's
// activation codes) give each row's exact dot product, times the rows'
// scales (vpmulld) into the super-block's isum; the mins' msum takes four
// vpmaddwd of the rows' (m, m') pairs with the token's block-sum pairs; then
// the two fused multiply-adds of the scalar kernels, on 16 rows at once.
// The same integers and the same float steps as dot_k_type1: the same bits.

// Super-blocks per panel: 3 (768 elements) keep a panel within ~16 KiB of L1.
constexpr int64_t k_panel_blocks = 3;

struct k_panel {
    alignas(64) uint32_t q[k_panel_blocks][8][8][16]; // [b][s][j][row]: codes 32s + 4j..+3
    alignas(64) int32_t sc[k_panel_blocks][8][16];    // [b][s][row]
    alignas(64) int32_t mp[k_panel_blocks][4][16];    // [b][p][row]: m_2p | m_2p+1 << 16
    alignas(64) float d[k_panel_blocks][16], dmin[k_panel_blocks][16];
};

static void k_panel_fill(k_panel * p, const uint8_t * const rows[16], int64_t kb0, int64_t nbk) {
    for (int64_t b = 0; b < nbk; b++) {
        for (int r = 0; r < 16; r++) {
            const block_q4_K * w = (const block_q4_K *)rows[r] + kb0 + b;
            p->d[b][r] = h2f(w->d);
            p->dmin[b][r] = h2f(w->dmin);
            uint8_t sc[8], m[8];
            scales_mins_k4(w->scales, sc, m);
            for (int s = 0; s < 8; s++) p->sc[b][s][r] = sc[s];
            for (int q = 0; q < 4; q++)
                p->mp[b][q][r] = (int32_t)((uint32_t)m[2 * q] | ((uint32_t)m[2 * q + 1] << 16));
            for (int s = 0; s < 8; s++) {
                const __m256i v = load32(w->qs + 32 * (s / 2));
                const __m256i c =
                    _mm256_and_si256(_mm256_srli_epi16(v, 4 * (s % 2)), _mm256_set1_epi8(0x0f));
                alignas(32) uint32_t quads[8];
                _mm256_store_si256((__m256i *)quads, c);
                for (int j = 0; j < 8; j++) p->q[b][s][j][r] = quads[j];
            }
        }
    }
}

// The panel's 16 rows x NT tokens over nbk super-blocks; out[t * 16 + r],
// starting from init[t * 16 + r] where given (a later chunk of K).
template <int NT>
__attribute__((noinline)) static void k_tile(const k_panel * p, int64_t nbk,
                                             const block_q8_K * const a[NT], const float * init,
                                             float * out) {
    __m512 acc[NT];
    for (int t = 0; t < NT; t++)
        acc[t] = init ? _mm512_loadu_ps(init + t * 16) : _mm512_setzero_ps();
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t b = 0; b < nbk; b++) {
        __m512i isum[NT];
        for (int t = 0; t < NT; t++) isum[t] = _mm512_setzero_si512();
        for (int s = 0; s < 8; s++) {
            __m512i dot[NT];
            for (int t = 0; t < NT; t++) dot[t] = _mm512_setzero_si512();
            for (int j = 0; j < 8; j++) {
                const __m512i w = _mm512_load_si512((const void *)p->q[b][s][j]);
                for (int t = 0; t < NT; t++) {
                    int32_t x;
                    memcpy(&x, a[t][b].qs + 32 * s + 4 * j, 4);
                    // vpdpbusd: second operand unsigned, third signed.
                    dot[t] = _mm512_dpbusd_epi32(dot[t], w, _mm512_set1_epi32(x));
                }
            }
            const __m512i sc = _mm512_load_si512((const void *)p->sc[b][s]);
            for (int t = 0; t < NT; t++)
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dot[t], sc));
        }
        const __m512 d = _mm512_load_ps(p->d[b]), dmin = _mm512_load_ps(p->dmin[b]);
        for (int t = 0; t < NT; t++) {
            __m512i msum = _mm512_setzero_si512();
            for (int q = 0; q < 4; q++) {
                const int16_t * bs = a[t][b].bsums + 4 * q;
                const uint32_t pair = (uint16_t)(int16_t)(bs[0] + bs[1]) |
                                      ((uint32_t)(uint16_t)(int16_t)(bs[2] + bs[3]) << 16);
                msum = _mm512_add_epi32(
                    msum, _mm512_madd_epi16(_mm512_load_si512((const void *)p->mp[b][q]),
                                            _mm512_set1_epi32((int32_t)pair)));
            }
            const __m512 da = _mm512_set1_ps(a[t][b].d);
            // The maskz form: GCC 12 warns about the plain one's undefined
            // pass-through operand.
            const __m512 fi = _mm512_maskz_cvtepi32_ps((__mmask16)0xffff, isum[t]);
            const __m512 fm = _mm512_maskz_cvtepi32_ps((__mmask16)0xffff, msum);
            acc[t] = _mm512_fmadd_ps(fi, _mm512_mul_ps(d, da), acc[t]);
            acc[t] = _mm512_fmadd_ps(fm, _mm512_xor_ps(_mm512_mul_ps(dmin, da), sign), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++) _mm512_storeu_ps(out + t * 16, acc[t]);
}

// Rows r0..r1 of a q4_K matrix times n_tok tokens (more than a few), by
// panels; as matmul_q_tiles in smol-cpu-matmul.c++.
static void matmul_k_tiles(const uint8_t * wb, size_t w_row_bytes, int64_t K, int64_t r0,
                           int64_t r1, const uint8_t * ab, size_t act_row_bytes, int64_t n_tok,
                           float * y, int64_t ldy) {
    constexpr int NT = 6;
    k_panel panel;
    const int64_t nb = K / QK_K;
    const int64_t n_kc = (nb + k_panel_blocks - 1) / k_panel_blocks;
    const int64_t kc = (nb + n_kc - 1) / n_kc;
    // Tokens in chunks whose activations stay in L2 (about 256 KiB).
    const int64_t tc = std::max<int64_t>(NT, (int64_t)(262144 / act_row_bytes));
    for (int64_t t0 = 0; t0 < n_tok; t0 += tc) {
        const int64_t t1 = std::min(n_tok, t0 + tc);
        for (int64_t kb0 = 0; kb0 < nb; kb0 += kc) {
            const int64_t nbk = std::min(kc, nb - kb0);
            for (int64_t r = r0; r < r1; r += 16) {
                // Rows past r1 repeat the last row; their results are dropped.
                const uint8_t * rows[16];
                for (int i = 0; i < 16; i++)
                    rows[i] = wb + (size_t)std::min(r + i, r1 - 1) * w_row_bytes;
                k_panel_fill(&panel, rows, kb0, nbk);
                const int64_t nr = std::min<int64_t>(16, r1 - r);
                for (int64_t i = t0; i < t1; i += NT) {
                    const int64_t nt = std::min<int64_t>(NT, t1 - i);
                    const block_q8_K * a[NT];
                    for (int j = 0; j < NT; j++)
                        a[j] = (const block_q8_K *)(ab + (size_t)std::min(i + j, t1 - 1) *
                                                             act_row_bytes) +
                               kb0;
                    float out[NT * 16], init[NT * 16];
                    if (kb0 > 0) {
                        for (int64_t t = 0; t < NT; t++)
                            for (int64_t q = 0; q < 16; q++)
                                init[t * 16 + q] =
                                    t < nt && q < nr ? y[(i + t) * ldy + r + q] : 0.0f;
                    }
                    k_tile<NT>(&panel, nbk, a, kb0 > 0 ? init : nullptr, out);
                    for (int64_t t = 0; t < nt; t++)
                        for (int64_t q = 0; q < nr; q++) y[(i + t) * ldy + r + q] = out[t * 16 + q];
                }
            }
        }
    }
}
// --- prefill: q6_K panels of 16 rows ---------------------------------------------
//
// dot_q6_K_avx2 keeps a super-block's integer sums in eight int32 lanes, lane
// l holding the products of elements 4l..4l+3 of each 32-element run, times
// the run's scale for that half (lanes 0-3, 4-7), less 32 times the
// activations' scaled block sums in lane 0; each lane's float sum takes a
// fused multiply-add per super-block, and hsum256 adds the eight lanes at
// the end. The panel keeps those eight sums for 16 rows at once (one vector
// per lane, a row per vector lane): the same integers, the same float
// steps, the lanes added in hsum256's order: the same bits. A later chunk
// of K starts from the lanes kept in `lanes`, not from the finished sums.

struct q6_panel {
    alignas(64) uint32_t q[k_panel_blocks][8][8][16]; // [b][run][l][row]: codes + 32 (0-63)
    alignas(64) int32_t sc[k_panel_blocks][16][16];   // [b][group][row]
    alignas(64) int32_t scp[k_panel_blocks][8][16];   // [b][p][row]: sc_2p | sc_2p+1 << 16
    alignas(64) float d[k_panel_blocks][16];
};

static void q6_panel_fill(q6_panel * p, const uint8_t * const rows[16], int64_t kb0, int64_t nbk) {
    const __m256i low4 = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < nbk; b++) {
        for (int r = 0; r < 16; r++) {
            const block_q6_K * w = (const block_q6_K *)rows[r] + kb0 + b;
            p->d[b][r] = h2f(w->d);
            for (int g = 0; g < 16; g++) p->sc[b][g][r] = w->scales[g];
            for (int q = 0; q < 8; q++)
                p->scp[b][q][r] =
                    (int32_t)((uint32_t)(uint16_t)(int16_t)w->scales[2 * q] |
                              ((uint32_t)(uint16_t)(int16_t)w->scales[2 * q + 1] << 16));
            for (int h = 0; h < 2; h++) {
                const __m256i qa = load32(w->ql + 64 * h), qb = load32(w->ql + 64 * h + 32);
                const __m256i qh = load32(w->qh + 32 * h);
                const __m256i lo[4] = {_mm256_and_si256(qa, low4), _mm256_and_si256(qb, low4),
                                       _mm256_and_si256(_mm256_srli_epi16(qa, 4), low4),
                                       _mm256_and_si256(_mm256_srli_epi16(qb, 4), low4)};
                for (int u = 0; u < 4; u++) {
                    const __m256i hi2 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * u), two);
                    const __m256i c = _mm256_or_si256(lo[u], _mm256_slli_epi16(hi2, 4));
                    alignas(32) uint32_t quads[8];
                    _mm256_store_si256((__m256i *)quads, c);
                    for (int l = 0; l < 8; l++) p->q[b][4 * h + u][l][r] = quads[l];
                }
            }
        }
    }
}

// The panel's 16 rows x one token over nbk super-blocks, continuing the
// eight lane sums in lanes[8 * 16] (zero at the start of K).
__attribute__((noinline)) static void q6_tile(const q6_panel * p, int64_t nbk, const block_q8_K * a,
                                              float * lanes) {
    __m512 acc[8];
    for (int l = 0; l < 8; l++) acc[l] = _mm512_loadu_ps(lanes + 16 * l);
    for (int64_t b = 0; b < nbk; b++) {
        __m512i isum[8];
        for (int l = 0; l < 8; l++) isum[l] = _mm512_setzero_si512();
        for (int run = 0; run < 8; run++) { // run = 4h + u: elements 128h + 32u..
            const int g = 2 * run;          // its groups g (lanes 0-3) and g + 1 (4-7)
            const __m512i s0 = _mm512_load_si512((const void *)p->sc[b][g]);
            const __m512i s1 = _mm512_load_si512((const void *)p->sc[b][g + 1]);
            for (int l = 0; l < 8; l++) {
                int32_t x;
                memcpy(&x, a[b].qs + 32 * run + 4 * l, 4);
                const __m512i dot = _mm512_dpbusd_epi32(
                    _mm512_setzero_si512(), _mm512_load_si512((const void *)p->q[b][run][l]),
                    _mm512_set1_epi32(x));
                isum[l] = _mm512_add_epi32(isum[l], _mm512_mullo_epi32(dot, l < 4 ? s0 : s1));
            }
        }
        __m512i corr = _mm512_setzero_si512();
        for (int q = 0; q < 8; q++) {
            const uint32_t pair =
                (uint16_t)a[b].bsums[2 * q] | ((uint32_t)(uint16_t)a[b].bsums[2 * q + 1] << 16);
            corr = _mm512_add_epi32(corr,
                                    _mm512_madd_epi16(_mm512_load_si512((const void *)p->scp[b][q]),
                                                      _mm512_set1_epi32((int32_t)pair)));
        }
        isum[0] = _mm512_sub_epi32(isum[0], _mm512_mullo_epi32(corr, _mm512_set1_epi32(32)));
        const __m512 scale = _mm512_mul_ps(_mm512_load_ps(p->d[b]), _mm512_set1_ps(a[b].d));
        for (int l = 0; l < 8; l++)
            acc[l] = _mm512_fmadd_ps(scale, _mm512_maskz_cvtepi32_ps((__mmask16)0xffff, isum[l]),
                                     acc[l]);
    }
    for (int l = 0; l < 8; l++) _mm512_storeu_ps(lanes + 16 * l, acc[l]);
}

// hsum256's order over the eight lane sums, for 16 rows.
static inline __m512 q6_lanes_sum(const float * lanes) {
    auto L = [&](int l) { return _mm512_loadu_ps(lanes + 16 * l); };
    return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(L(0), L(4)), _mm512_add_ps(L(2), L(6))),
                         _mm512_add_ps(_mm512_add_ps(L(1), L(5)), _mm512_add_ps(L(3), L(7))));
}

// Rows r0..r1 of a q6_K matrix times n_tok tokens (more than a few). The
// lane sums live in malloc'd memory: a std::vector's inline code could be
// linked from another variant's copy.
static void matmul_q6_tiles(const uint8_t * wb, size_t w_row_bytes, int64_t K, int64_t r0,
                            int64_t r1, const uint8_t * ab, size_t act_row_bytes, int64_t n_tok,
                            float * y, int64_t ldy) {
    q6_panel panel;
    const int64_t nb = K / QK_K;
    const int64_t n_kc = (nb + k_panel_blocks - 1) / k_panel_blocks;
    const int64_t kc = (nb + n_kc - 1) / n_kc;
    // Tokens in chunks whose activations stay in L2 (about 256 KiB); each
    // (token, row group) keeps its eight lane sums across K's chunks.
    const int64_t tc =
        std::min<int64_t>(32, std::max<int64_t>(1, (int64_t)(262144 / act_row_bytes)));
    const int64_t n_rg = (r1 - r0 + 15) / 16;
    float * lanes = (float *)malloc((size_t)(tc * n_rg * 128) * sizeof(float));
    if (!lanes) abort();
    for (int64_t t0 = 0; t0 < n_tok; t0 += tc) {
        const int64_t t1 = std::min(n_tok, t0 + tc);
        memset(lanes, 0, (size_t)((t1 - t0) * n_rg * 128) * sizeof(float));
        for (int64_t kb0 = 0; kb0 < nb; kb0 += kc) {
            const int64_t nbk = std::min(kc, nb - kb0);
            for (int64_t r = r0; r < r1; r += 16) {
                const uint8_t * rows[16];
                for (int i = 0; i < 16; i++)
                    rows[i] = wb + (size_t)std::min(r + i, r1 - 1) * w_row_bytes;
                q6_panel_fill(&panel, rows, kb0, nbk);
                const int64_t rg = (r - r0) / 16;
                for (int64_t i = t0; i < t1; i++) {
                    const block_q8_K * a =
                        (const block_q8_K *)(ab + (size_t)i * act_row_bytes) + kb0;
                    q6_tile(&panel, nbk, a, lanes + ((i - t0) * n_rg + rg) * 128);
                }
            }
        }
        for (int64_t i = t0; i < t1; i++) {
            for (int64_t r = r0; r < r1; r += 16) {
                alignas(64) float out[16];
                _mm512_store_ps(out, q6_lanes_sum(lanes + ((i - t0) * n_rg + (r - r0) / 16) * 128));
                for (int64_t q = 0; q < std::min<int64_t>(16, r1 - r); q++)
                    y[i * ldy + r + q] = out[q];
            }
        }
    }
    free(lanes);
}

#endif

// q2_K and q3_K: 2-bit codes, element 128h + 32t + c at bits 2t of byte
// 32h + c; each 16 elements' sums times their scale. q3_K's codes plus 4
// (its high bit adds 4) are the unsigned operand, less 4 times the scales
// times the activations' block sums; q2_K's mins go to the scalar
// accumulator.
template <smol_type T, class Block>
static float dot_k_low_avx2(const Block * w, const block_q8_K * a, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < nb; b++) {
        int scale[16], corr = 0;
        for (int g = 0; g < 16; g++) {
            if constexpr (T == SMOL_TYPE_Q2_K) {
                const uint8_t sc = ((const block_q2_K *)(w + b))->scales[g];
                scale[g] = sc & 0xF;
                corr += (sc >> 4) * a[b].bsums[g];
            } else {
                scale[g] = q3_K_scale(((const block_q3_K *)(w + b))->scales, g);
                corr += scale[g] * a[b].bsums[g];
            }
        }
        __m256i hm = _mm256_setzero_si256();
        if constexpr (T == SMOL_TYPE_Q3_K) hm = load32(((const block_q3_K *)(w + b))->hmask);
        __m256i isum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q2 = load32(w[b].qs + 32 * h);
            for (int t = 0; t < 4; t++) {
                __m256i q = _mm256_and_si256(_mm256_srli_epi16(q2, 2 * t), three);
                if constexpr (T == SMOL_TYPE_Q3_K) {
                    const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + t), one);
                    q = _mm256_or_si256(q, _mm256_slli_epi16(hb, 2));
                }
                const int g = 8 * h + 2 * t;
                const __m256i sc =
                    _mm256_setr_m128i(_mm_set1_epi32(scale[g]), _mm_set1_epi32(scale[g + 1]));
                const __m256i p = dot_u8_i8(q, load32(a[b].qs + 128 * h + 32 * t));
                isum = _mm256_add_epi32(isum, _mm256_mullo_epi32(p, sc));
            }
        }
        const float dd = h2f(w[b].d) * a[b].d;
        if constexpr (T == SMOL_TYPE_Q2_K) {
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(isum), acc);
            mins = fmaf((float)corr, -(h2f(((const block_q2_K *)(w + b))->dmin) * a[b].d), mins);
        } else {
            isum = _mm256_sub_epi32(isum, _mm256_setr_epi32(4 * corr, 0, 0, 0, 0, 0, 0, 0));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(isum), acc);
        }
    }
    return hsum256(acc) + mins;
}

static float dot_iq4_xs_avx2(const block_iq4_xs * w, const block_q8_K * a, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i isum = _mm256_setzero_si256();
        for (int s = 0; s < 8; s++) {
            const __m256i v = iq4_values(nibbles32(w[b].qs + 16 * s));
            const __m256i p = dot_i8_i8(v, load32(a[b].qs + 32 * s));
            isum = _mm256_add_epi32(
                isum, _mm256_mullo_epi32(p, _mm256_set1_epi32(iq4_xs_scale(w[b], s))));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[b].d) * a[b].d), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum256(acc);
}

#endif // __AVX2__

// The dot product of one weight row of type t with one token's activations.
static float dot_row(smol_type t, const void * w, const void * act, int64_t K) {
#if defined(__AVX2__)
    switch (t) {
    case SMOL_TYPE_IQ4_NL:
        return dot_iq4_nl_avx2((const block_iq4_nl *)w, (const block_q8_act *)act, K / QK);
    case SMOL_TYPE_Q4_K:
    case SMOL_TYPE_Q5_K:
    case SMOL_TYPE_Q6_K: {
        const block_q8_K * a[1] = {(const block_q8_K *)act};
        float out;
        dot_row_n<1>(t, w, a, K, &out);
        return out;
    }
    case SMOL_TYPE_IQ4_XS:
        return dot_iq4_xs_avx2((const block_iq4_xs *)w, (const block_q8_K *)act, K / QK_K);
    case SMOL_TYPE_Q2_K:
        return dot_k_low_avx2<SMOL_TYPE_Q2_K>((const block_q2_K *)w, (const block_q8_K *)act,
                                              K / QK_K);
    case SMOL_TYPE_Q3_K:
        return dot_k_low_avx2<SMOL_TYPE_Q3_K>((const block_q3_K *)w, (const block_q8_K *)act,
                                              K / QK_K);
    default:
        break;
    }
#endif
    switch (t) {
    case SMOL_TYPE_Q5_0:
        return dot_q5_0((const block_q5_0 *)w, (const block_q8_act *)act, K / QK);
    case SMOL_TYPE_Q5_1:
        return dot_q5_1((const block_q5_1 *)w, (const block_q8_act *)act, K / QK);
    case SMOL_TYPE_IQ4_NL:
        return dot_iq4_nl((const block_iq4_nl *)w, (const block_q8_act *)act, K / QK);
    case SMOL_TYPE_Q2_K:
        return dot_q2_K((const block_q2_K *)w, (const block_q8_K *)act, K / QK_K);
    case SMOL_TYPE_Q3_K:
        return dot_q3_K((const block_q3_K *)w, (const block_q8_K *)act, K / QK_K);
    case SMOL_TYPE_Q4_K:
        return dot_k_type1<4>((const block_q4_K *)w, (const block_q8_K *)act, K / QK_K);
    case SMOL_TYPE_Q5_K:
        return dot_k_type1<5>((const block_q5_K *)w, (const block_q8_K *)act, K / QK_K);
    case SMOL_TYPE_Q6_K:
        return dot_q6_K((const block_q6_K *)w, (const block_q8_K *)act, K / QK_K);
    case SMOL_TYPE_IQ4_XS:
        return dot_iq4_xs((const block_iq4_xs *)w, (const block_q8_K *)act, K / QK_K);
    default:
        return 0.0f;
    }
}

} // namespace

void matmul_dots(smol_type t, const void * w, size_t w_row_bytes, int64_t K, int64_t r0, int64_t r1,
                 const void * act, size_t act_row_bytes, int64_t n_tok, float * y, int64_t ldy) {
    const uint8_t * wb = (const uint8_t *)w;
    const uint8_t * ab = (const uint8_t *)act;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
    if (t == SMOL_TYPE_Q4_K && n_tok > 4) {
        matmul_k_tiles(wb, w_row_bytes, K, r0, r1, ab, act_row_bytes, n_tok, y, ldy);
        return;
    }
    if (t == SMOL_TYPE_Q6_K && n_tok > 4) {
        matmul_q6_tiles(wb, w_row_bytes, K, r0, r1, ab, act_row_bytes, n_tok, y, ldy);
        return;
    }
#endif
    // Tokens in chunks whose activations stay in L1 (24 KiB, whole groups
    // of 4), each chunk across all the rows, which stay in L2 from one chunk
    // to the next: every token over every row would stream the batch's
    // activations from L2 once a row.
    const int64_t tc = std::max<int64_t>(4, (int64_t)(24576 / act_row_bytes) & ~(int64_t)3);
#if defined(__AVX2__)
    // Rows about 32 KiB ahead are asked for a row at a time: one row's blocks
    // at a time are too short a stream for the hardware prefetcher to keep
    // decode fed from memory, and 16 KiB ahead was too close to cover the
    // latency (the 1.7B's q4_K decode, BENCHMARKS.md).
    const int64_t pf_rows = std::max<int64_t>(1, (int64_t)(32768 / w_row_bytes));
#endif
    for (int64_t t0 = 0; t0 < n_tok; t0 += tc) {
        const int64_t t1 = std::min(n_tok, t0 + tc);
        int64_t r = r0;
#if defined(__ARM_FEATURE_DOTPROD)
        // q4_K and q5_K four rows at a time (each output as dot_row's),
        // with i8mm four tokens at a time too.
        if (t == SMOL_TYPE_Q4_K || t == SMOL_TYPE_Q5_K) {
            for (; r + 4 <= r1; r += 4) {
                const block_q4_K * w4[4];
                const block_q5_K * w5[4];
                for (int k = 0; k < 4; k++) {
                    w4[k] = (const block_q4_K *)(wb + (size_t)(r + k) * w_row_bytes);
                    w5[k] = (const block_q5_K *)(wb + (size_t)(r + k) * w_row_bytes);
                }
                int64_t i = t0;
#if defined(__ARM_FEATURE_MATMUL_INT8)
                for (; i + 4 <= t1; i += 4) {
                    const block_q8_K * a[4];
                    for (int j = 0; j < 4; j++)
                        a[j] = (const block_q8_K *)(ab + (size_t)(i + j) * act_row_bytes);
                    if (t == SMOL_TYPE_Q4_K)
                        k_tile_mmla<4>(w4, a, K / QK_K, y + i * ldy + r, ldy);
                    else
                        k_tile_mmla<5>(w5, a, K / QK_K, y + i * ldy + r, ldy);
                }
#endif
                for (; i < t1; i++) {
                    const block_q8_K * a = (const block_q8_K *)(ab + (size_t)i * act_row_bytes);
                    float out[4];
                    if (t == SMOL_TYPE_Q4_K)
                        dot_k_type1_rows<4, 4>(w4, a, K / QK_K, out);
                    else
                        dot_k_type1_rows<5, 4>(w5, a, K / QK_K, out);
                    for (int k = 0; k < 4; k++) y[i * ldy + r + k] = out[k];
                }
            }
        }
#endif
#if defined(__ARM_FEATURE_MATMUL_INT8)
        // q6_K in tiles of four rows and four tokens, the tokens past the
        // last tile as dot_row.
        if (t == SMOL_TYPE_Q6_K && t1 - t0 >= 4) {
            for (; r + 4 <= r1; r += 4) {
                const block_q6_K * w6[4];
                for (int k = 0; k < 4; k++)
                    w6[k] = (const block_q6_K *)(wb + (size_t)(r + k) * w_row_bytes);
                int64_t i = t0;
                for (; i + 4 <= t1; i += 4) {
                    const block_q8_K * a[4];
                    for (int j = 0; j < 4; j++)
                        a[j] = (const block_q8_K *)(ab + (size_t)(i + j) * act_row_bytes);
                    q6_tile_mmla(w6, a, K / QK_K, y + i * ldy + r, ldy);
                }
                for (; i < t1; i++)
                    for (int k = 0; k < 4; k++)
                        y[i * ldy + r + k] = dot_row(t, w6[k], ab + (size_t)i * act_row_bytes, K);
            }
        }
#endif
        for (; r < r1; r++) {
            const uint8_t * wr = wb + (size_t)r * w_row_bytes;
            int64_t i = t0;
#if defined(__AVX2__)
            if (t0 == 0 && r + pf_rows < r1) {
                const char * pf = (const char *)(wr + (size_t)pf_rows * w_row_bytes);
                for (size_t o = 0; o < w_row_bytes; o += 64) _mm_prefetch(pf + o, _MM_HINT_T0);
            }
            // Four tokens at a time share the row's decoding where the
            // type's kernel allows (the same bits as one at a time).
            constexpr int NT = 4;
            for (; i + NT <= t1; i += NT) {
                const block_q8_K * a[NT];
                for (int j = 0; j < NT; j++)
                    a[j] = (const block_q8_K *)(ab + (size_t)(i + j) * act_row_bytes);
                float out[NT];
                if (!dot_row_n<NT>(t, wr, a, K, out)) break;
                for (int j = 0; j < NT; j++) y[(i + j) * ldy + r] = out[j];
            }
#endif
            for (; i < t1; i++) y[i * ldy + r] = dot_row(t, wr, ab + (size_t)i * act_row_bytes, K);
        }
    }
}

} // namespace smol::cpu::SMOL_CPU_VARIANT
