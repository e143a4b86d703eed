#!/usr/bin/env bash
# Builds the peer engine (llama.cpp, as vendored by the llama-cpp-python sdist)
# that smol is compared against, plus a Python venv with llama-cpp-python.
#
#   scripts/peers.sh [DIR]             # DIR defaults to /work/peers
#   scripts/peers.sh --cuda [DIR]      # or PEERS_CUDA=1: add the CUDA backend (sm_90; on a
#                                      # machine without a GPU driver, built to be carried:
#                                      # linked against the driver stub, CPU code for AVX2)
#   scripts/peers.sh --no-venv [DIR]   # or PEERS_VENV=0: only the CMake build
#   scripts/peers.sh --sources [DIR]   # only download and unpack the sdist: the
#                                      # tokenizer suite (models/ggml-vocab-*) and
#                                      # chat templates (models/templates) the tests read
#   scripts/peers.sh --pack FILE       # also write a trimmed llama.cpp source
#                                      # tarball (~10 MB) for an offline machine
#   scripts/peers.sh --src FILE [DIR]  # build from such a tarball (or a source
#                                      # directory) instead of the sdist; no venv
#
# Environment: PEERS_JOBS (parallel build jobs, default 2; raise it on a
# bigger machine), PEERS_CUDA_ARCH (default 90). Every step is skipped when its
# output already exists; a venv made without CUDA is not rebuilt by --cuda.
#
# Results:
#   DIR/llama_cpp_python-VERSION/vendor/llama.cpp   the llama.cpp sources
#   DIR/build-cpu/bin/{llama-bench,llama-completion,llama-quantize,llama-tokenize,
#                      llama-server,llama-perplexity,llama-lookup,llama-speculative}
#   DIR/build-cuda/bin/...                          (with --cuda)
#   DIR/venv/bin/python                             llama-cpp-python, numpy, gguf
set -euo pipefail

version=0.3.36
commit_pin=0c1e57098  # the llama.cpp commit vendored by llama-cpp-python 0.3.36
cuda=${PEERS_CUDA:-0}
venv=${PEERS_VENV:-1}
jobs=${PEERS_JOBS:-2}
cuda_arch=${PEERS_CUDA_ARCH:-90}
dir=/work/peers
pack=""
from=""
sources_only=0
while [ $# -gt 0 ]; do
    case "$1" in
        --cuda) cuda=1 ;;
        --no-venv) venv=0 ;;
        --sources) sources_only=1 ;;
        --pack) pack=$2; shift ;;
        --src) from=$2; venv=0; shift ;;
        -h|--help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0 ;;
        -*) echo "peers: unknown option $1" >&2; exit 2 ;;
        *) dir=$1 ;;
    esac
    shift
done

log() { echo "peers: $*"; }

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
sdist="$dir/llama_cpp_python-$version.tar.gz"
src="$dir/llama_cpp_python-$version"
vendor="$src/vendor/llama.cpp"

# 1. The sources: the sdist from PyPI, or a tree/tarball given with --src.
if [ -n "$from" ]; then
    if [ -d "$from" ]; then
        vendor=$(cd "$from" && pwd)
    else
        vendor="$dir/llama.cpp-src"
        if [ ! -f "$vendor/CMakeLists.txt" ]; then
            log "unpacking $from"
            rm -rf "$vendor"
            mkdir -p "$vendor"
            tar -xzf "$from" -C "$vendor"
        fi
    fi
