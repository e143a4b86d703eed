#!/usr/bin/env bash
# Instructions per decoded token of each ARM kernel variant, counted under
# emulation (no ARM hardware involved): the aarch64 smol-cli of
# scripts/test-arm64.sh runs under Debian's qemu-user with the counting
# plugin scripts/qemu-insns.c, one thread, greedy, on a CPU with every
# feature (-cpu max) with SMOL_CPU_KERNELS forcing each variant. A decoded
# token's count is the difference between two runs that generate 2 and N
# tokens from the same prompt, over N - 2. Models: the real SmolLM2-135M
# rewritten as Q4_0 and Q8_0 (llama-quantize's mix), and the 1.7B's shape
# with random weights, every matmul weight Q4_K (576, the 135M's width, is
# no multiple of 256).
#
# Printed per model: the counts, their ratio, the bytes a decoded token
# reads (the file's size: nearly all of it tensors, each weight read once,
# the tied embedding as the output matrix) and the tokens/s those bytes allow at the memory bandwidth
# of a Raspberry Pi 5 (17 GB/s) and a Graviton 3 (300 GB/s): estimates of
# the bound, not measurements.
#
#   scripts/arm-insns.sh           all three models (about 10 minutes)
#   scripts/arm-insns.sh --quick   the 135M files only
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

scripts/install-packages.sh qemu-user gcc
scripts/test-arm64.sh --build >/dev/null
cmake --build build --target smol-quantize -j"$(nproc)" >/dev/null

work=build-arm64/insns
mkdir -p "$work"
gcc -O2 -shared -fPIC scripts/qemu-insns.c -o "$work/qemu-insns.so"

real=models/SmolLM2-135M-Instruct.Q4_1.gguf
models=()
for type in Q4_0 Q8_0; do
    f="$work/135M-$type.gguf"
    [ -f "$f" ] || build/examples/smol-quantize "$real" "$f" "$type" >/dev/null
    models+=("$f")
done
if [ "${1:-}" != "--quick" ]; then
    f="$work/1.7B-random-Q4_K.gguf"
    [ -f "$f" ] || build/examples/smol-quantize --random 1.7B --type q4_k_m --pure \
        --vocab-from "$real" "$f" >/dev/null
    models+=("$f")
fi

count() { # variant model n -> instructions
    SMOL_CPU_KERNELS=$1 qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu max \
        -plugin "$work/qemu-insns.so" build-arm64/examples/smol-cli -m "$2" \
        -p "The capital of France is" -n "$3" --temp 0 -t 1 2>&1 >/dev/null |
        awk '/^qemu-insns:/ { print $2 }'
}

printf '%-26s %14s %14s %7s %10s %12s %12s\n' model generic dotprod ratio "MB/token" \
    "t/s@17GB/s" "t/s@300GB/s"
for m in "${models[@]}"; do
    case "$m" in *1.7B*) n=4 ;; *) n=10 ;; esac
    per=()
    for v in generic dotprod; do
        a=$(count "$v" "$m" 2)
        b=$(count "$v" "$m" "$n")
        [ -n "$a" ] && [ -n "$b" ] || { echo "arm-insns: no count for $v on $m" >&2; exit 1; }
        per+=($(((b - a) / (n - 2))))
    done
    bytes=$(stat -c %s "$m")
    awk -v m="$(basename "$m" .gguf)" -v g="${per[0]}" -v d="${per[1]}" -v b="$bytes" 'BEGIN {
        printf "%-26s %14.0f %14.0f %7.3f %10.1f %12.1f %12.1f\n", m, g, d, d / g, b / 1e6,
            17e9 / b, 300e9 / b }'
done
