// ring-parts.cuh - the pieces of the ring GEMV (a ring of bulk copies
// feeding CUDA or tensor cores) that ring-step.cu builds on: the packed
// layout of weights for mma (ring_packed_at), mbarriers, bulk copies,
// mma.sync m16n8k16 (the product's, smol-cuda-attn.cuh's mma_f16_16816, on
// a uint4 fragment), a ring's barriers, x's hi/lo split and mma's b, and a
// unit's row sums. The product drops its ring (gemv_ring_kernel), so they
// live here, as smol-cuda-rows.cuh had them (the lab builds for sm_90 only,
// so without its architecture guards). A warp that waits on a barrier's
// phase must be the only one taking its rounds: a parity wait cannot tell a
// phase from the one two rounds later.
#pragma once
#include "smol-cuda-attn.cuh" // mma_f16_16816

#include <cstddef>
#include <cstdint>
#include <cuda_fp16.h>

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

__device__ __forceinline__ void mbar_init(uint64_t * b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count)
                 : "memory");
}
// Waits for the phase of parity `parity` to complete. A slot's waits are
// one warp's, in order: a parity wait cannot tell a phase from the one two
// rounds later.
__device__ __forceinline__ void mbar_wait(uint64_t * b, uint32_t parity) {
    asm volatile("{\n .reg .pred p;\n W_%=:\n"
                 " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 " @!p bra W_%=;\n}" ::"r"(smem_u32(b)),
                 "r"(parity)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t * b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
// Arrives and adds `bytes` to what the barrier's phase waits for.
__device__ __forceinline__ void mbar_expect(uint64_t * b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)),
                 "r"(bytes)
                 : "memory");
}
// `bytes` (a multiple of 16) from global src to shared dst, counted on bar.
__device__ __forceinline__ void bulk_copy(void * dst, const void * src, uint32_t bytes,
                                          uint64_t * bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                 "%2, [%3];" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}
// d += A b: A 16 x 16 (the lane's fragment a), b 16 x 8 (b0, b1); f16 in,
// f32 sums. The product's mma_f16_16816, for a fragment held as a uint4.
__device__ __forceinline__ void mma16816(float (&d)[4], uint4 a, uint32_t b0, uint32_t b1) {
    const uint32_t af[4] = {a.x, a.y, a.z, a.w};
    smol::gpu::mma_f16_16816(d, af, b0, b1);
}
// A ring's barriers, by thread 0 before the block's first sync: slot s is
// full once its bytes land, empty once `readers` warps have read it.
__device__ __forceinline__ void ring_init(uint64_t * full, uint64_t * empty, int S, int readers) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(full + s, 1);
            mbar_init(empty + s, readers);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
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
