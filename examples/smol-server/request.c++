// request.c++ - smol-server's requests: JSON bodies checked and turned into
// gen_request (request.h).

#include "request.h"

#include <algorithm>
#include <deque>
#include <random>

namespace server {

json error_body(const api_error & e) {
    json err = {{"message", e.message}, {"type", e.type}};
    err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
    err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
    return json{{"error", err}};
}

api_error bad_request(const std::string & message, const std::string & param,
                      const std::string & code) {
    return {400, message, "invalid_request_error", param, code};
}

namespace {

const json & field(const json & body, const char * name) {
    static const json null_value;
    const auto it = body.find(name);
    return it == body.end() ? null_value : *it;
}

// Whether x is an id of a vocabulary of n_vocab tokens, checked as the
// JSON holds it: an id past int32 must not wrap into the vocabulary.
bool in_vocab(const json & x, int32_t n_vocab) {
    if (x.is_number_unsigned()) return x.get<uint64_t>() < uint64_t(n_vocab);
    return x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() < int64_t(n_vocab);
}

double get_number(const json & body, const char * name, double def, double lo, double hi) {
    const json & v = field(body, name);
    if (v.is_null()) return def;
    if (!v.is_number()) throw bad_request(std::string("'") + name + "' must be a number", name);
    const double x = v.get<double>();
    if (!(x >= lo && x <= hi)) {
        throw bad_request(std::string("'") + name + "' must be between " + std::to_string(lo) +
                              " and " + std::to_string(hi),
                          name);
    }
    return x;
}

std::vector<smol_token> tokenize(const served_model & m, const std::string & text) {
    int32_t n = 0;
    std::vector<smol_token> ids(text.size() + 8);
    smol_status s = smol_tokenize(m.model, text.data(), text.size(), true, true, ids.data(),
                                  int32_t(ids.size()), &n);
    if (s == SMOL_ERR_BUFFER_TOO_SMALL) {
        ids.resize(size_t(n));
        s = smol_tokenize(m.model, text.data(), text.size(), true, true, ids.data(), n, &n);
    }
    if (s != SMOL_OK)
        throw bad_request(std::string("cannot tokenize the prompt: ") + smol_last_error());
    ids.resize(size_t(n));
    return ids;
}

// The fields both endpoints share: model, sampling, limits, stop, stream.
gen_request parse_common(const served_model & m, const json & body) {
    gen_request g;
    const json & model = field(body, "model");
    if (!model.is_string()) throw bad_request("'model' is required and must be a string", "model");
    if (model.get<std::string>() != m.id) {
        throw api_error{404,
                        "The model '" + model.get<std::string>() +
                            "' does not exist; this server has '" + m.id + "'",
                        "invalid_request_error", "model", "model_not_found"};
    }
    const json & n = field(body, "n");
    if (!n.is_null()) {
        const bool ok =
            n.is_number_integer() &&
            (n.is_number_unsigned() ? n.get<uint64_t>() <= uint64_t(max_choices)
                                    : n.get<int64_t>() >= 1 && n.get<int64_t>() <= max_choices);
        if (!ok)
            throw bad_request("'n' must be an integer from 1 to " + std::to_string(max_choices),
                              "n");
        g.n = int32_t(n.get<int64_t>());
        if (g.n == 0) throw bad_request("'n' must be at least 1", "n");
    }
    g.sampler.temperature = float(get_number(body, "temperature", 1.0, 0.0, 2.0));
    g.sampler.top_p = float(get_number(body, "top_p", 1.0, 0.0, 1.0));
    g.sampler.top_k = int32_t(get_number(body, "top_k", 0, 0, 1e6));
    g.sampler.min_p = float(get_number(body, "min_p", 0.0, 0.0, 1.0));
    g.sampler.repeat_penalty = float(get_number(body, "repeat_penalty", 1.0, 0.0, 10.0));
    const json & seed = field(body, "seed");
    if (seed.is_null()) {
        g.sampler.seed = std::random_device{}();
    } else if (seed.is_number_integer()) {
        g.sampler.seed = uint64_t(seed.get<int64_t>());
    } else {
        throw bad_request("'seed' must be an integer", "seed");
    }
    for (const char * name : {"max_tokens", "max_completion_tokens"}) {
        const json & v = field(body, name);
        if (v.is_null()) continue;
        // An unsigned value past int64's range reads as a negative one.
        if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 1) ||
            (v.is_number_unsigned() && v.get<uint64_t>() < 1))
            throw bad_request(std::string("'") + name + "' must be a positive integer", name);
        g.max_tokens = int32_t(std::min<uint64_t>(
            v.is_number_unsigned() ? v.get<uint64_t>() : uint64_t(v.get<int64_t>()), INT32_MAX));
    }
    const json & stop = field(body, "stop");
    if (stop.is_string()) {
        g.stops.push_back(stop.get<std::string>());
    } else if (stop.is_array()) {
        if (stop.size() > 4) throw bad_request("'stop' holds at most 4 strings", "stop");
        for (const json & s : stop) {
            if (!s.is_string()) throw bad_request("'stop' must be a string or strings", "stop");
            g.stops.push_back(s.get<std::string>());
        }
    } else if (!stop.is_null()) {
        throw bad_request("'stop' must be a string or an array of strings", "stop");
    }
    g.stops.erase(std::remove(g.stops.begin(), g.stops.end(), std::string()), g.stops.end());
    for (const std::string & st : g.stops) {
        if (st.size() > max_stop_bytes)
            throw bad_request("a 'stop' string is " + std::to_string(st.size()) +
                                  " bytes; this server takes at most " +
                                  std::to_string(max_stop_bytes),
                              "stop");
    }
    const json & stream = field(body, "stream");
    if (!stream.is_null() && !stream.is_boolean())
        throw bad_request("'stream' must be a boolean", "stream");
    g.stream = stream.is_boolean() && stream.get<bool>();
    const json & ie = field(body, "ignore_eos");
    if (!ie.is_null() && !ie.is_boolean())
        throw bad_request("'ignore_eos' must be a boolean", "ignore_eos");
    g.ignore_eos = ie.is_boolean() && ie.get<bool>();
    const json & spec = field(body, "speculative");
    if (!spec.is_null() && !spec.is_boolean())
        throw bad_request("'speculative' must be a boolean", "speculative");
    g.speculative = !spec.is_boolean() || spec.get<bool>();
    const json & so = field(body, "stream_options");
    if (so.is_object() && so.contains("include_usage") && so["include_usage"].is_boolean())
        g.include_usage = so["include_usage"].get<bool>();
    return g;
}

