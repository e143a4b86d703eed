// What the GPU labs in scripts/ share: CK, which stops the program with the
// call that failed and CUDA's error, a warp's sum, the global timer, a
// launch that may go early, device buffers of random values (f16 weights,
// f32 activations) from a seeded pattern, a decode step's GEMV weights
// (step_weights), and one GEMV of a decode step's chain (Op).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <random>
#include <vector>

// CK(call): a lab whose calls return another status type (cuBLAS's) adds
// a lab_check overload for it.
inline void lab_check(cudaError_t e, const char * call, int line) {
    if (e == cudaSuccess) return;
    std::fprintf(stderr, "%s: %s (line %d)\n", call, cudaGetErrorString(e), line);
    std::exit(1);
}
#define CK(x) lab_check((x), #x, __LINE__)

// The sum of v over a warp's lanes.
__device__ __forceinline__ float warp_sum(float v) {
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

// The GPU's global timer, in ns (comparable across SMs).
__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

// kernel<<<grid, block, smem, s>>>(args...), launched early (programmatic
// dependent launch: it may start while the kernel before it ends, up to its
// griddepcontrol.wait) when `early` is set.
template <typename... P, typename... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, bool early,
            A... args) {
    cudaLaunchAttribute at{};
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t c{};
    c.gridDim = grid;
    c.blockDim = block;
    c.dynamicSmemBytes = smem;
    c.stream = s;
    c.attrs = &at;
    c.numAttrs = early ? 1 : 0;
    CK(cudaLaunchKernelEx(&c, kernel, args...));
}

// n f16 weights at w, normal(0, 0.02): a pattern of `period` values from
// `seed`, repeated (weights larger than the L2 need no more variety).
inline void fill_weights(__half * w, size_t n, unsigned seed, size_t period = size_t(32) << 20) {
    std::vector<__half> h(std::min(n, period));
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0, 0.02f);
    for (auto & v : h) v = __float2half(d(rng));
    for (size_t at = 0; at < n; at += h.size())
        CK(cudaMemcpy(w + at, h.data(), std::min(h.size(), n - at) * 2, cudaMemcpyHostToDevice));
}

// The f16 weights of a decode step's GEMVs in one allocation, random (see
// fill_weights): each layer's q/k/v (QKV rows), output (D), gate then up (F
// each) and down (D rows of F) matrices, then the output head (V rows);
// every matrix but down has rows of D.
struct step_weights {
    int L, D, F, QKV;
    size_t layer_bytes, bytes;
    uint8_t * base = nullptr;
    step_weights(int L, int D, int F, int QKV, int V, size_t period = size_t(32) << 20)
        : L(L), D(D), F(F), QKV(QKV),
          layer_bytes((size_t(QKV) + D + 2 * size_t(F)) * D * 2 + size_t(D) * F * 2),
          bytes(layer_bytes * L + size_t(V) * D * 2) {
        CK(cudaMalloc(&base, bytes));
        fill_weights(reinterpret_cast<__half *>(base), bytes / 2, 5, period);
    }
    step_weights(const step_weights &) = delete; // one owner of the allocation
    step_weights & operator=(const step_weights &) = delete;
    ~step_weights() { (void)cudaFree(base); }
    const uint8_t * qkv(int l) const { return base + layer_bytes * l; }
    const uint8_t * out(int l) const { return qkv(l) + size_t(QKV) * D * 2; }
    const uint8_t * gate(int l) const { return out(l) + size_t(D) * D * 2; }
    const uint8_t * up(int l) const { return gate(l) + size_t(F) * D * 2; }
    const uint8_t * down(int l) const { return up(l) + size_t(F) * D * 2; }
    const uint8_t * head() const { return base + layer_bytes * L; }
};

// n floats at x: normal(0, 1), or with around_one 1 + 0.1 normal(0, 1) (a
// norm's weights).
inline void fill_floats(float * x, size_t n, std::mt19937 & rng, bool around_one = false) {
    std::normal_distribution<float> d(0, 1);
    std::vector<float> h(n);
    for (auto & v : h) v = around_one ? 1 + 0.1f * d(rng) : d(rng);
    CK(cudaMemcpy(x, h.data(), n * 4, cudaMemcpyHostToDevice));
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
