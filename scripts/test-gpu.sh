#!/usr/bin/env bash
# Builds smol with the CUDA backend on a machine with an NVIDIA GPU, runs the
# whole suite there (the CPU tests too: GPU hosts often have AVX-512, which
# exercises CPU kernels a laptop cannot), then times decode on the GPU.
# Logs go to $OUT (the device tool's output folder) or build-gpu/logs.
#
#   scripts/test-gpu.sh                  build in build-gpu, test, time
#   scripts/test-gpu.sh --pack-deps DIR  (on a machine with the packages) put
#                                        doctest, nlohmann_json, CLI11,
#                                        cpp-httplib (Debian's header and
#                                        library, by package name) and the
#                                        python gguf wheel in DIR, for a GPU
#                                        machine that cannot download them
#
# Environment: SMOL_GPU_DEPS=DIR uses a packed DIR when the packages are not
# installed; CMAKE_CUDA_ARCHITECTURES (default 90, Hopper); JOBS (all cores).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

if [ "${1:-}" = "--pack-deps" ]; then
    dir=${2:?usage: test-gpu.sh --pack-deps DIR}
    mkdir -p "$dir/include" "$dir/lib/cmake" "$dir/whl"
    cp -r /usr/include/doctest /usr/include/nlohmann /usr/include/CLI "$dir/include/"
    # Minimal package configs: header-only targets rooted in DIR.
    for pkg in doctest:doctest nlohmann_json:nlohmann_json CLI11:CLI11; do
        name=${pkg%%:*}
        mkdir -p "$dir/lib/cmake/$name"
        cat >"$dir/lib/cmake/$name/${name}Config.cmake" <<EOF
