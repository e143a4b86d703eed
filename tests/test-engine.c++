// test-engine.c++ - what serving relies on: KV cells shared between
// sequences, logits that are the same bits whatever else is in the batch
// and wherever a sequence's cells lie, the radix tree of cached prefixes on
// its own, and the engine (continuous batching, chunked prefill, prefix
// reuse, preemption, cancellation, bad requests) on random llamas and on
// the real SmolLM2-135M-Instruct.

#include "smol-engine.h"
#include "smol.h"
#include "test-seed.h"
#include "tiny-model.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <doctest/doctest.h>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

struct model_deleter {
    void operator()(smol_model * m) const { smol_model_free(m); }
};
struct context_deleter {
    void operator()(smol_context * c) const { smol_context_free(c); }
};
struct engine_deleter {
    void operator()(smol_engine * e) const { smol_engine_free(e); }
};
using model_ptr = std::unique_ptr<smol_model, model_deleter>;
using context_ptr = std::unique_ptr<smol_context, context_deleter>;
using engine_ptr = std::unique_ptr<smol_engine, engine_deleter>;

std::string temp_path(const std::string & name) {
    return (std::filesystem::temp_directory_path() /
            ("smol-test-engine-" + std::to_string(::getpid()) + "-" + name))
        .string();
}

model_ptr load(const std::string & path) {
    smol_model * m = nullptr;
    const smol_status st = smol_model_load(path.c_str(), nullptr, &m);
    INFO(std::string(smol_last_error()));
    REQUIRE(st == SMOL_OK);
    return model_ptr(m);
}

model_ptr load_real() {
    INFO("the real model is missing: run scripts/fetch-model.sh (looked for " << SMOL_MODEL << ")");
    REQUIRE(std::filesystem::exists(SMOL_MODEL));
    return load(SMOL_MODEL);
}

// A tiny random llama of weight type t, written to a temporary file.
struct tiny_file {
    std::string path;
    model_ptr model;
    int n_vocab = 0;
    tiny_file(smol_type t, uint32_t seed, const std::string & name) : path(temp_path(name)) {
        tiny::shape s;
        s.wtype = t;
        tiny::write(path, s, seed);
        model = load(path);
        n_vocab = s.n_vocab;
    }
    ~tiny_file() { std::filesystem::remove(path); }
};

context_ptr make_context(smol_model * m, uint32_t n_ctx, uint32_t n_seq, int threads = 2) {
    smol_context_params p = smol_context_default_params();
    p.n_ctx = n_ctx;
    p.n_batch = n_ctx;
    p.n_seq_max = n_seq;
    p.n_threads = threads;
    smol_context * c = nullptr;
    const smol_status st = smol_context_create(m, &p, &c);
    INFO(std::string(smol_last_error()));
    REQUIRE(st == SMOL_OK);
    return context_ptr(c);
}

std::vector<int> random_ids(std::mt19937 & rng, int n, int lo, int hi) {
    std::uniform_int_distribution<int> d(lo, hi - 1);
    std::vector<int> v(static_cast<size_t>(n));
    for (auto & x : v) x = d(rng);
    return v;
}

bool same_bits(const float * a, const float * b, int n) {
    return std::memcmp(a, b, size_t(n) * sizeof(float)) == 0;
}

// One batch entry: which sequence, which of its tokens.
struct slot {
    smol_seq_id seq;
    smol_pos pos;
    smol_token token;
};

// Decodes entries in batches of the given sizes; returns the logits of
// every entry of sequence `keep`, by position.
std::map<smol_pos, std::vector<float>> decode_mixed(smol_context * c, const std::vector<slot> & all,
                                                    const std::vector<int> & sizes,
                                                    smol_seq_id keep, int n_vocab) {
    std::map<smol_pos, std::vector<float>> out;
    smol_batch b = smol_batch_init(int32_t(all.size()));
    size_t i = 0, k = 0;
    while (i < all.size()) {
        const size_t n = std::min(all.size() - i, size_t(sizes[k % sizes.size()]));
        ++k;
        b.n_tokens = 0;
        for (size_t j = i; j < i + n; ++j)
            smol_batch_add(&b, int32_t(all.size()), all[j].token, all[j].pos, all[j].seq, true);
        const smol_status st = smol_decode(c, &b);
        INFO(std::string(smol_last_error()));
        REQUIRE(st == SMOL_OK);
        for (size_t j = i; j < i + n; ++j) {
            if (all[j].seq != keep) continue;
            const float * l = smol_get_logits(c, int32_t(j - i));
            REQUIRE(l);
            out[all[j].pos].assign(l, l + n_vocab);
        }
        i += n;
    }
    smol_batch_free(&b);
    return out;
}

