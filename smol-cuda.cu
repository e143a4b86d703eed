// smol-cuda.cu - the GPU backend's entry: make_cuda_backend, the backend's
// construction (device properties, streams, events, cuBLAS) and teardown,
// and its run of a graph: prepare or take again the last plan, stage the
// inputs, then launch the steps (in the copy program's order across the
// compute and copy streams where the graph moves KV, with the host's
// attention as host functions on a stream of its own) or replay them as a
// captured graph. The backend is a device memory under an optional limit
// (smol-cuda-memory.cu), the plan of a graph with the decode step's small
// ops fused (smol-cuda-steps.cu), CUDA graphs (smol-cuda-graphs.cu), the
// matmul choice and its autotune (smol-cuda-autotune.cu) and the kernels:
// small ops (smol-cuda-ops.cu), GEMV and small batches (smol-cuda-gemv.cu),
// cuBLAS (smol-cuda-blas.cu), attention (smol-cuda-attn.cu,
// smol-cuda-fattn.cu). smol-hip.cpp builds the same sources for ROCm with
// smol-hip.h mapping the names; that build has no BLAS.

#include "smol-cuda.cuh"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <tuple>

namespace smol::gpu {

cuda_backend::cuda_backend(int device, const backend_options & options)
    : device_(device), name_("cuda:" + std::to_string(device)) {
    activate();
    SMOL_GPU_CHECK(cudaDeviceGetAttribute(&n_sm_, cudaDevAttrMultiProcessorCount, device_));
    int l2 = 0;
    SMOL_GPU_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device_));
    l2_bytes_ = size_t(std::max(l2, 0));
    cudaDeviceProp prop{};
    SMOL_GPU_CHECK(cudaGetDeviceProperties(&prop, device_));
    gpu_name_ = prop.name;
    table_path_ =
        options.autotune_file.empty() ? default_table_path(gpu_name_) : options.autotune_file;
    load_table();
    fuse_ = options.fuse;
    attn_ = options.attn;
#if defined(SMOL_HIP)
    graphs_ = false; // not yet tried on ROCm
#else
    graphs_ = options.graphs;
    // Only where the kernels were compiled with the waits (sm_90 and up):
    // code JIT-compiled from older PTX has none.
    const int ptx = gemv_ptx_version();
    pdl_ = prop.major >= 9 && ptx >= 90 && options.pdl;
#endif
#if defined(SMOL_FLASH_ATTENTION)
    // The decode kernel's block slots (see decode_block_slots).
    dec_slots_ = decode_block_slots(n_sm_);
#endif
    SMOL_GPU_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    SMOL_GPU_CHECK(cudaStreamCreateWithFlags(&h2d_, cudaStreamNonBlocking));
    SMOL_GPU_CHECK(cudaStreamCreateWithFlags(&d2h_, cudaStreamNonBlocking));
    SMOL_GPU_CHECK(cudaStreamCreateWithFlags(&host_stream_, cudaStreamNonBlocking));
    host_threads_ = std::max(1, options.host_threads);
    SMOL_GPU_CHECK(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming));
    SMOL_GPU_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    for (cudaEvent_t & e : join_)
        SMOL_GPU_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    SMOL_GPU_CHECK(
        cudaEventCreateWithFlags(&host_done_, cudaEventDisableTiming | cudaEventBlockingSync));
    SMOL_GPU_CHECK(cudaEventRecord(staged_, stream_));
    // Attention's partial results for decode-sized batches need well under
    // this; having it from the start keeps the first decode from allocating.
    grow(work_, size_t(4) << 20, "work space");
    grow(done_, 4096 * sizeof(int), "attention counters");
    SMOL_GPU_CHECK(cudaMemsetAsync(done_.p, 0, done_.size, stream_));
#if defined(SMOL_HAVE_BLAS)
    SMOL_BLAS_CHECK(cublasCreate(&blas_));
    SMOL_BLAS_CHECK(cublasSetStream(blas_, stream_));
    // A workspace of our own keeps cuBLAS from allocating inside a graph
    // capture.
    grow(blas_ws_, size_t(32) << 20, "cuBLAS workspace");
    SMOL_BLAS_CHECK(cublasSetWorkspace(blas_, blas_ws_.p, blas_ws_.size));
#endif
}

