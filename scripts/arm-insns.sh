#!/usr/bin/env bash
# Instructions per decoded token of each ARM kernel variant, counted under
# emulation (no ARM hardware involved): the aarch64 smol-cli of
# scripts/test-arm64.sh runs under Debian's qemu-user with the counting
# plugin scripts/qemu-insns.c, one thread, greedy, on a CPU with every
# feature (-cpu max) with SMOL_CPU_KERNELS forcing each variant. A decoded
# token's count is the difference between two runs that generate 2 and N
# tokens from the same prompt, over N - 2; a prompt token's, between two
# prompts of 20 and 60 tokens, over the 40 between them. Models: the real SmolLM2-135M
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
#   scripts/arm-insns.sh                 all three models (about 25 minutes)
#   scripts/arm-insns.sh --quick         the 135M files only
#   scripts/arm-insns.sh --only Q8_0     the models whose file names hold Q8_0
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
quick=0 only=
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    --only) only=$2; shift ;;
    *) echo "usage: scripts/arm-insns.sh [--quick] [--only PATTERN]" >&2; exit 2 ;;
    esac
    shift
done

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
if [ "$quick" = 0 ]; then
    f="$work/1.7B-random-Q4_K.gguf"
    [ -f "$f" ] || build/examples/smol-quantize --random 1.7B --type q4_k_m --pure \
        --vocab-from "$real" "$f" >/dev/null
    models+=("$f")
fi

# run VARIANT MODEL PROMPT N -> "instructions prompt_tokens"
run() {
    SMOL_CPU_KERNELS=$1 qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu max \
        -plugin "$work/qemu-insns.so" build-arm64/examples/smol-cli -m "$2" -p "$3" -n "$4" \
        --temp 0 -t 1 2>&1 >/dev/null |
        awk '/^qemu-insns:/ { i = $2 } /^smol-cli: prompt/ { p = $3 } END { print i, p }'
}

short="The capital of France is"
sentence="The quick brown fox jumps over the lazy dog."
long1="$sentence $sentence"
long2="$long1 $long1 $long1"
variants=(generic dotprod i8mm)

printf '%-18s %-8s %14s %14s %14s %9s %9s\n' model phase generic dotprod i8mm "dp/gen" "i8mm/gen"
for m in "${models[@]}"; do
    name=$(basename "$m" .gguf)
    case "$name" in *"$only"*) ;; *) continue ;; esac
    # Decode: generating N tokens against 2, over N - 2.
    case "$m" in *1.7B*) n=4 ;; *) n=10 ;; esac
    dec=()
    for v in "${variants[@]}"; do
        read -r a _ < <(run "$v" "$m" "$short" 2)
        read -r b _ < <(run "$v" "$m" "$short" "$n")
        [ -n "$a" ] && [ -n "$b" ] || { echo "arm-insns: no count for $v on $m" >&2; exit 1; }
        dec+=($(((b - a) / (n - 2))))
    done
    # Prefill: a prompt of six sentences against one of two, one token
    # generated after each, per prompt token of the difference.
    pre=()
    for v in "${variants[@]}"; do
        read -r a pa < <(run "$v" "$m" "$long1" 1)
        read -r b pb < <(run "$v" "$m" "$long2" 1)
        pre+=($(((b - a) / (pb - pa))))
    done
    for phase in decode prefill; do
        if [ "$phase" = decode ]; then c=("${dec[@]}"); else c=("${pre[@]}"); fi
        awk -v m="$name" -v ph="$phase" -v g="${c[0]}" -v d="${c[1]}" -v i="${c[2]}" 'BEGIN {
            printf "%-18s %-8s %14.0f %14.0f %14.0f %9.3f %9.3f\n", m, ph, g, d, i, d / g, i / g }'
    done
    bytes=$(stat -L -c %s "$m")
    awk -v m="$name" -v b="$bytes" 'BEGIN {
        printf "%-18s reads %.1f MB a decoded token: at most %.1f t/s at 17 GB/s, %.1f at 300 GB/s\n",
            m, b / 1e6, 17e9 / b, 300e9 / b }'
done