// Decodes `ids` as sequence 0 alone, in one batch, and again in a context
// whose cells were fragmented by other sequences, interleaved with them in
// batches of odd sizes (a one-token step among them); every logit row must
// be the same bits.
void check_batch_invariance(smol_model * m, const std::vector<int> & ids, int n_vocab,
                            std::mt19937 & rng) {
    const int n = int(ids.size());
    context_ptr alone = make_context(m, 256, 1);
    std::vector<slot> solo;
    for (int i = 0; i < n; ++i) solo.push_back({0, i, ids[size_t(i)]});
    const auto want = decode_mixed(alone.get(), solo, {n}, 0, n_vocab);

    context_ptr mixed = make_context(m, 256, 4);
    // Fill the low cells with sequences 1 and 2, then drop 1: holes.
    const std::vector<int> f1 = random_ids(rng, 23, 0, n_vocab),
                           f2 = random_ids(rng, 9, 0, n_vocab);
    std::vector<slot> fill;
    for (int i = 0; i < 23; ++i) {
        fill.push_back({1, i, f1[size_t(i)]});
        if (i < 9) fill.push_back({2, i, f2[size_t(i)]});
    }
    decode_mixed(mixed.get(), fill, {11, 21}, 0, n_vocab);
    smol_kv_seq_rm(mixed.get(), 1, 0, -1);
    // Sequence 0 interleaved with 2 and a new 3, in uneven batches.
    const std::vector<int> f3 = random_ids(rng, n, 0, n_vocab);
    std::vector<slot> work;
    for (int i = 0; i < n; ++i) {
        if (i % 3 == 0) work.push_back({2, 9 + i / 3, f2[size_t(i / 3) % f2.size()]});
        work.push_back({0, i, ids[size_t(i)]});
        if (i % 2 == 1) work.push_back({3, i / 2, f3[size_t(i)]});
    }
    const auto got = decode_mixed(mixed.get(), work, {1, 5, 2, 13, 1, 7}, 0, n_vocab);
    REQUIRE(got.size() == want.size());
    for (const auto & entry : want) {
        const auto & pos = entry.first;
        const auto & row = entry.second;
        CAPTURE(pos);
        CHECK(same_bits(got.at(pos).data(), row.data(), n_vocab));
    }
}

} // namespace

// --- shared cells ---------------------------------------------------------------

TEST_CASE("a cell shared by two sequences serves both and is freed when neither holds it") {
    tiny_file f(SMOL_TYPE_Q8_0, 1234, "share.gguf");
    context_ptr c = make_context(f.model.get(), 64, 3);
    std::mt19937 rng(7);
    const std::vector<int> prefix = random_ids(rng, 10, 0, f.n_vocab);
    const std::vector<int> tail = random_ids(rng, 4, 0, f.n_vocab);
    std::vector<slot> s0;
    for (int i = 0; i < 10; ++i) s0.push_back({0, i, prefix[size_t(i)]});
    decode_mixed(c.get(), s0, {10}, 0, f.n_vocab);
    CHECK(smol_kv_free_cells(c.get()) == 54);

    smol_kv_seq_cp(c.get(), 0, 1, 0, -1);
    CHECK(smol_kv_seq_len(c.get(), 1) == 10);
    CHECK(smol_kv_free_cells(c.get()) == 54); // shared, not copied
    // Sequence 1 continues from the shared prefix as sequence 2 does from
    // its own copy of it: the same bits.
    std::vector<slot> s1, s2;
    for (int i = 0; i < 4; ++i) s1.push_back({1, 10 + i, tail[size_t(i)]});
    for (int i = 0; i < 10; ++i) s2.push_back({2, i, prefix[size_t(i)]});
    for (int i = 0; i < 4; ++i) s2.push_back({2, 10 + i, tail[size_t(i)]});
    const auto shared = decode_mixed(c.get(), s1, {4}, 1, f.n_vocab);
    const auto own = decode_mixed(c.get(), s2, {14}, 2, f.n_vocab);
    for (int p = 10; p < 14; ++p) {
        CAPTURE(p);
        CHECK(same_bits(shared.at(p).data(), own.at(p).data(), f.n_vocab));
    }
    // A position a sequence holds through a shared cell cannot be decoded again.
    smol_batch b = smol_batch_init(1);
    smol_batch_add(&b, 1, tail[0], 5, 1, true);
    CHECK(smol_decode(c.get(), &b) == SMOL_ERR_INVALID_ARGUMENT);
    smol_batch_free(&b);

    smol_kv_seq_rm(c.get(), 0, 0, -1);
    CHECK(smol_kv_seq_len(c.get(), 1) == 14); // still sequence 1's
    CHECK(smol_kv_free_cells(c.get()) == 64 - 14 - 14);
    smol_kv_seq_rm(c.get(), 1, 0, -1);
    CHECK(smol_kv_free_cells(c.get()) == 64 - 14);
    smol_kv_seq_rm(c.get(), -1, 0, -1);
    CHECK(smol_kv_free_cells(c.get()) == 64);
}

