// random-model.c++ - see random-model.h. Every row of every tensor has its
// own generator, seeded from (seed, tensor, row), so the file depends on the
// seed alone, not on how many threads wrote it or in what chunks.

#include "random-model.h"

#include "smol-cpu-kernels.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

namespace smol::random_model {

namespace {

// SmolLM2's published configurations (HuggingFaceTB/SmolLM2-*-Instruct,
// config.json): hidden_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads, intermediate_size, rope_theta; vocabulary 49152,
// rms_norm_eps 1e-5, 8192 positions, tied embeddings, head size 64.
// Gemma 3 270M (google/gemma-3-270m, config.json): vocabulary 262144,
// hidden_size 640, 18 layers, 4 heads of 256 over one kv head,
// intermediate_size 2048, 32768 positions, rope_theta 1e6 (10000 on the
// sliding-window layers), sliding_window 512, rms_norm_eps 1e-6.
const shape known[] = {
    {"135M", 49152, 576, 30, 9, 3, 1536, 8192, 100000.0f, 1e-5f},
    {"360M", 49152, 960, 32, 15, 5, 2560, 8192, 100000.0f, 1e-5f},
    {"1.7B", 49152, 2048, 24, 32, 32, 8192, 8192, 130000.0f, 1e-5f},
    {"gemma3-270m", 262144, 640, 18, 4, 1, 2048, 32768, 1000000.0f, 1e-6f, true, 256, 512,
     10000.0f},
};

uint64_t splitmix64(uint64_t & x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Standard normal samples from one row's stream (Box-Muller on 53-bit
// uniforms); small and fast enough for gigabytes of weights.
struct normal_stream {
    uint64_t state;
    normal_stream(uint64_t seed, uint64_t tensor, uint64_t row) {
        state = seed;
        state = splitmix64(state) ^ (tensor * 0xd1b54a32d192ed03ull);
        state = splitmix64(state) ^ (row * 0x8cb92ba72f3d8dd7ull);
    }
    double uniform() { return double(splitmix64(state) >> 11) * 0x1.0p-53; }
    void fill(float * out, int64_t n) {
        constexpr double two_pi = 6.283185307179586;
        for (int64_t i = 0; i < n; i += 2) {
            const double u1 = 1.0 - uniform(), u2 = uniform(); // u1 in (0, 1]
            const double r = std::sqrt(-2.0 * std::log(u1));
            out[i] = float(r * std::cos(two_pi * u2));
            if (i + 1 < n) out[i + 1] = float(r * std::sin(two_pi * u2));
        }
    }
};

// A byte-level vocabulary (GPT-2's byte-to-unicode map) with ChatML
// specials, padded to n tokens, for files written without a real one.
void made_up_vocab(gguf::writer & w, int n) {
    if (n < 260) throw std::invalid_argument("a made-up vocabulary needs at least 260 tokens");
    auto printable = [](int b) {
        return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    };
    std::vector<std::string> tokens;
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
        const int cp = printable(b) ? b : 256 + extra++;
        std::string s;
        if (cp < 0x80) {
            s += char(cp);
        } else {
            s += char(0xC0 | (cp >> 6));
            s += char(0x80 | (cp & 0x3F));
        }
        tokens.push_back(s);
    }
    tokens.insert(tokens.begin(), {"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
    tokens.push_back("Ġt");
    while (int(tokens.size()) < n)
        tokens.push_back("<unused" + std::to_string(tokens.size()) + ">");
    std::vector<gguf::value> types;
    for (size_t i = 0; i < tokens.size(); ++i) {
        const bool special = i < 3 || tokens[i].rfind("<unused", 0) == 0;
        types.push_back(gguf::value::make_i32(special ? 3 : 1));
    }
    w.set("tokenizer.ggml.model", gguf::value::make_str("gpt2"));
    w.set("tokenizer.ggml.pre", gguf::value::make_str("smollm"));
    w.set("tokenizer.ggml.tokens", gguf::value::make_str_array(tokens));
    w.set("tokenizer.ggml.token_type", gguf::value::make_array(gguf::type::INT32, types));
    w.set("tokenizer.ggml.merges", gguf::value::make_str_array({"Ġ t"}));
    w.set("tokenizer.ggml.bos_token_id", gguf::value::make_u32(1));
    w.set("tokenizer.ggml.eos_token_id", gguf::value::make_u32(2));
}

struct planned {
    std::string name;
    std::vector<int64_t> ne;
    uint32_t type;
    bool norm; // 1 + std * noise instead of std * noise
};

} // namespace

const shape * find_shape(std::string_view name) {
    for (const shape & s : known) {
        if (name == s.name) return &s;
    }
    return nullptr;
}

std::string shape_names() {
    std::string out;
    for (const shape & s : known) out += (out.empty() ? "" : ", ") + s.name;
    return out;
}

uint32_t llama_ftype(smol_type t) {
    switch (t) {
    case SMOL_TYPE_F32:
        return 0;
    case SMOL_TYPE_F16:
        return 1;
    case SMOL_TYPE_Q4_0:
        return 2;
    case SMOL_TYPE_Q4_1:
        return 3;
    case SMOL_TYPE_Q8_0:
        return 7;
    case SMOL_TYPE_Q5_0:
        return 8;
    case SMOL_TYPE_Q5_1:
        return 9;
    case SMOL_TYPE_Q2_K:
        return 10;
    case SMOL_TYPE_Q3_K:
        return 11; // Q3_K_S: every matmul weight q3_K
    case SMOL_TYPE_Q4_K:
        return 14; // Q4_K_S
    case SMOL_TYPE_Q5_K:
        return 16; // Q5_K_S
    case SMOL_TYPE_Q6_K:
        return 18;
    case SMOL_TYPE_IQ4_NL:
        return 25;
    case SMOL_TYPE_IQ4_XS:
        return 30;
    case SMOL_TYPE_BF16:
        return 32;
    }
    return 0;
}

void write(const std::string & path, const options & o) {
    shape s = o.s;
    // A vocabulary from a file brings its size: the shape's other
    // dimensions with another model family's tokenizer.
    const std::vector<gguf::value> * vocab_tokens = nullptr;
    if (o.vocab_from) {
        vocab_tokens = o.vocab_from->get_array("tokenizer.ggml.tokens", gguf::type::STRING);
        if (!vocab_tokens || vocab_tokens->empty()) {
            throw std::invalid_argument(o.vocab_from->path() +
                                        " has no tokenizer.ggml.tokens; --vocab-from needs a "
                                        "GGUF file with a tokenizer");
        }
        s.n_vocab = int64_t(vocab_tokens->size());
    }
    const int hd = s.head_dim > 0 ? s.head_dim : s.n_head > 0 ? s.n_embd / s.n_head : 0;
    if (s.n_head <= 0 || s.n_head_kv <= 0 || (s.head_dim <= 0 && s.n_embd % s.n_head != 0) ||
        s.n_head % s.n_head_kv != 0 || hd % 2 != 0) {
        throw std::invalid_argument("shape " + s.name + ": n_embd " + std::to_string(s.n_embd) +
                                    " must split into n_head " + std::to_string(s.n_head) +
                                    " heads of even size, grouped over n_head_kv " +
                                    std::to_string(s.n_head_kv));
    }
    const int qd = hd * s.n_head, kvd = hd * s.n_head_kv;
    using gguf::value;
    gguf::writer w;
    const std::string arch = s.gemma ? "gemma3" : "llama", a = arch + ".";
    w.set("general.architecture", value::make_str(arch));
    w.set("general.type", value::make_str("model"));
    w.set("general.name",
          value::make_str((s.gemma ? "" : "SmolLM2-") + s.name + " shape, random weights (seed " +
                          std::to_string(o.seed) + ")"));
    w.set("general.size_label", value::make_str(s.name));
    w.set(a + "block_count", value::make_u32(uint32_t(s.n_layer)));
    w.set(a + "context_length", value::make_u32(uint32_t(s.n_ctx)));
    w.set(a + "embedding_length", value::make_u32(uint32_t(s.n_embd)));
    w.set(a + "feed_forward_length", value::make_u32(uint32_t(s.n_ff)));
    w.set(a + "attention.head_count", value::make_u32(uint32_t(s.n_head)));
    w.set(a + "attention.head_count_kv", value::make_u32(uint32_t(s.n_head_kv)));
    w.set(a + "rope.freq_base", value::make_f32(s.rope_base));
    w.set(a + "attention.layer_norm_rms_epsilon", value::make_f32(s.eps));
    if (s.gemma) {
        w.set(a + "attention.key_length", value::make_u32(uint32_t(hd)));
        w.set(a + "attention.value_length", value::make_u32(uint32_t(hd)));
        w.set(a + "attention.sliding_window", value::make_u32(uint32_t(s.n_swa)));
        w.set(a + "rope.freq_base_swa", value::make_f32(s.rope_base_swa));
    } else {
        w.set(a + "vocab_size", value::make_u32(uint32_t(s.n_vocab)));
        w.set(a + "rope.dimension_count", value::make_u32(uint32_t(hd)));
    }
    const smol_type base = o.mix ? o.mix->base : o.type;
    w.set("general.file_type", value::make_u32(o.mix ? o.mix->ftype : llama_ftype(o.type)));
    if (cpu::block_elems(base) > 1) w.set("general.quantization_version", value::make_u32(2));
    w.set("smol.random_weights", value::make_bool(true));
    w.set("smol.random_shape", value::make_str(s.name));
    w.set("smol.random_seed", value::make_u64(o.seed));
    if (o.vocab_from) {
        for (const gguf::kv & kv : o.vocab_from->metadata()) {
            if (kv.key.rfind("tokenizer.", 0) == 0) w.set(kv.key, kv.val);
        }
    } else {
        made_up_vocab(w, s.n_vocab);
    }

    // Tensors in llama.cpp's order; a weight whose rows do not fill whole
    // quantization blocks falls back to f16, as smol-quantize does.
    auto mat_type = [&](int64_t ne0) {
        return ne0 % cpu::block_elems(o.type) == 0 ? uint32_t(o.type) : uint32_t(SMOL_TYPE_F16);
    };
    std::vector<planned> plan;
    plan.push_back({"token_embd.weight", {s.n_embd, s.n_vocab}, mat_type(s.n_embd), false});
    plan.push_back({"output_norm.weight", {s.n_embd}, SMOL_TYPE_F32, true});
    for (int l = 0; l < s.n_layer; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        const int64_t E = s.n_embd, F = s.n_ff;
        plan.push_back({p + "attn_norm.weight", {E}, SMOL_TYPE_F32, true});
        plan.push_back({p + "attn_q.weight", {E, qd}, mat_type(E), false});
        plan.push_back({p + "attn_k.weight", {E, kvd}, mat_type(E), false});
        plan.push_back({p + "attn_v.weight", {E, kvd}, mat_type(E), false});
        if (s.gemma) {
            plan.push_back({p + "attn_q_norm.weight", {hd}, SMOL_TYPE_F32, true});
            plan.push_back({p + "attn_k_norm.weight", {hd}, SMOL_TYPE_F32, true});
        }
        plan.push_back({p + "attn_output.weight", {qd, E}, mat_type(qd), false});
        if (s.gemma) plan.push_back({p + "post_attention_norm.weight", {E}, SMOL_TYPE_F32, true});
        plan.push_back({p + "ffn_norm.weight", {E}, SMOL_TYPE_F32, true});
        plan.push_back({p + "ffn_gate.weight", {E, F}, mat_type(E), false});
        plan.push_back({p + "ffn_up.weight", {E, F}, mat_type(E), false});
        plan.push_back({p + "ffn_down.weight", {F, E}, mat_type(F), false});
        if (s.gemma) plan.push_back({p + "post_ffw_norm.weight", {E}, SMOL_TYPE_F32, true});
    }
    if (o.mix) {
        // The recipe's choice for each weight, from the model's shape.
        std::vector<smol::tensor_desc> descs;
        for (const planned & t : plan)
            descs.push_back({t.name, uint32_t(t.ne.size()), t.ne[0], SMOL_TYPE_F32});
        const auto choice = smol::choose_types(*o.mix, descs, {s.n_layer, s.n_head, s.n_head_kv});
        for (size_t i = 0; i < plan.size(); ++i) plan[i].type = uint32_t(choice[i].type);
    }
    uint64_t total = 0;
    for (const planned & t : plan) {
        const int64_t rows = t.ne.size() > 1 ? t.ne[1] : 1;
        total += cpu::row_bytes(smol_type(t.type), t.ne[0]) * uint64_t(rows);
    }

    const cpu::kernels & k = cpu::kernels_best();
    auto done = std::make_shared<uint64_t>(0);
    const int n_threads = std::max(1, o.n_threads);
    for (size_t i = 0; i < plan.size(); ++i) {
        const planned t = plan[i];
        const int64_t ne0 = t.ne[0];
        const smol_type type = smol_type(t.type);
        const size_t rb = cpu::row_bytes(type, ne0);
        auto source = [&o, &k, t, i, ne0, type, rb, done, n = plan.size(), total,
                       n_threads](uint64_t row0, uint64_t n_rows, void * dst) {
            auto work = [&](uint64_t r0, uint64_t r1) {
                std::vector<float> row(size_t(ne0) + 1);
                for (uint64_t r = r0; r < r1; ++r) {
                    normal_stream(o.seed, i, r).fill(row.data(), ne0);
                    for (int64_t e = 0; e < ne0; ++e) {
                        row[size_t(e)] =
                            t.norm ? 1.0f + o.std * row[size_t(e)] : o.std * row[size_t(e)];
                    }
                    k.row_from_f32(type, row.data(), static_cast<uint8_t *>(dst) + (r - row0) * rb,
                                   ne0);
                }
            };
            const uint64_t n_workers =
                std::min<uint64_t>(uint64_t(n_threads), std::max<uint64_t>(1, n_rows / 16));
            if (n_workers <= 1) {
                work(row0, row0 + n_rows);
            } else {
                std::vector<std::thread> pool;
                for (uint64_t w = 0; w < n_workers; ++w) {
                    pool.emplace_back(work, row0 + n_rows * w / n_workers,
                                      row0 + n_rows * (w + 1) / n_workers);
                }
                for (std::thread & th : pool) th.join();
            }
            *done += n_rows * rb;
            if (o.progress) o.progress(t.name, i, n, *done, total);
        };
        w.add_tensor(t.name, t.type, t.ne, source);
    }
    w.write(path);
}

} // namespace smol::random_model
