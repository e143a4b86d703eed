// test-engine-spec.c++ - speculation inside the serving engine: guesses from
// n-gram lookup or a draft model ride in the step's batch beside other
// requests' tokens and prompt chunks, and the output is plain decoding's
// (greedy: token for token and logit for logit, on the CPU where a token's
// logits are the same bits alone and batched) through max_tokens limits,
// stop tokens, cancellation, the prefix cache and preemption; sampling
// replays with its seed; the engine refuses drafts that cannot serve.

#include "smol.h"
#include "test-seed.h"
#include "tiny-model.h"

#include <algorithm>
#include <doctest/doctest.h>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

struct model_deleter {
    void operator()(smol_model * m) const { smol_model_free(m); }
};
struct engine_deleter {
    void operator()(smol_engine * e) const { smol_engine_free(e); }
};
using model_ptr = std::unique_ptr<smol_model, model_deleter>;
using engine_ptr = std::unique_ptr<smol_engine, engine_deleter>;

std::string temp_path(const std::string & name) {
    return (std::filesystem::temp_directory_path() /
            ("smol-test-engine-spec-" + std::to_string(::getpid()) + "-" + name))
        .string();
}

model_ptr load(const std::string & path) {
    smol_model * m = nullptr;
    const smol_status st = smol_model_load(path.c_str(), nullptr, &m);
    INFO(std::string(smol_last_error()));
    REQUIRE(st == SMOL_OK);
    return model_ptr(m);
}

// A tiny random llama written to a temporary file; every one has the same
// vocabulary, so one can draft for another.
struct tiny_file {
    std::string path;
    model_ptr model;
    int n_vocab = 0;
    tiny_file(const tiny::shape & s, uint32_t seed, const std::string & name)
        : path(temp_path(name)) {
        tiny::write(path, s, seed);
        model = load(path);
        n_vocab = s.n_vocab;
    }
    tiny_file(smol_type t, uint32_t seed, const std::string & name)
        : tiny_file(shape_of(t), seed, name) {}
    ~tiny_file() { std::filesystem::remove(path); }
    // Smaller embeddings than tiny's default: the greedy text does not
    // settle on one token repeated, so lookup guesses wrong as well as right.
    static tiny::shape shape_of(smol_type t) {
        tiny::shape s;
        s.wtype = t;
        s.embd_scale = 0.1f;
        return s;
    }
};

std::vector<int> random_ids(std::mt19937 & rng, int n, int lo, int hi) {
    std::uniform_int_distribution<int> d(lo, hi - 1);
    std::vector<int> v(static_cast<size_t>(n));
    for (auto & x : v) x = d(rng);
    return v;
}

// A phrase of random tokens said `times` times: lookup finds its n-grams.
std::vector<int> repeated(std::mt19937 & rng, int len, int times, int n_vocab) {
    const std::vector<int> phrase = random_ids(rng, len, 0, n_vocab);
    std::vector<int> out;
    for (int i = 0; i < times; ++i) out.insert(out.end(), phrase.begin(), phrase.end());
    return out;
}

struct result {
    std::vector<smol_token> tokens;
    std::vector<std::vector<float>> logits;
    smol_finish_reason finish = SMOL_FINISH_NONE;
    int events_after_finish = 0;
    int cancel_after = -1; // >= 0: the callback says stop after this many tokens
};

bool collect(const smol_engine_event * ev, void * user) {
    auto * r = static_cast<result *>(user);
    if (r->finish != SMOL_FINISH_NONE) ++r->events_after_finish;
    if (ev->token >= 0) {
        r->tokens.push_back(ev->token);
        if (ev->logits) r->logits.emplace_back(ev->logits, ev->logits + ev->n_vocab);
    }
    r->finish = ev->finish;
    return r->cancel_after < 0 || int(r->tokens.size()) < r->cancel_after;
}

