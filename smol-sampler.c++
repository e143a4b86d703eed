// smol-sampler.c++ - picks the next token from logits: repetition penalty,
// then greedy, or top-k, top-p and min-p on the plain softmax followed by
// temperature and a draw from a seeded generator (llama.cpp's default order),
// so the same seed gives the same text.

#include "smol-sampler.h"

#include "smol-error.h"
#include "smol.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <new>
#include <random>
#include <vector>

struct smol_sampler {
    smol_sampler_params params;
    std::mt19937_64 rng;
    std::vector<smol_token> history; // the last repeat_last_n accepted tokens
    std::vector<smol::sampler_cand> cands;
    std::vector<float> penalized;
};

size_t smol::sampler_keep(const smol_sampler_params & p, const float * l, int32_t n_vocab,
                          std::vector<sampler_cand> & c, double * total) {
    c.resize(size_t(n_vocab));
    for (int32_t i = 0; i < n_vocab; ++i) c[size_t(i)] = {i, l[i], 0.0f};
    auto by_logit = [](const sampler_cand & a, const sampler_cand & b) {
        return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    };
    size_t n = c.size();
    if (p.top_k > 0 && size_t(p.top_k) < n) {
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
    smol_sampler * s =
        new (std::nothrow) smol_sampler{*params, std::mt19937_64(params->seed), {}, {}, {}};
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
}

void smol_sampler_accept(smol_sampler * s, smol_token token) {
    if (!s || s->params.repeat_last_n == 0) return;
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
    if (p.temperature <= 0.0f) {
        // Greedy: the first of equal maxima, as argmax elsewhere.
        return smol_token(std::max_element(l, l + n_vocab) - l);
    }

    auto & c = s->cands;
    double sum = 0;
    const size_t n = smol::sampler_keep(p, l, n_vocab, c, &sum);
    const double r = smol::uniform01(s->rng) * sum;
    double acc = 0;
    for (size_t i = 0; i < n; ++i) {
        acc += c[i].p;
        if (r < acc) return c[i].id;
    }
    return c[n - 1].id;
}

} // extern "C"