if(NOT TARGET ${name}::${pkg##*:})
  add_library(${name}::${pkg##*:} INTERFACE IMPORTED)
  set_target_properties(${name}::${pkg##*:} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES
                        "\${CMAKE_CURRENT_LIST_DIR}/../../../include")
endif()
EOF
    done
    # cpp-httplib for smol-server, by package name only (nothing fetched by
    # URL): Debian's libcpp-httplib-dev (the split header) and
    # libcpp-httplib0.11 (its shared library), unpacked with dpkg -x, with
    # the brotli headers the header includes (libbrotli-dev; OpenSSL's and
    # zlib's headers and the runtime libraries it links are expected on the
    # GPU machine). A pkg-config file and a CMake package config point at
    # DIR; the library is found at run time through the executable's rpath.
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download libcpp-httplib-dev libcpp-httplib0.11 libbrotli-dev \
        >/dev/null 2>&1) || { echo "test-gpu: apt-get download of cpp-httplib failed" >&2; exit 1; }
    for deb in "$tmp"/*.deb; do dpkg -x "$deb" "$tmp/x"; done
    multi=$(cd "$tmp/x/usr/lib" && ls -d ./*/libcpp-httplib.so.0.11.* | cut -d/ -f2)
    [ -s "$tmp/x/usr/include/httplib.h" ] && [ -n "$multi" ] ||
        { echo "test-gpu: no httplib.h or libcpp-httplib in the packages" >&2; exit 1; }
    cp "$tmp/x/usr/include/httplib.h" "$dir/include/"
    cp -r "$tmp/x/usr/include/brotli" "$dir/include/"
    cp -P "$tmp/x/usr/lib/$multi"/libcpp-httplib.so* "$dir/lib/"
    cflags=$(sed -n 's/^Cflags: -I${includedir} //p' "$tmp/x/usr/lib/$multi/pkgconfig/cpp-httplib.pc")
    version=$(sed -n 's/^Version: //p' "$tmp/x/usr/lib/$multi/pkgconfig/cpp-httplib.pc")
    rm -rf "$tmp"
    mkdir -p "$dir/lib/pkgconfig" "$dir/lib/cmake/httplib"
    cat >"$dir/lib/pkgconfig/cpp-httplib.pc" <<EOF
# Debian's cpp-httplib $version, relocated into this folder.
prefix=\${pcfiledir}/../..
includedir=\${prefix}/include
libdir=\${prefix}/lib

Name: cpp-httplib
Description: A C++ HTTP/HTTPS server and client library
Version: $version
Libs: -L\${libdir} -lcpp-httplib -Wl,-rpath,\${libdir}
Libs.private: -pthread
Cflags: -I\${includedir} $cflags
EOF
    defs=$(echo "$cflags" | sed 's/-D//g; s/ /;/g')
    cat >"$dir/lib/cmake/httplib/httplibConfig.cmake" <<EOF
# Debian's cpp-httplib $version (a header and a shared library), relocated
# into this folder, for machines without pkg-config.
include(CMakeFindDependencyMacro)
find_dependency(Threads)
if(NOT TARGET httplib::httplib)
  add_library(httplib::httplib SHARED IMPORTED)
  set_target_properties(
    httplib::httplib
    PROPERTIES IMPORTED_LOCATION "\${CMAKE_CURRENT_LIST_DIR}/../../libcpp-httplib.so"
               INTERFACE_INCLUDE_DIRECTORIES "\${CMAKE_CURRENT_LIST_DIR}/../../../include"
               INTERFACE_COMPILE_DEFINITIONS "$defs"
               INTERFACE_LINK_LIBRARIES Threads::Threads)
endif()
set(httplib_VERSION $version)
EOF
    python3 -m pip download --no-deps --only-binary=:all: -d "$dir/whl" gguf >/dev/null
    du -sh "$dir"
    exit 0
fi

out=${OUT:-$root/build-gpu/logs}
build=$root/build-gpu
jobs=${JOBS:-$(nproc)}
mkdir -p "$out"
log() { echo "== $*" | tee -a "$out/summary.txt"; }

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
    echo "nvcc: $(nvcc --version | tail -1)"
    echo "cmake: $(cmake --version | head -1)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
    echo "cpu avx-512 flags: $(grep -o 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
} 2>&1 | tee "$out/machine.txt"

prefix=()
if [ -n "${SMOL_GPU_DEPS:-}" ]; then
    deps=$(cd "$SMOL_GPU_DEPS" && pwd)
    prefix=(-DCMAKE_PREFIX_PATH="$deps")
    if ls "$deps"/whl/*.whl >/dev/null 2>&1 && ! python3 -c 'import gguf' 2>/dev/null; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/smol-site "$deps"/whl/*.whl
        export PYTHONPATH=/tmp/smol-site${PYTHONPATH:+:$PYTHONPATH}
    fi
fi
# NCCL for a head split over GPUs: the toolkit's, else the PyPI wheel's.
nccl_root=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
[ -n "$nccl_root" ] && prefix+=(-DSMOL_NCCL_ROOT="$nccl_root")

log "configure"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DSMOL_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-90}" "${prefix[@]}" \
    >"$out/configure.txt" 2>&1 || { tail -30 "$out/configure.txt"; exit 1; }
log "build ($jobs jobs)"
start=$(date +%s)
cmake --build "$build" -j "$jobs" >"$out/build.txt" 2>&1 || { grep -B2 -A8 -m5 'error' "$out/build.txt"; exit 1; }
log "built in $(($(date +%s) - start)) s"

# The GPU test first and verbosely (its messages carry the numbers), then
# everything. The format check needs clang-format and cmake-format, which
# GPU machines usually lack; CI runs it.
log "test-cuda"
(cd "$build/tests" && ./test-cuda --duration=true) 2>&1 | tee "$out/test-cuda.txt" | tail -40
# Kernel times of two decode steps of the 135M-shaped model (launches from
# 6000 on fall in its timed decode loop, where the captured graph replays).
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$ncu" ]; then
    log "ncu: kernels of two decode steps"
    (cd "$build/tests" && timeout 300 "$ncu" --clock-control none --metrics gpu__time_duration.sum \
        --launch-skip 6000 --launch-count 450 --print-summary per-kernel \
        ./test-cuda -tc='*135M*') >"$out/ncu.txt" 2>&1
    grep -E 'kernel|gpu__time_duration' "$out/ncu.txt" | head -80
fi
log "test-cpu-kernels"
(cd "$build/tests" && ./test-cpu-kernels) 2>&1 | tail -5 | tee -a "$out/summary.txt"
log "ctest (all but test-cuda, which ran above)"
skip='^(format|test-cuda)$'
# smol-server is built where cpp-httplib is (packed too); its test needs the
# openai package and the real model, which GPU machines usually lack.
if ! python3 -c 'import openai' 2>/dev/null || [ ! -s "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
    skip='^(format|test-cuda|test-server)$'
    log "test-server left out: it needs the openai package and the real model"
fi
(cd "$build" && ctest -E "$skip" --output-on-failure -j 8 --timeout 300) \
    >"$out/ctest.txt" 2>&1
status=$?
grep -q 'Status: SUCCESS' "$out/test-cuda.txt" || status=1
tail -25 "$out/ctest.txt" | tee -a "$out/summary.txt"

# smol-bench on a random model of SmolLM2-135M's shape, when the bench can
# choose its device.
bench=$build/examples/smol-bench
if [ -x "$bench" ] && "$bench" --help 2>&1 | grep -q -- '--device'; then
    log "smol-bench"
    for m in "$root"/models/*.gguf; do
        [ -f "$m" ] || continue
        "$bench" -m "$m" --device cuda:0 -p 512 -n 128 2>&1 | tee -a "$out/bench.txt"
    done
else
    log "smol-bench has no --device option: decode timing is in test-cuda.txt"
fi
grep -h -E 'tokens/s|largest|variants|skipped' "$out/test-cuda.txt" | tee -a "$out/summary.txt"

# Memory errors and shared-memory races in the GPU tests, last because they
# are slow (the 135M-shaped model and the real one are left out; racecheck
# takes the cache store's and the decode kernel's cases, 1-2 minutes each on
# an H200). A hazard, a memory error or a run that did not finish fails the
# script.
sanitize() { # name, timeout, then compute-sanitizer's arguments
    local name=$1 limit=$2
    shift 2
    log "compute-sanitizer $name"
    (cd "$build/tests" && timeout "$limit" compute-sanitizer --error-exitcode 9 "$@") \
        >"$out/sanitizer-$name.txt" 2>&1
    local rc=$?
    tail -6 "$out/sanitizer-$name.txt" | tee -a "$out/summary.txt"
    case $rc in
    0) ;;
    124) log "compute-sanitizer $name did not finish in $limit s: not checked" && status=1 ;;
    *) log "compute-sanitizer $name failed (exit $rc): see sanitizer-$name.txt" && status=1 ;;
    esac
}
if command -v compute-sanitizer >/dev/null; then
    sanitize memcheck 400 --tool memcheck ./test-cuda -tce='*135M*,*SmolLM2*'
    sanitize racecheck-store 300 --tool racecheck ./test-cuda -tc='kv_store and attention*'
    sanitize racecheck-decode 300 --tool racecheck ./test-cuda \
        -tc='decode attention over sequences in pages*'
fi
exit $status