else
    if [ ! -f "$sdist" ]; then
        log "downloading llama-cpp-python==$version sdist from PyPI"
        tmp=$(mktemp -d "$dir/dl.XXXXXX")
        python3 -m pip download --quiet --no-deps --no-binary :all: --dest "$tmp" \
            "llama-cpp-python==$version"
        found=$(ls "$tmp"/*.tar.gz | head -n1)
        mv "$found" "$sdist"
        rm -rf "$tmp"
    fi
    if [ ! -f "$vendor/CMakeLists.txt" ]; then
        log "unpacking $(basename "$sdist")"
        rm -rf "$src"
        tar -xzf "$sdist" -C "$dir"
        if [ ! -d "$src" ] && [ -d "$dir/llama-cpp-python-$version" ]; then
            mv "$dir/llama-cpp-python-$version" "$src"
        fi
    fi
fi

if [ "$sources_only" = 1 ]; then
    log "llama.cpp sources in $vendor"
    exit 0
fi

# 2. Which llama.cpp this is. The sdist ships the submodule's shallow git
# metadata, so the commit is exact; the commit count (llama.cpp's "build
# number") is not recoverable from a depth-1 clone and reads 1. A tarball made
# by --pack carries the same facts in PEER_VERSION.
describe_llama() {
    if [ -f "$vendor/PEER_VERSION" ]; then
        cat "$vendor/PEER_VERSION"
        return
    fi
    local commit date subject
    commit=$(git -C "$vendor" rev-parse --short=9 HEAD 2>/dev/null || echo "$commit_pin?")
    date=$(git -C "$vendor" log -1 --format=%cs 2>/dev/null || echo unknown)
    subject=$(git -C "$vendor" log -1 --format=%s 2>/dev/null || echo unknown)
    echo "llama-cpp-python $version; vendor llama.cpp commit $commit ($date, \"$subject\")"
}

if [ -n "$pack" ]; then
    log "writing the trimmed source tarball $pack"
    describe_llama > "$dir/PEER_VERSION"
    # tools/ui: only what llama-server's build needs without the web UI
    # (its CMakeLists.txt and the templates of the empty asset table).
    tar -czf "$pack" -C "$vendor" \
        --exclude=./.git --exclude=./models --exclude=./docs --exclude=./media \
        --exclude=./tools/ui/src --exclude=./tools/ui/static --exclude=./tools/ui/tests \
        --exclude=./tools/ui/.storybook --exclude=./tools/ui/scripts \
        --exclude='./tools/ui/package*.json' --exclude=./PEER_VERSION . \
        -C "$dir" PEER_VERSION
    rm -f "$dir/PEER_VERSION"
    log "$pack: $(du -h "$pack" | cut -f1)"
fi

# 3. The CMake build of the command-line tools.
build_tools() {
    local bdir=$1; shift
    # llama-cli needs the server tree in this llama.cpp; llama-completion is
    # the plain prompt-in, text-out tool, llama-tokenize dumps token ids;
    # llama-server is the serving peer of smol-server (scripts/bench-serve.py);
    # llama-lookup and llama-speculative (examples) are the peers of smol's
    # speculation (scripts/bench-spec.sh -L).
    local targets="llama-bench llama-completion llama-quantize llama-tokenize llama-server llama-perplexity llama-lookup llama-speculative"
    local missing=0 t
    for t in $targets; do [ -x "$bdir/bin/$t" ] || missing=1; done
    if [ "$missing" = 0 ]; then
        log "$bdir is built ($targets)"
        return
    fi
    log "configuring $bdir $*"
    local gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    cmake -S "$vendor" -B "$bdir" "${gen[@]}" \
        -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_EXAMPLES=ON \
        -DLLAMA_OPENSSL=OFF \
        "$@"
    log "building $targets with $jobs jobs"
    # shellcheck disable=SC2086
    nice cmake --build "$bdir" --parallel "$jobs" --target $targets
}

if [ "$cuda" = 1 ] && ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
fi
# A CPU that lists AMX inside a VM that does not grant its tile state:
# -march=native would build ggml's AMX matmul, which faults at its first
# tile instruction. Probe it; where it faults, build without AMX.
native_flags=()
if grep -q amx_tile /proc/cpuinfo 2>/dev/null; then
    probe=$(mktemp -d)
    cat >"$probe/amx.c" <<'EOF'
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(void) {
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) return 1;
    unsigned char cfg[64] = {1}; /* palette 1; tile 0: 16 rows of 64 bytes */
    cfg[16] = 64;
    cfg[48] = 16;
    _tile_loadconfig(cfg);
    _tile_zero(0);
    _tile_release();
    return 0;
}
EOF
    if ! { cc -O1 -mamx-tile -o "$probe/amx" "$probe/amx.c" && "$probe/amx"; } 2>/dev/null; then
        log "this CPU lists AMX but cannot run it here: building without AMX"
        native_flags=(-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
            -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
    fi
    rm -rf "$probe"
fi
build_tools "$dir/build-cpu" "${native_flags[@]}"
if [ "$cuda" = 1 ]; then
    cuda_flags=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$cuda_arch")
    # No GPU driver here (libcuda.so.1): the build is for another machine.
    # Its executables link against the toolkit's stub of the driver, and its
    # CPU code takes AVX2, not this CPU's own instructions.
    stub=$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")/../lib64/stubs
    if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' && [ -f "$stub/libcuda.so" ]; then
        log "no GPU driver here: linking against $stub/libcuda.so, CPU code for AVX2"
        mkdir -p "$dir/cuda-stub"
        ln -sf "$(cd "$stub" && pwd)/libcuda.so" "$dir/cuda-stub/libcuda.so.1"
        cuda_flags+=(-DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$dir/cuda-stub" -DGGML_NATIVE=OFF
            -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
    fi
    build_tools "$dir/build-cuda" "${cuda_flags[@]}"
fi

# 4. The venv with llama-cpp-python built from the same sdist.
if [ "$venv" = 1 ]; then
    if [ ! -x "$dir/venv/bin/python" ]; then
        log "creating $dir/venv"
        python3 -m venv "$dir/venv"
    fi
    if ! "$dir/venv/bin/python" -c "import llama_cpp, numpy, sys; sys.exit(llama_cpp.__version__ != '$version')" 2>/dev/null; then
        log "installing llama-cpp-python $version from the sdist (30+ minutes on 2 busy cores)"
        "$dir/venv/bin/python" -m pip install --quiet --upgrade pip
        "$dir/venv/bin/python" -m pip install --quiet numpy
        # LLAVA_BUILD=OFF: the multimodal library is not needed and only costs build time.
        venv_args="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF"
        if [ "$cuda" = 1 ]; then
            venv_args="$venv_args -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$cuda_arch"
        fi
        CMAKE_ARGS="${CMAKE_ARGS:-$venv_args}" CMAKE_BUILD_PARALLEL_LEVEL="$jobs" \
            nice "$dir/venv/bin/python" -m pip install --no-cache-dir --verbose "$sdist" \
            > "$dir/venv-install.log" 2>&1 \
            || { tail -n 40 "$dir/venv-install.log" >&2; exit 1; }
    fi
    if ! "$dir/venv/bin/python" -c "import gguf" 2>/dev/null; then
        log "installing the vendored gguf-py (GGUF reader for the float64 reference)"
        "$dir/venv/bin/python" -m pip install --quiet "$vendor/gguf-py"
    fi
    log "venv: $dir/venv/bin/python (llama_cpp $("$dir/venv/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)'))"
fi

log "binaries: $dir/build-cpu/bin"
if [ "$cuda" = 1 ]; then
    log "binaries (CUDA): $dir/build-cuda/bin"
fi
log "$(describe_llama)"
