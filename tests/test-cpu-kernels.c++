// test-cpu-kernels.c++ - the CPU kernels (smol-cpu-kernels.h) against
// float64 references: every variant this CPU can run, every weight type,
// the f16/bf16 conversions on every input, ggml's quantization rule on
// hand-made blocks, and the vector primitives.
//
// Matmul errors are normalised squared errors in the spirit of llama.cpp's
// test-backend-ops (NMSE), with ref computed in double from the dequantized
// weights and the original f32 activations:
//   err = sum_outputs (y - ref)^2 / sum_outputs sum_k (w_k * x_k)^2.
// The denominator is the products' energy rather than sum ref^2: for many
// independent outputs the two agree in expectation, but a single output that
// is near zero by cancellation cannot blow this one up. Outputs are filled
// with NaN before every call so an output a kernel forgot to write fails,
// and an output it must not write stays NaN.

#include "smol-cpu-kernels.h"
#include "test-seed.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <doctest/doctest.h>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace smol::cpu;
using smol::block_q4_0;
using smol::block_q4_1;
using smol::block_q8_0;
using smol::QK;
using smol::QK_K;

namespace {

const smol_type all_types[] = {SMOL_TYPE_F32,    SMOL_TYPE_F16,  SMOL_TYPE_BF16,  SMOL_TYPE_Q8_0,
                               SMOL_TYPE_Q4_0,   SMOL_TYPE_Q4_1, SMOL_TYPE_Q5_0,  SMOL_TYPE_Q5_1,
                               SMOL_TYPE_IQ4_NL, SMOL_TYPE_Q2_K, SMOL_TYPE_Q3_K,  SMOL_TYPE_Q4_K,
                               SMOL_TYPE_Q5_K,   SMOL_TYPE_Q6_K, SMOL_TYPE_IQ4_XS};

std::string type_name(smol_type t) {
    const char * n = smol_type_name(t);
    return n ? n : "?";
}

// Types whose activations are block_q8_act (blocks of 32), and those whose
// are block_q8_K (super-blocks of 256).
bool acts_q8(smol_type t) {
    return block_elems(t) == QK;
}
bool acts_q8_K(smol_type t) {
    return block_elems(t) == QK_K;
}

uint32_t bits_of(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

float float_of(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

std::vector<float> gaussian(std::mt19937 & rng, size_t n, float mean = 0.0f, float sd = 1.0f) {
    std::normal_distribution<float> dist(mean, sd);
    std::vector<float> v(n);
    for (float & x : v) x = dist(rng);
    return v;
}

const kernels & generic_kernels() {
    return *kernels_available().front();
}

// --- independent references --------------------------------------------------------

// f16 -> double by the definition of the format.
double ref_half(uint16_t h) {
    const int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v;
    if (e == 0x1f)
        v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    else if (e == 0)
        v = std::ldexp((double)m, -24);
    else
        v = std::ldexp(1024.0 + m, e - 25);
    return sign ? -v : v;
}

// Value used for rounding decisions: the infinity code stands for the next
// power of two, which is where IEEE rounding puts its boundary.
double ref_half_for_rounding(uint16_t h) {
    return (h & 0x7fff) == 0x7c00 ? 65536.0 : ref_half(h);
}

// The nearest f16 by search over the codes, ties to the even code.
uint16_t ref_to_half(float f) {
    if (std::isnan(f)) return 0x7e00;
    const double x = std::fabs((double)f);
    uint16_t lo = 0, hi = 0x7c00; // codes of non-negative values are ordered
    while (hi - lo > 1) {
        const uint16_t mid = (uint16_t)((lo + hi) / 2);
        if (ref_half_for_rounding(mid) <= x)
            lo = mid;
        else
            hi = mid;
    }
    uint16_t r;
    if (x >= 65536.0) {
        r = 0x7c00;
    } else {
        const double dlo = x - ref_half_for_rounding(lo), dhi = ref_half_for_rounding(hi) - x;
        r = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) ? hi : lo);
    }
    return (uint16_t)(r | (std::signbit(f) ? 0x8000 : 0));
}

// The nearest bf16, ties to even, from the two truncation candidates.
uint16_t ref_to_bf16(float f) {
    if (std::isnan(f)) return 0x7fc0;
    const uint32_t u = bits_of(f);
    const uint16_t t = (uint16_t)(u >> 16);
    if ((u & 0xffff) == 0) return t;
    auto value = [](uint16_t h) {
        if ((h & 0x7fff) == 0x7f80)
            return std::ldexp(std::signbit(float_of((uint32_t)h << 16)) ? -1.0 : 1.0, 128);
        return (double)float_of((uint32_t)h << 16);
    };
    const double x = (double)f;
    const double d0 = std::fabs(x - value(t)), d1 = std::fabs(value((uint16_t)(t + 1)) - x);
    if (d0 < d1) return t;
    if (d1 < d0) return (uint16_t)(t + 1);
    return (t & 1) ? (uint16_t)(t + 1) : t;
}

// Dequantization written from the block layouts, not from the kernels.
std::vector<double> ref_dequant(smol_type t, const uint8_t * row, int64_t K) {
    std::vector<double> v((size_t)K);
    switch (t) {
    case SMOL_TYPE_F32:
        for (int64_t k = 0; k < K; k++) v[k] = ((const float *)row)[k];
        break;
    case SMOL_TYPE_F16:
        for (int64_t k = 0; k < K; k++) v[k] = ref_half(((const uint16_t *)row)[k]);
        break;
    case SMOL_TYPE_BF16:
        for (int64_t k = 0; k < K; k++) v[k] = float_of((uint32_t)((const uint16_t *)row)[k] << 16);
        break;
    case SMOL_TYPE_Q8_0:
        for (int64_t b = 0; b < K / QK; b++) {
            const block_q8_0 & blk = ((const block_q8_0 *)row)[b];
            for (int j = 0; j < QK; j++) v[b * QK + j] = ref_half(blk.d) * blk.qs[j];
        }
        break;
    case SMOL_TYPE_Q4_0:
        for (int64_t b = 0; b < K / QK; b++) {
            const block_q4_0 & blk = ((const block_q4_0 *)row)[b];
            for (int j = 0; j < 16; j++) {
                v[b * QK + j] = ref_half(blk.d) * ((blk.qs[j] & 15) - 8);
                v[b * QK + j + 16] = ref_half(blk.d) * ((blk.qs[j] >> 4) - 8);
            }
        }
        break;
    case SMOL_TYPE_Q4_1:
        for (int64_t b = 0; b < K / QK; b++) {
            const block_q4_1 & blk = ((const block_q4_1 *)row)[b];
            for (int j = 0; j < 16; j++) {
                v[b * QK + j] = ref_half(blk.d) * (blk.qs[j] & 15) + ref_half(blk.m);
                v[b * QK + j + 16] = ref_half(blk.d) * (blk.qs[j] >> 4) + ref_half(blk.m);
            }
        }
        break;
    default: {
        // The other types by smol-quant's reference, which equals the gguf
        // package's dequantization bit for bit (scripts/check-quants.py).
        std::vector<float> f((size_t)K);
        smol::dequantize_row(t, row, f.data(), K);
        for (int64_t k = 0; k < K; k++) v[k] = f[k];
        break;
    }
    }
    return v;
}

double squared_error(const std::vector<double> & ref, const std::vector<double> & got) {
    double e = 0.0;
    for (size_t i = 0; i < ref.size(); i++) e += (got[i] - ref[i]) * (got[i] - ref[i]);
    return e;
}

double nmse(const std::vector<double> & ref, const std::vector<double> & got) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < ref.size(); i++) {
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0.0 ? num / den : num;
}

