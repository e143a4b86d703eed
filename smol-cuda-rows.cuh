// smol-cuda-rows.cuh - how the GPU kernels read weights: f16 and bf16
// conversions, load_chunk, which reads eight weights of a row in any of
// GGUF's block layouts, and a GEMV chunk's arithmetic (x_chunk, dot8).
// smol-cuda-common.cuh includes it for the backend's kernels (for CUDA, and
// for ROCm through smol-hip.h), and so does the playground's
// scripts/playground/gemv-lab.cuh, so that the labs time the backend's own
// loads and sums.
#pragma once

#if defined(SMOL_HIP)
#include "smol-hip.h"
#else
#include <cuda_fp16.h>
#endif
#include "smol-cpu-kernels.h"
#include "smol.h"

#include <cstddef>
#include <cstdint>

namespace smol {

__device__ __forceinline__ float f16_to_f32(uint16_t h) {
    return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ float bf16_to_f32(uint16_t h) {
    return __uint_as_float(uint32_t(h) << 16);
}
__device__ __forceinline__ uint16_t f32_to_f16(float f) {
    return __half_as_ushort(__float2half_rn(f)); // round to nearest even, like the CPU
}
// Round to nearest even on the bits, as the CPU's f32_to_bf16_row; a NaN stays one.
__device__ __forceinline__ uint16_t f32_to_bf16(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float ld_f16(const uint8_t * p) {
    return f16_to_f32(*reinterpret_cast<const uint16_t *>(p));
}

// Chunk ch of a row (chunks of 8 elements; the quantized types have 4
// chunks per 32-element block) as it lies in memory: raw_chunk<T>::load
// reads it, decode gives its eight weights and where(ch) the activations
// they meet: v[0..3] multiply x[e0..e0+3], v[4..7] multiply x[e1..e1+3].
// Apart, a kernel can have a chunk's bytes in flight while it computes
// another (or while the kernel before it ends) and keep them in few
// registers. Quantized blocks are only 2-byte aligned, so they are read in
// 16 or 32-bit pieces; float rows are read 16 bytes at a time.
template <int T> struct raw_chunk;

template <> struct raw_chunk<SMOL_TYPE_F32> {
    float4 a, b;
    __device__ __forceinline__ void load(const uint8_t * __restrict__ row, int ch) {
        a = reinterpret_cast<const float4 *>(row)[2 * ch];
        b = reinterpret_cast<const float4 *>(row)[2 * ch + 1];
    }
    __device__ __forceinline__ void decode(float (&v)[8]) const {
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    }
    static __device__ __forceinline__ void where(int ch, int & e0, int & e1) {
        e0 = 8 * ch;
        e1 = e0 + 4;
    }
};

template <int T> struct raw_chunk_16 { // f16 and bf16
    uint4 u;
    __device__ __forceinline__ void load(const uint8_t * __restrict__ row, int ch) {
        u = reinterpret_cast<const uint4 *>(row)[ch];
    }
    __device__ __forceinline__ void decode(float (&v)[8]) const {
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if constexpr (T == SMOL_TYPE_F16) {
                v[2 * i] = f16_to_f32(uint16_t(w[i] & 0xffff));
                v[2 * i + 1] = f16_to_f32(uint16_t(w[i] >> 16));
            } else {
                v[2 * i] = __uint_as_float(w[i] << 16);
                v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
            }
        }
    }
    static __device__ __forceinline__ void where(int ch, int & e0, int & e1) {
        e0 = 8 * ch;
        e1 = e0 + 4;
    }
};
template <> struct raw_chunk<SMOL_TYPE_F16> : raw_chunk_16<SMOL_TYPE_F16> {};
template <> struct raw_chunk<SMOL_TYPE_BF16> : raw_chunk_16<SMOL_TYPE_BF16> {};

template <> struct raw_chunk<SMOL_TYPE_Q8_0> {
    uint16_t d, qs[4];
    __device__ __forceinline__ void load(const uint8_t * __restrict__ row, int ch) {
        const uint8_t * blk = row + size_t(ch >> 2) * sizeof(block_q8_0);
        d = *reinterpret_cast<const uint16_t *>(blk);
        const uint16_t * q = reinterpret_cast<const uint16_t *>(blk + 2 + 8 * (ch & 3));
#pragma unroll
        for (int i = 0; i < 4; ++i) qs[i] = q[i];
    }
    __device__ __forceinline__ void decode(float (&v)[8]) const {
        const float s = f16_to_f32(d);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            v[2 * i] = s * float(int8_t(qs[i] & 0xff));
            v[2 * i + 1] = s * float(int8_t(qs[i] >> 8));
        }
    }
    static __device__ __forceinline__ void where(int ch, int & e0, int & e1) {
        e0 = 32 * (ch >> 2) + 8 * (ch & 3);
        e1 = e0 + 4;
    }
};

template <> struct raw_chunk<SMOL_TYPE_Q4_0> {
    uint16_t d;
    uint32_t w;
    __device__ __forceinline__ void load(const uint8_t * __restrict__ row, int ch) {
        const uint8_t * blk = row + size_t(ch >> 2) * sizeof(block_q4_0);
        d = *reinterpret_cast<const uint16_t *>(blk);
        const uint16_t * q = reinterpret_cast<const uint16_t *>(blk + 2 + 4 * (ch & 3));
        w = uint32_t(q[0]) | (uint32_t(q[1]) << 16);
    }
    __device__ __forceinline__ void decode(float (&v)[8]) const {
        const float s = f16_to_f32(d);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t byte = (w >> (8 * i)) & 0xff;
            v[i] = s * float(int(byte & 15) - 8);
            v[4 + i] = s * float(int(byte >> 4) - 8);
        }
    }
    static __device__ __forceinline__ void where(int ch, int & e0, int & e1) {
        e0 = 32 * (ch >> 2) + 4 * (ch & 3);
        e1 = e0 + 16;
    }
};