struct engine_setup {
    uint32_t n_ctx = 256, parallel = 4, chunk = 16;
    bool prefix = false;
    int32_t draft_max = 0;
    smol_model * draft = nullptr;
    uint32_t n_batch = 0; // 0: n_ctx
    const char * device = nullptr;
    // Requests whose events need no logits: greedy ones keep only top tokens.
    bool skip_logits = false;
    // Streaming heads (empty: none), with 2 sinks and a window of 5.
    std::vector<uint8_t> streaming;
};

engine_ptr make_engine(smol_model * m, const engine_setup & s) {
    smol_engine_params p = smol_engine_default_params();
    p.context.n_ctx = s.n_ctx;
    p.context.n_batch = s.n_batch ? s.n_batch : s.n_ctx;
    p.context.n_seq_max = s.parallel;
    p.context.n_threads = 2;
    p.context.device = s.device;
    p.n_chunk = s.chunk;
    p.prefix_cache = s.prefix;
    p.prefix_block = 8;
    p.draft_max = s.draft_max;
    p.draft_model = s.draft;
    if (!s.streaming.empty()) {
        p.context.streaming_heads = s.streaming.data();
        p.context.n_streaming_heads = uint32_t(s.streaming.size());
        p.context.stream_sink = 2;
        p.context.stream_window = 5;
    }
    smol_engine * e = nullptr;
    const smol_status st = smol_engine_create(m, &p, &e);
    INFO(std::string(smol_last_error()));
    REQUIRE(st == SMOL_OK);
    return engine_ptr(e);
}

struct job {
    std::vector<int> prompt;
    int max_tokens = 0;
    std::vector<int> stop;
    float temperature = 0; // greedy
    uint64_t seed = 1;
    int cancel_after = -1;
};

void run(smol_engine * e) {
    int32_t active = 1;
    for (int i = 0; active > 0 && i < 10000; ++i) REQUIRE(smol_engine_step(e, &active) == SMOL_OK);
    REQUIRE(active == 0);
}

// Submits every job to one engine at once and runs it to the end.
std::vector<result> serve(smol_model * m, const engine_setup & s, const std::vector<job> & jobs,
                          smol_engine_stats * stats = nullptr) {
    engine_ptr e = make_engine(m, s);
    std::vector<result> out(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
        const job & j = jobs[i];
        out[i].cancel_after = j.cancel_after;
        smol_request_params p = smol_request_default_params();
        p.prompt = j.prompt.data();
        p.n_prompt = int32_t(j.prompt.size());
        p.max_tokens = j.max_tokens;
        p.stop_tokens = j.stop.data();
        p.n_stop_tokens = int32_t(j.stop.size());
        p.sampler.temperature = j.temperature;
        p.sampler.seed = j.seed;
        p.ignore_eog = true;
        p.skip_event_logits = s.skip_logits;
        p.on_event = collect;
        p.user_data = &out[i];
        const smol_status st = smol_engine_submit(e.get(), &p, nullptr);
        INFO(std::string(smol_last_error()));
        REQUIRE(st == SMOL_OK);
    }
    run(e.get());
    const smol_engine_stats st = smol_engine_get_stats(e.get());
    if (stats) *stats = st;
    // No guess outlives its step: without the prefix cache, every cell is free.
    if (!s.prefix) CHECK(st.n_cells_used == 0);
    return out;
}

// The same tokens and ends, and the same logits in the events; without
// logits (skip_logits), greedy events carry none.
void check_same(const std::vector<result> & got, const std::vector<result> & want,
                bool logits = true) {
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
        CAPTURE(i);
        CHECK(got[i].finish == want[i].finish);
        CHECK(got[i].tokens == want[i].tokens);
        CHECK(got[i].events_after_finish == 0);
        if (!logits) {
            CHECK(got[i].logits.empty());
            continue;
        }
        REQUIRE(got[i].logits.size() == want[i].logits.size());
        for (size_t t = 0; t < got[i].logits.size(); ++t) {
            CAPTURE(t);
            CHECK(got[i].logits[t] == want[i].logits[t]);
        }
    }
}

