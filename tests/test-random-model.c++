// test-random-model.c++ - the random-weight model writer behind
// `smol-quantize --random`: what it writes loads in smol with the shape,
// types and metadata asked for, decodes to finite logits, depends on the
// seed alone (not on threads), and carries a real file's tokenizer.
// scripts/check-random-gguf.py then reads the file it leaves in the build
// folder with the python gguf package (ctest: gguf-python-reads-random).

#include "gguf.h"
#include "random-model.h"
#include "smol.h"

#include <cmath>
#include <cstring>
#include <doctest/doctest.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

namespace {

namespace rm = smol::random_model;

std::string temp_path(const std::string & name) {
    return (std::filesystem::temp_directory_path() /
            ("smol-test-random-" + std::to_string(::getpid()) + "-" + name))
        .string();
}

std::vector<char> file_bytes(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

// A llama small enough to write and check in a moment.
rm::shape tiny_shape() {
    rm::shape s;
    s.name = "tiny";
    s.n_vocab = 320;
    s.n_embd = 64;
    s.n_layer = 2;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_ff = 96;
    s.n_ctx = 256;
    return s;
}

std::string meta(const smol_model * m, const char * key) {
    char buf[256] = {};
    if (smol_model_meta(m, key, buf, sizeof buf) != SMOL_OK) return "<absent>";
    return buf;
}

struct model_deleter {
    void operator()(smol_model * m) const { smol_model_free(m); }
};
using model_ptr = std::unique_ptr<smol_model, model_deleter>;

} // namespace

TEST_CASE("SmolLM2's three shapes and Gemma 3 270M's are known by name with their published "
          "sizes") {
    const rm::shape * s = rm::find_shape("360M");
    REQUIRE(s);
    CHECK(s->n_embd == 960);
    CHECK(s->n_layer == 32);
    CHECK(s->n_head == 15);
    CHECK(s->n_head_kv == 5);
    CHECK(s->n_ff == 2560);
    s = rm::find_shape("1.7B");
    REQUIRE(s);
    CHECK(s->n_embd == 2048);
    CHECK(s->n_layer == 24);
    CHECK(s->n_head_kv == 32);
    CHECK(s->n_ff == 8192);
    CHECK(s->rope_base == 130000.0f);
    s = rm::find_shape("135M");
    REQUIRE(s);
    CHECK(s->n_embd == 576);
    CHECK(s->rope_base == 100000.0f);
    s = rm::find_shape("gemma3-270m");
    REQUIRE(s);
    CHECK(s->gemma);
    CHECK(s->n_vocab == 262144);
    CHECK(s->n_embd == 640);
    CHECK(s->n_layer == 18);
    CHECK(s->n_head == 4);
    CHECK(s->n_head_kv == 1);
    CHECK(s->head_dim == 256);
    CHECK(s->n_ff == 2048);
    CHECK(s->n_swa == 512);
    CHECK(s->rope_base == 1000000.0f);
    CHECK(rm::find_shape("7B") == nullptr);
    CHECK(rm::shape_names() == "135M, 360M, 1.7B, gemma3-270m");
}

TEST_CASE("a random Gemma 3 of a small shape loads as gemma3 and decodes to finite logits") {
    rm::options o;
    o.s = tiny_shape();
    o.s.gemma = true;
    o.s.head_dim = 32; // q wider than the embeddings, as Gemma 3's
    o.s.n_swa = 4;
    o.s.n_layer = 6;
    o.type = SMOL_TYPE_Q8_0;
    const std::string path = temp_path("gemma.gguf");
    rm::write(path, o);
    const auto f = gguf::file::open(path);
    CHECK(f->get_str("general.architecture") == "gemma3");
    REQUIRE(f->find_tensor("blk.5.post_ffw_norm.weight"));
    CHECK(f->find_tensor("blk.0.attn_q.weight")->ne[1] == 4 * 32);
    CHECK(f->find_tensor("blk.0.attn_output.weight")->ne[0] == 4 * 32);
    smol_model * raw = nullptr;
    REQUIRE(smol_model_load(path.c_str(), nullptr, &raw) == SMOL_OK);
    model_ptr m(raw);
    CHECK(meta(m.get(), "gemma3.attention.sliding_window") == "4");
    smol_context_params cp = smol_context_default_params();
    cp.n_ctx = 64;
    cp.n_threads = 2;
    smol_context * ctx = nullptr;
    REQUIRE(smol_context_create(m.get(), &cp, &ctx) == SMOL_OK);
    smol_batch b = smol_batch_init(12);
    for (int i = 0; i < 12; ++i) smol_batch_add(&b, 12, 10 + 20 * i, i, 0, i == 11);
    REQUIRE(smol_decode(ctx, &b) == SMOL_OK);
    const float * l = smol_get_logits(ctx, -1);
    REQUIRE(l);
    for (int i = 0; i < o.s.n_vocab; ++i) REQUIRE(std::isfinite(l[i]));
    smol_batch_free(&b);
    smol_context_free(ctx);
    std::filesystem::remove(path);
}

TEST_CASE("a random model of every weight type loads in smol with its shape and metadata") {
    for (smol_type t :
         {SMOL_TYPE_F16, SMOL_TYPE_BF16, SMOL_TYPE_Q8_0, SMOL_TYPE_Q4_0, SMOL_TYPE_Q4_1}) {
        const std::string type = smol_type_name(t);
        CAPTURE(type);
        rm::options o;
        o.s = tiny_shape();
        o.type = t;
        o.seed = 7;
        int calls = 0;
        uint64_t last_done = 0, last_total = 0;
        o.progress = [&](const std::string &, size_t, size_t, uint64_t done, uint64_t total) {
            ++calls;
            last_done = done;
            last_total = total;
        };
        const std::string path = temp_path(type + ".gguf");
        rm::write(path, o);
        CHECK(calls > 0);
        CHECK(last_done == last_total);

        smol_model * raw = nullptr;
        REQUIRE(smol_model_load(path.c_str(), nullptr, &raw) == SMOL_OK);
        model_ptr m(raw);
        smol_model_info info;
        smol_model_get_info(m.get(), &info);
        CHECK(info.n_vocab == 320);
        CHECK(info.n_embd == 64);
        CHECK(info.n_layer == 2);
        CHECK(info.n_head == 4);
        CHECK(info.n_head_kv == 2);
        CHECK(info.n_ff == 96);
        CHECK(info.n_ctx_train == 256);
        CHECK(info.ftype == t);
        CHECK(std::string(info.name).find("random weights") != std::string::npos);
        CHECK(meta(m.get(), "smol.random_weights") == "true");
        CHECK(meta(m.get(), "smol.random_shape") == "tiny");
        CHECK(meta(m.get(), "smol.random_seed") == "7");

        // Every tensor has the type asked for (norms f32) and no output
        // weight: the embeddings are tied, as in SmolLM2.
        const auto f = gguf::file::open(path);
        CHECK(f->find_tensor("output.weight") == nullptr);
        for (const gguf::tensor_info & ti : f->tensors()) {
            CAPTURE(ti.name);
            CHECK(ti.type == (ti.n_dims == 1 ? uint32_t(SMOL_TYPE_F32) : uint32_t(t)));
        }

        // It decodes to finite logits of a sane size.
        smol_context_params cp = smol_context_default_params();
        cp.n_ctx = 64;
        cp.n_threads = 2;
        smol_context * ctx = nullptr;
        REQUIRE(smol_context_create(m.get(), &cp, &ctx) == SMOL_OK);
        smol_batch b = smol_batch_init(8);
        for (int i = 0; i < 8; ++i) smol_batch_add(&b, 8, 10 + 20 * i, i, 0, i == 7);
        REQUIRE(smol_decode(ctx, &b) == SMOL_OK);
        const float * l = smol_get_logits(ctx, -1);
        REQUIRE(l);
        double sq = 0;
        for (int i = 0; i < info.n_vocab; ++i) {
            REQUIRE(std::isfinite(l[i]));
            sq += double(l[i]) * l[i];
        }
        const double rms = std::sqrt(sq / info.n_vocab);
        CHECK(rms > 1e-3);
        CHECK(rms < 10);
        smol_batch_free(&b);
        smol_context_free(ctx);
        std::filesystem::remove(path);
    }
}

TEST_CASE("the weights depend on the seed alone, not on the threads that wrote them") {
    rm::options o;
    o.s = tiny_shape();
    o.type = SMOL_TYPE_Q8_0;
    o.seed = 11;
    o.n_threads = 1;
    const std::string a = temp_path("a.gguf"), b = temp_path("b.gguf"), c = temp_path("c.gguf");
    rm::write(a, o);
    o.n_threads = 3;
    rm::write(b, o);
    o.seed = 12;
    rm::write(c, o);
    const auto fa = file_bytes(a), fb = file_bytes(b), fc = file_bytes(c);
    CHECK(fa.size() > 10000);
    CHECK(fa == fb);
    REQUIRE(fa.size() == fc.size()); // the seed is a u64 either way
    const auto ga = gguf::file::open(a), gc = gguf::file::open(c);
    for (const char * name :
         {"token_embd.weight", "blk.0.attn_q.weight", "blk.1.ffn_down.weight"}) {
        CAPTURE(name);
        const gguf::tensor_info * ta = ga->find_tensor(name);
        const gguf::tensor_info * tc = gc->find_tensor(name);
        REQUIRE(ta);
        REQUIRE(tc);
        REQUIRE(ta->nbytes == tc->nbytes);
        CHECK(std::memcmp(ta->data, tc->data, ta->nbytes) != 0);
    }
    // Tensors of one file differ from each other too (each has its stream).
    const gguf::tensor_info * q = ga->find_tensor("blk.0.attn_q.weight");
    const gguf::tensor_info * o2 = ga->find_tensor("blk.0.attn_output.weight");
    CHECK(std::memcmp(q->data, o2->data, q->nbytes) != 0);
    for (const auto & p : {a, b, c}) std::filesystem::remove(p);
}

// Skipped, and counted as skipped, where the real model's file is absent.
TEST_CASE("the tokenizer and its vocabulary size come from the file given" *
          doctest::skip(!std::filesystem::exists(SMOL_MODEL))) {
    const auto real = gguf::file::open(SMOL_MODEL);
    rm::options o;
    o.s = tiny_shape();
    REQUIRE(o.s.n_vocab != 49152);
    o.vocab_from = real.get();
    o.type = SMOL_TYPE_Q4_0;
    const std::string path = temp_path("vocab.gguf");
    rm::write(path, o);
    const auto f = gguf::file::open(path);
    CHECK(f->get_i64("llama.vocab_size") == 49152);
    REQUIRE(f->find_tensor("token_embd.weight"));
    CHECK(f->find_tensor("token_embd.weight")->ne[1] == 49152);
    for (const gguf::kv & kv : real->metadata()) {
        if (kv.key.rfind("tokenizer.", 0) != 0) continue;
        CAPTURE(kv.key);
        const gguf::value * v = f->find(kv.key);
        REQUIRE(v);
        CHECK(*v == kv.val);
    }
    smol_model * raw = nullptr;
    REQUIRE(smol_model_load(path.c_str(), nullptr, &raw) == SMOL_OK);
    model_ptr m(raw);
    smol_token ids[16];
    int32_t n = 0;
    const char * text = "<|im_start|>user\nHello";
    REQUIRE(smol_tokenize(m.get(), text, std::strlen(text), false, true, ids, 16, &n) == SMOL_OK);
    CHECK(n >= 3);
    CHECK(ids[0] == 1); // <|im_start|> in SmolLM2's vocabulary
    std::filesystem::remove(path);
}

TEST_CASE("a small random file is left for the python gguf reader") {
    rm::options o;
    o.s = tiny_shape();
    o.type = SMOL_TYPE_Q4_1;
    o.seed = 3;
    for (const char * type : {"q4_1", "q8_0", "bf16"}) {
        o.type = std::string(type) == "q4_1"   ? SMOL_TYPE_Q4_1
                 : std::string(type) == "q8_0" ? SMOL_TYPE_Q8_0
                                               : SMOL_TYPE_BF16;
        rm::write(std::string(SMOL_RANDOM_OUT_DIR) + "/random-" + type + ".gguf", o);
    }
}
