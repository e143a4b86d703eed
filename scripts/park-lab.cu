// SmolLM2-135M's decode step at a long context (f16 random weights and
// cache), its GEMVs those of gemv-lab.cuh launched early, with a stand-in
// for each layer's decode attention that reads the layer's cache (K and V,
// 3 kv heads of 64 dimensions) through shared memory and does no arithmetic.
// The question: smol's step reads a layer's cache only once the q, k, v
// GEMV before it has ended, so the cache's bytes (25 MB a layer at 32K) move
// after the launches of the layer's other GEMVs, which leave the memory
// mostly idle. Could the attention's blocks instead start a layer early, on
// a branch of the graph beside the GEMVs, copy the first part of their
// share of the cache into shared memory (192 KB an SM, all of it at 32K, a
// quarter at 128K), and wait there for q (a flag set after the q, k, v
// GEMV)? Forms, us a step, best of three runs of 20 replays:
//   chain            the GEMVs alone, no attention;
//   inline           the stand-in after the q, k, v GEMV, launched early, its
//                    first tiles copied before griddepcontrol.wait (as smol's);
//   attention only   the 30 inline stand-ins back to back (the copies' pace);
//   parked           the stand-in on a branch, launched as the one before
//                    ends, its first tiles copied before it waits on the
//                    flag; the output GEMV waits for it through the graph;
//   parked, counted  the same, but the output GEMV waits through a count the
//                    parked blocks add to as they end (a one-block kernel
//                    spins on it);
//   ..., empty       the form's graph and waits, its blocks copying nothing
//                    (no smem: nor asking for the shared memory);
//   ..., N ns        the block's first tiles copied one every N ns, not at
//                    once.
// Each form runs with the GEMVs asking for the default shared-memory
// carveout, then for the most (the parked blocks' own). Then, for the parked
// forms that copy, when their blocks began against when their flag was set,
// how soon the first woke, and when the last ended (the global timer).
// A stand-in block an SM, 8 warps, 3 tiles of 32 cells (8 KB) a warp in
// flight; the same kernel in every form. A wait that lasts more than about a
// second gives up and counts itself (printed: the form's figures are then
// void).
//
//   nvcc -O3 -std=c++20 -arch=sm_90 -o park-lab scripts/park-lab.cu
//   ./park-lab [cells ...]      (default 32768 131072)
#include "gemv-lab.cuh"  // P, gemv, replay_us (lab-common.cuh: CK, launch, now_ns, step_weights)
#include "lab-async.cuh" // cp16, commit, wait_groups

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr int HD = 64, CELLS = 32, TILE = CELLS * HD; // f16 elements a tile of K (or V)
constexpr int AW = 8, CAP = 3;                        // warps a block, tiles a warp in flight
constexpr size_t ATT_SMEM = size_t(AW) * CAP * 2 * TILE * 2;

struct AP {
    const uint16_t *K, *V; // the layer's [kv heads x cells][64] each
    int tiles;             // kv heads x cells / 32
    const float * q;       // the q, k, v GEMV's output: the wait's reason
    const int * flag;      // parked: wait until set
    int * gave_up;
    float * sink;
    int * done;                  // counted forms: each block adds 1 as it ends
    unsigned long long * stamps; // or null: a block's entry, wait's end and end (ns)
    int pace;                    // parked: ns between the block's first tiles' copies
};