template <> struct raw_chunk<SMOL_TYPE_Q4_1> {
    uint16_t d, m;
    uint32_t w;
    __device__ __forceinline__ void load(const uint8_t * __restrict__ row, int ch) {
        const uint8_t * blk = row + size_t(ch >> 2) * sizeof(block_q4_1);
        d = *reinterpret_cast<const uint16_t *>(blk);
        m = *reinterpret_cast<const uint16_t *>(blk + 2);
        w = *reinterpret_cast<const uint32_t *>(blk + 4 + 4 * (ch & 3));
    }
    __device__ __forceinline__ void decode(float (&v)[8]) const {
        const float s = f16_to_f32(d), mn = f16_to_f32(m);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t byte = (w >> (8 * i)) & 0xff;
            v[i] = s * float(byte & 15) + mn;
            v[4 + i] = s * float(byte >> 4) + mn;
        }
    }
    static __device__ __forceinline__ void where(int ch, int & e0, int & e1) {
        e0 = 32 * (ch >> 2) + 4 * (ch & 3);
        e1 = e0 + 16;
    }
};

// --- the other 32-element types: q5_0, q5_1, iq4_nl ----------------------------
//
// Chunks as q4_0's: four bytes of codes, elements 4c..4c+3 in their low
// nibbles and 4c+16.. in their high ones. Products are rounded apart from
// sums (__fmul_rn, __fadd_rn) so a weight has the value the CPU's reference
// gives it.

__device__ __forceinline__ uint32_t ld_u32_2(const uint8_t * p) { // 2-byte aligned
    const uint16_t * q = reinterpret_cast<const uint16_t *>(p);
    return uint32_t(q[0]) | (uint32_t(q[1]) << 16);
}

template <int T> struct raw_chunk_q5 { // q5_0 and q5_1
    uint16_t d, m;
    uint32_t qh, w;
    __device__ __forceinline__ void load(const uint8_t * __restrict__ row, int ch) {
        constexpr size_t bs = T == SMOL_TYPE_Q5_0 ? sizeof(block_q5_0) : sizeof(block_q5_1);
        constexpr int off = T == SMOL_TYPE_Q5_0 ? 2 : 4; // where qh starts
        const uint8_t * blk = row + size_t(ch >> 2) * bs;
        d = *reinterpret_cast<const uint16_t *>(blk);
        m = T == SMOL_TYPE_Q5_1 ? *reinterpret_cast<const uint16_t *>(blk + 2) : 0;
        qh = ld_u32_2(blk + off);
        w = ld_u32_2(blk + off + 4 + 4 * (ch & 3));
    }
    __device__ __forceinline__ void decode(float (&v)[8], int ch) const {
        const float s = f16_to_f32(d), mn = f16_to_f32(m);
        const int j0 = 4 * (ch & 3);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t byte = (w >> (8 * i)) & 0xff;
            const int lo = int(byte & 15) | int(((qh >> (j0 + i)) & 1) << 4);
            const int hi = int(byte >> 4) | int(((qh >> (j0 + i + 16)) & 1) << 4);
            if constexpr (T == SMOL_TYPE_Q5_0) {
                v[i] = __fmul_rn(s, float(lo - 16));
                v[4 + i] = __fmul_rn(s, float(hi - 16));
            } else {
                v[i] = __fadd_rn(__fmul_rn(s, float(lo)), mn);
                v[4 + i] = __fadd_rn(__fmul_rn(s, float(hi)), mn);
            }
        }
    }
    static __device__ __forceinline__ void where(int ch, int & e0, int & e1) {
        e0 = 32 * (ch >> 2) + 4 * (ch & 3);
        e1 = e0 + 16;
    }
};

