// smol-engine.c++ - the serving engine (smol-engine.h): the radix tree of
// cached prefixes, the scheduler's step (admission, the mixed batch of
// decode tokens and prefill chunks, eviction and preemption when cells run
// out, sampling and stop rules, speculation: guesses in the batch, their
// acceptance, the rejected ones leaving the caches), the worker thread, and
// the C API.

#include "smol-engine.h"

#include "smol-error.h"
#include "smol-grammar.h"
#include "smol-log.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

namespace smol {

// --- radix tree ---------------------------------------------------------------

radix_tree::radix_tree(int32_t block_size) : block_(block_size) {}

std::vector<radix_tree::node *> radix_tree::match(const smol_token * tokens, int32_t n,
                                                  int32_t max_blocks) {
    std::vector<node *> path;
    node * at = &root_;
    ++clock_;
    std::vector<smol_token> key;
    for (int32_t b = 0; b < max_blocks && (b + 1) * block_ <= n; ++b) {
        key.assign(tokens + size_t(b) * block_, tokens + size_t(b + 1) * block_);
        const auto it = at->children.find(key);
        if (it == at->children.end()) break;
        at = it->second.get();
        use(at);
        path.push_back(at);
    }
    return path;
}

int32_t radix_tree::insert(const smol_token * tokens, const int32_t * cells, int32_t n,
                           std::vector<int32_t> & new_cells) {
    node * at = &root_;
    ++clock_;
    int32_t added = 0;
    for (int32_t b = 0; (b + 1) * block_ <= n; ++b) {
        std::vector<smol_token> key(tokens + size_t(b) * block_, tokens + size_t(b + 1) * block_);
        auto it = at->children.find(key);
        if (it == at->children.end()) {
            auto child = std::make_unique<node>();
            child->key = key;
            child->cells.assign(cells + size_t(b) * block_, cells + size_t(b + 1) * block_);
            child->parent = at;
            new_cells.insert(new_cells.end(), child->cells.begin(), child->cells.end());
            it = at->children.emplace(std::move(key), std::move(child)).first;
            relist(at); // a leaf no more
            ++n_blocks_;
            ++added;
        }
        at = it->second.get();
        use(at);
    }
    return added;
}

void radix_tree::unlist(node * x) {
    if (!x->listed) return;
    leaves_.erase({x->last_use, x});
    x->listed = false;
}

void radix_tree::relist(node * x) {
    unlist(x);
    if (!evictable(x)) return;
    leaves_.emplace(x->last_use, x);
    x->listed = true;
}

void radix_tree::use(node * x) {
    unlist(x);
    x->last_use = clock_;
    relist(x);
}

void radix_tree::acquire(const std::vector<node *> & path) {
    for (node * x : path) {
        ++x->refs;
        unlist(x);
    }
}

void radix_tree::release(const std::vector<node *> & path) {
    for (node * x : path) {
        SMOL_ASSERT_MSG(x->refs > 0, "radix_tree: release without acquire");
        --x->refs;
        relist(x);
    }
}

bool radix_tree::evict(std::vector<int32_t> & freed, bool chain) {
    node * best = chain && chain_ && chain_->listed ? chain_
                  : leaves_.empty()                 ? nullptr
                                                    : leaves_.begin()->second;
    chain_ = nullptr;
    if (!best) return false;
    unlist(best);
    freed.insert(freed.end(), best->cells.begin(), best->cells.end());
    node * parent = best->parent;
    parent->children.erase(best->key);
    if (parent != &root_) {
        chain_ = parent;
        relist(parent); // a leaf now, perhaps
    }
    --n_blocks_;
    return true;
}

// --- engine -------------------------------------------------------------------

namespace {

smol_context_params engine_context_params(const llama_model & model, smol_engine_params p) {
    smol_context_params c = p.context;
    if (c.n_seq_max == 0) c.n_seq_max = 4;
    if (c.n_seq_max > uint32_t(kv_max_seqs - 1)) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "smol_engine_create: " + std::to_string(c.n_seq_max) +
                        " parallel requests asked for; at most " + std::to_string(kv_max_seqs - 1) +
                        " (one sequence of the 64 holds the prefix cache)");
    }
    c.n_seq_max += 1; // the last one is the prefix cache's
    if (c.n_ctx == 0) c.n_ctx = uint32_t(std::min(4096, model.hp.n_ctx_train));
    return c;
}

} // namespace

