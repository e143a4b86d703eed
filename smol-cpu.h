// smol-cpu.h - the CPU side of the core: the thread pool and the executor
// that runs a graph's nodes on it (the CPU backend's, and the simulated
// device's compute). Defined in smol-cpu.c++.

#ifndef SMOL_CPU_H
#define SMOL_CPU_H

#include "smol-graph.h"
#include "smol-schedule.h"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace smol {

// --- thread pool ------------------------------------------------------------

// Persistent workers that run one function on every thread at once; inside
// it, barrier() separates the phases (ggml's model: one parallel region per
// graph, a spin barrier between nodes, sleep between graphs).
class thread_pool {
  public:
    explicit thread_pool(int n_threads);
    ~thread_pool();
    int size() const { return n_threads_; }
    void run(const std::function<void(int ith, int nth)> & fn);
    void barrier();
    // Starts fn on the workers alone (fn(i, size() - 1) for each i below
    // size() - 1) and returns at once, the caller free to work meanwhile;
    // wait() returns when they are done. fn must live until then, must not
    // call barrier(), and no run() comes between. A pool of one thread runs
    // fn(0, 1) here.
    void launch(const std::function<void(int ith, int nth)> & fn);
    void wait();

  private:
    void worker(int ith);
    int n_threads_;
    std::vector<std::thread> threads_;
    std::mutex mu_;
    std::condition_variable cv_;
    const std::function<void(int, int)> * job_ = nullptr;
    std::function<void(int, int)> launched_; // launch's fn, as the workers call it
    uint64_t job_gen_ = 0;
    bool stop_ = false;
    std::atomic<int> pending_{0};
    alignas(64) std::atomic<int> bar_count_{0};
    alignas(64) std::atomic<uint32_t> bar_gen_{0};
};

// Thread ith of nth's share of a KV_STORE node, as the CPU backend runs it
// (the host's store of host-attended heads).
void kv_store_part(const tensor * t, const batch_info & b, int ith, int nth);

// --- executor ---------------------------------------------------------------

// Runs graphs on the CPU: places intermediates in an arena and runs the
// nodes in order on the thread pool.
class executor {
  public:
    explicit executor(int n_threads);
    // Assigns data to intermediate tensors; grows the arena if this graph
    // needs more than any before (only while a context warms up).
    void plan(graph & g);
    // Runs the nodes in order, copies inline; with a schedule and a copy
    // engine, the compute stream here and the copy streams on the engine.
    void run(graph & g, const schedule * s = nullptr, copy_engine * copies = nullptr);
    size_t arena_bytes() const { return arena_.size; }
    // Every byte the executor holds: arena, work space, per-thread scratch.
    size_t held_bytes() const { return arena_.size + work_.size + scratch_.size; }
    // What plan(g) would hold, without allocating.
    size_t bytes_for(const graph & g);
    thread_pool & pool() { return pool_; }

  private:
    thread_pool pool_;
    struct aligned_buffer {
        uint8_t * data = nullptr;
        size_t size = 0;
        void reserve(size_t n); // grows, 64-byte aligned; contents not kept
        ~aligned_buffer();
    };
    // On thread 0 after a node: a failure stops the run at the barrier of
    // that index.
    void check_node(int32_t node, int32_t barrier);
    aligned_buffer arena_;
    aligned_buffer work_;    // shared by all threads of one op
    aligned_buffer scratch_; // per-thread work space
    size_t scratch_per_thread_ = 0;
    std::vector<uint8_t> no_barrier_;                // node n may start before n - 1 ends
    std::unique_ptr<std::atomic<int32_t>[]> chunks_; // per node: the next chunk of work
    size_t n_chunks_ = 0;
    arena_plan plan_, probe_;
    event_set events_;
    std::atomic<int32_t> failed_node_{-1};    // the node that failed, or -1
    std::atomic<bool> node_failed_{false};    // set by a node that could not do its work
    std::atomic<int32_t> stop_at_{INT32_MAX}; // every thread leaves after this barrier
};

} // namespace smol

#endif // SMOL_CPU_H
