// test-offload.c++ - per-head KV placement on the simulated device: logits
// bit-identical whatever lives where (all resident, all offloaded, mixed,
// any head group), device memory within the budget, the schedule's copies
// ordered and overlapped as promised, and the planner's edge cases and
// errors.

#include "decode-all.h"
#include "smol-cpu-kernels.h"
#include "smol-error.h"
#include "smol-graph.h"
#include "smol-host-attention.h"
#include "smol-llama.h"
#include "smol-plan.h"
#include "smol-schedule.h"
#include "smol.h"
#include "test-seed.h"
#include "tiny-model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <doctest/doctest.h>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using test::decode_all;
using test::random_ids;
using test::run_workload;

namespace {

struct model_deleter {
    void operator()(smol_model * m) const { smol_model_free(m); }
};
struct context_deleter {
    void operator()(smol_context * c) const { smol_context_free(c); }
};
using model_ptr = std::unique_ptr<smol_model, model_deleter>;
using context_ptr = std::unique_ptr<smol_context, context_deleter>;

std::string temp_path(const std::string & name) {
    return (std::filesystem::temp_directory_path() /
            ("smol-offload-" + std::to_string(::getpid()) + "-" + name))
        .string();
}

model_ptr load(const std::string & path) {
    smol_model * m = nullptr;
    const smol_status st = smol_model_load(path.c_str(), nullptr, &m);
    INFO(std::string(smol_last_error()));
    REQUIRE(st == SMOL_OK);
    return model_ptr(m);
}

// A placement to try: offload mode, head group and budget.
struct placement_case {
    const char * name;
    smol_kv_offload mode;
    int32_t head_group;
    uint64_t budget;
};

smol_context_params sim_params(uint32_t n_ctx, uint32_t n_batch, uint32_t n_seq,
                               const placement_case & pc, smol_type kv_type = SMOL_TYPE_F16) {
    smol_context_params p = smol_context_default_params();
    p.n_ctx = n_ctx;
    p.n_batch = n_batch;
    p.n_seq_max = n_seq;
    p.n_threads = 2;
    p.device = "sim";
    p.kv_offload = pc.mode;
    p.head_group = pc.head_group;
    p.gpu_mem = pc.budget;
    p.kv_type = kv_type;
    return p;
}

context_ptr make_context(smol_model * m, const smol_context_params & p) {
    smol_context * c = nullptr;
    const smol_status st = smol_context_create(m, &p, &c);
    INFO(std::string(smol_last_error()));
    REQUIRE(st == SMOL_OK);
    return context_ptr(c);
}

smol_memory_info memory_of(smol_context * c) {
    smol_memory_info mi;
    smol_context_memory(c, &mi);
    return mi;
}

bool same_bits(const std::vector<float> & a, const std::vector<float> & b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
bool same_bits(const std::vector<std::vector<float>> & a,
               const std::vector<std::vector<float>> & b) {
    return a.size() == b.size() &&
           std::equal(a.begin(), a.end(), b.begin(),
                      [](const auto & x, const auto & y) { return same_bits(x, y); });
}

// Placements over one model: everything resident (no budget), every head
// offloaded for each head group, and budgets that keep about a third and
// two thirds of the groups resident.
std::vector<placement_case> placements(smol_model * m, uint32_t n_ctx, uint32_t n_batch,
                                       int n_head_kv, smol_type kv_type) {
    std::vector<placement_case> cases = {{"resident", SMOL_KV_OFFLOAD_AUTO, 0, 0},
                                         {"resident G=1", SMOL_KV_OFFLOAD_NONE, 1, 0}};
    for (int G = 1; G <= n_head_kv; ++G) {
        if (n_head_kv % G == 0) cases.push_back({"all offloaded", SMOL_KV_OFFLOAD_ALL, G, 0});
    }
    // The fixed part of a budget from an all-offloaded plan with G = 1.
    context_ptr probe =
        make_context(m, sim_params(n_ctx, n_batch, 2, {"", SMOL_KV_OFFLOAD_ALL, 1, 0}, kv_type));
    const smol_memory_info mi = memory_of(probe.get());
    const uint64_t fixed = mi.device_weights + mi.device_compute + mi.device_staging;
    for (int thirds = 1; thirds <= 2; ++thirds)
        cases.push_back({"mixed", SMOL_KV_OFFLOAD_AUTO, 1, fixed + mi.host_kv * thirds / 3});
    return cases;
}

// The tiny llama the placement tests write: eight query heads over four kv
// heads, so groups of 1, 2 and 4 kv heads all divide it.
tiny::shape placed_shape() {
    tiny::shape s;
    s.n_embd = 128;
    s.n_head = 8;
    s.n_head_kv = 4;
    s.n_layer = 3;
    s.wtype = SMOL_TYPE_Q8_0;
    return s;
}

void check_placements_agree(const std::string & path, uint32_t n_ctx, uint32_t n_batch,
                            int n_head_kv, int n_vocab,
                            const std::vector<std::vector<int>> & prompts,
                            const std::vector<int> & steps, smol_type kv_type = SMOL_TYPE_F16) {
    model_ptr m = load(path);
    std::vector<float> want;
    int32_t chunk = 0;
    for (const placement_case & pc : placements(m.get(), n_ctx, n_batch, n_head_kv, kv_type)) {
        CAPTURE(pc.name);
        CAPTURE(pc.head_group);
        CAPTURE(pc.budget);
        context_ptr c = make_context(
            m.get(), sim_params(n_ctx, n_batch, uint32_t(prompts.size()), pc, kv_type));
        CHECK(memory_of(c.get()).kv_type == kv_type);
        const smol_memory_info mi = memory_of(c.get());
        CAPTURE(mi.n_heads_resident);
        CAPTURE(mi.head_group);
        // Exactness holds for one chunking: every placement must chunk alike.
        if (chunk == 0) chunk = mi.chunk;
        REQUIRE(mi.chunk == chunk);
        if (pc.mode == SMOL_KV_OFFLOAD_ALL) CHECK(mi.n_heads_resident == 0);
        if (pc.budget > 0) {
            CHECK(mi.n_heads_resident > 0);
            CHECK(mi.n_heads_resident < mi.n_heads);
        }
        const std::vector<float> got = run_workload(c.get(), n_vocab, prompts, steps);
        if (want.empty()) {
            want = got;
            continue;
        }
        CHECK(same_bits(got, want));
        if (pc.budget > 0) {
            const smol_memory_info after = memory_of(c.get());
            CHECK(after.device_peak <= pc.budget);
        }
    }
}

} // namespace

TEST_CASE("logits are bit-identical whether KV heads are resident, offloaded or mixed") {
    SMOL_TEST_DRAW_SEED(seed);
    const std::string path = temp_path("place.gguf");
    const tiny::shape s = placed_shape();
    tiny::write(path, s, seed);
    std::mt19937 rng(seed);
    const std::vector<std::vector<int>> prompts = {random_ids(rng, 45, s.n_vocab),
                                                   random_ids(rng, 20, s.n_vocab)};
    check_placements_agree(path, 256, 16, s.n_head_kv, s.n_vocab, prompts,
                           random_ids(rng, 8, s.n_vocab));
    std::filesystem::remove(path);
}

// Only placement changes, never the arithmetic, with quantized KV too: the
// blocks stored are the same bytes wherever they live and travel.
TEST_CASE("a q8_0 or q4_0 cache gives bit-identical logits resident, offloaded or mixed") {
    SMOL_TEST_DRAW_SEED(seed);
    const std::string path = temp_path("place-q.gguf");
    tiny::shape s = placed_shape();
    s.n_embd = 512; // heads of 64: two blocks each, rotated
    s.n_layer = 2;
    tiny::write(path, s, seed);
    std::mt19937 rng(seed);
    const std::vector<std::vector<int>> prompts = {random_ids(rng, 30, s.n_vocab),
                                                   random_ids(rng, 12, s.n_vocab)};
    const std::vector<int> steps = random_ids(rng, 8, s.n_vocab);
    for (smol_type t : {SMOL_TYPE_Q8_0, SMOL_TYPE_Q4_0}) {
        CAPTURE(std::string(smol_type_name(t)));
        check_placements_agree(path, 256, 16, s.n_head_kv, s.n_vocab, prompts, steps, t);
    }
    std::filesystem::remove(path);
}

// A decode step's copies cover whole granules of 256 cells, so steps of one
// token run the same graph until the history crosses into the next granule.
// The simulated device, like the GPU, runs such a graph again as it was;
// across the boundary the graph must be built anew.
TEST_CASE("one-token steps across a 256-cell granule give the logits of a resident cache") {
    SMOL_TEST_DRAW_SEED(seed);
    const std::string path = temp_path("granule.gguf");
    const tiny::shape s = placed_shape();
    tiny::write(path, s, seed);
    std::mt19937 rng(seed);
    // Prompts in calls of 64 tokens up to 240, then one token a call to 300:
    // the steps cross cell 256 and each of them keeps its logits.
    const std::vector<int> ids = random_ids(rng, 300, s.n_vocab);
    model_ptr m = load(path);
    std::vector<std::vector<float>> want;
    for (const placement_case pc : {placement_case{"resident", SMOL_KV_OFFLOAD_NONE, 0, 0},
                                    placement_case{"all offloaded", SMOL_KV_OFFLOAD_ALL, 1, 0},
                                    placement_case{"all offloaded", SMOL_KV_OFFLOAD_ALL, 2, 0}}) {
        CAPTURE(pc.name);
        CAPTURE(pc.head_group);
        context_ptr c = make_context(m.get(), sim_params(1024, 64, 1, pc));
        const auto got = decode_all(c.get(), ids, s.n_vocab, 64, 240);
        REQUIRE(got.size() == ids.size());
        if (want.empty()) {
            want = got;
            continue;
        }
        for (size_t i = 0; i < got.size(); ++i) {
            CAPTURE(i);
            CHECK(same_bits(got[i], want[i]));
        }
    }
    std::filesystem::remove(path);
}

TEST_CASE("sequences decoded together take cache pages of their own; one alone stays dense") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    using smol::kv_page;
    // Tokens of k sequences in a random order, each sequence taking m pages'
    // worth, into a cache of exactly k * m pages: every page must end up
    // holding one sequence, whose cells rise with its positions.
    const int k = 3, m = 2;
    smol::kv_cache kv;
    kv.init(1, 1, 8, k * m * kv_page);
    std::vector<int32_t> tail(k, -1), len(k, 0);
    std::vector<int> order;
    for (int s = 0; s < k; ++s) order.insert(order.end(), size_t(m * kv_page), s);
    std::shuffle(order.begin(), order.end(), rng);
    int32_t page_from = 0, cell_from = 0;
    for (size_t i = 0; i < order.size(); ++i) {
        const int s = order[i];
        if (i % 7 == 0) page_from = cell_from = 0; // a new batch
        const int32_t c = kv.find_cell(tail[size_t(s)], page_from, cell_from);
        REQUIRE(c >= 0);
        REQUIRE(kv.cell_pos[size_t(c)] < 0);
        kv.cell_pos[size_t(c)] = len[size_t(s)]++;
        kv.cell_seqs[size_t(c)] = smol::seq_mask::of(s);
        CHECK((tail[size_t(s)] < 0 || c > tail[size_t(s)]));
        tail[size_t(s)] = c;
    }
    for (int32_t pg = 0; pg < k * m; ++pg) {
        CAPTURE(pg);
        for (int32_t c = pg * kv_page; c < (pg + 1) * kv_page; ++c)
            CHECK(kv.cell_seqs[size_t(c)] == kv.cell_seqs[size_t(pg * kv_page)]);
    }
    page_from = cell_from = 0;
    CHECK(kv.find_cell(tail[0], page_from, cell_from) == -1);

