// smol-bench.c++ - measures prompt processing (ppN) and token generation
// (tgN) speed the way llama.cpp's llama-bench does, so the two tables can be
// read side by side: pp decodes N random tokens in n_batch chunks, tg decodes
// N single tokens after an empty cache; each test is warmed up once, then
// repeated -r times and reported as mean +- standard deviation of tokens/s.
// Prints a markdown table (rows as they finish) or a JSON array (-o json),
// and either of them on stderr too (-oe), as llama-bench does.
//
// Two GPU modes beyond llama-bench's: --batched M,... measures batch decode
// throughput (M sequences, each given a short prompt, then decoding one
// token per step together: M tokens a step) and names the matmul kernel
// families that step used; --autotune times every matmul kernel candidate
// on the models' shapes and writes the device's autotune table. --engine
// M,... runs M requests at once through the serving engine (smol-server's,
// without HTTP), so the three rows show what batching, the engine and the
// server each cost.
// Structured output: --sample makes tg and --batched draw each next token
// from the logits (temperature 1, --top-k; a sampler a sequence) instead of
// taking a random one, and --json-schema
// FILE (with --sample) constrains those draws to the schema's grammar, as
// smol-server's response_format does; a document that completes starts
// again (in --engine rows its request ends). The two rows side by side
// give the grammar's cost; --engine rows draw as the engine does, a
// step's draws on several threads.
// Long contexts: -d N fills N tokens of context first (outside the test's
// timing; the row's note gives the fill's own time), so tgN measures
// decoding at that depth; with --gpu-mem and --kv-offload the KV
// cache is placed per head, and each row also gives the plan (resident
// heads, head group), the device's peak memory and the floor of a decode
// step: (weights + resident KV read) / --device-bw + offloaded KV read /
// --link-bw.
// Speculation: --lookup or --md FILE (a draft model) makes tgN generate N
// tokens greedily through smol_spec from a bos prompt (up to --draft-max
// guesses a target pass), the spec made and warmed up before the timed
// runs as a context is; the row's name gives the share of guesses kept and
// the tokens a target pass gave.

#include "../device-option.h"
#include "../kv-type-option.h"
#include "../streaming-heads-option.h"
#include "smol.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

struct bench_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

void check(smol_status status, const std::string & what) {
    if (status != SMOL_OK) throw bench_error(what + ": " + smol_last_error());
}

struct model_free {
    void operator()(smol_model * m) const { smol_model_free(m); }
};
struct context_free {
    void operator()(smol_context * c) const { smol_context_free(c); }
};
using model_ptr = std::unique_ptr<smol_model, model_free>;
using context_ptr = std::unique_ptr<smol_context, context_free>;

struct options {
    std::vector<std::string> models;
    std::vector<int> n_prompt{512};
    std::vector<int> n_gen{128};
    std::vector<int> n_batch{0}; // 0: the context's default
    std::vector<int> n_threads;
    int reps = 5;
    std::string output = "md";
    std::string output_err = "none";
    device_options devices;
    std::vector<int> depth{0};
    bool sample = false;
    int top_k = 0;           // with sample
    std::string json_schema; // a file; with sample
    std::string kv_offload = "auto";
    std::string kv_attend = "auto";
    int head_group = 0;
    smol_type kv_type = SMOL_TYPE_F16;
    streaming_heads_option streaming;
    std::string attn = "auto"; // --attn: the GPU's attention kernel
    double device_bw = 4200;   // GB/s: a device-to-device copy measured on the H200
    double link_bw = 53;       // GB/s: pinned host-to-device copies measured on the H200 host
    bool json = false;
    bool swa_full = false;
    bool progress = false;
    std::vector<int> batched;  // --batched: sequences decoding together
    int batched_prompt = 16;   // prompt tokens per sequence before they decode
    int batched_gen = 128;     // timed steps of a batched test
    std::vector<int> engine;   // --engine: requests generating together through the engine
    int engine_ctx = 8192;     // --engine-ctx: the engine's KV cells
    int event_logits = 0;      // --event-logits: requests with logits in events (-1: all)
    bool prefix_cache = false; // --prefix-cache: the engine keeps finished requests' text
    bool autotune = false;     // --autotune: write the matmul kernel table and stop
    std::string autotune_file; // where (empty: the device's default file)
    bool lookup = false;       // --lookup: tg speculates by n-gram lookup
    std::string draft;         // --md: tg speculates with this draft model
    int draft_max = 8;
    smol_model * draft_model = nullptr; // loaded from draft
};

// The attention kernel --attn names (checked by the parser).
smol_attn_kernel attn_kernel_of(const std::string & name) {
    if (name == "decode") return SMOL_ATTN_DECODE;
    if (name == "decode-warps") return SMOL_ATTN_DECODE_WARPS;
    if (name == "flash") return SMOL_ATTN_FLASH;
    if (name == "classic") return SMOL_ATTN_CLASSIC;
    return SMOL_ATTN_AUTO;
}

// How a context placed its KV, for the rows that ask for it.
struct placement_info {
    bool shown = false;
    uint64_t gpu_mem = 0;
    std::string kv_offload;
    smol_memory_info mem{};
    std::string devices; // a line per device, over several
    uint32_t n_ctx = 0;
    double floor_ms = 0; // per decoded token at the test's depth
};

// One row of the table: a model, a configuration and one test.
struct result {
    std::string model_file;
    std::string model_label;
    std::string type;
    std::string device;
    uint64_t size = 0;
    int64_t n_params = 0;
    int n_batch = 0;
    int n_threads = 0;
    int n_prompt = 0;
    int n_gen = 0;
    int n_seq = 0; // > 0: a batched decode test of n_seq sequences
    int n_depth = 0;
    double fill_ns = 0; // filling the depth's context (once, before the test)
    placement_info place;
    std::string test_time;
    std::vector<double> samples_ns;
    std::string kernels; // the matmul kernels of the last decode (GPU)
    std::string mode;    // " sampled", " json-schema"
    std::string note;    // after the name: the engine's time by phase

