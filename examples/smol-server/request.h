// request.h - smol-server's requests: OpenAI's JSON bodies for chat
// completions and completions checked and turned into what the engine runs
// (prompt tokens, sampler, limits, stop strings, streaming), or refused with
// an error in OpenAI's shape. No HTTP here: the server and the fuzz target
// of requests (tests/fuzz/fuzz-server-request.c++) share it.

#ifndef SMOL_SERVER_REQUEST_H
#define SMOL_SERVER_REQUEST_H

#include "smol.h"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace server {

using json = nlohmann::json;

// What requests are checked against: the model (its tokenizer and chat
// template), the id clients name it by, and the KV cells of the context.
struct served_model {
    const smol_model * model = nullptr;
    std::string id;
    uint32_t n_ctx = 0;
};

// A request the server refuses: the HTTP status and OpenAI's error fields.
struct api_error {
    int status;
    std::string message, type, param, code;
};

json error_body(const api_error & e);
api_error bad_request(const std::string & message, const std::string & param = "",
                      const std::string & code = "");

// A request as the engine runs it.
struct gen_request {
    std::vector<smol_token> prompt;
    smol_sampler_params sampler = smol_sampler_default_params();
    int32_t max_tokens = 0; // at least 1, and prompt + max_tokens within n_ctx
    std::vector<std::string> stops;
    bool stream = false;
    bool include_usage = false;
    bool ignore_eos = false; // llama-server's extension: generate max_tokens tokens
    // Log-probabilities of the tokens returned, from the model's own
    // distribution (the raw logits, before temperature and penalties), with
    // the top_logprobs most likely alternatives at each step.
    bool logprobs = false;
    int32_t top_logprobs = 0;
    int32_t n = 1; // choices, each with its own seed stream
    // Tools were offered (and tool_choice is not "none"): the reply is read
    // for tool calls in the model's syntax; at most one when
    // parallel_tool_calls is false.
    bool tools = false;
    bool parallel_tool_calls = true;
    // GBNF the output follows: from response_format (json_object, or
    // json_schema's schema) or llama-server's 'grammar'; empty: none.
    std::string grammar;
    // smol's extension: false keeps the request from speculating when the
    // server does (--lookup, --draft-model); the output is the same.
    bool speculative = true;
};

// The longest stop string a request may give.
constexpr size_t max_stop_bytes = 256;
// The most choices one request may ask for.
constexpr int32_t max_choices = 16;

// The most alternatives a token's logprobs may list (OpenAI's limit).
constexpr int32_t max_top_logprobs = 20;
// The most tools a request may offer, and the largest JSON text of them.
constexpr size_t max_tools = 128;
constexpr size_t max_tools_bytes = 256 * 1024;

// The most bytes of a 'grammar' or of response_format's schema (413 past it).
constexpr size_t max_grammar_bytes = 64 * 1024;

// The body of POST /v1/chat/completions (chat) or /v1/completions: a
// request, or an api_error thrown with a 4xx status saying what is wrong.
gen_request parse_request(const served_model & m, const std::string & body, bool chat);

// The body of POST /v1/responses (OpenAI's Responses API) as the chat
// completions body it asks for: instructions as the system message, the
// input's messages, function calls and their outputs as chat messages,
// function tools as chat tools, max_output_tokens as max_tokens. What it
// cannot map (stored responses, built-in tools, other item types) is an
// api_error naming the field.
std::string responses_as_chat(const std::string & body);

// The body of POST /v1/embeddings, checked: each input's tokens (a string,
// strings, token ids or lists of them), whether the vectors go out as
// base64 (encoding_format), or an api_error thrown.
struct embed_request {
    std::vector<std::vector<smol_token>> inputs;
    bool base64 = false;
};
// The most inputs one embeddings request may hold.
constexpr size_t max_embed_inputs = 256;
embed_request parse_embed_request(const served_model & m, const std::string & body);

// The bodies of POST /tokenize ({"content": text, "add_special": bool,
// "parse_special": bool, "with_pieces": bool}) and /detokenize ({"tokens":
// [ids]}), as llama-server's: the JSON answer, or an api_error thrown.
json tokenize_reply(const served_model & m, const std::string & body);
json detokenize_reply(const served_model & m, const std::string & body);

} // namespace server

#endif // SMOL_SERVER_REQUEST_H
