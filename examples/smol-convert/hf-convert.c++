// hf-convert.c++ - see hf-convert.h. Tensors are written in
// convert_hf_to_gguf's order (shards by file name, tensors by name within
// each), metadata in its order, for the types it writes (f32, f16, bf16,
// q8_0); the other quantized types are laid out as llama-quantize lays out
// its requantization of an f32 file. Each tensor's rows are produced while
// the file is written (read from the mapping, permuted, converted), so a
// model never sits in memory twice.

#include "hf-convert.h"

#include "hf-tokenizer.h"
#include "smol-cpu-kernels.h"
#include "smol-quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <thread>

namespace smol::convert {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// --- config.json ---------------------------------------------------------

struct llama_config {
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, head_dim, n_ctx;
    double eps, rope_theta;
    bool tied;
};

int64_t need_int(const json & c, const std::string & path, const char * key) {
    if (!c.contains(key))
        throw convert_error(path + ": " + key + " is missing (the model's sizes need it)");
    if (!c[key].is_number_integer() || c[key].get<int64_t>() <= 0)
        throw convert_error(path + ": " + key + " is " + c[key].dump() +
                            ", not a positive integer");
    return c[key].get<int64_t>();
}

int64_t opt_int(const json & c, const std::string & path, const char * key, int64_t def) {
    if (!c.contains(key) || c[key].is_null()) return def;
    return need_int(c, path, key);
}

double opt_num(const json & c, const std::string & path, const char * key, double def) {
    if (!c.contains(key) || c[key].is_null()) return def;
    if (!c[key].is_number() || !(c[key].get<double>() > 0))
        throw convert_error(path + ": " + key + " is " + c[key].dump() + ", not a positive number");
    return c[key].get<double>();
}

// Where HF's LlamaConfig has a default, the default (as transformers fills
// it in for convert_hf_to_gguf); the sizes every tensor depends on must be
// given.
llama_config read_llama_config(const json & c, const std::string & path) {
    llama_config m{};
    m.n_embd = need_int(c, path, "hidden_size");
    m.n_layer = need_int(c, path, "num_hidden_layers");
    m.n_head = need_int(c, path, "num_attention_heads");
    m.n_ff = need_int(c, path, "intermediate_size");
    m.n_vocab = need_int(c, path, "vocab_size");
    m.n_head_kv = opt_int(c, path, "num_key_value_heads", m.n_head);
    m.n_ctx = opt_int(c, path, "max_position_embeddings", 2048);
    m.eps = opt_num(c, path, "rms_norm_eps", 1e-6);
    m.rope_theta = opt_num(c, path, "rope_theta", 10000.0);
    if (c.contains("head_dim") && !c["head_dim"].is_null()) {
        m.head_dim = need_int(c, path, "head_dim");
    } else {
        if (m.n_embd % m.n_head != 0)
            throw convert_error(path + ": hidden_size " + std::to_string(m.n_embd) +
                                " is not divisible by num_attention_heads " +
                                std::to_string(m.n_head) + " (and there is no head_dim)");
        m.head_dim = m.n_embd / m.n_head;
    }
    if (m.head_dim % 2 != 0)
        throw convert_error(path + ": the head size " + std::to_string(m.head_dim) +
                            " is odd; RoPE rotates pairs");
    if (m.n_head % m.n_head_kv != 0)
        throw convert_error(path + ": num_attention_heads " + std::to_string(m.n_head) +
                            " is not divisible by num_key_value_heads " +
                            std::to_string(m.n_head_kv));
    if (c.contains("tie_word_embeddings") && !c["tie_word_embeddings"].is_boolean())
        throw convert_error(path + ": tie_word_embeddings is not true or false");
    m.tied = c.value("tie_word_embeddings", false);
    const std::string act = c.value("hidden_act", std::string("silu"));
    if (act != "silu")
        throw convert_error(path + ": hidden_act \"" + act + "\" is not supported (silu is)");
    for (const char * key : {"attention_bias", "mlp_bias"}) {
        if (c.contains(key) && c[key].is_boolean() && c[key].get<bool>())
            throw convert_error(path + ": " + key + " is true; biases are not supported");
    }
    for (const char * key : {"rope_scaling", "rope_parameters"}) {
        if (!c.contains(key) || c[key].is_null()) continue;
        const json & r = c[key];
        const std::string type = r.is_object() ? r.value("rope_type", r.value("type", "")) : "";
        if (type != "default")
            throw convert_error(path + ": " + key + " " + r.dump().substr(0, 120) +
                                " is not supported (only plain RoPE is)");
    }
    return m;
}

// Gemma3ForCausalLM's config.json (Gemma3TextConfig), its defaults where
// transformers has them, as convert_hf_to_gguf reads it through AutoConfig.
struct gemma3_config {
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, head_dim, n_ctx, n_swa;
    double eps, rope_theta, rope_local, softcap, linear_factor; // 0: none
    bool write_swa, tied;
};

gemma3_config read_gemma3_config(const json & c, const std::string & path) {
    gemma3_config m{};
    m.n_embd = need_int(c, path, "hidden_size");
    m.n_layer = need_int(c, path, "num_hidden_layers");
    m.n_ff = need_int(c, path, "intermediate_size");
    m.n_vocab = need_int(c, path, "vocab_size");
    m.n_head = opt_int(c, path, "num_attention_heads", 8);
    m.n_head_kv = opt_int(c, path, "num_key_value_heads", 4);
    m.head_dim = opt_int(c, path, "head_dim", 256);
    m.n_ctx = opt_int(c, path, "max_position_embeddings", 131072);
    m.n_swa = opt_int(c, path, "sliding_window", 4096);
    m.eps = opt_num(c, path, "rms_norm_eps", 1e-6);
    m.rope_theta = opt_num(c, path, "rope_theta", 1000000.0);
    m.rope_local = opt_num(c, path, "rope_local_base_freq", 10000.0);
    m.softcap = opt_num(c, path, "final_logit_softcapping", 0.0);
    if (m.n_head % m.n_head_kv != 0)
        throw convert_error(path + ": num_attention_heads " + std::to_string(m.n_head) +
                            " is not divisible by num_key_value_heads " +
                            std::to_string(m.n_head_kv));
    // Gemma 3 dropped attention soft-capping; llama.cpp's converter
    // insists on its absence.
    if (c.contains("attn_logit_softcapping") && !c["attn_logit_softcapping"].is_null())
        throw convert_error(path + ": attn_logit_softcapping is set; Gemma 3 has none");
    m.write_swa =
        !(c.contains("sliding_window_pattern") && c["sliding_window_pattern"].is_number_integer() &&
          c["sliding_window_pattern"].get<int64_t>() == 1);
    if (c.contains("tie_word_embeddings") && !c["tie_word_embeddings"].is_boolean())
        throw convert_error(path + ": tie_word_embeddings is not true or false");
    m.tied = c.value("tie_word_embeddings", true);
    const char * act_key = c.contains("hidden_activation") ? "hidden_activation" : "hidden_act";
    const std::string act = c.contains(act_key) && c[act_key].is_string()
                                ? c[act_key].get<std::string>()
                                : "gelu_pytorch_tanh";
    if (act != "gelu_pytorch_tanh")
        throw convert_error(path + ": " + act_key + " \"" + act +
                            "\" is not supported (gelu_pytorch_tanh is)");
    if (c.contains("attention_bias") && c["attention_bias"].is_boolean() &&
        c["attention_bias"].get<bool>())
        throw convert_error(path + ": attention_bias is true; biases are not supported");
    if (c.contains("rope_parameters") && !c["rope_parameters"].is_null())
        throw convert_error(path + ": rope_parameters is not supported (rope_theta, "
                                   "rope_local_base_freq and rope_scaling are)");
    if (c.contains("rope_scaling") && !c["rope_scaling"].is_null()) {
        const json & r = c["rope_scaling"];
        const std::string type = r.is_object() ? r.value("rope_type", r.value("type", "")) : "";
        if (type == "linear" && r.contains("factor") && r["factor"].is_number()) {
            m.linear_factor = r["factor"].get<double>();
        } else if (type != "default") {
            throw convert_error(path + ": rope_scaling " + r.dump().substr(0, 120) +
                                " is not supported (linear scaling is)");
        }
    }
    return m;
}

// --- tensors -------------------------------------------------------------

// A tensor the model needs: its GGUF name and shape (fastest first), the
// config fields its shape follows from, and the heads whose rows a RoPE
// permutation groups (0: none).
struct wanted {
    std::string gguf_name;
    std::vector<int64_t> ne;
    std::string because;
    int64_t permute_heads = 0;
    bool plus_one = false; // Gemma's norms: HF scales by 1 + w, GGUF by w
};

std::map<std::string, wanted> llama_tensors(const llama_config & m) {
    const std::string E = "hidden_size " + std::to_string(m.n_embd);
    const std::string V = "vocab_size " + std::to_string(m.n_vocab);
    const std::string F = "intermediate_size " + std::to_string(m.n_ff);
    const std::string Q = "num_attention_heads " + std::to_string(m.n_head) + " x head size " +
                          std::to_string(m.head_dim);
    const std::string K = "num_key_value_heads " + std::to_string(m.n_head_kv) + " x head size " +
                          std::to_string(m.head_dim);
    const int64_t q = m.n_head * m.head_dim, kv = m.n_head_kv * m.head_dim;
    std::map<std::string, wanted> t;
    t["model.embed_tokens.weight"] = {"token_embd.weight", {m.n_embd, m.n_vocab}, V + ", " + E};
    t["model.norm.weight"] = {"output_norm.weight", {m.n_embd}, E};
    if (!m.tied) t["lm_head.weight"] = {"output.weight", {m.n_embd, m.n_vocab}, V + ", " + E};
    for (int64_t l = 0; l < m.n_layer; ++l) {
        const std::string hf = "model.layers." + std::to_string(l) + ".";
        const std::string gg = "blk." + std::to_string(l) + ".";
        t[hf + "input_layernorm.weight"] = {gg + "attn_norm.weight", {m.n_embd}, E};
        t[hf + "self_attn.q_proj.weight"] = {
            gg + "attn_q.weight", {m.n_embd, q}, Q + ", " + E, m.n_head};
        t[hf + "self_attn.k_proj.weight"] = {
            gg + "attn_k.weight", {m.n_embd, kv}, K + ", " + E, m.n_head_kv};
        t[hf + "self_attn.v_proj.weight"] = {gg + "attn_v.weight", {m.n_embd, kv}, K + ", " + E};
        t[hf + "self_attn.o_proj.weight"] = {
            gg + "attn_output.weight", {q, m.n_embd}, Q + ", " + E};
        t[hf + "post_attention_layernorm.weight"] = {gg + "ffn_norm.weight", {m.n_embd}, E};
        t[hf + "mlp.gate_proj.weight"] = {gg + "ffn_gate.weight", {m.n_embd, m.n_ff}, F + ", " + E};
        t[hf + "mlp.up_proj.weight"] = {gg + "ffn_up.weight", {m.n_embd, m.n_ff}, F + ", " + E};
        t[hf + "mlp.down_proj.weight"] = {gg + "ffn_down.weight", {m.n_ff, m.n_embd}, F + ", " + E};
    }
    return t;
}

std::map<std::string, wanted> gemma3_tensors(const gemma3_config & m) {
    const std::string E = "hidden_size " + std::to_string(m.n_embd);
    const std::string V = "vocab_size " + std::to_string(m.n_vocab);
    const std::string F = "intermediate_size " + std::to_string(m.n_ff);
    const std::string D = "head_dim " + std::to_string(m.head_dim);
    const std::string Q = "num_attention_heads " + std::to_string(m.n_head) + " x " + D;
    const std::string K = "num_key_value_heads " + std::to_string(m.n_head_kv) + " x " + D;
    const int64_t q = m.n_head * m.head_dim, kv = m.n_head_kv * m.head_dim;
    std::map<std::string, wanted> t;
    t["model.embed_tokens.weight"] = {"token_embd.weight", {m.n_embd, m.n_vocab}, V + ", " + E};
    t["model.norm.weight"] = {"output_norm.weight", {m.n_embd}, E, 0, true};
    if (!m.tied) t["lm_head.weight"] = {"output.weight", {m.n_embd, m.n_vocab}, V + ", " + E};
    for (int64_t l = 0; l < m.n_layer; ++l) {
        const std::string hf = "model.layers." + std::to_string(l) + ".";
        const std::string gg = "blk." + std::to_string(l) + ".";
        t[hf + "input_layernorm.weight"] = {gg + "attn_norm.weight", {m.n_embd}, E, 0, true};
        t[hf + "post_attention_layernorm.weight"] = {
            gg + "post_attention_norm.weight", {m.n_embd}, E, 0, true};
        t[hf + "pre_feedforward_layernorm.weight"] = {
            gg + "ffn_norm.weight", {m.n_embd}, E, 0, true};
        t[hf + "post_feedforward_layernorm.weight"] = {
            gg + "post_ffw_norm.weight", {m.n_embd}, E, 0, true};
        t[hf + "self_attn.q_norm.weight"] = {gg + "attn_q_norm.weight", {m.head_dim}, D, 0, true};
        t[hf + "self_attn.k_norm.weight"] = {gg + "attn_k_norm.weight", {m.head_dim}, D, 0, true};
        t[hf + "self_attn.q_proj.weight"] = {gg + "attn_q.weight", {m.n_embd, q}, Q + ", " + E};
        t[hf + "self_attn.k_proj.weight"] = {gg + "attn_k.weight", {m.n_embd, kv}, K + ", " + E};
        t[hf + "self_attn.v_proj.weight"] = {gg + "attn_v.weight", {m.n_embd, kv}, K + ", " + E};
        t[hf + "self_attn.o_proj.weight"] = {
            gg + "attn_output.weight", {q, m.n_embd}, Q + ", " + E};
        t[hf + "mlp.gate_proj.weight"] = {gg + "ffn_gate.weight", {m.n_embd, m.n_ff}, F + ", " + E};
        t[hf + "mlp.up_proj.weight"] = {gg + "ffn_up.weight", {m.n_embd, m.n_ff}, F + ", " + E};
        t[hf + "mlp.down_proj.weight"] = {gg + "ffn_down.weight", {m.n_ff, m.n_embd}, F + ", " + E};
    }
    return t;
}

std::string shape_text(const std::vector<int64_t> & s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

// The shards to read: those model.safetensors.index.json names (checked
// against what they hold), or model.safetensors.
std::vector<std::unique_ptr<st_file>> open_shards(const std::string & dir) {
    const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
    const fs::path single = fs::path(dir) / "model.safetensors";
    std::vector<std::unique_ptr<st_file>> shards;
    if (!fs::exists(index_path)) {
        if (!fs::exists(single))
            throw convert_error(dir + ": has neither model.safetensors nor "
                                      "model.safetensors.index.json (only safetensors "
                                      "checkpoints are read)");
        shards.push_back(st_file::open(single.string()));
        return shards;
    }
    const std::string ip = index_path.string();
    const json index = read_json(ip, true);
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
        throw convert_error(ip + ": weight_map is missing or not an object");
    std::set<std::string> names;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
        if (!it->is_string())
            throw convert_error(ip + ": weight_map gives tensor '" + it.key() +
                                "' a shard that is not a file name");
        const std::string shard = it->get<std::string>();
        if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
            throw convert_error(ip + ": weight_map names shard '" + shard +
                                "', not a file of the directory");
        names.insert(shard);
    }
    for (const std::string & n : names) {
        const fs::path p = fs::path(dir) / n;
        if (!fs::exists(p))
            throw convert_error(ip + ": weight_map names shard '" + n +
                                "', which is missing from " + dir);
        shards.push_back(st_file::open(p.string()));
    }
    // Each tensor in the shard the index says, and nothing the index omits.
    for (const auto & s : shards) {
        for (const st_tensor & t : s->tensors()) {
            if (!index["weight_map"].contains(t.name))
                throw convert_error(ip + ": weight_map does not name tensor '" + t.name +
                                    "', which " + s->path() + " holds");
        }
    }
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
        const std::string shard = it->get<std::string>();
        bool found = false;
        for (const auto & s : shards) {
            if (fs::path(s->path()).filename() != shard) continue;
            for (const st_tensor & t : s->tensors()) found = found || t.name == it.key();
        }
        if (!found)
            throw convert_error(ip + ": weight_map puts tensor '" + it.key() + "' in " + shard +
                                ", which does not hold it (an incomplete download?)");
    }
    return shards;
}

