// test-convert.c++ - smol-convert's converter (examples/smol-convert) on
// Hugging Face checkpoints: a random Llama in HF's own layout, written by
// scripts/make-hf-checkpoint.py, must give the logits of that script's
// float64 forward pass and the token ids of the HF tokenizers library; and
// hostile inputs (lying headers, truncated shards, missing shards,
// contradictory configs, unsupported architectures, dtypes and tokenizers)
// must each end in an error naming the file and the field, with no output
// file left behind.

#include "decode-all.h"
#include "gguf.h"
#include "hf-convert.h"
#include "sentencepiece-model.h"
#include "smol.h"
#include "test-handles.h"
#include "test-seed.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <doctest/doctest.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// --- the Python-made checkpoint --------------------------------------------

const char * const python_modules = "numpy, gguf, safetensors, tokenizers";

// Whether scripts/make-hf-checkpoint.py can run here; says why not once.
bool checkpoint_maker_absent() {
    static const bool absent = [] {
        if (!fs::exists(SMOL_MODEL)) {
            std::fprintf(stderr,
                         "test-convert: skipping the HF checkpoint cases: %s is absent "
                         "(scripts/fetch-model.sh); its tokenizer is the checkpoint's\n",
                         SMOL_MODEL);
            return true;
        }
        const std::string cmd =
            std::string("python3 -c \"import ") + python_modules + "\" >/dev/null 2>&1";
        if (std::system(cmd.c_str()) != 0) {
            std::fprintf(stderr,
                         "test-convert: skipping the HF checkpoint cases: python3 lacks one of "
                         "%s (pip install %s)\n",
                         python_modules, "numpy gguf safetensors tokenizers");
            return true;
        }
        return false;
    }();
    return absent;
}

// Whether scripts/make-hf-gemma3.py can run under SMOL_GEMMA_PYTHON (it
// trains a SentencePiece tokenizer); says why not once.
bool gemma_maker_absent() {
    static const bool absent = [] {
        const std::string cmd = std::string(SMOL_GEMMA_PYTHON) +
                                " -c \"import numpy, safetensors, sentencepiece\" >/dev/null 2>&1";
        if (std::system(cmd.c_str()) != 0) {
            std::fprintf(stderr,
                         "test-convert: skipping the HF Gemma 3 cases: %s lacks numpy, "
                         "safetensors or sentencepiece (pip install numpy safetensors "
                         "sentencepiece, or configure with -DSMOL_CONVERT_PYTHON=...)\n",
                         SMOL_GEMMA_PYTHON);
            return true;
        }
        return false;
    }();
    return absent;
}

