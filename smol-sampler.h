// smol-sampler.h - the sampler's transform of logits into the weights it
// draws from (top-k, then top-p and min-p on the plain softmax, then
// temperature), shared by smol_sampler_sample and speculative sampling so
// that both draw from one distribution.

#ifndef SMOL_SAMPLER_H
#define SMOL_SAMPLER_H

#include "smol.h"

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace smol {

struct sampler_cand {
    smol_token id;
    float logit;
    float p;
};

// The index of the largest of l[0..n), the first of equal maxima.
smol_token argmax(const float * l, int32_t n);

// The k best of l[0..n) (by logit, then id), sorted, into c.
void sampler_best(const float * l, int32_t n, size_t k, std::vector<sampler_cand> & c);

// Keeps the candidates params allow (temperature > 0) and returns how many:
// c[0..n) hold their ids and unnormalised weights p, *sum their total. The
// draw takes c[i] with probability c[i].p / *sum.
size_t sampler_keep(const smol_sampler_params & params, const float * logits, int32_t n_vocab,
                    std::vector<sampler_cand> & c, double * sum);
// The same over candidates already chosen (the tokens a grammar allows),
// their weights unset; with sorted_k > 0 they are the top_k best, sorted.
size_t sampler_keep_cands(const smol_sampler_params & params, std::vector<sampler_cand> & c,
                          size_t sorted_k, double * sum);

// A double in [0, 1) from 53 random bits: portable, unlike
// std::uniform_real_distribution.
inline double uniform01(std::mt19937_64 & rng) {
    return double(rng() >> 11) * 0x1.0p-53;
}

} // namespace smol

#endif // SMOL_SAMPLER_H
