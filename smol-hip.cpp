// smol-hip.cpp - the CUDA backend built for ROCm: one of smol-cuda*.cu, the
// one SMOL_HIP_SOURCE names, compiled by hipcc with smol-hip.h mapping the
// CUDA names to HIP's. The build makes one object a source, as it does for
// CUDA, so the sources compile side by side. There is no second copy of
// any kernel.

#define SMOL_HIP 1

#include "smol-hip.h"

#ifndef SMOL_HIP_SOURCE
#error "build smol-hip.cpp with -DSMOL_HIP_SOURCE=\"smol-cuda-<part>.cu\""
#endif
#include SMOL_HIP_SOURCE
