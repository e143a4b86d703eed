// llama-fixtures.c++ - records llama.cpp's behaviour on a model file as the
// fixtures tests/llama-fixtures.h holds smol to: logits.json (the top-10
// logits at positions of a few prompts, one of them longer than a sliding
// window) and greedy.json (32 argmax tokens after each prompt, with the gap
// between llama.cpp's top two at each step). It links llama.cpp itself, as
// scripts/peers.sh builds it (for files the Python bindings' fixture script,
// make-fixtures.py, does not cover, such as Gemma 3's).
//
//   g++ -O2 -std=c++17 scripts/llama-fixtures.c++ -o /tmp/llama-fixtures \
//       -I$L/include -I$L/ggml/include -L/work/peers/build-cpu/bin -lllama \
//       -Wl,-rpath,/work/peers/build-cpu/bin   # L: llama.cpp's sources
//   scripts/pydoc-text.py /tmp/pydoc.txt
//   /tmp/llama-fixtures MODEL.gguf /tmp/pydoc.txt OUT_DIR

#include "llama.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr int n_ctx = 2048, n_batch = 512, n_threads = 2, n_greedy = 32;

[[noreturn]] void die(const std::string & what) {
    std::fprintf(stderr, "llama-fixtures: %s\n", what.c_str());
    std::exit(1);
}

struct prompt {
    std::string name, text;
    bool parse_special;
};

std::vector<llama_token> tokenize(const llama_vocab * v, const prompt & p) {
    std::vector<llama_token> ids(p.text.size() + 16);
    const int n = llama_tokenize(v, p.text.data(), int32_t(p.text.size()), ids.data(),
                                 int32_t(ids.size()), true, p.parse_special);
    if (n < 0) die("tokenize failed for " + p.name);
    ids.resize(size_t(n));
    return ids;
}

llama_context * fresh_context(llama_model * m) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;
    cp.n_ubatch = n_batch;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context * c = llama_init_from_model(m, cp);
    if (!c) die("cannot create a context");
    return c;
}

// Decodes ids from position p0 in batches, keeping the logits of every token;
// returns them row by row.
std::vector<std::vector<float>> decode(llama_context * c, const std::vector<llama_token> & ids,
                                       int p0, int n_vocab) {
    std::vector<std::vector<float>> rows;
    llama_batch b = llama_batch_init(n_batch, 0, 1);
    for (size_t i0 = 0; i0 < ids.size(); i0 += n_batch) {
        const size_t n = std::min(ids.size() - i0, size_t(n_batch));
        b.n_tokens = int32_t(n);
        for (size_t i = 0; i < n; ++i) {
            b.token[i] = ids[i0 + i];
            b.pos[i] = llama_pos(p0 + int(i0 + i));
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = 1;
        }
        if (llama_decode(c, b) != 0) die("decode failed");
        for (size_t i = 0; i < n; ++i) {
            const float * l = llama_get_logits_ith(c, int32_t(i));
            rows.emplace_back(l, l + n_vocab);
        }
    }
    llama_batch_free(b);
    return rows;
}

nlohmann::json top10(const std::vector<float> & row) {
    std::vector<int> idx(row.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = int(i);
    std::partial_sort(idx.begin(), idx.begin() + 10, idx.end(),
                      [&](int a, int b) { return row[a] > row[b]; });
    nlohmann::json top = nlohmann::json::array();
    for (int i = 0; i < 10; ++i) top.push_back({idx[i], double(row[idx[i]])});
    return top;
}

} // namespace

int main(int argc, char ** argv) {
    if (argc != 4) die("usage: llama-fixtures MODEL.gguf LONG_TEXT.txt OUT_DIR");
    std::ifstream in(argv[2]);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string long_text = ss.str();
    if (long_text.size() < 4000) die(std::string(argv[2]) + " is too short for the long prompt");
    long_text.resize(3000);

    const std::vector<prompt> prompts = {
        {"plain", "The capital of France is", false},
        {"code",
         "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n",
         false},
        {"turns",
         "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
         true},
        {"long", long_text, false},
    };

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * m = llama_model_load_from_file(argv[1], mp);
    if (!m) die(std::string("cannot load ") + argv[1]);
    const llama_vocab * v = llama_model_get_vocab(m);
    const int n_vocab = llama_vocab_n_tokens(v);

    nlohmann::json logits_fx = {
        {"engine", "llama.cpp (scripts/peers.sh), linked by scripts/llama-fixtures.c++"},
        {"settings",
         {{"n_ctx", n_ctx},
          {"n_batch", n_batch},
          {"n_threads", n_threads},
          {"flash_attn", false},
          {"add_special", true}}},
        {"notes",
         {"top: the 10 largest logits [id, logit] at that position, descending.",
          "mean: the mean of all n_vocab logits of that row (softmax ignores a shift)."}},
        {"prompts", nlohmann::json::array()}};
    nlohmann::json greedy_fx = {
        {"engine", logits_fx["engine"]},
        {"settings", logits_fx["settings"]},
        {"notes",
         {"tokens: 32 argmax tokens decoded one at a time after the prompt.",
          "top1_margin[i]: logit(tokens[i]) - the second-best logit at that step."}},
        {"cases", nlohmann::json::array()}};

    for (const prompt & p : prompts) {
        const std::vector<llama_token> ids = tokenize(v, p);
        std::fprintf(stderr, "llama-fixtures: %s, %zu tokens\n", p.name.c_str(), ids.size());
        llama_context * c = fresh_context(m);
        const auto rows = decode(c, ids, 0, n_vocab);
        nlohmann::json positions = nlohmann::json::array();
        for (size_t pos = 0; pos < ids.size(); ++pos) {
            // Every position of the short prompts; of the long one, every
            // 29th and the last (past the sliding window of 512).
            if (ids.size() > 64 && pos % 29 != 0 && pos + 1 != ids.size()) continue;
            double mean = 0;
            for (const float x : rows[pos]) mean += double(x);
            mean /= double(rows[pos].size());
            positions.push_back({{"pos", pos}, {"top", top10(rows[pos])}, {"mean", mean}});
        }
        logits_fx["prompts"].push_back(
            {{"name", p.name}, {"text", p.text}, {"ids", ids}, {"positions", positions}});

        // Greedy, one token a decode after the prompt.
        std::vector<int> tokens;
        std::vector<double> margins;
        std::vector<float> row = rows.back();
        for (int step = 0; step < n_greedy; ++step) {
            const auto top = top10(row);
            tokens.push_back(top[0][0].get<int>());
            margins.push_back(top[0][1].get<double>() - top[1][1].get<double>());
            row = decode(c, {tokens.back()}, int(ids.size()) + step, n_vocab)[0];
        }
        greedy_fx["cases"].push_back({{"name", p.name},
                                      {"prompt", p.text},
                                      {"prompt_ids", ids},
                                      {"tokens", tokens},
                                      {"top1_margin", margins}});
        llama_free(c);
    }
    const std::string out = argv[3];
    std::ofstream(out + "/logits.json") << logits_fx.dump(1) << "\n";
    std::ofstream(out + "/greedy.json") << greedy_fx.dump(1) << "\n";
    llama_model_free(m);
    return 0;
}