engine::engine(const llama_model & model, const smol_engine_params & params)
    : model_(model), params_(params), ctx_(model, engine_context_params(model, params)),
      tree_(int32_t(params.prefix_block ? params.prefix_block : 16)) {
    params_.context = ctx_.params;
    if (params.context.embeddings) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "smol_engine_create: a context made for embeddings gives no logits to "
                    "sample from; make the engine's without them");
    }
    if (params_.n_chunk == 0) params_.n_chunk = 256;
    if (params_.n_queue_max == 0) params_.n_queue_max = 256;
    if (params_.prefix_block == 0) params_.prefix_block = 16;
    cache_seq_ = smol_seq_id(ctx_.params.n_seq_max - 1);
    // The cache sequence holds many prompts' positions at once: it keeps no
    // window-store slots of its own (a prefix stays reusable while a
    // request holding it keeps its window; see admit).
    ctx_.win.passive = seq_mask::of(cache_seq_);
    for (smol_seq_id s = cache_seq_ - 1; s >= 0; --s) free_seqs_.push_back(s);
    batch_cap_ = int32_t(ctx_.params.n_batch);
    if (params_.ngram_min == 0) params_.ngram_min = 2;
    if (params_.ngram_max == 0) params_.ngram_max = std::max(4, params_.ngram_min);
    if (params_.draft_max < 0 || params_.draft_max + 1 > batch_cap_) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "smol_engine_create: draft_max " + std::to_string(params_.draft_max) +
                        " must be 0 (no speculation) or 1.." + std::to_string(batch_cap_ - 1) +
                        " (a request verifies draft_max + 1 tokens in one batch of n_batch " +
                        std::to_string(batch_cap_) + ")");
    }
    if (params_.ngram_min < 1 || params_.ngram_max < params_.ngram_min) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "smol_engine_create: the n-gram sizes must satisfy 1 <= ngram_min (" +
                        std::to_string(params_.ngram_min) + ") <= ngram_max (" +
                        std::to_string(params_.ngram_max) + ")");
    }
    if (ctx_.win.on() && params_.draft_max > ctx_.win.reserve) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "smol_engine_create: draft_max " + std::to_string(params_.draft_max) +
                        " guesses could be rolled back past the window_reserve of " +
                        std::to_string(ctx_.win.reserve) +
                        "; give a window_reserve of at least draft_max (--window-reserve)");
    }
    if (params_.draft_model) {
        if (params_.draft_max == 0) {
            throw error(SMOL_ERR_INVALID_ARGUMENT,
                        "smol_engine_create: a draft_model needs draft_max > 0 (the guesses "
                        "it makes per step)");
        }
        const llama_model & dm = *params_.draft_model->m;
        spec_check_draft(model_, dm, "smol_engine_create");
        smol_context_params cp = smol_context_default_params();
        // On the target's (first) device, as smol_spec places its draft.
        cp.device = ctx_.device().name();
        cp.n_ctx = ctx_.params.n_ctx;
        cp.n_batch = ctx_.params.n_batch;
        cp.n_seq_max = uint32_t(cache_seq_); // a sequence per slot, the same ids
        cp.swa_full = params.context.swa_full;
        cp.window_reserve = ctx_.params.window_reserve;
        cp.n_threads = params_.draft_n_threads ? params_.draft_n_threads : ctx_.params.n_threads;
        try {
            draft_ = std::make_unique<llama_context>(dm, cp);
        } catch (const error & e) {
            throw error(e.status,
                        std::string("smol_engine_create: the draft's context: ") + e.what());
        }
    }
    batch_ = smol_batch_init(batch_cap_);
    if (draft_) draft_batch_ = smol_batch_init(batch_cap_);
    if (!batch_.token || (draft_ && !draft_batch_.token)) {
        smol_batch_free(&batch_);
        smol_batch_free(&draft_batch_);
        throw error(SMOL_ERR_OUT_OF_MEMORY, "smol_engine_create: no memory");
    }
    stats_.n_cells = ctx_.kv.n_cells;
    draw_pool_ = std::make_unique<thread_pool>(std::min(8, ctx_.params.n_threads));
    // On the CPU a step takes every core, as does a device's step whose
    // plan attends heads on the host: there the masks wait for the draws.
    bool devices = true; // every stage on a device, none on the CPU's threads
    for (int32_t d = 0; d < ctx_.n_devices(); ++d)
        devices = devices && ctx_.device(d).where() != placement::host;
    prepare_beside_ = devices && draw_pool_->size() > 1 && ctx_.n_host_heads() == 0;
    if (params_.worker_thread) worker_ = std::thread([this] { worker(); });
}

engine::~engine() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    for (auto * list : {&running_}) {
        for (auto & r : *list) smol_sampler_free(r->sampler);
    }
    for (auto & r : queue_) smol_sampler_free(r->sampler);
    for (auto & r : incoming_) smol_sampler_free(r->sampler);
    smol_batch_free(&batch_);
    smol_batch_free(&draft_batch_);
}

smol_request_id engine::submit(const smol_request_params & p) {
    const int32_t n_ctx = int32_t(ctx_.params.n_ctx);
    if (!p.prompt || p.n_prompt <= 0) {
        throw error(SMOL_ERR_INVALID_ARGUMENT, "smol_engine_submit: the prompt is empty");
    }
    for (int32_t i = 0; i < p.n_prompt; ++i) {
        if (p.prompt[i] < 0 || p.prompt[i] >= model_.hp.n_vocab) {
            throw error(SMOL_ERR_INVALID_ARGUMENT, "smol_engine_submit: prompt token " +
                                                       std::to_string(p.prompt[i]) +
                                                       " is outside the vocabulary");
        }
    }
    if (p.n_prompt >= n_ctx) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "smol_engine_submit: the prompt has " + std::to_string(p.n_prompt) +
                        " tokens; the context holds " + std::to_string(n_ctx) +
                        " with room for one generated token");
    }
    const int32_t max_tokens = p.max_tokens > 0 ? p.max_tokens : n_ctx - p.n_prompt;
    if (int64_t(p.n_prompt) + max_tokens > n_ctx) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "smol_engine_submit: max_tokens " + std::to_string(max_tokens) + " with a " +
                        std::to_string(p.n_prompt) + "-token prompt is beyond the context of " +
                        std::to_string(n_ctx) + " tokens");
    }
    auto r = std::make_unique<request>();
    r->tokens.assign(p.prompt, p.prompt + p.n_prompt);
    r->n_prompt = p.n_prompt;
    r->max_tokens = max_tokens;
    if (p.stop_tokens && p.n_stop_tokens > 0)
        r->stop.assign(p.stop_tokens, p.stop_tokens + p.n_stop_tokens);
    r->ignore_eog = p.ignore_eog;
    r->on_event = p.on_event;
    r->user_data = p.user_data;
    // A grammar's mask and a penalty depend on the tokens before a guess,
    // which are guesses too until accepted: such requests do not speculate.
    if (params_.draft_max > 0 && !p.grammar && p.sampler.repeat_penalty == 1.0f &&
        p.draft_max != 0) {
        r->draft_max =
            p.draft_max < 0 ? params_.draft_max : std::min(p.draft_max, params_.draft_max);
        r->k_next = r->draft_max;
        r->verifier.init(p.sampler, model_.hp.n_vocab);
    }
    if (smol_sampler_create(&p.sampler, &r->sampler) != SMOL_OK) {
        throw error(SMOL_ERR_INVALID_ARGUMENT, smol_last_error());
    }
    if (p.grammar) {
        r->grammar = true;
        try {
            sampler_set_grammar(r->sampler, model_, p.grammar);
        } catch (...) {
            smol_sampler_free(r->sampler);
            throw;
        }
    }
    // Greedy, with nothing that reads the logits but the choice (greedy
    // verification of guesses only compares them with the top tokens).
    r->top_only = p.skip_event_logits && smol_sampler_is_greedy(r->sampler);
    std::lock_guard<std::mutex> lock(mu_);
    // Every slot taken and n_queue_max waiting: refuse rather than queue
    // without bound.
    if (n_active_ >= int64_t(cache_seq_) + params_.n_queue_max) {
        smol_sampler_free(r->sampler);
        throw error(SMOL_ERR_BUSY, "smol_engine_submit: " + std::to_string(params_.n_queue_max) +
                                       " requests are waiting already; retry later");
    }
    r->id = next_id_++;
    r->t_submit = std::chrono::steady_clock::now();
    ++n_active_;
    const smol_request_id id = r->id;
    incoming_.push_back(std::move(r));
    cv_.notify_all();
    return id;
}

