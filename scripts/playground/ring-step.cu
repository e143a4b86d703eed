// The GEMVs of one SmolLM2-1.7B decode step (as in gemv-step.cu: q/k/v with
// the norm folded, output with the residual, gate/up with SwiGLU, down with
// the residual, then the head; f16 random weights, 3.4 GB), one launch a
// GEMV, in these forms:
// - smol's loop: gemv-lab.cuh's kernel with the built-in plans (each lane
//   loads its chunks from global memory), launched early.
// - ring_gemv: a block an SM, a producer lane that streams the block's rows
//   into a ring of shared-memory slots with bulk copies (cp.async.bulk), and
//   consumer warps that take whole rows from the slots on CUDA cores, read
//   in place or first copied to registers (the slot then goes back at once).
//   Launched early, the producer fills the ring before the block waits for
//   the kernel before it: weights depend on nothing, so the next GEMV's
//   first bytes arrive while the one before drains.
// - ring_mma: the same ring, the sums on tensor cores (mma.sync m16n8k16, x
//   as two f16 columns hi and lo), weights either packed ahead in mma's
//   fragment order (pack_kernel) and copied in 1D, or left row-major and
//   copied as 2D tensor boxes with the 128-byte swizzle and read with
//   ldmatrix.
// The forms are numbered: 0 the loop, then the ring's. Timing-only forms
// leave work out: the consumers release each slot unread (skip) or read
// half of each row (half K); their results are wrong by design and go
// unchecked. Every other form runs one step from fresh random weights and
// inputs (a new seed each run, printed) into poisoned (NaN) outputs, and its
// logits and residual stream must match a CPU reference (cpu_step, in
// double) within 1e-4 of each vector's largest magnitude, or the lab stops
// with exit status 1 before timing anything. Then each form is timed
// replayed from a CUDA graph, best of three runs of 50, with 0 or 2
// one-block kernels a layer where kv_store and attention stand (letting
// their successor launch after or, -2, before their wait). BENCHMARKS.md
// ("a GEMV fed by a ring of bulk copies") has the answers.
//
//   nvcc -O3 -std=c++20 -arch=sm_90 -I. -o ring-step scripts/playground/ring-step.cu
//   ./ring-step [--seed N] [check | a form's number, name, or part of it]
#include "gemv-lab.cuh"   // CK, warp_sum, griddep_*, launch, replay_us, the loop's kernel
#include "ring-parts.cuh" // mbarriers, bulk copies, mma

#include <array>
#include <cstring>
#include <cuda.h> // CUtensorMap (the encoder is reached through the runtime)
#include <map>
#include <thread>

// A GEMV of the chain (lab-common.cuh's Op) with the lab's switches.
struct RingOp : Op {
    // Timings only (results wrong): 1 the consumers release each slot
    // unread, 2 they read half of each row; 3: the residual is read when a
    // row's sum is done rather than with the input (results right).
    int skip;
    int pf; // the producer sends unit i + pf to L2 as it asks for unit i (0: none)
    // ring_mma's row-major form: w and wu as 2D tensors, boxes of 16 x 64
    // with the 128-byte swizzle
    CUtensorMap tm, tmu;
};

__device__ __forceinline__ void bulk_prefetch_l2(const void * src, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

// a += the eight f16 weights in raw times x[0..8) (a, b).
__device__ __forceinline__ float dot8h(uint4 raw, float4 a, float4 b) {
    const __half2 * h = reinterpret_cast<const __half2 *>(&raw);
    const float2 f0 = __half22float2(h[0]), f1 = __half22float2(h[1]), f2 = __half22float2(h[2]),
                 f3 = __half22float2(h[3]);
    return (f0.x * a.x + f0.y * a.y + f1.x * a.z + f1.y * a.w) +
           (f2.x * b.x + f2.y * b.y + f3.x * b.z + f3.y * b.w);
}

// The NC consumer warps' start, after the wait: x read through L2 (the
// kernel before wrote it) with the norm's weights applied, each float4 at
// element i handed to put(i, v); the residual's n rows from row0 into rs;
// then the norm's scale (1 without a norm), from the sum of squares the
// warps leave in red.
template <int NC, typename Put>
__device__ float consumers_start(const RingOp & o, Put put, float * red, float * rs, int row0,
                                 int n) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float ss = 0.0f;
    for (int i = threadIdx.x * 4; i < o.K; i += NC * 32 * 4) {
        float4 v = __ldcg(reinterpret_cast<const float4 *>(o.x + i));
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        if (o.nw) {
            const float4 w = *reinterpret_cast<const float4 *>(o.nw + i);
            v = make_float4(v.x * w.x, v.y * w.y, v.z * w.z, v.w * w.w);
        }
        put(i, v);
    }
    if (o.res && o.skip != 3)
        for (int i = threadIdx.x; i < n; i += NC * 32) rs[i] = __ldcg(o.res + row0 + i);
    ss = warp_sum(ss);
    if (lane == 0) red[warp] = ss;
    asm volatile("bar.sync 1, %0;" ::"n"(NC * 32) : "memory"); // consumers only
    if (!o.nw) return 1.0f;
    float t = 0.0f;
    for (int w = 0; w < NC; ++w) t += red[w];
    return rsqrtf(t / o.K + 1e-5f);
}

