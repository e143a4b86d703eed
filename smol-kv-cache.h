// smol-kv-cache.h - the KV cache's cells, as every backend sees them: the
// sequence masks of cells (a cell may be shared by several sequences), the
// pages a sequence's cells fill, the one rule of which cells a query sees,
// struct kv_cache (the cells' positions and sequences, the K and V arrays its
// owner allocates), and kv_view, the K and V heads one KV_STORE or
// ATTENTION node works on. Per-head placement (resident and offloaded head
// groups, staging slots, the copy nodes that move them) is still built by
// smol-llama.c++.

#ifndef SMOL_KV_CACHE_H
#define SMOL_KV_CACHE_H

#include "smol.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace smol {

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

} // namespace smol

#endif // SMOL_KV_CACHE_H
