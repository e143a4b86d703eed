// smol-chat.c++ - chat templates (smol-chat.h): the conversation and the
// tools become the template's variables, as transformers' apply_chat_template
// and llama.cpp's common/chat.cpp pass them.

#include "smol-chat.h"

#include "smol-error.h"
#include "smol-jinja.h"
#include "smol-vocab.h"

namespace smol {

namespace {

// llama.cpp's fallback for a file without a template, as a Jinja template.
const char * k_chatml =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt "
    "%}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const char * k_name = "chat template";

jinja::value parse_field(const std::string & text, size_t index, const char * field) {
    try {
        return jinja::parse_json(text);
    } catch (const jinja::failure & f) {
        throw error(SMOL_ERR_INVALID_ARGUMENT, std::string(k_name) + ": message " +
                                                   std::to_string(index) + "'s " + field +
                                                   " is not valid JSON: " + f.what());
    }
}

// The tool calls as templates read them: each function's arguments an
// object where the caller gave JSON text, as llama.cpp's
// func_args_not_string does (templates print them with tojson or walk them).
jinja::value tool_calls_value(const std::string & text, size_t index) {
    const jinja::value calls = parse_field(text, index, "tool_calls");
    if (!calls.is_list()) {
        throw error(SMOL_ERR_INVALID_ARGUMENT, std::string(k_name) + ": message " +
                                                   std::to_string(index) +
                                                   "'s tool_calls must be a JSON array");
    }
    jinja::list_data out;
    for (const jinja::value & call : calls.items()) {
        const jinja::value * fn = call.is_dict() ? call.entries().find("function") : nullptr;
        const jinja::value * args = fn && fn->is_dict() ? fn->entries().find("arguments") : nullptr;
        if (!args || !args->is_string()) {
            out.push_back(call);
            continue;
        }
        auto new_fn = std::make_shared<jinja::dict_data>(fn->entries());
        new_fn->set("arguments",
                    parse_field(args->str(), index, "tool_calls[].function.arguments"));
        auto new_call = std::make_shared<jinja::dict_data>(call.entries());
        new_call->set("function", jinja::value::dict(new_fn));
        out.push_back(jinja::value::dict(new_call));
    }
    return jinja::value::list(std::move(out));
}

} // namespace

chat_template::chat_template() : chat_template(std::string(), false) {}

chat_template::chat_template(std::string text, bool given, std::string bos_token,
                             std::string eos_token)
    : text_(given ? std::move(text) : std::string(k_chatml)), bos_(std::move(bos_token)),
      eos_(std::move(eos_token)) {
    try {
        program_ = std::make_shared<const jinja::template_program>(text_, k_name);
    } catch (const error & e) {
        parse_status_ = e.status;
        parse_error_ = e.what();
    }
}

chat_template::~chat_template() = default;

std::string chat_template::apply(const std::vector<chat_message> & messages, bool add_assistant,
                                 const std::string & tools_json, std::time_t now) const {
    return apply_marked(messages, add_assistant, tools_json, now).text;
}

chat_template::marked chat_template::apply_marked(const std::vector<chat_message> & messages,
                                                  bool add_assistant,
                                                  const std::string & tools_json,
                                                  std::time_t now) const {
    if (!program_) throw error(parse_status_, parse_error_);
    jinja::list_data msgs;
    for (size_t i = 0; i < messages.size(); i++) {
        const chat_message & m = messages[i];
        auto d = std::make_shared<jinja::dict_data>();
        d->set("role", jinja::value(m.role));
        if (!m.content && !m.tool_calls) {
            throw error(SMOL_ERR_INVALID_ARGUMENT,
                        std::string(k_name) + ": message " + std::to_string(i) +
                            " has no content; only a message with tool_calls may omit it");
        }
        d->set("content", jinja::value(m.content.value_or("")));
        if (m.name) d->set("name", jinja::value(*m.name));
        if (m.tool_call_id) d->set("tool_call_id", jinja::value(*m.tool_call_id));
        if (m.tool_calls) d->set("tool_calls", tool_calls_value(*m.tool_calls, i));
        msgs.push_back(jinja::value::dict(d));
    }
    jinja::dict_data vars;
    // Everything from the caller is caller data, keys too (a tool schema's
    // keys are the caller's text); bos and eos are the model's own tokens.
    vars.set("messages", jinja::value::list(std::move(msgs)).as_caller_data());
    if (!tools_json.empty()) {
        jinja::value tools;
        try {
            tools = jinja::parse_json(tools_json);
        } catch (const jinja::failure & f) {
            throw error(SMOL_ERR_INVALID_ARGUMENT,
                        std::string(k_name) + ": tools is not valid JSON: " + f.what());
        }
        if (!tools.is_list()) {
            throw error(SMOL_ERR_INVALID_ARGUMENT,
                        std::string(k_name) + ": tools must be a JSON array of tool schemas");
        }
        vars.set("tools", tools.as_caller_data());
    }
    vars.set("add_generation_prompt", jinja::value(add_assistant));
    vars.set("bos_token", jinja::value(bos_));
    vars.set("eos_token", jinja::value(eos_));
    jinja::render_options o;
    o.now = now;
    jinja::marked_text out = program_->render_marked(vars, o);
    return {std::move(out.text), std::move(out.caller)};
}

std::vector<smol_token> tokenize_chat(const vocab & v, const chat_template::marked & chat) {
    std::vector<smol_token> ids = v.tokenize(chat.text, true, chat.caller);
    if (v.add_bos() && ids.size() > 1 && ids[0] == v.bos() && ids[1] == v.bos()) {
        // The second bos is the template's own only if no caller byte is
        // in it; caller text is never parsed as bos, so it must be.
        ids.erase(ids.begin());
    }
    return ids;
}

} // namespace smol
