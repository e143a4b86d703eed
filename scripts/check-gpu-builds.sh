#!/usr/bin/env bash
# Compiles and links the GPU backends where no GPU is present: CUDA for one
# architecture (sm_90) with the toolkit's nvcc, and HIP for gfx1030 and
# gfx90a with Debian's hipcc (installed here if missing); then compiles the
# kernel playground's labs (scripts/playground) for sm_90. Nothing runs: the
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

# The labs use Hopper's bulk copies and mbarriers, so sm_90 as the product;
# they include the product's headers (the root on the include path);
# compiled only (objects in build-playground), two at a time.
echo "check-gpu-builds: the playground's labs for sm_90"
mkdir -p build-playground
find scripts/playground -name '*.cu' -print0 | sort -z |
    xargs -0 -P 2 -I{} sh -c \
        'nvcc -O3 -std=c++20 -arch=sm_90 -I. -c \
            -o "build-playground/$(basename "$1" .cu).o" "$1"' sh {}

scripts/install-packages.sh hipcc libamdhip64-dev rocm-device-libs
echo "check-gpu-builds: HIP backend for gfx1030 and gfx90a"
cmake -S . -B build-hip -DCMAKE_BUILD_TYPE=Release -DSMOL_HIP=ON -DSMOL_BUILD_EXAMPLES=OFF >/dev/null
cmake --build build-hip -j"$(nproc)" --target smol test-cuda
echo "check-gpu-builds: the CUDA and HIP backends compile and link, the labs compile"
