// smol-spec.c++ - speculative decoding (smol.h's smol_spec_*): a proposer
// guesses the next tokens (n-gram lookup in the text so far, or a draft
// model), the target decodes the guaranteed token and the guesses in one
// batch, keeps the guesses its own argmax agrees with (greedy) or that pass
// speculative rejection sampling (sampling), and drops the rest from the
// cache. Built on the public API, contexts, batches, logits and
// smol_kv_seq_rm, and on the sampler's transform (smol-sampler.h).

#include "smol-spec.h"

#include "smol-error.h"
#include "smol-llama.h"
#include "smol-sampler.h"
#include "smol.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <queue>
#include <random>
#include <string>
#include <vector>

namespace {

struct context_free {
    void operator()(smol_context * c) const { smol_context_free(c); }
};

} // namespace

// --- shared with the engine (smol-spec.h) ---------------------------------------

void smol::spec_verifier::init(const smol_sampler_params & sampling, int32_t n_vocab) {
    sp_ = sampling;
    sampling_ = sampling.temperature > 0.0f;
    n_vocab_ = n_vocab;
    rng_.seed(sampling.seed);
    if (sampling_) p_.resize(size_t(n_vocab));
}

void smol::spec_verifier::probs(const float * l, double * out) {
    double sum = 0;
    const size_t n = sampler_keep(sp_, l, n_vocab_, cands_, &sum);
    std::fill(out, out + n_vocab_, 0.0);
    for (size_t i = 0; i < n; ++i) out[cands_[i].id] = double(cands_[i].p) / sum;
}

smol_token smol::spec_verifier::draw(const double * w) {
    double sum = 0;
    for (int32_t t = 0; t < n_vocab_; ++t) sum += w[t];
    const double r = uniform01(rng_) * sum;
    double acc = 0;
    smol_token last = -1;
    for (int32_t t = 0; t < n_vocab_; ++t) {
        if (w[t] <= 0) continue;
        acc += w[t];
        last = t;
        if (r < acc) return t;
    }
    return last;
}

namespace {

// The guesses that equal the target's choice after each (top_of(i), the
// choice after the guaranteed token and guesses [0, i)), asked in turn.
template <class TopOf>
int32_t greedy_kept(TopOf top_of, const smol_token * guesses, int32_t n, smol_token * after) {
    int32_t kept = 0;
    smol_token t = top_of(0);
    while (kept < n && guesses[kept] == t) t = top_of(++kept);
    *after = t;
    return kept;
}

} // namespace

int32_t smol::spec_greedy_accept(const smol_token * tops, const smol_token * guesses, int32_t n,
                                 smol_token * after) {
    return greedy_kept([&](int32_t i) { return tops[i]; }, guesses, n, after);
}

smol_token smol::spec_verifier::pick(const float * l) {
    if (!sampling_) return argmax(l, n_vocab_);
    probs(l, p_.data());
    return draw(p_.data());
}

int32_t smol::spec_verifier::accept(const float * const * rows, const smol_token * guesses,
                                    int32_t n, const double * q, smol_token * after) {
    if (!sampling_)
        return greedy_kept([&](int32_t i) { return argmax(rows[i], n_vocab_); }, guesses, n, after);
    for (int32_t i = 0; i < n; ++i) {
        probs(rows[i], p_.data());
        const smol_token x = guesses[i];
        // A draft model's guess was drawn from q; an n-gram's is certain.
        const double * qi = q ? q + size_t(i) * size_t(n_vocab_) : nullptr;
        const double qx = qi ? qi[x] : 1.0;
        // Kept with probability min(1, p(x) / q(x)).
        if (uniform01(rng_) * qx < p_[size_t(x)]) continue;
        double left = 0;
        for (int32_t t = 0; t < n_vocab_; ++t) {
            const double r = p_[size_t(t)] - (qi ? qi[t] : t == x ? 1.0 : 0.0);
            p_[size_t(t)] = r > 0 ? r : 0.0;
            left += p_[size_t(t)];
        }
        // p == q up to rounding leaves no residual: p itself then.
        if (!(left > 0)) probs(rows[i], p_.data());
        *after = draw(p_.data());
        return i;
    }
    probs(rows[n], p_.data());
    *after = draw(p_.data());
    return n;
}

void smol::spec_lookup(const smol_token * h, int32_t n, int32_t ngram_min, int32_t ngram_max,
                       int32_t k, std::vector<smol_token> & out) {
    const size_t k_end = out.size() + size_t(std::max(k, 0));
    for (int32_t len = std::min(ngram_max, n - 1); len >= ngram_min; --len) {
        const smol_token * suffix = h + n - len;
        for (int32_t at = n - len - 1; at >= 0; --at) {
            if (!std::equal(suffix, suffix + len, h + at)) continue;
            for (int32_t i = at + len; i < n && out.size() < k_end; ++i) out.push_back(h[i]);
            return;
        }
    }
}

