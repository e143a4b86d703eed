// smol-quant.h - every GGUF (ggml) tensor type smol knows: its block layout,
// bit-exact with the file format, its traits (elements and bytes a block,
// the activation block its integer dot product pairs it with), and its
// reference dequantization and quantization: portable scalar code, the
// truth the CPU and GPU kernels are tested against (itself checked against
// the PyPI gguf package's dequantization) and what smol-quantize writes.
//
// Dequantization computes each value with the float operations the gguf
// package's numpy code does, in the same order and without fused
// multiply-adds, so that the two agree bit for bit.

#ifndef SMOL_QUANT_H
#define SMOL_QUANT_H

#include "smol.h"

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace smol {

constexpr int QK = 32;    // elements per block of the 32-element types
constexpr int QK_K = 256; // elements per super-block of the K-quants and IQ4_XS

// --- 32-element blocks ---------------------------------------------------------

struct block_q4_0 {
    uint16_t d;     // f16 scale
    uint8_t qs[16]; // element i in the low nibble of qs[i], i+16 in the high
};
struct block_q4_1 {
    uint16_t d;     // f16 scale
    uint16_t m;     // f16 minimum
    uint8_t qs[16]; // as q4_0, value = q * d + m
};
struct block_q5_0 {
    uint16_t d;     // f16 scale
    uint8_t qh[4];  // bit i (little-endian u32): the fifth bit of element i
    uint8_t qs[16]; // low four bits, as q4_0; value = (q - 16) * d
};
struct block_q5_1 {
    uint16_t d;     // f16 scale
    uint16_t m;     // f16 minimum
    uint8_t qh[4];  // as q5_0
    uint8_t qs[16]; // value = q * d + m
};
struct block_q8_0 {
    uint16_t d; // f16 scale
    int8_t qs[32];
};
struct block_iq4_nl {
    uint16_t d;     // f16 scale
    uint8_t qs[16]; // indices into kvalues_iq4nl, laid out as q4_0's codes
};

// --- 256-element super-blocks ----------------------------------------------------

// Sub-block scales and mins of q4_K and q5_K: eight 6-bit pairs in 12 bytes
// (see scale_min_k4).
constexpr int K_SCALE_SIZE = 12;

struct block_q2_K {
    uint8_t scales[16]; // per 16 elements: scale (low 4 bits), min (high 4 bits)
    uint8_t qs[64];     // 2-bit codes: element 128h + 32t + b at bits 2t of qs[32h + b]
    uint16_t d;         // f16 scale of the scales
    uint16_t dmin;      // f16 scale of the mins; value = d*sc * q - dmin*m
};
struct block_q3_K {
    uint8_t hmask[32];  // element 32u + b: bit u of hmask[b]; clear means q - 4
    uint8_t qs[64];     // low two bits, laid out as q2_K's
    uint8_t scales[12]; // sixteen 6-bit scales, minus 32
    uint16_t d;         // f16 scale; value = d*(scale - 32) * q
};
struct block_q4_K {
    uint16_t d;    // f16 scale of the scales
    uint16_t dmin; // f16 scale of the mins
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[128]; // element 64j + i: low nibble of qs[32j + i], 64j + 32 + i: high
};
struct block_q5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[32];  // element 32s + i: bit s of qh[i], the fifth bit
    uint8_t qs[128]; // as q4_K
};
struct block_q6_K {
    uint8_t ql[128];   // element 128h + 64s + b: bits 4s of ql[64h + b]
    uint8_t qh[64];    // element 128h + 32t + b: bits 2t of qh[32h + b], the top two
    int8_t scales[16]; // per 16 elements
    uint16_t d;        // f16 scale; value = d*scale * (q - 32)
};
struct block_iq4_xs {
    uint16_t d;          // f16 scale
    uint16_t scales_h;   // bits 2s: the top two bits of sub-block s's scale
    uint8_t scales_l[4]; // nibble s: the low four bits; scale = 6 bits - 32
    uint8_t qs[128];     // sub-block s (32 elements): qs[16s, 16s + 16), as iq4_nl's
};
// Activations of the K-quants' and IQ4_XS's dot products (ggml's Q8_K).
struct block_q8_K {
    float d; // value = d * qs
    int8_t qs[256];
    int16_t bsums[16]; // sums of 16 codes each
};