// Chat: logprobs (a boolean) and top_logprobs (0-20, with logprobs);
// completions: logprobs (0-20 alternatives).
void parse_logprobs(const json & body, bool chat, gen_request & g) {
    const json & lp = field(body, "logprobs");
    const json & top = field(body, "top_logprobs");
    auto count = [](const json & v, const char * name) {
        const bool ok = v.is_number_integer() &&
                        (v.is_number_unsigned()
                             ? v.get<uint64_t>() <= uint64_t(max_top_logprobs)
                             : v.get<int64_t>() >= 0 && v.get<int64_t>() <= max_top_logprobs);
        if (!ok)
            throw bad_request(std::string("'") + name + "' must be an integer from 0 to " +
                                  std::to_string(max_top_logprobs),
                              name);
        return int32_t(v.get<int64_t>());
    };
    if (chat) {
        if (!lp.is_null() && !lp.is_boolean())
            throw bad_request("'logprobs' must be a boolean", "logprobs");
        g.logprobs = lp.is_boolean() && lp.get<bool>();
        if (!top.is_null()) {
            g.top_logprobs = count(top, "top_logprobs");
            if (!g.logprobs)
                throw bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
        }
    } else if (!lp.is_null()) {
        g.top_logprobs = count(lp, "logprobs");
        g.logprobs = true;
    }
}

api_error too_large(const std::string & what, size_t n, const std::string & param) {
    return {413,
            what + " is " + std::to_string(n) + " bytes; this server takes at most " +
                std::to_string(max_grammar_bytes),
            "invalid_request_error", param, "grammar_too_large"};
}

