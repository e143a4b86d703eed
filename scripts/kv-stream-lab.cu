// Reads a layer's KV cache the way the decode attention kernel walks it, with
// no arithmetic, to find what the copies alone reach on one GPU: K and V each
// [heads][cells][64] f16, a block a (kv head, split), its warps taking the
// split's tiles of 32 cells round robin. Variants: cp.async 16 bytes a lane
// into NS shared buffers a warp (as smol's kernel), plain 16-byte loads into
// registers with U tiles in flight, and bulk copies (cp.async.bulk, one lane
// a tile's K and V, an mbarrier a buffer). Each variant runs over two
// layers' worth of cache (more than the L2), best of 5 timed runs of 20
// launches; GB/s counts K and V bytes read.
//
//   nvcc -O3 -std=c++20 -arch=sm_90 -o kv-stream-lab scripts/kv-stream-lab.cu
//   ./kv-stream-lab [heads cells]     (default 32 32768: SmolLM2-1.7B at 32K)
//   ./kv-stream-lab heads cells spin [1]  (the timed kernel: when blocks end, and on which
//                                         SM; 1: with the cells' positions and masks)
#include "lab-async.cuh"  // cp16, commit, wait_groups
#include "lab-common.cuh" // CK, now_ns

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <vector>

constexpr int HD = 64, CELLS = 32, TILE = CELLS * HD; // f16 elements a tile of K (or V)

struct P {
    const uint16_t *K, *V;
    int cells, chunk; // cells a head, cells a split
    float * sink;
};

// A warp's tiles of a block's split (block x: the split, y: the kv head):
// the split's tiles warp, warp + W, ...; its i-th starts at cell(i) of K
// (and V).
template <int W> struct walk {
    int warp, lane, c0, n;
    size_t head;
    __device__ explicit walk(const P & p)
        : warp(threadIdx.x / 32), lane(threadIdx.x % 32), c0(blockIdx.x * p.chunk),
          n(p.chunk / CELLS > warp ? (p.chunk / CELLS - warp + W - 1) / W : 0),
          head(size_t(blockIdx.y) * p.cells) {}
    __device__ size_t cell(int i) const { return head + c0 + size_t(warp + i * W) * CELLS; }
};

// The K and V rows of the tile at cell c into buffer b of ks and vs, 16
// bytes a lane a copy.
__device__ __forceinline__ void copy_tile(const P & p, size_t c, uint16_t * ks, uint16_t * vs,
                                          int b, int lane) {
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        const int e = (r * 32 + lane) * 8;
        cp16(ks + b * TILE + e, p.K + c * HD + e);
        cp16(vs + b * TILE + e, p.V + c * HD + e);
    }
}

// cp.async into NS buffers a warp, NS - 1 tiles ahead.
template <int W, int NS> __global__ void __launch_bounds__(W * 32) k_cpasync(P p) {
    extern __shared__ __align__(16) uint16_t sm[];
    const walk<W> w(p);
    const int lane = w.lane, n = w.n;
    uint16_t * ks = sm + w.warp * NS * 2 * TILE;
    uint16_t * vs = ks + NS * TILE;
    auto issue = [&](int i, int b) {
        if (i < n) copy_tile(p, w.cell(i), ks, vs, b, lane);
        commit();
    };
    for (int s = 0; s < NS - 1; ++s) issue(s, s);
    float acc = 0.0f;
    for (int i = 0; i < n; ++i) {
        issue(i + NS - 1, (i + NS - 1) % NS);
        wait_groups<NS - 1>();
        __syncwarp();
        const int b = i % NS;
        acc += float(ks[b * TILE + lane * 64]) + float(vs[b * TILE + lane * 64 + 1]);
        __syncwarp();
    }
    if (acc == 12345.0f) p.sink[0] = acc;
}

