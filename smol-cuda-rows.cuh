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

} // namespace smol