// A raw chunk whose decode needs its chunk index (the layouts below) is
// read through this wrapper, so kernels keep calling decode(v).
template <class Raw> struct raw_chunk_at : Raw {
    int ch_ = 0;
    __device__ __forceinline__ void load(const uint8_t * __restrict__ row, int ch) {
        ch_ = ch;
        Raw::load(row, ch);
    }
    __device__ __forceinline__ void decode(float (&v)[8]) const { Raw::decode(v, ch_); }
};

template <> struct raw_chunk<SMOL_TYPE_Q5_0> : raw_chunk_at<raw_chunk_q5<SMOL_TYPE_Q5_0>> {};
template <> struct raw_chunk<SMOL_TYPE_Q5_1> : raw_chunk_at<raw_chunk_q5<SMOL_TYPE_Q5_1>> {};

__device__ __forceinline__ float iq4_value(uint32_t i) {
    // kvalues_iq4nl, packed four to a word.
    constexpr uint32_t packed[4] = {0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u};
    return float(int8_t((packed[i >> 2] >> (8 * (i & 3))) & 0xff));
}

template <> struct raw_chunk<SMOL_TYPE_IQ4_NL> {
    uint16_t d;
    uint32_t w;
    __device__ __forceinline__ void load(const uint8_t * __restrict__ row, int ch) {
        const uint8_t * blk = row + size_t(ch >> 2) * sizeof(block_iq4_nl);
        d = *reinterpret_cast<const uint16_t *>(blk);
        w = ld_u32_2(blk + 2 + 4 * (ch & 3));
    }
    __device__ __forceinline__ void decode(float (&v)[8]) const {
        const float s = f16_to_f32(d);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t byte = (w >> (8 * i)) & 0xff;
            v[i] = __fmul_rn(s, iq4_value(byte & 15));
            v[4 + i] = __fmul_rn(s, iq4_value(byte >> 4));
        }
    }
    static __device__ __forceinline__ void where(int ch, int & e0, int & e1) {
        e0 = 32 * (ch >> 2) + 4 * (ch & 3);
        e1 = e0 + 16;
    }
};

// --- the 256-element super-blocks --------------------------------------------------
//
// 32 chunks a super-block, each four bytes of codes and the super-block's
// scales, laid out so that a chunk's eight weights are two runs of four:
//   q4_K, q5_K: c = 8j + k: qs[32j + 4k, +4), e0 = 64j + 4k, e1 = e0 + 32;
//   q6_K: c = 16h + k: ql[64h + 4k, +4), e0 = 128h + 4k, e1 = e0 + 64;
//   q2_K, q3_K: c = 16h + 8p + k: qs[32h + 4k, +4) at bit planes p and p + 2,
//     e0 = 128h + 32p + 4k, e1 = e0 + 64;
//   iq4_xs: c = 4s + k: qs[16s + 4k, +4), e0 = 32s + 4k, e1 = e0 + 16.

