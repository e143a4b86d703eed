// smol-quant.c++ - the reference side of smol-quant.h: type traits, scalar
// dequantization of every type (bit for bit the gguf package's), and the
// quantizers smol-quantize writes with.
//
// Quantizers: for q4_0, q4_1 and q8_0, ggml's reference quantizers, so that
// smol writes the bytes llama.cpp writes; for q5_0 and q5_1 the same rule
// (the largest value or the range onto the codes). The K-quants and the IQ4
// types are fitted, as ggml's reference quantizers are fitted: each small
// block's scale (and min) is the weighted least-squares fit to its codes,
// tried over a range of starting scales, then the scales are themselves
// quantized to the super-block's few bits and the codes chosen again under
// the rounded scales. The searches are smol's own, so files agree with
// llama.cpp's in layout and quality, not byte for byte.
//
// Built with -ffp-contract=off (CMakeLists.txt): a fused multiply-add would
// round differently from the numpy reference and from the kernels.

#include "smol-quant.h"

#include "smol-cpu-kernels.h"
#include "smol-error.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace smol {

namespace {

float h2f(uint16_t h) {
    return cpu::fp16_to_fp32(h);
}
uint16_t f2h(float f) {
    return cpu::fp32_to_fp16(f);
}

// Round half to even for |x| < 2^22, as ggml's nearest_int.
int nearest(float x) {
    const float magic = 12582912.0f; // 1.5 * 2^23
    return int((x + magic) - magic);
}

const type_traits k_traits[] = {
    {"f32", 1, 4, false},      {"f16", 1, 2, false},      {"bf16", 1, 2, false},
    {"q4_0", QK, 18, true},    {"q4_1", QK, 20, true},    {"q5_0", QK, 22, true},
    {"q5_1", QK, 24, true},    {"q8_0", QK, 34, true},    {"q2_K", QK_K, 84, true},
    {"q3_K", QK_K, 110, true}, {"q4_K", QK_K, 144, true}, {"q5_K", QK_K, 176, true},
    {"q6_K", QK_K, 210, true}, {"iq4_nl", QK, 18, true},  {"iq4_xs", QK_K, 136, true},
};

// --- dequantization ----------------------------------------------------------------

void deq_q4_0(const block_q4_0 * b, int64_t nb, float * y) {
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = h2f(b[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * float((b[i].qs[j] & 0xF) - 8);
            y[j + 16] = d * float((b[i].qs[j] >> 4) - 8);
        }
    }
}

void deq_q4_1(const block_q4_1 * b, int64_t nb, float * y) {
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = h2f(b[i].d), m = h2f(b[i].m);
        for (int j = 0; j < 16; j++) {
            y[j] = d * float(b[i].qs[j] & 0xF) + m;
            y[j + 16] = d * float(b[i].qs[j] >> 4) + m;
        }
    }
}

void deq_q5_0(const block_q5_0 * b, int64_t nb, float * y) {
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = h2f(b[i].d);
        uint32_t qh;
        std::memcpy(&qh, b[i].qh, 4);
        for (int j = 0; j < 16; j++) {
            const int lo = (b[i].qs[j] & 0xF) | int(((qh >> j) & 1) << 4);
            const int hi = (b[i].qs[j] >> 4) | int(((qh >> (j + 16)) & 1) << 4);
            y[j] = d * float(lo - 16);
            y[j + 16] = d * float(hi - 16);
        }
    }
}

void deq_q5_1(const block_q5_1 * b, int64_t nb, float * y) {
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = h2f(b[i].d), m = h2f(b[i].m);
        uint32_t qh;
        std::memcpy(&qh, b[i].qh, 4);
        for (int j = 0; j < 16; j++) {
            const int lo = (b[i].qs[j] & 0xF) | int(((qh >> j) & 1) << 4);
            const int hi = (b[i].qs[j] >> 4) | int(((qh >> (j + 16)) & 1) << 4);
            y[j] = d * float(lo) + m;
            y[j + 16] = d * float(hi) + m;
        }
    }
}

void deq_q8_0(const block_q8_0 * b, int64_t nb, float * y) {
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = h2f(b[i].d);
        for (int j = 0; j < QK; j++) y[j] = float(b[i].qs[j]) * d;
    }
}

