// smol-llama.c++ - loads a Llama-architecture GGUF (hyper-parameters, weights
// in place in the mapped file, the tokenizer) and runs batches through it:
// cell assignment in the KV cache, the graph of one forward pass, logits.

#include "smol-llama.h"

#include "smol-cpu-kernels.h"
#include "smol-error.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

namespace smol {

namespace {

double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

bool supported_type(uint32_t t) {
    switch (t) {
    case SMOL_TYPE_F32:
    case SMOL_TYPE_F16:
    case SMOL_TYPE_BF16:
    case SMOL_TYPE_Q8_0:
    case SMOL_TYPE_Q4_0:
    case SMOL_TYPE_Q4_1:
        return true;
    default:
        return false;
    }
}

struct loader {
    const gguf::file & f;
    const std::string & path;

    int32_t req_int(const std::string & key) const {
        const auto v = f.get_i64(key);
        if (!v) {
            throw error(SMOL_ERR_FORMAT, path + ": metadata key '" + key +
                                             "' is missing; the file is not a complete llama "
                                             "model (convert it again)");
        }
        if (*v <= 0 || *v > (int64_t(1) << 30)) {
            throw error(SMOL_ERR_FORMAT, path + ": metadata '" + key + "' = " + std::to_string(*v) +
                                             " is out of range");
        }
        return int32_t(*v);
    }

    weight get(const std::string & name, int64_t ne0, int64_t ne1, bool must_be_f32 = false) const {
        const gguf::tensor_info * t = f.find_tensor(name);
        if (!t) {
            throw error(SMOL_ERR_FORMAT, path + ": tensor '" + name +
                                             "' is missing; the file is not a complete llama "
                                             "model");
        }
        const int64_t want_dims = ne1 == 1 ? 1 : 2;
        if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1 ||
            int64_t(t->n_dims) > want_dims) {
            throw error(SMOL_ERR_FORMAT, path + ": tensor '" + name + "' has shape [" +
                                             std::to_string(t->ne[0]) + ", " +
                                             std::to_string(t->ne[1]) + "], expected [" +
                                             std::to_string(ne0) + ", " + std::to_string(ne1) +
                                             "] from the metadata");
        }
        const gguf::tensor_type_traits * tt = gguf::tensor_type_info(t->type);
        const std::string tname = tt ? tt->name : "type " + std::to_string(t->type);
        if (!supported_type(t->type) || (must_be_f32 && t->type != SMOL_TYPE_F32)) {
            throw error(SMOL_ERR_UNSUPPORTED,
                        path + ": tensor '" + name + "' has type " + tname +
                            ", which smol does not support " +
                            (must_be_f32 ? "for norms (f32 only)"
                                         : "yet (f32, f16, bf16, q8_0, q4_0, q4_1)") +
                            "; convert the model with smol-quantize to a supported type");
        }
        return weight{smol_type(t->type), t->ne[0], t->ne[1], t->data};
    }
};

} // namespace

