// smol-llama-load.c++ - loads a Llama-architecture (or Gemma 3) GGUF: the
// hyper-parameters from its metadata, the weights in place in the mapped
// file, checked against them, and the tokenizer and chat template.

#include "smol-error.h"
#include "smol-llama.h"
#include "smol-quant.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

namespace smol {

namespace {

bool supported_type(uint32_t t) {
    return t <= uint32_t(INT32_MAX) && traits_of(smol_type(int32_t(t))) != nullptr;
}

// "f32, f16, bf16, q4_0, ...": the types smol loads, for messages.
std::string supported_type_names() {
    std::string out;
    for (uint32_t t = 0; t < 64; ++t) {
        if (!supported_type(t)) continue;
        out += (out.empty() ? "" : ", ") + std::string(traits_of(smol_type(t))->name);
    }
    return out;
}

// The tensors of one layer: two norms, q, k, v, the output, gate, up, down.
constexpr size_t llama_layer_tensors = 9;

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
                                         : "yet (" + supported_type_names() + ")") +
                            "; convert the model with smol-quantize to a supported type");
        }
        return weight{smol_type(t->type), t->ne[0], t->ne[1], t->data};
    }
};

} // namespace

std::unique_ptr<llama_model> llama_model::load(const std::string & path,
                                               const smol_model_params & params) {
    const auto t0 = std::chrono::steady_clock::now();
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
    llama_hparams & hp = m->hp;
    if (arch == "llama") {
        hp.arch = llama_arch::llama;
    } else if (arch == "gemma3") {
        hp.arch = llama_arch::gemma3;
    } else {
        throw error(SMOL_ERR_UNSUPPORTED,
                    path + ": architecture '" + arch +
                        "' is not supported; smol runs the llama (SmolLM2, Llama 2/3 shapes) "
                        "and gemma3 (Gemma 3) architectures");
    }
    const bool gemma = hp.arch == llama_arch::gemma3;
    const std::string a = arch + ".";
    try {
        hp.n_layer = ld.req_int(a + "block_count");
        hp.n_ctx_train = ld.req_int(a + "context_length");
        hp.n_embd = ld.req_int(a + "embedding_length");
        hp.n_ff = ld.req_int(a + "feed_forward_length");
        hp.n_head = ld.req_int(a + "attention.head_count");
        hp.n_head_kv = f.get_i64(a + "attention.head_count_kv")
                           ? ld.req_int(a + "attention.head_count_kv")
                           : hp.n_head;
        hp.rope_base = float(f.get_f64(a + "rope.freq_base").value_or(10000.0));
        hp.rms_eps = float(f.get_f64(a + "attention.layer_norm_rms_epsilon").value_or(1e-5));
        if (const auto scaling = f.get_str(a + "rope.scaling.type");
            scaling && *scaling != "none" && *scaling != "") {
            throw error(SMOL_ERR_UNSUPPORTED,
                        path + ": RoPE scaling '" + *scaling + "' is not supported yet");
        }
        hp.head_dim = f.get_i64(a + "attention.key_length") ? ld.req_int(a + "attention.key_length")
                                                            : hp.n_embd / hp.n_head;
        if (const auto vl = f.get_i64(a + "attention.value_length"); vl && *vl != hp.head_dim) {
            throw error(SMOL_ERR_UNSUPPORTED,
                        path + ": value heads of " + std::to_string(*vl) + " and key heads of " +
                            std::to_string(hp.head_dim) + " differ; smol needs them equal");
        }
        if (gemma) {
            if (const auto cap = f.get_f64(a + "final_logit_softcapping"); cap && *cap != 0) {
                throw error(SMOL_ERR_UNSUPPORTED,
                            path + ": final logit soft-capping is not supported yet");
            }
            hp.embd_scale = std::sqrt(float(hp.n_embd));
            // As llama.cpp: 1/sqrt(head size), but for the 62-layer 27B model.
            hp.attn_scale = hp.n_layer == 62 ? 1.0f / std::sqrt(float(hp.n_embd / hp.n_head))
                                             : 1.0f / std::sqrt(float(hp.head_dim));
            hp.n_swa = int32_t(f.get_i64(a + "attention.sliding_window").value_or(0));
            hp.rope_base_swa = float(f.get_f64(a + "rope.freq_base_swa").value_or(10000.0));
            if (hp.n_swa < 0) {
                throw error(SMOL_ERR_FORMAT, path + ": " + a + "attention.sliding_window is " +
                                                 std::to_string(hp.n_swa));
            }
            // Five local layers, then a global one, unless the file says
            // otherwise (a period, or a list of flags).
            hp.swa.assign(size_t(hp.n_layer), false);
            const std::string pattern = a + "attention.sliding_window_pattern";
            const gguf::value * pv = f.find(pattern);
            const bool listed = pv && pv->t == gguf::type::ARRAY;
            const auto * flags = listed ? f.get_array(pattern, gguf::type::BOOL) : nullptr;
            const int64_t period = listed ? 0 : f.get_i64(pattern).value_or(6);
            if (period < 0) {
                throw error(SMOL_ERR_FORMAT,
                            path + ": " + pattern + " is " + std::to_string(period));
            }
            if (flags && int64_t(flags->size()) != hp.n_layer) {
                throw error(SMOL_ERR_FORMAT, path + ": " + a +
                                                 "attention.sliding_window_pattern lists " +
                                                 std::to_string(flags->size()) + " layers of " +
                                                 std::to_string(hp.n_layer));
            }
            for (int32_t l = 0; hp.n_swa > 0 && l < hp.n_layer; ++l) {
                hp.swa[size_t(l)] =
                    flags ? (*flags)[size_t(l)].b : period == 0 || (l % period < period - 1);
            }
        }
    } catch (const gguf::error & e) {
        throw error(SMOL_ERR_FORMAT, e.what());
    }
    const size_t layer_tensors = gemma ? 13 : llama_layer_tensors;
    // Memory is sized from the layer count below: check it against what the
    // file holds first, since each layer needs tensors of its own.
    if (const size_t n_tensors = f.tensors().size();
        size_t(hp.n_layer) > n_tensors / layer_tensors) {
        throw error(SMOL_ERR_FORMAT, path + ": " + a + "block_count is " +
                                         std::to_string(hp.n_layer) + ", but the file holds " +
                                         std::to_string(n_tensors) +
                                         " tensors, too few for that many layers of " +
                                         std::to_string(layer_tensors) +
                                         " each; the file is truncated or its metadata is wrong");
    }
    if (hp.n_head % hp.n_head_kv != 0 || (!gemma && hp.n_embd % hp.n_head != 0)) {
        throw error(SMOL_ERR_FORMAT, path + ": " + std::to_string(hp.n_head) + " heads over " +
                                         std::to_string(hp.n_head_kv) + " kv heads and width " +
                                         std::to_string(hp.n_embd) + " do not divide evenly");
    }
    const int64_t rope_dims = f.get_i64(a + "rope.dimension_count").value_or(hp.head_dim);
    if (rope_dims != hp.head_dim || hp.head_dim % 2 != 0 || hp.head_dim > 1024) {
        throw error(SMOL_ERR_UNSUPPORTED, path + ": rotary dimension " + std::to_string(rope_dims) +
                                              " with head size " + std::to_string(hp.head_dim) +
                                              " is not supported (smol rotates whole, even heads)");
    }

    try {
        m->vocab.load(f);
        const auto tmpl = f.get_str("tokenizer.chat_template");
        // Templates print the bos and eos tokens' texts (transformers passes
        // them as bos_token and eos_token).
        const auto text_of = [&](smol_token t) {
            return t >= 0 ? m->vocab.token_to_piece(t, true) : std::string();
        };
        m->chat = chat_template(tmpl.value_or(""), tmpl.has_value(), text_of(m->vocab.bos()),
                                text_of(m->vocab.eos()));
    } catch (const gguf::error & e) {
        throw error(SMOL_ERR_FORMAT, e.what());
    }
    hp.n_vocab = m->vocab.n_tokens();

    const int64_t E = hp.n_embd, Q = int64_t(hp.n_head) * hp.head_dim,
                  KV = int64_t(hp.n_head_kv) * hp.head_dim;
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
        L.wq = ld.get(p + "attn_q.weight", E, Q);
        L.wk = ld.get(p + "attn_k.weight", E, KV);
        L.wv = ld.get(p + "attn_v.weight", E, KV);
        L.wo = ld.get(p + "attn_output.weight", Q, E);
        L.ffn_norm = ld.get(p + "ffn_norm.weight", E, 1, true);
        L.w_gate = ld.get(p + "ffn_gate.weight", E, hp.n_ff);
        L.w_up = ld.get(p + "ffn_up.weight", E, hp.n_ff);
        L.w_down = ld.get(p + "ffn_down.weight", hp.n_ff, E);
        if (gemma) {
            L.q_norm = ld.get(p + "attn_q_norm.weight", hp.head_dim, 1, true);
            L.k_norm = ld.get(p + "attn_k_norm.weight", hp.head_dim, 1, true);
            L.post_attn_norm = ld.get(p + "post_attention_norm.weight", E, 1, true);
            L.post_ffw_norm = ld.get(p + "post_ffw_norm.weight", E, 1, true);
        }
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
    m->t_load_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return m;
}

} // namespace smol