void deq_iq4_nl(const block_iq4_nl * b, int64_t nb, float * y) {
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = h2f(b[i].d);
        for (int j = 0; j < 16; j++) {
            y[j] = d * float(kvalues_iq4nl[b[i].qs[j] & 0xF]);
            y[j + 16] = d * float(kvalues_iq4nl[b[i].qs[j] >> 4]);
        }
    }
}

void deq_q2_K(const block_q2_K * b, int64_t nb, float * y) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, t = (e % 128) / 32, c = e % 32;
            const int q = (b[i].qs[32 * h + c] >> (2 * t)) & 3;
            const uint8_t sc = b[i].scales[e / 16];
            const float dl = d * float(sc & 0xF), ml = dmin * float(sc >> 4);
            y[e] = dl * float(q) - ml;
        }
    }
}

void deq_q3_K(const block_q3_K * b, int64_t nb, float * y) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        const float d = h2f(b[i].d);
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, t = (e % 128) / 32, c = e % 32;
            const int lo = (b[i].qs[32 * h + c] >> (2 * t)) & 3;
            const int hbit = (b[i].hmask[e % 32] >> (e / 32)) & 1;
            const int q = lo - (hbit ? 0 : 4);
            const float dl = d * float(q3_K_scale(b[i].scales, e / 16));
            y[e] = dl * float(q);
        }
    }
}

void deq_q4_K(const block_q4_K * b, int64_t nb, float * y) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        for (int s = 0; s < 8; s++) {
            uint8_t sc, m;
            scale_min_k4(s, b[i].scales, sc, m);
            const float dl = d * float(sc), ml = dmin * float(m);
            const uint8_t * q = b[i].qs + 32 * (s / 2);
            const int shift = 4 * (s % 2);
            for (int j = 0; j < 32; j++) y[32 * s + j] = dl * float((q[j] >> shift) & 0xF) - ml;
        }
    }
}

void deq_q5_K(const block_q5_K * b, int64_t nb, float * y) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        for (int s = 0; s < 8; s++) {
            uint8_t sc, m;
            scale_min_k4(s, b[i].scales, sc, m);
            const float dl = d * float(sc), ml = dmin * float(m);
            const uint8_t * q = b[i].qs + 32 * (s / 2);
            const int shift = 4 * (s % 2);
            for (int j = 0; j < 32; j++) {
                const int v = ((q[j] >> shift) & 0xF) | (((b[i].qh[j] >> s) & 1) << 4);
                y[32 * s + j] = dl * float(v) - ml;
            }
        }
    }
}

void deq_q6_K(const block_q6_K * b, int64_t nb, float * y) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        const float d = h2f(b[i].d);
        for (int e = 0; e < QK_K; e++) {
            const int h = e / 128, r = e % 128;
            const int lo = (b[i].ql[64 * h + r % 64] >> (4 * (r / 64))) & 0xF;
            const int hi = (b[i].qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
            const float dl = d * float(b[i].scales[e / 16]);
            y[e] = dl * float((lo | (hi << 4)) - 32);
        }
    }
}

void deq_iq4_xs(const block_iq4_xs * b, int64_t nb, float * y) {
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        const float d = h2f(b[i].d);
        for (int s = 0; s < 8; s++) {
            const float dl = d * float(iq4_xs_scale(b[i], s));
            const uint8_t * q = b[i].qs + 16 * s;
            for (int j = 0; j < 16; j++) {
                y[32 * s + j] = dl * float(kvalues_iq4nl[q[j] & 0xF]);
                y[32 * s + 16 + j] = dl * float(kvalues_iq4nl[q[j] >> 4]);
            }
        }
    }
}

// --- quantization: the 32-element types --------------------------------------------

void quant_q8_0(const float * x, block_q8_0 * y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        for (int j = 0; j < QK; j++) y[i].qs[j] = int8_t(std::round(x[j] * id));
    }
}

// The value of largest magnitude of x[0, n) (the first such, with its sign).
float signed_max(const float * x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < std::fabs(x[j])) {
            amax = std::fabs(x[j]);
            max = x[j];
        }
    }
    return max;
}

