// test-spec.c++ - speculative greedy decoding (smol_spec_*): the tokens are
// plain greedy decoding's, exactly, with n-gram lookup and with draft models
// that guess well (the target itself) and badly (random weights with the
// target's vocabulary), on the real SmolLM2-135M; guesses are kept where the
// text repeats; the refusals.

#include "gguf.h"
#include "random-model.h"
#include "smol.h"
#include "test-handles.h"

#include <doctest/doctest.h>
#include <filesystem>
#include <string>
#include <vector>

namespace {

namespace rm = smol::random_model;

bool real_absent() {
    return !std::filesystem::exists(SMOL_MODEL);
}

test::model_ptr load(const std::string & path) {
    smol_model * m = nullptr;
    INFO(path);
    REQUIRE(smol_model_load(path.c_str(), nullptr, &m) == SMOL_OK);
    return test::model_ptr(m);
}

test::context_ptr context(smol_model * m) {
    smol_context_params p = smol_context_default_params();
    p.n_ctx = 1024;
    p.n_batch = 64;
    p.n_threads = 2;
    smol_context * c = nullptr;
    REQUIRE(smol_context_create(m, &p, &c) == SMOL_OK);
    return test::context_ptr(c);
}

std::vector<smol_token> tokenize(const smol_model * m, const std::string & text) {
    std::vector<smol_token> ids(text.size() + 8);
    int32_t n = 0;
    REQUIRE(smol_tokenize(m, text.data(), text.size(), true, false, ids.data(), int32_t(ids.size()),
                          &n) == SMOL_OK);
    ids.resize(size_t(n));
    return ids;
}

// Plain greedy decoding: the prompt, then one token a decode.
std::vector<smol_token> plain(smol_model * m, const std::vector<smol_token> & prompt, int n) {
    test::context_ptr c = context(m);
    smol_model_info info;
    smol_model_get_info(m, &info);
    smol_batch b = smol_batch_init(64);
    for (size_t i0 = 0; i0 < prompt.size(); i0 += 64) {
        b.n_tokens = 0;
        for (size_t i = i0; i < std::min(prompt.size(), i0 + 64); ++i)
            smol_batch_add(&b, 64, prompt[i], smol_pos(i), 0, i + 1 == prompt.size());
        REQUIRE(smol_decode(c.get(), &b) == SMOL_OK);
    }
    std::vector<smol_token> out;
    for (int i = 0; i < n; ++i) {
        const float * l = smol_get_logits(c.get(), -1);
        const smol_token t = smol_token(std::max_element(l, l + info.n_vocab) - l);
        out.push_back(t);
        b.n_tokens = 0;
        smol_batch_add(&b, 64, t, smol_pos(prompt.size() + size_t(i)), 0, true);
        REQUIRE(smol_decode(c.get(), &b) == SMOL_OK);
    }
    smol_batch_free(&b);
    return out;
}

struct spec_run {
    std::vector<smol_token> tokens;
    smol_spec_stats stats;
};

spec_run speculative(smol_model * m, const std::vector<smol_token> & prompt, int n,
                     const smol_spec_params & p) {
    test::context_ptr c = context(m);
    smol_spec * s = nullptr;
    INFO(smol_last_error());
    REQUIRE(smol_spec_create(c.get(), &p, &s) == SMOL_OK);
    REQUIRE(smol_spec_prompt(s, prompt.data(), int32_t(prompt.size())) == SMOL_OK);
    spec_run r;
    while (int(r.tokens.size()) < n) {
        smol_token buf[16];
        int32_t got = 0;
        REQUIRE(smol_spec_next(s, buf, std::min(16, n - int(r.tokens.size())), &got) == SMOL_OK);
        REQUIRE(got >= 1);
        r.tokens.insert(r.tokens.end(), buf, buf + got);
    }
    r.stats = smol_spec_get_stats(s);
    smol_spec_free(s);
    return r;
}

const char * const k_prompts[] = {
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. "
    "The quick brown fox",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "The capital of France is",
};

} // namespace

