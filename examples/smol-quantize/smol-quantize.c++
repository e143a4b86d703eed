// smol-quantize.c++ - rewrites a GGUF model with its matmul weights in another
// type (q8_0, q4_0, q4_1, f16, bf16 or f32), the way llama.cpp's
// llama-quantize does, so the output loads in llama.cpp as well as in smol.
// Matmul weights are the 2-D "*.weight" tensors that are not norms
// (token_embd.weight included); 1-D tensors (norms) are kept in f32; the
// metadata is copied with general.file_type set to llama.cpp's ftype id.
// Every row goes through f32 with smol's own CPU kernels.
//
// With --random SHAPE it writes instead a model of SmolLM2's exact shape
// (135M, 360M, 1.7B) with seeded random weights of the type asked for and
// the tokenizer of --vocab-from: the way to benchmark sizes whose weights
// cannot be downloaded here. It lives in this tool because it is the same
// job (a GGUF file of a chosen weight type that llama.cpp loads), with the
// same type names.

#include "gguf-io/gguf.h"
#include "random-model.h"
#include "smol-cpu-kernels.h"
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

// A type the output can have, and llama.cpp's llama_ftype for a file whose
// matmul weights are mostly of that type.
struct target {
    const char * name;
    smol_type type;
    uint32_t ftype;
};
constexpr target targets[] = {
    {"q8_0", SMOL_TYPE_Q8_0, 7}, {"q4_0", SMOL_TYPE_Q4_0, 2},  {"q4_1", SMOL_TYPE_Q4_1, 3},
    {"f16", SMOL_TYPE_F16, 1},   {"bf16", SMOL_TYPE_BF16, 32}, {"f32", SMOL_TYPE_F32, 0},
};

std::string valid_names() {
    std::string out;
    for (const target & t : targets) out += (out.empty() ? "" : ", ") + std::string(t.name);
    return out;
}

const target & find_target(std::string name) {
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return char(std::tolower(c)); });
    for (const target & t : targets)
        if (name == t.name) return t;
    throw quantize_error("unknown type '" + name + "'; the valid types are " + valid_names());
}

// The types whose rows smol's kernels convert to and from f32.
bool convertible(uint32_t ggml_type) {
    switch (ggml_type) {
    case SMOL_TYPE_F32:
    case SMOL_TYPE_F16:
    case SMOL_TYPE_BF16:
    case SMOL_TYPE_Q4_0:
    case SMOL_TYPE_Q4_1:
    case SMOL_TYPE_Q8_0:
        return true;
    default:
        return false;
    }
}

std::string ggml_type_name(uint32_t ggml_type) {
    const gguf::tensor_type_traits * tt = gguf::tensor_type_info(ggml_type);
    return tt ? tt->name : "type " + std::to_string(ggml_type);
}

bool is_matmul_weight(const gguf::tensor_info & t) {
    const std::string_view name = t.name;
    return t.n_dims == 2 && name.ends_with(".weight") &&
           name.find("norm") == std::string_view::npos;
}

// The type a tensor gets in the output. Quantized types pack rows in blocks
// of 32, so a weight whose rows do not divide into blocks falls back to f16,
// as llama-quantize does with its own fallbacks.
uint32_t output_type(const gguf::tensor_info & t, const target & to, bool & fell_back) {
    fell_back = false;
    if (t.n_dims == 1) return SMOL_TYPE_F32;
    if (!is_matmul_weight(t)) return t.type;
    if (t.ne[0] % smol::cpu::block_elems(to.type) != 0) {
        fell_back = true;
        return SMOL_TYPE_F16;
    }
    return uint32_t(to.type);
}

// Converts rows [r0, r1) of a tensor through f32.
void convert_rows(const smol::cpu::kernels & k, smol_type from, const uint8_t * src, size_t src_row,
                  smol_type to, uint8_t * dst, size_t dst_row, int64_t n, int64_t r0, int64_t r1) {
    std::vector<float> buf(static_cast<size_t>(n));
    for (int64_t r = r0; r < r1; r++) {
        k.row_to_f32(from, src + size_t(r) * src_row, buf.data(), n);
        k.row_from_f32(to, buf.data(), dst + size_t(r) * dst_row, n);
    }
}

std::vector<uint8_t> convert(const gguf::tensor_info & t, uint32_t to, int n_threads) {
    const smol::cpu::kernels & k = smol::cpu::kernels_best();
    const int64_t n = t.ne[0];
    const int64_t rows = t.n_elements() / n;
    const size_t src_row = smol::cpu::row_bytes(smol_type(t.type), n);
    const size_t dst_row = smol::cpu::row_bytes(smol_type(to), n);
    std::vector<uint8_t> out(dst_row * size_t(rows));
    const auto * src = static_cast<const uint8_t *>(t.data);
    const int64_t n_workers = std::clamp<int64_t>(rows / 64, 1, n_threads);
    std::vector<std::thread> workers;
    for (int64_t w = 0; w < n_workers; w++) {
        const int64_t r0 = rows * w / n_workers, r1 = rows * (w + 1) / n_workers;
        workers.emplace_back(convert_rows, std::cref(k), smol_type(t.type), src, src_row,
                             smol_type(to), out.data(), dst_row, n, r0, r1);
    }
    for (std::thread & th : workers) th.join();
    return out;
}

