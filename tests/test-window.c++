// test-window.c++ - sliding-window layers keep only their window (the window
// store, kv_window): logits bit-identical to keeping every position
// (swa_full), on the CPU and on the simulated device with its KV offloaded,
// across several sequences, shared prefixes, rollbacks within the reserve and
// prompts in chunks longer than the window; a rollback past the reserve
// refused; the plan's bytes; Llama untouched.

#include "smol.h"
#include "test-seed.h"
#include "tiny-model.h"

#include <cstring>
#include <doctest/doctest.h>
#include <filesystem>
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
using model_ptr = std::unique_ptr<smol_model, model_deleter>;
using context_ptr = std::unique_ptr<smol_context, context_deleter>;

std::string temp_path(const std::string & name) {
    return (std::filesystem::temp_directory_path() /
            ("smol-window-" + std::to_string(::getpid()) + "-" + name))
        .string();
}

// A Gemma 3 of three layers (local, global, local) with a window of 6.
constexpr int window = 6;
tiny::shape gemma_shape() {
    tiny::shape s;
    s.gemma = true;
    s.n_layer = 3;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.head_dim = 16;
    s.window = window;
    return s;
}

struct tiny_gemma {
    std::string path;
    model_ptr m;
    explicit tiny_gemma(uint32_t seed, const tiny::shape & s = gemma_shape())
        : path(temp_path(std::to_string(seed) + ".gguf")) {
        tiny::write(path, s, seed);
        smol_model * p = nullptr;
        const smol_status st = smol_model_load(path.c_str(), nullptr, &p);
        INFO(std::string(smol_last_error()));
        REQUIRE(st == SMOL_OK);
        m.reset(p);
    }
    ~tiny_gemma() { std::filesystem::remove(path); }
};

// n_batch 16 (the reserve), 3 sequences: 3 * (6 + 16) + 16 = 82 slots of
// 256 cells.
smol_context_params params(const char * device, bool swa_full, smol_kv_offload mode) {
    smol_context_params p = smol_context_default_params();
    p.n_ctx = 256;
    p.n_batch = 16;
    p.n_seq_max = 3;
    p.n_threads = 2;
    p.device = device;
    p.kv_offload = mode;
    p.swa_full = swa_full;
    return p;
}

context_ptr make_context(smol_model * m, const smol_context_params & p) {
    smol_context * c = nullptr;
    const smol_status st = smol_context_create(m, &p, &c);
    INFO(std::string(smol_last_error()));
    REQUIRE(st == SMOL_OK);
    return context_ptr(c);
}

std::string plan_text(const smol_context * c) {
    std::string s(4096, '\0');
    size_t n = 0;
    REQUIRE(smol_context_plan_dump(c, s.data(), s.size(), &n) == SMOL_OK);
    s.resize(std::strlen(s.c_str()));
    return s;
}

// Decodes a batch and appends the logits of the rows that asked to out.
void decode(smol_context * c, smol_batch & b, int n_vocab, std::vector<float> & out) {
    const smol_status st = smol_decode(c, &b);
    INFO(std::string(smol_last_error()));
    REQUIRE(st == SMOL_OK);
    for (int i = 0; i < b.n_tokens; ++i) {
        if (!b.logits[i]) continue;
        const float * l = smol_get_logits(c, i);
        REQUIRE(l != nullptr);
        out.insert(out.end(), l, l + n_vocab);
    }
    b.n_tokens = 0;
}

