// test-sampler.c++ - the sampler's behaviour: greedy picks the maximum, the
// same seed gives the same draws, each filter keeps what it should, and the
// draw frequencies follow the softmax at the given temperature.

#include "smol-sampler.h"
#include "smol.h"
#include "test-seed.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <doctest/doctest.h>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

namespace {

struct sampler_deleter {
    void operator()(smol_sampler * s) const { smol_sampler_free(s); }
};
using sampler_ptr = std::unique_ptr<smol_sampler, sampler_deleter>;

sampler_ptr make(const smol_sampler_params & p) {
    smol_sampler * s = nullptr;
    REQUIRE(smol_sampler_create(&p, &s) == SMOL_OK);
    return sampler_ptr(s);
}

smol_sampler_params plain(float temp) {
    smol_sampler_params p = smol_sampler_default_params();
    p.temperature = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    return p;
}

std::vector<float> random_logits(std::mt19937 & rng, int n) {
    std::normal_distribution<float> d(0.0f, 2.0f);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto & x : v) x = d(rng);
    return v;
}

} // namespace

TEST_CASE("greedy sampling picks the largest logit") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    auto s = make(plain(0.0f));
    for (int trial = 0; trial < 20; ++trial) {
        const auto l = random_logits(rng, 1000);
        CHECK(smol_sampler_sample(s.get(), l.data(), 1000) ==
              std::max_element(l.begin(), l.end()) - l.begin());
    }
}

TEST_CASE("a sampler is greedy at temperature 0 without a penalty that applies") {
    CHECK(smol_sampler_is_greedy(make(plain(0.0f)).get()));
    CHECK_FALSE(smol_sampler_is_greedy(make(plain(0.7f)).get()));
    smol_sampler_params p = plain(0.0f);
    p.repeat_penalty = 1.1f;
    p.repeat_last_n = 64;
    CHECK_FALSE(smol_sampler_is_greedy(make(p).get()));
    p.repeat_last_n = 0; // a penalty over no tokens
    CHECK(smol_sampler_is_greedy(make(p).get()));
    CHECK_FALSE(smol_sampler_is_greedy(nullptr));
}

TEST_CASE("the same seed gives the same tokens and another seed other tokens") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    const auto l = random_logits(rng, 500);
    auto run = [&](uint64_t sd) {
        smol_sampler_params p = smol_sampler_default_params();
        p.temperature = 1.5f;
        p.top_k = 0;
        p.top_p = 1.0f;
        p.min_p = 0.0f;
        p.seed = sd;
        auto s = make(p);
        std::vector<smol_token> out;
        for (int i = 0; i < 64; ++i) out.push_back(smol_sampler_sample(s.get(), l.data(), 500));
        return out;
    };
    CHECK(run(seed) == run(seed));
    CHECK(run(seed) != run(uint64_t(seed) + 1));
}

TEST_CASE("reset restarts the generator from the seed") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    const auto l = random_logits(rng, 100);
    auto s = make(plain(1.0f));
    std::vector<smol_token> a, b;
    for (int i = 0; i < 16; ++i) a.push_back(smol_sampler_sample(s.get(), l.data(), 100));
    smol_sampler_reset(s.get());
    for (int i = 0; i < 16; ++i) b.push_back(smol_sampler_sample(s.get(), l.data(), 100));
    CHECK(a == b);
}

