// smol-cpu-matmul.c++ - the matmul of one instruction set: the portable
// path, the AVX2 and AVX-512 kernels for quantized and float weights, and the
// entry point kernels::matmul.
//
// Compiled once per variant with the same flags and SMOL_CPU_VARIANT as
// smol-cpu-kernels.c++, into the same object library; it is a file of its
// own because the matmul is half of the kernels and changes for other
// reasons than the conversions and attention. The rules of that file hold
// here: C-like code in the namespace smol::cpu::<variant>, static functions
// (but for matmul, whose name is its variant's own) and C math, so nothing
// built for one instruction set can be merged with another's copy. What
// both files use is in smol-cpu-variant.h.

#include "smol-cpu-kernels.h"
#include "smol-cpu-variant.h"

#include <stdint.h>
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
#endif

namespace smol::cpu::SMOL_CPU_VARIANT {

// --- matmul: the portable path ----------------------------------------------------
//
// Every variant computes a quantized dot product the same way, as ggml does:
// per block of 32 an exact integer dot product isum of the weight values
// (q - 8 for q4_0, q for q4_1, w for q8_0) with the activation codes, then
// in float  d_w * d_a * isum,  plus  m * s_a  for q4_1. Only the order of
// the float additions differs between variants.

#if defined(__ARM_FEATURE_DOTPROD)
// ARM's dot-product variant: a block's integer dot product with sdot, four
// products a lane, summed across the vector: the same exact integer as the
// loops below, so the same float steps give the generic variant's bits.
static inline int32_t sdot32(int8x16_t w0, int8x16_t w1, const int8_t * a) {
    const int32x4_t s = vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, vld1q_s8(a)), w1, vld1q_s8(a + 16));
    return vaddvq_s32(s);
}
#endif

static float dot_q_scalar(smol_type t, const uint8_t * w, const block_q8_act * a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int isum = 0;
        if (t == SMOL_TYPE_Q8_0) {
            const block_q8_0 * blk = (const block_q8_0 *)w + b;
#if defined(__ARM_FEATURE_DOTPROD)
            isum = sdot32(vld1q_s8(blk->qs), vld1q_s8(blk->qs + 16), a[b].qs);
#else
            for (int j = 0; j < QK; j++) isum += blk->qs[j] * a[b].qs[j];
#endif
            sum += (float)isum * (h2f(blk->d) * a[b].d);
        } else if (t == SMOL_TYPE_Q4_0) {
            const block_q4_0 * blk = (const block_q4_0 *)w + b;
#if defined(__ARM_FEATURE_DOTPROD)
            const uint8x16_t q = vld1q_u8(blk->qs);
            const int8x16_t eight = vdupq_n_s8(8);
            isum = sdot32(vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f))), eight),
                          vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), eight), a[b].qs);
#else
            for (int j = 0; j < 16; j++)
                isum += ((blk->qs[j] & 0x0f) - 8) * a[b].qs[j] +
                        ((blk->qs[j] >> 4) - 8) * a[b].qs[j + 16];
#endif
            sum += (float)isum * (h2f(blk->d) * a[b].d);
        } else {
            const block_q4_1 * blk = (const block_q4_1 *)w + b;
#if defined(__ARM_FEATURE_DOTPROD)
            const uint8x16_t q = vld1q_u8(blk->qs);
            isum = sdot32(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f))),
                          vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), a[b].qs);
#else
            for (int j = 0; j < 16; j++)
                isum += (blk->qs[j] & 0x0f) * a[b].qs[j] + (blk->qs[j] >> 4) * a[b].qs[j + 16];
#endif
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

#if defined(__ARM_FEATURE_DOTPROD)

// --- matmul: ARM dotprod, the 32-element types -------------------------------------
//
// Four or eight rows at a time, each of up to four tokens: a block's codes
// are unpacked once for the rows into signed bytes, two sdot per row and
// token give four int32 lanes whose pairwise sums (two addp) are the four
// rows' exact integer dot products, and the block's float steps run on the
// four rows as the four lanes of one vector. Each lane takes the very steps
// the generic variant takes for its row, so the outputs are its bits:
//   q4_0, q8_0:        acc = acc + isum * (d_w * d_a)
//   q4_1:              acc = acc + (isum * (d_w * d_a) + m_w * s_a)
//   q5_0, iq4_nl:      acc = fma(isum, d_w * d_a, acc)
//   q5_1:              acc = fma(m_w, s_a, fma(isum, d_w * d_a, acc))
// (dot_q_scalar, and dot_q5_0, dot_q5_1, dot_iq4_nl in smol-cpu-dots.c++).

