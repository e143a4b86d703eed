// smol-sim.c++ - the simulated device ("sim"): a second memory space under a
// byte limit, computed by the CPU's executor, its copy streams and its host
// stream (host attention) on threads of their own.

#include "smol-backend.h"
#include "smol-cpu.h"
#include "smol-faults.h"
#include "smol-graph.h"
#include "smol-host-attention.h"
#include "smol-host-memory.h"
#include "smol-log.h"
#include "smol-schedule.h"

#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

namespace smol {

namespace {

// A simulated device: its memory is host memory counted against a limit of
// its own (peak tracked), its kernels are the CPU's, and its two copy
// streams run on threads of their own, so the schedule's copies overlap its
// compute as they would on a GPU, and so does its host stream, whose nodes
// run on a thread pool of their own (the host's attention). Offloaded KV
// lives in a separate set of host allocations ("pinned").
class sim_backend final : public backend, public copy_engine {
  public:
    explicit sim_backend(int n_threads) : exec_(n_threads), n_threads_(n_threads) {
        for (int i = 0; i < 3; ++i) workers_[i] = std::thread([this, i] { stream_worker(i + 1); });
    }
    ~sim_backend() override {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        for (auto & w : workers_) w.join();
    }
    const char * name() const override { return "sim"; }
    placement where() const override { return placement::device; }
    bool supports_all_reduce() const override { return true; }
    bool reduces_in_process() const override { return true; }
    void * alloc(size_t bytes) override {
        mem_.check("sim device", bytes, "device memory");
        void * p = host_alloc(bytes, "simulated device memory");
        mem_.add(p, bytes);
        return p;
    }
    void release(void * p) override {
        mem_.remove(p);
        std::free(p);
    }
    void upload(void * dst, const void * src, size_t n) override { std::memcpy(dst, src, n); }
    void download(void * dst, const void * src, size_t n) override { std::memcpy(dst, src, n); }
    void memset(void * dst, int value, size_t n) override { std::memset(dst, value, n); }
    // Pinned, as a GPU's driver gives it, unless pinning is refused (a test's
    // fault stands in for a locked-memory limit): then pageable, said aloud.
    void * alloc_host(size_t bytes, bool & pinned, const char * what) override {
        pinned = !faults::hit(faults::site::host_pinned);
        if (!pinned) {
            log_warn("sim: cannot pin " + format_bytes(bytes) + " of host memory for " + what +
                     " (refused by an injected fault); using pageable memory, whose copies "
                     "are several times slower on a GPU");
        }
        return host_mem_.alloc(bytes, what, mem_.stats_, pinned);
    }
    void release_host(void * p) override { host_mem_.release(p, mem_.stats_); }
    void set_memory_limit(size_t bytes) override { mem_.stats_.limit = bytes; }
    memory_stats memory() const override { return mem_.stats_; }
    size_t compute_bytes(graph & g) override { return exec_.bytes_for(g); }
    // No link to measure (its copies are memcpy): auto streams everything
    // (attend_speeds measures nothing).
    // As the CUDA backend does: a graph its builder hands over again keeps
    // the plan and schedule of its last run.
    bool reruns_graphs() const override { return true; }
    void run(graph & g) override {
        const bool again = last_.again(g);
        last_.forget();
        if (!again) {
            exec_.plan(g);
            mem_.set_compute("sim device", exec_.held_bytes());
            make_schedule(g, sched_);
        }
        exec_.run(g, &sched_, this);
        last_.ended(g);
    }
    void reserve(graph & g) override {
        exec_.plan(g);
        mem_.set_compute("sim device", exec_.held_bytes());
    }

    void start(const graph & g, const schedule & s, event_set & ev) override {
        {
            std::lock_guard<std::mutex> lock(mu_);
            job_g_ = &g;
            job_s_ = &s;
            job_ev_ = &ev;
            pending_ = 3;
            copy_error_.clear();
            ++gen_;
        }
        cv_.notify_all();
    }
    void finish() override {
        std::unique_lock<std::mutex> lock(mu_);
        done_cv_.wait(lock, [&] { return pending_ == 0; });
        if (!copy_error_.empty()) throw error(SMOL_ERR_BACKEND, copy_error_);
    }

  private:
    // Stream st's instructions of each run, in order: copies, or the host's
    // nodes.
    void stream_worker(int st) {
        uint64_t seen = 0;
        for (;;) {
            const graph * g;
            const schedule * s;
            event_set * ev;
            {
                std::unique_lock<std::mutex> lock(mu_);
                cv_.wait(lock, [&] { return stop_ || gen_ != seen; });
                if (stop_) return;
                seen = gen_;
                g = job_g_;
                s = job_s_;
                ev = job_ev_;
            }
            // A failed copy ends its stream and the run's events, so that
            // no stream waits for it; finish() reports it.
            for (const schedule::instr & in : s->prog[st]) {
                bool go_on = true;
                switch (in.what) {
                case schedule::kind::wait:
                    go_on = ev->wait(in.event);
                    break;
                case schedule::kind::run: {
                    tensor * t = g->nodes()[size_t(in.node)];
                    if (st == int(stream_id::host) && t->kind != OP_COPY) {
                        try {
                            host().run(t, g->batch);
                        } catch (const std::exception & e) {
                            std::lock_guard<std::mutex> lock(mu_);
                            if (copy_error_.empty()) copy_error_ = std::string("sim: ") + e.what();
                            ev->fail();
                            go_on = false;
                        }
                    } else if (faults::hit(faults::site::copy)) {
                        std::lock_guard<std::mutex> lock(mu_);
                        if (copy_error_.empty()) {
                            copy_error_ =
                                "sim: a copy failed: " + describe_node(t) + " (an injected fault)";
                        }
                        ev->fail();
                        go_on = false;
                    } else {
                        run_copy_node(t);
                    }
                    break;
                }
                case schedule::kind::record:
                    ev->record(in.event);
                    break;
                }
                if (!go_on) break;
            }
            {
                std::lock_guard<std::mutex> lock(mu_);
                --pending_;
            }
            done_cv_.notify_all();
        }
    }

    // Made when a graph first has host nodes: most contexts never do.
    host_attention & host() {
        if (!host_) host_ = std::make_unique<host_attention>(n_threads_);
        return *host_;
    }

    executor exec_;
    int n_threads_;
    std::unique_ptr<host_attention> host_;
    memory_ledger mem_;
    host_blocks host_mem_;
    schedule sched_;
    last_run last_;
    std::thread workers_[3];
    std::mutex mu_;
    std::condition_variable cv_, done_cv_;
    const graph * job_g_ = nullptr;
    const schedule * job_s_ = nullptr;
    event_set * job_ev_ = nullptr;
    int pending_ = 0;
    std::string copy_error_; // the run's first failed copy or host node
    uint64_t gen_ = 0;
    bool stop_ = false;
};

} // namespace

std::unique_ptr<backend> make_sim_backend(int n_threads) {
    return std::make_unique<sim_backend>(n_threads);
}

} // namespace smol