// Sequence 0 takes a 40-token prompt in batches of 16 (windows that start
// in the batch before), sequence 1 a copy of its first 30 positions
// (seq_cp), sequence 2 a prompt of its own; 30 rounds of one token each,
// a rollback of 12 tokens of sequence 0 (within the reserve of 16) and
// of 5 of sequence 1, 20 more rounds. Every logits row, in order.
std::vector<float> run_workload(smol_context * c, int n_vocab, uint32_t seed) {
    std::mt19937 rng(seed);
    auto tok = [&]() { return int(rng() % uint32_t(n_vocab)); };
    std::vector<float> out;
    smol_batch b = smol_batch_init(16);
    int len[3] = {0, 0, 0};
    for (int i = 0; i < 40; ++i) {
        smol_batch_add(&b, 16, tok(), len[0]++, 0, true);
        if (b.n_tokens == 16) decode(c, b, n_vocab, out);
    }
    decode(c, b, n_vocab, out);
    smol_kv_seq_cp(c, 0, 1, 0, 30);
    len[1] = 30;
    for (int i = 0; i < 20; ++i) smol_batch_add(&b, 16, tok(), len[2]++, 2, i >= 16);
    decode(c, b, n_vocab, out); // 16 of them, the last kept
    for (int i = 0; i < 4; ++i) smol_batch_add(&b, 16, tok(), len[2] - 4 + i, 2, true);
    decode(c, b, n_vocab, out);
    auto rounds = [&](int n) {
        for (int r = 0; r < n; ++r) {
            for (int s = 0; s < 3; ++s) smol_batch_add(&b, 16, tok(), len[s]++, s, true);
            decode(c, b, n_vocab, out);
        }
    };
    rounds(30);
    len[0] -= 12;
    smol_kv_seq_rm(c, 0, len[0], -1);
    len[1] -= 5;
    smol_kv_seq_rm(c, 1, len[1], -1);
    rounds(20);
    smol_batch_free(&b);
    return out;
}

void check_bits(const std::vector<float> & got, const std::vector<float> & want) {
    REQUIRE(got.size() == want.size());
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i)
        differ += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
    CHECK(differ == 0);
}

} // namespace

TEST_CASE("sliding-window layers keeping their window give the bits of keeping everything") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_gemma g(seed);
    const int n_vocab = gemma_shape().n_vocab;
    context_ptr full = make_context(g.m.get(), params("cpu", true, SMOL_KV_OFFLOAD_AUTO));
    REQUIRE(plan_text(full.get()).find("window store") == std::string::npos);
    const std::vector<float> want = run_workload(full.get(), n_vocab, seed);
    struct run {
        const char * device;
        smol_kv_offload mode;
    };
    // Split by layers too: each device's plan keeps its windowed layers.
    for (const run r : {run{"cpu", SMOL_KV_OFFLOAD_AUTO}, run{"sim", SMOL_KV_OFFLOAD_NONE},
                        run{"sim", SMOL_KV_OFFLOAD_ALL}, run{"sim,sim", SMOL_KV_OFFLOAD_ALL},
                        run{"cpu,sim,sim", SMOL_KV_OFFLOAD_AUTO}}) {
        CAPTURE(r.device);
        CAPTURE(int(r.mode));
        context_ptr c = make_context(g.m.get(), params(r.device, false, r.mode));
        // 3 * (6 + 16) + 16 slots for sequences that hold up to 130
        // positions each.
        REQUIRE(plan_text(c.get()).find("keep 82 cells of 256") != std::string::npos);
        check_bits(run_workload(c.get(), n_vocab, seed), want);
    }
}

TEST_CASE("a rollback past the window store's reserve is refused, and fine with swa_full") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_gemma g(seed);
    for (const bool swa_full : {false, true}) {
        CAPTURE(swa_full);
        context_ptr c = make_context(g.m.get(), params("cpu", swa_full, SMOL_KV_OFFLOAD_AUTO));
        smol_batch b = smol_batch_init(16);
        std::vector<float> out;
        for (int p = 0; p < 80; ++p) {
            smol_batch_add(&b, 16, p % 200, p, 0, false);
            if (b.n_tokens == 16) decode(c.get(), b, 300, out);
        }
        // 80 held: positions up to 80 - 6 - 16 = 58 lost their slots.
        smol_kv_seq_rm(c.get(), 0, 40, -1);
        smol_batch_add(&b, 16, 7, 40, 0, true);
        const smol_status st = smol_decode(c.get(), &b);
        if (swa_full) {
            CHECK(st == SMOL_OK);
            CHECK(smol_kv_seq_pos_exact(c.get(), 0) == 0);
        } else {
            CHECK(st == SMOL_ERR_WINDOW_GONE);
            const std::string msg = smol_last_error();
            CHECK(msg.find("swa_full") != std::string::npos);
            CHECK(msg.find("window_reserve") != std::string::npos);
            CHECK(smol_kv_seq_pos_exact(c.get(), 0) == 39 + window);
            CHECK(std::string(smol_status_name(SMOL_ERR_WINDOW_GONE)) == "SMOL_ERR_WINDOW_GONE");
        }
        smol_batch_free(&b);
    }
}

