// smol-cuda.cu - the CUDA backend: device memory under an optional limit,
// pinned host memory for offloaded KV, a compute stream and two copy streams
// with events (the schedule of smol-graph.h), an arena for a graph's
// intermediate results, staging of the host inputs a graph reads, the
// kernels of every op (matmuls chosen by batch size that dequantize GGUF
// blocks in registers, flash-decoding attention over head groups of the
// head-major KV cache, resident or in a staging slot), fusion of the decode
// step's small ops, and replay of a repeated step (copies included) as a
// CUDA graph. smol-hip.cpp compiles this same file for ROCm with
// smol-hip.h mapping the names; that build has no BLAS.

#include "smol-backend.h"
#include "smol-cpu-kernels.h"
#include "smol-error.h"
#include "smol-graph.h"

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

namespace smol {

namespace {

// --- errors -----------------------------------------------------------------

[[noreturn]] void gpu_fail(cudaError_t e, const char * what) {
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
// it free). H200, tg128: 135M 1.06-1.10x, 360M 1.02-1.03x, 1.7B
// 0.98-0.99x; the 135M at 32K 1.05-1.08x, long contexts otherwise level
// (BENCHMARKS.md).
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

// One element of a row of type t. Products are rounded before the q4_1
// minimum is added, as the CPU does, so get_rows matches it bit for bit.
__device__ float row_elem(int t, const uint8_t * row, int e) {
    const int b = e / cpu::QK, j = e % cpu::QK;
    switch (t) {
    case SMOL_TYPE_F32:
        return reinterpret_cast<const float *>(row)[e];
    case SMOL_TYPE_F16:
        return f16_to_f32(reinterpret_cast<const uint16_t *>(row)[e]);
    case SMOL_TYPE_BF16:
        return bf16_to_f32(reinterpret_cast<const uint16_t *>(row)[e]);
    case SMOL_TYPE_Q8_0: {
        const uint8_t * blk = row + size_t(b) * sizeof(cpu::block_q8_0);
        return __fmul_rn(float(int8_t(blk[2 + j])), ld_f16(blk));
    }
    case SMOL_TYPE_Q4_0: {
        const uint8_t * blk = row + size_t(b) * sizeof(cpu::block_q4_0);
        const uint8_t q = blk[2 + (j & 15)];
        return __fmul_rn(float(int(j < 16 ? q & 15 : q >> 4) - 8), ld_f16(blk));
    }
    case SMOL_TYPE_Q4_1: {
        const uint8_t * blk = row + size_t(b) * sizeof(cpu::block_q4_1);
        const uint8_t q = blk[4 + (j & 15)];
        return __fadd_rn(__fmul_rn(float(j < 16 ? q & 15 : q >> 4), ld_f16(blk)), ld_f16(blk + 2));
    }
    }
    return 0.0f;
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

float rope_theta_scale(float base, int hd) {
    return std::pow(base, -2.0f / float(hd));
}

// Where a kernel finds the angles of a rope: the graph's table of (cos,
// sin) per token and pair when it has one (computed once per run, not once
// per layer), else computed on the spot.
struct rope_params {
    const int32_t * pos = nullptr; // per token; null: no rope
    const float2 * table = nullptr;
    float theta_scale = 0.0f;
    int half = 0;
};

__device__ __forceinline__ void rope_get(const rope_params & r, int tok, int j, float & c,
                                         float & s) {
    if (r.table) {
        const float2 cs = r.table[size_t(tok) * r.half + j];
        c = cs.x;
        s = cs.y;
    } else {
        rope_cs(r.pos[tok], j, r.theta_scale, c, s);
    }
}

__global__ void rope_table_kernel(const rope_params r, float2 * table) {
    for (int j = threadIdx.x; j < r.half; j += blockDim.x) {
        float c, s;
        rope_cs(r.pos[blockIdx.x], j, r.theta_scale, c, s);
        table[size_t(blockIdx.x) * r.half + j] = make_float2(c, s);
    }
}

// Turns the pair (x0, x1) by the angle whose cos and sin are c and s, with
// the CPU's roundings (no fused multiply-adds), so both give the same bits.
__device__ __forceinline__ void rope_pair(float & x0, float & x1, float c, float s) {
    const float r0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    const float r1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    x0 = r0;
    x1 = r1;
}

// --- small ops ----------------------------------------------------------------

__global__ void get_rows_kernel(int type, const uint8_t * table, size_t row_bytes,
                                const int32_t * ids, float * dst, size_t ld_dst, int n) {
    const size_t r = size_t(ids[blockIdx.x]);
    const uint8_t * row = table + r * row_bytes;
    float * d = dst + blockIdx.x * ld_dst;
    for (int e = threadIdx.x; e < n; e += blockDim.x) d[e] = row_elem(type, row, e);
}

__device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v += SMOL_SHFL_XOR(v, m);
    return v;
}

// 1 / rms of a row from its sum of squares, which is taken in double as the
// CPU (and ggml) do, so the scale agrees to the last bit.
__device__ __forceinline__ float rms_scale(double sum_sq, int n, float eps) {
    const float mean = float(sum_sq / double(n));
    return 1.0f / sqrtf(mean + eps);
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

// A block a row; four elements at a time where the row's length and the
// pointers' alignment allow. With b (rows ldb apart), the row normed is
// x + b, which is also stored in h (the residual add before a norm, in one
// pass); with b_lo, b's element e is b[e] + b[b_lo + e] (a cuBLAS step's
// results over bf16_hl pairs, added here in place of blas_pair_sum_kernel).
template <typename Out>
__global__ void rms_norm_kernel(const float * x, const float * b, size_t ldb, size_t b_lo,
                                float * h, size_t ldx, const float * w, Out * dst, size_t ld_dst,
                                int n, float eps) {
    __shared__ double red[32];
    const size_t row = blockIdx.x * ldx;
    const float * xr = x + row;
    const float * br = b ? b + blockIdx.x * ldb : nullptr;
    Out * d = dst + blockIdx.x * ld_dst;
    const uintptr_t at =
        reinterpret_cast<uintptr_t>(xr) | reinterpret_cast<uintptr_t>(w) |
        (b ? reinterpret_cast<uintptr_t>(br) | reinterpret_cast<uintptr_t>(h + row) |
                 reinterpret_cast<uintptr_t>(br + b_lo)
           : 0);
    const bool vec =
        n % 4 == 0 && at % 16 == 0 && reinterpret_cast<uintptr_t>(d) % (4 * sizeof(Out)) == 0;
    double ss = 0.0;
    if (vec) {
        for (int e = 4 * threadIdx.x; e < n; e += 4 * blockDim.x) {
            float4 v = *reinterpret_cast<const float4 *>(xr + e);
            if (b) {
                float4 u = *reinterpret_cast<const float4 *>(br + e);
                if (b_lo) u = add4(u, *reinterpret_cast<const float4 *>(br + b_lo + e));
                v = add4(v, u);
                *reinterpret_cast<float4 *>(h + row + e) = v;
            }
            ss += double(v.x) * double(v.x);
            ss += double(v.y) * double(v.y);
            ss += double(v.z) * double(v.z);
            ss += double(v.w) * double(v.w);
        }
    } else {
        for (int e = threadIdx.x; e < n; e += blockDim.x) {
            float v = xr[e];
            if (b) h[row + e] = v = v + (b_lo ? br[e] + br[b_lo + e] : br[e]);
            ss += double(v) * double(v);
        }
    }
    ss = warp_sum_f64(ss);
    if (threadIdx.x % warp_size == 0) red[threadIdx.x / warp_size] = ss;
    __syncthreads();
    double sum = 0.0;
    for (int i = 0; i < int(blockDim.x / warp_size); ++i) sum += red[i];
    const float scale = rms_scale(sum, n, eps);
    // Each thread reads back the sums it stored itself.
    const float * y = b ? h + row : xr;
    if (vec) {
        for (int e = 4 * threadIdx.x; e < n; e += 4 * blockDim.x) {
            const float4 v = *reinterpret_cast<const float4 *>(y + e);
            const float4 g = *reinterpret_cast<const float4 *>(w + e);
            store4_at(d, e, n, (v.x * scale) * g.x, (v.y * scale) * g.y, (v.z * scale) * g.z,
                      (v.w * scale) * g.w);
        }
    } else {
        for (int e = threadIdx.x; e < n; e += blockDim.x) store_at(d, e, n, (y[e] * scale) * w[e]);
    }
}

__global__ void add_kernel(const float * a, const float * b, float * dst, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        dst[i] = a[i] + b[i];
    }
}

__device__ __forceinline__ float silu_mul(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

// silu(g) * u of M rows of K (g's and u's rows ld apart; with lo, each of
// their elements is the sum of it and the one lo further: a cuBLAS step's
// results over bf16_hl pairs, added here in place of blas_pair_sum_kernel),
// four at a time where K and the pointers' alignment allow. Block row y
// takes rows y, y + gridDim.y, ...
template <typename Out>
__global__ void swiglu_kernel(const float * g, const float * u, size_t ld, size_t lo, Out * dst,
                              int K, int M) {
    constexpr bool hl = std::is_same_v<Out, bf16_hl>;
    const size_t ld_dst = hl ? 2 * size_t(K) : size_t(K);
    const int e0 = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
    const uintptr_t at = reinterpret_cast<uintptr_t>(g) | reinterpret_cast<uintptr_t>(u) |
                         reinterpret_cast<uintptr_t>(dst);
    const bool vec = K % 4 == 0 && ld % 4 == 0 && lo % 4 == 0 && at % 16 == 0;
    for (int r = blockIdx.y; r < M; r += gridDim.y) {
        const float * gr = g + size_t(r) * ld;
        const float * ur = u + size_t(r) * ld;
        Out * d = dst + size_t(r) * ld_dst;
        if (vec) {
            for (int e = 4 * e0; e < K; e += 4 * stride) {
                float4 a = *reinterpret_cast<const float4 *>(gr + e);
                float4 b = *reinterpret_cast<const float4 *>(ur + e);
                if (lo) {
                    a = add4(a, *reinterpret_cast<const float4 *>(gr + lo + e));
                    b = add4(b, *reinterpret_cast<const float4 *>(ur + lo + e));
                }
                store4_at(d, e, K, silu_mul(a.x, b.x), silu_mul(a.y, b.y), silu_mul(a.z, b.z),
                          silu_mul(a.w, b.w));
            }
        } else {
            for (int e = e0; e < K; e += stride) {
                const float a = lo ? gr[e] + gr[lo + e] : gr[e];
                const float b = lo ? ur[e] + ur[lo + e] : ur[e];
                store_at(d, e, K, silu_mul(a, b));
            }
        }
    }
}
dim3 swiglu_grid(int K, int M) {
    return dim3(unsigned((K + 1023) / 1024), unsigned(std::min(M, 65535)));
}

// One block per token; pairs (2j, 2j+1) of every head.
__global__ void rope_kernel(const float * x, size_t ldx, const rope_params r, float * dst,
                            size_t ld_dst, int n_head, int hd) {
    const int half = hd / 2;
    const float * src = x + blockIdx.x * ldx;
    float * d = dst + blockIdx.x * ld_dst;
    for (int e = threadIdx.x; e < n_head * half; e += blockDim.x) {
        const int h = e / half, j = e % half;
        float c, s;
        rope_get(r, int(blockIdx.x), j, c, s);
        float x0 = src[h * hd + 2 * j], x1 = src[h * hd + 2 * j + 1];
        rope_pair(x0, x1, c, s);
        d[h * hd + 2 * j] = x0;
        d[h * hd + 2 * j + 1] = x1;
    }
}

struct kv_store_params {
    const float * k;
    const float * v;
    size_t ldk, ldv;
    size_t k_lo = 0, v_lo = 0; // nonzero: k's (v's) element e is k[e] + k[k_lo + e] (kept_)
    uint16_t * K;              // the view's first head
    uint16_t * V;
    size_t head_stride;    // elements between heads: n_cells * hd
    int hd, h0, n_head_kv; // the view's heads [h0, h0 + n_head_kv) of the k, v rows
    const int32_t * cell;  // per token
    rope_params rope;      // non-null pos: rotate k on the way in
    bool vec;              // two pairs a thread: 16-byte rows in, 8-byte pieces out
};

// Rows r and r + 1 (r even) of token tok's k (or v) into the token's cache
// cell as f16, where row r's head is one of the view's; k's pair turned by
// the rope first. kv_store_kernel, and the GEMVs that store k and v
// themselves, all store through it.
__device__ __forceinline__ void store_kv_pair(const kv_store_params & p, int tok, size_t cell,
                                              int r, float x0, float x1, bool k) {
    const int e = r % p.hd, h = r / p.hd - p.h0;
    if (h < 0 || h >= p.n_head_kv) return;
    if (k && p.rope.pos) {
        float c, s;
        rope_get(p.rope, tok, e / 2, c, s);
        rope_pair(x0, x1, c, s);
    }
    uint16_t * d = (k ? p.K : p.V) + h * p.head_stride + cell * p.hd + e;
    d[0] = f32_to_f16(x0);
    d[1] = f32_to_f16(x1);
}

// A block a token, a thread a pair of elements of one of its kv heads, or
// two pairs where the rows allow (all of them at once, up to 1024 threads):
// converts k and v to f16 in the token's cache cell. Looping a block's 128
// threads over the heads took 9 us for one token of 32 heads; a block a
// (token, head) pair made a 4096-token prompt's launch 131,072 blocks of one
// warp, and the 1.7B model's prefill about 3% slower.
__global__ void kv_store_kernel(const kv_store_params p) {
    griddep_wait();
    griddep_launch();
    const int i = blockIdx.x, half = p.hd / 2;
    const size_t cell = size_t(p.cell[i]);
    const float * k = p.k + i * p.ldk;
    const float * v = p.v + i * p.ldv;
    if (p.vec) {
        const int quads = p.hd / 4;
        for (int e = threadIdx.x; e < p.n_head_kv * quads; e += blockDim.x) {
            const int h = e / quads, j = 2 * (e % quads), hr = p.h0 + h;
            float4 kq = *reinterpret_cast<const float4 *>(k + hr * p.hd + 2 * j);
            float4 vq = *reinterpret_cast<const float4 *>(v + hr * p.hd + 2 * j);
            if (p.k_lo)
                kq = add4(kq, *reinterpret_cast<const float4 *>(k + p.k_lo + hr * p.hd + 2 * j));
            if (p.v_lo)
                vq = add4(vq, *reinterpret_cast<const float4 *>(v + p.v_lo + hr * p.hd + 2 * j));
            if (p.rope.pos) {
                float c, s;
                rope_get(p.rope, i, j, c, s);
                rope_pair(kq.x, kq.y, c, s);
                rope_get(p.rope, i, j + 1, c, s);
                rope_pair(kq.z, kq.w, c, s);
            }
            const size_t at = h * p.head_stride + cell * p.hd + 2 * j;
            store4(p.K + at, kq.x, kq.y, kq.z, kq.w);
            store4(p.V + at, vq.x, vq.y, vq.z, vq.w);
        }
        return;
    }
    for (int e = threadIdx.x; e < p.n_head_kv * half; e += blockDim.x) {
        const int r = (p.h0 + e / half) * p.hd + 2 * (e % half);
        float k0 = k[r], k1 = k[r + 1], v0 = v[r], v1 = v[r + 1];
        if (p.k_lo) k0 += k[p.k_lo + r], k1 += k[p.k_lo + r + 1];
        if (p.v_lo) v0 += v[p.v_lo + r], v1 += v[p.v_lo + r + 1];
        store_kv_pair(p, i, cell, r, k0, k1, true);
        store_kv_pair(p, i, cell, r, v0, v1, false);
    }
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

// --- matmul: small batches ----------------------------------------------------

// y[m][r] = dot(W row r, x[m]) for up to three weights that share x and K
// (q, k and v), or silu(gate . x) * (up . x) when SWIGLU. Optionally x is
// RMS-normalized on the fly (norm_w) and a residual is added to the result.
struct mm_params {
    const uint8_t * w[3];
    float * y[3];
    int rows[3];
    int n_w;
    size_t w_row_bytes;
    int K, M;
    const float * x;
    size_t ldx;
    const float * res;
    size_t ldr;
    const float * norm_w;
    float eps;
    // The weights are no kernel's output, so the GEMV reads its first chunks
    // before it waits (early) and, with prefetch, sends its rows' first 4 KiB
    // to L2 as well.
    bool prefetch, early;
    // Non-null kv.K: the GEMV of q, k and v also stores k (rotated) and v
    // in the cache, as kv_store_kernel would (its k, v and ld unused).
    kv_store_params kv;
};

constexpr int mm_warps = 4; // warps per block of the small-batch kernels

// Row r of a launch's weights (q, k and v one after another; with SWIGLU,
// gate's rows, up's read alongside) and where its result goes: r becomes
// the row within weight number `which`. Selected with branches: a run-time
// index into the parameter arrays would copy them to local memory.
template <bool SWIGLU>
__device__ __forceinline__ void mm_select(const mm_params & p, int & r, const uint8_t *& w,
                                          float *& y, int & rows, int & which) {
    w = p.w[0];
    y = p.y[0];
    rows = p.rows[0];
    which = 0;
    if (!SWIGLU && r >= rows && p.n_w > 1) {
        r -= rows;
        w = p.w[1];
        y = p.y[1];
        rows = p.rows[1];
        which = 1;
        if (r >= rows && p.n_w > 2) {
            r -= rows;
            w = p.w[2];
            y = p.y[2];
            rows = p.rows[2];
            which = 2;
        }
    }
}

// The GEMV of single-token decode: R weight rows a warp and KS warps a group
// of R rows (mm_warps / KS groups a block); block y takes token y of a batch
// (the autotune may choose the GEMV for a few tokens). The lanes of a
// group's warps split K in chunks of 8; each lane loads its chunk of x once
// for the R rows, so the group keeps R chunks of weights in flight for each
// of x's (one row a warp read the 1.7B model's q, k, v at 2.0 TB/s, two
// rows at 3.0). The fused weights' row counts are multiples of R.
//
// A folded RMS norm scales x by its weights on the way in and multiplies
// the dot by 1 / rms at the end; the sum of squares is taken from the same
// loads, so the weights' loads never wait for the norm (a first pass over
// x made the 1.7B model's GEMVs 11-23% slower).
//
// PAIR (float weights): each lane has two chunks of a row and reads both
// at once (see gemv_pair).
template <int T, bool SWIGLU, int KS, int R, bool PAIR = false>
__global__ void __launch_bounds__(mm_warps * warp_size) gemv_kernel(const mm_params p) {
    static_assert(mm_warps % KS == 0, "the warps of a block split into whole groups");
    constexpr int groups_per_block = mm_warps / KS;
    const int warp = threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    const int ks = warp % KS, m = blockIdx.y;
    int r = (blockIdx.x * groups_per_block + warp / KS) * R;
    const uint8_t * w;
    float * y;
    int rows, which;
    mm_select<SWIGLU>(p, r, w, y, rows, which);
    // Past the last row: with KS > 1 the warp still takes part in the
    // block's reduction, with nothing to add.
    const bool valid = r < rows;
    const size_t rb = p.w_row_bytes;
    const uint8_t * wr = w + size_t(r) * rb;
    const uint8_t * wu = SWIGLU ? p.w[1] + size_t(r) * rb : nullptr;
    // A GEMV launched early sends its weights to L2 while the kernel before
    // it still runs (see run_mm).
    if (p.prefetch && valid && ks == 0 && size_t(lane) * 128 < rb) {
#pragma unroll
        for (int j = 0; j < R; ++j) {
            prefetch_l2(wr + j * rb + size_t(lane) * 128);
            if constexpr (SWIGLU) prefetch_l2(wu + j * rb + size_t(lane) * 128);
        }
    }
    // With one row a warp, a quantized GEMV reads U chunks a lane at once:
    // its blocks are read in 2 and 4-byte pieces, and one chunk at a time
    // kept too few bytes in flight. Float weights are read 16 bytes a chunk;
    // with more rows than one, the rows are in flight together and U = 1
    // measured fastest for every type, but where a lane's share of a row is
    // two chunks (PAIR) it takes both at once.
    static_assert(!PAIR || float_weights(T), "pairs of float chunks");
    constexpr int U = PAIR ? 2 : R > 1 || float_weights(T) ? 1 : SWIGLU ? 2 : 4;
    const int n_ch = valid ? p.K / 8 : 0, stride = KS * warp_size;
    // U chunks of each row at a time (past the row's end a lane reads its
    // last chunk again and drops it, so the loads stay unconditional and fly
    // together). The first are read before the wait: weights are no
    // kernel's output (p.early), so they stream while the kernel before
    // this one ends.
    raw_chunk<T> w_raw[U][R], u_raw[U][SWIGLU ? R : 1];
    auto fetch = [&](int c0) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int ch = min(c0 + u * stride, n_ch - 1);
#pragma unroll
            for (int j = 0; j < R; ++j) {
                w_raw[u][j].load(wr + j * rb, ch);
                if constexpr (SWIGLU) u_raw[u][j].load(wu + j * rb, ch);
            }
        }
    };
    const int c_first = ks * warp_size + lane;
    if (p.early && c_first < n_ch) fetch(c_first);
    griddep_launch(); // before the wait (see griddep_wait)
    griddep_wait();
    if (KS == 1 && !valid) return;
    if (!p.early && c_first < n_ch) fetch(c_first);

    float acc[R], acc_u[SWIGLU ? R : 1], ss = 0.0f; // ss: x's sum of squares
#pragma unroll
    for (int j = 0; j < R; ++j) acc[j] = 0.0f;
#pragma unroll
    for (int j = 0; j < (SWIGLU ? R : 1); ++j) acc_u[j] = 0.0f;
    const float * x = p.x + size_t(m) * p.ldx;
    for (int c0 = c_first; c0 < n_ch; c0 += U * stride) {
        if (c0 != c_first) fetch(c0);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (c0 + u * stride >= n_ch) continue;
            int e0, e1;
            raw_chunk<T>::where(c0 + u * stride, e0, e1);
            float4 a, b;
            x_chunk(x, p.norm_w, e0, e1, a, b, ss);
#pragma unroll
            for (int j = 0; j < R; ++j) {
                float v[8];
                w_raw[u][j].decode(v);
                acc[j] += dot8(v, a, b);
                if constexpr (SWIGLU) {
                    u_raw[u][j].decode(v);
                    acc_u[j] += dot8(v, a, b);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < R; ++j) {
        acc[j] = warp_sum(acc[j]);
        if constexpr (SWIGLU) acc_u[j] = warp_sum(acc_u[j]);
    }
    double ssd = p.norm_w ? warp_sum_f64(double(ss)) : 0.0;
    if constexpr (KS > 1) {
        // The group's first warp adds the others' sums, always in one order.
        __shared__ float part[mm_warps][SWIGLU ? 2 * R : R];
        __shared__ double part_ss[mm_warps];
        if (lane == 0) {
#pragma unroll
            for (int j = 0; j < R; ++j) {
                part[warp][j] = acc[j];
                if constexpr (SWIGLU) part[warp][R + j] = acc_u[j];
            }
            part_ss[warp] = ssd;
        }
        __syncthreads();
        if (ks != 0 || !valid) return;
#pragma unroll
        for (int j = 0; j < R; ++j) {
            for (int i = 1; i < KS; ++i) {
                acc[j] += part[warp + i][j];
                if constexpr (SWIGLU) acc_u[j] += part[warp + i][R + j];
            }
        }
        for (int i = 1; i < KS; ++i) ssd += part_ss[warp + i];
    }
    // Lane j writes row r + j.
    float val = acc[0], val_u = SWIGLU ? acc_u[0] : 0.0f;
#pragma unroll
    for (int j = 1; j < R; ++j) {
        if (lane == j) {
            val = acc[j];
            if constexpr (SWIGLU) val_u = acc_u[j];
        }
    }
    if (p.norm_w) {
        const float s = rms_scale(ssd, p.K, p.eps);
        val *= s;
        val_u *= s;
    }
    if constexpr (SWIGLU) val = silu_mul(val, val_u);
    if (p.res && lane < R) val = p.res[size_t(m) * p.ldr + r + lane] + val;
    if (lane < R) y[size_t(m) * rows + r + lane] = val;
    if constexpr (!SWIGLU && R % 2 == 0) {
        // k and v into the token's cache cell, a pair of rows (lanes 2i
        // and 2i + 1) by the even lane, as kv_store_kernel stores them.
        const float other = SMOL_SHFL_XOR(val, 1);
        const kv_store_params & kv = p.kv;
        if (kv.K && which > 0 && lane < R && lane % 2 == 0)
            store_kv_pair(kv, m, size_t(kv.cell[m]), r + lane, val, other, which == 1);
    }
}

// The small-batch GEMM: KS warps per weight row (mm_warps / KS rows per
// block); the lanes of the row's warps split K in chunks of 8, dequantize
// each chunk once and use it for all MT tokens of this block's column of
// the batch, then reduce across the warp and (KS > 1, split-K) across the
// row's warps. A folded RMS norm: the block's warps take each token's
// 1 / rms first (sums in the loop would cost registers the tile needs).
template <int T, int MT, bool SWIGLU, int KS>
__global__ void __launch_bounds__(mm_warps * warp_size) mm_small_kernel(const mm_params p) {
    static_assert(mm_warps % KS == 0, "the warps of a block split into whole rows");
    constexpr int rows_per_block = mm_warps / KS;
    const int warp = threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    const int ks = warp % KS;
    const int m0 = blockIdx.y * MT;
    int r = blockIdx.x * rows_per_block + warp / KS;
    const uint8_t * w;
    float * y;
    int rows, which;
    mm_select<SWIGLU>(p, r, w, y, rows, which);
    const bool valid = r < rows;
    const uint8_t * wr = w + size_t(r) * p.w_row_bytes;
    const uint8_t * wu = SWIGLU ? p.w[1] + size_t(r) * p.w_row_bytes : nullptr;

    __shared__ float inv_rms[MT];
    if (p.norm_w) {
        for (int m = warp; m < MT; m += mm_warps) {
            double sq = 0.0;
            if (m0 + m < p.M) {
                const float * xr = p.x + size_t(m0 + m) * p.ldx;
                for (int k = lane; k < p.K; k += warp_size) sq += double(xr[k]) * double(xr[k]);
            }
            sq = warp_sum_f64(sq);
            if (lane == 0) inv_rms[m] = rms_scale(sq, p.K, p.eps);
        }
        __syncthreads();
    }
    if (KS == 1 && !valid) return;

    float acc[MT], acc_u[SWIGLU ? MT : 1];
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[m] = 0.0f;
#pragma unroll
    for (int m = 0; m < (SWIGLU ? MT : 1); ++m) acc_u[m] = 0.0f;
    const int n_ch = valid ? p.K / 8 : 0, stride = KS * warp_size;
    for (int ch = ks * warp_size + lane; ch < n_ch; ch += stride) {
        float v[8], vu[8];
        int e0, e1;
        load_chunk<T>(wr, ch, v, e0, e1);
        if constexpr (SWIGLU) load_chunk<T>(wu, ch, vu, e0, e1);
        float4 na = make_float4(1, 1, 1, 1), nb = na;
        if (p.norm_w) {
            na = *reinterpret_cast<const float4 *>(p.norm_w + e0);
            nb = *reinterpret_cast<const float4 *>(p.norm_w + e1);
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if (m0 + m < p.M) {
                const float * xr = p.x + size_t(m0 + m) * p.ldx;
                float4 a = *reinterpret_cast<const float4 *>(xr + e0);
                float4 b = *reinterpret_cast<const float4 *>(xr + e1);
                if (p.norm_w) {
                    const float sc = inv_rms[m];
                    a = make_float4((a.x * sc) * na.x, (a.y * sc) * na.y, (a.z * sc) * na.z,
                                    (a.w * sc) * na.w);
                    b = make_float4((b.x * sc) * nb.x, (b.y * sc) * nb.y, (b.z * sc) * nb.z,
                                    (b.w * sc) * nb.w);
                }
                acc[m] += dot8(v, a, b);
                if constexpr (SWIGLU) acc_u[m] += dot8(vu, a, b);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        acc[m] = warp_sum(acc[m]);
        if constexpr (SWIGLU) acc_u[m] = warp_sum(acc_u[m]);
    }
    if constexpr (KS > 1) {
        // The row's first warp adds the others' sums, always in one order.
        __shared__ float part[mm_warps][SWIGLU ? 2 * MT : MT];
        if (lane == 0) {
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                part[warp][m] = acc[m];
                if constexpr (SWIGLU) part[warp][MT + m] = acc_u[m];
            }
        }
        __syncthreads();
        if (ks != 0 || !valid) return;
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            for (int j = 1; j < KS; ++j) {
                acc[m] += part[warp + j][m];
                if constexpr (SWIGLU) acc_u[m] += part[warp + j][MT + m];
            }
        }
    }
    if (lane == 0) {
        const size_t ldy = size_t(rows);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if (m0 + m < p.M) {
                float val = acc[m];
                if constexpr (SWIGLU) val = silu_mul(val, acc_u[m]);
                if (p.res) val = p.res[size_t(m0 + m) * p.ldr + r] + val;
                y[size_t(m0 + m) * ldy + r] = val;
            }
        }
    }
}

// Any K and alignment: one warp per (row, token), element by element. Only
// float weights whose K is not a multiple of 8 come here.
__global__ void mm_scalar_kernel(int type, const uint8_t * w, size_t w_row_bytes, int K, int N,
                                 const float * x, size_t ldx, float * y, int M) {
    const int warp = threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    const int r = blockIdx.x * mm_warps + warp, m = blockIdx.y;
    if (r >= N || m >= M) return;
    const uint8_t * wr = w + size_t(r) * w_row_bytes;
    const float * xr = x + size_t(m) * ldx;
    float acc = 0.0f;
    for (int k = lane; k < K; k += warp_size) acc += row_elem(type, wr, k) * xr[k];
    acc = warp_sum(acc);
    if (lane == 0) y[size_t(m) * N + r] = acc;
}

// --- matmul: large batches through cuBLAS ---------------------------------------

#if defined(SMOL_HAVE_BLAS)
template <int T>
__global__ void dequant_f16_kernel(const uint8_t * w, size_t w_row_bytes, int K, int N,
                                   __half * dst) {
    const int n_ch = K / 8;
    const size_t total = size_t(N) * n_ch;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
         i += size_t(gridDim.x) * blockDim.x) {
        const size_t r = i / n_ch;
        const int ch = int(i % n_ch);
        float v[8];
        int e0, e1;
        load_chunk<T>(w + r * w_row_bytes, ch, v, e0, e1);
        // Two runs of four, each one 8-byte store (K is a multiple of 8).
        uint16_t * d = reinterpret_cast<uint16_t *>(dst + r * K);
        store4(d + e0, v[0], v[1], v[2], v[3]);
        store4(d + e1, v[4], v[5], v[6], v[7]);
    }
}

// Rows of x (K a multiple of 4, rows 16-byte aligned) as f16 or bf16_hl
// pairs, four at a time.
template <typename Out>
__global__ void blas_input_kernel(const float * x, size_t ldx, int K, int M, Out * dst) {
    const int k4 = K / 4;
    const size_t total = size_t(M) * k4, ld = std::is_same_v<Out, bf16_hl> ? 2 * size_t(K) : K;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
         i += size_t(gridDim.x) * blockDim.x) {
        const size_t r = i / k4;
        const int c = int(i % k4);
        const float4 v = *reinterpret_cast<const float4 *>(x + r * ldx + 4 * c);
        store4_at(dst + r * ld, 4 * c, K, v.x, v.y, v.z, v.w);
    }
}

// The results of up to three bf16_hl GEMMs of a step: y[m] (ldy apart) =
// W hi + W lo, columns 2m and 2m + 1 of y2 (N apart); block row j sums the
// j-th GEMM's.
struct pair_sums {
    const float * y2[3];
    float * y[3];
    int N[3];
    size_t ldy[3];
    int M;
};
__global__ void blas_pair_sum_kernel(const pair_sums p) {
    const int j = blockIdx.y, N = p.N[j];
    const float * y2 = p.y2[j];
    float * y = p.y[j];
    const size_t ldy = p.ldy[j];
    // Block z takes tokens [8 z, 8 z + 8); a thread four columns (or one
    // where rows are not 16-byte aligned) of each.
    const int m0 = int(blockIdx.z) * 8, m1 = min(p.M, m0 + 8);
    const bool vec = N % 4 == 0 && ldy % 4 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
    const int items = vec ? N / 4 : N;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < items; i += gridDim.x * blockDim.x) {
        for (int m = m0; m < m1; ++m) {
            const float * hi = y2 + 2 * size_t(m) * size_t(N);
            const float * lo = hi + N;
            if (vec) {
                const float4 a = reinterpret_cast<const float4 *>(hi)[i];
                const float4 b = reinterpret_cast<const float4 *>(lo)[i];
                reinterpret_cast<float4 *>(y + size_t(m) * ldy)[i] = add4(a, b);
            } else {
                y[size_t(m) * ldy + i] = hi[i] + lo[i];
            }
        }
    }
}
#endif

// --- attention ------------------------------------------------------------------

// What the flash kernel needs of a tile of 64 cells of the cache table to
// sort it without reading its cells: the least and greatest position of its
// cells in use, the union and the intersection of their sequences, and how
// many are in use. The host keeps it with the table (stage).
struct cell_tile {
    seq_mask seq_or, seq_and;
    int32_t min_pos, max_pos, n_used, pad;
};
constexpr int cell_tile_cells = kv_page; // a tile is a page of the cache

// Whether no query of the sequences `seqs` at positions up to max_pos can
// see a cell of the tile (so an attention kernel skips it unread).
__device__ __forceinline__ bool tile_unseen(const cell_tile & t, seq_mask seqs, int max_pos) {
    return t.n_used == 0 || t.min_pos > max_pos || !(t.seq_or & seqs);
}

struct attn_params {
    const float * q;
    size_t ldq;
    size_t q_lo = 0; // nonzero: q's element e is q[e] + q[q_lo + e] (kept_)
    float * out;
    size_t ldo;
    const uint16_t * K; // the view's first kv head
    const uint16_t * V;
    size_t head_stride;
    int hd, n_head, group, n_tok;
    int h0; // the view's first kv head; block y serves query head h0 * group + y
    float scale;
    const int32_t * pos; // per token
    const int32_t * seq;
    const int32_t * cell;     // per token: the cell its k and v went to in this step
    const int32_t * cell_pos; // per cell, [0, n_used)
    // Per cell, the sequences that hold it: two planes of words, the cells'
    // sequences 0-63, then (seq_plane words on) their sequences 64-127.
    const uint64_t * cell_seqs;
    size_t seq_plane;
    const int32_t * n_used;  // device scalar: graphs replayed later read the new value
    const cell_tile * tiles; // per 64 cells
    int n_kv;                // kv heads of the view
    int Q, W, S;             // queries per block, cell streams per query, splits over cells
    float * part;            // S > 1: [token][head][split] of (max, sum, acc[hd])
    int * done;              // S > 1: splits finished per (token, head); left at zero
    rope_params rope;        // non-null pos: rotate q as it is loaded
};

// Cell c's sequences, and the plane of words that holds sequence seq's bit.
__device__ __forceinline__ seq_mask cell_mask(const attn_params & p, int c) {
    return {{p.cell_seqs[c], p.cell_seqs[p.seq_plane + c]}};
}
__device__ __forceinline__ const uint64_t * seq_words(const attn_params & p, int seq) {
    return p.cell_seqs + size_t(seq >> 6) * p.seq_plane;
}

// Elements 2j and 2j + 1 of query head h of token tok (hd apart per head),
// turned by the rope when the kernel applies it; zeros past the batch.
__device__ __forceinline__ void load_query_pair(const attn_params & p, int tok, int h, int hd,
                                                int j, float & x0, float & x1) {
    x0 = x1 = 0.0f;
    if (tok >= p.n_tok) return;
    const float * src = p.q + tok * p.ldq + h * hd;
    x0 = src[2 * j];
    x1 = src[2 * j + 1];
    if (p.q_lo) x0 += src[p.q_lo + 2 * j], x1 += src[p.q_lo + 2 * j + 1];
    if (p.rope.pos) {
        float c, sn;
        rope_get(p.rope, tok, j, c, sn);
        rope_pair(x0, x1, c, sn);
    }
}

// Whether this block is the last of n_split to count itself on *done, which
// it then leaves at zero for the next launch or replay: each block's writes
// are visible before it counts, so the last one sees every split's partial.
// Every thread of the block calls it.
__device__ bool last_split_block(int * done, int n_split) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(done, 1) == n_split - 1;
    __syncthreads();
    const bool is_last = last;
    if (is_last) {
        __threadfence();
        if (threadIdx.x == 0) *done = 0;
    }
    return is_last;
}