// GBNF for a reply that is one call of the named tool (empty: any of the
// tools), in the model's syntax: {"name": ..., "arguments": {...}} with
// the arguments the tool's parameters schema allows, inside Hermes's
// <tool_call> block, or alone with "parameters" for Llama 3.1's.
std::string tool_call_grammar(const served_model & m, const nlohmann::ordered_json & tools,
                              const std::string & name) {
    const std::string syntax = smol_chat_tool_syntax(m.model);
    if (syntax != "hermes" && syntax != "llama3") {
        throw bad_request("tool_choice: this model's tool-call syntax (" + syntax +
                              ") cannot be enforced yet; use \"auto\"",
                          "tool_choice");
    }
    nlohmann::ordered_json calls = nlohmann::ordered_json::array();
    for (size_t i = 0; i < tools.size(); ++i) {
        const auto & t = tools[i];
        const auto fn =
            t.is_object() && t.contains("function") ? t["function"] : nlohmann::ordered_json();
        if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string())
            throw bad_request("tools[" + std::to_string(i) + "] needs function.name", "tools");
        if (!name.empty() && fn["name"] != name) continue;
        nlohmann::ordered_json params = fn.contains("parameters") && fn["parameters"].is_object()
                                            ? fn["parameters"]
                                            : nlohmann::ordered_json{{"type", "object"}};
        const std::string args = syntax == "llama3" ? "parameters" : "arguments";
        calls.push_back({{"type", "object"},
                         {"properties", {{"name", {{"const", fn["name"]}}}, {args, params}}},
                         {"required", {"name", args}}});
    }
    if (calls.empty())
        throw bad_request("tool_choice names '" + name + "', which is not among 'tools'",
                          "tool_choice");
    const std::string schema =
        calls.size() == 1 ? calls[0].dump() : nlohmann::ordered_json{{"anyOf", calls}}.dump();
    size_t n = 0;
    std::string gbnf;
    smol_status s = smol_json_schema_to_grammar(schema.c_str(), nullptr, 0, &n);
    if (s == SMOL_ERR_BUFFER_TOO_SMALL) {
        gbnf.resize(n);
        s = smol_json_schema_to_grammar(schema.c_str(), &gbnf[0], n, &n);
        gbnf.resize(n - 1);
    }
    if (s != SMOL_OK)
        throw bad_request(std::string("a tool's parameters: ") + smol_last_error(), "tools");
    // The schema's start rule becomes "call", under a root of the syntax.
    const size_t at = gbnf.rfind("root ::=", 0) == 0 ? 0 : gbnf.find("\nroot ::=");
    if (at == std::string::npos) throw bad_request("a tool's parameters gave no grammar", "tools");
    gbnf.replace(at == 0 ? 0 : at + 1, 4, "call");
    const std::string root = syntax == "hermes"
                                 ? "root ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"\n"
                                 : "root ::= call\n";
    if (gbnf.size() + root.size() > max_grammar_bytes)
        throw too_large("the tools' call grammar", gbnf.size() + root.size(), "tools");
    return root + gbnf;
}

// The grammar of response_format or 'grammar', checked by the library
// against the model's vocabulary: a fault is a 400 naming the field.
void parse_grammar(const served_model & m, const json & body, const std::string & text,
                   gen_request & g) {
    const json & rf = field(body, "response_format");
    const json & gr = field(body, "grammar");
    if (!rf.is_null() && !gr.is_null())
        throw bad_request("'response_format' and 'grammar' cannot both be given", "grammar");
    if (!gr.is_null()) {
        if (!gr.is_string()) throw bad_request("'grammar' must be a string (GBNF)", "grammar");
        g.grammar = gr.get<std::string>();
        if (g.grammar.size() > max_grammar_bytes)
            throw too_large("'grammar'", g.grammar.size(), "grammar");
    } else if (!rf.is_null()) {
        if (!rf.is_object() || !field(rf, "type").is_string())
            throw bad_request("'response_format' must be an object with a string 'type'",
                              "response_format");
        const std::string type = rf["type"].get<std::string>();
        std::string schema;
        if (type == "json_object") {
            schema = R"({"type":"object"})";
        } else if (type == "json_schema") {
            const json & js = field(rf, "json_schema");
            if (!js.is_object() || !field(js, "schema").is_object())
                throw bad_request("'response_format.json_schema.schema' must be an object (a "
                                  "JSON schema)",
                                  "response_format");
            // Read again in the client's key order: properties come in the
            // schema's order.
            schema = nlohmann::ordered_json::parse(text)["response_format"]["json_schema"]["schema"]
                         .dump();
            if (schema.size() > max_grammar_bytes)
                throw too_large("'response_format.json_schema.schema'", schema.size(),
                                "response_format");
        } else if (type != "text") {
            throw bad_request("'response_format.type' must be 'text', 'json_object' or "
                              "'json_schema', not '" +
                                  type + "'",
                              "response_format");
        }
        if (!schema.empty()) {
            size_t n = 0;
            smol_status s = smol_json_schema_to_grammar(schema.c_str(), nullptr, 0, &n);
            if (s == SMOL_ERR_BUFFER_TOO_SMALL) {
                g.grammar.resize(n);
                s = smol_json_schema_to_grammar(schema.c_str(), &g.grammar[0], n, &n);
                g.grammar.resize(n - 1);
            }
            if (s != SMOL_OK)
                throw bad_request(std::string("'response_format': ") + smol_last_error(),
                                  "response_format");
        }
    }
    if (g.grammar.empty()) return;
    smol_sampler * s = nullptr;
    const smol_sampler_params sp = smol_sampler_default_params();
    if (smol_sampler_create(&sp, &s) != SMOL_OK) throw bad_request(smol_last_error());
    const smol_status st = smol_sampler_set_grammar(s, m.model, g.grammar.c_str());
    const std::string why = smol_last_error();
    smol_sampler_free(s);
    if (st != SMOL_OK) {
        const bool tools = gr.is_null() && rf.is_null();
        throw bad_request(tools ? "the tools gave a call grammar smol cannot use: " + why
                          : gr.is_null()
                              ? "'response_format' gave a grammar smol cannot use: " + why
                              : "'grammar': " + why,
                          tools          ? "tools"
                          : gr.is_null() ? "response_format"
                                         : "grammar");
    }
}