static_assert(sizeof(block_q4_0) == 18);
static_assert(sizeof(block_q4_1) == 20);
static_assert(sizeof(block_q5_0) == 22);
static_assert(sizeof(block_q5_1) == 24);
static_assert(sizeof(block_q8_0) == 34);
static_assert(sizeof(block_iq4_nl) == 18);
static_assert(sizeof(block_q2_K) == 84);
static_assert(sizeof(block_q3_K) == 110);
static_assert(sizeof(block_q4_K) == 144);
static_assert(sizeof(block_q5_K) == 176);
static_assert(sizeof(block_q6_K) == 210);
static_assert(sizeof(block_iq4_xs) == 136);
static_assert(sizeof(block_q8_K) == 292);

// IQ4_NL's and IQ4_XS's sixteen values.
inline constexpr int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1,    13,   25,  38,  53,  69,  89,  113};

// The helpers below are static: the per-instruction-set kernel sources
// include this header, and an inline function they shared could be merged
// by the linker into a copy built for another instruction set.

// Sub-block j's 6-bit scale and min of q4_K and q5_K.
static inline void scale_min_k4(int j, const uint8_t * q, uint8_t & sc, uint8_t & m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// All eight scales and mins of q4_K and q5_K (scale_min_k4 for j = 0..7), a
// word at a time: sub-blocks 0-3 take the low 6 bits of bytes 0-3 (scales)
// and 4-7 (mins); 4-7 the nibbles of bytes 8-11 under the top 2 bits of
// bytes 0-3 and 4-7. Little-endian words, as every target smol builds for;
// as two words (byte j of each: sub-block j) or as arrays.
static inline void scales_mins_k4(const uint8_t * q, uint64_t & sc, uint64_t & m) {
    uint32_t w[3];
    memcpy(w, q, 12);
    const uint32_t s_lo = w[0] & 0x3f3f3f3fu, m_lo = w[1] & 0x3f3f3f3fu;
    const uint32_t s_hi = (w[2] & 0x0f0f0f0fu) | ((w[0] >> 2) & 0x30303030u);
    const uint32_t m_hi = ((w[2] >> 4) & 0x0f0f0f0fu) | ((w[1] >> 2) & 0x30303030u);
    sc = s_lo | (uint64_t)s_hi << 32;
    m = m_lo | (uint64_t)m_hi << 32;
}
static inline void scales_mins_k4(const uint8_t * q, uint8_t sc[8], uint8_t m[8]) {
    uint64_t s, n;
    scales_mins_k4(q, s, n);
    memcpy(sc, &s, 8);
    memcpy(m, &n, 8);
}

// Q3_K's scale j (of 16), minus 32.
static inline int q3_K_scale(const uint8_t * scales, int j) {
    const int lo = j < 8 ? scales[j] & 0xF : scales[j - 8] >> 4;
    const int hi = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}
// IQ4_XS's sub-block s scale, minus 32.
static inline int iq4_xs_scale(const block_iq4_xs & b, int s) {
    const int lo = (b.scales_l[s / 2] >> (4 * (s % 2))) & 0xF;
    const int hi = (b.scales_h >> (2 * s)) & 3;
    return (lo | (hi << 4)) - 32;
}

// --- traits -------------------------------------------------------------------------

struct type_traits {
    const char * name;   // as smol_type_name
    int64_t block_elems; // 1 for the float types
    size_t block_bytes;  // bytes of a block (of an element, for floats)
    bool quantized;
};
// The traits of t; nullptr for a type smol does not know.
const type_traits * traits_of(smol_type t);
// Bytes of a row of n elements (n a multiple of the block), and elements a
// block; 0 for an unknown type.
size_t type_row_bytes(smol_type t, int64_t n);
int64_t type_block_elems(smol_type t);

// --- reference conversion --------------------------------------------------------------

// n elements (a multiple of the block) of type t at src to floats.
void dequantize_row(smol_type t, const void * src, float * dst, int64_t n);
// n floats to type t: the scalar reference quantizers (for the K-quants and
// IQ4 types, a weighted search for the scales that least distort the row).
void quantize_row(smol_type t, const float * src, void * dst, int64_t n);

} // namespace smol

#endif // SMOL_QUANT_H
