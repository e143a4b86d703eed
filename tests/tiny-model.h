// tiny-model.h - writes small llama (or Gemma 3) GGUF files with fresh random
// weights for tests, and runs the same model in float64 as an independent
// reference.

#ifndef SMOL_TESTS_TINY_MODEL_H
#define SMOL_TESTS_TINY_MODEL_H

#include "gguf.h"
#include "smol-cpu-kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace tiny {

struct shape {
    int n_vocab = 300; // 256 byte tokens + a few merges and specials
    int n_embd = 64;
    int n_head = 4;
    int n_head_kv = 2;
    int n_ff = 96;
    int n_layer = 2;
    int n_ctx = 256;
    float rope_base = 10000.0f;
    float eps = 1e-5f;
    smol_type wtype = SMOL_TYPE_F32;
    // The token embeddings' standard deviation; the output shares them, so
    // the logits scale with it (smaller: flatter next-token distributions).
    float embd_scale = 1.0f;
    // Gemma 3 (architecture gemma3): the embeddings scaled by sqrt(n_embd),
    // q and k normed per head, norms after attention and the MLP, GeGLU,
    // NeoX-style rope, and every layer of an even index local: a sliding
    // window of `window` positions and its own rope base.
    bool gemma = false;
    int head_dim = 0; // 0: n_embd / n_head
    int window = 0;
    float rope_base_swa = 10000.0f;

    int hd() const { return head_dim ? head_dim : n_embd / n_head; }
    bool local(int layer) const { return gemma && window > 0 && layer % 2 == 0; }
};

struct model {
    shape s;
    std::vector<float> tok_embd, out_norm;
    struct layer {
        std::vector<float> attn_norm, wq, wk, wv, wo, ffn_norm, gate, up, down;
        std::vector<float> q_norm, k_norm, post_attn_norm, post_ffw_norm; // Gemma 3
    };
    std::vector<layer> layers;
    // What the file holds for each matmul weight (after rounding to wtype).
    std::vector<std::vector<uint8_t>> blobs;
};

// GPT-2's byte-to-unicode map, so byte tokens have printable text.
inline std::string byte_token(int b) {
    int cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
        int n = 0;
        for (int x = 0; x < b; ++x) {
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
        }
        cp = 256 + n;
    }
    std::string s;
    if (cp < 0x80) {
        s += char(cp);
    } else {
        s += char(0xC0 | (cp >> 6));
        s += char(0x80 | (cp & 0x3F));
    }
    return s;
}

inline std::vector<float> random_vec(std::mt19937 & rng, size_t n, float scale, float bias = 0) {
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto & x : v) x = bias + scale * d(rng);
    return v;
}

// Rounds weights through the file type so the reference uses what smol reads.
inline std::vector<float> through(smol_type t, const std::vector<float> & w, int64_t ne0,
                                  std::vector<uint8_t> & blob) {
    const auto & k = smol::cpu::kernels_best();
    const int64_t rows = int64_t(w.size()) / ne0;
    const size_t rb = smol::cpu::row_bytes(t, ne0);
    blob.resize(rb * size_t(rows));
    std::vector<float> back(w.size());
    for (int64_t r = 0; r < rows; ++r) {
        k.row_from_f32(t, w.data() + r * ne0, blob.data() + r * rb, ne0);
        k.row_to_f32(t, blob.data() + r * rb, back.data() + r * ne0, ne0);
    }
    return back;
}

