// The GEMVs of one decode step (SmolLM2-1.7B's or 135M's shapes, f16 random
// weights), each launched early under programmatic dependent launch with its
// first weights read before the wait, as smol's gemv_kernel does, with a
// stand-in for each layer's attention between q/k/v and the output (a block
// a kv head of 256 threads with 140 KiB of shared memory, copying q). The
// question: scripts/chain-lab.cu found a link of such a chain costing 0.8 us
// with 132 blocks of 128 threads and 2.2 us with 1,024. Does a GEMV whose
// blocks are a few an SM, each warp taking row group after row group with
// the next group's first loads in flight (grid-stride), stream its weights
// as fast as one launch of a block a row group, and so save the difference
// at every link? And where a lane has few chunks of a row, does reading
// them at once save a trip to memory at every link?
//
// Variants: "one pass" is smol's loop (a row group a warp group, every
// group its own; the first U chunks of each row read before the wait, then
// U chunks after U chunks): U 1 as smol had it, 2 where a lane has two
// batches of one chunk (smol's gemv_pair since), all of a lane's chunks of
// a row at once, or 2 everywhere; KS forced to 1 or 2 where smol would take
// another (its sums then differ, as they must); 8 warps a block in place of
// 4. "Pipelined" loads the next U chunks before it uses the current ones,
// across row groups too; with B blocks an SM the grid holds B x SMs blocks
// and each warp takes row group after row group (grid-stride). KS warps
// share a group of R = 2 rows (by smol's rule, rows an SM, unless forced).
// Every variant but those that force KS sums in smol's order, so their
// logits must agree to the bit with the first.
//
// "Co-resident" variants ask a second question: a launch's blocks take an
// SM's warp slots and registers until they end, so the next GEMV's blocks
// start (and read their first chunks) only as those end. With at most half
// an SM's registers a launch (a cap through __launch_bounds__) and blocks
// a few an SM, grid-stride, two launches' blocks fit at once: the next one
// is resident and waiting when the one before ends. Does that save the
// link? Each prints the most registers a thread its kernels took.
//
// "Attention in the q/k/v GEMV's last blocks" asks a third: does a launch
// go for less if the stand-in attention moves into the GEMV before it, done
// by the block that ends a kv head's rows (a counter a head)?
//
//   nvcc -O3 -std=c++20 -arch=sm_90 -o gemv-grid-lab scripts/gemv-grid-lab.cu
//   ./gemv-grid-lab                       every variant
//   ./gemv-grid-lab 'co-resident|U 2'     the first and those whose names hold one
#include "../smol-cuda-rows.cuh"
#include "lab-common.cuh" // CK, warp_sum, launch, fill_weights, fill_floats

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_fp16.h>
#include <random>
#include <vector>

using chunk = smol::raw_chunk<SMOL_TYPE_F16>;

struct P {
    const uint8_t * w;  // rows x K f16
    const uint8_t * wu; // SwiGLU's up rows, or null
    float * y;
    int rows, K;
    const float * x;
    const float * nw;  // folded RMS norm weights, or null
    const float * res; // residual, or null
    // The q, k, v GEMV with the stand-in attention in its last blocks
    // (fuse: 1 with fences around the count, 2 with one acquire-release
    // add): a counter a kv head (D q rows in n_kv heads' groups, then n_kv k
    // and n_kv v heads of 64 rows); the block that ends a kv head's rows
    // copies its q heads into attn_out as the stand-in kernel does.
    int fuse = 0;
    int * done = nullptr;
    float * attn_out = nullptr;
    int D = 0, n_kv = 0;
};

