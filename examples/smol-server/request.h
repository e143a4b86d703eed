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
    // GBNF the output follows: from response_format (json_object, or
    // json_schema's schema) or llama-server's 'grammar'; empty: none.
    std::string grammar;
};

// The most bytes of a 'grammar' or of response_format's schema (413 past it).
constexpr size_t max_grammar_bytes = 64 * 1024;

// The body of POST /v1/chat/completions (chat) or /v1/completions: a
// request, or an api_error thrown with a 4xx status saying what is wrong.
gen_request parse_request(const served_model & m, const std::string & body, bool chat);

} // namespace server

#endif // SMOL_SERVER_REQUEST_H