__device__ __forceinline__ int ld_acquire(const int * p) {
    int v;
    asm volatile("ld.acquire.gpu.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

template <bool PARK> __global__ void __launch_bounds__(AW * 32) att(const AP p) {
    extern __shared__ __align__(16) uint16_t sm[];
    const unsigned long long t_entry = p.stamps ? now_ns() : 0;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // The block's tiles [t0, t1); the warp's: t0 + warp, t0 + warp + AW, ...
    const int t0 = int(size_t(blockIdx.x) * p.tiles / gridDim.x);
    const int t1 = int(size_t(blockIdx.x + 1) * p.tiles / gridDim.x);
    const int n = t1 - t0 > warp ? (t1 - t0 - warp + AW - 1) / AW : 0;
    uint16_t * ks = sm + warp * CAP * 2 * TILE;
    uint16_t * vs = ks + CAP * TILE;
    auto issue = [&](int i, int b) {
        if (i < n) {
            const size_t c = size_t(t0 + warp + i * AW) * TILE;
#pragma unroll
            for (int r = 0; r < TILE / 8 / 32; ++r) {
                const int e = (r * 32 + lane) * 8;
                cp16(ks + b * TILE + e, p.K + c + e);
                cp16(vs + b * TILE + e, p.V + c + e);
            }
        }
        commit();
    };
    if constexpr (PARK) {
        // The block's first AW x CAP tiles, one every `pace` ns (its warps
        // in turn), so that the GEMVs' loads do not queue behind them all.
        const unsigned long long t0 = p.pace ? now_ns() : 0;
        for (int s = 0; s < CAP; ++s) {
            while (p.pace && now_ns() < t0 + (unsigned long long)(s * AW + warp) * p.pace)
                __nanosleep(64);
            issue(s, s);
        }
        if (threadIdx.x == 0) {
            long spins = 0;
            while (ld_acquire(p.flag) == 0 && ++spins < (1l << 25)) __nanosleep(32);
            if (spins >= (1l << 25)) atomicAdd(p.gave_up, 1);
        }
        __syncthreads();
    } else {
#pragma unroll
        for (int s = 0; s < CAP; ++s) issue(s, s);
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
    const unsigned long long t_wait = p.stamps ? now_ns() : 0;
    // Every tile's bytes, read from shared memory (a lane its neighbour's
    // copies, so the warp's copies must all have landed).
    __half2 acc = __float2half2_rn(p.q[lane]);
    for (int i = 0; i < n; ++i) {
        wait_groups<CAP - 1>();
        __syncwarp();
        const int b = i % CAP;
#pragma unroll
        for (int r = 0; r < TILE / 8 / 32; ++r) {
            const int e = (r * 32 + (lane ^ 1)) * 8;
            const uint4 k = *reinterpret_cast<const uint4 *>(ks + b * TILE + e);
            const uint4 v = *reinterpret_cast<const uint4 *>(vs + b * TILE + e);
            const __half2 * kh = reinterpret_cast<const __half2 *>(&k);
            const __half2 * vh = reinterpret_cast<const __half2 *>(&v);
#pragma unroll
            for (int j = 0; j < 4; ++j) acc = __hfma2(kh[j], vh[j], acc);
        }
        __syncwarp();
        issue(i + CAP, b);
    }
    wait_groups<0>();
    if (__low2float(acc) == 12345.0f) p.sink[0] = __high2float(acc);
    if (p.stamps || p.done) __syncthreads();
    if (p.stamps && threadIdx.x == 0) {
        p.stamps[3 * blockIdx.x] = t_entry;
        p.stamps[3 * blockIdx.x + 1] = t_wait;
        p.stamps[3 * blockIdx.x + 2] = now_ns();
    }
    if (p.done) {
        if (threadIdx.x == 0)
            asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(p.done) : "memory");
    }
}

// Parked forms: after the q, k, v GEMV of layer l, the flag of layer l is set
// and the one before cleared (its attention has ended: the GEMVs since waited
// for it).
__global__ void set_flag(int * flags, int l, int n_layers, unsigned long long * t_set) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (threadIdx.x == 0) {
        if (t_set) t_set[l] = now_ns();
        flags[(l + n_layers - 1) % n_layers] = 0;
        asm volatile("st.release.gpu.b32 [%0], %1;" ::"l"(flags + l), "r"(1) : "memory");
    }
}

// Counted forms: lets the output GEMV launch, then ends once the n blocks of
// the layer's parked attention have (and clears their count).
__global__ void wait_done(int * done, int n, int * gave_up) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (threadIdx.x == 0) {
        long spins = 0;
        while (ld_acquire(done) < n && ++spins < (1l << 25)) __nanosleep(32);
        if (spins >= (1l << 25)) atomicAdd(gave_up, 1);
        *done = 0;
    }
}

template <bool SW, int KS, int R> void gemv_on(const P & p, cudaStream_t s) {
    const int blocks = (p.rows / R + 4 / KS - 1) / (4 / KS);
    launch(gemv<F16, SW, KS, R, 1, true, 0>, dim3(blocks), dim3(128), 0, s, true, p);
}

// The carveout the step's GEMV kernels ask for (-1: the default; 100: the
// most shared memory, the parked blocks' own).
void gemv_carveout(int carve) {
    const void * k[] = {(const void *)gemv<F16, false, 1, 2, 1, true, 0>,
                        (const void *)gemv<F16, false, 4, 2, 1, true, 0>,
                        (const void *)gemv<F16, true, 1, 2, 1, true, 0>};
    for (const void * f : k)
        CK(cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, carve));
}

