#!/usr/bin/env bash
# GPU benchmarks in one command on the device machine: builds smol with CUDA,
# writes random-weight SmolLM2-360M and -1.7B files (and a random 135M) to
# /tmp, autotunes the matmul kernels, runs the table (pp512, pp4096, tg128,
# batched decode at M = 1, 8, 32, 128 with the kernel family each M used) on
# the real 135M Q4_1 and the random f16 files, measures the ceilings (device
# copy bandwidth, bf16 matmul rate, through torch), and with --peers builds
# llama.cpp's llama-bench and llama-batched-bench for sm_90 from carried
# source and runs them on the same files; with --serve it measures
# smol-server on the GPU with scripts/bench-serve.py (and llama.cpp's
# llama-server the same way when --peers is given too). $OUT (the device
# tool's output folder, else build-gpu/bench-logs) gets summary.md (the
# tables), log.txt (every phase's output), bench-smol.json,
# autotune-table.txt and, with --serve, serve.json (every bench-serve row).
#
# The real 135M file (94 MiB) is larger than what travels to the device; when
# models/ lacks it there, a random 135M q4_1 takes its row (named -random-)
# and the tokenizer comes from the vocabulary-only file that --pack writes.
#
#   scripts/bench-gpu.sh                      build, models, autotune, bench, ceilings
#   scripts/bench-gpu.sh --only PHASES        a comma list of: build, models, autotune,
#                                             serve-probe, serve, peers, bench, spec,
#                                             grammar, offload, capacity, split, ceilings,
#                                             hf (in this order)
#   scripts/bench-gpu.sh --split              add the layer-split phase: the 1.7B f16 shape
#                                             over two GPUs (cuda:0,cuda:0 on a machine of
#                                             one), capacity and decode against one GPU,
#                                             llama.cpp's -sm layer beside it
#   scripts/bench-gpu.sh --offload            add the long-context phase (per-head KV
#                                             placement under a 24 GiB budget, 1.7B f16)
#   scripts/bench-gpu.sh --capacity           add the capacity phase: each CAPACITY entry
#                                             (default 135M f16 at 1M tokens under 8 GiB, then
#                                             1.7B f16 at 512K under 24 GiB) fills its whole
#                                             context and decodes CAPACITY_GEN tokens (8) at
#                                             the end, with nvidia-smi's view of the process
#                                             sampled every second beside smol's own peak
#   scripts/bench-gpu.sh --peers              add the llama.cpp phase (needs its source)
#   scripts/bench-gpu.sh --serve              add the serving phase: smol-server --device
#                                             cuda:0 (and llama-server -ngl 99 -fa on with
#                                             --peers) on the 135M file, bench-serve.py at
#                                             concurrency 1,4,16,64, then greedy texts of
#                                             requests alone against the same run together;
#                                             serve-probe (with --only) first runs smol-server
#                                             alone through the levels twice, as it is and
#                                             under variants that leave one mechanism out,
#                                             and says which ended every request whole
#   scripts/bench-gpu.sh --hf                 add HF transformers on the random 1.7B f16
#   scripts/bench-gpu.sh --pack DIR           (here, before) put the build dependencies
#                                             and llama.cpp's trimmed source in DIR
#
# Phases are split so each fits a 10-minute call; build outputs (build-gpu,
# build-peers) stay on a warm machine between calls, the random models in
# /tmp/smol-random too. When the build phase runs with peers asked for, the
# llama.cpp build starts first, in the background (its own session, nice 10,
# log in build-peers/build.log) and the phases that need it wait for it.
# Environment: SMOL_GPU_DEPS=DIR (default .gpu-deps when it exists): packed
# CMake packages, the gguf wheel and llama.cpp-src.tar.gz; REPS (default 3);
# MODELS_1_7B=0 leaves the 1.7B out; MODELS="135M:f16,1.7B:q4_k_m" writes
# and benches only those (beside the real 135M; gemma3-270m is Gemma 3
# 270M's shape); DEADLINE=EPOCH-SECONDS: phases that would not end before it are
# skipped and say so (a 10-minute call).
# Serving: SERVE_TOKENS (generated tokens per request, a comma list; default
# 128), SERVE_RUNS (runs of each server, alternating; default 2),
# SERVE_CONCURRENCY (default 1,4,16,64), SERVE_PARALLEL (requests generating
# at once in each server; default 32), SERVE_CTX (KV cells; default 8192),
# SERVE_DEVICE (smol-server's --device; default cuda:0), SERVE_PROCESSES
# (bench-serve.py's client processes; default 4), SERVE_PICK=1 (the
# table takes the first variant serve-probe found whole, when smol-server as
# it is was not); PEERS_BIN (where the llama.cpp programs are; default
# build-peers/cuda/bin).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1