void check_length(const served_model & m, gen_request & g) {
    const int64_t n_prompt = int64_t(g.prompt.size());
    if (n_prompt >= int64_t(m.n_ctx)) {
        throw bad_request("the prompt has " + std::to_string(n_prompt) +
                              " tokens; this server's context holds " + std::to_string(m.n_ctx),
                          "messages", "context_length_exceeded");
    }
    if (g.max_tokens == 0) g.max_tokens = int32_t(m.n_ctx - n_prompt);
    if (n_prompt + g.max_tokens > int64_t(m.n_ctx)) {
        throw bad_request("max_tokens " + std::to_string(g.max_tokens) + " with a " +
                              std::to_string(n_prompt) + "-token prompt is beyond the context of " +
                              std::to_string(m.n_ctx) + " tokens",
                          "max_tokens", "context_length_exceeded");
    }
}

std::string message_text(const json & content, size_t i) {
    if (content.is_string()) return content.get<std::string>();
    if (content.is_array()) {
        std::string text;
        for (const json & part : content) {
            if (!part.is_object() || field(part, "type") != "text" ||
                !field(part, "text").is_string())
                throw bad_request("messages[" + std::to_string(i) +
                                      "].content: only text parts are supported",
                                  "messages");
            text += part["text"].get<std::string>();
        }
        return text;
    }
    throw bad_request("messages[" + std::to_string(i) + "].content must be a string", "messages");
}

