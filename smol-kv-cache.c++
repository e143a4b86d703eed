// smol-kv-cache.c++ - the KV cache (declared in smol-kv-cache.h): its cells
// (which sequences hold each cell at which position, freeing and sharing
// them, the search for the cell of a sequence's next token), the window
// store of sliding-window layers (slots taken and given back) and the
// placement of its head groups (their storage by the plan, the staging
// slots, the PREFETCH and OFFLOAD copy nodes of a step's graph).

#include "smol-kv-cache.h"

#include "smol-backend.h"
#include "smol-error.h"
#include "smol-graph.h"
#include "smol-plan.h"
#include "smol-quant.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace smol {

// --- KV cache cells -------------------------------------------------------------

// A fresh number, so a cache made where another was (a backend's copy keyed
// by its address) never repeats a version.
void kv_cache::touch() {
    version = fresh_number();
}

size_t kv_row_bytes(smol_type t, int32_t head_dim) {
    return type_row_bytes(t, head_dim);
}

int32_t kv_rot_k(smol_type t, int32_t head_dim) {
    if (t == SMOL_TYPE_F16 || head_dim % 64 != 0) return 0;
    int32_t len = 64;
    while (head_dim % (2 * len) == 0) len *= 2;
    return len;
}

int32_t kv_rot_v(smol_type t, int32_t head_dim) {
    return t == SMOL_TYPE_F16 || head_dim % 64 != 0 ? 0 : 64;
}

// In place, butterflies of growing span, then the 1/sqrt(len) that makes
// the matrix orthonormal.
void kv_rotate(float * x, int64_t n, int32_t len) {
    if (len <= 0) return;
    const float norm = 1.0f / std::sqrt(float(len));
    for (int64_t r = 0; r < n; r += len) {
        float * y = x + r;
        for (int32_t h = 1; h < len; h *= 2) {
            for (int32_t i = 0; i < len; i += 2 * h) {
                for (int32_t j = i; j < i + h; ++j) {
                    const float a = y[j], b = y[j + h];
                    y[j] = a + b;
                    y[j + h] = a - b;
                }
            }
        }
        for (int32_t i = 0; i < len; ++i) y[i] *= norm;
    }
}

void kv_cache::init(int32_t layers, int32_t heads, int32_t dim, int32_t cells, smol_type t) {
    n_layer = layers;
    n_head_kv = heads;
    head_dim = dim;
    type = t;
    row_words = int32_t(kv_row_bytes(t, dim) / sizeof(uint16_t));
    rot_k = kv_rot_k(t, dim);
    rot_v = kv_rot_v(t, dim);
    n_cells = cells;
    cell_pos.assign(cells, -1);
    cell_seqs.assign(cells, seq_mask::none());
    n_used = 0;
    touch();
}

