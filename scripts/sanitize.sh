#!/usr/bin/env bash
# The test suite under the sanitizers, built with clang:
#   address  every test (the CPU suites, the offload, engine and fault tests,
#            smol-server through test-server) under ASan and UBSan, halting
#            on the first report; LeakSanitizer checks every test program and
#            smol-server (stopped by SIGTERM) for memory lost at exit
#   thread   the tests with threads of their own under TSan: the executor's
#            pool and the simulated device's copy threads (test-offload,
#            test-faults), the engine's worker (test-engine, test-faults) and
#            smol-server's handlers (test-server, test-server-load)
# Each builds in build-asan / build-tsan (RelWithDebInfo) and runs ctest
# there; a report fails the test that made it.
#
#   scripts/sanitize.sh                 both
#   scripts/sanitize.sh address|thread  one
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
kinds=("${@:-address}")
[ $# -eq 0 ] && kinds=(address thread)

scripts/install-packages.sh clang libclang-rt-14-dev
scripts/fetch-model.sh >/dev/null

status=0
for kind in "${kinds[@]}"; do
    case $kind in
        address)
            build=build-asan
            targets=(all)
            # Every test but the formatting and installation checks, which
            # run no smol code, the perplexity checks, whose paths
            # (quantize, prefill, quantized KV caches) test-requant,
            # test-model and test-offload run already, test-heads (two
            # hundred prefills; test-window runs the streaming heads'
            # code), test-structured-output (hundreds of constrained
            # requests, six minutes here; test-grammar runs the grammars
            # and schemas, test-server a constrained request through the
            # server, and fuzz.sh hostile grammars) and test-replicas
            # (nginx in front of two servers whose code test-server and
            # test-server-load run).
            select=(-E '^(format|install-find-package|perplexity-matches-llama|perplexity-kv-types|test-heads|test-structured-output|test-replicas)$')
            export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1
            export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
            ;;
        thread)
            build=build-tsan
            targets=(test-offload test-engine test-faults test-split smol-server)
            select=(-R '^(test-offload|test-engine|test-faults|test-split|test-server|test-server-load)$')
            # A report makes the program exit 66 when it ends; races wholly
            # inside Debian's uninstrumented cpp-httplib are suppressed
            # (tests/tsan.supp says why).
            export TSAN_OPTIONS=halt_on_error=0:second_deadlock_stack=1:suppressions=$root/tests/tsan.supp
            ;;
        *) echo "sanitize: address or thread, not '$kind'" >&2 && exit 2 ;;
    esac
    echo "sanitize: $kind: building in $build"
    CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DSMOL_SANITIZE="$kind" >/dev/null
    start=$(date +%s)
    cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" >"$build/build.log" 2>&1 ||
        { tail -30 "$build/build.log"; exit 1; }
    echo "sanitize: $kind: built in $(($(date +%s) - start)) s; testing"
    start=$(date +%s)
    if ctest --test-dir "$build" "${select[@]}" --output-on-failure -j"$(nproc)" --timeout 900; then
        echo "sanitize: $kind: passed in $(($(date +%s) - start)) s"
    else
        status=1
        echo "sanitize: $kind: FAILED (the report is above)" >&2
    fi
done
exit $status