std::unique_ptr<llama_model> llama_model::load(const std::string & path,
                                               const smol_model_params & params) {
    const double t0 = now_ms();
    if (FILE * probe = std::fopen(path.c_str(), "rb")) {
        std::fclose(probe);
    } else {
        throw error(SMOL_ERR_IO, "cannot open model '" + path + "': " + std::strerror(errno) +
                                     " (scripts/fetch-model.sh downloads SmolLM2-135M-Instruct)");
    }
    auto m = std::make_unique<llama_model>();
    try {
        m->file = gguf::file::open(path, params.use_mmap);
    } catch (const gguf::error & e) {
        throw error(SMOL_ERR_FORMAT, e.what());
    }
    const gguf::file & f = *m->file;
    loader ld{f, path};

    std::string arch;
    try {
        arch = f.get_str("general.architecture").value_or("");
    } catch (const gguf::error & e) {
        throw error(SMOL_ERR_FORMAT, e.what());
    }
    if (arch != "llama") {
        throw error(SMOL_ERR_UNSUPPORTED,
                    path + ": architecture '" + arch +
                        "' is not supported; smol runs llama-architecture models (SmolLM2, "
                        "Llama 2/3 shapes)");
    }

    llama_hparams & hp = m->hp;
    try {
        hp.n_layer = ld.req_int("llama.block_count");
        hp.n_ctx_train = ld.req_int("llama.context_length");
        hp.n_embd = ld.req_int("llama.embedding_length");
        hp.n_ff = ld.req_int("llama.feed_forward_length");
        hp.n_head = ld.req_int("llama.attention.head_count");
        hp.n_head_kv = f.get_i64("llama.attention.head_count_kv")
                           ? ld.req_int("llama.attention.head_count_kv")
                           : hp.n_head;
        hp.rope_base = float(f.get_f64("llama.rope.freq_base").value_or(10000.0));
        hp.rms_eps = float(f.get_f64("llama.attention.layer_norm_rms_epsilon").value_or(1e-5));
        if (const auto scaling = f.get_str("llama.rope.scaling.type");
            scaling && *scaling != "none" && *scaling != "") {
            throw error(SMOL_ERR_UNSUPPORTED,
                        path + ": RoPE scaling '" + *scaling + "' is not supported yet");
        }
    } catch (const gguf::error & e) {
        throw error(SMOL_ERR_FORMAT, e.what());
    }
    if (hp.n_embd % hp.n_head != 0 || hp.n_head % hp.n_head_kv != 0) {
        throw error(SMOL_ERR_FORMAT, path + ": " + std::to_string(hp.n_head) + " heads over " +
                                         std::to_string(hp.n_head_kv) + " kv heads and width " +
                                         std::to_string(hp.n_embd) + " do not divide evenly");
    }
    hp.head_dim = hp.n_embd / hp.n_head;
    const int64_t rope_dims = f.get_i64("llama.rope.dimension_count").value_or(hp.head_dim);
    if (rope_dims != hp.head_dim || hp.head_dim % 2 != 0 || hp.head_dim > 1024) {
        throw error(SMOL_ERR_UNSUPPORTED, path + ": rotary dimension " + std::to_string(rope_dims) +
                                              " with head size " + std::to_string(hp.head_dim) +
                                              " is not supported (smol rotates whole, even heads)");
    }

    try {
        m->vocab.load(f);
    } catch (const gguf::error & e) {
        throw error(SMOL_ERR_FORMAT, e.what());
    }
    hp.n_vocab = m->vocab.n_tokens();

    const int64_t E = hp.n_embd, KV = int64_t(hp.n_head_kv) * hp.head_dim;
    m->tok_embd = ld.get("token_embd.weight", E, hp.n_vocab);
    m->output_norm = ld.get("output_norm.weight", E, 1, true);
    m->output =
        f.find_tensor("output.weight") ? ld.get("output.weight", E, hp.n_vocab) : m->tok_embd;
    m->layers.resize(size_t(hp.n_layer));
    std::map<smol_type, int> type_count;
    for (int l = 0; l < hp.n_layer; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        llama_layer & L = m->layers[size_t(l)];
        L.attn_norm = ld.get(p + "attn_norm.weight", E, 1, true);
        L.wq = ld.get(p + "attn_q.weight", E, E);
        L.wk = ld.get(p + "attn_k.weight", E, KV);
        L.wv = ld.get(p + "attn_v.weight", E, KV);
        L.wo = ld.get(p + "attn_output.weight", E, E);
        L.ffn_norm = ld.get(p + "ffn_norm.weight", E, 1, true);
        L.w_gate = ld.get(p + "ffn_gate.weight", E, hp.n_ff);
        L.w_up = ld.get(p + "ffn_up.weight", E, hp.n_ff);
        L.w_down = ld.get(p + "ffn_down.weight", hp.n_ff, E);
        for (const weight * w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
            ++type_count[w->type];
    }
    m->ftype = std::max_element(type_count.begin(), type_count.end(), [](auto & a, auto & b) {
                   return a.second < b.second;
               })->first;

    // Touch every page of every tensor now, so loading shows progress and the
    // first decode does not pay for page faults.
    uint64_t total = 0, done = 0;
    for (const auto & t : f.tensors()) total += t.nbytes;
    volatile uint8_t sink = 0;
    for (const auto & t : f.tensors()) {
        m->n_params += t.n_elements();
        const uint8_t * p = static_cast<const uint8_t *>(t.data);
        for (uint64_t off = 0; off < t.nbytes; off += 4096) sink = sink + p[off];
        done += t.nbytes;
        if (params.progress && !params.progress(total ? float(double(done) / double(total)) : 1.0f,
                                                params.progress_user_data)) {
            throw error(SMOL_ERR_INVALID_ARGUMENT, "loading '" + path + "' was cancelled");
        }
    }
    m->n_bytes = total;
    m->name = f.get_str("general.name").value_or("");
    if (m->name.empty()) m->name = path.substr(path.find_last_of('/') + 1);
    m->t_load_ms = now_ms() - t0;
    return m;
}

// --- context ----------------------------------------------------------------------

static int default_threads() {
    const unsigned n = std::thread::hardware_concurrency();
    return n ? int(n) : 1;
}

llama_context::llama_context(const llama_model & m, const smol_context_params & p)
    : model(m), params(p), be_(make_backend(p.device ? p.device : "cpu",
                                            p.n_threads > 0 ? p.n_threads : default_threads())),
      graph_(64 + size_t(m.hp.n_layer) * 32) {
    const llama_hparams & hp = m.hp;
    if (params.n_ctx == 0) params.n_ctx = uint32_t(std::min(4096, hp.n_ctx_train));
    if (params.n_batch == 0) params.n_batch = 512;
    params.n_batch = std::min(params.n_batch, params.n_ctx);
    if (params.n_seq_max == 0) params.n_seq_max = 1;
    if (params.n_seq_max > uint32_t(kv_max_seqs)) {
        throw error(SMOL_ERR_INVALID_ARGUMENT, "n_seq_max " + std::to_string(params.n_seq_max) +
                                                   " is above " + std::to_string(kv_max_seqs) +
                                                   ", the most sequences a KV cell can hold");
    }
    if (params.n_threads <= 0) params.n_threads = default_threads();
    params.device = nullptr; // not kept: the caller owns the string
    if (params.n_ctx > (1u << 24)) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "n_ctx " + std::to_string(params.n_ctx) + " is too large for the CPU cache");
    }
    kv.init(hp.n_layer, hp.n_head_kv, hp.head_dim, int32_t(params.n_ctx));
    for (uint16_t ** half : {&kv.k, &kv.v}) {
        *half = static_cast<uint16_t *>(be_->alloc(kv.bytes_per_tensor()));
        owned_.push_back(*half);
        be_->memset(*half, 0, kv.bytes_per_tensor());
    }
    // Weights stay in the mapped file for the CPU; other backends get a copy.
    auto place = [&](const weight & w) {
        weight c = w;
        c.data = to_backend(w);
        return c;
    };
    tok_embd_ = place(m.tok_embd);
    output_norm_ = place(m.output_norm);
    output_ = m.output.data == m.tok_embd.data ? tok_embd_ : place(m.output);
    for (const llama_layer & L : m.layers) {
        layers_.push_back({place(L.attn_norm), place(L.wq), place(L.wk), place(L.wv), place(L.wo),
                           place(L.ffn_norm), place(L.w_gate), place(L.w_up), place(L.w_down)});
    }
    const size_t nb = params.n_batch;
    tokens_.resize(nb);
    positions_.resize(nb);
    seqs_.resize(nb);
    cells_.resize(nb);
    out_ids_.resize(nb);
    out_row_.resize(nb);
    logits_.resize(size_t(hp.n_vocab));
    // Plan the largest graph once so the arena is sized before the first
    // decode.
    graph_.clear();
    graph_.batch.kv = &kv;
    build_graph(int32_t(nb), 1);
    be_->reserve(graph_);
}