void quant_q4_0(const float * x, block_q4_0 * y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK) {
        const float d = signed_max(x, QK) / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        for (int j = 0; j < 16; j++) {
            const int q0 = std::min(15, int(int8_t(x[j] * id + 8.5f)));
            const int q1 = std::min(15, int(int8_t(x[j + 16] * id + 8.5f)));
            y[i].qs[j] = uint8_t(q0 | (q1 << 4));
        }
    }
}

void quant_q4_1(const float * x, block_q4_1 * y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK) {
        const float min = *std::min_element(x, x + QK), max = *std::max_element(x, x + QK);
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        y[i].m = f2h(min);
        for (int j = 0; j < 16; j++) {
            const int q0 = std::min(15, int(int8_t((x[j] - min) * id + 0.5f)));
            const int q1 = std::min(15, int(int8_t((x[j + 16] - min) * id + 0.5f)));
            y[i].qs[j] = uint8_t(q0 | (q1 << 4));
        }
    }
}

// The low nibbles and fifth bits of 32 five-bit codes.
void pack5(const int * q, uint8_t qs[16], uint8_t qh[4]) {
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = uint8_t((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
        h |= uint32_t((q[j] >> 4) & 1) << j;
        h |= uint32_t((q[j + 16] >> 4) & 1) << (j + 16);
    }
    std::memcpy(qh, &h, 4);
}

void quant_q5_0(const float * x, block_q5_0 * y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK) {
        const float d = signed_max(x, QK) / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        int q[QK];
        for (int j = 0; j < QK; j++) q[j] = std::min(31, int(int8_t(x[j] * id + 16.5f)));
        pack5(q, y[i].qs, y[i].qh);
    }
}

void quant_q5_1(const float * x, block_q5_1 * y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK) {
        const float min = *std::min_element(x, x + QK), max = *std::max_element(x, x + QK);
        const float d = (max - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        y[i].m = f2h(min);
        int q[QK];
        for (int j = 0; j < QK; j++) q[j] = std::min(31, int(int8_t((x[j] - min) * id + 0.5f)));
        pack5(q, y[i].qs, y[i].qh);
    }
}

// --- quantization: fitted scales -------------------------------------------------------

// The quantizers below make the same rounding decisions, in the same order and
// float arithmetic, as llama.cpp's reference quantizers (ggml-quants.c, no
// importance matrix), so a file smol-quantize writes is byte for byte the one
// llama-quantize writes from the same source. Where a fit's choices look
// arbitrary (a search's starting point, a tie, codes kept for a sub-block
// whose scale rounds to zero) they are that quantizer's.

