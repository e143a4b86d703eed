#!/usr/bin/env bash
# Compiles and links the GPU backends where no GPU is present: CUDA for one
# architecture (sm_90) with the toolkit's nvcc, and HIP for gfx1030 and
# gfx90a with Debian's hipcc (installed here if missing). Nothing runs: the
# GPU tests run on a GPU machine through scripts/test-gpu.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

if ! command -v nvcc >/dev/null; then
    for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
        [ -x "$d/nvcc" ] && export PATH="$d:$PATH" && break
    done
fi
if ! command -v nvcc >/dev/null; then
    echo "check-gpu-builds: nvcc is not installed, so the CUDA backend cannot be compiled" >&2
    exit 1
fi
echo "check-gpu-builds: CUDA backend for sm_90 ($(nvcc --version | tail -1))"
cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DSMOL_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DSMOL_BUILD_EXAMPLES=OFF >/dev/null
cmake --build build-cuda -j"$(nproc)" --target smol test-cuda

scripts/install-packages.sh hipcc libamdhip64-dev rocm-device-libs
echo "check-gpu-builds: HIP backend for gfx1030 and gfx90a"
cmake -S . -B build-hip -DCMAKE_BUILD_TYPE=Release -DSMOL_HIP=ON -DSMOL_BUILD_EXAMPLES=OFF >/dev/null
cmake --build build-hip -j"$(nproc)" --target smol test-cuda
echo "check-gpu-builds: the CUDA and HIP backends compile and link"