phases="build,models,autotune,bench,ceilings"
while [ $# -gt 0 ]; do
    case "$1" in
        --only) phases=$2; shift ;;
        --peers) phases="$phases,peers" ;;
        --offload) phases="$phases,offload" ;;
        --capacity) phases="$phases,capacity" ;;
        --split) phases="$phases,split" ;;
        --hf) phases="$phases,hf" ;;
        --serve) phases="$phases,serve" ;;
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
        -h|--help) sed -n '2,/^[^#]/{/^#/p}' "$0"; exit 0 ;;
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
# Runs a phase's command (in a subshell) with its output appended to log.txt
# as it comes and kept in a scratch file $tmp/NAME.txt for the summary,
# timing it.
tmp=$(mktemp -d)
phase() {
    local name=$1; shift
    local t0
    t0=$(date +%s)
    log "$name"
    ("$@") 2>&1 | tee "$tmp/$name.txt" >>"$all_log"
    local rc=$?
    log "$name: exit $rc after $(($(date +%s) - t0)) s"
    return $rc
}

# True when a phase of about $1 seconds ends before DEADLINE; else says so.
time_for() {
    [ -z "${DEADLINE:-}" ] && return 0
    local left=$((DEADLINE - $(date +%s)))
    [ "$left" -ge "$1" ] && return 0
    log "$2: skipped, $left s left before DEADLINE and it takes about $1 s"
    return 1
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
    local prefix=() nccl_root
    [ -n "$deps" ] && prefix=(-DCMAKE_PREFIX_PATH="$(cd "$deps" && pwd)")
    # NCCL for a head split over GPUs: the toolkit's, else the PyPI wheel's.
    nccl_root=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
    [ -n "$nccl_root" ] && prefix+=(-DSMOL_NCCL_ROOT="$nccl_root")
    local gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DSMOL_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-90}" -DSMOL_BUILD_TESTS=OFF \
        "${prefix[@]}" || return 1
    # smol-server exists as a target when cpp-httplib was found.
    local targets=(smol-bench smol-quantize)
    [ -d "$build/examples/CMakeFiles/smol-server.dir" ] && targets+=(smol-server)
    cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
}
# --- llama.cpp: the build ------------------------------------------------------------------
peers_build=$root/build-peers
peers_bin=${PEERS_BIN:-$peers_build/cuda/bin}
build_peers() {
    local src=$peers_build/src tarball=${PEERS_SRC:-$deps/llama.cpp-src.tar.gz}
    if [ ! -f "$src/CMakeLists.txt" ]; then
        [ -f "$tarball" ] || { echo "no llama.cpp source at $tarball (scripts/bench-gpu.sh --pack DIR)"; return 1; }
        mkdir -p "$src" && tar -xzf "$tarball" -C "$src" || return 1
    fi
    cat "$src/PEER_VERSION" 2>/dev/null
    local gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    # llama-server without its web UI (no assets to fetch offline).
    cmake -S "$src" -B "$peers_build/cuda" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON &&
        cmake --build "$peers_build/cuda" -j "$(nproc)" \
            --target llama-bench llama-batched-bench llama-server
}
peers_built() {
    local t
    for t in llama-bench llama-batched-bench llama-server; do
        [ -x "$peers_bin/$t" ] || return 1
    done
}
# The llama.cpp build in a session of its own (it outlives a device call that
# ends first); build.rc holds its exit status when it is done.
start_peers_build() {
    peers_built && return 0
    if [ -s "$peers_build/build.pid" ] && [ ! -f "$peers_build/build.rc" ] &&
        kill -0 "$(cat "$peers_build/build.pid")" 2>/dev/null; then
        return 0
    fi
    mkdir -p "$peers_build"
    rm -f "$peers_build/build.rc" "$peers_build/build.pid"
    export peers_build deps
    export -f build_peers
    local session=(setsid)
    command -v setsid >/dev/null || session=()
    # shellcheck disable=SC2016 # expanded by the inner shell
    "${session[@]}" nice -n 10 bash -c 'echo $$ >"$peers_build/build.pid"
        build_peers >"$peers_build/build.log" 2>&1; echo $? >"$peers_build/build.rc"' \
        </dev/null >/dev/null 2>&1 &
    echo "llama.cpp build started in the background (log $peers_build/build.log)"
}
# Waits for that build until DEADLINE less $1 seconds; true when it is built.
wait_peers_build() {
    local reserve=${1:-0} t0
    t0=$(date +%s)
    while ! peers_built; do
        if [ -f "$peers_build/build.rc" ] ||
            ! kill -0 "$(cat "$peers_build/build.pid" 2>/dev/null)" 2>/dev/null; then
            echo "llama.cpp build ended with exit $(cat "$peers_build/build.rc" 2>/dev/null)"
            tail -30 "$peers_build/build.log" 2>/dev/null
            return 1
        fi
        if [ -n "${DEADLINE:-}" ] && [ "$(date +%s)" -ge $((DEADLINE - reserve)) ]; then
            echo "llama.cpp build still running after $(($(date +%s) - t0)) s of waiting"
            tail -3 "$peers_build/build.log" 2>/dev/null
            return 1
        fi
        sleep 5
    done
    echo "llama.cpp is built (waited $(($(date +%s) - t0)) s)"
}
peers_log_done=0
peers_log() {
    if [ "$peers_log_done" = 0 ] && [ -f "$peers_build/build.log" ]; then
        { echo "== llama.cpp build log"; cat "$peers_build/build.log"; } >>"$all_log"
        grep -E '^(llama-cpp-python|-- Using CUDA)' "$peers_build/build.log" >>"$summary"
        peers_log_done=1
    fi
}