namespace {

// The sampler's transform the plain way: every candidate sorted by logit
// (then id), top-k, then top-p and min-p on the softmax, then the weights at
// the temperature. Returns the kept ids with their probabilities.
std::map<smol_token, double> keep_reference(const smol_sampler_params & p,
                                            const std::vector<float> & l) {
    std::vector<smol_token> ids(l.size());
    for (size_t i = 0; i < l.size(); ++i) ids[i] = smol_token(i);
    std::sort(ids.begin(), ids.end(), [&l](smol_token a, smol_token b) {
        return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b);
    });
    size_t n = p.top_k > 0 ? std::min(ids.size(), size_t(p.top_k)) : ids.size();
    const double top = l[size_t(ids[0])];
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += std::exp(l[size_t(ids[i])] - top);
    if (p.top_p < 1.0f) {
        double cum = 0;
        for (size_t i = 0; i < n; ++i) {
            cum += std::exp(l[size_t(ids[i])] - top) / sum;
            if (cum >= p.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (p.min_p > 0.0f) {
        size_t keep = 1;
        while (keep < n && std::exp(l[size_t(ids[keep])] - top) / sum >= p.min_p / sum) ++keep;
        n = keep;
    }
    std::map<smol_token, double> out;
    double total = 0;
    for (size_t i = 0; i < n; ++i) total += std::exp((l[size_t(ids[i])] - top) / p.temperature);
    for (size_t i = 0; i < n; ++i)
        out[ids[i]] = std::exp((l[size_t(ids[i])] - top) / p.temperature) / total;
    return out;
}

} // namespace

TEST_CASE("the kept candidates and their weights equal sorting everything") {
    // The sampler sorts only the candidates near the best; peaked, flat and
    // tied logits must keep what sorting all of them keeps.
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    int n_cases = 0, n_cut = 0;
    for (int round = 0; round < 200; ++round) {
        const int n = 1 + int(rng() % 3000);
        const float spread = std::array<float, 4>{0.01f, 1.0f, 5.0f, 40.0f}[rng() % 4];
        std::normal_distribution<float> d(0.0f, spread);
        std::vector<float> l(static_cast<size_t>(n));
        for (float & x : l) x = rng() % 5 == 0 ? std::round(d(rng)) : d(rng); // ties
        smol_sampler_params p = plain(0.5f + float(rng() % 4) * 0.5f);
        p.top_k = std::array<int32_t, 5>{0, 0, 1, 40, 5000}[rng() % 5];
        p.top_p = std::array<float, 4>{1.0f, 1.0f, 0.9f, 0.3f}[rng() % 4];
        p.min_p = std::array<float, 3>{0.0f, 0.05f, 0.5f}[rng() % 3];
        const std::map<smol_token, double> want = keep_reference(p, l);
        std::vector<smol::sampler_cand> c;
        double sum = 0;
        const size_t k = smol::sampler_keep(p, l.data(), n, c, &sum);
        INFO("round ", round, ": n ", n, ", spread ", spread, ", top_k ", p.top_k, ", top_p ",
             p.top_p, ", min_p ", p.min_p);
        REQUIRE(k == want.size());
        for (size_t i = 0; i < k; ++i) {
            const auto it = want.find(c[i].id);
            REQUIRE(it != want.end());
            CHECK(double(c[i].p) / sum == doctest::Approx(it->second).epsilon(1e-5));
        }
        CHECK(smol::argmax(l.data(), n) ==
              smol_token(std::max_element(l.begin(), l.end()) - l.begin()));
        ++n_cases;
        n_cut += int(k) < n;
    }
    MESSAGE(n_cases << " cases, " << n_cut << " of them cut");
}

TEST_CASE("the k best of a vocabulary's logits equal sorting everything") {
    // The k best are looked for only in the blocks of logits whose largest
    // reaches the k-th largest block's; peaked, flat, tied, -inf and NaN
    // logits over vocabularies of many blocks must give what sorting does.
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    for (int round = 0; round < 60; ++round) {
        const int32_t n = 1 + int32_t(rng() % 70000);
        const float spread = std::array<float, 4>{0.01f, 1.0f, 5.0f, 40.0f}[rng() % 4];
        std::normal_distribution<float> d(0.0f, spread);
        std::vector<float> l(static_cast<size_t>(n));
        const uint32_t odd = rng() % 4; // how often a logit is -inf or NaN
        for (float & x : l) {
            x = rng() % 5 == 0 ? std::round(d(rng)) : d(rng);
            if (odd > 0 && rng() % (8 * odd) == 0) x = rng() % 2 ? -INFINITY : NAN;
        }
        const size_t k = std::array<size_t, 5>{1, 40, 160, 1000, 100000}[rng() % 5];
        std::vector<smol_token> ids;
        for (int32_t i = 0; i < n; ++i) {
            if (!std::isnan(l[size_t(i)])) ids.push_back(i);
        }
        std::sort(ids.begin(), ids.end(), [&l](smol_token a, smol_token b) {
            return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b);
        });
        ids.resize(std::min(ids.size(), k));
        std::vector<smol::sampler_cand> c;
        smol::sampler_best(l.data(), n, k, c);
        INFO("round ", round, ": n ", n, ", spread ", spread, ", k ", k, ", odd ", odd);
        REQUIRE(c.size() == ids.size());
        for (size_t i = 0; i < ids.size(); ++i) REQUIRE(c[i].id == ids[i]);
    }
}

TEST_CASE("top-k keeps only the k largest logits") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    const auto l = random_logits(rng, 300);
    smol_sampler_params p = plain(5.0f); // hot, so all k are drawn
    p.top_k = 3;
    auto s = make(p);
    std::vector<float> sorted = l;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    for (int i = 0; i < 300; ++i)
        CHECK(l[size_t(smol_sampler_sample(s.get(), l.data(), 300))] >= sorted[2]);
}