// Shared memory a ring GEMV block takes: S slots of R rows (and R up rows),
// the input, the barriers and the warps' sums of squares.
constexpr int max_block_rows = 256; // the residual's rows a block keeps
inline size_t ring_smem(int NC, int S, int R, bool sw, int K) {
    return size_t(S) * R * K * 2 * (sw ? 2 : 1) + size_t(K) * 4 + 2 * S * 8 + NC * 4 +
           max_block_rows * 4;
}

// NC consumer warps in NC / WPS groups and a producer warp; a ring of S
// slots, each of R whole rows; block b takes the units (R rows each)
// [rows/R * b / nb, rows/R * (b+1) / nb). Group g takes the units
// g, g + G, ...: slots s = i % S, all with s % G = g, each slot's rounds in
// order; warp t of a group takes rows t, t + WPS, ... of the slot.
// KCH > 0: each warp first loads its rows of the slot into registers (KCH
// chunks of 16 bytes a lane a row, K = 256 KCH), releases the slot, then
// sums; the slot goes back to the producer as soon as it is read.
template <int NC, int WPS, int S, int R, bool SW, int KCH = 0>
__global__ void __launch_bounds__((NC + 1) * 32) ring_gemv(const RingOp o) {
    constexpr int G = NC / WPS, RW = R / WPS;
    static_assert(NC % WPS == 0 && S % G == 0 && R % WPS == 0);
    extern __shared__ __align__(128) uint8_t sm[];
    const int K = o.K, slot = R * K * 2 * (SW ? 2 : 1);
    uint8_t * ring = sm;
    float * xs = reinterpret_cast<float *>(sm + size_t(S) * slot);
    uint64_t * full = reinterpret_cast<uint64_t *>(xs + K);
    uint64_t * empty = full + S;
    float * red = reinterpret_cast<float *>(empty + S);
    float * rs = red + NC; // the residual of the block's rows
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int n_u = o.rows / R;
    const int u0 = int((long long)n_u * blockIdx.x / gridDim.x);
    const int u1 = int((long long)n_u * (blockIdx.x + 1) / gridDim.x);
    ring_init(full, empty, S, WPS);
    __syncthreads();
    griddep_launch();
    if (warp == NC) { // the producer: weights are leaves, it never waits for the kernel before
        if (lane == 0) {
            const uint32_t bytes = uint32_t(R) * K * 2;
            for (int i = 0; u0 + i < u1; ++i) {
                const int s = i % S, round = i / S;
                if (round > 0) mbar_wait(empty + s, (round - 1) & 1);
                const size_t off = size_t(u0 + i) * R * K;
                if (o.pf && u0 + i + o.pf < u1) {
                    const size_t po = size_t(u0 + i + o.pf) * R * K;
                    bulk_prefetch_l2(o.w + po, bytes);
                    if (SW) bulk_prefetch_l2(o.wu + po, bytes);
                }
                mbar_expect(full + s, SW ? 2 * bytes : bytes);
                bulk_copy(ring + size_t(s) * slot, o.w + off, bytes, full + s);
                if (SW) bulk_copy(ring + size_t(s) * slot + bytes, o.wu + off, bytes, full + s);
            }
        }
        return;
    }
    griddep_wait();
    const int row0 = u0 * R;
    const float scale = consumers_start<NC>(
        o, [&](int i, float4 v) { *reinterpret_cast<float4 *>(xs + i) = v; }, red, rs, row0,
        (u1 - u0) * R);
    const int grp = warp / WPS, t = warp % WPS;
    for (int i = grp; u0 + i < u1; i += G) {
        const int s = i % S;
        mbar_wait(full + s, (i / S) & 1);
        if (o.skip == 1) {
            mbar_arrive_warp(empty + s);
            continue;
        }
        const __half * wt = reinterpret_cast<const __half *>(ring + size_t(s) * slot);
        const __half * ut = wt + size_t(R) * K;
        if constexpr (KCH > 0) {
            uint4 wv[KCH][RW], uv[SW ? KCH : 1][RW];
#pragma unroll
            for (int c = 0; c < KCH; ++c)
#pragma unroll
                for (int j = 0; j < RW; ++j) {
                    const size_t at = size_t(t + j * WPS) * K + 8 * lane + 256 * c;
                    wv[c][j] = *reinterpret_cast<const uint4 *>(wt + at);
                    if (SW) uv[c][j] = *reinterpret_cast<const uint4 *>(ut + at);
                }
            mbar_arrive_warp(empty + s); // read: the producer may refill it
            float a4[4][RW] = {}, u4[4][RW] = {};
#pragma unroll
            for (int c = 0; c < KCH; ++c) {
                const int kk = 8 * lane + 256 * c;
                const float4 a = *reinterpret_cast<const float4 *>(xs + kk);
                const float4 b = *reinterpret_cast<const float4 *>(xs + kk + 4);
#pragma unroll
                for (int j = 0; j < RW; ++j) {
                    a4[c % 4][j] += dot8h(wv[c][j], a, b);
                    if (SW) u4[c % 4][j] += dot8h(uv[c][j], a, b);
                }
            }
            float outv = 0.0f, outu = 0.0f;
#pragma unroll
            for (int j = 0; j < RW; ++j) {
                const float v = warp_sum((a4[0][j] + a4[1][j]) + (a4[2][j] + a4[3][j]));
                const float vu =
                    SW ? warp_sum((u4[0][j] + u4[1][j]) + (u4[2][j] + u4[3][j])) : 0.0f;
                if (lane == j) {
                    outv = v;
                    outu = vu;
                }
            }
            if (lane < RW) {
                float a = outv * scale;
                if (SW) a = silu_mul(a, outu * scale);
                const int row = (u0 + i) * R + t + lane * WPS;
                if (o.res) a += o.skip == 3 ? o.res[row] : rs[row - row0];
                o.y[row] = a;
            }
        } else {
            // Four chains of sums a row (chunks 4c + u), so that a slot's
            // reads are not held up behind one long chain of dependent adds.
            float acc[4][RW], accu[4][RW];
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
                for (int j = 0; j < RW; ++j) acc[u][j] = accu[u][j] = 0.0f;
            const int kend = o.skip == 2 ? K / 2 : K;
            for (int k = 8 * lane; k < kend; k += 1024) {
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int kk = k + 256 * u;
                    const float4 a = *reinterpret_cast<const float4 *>(xs + kk);
                    const float4 b = *reinterpret_cast<const float4 *>(xs + kk + 4);
#pragma unroll
                    for (int j = 0; j < RW; ++j) {
                        const size_t at = size_t(t + j * WPS) * K + kk;
                        acc[u][j] += dot8h(*reinterpret_cast<const uint4 *>(wt + at), a, b);
                        if (SW)
                            accu[u][j] += dot8h(*reinterpret_cast<const uint4 *>(ut + at), a, b);
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < RW; ++j) {
                acc[0][j] = (acc[0][j] + acc[1][j]) + (acc[2][j] + acc[3][j]);
                accu[0][j] = (accu[0][j] + accu[1][j]) + (accu[2][j] + accu[3][j]);
            }
            mbar_arrive_warp(empty + s); // this warp's rows are read
#pragma unroll
            for (int j = 0; j < RW; ++j) {
                acc[0][j] = warp_sum(acc[0][j]);
                if (SW) accu[0][j] = warp_sum(accu[0][j]);
            }
            if (lane < RW) {
                float a = acc[0][0], au = accu[0][0];
#pragma unroll
                for (int j = 1; j < RW; ++j)
                    if (lane == j) {
                        a = acc[0][j];
                        au = accu[0][j];
                    }
                a *= scale;
                if (SW) a = silu_mul(a, au * scale);
                const int row = (u0 + i) * R + t + lane * WPS;
                if (o.res) a += o.skip == 3 ? o.res[row] : rs[row - row0];
                o.y[row] = a;
            }
        }
    }
}

struct RingCfg {
    int nc, wps, s, r, kch;
    bool glu = false; // in ring_cfgs: compiled for gate/up with SwiGLU too
};
// The configurations compiled (consumer warps, warps a slot, slots, rows a
// slot, chunks a lane a row staged in registers or 0); with SwiGLU only
// those the plans below give gate/up (the others would spill).
constexpr RingCfg ring_cfgs[] = {
    {12, 1, 12, 4, 0},     {12, 1, 12, 2, 0, true}, {12, 1, 12, 1, 0}, {8, 1, 8, 4, 8},
    {8, 1, 8, 2, 8, true}, {8, 1, 8, 1, 32},        {8, 1, 16, 2, 8},  {8, 1, 16, 1, 8, true},
    {12, 1, 24, 2, 8},     {12, 1, 24, 1, 8, true}, {8, 1, 24, 2, 8},  {8, 1, 24, 1, 8},
};
template <bool SW, int I = 0> void ring_go(RingCfg c, const RingOp & o, cudaStream_t s, int n_sm) {
    if constexpr (I == sizeof(ring_cfgs) / sizeof(ring_cfgs[0])) {
        std::fprintf(stderr, "ring config %d %d %d %d%s not compiled\n", c.nc, c.wps, c.s, c.r,
                     SW ? " with SwiGLU" : "");
        std::exit(1);
    } else if constexpr (SW && !ring_cfgs[I].glu) {
        return ring_go<SW, I + 1>(c, o, s, n_sm);
    } else {
        constexpr RingCfg k = ring_cfgs[I];
        if (c.nc != k.nc || c.wps != k.wps || c.s != k.s || c.r != k.r || c.kch != k.kch)
            return ring_go<SW, I + 1>(c, o, s, n_sm);
        auto kernel = ring_gemv<k.nc, k.wps, k.s, k.r, SW, k.kch>;
        static bool set = false; // once a kernel: the attributes stay
        if (!set) {
            CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    227 * 1024));
            CK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
            set = true;
        }
        if (o.rows % k.r) {
            std::fprintf(stderr, "rows %d not a multiple of %d\n", o.rows, k.r);
            std::exit(1);
        }
        launch(kernel, dim3(n_sm), dim3((k.nc + 1) * 32), ring_smem(k.nc, k.s, k.r, SW, o.K), s,
               true, o);
    }
}

