// smol-heads.c++ - labels a model's kv heads as streaming or full
// (DuoAttention's idea) from the model's own behaviour on a calibration text.
// Each head in turn has its attention cut to the text's first --sink
// positions and its last --window; the head's score is the mean KL
// divergence of the cut model's next-token distributions from the whole
// model's over the scored positions. The heads whose cut changes least, a
// --fraction of all, become streaming heads; the labels file
// (streaming-heads-option.h) carries them, with every head's score, for
// --streaming-heads.
//
// What is scored decides what the labels keep. By default (--needles N,
// as DuoAttention calibrates on synthetic retrieval) the text is a
// haystack from the file with N facts ("The secret number of NAME is
// 12345.") in its first half and, at its end, the questions again, each
// answered: only the answers' tokens are scored, which the model can give
// only by attending far back. With --needles 0 every position past the
// sinks and window is scored (plain language modelling).
//
//   smol-heads -m MODEL.gguf -f TEXT.txt -o heads.txt [-c 1024] [--sink 64]
//              [--window 256] [--fraction 0.5] [--needles 8]
//   scripts/pydoc-text.py /tmp/pydoc.txt   writes a real English text to use

#include "../streaming-heads-option.h"
#include "smol.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

struct options {
    std::string model = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    std::string file, out;
    int32_t n_ctx = 1024;
    int32_t sink = 64, window = 256;
    double fraction = 0.5;
    int32_t needles = 8;
    uint32_t seed = 1;
    int threads = 0;
    std::string device = "cpu";
};

// log softmax of a logits row, in double sums, into out.
void log_softmax(const float * logits, int32_t n, float * out) {
    const float mx = *std::max_element(logits, logits + n);
    double sum = 0;
    for (int32_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - double(mx));
    const double lse = double(mx) + std::log(sum);
    for (int32_t i = 0; i < n; ++i) out[i] = float(double(logits[i]) - lse);
}

struct calibration {
    smol_model * model = nullptr;
    smol_model_info info{};
    std::vector<smol_token> tokens;
    std::vector<uint8_t> scored; // per position: its logits are scored
    const options * o = nullptr;

    // Decodes the text with these heads cut (null: none) and hands each
    // scored position's logits to f(position index, logits); false on error.
    template <class F> bool run(const std::vector<uint8_t> * heads, F && f) {
        smol_context_params cp = smol_context_default_params();
        const auto n = int32_t(tokens.size());
        cp.n_ctx = uint32_t(n);
        cp.n_batch = uint32_t(std::min(n, 512));
        cp.n_threads = o->threads;
        cp.device = o->device.c_str();
        if (heads) {
            cp.streaming_heads = heads->data();
            cp.n_streaming_heads = uint32_t(heads->size());
            cp.stream_sink = o->sink;
            cp.stream_window = o->window;
        }
        smol_context * ctx = nullptr;
        if (smol_context_create(model, &cp, &ctx) != SMOL_OK) return false;
        smol_batch b = smol_batch_init(int32_t(cp.n_batch));
        bool ok = true;
        for (int32_t b0 = 0; b0 < n && ok; b0 += int32_t(cp.n_batch)) {
            const int32_t nb = std::min(int32_t(cp.n_batch), n - b0);
            b.n_tokens = 0;
            for (int32_t k = 0; k < nb; ++k) {
                const int32_t pos = b0 + k;
                smol_batch_add(&b, int32_t(cp.n_batch), tokens[size_t(pos)], pos, 0,
                               scored[size_t(pos)]);
            }
            ok = smol_decode(ctx, &b) == SMOL_OK;
            for (int32_t k = 0; k < nb && ok; ++k)
                if (scored[size_t(b0 + k)]) f(smol_get_logits(ctx, k));
        }
        smol_batch_free(&b);
        smol_context_free(ctx);
        return ok;
    }
};

std::vector<smol_token> tokenize(const smol_model * m, const std::string & text, bool special) {
    std::vector<smol_token> t(text.size() + 16);
    int32_t n = 0;
    if (smol_tokenize(m, text.data(), text.size(), special, false, t.data(), int32_t(t.size()),
                      &n) != SMOL_OK)
        return {};
    t.resize(size_t(n));
    return t;
}