gen_request parse_chat(const served_model & m, const json & body, const std::string & text) {
    gen_request g = parse_common(m, body);
    const json & messages = field(body, "messages");
    if (!messages.is_array() || messages.empty())
        throw bad_request("'messages' must be a non-empty array", "messages");
    parse_logprobs(body, true, g);
    const json & tools = field(body, "tools");
    if (!tools.is_null() && !tools.is_array())
        throw bad_request("'tools' must be an array", "tools");
    if (tools.is_array() && tools.size() > max_tools)
        throw bad_request("'tools' holds " + std::to_string(tools.size()) +
                              " tools; this server takes at most " + std::to_string(max_tools),
                          "tools");
    const json & choice = field(body, "tool_choice");
    const bool named = choice.is_object() && field(choice, "type") == "function" &&
                       field(choice, "function").is_object() &&
                       field(choice["function"], "name").is_string();
    if (!choice.is_null() && choice != "auto" && choice != "none" && choice != "required" &&
        !named) {
        throw bad_request("'tool_choice' must be \"auto\", \"none\", \"required\" or "
                          "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                          "tool_choice");
    }
    g.tools = tools.is_array() && !tools.empty() && choice != "none";
    const bool forced = choice == "required" || named;
    if (forced && !g.tools)
        throw bad_request("tool_choice " + choice.dump() + " needs 'tools'", "tool_choice");
    const json & parallel = field(body, "parallel_tool_calls");
    if (!parallel.is_null() && !parallel.is_boolean())
        throw bad_request("'parallel_tool_calls' must be a boolean", "parallel_tool_calls");
    g.parallel_tool_calls = !parallel.is_boolean() || parallel.get<bool>();
    bool calls = false;
    for (const json & msg : messages)
        calls = calls || (msg.is_object() && msg.contains("tool_calls"));
    // Tools and tool calls reach the template as JSON text in the client's
    // key order (templates print them with tojson), which json's sorted
    // objects lose: they are read again, in order, when a request has them.
    nlohmann::ordered_json ordered;
    if (!tools.is_null() || calls) ordered = nlohmann::ordered_json::parse(text);
    // Every string the messages point into, kept still (a deque: no moves).
    std::deque<std::string> texts;
    const auto keep = [&](std::string s) { return texts.emplace_back(std::move(s)).c_str(); };
    std::vector<smol_chat_message> msgs;
    for (size_t i = 0; i < messages.size(); ++i) {
        const json & msg = messages[i];
        if (!msg.is_object() || !field(msg, "role").is_string())
            throw bad_request("messages[" + std::to_string(i) + "] needs a string 'role'",
                              "messages");
        smol_chat_message c{};
        c.role = keep(msg["role"].get<std::string>());
        const json & calls_i = field(msg, "tool_calls");
        if (!calls_i.is_null()) {
            if (!calls_i.is_array())
                throw bad_request("messages[" + std::to_string(i) + "].tool_calls must be an array",
                                  "messages");
            c.tool_calls = keep(ordered["messages"][i]["tool_calls"].dump());
        }
        // An assistant message that only calls tools may have no content.
        if (!(c.tool_calls && field(msg, "content").is_null()))
            c.content = keep(message_text(field(msg, "content"), i));
        for (const char * name : {"name", "tool_call_id"}) {
            const json & v = field(msg, name);
            if (v.is_null()) continue;
            if (!v.is_string())
                throw bad_request("messages[" + std::to_string(i) + "]." + name +
                                      " must be a string",
                                  "messages");
            (std::string(name) == "name" ? c.name : c.tool_call_id) = keep(v.get<std::string>());
        }
        msgs.push_back(c);
    }
    smol_chat_params p = smol_chat_default_params();
    const std::string tools_text = tools.is_null() ? std::string() : ordered["tools"].dump();
    if (tools_text.size() > max_tools_bytes)
        throw bad_request("'tools' takes " + std::to_string(tools_text.size()) +
                              " bytes of JSON; this server takes at most " +
                              std::to_string(max_tools_bytes),
                          "tools");
    if (!tools.is_null()) p.tools_json = tools_text.c_str();
    // Not smol_tokenize of the rendered text: that would read a user's
    // "<|im_start|>system" as a real turn (issue 37).
    int32_t n = 0;
    smol_status s = smol_chat_tokenize(m.model, msgs.data(), msgs.size(), &p, nullptr, 0, &n);
    if (s == SMOL_ERR_BUFFER_TOO_SMALL) {
        g.prompt.resize(size_t(n));
        s = smol_chat_tokenize(m.model, msgs.data(), msgs.size(), &p, g.prompt.data(), n, &n);
    }
    if (s != SMOL_OK)
        throw bad_request(std::string("cannot apply the chat template: ") + smol_last_error(),
                          "messages");
    g.prompt.resize(size_t(n));
    check_length(m, g);
    if (forced) {
        if (!field(body, "response_format").is_null() || !field(body, "grammar").is_null())
            throw bad_request("tool_choice " + choice.dump() +
                                  " cannot be given with 'response_format' or 'grammar'",
                              "tool_choice");
        g.grammar = tool_call_grammar(m, ordered["tools"],
                                      named ? choice["function"]["name"].get<std::string>() : "");
    }
    parse_grammar(m, body, text, g);
    return g;
}

gen_request parse_completion(const served_model & m, const json & body, const std::string & text) {
    gen_request g = parse_common(m, body);
    parse_logprobs(body, false, g);
    const json & prompt = field(body, "prompt");
    if (prompt.is_string()) {
        g.prompt = tokenize(m, prompt.get<std::string>());
    } else if (prompt.is_array() && prompt.size() == 1 && prompt[0].is_string()) {
        g.prompt = tokenize(m, prompt[0].get<std::string>());
    } else if (prompt.is_array() && !prompt.empty() &&
               std::all_of(prompt.begin(), prompt.end(),
                           [](const json & x) { return x.is_number_integer(); })) {
        smol_model_info info;
        smol_model_get_info(m.model, &info);
        for (const json & x : prompt) {
            if (!in_vocab(x, info.n_vocab)) {
                throw bad_request("'prompt' holds the token id " + x.dump() +
                                      ", which is not in the model's vocabulary of " +
                                      std::to_string(info.n_vocab) + " tokens",
                                  "prompt");
            }
            g.prompt.push_back(smol_token(x.get<int64_t>()));
        }
    } else {
        throw bad_request("'prompt' must be a string (or one string, or token ids)", "prompt");
    }
    if (g.prompt.empty()) throw bad_request("'prompt' is empty", "prompt");
    check_length(m, g);
    parse_grammar(m, body, text, g);
    return g;
}

json parse_body(const std::string & text) {
    json body;
    try {
        body = json::parse(text);
    } catch (const json::exception & e) {
        // Not only syntax: a number past a double's range (1e999) is an
        // out_of_range error of the parser.
        throw bad_request(std::string("the body is not valid JSON: ") + e.what());
    }
    if (!body.is_object()) throw bad_request("the body must be a JSON object");
    return body;
}

bool get_bool(const json & body, const char * name, bool def) {
    const json & v = field(body, name);
    if (v.is_null()) return def;
    if (!v.is_boolean()) throw bad_request(std::string("'") + name + "' must be a boolean", name);
    return v.get<bool>();
}

std::string piece_of(const served_model & m, smol_token t) {
    char buf[256];
    size_t n = 0;
    if (smol_token_to_piece(m.model, t, true, buf, sizeof buf, &n) != SMOL_OK) return "";
    return std::string(buf, n);
}

} // namespace

