#!/usr/bin/env bash
# Builds smol's libFuzzer targets (tests/fuzz) with clang, ASan and UBSan in
# build-fuzz and runs each:
#   fuzz-gguf            bytes as a GGUF file, mapped and read
#   fuzz-model-load      bytes as a model file, loaded, asked for its info
#   fuzz-tokenizer       bytes through SmolLM2's tokenizer and back
#   fuzz-chat-template   bytes as a chat template and a conversation
#   fuzz-server-request  bytes as smol-server's request bodies
#   fuzz-safetensors     bytes as a safetensors file through smol-convert's reader
#   fuzz-sentencepiece   bytes as a tokenizer.model through smol-convert's reader
#   fuzz-grammar         bytes as GBNF and a text, or as a JSON schema
# The GGUF targets start from small random llama files (written here, never
# committed); the others from tests/fuzz/corpus/<target>. A crash, a
# sanitizer report, a failed check, an allocation past 2 GiB, a resident
# size past 4 GiB or an input that takes over 10 s fails the run; the input
# is saved in build-fuzz/findings/ (and $OUT/ where the device tool set it).
#
#   scripts/fuzz.sh               each target for 60 s, fresh random mutations
#   scripts/fuzz.sh SECONDS       each target for SECONDS (an hour in all: 720)
#   scripts/fuzz.sh --ci          each target for a fixed count of runs from a
#                                 fixed seed, so that CI runs the same
#                                 sequence of inputs every time: 60,000, and
#                                 40,000 for fuzz-grammar, whose inputs grow
#                                 slow as its corpus grows; a target stops
#                                 early at 90 s, part way along its sequence
#                                 (fuzz-grammar's 40,000 took 45 to 197 s on
#                                 2-core machines; the summary line counts)
#   scripts/fuzz.sh ... TARGET..  only the targets named
#
# Corpora grow in build-fuzz/corpus/<target> across runs; a summary line per
# target (runs, corpus size) goes to build-fuzz/summary.txt.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

limit=(-max_total_time=60)
ci=0
case "${1:-}" in
    --ci) ci=1 && shift ;;
    [0-9]*) limit=(-max_total_time="$1") && shift ;;
esac
build="build-fuzz"
all=(fuzz-gguf fuzz-model-load fuzz-tokenizer fuzz-chat-template fuzz-server-request
    fuzz-safetensors fuzz-sentencepiece fuzz-grammar)
targets=("${all[@]}")
[ $# -gt 0 ] && targets=("$@")
declare -A dict=([fuzz-gguf]=gguf [fuzz-model-load]=gguf [fuzz-tokenizer]=tokenizer
    [fuzz-chat-template]=chat-template [fuzz-server-request]=json [fuzz-safetensors]=json
    [fuzz-sentencepiece]=sentencepiece [fuzz-grammar]=grammar)

scripts/install-packages.sh clang libclang-rt-14-dev nlohmann-json3-dev
scripts/fetch-model.sh >/dev/null # fuzz-tokenizer's vocabulary
CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSMOL_FUZZ=ON \
    -DSMOL_SANITIZE=address -DSMOL_BUILD_TESTS=OFF -DSMOL_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" fuzz-make-seeds >/dev/null

findings=$build/findings
mkdir -p "$build/seeds" "$findings"
"$build/tests/fuzz/fuzz-make-seeds" "$build/seeds"

status=0
for t in "${targets[@]}"; do
    [ -n "${dict[$t]:-}" ] || { echo "fuzz: no target $t (${all[*]})" >&2 && exit 2; }
    corpus=$build/corpus/$t
    seeds=$build/seeds
    [ -d "tests/fuzz/corpus/${t#fuzz-}" ] && seeds=tests/fuzz/corpus/${t#fuzz-}
    mkdir -p "$corpus"
    if [ "$ci" = 1 ]; then
        runs=60000
        [ "$t" = fuzz-grammar ] && runs=40000
        limit=(-seed=1 -runs=$runs -max_total_time=90)
    fi
    log=$build/$t.log
    echo "fuzz: $t (${limit[*]})"
    if "$build/tests/fuzz/$t" "$corpus" "$seeds" "${limit[@]}" -dict="tests/fuzz/${dict[$t]}.dict" \
        -malloc_limit_mb=2048 -rss_limit_mb=4096 -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$findings/$t-" >"$log" 2>&1; then
        line="$t: $(grep -m1 -o 'Done [0-9]* runs in [0-9]* second(s)' "$log"), corpus $(find "$corpus" -type f | wc -l) inputs"
        echo "fuzz: $line"
        echo "$(date -u +%FT%TZ) $(git rev-parse --short HEAD) ${limit[*]} $line" >>"$build/summary.txt"
    else
        status=1
        echo "fuzz: $t FOUND A DEFECT; the input is in $findings, the report:" >&2
        grep -A 30 -m1 -E 'ERROR|runtime error|out-of-memory|timeout|^fuzz-' "$log" >&2 ||
            tail -40 "$log" >&2
        if [ -n "${OUT:-}" ]; then cp "$findings"/* "$OUT"/ 2>/dev/null || true; fi
    fi
done
exit $status
