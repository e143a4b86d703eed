// smol-convert.c++ - converts a Hugging Face model directory (config.json,
// safetensors weights, tokenizer.json) to a GGUF file that smol and
// llama.cpp load, in f32, f16, bf16 or any file type smol-quantize writes
// (Q8_0, Q4_K_M, ...: each tensor gets the type llama-quantize gives it), in
// one pass: no intermediate f16 file.

#include "hf-convert.h"
#include "smol-cpu-kernels.h"
#include "smol-recipe.h"
#include "smol.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

namespace fs = std::filesystem;

namespace {

double mib(uint64_t bytes) {
    return double(bytes) / (1024.0 * 1024.0);
}

struct progress {
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    uint64_t bytes_out = 0;
    void operator()(const smol::convert::tensor_report & t) {
        const int width = int(std::to_string(t.count).size());
        std::string shape;
        for (size_t d = 0; d < t.ne.size(); d++)
            shape += (d ? " x " : "") + std::to_string(t.ne[d]);
        bytes_out += t.bytes_out;
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("[%*zu/%zu] %-28s %-13s %4s -> %-6s %8.2f -> %8.2f MiB, %6.1f s%s\n", width,
                    t.index + 1, t.count, t.name.c_str(), shape.c_str(),
                    smol::convert::st_dtype_name(t.type_in), smol_type_name(t.type_out),
                    mib(t.bytes_in), mib(t.bytes_out), secs,
                    t.fell_back ? " (rows no multiple of the type's block: its fallback)" : "");
        std::fflush(stdout);
    }
};

} // namespace

int main(int argc, char ** argv) {
    std::string dir, out, type = "f16", name, pre;
    int n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
    CLI::App app{"smol-convert: convert a Hugging Face model directory to GGUF.\n"
                 "  smol-convert MODEL_DIR OUTPUT.gguf [--type f16]\n"
                 "Architectures: " +
                     smol::convert::supported_architectures() +
                     ". Types (as llama-quantize's, in any case): " + smol::recipe_names(),
                 "smol-convert"};
    app.add_option("model_dir", dir,
                   "the directory holding config.json, *.safetensors and tokenizer.json")
        ->required();
    app.add_option("output", out, "the GGUF file to write")->required();
    app.add_option("--type", type, "the file type: f32, f16, bf16 or a quantized type")
        ->capture_default_str();
    app.add_option("--name", name, "general.name (default: the directory's name)");
    app.add_option("--pre", pre,
                   "tokenizer.ggml.pre, llama.cpp's name of the pre-tokenizer (default: "
                   "recognised from tokenizer.json)");
    app.add_option("-t,--threads", n_threads, "threads converting rows")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    CLI11_PARSE(app, argc, argv);

    try {
        const smol::recipe * to = smol::find_recipe(type);
        if (!to)
            throw smol::convert::convert_error("unknown type '" + type + "'; the types are " +
                                               smol::recipe_names());
        std::printf("smol-convert: %s -> %s (%s), CPU kernels %s\n", dir.c_str(), out.c_str(),
                    to->name, smol_cpu_kernels_name());
        std::fflush(stdout);
        smol::convert::options o;
        o.model_dir = dir;
        o.out_path = out;
        o.to = to;
        o.name = name;
        o.pre = pre;
        o.n_threads = n_threads;
        progress p;
        o.on_tensor = [&p](const smol::convert::tensor_report & t) { p(t); };
        const smol::convert::summary s = smol::convert::convert_model(o);
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - p.t0).count();
        std::error_code ec;
        std::printf("smol-convert: %s, %zu tensors, %.2f M parameters: %.2f MiB -> %.2f MiB "
                    "(%.2f bits a weight); file %.2f MiB; %.1f s\n",
                    s.architecture.c_str(), s.n_tensors, double(s.n_params) * 1e-6, mib(s.bytes_in),
                    mib(s.bytes_out),
                    s.n_params ? 8.0 * double(s.bytes_out) / double(s.n_params) : 0.0,
                    mib(fs::file_size(out, ec)), secs);
        return 0;
    } catch (const std::exception & e) {
        std::fflush(stdout);
        std::fprintf(stderr, "smol-convert: %s\n", e.what());
    }
    return 1;
}