// 0x10 in byte j where bit 16 * half + j of qh is set: a q5 block's fifth
// bits for elements 16 * half .. 16 * half + 15.
static inline uint8x16_t q5_fifth_bits(uint32_t qh, int half) {
    static const uint8_t idx[2][16] = {{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
                                       {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3}};
    const uint8x16_t spread =
        vqtbl1q_u8(vreinterpretq_u8_u32(vdupq_n_u32(qh)), vld1q_u8(idx[half]));
    const uint8x16_t bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ull));
    return vandq_u8(vtstq_u8(spread, bit), vdupq_n_u8(0x10));
}

// A block's 32 weight codes as signed bytes (elements 0-15 in lo, 16-31 in
// hi), whose dot product with the activation codes is the block's isum.
template <smol_type T>
static inline void block_codes(const uint8_t * blk, int8x16_t & lo, int8x16_t & hi) {
    if constexpr (T == SMOL_TYPE_Q8_0) {
        lo = vld1q_s8((const int8_t *)blk + 2);
        hi = vld1q_s8((const int8_t *)blk + 18);
    } else {
        constexpr int qs_at = T == SMOL_TYPE_Q4_1   ? 4
                              : T == SMOL_TYPE_Q5_0 ? 6
                              : T == SMOL_TYPE_Q5_1 ? 8
                                                    : 2;
        const uint8x16_t q = vld1q_u8(blk + qs_at);
        uint8x16_t l = vandq_u8(q, vdupq_n_u8(0x0f)), h = vshrq_n_u8(q, 4);
        if constexpr (T == SMOL_TYPE_Q5_0 || T == SMOL_TYPE_Q5_1) {
            uint32_t qh;
            memcpy(&qh, blk + qs_at - 4, 4);
            l = vorrq_u8(l, q5_fifth_bits(qh, 0));
            h = vorrq_u8(h, q5_fifth_bits(qh, 1));
        }
        if constexpr (T == SMOL_TYPE_IQ4_NL) {
            const int8x16_t kv = vld1q_s8(kvalues_iq4nl);
            lo = vqtbl1q_s8(kv, l);
            hi = vqtbl1q_s8(kv, h);
        } else {
            constexpr int8_t off = T == SMOL_TYPE_Q4_0 ? 8 : T == SMOL_TYPE_Q5_0 ? 16 : 0;
            lo = vsubq_s8(vreinterpretq_s8_u8(l), vdupq_n_s8(off));
            hi = vsubq_s8(vreinterpretq_s8_u8(h), vdupq_n_s8(off));
        }
    }
}

// The bytes of a block of the 32-element type T.
template <smol_type T> static constexpr size_t q_block_bytes() {
    return T == SMOL_TYPE_Q8_0   ? sizeof(block_q8_0)
           : T == SMOL_TYPE_Q4_1 ? sizeof(block_q4_1)
           : T == SMOL_TYPE_Q5_0 ? sizeof(block_q5_0)
           : T == SMOL_TYPE_Q5_1 ? sizeof(block_q5_1)
                                 : sizeof(block_q4_0);
}

// One block's float steps on four outputs (the list above): isum, d_w * d_a
// and, for q4_1 and q5_1, m_w and s_a, lane by lane.
template <smol_type T>
static inline float32x4_t block_step(float32x4_t c, float32x4_t isum, float32x4_t dd, float32x4_t m,
                                     float32x4_t s) {
    if constexpr (T == SMOL_TYPE_Q4_0 || T == SMOL_TYPE_Q8_0)
        return vaddq_f32(c, vmulq_f32(isum, dd));
    if constexpr (T == SMOL_TYPE_Q4_1)
        return vaddq_f32(c, vaddq_f32(vmulq_f32(isum, dd), vmulq_f32(m, s)));
    c = vfmaq_f32(c, isum, dd);
    if constexpr (T == SMOL_TYPE_Q5_1) c = vfmaq_f32(c, m, s);
    return c;
}

