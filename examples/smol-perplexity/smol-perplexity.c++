// smol-perplexity.c++ - perplexity of a model over a text file, computed as
// llama.cpp's llama-perplexity computes it, so the two can be compared and a
// user can choose a quantization by it: the text is tokenized whole (with a
// bos where the model asks for one), cut into chunks of --ctx-size tokens
// (the first token of each chunk replaced by bos where the model uses one),
// each chunk decoded afresh, and only the second half of each chunk scored:
// the mean negative log-likelihood of tokens first+1 .. n_ctx-1 given what
// precedes them in the chunk, first = n_ctx / 2. Prints the running value
// after each chunk and the final estimate with its uncertainty (the
// standard error of the mean log-likelihood, times the perplexity).
//
//   smol-perplexity -m MODEL.gguf -f TEXT.txt [-c 512] [--chunks N]
//   scripts/pydoc-text.py /tmp/pydoc.txt   writes a real English text (Python's own
//                                          documentation topics) to use

#include "../device-option.h"
#include "../kv-type-option.h"
#include "../streaming-heads-option.h"
#include "smol.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

namespace {

struct options {
    std::string model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    std::string file;
    int32_t n_ctx = 512;
    int32_t n_batch = 512;
    int32_t chunks = -1;
    int threads = 0;
    device_options devices;
    smol_type kv_type = SMOL_TYPE_F16;
    streaming_heads_option streaming;
    bool quiet = false;
};

// -log p(token | logits), from a softmax in double precision.
double nll_of(const float * logits, int32_t n_vocab, smol_token token) {
    const float max = *std::max_element(logits, logits + n_vocab);
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(double(logits[i]) - double(max));
    return -(double(logits[token]) - double(max) - std::log(sum));
}

int run(const options & o) {
    std::ifstream in(o.file, std::ios::binary);
    if (!in) {
        std::fprintf(stderr, "smol-perplexity: cannot read '%s'\n", o.file.c_str());
        return 1;
    }
    const std::string text((std::istreambuf_iterator<char>(in)), {});

    smol_model * model = nullptr;
    if (smol_model_load(o.model.c_str(), nullptr, &model) != SMOL_OK) {
        std::fprintf(stderr, "smol-perplexity: %s\n", smol_last_error());
        return 1;
    }
    smol_model_info info;
    smol_model_get_info(model, &info);

    std::vector<smol_token> tokens(text.size() + 16);
    int32_t n_tokens = 0;
    smol_status st = smol_tokenize(model, text.data(), text.size(), true, false, tokens.data(),
                                   int32_t(tokens.size()), &n_tokens);
    if (st != SMOL_OK) {
        std::fprintf(stderr, "smol-perplexity: cannot tokenize the text: %s\n", smol_last_error());
        smol_model_free(model);
        return 1;
    }
    tokens.resize(size_t(n_tokens));
    const int32_t n_ctx = o.n_ctx;
    if (n_tokens < 2 * n_ctx) {
        std::fprintf(stderr,
                     "smol-perplexity: the text has %d tokens; a context of %d needs at least %d "
                     "(give a longer text or a smaller --ctx-size)\n",
                     n_tokens, n_ctx, 2 * n_ctx);
        smol_model_free(model);
        return 1;
    }
    // A model that starts its text with bos also gets one at each chunk's
    // start, in place of the chunk's first token, as llama-perplexity does.
    const smol_token bos = smol_token_bos(model);
    const bool add_bos = n_tokens > 0 && bos >= 0 && tokens[0] == bos;
    const int32_t n_chunk_max = n_tokens / n_ctx;
    const int32_t n_chunk = o.chunks < 0 ? n_chunk_max : std::min(o.chunks, n_chunk_max);
    const int32_t first = n_ctx / 2;

    smol_context_params cp = smol_context_default_params();
    cp.n_ctx = uint32_t(n_ctx);
    cp.n_batch = uint32_t(std::min(o.n_batch, n_ctx));
    cp.n_threads = o.threads;
    cp.kv_type = o.kv_type;
    if (std::string err; !o.streaming.apply(model, cp, err)) {
        std::fprintf(stderr, "smol-perplexity: %s\n", err.c_str());
        smol_model_free(model);
        return 1;
    }
    if (std::string err; !o.devices.apply(cp, err)) {
        std::fprintf(stderr, "smol-perplexity: %s\n", err.c_str());
        smol_model_free(model);
        return 1;
    }
    smol_context * ctx = nullptr;
    if (smol_context_create(model, &cp, &ctx) != SMOL_OK) {
        std::fprintf(stderr, "smol-perplexity: %s\n", smol_last_error());
        smol_model_free(model);
        return 1;
    }
    std::fprintf(stderr,
                 "smol-perplexity: %s, %d tokens, %d chunks of %d (scoring the second half), "
                 "batch %u, KV %s, %s\n",
                 info.name, n_tokens, n_chunk, n_ctx, cp.n_batch, smol_type_name(cp.kv_type),
                 smol_cpu_kernels_name());

    smol_batch batch = smol_batch_init(int32_t(cp.n_batch));
    double nll = 0.0, nll2 = 0.0;
    int64_t count = 0;
    const auto t0 = std::chrono::steady_clock::now();
    int status = 0;
    for (int32_t c = 0; c < n_chunk && status == 0; ++c) {
        const int32_t start = c * n_ctx;
        smol_kv_seq_rm(ctx, 0, 0, -1);
        for (int32_t b0 = 0; b0 < n_ctx; b0 += int32_t(cp.n_batch)) {
            const int32_t nb = std::min(int32_t(cp.n_batch), n_ctx - b0);
            batch.n_tokens = 0;
            for (int32_t k = 0; k < nb; ++k) {
                const int32_t pos = b0 + k;
                const smol_token t = pos == 0 && add_bos ? bos : tokens[size_t(start + pos)];
                smol_batch_add(&batch, int32_t(cp.n_batch), t, pos, 0,
                               pos >= first && pos < n_ctx - 1);
            }
            if (smol_decode(ctx, &batch) != SMOL_OK) {
                std::fprintf(stderr, "smol-perplexity: decode failed: %s\n", smol_last_error());
                status = 1;
                break;
            }
            for (int32_t k = 0; k < nb; ++k) {
                const int32_t pos = b0 + k;
                if (pos < first || pos >= n_ctx - 1) continue;
                const float * logits = smol_get_logits(ctx, k);
                const double v = nll_of(logits, info.n_vocab, tokens[size_t(start + pos + 1)]);
                nll += v;
                nll2 += v * v;
                ++count;
            }
        }
        if (c == 0) {
            const double secs =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            std::fprintf(stderr, "smol-perplexity: %.2f s per chunk, about %.1f min in all\n", secs,
                         secs * n_chunk / 60.0);
        }
        if (!o.quiet) {
            std::printf("[%d]%.4f,", c + 1, std::exp(nll / double(count)));
            std::fflush(stdout);
        }
    }
    if (!o.quiet) std::printf("\n");
    smol_batch_free(&batch);
    smol_context_free(ctx);
    smol_model_free(model);
    if (status != 0 || count < 2) return status ? status : 1;
    const double mean = nll / double(count);
    const double ppl = std::exp(mean);
    const double var = nll2 / double(count) - mean * mean;
    const double err = var > 0 ? std::sqrt(var / double(count - 1)) * ppl : 0.0;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, err);
    std::fprintf(stderr, "smol-perplexity: %lld tokens scored in %.1f s (%.1f tokens/s decoded)\n",
                 (long long)count, secs, double(n_chunk) * n_ctx / secs);
    return 0;
}

} // namespace

int main(int argc, char ** argv) {
    options o;
    o.threads = int(std::max(1u, std::thread::hardware_concurrency()));
    CLI::App app{"smol-perplexity: a model's perplexity over a text, as llama-perplexity "
                 "computes it"};
    app.add_option("-m,--model", o.model, "GGUF model file")->capture_default_str();
    app.add_option("-f,--file", o.file, "text file")->required();
    app.add_option("-c,--ctx-size", o.n_ctx, "tokens a chunk")
        ->capture_default_str()
        ->check(CLI::Range(8, 1 << 20));
    app.add_option("-b,--batch-size", o.n_batch, "tokens a decode call")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--chunks", o.chunks, "score at most this many chunks (default: all)");
    app.add_option("-t,--threads", o.threads, "CPU threads")->capture_default_str();
    add_device_options(app, o.devices);
    add_kv_type_option(app, o.kv_type);
    o.streaming.add(app);
    app.add_flag("-q,--quiet", o.quiet, "only the final estimate");
    CLI11_PARSE(app, argc, argv);
    return run(o);
}
