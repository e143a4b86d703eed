// smol-server.c++ - an OpenAI-compatible HTTP server over smol's engine:
// POST /v1/chat/completions and /v1/completions (streamed as server-sent
// events or not), GET /v1/models, /health and Prometheus /metrics. Requests
// run through one smol_engine (continuous batching, prefix cache) on its
// worker thread; each HTTP request waits on its own queue of tokens. Bad
// requests get a 4xx JSON error in OpenAI's shape, a full queue a 503, and a
// client that goes away has its request cancelled. Loopback by default.

#include "request.h"
#include "smol.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
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
    std::string device = "cpu";
    std::string gpu_mem;             // device memory budget ("24GiB"); empty: none
    std::string kv_offload = "auto"; // KV heads in host memory: auto, none, all
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
    smol_engine * engine = nullptr;
    served_model served; // what requests are checked against
    std::chrono::milliseconds queue_wait{1000};
    std::time_t started = std::time(nullptr);
    std::atomic<int64_t> n_http_errors{0};
    std::atomic<int64_t> n_disconnects{0};
    std::atomic<uint64_t> next_id{1};
};

// What the engine has produced for one HTTP request, handed from the
// engine's thread to the request's.
struct stream_state {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<smol_token> tokens;
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
        // An end-of-generation or stop token ends the text; it is not part of it.
        if (ev->token >= 0 && ev->finish != SMOL_FINISH_STOP) s->tokens.push_back(ev->token);
    }
    s->cv.notify_all();
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

    void add(smol_token t) {
        char buf[256];
        size_t n = 0;
        if (smol_token_to_piece(model, t, false, buf, sizeof buf, &n) == SMOL_OK)
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
        smol_request_params p = smol_request_default_params();
        p.prompt = g.prompt.data();
        p.n_prompt = int32_t(g.prompt.size());
        p.sampler = g.sampler;
        p.max_tokens = g.max_tokens;
        p.ignore_eog = g.ignore_eos;
        p.grammar = g.grammar.empty() ? nullptr : g.grammar.c_str();
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
        smol_finish_reason fin;
        {
            std::unique_lock<std::mutex> lock(state->mu);
            state->cv.wait_for(lock, wait, [&] {
                return !state->tokens.empty() || state->finish != SMOL_FINISH_NONE;
            });
            got.swap(state->tokens);
            fin = state->finish;
        }
        for (smol_token t : got) text.add(t);
        const bool was_stopped = text.stopped;
        std::string out = text.take(fin != SMOL_FINISH_NONE);
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

    const char * finish_reason() const { return finish_name(finish, text.stopped); }

    // The engine's failure of this request, in OpenAI's error shape.
    json failure() const {
        std::lock_guard<std::mutex> lock(state->mu);
        return error_body({500,
                           "generation failed: " +
                               (state->error.empty() ? std::string("(no message)") : state->error),
                           "server_error", "", "generation_failed"});
    }

    json usage() const {
        std::lock_guard<std::mutex> lock(state->mu);
        return json{{"prompt_tokens", state->n_prompt},
                    {"completion_tokens", state->n_generated},
                    {"total_tokens", state->n_prompt + state->n_generated},
                    {"prompt_tokens_details", {{"cached_tokens", state->n_cached}}}};
    }

    json chunk(const std::string & delta, const char * finish_reason, bool first) const {
        json choice;
        if (chat) {
            json d = json::object();
            if (first) d["role"] = "assistant";
            if (!delta.empty() || first) d["content"] = delta;
            choice = {{"index", 0}, {"delta", d}, {"logprobs", nullptr}};
        } else {
            choice = {{"index", 0}, {"text", delta}, {"logprobs", nullptr}};
        }
        choice["finish_reason"] = finish_reason ? json(finish_reason) : json(nullptr);
        return json{{"id", oid},
                    {"object", chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", created},
                    {"model", st.served.id},
                    {"choices", json::array({choice})}};
    }

    json whole(const std::string & all) const {
        json choice;
        if (chat) {
            choice = {{"index", 0},
                      {"message", {{"role", "assistant"}, {"content", all}}},
                      {"logprobs", nullptr}};
        } else {
            choice = {{"index", 0}, {"text", all}, {"logprobs", nullptr}};
        }
        choice["finish_reason"] = finish_reason();
        return json{{"id", oid},
                    {"object", chat ? "chat.completion" : "text_completion"},
                    {"created", created},
                    {"model", st.served.id},
                    {"choices", json::array({choice})},
                    {"usage", usage()}};
    }
};

std::string dump(const json & j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void handle_generate(server_state & st, const httplib::Request & req, httplib::Response & res,
                     bool chat) {
    const gen_request g = parse_request(st.served, req.body, chat);
    auto j = std::make_shared<job>(st, chat);
    j->submit(g);

    if (!j->stream) {
        // Chunked, so that a client that hangs up is noticed: while waiting,
        // a space (JSON allows it before the value) now and then probes the
        // connection.
        res.set_chunked_content_provider("application/json", [j](size_t, httplib::DataSink & sink) {
            std::string all;
            auto last = std::chrono::steady_clock::now();
            while (!j->finished) {
                all += j->poll(std::chrono::milliseconds(100));
                if (std::chrono::steady_clock::now() - last > std::chrono::milliseconds(500)) {
                    last = std::chrono::steady_clock::now();
                    if (!sink.write(" ", 1)) {
                        j->state->client_gone = true;
                        j->st.n_disconnects++;
                        return false;
                    }
                }
            }
            const bool failed = j->finish == SMOL_FINISH_ERROR;
            const std::string out = dump(failed ? j->failure() : j->whole(all));
            if (failed) j->st.n_http_errors++;
            sink.write(out.data(), out.size());
            sink.done();
            return true;
        });
        return;
    }

    res.set_header("Cache-Control", "no-cache");
    auto first = std::make_shared<bool>(true);
    res.set_chunked_content_provider(
        "text/event-stream", [j, first](size_t, httplib::DataSink & sink) {
            auto send = [&](const json & x) {
                const std::string line = "data: " + dump(x) + "\n\n";
                return sink.write(line.data(), line.size());
            };
            auto gone = [&] {
                j->state->client_gone = true;
                j->st.n_disconnects++;
                return false;
            };
            if (*first) {
                *first = false;
                if (!send(j->chunk("", nullptr, true))) return gone();
            }
            const std::string delta = j->poll(std::chrono::milliseconds(200));
            if (!delta.empty() && !send(j->chunk(delta, nullptr, false))) return gone();
            if (delta.empty() && !j->finished) {
                // Nothing new: a comment line keeps the connection probed.
                if (!sink.write(": \n\n", 4)) return gone();
                return true;
            }
            if (!j->finished) return true;
            if (j->finish == SMOL_FINISH_ERROR) {
                // The stream ends with the error, as OpenAI's streams do.
                j->st.n_http_errors++;
                send(j->failure());
                sink.done();
                return true;
            }
            if (!send(j->chunk("", j->finish_reason(), false))) return gone();
            if (j->include_usage) {
                json u = j->chunk("", nullptr, false);
                u["choices"] = json::array();
                u["usage"] = j->usage();
                if (!send(u)) return gone();
            }
            const std::string done = "data: [DONE]\n\n";
            sink.write(done.data(), done.size());
            sink.done();
            return true;
        });
}

std::string metrics(server_state & st) {
    const smol_engine_stats s = smol_engine_get_stats(st.engine);
    std::string out;
    auto put = [&](const char * name, const char * type, const char * help, double v) {
        char line[512];
        std::snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name,
                      type, name, v);
        out += line;
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
    put("smol_http_errors_total", "counter", "Requests answered with an error.",
        double(st.n_http_errors.load()));
    put("smol_client_disconnects_total", "counter", "Requests whose client went away.",
        double(st.n_disconnects.load()));
    return out;
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

// --- connections ----------------------------------------------------------------

// cpp-httplib serves a connection on one thread from its accept until it
// closes, so a client that is slow to send its request (or sends it a byte
// at a time) holds a thread. A fixed pool of a few threads is then taken
// by a few hundred such clients and honest requests wait behind them. This
// pool starts a thread whenever every thread is busy, up to a cap, beyond
// which connections wait for one to end; threads stay for later
// connections.
class connection_pool final : public httplib::TaskQueue {
  public:
    explicit connection_pool(size_t max_threads) : max_(std::max<size_t>(1, max_threads)) {}
    ~connection_pool() override { shutdown(); }

    void enqueue(std::function<void()> fn) override {
        std::unique_lock<std::mutex> lock(mu_);
        jobs_.push_back(std::move(fn));
        if (idle_ < jobs_.size() && threads_.size() < max_) {
            ++idle_;
            threads_.emplace_back([this] { work(); });
        }
        cv_.notify_one();
    }
    void shutdown() override {
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (stop_) return;
            stop_ = true;
        }
        cv_.notify_all();
        for (std::thread & t : threads_) t.join();
    }

  private:
    void work() {
        std::unique_lock<std::mutex> lock(mu_);
        for (;;) {
            cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
            if (jobs_.empty()) return; // stopping, nothing left to serve
            std::function<void()> fn = std::move(jobs_.front());
            jobs_.pop_front();
            --idle_;
            lock.unlock();
            fn();
            lock.lock();
            ++idle_;
        }
    }

    const size_t max_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> jobs_;
    std::vector<std::thread> threads_;
    size_t idle_ = 0; // threads waiting for a connection
    bool stop_ = false;
};

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
    app.add_option("--device", o.device, "cpu, sim (a simulated device) or cuda:N (default cpu)");
    app.add_option("--gpu-mem", o.gpu_mem, "device memory budget, such as 24GiB (default: none)");
    app.add_option("--kv-offload", o.kv_offload, "KV heads in host memory: auto, none, all")
        ->check(CLI::IsMember({"auto", "none", "all"}));
    app.add_flag("--no-prefix-cache", o.no_prefix_cache, "do not reuse cached prompt prefixes");
    CLI11_PARSE(app, argc, argv);

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
    ep.context.device = o.device.c_str();
    if (!o.gpu_mem.empty() && smol_parse_size(o.gpu_mem.c_str(), &ep.context.gpu_mem) != SMOL_OK) {
        std::fprintf(stderr, "smol-server: --gpu-mem: %s\n", smol_last_error());
        smol_model_free(st.model);
        return 1;
    }
    ep.context.kv_offload = o.kv_offload == "none"  ? SMOL_KV_OFFLOAD_NONE
                            : o.kv_offload == "all" ? SMOL_KV_OFFLOAD_ALL
                                                    : SMOL_KV_OFFLOAD_AUTO;
    ep.n_chunk = o.chunk;
    ep.n_queue_max = o.max_queue;
    ep.prefix_cache = !o.no_prefix_cache;
    ep.worker_thread = true;
    if (smol_engine_create(st.model, &ep, &st.engine) != SMOL_OK) {
        std::fprintf(stderr, "smol-server: %s\n", smol_last_error());
        smol_model_free(st.model);
        return 1;
    }
    st.served.n_ctx = o.n_ctx;

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
    svr.Post("/v1/chat/completions", guarded(true));
    svr.Post("/v1/completions", guarded(false));
    svr.Get("/v1/models", [&st](const httplib::Request &, httplib::Response & res) {
        json m = {{"id", st.served.id},
                  {"object", "model"},
                  {"created", st.started},
                  {"owned_by", "smol"}};
        res.set_content(json{{"object", "list"}, {"data", json::array({m})}}.dump(),
                        "application/json");
    });
    svr.Get("/health", [](const httplib::Request &, httplib::Response & res) {
        res.set_content(R"({"status":"ok"})", "application/json");
    });
    svr.Get("/metrics", [&st](const httplib::Request &, httplib::Response & res) {
        res.set_content(metrics(st), "text/plain; version=0.0.4");
    });
    // Every error the routes did not fill (unknown path, wrong method,
    // oversized body, malformed HTTP) still answers in OpenAI's shape.
    const httplib::Server::HandlerWithResponse on_error = [&st](const httplib::Request &,
                                                                httplib::Response & res) {
        st.n_http_errors++;
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
        smol_model_free(st.model);
        return 1;
    }
    std::fprintf(stderr, "smol-server: %s on http://%s:%d (%u slots, %u cells, %s)\n",
                 st.served.id.c_str(), o.host.c_str(), port, o.parallel, o.n_ctx,
                 smol_cpu_kernels_name());
    std::printf("listening on http://%s:%d\n", o.host.c_str(), port);
    std::fflush(stdout);
    svr.listen_after_bind();
    g_server = nullptr;
    server.reset();
    smol_engine_free(st.engine);
    smol_model_free(st.model);
    return 0;
}
