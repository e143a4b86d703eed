// smol-server.c++ - an OpenAI-compatible HTTP server over smol's engine:
// POST /v1/chat/completions, /v1/completions and /v1/responses (streamed as
// server-sent events or not, with logprobs when asked), GET /v1/models and
// /v1/models/{id}, POST /v1/embeddings (in a context of their own),
// /tokenize and /detokenize, /health, Prometheus /metrics and a chat page
// at / (chat.html, compiled in). Requests run through one smol_engine
// (continuous batching, prefix cache) on its worker thread; each HTTP
// request waits on its own queue of tokens. Bad requests get a 4xx JSON
// error in OpenAI's shape, a full queue a 503, and a client that goes away
// has its request cancelled. Loopback by default; with API keys every
// route but /health and the page needs one, and listening beyond loopback
// needs keys (or --no-auth).

#include "../device-option.h"
#include "../kv-type-option.h"
#include "../streaming-heads-option.h"
#include "access.h"
#include "chat-page.h"
#include "metrics.h"
#include "request.h"
#include "smol.h"
#include "waker.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <functional>
#include <httplib.h>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace server;

namespace {

constexpr const char * default_model_name = "SmolLM2-135M-Instruct.Q4_1.gguf";

struct options {
    std::string host = "127.0.0.1";
    int port = 8080;
    std::string model;
    std::string alias;
    uint32_t n_ctx = 4096;
    uint32_t parallel = 4;
    uint32_t max_queue = 32;
    uint32_t queue_wait_ms = 1000;
    size_t max_body = 1 << 20;
    uint32_t max_connections = 1024;
    uint32_t chunk = 256;
    int threads = 0;
    bool no_prefix_cache = false;
    bool swa_full = false; // sliding-window layers keep every position
    int32_t window_reserve = 0;
    device_options devices;          // --device, --gpu-mem, --split, --tensor-split
    std::string kv_offload = "auto"; // KV heads in host memory: auto, none, all
    std::string kv_attend = "auto";  // offloaded heads: auto, device, host
    smol_type kv_type = SMOL_TYPE_F16;
    streaming_heads_option streaming;
    std::vector<std::string> api_keys;
    std::string api_key_file;
    bool no_auth = false;
    // Speculation: n-gram lookup or a draft model, draft_max guesses a step.
    bool lookup = false;
    std::string draft_model;
    int draft_max = 0; // 0: 8 when --lookup or --draft-model is given
};

// --- errors in OpenAI's shape --------------------------------------------------

// Messages can quote the request's own bytes (a JSON parser's "last read"),
// which need not be UTF-8: they go out with such bytes replaced, never as
// a failure to write the error itself.
void send_error(httplib::Response & res, const api_error & e) {
    res.status = e.status;
    res.set_content(error_body(e).dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
}

// --- the model and the engine --------------------------------------------------

struct server_state {
    smol_model * model = nullptr;
    smol_model * draft = nullptr; // --draft-model
    smol_engine * engine = nullptr;
    served_model served; // what requests are checked against
    std::chrono::milliseconds queue_wait{1000};
    std::time_t started = std::time(nullptr);
    std::atomic<uint64_t> next_id{1};
    server_metrics m;
    server::waker wake; // wakes the requests' threads for the engine
    // /v1/embeddings runs in a context of its own, made at its first
    // request, one request at a time.
    smol_context_params embd_params{};
    std::mutex embd_mu;
    smol_context * embd = nullptr;
};

std::string base64(const uint8_t * p, size_t n) {
    static const char * k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    for (size_t i = 0; i < n; i += 3) {
        const uint32_t v = uint32_t(p[i]) << 16 | (i + 1 < n ? uint32_t(p[i + 1]) << 8 : 0) |
                           (i + 2 < n ? uint32_t(p[i + 2]) : 0);
        out += k[(v >> 18) & 63];
        out += k[(v >> 12) & 63];
        out += i + 1 < n ? k[(v >> 6) & 63] : '=';
        out += i + 2 < n ? k[v & 63] : '=';
    }
    return out;
}

// Each input's final hidden states averaged over its tokens and scaled to
// length 1 (as OpenAI's and llama-server's embeddings are), in OpenAI's
// list shape.
json embed(server_state & st, const embed_request & r) {
    std::lock_guard<std::mutex> lock(st.embd_mu);
    if (!st.embd && smol_context_create(st.model, &st.embd_params, &st.embd) != SMOL_OK) {
        throw api_error{500,
                        std::string("cannot make the embeddings context: ") + smol_last_error(),
                        "server_error", "", ""};
    }
    smol_model_info info;
    smol_model_get_info(st.model, &info);
    const int32_t n_batch = int32_t(smol_context_n_batch(st.embd));
    smol_batch b = smol_batch_init(n_batch);
    json data = json::array();
    int64_t n_tokens = 0;
    for (size_t i = 0; i < r.inputs.size(); ++i) {
        const std::vector<smol_token> & ids = r.inputs[i];
        smol_kv_seq_rm(st.embd, -1, 0, -1);
        std::vector<double> sum(size_t(info.n_embd), 0.0);
        for (size_t j0 = 0; j0 < ids.size(); j0 += size_t(n_batch)) {
            b.n_tokens = 0;
            const size_t j1 = std::min(ids.size(), j0 + size_t(n_batch));
            for (size_t j = j0; j < j1; ++j)
                smol_batch_add(&b, n_batch, ids[j], smol_pos(j), 0, true);
            if (smol_decode(st.embd, &b) != SMOL_OK) {
                const std::string why = smol_last_error();
                smol_batch_free(&b);
                smol_kv_seq_rm(st.embd, -1, 0, -1);
                throw api_error{500, "embedding input " + std::to_string(i) + " failed: " + why,
                                "server_error", "", ""};
            }
            for (int32_t k = 0; k < b.n_tokens; ++k) {
                const float * e = smol_get_embeddings(st.embd, k);
                for (int32_t d = 0; e && d < info.n_embd; ++d) sum[size_t(d)] += double(e[d]);
            }
        }
        n_tokens += int64_t(ids.size());
        double norm = 0;
        for (double & v : sum) {
            v /= double(ids.size());
            norm += v * v;
        }
        norm = std::sqrt(norm);
        std::vector<float> v(sum.size());
        for (size_t d = 0; d < sum.size(); ++d) v[d] = float(norm > 0 ? sum[d] / norm : 0.0);
        json vec = r.base64 ? json(base64(reinterpret_cast<const uint8_t *>(v.data()),
                                          v.size() * sizeof(float)))
                            : json(v);
        data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", vec}});
    }
    smol_batch_free(&b);
    smol_kv_seq_rm(st.embd, -1, 0, -1);
    return json{{"object", "list"},
                {"data", data},
                {"model", st.served.id},
                {"usage", {{"prompt_tokens", n_tokens}, {"total_tokens", n_tokens}}}};
}

// A generated token's log-probability under the model's distribution (its
// raw logits), with the most likely alternatives, best first.
struct token_logprob {
    float logprob = 0;
    std::vector<std::pair<smol_token, float>> top;
};

token_logprob logprob_of(const float * logits, int32_t n_vocab, smol_token t, int32_t n_top) {
    const float mx = *std::max_element(logits, logits + n_vocab);
    double sum = 0;
    for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(double(logits[i]) - double(mx));
    const double log_z = double(mx) + std::log(sum);
    token_logprob r;
    r.logprob = float(double(logits[t]) - log_z);
    if (n_top > 0) {
        std::vector<int32_t> idx(static_cast<size_t>(n_vocab));
        std::iota(idx.begin(), idx.end(), 0);
        const auto k = std::min<size_t>(size_t(n_top), idx.size());
        std::partial_sort(idx.begin(), idx.begin() + long(k), idx.end(), [&](int32_t a, int32_t b) {
            return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
        });
        for (size_t i = 0; i < k; ++i)
            r.top.emplace_back(idx[i], float(double(logits[idx[i]]) - log_z));
    }
    return r;
}

// What the engine has produced for one HTTP request, handed from the
// engine's thread to the request's.
struct stream_state {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<smol_token> tokens;
    int32_t n_top = -1; // logprobs with this many alternatives; -1: none (set before submission)
    server_metrics * metrics = nullptr;
    server::waker * wake = nullptr; // notifies cv (set before submission)
    bool queued_seen = false;
    std::chrono::steady_clock::time_point t_first; // the first generated token
    std::deque<token_logprob> logprobs;            // one a token of `tokens`, when asked
    smol_finish_reason finish = SMOL_FINISH_NONE;
    std::string error;
    int32_t n_prompt = 0, n_cached = 0, n_generated = 0;
    std::atomic<bool> client_gone{false};
};

// user is a heap-allocated shared_ptr: the engine's reference to the state,
// which outlives an HTTP request whose client went away; the final event
// drops it.
bool on_event(const smol_engine_event * ev, void * user) {
    auto * ref = static_cast<std::shared_ptr<stream_state> *>(user);
    stream_state * s = ref->get();
    // An end-of-generation or stop token ends the text; it is not part of it.
    const bool kept = ev->token >= 0 && ev->finish != SMOL_FINISH_STOP;
    token_logprob lp;
    if (kept && s->n_top >= 0 && ev->logits)
        lp = logprob_of(ev->logits, ev->n_vocab, ev->token, s->n_top);
    if (server_metrics * m = s->metrics) {
        if (!s->queued_seen && ev->queue_ms >= 0) {
            s->queued_seen = true;
            m->queue_wait.observe(ev->queue_ms / 1000);
        }
        const auto now = std::chrono::steady_clock::now();
        if (ev->token >= 0 && ev->n_generated == 1) {
            s->t_first = now;
            if (ev->first_token_ms >= 0) m->first_token.observe(ev->first_token_ms / 1000);
        }
        if (ev->finish != SMOL_FINISH_NONE) {
            if (int(ev->finish) < 5) ++m->finished[int(ev->finish)];
            if (ev->n_generated > 1 && s->t_first != std::chrono::steady_clock::time_point()) {
                m->per_token.observe(std::chrono::duration<double>(now - s->t_first).count() /
                                     double(ev->n_generated - 1));
            }
        }
    }
    {
        std::lock_guard<std::mutex> lock(s->mu);
        s->n_prompt = ev->n_prompt;
        s->n_cached = ev->n_cached;
        s->n_generated = ev->n_generated;
        if (ev->finish != SMOL_FINISH_NONE) {
            s->finish = ev->finish;
            if (ev->message) s->error = ev->message;
        }
        if (ev->finish == SMOL_FINISH_ERROR) {
            // The engine could not go on with it (a failed step): said here
            // and to the client.
            std::fprintf(stderr, "smol-server: request %lld failed: %s\n",
                         static_cast<long long>(ev->id),
                         ev->message ? ev->message : "(no message)");
        }
        if (kept) {
            s->tokens.push_back(ev->token);
            if (s->n_top >= 0) s->logprobs.push_back(std::move(lp));
        }
    }
    s->wake->post(std::shared_ptr<std::condition_variable>(*ref, &s->cv));
    const bool go_on = !s->client_gone.load();
    if (ev->finish != SMOL_FINISH_NONE) delete ref;
    return go_on;
}

// --- text: pieces, UTF-8 and stop strings --------------------------------------

// Bytes of s that form whole UTF-8 characters (a token may end mid-character).
size_t utf8_complete(const std::string & s) {
    size_t i = s.size();
    for (size_t k = 1; k <= std::min<size_t>(4, s.size()); ++k) {
        const unsigned char c = static_cast<unsigned char>(s[s.size() - k]);
        if ((c & 0xC0) == 0x80) continue; // continuation byte
        const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        i = need > k ? s.size() - k : s.size();
        break;
    }
    return i;
}

// Turns tokens into text for one request: whole characters only, cut at the
// first stop string, and holding back a tail that may be the start of one.
struct detokenizer {
    const smol_model * model;
    std::vector<std::string> stops;
    std::string text; // everything decoded so far
    size_t sent = 0;  // bytes of text already handed out
    bool stopped = false;
    std::vector<size_t> starts; // where each token's text starts in text
    // With tools offered, special tokens keep their text (some models open
    // a call with one) and what may be a call is held back; cut: where the
    // calls found at the end begin (nothing from there is content).
    bool tools = false;
    size_t cut = std::string::npos;

    void add(smol_token t) {
        char buf[256];
        size_t n = 0;
        starts.push_back(text.size());
        if (smol_token_to_piece(model, t, tools, buf, sizeof buf, &n) == SMOL_OK)
            text.append(buf, n);
    }
    // The next piece of text that is safe to send; final: no more tokens.
    std::string take(bool final) {
        if (stopped) return "";
        size_t end = text.size();
        for (const std::string & s : stops) {
            const size_t at = text.find(s, sent > s.size() ? sent - s.size() : 0);
            if (at != std::string::npos && at < end) {
                end = at;
                stopped = true;
            }
        }
        if (tools) {
            const int64_t at = final ? (cut == std::string::npos ? -1 : int64_t(cut))
                                     : smol_chat_tool_call_start(model, text.data(), text.size());
            if (at >= 0 && size_t(at) < end) end = std::max(sent, size_t(at));
        }
        if (!stopped && !final) {
            // Hold back the longest tail that begins a stop string.
            for (const std::string & s : stops) {
                for (size_t k = std::min(s.size() - 1, end - sent); k > 0; --k) {
                    if (text.compare(end - k, k, s, 0, k) == 0) {
                        end = std::min(end, text.size() - k);
                        break;
                    }
                }
            }
        }
        std::string out = text.substr(sent, end - sent);
        if (!final && !stopped) out.resize(utf8_complete(out));
        sent += out.size();
        return out;
    }
};

// --- running one request ----------------------------------------------------------

const char * finish_name(smol_finish_reason r, bool stopped) {
    if (stopped) return "stop";
    switch (r) {
    case SMOL_FINISH_LENGTH:
        return "length";
    default:
        return "stop";
    }
}

// A request in flight: its engine id, its tokens' queue and its text.
struct job {
    server_state & st;
    std::shared_ptr<stream_state> state = std::make_shared<stream_state>();
    detokenizer text;
    smol_request_id id = 0;
    std::string oid;
    std::time_t created = std::time(nullptr);
    bool chat = true;
    bool stream = false, include_usage = false;
    bool finished = false;
    smol_finish_reason finish = SMOL_FINISH_NONE;
    // Logprobs: those of the tokens received, and how many of them are
    // released (their text was handed out), all and by the last poll.
    int index = 0; // the choice it is, of a request's n
    bool logprobs = false;
    std::vector<smol_token> got_tokens;
    std::vector<token_logprob> got_lps;
    size_t released = 0, released_before = 0;

    job(server_state & s, bool is_chat) : st(s), chat(is_chat) {
        text.model = s.served.model;
        oid = std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(st.next_id++);
    }
    ~job() {
        if (!finished && id > 0) smol_engine_cancel(st.engine, id);
    }

    void submit(const gen_request & g) {
        text.stops = g.stops;
        stream = g.stream;
        include_usage = g.include_usage;
        logprobs = g.logprobs;
        state->n_top = g.logprobs ? g.top_logprobs : -1;
        state->metrics = &st.m;
        state->wake = &st.wake;
        text.tools = g.tools;
        parallel_calls = g.parallel_tool_calls;
        smol_request_params p = smol_request_default_params();
        p.prompt = g.prompt.data();
        p.n_prompt = int32_t(g.prompt.size());
        p.sampler = g.sampler;
        p.max_tokens = g.max_tokens;
        p.ignore_eog = g.ignore_eos;
        p.grammar = g.grammar.empty() ? nullptr : g.grammar.c_str();
        if (!g.speculative) p.draft_max = 0;
        p.skip_event_logits = !g.logprobs; // logprobs alone read them
        if (p.grammar) ++st.m.constrained;
        p.on_event = on_event;
        auto * ref = new std::shared_ptr<stream_state>(state);
        p.user_data = ref;
        // Every slot and the queue taken: wait a while for room before the
        // 503. A client that hung up holds its place until a probe write
        // fails (streams probe every 200 ms, others every 500 ms), so
        // clients that come and go fill the queue for moments at a time.
        const auto give_up = std::chrono::steady_clock::now() + st.queue_wait;
        smol_status s = smol_engine_submit(st.engine, &p, &id);
        while (s == SMOL_ERR_BUSY && std::chrono::steady_clock::now() < give_up) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            s = smol_engine_submit(st.engine, &p, &id);
        }
        if (s != SMOL_OK) delete ref;
        if (s == SMOL_ERR_BUSY) {
            throw api_error{503,
                            "the server is busy: every slot and the queue are taken; retry later",
                            "server_error", "", "server_busy"};
        }
        if (s != SMOL_OK) throw bad_request(smol_last_error());
    }

    // Waits up to `wait` for news; returns the text that became safe to
    // send. Sets finished when the engine is done with the request.
    std::string poll(std::chrono::milliseconds wait) {
        std::deque<smol_token> got;
        std::deque<token_logprob> lps;
        smol_finish_reason fin;
        {
            std::unique_lock<std::mutex> lock(state->mu);
            state->cv.wait_for(lock, wait, [&] {
                return !state->tokens.empty() || state->finish != SMOL_FINISH_NONE;
            });
            got.swap(state->tokens);
            lps.swap(state->logprobs);
            fin = state->finish;
        }
        for (smol_token t : got) text.add(t);
        if (logprobs) {
            got_tokens.insert(got_tokens.end(), got.begin(), got.end());
            for (token_logprob & lp : lps) got_lps.push_back(std::move(lp));
        }
        const bool was_stopped = text.stopped;
        if (text.tools && fin != SMOL_FINISH_NONE && fin != SMOL_FINISH_ERROR) read_calls();
        std::string out = text.take(fin != SMOL_FINISH_NONE);
        // A token's logprob goes out with the piece of text that completes
        // its own (at the end: that holds any of it; none past a stop string).
        released_before = released;
        const size_t n_lp = std::min(got_tokens.size(), got_lps.size());
        while (released < n_lp) {
            const size_t end =
                released + 1 < text.starts.size() ? text.starts[released + 1] : text.text.size();
            const bool whole = end <= text.sent;
            const bool part = fin != SMOL_FINISH_NONE && text.starts[released] < text.sent;
            if (!whole && !part) break;
            ++released;
        }
        if (text.stopped && !was_stopped && fin == SMOL_FINISH_NONE) {
            // A stop string: the engine need not go on.
            smol_engine_cancel(st.engine, id);
        }
        if (fin != SMOL_FINISH_NONE) {
            finished = true;
            finish = fin;
        }
        return out;
    }

    const char * finish_reason() const {
        return calls.empty() ? finish_name(finish, text.stopped) : "tool_calls";
    }

    // The calls of a finished reply, read when tools were offered, and its
    // content beside them.
    bool parallel_calls = true;
    json calls = json::array();
    std::string call_content;
    void read_calls() {
        std::vector<char> buf(text.text.size() + 256);
        size_t n = 0;
        smol_status s = smol_chat_parse_tool_calls(st.served.model, text.text.data(),
                                                   text.text.size(), buf.data(), buf.size(), &n);
        if (s == SMOL_ERR_BUFFER_TOO_SMALL) {
            buf.resize(n + 1);
            s = smol_chat_parse_tool_calls(st.served.model, text.text.data(), text.text.size(),
                                           buf.data(), buf.size(), &n);
        }
        if (s != SMOL_OK) return;
        const json r = json::parse(std::string(buf.data(), n), nullptr, false);
        if (!r.is_object() || !r["tool_calls"].is_array() || r["tool_calls"].empty()) return;
        for (const json & c : r["tool_calls"]) {
            if (!parallel_calls && !calls.empty()) break;
            calls.push_back({{"id", oid + "-call-" + std::to_string(calls.size())},
                             {"type", "function"},
                             {"function", {{"name", c["name"]}, {"arguments", c["arguments"]}}}});
        }
        call_content = r["content"].get<std::string>();
        ++st.m.tool_call_replies;
        st.m.tool_calls += int64_t(calls.size());
        const int64_t at =
            smol_chat_tool_call_start(st.served.model, text.text.data(), text.text.size());
        text.cut = at >= 0 ? size_t(at) : text.text.size();
    }

    // The stream's chunks of the calls: each call's id, type and name, then
    // its arguments.
    std::vector<json> call_chunks() const {
        std::vector<json> out;
        for (size_t i = 0; i < calls.size(); ++i) {
            json head = calls[i];
            head["index"] = i;
            head["function"]["arguments"] = "";
            json args = {{"index", i},
                         {"function", {{"arguments", calls[i]["function"]["arguments"]}}}};
            for (const json & d : {head, args}) {
                json c = chunk("", nullptr, false);
                c["choices"][0]["delta"] = {{"tool_calls", json::array({d})}};
                c["choices"][0]["logprobs"] = nullptr;
                out.push_back(c);
            }
        }
        return out;
    }

    // The engine's failure of this request, in OpenAI's error shape.
    json failure() const {
        std::lock_guard<std::mutex> lock(state->mu);
        return error_body({500,
                           "generation failed: " +
                               (state->error.empty() ? std::string("(no message)") : state->error),
                           "server_error", "", "generation_failed"});
    }

    // (prompt tokens, cached prompt tokens, generated tokens)
    std::array<int32_t, 3> counts() const {
        std::lock_guard<std::mutex> lock(state->mu);
        return {state->n_prompt, state->n_cached, state->n_generated};
    }

    // Logprobs of tokens [from, to) in OpenAI's shape: chat's list of
    // entries, or completions' parallel lists (text_offset: bytes into the
    // returned text); null when not asked for.
    json logprobs_json(size_t from, size_t to) const {
        if (!logprobs) return nullptr;
        auto piece = [&](smol_token t) {
            char buf[256];
            size_t n = 0;
            if (smol_token_to_piece(st.served.model, t, true, buf, sizeof buf, &n) != SMOL_OK)
                n = 0;
            return std::string(buf, n);
        };
        auto bytes = [](const std::string & p) {
            json b = json::array();
            for (unsigned char c : p) b.push_back(int(c));
            return b;
        };
        if (chat) {
            json content = json::array();
            for (size_t i = from; i < to; ++i) {
                const std::string p = piece(got_tokens[i]);
                json top = json::array();
                for (const auto & alt : got_lps[i].top) {
                    const std::string q = piece(alt.first);
                    top.push_back({{"token", q}, {"logprob", alt.second}, {"bytes", bytes(q)}});
                }
                content.push_back({{"token", p},
                                   {"logprob", got_lps[i].logprob},
                                   {"bytes", bytes(p)},
                                   {"top_logprobs", top}});
            }
            return json{{"content", content}, {"refusal", nullptr}};
        }
        json tokens = json::array(), lps = json::array(), tops = json::array(),
             offsets = json::array();
        for (size_t i = from; i < to; ++i) {
            tokens.push_back(piece(got_tokens[i]));
            lps.push_back(got_lps[i].logprob);
            json top = json::object();
            for (const auto & alt : got_lps[i].top) top[piece(alt.first)] = alt.second;
            tops.push_back(top);
            offsets.push_back(text.starts[i]);
        }
        return json{{"tokens", tokens},
                    {"token_logprobs", lps},
                    {"top_logprobs", tops},
                    {"text_offset", offsets}};
    }

    json chunk(const std::string & delta, const char * finish_reason, bool first) const {
        json choice;
        const json lp =
            first || finish_reason ? json(nullptr) : logprobs_json(released_before, released);
        if (chat) {
            json d = json::object();
            if (first) d["role"] = "assistant";
            if (!delta.empty() || first) d["content"] = delta;
            choice = {{"index", index}, {"delta", d}, {"logprobs", lp}};
        } else {
            choice = {{"index", index}, {"text", delta}, {"logprobs", lp}};
        }
        choice["finish_reason"] = finish_reason ? json(finish_reason) : json(nullptr);
        return json{{"id", oid},
                    {"object", chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", created},
                    {"model", st.served.id},
                    {"choices", json::array({choice})}};
    }

    json choice_whole(const std::string & all) const {
        json choice;
        if (chat) {
            json message = {{"role", "assistant"}, {"content", all}};
            if (!calls.empty()) {
                message["content"] = call_content.empty() ? json(nullptr) : json(call_content);
                message["tool_calls"] = calls;
            }
            choice = {
                {"index", index}, {"message", message}, {"logprobs", logprobs_json(0, released)}};
        } else {
            choice = {{"index", index}, {"text", all}, {"logprobs", logprobs_json(0, released)}};
        }
        choice["finish_reason"] = finish_reason();
        return choice;
    }
};

std::string dump(const json & j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// The n choices of one request. The first is submitted alone; the others
// once its prompt is in the cache (its first token), so that with the
// prefix cache they take its KV instead of computing the prompt again.
// Choice i samples with seed + i.
struct choices {
    std::vector<std::shared_ptr<job>> jobs;

    choices(server_state & st, bool chat, const gen_request & g) {
        for (int32_t i = 0; i < g.n; ++i) {
            jobs.push_back(std::make_shared<job>(st, chat));
            jobs.back()->index = int(i);
            jobs.back()->oid = jobs.front()->oid;
        }
        jobs[0]->submit(g);
        if (g.n == 1) return;
        {
            stream_state & s0 = *jobs[0]->state;
            std::unique_lock<std::mutex> lock(s0.mu);
            s0.cv.wait(lock, [&] { return s0.n_generated > 0 || s0.finish != SMOL_FINISH_NONE; });
        }
        for (size_t i = 1; i < jobs.size(); ++i) {
            gen_request gi = g;
            gi.sampler.seed = g.sampler.seed + i;
            jobs[i]->submit(gi);
        }
    }
    const job & front() const { return *jobs.front(); }
    bool finished() const {
        return std::all_of(jobs.begin(), jobs.end(), [](const auto & j) { return j->finished; });
    }
    const job * failed() const {
        for (const auto & j : jobs)
            if (j->finish == SMOL_FINISH_ERROR) return j.get();
        return nullptr;
    }
    void client_gone() {
        for (const auto & j : jobs) j->state->client_gone = true;
        front().st.m.disconnects++;
    }
    // The prompt counted once, the tokens of every choice.
    json usage() const {
        const std::array<int32_t, 3> c0 = front().counts();
        int32_t generated = 0;
        for (const auto & j : jobs) generated += j->counts()[2];
        return json{{"prompt_tokens", c0[0]},
                    {"completion_tokens", generated},
                    {"total_tokens", c0[0] + generated},
                    {"prompt_tokens_details", {{"cached_tokens", c0[1]}}}};
    }
    json whole(const std::vector<std::string> & texts) const {
        json list = json::array();
        for (size_t i = 0; i < jobs.size(); ++i) list.push_back(jobs[i]->choice_whole(texts[i]));
        const job & j = front();
        return json{
            {"id", j.oid},          {"object", j.chat ? "chat.completion" : "text_completion"},
            {"created", j.created}, {"model", j.st.served.id},
            {"choices", list},      {"usage", usage()}};
    }
};

void handle_generate(server_state & st, const httplib::Request & req, httplib::Response & res,
                     bool chat) {
    const gen_request g = parse_request(st.served, req.body, chat);
    auto c = std::make_shared<choices>(st, chat, g);
    const std::chrono::milliseconds wait(std::max<int64_t>(20, 200 / int64_t(c->jobs.size())));

    if (!g.stream) {
        // Chunked, so that a client that hangs up is noticed: while waiting,
        // a space (JSON allows it before the value) now and then probes the
        // connection.
        res.set_chunked_content_provider(
            "application/json", [c, wait](size_t, httplib::DataSink & sink) {
                std::vector<std::string> texts(c->jobs.size());
                auto last = std::chrono::steady_clock::now();
                while (!c->finished()) {
                    for (size_t i = 0; i < c->jobs.size(); ++i)
                        if (!c->jobs[i]->finished) texts[i] += c->jobs[i]->poll(wait / 2);
                    if (std::chrono::steady_clock::now() - last > std::chrono::milliseconds(500)) {
                        last = std::chrono::steady_clock::now();
                        if (!sink.write(" ", 1)) {
                            c->client_gone();
                            return false;
                        }
                    }
                }
                const job * failed = c->failed();
                const std::string out = dump(failed ? failed->failure() : c->whole(texts));
                if (failed) c->front().st.m.http_errors++;
                sink.write(out.data(), out.size());
                sink.done();
                return true;
            });
        return;
    }

    res.set_header("Cache-Control", "no-cache");
    auto first = std::make_shared<bool>(true);
    res.set_chunked_content_provider(
        "text/event-stream", [c, first, wait](size_t, httplib::DataSink & sink) {
            auto send = [&](const json & x) {
                const std::string line = "data: " + dump(x) + "\n\n";
                return sink.write(line.data(), line.size());
            };
            auto gone = [&] {
                c->client_gone();
                return false;
            };
            if (*first) {
                *first = false;
                for (const auto & j : c->jobs)
                    if (!send(j->chunk("", nullptr, true))) return gone();
            }
            bool any_news = false;
            for (const auto & j : c->jobs) {
                if (j->finished) continue;
                const std::string delta = j->poll(wait);
                // Text, or tokens whose logprobs go out though their text is empty.
                const bool news = !delta.empty() || j->released > j->released_before;
                if (news && !send(j->chunk(delta, nullptr, false))) return gone();
                any_news = any_news || news;
                if (j->finished && j->finish != SMOL_FINISH_ERROR) {
                    for (const json & x : j->call_chunks())
                        if (!send(x)) return gone();
                    if (!send(j->chunk("", j->finish_reason(), false))) return gone();
                }
            }
            if (const job * failed = c->failed()) {
                // The stream ends with the error, as OpenAI's streams do.
                failed->st.m.http_errors++;
                send(failed->failure());
                sink.done();
                return true;
            }
            if (!c->finished()) {
                // Nothing new: a comment line keeps the connection probed.
                if (!any_news && !sink.write(": \n\n", 4)) return gone();
                return true;
            }
            if (c->front().include_usage) {
                json u = c->front().chunk("", nullptr, false);
                u["choices"] = json::array();
                u["usage"] = c->usage();
                if (!send(u)) return gone();
            }
            const std::string done = "data: [DONE]\n\n";
            sink.write(done.data(), done.size());
            sink.done();
            return true;
        });
}

// --- the Responses API -----------------------------------------------------------

// A reply as Responses output items: its text as a message (when it has
// text), then each tool call as a function_call.
json response_items(const job & j, const std::string & text, bool done) {
    json items = json::array();
    const std::string content = j.calls.empty() ? text : j.call_content;
    const char * status = done ? "completed" : "in_progress";
    if (!content.empty()) {
        items.push_back({{"type", "message"},
                         {"id", "msg_" + j.oid},
                         {"status", status},
                         {"role", "assistant"},
                         {"content", json::array({{{"type", "output_text"},
                                                   {"text", content},
                                                   {"annotations", json::array()}}})}});
    }
    for (size_t i = 0; i < j.calls.size(); ++i) {
        const json & c = j.calls[i];
        items.push_back({{"type", "function_call"},
                         {"id", "fc_" + j.oid + "-" + std::to_string(i)},
                         {"call_id", c["id"]},
                         {"name", c["function"]["name"]},
                         {"arguments", c["function"]["arguments"]},
                         {"status", status}});
    }
    return items;
}

json response_object(const choices & c, const json & output, const char * status) {
    const job & j = c.front();
    const std::array<int32_t, 3> n = j.counts();
    const bool cut = j.finish == SMOL_FINISH_LENGTH && j.calls.empty();
    return json{{"id", "resp_" + j.oid},
                {"object", "response"},
                {"created_at", j.created},
                {"status", cut && std::string(status) == "completed" ? "incomplete" : status},
                {"incomplete_details", cut ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
                {"error", nullptr},
                {"model", j.st.served.id},
                {"output", output},
                {"parallel_tool_calls", j.parallel_calls},
                {"tool_choice", "auto"},
                {"tools", json::array()},
                {"metadata", json::object()},
                {"usage",
                 {{"input_tokens", n[0]},
                  {"input_tokens_details", {{"cached_tokens", n[1]}}},
                  {"output_tokens", n[2]},
                  {"output_tokens_details", {{"reasoning_tokens", 0}}},
                  {"total_tokens", n[0] + n[2]}}}};
}

void handle_responses(server_state & st, const httplib::Request & req, httplib::Response & res) {
    const gen_request g = parse_request(st.served, responses_as_chat(req.body), true);
    auto c = std::make_shared<choices>(st, true, g);
    if (!g.stream) {
        res.set_chunked_content_provider("application/json", [c](size_t, httplib::DataSink & sink) {
            std::string text;
            auto last = std::chrono::steady_clock::now();
            job & j = *c->jobs.front();
            while (!j.finished) {
                text += j.poll(std::chrono::milliseconds(100));
                if (std::chrono::steady_clock::now() - last > std::chrono::milliseconds(500)) {
                    last = std::chrono::steady_clock::now();
                    if (!sink.write(" ", 1)) {
                        c->client_gone();
                        return false;
                    }
                }
            }
            if (j.finish == SMOL_FINISH_ERROR) j.st.m.http_errors++;
            const std::string out =
                dump(j.finish == SMOL_FINISH_ERROR
                         ? j.failure()
                         : response_object(*c, response_items(j, text, true), "completed"));
            sink.write(out.data(), out.size());
            sink.done();
            return true;
        });
        return;
    }
    // Events: created and in_progress; the message item and its text part
    // opened at the first text, then text deltas; at the end the text's
    // done events, each function call's item and arguments, completed.
    struct progress {
        int64_t seq = 0;
        bool started = false, opened = false;
        std::string text;
    };
    auto p = std::make_shared<progress>();
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider("text/event-stream", [c, p](size_t, httplib::DataSink & sink) {
        job & j = *c->jobs.front();
        const std::string item_id = "msg_" + j.oid;
        auto send = [&](const char * type, json x) {
            x["type"] = type;
            x["sequence_number"] = p->seq++;
            const std::string line = std::string("event: ") + type + "\ndata: " + dump(x) + "\n\n";
            return sink.write(line.data(), line.size());
        };
        auto gone = [&] {
            c->client_gone();
            return false;
        };
        if (!p->started) {
            p->started = true;
            const json r = response_object(*c, json::array(), "in_progress");
            if (!send("response.created", {{"response", r}}) ||
                !send("response.in_progress", {{"response", r}}))
                return gone();
        }
        const std::string delta = j.poll(std::chrono::milliseconds(200));
        if (!delta.empty()) {
            if (!p->opened) {
                p->opened = true;
                if (!send("response.output_item.added", {{"output_index", 0},
                                                         {"item",
                                                          {{"type", "message"},
                                                           {"id", item_id},
                                                           {"status", "in_progress"},
                                                           {"role", "assistant"},
                                                           {"content", json::array()}}}}) ||
                    !send("response.content_part.added", {{"item_id", item_id},
                                                          {"output_index", 0},
                                                          {"content_index", 0},
                                                          {"part",
                                                           {{"type", "output_text"},
                                                            {"text", ""},
                                                            {"annotations", json::array()}}}}))
                    return gone();
            }
            p->text += delta;
            if (!send("response.output_text.delta", {{"item_id", item_id},
                                                     {"output_index", 0},
                                                     {"content_index", 0},
                                                     {"delta", delta}}))
                return gone();
        } else if (!j.finished) {
            if (!sink.write(": \n\n", 4)) return gone();
            return true;
        }
        if (!j.finished) return true;
        if (j.finish == SMOL_FINISH_ERROR) {
            j.st.m.http_errors++;
            json f = j.failure();
            send("error", {{"code", "generation_failed"}, {"message", f["error"]["message"]}});
            sink.done();
            return true;
        }
        const json items = response_items(j, p->text, true);
        size_t index = 0;
        for (const json & item : items) {
            if (item["type"] == "message") {
                const json part = item["content"][0];
                if (!p->opened) {
                    // Text only known at the end (held back as a possible call).
                    json open = item;
                    open["status"] = "in_progress";
                    open["content"] = json::array();
                    if (!send("response.output_item.added",
                              {{"output_index", index}, {"item", open}}))
                        return gone();
                }
                if (!send("response.output_text.done", {{"item_id", item_id},
                                                        {"output_index", index},
                                                        {"content_index", 0},
                                                        {"text", part["text"]}}) ||
                    !send("response.content_part.done", {{"item_id", item_id},
                                                         {"output_index", index},
                                                         {"content_index", 0},
                                                         {"part", part}}) ||
                    !send("response.output_item.done", {{"output_index", index}, {"item", item}}))
                    return gone();
            } else {
                json open = item;
                open["status"] = "in_progress";
                open["arguments"] = "";
                if (!send("response.output_item.added",
                          {{"output_index", index}, {"item", open}}) ||
                    !send("response.function_call_arguments.delta",
                          {{"item_id", item["id"]},
                           {"output_index", index},
                           {"delta", item["arguments"]}}) ||
                    !send("response.function_call_arguments.done",
                          {{"item_id", item["id"]},
                           {"output_index", index},
                           {"arguments", item["arguments"]}}) ||
                    !send("response.output_item.done", {{"output_index", index}, {"item", item}}))
                    return gone();
            }
            ++index;
        }
        send("response.completed", {{"response", response_object(*c, items, "completed")}});
        sink.done();
        return true;
    });
}

// --- model path ----------------------------------------------------------------

std::string find_model(const options & o, const char * argv0) {
    std::error_code ec;
    if (!o.model.empty()) {
        if (!fs::is_regular_file(o.model, ec))
            throw std::runtime_error("model file '" + o.model + "' does not exist");
        return o.model;
    }
    const fs::path rel = fs::path("models") / default_model_name;
    std::vector<fs::path> candidates{rel};
    fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (ec) exe = fs::absolute(argv0, ec);
    if (!ec && !exe.empty()) {
        candidates.push_back((exe.parent_path() / ".." / rel).lexically_normal());
        candidates.push_back((exe.parent_path() / ".." / ".." / rel).lexically_normal());
    }
    for (const fs::path & p : candidates)
        if (fs::is_regular_file(p, ec)) return p.string();
    throw std::runtime_error(std::string("no model given (--model) and ") + default_model_name +
                             " is not in models/; run scripts/fetch-model.sh");
}

httplib::Server * g_server = nullptr;
extern "C" void on_signal(int) {
    if (g_server) g_server->stop();
}

} // namespace

int main(int argc, char ** argv) {
    options o;
    CLI::App app{"smol-server: an OpenAI-compatible HTTP server for a GGUF model"};
    app.add_option("--host", o.host, "address to listen on (default 127.0.0.1: loopback only)");
    app.add_option("--port", o.port, "port (default 8080; 0 picks a free one and prints it)");
    app.add_option("-m,--model", o.model,
                   std::string("GGUF model file (default: models/") + default_model_name + ")");
    app.add_option("--alias", o.alias, "the model id clients name (default: the file's name)");
    app.add_option("-c,--ctx-size", o.n_ctx, "KV cells shared by all requests (default 4096)");
    app.add_option("--parallel", o.parallel, "requests generating at once (1-127, default 4)");
    app.add_option("--max-queue", o.max_queue, "requests waiting beyond those (default 32)");
    app.add_option("--queue-wait", o.queue_wait_ms,
                   "ms a request that finds the slots and the queue full waits for room before "
                   "its 503 (default 1000)");
    app.add_option("--max-body", o.max_body, "largest request body in bytes (default 1 MiB)");
    app.add_option("--max-connections", o.max_connections,
                   "connections served at once; more wait for one to end (default 1024)");
    app.add_option("--chunk", o.chunk, "most prompt tokens of one request per step (default 256)");
    app.add_option("-t,--threads", o.threads, "CPU threads (default: all cores)");
    add_device_options(app, o.devices);
    app.add_option("--kv-offload", o.kv_offload, "KV heads in host memory: auto, none, all")
        ->check(CLI::IsMember({"auto", "none", "all"}));
    app.add_option("--kv-attend", o.kv_attend,
                   "offloaded KV heads: auto (by measured speeds), device (streamed), "
                   "host (attended on the CPU)")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "device", "host"}));
    add_kv_type_option(app, o.kv_type);
    o.streaming.add(app);
    app.add_flag("--no-prefix-cache", o.no_prefix_cache, "do not reuse cached prompt prefixes");
    app.add_option("--window-reserve", o.window_reserve,
                   "positions past their window that sliding-window layers and streaming heads "
                   "keep per request (0: the batch size): at least --draft-max, smaller saves "
                   "memory, larger lets later requests reuse more of a shared prefix")
        ->check(CLI::NonNegativeNumber);
    app.add_flag("--swa-full", o.swa_full,
                 "sliding-window layers (Gemma 3's local ones) keep every position, not only "
                 "their window: more memory, rollbacks and prefix reuse of any length");
    app.add_option("--api-key", o.api_keys,
                   "a key every request but /health must carry (Authorization: Bearer KEY); "
                   "may be given several times");
    app.add_option("--api-key-file", o.api_key_file,
                   "a file of keys, one a line (# starts a comment)");
    app.add_flag("--no-auth", o.no_auth,
                 "serve beyond loopback without keys (by default that needs --api-key)");
    app.add_flag("--lookup", o.lookup,
                 "speculate by n-gram lookup in each request's prompt and output");
    app.add_option("--draft-model,--model-draft,--md", o.draft_model,
                   "speculate with this smaller GGUF model of the same vocabulary");
    app.add_option("--draft-max", o.draft_max,
                   "most guessed tokens per request and step (default 8 with --lookup or "
                   "--draft-model)");
    CLI11_PARSE(app, argc, argv);

