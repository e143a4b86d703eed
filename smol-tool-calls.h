// smol-tool-calls.h - a model's tool calls read back from its reply: the
// syntax its chat template teaches it (Hermes and Qwen's <tool_call> JSON
// blocks, Llama 3.1's JSON object, Mistral's [TOOL_CALLS] list), the calls
// and the text around them, and where in a reply being streamed a call may
// begin (so that a server holds that text back instead of sending it as
// content).

#ifndef SMOL_TOOL_CALLS_H
#define SMOL_TOOL_CALLS_H

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace smol {

enum class tool_syntax { hermes, llama3, mistral };

// The syntax a chat template's text teaches; Hermes's when it shows none.
tool_syntax tool_syntax_of(std::string_view template_text);
const char * tool_syntax_name(tool_syntax s); // "hermes", "llama3", "mistral"

struct tool_call {
    std::string name;
    std::string arguments; // JSON text of an object
};

struct tool_reply {
    std::string content; // the reply without its calls, trimmed
    std::vector<tool_call> calls;
};

// The calls in a reply (its text with special tokens' text in it). A call
// whose JSON does not parse or names no function is left in the content:
// the reply is then text, as the model wrote it.
tool_reply parse_tool_calls(std::string_view text, tool_syntax s);

// Where a call may begin in the reply so far: the offset of its opening
// marker, or of a tail that may grow into one; npos when none can.
size_t tool_call_start(std::string_view text, tool_syntax s);

} // namespace smol

#endif // SMOL_TOOL_CALLS_H