if has build && has peers; then
    start_peers_build | tee -a "$summary"
fi
if has build; then
    phase build build_smol || { tail -30 "$tmp/build.txt"; exit 1; }
fi
bench=$build/examples/smol-bench
quantize=$build/examples/smol-quantize

# --- random models ---------------------------------------------------------------
want_models=("135M f16" "360M f16" "360M q8_0" "1.7B f16" "1.7B q8_0")
[ "${MODELS_1_7B:-1}" = 0 ] && want_models=("135M f16" "360M f16" "360M q8_0")
if [ -n "${MODELS:-}" ]; then
    IFS=, read -ra picked <<<"$MODELS"
    want_models=()
    for m in "${picked[@]}"; do want_models+=("${m/:/ }"); done
fi
vocab=$real
if [ ! -s "$real" ]; then
    vocab=$deps/smollm2-vocab.gguf
    real=$models/smollm2-135M-random-q4_1.gguf
    want_models=("135M q4_1" "${want_models[@]}")
fi
# SmolLM2's shapes take its tokenizer; Gemma 3's shape keeps its own
# vocabulary size (a made-up vocabulary of that many tokens).
model_path() {
    case $1 in
        gemma*) echo "$models/$1-random-$2.gguf" ;;
        *) echo "$models/smollm2-$1-random-$2.gguf" ;;
    esac
}
write_models() {
    mkdir -p "$models"
    df -h "$models" | tail -1
    for m in "${want_models[@]}"; do
        set -- $m
        local f
        f=$(model_path "$1" "$2")
        if [ -s "$f" ]; then echo "$f exists"; continue; fi
        local from=(--vocab-from "$vocab")
        case $1 in gemma*) from=() ;; esac
        "$quantize" --random "$1" --type "$2" "${from[@]}" -t "$(nproc)" "$f" | tail -3 || return 1
    done
    ls -la "$models"
}
if has models; then
    phase models write_models || exit 1
fi
bench_files=("$real")
if [ -n "${MODELS:-}" ]; then
    # The files asked for are the ones benched (and tuned), in their order.
    for m in "${want_models[@]}"; do
        set -- $m
        f=$(model_path "$1" "$2")
        [ -s "$f" ] && [ "$f" != "$real" ] && bench_files+=("$f")
    done
    all_files=("${bench_files[@]}")
else
    for m in "135M f16" "360M f16" "1.7B f16"; do
        set -- $m
        [ -s "$(model_path "$1" "$2")" ] && bench_files+=("$(model_path "$1" "$2")")
    done
    all_files=("${bench_files[@]}")
    for m in "360M q8_0" "1.7B q8_0"; do
        set -- $m
        [ -s "$(model_path "$1" "$2")" ] && all_files+=("$(model_path "$1" "$2")")
    done
