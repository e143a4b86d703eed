// test-requant.c++ - SmolLM2-135M as llama.cpp's users download it:
// requantized by llama-quantize to Q4_K_M, Q5_K_M and Q6_K (mostly Q5_0,
// Q5_1, Q8_0 and Q6_K at this width, with Q4_K/Q5_K/Q6_K where rows hold
// whole super-blocks). smol's quantizer rebuilds each file from the same
// Q4_1 source; the fixture (scripts/make-fixtures.py --requant TYPE) holds a
// hash of every tensor llama-quantize wrote, so the rebuilt file is shown to
// be llama-quantize's, byte for byte, and then smol runs it and is held to
// llama.cpp's logits and greedy tokens on that file.

#include "gguf.h"
#include "llama-fixtures.h"
#include "smol.h"
#include "spread-hash.h"
#include "test-handles.h"

#include <doctest/doctest.h>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

namespace {

// How far smol's logits may sit from llama.cpp's on these files. As for the
// Q4_1 file (test-model), both engines round activations to 8-bit blocks
// before every quantized dot product (q8_0 beside the 32-blocks, q8_K beside
// the super-blocks), and the model amplifies last-bit differences of
// summation order through those roundings; llama.cpp moves between its own
// batch sizes by up to the "self_variation" its fixture records. The bound
// sits below that spread.
constexpr double logit_tol = 1.0;
constexpr double decisive_margin = 2 * logit_tol;

void requantized_runs_as_in_llama_cpp(const std::string & file_type) {
    {
        INFO("the real model is missing: run scripts/fetch-model.sh (looked for " << SMOL_MODEL
                                                                                  << ")");
        REQUIRE(std::filesystem::exists(SMOL_MODEL));
    }
    std::string dir = file_type;
    for (char & ch : dir) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    const nlohmann::json want = test::read_fixture("requant/" + dir + "/tensors.json");

    const std::string path = test::temp_path("requant-" + dir + ".gguf");
    smol_quantize_params qp = smol_quantize_default_params();
    qp.file_type = file_type.c_str();
    qp.n_threads = 2;
    {
        const smol_status st = smol_model_quantize(SMOL_MODEL, path.c_str(), &qp);
        INFO(smol_last_error());
        REQUIRE(st == SMOL_OK);
    }

    // Every tensor of llama-quantize's file, of its type and with its bytes.
    {
        const auto f = gguf::file::open(path);
        const auto & tensors = want.at("tensors");
        CHECK(f->tensors().size() == tensors.size());
        int same = 0;
        for (const gguf::tensor_info & t : f->tensors()) {
            CAPTURE(t.name);
            REQUIRE(tensors.contains(t.name));
            const auto & w = tensors.at(t.name);
            const std::string type = smol_type_name(smol_type(t.type));
            // gguf's names are upper case ("Q4_K"); smol's "q4_K".
            std::string upper = type;
            for (char & ch : upper) ch = char(std::toupper(static_cast<unsigned char>(ch)));
            CHECK(upper == w[0].get<std::string>());
            const uint64_t h = test::spread_hash_bytes(t.data, size_t(t.nbytes));
            CHECK(std::to_string(h) == w[1].get<std::string>());
            same +=
                upper == w[0].get<std::string>() && std::to_string(h) == w[1].get<std::string>();
        }
        MESSAGE(same << " of " << tensors.size() << " tensors byte for byte llama-quantize's ("
                     << file_type << ")");
    }

    test::model_ptr m = test::load(path);
    test::check_logits(m.get(), test::read_fixture("requant/" + dir + "/logits.json"), logit_tol);
    CHECK(test::check_greedy(m.get(), test::read_fixture("requant/" + dir + "/greedy.json"),
                             decisive_margin) >= 224 / 4); // of 224 steps
    m.reset();
    std::filesystem::remove(path);
}

} // namespace

TEST_CASE("llama-quantize's Q4_K_M of SmolLM2-135M: smol writes it and runs it as llama.cpp") {
    requantized_runs_as_in_llama_cpp("Q4_K_M");
}

TEST_CASE("llama-quantize's Q5_K_M of SmolLM2-135M: smol writes it and runs it as llama.cpp") {
    requantized_runs_as_in_llama_cpp("Q5_K_M");
}

TEST_CASE("llama-quantize's Q6_K of SmolLM2-135M: smol writes it and runs it as llama.cpp") {
    requantized_runs_as_in_llama_cpp("Q6_K");
}