    // With no wholly free page left, a new sequence takes the lowest free cell.
    kv.cell_pos[size_t(kv_page + 5)] = -1;
    kv.cell_pos[size_t(3 * kv_page + 1)] = -1;
    page_from = cell_from = 0;
    CHECK(kv.find_cell(-1, page_from, cell_from) == kv_page + 5);

    // One sequence alone fills the cache in order, across page ends.
    kv.clear();
    page_from = cell_from = 0;
    const int n = std::uniform_int_distribution<int>(kv_page + 1, 3 * kv_page)(rng);
    int32_t last = -1;
    for (int i = 0; i < n; ++i) {
        const int32_t c = kv.find_cell(last, page_from, cell_from);
        CHECK(c == i);
        kv.cell_pos[size_t(c)] = i;
        kv.cell_seqs[size_t(c)] = smol::seq_mask::of(0);
        last = c;
    }
}

TEST_CASE("a quantized cache's rotation is the orthonormal Walsh-Hadamard matrix, by head size") {
    using smol::kv_rot_k;
    using smol::kv_rot_v;
    CHECK(kv_rot_k(SMOL_TYPE_F16, 64) == 0);
    CHECK(kv_rot_v(SMOL_TYPE_F16, 128) == 0);
    CHECK(kv_rot_k(SMOL_TYPE_Q8_0, 32) == 0);
    CHECK(kv_rot_k(SMOL_TYPE_Q8_0, 96) == 0);
    CHECK(kv_rot_k(SMOL_TYPE_Q8_0, 64) == 64);
    CHECK(kv_rot_k(SMOL_TYPE_Q4_0, 128) == 128);
    CHECK(kv_rot_k(SMOL_TYPE_Q4_0, 192) == 64);
    CHECK(kv_rot_k(SMOL_TYPE_Q4_0, 256) == 256);
    CHECK(kv_rot_v(SMOL_TYPE_Q4_0, 256) == 64);
    CHECK(kv_rot_v(SMOL_TYPE_Q8_0, 96) == 0);
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist;
    for (int32_t len : {64, 128, 256}) {
        CAPTURE(len);
        // Two runs: each turned on its own, by H[i][j] = (-1)^popcount(i & j)
        // / sqrt(len) in float64; and turned twice, back where it was.
        std::vector<float> x(size_t(2 * len));
        for (float & e : x) e = dist(rng);
        std::vector<float> y = x;
        smol::kv_rotate(y.data(), int64_t(y.size()), len);
        int bad = 0, bad_back = 0;
        for (int32_t r = 0; r < 2; ++r) {
            for (int32_t i = 0; i < len; ++i) {
                double want = 0, mag = 0;
                for (int32_t j = 0; j < len; ++j) {
                    const double p = (__builtin_popcount(unsigned(i & j)) % 2 ? -1.0 : 1.0) *
                                     double(x[size_t(r * len + j)]);
                    want += p;
                    mag += std::fabs(p);
                }
                want /= std::sqrt(double(len));
                mag /= std::sqrt(double(len));
                bad += !(std::fabs(double(y[size_t(r * len + i)]) - want) <= 1e-6 * mag);
            }
        }
        std::vector<float> z = y;
        smol::kv_rotate(z.data(), int64_t(z.size()), len);
        for (size_t i = 0; i < z.size(); ++i)
            bad_back += !(std::fabs(z[i] - x[i]) <= 1e-5 * (1 + std::fabs(x[i])));
        CHECK(bad == 0);
        CHECK(bad_back == 0);
    }
}