    std::vector<std::string> keys = o.api_keys;
    try {
        if (!o.api_key_file.empty()) {
            const std::vector<std::string> more = read_keys(o.api_key_file);
            keys.insert(keys.end(), more.begin(), more.end());
        }
    } catch (const std::exception & e) {
        std::fprintf(stderr, "smol-server: %s\n", e.what());
        return 1;
    }
    if (std::any_of(keys.begin(), keys.end(), [](const std::string & k) { return k.empty(); })) {
        std::fprintf(stderr, "smol-server: --api-key: a key may not be empty\n");
        return 1;
    }
    if (keys.empty() && !o.no_auth && !is_loopback(o.host)) {
        std::fprintf(stderr,
                     "smol-server: listening on %s reaches beyond this machine; give it "
                     "--api-key KEY (or --api-key-file FILE), or --no-auth to serve without "
                     "keys\n",
                     o.host.c_str());
        return 1;
    }

    server_state st;
    std::string path;
    try {
        path = find_model(o, argv[0]);
    } catch (const std::exception & e) {
        std::fprintf(stderr, "smol-server: %s\n", e.what());
        return 1;
    }
    if (smol_model_load(path.c_str(), nullptr, &st.model) != SMOL_OK) {
        std::fprintf(stderr, "smol-server: %s\n", smol_last_error());
        return 1;
    }
    st.served.model = st.model;
    st.queue_wait = std::chrono::milliseconds(o.queue_wait_ms);
    st.served.id = o.alias.empty() ? fs::path(path).stem().string() : o.alias;
    smol_engine_params ep = smol_engine_default_params();
    ep.context.n_ctx = o.n_ctx;
    ep.context.n_batch = std::min<uint32_t>(512, o.n_ctx);
    ep.context.n_seq_max = o.parallel;
    ep.context.n_threads = o.threads;
    if (std::string err; !o.devices.apply(ep.context, err)) {
        std::fprintf(stderr, "smol-server: %s\n", err.c_str());
        smol_model_free(st.model);
        return 1;
    }
    ep.context.kv_offload = o.kv_offload == "none"  ? SMOL_KV_OFFLOAD_NONE
                            : o.kv_offload == "all" ? SMOL_KV_OFFLOAD_ALL
                                                    : SMOL_KV_OFFLOAD_AUTO;
    ep.context.kv_attend = o.kv_attend == "device" ? SMOL_KV_ATTEND_DEVICE
                           : o.kv_attend == "host" ? SMOL_KV_ATTEND_HOST
                                                   : SMOL_KV_ATTEND_AUTO;
    ep.context.kv_type = o.kv_type;
    if (std::string err; !o.streaming.apply(st.model, ep.context, err)) {
        std::fprintf(stderr, "smol-server: %s\n", err.c_str());
        smol_model_free(st.model);
        return 1;
    }
    ep.n_chunk = o.chunk;
    ep.n_queue_max = o.max_queue;
    ep.prefix_cache = !o.no_prefix_cache;
    ep.context.swa_full = o.swa_full;
    ep.context.window_reserve = o.window_reserve;
    ep.worker_thread = true;
    // Speculation; each error names the flag to change.
    if (o.lookup && !o.draft_model.empty()) {
        std::fprintf(stderr, "smol-server: --lookup and --draft-model: give one proposer\n");
        smol_model_free(st.model);
        return 1;
    }
    if (o.draft_max < 0 || (o.draft_max > 0 && !o.lookup && o.draft_model.empty())) {
        std::fprintf(stderr,
                     "smol-server: --draft-max %d: give --lookup or --draft-model with a "
                     "positive --draft-max\n",
                     o.draft_max);
        smol_model_free(st.model);
        return 1;
    }
    if (o.lookup || !o.draft_model.empty()) {
        ep.draft_max = o.draft_max > 0 ? o.draft_max : 8;
    }
    if (!o.draft_model.empty()) {
        if (smol_model_load(o.draft_model.c_str(), nullptr, &st.draft) != SMOL_OK) {
            std::fprintf(stderr, "smol-server: --draft-model: %s\n", smol_last_error());
            smol_model_free(st.model);
            return 1;
        }
        ep.draft_model = st.draft;
    }
    if (smol_engine_create(st.model, &ep, &st.engine) != SMOL_OK) {
        const std::string msg = smol_last_error();
        // A refusal of the speculation names the flag that asked for it.
        const char * flag = msg.find("draft_max") != std::string::npos ? "--draft-max"
                            : msg.find("draft") != std::string::npos   ? "--draft-model"
                                                                       : nullptr;
        if (flag) {
            std::fprintf(stderr, "smol-server: %s: %s\n", flag, msg.c_str());
        } else {
            std::fprintf(stderr, "smol-server: %s\n", msg.c_str());
        }
        smol_model_free(st.draft);
        smol_model_free(st.model);
        return 1;
    }
    st.served.n_ctx = o.n_ctx;
    st.embd_params = ep.context;
    st.embd_params.n_seq_max = 1;
    st.embd_params.embeddings = true;