gen_request parse_request(const served_model & m, const std::string & text, bool chat) {
    const json body = parse_body(text);
    return chat ? parse_chat(m, body, text) : parse_completion(m, body, text);
}

std::string responses_as_chat(const std::string & text) {
    // Key order kept: tools and arguments reach the template as written.
    nlohmann::ordered_json body;
    try {
        body = nlohmann::ordered_json::parse(text);
    } catch (const std::exception & e) {
        throw bad_request(std::string("the body is not valid JSON: ") + e.what());
    }
    if (!body.is_object()) throw bad_request("the body must be a JSON object");
    for (const char * unsupported : {"previous_response_id", "conversation"}) {
        if (body.contains(unsupported) && !body[unsupported].is_null())
            throw bad_request(std::string("'") + unsupported +
                                  "' is not supported: this server stores no responses; send "
                                  "the whole conversation in 'input'",
                              unsupported);
    }
    if (body.contains("text") && body["text"].is_object() && body["text"].contains("format") &&
        !(body["text"]["format"].is_object() && body["text"]["format"].value("type", "") == "text"))
        throw bad_request("text.format other than {\"type\": \"text\"} is not supported yet",
                          "text");
    nlohmann::ordered_json chat = nlohmann::ordered_json::object();
    chat["model"] = body.contains("model") ? body["model"] : nlohmann::ordered_json(nullptr);
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (body.contains("instructions") && !body["instructions"].is_null()) {
        if (!body["instructions"].is_string())
            throw bad_request("'instructions' must be a string", "instructions");
        messages.push_back({{"role", "system"}, {"content", body["instructions"]}});
    }
    const auto & input = body.contains("input") ? body["input"] : nlohmann::ordered_json();
    if (input.is_string()) {
        messages.push_back({{"role", "user"}, {"content", input}});
    } else if (input.is_array()) {
        for (size_t i = 0; i < input.size(); ++i) {
            const auto & item = input[i];
            const std::string where = "input[" + std::to_string(i) + "]";
            if (!item.is_object()) throw bad_request(where + " must be an object", "input");
            const std::string type = item.value("type", "message");
            if (type == "message") {
                const std::string role = item.value("role", "");
                if (role != "user" && role != "assistant" && role != "system" &&
                    role != "developer")
                    throw bad_request(where + ".role must be user, assistant, system or developer",
                                      "input");
                std::string content;
                const auto & c =
                    item.contains("content") ? item["content"] : nlohmann::ordered_json();
                if (c.is_string()) {
                    content = c.get<std::string>();
                } else if (c.is_array()) {
                    for (const auto & part : c) {
                        const std::string pt = part.is_object() ? part.value("type", "") : "";
                        if ((pt != "input_text" && pt != "output_text" && pt != "text") ||
                            !part.contains("text") || !part["text"].is_string())
                            throw bad_request(where + ".content: only input_text and output_text "
                                                      "parts are supported",
                                              "input");
                        content += part["text"].get<std::string>();
                    }
                } else {
                    throw bad_request(where + ".content must be a string or parts", "input");
                }
                messages.push_back(
                    {{"role", role == "developer" ? "system" : role}, {"content", content}});
            } else if (type == "function_call") {
                if (!item.contains("call_id") || !item["call_id"].is_string() ||
                    !item.contains("name") || !item["name"].is_string() ||
                    !item.contains("arguments") || !item["arguments"].is_string())
                    throw bad_request(where + " needs string call_id, name and arguments", "input");
                const nlohmann::ordered_json call = {
                    {"id", item["call_id"]},
                    {"type", "function"},
                    {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}};
                // Calls one after another are one assistant turn.
                if (!messages.empty() && messages.back()["role"] == "assistant" &&
                    messages.back().contains("tool_calls")) {
                    messages.back()["tool_calls"].push_back(call);
                } else {
                    messages.push_back({{"role", "assistant"},
                                        {"content", nullptr},
                                        {"tool_calls", nlohmann::ordered_json::array({call})}});
                }
            } else if (type == "function_call_output") {
                if (!item.contains("call_id") || !item["call_id"].is_string() ||
                    !item.contains("output") || !item["output"].is_string())
                    throw bad_request(where + " needs string call_id and output", "input");
                messages.push_back({{"role", "tool"},
                                    {"tool_call_id", item["call_id"]},
                                    {"content", item["output"]}});
            } else {
                throw bad_request(where + " of type '" + type +
                                      "' is not supported; message, function_call and "
                                      "function_call_output are",
                                  "input");
            }
        }
    } else {
        throw bad_request("'input' must be a string or an array of items", "input");
    }
    if (messages.empty()) throw bad_request("'input' is empty", "input");
    chat["messages"] = messages;
    if (body.contains("tools") && !body["tools"].is_null()) {
        if (!body["tools"].is_array()) throw bad_request("'tools' must be an array", "tools");
        nlohmann::ordered_json tools = nlohmann::ordered_json::array();
        for (const auto & t : body["tools"]) {
            if (!t.is_object() || t.value("type", "") != "function" || !t.contains("name"))
                throw bad_request("only function tools are supported ({\"type\": \"function\", "
                                  "\"name\": ...})",
                                  "tools");
            nlohmann::ordered_json fn = {{"name", t["name"]}};
            for (const char * k : {"description", "parameters", "strict"})
                if (t.contains(k)) fn[k] = t[k];
            tools.push_back({{"type", "function"}, {"function", fn}});
        }
        chat["tools"] = tools;
    }
    for (const char * k :
         {"tool_choice", "parallel_tool_calls", "temperature", "top_p", "stream", "seed"}) {
        if (body.contains(k)) chat[k] = body[k];
    }
    if (body.contains("max_output_tokens")) chat["max_tokens"] = body["max_output_tokens"];
    return chat.dump();
}