TEST_CASE("top-p keeps the smallest set whose probability reaches p") {
    // Probabilities 0.5, 0.3, 0.2 at temperature 1: top_p 0.7 keeps two.
    const std::vector<float> l = {std::log(0.2f), std::log(0.5f), std::log(0.3f)};
    smol_sampler_params p = plain(1.0f);
    p.top_p = 0.7f;
    auto s = make(p);
    std::map<smol_token, int> seen;
    for (int i = 0; i < 2000; ++i) ++seen[smol_sampler_sample(s.get(), l.data(), 3)];
    CHECK(seen.count(0) == 0);
    CHECK(seen[1] > 0);
    CHECK(seen[2] > 0);
}

TEST_CASE("min-p drops tokens below min_p times the top probability") {
    const std::vector<float> l = {std::log(0.6f), std::log(0.35f), std::log(0.05f)};
    smol_sampler_params p = plain(1.0f);
    p.min_p = 0.1f; // floor 0.06: token 2 goes
    auto s = make(p);
    for (int i = 0; i < 2000; ++i) CHECK(smol_sampler_sample(s.get(), l.data(), 3) != 2);
}

TEST_CASE("draws follow the softmax of the logits divided by the temperature") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    const int n = 8, draws = 40000;
    const auto l = random_logits(rng, n);
    const float temp = 0.7f;
    smol_sampler_params p = plain(temp);
    p.seed = seed;
    auto s = make(p);
    std::vector<int> count(n, 0);
    for (int i = 0; i < draws; ++i) ++count[size_t(smol_sampler_sample(s.get(), l.data(), n))];
    double mx = *std::max_element(l.begin(), l.end()), z = 0;
    for (float x : l) z += std::exp((x - mx) / temp);
    for (int i = 0; i < n; ++i) {
        const double want = std::exp((l[size_t(i)] - mx) / temp) / z;
        // Five standard deviations of a binomial proportion.
        const double sd = std::sqrt(want * (1 - want) / draws);
        CAPTURE(i);
        CHECK(std::fabs(double(count[size_t(i)]) / draws - want) <= 5 * sd + 1e-4);
    }
}

TEST_CASE("the repetition penalty makes recent tokens less likely") {
    const std::vector<float> l = {2.0f, 1.9f, -1.0f};
    smol_sampler_params p = plain(0.0f);
    p.repeat_penalty = 1.5f;
    auto s = make(p);
    CHECK(smol_sampler_sample(s.get(), l.data(), 3) == 0);
    smol_sampler_accept(s.get(), 0); // 2.0 / 1.5 < 1.9
    CHECK(smol_sampler_sample(s.get(), l.data(), 3) == 1);
}

TEST_CASE("invalid sampler parameters are refused") {
    smol_sampler_params p = smol_sampler_default_params();
    p.repeat_penalty = 0.0f;
    smol_sampler * s = nullptr;
    CHECK(smol_sampler_create(&p, &s) == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(s == nullptr);
    CHECK(std::string(smol_last_error()).find("repeat_penalty") != std::string::npos);
}