int32_t kv_cache::n_free() const {
    // Past n_used every cell is free.
    return n_cells - n_used + int32_t(std::count(cell_pos.begin(), cell_pos.begin() + n_used, -1));
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

int32_t kv_cache::n_free_pages() const {
    const int32_t n_pages = (n_cells + kv_page - 1) / kv_page;
    const int32_t used_pages = (n_used + kv_page - 1) / kv_page;
    int32_t n = n_pages - used_pages; // past n_used every cell is free
    for (int32_t pg = 0; pg < used_pages; ++pg) {
        const int32_t c0 = pg * kv_page, c1 = std::min(n_cells, c0 + kv_page);
        int32_t c = c0;
        while (c < c1 && cell_pos[size_t(c)] < 0) ++c;
        n += c == c1;
    }
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

// --- the window store ------------------------------------------------------------

int32_t kv_window::slots_needed(int32_t n_cells, int32_t n_seq_max, int32_t window, int32_t reserve,
                                int32_t n_batch, int32_t sink) {
    const int64_t n =
        int64_t(std::max(n_seq_max, 1)) * (int64_t(sink) + window + reserve) + n_batch;
    return int32_t(std::min<int64_t>(n_cells, n));
}

void kv_window::init(const kv_cache & kv, int32_t w, int32_t r, int32_t n_slots, int32_t snk) {
    window = w;
    reserve = r;
    sink = snk;
    // The cache's shape and kind (whatever a cell's row holds), n_slots
    // cells, all free.
    table = kv;
    table.n_cells = n_slots;
    table.cell_pos.assign(size_t(n_slots), -1);
    table.cell_seqs.assign(size_t(n_slots), seq_mask::none());
    table.n_used = 0;
    table.touch();
    slot_cell.assign(size_t(n_slots), -1);
    cell_slot.assign(size_t(kv.n_cells), -1);
    newest.assign(kv_max_seqs, -1);
    lost.assign(kv_max_seqs, -1);
    next_free_ = 0;
    synced = kv.version;
}

void kv_window::free_slot(int32_t s) {
    const int32_t c = slot_cell[size_t(s)];
    if (c >= 0) cell_slot[size_t(c)] = -1;
    slot_cell[size_t(s)] = -1;
    table.cell_pos[size_t(s)] = -1;
    table.cell_seqs[size_t(s)] = seq_mask::none();
    next_free_ = std::min(next_free_, s);
}

void kv_window::sync(const kv_cache & kv) {
    for (int32_t s = 0; s < table.n_used; ++s) {
        const int32_t c = slot_cell[size_t(s)];
        if (c < 0) continue;
        if (kv.cell_pos[size_t(c)] < 0) {
            free_slot(s);
            continue;
        }
        table.cell_pos[size_t(s)] = kv.cell_pos[size_t(c)];
        table.cell_seqs[size_t(s)] = kv.cell_seqs[size_t(c)];
    }
    while (table.n_used > 0 && table.cell_pos[size_t(table.n_used - 1)] < 0) --table.n_used;
    std::fill(newest.begin(), newest.end(), -1);
    std::fill(lost.begin(), lost.end(), -1);
    for (int32_t c = 0; c < kv.n_used; ++c) {
        const smol_pos p = kv.cell_pos[size_t(c)];
        if (p < 0) continue;
        for (seq_mask m = kv.cell_seqs[size_t(c)]; m; m = m.rest()) {
            const size_t q = size_t(m.first());
            newest[q] = std::max(newest[q], p);
            if (cell_slot[size_t(c)] < 0) lost[q] = std::max(lost[q], p);
        }
    }
    table.touch();
    synced = kv.version;
}

void kv_window::release_old(const kv_cache & kv) {
    bool any = false;
    for (int32_t s = 0; s < table.n_used; ++s) {
        const int32_t c = slot_cell[size_t(s)];
        if (c < 0) continue;
        const smol_pos p = kv.cell_pos[size_t(c)];
        // Sinks stay while an active sequence holds them (a prefix cache's
        // texts would otherwise keep theirs past the store's sizing).
        bool keep = p < sink && bool(kv.cell_seqs[size_t(c)] & ~passive);
        for (seq_mask m = kv.cell_seqs[size_t(c)] & ~passive; m && !keep; m = m.rest())
            keep = int64_t(p) > int64_t(newest[size_t(m.first())]) - window - reserve;
        if (keep) continue;
        for (seq_mask m = kv.cell_seqs[size_t(c)]; m; m = m.rest())
            lost[size_t(m.first())] = std::max(lost[size_t(m.first())], p);
        free_slot(s);
        any = true;
    }
    if (!any) return;
    while (table.n_used > 0 && table.cell_pos[size_t(table.n_used - 1)] < 0) --table.n_used;
    table.touch();
}

int32_t kv_window::take(int32_t c, smol_pos pos, smol_seq_id seq) {
    while (next_free_ < table.n_cells && slot_cell[size_t(next_free_)] >= 0) ++next_free_;
    if (next_free_ >= table.n_cells) return -1;
    const int32_t s = next_free_++;
    slot_cell[size_t(s)] = c;
    cell_slot[size_t(c)] = s;
    table.cell_pos[size_t(s)] = pos;
    table.cell_seqs[size_t(s)] = seq_mask::of(seq);
    table.n_used = std::max(table.n_used, s + 1);
    newest[size_t(seq)] = std::max(newest[size_t(seq)], pos);
    return s;
}

int32_t kv_window::n_held(const kv_cache & kv) const {
    int32_t n = 0;
    for (int32_t s = 0; s < table.n_used; ++s) {
        const int32_t c = slot_cell[size_t(s)];
        n += c >= 0 && kv.cell_pos[size_t(c)] >= 0;
    }
    return n;
}

bool kv_window::holds(const int32_t * cells, int32_t n) const {
    for (int32_t i = 0; i < n; ++i)
        if (cell_slot[size_t(cells[i])] < 0) return false;
    return true;
}

// --- placement: storage --------------------------------------------------------

kv_placement::~kv_placement() {
    for (void * p : owned_) be_->release(p);
    for (void * p : owned_host_) be_->release_host(p);
}

// Resident groups in one device block, the two staging slots in another,
// offloaded groups in host arenas of up to host_arena_bytes, each group one
// contiguous [K][V] block.
void kv_placement::alloc(backend & be, int32_t n_head) {
    constexpr uint64_t host_arena_bytes = 4ull << 30;
    be_ = &be;
    const uint64_t gb = plan_.group_bytes();
    const int32_t n_groups = plan_.n_layer * plan_.n_group;
    group_base_.assign(size_t(n_groups), nullptr);
    if (const uint64_t res = plan_.resident_kv_bytes(); res > 0) {
        uint8_t * base = static_cast<uint8_t *>(be.alloc(res));
        owned_.push_back(base);
        be.memset(base, 0, res);
        uint64_t at = 0;
        for (int32_t i = 0; i < n_groups; ++i) {
            if (!plan_.resident[size_t(i)]) continue;
            group_base_[size_t(i)] = reinterpret_cast<uint16_t *>(base + at);
            at += plan_.group_bytes_at(i / plan_.n_group, i % plan_.n_group);
        }
    }
    if (plan_.n_slots > 0) {
        uint8_t * base = static_cast<uint8_t *>(be.alloc(2 * gb));
        owned_.push_back(base);
        be.memset(base, 0, 2 * gb);
        slots_[0] = reinterpret_cast<uint16_t *>(base);
        slots_[1] = reinterpret_cast<uint16_t *>(base + gb);
    }
    if (plan_.n_host_groups() > 0) {
        // One block: q and the output (n_head heads), k and v (n_head_kv).
        const size_t hd4 = size_t(kv_.head_dim) * sizeof(float) * size_t(kv_host_max_tokens);
        host_q_bytes_ = (size_t(n_head) * hd4 + 255) / 256 * 256;
        host_kv_bytes_ = (size_t(plan_.n_head_kv) * hd4 + 255) / 256 * 256;
        bool pinned = false;
        auto * p = static_cast<uint8_t *>(be.alloc_host(2 * (host_q_bytes_ + host_kv_bytes_),
                                                        pinned, "the host attention's buffers"));
        owned_host_.push_back(p);
        host_q_ = p;
        host_out_ = p + host_q_bytes_;
        host_k_ = p + 2 * host_q_bytes_;
        host_v_ = p + 2 * host_q_bytes_ + host_kv_bytes_;
    }
    const uint64_t per_arena = std::max<uint64_t>(1, host_arena_bytes / gb);
    int32_t left = plan_.n_offloaded_groups();
    uint8_t * arena = nullptr;
    uint64_t arena_left = 0;
    for (int32_t i = 0; i < n_groups; ++i) {
        if (plan_.resident[size_t(i)]) continue;
        if (arena_left == 0) {
            const uint64_t n = std::min<uint64_t>(per_arena, uint64_t(left));
            bool pinned = false;
            arena = static_cast<uint8_t *>(be.alloc_host(n * gb, pinned, "the KV cache"));
            owned_host_.push_back(arena);
            (pinned ? host_pinned_ : host_pageable_) += n * gb;
            // Cells no step has written still meet the attention (times a
            // zero weight): they must hold numbers.
            std::memset(arena, 0, n * gb);
            arena_left = n;
        }
        group_base_[size_t(i)] = reinterpret_cast<uint16_t *>(arena);
        arena += gb;
        --arena_left;
        --left;
    }
}

uint16_t * kv_placement::base_of(int32_t layer, int32_t group) const {
    return group_base_[size_t(layer) * size_t(plan_.n_group) + size_t(group)];
}

kv_view kv_placement::group_view(int32_t layer, int32_t group, int32_t slot) const {
    kv_view v;
    if (group_base_.empty()) { // while planning: the graph's shape only
        v.h0 = group * plan_.G;
        v.h1 = v.h0 + plan_.G;
        return v;
    }
    uint16_t * base = slot >= 0 ? slots_[slot] : base_of(layer, group);
    v.head_stride = size_t(kv_.n_cells) * size_t(kv_.row_words);
    v.k = base;
    if (plan_.is_windowed(layer, group)) { // the window store's slots
        v.head_stride = v.head_stride / size_t(kv_.n_cells) * size_t(plan_.window_cells);
        v.local = true;
    }
    v.v = base + size_t(plan_.G) * v.head_stride;
    v.h0 = group * plan_.G;
    v.h1 = v.h0 + plan_.G;
    v.slot = slot;
    return v;
}

// --- placement: a step's copies ------------------------------------------------

kv_copies kv_placement::copies_of(const int32_t * cells, int32_t n) const {
    kv_copies s;
    constexpr int32_t granule = 256; // cells: copy sizes change every 256 tokens, not every one
    s.n_copy = std::min(kv_.n_cells, (std::max(kv_.n_used, 1) + granule - 1) / granule * granule);
    int32_t c0 = kv_.n_cells, c1 = 0;
    for (int32_t i = 0; i < n; ++i) {
        c0 = std::min(c0, cells[i]);
        c1 = std::max(c1, cells[i] + 1);
    }
    // The OFFLOAD takes whole granules too (the slot holds the host's bytes
    // for every prefetched cell it did not write), so a decode step's graph
    // repeats for up to a granule of tokens and replays as a CUDA graph.
    if (c1 > c0) {
        s.c0 = c0 / granule * granule;
        s.c1 = std::min(s.n_copy, (c1 + granule - 1) / granule * granule);
    }
    s.host = n <= kv_host_max_tokens && plan_.n_host_groups() > 0;
    return s;
}

void kv_placement::begin(graph & g, const kv_copies & copies) {
    g_ = &g;
    copies_ = copies;
    int32_t n_streamed = 0;
    for (int32_t l = 0; l < plan_.n_layer; ++l)
        for (int32_t gr = 0; gr < plan_.n_group; ++gr) n_streamed += streamed(l, gr);
    prefetch_.assign(size_t(n_streamed), nullptr);
    offload_.assign(prefetch_.size(), nullptr);
    attend_.assign(prefetch_.size(), nullptr);
    n_met_ = 0;
    next_prefetch_ = 0;
    issued_at_ = -1;
    prefetch_after(0, -1);
}

kv_placement::group_io kv_placement::group(int32_t layer, int32_t group) const {
    if (plan_.is_resident(layer, group)) return {group_view(layer, group, -1), nullptr};
    return {group_view(layer, group, n_met_ % 2), prefetch_[size_t(n_met_)]};
}

void kv_placement::after_store(int32_t layer, int32_t group) {
    prefetch_after(layer, group);
}

void kv_placement::after_attention(int32_t layer, int32_t group, tensor * att, tensor * stored) {
    if (!streamed(layer, group)) return;
    const int32_t o = n_met_++;
    attend_[size_t(o)] = att;
    if (group_base_.empty() || copies_.c1 <= copies_.c0) return;
    const size_t row = size_t(kv_.row_words) * sizeof(uint16_t);
    const size_t cells_from = size_t(copies_.c0) * size_t(kv_.row_words);
    copy_desc c;
    c.width = size_t(copies_.c1 - copies_.c0) * row;
    c.height = size_t(2 * plan_.G);
    c.dpitch = c.spitch = size_t(kv_.n_cells) * row;
    c.dir = copy_dir::d2h;
    tensor * t = op_copy_2d(*g_, base_of(layer, group) + cells_from, placement::host_pinned,
                            slots_[o % 2] + cells_from, be_->where(), c, stored, nullptr);
    t->iparams[0] = plan_.first_layer + layer;
    t->iparams[1] = group;
    t->iparams[2] = o % 2;
    offload_[size_t(o)] = t;
}

// The PREFETCH of offloaded group o, (layer, group), into its slot.
void kv_placement::issue_prefetch(int32_t o, int32_t layer, int32_t group) {
    if (group_base_.empty()) return;
    const size_t row = size_t(kv_.row_words) * sizeof(uint16_t);
    copy_desc c;
    c.width = size_t(copies_.n_copy) * row;
    c.height = size_t(2 * plan_.G);
    c.dpitch = c.spitch = size_t(kv_.n_cells) * row;
    c.dir = copy_dir::h2d;
    // The slot's last user (group o - 2) must be done with it.
    tensor * t = op_copy_2d(*g_, slots_[o % 2], be_->where(), base_of(layer, group),
                            placement::host_pinned, c, o >= 2 ? attend_[size_t(o - 2)] : nullptr,
                            o >= 2 ? offload_[size_t(o - 2)] : nullptr);
    t->iparams[0] = plan_.first_layer + layer;
    t->iparams[1] = group;
    t->iparams[2] = o % 2;
    prefetch_[size_t(o)] = t;
}

// Issues the PREFETCH of the first offloaded group after (layer, group)
// unless it is out already, or its slot still serves a group whose
// attention and OFFLOAD are not in the graph yet.
void kv_placement::prefetch_after(int32_t layer, int32_t group) {
    if (next_prefetch_ >= int32_t(prefetch_.size()) || next_prefetch_ > n_met_ + 1) return;
    const int32_t from = std::max(layer * plan_.n_group + group, issued_at_) + 1;
    for (int32_t at = from; at < plan_.n_layer * plan_.n_group; ++at) {
        const int32_t l = at / plan_.n_group, gr = at % plan_.n_group;
        if (!streamed(l, gr)) continue;
        issue_prefetch(next_prefetch_++, l, gr);
        issued_at_ = at;
        return;
    }
}

// --- placement: host attention ----------------------------------------------------

bool kv_placement::on_host(int32_t layer, int32_t group) const {
    return !group_base_.empty() && copies_.host && plan_.is_on_host(layer, group);
}

bool kv_placement::streamed(int32_t layer, int32_t group) const {
    return !plan_.is_resident(layer, group) && !on_host(layer, group);
}

tensor * kv_placement::host_layer(int32_t layer, tensor * q, tensor * k, tensor * v,
                                  const attn_opts & opts, tensor * att) {
    tensor *qh = nullptr, *kh = nullptr, *vh = nullptr;
    for (int32_t gr = 0; gr < plan_.n_group; ++gr) {
        if (!on_host(layer, gr)) continue;
        if (!qh) {
            qh = op_copy_to_host(*g_, q, host_q_);
            kh = op_copy_to_host(*g_, k, host_k_);
            vh = op_copy_to_host(*g_, v, host_v_);
            // On the host stream, as the host's nodes are: the copy
            // streams carry the slots' copies, which the host must not
            // wait behind.
            for (tensor * t : {qh, kh, vh}) {
                t->iparams[0] = plan_.first_layer + layer;
                t->on_host = true;
            }
            qh->name = "q";
            kh->name = "k";
            vh->name = "v";
        }
        const kv_view view = group_view(layer, gr, -1);
        tensor * stored = op_kv_store_heads(*g_, kh, vh, plan_.first_layer + layer, view, nullptr);
        stored->on_host = true;
        const int32_t n_head = int32_t(q->ne[0] / kv_.head_dim);
        tensor * h = op_attention_heads(*g_, qh, stored, plan_.first_layer + layer, n_head,
                                        plan_.n_head_kv, kv_.head_dim, view, nullptr, opts);
        h->data = host_out_;
        h->where = placement::host_pinned;
        h->on_host = true;
        // The group's query heads: a column range of every row, back.
        const int32_t per_kv = n_head / plan_.n_head_kv;
        const size_t head = size_t(kv_.head_dim) * sizeof(float);
        copy_desc c;
        c.width = size_t(view.h1 - view.h0) * size_t(per_kv) * head;
        c.height = size_t(h->ne[1]);
        c.dpitch = c.spitch = h->nb[1];
        c.offset = size_t(view.h0) * size_t(per_kv) * head;
        att = op_copy_to_device(*g_, h, att, c);
        att->iparams[0] = plan_.first_layer + layer;
        att->on_host = true;
        att->name = "attention output";
    }
    return att;
}

} // namespace smol