void smol::spec_check_draft(const llama_model & target, const llama_model & draft,
                            const std::string & who) {
    const int32_t nt = target.hp.n_vocab, nd = draft.hp.n_vocab;
    for (smol_token t = 0; t < std::min(nt, nd); ++t) {
        const std::string a = draft.vocab.token_to_piece(t, true);
        const std::string b = target.vocab.token_to_piece(t, true);
        if (a != b) {
            throw error(SMOL_ERR_INVALID_ARGUMENT,
                        who + ": the draft model's vocabulary differs from the target's at token " +
                            std::to_string(t) + " (\"" + a + "\" against \"" + b +
                            "\"); a draft must share the target's tokenizer");
        }
    }
    if (nd != nt) {
        throw error(SMOL_ERR_INVALID_ARGUMENT, who + ": the draft model has " + std::to_string(nd) +
                                                   " tokens and the target " + std::to_string(nt) +
                                                   "; a draft must share the target's tokenizer");
    }
    if (draft.n_params > target.n_params) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    who + ": the draft model has " + std::to_string(draft.n_params) +
                        " parameters, more than the target's " + std::to_string(target.n_params) +
                        "; a draft must be no larger than the model it guesses for");
    }
}

struct smol_spec {
    smol_context * target = nullptr;
    const smol_model * model = nullptr;
    smol_spec_params params{};
    int32_t n_vocab = 0;
    int32_t n_batch = 0;

    // The text so far; the target's cache holds all of it, and `next` (the
    // target's argmax after it) is the guaranteed next token.
    std::vector<smol_token> history;
    smol_token next = -1;

    std::unique_ptr<smol_context, context_free> draft;
    int32_t draft_past = 0; // history tokens the draft's cache holds
    int32_t draft_cap = 0;  // the draft context's batch: every draft decode is cut to it
    int32_t k_next = 0;     // a chain's guesses in the next pass (spec_next_length)

    smol_batch batch{};
    smol_spec_stats stats{};

    // Sampling: the spec's own generator, the sampler's candidates, the
    // draft's distribution of each guess (draft_max rows of n_vocab) and
    // the target's of one position.
    bool sampling = false;
    smol::spec_verifier verifier;
    // What a decode keeps of the rows a choice reads: greedy choices read
    // only the top tokens.
    smol_keep keep() const { return sampling ? SMOL_KEEP_LOGITS : SMOL_KEEP_TOKEN; }
    std::vector<double> q, p;

    // A token tree (SpecExec): node 0 is next, the root; a node's draft
    // sequence holds the text and its path in the draft's cache once the
    // node is expanded, its branch is the target sequence of a leaf below it.
    struct node {
        smol_token token;
        int32_t parent, depth; // depth: tokens after the root
        double logp;           // cumulative draft log-probability
        int32_t n_children = 0;
        smol_seq_id draft_seq = -1;
        int32_t at = -1; // its row in the verify batch
        // Sampling: the draws from the draft below it, in order, and the
        // row of q they were drawn from.
        std::vector<smol_token> draws;
        int32_t q_row = -1;
        node(smol_token t, int32_t parent_, int32_t depth_, double logp_)
            : token(t), parent(parent_), depth(depth_), logp(logp_) {}
    };
    std::vector<node> tree;
    static constexpr int32_t k_tree_draws = 3; // sampling: most draws below a node
    std::vector<float> soft;                   // the draft's logits
    std::vector<smol_token> order;             // tokens by the draft's logit

    ~smol_spec() { smol_batch_free(&batch); }

    // Decodes tokens at positions from `pos` into ctx, keeping the logits of
    // each when all_logits, else of the last only; or, with keep
    // SMOL_KEEP_TOKEN, only their top tokens (what greedy choices read).
    static void decode(smol_context * ctx, smol_batch & b, int32_t cap, const smol_token * tokens,
                       int32_t n, int32_t pos, bool all_logits, smol_keep keep = SMOL_KEEP_LOGITS) {
        for (int32_t i0 = 0; i0 < n; i0 += cap) {
            b.n_tokens = 0;
            const int32_t i1 = std::min(n, i0 + cap);
            for (int32_t i = i0; i < i1; ++i) {
                const bool kept = all_logits || i == n - 1;
                smol_batch_add(&b, cap, tokens[i], pos + i, 0, kept);
                if (kept) b.logits[b.n_tokens - 1] = int8_t(keep);
            }
            const smol_status st = smol_decode(ctx, &b);
            if (st != SMOL_OK) throw smol::error(st, smol_last_error());
        }
    }

