#!/usr/bin/env bash
# bench-cpu.sh - smol against llama.cpp on the CPU, one command. Builds smol
# (Release) if needed, makes Q8_0 and F16 copies of the real SmolLM2-135M
# Q4_1 model with smol-quantize, runs smol-bench and llama.cpp's llama-bench
# on the same three files with the same threads and test sizes, and prints
# both tables and their ratio. Raw JSON goes to build/bench/.
#
#   scripts/bench-cpu.sh [-t THREADS] [-p N_PROMPT] [-n N_GEN] [-r REPS]
#
# Environment: LLAMA_BENCH, the llama-bench binary (default: the peer build
# that scripts/peers.sh makes, /work/peers/build-cpu/bin/llama-bench);
# SMOL_BUILD_DIR, smol's build folder (default: build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
threads=2 n_prompt=512 n_gen=128 reps=5
usage() {
    echo "usage: $0 [-t THREADS] [-p N_PROMPT] [-n N_GEN] [-r REPS]" >&2
    exit 2
}
while getopts "t:p:n:r:h" opt; do
    case $opt in
    t) threads=$OPTARG ;;
    p) n_prompt=$OPTARG ;;
    n) n_gen=$OPTARG ;;
    r) reps=$OPTARG ;;
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

# --- the same model in three types ------------------------------------------
models=("$src")
for type in Q8_0 F16; do
    dst="$root/models/$base.$type.gguf"
    if [ ! -f "$dst" ] || [ "$src" -nt "$dst" ] || [ "$quantize" -nt "$dst" ]; then
        say "making $dst"
        log="$out/quantize-$type.log"
        if ! "$quantize" "$src" "$dst" "${type,,}" >"$log" 2>&1; then
            cat "$log" >&2
            exit 1
        fi
        tail -n 1 "$log" >&2
    fi
    models+=("$dst")
done
model_list=$(IFS=,; echo "${models[*]}")

# --- run both -----------------------------------------------------------------
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
say "CPU: ${cpu:-unknown}; $threads threads; pp$n_prompt and tg$n_gen, $reps repetitions"
say "running smol-bench"
"$bench" -m "$model_list" -p "$n_prompt" -n "$n_gen" -t "$threads" -r "$reps" -o json \
    >"$out/cpu-smol.json"

have_llama=1
if [ ! -x "$llama_bench" ]; then
    have_llama=0
else
    say "running llama-bench ($llama_bench)"
    llama_models=()
    for m in "${models[@]}"; do llama_models+=(-m "$m"); done
    "$llama_bench" "${llama_models[@]}" -p "$n_prompt" -n "$n_gen" -t "$threads" -r "$reps" \
        -o json >"$out/cpu-llama.cpp.json" 2>"$out/cpu-llama.cpp.log" || {
        cat "$out/cpu-llama.cpp.log" >&2
        say "llama-bench failed; its log is above"
        exit 1
    }
fi

# --- tables -------------------------------------------------------------------
llama_json=""
[ $have_llama = 1 ] && llama_json="$out/cpu-llama.cpp.json"
python3 - "$out/cpu-smol.json" "$llama_json" <<'PY'
import json, os, statistics, sys

def load(path):
    rows = {}
    if not path:
        return rows
    for r in json.load(open(path)):
        test = f"pp{r['n_prompt']}" if r["n_prompt"] > 0 else f"tg{r['n_gen']}"
        rows[(os.path.basename(r["model_filename"]), r["n_threads"], test)] = r
    return rows

def size(b):
    return f"{b / 2**20:.2f} MiB" if b < 2**30 else f"{b / 2**30:.2f} GiB"

def table(title, rows):
    print(f"\n{title}\n")
    print(f"| {'model':<36} | {'size':>10} | {'threads':>7} | {'test':>6} | {'t/s':>20} |")
    print(f"| {'-' * 36} | {'-' * 9}: | {'-' * 6}: | {'-' * 5}: | {'-' * 19}: |")
    for (model, threads, test), r in rows.items():
        ts = f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}"
        print(f"| {model:<36} | {size(r['model_size']):>10} | {threads:>7} | {test:>6} | {ts:>20} |")

smol, llama = load(sys.argv[1]), load(sys.argv[2] if len(sys.argv) > 2 else "")
r0 = next(iter(smol.values()))
table(f"smol {r0['smol_version']} (CPU kernels: {r0['cpu_kernels']})", smol)
if llama:
    l0 = next(iter(llama.values()))
    table(f"llama.cpp {l0.get('build_commit', '?')} ({l0.get('backends', 'CPU')})", llama)
    print("\nsmol / llama.cpp (tokens per second; above 1 means smol is faster)\n")
    print(f"| {'model':<36} | {'test':>6} | {'smol t/s':>10} | {'llama.cpp t/s':>13} | {'ratio':>6} |")
    print(f"| {'-' * 36} | {'-' * 5}: | {'-' * 9}: | {'-' * 12}: | {'-' * 5}: |")
    ratios = []
    for key, s in smol.items():
        l = llama.get(key)
        if not l:
            continue
        ratio = s["avg_ts"] / l["avg_ts"]
        ratios.append(ratio)
        print(f"| {key[0]:<36} | {key[2]:>6} | {s['avg_ts']:>10.2f} | {l['avg_ts']:>13.2f} | {ratio:>6.2f} |")
    if ratios:
        print(f"\ngeometric mean of the ratios: {statistics.geometric_mean(ratios):.2f}")
PY
echo
if [ $have_llama = 1 ]; then
    say "raw JSON: $out/cpu-smol.json and $out/cpu-llama.cpp.json"
else
    say "raw JSON: $out/cpu-smol.json"
fi
if [ $have_llama = 0 ]; then
    say "llama.cpp's llama-bench is not at $llama_bench, so there is nothing to compare with."
    say "Build it with scripts/peers.sh (it builds llama.cpp under /work/peers), or point"
    say "LLAMA_BENCH at an existing llama-bench binary, then run this script again."
    exit 1
fi