// smol-quant.h's scale_min_k4 and q3_K_scale, for device code.
__device__ __forceinline__ void k4_scale_min(int j, const uint8_t * q, uint8_t & sc, uint8_t & m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}
__device__ __forceinline__ int k3_scale(const uint8_t * scales, int j) {
    const int lo = j < 8 ? scales[j] & 0xF : scales[j - 8] >> 4;
    const int hi = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

struct raw_chunk_q4k {
    uint32_t dm, sc[3], w;
    __device__ __forceinline__ void load(const uint8_t * __restrict__ row, int ch) {
        const uint8_t * blk = row + size_t(ch >> 5) * sizeof(block_q4_K);
        dm = ld_u32_2(blk);
#pragma unroll
        for (int i = 0; i < 3; ++i) sc[i] = ld_u32_2(blk + 4 + 4 * i);
        w = ld_u32_2(blk + 16 + 4 * (ch & 31));
    }
    __device__ __forceinline__ void decode(float (&v)[8], int ch, uint32_t qh = 0) const {
        const uint8_t * s8 = reinterpret_cast<const uint8_t *>(sc);
        const int j = (ch & 31) >> 3;
        uint8_t sc0, m0, sc1, m1;
        k4_scale_min(2 * j, s8, sc0, m0);
        k4_scale_min(2 * j + 1, s8, sc1, m1);
        const float d = f16_to_f32(uint16_t(dm & 0xffff)), dmin = f16_to_f32(uint16_t(dm >> 16));
        const float dl0 = __fmul_rn(d, float(sc0)), ml0 = __fmul_rn(dmin, float(m0));
        const float dl1 = __fmul_rn(d, float(sc1)), ml1 = __fmul_rn(dmin, float(m1));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t byte = (w >> (8 * i)) & 0xff;
            const uint32_t h = (qh >> (8 * i)) & 0xff; // q5_K's fifth bits of the two
            const int lo = int(byte & 15) | int(((h >> (2 * j)) & 1) << 4);
            const int hi = int(byte >> 4) | int(((h >> (2 * j + 1)) & 1) << 4);
            v[i] = __fsub_rn(__fmul_rn(dl0, float(lo)), ml0);
            v[4 + i] = __fsub_rn(__fmul_rn(dl1, float(hi)), ml1);
        }
    }
    static __device__ __forceinline__ void where(int ch, int & e0, int & e1) {
        const int c = ch & 31;
        e0 = 256 * (ch >> 5) + 64 * (c >> 3) + 4 * (c & 7);
        e1 = e0 + 32;
    }
};
template <> struct raw_chunk<SMOL_TYPE_Q4_K> : raw_chunk_at<raw_chunk_q4k> {};

template <> struct raw_chunk<SMOL_TYPE_Q5_K> {
    raw_chunk_q4k q4; // d, dmin, scales and qs, at q5_K's offsets
    uint32_t qh;
    int ch_;
    __device__ __forceinline__ void load(const uint8_t * __restrict__ row, int ch) {
        const uint8_t * blk = row + size_t(ch >> 5) * sizeof(block_q5_K);
        q4.dm = ld_u32_2(blk);
#pragma unroll
        for (int i = 0; i < 3; ++i) q4.sc[i] = ld_u32_2(blk + 4 + 4 * i);
        qh = ld_u32_2(blk + 16 + 4 * (ch & 7));
        q4.w = ld_u32_2(blk + 48 + 4 * (ch & 31));
        ch_ = ch;
    }
    __device__ __forceinline__ void decode(float (&v)[8]) const {
        q4.decode(v, ch_, qh);
    }
    static __device__ __forceinline__ void where(int ch, int & e0, int & e1) {
        raw_chunk_q4k::where(ch, e0, e1);
    }
};

struct raw_chunk_q6 {
    uint32_t w, qh;
    int8_t s0, s1;
    uint16_t d;
    __device__ __forceinline__ void load(const uint8_t * __restrict__ row, int ch) {
        const uint8_t * blk = row + size_t(ch >> 5) * sizeof(block_q6_K);
        const int c = ch & 31, h = c >> 4, k = c & 15;
        w = ld_u32_2(blk + 64 * h + 4 * k);
        qh = ld_u32_2(blk + 128 + 32 * h + 4 * (k & 7));
        s0 = int8_t(blk[192 + 8 * h + (k >> 2)]);
        s1 = int8_t(blk[192 + 8 * h + 4 + (k >> 2)]);
        d = *reinterpret_cast<const uint16_t *>(blk + 208);
    }
    __device__ __forceinline__ void decode(float (&v)[8], int ch) const {
        const int k = ch & 15;
        const int t0 = k >> 3, t1 = t0 + 2; // the qh bit planes of e0's and e1's elements
        const float d0 = __fmul_rn(f16_to_f32(d), float(s0));
        const float d1 = __fmul_rn(f16_to_f32(d), float(s1));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t byte = (w >> (8 * i)) & 0xff, h = (qh >> (8 * i)) & 0xff;
            const int lo = int(byte & 15) | int(((h >> (2 * t0)) & 3) << 4);
            const int hi = int(byte >> 4) | int(((h >> (2 * t1)) & 3) << 4);
            v[i] = __fmul_rn(d0, float(lo - 32));
            v[4 + i] = __fmul_rn(d1, float(hi - 32));
        }
    }
    static __device__ __forceinline__ void where(int ch, int & e0, int & e1) {
        const int c = ch & 31;
        e0 = 256 * (ch >> 5) + 128 * (c >> 4) + 4 * (c & 15);
        e1 = e0 + 64;
    }
};
template <> struct raw_chunk<SMOL_TYPE_Q6_K> : raw_chunk_at<raw_chunk_q6> {};

