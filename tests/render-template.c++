// render-template.c++ - renders chat templates with smol for
// scripts/check-templates.py: reads a JSON job (templates, conversations,
// a fixed clock) on stdin and writes, per template and conversation, the
// text smol renders or the error it gives, as JSON on stdout. It also
// renders each conversation with a marker appended to every content and
// name and fails if a marker lands outside the caller ranges (issue 37):
// whatever the template does with a message must stay caller data.
//
// Job: {"now": seconds, "templates": [{"name", "source", "bos_token",
// "eos_token"}], "cases": [{"messages": [OpenAI messages], "tools": [...]
// or null, "add_generation_prompt": bool}]}.

#include "smol-chat.h"
#include "smol-error.h"

#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

// ordered_json: the tools and tool calls keep their key order, as Python does.
using json = nlohmann::ordered_json;

namespace {

const char * k_marker = "<|caller|>";

// The caller ranges' bytes of each marker in the text, or the offset of
// the first marker outside them; npos if none is.
size_t unmarked_marker(const smol::chat_template::marked & m) {
    for (size_t at = m.text.find(k_marker); at != std::string::npos;
         at = m.text.find(k_marker, at + 1)) {
        const size_t end = at + std::char_traits<char>::length(k_marker);
        bool inside = false;
        for (const auto & [b, e] : m.caller) inside = inside || (b <= at && end <= e);
        if (!inside) return at;
    }
    return std::string::npos;
}

std::optional<std::string> text_field(const json & m, const char * key, bool dump) {
    if (!m.contains(key) || m[key].is_null()) return std::nullopt;
    if (dump) return m[key].dump();
    return m[key].get<std::string>();
}

} // namespace

int main() {
    const std::string input((std::istreambuf_iterator<char>(std::cin)),
                            std::istreambuf_iterator<char>());
    const json job = json::parse(input);
    const std::time_t now = job.value("now", std::time_t(0));
    json out = json::object();
    int leaks = 0;
    for (const json & t : job.at("templates")) {
        const smol::chat_template tmpl(t.at("source").get<std::string>(), true,
                                       t.value("bos_token", ""), t.value("eos_token", ""));
        json results = json::array();
        for (const json & c : job.at("cases")) {
            std::vector<smol::chat_message> messages;
            for (const json & m : c.at("messages")) {
                smol::chat_message msg;
                msg.role = m.at("role").get<std::string>();
                msg.content = text_field(m, "content", false);
                msg.name = text_field(m, "name", false);
                msg.tool_call_id = text_field(m, "tool_call_id", false);
                msg.tool_calls = text_field(m, "tool_calls", true);
                messages.push_back(std::move(msg));
            }
            const std::string tools =
                c.contains("tools") && !c["tools"].is_null() ? c["tools"].dump() : "";
            try {
                results.push_back(
                    {{"text", tmpl.apply(messages, c.at("add_generation_prompt"), tools, now)}});
            } catch (const smol::error & e) {
                results.push_back({{"error", e.what()}, {"status", smol_status_name(e.status)}});
                continue;
            }
            for (smol::chat_message & m : messages) {
                if (m.content) *m.content += k_marker;
                if (m.name) *m.name += k_marker;
            }
            try {
                const auto marked =
                    tmpl.apply_marked(messages, c.at("add_generation_prompt"), tools, now);
                const size_t at = unmarked_marker(marked);
                if (at != std::string::npos) {
                    std::fprintf(stderr, "%s, case %zu: caller text at byte %zu is not marked\n",
                                 t.at("name").get<std::string>().c_str(), results.size() - 1, at);
                    leaks++;
                }
            } catch (const smol::error &) {
                // A template may reject the marked text (a content it parses).
            }
        }
        out[t.at("name").get<std::string>()] = results;
    }
    // Invalid UTF-8 in a template's output would stop dump(); replace it.
    std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    return leaks ? 1 : 0;
}
