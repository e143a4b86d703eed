// smol.c++ - the core: tensors and the graph of ops, the arena planner, the
// thread pool and the executor that runs a graph on the CPU backend, the KV
// cache's cell bookkeeping, and the C API of smol.h on top of the model layer
// (smol-llama.c++), the tokenizer (smol-vocab.c++) and the sampler.

#include "smol.h"

#include "smol-backend.h"
#include "smol-cpu-kernels.h"
#include "smol-error.h"
#include "smol-graph.h"
#include "smol-llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define SMOL_PAUSE() _mm_pause()
#else
#define SMOL_PAUSE() ((void)0)
#endif

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
    "NONE", "GET_ROWS", "RMS_NORM",  "MUL_MAT", "ADD",
    "ROPE", "KV_STORE", "ATTENTION", "SWIGLU",  "COPY",
};
static_assert(OP_COUNT == 10, "op_names must list every op");

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

graph::graph(size_t capacity) {
    tensors_.reserve(capacity);
    nodes_.reserve(capacity);
}

void graph::clear() {
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

tensor * op_rms_norm(graph & g, tensor * x, tensor * weight, float eps) {
    tensor * t = elementwise(g, OP_RMS_NORM, x, weight);
    t->fparams[0] = eps;
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
                 float freq_base) {
    tensor * t = elementwise(g, OP_ROPE, x, pos);
    t->iparams[0] = n_head;
    t->iparams[1] = head_dim;
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
                      int32_t n_head_kv, int32_t head_dim) {
    tensor * t = elementwise(g, OP_ATTENTION, q, after);
    t->iparams[0] = layer;
    t->iparams[1] = n_head;
    t->iparams[2] = n_head_kv;
    t->iparams[3] = head_dim;
    return t;
}

tensor * op_swiglu(graph & g, tensor * gate, tensor * up) {
    return elementwise(g, OP_SWIGLU, gate, up);
}

// --- KV cache cells -------------------------------------------------------------

void kv_cache::init(int32_t layers, int32_t heads, int32_t dim, int32_t cells) {
    n_layer = layers;
    n_head_kv = heads;
    head_dim = dim;
    n_cells = cells;
    cell_pos.assign(cells, -1);
    cell_seqs.assign(cells, 0);
    n_used = 0;
}

int32_t kv_cache::n_free() const {
    return int32_t(std::count(cell_pos.begin(), cell_pos.end(), -1));
}

void kv_cache::clear() {
    std::fill(cell_pos.begin(), cell_pos.end(), -1);
    std::fill(cell_seqs.begin(), cell_seqs.end(), 0);
    n_used = 0;
}

void kv_cache::shrink_used() {
    while (n_used > 0 && cell_pos[n_used - 1] < 0) --n_used;
}

static bool valid_seq(smol_seq_id s) {
    return s >= 0 && s < kv_max_seqs;
}

void kv_cache::seq_rm(smol_seq_id seq, smol_pos p0, smol_pos p1) {
    if (p1 < 0) p1 = INT32_MAX;
    if (seq >= kv_max_seqs) return;
    const seq_mask drop = seq < 0 ? ~seq_mask(0) : seq_mask(1) << seq;
    for (int32_t c = 0; c < n_used; ++c) {
        if (cell_pos[c] < p0 || cell_pos[c] >= p1 || !(cell_seqs[c] & drop)) continue;
        cell_seqs[c] &= ~drop;
        if (cell_seqs[c] == 0) cell_pos[c] = -1;
    }
    shrink_used();
}

void kv_cache::seq_cp(smol_seq_id src, smol_seq_id dst, smol_pos p0, smol_pos p1) {
    if (p1 < 0) p1 = INT32_MAX;
    if (!valid_seq(src) || !valid_seq(dst) || src == dst) return;
    for (int32_t c = 0; c < n_used; ++c) {
        if (cell_pos[c] >= p0 && cell_pos[c] < p1 && ((cell_seqs[c] >> src) & 1u))
            cell_seqs[c] |= seq_mask(1) << dst;
    }
}

int32_t kv_cache::seq_len(smol_seq_id seq) const {
    if (!valid_seq(seq)) return 0;
    int32_t n = 0;
    for (int32_t c = 0; c < n_used; ++c) n += cell_pos[c] >= 0 && ((cell_seqs[c] >> seq) & 1u);
    return n;
}

void kv_cache::cells_add_seq(const int32_t * cells, int32_t n, smol_seq_id seq) {
    SMOL_ASSERT_MSG(valid_seq(seq), "cells_add_seq: sequence out of range");
    for (int32_t i = 0; i < n; ++i) {
        SMOL_ASSERT_MSG(cell_pos[cells[i]] >= 0, "cells_add_seq: the cell is free");
        cell_seqs[cells[i]] |= seq_mask(1) << seq;
    }
}

void kv_cache::cells_rm_seq(const int32_t * cells, int32_t n, smol_seq_id seq) {
    SMOL_ASSERT_MSG(valid_seq(seq), "cells_rm_seq: sequence out of range");
    for (int32_t i = 0; i < n; ++i) {
        const int32_t c = cells[i];
        cell_seqs[c] &= ~(seq_mask(1) << seq);
        if (cell_seqs[c] == 0) cell_pos[c] = -1;
    }
    shrink_used();
}

// --- thread pool ------------------------------------------------------------------

thread_pool::thread_pool(int n_threads) : n_threads_(std::max(1, n_threads)) {
    for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

thread_pool::~thread_pool() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    for (auto & t : threads_) t.join();
}

void thread_pool::worker(int ith) {
    uint64_t seen = 0;
    for (;;) {
        const std::function<void(int, int)> * job;
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return stop_ || job_gen_ != seen; });
            if (stop_) return;
            seen = job_gen_;
            job = job_;
        }
        (*job)(ith, n_threads_);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