// k_cpasync<W, 2> with a stand-in for the decode kernel's arithmetic (each
// tile holds its warp for `spin` more cycles) that records, for each block,
// its SM and when it began and ended (the global timer, ns): do blocks of
// equal work end together, and is an SM that ends early the same one each
// launch?
struct stamp {
    unsigned long long t0, t1;
    int sm;
};
// With `cells` set, each tile's copies also bring its cells' positions and
// mask words (4 and 8 bytes a cell, from two arrays), as smol's do.
template <int W>
__global__ void __launch_bounds__(W * 32)
    k_timed(P p, int spin, stamp * out, const int32_t * cpos, const uint64_t * cseq) {
    extern __shared__ __align__(16) uint16_t sm[];
    constexpr int NS = 2;
    const unsigned long long t0 = now_ns();
    const walk<W> w(p);
    const int lane = w.lane, n = w.n;
    uint16_t * ks = sm + w.warp * NS * 2 * TILE;
    uint16_t * vs = ks + NS * TILE;
    __shared__ __align__(16) uint32_t cbuf[W][NS * 32 * 3];
    uint32_t * cs = cbuf[w.warp];
    auto issue = [&](int i, int b) {
        if (i < n) {
            const size_t c = w.cell(i);
            copy_tile(p, c, ks, vs, b, lane);
            if (cpos && lane < 24) {
                // Lanes 0-7 four positions each, lanes 8-23 two mask words.
                const size_t cc = c % size_t(p.cells);
                const void * from = lane < 8
                                        ? static_cast<const void *>(cpos + cc + 4 * lane)
                                        : static_cast<const void *>(cseq + cc + 2 * (lane - 8));
                cp16(cs + b * 32 * 3 + lane * 4, from);
            }
        }
        commit();
    };
    issue(0, 0);
    float acc = 0.0f;
    for (int i = 0; i < n; ++i) {
        issue(i + 1, (i + 1) % NS);
        wait_groups<1>();
        __syncwarp();
        const int b = i % NS;
        acc += float(ks[b * TILE + lane * 64]) + float(vs[b * TILE + lane * 64 + 1]) +
               float(cs[b * 96 + lane]);
        const long long until = clock64() + spin;
        while (clock64() < until) acc += 1e-30f;
        __syncwarp();
    }
    if (acc == 12345.0f) p.sink[0] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        int id;
        asm volatile("mov.u32 %0, %smid;" : "=r"(id));
        out[blockIdx.y * gridDim.x + blockIdx.x] = {t0, now_ns(), id};
    }
}

// Plain 16-byte loads into registers: a lane holds 8 + 8 pieces of a tile;
// U tiles in flight.
template <int W, int U> __global__ void __launch_bounds__(W * 32) k_ldg(P p) {
    const walk<W> w(p);
    const int lane = w.lane, n = w.n;
    float acc = 0.0f;
    for (int i = 0; i < n; i += U) {
        uint4 k[U][8], v[U][8];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const size_t c = w.cell(min(i + u, n - 1));
#pragma unroll
            for (int r = 0; r < 8; ++r) {
                const int e = (r * 32 + lane) * 8;
                k[u][r] = __ldcs(reinterpret_cast<const uint4 *>(p.K + c * HD + e));
                v[u][r] = __ldcs(reinterpret_cast<const uint4 *>(p.V + c * HD + e));
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
            for (int r = 0; r < 8; ++r) acc += float(k[u][r].x ^ v[u][r].w);
        }
    }
    if (acc == 12345.0f) p.sink[0] = acc;
}