embed_request parse_embed_request(const served_model & m, const std::string & text) {
    const json body = parse_body(text);
    const json & model = field(body, "model");
    if (!model.is_null() && (!model.is_string() || model.get<std::string>() != m.id)) {
        throw api_error{
            404, "The model " + model.dump() + " does not exist; this server has '" + m.id + "'",
            "invalid_request_error", "model", "model_not_found"};
    }
    embed_request r;
    const json & fmt = field(body, "encoding_format");
    if (!fmt.is_null() && fmt != "float" && fmt != "base64")
        throw bad_request("'encoding_format' must be \"float\" or \"base64\"", "encoding_format");
    r.base64 = fmt == "base64";
    smol_model_info info;
    smol_model_get_info(m.model, &info);
    const json & dims = field(body, "dimensions");
    if (!dims.is_null() && (!dims.is_number_integer() || dims.get<int64_t>() != info.n_embd)) {
        throw bad_request("'dimensions': this model's embeddings have " +
                              std::to_string(info.n_embd) + " dimensions, no other",
                          "dimensions");
    }
    const json & input = field(body, "input");
    auto ids_of = [&](const json & list, size_t i) {
        std::vector<smol_token> ids;
        for (const json & x : list) {
            if (!in_vocab(x, info.n_vocab))
                throw bad_request("input " + std::to_string(i) + " holds " + x.dump() +
                                      ", which is not an id of the model's vocabulary",
                                  "input");
            ids.push_back(smol_token(x.get<int64_t>()));
        }
        return ids;
    };
    auto all_ints = [](const json & a) {
        return a.is_array() &&
               std::all_of(a.begin(), a.end(), [](const json & x) { return x.is_number(); });
    };
    std::vector<const json *> items;
    if (input.is_string() || all_ints(input)) {
        items.push_back(&input);
    } else if (input.is_array()) {
        for (const json & x : input) items.push_back(&x);
    } else {
        throw bad_request("'input' must be a string, strings, token ids or lists of them", "input");
    }
    if (items.empty()) throw bad_request("'input' is empty", "input");
    if (items.size() > max_embed_inputs)
        throw bad_request("'input' holds " + std::to_string(items.size()) +
                              " inputs; this server takes at most " +
                              std::to_string(max_embed_inputs),
                          "input");
    for (size_t i = 0; i < items.size(); ++i) {
        const json & x = *items[i];
        std::vector<smol_token> ids;
        if (x.is_string()) {
            ids = tokenize(m, x.get<std::string>());
        } else if (all_ints(x)) {
            ids = ids_of(x, i);
        } else {
            throw bad_request(
                "input " + std::to_string(i) + " must be a string or a list of token ids", "input");
        }
        if (ids.empty()) throw bad_request("input " + std::to_string(i) + " is empty", "input");
        if (ids.size() > m.n_ctx)
            throw bad_request("input " + std::to_string(i) + " has " + std::to_string(ids.size()) +
                                  " tokens; this server's context holds " + std::to_string(m.n_ctx),
                              "input", "context_length_exceeded");
        r.inputs.push_back(std::move(ids));
    }
    return r;
}

