// smol-engine.h - the serving engine: many requests over one model and one
// KV cache. A scheduler admits requests into sequence slots, runs one batch
// per step that mixes the decode tokens of running requests with bounded
// prefill chunks of admitted ones (continuous batching, chunked prefill),
// and, when cells run out, evicts cached prefixes and then preempts the
// youngest request (it is queued again and recomputed, with the same
// result). A radix tree over token blocks lets a request reuse the KV of
// any earlier request's prefix. Speculation lets a decoding request verify
// guesses (n-gram lookup or a draft model) in the same batch, by the rule
// smol-spec.h shares with smol_spec. The C API in smol.h wraps it.

#ifndef SMOL_ENGINE_H
#define SMOL_ENGINE_H

#include "smol-cpu.h"
#include "smol-llama.h"
#include "smol-spec.h"
#include "smol.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace smol {

// --- prefix cache -------------------------------------------------------------

// A radix tree whose edges are blocks of block_size tokens: a node is one
// block of a cached prefix and names the KV cells that hold it. It only
// keeps the books; the engine gives the cells of new blocks to its own
// sequence (so they outlive their request) and takes them back on eviction.
class radix_tree {
  public:
    struct node {
        std::vector<smol_token> key; // the block's tokens
        std::vector<int32_t> cells;  // the cell of each of them
        node * parent = nullptr;
        std::map<std::vector<smol_token>, std::unique_ptr<node>> children;
        int32_t refs = 0;      // requests using it: not evicted meanwhile
        uint64_t last_use = 0; // for LRU eviction
        bool listed = false;   // among the evictable leaves
    };

    explicit radix_tree(int32_t block_size);
    int32_t block_size() const { return block_; }
    int32_t n_blocks() const { return n_blocks_; }

    // The nodes of the longest cached prefix of tokens[0, n), whole blocks,
    // at most max_blocks; marks them used now.
    std::vector<node *> match(const smol_token * tokens, int32_t n, int32_t max_blocks);
    // Adds the whole blocks of tokens[0, n), held in cells[0, n). Blocks
    // already cached are only marked used; the cells of new blocks are
    // appended to new_cells (the caller makes them the cache's). Returns the
    // number of new blocks.
    int32_t insert(const smol_token * tokens, const int32_t * cells, int32_t n,
                   std::vector<int32_t> & new_cells);
    void acquire(const std::vector<node *> & path);
    void release(const std::vector<node *> & path);
    // Removes the least recently used leaf that no request uses and appends
    // its cells to freed; false when there is none. With chain, the leaf
    // is the parent of the last block it removed, if that is now a leaf no
    // request uses: one cached text is taken back from its end, so that
    // its pages empty one by one.
    bool evict(std::vector<int32_t> & freed, bool chain = false);
    const node & root() const { return root_; }

  private:
    // A leaf no request uses may go: such leaves are kept ordered by last
    // use, so an eviction takes the first, whatever the tree holds.
    bool evictable(const node * x) const {
        return x != &root_ && x->children.empty() && x->refs == 0;
    }
    void unlist(node * x);
    void relist(node * x); // listed again if evictable, at its last use
    void use(node * x);    // marks x used now

    node * chain_ = nullptr; // what the last eviction left a leaf, if any
    int32_t block_;
    int32_t n_blocks_ = 0;
    uint64_t clock_ = 0;
    node root_;
    std::set<std::pair<uint64_t, node *>> leaves_; // the evictable leaves by last use
};

// --- engine -------------------------------------------------------------------

class engine {
  public:
    engine(const llama_model & model, const smol_engine_params & params);
    ~engine();
    engine(const engine &) = delete;
    engine & operator=(const engine &) = delete;

    // Queues a request (throws smol::error on bad input or a full queue).
    smol_request_id submit(const smol_request_params & params);
    // Asks for a request to end; its final event says CANCELLED. False if
    // the id is unknown or already finished.
    bool cancel(smol_request_id id);
    // Runs one batch; returns the requests still running or queued. With a
    // worker thread, only that thread steps.
    int32_t step();
    smol_engine_stats stats() const;
    const smol_engine_params & params() const { return params_; }
    llama_context & context() { return ctx_; }