template <int T> struct raw_chunk_k_low { // q2_K and q3_K
    uint32_t w, hm;
    uint8_t s0, s1;   // q2_K: the two groups' scale bytes; q3_K: unused
    int8_t g0, g1;    // q3_K: the two groups' scales, less 32
    uint16_t d, dmin; // dmin: q2_K only
    __device__ __forceinline__ void load(const uint8_t * __restrict__ row, int ch) {
        const int c = ch & 31, h = c >> 4, p = (c >> 3) & 1, k = c & 7;
        const int grp0 = 8 * h + 2 * p + (k >> 2), grp1 = grp0 + 4;
        if constexpr (T == SMOL_TYPE_Q2_K) {
            const uint8_t * blk = row + size_t(ch >> 5) * sizeof(block_q2_K);
            s0 = blk[grp0];
            s1 = blk[grp1];
            w = ld_u32_2(blk + 16 + 32 * h + 4 * k);
            d = *reinterpret_cast<const uint16_t *>(blk + 80);
            dmin = *reinterpret_cast<const uint16_t *>(blk + 82);
            hm = 0;
        } else {
            const uint8_t * blk = row + size_t(ch >> 5) * sizeof(block_q3_K);
            hm = ld_u32_2(blk + 4 * k);
            w = ld_u32_2(blk + 32 + 32 * h + 4 * k);
            g0 = int8_t(k3_scale(blk + 96, grp0));
            g1 = int8_t(k3_scale(blk + 96, grp1));
            d = *reinterpret_cast<const uint16_t *>(blk + 108);
        }
    }
    __device__ __forceinline__ void decode(float (&v)[8], int ch) const {
        const int c = ch & 31, h = c >> 4, p = (c >> 3) & 1;
        const float dd = f16_to_f32(d);
        float dl0, dl1, ml0 = 0.0f, ml1 = 0.0f;
        if constexpr (T == SMOL_TYPE_Q2_K) {
            const float dm = f16_to_f32(dmin);
            dl0 = __fmul_rn(dd, float(s0 & 0xF));
            dl1 = __fmul_rn(dd, float(s1 & 0xF));
            ml0 = __fmul_rn(dm, float(s0 >> 4));
            ml1 = __fmul_rn(dm, float(s1 >> 4));
        } else {
            dl0 = __fmul_rn(dd, float(g0));
            dl1 = __fmul_rn(dd, float(g1));
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t byte = (w >> (8 * i)) & 0xff, hb = (hm >> (8 * i)) & 0xff;
            int q0 = int((byte >> (2 * p)) & 3), q1 = int((byte >> (2 * p + 4)) & 3);
            if constexpr (T == SMOL_TYPE_Q3_K) {
                q0 -= ((hb >> (4 * h + p)) & 1) ? 0 : 4;
                q1 -= ((hb >> (4 * h + p + 2)) & 1) ? 0 : 4;
                v[i] = __fmul_rn(dl0, float(q0));
                v[4 + i] = __fmul_rn(dl1, float(q1));
            } else {
                v[i] = __fsub_rn(__fmul_rn(dl0, float(q0)), ml0);
                v[4 + i] = __fsub_rn(__fmul_rn(dl1, float(q1)), ml1);
            }
        }
    }
    static __device__ __forceinline__ void where(int ch, int & e0, int & e1) {
        const int c = ch & 31;
        e0 = 256 * (ch >> 5) + 128 * (c >> 4) + 32 * ((c >> 3) & 1) + 4 * (c & 7);
        e1 = e0 + 64;
    }
};
template <> struct raw_chunk<SMOL_TYPE_Q2_K> : raw_chunk_at<raw_chunk_k_low<SMOL_TYPE_Q2_K>> {};
template <> struct raw_chunk<SMOL_TYPE_Q3_K> : raw_chunk_at<raw_chunk_k_low<SMOL_TYPE_Q3_K>> {};

