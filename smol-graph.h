// smol-graph.h - the core's data model: tensors (type, shape, byte strides,
// placement), the ops a model is built from, the graph that records them,
// the arena that places intermediate results, the schedule that spreads a
// graph over a compute stream and two copy streams, and the executor that
// runs a graph on the CPU backend's thread pool. Model code builds graphs
// through the op builders here and never touches memory placement itself.
// Defined in smol-graph.c++ (tensors, graph, builders), smol-schedule.c++
// and smol-cpu.c++ (thread pool, arena, executor); the KV cache's cells are
// smol-kv-cache.h's.

#ifndef SMOL_GRAPH_H
#define SMOL_GRAPH_H

#include "smol-kv-cache.h"
#include "smol.h"

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace smol {

// --- tensors ----------------------------------------------------------------

// Where a tensor's bytes live. host_pinned and device exist so that the KV
// placement planner and copy nodes have somewhere to put things; the CPU
// backend only reads host memory.
enum class placement : uint8_t { host, host_pinned, device };
const char * placement_name(placement p);

enum op : uint8_t {
    OP_NONE,      // a leaf: weights, inputs, the KV cache
    OP_GET_ROWS,  // dst[i] = src0[ids[i]] as f32 (ids: int32 in src1)
    OP_RMS_NORM,  // dst = src0 / rms(src0) * src1 (eps in fparams[0])
    OP_MUL_MAT,   // dst[i][r] = dot(src0 row r, src1 row i)
    OP_ADD,       // dst = src0 + src1
    OP_ROPE,      // rotate pairs of each head by pos (src1 int32 positions)
    OP_KV_STORE,  // write k (src0) and v (src1) rows into the cache cells
    OP_ATTENTION, // causal, masked by sequence, over the cache (GQA)
    OP_SWIGLU,    // dst = silu(src0) * src1
    OP_COPY,      // dst = src0, across placements (prefetch / offload)
    OP_COUNT,
};
extern const char * const op_names[OP_COUNT];

constexpr int max_src = 3;

// Which way an OP_COPY moves bytes; the schedule runs each on its own stream.
enum class copy_dir : uint8_t { h2d, d2h, any };

// A strided copy: height rows of width bytes, dpitch and spitch bytes apart
// (from src[0]->data to the node's data).
struct copy_desc {
    size_t width = 0, height = 0, dpitch = 0, spitch = 0;
    copy_dir dir = copy_dir::any;
};

struct tensor {
    smol_type type = SMOL_TYPE_F32;
    int64_t ne[4] = {1, 1, 1, 1}; // elements per dimension, 0 fastest
    size_t nb[4] = {0, 0, 0, 0};  // byte strides
    void * data = nullptr;
    placement where = placement::host;

    op kind = OP_NONE;
    tensor * src[max_src] = {nullptr, nullptr, nullptr};
    int32_t iparams[4] = {0, 0, 0, 0};
    float fparams[2] = {0, 0};
    const char * name = "";
    int32_t node_index = -1; // position in its graph's node list
    kv_view kv;              // KV_STORE, ATTENTION
    copy_desc copy;          // COPY
    // A node whose result is written into this earlier node's memory (the
    // head groups of one attention fill one output); it is also a source.
    tensor * view_of = nullptr;
    // Nodes this one runs after without reading their results (a copy into
    // a staging slot after the slot's last reader): they order the schedule
    // but do not keep results alive in the arena.
    tensor * deps[2] = {nullptr, nullptr};

    int64_t nrows() const { return ne[1] * ne[2] * ne[3]; }
    size_t nbytes() const { return nb[3] * ne[3]; }
};

// Sets ne and contiguous strides for a tensor of type t.
void tensor_set_shape(tensor & t, smol_type type, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1,
                      int64_t ne3 = 1);

// --- the batch in flight ----------------------------------------------------

// What the cache and attention ops need to know about the batch in flight.
struct batch_info {
    const smol_pos * pos = nullptr;
    const smol_seq_id * seq = nullptr;
    const int32_t * cell = nullptr; // the cache cell of each token
    int32_t n_tokens = 0;
    kv_cache * kv = nullptr;
    // Optional: the cells each sequence of the batch holds, sorted by
    // position: seq_cells[seq_begin[s], seq_begin[s + 1]). With them the CPU
    // attention sums a sequence's history in position order wherever its
    // cells lie, so its logits do not depend on the rest of the batch.
    const int32_t * seq_cells = nullptr;
    const int32_t * seq_begin = nullptr;
};

// --- graph ------------------------------------------------------------------

// A graph owns its tensors (stable addresses: capacity fixed at reserve) and
// lists the nodes to run in order.
class graph {
  public:
    explicit graph(size_t capacity = 4096);
    void clear();

    tensor * new_tensor(smol_type type, int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1,
                        int64_t ne3 = 1);
    // A leaf whose bytes live elsewhere (weights, inputs).
    tensor * leaf(smol_type type, void * data, int64_t ne0, int64_t ne1 = 1);
    void add_node(tensor * t) {
        t->node_index = int32_t(nodes_.size());
        nodes_.push_back(t);
    }

    const std::vector<tensor *> & nodes() const { return nodes_; }
    batch_info batch;
    // A number no other graph, nor this one before its last clear(), had.
    uint64_t generation() const { return generation_; }
    // Set by the builder when it hands a backend that reruns graphs the
    // graph of that backend's last run again, unchanged but for its batch
    // (backend::reruns_graphs); clear() resets it.
    bool rerun = false;

  private:
    uint64_t generation_;
    std::vector<tensor> tensors_;
    std::vector<tensor *> nodes_;
};

// A number never handed out before: graph generations, cache versions.
uint64_t fresh_number();

// Op builders: they only record op, sources and parameters.
tensor * op_get_rows(graph & g, tensor * table, tensor * ids);
tensor * op_rms_norm(graph & g, tensor * x, tensor * weight, float eps);
tensor * op_mul_mat(graph & g, tensor * weight, tensor * x);
tensor * op_add(graph & g, tensor * a, tensor * b);
tensor * op_rope(graph & g, tensor * x, tensor * pos, int32_t n_head, int32_t head_dim,
                 float freq_base);
tensor * op_kv_store(graph & g, tensor * k, tensor * v, int32_t layer);
tensor * op_attention(graph & g, tensor * q, tensor * after, int32_t layer, int32_t n_head,
                      int32_t n_head_kv, int32_t head_dim);
tensor * op_swiglu(graph & g, tensor * gate, tensor * up);
// KV_STORE of the heads of `view` (k and v rows hold every kv head); `after`
// (may be null) orders it behind a copy that fills the view's memory.
tensor * op_kv_store_heads(graph & g, tensor * k, tensor * v, int32_t layer, const kv_view & view,
                           tensor * after);
// ATTENTION of the query heads over the kv heads of `view`; `into` (may be
// null) is the attention of earlier heads of the layer, whose output this
// node completes in place.
tensor * op_attention_heads(graph & g, tensor * q, tensor * after, int32_t layer, int32_t n_head,
                            int32_t n_head_kv, int32_t head_dim, const kv_view & view,
                            tensor * into);
// A copy of a strided block between memory spaces (PREFETCH host -> device,
// OFFLOAD device -> host); it runs after `dep0` and `dep1` (may be null).
tensor * op_copy_2d(graph & g, void * dst, placement dst_where, const void * src,
                    placement src_where, const copy_desc & c, tensor * dep0, tensor * dep1);

// The view a KV_STORE or ATTENTION node works on.
inline kv_view node_kv_view(const tensor * t, const kv_cache & kv) {
    return t->kv.k ? t->kv : kv.layer_view(t->iparams[0]);
}

// --- schedule ---------------------------------------------------------------

// The program of one graph over three streams: compute runs every op but
// copies, h2d runs host-to-device copies, d2h device-to-host ones. Within a
// stream instructions run in order; across streams an instruction waits for
// an event that another stream recorded after the node it depends on. Issue
// order is the graph's node order, so a copy placed early in the graph is
// issued early and overlaps the compute that follows it.
enum class stream_id : uint8_t { compute, h2d, d2h };
constexpr int n_streams = 3;
const char * stream_name(stream_id s);

struct schedule {
    enum class kind : uint8_t { run, wait, record };
    struct instr {
        kind what;
        int32_t node;  // run: the node
        int32_t event; // wait, record
    };
    std::vector<instr> prog[n_streams];
    // Issue order: (stream, index in that stream's program).
    std::vector<std::pair<uint8_t, int32_t>> issue;
    std::vector<uint8_t> node_stream; // per node
    std::vector<int32_t> event_after; // per node: the event recorded after it, or -1
    std::vector<int32_t> event_node;  // per event: the node it follows
    std::vector<int32_t> event_pos;   // per event: its record's index in its stream
    std::vector<uint8_t> needs_event; // the builder's work space
    int32_t n_events = 0;
    bool has_copies() const { return !prog[1].empty() || !prog[2].empty(); }
};
stream_id node_stream(const tensor * t);
void make_schedule(const graph & g, schedule & s);
// The program as text, one instruction a line in issue order.
std::string format_schedule(const graph & g, const schedule & s);

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

  private:
    void worker(int ith);
    int n_threads_;
    std::vector<std::thread> threads_;
    std::mutex mu_;
    std::condition_variable cv_;
    const std::function<void(int, int)> * job_ = nullptr;
    uint64_t job_gen_ = 0;
    bool stop_ = false;
    std::atomic<int> pending_{0};
    alignas(64) std::atomic<int> bar_count_{0};
    alignas(64) std::atomic<uint32_t> bar_gen_{0};
};

