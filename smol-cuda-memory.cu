// smol-cuda-memory.cu - the GPU backend's memory: device allocations under
// the optional limit, pinned host memory (pageable where the system refuses
// to lock more), copies, the buffers that grow (arena, work space, staging),
// and the staging of a graph's host inputs and of the cache's cell table.

#include "smol-cuda.cuh"

namespace smol::gpu {

void cuda_backend::charge(size_t n, const char * what) {
    if (mem_.limit && mem_.in_use + n > mem_.limit) {
        throw error(SMOL_ERR_OUT_OF_MEMORY,
                    name_ + ": cannot allocate " + std::to_string(n >> 20) + " MiB of " + what +
                        ": " + std::to_string(mem_.in_use >> 20) + " MiB of the " +
                        std::to_string(mem_.limit >> 20) +
                        " MiB budget are in use; raise --gpu-mem or lower the context or batch");
    }
    mem_.in_use += n;
    mem_.peak = std::max(mem_.peak, mem_.in_use);
}

void * cuda_backend::alloc(size_t bytes) {
    activate();
    charge(bytes, "device memory");
    void * p = nullptr;
    const bool injected = faults::hit(faults::site::device_alloc);
    const cudaError_t e =
        injected ? cudaErrorMemoryAllocation : cudaMalloc(&p, std::max<size_t>(bytes, 256));
    if (e != cudaSuccess) {
        mem_.in_use -= bytes;
        (void)cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        (void)cudaMemGetInfo(&free_b, &total_b);
        throw error(SMOL_ERR_OUT_OF_MEMORY,
                    name_ + ": cannot allocate " + std::to_string(bytes >> 20) +
                        " MiB of device memory (" + std::to_string(free_b >> 20) + " of " +
                        std::to_string(total_b >> 20) + " MiB free" +
                        (injected ? ", refused by an injected fault" : "") +
                        "); use a smaller context or model");
    }
    sizes_[p] = bytes;
    return p;
}

void cuda_backend::release(void * p) {
    if (!p) return;
    activate();
    SMOL_GPU_CHECK(cudaStreamSynchronize(stream_));
    SMOL_GPU_CHECK(cudaFree(p));
    if (const auto it = sizes_.find(p); it != sizes_.end()) {
        mem_.in_use -= it->second;
        sizes_.erase(it);
    }
}

// Host memory that copies use (offloaded KV, a step's logits) in
// page-locked memory, so copies run at the link's speed and can be captured
// in CUDA graphs; where the system refuses to lock that much, pageable
// memory, said aloud (its copies are several times slower).
void * cuda_backend::alloc_host(size_t bytes, bool & pinned, const char * what) {
    activate();
    void * p = nullptr;
    const cudaError_t e =
        faults::hit(faults::site::host_pinned)
            ? cudaErrorMemoryAllocation
            : cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocPortable);
    if (e == cudaSuccess) {
        pinned = true;
        mem_.host_pinned += bytes;
        host_[p] = {bytes, true};
        return p;
    }
    (void)cudaGetLastError();
    log_warn(name_ + ": cannot pin " + std::to_string(bytes >> 20) + " MiB of host memory for " +
             what + " (" + cudaGetErrorString(e) + "; " + std::to_string(mem_.host_pinned >> 20) +
             " MiB pinned so far); using pageable memory, whose copies are several times slower "
             "(raise the locked-memory limit, ulimit -l, or lower the context)");
    p = std::aligned_alloc(4096, align_up(std::max<size_t>(bytes, 1), 4096));
    if (!p) {
        throw error(SMOL_ERR_OUT_OF_MEMORY, name_ + ": cannot allocate " +
                                                std::to_string(bytes >> 20) +
                                                " MiB of host memory for " + what);
    }
    pinned = false;
    mem_.host_pageable += bytes;
    host_[p] = {bytes, false};
    return p;
}