    // Up to k tokens to follow history + next, from the n-gram lookup.
    void lookup(int32_t k, std::vector<smol_token> & out) const {
        std::vector<smol_token> h = history;
        h.push_back(next);
        smol::spec_lookup(h.data(), int32_t(h.size()), params.ngram_min, params.ngram_max, k, out);
    }

    // Up to k tokens from the draft model after history + next: its argmax
    // (greedy) or draws from its distribution, kept in q (sampling).
    void from_draft(int32_t k, std::vector<smol_token> & out) {
        smol_context * d = draft.get();
        if (params.self_window > 0) slide_window();
        // Catch the draft up: the history it lacks, then next.
        std::vector<smol_token> feed(history.begin() + draft_past, history.end());
        feed.push_back(next);
        decode(d, batch, draft_cap, feed.data(), int32_t(feed.size()), draft_past, false, keep());
        draft_past = int32_t(history.size()) + 1;
        for (int32_t i = 0; i < k; ++i) {
            smol_token t = -1;
            if (sampling) {
                double * qi = q.data() + size_t(i) * size_t(n_vocab);
                probs(smol_get_logits(d, -1), qi);
                t = draw(qi);
            } else {
                t = smol_get_top_token(d, -1);
            }
            out.push_back(t);
            if (i + 1 == k) break;
            decode(d, batch, draft_cap, &t, 1, draft_past, false, keep());
            ++draft_past;
        }
    }

    // Self-speculation: the draft keeps the text's first sink positions
    // and the window of self_window that ends at next's position; what
    // slid out of the window leaves its cache (keys keep their positions,
    // so the gap is only unseen text) and the catch-up starts at the
    // window. A long prompt's middle is never decoded by the draft.
    void slide_window() {
        constexpr int32_t sink = SMOL_SPEC_SELF_SINK;
        const int32_t start = int32_t(history.size()) + 1 - params.self_window;
        if (start <= sink) return;
        if (draft_past < sink) {
            decode(draft.get(), batch, draft_cap, history.data() + draft_past, sink - draft_past,
                   draft_past, false);
            draft_past = sink;
        }
        smol_kv_seq_rm(draft.get(), 0, sink, start);
        draft_past = std::max(draft_past, start);
    }

    void probs(const float * l, double * out) { verifier.probs(l, out); }
    smol_token draw(const double * w) { return verifier.draw(w); }

