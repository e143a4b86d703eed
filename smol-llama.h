// smol-llama.h - the Llama architecture: hyper-parameters and weights read
// from GGUF metadata (SmolLM2 135M/360M/1.7B and other llama files: GQA, RoPE
// base, RMSNorm epsilon, tied or separate output), and the per-stream context
// (its KV cache and plan, the batches' cells, logits) that builds the forward
// graph of each prefill chunk or decode batch and runs it.

#ifndef SMOL_LLAMA_H
#define SMOL_LLAMA_H

#include "gguf.h"
#include "smol-backend.h"
#include "smol-chat.h"
#include "smol-graph.h"
#include "smol-kv-cache.h"
#include "smol-plan.h"
#include "smol-vocab.h"
#include "smol.h"

#include <memory>
#include <string>
#include <vector>

namespace smol {

class collective;
class thread_pool;

// The families smol runs: Llama (SmolLM2, Llama 2/3 shapes) and Gemma 3,
// whose graph adds an embedding scale, q and k norms per head, norms after
// attention and the MLP, GeGLU, NeoX RoPE, and local sliding-window layers
// with their own RoPE base between the global ones.
enum class llama_arch { llama, gemma3 };

struct llama_hparams {
    llama_arch arch = llama_arch::llama;
    int32_t n_vocab = 0;
    int32_t n_ctx_train = 0;
    int32_t n_embd = 0;
    int32_t n_layer = 0;
    int32_t n_head = 0;
    int32_t n_head_kv = 0;
    int32_t n_ff = 0;
    int32_t head_dim = 0;
    float rope_base = 10000.0f;
    float rms_eps = 1e-5f;
    // Gemma 3: local layers see the last n_swa positions; swa[l] says which.
    int32_t n_swa = 0;
    std::vector<bool> swa;
    float rope_base_swa = 10000.0f;
    float attn_scale = 0;    // 0: 1 / sqrt(head_dim)
    float embd_scale = 1.0f; // the embeddings' factor (Gemma: sqrt(n_embd))
};

// A weight as it lies in the file: no copy is made.
struct weight {
    smol_type type = SMOL_TYPE_F32;
    int64_t ne0 = 0, ne1 = 1;
    const void * data = nullptr;
};

struct llama_layer {
    weight attn_norm, wq, wk, wv, wo;
    weight ffn_norm, w_gate, w_up, w_down;
    // Gemma 3 only (no data otherwise): q and k norms, norms after attention
    // and after the MLP.
    weight q_norm, k_norm, post_attn_norm, post_ffw_norm;

    // Calls f(name, weight) for each weight the layer has.
    template <typename F> void each(F && f) {
        const std::pair<const char *, weight *> all[] = {
            {"attn_norm", &attn_norm},
            {"attn_q", &wq},
            {"attn_k", &wk},
            {"attn_v", &wv},
            {"attn_output", &wo},
            {"ffn_norm", &ffn_norm},
            {"ffn_gate", &w_gate},
            {"ffn_up", &w_up},
            {"ffn_down", &w_down},
            {"attn_q_norm", &q_norm},
            {"attn_k_norm", &k_norm},
            {"post_attention_norm", &post_attn_norm},
            {"post_ffw_norm", &post_ffw_norm},
        };
        for (const auto & [name, w] : all) {
            if (w->data) f(name, *w);
        }
    }
    template <typename F> void each(F && f) const {
        const_cast<llama_layer *>(this)->each(
            [&](const char * name, weight & w) { f(name, static_cast<const weight &>(w)); });
    }
};

// Immutable once loaded; any number of contexts share it.
struct grammar_vocab;

struct llama_model {
    std::unique_ptr<gguf::file> file;
    llama_hparams hp;
    smol::vocab vocab;
    chat_template chat; // tokenizer.chat_template
    weight tok_embd, output_norm, output;
    std::vector<llama_layer> layers;
    smol_type ftype = SMOL_TYPE_F32;
    int64_t n_params = 0;
    uint64_t n_bytes = 0;
    std::string name;
    double t_load_ms = 0;
    // The vocabulary's byte trie for grammar masks, made at the first
    // grammar's request (smol-grammar.c++ guards it).
    mutable std::shared_ptr<const grammar_vocab> grammar_trie;

    // Throws smol::error naming the file and the fault.
    static std::unique_ptr<llama_model> load(const std::string & path,
                                             const smol_model_params & params);
};

class llama_context {
  public:
    llama_context(const llama_model & model, const smol_context_params & params);
    ~llama_context();
    llama_context(const llama_context &) = delete;
    llama_context & operator=(const llama_context &) = delete;

    // A chunk keeps at most this many tokens' logits: a batch that asks for
    // more runs in more chunks. Compute memory is planned for it, not for
    // a logits row of every token of a chunk (a 16,384-token chunk's would
    // be 3.2 GB at SmolLM2's vocabulary).
    static constexpr int32_t chunk_outputs = 512;

    void decode(const smol_batch & batch); // throws smol::error
    // The i-th token's output row: logits, or with params.embeddings its
    // final hidden state; null for a token that kept only its top token.
    const float * logits(int32_t i) const;
    // The i-th token's most likely next token (smol_get_top_token); -1 if
    // it kept neither logits nor its token.
    smol_token top_token(int32_t i) const;
    int32_t out_width() const { return params.embeddings ? model.hp.n_embd : model.hp.n_vocab; }

    // The devices the model is split over (one stage each, in layer order)
    // and each one's backend, KV plan and last graph run.
    int32_t n_devices() const { return int32_t(stages_.size()); }
    const backend & device(int32_t d = 0) const;
    const kv_plan & plan(int32_t d = 0) const;
    // The graph of the last step run (for tests that read its schedule).
    const graph & last_graph(int32_t d = 0) const;
    // Offloaded heads attended on the host, on every device.
    int32_t n_host_heads() const;

