// smol-sampler.c++ - picks the next token from logits: repetition penalty,
// then greedy, or top-k, top-p and min-p on the plain softmax followed by
// temperature and a draw from a seeded generator (llama.cpp's default order),
// so the same seed gives the same text. A grammar (smol-grammar.h), when
// set, first leaves only the tokens it allows; what it said about a token
// in a state is remembered for when the matcher is in that state again (the
// inside of a JSON string, say), so a state's checks and its mask are made
// once.

#include "smol-sampler.h"

#include "smol-cpu-kernels.h"
#include "smol-error.h"
#include "smol-grammar.h"
#include "smol-llama.h"
#include "smol.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

// The grammar's answers in the states the matcher has been in, as bits over
// the vocabulary: known (asked), allowed (and the answer); whole once the
// state's mask was built.
struct grammar_memo {
    struct state {
        std::vector<uint64_t> known, allowed;
        bool whole = false;
        int32_t n_allowed = 0; // once whole
    };
    // A bound on memory: past it the states start again from none.
    static constexpr size_t max_states = 256;
    std::unordered_map<std::string, state> states;
    std::string key;
    state * now = nullptr; // the matcher's current state
};

// Calls f(i) for each set bit i < n, in increasing order.
template <typename F> void for_each_bit(const std::vector<uint64_t> & bits, int32_t n, F f) {
    for (size_t w = 0; w < bits.size(); ++w) {
        for (uint64_t x = bits[w]; x != 0; x &= x - 1) {
            const int32_t i = int32_t(w * 64) + std::countr_zero(x);
            if (i >= n) return;
            f(i);
        }
    }
}

} // namespace

struct smol_sampler {
    smol_sampler_params params;
    std::mt19937_64 rng;
    std::vector<smol_token> history; // the last repeat_last_n accepted tokens
    std::vector<smol::sampler_cand> cands;
    std::vector<float> penalized;
    std::vector<float> weights;
    std::shared_ptr<const smol::grammar_vocab> vocab; // with a grammar
    std::unique_ptr<smol::grammar_matcher> grammar;
    grammar_memo memo;
    std::vector<uint8_t> allowed;
};

smol_token smol::argmax(const float * l, int32_t n) {
    return smol_token(cpu::kernels_best().argmax(l, n));
}

namespace {

// The k best are found from the largest logit of each block of the
// vocabulary: at least k logits reach the k-th largest of those, so only the
// blocks that reach it are looked through, and only what reaches it is
// gathered and sorted.
constexpr int32_t best_block = 32;

// The blocks' largest logits (a loop compilers vectorise; x > m ? x : m
// passes a NaN over).
void block_max(const float * l, int32_t n, std::vector<float> & bmax) {
    constexpr int32_t lanes = 8;
    const int32_t nb = (n + best_block - 1) / best_block;
    bmax.resize(size_t(nb));
    for (int32_t b = 0; b < n / best_block; ++b) {
        const float * p = l + b * best_block;
        float m[lanes];
        for (float & x : m) x = -INFINITY;
        for (int32_t r = 0; r < best_block; r += lanes)
            for (int32_t j = 0; j < lanes; ++j) m[j] = p[r + j] > m[j] ? p[r + j] : m[j];
        float mb = m[0];
        for (int32_t j = 1; j < lanes; ++j) mb = m[j] > mb ? m[j] : mb;
        bmax[size_t(b)] = mb;
    }
    if (n % best_block != 0) {
        float mb = -INFINITY;
        for (int32_t i = n / best_block * best_block; i < n; ++i) mb = l[i] > mb ? l[i] : mb;
        bmax[size_t(nb - 1)] = mb;
    }
}

void best_in_blocks(const float * l, int32_t n, const std::vector<float> & bmax, size_t k,
                    std::vector<smol::sampler_cand> & c) {
    k = std::min(k, size_t(std::max(n, 0)));
    c.clear();
    if (k == 0) return;
    float floor = -INFINITY;
    if (bmax.size() >= k) {
        thread_local std::vector<float> sel;
        sel = bmax;
        std::nth_element(sel.begin(), sel.begin() + long(k - 1), sel.end(), std::greater<float>());
        floor = sel[k - 1];
    }
    for (int32_t b = 0; b < int32_t(bmax.size()); ++b) {
        if (!(bmax[size_t(b)] >= floor)) continue;
        for (int32_t i = b * best_block, e = std::min(n, (b + 1) * best_block); i < e; ++i) {
            if (l[i] >= floor) c.push_back({i, l[i], 0.0f});
        }
    }
    k = std::min(k, c.size()); // fewer only where logits are NaN
    std::partial_sort(c.begin(), c.begin() + long(k), c.end(),
                      [](const smol::sampler_cand & a, const smol::sampler_cand & b) {
                          return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
                      });
    c.resize(k);
}

} // namespace