// The merge of S <= 32 PER_LANE split partials laid out `stride` floats
// apart, each (max, sum, accumulators...): a warp reads every split's (max,
// sum) at once (PER_LANE a lane), leaves split i's weight in w[i] and returns
// the sum of the weighted sums. Maxima are in natural-log units, or log2
// units with LOG2; a split that saw nothing has max -inf and weighs zero.
// Other blocks wrote the partials during this launch, so they are read from
// L2, or with SHARED from shared memory, where the caller copied them.
template <bool LOG2, int PER_LANE = 2, bool SHARED = false>
__device__ float split_weights(const float * part, int S, int stride, float * w) {
    const int lane = threadIdx.x % warp_size;
    auto load = [&](const float * x) { return SHARED ? *x : SMOL_LOAD_L2(x); };
    float mi[PER_LANE], li[PER_LANE];
#pragma unroll
    for (int k = 0; k < PER_LANE; ++k) {
        const int i = lane + warp_size * k;
        mi[k] = i < S ? load(part + i * stride) : -INFINITY;
        li[k] = i < S ? load(part + i * stride + 1) : 0.0f;
    }
    float mx = mi[0];
#pragma unroll
    for (int k = 1; k < PER_LANE; ++k) mx = fmaxf(mx, mi[k]);
    mx = warp_max(mx);
    float L = 0.0f;
#pragma unroll
    for (int k = 0; k < PER_LANE; ++k) {
        const float d = mi[k] - mx;
        const float f = mi[k] == -INFINITY ? 0.0f : LOG2 ? exp2f(d) : expf(d);
        L += li[k] * f;
        if (lane + warp_size * k < S) w[lane + warp_size * k] = f;
    }
    return warp_sum(L);
}

// Block (query group, head, split). Warp w serves query w % Q and walks the
// split's cells in tiles of 32 (tile t goes to stream w / Q): each lane
// scores one cell, the warp keeps an online softmax, then accumulates V with
// each lane owning NPL consecutive elements of the head. Streams of one
// query are merged through shared memory. With S splits (decode, Q = 1),
// each block leaves a partial result and the last one to finish merges them.
template <int NPL> __global__ void attention_kernel(const attn_params p) {
    extern __shared__ float sm[];
    const int hd = p.hd, half = hd / 2;
    float * qs = sm;            // [Q][hd]
    float * st = sm + p.Q * hd; // [warps][hd + 2]
    const int warp = threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    const int h = p.h0 * p.group + blockIdx.y, s = blockIdx.z, tok0 = blockIdx.x * p.Q;

    for (int e = threadIdx.x; e < p.Q * half; e += blockDim.x) {
        const int qi = e / half, j = e % half;
        float x0, x1;
        load_query_pair(p, tok0 + qi, h, hd, j, x0, x1);
        // The query meets the f16 cache as f16, as on the CPU.
        qs[qi * hd + 2 * j] = f16_to_f32(f32_to_f16(x0));
        qs[qi * hd + 2 * j + 1] = f16_to_f32(f32_to_f16(x1));
    }
    __syncthreads();

    const int qi = warp % p.Q, ws = warp / p.Q, tok = tok0 + qi;
    const bool active = tok < p.n_tok;
    const int n_used = *p.n_used;
    // At least one tile per stream in a split: a short history in few splits.
    const int chunk = max(((n_used + p.S - 1) / p.S + 31) & ~31, 32 * p.W);
    const int c_begin = s * chunk, c_end = min(n_used, c_begin + chunk);
    const int hk = h / p.group - p.h0;
    const uint16_t * K = p.K + hk * p.head_stride;
    const uint16_t * V = p.V + hk * p.head_stride;
    const int my_pos = active ? p.pos[tok] : -1, my_seq = active ? p.seq[tok] : -1;
    const float * q = qs + qi * hd;
    const bool vec16 = hd % 8 == 0;
    const int e_base = lane * NPL;
    const bool lane_full = e_base + NPL <= hd;

    float m = -INFINITY, l = 0.0f, acc[NPL];
#pragma unroll
    for (int e = 0; e < NPL; ++e) acc[e] = 0.0f;

    if (active) {
        for (int base = c_begin + ws * 32; base < c_end; base += p.W * 32) {
            const int c = base + lane;
            bool vis = false;
            if (c < c_end) {
                vis = kv_cell_visible(p.cell_pos[c], cell_mask(p, c), my_seq, my_pos);
            }
            float sc = -INFINITY;
            if (vis) {
                const uint16_t * kr = K + size_t(c) * hd;
                float d = 0.0f;
                if (vec16) {
                    for (int j = 0; j < hd; j += 8) {
                        const uint4 u = *reinterpret_cast<const uint4 *>(kr + j);
                        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            d += f16_to_f32(uint16_t(w[i] & 0xffff)) * q[j + 2 * i] +
                                 f16_to_f32(uint16_t(w[i] >> 16)) * q[j + 2 * i + 1];
                        }
                    }
                } else {
                    for (int j = 0; j < hd; ++j) d += f16_to_f32(kr[j]) * q[j];
                }
                sc = d * p.scale;
            }
            const float tmax = warp_max(sc);
            if (tmax == -INFINITY) continue; // nothing visible in this tile
            const float m_new = fmaxf(m, tmax);
            const float corr = expf(m - m_new);
            const float pr = vis ? expf(sc - m_new) : 0.0f;
            l = l * corr + warp_sum(pr);
#pragma unroll
            for (int e = 0; e < NPL; ++e) acc[e] *= corr;
            const uint16_t * vr = V + size_t(base) * hd + e_base;
            auto add_row = [&](int j) {
                const float pj = SMOL_SHFL(pr, j);
                float v[NPL];
                if (lane_full) {
                    if constexpr (NPL % 2 == 0) {
#pragma unroll
                        for (int e = 0; e < NPL; e += 2) {
                            const uint32_t w =
                                *reinterpret_cast<const uint32_t *>(vr + size_t(j) * hd + e);
                            v[e] = f16_to_f32(uint16_t(w & 0xffff));
                            v[e + 1] = f16_to_f32(uint16_t(w >> 16));
                        }
                    } else {
#pragma unroll
                        for (int e = 0; e < NPL; ++e) v[e] = f16_to_f32(vr[size_t(j) * hd + e]);
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < NPL; ++e) {
                        v[e] = e_base + e < hd ? f16_to_f32(vr[size_t(j) * hd + e]) : 0.0f;
                    }
                }
#pragma unroll
                for (int e = 0; e < NPL; ++e) acc[e] = pj != 0.0f ? acc[e] + pj * v[e] : acc[e];
            };
            // No branch on the weight, so the loads of several rows of V are
            // in flight at once; a zero weight adds nothing (and skips the
            // row's value, as the CPU does, should it not be finite).
            const int n_c = min(32, c_end - base);
            if (n_c == 32) {
#pragma unroll 8
                for (int j = 0; j < 32; ++j) add_row(j);
            } else {
                for (int j = 0; j < n_c; ++j) add_row(j);
            }
            m = m_new;
        }
    }

    // Merge the W streams of each query; warp qi (stream 0) keeps the result.
    bool holder = active;
    if (p.W > 1) {
        float * mine = st + warp * (hd + 2);
        if (lane == 0) {
            mine[0] = m;
            mine[1] = l;
        }
#pragma unroll
        for (int e = 0; e < NPL; ++e) {
            if (e_base + e < hd) mine[2 + e_base + e] = acc[e];
        }
        __syncthreads();
        if (ws == 0) {
            float mx = -INFINITY;
            for (int w = 0; w < p.W; ++w) mx = fmaxf(mx, st[(qi + w * p.Q) * (hd + 2)]);
            float L = 0.0f;
#pragma unroll
            for (int e = 0; e < NPL; ++e) acc[e] = 0.0f;
            if (mx != -INFINITY) {
                for (int w = 0; w < p.W; ++w) {
                    const float * o = st + (qi + w * p.Q) * (hd + 2);
                    if (o[0] == -INFINITY) continue;
                    const float f = expf(o[0] - mx);
                    L += o[1] * f;
#pragma unroll
                    for (int e = 0; e < NPL; ++e) {
                        if (e_base + e < hd) acc[e] += o[2 + e_base + e] * f;
                    }
                }
            }
            m = mx;
            l = L;
        } else {
            holder = false;
        }
    }
    if (p.S == 1) {
        if (!holder) return;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        float * o = p.out + tok * p.ldo + h * hd;
#pragma unroll
        for (int e = 0; e < NPL; ++e) {
            if (e_base + e < hd) o[e_base + e] = acc[e] * inv;
        }
        return;
    }

    // S > 1 (and Q = 1): leave this split's partial result; the block that
    // finishes last for this (token, head) merges all of them, so no second
    // launch is needed (the counter is reset for the next launch or replay).
    const size_t th = size_t(tok0) * p.n_head + h;
    float * part = p.part + th * p.S * (hd + 2);
    if (holder) {
        float * o = part + s * (hd + 2);
        if (lane == 0) {
            o[0] = m;
            o[1] = l;
        }
#pragma unroll
        for (int e = 0; e < NPL; ++e) {
            if (e_base + e < hd) o[2 + e_base + e] = acc[e];
        }
    }
    if (!last_split_block(p.done + th, p.S)) return;
    // Warp 0 reads every split's (max, sum) at once (S <= 64: two a lane)
    // and leaves each split's weight in shared memory; then all threads sum
    // the accumulators, their loads independent of each other. The partials
    // were written by other blocks, so they are read from L2.
    float * weight = st; // S floats; st holds at least 4 * (hd + 2)
    __shared__ float inv_sum;
    if (warp == 0) {
        const float L = split_weights<false>(part, p.S, hd + 2, weight);
        if (lane == 0) inv_sum = L > 0.0f ? 1.0f / L : 0.0f;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float a = 0.0f;
        for (int i = 0; i < p.S; ++i) {
            const float f = weight[i];
            if (f != 0.0f) a += SMOL_LOAD_L2(part + i * (hd + 2) + 2 + e) * f;
        }
        p.out[tok0 * p.ldo + h * hd + e] = a * inv_sum;
    }
}

// --- attention: tensor-core prefill ---------------------------------------------

constexpr float log2_e = 1.4426950408889634f; // scores in log2 units let exp2f serve as exp
constexpr int fa_rows = 64; // queries a block: four warps of 16 (the work space sizes it too)

// The decode attention kernel's shape (the kernel is below, with the flash one).
constexpr int dec_warps = 8;  // warps a block, each a stream of its own tiles
constexpr int dec_cells = 32; // cells a warp's tile: each lane scores one
// Tiles a warp holds in shared memory, one in flight while it computes the
// other: 134 KiB a block, one block of eight warps an SM, two a scheduler,
// so one warp's arithmetic hides behind another's. On the H200, against four
// warps of four tiles: 1.7B f16 at 32K 1.17x, 135M f16 at 128K 1.13x, 1.7B
// tg128 0.96x; eight warps of three tiles ran no faster (BENCHMARKS.md).
constexpr int dec_stages = 2;
constexpr int dec_split_cells = 256; // the fewest cells a split takes
constexpr int dec_max_splits = 128;  // splits over the cells, at most
constexpr int dec_max_heads = 4;     // query heads a block serves, all of one kv head
constexpr int dec_list = 512;        // warp tiles a block lists at once when it walks pages
// Batches of up to this many tokens may take the decode kernel (a prompt's
// chunk takes the flash kernel, which reads each cell once for all tokens),
// as may a batch of any size whose tokens are of different sequences.
constexpr int dec_max_tok = 32;

// A block's shared memory: per warp dec_stages tiles of K, V and their
// cells' positions and sequences.
template <int HD> __host__ __device__ constexpr size_t dec_tile_bytes() {
    return dec_cells * (2 * HD * sizeof(uint16_t) + sizeof(int32_t) + sizeof(uint64_t));
}
template <int HD> __host__ __device__ constexpr size_t dec_smem() {
    return size_t(dec_warps) * dec_stages * dec_tile_bytes<HD>();
}

// The decode blocks a kv head's group of query heads takes (a group of up
// to four in one block, a larger one in the fewest blocks of at most four),
// and the query heads each serves (GB).
__host__ __device__ constexpr int decode_subs(int group) {
    return (group + dec_max_heads - 1) / dec_max_heads;
}
__host__ __device__ constexpr int decode_heads(int group) {
    return (group + decode_subs(group) - 1) / decode_subs(group);
}

#if !defined(SMOL_HIP)
// The mma.sync and ldmatrix instructions below are NVIDIA's (sm_80 and up);
// the HIP build keeps the kernel above for every batch.
#define SMOL_FLASH_ATTENTION 1

constexpr int fa_cells = 64;        // cells a tile
constexpr int fa_split_cells = 256; // the fewest cells a split of decode takes
// From this many tokens a batch takes the flash kernel: every batch. For
// decode it measured 1.09-1.46x the classic kernel's speed on the H200
// (BENCHMARKS.md), offloaded head groups included.
constexpr int fa_min_tok = 1;

// D += A B for one 16x16 (row) by 16x8 (column) product of f16 with f32
// accumulators, the fragments in the layout the PTX ISA gives for m16n8k16.
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 f16 matrices from shared memory: lanes 8i..8i+7 give the rows of
// matrix i; register i of lane l gets row l / 4, columns 2 (l % 4) and
// 2 (l % 4) + 1 of matrix i (the B fragment of a column-major operand), or
// with Trans column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1 (the B fragment
// of a row-major operand).
template <bool Trans = false>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t * row) {
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
    if constexpr (Trans) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr)
                     : "memory");
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr)
                     : "memory");
    }
}

// The transpose of an 8x8 f16 matrix held as a fragment (lane l: row l / 4,
// columns 2 (l % 4) and 2 (l % 4) + 1), in the same layout: a matrix of
// products turned into the B fragment of a product by its transpose.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
    uint32_t y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

