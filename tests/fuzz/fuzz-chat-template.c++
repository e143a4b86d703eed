// fuzz-chat-template.c++ - libFuzzer target: any bytes as a chat template
// and a conversation. The input splits at zero bytes: the template's text
// (none when the first byte is odd), then roles and contents in turn; the
// second byte's low bit asks for the assistant's turn. A template is
// applied or refused with a smol::error (syntax, unsupported construct,
// rejected conversation, step budget or depth limit), nothing else; the
// ChatML default holds every message's content, in order. A crash, a
// sanitizer report or a failed check traps.

#include "smol-chat.h"
#include "smol-error.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace {

void fail(const char * what) {
    std::fprintf(stderr, "fuzz-chat-template: %s\n", what);
    __builtin_trap();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    if (size < 2) return 0;
    const bool given = (data[0] & 1) == 0;
    const bool add_assistant = data[1] & 1;
    std::vector<std::string> parts(1);
    for (size_t i = 2; i < size; ++i) {
        if (data[i] == 0) {
            parts.emplace_back();
        } else {
            parts.back() += char(data[i]);
        }
    }
    const smol::chat_template t(parts[0], given);
    std::vector<smol::chat_message> messages;
    for (size_t i = 1; i + 1 < parts.size(); i += 2) {
        smol::chat_message m;
        m.role = parts[i];
        m.content = parts[i + 1];
        messages.push_back(std::move(m));
    }
    std::string out;
    try {
        out = t.apply(messages, add_assistant);
    } catch (const smol::error & e) {
        if (e.status != SMOL_ERR_UNSUPPORTED && e.status != SMOL_ERR_FORMAT &&
            e.status != SMOL_ERR_INVALID_ARGUMENT)
            fail("refused with a status other than UNSUPPORTED, FORMAT or INVALID_ARGUMENT");
        if (!given) fail("the ChatML default refused a conversation");
        return 0;
    }
    // The marked render is the same text, with caller ranges in order and
    // inside it; in ChatML each content lies wholly inside one.
    const smol::chat_template::marked marked = t.apply_marked(messages, add_assistant);
    if (marked.text != out) fail("apply_marked rendered another text than apply");
    size_t end = 0;
    for (const auto & [b, e] : marked.caller) {
        if (b < end || b >= e || e > out.size())
            fail("caller ranges out of order, empty, touching or past the text");
        end = e + 1;
    }
    if (given) return 0;
    size_t at = 0;
    for (const smol::chat_message & m : messages) {
        const size_t found = out.find(*m.content, at);
        if (found == std::string::npos) fail("a message's content is missing from the text");
        at = found + m.content->size();
    }
    // ChatML prints "<|im_start|>" role "\n" content "<|im_end|>\n": the
    // role and the content are caller data, the rest is not.
    const auto marked_as = [&](size_t b0, size_t e0, bool caller) {
        for (size_t i = b0; i < e0; i++) {
            bool inside = false;
            for (const auto & [b, e] : marked.caller) inside = inside || (b <= i && i < e);
            if (inside != caller) fail("ChatML's caller data and template text are marked wrong");
        }
    };
    const std::string open = "<|im_start|>", close = "<|im_end|>\n";
    at = 0;
    for (const smol::chat_message & m : messages) {
        marked_as(at, at + open.size(), false);
        at += open.size();
        marked_as(at, at + m.role.size(), true);
        at += m.role.size();
        marked_as(at, at + 1, false);
        at += 1;
        marked_as(at, at + m.content->size(), true);
        at += m.content->size();
        marked_as(at, at + close.size(), false);
        at += close.size();
    }
    marked_as(at, out.size(), false);
    return 0;
}