    // Grows the token tree from the draft under tree_budget verify tokens,
    // best first: candidates (a token below a node, with its cumulative
    // log-probability) and unexpanded nodes (keyed by their own, a bound on
    // their children's) share one queue, so the draft decodes a node only
    // when its children could be the likeliest left.
    void grow_tree(int32_t pos, int32_t max_depth) {
        smol_context * d = draft.get();
        std::vector<smol_token> feed(history.begin() + draft_past, history.end());
        feed.push_back(next);
        decode(d, batch, draft_cap, feed.data(), int32_t(feed.size()), draft_past, false);
        draft_past = pos + 1;
        tree.assign(1, node{next, -1, 0, 0.0});
        tree[0].draft_seq = 0;
        struct entry {
            double logp;
            int32_t parent;   // the node below which token would go
            smol_token token; // -1: expand node `parent`
            bool operator<(const entry & o) const { return logp < o.logp; }
        };
        std::priority_queue<entry> queue;
        const int32_t budget = params.tree_budget;
        const int32_t max_leaves = int32_t(smol_context_n_seq_max(target)) - 1;
        int32_t cost = 1, leaves = 0, n_seq = 1;
        auto expand = [&](int32_t n) {
            node & nd = tree[size_t(n)];
            if (n > 0) {
                nd.draft_seq = n_seq++;
                smol_kv_seq_cp(d, tree[size_t(nd.parent)].draft_seq, nd.draft_seq, 0,
                               pos + nd.depth);
                batch.n_tokens = 0;
                smol_batch_add(&batch, n_batch, nd.token, pos + nd.depth, nd.draft_seq, true);
                const smol_status st = smol_decode(d, &batch);
                if (st != SMOL_OK) throw smol::error(st, smol_last_error());
            }
            const float * l = smol_get_logits(d, -1);
            // The budget's best children at most; log-softmax at temperature 1.
            const int32_t m = std::min(budget, n_vocab);
            soft.assign(l, l + n_vocab);
            const float top = *std::max_element(soft.begin(), soft.end());
            double sum = 0;
            for (float x : soft) sum += std::exp(double(x - top));
            std::vector<smol_token> & ids = order;
            ids.resize(size_t(n_vocab));
            for (int32_t t = 0; t < n_vocab; ++t) ids[size_t(t)] = t;
            std::partial_sort(
                ids.begin(), ids.begin() + m, ids.end(),
                [&](smol_token a, smol_token b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
            const double base = tree[size_t(n)].logp - std::log(sum);
            for (int32_t i = 0; i < m; ++i)
                queue.push({base + double(l[ids[size_t(i)]] - top), n, ids[size_t(i)]});
        };
        expand(0);
        while (!queue.empty() && cost < budget) {
            const entry e = queue.top();
            queue.pop();
            if (e.token < 0) {
                if (int32_t(tree.size()) < budget) expand(e.parent);
                continue;
            }
            const node & parent = tree[size_t(e.parent)];
            // Below a leaf (or the bare root) a branch grows by one token;
            // elsewhere a new branch repeats the path from the root.
            const bool extends = parent.n_children == 0;
            const int32_t add = extends ? 1 : parent.depth + 2;
            if (cost + add > budget || parent.depth + 1 > max_depth ||
                (!extends && leaves + 1 > max_leaves))
                continue;
            if (!extends || e.parent == 0) ++leaves;
            cost += add;
            tree[size_t(e.parent)].n_children++;
            tree.push_back(node{e.token, e.parent, parent.depth + 1, e.logp});
            queue.push({e.logp, int32_t(tree.size()) - 1, -1});
        }
        // The draft's cache keeps sequence 0 alone.
        for (smol_seq_id sq = 1; sq < n_seq; ++sq) smol_kv_seq_rm(d, sq, 0, -1);
    }

    // Sampling: grows the tree by draws from the draft. Nodes are expanded
    // best first by their cumulative draft probability; each gets as many
    // draws (up to k_tree_draws) as the budget allows were every draw a new
    // branch, decided before drawing, so that no draw is ever dropped for
    // what it is: the draws below a node stay independent draws from q.
    void grow_tree_sampled(int32_t pos, int32_t max_depth) {
        smol_context * d = draft.get();
        std::vector<smol_token> feed(history.begin() + draft_past, history.end());
        feed.push_back(next);
        decode(d, batch, draft_cap, feed.data(), int32_t(feed.size()), draft_past, false);
        draft_past = pos + 1;
        tree.assign(1, node{next, -1, 0, 0.0});
        tree[0].draft_seq = 0;
        struct entry {
            double logp;
            int32_t n;
            bool operator<(const entry & o) const { return logp < o.logp; }
        };
        std::priority_queue<entry> queue;
        queue.push({0.0, 0});
        const int32_t budget = params.tree_budget;
        const int32_t max_leaves = int32_t(smol_context_n_seq_max(target)) - 1;
        int32_t cost = 1, leaves = 0, n_seq = 1, rows = 0;
        while (!queue.empty() && rows < budget) {
            const int32_t n = queue.top().n;
            queue.pop();
            const int32_t depth = tree[size_t(n)].depth;
            if (depth + 1 > max_depth) continue;
            // The first draw below a childless node extends its branch (one
            // token); any other may start a branch of depth + 2 tokens.
            const bool childless = tree[size_t(n)].n_children == 0;
            int32_t k = 0;
            for (int32_t w = 1; w <= k_tree_draws; ++w) {
                const int32_t worst = (childless ? 1 : depth + 2) + (w - 1) * (depth + 2);
                const int32_t new_leaves = (childless && n > 0 ? 0 : 1) + (w - 1);
                if (cost + worst > budget || leaves + new_leaves > max_leaves) break;
                k = w;
            }
            if (k == 0) continue;
            if (n > 0) {
                node & nd = tree[size_t(n)];
                nd.draft_seq = n_seq++;
                smol_kv_seq_cp(d, tree[size_t(nd.parent)].draft_seq, nd.draft_seq, 0,
                               pos + nd.depth);
                batch.n_tokens = 0;
                smol_batch_add(&batch, n_batch, nd.token, pos + nd.depth, nd.draft_seq, true);
                const smol_status st = smol_decode(d, &batch);
                if (st != SMOL_OK) throw smol::error(st, smol_last_error());
            }
            double * qn = q.data() + size_t(rows) * size_t(n_vocab);
            tree[size_t(n)].q_row = rows++;
            probs(smol_get_logits(d, -1), qn);
            for (int32_t i = 0; i < k; ++i) {
                const smol_token x = draw(qn);
                tree[size_t(n)].draws.push_back(x);
                if (child(n, x) >= 0) continue;
                const bool extends = tree[size_t(n)].n_children == 0;
                if (!extends || n == 0) ++leaves;
                cost += extends ? 1 : depth + 2;
                const double logp = tree[size_t(n)].logp + std::log(qn[x]);
                tree[size_t(n)].n_children++;
                tree.push_back(node{x, n, depth + 1, logp});
                queue.push({logp, int32_t(tree.size()) - 1});
            }
        }
        for (smol_seq_id sq = 1; sq < n_seq; ++sq) smol_kv_seq_rm(d, sq, 0, -1);
    }

    // Verifies the tree in one target decode: a sequence a leaf, holding
    // sequence 0's text and the path from the root; returns the nodes kept
    // (root first) and the target's choice after the last.
    smol_token verify_tree(int32_t pos, std::vector<int32_t> & path) {
        std::vector<int32_t> leaf_of;
        for (int32_t n = 0; n < int32_t(tree.size()); ++n)
            if (tree[size_t(n)].n_children == 0) leaf_of.push_back(n);
        batch.n_tokens = 0;
        std::vector<int32_t> chain;
        for (size_t b = 0; b < leaf_of.size(); ++b) {
            const smol_seq_id sq = smol_seq_id(b + 1);
            smol_kv_seq_cp(target, 0, sq, 0, pos);
            chain.clear();
            for (int32_t n = leaf_of[b]; n >= 0; n = tree[size_t(n)].parent) chain.push_back(n);
            for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
                node & nd = tree[size_t(*it)];
                if (nd.at < 0) nd.at = batch.n_tokens;
                smol_batch_add(&batch, n_batch, nd.token, pos + nd.depth, sq, true);
                // Greedy walks read the target's top tokens alone.
                if (!sampling) batch.logits[batch.n_tokens - 1] = SMOL_KEEP_TOKEN;
            }
        }
        const smol_status st = smol_decode(target, &batch);
        if (st != SMOL_OK) {
            for (size_t b = 0; b < leaf_of.size(); ++b)
                smol_kv_seq_rm(target, smol_seq_id(b + 1), 0, -1);
            throw smol::error(st, smol_last_error());
        }
        path.assign(1, 0);
        const smol_token after = sampling ? walk_sampled(path) : walk_greedy(path);
        // Sequence 0 takes the cells of a branch through the last kept node
        // (the first leaf below it); every branch then leaves.
        int32_t leaf = path.back();
        while (tree[size_t(leaf)].n_children > 0) {
            int32_t c = 1;
            while (tree[size_t(c)].parent != leaf) ++c;
            leaf = c;
        }
        const smol_seq_id kept =
            smol_seq_id(std::find(leaf_of.begin(), leaf_of.end(), leaf) - leaf_of.begin() + 1);
        smol_kv_seq_cp(target, kept, 0, pos, pos + int32_t(path.size()));
        for (size_t b = 0; b < leaf_of.size(); ++b)
            smol_kv_seq_rm(target, smol_seq_id(b + 1), 0, -1);
        return after;
    }

    int32_t child(int32_t n, smol_token t) const {
        for (int32_t c = 1; c < int32_t(tree.size()); ++c)
            if (tree[size_t(c)].parent == n && tree[size_t(c)].token == t) return c;
        return -1;
    }

    // SpecInfer's rule: at each node the draws below it are tried in the
    // order drawn, each kept with probability min(1, p(x) / q(x)) against
    // the target's p, which after a rejection becomes the normalised
    // residual max(0, p - q); when none is kept the next token is drawn
    // from what p has become. The draws being independent draws from q,
    // each try is one step of speculative sampling, and the token follows
    // the target's distribution exactly.
    smol_token walk_sampled(std::vector<int32_t> & path) {
        for (;;) {
            const node & u = tree[size_t(path.back())];
            probs(smol_get_logits(target, u.at), p.data());
            const double * qu =
                u.q_row >= 0 ? q.data() + size_t(u.q_row) * size_t(n_vocab) : nullptr;
            int32_t next_node = -1;
            for (const smol_token x : u.draws) {
                if (smol::uniform01(verifier.rng()) * qu[x] < p[size_t(x)]) {
                    next_node = child(path.back(), x);
                    break;
                }
                double left = 0;
                for (int32_t t = 0; t < n_vocab; ++t) {
                    const double r = p[size_t(t)] - qu[t];
                    p[size_t(t)] = r > 0 ? r : 0.0;
                    left += p[size_t(t)];
                }
                if (!(left > 0)) {
                    probs(smol_get_logits(target, u.at), p.data());
                    continue;
                }
                for (double & v : p) v /= left;
            }
            if (next_node < 0) return draw(p.data());
            path.push_back(next_node);
        }
    }

    // Walks down while a child is the target's argmax.
    smol_token walk_greedy(std::vector<int32_t> & path) {
        smol_token after = smol_get_top_token(target, tree[0].at);
        for (bool found = true; found;) {
            found = false;
            for (int32_t c = 1; c < int32_t(tree.size()); ++c) {
                if (tree[size_t(c)].parent != path.back() || tree[size_t(c)].token != after)
                    continue;
                path.push_back(c);
                after = smol_get_top_token(target, tree[size_t(c)].at);
                found = true;
                break;
            }
        }
        return after;
    }
};

smol_spec_params smol_spec_default_params(void) {
    smol_spec_params p{};
    p.draft_max = 8;
    p.ngram_min = 2;
    p.ngram_max = 4;
    p.draft_model = nullptr;
    p.draft_n_threads = 0;
    p.sampling = smol_sampler_default_params();
    p.sampling.temperature = 0.0f; // greedy
    p.tree_budget = 0;
    p.self_window = 0;
    return p;
}

smol_status smol_spec_create(smol_context * target, const smol_spec_params * params,
                             smol_spec ** out) {
    if (out) *out = nullptr;
    if (!target || !out) {
        smol::set_last_error("smol_spec_create: target and out must not be NULL");
        return SMOL_ERR_INVALID_ARGUMENT;
    }
    return smol::guard([&] {
        auto s = std::make_unique<smol_spec>();
        s->target = target;
        s->model = smol_context_get_model(target);
        s->params = params ? *params : smol_spec_default_params();
        const smol_spec_params & p = s->params;
        smol_model_info info;
        smol_model_get_info(s->model, &info);
        s->n_vocab = info.n_vocab;
        s->n_batch = int32_t(smol_context_n_batch(target));
        if (smol_kv_seq_len(target, 0) != 0) {
            throw smol::error(SMOL_ERR_INVALID_ARGUMENT,
                              "smol_spec_create: the target context already holds tokens of "
                              "sequence 0; start from an empty context");
        }
        if (p.draft_max < 1 || p.draft_max + 1 > s->n_batch) {
            throw smol::error(SMOL_ERR_INVALID_ARGUMENT,
                              "smol_spec: draft_max " + std::to_string(p.draft_max) +
                                  " must be 1.." + std::to_string(s->n_batch - 1) +
                                  " (the target verifies draft_max + 1 tokens in one batch)");
        }
        if (p.ngram_min < 1 || p.ngram_max < p.ngram_min) {
            throw smol::error(SMOL_ERR_INVALID_ARGUMENT,
                              "smol_spec: the n-gram sizes must satisfy 1 <= ngram_min (" +
                                  std::to_string(p.ngram_min) + ") <= ngram_max (" +
                                  std::to_string(p.ngram_max) + ")");
        }
        const smol_sampler_params & sp = p.sampling;
        s->sampling = sp.temperature > 0.0f;
        if (std::isnan(sp.temperature) || !(sp.top_p >= 0.0f) || !(sp.min_p >= 0.0f)) {
            throw smol::error(SMOL_ERR_INVALID_ARGUMENT,
                              "smol_spec: sampling.temperature must be a number, sampling.top_p "
                              "and sampling.min_p >= 0");
        }
        if (s->sampling && sp.repeat_penalty != 1.0f) {
            throw smol::error(SMOL_ERR_INVALID_ARGUMENT,
                              "smol_spec: sampling.repeat_penalty must be 1 (off) for "
                              "speculative sampling; the penalty of a guessed token would depend "
                              "on guesses the target has not accepted yet");
        }
        if (p.tree_budget < 0 || p.tree_budget > s->n_batch || p.tree_budget > 128) {
            throw smol::error(SMOL_ERR_INVALID_ARGUMENT,
                              "smol_spec: tree_budget " + std::to_string(p.tree_budget) +
                                  " must be 0 (no tree) or 1.." +
                                  std::to_string(std::min(s->n_batch, 128)) +
                                  " (the target verifies the tree in one batch of n_batch " +
                                  std::to_string(s->n_batch) + ")");
        }
        if (p.tree_budget > 0) {
            const uint32_t need = uint32_t(std::max(1, p.tree_budget / 2) + 1);
            if (!p.draft_model) {
                throw smol::error(SMOL_ERR_INVALID_ARGUMENT,
                                  "smol_spec: tree_budget needs a draft_model");
            }
            if (smol_context_n_seq_max(target) < need) {
                throw smol::error(SMOL_ERR_INVALID_ARGUMENT,
                                  "smol_spec: tree_budget " + std::to_string(p.tree_budget) +
                                      " verifies up to " + std::to_string(need - 1) +
                                      " branches, one sequence each besides 0: create the "
                                      "target context with n_seq_max >= " +
                                      std::to_string(need) + " (it has " +
                                      std::to_string(smol_context_n_seq_max(target)) + ")");
            }
        }
        if (p.self_window < 0 || (p.self_window > 0 && p.draft_model)) {
            throw smol::error(SMOL_ERR_INVALID_ARGUMENT,
                              p.self_window < 0
                                  ? "smol_spec: self_window must be 0 (off) or a window of tokens"
                                  : "smol_spec: self_window (self-speculation) and draft_model "
                                    "are two proposers; give one");
        }
        const int64_t self_cells =
            int64_t(SMOL_SPEC_SELF_SINK) + int64_t(p.self_window) + int64_t(p.draft_max) + 1;
        if (p.self_window > 0 && self_cells > int64_t(smol_context_n_ctx(target))) {
            throw smol::error(
                SMOL_ERR_INVALID_ARGUMENT,
                "smol_spec: self_window " + std::to_string(p.self_window) +
                    " is too large for the context of " +
                    std::to_string(smol_context_n_ctx(target)) + " tokens: the draft keeps " +
                    std::to_string(SMOL_SPEC_SELF_SINK) + " first tokens, the window and " +
                    std::to_string(p.draft_max) +
                    " guesses; a window smaller than the context is what makes it a draft");
        }
        s->verifier.init(sp, s->n_vocab);
        if (s->sampling) {
            s->p.resize(size_t(s->n_vocab));
            if (p.draft_model || p.self_window > 0)
                s->q.resize(size_t(std::max(p.draft_max, p.tree_budget)) * size_t(s->n_vocab));
        }
        if (p.draft_model) {
            smol::spec_check_draft(*s->model->m, *p.draft_model->m, "smol_spec");
            // On the target's device, as the engine places its draft.
            smol_context_params cp = smol_context_default_params();
            cp.device = target->c->device().name();
            cp.n_ctx = smol_context_n_ctx(target);
            cp.n_batch = uint32_t(s->n_batch);
            cp.n_threads = p.draft_n_threads;
            // A tree gives each expanded node a sequence of the draft's.
            cp.n_seq_max = uint32_t(std::max(1, p.tree_budget));
            smol_context * d = nullptr;
            const smol_status st = smol_context_create(p.draft_model, &cp, &d);
            if (st != SMOL_OK) {
                throw smol::error(st, std::string("smol_spec: the draft's context: ") +
                                          smol_last_error());
            }
            s->draft.reset(d);
        }
        if (p.self_window > 0) {
            // The target's model on the target's device, every head
            // resident: its few cells cost little device memory.
            smol_context_params cp = smol_context_default_params();
            cp.device = target->c->device().name();
            cp.n_ctx = uint32_t(self_cells);
            cp.n_batch = uint32_t(std::min<int64_t>(s->n_batch, self_cells));
            cp.n_threads = p.draft_n_threads ? p.draft_n_threads : target->c->params.n_threads;
            smol_context * d = nullptr;
            const smol_status st = smol_context_create(target->model, &cp, &d);
            if (st != SMOL_OK) {
                throw smol::error(st, std::string("smol_spec: the self-speculation draft's "
                                                  "context: ") +
                                          smol_last_error());
            }
            s->draft.reset(d);
        }
        if (s->draft) s->draft_cap = int32_t(smol_context_n_batch(s->draft.get()));
        s->batch = smol_batch_init(s->n_batch);
        *out = s.release();
    });
}

void smol_spec_free(smol_spec * spec) {
    delete spec;
}

smol_status smol_spec_prompt(smol_spec * s, const smol_token * tokens, int32_t n) {
    if (!s || !tokens || n < 1) {
        smol::set_last_error("smol_spec_prompt: a prompt of at least one token is needed");
        return SMOL_ERR_INVALID_ARGUMENT;
    }
    return smol::guard([&] {
        // A new text: nothing of an earlier one (or of a prompt that failed
        // half-way) stays in either cache, and sampling draws as a new spec's.
        s->history.clear();
        s->next = -1;
        smol_kv_seq_rm(s->target, -1, 0, -1);
        if (s->draft) smol_kv_seq_rm(s->draft.get(), -1, 0, -1);
        s->draft_past = 0;
        s->verifier.init(s->params.sampling, s->n_vocab);
        s->k_next = s->params.draft_max;
        smol_spec::decode(s->target, s->batch, s->n_batch, tokens, n, 0, false, s->keep());
        s->history.assign(tokens, tokens + n);
        s->next = s->sampling ? s->verifier.pick(smol_get_logits(s->target, -1))
                              : smol_get_top_token(s->target, -1);
    });
}

smol_status smol_spec_next(smol_spec * s, smol_token * out, int32_t n_max, int32_t * n_out) {
    if (n_out) *n_out = 0;
    if (!s || !out || n_max < 1 || !n_out) {
        smol::set_last_error("smol_spec_next: spec, out and n_out must be given, n_max >= 1");
        return SMOL_ERR_INVALID_ARGUMENT;
    }
    if (s->history.empty()) {
        smol::set_last_error("smol_spec_next: give the prompt first (smol_spec_prompt)");
        return SMOL_ERR_INVALID_ARGUMENT;
    }
    return smol::guard([&] {
        // The room the context has left bounds the guesses too.
        const int32_t pos = int32_t(s->history.size());
        const int32_t room = int32_t(smol_context_n_ctx(s->target)) - pos - 1;
        if (room < 0) {
            throw smol::error(SMOL_ERR_CONTEXT_FULL, "smol_spec_next: the context is full (" +
                                                         std::to_string(pos) + " tokens)");
        }
        if (s->params.tree_budget > 0) {
            const int32_t max_depth = std::max(0, std::min(n_max - 1, room));
            if (s->sampling) {
                s->grow_tree_sampled(pos, max_depth);
            } else {
                s->grow_tree(pos, max_depth);
            }
            std::vector<int32_t> path;
            s->next = s->verify_tree(pos, path);
            for (size_t i = 0; i < path.size(); ++i) {
                out[i] = s->tree[size_t(path[i])].token;
                s->history.push_back(out[i]);
            }
            *n_out = int32_t(path.size());
            s->stats.n_steps++;
            s->stats.n_drafted += int64_t(s->tree.size()) - 1;
            s->stats.n_accepted += int64_t(path.size()) - 1;
            s->stats.n_tokens += int64_t(path.size());
            return;
        }
        const int32_t k = std::max(0, std::min({s->k_next, n_max - 1, room}));
        std::vector<smol_token> guess;
        if (k > 0) {
            if (s->draft) {
                s->from_draft(k, guess);
            } else {
                s->lookup(k, guess);
            }
        }
        // Verify: next and the guesses in one batch, every logit kept (or,
        // greedy, every top token).
        std::vector<smol_token> tokens{s->next};
        tokens.insert(tokens.end(), guess.begin(), guess.end());
        smol_spec::decode(s->target, s->batch, s->n_batch, tokens.data(), int32_t(tokens.size()),
                          pos, true, s->keep());
        smol_token after = -1;
        // The guesses the target agrees with.
        int32_t kept = 0;
        if (s->sampling) {
            std::vector<const float *> rows(tokens.size());
            for (size_t i = 0; i < rows.size(); ++i)
                rows[i] = smol_get_logits(s->target, int32_t(i));
            kept = s->verifier.accept(rows.data(), guess.data(), int32_t(guess.size()),
                                      s->draft ? s->q.data() : nullptr, &after);
        } else {
            std::vector<smol_token> tops(tokens.size());
            for (size_t i = 0; i < tops.size(); ++i)
                tops[i] = smol_get_top_token(s->target, int32_t(i));
            kept =
                smol::spec_greedy_accept(tops.data(), guess.data(), int32_t(guess.size()), &after);
        }
        // The cache keeps next and the kept guesses; the draft's, what it
        // decoded of them.
        const int32_t n_new = 1 + kept;
        smol_kv_seq_rm(s->target, 0, pos + n_new, -1);
        if (s->draft) {
            smol_kv_seq_rm(s->draft.get(), 0, pos + n_new, -1);
            s->draft_past = std::min(s->draft_past, pos + n_new);
        }
        for (int32_t i = 0; i < n_new; ++i) {
            out[i] = tokens[size_t(i)];
            s->history.push_back(tokens[size_t(i)]);
        }
        s->next = after;
        s->k_next =
            smol::spec_next_length(s->k_next, int32_t(guess.size()), kept, s->params.draft_max);
        *n_out = n_new;
        s->stats.n_steps++;
        s->stats.n_drafted += int64_t(guess.size());
        s->stats.n_accepted += kept;
        s->stats.n_tokens += n_new;
    });
}

smol_spec_stats smol_spec_get_stats(const smol_spec * s) {
    return s ? s->stats : smol_spec_stats{};
}
