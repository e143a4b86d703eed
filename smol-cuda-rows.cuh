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
