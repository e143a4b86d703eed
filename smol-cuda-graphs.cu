// smol-cuda-graphs.cu - the GPU backend's replay of repeated steps as CUDA
// graphs: a graph's structure and the signature a replay depends on (the
// addresses its kernels were given), and dropping the captured graphs. The
// capture itself (cuda_backend::capture_graph, a template that the run and
// the autotune use) is in smol-cuda.cuh.

#include "smol-cuda.cuh"

namespace smol::gpu {

void cuda_backend::drop_graphs() {
    for (auto & c : execs_) (void)cudaGraphExecDestroy(c.exec);
    execs_.clear();
    prev_sig_.clear();
    prepared_ = false; // the steps may have chosen kernels by the old table
    replayed_ = -1;
}

// The words that decide what prepare makes of a graph, and so what a
// captured graph launches: every node's op, shape, sources (a node by its
// index, a leaf by its memory), views, copies, ordering and parameters, and
// whether the batch's tokens are of different sequences. Positions,
// sequences and cells are not in it: kernels read them from device memory.
void cuda_backend::structure(const graph & g) {
    sig_.clear();
    auto put = [&](uint64_t v) { sig_.push_back(v); };
    auto ptr = [&](const void * p) { put(uint64_t(reinterpret_cast<uintptr_t>(p))); };
    auto index = [](const tensor * t) { return t ? uint64_t(uint32_t(t->node_index)) : ~0ull; };
    put(g.nodes().size());
    put(seqs_apart(g.batch));
    for (const tensor * t : g.nodes()) {
        // What most nodes lack (a view of the cache, a copy, ordering
        // dependencies, memory of their own) is written only where present,
        // and the first word says which.
        const bool view = t->kv.k || t->kv.v, copy = t->kind == OP_COPY,
                   deps = t->deps[0] || t->deps[1], data = t->data;
        put(uint64_t(t->kind) | uint64_t(t->on_host) << 5 | uint64_t(t->type) << 8 |
            uint64_t(t->where) << 16 | uint64_t(view) << 24 | uint64_t(copy) << 25 |
            uint64_t(deps) << 26 | uint64_t(data) << 27 | index(t->view_of) << 32);
        for (int d = 0; d < 4; ++d) put(uint64_t(t->ne[d]) ^ (uint64_t(t->nb[d]) << 40));
        for (const tensor * s : t->src) {
            if (!s) {
                put(0);
            } else if (s->node_index >= 0) {
                put(uint64_t(uint32_t(s->node_index)) << 8 | 1);
            } else {
                ptr(s->data);
                put(uint64_t(s->type) | uint64_t(s->where) << 8);
                put(uint64_t(s->ne[0]) ^ (uint64_t(s->ne[1]) << 32));
                put(s->nb[1]);
            }
        }
        put(uint64_t(uint32_t(t->iparams[0])) | uint64_t(uint32_t(t->iparams[1])) << 32);
        put(uint64_t(uint32_t(t->iparams[2])) | uint64_t(uint32_t(t->iparams[3])) << 32);
        put(uint64_t(uint32_t(t->iparams[4])) | uint64_t(uint32_t(t->iparams[5])) << 32);
        uint64_t f;
        std::memcpy(&f, t->fparams, sizeof(f));
        put(f);
        if (data) ptr(t->data);
        if (view) {
            ptr(t->kv.k);
            ptr(t->kv.v);
            put(t->kv.head_stride);
            put(uint64_t(uint32_t(t->kv.h0)) | uint64_t(uint32_t(t->kv.h1)) << 32);
            put(uint32_t(t->kv.slot));
        }
        if (copy) {
            put(t->copy.width);
            put(t->copy.height);
            put(t->copy.dpitch ^ (t->copy.spitch << 1) ^ (uint64_t(t->copy.dir) << 62));
            put(t->copy.offset);
        }
        if (deps) {
            put(index(t->deps[0]));
            put(index(t->deps[1]));
        }
    }
    const kv_cache * kv = g.batch.kv;
    ptr(kv ? kv->k : nullptr);
    ptr(kv ? kv->v : nullptr);
    put(kv ? uint64_t(kv->n_cells) : 0);
}

// Everything a captured graph depends on: the structure, then the memory
// its kernels were given (the arena holds every intermediate at the plan's
// offsets) and the form the cache's sequences chose.
void cuda_backend::signature() {
    auto ptr = [&](const void * p) { sig_.push_back(uint64_t(reinterpret_cast<uintptr_t>(p))); };
    ptr(arena_.p);
    ptr(d_params_);
    ptr(d_cell_pos_);
    ptr(d_win_pos_);
    ptr(work_.p);
    ptr(rope_.p);
    ptr(done_.p);
    sig_.push_back(pages_);
}

} // namespace smol::gpu