TEST_CASE("more than 128 sequences are refused with a message") {
    tiny_file f(SMOL_TYPE_F32, 99, "seqmax.gguf");
    smol_context_params p = smol_context_default_params();
    p.n_ctx = 64;
    p.n_seq_max = 129;
    smol_context * c = nullptr;
    CHECK(smol_context_create(f.model.get(), &p, &c) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(std::string(smol_last_error()).find("128") != std::string::npos);
    p.n_seq_max = 128;
    REQUIRE(smol_context_create(f.model.get(), &p, &c) == SMOL_OK);
    smol_context_free(c);
}

// --- batch invariance -----------------------------------------------------------

TEST_CASE("a sequence's logits are the same bits alone, batched, chunked and fragmented") {
    SMOL_TEST_DRAW_SEED(case_seed);
    uint32_t draws = 0; // the seeds of its runs, derived from case_seed
    for (smol_type t : {SMOL_TYPE_F32, SMOL_TYPE_F16, SMOL_TYPE_BF16, SMOL_TYPE_Q8_0,
                        SMOL_TYPE_Q4_0, SMOL_TYPE_Q4_1}) {
        const uint32_t seed = test::derived_seed(case_seed, draws++);
        CAPTURE(std::string(smol_type_name(t)));
        tiny_file f(t, seed, "inv.gguf");
        std::mt19937 rng(seed);
        check_batch_invariance(f.model.get(), random_ids(rng, 40, 0, f.n_vocab), f.n_vocab, rng);
    }
}

TEST_CASE("SmolLM2-135M's logits are the same bits alone, batched, chunked and fragmented") {
    model_ptr m = load_real();
    smol_model_info info;
    smol_model_get_info(m.get(), &info);
    std::mt19937 rng(2026);
    const std::string text = "The quick brown fox jumps over the lazy dog; then it naps.";
    std::vector<smol_token> ids(64);
    int32_t n = 0;
    REQUIRE(smol_tokenize(m.get(), text.data(), text.size(), true, false, ids.data(), 64, &n) ==
            SMOL_OK);
    ids.resize(size_t(n));
    check_batch_invariance(m.get(), std::vector<int>(ids.begin(), ids.end()), info.n_vocab, rng);
}

// --- the radix tree -------------------------------------------------------------

TEST_CASE("the prefix tree matches whole blocks, counts users and evicts the least recent leaf") {
    smol::radix_tree tree(4);
    const std::vector<smol_token> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    const std::vector<smol_token> b = {1, 2, 3, 4, 50, 60, 70, 80};
    std::vector<int32_t> cells_a(a.size()), cells_b(b.size());
    for (size_t i = 0; i < a.size(); ++i) cells_a[i] = int32_t(100 + i);
    for (size_t i = 0; i < b.size(); ++i) cells_b[i] = int32_t(200 + i);

    std::vector<int32_t> added;
    CHECK(tree.insert(a.data(), cells_a.data(), int32_t(a.size()), added) == 2); // 2 whole blocks
    CHECK(added == std::vector<int32_t>{100, 101, 102, 103, 104, 105, 106, 107});
    added.clear();
    CHECK(tree.insert(b.data(), cells_b.data(), int32_t(b.size()), added) == 1);
    CHECK(added == std::vector<int32_t>{204, 205, 206, 207}); // its first block was cached
    CHECK(tree.n_blocks() == 3);

    auto path = tree.match(b.data(), int32_t(b.size()), 8);
    REQUIRE(path.size() == 2);
    CHECK(path[0]->cells[0] == 100); // the first request's cells
    CHECK(path[1]->cells[0] == 204);
    CHECK(tree.match(a.data(), 7, 8).size() == 1); // 7 tokens: one whole block
    CHECK(tree.match(a.data(), 10, 1).size() == 1);
    const std::vector<smol_token> other = {9, 9, 9, 9};
    CHECK(tree.match(other.data(), 4, 8).empty());

    // b's path is in use: only a's second block may go; then nothing.
    tree.acquire(path);
    tree.match(a.data(), 10, 8); // a is now the most recent, but unused
    std::vector<int32_t> freed;
    CHECK(tree.evict(freed));
    CHECK(freed == std::vector<int32_t>{104, 105, 106, 107});
    freed.clear();
    CHECK_FALSE(tree.evict(freed));
    tree.release(path);
    // Least recent first: b's leaf, then the shared root block.
    CHECK(tree.evict(freed));
    CHECK(freed == std::vector<int32_t>{204, 205, 206, 207});
    CHECK(tree.evict(freed));
    CHECK(tree.n_blocks() == 0);
    CHECK_FALSE(tree.evict(freed));
}

// The leaves a walk over the whole tree finds evictable (no children, no
// users) and the least recent use among them.
void evictable_leaves(const smol::radix_tree::node & x, bool root,
                      std::vector<const smol::radix_tree::node *> & out) {
    if (!root && x.children.empty() && x.refs == 0) out.push_back(&x);
    for (const auto & kv : x.children) evictable_leaves(*kv.second, false, out);
}

TEST_CASE("the prefix tree evicts what a walk over every leaf would choose, over random use") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    smol::radix_tree tree(2);
    // Texts over a small alphabet share prefixes often; a text's cells are
    // its number times 1000 plus the position.
    std::vector<std::vector<smol_token>> texts;
    std::vector<std::vector<smol::radix_tree::node *>> held;
    // The parent of the last block evicted (none past the top): an eviction
    // along the chain takes it while it is an evictable leaf.
    const smol::radix_tree::node * chain_from = nullptr;
    int n_evicted = 0, n_chained = 0;
    for (int op = 0; op < 3000; ++op) {
        const uint32_t what = rng() % 8;
        if (what < 3 || texts.empty()) {
            std::vector<smol_token> t(size_t(1 + rng() % 12));
            for (auto & x : t) x = smol_token(rng() % 3);
            std::vector<int32_t> cells(t.size());
            for (size_t i = 0; i < t.size(); ++i) cells[i] = int32_t(texts.size() * 1000 + i);
            std::vector<int32_t> added;
            tree.insert(t.data(), cells.data(), int32_t(t.size()), added);
            texts.push_back(t);
        } else if (what < 5) {
            const auto & t = texts[rng() % texts.size()];
            auto path = tree.match(t.data(), int32_t(t.size()), 64);
            if (rng() % 2 == 0 && !path.empty()) {
                tree.acquire(path);
                held.push_back(path);
            }
        } else if (what == 5 && !held.empty()) {
            const size_t i = rng() % held.size();
            tree.release(held[i]);
            held.erase(held.begin() + long(i));
        } else {
            std::vector<const smol::radix_tree::node *> leaves;
            evictable_leaves(tree.root(), true, leaves);
            struct leaf {
                const smol::radix_tree::node *at, *parent;
                std::vector<int32_t> cells;
                uint64_t last_use;
            };
            uint64_t oldest = UINT64_MAX;
            std::vector<leaf> was; // as they were before the eviction
            for (const auto * x : leaves) {
                oldest = std::min(oldest, x->last_use);
                was.push_back({x, x->parent, x->cells, x->last_use});
            }
            const bool chain = rng() % 2 == 0;
            const bool along =
                chain && std::find(leaves.begin(), leaves.end(), chain_from) != leaves.end();
            std::vector<int32_t> freed;
            const int32_t before = tree.n_blocks();
            const bool ok = tree.evict(freed, chain);
            REQUIRE(ok == !leaves.empty());
            const smol::radix_tree::node * chain_was = chain_from;
            chain_from = nullptr;
            if (!ok) continue;
            CHECK(tree.n_blocks() == before - 1);
            REQUIRE(freed.size() == 2);
            // The freed cells are those of one of the evictable leaves: the
            // last one's parent along a chain, else the least recent.
            const auto gone = std::find_if(was.begin(), was.end(),
                                           [&](const leaf & w) { return w.cells == freed; });
            REQUIRE(gone != was.end());
            ++n_evicted;
            if (along) {
                CHECK(gone->at == chain_was);
                ++n_chained;
            } else {
                CHECK(gone->last_use == oldest);
            }
            if (gone->parent != &tree.root()) chain_from = gone->parent;
        }
    }
    MESSAGE(n_evicted << " evictions, " << n_chained << " of them along a chain");
    CHECK(n_evicted > 100);
}

