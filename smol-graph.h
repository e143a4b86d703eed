// smol-graph.h - the core's data model: tensors (type, shape, byte strides,
// placement), the ops a model is built from, the graph that records them,
// and the arena plan that places a graph's intermediate results. Model code
// builds graphs through the op builders here and never touches memory
// placement itself. Defined in smol-graph.c++ (tensors, graph, builders)
// and smol-cpu.c++ (the arena plan); the KV cache's cells are
// smol-kv-cache.h's, the schedule smol-schedule.h's, the CPU's executor
// smol-cpu.h's.

#ifndef SMOL_GRAPH_H
#define SMOL_GRAPH_H

#include "smol-kv-cache.h"
#include "smol.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace smol {

class collective;

// --- tensors ----------------------------------------------------------------

// Where a tensor's bytes live. host_pinned and device exist so that the KV
// placement planner and copy nodes have somewhere to put things; the CPU
// backend only reads host memory.
enum class placement : uint8_t { host, host_pinned, device };
const char * placement_name(placement p);

enum op : uint8_t {
    OP_NONE,       // a leaf: weights, inputs, the KV cache
    OP_GET_ROWS,   // dst[i] = src0[ids[i]] as f32 (ids: int32 in src1)
    OP_RMS_NORM,   // dst = src0 / rms(src0) * src1 (eps in fparams[0])
    OP_MUL_MAT,    // dst[i][r] = dot(src0 row r, src1 row i)
    OP_ADD,        // dst = src0 + src1
    OP_ROPE,       // rotate pairs of each head by pos (src1 int32 positions)
    OP_KV_STORE,   // write k (src0) and v (src1) rows into the cache cells
    OP_ATTENTION,  // causal, masked by sequence, over the cache (GQA)
    OP_SWIGLU,     // dst = silu(src0) * src1
    OP_COPY,       // dst = src0, across placements (prefetch / offload)
    OP_SCALE,      // dst = src0 * fparams[0]
    OP_GEGLU,      // dst = gelu(src0) * src1, GELU's tanh form
    OP_ALL_REDUCE, // dst = the sum over the graph's ranks of each one's src0 (a head split)
    OP_ARGMAX,     // dst[i] = the index (int32) of row i's largest, the first of equal maxima
    OP_COUNT,
};
extern const char * const op_names[OP_COUNT];

constexpr int max_src = 3;

// Which way an OP_COPY moves bytes; the schedule runs each on its own stream.
enum class copy_dir : uint8_t { h2d, d2h, any };

// A strided copy: height rows of width bytes, dpitch and spitch bytes apart
// (from src[0]->data to the node's data, each offset bytes on; height 0:
// the whole of src[0]).
struct copy_desc {
    size_t width = 0, height = 0, dpitch = 0, spitch = 0;
    size_t offset = 0;
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
    int32_t iparams[6] = {0, 0, 0, 0, 0, 0};
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
    // A node of a device's graph that the host runs, on memory of its own
    // (host attention of offloaded KV), or a copy to or from it: the
    // schedule's host stream.
    bool on_host = false;

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
    // The window store's (kv_window) batch, for the nodes of a local view
    // (kv_view::local): the same tokens, kv its slots' table, cell each
    // token's slot, seq_cells its slots. Null: no window store.
    const batch_info * local = nullptr;
};

// The batch as a KV_STORE or ATTENTION node of this view sees it.
inline const batch_info & batch_of_view(const batch_info & b, const kv_view & v) {
    return v.local && b.local ? *b.local : b;
}

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
    // A head split's graph: the ranks its ALL_REDUCE nodes sum over and
    // this graph's rank among them (null: one device). clear() keeps them.
    collective * comm = nullptr;
    int32_t rank = 0;

  private:
    uint64_t generation_;
    std::vector<tensor> tensors_;
    std::vector<tensor *> nodes_;
};

// A number never handed out before: graph generations, cache versions.
uint64_t fresh_number();