// 16 bytes from global to shared memory without a register, in the group
// the next commit closes: the first `bytes` (0 to 16) read from gmem, the
// rest zeros (gmem must be a valid address even when nothing is read);
// wait<N> returns once at most N groups are in flight.
__device__ __forceinline__ void cp_async16(void * smem, const void * gmem, int bytes = 16) {
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(gmem),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ uint32_t ld_u32(const uint16_t * p) {
    return *reinterpret_cast<const uint32_t *>(p);
}

// 2^x in one instruction (the special function unit's, as exp2f uses, without
// exp2f's care for results below 2^-126, which a softmax weight may lose).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Block (tile of 64 queries, head); warp w owns queries 16w..16w+15 of the
// tile. The block walks the cells [0, n_used) in tiles of 64 and sorts each
// tile by the block's bounds (the least position of its queries and the set
// of their sequences): a tile that every query sees whole is computed with no
// masks; one that no query can see is skipped (causal prefill skips about
// half, other sequences' cells are skipped too); the rest are masked per
// (query, cell). The tile's K and V come in with 16-byte loads, and each warp
// computes S = Q K^T with tensor cores, keeps an online softmax in f32, and
// adds P V with P rounded to f16. The query is rounded to f16 as on the CPU;
// unlike the CPU, P is rounded before it is normalised (see the test's
// bound). A masked score weighs exactly zero, so a tile gives the same bits
// masked or not when every query sees all of it.
//
// Fragment layouts (m16n8k16, g = lane / 4, t = lane % 4): A holds rows g
// and g + 8, columns 2t, 2t + 1 (+ 8); B holds rows 2t, 2t + 1 (+ 8) of
// column g; C holds rows g and g + 8, columns 2t and 2t + 1.
template <int HD>
__global__ void __launch_bounds__(128, 4) flash_attention_kernel(const attn_params p) {
    static_assert(HD % 16 == 0, "head size a multiple of 16");
    constexpr int LD = HD + 8; // f16 a row in shared memory: 16-byte rows, no bank conflicts
    constexpr int half = HD / 2, n_dt = HD / 8;
    __shared__ __align__(16) uint16_t qs[fa_rows * LD];
    // K and V of a tile in two buffers: the next tile's copies are issued
    // before this one is computed, so they arrive while it is.
    __shared__ __align__(16) uint16_t ks[2][fa_cells * LD];
    __shared__ __align__(16) uint16_t vs[2][fa_cells * LD];
    __shared__ int c_pos[fa_cells], c_seen[fa_cells];
    __shared__ seq_mask c_seq[fa_cells];
    __shared__ int b_min_pos, b_max_pos;
    __shared__ unsigned long long b_seqs[2]; // the words of a seq_mask

    griddep_wait();
    griddep_launch();
    // With S splits, block z takes the z-th run of whole tiles of the cells,
    // a run of at least fa_split_cells: at short contexts fewer splits do
    // the work (one below that many cells), and the blocks past them leave.
    const int n_used = *p.n_used;
    const int chunk =
        p.S == 1
            ? n_used
            : max(fa_split_cells, ((n_used + p.S - 1) / p.S + fa_cells - 1) / fa_cells * fa_cells);
    const int n_split = p.S == 1 ? 1 : max(1, (n_used + chunk - 1) / chunk);
    if (int(blockIdx.z) >= n_split) return;
    const int warp = threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    const int g = lane / 4, t = lane % 4;
    // Block y serves query head h0 * group + y of the view's kv heads.
    const int h = p.h0 * p.group + int(blockIdx.y), hk = h / p.group - p.h0;
    // The last tokens of a causal prompt see the most cells: their tiles start first.
    const int tok0 = int(gridDim.x - 1 - blockIdx.x) * fa_rows;

    if (threadIdx.x == 0) {
        b_min_pos = INT_MAX;
        b_max_pos = -1;
        b_seqs[0] = b_seqs[1] = 0;
    }
    for (int e = threadIdx.x; e < fa_rows * half; e += blockDim.x) {
        const int qi = e / half, j = e % half;
        float x0, x1;
        load_query_pair(p, tok0 + qi, h, HD, j, x0, x1);
        // The query meets the f16 cache as f16, as on the CPU.
        *reinterpret_cast<uint32_t *>(qs + qi * LD + 2 * j) = pack_f16x2(x0, x1);
    }
    // This thread's two query rows; a row past the batch sees no cell.
    const int row0 = tok0 + warp * 16 + g, row1 = row0 + 8;
    const int pos0 = row0 < p.n_tok ? p.pos[row0] : -1, seq0 = row0 < p.n_tok ? p.seq[row0] : -1;
    const int pos1 = row1 < p.n_tok ? p.pos[row1] : -1, seq1 = row1 < p.n_tok ? p.seq[row1] : -1;
    // A warp whose rows are all past the batch only helps to load.
    const bool warp_rows = tok0 + warp * 16 < p.n_tok;
    __syncthreads();
    if (threadIdx.x < fa_rows && tok0 + int(threadIdx.x) < p.n_tok) {
        atomicMin(&b_min_pos, p.pos[tok0 + threadIdx.x]);
        atomicMax(&b_max_pos, p.pos[tok0 + threadIdx.x]);
        const int s = p.seq[tok0 + threadIdx.x];
        atomicOr(&b_seqs[s >> 6], 1ull << (s & 63));
    }

    uint32_t qa[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
        const uint16_t * q0 = qs + (warp * 16 + g) * LD + kk * 16 + 2 * t;
        qa[kk][0] = ld_u32(q0);
        qa[kk][1] = ld_u32(q0 + 8 * LD);
        qa[kk][2] = ld_u32(q0 + 8);
        qa[kk][3] = ld_u32(q0 + 8 * LD + 8);
    }
    __syncthreads();
    const int min_pos = b_min_pos, max_pos = b_max_pos;
    const seq_mask seqs{{b_seqs[0], b_seqs[1]}};

    // Scores in log2 units, so exp2 serves as the exponential.
    const float scale = p.scale * log2_e;
    float m0 = -INFINITY, m1 = -INFINITY; // running maxima of rows g and g + 8
    float l0 = 0.0f, l1 = 0.0f;           // this thread's part of their sums
    float o[n_dt][4];
#pragma unroll
    for (int n = 0; n < n_dt; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    // One tile of cells from shared memory; MASKED tiles keep the cells of
    // bit 4j + i (row g sees cell 8j + 2t + i) and bit 4j + 2 + i (row g + 8).
    auto tile = [&](auto masked_tag, uint32_t vis, const uint16_t * ks, const uint16_t * vs) {
        constexpr bool MASKED = decltype(masked_tag)::value;
        auto seen = [&](int bit) { return !MASKED || ((vis >> bit) & 1u) != 0; };
        float s[fa_cells / 8][4];
#pragma unroll
        for (int j = 0; j < fa_cells / 8; ++j) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        }
        // B fragments of K for two cell tiles at once: lanes 0-7 give cells
        // 16j2..+7 at columns 16kk, lanes 8-15 the same cells at 16kk + 8,
        // lanes 16-31 cells 16j2+8..+15 there. k-steps outermost, so the
        // eight accumulators of a step are independent of each other.
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
            for (int j2 = 0; j2 < fa_cells / 16; ++j2) {
                uint32_t b[4];
                ldmatrix_x4(b, ks + (16 * j2 + 8 * (lane / 16) + lane % 8) * LD + kk * 16 +
                                   8 * (lane / 8 % 2));
                mma_f16_16816(s[2 * j2], qa[kk], b[0], b[1]);
                mma_f16_16816(s[2 * j2 + 1], qa[kk], b[2], b[3]);
            }
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < fa_cells / 8; ++j) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                if (!seen(4 * j + i)) s[j][i] = -INFINITY;
            }
            mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
            mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
        }
        // The four lanes of a quad hold one row between them.
        mx0 = fmaxf(mx0, SMOL_SHFL_XOR(mx0, 1));
        mx0 = fmaxf(mx0, SMOL_SHFL_XOR(mx0, 2));
        mx1 = fmaxf(mx1, SMOL_SHFL_XOR(mx1, 1));
        mx1 = fmaxf(mx1, SMOL_SHFL_XOR(mx1, 2));
        // The maxima in log2 units (the scale is positive, so the same
        // scores are largest), and each weight exp2(s * scale - max) from
        // one fused multiply-add.
        const float mn0 = fmaxf(m0, mx0 * scale), mn1 = fmaxf(m1, mx1 * scale);
        // A row that saw nothing yet has nothing to rescale (and -inf - -inf
        // would be NaN).
        const float corr0 = m0 == -INFINITY ? 0.0f : fast_exp2(m0 - mn0);
        const float corr1 = m1 == -INFINITY ? 0.0f : fast_exp2(m1 - mn1);
        m0 = mn0;
        m1 = mn1;
        l0 *= corr0;
        l1 *= corr1;
#pragma unroll
        for (int n = 0; n < n_dt; ++n) {
            o[n][0] *= corr0;
            o[n][1] *= corr0;
            o[n][2] *= corr1;
            o[n][3] *= corr1;
        }
        // P as the A fragments of P V: cells 16kk..16kk+15 are the score
        // tiles 2kk and 2kk + 1. A masked score weighs exactly zero.
        uint32_t pa[fa_cells / 16][4];
#pragma unroll
        for (int j = 0; j < fa_cells / 8; ++j) {
            float pr[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                pr[i] =
                    seen(4 * j + i) ? fast_exp2(fmaf(s[j][i], scale, -(i < 2 ? mn0 : mn1))) : 0.0f;
            }
            l0 += pr[0] + pr[1];
            l1 += pr[2] + pr[3];
            pa[j / 2][(j % 2) * 2 + 0] = pack_f16x2(pr[0], pr[1]);
            pa[j / 2][(j % 2) * 2 + 1] = pack_f16x2(pr[2], pr[3]);
        }
        // B fragments of V for two column tiles at once: lanes 0-7 give rows
        // 16kk..+7 at columns 16n2, lanes 8-15 rows 16kk+8..+15 there, lanes
        // 16-31 the same rows at columns 16n2 + 8.
        const int mi = lane / 8, mr = lane % 8;
#pragma unroll
        for (int kk = 0; kk < fa_cells / 16; ++kk) {
#pragma unroll
            for (int n2 = 0; n2 < HD / 16; ++n2) {
                uint32_t b[4];
                ldmatrix_x4<true>(b, vs + (kk * 16 + mr + 8 * (mi & 1)) * LD + n2 * 16 +
                                         8 * (mi >> 1));
                mma_f16_16816(o[2 * n2], pa[kk], b[0], b[1]);
                mma_f16_16816(o[2 * n2 + 1], pa[kk], b[2], b[3]);
            }
        }
    };

    const int c_begin = int(blockIdx.z) * chunk, c_end = min(n_used, c_begin + chunk);
    const uint16_t * K = p.K + hk * p.head_stride;
    const uint16_t * V = p.V + hk * p.head_stride;
    // Each thread copies the same 16-byte pieces of every tile, so its own
    // waits order its copies and its stores.
    auto issue = [&](int c, int b) {
        for (int e = threadIdx.x; e < fa_cells * (HD / 8); e += blockDim.x) {
            const int r = e / (HD / 8), ch = e % (HD / 8);
            if (c + r >= c_end) continue;
            const size_t at = size_t(c + r) * HD + ch * 8;
            cp_async16(ks[b] + r * LD + ch * 8, K + at);
            cp_async16(vs[b] + r * LD + ch * 8, V + at);
        }
        cp_async_commit();
    };
    // The cells go by windows of up to 128 tiles: a thread a tile sorts them
    // from the table's tile summaries, then the block walks the tiles that
    // some query may see, the next one's copies in flight while it computes
    // one, with a single barrier for a tile every query sees whole.
    static_assert(fa_cells == cell_tile_cells, "a flash tile is a tile of the cell table");
    constexpr int window = 128;
    __shared__ uint8_t cls[window];
    enum : uint8_t { skip_tile, whole_tile, masked_tile };
    int k = 0; // tiles computed: tile k is in buffers k & 1
    for (int w0 = c_begin; w0 < c_end; w0 += window * fa_cells) {
        const int n_t = min(window, (c_end - w0 + fa_cells - 1) / fa_cells);
        __syncthreads(); // the last window's classes are read
        if (int(threadIdx.x) < n_t) {
            const int c0 = w0 + int(threadIdx.x) * fa_cells;
            const cell_tile ti = p.tiles[c0 / fa_cells];
            uint8_t kind = masked_tile;
            if (tile_unseen(ti, seqs, max_pos)) {
                kind = skip_tile; // no query sees a cell of it
            } else if (c0 + fa_cells <= c_end && ti.n_used == fa_cells && ti.max_pos <= min_pos &&
                       (ti.seq_and & seqs) == seqs) {
                kind = whole_tile;
            }
            cls[threadIdx.x] = kind;
        }
        __syncthreads();
        auto next_tile = [&](int i) {
            for (++i; i < n_t && cls[i] == skip_tile;) ++i;
            return i;
        };
        int i = next_tile(-1);
        if (i < n_t) issue(w0 + i * fa_cells, k & 1);
        for (; i < n_t; ++k) {
            const int c0 = w0 + i * fa_cells, b = k & 1;
            const bool whole = cls[i] == whole_tile;
            i = next_tile(i);
            cp_async_wait<0>();
            // Every copy of this tile landed, and every warp is done with the
            // last tile, whose buffers the next copies fill.
            __syncthreads();
            if (i < n_t) issue(w0 + i * fa_cells, b ^ 1);
            if (whole) {
                if (warp_rows) tile(std::false_type{}, ~0u, ks[b], vs[b]);
                continue;
            }
            // A tile some queries see in part: masks per (query, cell).
            if (threadIdx.x < fa_cells) {
                const int c = c0 + int(threadIdx.x);
                c_pos[threadIdx.x] = c < c_end ? p.cell_pos[c] : -1;
                c_seq[threadIdx.x] = c < c_end ? cell_mask(p, c) : seq_mask::none();
                c_seen[threadIdx.x] = 0;
            }
            __syncthreads();
            uint32_t vis = 0;
#pragma unroll
            for (int j = 0; j < fa_cells / 8; ++j) {
#pragma unroll
                for (int h2 = 0; h2 < 2; ++h2) {
                    const int col = 8 * j + 2 * t + h2, cp = c_pos[col];
                    const seq_mask cs = c_seq[col];
                    const bool v0 = kv_cell_visible(cp, cs, seq0, pos0);
                    const bool v1 = kv_cell_visible(cp, cs, seq1, pos1);
                    vis |= uint32_t(v0) << (4 * j + h2) | uint32_t(v1) << (4 * j + 2 + h2);
                    if (v0 || v1) c_seen[col] = 1;
                }
            }
            if (!__syncthreads_or(vis != 0)) continue; // no query of the block sees the tile
            // A cell no query sees is read as zeros, so a free cell's stale
            // (perhaps not finite) values cannot reach the sum through 0 * V.
            for (int e = threadIdx.x; e < fa_cells * (HD / 8); e += blockDim.x) {
                const int r = e / (HD / 8), ch = e % (HD / 8);
                if (c_seen[r]) continue;
                *reinterpret_cast<uint4 *>(ks[b] + r * LD + ch * 8) = make_uint4(0, 0, 0, 0);
                *reinterpret_cast<uint4 *>(vs[b] + r * LD + ch * 8) = make_uint4(0, 0, 0, 0);
            }
            __syncthreads();
            if (__any_sync(0xffffffffu, vis != 0)) tile(std::true_type{}, vis, ks[b], vs[b]);
        }
    }
    cp_async_wait<0>();

    l0 += SMOL_SHFL_XOR(l0, 1);
    l0 += SMOL_SHFL_XOR(l0, 2);
    l1 += SMOL_SHFL_XOR(l1, 1);
    l1 += SMOL_SHFL_XOR(l1, 2);
    if (n_split > 1) {
        // This split's (max, sum, unnormalised sum of V) per (token, head).
        auto put = [&](int row, float m, float l, int r) {
            if (row >= p.n_tok) return;
            float * part =
                p.part + ((size_t(row) * gridDim.y + blockIdx.y) * p.S + blockIdx.z) * (HD + 2);
            if (t == 0) {
                part[0] = m;
                part[1] = l;
            }
#pragma unroll
            for (int n = 0; n < n_dt; ++n) {
                part[2 + 8 * n + 2 * t] = o[n][2 * r];
                part[2 + 8 * n + 2 * t + 1] = o[n][2 * r + 1];
            }
        };
        put(row0, m0, l0, 0);
        put(row1, m1, l1, 1);
        // The block that finishes last for this (query tile, head) merges
        // the splits, so no second launch is needed.
        if (!last_split_block(p.done + blockIdx.y * gridDim.x + blockIdx.x, n_split)) return;
        // A warp a row: the splits' weights (maxima in log2 units), then
        // the accumulators summed with independent loads from L2.
        __shared__ float weight[4][64];
        const int rows = min(fa_rows, p.n_tok - tok0);
        for (int r = warp; r < rows; r += 4) {
            const float * pr =
                p.part + (size_t(tok0 + r) * gridDim.y + blockIdx.y) * p.S * (HD + 2);
            const float L = split_weights<true>(pr, n_split, HD + 2, weight[warp]);
            __syncwarp();
            for (int e = lane; e < HD; e += warp_size) {
                float a = 0.0f;
                for (int i = 0; i < n_split; ++i) {
                    const float f = weight[warp][i];
                    if (f != 0.0f) a += SMOL_LOAD_L2(pr + i * (HD + 2) + 2 + e) * f;
                }
                p.out[size_t(tok0 + r) * p.ldo + h * HD + e] = L > 0.0f ? a / L : 0.0f;
            }
            __syncwarp();
        }
        return;
    }
    // A query that sees no cell gets zeros, as from the kernel above.
    const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
#pragma unroll
    for (int n = 0; n < n_dt; ++n) {
        const int col = h * HD + 8 * n + 2 * t;
        if (row0 < p.n_tok) {
            float * d = p.out + size_t(row0) * p.ldo + col;
            d[0] = o[n][0] * inv0;
            d[1] = o[n][1] * inv0;
        }
        if (row1 < p.n_tok) {
            float * d = p.out + size_t(row1) * p.ldo + col;
            d[0] = o[n][2] * inv1;
            d[1] = o[n][3] * inv1;
        }
    }
}

// --- attention: decode --------------------------------------------------------

// Block (token, kv head x part of its query heads, split). The split's cells
// go to the block's eight warps in tiles of 32, round robin; each warp keeps
// its own online softmax over its tiles and the block merges them at the end.
// A warp copies (cp.async) each tile's K and V rows and its cells' positions
// and sequences as one group, dec_stages - 1 tiles ahead: which cells the
// token sees is read once a tile has landed, so no copy waits on memory and
// a short history costs one trip to it. The scores and the weighted sum of V
// are tensor-core products, as in the flash kernel, taken transposed: the
// block's query heads are columns of an 8-column fragment (the query
// rounded to f16, as on the CPU) and the weights go to the second product
// as f16, so the kernel is held to the flash kernel's bound against the CPU.
// With S splits the last block of a (token, kv head) merges the partials.
// Over a cache of several sequences (pages) the block first lists the tiles
// of its split whose page its token's sequence holds, from the pages'
// summaries, in windows of dec_list tiles, and the warps walk that list:
// another sequence's page costs one summary read. When a batch's (token,
// kv head) pairs are more blocks than the GPU holds at once, each warp of a
// block serves a kv head of its own over the whole list (warp_pages, one
// split): the token's list is made once for eight kv heads, and a short
// history is one pass of a warp, not one block of mostly idle warps.
enum class dec_form : uint8_t { dense, pages, warp_pages };

template <int HD, int GB, dec_form F>
__global__ void __launch_bounds__(dec_warps * warp_size)
    decode_attention_kernel(const attn_params p) {
    static_assert(HD % warp_size == 0 && HD >= 64, "whole lanes, at least eight pieces a row");
    static_assert(GB <= 8 && dec_cells == 32,
                  "query heads in rows 0-7 of a fragment, a cell a lane");
    constexpr bool Pages = F != dec_form::dense, WU = F == dec_form::warp_pages;
    constexpr int pieces = HD / 8;
    constexpr int rows_at_once = warp_size / pieces; // cells a warp's copy instruction covers
    extern __shared__ __align__(16) uint16_t dec_sm[];
    __shared__ __align__(16) uint32_t qs[WU ? dec_warps : 1][GB][HD / 2]; // f16 pairs
    __shared__ float st[dec_warps][GB][HD + 2];

    // The count of cells in use was copied in before the step's first kernel
    // began, so the splits a short history leaves without cells may leave
    // before the wait: their slots go to the kernels that follow.
    const int n_used = *p.n_used;
    // Whole warp tiles a split, the cells shared as evenly as that allows.
    const int chunk = p.S == 1 ? n_used
                               : max(dec_split_cells, ((n_used + p.S - 1) / p.S + dec_cells - 1) /
                                                          dec_cells * dec_cells);
    const int n_split = p.S == 1 ? 1 : max(1, (n_used + chunk - 1) / chunk);
    if (int(blockIdx.z) >= n_split) return;
    const int warp = threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    const int tok = blockIdx.x;
    const int n_sub = decode_subs(p.group);
    // The (kv head, part of its query heads) the block serves, or with
    // warp_pages this warp; a warp past the last has no tiles.
    const int n_units = p.n_kv * n_sub, mine = WU ? int(blockIdx.y) * dec_warps + warp : 0;
    const bool active = !WU || mine < n_units;
    const int unit = WU ? min(mine, n_units - 1) : int(blockIdx.y);
    const int hk = unit / n_sub, sub = unit % n_sub;
    const int h_first = (p.h0 + hk) * p.group + sub * GB;
    const int n_here = min(GB, p.group - sub * GB);
    const uint16_t * K = p.K + hk * p.head_stride;
    const uint16_t * V = p.V + hk * p.head_stride;
    // A row's 16-byte pieces sit at piece ^ (row % 8), so that the eight rows
    // of a matrix ldmatrix reads meet no bank conflict.
    constexpr int NS = dec_stages;
    uint16_t * ks = dec_sm + warp * NS * 2 * dec_cells * HD; // [NS][dec_cells][HD], swizzled
    uint16_t * vs = ks + NS * dec_cells * HD;                // [NS][dec_cells][HD], swizzled
    // Where piece `piece` of row r of buffer b lies in ks or vs.
    auto piece_at = [](int b, int r, int piece) {
        return (b * dec_cells + r) * HD + (piece ^ (r % 8)) * 8;
    };
    // The tiles' cells, after every warp's K and V: [NS][dec_cells]
    // positions of each warp, then the same of sequences.
    int32_t * cpos = reinterpret_cast<int32_t *>(dec_sm + dec_warps * NS * 2 * dec_cells * HD);
    uint64_t * cseq = reinterpret_cast<uint64_t *>(cpos + dec_warps * NS * dec_cells);
    cpos += warp * NS * dec_cells;
    cseq += warp * NS * dec_cells;

    const int c_begin = int(blockIdx.z) * chunk, c_end = min(n_used, c_begin + chunk);
    const int my_pos = p.pos[tok], my_seq = p.seq[tok];
    const uint64_t * my_words = seq_words(p, my_seq);
    // The tiles of a window [w0, w1): every tile, or the listed ones; past
    // the last, w1 (nothing to copy, no cell seen).
    __shared__ int listed[Pages ? dec_list : 1];
    __shared__ int listed_n[dec_warps];
    int w0 = c_begin, w1 = Pages ? min(c_end, c_begin + dec_list * dec_cells) : c_end, n_wt = 0;
    auto tile_at = [&](int i) { return i >= n_wt ? w1 : Pages ? listed[i] : w0 + i * dec_cells; };
    // Lists the window's tiles whose page holds the token's sequence at or
    // before its position, in cell order (a thread looks at consecutive
    // tiles; their counts are scanned across the block).
    auto list_tiles = [&]() {
        constexpr int per = dec_list / (dec_warps * warp_size);
        const int n = (w1 - w0 + dec_cells - 1) / dec_cells, first = int(threadIdx.x) * per;
        uint32_t keep = 0;
#pragma unroll
        for (int j = 0; j < per; ++j) {
            if (first + j < n) {
                const cell_tile & t = p.tiles[(w0 + (first + j) * dec_cells) / cell_tile_cells];
                keep |= uint32_t(!tile_unseen(t, seq_mask::of(my_seq), my_pos)) << j;
            }
        }
        const int cnt = __popc(keep);
        int incl = cnt;
#pragma unroll
        for (int o = 1; o < warp_size; o *= 2) {
            const int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        if (lane == warp_size - 1) listed_n[warp] = incl;
        __syncthreads();
        int at = incl - cnt, total = 0;
#pragma unroll
        for (int w = 0; w < dec_warps; ++w) {
            at += w < warp ? listed_n[w] : 0;
            total += listed_n[w];
        }
        for (; keep; keep &= keep - 1) listed[at++] = w0 + (first + __ffs(keep) - 1) * dec_cells;
        n_wt = total;
    };
    if constexpr (!Pages) n_wt = (c_end - c_begin + dec_cells - 1) / dec_cells;
    // The warp's tiles: first, first + stride, ... of the window's.
    constexpr int stride = WU ? 1 : dec_warps;
    const int first = WU ? (active ? 0 : dec_list) : warp;
    // Copies of the tile at c into buffer b, as one group: piece lane %
    // pieces of its rows, rows_at_once rows an instruction, and its cells'
    // positions and sequences. What lies past the window's end becomes
    // zeros (a cell of no sequence, rows no stale NaN can come from), read
    // from nowhere. Nothing here waits for memory, so a warp keeps NS - 1
    // tiles in flight.
    auto issue = [&](int c, int b) {
        const int from = (lane / pieces) * HD + (lane % pieces) * 8;
        const uint16_t * kg = K + size_t(c) * HD + from;
        const uint16_t * vg = V + size_t(c) * HD + from;
        // A whole tile (all but a window's last) tests no row, so its
        // copies' addresses are two registers and offsets.
        auto rows = [&](auto whole) {
#pragma unroll
            for (int i = 0; i < dec_cells / rows_at_once; ++i) {
                const int r = i * rows_at_once + lane / pieces;
                const bool on = decltype(whole)::value || c + r < w1;
                const int at = piece_at(b, r, lane % pieces);
                cp_async16(ks + at, on ? kg + i * rows_at_once * HD : K, on ? 16 : 0);
                cp_async16(vs + at, on ? vg + i * rows_at_once * HD : V, on ? 16 : 0);
            }
        };
        if (c + dec_cells <= w1) {
            rows(std::true_type{});
        } else {
            rows(std::false_type{});
        }
        // Lanes 0-7 copy four positions each, lanes 8-23 the words of two
        // cells that hold the token's sequence's bit.
        if (lane < 24) {
            const bool pos_part = lane < 8;
            const int size = pos_part ? 4 : 8, per = 16 / size;
            const int c0 = c + (pos_part ? lane : lane - 8) * per;
            const int bytes = max(0, min(per, w1 - c0)) * size;
            void * dst = pos_part ? static_cast<void *>(cpos + b * dec_cells + c0 - c)
                                  : static_cast<void *>(cseq + b * dec_cells + c0 - c);
            const void * from = bytes == 0 ? static_cast<const void *>(K)
                                : pos_part ? static_cast<const void *>(p.cell_pos + c0)
                                           : static_cast<const void *>(my_words + c0);
            cp_async16(dst, from, bytes);
        }
        cp_async_commit();
    };
    // A warp's first NS - 1 tiles, as soon as the window is known (a short
    // history costs one trip to memory).
    auto start = [&]() {
#pragma unroll
        for (int s = 0; s < NS - 1; ++s) issue(tile_at(first + s * stride), s);
    };
    // The positions, sequences and page summaries were staged before the
    // step began too: the list is made while the kernel before ends. Over
    // one sequence the first tiles are on their way by then: every cell but
    // those of this step's tokens was written by an earlier step, and those
    // are read again once the kernel that stored them has ended (refetch).
    if constexpr (Pages) list_tiles();
    if constexpr (!Pages) start();
    // The cells of the step's first warp_size tokens, staged before the step
    // began like the count: the refetch below needs them once the wait returns.
    const int first_cell = lane < p.n_tok ? p.cell[lane] : -1;
    griddep_launch(); // before the wait (see griddep_wait)
    griddep_wait();
    // Rows of tile `base` in buffer b that this step's tokens wrote, read
    // again (a 16-byte piece a lane, K's then V's), in place of what the
    // copy issued before the wait may have found.
    auto refetch = [&](int base, int b) {
        static_assert(2 * pieces <= warp_size, "a lane a piece of a K or V row");
        for (int t0 = 0; t0 < p.n_tok; t0 += warp_size) {
            const int c = t0 == 0 ? first_cell : t0 + lane < p.n_tok ? p.cell[t0 + lane] : -1;
            for (uint32_t hit =
                     __ballot_sync(0xffffffffu, c >= base && c < min(base + dec_cells, w1));
                 hit; hit &= hit - 1) {
                const int cc = __shfl_sync(0xffffffffu, c, __ffs(hit) - 1), r = cc - base;
                if (lane < 2 * pieces) {
                    const int pc = lane % pieces;
                    const uint16_t * src = (lane < pieces ? K : V) + size_t(cc) * HD + pc * 8;
                    uint16_t * dst = (lane < pieces ? ks : vs) + piece_at(b, r, pc);
                    *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
                }
            }
        }
        __syncwarp();
    };

    uint32_t(*q)[HD / 2] = qs[WU ? warp : 0];
    for (int e = WU ? lane : int(threadIdx.x); e < GB * (HD / 2);
         e += WU ? warp_size : int(blockDim.x)) {
        const int g = e / (HD / 2), j = e % (HD / 2);
        float x0 = 0.0f, x1 = 0.0f;
        if (g < n_here) load_query_pair(p, tok, h_first + g, HD, j, x0, x1);
        // The query meets the f16 cache as f16, as on the CPU.
        q[g][j] = pack_f16x2(x0, x1);
    }
    __syncthreads();
    // The products are taken transposed, cells and dimensions as the 16
    // rows of a fragment and the block's query heads as its 8 columns, so
    // no product spends half its rows on nothing: S^T = K Q^T, then
    // O^T = V^T P^T. Lane l holds columns 2 (l % 4) and 2 (l % 4) + 1 (query
    // heads qc, qc + 1) of rows l / 4 and l / 4 + 8; Q^T's B fragments are
    // query head l / 4's pairs (zero past the block's heads).
    const int qg = lane / 4, qt = lane % 4, qc = 2 * qt;
    uint32_t qb[HD / 16][2];
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
        qb[kk][0] = qg < GB ? q[qg][8 * kk + qt] : 0u;
        qb[kk][1] = qg < GB ? q[qg][8 * kk + 4 + qt] : 0u;
    }

    // Scores in log2 units, so exp2 serves as the exponential.
    const float scale = p.scale * log2_e;
    constexpr int n_dt = HD / 16;
    // Query heads qc and qc + 1: running maxima, this lane's parts of the sums.
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float o[n_dt][4]; // O^T: dimensions 16n + qg (+ 8) of query heads qc, qc + 1
#pragma unroll
    for (int n = 0; n < n_dt; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    for (;;) {
        if constexpr (Pages) start();
        for (int k = 0, ti = first, base = tile_at(ti); base < w1; ++k) {
            const int b = k % NS;
            // The tile NS - 1 ahead (past the last: an empty group), then this one.
            issue(tile_at(ti + (NS - 1) * stride), (k + NS - 1) % NS);
            cp_async_wait<NS - 1>();
            __syncwarp();
            if constexpr (!Pages) {
                if (k < NS - 1) refetch(base, b); // issued before the wait
            }
            const uint32_t seen = __ballot_sync(
                0xffffffffu, kv_cell_visible(cpos[b * dec_cells + lane],
                                             cseq + b * dec_cells + lane, my_seq, my_pos));
            const uint16_t * kt = ks + b * dec_cells * HD;
            const uint16_t * vt = vs + b * dec_cells * HD;
            if (const uint32_t unseen = __ballot_sync(0xffffffffu, base + lane < w1) & ~seen) {
                // Rows the token does not see that were copied: zero V rows,
                // since 0 times a NaN is NaN.
#pragma unroll
                for (int i = 0; i < dec_cells / rows_at_once; ++i) {
                    const int r = i * rows_at_once + lane / pieces;
                    if ((unseen >> r) & 1u) {
                        *reinterpret_cast<uint4 *>(vs + (b * dec_cells + r) * HD +
                                                   (lane % pieces) * 8) = make_uint4(0, 0, 0, 0);
                    }
                }
                __syncwarp();
            }
            if (seen) {
                // S^T = K Q^T: A fragments of K for 16 cells (matrices of
                // cells 0-7 and 8-15 at columns 16kk, then the same at 16kk + 8).
                float s[dec_cells / 16][4];
#pragma unroll
                for (int j = 0; j < dec_cells / 16; ++j)
                    s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
                    for (int j = 0; j < dec_cells / 16; ++j) {
                        const int r = 16 * j + 8 * (lane / 8 % 2) + lane % 8;
                        const int piece = 2 * kk + lane / 16;
                        uint32_t af[4];
                        ldmatrix_x4(af, kt + r * HD + (piece ^ (lane % 8)) * 8);
                        mma_f16_16816(s[j], af, qb[kk][0], qb[kk][1]);
                    }
                }
                // Lane l has cells 16j + l / 4 (+ 8) of query heads qc, qc + 1;
                // a cell the token does not see scores -inf and weighs zero.
                float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
                for (int j = 0; j < dec_cells / 16; ++j) {
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        if (!((seen >> (16 * j + qg + 8 * (i / 2))) & 1u)) s[j][i] = -INFINITY;
                        mx[i % 2] = fmaxf(mx[i % 2], s[j][i]);
                    }
                }
                float corr[2], mn[2];
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    mx[i] = fmaxf(mx[i], SMOL_SHFL_XOR(mx[i], 4));
                    mx[i] = fmaxf(mx[i], SMOL_SHFL_XOR(mx[i], 8));
                    mx[i] = fmaxf(mx[i], SMOL_SHFL_XOR(mx[i], 16));
                    // Finite: the token sees a cell (the scale is positive,
                    // so the same scores are largest).
                    mn[i] = fmaxf(m[i], mx[i] * scale);
                    corr[i] = m[i] == -INFINITY ? 0.0f : fast_exp2(m[i] - mn[i]);
                    m[i] = mn[i];
                    l[i] *= corr[i];
                }
#pragma unroll
                for (int n = 0; n < n_dt; ++n) {
                    o[n][0] *= corr[0];
                    o[n][1] *= corr[1];
                    o[n][2] *= corr[0];
                    o[n][3] *= corr[1];
                }
                // P^T as f16 8x8 matrices (cells by query heads), turned into
                // P's: the B fragments of O^T = V^T P^T for cells 16j..16j+15.
                uint32_t pb[dec_cells / 16][2];
#pragma unroll
                for (int j = 0; j < dec_cells / 16; ++j) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const float p0 = fast_exp2(fmaf(s[j][2 * h], scale, -mn[0]));
                        const float p1 = fast_exp2(fmaf(s[j][2 * h + 1], scale, -mn[1]));
                        l[0] += p0;
                        l[1] += p1;
                        pb[j][h] = movmatrix_trans(pack_f16x2(p0, p1));
                    }
                }
                // O^T += V^T P^T: A fragments of V^T for 16 dimensions by 16
                // cells (V's matrices transposed: cells 0-7 at dimensions
                // 16n, then 16n + 8, then cells 8-15 at both).
                const int mi = lane / 8, mr = lane % 8;
