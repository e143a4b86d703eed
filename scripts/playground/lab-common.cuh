// lab-common.cuh - what the playground's labs share: CK, which stops the
// program with the call that failed and CUDA's error, the product's device
// helpers under their short names (smol-cuda-common.cuh's warp_sum,
// griddep_wait, griddep_launch, ...), a launch that may go early (the
// product's, checked as CK does), device buffers of random values (f16
// weights, f32 activations) that also come back as host copies for a CPU
// reference, poisoned outputs, the check of a result against its reference,
// and one GEMV of a decode step's chain (Op). The labs build with the
// repository's root on the include path (-I.).
#pragma once
#include "smol-cuda-common.cuh" // warp_sum, griddep_*, launch_kernel_smem, ...

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <random>
#include <vector>

// CK(call): a lab whose calls return another status type (cuBLAS's, say)
// adds a lab_check overload for it.
inline void lab_check(cudaError_t e, const char * call, int line) {
    if (e == cudaSuccess) return;
    std::fprintf(stderr, "%s: %s (line %d)\n", call, cudaGetErrorString(e), line);
    std::exit(1);
}
#define CK(x) lab_check((x), #x, __LINE__)

// The product's device helpers the labs' kernels call by their short names.
using smol::gpu::griddep_launch;
using smol::gpu::griddep_wait;
using smol::gpu::prefetch_l2;
using smol::gpu::rms_scale;
using smol::gpu::silu_mul;
using smol::gpu::warp_sum;

// kernel<<<grid, block, smem, s>>>(args...) through the product's
// launch_kernel_smem, launched early (programmatic dependent launch: it may
// start while the kernel before it ends, up to its griddep_wait) when
// `early` is set. The product leaves a failed launch to the checks that
// follow it; a lab stops at once (CK).
template <typename... P, typename... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, bool early,
            A... args) {
    smol::gpu::launch_kernel_smem(kernel, grid, block, smem, s, early, args...);
    CK(cudaGetLastError());
}

// n f16 weights at w, normal(0, 0.02): a pattern of `period` values from
// `seed`, repeated (weights larger than the L2 need no more variety). The
// pattern comes back: weight e is its value e % period.
inline std::vector<__half> fill_weights(__half * w, size_t n, unsigned seed,
                                        size_t period = size_t(32) << 20) {
    std::vector<__half> h(std::min(n, period));
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0, 0.02f);
    for (auto & v : h) v = __float2half(d(rng));
    for (size_t at = 0; at < n; at += h.size())
        CK(cudaMemcpy(w + at, h.data(), std::min(h.size(), n - at) * 2, cudaMemcpyHostToDevice));
    return h;
}

// n floats at x: normal(0, 1), or with around_one 1 + 0.1 normal(0, 1) (a
// norm's weights); the host's copy comes back.
inline std::vector<float> fill_floats(float * x, size_t n, std::mt19937 & rng,
                                      bool around_one = false) {
    std::normal_distribution<float> d(0, 1);
    std::vector<float> h(n);
    for (auto & v : h) v = around_one ? 1 + 0.1f * d(rng) : d(rng);
    CK(cudaMemcpy(x, h.data(), n * 4, cudaMemcpyHostToDevice));
    return h;
}

// n floats at y set to NaN, so that an output a kernel leaves unwritten
// fails its check.
inline void poison(float * y, size_t n) {
    CK(cudaMemset(y, 0xff, n * 4));
}

// Whether got matches ref within tol times ref's largest magnitude (a NaN
// never does); prints the largest error either way.
inline bool close_to(const char * what, const std::vector<float> & got,
                     const std::vector<double> & ref, double tol) {
    double err = 0, top = 0;
    bool ok = got.size() == ref.size();
    for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
        top = std::max(top, std::fabs(ref[i]));
        const double e = std::fabs(double(got[i]) - ref[i]);
        if (!(e == e)) ok = false;
        err = std::max(err, e == e ? e : HUGE_VAL);
    }
    ok = ok && err <= tol * top;
    std::printf("%s max err %.2e (max %.2f, allowed %.2e)%s", what, err, top, tol * top,
                ok ? "" : " FAIL");
    return ok;
}

// One GEMV of a decode step: y = W x, with an RMS norm folded in, SwiGLU's
// up rows, a residual.
struct Op {
    const __half * w;  // rows x K
    const __half * wu; // SwiGLU's up rows (y = silu(w.x) * (wu.x)), or null
    const float * x;   // the input, K floats
    const float * nw;  // RMS norm weights folded into the product, or null
    const float * res; // residual added, or null
    float * y;
    int rows, K;
};