// Four f16 values, one from each of four blocks at byte offset o.
static inline float32x4_t halves4(const uint8_t * const b[4], size_t o) {
    uint16x4_t v = vld1_dup_u16((const uint16_t *)(b[0] + o));
    v = vld1_lane_u16((const uint16_t *)(b[1] + o), v, 1);
    v = vld1_lane_u16((const uint16_t *)(b[2] + o), v, 2);
    v = vld1_lane_u16((const uint16_t *)(b[3] + o), v, 3);
    return vcvt_f32_f16(vreinterpret_f16_u16(v));
}

// A q8_0 block at p, its scale into lane L of d and its codes into lo and
// hi, p advanced to the next block: two loads and no address arithmetic
// (the compiler's code took five instructions more a row, most of them
// reloading spilled row pointers).
template <int L>
static inline void q8_0_next(const uint8_t *& p, uint16x4_t & d, int8x16_t & lo, int8x16_t & hi) {
    const auto & blk = *(const uint8_t(*)[sizeof(block_q8_0)])p;
    if constexpr (L == 0)
        __asm__("ld1r {%[d].4h}, [%[p]], #2\n\t"
                "ldp %q[lo], %q[hi], [%[p]], #32"
                : [p] "+r"(p), [d] "=w"(d), [lo] "=w"(lo), [hi] "=w"(hi)
                : "m"(blk));
    else
        __asm__("ld1 {%[d].h}[%[l]], [%[p]], #2\n\t"
                "ldp %q[lo], %q[hi], [%[p]], #32"
                : [p] "+r"(p), [d] "+w"(d), [lo] "=w"(lo), [hi] "=w"(hi)
                : [l] "i"(L), "m"(blk));
}

// Rows w[0..4G) (of which the first n are stored) times tokens i0..i0+NT-1,
// G vectors of four rows.
//
// With few outputs (G * NT <= 2: decode) a row's sdot accumulator is not
// zeroed a block but runs through the blocks: the lane sums after block b
// are the row's running total (modulo 2^32, as sdot and addp wrap), and
// the block's sum is the difference from the last block's, exact as it
// fits in an int32. That leaves, per block of four rows, eight sdot, three
// addp and one subtraction for the four integers.
template <smol_type T, int G, int NT>
static inline void q_rows(const uint8_t * const * w, int n, int64_t nb, const uint8_t * ab,
                          size_t act_row_bytes, int64_t i0, float * y, int64_t ldy) {
    constexpr size_t bs = q_block_bytes<T>();
    constexpr bool running = G * NT <= 2;
    float32x4_t acc[G][NT];
    // s: the rows' accumulators; tot: their lane sums at the last block.
    int32x4_t s[G][NT][4], tot[G][NT];
    for (int g = 0; g < G; g++)
        for (int j = 0; j < NT; j++) {
            acc[g][j] = vdupq_n_f32(0.0f);
            tot[g][j] = vdupq_n_s32(0);
            for (int r = 0; r < 4; r++) s[g][j][r] = vdupq_n_s32(0);
        }
    const uint8_t * p[4 * G];
    for (int r = 0; r < 4 * G; r++) p[r] = w[r];
    for (int64_t b = 0; b < nb; b++) {
        int8x16_t lo[4 * G], hi[4 * G];
        float32x4_t dw[G], mw[G];
        if constexpr (T == SMOL_TYPE_Q8_0) {
            for (int g = 0; g < G; g++) {
                uint16x4_t d;
                q8_0_next<0>(p[4 * g], d, lo[4 * g], hi[4 * g]);
                q8_0_next<1>(p[4 * g + 1], d, lo[4 * g + 1], hi[4 * g + 1]);
                q8_0_next<2>(p[4 * g + 2], d, lo[4 * g + 2], hi[4 * g + 2]);
                q8_0_next<3>(p[4 * g + 3], d, lo[4 * g + 3], hi[4 * g + 3]);
                dw[g] = vcvt_f32_f16(vreinterpret_f16_u16(d));
                mw[g] = vdupq_n_f32(0.0f);
            }
        } else {
            for (int r = 0; r < 4 * G; r++) block_codes<T>(p[r], lo[r], hi[r]);
            for (int g = 0; g < G; g++) {
                dw[g] = halves4(p + 4 * g, 0);
                mw[g] = vdupq_n_f32(0.0f);
                if constexpr (T == SMOL_TYPE_Q4_1 || T == SMOL_TYPE_Q5_1)
                    mw[g] = halves4(p + 4 * g, 2);
            }
            for (int r = 0; r < 4 * G; r++) p[r] += bs;
        }
        for (int j = 0; j < NT; j++) {
            const block_q8_act * a =
                (const block_q8_act *)(ab + (size_t)(i0 + j) * act_row_bytes) + b;
            const int8x16_t a0 = vld1q_s8(a->qs), a1 = vld1q_s8(a->qs + 16);
            for (int g = 0; g < G; g++) {
                int32x4_t * sg = s[g][j];
                for (int r = 0; r < 4; r++)
                    sg[r] =
                        vdotq_s32(vdotq_s32(running ? sg[r] : vdupq_n_s32(0), lo[4 * g + r], a0),
                                  hi[4 * g + r], a1);
                const int32x4_t t = vpaddq_s32(vpaddq_s32(sg[0], sg[1]), vpaddq_s32(sg[2], sg[3]));
                int32x4_t isum = t;
                if constexpr (running) {
                    isum = vsubq_s32(t, tot[g][j]);
                    tot[g][j] = t;
                }
                const float32x4_t dd = vmulq_n_f32(dw[g], a->d);
                acc[g][j] =
                    block_step<T>(acc[g][j], vcvtq_f32_s32(isum), dd, mw[g], vdupq_n_f32(a->s));
            }
        }
    }
    for (int j = 0; j < NT; j++) {
        float out[4 * G];
        for (int g = 0; g < G; g++) vst1q_f32(out + 4 * g, acc[g][j]);
        for (int r = 0; r < n; r++) y[(i0 + j) * ldy + r] = out[r];
    }
}