void thread_pool::run(const std::function<void(int, int)> & fn) {
    if (n_threads_ == 1) {
        fn(0, 1);
        return;
    }
    pending_.store(n_threads_ - 1, std::memory_order_release);
    {
        std::lock_guard<std::mutex> lock(mu_);
        job_ = &fn;
        ++job_gen_;
    }
    cv_.notify_all();
    fn(0, n_threads_);
    for (int spins = 0; pending_.load(std::memory_order_acquire) != 0;) {
        if (++spins < 2000) {
            SMOL_PAUSE();
        } else {
            std::this_thread::yield();
        }
    }
}

void thread_pool::barrier() {
    if (n_threads_ == 1) return;
    const uint32_t gen = bar_gen_.load(std::memory_order_acquire);
    if (bar_count_.fetch_add(1, std::memory_order_acq_rel) == n_threads_ - 1) {
        bar_count_.store(0, std::memory_order_relaxed);
        bar_gen_.fetch_add(1, std::memory_order_acq_rel);
        return;
    }
    int spins = 0;
    while (bar_gen_.load(std::memory_order_acquire) == gen) {
        if (++spins < 2000) {
            SMOL_PAUSE();
        } else {
            std::this_thread::yield();
        }
    }
}

// --- executor ----------------------------------------------------------------------

void executor::aligned_buffer::reserve(size_t n) {
    if (n <= size) return;
    std::free(data);
    size = (n + 63) & ~size_t(63);
    data = static_cast<uint8_t *>(std::aligned_alloc(64, size));
    if (!data) {
        size = 0;
        throw error(SMOL_ERR_OUT_OF_MEMORY,
                    "cannot allocate " + std::to_string(n >> 20) + " MiB of compute memory");
    }
}

executor::aligned_buffer::~aligned_buffer() {
    std::free(data);
}

executor::executor(int n_threads) : pool_(n_threads) {}

static size_t align64(size_t n) {
    return (n + 63) & ~size_t(63);
}

