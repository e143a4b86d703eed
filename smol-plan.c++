// smol-plan.c++ - the KV placement planner: fits weights, compute memory,
// two staging slots and as many resident (layer, head group) slices as a
// device budget allows; chooses the head-group size from the context length
// and the prefill chunk from the budget; prints the plan.

#include "smol-plan.h"

#include "smol-error.h"
#include "smol-kv-cache.h"

#include <algorithm>
#include <cstdio>

namespace smol {

std::string format_bytes(uint64_t n) {
    char b[32];
    if (n >= (1ull << 30)) {
        std::snprintf(b, sizeof b, "%.2f GiB", double(n) / double(1ull << 30));
    } else if (n >= (1ull << 20)) {
        std::snprintf(b, sizeof b, "%.1f MiB", double(n) / double(1ull << 20));
    } else if (n >= (1ull << 10)) {
        std::snprintf(b, sizeof b, "%.1f KiB", double(n) / 1024.0);
    } else {
        std::snprintf(b, sizeof b, "%llu B", (unsigned long long)n);
    }
    return b;
}

uint64_t kv_plan::row_bytes() const {
    return kv_row_bytes(kv_type, head_dim);
}

int32_t kv_plan::n_resident_groups() const {
    return int32_t(std::count(resident.begin(), resident.end(), uint8_t(1)));
}

int32_t kv_plan::n_host_groups() const {
    return int32_t(std::count(on_host.begin(), on_host.end(), uint8_t(1)));
}

uint64_t kv_plan::kv_bytes(bool resident_groups) const {
    uint64_t n = 0;
    for (int32_t l = 0; l < n_layer; ++l) {
        for (int32_t g = 0; g < n_group; ++g)
            if (is_resident(l, g) == resident_groups) n += group_bytes_at(l, g);
    }
    return n;
}

namespace {

const char * mode_name(smol_kv_offload m) {
    switch (m) {
    case SMOL_KV_OFFLOAD_NONE:
        return "none";
    case SMOL_KV_OFFLOAD_ALL:
        return "all";
    case SMOL_KV_OFFLOAD_AUTO:
        break;
    }
    return "auto";
}

const char * attend_name(smol_kv_attend a) {
    switch (a) {
    case SMOL_KV_ATTEND_DEVICE:
        return "device";
    case SMOL_KV_ATTEND_HOST:
        return "host";
    case SMOL_KV_ATTEND_AUTO:
        break;
    }
    return "auto";
}

// Staging slots should not crowd out resident KV: with a budget, at most a
// quarter of what is left after weights and compute; without one, up to
// this size.
constexpr uint64_t unbudgeted_slot_cap = 256ull << 20;

// A group's history of at least this size is copied at the link's full
// speed (pinned copies level off at a few MiB), and its prefill attention
// is a launch of several waves (a launch of a few heads fits its causal
// query tiles in one wave, most likely as long as its longest). Streamed
// prompts with groups of this size ran close to all-resident ones, small
// groups well below (BENCHMARKS.md, long contexts).
constexpr uint64_t copy_target = 64ull << 20;

// The smallest prefill chunk the planner takes to keep every head resident.
constexpr int32_t resident_chunk = 512;

// Compute memory below this is not worth a smaller prefill chunk.
constexpr uint64_t compute_floor = 64ull << 20;

} // namespace

kv_plan make_plan(const plan_input & in) {
    kv_plan p;
    p.n_layer = in.n_layer;
    p.first_layer = in.first_layer;
    p.n_head_kv = in.n_head_kv;
    p.head_dim = in.head_dim;
    p.kv_type = in.kv_type;
    p.n_cells = in.n_cells;
    p.budget = in.budget;
    p.mode = in.mode;
    p.attend = in.attend;
    p.rates = in.rates;
    p.weight_bytes = in.weight_bytes;
    p.windowed = in.windowed;
    p.window_cells = in.window_cells;
    p.streaming = in.streaming;
    p.streaming_sink = in.streaming_sink;
    p.streaming_window = in.streaming_window;
    if (in.head_group < 0 || (in.head_group > 0 && in.n_head_kv % in.head_group != 0)) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "head group " + std::to_string(in.head_group) + " does not divide the " +
                        std::to_string(in.n_head_kv) + " kv heads of a layer; choose a divisor");
    }
    if (!in.windowed.empty() && in.windowed.size() != size_t(in.n_layer) * size_t(in.n_head_kv))
        throw error(SMOL_ERR_INVALID_ARGUMENT, "the window store's heads do not match the model");
    // A group's heads all in the window store or all out, all streaming or
    // none.
    auto uniform = [&](int32_t G) {
        for (const std::vector<uint8_t> * f : {&in.windowed, &in.streaming})
            for (size_t h = 0; h < f->size(); ++h)
                if ((*f)[h] != (*f)[h / size_t(G) * size_t(G)]) return false;
        return true;
    };
    if (in.head_group > 0 && !uniform(in.head_group)) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "head group " + std::to_string(in.head_group) +
                        " puts streaming and full heads in one group; use --head-group 1, or "
                        "leave it to the planner");
    }
    p.group_forced = in.head_group > 0;
    auto compute = [&](int32_t n) { return in.compute_bytes ? in.compute_bytes(n) : 0; };
    auto set_group = [&](int32_t G) {
        p.G = G;
        p.n_group = in.n_head_kv / G;
    };
    const int32_t n_batch = int32_t(std::max<uint32_t>(1, in.n_batch));
    const uint64_t all_kv =
        2ull * uint64_t(in.n_layer) * uint64_t(in.n_head_kv) * uint64_t(in.n_cells) * p.row_bytes();

    // The window store's heads hold window_cells cells each, not n_cells.
    const uint64_t head_cell = 2 * p.row_bytes();
    const auto n_win = uint64_t(std::count(in.windowed.begin(), in.windowed.end(), uint8_t(1)));
    const uint64_t window_kv = head_cell * uint64_t(in.window_cells) * n_win;
    const uint64_t kv_total = all_kv - head_cell * uint64_t(in.n_cells) * n_win + window_kv;
    // The largest group size that keeps groups uniform.
    int32_t G_all = in.n_head_kv;
    while (G_all > 1 && (in.n_head_kv % G_all != 0 || !uniform(G_all))) --G_all;

    // Everything resident: what "none" asks for, and what "auto" does when
    // it fits.
    if (in.mode != SMOL_KV_OFFLOAD_ALL) {
        set_group(p.group_forced ? in.head_group : G_all);
        p.chunk = n_batch;
        p.compute_bytes = compute(p.chunk);
        p.n_slots = 0;
        p.resident.assign(size_t(p.n_layer) * size_t(p.n_group), 1);
        // A smaller prefill chunk, down to resident_chunk, before any head
        // leaves the device: a streamed head costs every decode step.
        while (in.budget > 0 && p.device_bytes() > in.budget && p.chunk > resident_chunk) {
            p.chunk = std::max(resident_chunk, p.chunk / 2);
            p.compute_bytes = compute(p.chunk);
        }
        const uint64_t need = p.device_bytes();
        if (in.budget == 0 || need <= in.budget) return p;
        if (in.mode == SMOL_KV_OFFLOAD_NONE) {
            throw error(SMOL_ERR_OUT_OF_MEMORY,
                        "the device budget of " + format_bytes(in.budget) +
                            " cannot hold the whole KV cache: it needs " + format_bytes(need) +
                            " (weights " + format_bytes(p.weight_bytes) + ", compute " +
                            format_bytes(p.compute_bytes) + ", KV " + format_bytes(kv_total) +
                            " for " + std::to_string(in.n_cells) +
                            " cells); use --kv-offload auto, a larger --gpu-mem or a "
                            "smaller context");
        }
    }

    // Some or all groups offloaded. The chunk shrinks while its compute
    // memory would take more than a quarter of what the weights leave (and
    // matters: above compute_floor), then further if the smallest plan
    // still does not fit.
    p.n_slots = 2;
    p.chunk = n_batch;
    const uint64_t left = in.budget > in.weight_bytes ? in.budget - in.weight_bytes : 0;
    if (in.budget > 0) {
        while (p.chunk > 1 && compute(p.chunk) > std::max(left / 4, compute_floor)) p.chunk /= 2;
    }
    auto choose_group = [&]() {
        p.compute_bytes = compute(p.chunk);
        const uint64_t fixed = p.weight_bytes + p.compute_bytes;
        const uint64_t room = in.budget > fixed ? in.budget - fixed : 0;
        const uint64_t slot_cap = in.budget > 0 ? room / 4 : 2 * unbudgeted_slot_cap;
        if (p.group_forced) {
            set_group(in.head_group);
            return;
        }
        // The smallest group whose history is one large copy (the link
        // reaches full speed from a few MiB), within the slots' cap: long
        // contexts get single heads (more room for resident ones), short
        // ones large groups (fewer, larger copies and launches).
        set_group(1);
        for (int32_t G = 1; G <= in.n_head_kv; ++G) {
            if (in.n_head_kv % G != 0 || !uniform(G)) continue;
            if (2 * uint64_t(2) * uint64_t(G) * uint64_t(in.n_cells) * p.row_bytes() > slot_cap) {
                break;
            }
            set_group(G);
            if (p.group_bytes() >= copy_target) break;
        }
    };
    // The window store's groups stay resident whatever the mode.
    auto minimum = [&]() {
        return p.weight_bytes + p.compute_bytes + 2 * p.group_bytes() + window_kv;
    };
    choose_group();
    while (in.budget > 0 && minimum() > in.budget && p.chunk > 1) {
        p.chunk /= 2;
        choose_group();
    }
    if (in.budget > 0 && minimum() > in.budget) {
        throw error(SMOL_ERR_OUT_OF_MEMORY,
                    "the device budget of " + format_bytes(in.budget) +
                        " is too small for the smallest plan, which needs " +
                        format_bytes(minimum()) + ": weights " + format_bytes(p.weight_bytes) +
                        (window_kv ? ", the window store's KV " + format_bytes(window_kv) : "") +
                        ", compute " + format_bytes(p.compute_bytes) + " (chunks of " +
                        std::to_string(p.chunk) + " tokens), two staging slots of " +
                        format_bytes(p.group_bytes()) + " (" + std::to_string(p.G) +
                        " kv head(s) x " + std::to_string(in.n_cells) +
                        " cells); raise --gpu-mem, lower the context size (-c)" +
                        (p.G > 1 ? " or use --head-group 1" : ""));
    }
    // The groups outside the window store, layer by layer.
    std::vector<std::vector<int32_t>> open(size_t(p.n_layer));
    int32_t total = 0;
    for (int32_t l = 0; l < p.n_layer; ++l) {
        for (int32_t g = 0; g < p.n_group; ++g)
            if (!p.is_windowed(l, g)) open[size_t(l)].push_back(g);
        total += int32_t(open[size_t(l)].size());
    }
    int32_t n_res = 0;
    if (in.mode == SMOL_KV_OFFLOAD_AUTO && in.budget > 0) {
        n_res =
            int32_t(std::min<uint64_t>(uint64_t(total), (in.budget - minimum()) / p.group_bytes()));
    }
    // Spread the resident groups evenly over the layers, so every layer
    // streams about as much as the next (round by round: a layer with fewer
    // open groups is full sooner); in a layer, its first groups stay. The
    // window store's groups stay.
    p.resident.assign(size_t(p.n_layer) * size_t(p.n_group), 0);
    for (int32_t l = 0; l < p.n_layer; ++l) {
        for (int32_t g = 0; g < p.n_group; ++g)
            if (p.is_windowed(l, g)) p.resident[size_t(l) * size_t(p.n_group) + size_t(g)] = 1;
    }
    for (size_t round = 0; n_res > 0; ++round) {
        bool any = false;
        for (int32_t l = 0; l < p.n_layer && n_res > 0; ++l) {
            if (round >= open[size_t(l)].size()) continue;
            p.resident[size_t(l) * size_t(p.n_group) + size_t(open[size_t(l)][round])] = 1;
            --n_res;
            any = true;
        }
        if (!any) break;
    }
    // The offloaded groups attended on the host: all, none, or (auto) the
    // share that makes both ways take equal time, spread evenly over the
    // offloaded groups in order so that every layer's host work overlaps
    // its device work.
    const int32_t n_off = p.n_offloaded_groups();
    int32_t n_host = 0;
    if (in.attend == SMOL_KV_ATTEND_HOST) {
        n_host = n_off;
    } else if (in.attend == SMOL_KV_ATTEND_AUTO && in.rates.measured()) {
        // Bytes a second each way gives the offloaded KV: streamed, on the
        // host, or split (both at their shared speeds, in proportion).
        const attend_rates & r = in.rates;
        const double split = r.link_shared + r.host_shared;
        if (split > r.link && split > r.host) {
            n_host = int32_t(double(n_off) * r.host_shared / split + 0.5);
        } else if (r.host > r.link) {
            n_host = n_off;
        }
    }
    if (n_host > 0) {
        p.on_host.assign(p.resident.size(), 0);
        // Streaming heads' groups (offloaded in a context too short for
        // the window store) stream: the host attends whole histories only.
        auto streams = [&](int32_t i) {
            return !in.streaming.empty() &&
                   in.streaming[size_t(i / p.n_group) * size_t(p.n_head_kv) +
                                size_t(i % p.n_group) * size_t(p.G)];
        };
        for (int32_t i = 0, o = 0; i < int32_t(p.resident.size()); ++i) {
            if (p.resident[size_t(i)] || streams(i)) continue;
            if (int64_t(o + 1) * n_host / n_off > int64_t(o) * n_host / n_off)
                p.on_host[size_t(i)] = 1;
            ++o;
        }
    }
    // Prompts stream the host's groups too: slots whenever any is offloaded.
    if (n_off == 0) p.n_slots = 0;
    return p;
}