#if defined(__ARM_FEATURE_MATMUL_INT8)
// ARM's i8mm variant: prefill in tiles of 4 rows and 4 tokens. smmla
// multiplies a 2 x 8 matrix of codes by an 8 x 2 one into a 2 x 2 int32
// tile; four of them cover a block's 32 elements, so a pair of rows and a
// pair of tokens get their four exact block dot products (the same
// integers) in the lanes [r0 t0, r0 t1, r1 t0, r1 t1], and each lane then
// takes its row's generic float steps with its own d_w * d_a.

// Lanes [v[2h], v[2h], v[2h + 1], v[2h + 1]]: row pair h's values, each
// once for both tokens.
static inline float32x4_t row_pair(float32x4_t v, int h) {
    const float32x4_t u = h ? vextq_f32(v, v, 2) : v;
    return vzip1q_f32(u, u);
}

template <smol_type T>
static inline void q_tile_mmla(const uint8_t * const w[4], int n, int64_t nb, const uint8_t * ab,
                               size_t act_row_bytes, int64_t i0, int nt, float * y, int64_t ldy) {
    constexpr size_t bs = q_block_bytes<T>();
    // Past the last token the last token again, computed and not stored.
    const block_q8_act * a[4];
    for (int j = 0; j < 4; j++)
        a[j] = (const block_q8_act *)(ab + (size_t)(i0 + (j < nt ? j : nt - 1)) * act_row_bytes);
    // acc[rp][tp]: rows 2 rp, 2 rp + 1 with tokens 2 tp, 2 tp + 1.
    float32x4_t acc[2][2];
    for (int rp = 0; rp < 2; rp++)
        for (int tp = 0; tp < 2; tp++) acc[rp][tp] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t * blk[4] = {w[0] + b * bs, w[1] + b * bs, w[2] + b * bs, w[3] + b * bs};
        // wq[rp][k]: elements 8k..8k+7 of rows 2 rp and 2 rp + 1.
        int64x2_t wq[2][4];
        for (int rp = 0; rp < 2; rp++) {
            int8x16_t lo0, hi0, lo1, hi1;
            block_codes<T>(blk[2 * rp], lo0, hi0);
            block_codes<T>(blk[2 * rp + 1], lo1, hi1);
            const int64x2_t l0 = vreinterpretq_s64_s8(lo0), l1 = vreinterpretq_s64_s8(lo1);
            const int64x2_t h0 = vreinterpretq_s64_s8(hi0), h1 = vreinterpretq_s64_s8(hi1);
            wq[rp][0] = vzip1q_s64(l0, l1);
            wq[rp][1] = vzip2q_s64(l0, l1);
            wq[rp][2] = vzip1q_s64(h0, h1);
            wq[rp][3] = vzip2q_s64(h0, h1);
        }
        // aq[tp][k]: elements 8k..8k+7 of tokens 2 tp and 2 tp + 1.
        int64x2_t aq[2][4];
        for (int tp = 0; tp < 2; tp++) {
            const int8_t * x0 = a[2 * tp][b].qs;
            const int8_t * x1 = a[2 * tp + 1][b].qs;
            for (int k = 0; k < 2; k++) {
                const int64x2_t u0 = vreinterpretq_s64_s8(vld1q_s8(x0 + 16 * k));
                const int64x2_t u1 = vreinterpretq_s64_s8(vld1q_s8(x1 + 16 * k));
                aq[tp][2 * k] = vzip1q_s64(u0, u1);
                aq[tp][2 * k + 1] = vzip2q_s64(u0, u1);
            }
        }
        const float32x4_t dw = halves4(blk, 0);
        float32x4_t mw = vdupq_n_f32(0.0f);
        if constexpr (T == SMOL_TYPE_Q4_1 || T == SMOL_TYPE_Q5_1) mw = halves4(blk, 2);
        for (int tp = 0; tp < 2; tp++) {
            // [x t0, x t1, x t0, x t1] of the tokens' d and s.
            const float da0 = a[2 * tp][b].d, da1 = a[2 * tp + 1][b].d;
            const float sa0 = a[2 * tp][b].s, sa1 = a[2 * tp + 1][b].s;
            const float32x4_t da = {da0, da1, da0, da1}, sa = {sa0, sa1, sa0, sa1};
            for (int rp = 0; rp < 2; rp++) {
                int32x4_t i = vdupq_n_s32(0);
                for (int k = 0; k < 4; k++)
                    i = vmmlaq_s32(i, vreinterpretq_s8_s64(wq[rp][k]),
                                   vreinterpretq_s8_s64(aq[tp][k]));
                const float32x4_t isum = vcvtq_f32_s32(i);
                const float32x4_t dd = vmulq_f32(row_pair(dw, rp), da);
                acc[rp][tp] = block_step<T>(acc[rp][tp], isum, dd, row_pair(mw, rp), sa);
            }
        }
    }
    for (int rp = 0; rp < 2; rp++) {
        for (int tp = 0; tp < 2; tp++) {
            float o[4];
            vst1q_f32(o, acc[rp][tp]);
            for (int k = 0; k < 4; k++) {
                const int r = 2 * rp + k / 2, j = 2 * tp + k % 2;
                if (r < n && j < nt) y[(i0 + j) * ldy + r] = o[k];
            }
        }
    }
}
#endif