    // Destroyed (its threads joined) before the engine its handlers use.
    auto server = std::make_unique<httplib::Server>();
    httplib::Server & svr = *server;
    // A thread a connection, as many as clients hold open up to the cap
    // (connection_pool), so that slow clients cannot hold every thread and
    // the engine (503), not the HTTP layer, is what turns requests away. A
    // client that sends nothing for 10 s is dropped.
    const size_t max_connections = o.max_connections;
    svr.new_task_queue = [max_connections] { return new connection_pool(max_connections); };
    svr.set_keep_alive_timeout(2);
    svr.set_payload_max_length(o.max_body);
    svr.set_read_timeout(10, 0);
    svr.set_write_timeout(30, 0);

    auto guarded = [&st](bool chat) {
        return [&st, chat](const httplib::Request & req, httplib::Response & res) {
            try {
                handle_generate(st, req, res, chat);
            } catch (const api_error & e) {
                send_error(res, e);
            } catch (const std::exception & e) {
                send_error(
                    res, {500, std::string("internal error: ") + e.what(), "server_error", "", ""});
            }
        };
    };
    // Every route but /health and the chat page needs a key when keys are
    // given: a 401 in OpenAI's shape otherwise, before the request is looked
    // at. The page holds no secret; it asks for the key and sends it.
    svr.set_pre_routing_handler([&keys](const httplib::Request & req, httplib::Response & res) {
        if (keys.empty() || req.path == "/health" || req.path == "/" || req.path == "/index.html" ||
            authorized(keys, req.get_header_value("Authorization"))) {
            return httplib::Server::HandlerResponse::Unhandled;
        }
        res.set_header("WWW-Authenticate", "Bearer");
        send_error(res, {401, "a valid API key is required: send it as 'Authorization: Bearer KEY'",
                         "invalid_request_error", "", "invalid_api_key"});
        return httplib::Server::HandlerResponse::Handled;
    });
    svr.Post("/v1/chat/completions", guarded(true));
    svr.Post("/v1/completions", guarded(false));
    svr.Post("/v1/responses", [&st](const httplib::Request & req, httplib::Response & res) {
        try {
            handle_responses(st, req, res);
        } catch (const api_error & e) {
            send_error(res, e);
        } catch (const std::exception & e) {
            send_error(res,
                       {500, std::string("internal error: ") + e.what(), "server_error", "", ""});
        }
    });
    const auto model_json = [&st] {
        return json{{"id", st.served.id},
                    {"object", "model"},
                    {"created", st.started},
                    {"owned_by", "smol"}};
    };
    svr.Get("/v1/models", [model_json](const httplib::Request &, httplib::Response & res) {
        res.set_content(json{{"object", "list"}, {"data", json::array({model_json()})}}.dump(),
                        "application/json");
    });
    svr.Get(R"(/v1/models/(.+))",
            [&st, model_json](const httplib::Request & req, httplib::Response & res) {
                const std::string id = req.matches[1];
                if (id != st.served.id) {
                    send_error(res, {404,
                                     "The model '" + id + "' does not exist; this server has '" +
                                         st.served.id + "'",
                                     "invalid_request_error", "model", "model_not_found"});
                    return;
                }
                res.set_content(model_json().dump(), "application/json");
            });
    // llama-server's tokenizer routes.
    const auto tokens_route = [&st](bool to_ids) {
        return [&st, to_ids](const httplib::Request & req, httplib::Response & res) {
            try {
                const json out = to_ids ? tokenize_reply(st.served, req.body)
                                        : detokenize_reply(st.served, req.body);
                res.set_content(dump(out), "application/json");
            } catch (const api_error & e) {
                send_error(res, e);
            }
        };
    };
    svr.Post("/v1/embeddings", [&st](const httplib::Request & req, httplib::Response & res) {
        try {
            res.set_content(dump(embed(st, parse_embed_request(st.served, req.body))),
                            "application/json");
        } catch (const api_error & e) {
            send_error(res, e);
        }
    });
    svr.Post("/tokenize", tokens_route(true));
    svr.Post("/detokenize", tokens_route(false));
    const auto page = [](const httplib::Request &, httplib::Response & res) {
        res.set_content(reinterpret_cast<const char *>(chat_page), chat_page_size,
                        "text/html; charset=utf-8");
    };
    svr.Get("/", page);
    svr.Get("/index.html", page);
    svr.Get("/health", [](const httplib::Request &, httplib::Response & res) {
        res.set_content(R"({"status":"ok"})", "application/json");
    });
    svr.Get("/metrics", [&st](const httplib::Request &, httplib::Response & res) {
        res.set_content(metrics_text(smol_engine_get_stats(st.engine), st.m),
                        "text/plain; version=0.0.4");
    });
    // Every error the routes did not fill (unknown path, wrong method,
    // oversized body, malformed HTTP) still answers in OpenAI's shape.
    const httplib::Server::HandlerWithResponse on_error = [&st](const httplib::Request &,
                                                                httplib::Response & res) {
        st.m.http_errors++;
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        api_error e{res.status, "", res.status >= 500 ? "server_error" : "invalid_request_error",
                    "", ""};
        if (res.status == 404) {
            e.message = "no such endpoint";
            e.code = "not_found";
        } else if (res.status == 413) {
            e.message = "the request body is larger than this server's limit";
            e.code = "request_too_large";
        } else {
            e.message = "the request was refused (HTTP " + std::to_string(res.status) + ")";
        }
        send_error(res, e);
        return httplib::Server::HandlerResponse::Handled;
    };
    svr.set_error_handler(on_error);

