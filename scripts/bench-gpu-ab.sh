#!/usr/bin/env bash
# Two versions of smol on one GPU in one run: this checkout ("head") against
# a base version given as a source tarball (`git archive --format=tar.gz -o
# base.tar.gz COMMIT`), so that a change's effect on speed is measured with
# the same card, driver and files. Builds smol-bench for both (CUDA, sm_90
# unless CMAKE_CUDA_ARCHITECTURES says otherwise), writes random-weight f16
# files of SmolLM2-135M's, -360M's and -1.7B's shapes, then alternates the
# two versions, base first in each round: tg128 and pp4096 on the three
# files, and the 1.7B's decode after a 32K-token context under a 24 GiB
# budget (--gpu-mem 24GiB stands in for a consumer card). No autotune table
# is read (the built-in kernel choice), so both versions choose alike.
#
#   scripts/bench-gpu-ab.sh [--build-only | --bench-only] BASE.tar.gz
#
# The head is built in build-gpu (as scripts/test-gpu.sh builds it, tests
# included, so that test-cuda can run between --build-only and
# --bench-only), the base in /tmp/smol-ab. Environment: SMOL_GPU_DEPS=DIR
# (default .gpu-deps: packed CMake packages and smollm2-vocab.gguf, the
# tokenizer of the random files, as scripts/bench-gpu.sh --pack writes
# them); ROUNDS (default 2); JOBS (default all cores). Logs and summary.md
# go to $OUT (the device tool's output folder) or build-gpu/ab-logs.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
phase=all
case "${1:-}" in
    --build-only) phase=build; shift ;;
    --bench-only) phase=bench; shift ;;
esac
base_tar=${1:?usage: bench-gpu-ab.sh [--build-only | --bench-only] BASE.tar.gz}
head_build=$root/build-gpu
out=${OUT:-$root/build-gpu/ab-logs}
deps=${SMOL_GPU_DEPS:-$root/.gpu-deps}
rounds=${ROUNDS:-2}
jobs=${JOBS:-$(nproc)}
work=/tmp/smol-ab
mkdir -p "$out" "$work/models"
summary=$out/summary.md
log() { echo "== $(date +%T) $*" | tee -a "$summary"; }

[ -s "$deps/smollm2-vocab.gguf" ] || { echo "bench-gpu-ab: no $deps/smollm2-vocab.gguf" >&2; exit 1; }
prefix=(-DCMAKE_PREFIX_PATH="$(cd "$deps" && pwd)")

build() { # source dir, build dir, jobs, targets...
    local src=$1 dir=$2 j=$3
    shift 3
    cmake -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DSMOL_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-90}" \
        "${prefix[@]}" >"$dir.configure.log" 2>&1 &&
        cmake --build "$dir" -j "$j" --target "$@" >"$dir.build.log" 2>&1
}

if [ "$phase" != bench ]; then
    rm -rf "$work/base-src" && mkdir -p "$work/base-src"
    tar -xzf "$base_tar" -C "$work/base-src" || exit 1
    log "build base and head ($jobs jobs)"
    t0=$(date +%s)
    build "$work/base-src" "$work/build-base" $((jobs / 2)) smol-bench smol-quantize &
    pid=$!
    build "$root" "$head_build" $((jobs / 2)) smol-bench smol-quantize test-cuda ||
        { tail -30 "$head_build.build.log"; exit 1; }
    wait $pid || { tail -30 "$work/build-base.build.log"; exit 1; }
    log "built in $(($(date +%s) - t0)) s"
    [ "$phase" = build ] && exit 0
fi

declare -A bin=([base]=$work/build-base/examples [head]=$head_build/examples)
m=$work/models
for shape in 135M 360M 1.7B; do
    [ -s "$m/$shape.gguf" ] && continue
    "${bin[head]}/smol-quantize" --random "$shape" --type f16 \
        --vocab-from "$deps/smollm2-vocab.gguf" "$m/$shape.gguf" >/dev/null || exit 1
done
all=$m/135M.gguf,$m/360M.gguf,$m/1.7B.gguf

export SMOL_AUTOTUNE_FILE=$work/no-table.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee -a "$summary"
for r in $(seq 1 "$rounds"); do
    for v in base head; do
        b=${bin[$v]}/smol-bench
        log "round $r, $v: tg128"
        "$b" --device cuda:0 -m "$all" -p 0 -n 128 -r 3 2>"$out/$v-$r-tg.err" | tee -a "$summary"
        log "round $r, $v: pp4096"
        "$b" --device cuda:0 -m "$all" -p 4096 -n 0 -r 2 2>"$out/$v-$r-pp.err" | tee -a "$summary"
        log "round $r, $v: 1.7B at 32K under 24 GiB"
        "$b" --device cuda:0 -m "$m/1.7B.gguf" --gpu-mem 24GiB -p 0 -n 32 -d 32768 -r 1 \
            2>"$out/$v-$r-32k.err" | tee -a "$summary"
    done
done
log "done"
