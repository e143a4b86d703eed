// smol-hip.h - the vendor header that lets smol-cuda*.cu compile for ROCm:
// it includes the HIP runtime and maps every cuda* name the backend uses to
// its hip* twin. Only the names smol-cuda*.cu use are here; add one when the
// backend starts using it. There is no BLAS on this path (no hipBLAS), so
// the backend's own matmul kernels serve every batch size.

#ifndef SMOL_HIP_H
#define SMOL_HIP_H

#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>

#define SMOL_GPU_VENDOR "HIP"

// Warp-level primitives over 32 lanes. AMD's wavefronts are 32 (RDNA) or 64
// (CDNA) lanes wide; a width of 32 keeps every shuffle inside one 32-lane
// half, which is what the kernels assume.
#define SMOL_SHFL_XOR(v, m) __shfl_xor((v), (m), 32)
#define SMOL_SHFL(v, l)     __shfl((v), (l), 32)
// After __threadfence (which invalidates the vector L1 on AMD) a plain load
// sees what other blocks wrote.
#define SMOL_LOAD_L2(p) (*(p))

#define cudaDevAttrMultiProcessorCount   hipDeviceAttributeMultiprocessorCount
#define cudaDevAttrL2CacheSize           hipDeviceAttributeL2CacheSize
#define cudaDeviceGetAttribute           hipDeviceGetAttribute
#define cudaDeviceProp                   hipDeviceProp_t
#define cudaError_t                      hipError_t
#define cudaEventCreateWithFlags         hipEventCreateWithFlags
#define cudaEventDefault                 hipEventDefault
#define cudaEventDestroy                 hipEventDestroy
#define cudaEventBlockingSync            hipEventBlockingSync
#define cudaEventDisableTiming           hipEventDisableTiming
#define cudaEventElapsedTime             hipEventElapsedTime
#define cudaEventQuery                   hipEventQuery
#define cudaEventRecord                  hipEventRecord
#define cudaEventSynchronize             hipEventSynchronize
#define cudaEvent_t                      hipEvent_t
#define cudaFree                         hipFree
#define cudaFreeHost                     hipHostFree
#define cudaGetDeviceCount               hipGetDeviceCount
#define cudaGetDeviceProperties          hipGetDeviceProperties
#define cudaGetErrorName                 hipGetErrorName
#define cudaGetErrorString               hipGetErrorString
#define cudaGetLastError                 hipGetLastError
#define cudaGraphDestroy                 hipGraphDestroy
#define cudaGraphExecDestroy             hipGraphExecDestroy
#define cudaGraphExec_t                  hipGraphExec_t
#define cudaGraphInstantiate(e, g, f)    hipGraphInstantiate((e), (g), nullptr, nullptr, 0)
#define cudaGraphLaunch                  hipGraphLaunch
#define cudaGraph_t                      hipGraph_t
#define cudaMalloc                       hipMalloc
#define cudaMallocHost                   hipHostMalloc
#define cudaHostAlloc                    hipHostMalloc
#define cudaHostAllocPortable            hipHostMallocPortable
#define cudaMemcpy2DAsync                hipMemcpy2DAsync
#define cudaStreamWaitEvent              hipStreamWaitEvent
#define cudaMemGetInfo                   hipMemGetInfo
#define cudaMemcpyAsync                  hipMemcpyAsync
#define cudaMemcpyDefault                hipMemcpyDefault
#define cudaMemcpyDeviceToHost           hipMemcpyDeviceToHost
#define cudaMemcpyHostToDevice           hipMemcpyHostToDevice
#define cudaMemsetAsync                  hipMemsetAsync
#define cudaSetDevice                    hipSetDevice
#define cudaStreamBeginCapture           hipStreamBeginCapture
#define cudaStreamCaptureModeThreadLocal hipStreamCaptureModeThreadLocal
#define cudaStreamCreateWithFlags        hipStreamCreateWithFlags
#define cudaStreamDestroy                hipStreamDestroy
#define cudaStreamEndCapture             hipStreamEndCapture
#define cudaStreamNonBlocking            hipStreamNonBlocking
#define cudaStreamSynchronize            hipStreamSynchronize
#define cudaStream_t                     hipStream_t
#define cudaSuccess                      hipSuccess
#define cudaErrorMemoryAllocation        hipErrorMemoryAllocation
#define cudaErrorNotReady                hipErrorNotReady
#define CUDART_CB

#endif // SMOL_HIP_H