cuda_backend::~cuda_backend() {
    // Errors here cannot be reported; free what can be freed.
    (void)cudaSetDevice(device_);
    if (stream_) (void)cudaStreamSynchronize(stream_);
#if defined(SMOL_NCCL)
    if (nccl_) (void)ncclCommDestroy(nccl_);
#endif
    for (auto & c : execs_) (void)cudaGraphExecDestroy(c.exec);
#if defined(SMOL_HAVE_BLAS)
    if (blas_) cublasDestroy(blas_);
    (void)cudaFree(blas_ws_.p);
#endif
    for (buffer * b :
         {&arena_, &work_, &dyn_, &cells_, &rope_, &done_, &tune_w_, &tune_x_, &tune_y_})
        (void)cudaFree(b->p);
    if (host_stage_) (void)cudaFreeHost(host_stage_);
    // Device blocks their callers did not release (a context whose making
    // failed halfway).
    for (const auto & [p, n] : sizes_) (void)cudaFree(p);
    for (const auto & [p, h] : host_) { // host blocks their callers did not release
        if (h.second)
            (void)cudaFreeHost(p);
        else
            std::free(p);
    }
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
    for (cudaEvent_t e : {staged_, fork_, join_[0], join_[1], join_[2], host_done_})
        if (e) (void)cudaEventDestroy(e);
    for (cudaStream_t st : {h2d_, d2h_, host_stream_, stream_})
        if (st) (void)cudaStreamDestroy(st);
}

void cuda_backend::reserve(graph & g) {
    activate();
    prepare(g);
    // The staging block of the largest batch this graph stands for.
    int64_t n_tok = 0;
    size_t host_bytes = 256;
    std::vector<const tensor *> leaves;
    for (tensor * t : g.nodes()) {
        n_tok = std::max(n_tok, t->ne[1]);
        for (tensor * s : t->src) {
            if (s && s->kind == OP_NONE && s->where == placement::host &&
                std::find(leaves.begin(), leaves.end(), s) == leaves.end()) {
                leaves.push_back(s);
                host_bytes += align_up(s->nbytes(), 256);
            }
        }
    }
    host_bytes += 4 * align_up(size_t(n_tok) * sizeof(int32_t), 256);
    grow(dyn_, host_bytes, "input staging");
    grow_host(host_bytes + (g.batch.kv ? cell_table_bytes(g.batch.kv->n_cells) : 0) +
              (g.batch.local ? cell_table_bytes(g.batch.local->kv->n_cells) : 0));
}

void cuda_backend::run(graph & g) {
    activate();
    const bool apart = seqs_apart(g.batch);
    const bool again = last_.again(g) && prepared_ && ran_apart_ == apart;
    last_.forget();
    if (again) {
        // The graph of the last run, as that run left it: the structure its
        // steps were made for, its nodes at their arena addresses.
        sig_ = prep_sig_;
    } else {
        if (g.rerun) {
            // Not taken again (its batch's sequences came apart or together,
            // or the steps were remade): its nodes go back to how they were
            // built, without the arena addresses a run gave them.
            const uint8_t * a = static_cast<const uint8_t *>(arena_.p);
            for (tensor * t : g.nodes()) {
                const uint8_t * d = static_cast<const uint8_t *>(t->data);
                if (a && d >= a && d < a + arena_.size) t->data = nullptr;
            }
        }
        structure(g);
        prepare(g);
        make_schedule(g, sched_);
        prep_sig_ = sig_;
        prepared_ = true;
    }
    auto ran_well = [&] {
        last_.ended(g);
        ran_apart_ = apart;
    };
    stage(g);
    // Events are made here, never while a stream is being captured.
    while (events_.size() < size_t(sched_.n_events)) {
        cudaEvent_t e = nullptr;
        SMOL_GPU_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        events_.push_back(e);
    }
    try {
        bool capture = false;
        bool capturable = graphs_;
        // Decode steps only (up to 32 tokens, whichever kernels their
        // matmuls take, or a token of each of up to 64 sequences): a
        // prompt's graph is dominated by its matmuls, and capturing it
        // costs more than its launches. Copies from pageable memory cannot
        // be captured.
        for (const tensor * t : g.nodes()) {
            capturable =
                capturable && (t->kind != OP_COPY || mem_.host_pageable == 0) &&
                (t->kind != OP_MUL_MAT || small_mm(t) || t->src[1]->ne[1] <= 32 || seqs_apart_);
        }
        if (capturable) {
            signature();
            for (captured & c : execs_) {
                if (c.sig == sig_) {
                    c.last_used = ++clock_;
                    replayed_ = int(&c - execs_.data());
                    host_batch_ = g.batch;
                    SMOL_GPU_CHECK(cudaGraphLaunch(c.exec, stream_));
                    prev_sig_.swap(sig_);
                    fail_if_injected();
                    finish_host_nodes();
                    restore_leaves();
                    ran_well();
                    return;
                }
            }
            // Capture the second time a graph comes: a decode step repeats,
            // a one-off prompt does not.
            capture = sig_ == prev_sig_;
        }
        if (!capture) {
            launch_all(g);
        } else {
            // Early launches only in captured decode steps: the copy program
            // orders kernels by events across streams too, and a prompt's
            // launches are few and long.
            cudaGraphExec_t exec =
                capture_graph(pdl_ && !sched_.has_side_work(), [&] { launch_all(g); });
            if (execs_.size() >= 4) {
                auto old = std::min_element(execs_.begin(), execs_.end(),
                                            [](const captured & a, const captured & b) {
                                                return a.last_used < b.last_used;
                                            });
                (void)cudaGraphExecDestroy(old->exec);
                execs_.erase(old);
            }
            execs_.push_back({sig_, exec, ++clock_, used_});
            SMOL_GPU_CHECK(cudaGraphLaunch(exec, stream_));
        }
        prev_sig_.swap(sig_);
        fail_if_injected();
        finish_host_nodes();
    } catch (...) {
        restore_leaves();
        throw;
    }
    restore_leaves();
    ran_well();
}

