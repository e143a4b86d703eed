// smol-quantize.c++ - rewrites a GGUF model as a file of one of llama.cpp's
// file types (Q4_K_M, Q6_K, IQ4_XS, Q8_0, F16, ...): each tensor gets the
// type llama.cpp's llama-quantize gives it in such a file, through f32 with
// smol's reference quantizers (smol_model_quantize), so the output loads in
// llama.cpp as well as in smol.
//
// With --random SHAPE it writes instead a model of SmolLM2's exact shape
// (135M, 360M, 1.7B) or Gemma 3 270M's (gemma3-270m) with seeded random
// weights of the file type asked for (--pure: every matmul weight of that
// type) and the tokenizer of --vocab-from: the way to benchmark sizes whose
// weights cannot be downloaded here. It lives in this tool because it is the same job (a GGUF
// file of a chosen type that llama.cpp loads), with the same type names.

#include "gguf-io/gguf.h"
#include "random-model.h"
#include "smol-cpu-kernels.h"
#include "smol-recipe.h"
#include "smol.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct quantize_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

const smol::recipe & find_recipe(const std::string & name) {
    const smol::recipe * r = smol::find_recipe(name);
    if (!r) {
        throw quantize_error("unknown type '" + name + "'; the types are " + smol::recipe_names());
    }
    return *r;
}

double mib(uint64_t bytes) {
    return double(bytes) / (1024.0 * 1024.0);
}

struct report {
    int width = 0;
    uint64_t bytes_in = 0, bytes_out = 0, elements = 0;
};

void on_tensor(const smol_quantize_tensor * t, void * user) {
    auto & r = *static_cast<report *>(user);
    if (r.width == 0) r.width = int(std::to_string(t->count).size());
    std::string shape;
    for (int d = 0; d < t->n_dims; d++) shape += (d ? " x " : "") + std::to_string(t->ne[d]);
    r.bytes_in += t->bytes_in;
    r.bytes_out += t->bytes_out;
    uint64_t n = 1;
    for (int d = 0; d < t->n_dims; d++) n *= uint64_t(t->ne[d]);
    r.elements += n;
    std::printf("[%*d/%d] %-28s %-13s %6s -> %-6s %8.2f -> %8.2f MiB%s\n", r.width, t->index + 1,
                t->count, t->name, shape.c_str(), smol_type_name(t->type_in),
                smol_type_name(t->type_out), mib(t->bytes_in), mib(t->bytes_out),
                t->fell_back ? " (rows no multiple of the type's block: its fallback)" : "");
    std::fflush(stdout);
}

int run(const std::string & in_path, const std::string & out_path, const std::string & type_name,
        int n_threads) {
    const smol::recipe & to = find_recipe(type_name);
    std::error_code ec;
    if (!fs::exists(in_path, ec))
        throw quantize_error("input '" + in_path +
                             "' does not exist (scripts/fetch-model.sh downloads the default "
                             "model)");
    const fs::path out_dir = fs::absolute(out_path, ec).parent_path();
    if (!fs::is_directory(out_dir, ec))
        throw quantize_error("the output's folder '" + out_dir.string() + "' does not exist");
    if (fs::exists(out_path, ec) && fs::equivalent(in_path, out_path, ec))
        throw quantize_error("the output would overwrite the input '" + in_path +
                             "'; name another file");

    const auto t0 = std::chrono::steady_clock::now();
    std::printf("smol-quantize: %s -> %s (%s), CPU kernels %s\n", in_path.c_str(), out_path.c_str(),
                to.name, smol_cpu_kernels_name());
    report r;
    smol_quantize_params p = smol_quantize_default_params();
    p.file_type = to.name;
    p.n_threads = n_threads;
    p.on_tensor = on_tensor;
    p.user_data = &r;
    if (smol_model_quantize(in_path.c_str(), out_path.c_str(), &p) != SMOL_OK)
        throw quantize_error(smol_last_error());
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("smol-quantize: tensors %.2f MiB -> %.2f MiB; file %.2f MiB -> %.2f MiB "
                "(%.2f bits a weight); %.1f s\n",
                mib(r.bytes_in), mib(r.bytes_out), mib(fs::file_size(in_path, ec)),
                mib(fs::file_size(out_path, ec)),
                r.elements ? 8.0 * double(r.bytes_out) / double(r.elements) : 0.0, secs);
    return 0;
}

struct random_args {
    std::string shape;
    std::string type = "f16";
    bool pure = false; // every matmul weight of the type, no recipe
    std::string vocab_from;
    uint64_t seed = 1;
    float std = 0.02f;
};