void cuda_backend::release_host(void * p) {
    if (!p) return;
    activate();
    SMOL_GPU_CHECK(cudaStreamSynchronize(stream_));
    const auto it = host_.find(p);
    if (it == host_.end()) return;
    if (it->second.second) {
        mem_.host_pinned -= it->second.first;
        SMOL_GPU_CHECK(cudaFreeHost(p));
    } else {
        mem_.host_pageable -= it->second.first;
        std::free(p);
    }
    host_.erase(it);
}

// Copies go through the backend's stream, so they are ordered after any
// graph still running, and wait for completion before returning.
void cuda_backend::upload(void * dst, const void * src, size_t bytes) {
    activate();
    SMOL_GPU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    SMOL_GPU_CHECK(cudaStreamSynchronize(stream_));
}

void cuda_backend::download(void * dst, const void * src, size_t bytes) {
    activate();
    SMOL_GPU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    SMOL_GPU_CHECK(cudaStreamSynchronize(stream_));
}

void cuda_backend::memset(void * dst, int value, size_t bytes) {
    activate();
    SMOL_GPU_CHECK(cudaMemsetAsync(dst, value, bytes, stream_));
    SMOL_GPU_CHECK(cudaStreamSynchronize(stream_));
}

void cuda_backend::grow(buffer & b, size_t bytes, const char * what) {
    if (bytes <= b.size) return;
    SMOL_GPU_CHECK(cudaStreamSynchronize(stream_));
    // Captured graphs may point into the old buffer.
    drop_graphs();
    if (b.p) SMOL_GPU_CHECK(cudaFree(b.p));
    mem_.in_use -= b.size;
    b.p = nullptr;
    b.size = 0;
    const size_t n = align_up(bytes, size_t(1) << 16);
    charge(n, what);
    const bool injected = faults::hit(faults::site::device_alloc);
    const cudaError_t e = injected ? cudaErrorMemoryAllocation : cudaMalloc(&b.p, n);
    if (e != cudaSuccess) {
        mem_.in_use -= n;
        (void)cudaGetLastError();
        b.p = nullptr;
        throw error(SMOL_ERR_OUT_OF_MEMORY,
                    name_ + ": cannot allocate " + std::to_string(n >> 20) + " MiB of " + what +
                        (injected ? " (refused by an injected fault)" : ""));
    }
    b.size = n;
}

void cuda_backend::grow_host(size_t bytes) {
    if (bytes <= host_stage_size_) return;
    SMOL_GPU_CHECK(cudaStreamSynchronize(stream_));
    if (host_stage_) SMOL_GPU_CHECK(cudaFreeHost(host_stage_));
    host_stage_ = nullptr;
    host_stage_size_ = 0;
    const size_t n = align_up(bytes, size_t(1) << 16);
    SMOL_GPU_CHECK(cudaMallocHost(&host_stage_, n));
    host_stage_size_ = n;
}

namespace {

// The summary of cells [c0, c0 + 64) (those past the table count as unused).
cell_tile tile_of(const kv_cache & kv, int64_t c0) {
    cell_tile t{seq_mask::none(), seq_mask::all(), INT32_MAX, -1, 0, 0};
    const int64_t c1 = std::min<int64_t>(c0 + cell_tile_cells, kv.n_cells);
    for (int64_t c = c0; c < c1; ++c) {
        const int32_t cp = kv.cell_pos[size_t(c)];
        if (cp < 0) continue;
        const seq_mask cs = kv.cell_seqs[size_t(c)];
        t.seq_or |= cs;
        t.seq_and &= cs;
        t.min_pos = std::min(t.min_pos, cp);
        t.max_pos = std::max(t.max_pos, cp);
        ++t.n_used;
    }
    return t;
}

} // namespace

