// Times GEMV variants of the shapes of SmolLM2 135M, 360M and 1.7B on one
// GPU: R weight rows a warp, U chunks of 8 a lane loaded before use, KS
// warps a group of rows (split K). The kernel (gemv-lab.cuh) is a copy of the
// loop of gemv_kernel in smol-cuda.cu (f16, q8_0 and q4_1 weights, f32
// activations, a folded RMS norm, SwiGLU and residual epilogues) so that
// variants smol does not build can be timed. Each launch is timed in a CUDA
// graph of 60 launches over copies of the weights that exceed the L2, the
// best of 5 replays. "!" marks a variant whose result differs from the
// base's (k1r1u1) by more than 1e-5 relative.
//
//   nvcc -O3 -std=c++20 -arch=sm_90 -o gemv-variants scripts/gemv-variants.cu
//   ./gemv-variants
#include "gemv-lab.cuh"

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
    const float best = replay_us(
                           s,
                           [&] {
                               for (int i = 0; i < L; ++i) launch(i % copies, s);
                           },
                           1, 5, 1) /
                       L;
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