int run_random(const random_args & a, const std::string & out_path, int n_threads) {
    namespace rm = smol::random_model;
    const rm::shape * s = rm::find_shape(a.shape);
    if (!s)
        throw quantize_error("unknown shape '" + a.shape + "'; the shapes are " +
                             rm::shape_names());
    const smol::recipe & to = find_recipe(a.type);
    std::error_code ec;
    const fs::path out_dir = fs::absolute(out_path, ec).parent_path();
    if (!fs::is_directory(out_dir, ec))
        throw quantize_error("the output's folder '" + out_dir.string() + "' does not exist");
    rm::options o;
    o.s = *s;
    o.type = to.base;
    if (!a.pure) o.mix = &to;
    o.seed = a.seed;
    o.std = a.std;
    o.n_threads = n_threads;
    std::unique_ptr<gguf::file> vocab;
    if (!a.vocab_from.empty()) {
        vocab = gguf::file::open(a.vocab_from);
        o.vocab_from = vocab.get();
    } else {
        std::fprintf(stderr, "smol-quantize: no --vocab-from: writing a made-up byte-level "
                             "vocabulary (tokenizing real text will not be meaningful)\n");
    }
    std::printf("smol-quantize: random SmolLM2-%s weights (%s, seed %llu, std %g) -> %s\n",
                s->name.c_str(), to.name, (unsigned long long)a.seed, double(a.std),
                out_path.c_str());
    const auto t0 = std::chrono::steady_clock::now();
    auto last = t0;
    size_t last_index = SIZE_MAX;
    o.progress = [&](const std::string & name, size_t i, size_t n, uint64_t done, uint64_t total) {
        // One line a tensor, or a second, whichever is rarer.
        const auto now = std::chrono::steady_clock::now();
        if (i == last_index && now - last < std::chrono::seconds(1) && done < total) return;
        if (i != last_index && now - last < std::chrono::milliseconds(250) && done < total &&
            i + 1 < n)
            return;
        last = now;
        last_index = i;
        std::printf("[%5.1f%%] %zu/%zu %s, %.1f of %.1f MiB\n",
                    100.0 * double(done) / double(total), i + 1, n, name.c_str(), mib(done),
                    mib(total));
        std::fflush(stdout);
    };
    smol::random_model::write(out_path, o);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("smol-quantize: wrote %s, %.2f MiB in %.1f s\n", out_path.c_str(),
                mib(fs::file_size(out_path, ec)), secs);
    return 0;
}

} // namespace

int main(int argc, char ** argv) {
    std::vector<std::string> args;
    random_args ra;
    int n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
    CLI::App app{"smol-quantize: rewrite a GGUF model as a file of one of llama.cpp's types,\n"
                 "or write one of SmolLM2's shapes with random weights.\n"
                 "  smol-quantize INPUT OUTPUT TYPE\n"
                 "  smol-quantize --random 360M --type q4_k_m --vocab-from REAL.gguf OUTPUT\n"
                 "Types (as llama-quantize's, in any case): " +
                     smol::recipe_names(),
                 "smol-quantize"};
    app.add_option("files", args, "INPUT OUTPUT TYPE, or with --random only OUTPUT")->required();
    app.add_option("--random", ra.shape,
                   "write random weights of this SmolLM2 shape: " +
                       smol::random_model::shape_names());
    app.add_option("--type", ra.type, "with --random: the file type")->capture_default_str();
    app.add_flag("--pure", ra.pure,
                 "with --random: every matmul weight of the type (f16 where its rows do not "
                 "fit), not llama.cpp's mix");
    app.add_option("--vocab-from", ra.vocab_from,
                   "with --random: a GGUF file whose tokenizer (and vocabulary size) is copied");
    app.add_option("--seed", ra.seed, "with --random: the seed of the weights")
        ->capture_default_str();
    app.add_option("--std", ra.std, "with --random: the weights' standard deviation")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("-t,--threads", n_threads, "threads converting rows")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    try {
        app.parse(argc, argv);
        const size_t want = ra.shape.empty() ? 3 : 1;
        if (args.size() != want)
            throw CLI::ValidationError("files", ra.shape.empty()
                                                    ? "expected INPUT OUTPUT TYPE"
                                                    : "with --random, expected only OUTPUT");
    } catch (const CLI::ParseError & e) {
        return app.exit(e);
    }
    try {
        if (!ra.shape.empty()) return run_random(ra, args[0], n_threads);
        return run(args[0], args[1], args[2], n_threads);
    } catch (const std::exception & e) {
        // gguf::error messages already name the file and what is wrong.
        std::fflush(stdout);
        std::fprintf(stderr, "smol-quantize: %s\n", e.what());
    }
    return 1;
}
