// test-faults.c++ - what a user sees when a device fails: device memory
// refused while a context is made and while a graph runs, pinned host memory
// refused, and copies and kernels that fail during a step, in a plain
// context and with requests in the engine (stepped by the caller or by its
// worker thread). The faults are smol-faults.h's, which take the paths real
// failures take. Each case checks the status and the message, that the
// cache is as it was before the failed call, and that later work gives the
// logits and tokens of a run that never failed. The sanitizer suite
// (scripts/sanitize.sh) runs these cases too, so memory lost on any of these
// paths fails it.

#include "decode-all.h"
#include "smol-backend.h"
#include "smol-error.h"
#include "smol-faults.h"
#include "smol-graph.h"
#include "smol.h"
#include "test-handles.h"
#include "test-seed.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <doctest/doctest.h>
#include <mutex>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace test;
namespace faults = smol::faults;
using site = faults::site;

bool has(const std::string & text, const char * part) {
    return text.find(part) != std::string::npos;
}

smol_context_params params_on(const char * device, smol_kv_offload offload, uint32_t n_ctx = 256,
                              uint32_t n_seq = 1) {
    smol_context_params p = smol_context_default_params();
    p.device = device;
    p.kv_offload = offload;
    p.n_ctx = n_ctx;
    p.n_batch = 64;
    p.n_seq_max = n_seq;
    p.n_threads = 2;
    return p;
}

context_ptr make(smol_model * m, const smol_context_params & p) {
    smol_context * c = nullptr;
    const smol_status st = smol_context_create(m, &p, &c);
    INFO(std::string(smol_last_error()));
    REQUIRE(st == SMOL_OK);
    return context_ptr(c);
}

// A small model with more than one head group a layer, so that offloaded
// heads stream through several copies a layer.
tiny::shape small_shape(smol_type t) {
    tiny::shape s;
    s.wtype = t;
    s.n_head = 4;
    s.n_head_kv = 4;
    return s;
}

// The library's messages while it lives.
struct captured_log {
    std::mutex mu;
    std::vector<std::string> lines;
    captured_log() { smol_log_set(on_line, this); }
    ~captured_log() { smol_log_set(nullptr, nullptr); }
    static void on_line(smol_log_level, const char * text, void * user) {
        auto * self = static_cast<captured_log *>(user);
        std::lock_guard<std::mutex> lock(self->mu);
        self->lines.emplace_back(text);
    }
    bool any(const char * part) {
        std::lock_guard<std::mutex> lock(mu);
        for (const std::string & l : lines)
            if (has(l, part)) return true;
        return false;
    }
};

bool same_rows(const std::vector<std::vector<float>> & a,
               const std::vector<std::vector<float>> & b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
        if (a[i].size() != b[i].size()) return false;
        if (std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0) return false;
    }
    return true;
}

// Decodes ids[from, to) of sequence 0, every token keeping its logits.
smol_status decode_range(smol_context * c, const std::vector<int> & ids, size_t from, size_t to) {
    smol_batch b = smol_batch_init(int32_t(to - from));
    for (size_t i = from; i < to; ++i)
        smol_batch_add(&b, int32_t(to - from), ids[i], smol_pos(i), 0, true);
    const smol_status st = smol_decode(c, &b);
    smol_batch_free(&b);
    return st;
}

std::vector<std::vector<float>> rows(smol_context * c, int n, int n_vocab) {
    std::vector<std::vector<float>> out;
    for (int i = 0; i < n; ++i) {
        const float * l = smol_get_logits(c, i);
        REQUIRE(l != nullptr);
        out.emplace_back(l, l + n_vocab);
    }
    return out;
}

// --- the engine's requests -----------------------------------------------------

struct result {
    std::vector<smol_token> tokens;
    smol_finish_reason finish = SMOL_FINISH_NONE;
    std::string message;
    int events_after_finish = 0;
};

// Results of requests, filled by the engine's callback (on its worker
// thread or the caller's).
struct results {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<result> r;
    int finished = 0;
    explicit results(size_t n) : r(n) {}
};
struct slot_ref {
    results * all;
    size_t i;
};