// --- the engine -----------------------------------------------------------------

namespace {

struct result {
    std::vector<smol_token> tokens;
    std::vector<std::vector<float>> logits;
    smol_finish_reason finish = SMOL_FINISH_NONE;
    int32_t n_cached = 0;
    int events_after_finish = 0;
};

bool collect(const smol_engine_event * ev, void * user) {
    auto * r = static_cast<result *>(user);
    if (r->finish != SMOL_FINISH_NONE) ++r->events_after_finish;
    if (ev->token >= 0) {
        r->tokens.push_back(ev->token);
        if (ev->logits) r->logits.emplace_back(ev->logits, ev->logits + ev->n_vocab);
    }
    r->finish = ev->finish;
    r->n_cached = ev->n_cached;
    return true;
}

engine_ptr make_engine(smol_model * m, uint32_t n_ctx, uint32_t parallel, uint32_t chunk,
                       bool prefix = true, const char * device = nullptr,
                       smol_kv_offload offload = SMOL_KV_OFFLOAD_AUTO, uint32_t n_batch = 0,
                       bool swa_full = false) {
    smol_engine_params p = smol_engine_default_params();
    p.context.device = device;
    p.context.kv_offload = offload;
    p.context.n_ctx = n_ctx;
    p.context.n_batch = n_batch ? n_batch : n_ctx;
    p.context.swa_full = swa_full;
    p.context.n_seq_max = parallel;
    p.context.n_threads = 2;
    p.n_chunk = chunk;
    p.prefix_cache = prefix;
    p.prefix_block = 8;
    smol_engine * e = nullptr;
    const smol_status st = smol_engine_create(m, &p, &e);
    INFO(std::string(smol_last_error()));
    REQUIRE(st == SMOL_OK);
    return engine_ptr(e);
}

// Greedy, or with sampler.seed > 0 sampled from that seed; skip_logits:
// its events need not carry logits.
smol_request_id submit(smol_engine * e, const std::vector<int> & prompt, int max_tokens,
                       result * out, uint32_t sample_seed = 0, bool skip_logits = false) {
    smol_request_params p = smol_request_default_params();
    p.prompt = prompt.data();
    p.n_prompt = int32_t(prompt.size());
    p.max_tokens = max_tokens;
    p.sampler.temperature = 0; // greedy
    if (sample_seed > 0) {
        p.sampler.temperature = 1.5f;
        p.sampler.top_k = 20;
        p.sampler.seed = sample_seed;
    }
    p.ignore_eog = true;
    p.skip_event_logits = skip_logits;
    p.on_event = collect;
    p.user_data = out;
    smol_request_id id = 0;
    const smol_status st = smol_engine_submit(e, &p, &id);
    INFO(std::string(smol_last_error()));
    REQUIRE(st == SMOL_OK);
    return id;
}

void run(smol_engine * e, int max_steps = 10000) {
    int32_t active = 1;
    for (int i = 0; active > 0 && i < max_steps; ++i) {
        REQUIRE(smol_engine_step(e, &active) == SMOL_OK);
    }
    REQUIRE(active == 0);
}

void check_same(const result & a, const result & b) {
    CHECK(a.tokens == b.tokens);
    REQUIRE(a.logits.size() == b.logits.size());
    for (size_t i = 0; i < a.logits.size(); ++i) {
        CAPTURE(i);
        CHECK(a.logits[i] == b.logits[i]);
    }
}

} // namespace

TEST_CASE("concurrent requests give exactly the tokens and logits each gives alone") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(SMOL_TYPE_Q4_1, seed, "batch.gguf");
    std::mt19937 rng(seed);
    std::vector<std::vector<int>> prompts;
    for (int i = 0; i < 6; ++i) prompts.push_back(random_ids(rng, 5 + 7 * i, 0, f.n_vocab));

    std::vector<result> alone(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
        engine_ptr e = make_engine(f.model.get(), 256, 1, 256, false);
        submit(e.get(), prompts[i], 12, &alone[i]);
        run(e.get());
        CHECK(alone[i].finish == SMOL_FINISH_LENGTH);
        CHECK(alone[i].tokens.size() == 12);
    }
    // Four slots for six requests, prompts in chunks of 8 beside decode
    // steps; then eight, so that all six draw in one step (on the engine's
    // drawing threads).
    for (uint32_t slots : {4u, 8u}) {
        CAPTURE(slots);
        engine_ptr e = make_engine(f.model.get(), 512, slots, 8, false);
        std::vector<result> together(prompts.size());
        for (size_t i = 0; i < prompts.size(); ++i) submit(e.get(), prompts[i], 12, &together[i]);
        const auto t0 = std::chrono::steady_clock::now();
        run(e.get());
        const double wall =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        for (size_t i = 0; i < prompts.size(); ++i) {
            CAPTURE(i);
            check_same(together[i], alone[i]);
            CHECK(together[i].events_after_finish == 0);
        }
        const smol_engine_stats st = smol_engine_get_stats(e.get());
        CHECK(st.n_finished == 6);
        CHECK(st.n_generated_tokens == 72);
        CHECK(st.n_cells_used == 0); // no prefix cache: everything freed
        // The steps' phases, timed within the run.
        CHECK(st.t_decode_s > 0);
        CHECK(st.t_plan_s >= 0);
        CHECK(st.t_draw_s >= 0);
        CHECK(st.t_emit_s >= 0);
        CHECK(st.t_plan_s + st.t_decode_s + st.t_draw_s + st.t_emit_s <= wall);
    }
}

