// Times GEMV variants of the shapes of SmolLM2 135M, 360M and 1.7B on one
// GPU: R weight rows a warp, U chunks of 8 a lane loaded before use, KS
// warps a group of rows (split K). The kernel is a stand-alone copy of the
// loop of gemv_kernel in smol-cuda.cu (f16, q8_0 and q4_1 weights, f32
// activations, a folded RMS norm, SwiGLU and residual epilogues) so that
// variants smol does not build can be timed. Each launch is timed in a CUDA
// graph of 60 launches over copies of the weights that exceed the L2, the
// best of 5 replays. "!" marks a variant whose result differs from the
// base's (k1r1u1) by more than 1e-5 relative.
//
//   nvcc -O3 -std=c++20 -arch=sm_90 -o gemv-variants scripts/gemv-variants.cu
//   ./gemv-variants
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cuda_fp16.h>
#include <random>
#include <string>
#include <vector>
#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__);                           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
enum { F16 = 1, Q8 = 8, Q41 = 3 };
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
__device__ __forceinline__ float warp_sum(float v) {
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffff, v, m);
    return v;
}
__device__ __forceinline__ float ldh(const uint8_t * p) {
    return __half2float(*reinterpret_cast<const __half *>(p));
}
template <int T>
__device__ __forceinline__ void load_chunk(const uint8_t * __restrict__ row, int ch, float (&v)[8],
                                           int & e0, int & e1) {
    if constexpr (T == F16) {
        const uint4 u = reinterpret_cast<const uint4 *>(row)[ch];
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            v[2 * i] = __half2float(__ushort_as_half(uint16_t(w[i] & 0xffff)));
            v[2 * i + 1] = __half2float(__ushort_as_half(uint16_t(w[i] >> 16)));
        }
        e0 = 8 * ch;
        e1 = e0 + 4;
    } else if constexpr (T == Q8) {
        const int q = ch & 3;
        const uint8_t * blk = row + size_t(ch >> 2) * 34;
        const float d = ldh(blk);
        const uint16_t * qs = reinterpret_cast<const uint16_t *>(blk + 2 + 8 * q);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint16_t w = qs[i];
            v[2 * i] = d * float(int8_t(w & 0xff));
            v[2 * i + 1] = d * float(int8_t(w >> 8));
        }
        e0 = 32 * (ch >> 2) + 8 * q;
        e1 = e0 + 4;
    } else {
        const int q = ch & 3;
        const uint8_t * blk = row + size_t(ch >> 2) * 20;
        const float d = ldh(blk), m = ldh(blk + 2);
        const uint32_t w = *reinterpret_cast<const uint32_t *>(blk + 4 + 4 * q);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t b = (w >> (8 * i)) & 0xff;
            v[i] = d * float(b & 15) + m;
            v[4 + i] = d * float(b >> 4) + m;
        }
        e0 = 32 * (ch >> 2) + 4 * q;
        e1 = e0 + 16;
    }
}
template <int T, bool SW, int KS, int R, int U>
__global__ void __launch_bounds__(128) gemv(const P p) {
    constexpr int NW = 4, GPB = NW / KS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, ks = warp % KS;
    const int r0 = (blockIdx.x * GPB + warp / KS) * R;
    const bool valid = r0 < p.rows;
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
                float4 a = *reinterpret_cast<const float4 *>(p.x + e0[u]);
                float4 b = *reinterpret_cast<const float4 *>(p.x + e1[u]);
                if (p.nw) {
                    const float4 na = *reinterpret_cast<const float4 *>(p.nw + e0[u]);
                    const float4 nb = *reinterpret_cast<const float4 *>(p.nw + e1[u]);
                    ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y +
                          b.z * b.z + b.w * b.w;
                    a = make_float4(a.x * na.x, a.y * na.y, a.z * na.z, a.w * na.w);
                    b = make_float4(b.x * nb.x, b.y * nb.y, b.z * nb.z, b.w * nb.w);
                }
#pragma unroll
                for (int j = 0; j < R; ++j) {
                    const float * w = v[u][j];
                    acc[j] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x +
                              w[5] * b.y + w[6] * b.z + w[7] * b.w;
                    if constexpr (SW) {
                        const float * q = vu[u][j];
                        accu[j] += q[0] * a.x + q[1] * a.y + q[2] * a.z + q[3] * a.w + q[4] * b.x +
                                   q[5] * b.y + q[6] * b.z + q[7] * b.w;
                    }
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
            const float s = 1.0f / sqrtf(float(ssd / p.K) + 1e-5f);
            a *= s;
            au *= s;
        }
        if (SW) a = a / (1.f + expf(-a)) * au;
        if (p.res) a += p.res[r0 + lane];
        p.y[r0 + lane] = a;
    }
}
size_t row_bytes(int T, int K) {
    return T == F16 ? 2 * K : T == Q8 ? K / 32 * 34 : K / 32 * 20;
}
uint8_t * pool;
size_t pool_bytes = size_t(512) << 20;
float *x, *nw, *res, *y, *yref;
template <int T, bool SW, int KS, int R, int U>
float run(int N, int K, bool norm, bool resid, bool ref) {
    if (N % R) return -1;
    const size_t rb = row_bytes(T, K), wb = rb * N * (SW ? 2 : 1);
    const int copies = std::max<size_t>(2, (size_t(150) << 20) / wb + 1);
    if (wb * copies > pool_bytes) return -2;
    const int groups = N / R;
    const int blocks = (groups + 4 / KS - 1) / (4 / KS);
    auto launch = [&](int c, cudaStream_t s) {
        P p{pool + wb * c,
            SW ? pool + wb * c + rb * N : nullptr,
            ref ? yref : y,
            N,
            rb,
            K,
            x,
            norm ? nw : nullptr,
            resid ? res : nullptr};
        gemv<T, SW, KS, R, U><<<blocks, 128, 0, s>>>(p);
    };
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    const int L = 60;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < L; ++i) launch(i % copies, s);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    float best = 1e9;
    for (int rep = 0; rep < 5; ++rep) {
        cudaEventRecord(a, s);
        CK(cudaGraphLaunch(ge, s));
        cudaEventRecord(b, s);
        CK(cudaEventSynchronize(b));
        float ms;
        cudaEventElapsedTime(&ms, a, b);
        best = std::min(best, ms * 1000 / L);
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
    return best;
}
double maxrel(int N) {
    std::vector<float> a(N), b(N);
    cudaMemcpy(a.data(), y, N * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(b.data(), yref, N * 4, cudaMemcpyDeviceToHost);
    double m = 0, s = 0;
    for (int i = 0; i < N; ++i) {
        m = std::max(m, (double)fabs(a[i] - b[i]));
        s = std::max(s, (double)fabs(b[i]));
    }
    return m / (s + 1e-30);
}
template <int T, bool SW> void shape(const char * name, int N, int K, bool norm, bool resid) {
    const size_t rb = row_bytes(T, K);
    const double mb = rb * N * (SW ? 2 : 1) / 1e6;
    float t0 = run<T, SW, 1, 1, 1>(N, K, norm, resid, true);
    printf("%-22s %6dx%-5d %7.1f MB | base %6.2f us %5.2f TB/s |", name, N, K, mb, t0, mb / t0);
    auto one = [&](auto ks, auto r, auto u) {
        constexpr int KS = decltype(ks)::value, R = decltype(r)::value, U = decltype(u)::value;
        float t = run<T, SW, KS, R, U>(N, K, norm, resid, false);
        if (t < 0) return;
        double e = maxrel(N);
        printf(" k%dr%du%d %.2f%s", KS, R, U, t, e > 1e-5 ? "!" : "");
    };
    using I1 = std::integral_constant<int, 1>;
    using I2 = std::integral_constant<int, 2>;
    using I4 = std::integral_constant<int, 4>;
    auto ks_all = [&](auto r, auto u) {
        one(I1{}, r, u);
        one(I2{}, r, u);
        one(I4{}, r, u);
    };
    ks_all(I1{}, I2{});
    ks_all(I1{}, I4{});
    ks_all(I2{}, I1{});
    ks_all(I2{}, I2{});
    ks_all(I4{}, I1{});
    ks_all(I4{}, I2{});
    printf("\n");
    fflush(stdout);
}
int main() {
    CK(cudaMalloc(&pool, pool_bytes));
    {
        std::vector<uint8_t> h(pool_bytes);
        std::mt19937 rng(7);
        for (size_t i = 0; i < h.size(); i += 2) {
            float f = std::normal_distribution<float>(0, 0.02f)(rng);
            __half hf = __float2half(f);
            memcpy(&h[i], &hf, 2);
            if (i > (size_t(8) << 20)) {
                memcpy(&h[i], &h[i - (size_t(8) << 20) + 2], 2);
            }
        }
        CK(cudaMemcpy(pool, h.data(), pool_bytes, cudaMemcpyHostToDevice));
    }
    const int KM = 16384;
    std::vector<float> hx(KM);
    std::mt19937 rng(3);
    for (auto & v : hx) v = std::normal_distribution<float>(0, 1)(rng);
    CK(cudaMalloc(&x, KM * 4));
    CK(cudaMalloc(&nw, KM * 4));
    CK(cudaMalloc(&res, 65536 * 4));
    CK(cudaMalloc(&y, 65536 * 4));
    CK(cudaMalloc(&yref, 65536 * 4));
    cudaMemcpy(x, hx.data(), KM * 4, cudaMemcpyHostToDevice);
    for (auto & v : hx) v = 1 + 0.1f * std::normal_distribution<float>(0, 1)(rng);
    cudaMemcpy(nw, hx.data(), KM * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(res, hx.data(), 16384 * 4, cudaMemcpyHostToDevice);
    printf("f16\n");
    shape<F16, false>("1.7B qkv", 6144, 2048, true, false);
    shape<F16, false>("1.7B o", 2048, 2048, false, true);
    shape<F16, true>("1.7B gate_up", 8192, 2048, true, false);
    shape<F16, false>("1.7B down", 2048, 8192, false, true);
    shape<F16, false>("1.7B head", 49152, 2048, true, false);
    shape<F16, false>("360M qkv", 1600, 960, true, false);
    shape<F16, true>("360M gate_up", 2560, 960, true, false);
    shape<F16, false>("360M down", 960, 2560, false, true);
    shape<F16, false>("135M qkv", 960, 576, true, false);
    shape<F16, false>("135M o", 576, 576, false, true);
    shape<F16, true>("135M gate_up", 1536, 576, true, false);
    shape<F16, false>("135M down", 576, 1536, false, true);
    shape<F16, false>("135M head", 49152, 576, true, false);
    printf("q8_0\n");
    shape<Q8, false>("1.7B qkv", 6144, 2048, true, false);
    shape<Q8, false>("1.7B o", 2048, 2048, false, true);
    shape<Q8, true>("1.7B gate_up", 8192, 2048, true, false);
    shape<Q8, false>("1.7B down", 2048, 8192, false, true);
    printf("q4_1\n");
    shape<Q41, false>("135M qkv", 960, 576, true, false);
    shape<Q41, true>("135M gate_up", 1536, 576, true, false);
    shape<Q41, false>("135M down", 576, 1536, false, true);
    shape<Q41, false>("1.7B qkv", 6144, 2048, true, false);
    shape<Q41, true>("1.7B gate_up", 8192, 2048, true, false);
    return 0;
}