template <smol_type T>
static void matmul_q_neon(const uint8_t * wb, size_t w_row_bytes, int64_t K, int64_t r0, int64_t r1,
                          const uint8_t * ab, size_t act_row_bytes, int64_t n_tok, float * y,
                          int64_t ldy) {
    const int64_t nb = K / QK;
    // Tokens in chunks whose activations stay in L1 (about 24 KiB), each
    // chunk across all the rows, eight at a time: four tokens take the rows
    // as two sets of four (the registers hold no more), one or two tokens
    // all eight at once, sharing their activation loads.
    const int64_t tc = max_i64(4, (int64_t)(24576 / act_row_bytes) & ~(int64_t)3);
    for (int64_t t0 = 0; t0 < n_tok; t0 += tc) {
        const int64_t t1 = min_i64(n_tok, t0 + tc);
        for (int64_t r = r0; r < r1; r += 8) {
            const int n = (int)min_i64(8, r1 - r);
            const uint8_t * w[8];
            // Past the last row the last row again, computed and not stored.
            for (int i = 0; i < 8; i++) w[i] = wb + (size_t)(r + (i < n ? i : n - 1)) * w_row_bytes;
            const int n_lo = n < 4 ? n : 4, n_hi = n - n_lo;
            int64_t i = t0;
            for (; i + 4 <= t1; i += 4) {
#if defined(__ARM_FEATURE_MATMUL_INT8)
                q_tile_mmla<T>(w, n_lo, nb, ab, act_row_bytes, i, 4, y + r, ldy);
                if (n_hi > 0)
                    q_tile_mmla<T>(w + 4, n_hi, nb, ab, act_row_bytes, i, 4, y + r + 4, ldy);
#else
                q_rows<T, 1, 4>(w, n_lo, nb, ab, act_row_bytes, i, y + r, ldy);
                if (n_hi > 0)
                    q_rows<T, 1, 4>(w + 4, n_hi, nb, ab, act_row_bytes, i, y + r + 4, ldy);
#endif
            }
            switch (t1 - i) {
            case 3:
                q_rows<T, 1, 3>(w, n_lo, nb, ab, act_row_bytes, i, y + r, ldy);
                if (n_hi > 0)
                    q_rows<T, 1, 3>(w + 4, n_hi, nb, ab, act_row_bytes, i, y + r + 4, ldy);
                break;
            case 2:
                q_rows<T, 2, 2>(w, n, nb, ab, act_row_bytes, i, y + r, ldy);
                break;
            case 1:
                q_rows<T, 2, 1>(w, n, nb, ab, act_row_bytes, i, y + r, ldy);
                break;
            default:
                break;
            }
        }
    }
}