template <bool SW, int KS, int R, int U, bool PIPE, int NW, int MINB = 0, int FUSE = 0>
__global__ void __launch_bounds__(NW * 32, MINB) gemv(const P p) {
    constexpr int GPB = NW / KS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, ks = warp % KS;
    const int n_groups = p.rows / R, gstep = int(gridDim.x) * GPB;
    const int stride = KS * 32, n_ch = p.K / 8, c_first = ks * 32 + lane;
    const size_t rb = size_t(p.K) * 2;
    chunk cw[U][R], cu[U][SW ? R : 1];
    auto fetch = [&](int g, int c0) {
        const uint8_t * wr = p.w + size_t(g) * R * rb;
        const uint8_t * wu = SW ? p.wu + size_t(g) * R * rb : nullptr;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int ch = min(c0 + u * stride, n_ch - 1);
#pragma unroll
            for (int j = 0; j < R; ++j) {
                cw[u][j].load(wr + j * rb, ch);
                if constexpr (SW) cu[u][j].load(wu + j * rb, ch);
            }
        }
    };
    const int g0 = int(blockIdx.x) * GPB + warp / KS;
    if (g0 < n_groups && c_first < n_ch) fetch(g0, c_first);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    __shared__ float part[NW][2 * R];
    __shared__ float pss[NW];
    for (int base = int(blockIdx.x) * GPB; base < n_groups; base += gstep) {
        const int g = base + warp / KS;
        const bool valid = g < n_groups;
        float acc[R], accu[R], ss = 0.0f;
#pragma unroll
        for (int j = 0; j < R; ++j) acc[j] = accu[j] = 0.0f;
        for (int c0 = c_first; valid && c0 < n_ch; c0 += U * stride) {
            // One pass: these chunks, read now (the first before the wait).
            // Pipelined: they were read before; the next ones go in flight
            // before these are used (this group's, else the first of the
            // warp's next group).
            // (With MINB, one pass goes over row groups grid-stride: a warp's
            // later groups read their first chunks here too.)
            if (!PIPE && (c0 != c_first || (MINB > 0 && base != int(blockIdx.x) * GPB)))
                fetch(g, c0);
            chunk w[U][R], wu[U][SW ? R : 1];
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
                for (int j = 0; j < R; ++j) {
                    w[u][j] = cw[u][j];
                    if constexpr (SW) wu[u][j] = cu[u][j];
                }
            }
            if (PIPE && c0 + U * stride < n_ch)
                fetch(g, c0 + U * stride);
            else if (PIPE && g + gstep < n_groups)
                fetch(g + gstep, c_first);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int ch = c0 + u * stride;
                if (ch >= n_ch) continue;
                int e0, e1;
                chunk::where(ch, e0, e1);
                float4 a, b;
                smol::x_chunk(p.x, p.nw, e0, e1, a, b, ss);
#pragma unroll
                for (int j = 0; j < R; ++j) {
                    float v[8];
                    w[u][j].decode(v);
                    acc[j] += smol::dot8(v, a, b);
                    if constexpr (SW) {
                        wu[u][j].decode(v);
                        accu[j] += smol::dot8(v, a, b);
                    }
                }
            }
        }
