// smol-jinja.h - the chat-template interpreter: Jinja2 as Hugging Face
// compiles chat templates (trim_blocks, lstrip_blocks, loop controls, the
// generation tag, tojson as json.dumps, raise_exception, strftime_now),
// parsed once and rendered many times. What smol does not implement is
// refused by name, never rendered approximately; a step budget and depth
// limits turn hostile templates into errors.

#ifndef SMOL_JINJA_H
#define SMOL_JINJA_H

#include "smol-jinja-value.h"

#include <cstdint>
#include <ctime>
#include <memory>
#include <string>

namespace smol::jinja {

struct node_body;

struct render_options {
    // Evaluation steps (an expression or a statement each) before the
    // render gives up: a template in a loop must not hang a server.
    int64_t max_steps = 10'000'000;
    // Nesting of evaluation (expressions, statements, macro calls).
    int max_depth = 600;
    // The largest string or list a template may build, in bytes or items.
    size_t max_output = size_t(64) << 20;
    // strftime_now's clock (seconds since the epoch, local time); 0: now.
    std::time_t now = 0;
};

class template_program {
  public:
    // Parses `source`; throws smol::error (SMOL_ERR_FORMAT for syntax,
    // SMOL_ERR_UNSUPPORTED for what smol does not implement) whose message
    // starts with `name` and gives the line and column.
    template_program(const std::string & source, std::string name);
    ~template_program();

    // Renders with `vars` as the template's variables (beside the globals
    // range, namespace, dict, raise_exception, strftime_now, joiner,
    // cycler). Throws smol::error naming the template, the construct and
    // its line: SMOL_ERR_INVALID_ARGUMENT when the template raised (its
    // message is kept) or failed on these inputs, SMOL_ERR_UNSUPPORTED for
    // what smol does not implement.
    std::string render(const dict_data & vars, const render_options & options = {}) const;
    // As render, with the byte ranges of the text that came from the
    // caller's strings (those marked by value::as_caller_data): the text a
    // tokenizer must not parse special tokens in. Whatever a template makes
    // from a marked string stays marked: exactly where bytes are only moved
    // (+, ~, slices, trim, join, printing), all of a result where they are
    // transformed (replace, upper, format, tojson, repr, string methods).
    marked_text render_marked(const dict_data & vars, const render_options & options = {}) const;

  private:
    std::string name_;
    std::unique_ptr<node_body> body_;
};

} // namespace smol::jinja

#endif // SMOL_JINJA_H