    int n_tokens() const { return n_seq > 0 ? n_seq * n_gen : n_prompt + n_gen; }
    std::string test_name() const {
        if (n_seq > 0)
            return "tg" + std::to_string(n_gen) + mode + " M=" + std::to_string(n_seq) + note;
        return (n_prompt > 0 ? "pp" + std::to_string(n_prompt) : "tg" + std::to_string(n_gen)) +
               (n_depth > 0 ? " @ d" + std::to_string(n_depth) : "") +
               (n_gen > 0 ? mode : std::string());
    }
    // The kernel families used, such as "gemv" or "smallbatch+cublas".
    std::string families() const {
        std::string out;
        size_t at = 0;
        while ((at = kernels.find(": ", at)) != std::string::npos) {
            at += 2;
            const std::string f = kernels.substr(at, kernels.find_first_of(" \n", at) - at);
            if (("+" + out + "+").find("+" + f + "+") == std::string::npos)
                out += (out.empty() ? "" : "+") + f;
        }
        return out.empty() ? "-" : out;
    }
    std::vector<double> samples_ts() const {
        std::vector<double> ts;
        for (double ns : samples_ns) ts.push_back(1e9 * n_tokens() / ns);
        return ts;
    }
};

double mean(const std::vector<double> & v) {
    return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
}

// The sample standard deviation, as llama-bench reports it.
double stddev(const std::vector<double> & v) {
    if (v.size() < 2) return 0.0;
    const double m = mean(v);
    double sq = 0;
    for (double x : v) sq += (x - m) * (x - m);
    return std::sqrt(sq / double(v.size() - 1));
}

// --- the two tests ------------------------------------------------------------

struct bench_state {
    smol_context * ctx;
    smol_batch batch;
    int32_t capacity;
    int32_t n_vocab;
    std::mt19937 rng{1234};
    const smol_model * model = nullptr;
    // With --sample, a sampler a sequence: generation feeds each sequence
    // the token its sampler drew from its logits.
    std::vector<smol_sampler *> samplers{};
    std::vector<smol_token> next{};
    double sample_ns = 0; // this thread's CPU time in the samplers
    int64_t n_sampled = 0;

    ~bench_state() {
        smol_batch_free(&batch);
        for (smol_sampler * s : samplers) smol_sampler_free(s);
    }
    smol_token random_token() {
        return std::uniform_int_distribution<smol_token>(0, n_vocab - 1)(rng);
    }
    // Generation's next token for sequence seq.
    smol_token token_for(int seq) { return samplers.empty() ? random_token() : next[size_t(seq)]; }
    // Every sampler's document starts again.
    void restart() {
        for (size_t i = 0; i < samplers.size(); ++i) {
            smol_sampler_reset(samplers[i]);
            next[i] = std::max<smol_token>(0, smol_token_bos(model));
        }
    }
    // Draws the next token of sequence seq from the logits of batch row i.
    void sample(int seq, int32_t i) {
        if (samplers.empty()) return;
        const float * logits = smol_get_logits(ctx, i);
        // Thread CPU time: what the sampler costs, apart from other
        // programs' load on the machine.
        timespec c0, c1;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
        smol_sampler * s = samplers[size_t(seq)];
        smol_token & t = next[size_t(seq)];
        t = smol_sampler_sample(s, logits, n_vocab);
        if (t < 0 || smol_token_is_eog(model, t)) {
            // The document is complete: the next one starts.
            smol_sampler_reset(s);
            t = std::max<smol_token>(0, smol_token_bos(model));
        } else {
            smol_sampler_accept(s, t);
        }
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
        sample_ns += double(c1.tv_sec - c0.tv_sec) * 1e9 + double(c1.tv_nsec - c0.tv_nsec);
        ++n_sampled;
    }
    void report(const std::string & test) const {
        if (n_sampled > 0)
            std::fprintf(stderr,
                         "smol-bench: %s: the sampler took %.1f us a token (thread CPU time)\n",
                         test.c_str(), sample_ns / double(n_sampled) / 1e3);
    }
};

// --sample's draw: temperature 1, --top-k, nothing else.
smol_sampler_params sample_params(const options & o) {
    smol_sampler_params sp = smol_sampler_default_params();
    sp.temperature = 1.0f;
    sp.top_k = o.top_k;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    return sp;
}

