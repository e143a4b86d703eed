#!/usr/bin/env bash
# GPU benchmarks in one command on the device machine: builds smol with CUDA,
# writes random-weight SmolLM2-360M and -1.7B files (and a random 135M) to
# /tmp, autotunes the matmul kernels, runs the table (pp512, pp4096, tg128,
# batched decode at M = 1, 8, 32, 128 with the kernel family each M used) on
# the real 135M Q4_1 and the random f16 files, measures the ceilings (device
# copy bandwidth, bf16 matmul rate, through torch), and with --peers builds
# llama.cpp's llama-bench and llama-batched-bench for sm_90 from carried
# source and runs them on the same files. $OUT (the device tool's output
# folder, else build-gpu/bench-logs) gets four files: summary.md (the
# tables), log.txt (every phase's output), bench-smol.json, autotune-table.txt.
#
# The real 135M file (94 MiB) is larger than what travels to the device; when
# models/ lacks it there, a random 135M q4_1 takes its row (named -random-)
# and the tokenizer comes from the vocabulary-only file that --pack writes.
#
#   scripts/bench-gpu.sh                      build, models, autotune, bench, ceilings
#   scripts/bench-gpu.sh --only PHASES        a comma list of: build, models, autotune,
#                                             bench, ceilings, peers, hf
#   scripts/bench-gpu.sh --offload            add the long-context phase (per-head KV
#                                             placement under a 24 GiB budget, 1.7B f16)
#   scripts/bench-gpu.sh --peers              add the llama.cpp phase (needs its source)
#   scripts/bench-gpu.sh --hf                 add HF transformers on the random 1.7B f16
#   scripts/bench-gpu.sh --pack DIR           (here, before) put the build dependencies
#                                             and llama.cpp's trimmed source in DIR
#
# Phases are split so each fits a 10-minute call; build outputs (build-gpu,
# build-peers) stay on a warm machine between calls, the random models in
# /tmp/smol-random too. Environment: SMOL_GPU_DEPS=DIR (default .gpu-deps
# when it exists): packed CMake packages, the gguf wheel and
# llama.cpp-src.tar.gz; REPS (default 3); MODELS_1_7B=0 leaves the 1.7B out.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1

phases="build,models,autotune,bench,ceilings"
while [ $# -gt 0 ]; do
    case "$1" in
        --only) phases=$2; shift ;;
        --peers) phases="$phases,peers" ;;
        --offload) phases="$phases,offload" ;;
        --hf) phases="$phases,hf" ;;
        --pack)
            dir=${2:?usage: bench-gpu.sh --pack DIR}
            scripts/test-gpu.sh --pack-deps "$dir" || exit 1
            scripts/peers.sh --no-venv --pack "$dir/llama.cpp-src.tar.gz" /work/peers || exit 1
            # SmolLM2's tokenizer metadata alone (no tensors), for --vocab-from.
            python3 - "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" "$dir/smollm2-vocab.gguf" <<'EOF' || exit 1