bool engine::cancel(smol_request_id id) {
    std::lock_guard<std::mutex> lock(mu_);
    if (id <= 0 || id >= next_id_) return false;
    cancels_.push_back(id);
    cv_.notify_all();
    return true;
}

void engine::worker() {
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] {
                return stop_ || !incoming_.empty() || !cancels_.empty() || stats_.n_running > 0 ||
                       stats_.n_queued > 0;
            });
            if (stop_) return;
        }
        try {
            step();
        } catch (const std::exception & e) {
            // Only an allocation can fail here; the requests stay queued.
            log_error(std::string("engine: ") + e.what());
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
    }
}

namespace {

double ms_since(std::chrono::steady_clock::time_point from,
                std::chrono::steady_clock::time_point to) {
    if (to == std::chrono::steady_clock::time_point()) return -1;
    return std::chrono::duration<double, std::milli>(to - from).count();
}

const char * finish_word(smol_finish_reason r) {
    switch (r) {
    case SMOL_FINISH_STOP:
        return "stop";
    case SMOL_FINISH_LENGTH:
        return "length";
    case SMOL_FINISH_CANCELLED:
        return "cancelled";
    case SMOL_FINISH_ERROR:
        return "error";
    case SMOL_FINISH_NONE:
        break;
    }
    return "none";
}

} // namespace

bool engine::emit(request & r, smol_token token, const float * logits, smol_finish_reason reason) {
    if (token >= 0 && r.t_first == std::chrono::steady_clock::time_point())
        r.t_first = std::chrono::steady_clock::now();
    if (!r.on_event) return true;
    smol_engine_event ev{};
    ev.queue_ms = ms_since(r.t_submit, r.t_admit);
    ev.first_token_ms = ms_since(r.t_submit, r.t_first);
    ev.id = r.id;
    ev.token = token;
    ev.logits = logits;
    ev.n_vocab = model_.hp.n_vocab;
    ev.finish = reason;
    ev.n_prompt = r.n_prompt;
    ev.n_cached = r.n_cached;
    ev.n_generated = r.n_generated;
    ev.message = reason == SMOL_FINISH_ERROR ? smol_last_error() : nullptr;
    return r.on_event(&ev, r.user_data);
}

void engine::release_seq(request & r) {
    if (draft_ && r.seq >= 0) draft_->kv.seq_rm(r.seq, 0, -1);
    r.draft_past = 0;
    if (r.seq >= 0) {
        ctx_.kv.seq_rm(r.seq, 0, -1);
        free_seqs_.push_back(r.seq);
        r.seq = -1;
    }
    tree_.release(r.held);
    r.held.clear();
    r.cells.clear();
    r.n_past = 0;
}

// Gives the tree the whole blocks of the first n cached tokens of r; the
// cells of new blocks become the cache sequence's too, so they stay after r.
void engine::cache_prefix(request & r, int32_t n) {
    if (!params_.prefix_cache || r.seq < 0) return;
    scratch_cells_.clear();
    tree_.insert(r.tokens.data(), r.cells.data(), std::min(n, r.n_past), scratch_cells_);
    if (!scratch_cells_.empty())
        ctx_.kv.cells_add_seq(scratch_cells_.data(), int32_t(scratch_cells_.size()), cache_seq_);
}

