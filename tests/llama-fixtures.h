// llama-fixtures.h - a model held to llama.cpp's recorded behaviour on the
// same file (scripts/make-fixtures.py): its logits at the recorded positions
// of logits.json, and its greedy tokens of greedy.json at every step where
// llama.cpp's choice was decisive.

#ifndef SMOL_TESTS_LLAMA_FIXTURES_H
#define SMOL_TESTS_LLAMA_FIXTURES_H

#include "decode-all.h"
#include "smol.h"
#include "test-handles.h"

#include <algorithm>
#include <cmath>
#include <doctest/doctest.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace test {

inline nlohmann::json read_fixture(const std::string & name) {
    const std::string path = std::string(SMOL_FIXTURES) + "/" + name;
    std::ifstream in(path);
    INFO("missing fixture " << path << " (scripts/make-fixtures.py regenerates it)");
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
}

inline context_ptr fixture_context(smol_model * m) {
    smol_context_params p = smol_context_default_params();
    p.n_ctx = 2048;
    p.n_batch = 512;
    p.n_threads = 2;
    smol_context * c = nullptr;
    const smol_status st = smol_context_create(m, &p, &c);
    INFO(std::string(smol_last_error()));
    REQUIRE(st == SMOL_OK);
    return context_ptr(c);
}

// Every recorded top-10 logit within tol of llama.cpp's, and the argmax
// llama.cpp's wherever its top two are more than 2 tol apart. Where the
// fixture records each row's mean, logits are compared less their row's
// mean in each engine: softmax ignores a shift of a whole row, and a model
// whose rows drift as a whole (Gemma 3's do, by up to 2 in either engine
// against float64 math) is judged by what sampling sees. Returns the
// largest difference.
inline double check_logits(smol_model * m, const nlohmann::json & fx, double tol) {
    smol_model_info info;
    smol_model_get_info(m, &info);
    double worst = 0;
    int compared = 0;
    for (const auto & pr : fx["prompts"]) {
        const std::vector<int> ids = pr["ids"].get<std::vector<int>>();
        context_ptr c = fixture_context(m);
        const auto logits = decode_all(c.get(), ids, info.n_vocab, 512);
        for (const auto & at : pr["positions"]) {
            const size_t pos = at["pos"].get<size_t>();
            const auto & row = logits[pos];
            CAPTURE(pr["name"].get<std::string>());
            CAPTURE(pos);
            const auto & top = at["top"];
            const int got_top = int(std::max_element(row.begin(), row.end()) - row.begin());
            if (top[0][1].get<double>() - top[1][1].get<double>() > 2 * tol) {
                CHECK(got_top == top[0][0].get<int>());
            }
            double shift = 0; // smol's row mean less llama.cpp's, when recorded
            if (at.contains("mean")) {
                double mean = 0;
                for (const float x : row) mean += double(x);
                shift = mean / double(row.size()) - at["mean"].get<double>();
            }
            for (const auto & e : top) {
                const double d =
                    std::fabs(double(row[e[0].get<size_t>()]) - shift - e[1].get<double>());
                worst = std::max(worst, d);
                CHECK(d <= tol);
                ++compared;
            }
        }
    }
    CHECK(compared >= 200);
    MESSAGE("largest of " << compared << " logit differences from llama.cpp: " << worst);
    return worst;
}

// Teacher forcing: smol decodes llama.cpp's own 32-token continuation, so one
// coin-toss step cannot derail the rest, and at each step smol's argmax must
// be llama.cpp's token wherever llama.cpp's top two were more than
// decisive_margin apart, whether the continuation is decoded in one batch or
// token by token. Returns the count of decisive steps.
inline int check_greedy(smol_model * m, const nlohmann::json & fx, double decisive_margin) {
    smol_model_info info;
    smol_model_get_info(m, &info);
    int decisive = 0, one_by_one = 0;
    for (const auto & cs : fx["cases"]) {
        CAPTURE(cs["name"].get<std::string>());
        const std::vector<int> ids = cs["prompt_ids"].get<std::vector<int>>();
        const std::vector<int> want = cs["tokens"].get<std::vector<int>>();
        const std::vector<double> margin = cs["top1_margin"].get<std::vector<double>>();
        REQUIRE(want.size() == 32);

        // Teacher forced: the prompt and llama.cpp's tokens in one batch.
        std::vector<int> all = ids;
        all.insert(all.end(), want.begin(), want.end() - 1);
        context_ptr c = fixture_context(m);
        const auto logits = decode_all(c.get(), all, info.n_vocab, 512);
        for (size_t step = 0; step < want.size(); ++step) {
            const auto & row = logits[ids.size() - 1 + step];
            const int got = int(std::max_element(row.begin(), row.end()) - row.begin());
            CAPTURE(step);
            CAPTURE(margin[step]);
            if (margin[step] > decisive_margin) {
                CHECK(got == want[step]);
                ++decisive;
            }
        }

        // Token by token, as a generator runs: the prompt in one batch, then
        // one token a decode (llama.cpp's, so a coin toss cannot derail it).
        context_ptr f = fixture_context(m);
        smol_batch b = smol_batch_init(512);
        for (size_t i0 = 0; i0 < ids.size(); i0 += 512) { // 512 tokens a batch
            b.n_tokens = 0;
            for (size_t i = i0; i < std::min(ids.size(), i0 + 512); ++i)
                smol_batch_add(&b, 512, ids[i], smol_pos(i), 0, i + 1 == ids.size());
            REQUIRE(smol_decode(f.get(), &b) == SMOL_OK);
        }
        for (size_t step = 0; step < want.size(); ++step) {
            const float * l = smol_get_logits(f.get(), -1);
            REQUIRE(l);
            const int t = int(std::max_element(l, l + info.n_vocab) - l);
            CAPTURE(step);
            if (margin[step] > decisive_margin) {
                CHECK(t == want[step]);
                ++one_by_one;
            }
            b.n_tokens = 0;
            smol_batch_add(&b, 512, want[step], smol_pos(ids.size() + step), 0, true);
            REQUIRE(smol_decode(f.get(), &b) == SMOL_OK);
        }
        smol_batch_free(&b);
    }
    CHECK(one_by_one == decisive);
    MESSAGE(decisive << " decisive steps agree with llama.cpp, decoded in one batch and "
                        "token by token");
    return decisive;
}

} // namespace test

#endif // SMOL_TESTS_LLAMA_FIXTURES_H
