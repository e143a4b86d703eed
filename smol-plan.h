// smol-plan.h - the KV placement planner. From a device memory budget, the
// model's shape, the context length and the compute memory the backend
// measured, it decides the head-group size G, the prefill chunk, two
// staging slots, and which (layer, head group) slices of the KV cache stay
// in device memory; the rest live in pinned host memory and either stream
// through the slots or are attended on the host, split between the two by
// the link's and the host's speeds. A pure function of its input; the plan
// prints itself.

#ifndef SMOL_PLAN_H
#define SMOL_PLAN_H

#include "smol.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace smol {

// The speeds (bytes of KV a second) that split offloaded groups between
// the link (pinned host-to-device copies into a staging slot) and the
// host's attention: each alone, and each while the other runs (both read
// the host's memory). 0: not measured.
struct attend_rates {
    double link = 0, host = 0;
    double link_shared = 0, host_shared = 0;
    bool measured() const { return link > 0 && host > 0 && link_shared > 0 && host_shared > 0; }
};

struct plan_input {
    int32_t n_layer = 0, n_head_kv = 0, head_dim = 0;
    int32_t first_layer = 0; // the model's index of the plan's layer 0 (a device's part)
    smol_type kv_type = SMOL_TYPE_F16;
    int32_t n_cells = 0;    // the context's KV cells
    uint32_t n_batch = 512; // most tokens of one decode call
    uint64_t budget = 0;    // device bytes (0: no budget)
    smol_kv_offload mode = SMOL_KV_OFFLOAD_AUTO;
    int32_t head_group = 0; // 0: the planner chooses
    // How offloaded groups are attended, and for AUTO the speeds that
    // decide it (not measured: all stream). AUTO takes whichever is
    // fastest: every group streamed, every group on the host, or the split
    // by the shared speeds that makes both ways finish together.
    smol_kv_attend attend = SMOL_KV_ATTEND_AUTO;
    attend_rates rates;
    // Kv heads, [layer * n_head_kv + head], whose K and V live in the window
    // store (kv_window; empty: none), window_cells cells each instead of
    // n_cells: sliding-window layers' and streaming heads.
    std::vector<uint8_t> windowed;
    int32_t window_cells = 0;
    // Streaming heads, [layer * n_head_kv + head] (empty: none), in the
    // window store or not (a short context), their first positions and
    // window: a group's heads all stream or none does.
    std::vector<uint8_t> streaming;
    int32_t streaming_sink = 0, streaming_window = 0;
    uint64_t weight_bytes = 0; // device bytes of the weights
    // Device bytes the backend holds to run a chunk of n tokens (arena,
    // work space, staging): measured, not guessed.
    std::function<uint64_t(int32_t n_tokens)> compute_bytes;
};

struct kv_plan {
    int32_t n_layer = 0, n_head_kv = 0, head_dim = 0, n_cells = 0;
    int32_t first_layer = 0; // as plan_input's: what the plan's text and copies call layer 0
    smol_type kv_type = SMOL_TYPE_F16;
    int32_t G = 0;       // kv heads per group
    int32_t n_group = 0; // groups per layer
    int32_t chunk = 0;   // tokens per prefill chunk
    int32_t n_slots = 0; // staging slots (2 when anything is offloaded)
    uint64_t budget = 0;
    smol_kv_offload mode = SMOL_KV_OFFLOAD_AUTO;
    bool group_forced = false;
    std::vector<uint8_t> resident; // [layer * n_group + group]
    // Offloaded groups attended on the host, [layer * n_group + group]
    // (empty: none); the other offloaded groups stream through the slots,
    // which exist only when one does.
    std::vector<uint8_t> on_host;
    smol_kv_attend attend = SMOL_KV_ATTEND_AUTO;
    attend_rates rates; // as plan_input's
    // Kv heads in the window store, [layer * n_head_kv + head] (empty:
    // none), and its cells: their groups (G keeps a group's heads all in or
    // all out) are that small and always resident (used every step, and the
    // other groups free more memory per group offloaded).
    std::vector<uint8_t> windowed;
    int32_t window_cells = 0;
    std::vector<uint8_t> streaming; // as plan_input's
    int32_t streaming_sink = 0, streaming_window = 0;

    uint64_t weight_bytes = 0, compute_bytes = 0;

    // One cell's row of one head: head_dim elements of kv_type.
    uint64_t row_bytes() const;
    // One group's K and V for every cell: [K: G heads][V: G heads] x
    // [n_cells][row], the unit of placement and of one copy.
    uint64_t group_bytes() const { return 2ull * uint64_t(G) * uint64_t(n_cells) * row_bytes(); }
    bool is_resident(int32_t layer, int32_t group) const {
        return resident[size_t(layer) * size_t(n_group) + size_t(group)] != 0;
    }
    int32_t n_resident_groups() const;
    bool is_windowed(int32_t layer, int32_t group) const {
        return !windowed.empty() &&
               windowed[size_t(layer) * size_t(n_head_kv) + size_t(group) * size_t(G)];
    }
    // A group's bytes: group_bytes() in the cache, less in the window store.
    uint64_t group_bytes_at(int32_t layer, int32_t group) const {
        return is_windowed(layer, group)
                   ? group_bytes() / uint64_t(n_cells) * uint64_t(window_cells)
                   : group_bytes();
    }
    int32_t n_offloaded_groups() const { return n_layer * n_group - n_resident_groups(); }
    bool is_on_host(int32_t layer, int32_t group) const {
        return !on_host.empty() && on_host[size_t(layer) * size_t(n_group) + size_t(group)] != 0;
    }
    // Offloaded and not attended on the host: through a staging slot.
    bool is_streamed(int32_t layer, int32_t group) const {
        return !is_resident(layer, group) && !is_on_host(layer, group);
    }
    int32_t n_host_groups() const;
    int32_t n_streamed_groups() const { return n_offloaded_groups() - n_host_groups(); }
    uint64_t slot_bytes() const { return n_slots ? group_bytes() : 0; }
    uint64_t resident_kv_bytes() const { return kv_bytes(true); }
    uint64_t host_kv_bytes() const { return kv_bytes(false); }
    uint64_t kv_bytes(bool resident_groups) const;
    uint64_t device_bytes() const {
        return weight_bytes + compute_bytes + uint64_t(n_slots) * slot_bytes() +
               resident_kv_bytes();
    }
    // Bytes per kind, G, chunk, resident heads per layer.
    std::string format() const;
};

// Throws smol::error (SMOL_ERR_OUT_OF_MEMORY with the numbers and the fix)
// when the budget cannot hold even the smallest plan, and
// SMOL_ERR_INVALID_ARGUMENT for a head group that does not divide the heads.
kv_plan make_plan(const plan_input & in);

// "1.50 GiB", "12.0 MiB", "512 B".
std::string format_bytes(uint64_t n);

} // namespace smol

#endif // SMOL_PLAN_H