TEST_CASE("greedy requests without logits in their events keep only their top tokens and give "
          "the same text, on the CPU and the simulated device") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(SMOL_TYPE_Q8_0, seed, "top.gguf");
    std::mt19937 rng(seed);
    std::vector<std::vector<int>> prompts;
    for (int i = 0; i < 6; ++i) prompts.push_back(random_ids(rng, 4 + 5 * i, 0, f.n_vocab));
    // Even requests greedy, odd ones sampled, each with its events' logits.
    auto seed_of = [](size_t i) { return i % 2 ? uint32_t(7 + i) : 0u; };
    std::vector<result> ref(prompts.size());
    {
        engine_ptr e = make_engine(f.model.get(), 512, 8, 8, false);
        for (size_t i = 0; i < prompts.size(); ++i)
            submit(e.get(), prompts[i], 10, &ref[i], seed_of(i));
        run(e.get());
    }
    for (const char * device : {static_cast<const char *>(nullptr), "sim"}) {
        CAPTURE(device ? device : "cpu");
        // The greedy ones alone: every step keeps top tokens only (on the
        // simulated device the graph picks them); then beside the sampled
        // ones, whose draws need the logits of the same steps.
        for (bool mixed : {false, true}) {
            CAPTURE(mixed);
            engine_ptr e = make_engine(f.model.get(), 512, 8, 8, false, device);
            std::vector<result> out(prompts.size());
            for (size_t i = 0; i < prompts.size(); ++i) {
                if (mixed || !seed_of(i))
                    submit(e.get(), prompts[i], 10, &out[i], seed_of(i), true);
            }
            run(e.get());
            for (size_t i = 0; i < prompts.size(); ++i) {
                CAPTURE(i);
                if (!mixed && seed_of(i)) continue;
                CHECK(out[i].tokens == ref[i].tokens);
                CHECK(out[i].finish == SMOL_FINISH_LENGTH);
                // A sampled request still hears its logits; a greedy one none.
                if (seed_of(i)) {
                    check_same(out[i], ref[i]);
                } else {
                    CHECK(out[i].logits.empty());
                }
            }
        }
    }
}

TEST_CASE("seeded sampling requests draw the same tokens alone and six at once") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(SMOL_TYPE_Q4_1, seed, "sampled.gguf");
    std::mt19937 rng(seed);
    std::vector<std::vector<int>> prompts;
    for (int i = 0; i < 6; ++i) prompts.push_back(random_ids(rng, 4 + 3 * i, 0, f.n_vocab));
    std::vector<result> alone(prompts.size()), together(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
        engine_ptr e = make_engine(f.model.get(), 256, 1, 256, false);
        submit(e.get(), prompts[i], 16, &alone[i], 100 + uint32_t(i));
        run(e.get());
    }
    engine_ptr e = make_engine(f.model.get(), 256, 8, 256, false);
    for (size_t i = 0; i < prompts.size(); ++i)
        submit(e.get(), prompts[i], 16, &together[i], 100 + uint32_t(i));
    run(e.get());
    for (size_t i = 0; i < prompts.size(); ++i) {
        CAPTURE(i);
        CHECK(together[i].tokens.size() == 16);
        check_same(together[i], alone[i]);
    }
}

TEST_CASE("with every KV head offloaded on the simulated device, alone or two splitting the "
          "layers, the engine gives the CPU's tokens and logits") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(SMOL_TYPE_Q8_0, seed, "offload.gguf");
    std::mt19937 rng(seed);
    // A shared system prompt (two prefix blocks) and distinct questions, so
    // batching, chunked prefill and prefix reuse all meet offloaded heads.
    const std::vector<int> system = random_ids(rng, 16, 0, f.n_vocab);
    std::vector<std::vector<int>> prompts;
    for (int i = 0; i < 5; ++i) {
        std::vector<int> p = system;
        const std::vector<int> tail = random_ids(rng, 3 + 4 * i, 0, f.n_vocab);
        p.insert(p.end(), tail.begin(), tail.end());
        prompts.push_back(p);
    }
    auto serve = [&](const char * device, smol_kv_offload offload, smol_engine_stats * st) {
        engine_ptr e = make_engine(f.model.get(), 256, 3, 8, true, device, offload);
        std::vector<result> out(prompts.size());
        for (size_t i = 0; i < prompts.size(); ++i) submit(e.get(), prompts[i], 10, &out[i]);
        run(e.get());
        *st = smol_engine_get_stats(e.get());
        return out;
    };
    smol_engine_stats cpu_st{}, sim_st{}, split_st{};
    const std::vector<result> cpu = serve(nullptr, SMOL_KV_OFFLOAD_AUTO, &cpu_st);
    const std::vector<result> sim = serve("sim", SMOL_KV_OFFLOAD_ALL, &sim_st);
    // And with the model's layers split over two simulated devices.
    const std::vector<result> split = serve("sim,sim", SMOL_KV_OFFLOAD_ALL, &split_st);
    for (size_t i = 0; i < prompts.size(); ++i) {
        CAPTURE(i);
        CHECK(sim[i].tokens.size() == 10);
        check_same(sim[i], cpu[i]);
        check_same(split[i], cpu[i]);
    }
    CHECK(split_st.kv_bytes_offloaded == sim_st.kv_bytes_offloaded);
    CHECK(split_st.kv_bytes_resident == 0);
    CHECK(sim_st.n_prefix_hit_tokens > 0);
    CHECK(sim_st.n_prefix_hit_tokens == cpu_st.n_prefix_hit_tokens);
    // The prefix cache still holds cells: on the CPU they are resident, on
    // the simulated device every head of them lives in host memory.
    REQUIRE(cpu_st.n_cells_used > 0);
    CHECK(cpu_st.kv_bytes_offloaded == 0);
    CHECK(cpu_st.kv_bytes_resident > 0);
    CHECK(sim_st.kv_bytes_resident == 0);
    CHECK(sim_st.kv_bytes_offloaded == cpu_st.kv_bytes_resident);
}