// --- a matmul problem ------------------------------------------------------------------

// Matmul error bounds against the float64 reference, per weight type. The
// weights are exact (the reference dequantizes them); what is left is how
// the activations are rounded before the dot product, plus f32 summation:
// - f32, bf16: activations stay f32; only f32 accumulation over K <= ~4k
//   (relative ~1e-6, NMSE ~1e-12).
// - f16: activations are rounded to f16, a relative error up to 2^-11 per
//   element, NMSE about (2^-11)^2 / 3 ~ 8e-8.
// - q8_0, q4_0, q4_1: activations are quantized to 8 bits per block of 32
//   (step max|x| / 127, error uniform in half a step), NMSE ~3e-5 for
//   Gaussian activations. 5e-4 is test-backend-ops' bound for mul_mat.
//   That is a bound on a mean: over a shape with one output the NMSE is the
//   mean times a chi-squared variable of one degree of freedom, which passes
//   ten times its mean about once in a thousand draws. So for quantized
//   types the NMSE bound judges shapes of 16 outputs or more, and every
//   output meets its own bound (problem::output_bounds).
double matmul_bound(smol_type t) {
    switch (t) {
    case SMOL_TYPE_F32:
    case SMOL_TYPE_BF16:
        return 1e-9;
    case SMOL_TYPE_F16:
        return 1e-6;
    default:
        return 5e-4;
    }
}

struct problem {
    smol_type type;
    int64_t K, rows, r0, r1, n_tok;
    size_t w_row_bytes, act_row_bytes;
    int64_t ldy;
    std::vector<uint8_t> w;   // rows x w_row_bytes
    std::vector<float> x;     // n_tok x K, the original activations
    std::vector<uint8_t> act; // n_tok x act_row_bytes

    problem(smol_type t, int64_t K_, int64_t r0_, int64_t r1_, int64_t n_tok_, std::mt19937 & rng)
        : type(t), K(K_), rows(r1_ + 3), r0(r0_), r1(r1_), n_tok(n_tok_) {
        // Row and activation strides with padding, to catch kernels that
        // assume packed rows.
        w_row_bytes = row_bytes(t, K) + 64;
        act_row_bytes = act_bytes(t, K) + 40;
        ldy = rows + 5;
        w.assign((size_t)rows * w_row_bytes, 0xa5);
        for (int64_t r = 0; r < rows; r++) {
            // Some rows with an offset, so q4_1's minimum matters.
            const std::vector<float> v = gaussian(rng, (size_t)K, r % 3 == 0 ? 0.5f : 0.0f);
            generic_kernels().row_from_f32(t, v.data(), w.data() + r * w_row_bytes, K);
        }
        x = gaussian(rng, (size_t)(n_tok * K));
        act.assign((size_t)n_tok * act_row_bytes, 0x5a);
    }

    // Activations converted by k (every variant must convert identically).
    void convert(const kernels & k) {
        for (int64_t i = 0; i < n_tok; i++)
            k.act_from_f32(type, x.data() + i * K, act.data() + i * act_row_bytes, K);
    }

    std::vector<float> run(const kernels & k) {
        convert(k);
        std::vector<float> y((size_t)(n_tok * ldy), std::numeric_limits<float>::quiet_NaN());
        k.matmul(type, w.data(), w_row_bytes, K, r0, r1, act.data(), act_row_bytes, n_tok, y.data(),
                 ldy);
        return y;
    }

    // The float64 outputs in [r0, r1), token-major, and the energy of the
    // products that make them up (the error's denominator).
    std::vector<double> reference(double & energy) const {
        std::vector<double> ref((size_t)((r1 - r0) * n_tok));
        energy = 0.0;
        for (int64_t r = r0; r < r1; r++) {
            const std::vector<double> wr = ref_dequant(type, w.data() + r * w_row_bytes, K);
            for (int64_t i = 0; i < n_tok; i++) {
                double s = 0.0;
                for (int64_t k = 0; k < K; k++) {
                    const double p = wr[k] * (double)x[i * K + k];
                    s += p;
                    energy += p * p;
                }
                ref[(size_t)(i * (r1 - r0) + (r - r0))] = s;
            }
        }
        return ref;
    }

    // For quantized types, a bound on each output's error, in reference
    // order. Activation k is rounded by at most h_k (half a step; 0.57 of
    // one where the step is kept in f16, as the activation test checks), so
    // the error is a sum of independent, symmetric terms w_k * e_k with
    // |e_k| <= h_k. By Hoeffding's inequality it passes
    // sqrt(2 ln(2 / p) sum_k (w_k h_k)^2) with probability below p = 1e-12;
    // 1e-5 sum_k |w_k x_k| more covers the f32 arithmetic and the f16 sum
    // a q8_0-style block carries.
    std::vector<double> output_bounds() const {
        const int64_t B = acts_q8_K(type) ? QK_K : QK;
        std::vector<double> h((size_t)(n_tok * K));
        for (int64_t i = 0; i < n_tok; i++) {
            for (int64_t b = 0; b < K / B; b++) {
                const float * xb = x.data() + i * K + b * B;
                float amax = 0.0f;
                for (int64_t j = 0; j < B; j++) amax = std::max(amax, std::fabs(xb[j]));
                const double step = acts_q8_K(type)
                                        ? 0.5001 * (amax / 127.0f)
                                        : 0.57 * fp16_to_fp32(fp32_to_fp16(amax / 127.0f));
                for (int64_t j = 0; j < B; j++) h[(size_t)(i * K + b * B + j)] = step;
            }
        }
        const double z2 = 2.0 * std::log(2.0 / 1e-12);
        std::vector<double> bound((size_t)((r1 - r0) * n_tok));
        for (int64_t r = r0; r < r1; r++) {
            const std::vector<double> wr = ref_dequant(type, w.data() + r * w_row_bytes, K);
            for (int64_t i = 0; i < n_tok; i++) {
                double var = 0.0, mag = 0.0;
                for (int64_t k = 0; k < K; k++) {
                    var += wr[k] * wr[k] * h[(size_t)(i * K + k)] * h[(size_t)(i * K + k)];
                    mag += std::fabs(wr[k] * (double)x[i * K + k]);
                }
                bound[(size_t)(i * (r1 - r0) + (r - r0))] = std::sqrt(z2 * var) + 1e-5 * mag;
            }
        }
        return bound;
    }

    // The outputs in [r0, r1), in reference order; counts the outputs that
    // are not finite inside the range and those written outside it.
    std::vector<double> outputs(const std::vector<float> & y, int & not_finite, int & stray) const {
        std::vector<double> got;
        not_finite = stray = 0;
        for (int64_t i = 0; i < n_tok; i++) {
            for (int64_t r = 0; r < ldy; r++) {
                const float v = y[(size_t)(i * ldy + r)];
                if (r >= r0 && r < r1) {
                    if (!std::isfinite(v)) not_finite++;
                    got.push_back(v);
                } else if (!std::isnan(v)) {
                    stray++;
                }
            }
        }
        return got;
    }
};

struct shape {
    int64_t K, r0, r1, n_tok;
};

// Shapes of SmolLM2 (K = 576, 1536), K chunking (4160 = 130 blocks), odd
// row counts, r0 != 0, token counts on both sides of the switch from
// streaming rows to packed panels and around every tile size, and a token
// count past one L2 chunk (130 at K = 1536).
const shape matmul_shapes[] = {
    {64, 0, 1, 1},
    {64, 3, 20, 3},
    {64, 1, 12, 4},
    {576, 5, 42, 5},
    {576, 0, 64, 17},
    {576, 7, 38, 64},
    {576, 2, 19, 1},
    {1536, 1, 14, 1},
    {1536, 4, 33, 3},
    {1536, 0, 9, 17},
    {1536, 3, 12, 64},
    {1536, 0, 5, 130},
    {4160, 2, 11, 1},
    {4160, 1, 8, 6},
    {4160, 1, 8, 9},
    {576, 3, 150, 17},
    {1536, 2, 99, 7},
    // For the 256-element types too (only whole super-blocks).
    {256, 0, 1, 1},
    {256, 2, 30, 5},
    {2048, 1, 20, 3},
    {2048, 0, 33, 64},
    {8192, 0, 5, 2},
};