// Symmetric codes in [-nmax, nmax - 1] for x[0, n), weighted by x^2: the
// scale s minimising sum x^2 (x - s q)^2, from nmax / max|x| and then 18
// starting scales around it, keeping a later one only when strictly better.
// Codes (plus nmax) go to L; returns s.
float fit_symmetric(int n, int nmax, const float * x, int8_t * L) {
    const float max = signed_max(x, n);
    if (std::fabs(max) < 1e-15f) {
        std::fill(L, L + n, int8_t(0));
        return 0.0f;
    }
    const auto fit = [&](float iscale, float & sumlx, float & suml2, bool keep) {
        sumlx = suml2 = 0.0f;
        for (int i = 0; i < n; ++i) {
            const int l = std::clamp(nearest(iscale * x[i]), -nmax, nmax - 1);
            if (keep) L[i] = int8_t(l + nmax);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * float(l);
            suml2 += w * float(l) * float(l);
        }
    };
    float sumlx, suml2;
    fit(-float(nmax) / max, sumlx, suml2, true);
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        const float iscale = -(float(nmax) + 0.1f * float(is)) / max;
        fit(iscale, sumlx, suml2, false);
        // The fit's gain sumlx^2 / suml2: the larger, the smaller the error.
        if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
            fit(iscale, sumlx, suml2, true);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

// Symmetric 3-bit codes (nmax 4) for x[0, n), weighted by x^2: from the codes
// of nmax / max|x|, up to five sweeps that move single codes to their best
// value under the rest's fit while that raises the gain. Codes (plus nmax)
// to L; returns the fitted scale.
float fit_q3(int n, int nmax, const float * x, int8_t * L) {
    const float max = signed_max(x, n);
    if (std::fabs(max) < 1e-15f) {
        std::fill(L, L + n, int8_t(0));
        return 0.0f;
    }
    const float iscale = -float(nmax) / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        const int l = std::clamp(nearest(iscale * x[i]), -nmax, nmax - 1);
        L[i] = int8_t(l);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * float(l);
        suml2 += w * float(l) * float(l);
    }
    for (int sweep = 0; sweep < 5; ++sweep) {
        int changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * float(L[i]);
            if (slx <= 0.0f) continue;
            float sl2 = suml2 - w * float(L[i]) * float(L[i]);
            const int l = std::clamp(nearest(x[i] * sl2 / slx), -nmax, nmax - 1);
            if (l == L[i]) continue;
            slx += w * x[i] * float(l);
            sl2 += w * float(l) * float(l);
            if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = int8_t(l);
                sumlx = slx;
                suml2 = sl2;
                ++changed;
            }
        }
        if (changed == 0) break;
    }
    for (int i = 0; i < n; ++i) L[i] = int8_t(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Asymmetric codes in [0, nmax] for x[0, n) under weights w, x ~ s q - m:
// scale s and min m (m >= 0) by weighted least squares for each of nstep + 1
// starting scales (nmax + rmin + rdelta k) / (max - min); keeps the least
// weighted squared (or, with mad, absolute) error. Codes to L, m to *min.
float fit_asymmetric(int n, int nmax, const float * x, const float * w, uint8_t * L,
                     float * min_out, float rmin, float rdelta, int nstep, bool mad) {
    float min = *std::min_element(x, x + n), max = *std::max_element(x, x + n);
    if (min > 0.0f) min = 0.0f;
    if (max <= min) {
        std::fill(L, L + n, uint8_t(0));
        *min_out = -min;
        return 0.0f;
    }
    float sum_w = 0.0f, sum_x = 0.0f;
    for (int i = 0; i < n; ++i) {
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    const auto error = [&](float scale, float mn, const uint8_t * q) {
        float e = 0.0f;
        for (int i = 0; i < n; ++i) {
            const float diff = scale * float(q[i]) + mn - x[i];
            e += w[i] * (mad ? std::fabs(diff) : diff * diff);
        }
        return e;
    };
    float iscale = float(nmax) / (max - min);
    float scale = 1.0f / iscale;
    for (int i = 0; i < n; ++i) L[i] = uint8_t(std::clamp(nearest(iscale * (x[i] - min)), 0, nmax));
    float best = error(scale, min, L);
    uint8_t trial[QK_K];
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * float(is) + float(nmax)) / (max - min);
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int i = 0; i < n; ++i) {
            const int l = std::clamp(nearest(iscale * (x[i] - min)), 0, nmax);
            trial[i] = uint8_t(l);
            sum_l += w[i] * float(l);
            sum_l2 += w[i] * float(l) * float(l);
            sum_xl += w[i] * float(l) * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D <= 0.0f) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0.0f) {
            this_min = 0.0f;
            this_scale = sum_xl / sum_l2;
        }
        const float e = error(this_scale, this_min, trial);
        if (e < best) {
            std::copy(trial, trial + n, L);
            best = e;
            scale = this_scale;
            min = this_min;
        }
    }
    *min_out = -min;
    return scale;
}

// The index of the IQ4 value nearest to v (ties to the upper).
int iq4_index(float v) {
    if (v <= float(kvalues_iq4nl[0])) return 0;
    if (v >= float(kvalues_iq4nl[15])) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (v < float(kvalues_iq4nl[mid])) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    return v - float(kvalues_iq4nl[lo]) < float(kvalues_iq4nl[hi]) - v ? lo : hi;
}