TEST_CASE("the cache says whether n cells are free as counting them would") {
    // has_free trusts the cells past n_used to be free and counts only when
    // those are too few, and n_free counts below n_used only: sequences fill a cache, some are
    // dropped (holes below n_used, n_used shrinking when the last cells go), and after each change
    // every n agrees with the count.
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    smol::kv_cache kv;
    const int32_t n_cells = 3 * smol::kv_page + 17;
    kv.init(1, 1, 8, n_cells);
    bool holes = false; // free cells below n_used were seen
    auto agrees = [&]() {
        const auto free_cells =
            int32_t(std::count(kv.cell_pos.begin(), kv.cell_pos.end(), smol_pos(-1)));
        CHECK(kv.n_free() == free_cells);
        holes = holes || free_cells > n_cells - kv.n_used;
        int wrong = 0;
        for (int32_t n = 0; n <= n_cells + 1; ++n) wrong += kv.has_free(n) != (free_cells >= n);
        CAPTURE(free_cells);
        CAPTURE(kv.n_used);
        CHECK(wrong == 0);
    };
    agrees();
    std::vector<int32_t> tail(4, -1), len(4, 0);
    for (int round = 0; round < 6; ++round) {
        int32_t page_from = 0, cell_from = 0;
        const int take = std::uniform_int_distribution<int>(1, n_cells / 2)(rng);
        for (int i = 0; i < take; ++i) {
            const int s = int(rng() % 4);
            const int32_t c = kv.find_cell(tail[size_t(s)], page_from, cell_from);
            if (c < 0) break;
            kv.cell_pos[size_t(c)] = len[size_t(s)]++;
            kv.cell_seqs[size_t(c)] = smol::seq_mask::of(s);
            kv.n_used = std::max(kv.n_used, c + 1);
            tail[size_t(s)] = c;
        }
        agrees();
        const int drop = int(rng() % 4);
        kv.seq_rm(drop, 0, -1);
        tail[size_t(drop)] = -1;
        len[size_t(drop)] = 0;
        agrees();
    }
    CHECK(holes);
}

// A GPU backend keeps a copy of the cell table and, while the cache's
// version holds, compares only the cells a step takes; so every change by
// the cache's methods must move the version, and no cache may repeat a
// version another cache had (one made where a freed one lay included).
TEST_CASE("every change to the cache moves its version, and no two caches share one") {
    std::vector<uint64_t> seen;
    auto fresh = [&](uint64_t v) {
        const bool is_new = std::find(seen.begin(), seen.end(), v) == seen.end();
        seen.push_back(v);
        return is_new;
    };
    for (int round = 0; round < 3; ++round) {
        auto kv = std::make_unique<smol::kv_cache>();
        kv->init(1, 1, 8, 2 * smol::kv_page);
        CHECK(fresh(kv->version));
        for (int32_t c = 0; c < 10; ++c) {
            kv->cell_pos[size_t(c)] = c;
            kv->cell_seqs[size_t(c)] = smol::seq_mask::of(0);
        }
        kv->n_used = 10;
        kv->seq_cp(0, 1, 0, 5);
        CHECK(fresh(kv->version));
        const int32_t cells[2] = {6, 7};
        kv->cells_add_seq(cells, 2, 2);
        CHECK(fresh(kv->version));
        kv->cells_rm_seq(cells, 2, 2);
        CHECK(fresh(kv->version));
        kv->seq_rm(1, 0, -1);
        CHECK(fresh(kv->version));
        kv->clear();
        CHECK(fresh(kv->version));
    }
}

TEST_CASE("the simulated device's measured memory stays within the budget and near the plan") {
    SMOL_TEST_DRAW_SEED(seed);
    const std::string path = temp_path("budget.gguf");
    tiny::shape s;
    s.n_embd = 128;
    s.n_head = 8;
    s.n_head_kv = 4;
    s.n_layer = 4;
    s.n_ctx = 1024;
    tiny::write(path, s, seed);
    model_ptr m = load(path);
    std::mt19937 rng(seed);
    const std::vector<std::vector<int>> prompts = {random_ids(rng, 70, s.n_vocab)};
    context_ptr all =
        make_context(m.get(), sim_params(1024, 64, 1, {"", SMOL_KV_OFFLOAD_NONE, 0, 0}));
    const smol_memory_info full = memory_of(all.get());
    // Budgets from everything resident down to a fifth of the KV.
    for (uint64_t keep : {5u, 3u, 1u}) {
        const uint64_t budget = full.device_planned - full.device_kv * (5 - keep) / 5;
        CAPTURE(budget);
        context_ptr c =
            make_context(m.get(), sim_params(1024, 64, 1, {"", SMOL_KV_OFFLOAD_AUTO, 0, budget}));
        run_workload(c.get(), s.n_vocab, prompts, random_ids(rng, 4, s.n_vocab));
        const smol_memory_info mi = memory_of(c.get());
        CAPTURE(mi.n_heads_resident);
        CHECK(mi.device_planned <= budget);
        CHECK(mi.device_peak <= budget);
        // The plan accounts for what the device really holds.
        CHECK(mi.device_peak >= mi.device_planned - mi.device_planned / 10);
        if (keep == 5) CHECK(mi.n_heads_resident == mi.n_heads);
        if (keep < 5) {
            CHECK(mi.n_heads_resident < mi.n_heads);
            CHECK(mi.host_pinned >= mi.host_kv);
        }
    }
    std::filesystem::remove(path);
}

TEST_CASE("a batch longer than the plan's chunk runs in chunks, as if the caller had split it") {
    SMOL_TEST_DRAW_SEED(seed);
    const std::string path = temp_path("chunk.gguf");
    tiny::shape s;
    s.n_embd = 128;
    s.n_head = 8;
    s.n_head_kv = 4;
    s.n_layer = 3;
    tiny::write(path, s, seed);
    model_ptr m = load(path);
    // A budget of exactly the smallest plan with chunks of 8 tokens.
    context_ptr probe =
        make_context(m.get(), sim_params(256, 8, 1, {"", SMOL_KV_OFFLOAD_ALL, 1, 0}));
    const smol_memory_info pm = memory_of(probe.get());
    const uint64_t budget = pm.device_weights + pm.device_compute + pm.device_staging;
    context_ptr c =
        make_context(m.get(), sim_params(256, 64, 1, {"", SMOL_KV_OFFLOAD_AUTO, 1, budget}));
    const smol_memory_info mi = memory_of(c.get());
    CAPTURE(mi.chunk);
    REQUIRE(mi.chunk <= 8);
    CHECK(smol_context_n_batch(c.get()) == 64);
    std::mt19937 rng(seed);
    const std::vector<int> ids = random_ids(rng, 40, s.n_vocab);
    // One call of 40 tokens, chunked inside...
    const auto whole = decode_all(c.get(), ids, s.n_vocab, 64);
    CHECK(memory_of(c.get()).device_peak <= budget);
    // ...and the caller's own chunks of that size, everything resident.
    context_ptr ref = make_context(
        m.get(), sim_params(256, uint32_t(mi.chunk), 1, {"", SMOL_KV_OFFLOAD_NONE, 1, 0}));
    CHECK(same_bits(whole, decode_all(ref.get(), ids, s.n_vocab, mi.chunk)));
    std::filesystem::remove(path);
}