TEST_CASE("grammar requests on the simulated device, their masks made during the step, draw the "
          "CPU's tokens") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(SMOL_TYPE_Q8_0, seed, "grammar.gguf");
    std::mt19937 rng(seed);
    const char * gbnf = "root ::= \"{\" pair (\",\" pair)* \"}\"\n"
                        "pair ::= [a-z]+ \":\" [0-9]+\n";
    std::vector<std::vector<int>> prompts;
    for (int i = 0; i < 6; ++i) prompts.push_back(random_ids(rng, 4 + 3 * i, 0, f.n_vocab));
    auto serve = [&](const char * device) {
        engine_ptr e = make_engine(f.model.get(), 512, 4, 8, true, device);
        std::vector<result> out(prompts.size());
        for (size_t i = 0; i < prompts.size(); ++i) {
            // Greedy and seeded draws, with the grammar and (one in three) without.
            smol_request_params p = smol_request_default_params();
            p.prompt = prompts[i].data();
            p.n_prompt = int32_t(prompts[i].size());
            p.max_tokens = 24;
            p.sampler.temperature = i % 2 ? 1.5f : 0.0f;
            p.sampler.top_k = i % 4 == 1 ? 20 : 0;
            p.sampler.seed = uint64_t(seed) + i;
            p.grammar = i % 3 == 2 ? nullptr : gbnf;
            p.on_event = collect;
            p.user_data = &out[i];
            smol_request_id id = 0;
            INFO(std::string(smol_last_error()));
            REQUIRE(smol_engine_submit(e.get(), &p, &id) == SMOL_OK);
        }
        run(e.get());
        return out;
    };
    const std::vector<result> cpu = serve(nullptr);
    const std::vector<result> sim = serve("sim");
    int constrained = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
        CAPTURE(i);
        CHECK(!sim[i].tokens.empty());
        check_same(sim[i], cpu[i]);
        constrained += i % 3 != 2 ? int(sim[i].tokens.size()) : 0;
    }
    MESSAGE(constrained << " tokens drawn under the grammar, each the CPU's");
}

TEST_CASE("with the prefix cache holding every cell, new requests still get pages of their own") {
    // Eviction frees a few cached blocks a step; were new tokens put in
    // those cells wherever they lie, each sequence's cells would spread
    // over pages shared with others, which a GPU's attention reads whole.
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(SMOL_TYPE_Q8_0, seed, "pages.gguf");
    std::mt19937 rng(seed);
    smol_engine_params p = smol_engine_default_params();
    p.context.n_ctx = 256; // four pages
    p.context.n_batch = 256;
    p.context.n_seq_max = 4;
    p.context.n_threads = 2;
    p.n_chunk = 64;
    p.prefix_block = 8;
    smol::engine e(*f.model->m, p);
    const smol::kv_cache & kv = e.context().kv;
    std::vector<result> out(8);
    int worst = 0; // pages a sequence holds beyond what its cells fill
    for (int round = 0; round < 2; ++round) {
        std::vector<std::vector<int>> prompts;
        for (int i = 0; i < 4; ++i) prompts.push_back(random_ids(rng, 12, 0, f.n_vocab));
        for (int i = 0; i < 4; ++i) {
            smol_request_params rp = smol_request_default_params();
            rp.prompt = prompts[size_t(i)].data();
            rp.n_prompt = 12;
            rp.max_tokens = 48;
            rp.sampler.temperature = 0;
            rp.ignore_eog = true;
            rp.on_event = collect;
            rp.user_data = &out[size_t(round * 4 + i)];
            e.submit(rp);
        }
        while (e.step() > 0) {
            if (round == 0) continue;
            for (smol_seq_id s = 0; s < 4; ++s) {
                std::vector<int> pages;
                int n = 0;
                for (int32_t c = 0; c < kv.n_cells; ++c) {
                    if (kv.cell_pos[size_t(c)] < 0 || !kv.cell_seqs[size_t(c)].has(s)) continue;
                    ++n;
                    if (std::find(pages.begin(), pages.end(), c / smol::kv_page) == pages.end())
                        pages.push_back(c / smol::kv_page);
                }
                worst =
                    std::max(worst, int(pages.size()) - (n + smol::kv_page - 1) / smol::kv_page);
            }
        }
        if (round == 0) CHECK(kv.n_free() <= 32); // the cache holds the first round's text
    }
    for (const result & r : out) CHECK(r.tokens.size() == 48);
    CHECK(worst <= 1);
    MESSAGE("the most pages a sequence held beyond its cells' count: " << worst);
}

