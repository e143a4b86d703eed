// smol-chat.c++ - chat templates (smol-chat.h).

#include "smol-chat.h"

#include "smol-error.h"

#include <string_view>

namespace smol {

namespace {

bool contains(std::string_view haystack, std::string_view needle) {
    return haystack.find(needle) != std::string_view::npos;
}

// Undoes the escapes of a Jinja string literal.
std::string jinja_unescape(std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size(); i++) {
        if (s[i] == '\\' && i + 1 < s.size()) {
            const char e = s[++i];
            out += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        } else {
            out += s[i];
        }
    }
    return out;
}

} // namespace

chat_template::chat_template(std::string text, bool given) : text_(std::move(text)) {
    // llama.cpp falls back to ChatML for a file without a template.
    chatml_ = !given || (contains(text_, "<|im_start|>") && contains(text_, "<|im_end|>"));
    if (!chatml_) return;
    // SmolLM2 (and Qwen) insert a fixed system message when the conversation
    // does not start with one; its text is the template's literal
    // '<|im_start|>system\n...<|im_end|>'.
    const std::string_view t = text_;
    for (const std::string_view head : {"<|im_start|>system\n", "<|im_start|>system\\n"}) {
        const size_t at = t.find(head);
        if (at == std::string_view::npos) continue;
        const size_t from = at + head.size();
        const size_t to = t.find("<|im_end|>", from);
        if (to == std::string_view::npos) continue;
        const std::string_view body = t.substr(from, to - from);
        // A body that leaves the string literal (template code building the
        // caller's own system message) is not a default.
        bool literal = !body.empty();
        for (size_t i = 0; i < body.size() && literal; i++) {
            if (body[i] == '\\') {
                i++;
            } else if (std::string_view("{}'\"+").find(body[i]) != std::string_view::npos) {
                literal = false;
            }
        }
        if (!literal) continue;
        if (!contains(t, "'system'") && !contains(t, "\"system\"")) continue;
        default_system_ = jinja_unescape(body);
        break;
    }
}

std::string chat_template::apply(const std::vector<chat_message> & messages,
                                 bool add_assistant) const {
    if (!chatml_) {
        std::string head = text_.substr(0, 120);
        throw error(SMOL_ERR_UNSUPPORTED,
                    "tokenizer.chat_template is not one smol knows: smol formats ChatML "
                    "templates, recognised by the markers <|im_start|> and <|im_end|>, and "
                    "this template lacks them (it begins \"" +
                        head + (text_.size() > head.size() ? "...\")" : "\")") +
                        "; format the prompt yourself and tokenize it with parse_special");
    }
    std::string out;
    const auto turn = [&](std::string_view role, std::string_view content) {
        out += "<|im_start|>";
        out += role;
        out += '\n';
        out += content;
        out += "<|im_end|>\n";
    };
    if (!messages.empty() && !default_system_.empty() && messages[0].role != "system") {
        turn("system", default_system_);
    }
    for (const chat_message & m : messages) turn(m.role, m.content);
    if (add_assistant) out += "<|im_start|>assistant\n";
    return out;
}

} // namespace smol
