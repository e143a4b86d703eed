// gemv-lab.cuh - the GEMV kernel ring-step.cu runs as "smol's loop", and a
// graph-replay timer (replay_us). The kernel is a stand-alone copy of the
// loop of gemv_kernel in smol-cuda-gemv.cu (which no header shares): f16,
// q8_0 and q4_1 weights read by the backend's own load_chunk and met by its
// x_chunk and dot8, f32 activations, a folded RMS norm (rms_scale), SwiGLU
// (silu_mul) and residual epilogues, with every variant as a template
// parameter: KS warps a group of R rows, U chunks of 8 a lane loaded before
// use; PDL: launched early (the product's griddep_wait and griddep_launch),
// PF: before the wait, prefetch 0 nothing, 1 the first 4 KiB of each row,
// 2 its first 512 bytes.
#pragma once
#include "lab-common.cuh"     // CK, warp_sum, griddep_*, launch, fill_weights, fill_floats
#include "smol-cuda-rows.cuh" // load_chunk, x_chunk, dot8

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cuda_fp16.h>
#include <random>
#include <string>
#include <vector>
enum { F16 = SMOL_TYPE_F16, Q8 = SMOL_TYPE_Q8_0, Q41 = SMOL_TYPE_Q4_1 };
using smol::load_chunk; // the backend's own loads (smol-cuda-rows.cuh)
struct P {
    const uint8_t * w;
    const uint8_t * wu;
    float * y;
    int rows;
    size_t rb;
    int K;
    const float * x;
    const float * nw;
    const float * res;
};
template <int T, bool SW, int KS, int R, int U, bool PDL = false, int PF = 0>
__global__ void __launch_bounds__(128) gemv(const P p) {
    constexpr int NW = 4, GPB = NW / KS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, ks = warp % KS;
    const int r0 = (blockIdx.x * GPB + warp / KS) * R;
    const bool valid = r0 < p.rows;
    if (PDL) {
        if (PF && valid && ks == 0 && lane * 128 < (PF == 1 ? p.rb : 512))
            for (int j = 0; j < R; ++j) {
                prefetch_l2(p.w + size_t(r0 + j) * p.rb + lane * 128);
                if (SW) prefetch_l2(p.wu + size_t(r0 + j) * p.rb + lane * 128);
            }
        griddep_wait();
        griddep_launch();
    }
    const uint8_t * wr = p.w + size_t(r0) * p.rb;
    const uint8_t * wu = SW ? p.wu + size_t(r0) * p.rb : nullptr;
    float acc[R], accu[R], ss = 0.f;
#pragma unroll
    for (int j = 0; j < R; ++j) acc[j] = accu[j] = 0.f;
    const int n_ch = valid ? p.K / 8 : 0, stride = KS * 32;
    for (int c0 = ks * 32 + lane; c0 < n_ch; c0 += U * stride) {
        float v[U][R][8], vu[U][SW ? R : 1][8];
        int e0[U], e1[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int ch = min(c0 + u * stride, n_ch - 1);
#pragma unroll
            for (int j = 0; j < R; ++j) {
                load_chunk<T>(wr + j * p.rb, ch, v[u][j], e0[u], e1[u]);
                if constexpr (SW) load_chunk<T>(wu + j * p.rb, ch, vu[u][j], e0[u], e1[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (c0 + u * stride < n_ch) {
                float4 a, b;
                smol::x_chunk(p.x, p.nw, e0[u], e1[u], a, b, ss);
#pragma unroll
                for (int j = 0; j < R; ++j) {
                    acc[j] += smol::dot8(v[u][j], a, b);
                    if constexpr (SW) accu[j] += smol::dot8(vu[u][j], a, b);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < R; ++j) {
        acc[j] = warp_sum(acc[j]);
        if (SW) accu[j] = warp_sum(accu[j]);
    }
    double ssd = warp_sum(ss);
    if constexpr (KS > 1) {
        __shared__ float part[NW][2 * R];
        __shared__ double pss[NW];
        if (lane == 0) {
            for (int j = 0; j < R; ++j) {
                part[warp][j] = acc[j];
                part[warp][R + j] = accu[j];
            }
            pss[warp] = ssd;
        }
        __syncthreads();
        if (ks != 0 || !valid) return;
        for (int j = 0; j < R; ++j)
            for (int i = 1; i < KS; ++i) {
                acc[j] += part[warp + i][j];
                accu[j] += part[warp + i][R + j];
            }
        for (int i = 1; i < KS; ++i) ssd += pss[warp + i];
    }
    if (lane < R && valid) {
        float a = acc[0], au = accu[0];
#pragma unroll
        for (int j = 1; j < R; ++j)
            if (lane == j) {
                a = acc[j];
                au = accu[j];
            }
        if (p.nw) {
            const float s = rms_scale(ssd, p.K, 1e-5f);
            a *= s;
            au *= s;
        }
        if (SW) a = silu_mul(a, au);
        if (p.res) a += p.res[r0 + lane];
        p.y[r0 + lane] = a;
    }
}

// Captures what `record` issues on stream s as a CUDA graph, replays it
// `warm` times, then times `rounds` runs of `reps` replays: the best run's
// microseconds a replay.
template <typename F> float replay_us(cudaStream_t s, F record, int reps, int rounds, int warm) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    record();
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < warm; ++i) CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float best = 1e30f;
    for (int r = 0; r < rounds; ++r) {
        CK(cudaEventRecord(a, s));
        for (int i = 0; i < reps; ++i) CK(cudaGraphLaunch(ge, s));
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        best = std::min(best, ms * 1000 / reps);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return best;
}
