// smol-spec.h - what speculative decoding shares between the single-sequence
// generator (smol-spec.c++, smol_spec_*) and the serving engine
// (smol-engine.c++): the acceptance rule that checks a chain of guesses
// against the target's logits (greedy, or exact speculative rejection
// sampling over the sampler's transform), the n-gram lookup proposer and the
// check that a draft model shares the target's vocabulary.

#ifndef SMOL_SPEC_H
#define SMOL_SPEC_H

#include "smol-sampler.h"
#include "smol.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace smol {

struct llama_model;

// Checks a chain of guesses against the target and draws from the
// sampler's distribution; one per generator (or per request), seeded so
// that runs replay.
class spec_verifier {
  public:
    spec_verifier() = default;
    // temperature <= 0: greedy; else speculative sampling with top_k,
    // top_p, min_p and seed (repeat_penalty is the caller's to refuse).
    void init(const smol_sampler_params & sampling, int32_t n_vocab);
    bool sampling() const { return sampling_; }

    // rows[i] (i = 0..n) are the target's logits after the guaranteed token
    // and guesses[0, i). Greedy: the guesses that equal the target's argmax
    // are kept and the first mismatch is replaced by it. Sampling: guess i
    // is kept with probability min(1, p(x) / q(x)), q(x) the probability
    // the draft drew it with (q: n rows of n_vocab; NULL: n-gram guesses,
    // certain); the first rejected one is replaced by a draw from the
    // normalised residual max(0, p - q), and when all are kept a further
    // token is drawn from p. Returns the guesses kept; *after gets the
    // token that follows them.
    int32_t accept(const float * const * rows, const smol_token * guesses, int32_t n,
                   const double * q, smol_token * after);

    // The distribution sampling draws from after logits l, dense (n_vocab).
    void probs(const float * l, double * out);
    // A token drawn with probability w[t] / (the sum of w), w >= 0.
    smol_token draw(const double * w);
    // The greedy or sampled choice after logits l (a draft's guess).
    smol_token pick(const float * l);
    std::mt19937_64 & rng() { return rng_; }

  private:
    smol_sampler_params sp_{};
    bool sampling_ = false;
    int32_t n_vocab_ = 0;
    std::mt19937_64 rng_;
    std::vector<sampler_cand> cands_;
    std::vector<double> p_;
};

// Greedy verification from the target's top tokens alone (SMOL_KEEP_TOKEN):
// tops[i] (i = 0..n) follows the guaranteed token and guesses [0, i). The
// guesses equal to their top token are kept up to the first that is not;
// *after gets the top token after those kept. Returns the guesses kept.
int32_t spec_greedy_accept(const smol_token * tops, const smol_token * guesses, int32_t n,
                           smol_token * after);

// Up to k tokens to follow text[0, n), by n-gram lookup: the tokens after
// the latest earlier occurrence of the longest suffix (ngram_max down to
// ngram_min tokens) that occurred before; appended to out.
void spec_lookup(const smol_token * text, int32_t n, int32_t ngram_min, int32_t ngram_max,
                 int32_t k, std::vector<smol_token> & out);

// How many guesses the next pass makes, at most `most`: after a pass that
// kept all of its `guessed`, twice as many (at least as many as `last`);
// after one that rejected a guess, one more than it kept. Verifying guesses
// that are mostly wrong costs a longer pass for nothing, and a run of right
// ones grows back in a few passes. A pass that guessed nothing keeps `last`.
inline int32_t spec_next_length(int32_t last, int32_t guessed, int32_t kept, int32_t most) {
    if (guessed <= 0) return last;
    if (kept >= guessed) return std::min(most, std::max(last, 2 * guessed));
    return std::min(most, kept + 1);
}

// Whether draft may guess for target: throws SMOL_ERR_INVALID_ARGUMENT, the
// message starting with who, naming the first token whose text differs
// between the two vocabularies (or their sizes), or both parameter counts
// when the draft is the larger.
void spec_check_draft(const llama_model & target, const llama_model & draft,
                      const std::string & who);

} // namespace smol

#endif // SMOL_SPEC_H