    std::signal(SIGPIPE, SIG_IGN);
    g_server = &svr;
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    // cpp-httplib listens with a backlog of 5: 64 clients connecting at once
    // overflow it, and the kernel drops their connection requests (a retry
    // a second later, or a reset). The socket it binds is noted here and
    // given a backlog of 1024 once bound (a second listen() changes it).
    socket_t bound = INVALID_SOCKET;
    bool binding = true;
    svr.set_socket_options([&bound, &binding](socket_t sock) {
        httplib::default_socket_options(sock);
        if (binding) bound = sock;
    });
    int port = o.port;
    if (port == 0) {
        port = svr.bind_to_any_port(o.host);
    } else if (!svr.bind_to_port(o.host, port)) {
        port = -1;
    }
    binding = false;
    if (port >= 0 && bound != INVALID_SOCKET && ::listen(bound, 1024) != 0) {
        std::fprintf(stderr, "smol-server: keeping the listen backlog of 5 (%s)\n",
                     std::strerror(errno));
    }
    if (port < 0) {
        std::fprintf(stderr, "smol-server: cannot listen on %s:%d\n", o.host.c_str(), o.port);
        server.reset();
        smol_engine_free(st.engine);
        smol_model_free(st.draft);
        smol_model_free(st.model);
        return 1;
    }
    std::fprintf(
        stderr, "smol-server: %s on http://%s:%d (%u slots, %u cells, %s%s; %s)\n",
        st.served.id.c_str(), o.host.c_str(), port, o.parallel, o.n_ctx, smol_cpu_kernels_name(),
        ep.draft_max == 0 ? ""
        : ep.draft_model  ? ", speculating with a draft model"
                          : ", speculating by n-gram lookup",
        keys.empty() ? "no API key" : (std::to_string(keys.size()) + " API key(s)").c_str());
    std::printf("listening on http://%s:%d\n", o.host.c_str(), port);
    std::fflush(stdout);
    svr.listen_after_bind();
    g_server = nullptr;
    server.reset();
    smol_context_free(st.embd);
    smol_engine_free(st.engine);
    smol_model_free(st.draft);
    smol_model_free(st.model);
    return 0;
}