TEST_CASE("a batch asking for more logits than a chunk keeps runs in more chunks, every row kept") {
    SMOL_TEST_DRAW_SEED(seed);
    const std::string path = temp_path("outputs.gguf");
    tiny::shape s;
    s.n_vocab = 8192; // a chunk's logits would outweigh the rest of its compute
    s.n_embd = 64;
    s.n_layer = 2;
    s.n_ctx = 2048;
    tiny::write(path, s, seed);
    model_ptr m = load(path);
    constexpr uint32_t n_batch = 1536;
    // A budget of exactly what the planner asks for chunks of 1,536 tokens.
    context_ptr probe =
        make_context(m.get(), sim_params(2048, n_batch, 1, {"", SMOL_KV_OFFLOAD_NONE, 0, 0}));
    const smol_memory_info pm = memory_of(probe.get());
    CHECK(pm.chunk == int32_t(n_batch));
    // Planned for 512 logits rows, not one for each of the chunk's tokens.
    CHECK(pm.device_compute < uint64_t(n_batch) * uint64_t(s.n_vocab) * sizeof(float));
    const uint64_t budget = pm.device_planned;
    context_ptr c =
        make_context(m.get(), sim_params(2048, n_batch, 1, {"", SMOL_KV_OFFLOAD_AUTO, 0, budget}));
    CHECK(memory_of(c.get()).chunk == int32_t(n_batch));
    std::mt19937 rng(seed);
    const std::vector<int> ids = random_ids(rng, 1300, s.n_vocab);
    // 1,300 tokens in one call, every one keeping its logits: chunks of
    // 512, 512, 276...
    const auto whole = decode_all(c.get(), ids, s.n_vocab, int(n_batch));
    CHECK(memory_of(c.get()).device_peak <= budget);
    // ...as the caller's own batches of 100 give them.
    context_ptr ref =
        make_context(m.get(), sim_params(2048, 100, 1, {"", SMOL_KV_OFFLOAD_NONE, 0, 0}));
    CHECK(same_bits(whole, decode_all(ref.get(), ids, s.n_vocab, 100)));
    std::filesystem::remove(path);
}

TEST_CASE("a budget too small for the smallest plan fails at context creation with the numbers") {
    const std::string path = temp_path("small.gguf");
    tiny::shape s;
    SMOL_TEST_DRAW_SEED(seed);
    tiny::write(path, s, seed);
    model_ptr m = load(path);
    smol_context * c = nullptr;
    smol_context_params p = sim_params(256, 32, 1, {"", SMOL_KV_OFFLOAD_AUTO, 0, 4096});
    CHECK(smol_context_create(m.get(), &p, &c) == SMOL_ERR_OUT_OF_MEMORY);
    CHECK(c == nullptr);
    const std::string msg = smol_last_error();
    CAPTURE(msg);
    CHECK(msg.find("4.0 KiB") != std::string::npos);
    CHECK(msg.find("weights") != std::string::npos);
    CHECK(msg.find("--gpu-mem") != std::string::npos);

    // Everything resident cannot fit half of what it needs.
    context_ptr full =
        make_context(m.get(), sim_params(256, 32, 1, {"", SMOL_KV_OFFLOAD_NONE, 0, 0}));
    p = sim_params(256, 32, 1,
                   {"", SMOL_KV_OFFLOAD_NONE, 0, memory_of(full.get()).device_planned / 2});
    CHECK(smol_context_create(m.get(), &p, &c) == SMOL_ERR_OUT_OF_MEMORY);
    CHECK(std::string(smol_last_error()).find("--kv-offload auto") != std::string::npos);

    p = sim_params(256, 32, 1, {"", SMOL_KV_OFFLOAD_ALL, 3, 0});
    CHECK(smol_context_create(m.get(), &p, &c) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(std::string(smol_last_error()).find("does not divide") != std::string::npos);
    std::filesystem::remove(path);
}

namespace {

// One sequence: the prompt in chunks of the context's n_batch, then n_gen
// steps of one token; every position's logits, in order.
std::vector<std::vector<float>> run_one(smol_context * c, int n_vocab, const std::vector<int> & ids,
                                        int n_prompt) {
    std::vector<std::vector<float>> out;
    const int32_t cap = int32_t(smol_context_n_batch(c));
    smol_batch b = smol_batch_init(cap);
    for (int i = 0; i < int(ids.size());) {
        const int end = i < n_prompt ? std::min(n_prompt, i + cap) : i + 1;
        b.n_tokens = 0;
        for (int j = i; j < end; ++j) smol_batch_add(&b, cap, ids[size_t(j)], j, 0, true);
        INFO(std::string(smol_last_error()));
        REQUIRE(smol_decode(c, &b) == SMOL_OK);
        for (int j = 0; j < b.n_tokens; ++j) {
            const float * l = smol_get_logits(c, j);
            out.emplace_back(l, l + n_vocab);
        }
        i = end;
    }
    smol_batch_free(&b);
    return out;
}

// The largest difference from the float64 logits, over the largest of them.
double error_from(const std::vector<std::vector<float>> & got,
                  const std::vector<std::vector<double>> & ref) {
    double err = 0, top = 0;
    for (size_t t = 0; t < ref.size(); ++t)
        for (size_t v = 0; v < ref[t].size(); ++v) {
            err = std::max(err, std::abs(double(got[t][v]) - ref[t][v]));
            top = std::max(top, std::abs(ref[t][v]));
        }
    return err / top;
}

double largest_difference(const std::vector<float> & a, const std::vector<float> & b) {
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(double(a[i]) - double(b[i])));
    return d;
}

// Host attention (exact math in another order than the device's kernels):
// every placement that attends offloaded heads on the host comes within
// the device's own distance of the float64 reference (twice it, plus what
// the quantized cache's rounding adds), for a single sequence past several
// chunks; and two sequences batched together agree with the resident run
// as closely, so neither sees the other's cells.
void check_host_attention(smol_type kv_type, uint32_t seed) {
    const std::string path = temp_path("host-attend.gguf");
    tiny::shape s = placed_shape();
    s.wtype = SMOL_TYPE_F32; // no rounding of activations to hide attention's errors in
    if (kv_type != SMOL_TYPE_F16) {
        s.n_embd = 512; // heads of 64: quantized rows, rotated
        s.n_layer = 2;
    }
    const tiny::model mdl = tiny::write(path, s, seed);
    model_ptr m = load(path);
    std::mt19937 rng(seed);
    const std::vector<int> ids = random_ids(rng, 60, s.n_vocab);
    const std::vector<std::vector<double>> ref = tiny::reference(mdl, ids);
    constexpr int n_prompt = 52; // chunks of 16, then single tokens
    auto params = [&](smol_kv_offload mode, int G, uint64_t budget, smol_kv_attend attend) {
        smol_context_params p = sim_params(256, 16, 2, {"", mode, G, budget}, kv_type);
        p.kv_attend = attend;
        return p;
    };
    context_ptr res =
        make_context(m.get(), params(SMOL_KV_OFFLOAD_NONE, 0, 0, SMOL_KV_ATTEND_AUTO));
    const std::vector<std::vector<float>> on_device = run_one(res.get(), s.n_vocab, ids, n_prompt);
    const double err_device = error_from(on_device, ref);
    CAPTURE(err_device);
    // A budget keeping about half of the groups (G = 1) resident.
    context_ptr probe =
        make_context(m.get(), params(SMOL_KV_OFFLOAD_ALL, 1, 0, SMOL_KV_ATTEND_HOST));
    const smol_memory_info pm = memory_of(probe.get());
    CHECK(pm.n_heads_host == pm.n_heads);
    const uint64_t half = pm.device_weights + pm.device_compute + pm.host_kv / 2;
    struct config {
        const char * name;
        smol_kv_offload mode;
        int G;
        uint64_t budget;
    };
    const std::vector<std::vector<int>> prompts = {random_ids(rng, 45, s.n_vocab),
                                                   random_ids(rng, 20, s.n_vocab)};
    const std::vector<int> steps = random_ids(rng, 8, s.n_vocab);
    res = make_context(m.get(), params(SMOL_KV_OFFLOAD_NONE, 0, 0, SMOL_KV_ATTEND_AUTO));
    const std::vector<float> two_res = run_workload(res.get(), s.n_vocab, prompts, steps);
    for (const config & cf :
         {config{"all on the host, G=1", SMOL_KV_OFFLOAD_ALL, 1, 0},
          config{"all on the host, G=2", SMOL_KV_OFFLOAD_ALL, 2, 0},
          config{"all on the host, G=4", SMOL_KV_OFFLOAD_ALL, 4, 0},
          config{"half resident, half on the host", SMOL_KV_OFFLOAD_AUTO, 1, half}}) {
        const std::string config_name = cf.name;
        CAPTURE(config_name);
        context_ptr c =
            make_context(m.get(), params(cf.mode, cf.G, cf.budget, SMOL_KV_ATTEND_HOST));
        const smol_memory_info mi = memory_of(c.get());
        CHECK(mi.n_heads_host == mi.n_heads - mi.n_heads_resident);
        CHECK(mi.n_heads_host > 0);
        const std::vector<std::vector<float>> on_host = run_one(c.get(), s.n_vocab, ids, n_prompt);
        const double err_host = error_from(on_host, ref);
        // Against the device's own logits: what only the summation order
        // and the rounding of the weights to f16 change.
        std::vector<std::vector<double>> dev64;
        for (const auto & row : on_device) dev64.emplace_back(row.begin(), row.end());
        const double apart = error_from(on_host, dev64);
        CAPTURE(err_host);
        CAPTURE(apart);
        CHECK(err_host <= 2 * err_device);
        // Over a quantized cache both read the same rounded rows: they
        // differ far less than either differs from float64.
        CHECK(apart <= (kv_type == SMOL_TYPE_F16 ? 2 * err_device : err_device / 4));
        // Fresh cells for the two sequences.
        c = make_context(m.get(), params(cf.mode, cf.G, cf.budget, SMOL_KV_ATTEND_HOST));
        const std::vector<float> two = run_workload(c.get(), s.n_vocab, prompts, steps);
        double top = 0;
        for (float x : two_res) top = std::max(top, double(std::abs(x)));
        CHECK(largest_difference(two, two_res) / top <= 4 * err_device + 1e-5);
    }
    std::filesystem::remove(path);
}

} // namespace

