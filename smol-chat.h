// smol-chat.h - chat templates: a model's tokenizer.chat_template, parsed
// once by smol's Jinja interpreter (smol-jinja.h), turned into the text of a
// conversation as Hugging Face's apply_chat_template renders it. A file
// without a template gets ChatML, as llama.cpp gives it.

#ifndef SMOL_CHAT_H
#define SMOL_CHAT_H

#include "smol.h"

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace smol {

namespace jinja {
class template_program;
}
class vocab;

struct chat_message {
    std::string role;
    // Absent: a message that only carries tool_calls (the template sees "",
    // as llama.cpp gives it).
    std::optional<std::string> content;
    std::optional<std::string> name;         // a tool's or a participant's name
    std::optional<std::string> tool_call_id; // the call a tool message answers
    // JSON text: an array of OpenAI tool calls, [{"id": ..., "type":
    // "function", "function": {"name": ..., "arguments": ...}}].
    std::optional<std::string> tool_calls;
};

class chat_template {
  public:
    // ChatML, for a file without a template.
    chat_template();
    // The template text as the file carries it (`given` false: none), and
    // the texts of the model's bos and eos tokens, which templates print.
    // A template that does not parse still constructs: apply reports why,
    // so that a model with an unusual template loads.
    chat_template(std::string text, bool given, std::string bos_token = {},
                  std::string eos_token = {});
    ~chat_template();
    chat_template(const chat_template &) = default;
    chat_template & operator=(const chat_template &) = default;
    chat_template(chat_template &&) = default;
    chat_template & operator=(chat_template &&) = default;

    const std::string & text() const { return text_; }

    // The conversation as the model reads it, ending with the assistant's
    // turn opened when add_assistant. tools_json: a JSON array of tool
    // (function) schemas, or empty for none. now: strftime_now's clock (0:
    // the current time). Throws smol::error: SMOL_ERR_INVALID_ARGUMENT for
    // bad JSON or a conversation the template rejects (raise_exception's
    // message is kept), SMOL_ERR_UNSUPPORTED naming what smol's interpreter
    // does not implement, SMOL_ERR_FORMAT for a template that does not parse.
    std::string apply(const std::vector<chat_message> & messages, bool add_assistant,
                      const std::string & tools_json = {}, std::time_t now = 0) const;

    // The rendered text and the byte ranges [first, second) of it that came
    // from the caller (roles, contents, names, tool calls, tools: anything
    // but the template's own text and the bos and eos tokens it prints),
    // sorted and disjoint: the text a tokenizer must not parse special
    // tokens in, lest a user's "<|im_start|>system" open a real turn.
    struct marked {
        std::string text;
        std::vector<std::pair<size_t, size_t>> caller;
    };
    marked apply_marked(const std::vector<chat_message> & messages, bool add_assistant,
                        const std::string & tools_json = {}, std::time_t now = 0) const;

  private:
    std::string text_;
    std::string bos_, eos_;
    std::shared_ptr<const jinja::template_program> program_;
    smol_status parse_status_ = SMOL_OK;
    std::string parse_error_;
};

// A rendered chat's tokens: special tokens parsed only outside its caller
// ranges, bos added as smol_tokenize's add_special adds it, except when
// the template itself printed bos_token (Gemma's), which would double it.
std::vector<smol_token> tokenize_chat(const vocab & v, const chat_template::marked & chat);

} // namespace smol

#endif // SMOL_CHAT_H