#pragma unroll
                for (int kk = 0; kk < dec_cells / 16; ++kk) {
#pragma unroll
                    for (int n = 0; n < n_dt; ++n) {
                        const int r = 16 * kk + 8 * (mi >> 1) + mr, piece = 2 * n + (mi & 1);
                        uint32_t af[4];
                        ldmatrix_x4<true>(af, vt + r * HD + (piece ^ mr) * 8);
                        mma_f16_16816(o[n], af, pb[kk][0], pb[kk][1]);
                    }
                }
            }
            __syncwarp(); // the buffer is read before a later tile fills it
            ti += stride;
            base = tile_at(ti);
        }
        if (w1 >= c_end) break;
        // The next window of a long split: every warp is done with the list.
        cp_async_wait<0>();
        __syncthreads();
        w0 = w1;
        w1 = min(c_end, w0 + dec_list * dec_cells);
        list_tiles();
        __syncthreads();
    }
    cp_async_wait<0>();
    // A query head's sum: the eight lanes of a column hold its cells between them.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += SMOL_SHFL_XOR(l[i], 4);
        l[i] += SMOL_SHFL_XOR(l[i], 8);
        l[i] += SMOL_SHFL_XOR(l[i], 16);
    }

    if constexpr (WU) {
        // A warp's state is its kv head's whole answer (one split).
        if (!active) return;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            if (qc + i >= n_here) continue;
            float * out = p.out + size_t(tok) * p.ldo + (h_first + qc + i) * HD + qg;
            const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
            for (int n = 0; n < n_dt; ++n) {
                out[16 * n] = o[n][i] * inv;
                out[16 * n + 8] = o[n][2 + i] * inv;
            }
        }
    } else {
        // The warps' states, then the block's: max, sum and the weighted sum of
        // V for each query head.
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            if (qc + i >= GB) continue;
            float * sw = st[warp][qc + i];
            if (qg == 0) {
                sw[0] = m[i];
                sw[1] = l[i];
            }
#pragma unroll
            for (int n = 0; n < n_dt; ++n) {
                sw[2 + 16 * n + qg] = o[n][i];
                sw[2 + 16 * n + qg + 8] = o[n][2 + i];
            }
        }
        __syncthreads();
        // This block's partials: [block][GB][S] of (max, sum, acc[HD]).
        float * part_of_block =
            p.part + (size_t(blockIdx.x) * gridDim.y + blockIdx.y) * GB * p.S * (HD + 2);
        for (int i = threadIdx.x; i < GB * HD; i += blockDim.x) {
            const int g = i / HD, e = i % HD;
            if (g >= n_here) continue;
            float mx = -INFINITY;
#pragma unroll
            for (int w = 0; w < dec_warps; ++w) mx = fmaxf(mx, st[w][g][0]);
            float L = 0.0f, a = 0.0f;
            if (mx != -INFINITY) {
#pragma unroll
                for (int w = 0; w < dec_warps; ++w) {
                    const float f = st[w][g][0] == -INFINITY ? 0.0f : exp2f(st[w][g][0] - mx);
                    L += st[w][g][1] * f;
                    a += st[w][g][2 + e] * f;
                }
            }
            const int h = h_first + g;
            if (n_split == 1) {
                p.out[size_t(tok) * p.ldo + h * HD + e] = L > 0.0f ? a / L : 0.0f;
            } else {
                float * part = part_of_block + (size_t(g) * p.S + blockIdx.z) * (HD + 2);
                if (e == 0) {
                    part[0] = mx;
                    part[1] = L;
                }
                part[2 + e] = a;
            }
        }
        if (n_split == 1) return;

        // The block that finishes last for this (token, kv head, part) merges
        // the splits.
        if (!last_split_block(p.done + blockIdx.x * gridDim.y + blockIdx.y, n_split)) return;
        // The block's partials, [GB][S] of (max, sum, acc[HD]), into the
        // tiles' shared memory (free now) in 16-byte copies that wait on
        // nothing: one trip to L2, where loads of eight splits at a time made
        // several. The merge runs while every other SM of the launch waits.
        const size_t at = size_t(part_of_block - p.part), a0 = at & ~size_t(3);
        const size_t n_pieces = (at + size_t(n_here) * p.S * (HD + 2) - a0 + 3) / 4;
        float * ps = reinterpret_cast<float *>(dec_sm);
        static_assert(dec_max_heads * dec_max_splits * (HD + 2) * sizeof(float) + 16 <=
                          dec_smem<HD>(),
                      "the partials fit where the tiles were");
        for (size_t k = threadIdx.x; k < n_pieces; k += blockDim.x)
            cp_async16(ps + 4 * k, p.part + a0 + 4 * k);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        const float * pb = ps + (at - a0);
        __shared__ float weight[GB][dec_max_splits];
        __shared__ float inv_sum[GB];
        for (int g = warp; g < n_here; g += dec_warps) {
            const float L = split_weights<true, dec_max_splits / warp_size, true>(
                pb + size_t(g) * p.S * (HD + 2), n_split, HD + 2, weight[g]);
            if (lane == 0) inv_sum[g] = L > 0.0f ? 1.0f / L : 0.0f;
        }
        __syncthreads();
        // Each output's splits are summed by `ways` threads (every ways-th
        // split each, in the splits' order), whose sums then meet in shared
        // memory.
        const int n_out = n_here * HD, ways = max(1, int(blockDim.x) / n_out);
        float * red = &st[0][0][0]; // ways * n_out <= blockDim.x floats when ways > 1
        for (int it = threadIdx.x; it < ways * n_out; it += blockDim.x) {
            const int way = it / n_out, o = it % n_out, g = o / HD;
            const float * pr = pb + size_t(g) * p.S * (HD + 2) + 2 + o % HD;
            float a = 0.0f;
            for (int i = way; i < n_split; i += ways) {
                const float f = weight[g][i], x = pr[i * (HD + 2)];
                a = f != 0.0f ? a + x * f : a;
            }
            if (ways == 1) {
                p.out[size_t(tok) * p.ldo + h_first * HD + o] = a * inv_sum[g];
            } else {
                red[it] = a;
            }
        }
        if (ways > 1) {
            __syncthreads();
            for (int o = threadIdx.x; o < n_out; o += blockDim.x) {
                float a = 0.0f;
                for (int w = 0; w < ways; ++w) a += red[w * n_out + o];
                p.out[size_t(tok) * p.ldo + h_first * HD + o] = a * inv_sum[o / HD];
            }
        }
    }
}

// Calls f(std::integral_constant<int, GB>) for the decode kernel's GB of 1
// to dec_max_heads query heads a block.
template <typename F> void with_dec_heads(int gb, F && f) {
    switch (gb) {
    case 1:
        return f(std::integral_constant<int, 1>{});
    case 2:
        return f(std::integral_constant<int, 2>{});
    case 3:
        return f(std::integral_constant<int, 3>{});
    default:
        return f(std::integral_constant<int, 4>{});
    }
}

#endif // !SMOL_HIP

// --- matmul kernel choice ------------------------------------------------------------

// One candidate of the autotune table: the GEMV (MT = 1) with KS warps a
// group of R rows, the small-batch kernel with a token tile MT and KS warps
// a row, or cuBLAS on tensor cores.
struct mm_choice {
    bool blas = false;
    int mt = 1, ks = 1;
    double us = -1;    // the time the autotune measured, if it did
    int r = 1;         // GEMV rows a warp
    bool kv = false;   // (used, not a table's) the GEMV stored k and v in the cache too
    bool kept = false; // (used) cuBLAS over bf16 pairs whose sums their readers made
};

constexpr int mm_tiles[] = {1, 2, 4, 8, 16, 32};
constexpr int mm_splits[] = {1, 2, 4};
constexpr int mm_rows[] = {1, 2, 4};

std::string choice_name(const mm_choice & c) {
    if (c.blas) return "cublas";
    return std::string(c.mt == 1 ? "gemv" : "smallbatch") + " mt=" + std::to_string(c.mt) +
           " ks=" + std::to_string(c.ks) + (c.r > 1 ? " r=" + std::to_string(c.r) : "");
}

// Reads "gemv mt=1 ks=2 r=2" (no r: one row a warp), "smallbatch mt=8
// ks=1" or "cublas"; false for anything else (a tile, split or row count
// this build has no kernel for included).
bool parse_choice(const std::string & text, mm_choice & c) {
    char family[32] = {};
    int mt = 0, ks = 0, r = 1;
    if (std::sscanf(text.c_str(), "%31s mt=%d ks=%d r=%d", family, &mt, &ks, &r) < 1) return false;
    const std::string f = family;
    c = mm_choice{};
    if (f == "cublas") {
        c.blas = true;
        return true;
    }
    if (f != "gemv" && f != "smallbatch") return false;
    const bool tile_ok =
        std::find(std::begin(mm_tiles), std::end(mm_tiles), mt) != std::end(mm_tiles);
    const bool split_ok =
        std::find(std::begin(mm_splits), std::end(mm_splits), ks) != std::end(mm_splits);
    const bool rows_ok = std::find(std::begin(mm_rows), std::end(mm_rows), r) != std::end(mm_rows);
    if (!tile_ok || !split_ok || !rows_ok || (f == "gemv") != (mt == 1) || (mt > 1 && r != 1))
        return false;
    c.mt = mt;
    c.ks = ks;
    c.r = r;
    return true;
}

const char * type_key_name(smol_type t) {
    const char * n = smol_type_name(t);
    return n ? n : "?";
}

// --- the plan of one graph --------------------------------------------------------

// What runs at one node. Fused steps stand at the last node of the group
// they replace; the other nodes of the group are skipped, their results
// never written: a caller reads only the graph's last node (the logits).
enum class step_kind : uint8_t { plain, mm, mm_swiglu, kv_store, attention };

struct step {
    step_kind kind = step_kind::plain;
    tensor * t = nullptr; // the node the step stands at; its output is the step's
    tensor * mm[3] = {};  // mm: matmuls that share one input; mm_swiglu: gate, up
    int n_mm = 0;
    tensor * norm = nullptr;  // an RMS_NORM folded into the matmuls' input
    tensor * glu = nullptr;   // a SWIGLU folded into a cuBLAS matmul's input
    tensor * add = nullptr;   // an ADD folded into that norm (cuBLAS matmuls)
    tensor * res = nullptr;   // a residual added to mm[0]'s result (t is the ADD)
    tensor * rope = nullptr;  // a ROPE folded into kv_store (of k) or attention (of q)
    tensor * extra = nullptr; // a result t reads beyond its own sources
    tensor * store = nullptr; // mm of q, k, v: the KV_STORE of k and v its GEMV may do
    bool skip = false;        // computed inside another step
    // cuBLAS over bf16_hl pairs: the results stay hi and lo in the scratch,
    // and the kernels that read them add them (the next step's input kernel,
    // or for q, k and v the cache store and the attention; make_steps).
    bool keep_pairs = false;
};

// The rows a cache store (k) or an attention (q) step reads: its first
// source's, or the source of the ROPE folded into it.
const tensor * unrotated(const step & s) {
    return s.rope ? s.rope->src[0] : s.t->src[0];
}

size_t align_up(size_t n, size_t a) {
    return (n + a - 1) / a * a;
}

// The device's copy of the cache table: positions, then the sequence masks
// in two planes of words (sequences 0-63 of every cell, then 64-127: the
// decode kernel copies the words of its token's sequence alone, 16 bytes
// at a time, so each plane starts 16-byte aligned), then the tiles of 64
// cells.
size_t cell_seqs_offset(int64_t n_cells) {
    return align_up(size_t(n_cells) * sizeof(int32_t), 16);
}
size_t seq_plane_words(int64_t n_cells) {
    return align_up(size_t(n_cells), 2);
}
size_t cell_tiles_offset(int64_t n_cells) {
    return cell_seqs_offset(n_cells) + 2 * seq_plane_words(n_cells) * sizeof(uint64_t);
}
size_t cell_table_bytes(int64_t n_cells) {
    return cell_tiles_offset(n_cells) +
           size_t((n_cells + cell_tile_cells - 1) / cell_tile_cells) * sizeof(cell_tile);
}

// The summary of cells [c0, c0 + 64) (those past the table count as unused).
cell_tile tile_of(const kv_cache & kv, int64_t c0) {
    cell_tile t{seq_mask::none(), seq_mask::all(), INT32_MAX, -1, 0, 0};
    const int64_t c1 = std::min<int64_t>(c0 + cell_tile_cells, kv.n_cells);
    for (int64_t c = c0; c < c1; ++c) {
        const int32_t cp = kv.cell_pos[size_t(c)];
        if (cp < 0) continue;
        const seq_mask cs = kv.cell_seqs[size_t(c)];
        t.seq_or |= cs;
        t.seq_and &= cs;
        t.min_pos = std::min(t.min_pos, cp);
        t.max_pos = std::max(t.max_pos, cp);
        ++t.n_used;
    }
    return t;
}

// Batches of up to this many tokens over bf16 weights take cuBLAS in bf16,
// x as hi and lo columns (bf16_hl): the weights are read once, where the
// dequantized path below writes and reads them again. Larger ones
// dequantize the weights to f16 first, as other types do, where the pairs'
// doubled products cost more than that pass. On the H200, with the pairs'
// sums made by the next input kernel: 64 and 128 sequences of the 135M,
// 360M and 1.7B decoded 1.07-1.42x faster with pairs, 128- and 256-token
// prompts of the 1.7B 1.36-1.40x and 1.10-1.15x; its 512-token prompts
// 0.87-0.90x (BENCHMARKS.md).
constexpr int64_t blas_pair_max_m = 256;

// Whether a cuBLAS matmul of M tokens over weights of this type takes
// bf16_hl pairs; a step's matmuls take them when all of them do.
bool blas_pairs(int type, int64_t M) {
    return type == SMOL_TYPE_BF16 && M <= blas_pair_max_m;
}
bool step_pairs(const step & s) {
    for (int i = 0; i < s.n_mm; ++i) {
        const tensor * m = s.mm[i];
        if (!blas_pairs(m->src[0]->type, m->src[1]->ne[1])) return false;
    }
    return true;
}

// The work space of cuBLAS matmuls: their input (f16, or bf16_hl pairs),
// then room for one dequantized weight, or for each of the step's pairs'
// two columns of results a token.
size_t blas_input_bytes(bool pairs, int64_t K, int64_t M) {
    return align_up(size_t(K) * size_t(M) * 2 * (pairs ? 2 : 1), 256);
}
// Where the scratch starts (N: the step's widest output): past the input,
// and with pairs past any input of N columns too, which the next step's
// input kernel writes while it reads this step's kept results.
size_t blas_scratch_offset(bool pairs, int64_t K, int64_t N, int64_t M) {
    return blas_input_bytes(pairs, pairs ? std::max(K, N) : K, M);
}
size_t blas_pair_bytes(int64_t N, int64_t M) {
    return align_up(size_t(N) * size_t(M) * 2 * sizeof(float), 256);
}
size_t blas_scratch_bytes(int type, bool pairs, int64_t N, int64_t K, int64_t M) {
    return pairs ? blas_pair_bytes(N, M)
           : type == SMOL_TYPE_F32 || type == SMOL_TYPE_F16
               ? 0
               : align_up(size_t(N) * size_t(K) * 2, 256);
}
size_t blas_work_bytes(int type, bool pairs, int64_t N, int64_t K, int64_t M) {
    return blas_scratch_offset(pairs, K, N, M) + blas_scratch_bytes(type, pairs, N, K, M);
}

template <bool SWIGLU>
void launch_mm_type(int type, const mm_params & p, int rows, const mm_choice & c, cudaStream_t st,
                    bool pdl = false);

// Where the table of this GPU lives: SMOL_AUTOTUNE_FILE, else
// $XDG_CACHE_HOME/smol/autotune-<gpu>.txt, else ~/.cache/smol/...
std::string default_table_path(const std::string & gpu) {
    if (const char * f = std::getenv("SMOL_AUTOTUNE_FILE"); f && *f) return f;
    std::string slug;
    for (char ch : gpu) {
        const bool alnum = std::isalnum(static_cast<unsigned char>(ch));
        if (alnum) {
            slug += char(std::tolower(static_cast<unsigned char>(ch)));
        } else if (!slug.empty() && slug.back() != '-') {
            slug += '-';
        }
    }
    while (!slug.empty() && slug.back() == '-') slug.pop_back();
    if (slug.empty()) slug = "gpu";
    std::filesystem::path dir;
    if (const char * x = std::getenv("XDG_CACHE_HOME"); x && *x) {
        dir = std::filesystem::path(x) / "smol";
    } else if (const char * h = std::getenv("HOME"); h && *h) {
        dir = std::filesystem::path(h) / ".cache" / "smol";
    } else {
        dir = std::filesystem::temp_directory_path() / "smol";
    }
    return (dir / ("autotune-" + slug + ".txt")).string();
}

// Said once per process, not once per context.
void say_once(const std::string & message) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) std::fprintf(stderr, "smol: %s\n", message.c_str());
}

int env_flag(const char * name, int fallback) {
    const char * v = std::getenv(name);
    return v && *v ? std::atoi(v) : fallback;
}

// Which attention kernel runs: by the batch's token count (automatic), or
// the one SMOL_ATTN names, so that both can be compared on one device.
// SMOL_ATTN=decode-warps is the decode kernel with a warp a kv head over
// any cache of several sequences (automatic takes it for large batches).
enum class attn_kernel : uint8_t { automatic, decode, decode_warps, flash, classic };

attn_kernel attn_kernel_from_env() {
    const char * v = std::getenv("SMOL_ATTN");
    if (!v || !*v || std::strcmp(v, "auto") == 0) return attn_kernel::automatic;
    if (std::strcmp(v, "decode") == 0) return attn_kernel::decode;
    if (std::strcmp(v, "decode-warps") == 0) return attn_kernel::decode_warps;
    if (std::strcmp(v, "flash") == 0) return attn_kernel::flash;
    if (std::strcmp(v, "classic") == 0) return attn_kernel::classic;
    throw error(SMOL_ERR_INVALID_ARGUMENT, std::string("SMOL_ATTN=") + v +
                                               " names no attention kernel; use auto, decode, "
                                               "decode-warps, flash or classic");
}

// --- the backend ----------------------------------------------------------------

class cuda_backend final : public backend {
  public:
    explicit cuda_backend(int device);
    ~cuda_backend() override;
    const char * name() const override { return name_.c_str(); }
    placement where() const override { return placement::device; }
    // Prompts of a few thousand tokens fill the GPU in one pass: a 4,096-token
    // prompt of the 1.7B decoded in one call ran 1.3x its speed in 512s.
    uint32_t default_batch() const override { return 4096; }
    bool wants_seq_cells() const override { return false; }
    bool reruns_graphs() const override { return true; }
    void * alloc(size_t bytes) override;
    void release(void * p) override;
    void upload(void * dst, const void * src, size_t bytes) override;
    void download(void * dst, const void * src, size_t bytes) override;
    void memset(void * dst, int value, size_t bytes) override;
    void * alloc_host(size_t bytes, bool & pinned, const char * what) override;
    void release_host(void * p) override;
    void set_memory_limit(size_t bytes) override { mem_.limit = bytes; }
    memory_stats memory() const override { return mem_; }
    size_t compute_bytes(graph & g) override;
    void run(graph & g) override;
    void reserve(graph & g) override;

    std::vector<std::string> mm_candidates(const mm_key & key) const override;
    double mm_time(const mm_key & key, const std::string & candidate) override;
    void mm_choose(const mm_key & key, const std::string & candidate, double us) override;
    std::string mm_table_save(const std::string & path) const override;
    std::string mm_used() const override;

  private:
    struct buffer {
        void * p = nullptr;
        size_t size = 0;
    };
    void grow(buffer & b, size_t bytes, const char * what);
    void grow_host(size_t bytes);
    void activate() const { SMOL_GPU_CHECK(cudaSetDevice(device_)); }

    void make_steps(graph & g);
    void prepare(graph & g);
    void stage(graph & g);
    void restore_leaves();
    void structure(const graph & g);
    void signature();
    void launch_all(graph & g);
    void launch_program(graph & g);
    void launch(const step & s, const batch_info & b);
    void copy_on(const tensor * t, cudaStream_t st);
    size_t step_work() const;
    // Counts n more device bytes, or throws with the numbers past the limit.
    void charge(size_t n, const char * what);

