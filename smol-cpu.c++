// smol-cpu.c++ - the CPU backend: the thread pool, the executor (arena
// planning, and the run of a graph's nodes on the pool, which the simulated
// device uses too), each op's CPU kernel over smol-cpu-kernels' table, the
// CPU backend itself, and make_backend, which picks a backend by name.

#include "smol-cpu.h"

#include "smol-backend.h"
#include "smol-collective.h"
#include "smol-cpu-kernels.h"
#include "smol-error.h"
#include "smol-faults.h"
#include "smol-graph.h"
#include "smol-host-memory.h"
#include "smol-overrides.h"

#include <algorithm>
#include <atomic>
#include <cmath>
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
    wait();
}

void thread_pool::launch(const std::function<void(int, int)> & fn) {
    if (n_threads_ == 1) {
        fn(0, 1);
        return;
    }
    launched_ = [f = &fn](int ith, int nth) { (*f)(ith - 1, nth - 1); };
    pending_.store(n_threads_ - 1, std::memory_order_release);
    {
        std::lock_guard<std::mutex> lock(mu_);
        job_ = &launched_;
        ++job_gen_;
    }
    cv_.notify_all();
}

void thread_pool::wait() {
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

void plan_arena(const graph & g, size_t alignment, arena_plan & p,
                const std::vector<const tensor *> * extra_reads) {
    const auto & nodes = g.nodes();
    // The node a node reads beyond its sources, if any: its index, else -1.
    auto extra_of = [&](size_t i) {
        const tensor * x = extra_reads ? (*extra_reads)[i] : nullptr;
        return x && x->kind != OP_NONE ? x->node_index : -1;
    };
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
        if (const int j = extra_of(i); j >= 0) p.last_use[size_t(j)] = int(i);
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
        const int alias = t->view_of ? t->view_of->node_index : -1;
        if (!t->data && t->nbytes() > 0 && alias >= 0 && p.live[size_t(alias)] &&
            nodes[size_t(alias)]->nbytes() == t->nbytes()) {
            // Written in place: the memory passes from the earlier node.
            p.offset[i] = p.offset[size_t(alias)];
            p.live[size_t(alias)] = 0;
            p.live[i] = 1;
        } else if (!t->data && t->nbytes() > 0) {
            p.offset[i] = take(align(t->nbytes()));
            p.live[i] = 1;
        }
        auto release = [&](int j) {
            if (j >= 0 && p.last_use[size_t(j)] == int(i) && p.live[size_t(j)]) {
                give(p.offset[size_t(j)], align(nodes[size_t(j)]->nbytes()));
                p.live[size_t(j)] = 0;
            }
        };
        for (int s = 0; s < max_src; ++s) release(p.src_index[i * max_src + s]);
        release(extra_of(i));
        if (t->kind == OP_MUL_MAT) {
            p.work_bytes =
                std::max(p.work_bytes, cpu::act_bytes(t->src[0]->type, t->src[0]->ne[0]) *
                                           size_t(t->src[1]->ne[1]));
        }
        if (t->kind == OP_ATTENTION) {
            const size_t cells = g.batch.kv ? size_t(g.batch.kv->n_cells) : 0;
            // Per query of a kv head's group: scores per cell, the query and
            // its sum; the visible cells' indices per cell.
            const size_t group = size_t(t->iparams[1] / t->iparams[2]);
            p.scratch_bytes =
                std::max(p.scratch_bytes,
                         ((group + 1) * cells + 2 * group * size_t(t->iparams[3])) * sizeof(float));
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

size_t executor::bytes_for(const graph & g) {
    plan_arena(g, 64, probe_);
    return align64(probe_.arena_bytes) + align64(probe_.work_bytes) +
           align64(probe_.scratch_bytes) * size_t(pool_.size());
}

// --- op kernels on the CPU ----------------------------------------------------------

namespace {

struct op_args {
    const cpu::kernels & k;
    thread_pool * pool;
    const batch_info & batch;
    uint8_t * work;
    float * scratch; // this thread's
    int ith, nth;
    std::atomic<int32_t> * chunks; // per node (node_index), zero when the graph starts
    const graph * g;               // its collective, for ALL_REDUCE
    std::atomic<bool> * failed;    // set by a node that could not do its work
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
    // A row, or each group of a row (a head, for Gemma's q and k norms).
    const int64_t n = t->iparams[0] > 0 ? t->iparams[0] : x->ne[0];
    const int64_t groups = x->ne[0] / n;
    int64_t i0, i1;
    split(x->ne[1], a.ith, a.nth, i0, i1);
    for (int64_t i = i0; i < i1; ++i) {
        for (int64_t gr = 0; gr < groups; ++gr) {
            const float * src = row_f32(x, i) + gr * n;
            float * dst = row_f32(t, i) + gr * n;
            double sum = 0;
            for (int64_t j = 0; j < n; ++j) sum += double(src[j]) * double(src[j]);
            const float mean = float(sum / double(n));
            a.k.scale(dst, src, 1.0f / std::sqrt(mean + t->fparams[0]), n);
            a.k.mul(dst, dst, w, n);
        }
    }
}

void run_scale(tensor * t, const op_args & a) {
    int64_t i0, i1;
    split(t->nrows(), a.ith, a.nth, i0, i1);
    for (int64_t i = i0; i < i1; ++i)
        a.k.scale(row_f32(t, i), row_f32(t->src[0], i), t->fparams[0], t->ne[0]);
}

void run_argmax(tensor * t, const op_args & a) {
    const tensor * x = t->src[0];
    int64_t i0, i1;
    split(x->nrows(), a.ith, a.nth, i0, i1);
    int32_t * y = static_cast<int32_t *>(t->data);
    for (int64_t i = i0; i < i1; ++i) y[i] = int32_t(a.k.argmax(row_f32(x, i), x->ne[0]));
}

// GELU in its tanh form (Gemma's gelu_pytorch_tanh), computed in f32.
void run_geglu(tensor * t, const op_args & a) {
    int64_t i0, i1;
    split(t->nrows(), a.ith, a.nth, i0, i1);
    const int64_t n = t->ne[0];
    constexpr float k_sqrt_2_over_pi = 0.79788456080286535588f;
    for (int64_t i = i0; i < i1; ++i) {
        const float * g = row_f32(t->src[0], i);
        const float * u = row_f32(t->src[1], i);
        float * d = row_f32(t, i);
        for (int64_t j = 0; j < n; ++j) {
            const float x = g[j];
            const float gelu =
                0.5f * x * (1.0f + std::tanh(k_sqrt_2_over_pi * x * (1.0f + 0.044715f * x * x)));
            d[j] = gelu * u[j];
        }
    }
}

// Up to this many tokens, each thread converts all the activations of a
// matmul itself: no barrier inside the op, no shared work buffer, so the
// executor may start a matmul while others of the same input still run.
constexpr int64_t mul_mat_private_tokens = 4;

void run_mul_mat(tensor * t, const op_args & a) {
    const tensor * w = t->src[0];
    const tensor * x = t->src[1];
    const int64_t K = w->ne[0], N = w->ne[1], n_tok = x->ne[1];
    const size_t act_row = cpu::act_bytes(w->type, K);
    float * y = static_cast<float *>(t->data);
    const int64_t ldy = t->ne[0];
    // Rows are split in multiples of 16 so kernels keep their full tiles; a
    // row's result does not depend on which thread computes it, nor a
    // token's on the tokens beside it.
    if (n_tok <= mul_mat_private_tokens) {
        // Decode: each thread converts the few activations itself and
        // streams a fixed, contiguous range of rows.
        thread_local std::vector<uint8_t> own;
        if (own.size() < size_t(n_tok) * act_row) own.resize(size_t(n_tok) * act_row);
        for (int64_t i = 0; i < n_tok; ++i)
            a.k.act_from_f32(w->type, row_f32(x, i), own.data() + i * act_row, K);
        const int64_t r0 = (N * a.ith / a.nth) & ~int64_t(15);
        const int64_t r1 = a.ith == a.nth - 1 ? N : (N * (a.ith + 1) / a.nth) & ~int64_t(15);
        if (r1 > r0)
            a.k.matmul(w->type, w->data, w->nb[1], K, r0, r1, own.data(), act_row, n_tok, y, ldy);
        return;
    }
    // Each thread converts its share of activation rows into the shared
    // work buffer.
    int64_t i0, i1;
    split(n_tok, a.ith, a.nth, i0, i1);
    for (int64_t i = i0; i < i1; ++i)
        a.k.act_from_f32(w->type, row_f32(x, i), a.work + i * act_row, K);
    a.pool->barrier();
    // Then items of (token chunk, row chunk), token chunk by token chunk,
    // taken in turn from a counter: a thread held up (by the machine or a
    // slower item) leaves its share to the others, and the threads sharing
    // a token chunk each find its activations in their own L2.
    const int64_t chunk = std::max<int64_t>(16, (N / (4 * int64_t(a.nth))) & ~int64_t(15));
    const int64_t n_rc = (N + chunk - 1) / chunk;
    const int64_t tc = std::min(n_tok, a.k.token_chunk(w->type, K));
    const int64_t n_items = (n_tok + tc - 1) / tc * n_rc;
    std::atomic<int32_t> & next = a.chunks[t->node_index];
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < n_items;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
        const int64_t t0 = c / n_rc * tc, t1 = std::min(n_tok, t0 + tc);
        const int64_t r0 = c % n_rc * chunk, r1 = std::min(N, r0 + chunk);
        a.k.matmul(w->type, w->data, w->nb[1], K, r0, r1, a.work + size_t(t0) * act_row, act_row,
                   t1 - t0, y + t0 * ldy, ldy);
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
    const bool neox = t->iparams[2] != 0;
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
        // Pair j's two elements: adjacent, or half a head apart (neox).
        const int stride = neox ? 1 : 2, other = neox ? hd / 2 : 1;
        for (int h = 0; h < n_head; ++h) {
            const float * s = src + h * hd;
            float * d = dst + h * hd;
            for (int j = 0; j < hd / 2; ++j) {
                const float x0 = s[stride * j], x1 = s[stride * j + other];
                d[stride * j] = x0 * cs[j] - x1 * sn[j];
                d[stride * j + other] = x0 * sn[j] + x1 * cs[j];
            }
        }
    }
}

void run_kv_store(tensor * t, const op_args & a) {
    const kv_cache & kv = *a.batch.kv;
    const tensor * k = t->src[0];
    const tensor * v = t->src[1];
    const kv_view view = node_kv_view(t, kv);
    const int hd = kv.head_dim;
    int64_t i0, i1;
    split(k->ne[1], a.ith, a.nth, i0, i1);
    for (int64_t i = i0; i < i1; ++i) {
        const size_t at = size_t(a.batch.cell[i]) * size_t(kv.row_words);
        const float * ks = row_f32(k, i);
        const float * vs = row_f32(v, i);
        for (int h = view.h0; h < view.h1; ++h) {
            const size_t head = size_t(h - view.h0) * view.head_stride;
            if (kv.type == SMOL_TYPE_F16) {
                a.k.f32_to_f16(ks + h * hd, view.k + head + at, hd);
                a.k.f32_to_f16(vs + h * hd, view.v + head + at, hd);
            } else { // rotated, then blocks by ggml's reference rule
                float turned[1024];
                std::memcpy(turned, ks + h * hd, size_t(hd) * sizeof(float));
                kv_rotate(turned, hd, kv.rot_k);
                a.k.row_from_f32(kv.type, turned, view.k + head + at, hd);
                std::memcpy(turned, vs + h * hd, size_t(hd) * sizeof(float));
                kv_rotate(turned, hd, kv.rot_v);
                a.k.row_from_f32(kv.type, turned, view.v + head + at, hd);
            }
        }
    }
}

// Per (token, kv head): scores over the visible cells for the query heads
// that share the kv head, softmax, then the weighted sum of V. The queries
// and the normalised weights are rounded to f16 before they meet the f16
// cache, and the softmax sum is kept in double, as llama.cpp's attention
// does, so the two engines round alike. The visible cells are taken in
// position order when the batch lists them (see batch_info), so a
// sequence's result is the same bits alone or batched and wherever its
// cells lie; otherwise in cell order. A query's result does not depend on
// how many queries share the kernel calls. A node covers the query heads of
// its view's kv heads; K and V come from the view's bases, resident memory
// or a staging slot alike (both indexed by cell). Over a quantized cache
// the rounded queries turn as its K was turned before it was stored, and
// the output turns back from V's turn (kv_rotate).
void run_attention(tensor * t, const op_args & a) {
    const kv_cache & kv = *a.batch.kv;
    const tensor * q = t->src[0];
    const kv_view view = node_kv_view(t, kv);
    const int n_head = t->iparams[1], n_head_kv = t->iparams[2], hd = t->iparams[3];
    const int group = n_head / n_head_kv;
    const int n_kv = view.h1 - view.h0;
    const float scale = t->fparams[0] != 0 ? t->fparams[0] : 1.0f / std::sqrt(float(hd));
    // A sliding window: a query at p sees keys at p - window + 1 .. p, and
    // those below `sink` (streaming heads).
    const int32_t window = t->iparams[4], sink = t->iparams[5];
    const int64_t n_tok = q->ne[1];
    const int64_t ld = kv.n_cells;
    float * scores = a.scratch;                                               // group x n_cells
    int32_t * own = reinterpret_cast<int32_t *>(scores + size_t(group) * ld); // n_cells
    float * qh = reinterpret_cast<float *>(own + ld);                         // group x hd
    float * acc = qh + size_t(group) * hd;                                    // group x hd
    uint16_t h16[1024];
    float mx[64];
    // Work items: (token, kv head) with its whole group of queries, dealt
    // out to the threads in turn (a later token sees more cells); with too
    // few of those to share (decode), (token, query head).
    const int per_item = group <= 64 && n_tok * n_kv >= 4 * int64_t(a.nth) ? group : 1;
    const int items_per_kv = group / per_item;
    int64_t listed = -1; // the token whose cells `own` holds
    const int32_t * cells = nullptr;
    int32_t n_vis = 0;
    for (int64_t w = a.ith; w < n_tok * n_kv * items_per_kv; w += a.nth) {
        const int64_t i = w / (n_kv * items_per_kv);
        const int r = int(w % (n_kv * items_per_kv));
        const int hk = view.h0 + r / items_per_kv;
        const int h0 = hk * group + (r % items_per_kv) * per_item;
        const smol_pos p = a.batch.pos[i];
        const smol_seq_id s = a.batch.seq[i];
        if (a.batch.seq_cells) {
            const int32_t * list = a.batch.seq_cells + a.batch.seq_begin[s];
            const int32_t n_list = a.batch.seq_begin[s + 1] - a.batch.seq_begin[s];
            cells = list;
            n_vis = 0;
            while (n_vis < n_list && kv.cell_pos[list[n_vis]] <= p) ++n_vis;
            if (window > 0) {
                int32_t n_sink = 0; // the list is sorted by position: sinks first
                while (n_sink < n_vis && kv.cell_pos[list[n_sink]] < sink) ++n_sink;
                int32_t first = n_sink;
                while (first < n_vis && p - kv.cell_pos[list[first]] >= window) ++first;
                if (n_sink == 0) {
                    cells += first;
                    n_vis -= first;
                } else if (first > n_sink) { // the sinks, then the window apart
                    std::memcpy(own, list, size_t(n_sink) * sizeof(int32_t));
                    std::memcpy(own + n_sink, list + first,
                                size_t(n_vis - first) * sizeof(int32_t));
                    cells = own;
                    n_vis = n_sink + (n_vis - first);
                    listed = -1;
                } // else the sinks and the window adjoin: the list as it is
            }
        } else if (listed != i) {
            n_vis = 0;
            for (int32_t c = 0; c < kv.n_used; ++c) {
                const smol_pos cp = kv.cell_pos[c];
                if (kv_cell_visible(cp, kv.cell_seqs[c], s, p) &&
                    (window <= 0 || p - cp < window || cp < sink))
                    own[n_vis++] = c;
            }
            cells = own;
            listed = i;
        }
        for (int g = 0; g < per_item; ++g) {
            a.k.f32_to_f16(row_f32(q, i) + (h0 + g) * hd, h16, hd);
            a.k.row_to_f32(SMOL_TYPE_F16, h16, qh + g * hd, hd);
            kv_rotate(qh + g * hd, hd, kv.rot_k); // as the stored K turned
        }
        const uint16_t * K = view.k + size_t(hk - view.h0) * view.head_stride;
        const uint16_t * V = view.v + size_t(hk - view.h0) * view.head_stride;
        if (kv.type == SMOL_TYPE_F16)
            a.k.attn_scores(K, cells, n_vis, hd, qh, per_item, scale, scores, ld, mx);
        else
            a.k.attn_scores_q(kv.type, K, cells, n_vis, hd, qh, per_item, scale, scores, ld, mx);
        for (int g = 0; g < per_item; ++g) {
            float * sc = scores + g * ld;
            a.k.softmax_exp(sc, sc, mx[g], n_vis);
            // The sum in double, in four interleaved parts (one chain of
            // double additions would take as long as the scores).
            double part[4] = {0, 0, 0, 0};
            int32_t j = 0;
            for (; j + 4 <= n_vis; j += 4)
                for (int l = 0; l < 4; ++l) part[l] += double(sc[j + l]);
            for (; j < n_vis; ++j) part[0] += double(sc[j]);
            const double sum = (part[0] + part[1]) + (part[2] + part[3]);
            // The weights, normalised and rounded to f16 (exactly, as the
            // scalar conversion does) in place.
            a.k.scale(sc, sc, float(1.0 / sum), n_vis);
            for (int32_t j0 = 0; j0 < n_vis; j0 += 1024) {
                const int32_t n = std::min<int32_t>(1024, n_vis - j0);
                a.k.f32_to_f16(sc + j0, h16, n);
                a.k.row_to_f32(SMOL_TYPE_F16, h16, sc + j0, n);
            }
        }
        if (kv.type == SMOL_TYPE_F16)
            a.k.attn_values(V, cells, scores, ld, per_item, n_vis, hd, acc);
        else
            a.k.attn_values_q(kv.type, V, cells, scores, ld, per_item, n_vis, hd, acc);
        kv_rotate(acc, int64_t(per_item) * hd, kv.rot_v); // back from V's turn
        for (int g = 0; g < per_item; ++g)
            std::memcpy(row_f32(t, i) + (h0 + g) * hd, acc + g * hd, size_t(hd) * sizeof(float));
    }
}

void run_copy(tensor * t, const op_args & a) {
    if (a.ith == 0) run_copy_node(t);
}

// Thread 0 meets the other ranks; the rest wait at the barrier after it.
void run_all_reduce(tensor * t, const op_args & a) {
    if (a.ith != 0) return;
    const tensor * x = t->src[0];
    const size_t n = size_t(x->ne[0]) * size_t(x->nrows());
    if (!a.g->comm || !a.g->comm->all_reduce(a.g->rank, static_cast<const float *>(x->data),
                                             static_cast<float *>(t->data), n))
        a.failed->store(true, std::memory_order_relaxed);
}

using op_fn = void (*)(tensor *, const op_args &);

// A KV_STORE or ATTENTION node of a window store's view works on the store's
// slots: its kernel is given that batch (batch_info::local).
template <op_fn run> void run_on_view(tensor * t, const op_args & a) {
    const batch_info & b = batch_of_view(a.batch, node_kv_view(t, *a.batch.kv));
    run(t, op_args{a.k, a.pool, b, a.work, a.scratch, a.ith, a.nth, a.chunks, a.g, a.failed});
}

const op_fn op_table[OP_COUNT] = {
    nullptr,
    run_get_rows,
    run_rms_norm,
    run_mul_mat,
    run_add,
    run_rope,
    run_on_view<run_kv_store>,
    run_on_view<run_attention>,
    run_swiglu,
    run_copy,
    run_scale,
    run_geglu,
    run_all_reduce,
    run_argmax,
};

} // namespace

void kv_store_part(const tensor * t, const batch_info & b, int ith, int nth) {
    const batch_info & vb = batch_of_view(b, node_kv_view(t, *b.kv));
    run_kv_store(const_cast<tensor *>(t), op_args{cpu::kernels_best(), nullptr, vb, nullptr,
                                                  nullptr, ith, nth, nullptr, nullptr, nullptr});
}

namespace {

bool overlaps(const tensor * a, const tensor * b) {
    if (!a || !b || !a->data || !b->data) return false;
    const uint8_t * a0 = static_cast<const uint8_t *>(a->data);
    const uint8_t * b0 = static_cast<const uint8_t *>(b->data);
    return a0 < b0 + b->nbytes() && b0 < a0 + a->nbytes();
}

// Whether node t may start while the nodes [first, t) since the last
// barrier still run on other threads: t must be a matmul that keeps its
// activations to itself or a rope, none of its sources may be one of those
// nodes, and its memory may meet none of theirs (the arena reuses memory).
bool may_skip_barrier(const std::vector<tensor *> & nodes, size_t first, size_t t) {
    const tensor * n = nodes[t];
    const bool own_work = n->kind == OP_MUL_MAT && n->src[1]->ne[1] <= mul_mat_private_tokens;
    if (!own_work && n->kind != OP_ROPE) return false;
    if (n->view_of || n->deps[0]) return false;
    for (size_t i = first; i < t; ++i) {
        const tensor * p = nodes[i];
        if (p->kind != OP_MUL_MAT && p->kind != OP_ROPE) return false;
        if (overlaps(n, p)) return false;
        for (const tensor * s : n->src) {
            if (s == p || overlaps(s, p)) return false;
        }
        for (const tensor * s : p->src) {
            if (overlaps(n, s)) return false;
        }
    }
    return true;
}

} // namespace

void executor::run(graph & g, const schedule * sched, copy_engine * copies) {
    // Barriers the plain program can leave out: in decode the q, k and v
    // matmuls of one input run back to back, and so do the gate and up.
    const std::vector<tensor *> & nodes = g.nodes();
    if (n_chunks_ < nodes.size()) {
        chunks_.reset(new std::atomic<int32_t>[nodes.size()]);
        n_chunks_ = nodes.size();
    }
    for (size_t n = 0; n < nodes.size(); ++n) chunks_[n].store(0, std::memory_order_relaxed);
    no_barrier_.assign(nodes.size(), 0);
    for (size_t n = 1, first = 0; n < nodes.size(); ++n) {
        if (may_skip_barrier(nodes, first, n)) {
            no_barrier_[n] = 1;
        } else {
            first = n;
        }
    }
    // One captured pointer keeps the closure inside std::function's small
    // buffer: running a graph allocates nothing.
    struct step_state {
        executor * self;
        graph * g;
        const cpu::kernels * k;
        const schedule * s;
    } st{this, &g, &cpu::kernels_best(), nullptr};
    if (sched && copies && sched->has_side_work()) {
        st.s = sched;
        events_.reset(sched->n_events);
        copies->start(g, *sched, events_);
    }
    // A node that fails (an injected kernel fault; the CPU's kernels report
    // none of their own) or a copy the compute stream waits for that failed
    // stops every thread at the next barrier. Thread 0 names that barrier
    // by its index in the run (each thread counts the barriers it passed),
    // so a thread still reading after an earlier barrier goes on to it: a
    // plain flag set after a barrier could be seen by some threads at that
    // barrier and not by others.
    failed_node_.store(-1, std::memory_order_relaxed);
    node_failed_.store(false, std::memory_order_relaxed);
    stop_at_.store(INT32_MAX, std::memory_order_relaxed);
    const std::function<void(int, int)> body = [&st](int ith, int nth) {
        executor & e = *st.self;
        op_args args{*st.k,
                     &e.pool_,
                     st.g->batch,
                     e.work_.data,
                     reinterpret_cast<float *>(e.scratch_.data + e.scratch_per_thread_ * ith),
                     ith,
                     nth,
                     e.chunks_.get(),
                     st.g,
                     &e.node_failed_};
        int32_t bars = 0; // barriers passed
        // The barrier after a node; false: the run stops here.
        const auto go_on = [&] {
            e.pool_.barrier();
            return e.stop_at_.load(std::memory_order_relaxed) > bars++;
        };
        if (!st.s) {
            const std::vector<tensor *> & nodes = st.g->nodes();
            for (size_t n = 0; n < nodes.size(); ++n) {
                op_table[nodes[n]->kind](nodes[n], args);
                if (n + 1 == nodes.size() || !e.no_barrier_[n + 1]) {
                    if (ith == 0) e.check_node(int32_t(n), bars);
                    if (!go_on()) return;
                }
            }
            return;
        }
        // The compute stream: waits hold every thread until a copy is done.
        for (const schedule::instr & in : st.s->prog[0]) {
            switch (in.what) {
            case schedule::kind::wait:
                if (ith == 0 && !e.events_.wait(in.event))
                    e.stop_at_.store(bars, std::memory_order_relaxed);
                if (!go_on()) return;
                break;
            case schedule::kind::run: {
                tensor * t = st.g->nodes()[size_t(in.node)];
                op_table[t->kind](t, args);
                if (ith == 0) e.check_node(in.node, bars);
                if (!go_on()) return;
                break;
            }
            case schedule::kind::record:
                if (ith == 0) e.events_.record(in.event);
                break;
            }
        }
    };
    pool_.run(body);
    const int32_t bad = failed_node_.load(std::memory_order_relaxed);
    if (st.s) {
        // Copy streams waiting for an event of the compute stream's that
        // will never be recorded stop too; finish throws a copy's failure.
        if (bad >= 0) events_.fail();
        copies->finish();
    }
    if (bad >= 0 && node_failed_.load(std::memory_order_relaxed)) {
        throw error(SMOL_ERR_BACKEND, "node " + std::to_string(bad) + " (" +
                                          describe_node(nodes[size_t(bad)]) +
                                          ") did not meet the other devices of the head split: "
                                          "one of them failed");
    }
    if (bad >= 0) {
        throw error(SMOL_ERR_BACKEND, "a kernel failed: node " + std::to_string(bad) + " (" +
                                          describe_node(nodes[size_t(bad)]) +
                                          ") reported an error (an injected fault)");
    }
}

void executor::check_node(int32_t node, int32_t barrier) {
    if (node_failed_.load(std::memory_order_relaxed) || faults::hit(faults::site::kernel)) {
        failed_node_.store(node, std::memory_order_relaxed);
        stop_at_.store(barrier, std::memory_order_relaxed);
    }
}

// --- the CPU backend ------------------------------------------------------------

namespace {

class cpu_backend final : public backend {
  public:
    explicit cpu_backend(int n_threads) : exec_(n_threads) {}
    const char * name() const override { return "cpu"; }
    placement where() const override { return placement::host; }
    bool supports_all_reduce() const override { return true; }
    bool reduces_in_process() const override { return true; }
    void * alloc(size_t bytes) override {
        mem_.check("cpu", bytes, "memory");
        void * p = host_alloc(bytes, "host memory");
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
    // The CPU's own memory is as fast to copy as any: nothing to pin.
    void * alloc_host(size_t bytes, bool & pinned, const char * what) override {
        pinned = true;
        return host_.alloc(bytes, what, mem_.stats_);
    }
    void release_host(void * p) override { host_.release(p, mem_.stats_); }
    void set_memory_limit(size_t bytes) override { mem_.stats_.limit = bytes; }
    memory_stats memory() const override { return mem_.stats_; }
    size_t compute_bytes(graph & g) override { return exec_.bytes_for(g); }
    // Copies run inline, in graph order: one memory space, no link to hide.
    void run(graph & g) override {
        exec_.plan(g);
        mem_.set_compute("cpu", exec_.held_bytes());
        exec_.run(g);
    }
    void reserve(graph & g) override {
        exec_.plan(g);
        mem_.set_compute("cpu", exec_.held_bytes());
    }

  private:
    executor exec_;
    memory_ledger mem_;
    host_blocks host_;
};

} // namespace

#if !defined(SMOL_CUDA)
std::unique_ptr<backend> make_cuda_backend(int, const backend_options &) {
    throw error(SMOL_ERR_UNSUPPORTED, "this smol was built without CUDA; configure it with "
                                      "-DSMOL_CUDA=ON on a machine with the CUDA toolkit");
}
// No GPU backend to make, so no GPU group is ever asked for.
void join_gpu_group(const std::vector<backend *> &) {
    throw error(SMOL_ERR_UNSUPPORTED, "this smol was built without CUDA");
}
void abort_gpu_group(const std::vector<backend *> &) {}
#endif

std::unique_ptr<backend> make_backend(const std::string & device, int n_threads,
                                      const backend_options & options) {
    if (device.empty() || device == "cpu") return std::make_unique<cpu_backend>(n_threads);
    if (device == "sim") return make_sim_backend(n_threads);
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
        // Only a GPU reads the options, so only it hears of the overrides.
        backend_options o = options;
        o.host_threads = n_threads;
        apply_env_overrides(o);
        return make_cuda_backend(index, o);
    }
    throw error(SMOL_ERR_INVALID_ARGUMENT,
                "unknown device '" + device + "'; use cpu, sim or cuda:N");
}

} // namespace smol