// gguf-py's size label: the parameter count to two significant digits or
// more, "135M", "6.7M", "1.7B".
std::string size_label(uint64_t n) {
    double x;
    const char * suffix;
    if (double(n) > 1e12) {
        x = double(n) * 1e-12;
        suffix = "T";
    } else if (double(n) > 1e9) {
        x = double(n) * 1e-9;
        suffix = "B";
    } else if (double(n) > 1e6) {
        x = double(n) * 1e-6;
        suffix = "M";
    } else {
        x = double(n) * 1e-3;
        suffix = "K";
    }
    std::string digits = std::to_string(int64_t(std::nearbyint(x)));
    digits.erase(0, digits.find_first_not_of('0'));
    const int fix = std::max(2 - int(digits.size()), 0);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f%s", fix, x, suffix);
    return buf;
}

// generation_config.json's sampling settings as general.sampling.*, in
// gguf-py's order and types (Metadata.load, set_gguf_meta_model).
void add_sampling(gguf::writer & w, const std::string & path) {
    const json g = read_json(path, false);
    if (!g.is_object()) return;
    struct field {
        const char * json_key;
        const char * alt; // a second name for the same setting, or null
        const char * gguf_key;
        char kind; // 's' string, 'i' int32, 'f' float32
    };
    static const field fields[] = {
        {"sequence", nullptr, "general.sampling.sequence", 's'},
        {"top_k", nullptr, "general.sampling.top_k", 'i'},
        {"top_p", nullptr, "general.sampling.top_p", 'f'},
        {"min_p", nullptr, "general.sampling.min_p", 'f'},
        {"xtc_probability", nullptr, "general.sampling.xtc_probability", 'f'},
        {"xtc_threshold", nullptr, "general.sampling.xtc_threshold", 'f'},
        {"temperature", nullptr, "general.sampling.temp", 'f'},
        {"penalty_last_n", nullptr, "general.sampling.penalty_last_n", 'i'},
        {"penalty_repeat", "repetition_penalty", "general.sampling.penalty_repeat", 'f'},
        {"mirostat", nullptr, "general.sampling.mirostat", 'i'},
        {"mirostat_tau", nullptr, "general.sampling.mirostat_tau", 'f'},
        {"mirostat_eta", nullptr, "general.sampling.mirostat_eta", 'f'},
    };
    for (const field & f : fields) {
        const char * key = f.json_key;
        if ((!g.contains(key) || g[key].is_null()) && f.alt) key = f.alt;
        if (!g.contains(key) || g[key].is_null()) continue;
        const json & v = g[key];
        if (f.kind == 's' && v.is_string()) {
            w.set(f.gguf_key, gguf::value::make_str(v.get<std::string>()));
        } else if (f.kind == 'i' && v.is_number_integer()) {
            w.set(f.gguf_key, gguf::value::make_i32(v.get<int32_t>()));
        } else if (f.kind == 'f' && v.is_number()) {
            w.set(f.gguf_key, gguf::value::make_f32(v.get<float>()));
        } else {
            throw convert_error(path + ": " + key + " is " + v.dump().substr(0, 60) + ", not " +
                                (f.kind == 's'   ? "a string"
                                 : f.kind == 'i' ? "an integer"
                                                 : "a number"));
        }
    }
}