TEST_CASE("offloaded heads attended on the host come as close to float64 as the device's") {
    SMOL_TEST_DRAW_SEED(seed);
    check_host_attention(SMOL_TYPE_F16, seed);
}

TEST_CASE("host attention over a q8_0 or q4_0 cache comes as close to float64 as the device's") {
    SMOL_TEST_DRAW_SEED(seed);
    for (smol_type t : {SMOL_TYPE_Q8_0, SMOL_TYPE_Q4_0}) {
        CAPTURE(std::string(smol_type_name(t)));
        check_host_attention(t, seed);
    }
}

// The host's attention node against float64 over the very rows stored: two
// sequences' cells interleaved at random, their lists sorted by position,
// tokens together and alone (alone: a head's cells in many chunks), with and
// without a window and sinks, over f16 and quantized rows.
TEST_CASE("the host's attention gives float64 attention over the stored rows") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    const smol::cpu::kernels & kern = smol::cpu::kernels_best();
    constexpr int n_kv = 2, per_kv = 3, hd = 64, n_cells = 3000;
    constexpr int n_head = n_kv * per_kv;
    smol::host_attention host(2);
    for (smol_type type : {SMOL_TYPE_F16, SMOL_TYPE_Q8_0, SMOL_TYPE_Q4_0}) {
        CAPTURE(std::string(smol_type_name(type)));
        smol::kv_cache kv;
        kv.init(1, n_kv, hd, n_cells, type);
        std::vector<uint16_t> K(size_t(n_kv) * n_cells * size_t(kv.row_words));
        std::vector<uint16_t> V(K.size());
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (int h = 0; h < n_kv; ++h)
            for (int c = 0; c < n_cells; ++c) {
                std::vector<float> row(hd);
                for (float & x : row) x = nd(rng);
                kern.row_from_f32(
                    type, row.data(),
                    K.data() + (size_t(h) * n_cells + size_t(c)) * size_t(kv.row_words), hd);
                for (float & x : row) x = nd(rng);
                kern.row_from_f32(
                    type, row.data(),
                    V.data() + (size_t(h) * n_cells + size_t(c)) * size_t(kv.row_words), hd);
            }
        kv.k = K.data();
        kv.v = V.data();
        // Cells in random order; sequence 0 takes about two thirds.
        std::vector<int32_t> perm(n_cells);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        int32_t len[2] = {0, 0};
        std::vector<int32_t> lists[2];
        for (int32_t c : perm) {
            const int sq = rng() % 3 == 0 ? 1 : 0;
            kv.cell_pos[size_t(c)] = len[sq]++;
            kv.cell_seqs[size_t(c)] = smol::seq_mask::of(sq);
            lists[sq].push_back(c);
        }
        kv.n_used = n_cells;
        std::vector<int32_t> seq_cells(lists[0]);
        seq_cells.insert(seq_cells.end(), lists[1].begin(), lists[1].end());
        const int32_t seq_begin[3] = {0, len[0], len[0] + len[1]};
        // Tokens: each sequence's last position, and one in the middle.
        const std::vector<smol_pos> pos = {len[0] - 1, len[1] - 1, len[0] / 2};
        const std::vector<smol_seq_id> seq = {0, 1, 0};
        std::vector<float> q(pos.size() * size_t(n_head) * hd);
        for (float & x : q) x = nd(rng);
        for (const std::pair<int, int> & ws : {std::pair{0, 0}, std::pair{300, 20}}) {
            const int window = ws.first, sink = ws.second;
            CAPTURE(window);
            // float64: q as the kernels round it, turned as K was.
            std::vector<double> want(q.size());
            for (size_t i = 0; i < pos.size(); ++i)
                for (int h = 0; h < n_head; ++h) {
                    std::vector<float> qh(hd);
                    for (int d = 0; d < hd; ++d)
                        qh[size_t(d)] = smol::cpu::fp16_to_fp32(
                            smol::cpu::fp32_to_fp16(q[(i * n_head + size_t(h)) * hd + size_t(d)]));
                    smol::kv_rotate(qh.data(), hd, kv.rot_k);
                    const int hk = h / per_kv;
                    std::vector<double> sc;
                    std::vector<std::vector<float>> vs;
                    for (int32_t c : lists[seq[i]]) {
                        const smol_pos p = kv.cell_pos[size_t(c)];
                        if (p > pos[i] || (window > 0 && pos[i] - p >= window && p >= sink))
                            continue;
                        std::vector<float> kr(hd), vr(hd);
                        const size_t at = (size_t(hk) * n_cells + size_t(c)) * size_t(kv.row_words);
                        kern.row_to_f32(type, K.data() + at, kr.data(), hd);
                        kern.row_to_f32(type, V.data() + at, vr.data(), hd);
                        double dot = 0;
                        for (int d = 0; d < hd; ++d)
                            dot += double(qh[size_t(d)]) * double(kr[size_t(d)]);
                        sc.push_back(dot / std::sqrt(double(hd)));
                        vs.push_back(vr);
                    }
                    const double mx = *std::max_element(sc.begin(), sc.end());
                    double sum = 0;
                    std::vector<double> o(hd, 0.0);
                    for (size_t j = 0; j < sc.size(); ++j) {
                        const double w = std::exp(sc[j] - mx);
                        sum += w;
                        for (int d = 0; d < hd; ++d) o[size_t(d)] += w * double(vs[j][size_t(d)]);
                    }
                    std::vector<float> of(hd);
                    for (int d = 0; d < hd; ++d) of[size_t(d)] = float(o[size_t(d)] / sum);
                    smol::kv_rotate(of.data(), hd, kv.rot_v); // rounding far below the bound
                    for (int d = 0; d < hd; ++d)
                        want[(i * n_head + size_t(h)) * hd + size_t(d)] = of[size_t(d)];
                }
            // Together, then each token alone.
            for (int alone = -1; alone < int(pos.size()); ++alone) {
                CAPTURE(alone);
                const size_t i0 = alone < 0 ? 0 : size_t(alone);
                const size_t n = alone < 0 ? pos.size() : 1;
                smol::tensor qt, at;
                smol::tensor_set_shape(qt, SMOL_TYPE_F32, int64_t(n_head) * hd, int64_t(n));
                smol::tensor_set_shape(at, SMOL_TYPE_F32, int64_t(n_head) * hd, int64_t(n));
                std::vector<float> out(size_t(n) * n_head * hd, std::nanf(""));
                qt.data = q.data() + i0 * size_t(n_head) * hd;
                at.data = out.data();
                at.kind = smol::OP_ATTENTION;
                at.src[0] = &qt;
                at.iparams[1] = n_head;
                at.iparams[2] = n_kv;
                at.iparams[3] = hd;
                at.iparams[4] = window;
                at.iparams[5] = sink;
                at.kv = kv.layer_view(0);
                at.on_host = true;
                smol::batch_info b;
                b.pos = pos.data() + i0;
                b.seq = seq.data() + i0;
                b.n_tokens = int32_t(n);
                b.kv = &kv;
                b.seq_cells = seq_cells.data();
                b.seq_begin = seq_begin;
                host.run(&at, b);
                double err = 0;
                for (size_t j = 0; j < out.size(); ++j)
                    err = std::max(err, std::abs(double(out[j]) - want[i0 * n_head * hd + j]));
                CAPTURE(err);
                CHECK(err < 2e-5); // outputs are averages of rows of about unit size
            }
        }
    }
}

