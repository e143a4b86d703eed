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
# of guesses kept. With -L DIR (llama.cpp's bin directory, scripts/peers.sh
# builds it) the greedy lookup and draft-model rows also run llama.cpp in
# the same loop, the same settings: llama-completion plain, llama-lookup
# or llama-speculative (which have no token trees, and whose sampling is
# not exact, so those rows have none).
#
#   scripts/bench-spec.sh [-m MODEL] [-d DRAFT] [-t THREADS] [-n N_GEN] [-r REPS]
#                         [-T TEMP] [-B TREE_BUDGET] [-D DEVICE] [-k DRAFT_MAX] [-L DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=$root/models/SmolLM2-135M-Instruct.Q4_1.gguf
draft="" threads=2 n_gen=96 reps=3 temp=0.8 budget=16 device=() draft_max=() k=8 llama=""
usage="usage: $0 [-m MODEL] [-d DRAFT] [-t THREADS] [-n N_GEN] [-r REPS] [-T TEMP] [-B TREE_BUDGET] [-D DEVICE] [-k DRAFT_MAX] [-L LLAMA_BIN]"
while getopts "m:d:t:n:r:T:B:D:k:L:" opt; do
    case $opt in
    m) model=$OPTARG ;;
    d) draft=$OPTARG ;;
    t) threads=$OPTARG ;;
    n) n_gen=$OPTARG ;;
    r) reps=$OPTARG ;;
    T) temp=$OPTARG ;;
    B) budget=$OPTARG ;;
    D) device=(--device "$OPTARG") ;;
    k) draft_max=(--draft-max "$OPTARG") k=$OPTARG ;;
    L) llama=$OPTARG ;;
    *) echo "$usage" >&2 && exit 2 ;;
    esac
done
cli=${SMOL_BUILD_DIR:-$root/build}/examples/smol-cli
[ -x "$cli" ] || { echo "bench-spec: build smol first (scripts/setup.sh --no-run)" >&2 && exit 1; }
if [ -n "$llama" ]; then
    for t in llama-completion llama-lookup llama-speculative; do
        [ -x "$llama/$t" ] || { echo "bench-spec: no $t in $llama (scripts/peers.sh builds it)" >&2 && exit 1; }
    done
fi

passage="The quick brown fox jumps over the lazy dog. The dog, who had been asleep in the \
sun all afternoon, did not notice. Later that evening the fox came back to the farm and \
looked for the chickens, but the farmer had closed the gate."
declare -A prompts=(
    [rewrite]="Rewrite the following text, fixing the spelling: ${passage/jumps/jumpd} Rewritten text: The quick"
    [continue]="$passage $passage The quick brown fox"
    [open]="Once upon a time, in a small village by the sea, there lived"
)

# Each mode: its name, the sampler flags both runs share, the speculation
# flags, and llama.cpp's tool and flags for the same (none: no peer row).
modes=("lookup, greedy|--temp 0|--lookup|llama-lookup"
    "lookup, T=$temp|--temp $temp --seed 1|--lookup|")
if [ -n "$draft" ]; then
    modes+=("draft model, greedy|--temp 0|--model-draft $draft|llama-speculative -md $draft"
        "token tree $budget, greedy|--temp 0|--model-draft $draft --spec-tree $budget|")
fi

. "$root/scripts/spec-report.sh"

head="| prompt | mode | plain t/s | speculative t/s | ratio | tokens per target decode | guesses kept |"
rule="| --- | --- | ---: | ---: | ---: | ---: | ---: |"
if [ -n "$llama" ]; then
    head+=" llama.cpp plain t/s | llama.cpp speculative t/s | llama.cpp ratio | llama.cpp tokens per target decode | llama.cpp guesses kept | smol / llama.cpp, speculative |"
    rule+=" ---: | ---: | ---: | ---: | ---: | ---: |"
fi
echo "$head"
echo "$rule"
for name in rewrite continue open; do
    p=${prompts[$name]}
    for mode in "${modes[@]}"; do
        IFS='|' read -r label sampling spec peer <<<"$mode"
        plain=() rate=() steps=() share=() lplain=() lrate=() lsteps=() lshare=()
        for _ in $(seq "$reps"); do
            # shellcheck disable=SC2086 # the flags are words
            plain+=("$("$cli" -m "$model" "${device[@]}" -t "$threads" -n "$n_gen" $sampling -p "$p" 2>&1 >/dev/null | rate_plain)")
            # shellcheck disable=SC2086
            out=$("$cli" -m "$model" "${device[@]}" -t "$threads" -n "$n_gen" $sampling $spec "${draft_max[@]}" -p "$p" 2>&1 >/dev/null)
            rate+=("$(rate_spec <<<"$out")")
            steps+=("$(per_step <<<"$out")")
            share+=("$(kept <<<"$out")")
            if [ -n "$llama" ] && [ -n "$peer" ]; then
                # The same prompt, threads and greedy sampling; every layer
                # on the device with -D (llama.cpp's first GPU), else none.
                ngl=(-ngl 0)
                [ ${#device[@]} -gt 0 ] && ngl=(-ngl 99)
                lplain+=("$("$llama/llama-completion" -m "$model" "${ngl[@]}" -t "$threads" -n "$n_gen" --temp 0 -no-cnv -p "$p" 2>&1 </dev/null | llama_rate_plain)")
                # shellcheck disable=SC2086
                out=$("$llama"/$peer -m "$model" "${ngl[@]}" -t "$threads" -n "$n_gen" --temp 0 --spec-draft-n-max "$k" -p "$p" 2>&1 </dev/null)
                lrate+=("$(llama_rate_spec <<<"$out")")
                lsteps+=("$(llama_per_step <<<"$out")")
                lshare+=("$(llama_kept <<<"$out")")
            fi
        done
        a=$(printf '%s\n' "${plain[@]}" | median)
        b=$(printf '%s\n' "${rate[@]}" | median)
        s=$(printf '%s\n' "${steps[@]}" | median)
        kk=$(printf '%s\n' "${share[@]}" | median)
        row=$(awk -v n="$name" -v m="$label" -v a="$a" -v b="$b" -v s="$s" -v k="$kk" \
            'BEGIN { printf "| %s | %s | %.1f | %.1f | **%.2f** | %.2f | %.1f%% |", n, m, a, b, (a > 0 ? b / a : 0), s, k }')
        if [ -n "$llama" ] && [ ${#lrate[@]} -gt 0 ]; then
            la=$(printf '%s\n' "${lplain[@]}" | median)
            lb=$(printf '%s\n' "${lrate[@]}" | median)
            ls=$(printf '%s\n' "${lsteps[@]}" | median)
            lk=$(printf '%s\n' "${lshare[@]}" | median)
            row+=$(awk -v a="$la" -v b="$lb" -v s="$ls" -v k="$lk" -v mine="$b" \
                'BEGIN { printf " %.1f | %.1f | %.2f | %.2f | %.1f%% | **%.2f** |", a, b, (a > 0 ? b / a : 0), s, k, (b > 0 ? mine / b : 0) }')
        elif [ -n "$llama" ]; then
            row+=" | | | | | |"
        fi
        echo "$row"
    done
done
