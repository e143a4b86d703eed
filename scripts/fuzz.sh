#!/usr/bin/env bash
# Builds smol's libFuzzer targets (tests/fuzz: the GGUF reader, the whole
# model load) with clang, ASan and UBSan in build-fuzz, writes the seed
# corpus (small random llama files, never committed) and runs each target.
# A crash, a sanitizer report, an allocation past 2 GiB, a resident size
# past 4 GiB or an input that takes over 10 s fails the run; the input is
# saved in build-fuzz/findings/ (and $OUT/ where the device tool set it).
#
#   scripts/fuzz.sh            each target for 60 s, fresh random mutations
#   scripts/fuzz.sh SECONDS    each target for SECONDS (an hour: 3600)
#   scripts/fuzz.sh --ci       each target for a fixed count of runs from a
#                              fixed seed, so that CI runs the same inputs
#                              every time (about half a minute each here)
#
# Corpora grow in build-fuzz/corpus/<target> across runs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

limit=(-max_total_time="${1:-60}")
if [ "${1:-}" = "--ci" ]; then
    limit=(-seed=1 -runs=60000)
fi
build="build-fuzz"
targets=(fuzz-gguf fuzz-model-load)

scripts/install-packages.sh clang libclang-rt-14-dev
if [ ! -f "$build/CMakeCache.txt" ]; then
    CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSMOL_FUZZ=ON \
        -DSMOL_SANITIZE=address \
        -DSMOL_BUILD_TESTS=OFF -DSMOL_BUILD_EXAMPLES=OFF >/dev/null
fi
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" fuzz-make-seeds >/dev/null

seeds=$build/seeds
findings=$build/findings
mkdir -p "$seeds" "$findings"
"$build/tests/fuzz/fuzz-make-seeds" "$seeds"

status=0
for t in "${targets[@]}"; do
    corpus=$build/corpus/$t
    mkdir -p "$corpus"
    log=$build/$t.log
    echo "fuzz: $t (${limit[*]})"
    if "$build/tests/fuzz/$t" "$corpus" "$seeds" "${limit[@]}" -dict=tests/fuzz/gguf.dict \
        -malloc_limit_mb=2048 -rss_limit_mb=4096 -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$findings/$t-" >"$log" 2>&1; then
        echo "fuzz: $t: $(grep -m1 -o 'Done [0-9]* runs in [0-9]* second(s)' "$log"), corpus" \
            "$(find "$corpus" -type f | wc -l) inputs"
    else
        status=1
        echo "fuzz: $t FOUND A DEFECT; the input is in $findings, the report:" >&2
        grep -A 30 -m1 -E 'ERROR|runtime error|out-of-memory|timeout' "$log" >&2 || tail -40 "$log" >&2
        if [ -n "${OUT:-}" ]; then cp "$findings"/* "$OUT"/ 2>/dev/null || true; fi
    fi
done
exit $status
