// decode-all.h - what the model, offload, split and GPU tests do with a
// context: random token ids, a token list decoded through the public API in
// batches, every token keeping its logits, and a workload of several
// sequences.

#ifndef SMOL_TESTS_DECODE_ALL_H
#define SMOL_TESTS_DECODE_ALL_H

#include "smol.h"

#include <algorithm>
#include <cstdint>
#include <doctest/doctest.h>
#include <random>
#include <vector>

namespace test {

// n ids drawn uniformly from [0, n_vocab).
inline std::vector<int> random_ids(std::mt19937 & rng, int n, int n_vocab) {
    std::uniform_int_distribution<int> d(0, n_vocab - 1);
    std::vector<int> v(static_cast<size_t>(n));
    for (auto & x : v) x = d(rng);
    return v;
}

// ids as sequence 0 at positions 0, 1, ..., in calls of up to `chunk` tokens
// (from single_from on, one token a call): every logit row, in order.
inline std::vector<std::vector<float>> decode_all(smol_context * c, const std::vector<int> & ids,
                                                  int n_vocab, int chunk,
                                                  size_t single_from = SIZE_MAX) {
    std::vector<std::vector<float>> out;
    smol_batch b = smol_batch_init(chunk);
    size_t i0 = 0;
    while (i0 < ids.size()) {
        const size_t n = i0 >= single_from ? 1 : std::min(size_t(chunk), single_from - i0);
        b.n_tokens = 0;
        for (size_t i = i0; i < std::min(ids.size(), i0 + n); ++i)
            smol_batch_add(&b, chunk, ids[i], smol_pos(i), 0, true);
        const smol_status st = smol_decode(c, &b);
        INFO(std::string(smol_last_error()));
        REQUIRE(st == SMOL_OK);
        for (int i = 0; i < b.n_tokens; ++i) {
            const float * l = smol_get_logits(c, i);
            REQUIRE(l != nullptr);
            out.emplace_back(l, l + n_vocab);
        }
        i0 += size_t(b.n_tokens);
    }
    smol_batch_free(&b);
    return out;
}

// A workload of several sequences: prompts (in chunks of the context's
// n_batch), then decode steps that batch one token of every sequence, then
// a few steps of sequence 0 alone. Every logit row, in order.
inline std::vector<float> run_workload(smol_context * c, int n_vocab,
                                       const std::vector<std::vector<int>> & prompts,
                                       const std::vector<int> & steps) {
    std::vector<float> out;
    const int32_t cap = int32_t(smol_context_n_batch(c));
    smol_batch b = smol_batch_init(cap);
    auto keep = [&]() {
        for (int i = 0; i < b.n_tokens; ++i) {
            const float * l = smol_get_logits(c, i);
            REQUIRE(l != nullptr);
            out.insert(out.end(), l, l + n_vocab);
        }
    };
    auto decode = [&]() {
        const smol_status st = smol_decode(c, &b);
        INFO(std::string(smol_last_error()));
        REQUIRE(st == SMOL_OK);
        keep();
        b.n_tokens = 0;
    };
    std::vector<int> len(prompts.size(), 0);
    for (size_t s = 0; s < prompts.size(); ++s) {
        for (int t : prompts[s]) {
            smol_batch_add(&b, cap, t, len[s]++, smol_seq_id(s), true);
            if (b.n_tokens == cap) decode();
        }
        if (b.n_tokens > 0) decode();
    }
    size_t k = 0;
    for (int round = 0; round < 3; ++round) {
        for (size_t s = 0; s < prompts.size(); ++s)
            smol_batch_add(&b, cap, steps[k++ % steps.size()], len[s]++, smol_seq_id(s), true);
        decode();
    }
    for (int round = 0; round < 3; ++round) {
        smol_batch_add(&b, cap, steps[k++ % steps.size()], len[0]++, 0, true);
        decode();
    }
    smol_batch_free(&b);
    return out;
}

} // namespace test

#endif