// Whether a shape's rows hold whole blocks of type t.
bool fits(smol_type t, const shape & s) {
    return s.K % block_elems(t) == 0;
}

} // namespace

TEST_CASE("every variant's name is one of generic, avx2, avx512, dotprod, i8mm; generic first") {
    const std::vector<const kernels *> ks = kernels_available();
    REQUIRE(!ks.empty());
    CHECK(std::string(ks.front()->name) == "generic");
    for (const kernels * k : ks) {
        const std::string n = k->name;
        CHECK((n == "generic" || n == "avx2" || n == "avx512" || n == "dotprod" || n == "i8mm"));
    }
    const std::string best = kernels_best().name;
    bool found = false;
    for (const kernels * k : ks) found = found || best == k->name;
    CHECK(found);
}

TEST_CASE("row and activation sizes follow the GGUF block layouts") {
    CHECK(row_bytes(SMOL_TYPE_F32, 576) == 576 * 4);
    CHECK(row_bytes(SMOL_TYPE_F16, 576) == 576 * 2);
    CHECK(row_bytes(SMOL_TYPE_BF16, 576) == 576 * 2);
    CHECK(row_bytes(SMOL_TYPE_Q8_0, 576) == 18 * 34);
    CHECK(row_bytes(SMOL_TYPE_Q4_0, 576) == 18 * 18);
    CHECK(row_bytes(SMOL_TYPE_Q4_1, 576) == 18 * 20);
    CHECK(block_elems(SMOL_TYPE_F16) == 1);
    CHECK(block_elems(SMOL_TYPE_Q4_1) == 32);
    CHECK(act_bytes(SMOL_TYPE_F32, 64) == 256);
    CHECK(act_bytes(SMOL_TYPE_BF16, 64) == 256);
    CHECK(act_bytes(SMOL_TYPE_F16, 64) == 256); // f32 values rounded to f16
    CHECK(act_bytes(SMOL_TYPE_Q8_0, 64) == 80);
    CHECK(act_bytes(SMOL_TYPE_Q4_0, 64) == 80);
}

TEST_CASE("activations for f16 weights are the inputs rounded to f16, as f32") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    const int64_t K = 600; // more than one of the conversion's chunks, and a tail
    const std::vector<float> x = gaussian(rng, size_t(K));
    for (const kernels * k : kernels_available()) {
        const std::string variant = k->name;
        CAPTURE(variant);
        std::vector<float> act(static_cast<size_t>(K));
        k->act_from_f32(SMOL_TYPE_F16, x.data(), act.data(), K);
        int differ = 0;
        for (int64_t i = 0; i < K; i++)
            differ += act[size_t(i)] != fp16_to_fp32(fp32_to_fp16(x[size_t(i)]));
        CHECK(differ == 0);
    }
}

TEST_CASE("fp16_to_fp32 is exact on all 65536 inputs") {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = fp16_to_fp32((uint16_t)h);
        const double r = ref_half((uint16_t)h);
        if (std::isnan(r)) {
            // NaN keeps its sign and payload.
            const uint32_t want = ((h & 0x8000) << 16) | 0x7f800000 | ((h & 0x3ff) << 13);
            if (bits_of(f) != want) bad++;
        } else if ((double)f != r || std::signbit(f) != (bool)(h & 0x8000)) {
            bad++;
        }
    }
    CHECK(bad == 0);
}

TEST_CASE("bf16_to_fp32 is exact on all 65536 inputs") {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++)
        if (bits_of(bf16_to_fp32((uint16_t)h)) != h << 16) bad++;
    CHECK(bad == 0);
}

TEST_CASE("fp32_to_fp16 rounds to nearest even and keeps inf and nan") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    std::vector<float> in;
    // Every f16 value, the midpoints between neighbours (ties) and the
    // floats either side of each midpoint.
    for (uint32_t h = 0; h < 0x7c00; h++) {
        const float v = fp16_to_fp32((uint16_t)h);
        const float mid =
            (float)((ref_half((uint16_t)h) + ref_half_for_rounding((uint16_t)(h + 1))) / 2);
        for (float s : {1.0f, -1.0f}) {
            in.push_back(s * v);
            in.push_back(s * mid);
            in.push_back(s * std::nextafter(mid, 0.0f));
            in.push_back(s * std::nextafter(mid, 1e30f));
        }
    }
    for (float v :
         {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e10f, -1e10f, 1e-10f, 5.96e-8f, 2.98e-8f,
          2.99e-8f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::denorm_min()})
        in.push_back(v);
    std::uniform_int_distribution<uint32_t> any;
    for (int i = 0; i < 1000000; i++) {
        const float f = float_of(any(rng));
        if (!std::isnan(f)) in.push_back(f);
    }
    int bad = 0;
    for (float f : in)
        if (fp32_to_fp16(f) != ref_to_half(f)) bad++;
    CHECK(bad == 0);
    // NaN stays NaN (quiet), with its sign.
    for (uint32_t u : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffffffu}) {
        const uint16_t h = fp32_to_fp16(float_of(u));
        CHECK((h & 0x7c00) == 0x7c00);
        CHECK((h & 0x3ff) != 0);
        CHECK((h >> 15) == (u >> 31));
    }
    // Every variant's vector conversion writes the same bits.
    for (const kernels * k : kernels_available()) {
        const std::string variant = k->name;
        CAPTURE(variant);
        std::vector<uint16_t> out(in.size());
        k->f32_to_f16(in.data(), out.data(), (int64_t)in.size());
        int differ = 0;
        for (size_t i = 0; i < in.size(); i++)
            if (out[i] != fp32_to_fp16(in[i])) differ++;
        CHECK(differ == 0);
    }
}