// Makes a model with fresh random weights and writes it as GGUF to path.
// arch names the architecture in the file (a wrong one, for tests of
// refusals); empty: llama, or gemma3 for a Gemma shape.
inline model write(const std::string & path, const shape & s, uint32_t seed,
                   std::string arch = "") {
    std::mt19937 rng(seed);
    model m;
    m.s = s;
    if (arch.empty()) arch = s.gemma ? "gemma3" : "llama";
    const int hd = s.hd(), qd = hd * s.n_head, kvd = hd * s.n_head_kv;
    gguf::writer w;
    using gguf::value;
    w.set("general.architecture", value::make_str(arch));
    w.set("general.name", value::make_str(s.gemma ? "tiny random gemma3" : "tiny random llama"));
    w.set(arch + ".block_count", value::make_u32(uint32_t(s.n_layer)));
    w.set(arch + ".context_length", value::make_u32(uint32_t(s.n_ctx)));
    w.set(arch + ".embedding_length", value::make_u32(uint32_t(s.n_embd)));
    w.set(arch + ".feed_forward_length", value::make_u32(uint32_t(s.n_ff)));
    w.set(arch + ".attention.head_count", value::make_u32(uint32_t(s.n_head)));
    w.set(arch + ".attention.head_count_kv", value::make_u32(uint32_t(s.n_head_kv)));
    w.set(arch + ".rope.freq_base", value::make_f32(s.rope_base));
    w.set(arch + ".attention.layer_norm_rms_epsilon", value::make_f32(s.eps));
    if (s.gemma) {
        w.set(arch + ".attention.key_length", value::make_u32(uint32_t(hd)));
        w.set(arch + ".attention.value_length", value::make_u32(uint32_t(hd)));
        w.set(arch + ".attention.sliding_window", value::make_u32(uint32_t(s.window)));
        w.set(arch + ".rope.freq_base_swa", value::make_f32(s.rope_base_swa));
        std::vector<value> flags;
        for (int l = 0; l < s.n_layer; ++l) flags.push_back(value::make_bool(s.local(l)));
        w.set(arch + ".attention.sliding_window_pattern",
              value::make_array(gguf::type::BOOL, std::move(flags)));
    }
    std::vector<std::string> tokens;
    std::vector<gguf::value> types;
    for (int b = 0; b < 256; ++b) tokens.push_back(byte_token(b));
    std::vector<std::string> merges = {"Ġ t", "h e", "Ġt he", "i n", "a n"};
    for (const auto & mg : merges) {
        std::string a = mg.substr(0, mg.find(' ')), b = mg.substr(mg.find(' ') + 1);
        tokens.push_back(a + b);
    }
    tokens.push_back("<|im_start|>");
    tokens.push_back("<|im_end|>");
    tokens.push_back("<|endoftext|>");
    while (int(tokens.size()) < s.n_vocab)
        tokens.push_back("<unused" + std::to_string(tokens.size()) + ">");
    for (size_t i = 0; i < tokens.size(); ++i) {
        const bool special = tokens[i][0] == '<' && tokens[i].size() > 2;
        types.push_back(value::make_i32(special ? 3 : 1));
    }
    w.set("tokenizer.ggml.model", value::make_str("gpt2"));
    w.set("tokenizer.ggml.pre", value::make_str("smollm"));
    w.set("tokenizer.ggml.tokens", value::make_str_array(tokens));
    w.set("tokenizer.ggml.token_type", value::make_array(gguf::type::INT32, types));
    w.set("tokenizer.ggml.merges", value::make_str_array(merges));
    w.set("tokenizer.ggml.bos_token_id", value::make_u32(263));
    w.set("tokenizer.ggml.eos_token_id", value::make_u32(262));

    const float ws = 1.0f / std::sqrt(float(s.n_embd));
    m.blobs.reserve(size_t(3 + 13 * s.n_layer));
    auto add_f32 = [&](const std::string & name, const std::vector<float> & v) {
        m.blobs.emplace_back(reinterpret_cast<const uint8_t *>(v.data()),
                             reinterpret_cast<const uint8_t *>(v.data()) + v.size() * 4);
        w.add_tensor(name, SMOL_TYPE_F32, {int64_t(v.size())}, m.blobs.back().data(),
                     m.blobs.back().size());
    };
    auto add_mat = [&](const std::string & name, std::vector<float> v, int64_t ne0, smol_type t) {
        m.blobs.emplace_back();
        v = through(t, v, ne0, m.blobs.back());
        w.add_tensor(name, t, {ne0, int64_t(v.size()) / ne0}, m.blobs.back().data(),
                     m.blobs.back().size());
        return v;
    };
    m.tok_embd =
        add_mat("token_embd.weight", random_vec(rng, size_t(s.n_vocab) * s.n_embd, s.embd_scale),
                s.n_embd, s.wtype);
    m.out_norm = random_vec(rng, size_t(s.n_embd), 0.1f, 1.0f);
    add_f32("output_norm.weight", m.out_norm);
    for (int l = 0; l < s.n_layer; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        model::layer L;
        L.attn_norm = random_vec(rng, size_t(s.n_embd), 0.1f, 1.0f);
        add_f32(p + "attn_norm.weight", L.attn_norm);
        L.wq = add_mat(p + "attn_q.weight", random_vec(rng, size_t(qd) * s.n_embd, ws), s.n_embd,
                       s.wtype);
        L.wk = add_mat(p + "attn_k.weight", random_vec(rng, size_t(kvd) * s.n_embd, ws), s.n_embd,
                       s.wtype);
        L.wv = add_mat(p + "attn_v.weight", random_vec(rng, size_t(kvd) * s.n_embd, ws), s.n_embd,
                       s.wtype);
        L.wo = add_mat(p + "attn_output.weight",
                       random_vec(rng, size_t(s.n_embd) * qd, 1.0f / std::sqrt(float(qd))), qd,
                       s.wtype);
        L.ffn_norm = random_vec(rng, size_t(s.n_embd), 0.1f, 1.0f);
        add_f32(p + "ffn_norm.weight", L.ffn_norm);
        L.gate = add_mat(p + "ffn_gate.weight", random_vec(rng, size_t(s.n_ff) * s.n_embd, ws),
                         s.n_embd, s.wtype);
        L.up = add_mat(p + "ffn_up.weight", random_vec(rng, size_t(s.n_ff) * s.n_embd, ws),
                       s.n_embd, s.wtype);
        L.down =
            add_mat(p + "ffn_down.weight",
                    random_vec(rng, size_t(s.n_embd) * s.n_ff, 1.0f / std::sqrt(float(s.n_ff))),
                    s.n_ff, s.wtype);
        if (s.gemma) {
            L.q_norm = random_vec(rng, size_t(hd), 0.1f, 1.0f);
            add_f32(p + "attn_q_norm.weight", L.q_norm);
            L.k_norm = random_vec(rng, size_t(hd), 0.1f, 1.0f);
            add_f32(p + "attn_k_norm.weight", L.k_norm);
            L.post_attn_norm = random_vec(rng, size_t(s.n_embd), 0.1f, 1.0f);
            add_f32(p + "post_attention_norm.weight", L.post_attn_norm);
            L.post_ffw_norm = random_vec(rng, size_t(s.n_embd), 0.1f, 1.0f);
            add_f32(p + "post_ffw_norm.weight", L.post_ffw_norm);
        }
        m.layers.push_back(std::move(L));
    }
    w.write(path);
    return m;
}

