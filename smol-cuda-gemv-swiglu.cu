// smol-cuda-gemv-swiglu.cu - the GEMV and small-batch kernels of
// smol-cuda-gemv.cuh for SwiGLU (gate and up read together), an object of
// their own so that they compile beside the plain ones.

#include "smol-cuda-gemv.cuh"

namespace smol::gpu {

template void launch_mm_type<true>(int type, const mm_params & p, int rows, const mm_choice & c,
                                   cudaStream_t st, bool pdl);

} // namespace smol::gpu