// A 16 x 16 f16 tile's mma fragments from four 8 x 8 matrices in shared
// memory (lane l gives the address of row l % 8 of matrix l / 8).
__device__ __forceinline__ uint4 ldmatrix4(uint32_t addr) {
    uint4 v;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}
// The box at (c0, c1) of the 2D tensor map tm into shared dst, counted on bar.
__device__ __forceinline__ void tensor_copy(void * dst, const CUtensorMap * tm, int c0, int c1,
                                            uint64_t * bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];" ::"r"(smem_u32(dst)),
                 "l"(reinterpret_cast<uint64_t>(tm)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
                 : "memory");
}

// Weights for ring_mma: smol's packed layout (ring_packed_at) in units of
// 16 rows x KU columns.
__global__ void pack_kernel(const __half * w, __half * out, int rows, int K, int KU) {
    const size_t n = size_t(rows) * K;
    for (size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x; e < n;
         e += size_t(gridDim.x) * blockDim.x)
        out[ring_packed_at(int(e / K), int(e % K), K, KU)] = w[e];
}

constexpr int mma_max_part = 3072; // floats: a block's (unit, row) sums, gate's and up's
inline size_t mma_smem(int NC, int S, int slot, int K) {
    return 1024 + size_t(S) * slot + size_t(K) * 4 + mma_max_part * 4 + 2 * S * 8 + NC * 4 +
           max_block_rows * 4;
}