// --- the host stream ---------------------------------------------------------------

host_attention & cuda_backend::host() {
    if (!host_att_) host_att_ = std::make_unique<host_attention>(host_threads_);
    return *host_att_;
}

void CUDART_CB cuda_backend::run_host_job(void * job) {
    const host_job & j = *static_cast<const host_job *>(job);
    cuda_backend & be = *j.be;
    try {
        be.host().run(be.steps_[size_t(j.node)].t, be.host_batch_);
    } catch (const std::exception & e) {
        std::lock_guard<std::mutex> lock(be.host_mu_);
        if (be.host_error_.empty()) be.host_error_ = e.what();
    }
}

void cuda_backend::launch_host_node(int32_t node) {
    while (host_jobs_.size() <= size_t(node))
        host_jobs_.push_back({this, int32_t(host_jobs_.size())});
    void * job = &host_jobs_[size_t(node)];
#if defined(SMOL_HIP)
    // The HIP runtime Debian ships exports no hipLaunchHostFunc; a stream
    // callback does the same where no step is captured (HIP's are not).
    SMOL_GPU_CHECK(hipStreamAddCallback(
        host_stream_, [](hipStream_t, hipError_t, void * j) { run_host_job(j); }, job, 0));
#else
    SMOL_GPU_CHECK(cudaLaunchHostFunc(host_stream_, run_host_job, job));
#endif
}

// A step with host nodes ends when they have run: they read the batch's
// host arrays, which the next step rewrites. A failed one fails the step.
void cuda_backend::finish_host_nodes() {
    if (sched_.prog[size_t(stream_id::host)].empty()) return;
    SMOL_GPU_CHECK(cudaEventRecord(host_done_, stream_));
    SMOL_GPU_CHECK(cudaEventSynchronize(host_done_));
    std::string e;
    {
        std::lock_guard<std::mutex> lock(host_mu_);
        e.swap(host_error_);
    }
    if (!e.empty()) throw error(SMOL_ERR_BACKEND, name_ + ": the host's attention failed: " + e);
}

// Pinned host-to-device copies of 64 MiB, the best of three, once per device
// in a process.
double cuda_backend::link_rate() {
    static std::mutex mu;
    static std::unordered_map<int, double> known;
    {
        std::lock_guard<std::mutex> lock(mu);
        if (auto it = known.find(device_); it != known.end()) return it->second;
    }
    activate();
    constexpr size_t n = size_t(64) << 20;
    void * h = nullptr;
    void * d = nullptr;
    double best = 0;
    if (cudaMallocHost(&h, n) == cudaSuccess && cudaMalloc(&d, n) == cudaSuccess) {
        std::memset(h, 0, n);
        for (int rep = 0; rep < 4; ++rep) {
            const auto t0 = std::chrono::steady_clock::now();
            SMOL_GPU_CHECK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, h2d_));
            SMOL_GPU_CHECK(cudaStreamSynchronize(h2d_));
            const double s =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (rep > 0) best = std::max(best, double(n) / s);
        }
    }
    (void)cudaGetLastError();
    if (d) (void)cudaFree(d);
    if (h) (void)cudaFreeHost(h);
    std::lock_guard<std::mutex> lock(mu);
    known[device_] = best;
    return best;
}

