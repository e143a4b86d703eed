// smol-cli.c++ - the command line for generating text with smol. Three modes:
// raw completion of a prompt (-p or -f), one chat turn answered with the
// model's chat template (--chat -p), and an interactive chat (--chat) that
// keeps the conversation in the KV cache and decodes only what each turn
// adds. Tokens are streamed to stdout as they are sampled; the loading bar,
// notes and timings go to stderr so stdout holds only text.

#include "../device-option.h"
#include "../kv-type-option.h"
#include "../streaming-heads-option.h"
#include "smol.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;

namespace {

constexpr const char * default_model_name = "SmolLM2-135M-Instruct.Q4_1.gguf";

// --- errors and handles -------------------------------------------------------

// A failure to report to the user; main prints it and exits with status 1.
struct cli_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

void check(smol_status status, const std::string & what) {
    if (status != SMOL_OK) throw cli_error(what + ": " + smol_last_error());
}

struct model_free {
    void operator()(smol_model * m) const { smol_model_free(m); }
};
struct context_free {
    void operator()(smol_context * c) const { smol_context_free(c); }
};
struct sampler_free {
    void operator()(smol_sampler * s) const { smol_sampler_free(s); }
};
using model_ptr = std::unique_ptr<smol_model, model_free>;
using context_ptr = std::unique_ptr<smol_context, context_free>;
using sampler_ptr = std::unique_ptr<smol_sampler, sampler_free>;

// Owns a smol_batch and remembers its capacity, which smol_batch_add needs.
struct batch_holder {
    smol_batch batch;
    int32_t capacity;
    explicit batch_holder(int32_t n) : batch(smol_batch_init(n)), capacity(n) {}
    ~batch_holder() { smol_batch_free(&batch); }
    batch_holder(const batch_holder &) = delete;
    batch_holder & operator=(const batch_holder &) = delete;
};

// --- Ctrl-C -------------------------------------------------------------------

// While a reply is being generated, Ctrl-C ends the reply (so the timings are
// still printed and a chat can go on); at any other time it ends the program.
volatile std::sig_atomic_t g_generating = 0;
volatile std::sig_atomic_t g_interrupted = 0;

extern "C" void on_sigint(int) {
    if (g_generating) {
        g_interrupted = 1;
        return;
    }
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
}

// --- options ------------------------------------------------------------------

struct options {
    std::string model;
    std::string prompt;
    std::string prompt_file;
    std::string system;
    int32_t n_predict = -1;
    uint32_t n_ctx = 0;
    uint32_t n_batch = 0;
    int32_t n_threads = 0;
    device_options devices;
    std::string kv_offload = "auto";
    std::string kv_attend = "auto";
    int32_t head_group = 0;
    smol_type kv_type = SMOL_TYPE_F16;
    streaming_heads_option streaming;
    bool dump_plan = false;
    bool dump_schedule = false;
    bool swa_full = false;
    smol_sampler_params sampling = smol_sampler_default_params();
    int64_t seed = -1;
    bool chat = false;
    bool verbose_prompt = false;
    bool no_display_prompt = false;
    // Speculative decoding (greedy only): n-gram lookup or a draft model.
    bool lookup = false;
    std::string draft_model;
    int32_t draft_max = 8;
    int32_t spec_tree = 0; // --spec-tree: a token tree of this budget
    int32_t self_spec = 0; // --self-spec: the model as its own draft over this window
};

// The default model: models/<name> under the current directory, else beside
// the executable's build tree (../models, ../../models), so that
// ./build/examples/smol-cli finds the repository's models/ from anywhere.
std::vector<fs::path> default_model_candidates(const char * argv0) {
    const fs::path rel = fs::path("models") / default_model_name;
    std::vector<fs::path> out{rel};
    std::error_code ec;
    fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (ec) exe = fs::absolute(argv0, ec);
    if (!ec && !exe.empty()) {
        const fs::path dir = exe.parent_path();
        out.push_back((dir / ".." / rel).lexically_normal());
        out.push_back((dir / ".." / ".." / rel).lexically_normal());
    }
    return out;
}

std::string find_model(const options & o, const char * argv0) {
    std::error_code ec;
    if (!o.model.empty()) {
        if (!fs::is_regular_file(o.model, ec))
            throw cli_error("model file '" + o.model +
                            "' does not exist; check the path, or run scripts/fetch-model.sh "
                            "to download the default model");
        return o.model;
    }
    std::string looked;
    for (const fs::path & p : default_model_candidates(argv0)) {
        if (fs::is_regular_file(p, ec)) return p.string();
        looked += "\n  " + p.string();
    }
    throw cli_error(std::string("no model given (-m) and the default model ") + default_model_name +
                    " is not in any of:" + looked +
                    "\nrun scripts/fetch-model.sh to download it, or pass -m PATH");
}

std::string read_file(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw cli_error("cannot read the prompt file '" + path + "'");
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// --- text and tokens ----------------------------------------------------------

std::vector<smol_token> tokenize(const smol_model * model, const std::string & text,
                                 bool add_special, bool parse_special) {
    // Tokens are at least a byte long, so this size is nearly always enough.
    std::vector<smol_token> tokens(text.size() + 2);
    int32_t n = 0;
    smol_status st = smol_tokenize(model, text.data(), text.size(), add_special, parse_special,
                                   tokens.data(), int32_t(tokens.size()), &n);
    if (st == SMOL_ERR_BUFFER_TOO_SMALL) {
        tokens.resize(size_t(n));
        st = smol_tokenize(model, text.data(), text.size(), add_special, parse_special,
                           tokens.data(), int32_t(tokens.size()), &n);
    }
    check(st, "tokenize");
    tokens.resize(size_t(n));
    return tokens;
}

// The bytes of a token; they may be part of a UTF-8 character, which the
// terminal completes when the next piece arrives.
std::string piece(const smol_model * model, smol_token token, bool special) {
    std::string out(64, '\0');
    size_t n = 0;
    smol_status st = smol_token_to_piece(model, token, special, out.data(), out.size(), &n);
    if (st == SMOL_ERR_BUFFER_TOO_SMALL) {
        out.resize(n + 1); // room for the NUL smol writes after the bytes
        st = smol_token_to_piece(model, token, special, out.data(), out.size(), &n);
    }
    check(st, "detokenize token " + std::to_string(token));
    out.resize(n);
    return out;
}

// The conversation's tokens with the assistant's turn opened. Special
// tokens come only from the template's text, never from what was typed.
std::vector<smol_token> chat_tokens(const smol_model * model,
                                    const std::vector<std::string> & roles,
                                    const std::vector<std::string> & contents) {
    std::vector<smol_chat_message> msgs(roles.size());
    size_t guess = 256;
    for (size_t i = 0; i < roles.size(); i++) {
        msgs[i] = smol_chat_message{}; // name, tool_call_id, tool_calls: none
        msgs[i].role = roles[i].c_str();
        msgs[i].content = contents[i].c_str();
        guess += contents[i].size() + 64;
    }
    const smol_chat_params p = smol_chat_default_params();
    std::vector<smol_token> out(guess);
    int32_t n = 0;
    smol_status st = smol_chat_tokenize(model, msgs.data(), msgs.size(), &p, out.data(),
                                        int32_t(out.size()), &n);
    if (st == SMOL_ERR_BUFFER_TOO_SMALL) {
        out.resize(size_t(n));
        st = smol_chat_tokenize(model, msgs.data(), msgs.size(), &p, out.data(), n, &n);
    }
    check(st, "chat template");
    out.resize(size_t(n));
    return out;
}

void print_tokens(const smol_model * model, const std::vector<smol_token> & tokens) {
    std::fprintf(stderr, "prompt: %zu tokens\n", tokens.size());
    for (smol_token t : tokens) {
        std::string shown;
        for (char c : piece(model, t, true)) {
            if (c == '\n')
                shown += "\\n";
            else if (c == '\t')
                shown += "\\t";
            else
                shown += c;
        }
        std::fprintf(stderr, "%6d -> '%s'\n", t, shown.c_str());
    }
}

// --- loading ------------------------------------------------------------------

struct progress_bar {
    int last = -1;
};

// Draws only on a terminal: in a log the redraws would be noise.
bool on_progress(float fraction, void * user_data) {
    auto * bar = static_cast<progress_bar *>(user_data);
    const int pct = std::clamp(int(fraction * 100.0f), 0, 100);
    if (pct == bar->last) return true;
    bar->last = pct;
    constexpr int width = 40;
    const int fill = pct * width / 100;
    std::fprintf(stderr, "\rloading [%s%s] %3d%%", std::string(size_t(fill), '#').c_str(),
                 std::string(size_t(width - fill), ' ').c_str(), pct);
    std::fflush(stderr);
    return true;
}

// --- the session: model, context, sampler and what the cache holds -------------

struct session {
    smol_model * model = nullptr;
    smol_context * ctx = nullptr;
    smol_sampler * sampler = nullptr;
    batch_holder * batch = nullptr;
    int32_t n_vocab = 0;
    int32_t n_ctx = 0;
    int32_t n_past = 0; // tokens of sequence 0 in the cache
    bool verbose_prompt = false;
    smol_model * draft = nullptr;   // -md
    smol_sampler_params sampling{}; // with the seed drawn
    // Greedy: a step keeps only its top token (on a GPU picked there), not
    // the logits.
    bool greedy() const { return smol_sampler_is_greedy(sampler); }
};

// Decodes tokens after what the cache holds, in chunks of the batch size,
// keeping only the last token's logits, or its top token (all that
// sampling needs).
void decode(session & s, std::span<const smol_token> tokens) {
    for (size_t i = 0; i < tokens.size(); i += size_t(s.batch->capacity)) {
        const size_t n = std::min(tokens.size() - i, size_t(s.batch->capacity));
        s.batch->batch.n_tokens = 0;
        for (size_t j = 0; j < n; j++)
            smol_batch_add(&s.batch->batch, s.batch->capacity, tokens[i + j], s.n_past + int32_t(j),
                           0, i + j + 1 == tokens.size());
        if (i + n == tokens.size() && s.greedy()) s.batch->batch.logits[n - 1] = SMOL_KEEP_TOKEN;
        check(smol_decode(s.ctx, &s.batch->batch), "decode");
        s.n_past += int32_t(n);
    }
}

struct generation {
    std::string text;               // what was shown (control tokens left out)
    std::vector<smol_token> cached; // the tokens decoded into the cache
    bool eog = false;               // stopped at an end-of-generation token
    bool full = false;              // stopped because the context was full
};

// Samples and streams up to n_predict tokens (< 0: until the context is
// full) after the cached ones, which must have left logits. decode_last
// also decodes the final token so the cache holds the whole reply.
generation generate(session & s, int32_t n_predict, bool decode_last) {
    generation g;
    g_interrupted = 0;
    struct generating_scope {
        generating_scope() { g_generating = 1; }
        ~generating_scope() { g_generating = 0; }
    } scope;
    for (int32_t n = 0; n_predict < 0 || n < n_predict; n++) {
        if (g_interrupted) break;
        smol_token t = -1;
        if (s.greedy()) {
            t = smol_get_top_token(s.ctx, -1);
        } else if (const float * logits = smol_get_logits(s.ctx, -1)) {
            t = smol_sampler_sample(s.sampler, logits, s.n_vocab);
        }
        if (t < 0) throw cli_error("the last decode kept no logits");
        smol_sampler_accept(s.sampler, t);
        if (smol_token_is_eog(s.model, t)) {
            g.eog = true;
            break;
        }
        const std::string p = piece(s.model, t, false);
        std::fwrite(p.data(), 1, p.size(), stdout);
        std::fflush(stdout);
        g.text += p;
        if (n + 1 == n_predict && !decode_last) break;
        if (s.n_past >= s.n_ctx) {
            g.full = true;
            break;
        }
        decode(s, {&t, 1});
        g.cached.push_back(t);
    }
    return g;
}

void report_stop(const generation & g, const session & s) {
    if (g.full)
        std::fprintf(stderr, "\n[context full: %d tokens; use a larger -c to generate more]\n",
                     s.n_ctx);
    else if (g_interrupted)
        std::fprintf(stderr, "\n[interrupted]\n");
}

// --- modes ----------------------------------------------------------------------

// A completion through smol_spec: the prompt, then the target's tokens
// (greedy, or sampled exactly by speculative rejection sampling) several at
// a time where the proposer guesses them.
int run_speculative(session & s, const options & o, const std::vector<smol_token> & tokens) {
    smol_spec_params p = smol_spec_default_params();
    p.draft_max = o.draft_max;
    p.tree_budget = o.spec_tree;
    p.draft_model = s.draft;
    p.self_window = o.self_spec;
    p.sampling = s.sampling;
    smol_spec * raw = nullptr;
    check(smol_spec_create(s.ctx, &p, &raw), "speculative decoding");
    std::unique_ptr<smol_spec, void (*)(smol_spec *)> spec(raw, smol_spec_free);
    check(smol_spec_prompt(spec.get(), tokens.data(), int32_t(tokens.size())), "decode");
    s.n_past = int32_t(tokens.size());
    const auto t0 = std::chrono::steady_clock::now();
    generation g;
    g_interrupted = 0;
    int32_t n = 0;
    std::vector<smol_token> got(size_t(std::max(2, std::max(o.draft_max, o.spec_tree) + 1)));
    while ((o.n_predict < 0 || n < o.n_predict) && !g.eog && !g_interrupted) {
        if (s.n_past >= s.n_ctx) {
            g.full = true;
            break;
        }
        const int32_t want =
            o.n_predict < 0 ? int32_t(got.size()) : std::min(int32_t(got.size()), o.n_predict - n);
        int32_t k = 0;
        check(smol_spec_next(spec.get(), got.data(), want, &k), "decode");
        s.n_past += k;
        for (int32_t i = 0; i < k; ++i) {
            if (smol_token_is_eog(s.model, got[size_t(i)])) {
                g.eog = true;
                break;
            }
            const std::string piece_text = piece(s.model, got[size_t(i)], false);
            std::fwrite(piece_text.data(), 1, piece_text.size(), stdout);
            ++n;
        }
        std::fflush(stdout);
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::fputc('\n', stdout);
    std::fflush(stdout);
    report_stop(g, s);
    const smol_spec_stats st = smol_spec_get_stats(spec.get());
    std::fprintf(stderr,
                 "smol-cli: speculative (%s, %s): %lld tokens in %.1f ms (%.2f tokens/s), %lld "
                 "target decodes (%.2f tokens each), %lld of %lld guesses kept (%.1f%%)\n",
                 o.spec_tree > 0   ? "token tree"
                 : s.draft         ? "draft model"
                 : o.self_spec > 0 ? "self-speculation"
                                   : "n-gram lookup",
                 s.sampling.temperature > 0 ? "sampling" : "greedy", (long long)st.n_tokens, ms,
                 ms > 0 ? 1e3 * double(st.n_tokens) / ms : 0.0, (long long)st.n_steps,
                 st.n_steps ? double(st.n_tokens) / double(st.n_steps) : 0.0,
                 (long long)st.n_accepted, (long long)st.n_drafted,
                 st.n_drafted ? 100.0 * double(st.n_accepted) / double(st.n_drafted) : 0.0);
    return 0;
}

int run_completion(session & s, const options & o, const std::string & prompt) {
    const std::vector<smol_token> tokens = tokenize(s.model, prompt, true, false);
    if (tokens.empty()) throw cli_error("the prompt is empty; give some text with -p or -f");
    if (int32_t(tokens.size()) > s.n_ctx)
        throw cli_error(
            "the prompt is " + std::to_string(tokens.size()) +
            " tokens, longer than the context of " + std::to_string(s.n_ctx) + "; use -c " +
            std::to_string(tokens.size() + size_t(o.n_predict < 0 ? 512 : o.n_predict)) +
            " or a shorter prompt");
    if (s.verbose_prompt) print_tokens(s.model, tokens);
    for (smol_token t : tokens) smol_sampler_accept(s.sampler, t);
    if (!o.no_display_prompt) {
        std::fwrite(prompt.data(), 1, prompt.size(), stdout);
        std::fflush(stdout);
    }
    if (o.lookup || s.draft || o.self_spec > 0) return run_speculative(s, o, tokens);
    decode(s, tokens);
    const generation g = generate(s, o.n_predict, false);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    report_stop(g, s);
    return 0;
}

// A conversation and the formatted text the cache holds of it.
struct chat_history {
    std::vector<std::string> roles;
    std::vector<std::string> contents;
    std::vector<smol_token> cached; // the tokens in the cache, as decoded

    void add(std::string role, std::string content) {
        roles.push_back(std::move(role));
        contents.push_back(std::move(content));
    }
};

// Answers the last user message of h. Only the text the template adds after
// what the cache holds is decoded; when a template rewrites earlier turns,
// or the context is full and the oldest turns must go, the cache starts over.
void chat_turn(session & s, const options & o, chat_history & h) {
    bool restart = false;
    for (;;) {
        const std::vector<smol_token> formatted = chat_tokens(s.model, h.roles, h.contents);
        // Keep what the cache shares with the conversation. A reply's
        // sampled tokens may differ from how its text tokenizes again; the
        // cache then keeps the part before the first difference.
        size_t keep = 0;
        if (!restart && !formatted.empty()) {
            const size_t most = std::min(formatted.size() - 1, h.cached.size());
            while (keep < most && formatted[keep] == h.cached[keep]) keep++;
        }
        if (keep < h.cached.size()) {
            smol_kv_seq_rm(s.ctx, 0, smol_pos(keep), -1);
            s.n_past = int32_t(keep);
            h.cached.resize(keep);
        }
        const std::vector<smol_token> tokens(formatted.begin() + long(keep), formatted.end());
        // Leave room for a reply of at least a few tokens.
        const int32_t room = std::min(s.n_ctx / 4, 32);
        if (s.n_past + int32_t(tokens.size()) + room <= s.n_ctx) {
            if (s.verbose_prompt) print_tokens(s.model, tokens);
            decode(s, tokens);
            h.cached.insert(h.cached.end(), tokens.begin(), tokens.end());
            break;
        }
        // Drop the oldest exchange after the system prompt, if any remains.
        const size_t first = !h.roles.empty() && h.roles[0] == "system" ? 1 : 0;
        if (h.roles.size() - first <= 1) {
            const size_t n_turn = s.n_past + tokens.size();
            h.roles.pop_back();
            h.contents.pop_back();
            throw cli_error("the message needs " + std::to_string(n_turn) +
                            " tokens with the template, more than the context of " +
                            std::to_string(s.n_ctx) + " allows; use a larger -c");
        }
        const size_t n_drop = std::min<size_t>(2, h.roles.size() - first - 1);
        h.roles.erase(h.roles.begin() + long(first), h.roles.begin() + long(first + n_drop));
        h.contents.erase(h.contents.begin() + long(first),
                         h.contents.begin() + long(first + n_drop));
        restart = true;
        std::fprintf(stderr, "[context full: dropped the oldest turn]\n");
    }
    const generation g = generate(s, o.n_predict, true);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    report_stop(g, s);
    h.cached.insert(h.cached.end(), g.cached.begin(), g.cached.end());
    h.add("assistant", g.text);
}

int run_chat(session & s, const options & o, const std::string & prompt, bool one_turn) {
    chat_history h;
    if (!o.system.empty()) h.add("system", o.system);
    if (one_turn) {
        h.add("user", prompt);
        chat_turn(s, o, h);
        return 0;
    }
    const bool tty = isatty(STDIN_FILENO);
    if (tty)
        std::fprintf(stderr, "chat: type a message and press Enter; end a line with \\ to go on "
                             "to the next; /exit or Ctrl-D quits\n");
    for (;;) {
        std::fputs("> ", stdout);
        std::fflush(stdout);
        std::string line, message;
        bool eof = true;
        while (std::getline(std::cin, line)) {
            eof = false;
            if (!line.empty() && line.back() == '\\') {
                line.back() = '\n';
                message += line;
                continue;
            }
            message += line;
            break;
        }
        if (eof && message.empty()) {
            std::fputc('\n', stdout);
            break;
        }
        if (message == "/exit" || message == "/quit") break;
        if (message.find_first_not_of(" \t\r\n") == std::string::npos) continue;
        h.add("user", message);
        try {
            chat_turn(s, o, h);
        } catch (const cli_error & e) {
            // A message too long for the context ends that turn, not the chat.
            std::fprintf(stderr, "smol-cli: %s\n", e.what());
        }
        if (eof) break;
    }
    return 0;
}

void print_timings(const smol_context * ctx, double load_ms) {
    const smol_perf p = smol_context_perf(ctx);
    if (p.t_load_ms > 0) load_ms = p.t_load_ms;
    auto rate = [](int64_t n, double ms) { return ms > 0 ? 1e3 * double(n) / ms : 0.0; };
    std::fprintf(stderr, "\nsmol-cli: load %.1f ms\n", load_ms);
    std::fprintf(stderr, "smol-cli: prompt     %6lld tokens in %9.1f ms (%8.2f tokens/s)\n",
                 (long long)p.n_prompt_tokens, p.t_prompt_ms,
                 rate(p.n_prompt_tokens, p.t_prompt_ms));
    std::fprintf(stderr, "smol-cli: generation %6lld tokens in %9.1f ms (%8.2f tokens/s)\n",
                 (long long)p.n_eval_tokens, p.t_eval_ms, rate(p.n_eval_tokens, p.t_eval_ms));
}

int run(const options & o, const char * argv0) {
    if (!o.prompt.empty() && !o.prompt_file.empty())
        throw cli_error("give the prompt with -p or -f, not both");
    std::string prompt = o.prompt_file.empty() ? o.prompt : read_file(o.prompt_file);
    const bool dump_only = prompt.empty() && !o.chat && (o.dump_plan || o.dump_schedule);
    if (!o.chat && prompt.empty() && !dump_only)
        throw cli_error("no prompt: give one with -p TEXT or -f FILE, or use --chat");
    const std::string path = find_model(o, argv0);
    const bool speculative = o.lookup || !o.draft_model.empty() || o.self_spec > 0;
    if (speculative && o.chat)
        throw cli_error("--lookup, --model-draft and --self-spec work with -p only so far; leave "
                        "out --chat");
    if (speculative && o.sampling.temperature > 0 && o.sampling.repeat_penalty != 1.0f)
        throw cli_error("--lookup, --model-draft and --self-spec sample without a repetition "
                        "penalty; leave out --repeat-penalty (or give --temp 0)");
    if (int(o.lookup) + int(!o.draft_model.empty()) + int(o.self_spec > 0) > 1)
        throw cli_error("give one of --lookup, --model-draft FILE and --self-spec WINDOW");
    if (o.spec_tree != 0) {
        if (o.draft_model.empty())
            throw cli_error("--spec-tree needs --model-draft FILE (the tree is the draft's)");
        if (o.spec_tree < 0 || o.spec_tree > 128)
            throw cli_error("--spec-tree " + std::to_string(o.spec_tree) +
                            ": give a budget of 1 to 128 tokens a target decode");
    }

    progress_bar bar;
    smol_model_params mparams = smol_model_default_params();
    if (isatty(STDERR_FILENO)) {
        mparams.progress = on_progress;
        mparams.progress_user_data = &bar;
    }
    const auto t0 = std::chrono::steady_clock::now();
    smol_model * raw_model = nullptr;
    const smol_status st = smol_model_load(path.c_str(), &mparams, &raw_model);
    if (bar.last >= 0) std::fputc('\n', stderr);
    check(st, "cannot load " + path);
    model_ptr model(raw_model);
    model_ptr draft(nullptr);
    if (!o.draft_model.empty()) {
        if (!fs::is_regular_file(o.draft_model))
            throw cli_error("draft model file '" + o.draft_model +
                            "' (--model-draft) does not exist");
        smol_model * raw_draft = nullptr;
        check(smol_model_load(o.draft_model.c_str(), nullptr, &raw_draft),
              "cannot load the draft model " + o.draft_model + " (--model-draft)");
        draft.reset(raw_draft);
    }
    const double load_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

    smol_context_params cparams = smol_context_default_params();
    if (o.n_ctx) cparams.n_ctx = o.n_ctx;
    if (o.n_batch) cparams.n_batch = o.n_batch;
    cparams.n_threads = o.n_threads;
    cparams.swa_full = o.swa_full;
    if (std::string err; !o.devices.apply(cparams, err)) throw cli_error(err);
    cparams.kv_offload = o.kv_offload == "none"  ? SMOL_KV_OFFLOAD_NONE
                         : o.kv_offload == "all" ? SMOL_KV_OFFLOAD_ALL
                                                 : SMOL_KV_OFFLOAD_AUTO;
    cparams.kv_attend = o.kv_attend == "device" ? SMOL_KV_ATTEND_DEVICE
                        : o.kv_attend == "host" ? SMOL_KV_ATTEND_HOST
                                                : SMOL_KV_ATTEND_AUTO;
    cparams.head_group = o.head_group;
    cparams.kv_type = o.kv_type;
    if (std::string err; !o.streaming.apply(model.get(), cparams, err)) throw cli_error(err);
    // A token tree verifies each branch as a sequence of its own.
    if (o.spec_tree > 0) cparams.n_seq_max = uint32_t(std::max(1, o.spec_tree / 2) + 1);
    smol_context * raw_ctx = nullptr;
    check(smol_context_create(model.get(), &cparams, &raw_ctx), "cannot create the context");
    context_ptr ctx(raw_ctx);
    if (o.spec_tree > int32_t(smol_context_n_batch(ctx.get())))
        throw cli_error("--spec-tree " + std::to_string(o.spec_tree) +
                        " is more than the batch of " +
                        std::to_string(smol_context_n_batch(ctx.get())) +
                        " tokens (the target verifies the tree in one decode); give a smaller "
                        "budget or a larger -b");
    if (o.dump_plan || o.dump_schedule) {
        std::vector<char> text(size_t(1) << 20);
        size_t n = 0;
        if (o.dump_plan) {
            check(smol_context_plan_dump(ctx.get(), text.data(), text.size(), &n), "--dump-plan");
            std::fputs(text.data(), stderr);
            smol_memory_info mi;
            smol_context_memory(ctx.get(), &mi);
            std::fprintf(stderr, "  measured: device peak %.1f MiB, host pinned %.1f MiB%s\n",
                         double(mi.device_peak) / 1048576.0, double(mi.host_pinned) / 1048576.0,
                         mi.host_pageable ? " (some host memory could not be pinned)" : "");
            std::fputs(device_lines(ctx.get()).c_str(), stderr);
        }
        if (o.dump_schedule) {
            smol_status st = smol_context_schedule_dump(ctx.get(), 1, text.data(), text.size(), &n);
            if (st == SMOL_ERR_BUFFER_TOO_SMALL) {
                text.resize(n + 1);
                st = smol_context_schedule_dump(ctx.get(), 1, text.data(), text.size(), &n);
            }
            check(st, "--dump-schedule");
            std::fputs(text.data(), stderr);
        }
        if (dump_only) return 0;
    }

    smol_sampler_params sparams = o.sampling;
    sparams.seed = o.seed < 0 ? std::random_device{}() : uint64_t(o.seed);
    smol_sampler * raw_sampler = nullptr;
    check(smol_sampler_create(&sparams, &raw_sampler), "cannot create the sampler");
    sampler_ptr sampler(raw_sampler);

    smol_model_info info;
    smol_model_get_info(model.get(), &info);
    batch_holder batch(int32_t(smol_context_n_batch(ctx.get())));
    session s;
    s.model = model.get();
    s.ctx = ctx.get();
    s.sampler = sampler.get();
    s.batch = &batch;
    s.n_vocab = info.n_vocab;
    s.n_ctx = int32_t(smol_context_n_ctx(ctx.get()));
    s.verbose_prompt = o.verbose_prompt;
    s.draft = draft.get();
    s.sampling = sparams;
    const char * type = smol_type_name(info.ftype);
    std::fprintf(stderr,
                 "smol-cli: %s (%s, %.1f MiB) | n_ctx %d | n_batch %d | kernels %s | seed %llu\n",
                 info.name, type ? type : "?", double(info.n_bytes) / (1024.0 * 1024.0), s.n_ctx,
                 batch.capacity, smol_cpu_kernels_name(), (unsigned long long)sparams.seed);

    std::signal(SIGINT, on_sigint);
    const int rc = o.chat ? run_chat(s, o, prompt, !prompt.empty()) : run_completion(s, o, prompt);
    // A speculative run printed its own rates: its verify batches would
    // read as prompt tokens here.
    if (speculative) {
        std::fprintf(stderr, "smol-cli: load %.1f ms\n", load_ms);
    } else {
        print_timings(ctx.get(), load_ms);
    }
    return rc;
}

} // namespace

int main(int argc, char ** argv) {
    options o;
    CLI::App app{"smol-cli: generate text with a GGUF model (Llama, Gemma 3).\n"
                 "  -p TEXT            complete TEXT (raw, no chat template)\n"
                 "  --chat -p TEXT     answer TEXT as one chat turn, then exit\n"
                 "  --chat             chat interactively (reads stdin)",
                 "smol-cli"};
    app.add_option("-m,--model", o.model,
                   std::string("GGUF model file (default: models/") + default_model_name + ")");
    auto * p = app.add_option("-p,--prompt", o.prompt, "prompt text");
    app.add_option("-f,--file", o.prompt_file, "read the prompt from a file")->excludes(p);
    app.add_option("-n,--n-predict", o.n_predict, "tokens to generate (-1: until the end)")
        ->capture_default_str()
        ->check(CLI::Range(-1, 1 << 30));
    app.add_option("-c,--ctx-size", o.n_ctx, "context size in tokens (0: the library's default)")
        ->capture_default_str();
    app.add_option("-b,--batch-size", o.n_batch,
                   "most tokens per decode (0: the library's default)")
        ->capture_default_str();
    app.add_option("-t,--threads", o.n_threads, "CPU threads (0: all cores)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    add_device_options(app, o.devices);
    app.add_option("--kv-offload", o.kv_offload,
                   "KV heads in host memory: auto (what does not fit), none, all")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "none", "all"}));
    app.add_option("--kv-attend", o.kv_attend,
                   "offloaded KV heads: auto (by measured speeds), device (streamed), "
                   "host (attended on the CPU)")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "device", "host"}));
    app.add_option("--head-group", o.head_group, "kv heads per group (0: from the plan)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    add_kv_type_option(app, o.kv_type);
    o.streaming.add(app);
    app.add_flag("--dump-plan", o.dump_plan, "print the KV placement plan to stderr");
    app.add_flag("--dump-schedule", o.dump_schedule,
                 "print the program of one decode step (streams, copies, events) to stderr");
    app.add_flag("--swa-full", o.swa_full,
                 "sliding-window layers (Gemma 3's local ones) keep every position, not only "
                 "their window: more memory, rollbacks and prefix reuse of any length");
    app.add_option("--temp", o.sampling.temperature, "temperature (<= 0: greedy)")
        ->capture_default_str();
    app.add_option("--top-k", o.sampling.top_k, "top-k sampling (<= 0: off)")
        ->capture_default_str();
    app.add_option("--top-p", o.sampling.top_p, "top-p sampling (1: off)")
        ->capture_default_str()
        ->check(CLI::Range(0.0f, 1.0f));
    app.add_option("--min-p", o.sampling.min_p, "min-p sampling (0: off)")
        ->capture_default_str()
        ->check(CLI::Range(0.0f, 1.0f));
    app.add_option("--repeat-penalty", o.sampling.repeat_penalty,
                   "penalty for repeated tokens (1: off)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--repeat-last-n", o.sampling.repeat_last_n,
                   "how many recent tokens the penalty looks at")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("-s,--seed", o.seed, "sampling seed (-1: random)")->capture_default_str();
    app.add_flag("--lookup", o.lookup,
                 "speculative decoding by n-gram lookup in the text so far (-p only)");
    app.add_option("--model-draft,--md", o.draft_model,
                   "speculative decoding with this draft model (same vocabulary; -p only)");
    app.add_option("--spec-tree", o.spec_tree,
                   "with --model-draft: a token tree of the draft's likeliest continuations, "
                   "at most this many tokens verified per target decode");
    app.add_option("--self-spec", o.self_spec,
                   "self-speculation: the model drafts for itself in a small resident context "
                   "that sees the text's first tokens and the last WINDOW, so a draft step "
                   "moves no offloaded KV; the target verifies against its whole cache (-p only)")
        ->check(CLI::PositiveNumber);
    app.add_option("--draft-max", o.draft_max, "most tokens guessed per target decode")
        ->check(CLI::Range(1, 256))
        ->capture_default_str();
    app.add_flag("--chat", o.chat, "chat with the model's template (interactive without -p)");
    app.add_option("--system", o.system, "system message for --chat");
    app.add_flag("--verbose-prompt", o.verbose_prompt, "print the prompt's tokens to stderr");
    app.add_flag("--no-display-prompt", o.no_display_prompt,
                 "do not echo the prompt before the completion");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError & e) {
        return app.exit(e);
    }
    try {
        return run(o, argv[0]);
    } catch (const cli_error & e) {
        std::fprintf(stderr, "smol-cli: %s\n", e.what());
    } catch (const std::exception & e) {
        std::fprintf(stderr, "smol-cli: unexpected error: %s\n", e.what());
    }
    return 1;
}
