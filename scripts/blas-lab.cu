// What a cuBLAS matmul over bf16 weights costs each way smol could run it,
// against f16 weights, for the 1.7B's and 135M's shapes: y[M][N] = x W^T.
//   f16     f16 weights, x as f16 (M columns): what f16 models run
//   pairs   bf16 weights as they are, x as bf16 hi and lo (2 M columns)
//   single  bf16 weights as they are, x as bf16 alone (M columns)
//   deq     bf16 weights dequantized to f16 by a kernel first, then f16
// Each variant runs over copies of its weights that together pass the L2
// (so each run reads its weights from memory), 30 times; the mean in us.
//
//   nvcc -O3 -std=c++20 -arch=sm_90 -o blas-lab scripts/blas-lab.cu -lcublas && ./blas-lab
#include "lab-common.cuh"

#include <cublas_v2.h>
#include <cuda_bf16.h>

inline void lab_check(cublasStatus_t s, const char * call, int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    std::fprintf(stderr, "%s: cuBLAS status %d (line %d)\n", call, int(s), line);
    std::exit(1);
}

// bf16 rows to f16, eight elements a thread.
__global__ void bf16_to_f16(const __nv_bfloat16 * w, __half * d, size_t n) {
    for (size_t i = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) * 8; i < n;
         i += size_t(gridDim.x) * blockDim.x * 8) {
        const uint4 v = *reinterpret_cast<const uint4 *>(w + i);
        const __nv_bfloat162 * b = reinterpret_cast<const __nv_bfloat162 *>(&v);
        uint4 o;
        __half2 * h = reinterpret_cast<__half2 *>(&o);
        for (int j = 0; j < 4; ++j) h[j] = __float22half2_rn(__bfloat1622float2(b[j]));
        *reinterpret_cast<uint4 *>(d + i) = o;
    }
}

int main() {
    cublasHandle_t blas;
    CK(cublasCreate(&blas));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    CK(cublasSetStream(blas, st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    struct shape {
        const char * name;
        int N, K;
    };
    const shape shapes[] = {{"1.7B q", 2048, 2048},    {"1.7B gate", 8192, 2048},
                            {"1.7B down", 2048, 8192}, {"1.7B output", 49152, 2048},
                            {"135M q", 576, 576},      {"135M gate", 1536, 576},
                            {"135M down", 576, 1536},  {"135M output", 49152, 576}};
    const int Ms[] = {8, 32, 64, 128, 512, 4096};
    const size_t max_x = size_t(2) * 4096 * 8192, max_y = size_t(2) * 4096 * 49152;
    void * x;
    float * y;
    __half * deq;
    CK(cudaMalloc(&x, max_x * 2));
    CK(cudaMalloc(&y, max_y * 4));
    CK(cudaMalloc(&deq, size_t(49152) * 2048 * 2));
    fill_weights(static_cast<__half *>(x), max_x, 7); // small values; the bits serve as bf16 too
    std::printf("%-12s %5s %10s %10s %10s %10s   (us, mean of 30)\n", "shape", "M", "f16", "pairs",
                "single", "deq");
    for (const shape & s : shapes) {
        const size_t n = size_t(s.N) * s.K;
        const int copies = int(std::max<size_t>(2, (size_t(160) << 20) / (n * 2) + 1));
        __half * w;
        CK(cudaMalloc(&w, n * 2 * copies));
        fill_weights(w, n * copies, 3);
        for (int M : Ms) {
            const float one = 1.0f, zero = 0.0f;
            int it = 0;
            auto gemm = [&](cudaDataType t, const void * wp, int cols) {
                CK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, s.N, cols, s.K, &one, wp, t, s.K, x,
                                t, s.K, &zero, y, CUDA_R_32F, s.N, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
            };
            auto next = [&]() { return w + (it++ % copies) * n; };
            auto time = [&](auto && run) {
                for (int i = 0; i < 3; ++i) run();
                CK(cudaEventRecord(e0, st));
                for (int i = 0; i < 30; ++i) run();
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float ms = 0;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                return 1000.0 * ms / 30;
            };
            const double f16 = time([&] { gemm(CUDA_R_16F, next(), M); });
            const double pairs = time([&] { gemm(CUDA_R_16BF, next(), 2 * M); });
            const double single = time([&] { gemm(CUDA_R_16BF, next(), M); });
            const double dq = time([&] {
                bf16_to_f16<<<1024, 256, 0, st>>>(reinterpret_cast<const __nv_bfloat16 *>(next()),
                                                  deq, n);
                gemm(CUDA_R_16F, deq, M);
            });
            std::printf("%-12s %5d %10.1f %10.1f %10.1f %10.1f\n", s.name, M, f16, pairs, single,
                        dq);
        }
        CK(cudaFree(w));
    }
    return 0;
}