// --- executor ---------------------------------------------------------------

// Where each intermediate tensor of a graph goes in one arena: first fit,
// reusing a result's bytes once its last reader has run. Every backend uses
// it; offsets are aligned to `alignment`. A plan object is reused from step
// to step, so planning allocates nothing once its vectors have grown.
struct arena_plan {
    size_t arena_bytes = 0;
    size_t work_bytes = 0;      // shared work space of the largest MUL_MAT
    size_t scratch_bytes = 0;   // per-thread work space of the attention
    std::vector<size_t> offset; // per node; SIZE_MAX: has its own memory

    struct range {
        size_t off, size;
    };
    std::vector<int> last_use, src_index; // the planner's own work space
    std::vector<range> free_list;
    std::vector<uint8_t> live;
};
// extra_reads, when given, holds per node a result it reads beyond its
// sources (or null): a backend's fused step reads the input of a node
// folded into it, whose memory must then live until that step has run.
void plan_arena(const graph & g, size_t alignment, arena_plan & p,
                const std::vector<const tensor *> * extra_reads = nullptr);

// Events of one run of a schedule, shared by the threads that run its
// streams: record marks one done, wait blocks until it is.
class event_set {
  public:
    void reset(int32_t n);
    void record(int32_t e);
    void wait(int32_t e);

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<uint8_t> done_;
};

// Runs the two copy streams of a schedule beside the executor's compute
// stream (the simulated device's copy threads).
class copy_engine {
  public:
    virtual ~copy_engine() = default;
    // Hands over the copy streams of s; they run as their waits allow.
    virtual void start(const graph & g, const schedule & s, event_set & ev) = 0;
    // Returns once both streams have run every instruction.
    virtual void finish() = 0;
};

// Runs one OP_COPY node (a strided memcpy) on the calling thread.
void run_copy_node(const tensor * t);

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
    aligned_buffer arena_;
    aligned_buffer work_;    // shared by all threads of one op
    aligned_buffer scratch_; // per-thread work space
    size_t scratch_per_thread_ = 0;
    std::vector<uint8_t> no_barrier_;                // node n may start before n - 1 ends
    std::unique_ptr<std::atomic<int32_t>[]> chunks_; // per node: the next chunk of work
    size_t n_chunks_ = 0;
    arena_plan plan_, probe_;
    event_set events_;
};

} // namespace smol

#endif // SMOL_GRAPH_H
