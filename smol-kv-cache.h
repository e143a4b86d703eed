// smol-kv-cache.h - the KV cache. Its cells, as every backend sees them: the
// sequence masks of cells (a cell may be shared by several sequences), the
// pages a sequence's cells fill, the one rule of which cells a query sees,
// struct kv_cache (the cells' positions and sequences, the K and V arrays its
// owner allocates), and kv_view, the K and V heads one KV_STORE or
// ATTENTION node works on; kv_window, the smaller store of sliding-window
// layers' K and V (slots for the cells their window still sees). And the
// per-head placement ("HeadInfer"), kv_placement: the storage of each
// (layer, kv-head group) by the plan, resident in device memory or
// offloaded to host memory and streamed through two staging slots, and the
// PREFETCH and OFFLOAD copy nodes that move offloaded groups through a
// step's graph.

#ifndef SMOL_KV_CACHE_H
#define SMOL_KV_CACHE_H

#include "smol.h"

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace smol {

class backend;
class graph;
struct attn_opts;
struct kv_plan;
struct tensor;

// The K and V that a KV_STORE writes or an ATTENTION reads: kv heads
// [h0, h1) of one layer, each head [cell][row] (a row: head_dim elements of
// the cache's type, kv_cache::row_words 16-bit words), head_stride words
// apart, from these bases (a resident slice in device memory or a staging
// slot). Null k: the cache's own [layer][head][cell][row] arrays.
struct kv_view {
    uint16_t * k = nullptr;
    uint16_t * v = nullptr;
    size_t head_stride = 0;
    int32_t h0 = 0, h1 = 0;
    int32_t slot = -1; // the staging slot it names; -1: resident memory
    // The window store's (kv_window): rows are slots, and its nodes see
    // batch_info::local, not the cache's cells.
    bool local = false;
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
// Groups n items by sequence: item i belongs to each sequence of
// mask_of(i). begin gets kv_max_seqs + 1 bounds, ids each sequence's items
// (id_of(i)) in the order given, fill is scratch; two passes, count then
// place, and no allocation once warm. The cells a batch's sequences hold
// (CPU attention) and the pages (the GPU's decode kernel) are listed so.
template <class MaskOf, class IdOf>
void group_by_seq(int32_t n, MaskOf mask_of, IdOf id_of, std::vector<int32_t> & begin,
                  std::vector<int32_t> & ids, std::vector<int32_t> & fill) {
    begin.assign(size_t(kv_max_seqs) + 1, 0);
    for (int32_t i = 0; i < n; ++i) {
        for (seq_mask m = mask_of(i); m; m = m.rest()) ++begin[size_t(m.first()) + 1];
    }
    for (size_t s = 0; s < size_t(kv_max_seqs); ++s) begin[s + 1] += begin[s];
    ids.resize(size_t(begin[size_t(kv_max_seqs)] > 0 ? begin[size_t(kv_max_seqs)] : 1));
    fill.assign(begin.begin(), begin.end() - 1);
    for (int32_t i = 0; i < n; ++i) {
        for (seq_mask m = mask_of(i); m; m = m.rest())
            ids[size_t(fill[size_t(m.first())]++)] = id_of(i);
    }
}

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

// Bytes of one cell's row of a head: head_dim elements of type t (F16, or
// head_dim / 32 blocks of Q8_0 or Q4_0 in ggml's layout, each an even
// number of bytes, so a row is a whole number of 16-bit words).
size_t kv_row_bytes(smol_type t, int32_t head_dim);

// A quantized cache stores K and V rotated, as llama.cpp does: each run of
// `len` elements of a head multiplied by the orthonormal Walsh-Hadamard
// matrix of that size (its own inverse), which spreads a head's outlier
// channels over a block before it is rounded to the block's scale. q
// turns with K (q.k is unchanged), and the attention's output turns back
// with V's length. K's run is the largest power of two dividing head_dim,
// V's 64, for heads that are a multiple of 64; none for f16 or other heads.
int32_t kv_rot_k(smol_type t, int32_t head_dim);
int32_t kv_rot_v(smol_type t, int32_t head_dim);
// Rotates x[0, n) in runs of len (a power of two dividing n; 0: nothing).
void kv_rotate(float * x, int64_t n, int32_t len);

// The cache is a set of cells shared by all sequences. Each (layer, kv-head)
// slice of K and of V is [n_cells][row], contiguous, so one head's history
// is one block of memory (and, later, one copy). A row is head_dim elements
// of the cache's type: f16, or (opt-in, approximate) q8_0 or q4_0 blocks.
struct kv_cache {
    int32_t n_layer = 0, n_head_kv = 0, head_dim = 0, n_cells = 0;
    smol_type type = SMOL_TYPE_F16;
    int32_t row_words = 0;        // 16-bit words of a row: kv_row_bytes(type, head_dim) / 2
    int32_t rot_k = 0, rot_v = 0; // kv_rot_k, kv_rot_v of the type and head
    // [layer][head][cell][row], in the memory of the backend that runs the
    // attention (its owner allocates them).
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
    void init(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t n_cells,
              smol_type type = SMOL_TYPE_F16);
    size_t bytes_per_tensor() const {
        return size_t(n_layer) * n_head_kv * n_cells * row_words * sizeof(uint16_t);
    }
    uint16_t * k_head(int32_t layer, int32_t head) const {
        return k + (size_t(layer) * n_head_kv + head) * n_cells * row_words;
    }
    uint16_t * v_head(int32_t layer, int32_t head) const {
        return v + (size_t(layer) * n_head_kv + head) * n_cells * row_words;
    }
    // The cache's own arrays for the view of a node that names none.
    kv_view layer_view(int32_t layer) const {
        return {k_head(layer, 0), v_head(layer, 0), size_t(n_cells) * row_words, 0, n_head_kv};
    }
    int32_t n_free() const;
    // Whether n cells are free: at once when the cells past n_used (all
    // free) are enough, else by counting.
    bool has_free(int32_t n) const { return n_cells - n_used >= n || n_free() >= n; }
    // Pages (kv_page cells) no sequence holds a cell of.
    int32_t n_free_pages() const;
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

// --- the window store: what windowed heads keep ------------------------------

// Heads whose attention sees only the last `window` positions (Gemma 3's
// local layers), and the first `sink` positions too (streaming heads,
// DuoAttention's), keep the K and V of those positions only, in a store of
// its own smaller than the cache: n_slots slots, each holding the K and V
// of one cell. The cells stay the cache's (positions, sequences, seq_rm,
// seq_cp, find_cell); a new token's cell takes a slot, and a slot is given
// back when its cell is freed or, past the sinks, has fallen out of the
// window of every sequence that holds it by more than `reserve` positions
// (n_batch: a rollback of up to that many tokens, as speculative decoding
// does, stays exact). To a backend the store is a second cell table,
// `table`: the slots' positions and sequences (their cells'), which the
// windowed heads' KV_STORE and ATTENTION use instead of the cache's
// (batch_info::local).
//
// Sizing (kv_window::slots_needed): every sequence keeps at most sink +
// window + reserve slots at a step's start (its positions are distinct),
// and a step adds at most n_batch, so n_seq_max * (sink + window + reserve)
// + n_batch slots never run out.
//
// Exactness: a sequence that would attend to a position whose slot is gone
// (a rollback past the reserve, a copied prefix whose last window was
// released) is refused (first_exact), never computed without it.
struct kv_window {
    int32_t window = 0, reserve = 0, sink = 0;
    kv_cache table;                            // the slots as cells; no K or V of its own
    std::vector<int32_t> slot_cell, cell_slot; // -1: none
    // Per sequence: its newest position, and the newest position of a cell
    // it holds whose slot was released (-1: none).
    std::vector<smol_pos> newest, lost;
    // Sequences whose cells do not keep slots (a prefix cache's holder,
    // which holds many prompts' positions at once).
    seq_mask passive = seq_mask::none();
    uint64_t synced = 0; // the cache's version at the last sync

    static int32_t slots_needed(int32_t n_cells, int32_t n_seq_max, int32_t window, int32_t reserve,
                                int32_t n_batch, int32_t sink = 0);
    bool on() const { return window > 0; }
    void init(const kv_cache & kv, int32_t window, int32_t reserve, int32_t n_slots,
              int32_t sink = 0);
    // Follows the cache's changes since the last sync: gives back the slots
    // of freed cells, copies positions and sequences, recounts newest and
    // lost. Before any cell is taken after the cache changed.
    void sync(const kv_cache & kv);
    // Gives back the slots no sequence's window (plus reserve) still needs.
    void release_old(const kv_cache & kv);
    // A slot for cell c, just taken by a token of seq at pos; -1: none left.
    int32_t take(int32_t c, smol_pos pos, smol_seq_id seq);
    // The lowest position at which seq can go on exactly (0: any; a lost
    // sink: none).
    smol_pos first_exact(smol_seq_id seq) const {
        const smol_pos p = lost[size_t(seq)];
        return p < 0 ? 0 : p < sink ? std::numeric_limits<smol_pos>::max() : p + window;
    }
    // The slots whose cells are held (a freed cell's slot is given back at
    // the next sync).
    int32_t n_held(const kv_cache & kv) const;
    // Whether every one of these cells still has its slot.
    bool holds(const int32_t * cells, int32_t n) const;

  private:
    void free_slot(int32_t s);
    int32_t next_free_ = 0; // no free slot below it
};

// --- placement: where each head group lives, the copies that move it -----------

// The cells a step's PREFETCH copies ([0, n_copy)) and its OFFLOAD copies
// ([c0, c1)), in whole granules, and whether the host attends the groups the
// plan gives it (host); with the token and output counts they decide the
// step's graph.
struct kv_copies {
    int32_t n_copy = 0, c0 = 0, c1 = 0;
    bool host = false;
    bool operator==(const kv_copies &) const = default;
};

// The most tokens of a step the host attends its groups in: a decode step
// or a speculative verify, whose attention reads each cached byte for a few
// queries (the host's memory is the bound). A prompt's chunk does hundreds
// of multiply-adds per byte, which the device does far faster: its steps
// stream every offloaded group.
constexpr int32_t kv_host_max_tokens = 8;

// The KV storage of a plan (smol-plan.h) and the copies of a step. Each
// (layer, group) is one block [K: G heads][V: G heads] x [cell][row], so
// that its history is one copy: a resident group's in device
// memory, where it is stored and attended; an offloaded group's in host
// memory, attended over a staging slot that a PREFETCH filled (issued
// before the attention of the group before it, so the copy overlaps that
// compute), its new cells stored into the slot and OFFLOADed back to host.
// Slots alternate between offloaded groups in order, across layers too.
//
// An offloaded group the plan attends on the host instead (kv_plan::on_host)
// takes no slot in a step of up to kv_host_max_tokens tokens: per layer,
// after the device's groups, host_layer() copies the step's q, k and v to
// the host, adds each such group's KV_STORE and ATTENTION as host nodes on
// its block, and copies their heads' outputs back into the layer's
// attention output. Longer steps stream it.
//
// A graph builder calls begin() (the first PREFETCH) and then, per layer,
// every group not on_host() in order, then host_layer(). Layers are the
// plan's (a device's part of the model counts from its first; the nodes
// are labelled with the model's index, plan.first_layer + layer):
//   io = place.group(layer, group);        // the view, the PREFETCH to wait on
//   stored = KV_STORE(k, v, io.view, io.ready);
//   place.after_store(layer, group);       // the next PREFETCH when due
//   att = ATTENTION(q, stored, io.view);
//   place.after_attention(layer, group, att, stored); // the OFFLOAD
// Before alloc() views have the shape only and no copy is made: the graph
// the planner measures, every group resident.
class kv_placement {
  public:
    // Both outlive it; the plan may change until alloc().
    kv_placement(const kv_cache & kv, const kv_plan & plan) : kv_(kv), plan_(plan) {}
    ~kv_placement();
    kv_placement(const kv_placement &) = delete;
    kv_placement & operator=(const kv_placement &) = delete;

    // Allocates the groups and slots by the plan in be's memory, zeroed, and
    // the host attention's buffers for steps of n_head query heads; be
    // outlives this object.
    void alloc(backend & be, int32_t n_head);
    // Host bytes of the offloaded groups that were pinned, and that were not.
    uint64_t host_pinned() const { return host_pinned_; }
    uint64_t host_pageable() const { return host_pageable_; }

    // The copies of a step that writes these n cells.
    kv_copies copies_of(const int32_t * cells, int32_t n) const;

    // Starts the copies of a step's graph g.
    void begin(graph & g, const kv_copies & copies);
    struct group_io {
        kv_view view;             // what the KV_STORE and ATTENTION work on
        tensor * ready = nullptr; // the PREFETCH the KV_STORE waits on (null: resident)
    };
    group_io group(int32_t layer, int32_t group) const;
    void after_store(int32_t layer, int32_t group);
    void after_attention(int32_t layer, int32_t group, tensor * att, tensor * stored);
    // Whether the step's graph attends (layer, group) on the host, and
    // whether it streams it through a slot.
    bool on_host(int32_t layer, int32_t group) const;
    bool streamed(int32_t layer, int32_t group) const;
    // The layer's attention output `att` (null: none yet) completed with
    // the heads of its host-attended groups (q, k, v: the step's roped
    // queries and new keys and values of every head): the copies and host
    // nodes that make them. Placed after the device's readers of q, k and v
    // in the graph, so that the arena keeps those for the copies (a copy on
    // its own stream may run after a later compute node).
    tensor * host_layer(int32_t layer, tensor * q, tensor * k, tensor * v, const attn_opts & opts,
                        tensor * att);

  private:
    kv_view group_view(int32_t layer, int32_t group, int32_t slot) const;
    uint16_t * base_of(int32_t layer, int32_t group) const;
    void issue_prefetch(int32_t o, int32_t layer, int32_t group);
    void prefetch_after(int32_t layer, int32_t group);

    const kv_cache & kv_;
    const kv_plan & plan_;
    backend * be_ = nullptr;
    std::vector<void *> owned_;      // device blocks: resident groups, slots
    std::vector<void *> owned_host_; // host arenas of the offloaded groups
    // Per (layer, group): its block, in device memory (resident) or host
    // memory (offloaded); empty until alloc().
    std::vector<uint16_t *> group_base_;
    uint16_t * slots_[2] = {nullptr, nullptr};
    uint64_t host_pinned_ = 0, host_pageable_ = 0;
    // The host attention's copies of q, k, v and its output, for the
    // largest step; one set serves every layer in turn.
    void * host_q_ = nullptr;
    void * host_k_ = nullptr;
    void * host_v_ = nullptr;
    void * host_out_ = nullptr;
    size_t host_q_bytes_ = 0, host_kv_bytes_ = 0;

    // The step being built: its copy nodes and attentions per offloaded
    // group in the order they run.
    graph * g_ = nullptr;
    kv_copies copies_{};
    std::vector<tensor *> prefetch_, offload_, attend_;
    int32_t n_met_ = 0;         // offloaded groups met so far
    int32_t next_prefetch_ = 0; // the next offloaded group whose PREFETCH is not issued
    int32_t issued_at_ = -1;    // the flat (layer, group) index of the last one issued
};

} // namespace smol

#endif // SMOL_KV_CACHE_H