void plan_arena(const graph & g, size_t alignment, arena_plan & p) {
    const auto & nodes = g.nodes();
    auto align = [alignment](size_t n) { return (n + alignment - 1) / alignment * alignment; };
    // Index of the last node that reads each node's result.
    p.last_use.assign(nodes.size(), -1);
    p.src_index.assign(nodes.size() * max_src, -1);
    for (size_t i = 0; i < nodes.size(); ++i) {
        for (int s = 0; s < max_src; ++s) {
            const tensor * src = nodes[i]->src[s];
            if (!src || src->kind == OP_NONE) continue;
            const int j = src->node_index;
            p.src_index[i * max_src + s] = j;
            if (j >= 0) p.last_use[size_t(j)] = int(i);
        }
    }

    // First fit over the free ranges of one offset space.
    using range = arena_plan::range;
    auto & free_list = p.free_list;
    free_list.clear();
    size_t top = 0;
    auto take = [&](size_t n) {
        for (size_t k = 0; k < free_list.size(); ++k) {
            if (free_list[k].size >= n) {
                const size_t off = free_list[k].off;
                free_list[k].off += n;
                free_list[k].size -= n;
                if (free_list[k].size == 0) free_list.erase(free_list.begin() + long(k));
                return off;
            }
        }
        const size_t off = top;
        top += n;
        return off;
    };
    auto give = [&](size_t off, size_t n) {
        auto it = std::lower_bound(free_list.begin(), free_list.end(), off,
                                   [](const range & r, size_t o) { return r.off < o; });
        it = free_list.insert(it, {off, n});
        // Merge with the neighbours on both sides.
        if (it + 1 != free_list.end() && it->off + it->size == (it + 1)->off) {
            it->size += (it + 1)->size;
            free_list.erase(it + 1);
        }
        if (it != free_list.begin() && (it - 1)->off + (it - 1)->size == it->off) {
            (it - 1)->size += it->size;
            free_list.erase(it);
        }
    };

    p.arena_bytes = p.work_bytes = p.scratch_bytes = 0;
    p.offset.assign(nodes.size(), SIZE_MAX);
    p.live.assign(nodes.size(), 0);
    for (size_t i = 0; i < nodes.size(); ++i) {
        const tensor * t = nodes[i];
        if (!t->data && t->nbytes() > 0) {
            p.offset[i] = take(align(t->nbytes()));
            p.live[i] = 1;
        }
        for (int s = 0; s < max_src; ++s) {
            const int j = p.src_index[i * max_src + s];
            if (j >= 0 && p.last_use[size_t(j)] == int(i) && p.live[size_t(j)]) {
                give(p.offset[size_t(j)], align(nodes[size_t(j)]->nbytes()));
                p.live[size_t(j)] = 0;
            }
        }
        if (t->kind == OP_MUL_MAT) {
            p.work_bytes =
                std::max(p.work_bytes, cpu::act_bytes(t->src[0]->type, t->src[0]->ne[0]) *
                                           size_t(t->src[1]->ne[1]));
        }
        if (t->kind == OP_ATTENTION) {
            const size_t cells = g.batch.kv ? size_t(g.batch.kv->n_cells) : 0;
            // Scores and the visible cells' indices per cell, one head's sum.
            p.scratch_bytes =
                std::max(p.scratch_bytes, (2 * cells + size_t(t->iparams[3])) * sizeof(float));
        }
    }
    p.arena_bytes = top;
}

void executor::plan(graph & g) {
    arena_plan & p = plan_;
    plan_arena(g, 64, p);
    arena_.reserve(p.arena_bytes);
    work_.reserve(p.work_bytes);
    scratch_per_thread_ = align64(p.scratch_bytes);
    scratch_.reserve(scratch_per_thread_ * size_t(pool_.size()));
    const auto & nodes = g.nodes();
    for (size_t i = 0; i < nodes.size(); ++i) {
        if (p.offset[i] != SIZE_MAX) nodes[i]->data = arena_.data + p.offset[i];
    }
}

// --- op kernels on the CPU ----------------------------------------------------------