// The guesses of the requests in rs, r->ng of them at most each, into
// r->guess: n-gram lookup, or the draft model, batched across requests:
// first the text each one's draft sequence lacks (its logits give the first
// guess), then a round per further guess, one token a request. The draft
// shares no cells between requests: one whose tokens do not fit in its
// cache goes without guesses this step (the others keep theirs), and a
// draft decode that fails leaves them all without, their draft sequences
// emptied.
void engine::propose(const std::vector<request *> & rs) {
    if (!draft_) {
        for (request * r : rs) {
            spec_lookup(r->tokens.data(), int32_t(r->tokens.size()), params_.ngram_min,
                        params_.ngram_max, r->ng, r->guess);
        }
        return;
    }
    llama_context & d = *draft_;
    const int32_t n_vocab = model_.hp.n_vocab;
    // A greedy request's guess is the draft's top token: its row keeps that
    // alone.
    auto keep_draft_row = [&](const request & r) {
        if (!r.verifier.sampling())
            draft_batch_.logits[draft_batch_.n_tokens - 1] = SMOL_KEEP_TOKEN;
    };
    // Decodes the draft batch and draws a guess for each request that has a
    // row in it.
    auto flush = [&] {
        if (draft_batch_.n_tokens == 0) return;
        d.decode(draft_batch_);
        for (const auto & rr : draft_rows_) {
            request & r = *rr.first;
            if (r.verifier.sampling()) {
                double * qi = r.q.data() + r.guess.size() * size_t(n_vocab);
                r.verifier.probs(d.logits(rr.second), qi);
                r.guess.push_back(r.verifier.draw(qi));
            } else {
                r.guess.push_back(d.top_token(rr.second));
            }
        }
        draft_rows_.clear();
        draft_batch_.n_tokens = 0;
    };
    try {
        draft_rows_.clear();
        draft_batch_.n_tokens = 0;
        int32_t cells = 0;
        for (request * r : rs) {
            const int32_t n = int32_t(r->tokens.size());
            if (r->draft_past >= n) {
                d.kv.seq_rm(r->seq, n - 1, -1);
                r->draft_past = n - 1;
            }
            const int32_t need = n - r->draft_past + r->ng - 1;
            if (!d.kv.has_free(cells + need)) {
                r->ng = 0;
                continue;
            }
            cells += need;
            if (r->verifier.sampling()) r->q.resize(size_t(r->draft_max) * size_t(n_vocab));
            for (int32_t i = r->draft_past; i < n; ++i) {
                if (draft_batch_.n_tokens == batch_cap_) flush();
                const bool last = i == n - 1;
                if (last) draft_rows_.emplace_back(r, draft_batch_.n_tokens);
                smol_batch_add(&draft_batch_, batch_cap_, r->tokens[size_t(i)], i, r->seq, last);
                if (last) keep_draft_row(*r);
            }
            r->draft_past = n;
        }
        flush();
        for (;;) {
            for (request * r : rs) {
                if (r->guess.empty() || int32_t(r->guess.size()) >= r->ng ||
                    draft_batch_.n_tokens == batch_cap_)
                    continue;
                const int32_t pos = int32_t(r->tokens.size() + r->guess.size()) - 1;
                draft_rows_.emplace_back(r, draft_batch_.n_tokens);
                smol_batch_add(&draft_batch_, batch_cap_, r->guess.back(), pos, r->seq, true);
                keep_draft_row(*r);
                r->draft_past = pos + 1;
            }
            if (draft_batch_.n_tokens == 0) break;
            flush();
        }
    } catch (const std::exception &) {
        for (request * r : rs) {
            d.kv.seq_rm(r->seq, 0, -1);
            r->draft_past = 0;
            r->guess.clear();
        }
        draft_rows_.clear();
    }
}

void engine::finish(request_ptr & r, smol_finish_reason reason, smol_token token,
                    const float * logits) {
    if (reason == SMOL_FINISH_STOP || reason == SMOL_FINISH_LENGTH) cache_prefix(*r, r->n_past);
    release_seq(*r);
    // Counted, and its cells shown free, before its final event: a caller
    // that hears of the end sees it in the figures.
    {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.n_finished;
        --n_active_;
        stats_.n_cells_used = ctx_.kv.n_cells - ctx_.kv.n_free();
        slots_used_ = ctx_.win.on() ? ctx_.win.n_held(ctx_.kv) : 0;
    }
    emit(*r, token, logits, reason);
    // One line a request: its tokens, its times and how it ended.
    const auto now = std::chrono::steady_clock::now();
    const double total = ms_since(r->t_submit, now), first = ms_since(r->t_submit, r->t_first);
    char line[256];
    std::snprintf(line, sizeof line,
                  "engine: request %lld: %d prompt tokens (%d cached), %d generated; queue "
                  "%.1f ms, first token %.1f ms, %.2f ms a token after it, %.1f ms in all; %s",
                  static_cast<long long>(r->id), r->n_prompt, r->n_cached, r->n_generated,
                  ms_since(r->t_submit, r->t_admit), first,
                  r->n_generated > 1 && first >= 0 ? (total - first) / (r->n_generated - 1) : 0.0,
                  total, finish_word(reason));
    log_info(line);
    smol_sampler_free(r->sampler);
    r->sampler = nullptr;
}

void engine::preempt(request & r) {
    release_seq(r);
    r.prompt_cached = false;
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.n_preempted;
}

bool engine::make_room(int32_t cells, int32_t pages) {
    auto evict_one = [&](bool chain) {
        scratch_cells_.clear();
        if (!tree_.evict(scratch_cells_, chain)) return false;
        ctx_.kv.cells_rm_seq(scratch_cells_.data(), int32_t(scratch_cells_.size()), cache_seq_);
        return true;
    };
    while (!ctx_.kv.has_free(cells)) {
        if (!evict_one(false)) return false;
    }
    // A sequence whose page is full takes a wholly free page, else any free
    // cell: tokens scattered among other sequences' pages make every later
    // attention read those pages too. So when cached prefixes hold the
    // pages, evict on (the least recent text from its end, block after
    // block, which empties its pages one by one) until the sequences that
    // start a page have one; a few pages' worth of blocks at most, so that
    // cells held by running requests do not empty the cache for nothing.
    if (pages > 0 && ctx_.kv.n_free_pages() < pages) {
        int32_t budget = 2 * pages * (kv_page / tree_.block_size() + 1);
        while (budget-- > 0 && evict_one(true) && ctx_.kv.n_free_pages() < pages) {
        }
    }
    return true;
}

// The decode tokens of this step that cannot go on in their sequence's page
// (it is full, or its next cell is taken): each takes a page.
int32_t engine::pages_for_decode() const {
    const kv_cache & kv = ctx_.kv;
    int32_t n = 0;
    for (const auto & r : running_) {
        if (int32_t(r->tokens.size()) - r->n_past != 1) continue;
        const int32_t next = r->cells.empty() ? -1 : r->cells.back() + 1;
        n += next <= 0 || next >= kv.n_cells || next % kv_page == 0 ||
             kv.cell_pos[size_t(next)] >= 0;
    }
    return n;
}