TEST_CASE("window_reserve sets how far back a sequence may go on exactly, and the store's size") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_gemma g(seed);
    smol_context_params p = params("cpu", false, SMOL_KV_OFFLOAD_AUTO);
    p.window_reserve = 4; // 3 * (6 + 4) + 16 = 46 slots
    context_ptr c = make_context(g.m.get(), p);
    CHECK(plan_text(c.get()).find("keep 46 cells of 256") != std::string::npos);
    context_ptr full = make_context(g.m.get(), params("cpu", true, SMOL_KV_OFFLOAD_AUTO));
    std::mt19937 rng(seed);
    std::vector<float> got, want;
    smol_batch b = smol_batch_init(16);
    int len = 0;
    for (int step = 0; step < 10; ++step) {
        // Ten tokens on, 1 .. 4 back: exact.
        for (int i = 0; i < 10; ++i) smol_batch_add(&b, 16, int(rng() % 300u), len + i, 0, true);
        smol_batch copy = b;
        decode(full.get(), copy, 300, want);
        decode(c.get(), b, 300, got);
        len += 10 - (1 + int(rng() % 4u));
        smol_kv_seq_rm(c.get(), 0, len, -1);
        smol_kv_seq_rm(full.get(), 0, len, -1);
    }
    check_bits(got, want);
    // A step gives back what lies past the window (6) and the reserve (4)
    // from the newest position it saw: going on from there is exact, from
    // one before refused, naming the reserve.
    for (int i = 0; i < 10; ++i) smol_batch_add(&b, 16, 1, len + i, 0, false);
    decode(c.get(), b, 300, got);
    smol_batch_add(&b, 16, 1, len + 10, 0, false);
    decode(c.get(), b, 300, got); // its step saw len + 9 as the newest
    const int exact = len + 9 - 6 - 4 + window;
    CHECK(smol_kv_seq_pos_exact(c.get(), 0) == exact);
    smol_kv_seq_rm(c.get(), 0, exact, -1);
    smol_batch_add(&b, 16, 1, exact, 0, true);
    decode(c.get(), b, 300, got);
    smol_kv_seq_rm(c.get(), 0, exact - 1, -1);
    smol_batch_add(&b, 16, 1, exact - 1, 0, true);
    CHECK(smol_decode(c.get(), &b) == SMOL_ERR_WINDOW_GONE);
    CHECK(std::string(smol_last_error()).find("roll back at most 4 tokens") != std::string::npos);
    smol_batch_free(&b);
    p.window_reserve = -1;
    smol_context * bad = nullptr;
    CHECK(smol_context_create(g.m.get(), &p, &bad) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(bad == nullptr);
}