TEST_CASE("the host's attention speed is measured, per cache type") {
    smol::host_attention h(2);
    for (smol_type t : {SMOL_TYPE_F16, SMOL_TYPE_Q8_0}) {
        const double rate = h.measure(64, 3, t);
        CAPTURE(rate);
        // Bytes a second: timing is the machine's (an emulated CPU reads tens of MB/s), so only
        // its sanity is asked: positive, finite and below any memory's speed.
        CHECK(rate > 0);
        CHECK(rate < 1e13);
        CHECK(h.measure(64, 3, t) == rate); // once per process
    }
}

namespace {

// SmolLM2-1.7B's attention shape, with weights and compute memory given.
smol::plan_input shape_17b(uint64_t budget, int32_t n_ctx) {
    smol::plan_input in;
    in.n_layer = 24;
    in.n_head_kv = 32;
    in.head_dim = 64;
    in.n_cells = n_ctx;
    in.n_batch = 512;
    in.budget = budget;
    in.weight_bytes = 3422ull << 20; // f16
    in.compute_bytes = [](int32_t n) { return uint64_t(64 << 20) + uint64_t(n) * (1 << 20); };
    return in;
}

constexpr uint64_t GiB = 1ull << 30;

} // namespace

TEST_CASE("the planner keeps everything resident exactly up to the budget's limit") {
    smol::plan_input in = shape_17b(0, 32768);
    const smol::kv_plan free_plan = smol::make_plan(in);
    CHECK(free_plan.n_resident_groups() == free_plan.n_layer * free_plan.n_group);
    CHECK(free_plan.n_slots == 0);
    // A budget of exactly what everything resident needs: all resident.
    in.budget = free_plan.device_bytes();
    const smol::kv_plan at = smol::make_plan(in);
    CHECK(at.n_offloaded_groups() == 0);
    CHECK(at.device_bytes() == in.budget);
    // One byte less: something must move to host, with two slots.
    in.budget -= 1;
    const smol::kv_plan below = smol::make_plan(in);
    CHECK(below.n_offloaded_groups() > 0);
    CHECK(below.n_slots == 2);
    CHECK(below.device_bytes() <= in.budget);
}

TEST_CASE("the planner counts a q8_0 or q4_0 cache by its blocks and keeps more of it resident") {
    // 1M cells of the 1.7B shape under 24 GiB: a tenth of the f16 KV fits.
    smol::plan_input in = shape_17b(24 * GiB, 1 << 20);
    const smol::kv_plan f16 = smol::make_plan(in);
    in.kv_type = SMOL_TYPE_Q8_0;
    const smol::kv_plan q8 = smol::make_plan(in);
    in.kv_type = SMOL_TYPE_Q4_0;
    const smol::kv_plan q4 = smol::make_plan(in);
    // A row of 64 elements: 128 bytes of f16, two blocks of 34 (q8_0) or 18.
    CHECK(f16.row_bytes() == 128);
    CHECK(q8.row_bytes() == 68);
    CHECK(q4.row_bytes() == 36);
    for (const smol::kv_plan * p : {&f16, &q8, &q4}) {
        CHECK(p->group_bytes() == 2ull * uint64_t(p->G) * (1u << 20) * p->row_bytes());
        CHECK(p->device_bytes() <= in.budget);
        CHECK(p->n_offloaded_groups() > 0);
    }
    REQUIRE(f16.G == q8.G);
    REQUIRE(f16.G == q4.G);
    // The same budget holds 128/68 (1.88) and 128/36 (3.56) times the
    // resident heads, a little more as the two staging slots shrink too.
    const double r8 = double(q8.n_resident_groups()) / double(f16.n_resident_groups());
    const double r4 = double(q4.n_resident_groups()) / double(f16.n_resident_groups());
    CHECK(r8 > 128.0 / 68);
    CHECK(r8 < 1.95);
    CHECK(r4 > 128.0 / 36);
    CHECK(r4 < 3.7);
    CHECK(q8.format().find("kv-type q8_0 (approximate)") != std::string::npos);
    CHECK(f16.format().find("kv-type f16,") != std::string::npos);
}

TEST_CASE("the planner shrinks head groups for long contexts and honours G = 1") {
    const smol::kv_plan short_ctx = smol::make_plan(shape_17b(24 * GiB, 4096));
    CHECK(short_ctx.G == 32);
    // Streaming a short context: groups large enough for full-speed copies.
    smol::plan_input all_short = shape_17b(24 * GiB, 4096);
    all_short.mode = SMOL_KV_OFFLOAD_ALL;
    const smol::kv_plan streamed = smol::make_plan(all_short);
    CHECK(streamed.G > 1);
    CHECK(streamed.group_bytes() >= (4u << 20));
    const smol::kv_plan long_ctx = smol::make_plan(shape_17b(24 * GiB, 512 * 1024));
    CHECK(long_ctx.G < short_ctx.G);
    CHECK(long_ctx.n_offloaded_groups() > 0);
    CHECK(long_ctx.device_bytes() <= 24 * GiB);
    MESSAGE("1.7B shape at 512K tokens in 24 GiB:\n" << long_ctx.format());

    smol::plan_input in = shape_17b(24 * GiB, 512 * 1024);
    in.head_group = 1;
    const smol::kv_plan g1 = smol::make_plan(in);
    CHECK(g1.G == 1);
    CHECK(g1.n_group == 32);
    CHECK(g1.group_forced);
    CHECK(g1.device_bytes() <= 24 * GiB);
    // G = 1 leaves more room for resident heads than larger slots do.
    CHECK(g1.n_resident_groups() * g1.G >= long_ctx.n_resident_groups() * long_ctx.G);

    // SmolLM2-135M at a million tokens in 8 GiB.
    smol::plan_input s135;
    s135.n_layer = 30;
    s135.n_head_kv = 3;
    s135.head_dim = 64;
    s135.n_cells = 1 << 20;
    s135.budget = 8 * GiB;
    s135.weight_bytes = 95ull << 20;
    s135.compute_bytes = [](int32_t n) { return uint64_t(48 << 20) + uint64_t(n) * (256 << 10); };
    const smol::kv_plan p135 = smol::make_plan(s135);
    CHECK(p135.device_bytes() <= 8 * GiB);
    CHECK(p135.n_offloaded_groups() > 0);
    CHECK(p135.n_resident_groups() > 0);
}