TEST_CASE("n-gram lookup gives plain greedy decoding's tokens and keeps guesses where text "
          "repeats" *
          doctest::skip(real_absent())) {
    test::model_ptr m = load(SMOL_MODEL);
    int64_t accepted = 0, steps = 0, tokens = 0;
    for (const char * text : k_prompts) {
        INFO(text);
        const auto prompt = tokenize(m.get(), text);
        const auto want = plain(m.get(), prompt, 48);
        const spec_run got = speculative(m.get(), prompt, 48, smol_spec_default_params());
        CHECK(got.tokens == want);
        CHECK(got.stats.n_tokens == 48);
        CHECK(got.stats.n_accepted <= got.stats.n_drafted);
        accepted += got.stats.n_accepted;
        steps += got.stats.n_steps;
        tokens += got.stats.n_tokens;
    }
    CHECK(accepted > 20);  // the repeated sentence and the code pattern
    CHECK(steps < tokens); // fewer target decodes than tokens
    MESSAGE("lookup: " << tokens << " tokens in " << steps << " target decodes, " << accepted
                       << " guesses kept");
}

TEST_CASE("a draft model gives plain greedy decoding's tokens, guessing well or badly" *
          doctest::skip(real_absent())) {
    test::model_ptr m = load(SMOL_MODEL);
    // A bad draft: random weights of a small shape with the real vocabulary.
    const auto real = gguf::file::open(SMOL_MODEL);
    rm::options o;
    o.s.name = "tiny";
    o.s.n_embd = 64;
    o.s.n_layer = 2;
    o.s.n_head = 4;
    o.s.n_head_kv = 2;
    o.s.n_ff = 96;
    o.s.n_ctx = 2048;
    o.vocab_from = real.get();
    o.type = SMOL_TYPE_Q8_0;
    const std::string path =
        (std::filesystem::temp_directory_path() / "smol-test-spec-draft.gguf").string();
    rm::write(path, o);
    test::model_ptr bad = load(path);
    for (smol_model * draft : {m.get(), bad.get()}) {
        const bool self = draft == m.get();
        for (const char * text : k_prompts) {
            CAPTURE(self);
            INFO(text);
            const auto prompt = tokenize(m.get(), text);
            const auto want = plain(m.get(), prompt, 32);
            smol_spec_params p = smol_spec_default_params();
            p.draft_model = draft;
            p.draft_max = 5;
            const spec_run got = speculative(m.get(), prompt, 32, p);
            CHECK(got.tokens == want);
            if (self) {
                // The target as its own draft guesses right every time.
                CHECK(got.stats.n_accepted == got.stats.n_drafted);
                CHECK(got.stats.n_steps <= 32 / 6 + 2);
            }
        }
    }
    std::filesystem::remove(path);
}

TEST_CASE("a draft with another vocabulary is refused, naming the first differing token" *
          doctest::skip(real_absent() || !std::filesystem::exists(SMOL_GEMMA_MODEL))) {
    test::model_ptr m = load(SMOL_MODEL);
    test::model_ptr g = load(SMOL_GEMMA_MODEL);
    test::context_ptr c = context(m.get());
    smol_spec_params p = smol_spec_default_params();
    p.draft_model = g.get();
    smol_spec * s = nullptr;
    CHECK(smol_spec_create(c.get(), &p, &s) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(s == nullptr);
    const std::string msg = smol_last_error();
    CHECK(msg.find("vocabulary differs") != std::string::npos);
    CHECK(msg.find("at token 0") != std::string::npos);
}

TEST_CASE("bad speculation settings and calls out of order are refused" *
          doctest::skip(real_absent())) {
    test::model_ptr m = load(SMOL_MODEL);
    test::context_ptr c = context(m.get());
    smol_spec * s = nullptr;
    smol_spec_params p = smol_spec_default_params();
    p.draft_max = 64; // the batch is 64: 65 tokens would not fit
    CHECK(smol_spec_create(c.get(), &p, &s) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(std::string(smol_last_error()).find("draft_max") != std::string::npos);
    p = smol_spec_default_params();
    p.ngram_min = 3;
    p.ngram_max = 2;
    CHECK(smol_spec_create(c.get(), &p, &s) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(std::string(smol_last_error()).find("ngram_min") != std::string::npos);
    p = smol_spec_default_params();
    REQUIRE(smol_spec_create(c.get(), &p, &s) == SMOL_OK);
    smol_token out[4];
    int32_t n = 0;
    CHECK(smol_spec_next(s, out, 4, &n) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(std::string(smol_last_error()).find("prompt first") != std::string::npos);
    smol_spec_free(s);
}