TEST_CASE("fp32_to_bf16 rounds to nearest even and keeps inf and nan") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    std::vector<float> in;
    for (uint32_t h = 0; h < 0x7f80; h++) {
        const uint32_t u = h << 16;
        for (uint32_t low : {0u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
            for (uint32_t s : {0u, 0x80000000u}) in.push_back(float_of(s | u | low));
    }
    std::uniform_int_distribution<uint32_t> any;
    for (int i = 0; i < 1000000; i++) {
        const float f = float_of(any(rng));
        if (!std::isnan(f)) in.push_back(f);
    }
    int bad = 0;
    for (float f : in)
        if (fp32_to_bf16(f) != ref_to_bf16(f)) bad++;
    CHECK(bad == 0);
    CHECK(fp32_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
    CHECK(fp32_to_bf16(-std::numeric_limits<float>::infinity()) == 0xff80);
    for (uint32_t u : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffffffu}) {
        const uint16_t h = fp32_to_bf16(float_of(u));
        CHECK((h & 0x7f80) == 0x7f80);
        CHECK((h & 0x7f) != 0);
    }
    for (const kernels * k : kernels_available()) {
        const std::string variant = k->name;
        CAPTURE(variant);
        std::vector<uint16_t> out(in.size());
        k->row_from_f32(SMOL_TYPE_BF16, in.data(), out.data(), (int64_t)in.size());
        int differ = 0;
        for (size_t i = 0; i < in.size(); i++)
            if (out[i] != fp32_to_bf16(in[i])) differ++;
        CHECK(differ == 0);
    }
}

TEST_CASE("quantization follows ggml's reference rule on hand-made blocks") {
    const kernels & k = generic_kernels();
    SUBCASE("q8_0: d = amax / 127, q = round half away from zero of x / d") {
        float x[32];
        for (int j = 0; j < 32; j++) x[j] = (float)(j - 16);
        x[0] = 127.0f; // amax 127: d = 1 exactly
        x[1] = -2.5f;  // ties round away from zero
        x[2] = 2.5f;
        x[3] = 0.49f;
        x[4] = -126.6f;
        block_q8_0 b;
        k.row_from_f32(SMOL_TYPE_Q8_0, x, &b, 32);
        CHECK(b.d == 0x3c00);
        CHECK(b.qs[0] == 127);
        CHECK(b.qs[1] == -3);
        CHECK(b.qs[2] == 3);
        CHECK(b.qs[3] == 0);
        CHECK(b.qs[4] == -127);
        for (int j = 5; j < 32; j++) CHECK(b.qs[j] == j - 16);
    }
    SUBCASE(
        "q4_0: d = -max / 8 where max has the largest magnitude, q = min(15, (int)(x / d + 8.5))") {
        float x[32] = {};
        x[0] = -8.0f; // largest magnitude, negative: d = 1
        x[1] = 7.0f;  // 15
        x[2] = 7.9f;  // 16.4 -> clamped to 15
        x[3] = 0.49f; // 8.99 -> 8
        x[4] = 0.5f;  // 9
        x[5] = -0.5f; // 8
        x[6] = -0.51f;
        x[16] = -3.0f; // 5
        x[17] = 2.0f;  // 10
        block_q4_0 b;
        k.row_from_f32(SMOL_TYPE_Q4_0, x, &b, 32);
        CHECK(b.d == 0x3c00);
        const int lo[16] = {0, 15, 15, 8, 9, 8, 7, 8, 8, 8, 8, 8, 8, 8, 8, 8};
        const int hi[16] = {5, 10, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8};
        for (int j = 0; j < 16; j++) {
            CAPTURE(j);
            CHECK((b.qs[j] & 15) == lo[j]);
            CHECK((b.qs[j] >> 4) == hi[j]);
        }
        // A positive extreme gives a negative scale.
        float y[32] = {};
        y[0] = 8.0f;   // d = -1: 0
        y[1] = -7.0f;  // 15 (15.5 truncates)
        y[2] = 3.0f;   // 5
        y[20] = -8.0f; // largest magnitude ties keep the first: 16.5 -> 15
        k.row_from_f32(SMOL_TYPE_Q4_0, y, &b, 32);
        CHECK(b.d == 0xbc00);
        CHECK((b.qs[0] & 15) == 0);
        CHECK((b.qs[1] & 15) == 15);
        CHECK((b.qs[2] & 15) == 5);
        CHECK((b.qs[4] >> 4) == 15);
        CHECK((b.qs[3] & 15) == 8);
    }
    SUBCASE("q4_1: d = (max - min) / 15, m = min, q = min(15, (int)((x - min) / d + 0.5))") {
        float x[32];
        for (int j = 0; j < 32; j++) x[j] = 3.0f;
        x[0] = -1.0f;  // min: m = -1
        x[1] = 14.0f;  // max: d = 1, q = 15
        x[2] = 0.49f;  // 1.49 + 0.5 -> 1
        x[3] = 0.5f;   // 1.5 + 0.5 -> 2
        x[16] = -0.6f; // 0.4 + 0.5 -> 0
        block_q4_1 b;
        k.row_from_f32(SMOL_TYPE_Q4_1, x, &b, 32);
        CHECK(b.d == 0x3c00);
        CHECK(b.m == 0xbc00);
        CHECK((b.qs[0] & 15) == 0);
        CHECK((b.qs[1] & 15) == 15);
        CHECK((b.qs[2] & 15) == 1);
        CHECK((b.qs[3] & 15) == 2);
        CHECK((b.qs[0] >> 4) == 0);
        CHECK((b.qs[5] & 15) == 4);
    }
    SUBCASE("an all-zero block has zero scale and zero codes") {
        float x[32] = {};
        block_q8_0 b8;
        k.row_from_f32(SMOL_TYPE_Q8_0, x, &b8, 32);
        CHECK(b8.d == 0);
        for (int j = 0; j < 32; j++) CHECK(b8.qs[j] == 0);
        block_q4_0 b4;
        k.row_from_f32(SMOL_TYPE_Q4_0, x, &b4, 32);
        CHECK((b4.d & 0x7fff) == 0); // ggml writes -0: d = 0 / -8
        for (int j = 0; j < 16; j++) CHECK(b4.qs[j] == 0x88);
    }
}

TEST_CASE("every variant quantizes weights identically") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    const int64_t n = 4096;
    const std::vector<float> x = gaussian(rng, n, 0.1f, 2.0f);
    for (smol_type t : all_types) {
        const std::string type = type_name(t);
        CAPTURE(type);
        std::vector<uint8_t> want(row_bytes(t, n));
        generic_kernels().row_from_f32(t, x.data(), want.data(), n);
        for (const kernels * k : kernels_available()) {
            const std::string variant = k->name;
            CAPTURE(variant);
            std::vector<uint8_t> got(row_bytes(t, n), 0xee);
            k->row_from_f32(t, x.data(), got.data(), n);
            CHECK(got == want);
        }
    }
}

TEST_CASE("row_from_f32 then row_to_f32 loses no more than each type's rounding") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    const int64_t n = 8192;
    // Gaussian data, unit variance. Expected NMSE: f16 ~(2^-11)^2/3,
    // bf16 ~(2^-8)^2/3; q8_0 (step amax/127 ~ 2.5/127) ~3e-5; q4_0 and q4_1
    // (step ~5/15 or 2.5/8) ~1e-2.
    const std::vector<float> x = gaussian(rng, n);
    // The other types, measured on such data: q5_0 1.9e-3, q5_1 1.5e-3,
    // iq4_nl 5.8e-3, q2_K 8.7e-2, q3_K 2.3e-2, q4_K 5.1e-3, q5_K 1.3e-3,
    // q6_K 3.2e-4, iq4_xs 5.9e-3 (the fitted 4-bit types beat q4_0's 7.5e-3
    // at the same size or less); each bound is about twice that.
    const struct {
        smol_type t;
        double bound;
    } cases[] = {{SMOL_TYPE_F32, 0.0},     {SMOL_TYPE_F16, 2e-7},  {SMOL_TYPE_BF16, 1e-5},
                 {SMOL_TYPE_Q8_0, 1e-4},   {SMOL_TYPE_Q4_0, 2e-2}, {SMOL_TYPE_Q4_1, 2e-2},
                 {SMOL_TYPE_Q5_0, 4e-3},   {SMOL_TYPE_Q5_1, 3e-3}, {SMOL_TYPE_IQ4_NL, 1.2e-2},
                 {SMOL_TYPE_Q2_K, 1.8e-1}, {SMOL_TYPE_Q3_K, 5e-2}, {SMOL_TYPE_Q4_K, 1.1e-2},
                 {SMOL_TYPE_Q5_K, 3e-3},   {SMOL_TYPE_Q6_K, 7e-4}, {SMOL_TYPE_IQ4_XS, 1.2e-2}};
    for (const kernels * k : kernels_available()) {
        const std::string variant = k->name;
        CAPTURE(variant);
        for (const auto & c : cases) {
            const std::string type = type_name(c.t);
            CAPTURE(type);
            std::vector<uint8_t> q(row_bytes(c.t, n));
            k->row_from_f32(c.t, x.data(), q.data(), n);
            std::vector<float> back(n, std::numeric_limits<float>::quiet_NaN());
            k->row_to_f32(c.t, q.data(), back.data(), n);
            std::vector<double> ref(x.begin(), x.end()), got(back.begin(), back.end());
            const double e = nmse(ref, got);
            CAPTURE(e);
            CHECK(e <= c.bound);
            // row_to_f32 agrees with the independent dequantization, up to
            // f32 rounding of q * d + m (terms of about unit size here, and
            // their sum may cancel).
            const std::vector<double> deq = ref_dequant(c.t, q.data(), n);
            int differ = 0;
            for (int64_t i = 0; i < n; i++)
                if (std::fabs(deq[i] - back[i]) > 1e-6 * (std::fabs(deq[i]) + 1.0)) differ++;
            CHECK(differ == 0);
            // Per element: q8_0 is within half a step (plus the f16 scale's
            // rounding); q4_0 within one step (its top code is clamped).
            if (c.t == SMOL_TYPE_Q8_0 || c.t == SMOL_TYPE_Q4_0 || c.t == SMOL_TYPE_Q4_1) {
                int worse = 0;
                for (int64_t b = 0; b < n / QK; b++) {
                    float amax = 0.0f, mn = x[b * QK], mx = x[b * QK];
                    for (int j = 0; j < QK; j++) {
                        amax = std::max(amax, std::fabs(x[b * QK + j]));
                        mn = std::min(mn, x[b * QK + j]);
                        mx = std::max(mx, x[b * QK + j]);
                    }
                    double tol;
                    if (c.t == SMOL_TYPE_Q8_0)
                        tol = 0.6 * amax / 127;
                    else if (c.t == SMOL_TYPE_Q4_0)
                        tol = 1.01 * amax / 8;
                    else
                        tol = 0.51 * (mx - mn) / 15 + std::fabs(mn) * 1e-3 + (mx - mn) * 1e-2;
                    for (int j = 0; j < QK; j++)
                        if (std::fabs(back[b * QK + j] - x[b * QK + j]) > tol) worse++;
                }
                CHECK(worse == 0);
            }
        }
    }
}