TEST_CASE("the planner takes smaller prefill chunks from smaller budgets") {
    smol::plan_input in = shape_17b(0, 512 * 1024);
    in.mode = SMOL_KV_OFFLOAD_ALL;
    in.compute_bytes = [](int32_t n) { return uint64_t(n) * (16 << 20); }; // 8 GiB at 512
    in.budget = 40 * GiB;
    const smol::kv_plan big = smol::make_plan(in);
    in.budget = 12 * GiB;
    const smol::kv_plan small = smol::make_plan(in);
    CHECK(big.chunk == 512);
    CHECK(small.chunk < big.chunk);
    CHECK(small.device_bytes() <= 12 * GiB);
}

TEST_CASE("the planner halves the prefill chunk, down to 512 tokens, before offloading a head") {
    smol::plan_input in = shape_17b(0, 32768);
    in.n_batch = 4096;
    const smol::kv_plan whole = smol::make_plan(in);
    CHECK(whole.chunk == 4096);
    in.n_batch = 1024;
    const smol::kv_plan at_1024 = smol::make_plan(in);
    in.n_batch = 512;
    const smol::kv_plan at_512 = smol::make_plan(in);
    // Room for everything at 1,024 tokens, not at 2,048: all heads stay.
    in.n_batch = 4096;
    in.budget = at_1024.device_bytes() + (1u << 20);
    const smol::kv_plan shrunk = smol::make_plan(in);
    CHECK(shrunk.chunk == 1024);
    CHECK(shrunk.n_offloaded_groups() == 0);
    CHECK(shrunk.device_bytes() <= in.budget);
    // Below what 512 tokens need: heads go to host, the chunk from the budget.
    in.budget = at_512.device_bytes() - 1;
    const smol::kv_plan offloaded = smol::make_plan(in);
    CHECK(offloaded.n_offloaded_groups() > 0);
    CHECK(offloaded.device_bytes() <= in.budget);
}

TEST_CASE("the planner splits offloaded groups between the link and the host by their speeds") {
    smol::plan_input in = shape_17b(24 * GiB, 131072);
    in.mode = SMOL_KV_OFFLOAD_AUTO;
    const smol::kv_plan streamed = smol::make_plan(in); // no speeds: everything streams
    const int32_t n_off = streamed.n_offloaded_groups();
    REQUIRE(n_off > 4);
    CHECK(streamed.n_host_groups() == 0);
    CHECK(streamed.n_slots == 2);
    // Shared speeds whose sum beats either way alone: the split in their
    // proportion, spread evenly.
    for (double host : {20e9, 54e9, 100e9}) {
        CAPTURE(host);
        in.rates = {54e9, host, 40e9, 0.8 * host};
        const smol::kv_plan p = smol::make_plan(in);
        CHECK(p.resident == streamed.resident);
        const double share = 0.8 * host / (40e9 + 0.8 * host);
        CHECK(std::abs(double(p.n_host_groups()) - n_off * share) <= 0.5);
        CHECK(p.n_slots == 2); // prompts stream every offloaded group
        // In offloaded order, every run of 8 groups holds about 8 times
        // the host's share.
        std::vector<int> order;
        for (int32_t l = 0; l < p.n_layer; ++l)
            for (int32_t g = 0; g < p.n_group; ++g)
                if (!p.is_resident(l, g)) order.push_back(p.is_on_host(l, g));
        for (size_t i = 0; i + 8 <= order.size(); i += 8) {
            const int n = std::accumulate(order.begin() + long(i), order.begin() + long(i) + 8, 0);
            CHECK(std::abs(double(n) - 8 * share) <= 1.0);
        }
        CHECK(p.format().find("attended on the host") != std::string::npos);
    }
    // Sharing the host's memory, the two together no faster than the link
    // alone: everything streams; than the host alone: everything on the host.
    in.rates = {54e9, 40e9, 30e9, 20e9};
    CHECK(smol::make_plan(in).n_host_groups() == 0);
    in.rates = {54e9, 80e9, 20e9, 50e9};
    CHECK(smol::make_plan(in).n_host_groups() == n_off);
    // Not measured (a zero): everything streams.
    in.rates = {54e9, 80e9, 0, 50e9};
    CHECK(smol::make_plan(in).n_host_groups() == 0);
    // device: all stream whatever the speeds; host: none streams at decode
    // steps (prompts still need the slots).
    in.attend = SMOL_KV_ATTEND_DEVICE;
    CHECK(smol::make_plan(in).n_host_groups() == 0);
    in.attend = SMOL_KV_ATTEND_HOST;
    const smol::kv_plan all_host = smol::make_plan(in);
    CHECK(all_host.n_streamed_groups() == 0);
    CHECK(all_host.n_slots == 2);
    CHECK(all_host.resident == streamed.resident);
}

TEST_CASE("streaming heads' groups are never attended on the host") {
    smol::plan_input in = shape_17b(0, 4096);
    in.mode = SMOL_KV_OFFLOAD_ALL;
    in.attend = SMOL_KV_ATTEND_HOST;
    in.head_group = 1;
    in.streaming.assign(size_t(in.n_layer) * size_t(in.n_head_kv), 0);
    for (size_t h = 0; h < in.streaming.size(); h += 3) in.streaming[h] = 1;
    in.streaming_sink = 64;
    in.streaming_window = 256;
    const smol::kv_plan p = smol::make_plan(in);
    int n_streamed = 0;
    for (int32_t l = 0; l < p.n_layer; ++l)
        for (int32_t g = 0; g < p.n_group; ++g) {
            const bool streaming = in.streaming[size_t(l) * size_t(p.n_head_kv) + size_t(g)];
            CHECK(p.is_on_host(l, g) == !streaming);
            n_streamed += p.is_streamed(l, g);
        }
    CHECK(n_streamed == p.n_streamed_groups());
    CHECK(p.n_slots == 2);
}

TEST_CASE("a tiny budget is refused by the planner with every number in the message") {
    smol::plan_input in = shape_17b(2 * GiB, 512 * 1024);
    try {
        smol::make_plan(in);
        FAIL("a 2 GiB budget cannot hold 3.3 GiB of weights");
    } catch (const smol::error & e) {
        const std::string msg = e.what();
        CAPTURE(msg);
        CHECK(e.status == SMOL_ERR_OUT_OF_MEMORY);
        CHECK(msg.find("2.00 GiB") != std::string::npos);
        CHECK(msg.find("weights 3.34 GiB") != std::string::npos);
        CHECK(msg.find("staging") != std::string::npos);
        CHECK(msg.find("--gpu-mem") != std::string::npos);
    }
}