  private:
    struct request {
        smol_request_id id = 0;
        std::vector<smol_token> tokens; // the prompt, then what was generated
        int32_t n_prompt = 0;
        int32_t n_past = 0; // tokens[0, n_past) are in the cache
        int32_t n_generated = 0;
        int32_t max_tokens = 0;
        int32_t n_cached = 0; // prompt tokens the prefix cache gave at admission
        std::vector<smol_token> stop;
        bool ignore_eog = false;
        smol_sampler * sampler = nullptr;
        bool grammar = false; // its sampler has one
        smol_engine_event_fn on_event = nullptr;
        void * user_data = nullptr;
        smol_seq_id seq = -1;
        std::vector<int32_t> cells; // the cell of each position in [0, n_past)
        std::vector<radix_tree::node *> held;
        uint64_t admitted = 0; // admission order: the youngest is preempted first
        bool cancelled = false;
        bool prompt_cached = false; // its prompt's blocks went into the tree
        bool counted = false;       // in the prompt and prefix-hit figures
        // Submission, first admission and first token (zero: not yet).
        std::chrono::steady_clock::time_point t_submit, t_admit, t_first;
        // Within a step: the batch slice [b0, b0 + nb), its last ng tokens
        // the guesses.
        int32_t b0 = 0, nb = 0, ng = 0;
        // Speculation: most guesses a step (0: none), the acceptance rule
        // and its generator, this step's guesses, the draft's probability
        // rows of them (a sampling draft), and the tokens of `tokens` that
        // the draft's cache holds (sequence seq of the draft's context).
        int32_t draft_max = 0;
        int32_t k_next = 0; // guesses in its next pass (spec_next_length)
        spec_verifier verifier;
        std::vector<smol_token> guess;
        std::vector<double> q;
        int32_t draft_past = 0;
        // Within a step, when its last known token was decoded: its logits
        // rows (row i after the known tokens and guesses [0, i)) and what
        // was drawn from them, the guesses kept and the token after them.
        bool drawing = false;
        std::vector<const float *> rows;
        // Greedy with no use for its logits: its steps keep only the top
        // tokens (SMOL_KEEP_TOKEN), its rows are null and tops hold them.
        bool top_only = false;
        std::vector<smol_token> tops;
        int32_t kept = 0;
        smol_token after = -1;
        std::string draw_error; // what failed in the draw, if anything
    };
    using request_ptr = std::unique_ptr<request>;

    void worker();
    void take_news();
    void admit();
    int32_t plan_batch();
    // The seconds of a step's phases after planning (smol_engine_stats).
    struct step_times {
        double decode = 0, draw = 0, emit = 0;
    };
    step_times run_batch(int32_t n);
    std::string decode_batch();
    bool settle(request_ptr & r, const int32_t * cells, int32_t & n_prefill);
    void draw(request & r);
    void draw_all();
    void advance(request_ptr & r, int32_t & n_sampled);
    // Evicts cached prefixes until `cells` are free (false if it cannot),
    // then, as far as a few more evictions go, until `pages` whole pages are.
    bool make_room(int32_t cells, int32_t pages = 0);
    int32_t pages_for_decode() const;
    void preempt(request & r);
    void finish(request_ptr & r, smol_finish_reason reason, smol_token token, const float * logits);
    void release_seq(request & r);
    void cache_prefix(request & r, int32_t n);
    bool emit(request & r, smol_token token, const float * logits, smol_finish_reason reason);
    void propose(const std::vector<request *> & rs);

    const llama_model & model_;
    smol_engine_params params_;
    llama_context ctx_;
    radix_tree tree_;
    smol_seq_id cache_seq_; // the sequence that holds the cached prefixes' cells
    smol_batch batch_{};
    int32_t batch_cap_ = 0;
    // Speculation with a draft model: its context and batch.
    std::unique_ptr<llama_context> draft_;
    smol_batch draft_batch_{};
    std::vector<request *> proposing_;                      // a step's requests that guess
    std::vector<std::pair<request *, int32_t>> draft_rows_; // their rows in a draft batch
    // A step's requests that draw, and the threads that draw for them
    // (a greedy draw reads a whole logits row: at 64 requests a step, one
    // thread's reads are a large part of the step).
    std::vector<request *> drawing_;
    std::unique_ptr<thread_pool> draw_pool_;
    // On a device, the requests that draw after a step with a grammar have
    // their masks made on the draw threads while the device runs the step.
    bool prepare_beside_ = false;
    std::vector<request *> preparing_;

    std::vector<request_ptr> running_;
    std::deque<request_ptr> queue_;
    std::vector<smol_seq_id> free_seqs_;
    uint64_t admit_clock_ = 0;
    std::vector<int32_t> scratch_cells_;
    std::vector<request *> slices_; // a step's requests in batch order

    // Shared with other threads: submissions, cancellations, the figures.
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<request_ptr> incoming_;
    std::vector<smol_request_id> cancels_;
    smol_request_id next_id_ = 1;
    int64_t n_active_ = 0; // submitted and not finished
    smol_engine_stats stats_{};
    int32_t slots_used_ = 0; // the window store's slots in use, as of stats_
    bool stop_ = false;
    std::mutex step_mu_;
    std::thread worker_;
};

} // namespace smol

#endif // SMOL_ENGINE_H