json tokenize_reply(const served_model & m, const std::string & text) {
    const json body = parse_body(text);
    const json & content = field(body, "content");
    if (!content.is_string()) throw bad_request("'content' must be a string", "content");
    const std::string s = content.get<std::string>();
    const bool add_special = get_bool(body, "add_special", false);
    const bool parse_special = get_bool(body, "parse_special", true);
    const bool with_pieces = get_bool(body, "with_pieces", false);
    std::vector<smol_token> ids(s.size() + 8);
    int32_t n = 0;
    smol_status st = smol_tokenize(m.model, s.data(), s.size(), add_special, parse_special,
                                   ids.data(), int32_t(ids.size()), &n);
    if (st == SMOL_ERR_BUFFER_TOO_SMALL) {
        ids.resize(size_t(n));
        st = smol_tokenize(m.model, s.data(), s.size(), add_special, parse_special, ids.data(), n,
                           &n);
    }
    if (st != SMOL_OK)
        throw bad_request(std::string("cannot tokenize 'content': ") + smol_last_error(),
                          "content");
    ids.resize(size_t(n));
    json tokens = json::array();
    for (smol_token t : ids) {
        if (with_pieces) {
            tokens.push_back({{"id", t}, {"piece", piece_of(m, t)}});
        } else {
            tokens.push_back(t);
        }
    }
    return json{{"tokens", tokens}};
}

json detokenize_reply(const served_model & m, const std::string & text) {
    const json body = parse_body(text);
    const json & tokens = field(body, "tokens");
    if (!tokens.is_array()) throw bad_request("'tokens' must be an array of ids", "tokens");
    smol_model_info info;
    smol_model_get_info(m.model, &info);
    std::string out;
    for (const json & x : tokens) {
        if (!in_vocab(x, info.n_vocab)) {
            throw bad_request("'tokens' holds " + x.dump() +
                                  ", which is not an id of the model's vocabulary of " +
                                  std::to_string(info.n_vocab) + " tokens",
                              "tokens");
        }
        out += piece_of(m, smol_token(x.get<int64_t>()));
    }
    return json{{"content", out}};
}

} // namespace server