namespace {

// The schedule of the last step of a context built through the C++ layer.
struct scheduled {
    std::unique_ptr<smol::llama_model> model;
    std::unique_ptr<smol::llama_context> ctx;
    smol::schedule s;
};

int32_t pos_in_stream(const smol::schedule & s, int stream, int32_t node) {
    const auto & p = s.prog[stream];
    for (size_t i = 0; i < p.size(); ++i)
        if (p[i].what == smol::schedule::kind::run && p[i].node == node) return int32_t(i);
    return -1;
}

// Whether stream `st` waits, before its instruction at `before`, for an
// event recorded at or after node `node` of another stream.
bool waits_for(const smol::schedule & s, int st, int32_t before, int32_t node) {
    for (int32_t i = 0; i < before; ++i) {
        const auto & in = s.prog[st][size_t(i)];
        if (in.what == smol::schedule::kind::wait && s.event_node[size_t(in.event)] >= node &&
            s.node_stream[size_t(s.event_node[size_t(in.event)])] == s.node_stream[size_t(node)]) {
            return true;
        }
    }
    return false;
}

void check_schedule(const smol::graph & g, const smol::schedule & s, const smol::kv_plan & plan) {
    using smol::tensor;
    const auto & nodes = g.nodes();
    std::vector<const tensor *> prefetches, attentions;
    for (const tensor * t : nodes) {
        if (t->kind == smol::OP_COPY && t->copy.dir == smol::copy_dir::h2d) prefetches.push_back(t);
        if (t->kind == smol::OP_ATTENTION) attentions.push_back(t);
    }
    CHECK(int(prefetches.size()) == plan.n_offloaded_groups());
    CHECK(int(attentions.size()) == plan.n_layer * plan.n_group);
    int slot_readers = 0;
    for (const tensor * a : attentions) {
        const int32_t ai = a->node_index;
        if (a->kv.slot < 0) continue;
        ++slot_readers;
        // The PREFETCH that last filled this slot before the attention.
        const tensor * filled = nullptr;
        for (const tensor * p : prefetches)
            if (p->node_index < ai && p->iparams[2] == a->kv.slot) filled = p;
        REQUIRE(filled);
        CHECK(filled->iparams[0] == a->iparams[0]);
        CHECK(filled->iparams[1] * plan.G == a->kv.h0);
        const int32_t at = pos_in_stream(s, 0, ai);
        REQUIRE(at >= 0);
        CHECK(waits_for(s, 0, at, filled->node_index));
    }
    CHECK(slot_readers == plan.n_offloaded_groups());
    // Each PREFETCH but the first is issued before the attention of the
    // group that runs before its own (overlap, across layers too), and after
    // the slot's previous reader and OFFLOAD finished (WAR).
    for (size_t k = 0; k < prefetches.size(); ++k) {
        const tensor * p = prefetches[k];
        const int32_t flat = (p->iparams[0] - plan.first_layer) * plan.n_group + p->iparams[1];
        if (flat > 0) {
            const tensor * prev = attentions[size_t(flat - 1)];
            CHECK(p->node_index < prev->node_index);
        }
        const int32_t at = pos_in_stream(s, 1, p->node_index);
        REQUIRE(at >= 0);
        for (const tensor * a : attentions) {
            if (a->kv.slot == p->iparams[2] && a->node_index < p->node_index)
                CHECK(waits_for(s, 1, at, a->node_index));
        }
        for (const tensor * t : nodes) {
            if (t->kind == smol::OP_COPY && t->copy.dir == smol::copy_dir::d2h &&
                t->iparams[2] == p->iparams[2] && t->node_index < p->node_index)
                CHECK(waits_for(s, 1, at, t->node_index));
        }
    }
}

} // namespace

TEST_CASE("the schedule waits for each prefetch, issues it a group early and never overwrites a "
          "slot in use") {
    SMOL_TEST_DRAW_SEED(seed);
    const std::string path = temp_path("sched.gguf");
    tiny::shape sh;
    sh.n_embd = 128;
    sh.n_head = 8;
    sh.n_head_kv = 4;
    sh.n_layer = 3;
    tiny::write(path, sh, seed);
    std::mt19937 rng(seed);
    for (const placement_case pc : {placement_case{"all G=1", SMOL_KV_OFFLOAD_ALL, 1, 0},
                                    placement_case{"all G=2", SMOL_KV_OFFLOAD_ALL, 2, 0},
                                    placement_case{"all G=4", SMOL_KV_OFFLOAD_ALL, 4, 0}}) {
        CAPTURE(pc.name);
        auto model = smol::llama_model::load(path, smol_model_default_params());
        const smol_context_params p = sim_params(256, 32, 1, pc);
        smol::llama_context ctx(*model, p);
        smol_batch b = smol_batch_init(32);
        const std::vector<int> ids = random_ids(rng, 40, sh.n_vocab);
        for (size_t i = 0; i < ids.size(); ++i) {
            smol_batch_add(&b, 32, ids[i], smol_pos(i), 0, false);
            if (b.n_tokens == 32 || i + 1 == ids.size()) {
                ctx.decode(b);
                smol::schedule s;
                smol::make_schedule(ctx.last_graph(), s);
                check_schedule(ctx.last_graph(), s, ctx.plan());
                b.n_tokens = 0;
            }
        }
        const std::string text = ctx.schedule_text(1);
        CHECK(text.find("PREFETCH") != std::string::npos);
        CHECK(text.find("OFFLOAD") != std::string::npos);
        CHECK(text.find("wait") != std::string::npos);
        smol_batch_free(&b);
    }
    // A mixed plan: copies only for offloaded groups.
    {
        auto model = smol::llama_model::load(path, smol_model_default_params());
        smol::llama_context probe(*model, sim_params(256, 32, 1, {"", SMOL_KV_OFFLOAD_ALL, 1, 0}));
        const uint64_t budget = probe.plan().weight_bytes + probe.plan().compute_bytes +
                                2 * probe.plan().group_bytes() + 5 * probe.plan().group_bytes();
        smol::llama_context ctx(*model,
                                sim_params(256, 32, 1, {"", SMOL_KV_OFFLOAD_AUTO, 1, budget}));
        CHECK(ctx.plan().n_resident_groups() == 5);
        smol_batch b = smol_batch_init(32);
        for (int i = 0; i < 20; ++i) smol_batch_add(&b, 32, i + 1, i, 0, i == 19);
        ctx.decode(b);
        smol::schedule s;
        smol::make_schedule(ctx.last_graph(), s);
        check_schedule(ctx.last_graph(), s, ctx.plan());
        smol_batch_free(&b);
    }
    std::filesystem::remove(path);
}

TEST_CASE("SmolLM2-135M gives bit-identical logits with its KV resident, offloaded or mixed") {
    INFO("the real model is missing: run scripts/fetch-model.sh (looked for " << SMOL_MODEL << ")");
    REQUIRE(std::filesystem::exists(SMOL_MODEL));
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    const int n_vocab = 49152;
    const std::vector<std::vector<int>> prompts = {random_ids(rng, 40, n_vocab),
                                                   random_ids(rng, 9, n_vocab)};
    model_ptr m = load(SMOL_MODEL);
    std::vector<float> f16;
    for (smol_type t : {SMOL_TYPE_F16, SMOL_TYPE_Q8_0}) {
        CAPTURE(std::string(smol_type_name(t)));
        std::vector<float> want;
        for (const placement_case & pc :
             {placement_case{"resident", SMOL_KV_OFFLOAD_NONE, 1, 0},
              placement_case{"all offloaded", SMOL_KV_OFFLOAD_ALL, 1, 0},
              placement_case{"all offloaded G=3", SMOL_KV_OFFLOAD_ALL, 3, 0}}) {
            CAPTURE(pc.name);
            context_ptr c = make_context(m.get(), sim_params(512, 32, 2, pc, t));
            const std::vector<float> got = run_workload(c.get(), n_vocab, prompts, {1, 2, 3});
            if (want.empty()) {
                want = got;
            } else {
                CHECK(same_bits(got, want));
            }
        }
        // The q8_0 cache is another cache: its logits are not f16's.
        if (t == SMOL_TYPE_F16)
            f16 = want;
        else
            CHECK(!same_bits(want, f16));
    }
    // Mixed: half the layers' heads resident, from the all-offloaded figures.
    context_ptr probe =
        make_context(m.get(), sim_params(512, 32, 2, {"", SMOL_KV_OFFLOAD_ALL, 1, 0}));
    const smol_memory_info mi = memory_of(probe.get());
    const uint64_t budget =
        mi.device_weights + mi.device_compute + mi.device_staging + mi.host_kv / 2;
    context_ptr c =
        make_context(m.get(), sim_params(512, 32, 2, {"mixed", SMOL_KV_OFFLOAD_AUTO, 1, budget}));
    const smol_memory_info mixed = memory_of(c.get());
    CHECK(mixed.n_heads_resident > 0);
    CHECK(mixed.n_heads_resident < mixed.n_heads);
    CHECK(same_bits(run_workload(c.get(), n_vocab, prompts, {1, 2, 3}), f16));
    CHECK(memory_of(c.get()).device_peak <= budget);
}