TEST_CASE("a rollback of up to n_batch tokens stays exact however far decoding went") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_gemma g(seed);
    context_ptr c = make_context(g.m.get(), params("cpu", false, SMOL_KV_OFFLOAD_AUTO));
    context_ptr full = make_context(g.m.get(), params("cpu", true, SMOL_KV_OFFLOAD_AUTO));
    std::mt19937 rng(seed);
    std::vector<int> toks(120);
    for (int & t : toks) t = int(rng() % 300u);
    std::vector<float> got, want;
    smol_batch b = smol_batch_init(16);
    int len = 0, furthest = 0;
    for (int step = 0; step < 12; ++step) {
        // Ten tokens on, a rollback of 1 .. 16, never below 0 nor more than
        // n_batch below the furthest length reached (the reserve's promise;
        // rollbacks add up across steps): speculative decoding's pattern.
        for (int i = 0; i < 10; ++i)
            smol_batch_add(&b, 16, toks[size_t(len + i)], len + i, 0, true);
        smol_batch copy = b;
        decode(full.get(), copy, 300, want);
        decode(c.get(), b, 300, got);
        len += 10;
        furthest = std::max(furthest, len);
        const int floor = std::max(0, furthest - 16);
        const int back = std::min(len - floor, 1 + int(rng() % 16u));
        len -= back;
        smol_kv_seq_rm(c.get(), 0, len, -1);
        smol_kv_seq_rm(full.get(), 0, len, -1);
        CHECK(smol_kv_seq_pos_exact(c.get(), 0) <= len);
    }
    smol_batch_free(&b);
    check_bits(got, want);
}

TEST_CASE("the plan counts windowed layers at the window store's size, resident") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_gemma g(seed);
    context_ptr c = make_context(g.m.get(), params("sim", false, SMOL_KV_OFFLOAD_ALL));
    context_ptr full = make_context(g.m.get(), params("sim", true, SMOL_KV_OFFLOAD_ALL));
    smol_memory_info p, q;
    smol_context_memory(c.get(), &p);
    smol_context_memory(full.get(), &q);
    const uint64_t per_cell = 4ull * 2 * 16; // K and V f16 of 2 kv heads of 16
    // Layers 0 and 2 local: 82 cells each, resident; layer 1 global: 256
    // cells, offloaded.
    CHECK(p.device_kv == 2 * 82 * per_cell);
    CHECK(p.host_kv == 256 * per_cell);
    CHECK(p.n_heads_resident == 4);
    CHECK(q.device_kv == 0);
    CHECK(q.host_kv == 3 * 256 * per_cell);
    CHECK(q.n_heads_resident == 0);
    CHECK(plan_text(c.get()).find("window store: 2 sliding-window layer(s) keep 82 cells of 256") !=
          std::string::npos);
    CHECK(plan_text(full.get()).find("window store") == std::string::npos);
    // A store as large as the cache would save nothing: every position kept.
    smol_context_params wide = params("sim", false, SMOL_KV_OFFLOAD_ALL);
    wide.n_batch = 256;
    context_ptr w = make_context(g.m.get(), wide);
    CHECK(plan_text(w.get()).find("window store") == std::string::npos);
}

TEST_CASE("a model without sliding-window layers has no window store and the same plan") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny::shape s; // Llama
    tiny_gemma g(seed, s);
    context_ptr a = make_context(g.m.get(), params("sim", false, SMOL_KV_OFFLOAD_ALL));
    context_ptr b = make_context(g.m.get(), params("sim", true, SMOL_KV_OFFLOAD_ALL));
    CHECK(plan_text(a.get()).find("window store") == std::string::npos);
    CHECK(plan_text(a.get()) == plan_text(b.get()));
}

// --- streaming heads ---------------------------------------------------------

namespace {

// A Llama of three layers of two kv heads, some heads streaming: the first
// 3 positions and the last 5.
constexpr int sink = 3, stream_window = 5;
tiny::shape llama_shape() {
    tiny::shape s;
    s.n_layer = 3;
    return s;
}

struct tiny_llama {
    std::string path;
    tiny::model ref;
    model_ptr m;
    explicit tiny_llama(uint32_t seed)
        : path(temp_path("llama-" + std::to_string(seed) + ".gguf")),
          ref(tiny::write(path, llama_shape(), seed)) {
        smol_model * p = nullptr;
        const smol_status st = smol_model_load(path.c_str(), nullptr, &p);
        INFO(std::string(smol_last_error()));
        REQUIRE(st == SMOL_OK);
        m.reset(p);
    }
    ~tiny_llama() { std::filesystem::remove(path); }
};

// Six flags, at least one head of each kind and one layer mixing them.
std::vector<uint8_t> draw_heads(std::mt19937 & rng) {
    return tiny::draw_streaming_flags(rng, llama_shape());
}

// n_batch 16: a store of 3 * (3 + 5 + 16) + 16 = 88 slots of 256 cells;
// n_batch 64 would need more slots than cells, so every position is kept.
smol_context_params stream_params(const char * device, smol_kv_offload mode,
                                  const std::vector<uint8_t> & heads, uint32_t n_batch = 16) {
    smol_context_params p = params(device, false, mode);
    p.n_batch = n_batch;
    p.streaming_heads = heads.data();
    p.n_streaming_heads = uint32_t(heads.size());
    p.stream_sink = sink;
    p.stream_window = stream_window;
    return p;
}

double rel_err(const float * a, const std::vector<double> & b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < b.size(); ++i) {
        num = std::max(num, std::fabs(double(a[i]) - b[i]));
        den = std::max(den, std::fabs(b[i]));
    }
    return num / den;
}

} // namespace