    void run_mm(const step & s, const batch_info & b);
    template <class F> cudaGraphExec_t capture_graph(bool pdl, F && launches);
#if defined(SMOL_HAVE_BLAS)
    void blas_gemm(int type, bool pairs, const uint8_t * w, size_t w_row_bytes, int N, int K, int M,
                   float * y, size_t ldy, uint8_t * scratch);
    void blas_mm(int type, const uint8_t * w, size_t w_row_bytes, int N, int K, const float * x,
                 size_t ldx, int M, float * y, size_t ldy);
    // A cuBLAS step's input at the start of the work space, then its
    // scratch (see blas_work_bytes).
    void * blas_input() const {
        return work_.p;
    }
    uint8_t * blas_scratch(bool pairs, int K, int N, int M) const {
        return static_cast<uint8_t *>(work_.p) + blas_scratch_offset(pairs, K, N, M);
    }
    void blas_input_of(bool pairs, const float * x, size_t ldx, int K, int M);
    // A GEMM of blas_gemms: its weights and its output; with pairs left
    // unsummed, where its hi and lo results went (hl).
    struct blas_out {
        int type;
        const uint8_t * w;
        size_t w_row_bytes;
        int N;
        float * y;
        size_t ldy;
        const float * hl = nullptr;
    };
    uint8_t * blas_gemms(bool pairs, bool sum, int K, int M, blas_out * o, int n);
    void run_blas(const step & s, const tensor * x, int K, int M);
#endif
    // The results a cuBLAS step kept as hi and lo (step::keep_pairs) for the
    // kernels that read them: mm t's token m at p + 2 m N, its lo N further.
    // None without cuBLAS.
    struct kept_pair {
        const tensor * t;
        const float * p;
        int N;
    };
    kept_pair kept_[3];
    int n_kept_ = 0;
    size_t kept_end_ = 0; // bytes of the work space the kept results reach
    // A tensor's rows, or where the step before kept them as hi and lo
    // (rows ld apart, lo further).
    struct source {
        const float * p;
        size_t ld, lo;
    };
    source source_of(const tensor * t) const {
        for (int i = 0; i < n_kept_; ++i) {
            const kept_pair & k = kept_[i];
            if (k.t == t) return source{k.p, 2 * size_t(k.N), size_t(k.N)};
        }
        return source{static_cast<const float *>(t->data), t->nb[1] / 4, 0};
    }
    rope_params rope_for(const tensor * rope) const;
    void run_attention(const step & s, const batch_info & b);
    void run_kv_store(const step & s, const batch_info & b);
    kv_store_params kv_store_of(const step & s, const kv_cache & kv) const;
    const tensor * stored_ = nullptr; // the KV_STORE a GEMV of q, k, v has just done
    // Whether a GEMV of these weight bytes prefetches them (see run_mm).
    bool gemv_prefetch(size_t weight_bytes) const {
        return weight_bytes <= l2_bytes_ / 8;
    }
    bool small_mm(const tensor * mm) const;
    bool blas_fits(const tensor * mm) const;
    static mm_key key_of(const tensor * mm);
    mm_choice choose(const mm_key & key) const;
    mm_choice default_small(const mm_key & key) const;
    void note_used(const mm_key & key, const mm_choice & c);
    void load_table();
    size_t attn_splits(const tensor * t, int & Q, int & W) const;
    int flash_splits(const tensor * t) const;
    int decode_splits(const tensor * t) const;
    int decode_blocks(const tensor * t) const;
    struct attn_choice {
        attn_kernel kind = attn_kernel::classic; // decode, flash or classic
        int S = 1, Q = 1, W = 1; // splits over the cells; classic: queries a block, streams a query
        bool warps = false;      // decode over pages: a warp a kv head, unsplit
    };
    attn_choice choose_attention(const tensor * t) const;
    void check_launch(const char * what) const {
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) gpu_fail(e, what);
    }

    int device_;
    std::string name_;
    int n_sm_ = 1;
    size_t l2_bytes_ = 0;
    bool fuse_ = true;
    bool graphs_ = true;
    bool pdl_ = false;     // kernels may launch while the one before ends (see griddep_wait)
    bool pdl_now_ = false; // ... in the launches being issued now (a decode step's capture)

    attn_kernel attn_ = attn_kernel::automatic;
    int dec_slots_ = 1;               // blocks of the decode attention kernel the GPU holds at once
    cudaStream_t stream_ = nullptr;   // compute
    cudaStream_t h2d_ = nullptr;      // PREFETCH copies
    cudaStream_t d2h_ = nullptr;      // OFFLOAD copies
    cudaEvent_t staged_ = nullptr;    // the last staging copies are done with the pinned buffer
    cudaEvent_t fork_ = nullptr;      // the copy streams start after the compute stream's past
    cudaEvent_t join_[2] = {};        // and the compute stream ends after theirs
    std::vector<cudaEvent_t> events_; // the schedule's events
    schedule sched_;
    arena_plan probe_;
    memory_stats mem_;
    std::unordered_map<void *, size_t> sizes_;                 // device allocations
    std::unordered_map<void *, std::pair<size_t, bool>> host_; // host: bytes, pinned

    buffer arena_, work_, dyn_, cells_;
    buffer rope_;                       // the run's table of rope angles
    const tensor * rope_key_ = nullptr; // the ROPE node whose angles it holds
    buffer done_;                       // attention's split counters, zero between launches
    void * host_stage_ = nullptr;
    size_t host_stage_size_ = 0;

    // Device addresses of the batch, valid during run.
    int32_t * d_params_ = nullptr; // [0] = n_used
    int32_t * d_pos_ = nullptr;
    int32_t * d_seq_ = nullptr;
    int32_t * d_cell_ = nullptr;
    int32_t * d_cell_pos_ = nullptr;
    uint64_t * d_cell_seqs_ = nullptr; // two planes of n_cells words (attn_params)
    cell_tile * d_cell_tiles_ = nullptr;

    // What the device holds of the cache's cell table, to upload only changes.
    // While the cache's version stays shadow_version_, only the cells a
    // batch takes change (kv_cache::version), so a step compares those, not
    // the whole table; held_ is then the union of the used cells' sequences.
    const kv_cache * shadow_kv_ = nullptr;
    std::vector<int32_t> shadow_pos_;
    std::vector<seq_mask> shadow_seqs_;
    uint64_t shadow_version_ = 0;
    seq_mask held_ = seq_mask::none();
    // Cells whose tile summaries the device lacks: they are made when a
    // graph whose attention reads them is staged: the flash kernel's
    // (flash_steps_, set with the steps), or the decode kernel's over a
    // cache of several sequences.
    int32_t tiles_lo_ = INT32_MAX, tiles_hi_ = 0;
    bool flash_steps_ = false, decode_steps_ = false;
    // Every token of the batch is of a sequence of its own (set with the
    // steps): the decode kernel then walks only each token's pages, and may
    // take more blocks than the GPU holds at once.
    bool seqs_apart_ = false;
    // The cache holds cells of several sequences (set when staged): the
    // decode kernel's form that walks pages runs.
    bool pages_ = false;

    std::vector<step> steps_;
    arena_plan plan_;                                  // reused from step to step
    std::vector<std::pair<tensor *, void *>> swapped_; // host leaves and their host data
    // A graph's structure (structure()), then with the addresses a replay
    // bakes in (signature()). steps_, plan_ and sched_ were made for the
    // graph of the last run, of structure prep_sig_ (while prepared_): a
    // decode step that reruns it (last_) takes them as they are, unless its
    // batch's sequences came apart or together (ran_apart_).
    std::vector<uint64_t> sig_, prev_sig_, prep_sig_;
    bool prepared_ = false;
    last_run last_;
    bool ran_apart_ = false;
    struct captured {
        std::vector<uint64_t> sig;
        cudaGraphExec_t exec;
        uint64_t last_used;
        std::vector<std::pair<mm_key, mm_choice>> mm_used;
    };
    std::vector<captured> execs_;
    uint64_t clock_ = 0;
    void drop_graphs();

    // The matmul kernel table (autotuned, or empty: the defaults) and the
    // kernels the last launched graph used; a replayed graph used what it
    // used when it was captured.
    std::string gpu_name_;
    std::string table_path_;
    std::map<mm_key, mm_choice> table_;
    std::vector<std::pair<mm_key, mm_choice>> used_;
    int replayed_ = -1; // the index in execs_ of the graph the last run replayed
    // Synthetic operands that mm_time launches on.
    buffer tune_w_, tune_x_, tune_y_;
    mm_key tune_w_key_{};
    int tune_x_m_ = 0, tune_x_k_ = 0; // the shape of the activations in tune_x_

#if defined(SMOL_HAVE_BLAS)
    cublasHandle_t blas_ = nullptr;
    buffer blas_ws_;
#endif
};

// What launches() issues on stream_, captured into an instantiated graph; the
// GEMV, KV store and attention kernels launch early if pdl.
template <class F> cudaGraphExec_t cuda_backend::capture_graph(bool pdl, F && launches) {
    SMOL_GPU_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t cg = nullptr;
    pdl_now_ = pdl;
    try {
        launches();
        pdl_now_ = false;
    } catch (...) {
        pdl_now_ = false;
        (void)cudaStreamEndCapture(stream_, &cg);
        if (cg) (void)cudaGraphDestroy(cg);
        (void)cudaGetLastError();
        throw;
    }
    SMOL_GPU_CHECK(cudaStreamEndCapture(stream_, &cg));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, cg, 0);
    (void)cudaGraphDestroy(cg);
    if (e != cudaSuccess) gpu_fail(e, "cudaGraphInstantiate");
    return exec;
}

cuda_backend::cuda_backend(int device) : device_(device), name_("cuda:" + std::to_string(device)) {
    activate();
    SMOL_GPU_CHECK(cudaDeviceGetAttribute(&n_sm_, cudaDevAttrMultiProcessorCount, device_));
    int l2 = 0;
    SMOL_GPU_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device_));
    l2_bytes_ = size_t(std::max(l2, 0));
    cudaDeviceProp prop{};
    SMOL_GPU_CHECK(cudaGetDeviceProperties(&prop, device_));
    gpu_name_ = prop.name;
    table_path_ = default_table_path(gpu_name_);
    load_table();
    fuse_ = env_flag("SMOL_CUDA_FUSE", 1) != 0;
    attn_ = attn_kernel_from_env();
#if defined(SMOL_HIP)
    graphs_ = false; // not yet tried on ROCm
#else
    graphs_ = env_flag("SMOL_CUDA_GRAPHS", 1) != 0;
    // Only where the kernels were compiled with the waits (sm_90 and up):
    // code JIT-compiled from older PTX has none.
    cudaFuncAttributes fa{};
    SMOL_GPU_CHECK(cudaFuncGetAttributes(&fa, gemv_kernel<SMOL_TYPE_F16, false, 1, 1>));
    pdl_ = prop.major >= 9 && fa.ptxVersion >= 90 && env_flag("SMOL_CUDA_PDL", 1) != 0;
#endif
#if defined(SMOL_FLASH_ATTENTION)
    // The decode kernel's block slots: the fewest any of its dense forms
    // has (they split long histories of one sequence to fill the GPU once;
    // the forms that walk pages serve batches of many sequences).
    dec_slots_ = INT_MAX;
    for (int gb = 1; gb <= dec_max_heads; ++gb) {
        with_dec_heads(gb, [&](auto g) {
            constexpr int GB = decltype(g)::value;
            for (const auto kernel : {decode_attention_kernel<64, GB, dec_form::dense>,
                                      decode_attention_kernel<64, GB, dec_form::pages>,
                                      decode_attention_kernel<64, GB, dec_form::warp_pages>}) {
                SMOL_GPU_CHECK(cudaFuncSetAttribute(
                    kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dec_smem<64>())));
            }
            int per_sm = 0;
            SMOL_GPU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                &per_sm, decode_attention_kernel<64, GB, dec_form::dense>, dec_warps * warp_size,
                dec_smem<64>()));
            dec_slots_ = std::min(dec_slots_, std::max(1, per_sm) * n_sm_);
        });
    }
#endif
    SMOL_GPU_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    SMOL_GPU_CHECK(cudaStreamCreateWithFlags(&h2d_, cudaStreamNonBlocking));
    SMOL_GPU_CHECK(cudaStreamCreateWithFlags(&d2h_, cudaStreamNonBlocking));
    SMOL_GPU_CHECK(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming));
    SMOL_GPU_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    for (cudaEvent_t & e : join_)
        SMOL_GPU_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    SMOL_GPU_CHECK(cudaEventRecord(staged_, stream_));
    // Attention's partial results for decode-sized batches need well under
    // this; having it from the start keeps the first decode from allocating.
    grow(work_, size_t(4) << 20, "work space");
    grow(done_, 4096 * sizeof(int), "attention counters");
    SMOL_GPU_CHECK(cudaMemsetAsync(done_.p, 0, done_.size, stream_));
#if defined(SMOL_HAVE_BLAS)
    SMOL_BLAS_CHECK(cublasCreate(&blas_));
    SMOL_BLAS_CHECK(cublasSetStream(blas_, stream_));
    // A workspace of our own keeps cuBLAS from allocating inside a graph
    // capture.
    grow(blas_ws_, size_t(32) << 20, "cuBLAS workspace");
    SMOL_BLAS_CHECK(cublasSetWorkspace(blas_, blas_ws_.p, blas_ws_.size));
#endif
}

cuda_backend::~cuda_backend() {
    // Errors here cannot be reported; free what can be freed.
    (void)cudaSetDevice(device_);
    if (stream_) (void)cudaStreamSynchronize(stream_);
    for (auto & c : execs_) (void)cudaGraphExecDestroy(c.exec);
#if defined(SMOL_HAVE_BLAS)
    if (blas_) cublasDestroy(blas_);
    (void)cudaFree(blas_ws_.p);
#endif
    for (buffer * b :
         {&arena_, &work_, &dyn_, &cells_, &rope_, &done_, &tune_w_, &tune_x_, &tune_y_})
        (void)cudaFree(b->p);
    if (host_stage_) (void)cudaFreeHost(host_stage_);
    for (const auto & [p, h] : host_) { // host blocks their callers did not release
        if (h.second)
            (void)cudaFreeHost(p);
        else
            std::free(p);
    }
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
    for (cudaEvent_t e : {staged_, fork_, join_[0], join_[1]})
        if (e) (void)cudaEventDestroy(e);
    for (cudaStream_t st : {h2d_, d2h_, stream_})
        if (st) (void)cudaStreamDestroy(st);
}

void cuda_backend::drop_graphs() {
    for (auto & c : execs_) (void)cudaGraphExecDestroy(c.exec);
    execs_.clear();
    prev_sig_.clear();
    prepared_ = false; // the steps may have chosen kernels by the old table
    replayed_ = -1;
}

void cuda_backend::charge(size_t n, const char * what) {
    if (mem_.limit && mem_.in_use + n > mem_.limit) {
        throw error(SMOL_ERR_OUT_OF_MEMORY,
                    name_ + ": cannot allocate " + std::to_string(n >> 20) + " MiB of " + what +
                        ": " + std::to_string(mem_.in_use >> 20) + " MiB of the " +
                        std::to_string(mem_.limit >> 20) +
                        " MiB budget are in use; raise --gpu-mem or lower the context or batch");
    }
    mem_.in_use += n;
    mem_.peak = std::max(mem_.peak, mem_.in_use);
}

void * cuda_backend::alloc(size_t bytes) {
    activate();
    charge(bytes, "device memory");
    void * p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 256));
    if (e != cudaSuccess) {
        mem_.in_use -= bytes;
        (void)cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        (void)cudaMemGetInfo(&free_b, &total_b);
        throw error(SMOL_ERR_OUT_OF_MEMORY,
                    name_ + ": cannot allocate " + std::to_string(bytes >> 20) +
                        " MiB of device memory (" + std::to_string(free_b >> 20) + " of " +
                        std::to_string(total_b >> 20) +
                        " MiB free); use a smaller context or model");
    }
    sizes_[p] = bytes;
    return p;
}

void cuda_backend::release(void * p) {
    if (!p) return;
    activate();
    SMOL_GPU_CHECK(cudaStreamSynchronize(stream_));
    SMOL_GPU_CHECK(cudaFree(p));
    if (const auto it = sizes_.find(p); it != sizes_.end()) {
        mem_.in_use -= it->second;
        sizes_.erase(it);
    }
}

// Host memory that copies use (offloaded KV, a step's logits) in
// page-locked memory, so copies run at the link's speed and can be captured
// in CUDA graphs; where the system refuses to lock that much, pageable
// memory, said aloud (its copies are several times slower).
void * cuda_backend::alloc_host(size_t bytes, bool & pinned, const char * what) {
    activate();
    void * p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocPortable);
    if (e == cudaSuccess) {
        pinned = true;
        mem_.host_pinned += bytes;
        host_[p] = {bytes, true};
        return p;
    }
    (void)cudaGetLastError();
    std::fprintf(stderr,
                 "smol: %s: cannot pin %zu MiB of host memory for %s (%s; %zu MiB pinned so "
                 "far); using pageable memory, whose copies are several times slower (raise the "
                 "locked-memory limit, ulimit -l, or lower the context)\n",
                 name_.c_str(), bytes >> 20, what, cudaGetErrorString(e), mem_.host_pinned >> 20);
    p = std::aligned_alloc(4096, align_up(std::max<size_t>(bytes, 1), 4096));
    if (!p) {
        throw error(SMOL_ERR_OUT_OF_MEMORY, name_ + ": cannot allocate " +
                                                std::to_string(bytes >> 20) +
                                                " MiB of host memory for " + what);
    }
    pinned = false;
    mem_.host_pageable += bytes;
    host_[p] = {bytes, false};
    return p;
}

void cuda_backend::release_host(void * p) {
    if (!p) return;
    activate();
    SMOL_GPU_CHECK(cudaStreamSynchronize(stream_));
    const auto it = host_.find(p);
    if (it == host_.end()) return;
    if (it->second.second) {
        mem_.host_pinned -= it->second.first;
        SMOL_GPU_CHECK(cudaFreeHost(p));
    } else {
        mem_.host_pageable -= it->second.first;
        std::free(p);
    }
    host_.erase(it);
}

// Copies go through the backend's stream, so they are ordered after any
// graph still running, and wait for completion before returning.
void cuda_backend::upload(void * dst, const void * src, size_t bytes) {
    activate();
    SMOL_GPU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    SMOL_GPU_CHECK(cudaStreamSynchronize(stream_));
}

void cuda_backend::download(void * dst, const void * src, size_t bytes) {
    activate();
    SMOL_GPU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    SMOL_GPU_CHECK(cudaStreamSynchronize(stream_));
}

void cuda_backend::memset(void * dst, int value, size_t bytes) {
    activate();
    SMOL_GPU_CHECK(cudaMemsetAsync(dst, value, bytes, stream_));
    SMOL_GPU_CHECK(cudaStreamSynchronize(stream_));
}

void cuda_backend::grow(buffer & b, size_t bytes, const char * what) {
    if (bytes <= b.size) return;
    SMOL_GPU_CHECK(cudaStreamSynchronize(stream_));
    // Captured graphs may point into the old buffer.
    drop_graphs();
    if (b.p) SMOL_GPU_CHECK(cudaFree(b.p));
    mem_.in_use -= b.size;
    b.p = nullptr;
    b.size = 0;
    const size_t n = align_up(bytes, size_t(1) << 16);
    charge(n, what);
    const cudaError_t e = cudaMalloc(&b.p, n);
    if (e != cudaSuccess) {
        mem_.in_use -= n;
        (void)cudaGetLastError();
        b.p = nullptr;
        throw error(SMOL_ERR_OUT_OF_MEMORY,
                    name_ + ": cannot allocate " + std::to_string(n >> 20) + " MiB of " + what);
    }
    b.size = n;
}

void cuda_backend::grow_host(size_t bytes) {
    if (bytes <= host_stage_size_) return;
    SMOL_GPU_CHECK(cudaStreamSynchronize(stream_));
    if (host_stage_) SMOL_GPU_CHECK(cudaFreeHost(host_stage_));
    host_stage_ = nullptr;
    host_stage_size_ = 0;
    const size_t n = align_up(bytes, size_t(1) << 16);
    SMOL_GPU_CHECK(cudaMallocHost(&host_stage_, n));
    host_stage_size_ = n;
}

// --- matmul kernel choice and its table -------------------------------------------

mm_key cuda_backend::key_of(const tensor * mm) {
    const tensor * w = mm->src[0];
    return mm_key{w->type, w->ne[1], w->ne[0], mm_bucket(mm->src[1]->ne[1])};
}

// Rows that the vector loads of the small-batch kernel can read: 8-element
// chunks, 16-byte aligned activations, 4-byte aligned weight rows.
bool vec_fits(const tensor * mm) {
    const tensor * w = mm->src[0];
    const tensor * x = mm->src[1];
    return w->ne[0] % 8 == 0 && x->nb[1] % 16 == 0 && w->nb[1] % 4 == 0;
}

bool cuda_backend::blas_fits(const tensor * mm) const {
#if defined(SMOL_HAVE_BLAS)
    return vec_fits(mm);
#else
    (void)mm;
    return false;
#endif
}

// Without a table: the token tile that holds the batch (up to 32); the
// GEMV takes two rows a warp and splits K over 2 or 4 warps a pair of rows
// when there are few pairs, so that enough warps are in flight. Quantized
// rows are half as long or less, and want twice the warps. Of the 27
// variants scripts/gemv-variants.cu timed on the H200 for each of its 22
// GEMVs of the 135M, 360M and 1.7B shapes, this came within 12% of the
// fastest in f16 and q4_1 and within 22% in q8_0 (the 1.7B's q, k, v);
// the autotune table picks per shape. choose() sends large batches to
// cuBLAS first.
mm_choice cuda_backend::default_small(const mm_key & key) const {
    mm_choice c;
    // Tiles of 4 tokens up to 8, then of 8: the H200's autotune chose them
    // most often for the three models' shapes (a tile of the whole batch
    // of 32 holds 32 accumulators a lane and leaves a quarter of the
    // blocks).
    c.mt = std::min(key.m, key.m <= 8 ? 4 : 8);
    if (key.m > 1) return c;
    c.r = key.n % 2 == 0 ? 2 : 1;
    const int64_t groups = key.n / c.r / (float_weights(key.type) ? 1 : 2);
    c.ks = groups < 16 * n_sm_ ? 4 : groups < 23 * n_sm_ ? 2 : 1;
    return c;
}

mm_choice cuda_backend::choose(const mm_key & key) const {
    const auto it = table_.find(key);
    if (it != table_.end()) {
#if !defined(SMOL_HAVE_BLAS)
        if (!it->second.blas) return it->second;
#else
        return it->second;
#endif
    }
#if defined(SMOL_HAVE_BLAS)
    // Float weights go to cuBLAS from the bucket of 32 tokens (17 and more),
    // and from the bucket of 8 (5 and more) once the bucket times the weight
    // bytes passes 16 MiB (48 MiB below 5 tokens): the small-batch kernels'
    // time grows with both, while cuBLAS, replayed in a graph, took 4-6 us
    // plus the weights' read on the H200. Its autotune chose cuBLAS for every
    // f16 shape of the 135M and 360M at 32 and 64 tokens, and the tiles at 8
    // up to 960 x 960 (2048 x 2048 at 4 tokens: tiles 8.3 against 16.7 us).
    const size_t elt = !float_weights(key.type) ? 0 : key.type == SMOL_TYPE_F32 ? 4 : 2;
    const double batch_bytes = double(key.n) * double(key.k) * double(elt) * double(key.m);
    const double float_mib = key.m >= 32 ? 0.0 : key.m >= 8 ? 16.0 : 48.0;
    // Quantized weights are dequantized to f16 first: cuBLAS took about
    // 14 us + 2.8 us a million weights, the small-batch tiles 0.37 us a
    // million weights a token (H200, q8_0 and q4_1 at 8 to 64 tokens).
    const double mw = double(key.n) * double(key.k) / 1e6;
    const bool blas = elt ? batch_bytes >= float_mib * 1024 * 1024 : key.m * mw > 7.6 * mw + 24.3;
    if (key.m > 32 || (key.m > 1 && blas)) return mm_choice{true, 1, 1, -1};
#endif
    return default_small(key);
}

// The small-batch kernel unless the table (or the default) sends the
// matmul to cuBLAS; odd shapes take the scalar kernel either way.
bool cuda_backend::small_mm(const tensor * mm) const {
    if (!vec_fits(mm)) return false;
    return !choose(key_of(mm)).blas;
}

void cuda_backend::note_used(const mm_key & key, const mm_choice & c) {
    for (const auto & u : used_) {
        const mm_choice & d = u.second;
        if (u.first == key && d.blas == c.blas && d.mt == c.mt && d.ks == c.ks && d.r == c.r &&
            d.kv == c.kv && d.kept == c.kept)
            return;
    }
    used_.push_back({key, c});
}

std::string cuda_backend::mm_used() const {
    const auto & list = replayed_ >= 0 && replayed_ < int(execs_.size())
                            ? execs_[size_t(replayed_)].mm_used
                            : used_;
    std::string out;
    for (const auto & [key, c] : list) {
        out += std::string(type_key_name(key.type)) + " " + std::to_string(key.n) + "x" +
               std::to_string(key.k) + " M=" + std::to_string(key.m) + ": " +
               (c.mt == 0 ? std::string("scalar") : choice_name(c)) + (c.kv ? " +kv_store" : "") +
               (c.kept ? " +sums where read" : "") + "\n";
    }
    return out;
}

// The table file: '#' comments, a line "gpu NAME", then one line per key:
// "TYPE N K M KERNEL [us]", KERNEL as choice_name writes it.
void cuda_backend::load_table() {
    table_.clear();
    std::ifstream in(table_path_);
    if (!in) {
        say_once("no matmul autotune table for " + gpu_name_ + " at " + table_path_ +
                 "; using the built-in kernel choice (smol-bench --autotune writes one)");
        return;
    }
    std::string line, gpu;
    std::map<mm_key, mm_choice> t;
    int bad = 0;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        if (line.rfind("gpu ", 0) == 0) {
            gpu = line.substr(4);
            continue;
        }
        std::istringstream ls(line);
        std::string type, family;
        mm_key key;
        if (!(ls >> type >> key.n >> key.k >> key.m >> family)) {
            ++bad;
            continue;
        }
        std::string rest, word;
        double us = -1;
        while (ls >> word) {
            if (word.rfind("mt=", 0) == 0 || word.rfind("ks=", 0) == 0 ||
                word.rfind("r=", 0) == 0) {
                rest += " " + word;
            } else {
                us = std::atof(word.c_str());
            }
        }
        bool type_ok = false;
        for (smol_type ty : {SMOL_TYPE_F32, SMOL_TYPE_F16, SMOL_TYPE_BF16, SMOL_TYPE_Q8_0,
                             SMOL_TYPE_Q4_0, SMOL_TYPE_Q4_1}) {
            if (type == type_key_name(ty)) {
                key.type = ty;
                type_ok = true;
            }
        }
        mm_choice c;
        if (!type_ok || !parse_choice(family + rest, c) || mm_bucket(key.m) != key.m) {
            ++bad;
            continue;
        }
        c.us = us;
        t[key] = c;
    }
    if (gpu != gpu_name_) {
        say_once("the matmul autotune table " + table_path_ + " is for " +
                 (gpu.empty() ? std::string("no named GPU") : gpu) + ", not " + gpu_name_ +
                 "; using the built-in kernel choice");
        return;
    }
    table_ = std::move(t);
    say_once("matmul kernels from " + table_path_ + " (" + std::to_string(table_.size()) +
             " entries" + (bad ? ", " + std::to_string(bad) + " unreadable lines skipped" : "") +
             ")");
}

