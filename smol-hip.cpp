// smol-hip.cpp - the CUDA backend built for ROCm: the kernels and the backend
// of smol-cuda*.cu, compiled by hipcc as one translation unit with smol-hip.h
// mapping the CUDA names to HIP's. There is no second copy of any kernel.
// Each file's kernels are in an anonymous namespace, which here is one, so no
// two files may define the same name.

#define SMOL_HIP 1

#include "smol-hip.h"

#include "smol-cuda-attn.cu"
#include "smol-cuda-autotune.cu"
#include "smol-cuda-blas.cu"
#include "smol-cuda-fattn.cu"
#include "smol-cuda-gemv.cu"
#include "smol-cuda-graphs.cu"
#include "smol-cuda-memory.cu"
#include "smol-cuda-ops.cu"
#include "smol-cuda-steps.cu"
#include "smol-cuda.cu"
