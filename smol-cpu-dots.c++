// smol-cpu-dots.c++ - the matmul of the weight types multiplied one row and
// one token at a time: q5_0, q5_1 and iq4_nl (blocks of 32, activations in
// block_q8_act) and the super-block types q2_K, q3_K, q4_K, q5_K, q6_K and
// iq4_xs (256 elements, activations in block_q8_K). Compiled once per
// instruction set, as smol-cpu-matmul.c++ (whose rules hold here), which
// hands these types to matmul_dots.
//
// Each dot product is an exact integer sum per block (per super-block: the
// sub-blocks' code products times their integer scales, and for the types
// with mins the integer mins times the activations' block sums), then one
// or two fused multiply-adds per block in block order:
//   acc = fma(isum, d_w * d_a, acc)           every type
//   acc = fma(m_w, s_a, acc)                  q5_1 (s_a = d_a * sum of codes)
//   acc = fma(msum, -(dmin_w * d_a), acc)     q2_K, q4_K, q5_K
// Integer parts are exact in every variant and the float operations are the
// same, so an output does not depend on the variant's vector width, on the
// batch it is in, or on which thread computes it.

#include "smol-cpu-kernels.h"
#include "smol-cpu-variant.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

namespace smol::cpu::SMOL_CPU_VARIANT {

namespace {

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
        for (int j = 0; j < 16; j++) {
            const int h = j / 8, t = (j % 8) / 2, c0 = 16 * (j % 2);
            int s = 0;
            for (int c = c0; c < c0 + 16; c++)
                s += ((w[b].qs[32 * h + c] >> (2 * t)) & 3) * a[b].qs[16 * j + c - c0];
            isum += (w[b].scales[j] & 0xF) * s;
            msum += (w[b].scales[j] >> 4) * a[b].bsums[j];
        }
        acc = fmaf((float)isum, h2f(w[b].d) * a[b].d, acc);
        acc = fmaf((float)msum, -(h2f(w[b].dmin) * a[b].d), acc);
    }
    return acc;
}

static float dot_q3_K(const block_q3_K * w, const block_q8_K * a, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int isum = 0;
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
        acc = fmaf((float)isum, h2f(w[b].d) * a[b].d, acc);
    }
    return acc;
}

// q4_K (bits 4) and q5_K (bits 5).
template <int bits, class Block>
static float dot_k_type1(const Block * w, const block_q8_K * a, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int isum = 0, msum = 0;
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
        acc = fmaf((float)isum, h2f(w[b].d) * a[b].d, acc);
        acc = fmaf((float)msum, -(h2f(w[b].dmin) * a[b].d), acc);
    }
    return acc;
}

static float dot_q6_K(const block_q6_K * w, const block_q8_K * a, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int isum = 0;
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
        acc = fmaf((float)isum, h2f(w[b].d) * a[b].d, acc);
    }
    return acc;
}

static float dot_iq4_xs(const block_iq4_xs * w, const block_q8_K * a, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int isum = 0;
        for (int s = 0; s < 8; s++) {
            const uint8_t * q = w[b].qs + 16 * s;
            const int8_t * x = a[b].qs + 32 * s;
            int d = 0;
            for (int j = 0; j < 16; j++)
                d += kvalues_iq4nl[q[j] & 0xF] * x[j] + kvalues_iq4nl[q[j] >> 4] * x[j + 16];
            isum += iq4_xs_scale(w[b], s) * d;
        }
        acc = fmaf((float)isum, h2f(w[b].d) * a[b].d, acc);
    }
    return acc;
}

// The dot product of one weight row of type t with one token's activations.
static float dot_row(smol_type t, const void * w, const void * act, int64_t K) {
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
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t * wr = wb + (size_t)r * w_row_bytes;
        for (int64_t i = 0; i < n_tok; i++)
            y[i * ldy + r] = dot_row(t, wr, ab + (size_t)i * act_row_bytes, K);
    }
}

} // namespace smol::cpu::SMOL_CPU_VARIANT
