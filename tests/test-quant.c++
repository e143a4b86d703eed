// test-quant.c++ - smol-quant's reference dequantization against the PyPI
// gguf package's, and the CPU kernels' against it. This suite writes the
// files scripts/check-quants.py reads (ctest runs it after this suite):
// - quants.gguf: rows of random blocks of every quantized type (every code
//   and scale bit pattern, finite f16 scales), and quants-smol.gguf: the
//   same rows as smol dequantizes them, in f32;
// - real-hashes.json: for a real Q4_K_M file (Gemma 3 270M, fetched by
//   scripts/fetch-model.sh gemma3-270m), a hash of each tensor's smol
//   dequantization, for the script to hash numpy's the same way.
// The script compares bit for bit. Here: every CPU variant's row_to_f32
// equals the reference, and bad rows are refused.

#include "gguf.h"
#include "smol-cpu-kernels.h"
#include "smol-quant.h"
#include "smol-recipe.h"
#include "smol.h"
#include "spread-hash.h"
#include "test-seed.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <doctest/doctest.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace {

const smol_type quantized_types[] = {SMOL_TYPE_Q4_0, SMOL_TYPE_Q4_1, SMOL_TYPE_Q5_0,
                                     SMOL_TYPE_Q5_1, SMOL_TYPE_Q8_0, SMOL_TYPE_IQ4_NL,
                                     SMOL_TYPE_Q2_K, SMOL_TYPE_Q3_K, SMOL_TYPE_Q4_K,
                                     SMOL_TYPE_Q5_K, SMOL_TYPE_Q6_K, SMOL_TYPE_IQ4_XS};

// A random finite f16: sign, exponent 1..30 (normal), any mantissa; now and
// then a subnormal or zero.
uint16_t random_f16(std::mt19937 & rng) {
    const uint32_t r = rng();
    const uint16_t sign = uint16_t((r & 1) << 15);
    if ((r >> 1) % 16 == 0) return uint16_t(sign | ((r >> 5) & 0x3ff)); // subnormal or 0
    const uint16_t e = uint16_t(1 + (r >> 5) % 30);
    return uint16_t(sign | (e << 10) | ((r >> 10) & 0x3ff));
}

// Random bytes for n blocks of type t, then each block's f16 fields set to
// random finite values.
std::vector<uint8_t> random_blocks(smol_type t, int64_t n_elems, std::mt19937 & rng) {
    std::vector<uint8_t> b(smol::type_row_bytes(t, n_elems));
    for (auto & x : b) x = uint8_t(rng());
    const smol::type_traits * tr = smol::traits_of(t);
    const int64_t nb = n_elems / tr->block_elems;
    for (int64_t i = 0; i < nb; i++) {
        uint8_t * p = b.data() + size_t(i) * tr->block_bytes;
        auto set = [&](size_t offset) {
            const uint16_t h = random_f16(rng);
            std::memcpy(p + offset, &h, 2);
        };
        switch (t) {
        case SMOL_TYPE_Q4_1:
        case SMOL_TYPE_Q5_1:
            set(0), set(2); // d, m
            break;
        case SMOL_TYPE_Q2_K:
            set(offsetof(smol::block_q2_K, d)), set(offsetof(smol::block_q2_K, dmin));
            break;
        case SMOL_TYPE_Q3_K:
            set(offsetof(smol::block_q3_K, d));
            break;
        case SMOL_TYPE_Q4_K:
        case SMOL_TYPE_Q5_K:
            set(0), set(2); // d, dmin
            break;
        case SMOL_TYPE_Q6_K:
            set(offsetof(smol::block_q6_K, d));
            break;
        default: // q4_0, q5_0, q8_0, iq4_nl, iq4_xs: d first
            set(0);
            break;
        }
    }
    return b;
}

bool same_bits(const std::vector<float> & a, const std::vector<float> & b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

} // namespace

TEST_CASE("random blocks of every type are written with smol's dequantization, which every "
          "CPU variant's row_to_f32 equals") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    const int64_t K = 1024, rows = 16;
    gguf::writer blocks, floats;
    // The writers reference the data until they write.
    std::vector<std::vector<uint8_t>> qs;
    std::vector<std::vector<float>> deqs;
    blocks.set("general.architecture", gguf::value::make_str("smol-quant-check"));
    floats.set("general.architecture", gguf::value::make_str("smol-quant-check"));
    for (smol_type t : quantized_types) {
        const std::string name = smol_type_name(t);
        CAPTURE(name);
        const std::vector<uint8_t> & q = qs.emplace_back(random_blocks(t, K * rows, rng));
        std::vector<float> & deq = deqs.emplace_back(size_t(K * rows));
        const size_t rb = smol::type_row_bytes(t, K);
        for (int64_t r = 0; r < rows; r++)
            smol::dequantize_row(t, q.data() + r * rb, deq.data() + r * K, K);
        for (const smol::cpu::kernels * k : smol::cpu::kernels_available()) {
            const std::string variant = k->name;
            CAPTURE(variant);
            std::vector<float> got(deq.size(), std::nanf(""));
            for (int64_t r = 0; r < rows; r++)
                k->row_to_f32(t, q.data() + r * rb, got.data() + r * K, K);
            CHECK(same_bits(got, deq));
        }
        blocks.add_tensor("t." + name, uint32_t(t), {K, rows}, q.data(), q.size());
        floats.add_tensor("t." + name, SMOL_TYPE_F32, {K, rows}, deq.data(),
                          deq.size() * sizeof(float));
    }
    blocks.write(std::string(SMOL_QUANT_OUT_DIR) + "/quants.gguf");
    floats.write(std::string(SMOL_QUANT_OUT_DIR) + "/quants-smol.gguf");
}