bool collect(const smol_engine_event * ev, void * user) {
    auto * ref = static_cast<slot_ref *>(user);
    std::lock_guard<std::mutex> lock(ref->all->mu);
    result & r = ref->all->r[ref->i];
    if (r.finish != SMOL_FINISH_NONE) ++r.events_after_finish;
    if (ev->token >= 0 && ev->finish != SMOL_FINISH_ERROR) r.tokens.push_back(ev->token);
    if (ev->finish != SMOL_FINISH_NONE) {
        r.finish = ev->finish;
        if (ev->message) r.message = ev->message;
        ++ref->all->finished;
        ref->all->cv.notify_all();
    }
    return true;
}

engine_ptr make_engine(smol_model * m, bool worker) {
    smol_engine_params p = smol_engine_default_params();
    p.context = params_on("sim", SMOL_KV_OFFLOAD_ALL, 512, 4);
    p.n_chunk = 16;
    p.prefix_cache = false;
    p.worker_thread = worker;
    smol_engine * e = nullptr;
    const smol_status st = smol_engine_create(m, &p, &e);
    INFO(std::string(smol_last_error()));
    REQUIRE(st == SMOL_OK);
    return engine_ptr(e);
}

void submit_all(smol_engine * e, const std::vector<std::vector<int>> & prompts, results & out,
                std::vector<slot_ref> & refs) {
    refs.clear();
    for (size_t i = 0; i < prompts.size(); ++i) refs.push_back({&out, i});
    for (size_t i = 0; i < prompts.size(); ++i) {
        smol_request_params p = smol_request_default_params();
        p.prompt = prompts[i].data();
        p.n_prompt = int32_t(prompts[i].size());
        p.max_tokens = 6;
        p.sampler.temperature = 0;
        p.ignore_eog = true;
        p.on_event = collect;
        p.user_data = &refs[i];
        INFO(std::string(smol_last_error()));
        REQUIRE(smol_engine_submit(e, &p, nullptr) == SMOL_OK);
    }
}

void run_to_end(smol_engine * e) {
    int32_t active = 1;
    for (int i = 0; active > 0 && i < 1000; ++i) REQUIRE(smol_engine_step(e, &active) == SMOL_OK);
    REQUIRE(active == 0);
}

void wait_all(results & out) {
    std::unique_lock<std::mutex> lock(out.mu);
    REQUIRE(out.cv.wait_for(lock, std::chrono::seconds(60),
                            [&] { return out.finished == int(out.r.size()); }));
}

} // namespace

TEST_CASE("a device allocation refused while a context is made fails that call with a message, "
          "wherever it comes, and the next context is made") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(small_shape(SMOL_TYPE_Q8_0), seed, "alloc.gguf");
    faults::scope armed;
    std::mt19937 rng(seed);
    const std::vector<int> ids = random_ids(rng, 40, f.n_vocab);
    for (const smol_kv_offload offload : {SMOL_KV_OFFLOAD_NONE, SMOL_KV_OFFLOAD_ALL}) {
        CAPTURE(offload);
        const smol_context_params p = params_on("sim", offload);
        std::vector<std::vector<float>> want;
        {
            context_ptr c = make(f.model.get(), p);
            want = decode_all(c.get(), ids, f.n_vocab, 16);
        }
        int refused = 0;
        bool made = false;
        for (int64_t k = 0; k < 256 && !made; ++k) {
            CAPTURE(k);
            faults::arm(site::device_alloc, k);
            smol_context * c = nullptr;
            const smol_status st = smol_context_create(f.model.get(), &p, &c);
            const std::string msg = smol_last_error();
            const int64_t fired = faults::hits(site::device_alloc);
            faults::disarm_all();
            if (fired == 0) {
                // Past the last allocation: made, and it computes as before.
                REQUIRE(st == SMOL_OK);
                context_ptr owned(c);
                CHECK(same_rows(decode_all(c, ids, f.n_vocab, 16), want));
                made = true;
                continue;
            }
            CHECK(st == SMOL_ERR_OUT_OF_MEMORY);
            CHECK(c == nullptr);
            CHECK(has(msg, "sim device: cannot allocate"));
            CHECK(has(msg, "refused (an injected fault)"));
            ++refused;
        }
        CHECK(made);
        // At least the weights and the compute memory, and the KV where
        // heads are resident.
        CHECK(refused >= (offload == SMOL_KV_OFFLOAD_NONE ? 3 : 2));
        MESSAGE("kv_offload " << int(offload) << ": " << refused
                              << " device allocations refused in turn");
    }
}