template <> struct raw_chunk<SMOL_TYPE_IQ4_XS> {
    uint16_t d;
    int8_t ls;
    uint32_t w;
    __device__ __forceinline__ void load(const uint8_t * __restrict__ row, int ch) {
        const uint8_t * blk = row + size_t(ch >> 5) * sizeof(block_iq4_xs);
        const int c = ch & 31, s = c >> 2;
        d = *reinterpret_cast<const uint16_t *>(blk);
        const uint16_t sh = *reinterpret_cast<const uint16_t *>(blk + 2);
        const int lo = (blk[4 + s / 2] >> (4 * (s % 2))) & 0xF, hi = (sh >> (2 * s)) & 3;
        ls = int8_t((lo | (hi << 4)) - 32);
        w = ld_u32_2(blk + 8 + 4 * c);
    }
    __device__ __forceinline__ void decode(float (&v)[8]) const {
        const float dl = __fmul_rn(f16_to_f32(d), float(ls));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t byte = (w >> (8 * i)) & 0xff;
            v[i] = __fmul_rn(dl, iq4_value(byte & 15));
            v[4 + i] = __fmul_rn(dl, iq4_value(byte >> 4));
        }
    }
    static __device__ __forceinline__ void where(int ch, int & e0, int & e1) {
        const int c = ch & 31;
        e0 = 256 * (ch >> 5) + 32 * (c >> 2) + 4 * (c & 3);
        e1 = e0 + 16;
    }
};

// The eight activations a chunk's weights meet, x[e0..e0+3] in a and
// x[e1..e1+3] in b; with a folded RMS norm (norm_w) their squares go into
// ss first, then they are scaled by the norm's weights.
__device__ __forceinline__ void x_chunk(const float * x, const float * norm_w, int e0, int e1,
                                        float4 & a, float4 & b, float & ss) {
    a = *reinterpret_cast<const float4 *>(x + e0);
    b = *reinterpret_cast<const float4 *>(x + e1);
    if (norm_w) {
        const float4 na = *reinterpret_cast<const float4 *>(norm_w + e0);
        const float4 nb = *reinterpret_cast<const float4 *>(norm_w + e1);
        ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z +
              b.w * b.w;
        a = make_float4(a.x * na.x, a.y * na.y, a.z * na.z, a.w * na.w);
        b = make_float4(b.x * nb.x, b.y * nb.y, b.z * nb.z, b.w * nb.w);
    }
}

// The dot of one chunk of 8 weights with x's elements e0..e0+3, e1..e1+3.
__device__ __forceinline__ float dot8(const float (&v)[8], const float4 & a, const float4 & b) {
    return v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w + v[4] * b.x + v[5] * b.y +
           v[6] * b.z + v[7] * b.w;
}

// Eight weights of chunk ch of a row, read and decoded at once.
template <int T>
__device__ __forceinline__ void load_chunk(const uint8_t * __restrict__ row, int ch, float (&v)[8],
                                           int & e0, int & e1) {
    raw_chunk<T> r;
    r.load(row, ch);
    r.decode(v);
    raw_chunk<T>::where(ch, e0, e1);
}

// --- GEMV units: a chunk of 8, or a span of 32 of a super-block ------------
//
// The GEMV takes a row in units; gemv_unit<T> says how wide one is, reads
// the activations it meets (with a folded norm, as x_chunk) and gives its
// dot. Most types' unit is their chunk: decoded to eight floats, then
// dot8. q4_K and q6_K take a span of 32 weights a lane instead, an eighth
// of a super-block (its codes in one 16-byte piece, its scales read once
// for 32 weights where a chunk reads them for 8), and never build the
// weights: a GEMV of these types is bound by instructions issued, not by
// memory, so each weight costs two, a byte permute that makes its code q
// into the float f = 1/2 + q/256 (q_float) and one FMA with its
// activation. A run of 16 codes then gives
//   sum q x = 256 (sum f x) - 128 (sum x),
// and is scaled once:
//   q4_K: d sc (sum q x) - dmin m (sum x),
//   q6_K: d sc (sum (q - 32) x),
// the sums of x shared by a warp's rows. The products are the decoded
// weights', rounded in another order; the offset 1/2 rounds with each sum
// of f x, which makes its rounding error up to 128 / q times that of a
// plain sum (float64 tests bound the result).

// Byte k of w (a code below 128) as 1/2 + byte / 256, exactly: the byte
// becomes bits 16-22 of the float's mantissa under 1/2's exponent.
__device__ __forceinline__ float q_float(uint32_t w, int k) {
    return __uint_as_float(__byte_perm(w, 0x3F000000u, 0x7044u | (uint32_t(k) << 8)));
}

// The sum of the four codes (bytes of w), as q_float, times a.
__device__ __forceinline__ float q_dot4(uint32_t w, const float4 & a) {
    float s = q_float(w, 0) * a.x;
    s = fmaf(q_float(w, 1), a.y, s);
    s = fmaf(q_float(w, 2), a.z, s);
    return fmaf(q_float(w, 3), a.w, s);
}

