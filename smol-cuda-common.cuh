// smol-cuda-common.cuh - what every file of the GPU backend uses: the
// vendor's headers and macros (smol-hip.h's for ROCm), the error checks of
// runtime and cuBLAS calls, the helpers of programmatic dependent launch,
// and the device helpers the kernels of several files share (warp sums,
// rms scales, rope angles, the stores of f32, f16 and bf16 pairs).
// smol-cuda-rows.cuh, which it includes, reads the weights.

#ifndef SMOL_CUDA_COMMON_CUH
#define SMOL_CUDA_COMMON_CUH

#include "smol-backend.h"
#include "smol-cpu-kernels.h"
#include "smol-error.h"
#include "smol-graph.h"
#include "smol-log.h"

#if defined(SMOL_HIP)
#include "smol-hip.h"
#else
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define SMOL_GPU_VENDOR     "CUDA"
#define SMOL_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m), 32)
#define SMOL_SHFL(v, l)     __shfl_sync(0xffffffffu, (v), (l), 32)
#define SMOL_HAVE_BLAS      1
// A load that skips L1, for data other blocks wrote during this launch.
#define SMOL_LOAD_L2(p)     __ldcg(p)
#endif

#include "smol-cuda-rows.cuh"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#if !defined(SMOL_HIP)
// The flash (prefill) and decode attention kernels use NVIDIA's mma.sync and
// ldmatrix instructions (sm_80 and up); the HIP build keeps the classic
// attention kernel for every batch.
#define SMOL_FLASH_ATTENTION 1
#endif