#pragma unroll
        for (int j = 0; j < R; ++j) {
            acc[j] = warp_sum(acc[j]);
            if (SW) accu[j] = warp_sum(accu[j]);
        }
        ss = warp_sum(ss);
        if constexpr (KS > 1) {
            if (lane == 0) {
                for (int j = 0; j < R; ++j) {
                    part[warp][j] = acc[j];
                    part[warp][R + j] = accu[j];
                }
                pss[warp] = ss;
            }
            __syncthreads();
            for (int j = 0; j < R; ++j)
                for (int i = 1; i < KS; ++i) {
                    acc[j] += part[warp - ks + i][j];
                    accu[j] += part[warp - ks + i][R + j];
                }
            for (int i = 1; i < KS; ++i) ss += pss[warp - ks + i];
            __syncthreads(); // part is free for the next group
        }
        if (ks == 0 && valid && lane < R) {
            float a = acc[0], au = accu[0];
#pragma unroll
            for (int j = 1; j < R; ++j)
                if (lane == j) {
                    a = acc[j];
                    au = accu[j];
                }
            if (p.nw) {
                const float s = rsqrtf(ss / p.K + 1e-5f);
                a *= s;
                au *= s;
            }
            if (SW) a = a / (1.0f + __expf(-a)) * au;
            const int r = g * R + lane;
            if (p.res) a += p.res[r];
            p.y[r] = a;
        }
    }
    if constexpr (FUSE) { // a block a row group's share: its rows lie in one head
        __shared__ int head;
        __syncthreads();
        if (threadIdx.x == 0) {
            constexpr int hd = 64;
            const int r0 = int(blockIdx.x) * GPB * R, qh = p.D / p.n_kv;
            const int h = r0 < p.D                 ? r0 / qh
                          : r0 < p.D + p.n_kv * hd ? (r0 - p.D) / hd
                                                   : (r0 - p.D - p.n_kv * hd) / hd;
            // 1: fences around the count; 2: one acquire-release add, the
            // block's writes ordered before it by the barrier above.
            int old;
            if constexpr (FUSE == 1) {
                __threadfence();
                old = atomicAdd(p.done + h, 1);
            } else {
                asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;"
                             : "=r"(old)
                             : "l"(p.done + h)
                             : "memory");
            }
            const bool last = old == (qh + 2 * hd) / (GPB * R) - 1;
            if (last) p.done[h] = 0; // for the next launch
            if constexpr (FUSE == 1) __threadfence();
            head = last ? h : -1;
        }
        __syncthreads();
        if (head >= 0) {
            const int qh = p.D / p.n_kv;
            for (int i = threadIdx.x; i < qh; i += blockDim.x)
                p.attn_out[head * qh + i] = __ldcg(p.y + head * qh + i) * 0.5f;
        }
    }
}

// A short history's attention, standing in: a block a kv head, 256 threads,
// 140 KiB of shared memory (another carveout than the GEMVs'), copying q.
__global__ void attn(const float * q, float * o, int n) {
    extern __shared__ float sm[];
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const int per = (n + gridDim.x - 1) / gridDim.x;
    for (int i = threadIdx.x; i < per; i += blockDim.x) {
        const int k = blockIdx.x * per + i;
        if (k < n) {
            sm[i] = q[k];
            o[k] = sm[i] * 0.5f;
        }
    }
}

struct Variant {
    const char * name;
    bool pipe = false; // pipelined, else one pass
    int u = 1;   // chunks a lane a batch; 0: all of a lane's chunks of a row at once (up to 8); -1:
                 // 2 where a lane has two batches of one, else 1
    int bps = 0; // blocks an SM, 0: a block a row group's share
    int ks = 0;  // warps a row group; 0: smol's choice by rows an SM
    int nw = 4;  // warps a block
    // At least this many blocks an SM (registers capped to fit them; 1:
    // one pass grid-stride, no cap; 0: none of it). With bps at most half
    // of it, two launches' blocks fit on an SM at once: the next GEMV's
    // blocks are resident and have read their first chunks when the one
    // before ends.
    int minb = 0;
    int fuse = 0; // the stand-in attention in the q, k, v GEMV's last blocks (P::fuse)
};

int sms = 0;
int regs_seen = 0;           // the most registers a thread of the variant's kernels took
const char * only = nullptr; // variants to run, split by '|' (see chosen)

// Whether the variant of this name runs: the first always, the others when
// no list was given or their name holds one of its parts.
bool chosen(const char * name, bool first) {
    if (!only || first) return true;
    for (const char * a = only; *a;) {
        const char * e = std::strchr(a, '|');
        const size_t n = e ? size_t(e - a) : std::strlen(a);
        if (n && std::search(name, name + std::strlen(name), a, a + n) != name + std::strlen(name))
            return true;
        a += n + (e ? 1 : 0);
    }
    return false;
}