TEST_CASE("pinned host memory refused: the context takes pageable memory, says so, and its "
          "logits do not change") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(small_shape(SMOL_TYPE_Q4_1), seed, "pinned.gguf");
    std::mt19937 rng(seed);
    const std::vector<int> ids = random_ids(rng, 50, f.n_vocab);
    const smol_context_params p = params_on("sim", SMOL_KV_OFFLOAD_ALL);
    std::vector<std::vector<float>> want;
    {
        context_ptr c = make(f.model.get(), p);
        want = decode_all(c.get(), ids, f.n_vocab, 16);
    }
    faults::scope armed;
    captured_log log;
    faults::arm(site::host_pinned, 0, -1);
    context_ptr c = make(f.model.get(), p);
    const auto got = decode_all(c.get(), ids, f.n_vocab, 16);
    CHECK(faults::hits(site::host_pinned) > 0);
    smol_memory_info mi;
    smol_context_memory(c.get(), &mi);
    CHECK(mi.host_pinned == 0);
    CHECK(mi.host_pageable >= mi.host_kv);
    CHECK(mi.host_kv > 0);
    CHECK(log.any("cannot pin"));
    CHECK(log.any("using pageable memory"));
    CHECK(same_rows(got, want));
}

TEST_CASE("under a budget, a context's steps allocate no device memory once it is made") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(small_shape(SMOL_TYPE_F16), seed, "steps.gguf");
    std::mt19937 rng(seed);
    faults::scope armed;
    for (const smol_kv_offload offload : {SMOL_KV_OFFLOAD_NONE, SMOL_KV_OFFLOAD_ALL}) {
        CAPTURE(offload);
        smol_context_params p = params_on("sim", offload, 256, 3);
        p.gpu_mem = 64u << 20;
        context_ptr c = make(f.model.get(), p);
        faults::arm(site::device_alloc, 0, -1);
        // Prompts of lengths up to n_batch, every token keeping its logits,
        // then decode steps of one to three sequences.
        smol_batch b = smol_batch_init(64);
        std::vector<int> pos(3, 0);
        for (int s = 0; s < 3; ++s) {
            const int n = 1 + int(rng() % 64);
            b.n_tokens = 0;
            for (int i = 0; i < n; ++i)
                smol_batch_add(&b, 64, int(rng() % uint32_t(f.n_vocab)), pos[size_t(s)]++, s, true);
            const smol_status st = smol_decode(c.get(), &b);
            INFO(std::string(smol_last_error()));
            REQUIRE(st == SMOL_OK);
        }
        for (int step = 0; step < 8; ++step) {
            b.n_tokens = 0;
            for (int s = 0; s <= step % 3; ++s)
                smol_batch_add(&b, 64, int(rng() % uint32_t(f.n_vocab)), pos[size_t(s)]++, s, true);
            const smol_status st = smol_decode(c.get(), &b);
            INFO(std::string(smol_last_error()));
            REQUIRE(st == SMOL_OK);
        }
        smol_batch_free(&b);
        CHECK(faults::hits(site::device_alloc) == 0);
        faults::disarm_all();
    }
}

TEST_CASE("without a budget, the compute memory a batch of many logits needs is taken at its "
          "first decode: refused, that decode fails, the cache as it was, and the next succeeds") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(small_shape(SMOL_TYPE_F16), seed, "grow.gguf");
    std::mt19937 rng(seed);
    const std::vector<int> ids = random_ids(rng, 60, f.n_vocab);
    faults::scope armed;
    const smol_context_params p = params_on("sim", SMOL_KV_OFFLOAD_NONE);
    context_ptr ref = make(f.model.get(), p);
    REQUIRE(decode_range(ref.get(), ids, 0, 4) == SMOL_OK);
    REQUIRE(decode_range(ref.get(), ids, 4, ids.size()) == SMOL_OK);
    const auto want = rows(ref.get(), int(ids.size() - 4), f.n_vocab);

    context_ptr c = make(f.model.get(), p);
    REQUIRE(decode_range(c.get(), ids, 0, 4) == SMOL_OK);
    faults::arm(site::device_alloc, 0, -1);
    CHECK(decode_range(c.get(), ids, 4, ids.size()) == SMOL_ERR_OUT_OF_MEMORY);
    const std::string msg = smol_last_error();
    CHECK(faults::hits(site::device_alloc) >= 1);
    faults::disarm_all();
    CHECK(has(msg, "compute memory"));
    CHECK(has(msg, "refused (an injected fault)"));
    CHECK(smol_kv_seq_len(c.get(), 0) == 4);
    const smol_status st = decode_range(c.get(), ids, 4, ids.size());
    INFO(std::string(smol_last_error()));
    REQUIRE(st == SMOL_OK);
    CHECK(same_rows(rows(c.get(), int(ids.size() - 4), f.n_vocab), want));
}