int main(int argc, char ** argv) {
    std::vector<int> cells_list;
    for (int i = 1; i < argc; ++i) cells_list.push_back(std::atoi(argv[i]));
    if (cells_list.empty()) cells_list = {32768, 131072};
    const int L = 30, D = 576, F = 1536, V = 49152, NKV = 3, QKV = D + 2 * NKV * HD;
    const step_weights W(L, D, F, QKV, V);
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    float *x, *nw, *q, *g, *y;
    CK(cudaMalloc(&x, F * 4));
    CK(cudaMalloc(&nw, F * 4));
    CK(cudaMalloc(&q, QKV * 4));
    CK(cudaMalloc(&g, F * 4));
    CK(cudaMalloc(&y, V * 4));
    std::mt19937 rng(1);
    fill_floats(x, F, rng);
    fill_floats(g, F, rng);
    fill_floats(q, QKV, rng);
    fill_floats(nw, F, rng, true);
    int *flags, *gave_up, *done;
    float * sink;
    unsigned long long *stamps, *t_set;
    CK(cudaMalloc(&flags, L * 4));
    CK(cudaMalloc(&gave_up, 4));
    CK(cudaMalloc(&done, L * 4));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMalloc(&stamps, size_t(L) * sms * 3 * 8));
    CK(cudaMalloc(&t_set, L * 8));
    CK(cudaMemset(flags, 0, L * 4));
    CK(cudaMemset(gave_up, 0, 4));
    CK(cudaMemset(done, 0, L * 4));
    bool stamping = false;
    CK(cudaFuncSetAttribute(att<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, ATT_SMEM));
    CK(cudaFuncSetAttribute(att<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, ATT_SMEM));
    cudaStream_t s, s2;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    std::vector<cudaEvent_t> ev(L + 1); // a layer's parked blocks ended; the fork
    for (auto & e : ev) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));

    for (const int cells : cells_list) {
        const size_t kv_elems = size_t(NKV) * cells * HD; // K (or V) of a layer
        uint16_t * KV;
        CK(cudaMalloc(&KV, kv_elems * 2 * 2 * L));
        fill_weights(reinterpret_cast<__half *>(KV), kv_elems * 2 * L, 7);
        const double kv_bytes = double(kv_elems) * 2 * 2 * L;
        const double floor_us = (W.bytes + kv_bytes) / 4.2e6;
        printf("%d cells: weights %.1f MB, cache %.1f MB, floor at 4.2 TB/s %.1f us (85%%: %.1f)\n",
               cells, W.bytes / 1e6, kv_bytes / 1e6, floor_us, floor_us / 0.85);
        auto ap = [&](int l) {
            const uint16_t * K = KV + size_t(l) * 2 * kv_elems;
            return AP{K, K + kv_elems, NKV * cells / CELLS, q, flags + l, gave_up, sink, done + l};
        };
        // The forms (see the top); "counted": the output GEMV waits for the
        // parked blocks through a count they add to as they end (a one-block
        // kernel spins on it), not through the graph's edge from their launch.
        struct Form {
            const char * name;
            bool gemvs, att, parked, copies, smem, counted;
            int pace = 0;
        };
        const Form forms[] = {
            {"chain (GEMVs alone)", true, false, false, false, false, false},
            {"inline", true, true, false, true, true, false},
            {"attention only", false, true, false, true, true, false},
            {"parked", true, true, true, true, true, false},
            {"parked, empty", true, true, true, false, true, false},
            {"parked, empty, no smem", true, true, true, false, false, false},
            {"parked, counted", true, true, true, true, true, true},
            {"parked, counted, empty", true, true, true, false, true, true},
            {"parked, counted, 250 ns", true, true, true, true, true, true, 250},
            {"parked, counted, 500 ns", true, true, true, true, true, true, 500},
            {"parked, counted, 750 ns", true, true, true, true, true, true, 750},
        };
        auto step = [&](const Form & f) {
            const size_t smem = f.smem ? ATT_SMEM : 0;
            auto apf = [&](int l) {
                AP a = ap(l);
                if (!f.copies) a.tiles = 0;
                if (!f.counted) a.done = nullptr;
                a.pace = f.pace;
                a.stamps = stamping ? stamps + size_t(l) * sms * 3 : nullptr;
                return a;
            };
            if (!f.gemvs) {
                for (int l = 0; l < L; ++l)
                    launch(att<false>, dim3(sms), dim3(AW * 32), smem, s, true, apf(l));
                return;
            }
            if (f.parked) {
                CK(cudaEventRecord(ev[L], s));
                CK(cudaStreamWaitEvent(s2, ev[L], 0));
                launch(att<true>, dim3(sms), dim3(AW * 32), smem, s2, false, apf(0));
            }
            for (int l = 0; l < L; ++l) {
                gemv_on<false, 1, 2>(P{W.qkv(l), nullptr, q, QKV, size_t(D) * 2, D, x, nw, nullptr},
                                     s);
                if (f.att && !f.parked)
                    launch(att<false>, dim3(sms), dim3(AW * 32), smem, s, true, apf(l));
                if (f.parked) {
                    launch(set_flag, dim3(1), dim3(32), 0, s, true, flags, l, L,
                           stamping ? t_set : nullptr);
                    CK(cudaEventRecord(ev[l], s2));
                    if (l + 1 < L)
                        launch(att<true>, dim3(sms), dim3(AW * 32), smem, s2, false, apf(l + 1));
                    if (f.counted)
                        launch(wait_done, dim3(1), dim3(32), 0, s, true, done + l, sms, gave_up);
                    else
                        CK(cudaStreamWaitEvent(s, ev[l], 0));
                }
                gemv_on<false, 4, 2>(P{W.out(l), nullptr, x, D, size_t(D) * 2, D, q, nullptr, x},
                                     s);
                gemv_on<true, 1, 2>(P{W.gate(l), W.up(l), g, F, size_t(D) * 2, D, x, nw, nullptr},
                                    s);
                gemv_on<false, 4, 2>(P{W.down(l), nullptr, x, D, size_t(F) * 2, F, g, nullptr, x},
                                     s);
            }
            gemv_on<false, 1, 2>(P{W.head(), nullptr, y, V, size_t(D) * 2, D, x, nw, nullptr}, s);
            if (f.counted) CK(cudaStreamWaitEvent(s, ev[L - 1], 0)); // the branch joins
        };
        for (const int carve : {-1, 100}) {
            gemv_carveout(carve);
            printf(" the GEMVs' shared-memory carveout: %s\n",
                   carve < 0 ? "the default" : "the most shared memory");
            for (int round = 0; round < 2; ++round)
                for (const Form & f : forms) {
                    const float us = replay_us(
                        s, [&] { step(f); }, 20, 3, 3);
                    int gave = 0;
                    CK(cudaMemcpy(&gave, gave_up, 4, cudaMemcpyDeviceToHost));
                    printf("  %-24s %8.1f us  %5.1f%% of the floor%s\n", f.name, us,
                           100 * floor_us / us, gave ? "  (a wait gave up: void)" : "");
                    fflush(stdout);
                }
        }
        // When the parked blocks of layers 1 on began, against when their
        // flag was set (the last replay's stamps; medians over the layers).
        stamping = true;
        gemv_carveout(-1);
        for (const Form & f : forms) {
            if (!f.parked || !f.copies) continue;
            replay_us(
                s, [&] { step(f); }, 3, 1, 1);
            std::vector<unsigned long long> st(size_t(L) * sms * 3), ts(L);
            CK(cudaMemcpy(st.data(), stamps, st.size() * 8, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(ts.data(), t_set, L * 8, cudaMemcpyDeviceToHost));
            std::vector<double> early, lead, wake, tail;
            for (int l = 1; l < L; ++l) {
                int n_early = 0;
                std::vector<double> leads;
                unsigned long long first_wake = ~0ull, last_end = 0;
                for (int b = 0; b < sms; ++b) {
                    const unsigned long long * e = &st[(size_t(l) * sms + b) * 3];
                    n_early += e[0] < ts[l];
                    leads.push_back((double(ts[l]) - double(e[0])) / 1e3);
                    first_wake = std::min(first_wake, e[1]);
                    last_end = std::max(last_end, e[2]);
                }
                std::sort(leads.begin(), leads.end());
                early.push_back(100.0 * n_early / sms);
                lead.push_back(leads[leads.size() / 2]);
                wake.push_back((double(first_wake) - double(ts[l])) / 1e3);
                tail.push_back((double(last_end) - double(ts[l])) / 1e3);
            }
            auto med = [](std::vector<double> v) {
                std::sort(v.begin(), v.end());
                return v[v.size() / 2];
            };
            printf("  %-24s blocks begun before the flag %5.1f%%, by %6.1f us (median block); "
                   "first wake %5.1f us, last end %6.1f us after the flag\n",
                   f.name, med(early), med(lead), med(wake), med(tail));
        }
        stamping = false;
        CK(cudaFree(KV));
    }
}