llama_context::~llama_context() {
    for (void * p : owned_) be_->release(p);
}

void * llama_context::to_backend(const weight & w) {
    if (be_->where() == placement::host) return const_cast<void *>(w.data);
    const size_t n = cpu::row_bytes(w.type, w.ne0) * size_t(w.ne1);
    void * p = be_->alloc(n);
    owned_.push_back(p);
    be_->upload(p, w.data, n);
    return p;
}

void llama_context::build_graph(int32_t n, int32_t n_out) {
    const llama_hparams & hp = model.hp;
    graph & g = graph_;
    auto W = [&](const weight & w) {
        tensor * t = g.leaf(w.type, const_cast<void *>(w.data), w.ne0, w.ne1);
        t->where = be_->where();
        return t;
    };
    // Inputs stay in host memory; a device backend copies them in.
    auto ints = [&](std::vector<int32_t> & v, int32_t count) {
        tensor * t = g.new_tensor(SMOL_TYPE_F32, count);
        t->data = v.data(); // int32 ids travel in 4-byte elements
        t->where = placement::host;
        return t;
    };
    tensor * tok = ints(tokens_, n);
    tensor * pos = ints(positions_, n);
    tensor * x = op_get_rows(g, W(tok_embd_), tok);
    for (int l = 0; l < hp.n_layer; ++l) {
        const llama_layer & L = layers_[size_t(l)];
        tensor * cur = op_rms_norm(g, x, W(L.attn_norm), hp.rms_eps);
        tensor * q = op_mul_mat(g, W(L.wq), cur);
        tensor * k = op_mul_mat(g, W(L.wk), cur);
        tensor * v = op_mul_mat(g, W(L.wv), cur);
        q = op_rope(g, q, pos, hp.n_head, hp.head_dim, hp.rope_base);
        k = op_rope(g, k, pos, hp.n_head_kv, hp.head_dim, hp.rope_base);
        tensor * stored = op_kv_store(g, k, v, l);
        tensor * att = op_attention(g, q, stored, l, hp.n_head, hp.n_head_kv, hp.head_dim);
        x = op_add(g, x, op_mul_mat(g, W(L.wo), att));
        cur = op_rms_norm(g, x, W(L.ffn_norm), hp.rms_eps);
        tensor * h = op_swiglu(g, op_mul_mat(g, W(L.w_gate), cur), op_mul_mat(g, W(L.w_up), cur));
        x = op_add(g, x, op_mul_mat(g, W(L.w_down), h));
    }
    if (n_out == 0) return;
    if (n_out < n) x = op_get_rows(g, x, ints(out_ids_, n_out));
    x = op_rms_norm(g, x, W(output_norm_), hp.rms_eps);
    logits_node_ = op_mul_mat(g, W(output_), x);
    if (be_->where() == placement::host) logits_node_->data = logits_.data();
}