TEST_CASE("device memory refused while a larger graph runs fails that run only") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    faults::scope armed;
    auto sim = smol::make_backend("sim", 2);
    auto cpu = smol::make_backend("cpu", 2);
    constexpr int64_t k = 64, n = 48;
    const std::vector<float> w = tiny::random_vec(rng, size_t(k * n), 0.5f);
    const std::vector<float> x = tiny::random_vec(rng, size_t(k * 40), 1.0f);
    void * wd = sim->alloc(w.size() * sizeof(float));
    void * xd = sim->alloc(x.size() * sizeof(float));
    sim->upload(wd, w.data(), w.size() * sizeof(float));
    sim->upload(xd, x.data(), x.size() * sizeof(float));
    // y = W x for the first `tokens` columns of x, on a backend.
    const auto matmul = [&](smol::backend & be, void * wp, void * xp, int64_t tokens) {
        smol::graph g(16);
        smol::tensor * y = smol::op_mul_mat(g, g.leaf(SMOL_TYPE_F32, wp, k, n),
                                            g.leaf(SMOL_TYPE_F32, xp, k, tokens));
        g.add_node(y);
        be.run(g);
        std::vector<float> out(size_t(n * tokens));
        be.download(out.data(), y->data, out.size() * sizeof(float));
        return out;
    };
    (void)matmul(*sim, wd, xd, 2);
    faults::arm(site::device_alloc, 0, -1);
    try {
        (void)matmul(*sim, wd, xd, 40);
        FAIL("a run whose compute memory was refused went on");
    } catch (const smol::error & e) {
        CHECK(e.status == SMOL_ERR_OUT_OF_MEMORY);
        CHECK(has(e.what(), "compute memory"));
        CHECK(has(e.what(), "refused (an injected fault)"));
    }
    faults::disarm_all();
    const std::vector<float> got = matmul(*sim, wd, xd, 40);
    const std::vector<float> want =
        matmul(*cpu, const_cast<float *>(w.data()), const_cast<float *>(x.data()), 40);
    CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
    sim->release(wd);
    sim->release(xd);
}