template <typename K> void note_regs(K kernel) {
    cudaFuncAttributes a{};
    CK(cudaFuncGetAttributes(&a, kernel));
    regs_seen = std::max(regs_seen, a.numRegs);
}
template <bool SW, int KS, int U, bool PIPE, int MINB>
void go_m(const P & p, int bps, int nw, cudaStream_t s) {
    constexpr int R = 2;
    const int gpb = nw / KS, groups = p.rows / R, need = (groups + gpb - 1) / gpb;
    const int grid = bps > 0 ? std::min(need, bps * sms) : need;
    // Registers are capped for four warps a block alone (no variant asks
    // for more warps with a cap).
    auto with_nw = [&](auto nwc) {
        constexpr int NW = decltype(nwc)::value, MB = NW == 4 ? MINB : MINB ? 1 : 0;
        if constexpr (NW == 4 && MB == 0 && !PIPE) {
            auto fused = [&](auto fc) {
                constexpr int F = decltype(fc)::value;
                note_regs(gemv<SW, KS, R, U, PIPE, NW, 0, F>);
                launch(gemv<SW, KS, R, U, PIPE, NW, 0, F>, dim3(grid), dim3(NW * 32), 0, s, true,
                       p);
            };
            if (p.fuse == 2) return fused(std::integral_constant<int, 2>{});
            if (p.fuse == 1) return fused(std::integral_constant<int, 1>{});
        }
        note_regs(gemv<SW, KS, R, U, PIPE, NW, MB>);
        launch(gemv<SW, KS, R, U, PIPE, NW, MB>, dim3(grid), dim3(NW * 32), 0, s, true, p);
    };
    if (nw == 32)
        with_nw(std::integral_constant<int, 32>{});
    else if (nw == 16)
        with_nw(std::integral_constant<int, 16>{});
    else if (nw == 8)
        with_nw(std::integral_constant<int, 8>{});
    else
        with_nw(std::integral_constant<int, 4>{});
}
template <bool SW, int KS, int U, bool PIPE>
void go_t(const P & p, int bps, int nw, int minb, cudaStream_t s) {
    if constexpr (U <= 2) { // capped registers: the co-resident variants alone
        if (minb >= 10)
            return go_m<SW, KS, U, PIPE, 10>(p, bps, nw, s);
        else if (minb >= 8)
            return go_m<SW, KS, U, PIPE, 8>(p, bps, nw, s);
        else if (minb >= 6)
            return go_m<SW, KS, U, PIPE, 6>(p, bps, nw, s);
        else if (minb >= 1 && !PIPE)
            return go_m<SW, KS, U, PIPE, 1>(p, bps, nw, s);
    }
    go_m<SW, KS, U, PIPE, 0>(p, bps, nw, s);
}
template <bool SW, int KS, bool PIPE>
void go_u(const P & p, int u, int bps, int nw, int minb, cudaStream_t s) {
    if (u <= 1)
        go_t<SW, KS, 1, PIPE>(p, bps, nw, minb, s);
    else if (u == 2)
        go_t<SW, KS, 2, PIPE>(p, bps, nw, minb, s);
    else if (u == 3)
        go_t<SW, KS, 3, PIPE>(p, bps, nw, minb, s);
    else if (u == 4)
        go_t<SW, KS, 4, PIPE>(p, bps, nw, minb, s);
    else if (u <= 6)
        go_t<SW, KS, 6, PIPE>(p, bps, nw, minb, s);
    else
        go_t<SW, KS, 8, PIPE>(p, bps, nw, minb, s);
}
template <bool SW> void go(const P & p, const Variant & v, cudaStream_t s) {
    // smol's split of K: 4 warps a row group below 8 rows an SM, 2 below 24.
    const int per_sm = p.rows / sms;
    const int ks = v.ks ? v.ks : per_sm < 8 ? 4 : per_sm < 24 ? 2 : 1;
    const int batches = (p.K / 8 + ks * 32 - 1) / (ks * 32);
    const int u = v.u > 0 ? v.u : v.u == 0 ? std::min(8, batches) : batches == 2 ? 2 : 1;
    auto by_ks = [&](auto ksc) {
        constexpr int KS = decltype(ksc)::value;
        if (v.pipe)
            go_u<SW, KS, true>(p, u, v.bps, v.nw, v.minb, s);
        else
            go_u<SW, KS, false>(p, u, v.bps, v.nw, v.minb, s);
    };
    if (ks == 1)
        by_ks(std::integral_constant<int, 1>{});
    else if (ks == 2)
        by_ks(std::integral_constant<int, 2>{});
    else
        by_ks(std::integral_constant<int, 4>{});
}