// --json-schema as GBNF (empty without one).
std::string schema_grammar(const options & o) {
    if (o.json_schema.empty()) return "";
    std::ifstream f(o.json_schema);
    const std::string schema((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (!f) throw std::runtime_error("cannot read " + o.json_schema);
    std::string gbnf;
    size_t len = 0;
    smol_status st = smol_json_schema_to_grammar(schema.c_str(), nullptr, 0, &len);
    if (st == SMOL_ERR_BUFFER_TOO_SMALL) {
        gbnf.resize(len);
        st = smol_json_schema_to_grammar(schema.c_str(), &gbnf[0], len, &len);
    }
    check(st, o.json_schema);
    return gbnf;
}

// The row's mode for a sampled test.
std::string sample_mode(const options & o, bool grammar) {
    std::string mode = grammar ? " json-schema" : " sampled";
    if (o.top_k > 0) mode += " k" + std::to_string(o.top_k);
    return mode;
}

// With --sample, n samplers drawing at temperature 1 with --top-k (and
// constrained by --json-schema); mode names them in the row.
void make_samplers(bench_state & b, const options & o, int n, std::string & mode) {
    if (!o.sample) return;
    smol_sampler_params sp = sample_params(o);
    const std::string gbnf = schema_grammar(o);
    for (int i = 0; i < n; ++i) {
        sp.seed = uint64_t(42 + i);
        smol_sampler * s = nullptr;
        check(smol_sampler_create(&sp, &s), "sampler");
        b.samplers.push_back(s);
        if (!gbnf.empty()) check(smol_sampler_set_grammar(s, b.model, gbnf.c_str()), o.json_schema);
    }
    b.next.assign(size_t(n), 0);
    b.restart();
    mode = sample_mode(o, !gbnf.empty());
}

// Prompt processing: n_prompt fresh random tokens in chunks of the batch
// size, keeping the last token's logits as a generation would.
// With progress, a long prompt reports how far it got about every ten seconds.
void test_prompt(bench_state & b, int n_prompt, int pos0 = 0, bool progress = false) {
    const auto t0 = std::chrono::steady_clock::now();
    auto shown = t0;
    for (int done = 0; done < n_prompt;) {
        const int n = std::min(n_prompt - done, b.capacity);
        b.batch.n_tokens = 0;
        for (int i = 0; i < n; i++)
            smol_batch_add(&b.batch, b.capacity, b.random_token(), pos0 + done + i, 0,
                           done + i == n_prompt - 1);
        check(smol_decode(b.ctx, &b.batch), "decode");
        done += n;
        const auto t = std::chrono::steady_clock::now();
        if (progress && t - shown > std::chrono::seconds(10) && done < n_prompt) {
            const double s = std::chrono::duration<double>(t - t0).count();
            std::fprintf(stderr, "smol-bench: %d of %d prompt tokens in %.0f s (%.0f tokens/s)\n",
                         done, n_prompt, s, double(done) / s);
            shown = t;
        }
    }
    // A device backend may still be running; reading the logits waits for it.
    smol_get_logits(b.ctx, -1);
}

// Token generation: n_gen decodes of one token each, as sampling would do.
void test_gen(bench_state & b, int n_gen, int pos0 = 0) {
    for (int i = 0; i < n_gen; i++) {
        b.batch.n_tokens = 0;
        smol_batch_add(&b.batch, b.capacity, b.token_for(0), pos0 + i, 0, true);
        check(smol_decode(b.ctx, &b.batch), "decode");
        if (b.samplers.empty()) smol_get_logits(b.ctx, -1);
        b.sample(0, -1);
    }
}

// Speculative generation: the spec starts over from a one-token prompt and
// generates n_gen tokens; adds this run's figures to the totals.
void test_spec(bench_state & b, smol_spec * spec, int n_gen, smol_spec_stats * total) {
    const smol_spec_stats before = smol_spec_get_stats(spec);
    const smol_token bos = std::max<smol_token>(0, smol_token_bos(b.model));
    check(smol_spec_prompt(spec, &bos, 1), "speculation's prompt");
    std::vector<smol_token> out(static_cast<size_t>(n_gen));
    for (int done = 0; done < n_gen;) {
        int32_t n = 0;
        check(smol_spec_next(spec, out.data(), n_gen - done, &n), "speculation");
        done += n;
    }
    if (!total) return;
    const smol_spec_stats st = smol_spec_get_stats(spec);
    total->n_steps += st.n_steps - before.n_steps;
    total->n_drafted += st.n_drafted - before.n_drafted;
    total->n_accepted += st.n_accepted - before.n_accepted;
    total->n_tokens += st.n_tokens - before.n_tokens;
}

std::string now_iso8601() {
    const std::time_t t = std::time(nullptr);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    return buf;
}

std::string kernels_of(smol_context * ctx);

// A row for a test of the model in file, before it runs.
result new_result(const std::string & file, const smol_model_info & info,
                  const std::string & device, int n_threads, int n_prompt, int n_gen) {
    result r;
    r.model_file = file;
    r.model_label = std::filesystem::path(file).stem().string();
    const char * type = smol_type_name(info.ftype);
    r.type = type ? type : "?";
    r.size = info.n_bytes;
    r.n_params = info.n_params;
    r.device = device.empty() ? "cpu" : device;
    r.n_threads = n_threads;
    r.n_prompt = n_prompt;
    r.n_gen = n_gen;
    r.test_time = now_iso8601();
    return r;
}

result run_test(smol_model * model, const smol_model_info & info, const std::string & file,
                const options & o, int n_batch, int n_threads, int n_prompt, int n_gen,
                int n_depth) {
    result r = new_result(file, info, o.devices.device, n_threads, n_prompt, n_gen);
    r.n_batch = n_batch;
    r.n_depth = n_depth;

    const bool spec = n_gen > 0 && n_prompt == 0 && (o.lookup || o.draft_model);
    if (spec && n_depth > 0)
        throw bench_error("--lookup and --md generate from an empty context: leave out -d");
    smol_context_params cparams = smol_context_default_params();
    // Speculation: the bos prompt and the last pass's guesses take room too.
    cparams.n_ctx = uint32_t(n_depth + n_prompt + n_gen + (spec ? 1 + o.draft_max : 0));
    cparams.n_batch = uint32_t(n_batch);
    cparams.n_threads = n_threads;
    if (std::string err; !o.devices.apply(cparams, err)) throw bench_error(err);
    cparams.kv_offload = o.kv_offload == "none"  ? SMOL_KV_OFFLOAD_NONE
                         : o.kv_offload == "all" ? SMOL_KV_OFFLOAD_ALL
                                                 : SMOL_KV_OFFLOAD_AUTO;
    cparams.kv_attend = o.kv_attend == "device" ? SMOL_KV_ATTEND_DEVICE
                        : o.kv_attend == "host" ? SMOL_KV_ATTEND_HOST
                                                : SMOL_KV_ATTEND_AUTO;
    cparams.head_group = o.head_group;
    cparams.kv_type = o.kv_type;
    cparams.attn = attn_kernel_of(o.attn);
    cparams.swa_full = o.swa_full;
    if (std::string err; !o.streaming.apply(model, cparams, err)) throw std::runtime_error(err);
    smol_context * raw = nullptr;
    check(smol_context_create(model, &cparams, &raw), "cannot create a context for " + file);
    context_ptr ctx(raw);
    const int reps = o.reps;
    const bool progress = o.progress;

    // smol caps n_batch at n_ctx: chunk by what the context takes.
    const int32_t capacity = int32_t(smol_context_n_batch(ctx.get()));
    r.n_batch = capacity;
    bench_state b{ctx.get(), smol_batch_init(capacity), capacity, info.n_vocab};
    b.model = model;
    make_samplers(b, o, 1, r.mode);

    // The warm-up brings weights into the caches and wakes the threads; as in
    // llama-bench, tg warms up with a single token.
    // The depth is filled once, untimed; each repetition then drops what the
    // one before added after it.
    smol_kv_seq_rm(b.ctx, -1, 0, -1);
    if (n_depth > 0) {
        if (progress) std::fprintf(stderr, "smol-bench: filling %d tokens of context\n", n_depth);
        const auto t0 = std::chrono::steady_clock::now();
        test_prompt(b, n_depth, 0, progress);
        r.fill_ns =
            std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    }
    if (n_prompt > 0) test_prompt(b, n_prompt, n_depth);
    // Speculation: the spec (and a draft model's context) is made once; an
    // untimed run warms both contexts up as the timed ones will run.
    std::unique_ptr<smol_spec, void (*)(smol_spec *)> speculator(nullptr, smol_spec_free);
    if (spec) {
        smol_spec_params sp = smol_spec_default_params();
        sp.draft_max = o.draft_max;
        sp.draft_model = o.draft_model;
        smol_spec * raw_spec = nullptr;
        check(smol_spec_create(b.ctx, &sp, &raw_spec), "speculation");
        speculator.reset(raw_spec);
        test_spec(b, speculator.get(), n_gen, nullptr);
    } else if (n_gen > 0) {
        test_gen(b, 1, n_depth);
    }
    smol_spec_stats spec_total{};
    if (spec) r.mode = o.lookup ? " lookup" : " draft";
    for (int rep = 0; rep < reps; rep++) {
        if (progress)
            std::fprintf(stderr, "smol-bench: %s %s t=%d rep %d/%d\n", r.model_label.c_str(),
                         r.test_name().c_str(), n_threads, rep + 1, reps);
        smol_kv_seq_rm(b.ctx, 0, n_depth, -1);
        b.restart();
        const auto t0 = std::chrono::steady_clock::now();
        if (n_prompt > 0) test_prompt(b, n_prompt, n_depth);
        if (spec) {
            test_spec(b, speculator.get(), n_gen, &spec_total);
        } else if (n_gen > 0) {
            test_gen(b, n_gen, n_depth);
        }
        const auto t1 = std::chrono::steady_clock::now();
        r.samples_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
    }
    if (spec && spec_total.n_steps > 0) {
        char note[96];
        std::snprintf(note, sizeof note, " (%.0f%% kept, %.2f tok/pass)",
                      spec_total.n_drafted > 0
                          ? 100.0 * double(spec_total.n_accepted) / double(spec_total.n_drafted)
                          : 0.0,
                      double(spec_total.n_tokens) / double(spec_total.n_steps));
        r.mode += note;
    }
    b.report(r.test_name());
    r.place.shown = n_depth > 0 || !o.devices.gpu_mem.empty() || o.kv_offload != "auto" ||
                    o.kv_type != SMOL_TYPE_F16 || smol_context_n_devices(ctx.get()) > 1;
    r.place.kv_offload = o.kv_offload;
    r.place.n_ctx = smol_context_n_ctx(ctx.get());
    smol_context_memory(ctx.get(), &r.place.mem);
    r.place.gpu_mem = r.place.mem.budget;
    r.place.devices = device_lines(ctx.get());
    // A decode step reads every weight and the KV of the cells in use: the
    // resident part at the device's bandwidth, the rest over the link or,
    // for the heads attended on the host, at the host's measured speed, the
    // two side by side.
    const smol_memory_info & mi = r.place.mem;
    const double used =
        double(n_depth + n_prompt + n_gen / 2) / double(std::max(1u, r.place.n_ctx));
    // Split: each way at its speed while the other runs.
    const int n_off = mi.n_heads - mi.n_heads_resident;
    const double host_share = n_off > 0 ? double(mi.n_heads_host) / double(n_off) : 0.0;
    const double host_kv = double(mi.host_kv) * used;
    double offloaded_s = host_kv / (o.link_bw * 1e9);
    if (host_share >= 1 && mi.host_rate > 0) {
        offloaded_s = host_kv / mi.host_rate;
    } else if (host_share > 0 && mi.host_rate_shared > 0 && mi.link_rate_shared > 0) {
        offloaded_s = std::max(host_kv * (1 - host_share) / mi.link_rate_shared,
                               host_kv * host_share / mi.host_rate_shared);
    }
    r.place.floor_ms =
        1e3 * ((double(mi.device_weights) + double(mi.device_kv) * used) / (o.device_bw * 1e9) +
               offloaded_s);
    r.kernels = kernels_of(ctx.get());
    return r;
}

// Batched decode: n_seq sequences get n_prompt tokens each (in as few
// decodes as the batch allows), then n_gen steps decode one token of every
// sequence together. Only the steps are timed.
void batched_prompt(bench_state & b, int n_seq, int n_prompt) {
    int seq = 0, pos = 0;
    while (seq < n_seq) {
        b.batch.n_tokens = 0;
        while (seq < n_seq && b.batch.n_tokens < b.capacity) {
            smol_batch_add(&b.batch, b.capacity, b.random_token(), pos, seq, pos == n_prompt - 1);
            if (++pos == n_prompt) {
                pos = 0;
                ++seq;
            }
        }
        check(smol_decode(b.ctx, &b.batch), "decode");
    }
    smol_get_logits(b.ctx, -1);
}

void batched_steps(bench_state & b, int n_seq, int first_pos, int n_steps) {
    for (int i = 0; i < n_steps; i++) {
        b.batch.n_tokens = 0;
        for (int s = 0; s < n_seq; s++)
            smol_batch_add(&b.batch, b.capacity, b.token_for(s), first_pos + i, s, true);
        check(smol_decode(b.ctx, &b.batch), "decode");
        if (b.samplers.empty()) smol_get_logits(b.ctx, -1);
        for (int s = 0; s < n_seq; s++) b.sample(s, s);
    }
}

std::string kernels_of(smol_context * ctx) {
    size_t n = 0;
    smol_context_matmul_kernels(ctx, nullptr, 0, &n);
    std::string out(n + 1, '\0');
    if (smol_context_matmul_kernels(ctx, out.data(), out.size(), &n) != SMOL_OK) return "";
    out.resize(n);
    return out;
}

result run_batched(smol_model * model, const smol_model_info & info, const std::string & file,
                   const options & o, int n_threads, int n_seq) {
    const int n_prompt = o.batched_prompt, n_gen = o.batched_gen, reps = o.reps;
    result r = new_result(file, info, o.devices.device, n_threads, n_prompt, n_gen);
    r.n_seq = n_seq;

    smol_context_params cparams = smol_context_default_params();
    cparams.n_ctx = uint32_t(n_seq * (n_prompt + n_gen + 3));
    cparams.n_batch = uint32_t(std::max(n_seq, 512));
    cparams.n_seq_max = uint32_t(n_seq);
    cparams.n_threads = n_threads;
    if (std::string err; !o.devices.apply(cparams, err)) throw bench_error(err);
    cparams.attn = attn_kernel_of(o.attn);
    smol_context * raw = nullptr;
    check(smol_context_create(model, &cparams, &raw), "cannot create a context for " + file);
    context_ptr ctx(raw);
    const int32_t capacity = int32_t(smol_context_n_batch(ctx.get()));
    r.n_batch = capacity;
    bench_state b{ctx.get(), smol_batch_init(capacity), capacity, info.n_vocab};
    b.model = model;
    make_samplers(b, o, n_seq, r.mode);
    for (int rep = -1; rep < reps; rep++) { // rep -1 warms up
        if (o.progress && rep >= 0)
            std::fprintf(stderr, "smol-bench: %s %s rep %d/%d\n", r.model_label.c_str(),
                         r.test_name().c_str(), rep + 1, reps);
        smol_kv_seq_rm(b.ctx, -1, 0, -1);
        b.restart();
        batched_prompt(b, n_seq, n_prompt);
        batched_steps(b, n_seq, n_prompt, 2); // the step's graph is captured on its second run
        if (rep < 0) continue;
        const auto t0 = std::chrono::steady_clock::now();
        batched_steps(b, n_seq, n_prompt + 2, n_gen);
        const auto t1 = std::chrono::steady_clock::now();
        r.samples_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
    }
    b.report(r.test_name());
    r.kernels = kernels_of(ctx.get());
    return r;
}

// Generation through the serving engine (smol_engine, as smol-server runs
// it, stepped on this thread; no HTTP): n_req requests of --batched-prompt
// random tokens submitted together, each generating --batched-gen tokens
// greedily, each step keeping only the top tokens as smol-server's requests
// without logprobs do (--event-logits: the logits, of every request or of
// the first N, as requests with logprobs among others). Timed from the step
// that gave every request its first token to the last one, so the row
// reads beside --batched M's and smol-server's.
struct engine_count {
    int64_t n_tokens = 0; // tokens generated by all requests
    int n_done = 0;
};

bool engine_counted(const smol_engine_event * ev, void * user) {
    auto * c = static_cast<engine_count *>(user);
    if (ev->token >= 0) ++c->n_tokens;
    if (ev->finish != SMOL_FINISH_NONE) ++c->n_done;
    return true;
}

result run_engine(smol_model * model, const smol_model_info & info, const std::string & file,
                  const options & o, int n_threads, int n_req) {
    const int n_prompt = o.batched_prompt, n_gen = o.batched_gen;
    result r = new_result(file, info, o.devices.device, n_threads, n_prompt, n_gen);
    r.n_seq = n_req;
    const int n_logits = o.event_logits < 0 ? n_req : std::min(o.event_logits, n_req);
    r.mode = n_logits == n_req ? " engine, logits"
             : n_logits > 0    ? " engine, logits of " + std::to_string(n_logits)
                               : " engine";
    if (o.prefix_cache) r.mode += ", prefix cache";
    const std::string gbnf = o.sample ? schema_grammar(o) : "";
    if (o.sample) r.mode += sample_mode(o, !gbnf.empty());

    smol_engine_params ep = smol_engine_default_params();
    ep.context.n_ctx = uint32_t(std::max(o.engine_ctx, n_req * (n_prompt + n_gen + 1)));
    ep.context.n_batch = std::min<uint32_t>(512, ep.context.n_ctx);
    ep.context.n_seq_max = uint32_t(n_req);
    ep.context.n_threads = n_threads;
    if (std::string err; !o.devices.apply(ep.context, err)) throw bench_error(err);
    ep.context.attn = attn_kernel_of(o.attn);
    // Every prompt is new, so the cache finds nothing; kept on, it holds
    // the finished requests' text in cells beside the running ones', as
    // smol-server's does.
    ep.prefix_cache = o.prefix_cache;
    // The engine's line a request would fill the table's stream; warnings
    // and errors still show.
    smol_log_set(
        [](smol_log_level level, const char * text, void *) {
            if (level <= SMOL_LOG_WARN) std::fprintf(stderr, "smol: %s\n", text);
        },
        nullptr);
    smol_engine * raw = nullptr;
    check(smol_engine_create(model, &ep, &raw), "cannot create an engine for " + file);
    std::unique_ptr<smol_engine, void (*)(smol_engine *)> engine(raw, smol_engine_free);
    r.n_batch = int(ep.context.n_batch);
    std::mt19937 rng(1234);
    std::vector<smol_token> prompt(static_cast<size_t>(n_prompt));
    smol_engine_stats warm{};
    for (int rep = -1; rep < o.reps; rep++) { // rep -1 warms up
        if (rep == 0) warm = smol_engine_get_stats(engine.get());
        if (o.progress && rep >= 0)
            std::fprintf(stderr, "smol-bench: %s %s rep %d/%d\n", r.model_label.c_str(),
                         r.test_name().c_str(), rep + 1, o.reps);
        engine_count count;
        for (int i = 0; i < n_req; ++i) {
            for (smol_token & t : prompt)
                t = std::uniform_int_distribution<smol_token>(0, info.n_vocab - 1)(rng);
            smol_request_params rp = smol_request_default_params();
            rp.prompt = prompt.data();
            rp.n_prompt = n_prompt;
            rp.sampler.temperature = 0.0f;
            if (o.sample) {
                rp.sampler = sample_params(o);
                rp.sampler.seed = uint64_t(42 + i);
            }
            rp.max_tokens = n_gen;
            rp.ignore_eog = true;
            rp.skip_event_logits = i >= n_logits; // as smol-server without logprobs
            if (!gbnf.empty()) {
                // A request ends when its document does.
                rp.grammar = gbnf.c_str();
                rp.ignore_eog = false;
            }
            rp.on_event = engine_counted;
            rp.user_data = &count;
            smol_request_id id = 0;
            check(smol_engine_submit(engine.get(), &rp, &id), "engine request");
        }
        std::chrono::steady_clock::time_point t0;
        int64_t n_at_t0 = -1;
        int32_t n_active = 1;
        while (n_active > 0) {
            check(smol_engine_step(engine.get(), &n_active), "engine step");
            if (n_at_t0 < 0 && count.n_tokens >= n_req) {
                t0 = std::chrono::steady_clock::now();
                n_at_t0 = count.n_tokens;
            }
        }
        const auto t1 = std::chrono::steady_clock::now();
        if (rep < 0 || n_at_t0 < 0 || count.n_tokens <= n_at_t0) continue;
        // Scaled to the row's n_seq x n_gen tokens.
        const double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
        r.samples_ns.push_back(ns * double(n_req) * n_gen / double(count.n_tokens - n_at_t0));
    }
    // Where the timed repetitions' steps went, on the engine's own clock.
    const smol_engine_stats st = smol_engine_get_stats(engine.get());
    if (const int64_t steps = st.n_steps - warm.n_steps; steps > 0) {
        const double us = 1e6 / double(steps);
        char note[160];
        std::snprintf(note, sizeof note,
                      " (us a step: plan %.0f, decode %.0f, draw %.0f, emit %.0f)",
                      (st.t_plan_s - warm.t_plan_s) * us, (st.t_decode_s - warm.t_decode_s) * us,
                      (st.t_draw_s - warm.t_draw_s) * us, (st.t_emit_s - warm.t_emit_s) * us);
        r.note = note;
    }
    smol_log_set(nullptr, nullptr);
    return r;
}

// --- output -------------------------------------------------------------------

std::string format_size(uint64_t bytes) {
    char buf[32];
    if (bytes < (1ull << 30))
        std::snprintf(buf, sizeof buf, "%.2f MiB", double(bytes) / (1 << 20));
    else
        std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / (1 << 30));
    return buf;
}

std::string format_params(int64_t n) {
    char buf[32];
    if (n < 1000000000)
        std::snprintf(buf, sizeof buf, "%.2f M", double(n) / 1e6);
    else
        std::snprintf(buf, sizeof buf, "%.2f B", double(n) / 1e9);
    return buf;
}

struct markdown_table {
    std::FILE * out;
    bool show_batch;
    bool show_kernels; // a GPU run: the matmul kernel families of each test

    void header() const {
        std::fprintf(out, "| %-30s | %10s | %10s | %-6s | %7s |", "model", "size", "params", "type",
                     "threads");
        if (show_batch) std::fprintf(out, " %7s |", "n_batch");
        std::fprintf(out, " %12s | %20s |", "test", "t/s");
        if (show_kernels) std::fprintf(out, " %-24s |", "matmul kernels");
        std::fprintf(out, "\n| %s | %s | %s | %s | %s |", std::string(30, '-').c_str(),
                     "---------:", "---------:", "------", "------:");
        if (show_batch) std::fprintf(out, " %s |", "------:");
        std::fprintf(out, " %s | %s |", "-----------:", "-------------------:");
        if (show_kernels) std::fprintf(out, " %s |", std::string(24, '-').c_str());
        std::fprintf(out, "\n");
        std::fflush(out);
    }

    void row(const result & r) const {
        const std::vector<double> ts = r.samples_ts();
        char tps[64];
        std::snprintf(tps, sizeof tps, "%.2f ± %.2f", mean(ts), stddev(ts));
        std::fprintf(out, "| %-30s | %10s | %10s | %-6s | %7d |", r.model_label.c_str(),
                     format_size(r.size).c_str(), format_params(r.n_params).c_str(), r.type.c_str(),
                     r.n_threads);
        if (show_batch) std::fprintf(out, " %7d |", r.n_batch);
        // "±" is two bytes but one column: pad by hand to keep the table aligned.
        std::fprintf(out, " %12s | %21s |", r.test_name().c_str(), tps);
        if (show_kernels) std::fprintf(out, " %-24s |", r.families().c_str());
        std::fprintf(out, "\n");
        if (r.place.shown) placement_note(r);
        std::fflush(out);
    }

    // Under the row: where the KV lives, the device's peak and, for
    // generation, the floor of a step and how close the run came to it.
    void placement_note(const result & r) const {
        const smol_memory_info & m = r.place.mem;
        std::fprintf(
            out,
            "|   KV %s: %d of %d heads resident, %d attended on the host, G = %d, chunk %d, "
            "n_ctx %u; device peak %.1f MiB (budget %s), host KV %.1f MiB",
            smol_type_name(m.kv_type), m.n_heads_resident, m.n_heads, m.n_heads_host, m.head_group,
            m.chunk, r.place.n_ctx, double(m.device_peak) / 1048576.0,
            r.place.gpu_mem ? (std::to_string(r.place.gpu_mem >> 20) + " MiB").c_str() : "none",
            double(m.host_kv) / 1048576.0);
        if (m.link_rate > 0 && m.host_rate > 0) {
            std::fprintf(out,
                         "; measured link %.1f GB/s, host attention %.1f GB/s, both at once %.1f "
                         "+ %.1f GB/s",
                         m.link_rate / 1e9, m.host_rate / 1e9, m.link_rate_shared / 1e9,
                         m.host_rate_shared / 1e9);
        }
        if (r.n_depth > 0) {
            std::fprintf(out, "; depth filled in %.1f s (%.0f tokens/s)", r.fill_ns / 1e9,
                         1e9 * r.n_depth / r.fill_ns);
        }
        if (r.n_gen > 0) {
            const double ms = mean(r.samples_ns) / 1e6 / r.n_gen;
            std::fprintf(out, "; floor %.3f ms/token, measured %.3f (%.0f%% of the floor's speed)",
                         r.place.floor_ms, ms, 100.0 * r.place.floor_ms / ms);
        }
        std::fprintf(out, "\n");
        // Over several devices, each one's part, under the row as well.
        for (size_t a = 0; a < r.place.devices.size();) {
            const size_t b = r.place.devices.find('\n', a);
            std::fprintf(out, "| %s\n", r.place.devices.substr(a, b - a).c_str());
            a = b + 1;
        }
    }

    void footer() const {
        std::fprintf(out, "\nsmol %s, CPU kernels: %s\n", smol_version(), smol_cpu_kernels_name());
    }
};

std::string json_string(const std::string & s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += char(c);
        } else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        } else {
            out += char(c);
        }
    }
    return out + "\"";
}

