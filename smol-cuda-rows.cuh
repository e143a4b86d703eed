// smol-cuda-rows.cuh - how the GPU kernels read weights: f16 and bf16
// conversions, load_chunk, which reads eight weights of a row in any of
// GGUF's block layouts, and a GEMV chunk's arithmetic (x_chunk, dot8).
// smol-cuda.cu includes it (for CUDA, and for ROCm through smol-hip.h), and
// so do scripts/gemv-lab.cuh and scripts/gemv-grid-lab.cu, so that the GEMV
// labs time the backend's own loads and sums.
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
        const uint8_t * blk = row + size_t(ch >> 2) * sizeof(cpu::block_q8_0);
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
        const uint8_t * blk = row + size_t(ch >> 2) * sizeof(cpu::block_q4_0);
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
        const uint8_t * blk = row + size_t(ch >> 2) * sizeof(cpu::block_q4_1);
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

#if !defined(SMOL_HIP)
// --- the ring GEMV's pieces (sm_90 and up; the labs scripts/lab-async.cuh and
// scripts/ring-step.cu) -------------------------------------------------------

// Where element (r, k) of a rows x K matrix goes in the ring GEMV's packed
// copy: units of 16 rows x KU columns (unit (row tile rt, segment sg) at
// rt * K / KU + sg), each a run of 16 x 16 tiles, each tile the 32 lanes' A
// fragments of mma.sync m16n8k16 in lane order (16 bytes a lane: rows g and
// g + 8, columns 2t, 2t + 1 and 2t + 8, 2t + 9 of the tile, for
// g = lane / 4 and t = lane % 4).
__host__ __device__ inline size_t ring_packed_at(int r, int k, int K, int KU) {
    const int rr = r % 16, kin = k % KU, kk = kin % 16;
    const int lane = (rr % 8) * 4 + (kk % 8) / 2, reg = rr / 8 + 2 * (kk / 8);
    const size_t unit = size_t(r / 16) * size_t(K / KU) + size_t(k / KU);
    return unit * 16 * size_t(KU) + size_t(kin / 16) * 256 + size_t(lane) * 8 + size_t(reg) * 2 +
           size_t(kk % 2);
}

__device__ __forceinline__ uint32_t smem_u32(const void * p) {
    return uint32_t(__cvta_generic_to_shared(p));
}

// The instructions below exist from sm_90 on; elsewhere (and in the host
// pass) the helpers are empty, and only kernels built for sm_90 call them.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SMOL_SM90 1
#else
#define SMOL_SM90 0
#endif
__device__ __forceinline__ void mbar_init(uint64_t * b, int count) {
#if SMOL_SM90
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count)
                 : "memory");
#endif
}
// Waits for the phase of parity `parity` to complete. A slot's waits are
// one warp's, in order: a parity wait cannot tell a phase from the one two
// rounds later.
__device__ __forceinline__ void mbar_wait(uint64_t * b, uint32_t parity) {
#if SMOL_SM90
    asm volatile("{\n .reg .pred p;\n W_%=:\n"
                 " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 " @!p bra W_%=;\n}" ::"r"(smem_u32(b)),
                 "r"(parity)
                 : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint64_t * b) {
#if SMOL_SM90
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
#endif
}
// Arrives and adds `bytes` to what the barrier's phase waits for.
__device__ __forceinline__ void mbar_expect(uint64_t * b, uint32_t bytes) {
#if SMOL_SM90
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)),
                 "r"(bytes)
                 : "memory");
#endif
}
// `bytes` (a multiple of 16) from global src to shared dst, counted on bar.
__device__ __forceinline__ void bulk_copy(void * dst, const void * src, uint32_t bytes,
                                          uint64_t * bar) {
#if SMOL_SM90
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                 "%2, [%3];" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
#endif
}
// d += A b: A 16 x 16 (the lane's fragment a), b 16 x 8 (b0, b1); f16 in, f32 sums.
__device__ __forceinline__ void mma16816(float (&d)[4], uint4 a, uint32_t b0, uint32_t b1) {
#if SMOL_SM90
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
#endif
}
// A ring's barriers, by thread 0 before the block's first sync: slot s is
// full once its bytes land, empty once `readers` warps have read it.
__device__ __forceinline__ void ring_init(uint64_t * full, uint64_t * empty, int S, int readers) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(full + s, 1);
            mbar_init(empty + s, readers);
        }
#if SMOL_SM90
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
    }
}

// One arrival for a warp once all its lanes are past what came before (their
// reads of a ring slot): the warp syncs, its lane 0 arrives.
__device__ __forceinline__ void mbar_arrive_warp(uint64_t * b) {
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbar_arrive(b);
}

// x[i..i+4) as the ring GEMV's two f16 columns of x, hi = f16(x) and
// lo = f16(x - hi): pairs i / 2 and i / 2 + 1 of xh and xl.
__device__ __forceinline__ void ring_split_x(float4 v, __half2 * xh, __half2 * xl, int i) {
    const __half2 h0 = __floats2half2_rn(v.x, v.y), h1 = __floats2half2_rn(v.z, v.w);
    const float2 f0 = __half22float2(h0), f1 = __half22float2(h1);
    xh[i / 2] = h0;
    xh[i / 2 + 1] = h1;
    xl[i / 2] = __floats2half2_rn(v.x - f0.x, v.y - f0.y);
    xl[i / 2 + 1] = __floats2half2_rn(v.z - f1.x, v.w - f1.y);
}

// mma's b for the tile of x's columns k..k+16, lane (g, t) = (lane / 4,
// lane % 4): column 0 (g = 0) x's hi, column 1 (g = 1) its lo (xb is xh
// for g = 0, else xl), the other columns 0.
__device__ __forceinline__ void ring_b_frag(const __half2 * xb, int g, int t, int k, uint32_t & b0,
                                            uint32_t & b1) {
    b0 = b1 = 0;
    if (g < 2) {
        const __half2 p0 = xb[k / 2 + t], p1 = xb[k / 2 + t + 4];
        b0 = *reinterpret_cast<const uint32_t *>(&p0);
        b1 = *reinterpret_cast<const uint32_t *>(&p1);
    }
}

// A unit's row sums from four chains of mma (d[c]), for the lanes of t = 0:
// rows g and g + 8 of its 16, each the sum of columns 0 and 1 (x's hi and
// lo), into row[g] and row[g + 8].
__device__ __forceinline__ void ring_row_sums(const float (&d)[4][4], float * row, int g) {
    float r[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) r[e] = (d[0][e] + d[1][e]) + (d[2][e] + d[3][e]);
    row[g] = r[0] + r[1];
    row[g + 8] = r[2] + r[3];
}
#endif // !SMOL_HIP

} // namespace smol