// Sub-block s's 6-bit scale and min of a q4_K super-block whose first 16
// bytes are head (k4_scale_min above, over registers: an index into an
// array of bytes would put it in local memory).
__device__ __forceinline__ void k4_scale_min(const uint4 & head, int s, float & sc, float & m) {
    const int sh = 8 * (s & 3);
    const uint32_t a = (head.y >> sh) & 0xff, b = (head.z >> sh) & 0xff, c = (head.w >> sh) & 0xff;
    sc = float(s < 4 ? a & 63 : (c & 0xF) | ((a >> 6) << 4));
    m = float(s < 4 ? b & 63 : (c >> 4) | ((b >> 6) << 4));
}

template <int T> struct gemv_unit {
    static constexpr int width = 8;
    using raw = raw_chunk<T>;
    struct acts {
        float4 a, b;
    };
    static __device__ __forceinline__ void load_x(const float * x, const float * norm_w, int u,
                                                  acts & xa, float & ss) {
        int e0, e1;
        raw::where(u, e0, e1);
        x_chunk(x, norm_w, e0, e1, xa.a, xa.b, ss);
    }
    // A unit's weights made ready once for several tokens' dots (decoded);
    // dot(raw) is dot(ready(raw)), the same bits.
    struct weights {
        float v[8];
    };
    static __device__ __forceinline__ void ready(const raw & r, weights & w) { r.decode(w.v); }
    static __device__ __forceinline__ float dot(const weights & w, const acts & xa) {
        return dot8(w.v, xa.a, xa.b);
    }
    static __device__ __forceinline__ float dot(const raw & r, const acts & xa) {
        weights w;
        ready(r, w);
        return dot(w, xa);
    }
};

// A span's activations: two runs of 16 (the codes' low and high halves)
// and each run's sum.
struct span_acts {
    float4 a[4], b[4];
    float sa, sb;
};
__device__ __forceinline__ void span_x(const float * x, const float * norm_w, int e0, int e1,
                                       span_acts & xa, float & ss) {
#pragma unroll
    for (int i = 0; i < 4; ++i) x_chunk(x, norm_w, e0 + 4 * i, e1 + 4 * i, xa.a[i], xa.b[i], ss);
    xa.sa = xa.sb = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        xa.sa += (xa.a[i].x + xa.a[i].y) + (xa.a[i].z + xa.a[i].w);
        xa.sb += (xa.b[i].x + xa.b[i].y) + (xa.b[i].z + xa.b[i].w);
    }
}

// What the span units share: their width, activations and their reading.
template <class Raw> struct gemv_span {
    static constexpr int width = 32;
    using raw = Raw;
    using acts = span_acts;
    // A span's dot reads its codes as they lie: nothing to make ready.
    using weights = Raw;
    static __device__ __forceinline__ void ready(const raw & r, weights & w) { w = r; }
    static __device__ __forceinline__ void load_x(const float * x, const float * norm_w, int u,
                                                  acts & xa, float & ss) {
        int e0, e1;
        Raw::where(u, e0, e1);
        span_x(x, norm_w, e0, e1, xa, ss);
    }
};

// q4_K: span t of super-block b holds qs[16t, 16t + 16): the low nibbles
// are elements 64j + 16h + i (j = t / 2, h = t % 2), sub-block 2j; the
// high ones 32 further, sub-block 2j + 1. Super-blocks are 144 bytes, so
// both 16-byte pieces are aligned where the row is.
struct raw_span_q4k {
    uint4 head; // d, dmin, the 12 bytes of scales and mins
    uint4 q;
    int t;
    __device__ __forceinline__ void load(const uint8_t * __restrict__ row, int u) {
        const uint8_t * blk = row + size_t(u >> 3) * sizeof(block_q4_K);
        t = u & 7;
        head = *reinterpret_cast<const uint4 *>(blk);
        q = *reinterpret_cast<const uint4 *>(blk + 16 + 16 * t);
    }
    static __device__ __forceinline__ void where(int u, int & e0, int & e1) {
        const int t = u & 7;
        e0 = 256 * (u >> 3) + 64 * (t >> 1) + 16 * (t & 1);
        e1 = e0 + 32;
    }
};
template <> struct gemv_unit<SMOL_TYPE_Q4_K> : gemv_span<raw_span_q4k> {
    static __device__ __forceinline__ float dot(const raw & r, const acts & xa) {
        const uint32_t w[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            s0 += q_dot4(w[i] & 0x0F0F0F0Fu, xa.a[i]);
            s1 += q_dot4((w[i] >> 4) & 0x0F0F0F0Fu, xa.b[i]);
        }
        float sc0, m0, sc1, m1;
        const int j = r.t >> 1;
        k4_scale_min(r.head, 2 * j, sc0, m0);
        k4_scale_min(r.head, 2 * j + 1, sc1, m1);
        const float d = f16_to_f32(uint16_t(r.head.x & 0xffff));
        const float dmin = f16_to_f32(uint16_t(r.head.x >> 16));
        const float q0 = fmaf(256.0f, s0, -128.0f * xa.sa), q1 = fmaf(256.0f, s1, -128.0f * xa.sb);
        const float mins = fmaf(dmin * m0, xa.sa, dmin * m1 * xa.sb);
        return fmaf(d * sc0, q0, fmaf(d * sc1, q1, -mins));
    }
};

