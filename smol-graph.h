// smol-graph.h - the core's data model: tensors (type, shape, byte strides,
// placement), the ops a model is built from, the graph that records them,
// the arena that places intermediate results, the schedule that spreads a
// graph over a compute stream and two copy streams, and the executor that
// runs a graph on the CPU backend's thread pool. Model code builds graphs
// through the op builders here and never touches memory placement itself.

#ifndef SMOL_GRAPH_H
#define SMOL_GRAPH_H

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

// The K and V that a KV_STORE writes or an ATTENTION reads: kv heads
// [h0, h1) of one layer, each head [cell][head_dim] f16, head_stride elements
// apart, from these bases (a resident slice in device memory or a staging
// slot). Null k: the cache's own [layer][head][cell][head_dim] arrays.
struct kv_view {
    uint16_t * k = nullptr;
    uint16_t * v = nullptr;
    size_t head_stride = 0;
    int32_t h0 = 0, h1 = 0;
    int32_t slot = -1; // the staging slot it names; -1: resident memory
};

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

// --- KV cache ---------------------------------------------------------------

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SMOL_HOST_DEVICE __host__ __device__
#else
#define SMOL_HOST_DEVICE
#endif

// A cell may belong to several sequences at once (a shared prompt prefix):
// bit s of its mask stands for sequence s, so at most 128 sequences exist.
// An aggregate of two words, so that GPU kernels keep masks in shared memory
// and copy them 16 bytes a cell.
constexpr int32_t kv_max_seqs = 128;
struct seq_mask {
    uint64_t w[2];

    SMOL_HOST_DEVICE static constexpr seq_mask none() { return {{0, 0}}; }
    SMOL_HOST_DEVICE static constexpr seq_mask all() { return {{~uint64_t(0), ~uint64_t(0)}}; }
    // Sequence s alone (0 <= s < kv_max_seqs).
    SMOL_HOST_DEVICE static constexpr seq_mask of(int32_t s) {
        return s < 64 ? seq_mask{{uint64_t(1) << s, 0}} : seq_mask{{0, uint64_t(1) << (s - 64)}};
    }
    SMOL_HOST_DEVICE constexpr bool has(int32_t s) const { return word_has(w[s >> 6], s); }
    // Whether s's bit is set in the word of a mask that holds it.
    SMOL_HOST_DEVICE static constexpr bool word_has(uint64_t word, int32_t s) {
        return ((word >> (s & 63)) & 1u) != 0;
    }
    SMOL_HOST_DEVICE constexpr explicit operator bool() const { return (w[0] | w[1]) != 0; }
    // Whether it holds more than one sequence.
    SMOL_HOST_DEVICE constexpr bool several() const {
        return (w[0] & (w[0] - 1)) != 0 || (w[1] & (w[1] - 1)) != 0 || (w[0] != 0 && w[1] != 0);
    }
    // The lowest sequence of a mask that holds one, and the mask without it:
    // for (seq_mask m = x; m; m = m.rest()) visit(m.first());
    SMOL_HOST_DEVICE int32_t first() const {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
        return w[0] ? __ffsll(static_cast<long long>(w[0])) - 1
                    : 64 + __ffsll(static_cast<long long>(w[1])) - 1;
#else
        return w[0] ? __builtin_ctzll(w[0]) : 64 + __builtin_ctzll(w[1]);
#endif
    }
    SMOL_HOST_DEVICE constexpr seq_mask rest() const {
        return w[0] ? seq_mask{{w[0] & (w[0] - 1), w[1]}} : seq_mask{{0, w[1] & (w[1] - 1)}};
    }

    SMOL_HOST_DEVICE constexpr seq_mask operator|(seq_mask o) const {
        return {{w[0] | o.w[0], w[1] | o.w[1]}};
    }
    SMOL_HOST_DEVICE constexpr seq_mask operator&(seq_mask o) const {
        return {{w[0] & o.w[0], w[1] & o.w[1]}};
    }
    SMOL_HOST_DEVICE constexpr seq_mask operator~() const {
        return {{~w[0], ~w[1]}};
    }
    SMOL_HOST_DEVICE constexpr bool operator==(seq_mask o) const {
        return w[0] == o.w[0] && w[1] == o.w[1];
    }
    SMOL_HOST_DEVICE constexpr bool operator!=(seq_mask o) const {
        return !(*this == o);
    }
    SMOL_HOST_DEVICE seq_mask & operator|=(seq_mask o) {
        return *this = *this | o;
    }
    SMOL_HOST_DEVICE seq_mask & operator&=(seq_mask o) {
        return *this = *this & o;
    }
};
// Cells a page of the cache: a sequence's history fills pages of its own,
// so a GPU kernel can skip another sequence's pages by their summaries.
constexpr int32_t kv_page = 64;