// Prompts of random and of repeated text with several max_tokens, a stop
// token taken from what plain decoding generates, and a request that the
// callback cancels.
std::vector<job> mixed_jobs(smol_model * m, int n_vocab, std::mt19937 & rng) {
    std::vector<job> jobs;
    const int limits[] = {40, 23, 57, 31, 45, 17};
    for (int i = 0; i < 6; ++i) {
        job j;
        j.prompt =
            i % 2 == 0 ? repeated(rng, 3 + i, 4, n_vocab) : random_ids(rng, 5 + 3 * i, 0, n_vocab);
        j.max_tokens = limits[i];
        jobs.push_back(j);
    }
    // A stop token: the latest-first token of what plain decoding gives for
    // the first job, so that it stops late.
    engine_setup plain;
    const std::vector<smol_token> first = serve(m, plain, {jobs[0]})[0].tokens;
    REQUIRE(!first.empty());
    size_t late = 0;
    for (size_t i = 0; i < first.size(); ++i) {
        if (std::find(first.begin(), first.begin() + long(i), first[i]) == first.begin() + long(i))
            late = i;
    }
    job stop = jobs[0];
    stop.stop = {first[late]};
    jobs.push_back(stop);
    job cancel = jobs[2];
    cancel.cancel_after = 19;
    jobs.push_back(cancel);
    return jobs;
}

} // namespace

TEST_CASE("greedy decoding with n-gram lookup gives plain decoding's tokens and logits") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(SMOL_TYPE_Q8_0, seed, "lookup.gguf");
    std::mt19937 rng(seed);
    const std::vector<job> jobs = mixed_jobs(f.model.get(), f.n_vocab, rng);
    engine_setup plain;
    const std::vector<result> want = serve(f.model.get(), plain, jobs);
    CHECK(want[6].finish == SMOL_FINISH_STOP);
    CHECK(want[7].finish == SMOL_FINISH_CANCELLED);
    CHECK(want[7].tokens.size() == 19);
    for (int32_t draft_max : {1, 4, 8}) {
        CAPTURE(draft_max);
        engine_setup spec;
        spec.draft_max = draft_max;
        smol_engine_stats st{};
        const std::vector<result> got = serve(f.model.get(), spec, jobs, &st);
        check_same(got, want);
        // Not vacuous: guesses were made, some kept and some rejected.
        CHECK(st.n_spec_accepted > 0);
        CHECK(st.n_spec_accepted < st.n_spec_drafted);
        CHECK(st.n_spec_verifies > 0);
        CHECK(st.n_spec_drafted <= int64_t(draft_max) * st.n_spec_verifies);
        // Verified from the top tokens alone, on the CPU and the simulated
        // device (whose graph picks them).
        spec.skip_logits = true;
        for (const char * device : {static_cast<const char *>(nullptr), "sim"}) {
            CAPTURE(device ? device : "cpu");
            spec.device = device;
            check_same(serve(f.model.get(), spec, jobs, &st), want, false);
            CHECK(st.n_spec_accepted > 0);
            CHECK(st.n_spec_accepted < st.n_spec_drafted);
        }
    }
}