TEST_CASE("a shared prefix is reused from the cache and gives the logits of recomputing it") {
    model_ptr m = load_real();
    const std::string system = "<|im_start|>system\nYou are a helpful assistant who answers in "
                               "one short sentence and never makes things up.<|im_end|>\n";
    std::vector<std::vector<int>> prompts;
    for (const char * q : {"What is the capital of France?", "Name a primary colour."}) {
        const std::string text =
            system + "<|im_start|>user\n" + q + "<|im_end|>\n<|im_start|>assistant\n";
        std::vector<smol_token> ids(256);
        int32_t n = 0;
        REQUIRE(smol_tokenize(m.get(), text.data(), text.size(), false, true, ids.data(), 256,
                              &n) == SMOL_OK);
        prompts.emplace_back(ids.begin(), ids.begin() + n);
    }
    engine_ptr cached = make_engine(m.get(), 512, 2, 64, true);
    result first, second;
    submit(cached.get(), prompts[0], 6, &first);
    run(cached.get());
    submit(cached.get(), prompts[1], 6, &second);
    run(cached.get());
    CHECK(first.n_cached == 0);
    CHECK(second.n_cached >= 16); // the system prompt's whole blocks
    const smol_engine_stats st = smol_engine_get_stats(cached.get());
    CHECK(st.n_prefix_hit_requests == 1);
    CHECK(st.n_prefix_hit_tokens == second.n_cached);
    CHECK(st.prefix_hit_rate > 0.0);
    CHECK(st.n_prefill_tokens == st.n_prompt_tokens - second.n_cached);
    MESSAGE("prefix cache: " << second.n_cached << " of " << prompts[1].size()
                             << " prompt tokens reused");

    engine_ptr fresh = make_engine(m.get(), 512, 1, 512, false);
    result recomputed;
    submit(fresh.get(), prompts[1], 6, &recomputed);
    run(fresh.get());
    check_same(second, recomputed);
}

TEST_CASE("a Gemma engine reuses a prefix only while its window is kept, giving the same text") {
    SMOL_TEST_DRAW_SEED(seed);
    const std::string path = temp_path("gemma-engine.gguf");
    tiny::shape s;
    s.gemma = true;
    s.n_layer = 3; // local, global, local
    s.n_head_kv = 1;
    s.head_dim = 16;
    s.window = 6;
    tiny::write(path, s, seed);
    model_ptr m = load(path);
    std::mt19937 rng(seed);
    // Two blocks of 8 shared, then tails of their own.
    const std::vector<int> system = random_ids(rng, 16, 0, s.n_vocab);
    std::vector<std::vector<int>> prompts;
    for (int i = 0; i < 4; ++i) {
        std::vector<int> p = system;
        const std::vector<int> tail = random_ids(rng, 3 + 5 * i, 0, s.n_vocab);
        p.insert(p.end(), tail.begin(), tail.end());
        prompts.push_back(p);
    }
    std::vector<result> alone(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
        engine_ptr e = make_engine(m.get(), 256, 1, 8, false, nullptr, SMOL_KV_OFFLOAD_AUTO, 16);
        submit(e.get(), prompts[i], 10, &alone[i]);
        run(e.get());
    }
    // The first request alone for four steps (its prompt in chunks of 8
    // and a token), two more while it runs, the fourth after all finished.
    // n_batch 16: the window store keeps 6 + 16 positions a sequence.
    for (const bool swa_full : {false, true}) {
        CAPTURE(swa_full);
        engine_ptr e =
            make_engine(m.get(), 256, 3, 8, true, nullptr, SMOL_KV_OFFLOAD_AUTO, 16, swa_full);
        std::vector<result> out(prompts.size());
        submit(e.get(), prompts[0], 10, &out[0]);
        int32_t active = 0;
        for (int i = 0; i < 4; ++i) REQUIRE(smol_engine_step(e.get(), &active) == SMOL_OK);
        for (size_t i = 1; i < 3; ++i) submit(e.get(), prompts[i], 10, &out[i]);
        run(e.get());
        submit(e.get(), prompts[3], 10, &out[3]);
        run(e.get());
        for (size_t i = 0; i < prompts.size(); ++i) {
            CAPTURE(i);
            check_same(out[i], alone[i]);
        }
        // While the first request holds the prefix's window, the others
        // reuse it; after, only a cache that keeps every position can.
        CHECK(out[1].n_cached == 16);
        CHECK(out[2].n_cached == 16);
        CHECK(out[3].n_cached == (swa_full ? 16 : 0));
        // The cached cells' bytes: K and V of one head of 16 a cell in the
        // global layer, and in the two local ones those still in the store.
        const smol_engine_stats st = smol_engine_get_stats(e.get());
        const uint64_t global = uint64_t(st.n_cells_used) * 64;
        CHECK(st.kv_bytes_offloaded == 0);
        if (swa_full) {
            CHECK(st.kv_bytes_resident == 3 * global);
        } else {
            CHECK(st.kv_bytes_resident >= global);
            CHECK(st.kv_bytes_resident < 3 * global);
        }
    }
    std::filesystem::remove(path);
}

TEST_CASE("a request the prefix cache leaves one token to compute decodes beside an older "
          "request still in its prompt") {
    // Its slice of the batch comes first (a decode token) though it is the
    // younger request: the batch must follow the slices, not the requests'
    // order, or its logits are another token's (none: a token -1 failed the
    // next step for every request in it).
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(SMOL_TYPE_Q8_0, seed, "hit-order.gguf");
    std::mt19937 rng(seed);
    const std::vector<int> shared = random_ids(rng, 17, 0, f.n_vocab); // two blocks of 8, and one
    const std::vector<int> other = random_ids(rng, 30, 0, f.n_vocab);
    result shared_alone, other_alone;
    for (auto [prompt, out] :
         {std::pair{&shared, &shared_alone}, std::pair{&other, &other_alone}}) {
        engine_ptr e = make_engine(f.model.get(), 256, 1, 256, false);
        submit(e.get(), *prompt, 10, out);
        run(e.get());
    }
    // Prompts in chunks of 8: the older request takes four steps for its
    // prompt; the younger finds 16 of its 17 tokens cached and decodes at once.
    engine_ptr e = make_engine(f.model.get(), 256, 3, 8, true);
    result first, older, younger;
    submit(e.get(), shared, 10, &first);
    run(e.get());
    submit(e.get(), other, 10, &older);
    submit(e.get(), shared, 10, &younger);
    run(e.get());
    CHECK(younger.n_cached == 16);
    CHECK(older.finish == SMOL_FINISH_LENGTH);
    CHECK(younger.finish == SMOL_FINISH_LENGTH);
    check_same(first, shared_alone);
    check_same(older, other_alone);
    check_same(younger, shared_alone);
}

