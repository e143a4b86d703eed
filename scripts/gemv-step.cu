// The GEMVs of one SmolLM2-1.7B decode step alone (24 layers of q/k/v with
// the norm folded, output with the residual, gate/up with SwiGLU, down with
// the residual, then the head; f16 random weights, 3.4 GB), captured in a
// CUDA graph and replayed 50 times, for several (KS, R) plans; with 0 or 2
// one-block kernels a layer where kv_store and attention stand, and four
// launch modes: 0 plain; 1 every GEMV launched early (programmatic
// dependent launch) and prefetching the first 4 KiB of its rows to L2
// before it waits; 2 the same without the prefetch; 4 only the GEMV after
// the small kernels launched early. The kernel is the one of
// gemv-lab.cuh.
//
//   nvcc -O3 -std=c++20 -arch=sm_90 -o gemv-step scripts/gemv-step.cu
//   ./gemv-step
#include "gemv-lab.cuh"

__global__ void tiny(float * y, int n, bool pdl) {
    if (pdl) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    }
    if (threadIdx.x < n) y[threadIdx.x] += 1.0f;
}
struct Cfg {
    int ks, r;
};
template <bool SW, bool PDL, int PF = 1> void gemv_go(Cfg c, const P & p, cudaStream_t s) {
    auto go = [&](auto ks, auto r) {
        constexpr int KS = decltype(ks)::value, R = decltype(r)::value;
        const int blocks = (p.rows / R + 4 / KS - 1) / (4 / KS);
        launch(gemv<F16, SW, KS, R, 1, PDL, PF>, dim3(blocks), dim3(128), 0, s, PDL, p);
    };
    using I1 = std::integral_constant<int, 1>;
    using I2 = std::integral_constant<int, 2>;
    using I4 = std::integral_constant<int, 4>;
    auto rr = [&](auto ks) {
        if (c.r == 1)
            go(ks, I1{});
        else if (c.r == 2)
            go(ks, I2{});
        else
            go(ks, I4{});
    };
    if (c.ks == 1)
        rr(I1{});
    else if (c.ks == 2)
        rr(I2{});
    else
        rr(I4{});
}
int main() {
    const int L = 24, D = 2048, F = 8192, V = 49152;
    const step_weights W(L, D, F, 3 * D, V, size_t(64) << 20);
    const size_t total = W.bytes;
    float *x, *nw, *q, *y2, *g;
    CK(cudaMalloc(&x, F * 4));
    CK(cudaMalloc(&nw, F * 4));
    CK(cudaMalloc(&q, 3 * D * 4));
    CK(cudaMalloc(&y2, V * 4));
    CK(cudaMalloc(&g, F * 4));
    {
        std::vector<float> h(F);
        std::mt19937 rng(1);
        std::normal_distribution<float> d(0, 1);
        for (auto & v : h) v = d(rng);
        cudaMemcpy(x, h.data(), F * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(g, h.data(), F * 4, cudaMemcpyHostToDevice);
        for (auto & v : h) v = 1 + 0.1f * d(rng);
        cudaMemcpy(nw, h.data(), F * 4, cudaMemcpyHostToDevice);
    }
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    printf("weights %.1f MB, floor at 4.2 TB/s %.1f us\n", total / 1e6, total / 4.2e6);
    struct Plan {
        const char * name;
        Cfg qkv, o, gu, dn, hd;
    };
    Plan plans[] = {
        {"old r1 (ks 1,2,1,2,1)", {1, 1}, {2, 1}, {1, 1}, {2, 1}, {1, 1}},
        {"new default (k1r2,k4r2,k1r2,k4r2,k1r2)", {1, 2}, {4, 2}, {1, 2}, {4, 2}, {1, 2}},
        {"micro best (k1r2,k4r2,k2r4,k4r2,k4r4)", {1, 2}, {4, 2}, {2, 4}, {4, 2}, {4, 4}},
        {"tuned (k2r1,k4r4,k4r2,k4r1,k4r2)", {2, 1}, {4, 4}, {4, 2}, {4, 1}, {4, 2}},
    };
    for (int tinies : {0, 2})
        for (int mode : {0, 1, 2, 4})
            for (auto & pl : plans) {
                const bool pdl = mode != 0;
                auto step = [&] {
                    for (int l = 0; l < L; ++l) {
                        P p{W.qkv(l), nullptr, q, 3 * D, size_t(D) * 2, D, x, nw, nullptr};
                        ((mode == 0 || mode == 4) ? gemv_go<false, false>(pl.qkv, p, s)
                         : mode == 1              ? gemv_go<false, true, 1>(pl.qkv, p, s)
                         : mode == 2              ? gemv_go<false, true, 0>(pl.qkv, p, s)
                                                  : gemv_go<false, true, 2>(pl.qkv, p, s));
                        for (int t = 0; t < tinies; ++t)
                            launch(tiny, dim3(1), dim3(128), 0, s, pdl, q, 64, pdl);
                        P po{W.out(l), nullptr, x, D, size_t(D) * 2, D, q, nullptr, x};
                        if (mode == 4) {
                            if (tinies)
                                gemv_go<false, true, 0>(pl.o, po, s);
                            else
                                gemv_go<false, false>(pl.o, po, s);
                        } else
                            ((mode == 0 || mode == 4) ? gemv_go<false, false>(pl.o, po, s)
                             : mode == 1              ? gemv_go<false, true, 1>(pl.o, po, s)
                             : mode == 2              ? gemv_go<false, true, 0>(pl.o, po, s)
                                                      : gemv_go<false, true, 2>(pl.o, po, s));
                        P pg{W.gate(l), W.up(l), g, F, size_t(D) * 2, D, x, nw, nullptr};
                        ((mode == 0 || mode == 4) ? gemv_go<true, false>(pl.gu, pg, s)
                         : mode == 1              ? gemv_go<true, true, 1>(pl.gu, pg, s)
                         : mode == 2              ? gemv_go<true, true, 0>(pl.gu, pg, s)
                                                  : gemv_go<true, true, 2>(pl.gu, pg, s));
                        P pd{W.down(l), nullptr, x, D, size_t(F) * 2, F, g, nullptr, x};
                        ((mode == 0 || mode == 4) ? gemv_go<false, false>(pl.dn, pd, s)
                         : mode == 1              ? gemv_go<false, true, 1>(pl.dn, pd, s)
                         : mode == 2              ? gemv_go<false, true, 0>(pl.dn, pd, s)
                                                  : gemv_go<false, true, 2>(pl.dn, pd, s));
                    }
                    P ph{W.head(), nullptr, y2, V, size_t(D) * 2, D, x, nw, nullptr};
                    ((mode == 0 || mode == 4) ? gemv_go<false, false>(pl.hd, ph, s)
                     : mode == 1              ? gemv_go<false, true, 1>(pl.hd, ph, s)
                     : mode == 2              ? gemv_go<false, true, 0>(pl.hd, ph, s)
                                              : gemv_go<false, true, 2>(pl.hd, ph, s));
                };
                const float us = replay_us(s, step, 50, 1, 3);
                printf(
                    "tiny/layer %d pdl+prefetch mode %d  %-42s step %7.1f us  (%.0f%% of floor)\n",
                    tinies, mode, pl.name, us, 100 * (total / 4.2e6) / us);
                fflush(stdout);
            }
}