void smol::sampler_best(const float * l, int32_t n, size_t k, std::vector<sampler_cand> & c) {
    thread_local std::vector<float> bmax;
    block_max(l, n, bmax);
    best_in_blocks(l, n, bmax, k, c);
}

namespace {

bool by_logit(const smol::sampler_cand & a, const smol::sampler_cand & b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

float max_logit(const std::vector<smol::sampler_cand> & c, size_t n) {
    float m = -INFINITY;
    for (size_t i = 0; i < n; ++i) m = c[i].logit > m ? c[i].logit : m;
    return m;
}

// Moves the k best candidates (by logit, then id), sorted, to the front.
// Only those within a margin of the best can be among them: they are
// gathered first (widening the margin until k are), and only they sorted.
void sort_best(std::vector<smol::sampler_cand> & c, size_t k) {
    const float mx = max_logit(c, c.size());
    for (float margin = 8.0f;; margin *= 2.0f) {
        const float floor = margin > 1e4f ? -INFINITY : mx - margin;
        const auto mid = std::partition(
            c.begin(), c.end(), [floor](const smol::sampler_cand & x) { return x.logit >= floor; });
        if (size_t(mid - c.begin()) >= k || floor == -INFINITY) {
            std::partial_sort(c.begin(), c.begin() + long(k), mid, by_logit);
            return;
        }
    }
}

// Top-p and min-p over every candidate: they keep a prefix of the sorted
// candidates, which lies among those within a margin of the best unless
// the distribution is flat; those are sorted, widening as needed. p at
// temperature 1 against the sum over all candidates. Returns how many.
size_t cut_all(const smol_sampler_params & p, std::vector<smol::sampler_cand> & c) {
    const size_t n = c.size();
    const float mx = max_logit(c, n);
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += std::exp(double(c[i].logit - mx));
    for (float margin = 16.0f;; margin *= 2.0f) {
        const float floor = margin > 1e4f ? -INFINITY : mx - margin;
        const auto mid = std::partition(
            c.begin(), c.end(), [floor](const smol::sampler_cand & x) { return x.logit >= floor; });
        const size_t m = size_t(mid - c.begin());
        std::sort(c.begin(), mid, by_logit);
        for (size_t i = 0; i < m; ++i) c[i].p = float(std::exp(double(c[i].logit - mx)) / sum);
        // The prefixes each rule keeps, if they end inside the sorted part.
        size_t keep = m;
        bool found = m == n || p.top_p >= 1.0f;
        if (p.top_p < 1.0f) {
            double cum = 0;
            for (size_t i = 0; i < m; ++i) {
                cum += c[i].p;
                if (cum >= p.top_p) {
                    keep = i + 1;
                    found = true;
                    break;
                }
            }
        }
        if (p.min_p > 0.0f) {
            const float least = p.min_p * c[0].p;
            size_t k = 1;
            while (k < keep && c[k].p >= least) ++k;
            // Ending before the sorted part does, min-p decides alone.
            if (k < m) found = true;
            keep = std::min(keep, k);
        }
        if (found) return std::max<size_t>(1, keep);
    }
}

} // namespace

size_t smol::sampler_keep(const smol_sampler_params & p, const float * l, int32_t n_vocab,
                          std::vector<sampler_cand> & c, double * total) {
    if (p.top_k > 0 && p.top_k < n_vocab) {
        sampler_best(l, n_vocab, size_t(p.top_k), c);
        return sampler_keep_cands(p, c, size_t(p.top_k), total);
    }
    if (p.top_p >= 1.0f && p.min_p <= 0.0f) {
        // No cut: every token, weighed by the CPU kernels' vector exp of
        // logit / temperature less the largest.
        thread_local std::vector<float> scaled, w;
        const size_t n = size_t(n_vocab);
        scaled.resize(n);
        w.resize(n);
        const float inv_t = 1.0f / p.temperature;
        for (size_t i = 0; i < n; ++i) scaled[i] = l[i] * inv_t;
        cpu::kernels_best().softmax_exp(w.data(), scaled.data(), scaled[size_t(argmax(l, n_vocab))],
                                        int64_t(n));
        c.resize(n);
        double sum[4] = {0, 0, 0, 0};
        for (size_t i = 0; i < n; ++i) {
            c[i] = {smol_token(i), l[i], w[i]};
            sum[i & 3] += w[i];
        }
        *total = (sum[0] + sum[1]) + (sum[2] + sum[3]);
        return n;
    }
    c.resize(size_t(n_vocab));
    for (int32_t i = 0; i < n_vocab; ++i) c[size_t(i)] = {i, l[i], 0.0f};
    return sampler_keep_cands(p, c, 0, total);
}

size_t smol::sampler_keep_cands(const smol_sampler_params & p, std::vector<sampler_cand> & c,
                                size_t sorted_k, double * total) {
    size_t n = c.size();
    if (sorted_k == 0 && (p.top_k <= 0 || size_t(p.top_k) >= n)) {
        // No top-k: every candidate takes part, in any order.
        if (p.top_p < 1.0f || p.min_p > 0.0f) n = cut_all(p, c);
        const float mx = max_logit(c, n);
        double sum = 0;
        for (size_t i = 0; i < n; ++i) {
            c[i].p = float(std::exp(double(c[i].logit - mx) / p.temperature));
            sum += c[i].p;
        }
        *total = sum;
        return n;
    }
    if (sorted_k > 0) {
        n = std::min(n, sorted_k);
    } else {
        sort_best(c, size_t(p.top_k));
        n = size_t(p.top_k);
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

// Finds (or makes) the memo of the matcher's current state; once entered,
// the state holds until the grammar moves (accept, reset).
grammar_memo::state & memo_enter(smol_sampler * s) {
    grammar_memo & m = s->memo;
    if (m.now) return *m.now;
    s->grammar->state_key(m.key);
    auto it = m.states.find(m.key);
    if (it == m.states.end()) {
        if (m.states.size() >= grammar_memo::max_states) m.states.clear();
        const size_t words = (size_t(s->vocab->n_vocab) + 63) / 64;
        grammar_memo::state st;
        st.known.assign(words, 0);
        st.allowed.assign(words, 0);
        it = m.states.emplace(m.key, std::move(st)).first;
    }
    m.now = &it->second;
    return it->second;
}

bool grammar_allows(smol_sampler * s, smol_token t) {
    grammar_memo::state & st = *s->memo.now;
    const size_t w = size_t(t) >> 6;
    const uint64_t b = uint64_t(1) << (uint32_t(t) & 63);
    if (st.known[w] & b) return st.allowed[w] & b;
    const bool ok = s->grammar->allows_token(*s->vocab, t);
    st.known[w] |= b;
    if (ok) st.allowed[w] |= b;
    return ok;
}

// The state's whole mask, built once.
const std::vector<uint64_t> & memo_mask(smol_sampler * s) {
    grammar_memo::state & st = *s->memo.now;
    if (!st.whole) {
        s->grammar->mask(*s->vocab, s->allowed);
        const uint8_t * a = s->allowed.data();
        const size_t n = s->allowed.size();
        for (size_t w = 0; w < st.allowed.size(); ++w) {
            uint64_t x = 0;
            for (size_t j = 0, e = std::min<size_t>(64, n - w * 64); j < e; ++j)
                x |= uint64_t(a[w * 64 + j] != 0) << j;
            st.allowed[w] = x;
        }
        std::fill(st.known.begin(), st.known.end(), ~uint64_t(0));
        st.n_allowed = 0;
        for (uint64_t w : st.allowed) st.n_allowed += std::popcount(w);
        st.whole = true;
    }
    return st.allowed;
}

// The first want tokens the grammar allows in the order of the logits (by
// logit, then id) into s->cands, looked for among the best few (at least
// 64, four times want; sorting those costs about what sorting want does);
// false if fewer are there.
bool grammar_best(smol_sampler * s, const float * l, int32_t n_vocab, size_t want) {
    auto & c = s->cands;
    const size_t span = std::min(size_t(n_vocab), std::max<size_t>(64, 4 * want));
    smol::sampler_best(l, n_vocab, span, c);
    size_t kept = 0;
    for (size_t i = 0; i < c.size() && kept < want; ++i) {
        if (grammar_allows(s, c[i].id)) c[kept++] = c[i];
    }
    if (kept < want) return false;
    c.resize(want);
    return true;
}

// With a grammar, most steps need not build the whole mask: what the
// unmasked logits pick is checked first, where that gives exactly what the
// masked logits would. Greedy: the maximum, if allowed, is the masked
// maximum, else the best allowed one among the next few. Top-k: the first k
// allowed tokens in the logits' order, if they are among the best few, are
// the masked k best (first_k is then set). Temperature alone: a draw that
// the grammar refuses is taken out and drawn again (rejection sampling: the
// masked softmax). -1 where the mask is needed, and at once where the
// state's whole mask (made ahead by smol_sampler_prepare, or before) leaves
// few tokens: drawing from it gives the same token without the search.
// Rejection sampling keeps its own draws, whose generator use would change.
smol_token grammar_first(smol_sampler * s, const float * l, int32_t n_vocab, bool & first_k) {
    const smol_sampler_params & p = s->params;
    first_k = false;
    const grammar_memo::state & st = *s->memo.now;
    const bool few = st.whole && st.n_allowed <= n_vocab / 16;
    if (p.temperature <= 0.0f) {
        if (few) return -1;
        const smol_token t = smol::argmax(l, n_vocab);
        if (grammar_allows(s, t)) return t;
        return grammar_best(s, l, n_vocab, 1) ? s->cands[0].id : -1;
    }
    if (p.top_k > 0 && p.top_k < n_vocab) {
        if (!few) first_k = grammar_best(s, l, n_vocab, size_t(p.top_k));
        return -1;
    }
    if (p.top_p < 1.0f || p.min_p > 0.0f) return -1;
    // The weights as the plain draw weighs them: the CPU kernels' vector exp
    // of logit / temperature less the largest.
    std::vector<float> & w = s->weights;
    thread_local std::vector<float> scaled;
    const size_t n = size_t(n_vocab);
    w.resize(n);
    scaled.resize(n);
    const float inv_t = 1.0f / p.temperature;
    for (size_t i = 0; i < n; ++i) scaled[i] = l[i] * inv_t;
    smol::cpu::kernels_best().softmax_exp(w.data(), scaled.data(),
                                          scaled[size_t(smol::argmax(l, n_vocab))], int64_t(n));
    double sums[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < n; ++i) sums[i & 3] += w[i];
    double sum = (sums[0] + sums[1]) + (sums[2] + sums[3]);
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
        smol_sampler{*params, std::mt19937_64(params->seed), {}, {}, {}, {}, {}, {}, {}, {}};
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
    s->memo.now = nullptr;
}

void smol_sampler_accept(smol_sampler * s, smol_token token) {
    if (!s) return;
    if (s->grammar && token >= 0 && token < s->vocab->n_vocab) {
        s->grammar->accept(s->vocab->pieces[size_t(token)]);
        s->memo.now = nullptr;
    }
    if (s->params.repeat_last_n == 0) return;
    s->history.push_back(token);
    if (s->history.size() > size_t(s->params.repeat_last_n)) s->history.erase(s->history.begin());
}

bool smol_sampler_is_greedy(const smol_sampler * s) {
    if (!s) return false;
    const smol_sampler_params & p = s->params;
    return p.temperature <= 0.0f && (p.repeat_penalty == 1.0f || p.repeat_last_n == 0) &&
           !s->grammar;
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
    const std::vector<uint64_t> * allow = nullptr;
    bool first_k = false;
    if (s->grammar && s->vocab->n_vocab == n_vocab) {
        memo_enter(s);
        const smol_token t = grammar_first(s, l, n_vocab, first_k);
        if (t >= 0) return t;
        if (!first_k) {
            allow = &memo_mask(s);
            if (std::all_of(allow->begin(), allow->end(), [](uint64_t w) { return w == 0; })) {
                // Nothing may follow: end the text if the model can.
                return s->vocab->eog.empty() ? -1 : s->vocab->eog[0];
            }
        }
    }
    if (p.temperature <= 0.0f) {
        // Greedy: the first of equal maxima, as argmax elsewhere.
        if (!allow) return smol::argmax(l, n_vocab);
        int32_t best = -1;
        for_each_bit(*allow, n_vocab, [&](int32_t i) {
            if (best < 0 || l[i] > l[best]) best = i;
        });
        return best;
    }

    auto & c = s->cands;
    double sum = 0;
    size_t n;
    if (first_k) {
        // The k best, sorted, all allowed.
        n = smol::sampler_keep_cands(p, c, size_t(p.top_k), &sum);
    } else if (!allow) {
        n = smol::sampler_keep(p, l, n_vocab, c, &sum);
    } else {
        c.clear();
        for_each_bit(*allow, n_vocab, [&](int32_t i) { c.push_back({i, l[i], 0.0f}); });
        n = smol::sampler_keep_cands(p, c, 0, &sum);
    }
    const double r = uniform01(s->rng) * sum;
    double acc = 0;
    for (size_t i = 0; i < n; ++i) {
        acc += c[i].p;
        if (r < acc) return c[i].id;
    }
    return c[n - 1].id;
}

void smol_sampler_prepare(smol_sampler * s) {
    if (!s || !s->grammar) return;
    try {
        memo_enter(s);
        memo_mask(s);
    } catch (...) {
        // Out of memory, say: the draw does the work again and meets it.
        s->memo.now = nullptr;
    }
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
            s->memo = {};
        }
    });
}

} // extern "C"

void smol::sampler_set_grammar(smol_sampler * s, const llama_model & m, const char * gbnf) {
    auto g = std::make_shared<const grammar>(parse_gbnf(gbnf));
    auto matcher = std::make_unique<grammar_matcher>(std::move(g));
    s->vocab = model_grammar_vocab(m);
    s->grammar = std::move(matcher);
    s->memo = {}; // its keys name this grammar's positions
}