std::string json_numbers(const std::vector<double> & v, int decimals) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); i++) {
        char buf[48];
        std::snprintf(buf, sizeof buf, "%.*f", decimals, v[i]);
        out += (i ? ", " : "") + std::string(buf);
    }
    return out + "]";
}

// Field names follow llama-bench's JSON so one script can read both.
void print_json(std::FILE * out, const std::vector<result> & results) {
    std::fprintf(out, "[\n");
    for (size_t i = 0; i < results.size(); i++) {
        const result & r = results[i];
        const std::vector<double> ts = r.samples_ts();
        std::fprintf(out, "  {\n");
        std::fprintf(out, "    \"engine\": \"smol\",\n");
        std::fprintf(out, "    \"smol_version\": %s,\n", json_string(smol_version()).c_str());
        std::fprintf(out, "    \"cpu_kernels\": %s,\n",
                     json_string(smol_cpu_kernels_name()).c_str());
        std::fprintf(out, "    \"model_filename\": %s,\n", json_string(r.model_file).c_str());
        std::fprintf(out, "    \"model_type\": %s,\n",
                     json_string(r.model_label + " " + r.type).c_str());
        std::fprintf(out, "    \"model_ftype\": %s,\n", json_string(r.type).c_str());
        std::fprintf(out, "    \"model_size\": %llu,\n", (unsigned long long)r.size);
        std::fprintf(out, "    \"model_n_params\": %lld,\n", (long long)r.n_params);
        std::fprintf(out, "    \"device\": %s,\n", json_string(r.device).c_str());
        std::fprintf(out, "    \"n_batch\": %d,\n", r.n_batch);
        std::fprintf(out, "    \"n_threads\": %d,\n", r.n_threads);
        std::fprintf(out, "    \"n_prompt\": %d,\n", r.n_prompt);
        std::fprintf(out, "    \"n_gen\": %d,\n", r.n_gen);
        std::fprintf(out, "    \"n_seq\": %d,\n", r.n_seq);
        std::fprintf(out, "    \"test\": %s,\n", json_string(r.test_name()).c_str());
        std::fprintf(out, "    \"matmul_kernels\": %s,\n", json_string(r.families()).c_str());
        std::fprintf(out, "    \"matmul_kernels_detail\": %s,\n", json_string(r.kernels).c_str());
        std::fprintf(out, "    \"n_depth\": %d,\n", r.n_depth);
        std::fprintf(out, "    \"depth_fill_ns\": %.0f,\n", r.fill_ns);
        std::fprintf(out, "    \"gpu_mem\": %llu,\n", (unsigned long long)r.place.gpu_mem);
        std::fprintf(out, "    \"heads_resident\": %d,\n", r.place.mem.n_heads_resident);
        std::fprintf(out, "    \"heads_host\": %d,\n", r.place.mem.n_heads_host);
        std::fprintf(out, "    \"heads\": %d,\n", r.place.mem.n_heads);
        std::fprintf(out, "    \"head_group\": %d,\n", r.place.mem.head_group);
        std::fprintf(out, "    \"kv_type\": %s,\n",
                     json_string(smol_type_name(r.place.mem.kv_type)).c_str());
        std::fprintf(out, "    \"device_peak\": %llu,\n",
                     (unsigned long long)r.place.mem.device_peak);
        std::fprintf(out, "    \"floor_ms_per_token\": %.6f,\n", r.place.floor_ms);
        std::fprintf(out, "    \"test_time\": %s,\n", json_string(r.test_time).c_str());
        std::fprintf(out, "    \"avg_ns\": %.0f,\n", mean(r.samples_ns));
        std::fprintf(out, "    \"stddev_ns\": %.0f,\n", stddev(r.samples_ns));
        std::fprintf(out, "    \"avg_ts\": %.6f,\n", mean(ts));
        std::fprintf(out, "    \"stddev_ts\": %.6f,\n", stddev(ts));
        std::fprintf(out, "    \"samples_ns\": %s,\n", json_numbers(r.samples_ns, 0).c_str());
        std::fprintf(out, "    \"samples_ts\": %s\n", json_numbers(ts, 6).c_str());
        std::fprintf(out, "  }%s\n", i + 1 < results.size() ? "," : "");
    }
    std::fprintf(out, "]\n");
}

