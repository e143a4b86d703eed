#!/usr/bin/env bash
# bench-self-spec.sh - self-speculation over offloaded KV against plain
# offloaded decoding: smol-cli continues a long real text (Python's own
# pydoc_data.topics, written at run time by scripts/pydoc-text.py) greedily,
# with a device budget that leaves most KV heads in host memory, plainly and
# with --self-spec W for each window W, alternating; prints a table of the
# generation rates, their ratio, the tokens per target decode and the share
# of guesses kept, by window. The texts of each run must be equal (greedy,
# the same tokens): a run whose text differs is reported.
#
#   scripts/bench-self-spec.sh [-m MODEL] [-D DEVICE] [-g GPU_MEM] [-c CTX]
#                              [-P PROMPT_CHARS] [-n N_GEN] [-w W1,W2,...]
#                              [-k DRAFT_MAX] [-t THREADS] [-r REPS]
#
# Defaults: the real SmolLM2-135M, --device sim, --kv-offload all (every
# head streamed) unless -g is given, 16,000 characters of text, 64 tokens,
# windows 64,256,1024, draft-max 8.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=$root/models/SmolLM2-135M-Instruct.Q4_1.gguf
device=sim gpu_mem="" ctx=0 chars=16000 n_gen=64 windows=64,256,1024 draft_max=8 threads=0 reps=1
usage="usage: $0 [-m MODEL] [-D DEVICE] [-g GPU_MEM] [-c CTX] [-P PROMPT_CHARS] [-n N_GEN] [-w W1,W2] [-k DRAFT_MAX] [-t THREADS] [-r REPS]"
while getopts "m:D:g:c:P:n:w:k:t:r:" opt; do
    case $opt in
    m) model=$OPTARG ;;
    D) device=$OPTARG ;;
    g) gpu_mem=$OPTARG ;;
    c) ctx=$OPTARG ;;
    P) chars=$OPTARG ;;
    n) n_gen=$OPTARG ;;
    w) windows=$OPTARG ;;
    k) draft_max=$OPTARG ;;
    t) threads=$OPTARG ;;
    r) reps=$OPTARG ;;
    *) echo "$usage" >&2 && exit 2 ;;
    esac
done
cli=${SMOL_BUILD_DIR:-$root/build}/examples/smol-cli
[ -x "$cli" ] || { echo "bench-self-spec: build smol first (scripts/setup.sh --no-run)" >&2 && exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$root/scripts/pydoc-text.py" "$tmp/text.txt" --chars "$chars" >&2
place=(--device "$device")
if [ -n "$gpu_mem" ]; then place+=(--gpu-mem "$gpu_mem"); else place+=(--kv-offload all); fi
[ "$ctx" -gt 0 ] && place+=(-c "$ctx")
[ "$threads" -gt 0 ] && place+=(-t "$threads")
common=(-m "$model" -f "$tmp/text.txt" -n "$n_gen" --temp 0 --no-display-prompt "${place[@]}")

. "$root/scripts/spec-report.sh"

echo "model $(basename "$model"), ${place[*]}, $chars characters of text, $n_gen tokens, draft-max $draft_max, smol $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')"
echo
echo "| window | plain t/s | self-speculation t/s | ratio | tokens per target decode | guesses kept | same text |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"
IFS=, read -ra ws <<<"$windows"
for w in "${ws[@]}"; do
    : >"$tmp/plain" && : >"$tmp/spec" && : >"$tmp/step" && : >"$tmp/kept"
    same=yes
    for r in $(seq "$reps"); do
        "$cli" "${common[@]}" >"$tmp/plain.txt" 2>"$tmp/plain.err" || { cat "$tmp/plain.err" >&2; exit 1; }
        rate_plain <"$tmp/plain.err" >>"$tmp/plain"
        "$cli" "${common[@]}" --self-spec "$w" --draft-max "$draft_max" >"$tmp/spec.txt" 2>"$tmp/spec.err" ||
            { cat "$tmp/spec.err" >&2; exit 1; }
        rate_spec <"$tmp/spec.err" >>"$tmp/spec"
        per_step <"$tmp/spec.err" >>"$tmp/step"
        kept <"$tmp/spec.err" >>"$tmp/kept"
        cmp -s "$tmp/plain.txt" "$tmp/spec.txt" || same=no
    done
    p=$(median <"$tmp/plain") s=$(median <"$tmp/spec")
    ratio=$(awk -v a="$s" -v b="$p" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    echo "| $w | $p | $s | **$ratio** | $(median <"$tmp/step") | $(median <"$tmp/kept")% | $same |"
done