void engine::admit() {
    while (!free_seqs_.empty() && !queue_.empty()) {
        request & r = *queue_.front();
        const int32_t n = int32_t(r.tokens.size());
        // Keep at least the last token to compute: its logits give the next.
        std::vector<radix_tree::node *> path;
        if (params_.prefix_cache) {
            path = tree_.match(r.tokens.data(), n, (n - 1) / tree_.block_size());
        }
        // Sliding-window layers go on exactly only from a prefix whose last
        // window they still keep: shorter prefixes, else none (recomputed).
        while (ctx_.win.on() && !path.empty()) {
            scratch_cells_.clear();
            for (const radix_tree::node * x : path)
                scratch_cells_.insert(scratch_cells_.end(), x->cells.begin(), x->cells.end());
            if (ctx_.window_kept(scratch_cells_.data(), int32_t(scratch_cells_.size()))) break;
            path.pop_back();
        }
        const int32_t n_hit = int32_t(path.size()) * tree_.block_size();
        // Admit only what can start: its first chunk must find cells, but
        // running requests are not preempted for a newcomer.
        const int32_t first = std::min<int32_t>(n - n_hit, int32_t(params_.n_chunk));
        tree_.acquire(path); // not evicted to make room for its own chunk
        if (!make_room(first) && !running_.empty()) {
            tree_.release(path);
            break;
        }
        request_ptr owned = std::move(queue_.front());
        queue_.pop_front();
        owned->seq = free_seqs_.back();
        free_seqs_.pop_back();
        owned->admitted = ++admit_clock_;
        if (owned->t_admit == std::chrono::steady_clock::time_point())
            owned->t_admit = std::chrono::steady_clock::now();
        owned->held = std::move(path);
        for (const radix_tree::node * x : owned->held)
            owned->cells.insert(owned->cells.end(), x->cells.begin(), x->cells.end());
        if (n_hit > 0) ctx_.kv.cells_add_seq(owned->cells.data(), n_hit, owned->seq);
        owned->n_past = n_hit;
        const bool fresh = !owned->counted;
        if (fresh) {
            owned->n_cached = n_hit;
            owned->counted = true;
        }
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (fresh) {
                stats_.n_prompt_tokens += owned->n_prompt;
                stats_.n_prefix_hit_tokens += n_hit;
                stats_.n_prefix_hit_requests += n_hit > 0;
            }
        }
        running_.push_back(std::move(owned));
    }
}

int32_t engine::step() {
    using clock = std::chrono::steady_clock;
    std::lock_guard<std::mutex> step_lock(step_mu_);
    const clock::time_point t0 = clock::now();
    take_news();
    admit();
    {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.n_running = int32_t(running_.size());
        stats_.n_queued = int32_t(queue_.size());
    }
    const int32_t n = plan_batch();
    const double t_plan = std::chrono::duration<double>(clock::now() - t0).count();
    const step_times t = n > 0 ? run_batch(n) : step_times{};

    std::lock_guard<std::mutex> lock(mu_);
    stats_.t_plan_s += t_plan;
    stats_.t_decode_s += t.decode;
    stats_.t_draw_s += t.draw;
    stats_.t_emit_s += t.emit;
    stats_.n_running = int32_t(running_.size());
    stats_.n_queued = int32_t(queue_.size());
    stats_.n_cells_used = ctx_.kv.n_cells - ctx_.kv.n_free();
    slots_used_ = ctx_.win.on() ? ctx_.win.n_held(ctx_.kv) : 0;
    stats_.n_prefix_blocks = tree_.n_blocks();
    return stats_.n_running + stats_.n_queued + int32_t(incoming_.size());
}

// Submissions move to the queue; cancelled requests, queued or running, end.
void engine::take_news() {
    std::vector<smol_request_id> cancels;
    {
        std::lock_guard<std::mutex> lock(mu_);
        while (!incoming_.empty()) {
            queue_.push_back(std::move(incoming_.front()));
            incoming_.pop_front();
        }
        cancels.swap(cancels_);
    }
    // Cancellations, queued or running.
    for (smol_request_id id : cancels) {
        for (auto * list : {&queue_}) {
            for (auto it = list->begin(); it != list->end(); ++it) {
                if ((*it)->id == id) {
                    finish(*it, SMOL_FINISH_CANCELLED, -1, nullptr);
                    list->erase(it);
                    break;
                }
            }
        }
        for (auto it = running_.begin(); it != running_.end(); ++it) {
            if ((*it)->id == id) {
                finish(*it, SMOL_FINISH_CANCELLED, -1, nullptr);
                running_.erase(it);
                break;
            }
        }
    }
}

