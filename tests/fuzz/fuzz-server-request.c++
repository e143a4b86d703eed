// fuzz-server-request.c++ - libFuzzer target: any bytes as the body of a
// POST to smol-server's /v1/chat/completions (first byte even) or
// /v1/completions (odd), and to /v1/responses, /v1/embeddings, /tokenize
// and /detokenize, through the server's own request parsing
// (examples/smol-server/request.c++) over a tiny random llama with a
// ChatML vocabulary. Every body is either a request the engine can run (a
// prompt of ids in the vocabulary, 1 <= max_tokens, prompt and max_tokens
// within the context, at most 4 stop strings, sampling parameters in their
// ranges) or an api_error with a 4xx status and a message. Anything else
// (another exception, a 5xx, a request out of bounds) traps, as do crashes
// and sanitizer reports.

#include "request.h"
#include "tiny-model.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

namespace {

server::served_model served;
int32_t n_vocab = 0;

void fail(const char * what) {
    std::fprintf(stderr, "fuzz-server-request: %s\n", what);
    __builtin_trap();
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    const std::string path = "/tmp/smol-fuzz-server-request-" + std::to_string(getpid()) + ".gguf";
    tiny::shape s;
    tiny::write(path, s, 1);
    smol_model * m = nullptr;
    if (smol_model_load(path.c_str(), nullptr, &m) != SMOL_OK) {
        std::fprintf(stderr, "fuzz-server-request: %s\n", smol_last_error());
        std::exit(1);
    }
    std::remove(path.c_str());
    served.model = m;
    served.id = "tiny";
    served.n_ctx = 256;
    n_vocab = s.n_vocab;
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    if (size == 0) return 0;
    const bool chat = (data[0] & 1) == 0;
    const std::string body(reinterpret_cast<const char *>(data + 1), size - 1);
    try {
        const server::gen_request g = server::parse_request(served, body, chat);
        if (g.prompt.empty()) fail("an empty prompt was accepted");
        for (smol_token t : g.prompt)
            if (t < 0 || t >= n_vocab) fail("a prompt id outside the vocabulary was accepted");
        if (g.max_tokens < 1) fail("max_tokens below 1");
        if (int64_t(g.prompt.size()) + g.max_tokens > int64_t(served.n_ctx))
            fail("a request beyond the context was accepted");
        if (g.stops.size() > 4) fail("more than 4 stop strings");
        const smol_sampler_params & sp = g.sampler;
        if (!(sp.temperature >= 0 && sp.temperature <= 2) || !(sp.top_p >= 0 && sp.top_p <= 1) ||
            !(sp.min_p >= 0 && sp.min_p <= 1) || sp.top_k < 0)
            fail("a sampling parameter out of its range");
        if (g.top_logprobs < 0 || g.top_logprobs > server::max_top_logprobs ||
            (g.top_logprobs > 0 && !g.logprobs))
            fail("top_logprobs out of its range");
    } catch (const server::api_error & e) {
        if (e.status < 400 || e.status > 499) fail("an error outside 4xx");
        if (e.message.empty()) fail("an error without a message");
    }
    try {
        const server::embed_request r = server::parse_embed_request(served, body);
        if (r.inputs.empty() || r.inputs.size() > server::max_embed_inputs)
            fail("an embeddings request of no inputs or too many was accepted");
        for (const auto & ids : r.inputs) {
            if (ids.empty() || ids.size() > served.n_ctx) fail("an embeddings input out of bounds");
            for (smol_token t : ids)
                if (t < 0 || t >= n_vocab) fail("an embeddings id outside the vocabulary");
        }
    } catch (const server::api_error & e) {
        if (e.status < 400 || e.status > 499) fail("an error outside 4xx");
        if (e.message.empty()) fail("an error without a message");
    }
    try {
        // The Responses body through its chat body into the chat parser.
        server::parse_request(served, server::responses_as_chat(body), true);
    } catch (const server::api_error & e) {
        if (e.status < 400 || e.status > 499) fail("an error outside 4xx");
        if (e.message.empty()) fail("an error without a message");
    }
    for (bool to_ids : {true, false}) {
        try {
            const server::json out = to_ids ? server::tokenize_reply(served, body)
                                            : server::detokenize_reply(served, body);
            if (!out.is_object()) fail("a tokenizer route answered something else than an object");
        } catch (const server::api_error & e) {
            if (e.status < 400 || e.status > 499) fail("an error outside 4xx");
            if (e.message.empty()) fail("an error without a message");
        }
    }
    return 0;
}