TEST_CASE("every variant converts activations to identical bytes") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    const int64_t K = 1536;
    std::vector<float> x = gaussian(rng, K);
    x[5] = 0.0f;
    for (int j = 64; j < 96; j++) x[j] = 0.0f; // an all-zero block
    for (smol_type t : all_types) {
        const std::string type = type_name(t);
        CAPTURE(type);
        std::vector<uint8_t> want(act_bytes(t, K));
        generic_kernels().act_from_f32(t, x.data(), want.data(), K);
        for (const kernels * k : kernels_available()) {
            const std::string variant = k->name;
            CAPTURE(variant);
            std::vector<uint8_t> got(act_bytes(t, K), 0xee);
            k->act_from_f32(t, x.data(), got.data(), K);
            CHECK(got == want);
        }
        if (acts_q8_K(t)) {
            // d = max|x| / 127 in f32, |qs| <= 127 with the extreme at +-127,
            // each code within half a step, bsums the sums of 16 codes.
            const smol::block_q8_K * a = (const smol::block_q8_K *)want.data();
            for (int64_t b = 0; b < K / QK_K; b++) {
                float amax = 0.0f;
                int qmax = 0;
                for (int j = 0; j < QK_K; j++) {
                    amax = std::max(amax, std::fabs(x[b * QK_K + j]));
                    qmax = std::max(qmax, std::abs((int)a[b].qs[j]));
                    CHECK(std::fabs(a[b].qs[j] * (double)a[b].d - x[b * QK_K + j]) <=
                          0.5001 * a[b].d);
                }
                CHECK(a[b].d == amax / 127.0f);
                CHECK(qmax == (amax > 0.0f ? 127 : 0));
                for (int g = 0; g < QK_K / 16; g++) {
                    int sum = 0;
                    for (int j = 0; j < 16; j++) sum += a[b].qs[16 * g + j];
                    CHECK(a[b].bsums[g] == sum);
                }
            }
        }
        if (acts_q8(t)) {
            // d = max|x| / 127 and s = d * sum(qs), both kept at f16 precision
            // as in ggml's q8_1; |qs| <= 127 with the extreme at +-127. Each
            // code is within half a step of x, plus the f16 rounding of d
            // times |qs| <= 127 (127 * 2^-11 < 0.07 steps).
            const block_q8_act * a = (const block_q8_act *)want.data();
            auto f16 = [](float v) { return fp16_to_fp32(fp32_to_fp16(v)); };
            for (int64_t b = 0; b < K / QK; b++) {
                float amax = 0.0f;
                int sum = 0, qmax = 0;
                for (int j = 0; j < QK; j++) {
                    amax = std::max(amax, std::fabs(x[b * QK + j]));
                    sum += a[b].qs[j];
                    qmax = std::max(qmax, std::abs((int)a[b].qs[j]));
                    CHECK(std::fabs(a[b].qs[j] * (double)a[b].d - x[b * QK + j]) <= 0.57 * a[b].d);
                }
                CHECK(a[b].d == f16(amax / 127.0f));
                CHECK(a[b].s == f16(amax / 127.0f * (float)sum));
                CHECK(qmax == (amax > 0.0f ? 127 : 0));
            }
        }
    }
}

TEST_CASE("matmul matches a float64 reference for every variant, type and shape") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    for (smol_type t : all_types) {
        const std::string type = type_name(t);
        CAPTURE(type);
        for (const shape & s : matmul_shapes) {
            if (!fits(t, s)) continue;
            CAPTURE(s.K);
            CAPTURE(s.r0);
            CAPTURE(s.r1);
            CAPTURE(s.n_tok);
            problem p(t, s.K, s.r0, s.r1, s.n_tok, rng);
            double energy = 0.0;
            const std::vector<double> ref = p.reference(energy);
            const bool quantized = block_elems(t) > 1;
            const std::vector<double> bound = quantized ? p.output_bounds() : std::vector<double>();
            for (const kernels * k : kernels_available()) {
                const std::string variant = k->name;
                CAPTURE(variant);
                int not_finite = 0, stray = 0;
                const std::vector<double> got = p.outputs(p.run(*k), not_finite, stray);
                CHECK(not_finite == 0);
                CHECK(stray == 0);
                const double e = squared_error(ref, got) / energy;
                CAPTURE(e);
                if (!quantized || ref.size() >= 16) CHECK(e <= matmul_bound(t));
                if (quantized) {
                    int over = 0;
                    for (size_t i = 0; i < ref.size(); i++)
                        over += std::fabs(got[i] - ref[i]) > bound[i];
                    CHECK(over == 0);
                }
            }
        }
    }
}

TEST_CASE("matmul on float weights handles K that is not a multiple of 8") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    for (smol_type t : {SMOL_TYPE_F32, SMOL_TYPE_F16, SMOL_TYPE_BF16}) {
        const std::string type = type_name(t);
        CAPTURE(type);
        for (int64_t K : {1, 7, 13, 100, 1037, 2051}) {
            for (int64_t n_tok : {1, 2, 5, 13}) {
                CAPTURE(K);
                CAPTURE(n_tok);
                problem p(t, K, 1, 12, n_tok, rng);
                double energy = 0.0;
                const std::vector<double> ref = p.reference(energy);
                for (const kernels * k : kernels_available()) {
                    const std::string variant = k->name;
                    CAPTURE(variant);
                    int not_finite = 0, stray = 0;
                    const std::vector<double> got = p.outputs(p.run(*k), not_finite, stray);
                    CHECK(not_finite == 0);
                    CHECK(stray == 0);
                    CHECK(squared_error(ref, got) / energy <= matmul_bound(t));
                }
            }
        }
    }
}