// Returns the batch's size; each request's slice is b0, nb (the last ng of
// them guesses).
int32_t engine::plan_batch() {
    // Plan the batch: one token for every request that is decoding, then
    // prompt chunks, oldest request first, within the batch and the cells.
    // Cells for the decode tokens come first: cached prefixes are evicted,
    // then the youngest request is preempted.
    std::sort(running_.begin(), running_.end(), [](const request_ptr & a, const request_ptr & b) {
        return a.get()->admitted < b.get()->admitted;
    });
    for (;;) {
        int32_t n_decode = 0;
        for (auto & r : running_) n_decode += int32_t(r->tokens.size()) - r->n_past == 1;
        if (make_room(std::min(n_decode, batch_cap_), pages_for_decode()) || running_.size() <= 1)
            break;
        request_ptr victim = std::move(running_.back());
        running_.pop_back();
        preempt(*victim);
        queue_.push_front(std::move(victim));
    }
    int32_t budget = batch_cap_;
    int32_t n = 0;
    // Counted once: nothing below frees or takes a cell until the prompt
    // chunks make room (a count scans the cache, and a full one is large).
    const int32_t n_free = ctx_.kv.n_free();
    for (auto & r : running_) {
        r->nb = 0;
        r->ng = 0;
        if (int32_t(r->tokens.size()) - r->n_past == 1 && budget > 0 && n < n_free) {
            r->b0 = n;
            r->nb = 1;
            ++n;
            --budget;
        }
    }
    // Guesses, once every decode token has its place: within the batch and
    // the free cells (none are made for them), each request's limit and the
    // tokens it may still generate, so that what is kept never passes
    // max_tokens. The decode slices are laid out again with them.
    if (params_.draft_max > 0 && n > 0) {
        int32_t reserved = 0;
        proposing_.clear();
        for (auto & r : running_) {
            r->guess.clear();
            if (r->nb != 1 || r->draft_max == 0) continue;
            int32_t k =
                std::min({r->k_next, r->max_tokens - r->n_generated - 1, budget - reserved});
            k = std::min(k, n_free - n - reserved);
            if (k <= 0) continue;
            r->ng = k; // the most it may get
            reserved += k;
            proposing_.push_back(r.get());
        }
        if (!proposing_.empty()) propose(proposing_);
        int32_t at = 0;
        for (auto & r : running_) {
            if (r->nb == 0) continue;
            r->ng = int32_t(r->guess.size());
            r->b0 = at;
            r->nb = 1 + r->ng;
            at += r->nb;
        }
        n = at;
        budget = batch_cap_ - n;
    }
    int32_t chunk_pages = pages_for_decode();
    for (auto & r : running_) {
        const int32_t pending = int32_t(r->tokens.size()) - r->n_past;
        if (pending <= 1 || budget <= 0) continue;
        int32_t take = std::min({pending, int32_t(params_.n_chunk), budget});
        chunk_pages += (take + kv_page - 1) / kv_page;
        make_room(n + take, chunk_pages);
        if (!ctx_.kv.has_free(n + take)) take = std::min(take, ctx_.kv.n_free() - n);
        if (take <= 0) continue;
        r->b0 = n;
        r->nb = take;
        n += take;
        budget -= take;
    }
    if (n == 0 && running_.size() > 1) {
        // Nothing fits: prompts in flight hold every cell. The youngest
        // gives way; the others go on next step.
        request_ptr victim = std::move(running_.back());
        running_.pop_back();
        preempt(*victim);
        queue_.push_front(std::move(victim));
    } else if (n == 0 && running_.size() == 1) {
        set_last_error("the KV cache cannot hold this request; raise n_ctx");
        finish(running_.front(), SMOL_FINISH_ERROR, -1, nullptr);
        running_.clear();
    }

    return n;
}

// Decodes the planned batch of n tokens and moves each request in it on.
engine::step_times engine::run_batch(int32_t n) {
    // The batch in the order of the slices planned above (decode tokens,
    // then prompt chunks), which is not always the requests' order: a
    // younger request decodes while an older one is still in its prompt
    // when, say, the prefix cache left it one token to compute.
    slices_.clear();
    for (auto & r : running_) {
        if (r->nb > 0) slices_.push_back(r.get());
    }
    std::sort(slices_.begin(), slices_.end(),
              [](const request * a, const request * b) { return a->b0 < b->b0; });
    batch_.n_tokens = 0;
    for (request * r : slices_) {
        SMOL_ASSERT_MSG(batch_.n_tokens == r->b0, "engine: a slice out of place");
        for (int32_t j = 0; j < r->nb - r->ng; ++j) {
            const int32_t p = r->n_past + j;
            const bool last = p == int32_t(r->tokens.size()) - 1;
            smol_batch_add(&batch_, batch_cap_, r->tokens[size_t(p)], p, r->seq, last);
            if (last && r->top_only) batch_.logits[batch_.n_tokens - 1] = SMOL_KEEP_TOKEN;
        }
        // Guesses after the last known token, each with its logits.
        for (int32_t j = 0; j < r->ng; ++j) {
            smol_batch_add(&batch_, batch_cap_, r->guess[size_t(j)], int32_t(r->tokens.size()) + j,
                           r->seq, true);
            if (r->top_only) batch_.logits[batch_.n_tokens - 1] = SMOL_KEEP_TOKEN;
        }
    }
    int32_t n_prefill = 0, n_sampled = 0;
    using clock = std::chrono::steady_clock;
    const clock::time_point t_step = clock::now();
    const std::string failed = decode_batch();
    step_times t;
    t.decode = std::chrono::duration<double>(clock::now() - t_step).count();
    if (!failed.empty()) {
        // The batch was checked as it was built: this is a bug or a
        // backend failure. Every request in it ends with the message,
        // which says what the step held.
        int32_t n_req = 0;
        for (auto & r : running_) n_req += r->nb > 0;
        set_last_error(failed + " (in a step of " + std::to_string(n) + " tokens from " +
                       std::to_string(n_req) + " requests; " +
                       std::to_string(ctx_.kv.n_cells - ctx_.kv.n_free()) + " of " +
                       std::to_string(ctx_.kv.n_cells) + " cells held, " +
                       std::to_string(ctx_.kv.n_used) + " in the used range)");
        for (auto & r : running_) {
            if (r->nb > 0) {
                finish(r, SMOL_FINISH_ERROR, -1, nullptr);
                r.reset();
            }
        }
        running_.erase(std::remove(running_.begin(), running_.end(), nullptr), running_.end());
    }
    const int32_t * cells = ctx_.last_cells();
    drawing_.clear();
    for (auto & r : running_) {
        if (r->nb > 0 && settle(r, cells, n_prefill)) drawing_.push_back(r.get());
    }
    const clock::time_point t_draws = clock::now();
    draw_all();
    const clock::time_point t_events = clock::now();
    for (auto & r : running_) {
        if (r && r->drawing) advance(r, n_sampled);
    }
    running_.erase(std::remove(running_.begin(), running_.end(), nullptr), running_.end());
    t.draw = std::chrono::duration<double>(t_events - t_draws).count();
    t.emit = std::chrono::duration<double>(clock::now() - t_events).count();
    std::lock_guard<std::mutex> lock(mu_);
    stats_.n_prefill_tokens += n_prefill;
    stats_.n_generated_tokens += n_sampled;
    ++stats_.n_steps;
    return t;
}

