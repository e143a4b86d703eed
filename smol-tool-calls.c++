// smol-tool-calls.c++ - tool calls read back from a model's reply (see
// smol-tool-calls.h), through smol's own JSON reader (smol-jinja-value.h).

#include "smol-tool-calls.h"

#include "smol-jinja-value.h"

#include <algorithm>
#include <optional>

namespace smol {

namespace {

constexpr std::string_view k_hermes_open = "<tool_call>", k_hermes_close = "</tool_call>";
constexpr std::string_view k_python_tag = "<|python_tag|>";
constexpr std::string_view k_mistral_open = "[TOOL_CALLS]", k_mistral_args = "[ARGS]";

std::string_view trim(std::string_view s) {
    const auto space = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
    while (!s.empty() && space(s.front())) s.remove_prefix(1);
    while (!s.empty() && space(s.back())) s.remove_suffix(1);
    return s;
}

std::optional<jinja::value> json_of(std::string_view text) {
    try {
        return jinja::parse_json(trim(text));
    } catch (const jinja::failure &) {
        return std::nullopt;
    }
}

// Arguments as JSON text of an object: an object as written, or a string
// that holds one (some models quote them).
std::optional<std::string> arguments_of(const jinja::value * a) {
    if (!a) return std::string("{}");
    if (a->is_dict()) return jinja::to_json(*a);
    if (a->is_string()) {
        const std::optional<jinja::value> inner = json_of(a->str());
        if (inner && inner->is_dict()) return jinja::to_json(*inner);
    }
    return std::nullopt;
}

// {"name": ..., "arguments" (or "parameters"): {...}}
std::optional<tool_call> call_of(const jinja::value & v) {
    if (!v.is_dict()) return std::nullopt;
    const jinja::value * name = v.entries().find("name");
    if (!name || !name->is_string() || name->str().empty()) return std::nullopt;
    const jinja::value * args = v.entries().find("arguments");
    if (!args) args = v.entries().find("parameters");
    const std::optional<std::string> a = arguments_of(args);
    if (!a) return std::nullopt;
    return tool_call{name->str(), *a};
}

// A JSON object or a list of them, each a call; nothing if any is not.
std::optional<std::vector<tool_call>> calls_of(std::string_view text) {
    const std::optional<jinja::value> v = json_of(text);
    if (!v) return std::nullopt;
    std::vector<tool_call> out;
    if (v->is_list()) {
        for (const jinja::value & item : v->items()) {
            std::optional<tool_call> c = call_of(item);
            if (!c) return std::nullopt;
            out.push_back(std::move(*c));
        }
        if (out.empty()) return std::nullopt;
        return out;
    }
    std::optional<tool_call> c = call_of(*v);
    if (!c) return std::nullopt;
    out.push_back(std::move(*c));
    return out;
}

tool_reply parse_hermes(std::string_view text) {
    tool_reply r;
    std::string content;
    size_t at = 0;
    while (at < text.size()) {
        const size_t open = text.find(k_hermes_open, at);
        if (open == std::string_view::npos) break;
        const size_t body = open + k_hermes_open.size();
        size_t close = text.find(k_hermes_close, body);
        const size_t end =
            close == std::string_view::npos ? text.size() : close + k_hermes_close.size();
        if (close == std::string_view::npos) close = text.size();
        const std::optional<std::vector<tool_call>> calls =
            calls_of(text.substr(body, close - body));
        content.append(text.substr(at, open - at));
        if (calls) {
            r.calls.insert(r.calls.end(), calls->begin(), calls->end());
        } else {
            content.append(text.substr(open, end - open)); // not a call: text
        }
        at = end;
    }
    if (at < text.size()) content.append(text.substr(at));
    r.content = std::string(trim(content));
    return r;
}

tool_reply parse_llama3(std::string_view text) {
    std::string_view body = trim(text);
    if (body.substr(0, k_python_tag.size()) == k_python_tag)
        body.remove_prefix(k_python_tag.size());
    tool_reply r;
    if (const auto calls = calls_of(body)) {
        r.calls = *calls;
        return r;
    }
    // Several calls, one object each, separated by ';'.
    std::vector<tool_call> calls;
    size_t at = 0;
    while (at <= body.size()) {
        size_t semi = body.find(';', at);
        if (semi == std::string_view::npos) semi = body.size();
        const auto one = calls_of(body.substr(at, semi - at));
        if (!one || one->size() != 1) {
            calls.clear();
            break;
        }
        calls.push_back((*one)[0]);
        at = semi + 1;
    }
    if (calls.size() > 1) {
        r.calls = std::move(calls);
    } else {
        r.content = std::string(trim(text));
    }
    return r;
}

tool_reply parse_mistral(std::string_view text) {
    tool_reply r;
    const size_t open = text.find(k_mistral_open);
    if (open == std::string_view::npos) {
        r.content = std::string(trim(text));
        return r;
    }
    const std::string_view rest = text.substr(open + k_mistral_open.size());
    if (auto calls = calls_of(rest)) {
        r.calls = std::move(*calls);
    } else {
        // The newer form: name[ARGS]{...}, one after another.
        std::vector<tool_call> found;
        std::string_view s = rest;
        while (!trim(s).empty()) {
            const size_t args = s.find(k_mistral_args);
            if (args == std::string_view::npos) {
                found.clear();
                break;
            }
            const std::string name(trim(s.substr(0, args)));
            s.remove_prefix(args + k_mistral_args.size());
            const size_t next = s.find(k_mistral_open);
            const std::string_view json = s.substr(0, next);
            const std::optional<jinja::value> v = json_of(json);
            const std::optional<std::string> a = v ? arguments_of(&*v) : std::nullopt;
            if (name.empty() || !a) {
                found.clear();
                break;
            }
            found.push_back({name, *a});
            s = next == std::string_view::npos ? std::string_view()
                                               : s.substr(next + k_mistral_open.size());
        }
        if (found.empty()) {
            r.content = std::string(trim(text));
            return r;
        }
        r.calls = std::move(found);
    }
    r.content = std::string(trim(text.substr(0, open)));
    return r;
}

// The offset of marker in text, or of a tail of text that begins it.
size_t marker_start(std::string_view text, std::string_view marker) {
    const size_t at = text.find(marker);
    if (at != std::string_view::npos) return at;
    for (size_t k = std::min(marker.size() - 1, text.size()); k > 0; --k) {
        if (text.substr(text.size() - k) == marker.substr(0, k)) return text.size() - k;
    }
    return std::string_view::npos;
}

} // namespace

tool_syntax tool_syntax_of(std::string_view t) {
    if (t.find(k_mistral_open) != std::string_view::npos) return tool_syntax::mistral;
    if (t.find(k_python_tag) != std::string_view::npos ||
        (t.find("ipython") != std::string_view::npos &&
         t.find("parameters") != std::string_view::npos))
        return tool_syntax::llama3;
    return tool_syntax::hermes;
}

const char * tool_syntax_name(tool_syntax s) {
    switch (s) {
    case tool_syntax::hermes:
        return "hermes";
    case tool_syntax::llama3:
        return "llama3";
    case tool_syntax::mistral:
        return "mistral";
    }
    return "hermes";
}

tool_reply parse_tool_calls(std::string_view text, tool_syntax s) {
    switch (s) {
    case tool_syntax::llama3:
        return parse_llama3(text);
    case tool_syntax::mistral:
        return parse_mistral(text);
    case tool_syntax::hermes:
        break;
    }
    return parse_hermes(text);
}

size_t tool_call_start(std::string_view text, tool_syntax s) {
    switch (s) {
    case tool_syntax::llama3: {
        // The whole reply is the call: it opens with '{' or the python tag.
        const size_t first = text.find_first_not_of(" \n\t\r");
        if (first == std::string_view::npos) return text.empty() ? std::string_view::npos : 0;
        const std::string_view head = text.substr(first);
        if (head[0] == '{' || head[0] == '[') return 0;
        if (marker_start(head, k_python_tag) == 0) return 0;
        return std::string_view::npos;
    }
    case tool_syntax::mistral:
        return marker_start(text, k_mistral_open);
    case tool_syntax::hermes:
        break;
    }
    return marker_start(text, k_hermes_open);
}

} // namespace smol