// The hyperparameters convert_hf_to_gguf writes for Llama (TextModel's,
// then LlamaModel's), file type included unless to is null (a requantized
// file has it at the end).
void add_llama_params(gguf::writer & w, const llama_config & m, const smol::recipe * to) {
    using gguf::value;
    w.set("llama.block_count", value::make_u32(uint32_t(m.n_layer)));
    w.set("llama.context_length", value::make_u32(uint32_t(m.n_ctx)));
    w.set("llama.embedding_length", value::make_u32(uint32_t(m.n_embd)));
    w.set("llama.feed_forward_length", value::make_u32(uint32_t(m.n_ff)));
    w.set("llama.attention.head_count", value::make_u32(uint32_t(m.n_head)));
    w.set("llama.attention.head_count_kv", value::make_u32(uint32_t(m.n_head_kv)));
    w.set("llama.rope.freq_base", value::make_f32(float(m.rope_theta)));
    w.set("llama.attention.layer_norm_rms_epsilon", value::make_f32(float(m.eps)));
    w.set("llama.attention.key_length", value::make_u32(uint32_t(m.head_dim)));
    w.set("llama.attention.value_length", value::make_u32(uint32_t(m.head_dim)));
    if (to) w.set("general.file_type", value::make_u32(to->ftype));
    w.set("llama.vocab_size", value::make_u32(uint32_t(m.n_vocab)));
    w.set("llama.rope.dimension_count", value::make_u32(uint32_t(m.head_dim)));
}