// Decodes batch_; on a device, the grammars' masks of the requests that
// draw after the step (they depend on the texts so far alone) are made on
// the draw threads meanwhile. Returns what failed (empty: nothing).
std::string engine::decode_batch() {
    preparing_.clear();
    if (prepare_beside_) {
        for (request * r : slices_) {
            if (r->grammar && r->n_past + r->nb - r->ng == int32_t(r->tokens.size()))
                preparing_.push_back(r);
        }
    }
    std::atomic<size_t> next{0};
    const std::function<void(int, int)> prepare = [&](int, int) {
        for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < preparing_.size();)
            smol_sampler_prepare(preparing_[i]->sampler);
    };
    // Once the step is done no mask is begun (those left are made, where
    // needed, by the draws) and the workers are waited for, however the step
    // ended, before anything else touches a sampler.
    struct prepared_by_now {
        thread_pool * pool;
        std::atomic<size_t> & next;
        size_t n;
        ~prepared_by_now() {
            if (!pool) return;
            next.store(n, std::memory_order_relaxed);
            pool->wait();
        }
    } const by_now{preparing_.empty() ? nullptr : draw_pool_.get(), next, preparing_.size()};
    if (!preparing_.empty()) draw_pool_->launch(prepare);
    try {
        ctx_.decode(batch_);
    } catch (const std::exception & e) {
        return *e.what() ? e.what() : "the step failed";
    }
    return {};
}

// Moves r on after a decode that held its slice (cells: the batch's
// cells): its cells and prompt cache. True when its last known token was
// decoded, so that it draws; r is reset if it ends.
bool engine::settle(request_ptr & r, const int32_t * cells, int32_t & n_prefill) {
    r->drawing = false;
    r->cells.insert(r->cells.end(), cells + r->b0, cells + r->b0 + r->nb);
    const int32_t n_known = r->nb - r->ng;
    n_prefill += std::max(0, std::min(r->n_past + n_known, r->n_prompt) - r->n_past);
    r->n_past += n_known;
    if (!r->prompt_cached && r->n_past >= r->n_prompt) {
        cache_prefix(*r, r->n_prompt);
        r->prompt_cached = true;
    }
    if (r->n_past != int32_t(r->tokens.size())) return false;
    const int32_t row0 = r->b0 + n_known - 1;
    r->rows.clear();
    r->tops.clear();
    for (int32_t i = 0; i <= r->ng; ++i) {
        if (r->top_only) {
            r->tops.push_back(ctx_.top_token(row0 + i));
            r->rows.push_back(nullptr);
        } else {
            r->rows.push_back(ctx_.logits(row0 + i));
        }
    }
    if (r->top_only ? std::find(r->tops.begin(), r->tops.end(), -1) != r->tops.end()
                    : std::find(r->rows.begin(), r->rows.end(), nullptr) != r->rows.end()) {
        // Cannot happen with the slices in place; were it to, this
        // request alone ends, rather than a token -1 failing the
        // next step for every request in it.
        set_last_error("engine: no logits for request " + std::to_string(r->id));
        finish(r, SMOL_FINISH_ERROR, -1, nullptr);
        r.reset();
        return false;
    }
    r->drawing = true;
    return true;
}

// Checks r's guesses and draws the token after those kept. It touches r
// alone (its sampler, verifier and rows), so requests draw on several
// threads at once.
void engine::draw(request & r) {
    r.kept = 0;
    r.after = -1;
    r.draw_error.clear();
    try {
        if (r.top_only) {
            // What greedy sampling and verification take from the logits.
            r.kept = spec_greedy_accept(r.tops.data(), r.guess.data(), r.ng, &r.after);
        } else if (r.draft_max > 0) {
            r.kept =
                r.verifier.accept(r.rows.data(), r.guess.data(), r.ng,
                                  draft_ && r.verifier.sampling() ? r.q.data() : nullptr, &r.after);
        } else {
            r.after = smol_sampler_sample(r.sampler, r.rows[0], model_.hp.n_vocab);
        }
    } catch (const std::exception & e) {
        // Out of memory in a grammar, say: this request ends with it.
        r.kept = 0;
        r.draw_error =
            std::string("engine: drawing for request ") + std::to_string(r.id) + ": " + e.what();
    }
}

void engine::draw_all() {
    // Below a few draws, waking the threads costs more than it saves.
    constexpr size_t min_parallel = 4;
    const size_t n = drawing_.size();
    if (n < min_parallel || draw_pool_->size() == 1) {
        for (request * r : drawing_) draw(*r);
        return;
    }
    std::atomic<size_t> next{0};
    draw_pool_->run([&](int, int) {
        for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) draw(*drawing_[i]);
    });
}