TEST_CASE("a copy or kernel that fails in a step fails that decode with a message, leaves the "
          "cache as it was, and the same batch then gives the logits of a context that never "
          "failed") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(small_shape(SMOL_TYPE_Q8_0), seed, "step.gguf");
    std::mt19937 rng(seed);
    const std::vector<int> ids = random_ids(rng, 60, f.n_vocab);
    struct kind {
        const char * device;
        smol_kv_offload offload;
        site where;
        const char * says;
    };
    const kind kinds[] = {
        {"cpu", SMOL_KV_OFFLOAD_AUTO, site::kernel, "a kernel failed"},
        {"sim", SMOL_KV_OFFLOAD_ALL, site::kernel, "a kernel failed"},
        {"sim", SMOL_KV_OFFLOAD_ALL, site::copy, "a copy failed"},
    };
    faults::scope armed;
    for (const kind & kd : kinds) {
        CAPTURE(std::string(kd.device));
        CAPTURE(std::string(faults::site_name(kd.where)));
        const smol_context_params p = params_on(kd.device, kd.offload);
        // The prompt's first 40 tokens, then the rest in one call; the fault
        // comes somewhere in that call (a prompt of 20 tokens: one chunk),
        // then as a single-token step.
        for (const size_t cut : {size_t(40), size_t(59)}) {
            CAPTURE(cut);
            context_ptr ref = make(f.model.get(), p);
            REQUIRE(decode_range(ref.get(), ids, 0, cut) == SMOL_OK);
            REQUIRE(decode_range(ref.get(), ids, cut, ids.size()) == SMOL_OK);
            const auto want = rows(ref.get(), int(ids.size() - cut), f.n_vocab);

            context_ptr c = make(f.model.get(), p);
            REQUIRE(decode_range(c.get(), ids, 0, cut) == SMOL_OK);
            faults::arm(kd.where, int64_t(rng() % 4));
            CHECK(decode_range(c.get(), ids, cut, ids.size()) == SMOL_ERR_BACKEND);
            const std::string msg = smol_last_error();
            CHECK(faults::hits(kd.where) == 1);
            faults::disarm_all();
            CHECK(has(msg, kd.says));
            CHECK(has(msg, "(an injected fault)"));
            CHECK(smol_get_logits(c.get(), -1) == nullptr);
            CHECK(smol_kv_seq_len(c.get(), 0) == int32_t(cut));
            INFO(std::string(smol_last_error()));
            REQUIRE(decode_range(c.get(), ids, cut, ids.size()) == SMOL_OK);
            CHECK(same_rows(rows(c.get(), int(ids.size() - cut), f.n_vocab), want));
        }
    }
}

TEST_CASE("a step that fails in the engine ends the requests in it with an error event, and "
          "later requests get the tokens they get where nothing failed") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(small_shape(SMOL_TYPE_Q4_1), seed, "engine.gguf");
    std::mt19937 rng(seed);
    std::vector<std::vector<int>> prompts;
    for (int i = 0; i < 4; ++i) prompts.push_back(random_ids(rng, 10 + 9 * i, f.n_vocab));
    std::vector<slot_ref> refs;
    results want(prompts.size());
    {
        engine_ptr e = make_engine(f.model.get(), false);
        submit_all(e.get(), prompts, want, refs);
        run_to_end(e.get());
    }
    for (const auto & r : want.r) REQUIRE(r.finish == SMOL_FINISH_LENGTH);

    faults::scope armed;
    for (const site where : {site::copy, site::kernel}) {
        for (const bool worker : {false, true}) {
            CAPTURE(std::string(faults::site_name(where)));
            CAPTURE(worker);
            engine_ptr e = make_engine(f.model.get(), worker);
            // Fails the first step, in which every request has its first
            // prompt chunk.
            faults::arm(where, int64_t(rng() % 3));
            results failed(prompts.size());
            submit_all(e.get(), prompts, failed, refs);
            if (worker) {
                wait_all(failed);
            } else {
                run_to_end(e.get());
            }
            CHECK(faults::hits(where) == 1);
            faults::disarm_all();
            // Stepped here, every request is in the failed step; the
            // worker may step before the last ones are submitted, which
            // then run as they would have.
            int n_failed = 0;
            for (size_t i = 0; i < prompts.size(); ++i) {
                const result & r = failed.r[i];
                CAPTURE(i);
                CHECK(r.events_after_finish == 0);
                if (r.finish != SMOL_FINISH_ERROR) {
                    CHECK(worker);
                    CHECK(r.finish == SMOL_FINISH_LENGTH);
                    CHECK(r.tokens == want.r[i].tokens);
                    continue;
                }
                ++n_failed;
                CHECK(has(r.message, "(an injected fault)"));
                CHECK(has(r.message, "requests;"));
            }
            CHECK(n_failed >= 1);
            // The same requests again, on the engine that failed.
            results again(prompts.size());
            submit_all(e.get(), prompts, again, refs);
            if (worker) {
                wait_all(again);
            } else {
                run_to_end(e.get());
            }
            for (size_t i = 0; i < prompts.size(); ++i) {
                CAPTURE(i);
                CHECK(again.r[i].finish == SMOL_FINISH_LENGTH);
                CHECK(again.r[i].tokens == want.r[i].tokens);
            }
            const smol_engine_stats st = smol_engine_get_stats(e.get());
            CHECK(st.n_cells_used == 0);
            CHECK(st.n_finished == 8);
        }
    }
}
