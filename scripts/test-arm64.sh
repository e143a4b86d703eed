#!/usr/bin/env bash
# smol for 64-bit ARM, cross-built here and tested under emulation: installs
# Debian's aarch64 cross compiler and qemu-user-static, builds in
# build-arm64 with cmake/aarch64-linux-gnu.cmake (the kernel variants this
# target has: generic, dotprod and i8mm), runs the CPU test suite through qemu (ctest runs each
# test program under the emulator the toolchain file names; qemu's default
# CPU has every ARM feature, so every kernel variant is tested) and has
# smol-cli generate a few tokens with the real SmolLM2-135M on each variant.
#
# Left out under emulation: test-requant (llama-quantize's byte-exact files
# and their logits, about 20 minutes under qemu; the same code runs it on
# x86), the perplexity checks (llama.cpp's recorded values, and the KV
# types' against f16 KV: minutes of prefill; test-cpu-kernels runs the
# quantized-KV kernels under qemu), test-heads (two hundred prefills;
# test-window runs the streaming heads' code), test-model's Gemma 3 cases (a 262,144-token vocabulary's logits
# over 700-token prompts: over ten minutes under qemu; the same kernels run
# them on x86), test-spec's cases that decode hundreds of steps (a draft
# model, n-gram lookup, self-speculation, speculative sampling: about 15
# minutes under qemu; token-level logic that runs the same on x86, over
# the decode test-model checks here), test-offload (the simulated device's
# copy threads, over three minutes under qemu, which runs them in this
# x86's memory order and so shows nothing of ARM's; test-cpu-kernels runs
# the attention kernels the offload uses) and the host-side checks (format,
# install-find-package).
#
#   scripts/test-arm64.sh            build and test
#   scripts/test-arm64.sh --build    build only
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

scripts/install-packages.sh g++-aarch64-linux-gnu qemu-user-static cmake doctest-dev \
    libcli11-dev nlohmann-json3-dev
scripts/fetch-model.sh >/dev/null

echo "test-arm64: building smol for aarch64 in build-arm64"
cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
    -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-arm64 -j"$(nproc)"
[ "${1:-}" = "--build" ] && exit 0

qemu=(qemu-aarch64-static -L /usr/aarch64-linux-gnu)
ctest --test-dir build-arm64 --output-on-failure -j"$(nproc)" --timeout 1200 \
    -E '^(test-requant|perplexity-matches-llama|perplexity-kv-types|test-heads|format|install-find-package|test-model|test-spec|test-offload)$'
echo "test-arm64: test-model, less its Gemma 3 cases"
"${qemu[@]}" build-arm64/tests/test-model -tce='Gemma*'
echo "test-arm64: test-spec, less its long decodes"
"${qemu[@]}" build-arm64/tests/test-spec \
    -tce='a draft model*,n-gram lookup*,lookup*,self-speculation*,speculative sampling*'

# qemu's default CPU has every feature (the i8mm variant runs); a Neoverse
# N1 (ARMv8.2) has dotprod and no i8mm; a Cortex-A53 (ARMv8.0) has neither
# (generic). Greedy text: the same bits, the same words.
echo "test-arm64: smol-cli on aarch64 (qemu), the real SmolLM2-135M, each kernel variant"
texts=()
for cpu in max neoverse-n1 cortex-a53; do
    case "$cpu" in
    max) want=i8mm ;;
    neoverse-n1) want=dotprod ;;
    *) want=generic ;;
    esac
    out=$("${qemu[@]}" -cpu "$cpu" build-arm64/examples/smol-cli \
        -m models/SmolLM2-135M-Instruct.Q4_1.gguf -p "The capital of France is" -n 8 --temp 0 2>&1)
    echo "$out"
    grep -q "kernels $want" <<<"$out" || {
        echo "test-arm64: on a $cpu, smol-cli did not run the $want kernels" >&2
        exit 1
    }
    texts+=("$(grep -v '^smol-cli' <<<"$out")")
done
for t in "${texts[@]:1}"; do
    [ "$t" = "${texts[0]}" ] || { echo "test-arm64: the variants' greedy texts differ" >&2; exit 1; }
done