namespace {

struct op_args {
    const cpu::kernels & k;
    thread_pool & pool;
    const batch_info & batch;
    uint8_t * work;
    float * scratch; // this thread's
    int ith, nth;
};

inline float * row_f32(const tensor * x, int64_t i) {
    return reinterpret_cast<float *>(static_cast<uint8_t *>(x->data) + i * x->nb[1]);
}

// Rows [r0, r1) of n for thread ith of nth.
inline void split(int64_t n, int ith, int nth, int64_t & r0, int64_t & r1) {
    r0 = n * ith / nth;
    r1 = n * (ith + 1) / nth;
}

void run_get_rows(tensor * t, const op_args & a) {
    const tensor * table = t->src[0];
    const int32_t * ids = static_cast<const int32_t *>(t->src[1]->data);
    int64_t i0, i1;
    split(t->ne[1], a.ith, a.nth, i0, i1);
    for (int64_t i = i0; i < i1; ++i) {
        const uint8_t * row =
            static_cast<const uint8_t *>(table->data) + size_t(ids[i]) * table->nb[1];
        float * dst = row_f32(t, i);
        a.k.row_to_f32(table->type, row, dst, table->ne[0]);
    }
}

// The sum of squares is taken in double, as ggml does, so the scale agrees
// with llama.cpp's to the last bit for the same inputs.
void run_rms_norm(tensor * t, const op_args & a) {
    const tensor * x = t->src[0];
    const float * w = static_cast<const float *>(t->src[1]->data);
    const int64_t n = x->ne[0];
    int64_t i0, i1;
    split(x->ne[1], a.ith, a.nth, i0, i1);
    for (int64_t i = i0; i < i1; ++i) {
        const float * src = row_f32(x, i);
        float * dst = row_f32(t, i);
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += double(src[j]) * double(src[j]);
        const float mean = float(sum / double(n));
        a.k.scale(dst, src, 1.0f / std::sqrt(mean + t->fparams[0]), n);
        a.k.mul(dst, dst, w, n);
    }
}

void run_mul_mat(tensor * t, const op_args & a) {
    const tensor * w = t->src[0];
    const tensor * x = t->src[1];
    const int64_t K = w->ne[0], N = w->ne[1], n_tok = x->ne[1];
    const size_t act_row = cpu::act_bytes(w->type, K);
    // Phase 1: each thread converts its share of activation rows.
    int64_t i0, i1;
    split(n_tok, a.ith, a.nth, i0, i1);
    for (int64_t i = i0; i < i1; ++i) {
        const float * src = row_f32(x, i);
        a.k.act_from_f32(w->type, src, a.work + i * act_row, K);
    }
    a.pool.barrier();
    // Phase 2: each thread multiplies its rows of the weight for all tokens.
    // Ranges are rounded to 16 rows so kernels keep their full tiles.
    int64_t r0 = (N * a.ith / a.nth) & ~int64_t(15);
    int64_t r1 = a.ith == a.nth - 1 ? N : (N * (a.ith + 1) / a.nth) & ~int64_t(15);
    if (r1 > r0) {
        a.k.matmul(w->type, w->data, w->nb[1], K, r0, r1, a.work, act_row, n_tok,
                   static_cast<float *>(t->data), t->ne[0]);
    }
}

void run_add(tensor * t, const op_args & a) {
    int64_t i0, i1;
    split(t->nrows(), a.ith, a.nth, i0, i1);
    const int64_t n = t->ne[0];
    for (int64_t i = i0; i < i1; ++i)
        a.k.add(row_f32(t, i), row_f32(t->src[0], i), row_f32(t->src[1], i), n);
}

void run_swiglu(tensor * t, const op_args & a) {
    int64_t i0, i1;
    split(t->nrows(), a.ith, a.nth, i0, i1);
    const int64_t n = t->ne[0];
    for (int64_t i = i0; i < i1; ++i)
        a.k.swiglu(row_f32(t, i), row_f32(t->src[0], i), row_f32(t->src[1], i), n);
}

// GGUF stores llama's Q and K rows so that rotary pairs are adjacent
// (llama.cpp's "normal" rope): pair (2i, 2i+1) turns by pos * base^(-2i/d).
// The angle is stepped in float, theta *= base^(-2/d), as ggml does, so the
// rotation agrees with llama.cpp's bit for bit.
void run_rope(tensor * t, const op_args & a) {
    const tensor * x = t->src[0];
    const int32_t * pos = static_cast<const int32_t *>(t->src[1]->data);
    const int n_head = t->iparams[0], hd = t->iparams[1];
    const float theta_scale = std::pow(t->fparams[0], -2.0f / float(hd));
    int64_t i0, i1;
    split(x->ne[1], a.ith, a.nth, i0, i1);
    float cs[512], sn[512];
    for (int64_t i = i0; i < i1; ++i) {
        float theta = float(pos[i]);
        for (int j = 0; j < hd / 2; ++j) {
            cs[j] = std::cos(theta);
            sn[j] = std::sin(theta);
            theta *= theta_scale;
        }
        const float * src = row_f32(x, i);
        float * dst = row_f32(t, i);
        for (int h = 0; h < n_head; ++h) {
            const float * s = src + h * hd;
            float * d = dst + h * hd;
            for (int j = 0; j < hd / 2; ++j) {
                const float x0 = s[2 * j], x1 = s[2 * j + 1];
                d[2 * j] = x0 * cs[j] - x1 * sn[j];
                d[2 * j + 1] = x0 * sn[j] + x1 * cs[j];
            }
        }
    }
}

void run_kv_store(tensor * t, const op_args & a) {
    kv_cache & kv = *a.batch.kv;
    const tensor * k = t->src[0];
    const tensor * v = t->src[1];
    const int layer = t->iparams[0], hd = kv.head_dim;
    int64_t i0, i1;
    split(k->ne[1], a.ith, a.nth, i0, i1);
    for (int64_t i = i0; i < i1; ++i) {
        const int32_t cell = a.batch.cell[i];
        const float * ks = row_f32(k, i);
        const float * vs = row_f32(v, i);
        for (int h = 0; h < kv.n_head_kv; ++h) {
            a.k.f32_to_f16(ks + h * hd, kv.k_head(layer, h) + size_t(cell) * hd, hd);
            a.k.f32_to_f16(vs + h * hd, kv.v_head(layer, h) + size_t(cell) * hd, hd);
        }
    }
}

// Per (token, head): scores over the visible cells, softmax, then the
// weighted sum of V. The query and the normalised weights are rounded to f16
// before they meet the f16 cache, and the softmax sum is kept in double, as
// llama.cpp's attention does, so the two engines round alike. The visible
// cells are taken in position order when the batch lists them (see
// batch_info), so a sequence's result is the same bits alone or batched and
// wherever its cells lie; otherwise in cell order.
void run_attention(tensor * t, const op_args & a) {
    kv_cache & kv = *a.batch.kv;
    const tensor * q = t->src[0];
    const int layer = t->iparams[0], n_head = t->iparams[1], n_head_kv = t->iparams[2],
              hd = t->iparams[3];
    const int group = n_head / n_head_kv;
    const float scale = 1.0f / std::sqrt(float(hd));
    const int64_t n_tok = q->ne[1];
    float * scores = a.scratch;
    float * acc = a.scratch + kv.n_cells;
    int32_t * own = reinterpret_cast<int32_t *>(acc + hd); // cell order, no list given
    uint16_t qh16[1024];
    float qh[1024];
    int64_t w0, w1;
    split(n_tok * n_head, a.ith, a.nth, w0, w1);
    int64_t listed = -1; // the token whose cells `own` holds
    const int32_t * cells = nullptr;
    int32_t n_vis = 0;
    for (int64_t w = w0; w < w1; ++w) {
        const int64_t i = w / n_head;
        const int h = int(w % n_head), hk = h / group;
        const smol_pos p = a.batch.pos[i];
        const smol_seq_id s = a.batch.seq[i];
        if (a.batch.seq_cells) {
            const int32_t * list = a.batch.seq_cells + a.batch.seq_begin[s];
            const int32_t n_list = a.batch.seq_begin[s + 1] - a.batch.seq_begin[s];
            cells = list;
            n_vis = 0;
            while (n_vis < n_list && kv.cell_pos[list[n_vis]] <= p) ++n_vis;
        } else if (listed != i) {
            n_vis = 0;
            for (int32_t c = 0; c < kv.n_used; ++c) {
                if (kv_cell_visible(kv.cell_pos[c], kv.cell_seqs[c], s, p)) own[n_vis++] = c;
            }
            cells = own;
            listed = i;
        }
        a.k.f32_to_f16(row_f32(q, i) + h * hd, qh16, hd);
        a.k.row_to_f32(SMOL_TYPE_F16, qh16, qh, hd);
        const uint16_t * K = kv.k_head(layer, hk);
        const uint16_t * V = kv.v_head(layer, hk);
        float mx = -INFINITY;
        for (int32_t j = 0; j < n_vis; ++j) {
            scores[j] = a.k.dot_f16_f32(K + size_t(cells[j]) * hd, qh, hd) * scale;
            mx = std::max(mx, scores[j]);
        }
        a.k.softmax_exp(scores, scores, mx, n_vis);
        double sum = 0;
        for (int32_t j = 0; j < n_vis; ++j) sum += double(scores[j]);
        const float inv = float(1.0 / sum);
        std::fill(acc, acc + hd, 0.0f);
        for (int32_t j = 0; j < n_vis; ++j) {
            if (scores[j] == 0.0f) continue;
            const float pc = cpu::fp16_to_fp32(cpu::fp32_to_fp16(scores[j] * inv));
            if (pc != 0.0f) a.k.axpy_f16(pc, V + size_t(cells[j]) * hd, acc, hd);
        }
        std::memcpy(row_f32(t, i) + h * hd, acc, size_t(hd) * sizeof(float));
    }
}

void run_copy(tensor * t, const op_args & a) {
    if (a.ith == 0) std::memcpy(t->data, t->src[0]->data, t->src[0]->nbytes());
}

using op_fn = void (*)(tensor *, const op_args &);
const op_fn op_table[OP_COUNT] = {
    nullptr,  run_get_rows, run_rms_norm,  run_mul_mat, run_add,
    run_rope, run_kv_store, run_attention, run_swiglu,  run_copy,
};

} // namespace

