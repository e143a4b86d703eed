// smol-graph.c++ - tensors, the graph that records ops and the op builders
// model code calls (declared in smol-graph.h), the names of placements and
// ops, and the fresh numbers that graph generations and cache versions take.

#include "smol-graph.h"

#include "smol-cpu-kernels.h"
#include "smol-error.h"

#include <atomic>
#include <string>

namespace smol {

// --- tensors and graph --------------------------------------------------------

const char * placement_name(placement p) {
    switch (p) {
    case placement::host:
        return "host";
    case placement::host_pinned:
        return "host-pinned";
    case placement::device:
        return "device";
    }
    return "?";
}

const char * const op_names[OP_COUNT] = {
    "NONE",      "GET_ROWS", "RMS_NORM", "MUL_MAT", "ADD",   "ROPE",       "KV_STORE",
    "ATTENTION", "SWIGLU",   "COPY",     "SCALE",   "GEGLU", "ALL_REDUCE", "ARGMAX",
};
static_assert(OP_COUNT == 14, "op_names must list every op");

void tensor_set_shape(tensor & t, smol_type type, int64_t ne0, int64_t ne1, int64_t ne2,
                      int64_t ne3) {
    t.type = type;
    t.ne[0] = ne0;
    t.ne[1] = ne1;
    t.ne[2] = ne2;
    t.ne[3] = ne3;
    t.nb[0] = type == SMOL_TYPE_F32 ? 4 : (cpu::block_elems(type) == 1 ? 2 : 1);
    t.nb[1] = cpu::row_bytes(type, ne0);
    t.nb[2] = t.nb[1] * ne1;
    t.nb[3] = t.nb[2] * ne2;
}

// A number never handed out before: graph generations and cache versions,
// which a backend compares to know a graph or cache it has seen.
uint64_t fresh_number() {
    static std::atomic<uint64_t> last{0};
    return ++last;
}

graph::graph(size_t capacity) : generation_(fresh_number()) {
    tensors_.reserve(capacity);
    nodes_.reserve(capacity);
}

void graph::clear() {
    generation_ = fresh_number();
    rerun = false;
    tensors_.clear();
    nodes_.clear();
    batch = {};
}

tensor * graph::new_tensor(smol_type type, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    // Tensors point at each other: the vector must never reallocate.
    if (tensors_.size() == tensors_.capacity()) {
        throw error(SMOL_ERR_OUT_OF_MEMORY, "graph: more tensors than its capacity of " +
                                                std::to_string(tensors_.capacity()));
    }
    tensor & t = tensors_.emplace_back();
    tensor_set_shape(t, type, ne0, ne1, ne2, ne3);
    return &t;
}

tensor * graph::leaf(smol_type type, void * data, int64_t ne0, int64_t ne1) {
    tensor * t = new_tensor(type, ne0, ne1);
    t->data = data;
    return t;
}

// Every op records the same things: kind, sources, an f32 result of a shape.
static tensor * node(graph & g, op kind, int64_t ne0, int64_t ne1, tensor * a,
                     tensor * b = nullptr) {
    tensor * t = g.new_tensor(SMOL_TYPE_F32, ne0, ne1);
    t->kind = kind;
    t->src[0] = a;
    t->src[1] = b;
    g.add_node(t);
    return t;
}

// An op whose result has the shape of its first source.
static tensor * elementwise(graph & g, op kind, tensor * a, tensor * b) {
    return node(g, kind, a->ne[0], a->ne[1], a, b);
}

tensor * op_get_rows(graph & g, tensor * table, tensor * ids) {
    return node(g, OP_GET_ROWS, table->ne[0], ids->ne[0], table, ids);
}

tensor * op_rms_norm(graph & g, tensor * x, tensor * weight, float eps, int32_t group) {
    SMOL_ASSERT_MSG(group == 0 ? weight->ne[0] == x->ne[0]
                               : weight->ne[0] == group && x->ne[0] % group == 0,
                    "rms_norm: the weight does not fit the rows or groups");
    tensor * t = elementwise(g, OP_RMS_NORM, x, weight);
    t->fparams[0] = eps;
    t->iparams[0] = group;
    return t;
}

tensor * op_mul_mat(graph & g, tensor * weight, tensor * x) {
    SMOL_ASSERT_MSG(weight->ne[0] == x->ne[0], "mul_mat: inner dimensions differ");
    return node(g, OP_MUL_MAT, weight->ne[1], x->ne[1], weight, x);
}

tensor * op_add(graph & g, tensor * a, tensor * b) {
    return elementwise(g, OP_ADD, a, b);
}

tensor * op_rope(graph & g, tensor * x, tensor * pos, int32_t n_head, int32_t head_dim,
                 float freq_base, bool neox) {
    tensor * t = elementwise(g, OP_ROPE, x, pos);
    t->iparams[0] = n_head;
    t->iparams[1] = head_dim;
    t->iparams[2] = neox ? 1 : 0;
    t->fparams[0] = freq_base;
    return t;
}

tensor * op_kv_store(graph & g, tensor * k, tensor * v, int32_t layer) {
    // No result of its own: later nodes list it as a source only for order.
    tensor * t = node(g, OP_KV_STORE, 0, 0, k, v);
    t->iparams[0] = layer;
    return t;
}

tensor * op_attention(graph & g, tensor * q, tensor * after, int32_t layer, int32_t n_head,
                      int32_t n_head_kv, int32_t head_dim, attn_opts opts) {
    tensor * t = elementwise(g, OP_ATTENTION, q, after);
    t->iparams[0] = layer;
    t->iparams[1] = n_head;
    t->iparams[2] = n_head_kv;
    t->iparams[3] = head_dim;
    t->iparams[4] = opts.window;
    t->iparams[5] = opts.window > 0 ? opts.sink : 0;
    t->fparams[0] = opts.scale;
    return t;
}

tensor * op_swiglu(graph & g, tensor * gate, tensor * up) {
    return elementwise(g, OP_SWIGLU, gate, up);
}

tensor * op_geglu(graph & g, tensor * gate, tensor * up) {
    return elementwise(g, OP_GEGLU, gate, up);
}

tensor * op_all_reduce(graph & g, tensor * x) {
    return elementwise(g, OP_ALL_REDUCE, x, nullptr);
}

tensor * op_argmax(graph & g, tensor * x) {
    return node(g, OP_ARGMAX, 1, x->nrows(), x);
}

tensor * op_scale(graph & g, tensor * x, float c) {
    tensor * t = elementwise(g, OP_SCALE, x, nullptr);
    t->fparams[0] = c;
    return t;
}

tensor * op_kv_store_heads(graph & g, tensor * k, tensor * v, int32_t layer, const kv_view & view,
                           tensor * after) {
    tensor * t = op_kv_store(g, k, v, layer);
    t->deps[0] = after;
    t->kv = view;
    return t;
}

tensor * op_attention_heads(graph & g, tensor * q, tensor * after, int32_t layer, int32_t n_head,
                            int32_t n_head_kv, int32_t head_dim, const kv_view & view,
                            tensor * into, attn_opts opts) {
    tensor * t = op_attention(g, q, after, layer, n_head, n_head_kv, head_dim, opts);
    t->kv = view;
    t->src[2] = into;
    t->view_of = into;
    return t;
}

tensor * op_copy_2d(graph & g, void * dst, placement dst_where, const void * src,
                    placement src_where, const copy_desc & c, tensor * dep0, tensor * dep1) {
    tensor * from = g.new_tensor(SMOL_TYPE_F32, 0, 0);
    from->data = const_cast<void *>(src);
    from->where = src_where;
    tensor * t = node(g, OP_COPY, 0, 0, from);
    t->deps[0] = dep0;
    t->deps[1] = dep1;
    t->data = dst;
    t->where = dst_where;
    t->copy = c;
    return t;
}

tensor * op_copy_to_host(graph & g, tensor * src, void * dst) {
    tensor * t = node(g, OP_COPY, src->ne[0], src->ne[1], src);
    for (int d = 0; d < 4; ++d) {
        t->ne[d] = src->ne[d];
        t->nb[d] = src->nb[d];
    }
    t->data = dst;
    t->where = placement::host_pinned;
    t->copy.dir = copy_dir::d2h;
    return t;
}

tensor * op_copy_to_device(graph & g, tensor * src, tensor * into, const copy_desc & c) {
    tensor * t = node(g, OP_COPY, src->ne[0], src->ne[1], src, into);
    t->view_of = into;
    t->where = placement::device;
    t->copy = c;
    t->copy.dir = copy_dir::h2d;
    return t;
}

} // namespace smol