TEST_CASE("the engine's lookup guesses one more than it kept after a rejection, pass by pass") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(SMOL_TYPE_Q8_0, seed, "adapt.gguf");
    std::mt19937 rng(seed);
    int steps = 0, shortened = 0, rejections = 0;
    // Texts until a rejection was followed by a pass (the tiny model's text
    // often settles, lookup then guessing right): four at least.
    for (int trial = 0; trial < 4 || shortened == 0; ++trial) {
        REQUIRE(trial < 40);
        engine_setup s;
        s.draft_max = 8;
        s.parallel = 1;
        engine_ptr e = make_engine(f.model.get(), s);
        const std::vector<int> prompt =
            trial % 2 ? repeated(rng, 4 + trial, 4, f.n_vocab) : random_ids(rng, 12, 0, f.n_vocab);
        result r;
        smol_request_params p = smol_request_default_params();
        p.prompt = prompt.data();
        p.n_prompt = int32_t(prompt.size());
        p.max_tokens = 80;
        p.ignore_eog = true;
        p.on_event = collect;
        p.user_data = &r;
        REQUIRE(smol_engine_submit(e.get(), &p, nullptr) == SMOL_OK);
        // One request: each step's figures are its pass.
        int64_t allowed = s.draft_max;
        smol_engine_stats last = smol_engine_get_stats(e.get());
        for (int32_t active = 1; active > 0;) {
            REQUIRE(smol_engine_step(e.get(), &active) == SMOL_OK);
            const smol_engine_stats now = smol_engine_get_stats(e.get());
            const int64_t guessed = now.n_spec_drafted - last.n_spec_drafted;
            const int64_t kept = now.n_spec_accepted - last.n_spec_accepted;
            last = now;
            CAPTURE(steps);
            CHECK(guessed <= allowed);
            shortened += allowed < s.draft_max && guessed > 0;
            if (guessed > kept) ++rejections;
            allowed = kept < guessed ? kept + 1 : guessed > 0 ? s.draft_max : allowed;
            ++steps;
        }
        CHECK(r.tokens.size() == 80);
    }
    CHECK(rejections > 0);
    CHECK(shortened > 0);
    MESSAGE(steps << " steps, " << rejections << " with a rejected guess, " << shortened
                  << " passes shortened after one");
}

TEST_CASE("a Gemma keeping only its window, lookup's rejected guesses rolled back, gives plain "
          "decoding's tokens and logits") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny::shape s = tiny_file::shape_of(SMOL_TYPE_Q8_0);
    s.gemma = true;
    s.n_layer = 3; // local, global, local
    s.head_dim = 16;
    s.window = 6;
    tiny_file f(s, seed, "gemma-lookup.gguf");
    std::mt19937 rng(seed);
    // A tiny random Gemma often falls into a loop that lookup guesses
    // whole: new jobs until some guess was rejected (each round checked).
    int64_t rejected = 0;
    for (int round = 0; round < 6 && rejected == 0; ++round) {
        const std::vector<job> jobs = mixed_jobs(f.model.get(), f.n_vocab, rng);
        // Plain: n_batch = n_ctx, so every position is kept. With lookup:
        // n_batch 16, a window store of 5 x (6 + 16) + 16 of 256 cells,
        // whose reserve of 16 covers every rollback of up to 4 guesses.
        engine_setup plain;
        const std::vector<result> want = serve(f.model.get(), plain, jobs);
        engine_setup spec;
        spec.n_batch = 16;
        spec.draft_max = 4;
        smol_engine_stats st{};
        const std::vector<result> got = serve(f.model.get(), spec, jobs, &st);
        check_same(got, want);
        CHECK(st.n_spec_accepted > 0);
        rejected = st.n_spec_drafted - st.n_spec_accepted;
    }
    CHECK(rejected > 0);
    // A window_reserve below draft_max could not take back every guess.
    smol_engine_params p = smol_engine_default_params();
    p.context.n_ctx = 256;
    p.context.n_batch = 16;
    p.context.window_reserve = 3;
    p.draft_max = 4;
    smol_engine * e = nullptr;
    CHECK(smol_engine_create(f.model.get(), &p, &e) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(e == nullptr);
    CHECK(std::string(smol_last_error()).find("--window-reserve") != std::string::npos);
    p.context.window_reserve = 4;
    REQUIRE(smol_engine_create(f.model.get(), &p, &e) == SMOL_OK);
    smol_engine_free(e);
}