// The 32-element types this kernel takes; false for the others.
static bool matmul_q_arm(smol_type t, const void * w, size_t w_row_bytes, int64_t K, int64_t r0,
                         int64_t r1, const void * act, size_t act_row_bytes, int64_t n_tok,
                         float * y, int64_t ldy) {
    const uint8_t * wb = (const uint8_t *)w;
    const uint8_t * ab = (const uint8_t *)act;
    switch (t) {
    case SMOL_TYPE_Q4_0:
        matmul_q_neon<SMOL_TYPE_Q4_0>(wb, w_row_bytes, K, r0, r1, ab, act_row_bytes, n_tok, y, ldy);
        return true;
    case SMOL_TYPE_Q4_1:
        matmul_q_neon<SMOL_TYPE_Q4_1>(wb, w_row_bytes, K, r0, r1, ab, act_row_bytes, n_tok, y, ldy);
        return true;
    case SMOL_TYPE_Q5_0:
        matmul_q_neon<SMOL_TYPE_Q5_0>(wb, w_row_bytes, K, r0, r1, ab, act_row_bytes, n_tok, y, ldy);
        return true;
    case SMOL_TYPE_Q5_1:
        matmul_q_neon<SMOL_TYPE_Q5_1>(wb, w_row_bytes, K, r0, r1, ab, act_row_bytes, n_tok, y, ldy);
        return true;
    case SMOL_TYPE_Q8_0:
        matmul_q_neon<SMOL_TYPE_Q8_0>(wb, w_row_bytes, K, r0, r1, ab, act_row_bytes, n_tok, y, ldy);
        return true;
    case SMOL_TYPE_IQ4_NL:
        matmul_q_neon<SMOL_TYPE_IQ4_NL>(wb, w_row_bytes, K, r0, r1, ab, act_row_bytes, n_tok, y,
                                        ldy);
        return true;
    default:
        return false;
    }
}

#endif // __ARM_FEATURE_DOTPROD

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

// 0xFF in byte j where bit j of the little-endian word at p is set.
static inline __m256i bits32(const uint8_t * p) {
    uint32_t x;
    memcpy(&x, p, 4);
    // Byte j gets byte j / 8 of x, then keeps bit j % 8.
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)x), _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                                      0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
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
    //   q4_1, q5_1: the codes 0..15 or 0..31 (unsigned; the activations are
    //         the signed side);
    //   q4_0, q5_0: q - 8 or q - 16 (signed; the activations, plus 128, the
    //         unsigned side);
    //   q8_0: w = 16 h + l split into two signed planes, l = ((w + 8) mod 16)
    //         - 8 in q and h in [-8, 8] in h, with the activations as q4_0.
    // With VNNI (int32 sums; the activations stay signed so that they can be
    // broadcast from memory): the codes 0..15 (0..31), or w + 128 for q8_0.
    alignas(64) int8_t q[q_panel_blocks][8][2][32];
    alignas(64) int8_t h[q_panel_blocks][8][2][32];
    alignas(64) float d[q_panel_blocks][q_panel_rows];
    // q4_1, q5_1: m, the coefficient of the activation sum s.
    alignas(64) float m[q_panel_blocks][q_panel_rows];
    // AVX2 q4_0, q5_0, q8_0: 128 * (sum of the row's signed codes in the block),
    // what the +128 on the activations added to the integer dot product.
    alignas(64) int32_t corr[q_panel_blocks][q_panel_rows];
};