// The ring with the arithmetic on tensor cores: weights packed by
// pack_kernel, a slot one unit (16 rows x 512 columns, 16 KB) or for SwiGLU
// gate's and up's units of 16 x 256 (8 KB each). x goes in as two f16
// columns of mma's b, hi = f16(x) and lo = f16(x - hi), so a row's sum is
// that of both columns. Block b takes the row tiles [n_rt * b / nb,
// n_rt * (b+1) / nb) and their units; warp w the units w, w + NC, ... (slots
// s = i % S with s % NC = w); the (unit, row) sums wait in shared memory
// and the block adds each row's in order at its end.
//
// KU: a unit's columns (gate's and up's each, for SwiGLU); STAGE: each warp
// first loads its slot's fragments into registers and releases the slot.
// TMA (with STAGE): the weights stay row-major; a unit comes as KU / 64
// tensor copies of 16 rows x 64 columns with the 128-byte swizzle, and
// ldmatrix reads the fragments.
template <int NC, int S, bool SW, int KU = SW ? 256 : 512, bool STAGE = false, bool TMA = false>
__global__ void __launch_bounds__((NC + 1) * 32) ring_mma(const __grid_constant__ RingOp o) {
    static_assert(S % NC == 0 && (!TMA || STAGE));
    constexpr int UB = 16 * KU * 2, slot = SW ? 2 * UB : UB, NT = KU / 16;
    extern __shared__ __align__(1024) uint8_t sm0[];
    // the swizzle's pattern is that of 1024-byte aligned addresses
    uint8_t * sm = sm0 + ((1024 - (smem_u32(sm0) & 1023)) & 1023);
    const int K = o.K, NS = K / KU;
    uint8_t * ring = sm;
    __half2 * xh = reinterpret_cast<__half2 *>(sm + size_t(S) * slot);
    __half2 * xl = xh + K / 2;
    float * part = reinterpret_cast<float *>(xl + K / 2);
    uint64_t * full = reinterpret_cast<uint64_t *>(part + mma_max_part);
    uint64_t * empty = full + S;
    float * red = reinterpret_cast<float *>(empty + S);
    float * rs = red + NC;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int n_rt = o.rows / 16;
    const int rt0 = int((long long)n_rt * blockIdx.x / gridDim.x);
    const int rt1 = int((long long)n_rt * (blockIdx.x + 1) / gridDim.x);
    const int u0 = rt0 * NS, u1 = rt1 * NS;
    ring_init(full, empty, S, 1);
    __syncthreads();
    griddep_launch();
    if (warp == NC) { // the producer
        if (lane == 0)
            for (int i = 0; u0 + i < u1; ++i) {
                const int s = i % S, round = i / S;
                if (round > 0) mbar_wait(empty + s, (round - 1) & 1);
                mbar_expect(full + s, slot);
                if constexpr (TMA) {
                    const int row = (u0 + i) / NS * 16, col = (u0 + i) % NS * KU;
                    for (int c = 0; c < KU / 64; ++c) {
                        tensor_copy(ring + size_t(s) * slot + c * 2048, &o.tm, col + 64 * c, row,
                                    full + s);
                        if (SW)
                            tensor_copy(ring + size_t(s) * slot + UB + c * 2048, &o.tmu,
                                        col + 64 * c, row, full + s);
                    }
                    continue;
                }
                const size_t off = size_t(u0 + i) * UB;
                bulk_copy(ring + size_t(s) * slot, reinterpret_cast<const uint8_t *>(o.w) + off, UB,
                          full + s);
                if (SW)
                    bulk_copy(ring + size_t(s) * slot + UB,
                              reinterpret_cast<const uint8_t *>(o.wu) + off, UB, full + s);
            }
        return;
    }
    griddep_wait();
    const int row0 = rt0 * 16, nrows = (rt1 - rt0) * 16;
    // x as f16 pairs hi = f16(x) and lo = f16(x - hi)
    const float scale = consumers_start<NC>(
        o, [&](int i, float4 v) { ring_split_x(v, xh, xl, i); }, red, rs, row0, nrows);
    const int g = lane >> 2, t = lane & 3;
    const __half2 * xb = g == 0 ? xh : xl; // lanes of columns 0 (hi) and 1 (lo)
    for (int i = warp; u0 + i < u1; i += NC) {
        const int s = i % S;
        mbar_wait(full + s, (i / S) & 1);
        if (o.skip == 1) {
            mbar_arrive_warp(empty + s);
            continue;
        }
        const int k0 = ((u0 + i) % NS) * KU;
        const uint4 * A = reinterpret_cast<const uint4 *>(ring + size_t(s) * slot);
        const uint4 * Au = reinterpret_cast<const uint4 *>(ring + size_t(s) * slot + UB);
        auto bfrag = [&](int kt, uint32_t & b0, uint32_t & b1) {
            ring_b_frag(xb, g, t, k0 + kt * 16, b0, b1);
        };
        if constexpr (STAGE) {
            uint4 av[NT], auv[SW ? NT : 1];
#pragma unroll
            for (int kt = 0; kt < NT; ++kt) {
                if constexpr (TMA) {
                    // lane l: row (l % 8) + 8 (l / 8 % 2), 16-byte unit 2 (kt % 4) + l / 16
                    // of the kt / 4-th 64-column chunk (16 lines of 128 bytes)
                    const int r = lane % 8 + 8 * (lane / 8 % 2), u = 2 * (kt % 4) + lane / 16;
                    const uint32_t off = (kt / 4) * 2048 + r * 128 + ((u ^ (r % 8)) * 16);
                    const uint32_t base = smem_u32(ring + size_t(s) * slot);
                    av[kt] = ldmatrix4(base + off);
                    if (SW) auv[kt] = ldmatrix4(base + UB + off);
                } else {
                    av[kt] = A[kt * 32 + lane];
                    if (SW) auv[kt] = Au[kt * 32 + lane];
                }
            }
            mbar_arrive_warp(empty + s); // read: the producer may refill it
            float d[4][4] = {}, du[4][4] = {};
#pragma unroll
            for (int kt = 0; kt < NT; ++kt) {
                uint32_t b0, b1;
                bfrag(kt, b0, b1);
                mma16816(d[kt % 4], av[kt], b0, b1);
                if (SW) mma16816(du[kt % 4], auv[SW ? kt : 0], b0, b1);
            }
            if (t == 0) {
                ring_row_sums(d, part + i * 16, g);
                if (SW) ring_row_sums(du, part + mma_max_part / 2 + i * 16, g);
            }
            continue;
        }
        // Eight chains of sums (tiles 8c + u), so that a slot's reads are
        // not held up behind one long chain of dependent mma.
        float d[8][4] = {}, du[8][4] = {};
        for (int kt = 0; kt < KU / 16; kt += 8) {
#pragma unroll
            for (int u = 0; u < 8; ++u) {
                uint32_t b0, b1;
                bfrag(kt + u, b0, b1);
                mma16816(d[u], A[(kt + u) * 32 + lane], b0, b1);
                if (SW) mma16816(du[u], Au[(kt + u) * 32 + lane], b0, b1);
            }
        }
#pragma unroll
        for (int e = 0; e < 4; ++e)
#pragma unroll
            for (int w = 4; w > 0; w >>= 1)
#pragma unroll
                for (int u = 0; u < w; ++u) {
                    d[u][e] += d[u + w][e];
                    du[u][e] += du[u + w][e];
                }
        auto & d0 = d[0];
        auto & du0 = du[0];
        mbar_arrive_warp(empty + s);
        if (t == 0) { // columns 0 and 1: rows g and g + 8
            part[i * 16 + g] = d0[0] + d0[1];
            part[i * 16 + g + 8] = d0[2] + d0[3];
            if (SW) {
                part[mma_max_part / 2 + i * 16 + g] = du0[0] + du0[1];
                part[mma_max_part / 2 + i * 16 + g + 8] = du0[2] + du0[3];
            }
        }
    }
    asm volatile("bar.sync 1, %0;" ::"n"(NC * 32) : "memory");
    if (o.skip == 1) return;
    for (int r = threadIdx.x; r < nrows; r += NC * 32) {
        const int lrt = r / 16, rr = r % 16;
        float a = 0.0f, au = 0.0f;
        for (int sg = 0; sg < NS; ++sg) {
            a += part[(lrt * NS + sg) * 16 + rr];
            if (SW) au += part[mma_max_part / 2 + (lrt * NS + sg) * 16 + rr];
        }
        a *= scale;
        if (SW) a = silu_mul(a, au * scale);
        if (o.res) a += rs[r];
        o.y[row0 + r] = a;
    }
}