void executor::run(graph & g) {
    // One captured pointer keeps the closure inside std::function's small
    // buffer: running a graph allocates nothing.
    struct step_state {
        executor * self;
        graph * g;
        const cpu::kernels * k;
    } st{this, &g, &cpu::kernels_best()};
    const std::function<void(int, int)> body = [&st](int ith, int nth) {
        executor & e = *st.self;
        op_args args{*st.k,
                     e.pool_,
                     st.g->batch,
                     e.work_.data,
                     reinterpret_cast<float *>(e.scratch_.data + e.scratch_per_thread_ * ith),
                     ith,
                     nth};
        for (tensor * t : st.g->nodes()) {
            op_table[t->kind](t, args);
            e.pool_.barrier();
        }
    };
    pool_.run(body);
}

// --- the CPU backend ------------------------------------------------------------

namespace {

class cpu_backend final : public backend {
  public:
    explicit cpu_backend(int n_threads) : exec_(n_threads) {}
    const char * name() const override { return "cpu"; }
    placement where() const override { return placement::host; }
    void * alloc(size_t bytes) override {
        void * p = std::aligned_alloc(64, align64(std::max<size_t>(bytes, 1)));
        if (!p) {
            throw error(SMOL_ERR_OUT_OF_MEMORY,
                        "cannot allocate " + std::to_string(bytes >> 20) + " MiB of host memory");
        }
        return p;
    }
    void release(void * p) override { std::free(p); }
    void upload(void * dst, const void * src, size_t n) override { std::memcpy(dst, src, n); }
    void download(void * dst, const void * src, size_t n) override { std::memcpy(dst, src, n); }
    void memset(void * dst, int value, size_t n) override { std::memset(dst, value, n); }
    void run(graph & g) override {
        exec_.plan(g);
        exec_.run(g);
    }
    void reserve(graph & g) override { exec_.plan(g); }

