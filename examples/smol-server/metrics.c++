// metrics.c++ - smol-server's /metrics page (metrics.h).

#include "metrics.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace server {

histogram::histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void histogram::observe(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t i =
        size_t(std::lower_bound(bounds_.begin(), bounds_.end(), seconds) - bounds_.begin());
    ++counts_[i];
    sum_ += seconds;
    ++n_;
}

std::string histogram::text(const char * name, const char * help) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out =
        std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " histogram\n";
    uint64_t cum = 0;
    char line[256];
    for (size_t i = 0; i <= bounds_.size(); ++i) {
        cum += counts_[i];
        if (i < bounds_.size()) {
            std::snprintf(line, sizeof line, "%s_bucket{le=\"%g\"} %llu\n", name, bounds_[i],
                          static_cast<unsigned long long>(cum));
        } else {
            std::snprintf(line, sizeof line, "%s_bucket{le=\"+Inf\"} %llu\n", name,
                          static_cast<unsigned long long>(cum));
        }
        out += line;
    }
    std::snprintf(line, sizeof line, "%s_sum %.17g\n%s_count %llu\n", name, sum_, name,
                  static_cast<unsigned long long>(n_));
    return out + line;
}

std::string metrics_text(const smol_engine_stats & s, const server_metrics & m) {
    std::string out;
    auto put = [&](const char * name, const char * type, const char * help, double v) {
        char line[512];
        std::snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name,
                      type, name, v);
        out += line;
    };
    // A counter with one label: (label value, count) pairs.
    auto put_labelled = [&](const char * name, const char * help, const char * label,
                            std::initializer_list<std::pair<const char *, double>> values) {
        out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n";
        for (const auto & [value, v] : values) {
            char line[256];
            std::snprintf(line, sizeof line, "%s{%s=\"%s\"} %.17g\n", name, label, value, v);
            out += line;
        }
    };
    put("smol_requests_running", "gauge", "Requests generating now.", s.n_running);
    put("smol_requests_queued", "gauge", "Requests waiting for a slot.", s.n_queued);
    put("smol_requests_finished_total", "counter", "Requests the engine finished.",
        double(s.n_finished));
    put("smol_tokens_in_total", "counter", "Prompt tokens of admitted requests.",
        double(s.n_prompt_tokens));
    put("smol_prefill_tokens_total", "counter", "Prompt tokens computed (not cached).",
        double(s.n_prefill_tokens));
    put("smol_tokens_out_total", "counter", "Tokens generated.", double(s.n_generated_tokens));
    put("smol_prefix_cache_hit_tokens_total", "counter", "Prompt tokens reused from the cache.",
        double(s.n_prefix_hit_tokens));
    put("smol_prefix_cache_hit_requests_total", "counter", "Requests that reused a cached prefix.",
        double(s.n_prefix_hit_requests));
    put("smol_prefix_cache_hit_ratio", "gauge", "Reused prompt tokens over all prompt tokens.",
        s.prefix_hit_rate);
    put("smol_prefix_cache_blocks", "gauge", "Blocks in the prefix cache.", s.n_prefix_blocks);
    put("smol_preemptions_total", "counter", "Requests preempted for lack of KV cells.",
        double(s.n_preempted));
    put("smol_kv_cells", "gauge", "KV cells of the context.", s.n_cells);
    put("smol_kv_cells_used", "gauge", "KV cells holding tokens.", s.n_cells_used);
    put("smol_kv_bytes_resident", "gauge", "Bytes of the KV cells in use, in resident heads.",
        double(s.kv_bytes_resident));
    put("smol_kv_bytes_offloaded", "gauge",
        "Bytes of the KV cells in use, in heads offloaded to host memory.",
        double(s.kv_bytes_offloaded));
    put("smol_engine_steps_total", "counter", "Batches run.", double(s.n_steps));
    put_labelled("smol_engine_seconds_total",
                 "The engine's steps' time by phase: plan (requests in, the batch, "
                 "speculation's guesses), decode (the model's step), draw, emit (events to the "
                 "requests).",
                 "phase",
                 {{"plan", s.t_plan_s},
                  {"decode", s.t_decode_s},
                  {"draw", s.t_draw_s},
                  {"emit", s.t_emit_s}});
    put("smol_spec_drafted_tokens_total", "counter",
        "Guessed tokens verified by speculative decoding.", double(s.n_spec_drafted));
    put("smol_spec_accepted_tokens_total", "counter", "Of those, tokens kept.",
        double(s.n_spec_accepted));
    put("smol_spec_verifies_total", "counter",
        "Request steps that verified at least one guessed token.", double(s.n_spec_verifies));
    put("smol_http_errors_total", "counter", "Requests answered with an error.",
        double(m.http_errors.load()));
    put("smol_client_disconnects_total", "counter", "Requests whose client went away.",
        double(m.disconnects.load()));
    put_labelled("smol_requests_by_finish_total", "Requests the engine ended, by how.", "reason",
                 {{"stop", double(m.finished[1].load())},
                  {"length", double(m.finished[2].load())},
                  {"cancelled", double(m.finished[3].load())},
                  {"error", double(m.finished[4].load())}});
    put("smol_constrained_requests_total", "counter",
        "Requests whose output follows a grammar (response_format, grammar, tool_choice).",
        double(m.constrained.load()));
    put("smol_tool_call_replies_total", "counter", "Replies read as tool calls.",
        double(m.tool_call_replies.load()));
    put("smol_tool_calls_total", "counter", "Tool calls in those replies.",
        double(m.tool_calls.load()));
    out += m.first_token.text("smol_time_to_first_token_seconds",
                              "From submission to the first generated token.");
    out += m.per_token.text("smol_time_per_output_token_seconds",
                            "A request's time per generated token after its first.");
    out += m.queue_wait.text("smol_queue_wait_seconds", "From submission to a sequence slot.");
    return out;
}

} // namespace server
