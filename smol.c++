// smol.c++ - the C API of smol.h on top of the core (smol-graph.c++,
// smol-cpu.c++ and the other parts README's layout table names), the model
// layer (smol-llama.c++), the tokenizer (smol-vocab.c++) and the sampler.

#include "smol.h"

#include "smol-backend.h"
#include "smol-cpu-kernels.h"
#include "smol-error.h"
#include "smol-graph.h"
#include "smol-jinja-value.h"
#include "smol-llama.h"
#include "smol-plan.h"
#include "smol-quant.h"
#include "smol-recipe.h"
#include "smol-tool-calls.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

// --- the C API -------------------------------------------------------------------

namespace smol {

static thread_local std::string last_error;
void set_last_error(const std::string & message) {
    last_error = message;
}

} // namespace smol

using smol::guard;

namespace {

smol_status invalid(const std::string & message) {
    smol::set_last_error(message);
    return SMOL_ERR_INVALID_ARGUMENT;
}

// Copies bytes into a caller's buffer, NUL-terminated when there is room.
smol_status copy_out(const std::string & s, char * buf, size_t size, size_t * n_out) {
    if (n_out) *n_out = s.size();
    if (!buf || size < s.size() + 1) {
        if (buf && size > 0) buf[0] = '\0';
        smol::set_last_error("the output buffer holds " + std::to_string(size) + " bytes; " +
                             std::to_string(s.size() + 1) + " are needed");
        return SMOL_ERR_BUFFER_TOO_SMALL;
    }
    std::memcpy(buf, s.data(), s.size());
    buf[s.size()] = '\0';
    return SMOL_OK;
}

std::string format_value(const gguf::value & v) {
    switch (v.t) {
    case gguf::type::STRING:
        return v.str;
    case gguf::type::BOOL:
        return v.b ? "true" : "false";
    case gguf::type::FLOAT32:
    case gguf::type::FLOAT64: {
        char b[64];
        std::snprintf(b, sizeof b, "%.9g", v.f);
        return b;
    }
    case gguf::type::ARRAY:
        return "[array of " + std::to_string(v.arr.size()) + "]";
    case gguf::type::UINT8:
    case gguf::type::UINT16:
    case gguf::type::UINT32:
    case gguf::type::UINT64:
        return std::to_string(v.u);
    default:
        return std::to_string(v.i);
    }
}

// The weight shapes of a llama's matmul launches as a device backend keys
// them: each weight alone, q, k and v launched together, and gate and up
// fused into one SwiGLU launch (whose rows count twice).
std::vector<smol::mm_key> llama_mm_shapes(const smol::llama_model & m) {
    std::vector<smol::mm_key> out;
    auto add = [&](smol_type t, int64_t n, int64_t k) {
        const smol::mm_key key{t, n, k, 0};
        if (std::find(out.begin(), out.end(), key) == out.end()) out.push_back(key);
    };
    if (!m.layers.empty()) {
        const smol::llama_layer & L = m.layers[0];
        for (const smol::weight * w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
            add(w->type, w->ne1, w->ne0);
        if (L.wq.type == L.wk.type && L.wk.type == L.wv.type)
            add(L.wq.type, L.wq.ne1 + L.wk.ne1 + L.wv.ne1, L.wq.ne0);
        if (L.w_gate.type == L.w_up.type) add(L.w_gate.type, 2 * L.w_gate.ne1, L.w_gate.ne0);
    }
    add(m.output.type, m.output.ne1, m.output.ne0);
    return out;
}

std::vector<smol::chat_message> chat_messages(const smol_chat_message * messages, size_t n,
                                              const char * fn) {
    std::vector<smol::chat_message> msgs;
    for (size_t i = 0; i < n; ++i) {
        const smol_chat_message & m = messages[i];
        if (!m.role || (!m.content && !m.tool_calls)) {
            throw smol::error(SMOL_ERR_INVALID_ARGUMENT,
                              std::string(fn) + ": message " + std::to_string(i) +
                                  " has a NULL role or content (content may be NULL only "
                                  "beside tool_calls)");
        }
        smol::chat_message c;
        c.role = m.role;
        if (m.content) c.content = m.content;
        if (m.name) c.name = m.name;
        if (m.tool_call_id) c.tool_call_id = m.tool_call_id;
        if (m.tool_calls) c.tool_calls = m.tool_calls;
        msgs.push_back(std::move(c));
    }
    return msgs;
}

} // namespace

extern "C" {

const char * smol_last_error(void) {
    return smol::last_error.c_str();
}

const char * smol_status_name(smol_status s) {
    switch (s) {
    case SMOL_OK:
        return "SMOL_OK";
    case SMOL_ERR_INVALID_ARGUMENT:
        return "SMOL_ERR_INVALID_ARGUMENT";
    case SMOL_ERR_IO:
        return "SMOL_ERR_IO";
    case SMOL_ERR_FORMAT:
        return "SMOL_ERR_FORMAT";
    case SMOL_ERR_UNSUPPORTED:
        return "SMOL_ERR_UNSUPPORTED";
    case SMOL_ERR_OUT_OF_MEMORY:
        return "SMOL_ERR_OUT_OF_MEMORY";
    case SMOL_ERR_CONTEXT_FULL:
        return "SMOL_ERR_CONTEXT_FULL";
    case SMOL_ERR_BUFFER_TOO_SMALL:
        return "SMOL_ERR_BUFFER_TOO_SMALL";
    case SMOL_ERR_BACKEND:
        return "SMOL_ERR_BACKEND";
    case SMOL_ERR_BUSY:
        return "SMOL_ERR_BUSY";
    case SMOL_ERR_ABORTED:
        return "SMOL_ERR_ABORTED";
    case SMOL_ERR_WINDOW_GONE:
        return "SMOL_ERR_WINDOW_GONE";
    }
    return "SMOL_ERR_UNKNOWN";
}

smol_quantize_params smol_quantize_default_params(void) {
    smol_quantize_params p{};
    p.file_type = "Q8_0";
    return p;
}

const char * smol_quantize_file_types(void) {
    static const std::string names = smol::recipe_names();
    return names.c_str();
}

smol_status smol_model_quantize(const char * in_path, const char * out_path,
                                const smol_quantize_params * params) {
    if (!in_path || !out_path) return invalid("smol_model_quantize: paths must not be NULL");
    const smol_quantize_params p = params ? *params : smol_quantize_default_params();
    const smol::recipe * r = smol::find_recipe(p.file_type ? p.file_type : "");
    if (!r) {
        return invalid(std::string("smol_model_quantize: unknown file type '") +
                       (p.file_type ? p.file_type : "(null)") + "'; the file types are " +
                       smol::recipe_names());
    }
    return guard([&] {
        try {
            const int n_threads = p.n_threads > 0
                                      ? p.n_threads
                                      : int(std::max(1u, std::thread::hardware_concurrency()));
            smol::quantize_model(in_path, out_path, *r, n_threads,
                                 [&](const smol::quantized_tensor & q) {
                                     if (!p.on_tensor) return;
                                     smol_quantize_tensor t{};
                                     t.name = q.in->name.c_str();
                                     t.n_dims = int32_t(q.in->n_dims);
                                     for (int d = 0; d < 4; ++d) t.ne[d] = q.in->ne[d];
                                     t.type_in = smol_type(q.in->type);
                                     t.type_out = q.type;
                                     t.fell_back = q.fell_back;
                                     t.bytes_in = q.in->nbytes;
                                     t.bytes_out = q.bytes_out;
                                     t.index = int32_t(q.index);
                                     t.count = int32_t(q.count);
                                     p.on_tensor(&t, p.user_data);
                                 });
        } catch (const gguf::error & e) {
            throw smol::error(SMOL_ERR_FORMAT, e.what());
        }
    });
}

smol_status smol_parse_size(const char * text, uint64_t * bytes) {
    if (!text || !bytes) return invalid("smol_parse_size: text and bytes must not be NULL");
    char * end = nullptr;
    const double v = std::strtod(text, &end);
    std::string unit(end ? end : "");
    for (char & ch : unit) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    double scale = 0;
    if (unit.empty() || unit == "b") {
        scale = 1;
    } else {
        const std::string units = "kmgt";
        const size_t k = units.find(unit[0]);
        const std::string rest = unit.substr(1);
        if (k != std::string::npos && (rest.empty() || rest == "b" || rest == "ib"))
            scale = std::ldexp(1.0, 10 * int(k + 1));
    }
    if (end == text || !(v >= 0) || scale == 0 || v * scale > 1.8e19) {
        return invalid(std::string("'") + text +
                       "' is not a size; write it as 24GiB, 512MiB, 1.5G or a byte count");
    }
    *bytes = uint64_t(v * scale);
    return SMOL_OK;
}

const char * smol_version(void) {
    return "0.1.0";
}

const char * smol_cpu_kernels_name(void) {
    return smol::cpu::kernels_best().name;
}

const char * smol_type_name(smol_type t) {
    const smol::type_traits * tr = smol::traits_of(t);
    return tr ? tr->name : nullptr;
}

smol_model_params smol_model_default_params(void) {
    smol_model_params p;
    p.progress = nullptr;
    p.progress_user_data = nullptr;
    p.use_mmap = true;
    return p;
}

smol_status smol_model_load(const char * path, const smol_model_params * params,
                            smol_model ** out) {
    if (!path || !out) return invalid("smol_model_load: path and out must not be NULL");
    *out = nullptr;
    const smol_model_params p = params ? *params : smol_model_default_params();
    return guard([&] {
        auto m = std::make_unique<smol_model>();
        m->m = smol::llama_model::load(path, p);
        *out = m.release();
    });
}

void smol_model_free(smol_model * model) {
    delete model;
}

void smol_model_get_info(const smol_model * model, smol_model_info * info) {
    if (!model || !info) return;
    const smol::llama_model & m = *model->m;
    *info = {};
    info->n_vocab = m.hp.n_vocab;
    info->n_ctx_train = m.hp.n_ctx_train;
    info->n_embd = m.hp.n_embd;
    info->n_layer = m.hp.n_layer;
    info->n_head = m.hp.n_head;
    info->n_head_kv = m.hp.n_head_kv;
    info->n_ff = m.hp.n_ff;
    info->n_params = m.n_params;
    info->n_bytes = m.n_bytes;
    info->ftype = m.ftype;
    std::snprintf(info->name, sizeof info->name, "%s", m.name.c_str());
}

smol_status smol_model_meta(const smol_model * model, const char * key, char * buf, size_t size) {
    if (!model || !key) return invalid("smol_model_meta: model and key must not be NULL");
    const gguf::value * v = model->m->file->find(key);
    if (!v) return invalid(std::string("smol_model_meta: the model has no key '") + key + "'");
    return copy_out(format_value(*v), buf, size, nullptr);
}

smol_token smol_token_bos(const smol_model * model) {
    return model ? model->m->vocab.bos() : -1;
}
smol_token smol_token_eos(const smol_model * model) {
    return model ? model->m->vocab.eos() : -1;
}
bool smol_token_is_eog(const smol_model * model, smol_token t) {
    return model && model->m->vocab.is_eog(t);
}

smol_status smol_tokenize(const smol_model * model, const char * text, size_t len, bool add_special,
                          bool parse_special, smol_token * tokens, int32_t n_max, int32_t * n_out) {
    if (!model || (!text && len > 0) || !n_out) {
        return invalid("smol_tokenize: model, text and n_out must not be NULL");
    }
    std::vector<smol_token> ids;
    const smol_status st = guard([&] {
        ids = model->m->vocab.tokenize(std::string_view(text ? text : "", len), add_special,
                                       parse_special);
    });
    if (st != SMOL_OK) return st;
    *n_out = int32_t(ids.size());
    if (int64_t(ids.size()) > n_max || (!tokens && !ids.empty())) {
        smol::set_last_error("smol_tokenize: the text has " + std::to_string(ids.size()) +
                             " tokens, the buffer holds " + std::to_string(n_max));
        return SMOL_ERR_BUFFER_TOO_SMALL;
    }
    std::copy(ids.begin(), ids.end(), tokens);
    return SMOL_OK;
}

smol_status smol_token_to_piece(const smol_model * model, smol_token token, bool special,
                                char * buf, size_t size, size_t * n_out) {
    if (!model) return invalid("smol_token_to_piece: model must not be NULL");
    if (token < 0 || token >= model->m->hp.n_vocab) {
        return invalid("smol_token_to_piece: token " + std::to_string(token) +
                       " is outside the vocabulary");
    }
    return copy_out(model->m->vocab.token_to_piece(token, special), buf, size, n_out);
}

smol_chat_params smol_chat_default_params(void) {
    smol_chat_params p;
    p.add_assistant = true;
    p.tools_json = nullptr;
    return p;
}

smol_status smol_chat_apply_template_ex(const smol_model * model,
                                        const smol_chat_message * messages, size_t n,
                                        const smol_chat_params * params, char * buf, size_t size,
                                        size_t * n_out) {
    if (!model || (!messages && n > 0) || !params) {
        return invalid("smol_chat_apply_template: model, messages and params must not be NULL");
    }
    std::string text;
    const smol_status st = guard([&] {
        text = model->m->chat.apply(chat_messages(messages, n, "smol_chat_apply_template"),
                                    params->add_assistant,
                                    params->tools_json ? params->tools_json : "");
    });
    if (st != SMOL_OK) return st;
    return copy_out(text, buf, size, n_out);
}

smol_status smol_chat_apply_template(const smol_model * model, const smol_chat_message * messages,
                                     size_t n, bool add_assistant, char * buf, size_t size,
                                     size_t * n_out) {
    smol_chat_params p = smol_chat_default_params();
    p.add_assistant = add_assistant;
    return smol_chat_apply_template_ex(model, messages, n, &p, buf, size, n_out);
}

const char * smol_chat_tool_syntax(const smol_model * model) {
    if (!model) return "hermes";
    return smol::tool_syntax_name(smol::tool_syntax_of(model->m->chat.text()));
}

smol_status smol_chat_parse_tool_calls(const smol_model * model, const char * text, size_t len,
                                       char * buf, size_t size, size_t * n_out) {
    if (!model || (!text && len > 0)) {
        return invalid("smol_chat_parse_tool_calls: model and text must not be NULL");
    }
    std::string out;
    const smol_status st = guard([&] {
        const smol::tool_reply r = smol::parse_tool_calls(
            std::string_view(text ? text : "", len), smol::tool_syntax_of(model->m->chat.text()));
        auto calls = std::make_shared<smol::jinja::list_data>();
        for (const smol::tool_call & c : r.calls) {
            auto d = std::make_shared<smol::jinja::dict_data>();
            d->set("name", smol::jinja::value(c.name));
            d->set("arguments", smol::jinja::value(c.arguments));
            calls->push_back(smol::jinja::value::dict(d));
        }
        auto reply = std::make_shared<smol::jinja::dict_data>();
        reply->set("content", smol::jinja::value(r.content));
        reply->set("tool_calls", smol::jinja::value::list(std::move(*calls)));
        out = smol::jinja::to_json(smol::jinja::value::dict(reply));
    });
    if (st != SMOL_OK) return st;
    return copy_out(out, buf, size, n_out);
}

int64_t smol_chat_tool_call_start(const smol_model * model, const char * text, size_t len) {
    if (!model || (!text && len > 0)) return -1;
    const size_t at = smol::tool_call_start(std::string_view(text ? text : "", len),
                                            smol::tool_syntax_of(model->m->chat.text()));
    return at == std::string_view::npos ? -1 : int64_t(at);
}

smol_status smol_chat_tokenize(const smol_model * model, const smol_chat_message * messages,
                               size_t n, const smol_chat_params * params, smol_token * tokens,
                               int32_t n_max, int32_t * n_out) {
    if (!model || (!messages && n > 0) || !params || !n_out) {
        return invalid("smol_chat_tokenize: model, messages, params and n_out must not be NULL");
    }
    std::vector<smol_token> ids;
    const smol_status st = guard([&] {
        const smol::vocab & v = model->m->vocab;
        const smol::chat_template::marked chat = model->m->chat.apply_marked(
            chat_messages(messages, n, "smol_chat_tokenize"), params->add_assistant,
            params->tools_json ? params->tools_json : "");
        ids = smol::tokenize_chat(v, chat);
    });
    if (st != SMOL_OK) return st;
    *n_out = int32_t(ids.size());
    if (int64_t(ids.size()) > n_max || (!tokens && !ids.empty())) {
        smol::set_last_error("smol_chat_tokenize: the conversation has " +
                             std::to_string(ids.size()) + " tokens, the buffer holds " +
                             std::to_string(n_max));
        return SMOL_ERR_BUFFER_TOO_SMALL;
    }
    std::copy(ids.begin(), ids.end(), tokens);
    return SMOL_OK;
}

smol_context_params smol_context_default_params(void) {
    smol_context_params p;
    p.n_ctx = 0;
    p.n_batch = 0;
    p.n_threads = 0;
    p.n_seq_max = 1;
    p.device = nullptr;
    p.gpu_mem = 0;
    p.split = SMOL_SPLIT_LAYER;
    p.device_mem = nullptr;
    p.n_device_mem = 0;
    p.tensor_split = nullptr;
    p.n_tensor_split = 0;
    p.kv_offload = SMOL_KV_OFFLOAD_AUTO;
    p.kv_attend = SMOL_KV_ATTEND_AUTO;
    p.head_group = 0;
    p.kv_type = SMOL_TYPE_F16;
    p.autotune_file = nullptr;
    p.attn = SMOL_ATTN_AUTO;
    p.gpu_fuse = true;
    p.gpu_graphs = true;
    p.gpu_pdl = true;
    p.abort_callback = nullptr;
    p.abort_user_data = nullptr;
    p.embeddings = false;
    p.swa_full = false;
    p.window_reserve = 0;
    p.streaming_heads = nullptr;
    p.n_streaming_heads = 0;
    p.stream_sink = 64;
    p.stream_window = 256;
    return p;
}

smol_status smol_context_create(smol_model * model, const smol_context_params * params,
                                smol_context ** out) {
    if (!model || !out) return invalid("smol_context_create: model and out must not be NULL");
    *out = nullptr;
    const smol_context_params p = params ? *params : smol_context_default_params();
    if (p.n_seq_max > uint32_t(smol::kv_max_seqs)) {
        return invalid("smol_context_create: n_seq_max " + std::to_string(p.n_seq_max) +
                       " is above " + std::to_string(smol::kv_max_seqs) +
                       ", the most sequences a KV cell can be shared by");
    }
    return guard([&] {
        auto c = std::make_unique<smol_context>();
        c->model = model;
        c->c = std::make_unique<smol::llama_context>(*model->m, p);
        *out = c.release();
    });
}

void smol_context_free(smol_context * ctx) {
    delete ctx;
}

smol_status smol_autotune(const smol_model * model, const char * device, const int32_t * n_tokens,
                          int32_t n, const char * path, smol_log_fn log, void * user_data) {
    if (!model || !device) return invalid("smol_autotune: model and device must not be NULL");
    if (n < 0 || (n > 0 && !n_tokens))
        return invalid("smol_autotune: n_tokens must hold n batch sizes");
    return guard([&] {
        auto be = smol::make_backend(device, 1);
        std::vector<int> buckets;
        if (n == 0) {
            buckets.assign(std::begin(smol::mm_buckets), std::end(smol::mm_buckets));
        } else {
            for (int32_t i = 0; i < n; ++i) {
                if (n_tokens[i] <= 0)
                    throw smol::error(SMOL_ERR_INVALID_ARGUMENT,
                                      "smol_autotune: batch sizes must be positive");
                const int b = smol::mm_bucket(n_tokens[i]);
                if (std::find(buckets.begin(), buckets.end(), b) == buckets.end())
                    buckets.push_back(b);
            }
        }
        auto say = [&](const std::string & line) {
            if (log) log(line.c_str(), user_data);
        };
        const auto shapes = llama_mm_shapes(*model->m);
        bool any = false;
        for (int b : buckets) {
            for (smol::mm_key key : shapes) {
                key.m = b;
                const std::vector<std::string> cands = be->mm_candidates(key);
                if (cands.empty()) continue;
                any = true;
                std::string best;
                double best_us = 0;
                std::string line = std::string(smol_type_name(key.type)) + " " +
                                   std::to_string(key.n) + "x" + std::to_string(key.k) +
                                   " M=" + std::to_string(b) + ":";
                for (const std::string & c : cands) {
                    const double us = be->mm_time(key, c);
                    char buf[64];
                    std::snprintf(buf, sizeof buf, " [%s] %.2f us", c.c_str(), us);
                    line += buf;
                    if (best.empty() || us < best_us) {
                        best = c;
                        best_us = us;
                    }
                }
                be->mm_choose(key, best, best_us);
                say(line + " -> " + best);
            }
        }
        if (!any)
            throw smol::error(SMOL_ERR_UNSUPPORTED,
                              std::string("smol_autotune: the device '") + device +
                                  "' has no choice of matmul kernels to tune (use cuda:N)");
        say("wrote " + be->mm_table_save(path ? path : ""));
    });
}

smol_status smol_context_matmul_kernels(const smol_context * ctx, char * buf, size_t size,
                                        size_t * n_out) {
    if (!ctx) return invalid("smol_context_matmul_kernels: ctx must not be NULL");
    const smol::llama_context & c = *ctx->c;
    std::string text;
    for (int32_t d = 0; d < c.n_devices(); ++d) {
        if (c.n_devices() > 1) text += std::string(c.device(d).name()) + ":\n";
        text += c.device(d).mm_used();
    }
    return copy_out(text, buf, size, n_out);
}
uint32_t smol_context_n_ctx(const smol_context * ctx) {
    return ctx ? ctx->c->params.n_ctx : 0;
}
uint32_t smol_context_n_batch(const smol_context * ctx) {
    return ctx ? ctx->c->params.n_batch : 0;
}
uint32_t smol_context_n_seq_max(const smol_context * ctx) {
    return ctx ? ctx->c->params.n_seq_max : 0;
}

void smol_context_memory(const smol_context * ctx, smol_memory_info * info) {
    if (!ctx || !info) return;
    *info = ctx->c->memory_info();
}

int32_t smol_context_n_devices(const smol_context * ctx) {
    return ctx ? ctx->c->n_devices() : 0;
}

smol_status smol_context_device_memory(const smol_context * ctx, int32_t i,
                                       smol_memory_info * info) {
    if (!ctx || !info) return invalid("smol_context_device_memory: ctx and info must not be NULL");
    if (i < 0 || i >= ctx->c->n_devices()) {
        return invalid("smol_context_device_memory: device " + std::to_string(i) +
                       " is outside [0, " + std::to_string(ctx->c->n_devices()) + ")");
    }
    *info = ctx->c->memory_info(i);
    return SMOL_OK;
}

smol_status smol_context_plan_dump(const smol_context * ctx, char * buf, size_t size,
                                   size_t * n_out) {
    if (!ctx) return invalid("smol_context_plan_dump: ctx must not be NULL");
    return copy_out(ctx->c->plan_text(), buf, size, n_out);
}

smol_status smol_context_schedule_dump(smol_context * ctx, int32_t n_tokens, char * buf,
                                       size_t size, size_t * n_out) {
    if (!ctx) return invalid("smol_context_schedule_dump: ctx must not be NULL");
    std::string text;
    const smol_status st = guard([&] { text = ctx->c->schedule_text(n_tokens); });
    if (st != SMOL_OK) return st;
    return copy_out(text, buf, size, n_out);
}

smol_batch smol_batch_init(int32_t n) {
    smol_batch b{};
    if (n <= 0) return b;
    b.token = static_cast<smol_token *>(std::calloc(size_t(n), sizeof(smol_token)));
    b.pos = static_cast<smol_pos *>(std::calloc(size_t(n), sizeof(smol_pos)));
    b.seq_id = static_cast<smol_seq_id *>(std::calloc(size_t(n), sizeof(smol_seq_id)));
    b.logits = static_cast<int8_t *>(std::calloc(size_t(n), 1));
    if (!b.token || !b.pos || !b.seq_id || !b.logits) smol_batch_free(&b);
    return b;
}

void smol_batch_free(smol_batch * b) {
    if (!b) return;
    std::free(b->token);
    std::free(b->pos);
    std::free(b->seq_id);
    std::free(b->logits);
    *b = smol_batch{};
}

bool smol_batch_add(smol_batch * b, int32_t capacity, smol_token token, smol_pos pos,
                    smol_seq_id seq, bool logits) {
    if (!b || !b->token || b->n_tokens >= capacity) return false;
    const int32_t i = b->n_tokens++;
    b->token[i] = token;
    b->pos[i] = pos;
    b->seq_id[i] = seq;
    b->logits[i] = logits ? SMOL_KEEP_LOGITS : SMOL_KEEP_NONE;
    return true;
}

smol_status smol_decode(smol_context * ctx, const smol_batch * batch) {
    if (!ctx || !batch) return invalid("smol_decode: ctx and batch must not be NULL");
    return guard([&] { ctx->c->decode(*batch); });
}

const smol_model * smol_context_get_model(const smol_context * ctx) {
    return ctx ? ctx->model : nullptr;
}

const float * smol_get_logits(smol_context * ctx, int32_t i) {
    return ctx && !ctx->c->params.embeddings ? ctx->c->logits(i) : nullptr;
}

smol_token smol_get_top_token(smol_context * ctx, int32_t i) {
    return ctx ? ctx->c->top_token(i) : -1;
}

const float * smol_get_embeddings(smol_context * ctx, int32_t i) {
    return ctx && ctx->c->params.embeddings ? ctx->c->logits(i) : nullptr;
}

void smol_kv_seq_rm(smol_context * ctx, smol_seq_id seq, smol_pos p0, smol_pos p1) {
    if (ctx) ctx->c->kv.seq_rm(seq, p0, p1);
}

void smol_kv_seq_cp(smol_context * ctx, smol_seq_id src, smol_seq_id dst, smol_pos p0,
                    smol_pos p1) {
    if (ctx) ctx->c->kv.seq_cp(src, dst, p0, p1);
}

int32_t smol_kv_seq_len(const smol_context * ctx, smol_seq_id seq) {
    return ctx ? ctx->c->kv.seq_len(seq) : 0;
}

smol_pos smol_kv_seq_pos_exact(smol_context * ctx, smol_seq_id seq) {
    return ctx ? ctx->c->seq_pos_exact(seq) : 0;
}

int32_t smol_kv_free_cells(const smol_context * ctx) {
    return ctx ? ctx->c->kv.n_free() : 0;
}

smol_perf smol_context_perf(const smol_context * ctx) {
    smol_perf p{};
    if (!ctx) return p;
    p = ctx->c->perf;
    p.t_load_ms = ctx->model->m->t_load_ms;
    return p;
}

void smol_context_perf_reset(smol_context * ctx) {
    if (ctx) ctx->c->perf = smol_perf{};
}

} // extern "C"
