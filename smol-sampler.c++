// smol-sampler.c++ - picks the next token from logits: repetition penalty,
// then greedy, or top-k, top-p and min-p on the plain softmax followed by
// temperature and a draw from a seeded generator (llama.cpp's default order),
// so the same seed gives the same text. A grammar (smol-grammar.h), when
// set, first leaves only the tokens it allows.

#include "smol-sampler.h"

#include "smol-error.h"
#include "smol-grammar.h"
#include "smol-llama.h"
#include "smol.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <vector>

struct smol_sampler {
    smol_sampler_params params;
    std::mt19937_64 rng;
    std::vector<smol_token> history; // the last repeat_last_n accepted tokens
    std::vector<smol::sampler_cand> cands;
    std::vector<float> penalized;
    std::vector<float> weights;
    std::shared_ptr<const smol::grammar_vocab> vocab; // with a grammar
    std::unique_ptr<smol::grammar_matcher> grammar;
    std::vector<uint8_t> allowed;
};

size_t smol::sampler_keep(const smol_sampler_params & p, const float * l, int32_t n_vocab,
                          std::vector<sampler_cand> & c, double * total) {
    c.resize(size_t(n_vocab));
    for (int32_t i = 0; i < n_vocab; ++i) c[size_t(i)] = {i, l[i], 0.0f};
    return sampler_keep_cands(p, c, 0, total);
}