// ring_mma in form f: 12 (6), 12 (6) warps on 12 slots of 16 KB units
// read in place; 108, 8 warps on 16 slots of 8 KB units staged in
// registers; 112, 12 warps on 24 such slots; 208, 108 on row-major weights
// through tensor copies. The down GEMV (K = 8192) takes 8 warps on 8 (12, 6)
// or 16 (the rest) slots.
template <bool SW> void mma_go(int f, const RingOp & o, cudaStream_t s, int n_sm) {
    auto go = [&](void (*kernel)(RingOp), int NC, int S) {
        static std::vector<void (*)(RingOp)> set; // kernels whose attributes are set
        if (std::find(set.begin(), set.end(), kernel) == set.end()) {
            CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    227 * 1024));
            CK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
            set.push_back(kernel);
        }
        // a slot: 16 KB units read in place, 8 KB units staged (16 or 24 slots)
        const int slot = S > 12 ? 8192 : 16384;
        launch(kernel, dim3(n_sm), dim3((NC + 1) * 32), mma_smem(NC, S, slot, o.K), s, true, o);
    };
    constexpr int ks = SW ? 128 : 256; // the staged units' columns
    if (f == 208)
        go(ring_mma<8, 16, SW, ks, true, true>, 8, 16);
    else if (f >= 100 && o.K > 2048)
        go(ring_mma<8, 16, SW, ks, true>, 8, 16);
    else if (f == 108)
        go(ring_mma<8, 16, SW, ks, true>, 8, 16);
    else if (f == 112)
        go(ring_mma<12, 24, SW, ks, true>, 12, 24);
    else if (o.K > 2048)
        go(ring_mma<8, 8, SW>, 8, 8);
    else if (f == 12)
        go(ring_mma<12, 12, SW>, 12, 12);
    else
        go(ring_mma<6, 12, SW>, 6, 12);
}