TEST_CASE("every variant's matmul agrees closely with generic") {
    // Same activations (checked bit-identical above) and same integer dot
    // products; only the order of f32 additions differs, so the outputs
    // differ by a few f32 roundings: an error far below 1e-10.
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    for (smol_type t : all_types) {
        const std::string type = type_name(t);
        CAPTURE(type);
        for (const shape & s : {shape{576, 3, 40, 1}, shape{1536, 0, 23, 7}, shape{576, 1, 30, 64},
                                shape{2048, 1, 30, 5}}) {
            if (!fits(t, s)) continue;
            CAPTURE(s.K);
            CAPTURE(s.n_tok);
            problem p(t, s.K, s.r0, s.r1, s.n_tok, rng);
            double energy = 0.0;
            p.reference(energy);
            int nf = 0, st = 0;
            const std::vector<double> want = p.outputs(p.run(generic_kernels()), nf, st);
            for (const kernels * k : kernels_available()) {
                const std::string variant = k->name;
                CAPTURE(variant);
                const std::vector<double> got = p.outputs(p.run(*k), nf, st);
                CHECK(nf == 0);
                CHECK(st == 0);
                CHECK(squared_error(want, got) / energy <= 1e-10);
            }
        }
    }
}

TEST_CASE("a token's matmul outputs are the same bits whatever the batch around it") {
    // Continuous batching relies on it: every path (decode rows, prefill
    // tiles, the tiles of the tokens and rows left over, token chunks,
    // blocks of packed rows) computes an output with the same operations in
    // the same order. The last shape crosses a token chunk and a block of
    // packed rows of the 512-bit float kernel.
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    for (smol_type t : all_types) {
        const std::string type = type_name(t);
        CAPTURE(type);
        for (const shape & s : {shape{576, 1, 37, 13}, shape{1536, 0, 18, 7}, shape{64, 3, 20, 64},
                                shape{576, 0, 16, 130}, shape{104, 2, 11, 9}, shape{13, 0, 5, 8},
                                shape{2048, 1, 72, 70}, shape{256, 0, 9, 33}}) {
            if (!fits(t, s)) continue;
            CAPTURE(s.K);
            CAPTURE(s.n_tok);
            problem p(t, s.K, s.r0, s.r1, s.n_tok, rng);
            for (const kernels * k : kernels_available()) {
                const std::string variant = k->name;
                CAPTURE(variant);
                const std::vector<float> all = p.run(*k);
                int differ = 0;
                std::vector<float> one((size_t)p.ldy);
                for (int64_t i = 0; i < p.n_tok; i++) {
                    std::fill(one.begin(), one.end(), 0.0f);
                    k->matmul(t, p.w.data(), p.w_row_bytes, p.K, p.r0, p.r1,
                              p.act.data() + i * p.act_row_bytes, p.act_row_bytes, 1, one.data(),
                              p.ldy);
                    differ += std::memcmp(one.data() + p.r0, all.data() + i * p.ldy + p.r0,
                                          size_t(p.r1 - p.r0) * sizeof(float)) != 0;
                }
                CHECK(differ == 0);
            }
        }
    }
}

namespace {

// ARM's variant of that name where this CPU has it (dotprod: ARMv8.2 and
// later; i8mm: 8.6, optional from 8.2), else null: its case is then
// skipped, and counted as skipped.
const kernels * arm_variant(const char * name) {
    for (const kernels * k : kernels_available())
        if (std::string(k->name) == name) return k;
    return nullptr;
}

// A variant's matmul bits against the generic variant's, every type, one
// token (decode) and 9 (prefill: the i8mm tiles and a tail), rows in tiles
// and a tail.
void check_generic_bits(const kernels * v) {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    for (smol_type t : all_types) {
        const std::string type = type_name(t);
        CAPTURE(type);
        for (int64_t n_tok : {1, 9}) {
            CAPTURE(n_tok);
            problem p(t, 1536, 0, 37, n_tok, rng);
            const std::vector<float> want = p.run(*kernels_available().front()), got = p.run(*v);
            int differ = 0;
            for (size_t i = 0; i < want.size(); i++)
                if (bits_of(want[i]) != bits_of(got[i])) differ++;
            CHECK(differ == 0);
        }
    }
}

} // namespace

TEST_CASE("ARM's dotprod variant gives the generic variant's matmul bits" *
          doctest::skip(arm_variant("dotprod") == nullptr)) {
    // Its quantized dot products are the generic ones' exact integers (sdot)
    // under the same float steps; everything else is the generic code.
    check_generic_bits(arm_variant("dotprod"));
}

TEST_CASE("ARM's i8mm variant gives the generic variant's matmul bits" *
          doctest::skip(arm_variant("i8mm") == nullptr)) {
    // Prefill tiles take smmla's exact integers, under the same float steps.
    check_generic_bits(arm_variant("i8mm"));
}

TEST_CASE("matmul called concurrently on disjoint row ranges equals one call") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    const kernels & k = kernels_best();
    for (smol_type t : all_types) {
        const std::string type = type_name(t);
        CAPTURE(type);
        for (int64_t n_tok : {1, 9}) {
            problem p(t, 1536, 0, 101, n_tok, rng);
            const std::vector<float> whole = p.run(k);
            std::vector<float> split((size_t)(p.n_tok * p.ldy),
                                     std::numeric_limits<float>::quiet_NaN());
            auto part = [&](int64_t r0, int64_t r1) {
                k.matmul(t, p.w.data(), p.w_row_bytes, p.K, r0, r1, p.act.data(), p.act_row_bytes,
                         p.n_tok, split.data(), p.ldy);
            };
            std::thread a(part, 0, 37), b(part, 37, 70), c(part, 70, 101);
            a.join();
            b.join();
            c.join();
            int differ = 0;
            for (size_t i = 0; i < whole.size(); i++)
                if (bits_of(whole[i]) != bits_of(split[i])) differ++;
            CHECK(differ == 0);
        }
    }
}

TEST_CASE("f32_to_f16 rounds every variant's rows as the scalar conversion does") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    for (const kernels * k : kernels_available()) {
        const std::string variant = k->name;
        CAPTURE(variant);
        for (int64_t n : {1, 7, 8, 16, 33, 64, 100, 1000}) {
            CAPTURE(n);
            const std::vector<float> xf = gaussian(rng, n);
            std::vector<uint16_t> h(n);
            k->f32_to_f16(xf.data(), h.data(), n);
            for (int64_t i = 0; i < n; i++) CHECK(h[i] == fp32_to_fp16(xf[i]));
        }
    }
}

