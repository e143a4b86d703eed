// smol-recipe.c++ - quantization recipes (smol-recipe.h): llama.cpp's rules
// for which type each tensor gets, for the file types smol can write, and
// the writer that applies them.
//
// The rules follow llama-quantize (src/llama-quant.cpp of the llama.cpp
// that scripts/peers.sh builds) for dense llama models: tensors are taken in
// its order (non-layer tensors first, then by layer number, then by name),
// which is the order its attn_v and ffn_down counters run in.

#include "smol-recipe.h"

#include "smol-cpu-kernels.h"
#include "smol-error.h"
#include "smol-quant.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <thread>

namespace smol {

namespace {

// llama.cpp's llama_ftype values.
enum ftype_id : uint32_t {
    ALL_F32 = 0,
    MOSTLY_F16 = 1,
    MOSTLY_Q4_0 = 2,
    MOSTLY_Q4_1 = 3,
    MOSTLY_Q8_0 = 7,
    MOSTLY_Q5_0 = 8,
    MOSTLY_Q5_1 = 9,
    MOSTLY_Q2_K = 10,
    MOSTLY_Q3_K_S = 11,
    MOSTLY_Q3_K_M = 12,
    MOSTLY_Q3_K_L = 13,
    MOSTLY_Q4_K_S = 14,
    MOSTLY_Q4_K_M = 15,
    MOSTLY_Q5_K_S = 16,
    MOSTLY_Q5_K_M = 17,
    MOSTLY_Q6_K = 18,
    MOSTLY_IQ4_NL = 25,
    MOSTLY_IQ4_XS = 30,
    MOSTLY_BF16 = 32,
};

const recipe k_recipes[] = {
    {"F32", ALL_F32, SMOL_TYPE_F32},
    {"F16", MOSTLY_F16, SMOL_TYPE_F16},
    {"BF16", MOSTLY_BF16, SMOL_TYPE_BF16},
    {"Q8_0", MOSTLY_Q8_0, SMOL_TYPE_Q8_0},
    {"Q6_K", MOSTLY_Q6_K, SMOL_TYPE_Q6_K},
    {"Q5_K_M", MOSTLY_Q5_K_M, SMOL_TYPE_Q5_K},
    {"Q5_K_S", MOSTLY_Q5_K_S, SMOL_TYPE_Q5_K},
    {"Q5_1", MOSTLY_Q5_1, SMOL_TYPE_Q5_1},
    {"Q5_0", MOSTLY_Q5_0, SMOL_TYPE_Q5_0},
    {"Q4_K_M", MOSTLY_Q4_K_M, SMOL_TYPE_Q4_K},
    {"Q4_K_S", MOSTLY_Q4_K_S, SMOL_TYPE_Q4_K},
    {"Q4_1", MOSTLY_Q4_1, SMOL_TYPE_Q4_1},
    {"Q4_0", MOSTLY_Q4_0, SMOL_TYPE_Q4_0},
    {"IQ4_NL", MOSTLY_IQ4_NL, SMOL_TYPE_IQ4_NL},
    {"IQ4_XS", MOSTLY_IQ4_XS, SMOL_TYPE_IQ4_XS},
    {"Q3_K_L", MOSTLY_Q3_K_L, SMOL_TYPE_Q3_K},
    {"Q3_K_M", MOSTLY_Q3_K_M, SMOL_TYPE_Q3_K},
    {"Q3_K_S", MOSTLY_Q3_K_S, SMOL_TYPE_Q3_K},
    {"Q2_K", MOSTLY_Q2_K, SMOL_TYPE_Q2_K},
};

enum class category {
    output,
    token_embd,
    attn_qkv,
    attn_kv_b,
    attn_v,
    attn_k,
    attn_q,
    attn_output,
    ffn_up,
    ffn_gate,
    ffn_down,
    other
};

bool has(const std::string & s, const char * part) {
    return s.find(part) != std::string::npos;
}

// llama.cpp's categories, tested in its order.
category category_of(const std::string & name) {
    if (name == "output.weight") return category::output;
    if (name == "token_embd.weight" || name == "per_layer_token_embd.weight")
        return category::token_embd;
    if (has(name, "attn_qkv.weight")) return category::attn_qkv;
    if (has(name, "attn_kv_b.weight")) return category::attn_kv_b;
    if (has(name, "attn_v.weight")) return category::attn_v;
    if (has(name, "attn_k.weight")) return category::attn_k;
    if (has(name, "attn_q.weight")) return category::attn_q;
    if (has(name, "attn_output.weight")) return category::attn_output;
    if (has(name, "ffn_up")) return category::ffn_up;
    if (has(name, "ffn_gate")) return category::ffn_gate;
    if (has(name, "ffn_down")) return category::ffn_down;
    return category::other;
}

bool is_attn_v(category c) {
    return c == category::attn_v || c == category::attn_qkv || c == category::attn_kv_b;
}

// The tensors llama-quantize quantizes: 2-D and up, named "...weight", not
// a norm or an expert gate.
bool quantizable(const tensor_desc & t) {
    const std::string & n = t.name;
    return t.n_dims >= 2 && n.size() >= 6 && n.compare(n.size() - 6, 6, "weight") == 0 &&
           !has(n, "_norm.weight") && !has(n, "ffn_gate_inp.weight");
}

// Layer i of n gets more bits: the first and last eighths and every third
// layer between.
bool use_more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

struct counters {
    int n_attention_wv = 0, i_attention_wv = 0;
    int n_ffn_down = 0, i_ffn_down = 0;
    bool tied_embeddings = true; // until an output.weight is seen
    int n_gqa = 1;
};

// llama_tensor_get_type_impl for a dense llama and the recipes above.
smol_type rule(counters & qs, smol_type t, const tensor_desc & ti, uint32_t ftype, category cat) {
    if (cat == category::output || (qs.tied_embeddings && cat == category::token_embd)) {
        if (ti.ne0 % type_block_elems(t) != 0) {
            t = SMOL_TYPE_Q8_0;
        } else if (t != SMOL_TYPE_Q8_0) {
            t = SMOL_TYPE_Q6_K;
        }
    } else if (cat == category::token_embd) {
        // The rules for an untied embedding concern types smol does not write.
    } else if (is_attn_v(cat)) {
        const int i = qs.i_attention_wv, n = qs.n_attention_wv;
        if (ftype == MOSTLY_Q2_K) {
            t = qs.n_gqa >= 4 ? SMOL_TYPE_Q4_K : SMOL_TYPE_Q3_K;
        } else if (ftype == MOSTLY_Q3_K_M) {
            t = i < 2 ? SMOL_TYPE_Q5_K : SMOL_TYPE_Q4_K;
        } else if (ftype == MOSTLY_Q3_K_L) {
            t = SMOL_TYPE_Q5_K;
        } else if ((ftype == MOSTLY_IQ4_NL || ftype == MOSTLY_IQ4_XS) && qs.n_gqa >= 4) {
            t = SMOL_TYPE_Q5_K;
        } else if ((ftype == MOSTLY_Q4_K_M || ftype == MOSTLY_Q5_K_M) && use_more_bits(i, n)) {
            t = SMOL_TYPE_Q6_K;
        } else if (ftype == MOSTLY_Q4_K_S && i < 4) {
            t = SMOL_TYPE_Q5_K;
        }
        ++qs.i_attention_wv;
    } else if (cat == category::ffn_down) {
        const int i = qs.i_ffn_down, n = qs.n_ffn_down;
        if (ftype == MOSTLY_Q2_K) {
            t = SMOL_TYPE_Q3_K;
        } else if (ftype == MOSTLY_Q3_K_M) {
            t = i < n / 16 ? SMOL_TYPE_Q5_K : SMOL_TYPE_Q4_K;
        } else if (ftype == MOSTLY_Q3_K_L) {
            t = SMOL_TYPE_Q5_K;
        } else if (ftype == MOSTLY_Q4_K_M) {
            if (use_more_bits(i, n)) t = SMOL_TYPE_Q6_K;
        } else if (i < n / 8 && (ftype == MOSTLY_IQ4_NL || ftype == MOSTLY_IQ4_XS)) {
            t = SMOL_TYPE_Q5_K;
        } else if (ftype == MOSTLY_Q5_K_M && use_more_bits(i, n)) {
            t = SMOL_TYPE_Q6_K;
        } else if (ftype == MOSTLY_Q4_K_S && i < n / 8) {
            t = SMOL_TYPE_Q5_K;
        }
        ++qs.i_ffn_down;
    } else if (cat == category::attn_output) {
        if (ftype == MOSTLY_Q2_K) {
            t = SMOL_TYPE_Q3_K;
        } else if (ftype == MOSTLY_Q3_K_M) {
            t = SMOL_TYPE_Q4_K;
        } else if (ftype == MOSTLY_Q3_K_L) {
            t = SMOL_TYPE_Q5_K;
        }
    }
    return t;
}

// A type whose block does not divide the rows gives way to one whose does,
// as llama-quantize's tensor_type_fallback; f16 if even that does not.
smol_type fallback(const tensor_desc & ti, smol_type t, bool & fell_back) {
    fell_back = false;
    if (ti.ne0 % type_block_elems(t) == 0) return t;
    fell_back = true;
    switch (t) {
    case SMOL_TYPE_IQ4_XS:
        t = SMOL_TYPE_IQ4_NL;
        break;
    case SMOL_TYPE_Q2_K:
    case SMOL_TYPE_Q3_K:
        t = SMOL_TYPE_Q4_0;
        break;
    case SMOL_TYPE_Q4_K:
        t = SMOL_TYPE_Q5_0;
        break;
    case SMOL_TYPE_Q5_K:
        t = SMOL_TYPE_Q5_1;
        break;
    case SMOL_TYPE_Q6_K:
        t = SMOL_TYPE_Q8_0;
        break;
    default:
        break;
    }
    if (ti.ne0 % type_block_elems(t) != 0) t = SMOL_TYPE_F16;
    return t;
}

std::string name_of(smol_type t) {
    const char * n = smol_type_name(t);
    return n ? n : "type " + std::to_string(int(t));
}

} // namespace

const recipe * find_recipe(const std::string & name) {
    std::string up = name;
    std::transform(up.begin(), up.end(), up.begin(),
                   [](unsigned char c) { return char(std::toupper(c)); });
    if (up == "Q4_K") up = "Q4_K_M";
    if (up == "Q5_K") up = "Q5_K_M";
    if (up == "Q3_K") up = "Q3_K_M";
    for (const recipe & r : k_recipes)
        if (up == r.name) return &r;
    return nullptr;
}

std::string recipe_names() {
    std::string out;
    for (const recipe & r : k_recipes) out += (out.empty() ? "" : ", ") + std::string(r.name);
    return out;
}

std::vector<size_t> quantize_order(const std::vector<tensor_desc> & ts) {
    std::vector<int> layer(ts.size(), -1);
    for (size_t i = 0; i < ts.size(); ++i) std::sscanf(ts[i].name.c_str(), "blk.%d.", &layer[i]);
    std::vector<size_t> order(ts.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        if (layer[a] != layer[b]) return layer[a] < layer[b];
        return ts[a].name < ts[b].name;
    });
    return order;
}