TEST_CASE("with the prefix cache and preemption, lookup still gives plain decoding's output") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(SMOL_TYPE_Q4_1, seed, "preempt.gguf");
    std::mt19937 rng(seed);
    // Three requests of 16 + 40 tokens, two at a time in 80 cells: some are
    // preempted and recomputed, the last finds the shared block cached.
    const std::vector<int> shared = repeated(rng, 4, 3, f.n_vocab);
    std::vector<job> jobs;
    for (int i = 0; i < 3; ++i) {
        job j;
        j.prompt = shared;
        const std::vector<int> tail = random_ids(rng, 4, 0, f.n_vocab);
        j.prompt.insert(j.prompt.end(), tail.begin(), tail.end());
        j.max_tokens = 40;
        jobs.push_back(j);
    }
    engine_setup plain;
    const std::vector<result> want = serve(f.model.get(), plain, jobs);
    engine_setup spec;
    spec.n_ctx = 80;
    spec.parallel = 2;
    spec.prefix = true;
    spec.draft_max = 6;
    smol_engine_stats st{};
    check_same(serve(f.model.get(), spec, jobs, &st), want);
    CHECK(st.n_preempted > 0);
    CHECK(st.n_prefix_hit_tokens > 0);
    CHECK(st.n_spec_accepted > 0);
}

TEST_CASE("greedy decoding with a draft model gives plain decoding's tokens and logits") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(SMOL_TYPE_Q8_0, seed, "target.gguf");
    tiny_file other(SMOL_TYPE_Q8_0, seed + 1, "draft.gguf");
    std::mt19937 rng(seed);
    const std::vector<job> jobs = mixed_jobs(f.model.get(), f.n_vocab, rng);
    engine_setup plain;
    const std::vector<result> want = serve(f.model.get(), plain, jobs);

    // Another model guesses: whatever it guesses, the output is the target's.
    engine_setup spec;
    spec.draft_max = 5;
    spec.draft = other.model.get();
    smol_engine_stats st{};
    check_same(serve(f.model.get(), spec, jobs, &st), want);
    CHECK(st.n_spec_drafted > 0);
    CHECK(st.n_spec_accepted <= st.n_spec_drafted);

    // The target drafting for itself: its greedy guesses are its own choices
    // (the same bits one at a time as batched), so every guess is kept.
    model_ptr self = load(f.path);
    spec.draft = self.get();
    check_same(serve(f.model.get(), spec, jobs, &st), want);
    CHECK(st.n_spec_drafted > 0);
    CHECK(st.n_spec_accepted == st.n_spec_drafted);

    // The target's layers split over two simulated devices, the draft on
    // the first: the same output.
    spec.draft = other.model.get();
    spec.device = "sim,sim";
    check_same(serve(f.model.get(), spec, jobs, &st), want);
    CHECK(st.n_spec_drafted > 0);
    // And verified from the target's top tokens alone.
    spec.skip_logits = true;
    check_same(serve(f.model.get(), spec, jobs, &st), want, false);
    CHECK(st.n_spec_drafted > 0);
}

TEST_CASE("a draft whose cache is full leaves requests without guesses and the output as it was") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(SMOL_TYPE_Q8_0, seed, "full.gguf");
    model_ptr self = load(f.path);
    std::mt19937 rng(seed);
    // Three requests with one 48-token prompt: the target holds it once (the
    // prefix cache), the draft once a request, which 112 cells cannot hold.
    const std::vector<int> prompt = random_ids(rng, 48, 0, f.n_vocab);
    job j;
    j.prompt = prompt;
    j.max_tokens = 12;
    engine_setup plain;
    const result want = serve(f.model.get(), plain, {j})[0];
    engine_setup spec;
    spec.n_ctx = 112;
    spec.parallel = 3;
    spec.prefix = true;
    spec.draft_max = 3;
    spec.draft = self.get();
    engine_ptr e = make_engine(f.model.get(), spec);
    std::vector<result> got(3);
    smol_request_params p = smol_request_default_params();
    p.prompt = prompt.data();
    p.n_prompt = int32_t(prompt.size());
    p.max_tokens = 12;
    p.sampler.temperature = 0;
    p.ignore_eog = true;
    p.on_event = collect;
    int32_t active = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        p.user_data = &got[i];
        REQUIRE(smol_engine_submit(e.get(), &p, nullptr) == SMOL_OK);
        // The first computes the prompt and starts generating before the
        // others come.
        for (int s = 0; i == 0 && got[0].tokens.empty() && s < 100; ++s)
            REQUIRE(smol_engine_step(e.get(), &active) == SMOL_OK);
    }
    run(e.get());
    for (size_t i = 0; i < got.size(); ++i) {
        CAPTURE(i);
        CHECK(got[i].tokens == want.tokens);
        CHECK(got[i].logits == want.logits);
    }
    const smol_engine_stats st = smol_engine_get_stats(e.get());
    CHECK(st.n_prefix_hit_tokens > 0);
    CHECK(st.n_preempted == 0); // the target had room: only the draft was short
    CHECK(st.n_spec_accepted == st.n_spec_drafted);
    // With room for every draft sequence, the three guess more; short of
    // it, the requests that fit still guess (more than one request's share).
    spec.n_ctx = 256;
    smol_engine_stats roomy{};
    serve(f.model.get(), spec, {j, j, j}, &roomy);
    CHECK(st.n_spec_drafted < roomy.n_spec_drafted);
    CHECK(3 * st.n_spec_drafted > roomy.n_spec_drafted);
}