// The link alone, the host's attention alone, then both at once: 2 GiB of
// copies issued back to back while the host attends for as long as they
// run. Once per (device, shape, type, threads) in a process.
attend_rates cuda_backend::attend_speeds(int32_t head_dim, int32_t q_per_kv, smol_type t) {
    static std::mutex mu;
    static std::map<std::tuple<int, int32_t, int32_t, int, int>, attend_rates> known;
    const auto key = std::make_tuple(device_, head_dim, q_per_kv, int(t), host_threads_);
    {
        std::lock_guard<std::mutex> lock(mu);
        if (auto it = known.find(key); it != known.end()) return it->second;
    }
    attend_rates r;
    r.link = link_rate();
    r.host = host().measure(head_dim, q_per_kv, t);
    activate();
    constexpr size_t n = size_t(64) << 20;
    constexpr int n_copies = 32;
    void * h = nullptr;
    void * d = nullptr;
    cudaEvent_t e[2] = {nullptr, nullptr};
    if (cudaMallocHost(&h, n) == cudaSuccess && cudaMalloc(&d, n) == cudaSuccess &&
        cudaEventCreateWithFlags(&e[0], cudaEventDefault) == cudaSuccess &&
        cudaEventCreateWithFlags(&e[1], cudaEventDefault) == cudaSuccess) {
        std::memset(h, 0, n);
        SMOL_GPU_CHECK(cudaEventRecord(e[0], h2d_));
        for (int i = 0; i < n_copies; ++i)
            SMOL_GPU_CHECK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, h2d_));
        SMOL_GPU_CHECK(cudaEventRecord(e[1], h2d_));
        r.host_shared = host().measure(head_dim, q_per_kv, t,
                                       [&] { return cudaEventQuery(e[1]) == cudaErrorNotReady; });
        SMOL_GPU_CHECK(cudaEventSynchronize(e[1]));
        float ms = 0;
        SMOL_GPU_CHECK(cudaEventElapsedTime(&ms, e[0], e[1]));
        if (ms > 0) r.link_shared = double(n) * n_copies / (double(ms) / 1e3);
    }
    (void)cudaGetLastError();
    for (cudaEvent_t x : e)
        if (x) (void)cudaEventDestroy(x);
    if (d) (void)cudaFree(d);
    if (h) (void)cudaFreeHost(h);
    std::lock_guard<std::mutex> lock(mu);
    known[key] = r;
    return r;
}

// A test's kernel fault (smol-faults.h) as a failed kernel shows itself: the
// step's work was launched, and the error comes at the stream's sync.
void cuda_backend::fail_if_injected() {
    if (!faults::hit(faults::site::kernel)) return;
    SMOL_GPU_CHECK(cudaStreamSynchronize(stream_));
    throw error(SMOL_ERR_BACKEND, name_ + ": a kernel failed in this step (an injected fault)");
}

void cuda_backend::launch_all(graph & g) {
    used_.clear();
    replayed_ = -1;
    stored_ = nullptr;
    n_kept_ = 0;
    kept_end_ = 0;
    if (sched_.has_side_work()) {
        launch_program(g);
        return;
    }
    if (rope_key_ && rope_key_->ne[1] > 0) {
        rope_params r = rope_for(rope_key_);
        r.table = nullptr;
        launch_rope_table(r, unsigned(rope_key_->ne[1]), static_cast<float2 *>(rope_.p), stream_);
        check_launch("rope_table");
    }
    for (const step & s : steps_) {
        if (!s.skip) launch(s, g.batch);
    }
}

void cuda_backend::copy_on(const tensor * t, cudaStream_t st) {
    if (faults::hit(faults::site::copy)) {
        throw error(SMOL_ERR_BACKEND,
                    name_ + ": a copy failed: " + describe_node(t) + " (an injected fault)");
    }
    const copy_desc & c = t->copy;
    if (c.height == 0) {
        SMOL_GPU_CHECK(
            cudaMemcpyAsync(t->data, t->src[0]->data, t->src[0]->nbytes(), cudaMemcpyDefault, st));
        return;
    }
    SMOL_GPU_CHECK(cudaMemcpy2DAsync(static_cast<uint8_t *>(t->data) + c.offset, c.dpitch,
                                     static_cast<const uint8_t *>(t->src[0]->data) + c.offset,
                                     c.spitch, c.width, c.height, cudaMemcpyDefault, st));
}