// The IQ4 scale for 32 values: the d minimising sum x^2 (x - d v(q))^2, from
// max|x| / v(0) and then 15 starting scales around it (0 when all are zero).
float fit_iq4(const float * x) {
    const float max = signed_max(x, QK);
    if (std::fabs(max) < 1e-15f) return 0.0f;
    const auto gain = [&](float id, float & sumqx, float & sumq2) {
        sumqx = sumq2 = 0.0f;
        for (int j = 0; j < QK; ++j) {
            const float q = float(kvalues_iq4nl[iq4_index(id * x[j])]), w = x[j] * x[j];
            sumqx += w * q * x[j];
            sumq2 += w * q * q;
        }
    };
    float sumqx, sumq2;
    gain(1.0f / (-max / float(kvalues_iq4nl[0])), sumqx, sumq2);
    float d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
    float best = d * sumqx;
    for (int itry = -7; itry <= 7; ++itry) {
        gain((float(itry) + float(kvalues_iq4nl[0])) / max, sumqx, sumq2);
        if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

// The codes of 32 values under the scale d (as fitted, not as stored).
void iq4_pack(const float * x, float d, uint8_t qs[16]) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t L[QK];
    for (int j = 0; j < QK; ++j) L[j] = uint8_t(iq4_index(id * x[j]));
    for (int j = 0; j < 16; j++) qs[j] = uint8_t(L[j] | (L[j + 16] << 4));
}

void quant_iq4_nl(const float * x, block_iq4_nl * y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK) {
        const float d = fit_iq4(x);
        y[i].d = f2h(d);
        iq4_pack(x, d, y[i].qs);
    }
}

void quant_iq4_xs(const float * x, block_iq4_xs * y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float scales[8];
        float max_scale = 0.0f, amax = 0.0f;
        for (int s = 0; s < 8; s++) {
            scales[s] = fit_iq4(x + 32 * s);
            if (std::fabs(scales[s]) > amax) {
                amax = std::fabs(scales[s]);
                max_scale = scales[s];
            }
        }
        std::memset(&y[i], 0, sizeof(y[i]));
        const float d = -max_scale / 32.0f;
        y[i].d = f2h(d);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int s = 0; s < 8; s++) {
            const int l = std::clamp(nearest(id * scales[s]), -32, 31);
            y[i].scales_l[s / 2] |= uint8_t(((l + 32) & 0xF) << (4 * (s % 2)));
            y[i].scales_h |= uint16_t(((l + 32) >> 4) << (2 * s));
            iq4_pack(x + 32 * s, d * float(l), y[i].qs + 16 * s);
        }
    }
}