// Gemma3Model's: TextModel's keys in their order (Gemma3Model overwrites
// some in place), then the soft-cap and the window.
void add_gemma3_params(gguf::writer & w, const gemma3_config & g, const smol::recipe * to) {
    using gguf::value;
    w.set("gemma3.block_count", value::make_u32(uint32_t(g.n_layer)));
    w.set("gemma3.context_length", value::make_u32(uint32_t(g.n_ctx)));
    w.set("gemma3.embedding_length", value::make_u32(uint32_t(g.n_embd)));
    w.set("gemma3.feed_forward_length", value::make_u32(uint32_t(g.n_ff)));
    w.set("gemma3.attention.head_count", value::make_u32(uint32_t(g.n_head)));
    w.set("gemma3.attention.head_count_kv", value::make_u32(uint32_t(g.n_head_kv)));
    if (g.linear_factor > 0) {
        w.set("gemma3.rope.scaling.type", value::make_str("linear"));
        w.set("gemma3.rope.scaling.factor", value::make_f32(float(g.linear_factor)));
    }
    w.set("gemma3.rope.freq_base", value::make_f32(float(g.rope_theta)));
    w.set("gemma3.rope.freq_base_swa", value::make_f32(float(g.rope_local)));
    w.set("gemma3.attention.layer_norm_rms_epsilon", value::make_f32(float(g.eps)));
    w.set("gemma3.attention.key_length", value::make_u32(uint32_t(g.head_dim)));
    w.set("gemma3.attention.value_length", value::make_u32(uint32_t(g.head_dim)));
    if (to) w.set("general.file_type", value::make_u32(to->ftype));
    if (g.softcap > 0) w.set("gemma3.final_logit_softcapping", value::make_f32(float(g.softcap)));
    if (g.write_swa) w.set("gemma3.attention.sliding_window", value::make_u32(uint32_t(g.n_swa)));
}