// True for the types whose panel holds signed codes (activations + 128 on
// the unsigned side): their dot products are exact integers, as ggml's
// q4_0 x q8_0 and q8_0 x q8_0, with no use of the rounded activation sum.
constexpr bool signed_codes(smol_type t) {
    return t == SMOL_TYPE_Q4_0 || t == SMOL_TYPE_Q5_0 || t == SMOL_TYPE_Q8_0;
}

// The types with a min (m times the activation sum s): q4_1 and q5_1.
constexpr bool has_min(smol_type t) {
    return t == SMOL_TYPE_Q4_1 || t == SMOL_TYPE_Q5_1;
}

// The 32 five-bit codes of a q5_0 or q5_1 block (qh, then qs at qh + 4).
static inline __m256i unpack_q5(const uint8_t * qh) {
    return _mm256_or_si256(unpack_nibbles(qh + 4),
                           _mm256_and_si256(bits32(qh), _mm256_set1_epi8(0x10)));
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
                } else if (t == SMOL_TYPE_Q4_0 || t == SMOL_TYPE_Q5_0) {
                    const bool q5 = t == SMOL_TYPE_Q5_0;
                    lo[i] = q5 ? unpack_q5(src + 2) : unpack_nibbles(src + 2);
                    if (!SMOL_CPU_VNNI) {
                        lo[i] = _mm256_sub_epi8(lo[i], _mm256_set1_epi8(q5 ? 16 : 8));
                        p->corr[b][r] = 128 * sum_i8x32(lo[i]);
                    }
                } else if (t == SMOL_TYPE_Q5_1) {
                    lo[i] = unpack_q5(src + 4);
                    p->m[b][r] = h2f(load_u16(src + 2));
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
    // The int16 sums hold 8 quads of 4-bit codes; 5-bit codes' sums are
    // widened to int32 (si) after each 4.
    constexpr bool five = T == SMOL_TYPE_Q5_0 || T == SMOL_TYPE_Q5_1;
    for (int64_t b = 0; b < nbk; b++) {
        __m256i sl[NT][NV], sh[NT][NV], si[NT][NV];
        for (int t = 0; t < NT; t++) {
            for (int v = 0; v < NV; v++) {
                sl[t][v] = _mm256_setzero_si256();
                if (T == SMOL_TYPE_Q8_0) sh[t][v] = _mm256_setzero_si256();
                if (five) si[t][v] = _mm256_setzero_si256();
            }
        }
        // Not unrolled: unrolled, GCC sums the 8 quads as a tree and spills.
#pragma GCC unroll 1
        for (int j = 0; j < 8; j++) {
            if (five && j == 4) {
                for (int t = 0; t < NT; t++) {
                    for (int v = 0; v < NV; v++) {
                        si[t][v] = _mm256_madd_epi16(sl[t][v], ones);
                        sl[t][v] = _mm256_setzero_si256();
                    }
                }
            }
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
                if (five) i = _mm256_add_epi32(i, si[t][v]);
                if (T == SMOL_TYPE_Q8_0)
                    i = _mm256_add_epi32(i, _mm256_madd_epi16(sh[t][v], _mm256_set1_epi16(16)));
                if (signed_codes(T))
                    i = _mm256_sub_epi32(
                        i, _mm256_load_si256((const __m256i *)(p->corr[b] + 8 * (v0 + v))));
                const __m256 da = _mm256_broadcast_ss(&a[t][b].d);
                acc[t][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(d, da), acc[t][v]);
                if (has_min(T)) {
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
// token t's sum of codes in block b. q5_0's codes carry +16.
constexpr int32_t vnni_bias(smol_type t) {
    return t == SMOL_TYPE_Q8_0 ? 128 : t == SMOL_TYPE_Q4_0 ? 8 : t == SMOL_TYPE_Q5_0 ? 16 : 0;
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
            if (has_min(T))
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
            // q5_0, q5_1: the fifth bits (qh) before the codes.
            const bool q5 = t == SMOL_TYPE_Q5_0 || t == SMOL_TYPE_Q5_1;
            const size_t ho = o + (t == SMOL_TYPE_Q5_0 ? 2 : 4);
            const size_t qo = q5 ? ho + 4 : o + (t == SMOL_TYPE_Q4_0 ? 2 : 4);
            for (int k = 0; k < 4; k++) {
                const __m256i v = _mm256_insertf128_si256(
                    _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(rows[2 * k] + qo))),
                    _mm_loadu_si128((const __m128i *)(rows[2 * k + 1] + qo)), 1);
                __m256i lo = _mm256_and_si256(v, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                if (q5) {
                    // Elements 0-15 of both rows with lo, 16-31 with hi.
                    const __m256i b0 = bits32(rows[2 * k] + ho), b1 = bits32(rows[2 * k + 1] + ho);
                    const __m256i five = _mm256_set1_epi8(0x10);
                    lo = _mm256_or_si256(
                        lo, _mm256_and_si256(_mm256_permute2x128_si256(b0, b1, 0x20), five));
                    hi = _mm256_or_si256(
                        hi, _mm256_and_si256(_mm256_permute2x128_si256(b0, b1, 0x31), five));
                }
                const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, x_lo),
                                                   _mm256_maddubs_epi16(hi, x_hi));
                pr[k] = _mm256_madd_epi16(s, ones);
            }
        }
        // pr[k]: [row 2k: 4 partials | row 2k+1: 4 partials].
        __m256i v =
            _mm256_hadd_epi32(_mm256_hadd_epi32(pr[0], pr[1]), _mm256_hadd_epi32(pr[2], pr[3]));
        if (t == SMOL_TYPE_Q4_0 || t == SMOL_TYPE_Q5_0) {
            // Codes carry a +8 (+16) bias: subtract 8 (16) * sum(a), exactly.
            const int32_t sa = sum_i8x32(_mm256_loadu_si256((const __m256i *)a[b].qs));
            v = _mm256_sub_epi32(v, _mm256_set1_epi32((t == SMOL_TYPE_Q4_0 ? 8 : 16) * sa));
        }
        const __m128i dh = _mm_setr_epi16(
            (short)load_u16(rows[order[0]] + o), (short)load_u16(rows[order[1]] + o),
            (short)load_u16(rows[order[2]] + o), (short)load_u16(rows[order[3]] + o),
            (short)load_u16(rows[order[4]] + o), (short)load_u16(rows[order[5]] + o),
            (short)load_u16(rows[order[6]] + o), (short)load_u16(rows[order[7]] + o));
        const __m256 dw = _mm256_cvtph_ps(dh);
        acc =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(dw, _mm256_set1_ps(a[b].d)), acc);
        if (has_min(t)) {
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
    case SMOL_TYPE_Q5_0:
        matmul_q_tiles<SMOL_TYPE_Q5_0>(wb, w_row_bytes, K, r0, r1, ab, act_row_bytes, n_tok, y,
                                       ldy);
        break;
    case SMOL_TYPE_Q5_1:
        matmul_q_tiles<SMOL_TYPE_Q5_1>(wb, w_row_bytes, K, r0, r1, ab, act_row_bytes, n_tok, y,
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

void matmul(smol_type t, const void * w, size_t w_row_bytes, int64_t K, int64_t r0, int64_t r1,
            const void * act, size_t act_row_bytes, int64_t n_tok, float * y, int64_t ldy) {
    if (r1 <= r0 || n_tok <= 0) return;
#if defined(__ARM_FEATURE_DOTPROD)
    if (matmul_q_arm(t, w, w_row_bytes, K, r0, r1, act, act_row_bytes, n_tok, y, ldy)) return;
#endif
    if (dots_type(t)) {
        matmul_dots(t, w, w_row_bytes, K, r0, r1, act, act_row_bytes, n_tok, y, ldy);
        return;
    }
#if defined(__AVX2__)
    switch (t) {
    case SMOL_TYPE_Q4_0:
    case SMOL_TYPE_Q4_1:
    case SMOL_TYPE_Q5_0:
    case SMOL_TYPE_Q5_1:
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
    default:
        break;
    }
#endif
    matmul_scalar(t, w, w_row_bytes, K, r0, r1, act, act_row_bytes, n_tok, y, ldy);
}

} // namespace smol::cpu::SMOL_CPU_VARIANT