std::string cuda_backend::mm_table_save(const std::string & path) const {
    const std::string to = path.empty() ? table_path_ : path;
    std::error_code ec;
    const std::filesystem::path parent = std::filesystem::path(to).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    std::ofstream out(to, std::ios::trunc);
    if (out) {
        out << "# smol matmul autotune table, written by smol-bench --autotune.\n"
               "# TYPE N K M KERNEL [us]: N weight rows (a fused launch's together), K their\n"
               "# width, M the batch bucket; us the measured time of one launch.\n";
        out << "gpu " << gpu_name_ << "\n";
        for (const auto & [key, c] : table_) {
            out << type_key_name(key.type) << ' ' << key.n << ' ' << key.k << ' ' << key.m << ' '
                << choice_name(c);
            if (c.us >= 0) out << ' ' << c.us;
            out << '\n';
        }
    }
    if (!out) {
        throw error(SMOL_ERR_IO, name_ + ": cannot write the autotune table to " + to +
                                     "; set SMOL_AUTOTUNE_FILE to a writable path");
    }
    return to;
}

std::vector<std::string> cuda_backend::mm_candidates(const mm_key & key) const {
    std::vector<std::string> out;
    if (key.k % 8 != 0) return out; // only the scalar kernel takes it
    const int top = std::min(key.m, 32);
    for (int mt : mm_tiles) {
        if (mt > top || mt * 4 < top) continue;
        for (int r : mm_rows) {
            if (r > 1 && (mt > 1 || key.n % r != 0)) continue;
            for (int ks : mm_splits) out.push_back(choice_name(mm_choice{false, mt, ks, -1, r}));
        }
    }
#if defined(SMOL_HAVE_BLAS)
    out.push_back("cublas");
#endif
    return out;
}

void cuda_backend::mm_choose(const mm_key & key, const std::string & candidate, double us) {
    mm_choice c;
    if (!parse_choice(candidate, c)) {
        throw error(SMOL_ERR_INVALID_ARGUMENT, name_ + ": no matmul kernel '" + candidate + "'");
    }
    c.us = us;
    table_[key] = c;
    drop_graphs(); // captured graphs launch the old choice
}

double cuda_backend::mm_time(const mm_key & key, const std::string & candidate) {
    activate();
    mm_choice c;
    if (!parse_choice(candidate, c) || key.k % 8 != 0 || key.n <= 0 || key.m <= 0) {
        throw error(SMOL_ERR_INVALID_ARGUMENT, name_ + ": cannot time '" + candidate + "' on " +
                                                   std::to_string(key.n) + "x" +
                                                   std::to_string(key.k));
    }
#if !defined(SMOL_HAVE_BLAS)
    if (c.blas) throw error(SMOL_ERR_UNSUPPORTED, name_ + ": this build has no BLAS");
#endif
    const int N = int(key.n), K = int(key.k), M = key.m;
    const size_t row_bytes = cpu::row_bytes(key.type, K);
    const mm_key wkey{key.type, key.n, key.k, 0};
    // A decode step reads each weight once and the rest of the model pushes
    // it out of L2 before the next step, so the timed launches cycle
    // through copies of the weights that fill twice the L2.
    const size_t w_bytes = row_bytes * size_t(N);
    const size_t copies = std::max<size_t>(1, (2 * l2_bytes_ + w_bytes - 1) / w_bytes);
    if (!(tune_w_key_ == wkey) || !tune_w_.p) {
        // 64 rows of random weights, repeated: the values do not change the time.
        grow(tune_w_, w_bytes * copies, "autotune weights");
        std::mt19937 rng(1);
        std::normal_distribution<float> d(0.0f, 0.02f);
        const int block = std::min(N, 64);
        std::vector<float> f(static_cast<size_t>(K));
        std::vector<uint8_t> rows(row_bytes * size_t(block));
        for (int r = 0; r < block; ++r) {
            for (float & v : f) v = d(rng);
            cpu::kernels_best().row_from_f32(key.type, f.data(),
                                             rows.data() + size_t(r) * row_bytes, K);
        }
        uint8_t * dst = static_cast<uint8_t *>(tune_w_.p);
        SMOL_GPU_CHECK(
            cudaMemcpyAsync(dst, rows.data(), rows.size(), cudaMemcpyHostToDevice, stream_));
        const size_t all_rows = size_t(N) * copies;
        for (size_t done = size_t(block); done < all_rows;) {
            const size_t n = std::min(done, all_rows - done);
            SMOL_GPU_CHECK(cudaMemcpyAsync(dst + done * row_bytes, dst, n * row_bytes,
                                           cudaMemcpyDefault, stream_));
            done += n;
        }
        SMOL_GPU_CHECK(cudaStreamSynchronize(stream_));
        tune_w_key_ = wkey;
    }
    grow(tune_x_, size_t(M) * size_t(K) * sizeof(float), "autotune activations");
    grow(tune_y_, size_t(M) * size_t(N) * sizeof(float), "autotune results");
    if (tune_x_m_ != M || tune_x_k_ != K) {
        // Random activations, as a model's would be.
        tune_x_m_ = M;
        tune_x_k_ = K;
        std::mt19937 rng(2);
        std::normal_distribution<float> d(0.0f, 1.0f);
        std::vector<float> x(size_t(M) * size_t(K));
        for (float & v : x) v = d(rng);
        SMOL_GPU_CHECK(cudaMemcpyAsync(tune_x_.p, x.data(), x.size() * sizeof(float),
                                       cudaMemcpyHostToDevice, stream_));
        SMOL_GPU_CHECK(cudaStreamSynchronize(stream_));
    }
    if (c.blas)
        grow(work_, blas_work_bytes(key.type, blas_pairs(key.type, M), N, K, M), "work space");

    mm_params p{};
    p.n_w = 1;
    p.w[0] = static_cast<const uint8_t *>(tune_w_.p);
    p.rows[0] = N;
    p.y[0] = static_cast<float *>(tune_y_.p);
    p.w_row_bytes = row_bytes;
    p.K = K;
    p.M = M;
    p.x = static_cast<const float *>(tune_x_.p);
    p.ldx = size_t(K);
    p.early = true; // rows copied in before the timing
    p.prefetch = gemv_prefetch(w_bytes);
    size_t next = 0;
    auto launch_once = [&] {
        p.w[0] = static_cast<const uint8_t *>(tune_w_.p) + (next++ % copies) * w_bytes;
#if defined(SMOL_HAVE_BLAS)
        if (c.blas) {
            blas_mm(key.type, p.w[0], row_bytes, N, K, p.x, p.ldx, M, p.y[0], size_t(N));
            return;
        }
#endif
        launch_mm_type<false>(key.type, p, N, c, stream_, pdl_now_);
        check_launch("mul_mat (autotune)");
    };
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    SMOL_GPU_CHECK(cudaEventCreateWithFlags(&e0, cudaEventDefault));
    SMOL_GPU_CHECK(cudaEventCreateWithFlags(&e1, cudaEventDefault));
    cudaGraphExec_t exec = nullptr;
    auto timed = [&](int reps) {
        SMOL_GPU_CHECK(cudaEventRecord(e0, stream_));
        if (exec) {
            SMOL_GPU_CHECK(cudaGraphLaunch(exec, stream_));
        } else {
            for (int i = 0; i < reps; ++i) launch_once();
        }
        SMOL_GPU_CHECK(cudaEventRecord(e1, stream_));
        SMOL_GPU_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        SMOL_GPU_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        return double(ms);
    };
    // A decode step replays its launches from a graph, back to back and the
    // GEMVs launched early: the timed launches run the same way, so that a
    // launch's host overhead (several us) does not hide a kernel's time.
    double us = 0;
    try {
        timed(2); // warm-up: code and weights into place
        // About 2 ms of launches, at least 5, at most 200; the best of three.
        const double once = std::max(timed(1), 1e-3);
        const int reps = std::clamp(int(2.0 / once), 5, 200);
        if (graphs_) {
            exec = capture_graph(pdl_, [&] {
                for (int i = 0; i < reps; ++i) launch_once();
            });
            timed(reps); // the first replay uploads the graph
        }
        us = 1e30;
        for (int i = 0; i < 3; ++i) us = std::min(us, 1000.0 * timed(reps) / reps);
    } catch (...) {
        if (exec) (void)cudaGraphExecDestroy(exec);
        (void)cudaEventDestroy(e0);
        (void)cudaEventDestroy(e1);
        throw;
    }
    if (exec) (void)cudaGraphExecDestroy(exec);
    (void)cudaEventDestroy(e0);
    (void)cudaEventDestroy(e1);
    return us;
}

// The split of one attention node: queries per block Q, cell streams per
// query W, and S splits over the cells (S > 1 only when the heads and
// tokens alone do not fill the GPU).
size_t cuda_backend::attn_splits(const tensor * t, int & Q, int & W) const {
    // The node's own query heads: a head group's launch must fill the GPU
    // by itself (groups run one after another). Resident and streamed groups
    // of one plan share G, so they split alike and sum in the same order.
    const int64_t group = t->iparams[1] / t->iparams[2];
    const int64_t n_q = t->kv.k ? int64_t(t->kv.h1 - t->kv.h0) * group : t->iparams[1];
    const int64_t n_tok = t->ne[1], queries = n_tok * n_q;
    // Few queries: a block each, its four warps splitting the cells. Many:
    // four queries a block, sharing the cells' loads through L1.
    Q = queries < 4 * n_sm_ ? 1 : 4;
    W = Q == 1 ? 4 : 1;
    if (Q > 1 || queries >= n_sm_) return 1;
    return size_t(std::min<int64_t>(64, (2 * n_sm_ + queries - 1) / queries));
}

// The flash kernel's splits over the cells for an attention node, or 0 where
// the classic kernel runs it. It splits only while the query tiles and heads
// alone leave SMs short of work: a prompt chunk after a long history, a
// small model.
int cuda_backend::flash_splits(const tensor * t) const {
#if defined(SMOL_FLASH_ATTENTION)
    const int n_tok = int(t->ne[1]), n_head = t->iparams[1], hd = t->iparams[3];
    const bool flash = hd == 64 && (attn_ == attn_kernel::flash ||
                                    (attn_ == attn_kernel::automatic && n_tok >= fa_min_tok));
    if (!flash) return 0;
    // Four blocks an SM keep enough loads in flight for a decode-sized batch
    // at long contexts.
    // A head group's node covers only its own query heads.
    const int n_q = t->kv.k ? (t->kv.h1 - t->kv.h0) * (n_head / t->iparams[2]) : n_head;
    const int blocks = (n_tok + fa_rows - 1) / fa_rows * n_q;
    int fs = std::min(64, std::max(1, (4 * n_sm_ + blocks - 1) / blocks));
    // A prompt's partials stay within n_tok x the layer's heads, the work
    // space the planner reserved before it chose the head groups.
    if (n_tok >= fa_rows) fs = std::min(fs, std::max(1, n_head / n_q));
    return fs;
#else
    (void)t;
    return 0;
#endif
}

// The decode kernel's splits over the cells for an attention node, or 0
// where another kernel runs it. Whether it runs is the whole layer's choice,
// so every head group of a plan takes the same kernel.
int cuda_backend::decode_splits(const tensor * t) const {
#if defined(SMOL_FLASH_ATTENTION)
    const int n_tok = int(t->ne[1]), n_head = t->iparams[1], n_head_kv = t->iparams[2];
    const int n_sub = decode_subs(n_head / n_head_kv);
    const int blocks = n_tok * n_head_kv * n_sub;
    // Each token's blocks read its cells alone, so the kernel pays for a
    // decode-sized batch while its blocks fit the GPU at once, and for any
    // batch whose tokens are of different sequences: each then reads only
    // its own sequence's pages, where the flash kernel's tile of queries
    // would read every page for one of them.
    const bool dec = t->iparams[3] == 64 &&
                     (attn_ == attn_kernel::decode || attn_ == attn_kernel::decode_warps ||
                      (attn_ == attn_kernel::automatic &&
                       ((n_tok <= dec_max_tok && blocks <= dec_slots_) || seqs_apart_)));
    if (!dec) return 0;
    // As many splits as fill the GPU's block slots once (a second, partial
    // wave of blocks would leave most SMs idle while it ran), counting the
    // node's own kv heads: a head group's launch must fill the GPU by itself.
    // Resident and streamed groups of one plan share G, so they split alike
    // and sum in the same order.
    return std::clamp(dec_slots_ / decode_blocks(t), 1, dec_max_splits);
#else
    (void)t;
    return 0;
#endif
}

// The decode kernel's blocks for an attention node's own kv heads, a block
// a (token, kv head, part of its query heads).
int cuda_backend::decode_blocks(const tensor * t) const {
    const int n_kv = t->kv.k ? t->kv.h1 - t->kv.h0 : t->iparams[2];
    return int(t->ne[1]) * n_kv * decode_subs(t->iparams[1] / t->iparams[2]);
}

// The kernel an attention node takes, with its launch shape: the decode
// kernel for decode-sized batches, tensor cores for the rest of head size
// 64 (SMOL_ATTN=classic takes neither), the classic kernel otherwise. Over
// a cache of several sequences the decode kernel gives each warp a kv head
// where a block each would not fit the GPU at once (SMOL_ATTN=decode-warps:
// always); whether the cache holds several is known when a graph is staged.
cuda_backend::attn_choice cuda_backend::choose_attention(const tensor * t) const {
    attn_choice c;
    if ((c.S = decode_splits(t)) > 0) {
        c.kind = attn_kernel::decode;
        c.warps = attn_ == attn_kernel::decode_warps || decode_blocks(t) > dec_slots_;
    } else if ((c.S = flash_splits(t)) > 0) {
        c.kind = attn_kernel::flash;
    } else {
        c.S = int(attn_splits(t, c.Q, c.W));
    }
    return c;
}

// Whether every token of a batch is of a sequence of its own.
bool seqs_apart(const batch_info & b) {
    bool apart = b.seq && b.n_tokens > 1;
    seq_mask seen = seq_mask::none();
    for (int32_t i = 0; apart && i < b.n_tokens; ++i) {
        const seq_mask bit = seq_mask::of(b.seq[i]);
        apart = !(seen & bit);
        seen |= bit;
    }
    return apart;
}

void cuda_backend::make_steps(graph & g) {
    const auto & nodes = g.nodes();
    const size_t n = nodes.size();
    std::vector<int> uses(n, 0);
    for (const tensor * t : nodes) {
        for (const tensor * s : t->src) {
            if (s && s->kind != OP_NONE && s->node_index >= 0) ++uses[size_t(s->node_index)];
        }
    }
    if (n > 0) ++uses[n - 1]; // the caller reads the last node
    prepared_ = false;        // steps_ are remade for g
    steps_.assign(n, step{});
    for (size_t i = 0; i < n; ++i) steps_[i].t = nodes[i];
    seqs_apart_ = seqs_apart(g.batch);
    flash_steps_ = decode_steps_ = false;
    for (size_t i = 0; i < n; ++i) {
        if (nodes[i]->kind == OP_MUL_MAT) {
            steps_[i].kind = step_kind::mm;
            steps_[i].mm[0] = nodes[i];
            steps_[i].n_mm = 1;
        }
        if (nodes[i]->kind == OP_ATTENTION) {
            const attn_kernel k = choose_attention(nodes[i]).kind;
            flash_steps_ = flash_steps_ || k == attn_kernel::flash;
            decode_steps_ = decode_steps_ || k == attn_kernel::decode;
        }
    }
    if (!fuse_) return;

    auto is = [&](const tensor * x, op k) { return x && x->kind == k && x->node_index >= 0; };
    auto only_use = [&](const tensor * x, int n_uses) {
        return uses[size_t(x->node_index)] == n_uses && !steps_[size_t(x->node_index)].skip;
    };
    auto fold_norm = [&](step & s, tensor * x, int n_uses) {
        if (is(x, OP_RMS_NORM) && only_use(x, n_uses) && !x->data &&
            x->src[0]->ne[0] == s.mm[0]->src[0]->ne[0] && x->src[0]->nb[1] % 16 == 0) {
            s.norm = x;
            steps_[size_t(x->node_index)].skip = true;
        }
    };
    auto same_shape = [](const tensor * a, const tensor * b) {
        return a->ne[0] == b->ne[0] && a->ne[1] == b->ne[1] && a->nb[1] == b->nb[1];
    };

    for (size_t i = 0; i < n; ++i) {
        tensor * t = nodes[i];
        step & s = steps_[i];
        if (t->src[2]) continue;
        if ((t->kind == OP_KV_STORE || t->kind == OP_ATTENTION) && is(t->src[0], OP_ROPE) &&
            only_use(t->src[0], 1) && !t->src[0]->data) {
            // kv_store rotates k on its way into the cache, attention rotates
            // q as it loads it.
            s.kind = t->kind == OP_KV_STORE ? step_kind::kv_store : step_kind::attention;
            s.rope = t->src[0];
            s.extra = s.rope->src[0];
            steps_[size_t(s.rope->node_index)].skip = true;
        } else if (t->kind == OP_SWIGLU && is(t->src[0], OP_MUL_MAT) && is(t->src[1], OP_MUL_MAT)) {
            tensor * gt = t->src[0];
            tensor * up = t->src[1];
            if (only_use(gt, 1) && only_use(up, 1) && gt->src[1] == up->src[1] &&
                gt->src[0]->type == up->src[0]->type && same_shape(gt->src[0], up->src[0]) &&
                small_mm(gt) && !gt->data && !up->data) {
                s.kind = step_kind::mm_swiglu;
                s.mm[0] = gt;
                s.mm[1] = up;
                s.n_mm = 2;
                for (tensor * m : {gt, up}) {
                    steps_[size_t(m->node_index)].skip = true;
                    steps_[size_t(m->node_index)].kind = step_kind::plain;
                }
                fold_norm(s, gt->src[1], 2);
                s.extra = s.norm ? s.norm->src[0] : gt->src[1];
            }
        } else if (t->kind == OP_ADD) {
            for (int which : {1, 0}) {
                tensor * m = t->src[which];
                if (is(m, OP_MUL_MAT) && only_use(m, 1) && small_mm(m) && !m->data &&
                    same_shape(m, t) && same_shape(m, t->src[1 - which])) {
                    s.kind = step_kind::mm;
                    s.mm[0] = m;
                    s.n_mm = 1;
                    s.res = t->src[1 - which];
                    steps_[size_t(m->node_index)].skip = true;
                    steps_[size_t(m->node_index)].kind = step_kind::plain;
                    fold_norm(s, m->src[1], 1);
                    s.extra = s.norm ? s.norm->src[0] : m->src[1];
                    break;
                }
            }
        }
    }
    // Matmuls next to each other that read one input (q, k, v) run as one
    // launch, or through cuBLAS from one f16 copy of the input; a lone
    // matmul may still take its input's RMS norm. A cuBLAS matmul (not of f32
    // weights, which read f32) makes its f16 input from the norm or the
    // SwiGLU before it in one kernel.
    auto blas_f16 = [&](const tensor * m) {
        return !small_mm(m) && blas_fits(m) && m->src[0]->type != SMOL_TYPE_F32;
    };
    for (size_t i = 0; i < n; ++i) {
        tensor * t = nodes[i];
        if (steps_[i].kind != step_kind::mm || steps_[i].skip || steps_[i].res || t->src[2])
            continue;
        const bool blas = blas_f16(t);
        if (!blas && !small_mm(t)) continue;
        size_t j = i + 1;
        while (j < n && j < i + 3) {
            const tensor * u = nodes[j];
            if (steps_[j].kind != step_kind::mm || steps_[j].skip || steps_[j].res ||
                u->src[1] != t->src[1] || u->src[0]->type != t->src[0]->type ||
                u->src[0]->ne[0] != t->src[0]->ne[0] || u->src[0]->nb[1] != t->src[0]->nb[1] ||
                u->src[2] || nodes[j - 1]->data || (blas && !blas_f16(u))) {
                break;
            }
            ++j;
        }
        step & s = steps_[j - 1];
        s.n_mm = int(j - i);
        for (size_t k = i; k < j; ++k) {
            s.mm[k - i] = nodes[k];
            if (k + 1 < j) {
                steps_[k].skip = true;
                steps_[k].kind = step_kind::plain;
            }
        }
        fold_norm(s, t->src[1], s.n_mm);
        if (s.norm) s.extra = s.norm->src[0];
        // An element-wise node of kind k just before node `at`, which the
        // cuBLAS step's input kernel computes instead: the residual add
        // before the norm (the norm's kernel stores its sum) or the SwiGLU
        // before the matmul. Its sources are read before the matmuls write,
        // so they need live no longer than it.
        auto fold_before = [&](tensor * x, op k, size_t at) {
            if (!blas || !is(x, k) || size_t(x->node_index) + 1 != at || x->data || x->src[2] ||
                steps_[size_t(x->node_index)].kind != step_kind::plain ||
                steps_[size_t(x->node_index)].skip || !same_shape(x, x->src[0]) ||
                !same_shape(x, x->src[1])) {
                return false;
            }
            steps_[size_t(x->node_index)].skip = true;
            return true;
        };
        if (s.norm && fold_before(s.norm->src[0], OP_ADD, size_t(s.norm->node_index)))
            s.add = s.norm->src[0];
        tensor * glu = t->src[1];
        if (!s.norm && s.n_mm == 1 && is(glu, OP_SWIGLU) && only_use(glu, 1) &&
            glu->nb[1] == size_t(glu->ne[0]) * sizeof(float) && fold_before(glu, OP_SWIGLU, i))
            s.glu = glu;
        i = j - 1;
    }
#if defined(SMOL_HAVE_BLAS)
    // A cuBLAS step over bf16 pairs keeps its results as hi and lo, for the
    // kernels that read them to add as they load them (in place of a sum
    // launch), when those are all that read them and run right after it:
    // the next step's input kernel (the output projection's and down's
    // results through the residual add before its norm, gate's and up's
    // through its SwiGLU), or for q, k and v the cache store (rotating k)
    // and the attention after it (rotating q), whose partials then go past
    // them in the work space.
    auto next = [&](size_t i) {
        while (++i < n && steps_[i].skip) {
        }
        return i;
    };
    auto only = [&](const tensor * m) { return uses[size_t(m->node_index)] == 1; };
    for (size_t i = 0; i < n; ++i) {
        step & s = steps_[i];
        if (s.skip || s.kind != step_kind::mm || !blas_f16(s.mm[0]) || !step_pairs(s)) continue;
        const size_t j = next(i);
        if (j == n) continue;
        const size_t k = next(j);
        const step & u = steps_[j];
        const tensor * m = s.mm[0];
        if (s.n_mm == 1 && u.kind == step_kind::mm && u.add && only(m)) {
            s.keep_pairs = (u.add->src[0] == m) != (u.add->src[1] == m);
        } else if (s.n_mm == 2 && u.kind == step_kind::mm && u.glu && only(m) && only(s.mm[1])) {
            const tensor * g = u.glu->src[0];
            const tensor * up = u.glu->src[1];
            s.keep_pairs = (g == m && up == s.mm[1]) || (g == s.mm[1] && up == m);
        } else if (s.n_mm == 3 && k < n && u.kind == step_kind::kv_store &&
                   steps_[k].kind == step_kind::attention) {
            const tensor * read[3] = {unrotated(u), u.t->src[1], unrotated(steps_[k])};
            s.keep_pairs = true;
            for (const tensor * x : s.mm)
                s.keep_pairs =
                    s.keep_pairs && only(x) && std::count(std::begin(read), std::end(read), x) == 1;
        }
    }
#endif
    // The GEMV of q, k and v may store k and v in the cache itself: the
    // KV_STORE whose k (through its rope) and v are the launch's second and
    // third results, when nothing else reads them.
    for (size_t i = 0; i < n; ++i) {
        step & s = steps_[i];
        if (s.skip || s.kind != step_kind::kv_store || !s.rope) continue;
        const tensor * k = s.rope->src[0];
        const tensor * v = s.t->src[1];
        // (The matmuls' own steps are skipped: the launch stands at v.)
        if (!is(k, OP_MUL_MAT) || !is(v, OP_MUL_MAT) || uses[size_t(k->node_index)] != 1 ||
            uses[size_t(v->node_index)] != 1) {
            continue;
        }
        step & q = steps_[size_t(v->node_index)];
        if (q.kind == step_kind::mm && !q.skip && q.n_mm == 3 && q.mm[1] == k && q.mm[2] == v)
            q.store = s.t;
    }
}