std::string kv_plan::format() const {
    std::string s;
    char b[512];
    const int32_t heads = n_layer * n_head_kv;
    const int32_t res_heads = n_resident_groups() * G;
    std::snprintf(b, sizeof b,
                  "KV plan: budget %s, kv-offload %s, kv-type %s%s, %d cells, head group G = %d%s "
                  "(%d group(s) of a layer's %d kv heads), prefill chunk %d tokens\n",
                  budget ? format_bytes(budget).c_str() : "none", mode_name(mode),
                  smol_type_name(kv_type), kv_type != SMOL_TYPE_F16 ? " (approximate)" : "",
                  n_cells, G, group_forced ? " (forced)" : "", n_group, n_head_kv, chunk);
    s += b;
    std::snprintf(b, sizeof b,
                  "  device: weights %s, compute %s, staging %d x %s, resident KV %s (%d of %d "
                  "heads); total %s\n",
                  format_bytes(weight_bytes).c_str(), format_bytes(compute_bytes).c_str(), n_slots,
                  format_bytes(slot_bytes()).c_str(), format_bytes(resident_kv_bytes()).c_str(),
                  res_heads, heads, format_bytes(device_bytes()).c_str());
    s += b;
    std::snprintf(b, sizeof b, "  host: offloaded KV %s (%d of %d heads), %s per group copy\n",
                  format_bytes(host_kv_bytes()).c_str(), heads - res_heads, heads,
                  format_bytes(group_bytes()).c_str());
    s += b;
    if (n_offloaded_groups() > 0) {
        char rates_text[192] = "";
        if (rates.measured()) {
            std::snprintf(rates_text, sizeof rates_text,
                          "; measured: link %.1f GB/s, host attention %.1f GB/s, both at once "
                          "%.1f + %.1f GB/s",
                          rates.link / 1e9, rates.host / 1e9, rates.link_shared / 1e9,
                          rates.host_shared / 1e9);
        }
        std::snprintf(b, sizeof b,
                      "  kv-attend %s: %d offloaded head(s) streamed to the device, %d attended "
                      "on the host in steps of up to %d tokens (prompts stream them)%s\n",
                      attend_name(attend), n_streamed_groups() * G, n_host_groups() * G,
                      kv_host_max_tokens, rates_text);
        s += b;
    }
    if (const auto n_win = int32_t(std::count(windowed.begin(), windowed.end(), uint8_t(1)))) {
        uint64_t win_bytes = 0;
        int32_t first = -1;
        for (int32_t l = 0; l < n_layer; ++l)
            for (int32_t g = 0; g < n_group; ++g) {
                if (!is_windowed(l, g)) continue;
                win_bytes += group_bytes_at(l, g);
                if (first < 0) first = l * n_group + g;
            }
        const std::string what =
            streaming.empty() ? std::to_string(n_win / n_head_kv) + " sliding-window layer(s)"
                              : std::to_string(n_win) + " streaming head(s)";
        std::snprintf(b, sizeof b,
                      "  window store: %s keep %d cells of %d, KV %s (resident), %s per group\n",
                      what.c_str(), window_cells, n_cells, format_bytes(win_bytes).c_str(),
                      format_bytes(group_bytes_at(first / n_group, first % n_group)).c_str());
        s += b;
    }
    if (!streaming.empty()) { // streaming heads per layer, runs of equal layers folded
        std::snprintf(b, sizeof b,
                      "  streaming heads (S; approximate: the first %d positions and the last "
                      "%d) per layer:",
                      streaming_sink, streaming_window);
        s += b;
        for (int32_t l0 = 0; l0 < n_layer;) {
            auto list = [&](int32_t l) {
                std::string h;
                for (int32_t k = 0; k < n_head_kv; ++k)
                    h += streaming[size_t(l) * size_t(n_head_kv) + size_t(k)] ? 'S' : '-';
                return h;
            };
            int32_t l1 = l0 + 1;
            while (l1 < n_layer && list(l1) == list(l0)) ++l1;
            if (l1 - l0 > 1) {
                std::snprintf(b, sizeof b, " %d-%d: %s", first_layer + l0, first_layer + l1 - 1,
                              list(l0).c_str());
            } else {
                std::snprintf(b, sizeof b, " %d: %s", first_layer + l0, list(l0).c_str());
            }
            s += b;
            l0 = l1;
        }
        s += "\n";
    }
    // Resident heads per layer (and those attended on the host), runs of
    // equal layers folded.
    auto per_layer = [&](const char * what, auto counted) {
        s += what;
        for (int32_t l0 = 0; l0 < n_layer;) {
            auto count = [&](int32_t l) {
                int32_t n = 0;
                for (int32_t g = 0; g < n_group; ++g) n += counted(l, g) ? G : 0;
                return n;
            };
            int32_t l1 = l0 + 1;
            while (l1 < n_layer && count(l1) == count(l0)) ++l1;
            if (l1 - l0 > 1) {
                std::snprintf(b, sizeof b, " %d-%d: %d/%d", first_layer + l0, first_layer + l1 - 1,
                              count(l0), n_head_kv);
            } else {
                std::snprintf(b, sizeof b, " %d: %d/%d", first_layer + l0, count(l0), n_head_kv);
            }
            s += b;
            l0 = l1;
        }
        s += "\n";
    };
    per_layer("  resident heads per layer:",
              [&](int32_t l, int32_t g) { return is_resident(l, g); });
    if (n_host_groups() > 0) {
        per_layer("  host-attended heads per layer:",
                  [&](int32_t l, int32_t g) { return is_on_host(l, g); });
    }
    return s;
}

} // namespace smol