// The pages (tiles of cell_tile_cells cells) each sequence of the batch
// holds, in cell order, from their summaries: pages_begin_ bounds each
// sequence's page numbers in seq_pages_ (staged after the bounds). No page
// past the one that holds cell n_used - 1 is listed: the decode kernel
// stops a warp at the first tile that begins past n_used, which only the
// last tile of a list can.
void cuda_backend::list_seq_pages(const batch_info & b, const kv_cache & kv) {
    seq_mask in_batch = seq_mask::none();
    for (int32_t i = 0; b.seq && i < b.n_tokens; ++i) in_batch |= seq_mask::of(b.seq[i]);
    group_by_seq((kv.n_used + cell_tile_cells - 1) / cell_tile_cells,
                 [&](int32_t pg) { return tiles_[size_t(pg)].seq_or & in_batch; },
                 [](int32_t pg) { return pg; }, pages_begin_, seq_pages_, fill_);
}

// Copies what the graph reads from host memory into one device block: the
// batch (positions, sequences, cells), n_used, and every leaf that lives in
// host memory, whose data pointer is swapped for the copy's until run ends.
// Only the cells of the cache table that changed since the last run travel.
void cuda_backend::stage(graph & g) {
    const batch_info & b = g.batch;
    const int32_t n_tok = b.pos ? b.n_tokens : 0;
    std::vector<tensor *> leaves;
    for (tensor * t : g.nodes()) {
        for (tensor * s : t->src) {
            if (s && s->kind == OP_NONE && s->where == placement::host && s->data &&
                std::find(leaves.begin(), leaves.end(), s) == leaves.end()) {
                leaves.push_back(s);
            }
        }
    }
    // The cache cells [lo, hi) whose position or sequence changed: with the
    // cache's version unchanged, among the batch's own cells; else anywhere.
    const kv_cache * kv = b.kv;
    int32_t lo = 0, hi = 0;
    if (kv) {
        if (shadow_kv_ != kv || shadow_pos_.size() != size_t(kv->n_cells)) {
            shadow_kv_ = kv;
            shadow_pos_.assign(size_t(kv->n_cells), INT32_MIN);
            shadow_seqs_.assign(size_t(kv->n_cells), seq_mask::all());
            shadow_version_ = ~uint64_t(0); // no version: compare every cell
            tiles_.assign(size_t((kv->n_cells + cell_tile_cells - 1) / cell_tile_cells),
                          cell_tile{seq_mask::none(), seq_mask::all(), INT32_MAX, -1, 0, 0});
            tiles_lo_ = INT32_MAX;
            tiles_hi_ = 0;
        }
        auto changed = [&](int32_t c) {
            if (kv->cell_pos[size_t(c)] >= 0) held_ |= kv->cell_seqs[size_t(c)];
            if (kv->cell_pos[size_t(c)] != shadow_pos_[size_t(c)] ||
                kv->cell_seqs[size_t(c)] != shadow_seqs_[size_t(c)]) {
                lo = std::min(lo, c);
                hi = std::max(hi, c + 1);
            }
        };
        lo = kv->n_used;
        if (shadow_version_ == kv->version && b.cell) {
            for (int32_t i = 0; i < n_tok; ++i) changed(b.cell[i]);
        } else {
            held_ = seq_mask::none();
            for (int32_t c = 0; c < kv->n_used; ++c) changed(c);
            shadow_version_ = kv->version;
        }
        if (hi < lo) hi = lo;
    }
    const size_t cell_bytes = size_t(hi - lo) * sizeof(int32_t);
    const size_t mask_bytes = size_t(hi - lo) * sizeof(seq_mask);
    // The tiles that hold a changed cell, summarised when an attention
    // kernel will read them.
    if (hi > lo) {
        tiles_lo_ = std::min(tiles_lo_, lo);
        tiles_hi_ = std::max(tiles_hi_, hi);
    }
    pages_ = kv && held_.several(); // cells of several sequences in use
    int32_t t_lo = 0, t_hi = 0;
    if (kv && (flash_steps_ || (decode_steps_ && pages_)) && tiles_hi_ > tiles_lo_) {
        t_lo = tiles_lo_ / cell_tile_cells;
        t_hi = int32_t((std::min<int64_t>(tiles_hi_, kv->n_cells) + cell_tile_cells - 1) /
                       cell_tile_cells);
        tiles_lo_ = INT32_MAX;
        tiles_hi_ = 0;
        for (int32_t i = t_lo; i < t_hi; ++i)
            tiles_[size_t(i)] = tile_of(*kv, int64_t(i) * cell_tile_cells);
    }
    const size_t tile_bytes = size_t(t_hi - t_lo) * sizeof(cell_tile);
    // The decode kernel over pages walks each token's sequence's pages, from
    // the summaries (exact once the changed ones are made above).
    const bool lists = kv && decode_steps_ && pages_;
    if (lists) list_seq_pages(b, *kv);

    const size_t tok_bytes = align_up(size_t(n_tok) * sizeof(int32_t), 256);
    size_t off = 256 + 4 * tok_bytes;
    std::vector<size_t> leaf_off(leaves.size());
    for (size_t i = 0; i < leaves.size(); ++i) {
        leaf_off[i] = off;
        off = align_up(off + leaves[i]->nbytes(), 256);
    }
    const size_t pages_off = off;
    const size_t begin_bytes = pages_begin_.size() * sizeof(int32_t);
    if (lists) off = align_up(off + begin_bytes + seq_pages_.size() * sizeof(int32_t), 256);
    const size_t dyn_bytes = off;
    // The window store's table, whole.
    const kv_cache * wk = b.local ? b.local->kv : nullptr;
    const size_t w_used = wk ? size_t(wk->n_used) : 0;
    const size_t w_pos_bytes = align_up(w_used * sizeof(int32_t), 8);
    const size_t w_at = dyn_bytes + align_up(cell_bytes, 8) + mask_bytes + tile_bytes;
    grow(dyn_, dyn_bytes, "input staging");
    SMOL_GPU_CHECK(cudaEventSynchronize(staged_)); // the pinned buffer is free again
    grow_host(w_at + w_pos_bytes + w_used * sizeof(seq_mask));

    uint8_t * h = static_cast<uint8_t *>(host_stage_);
    uint8_t * d = static_cast<uint8_t *>(dyn_.p);
    int32_t * params = reinterpret_cast<int32_t *>(h);
    params[0] = kv ? kv->n_used : 0;
    params[1] = n_tok;
    params[2] = int32_t(w_used);
    if (n_tok > 0) {
        std::memcpy(h + 256, b.pos, size_t(n_tok) * sizeof(int32_t));
        std::memcpy(h + 256 + tok_bytes, b.seq, size_t(n_tok) * sizeof(int32_t));
        if (b.cell) std::memcpy(h + 256 + 2 * tok_bytes, b.cell, size_t(n_tok) * sizeof(int32_t));
        if (wk && b.local->cell) {
            std::memcpy(h + 256 + 3 * tok_bytes, b.local->cell, size_t(n_tok) * sizeof(int32_t));
        }
    }
    for (size_t i = 0; i < leaves.size(); ++i) {
        std::memcpy(h + leaf_off[i], leaves[i]->data, leaves[i]->nbytes());
    }
    if (lists) {
        std::memcpy(h + pages_off, pages_begin_.data(), begin_bytes);
        std::memcpy(h + pages_off + begin_bytes, seq_pages_.data(),
                    seq_pages_.size() * sizeof(int32_t));
    }
    SMOL_GPU_CHECK(cudaMemcpyAsync(d, h, dyn_bytes, cudaMemcpyHostToDevice, stream_));
    d_seq_pages_ = lists ? reinterpret_cast<int32_t *>(d + pages_off) : nullptr;
    d_params_ = reinterpret_cast<int32_t *>(d);
    d_pos_ = reinterpret_cast<int32_t *>(d + 256);
    d_seq_ = reinterpret_cast<int32_t *>(d + 256 + tok_bytes);
    d_cell_ = reinterpret_cast<int32_t *>(d + 256 + 2 * tok_bytes);
    d_slot_ = reinterpret_cast<int32_t *>(d + 256 + 3 * tok_bytes);
    if (wk) {
        uint8_t * table = static_cast<uint8_t *>(win_cells_.p);
        d_win_pos_ = reinterpret_cast<int32_t *>(table);
        d_win_seqs_ = reinterpret_cast<uint64_t *>(table + cell_seqs_offset(wk->n_cells));
    }
    if (w_used > 0) {
        uint8_t * hp = h + w_at;
        std::memcpy(hp, wk->cell_pos.data(), w_used * sizeof(int32_t));
        uint64_t * hw = reinterpret_cast<uint64_t *>(hp + w_pos_bytes);
        for (size_t i = 0; i < w_used; ++i) {
            hw[i] = wk->cell_seqs[i].w[0];
            hw[w_used + i] = wk->cell_seqs[i].w[1];
        }
        SMOL_GPU_CHECK(cudaMemcpyAsync(d_win_pos_, hp, w_used * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, stream_));
        SMOL_GPU_CHECK(cudaMemcpy2DAsync(d_win_seqs_,
                                         seq_plane_words(wk->n_cells) * sizeof(uint64_t), hw,
                                         w_used * sizeof(uint64_t), w_used * sizeof(uint64_t), 2,
                                         cudaMemcpyHostToDevice, stream_));
    }
    if (kv) {
        uint8_t * table = static_cast<uint8_t *>(cells_.p);
        d_cell_pos_ = reinterpret_cast<int32_t *>(table);
        d_cell_seqs_ = reinterpret_cast<uint64_t *>(table + cell_seqs_offset(kv->n_cells));
        d_cell_tiles_ = reinterpret_cast<cell_tile *>(table + cell_tiles_offset(kv->n_cells));
        uint8_t * hp = h + dyn_bytes;
        uint8_t * hm = hp + align_up(cell_bytes, 8);
        if (t_hi > t_lo) {
            cell_tile * ht = reinterpret_cast<cell_tile *>(hm + mask_bytes);
            std::copy(tiles_.begin() + t_lo, tiles_.begin() + t_hi, ht);
            SMOL_GPU_CHECK(cudaMemcpyAsync(d_cell_tiles_ + t_lo, ht, tile_bytes,
                                           cudaMemcpyHostToDevice, stream_));
        }
        if (hi > lo) {
            std::memcpy(hp, kv->cell_pos.data() + lo, cell_bytes);
            // The masks' words as the device keeps them: two planes.
            uint64_t * hw = reinterpret_cast<uint64_t *>(hm);
            const size_t n = size_t(hi - lo);
            for (size_t i = 0; i < n; ++i) {
                hw[i] = kv->cell_seqs[size_t(lo) + i].w[0];
                hw[n + i] = kv->cell_seqs[size_t(lo) + i].w[1];
            }
            SMOL_GPU_CHECK(
                cudaMemcpyAsync(d_cell_pos_ + lo, hp, cell_bytes, cudaMemcpyHostToDevice, stream_));
            SMOL_GPU_CHECK(cudaMemcpy2DAsync(
                d_cell_seqs_ + lo, seq_plane_words(kv->n_cells) * sizeof(uint64_t), hw,
                n * sizeof(uint64_t), n * sizeof(uint64_t), 2, cudaMemcpyHostToDevice, stream_));
            std::copy(kv->cell_pos.begin() + lo, kv->cell_pos.begin() + hi,
                      shadow_pos_.begin() + lo);
            std::copy(kv->cell_seqs.begin() + lo, kv->cell_seqs.begin() + hi,
                      shadow_seqs_.begin() + lo);
        }
    }
    SMOL_GPU_CHECK(cudaEventRecord(staged_, stream_));
    swapped_.clear();
    for (size_t i = 0; i < leaves.size(); ++i) {
        swapped_.push_back({leaves[i], leaves[i]->data});
        leaves[i]->data = d + leaf_off[i];
    }
}

void cuda_backend::restore_leaves() {
    for (auto & [t, p] : swapped_) t->data = p;
    swapped_.clear();
}

} // namespace smol::gpu