TEST_CASE(
    "attention over scattered cells matches float64, a query's result alone or among others") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    for (const kernels * k : kernels_available()) {
        const std::string variant = k->name;
        CAPTURE(variant);
        for (int64_t hd : {64, 128, 72, 13}) {
            for (int32_t n : {1, 7, 8, 9, 37, 200}) {
                for (int nq : {1, 2, 3, 5}) {
                    CAPTURE(hd);
                    CAPTURE(n);
                    CAPTURE(nq);
                    const int32_t n_cells = 2 * n + 5;
                    const std::vector<float> kf = gaussian(rng, size_t(n_cells * hd)),
                                             vf = gaussian(rng, size_t(n_cells * hd)),
                                             q = gaussian(rng, size_t(nq * hd));
                    std::vector<uint16_t> kh(kf.size()), vh(vf.size());
                    k->f32_to_f16(kf.data(), kh.data(), int64_t(kf.size()));
                    k->f32_to_f16(vf.data(), vh.data(), int64_t(vf.size()));
                    // Distinct cells in a scattered order.
                    std::vector<int32_t> cells(static_cast<size_t>(n_cells));
                    for (int32_t c = 0; c < n_cells; c++) cells[size_t(c)] = c;
                    std::shuffle(cells.begin(), cells.end(), rng);
                    cells.resize(size_t(n));
                    const float scale = 0.125f;
                    const int64_t ld = n + 3;
                    std::vector<float> sc(static_cast<size_t>(nq * ld)),
                        mx(static_cast<size_t>(nq));
                    k->attn_scores(kh.data(), cells.data(), n, hd, q.data(), nq, scale, sc.data(),
                                   ld, mx.data());
                    int bad = 0, alone_differs = 0, bad_max = 0;
                    for (int g = 0; g < nq; g++) {
                        float want_mx = -INFINITY;
                        for (int32_t j = 0; j < n; j++) {
                            const float got = sc[size_t(g * ld + j)];
                            double ref = 0.0, mag = 0.0;
                            for (int64_t d = 0; d < hd; d++) {
                                const double pr = ref_half(kh[size_t(cells[size_t(j)] * hd + d)]) *
                                                  q[size_t(g * hd + d)];
                                ref += pr;
                                mag += std::fabs(pr);
                            }
                            bad += std::fabs(got - ref * scale) >
                                   (hd + 2) * 6e-8 * mag * scale + 1e-30;
                            want_mx = std::max(want_mx, got);
                            // The same query and cell alone: the same bits.
                            float one = 0.0f, one_mx = 0.0f;
                            k->attn_scores(kh.data(), cells.data() + j, 1, hd, q.data() + g * hd, 1,
                                           scale, &one, 1, &one_mx);
                            alone_differs += std::memcmp(&one, &got, sizeof one) != 0;
                        }
                        bad_max += mx[size_t(g)] != want_mx;
                    }
                    CHECK(bad == 0);
                    CHECK(alone_differs == 0);
                    CHECK(bad_max == 0);

                    // Weights with some zeros, as softmax gives for far cells.
                    std::vector<float> p = gaussian(rng, size_t(nq * ld));
                    for (int32_t j = 0; j < n; j += 3) p[size_t(j)] = 0.0f;
                    std::vector<float> acc(static_cast<size_t>(nq * hd),
                                           std::numeric_limits<float>::quiet_NaN());
                    k->attn_values(vh.data(), cells.data(), p.data(), ld, nq, n, hd, acc.data());
                    bad = alone_differs = 0;
                    std::vector<float> one(static_cast<size_t>(hd));
                    for (int g = 0; g < nq; g++) {
                        for (int64_t d = 0; d < hd; d++) {
                            double ref = 0.0, mag = 0.0;
                            for (int32_t j = 0; j < n; j++) {
                                const double pr = p[size_t(g * ld + j)] *
                                                  ref_half(vh[size_t(cells[size_t(j)] * hd + d)]);
                                ref += pr;
                                mag += std::fabs(pr);
                            }
                            bad += !(std::fabs(acc[size_t(g * hd + d)] - ref) <=
                                     (n + 2) * 6e-8 * mag + 1e-30);
                        }
                        k->attn_values(vh.data(), cells.data(), p.data() + g * ld, ld, 1, n, hd,
                                       one.data());
                        alone_differs += std::memcmp(one.data(), acc.data() + g * hd,
                                                     size_t(hd) * sizeof(float)) != 0;
                    }
                    CHECK(bad == 0);
                    CHECK(alone_differs == 0);
                }
            }
        }
    }
}

// The value of element i of a q8_0 or q4_0 row, in double, from the block
// layouts' definition (ggml's): q8_0 d * qs[i]; q4_0 d * (nibble - 8), the
// low nibbles holding elements 0-15 of a block, the high ones 16-31.
double ref_block_value(smol_type t, const uint8_t * row, int64_t i) {
    const int64_t b = i / QK, e = i % QK;
    if (t == SMOL_TYPE_Q8_0) {
        const block_q8_0 & blk = reinterpret_cast<const block_q8_0 *>(row)[b];
        return ref_half(blk.d) * double(blk.qs[e]);
    }
    const block_q4_0 & blk = reinterpret_cast<const block_q4_0 *>(row)[b];
    const int q = e < 16 ? blk.qs[e] & 0xF : blk.qs[e - 16] >> 4;
    return ref_half(blk.d) * double(q - 8);
}

TEST_CASE("attention over a q8_0 or q4_0 cache matches float64 over the stored values") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    for (const kernels * k : kernels_available()) {
        const std::string variant = k->name;
        CAPTURE(variant);
        for (smol_type t : {SMOL_TYPE_Q8_0, SMOL_TYPE_Q4_0}) {
            for (int64_t hd : {32, 64, 128}) {
                for (int32_t n : {1, 9, 70}) {
                    for (int nq : {1, 3}) {
                        const std::string type = type_name(t);
                        CAPTURE(type);
                        CAPTURE(hd);
                        CAPTURE(n);
                        CAPTURE(nq);
                        const int32_t n_cells = 2 * n + 5;
                        const size_t rb = row_bytes(t, hd);
                        const std::vector<float> kf = gaussian(rng, size_t(n_cells * hd)),
                                                 vf = gaussian(rng, size_t(n_cells * hd)),
                                                 q = gaussian(rng, size_t(nq * hd));
                        std::vector<uint8_t> kq(rb * size_t(n_cells)), vq(kq.size());
                        for (int32_t c = 0; c < n_cells; c++) {
                            k->row_from_f32(t, kf.data() + c * hd, kq.data() + size_t(c) * rb, hd);
                            k->row_from_f32(t, vf.data() + c * hd, vq.data() + size_t(c) * rb, hd);
                        }
                        std::vector<int32_t> cells(static_cast<size_t>(n_cells));
                        for (int32_t c = 0; c < n_cells; c++) cells[size_t(c)] = c;
                        std::shuffle(cells.begin(), cells.end(), rng);
                        cells.resize(size_t(n));
                        const float scale = 0.125f;
                        const int64_t ld = n + 3;
                        std::vector<float> sc(static_cast<size_t>(nq * ld),
                                              std::numeric_limits<float>::quiet_NaN()),
                            mx(static_cast<size_t>(nq));
                        k->attn_scores_q(t, kq.data(), cells.data(), n, hd, q.data(), nq, scale,
                                         sc.data(), ld, mx.data());
                        // f32 sums of hd products: within (hd + 2) ulps of
                        // the products' magnitudes, as for the f16 cache.
                        int bad = 0, alone_differs = 0, bad_max = 0;
                        for (int g = 0; g < nq; g++) {
                            float want_mx = -INFINITY;
                            for (int32_t j = 0; j < n; j++) {
                                const uint8_t * row = kq.data() + size_t(cells[size_t(j)]) * rb;
                                const float got = sc[size_t(g * ld + j)];
                                double ref = 0.0, mag = 0.0;
                                for (int64_t d = 0; d < hd; d++) {
                                    const double pr =
                                        ref_block_value(t, row, d) * q[size_t(g * hd + d)];
                                    ref += pr;
                                    mag += std::fabs(pr);
                                }
                                bad += !(std::fabs(got - ref * scale) <=
                                         (hd + 2) * 6e-8 * mag * scale + 1e-30);
                                want_mx = std::max(want_mx, got);
                                float one = 0.0f, one_mx = 0.0f;
                                k->attn_scores_q(t, kq.data(), cells.data() + j, 1, hd,
                                                 q.data() + g * hd, 1, scale, &one, 1, &one_mx);
                                alone_differs += std::memcmp(&one, &got, sizeof one) != 0;
                            }
                            bad_max += mx[size_t(g)] != want_mx;
                        }
                        CHECK(bad == 0);
                        CHECK(alone_differs == 0);
                        CHECK(bad_max == 0);

                        std::vector<float> p = gaussian(rng, size_t(nq * ld));
                        for (int32_t j = 0; j < n; j += 3) p[size_t(j)] = 0.0f;
                        std::vector<float> acc(static_cast<size_t>(nq * hd),
                                               std::numeric_limits<float>::quiet_NaN());
                        k->attn_values_q(t, vq.data(), cells.data(), p.data(), ld, nq, n, hd,
                                         acc.data());
                        bad = alone_differs = 0;
                        std::vector<float> one(static_cast<size_t>(hd));
                        for (int g = 0; g < nq; g++) {
                            for (int64_t d = 0; d < hd; d++) {
                                double ref = 0.0, mag = 0.0;
                                for (int32_t j = 0; j < n; j++) {
                                    const uint8_t * row = vq.data() + size_t(cells[size_t(j)]) * rb;
                                    const double pr =
                                        p[size_t(g * ld + j)] * ref_block_value(t, row, d);
                                    ref += pr;
                                    mag += std::fabs(pr);
                                }
                                bad += !(std::fabs(acc[size_t(g * hd + d)] - ref) <=
                                         (n + 2) * 6e-8 * mag + 1e-30);
                            }
                            k->attn_values_q(t, vq.data(), cells.data(), p.data() + g * ld, ld, 1,
                                             n, hd, one.data());
                            alone_differs += std::memcmp(one.data(), acc.data() + g * hd,
                                                         size_t(hd) * sizeof(float)) != 0;
                        }
                        CHECK(bad == 0);
                        CHECK(alone_differs == 0);
                    }
                }
            }
        }
    }
}