// Bulk copies: lane 0 copies a tile's K and V (4 KiB each) into buffer b and
// the buffer's mbarrier counts the bytes; NS - 1 tiles ahead.
template <int W, int NS> __global__ void __launch_bounds__(W * 32) k_bulk(P p) {
    extern __shared__ __align__(16) uint16_t sm[];
    __shared__ __align__(8) uint64_t bar[W][NS];
    const walk<W> w(p);
    const int warp = w.warp, lane = w.lane, n = w.n;
    uint16_t * ks = sm + warp * NS * 2 * TILE;
    uint16_t * vs = ks + NS * TILE;
    if (lane == 0) {
        for (int s = 0; s < NS; ++s) mbar_init(&bar[warp][s], 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncwarp();
    auto issue = [&](int i) {
        if (i < n && lane == 0) {
            const int b = i % NS;
            const size_t c = w.cell(i);
            mbar_expect(&bar[warp][b], 2 * TILE * 2);
            bulk_copy(ks + b * TILE, p.K + c * HD, TILE * 2, &bar[warp][b]);
            bulk_copy(vs + b * TILE, p.V + c * HD, TILE * 2, &bar[warp][b]);
        }
    };
    for (int s = 0; s < NS - 1; ++s) issue(s);
    float acc = 0.0f;
    for (int i = 0; i < n; ++i) {
        issue(i + NS - 1);
        const int b = i % NS;
        mbar_wait(&bar[warp][b], unsigned(i / NS) & 1u);
        acc += float(ks[b * TILE + lane * 64]) + float(vs[b * TILE + lane * 64 + 1]);
        __syncwarp(); // the buffer is read before it is filled again
    }
    if (acc == 12345.0f) p.sink[0] = acc;
}

int main(int argc, char ** argv) {
    const int heads = argc > 2 ? std::atoi(argv[1]) : 32,
              cells = argc > 2 ? std::atoi(argv[2]) : 32768;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const size_t per = size_t(heads) * cells * HD; // f16 elements of K (or V), a layer
    const int layers = 4;
    uint16_t * pool;
    CK(cudaMalloc(&pool, per * 2 * layers * 2));
    {
        std::vector<uint16_t> h(per * 2 * layers);
        for (size_t i = 0; i < h.size(); ++i)
            h[i] = uint16_t(0x3c00 | (i * 2654435761u >> 22 & 0x3ff));
        CK(cudaMemcpy(pool, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    }
    float * sink;
    CK(cudaMalloc(&sink, 4));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const double bytes = double(per) * 2 * 2; // K and V of a layer
    {
        // The copy ceiling: a device-to-device copy of a layer's K and V.
        float best = 1e9f;
        for (int r = 0; r < 5; ++r) {
            CK(cudaEventRecord(e0));
            for (int i = 0; i < 20; ++i)
                CK(cudaMemcpyAsync(pool + per * 2 * (2 + i % 2), pool + per * 2 * (i % 2), per * 4,
                                   cudaMemcpyDeviceToDevice));
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            best = std::min(best, ms / 20);
        }
        std::printf("%-28s %8.1f us  %7.0f GB/s (read + write, each way %.0f)\n", "cudaMemcpy D2D",
                    best * 1e3, 2 * bytes / (best * 1e-3) / 1e9, bytes / (best * 1e-3) / 1e9);
    }
    auto time = [&](const char * name, auto kernel, int W, size_t smem, int per_sm_want) {
        CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        int per_sm = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, W * 32, smem));
        (void)per_sm_want;
        // Splits so that the blocks fill the GPU once, whole warp rounds of tiles.
        int S = std::max(1, per_sm * sms / heads);
        int chunk = (cells + S - 1) / S;
        chunk = (chunk + CELLS * W - 1) / (CELLS * W) * (CELLS * W);
        S = (cells + chunk - 1) / chunk;
        float best = 1e9f;
        for (int r = 0; r < 5; ++r) {
            CK(cudaEventRecord(e0));
            for (int i = 0; i < 20; ++i) {
                const int l = i % layers;
                P p{pool + per * 2 * l, pool + per * 2 * l + per, cells, chunk, sink};
                kernel<<<dim3(S, heads), W * 32, smem>>>(p);
            }
            CK(cudaGetLastError());
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            best = std::min(best, ms / 20);
        }
        std::printf("%-28s %8.1f us  %7.0f GB/s  (%d blocks an SM, %d splits, %d blocks)\n", name,
                    best * 1e3, bytes / (best * 1e-3) / 1e9, per_sm, S, S * heads);
    };
    const size_t tb = size_t(TILE) * 2 * 2; // K and V bytes of a tile
    if (argc > 3) {
        // ./kv-stream-lab heads cells spin: the timed kernel, 8 warps of two
        // tiles, one block an SM, 20 launches.
        const int spin = std::atoi(argv[3]), W = 8;
        const bool with_cells = argc > 4 && std::atoi(argv[4]) != 0;
        int32_t * cpos = nullptr;
        uint64_t * cseq = nullptr;
        if (with_cells) {
            CK(cudaMalloc(&cpos, size_t(cells) * 4 + 64));
            CK(cudaMalloc(&cseq, size_t(cells) * 8 + 64));
            CK(cudaMemset(cpos, 1, size_t(cells) * 4 + 64));
            CK(cudaMemset(cseq, 1, size_t(cells) * 8 + 64));
        }
        const size_t smem = W * 2 * tb;
        CK(cudaFuncSetAttribute(k_timed<8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                int(smem)));
        int S = std::max(1, sms / heads);
        int chunk = (cells + S - 1) / S;
        chunk = (chunk + CELLS - 1) / CELLS * CELLS;
        S = (cells + chunk - 1) / chunk;
        const int blocks = S * heads, runs = 20;
        stamp * d_st;
        CK(cudaMalloc(&d_st, sizeof(stamp) * blocks * runs));
        for (int i = 0; i < runs; ++i) {
            const int l = i % layers;
            P p{pool + per * 2 * l, pool + per * 2 * l + per, cells, chunk, sink};
            k_timed<8><<<dim3(S, heads), W * 32, smem>>>(p, spin, d_st + i * blocks, cpos, cseq);
        }
        CK(cudaGetLastError());
        std::vector<stamp> st(size_t(blocks) * runs);
        CK(cudaMemcpy(st.data(), d_st, st.size() * sizeof(stamp), cudaMemcpyDeviceToHost));
        // Per launch: its span, and each block's end as a fraction of it;
        // per SM: that fraction in the first and the second half of the runs.
        std::vector<double> half[2];
        half[0].assign(sms, 0.0);
        half[1].assign(sms, 0.0);
        std::vector<int> cnt[2];
        cnt[0].assign(sms, 0);
        cnt[1].assign(sms, 0);
        double span_sum = 0, early_sum = 0, mean_sum = 0;
        for (int i = 2; i < runs; ++i) { // the first two warm up
            const stamp * b = st.data() + size_t(i) * blocks;
            unsigned long long t0 = ~0ull, t1 = 0;
            for (int k = 0; k < blocks; ++k) {
                t0 = std::min(t0, b[k].t0);
                t1 = std::max(t1, b[k].t1);
            }
            const double span = double(t1 - t0);
            double early = 1.0, mean = 0.0;
            for (int k = 0; k < blocks; ++k) {
                const double f = double(b[k].t1 - t0) / span;
                early = std::min(early, f);
                mean += f / blocks;
                const int h = i < 11 ? 0 : 1;
                if (b[k].sm >= 0 && b[k].sm < sms) {
                    half[h][b[k].sm] += f;
                    ++cnt[h][b[k].sm];
                }
            }
            span_sum += span;
            early_sum += early;
            mean_sum += mean;
        }
        // Pearson correlation of the SMs' mean end fractions between halves.
        double ma = 0, mb = 0;
        int n = 0;
        std::vector<double> a, b;
        for (int k = 0; k < sms; ++k) {
            if (cnt[0][k] && cnt[1][k]) {
                a.push_back(half[0][k] / cnt[0][k]);
                b.push_back(half[1][k] / cnt[1][k]);
                ma += a.back();
                mb += b.back();
                ++n;
            }
        }
        ma /= n;
        mb /= n;
        double sab = 0, saa = 0, sbb = 0;
        for (int k = 0; k < n; ++k) {
            sab += (a[k] - ma) * (b[k] - mb);
            saa += (a[k] - ma) * (a[k] - ma);
            sbb += (b[k] - mb) * (b[k] - mb);
        }
        const int m = runs - 2;
        std::printf(
            "timed, spin %d%s: %d blocks, span %.1f us (%.0f GB/s), earliest block end %.0f%%, "
            "mean %.0f%% of the span; SMs' mean end, first half against second: r = %.2f "
            "(%d SMs)\n",
            spin, with_cells ? ", cells' positions and masks" : "", blocks, span_sum / m / 1e3,
            bytes / (span_sum / m * 1e-9) / 1e9, 100 * early_sum / m, 100 * mean_sum / m,
            sab / std::sqrt(saa * sbb), n);
        return 0;
    }
    time("cp.async W4 NS2", k_cpasync<4, 2>, 4, 4 * 2 * tb, 0);
    time("cp.async W4 NS3", k_cpasync<4, 3>, 4, 4 * 3 * tb, 0);
    time("cp.async W4 NS4 (smol)", k_cpasync<4, 4>, 4, 4 * 4 * tb, 0);
    time("cp.async W8 NS3", k_cpasync<8, 3>, 8, 8 * 3 * tb, 0);
    time("cp.async W2 NS6", k_cpasync<2, 6>, 2, 2 * 6 * tb, 0);
    time("ldg W4 U1", k_ldg<4, 1>, 4, 0, 0);
    time("ldg W4 U2", k_ldg<4, 2>, 4, 0, 0);
    time("ldg W8 U2", k_ldg<8, 2>, 8, 0, 0);
    time("bulk W4 NS4", k_bulk<4, 4>, 4, 4 * 4 * tb, 0);
    time("bulk W4 NS6", k_bulk<4, 6>, 4, 4 * 6 * tb, 0);
    time("bulk W1 NS8", k_bulk<1, 8>, 1, 1 * 8 * tb, 0);
    time("bulk W2 NS8", k_bulk<2, 8>, 2, 2 * 8 * tb, 0);
    return 0;
}