// smol's loop with the built-in plans (KS warps a group of R rows), launched
// early.
template <bool SW, int KS, int R> void loop_go(const RingOp & o, cudaStream_t s) {
    const int blocks = (o.rows / R + 4 / KS - 1) / (4 / KS);
    const size_t rb = size_t(o.K) * 2;
    P p{reinterpret_cast<const uint8_t *>(o.w),
        reinterpret_cast<const uint8_t *>(o.wu),
        o.y,
        o.rows,
        rb,
        o.K,
        o.x,
        o.nw,
        o.res};
    launch(gemv<F16, SW, KS, R, 1, true, 0>, dim3(blocks), dim3(128), 0, s, true, p);
}

// A one-block kernel where kv_store or attention stands; early: it lets its
// successor launch before it waits, as smol's decode attention does.
template <bool early> __global__ void tiny(float * y, int n) {
    if (early) griddep_launch();
    griddep_wait();
    if (!early) griddep_launch();
    if (int(threadIdx.x) < n) y[threadIdx.x] += 0.0f;
}

// One decode step of ops on the CPU, in double: weight e of the allocation
// at W is pw[e % pw.size()] (fill_weights' pattern), and each op's x, norm
// weights, residual and y are the host buffers that host maps its device
// pointers to; the same norm (of x before its weights), SwiGLU and
// residuals as the kernels.
void cpu_step(const std::vector<RingOp> & ops, const __half * W, const std::vector<float> & pw,
              std::map<const float *, std::vector<double>> & host) {
    const size_t P = pw.size();
    const unsigned n_thr = std::max(1u, std::thread::hardware_concurrency());
    for (const RingOp & op : ops) {
        const std::vector<double> & in = host.at(op.x);
        const std::vector<double> * nw = op.nw ? &host.at(op.nw) : nullptr;
        const std::vector<double> * res = op.res ? &host.at(op.res) : nullptr;
        double ss = 0;
        for (int k = 0; k < op.K; ++k) ss += in[k] * in[k];
        const double scale = nw ? 1 / std::sqrt(ss / op.K + 1e-5) : 1;
        std::vector<double> xin(op.K), out(op.rows);
        for (int k = 0; k < op.K; ++k) xin[k] = in[k] * (nw ? (*nw)[k] : 1);
        auto dot = [&](const __half * m, int r) {
            size_t j = (size_t(m - W) + size_t(r) * op.K) % P;
            double a = 0;
            for (int k = 0; k < op.K; ++k) {
                a += pw[j] * xin[k];
                if (++j == P) j = 0;
            }
            return a * scale;
        };
        std::vector<std::thread> thr;
        for (unsigned t = 0; t < n_thr; ++t)
            thr.emplace_back([&, t] {
                for (int r = int(t); r < op.rows; r += int(n_thr)) {
                    double a = dot(op.w, r);
                    if (op.wu) a = a / (1 + std::exp(-a)) * dot(op.wu, r);
                    out[r] = a + (res ? (*res)[r] : 0);
                }
            });
        for (std::thread & t : thr) t.join();
        std::vector<double> & y = host.at(op.y);
        std::copy(out.begin(), out.end(), y.begin());
    }
}