TEST_CASE("sampling with speculation replays with its seed and keeps a sane share of guesses") {
    SMOL_TEST_DRAW_SEED(seed);
    // The default embeddings: peaked distributions, text that repeats.
    tiny::shape peaked;
    peaked.wtype = SMOL_TYPE_Q8_0;
    tiny_file f(peaked, seed, "sampled.gguf");
    std::mt19937 rng(seed);
    std::vector<job> jobs;
    for (int i = 0; i < 4; ++i) {
        job j;
        j.prompt = repeated(rng, 4 + i, 3, f.n_vocab);
        j.max_tokens = 30;
        j.temperature = 0.7f;
        j.seed = seed + uint64_t(i);
        jobs.push_back(j);
    }
    model_ptr self = load(f.path);
    for (smol_model * draft : {static_cast<smol_model *>(nullptr), self.get()}) {
        CAPTURE(draft != nullptr);
        engine_setup spec;
        spec.draft_max = 4;
        spec.draft = draft;
        smol_engine_stats a{}, b{};
        const std::vector<result> first = serve(f.model.get(), spec, jobs, &a);
        const std::vector<result> again = serve(f.model.get(), spec, jobs, &b);
        for (size_t i = 0; i < jobs.size(); ++i) {
            CAPTURE(i);
            CHECK(first[i].tokens == again[i].tokens);
            CHECK(first[i].tokens.size() == 30);
        }
        CHECK(a.n_spec_drafted == b.n_spec_drafted);
        CHECK(a.n_spec_accepted == b.n_spec_accepted);
        CHECK(a.n_spec_accepted <= a.n_spec_drafted);
        CHECK(a.n_spec_drafted > 0);
        // A draft with the target's own distribution: p == q, so every guess
        // passes min(1, p / q).
        if (draft) CHECK(a.n_spec_accepted == a.n_spec_drafted);
    }
}

TEST_CASE("a request with a penalty, a grammar or draft_max 0 does not speculate") {
    tiny_file f(SMOL_TYPE_Q8_0, 91, "optout.gguf");
    std::mt19937 rng(91);
    const std::vector<int> prompt = repeated(rng, 3, 4, f.n_vocab);
    engine_ptr e = make_engine(f.model.get(), {256, 2, 16, false, 4, nullptr});
    result a, b, c;
    smol_request_params p = smol_request_default_params();
    p.prompt = prompt.data();
    p.n_prompt = int32_t(prompt.size());
    p.max_tokens = 30;
    p.sampler.temperature = 0;
    p.ignore_eog = true;
    p.on_event = collect;
    p.user_data = &a;
    p.draft_max = 0;
    REQUIRE(smol_engine_submit(e.get(), &p, nullptr) == SMOL_OK);
    p.draft_max = -1;
    p.sampler.repeat_penalty = 1.3f;
    p.user_data = &b;
    REQUIRE(smol_engine_submit(e.get(), &p, nullptr) == SMOL_OK);
    p.sampler.repeat_penalty = 1.0f;
    p.grammar = "root ::= [a-z]*";
    p.user_data = &c;
    REQUIRE(smol_engine_submit(e.get(), &p, nullptr) == SMOL_OK);
    run(e.get());
    CHECK(a.tokens.size() == 30);
    CHECK(b.tokens.size() == 30);
    CHECK(c.finish != SMOL_FINISH_ERROR);
    CHECK(smol_engine_get_stats(e.get()).n_spec_drafted == 0);
}