// Streaming heads: per (layer, kv head), layer-major, whether the head sees
// only the first `sink` positions and the last `window`.
struct streaming_heads {
    std::vector<uint8_t> flags;
    int sink = 0, window = 0;
};

// Random flags for s's heads (two or more kv heads a layer): at least one
// head of each kind, and a layer mixing them.
inline std::vector<uint8_t> draw_streaming_flags(std::mt19937 & rng, const shape & s) {
    std::vector<uint8_t> f(size_t(s.n_layer * s.n_head_kv));
    for (uint8_t & x : f) x = uint8_t(rng() % 2u);
    const int mixed = int(rng() % uint32_t(s.n_layer));
    f[size_t(mixed * s.n_head_kv)] = 1;
    f[size_t(mixed * s.n_head_kv + 1)] = 0;
    return f;
}

// The model in float64, one sequence, all positions: logits[t][vocab];
// with hidden, also each position's final hidden state after the output
// norm, hidden[t][n_embd]; with streaming, those heads' attention cut.
inline std::vector<std::vector<double>>
reference(const model & m, const std::vector<int> & ids,
          std::vector<std::vector<double>> * hidden = nullptr,
          const streaming_heads * streaming = nullptr) {
    const shape & s = m.s;
    const int E = s.n_embd, hd = s.hd(), T = int(ids.size()), group = s.n_head / s.n_head_kv;
    using vec = std::vector<double>;
    // Over runs of n elements (a head each for Gemma's q and k norms).
    auto rmsnorm = [&](const vec & x, const std::vector<float> & w) {
        const size_t n = w.size();
        vec y(x.size());
        for (size_t g = 0; g < x.size(); g += n) {
            double ss = 0;
            for (size_t i = 0; i < n; ++i) ss += x[g + i] * x[g + i];
            const double r = 1.0 / std::sqrt(ss / double(n) + s.eps);
            for (size_t i = 0; i < n; ++i) y[g + i] = x[g + i] * r * w[i];
        }
        return y;
    };
    auto matvec = [](const std::vector<float> & W, const vec & x, int rows) {
        const size_t K = x.size();
        vec y(size_t(rows), 0.0);
        for (int r = 0; r < rows; ++r)
            for (size_t k = 0; k < K; ++k) y[size_t(r)] += double(W[size_t(r) * K + k]) * x[k];
        return y;
    };
    // Llama's pairs are adjacent in GGUF's order, Gemma's half a head apart.
    auto rope = [&](vec & x, int heads, int pos, double base) {
        const int stride = s.gemma ? 1 : 2, other = s.gemma ? hd / 2 : 1;
        for (int h = 0; h < heads; ++h)
            for (int j = 0; j < hd / 2; ++j) {
                const double th = pos * std::pow(base, -2.0 * j / hd);
                double & a = x[size_t(h * hd + stride * j)];
                double & b = x[size_t(h * hd + stride * j + other)];
                const double a0 = a, b0 = b;
                a = a0 * std::cos(th) - b0 * std::sin(th);
                b = a0 * std::sin(th) + b0 * std::cos(th);
            }
    };
    std::vector<vec> x(static_cast<size_t>(T));
    for (int t = 0; t < T; ++t) {
        x[size_t(t)] = vec(m.tok_embd.begin() + long(ids[size_t(t)]) * E,
                           m.tok_embd.begin() + long(ids[size_t(t)] + 1) * E);
        if (s.gemma)
            for (double & e : x[size_t(t)]) e *= double(std::sqrt(float(E)));
    }
    for (size_t l = 0; l < m.layers.size(); ++l) {
        const model::layer & L = m.layers[l];
        const bool local = s.local(int(l));
        const double base = local ? s.rope_base_swa : s.rope_base;
        std::vector<vec> q(static_cast<size_t>(T)), k(q), v(q);
        for (int t = 0; t < T; ++t) {
            const vec h = rmsnorm(x[size_t(t)], L.attn_norm);
            q[size_t(t)] = matvec(L.wq, h, hd * s.n_head);
            k[size_t(t)] = matvec(L.wk, h, hd * s.n_head_kv);
            v[size_t(t)] = matvec(L.wv, h, hd * s.n_head_kv);
            if (s.gemma) {
                q[size_t(t)] = rmsnorm(q[size_t(t)], L.q_norm);
                k[size_t(t)] = rmsnorm(k[size_t(t)], L.k_norm);
            }
            rope(q[size_t(t)], s.n_head, t, base);
            rope(k[size_t(t)], s.n_head_kv, t, base);
        }
        for (int t = 0; t < T; ++t) {
            // A local layer's query sees the last `window` positions.
            const int first = local ? std::max(0, t - s.window + 1) : 0;
            vec att(size_t(hd * s.n_head), 0.0);
            for (int h = 0; h < s.n_head; ++h) {
                const int hk = h / group;
                const bool cut =
                    streaming && streaming->flags[l * size_t(s.n_head_kv) + size_t(hk)];
                auto seen = [&](int u) {
                    return u >= first && (!cut || u < streaming->sink || t - u < streaming->window);
                };
                vec sc(size_t(t + 1));
                double mx = -1e300;
                for (int u = first; u <= t; ++u) {
                    if (!seen(u)) continue;
                    double d = 0;
                    for (int j = 0; j < hd; ++j)
                        d += q[size_t(t)][size_t(h * hd + j)] * k[size_t(u)][size_t(hk * hd + j)];
                    sc[size_t(u)] = d / std::sqrt(double(hd));
                    mx = std::max(mx, sc[size_t(u)]);
                }
                double sum = 0;
                for (int u = first; u <= t; ++u)
                    if (seen(u)) sum += (sc[size_t(u)] = std::exp(sc[size_t(u)] - mx));
                for (int u = first; u <= t; ++u)
                    if (seen(u))
                        for (int j = 0; j < hd; ++j)
                            att[size_t(h * hd + j)] +=
                                sc[size_t(u)] / sum * v[size_t(u)][size_t(hk * hd + j)];
            }
            vec o = matvec(L.wo, att, E);
            if (s.gemma) o = rmsnorm(o, L.post_attn_norm);
            for (int i = 0; i < E; ++i) x[size_t(t)][size_t(i)] += o[size_t(i)];
            const vec h = rmsnorm(x[size_t(t)], L.ffn_norm);
            const vec g = matvec(L.gate, h, s.n_ff), up = matvec(L.up, h, s.n_ff);
            vec a(size_t(s.n_ff));
            for (int i = 0; i < s.n_ff; ++i) {
                const double z = g[size_t(i)];
                const double act =
                    s.gemma ? 0.5 * z *
                                  (1.0 + std::tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)))
                            : z / (1.0 + std::exp(-z));
                a[size_t(i)] = act * up[size_t(i)];
            }
            vec d = matvec(L.down, a, E);
            if (s.gemma) d = rmsnorm(d, L.post_ffw_norm);
            for (int i = 0; i < E; ++i) x[size_t(t)][size_t(i)] += d[size_t(i)];
        }
    }
    std::vector<vec> logits(static_cast<size_t>(T));
    if (hidden) hidden->assign(static_cast<size_t>(T), vec());
    for (int t = 0; t < T; ++t) {
        vec h = rmsnorm(x[size_t(t)], m.out_norm);
        logits[size_t(t)] = matvec(m.tok_embd, h, s.n_vocab);
        if (hidden) (*hidden)[size_t(t)] = std::move(h);
    }
    return logits;
}

} // namespace tiny

#endif // SMOL_TESTS_TINY_MODEL_H