// The twelve bytes of eight 6-bit scales and mins (scale_min_k4's inverse).
void pack_scale_min_k4(const uint8_t sc[8], const uint8_t m[8], uint8_t out[12]) {
    for (int j = 0; j < 4; j++) {
        out[j] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        out[j + 4] = uint8_t((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        out[j + 8] = uint8_t((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
    }
}

// q4_K (bits 4) and q5_K (bits 5): eight sub-blocks of 32, scales and mins
// fitted, then held to six bits each under the super-block's d and dmin.
template <int bits, class Block> void quant_k_type1(const float * x, Block * y, int64_t nb) {
    constexpr int nmax = (1 << bits) - 1;
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        uint8_t L[QK_K];
        float weights[32], scales[8], mins[8];
        float max_scale = 0.0f, max_min = 0.0f;
        for (int s = 0; s < 8; s++) {
            const float * xs = x + 32 * s;
            float sum_x2 = 0.0f;
            for (int l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
            const float av_x = std::sqrt(sum_x2 / 32.0f);
            for (int l = 0; l < 32; l++) weights[l] = av_x + std::fabs(xs[l]);
            scales[s] = bits == 4 ? fit_asymmetric(32, nmax, xs, weights, L + 32 * s, &mins[s],
                                                   -1.0f, 0.1f, 20, false)
                                  : fit_asymmetric(32, nmax, xs, weights, L + 32 * s, &mins[s],
                                                   -0.5f, 0.1f, 15, false);
            max_scale = std::max(max_scale, scales[s]);
            max_min = std::max(max_min, mins[s]);
        }
        const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
        const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
        uint8_t ls[8], lm[8];
        for (int s = 0; s < 8; s++) {
            ls[s] = uint8_t(std::min(63, nearest(inv_scale * scales[s])));
            lm[s] = uint8_t(std::min(63, nearest(inv_min * mins[s])));
        }
        pack_scale_min_k4(ls, lm, y[i].scales);
        y[i].d = f2h(max_scale / 63.0f);
        y[i].dmin = f2h(max_min / 63.0f);
        const float d = h2f(y[i].d), dmin = h2f(y[i].dmin);
        for (int s = 0; s < 8; s++) {
            uint8_t sc, m;
            scale_min_k4(s, y[i].scales, sc, m);
            const float dl = d * float(sc);
            if (dl == 0.0f) continue; // the fit's codes stay
            const float dm = dmin * float(m);
            for (int l = 0; l < 32; l++)
                L[32 * s + l] = uint8_t(std::clamp(nearest((x[32 * s + l] + dm) / dl), 0, nmax));
        }
        if constexpr (bits == 5) std::memset(y[i].qh, 0, sizeof(y[i].qh));
        for (int s = 0; s < 8; s++) {
            uint8_t * q = y[i].qs + 32 * (s / 2);
            for (int l = 0; l < 32; l++) {
                const uint8_t v = L[32 * s + l];
                if (s % 2 == 0) {
                    q[l] = v & 0xF;
                } else {
                    q[l] = uint8_t(q[l] | ((v & 0xF) << 4));
                }
                if constexpr (bits == 5) y[i].qh[l] = uint8_t(y[i].qh[l] | (((v >> 4) & 1) << s));
            }
        }
    }
}

void quant_q2_K(const float * x, block_q2_K * y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        uint8_t L[QK_K];
        float weights[16], scales[16], mins[16];
        float max_scale = 0.0f, max_min = 0.0f;
        for (int j = 0; j < 16; j++) {
            for (int l = 0; l < 16; l++) weights[l] = std::fabs(x[16 * j + l]);
            scales[j] = fit_asymmetric(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], -0.5f,
                                       0.1f, 15, true);
            max_scale = std::max(max_scale, scales[j]);
            max_min = std::max(max_min, mins[j]);
        }
        const float is = max_scale > 0.0f ? 15.0f / max_scale : 0.0f;
        const float im = max_min > 0.0f ? 15.0f / max_min : 0.0f;
        for (int j = 0; j < 16; j++) {
            const int ls = std::min(15, nearest(is * scales[j]));
            const int lm = std::min(15, nearest(im * mins[j]));
            y[i].scales[j] = uint8_t(ls | (lm << 4));
        }
        y[i].d = f2h(max_scale / 15.0f);
        y[i].dmin = f2h(max_min / 15.0f);
        const float d = h2f(y[i].d), dmin = h2f(y[i].dmin);
        for (int j = 0; j < 16; j++) {
            const float dl = d * float(y[i].scales[j] & 0xF);
            if (dl == 0.0f) continue; // the fit's codes stay
            const float ml = dmin * float(y[i].scales[j] >> 4);
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = uint8_t(std::clamp(nearest((x[16 * j + l] + ml) / dl), 0, 3));
        }
        for (int h = 0; h < 2; h++)
            for (int c = 0; c < 32; c++)
                y[i].qs[32 * h + c] =
                    uint8_t(L[128 * h + c] | (L[128 * h + 32 + c] << 2) |
                            (L[128 * h + 64 + c] << 4) | (L[128 * h + 96 + c] << 6));
    }
}

void quant_q3_K(const float * x, block_q3_K * y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        int8_t L[QK_K];
        float scales[16];
        float max_scale = 0.0f, amax = 0.0f;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_q3(16, 4, x + 16 * j, L + 16 * j);
            if (std::fabs(scales[j]) > amax) {
                amax = std::fabs(scales[j]);
                max_scale = scales[j];
            }
        }
        std::memset(&y[i], 0, sizeof(y[i]));
        if (max_scale != 0.0f) {
            const float iscale = -32.0f / max_scale;
            for (int j = 0; j < 16; j++) {
                const int l = std::clamp(nearest(iscale * scales[j]), -32, 31) + 32;
                if (j < 8) {
                    y[i].scales[j] = uint8_t(l & 0xF);
                } else {
                    y[i].scales[j - 8] = uint8_t(y[i].scales[j - 8] | ((l & 0xF) << 4));
                }
                y[i].scales[8 + j % 4] =
                    uint8_t(y[i].scales[8 + j % 4] | ((l >> 4) << (2 * (j / 4))));
            }
            y[i].d = f2h(1.0f / iscale);
        }
        const float d = h2f(y[i].d);
        for (int j = 0; j < 16; j++) {
            const float dl = d * float(q3_K_scale(y[i].scales, j));
            if (dl == 0.0f) continue; // the fit's codes stay
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = int8_t(std::clamp(nearest(x[16 * j + l] / dl), -4, 3) + 4);
        }
        for (int e = 0; e < QK_K; e++) {
            const int q = L[e];
            if (q > 3) y[i].hmask[e % 32] = uint8_t(y[i].hmask[e % 32] | (1 << (e / 32)));
            const int h = e / 128, t = (e % 128) / 32, c = e % 32;
            y[i].qs[32 * h + c] = uint8_t(y[i].qs[32 * h + c] | ((q & 3) << (2 * t)));
        }
    }
}