TEST_CASE("the engine refuses a draft of another vocabulary or a larger one, and draft_max past "
          "the batch") {
    tiny_file f(SMOL_TYPE_F16, 78, "refuse.gguf");
    tiny::shape other_vocab;
    other_vocab.wtype = SMOL_TYPE_F16;
    other_vocab.n_vocab = 320;
    tiny_file v(other_vocab, 79, "vocab.gguf");
    tiny::shape deeper;
    deeper.wtype = SMOL_TYPE_F16;
    deeper.n_layer = 3;
    tiny_file big(deeper, 80, "big.gguf");
    smol_engine_params p = smol_engine_default_params();
    p.context.n_ctx = 64;
    p.context.n_batch = 64;
    p.draft_max = 4;
    smol_engine * raw = nullptr;
    p.draft_model = v.model.get();
    CHECK(smol_engine_create(f.model.get(), &p, &raw) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(raw == nullptr);
    CHECK(std::string(smol_last_error()).find("320 tokens") != std::string::npos);
    p.draft_model = big.model.get();
    CHECK(smol_engine_create(f.model.get(), &p, &raw) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(std::string(smol_last_error()).find("parameters") != std::string::npos);
    p.draft_model = nullptr;
    p.draft_max = 64;
    CHECK(smol_engine_create(f.model.get(), &p, &raw) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(std::string(smol_last_error()).find("draft_max 64") != std::string::npos);
    p.draft_max = 63;
    REQUIRE(smol_engine_create(f.model.get(), &p, &raw) == SMOL_OK);
    smol_engine_free(raw);
}

TEST_CASE("streaming heads in the window store, with the prefix cache and lookup, give the "
          "output of keeping every position") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(SMOL_TYPE_Q8_0, seed, "streaming.gguf");
    std::mt19937 rng(seed);
    // Two at a time, guessing by lookup (rollbacks): three requests share a
    // 12-token block while they run; a short one's text is asked for again
    // last, after others have decoded long past its end, when the store has
    // given back its sinks: it must be recomputed, not reused.
    const std::vector<int> shared = repeated(rng, 4, 3, f.n_vocab);
    std::vector<job> jobs;
    for (const int max_tokens : {6, 40, 40}) {
        job j;
        j.prompt = shared;
        const std::vector<int> tail = random_ids(rng, 4, 0, f.n_vocab);
        j.prompt.insert(j.prompt.end(), tail.begin(), tail.end());
        j.max_tokens = max_tokens;
        jobs.push_back(j);
    }
    jobs.push_back(jobs[0]);
    const int n_layer = tiny_file::shape_of(SMOL_TYPE_Q8_0).n_layer;
    std::vector<uint8_t> heads(size_t(2 * n_layer), 0);
    heads[rng() % heads.size()] = 1;
    // n_batch = n_ctx: the store would be no smaller, every position kept.
    engine_setup kept;
    kept.parallel = 2;
    kept.prefix = true;
    kept.draft_max = 4;
    kept.streaming = heads;
    smol_engine_stats st_kept{};
    const std::vector<result> want = serve(f.model.get(), kept, jobs, &st_kept);
    engine_setup store = kept;
    store.n_batch = 16; // 3 x (2 + 5 + 16) + 16 = 85 slots of 256
    smol_engine_stats st{};
    check_same(serve(f.model.get(), store, jobs, &st), want);
    // Shared while held; the last request's text recomputed with the store.
    CHECK(st.n_prefix_hit_tokens > 0);
    CHECK(st.n_prefix_hit_tokens < st_kept.n_prefix_hit_tokens);
    CHECK(st.n_spec_drafted > 0);
}