void llama_context::decode(const smol_batch & b) {
    const llama_hparams & hp = model.hp;
    const int32_t n = b.n_tokens;
    if (n <= 0 || !b.token || !b.pos || !b.seq_id) {
        throw error(SMOL_ERR_INVALID_ARGUMENT, "smol_decode: the batch is empty");
    }
    if (uint32_t(n) > params.n_batch) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "smol_decode: the batch has " + std::to_string(n) +
                        " tokens, more than n_batch = " + std::to_string(params.n_batch) +
                        "; split it or raise n_batch");
    }
    // Check the whole batch before touching the cache.
    std::vector<smol_pos> & seq_max = seq_max_;
    seq_max.assign(kv_max_seqs, -1);
    for (int32_t c = 0; c < kv.n_used; ++c) {
        if (kv.cell_pos[c] < 0) continue;
        for (seq_mask m = kv.cell_seqs[c]; m; m &= m - 1) {
            const int s = __builtin_ctzll(m);
            seq_max[size_t(s)] = std::max(seq_max[size_t(s)], kv.cell_pos[c]);
        }
    }
    for (int32_t i = 0; i < n; ++i) {
        if (b.token[i] < 0 || b.token[i] >= hp.n_vocab) {
            throw error(SMOL_ERR_INVALID_ARGUMENT,
                        "smol_decode: token " + std::to_string(b.token[i]) + " at batch index " +
                            std::to_string(i) + " is outside the vocabulary [0, " +
                            std::to_string(hp.n_vocab) + ")");
        }
        const smol_seq_id s = b.seq_id[i];
        if (s < 0 || uint32_t(s) >= params.n_seq_max) {
            throw error(SMOL_ERR_INVALID_ARGUMENT, "smol_decode: sequence id " + std::to_string(s) +
                                                       " is outside [0, n_seq_max = " +
                                                       std::to_string(params.n_seq_max) + ")");
        }
        if (b.pos[i] <= seq_max[size_t(s)]) {
            throw error(SMOL_ERR_INVALID_ARGUMENT,
                        "smol_decode: position " + std::to_string(b.pos[i]) + " of sequence " +
                            std::to_string(s) + " does not follow the " +
                            std::to_string(seq_max[size_t(s)]) +
                            " it already holds; remove those positions first (smol_kv_seq_rm)");
        }
        seq_max[size_t(s)] = b.pos[i];
    }
    const int32_t n_free = kv.n_free();
    if (n_free < n) {
        throw error(SMOL_ERR_CONTEXT_FULL,
                    "the KV cache is full: the batch needs " + std::to_string(n) + " cells, " +
                        std::to_string(n_free) + " of n_ctx = " + std::to_string(kv.n_cells) +
                        " are free; raise the context size or drop finished sequences");
    }

    // Assign cells, lowest free first, so one sequence's history stays dense.
    // Without logits flags only the last token's logits are kept.
    int32_t c = 0, n_out = 0;
    for (int32_t i = 0; i < n; ++i) {
        while (kv.cell_pos[c] >= 0) ++c;
        cells_[i] = c;
        kv.cell_pos[c] = b.pos[i];
        kv.cell_seqs[c] = seq_mask(1) << b.seq_id[i];
        kv.n_used = std::max(kv.n_used, c + 1);
        tokens_[i] = b.token[i];
        positions_[i] = b.pos[i];
        seqs_[i] = b.seq_id[i];
        const bool want = b.logits ? b.logits[i] != 0 : i == n - 1;
        out_row_[i] = want ? n_out : -1;
        if (want) out_ids_[n_out++] = i;
    }
    n_last_ = n;
    last_out_ = n_out > 0 ? out_ids_[n_out - 1] : -1;
    if (logits_.size() < size_t(n_out) * hp.n_vocab) logits_.resize(size_t(n_out) * hp.n_vocab);

    list_seq_cells(n);

    const double t0 = now_ms();
    graph_.clear();
    graph_.batch = batch_info{positions_.data(), seqs_.data(),     cells_.data(), n, &kv,
                              seq_cells_.data(), seq_begin_.data()};
    logits_node_ = nullptr;
    build_graph(n, n_out);
    be_->run(graph_);
    if (logits_node_ && logits_node_->data != logits_.data()) {
        be_->download(logits_.data(), logits_node_->data, logits_node_->nbytes());
    }
    const double dt = now_ms() - t0;
    if (n > 1) {
        perf.t_prompt_ms += dt;
        perf.n_prompt_tokens += n;
    } else {
        perf.t_eval_ms += dt;
        perf.n_eval_tokens += n;
    }
}