void quant_q6_K(const float * x, block_q6_K * y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        int8_t L[QK_K];
        float scales[16];
        float max_scale = 0.0f, amax = 0.0f;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_symmetric(16, 32, x + 16 * j, L + 16 * j);
            if (std::fabs(scales[j]) > amax) {
                amax = std::fabs(scales[j]);
                max_scale = scales[j];
            }
        }
        std::memset(&y[i], 0, sizeof(y[i]));
        if (amax < 1e-15f) continue;
        const float iscale = -128.0f / max_scale;
        y[i].d = f2h(1.0f / iscale);
        for (int j = 0; j < 16; j++)
            y[i].scales[j] = int8_t(std::min(127, nearest(iscale * scales[j])));
        const float d = h2f(y[i].d);
        for (int j = 0; j < 16; j++) {
            const float dl = d * float(y[i].scales[j]);
            if (dl == 0.0f) continue; // the fit's codes stay
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = int8_t(std::clamp(nearest(x[16 * j + l] / dl), -32, 31) + 32);
        }
        for (int e = 0; e < QK_K; e++) {
            const int q = L[e], h = e / 128, r = e % 128;
            uint8_t & lo = y[i].ql[64 * h + r % 64];
            lo = uint8_t(lo | ((q & 0xF) << (4 * (r / 64))));
            uint8_t & hi = y[i].qh[32 * h + r % 32];
            hi = uint8_t(hi | ((q >> 4) << (2 * (r / 32))));
        }
    }
}

} // namespace

const type_traits * traits_of(smol_type t) {
    switch (c_enum(t)) {
    case SMOL_TYPE_F32:
        return &k_traits[0];
    case SMOL_TYPE_F16:
        return &k_traits[1];
    case SMOL_TYPE_BF16:
        return &k_traits[2];
    case SMOL_TYPE_Q4_0:
        return &k_traits[3];
    case SMOL_TYPE_Q4_1:
        return &k_traits[4];
    case SMOL_TYPE_Q5_0:
        return &k_traits[5];
    case SMOL_TYPE_Q5_1:
        return &k_traits[6];
    case SMOL_TYPE_Q8_0:
        return &k_traits[7];
    case SMOL_TYPE_Q2_K:
        return &k_traits[8];
    case SMOL_TYPE_Q3_K:
        return &k_traits[9];
    case SMOL_TYPE_Q4_K:
        return &k_traits[10];
    case SMOL_TYPE_Q5_K:
        return &k_traits[11];
    case SMOL_TYPE_Q6_K:
        return &k_traits[12];
    case SMOL_TYPE_IQ4_NL:
        return &k_traits[13];
    case SMOL_TYPE_IQ4_XS:
        return &k_traits[14];
    default:
        return nullptr;
    }
}

size_t type_row_bytes(smol_type t, int64_t n) {
    const type_traits * tr = traits_of(t);
    return tr ? size_t(n / tr->block_elems) * tr->block_bytes : 0;
}

int64_t type_block_elems(smol_type t) {
    const type_traits * tr = traits_of(t);
    return tr ? tr->block_elems : 0;
}