    // The whole context's memory (d < 0), or device d's.
    smol_memory_info memory_info(int32_t d = -1) const;
    // The KV bytes of `cells` cells of the cache and `slots` slots of the
    // window store, by where their heads live.
    void kv_bytes_held(int32_t cells, int32_t slots, uint64_t & resident,
                       uint64_t & offloaded) const;
    // Every device's plan, and the program of a step of n_tokens after the
    // cache's current contents, as text.
    std::string plan_text() const;
    std::string schedule_text(int32_t n_tokens);
    // The cache cell each token of the last decoded batch went to.
    const int32_t * last_cells() const { return batch_cells_.data(); }
    // The lowest position at which seq can be decoded exactly (0: any; see
    // kv_window::first_exact).
    smol_pos seq_pos_exact(smol_seq_id seq);
    // Whether a sequence holding these cells, positions 0 .. n - 1 in
    // order, could go on at position n exactly: the window store keeps the
    // last window of them (always, without a window store).
    bool window_kept(const int32_t * cells, int32_t n) const;

    const llama_model & model;
    smol_context_params params;
    kv_cache kv;
    // The sliding-window layers' or streaming heads' store (off: they keep
    // every cell).
    kv_window win;
    // Streaming heads: one flag per (layer, kv head) (empty: none), the
    // positions they keep first and their window.
    std::vector<uint8_t> streaming;
    int32_t stream_sink = 0, stream_window = 0;
    smol_perf perf{};

  private:
    struct stage;
    // What decides a stage's graph for a step: its token and output counts
    // and its KV copies.
    struct step_shape {
        int32_t n = 0, n_out = 0;
        bool tokens = false; // the outputs are the rows' top tokens, picked from the logits
        kv_copies copies;
        bool operator==(const step_shape &) const = default;
    };
    // Outputs as logits, or (tops) as top tokens.
    step_shape shape_of(const stage & st, int32_t n_tokens, int32_t n_outputs,
                        bool tops = false) const;
    void build_graph(stage & st, const step_shape & s);
    stage & output_stage() const;
    void stage_weights(stage & st);
    std::string stage_text(const stage & st) const;
    void plan_stage(stage & st, int32_t n_batch);
    void place_stage(stage & st);
    // Runs tokens [i0, i0 + n) of a checked batch whose cells are assigned.
    void run_chunk(const smol_batch & b, int32_t i0, int32_t n, int32_t out_base);
    void list_seq_cells(int32_t n_tokens, const kv_cache & table, std::vector<int32_t> & cells,
                        std::vector<int32_t> & begin);
    void set_local_batch(graph & g, bool lists);
    void take_streaming_heads(bool has_swa);

    // One per device, in layer order (a head split: in rank order).
    std::vector<std::unique_ptr<stage>> stages_;
    // A head split: the ranks' all-reduce and the threads that run their
    // graphs side by side.
    bool by_heads_ = false;
    std::unique_ptr<collective> comm_;
    std::unique_ptr<thread_pool> ranks_;
    // Its ranks are GPUs (join_gpu_group), and their group was aborted by a
    // failed step and is joined again before the next.
    bool gpu_group_ = false, regroup_ = false;
    std::vector<backend *> rank_backends() const;
    std::string device_list_; // as given
    int32_t chunk_ = 0;       // tokens per prefill chunk: the smallest of the stages' plans
    std::vector<int32_t> tokens_, positions_, seqs_, cells_, out_ids_;
    std::vector<int32_t> out_row_;   // batch index -> output row, -1 if none
    std::vector<int8_t> out_logits_; // batch index -> it kept its logits
    // Each sequence's newest position and cell, as of kv.version
    // seq_version_ (rescanned from the cells when the cache changed).
    std::vector<smol_pos> seq_max_;
    std::vector<int32_t> seq_tail_;
    uint64_t seq_version_ = ~uint64_t(0);
    // Per batch: the cells of each sequence by position (batch_info).
    std::vector<int32_t> seq_cells_, seq_begin_;
    // The same for the window store, each token's slot, and its batch.
    std::vector<int32_t> seq_slots_, seq_slot_begin_, slots_;
    batch_info local_batch_;
    std::vector<int32_t> batch_cells_; // the cell of each token of the last batch, all chunks
    std::vector<int32_t> fill_, hits_; // list_seq_cells' scratch
    int32_t last_out_ = -1;
    int32_t n_last_ = 0;
    // The last batch's logits rows, in host memory from the last device's
    // backend: pinned for a GPU, so a step's download is one copy at the
    // link's speed (into pageable memory the driver stages it and copies
    // twice). With tops_, an int32 top token per output row first (some
    // output kept only its token, and the graph picked every row's), then
    // the logits rows (logits_row), where only those of the outputs that
    // kept their logits, and the rows between them, were copied.
    float * logits_ = nullptr;
    bool tops_ = false;
    int32_t n_out_ = 0;     // the last batch's output rows
    size_t logits_cap_ = 0; // floats
    void reserve_logits(size_t n);
    float * logits_row(int32_t row) const; // output row's logits in logits_
};

} // namespace smol

// The C API's model and context handles (smol.c++, smol-engine.c++,
// smol-spec.c++).
struct smol_model {
    std::unique_ptr<smol::llama_model> m;
};
struct smol_context {
    smol_model * model;
    std::unique_ptr<smol::llama_context> c;
};

#endif // SMOL_LLAMA_H
