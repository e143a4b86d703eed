// smol-hip.cpp - the CUDA backend built for ROCm: the kernels and the backend
// of smol-cuda.cu, compiled by hipcc with smol-hip.h mapping the CUDA names
// to HIP's. There is no second copy of any kernel.

#define SMOL_HIP 1

#include "smol-hip.h"

#include "smol-cuda.cu"