void dequantize_row(smol_type t, const void * src, float * dst, int64_t n) {
    switch (t) {
    case SMOL_TYPE_F32:
        std::memcpy(dst, src, size_t(n) * sizeof(float));
        return;
    case SMOL_TYPE_F16: {
        const uint16_t * h = static_cast<const uint16_t *>(src);
        for (int64_t i = 0; i < n; i++) dst[i] = h2f(h[i]);
        return;
    }
    case SMOL_TYPE_BF16: {
        const uint16_t * h = static_cast<const uint16_t *>(src);
        for (int64_t i = 0; i < n; i++) dst[i] = cpu::bf16_to_fp32(h[i]);
        return;
    }
    case SMOL_TYPE_Q4_0:
        return deq_q4_0(static_cast<const block_q4_0 *>(src), n / QK, dst);
    case SMOL_TYPE_Q4_1:
        return deq_q4_1(static_cast<const block_q4_1 *>(src), n / QK, dst);
    case SMOL_TYPE_Q5_0:
        return deq_q5_0(static_cast<const block_q5_0 *>(src), n / QK, dst);
    case SMOL_TYPE_Q5_1:
        return deq_q5_1(static_cast<const block_q5_1 *>(src), n / QK, dst);
    case SMOL_TYPE_Q8_0:
        return deq_q8_0(static_cast<const block_q8_0 *>(src), n / QK, dst);
    case SMOL_TYPE_IQ4_NL:
        return deq_iq4_nl(static_cast<const block_iq4_nl *>(src), n / QK, dst);
    case SMOL_TYPE_Q2_K:
        return deq_q2_K(static_cast<const block_q2_K *>(src), n / QK_K, dst);
    case SMOL_TYPE_Q3_K:
        return deq_q3_K(static_cast<const block_q3_K *>(src), n / QK_K, dst);
    case SMOL_TYPE_Q4_K:
        return deq_q4_K(static_cast<const block_q4_K *>(src), n / QK_K, dst);
    case SMOL_TYPE_Q5_K:
        return deq_q5_K(static_cast<const block_q5_K *>(src), n / QK_K, dst);
    case SMOL_TYPE_Q6_K:
        return deq_q6_K(static_cast<const block_q6_K *>(src), n / QK_K, dst);
    case SMOL_TYPE_IQ4_XS:
        return deq_iq4_xs(static_cast<const block_iq4_xs *>(src), n / QK_K, dst);
    }
}

void quantize_row(smol_type t, const float * src, void * dst, int64_t n) {
    switch (t) {
    case SMOL_TYPE_F32:
        std::memcpy(dst, src, size_t(n) * sizeof(float));
        return;
    case SMOL_TYPE_F16: {
        uint16_t * h = static_cast<uint16_t *>(dst);
        for (int64_t i = 0; i < n; i++) h[i] = f2h(src[i]);
        return;
    }
    case SMOL_TYPE_BF16: {
        uint16_t * h = static_cast<uint16_t *>(dst);
        for (int64_t i = 0; i < n; i++) h[i] = cpu::fp32_to_bf16(src[i]);
        return;
    }
    case SMOL_TYPE_Q4_0:
        return quant_q4_0(src, static_cast<block_q4_0 *>(dst), n / QK);
    case SMOL_TYPE_Q4_1:
        return quant_q4_1(src, static_cast<block_q4_1 *>(dst), n / QK);
    case SMOL_TYPE_Q5_0:
        return quant_q5_0(src, static_cast<block_q5_0 *>(dst), n / QK);
    case SMOL_TYPE_Q5_1:
        return quant_q5_1(src, static_cast<block_q5_1 *>(dst), n / QK);
    case SMOL_TYPE_Q8_0:
        return quant_q8_0(src, static_cast<block_q8_0 *>(dst), n / QK);
    case SMOL_TYPE_IQ4_NL:
        return quant_iq4_nl(src, static_cast<block_iq4_nl *>(dst), n / QK);
    case SMOL_TYPE_Q2_K:
        return quant_q2_K(src, static_cast<block_q2_K *>(dst), n / QK_K);
    case SMOL_TYPE_Q3_K:
        return quant_q3_K(src, static_cast<block_q3_K *>(dst), n / QK_K);
    case SMOL_TYPE_Q4_K:
        return quant_k_type1<4>(src, static_cast<block_q4_K *>(dst), n / QK_K);
    case SMOL_TYPE_Q5_K:
        return quant_k_type1<5>(src, static_cast<block_q5_K *>(dst), n / QK_K);
    case SMOL_TYPE_Q6_K:
        return quant_q6_K(src, static_cast<block_q6_K *>(dst), n / QK_K);
    case SMOL_TYPE_IQ4_XS:
        return quant_iq4_xs(src, static_cast<block_iq4_xs *>(dst), n / QK_K);
    }
}

} // namespace smol