struct planned {
    const st_tensor * src;
    wanted want;
    smol_type type;
    bool fell_back;
};

smol_type smol_type_of(st_dtype t) {
    switch (t) {
    case st_dtype::F32:
        return SMOL_TYPE_F32;
    case st_dtype::F16:
        return SMOL_TYPE_F16;
    case st_dtype::BF16:
        return SMOL_TYPE_BF16;
    }
    return SMOL_TYPE_F32;
}

void to_f32(st_dtype t, const uint8_t * src, float * dst, int64_t n) {
    if (t == st_dtype::F32) {
        std::memcpy(dst, src, size_t(n) * 4);
        return;
    }
    for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = t == st_dtype::F16 ? cpu::fp16_to_fp32(h) : cpu::bf16_to_fp32(h);
    }
}

// Gemma's 1 + w as torch computes it in convert_hf_to_gguf: bf16 is widened
// to f32 first, f16 is added to in f16 (one rounding to f16).
void add_one(st_dtype t, float * x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        x[i] += 1.0f;
        if (t == st_dtype::F16) x[i] = cpu::fp16_to_fp32(cpu::fp32_to_fp16(x[i]));
    }
}

} // namespace

std::string supported_architectures() {
    return "LlamaForCausalLM, Gemma3ForCausalLM";
}