namespace smol::gpu {

// --- errors -----------------------------------------------------------------

[[noreturn]] inline void gpu_fail(cudaError_t e, const char * what) {
    (void)cudaGetLastError(); // clear it, so the next call does not see it again
    throw error(SMOL_ERR_BACKEND, std::string(SMOL_GPU_VENDOR " error in ") + what + ": " +
                                      cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

#define SMOL_GPU_CHECK(call)                                                                       \
    do {                                                                                           \
        const cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) gpu_fail(e_, #call);                                                \
    } while (0)

// --- programmatic dependent launch --------------------------------------------
//
// A decode step is a chain of small kernels, each about as long as the gap
// between two launches. On Hopper a kernel launched with programmatic
// stream serialization may start while the one before it finishes: it
// runs up to griddep_wait() (which returns once its predecessor has ended
// and its writes are visible), so its launch, its block scheduling and
// whatever it does before the wait (prefetching weights) overlap the
// predecessor's tail. Each kernel launched that way calls griddep_wait()
// before it reads or writes anything another kernel touches, and
// griddep_launch() to let its own successor launch. Elsewhere both are
// no-ops, as is the wait in a kernel launched the ordinary way.
//
// The GEMV and the decode attention kernel let their successor launch
// before they wait, not after: then the kernel after next may start too
// while the one before still runs, where the GPU has room for it (most
// likely beside the 135M's short attention launches, which leave most of
// it free). That helped the small models' decode most and left the 1.7B
// level (BENCHMARKS.md).
//
// No launch can wait on a later one: a successor launches only once every
// block of its predecessor has started, so each launch's blocks all hold
// their places before the next launch's start. Before their wait both
// kernels read only what no kernel of the step writes (weights, the staged
// cell table, earlier steps' cells); the decode kernel reads the step's own
// cells again after it.
__device__ __forceinline__ void griddep_wait() {
#if !defined(SMOL_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void griddep_launch() {
#if !defined(SMOL_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Launches kernel<<<grid, block, smem, stream>>>(args...), with programmatic
// stream serialization when pdl is set (see above).
template <typename... P, typename... A>
void launch_kernel_smem(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                        cudaStream_t stream, bool pdl, A &&... args) {
#if !defined(SMOL_HIP)
    if (pdl) {
        cudaLaunchAttribute attr{};
        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = grid;
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = smem;
        cfg.stream = stream;
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
        return;
    }
#endif
    (void)pdl;
    kernel<<<grid, block, smem, stream>>>(std::forward<A>(args)...);
}

template <typename... P, typename... A>
void launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, cudaStream_t stream, bool pdl,
                   A &&... args) {
    launch_kernel_smem(kernel, grid, block, 0, stream, pdl, std::forward<A>(args)...);
}

#if defined(SMOL_HAVE_BLAS)
#define SMOL_BLAS_CHECK(call)                                                                      \
    do {                                                                                           \
        const cublasStatus_t s_ = (call);                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            throw error(SMOL_ERR_BACKEND,                                                          \
                        std::string("cuBLAS error in " #call ": ") + cublasGetStatusString(s_));   \
        }                                                                                          \
    } while (0)
#endif

// --- device helpers ---------------------------------------------------------

constexpr int warp_size = 32; // logical lanes; see smol-hip.h for AMD

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v += SMOL_SHFL_XOR(v, m);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, SMOL_SHFL_XOR(v, m));
    return v;
}

// One element of a row of a 256-element type, with the float operations of
// smol-quant's reference (each product and difference rounded on its own).
static __device__ float row_elem_k(int t, const uint8_t * row, int e) {
    const int sb = e / QK_K, r = e % QK_K;
    const int h = r / 128, tq = (r % 128) / 32, c = r % 32;
    switch (t) {
    case SMOL_TYPE_Q2_K: {
        const uint8_t * blk = row + size_t(sb) * sizeof(block_q2_K);
        const int q = (blk[16 + 32 * h + c] >> (2 * tq)) & 3;
        const uint8_t sc = blk[r / 16];
        const float dl = __fmul_rn(ld_f16(blk + 80), float(sc & 15));
        const float ml = __fmul_rn(ld_f16(blk + 82), float(sc >> 4));
        return __fsub_rn(__fmul_rn(dl, float(q)), ml);
    }
    case SMOL_TYPE_Q3_K: {
        const uint8_t * blk = row + size_t(sb) * sizeof(block_q3_K);
        const int lo = (blk[32 + 32 * h + c] >> (2 * tq)) & 3;
        const int q = lo - (((blk[r % 32] >> (r / 32)) & 1) ? 0 : 4);
        const float dl = __fmul_rn(ld_f16(blk + 108), float(k3_scale(blk + 96, r / 16)));
        return __fmul_rn(dl, float(q));
    }
    case SMOL_TYPE_Q4_K:
    case SMOL_TYPE_Q5_K: {
        const bool q5 = t == SMOL_TYPE_Q5_K;
        const uint8_t * blk = row + size_t(sb) * (q5 ? sizeof(block_q5_K) : sizeof(block_q4_K));
        const int s = r / 32;
        uint8_t sc, m;
        k4_scale_min(s, blk + 4, sc, m);
        int q = (blk[(q5 ? 48 : 16) + 32 * (s / 2) + c] >> (4 * (s % 2))) & 15;
        if (q5) q |= ((blk[16 + c] >> s) & 1) << 4;
        const float dl = __fmul_rn(ld_f16(blk), float(sc)),
                    ml = __fmul_rn(ld_f16(blk + 2), float(m));
        return __fsub_rn(__fmul_rn(dl, float(q)), ml);
    }
    case SMOL_TYPE_Q6_K: {
        const uint8_t * blk = row + size_t(sb) * sizeof(block_q6_K);
        const int rr = r % 128;
        const int lo = (blk[64 * h + rr % 64] >> (4 * (rr / 64))) & 15;
        const int hi = (blk[128 + 32 * h + rr % 32] >> (2 * (rr / 32))) & 3;
        const float dl = __fmul_rn(ld_f16(blk + 208), float(int8_t(blk[192 + r / 16])));
        return __fmul_rn(dl, float((lo | (hi << 4)) - 32));
    }
    case SMOL_TYPE_IQ4_XS: {
        const uint8_t * blk = row + size_t(sb) * sizeof(block_iq4_xs);
        const int s = r / 32, j = r % 32;
        const int sh = blk[2] | (blk[3] << 8);
        const int ls =
            (((blk[4 + s / 2] >> (4 * (s % 2))) & 15) | (((sh >> (2 * s)) & 3) << 4)) - 32;
        const uint8_t byte = blk[8 + 16 * s + (j & 15)];
        return __fmul_rn(__fmul_rn(ld_f16(blk), float(ls)),
                         iq4_value(j < 16 ? byte & 15 : byte >> 4));
    }
    }
    return 0.0f;
}

// One element of a row of type t. Products are rounded before the q4_1
// minimum is added, as the CPU does, so get_rows matches it bit for bit.
static __device__ float row_elem(int t, const uint8_t * row, int e) {
    const int b = e / QK, j = e % QK;
    switch (t) {
    case SMOL_TYPE_F32:
        return reinterpret_cast<const float *>(row)[e];
    case SMOL_TYPE_F16:
        return f16_to_f32(reinterpret_cast<const uint16_t *>(row)[e]);
    case SMOL_TYPE_BF16:
        return bf16_to_f32(reinterpret_cast<const uint16_t *>(row)[e]);
    case SMOL_TYPE_Q8_0: {
        const uint8_t * blk = row + size_t(b) * sizeof(block_q8_0);
        return __fmul_rn(float(int8_t(blk[2 + j])), ld_f16(blk));
    }
    case SMOL_TYPE_Q4_0: {
        const uint8_t * blk = row + size_t(b) * sizeof(block_q4_0);
        const uint8_t q = blk[2 + (j & 15)];
        return __fmul_rn(float(int(j < 16 ? q & 15 : q >> 4) - 8), ld_f16(blk));
    }
    case SMOL_TYPE_Q4_1: {
        const uint8_t * blk = row + size_t(b) * sizeof(block_q4_1);
        const uint8_t q = blk[4 + (j & 15)];
        return __fadd_rn(__fmul_rn(float(j < 16 ? q & 15 : q >> 4), ld_f16(blk)), ld_f16(blk + 2));
    }
    case SMOL_TYPE_Q5_0:
    case SMOL_TYPE_Q5_1: {
        const bool q51 = t == SMOL_TYPE_Q5_1;
        const uint8_t * blk = row + size_t(b) * (q51 ? sizeof(block_q5_1) : sizeof(block_q5_0));
        const uint8_t * qh = blk + (q51 ? 4 : 2);
        const uint8_t byte = qh[4 + (j & 15)];
        const int q = (j < 16 ? byte & 15 : byte >> 4) | (((qh[j / 8] >> (j % 8)) & 1) << 4);
        if (!q51) return __fmul_rn(ld_f16(blk), float(q - 16));
        return __fadd_rn(__fmul_rn(ld_f16(blk), float(q)), ld_f16(blk + 2));
    }
    case SMOL_TYPE_IQ4_NL: {
        const uint8_t * blk = row + size_t(b) * sizeof(block_iq4_nl);
        const uint8_t byte = blk[2 + (j & 15)];
        return __fmul_rn(ld_f16(blk), iq4_value(j < 16 ? byte & 15 : byte >> 4));
    }
    default:
        return row_elem_k(t, row, e);
    }
}

// The angle of pair j is the CPU's (and ggml's): theta = pos, multiplied j
// times by theta_scale = base^(-2/d) in float, so both backends get the same
// float angle. Its cos and sin are taken in double and rounded, which matches
// the CPU's cosf and sinf except where those miss the correct rounding.
__device__ __forceinline__ void rope_cs(int pos, int j, float theta_scale, float & c, float & s) {
    float theta = float(pos);
    for (int k = 0; k < j; ++k) theta *= theta_scale;
    double sd, cd;
    sincos(double(theta), &sd, &cd);
    c = float(cd);
    s = float(sd);
}

// Turns the pair (x0, x1) by the angle whose cos and sin are c and s, with
// the CPU's roundings (no fused multiply-adds), so both give the same bits.
__device__ __forceinline__ void rope_pair(float & x0, float & x1, float c, float s) {
    const float r0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    const float r1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    x0 = r0;
    x1 = r1;
}

__device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v += SMOL_SHFL_XOR(v, m);
    return v;
}

// The sum of v over the block, the same in every thread: warps' sums, then
// those in warp order (red: a shared array of a double a warp).
__device__ __forceinline__ double block_sum_f64(double v, double * red) {
    v = warp_sum_f64(v);
    if (threadIdx.x % warp_size == 0) red[threadIdx.x / warp_size] = v;
    __syncthreads();
    double sum = 0.0;
    for (int i = 0; i < int(blockDim.x / warp_size); ++i) sum += red[i];
    return sum;
}

// 1 / rms of a row from its sum of squares, which is taken in double as the
// CPU (and ggml) do, so the scale agrees to the last bit.
__device__ __forceinline__ float rms_scale(double sum_sq, int n, float eps) {
    const float mean = float(sum_sq / double(n));
    return 1.0f / sqrtf(mean + eps);
}

__device__ __forceinline__ float silu_mul(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

// GELU in its tanh form times u, in f32 as the CPU computes it.
__device__ __forceinline__ float gelu_mul(float g, float u) {
    constexpr float k_sqrt_2_over_pi = 0.79788456080286535588f;
    return 0.5f * g * (1.0f + tanhf(k_sqrt_2_over_pi * g * (1.0f + 0.044715f * g * g))) * u;
}

// A result as the kernel stores it: f32, or f16 bits for a cuBLAS input.
template <typename Out> __device__ __forceinline__ Out store_as(float v);
template <> __device__ __forceinline__ float store_as<float>(float v) {
    return v;
}
template <> __device__ __forceinline__ uint16_t store_as<uint16_t>(float v) {
    return f32_to_f16(v);
}

// Two floats as f16 (round to nearest even, as f32_to_f16), lo in the low
// half: one instruction for the pair.
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

// Four results in one store (d 16-byte aligned as f32, 8-byte as f16).
__device__ __forceinline__ void store4(float * d, float a, float b, float c, float e) {
    *reinterpret_cast<float4 *>(d) = make_float4(a, b, c, e);
}
__device__ __forceinline__ void store4(uint16_t * d, float a, float b, float c, float e) {
    *reinterpret_cast<uint2 *>(d) = make_uint2(pack_f16x2(a, b), pack_f16x2(c, e));
}

// A cuBLAS input over bf16 weights (see blas_gemm): each row of x as two
// rows of bf16, hi = bf16(x) then lo = bf16(x - hi), so that hi + lo holds
// x to about 16 bits where f16 holds 11 and bf16 alone 8.
struct bf16_hl {
    uint16_t bits;
};

// v as bf16_hl's hi and lo.
__device__ __forceinline__ void split_bf16(float v, uint16_t & hi, uint16_t & lo) {
    hi = f32_to_bf16(v);
    lo = f32_to_bf16(v - bf16_to_f32(hi));
}

// Element e of a row of n as Out (bf16_hl: hi at d[e], lo at d[n + e]).
template <typename Out> __device__ __forceinline__ void store_at(Out * d, int e, int n, float v) {
    if constexpr (std::is_same_v<Out, bf16_hl>) {
        split_bf16(v, d[e].bits, d[n + e].bits);
    } else {
        (void)n;
        d[e] = store_as<Out>(v);
    }
}
// Elements e..e+3 of a row of n (d + e aligned as store4 needs).
template <typename Out>
__device__ __forceinline__ void store4_at(Out * d, int e, int n, float a, float b, float c,
                                          float x) {
    if constexpr (std::is_same_v<Out, bf16_hl>) {
        const float v[4] = {a, b, c, x};
        uint16_t hi[4], lo[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) split_bf16(v[i], hi[i], lo[i]);
        *reinterpret_cast<uint2 *>(d + e) =
            make_uint2(hi[0] | uint32_t(hi[1]) << 16, hi[2] | uint32_t(hi[3]) << 16);
        *reinterpret_cast<uint2 *>(d + n + e) =
            make_uint2(lo[0] | uint32_t(lo[1]) << 16, lo[2] | uint32_t(lo[3]) << 16);
    } else {
        (void)n;
        store4(d + e, a, b, c, x);
    }
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// Weights read as plain floats (16 bytes a chunk of 8), not in quantized blocks.
__host__ __device__ constexpr bool float_weights(int type) {
    return type == SMOL_TYPE_F32 || type == SMOL_TYPE_F16 || type == SMOL_TYPE_BF16;
}

__device__ __forceinline__ void prefetch_l2(const void * p) {
#if defined(SMOL_HIP)
    (void)p;
#else
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
#endif
}

} // namespace smol::gpu

#endif // SMOL_CUDA_COMMON_CUH