  private:
    executor exec_;
};

} // namespace

#if !defined(SMOL_CUDA)
std::unique_ptr<backend> make_cuda_backend(int) {
    throw error(SMOL_ERR_UNSUPPORTED, "this smol was built without CUDA; configure it with "
                                      "-DSMOL_CUDA=ON on a machine with the CUDA toolkit");
}
#endif

std::unique_ptr<backend> make_backend(const std::string & device, int n_threads) {
    if (device.empty() || device == "cpu") return std::make_unique<cpu_backend>(n_threads);
    if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
        int index = 0;
        if (device.size() > 5) {
            char * end = nullptr;
            const long v = std::strtol(device.c_str() + 5, &end, 10);
            if (*end != '\0' || v < 0 || v > 255) {
                throw error(SMOL_ERR_INVALID_ARGUMENT,
                            "device '" + device + "': expected cuda:N with N a GPU index");
            }
            index = int(v);
        }
        return make_cuda_backend(index);
    }
    throw error(SMOL_ERR_INVALID_ARGUMENT, "unknown device '" + device + "'; use cpu or cuda:N");
}

} // namespace smol

// --- the C API -------------------------------------------------------------------

namespace smol {

static thread_local std::string last_error;
void set_last_error(const std::string & message) {
    last_error = message;
}

} // namespace smol

struct smol_context {
    smol_model * model;
    std::unique_ptr<smol::llama_context> c;
};

using smol::guard;

namespace {

smol_status invalid(const std::string & message) {
    smol::set_last_error(message);
    return SMOL_ERR_INVALID_ARGUMENT;
}

// Copies bytes into a caller's buffer, NUL-terminated when there is room.
smol_status copy_out(const std::string & s, char * buf, size_t size, size_t * n_out) {
    if (n_out) *n_out = s.size();
    if (!buf || size < s.size() + 1) {
        if (buf && size > 0) buf[0] = '\0';
        smol::set_last_error("the output buffer holds " + std::to_string(size) + " bytes; " +
                             std::to_string(s.size() + 1) + " are needed");
        return SMOL_ERR_BUFFER_TOO_SMALL;
    }
    std::memcpy(buf, s.data(), s.size());
    buf[s.size()] = '\0';
    return SMOL_OK;
}

std::string format_value(const gguf::value & v) {
    switch (v.t) {
    case gguf::type::STRING:
        return v.str;
    case gguf::type::BOOL:
        return v.b ? "true" : "false";
    case gguf::type::FLOAT32:
    case gguf::type::FLOAT64: {
        char b[64];
        std::snprintf(b, sizeof b, "%.9g", v.f);
        return b;
    }
    case gguf::type::ARRAY:
        return "[array of " + std::to_string(v.arr.size()) + "]";
    case gguf::type::UINT8:
    case gguf::type::UINT16:
    case gguf::type::UINT32:
    case gguf::type::UINT64:
        return std::to_string(v.u);
    default:
        return std::to_string(v.i);
    }
}

} // namespace

