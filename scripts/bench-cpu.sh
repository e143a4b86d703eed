#!/usr/bin/env bash
# bench-cpu.sh - smol against llama.cpp on the CPU, one command. Builds smol
# (Release) if needed, makes Q8_0 and F16 copies of the real SmolLM2-135M
# Q4_1 model with smol-quantize, runs smol-bench and llama.cpp's llama-bench
# on the same files with the same threads and test sizes, and prints both
# tables and their ratio. Raw JSON goes to build/bench/.
#
#   scripts/bench-cpu.sh [-t THREADS] [-p N_PROMPT] [-n N_GEN] [-r REPS]
#                        [-q TYPES] [-m FILE]...
#
# -q: the comma list of llama.cpp file types to make from the Q4_1 file
# (default Q8_0,F16; smol-quantize writes llama-quantize's bytes, so
# Q4_K_M and the like are the files llama.cpp's users make); -m: one more
# GGUF file to bench (say, smol-quantize --random 1.7B --type q4_k_m).
#
# Environment: LLAMA_BENCH, the llama-bench binary (default: the peer build
# that scripts/peers.sh makes, /work/peers/build-cpu/bin/llama-bench);
# SMOL_BUILD_DIR, smol's build folder (default: build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
threads=2 n_prompt=512 n_gen=128 reps=5 types=Q8_0,F16
extra=()
usage() {
    echo "usage: $0 [-t THREADS] [-p N_PROMPT] [-n N_GEN] [-r REPS] [-q TYPES] [-m FILE]..." >&2
    exit 2
}
while getopts "t:p:n:r:q:m:h" opt; do
    case $opt in
    t) threads=$OPTARG ;;
    p) n_prompt=$OPTARG ;;
    n) n_gen=$OPTARG ;;
    r) reps=$OPTARG ;;
    q) types=$OPTARG ;;
    m) extra+=("$OPTARG") ;;
    *) usage ;;
    esac
done

build=${SMOL_BUILD_DIR:-$root/build}
out="$build/bench"
base=SmolLM2-135M-Instruct
src="$root/models/$base.Q4_1.gguf"
llama_bench=${LLAMA_BENCH:-/work/peers/build-cpu/bin/llama-bench}
say() { echo "bench-cpu: $*" >&2; }

if [ ! -f "$src" ]; then
    say "$src is missing; run scripts/fetch-model.sh to download it"
    exit 1
fi

# --- smol, Release ----------------------------------------------------------
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
if [ "$build_type" != Release ]; then
    say "configuring $build (Release)"
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
say "building smol-bench and smol-quantize"
cmake --build "$build" -j"$(nproc)" --target smol-bench smol-quantize >/dev/null
bench="$build/examples/smol-bench"
quantize="$build/examples/smol-quantize"
mkdir -p "$out"

# --- the same model in other types -------------------------------------------
models=("$src")
IFS=, read -ra type_list <<<"$types"
for type in "${type_list[@]}"; do
    dst="$root/models/$base.$type.gguf"
    if [ ! -f "$dst" ] || [ "$src" -nt "$dst" ] || [ "$quantize" -nt "$dst" ]; then
        say "making $dst"
        log="$out/quantize-$type.log"
        if ! "$quantize" "$src" "$dst" "$type" >"$log" 2>&1; then
            cat "$log" >&2
            exit 1
        fi
        tail -n 1 "$log" >&2
    fi
    models+=("$dst")
done
for f in "${extra[@]}"; do
    [ -f "$f" ] || { say "$f is missing"; exit 1; }
    models+=("$f")
done

# --- run both -----------------------------------------------------------------
# Each tool writes JSON to stdout and its own markdown table to stderr (-oe),
# so the tables shown below are the tools' own.
have_llama=1
if [ ! -x "$llama_bench" ]; then
    have_llama=0
    say "llama-bench is not at $llama_bench: build it with scripts/peers.sh or set LLAMA_BENCH;"
    say "running smol alone for now"
fi
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
say "CPU: ${cpu:-unknown}; $threads threads; pp$n_prompt and tg$n_gen, $reps repetitions each"
llama_models=()
for m in "${models[@]}"; do llama_models+=(-m "$m"); done

# run NAME COMMAND...: JSON to $out/cpu-NAME.json, the table to cpu-NAME.md.
run() {
    local name=$1
    shift
    say "running $name: $*"
    if ! "$@" -p "$n_prompt" -n "$n_gen" -t "$threads" -r "$reps" -o json -oe md \
        >"$out/cpu-$name.json" 2>"$out/cpu-$name.md"; then
        cat "$out/cpu-$name.md" >&2
        say "$name failed; its output is above"
        exit 1
    fi
}
run smol "$bench" -m "$(IFS=,; echo "${models[*]}")"
[ $have_llama = 1 ] && run llama.cpp "$llama_bench" "${llama_models[@]}"

# --- tables -------------------------------------------------------------------
echo
echo "## smol"
echo
cat "$out/cpu-smol.md"
if [ $have_llama = 1 ]; then
    echo
    echo "## llama.cpp"
    echo
    cat "$out/cpu-llama.cpp.md"
    python3 - "$out/cpu-smol.json" "$out/cpu-llama.cpp.json" <<'PY'
import json, os, statistics, sys

def load(path):
    rows = {}
    for r in json.load(open(path)):
        test = f"pp{r['n_prompt']}" if r["n_prompt"] > 0 else f"tg{r['n_gen']}"
        rows[(os.path.basename(r["model_filename"]), r["n_threads"], test)] = r
    return rows

smol, llama = load(sys.argv[1]), load(sys.argv[2])
print("\n## smol / llama.cpp (tokens per second; above 1 means smol is faster)\n")
print(f"| {'model':<36} | {'threads':>7} | {'test':>6} | {'smol t/s':>10} | {'llama.cpp t/s':>13} | {'ratio':>6} |")
print(f"| {'-' * 36} | {'-' * 6}: | {'-' * 5}: | {'-' * 9}: | {'-' * 12}: | {'-' * 5}: |")
ratios = []
for key, s in smol.items():
    l = llama.get(key)
    if not l or l["avg_ts"] <= 0:
        continue
    ratio = s["avg_ts"] / l["avg_ts"]
    ratios.append(ratio)
    print(f"| {key[0]:<36} | {key[1]:>7} | {key[2]:>6} | {s['avg_ts']:>10.2f} | {l['avg_ts']:>13.2f} | {ratio:>6.2f} |")
if ratios:
    print(f"\ngeometric mean of the ratios: {statistics.geometric_mean(ratios):.2f}")
PY
fi
echo
if [ $have_llama = 1 ]; then
    say "raw JSON: $out/cpu-smol.json and $out/cpu-llama.cpp.json"
else
    say "raw JSON: $out/cpu-smol.json"
    say "llama.cpp's llama-bench is not at $llama_bench, so there is nothing to compare with."
    say "Build it with scripts/peers.sh (it builds llama.cpp under /work/peers), or point"
    say "LLAMA_BENCH at an existing llama-bench binary, then run this script again."
    exit 1
fi