std::vector<tensor_choice> choose_types(const recipe & r, const std::vector<tensor_desc> & ts,
                                        const recipe_model & m) {
    counters qs;
    qs.n_ffn_down = m.n_layer;
    qs.n_gqa = m.n_head_kv > 0 ? m.n_head / m.n_head_kv : 1;
    for (const auto & t : ts) {
        const category c = category_of(t.name);
        if (is_attn_v(c)) ++qs.n_attention_wv;
        if (c == category::output) qs.tied_embeddings = false;
    }
    const bool quantized_base = traits_of(r.base)->quantized;
    std::vector<tensor_choice> out(ts.size());
    for (size_t i : quantize_order(ts)) {
        const tensor_desc & t = ts[i];
        tensor_choice & c = out[i];
        c.fell_back = false;
        if (!quantizable(t)) {
            // Kept, but 1-D tensors (norms) in f32, which smol computes with.
            c.type = t.n_dims == 1 ? SMOL_TYPE_F32 : t.type;
            continue;
        }
        if (!quantized_base) {
            c.type = r.base;
            continue;
        }
        c.type = fallback(t, rule(qs, r.base, t, r.ftype, category_of(t.name)), c.fell_back);
    }
    return out;
}

void quantize_model(const std::string & in_path, const std::string & out_path, const recipe & r,
                    int n_threads,
                    const std::function<void(const quantized_tensor &)> & on_tensor) {
    const std::unique_ptr<gguf::file> in = gguf::file::open(in_path);
    recipe_model m;
    const std::string arch = in->get_str("general.architecture").value_or("");
    m.n_layer = int32_t(in->get_i64(arch + ".block_count").value_or(0));
    m.n_head = int32_t(in->get_i64(arch + ".attention.head_count").value_or(0));
    m.n_head_kv = int32_t(in->get_i64(arch + ".attention.head_count_kv").value_or(m.n_head));
    std::vector<tensor_desc> descs;
    for (const gguf::tensor_info & t : in->tensors())
        descs.push_back({t.name, t.n_dims, t.ne[0], smol_type(t.type)});
    const std::vector<tensor_choice> choice = choose_types(r, descs, m);

    gguf::writer out;
    for (const gguf::kv & kv : in->metadata()) out.set(kv.key, kv.val);
    out.set("general.file_type", gguf::value::make_u32(r.ftype));
    if (traits_of(r.base)->quantized)
        out.set("general.quantization_version", gguf::value::make_u32(2));

    // The writer refers to tensor data until write(): converted tensors are
    // kept here, unchanged ones stay in the input's mapping.
    std::vector<std::vector<uint8_t>> converted;
    converted.reserve(in->tensors().size());
    const std::vector<size_t> order = quantize_order(descs);
    const cpu::kernels & k = cpu::kernels_best();
    for (size_t n = 0; n < order.size(); ++n) {
        const gguf::tensor_info & t = in->tensors()[order[n]];
        const smol_type to = choice[order[n]].type;
        const void * data = t.data;
        uint64_t nbytes = t.nbytes;
        if (uint32_t(to) != t.type) {
            if (!traits_of(smol_type(t.type))) {
                throw error(SMOL_ERR_UNSUPPORTED, in_path + ": tensor '" + t.name +
                                                      "' is of a type smol cannot read (" +
                                                      name_of(smol_type(t.type)) + ")");
            }
            const int64_t cols = t.ne[0], rows = t.n_elements() / cols;
            const size_t src_row = type_row_bytes(smol_type(t.type), cols);
            const size_t dst_row = type_row_bytes(to, cols);
            std::vector<uint8_t> & buf = converted.emplace_back(dst_row * size_t(rows));
            const auto * src = static_cast<const uint8_t *>(t.data);
            const int64_t workers = std::clamp<int64_t>(rows / 16, 1, std::max(1, n_threads));
            std::vector<std::thread> pool;
            for (int64_t w = 0; w < workers; ++w) {
                pool.emplace_back([&, w] {
                    std::vector<float> row(static_cast<size_t>(cols));
                    for (int64_t i = rows * w / workers; i < rows * (w + 1) / workers; ++i) {
                        k.row_to_f32(smol_type(t.type), src + size_t(i) * src_row, row.data(),
                                     cols);
                        quantize_row(to, row.data(), buf.data() + size_t(i) * dst_row, cols);
                    }
                });
            }
            for (std::thread & th : pool) th.join();
            data = buf.data();
            nbytes = buf.size();
        }
        out.add_tensor(t.name, uint32_t(to), std::vector<int64_t>(t.ne, t.ne + t.n_dims), data,
                       nbytes);
        if (on_tensor) on_tensor({&t, to, choice[order[n]].fell_back, nbytes, n, order.size()});
    }
    out.write(out_path);
}

} // namespace smol