// The needles text: the file's tokens as a haystack of n_ctx tokens with the
// facts in its first half and the questions, answered, at its end; scored:
// the positions whose next token is an answer's.
bool needle_text(calibration & cal, const std::vector<smol_token> & hay, int32_t n_ctx) {
    const options & o = *cal.o;
    static const char * const names[] = {"the red door", "Alice",         "the old bridge",
                                         "Mount Kepler", "the library",   "Bob",
                                         "the harbour",  "the green lamp"};
    std::mt19937 rng(o.seed);
    struct fact {
        std::vector<smol_token> statement, question, answer;
    };
    std::vector<fact> facts;
    size_t tail = 0;
    for (int32_t i = 0; i < o.needles; ++i) {
        const std::string name =
            std::string(names[size_t(i) % std::size(names)]) +
            (i >= int32_t(std::size(names)) ? " " + std::to_string(i / std::size(names) + 1) : "");
        const std::string key = std::to_string(10000 + rng() % 90000u);
        fact f;
        f.statement =
            tokenize(cal.model, " The secret number of " + name + " is " + key + ". ", false);
        f.question = tokenize(cal.model, " The secret number of " + name + " is", false);
        f.answer = tokenize(cal.model, " " + key + ".", false);
        tail += f.question.size() + f.answer.size();
        facts.push_back(std::move(f));
    }
    size_t stated = 0;
    for (const fact & f : facts) stated += f.statement.size();
    if (hay.size() + stated + tail < size_t(n_ctx) || size_t(n_ctx) < stated + tail + 64)
        return false;
    const size_t n_hay = size_t(n_ctx) - stated - tail;
    // The facts at even steps through the haystack's first half.
    cal.tokens.clear();
    size_t from = 0;
    for (size_t i = 0; i < facts.size(); ++i) {
        const size_t to = n_hay / 2 * (i + 1) / (facts.size() + 1);
        cal.tokens.insert(cal.tokens.end(), hay.begin() + long(from), hay.begin() + long(to));
        cal.tokens.insert(cal.tokens.end(), facts[i].statement.begin(), facts[i].statement.end());
        from = to;
    }
    cal.tokens.insert(cal.tokens.end(), hay.begin() + long(from), hay.begin() + long(n_hay));
    cal.scored.assign(cal.tokens.size(), 0);
    std::vector<size_t> order(facts.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::shuffle(order.begin(), order.end(), rng);
    for (const size_t i : order) {
        cal.tokens.insert(cal.tokens.end(), facts[i].question.begin(), facts[i].question.end());
        for (const smol_token t : facts[i].answer) {
            cal.scored.resize(cal.tokens.size(), 0);
            cal.scored.back() = 1; // predicts t
            cal.tokens.push_back(t);
        }
    }
    cal.scored.resize(cal.tokens.size(), 0);
    return true;
}

int run(const options & o) {
    std::ifstream in(o.file, std::ios::binary);
    if (!in) {
        std::fprintf(stderr, "smol-heads: cannot read '%s'\n", o.file.c_str());
        return 1;
    }
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    calibration cal;
    cal.o = &o;
    if (smol_model_load(o.model.c_str(), nullptr, &cal.model) != SMOL_OK) {
        std::fprintf(stderr, "smol-heads: %s\n", smol_last_error());
        return 1;
    }
    smol_model_get_info(cal.model, &cal.info);
    const int32_t n_vocab = cal.info.n_vocab;
    const std::vector<smol_token> hay = tokenize(cal.model, text, true);
    if (hay.empty()) {
        std::fprintf(stderr, "smol-heads: cannot tokenize the text: %s\n", smol_last_error());
        smol_model_free(cal.model);
        return 1;
    }
    if (o.needles > 0) {
        if (!needle_text(cal, hay, o.n_ctx)) {
            std::fprintf(stderr,
                         "smol-heads: %zu tokens of text do not make a haystack of %d tokens "
                         "for %d facts; give a longer text, or a larger -c or fewer --needles\n",
                         hay.size(), o.n_ctx, o.needles);
            smol_model_free(cal.model);
            return 1;
        }
    } else {
        const auto n = int32_t(std::min<size_t>(hay.size(), size_t(o.n_ctx)));
        const int32_t first = o.sink + o.window;
        if (n < first + 64) {
            std::fprintf(stderr,
                         "smol-heads: %zu tokens of text in a context of %d leave fewer than 64 "
                         "positions past the sinks and window (%d); give a longer text, a "
                         "larger -c or a smaller --window\n",
                         hay.size(), o.n_ctx, first);
            smol_model_free(cal.model);
            return 1;
        }
        cal.tokens.assign(hay.begin(), hay.begin() + n);
        cal.scored.assign(size_t(n), 0);
        for (int32_t p = first; p < n - 1; ++p) cal.scored[size_t(p)] = 1;
    }
    const auto n = int32_t(cal.tokens.size());
    const auto n_scored = int32_t(std::count(cal.scored.begin(), cal.scored.end(), uint8_t(1)));
    const int32_t n_heads = cal.info.n_layer * cal.info.n_head_kv;
    std::fprintf(stderr,
                 "smol-heads: %s, %d kv heads, %d tokens of calibration text, %d positions "
                 "scored (%s), %d sinks and a window of %d\n",
                 cal.info.name, n_heads, n, n_scored,
                 o.needles > 0 ? "the answers to the facts" : "all past the sinks and window",
                 o.sink, o.window);

    // The whole model's log-probabilities at every scored position.
    std::vector<float> whole(size_t(n_scored) * size_t(n_vocab));
    std::vector<float> row(static_cast<size_t>(n_vocab));
    const auto t0 = std::chrono::steady_clock::now();
    int32_t at = 0;
    if (!cal.run(nullptr, [&](const float * logits) {
            log_softmax(logits, n_vocab, whole.data() + size_t(at++) * size_t(n_vocab));
        })) {
        std::fprintf(stderr, "smol-heads: %s\n", smol_last_error());
        smol_model_free(cal.model);
        return 1;
    }
    const double per_run =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "smol-heads: %.1f s a pass, about %.1f min for every head\n", per_run,
                 per_run * n_heads / 60.0);

    std::vector<double> score(size_t(n_heads), 0.0);
    std::vector<uint8_t> heads(size_t(n_heads), 0);
    for (int32_t h = 0; h < n_heads; ++h) {
        std::fill(heads.begin(), heads.end(), uint8_t(0));
        heads[size_t(h)] = 1;
        double kl = 0;
        at = 0;
        const bool ok = cal.run(&heads, [&](const float * logits) {
            log_softmax(logits, n_vocab, row.data());
            const float * w = whole.data() + size_t(at++) * size_t(n_vocab);
            double d = 0;
            for (int32_t v = 0; v < n_vocab; ++v)
                d += std::exp(double(w[v])) * (double(w[v]) - double(row[size_t(v)]));
            kl += d;
        });
        if (!ok) {
            std::fprintf(stderr, "smol-heads: %s\n", smol_last_error());
            smol_model_free(cal.model);
            return 1;
        }
        score[size_t(h)] = kl / double(n_scored);
        std::fprintf(stderr, "\rsmol-heads: head %d of %d (layer %d, kv head %d): KL %.6f   ",
                     h + 1, n_heads, h / cal.info.n_head_kv, h % cal.info.n_head_kv,
                     score[size_t(h)]);
    }
    std::fprintf(stderr, "\n");

    // The least affected heads stream.
    std::vector<int32_t> order(static_cast<size_t>(n_heads));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return score[size_t(a)] < score[size_t(b)]; });
    const auto n_stream = int32_t(std::lround(o.fraction * n_heads));
    streaming_heads_file f;
    f.n_layer = cal.info.n_layer;
    f.n_head_kv = cal.info.n_head_kv;
    f.sink = o.sink;
    f.window = o.window;
    f.flags.assign(size_t(n_heads), 0);
    for (int32_t i = 0; i < n_stream; ++i) f.flags[size_t(order[size_t(i)])] = 1;
    smol_model_free(cal.model);
    if (!write_streaming_heads(o.out, f, score)) {
        std::fprintf(stderr, "smol-heads: cannot write '%s'\n", o.out.c_str());
        return 1;
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("smol-heads: %d of %d heads streaming (KL up to %.6f; the full heads' from "
                "%.6f) written to %s in %.0f s\n",
                n_stream, n_heads, n_stream > 0 ? score[size_t(order[size_t(n_stream - 1)])] : 0.0,
                n_stream < n_heads ? score[size_t(order[size_t(n_stream)])] : 0.0, o.out.c_str(),
                secs);
    return 0;
}

} // namespace

