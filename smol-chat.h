// smol-chat.h - chat templates: a model's tokenizer.chat_template turned
// into the text of a conversation. Recognises ChatML (SmolLM2-Instruct's
// template, with its default system prompt); other templates are refused
// by name until the template interpreter exists.

#ifndef SMOL_CHAT_H
#define SMOL_CHAT_H

#include <string>
#include <vector>

namespace smol {

struct chat_message {
    std::string role;
    std::string content;
};

class chat_template {
  public:
    // A file without a template gets ChatML, as llama.cpp gives it.
    chat_template() : chat_template(std::string(), false) {}
    // The template text as the file carries it; `given` false: none.
    chat_template(std::string text, bool given);

    const std::string & text() const { return text_; }
    // The conversation as the model reads it, ending with the assistant's
    // turn opened when add_assistant. Throws smol::error
    // SMOL_ERR_UNSUPPORTED for a template smol does not know.
    std::string apply(const std::vector<chat_message> & messages, bool add_assistant) const;

  private:
    std::string text_;
    bool chatml_ = false;
    std::string default_system_; // ChatML's system prompt when none is given
};

} // namespace smol

#endif // SMOL_CHAT_H