import sys
import gguf
r = gguf.GGUFReader(sys.argv[1])
w = gguf.GGUFWriter(sys.argv[2], "llama")
for f in r.fields.values():
    if f.name.startswith("tokenizer."):
        vt = f.types[0]
        w.add_key_value(f.name, f.contents(), vt,
                        sub_type=f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
EOF
            du -sh "$dir"
            exit 0 ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "bench-gpu: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
has() { case ",$phases," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

out=${OUT:-$root/build-gpu/bench-logs}
mkdir -p "$out"
build=$root/build-gpu
models=/tmp/smol-random
reps=${REPS:-3}
real=$root/models/SmolLM2-135M-Instruct.Q4_1.gguf
deps=${SMOL_GPU_DEPS:-}
[ -z "$deps" ] && [ -d "$root/.gpu-deps" ] && deps=$root/.gpu-deps
export SMOL_AUTOTUNE_FILE=${SMOL_AUTOTUNE_FILE:-$build/autotune.txt}
summary=$out/summary.md
all_log=$out/log.txt
log() { echo "== $(date +%T) $*" | tee -a "$summary" "$all_log"; }
# Runs a phase's command with its output appended to log.txt and kept in a
# scratch file $tmp/NAME.txt for the summary, timing it.
tmp=$(mktemp -d)
phase() {
    local name=$1; shift
    local t0
    t0=$(date +%s)
    log "$name"
    "$@" >"$tmp/$name.txt" 2>&1
    local rc=$?
    cat "$tmp/$name.txt" >>"$all_log"
    log "$name: exit $rc after $(($(date +%s) - t0)) s"
    return $rc
}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem \
        --format=csv 2>&1
    echo "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
    echo "smol: $(git -C "$root" rev-parse --short HEAD 2>/dev/null) $(git -C "$root" status --short | wc -l) changed files"
} 2>&1 | sed 's/^/    /' >>"$summary"

if [ -n "$deps" ] && ls "$deps"/whl/*.whl >/dev/null 2>&1 && ! python3 -c 'import gguf' 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/smol-site "$deps"/whl/*.whl
    export PYTHONPATH=/tmp/smol-site${PYTHONPATH:+:$PYTHONPATH}
fi

# --- build --------------------------------------------------------------------
build_smol() {
    local prefix=()
    [ -n "$deps" ] && prefix=(-DCMAKE_PREFIX_PATH="$(cd "$deps" && pwd)")
    local gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DSMOL_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-90}" -DSMOL_BUILD_TESTS=OFF \
        "${prefix[@]}" &&
        cmake --build "$build" -j "$(nproc)" --target smol-bench smol-quantize
}
if has build; then
    phase build build_smol || { tail -30 "$tmp/build.txt"; exit 1; }
fi
bench=$build/examples/smol-bench
quantize=$build/examples/smol-quantize

# --- random models ---------------------------------------------------------------
want_models=("135M f16" "360M f16" "360M q8_0" "1.7B f16" "1.7B q8_0")
[ "${MODELS_1_7B:-1}" = 0 ] && want_models=("135M f16" "360M f16" "360M q8_0")
vocab=$real
if [ ! -s "$real" ]; then
    vocab=$deps/smollm2-vocab.gguf
    real=$models/smollm2-135M-random-q4_1.gguf
    want_models=("135M q4_1" "${want_models[@]}")
fi
model_path() { echo "$models/smollm2-$1-random-$2.gguf"; }
write_models() {
    mkdir -p "$models"
    df -h "$models" | tail -1
    for m in "${want_models[@]}"; do
        set -- $m
        local f
        f=$(model_path "$1" "$2")
        if [ -s "$f" ]; then echo "$f exists"; continue; fi
        "$quantize" --random "$1" --type "$2" --vocab-from "$vocab" -t "$(nproc)" "$f" | tail -3 || return 1
    done
    ls -la "$models"
}
if has models; then
    phase models write_models || exit 1
fi
bench_files=("$real")
for m in "135M f16" "360M f16" "1.7B f16"; do
    set -- $m
    [ -s "$(model_path "$1" "$2")" ] && bench_files+=("$(model_path "$1" "$2")")
done
all_files=("${bench_files[@]}")
for m in "360M q8_0" "1.7B q8_0"; do
    set -- $m
    [ -s "$(model_path "$1" "$2")" ] && all_files+=("$(model_path "$1" "$2")")
done
list=$(IFS=,; echo "${all_files[*]}")
bench_list=$(IFS=,; echo "${bench_files[*]}")

# --- autotune ------------------------------------------------------------------
if has autotune; then
    phase autotune "$bench" --device cuda:0 --autotune -p 0 -n 0 -m "$list"
    cp "$SMOL_AUTOTUNE_FILE" "$out/autotune-table.txt" 2>/dev/null
    grep -c -v '^#' "$SMOL_AUTOTUNE_FILE" 2>/dev/null | sed 's/^/autotune table lines: /' >>"$summary"
fi

# --- smol's table ------------------------------------------------------------------
if has bench; then
    {
        echo
        echo "### smol (random-weight files say so in their names: *-random-*)"
        echo
    } >>"$summary"
    phase bench-smol "$bench" --device cuda:0 -m "$list" -p 512,4096 -n 128 \
        --batched 1,8,32,128 -r "$reps" -oe json -o md 2>"$out/bench-smol.json"
    grep '^|' "$tmp/bench-smol.txt" >>"$summary"
    # The stderr JSON ends with the array; keep only that.
    python3 - "$out/bench-smol.json" <<'EOF' 2>/dev/null
import json, sys
text = open(sys.argv[1]).read()
start = text.find("[\n")
if start >= 0:
    data = json.loads(text[start:])
    json.dump(data, open(sys.argv[1], "w"), indent=1)
EOF
fi

# --- long contexts under a budget --------------------------------------------------
# SmolLM2-1.7B's shape (random f16) with a 24 GiB device budget standing in for
# a consumer card: decode at 32K depth with the planner's placement (the cache
# fits) and with every head offloaded; prefill of 32K tokens both ways; decode
# at 128K depth, where the planner must offload part of the cache.
offload_bench() {
    local f
    f=$(model_path 1.7B f16)
    [ -s "$f" ] || { echo "no $f: run the models phase"; return 1; }
    local common=(--device cuda:0 -m "$f" --gpu-mem 24GiB -b 4096 -r "${OFFLOAD_REPS:-1}")
    local mode
    for mode in auto all; do
        "$bench" "${common[@]}" -p 0 -n 32 -d 32768 --kv-offload $mode 2>&1 || return 1
        "$bench" "${common[@]}" -p 32768 -n 0 --kv-offload $mode 2>&1 || return 1
    done
    "$bench" "${common[@]}" -p 0 -n 16 -d 131072 2>&1
}
if has offload; then
    {
        echo
        echo "### long contexts, SmolLM2-1.7B shape (random f16), --gpu-mem 24GiB"
        echo
    } >>"$summary"
    phase offload offload_bench
    grep '^|' "$tmp/offload.txt" >>"$summary"
fi

# --- ceilings ----------------------------------------------------------------------
ceilings() {
    python3 - <<'EOF'
import time
try:
    import torch
except ImportError:
    raise SystemExit("torch is not installed: no ceilings measured")
dev = torch.device("cuda:0")
print("torch", torch.__version__, torch.cuda.get_device_name(0))
def timed(fn, reps):
    fn(); torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = 1e30
    for _ in range(3):
        start.record()
        for _ in range(reps): fn()
        end.record(); torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1000 / reps)
    return best
n = 1 << 30
a = torch.empty(n, dtype=torch.uint8, device=dev); b = torch.empty_like(a)
t = timed(lambda: b.copy_(a), 20)
print(f"device-to-device copy of 1 GiB: {2 * n / t / 1e12:.2f} TB/s (read + write), "
      f"{n / t / 1e12:.2f} TB/s one way")
for size in (4096, 8192):
    x = torch.randn(size, size, dtype=torch.bfloat16, device=dev)
    y = torch.randn(size, size, dtype=torch.bfloat16, device=dev)
    t = timed(lambda: x @ y, 20)
    print(f"bf16 matmul {size}^3: {2 * size ** 3 / t / 1e12:.1f} TFLOP/s")
EOF
}
if has ceilings; then
    phase ceilings ceilings
    { echo; echo "### ceilings"; echo; sed 's/^/    /' "$tmp/ceilings.txt"; } >>"$summary"
fi

# --- llama.cpp -------------------------------------------------------------------------
peers_build=$root/build-peers
build_peers() {
    local src=$peers_build/src tarball=${PEERS_SRC:-$deps/llama.cpp-src.tar.gz}
    if [ ! -f "$src/CMakeLists.txt" ]; then
        [ -f "$tarball" ] || { echo "no llama.cpp source at $tarball (scripts/bench-gpu.sh --pack DIR)"; return 1; }
        mkdir -p "$src" && tar -xzf "$tarball" -C "$src" || return 1
    fi
    cat "$src/PEER_VERSION" 2>/dev/null
    local gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    cmake -S "$src" -B "$peers_build/cuda" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON &&
        cmake --build "$peers_build/cuda" -j "$(nproc)" --target llama-bench llama-batched-bench
}
if has peers; then
    if [ -x "$peers_build/cuda/bin/llama-bench" ] || phase peers-build build_peers; then
        lb=$peers_build/cuda/bin
        phase peers-bench "$lb/llama-bench" -m "$bench_list" -ngl 99 -fa 1 -p 512,4096 -n 128 \
            -r "$reps" -o md
        { echo; echo "### llama.cpp (same files)"; echo; grep '^|' "$tmp/peers-bench.txt"; } >>"$summary"
        if [ -x "$lb/llama-batched-bench" ]; then
            : >"$tmp/peers-batched.txt"
            for f in "${bench_files[@]}"; do
                # M sequences of a 16-token prompt and 128 new tokens each, as smol-bench
                # --batched M; the cache holds 128 x 144 tokens.
                "$lb/llama-batched-bench" -m "$f" -ngl 99 -fa on -c 20480 -b 2048 -ub 512 \
                    -npp 16 -ntg 128 -npl 1,8,32,128 >>"$tmp/peers-batched.txt" 2>&1
            done
            cat "$tmp/peers-batched.txt" >>"$all_log"
            { echo; echo "### llama-batched-bench"; echo; grep '^|' "$tmp/peers-batched.txt"; } >>"$summary"
        fi
    fi
fi

# --- HF transformers ---------------------------------------------------------------------
hf_bench() {
    local f
    f=$(model_path 1.7B f16)
    [ -s "$f" ] || { echo "no $f (run the models phase)"; return 1; }
    python3 - "$f" <<'EOF'
import os, sys, time
import torch
from transformers import AutoModelForCausalLM
path = sys.argv[1]
t0 = time.time()
model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                             torch_dtype=torch.float16).to("cuda:0").eval()
print(f"loaded {path} in {time.time() - t0:.1f} s (random weights)")
ids = torch.randint(0, 49152, (1, 512), device="cuda:0")
with torch.no_grad():
    model(ids); torch.cuda.synchronize()
    t0 = time.time(); model(ids); torch.cuda.synchronize()
    print(f"HF transformers pp512: {512 / (time.time() - t0):.1f} t/s")
    for batch in (1, 32):
        inp = torch.randint(0, 49152, (batch, 16), device="cuda:0")
        model.generate(inp, max_new_tokens=8, min_new_tokens=8, do_sample=False)
        torch.cuda.synchronize(); t0 = time.time()
        model.generate(inp, max_new_tokens=128, min_new_tokens=128, do_sample=False)
        torch.cuda.synchronize()
        print(f"HF transformers tg128 batch {batch}: {batch * 128 / (time.time() - t0):.1f} t/s")
EOF
}
if has hf; then
    phase hf hf_bench
    { echo; echo "### HF transformers (random 1.7B f16)"; echo; sed 's/^/    /' "$tmp/hf.txt"; } >>"$summary"
fi
rm -rf "$tmp"
log "done; $summary"