// Work space of the planned steps: attention's split partials, cuBLAS's
// dequantized weights and f16 inputs.
size_t cuda_backend::step_work() const {
    size_t work = 0;
    size_t kept = 0; // where the results a step kept end (attention's partials go past them)
    for (const step & s : steps_) {
        if (s.skip) continue;
        const tensor * t = s.t;
        if (t->kind == OP_ATTENTION) {
            // Partials of (max, sum, accumulators) per (token, query head, split).
            const attn_choice a = choose_attention(t);
            const size_t n_tok = size_t(t->ne[1]), n_head = size_t(t->iparams[1]);
            const size_t partial = size_t(t->iparams[3] + 2) * sizeof(float);
            size_t part = 0;
            if (a.kind == attn_kernel::decode && a.S > 1) {
                // Blocks x splits stay within the GPU's block slots (or the
                // blocks alone, unsplit), whatever head group a node serves.
                const int group = t->iparams[1] / t->iparams[2];
                const size_t blocks = n_tok * size_t(t->iparams[2]) * size_t(decode_subs(group));
                // (The merge copies whole 16-byte pieces: up to 12 bytes past the end.)
                part =
                    std::max(size_t(dec_slots_), blocks) * size_t(decode_heads(group)) * partial +
                    16;
            } else if (a.kind == attn_kernel::flash && (a.S > 1 || n_tok >= size_t(fa_rows))) {
                // (query heads x splits) stays within the layer's heads for
                // prompts (see flash_splits), so one bound serves any head
                // grouping the planner may choose later.
                const size_t heads = n_tok >= size_t(fa_rows) ? n_head : n_head * size_t(a.S);
                part = n_tok * heads * partial;
            } else if (a.kind == attn_kernel::classic && a.S > 1) {
                part = n_tok * n_head * size_t(a.S) * partial;
            }
            work = std::max(work, kept + part);
        }
#if defined(SMOL_HAVE_BLAS)
        if (s.kind == step_kind::mm && !small_mm(s.mm[0])) {
            // One input; one dequantized weight at a time, or every GEMM's
            // two columns until the one launch that adds them (blas_gemms).
            const bool pairs = step_pairs(s);
            const int64_t K = s.mm[0]->src[0]->ne[0], M = s.mm[0]->src[1]->ne[1];
            size_t scratch = 0;
            int64_t widest = 0;
            for (int i = 0; i < s.n_mm; ++i) {
                const tensor * w = s.mm[i]->src[0];
                const size_t b = blas_scratch_bytes(w->type, pairs, w->ne[1], K, M);
                scratch = pairs ? scratch + b : std::max(scratch, b);
                widest = std::max(widest, w->ne[1]);
            }
            const size_t end = blas_scratch_offset(pairs, K, widest, M) + scratch;
            work = std::max(work, end);
            kept = s.keep_pairs ? end : 0;
        }
#endif
    }
    return work;
}

// What run(g) would hold: the arena, the work space, the rope table, the
// cell table and input staging, and the buffers made once (cuBLAS's work
// space, attention's counters).
size_t cuda_backend::compute_bytes(graph & g) {
    make_steps(g);
    for (step & s : steps_) {
        if (!s.skip && s.extra && s.extra->kind != OP_NONE) s.t->src[2] = s.extra;
    }
    plan_arena(g, 256, probe_);
    for (step & s : steps_) {
        if (!s.skip && s.extra && s.extra->kind != OP_NONE) s.t->src[2] = nullptr;
    }
    const size_t granule = size_t(1) << 16;
    auto grown = [&](size_t n) { return align_up(n, granule); };
    int64_t n_tok = 0;
    size_t rope = 0, staging = 256;
    for (const tensor * t : g.nodes()) {
        n_tok = std::max(n_tok, t->ne[1]);
        if (t->kind == OP_ROPE && rope == 0)
            rope = size_t(t->ne[1]) * size_t(t->iparams[1] / 2) * sizeof(float2);
        for (const tensor * src : t->src) {
            if (src && src->kind == OP_NONE && src->where == placement::host)
                staging += align_up(src->nbytes(), 256);
        }
    }
    staging += 3 * align_up(size_t(n_tok) * sizeof(int32_t), 256);
    const size_t cells = g.batch.kv ? cell_table_bytes(g.batch.kv->n_cells) : 0;
    size_t fixed = done_.size;
#if defined(SMOL_HAVE_BLAS)
    fixed += blas_ws_.size;
#endif
    return grown(probe_.arena_bytes) + grown(std::max(step_work(), size_t(4) << 20)) + grown(rope) +
           grown(cells) + grown(staging) + fixed;
}

// Plans the arena. A fused step reads tensors its node does not list as
// sources (the input of a folded norm or rope, say); it is given them as an
// extra source while plan_arena runs, so their memory lives long enough.
void cuda_backend::prepare(graph & g) {
    make_steps(g);
    const auto & nodes = g.nodes();
    for (step & s : steps_) {
        if (!s.skip && s.extra && s.extra->kind != OP_NONE) s.t->src[2] = s.extra;
    }
    arena_plan & p = plan_;
    plan_arena(g, 256, p);
    for (step & s : steps_) {
        if (!s.skip && s.extra && s.extra->kind != OP_NONE) s.t->src[2] = nullptr;
    }
    grow(arena_, p.arena_bytes, "compute memory");
    for (size_t i = 0; i < nodes.size(); ++i) {
        if (p.offset[i] != SIZE_MAX)
            nodes[i]->data = static_cast<uint8_t *>(arena_.p) + p.offset[i];
    }
    grow(work_, step_work(), "work space");
    // A counter per (token, head) of every attention split over cells (per
    // (query tile, head) for the flash kernel); a head group's launch may
    // split with more tokens than a whole layer's.
    size_t counters = 0;
    for (const step & s : steps_) {
        if (s.skip || s.t->kind != OP_ATTENTION) continue;
        const attn_choice a = choose_attention(s.t);
        if (a.S == 1) continue;
        const size_t n_tok = size_t(s.t->ne[1]), n_head = size_t(s.t->iparams[1]);
        const size_t rows = a.kind == attn_kernel::flash ? (n_tok + fa_rows - 1) / fa_rows : n_tok;
        counters = std::max(counters, rows * n_head);
    }
    if (counters * sizeof(int) > done_.size) {
        grow(done_, counters * sizeof(int), "attention counters");
        SMOL_GPU_CHECK(cudaMemsetAsync(done_.p, 0, done_.size, stream_));
    }
    // One table of rope angles serves every ROPE node that shares the first
    // one's positions, head size and base (in a llama, all of them).
    rope_key_ = nullptr;
    for (const tensor * t : nodes) {
        if (t->kind == OP_ROPE) {
            rope_key_ = t;
            break;
        }
    }
    if (rope_key_) {
        grow(rope_, size_t(rope_key_->ne[1]) * size_t(rope_key_->iparams[1] / 2) * sizeof(float2),
             "rope table");
    }
    if (g.batch.kv) {
        const size_t n = cell_table_bytes(g.batch.kv->n_cells);
        if (n > cells_.size) {
            grow(cells_, n, "cache cell table");
            shadow_kv_ = nullptr; // the device copy of the table is gone
        }
    }
}

// Copies what the graph reads from host memory into one device block: the
// batch (positions, sequences, cells), n_used, and every leaf that lives in
// host memory, whose data pointer is swapped for the copy's until run ends.
// Only the cells of the cache table that changed since the last run travel.
void cuda_backend::stage(graph & g) {
    const batch_info & b = g.batch;
    const int32_t n_tok = b.pos ? b.n_tokens : 0;
    std::vector<tensor *> leaves;
    for (tensor * t : g.nodes()) {
        for (tensor * s : t->src) {
            if (s && s->kind == OP_NONE && s->where == placement::host && s->data &&
                std::find(leaves.begin(), leaves.end(), s) == leaves.end()) {
                leaves.push_back(s);
            }
        }
    }
    const size_t tok_bytes = align_up(size_t(n_tok) * sizeof(int32_t), 256);
    size_t off = 256 + 3 * tok_bytes;
    std::vector<size_t> leaf_off(leaves.size());
    for (size_t i = 0; i < leaves.size(); ++i) {
        leaf_off[i] = off;
        off = align_up(off + leaves[i]->nbytes(), 256);
    }
    const size_t dyn_bytes = off;

    // The cache cells [lo, hi) whose position or sequence changed: with the
    // cache's version unchanged, among the batch's own cells; else anywhere.
    const kv_cache * kv = b.kv;
    int32_t lo = 0, hi = 0;
    if (kv) {
        if (shadow_kv_ != kv || shadow_pos_.size() != size_t(kv->n_cells)) {
            shadow_kv_ = kv;
            shadow_pos_.assign(size_t(kv->n_cells), INT32_MIN);
            shadow_seqs_.assign(size_t(kv->n_cells), seq_mask::all());
            shadow_version_ = ~uint64_t(0); // no version: compare every cell
            tiles_lo_ = INT32_MAX;
            tiles_hi_ = 0;
        }
        auto changed = [&](int32_t c) {
            if (kv->cell_pos[size_t(c)] >= 0) held_ |= kv->cell_seqs[size_t(c)];
            if (kv->cell_pos[size_t(c)] != shadow_pos_[size_t(c)] ||
                kv->cell_seqs[size_t(c)] != shadow_seqs_[size_t(c)]) {
                lo = std::min(lo, c);
                hi = std::max(hi, c + 1);
            }
        };
        lo = kv->n_used;
        if (shadow_version_ == kv->version && b.cell) {
            for (int32_t i = 0; i < n_tok; ++i) changed(b.cell[i]);
        } else {
            held_ = seq_mask::none();
            for (int32_t c = 0; c < kv->n_used; ++c) changed(c);
            shadow_version_ = kv->version;
        }
        if (hi < lo) hi = lo;
    }
    const size_t cell_bytes = size_t(hi - lo) * sizeof(int32_t);
    const size_t mask_bytes = size_t(hi - lo) * sizeof(seq_mask);
    // The tiles that hold a changed cell, summarised when an attention
    // kernel will read them.
    if (hi > lo) {
        tiles_lo_ = std::min(tiles_lo_, lo);
        tiles_hi_ = std::max(tiles_hi_, hi);
    }
    pages_ = kv && held_.several(); // cells of several sequences in use
    int32_t t_lo = 0, t_hi = 0;
    if (kv && (flash_steps_ || (decode_steps_ && pages_)) && tiles_hi_ > tiles_lo_) {
        t_lo = tiles_lo_ / cell_tile_cells;
        t_hi = int32_t((std::min<int64_t>(tiles_hi_, kv->n_cells) + cell_tile_cells - 1) /
                       cell_tile_cells);
        tiles_lo_ = INT32_MAX;
        tiles_hi_ = 0;
    }
    const size_t tile_bytes = size_t(t_hi - t_lo) * sizeof(cell_tile);
    grow(dyn_, dyn_bytes, "input staging");
    SMOL_GPU_CHECK(cudaEventSynchronize(staged_)); // the pinned buffer is free again
    grow_host(dyn_bytes + align_up(cell_bytes, 8) + mask_bytes + tile_bytes);

    uint8_t * h = static_cast<uint8_t *>(host_stage_);
    uint8_t * d = static_cast<uint8_t *>(dyn_.p);
    int32_t * params = reinterpret_cast<int32_t *>(h);
    params[0] = kv ? kv->n_used : 0;
    params[1] = n_tok;
    if (n_tok > 0) {
        std::memcpy(h + 256, b.pos, size_t(n_tok) * sizeof(int32_t));
        std::memcpy(h + 256 + tok_bytes, b.seq, size_t(n_tok) * sizeof(int32_t));
        if (b.cell) std::memcpy(h + 256 + 2 * tok_bytes, b.cell, size_t(n_tok) * sizeof(int32_t));
    }
    for (size_t i = 0; i < leaves.size(); ++i) {
        std::memcpy(h + leaf_off[i], leaves[i]->data, leaves[i]->nbytes());
    }
    SMOL_GPU_CHECK(cudaMemcpyAsync(d, h, dyn_bytes, cudaMemcpyHostToDevice, stream_));
    d_params_ = reinterpret_cast<int32_t *>(d);
    d_pos_ = reinterpret_cast<int32_t *>(d + 256);
    d_seq_ = reinterpret_cast<int32_t *>(d + 256 + tok_bytes);
    d_cell_ = reinterpret_cast<int32_t *>(d + 256 + 2 * tok_bytes);
    if (kv) {
        uint8_t * table = static_cast<uint8_t *>(cells_.p);
        d_cell_pos_ = reinterpret_cast<int32_t *>(table);
        d_cell_seqs_ = reinterpret_cast<uint64_t *>(table + cell_seqs_offset(kv->n_cells));
        d_cell_tiles_ = reinterpret_cast<cell_tile *>(table + cell_tiles_offset(kv->n_cells));
        uint8_t * hp = h + dyn_bytes;
        uint8_t * hm = hp + align_up(cell_bytes, 8);
        if (t_hi > t_lo) {
            cell_tile * ht = reinterpret_cast<cell_tile *>(hm + mask_bytes);
            for (int32_t i = t_lo; i < t_hi; ++i)
                ht[i - t_lo] = tile_of(*kv, int64_t(i) * cell_tile_cells);
            SMOL_GPU_CHECK(cudaMemcpyAsync(d_cell_tiles_ + t_lo, ht, tile_bytes,
                                           cudaMemcpyHostToDevice, stream_));
        }
        if (hi > lo) {
            std::memcpy(hp, kv->cell_pos.data() + lo, cell_bytes);
            // The masks' words as the device keeps them: two planes.
            uint64_t * hw = reinterpret_cast<uint64_t *>(hm);
            const size_t n = size_t(hi - lo);
            for (size_t i = 0; i < n; ++i) {
                hw[i] = kv->cell_seqs[size_t(lo) + i].w[0];
                hw[n + i] = kv->cell_seqs[size_t(lo) + i].w[1];
            }
            SMOL_GPU_CHECK(
                cudaMemcpyAsync(d_cell_pos_ + lo, hp, cell_bytes, cudaMemcpyHostToDevice, stream_));
            SMOL_GPU_CHECK(cudaMemcpy2DAsync(
                d_cell_seqs_ + lo, seq_plane_words(kv->n_cells) * sizeof(uint64_t), hw,
                n * sizeof(uint64_t), n * sizeof(uint64_t), 2, cudaMemcpyHostToDevice, stream_));
            std::copy(kv->cell_pos.begin() + lo, kv->cell_pos.begin() + hi,
                      shadow_pos_.begin() + lo);
            std::copy(kv->cell_seqs.begin() + lo, kv->cell_seqs.begin() + hi,
                      shadow_seqs_.begin() + lo);
        }
    }
    SMOL_GPU_CHECK(cudaEventRecord(staged_, stream_));
    swapped_.clear();
    for (size_t i = 0; i < leaves.size(); ++i) {
        swapped_.push_back({leaves[i], leaves[i]->data});
        leaves[i]->data = d + leaf_off[i];
    }
}

void cuda_backend::restore_leaves() {
    for (auto & [t, p] : swapped_) t->data = p;
    swapped_.clear();
}

// The words that decide what prepare makes of a graph, and so what a
// captured graph launches: every node's op, shape, sources (a node by its
// index, a leaf by its memory), views, copies, ordering and parameters, and
// whether the batch's tokens are of different sequences. Positions,
// sequences and cells are not in it: kernels read them from device memory.
void cuda_backend::structure(const graph & g) {
    sig_.clear();
    auto put = [&](uint64_t v) { sig_.push_back(v); };
    auto ptr = [&](const void * p) { put(uint64_t(reinterpret_cast<uintptr_t>(p))); };
    auto index = [](const tensor * t) { return t ? uint64_t(uint32_t(t->node_index)) : ~0ull; };
    put(g.nodes().size());
    put(seqs_apart(g.batch));
    for (const tensor * t : g.nodes()) {
        // What most nodes lack (a view of the cache, a copy, ordering
        // dependencies, memory of their own) is written only where present,
        // and the first word says which.
        const bool view = t->kv.k || t->kv.v, copy = t->kind == OP_COPY,
                   deps = t->deps[0] || t->deps[1], data = t->data;
        put(uint64_t(t->kind) | uint64_t(t->type) << 8 | uint64_t(t->where) << 16 |
            uint64_t(view) << 24 | uint64_t(copy) << 25 | uint64_t(deps) << 26 |
            uint64_t(data) << 27 | index(t->view_of) << 32);
        for (int d = 0; d < 4; ++d) put(uint64_t(t->ne[d]) ^ (uint64_t(t->nb[d]) << 40));
        for (const tensor * s : t->src) {
            if (!s) {
                put(0);
            } else if (s->node_index >= 0) {
                put(uint64_t(uint32_t(s->node_index)) << 8 | 1);
            } else {
                ptr(s->data);
                put(uint64_t(s->type) | uint64_t(s->where) << 8);
                put(uint64_t(s->ne[0]) ^ (uint64_t(s->ne[1]) << 32));
                put(s->nb[1]);
            }
        }
        put(uint64_t(uint32_t(t->iparams[0])) | uint64_t(uint32_t(t->iparams[1])) << 32);
        put(uint64_t(uint32_t(t->iparams[2])) | uint64_t(uint32_t(t->iparams[3])) << 32);
        uint64_t f;
        std::memcpy(&f, t->fparams, sizeof(f));
        put(f);
        if (data) ptr(t->data);
        if (view) {
            ptr(t->kv.k);
            ptr(t->kv.v);
            put(t->kv.head_stride);
            put(uint64_t(uint32_t(t->kv.h0)) | uint64_t(uint32_t(t->kv.h1)) << 32);
            put(uint32_t(t->kv.slot));
        }
        if (copy) {
            put(t->copy.width);
            put(t->copy.height);
            put(t->copy.dpitch ^ (t->copy.spitch << 1) ^ (uint64_t(t->copy.dir) << 62));
        }
        if (deps) {
            put(index(t->deps[0]));
            put(index(t->deps[1]));
        }
    }
    const kv_cache * kv = g.batch.kv;
    ptr(kv ? kv->k : nullptr);
    ptr(kv ? kv->v : nullptr);
    put(kv ? uint64_t(kv->n_cells) : 0);
}

// Everything a captured graph depends on: the structure, then the memory
// its kernels were given (the arena holds every intermediate at the plan's
// offsets) and the form the cache's sequences chose.
void cuda_backend::signature() {
    auto ptr = [&](const void * p) { sig_.push_back(uint64_t(reinterpret_cast<uintptr_t>(p))); };
    ptr(arena_.p);
    ptr(d_params_);
    ptr(d_cell_pos_);
    ptr(work_.p);
    ptr(rope_.p);
    ptr(done_.p);
    sig_.push_back(pages_);
}

void cuda_backend::reserve(graph & g) {
    activate();
    prepare(g);
    // The staging block of the largest batch this graph stands for.
    int64_t n_tok = 0;
    size_t host_bytes = 256;
    std::vector<const tensor *> leaves;
    for (tensor * t : g.nodes()) {
        n_tok = std::max(n_tok, t->ne[1]);
        for (tensor * s : t->src) {
            if (s && s->kind == OP_NONE && s->where == placement::host &&
                std::find(leaves.begin(), leaves.end(), s) == leaves.end()) {
                leaves.push_back(s);
                host_bytes += align_up(s->nbytes(), 256);
            }
        }
    }
    host_bytes += 3 * align_up(size_t(n_tok) * sizeof(int32_t), 256);
    grow(dyn_, host_bytes, "input staging");
    grow_host(host_bytes + (g.batch.kv ? cell_table_bytes(g.batch.kv->n_cells) : 0));
}

void cuda_backend::run(graph & g) {
    activate();
    const bool apart = seqs_apart(g.batch);
    const bool again = last_.again(g) && prepared_ && ran_apart_ == apart;
    last_.forget();
    if (again) {
        // The graph of the last run, as that run left it: the structure its
        // steps were made for, its nodes at their arena addresses.
        sig_ = prep_sig_;
    } else {
        if (g.rerun) {
            // Not taken again (its batch's sequences came apart or together,
            // or the steps were remade): its nodes go back to how they were
            // built, without the arena addresses a run gave them.
            const uint8_t * a = static_cast<const uint8_t *>(arena_.p);
            for (tensor * t : g.nodes()) {
                const uint8_t * d = static_cast<const uint8_t *>(t->data);
                if (a && d >= a && d < a + arena_.size) t->data = nullptr;
            }
        }
        structure(g);
        prepare(g);
        make_schedule(g, sched_);
        prep_sig_ = sig_;
        prepared_ = true;
    }
    auto ran_well = [&] {
        last_.ended(g);
        ran_apart_ = apart;
    };
    stage(g);
    // Events are made here, never while a stream is being captured.
    while (events_.size() < size_t(sched_.n_events)) {
        cudaEvent_t e = nullptr;
        SMOL_GPU_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        events_.push_back(e);
    }
    try {
        bool capture = false;
        bool capturable = graphs_;
        // Decode steps only (up to 32 tokens, whichever kernels their
        // matmuls take, or a token of each of up to 64 sequences): a
        // prompt's graph is dominated by its matmuls, and capturing it
        // costs more than its launches. Copies from pageable memory cannot
        // be captured.
        for (const tensor * t : g.nodes()) {
            capturable =
                capturable && (t->kind != OP_COPY || mem_.host_pageable == 0) &&
                (t->kind != OP_MUL_MAT || small_mm(t) || t->src[1]->ne[1] <= 32 || seqs_apart_);
        }
        if (capturable) {
            signature();
            for (captured & c : execs_) {
                if (c.sig == sig_) {
                    c.last_used = ++clock_;
                    replayed_ = int(&c - execs_.data());
                    SMOL_GPU_CHECK(cudaGraphLaunch(c.exec, stream_));
                    restore_leaves();
                    prev_sig_.swap(sig_);
                    ran_well();
                    return;
                }
            }
            // Capture the second time a graph comes: a decode step repeats,
            // a one-off prompt does not.
            capture = sig_ == prev_sig_;
        }
        if (!capture) {
            launch_all(g);
        } else {
            // Early launches only in captured decode steps: the copy program
            // orders kernels by events across streams too, and a prompt's
            // launches are few and long.
            cudaGraphExec_t exec =
                capture_graph(pdl_ && !sched_.has_copies(), [&] { launch_all(g); });
            if (execs_.size() >= 4) {
                auto old = std::min_element(execs_.begin(), execs_.end(),
                                            [](const captured & a, const captured & b) {
                                                return a.last_used < b.last_used;
                                            });
                (void)cudaGraphExecDestroy(old->exec);
                execs_.erase(old);
            }
            execs_.push_back({sig_, exec, ++clock_, used_});
            SMOL_GPU_CHECK(cudaGraphLaunch(exec, stream_));
        }
        prev_sig_.swap(sig_);
    } catch (...) {
        restore_leaves();
        throw;
    }
    restore_leaves();
    ran_well();
}

void cuda_backend::launch_all(graph & g) {
    used_.clear();
    replayed_ = -1;
    stored_ = nullptr;
    n_kept_ = 0;
    kept_end_ = 0;
    if (sched_.has_copies()) {
        launch_program(g);
        return;
    }
    if (rope_key_ && rope_key_->ne[1] > 0) {
        rope_params r = rope_for(rope_key_);
        r.table = nullptr;
        rope_table_kernel<<<unsigned(rope_key_->ne[1]), 64, 0, stream_>>>(
            r, static_cast<float2 *>(rope_.p));
        check_launch("rope_table");
    }
    for (const step & s : steps_) {
        if (!s.skip) launch(s, g.batch);
    }
}

void cuda_backend::copy_on(const tensor * t, cudaStream_t st) {
    const copy_desc & c = t->copy;
    if (c.height == 0) {
        SMOL_GPU_CHECK(
            cudaMemcpyAsync(t->data, t->src[0]->data, t->src[0]->nbytes(), cudaMemcpyDefault, st));
        return;
    }
    SMOL_GPU_CHECK(cudaMemcpy2DAsync(t->data, c.dpitch, t->src[0]->data, c.spitch, c.width,
                                     c.height, cudaMemcpyDefault, st));
}

// The schedule on three streams: instructions in issue order, each on its
// stream; events carry the dependencies across. The copy streams start
// after everything the compute stream was given before (the last step's
// readers of the slots), and the compute stream ends after both, so a step
// is whole when its compute stream is done (and captures as one graph).
void cuda_backend::launch_program(graph & g) {
    cudaStream_t streams[n_streams] = {stream_, h2d_, d2h_};
    SMOL_GPU_CHECK(cudaEventRecord(fork_, stream_));
    SMOL_GPU_CHECK(cudaStreamWaitEvent(h2d_, fork_, 0));
    SMOL_GPU_CHECK(cudaStreamWaitEvent(d2h_, fork_, 0));
    if (rope_key_ && rope_key_->ne[1] > 0) {
        rope_params r = rope_for(rope_key_);
        r.table = nullptr;
        rope_table_kernel<<<unsigned(rope_key_->ne[1]), 64, 0, stream_>>>(
            r, static_cast<float2 *>(rope_.p));
        check_launch("rope_table");
    }
    for (const auto & [st, idx] : sched_.issue) {
        const schedule::instr & in = sched_.prog[st][size_t(idx)];
        switch (in.what) {
        case schedule::kind::wait:
            SMOL_GPU_CHECK(cudaStreamWaitEvent(streams[st], events_[size_t(in.event)], 0));
            break;
        case schedule::kind::record:
            SMOL_GPU_CHECK(cudaEventRecord(events_[size_t(in.event)], streams[st]));
            break;
        case schedule::kind::run: {
            const step & s = steps_[size_t(in.node)];
            if (st != 0) {
                copy_on(s.t, streams[st]);
            } else if (!s.skip) {
                launch(s, g.batch);
            }
            break;
        }
        }
    }
    SMOL_GPU_CHECK(cudaEventRecord(join_[0], h2d_));
    SMOL_GPU_CHECK(cudaEventRecord(join_[1], d2h_));
    SMOL_GPU_CHECK(cudaStreamWaitEvent(stream_, join_[0], 0));
    SMOL_GPU_CHECK(cudaStreamWaitEvent(stream_, join_[1], 0));
}

int grid_for(size_t n, int threads) {
    return int(std::min<size_t>((n + threads - 1) / threads, 4096));
}

template <class T> T * data_of(const tensor * t) {
    return static_cast<T *>(t->data);
}

void cuda_backend::launch(const step & s, const batch_info & b) {
    tensor * t = s.t;
    switch (s.kind) {
    case step_kind::mm:
    case step_kind::mm_swiglu:
        run_mm(s, b);
        return;
    case step_kind::kv_store:
        run_kv_store(s, b);
        return;
    case step_kind::attention:
        run_attention(s, b);
        return;
    case step_kind::plain:
        break;
    }
    const tensor * a = t->src[0];
    if (t->kind != OP_KV_STORE && t->kind != OP_COPY && t->nbytes() == 0) return; // no work
    switch (t->kind) {
    case OP_NONE:
        return;
    case OP_GET_ROWS: {
        const int n = int(a->ne[0]);
        get_rows_kernel<<<unsigned(t->ne[1]), 256, 0, stream_>>>(
            int(a->type), data_of<const uint8_t>(a), a->nb[1], data_of<const int32_t>(t->src[1]),
            data_of<float>(t), t->nb[1] / 4, n);
        check_launch("get_rows");
        return;
    }
    case OP_RMS_NORM:
        rms_norm_kernel<float><<<unsigned(t->nrows()), 256, 0, stream_>>>(
            data_of<const float>(a), nullptr, 0, 0, nullptr, a->nb[1] / 4,
            data_of<const float>(t->src[1]), data_of<float>(t), t->nb[1] / 4, int(a->ne[0]),
            t->fparams[0]);
        check_launch("rms_norm");
        return;
    case OP_ADD: {
        const size_t n = size_t(t->ne[0]) * size_t(t->nrows());
        add_kernel<<<grid_for(n, 256), 256, 0, stream_>>>(
            data_of<const float>(a), data_of<const float>(t->src[1]), data_of<float>(t), n);
        check_launch("add");
        return;
    }
    case OP_SWIGLU: {
        const int K = int(t->ne[0]), M = int(t->nrows());
        swiglu_kernel<float><<<swiglu_grid(K, M), 256, 0, stream_>>>(
            data_of<const float>(a), data_of<const float>(t->src[1]), size_t(K), 0,
            data_of<float>(t), K, M);
        check_launch("swiglu");
        return;
    }
    case OP_ROPE:
        rope_kernel<<<unsigned(t->ne[1]), 128, 0, stream_>>>(
            data_of<const float>(a), a->nb[1] / 4, rope_for(t), data_of<float>(t), t->nb[1] / 4,
            t->iparams[0], t->iparams[1]);
        check_launch("rope");
        return;
    case OP_KV_STORE:
        run_kv_store(s, b);
        return;
    case OP_ATTENTION:
        run_attention(s, b);
        return;
    case OP_COPY:
        copy_on(t, stream_);
        return;
    case OP_MUL_MAT:
    case OP_COUNT:
        break;
    }
    throw error(SMOL_ERR_UNSUPPORTED,
                std::string(name_) + ": no kernel for op " + op_names[t->kind]);
}