TEST_CASE("the f32 vector primitives match float64") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    for (const kernels * k : kernels_available()) {
        const std::string variant = k->name;
        CAPTURE(variant);
        for (int64_t n : {1, 5, 8, 31, 32, 33, 100, 576, 1537}) {
            CAPTURE(n);
            const std::vector<float> a = gaussian(rng, n), b = gaussian(rng, n);
            double dot = 0.0, mag = 0.0, ss = 0.0;
            for (int64_t i = 0; i < n; i++) {
                dot += (double)a[i] * b[i];
                mag += std::fabs((double)a[i] * b[i]);
                ss += (double)a[i] * a[i];
            }
            // Within n roundings of the sum of magnitudes, as above.
            CHECK(std::fabs(k->dot_f32(a.data(), b.data(), n) - dot) <= (n + 1) * 6e-8 * mag);
            CHECK(std::fabs(k->sum_sq(a.data(), n) - ss) <= (n + 1) * 6e-8 * ss);

            // scale, mul and add are one f32 operation per element: exact.
            std::vector<float> y(n, std::numeric_limits<float>::quiet_NaN());
            k->scale(y.data(), a.data(), 0.125f * 3, n);
            int bad = 0;
            for (int64_t i = 0; i < n; i++) bad += y[i] != 0.375f * a[i];
            std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
            k->mul(y.data(), a.data(), b.data(), n);
            for (int64_t i = 0; i < n; i++) bad += y[i] != a[i] * b[i];
            std::fill(y.begin(), y.end(), std::numeric_limits<float>::quiet_NaN());
            k->add(y.data(), a.data(), b.data(), n);
            for (int64_t i = 0; i < n; i++) bad += y[i] != a[i] + b[i];
            // In place, as the model uses them.
            std::vector<float> z = a;
            k->mul(z.data(), z.data(), b.data(), n);
            for (int64_t i = 0; i < n; i++) bad += z[i] != a[i] * b[i];
            CHECK(bad == 0);
        }
    }
}

TEST_CASE("argmax gives the first index of the largest value and passes over NaN") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    for (const kernels * k : kernels_available()) {
        const std::string variant = k->name;
        CAPTURE(variant);
        int bad = 0, n_cases = 0;
        for (int64_t n : {1, 2, 7, 8, 9, 31, 32, 33, 63, 100, 1000, 49159}) {
            for (int round = 0; round < 12; ++round) {
                std::vector<float> x = gaussian(rng, n, 0.0f, 3.0f);
                // Ties: values rounded, so the largest often repeats.
                if (round % 3 == 1)
                    for (float & v : x) v = std::round(v);
                if (round % 4 == 2) x[size_t(rng() % uint64_t(n))] = nan;
                if (round % 4 == 3) x[size_t(rng() % uint64_t(n))] = inf;
                if (round == 11) std::fill(x.begin(), x.end(), -inf);
                if (round == 10 && n > 1) {
                    std::fill(x.begin(), x.end(), nan);
                    x[size_t(n - 1)] = -1.0f;
                }
                // The reference: the first strictly larger value wins.
                int64_t want = 0;
                float best = -inf;
                for (int64_t i = 0; i < n; ++i) {
                    if (x[size_t(i)] > best) {
                        best = x[size_t(i)];
                        want = i;
                    }
                }
                bad += k->argmax(x.data(), n) != want;
                ++n_cases;
            }
        }
        CHECK(bad == 0);
        MESSAGE(variant << ": " << n_cases << " cases");
    }
}

TEST_CASE("swiglu and softmax_exp are accurate to about 1e-6 relative") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    for (const kernels * k : kernels_available()) {
        const std::string variant = k->name;
        CAPTURE(variant);
        for (int64_t n : {1, 7, 8, 9, 64, 1000}) {
            CAPTURE(n);
            std::vector<float> g = gaussian(rng, n, 0.0f, 4.0f), u = gaussian(rng, n);
            if (n > 8) {
                g[0] = 30.0f; // silu(g) = g
                g[1] = -30.0f;
                g[2] = 0.0f;
                g[3] = -100.0f; // exp(100) overflows f32 inside a naive silu
            }
            std::vector<float> y(n, std::numeric_limits<float>::quiet_NaN());
            k->swiglu(y.data(), g.data(), u.data(), n);
            int bad = 0;
            for (int64_t i = 0; i < n; i++) {
                const double want = g[i] / (1.0 + std::exp(-(double)g[i])) * u[i];
                // Where exp(-g) leaves f32's range the result is ~0 either way.
                if (!(std::fabs(y[i] - want) <= 2e-6 * std::fabs(want) + 1e-30)) bad++;
            }
            CHECK(bad == 0);

            // Attention scores: the max, values far below it and masked (-inf)
            // positions, which must give exactly 0.
            std::vector<float> x = gaussian(rng, n, 0.0f, 5.0f);
            if (n > 8) {
                x[1] = -std::numeric_limits<float>::infinity();
                x[2] = -200.0f;
                x[3] = -80.0f;
            }
            const float mx = *std::max_element(x.begin(), x.end());
            std::vector<float> e(n, std::numeric_limits<float>::quiet_NaN());
            const float sum = k->softmax_exp(e.data(), x.data(), mx, n);
            double want_sum = 0.0;
            bad = 0;
            for (int64_t i = 0; i < n; i++) {
                // The difference is taken in f32, as the primitive's contract says.
                const double want = std::exp((double)(x[i] - mx));
                want_sum += want;
                // Below f32's normal range the result may be flushed to 0.
                if (!(std::fabs(e[i] - want) <= 1e-6 * want + 1.2e-38)) bad++;
            }
            CHECK(bad == 0);
            if (n > 8) CHECK(e[1] == 0.0f);
            // A sum of n positive f32 terms: within n roundings.
            CHECK(std::fabs(sum - want_sum) <= (1e-6 + n * 6e-8) * want_sum);
        }
    }
}