// Writes results in one format to one stream: markdown rows as each test
// finishes, JSON once at the end (llama-bench's -o and -oe).
struct sink {
    std::FILE * out;
    std::string format; // "md", "json" or "none"
    markdown_table table;
};

int run(options & o) {
    if (o.json) o.output = "json";
    if (o.n_threads.empty()) o.n_threads = {int(std::max(1u, std::thread::hardware_concurrency()))};
    const bool show_kernels = !o.devices.device.empty() && o.devices.device != "cpu";
    const bool show_batch = o.n_batch.size() > 1 || o.n_batch[0] != 0 || show_kernels;
    const sink sinks[] = {{stdout, o.output, {stdout, show_batch, show_kernels}},
                          {stderr, o.output_err, {stderr, show_batch, show_kernels}}};
    if (o.autotune && !show_kernels)
        throw bench_error("--autotune tunes a GPU's matmul kernels: give --device cuda:N");
    for (const std::string & file : o.models) {
        std::error_code ec;
        if (!std::filesystem::is_regular_file(file, ec))
            throw bench_error("model file '" + file +
                              "' does not exist; run scripts/fetch-model.sh for the default "
                              "model, or check the path");
    }
    if (o.lookup && !o.draft.empty())
        throw bench_error("--lookup and --md: give one proposer for the speculative tg tests");
    if ((o.lookup || !o.draft.empty()) && o.sample)
        throw bench_error("--sample with --lookup or --md: speculative tg here is greedy");
    model_ptr draft;
    if (!o.draft.empty()) {
        smol_model * raw = nullptr;
        check(smol_model_load(o.draft.c_str(), nullptr, &raw), "--md: cannot load " + o.draft);
        draft.reset(raw);
        o.draft_model = raw;
    }
    if (o.autotune) {
        for (const std::string & file : o.models) {
            smol_model * raw = nullptr;
            check(smol_model_load(file.c_str(), nullptr, &raw), "cannot load " + file);
            model_ptr model(raw);
            std::fprintf(stderr, "smol-bench: autotuning the matmul kernels of %s on %s\n",
                         file.c_str(), o.devices.device.c_str());
            auto log = [](const char * line, void *) { std::fprintf(stderr, "  %s\n", line); };
            check(smol_autotune(model.get(), o.devices.device.c_str(), nullptr, 0,
                                o.autotune_file.empty() ? nullptr : o.autotune_file.c_str(), log,
                                nullptr),
                  "autotune of " + file);
        }
    }
    const bool any_test =
        std::any_of(o.n_prompt.begin(), o.n_prompt.end(), [](int n) { return n > 0; }) ||
        std::any_of(o.n_gen.begin(), o.n_gen.end(), [](int n) { return n > 0; }) ||
        !o.batched.empty() || !o.engine.empty();
    if (!any_test) return 0;
    std::vector<result> results;
    for (const sink & k : sinks)
        if (k.format == "md") k.table.header();
    for (const std::string & file : o.models) {
        smol_model_params mparams = smol_model_default_params();
        smol_model * raw = nullptr;
        check(smol_model_load(file.c_str(), &mparams, &raw), "cannot load " + file);
        model_ptr model(raw);
        smol_model_info info;
        smol_model_get_info(model.get(), &info);
        for (int n_batch : o.n_batch)
            for (int n_threads : o.n_threads) {
                std::vector<std::pair<int, int>> tests;
                for (int n : o.n_prompt)
                    if (n > 0) tests.emplace_back(n, 0);
                for (int n : o.n_gen)
                    if (n > 0) tests.emplace_back(0, n);
                for (int depth : o.depth)
                    for (auto [n_prompt, n_gen] : tests) {
                        result r = run_test(model.get(), info, file, o, n_batch, n_threads,
                                            n_prompt, n_gen, depth);
                        for (const sink & k : sinks)
                            if (k.format == "md") k.table.row(r);
                        results.push_back(std::move(r));
                    }
                for (int n_seq : o.batched) {
                    result r = run_batched(model.get(), info, file, o, n_threads, n_seq);
                    for (const sink & k : sinks)
                        if (k.format == "md") k.table.row(r);
                    results.push_back(std::move(r));
                }
                for (int n_req : o.engine) {
                    result r = run_engine(model.get(), info, file, o, n_threads, n_req);
                    for (const sink & k : sinks)
                        if (k.format == "md") k.table.row(r);
                    results.push_back(std::move(r));
                }
            }
    }
    for (const sink & k : sinks) {
        if (k.format == "md") k.table.footer();
        if (k.format == "json") print_json(k.out, results);
    }
    return 0;
}

} // namespace