summary convert_model(const options & o) {
    const std::string dir = o.model_dir;
    if (!fs::is_directory(dir))
        throw convert_error(dir + ": is not a directory (give a Hugging Face model directory)");
    const std::string cfg_path = (fs::path(dir) / "config.json").string();
    const json config = read_json(cfg_path, true);
    summary sum;
    if (!config.contains("architectures") || !config["architectures"].is_array() ||
        config["architectures"].empty() || !config["architectures"][0].is_string())
        throw convert_error(cfg_path + ": architectures is missing or not a list of names");
    sum.architecture = config["architectures"][0].get<std::string>();
    const bool gemma = sum.architecture == "Gemma3ForCausalLM";
    if (sum.architecture != "LlamaForCausalLM" && !gemma)
        throw convert_error(cfg_path + ": architectures names \"" + sum.architecture +
                            "\", which smol-convert does not convert (it converts " +
                            supported_architectures() + ")");
    // The sizes both families share, for the tensor checks and type choice.
    llama_config m{};
    gemma3_config g{};
    if (gemma) {
        g = read_gemma3_config(config, cfg_path);
        m.n_embd = g.n_embd;
        m.n_layer = g.n_layer;
        m.n_head = g.n_head;
        m.n_head_kv = g.n_head_kv;
        m.n_vocab = g.n_vocab;
        m.tied = g.tied;
    } else {
        m = read_llama_config(config, cfg_path);
    }
    // Gemma's tokenizer is SentencePiece; without tokenizer.model llama.cpp
    // reads tokenizer.json as byte-level BPE, which Gemma's is not.
    if (gemma && !fs::exists(fs::path(dir) / "tokenizer.model"))
        throw convert_error((fs::path(dir) / "tokenizer.model").string() +
                            ": is missing; smol-convert reads a Gemma 3 tokenizer from it "
                            "(SentencePiece), and tokenizer.json alone is not supported");
    const smol::recipe & to = o.to ? *o.to : *smol::find_recipe("F16");

    // Every tensor accounted for, of the shape config.json implies.
    const auto shards = open_shards(dir);
    std::map<std::string, wanted> want = gemma ? gemma3_tensors(g) : llama_tensors(m);
    std::map<std::string, std::string> seen; // hf name -> file
    std::vector<planned> plan;
    for (const auto & s : shards) {
        for (const st_tensor & t : s->tensors()) {
            if (seen.count(t.name))
                throw convert_error(s->path() + ": tensor '" + t.name + "' is also in " +
                                    seen[t.name]);
            seen[t.name] = s->path();
            if (m.tied && t.name == "lm_head.weight") continue; // tied: the embeddings serve
            if (t.name.size() > 20 &&
                t.name.compare(t.name.size() - 20, 20, ".rotary_emb.inv_freq") == 0)
                continue;
            const auto w = want.find(t.name);
            if (w == want.end())
                throw convert_error(
                    s->path() + ": tensor '" + t.name + "' is not one of a " + sum.architecture +
                    " of config.json's "
                    "num_hidden_layers " +
                    std::to_string(m.n_layer) + " (or its layout is not supported)");
            std::vector<int64_t> expect(w->second.ne.rbegin(), w->second.ne.rend());
            if (t.shape != expect)
                throw convert_error(s->path() + ": tensor '" + t.name + "' has shape " +
                                    shape_text(t.shape) + " but config.json (" + w->second.because +
                                    ") makes it " + shape_text(expect));
            plan.push_back({&t, w->second, SMOL_TYPE_F32, false});
        }
    }
    for (const auto & [name, unused] : want) {
        if (!seen.count(name))
            throw convert_error(
                dir + ": tensor '" + name + "' is missing from the checkpoint" +
                (name == "lm_head.weight"
                     ? " (config.json's tie_word_embeddings is false)"
                     : " (config.json's num_hidden_layers is " + std::to_string(m.n_layer) + ")"));
    }

    // Types by the recipe's rules, as llama-quantize would choose them.
    std::vector<smol::tensor_desc> descs;
    for (const planned & p : plan)
        descs.push_back({p.want.gguf_name, uint32_t(p.want.ne.size()), p.want.ne[0],
                         smol_type_of(p.src->dtype)});
    const auto choice = smol::choose_types(
        to, descs, {int32_t(m.n_layer), int32_t(m.n_head), int32_t(m.n_head_kv)});
    for (size_t i = 0; i < plan.size(); ++i) {
        // 1-D tensors (the norms) are f32 in every file type, as llama.cpp keeps them.
        plan[i].type = plan[i].want.ne.size() == 1 ? SMOL_TYPE_F32 : choice[i].type;
        plan[i].fell_back = choice[i].fell_back;
        sum.n_params += uint64_t(plan[i].src->n_elements());
    }
    sum.n_tensors = plan.size();

    // The types convert_hf_to_gguf writes itself come in its layout; the
    // others in the layout of its f32 file requantized by llama-quantize,
    // which moves general.quantization_version and general.file_type to
    // the end and writes tensors in its own order.
    const bool requantized = traits_of(to.base)->quantized && to.base != SMOL_TYPE_Q8_0;
    std::vector<size_t> order(plan.size());
    for (size_t i = 0; i < plan.size(); ++i) order[i] = i;
    if (requantized) order = smol::quantize_order(descs);

    // Metadata, in convert_hf_to_gguf's order.
    using gguf::value;
    gguf::writer w;
    const std::string name =
        o.name.empty() ? fs::path(dir).lexically_normal().filename().string() : o.name;
    w.set("general.architecture", value::make_str(gemma ? "gemma3" : "llama"));
    w.set("general.type", value::make_str("model"));
    add_sampling(w, (fs::path(dir) / "generation_config.json").string());
    w.set(
        "general.name",
        value::make_str(name.empty() ? fs::absolute(dir).parent_path().filename().string() : name));
    w.set("general.size_label", value::make_str(size_label(sum.n_params)));
    if (gemma) {
        add_gemma3_params(w, g, requantized ? nullptr : &to);
        if (!requantized) w.set("general.quantization_version", value::make_u32(2));
        add_tokenizer_sentencepiece(w, dir, config, g.n_vocab);
        w.set("tokenizer.ggml.add_space_prefix", value::make_bool(false));
    } else {
        add_llama_params(w, m, requantized ? nullptr : &to);
        if (!requantized) w.set("general.quantization_version", value::make_u32(2));
        add_tokenizer(w, dir, config, m.n_vocab, o.pre);
    }
    if (requantized) {
        w.set("general.quantization_version", value::make_u32(2));
        w.set("general.file_type", value::make_u32(to.ftype));
    }

    // Tensors: rows read, permuted, converted while the file is written.
    const fs::path out_dir = fs::absolute(o.out_path).parent_path();
    if (!fs::is_directory(out_dir))
        throw convert_error(o.out_path + ": the output's folder " + out_dir.string() +
                            " does not exist");
    std::error_code ec;
    for (const auto & s : shards) {
        if (fs::exists(o.out_path, ec) && fs::equivalent(o.out_path, s->path(), ec))
            throw convert_error(o.out_path + ": the output would overwrite the input " + s->path());
    }
    const int n_threads = std::max(1, o.n_threads);
    for (size_t n = 0; n < order.size(); ++n) {
        const planned p = plan[order[n]];
        const size_t i = n;
        const int64_t cols = p.want.ne[0];
        const int64_t rows = p.src->n_elements() / std::max<int64_t>(cols, 1);
        const size_t in_row = size_t(cols) * st_dtype_size(p.src->dtype);
        const size_t out_row = type_row_bytes(p.type, cols);
        sum.bytes_in += p.src->nbytes;
        sum.bytes_out += out_row * size_t(rows);
        const bool raw = smol_type_of(p.src->dtype) == p.type && !p.want.plus_one;
        auto done = std::make_shared<int64_t>(0);
        auto source = [p, i, cols, rows, in_row, out_row, raw, done, n_threads, &o,
                       count = plan.size()](uint64_t row0, uint64_t n_rows, void * dst) {
            // HF keeps each head's rotated pairs half a head apart; GGUF's
            // Llama wants them adjacent: row (h, i, j) comes from (h, j, i).
            const int64_t hd = p.want.permute_heads ? rows / p.want.permute_heads : 0;
            auto src_row = [&](int64_t r) {
                if (!hd) return r;
                const int64_t h = r / hd, rem = r % hd;
                return h * hd + (rem % 2) * (hd / 2) + rem / 2;
            };
            auto work = [&](uint64_t r0, uint64_t r1) {
                std::vector<float> row(static_cast<size_t>(cols));
                for (uint64_t r = r0; r < r1; ++r) {
                    const uint8_t * in = p.src->data + size_t(src_row(int64_t(r))) * in_row;
                    uint8_t * out = static_cast<uint8_t *>(dst) + (r - row0) * out_row;
                    if (raw) {
                        std::memcpy(out, in, in_row);
                    } else {
                        to_f32(p.src->dtype, in, row.data(), cols);
                        if (p.want.plus_one) add_one(p.src->dtype, row.data(), cols);
                        quantize_row(p.type, row.data(), out, cols);
                    }
                }
            };
            const uint64_t workers =
                raw ? 1
                    : std::min<uint64_t>(uint64_t(n_threads), std::max<uint64_t>(1, n_rows / 16));
            if (workers <= 1) {
                work(row0, row0 + n_rows);
            } else {
                std::vector<std::thread> pool;
                for (uint64_t k = 0; k < workers; ++k)
                    pool.emplace_back(work, row0 + n_rows * k / workers,
                                      row0 + n_rows * (k + 1) / workers);
                for (std::thread & th : pool) th.join();
            }
            *done += int64_t(n_rows);
            if (*done == rows && o.on_tensor) {
                o.on_tensor({p.want.gguf_name, p.src->name, p.want.ne, p.src->dtype, p.type,
                             p.fell_back, p.src->nbytes, out_row * size_t(rows), i, count});
            }
        };
        w.add_tensor(p.want.gguf_name, uint32_t(p.type), p.want.ne, source);
    }
    w.write(o.out_path);
    return sum;
}

} // namespace smol::convert