// The schedule on four streams: instructions in issue order, each on its
// stream; events carry the dependencies across. The copy and host streams
// start after everything the compute stream was given before (the last
// step's readers of the slots), and the compute stream ends after them, so
// a step is whole when its compute stream is done (and captures as one
// graph).
void cuda_backend::launch_program(graph & g) {
    cudaStream_t streams[n_streams] = {stream_, h2d_, d2h_, host_stream_};
    host_batch_ = g.batch;
    SMOL_GPU_CHECK(cudaEventRecord(fork_, stream_));
    for (cudaStream_t st : {h2d_, d2h_, host_stream_})
        SMOL_GPU_CHECK(cudaStreamWaitEvent(st, fork_, 0));
    if (rope_key_ && rope_key_->ne[1] > 0) {
        rope_params r = rope_for(rope_key_);
        r.table = nullptr;
        launch_rope_table(r, unsigned(rope_key_->ne[1]), static_cast<float2 *>(rope_.p), stream_);
        check_launch("rope_table");
    }
    for (const auto & [st, idx] : sched_.issue) {
        const schedule::instr & in = sched_.prog[st][size_t(idx)];
        switch (in.what) {
        case schedule::kind::wait:
            SMOL_GPU_CHECK(cudaStreamWaitEvent(streams[st], events_[size_t(in.event)], 0));
            break;
        case schedule::kind::record:
            SMOL_GPU_CHECK(cudaEventRecord(events_[size_t(in.event)], streams[st]));
            break;
        case schedule::kind::run: {
            const step & s = steps_[size_t(in.node)];
            if (st == int(stream_id::host) && s.t->kind != OP_COPY) {
                launch_host_node(in.node);
            } else if (st != 0) {
                copy_on(s.t, streams[st]);
            } else if (!s.skip) {
                launch(s, g.batch);
            }
            break;
        }
        }
    }
    int j = 0;
    for (cudaStream_t st : {h2d_, d2h_, host_stream_}) {
        SMOL_GPU_CHECK(cudaEventRecord(join_[j], st));
        SMOL_GPU_CHECK(cudaStreamWaitEvent(stream_, join_[j++], 0));
    }
}

} // namespace smol::gpu

namespace smol {

std::unique_ptr<backend> make_cuda_backend(int device, const backend_options & options) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        throw error(SMOL_ERR_BACKEND,
                    std::string("no " SMOL_GPU_VENDOR " device is available (") +
                        (e != cudaSuccess ? cudaGetErrorString(e) : "none found") +
                        "); run on the CPU with device \"cpu\"");
    }
    if (device < 0 || device >= n) {
        throw error(SMOL_ERR_BACKEND, "cuda:" + std::to_string(device) +
                                          " does not exist: this machine has " + std::to_string(n) +
                                          " " SMOL_GPU_VENDOR " device(s)");
    }
    return std::make_unique<gpu::cuda_backend>(device, options);
}

void join_gpu_group(const std::vector<backend *> & ranks) {
#if defined(SMOL_NCCL)
    std::vector<gpu::cuda_backend *> gpus;
    std::vector<int> devices;
    for (backend * b : ranks) {
        auto * g = dynamic_cast<gpu::cuda_backend *>(b);
        if (!g) {
            throw error(SMOL_ERR_INVALID_ARGUMENT, std::string(b->name()) +
                                                       " is not a GPU: a head split over GPUs "
                                                       "all-reduces through NCCL, GPUs alone");
        }
        if (std::find(devices.begin(), devices.end(), g->device()) != devices.end()) {
            throw error(SMOL_ERR_INVALID_ARGUMENT,
                        std::string(g->name()) + " is listed twice: a head split gives each "
                                                 "GPU one share (NCCL joins a GPU once); list "
                                                 "each GPU once, or split by layers");
        }
        gpus.push_back(g);
        devices.push_back(g->device());
    }
    // NVLink multicast stays off (it can take a shared host's GPUs out of
    // service): before NCCL starts, whatever the environment says.
    ::setenv("NCCL_NVLS_ENABLE", "0", 1);
    std::vector<ncclComm_t> comms(gpus.size(), nullptr);
    const ncclResult_t r = ncclCommInitAll(comms.data(), int(comms.size()), devices.data());
    if (r != ncclSuccess) {
        throw error(SMOL_ERR_BACKEND, std::string("NCCL could not join the GPUs of the head "
                                                  "split: ") +
                                          ncclGetErrorString(r));
    }
    for (size_t i = 0; i < gpus.size(); ++i) gpus[i]->set_nccl(comms[i]);
#else
    (void)ranks;
    throw error(SMOL_ERR_UNSUPPORTED,
                "this smol was built without NCCL, which a head split over GPUs all-reduces "
                "through (configure with SMOL_NCCL_ROOT where nccl.h and libnccl are); split "
                "by layers (--split layer)");
#endif
}

void abort_gpu_group(const std::vector<backend *> & ranks) {
#if defined(SMOL_NCCL)
    for (backend * b : ranks) {
        if (auto * g = dynamic_cast<gpu::cuda_backend *>(b)) g->abort_nccl();
    }
#else
    (void)ranks;
#endif
}

} // namespace smol