size_t smol::sampler_keep_cands(const smol_sampler_params & p, std::vector<sampler_cand> & c,
                                size_t sorted_k, double * total) {
    auto by_logit = [](const sampler_cand & a, const sampler_cand & b) {
        return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    };
    size_t n = c.size();
    if (sorted_k > 0) {
        n = std::min(n, sorted_k);
    } else if (p.top_k > 0 && size_t(p.top_k) < n) {
        std::partial_sort(c.begin(), c.begin() + p.top_k, c.end(), by_logit);
        n = size_t(p.top_k);
    } else {
        std::sort(c.begin(), c.end(), by_logit);
    }
    // Softmax at temperature 1 decides top-p and min-p.
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += std::exp(double(c[i].logit - c[0].logit));
    for (size_t i = 0; i < n; ++i) c[i].p = float(std::exp(double(c[i].logit - c[0].logit)) / sum);
    if (p.top_p < 1.0f) {
        double cum = 0;
        size_t keep = n;
        for (size_t i = 0; i < n; ++i) {
            cum += c[i].p;
            if (cum >= p.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = std::max<size_t>(1, keep);
    }
    if (p.min_p > 0.0f) {
        const float floor = p.min_p * c[0].p;
        size_t keep = 1;
        while (keep < n && c[keep].p >= floor) ++keep;
        n = keep;
    }
    // Temperature.
    sum = 0;
    for (size_t i = 0; i < n; ++i) {
        c[i].p = float(std::exp(double(c[i].logit - c[0].logit) / p.temperature));
        sum += c[i].p;
    }
    *total = sum;
    return n;
}

namespace {

using smol::uniform01;

bool grammar_allows(smol_sampler * s, smol_token t) {
    const smol::grammar_vocab & v = *s->vocab;
    if (std::find(v.eog.begin(), v.eog.end(), t) != v.eog.end()) return s->grammar->complete();
    const std::string & piece = v.pieces[size_t(t)];
    return !piece.empty() && s->grammar->allows(piece);
}

// With a grammar, most steps need not build the whole mask: what the
// unmasked logits pick is checked first, where that gives exactly what the
// masked logits would. Greedy: the maximum, if allowed, is the masked
// maximum. Top-k: if the k best are all allowed, they are the masked k best
// (first_k is then set). Temperature alone: a draw that the grammar refuses
// is taken out and drawn again (rejection sampling: the masked softmax). -1
// where the mask is needed.
smol_token grammar_first(smol_sampler * s, const float * l, int32_t n_vocab, bool & first_k) {
    const smol_sampler_params & p = s->params;
    first_k = false;
    if (p.temperature <= 0.0f) {
        const smol_token t = smol_token(std::max_element(l, l + n_vocab) - l);
        return grammar_allows(s, t) ? t : -1;
    }
    if (p.top_k > 0 && p.top_k < n_vocab) {
        auto & c = s->cands;
        c.resize(size_t(n_vocab));
        for (int32_t i = 0; i < n_vocab; ++i) c[size_t(i)] = {i, l[i], 0.0f};
        std::partial_sort(c.begin(), c.begin() + p.top_k, c.end(),
                          [](const smol::sampler_cand & a, const smol::sampler_cand & b) {
                              return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
                          });
        for (int32_t i = 0; i < p.top_k; ++i) {
            if (!grammar_allows(s, c[size_t(i)].id)) return -1;
        }
        c.resize(size_t(p.top_k));
        first_k = true;
        return -1;
    }
    if (p.top_p < 1.0f || p.min_p > 0.0f) return -1;
    std::vector<float> & w = s->weights;
    w.resize(size_t(n_vocab));
    const float mx = *std::max_element(l, l + n_vocab);
    double sum = 0;
    for (int32_t i = 0; i < n_vocab; ++i) {
        w[size_t(i)] = float(std::exp(double(l[i] - mx) / p.temperature));
        sum += w[size_t(i)];
    }
    for (int attempt = 0; attempt < 8 && sum > 0; ++attempt) {
        const double r = uniform01(s->rng) * sum;
        double acc = 0;
        int32_t pick = -1;
        for (int32_t i = 0; i < n_vocab; ++i) {
            acc += w[size_t(i)];
            if (r < acc) {
                pick = i;
                break;
            }
        }
        if (pick < 0) break;
        if (grammar_allows(s, pick)) return pick;
        sum -= w[size_t(pick)];
        w[size_t(pick)] = 0.0f;
    }
    return -1;
}

} // namespace

extern "C" {

smol_sampler_params smol_sampler_default_params(void) {
    smol_sampler_params p;
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.seed = 42;
    return p;
}

smol_status smol_sampler_create(const smol_sampler_params * params, smol_sampler ** out) {
    if (!params || !out) {
        smol::set_last_error("smol_sampler_create: params and out must not be NULL");
        return SMOL_ERR_INVALID_ARGUMENT;
    }
    *out = nullptr;
    if (!(params->repeat_penalty > 0.0f) || params->repeat_last_n < 0 || !(params->top_p >= 0.0f) ||
        !(params->min_p >= 0.0f) || std::isnan(params->temperature)) {
        smol::set_last_error("smol_sampler_create: repeat_penalty must be > 0, repeat_last_n, "
                             "top_p and min_p >= 0, temperature a number");
        return SMOL_ERR_INVALID_ARGUMENT;
    }
    smol_sampler * s = new (std::nothrow)
        smol_sampler{*params, std::mt19937_64(params->seed), {}, {}, {}, {}, {}, {}, {}};
    if (!s) {
        smol::set_last_error("smol_sampler_create: out of memory");
        return SMOL_ERR_OUT_OF_MEMORY;
    }
    *out = s;
    return SMOL_OK;
}

void smol_sampler_free(smol_sampler * s) {
    delete s;
}

void smol_sampler_reset(smol_sampler * s) {
    if (!s) return;
    s->history.clear();
    s->rng.seed(s->params.seed);
    if (s->grammar) s->grammar->reset();
}

void smol_sampler_accept(smol_sampler * s, smol_token token) {
    if (!s) return;
    if (s->grammar && token >= 0 && token < s->vocab->n_vocab)
        s->grammar->accept(s->vocab->pieces[size_t(token)]);
    if (s->params.repeat_last_n == 0) return;
    s->history.push_back(token);
    if (s->history.size() > size_t(s->params.repeat_last_n)) s->history.erase(s->history.begin());
}

smol_token smol_sampler_sample(smol_sampler * s, const float * logits, int32_t n_vocab) {
    if (!s || !logits || n_vocab <= 0) return -1;
    const smol_sampler_params & p = s->params;
    const float * l = logits;
    if (p.repeat_penalty != 1.0f && !s->history.empty()) {
        s->penalized.assign(logits, logits + n_vocab);
        for (size_t i = 0; i < s->history.size(); ++i) {
            const smol_token t = s->history[i];
            if (t < 0 || t >= n_vocab) continue;
            // Each distinct token is penalised once.
            if (std::find(s->history.begin(), s->history.begin() + long(i), t) !=
                s->history.begin() + long(i))
                continue;
            float & x = s->penalized[size_t(t)];
            x = x > 0 ? x / p.repeat_penalty : x * p.repeat_penalty;
        }
        l = s->penalized.data();
    }
    const uint8_t * allow = nullptr;
    bool first_k = false;
    if (s->grammar && s->vocab->n_vocab == n_vocab) {
        const smol_token t = grammar_first(s, l, n_vocab, first_k);
        if (t >= 0) return t;
    }
    if (s->grammar && s->vocab->n_vocab == n_vocab && !first_k) {
        s->grammar->mask(*s->vocab, s->allowed);
        allow = s->allowed.data();
        if (std::find(s->allowed.begin(), s->allowed.end(), 1) == s->allowed.end()) {
            // Nothing may follow: end the text if the model can.
            return s->vocab->eog.empty() ? -1 : s->vocab->eog[0];
        }
    }
    if (p.temperature <= 0.0f) {
        // Greedy: the first of equal maxima, as argmax elsewhere.
        if (!allow) return smol_token(std::max_element(l, l + n_vocab) - l);
        int32_t best = -1;
        for (int32_t i = 0; i < n_vocab; ++i) {
            if (allow[i] && (best < 0 || l[i] > l[best])) best = i;
        }
        return best;
    }

    auto & c = s->cands;
    if (!first_k) {
        c.resize(size_t(n_vocab));
        size_t n_c = 0;
        for (int32_t i = 0; i < n_vocab; ++i) {
            if (!allow || allow[i]) c[n_c++] = {i, l[i], 0.0f};
        }
        c.resize(n_c);
    }
    // With first_k: the k best, sorted, all allowed.
    double sum = 0;
    const size_t n = smol::sampler_keep_cands(p, c, first_k ? size_t(p.top_k) : 0, &sum);
    const double r = uniform01(s->rng) * sum;
    double acc = 0;
    for (size_t i = 0; i < n; ++i) {
        acc += c[i].p;
        if (r < acc) return c[i].id;
    }
    return c[n - 1].id;
}

smol_status smol_sampler_set_grammar(smol_sampler * s, const smol_model * model,
                                     const char * gbnf) {
    if (!s || (gbnf && (!model || !model->m))) {
        smol::set_last_error("smol_sampler_set_grammar: sampler and model must not be NULL");
        return SMOL_ERR_INVALID_ARGUMENT;
    }
    return smol::guard([&] {
        if (gbnf) {
            smol::sampler_set_grammar(s, *model->m, gbnf);
        } else {
            s->grammar.reset();
            s->vocab.reset();
        }
    });
}

} // extern "C"

void smol::sampler_set_grammar(smol_sampler * s, const llama_model & m, const char * gbnf) {
    auto g = std::make_shared<const grammar>(parse_gbnf(gbnf));
    auto matcher = std::make_unique<grammar_matcher>(std::move(g));
    s->vocab = model_grammar_vocab(m);
    s->grammar = std::move(matcher);
}
