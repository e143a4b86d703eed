// smol-cuda-rows.cuh - how the GPU kernels read weights: f16 and bf16
// conversions, and load_chunk, which reads eight weights of a row in any of
// GGUF's block layouts. smol-cuda.cu includes it (for CUDA, and for ROCm
// through smol-hip.h), and so does scripts/gemv-lab.cuh, so that the GEMV
// lab times the backend's own loads.
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
__device__ __forceinline__ float ld_f16(const uint8_t * p) {
    return f16_to_f32(*reinterpret_cast<const uint16_t *>(p));
}

// Eight weights of chunk ch of a row (chunks of 8 elements; the quantized
// types have 4 chunks per 32-element block) and where they meet the
// activations: v[0..3] multiply x[e0..e0+3], v[4..7] multiply x[e1..e1+3].
// Quantized blocks are only 2-byte aligned, so they are read in 16 or 32-bit
// pieces; float rows are read 16 bytes at a time.
template <int T>
__device__ __forceinline__ void load_chunk(const uint8_t * __restrict__ row, int ch, float (&v)[8],
                                           int & e0, int & e1) {
    if constexpr (T == SMOL_TYPE_F32) {
        const float4 a = reinterpret_cast<const float4 *>(row)[2 * ch];
        const float4 b = reinterpret_cast<const float4 *>(row)[2 * ch + 1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        e0 = 8 * ch;
        e1 = e0 + 4;
    } else if constexpr (T == SMOL_TYPE_F16 || T == SMOL_TYPE_BF16) {
        const uint4 u = reinterpret_cast<const uint4 *>(row)[ch];
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
        e0 = 8 * ch;
        e1 = e0 + 4;
    } else if constexpr (T == SMOL_TYPE_Q8_0) {
        const int q = ch & 3;
        const uint8_t * blk = row + size_t(ch >> 2) * sizeof(cpu::block_q8_0);
        const float d = ld_f16(blk);
        const uint16_t * qs = reinterpret_cast<const uint16_t *>(blk + 2 + 8 * q);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint16_t w = qs[i];
            v[2 * i] = d * float(int8_t(w & 0xff));
            v[2 * i + 1] = d * float(int8_t(w >> 8));
        }
        e0 = 32 * (ch >> 2) + 8 * q;
        e1 = e0 + 4;
    } else if constexpr (T == SMOL_TYPE_Q4_0) {
        const int q = ch & 3;
        const uint8_t * blk = row + size_t(ch >> 2) * sizeof(cpu::block_q4_0);
        const float d = ld_f16(blk);
        const uint16_t * qs = reinterpret_cast<const uint16_t *>(blk + 2 + 4 * q);
        const uint32_t w = uint32_t(qs[0]) | (uint32_t(qs[1]) << 16);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t byte = (w >> (8 * i)) & 0xff;
            v[i] = d * float(int(byte & 15) - 8);
            v[4 + i] = d * float(int(byte >> 4) - 8);
        }
        e0 = 32 * (ch >> 2) + 4 * q;
        e1 = e0 + 16;
    } else { // SMOL_TYPE_Q4_1
        const int q = ch & 3;
        const uint8_t * blk = row + size_t(ch >> 2) * sizeof(cpu::block_q4_1);
        const float d = ld_f16(blk), m = ld_f16(blk + 2);
        const uint32_t w = *reinterpret_cast<const uint32_t *>(blk + 4 + 4 * q);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t byte = (w >> (8 * i)) & 0xff;
            v[i] = d * float(byte & 15) + m;
            v[4 + i] = d * float(byte >> 4) + m;
        }
        e0 = 32 * (ch >> 2) + 4 * q;
        e1 = e0 + 16;
    }
}

} // namespace smol