double mib(uint64_t bytes) {
    return double(bytes) / (1024.0 * 1024.0);
}

std::string shape(const gguf::tensor_info & t) {
    std::string out;
    for (uint32_t d = 0; d < t.n_dims; d++) out += (d ? " x " : "") + std::to_string(t.ne[d]);
    return out;
}

int run(const std::string & in_path, const std::string & out_path, const std::string & type_name,
        int n_threads) {
    const target & to = find_target(type_name);
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
    const std::unique_ptr<gguf::file> in = gguf::file::open(in_path);
    std::printf("smol-quantize: %s -> %s (%s), %zu tensors, CPU kernels %s\n", in_path.c_str(),
                out_path.c_str(), to.name, in->tensors().size(), smol::cpu::kernels_best().name);

    gguf::writer out;
    for (const gguf::kv & kv : in->metadata()) out.set(kv.key, kv.val);
    out.set("general.file_type", gguf::value::make_u32(to.ftype));
    if (smol::cpu::block_elems(to.type) > 1)
        out.set("general.quantization_version", gguf::value::make_u32(2));

    // The writer refers to tensor data until write(): converted tensors are
    // kept here, unchanged ones stay in the input's mapping.
    std::vector<std::vector<uint8_t>> converted;
    converted.reserve(in->tensors().size());
    uint64_t bytes_in = 0, bytes_out = 0;
    const size_t n_tensors = in->tensors().size();
    const int width = int(std::to_string(n_tensors).size());
    for (size_t i = 0; i < n_tensors; i++) {
        const gguf::tensor_info & t = in->tensors()[i];
        bool fell_back = false;
        const uint32_t type = output_type(t, to, fell_back);
        const void * data = t.data;
        uint64_t nbytes = t.nbytes;
        if (type != t.type) {
            if (!convertible(t.type))
                throw quantize_error("tensor '" + t.name + "' is " + ggml_type_name(t.type) +
                                     ", which smol-quantize cannot read (it reads f32, f16, "
                                     "bf16, q4_0, q4_1 and q8_0)");
            converted.push_back(convert(t, type, n_threads));
            data = converted.back().data();
            nbytes = converted.back().size();
        }
        std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
        out.add_tensor(t.name, type, ne, data, nbytes);
        bytes_in += t.nbytes;
        bytes_out += nbytes;
        std::printf("[%*zu/%zu] %-28s %-13s %5s -> %-5s %8.2f -> %8.2f MiB%s\n", width, i + 1,
                    n_tensors, t.name.c_str(), shape(t).c_str(), ggml_type_name(t.type).c_str(),
                    ggml_type_name(type).c_str(), mib(t.nbytes), mib(nbytes),
                    fell_back ? " (rows not a multiple of 32: f16)" : "");
        std::fflush(stdout);
    }
    out.write(out_path);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("smol-quantize: tensors %.2f MiB -> %.2f MiB; file %.2f MiB -> %.2f MiB; %.1f s\n",
                mib(bytes_in), mib(bytes_out), mib(in->size()), mib(fs::file_size(out_path, ec)),
                secs);
    return 0;
}

struct random_args {
    std::string shape;
    std::string type = "f16";
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
    const target & to = find_target(a.type);
    std::error_code ec;
    const fs::path out_dir = fs::absolute(out_path, ec).parent_path();
    if (!fs::is_directory(out_dir, ec))
        throw quantize_error("the output's folder '" + out_dir.string() + "' does not exist");
    rm::options o;
    o.s = *s;
    o.type = to.type;
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
    CLI::App app{"smol-quantize: rewrite a GGUF model with its matmul weights in another type,\n"
                 "or write one of SmolLM2's shapes with random weights.\n"
                 "  smol-quantize INPUT OUTPUT TYPE\n"
                 "  smol-quantize --random 360M --type f16 --vocab-from REAL.gguf OUTPUT\n"
                 "Types: " +
                     valid_names(),
                 "smol-quantize"};
    app.add_option("files", args, "INPUT OUTPUT TYPE, or with --random only OUTPUT")->required();
    app.add_option("--random", ra.shape,
                   "write random weights of this SmolLM2 shape: " +
                       smol::random_model::shape_names());
    app.add_option("--type", ra.type, "with --random: the type of the weights")
        ->capture_default_str();
    app.add_option("--vocab-from", ra.vocab_from,
                   "with --random: a GGUF file whose tokenizer metadata is copied");
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