extern "C" {

const char * smol_last_error(void) {
    return smol::last_error.c_str();
}

const char * smol_status_name(smol_status s) {
    switch (s) {
    case SMOL_OK:
        return "SMOL_OK";
    case SMOL_ERR_INVALID_ARGUMENT:
        return "SMOL_ERR_INVALID_ARGUMENT";
    case SMOL_ERR_IO:
        return "SMOL_ERR_IO";
    case SMOL_ERR_FORMAT:
        return "SMOL_ERR_FORMAT";
    case SMOL_ERR_UNSUPPORTED:
        return "SMOL_ERR_UNSUPPORTED";
    case SMOL_ERR_OUT_OF_MEMORY:
        return "SMOL_ERR_OUT_OF_MEMORY";
    case SMOL_ERR_CONTEXT_FULL:
        return "SMOL_ERR_CONTEXT_FULL";
    case SMOL_ERR_BUFFER_TOO_SMALL:
        return "SMOL_ERR_BUFFER_TOO_SMALL";
    case SMOL_ERR_BACKEND:
        return "SMOL_ERR_BACKEND";
    case SMOL_ERR_BUSY:
        return "SMOL_ERR_BUSY";
    }
    return "SMOL_ERR_UNKNOWN";
}

const char * smol_version(void) {
    return "0.1.0";
}

const char * smol_cpu_kernels_name(void) {
    return smol::cpu::kernels_best().name;
}

const char * smol_type_name(smol_type t) {
    switch (t) {
    case SMOL_TYPE_F32:
        return "f32";
    case SMOL_TYPE_F16:
        return "f16";
    case SMOL_TYPE_BF16:
        return "bf16";
    case SMOL_TYPE_Q8_0:
        return "q8_0";
    case SMOL_TYPE_Q4_0:
        return "q4_0";
    case SMOL_TYPE_Q4_1:
        return "q4_1";
    }
    return nullptr;
}

smol_model_params smol_model_default_params(void) {
    smol_model_params p;
    p.progress = nullptr;
    p.progress_user_data = nullptr;
    p.use_mmap = true;
    return p;
}

smol_status smol_model_load(const char * path, const smol_model_params * params,
                            smol_model ** out) {
    if (!path || !out) return invalid("smol_model_load: path and out must not be NULL");
    *out = nullptr;
    const smol_model_params p = params ? *params : smol_model_default_params();
    return guard([&] {
        auto m = std::make_unique<smol_model>();
        m->m = smol::llama_model::load(path, p);
        *out = m.release();
    });
}

void smol_model_free(smol_model * model) {
    delete model;
}

void smol_model_get_info(const smol_model * model, smol_model_info * info) {
    if (!model || !info) return;
    const smol::llama_model & m = *model->m;
    *info = {};
    info->n_vocab = m.hp.n_vocab;
    info->n_ctx_train = m.hp.n_ctx_train;
    info->n_embd = m.hp.n_embd;
    info->n_layer = m.hp.n_layer;
    info->n_head = m.hp.n_head;
    info->n_head_kv = m.hp.n_head_kv;
    info->n_ff = m.hp.n_ff;
    info->n_params = m.n_params;
    info->n_bytes = m.n_bytes;
    info->ftype = m.ftype;
    std::snprintf(info->name, sizeof info->name, "%s", m.name.c_str());
}

smol_status smol_model_meta(const smol_model * model, const char * key, char * buf, size_t size) {
    if (!model || !key) return invalid("smol_model_meta: model and key must not be NULL");
    const gguf::value * v = model->m->file->find(key);
    if (!v) return invalid(std::string("smol_model_meta: the model has no key '") + key + "'");
    return copy_out(format_value(*v), buf, size, nullptr);
}

smol_token smol_token_bos(const smol_model * model) {
    return model ? model->m->vocab.bos() : -1;
}
smol_token smol_token_eos(const smol_model * model) {
    return model ? model->m->vocab.eos() : -1;
}
bool smol_token_is_eog(const smol_model * model, smol_token t) {
    return model && model->m->vocab.is_eog(t);
}

smol_status smol_tokenize(const smol_model * model, const char * text, size_t len, bool add_special,
                          bool parse_special, smol_token * tokens, int32_t n_max, int32_t * n_out) {
    if (!model || (!text && len > 0) || !n_out) {
        return invalid("smol_tokenize: model, text and n_out must not be NULL");
    }
    std::vector<smol_token> ids;
    const smol_status st = guard([&] {
        ids = model->m->vocab.tokenize(std::string_view(text ? text : "", len), add_special,
                                       parse_special);
    });
    if (st != SMOL_OK) return st;
    *n_out = int32_t(ids.size());
    if (int64_t(ids.size()) > n_max || (!tokens && !ids.empty())) {
        smol::set_last_error("smol_tokenize: the text has " + std::to_string(ids.size()) +
                             " tokens, the buffer holds " + std::to_string(n_max));
        return SMOL_ERR_BUFFER_TOO_SMALL;
    }
    std::copy(ids.begin(), ids.end(), tokens);
    return SMOL_OK;
}

smol_status smol_token_to_piece(const smol_model * model, smol_token token, bool special,
                                char * buf, size_t size, size_t * n_out) {
    if (!model) return invalid("smol_token_to_piece: model must not be NULL");
    if (token < 0 || token >= model->m->hp.n_vocab) {
        return invalid("smol_token_to_piece: token " + std::to_string(token) +
                       " is outside the vocabulary");
    }
    return copy_out(model->m->vocab.token_to_piece(token, special), buf, size, n_out);
}

smol_status smol_chat_apply_template(const smol_model * model, const smol_chat_message * messages,
                                     size_t n, bool add_assistant, char * buf, size_t size,
                                     size_t * n_out) {
    if (!model || (!messages && n > 0)) {
        return invalid("smol_chat_apply_template: model and messages must not be NULL");
    }
    std::string text;
    const smol_status st = guard([&] {
        std::vector<smol::chat_message> msgs;
        for (size_t i = 0; i < n; ++i) {
            if (!messages[i].role || !messages[i].content) {
                throw smol::error(SMOL_ERR_INVALID_ARGUMENT, "smol_chat_apply_template: message " +
                                                                 std::to_string(i) +
                                                                 " has a NULL role or content");
            }
            msgs.push_back({messages[i].role, messages[i].content});
        }
        text = model->m->vocab.apply_chat_template(msgs, add_assistant);
    });
    if (st != SMOL_OK) return st;
    return copy_out(text, buf, size, n_out);
}

smol_context_params smol_context_default_params(void) {
    smol_context_params p;
    p.n_ctx = 0;
    p.n_batch = 512;
    p.n_threads = 0;
    p.n_seq_max = 1;
    p.device = nullptr;
    return p;
}

smol_status smol_context_create(smol_model * model, const smol_context_params * params,
                                smol_context ** out) {
    if (!model || !out) return invalid("smol_context_create: model and out must not be NULL");
    *out = nullptr;
    const smol_context_params p = params ? *params : smol_context_default_params();
    if (p.n_seq_max > uint32_t(smol::kv_max_seqs)) {
        return invalid("smol_context_create: n_seq_max " + std::to_string(p.n_seq_max) +
                       " is above " + std::to_string(smol::kv_max_seqs) +
                       ", the most sequences a KV cell can be shared by");
    }
    return guard([&] {
        auto c = std::make_unique<smol_context>();
        c->model = model;
        c->c = std::make_unique<smol::llama_context>(*model->m, p);
        *out = c.release();
    });
}

void smol_context_free(smol_context * ctx) {
    delete ctx;
}
uint32_t smol_context_n_ctx(const smol_context * ctx) {
    return ctx ? ctx->c->params.n_ctx : 0;
}
uint32_t smol_context_n_batch(const smol_context * ctx) {
    return ctx ? ctx->c->params.n_batch : 0;
}

smol_batch smol_batch_init(int32_t n) {
    smol_batch b{};
    if (n <= 0) return b;
    b.token = static_cast<smol_token *>(std::calloc(size_t(n), sizeof(smol_token)));
    b.pos = static_cast<smol_pos *>(std::calloc(size_t(n), sizeof(smol_pos)));
    b.seq_id = static_cast<smol_seq_id *>(std::calloc(size_t(n), sizeof(smol_seq_id)));
    b.logits = static_cast<int8_t *>(std::calloc(size_t(n), 1));
    if (!b.token || !b.pos || !b.seq_id || !b.logits) smol_batch_free(&b);
    return b;
}

void smol_batch_free(smol_batch * b) {
    if (!b) return;
    std::free(b->token);
    std::free(b->pos);
    std::free(b->seq_id);
    std::free(b->logits);
    *b = smol_batch{};
}

bool smol_batch_add(smol_batch * b, int32_t capacity, smol_token token, smol_pos pos,
                    smol_seq_id seq, bool logits) {
    if (!b || !b->token || b->n_tokens >= capacity) return false;
    const int32_t i = b->n_tokens++;
    b->token[i] = token;
    b->pos[i] = pos;
    b->seq_id[i] = seq;
    b->logits[i] = logits ? 1 : 0;
    return true;
}

smol_status smol_decode(smol_context * ctx, const smol_batch * batch) {
    if (!ctx || !batch) return invalid("smol_decode: ctx and batch must not be NULL");
    return guard([&] { ctx->c->decode(*batch); });
}

const float * smol_get_logits(smol_context * ctx, int32_t i) {
    return ctx ? ctx->c->logits(i) : nullptr;
}

void smol_kv_seq_rm(smol_context * ctx, smol_seq_id seq, smol_pos p0, smol_pos p1) {
    if (ctx) ctx->c->kv.seq_rm(seq, p0, p1);
}

void smol_kv_seq_cp(smol_context * ctx, smol_seq_id src, smol_seq_id dst, smol_pos p0,
                    smol_pos p1) {
    if (ctx) ctx->c->kv.seq_cp(src, dst, p0, p1);
}

int32_t smol_kv_seq_len(const smol_context * ctx, smol_seq_id seq) {
    return ctx ? ctx->c->kv.seq_len(seq) : 0;
}

int32_t smol_kv_free_cells(const smol_context * ctx) {
    return ctx ? ctx->c->kv.n_free() : 0;
}

smol_perf smol_context_perf(const smol_context * ctx) {
    smol_perf p{};
    if (!ctx) return p;
    p = ctx->c->perf;
    p.t_load_ms = ctx->model->m->t_load_ms;
    return p;
}

void smol_context_perf_reset(smol_context * ctx) {
    if (ctx) ctx->c->perf = smol_perf{};
}

} // extern "C"