int main(int argc, char ** argv) {
    unsigned seed = std::random_device{}();
    const char * only = nullptr; // a form's number or (part of its) name, or "check"
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = unsigned(std::strtoul(argv[++i], nullptr, 10));
        else
            only = argv[i];
    }
    std::printf("seed %u (./ring-step --seed %u repeats these weights and inputs)\n", seed, seed);
    const int L = 24, D = 2048, F = 8192, V = 49152;
    const size_t qkv = size_t(3 * D) * D, o = size_t(D) * D, gu = size_t(2 * F) * D,
                 dn = size_t(D) * F, layer = qkv + o + gu + dn, head = size_t(V) * D;
    const size_t total = layer * L + head; // halves
    __half * W;
    CK(cudaMalloc(&W, total * 2));
    const std::vector<__half> pattern = fill_weights(W, total, seed, size_t(64) << 20);
    __half *Wp, *Wp2; // the same weights packed for ring_mma (16 KB and 8 KB units)
    CK(cudaMalloc(&Wp, total * 2));
    CK(cudaMalloc(&Wp2, total * 2));
    float *x, *x0, *nw, *q, *y2, *g;
    CK(cudaMalloc(&x, F * 4));
    CK(cudaMalloc(&x0, F * 4));
    CK(cudaMalloc(&nw, F * 4));
    CK(cudaMalloc(&q, 3 * D * 4));
    CK(cudaMalloc(&y2, V * 4));
    CK(cudaMalloc(&g, F * 4));
    std::mt19937 rng(seed + 1);
    const std::vector<float> hx0 = fill_floats(x0, F, rng);
    const std::vector<float> hnw = fill_floats(nw, F, rng, true);
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    int n_sm = 0;
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    std::printf("weights %.1f MB, floor at 4.2 TB/s %.1f us, %d SMs\n", total * 2 / 1e6,
                total * 2 / 4.2e6, n_sm);
    // The step's ops, with the in-place residual stream x.
    std::vector<RingOp> ops;
    for (int l = 0; l < L; ++l) {
        const __half * b = W + layer * l;
        ops.push_back({{b, nullptr, x, nw, nullptr, q, 3 * D, D}});
        ops.push_back({{b + qkv, nullptr, q, nullptr, x, x, D, D}});
        ops.push_back({{b + qkv + o, b + qkv + o + gu / 2, x, nw, nullptr, g, F, D}});
        ops.push_back({{b + qkv + o + gu, nullptr, g, nullptr, x, x, D, F}});
    }
    ops.push_back({{W + layer * L, nullptr, x, nw, nullptr, y2, V, D}});
    // Tensor maps for ring_mma's TMA form: each matrix rows x K, boxes of 16 x 64.
    {
        using Encode = CUresult (*)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                    const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                    const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                    CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
        void * fn = nullptr;
        cudaDriverEntryPointQueryResult q;
        CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                            &q));
        auto encode = reinterpret_cast<Encode>(fn);
        auto make = [&](CUtensorMap & tm, const __half * w, int rows, int K) {
            const cuuint64_t dim[2] = {cuuint64_t(K), cuuint64_t(rows)};
            const cuuint64_t stride[1] = {cuuint64_t(K) * 2};
            const cuuint32_t box[2] = {64, 16}, es[2] = {1, 1};
            const CUresult r =
                encode(&tm, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, (void *)w, dim, stride, box, es,
                       CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                       CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
            if (r != CUDA_SUCCESS) {
                std::fprintf(stderr, "cuTensorMapEncodeTiled: %d\n", int(r));
                std::exit(1);
            }
        };
        for (RingOp & op : ops) {
            make(op.tm, op.w, op.rows, op.K);
            if (op.wu) make(op.tmu, op.wu, op.rows, op.K);
        }
    }
    for (const RingOp & op : ops) {
        const int ku = op.wu ? 256 : 512;
        for (int half : {0, 1}) {
            __half * to = half ? Wp2 : Wp;
            pack_kernel<<<1024, 256>>>(op.w, op.w - W + to, op.rows, op.K, ku >> half);
            if (op.wu) pack_kernel<<<1024, 256>>>(op.wu, op.wu - W + to, op.rows, op.K, ku >> half);
        }
    }
    CK(cudaDeviceSynchronize());
    // Forms: ring_gemv's configuration for q/k/v, output, gate/up, down and
    // the head; Op::skip and Op::pf; mma: ring_mma's form (mma_go), or 0.
    struct Plan {
        const char * name;
        std::array<RingCfg, 5> c;
        int skip, pf;
        int mma;
    };
    // q/k/v, output, gate/up, down, head: 12 warps on 12 slots of 16 KB (4, 2,
    // 2 and 1 rows), read in place; 8 on 8 slots of 16 KB, staged in
    // registers; 8 (12) on 16 (24) slots of 8 KB, staged (down: 8 x 16 KB).
    using Cfg5 = std::array<RingCfg, 5>;
    constexpr Cfg5 r12 = {{{12, 1, 12, 4, 0},
                           {12, 1, 12, 2, 0},
                           {12, 1, 12, 2, 0},
                           {12, 1, 12, 1, 0},
                           {12, 1, 12, 4, 0}}};
    constexpr Cfg5 r8 = {
        {{8, 1, 8, 4, 8}, {8, 1, 8, 2, 8}, {8, 1, 8, 2, 8}, {8, 1, 8, 1, 32}, {8, 1, 8, 4, 8}}};
    constexpr Cfg5 r8s16 = {
        {{8, 1, 16, 2, 8}, {8, 1, 16, 2, 8}, {8, 1, 16, 1, 8}, {8, 1, 8, 1, 32}, {8, 1, 16, 2, 8}}};
    constexpr Cfg5 r12s24 = {{{12, 1, 24, 2, 8},
                              {12, 1, 24, 2, 8},
                              {12, 1, 24, 1, 8},
                              {8, 1, 8, 1, 32},
                              {12, 1, 24, 2, 8}}};
    const Plan plans[] = {
        {"ring 12", r12, 0, 0, 0},
        {"half K: ring 12", r12, 2, 0, 0},
        {"skip: ring 12", r12, 1, 0, 0},
        {"L2 ahead 24: ring 12", r12, 0, 24, 0},
        {"regs: ring 8", r8, 0, 0, 0},
        {"regs: ring 8 s16", r8s16, 0, 0, 0},
        {"regs: ring 12 s24", r12s24, 0, 0, 0},
        {"mma 12", {}, 0, 0, 12},
        {"regs: mma 8 s16", {}, 0, 0, 108},
        {"regs: mma 12 s24", {}, 0, 0, 112},
        {"tma: mma 8 s16", {}, 0, 0, 208},
        {"skip: mma 8 s16", {}, 1, 0, 108},
        {"skip: tma 8 s16", {}, 1, 0, 208},
    };
    const int n_plans = sizeof(plans) / sizeof(plans[0]);
    for (const Plan & pl : plans)
        for (int i = 0; i < 5 && !pl.mma; ++i) {
            const RingOp & op = i < 4 ? ops[i] : ops.back();
            std::printf("  %s op %d: %zu bytes of shared memory a block\n", pl.name, i,
                        ring_smem(pl.c[i].nc, pl.c[i].s, pl.c[i].r, op.wu, op.K));
        }
    // form -1: smol's loop; 0.. the ring plans. tinies: one-block kernels a
    // layer where kv_store and attention stand.
    auto record = [&](int form, int tinies) {
        for (size_t i = 0; i < ops.size(); ++i) {
            const RingOp & op = ops[i];
            const int kind = i + 1 == ops.size() ? 4 : int(i % 4);
            if (form < 0) {
                switch (kind) {
                case 0:
                    loop_go<false, 1, 2>(op, s);
                    break;
                case 1:
                    loop_go<false, 4, 2>(op, s);
                    break;
                case 2:
                    loop_go<true, 1, 2>(op, s);
                    break;
                case 3:
                    loop_go<false, 4, 2>(op, s);
                    break;
                default:
                    loop_go<false, 1, 2>(op, s);
                    break;
                }
            } else {
                RingOp ro = op;
                ro.skip = plans[form].skip;
                ro.pf = plans[form].pf;
                if (plans[form].mma) {
                    __half * to = plans[form].mma >= 200 ? W : plans[form].mma >= 100 ? Wp2 : Wp;
                    ro.w = op.w - W + to;
                    if (op.wu) ro.wu = op.wu - W + to;
                    if (op.wu)
                        mma_go<true>(plans[form].mma, ro, s, n_sm);
                    else
                        mma_go<false>(plans[form].mma, ro, s, n_sm);
                } else if (op.wu)
                    ring_go<true>(plans[form].c[kind], ro, s, n_sm);
                else
                    ring_go<false>(plans[form].c[kind], ro, s, n_sm);
            }
            // tinies < 0: -tinies of them, each letting its successor launch early
            if (kind == 0)
                for (int t = 0; t < std::abs(tinies); ++t)
                    launch(tinies < 0 ? tiny<true> : tiny<false>, dim3(1), dim3(128), 0, s, true, q,
                           64);
        }
    };
    // The CPU's step from the same x, then one step of each checked form
    // into poisoned outputs: logits and stream against the CPU's.
    std::vector<float> pw(pattern.size());
    for (size_t i = 0; i < pw.size(); ++i) pw[i] = __half2float(pattern[i]);
    std::map<const float *, std::vector<double>> host;
    host[x] = std::vector<double>(hx0.begin(), hx0.begin() + D);
    host[nw] = std::vector<double>(hnw.begin(), hnw.end());
    host[q] = std::vector<double>(3 * D);
    host[g] = std::vector<double>(F);
    host[y2] = std::vector<double>(V);
    cpu_step(ops, W, pw, host);
    const double tol = 1e-4;
    std::vector<float> got_y(V), got_x(D);
    bool all_ok = true;
    for (int form = -1; form < n_plans; ++form) {
        const char * name = form < 0 ? "smol's loop" : plans[form].name;
        if (form >= 0 && plans[form].skip) {
            std::printf("%2d %-24s timing only, not checked\n", form + 1, name);
            continue;
        }
        CK(cudaMemcpy(x, x0, F * 4, cudaMemcpyDeviceToDevice));
        poison(q, 3 * D);
        poison(g, F);
        poison(y2, V);
        record(form, 0);
        CK(cudaStreamSynchronize(s));
        CK(cudaGetLastError());
        CK(cudaMemcpy(got_y.data(), y2, V * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(got_x.data(), x, D * 4, cudaMemcpyDeviceToHost));
        std::printf("%2d %-24s", form + 1, name);
        bool ok = close_to(" logits", got_y, host[y2], tol);
        ok = close_to(", stream", got_x, host[x], tol) && ok;
        std::printf("\n");
        all_ok = all_ok && ok;
    }
    if (!all_ok) {
        std::printf("FAIL: a form's step differs from the CPU's (seed %u)\n", seed);
        return 1;
    }
    if (only && !std::strcmp(only, "check")) return 0; // the checks alone (for a profiler)
    const int only_n =
        only && std::strspn(only, "0123456789") == std::strlen(only) ? std::atoi(only) : -1;
    for (int round = 0; round < 2; ++round)
        for (int tinies : {0, 2, -2})
            for (int form = -1; form < n_plans; ++form) {
                if (only_n >= 0 ? form >= 0 && form + 1 != only_n
                                : only && form >= 0 && !std::strstr(plans[form].name, only))
                    continue;
                CK(cudaMemcpy(x, x0, F * 4, cudaMemcpyDeviceToDevice));
                const float us = replay_us(
                    s, [&] { record(form, tinies); }, 50, 3, 3);
                std::printf("round %d tiny/layer %2d  %2d %-24s step %7.1f us (%.0f%% of floor)\n",
                            round, tinies, form + 1, form < 0 ? "smol's loop" : plans[form].name,
                            us, 100 * (total * 2 / 4.2e6) / us);
                std::fflush(stdout);
            }
}
