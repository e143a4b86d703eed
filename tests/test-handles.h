// test-handles.h - owning handles of the C API's objects for the doctest
// suites, loading a model file or failing the case with the library's
// message, and a tiny random llama (tiny-model.h) in a temporary file.

#ifndef SMOL_TESTS_TEST_HANDLES_H
#define SMOL_TESTS_TEST_HANDLES_H

#include "smol.h"
#include "tiny-model.h"

#include <doctest/doctest.h>
#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>

namespace test {

struct model_deleter {
    void operator()(smol_model * m) const { smol_model_free(m); }
};
struct context_deleter {
    void operator()(smol_context * c) const { smol_context_free(c); }
};
struct engine_deleter {
    void operator()(smol_engine * e) const { smol_engine_free(e); }
};
using model_ptr = std::unique_ptr<smol_model, model_deleter>;
using context_ptr = std::unique_ptr<smol_context, context_deleter>;
using engine_ptr = std::unique_ptr<smol_engine, engine_deleter>;

inline model_ptr load(const std::string & path) {
    smol_model * m = nullptr;
    const smol_status st = smol_model_load(path.c_str(), nullptr, &m);
    INFO(std::string(smol_last_error()));
    REQUIRE(st == SMOL_OK);
    return model_ptr(m);
}

// A file of this process's own in the temporary folder.
inline std::string temp_path(const std::string & name) {
    return (std::filesystem::temp_directory_path() /
            ("smol-test-" + std::to_string(::getpid()) + "-" + name))
        .string();
}

// A tiny random llama of shape s, written to a temporary file (removed with
// it) and loaded.
struct tiny_file {
    std::string path;
    model_ptr model;
    int n_vocab = 0;
    tiny_file(const tiny::shape & s, uint32_t seed, const std::string & name)
        : path(temp_path(name)) {
        tiny::write(path, s, seed);
        model = load(path);
        n_vocab = s.n_vocab;
    }
    ~tiny_file() { std::filesystem::remove(path); }
};

} // namespace test

#endif // SMOL_TESTS_TEST_HANDLES_H