int main(int argc, char ** argv) {
    options o;
    o.threads = int(std::max(1u, std::thread::hardware_concurrency()));
    CLI::App app{"smol-heads: label a model's kv heads as streaming (approximate: the text's "
                 "first and last positions) or full, from its own behaviour on a text"};
    app.add_option("-m,--model", o.model, "GGUF model file")->capture_default_str();
    app.add_option("-f,--file", o.file, "calibration text file")->required();
    app.add_option("-o,--output", o.out, "labels file to write")->required();
    app.add_option("-c,--ctx-size", o.n_ctx, "tokens of the text to use")
        ->capture_default_str()
        ->check(CLI::Range(64, 1 << 20));
    app.add_option("--sink", o.sink, "positions at the text's start a streaming head keeps")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--window", o.window, "recent positions a streaming head sees")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--fraction", o.fraction, "the share of heads to label streaming")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    app.add_option("--needles", o.needles,
                   "facts hidden in the text and asked for at its end, whose answers alone "
                   "are scored (0: score every position past the sinks and window)")
        ->capture_default_str()
        ->check(CLI::Range(0, 256));
    app.add_option("--seed", o.seed, "the facts' numbers")->capture_default_str();
    app.add_option("-t,--threads", o.threads, "CPU threads")->capture_default_str();
    app.add_option("--device", o.device, "cpu or sim")->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    return run(o);
}