TEST_CASE("when cells run out, requests are preempted, recomputed and give the same tokens") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(SMOL_TYPE_Q8_0, seed, "preempt.gguf");
    std::mt19937 rng(seed);
    std::vector<std::vector<int>> prompts;
    for (int i = 0; i < 3; ++i) prompts.push_back(random_ids(rng, 20, 0, f.n_vocab));
    std::vector<result> alone(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
        engine_ptr e = make_engine(f.model.get(), 64, 1, 64, false);
        submit(e.get(), prompts[i], 30, &alone[i]);
        run(e.get());
    }
    // 64 cells for three requests of 50: at most one fits at its end.
    engine_ptr e = make_engine(f.model.get(), 64, 3, 16, true);
    std::vector<result> together(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) submit(e.get(), prompts[i], 30, &together[i]);
    run(e.get());
    for (size_t i = 0; i < prompts.size(); ++i) {
        CAPTURE(i);
        CHECK(together[i].finish == SMOL_FINISH_LENGTH);
        check_same(together[i], alone[i]);
    }
    CHECK(smol_engine_get_stats(e.get()).n_preempted > 0);
}

TEST_CASE("a cancelled request frees its sequence and the others go on") {
    tiny_file f(SMOL_TYPE_Q4_0, 4321, "cancel.gguf");
    std::mt19937 rng(5);
    const std::vector<int> p1 = random_ids(rng, 12, 0, f.n_vocab);
    const std::vector<int> p2 = random_ids(rng, 9, 0, f.n_vocab);
    engine_ptr e = make_engine(f.model.get(), 128, 2, 64, false);
    result r1, r2;
    const smol_request_id id1 = submit(e.get(), p1, 100, &r1);
    submit(e.get(), p2, 10, &r2);
    int32_t active = 0;
    for (int i = 0; i < 3; ++i) REQUIRE(smol_engine_step(e.get(), &active) == SMOL_OK);
    CHECK(smol_engine_cancel(e.get(), id1) == SMOL_OK);
    run(e.get());
    CHECK(r1.finish == SMOL_FINISH_CANCELLED);
    CHECK(r1.tokens.size() < 100);
    CHECK(r2.finish == SMOL_FINISH_LENGTH);
    CHECK(r2.tokens.size() == 10);
    CHECK(smol_engine_get_stats(e.get()).n_cells_used == 0);
    CHECK(smol_engine_cancel(e.get(), 999) == SMOL_ERR_INVALID_ARGUMENT);
}

TEST_CASE("an engine's context parameters are checked as a context's are, enums included") {
    tiny_file f(SMOL_TYPE_F16, 78, "params.gguf");
    smol_engine_params p = smol_engine_default_params();
    p.context.n_ctx = 64;
    p.context.kv_offload = smol_kv_offload(7);
    smol_engine * raw = nullptr;
    CHECK(smol_engine_create(f.model.get(), &p, &raw) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(raw == nullptr);
    CHECK(std::string(smol_last_error()).find("kv_offload 7") != std::string::npos);
    p.context.kv_offload = SMOL_KV_OFFLOAD_AUTO;
    p.context.attn = smol_attn_kernel(-3);
    CHECK(smol_engine_create(f.model.get(), &p, &raw) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(std::string(smol_last_error()).find("attn -3") != std::string::npos);
}

TEST_CASE("the engine refuses bad requests with a message and a full queue with BUSY") {
    tiny_file f(SMOL_TYPE_F16, 77, "bad.gguf");
    smol_engine_params p = smol_engine_default_params();
    p.context.n_ctx = 64;
    p.context.n_seq_max = 1;
    p.n_queue_max = 2;
    smol_engine * raw = nullptr;
    REQUIRE(smol_engine_create(f.model.get(), &p, &raw) == SMOL_OK);
    engine_ptr e(raw);
    const std::vector<int> ok = {1, 2, 3};
    smol_request_params r = smol_request_default_params();
    r.prompt = ok.data();
    r.n_prompt = 0;
    CHECK(smol_engine_submit(e.get(), &r, nullptr) == SMOL_ERR_INVALID_ARGUMENT);
    r.n_prompt = 3;
    r.max_tokens = 62;
    CHECK(smol_engine_submit(e.get(), &r, nullptr) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(std::string(smol_last_error()).find("context") != std::string::npos);
    const std::vector<int> bad = {1, 100000};
    r.prompt = bad.data();
    r.n_prompt = 2;
    r.max_tokens = 4;
    CHECK(smol_engine_submit(e.get(), &r, nullptr) == SMOL_ERR_INVALID_ARGUMENT);
    r.prompt = ok.data();
    r.n_prompt = 3;
    // One slot and two places in the queue.
    for (int i = 0; i < 3; ++i) CHECK(smol_engine_submit(e.get(), &r, nullptr) == SMOL_OK);
    CHECK(smol_engine_submit(e.get(), &r, nullptr) == SMOL_ERR_BUSY);
    p.context.n_seq_max = 128;
    CHECK(smol_engine_create(f.model.get(), &p, &raw) == SMOL_ERR_INVALID_ARGUMENT);
}
