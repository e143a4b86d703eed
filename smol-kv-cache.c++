// smol-kv-cache.c++ - the KV cache's cells (declared in smol-kv-cache.h):
// which sequences hold each cell at which position, freeing and sharing
// them, and the search for the cell of a sequence's next token.

#include "smol-kv-cache.h"

#include "smol-error.h"
#include "smol-graph.h"

#include <algorithm>
#include <cstdint>

namespace smol {

// --- KV cache cells -------------------------------------------------------------

// A fresh number, so a cache made where another was (a backend's copy keyed
// by its address) never repeats a version.
void kv_cache::touch() {
    version = fresh_number();
}

void kv_cache::init(int32_t layers, int32_t heads, int32_t dim, int32_t cells) {
    n_layer = layers;
    n_head_kv = heads;
    head_dim = dim;
    n_cells = cells;
    cell_pos.assign(cells, -1);
    cell_seqs.assign(cells, seq_mask::none());
    n_used = 0;
    touch();
}

int32_t kv_cache::n_free() const {
    return int32_t(std::count(cell_pos.begin(), cell_pos.end(), -1));
}

void kv_cache::clear() {
    std::fill(cell_pos.begin(), cell_pos.end(), -1);
    std::fill(cell_seqs.begin(), cell_seqs.end(), seq_mask::none());
    n_used = 0;
    touch();
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
    const seq_mask drop = seq < 0 ? seq_mask::all() : seq_mask::of(seq);
    touch();
    for (int32_t c = 0; c < n_used; ++c) {
        if (cell_pos[c] < p0 || cell_pos[c] >= p1 || !(cell_seqs[c] & drop)) continue;
        cell_seqs[c] &= ~drop;
        if (!cell_seqs[c]) cell_pos[c] = -1;
    }
    shrink_used();
}

void kv_cache::seq_cp(smol_seq_id src, smol_seq_id dst, smol_pos p0, smol_pos p1) {
    if (p1 < 0) p1 = INT32_MAX;
    if (!valid_seq(src) || !valid_seq(dst) || src == dst) return;
    touch();
    for (int32_t c = 0; c < n_used; ++c) {
        if (cell_pos[c] >= p0 && cell_pos[c] < p1 && cell_seqs[c].has(src))
            cell_seqs[c] |= seq_mask::of(dst);
    }
}

int32_t kv_cache::seq_len(smol_seq_id seq) const {
    if (!valid_seq(seq)) return 0;
    int32_t n = 0;
    for (int32_t c = 0; c < n_used; ++c) n += cell_pos[c] >= 0 && cell_seqs[c].has(seq);
    return n;
}

int32_t kv_cache::find_cell(int32_t after, int32_t & page_from, int32_t & cell_from) const {
    auto page_free = [&](int32_t pg) {
        const int32_t c0 = pg * kv_page, c1 = std::min(n_cells, c0 + kv_page);
        for (int32_t c = c0; c < c1; ++c)
            if (cell_pos[c] >= 0) return false;
        return true;
    };
    const int32_t next = after + 1;
    if (after >= 0 && next < n_cells && cell_pos[next] < 0 &&
        (next % kv_page != 0 || page_free(next / kv_page)))
        return next;
    const int32_t n_pages = (n_cells + kv_page - 1) / kv_page;
    for (; page_from < n_pages; ++page_from)
        if (page_free(page_from)) return page_from * kv_page;
    for (; cell_from < n_cells; ++cell_from)
        if (cell_pos[cell_from] < 0) return cell_from;
    return -1;
}

void kv_cache::cells_add_seq(const int32_t * cells, int32_t n, smol_seq_id seq) {
    SMOL_ASSERT_MSG(valid_seq(seq), "cells_add_seq: sequence out of range");
    touch();
    for (int32_t i = 0; i < n; ++i) {
        SMOL_ASSERT_MSG(cell_pos[cells[i]] >= 0, "cells_add_seq: the cell is free");
        cell_seqs[cells[i]] |= seq_mask::of(seq);
    }
}

void kv_cache::cells_rm_seq(const int32_t * cells, int32_t n, smol_seq_id seq) {
    SMOL_ASSERT_MSG(valid_seq(seq), "cells_rm_seq: sequence out of range");
    touch();
    for (int32_t i = 0; i < n; ++i) {
        const int32_t c = cells[i];
        cell_seqs[c] &= ~seq_mask::of(seq);
        if (!cell_seqs[c]) cell_pos[c] = -1;
    }
    shrink_used();
}

} // namespace smol