TEST_CASE("streaming heads give a float64 pass's logits with those heads' attention cut") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_llama t(seed);
    std::mt19937 rng(seed);
    const std::vector<uint8_t> heads = draw_heads(rng);
    std::vector<int> ids(40);
    for (int & id : ids) id = int(rng() % 300u);
    tiny::streaming_heads cut{heads, sink, stream_window};
    const auto want = tiny::reference(t.ref, ids, nullptr, &cut);
    const auto whole = tiny::reference(t.ref, ids);
    for (const char * device : {"cpu", "sim"}) {
        CAPTURE(device);
        context_ptr c = make_context(t.m.get(), stream_params(device, SMOL_KV_OFFLOAD_ALL, heads));
        REQUIRE(plan_text(c.get()).find("keep 88 cells of 256") != std::string::npos);
        std::vector<float> got;
        smol_batch b = smol_batch_init(16);
        for (int i = 0; i < 40; ++i) {
            smol_batch_add(&b, 16, ids[size_t(i)], i, 0, true);
            if (b.n_tokens == 16 || i == 39) decode(c.get(), b, 300, got);
        }
        smol_batch_free(&b);
        // f32 weights, K and V stored as f16 (test-model's bound); past the
        // sinks and window the cut matters far more than that.
        double off_whole = 0;
        for (size_t i = 0; i < ids.size(); ++i) {
            CAPTURE(i);
            CHECK(rel_err(got.data() + i * 300, want[i]) < 5e-3);
            off_whole = std::max(off_whole, rel_err(got.data() + i * 300, whole[i]));
        }
        CHECK(off_whole > 2e-2);
    }
}

TEST_CASE("streaming heads in the window store give the bits of keeping every position") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_llama t(seed);
    std::mt19937 rng(seed);
    const std::vector<uint8_t> heads = draw_heads(rng);
    context_ptr kept =
        make_context(t.m.get(), stream_params("cpu", SMOL_KV_OFFLOAD_AUTO, heads, 64));
    const std::string kept_plan = plan_text(kept.get());
    CHECK(kept_plan.find("window store") == std::string::npos);
    CHECK(kept_plan.find("streaming heads (S; approximate") != std::string::npos);
    const std::vector<float> want = run_workload(kept.get(), 300, seed);
    struct run {
        const char * device;
        smol_kv_offload mode;
    };
    for (const run r : {run{"cpu", SMOL_KV_OFFLOAD_AUTO}, run{"sim", SMOL_KV_OFFLOAD_NONE},
                        run{"sim", SMOL_KV_OFFLOAD_ALL}, run{"sim,sim,sim", SMOL_KV_OFFLOAD_ALL}}) {
        CAPTURE(r.device);
        CAPTURE(int(r.mode));
        context_ptr c = make_context(t.m.get(), stream_params(r.device, r.mode, heads));
        const std::string plan = plan_text(c.get());
        CAPTURE(plan);
        // Over three devices, each plan keeps its own layer's streaming heads.
        const bool split = std::string(r.device).find(',') != std::string::npos;
        for (int l = 0; l < (split ? llama_shape().n_layer : 1); ++l) {
            const auto first = heads.begin() + (split ? l * llama_shape().n_head_kv : 0);
            const auto n_stream = std::count(
                first, split ? first + llama_shape().n_head_kv : heads.end(), uint8_t(1));
            if (n_stream == 0) continue;
            CHECK(plan.find("window store: " + std::to_string(n_stream) +
                            " streaming head(s) keep 88 cells of 256") != std::string::npos);
        }
        check_bits(run_workload(c.get(), 300, seed), want);
    }
}