// Whether a query of sequence seq at position pos sees a cell. The one
// definition of visibility, for every backend's attention.
SMOL_HOST_DEVICE inline bool kv_cell_visible(smol_pos cell_pos, seq_mask cell_seqs, smol_seq_id seq,
                                             smol_pos pos) {
    return cell_pos >= 0 && cell_pos <= pos && cell_seqs.has(seq);
}
// The same over the one word of a cell's mask that holds seq's bit (the
// decode kernel keeps no other), read only for a cell at or before pos.
SMOL_HOST_DEVICE inline bool kv_cell_visible(smol_pos cell_pos, const uint64_t * seq_word,
                                             smol_seq_id seq, smol_pos pos) {
    return cell_pos >= 0 && cell_pos <= pos && seq_mask::word_has(*seq_word, seq);
}

// The cache is a set of cells shared by all sequences. Each (layer, kv-head)
// slice of K and of V is [n_cells][head_dim] f16, contiguous, so one head's
// history is one block of memory (and, later, one copy).
struct kv_cache {
    int32_t n_layer = 0, n_head_kv = 0, head_dim = 0, n_cells = 0;
    // [layer][head][cell][head_dim] f16, in the memory of the backend that
    // runs the attention (its owner allocates them).
    uint16_t * k = nullptr;
    uint16_t * v = nullptr;
    std::vector<smol_pos> cell_pos;  // -1: free
    std::vector<seq_mask> cell_seqs; // the sequences that hold each cell
    int32_t n_used = 0;              // cells [0, n_used) may be occupied
    // Counts the changes made by the methods below and by decodes that
    // failed part way (not the cells a successful decode takes: those are
    // its batch's cells, which a backend reads from batch_info::cell).
    // Unique across caches: touch() records a change.
    uint64_t version = 0;
    void touch();

    // Sets the shape and frees every cell; k and v are set by the owner.
    void init(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t n_cells);
    size_t bytes_per_tensor() const {
        return size_t(n_layer) * n_head_kv * n_cells * head_dim * sizeof(uint16_t);
    }
    uint16_t * k_head(int32_t layer, int32_t head) const {
        return k + (size_t(layer) * n_head_kv + head) * n_cells * head_dim;
    }
    uint16_t * v_head(int32_t layer, int32_t head) const {
        return v + (size_t(layer) * n_head_kv + head) * n_cells * head_dim;
    }
    // The cache's own arrays for the view of a node that names none.
    kv_view layer_view(int32_t layer) const {
        return {k_head(layer, 0), v_head(layer, 0), size_t(n_cells) * head_dim, 0, n_head_kv};
    }
    int32_t n_free() const;
    // Whether n cells are free: at once when the cells past n_used (all
    // free) are enough, else by counting.
    bool has_free(int32_t n) const { return n_cells - n_used >= n || n_free() >= n; }
    void clear();
    // Drops seq from the cells it holds in [p0, p1) (p1 < 0: to the end;
    // seq < 0: every sequence); a cell no sequence holds is free.
    void seq_rm(smol_seq_id seq, smol_pos p0, smol_pos p1);
    // Gives dst the cells src holds in [p0, p1): shared, not copied.
    void seq_cp(smol_seq_id src, smol_seq_id dst, smol_pos p0, smol_pos p1);
    int32_t seq_len(smol_seq_id seq) const;
    // A free cell for the next token of a sequence whose newest cell is
    // `after` (-1: none). A sequence's cells fill pages of kv_page cells of
    // their own: the cell after `after` while it is free and in the same
    // page (or starts a free page), else the lowest wholly free page, else
    // the lowest free cell. One sequence alone stays dense. `page_from` and
    // `cell_from` (start at 0) carry the search across the tokens of one
    // batch, which only take cells. -1 when every cell is taken.
    int32_t find_cell(int32_t after, int32_t & page_from, int32_t & cell_from) const;
    // The same for a list of cells, whatever their positions.
    void cells_add_seq(const int32_t * cells, int32_t n, smol_seq_id seq);
    void cells_rm_seq(const int32_t * cells, int32_t n, smol_seq_id seq);

  private:
    void shrink_used();
};

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
void plan_arena(const graph & g, size_t alignment, arena_plan & p);

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