float replay_us(cudaStream_t s, cudaGraphExec_t ge, int reps) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float best = 1e30f;
    for (int r = 0; r < 4; ++r) {
        CK(cudaEventRecord(a, s));
        for (int i = 0; i < reps; ++i) CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (r > 0) best = std::min(best, ms * 1000 / reps);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return best;
}

void model(const char * name, int L, int D, int F, int QKV, int n_kv) {
    const int V = 49152;
    const step_weights W(L, D, F, QKV, V);
    const size_t total = W.bytes;
    float *x, *x0, *nw, *q, *a, *g, *logits;
    CK(cudaMalloc(&x, F * 4));
    CK(cudaMalloc(&x0, F * 4));
    CK(cudaMalloc(&nw, F * 4));
    CK(cudaMalloc(&q, QKV * 4));
    CK(cudaMalloc(&a, D * 4));
    CK(cudaMalloc(&g, F * 4));
    CK(cudaMalloc(&logits, V * 4));
    int * done;
    CK(cudaMalloc(&done, n_kv * sizeof(int)));
    CK(cudaMemset(done, 0, n_kv * sizeof(int)));
    {
        std::mt19937 rng(1);
        fill_floats(x0, F, rng);
        fill_floats(nw, F, rng, true);
    }
    CK(cudaFuncSetAttribute(attn, cudaFuncAttributeMaxDynamicSharedMemorySize, 140 * 1024));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::printf("%s: %d GEMVs, weights %.1f MB, floor at 4.2 TB/s %.1f us\n", name, 4 * L + 1,
                total / 1e6, total / 4.2e6);
    const Variant vs[] = {
        {"one pass, U 1 (smol before gemv_pair)", false, 1, 0, 0},
        {"one pass, U 2 where a lane has 2 batches", false, -1, 0, 0},
        {.name = "one pass, U 2 where 2 batches, 8 warps", .u = -1, .nw = 8},
        {.name = "one pass, 8 warps a block", .nw = 8},
        {.name = "one pass, U 2 where 2 batches, 16 warps", .u = -1, .nw = 16},
        {.name = "one pass, U 2 where 2 batches, 32 warps", .u = -1, .nw = 32},
        {.name = "attention in the q/k/v GEMV's last blocks, U 2 where 2 batches",
         .u = -1,
         .fuse = 1},
        {.name = "attention in the q/k/v GEMV's last blocks, acq_rel count", .u = -1, .fuse = 2},
        {"one pass, U 2", false, 2, 0, 0},
        {"one pass, whole rows a lane at once", false, 0, 0, 0},
        {"one pass, KS 1, whole rows at once", false, 0, 0, 1},
        {"one pass, KS 2, whole rows at once", false, 0, 0, 2},
        {"one pass, KS 1, U 2", false, 2, 0, 1},
        {"pipelined U=1, a block a group share", true, 1, 0, 0},
        {"pipelined U=2, a block a group share", true, 2, 0, 0},
        {"pipelined U=1, 8 blocks an SM", true, 1, 8, 0},
        {"pipelined U=2, 8 blocks an SM", true, 2, 8, 0},
        {"pipelined U=2, 4 blocks an SM", true, 2, 4, 0},
        {"pipelined U=2, 2 blocks an SM", true, 2, 2, 0},
        {"pipelined U=4, 2 blocks an SM", true, 4, 2, 0},
        {"pipelined U=4, 1 block an SM", true, 4, 1, 0},
        {.name = "co-resident: one pass, U 2 where 2 batches, 4 an SM <=64 regs",
         .u = -1,
         .bps = 4,
         .minb = 8},
        {.name = "co-resident: one pass, U 1, 4 an SM <=64 regs", .bps = 4, .minb = 8},
        {.name = "co-resident: pipelined U=1, 4 an SM <=64 regs",
         .pipe = true,
         .bps = 4,
         .minb = 8},
        {.name = "co-resident: pipelined U=2, 4 an SM <=64 regs",
         .pipe = true,
         .u = 2,
         .bps = 4,
         .minb = 8},
        {.name = "co-resident: pipelined U=2, 3 an SM <=80 regs",
         .pipe = true,
         .u = 2,
         .bps = 3,
         .minb = 6},
        {.name = "co-resident: one pass, U 2 where 2 batches, 5 an SM <=48 regs",
         .u = -1,
         .bps = 5,
         .minb = 10},
        {.name = "co-resident?: one pass, U 2 where 2 batches, 4 an SM, no cap",
         .u = -1,
         .bps = 4,
         .minb = 1},
    };
    std::vector<float> ref(V), out(V);
    for (int round = 0; round < 2; ++round) {
        for (const Variant & v : vs) {
            if (!chosen(v.name, &v == vs)) continue;
            regs_seen = 0;
            auto step = [&] {
                for (int l = 0; l < L; ++l) {
                    if (v.fuse) {
                        go<false>(P{W.qkv(l), nullptr, q, QKV, D, x, nw, nullptr, v.fuse, done, a,
                                    D, n_kv},
                                  v, s);
                    } else {
                        go<false>(P{W.qkv(l), nullptr, q, QKV, D, x, nw, nullptr}, v, s);
                        launch(attn, dim3(n_kv), dim3(256), 140 * 1024, s, true, (const float *)q,
                               a, D);
                    }
                    go<false>(P{W.out(l), nullptr, x, D, D, a, nullptr, x}, v, s);
                    go<true>(P{W.gate(l), W.up(l), g, F, D, x, nw, nullptr}, v, s);
                    go<false>(P{W.down(l), nullptr, x, D, F, g, nullptr, x}, v, s);
                }
                go<false>(P{W.head(), nullptr, logits, V, D, x, nw, nullptr}, v, s);
            };
            cudaGraph_t gr;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            CK(cudaMemcpyAsync(x, x0, D * 4, cudaMemcpyDeviceToDevice, s));
            step();
            CK(cudaStreamEndCapture(s, &gr));
            CK(cudaGraphInstantiate(&ge, gr, 0));
            CK(cudaGraphLaunch(ge, s));
            CK(cudaStreamSynchronize(s));
            CK(cudaMemcpy(out.data(), logits, V * 4, cudaMemcpyDeviceToHost));
            if (&v == vs && round == 0) ref = out;
            const bool same = std::memcmp(ref.data(), out.data(), V * 4) == 0;
            const float us = replay_us(s, ge, 30);
            std::printf("  round %d  %-40s %8.1f us  %5.1f%% of floor  logits %s  (%d regs)\n",
                        round + 1, v.name, us, 100 * (total / 4.2e6) / us,
                        same ? "identical" : "DIFFER", regs_seen);
            std::fflush(stdout);
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(gr));
        }
    }
}

int main(int argc, char ** argv) {
    if (argc > 1) only = argv[1];
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    model("SmolLM2-135M shape", 30, 576, 1536, 960, 3);
    model("SmolLM2-1.7B shape", 24, 2048, 8192, 6144, 32);
    return 0;
}