fi
list=$(IFS=,; echo "${all_files[*]}")
bench_list=$(IFS=,; echo "${bench_files[*]}")

# --- autotune ------------------------------------------------------------------
if has autotune; then
    phase autotune "$bench" --device cuda:0 --autotune -p 0 -n 0 -m "$list"
    cp "$SMOL_AUTOTUNE_FILE" "$out/autotune-table.txt" 2>/dev/null
    grep -c -v '^#' "$SMOL_AUTOTUNE_FILE" 2>/dev/null | sed 's/^/autotune table lines: /' >>"$summary"
fi

# --- serving ---------------------------------------------------------------------------
# smol-server on the GPU, and llama-server when llama.cpp is built, each with
# SERVE_PARALLEL requests generating at once and SERVE_CTX KV cells, both up
# at once on their own ports (an idle server does no work); bench-serve.py
# measures them in turn, SERVE_RUNS times each, alternating. Then the greedy
# texts of four requests alone and among 28 others at once.
serve_pids=()
start_server() {
    local name=$1 port=$2
    shift 2
    "$@" >"$tmp/server-$name.txt" 2>&1 &
    local pid=$!
    serve_pids+=("$pid")
    if python3 - "$port" "$pid" 180 <<'EOF'; then
import os, sys, time, urllib.request
port, pid, limit = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
t0 = time.time()
while time.time() - t0 < limit:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(f"the server (pid {pid}) exited")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            if r.status == 200:
                print(f"up on port {port} after {time.time() - t0:.1f} s")
                sys.exit(0)
    except Exception:
        pass
    time.sleep(0.25)
sys.exit(f"no /health on port {port} after {limit:.0f} s")
EOF
        return 0
    fi
    echo "$name: the server did not come up; its output:"
    tail -40 "$tmp/server-$name.txt"
    return 1
}
stop_servers() {
    local pid i
    for pid in "${serve_pids[@]}"; do kill "$pid" 2>/dev/null; done
    for pid in "${serve_pids[@]}"; do
        for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    serve_pids=()
}
# Greedy texts of four requests sent one at a time, then the same four among
# 28 other requests at once: the same text or not, per server.
same_text_check() {
    python3 - "$@" <<'EOF'
import concurrent.futures, http.client, json, sys
def model_id(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/v1/models")
    return json.loads(c.getresponse().read())["data"][0]["id"]
def complete(port, prompt, n):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    body = {"model": model_id(port), "prompt": prompt, "max_tokens": n, "temperature": 0,
            "ignore_eos": True}
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = json.loads(r.read())
    c.close()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {data}")
    return data["choices"][0]["text"]
for arg in sys.argv[1:]:
    name, port = arg.split(":")
    port = int(port)
    probes = [f"Probe {i}: the {w} of the old house was" for i, w in
              enumerate(["door", "window", "garden", "roof"])]
    others = [f"Filler {i}: a list of {i + 3} things found in a drawer:" for i in range(28)]
    alone = [complete(port, p, 64) for p in probes]
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        futs = [pool.submit(complete, port, p, 64) for p in probes + others]
        together = [f.result() for f in futs][:4]
    same = sum(a == b for a, b in zip(alone, together))
    print(f"{name}: {same} of 4 greedy texts (64 tokens) the same alone and sent with 28 others")
    for i, (a, b) in enumerate(zip(alone, together)):
        if a != b:
            k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
            print(f"  probe {i}: differ from character {k} of {len(a)}: "
                  f"alone {a[k:k + 40]!r} / together {b[k:k + 40]!r}")
EOF
}
# smol-server's command line in cmd, under a variant: as-is, NAME=VALUE (an
# environment variable) or --option[=value] (one more option, the last word).
smol_cmd() {
    local v=$1 port=$2 pre=(env) post=() ctx=${SERVE_CTX:-8192}
    case "$v" in
        --ctx-size=*) ctx=${v#--ctx-size=} ;;
        --*) post+=("$v") ;;
        *=*) pre+=("$v") ;;
    esac
    cmd=("${pre[@]}" "$build/examples/smol-server" -m "$real" --device "${SERVE_DEVICE:-cuda:0}"
        --port "$port" --parallel "${SERVE_PARALLEL:-32}" --max-queue 64 -c "$ctx" "${post[@]}")
}
engine_counters() {
    python3 - "$1" <<'EOF'
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
keep = ("smol_requests_finished_total", "smol_preemptions_total", "smol_kv_cells_used",
        "smol_prefix_cache_hit_requests_total", "smol_http_errors_total", "smol_engine_steps_total")
print("   ", ", ".join(l for l in text.splitlines() if l.split(" ")[0] in keep))
EOF
}
# smol-server alone, through the levels twice at 32 tokens a request (the
# prefix cache fills on the way), as it is and under variants that leave out
# one mechanism each; says which ended every request whole. Not timed: it
# may run beside the llama.cpp build.
serve_probe() {
    local v r fails short
    : >"$tmp/probe-clean.txt"
    for v in as-is SMOL_CUDA_GRAPHS=0 SMOL_ATTN=classic SMOL_CUDA_FUSE=0 --no-prefix-cache \
        --ctx-size=65536; do
        echo "-- probe: smol-server $v"
        smol_cmd "$v" 18500
        start_server probe 18500 "${cmd[@]}" || { stop_servers; continue; }
        : >"$tmp/probe-run.txt"
        for r in 1 2; do
            python3 "$root/scripts/bench-serve.py" --port 18500 --max-tokens 32 \
                --concurrency "${SERVE_CONCURRENCY:-1,4,16,64}" 2>&1 | tee -a "$tmp/probe-run.txt"
            engine_counters 18500
        done
        stop_servers
        fails=$(grep -c 'failed:' "$tmp/server-probe.txt")
        short=$(grep -c 'ended short' "$tmp/probe-run.txt")
        echo "   $v: $fails requests failed, $short levels with requests short of their tokens"
        grep -m4 'failed:' "$tmp/server-probe.txt" | cut -c1-400
        grep -m3 -B1 'Error\|error' "$tmp/server-probe.txt" | grep -v 'failed:' | cut -c1-300
        [ "$fails" = 0 ] && [ "$short" = 0 ] && echo "$v" >>"$tmp/probe-clean.txt"
    done
    echo "variants that ended every request whole: $(tr '\n' ' ' <"$tmp/probe-clean.txt")"
}
serve_bench() {
    local conc=${SERVE_CONCURRENCY:-1,4,16,64} par=${SERVE_PARALLEL:-32} ctx=${SERVE_CTX:-8192}
    local names=(smol) ports=(18500)
    smol_cmd "${smol_variant:-as-is}" 18500
    start_server smol 18500 "${cmd[@]}" || { stop_servers; return 1; }
    if [ "$serve_peer" = 1 ]; then
        if start_server llama.cpp 18600 "$peers_bin/llama-server" -m "$real" --port 18600 \
            -ngl 99 -fa on -np "$par" -c "$ctx"; then
            names+=(llama.cpp)
            ports+=(18600)
        fi
    fi
    local t r i rc=0 first=0
    for t in ${SERVE_TOKENS//,/ }; do
        for r in $(seq "${SERVE_RUNS:-2}"); do
            # Prompts of their own in each run (no prefix reuse across runs);
            # the two servers get the same ones.
            first=$((first + 1000))
            for i in "${!names[@]}"; do
                echo "-- ${names[$i]}, $t tokens per request, run $r"
                python3 "$root/scripts/bench-serve.py" --port "${ports[$i]}" --concurrency "$conc" \
                    --max-tokens "$t" --label "${names[$i]} t$t r$r" --first-request "$first" \
                    --processes "${SERVE_PROCESSES:-4}" \
                    --json "$tmp/serve-${names[$i]}-t$t-r$r.json" || rc=1
            done
        done
    done
    local args=()
    for i in "${!names[@]}"; do args+=("${names[$i]}:${ports[$i]}"); done
    same_text_check "${args[@]}" || rc=1
    stop_servers
    return $rc
}
serve_table() {
    python3 - "$out/serve.json" "$tmp"/serve-*.json <<'EOF'
import collections, json, sys
rows = []
for f in sys.argv[2:]:
    rows += json.load(open(f))
json.dump(rows, open(sys.argv[1], "w"), indent=1)
by = collections.defaultdict(list)  # (server, tokens, concurrency) -> rows by run
for row in rows:
    server, t, r = row["label"].split()
    by[server, int(t[1:]), row["concurrency"]].append((int(r[1:]), row))
for t in sorted({k[1] for k in by}):
    print(f"\n{t} tokens per request; tok/s of each run; latency and TTFT of run 1\n")
    print("| concurrency | requests | smol tok/s | llama.cpp tok/s | smol / llama.cpp "
          "| smol latency p50 / p99 s | llama.cpp latency p50 / p99 s "
          "| smol TTFT p50 s | llama.cpp TTFT p50 s |")
    print("| ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: |")
    for c in sorted({k[2] for k in by if k[1] == t}):
        s = [x for _, x in sorted(by["smol", t, c])]
        l = [x for _, x in sorted(by["llama.cpp", t, c])]
        ratio = (" %.2f" % (sum(a["tok_s"] / b["tok_s"] for a, b in zip(s, l)) / len(l))
                 if s and l else " -")
        # * : some request of that run ended short of its tokens (or failed)
        tok = lambda xs: " / ".join(f"{x['tok_s']:.1f}" + ("*" if x.get("short") else "")
                                    for x in xs) or "-"
        lat = lambda xs: f"{xs[0]['latency_s'][0]:.3f} / {xs[0]['latency_s'][2]:.3f}" if xs else "-"
        ttft = lambda xs: f"{xs[0]['ttft_s'][0]:.3f}" if xs else "-"
        print(f"| {c} | {(s or l)[0]['requests']} | {tok(s)} | {tok(l)} |{ratio} | {lat(s)} "
              f"| {lat(l)} | {ttft(s)} | {ttft(l)} |")
EOF
}
if has serve; then
    serve_peer=0
    smol_variant=as-is
    if has serve-probe && [ -x "$build/examples/smol-server" ]; then
        { echo; echo "### smol-server probe"; echo; } >>"$summary"
        phase serve-probe serve_probe
        grep -E '^(--|   |variants)' "$tmp/serve-probe.txt" >>"$summary"
        # SERVE_PICK=1: the table takes the first variant that ended every
        # request whole, when smol-server as it is did not.
        if [ "${SERVE_PICK:-0}" = 1 ] && [ -s "$tmp/probe-clean.txt" ]; then
            smol_variant=$(head -1 "$tmp/probe-clean.txt")
        fi
    fi
    if has peers; then
        # The llama.cpp build must leave the cores before anything is timed.
        phase peers-wait wait_peers_build 150 && serve_peer=1
        cat "$tmp/peers-wait.txt" >>"$summary"
        peers_log
        [ "$serve_peer" = 0 ] && echo "llama-server is not built: smol-server alone" >>"$summary"
    fi
    if [ ! -x "$build/examples/smol-server" ]; then
        log "serve: no $build/examples/smol-server (cpp-httplib not found at configure time)"
    elif time_for 120 serve; then
        SERVE_TOKENS=${SERVE_TOKENS:-128}
        { echo; echo "### serving (SmolLM2-135M shape, $(basename "$real"); smol-server $smol_variant)"; echo; } >>"$summary"
        phase serve serve_bench
        grep -E '^(--|\||up on|[a-z.]+: [0-9] of 4|  probe|  \()' "$tmp/serve.txt" >>"$summary"
        for f in "$tmp"/server-*.txt; do { echo "== $f"; cat "$f"; } >>"$all_log"; done
        serve_table >>"$summary" 2>&1
    fi
fi

# --- llama.cpp ---------------------------------------------------------------------------
if has peers; then
    if ! peers_built && [ -s "$peers_build/build.pid" ]; then
        phase peers-wait2 wait_peers_build 120
    fi
    peers_log
    peers_ok=0
    if peers_built; then
        peers_ok=1
    elif [ -s "$peers_build/build.pid" ] && [ ! -f "$peers_build/build.rc" ] &&
        kill -0 "$(cat "$peers_build/build.pid")" 2>/dev/null; then
        log "peers: the llama.cpp build is still running; run --only peers again"
    elif time_for 400 peers-build && phase peers-build build_peers; then
        peers_ok=1
    fi
    if [ "$peers_ok" = 1 ]; then
        lb=$peers_bin
        if time_for 60 peers-bench; then
            phase peers-bench "$lb/llama-bench" -m "$bench_list" -ngl 99 -fa 1 -p 512,4096 -n 128 \
                -r "$reps" -o md
            { echo; echo "### llama.cpp (same files)"; echo; grep '^|' "$tmp/peers-bench.txt"; } >>"$summary"
        fi
        if time_for 60 peers-batched; then
            : >"$tmp/peers-batched.txt"
            for f in "${bench_files[@]}"; do
                # M sequences of a 16-token prompt and 128 new tokens each, as smol-bench
                # --batched M; the cache holds 128 x 144 tokens (smol stops at 64).
                "$lb/llama-batched-bench" -m "$f" -ngl 99 -fa on -c 20480 -b 2048 -ub 512 \
                    -npp 16 -ntg 128 -npl 1,8,32,64 >>"$tmp/peers-batched.txt" 2>&1
            done
            cat "$tmp/peers-batched.txt" >>"$all_log"
            { echo; echo "### llama-batched-bench"; echo; grep '^|' "$tmp/peers-batched.txt"; } >>"$summary"
        fi
    fi
fi

# --- smol's table ------------------------------------------------------------------
if has bench && time_for 120 bench-smol; then
    {
        echo
        echo "### smol (random-weight files say so in their names: *-random-*)"
        echo
    } >>"$summary"
    # The table on stdout, the JSON on stderr.
    bench_smol() {
        # At most 64 sequences share the cache's cells.
        "$bench" --device cuda:0 -m "$list" -p 512,4096 -n 128 --batched 1,8,32,64 \
            -r "$reps" -oe json -o md 2>"$out/bench-smol.json"
    }
    phase bench-smol bench_smol
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

# --- speculation and constrained decoding --------------------------------------------
# spec: the 1.7B shape (random f16) decoding through smol_spec: plain, n-gram
# lookup, a random 135M (f16) as its draft (random weights agree on nothing:
# its acceptance is not a real draft's) and the model as its own draft (every
# guess right: the upper bound), at 3 and 8 guesses a pass.
spec_bench() {
    local f17 f135
    f17=$(model_path 1.7B f16)
    f135=$(model_path 135M f16)
    [ -s "$f17" ] && [ -s "$f135" ] || { echo "no $f17 or $f135: run the models phase"; return 1; }
    local b=("$bench" --device cuda:0 -m "$f17" -p 0 -n 128 -r "$reps")
    "${b[@]}" || return 1
    local k
    for k in 3 8; do
        "${b[@]}" --lookup --draft-max "$k" &&
            "${b[@]}" --md "$f135" --draft-max "$k" &&
            "${b[@]}" --md "$f17" --draft-max "$k" || return 1
    done
}
if has spec && time_for 300 spec; then
    phase spec spec_bench
    grep '^| .*tg128' "$tmp/spec.txt" >>"$summary"
fi
# grammar: the 135M (the real file where it travelled, else random q4_1) at 1 and 32 requests
# through the engine and the library's batch, top-k 40, without and with
# examples/smol-bench/user-schema.json; the engine's rows end with its time
# a step by phase.
grammar_bench() {
    [ -s "$real" ] || { echo "no $real: run the models phase"; return 1; }
    local b=("$bench" --device cuda:0 -m "$real" -p 0 -n 128 -r "$reps" --sample --top-k 40
        --batched 32 --engine 1,32)
    "${b[@]}" && "${b[@]}" --json-schema "$root/examples/smol-bench/user-schema.json"
}
if has grammar && time_for 240 grammar; then
    phase grammar grammar_bench
    grep '^| .*tg128' "$tmp/grammar.txt" >>"$summary"
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

# --- capacity: whole contexts under a consumer card's budget -------------------------
capacity_bench() {
    local entry size type budget ctx gen=${CAPACITY_GEN:-8}
    IFS=, read -ra entries <<<"${CAPACITY:-135M:f16:8GiB:1048576,1.7B:f16:24GiB:524288}"
    for entry in "${entries[@]}"; do
        IFS=: read -r size type budget ctx <<<"$entry"
        local f
        f=$(model_path "$size" "$type")
        [ -s "$f" ] || { echo "no $f: run the models phase (MODELS=$size:$type)"; return 1; }
        echo "-- $size $type, $ctx tokens under $budget; host memory before:"
        free -g | sed -n 1,2p
        local smi=$tmp/smi-$size.txt
        : >"$smi"
        (while sleep 1; do
            nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits >>"$smi" 2>/dev/null
        done) &
        local sampler=$!
        "$bench" --device cuda:0 -m "$f" --gpu-mem "$budget" -b "${CAPACITY_BATCH:-4096}" \
            -p 0 -n "$gen" -d $((ctx - gen)) -r 1 --progress 2>&1
        local rc=$?
        kill "$sampler" 2>/dev/null
        wait "$sampler" 2>/dev/null
        # Every process nvidia-smi lists (its pids may be the host's, not
        # this machine's): smol-bench is the only one on the device machine.
        awk -F', *' -v b="$budget" 'm < $2 { m = $2 }
            END { printf "nvidia-smi: the process held at most %d MiB of device memory (budget %s)\n", m, b }' "$smi"
        [ $rc = 0 ] || return $rc
    done
}
if has capacity; then
    {
        echo
        echo "### capacity: whole contexts under a budget (random weights)"
        echo
    } >>"$summary"
    phase capacity capacity_bench
    grep -E '^\||^nvidia-smi|^--' "$tmp/capacity.txt" >>"$summary"
fi

# --- split: the layers over two GPUs --------------------------------------------------
# The 1.7B f16 shape with every head resident under 24 GiB a GPU: the most
# context one GPU holds (SPLIT_CTX, default 81920 tokens) against twice that
# on two; then decode at equal context on one GPU and on two, split by
# layers and (two GPUs, NCCL) by heads, and llama.cpp's -sm layer and row
# beside them when its build is there. With one GPU, cuda:0,cuda:0
# stands in for the pair (two backends of one GPU: the hand-off, not the
# capacity).
split_bench() {
    local f ctx=${SPLIT_CTX:-81920} devs=cuda:0,cuda:1 n_gpu
    f=$(model_path 1.7B f16)
    [ -s "$f" ] || { echo "no $f: run the models phase"; return 1; }
    n_gpu=$(nvidia-smi -L | wc -l)
    [ "$n_gpu" -ge 2 ] || { devs=cuda:0,cuda:0; echo "one GPU: $devs stands in for two"; }
    echo "-- capacity: one GPU at $ctx tokens, then $devs at $((2 * ctx)), every head resident"
    "$bench" --device cuda:0 -m "$f" --gpu-mem 24GiB --kv-offload none -p 0 -n 16 \
        -d $((ctx - 16)) -r 1 --progress 2>&1 || return 1
    "$bench" --device "$devs" -m "$f" --gpu-mem 24GiB --kv-offload none -p 0 -n 16 \
        -d $((2 * ctx - 16)) -r 1 --progress 2>&1 || return 1
    echo "-- equal context: one GPU, then $devs by layers, then by heads"
    "$bench" --device cuda:0 -m "$f" -p 512 -n 128 -d 4096 -r "$reps" 2>&1 || return 1
    "$bench" --device "$devs" -m "$f" -p 512 -n 128 -d 4096 -r "$reps" 2>&1 || return 1
    [ "$n_gpu" -ge 2 ] && { "$bench" --device "$devs" --split head -m "$f" -p 512 -n 128 -d 4096 \
        -r "$reps" 2>&1 || return 1; }
    if [ "$n_gpu" -ge 2 ] && peers_built; then
        echo "-- llama.cpp, one GPU then two (-sm layer)"
        CUDA_VISIBLE_DEVICES=0 "$peers_bin/llama-bench" -m "$f" -ngl 99 -fa 1 -p 512 -n 128 \
            -d 4096 -r "$reps" -o md 2>&1
        "$peers_bin/llama-bench" -m "$f" -ngl 99 -fa 1 -sm layer,row -p 512 -n 128 -d 4096 \
            -r "$reps" -o md 2>&1
    fi
}
if has split && time_for 400 split; then
    {
        echo
        echo "### the layers split over GPUs, SmolLM2-1.7B shape (random f16)"
        echo
    } >>"$summary"
    phase split split_bench
    grep -E '^\||^--|stands in' "$tmp/split.txt" >>"$summary"
fi

# --- ceilings ----------------------------------------------------------------------
ceilings() {
    python3 "$root/scripts/torch-peers.py" ceilings
}
if has ceilings; then
    phase ceilings ceilings
    { echo; echo "### ceilings"; echo; sed 's/^/    /' "$tmp/ceilings.txt"; } >>"$summary"
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