// The parameters of the KV_STORE step s (with the rope make_steps folded
// into it, if any).
kv_store_params cuda_backend::kv_store_of(const step & s, const kv_cache & kv) const {
    const tensor & t = *s.t;
    const tensor * k = unrotated(s);
    const tensor * v = t.src[1];
    kv_store_params p;
    const source ks = source_of(k), vs = source_of(v);
    p.k = ks.p;
    p.v = vs.p;
    p.ldk = ks.ld;
    p.ldv = vs.ld;
    p.k_lo = ks.lo;
    p.v_lo = vs.lo;
    const kv_view view = node_kv_view(&t, kv);
    p.K = view.k;
    p.V = view.v;
    p.head_stride = view.head_stride;
    p.hd = kv.head_dim;
    p.h0 = view.h0;
    p.n_head_kv = view.h1 - view.h0;
    p.cell = d_cell_;
    p.rope = s.rope ? rope_for(s.rope) : rope_params{};
    const auto at = [](const void * q) { return reinterpret_cast<uintptr_t>(q); };
    p.vec = p.hd % 4 == 0 && p.ldk % 4 == 0 && p.ldv % 4 == 0 && p.k_lo % 4 == 0 &&
            p.v_lo % 4 == 0 && p.head_stride % 4 == 0 && (at(p.k) | at(p.v)) % 16 == 0 &&
            (at(p.K) | at(p.V)) % 8 == 0;
    return p;
}

void cuda_backend::run_kv_store(const step & s, const batch_info & b) {
    if (stored_ == s.t) { // the GEMV of q, k and v did it
        stored_ = nullptr;
        return;
    }
    const kv_store_params p = kv_store_of(s, *b.kv);
    const int n_tok = int(s.t->src[1]->ne[1]);
    const int pairs = p.n_head_kv * (p.hd / 2) / (p.vec ? 2 : 1);
    const unsigned threads =
        unsigned(std::min(1024, (pairs + warp_size - 1) / warp_size * warp_size));
    launch_kernel(kv_store_kernel, dim3(unsigned(n_tok)), dim3(threads), stream_, pdl_now_, p);
    check_launch("kv_store");
}

void cuda_backend::run_attention(const step & s, const batch_info & b) {
    const tensor * t = s.t;
    const kv_cache & kv = *b.kv;
    const tensor * q = unrotated(s);
    attn_params p;
    const source qs = source_of(q);
    p.q = qs.p;
    p.ldq = qs.ld;
    p.q_lo = qs.lo;
    p.out = data_of<float>(t);
    p.ldo = t->nb[1] / 4;
    // The node covers the query heads of its view's kv heads, with K and V
    // from the view's bases (a resident slice or a staging slot).
    const kv_view view = node_kv_view(t, kv);
    p.K = view.k;
    p.V = view.v;
    p.head_stride = view.head_stride;
    p.h0 = view.h0;
    p.n_kv = view.h1 - view.h0;
    p.n_head = t->iparams[1];
    p.group = t->iparams[1] / t->iparams[2];
    p.hd = t->iparams[3];
    p.n_tok = int(t->ne[1]);
    p.scale = 1.0f / std::sqrt(float(p.hd));
    p.pos = d_pos_;
    p.seq = d_seq_;
    p.cell = d_cell_;
    p.cell_pos = d_cell_pos_;
    p.cell_seqs = d_cell_seqs_;
    p.seq_plane = seq_plane_words(kv.n_cells);
    p.tiles = d_cell_tiles_;
    p.n_used = d_params_;
    const attn_choice a = choose_attention(t);
    p.S = a.S;
    p.Q = a.Q;
    p.W = a.W;
    // The partials go past any kept q, k and v in the work space.
    p.part = reinterpret_cast<float *>(static_cast<uint8_t *>(work_.p) + kept_end_);
    p.done = static_cast<int *>(done_.p);
    p.rope = s.rope ? rope_for(s.rope) : rope_params{};
    const int n_q = (view.h1 - view.h0) * p.group;
#if defined(SMOL_FLASH_ATTENTION)
    if (a.kind == attn_kernel::decode) {
        const int units = p.n_kv * decode_subs(p.group);
        const dec_form form = !pages_   ? dec_form::dense
                              : a.warps ? dec_form::warp_pages
                                        : dec_form::pages;
        if (form == dec_form::warp_pages) p.S = 1;
        const int ys = form == dec_form::warp_pages ? (units + dec_warps - 1) / dec_warps : units;
        const dim3 dgrid(unsigned(p.n_tok), unsigned(ys), unsigned(p.S));
        with_dec_heads(decode_heads(p.group), [&](auto g) {
            constexpr int gb = decltype(g)::value;
            launch_kernel_smem(
                form == dec_form::dense   ? decode_attention_kernel<64, gb, dec_form::dense>
                : form == dec_form::pages ? decode_attention_kernel<64, gb, dec_form::pages>
                                          : decode_attention_kernel<64, gb, dec_form::warp_pages>,
                dgrid, dim3(dec_warps * warp_size), dec_smem<64>(), stream_, pdl_now_, p);
        });
        check_launch("decode attention");
        return;
    }
    if (a.kind == attn_kernel::flash) {
        const dim3 fgrid(unsigned((p.n_tok + fa_rows - 1) / fa_rows), unsigned(n_q), unsigned(p.S));
        launch_kernel(flash_attention_kernel<64>, fgrid, dim3(4 * warp_size), stream_, pdl_now_, p);
        check_launch("flash attention");
        return;
    }
#endif
    const dim3 grid(unsigned((p.n_tok + p.Q - 1) / p.Q), unsigned(n_q), unsigned(p.S));
    const int threads = p.Q * p.W * warp_size;
    // Room for the streams' states, and for the split weights of the merge.
    const size_t smem = size_t(p.Q * p.hd + std::max(p.Q * p.W * (p.hd + 2), 64)) * sizeof(float);
    const int npl = (p.hd + 31) / 32;
    if (npl <= 1) {
        attention_kernel<1><<<grid, threads, smem, stream_>>>(p);
    } else if (npl <= 2) {
        attention_kernel<2><<<grid, threads, smem, stream_>>>(p);
    } else if (npl <= 4) {
        attention_kernel<4><<<grid, threads, smem, stream_>>>(p);
    } else if (npl <= 8) {
        attention_kernel<8><<<grid, threads, smem, stream_>>>(p);
    } else {
        throw error(SMOL_ERR_UNSUPPORTED, name_ + ": attention with head size " +
                                              std::to_string(p.hd) +
                                              " is not supported (at most 256)");
    }
    check_launch("attention");
}

// The angles of a ROPE node: from the run's table when the node's positions,
// head size and base are the table's.
rope_params cuda_backend::rope_for(const tensor * rope) const {
    rope_params r;
    r.pos = data_of<const int32_t>(rope->src[1]);
    r.half = rope->iparams[1] / 2;
    r.theta_scale = rope_theta_scale(rope->fparams[0], rope->iparams[1]);
    if (rope_key_ && rope->src[1] == rope_key_->src[1] &&
        rope->iparams[1] == rope_key_->iparams[1] && rope->fparams[0] == rope_key_->fparams[0]) {
        r.table = static_cast<const float2 *>(rope_.p);
    }
    return r;
}

// Whether a GEMV over K columns, KS warps a row group, gives each lane
// exactly two chunks of a row. Over float weights, one or two rows a warp,
// it then reads both at once: one trip to memory where there were two,
// before the wait too. On the H200 a chain of the 135M step's GEMVs alone
// (scripts/gemv-grid-lab.cu) went from 300 to 277 us (its gate, up and
// down pair); the 1.7B's, whose lanes have four chunks or more, stayed as
// they were, and reading all of a lane's chunks at once made them 13%
// slower. Whole steps: 360M tg128 1.03-1.04x, 135M and 1.7B level
// (BENCHMARKS.md).
inline bool gemv_pair(int K, int KS) {
    return (K / 8 + KS * warp_size - 1) / (KS * warp_size) == 2;
}

// Calls f(std::integral_constant<int, N>) for N = 1, 2 or 4 (n above 4
// as 4): a split of K over warps, a GEMV's rows a warp.
template <typename F> void with_1_2_4(int n, F && f) {
    if (n >= 4) {
        f(std::integral_constant<int, 4>{});
    } else if (n == 2) {
        f(std::integral_constant<int, 2>{});
    } else {
        f(std::integral_constant<int, 1>{});
    }
}

// Launches the GEMV (c.mt = 1) or mm_small_kernel for weight type T with
// the rows a warp, token tile and split of a choice. Every weight's row
// count is a multiple of the GEMV's c.r (run_mm sees to it).
template <int T, bool SWIGLU>
void launch_mm_small(const mm_params & p, int total_rows, const mm_choice & c, cudaStream_t stream,
                     bool pdl) {
    const int threads = mm_warps * warp_size;
    if (c.mt <= 1) {
        with_1_2_4(c.r, [&](auto r) {
            with_1_2_4(c.ks, [&](auto ks) {
                constexpr int R = decltype(r)::value, KS = decltype(ks)::value;
                constexpr int rows_per_block = R * (mm_warps / KS);
                const dim3 grid(unsigned((total_rows + rows_per_block - 1) / rows_per_block),
                                unsigned(p.M));
                if constexpr (float_weights(T) && R <= 2) {
                    if (gemv_pair(p.K, KS)) {
                        launch_kernel(gemv_kernel<T, SWIGLU, KS, R, true>, grid, dim3(threads),
                                      stream, pdl, p);
                        return;
                    }
                }
                launch_kernel(gemv_kernel<T, SWIGLU, KS, R>, grid, dim3(threads), stream, pdl, p);
            });
        });
        return;
    }
    auto split = [&](auto mt) {
        with_1_2_4(c.ks, [&](auto ks) {
            constexpr int MT = decltype(mt)::value, KS = decltype(ks)::value;
            constexpr int rows_per_block = mm_warps / KS;
            const dim3 grid(unsigned((total_rows + rows_per_block - 1) / rows_per_block),
                            unsigned((p.M + MT - 1) / MT));
            // Batch tiles launched early measured slower (the 1.7B q8_0 at
            // 32 sequences: 883 against 1,067 tokens/s): only the GEMV is.
            launch_kernel(mm_small_kernel<T, MT, SWIGLU, KS>, grid, dim3(threads), stream, false,
                          p);
        });
    };
    if (c.mt <= 2) {
        split(std::integral_constant<int, 2>{});
    } else if (c.mt <= 4) {
        split(std::integral_constant<int, 4>{});
    } else if (c.mt <= 8) {
        split(std::integral_constant<int, 8>{});
    } else if (c.mt <= 16) {
        split(std::integral_constant<int, 16>{});
    } else {
        split(std::integral_constant<int, 32>{});
    }
}

// Calls f(std::integral_constant<int, T>) for a weight type T known at run
// time, so each kernel template is instantiated once per type and chosen here.
template <typename F> void with_weight_type(int type, F && f) {
    switch (type) {
    case SMOL_TYPE_F32:
        f(std::integral_constant<int, SMOL_TYPE_F32>{});
        break;
    case SMOL_TYPE_F16:
        f(std::integral_constant<int, SMOL_TYPE_F16>{});
        break;
    case SMOL_TYPE_BF16:
        f(std::integral_constant<int, SMOL_TYPE_BF16>{});
        break;
    case SMOL_TYPE_Q8_0:
        f(std::integral_constant<int, SMOL_TYPE_Q8_0>{});
        break;
    case SMOL_TYPE_Q4_0:
        f(std::integral_constant<int, SMOL_TYPE_Q4_0>{});
        break;
    case SMOL_TYPE_Q4_1:
        f(std::integral_constant<int, SMOL_TYPE_Q4_1>{});
        break;
    default:
        break;
    }
}

template <bool SWIGLU>
void launch_mm_type(int type, const mm_params & p, int rows, const mm_choice & c, cudaStream_t st,
                    bool pdl) {
    with_weight_type(
        type, [&](auto t) { launch_mm_small<decltype(t)::value, SWIGLU>(p, rows, c, st, pdl); });
}

#if defined(SMOL_HAVE_BLAS)
// y[M][N] = x[M][K] . W[N][K]^T on tensor cores, x from blas_input(), f32
// accumulation and result. With pairs (bf16 weights, M <= blas_pair_max_m) the weights are
// read as they are and x comes as bf16_hl pairs: y gets 2 M columns of
// results, for blas_gemms to add. Otherwise the operands are
// f16 (weights other than f16 dequantized into the scratch first; a bf16
// weight beyond f16's range would overflow, and trained llama weights stay
// far below it).
void cuda_backend::blas_gemm(int type, bool pairs, const uint8_t * w, size_t w_row_bytes, int N,
                             int K, int M, float * y, size_t ldy, uint8_t * scratch) {
    const float one = 1.0f, zero = 0.0f;
    const void * xin = blas_input();
    const void * wh = w;
    int ldw = int(w_row_bytes / 2);
    if (pairs) {
        SMOL_BLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, 2 * M, K, &one, w,
                                     CUDA_R_16BF, ldw, xin, CUDA_R_16BF, K, &zero, y, CUDA_R_32F,
                                     int(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return;
    }
    if (type != SMOL_TYPE_F16) {
        __half * d = reinterpret_cast<__half *>(scratch);
        const size_t chunks = size_t(N) * size_t(K / 8);
        const unsigned grid = unsigned(grid_for(chunks, 256));
        with_weight_type(type, [&](auto t) {
            constexpr int T = decltype(t)::value;
            if constexpr (T != SMOL_TYPE_F32 && T != SMOL_TYPE_F16)
                dequant_f16_kernel<T><<<grid, 256, 0, stream_>>>(w, w_row_bytes, K, N, d);
        });
        check_launch("dequant_f16");
        wh = d;
        ldw = K;
    }
    SMOL_BLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, wh, CUDA_R_16F,
                                 ldw, xin, CUDA_R_16F, K, &zero, y, CUDA_R_32F, int(ldy),
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// The same from f32 x, converted into the work space first; f32 weights
// through cublasSgemm.
void cuda_backend::blas_mm(int type, const uint8_t * w, size_t w_row_bytes, int N, int K,
                           const float * x, size_t ldx, int M, float * y, size_t ldy) {
    if (type == SMOL_TYPE_F32) {
        const float one = 1.0f, zero = 0.0f;
        SMOL_BLAS_CHECK(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one,
                                    reinterpret_cast<const float *>(w), int(w_row_bytes / 4), x,
                                    int(ldx), &zero, y, int(ldy)));
        return;
    }
    const bool pairs = blas_pairs(type, M);
    blas_input_of(pairs, x, ldx, K, M);
    blas_out o{type, w, w_row_bytes, N, y, ldy};
    blas_gemms(pairs, true, K, M, &o, 1);
}

// n GEMMs over the input at blas_input(), each into its output; with pairs
// each into two columns a token of its own in the scratch, then (with sum)
// all added into the outputs in one launch (blas_pair_sum_kernel) after the
// last, or else left there for the kernels that read them to add. Returns
// the end of the scratch the pairs' results took.
uint8_t * cuda_backend::blas_gemms(bool pairs, bool sum, int K, int M, blas_out * o, int n) {
    int widest = 0;
    for (int i = 0; i < n; ++i) widest = std::max(widest, o[i].N);
    uint8_t * scratch = blas_scratch(pairs, K, widest, M);
    pair_sums ps{};
    ps.M = M;
    for (int i = 0; i < n; ++i) {
        float * y = o[i].y;
        size_t ldy = o[i].ldy;
        if (pairs) {
            ps.y2[i] = reinterpret_cast<const float *>(scratch);
            ps.y[i] = y;
            ps.N[i] = o[i].N;
            ps.ldy[i] = ldy;
            y = reinterpret_cast<float *>(scratch);
            ldy = size_t(o[i].N);
            o[i].hl = y;
            scratch += blas_pair_bytes(o[i].N, M);
        }
        blas_gemm(o[i].type, pairs, o[i].w, o[i].w_row_bytes, o[i].N, K, M, y, ldy, scratch);
    }
    if (!pairs || !sum) return scratch;
    const dim3 grid(unsigned(grid_for(size_t(widest + 3) / 4, 256)), unsigned(n),
                    unsigned((M + 7) / 8));
    blas_pair_sum_kernel<<<grid, 256, 0, stream_>>>(ps);
    check_launch("blas_pair_sum");
    return scratch;
}

// x[M][K] as f16, or as bf16_hl pairs, at the start of the work space.
void cuda_backend::blas_input_of(bool pairs, const float * x, size_t ldx, int K, int M) {
    const unsigned grid = unsigned(grid_for(size_t(M) * K / 4, 256));
    if (pairs) {
        blas_input_kernel<<<grid, 256, 0, stream_>>>(x, ldx, K, M,
                                                     static_cast<bf16_hl *>(blas_input()));
    } else {
        blas_input_kernel<<<grid, 256, 0, stream_>>>(x, ldx, K, M,
                                                     static_cast<uint16_t *>(blas_input()));
    }
    check_launch("blas_input");
}

// A step's cuBLAS matmuls: their one input made once (converted, or from
// the folded RMS norm or SwiGLU), then a GEMM each.
void cuda_backend::run_blas(const step & s, const tensor * x, int K, int M) {
    for (int i = 0; i < s.n_mm; ++i) {
        mm_choice c{true, 1, 1, -1};
        c.kept = s.keep_pairs;
        note_used(key_of(s.mm[i]), c);
    }
    const tensor * w0 = s.mm[0]->src[0];
    // f32 weights take x as it is, through cublasSgemm (blas_mm).
    const bool f32 = w0->type == SMOL_TYPE_F32;
    const bool pairs = step_pairs(s);
    // The input's producer, for f16 or for bf16_hl pairs.
    auto make = [&](auto * xin) {
        using Out = std::remove_pointer_t<decltype(xin)>;
        const size_t ld = size_t(K) * (pairs ? 2 : 1);
        if (s.norm) {
            // With a folded add, x is the add's result, made here from its
            // sources (kept results as b: x + b = b + x).
            const tensor * a = s.add ? s.add->src[0] : x;
            const tensor * b = s.add ? s.add->src[1] : nullptr;
            if (b && source_of(a).lo) std::swap(a, b);
            const source bs = b ? source_of(b) : source{nullptr, 0, 0};
            rms_norm_kernel<Out><<<unsigned(M), 256, 0, stream_>>>(
                data_of<const float>(a), bs.p, bs.ld, bs.lo,
                s.add ? data_of<float>(s.add) : nullptr, a->nb[1] / 4,
                data_of<const float>(s.norm->src[1]), xin, ld, K, s.norm->fparams[0]);
            check_launch("rms_norm (cuBLAS input)");
        } else if (s.glu) {
            // Gate and up are both kept or both tensors (make_steps).
            const source g = source_of(s.glu->src[0]), u = source_of(s.glu->src[1]);
            swiglu_kernel<Out>
                <<<swiglu_grid(K, M), 256, 0, stream_>>>(g.p, u.p, g.ld, g.lo, xin, K, M);
            check_launch("swiglu (cuBLAS input)");
        } else {
            blas_input_of(pairs, data_of<const float>(x), x->nb[1] / 4, K, M);
        }
    };
    if (!f32 && pairs) make(static_cast<bf16_hl *>(blas_input()));
    if (!f32 && !pairs) make(static_cast<uint16_t *>(blas_input()));
    // What the step before kept, only the input's kernel read: from here
    // on the work space is this step's (as step_work counts it).
    n_kept_ = 0;
    kept_end_ = 0;
    if (f32) {
        blas_mm(int(w0->type), data_of<const uint8_t>(w0), w0->nb[1], int(w0->ne[1]), K,
                data_of<const float>(x), x->nb[1] / 4, M, data_of<float>(s.mm[0]),
                s.mm[0]->nb[1] / 4);
        return;
    }
    blas_out o[3];
    for (int i = 0; i < s.n_mm; ++i) {
        const tensor * m = s.mm[i];
        const tensor * w = m->src[0];
        o[i] = {int(w->type),  data_of<const uint8_t>(w), w->nb[1],
                int(w->ne[1]), data_of<float>(m),         m->nb[1] / 4};
    }
    const uint8_t * end = blas_gemms(pairs, !s.keep_pairs, K, M, o, s.n_mm);
    if (!s.keep_pairs) return;
    for (int i = 0; i < s.n_mm; ++i) kept_[i] = {s.mm[i], o[i].hl, o[i].N};
    n_kept_ = s.n_mm;
    kept_end_ = size_t(end - static_cast<const uint8_t *>(work_.p));
}
#endif

void cuda_backend::run_mm(const step & s, const batch_info & b) {
    const tensor * m0 = s.mm[0];
    const tensor * w = m0->src[0];
    const tensor * x = s.norm ? s.norm->src[0] : m0->src[1];
    const int K = int(w->ne[0]), M = int(m0->src[1]->ne[1]);
    if (!small_mm(m0)) {
        const mm_key key = key_of(m0);
#if defined(SMOL_HAVE_BLAS)
        if (blas_fits(m0)) {
            run_blas(s, x, K, M);
            return;
        }
#endif
        // Odd shapes: the scalar kernel, one launch per matmul.
        note_used(key, mm_choice{false, 0, 0, -1});
        for (int i = 0; i < s.n_mm; ++i) {
            const tensor * mi = s.mm[i];
            const tensor * wi = mi->src[0];
            const dim3 grid(unsigned((wi->ne[1] + mm_warps - 1) / mm_warps), unsigned(M));
            mm_scalar_kernel<<<grid, mm_warps * warp_size, 0, stream_>>>(
                int(wi->type), data_of<const uint8_t>(wi), wi->nb[1], K, int(wi->ne[1]),
                data_of<const float>(mi->src[1]), mi->src[1]->nb[1] / 4, data_of<float>(mi), M);
            check_launch("mm_scalar");
        }
        return;
    }
    mm_params p{};
    p.n_w = s.kind == step_kind::mm_swiglu ? 2 : s.n_mm;
    int total_rows = 0;
    for (int i = 0; i < p.n_w; ++i) {
        p.w[i] = data_of<const uint8_t>(s.mm[i]->src[0]);
        p.rows[i] = int(s.mm[i]->src[0]->ne[1]);
        p.y[i] = data_of<float>(s.mm[i]);
        total_rows += p.rows[i];
    }
    if (s.kind == step_kind::mm_swiglu || s.res) p.y[0] = data_of<float>(s.t);
    p.w_row_bytes = w->nb[1];
    p.K = K;
    p.M = M;
    p.x = data_of<const float>(x);
    p.ldx = x->nb[1] / 4;
    p.res = s.res ? data_of<const float>(s.res) : nullptr;
    p.ldr = s.res ? s.res->nb[1] / 4 : 0;
    p.norm_w = s.norm ? data_of<const float>(s.norm->src[1]) : nullptr;
    p.eps = s.norm ? s.norm->fparams[0] : 0.0f;
    // Weights are leaves of the graph, copied in before any step.
    p.early = true;
    for (int i = 0; i < p.n_w; ++i) p.early = p.early && s.mm[i]->src[0]->kind == OP_NONE;
    // A GEMV's prefetch pays where its weights take a small part of L2:
    // then the whole matrix is on its way while the kernel before ends
    // (the 135M model's GEMVs, up to 3.5 MB). With the 1.7B model's (8 to
    // 67 MB) its decode ran 611-632 tokens/s, 711-724 without, and its
    // GEMVs alone took 1,315 against 1,101 us (BENCHMARKS.md): matrices
    // that large push each other out of L2.
    p.prefetch = p.early && gemv_prefetch(size_t(total_rows) * w->nb[1]);
    // The launch's own key (all its rows), else the first matmul's, else
    // the default tile: a fused launch cannot go to cuBLAS.
    mm_key key{w->type, total_rows, K, mm_bucket(M)};
    mm_choice c = choose(key);
    if (c.blas) {
        key = key_of(m0);
        c = choose(key);
        if (c.blas) c = default_small(key);
    }
    // The GEMV's rows a warp must divide every weight's rows.
    for (int i = 0; i < p.n_w; ++i) {
        if (p.rows[i] % c.r != 0) c.r = 1;
    }
    // With rows in pairs (k's rope pairs) and no copy program to order the
    // cache's copies after kv_store, the GEMV stores k and v itself.
    if (s.store && c.mt == 1 && c.r % 2 == 0 && !sched_.has_copies()) {
        p.kv = kv_store_of(steps_[size_t(s.store->node_index)], *b.kv);
        stored_ = s.store;
        c.kv = true;
    }
    note_used(mm_key{w->type, total_rows, K, mm_bucket(M)}, c);
    if (s.kind == step_kind::mm_swiglu) {
        launch_mm_type<true>(int(w->type), p, p.rows[0], c, stream_, pdl_now_);
    } else {
        launch_mm_type<false>(int(w->type), p, total_rows, c, stream_, pdl_now_);
    }
    check_launch("mul_mat");
}

} // namespace

std::unique_ptr<backend> make_cuda_backend(int device) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        throw error(SMOL_ERR_BACKEND,
                    std::string("no " SMOL_GPU_VENDOR " device is available (") +
                        (e != cudaSuccess ? cudaGetErrorString(e) : "none found") +
                        "); run on the CPU with device \"cpu\"");
    }
    if (device < 0 || device >= n) {
        throw error(SMOL_ERR_BACKEND, "cuda:" + std::to_string(device) +
                                          " does not exist: this machine has " + std::to_string(n) +
                                          " " SMOL_GPU_VENDOR " device(s)");
    }
    return std::make_unique<cuda_backend>(device);
}

} // namespace smol