// Op builders: they only record op, sources and parameters.
tensor * op_get_rows(graph & g, tensor * table, tensor * ids);
// group > 0: each run of `group` elements (a head) is normalised on its own
// and weight has `group` elements.
tensor * op_rms_norm(graph & g, tensor * x, tensor * weight, float eps, int32_t group = 0);
tensor * op_mul_mat(graph & g, tensor * weight, tensor * x);
tensor * op_add(graph & g, tensor * a, tensor * b);
// neox: the pairs are (i, i + head_dim / 2), as GPT-NeoX and Gemma rotate;
// else adjacent (2i, 2i + 1), as GGUF stores Llama's Q and K.
tensor * op_rope(graph & g, tensor * x, tensor * pos, int32_t n_head, int32_t head_dim,
                 float freq_base, bool neox = false);
// Attention's options beyond the heads: a sliding window (a query at p sees
// keys at p - window + 1 .. p; 0: all), with a window the first `sink`
// positions too (streaming heads), and the scale of q.k (0:
// 1 / sqrt(head_dim)).
struct attn_opts {
    int32_t window = 0;
    float scale = 0;
    int32_t sink = 0;
};
tensor * op_kv_store(graph & g, tensor * k, tensor * v, int32_t layer);
tensor * op_attention(graph & g, tensor * q, tensor * after, int32_t layer, int32_t n_head,
                      int32_t n_head_kv, int32_t head_dim, attn_opts opts = {});
tensor * op_swiglu(graph & g, tensor * gate, tensor * up);
tensor * op_geglu(graph & g, tensor * gate, tensor * up);
tensor * op_scale(graph & g, tensor * x, float c);
// The sum of x (f32, contiguous) over the ranks of g.comm, added in rank
// order: every rank gets the same bits.
tensor * op_all_reduce(graph & g, tensor * x);
// Each row's argmax as an int32 (in a 4-byte element): NaNs passed over, 0
// for a row with no value above -infinity, as cpu::kernels::argmax.
tensor * op_argmax(graph & g, tensor * x);
// KV_STORE of the heads of `view` (k and v rows hold every kv head); `after`
// (may be null) orders it behind a copy that fills the view's memory.
tensor * op_kv_store_heads(graph & g, tensor * k, tensor * v, int32_t layer, const kv_view & view,
                           tensor * after);
// ATTENTION of the query heads over the kv heads of `view`; `into` (may be
// null) is the attention of earlier heads of the layer, whose output this
// node completes in place.
tensor * op_attention_heads(graph & g, tensor * q, tensor * after, int32_t layer, int32_t n_head,
                            int32_t n_head_kv, int32_t head_dim, const kv_view & view,
                            tensor * into, attn_opts opts = {});
// A copy of a strided block between memory spaces (PREFETCH host -> device,
// OFFLOAD device -> host); it runs after `dep0` and `dep1` (may be null).
tensor * op_copy_2d(graph & g, void * dst, placement dst_where, const void * src,
                    placement src_where, const copy_desc & c, tensor * dep0, tensor * dep1);

// The host attention's copies (kv_placement::host_layer): the whole of src
// into host memory at dst (a tensor of src's shape and strides there), and
// part of a host result src (c: rows of a column range, offset bytes in)
// into the same part of `into`'s memory, which the copy then stands for as
// an attention node completes the one before it (null into: memory of its
// own, shaped as src).
tensor * op_copy_to_host(graph & g, tensor * src, void * dst);
tensor * op_copy_to_device(graph & g, tensor * src, tensor * into, const copy_desc & c);

// The view a KV_STORE or ATTENTION node works on.
inline kv_view node_kv_view(const tensor * t, const kv_cache & kv) {
    return t->kv.k ? t->kv : kv.layer_view(t->iparams[0]);
}

// --- arena ------------------------------------------------------------------

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

} // namespace smol

#endif // SMOL_GRAPH_H
