#!/usr/bin/env bash
# bench-spec.sh - speculative decoding against plain greedy decoding on the
# CPU, same model, prompt and threads, alternating runs: smol-cli's
# generation rate without and with --lookup (n-gram lookup), on prompts that
# ask the model to rewrite or continue a given passage (the text the lookup
# finds its guesses in) and on one that does not. Prints a table of the
# medians and the tokens per target decode.
#
#   scripts/bench-spec.sh [-m MODEL] [-t THREADS] [-n N_GEN] [-r REPS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=$root/models/SmolLM2-135M-Instruct.Q4_1.gguf
threads=2 n_gen=96 reps=3
while getopts "m:t:n:r:" opt; do
    case $opt in
    m) model=$OPTARG ;;
    t) threads=$OPTARG ;;
    n) n_gen=$OPTARG ;;
    r) reps=$OPTARG ;;
    *) echo "usage: $0 [-m MODEL] [-t THREADS] [-n N_GEN] [-r REPS]" >&2 && exit 2 ;;
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

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
rate_plain() { sed -n 's/.*generation .*(\s*\([0-9.]*\) tokens\/s).*/\1/p'; }
rate_spec() { sed -n 's/.*speculative .*(\([0-9.]*\) tokens\/s).*/\1/p'; }
per_step() { sed -n 's/.*decodes (\([0-9.]*\) tokens each).*/\1/p'; }

echo "| prompt | plain t/s | --lookup t/s | ratio | tokens per target decode |"
echo "| --- | ---: | ---: | ---: | ---: |"
for name in rewrite continue open; do
    p=${prompts[$name]}
    plain=() spec=() steps=()
    for _ in $(seq "$reps"); do
        plain+=("$("$cli" -m "$model" -t "$threads" -n "$n_gen" --temp 0 -p "$p" 2>&1 >/dev/null | rate_plain)")
        out=$("$cli" -m "$model" -t "$threads" -n "$n_gen" --temp 0 --lookup -p "$p" 2>&1 >/dev/null)
        spec+=("$(rate_spec <<<"$out")")
        steps+=("$(per_step <<<"$out")")
    done
    a=$(printf '%s\n' "${plain[@]}" | median)
    b=$(printf '%s\n' "${spec[@]}" | median)
    s=$(printf '%s\n' "${steps[@]}" | median)
    awk -v n="$name" -v a="$a" -v b="$b" -v s="$s" \
        'BEGIN { printf "| %s | %.1f | %.1f | **%.2f** | %.2f |\n", n, a, b, (a > 0 ? b / a : 0), s }'
done
