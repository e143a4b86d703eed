// test-spec.c++ - speculative decoding (smol_spec_*): greedy, the tokens
// are plain greedy decoding's, exactly, with n-gram lookup and with draft
// models that guess well (the target itself) and badly (random weights with
// the target's vocabulary), on the real SmolLM2-135M; guesses are kept
// where the text repeats. Sampling, the first tokens follow the target's
// exact distribution (computed from its logits) by a chi-square test over
// thousands of seeded runs, as plain sampling's do, with a tiny random
// target and a different tiny random draft. The refusals.

#include "gguf.h"
#include "random-model.h"
#include "smol-spec.h"
#include "smol.h"
#include "test-handles.h"
#include "test-seed.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <doctest/doctest.h>
#include <filesystem>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
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

// On the CPU, or with device "sim" the simulated device with every KV head
// offloaded to host memory (streamed through its staging slots).
test::context_ptr context(smol_model * m, uint32_t n_seq_max = 1, const char * device = nullptr) {
    smol_context_params p = smol_context_default_params();
    p.device = device;
    if (device) p.kv_offload = SMOL_KV_OFFLOAD_ALL;
    p.n_seq_max = n_seq_max;
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
                     const smol_spec_params & p, const char * device = nullptr) {
    test::context_ptr c = context(m, uint32_t(std::max(1, p.tree_budget / 2) + 1), device);
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

TEST_CASE("a chain guesses one more than it kept after a rejection, and grows after a run of "
          "right guesses") {
    // The rule (most 8): all kept doubles (never below the last length);
    // a rejection leaves one more than was kept; no guess keeps the last.
    CHECK(smol::spec_next_length(8, 8, 0, 8) == 1);
    CHECK(smol::spec_next_length(8, 8, 3, 8) == 4);
    CHECK(smol::spec_next_length(1, 1, 1, 8) == 2);
    CHECK(smol::spec_next_length(4, 4, 4, 8) == 8);
    CHECK(smol::spec_next_length(8, 2, 2, 8) == 8); // fewer found, all right
    CHECK(smol::spec_next_length(3, 0, 0, 8) == 3);
    CHECK(smol::spec_next_length(2, 2, 2, 3) == 3);
}

TEST_CASE("lookup's passes follow the chain's length rule, pass by pass" *
          doctest::skip(real_absent())) {
    test::model_ptr m = load(SMOL_MODEL);
    int passes = 0, shortened = 0;
    for (const char * text : k_prompts) {
        INFO(text);
        const auto prompt = tokenize(m.get(), text);
        test::context_ptr c = context(m.get());
        smol_spec_params p = smol_spec_default_params();
        smol_spec * s = nullptr;
        REQUIRE(smol_spec_create(c.get(), &p, &s) == SMOL_OK);
        REQUIRE(smol_spec_prompt(s, prompt.data(), int32_t(prompt.size())) == SMOL_OK);
        // Each call is one target pass: its guesses and kept ones are the
        // figures' differences. The room for more is n_max - 1 = 16.
        int32_t allowed = p.draft_max;
        for (int i = 0; i < 40; ++i) {
            const smol_spec_stats before = smol_spec_get_stats(s);
            smol_token out[17];
            int32_t n = 0;
            REQUIRE(smol_spec_next(s, out, 17, &n) == SMOL_OK);
            const smol_spec_stats after = smol_spec_get_stats(s);
            const int32_t guessed = int32_t(after.n_drafted - before.n_drafted);
            const int32_t kept = int32_t(after.n_accepted - before.n_accepted);
            CAPTURE(i);
            CHECK(guessed <= allowed);
            shortened += allowed < p.draft_max;
            allowed = kept < guessed ? kept + 1 : guessed > 0 ? p.draft_max : allowed;
            ++passes;
        }
        smol_spec_free(s);
    }
    CHECK(shortened > 0); // some guess was rejected and the next pass shorter
    MESSAGE(passes << " passes, " << shortened << " of them shortened by a rejection before");
}

TEST_CASE("a draft model gives plain greedy decoding's tokens, guessing well or badly, as a "
          "chain or a token tree" *
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
    std::vector<std::vector<smol_token>> prompts, wants;
    for (const char * text : k_prompts) {
        prompts.push_back(tokenize(m.get(), text));
        wants.push_back(plain(m.get(), prompts.back(), 32));
    }
    for (smol_model * draft : {m.get(), bad.get()}) {
        const bool self = draft == m.get();
        // The bad draft is rejected at every step whatever the text: one prompt shows it.
        for (size_t i = 0; i < (self ? prompts.size() : 1); ++i) {
            CAPTURE(self);
            INFO(k_prompts[i]);
            const auto & prompt = prompts[i];
            const auto & want = wants[i];
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
            // A token tree of the draft's likeliest continuations.
            p.tree_budget = 12;
            const spec_run tree = speculative(m.get(), prompt, 32, p);
            CHECK(tree.tokens == want);
            if (self) CHECK(tree.stats.n_steps < 32);
            MESSAGE(std::string(self ? "self" : "random")
                    << " draft, tree of 12: " << tree.stats.n_tokens << " tokens in "
                    << tree.stats.n_steps << " target decodes, " << tree.stats.n_accepted << " of "
                    << tree.stats.n_drafted << " kept");
        }
    }
    std::filesystem::remove(path);
}

TEST_CASE("self-speculation gives plain greedy decoding's tokens, its draft seeing a window "
          "of the text, on the CPU and over offloaded KV on the simulated device" *
          doctest::skip(real_absent())) {
    test::model_ptr m = load(SMOL_MODEL);
    // A prompt four times the window, so the draft's window slides past
    // text it never decoded.
    std::string text;
    for (int i = 0; i < 4; ++i) text += k_prompts[1];
    const auto prompt = tokenize(m.get(), text);
    smol_spec_params p = smol_spec_default_params();
    p.self_window = 24;
    p.draft_max = 6;
    REQUIRE(int(prompt.size()) > 3 * p.self_window);
    const auto want = plain(m.get(), prompt, 24);
    for (const char * device : {static_cast<const char *>(nullptr), "sim"}) {
        const std::string where = device ? device : "cpu";
        CAPTURE(where);
        const spec_run got = speculative(m.get(), prompt, 24, p, device);
        CHECK(got.tokens == want);
        // The code pattern repeats inside the window: most guesses are
        // right, so fewer target passes than tokens.
        CHECK(got.stats.n_accepted > got.stats.n_drafted / 2);
        CHECK(got.stats.n_steps < 24);
        MESSAGE("self-speculation, window "
                << p.self_window << ": " << got.stats.n_tokens << " tokens in " << got.stats.n_steps
                << " target decodes, " << got.stats.n_accepted << " of " << got.stats.n_drafted
                << " kept");
    }
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
    p.sampling.temperature = 0.8f;
    p.sampling.repeat_penalty = 1.1f;
    CHECK(smol_spec_create(c.get(), &p, &s) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(std::string(smol_last_error()).find("repeat_penalty") != std::string::npos);
    p = smol_spec_default_params();
    p.self_window = 1024; // the context holds 1024 tokens
    CHECK(smol_spec_create(c.get(), &p, &s) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(std::string(smol_last_error()).find("self_window 1024") != std::string::npos);
    p.self_window = 16;
    p.draft_model = m.get();
    CHECK(smol_spec_create(c.get(), &p, &s) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(std::string(smol_last_error()).find("give one") != std::string::npos);
    p = smol_spec_default_params();
    p.self_window = -1;
    CHECK(smol_spec_create(c.get(), &p, &s) == SMOL_ERR_INVALID_ARGUMENT);
    {
        // A draft larger than its target: a small model of the real vocabulary
        // as the target, the real one as its draft.
        const auto real = gguf::file::open(SMOL_MODEL);
        rm::options o;
        o.s.name = "tiny";
        o.s.n_embd = 64;
        o.s.n_layer = 1;
        o.s.n_head = 4;
        o.s.n_head_kv = 2;
        o.s.n_ff = 96;
        o.vocab_from = real.get();
        o.type = SMOL_TYPE_Q8_0;
        const std::string path =
            (std::filesystem::temp_directory_path() / "smol-test-spec-small.gguf").string();
        rm::write(path, o);
        test::model_ptr small = load(path);
        test::context_ptr sc = context(small.get());
        p = smol_spec_default_params();
        p.draft_model = m.get();
        CHECK(smol_spec_create(sc.get(), &p, &s) == SMOL_ERR_INVALID_ARGUMENT);
        CHECK(s == nullptr);
        CHECK(std::string(smol_last_error()).find("a draft must be no larger") !=
              std::string::npos);
        std::filesystem::remove(path);
    }
    p = smol_spec_default_params();
    REQUIRE(smol_spec_create(c.get(), &p, &s) == SMOL_OK);
    smol_token out[4];
    int32_t n = 0;
    CHECK(smol_spec_next(s, out, 4, &n) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(std::string(smol_last_error()).find("prompt first") != std::string::npos);
    smol_spec_free(s);
}

// --- sampling: the distribution of the first tokens -------------------------

namespace {

// Q(a, x), the regularised upper incomplete gamma function: a series below
// a + 1, a continued fraction above (Numerical Recipes' gser and gcf).
double gamma_q(double a, double x) {
    if (x <= 0) return 1.0;
    const double front = std::exp(-x + a * std::log(x) - std::lgamma(a));
    if (x < a + 1) {
        double term = 1.0 / a, sum = term;
        for (int n = 1; n < 10000 && term > sum * 1e-16; ++n) {
            term *= x / (a + n);
            sum += term;
        }
        return std::max(0.0, 1.0 - sum * front);
    }
    const double tiny = 1e-300;
    double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
    for (int i = 1; i < 10000; ++i) {
        const double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        if (std::fabs(d) < tiny) d = tiny;
        c = b + an / c;
        if (std::fabs(c) < tiny) c = tiny;
        d = 1 / d;
        const double del = d * c;
        h *= del;
        if (std::fabs(del - 1) < 1e-16) break;
    }
    return front * h;
}

// The distribution sampling with sp draws from after logits l, computed
// here apart from the library: top-k, then top-p and min-p on the softmax,
// then the softmax at the temperature over what is left.
std::vector<double> target_probs(const float * l, int n_vocab, const smol_sampler_params & sp) {
    std::vector<int> ids(static_cast<size_t>(n_vocab));
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [l](int a, int b) { return l[a] > l[b]; });
    size_t n = sp.top_k > 0 ? std::min(size_t(sp.top_k), ids.size()) : ids.size();
    const double top = l[ids[0]];
    std::vector<double> soft(n);
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += soft[i] = std::exp(double(l[ids[i]]) - top);
    for (double & x : soft) x /= sum;
    if (sp.top_p < 1.0f) {
        double cum = 0;
        for (size_t i = 0; i < n; ++i) {
            cum += soft[i];
            if (cum >= sp.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (sp.min_p > 0.0f) {
        size_t keep = 1;
        while (keep < n && soft[keep] >= sp.min_p * soft[0]) ++keep;
        n = keep;
    }
    std::vector<double> p(size_t(n_vocab), 0.0);
    sum = 0;
    for (size_t i = 0; i < n; ++i)
        sum += p[size_t(ids[i])] = std::exp((double(l[ids[i]]) - top) / sp.temperature);
    for (double & x : p) x /= sum;
    return p;
}

test::context_ptr tiny_context(smol_model * m, uint32_t n_seq_max = 1) {
    smol_context_params p = smol_context_default_params();
    p.n_seq_max = n_seq_max;
    p.n_ctx = 64;
    p.n_batch = 16;
    p.n_threads = 1;
    smol_context * c = nullptr;
    REQUIRE(smol_context_create(m, &p, &c) == SMOL_OK);
    return test::context_ptr(c);
}

// Decodes tokens at positions from pos into sequence 0, the last one's
// logits kept; returns them.
const float * feed(smol_context * c, const std::vector<smol_token> & tokens, int32_t pos) {
    smol_batch b = smol_batch_init(int32_t(tokens.size()));
    for (size_t i = 0; i < tokens.size(); ++i)
        smol_batch_add(&b, int32_t(tokens.size()), tokens[i], pos + int32_t(i), 0,
                       i + 1 == tokens.size());
    const smol_status st = smol_decode(c, &b);
    smol_batch_free(&b);
    REQUIRE(st == SMOL_OK);
    return smol_get_logits(c, -1);
}

using triple = std::array<smol_token, 3>;

// The exact probabilities of the first three tokens after the prompt, for
// every triple whose expectation in n_runs draws is at least min_expected:
// each prefix's logits come from a decode of the target, the transform from
// target_probs.
std::map<triple, double> exact_triples(smol_model * m, const std::vector<smol_token> & prompt,
                                       const smol_sampler_params & sp, int n_runs,
                                       double min_expected) {
    test::context_ptr c = tiny_context(m);
    const int n_vocab = 300;
    const int32_t P = int32_t(prompt.size());
    const double floor = min_expected / n_runs;
    std::map<triple, double> cells;
    const std::vector<double> p1 = target_probs(feed(c.get(), prompt, 0), n_vocab, sp);
    for (smol_token a = 0; a < n_vocab; ++a) {
        if (p1[size_t(a)] < floor) continue;
        const std::vector<double> p2 = target_probs(feed(c.get(), {a}, P), n_vocab, sp);
        for (smol_token b = 0; b < n_vocab; ++b) {
            const double pab = p1[size_t(a)] * p2[size_t(b)];
            if (pab < floor) continue;
            const std::vector<double> p3 = target_probs(feed(c.get(), {b}, P + 1), n_vocab, sp);
            for (smol_token t = 0; t < n_vocab; ++t)
                if (pab * p3[size_t(t)] >= floor) cells[{a, b, t}] = pab * p3[size_t(t)];
            smol_kv_seq_rm(c.get(), 0, P + 1, -1);
        }
        smol_kv_seq_rm(c.get(), 0, P, -1);
    }
    return cells;
}

struct fit {
    double chi2 = 0, p_value = 1, tv = 0;
    int df = 0;
};

// Pearson's chi-square of the drawn triples against the exact cells, the
// triples outside them pooled into one more cell; and the total variation
// distance over the same cells.
fit compare(const std::map<triple, double> & cells, const std::vector<triple> & drawn) {
    std::map<triple, int> count;
    for (const triple & t : drawn) count[t]++;
    const double n = double(drawn.size());
    fit f;
    double rest_p = 1, rest_seen = n;
    for (const auto & cell : cells) {
        const auto it = count.find(cell.first);
        const double seen = it == count.end() ? 0 : it->second;
        const double want = n * cell.second;
        f.chi2 += (seen - want) * (seen - want) / want;
        f.tv += std::fabs(seen - want) / n / 2;
        rest_p -= cell.second;
        rest_seen -= seen;
        ++f.df;
    }
    if (rest_p * n >= 1) {
        f.chi2 += (rest_seen - rest_p * n) * (rest_seen - rest_p * n) / (rest_p * n);
        ++f.df;
    }
    f.tv += std::fabs(rest_seen / n - std::max(0.0, rest_p)) / 2;
    f.df -= 1;
    f.p_value = gamma_q(f.df / 2.0, f.chi2 / 2.0);
    return f;
}

// The first three tokens of plain sampling: one decode a token, the
// sampler's draw after each.
std::vector<triple> plain_triples(smol_model * m, const std::vector<smol_token> & prompt,
                                  const smol_sampler_params & sp, int n_runs, uint32_t seed) {
    test::context_ptr c = tiny_context(m);
    const int32_t P = int32_t(prompt.size());
    const float * first = feed(c.get(), prompt, 0);
    const std::vector<float> l0(first, first + 300);
    std::vector<triple> out;
    for (int r = 0; r < n_runs; ++r) {
        smol_sampler_params rp = sp;
        rp.seed = test::derived_seed(seed, uint32_t(r));
        smol_sampler * s = nullptr;
        REQUIRE(smol_sampler_create(&rp, &s) == SMOL_OK);
        triple t;
        t[0] = smol_sampler_sample(s, l0.data(), 300);
        t[1] = smol_sampler_sample(s, feed(c.get(), {t[0]}, P), 300);
        t[2] = smol_sampler_sample(s, feed(c.get(), {t[1]}, P + 1), 300);
        smol_sampler_free(s);
        smol_kv_seq_rm(c.get(), 0, P, -1);
        out.push_back(t);
    }
    return out;
}

// The first three tokens of speculative sampling, a fresh spec (and seed)
// a run over one target context emptied between runs.
std::vector<triple> spec_triples(smol_model * m, const std::vector<smol_token> & prompt,
                                 smol_spec_params p, int n_runs, uint32_t seed,
                                 smol_spec_stats & total) {
    test::context_ptr c = tiny_context(m, uint32_t(std::max(1, p.tree_budget / 2) + 1));
    std::vector<triple> out;
    total = {};
    for (int r = 0; r < n_runs; ++r) {
        p.sampling.seed = test::derived_seed(seed, uint32_t(r));
        smol_kv_seq_rm(c.get(), -1, 0, -1);
        smol_spec * s = nullptr;
        INFO(smol_last_error());
        REQUIRE(smol_spec_create(c.get(), &p, &s) == SMOL_OK);
        REQUIRE(smol_spec_prompt(s, prompt.data(), int32_t(prompt.size())) == SMOL_OK);
        std::vector<smol_token> got;
        while (got.size() < 3) {
            smol_token buf[8];
            int32_t n = 0;
            REQUIRE(smol_spec_next(s, buf, 8, &n) == SMOL_OK);
            got.insert(got.end(), buf, buf + n);
        }
        const smol_spec_stats st = smol_spec_get_stats(s);
        total.n_steps += st.n_steps;
        total.n_drafted += st.n_drafted;
        total.n_accepted += st.n_accepted;
        total.n_tokens += st.n_tokens;
        smol_spec_free(s);
        out.push_back({got[0], got[1], got[2]});
    }
    return out;
}

} // namespace

TEST_CASE("speculative sampling draws the first tokens from the target's exact distribution, "
          "with a chain or a token tree of guesses") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny::shape shape;
    shape.n_ctx = 64;
    shape.embd_scale = 0.35f; // next-token distributions neither flat nor certain
    test::tiny_file draft(shape, test::derived_seed(seed, 2), "spec-draft.gguf");
    std::mt19937 rng(test::derived_seed(seed, 3));
    std::vector<smol_token> prompt(6);
    for (smol_token & t : prompt) t = smol_token(rng() % 256);

    const int n_runs = 3000;
    // A significance small enough that fresh seeds rarely fail by chance:
    // each of the six tests below rejects a right sampler once in 10^4 runs.
    const double alpha = 1e-4;
    struct setting {
        const char * name;
        float temperature;
        int32_t top_k;
        float top_p;
        float min_p;
        bool use_draft;
        int32_t draft_max;
        int32_t tree_budget;
    };
    const setting settings[] = {
        {"draft model, temperature only", 1.0f, 0, 1.0f, 0.0f, true, 1, 0},
        {"draft model, top-k and top-p", 1.0f, 20, 0.9f, 0.0f, true, 3, 0},
        {"n-gram lookup, min-p", 0.8f, 0, 1.0f, 0.02f, false, 3, 0},
        {"token tree of 8 from the draft model", 1.0f, 0, 1.0f, 0.0f, true, 1, 8},
    };
    auto sampler_of = [](const setting & st) {
        smol_sampler_params sp = smol_sampler_default_params();
        sp.temperature = st.temperature;
        sp.top_k = st.top_k;
        sp.top_p = st.top_p;
        sp.min_p = st.min_p;
        return sp;
    };
    // A target whose distributions give every setting at least ten cells
    // of five expected draws (the test's power); a seed whose model is too
    // certain for that takes the next derived seed's, so seeds replay.
    std::unique_ptr<test::tiny_file> target;
    std::vector<std::map<triple, double>> cells_of(std::size(settings));
    for (uint32_t k = 0;; ++k) {
        REQUIRE(k < 20);
        target.reset(); // its file's name is the next one's
        target = std::make_unique<test::tiny_file>(shape, test::derived_seed(seed, 1 + 10 * k),
                                                   "spec-target.gguf");
        bool enough = true;
        for (size_t i = 0; i < std::size(settings) && enough; ++i) {
            cells_of[i] =
                exact_triples(target->model.get(), prompt, sampler_of(settings[i]), n_runs, 5.0);
            enough = cells_of[i].size() >= 10;
        }
        if (enough) break;
    }
    std::map<std::string, fit> plain_fits;
    for (size_t si = 0; si < std::size(settings); ++si) {
        const setting & st = settings[si];
        INFO(std::string(st.name));
        const smol_sampler_params sp = sampler_of(st);
        const auto & cells = cells_of[si];
        double mass = 0;
        for (const auto & cell : cells) mass += cell.second;
        REQUIRE(cells.size() >= 10);

        // Plain sampling once per sampler setting (the same seeds draw the
        // same tokens).
        const std::string key = std::to_string(sp.temperature) + " " + std::to_string(sp.top_k) +
                                " " + std::to_string(sp.top_p) + " " + std::to_string(sp.min_p);
        if (plain_fits.count(key) == 0)
            plain_fits[key] = compare(cells, plain_triples(target->model.get(), prompt, sp, n_runs,
                                                           test::derived_seed(seed, 4)));
        const fit plain = plain_fits[key];
        smol_spec_params p = smol_spec_default_params();
        p.sampling = sp;
        p.draft_max = st.draft_max;
        p.tree_budget = st.tree_budget;
        p.draft_model = st.use_draft ? draft.model.get() : nullptr;
        p.ngram_min = 1;
        p.draft_n_threads = 1;
        smol_spec_stats stats{};
        const fit spec = compare(cells, spec_triples(target->model.get(), prompt, p, n_runs,
                                                     test::derived_seed(seed, 5), stats));
        MESSAGE(std::string(st.name)
                << ": " << cells.size() << " cells of " << mass << "; plain chi2 " << plain.chi2
                << " df " << plain.df << " p " << plain.p_value << " tv " << plain.tv
                << "; speculative chi2 " << spec.chi2 << " p " << spec.p_value << " tv " << spec.tv
                << "; " << stats.n_accepted << " of " << stats.n_drafted << " guesses kept, "
                << stats.n_tokens << " tokens in " << stats.n_steps << " target decodes");
        CHECK(plain.p_value > alpha);
        CHECK(spec.p_value > alpha);
        // Both paths ran: guesses were made, some kept and some rejected.
        CHECK(stats.n_drafted > n_runs / 4);
        CHECK(stats.n_accepted > 0);
        CHECK(stats.n_accepted < stats.n_drafted);
    }
}

// --- token trees (SpecExec), greedy -----------------------------------------

namespace {

// Plain greedy decoding of n tokens after the prompt, one decode a token.
std::vector<smol_token> tiny_plain(smol_model * m, const std::vector<smol_token> & prompt, int n) {
    test::context_ptr c = tiny_context(m);
    const float * l = feed(c.get(), prompt, 0);
    std::vector<smol_token> out;
    for (int i = 0; i < n; ++i) {
        out.push_back(smol_token(std::max_element(l, l + 300) - l));
        l = feed(c.get(), {out.back()}, int32_t(prompt.size()) + i);
    }
    return out;
}

struct tree_run {
    std::vector<smol_token> tokens;
    smol_spec_stats stats{};
};

tree_run tiny_tree(smol_model * m, smol_model * draft, const std::vector<smol_token> & prompt,
                   int n, int32_t budget, uint32_t n_seq_max) {
    smol_context_params cp = smol_context_default_params();
    cp.n_ctx = 128;
    cp.n_batch = 64;
    cp.n_threads = 1;
    cp.n_seq_max = n_seq_max;
    smol_context * raw = nullptr;
    REQUIRE(smol_context_create(m, &cp, &raw) == SMOL_OK);
    test::context_ptr c(raw);
    smol_spec_params p = smol_spec_default_params();
    p.draft_model = draft;
    p.tree_budget = budget;
    p.draft_n_threads = 1;
    smol_spec * s = nullptr;
    INFO(std::string(smol_last_error()));
    REQUIRE(smol_spec_create(c.get(), &p, &s) == SMOL_OK);
    REQUIRE(smol_spec_prompt(s, prompt.data(), int32_t(prompt.size())) == SMOL_OK);
    tree_run r;
    while (int(r.tokens.size()) < n) {
        smol_token buf[64];
        int32_t got = 0;
        REQUIRE(smol_spec_next(s, buf, std::min(64, n - int(r.tokens.size())), &got) == SMOL_OK);
        REQUIRE(got >= 1);
        r.tokens.insert(r.tokens.end(), buf, buf + got);
        // Only sequence 0 holds cells between steps: the branches left.
        CHECK(smol_kv_seq_len(c.get(), 0) == int32_t(prompt.size() + r.tokens.size()));
        CHECK(smol_kv_seq_len(c.get(), 1) == 0);
    }
    r.stats = smol_spec_get_stats(s);
    smol_spec_free(s);
    return r;
}

} // namespace

TEST_CASE("a token tree gives plain greedy decoding's tokens, bit for bit, and keeps only "
          "the accepted path's cells") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny::shape shape;
    shape.n_ctx = 128;
    shape.embd_scale = 0.35f;
    test::tiny_file target(shape, test::derived_seed(seed, 1), "tree-target.gguf");
    test::tiny_file other(shape, test::derived_seed(seed, 2), "tree-draft.gguf");
    std::mt19937 rng(test::derived_seed(seed, 3));
    for (int trial = 0; trial < 2; ++trial) {
        std::vector<smol_token> prompt(size_t(3 + rng() % 6));
        for (smol_token & t : prompt) t = smol_token(rng() % 256);
        const std::vector<smol_token> want = tiny_plain(target.model.get(), prompt, 40);
        for (smol_model * draft : {target.model.get(), other.model.get()}) {
            const bool self = draft == target.model.get();
            for (int32_t budget : {1, 2, 5, 16, 48}) {
                CAPTURE(trial);
                CAPTURE(self);
                CAPTURE(budget);
                const tree_run got = tiny_tree(target.model.get(), draft, prompt, 40, budget,
                                               uint32_t(std::max(1, budget / 2) + 1));
                CHECK(got.tokens == want);
                CHECK(got.stats.n_tokens == 40);
                if (self && budget >= 5) {
                    // The target as its own draft: its argmax child is
                    // always in the tree, so every step keeps a path.
                    CHECK(got.stats.n_steps < 40 / 2 + 1);
                }
                MESSAGE(std::string(self ? "self" : "other")
                        << " draft, budget " << budget << ": " << got.stats.n_tokens
                        << " tokens in " << got.stats.n_steps << " target decodes, "
                        << got.stats.n_accepted << " of " << got.stats.n_drafted
                        << " tree tokens kept");
            }
        }
    }
}

TEST_CASE("a spec serves one prompt after another, each text what a fresh spec gives") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny::shape shape;
    shape.n_ctx = 128;
    shape.embd_scale = 0.35f;
    test::tiny_file target(shape, test::derived_seed(seed, 1), "reuse-target.gguf");
    test::tiny_file other(shape, test::derived_seed(seed, 2), "reuse-draft.gguf");
    std::mt19937 rng(test::derived_seed(seed, 3));
    std::vector<std::vector<smol_token>> prompts(2);
    for (auto & prompt : prompts) {
        prompt.resize(size_t(3 + rng() % 6));
        for (smol_token & t : prompt) t = smol_token(rng() % 256);
    }
    const int n = 30;
    const std::vector<smol_token> want[] = {tiny_plain(target.model.get(), prompts[0], n),
                                            tiny_plain(target.model.get(), prompts[1], n)};
    struct mode {
        const char * name;
        smol_model * draft;
        int32_t tree, window;
        float temperature;
    };
    for (const mode md :
         {mode{"lookup", nullptr, 0, 0, 0.0f}, mode{"other draft", other.model.get(), 0, 0, 0.0f},
          mode{"own draft, tree of 8", target.model.get(), 8, 0, 0.0f},
          mode{"self-speculation, window 8", nullptr, 0, 8, 0.0f},
          mode{"other draft, sampling", other.model.get(), 0, 0, 1.0f}}) {
        CAPTURE(std::string(md.name));
        smol_context_params cp = smol_context_default_params();
        cp.n_ctx = 128;
        cp.n_batch = 16;
        cp.n_threads = 1;
        cp.n_seq_max = 5;
        smol_context * raw = nullptr;
        REQUIRE(smol_context_create(target.model.get(), &cp, &raw) == SMOL_OK);
        test::context_ptr c(raw);
        smol_spec_params p = smol_spec_default_params();
        p.draft_max = 4;
        p.ngram_min = 1;
        p.draft_model = md.draft;
        p.tree_budget = md.tree;
        p.self_window = md.window;
        p.draft_n_threads = 1;
        p.sampling.temperature = md.temperature;
        p.sampling.seed = seed;
        smol_spec * s = nullptr;
        INFO(std::string(smol_last_error()));
        REQUIRE(smol_spec_create(c.get(), &p, &s) == SMOL_OK);
        // Prompt 0, 1, then 0 again: the third text and its figures are the
        // first's (sampling too: the draws start again from the seed).
        std::vector<smol_token> texts[3];
        smol_spec_stats deltas[3];
        int k = 0;
        for (int which : {0, 1, 0}) {
            CAPTURE(which);
            const auto & prompt = prompts[size_t(which)];
            const smol_spec_stats before = smol_spec_get_stats(s);
            REQUIRE(smol_spec_prompt(s, prompt.data(), int32_t(prompt.size())) == SMOL_OK);
            std::vector<smol_token> & got = texts[k];
            while (int(got.size()) < n) {
                smol_token buf[16];
                int32_t m = 0;
                REQUIRE(smol_spec_next(s, buf, std::min(16, n - int(got.size())), &m) == SMOL_OK);
                got.insert(got.end(), buf, buf + m);
            }
            const smol_spec_stats after = smol_spec_get_stats(s);
            deltas[k] = {after.n_steps - before.n_steps, after.n_drafted - before.n_drafted,
                         after.n_accepted - before.n_accepted, after.n_tokens - before.n_tokens};
            if (md.temperature == 0.0f) CHECK(got == want[which]);
            // Only this text is in the cache: the last's cells left it.
            CHECK(smol_kv_seq_len(c.get(), 0) == int32_t(prompt.size() + got.size()));
            ++k;
        }
        CHECK(texts[2] == texts[0]);
        CHECK(deltas[2].n_steps == deltas[0].n_steps);
        CHECK(deltas[2].n_drafted == deltas[0].n_drafted);
        CHECK(deltas[2].n_accepted == deltas[0].n_accepted);
        // The figures count every text.
        CHECK(smol_spec_get_stats(s).n_tokens ==
              deltas[0].n_tokens + deltas[1].n_tokens + deltas[2].n_tokens);
        smol_spec_free(s);
    }
}

TEST_CASE("a tree budget beyond the batch or the sequences is refused, naming it") {
    tiny::shape shape;
    test::tiny_file target(shape, 1, "tree-refuse.gguf");
    smol_context_params cp = smol_context_default_params();
    cp.n_ctx = 64;
    cp.n_batch = 16;
    cp.n_threads = 1;
    cp.n_seq_max = 4;
    smol_context * raw = nullptr;
    REQUIRE(smol_context_create(target.model.get(), &cp, &raw) == SMOL_OK);
    test::context_ptr c(raw);
    smol_spec_params p = smol_spec_default_params();
    p.draft_model = target.model.get();
    smol_spec * s = nullptr;
    p.tree_budget = 17; // the batch is 16
    CHECK(smol_spec_create(c.get(), &p, &s) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(std::string(smol_last_error()).find("tree_budget 17") != std::string::npos);
    CHECK(std::string(smol_last_error()).find("n_batch 16") != std::string::npos);
    p.tree_budget = 8; // up to 4 branches: 5 sequences
    CHECK(smol_spec_create(c.get(), &p, &s) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(std::string(smol_last_error()).find("n_seq_max >= 5") != std::string::npos);
    p.tree_budget = 6;
    p.draft_model = nullptr;
    CHECK(smol_spec_create(c.get(), &p, &s) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(std::string(smol_last_error()).find("draft_model") != std::string::npos);
    p.draft_model = target.model.get();
    REQUIRE(smol_spec_create(c.get(), &p, &s) == SMOL_OK);
    smol_spec_free(s);
}