TEST_CASE("the plan keeps streaming heads resident at the window store's size") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_llama t(seed);
    std::mt19937 rng(seed);
    const std::vector<uint8_t> heads = draw_heads(rng);
    context_ptr c = make_context(t.m.get(), stream_params("sim", SMOL_KV_OFFLOAD_ALL, heads));
    smol_memory_info p;
    smol_context_memory(c.get(), &p);
    const auto n_stream = uint64_t(std::count(heads.begin(), heads.end(), uint8_t(1)));
    const uint64_t per_cell = 2ull * 2 * 16; // K and V f16 of one kv head of 16
    CHECK(p.head_group == 1);                // a layer mixes both kinds
    CHECK(p.device_kv == n_stream * 88 * per_cell);
    CHECK(p.host_kv == (6 - n_stream) * 256 * per_cell);
    CHECK(uint64_t(p.n_heads_resident) == n_stream);
    // The plan prints what each head does.
    std::string row;
    for (int l = 0; l < 3; ++l) {
        std::string h;
        for (int k = 0; k < 2; ++k) h += heads[size_t(2 * l + k)] ? 'S' : '-';
        row += h;
    }
    const std::string plan = plan_text(c.get());
    CAPTURE(plan);
    for (int l = 0; l < 3; ++l) CHECK(plan.find(row.substr(size_t(2 * l), 2)) != std::string::npos);
    // No flag set: no streaming heads, the plan of none.
    const std::vector<uint8_t> none(6, 0);
    context_ptr a = make_context(t.m.get(), stream_params("sim", SMOL_KV_OFFLOAD_ALL, none));
    context_ptr b = make_context(t.m.get(), params("sim", false, SMOL_KV_OFFLOAD_ALL));
    CHECK(plan_text(a.get()) == plan_text(b.get()));
}

TEST_CASE("streaming heads that cannot be kept are refused with the fix") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_llama t(seed);
    std::mt19937 rng(seed);
    const std::vector<uint8_t> heads = draw_heads(rng);
    auto refused = [&](smol_model * m, const smol_context_params & p, smol_status want,
                       const char * says) {
        smol_context * c = nullptr;
        const smol_status st = smol_context_create(m, &p, &c);
        const std::string msg = smol_last_error();
        CAPTURE(msg);
        CHECK(st == want);
        CHECK(c == nullptr);
        CHECK(msg.find(says) != std::string::npos);
    };
    smol_context_params p = stream_params("cpu", SMOL_KV_OFFLOAD_AUTO, heads);
    p.n_streaming_heads = 5;
    refused(t.m.get(), p, SMOL_ERR_INVALID_ARGUMENT, "smol-heads");
    p = stream_params("cpu", SMOL_KV_OFFLOAD_AUTO, heads);
    p.stream_sink = -1;
    refused(t.m.get(), p, SMOL_ERR_INVALID_ARGUMENT, "must not be negative");
    p = stream_params("cpu", SMOL_KV_OFFLOAD_AUTO, heads);
    p.stream_window = 0;
    refused(t.m.get(), p, SMOL_ERR_INVALID_ARGUMENT, "must be positive");
    p = stream_params("sim", SMOL_KV_OFFLOAD_ALL, heads);
    p.head_group = 2;
    refused(t.m.get(), p, SMOL_ERR_INVALID_ARGUMENT, "--head-group 1");
    tiny_gemma g(seed);
    p = stream_params("cpu", SMOL_KV_OFFLOAD_AUTO, heads);
    refused(g.m.get(), p, SMOL_ERR_UNSUPPORTED, "sliding-window");
}
