// What one link of a decode step's chain of kernels costs when the kernels do
// almost nothing: a CUDA graph of N launches, each waiting for the one
// before it (griddepcontrol.wait under programmatic dependent launch, or an
// ordinary launch), reading a value the one before wrote and writing the
// next. The shapes vary: blocks a launch, threads a block, and every fifth
// launch made like a short history's attention (a few blocks of 256
// threads, with 140 KiB of shared memory, which asks the SMs for another
// carveout, or with 16 KiB, which does not). Each line is the best of 5
// replays of the graph, in us a launch.
//
//   nvcc -O3 -std=c++20 -arch=sm_90 -o chain-lab scripts/chain-lab.cu
//   ./chain-lab
#include "lab-common.cuh" // CK

// Every block reads x[0] once the kernel before has ended; block 0 writes
// y[0] = x[0] + 1. With load, each thread first reads 16 bytes of w
// (weights: no kernel's output), as smol's GEMVs do before their wait.
__global__ void link(const int * x, int * y, const int4 * w, int load) {
    __shared__ int sm[1]; // (the dynamic shared memory only sets the carveout)
    int4 v{};
    if (load) v = __ldg(w + size_t(blockIdx.x) * blockDim.x + threadIdx.x);
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    const int a = *(volatile const int *)x;
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        sm[0] = a;
        y[0] = sm[0] + 1 + (v.x == 12345 ? v.y : 0);
    }
}

struct shape {
    int grid, threads, smem;
};

int main() {
    const int N = 150;
    int *buf, sms = 0;
    int4 * w;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaMalloc(&buf, 2 * N * sizeof(int) + 64));
    CK(cudaMemset(buf, 0, 2 * N * sizeof(int) + 64));
    const size_t w_bytes = size_t(4096) * 1024 * 16; // 4096 blocks of 1024 threads
    CK(cudaMalloc(&w, w_bytes));
    CK(cudaMemset(w, 1, w_bytes));
    CK(cudaFuncSetAttribute(link, cudaFuncAttributeMaxDynamicSharedMemorySize, 140 * 1024));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    auto run = [&](const char * name, shape base, shape fifth, bool pdl, int load) {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < N; ++i) {
            const shape sh = i % 5 == 4 ? fifth : base;
            launch(link, dim3(sh.grid), dim3(sh.threads), size_t(sh.smem), s, pdl,
                   (const int *)(buf + i), buf + i + 1, (const int4 *)w, load);
        }
        CK(cudaStreamEndCapture(s, &g));
        cudaGraphExec_t ex;
        CK(cudaGraphInstantiate(&ex, g, 0));
        float best = 1e9f;
        for (int r = 0; r < 6; ++r) {
            CK(cudaEventRecord(e0, s));
            CK(cudaGraphLaunch(ex, s));
            CK(cudaEventRecord(e1, s));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (r > 0) best = std::min(best, ms);
        }
        int last = 0;
        CK(cudaMemcpy(&last, buf + N, sizeof last, cudaMemcpyDeviceToHost));
        std::printf("%-44s %s  %6.2f us a launch  (chain value %d)\n", name, pdl ? "pdl " : "plain",
                    best * 1e3 / N, last);
        CK(cudaGraphExecDestroy(ex));
        CK(cudaGraphDestroy(g));
        CK(cudaMemset(buf, 0, 2 * N * sizeof(int)));
    };

    for (bool pdl : {true, false}) {
        for (int grid : {1, sms, 2 * sms, 4 * sms, 8 * sms, 1024, 16 * sms}) {
            char name[64];
            std::snprintf(name, sizeof name, "%d blocks of 128", grid);
            run(name, {grid, 128, 0}, {grid, 128, 0}, pdl, 0);
        }
        run("132 blocks of 512", {sms, 512, 0}, {sms, 512, 0}, pdl, 0);
        run("132 blocks of 1024", {sms, 1024, 0}, {sms, 1024, 0}, pdl, 0);
        run("1024 of 128, loads before the wait", {1024, 128, 0}, {1024, 128, 0}, pdl, 1);
        run("1024 of 128; 5th: 3 of 256, 140 KiB", {1024, 128, 0}, {3, 256, 140 * 1024}, pdl, 0);
        run("1024 of 128; 5th: 3 of 256, 16 KiB", {1024, 128, 0}, {3, 256, 16 * 1024}, pdl, 0);
        run("1024 of 128; 5th: 132 of 256, 140 KiB", {1024, 128, 0}, {sms, 256, 140 * 1024}, pdl,
            0);
        run("1024 of 128; 5th: 132 of 256, 16 KiB", {1024, 128, 0}, {sms, 256, 16 * 1024}, pdl, 0);
        run("132 of 512; 5th: 3 of 256, 140 KiB", {sms, 512, 0}, {3, 256, 140 * 1024}, pdl, 0);
        run("132 of 512; 5th: 3 of 256, 16 KiB", {sms, 512, 0}, {3, 256, 16 * 1024}, pdl, 0);
    }
    return 0;
}