int main(int argc, char ** argv) {
    options o;
    CLI::App app{"smol-bench: prompt processing and generation speed, like llama-bench.\n"
                 "Lists are comma separated (-p 128,512 -t 1,2); every combination is run.",
                 "smol-bench"};
    app.add_option("-m,--model", o.models, "GGUF model files")
        ->delimiter(',')
        ->default_str("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    app.add_option("-p,--n-prompt", o.n_prompt, "prompt lengths (ppN tests; 0: none)")
        ->delimiter(',')
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("-n,--n-gen", o.n_gen, "generation lengths (tgN tests; 0: none)")
        ->delimiter(',')
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("-b,--batch-size", o.n_batch,
                   "most tokens per decode (0: smol's default, 512 on the CPU, 4096 on a GPU; "
                   "at most the test's context)")
        ->delimiter(',')
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("-t,--threads", o.n_threads, "CPU threads (default: all cores)")
        ->delimiter(',')
        ->check(CLI::PositiveNumber);
    app.add_option("-r,--repetitions", o.reps, "repetitions of each test")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("-o,--output", o.output, "output format")
        ->capture_default_str()
        ->check(CLI::IsMember({"md", "json"}));
    app.add_option("--output-err", o.output_err, "output format printed to stderr (also -oe)")
        ->capture_default_str()
        ->check(CLI::IsMember({"none", "md", "json"}));
    app.add_flag("--json", o.json, "print a JSON array (same as -o json)");
    add_device_options(app, o.devices);
    app.add_option("-d,--n-depth", o.depth, "tokens of context filled before each test")
        ->delimiter(',')
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--kv-offload", o.kv_offload, "KV heads in host memory: auto, none, all")
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
    app.add_option("--attn", o.attn,
                   "the GPU's attention kernel for every batch: auto, decode, decode-warps, "
                   "flash or classic")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "decode", "decode-warps", "flash", "classic"}));
    app.add_flag("--swa-full", o.swa_full,
                 "sliding-window layers (Gemma 3's local ones) keep every position, not only "
                 "their window: more memory, rollbacks and prefix reuse of any length");
    app.add_option("--device-bw", o.device_bw, "device memory bandwidth in GB/s, for the floor")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--link-bw", o.link_bw, "host-to-device copy bandwidth in GB/s, for the floor")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_flag("--progress", o.progress, "report each repetition on stderr");
    app.add_flag("--sample", o.sample,
                 "tg, --batched and --engine draw each token from the logits (temperature 1), "
                 "a sampler a sequence, instead of a random one (or greedy)");
    app.add_option("--top-k", o.top_k, "with --sample: top-k (0: off, the default)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--json-schema", o.json_schema,
                   "with --sample: draws constrained to this JSON schema file's grammar");
    app.add_option("--batched", o.batched,
                   "batch decode tests: M sequences decoding one token each per step "
                   "(e.g. 1,8,32,128)")
        ->delimiter(',')
        ->check(CLI::PositiveNumber);
    app.add_option(
           "--engine", o.engine,
           "serving-engine tests: M requests generating together through smol_engine "
           "(as smol-server runs them, without HTTP), greedy or --sample, --batched-prompt and "
           "--batched-gen tokens each; a comma list")
        ->delimiter(',')
        ->check(CLI::Range(1, 127));
    app.add_option("--engine-ctx", o.engine_ctx,
                   "the engine's KV cells (at least what M requests need)")
        ->check(CLI::PositiveNumber);
    app.add_flag("--event-logits{-1}", o.event_logits,
                 "--engine requests' events carry their logits (as smol-server's with logprobs), "
                 "so greedy steps copy logit rows back, not only the top tokens; "
                 "--event-logits=N: the first N requests' only")
        ->check(CLI::Range(-1, 1 << 20));
    app.add_flag("--prefix-cache", o.prefix_cache,
                 "--engine rows keep the prefix cache on (smol-server's default): each "
                 "request's text stays in the cache beside those that follow");
    app.add_option("--batched-prompt", o.batched_prompt,
                   "prompt tokens of each sequence before a batched test")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--batched-gen", o.batched_gen, "timed steps of a batched test")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_flag("--lookup", o.lookup,
                 "tg generates greedily with speculation by n-gram lookup (smol_spec)");
    app.add_option("--md,--model-draft", o.draft,
                   "tg generates greedily with speculation by this draft model");
    app.add_option("--draft-max", o.draft_max, "with --lookup or --md: guesses per target pass")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_flag("--autotune", o.autotune,
                 "time every matmul kernel on the models' shapes and write the device's "
                 "autotune table (then run the tests asked for, if any)");
    app.add_option("--autotune-file", o.autotune_file,
                   "where --autotune writes (default: SMOL_AUTOTUNE_FILE, else "
                   "~/.cache/smol/autotune-<gpu>.txt)");
    // CLI11 takes only one letter after a single dash; llama-bench users
    // type -oe, so it is spelled out here.
    std::vector<char *> args(argv, argv + argc);
    std::string output_err = "--output-err";
    for (char *& a : args)
        if (std::string_view(a) == "-oe") a = output_err.data();
    try {
        app.parse(int(args.size()), args.data());
    } catch (const CLI::ParseError & e) {
        return app.exit(e);
    }
    if (o.models.empty()) o.models = {"models/SmolLM2-135M-Instruct.Q4_1.gguf"};
    try {
        return run(o);
    } catch (const std::exception & e) {
        std::fflush(stdout);
        std::fprintf(stderr, "smol-bench: %s\n", e.what());
    }
    return 1;
}