// Moves r on after its draw: its rejected guesses leave the caches, each
// token is emitted, and r is reset when it ends.
void engine::advance(request_ptr & r, int32_t & n_sampled) {
    r->drawing = false;
    if (!r->draw_error.empty()) {
        set_last_error(r->draw_error);
        finish(r, SMOL_FINISH_ERROR, -1, nullptr);
        r.reset();
        return;
    }
    const int32_t kept = r->kept;
    const smol_token after = r->after;
    if (r->draft_max > 0) {
        // The rejected guesses leave the target's cache and the draft's.
        const int32_t n_rejected = r->ng - kept;
        if (n_rejected > 0) {
            ctx_.kv.cells_rm_seq(r->cells.data() + r->n_past + kept, n_rejected, r->seq);
            r->cells.resize(size_t(r->n_past + kept));
        }
        r->n_past += kept;
        r->k_next = spec_next_length(r->k_next, r->ng, kept, r->draft_max);
        if (draft_ && r->draft_past > r->n_past) {
            draft_->kv.seq_rm(r->seq, r->n_past, -1);
            r->draft_past = r->n_past;
        }
        if (r->ng > 0) {
            // Counted before its tokens' events: a caller that hears
            // of them sees them in the figures.
            std::lock_guard<std::mutex> lock(mu_);
            stats_.n_spec_drafted += r->ng;
            stats_.n_spec_accepted += kept;
            ++stats_.n_spec_verifies;
        }
    }
    if (after < 0) {
        // A grammar that allows nothing more, in a vocabulary with no
        // end-of-generation token.
        finish(r, SMOL_FINISH_STOP, -1, r->rows[0]);
        r.reset();
        return;
    }
    // The kept guesses, then the token after them, in order; the
    // first that ends the request ends it (the cache keeps no
    // position past the tokens it has then).
    for (int32_t i = 0; i <= kept; ++i) {
        const smol_token t = i < kept ? r->guess[size_t(i)] : after;
        const float * logits = r->rows[size_t(i)];
        smol_sampler_accept(r->sampler, t);
        r->tokens.push_back(t);
        ++r->n_generated;
        ++n_sampled;
        smol_finish_reason why = SMOL_FINISH_NONE;
        if ((!r->ignore_eog && model_.vocab.is_eog(t)) ||
            std::find(r->stop.begin(), r->stop.end(), t) != r->stop.end()) {
            why = SMOL_FINISH_STOP;
        } else if (r->n_generated >= r->max_tokens) {
            why = SMOL_FINISH_LENGTH;
        }
        if (why == SMOL_FINISH_NONE && emit(*r, t, logits, SMOL_FINISH_NONE)) continue;
        r->n_past = std::min(r->n_past, int32_t(r->tokens.size()));
        r->cells.resize(size_t(r->n_past));
        if (why != SMOL_FINISH_NONE) {
            finish(r, why, t, logits);
        } else {
            finish(r, SMOL_FINISH_CANCELLED, -1, nullptr);
        }
        r.reset();
        break;
    }
}

smol_engine_stats engine::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    smol_engine_stats s = stats_;
    s.n_queued += int32_t(incoming_.size()); // submitted since the last step
    s.prefix_hit_rate =
        s.n_prompt_tokens > 0 ? double(s.n_prefix_hit_tokens) / double(s.n_prompt_tokens) : 0.0;
    // The cells in use, split by where their heads live (per-head placement;
    // a group in the window store holds only its slots).
    ctx_.kv_bytes_held(s.n_cells_used, slots_used_, s.kv_bytes_resident, s.kv_bytes_offloaded);
    return s;
}

} // namespace smol

// --- the C API ------------------------------------------------------------------

struct smol_engine {
    std::unique_ptr<smol::engine> e;
};

extern "C" {

smol_engine_params smol_engine_default_params(void) {
    smol_engine_params p{};
    p.context = smol_context_default_params();
    p.context.n_seq_max = 4;
    p.n_chunk = 256;
    p.n_queue_max = 256;
    p.prefix_cache = true;
    p.prefix_block = 16;
    p.worker_thread = false;
    p.draft_max = 0;
    p.ngram_min = 2;
    p.ngram_max = 4;
    p.draft_model = nullptr;
    p.draft_n_threads = 0;
    return p;
}

smol_request_params smol_request_default_params(void) {
    smol_request_params p{};
    p.sampler = smol_sampler_default_params();
    p.max_tokens = 0;
    p.draft_max = -1; // the engine's
    return p;
}

smol_status smol_engine_create(smol_model * model, const smol_engine_params * params,
                               smol_engine ** out) {
    if (!model || !out) {
        smol::set_last_error("smol_engine_create: model and out must not be NULL");
        return SMOL_ERR_INVALID_ARGUMENT;
    }
    *out = nullptr;
    const smol_engine_params p = params ? *params : smol_engine_default_params();
    if (p.prefix_block > 4096) {
        smol::set_last_error("smol_engine_create: prefix_block above 4096 tokens");
        return SMOL_ERR_INVALID_ARGUMENT;
    }
    return smol::guard([&] {
        auto e = std::make_unique<smol_engine>();
        e->e = std::make_unique<smol::engine>(*model->m, p);
        *out = e.release();
    });
}

void smol_engine_free(smol_engine * engine) {
    delete engine;
}

smol_status smol_engine_submit(smol_engine * engine, const smol_request_params * params,
                               smol_request_id * out) {
    if (!engine || !params) {
        smol::set_last_error("smol_engine_submit: engine and params must not be NULL");
        return SMOL_ERR_INVALID_ARGUMENT;
    }
    return smol::guard([&] {
        const smol_request_id id = engine->e->submit(*params);
        if (out) *out = id;
    });
}

smol_status smol_engine_cancel(smol_engine * engine, smol_request_id id) {
    if (!engine || !engine->e->cancel(id)) {
        smol::set_last_error("smol_engine_cancel: no request " + std::to_string(id));
        return SMOL_ERR_INVALID_ARGUMENT;
    }
    return SMOL_OK;
}

smol_status smol_engine_step(smol_engine * engine, int32_t * n_active) {
    if (!engine) {
        smol::set_last_error("smol_engine_step: engine must not be NULL");
        return SMOL_ERR_INVALID_ARGUMENT;
    }
    if (engine->e->params().worker_thread) {
        smol::set_last_error("smol_engine_step: this engine steps on its own worker thread");
        return SMOL_ERR_INVALID_ARGUMENT;
    }
    return smol::guard([&] {
        const int32_t n = engine->e->step();
        if (n_active) *n_active = n;
    });
}

smol_engine_stats smol_engine_get_stats(const smol_engine * engine) {
    return engine ? engine->e->stats() : smol_engine_stats{};
}

} // extern "C"
