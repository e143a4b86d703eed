#!/usr/bin/env bash
# bench-spec.sh - speculative decoding against plain decoding on the CPU
# (or the device -D names), same model, prompt, threads and sampler
# settings, alternating runs:
# smol-cli's generation rate without and with speculation, on prompts that
# ask the model to rewrite or continue a given passage (the text the lookup
# finds its guesses in) and on one that does not. Modes: n-gram lookup,
# greedy and sampling (--temp T, same seed for both runs); with -d DRAFT
# also a draft model, greedy, as a chain and as a token tree of budget B.
# -k sets the most tokens guessed a target decode (smol-cli's --draft-max).
# Prints a table of the medians, the tokens per target decode and the share
# of guesses kept.
#
#   scripts/bench-spec.sh [-m MODEL] [-d DRAFT] [-t THREADS] [-n N_GEN] [-r REPS]
#                         [-T TEMP] [-B TREE_BUDGET] [-D DEVICE] [-k DRAFT_MAX]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=$root/models/SmolLM2-135M-Instruct.Q4_1.gguf
draft="" threads=2 n_gen=96 reps=3 temp=0.8 budget=16 device=() draft_max=()
usage="usage: $0 [-m MODEL] [-d DRAFT] [-t THREADS] [-n N_GEN] [-r REPS] [-T TEMP] [-B TREE_BUDGET] [-D DEVICE] [-k DRAFT_MAX]"
while getopts "m:d:t:n:r:T:B:D:k:" opt; do
    case $opt in
    m) model=$OPTARG ;;
    d) draft=$OPTARG ;;
    t) threads=$OPTARG ;;
    n) n_gen=$OPTARG ;;
    r) reps=$OPTARG ;;
    T) temp=$OPTARG ;;
    B) budget=$OPTARG ;;
    D) device=(--device "$OPTARG") ;;
    k) draft_max=(--draft-max "$OPTARG") ;;
    *) echo "$usage" >&2 && exit 2 ;;
    esac
done
cli=${SMOL_BUILD_DIR:-$root/build}/examples/smol-cli
[ -x "$cli" ] || { echo "bench-spec: build smol first (scripts/setup.sh --no-run)" >&2 && exit 1; }

passage="The quick brown fox jumps over the lazy dog. The dog, who had been asleep in the \
sun all afternoon, did not notice. Later that evening the fox came back to the farm and \
looked for the chickens, but the farmer had closed the gate."
declare -A prompts=(
    [rewrite]="Rewrite the following text, fixing the spelling: ${passage/jumps/jumpd} Rewritten text: The quick"
    [continue]="$passage $passage The quick brown fox"
    [open]="Once upon a time, in a small village by the sea, there lived"
)

# Each mode: its name, the sampler flags both runs share, the speculation flags.
modes=("lookup, greedy|--temp 0|--lookup"
    "lookup, T=$temp|--temp $temp --seed 1|--lookup")
if [ -n "$draft" ]; then
    modes+=("draft model, greedy|--temp 0|--model-draft $draft"
        "token tree $budget, greedy|--temp 0|--model-draft $draft --spec-tree $budget")
fi

. "$root/scripts/spec-report.sh"

echo "| prompt | mode | plain t/s | speculative t/s | ratio | tokens per target decode | guesses kept |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
for name in rewrite continue open; do
    p=${prompts[$name]}
    for mode in "${modes[@]}"; do
        IFS='|' read -r label sampling spec <<<"$mode"
        plain=() rate=() steps=() share=()
        for _ in $(seq "$reps"); do
            # shellcheck disable=SC2086 # the flags are words
            plain+=("$("$cli" -m "$model" "${device[@]}" -t "$threads" -n "$n_gen" $sampling -p "$p" 2>&1 >/dev/null | rate_plain)")
            # shellcheck disable=SC2086
            out=$("$cli" -m "$model" "${device[@]}" -t "$threads" -n "$n_gen" $sampling $spec "${draft_max[@]}" -p "$p" 2>&1 >/dev/null)
            rate+=("$(rate_spec <<<"$out")")
            steps+=("$(per_step <<<"$out")")
            share+=("$(kept <<<"$out")")
        done
        a=$(printf '%s\n' "${plain[@]}" | median)
        b=$(printf '%s\n' "${rate[@]}" | median)
        s=$(printf '%s\n' "${steps[@]}" | median)
        k=$(printf '%s\n' "${share[@]}" | median)
        awk -v n="$name" -v m="$label" -v a="$a" -v b="$b" -v s="$s" -v k="$k" \
            'BEGIN { printf "| %s | %s | %.1f | %.1f | **%.2f** | %.2f | %.1f%% |\n", n, m, a, b, (a > 0 ? b / a : 0), s, k }'
    done
done