TEST_CASE("a real Q4_K_M file's tensors are hashed as smol dequantizes them" *
          doctest::skip(!std::filesystem::exists(SMOL_GEMMA_MODEL))) {
    const auto f = gguf::file::open(SMOL_GEMMA_MODEL);
    std::ofstream out(std::string(SMOL_QUANT_OUT_DIR) + "/real-hashes.json");
    REQUIRE(out.good());
    out << "{\"file\": \"" << SMOL_GEMMA_MODEL << "\", \"tensors\": {";
    int n = 0;
    std::vector<float> v;
    std::map<std::string, int> by_type;
    for (const gguf::tensor_info & t : f->tensors()) {
        if (!smol::traits_of(smol_type(t.type))) continue;
        v.resize(size_t(t.n_elements()));
        smol::dequantize_row(smol_type(t.type), t.data, v.data(), t.n_elements());
        out << (n++ ? ", " : "") << "\"" << t.name << "\": [\"" << smol_type_name(smol_type(t.type))
            << "\", \"" << test::spread_hash(v.data(), v.size()) << "\"]";
        by_type[smol_type_name(smol_type(t.type))]++;
    }
    out << "}}\n";
    std::string kinds;
    for (const auto & [type, count] : by_type) kinds += " " + type + ":" + std::to_string(count);
    MESSAGE(n << " tensors hashed:" << kinds);
    CHECK(by_type.count("q4_K") == 1);
    CHECK(by_type.count("q6_K") == 1);
}

TEST_CASE("a super-block tensor whose rows are no multiple of 256 is refused, naming it") {
    // gguf-io checks that a row holds whole blocks for every ggml type.
    const std::string path = std::string(SMOL_QUANT_OUT_DIR) + "/bad-rows.gguf";
    std::vector<uint8_t> data(144 * 3, 0);
    {
        gguf::writer w;
        w.set("general.architecture", gguf::value::make_str("llama"));
        // 576 elements a row: 2.25 super-blocks. The writer checks sizes, so
        // the tensor goes in as a 768-wide one and its shape is patched.
        w.add_tensor("blk.0.ffn_down.weight", SMOL_TYPE_Q4_K, {768, 1}, data.data(), 144 * 3);
        w.write(path);
    }
    std::vector<char> bytes;
    {
        std::ifstream in(path, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    const int64_t from = 768, to = 576;
    auto it = std::search(bytes.begin(), bytes.end(), reinterpret_cast<const char *>(&from),
                          reinterpret_cast<const char *>(&from) + 8);
    REQUIRE(it != bytes.end());
    std::memcpy(&*it, &to, 8);
    {
        std::ofstream o(path, std::ios::binary);
        o.write(bytes.data(), std::streamsize(bytes.size()));
    }
    try {
        gguf::file::open(path);
        FAIL("a q4_K row of 576 elements was accepted");
    } catch (const gguf::error & e) {
        const std::string msg = e.what();
        CAPTURE(msg);
        CHECK(msg.find("blk.0.ffn_down.weight") != std::string::npos);
        CHECK(msg.find("q4_K") != std::string::npos);
    }
    std::filesystem::remove(path);
}

TEST_CASE("smol's file types give every tensor of SmolLM2's three shapes llama-quantize's type") {
    // tests/fixtures/recipes.json: llama-quantize --dry-run's choices
    // (scripts/make-recipe-fixture.py) for the real 135M and random files
    // of the 360M's and 1.7B's shapes, in every file type smol writes.
    std::ifstream in(std::string(SMOL_FIXTURES) + "/recipes.json");
    INFO("missing tests/fixtures/recipes.json: scripts/make-recipe-fixture.py writes it");
    REQUIRE(in.good());
    const nlohmann::json fx = nlohmann::json::parse(in);
    const auto lower = [](std::string s) {
        for (char & c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
        return s;
    };
    std::map<std::string, smol_type> by_name; // the fixture's names are lower case
    for (int t = 0; t < 64; ++t)
        if (const smol::type_traits * tr = smol::traits_of(smol_type(t)))
            by_name[lower(tr->name)] = smol_type(t);
    int n_checked = 0;
    for (const auto & item : fx.at("models").items()) {
        const std::string shape =
            item.key(); // a plain name: lambdas (CAPTURE) cannot take a binding
        const auto & m = item.value();
        std::vector<smol::tensor_desc> ts;
        for (const auto & t : m.at("tensors")) {
            const std::string type = t[3].get<std::string>();
            REQUIRE(by_name.count(type) == 1);
            ts.push_back({t[0].get<std::string>(), t[1].get<uint32_t>(), t[2].get<int64_t>(),
                          by_name.at(type)});
        }
        const smol::recipe_model rm{m.at("n_layer").get<int32_t>(), m.at("n_head").get<int32_t>(),
                                    m.at("n_head_kv").get<int32_t>()};
        for (const auto & ritem : m.at("recipes").items()) {
            const std::string name = ritem.key();
            const auto & want = ritem.value();
            const smol::recipe * r = smol::find_recipe(name);
            CAPTURE(shape);
            CAPTURE(name);
            REQUIRE(r != nullptr);
            const auto got = smol::choose_types(*r, ts, rm);
            int differ = 0;
            for (size_t i = 0; i < ts.size(); ++i) {
                const std::string w = want.at(ts[i].name).get<std::string>();
                const std::string g = smol_type_name(got[i].type);
                if (lower(g) != w) {
                    if (differ++ < 3) MESSAGE(ts[i].name << ": smol " << g << ", llama.cpp " << w);
                }
                ++n_checked;
            }
            CHECK(differ == 0);
        }
    }
    MESSAGE(n_checked << " tensor choices checked");
}