// Lists, for each sequence of the batch, the cells it holds sorted by
// position (two passes: count, then place; no allocation once warm).
void llama_context::list_seq_cells(int32_t n) {
    seq_mask in_batch = 0;
    for (int32_t i = 0; i < n; ++i) in_batch |= seq_mask(1) << seqs_[i];
    seq_begin_.assign(kv_max_seqs + 1, 0);
    for (int32_t c = 0; c < kv.n_used; ++c) {
        if (kv.cell_pos[c] < 0) continue;
        for (seq_mask m = kv.cell_seqs[c] & in_batch; m; m &= m - 1)
            ++seq_begin_[size_t(__builtin_ctzll(m)) + 1];
    }
    for (int32_t s = 0; s < kv_max_seqs; ++s) seq_begin_[size_t(s) + 1] += seq_begin_[size_t(s)];
    seq_cells_.resize(size_t(std::max(seq_begin_[kv_max_seqs], 1)));
    fill_.assign(seq_begin_.begin(), seq_begin_.end() - 1);
    for (int32_t c = 0; c < kv.n_used; ++c) {
        if (kv.cell_pos[c] < 0) continue;
        for (seq_mask m = kv.cell_seqs[c] & in_batch; m; m &= m - 1)
            seq_cells_[size_t(fill_[size_t(__builtin_ctzll(m))]++)] = c;
    }
    // Cells are handed out lowest first, so a list is usually sorted already.
    const auto by_pos = [this](int32_t x, int32_t y) { return kv.cell_pos[x] < kv.cell_pos[y]; };
    for (int32_t s = 0; s < kv_max_seqs; ++s) {
        int32_t * b = seq_cells_.data() + seq_begin_[size_t(s)];
        int32_t * e = seq_cells_.data() + seq_begin_[size_t(s) + 1];
        if (!std::is_sorted(b, e, by_pos)) std::sort(b, e, by_pos);
    }
}

const float * llama_context::logits(int32_t i) const {
    if (i < 0) i = last_out_;
    if (i < 0 || i >= n_last_ || out_row_[size_t(i)] < 0) return nullptr;
    return logits_.data() + size_t(out_row_[size_t(i)]) * size_t(model.hp.n_vocab);
}

} // namespace smol