// 16 bytes at a 2-byte aligned p, in four words: five aligned 4-byte loads,
// shifted into place where p is not 4-byte aligned (the fifth word, read
// either way, is the next 4 bytes of the same super-block wherever this
// is used).
__device__ __forceinline__ void ld16_2(const uint8_t * p, uint32_t (&w)[4]) {
    const uint32_t * a =
        reinterpret_cast<const uint32_t *>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(3));
    const uint32_t sh = uint32_t(reinterpret_cast<uintptr_t>(p) & 2) * 8;
    uint32_t v[5];
#pragma unroll
    for (int i = 0; i < 5; ++i) v[i] = a[i];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = __funnelshift_r(v[i], v[i + 1], sh);
}

// q6_K: span t of super-block b holds ql[16t, 16t + 16) and the qh bytes of
// the same elements: with h = t / 4 and l = 16 (t % 4), the low nibbles are
// elements 128h + l + i and the high ones 64 further; their two high bits
// are qh[32h + l % 32 + i] >> s and >> s + 4 (s = 2 from l = 32 on). Each
// run is one 16-element group of the scales. Super-blocks are 210 bytes:
// read with ld16_2.
struct raw_span_q6 {
    uint32_t ql[4], qh[4];
    int8_t s0, s1;
    uint16_t d;
    int t;
    __device__ __forceinline__ void load(const uint8_t * __restrict__ row, int u) {
        const uint8_t * blk = row + size_t(u >> 3) * sizeof(block_q6_K);
        t = u & 7;
        const int h = t >> 2, l = 16 * (t & 3);
        ld16_2(blk + 64 * h + l, ql);
        ld16_2(blk + 128 + 32 * h + (l & 31), qh);
        s0 = int8_t(blk[192 + 8 * h + (t & 3)]);
        s1 = int8_t(blk[192 + 8 * h + 4 + (t & 3)]);
        d = *reinterpret_cast<const uint16_t *>(blk + 208);
    }
    static __device__ __forceinline__ void where(int u, int & e0, int & e1) {
        const int t = u & 7;
        e0 = 256 * (u >> 3) + 128 * (t >> 2) + 16 * (t & 3);
        e1 = e0 + 64;
    }
};
template <> struct gemv_unit<SMOL_TYPE_Q6_K> : gemv_span<raw_span_q6> {
    static __device__ __forceinline__ float dot(const raw & r, const acts & xa) {
        const int s = (r.t & 2) ? 2 : 0; // l >= 32
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t lo = (r.ql[i] & 0x0F0F0F0Fu) | (((r.qh[i] >> s) & 0x03030303u) << 4);
            const uint32_t hi =
                ((r.ql[i] >> 4) & 0x0F0F0F0Fu) | (((r.qh[i] >> (s + 4)) & 0x03030303u) << 4);
            s0 += q_dot4(lo, xa.a[i]);
            s1 += q_dot4(hi, xa.b[i]);
        }
        // sum (q - 32) x = 256 (sum f x) - 160 (sum x)
        const float q0 = fmaf(256.0f, s0, -160.0f * xa.sa), q1 = fmaf(256.0f, s1, -160.0f * xa.sb);
        const float d = f16_to_f32(r.d);
        return fmaf(d * float(r.s0), q0, d * float(r.s1) * q1);
    }
};

// Whether a GEMV reads type T in spans of 32 (above) rather than chunks of 8.
__host__ __device__ constexpr int gemv_unit_width(int type) {
    return type == SMOL_TYPE_Q4_K || type == SMOL_TYPE_Q6_K ? 32 : 8;
}

} // namespace smol