struct temp_dir {
    fs::path path;
    explicit temp_dir(const std::string & name) : path(test::temp_path(name)) {
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~temp_dir() { fs::remove_all(path); }
};

json read_json_file(const fs::path & p) {
    std::ifstream in(p);
    return json::parse(in);
}

std::string convert(const fs::path & dir, const fs::path & out, const char * type) {
    smol::convert::options o;
    o.model_dir = dir.string();
    o.out_path = out.string();
    o.to = smol::find_recipe(type);
    REQUIRE(o.to);
    o.n_threads = 2;
    smol::convert::convert_model(o);
    return out.string();
}

// The largest |smol - reference| of each sequence over its largest
// |reference|, the worst of all sequences.
double worst_relative_error(const std::string & gguf, const json & ref,
                            const std::vector<double> & logits) {
    test::model_ptr m = test::load(gguf);
    const int n_vocab = ref["n_vocab"].get<int>();
    double worst = 0;
    size_t at = 0;
    for (const json & seq : ref["sequences"]) {
        const std::vector<int> ids = seq.get<std::vector<int>>();
        smol_context_params cp = smol_context_default_params();
        cp.n_ctx = 256;
        cp.n_threads = 2;
        smol_context * c = nullptr;
        REQUIRE(smol_context_create(m.get(), &cp, &c) == SMOL_OK);
        test::context_ptr ctx(c);
        const auto got = test::decode_all(ctx.get(), ids, n_vocab, 64);
        double diff = 0, scale = 0;
        for (size_t p = 0; p < ids.size(); ++p) {
            for (int v = 0; v < n_vocab; ++v) {
                const double want = logits[at + p * size_t(n_vocab) + size_t(v)];
                diff = std::max(diff, std::fabs(double(got[p][size_t(v)]) - want));
                scale = std::max(scale, std::fabs(want));
            }
        }
        at += ids.size() * size_t(n_vocab);
        worst = std::max(worst, diff / scale);
    }
    return worst;
}

// --- hand-made checkpoints for the hostile cases ---------------------------

struct st_entry {
    std::string name;
    std::string dtype = "F32";
    std::vector<int64_t> shape;
};

// The value of element i of an F32 tensor of a hand-made file.
using fill_fn = std::function<float(const st_entry &, int64_t i)>;

// A safetensors file of the given entries (F32 data from fill, else zeros),
// its header passed through edit before it is written, and cut to `keep`
// bytes if set.
void write_safetensors(const fs::path & p, const std::vector<st_entry> & entries,
                       const std::function<void(json &)> & edit = nullptr, size_t keep = 0,
                       const fill_fn & fill = nullptr) {
    json h = json::object();
    uint64_t off = 0;
    for (const st_entry & e : entries) {
        uint64_t n = e.dtype == "F32" || e.dtype == "I32" ? 4 : e.dtype == "I64" ? 8 : 2;
        for (int64_t d : e.shape) n *= uint64_t(d);
        h[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {off, off + n}}};
        off += n;
    }
    h["__metadata__"] = {{"format", "pt"}};
    if (edit) edit(h);
    std::string text = h.dump();
    while (text.size() % 8) text += ' ';
    std::string bytes(8, '\0');
    const uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char((n >> (8 * i)) & 0xff);
    bytes += text;
    const size_t data_start = bytes.size();
    bytes += std::string(off, '\0');
    if (fill) {
        size_t at = data_start;
        for (const st_entry & e : entries) {
            int64_t n = 1;
            for (int64_t d : e.shape) n *= d;
            for (int64_t i = 0; i < n && e.dtype == "F32"; ++i, at += 4) {
                const float v = fill(e, i);
                std::memcpy(&bytes[at], &v, 4);
            }
        }
    }
    if (keep) bytes.resize(keep);
    std::ofstream(p, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

// A tiny Llama: hidden 8, 1 layer, 2 heads over 1 kv head, ff 16, vocab 8.
json tiny_config() {
    return {{"architectures", {"LlamaForCausalLM"}},
            {"hidden_size", 8},
            {"num_hidden_layers", 1},
            {"num_attention_heads", 2},
            {"num_key_value_heads", 1},
            {"intermediate_size", 16},
            {"vocab_size", 8},
            {"rms_norm_eps", 1e-5},
            {"rope_theta", 10000.0},
            {"max_position_embeddings", 64},
            {"tie_word_embeddings", true},
            {"bos_token_id", 0},
            {"eos_token_id", 1}};
}

std::vector<st_entry> tiny_tensors() {
    const std::string l = "model.layers.0.";
    return {{"model.embed_tokens.weight", "F32", {8, 8}},
            {"model.norm.weight", "F32", {8}},
            {l + "input_layernorm.weight", "F32", {8}},
            {l + "post_attention_layernorm.weight", "F32", {8}},
            {l + "self_attn.q_proj.weight", "F32", {8, 8}},
            {l + "self_attn.k_proj.weight", "F32", {4, 8}},
            {l + "self_attn.v_proj.weight", "F32", {4, 8}},
            {l + "self_attn.o_proj.weight", "F32", {8, 8}},
            {l + "mlp.gate_proj.weight", "F32", {16, 8}},
            {l + "mlp.up_proj.weight", "F32", {16, 8}},
            {l + "mlp.down_proj.weight", "F32", {8, 16}}};
}

json tiny_tokenizer() {
    json vocab = json::object();
    const char * toks[] = {"<|endoftext|>", "<|im_start|>", "a", "b", "ab", "\xC4\xA0", "c", "d"};
    for (int i = 0; i < 8; ++i) vocab[toks[i]] = i;
    return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b"}}}},
            {"normalizer", nullptr},
            {"pre_tokenizer",
             {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
            {"added_tokens",
             {{{"id", 0}, {"content", "<|endoftext|>"}, {"special", true}},
              {{"id", 1}, {"content", "<|im_start|>"}, {"special", true}}}}};
}

void write_json(const fs::path & p, const json & j) {
    std::ofstream(p) << j.dump(2);
}

// A directory holding a valid tiny checkpoint, for each case to break.
struct tiny_dir : temp_dir {
    explicit tiny_dir(const std::string & name) : temp_dir(name) {
        write_json(path / "config.json", tiny_config());
        write_json(path / "tokenizer.json", tiny_tokenizer());
        write_json(path / "tokenizer_config.json", {{"bos_token", "<|im_start|>"}});
        write_safetensors(path / "model.safetensors", tiny_tensors());
    }
    fs::path out() const { return path / "out.gguf"; }
};

// Converting d fails with a message holding every one of parts, and leaves
// no output file behind.
void check_refused(const tiny_dir & d, const std::vector<std::string> & parts) {
    std::string message;
    try {
        convert(d.path, d.out(), "F16");
    } catch (const std::exception & e) {
        message = e.what();
    }
    INFO("message: ", message);
    REQUIRE_FALSE(message.empty());
    for (const std::string & p : parts) {
        INFO("expected in the message: ", p);
        CHECK(message.find(p) != std::string::npos);
    }
    CHECK_FALSE(fs::exists(d.out()));
    for (const auto & e : fs::directory_iterator(d.path)) {
        INFO("left behind: ", e.path().string());
        CHECK(e.path().filename().string().find("out.gguf") == std::string::npos);
    }
}

// --- hand-made Gemma 3 checkpoints and tokenizer.model files --------------

// Protobuf's wire format, written by hand: a key, then its value.
std::string pb_varint(uint64_t v) {
    std::string out;
    do {
        out += char((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return out;
}
std::string pb_key(uint32_t field, uint32_t wire) {
    return pb_varint(uint64_t(field) << 3 | wire);
}
std::string pb_bytes(uint32_t field, const std::string & s) {
    return pb_key(field, 2) + pb_varint(s.size()) + s;
}
std::string pb_float(uint32_t field, float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    std::string out = pb_key(field, 5);
    for (int i = 0; i < 4; ++i) out += char((b >> (8 * i)) & 0xff);
    return out;
}
std::string pb_piece(const std::string & text, float score, int type) {
    return pb_bytes(1, pb_bytes(1, text) + pb_float(2, score) + pb_key(3, 0) +
                           pb_varint(uint64_t(type)));
}

// Pieces of each SentencePiece type, 1 to 6, with fields of every wire
// type the reader must skip around them (trainer_spec, a fixed64, ...).
std::string tiny_sentencepiece_model() {
    std::string m;
    m += pb_piece("<pad>", 0.0f, 3);                                    // CONTROL
    m += pb_piece("<unk>", 0.0f, 2);                                    // UNKNOWN
    m += pb_piece("a", -1.5f, 1);                                       // NORMAL
    m += pb_piece("<turn>", 0.0f, 4);                                   // USER_DEFINED
    m += pb_piece("<unused0>", 0.0f, 5);                                // UNUSED
    m += pb_piece("<0x41>", 0.0f, 6);                                   // BYTE
    m += pb_bytes(2, pb_key(3, 0) + pb_varint(2) + pb_bytes(7, "bpe")); // trainer_spec
    m += pb_key(9, 1) + std::string(8, '\x01');                         // a fixed64
    m += pb_key(10, 5) + std::string(4, '\x02');                        // a fixed32
    m += pb_key(11, 0) + pb_varint(uint64_t(1) << 62);                  // a varint
    return m;
}

// A tiny Gemma 3: hidden 8, 1 layer, 2 heads of 4 over 1 kv head, ff 16,
// vocab 8 (the tokenizer's 6 pieces and 2 pads).
json tiny_gemma_config() {
    return {{"architectures", {"Gemma3ForCausalLM"}},
            {"model_type", "gemma3_text"},
            {"hidden_size", 8},
            {"num_hidden_layers", 1},
            {"num_attention_heads", 2},
            {"num_key_value_heads", 1},
            {"head_dim", 4},
            {"intermediate_size", 16},
            {"vocab_size", 8},
            {"sliding_window", 4},
            {"rope_local_base_freq", 10000.0},
            {"rope_theta", 1000000.0},
            {"bos_token_id", 2},
            {"eos_token_id", 1}};
}

std::vector<st_entry> tiny_gemma_tensors() {
    const std::string l = "model.layers.0.";
    return {{"model.embed_tokens.weight", "F32", {8, 8}},
            {"model.norm.weight", "F32", {8}},
            {l + "input_layernorm.weight", "F32", {8}},
            {l + "post_attention_layernorm.weight", "F32", {8}},
            {l + "pre_feedforward_layernorm.weight", "F32", {8}},
            {l + "post_feedforward_layernorm.weight", "F32", {8}},
            {l + "self_attn.q_norm.weight", "F32", {4}},
            {l + "self_attn.k_norm.weight", "F32", {4}},
            {l + "self_attn.q_proj.weight", "F32", {8, 8}},
            {l + "self_attn.k_proj.weight", "F32", {4, 8}},
            {l + "self_attn.v_proj.weight", "F32", {4, 8}},
            {l + "self_attn.o_proj.weight", "F32", {8, 8}},
            {l + "mlp.gate_proj.weight", "F32", {16, 8}},
            {l + "mlp.up_proj.weight", "F32", {16, 8}},
            {l + "mlp.down_proj.weight", "F32", {8, 16}}};
}

struct tiny_gemma_dir : tiny_dir {
    explicit tiny_gemma_dir(const std::string & name) : tiny_dir(name) {
        fs::remove(path / "tokenizer.json");
        write_json(path / "config.json", tiny_gemma_config());
        write_json(path / "tokenizer_config.json",
                   {{"add_bos_token", true}, {"add_eos_token", false}});
        write_safetensors(path / "model.safetensors", tiny_gemma_tensors(), nullptr, 0,
                          [](const st_entry &, int64_t i) { return 0.25f * float(i % 4); });
        const std::string m = tiny_sentencepiece_model();
        std::ofstream(path / "tokenizer.model", std::ios::binary)
            .write(m.data(), std::streamsize(m.size()));
    }
};

// The message parse_sentencepiece_model gives bytes, or "" if it takes them.
std::string sentencepiece_refusal(const std::string & bytes) {
    try {
        smol::convert::parse_sentencepiece_model(reinterpret_cast<const uint8_t *>(bytes.data()),
                                                 bytes.size(), "bad.model");
    } catch (const std::exception & e) {
        return e.what();
    }
    return "";
}

} // namespace

TEST_CASE("the tiny hand-made checkpoint converts, so each hostile case breaks only its own "
          "part") {
    tiny_dir d("convert-ok");
    convert(d.path, d.out(), "F16");
    const auto f = gguf::file::open(d.out().string());
    CHECK(f->get_str("tokenizer.ggml.pre") == "gpt-2");
    const auto * merges = f->get_array("tokenizer.ggml.merges", gguf::type::STRING);
    REQUIRE(merges);
    REQUIRE(merges->size() == 1);
    CHECK((*merges)[0].str == "a b");
    const auto * types = f->get_array("tokenizer.ggml.token_type", gguf::type::INT32);
    REQUIRE(types);
    CHECK((*types)[0].i == 3); // special added tokens are CONTROL
    CHECK((*types)[2].i == 1);
    CHECK(f->get_u64("tokenizer.ggml.bos_token_id") == 1); // tokenizer_config's "<|im_start|>"
    CHECK(f->get_u64("tokenizer.ggml.eos_token_id") == 1); // config.json's eos_token_id
    CHECK(f->find_tensor("output.weight") == nullptr);     // tied: the embeddings serve
}

TEST_CASE("merges given as pairs are joined with a space, spaces inside written as U+0120") {
    tiny_dir d("convert-merge-pairs");
    json t = tiny_tokenizer();
    t["model"]["merges"] = json::array({json::array({"a", "b"}), json::array({"a b", "c"})});
    write_json(d.path / "tokenizer.json", t);
    convert(d.path, d.out(), "F16");
    const auto f = gguf::file::open(d.out().string());
    const auto * merges = f->get_array("tokenizer.ggml.merges", gguf::type::STRING);
    REQUIRE(merges);
    REQUIRE(merges->size() == 2);
    CHECK((*merges)[0].str == "a b");
    CHECK((*merges)[1].str == "a\xC4\xA0"
                              "b c");
}

TEST_CASE("Q and K rows go from HF's half-split heads to GGUF's interleaved pairs") {
    // Each row of q_proj and k_proj holds its own row number. Heads of 4:
    // HF keeps a head's pairs (x0, x2), (x1, x3); GGUF's Llama wants
    // (x0, x1), (x2, x3), so a head's rows come out as 0, 2, 1, 3.
    tiny_dir d("convert-permute");
    write_safetensors(d.path / "model.safetensors", tiny_tensors(), nullptr, 0,
                      [](const st_entry & e, int64_t i) {
                          return e.shape.size() == 2 ? float(i / e.shape[1]) : 1.0f;
                      });
    convert(d.path, d.out(), "F32");
    const auto f = gguf::file::open(d.out().string());
    auto rows = [&](const char * name) {
        const gguf::tensor_info * t = f->find_tensor(name);
        REQUIRE(t);
        std::vector<int> out;
        for (int64_t r = 0; r < t->ne[1]; ++r) {
            float v;
            std::memcpy(&v, static_cast<const char *>(t->data) + size_t(r * t->ne[0]) * 4, 4);
            out.push_back(int(v));
        }
        return out;
    };
    CHECK(rows("blk.0.attn_q.weight") == std::vector<int>{0, 2, 1, 3, 4, 6, 5, 7});
    CHECK(rows("blk.0.attn_k.weight") == std::vector<int>{0, 2, 1, 3});
    CHECK(rows("blk.0.attn_v.weight") == std::vector<int>{0, 1, 2, 3});
}

TEST_CASE("a converted random HF Llama gives the logits of a float64 forward pass in HF's "
          "layout, and the HF tokenizer's ids" *
          doctest::skip(checkpoint_maker_absent())) {
    SMOL_TEST_DRAW_SEED(seed);
    struct variant {
        const char * dtype;
        int shards;
        const char * type;
        double bound; // largest |error| over largest |logit|, per sequence
    };
    // f32 and bf16 weights reach smol exactly (bf16 is widened to f32 by
    // the matmul); what separates smol from float64 is then its attention,
    // which rounds queries, keys, values (its KV cache is f16) and the
    // softmax weights to f16, as ggml's does: about 1e-3 of the largest
    // logit. f16 weights, and activations rounded to f16 for their
    // matmuls, add f16's rounding throughout.
    const variant variants[] = {
        {"f32", 1, "F32", 3e-3},  {"f32", 1, "F16", 6e-3}, {"bf16", 2, "BF16", 3e-3},
        {"bf16", 2, "F32", 3e-3}, {"f16", 1, "F16", 6e-3},
    };
    std::string last_made;
    temp_dir dir("convert-hf");
    json ref;
    std::vector<double> logits;
    for (const variant & v : variants) {
        const std::string variant_name = std::string(v.dtype) + " checkpoint -> " + v.type;
        CAPTURE(variant_name);
        const fs::path model = dir.path / (std::string("tiny-") + v.dtype);
        if (last_made != v.dtype) {
            const std::string cmd =
                std::string("python3 ") + SMOL_SCRIPTS + "/make-hf-checkpoint.py " +
                model.string() + " --vocab-from " + SMOL_MODEL + " --seed " + std::to_string(seed) +
                " --dtype " + v.dtype + " --shards " + std::to_string(v.shards) + " >/dev/null";
            REQUIRE(std::system(cmd.c_str()) == 0);
            last_made = v.dtype;
            ref = read_json_file(model / "reference.json");
            std::ifstream in(model / ref["logits_file"].get<std::string>(),
                             std::ios::binary | std::ios::ate);
            logits.resize(size_t(in.tellg()) / sizeof(double));
            in.seekg(0);
            in.read(reinterpret_cast<char *>(logits.data()),
                    std::streamsize(logits.size() * sizeof(double)));
        }
        const fs::path out = dir.path / (std::string(v.dtype) + "-" + v.type + ".gguf");
        convert(model, out, v.type);
        const double err = worst_relative_error(out.string(), ref, logits);
        MESSAGE(variant_name << ": worst relative logit error " << err << " (bound " << v.bound
                             << ")");
        CHECK(err < v.bound);

        // The tokenizer: the HF tokenizers library's ids, special tokens
        // in the text parsed as it parses them.
        test::model_ptr m = test::load(out.string());
        for (const json & t : ref["texts"]) {
            const std::string text = t["text"].get<std::string>();
            const std::vector<int> want = t["ids"].get<std::vector<int>>();
            std::vector<smol_token> got(text.size() + 8);
            int32_t n = 0;
            REQUIRE(smol_tokenize(m.get(), text.data(), text.size(), false, true, got.data(),
                                  int32_t(got.size()), &n) == SMOL_OK);
            got.resize(size_t(n));
            INFO("text: ", text);
            CHECK(std::vector<int>(got.begin(), got.end()) == want);
        }
    }
}

TEST_CASE("a converted random HF Gemma 3 gives the logits of a float64 forward pass in HF's "
          "layout, and sentencepiece's ids" *
          doctest::skip(gemma_maker_absent())) {
    SMOL_TEST_DRAW_SEED(seed);
    struct variant {
        const char * dtype;
        int shards;
        const char * type;
        double bound; // largest |error| over largest |logit|, per sequence
    };
    // As for Llama: f32 and bf16 weights reach smol exactly, and its f16
    // attention (queries, keys, values, softmax weights) is what separates
    // it from float64; f16 weights and f16 activations in the matmuls add
    // f16's rounding. Gemma's norms after each block and its embedding
    // scale keep the same relative size of error.
    const variant variants[] = {
        {"f32", 1, "F32", 3e-3},
        {"f32", 1, "F16", 6e-3},
        {"bf16", 2, "BF16", 3e-3},
        {"f16", 1, "F16", 6e-3},
    };
    std::string last_made;
    temp_dir dir("convert-hf-gemma3");
    json ref;
    std::vector<double> logits;
    for (const variant & v : variants) {
        const std::string variant_name = std::string(v.dtype) + " checkpoint -> " + v.type;
        CAPTURE(variant_name);
        const fs::path model = dir.path / (std::string("gemma3-") + v.dtype);
        if (last_made != v.dtype) {
            const std::string cmd = std::string(SMOL_GEMMA_PYTHON) + " " + SMOL_SCRIPTS +
                                    "/make-hf-gemma3.py " + model.string() + " --seed " +
                                    std::to_string(seed) + " --dtype " + v.dtype + " --shards " +
                                    std::to_string(v.shards) + " >/dev/null";
            REQUIRE(std::system(cmd.c_str()) == 0);
            last_made = v.dtype;
            ref = read_json_file(model / "reference.json");
            std::ifstream in(model / ref["logits_file"].get<std::string>(),
                             std::ios::binary | std::ios::ate);
            logits.resize(size_t(in.tellg()) / sizeof(double));
            in.seekg(0);
            in.read(reinterpret_cast<char *>(logits.data()),
                    std::streamsize(logits.size() * sizeof(double)));
        }
        const fs::path out = dir.path / (std::string("gemma3-") + v.dtype + "-" + v.type + ".gguf");
        convert(model, out, v.type);
        const double err = worst_relative_error(out.string(), ref, logits);
        MESSAGE(variant_name << ": worst relative logit error " << err << " (bound " << v.bound
                             << ")");
        CHECK(err < v.bound);

        // The tokenizer: sentencepiece's ids, the turn markers (special in
        // tokenizer_config.json) parsed as sentencepiece matches them.
        test::model_ptr m = test::load(out.string());
        for (const json & t : ref["texts"]) {
            const std::string text = t["text"].get<std::string>();
            const std::vector<int> want = t["ids"].get<std::vector<int>>();
            std::vector<smol_token> got(4 * text.size() + 8);
            int32_t n = 0;
            REQUIRE(smol_tokenize(m.get(), text.data(), text.size(), false, true, got.data(),
                                  int32_t(got.size()), &n) == SMOL_OK);
            got.resize(size_t(n));
            INFO("text: ", text);
            CHECK(std::vector<int>(got.begin(), got.end()) == want);
        }
    }
}

TEST_CASE("a safetensors header whose length runs past the file is refused") {
    tiny_dir d("convert-header-length");
    const fs::path p = d.path / "model.safetensors";
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    const char huge[8] = {0, 0, 0, 0, 1, 0, 0, 0};
    f.write(huge, 8);
    f.close();
    check_refused(d, {"model.safetensors", "header length"});
}

TEST_CASE("a safetensors header that is not JSON is refused") {
    tiny_dir d("convert-header-json");
    const fs::path p = d.path / "model.safetensors";
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.write("#!", 2);
    f.close();
    check_refused(d, {"model.safetensors", "not valid JSON"});
}

TEST_CASE("data_offsets that disagree with dtype and shape are refused") {
    tiny_dir d("convert-offsets");
    write_safetensors(d.path / "model.safetensors", tiny_tensors(),
                      [](json & h) { h["model.norm.weight"]["shape"] = {9}; });
    check_refused(d, {"model.safetensors", "model.norm.weight", "data_offsets", "need 36"});
}

TEST_CASE("overlapping tensors are refused") {
    tiny_dir d("convert-overlap");
    write_safetensors(d.path / "model.safetensors", tiny_tensors(), [](json & h) {
        h["model.norm.weight"]["data_offsets"] =
            h["model.layers.0.input_layernorm.weight"]["data_offsets"];
    });
    check_refused(d, {"model.safetensors", "overlap", "model.norm.weight"});
}

TEST_CASE("an unsupported dtype is refused, named") {
    tiny_dir d("convert-dtype");
    auto t = tiny_tensors();
    t[1].dtype = "I64";
    write_safetensors(d.path / "model.safetensors", t);
    check_refused(d, {"model.safetensors", "model.norm.weight", "dtype I64", "not supported"});
}

TEST_CASE("a truncated shard is refused") {
    tiny_dir d("convert-truncated");
    const fs::path p = d.path / "model.safetensors";
    const auto size = fs::file_size(p);
    fs::resize_file(p, size - 10);
    check_refused(d, {"model.safetensors", "data_offsets", "truncated"});
}

TEST_CASE("an index naming a missing shard is refused") {
    tiny_dir d("convert-index");
    fs::remove(d.path / "model.safetensors");
    auto t = tiny_tensors();
    write_safetensors(d.path / "model-00001-of-00002.safetensors",
                      std::vector<st_entry>(t.begin(), t.begin() + 5));
    json map = json::object();
    for (size_t i = 0; i < t.size(); ++i)
        map[t[i].name] =
            i < 5 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    write_json(d.path / "model.safetensors.index.json", {{"weight_map", map}});
    check_refused(d,
                  {"model.safetensors.index.json", "model-00002-of-00002.safetensors", "missing"});
}

TEST_CASE("an index putting a tensor in a shard that lacks it is refused") {
    tiny_dir d("convert-index-tensor");
    fs::remove(d.path / "model.safetensors");
    auto t = tiny_tensors();
    write_safetensors(d.path / "model-00001-of-00001.safetensors",
                      std::vector<st_entry>(t.begin(), t.end() - 1));
    json map = json::object();
    for (const st_entry & e : t) map[e.name] = "model-00001-of-00001.safetensors";
    write_json(d.path / "model.safetensors.index.json", {{"weight_map", map}});
    check_refused(d, {"model.safetensors.index.json", "mlp.down_proj.weight", "does not hold"});
}

TEST_CASE("a config.json without hidden_size is refused") {
    tiny_dir d("convert-config-missing");
    json c = tiny_config();
    c.erase("hidden_size");
    write_json(d.path / "config.json", c);
    check_refused(d, {"config.json", "hidden_size", "missing"});
}

TEST_CASE("a hidden_size not divisible by num_attention_heads is refused") {
    tiny_dir d("convert-config-heads");
    json c = tiny_config();
    c["num_attention_heads"] = 3;
    write_json(d.path / "config.json", c);
    check_refused(d, {"config.json", "hidden_size 8", "num_attention_heads 3"});
}

TEST_CASE("a tensor whose shape disagrees with config.json is refused") {
    tiny_dir d("convert-shape");
    json c = tiny_config();
    c["num_key_value_heads"] = 2;
    write_json(d.path / "config.json", c);
    check_refused(d, {"model.safetensors", "model.layers.0.self_attn.k_proj.weight",
                      "num_key_value_heads 2", "[4, 8]", "[8, 8]"});
}

TEST_CASE("a missing tensor is refused, named") {
    tiny_dir d("convert-missing-tensor");
    auto t = tiny_tensors();
    t.erase(t.begin() + 8);
    write_safetensors(d.path / "model.safetensors", t);
    check_refused(d, {"model.layers.0.mlp.gate_proj.weight", "missing"});
}

TEST_CASE("untied embeddings without lm_head.weight are refused") {
    tiny_dir d("convert-untied");
    json c = tiny_config();
    c["tie_word_embeddings"] = false;
    write_json(d.path / "config.json", c);
    check_refused(d, {"lm_head.weight", "tie_word_embeddings"});
}

TEST_CASE("an architecture other than Llama is refused, named") {
    tiny_dir d("convert-arch");
    json c = tiny_config();
    c["architectures"] = {"MambaForCausalLM"};
    write_json(d.path / "config.json", c);
    check_refused(d, {"config.json", "architectures", "MambaForCausalLM", "LlamaForCausalLM",
                      "Gemma3ForCausalLM"});
}

TEST_CASE("a tokenizer other than byte-level BPE is refused") {
    tiny_dir d("convert-tokenizer");
    json t = tiny_tokenizer();
    t["model"]["type"] = "Unigram";
    write_json(d.path / "tokenizer.json", t);
    check_refused(d, {"tokenizer.json", "model.type", "Unigram"});
}

TEST_CASE("a tokenizer id past config.json's vocab_size is refused") {
    tiny_dir d("convert-vocab-size");
    json t = tiny_tokenizer();
    t["added_tokens"].push_back({{"id", 8}, {"content", "<|extra|>"}, {"special", true}});
    write_json(d.path / "tokenizer.json", t);
    check_refused(d, {"tokenizer.json", "<|extra|>", "vocab_size 8"});
}

TEST_CASE("tokenizer.model pieces are read with their scores and types, other fields skipped") {
    const std::string m = tiny_sentencepiece_model();
    const auto pieces = smol::convert::parse_sentencepiece_model(
        reinterpret_cast<const uint8_t *>(m.data()), m.size(), "tiny.model");
    REQUIRE(pieces.size() == 6);
    CHECK(pieces[0].piece == "<pad>");
    CHECK(pieces[2].piece == "a");
    CHECK(pieces[2].score == -1.5f);
    CHECK(pieces[5].piece == "<0x41>");
    for (int i = 0; i < 6; ++i) {
        const int want[] = {3, 2, 1, 4, 5, 6};
        CHECK(int(pieces[size_t(i)].type) == want[i]);
    }
    // Score and type absent: 0 and NORMAL, protobuf's defaults.
    const std::string bare = pb_bytes(1, pb_bytes(1, "x"));
    const auto one = smol::convert::parse_sentencepiece_model(
        reinterpret_cast<const uint8_t *>(bare.data()), bare.size(), "bare.model");
    REQUIRE(one.size() == 1);
    CHECK(one[0].score == 0.0f);
    CHECK(one[0].type == smol::convert::sp_type::NORMAL);
}

TEST_CASE("a hostile tokenizer.model is refused, naming the file") {
    const std::string good = tiny_sentencepiece_model();
    struct hostile {
        const char * what;
        std::string bytes;
        const char * says;
    };
    const hostile cases[] = {
        {"truncated in a piece", good.substr(0, 20), "past the end"},
        {"a length past the end", pb_key(1, 2) + pb_varint(1000) + "abc", "past the end"},
        {"an overlong varint", pb_key(11, 0) + std::string(11, '\xff'), "varint"},
        {"a varint past 64 bits", pb_key(11, 0) + std::string(9, '\xff') + "\x7f", "64 bits"},
        {"a varint cut off", pb_key(11, 0) + "\x80", "past the end"},
        {"wire type 3 (a group)", pb_key(12, 3), "wire type 3"},
        {"field 1 not length-delimited", pb_key(1, 0) + pb_varint(5), "wire type 0"},
        {"a type out of range", pb_bytes(1, pb_bytes(1, "x") + pb_key(3, 0) + pb_varint(9)),
         "type 9"},
        {"a score of the wrong wire type", pb_bytes(1, pb_key(2, 0) + pb_varint(1)), "wire type 0"},
        {"no pieces", pb_key(11, 0) + pb_varint(1), "no pieces"},
        {"empty", "", "no pieces"},
    };
    for (const hostile & h : cases) {
        const std::string message = sentencepiece_refusal(h.bytes);
        INFO(h.what, ": ", message);
        CHECK(message.find("bad.model") != std::string::npos);
        CHECK(message.find(h.says) != std::string::npos);
    }
}

TEST_CASE("a Gemma 3 checkpoint converts: its pieces typed as llama.cpp types them, norms plus "
          "one, padded to vocab_size") {
    tiny_gemma_dir d("convert-gemma");
    convert(d.path, d.out(), "F32");
    const auto f = gguf::file::open(d.out().string());
    CHECK(f->get_str("general.architecture") == "gemma3");
    CHECK(f->get_str("tokenizer.ggml.model") == "llama");
    CHECK(f->get_u64("gemma3.attention.sliding_window") == 4);
    const auto * tokens = f->get_array("tokenizer.ggml.tokens", gguf::type::STRING);
    const auto * types = f->get_array("tokenizer.ggml.token_type", gguf::type::INT32);
    const auto * scores = f->get_array("tokenizer.ggml.scores", gguf::type::FLOAT32);
    REQUIRE(tokens);
    REQUIRE(types);
    REQUIRE(scores);
    REQUIRE(tokens->size() == 8);
    // CONTROL, UNKNOWN, NORMAL, USER_DEFINED (NORMAL in GGUF, as
    // convert_hf_to_gguf asks sentencepiece only for the other four),
    // UNUSED, BYTE, then two pads (UNUSED).
    const int want[] = {3, 2, 1, 1, 5, 6, 5, 5};
    for (size_t i = 0; i < 8; ++i) {
        CAPTURE(i);
        CHECK((*types)[i].i == want[i]);
    }
    CHECK((*tokens)[6].str == "[PAD6]");
    CHECK((*scores)[2].f == -1.5);
    CHECK((*scores)[7].f == -10000.0);
    CHECK(f->get_u64("tokenizer.ggml.bos_token_id") == 2);
    CHECK(f->find("tokenizer.ggml.add_space_prefix"));
    const gguf::tensor_info * norm = f->find_tensor("blk.0.attn_q_norm.weight");
    REQUIRE(norm);
    float v[4];
    std::memcpy(v, norm->data, sizeof v);
    CHECK(v[0] == 1.0f);
    CHECK(v[3] == 1.75f);
}

TEST_CASE("a Gemma 3 checkpoint without tokenizer.model is refused, naming it") {
    tiny_gemma_dir d("convert-gemma-no-model");
    fs::remove(d.path / "tokenizer.model");
    write_json(d.path / "tokenizer.json", tiny_tokenizer());
    check_refused(d, {"tokenizer.model", "is missing"});
}

TEST_CASE("a Gemma 3 checkpoint whose tokenizer.model is cut short is refused") {
    tiny_gemma_dir d("convert-gemma-cut");
    const std::string m = tiny_sentencepiece_model().substr(0, 30);
    std::ofstream(d.path / "tokenizer.model", std::ios::binary)
        .write(m.data(), std::streamsize(m.size()));
    check_refused(d, {"tokenizer.model", "past the end"});
}

TEST_CASE("a pair template with the eos between A and B adds it as the separator") {
    // gguf-py's SpecialVocab reads TemplateProcessing's pair template:
    // <bos> A <eos> B makes add_sep true, and the eos token the separator.
    tiny_dir d("convert-pair-template");
    json t = tiny_tokenizer();
    auto special = [](const char * id) { return json{{"SpecialToken", {{"id", id}}}}; };
    auto sequence = [](const char * id) { return json{{"Sequence", {{"id", id}}}}; };
    t["post_processor"] = {
        {"type", "TemplateProcessing"},
        {"single", {special("<|im_start|>"), sequence("A")}},
        {"pair",
         {special("<|im_start|>"), sequence("A"), special("<|endoftext|>"), sequence("B")}}};
    write_json(d.path / "tokenizer.json", t);
    write_json(d.path / "tokenizer_config.json",
               {{"bos_token", "<|im_start|>"}, {"eos_token", "<|endoftext|>"}});
    convert(d.path, d.out(), "F16");
    const auto f = gguf::file::open(d.out().string());
    CHECK(f->get_bool("tokenizer.ggml.add_bos_token") == true);
    CHECK(f->get_bool("tokenizer.ggml.add_sep_token") == true);
    CHECK(f->get_u64("tokenizer.ggml.seperator_token_id") == 0);
}

TEST_CASE("a Gemma 3 with linear RoPE scaling gets llama.cpp's scaling keys") {
    tiny_gemma_dir d("convert-gemma-linear");
    json c = tiny_gemma_config();
    c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
    write_json(d.path / "config.json", c);
    convert(d.path, d.out(), "F32");
    const auto f = gguf::file::open(d.out().string());
    CHECK(f->get_str("gemma3.rope.scaling.type") == "linear");
    CHECK(f->get_f64("gemma3.rope.scaling.factor") == 8.0);
    CHECK(f->get_f64("gemma3.rope.freq_base") == 1000000.0);
    CHECK(f->get_f64("gemma3.rope.freq_base_swa") == 10000.0);
}

TEST_CASE("a Gemma 3 config with RoPE scaling other than linear is refused, named") {
    tiny_gemma_dir d("convert-gemma-yarn");
    json c = tiny_gemma_config();
    c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
    write_json(d.path / "config.json", c);
    check_refused(d, {"config.json", "rope_scaling", "yarn"});
}

TEST_CASE("a Gemma 3 config with another activation is refused, named") {
    tiny_gemma_dir d("convert-gemma-act");
    json c = tiny_gemma_config();
    c["hidden_activation"] = "silu";
    write_json(d.path / "config.json", c);
    check_refused(d, {"config.json", "hidden_activation", "silu"});
}

TEST_CASE("a Gemma 3 checkpoint missing a per-head norm is refused, named") {
    tiny_gemma_dir d("convert-gemma-missing");
    auto t = tiny_gemma_tensors();
    t.erase(std::remove_if(t.begin(), t.end(),
                           [](const st_entry & e) {
                               return e.name == "model.layers.0.self_attn.k_norm.weight";
                           }),
            t.end());
    write_safetensors(d.path / "model.safetensors", t);
    check_refused(d, {"model.layers.0.self_attn.k_norm.weight", "missing"});
}
