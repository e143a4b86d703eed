// smol.h - the public C API of smol: load a GGUF model (Llama, Gemma 3),
// tokenize, decode batches of tokens from one or more sequences, read logits
// and sample. Plain C: opaque handles, fixed-width integers, status codes.
// Every call that can fail returns a smol_status; smol_last_error() then
// holds a message (per thread) naming what was wrong and what to do.

#ifndef SMOL_H
#define SMOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(SMOL_SHARED)
#ifdef SMOL_BUILD
#define SMOL_API __declspec(dllexport)
#else
#define SMOL_API __declspec(dllimport)
#endif
#elif defined(SMOL_SHARED)
#define SMOL_API __attribute__((visibility("default")))
#else
#define SMOL_API
#endif

// --- status ---------------------------------------------------------------

typedef enum smol_status {
    SMOL_OK = 0,
    SMOL_ERR_INVALID_ARGUMENT = 1, // a parameter is out of range or NULL
    SMOL_ERR_IO = 2,               // a file could not be opened or read
    SMOL_ERR_FORMAT = 3,           // a file is truncated, corrupt or hostile
    SMOL_ERR_UNSUPPORTED = 4,      // valid, but smol cannot run it (yet)
    SMOL_ERR_OUT_OF_MEMORY = 5,    // an allocation or a memory budget failed
    SMOL_ERR_CONTEXT_FULL = 6,     // the KV cache has no room for the batch
    SMOL_ERR_BUFFER_TOO_SMALL = 7, // an output buffer is too small; see n_out
    SMOL_ERR_BACKEND = 8,          // a device backend reported an error
    SMOL_ERR_BUSY = 9,             // the engine's queue is full; retry later
    SMOL_ERR_ABORTED = 10,         // the abort callback stopped the call
    // A sliding-window layer or streaming head would need keys its window
    // store released (a rollback past window_reserve tokens, an old
    // prefix); see swa_full.
    SMOL_ERR_WINDOW_GONE = 11,
} smol_status;

// The message for the last failed call on this thread ("" if none).
SMOL_API const char * smol_last_error(void);
// A short constant name for a status, such as "SMOL_ERR_FORMAT".
SMOL_API const char * smol_status_name(smol_status status);
// Reads a byte count such as "24GiB", "512MiB", "1.5G", "8gb" or "4096"
// (K, M, G, T: powers of 1024, with or without "i" and "B").
SMOL_API smol_status smol_parse_size(const char * text, uint64_t * bytes);
// The library version, such as "0.1.0".
SMOL_API const char * smol_version(void);
// The CPU kernels chosen at run time for this machine, such as "avx2".
SMOL_API const char * smol_cpu_kernels_name(void);

// --- log ------------------------------------------------------------------

typedef enum smol_log_level {
    SMOL_LOG_ERROR = 0,
    SMOL_LOG_WARN = 1,
    SMOL_LOG_INFO = 2,
    SMOL_LOG_DEBUG = 3,
} smol_log_level;

// Gets every message the library has to say, one line without its newline.
typedef void (*smol_log_callback)(smol_log_level level, const char * text, void * user_data);

// Sends the library's messages to cb, for every thread (NULL: the default,
// each line to stderr after "smol: "). The library writes nowhere else.
SMOL_API void smol_log_set(smol_log_callback cb, void * user_data);

// --- types ----------------------------------------------------------------

// Tensor element types; the values are GGUF's (ggml's) type ids. The
// K-quants and IQ4_XS come in super-blocks of 256 elements, the other
// quantized types in blocks of 32.
typedef enum smol_type {
    SMOL_TYPE_F32 = 0,
    SMOL_TYPE_F16 = 1,
    SMOL_TYPE_Q4_0 = 2,
    SMOL_TYPE_Q4_1 = 3,
    SMOL_TYPE_Q5_0 = 6,
    SMOL_TYPE_Q5_1 = 7,
    SMOL_TYPE_Q8_0 = 8,
    SMOL_TYPE_Q2_K = 10,
    SMOL_TYPE_Q3_K = 11,
    SMOL_TYPE_Q4_K = 12,
    SMOL_TYPE_Q5_K = 13,
    SMOL_TYPE_Q6_K = 14,
    SMOL_TYPE_IQ4_NL = 20,
    SMOL_TYPE_IQ4_XS = 23,
    SMOL_TYPE_BF16 = 30,
} smol_type;

// "f32", "f16", "q4_0", "q4_K", ...; NULL for a type smol does not know.
SMOL_API const char * smol_type_name(smol_type type);

typedef int32_t smol_token;
typedef int32_t smol_pos;
typedef int32_t smol_seq_id;

typedef struct smol_model smol_model;
typedef struct smol_context smol_context;
typedef struct smol_sampler smol_sampler;

// --- model ----------------------------------------------------------------

// Called while loading with a fraction in [0, 1]; return false to cancel.
typedef bool (*smol_progress_fn)(float progress, void * user_data);

typedef struct smol_model_params {
    smol_progress_fn progress; // NULL: no progress reports
    void * progress_user_data;
    bool use_mmap; // map the file instead of reading it (default true)
} smol_model_params;

SMOL_API smol_model_params smol_model_default_params(void);

// Loads a GGUF model. Tensors of a type smol does not support, a missing
// tensor or an architecture other than llama are refused with a message.
SMOL_API smol_status smol_model_load(const char * path, const smol_model_params * params,
                                     smol_model ** out);
SMOL_API void smol_model_free(smol_model * model);

typedef struct smol_model_info {
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t n_ff;
    int64_t n_params;
    uint64_t n_bytes; // bytes of all weight tensors
    smol_type ftype;  // the type of most matmul weights
    char name[128];   // general.name, or the file's base name
} smol_model_info;

SMOL_API void smol_model_get_info(const smol_model * model, smol_model_info * info);

// Reads a string metadata value (other types are formatted as text).
// Returns SMOL_ERR_INVALID_ARGUMENT if the key is absent.
SMOL_API smol_status smol_model_meta(const smol_model * model, const char * key, char * buf,
                                     size_t size);

// --- vocabulary -----------------------------------------------------------

SMOL_API smol_token smol_token_bos(const smol_model * model); // -1 if none
SMOL_API smol_token smol_token_eos(const smol_model * model); // -1 if none
// True for tokens that end generation (eos, eot, <|im_end|>, ...).
SMOL_API bool smol_token_is_eog(const smol_model * model, smol_token token);

// Tokenizes text. add_special prepends bos where the model asks for it;
// parse_special turns "<|im_start|>" and the like into their tokens. On
// success *n_out holds the count; if n_max is too small, returns
// SMOL_ERR_BUFFER_TOO_SMALL with *n_out set to the count needed.
SMOL_API smol_status smol_tokenize(const smol_model * model, const char * text, size_t len,
                                   bool add_special, bool parse_special, smol_token * tokens,
                                   int32_t n_max, int32_t * n_out);

// The bytes of one token (possibly part of a UTF-8 character). Control
// tokens give "" unless special is true.
SMOL_API smol_status smol_token_to_piece(const smol_model * model, smol_token token, bool special,
                                         char * buf, size_t size, size_t * n_out);

// One message of a conversation. Every field is text; NULL means absent.
// The struct grew name, tool_call_id and tool_calls after role and content,
// so its size changed: a program built against the two-field struct must be
// rebuilt, and a caller that fills only role and content zero-initialises
// the rest (smol_chat_message m = {0};).
typedef struct smol_chat_message {
    const char * role;         // "system", "user", "assistant", "tool"
    const char * content;      // NULL only in an assistant message with tool_calls
    const char * name;         // a tool's or a participant's name
    const char * tool_call_id; // in a "tool" message: the call it answers
    // JSON text: an array of OpenAI tool calls, [{"id": ..., "type": "function",
    // "function": {"name": ..., "arguments": ...}}]; arguments given as JSON
    // text reach the template as an object, as llama.cpp passes them.
    const char * tool_calls;
} smol_chat_message;

typedef struct smol_chat_params {
    bool add_assistant;      // open the assistant's turn (true)
    const char * tools_json; // JSON array of tool (function) schemas; NULL: none
} smol_chat_params;

SMOL_API smol_chat_params smol_chat_default_params(void);

// Formats a conversation with the model's chat template, rendered by
// smol's Jinja interpreter as transformers renders it (ChatML for a file
// without a template). Too small a buffer gives SMOL_ERR_BUFFER_TOO_SMALL
// with *n_out the bytes needed (the text is NUL-terminated when it fits).
// Bad JSON in a message or in tools_json is SMOL_ERR_INVALID_ARGUMENT
// naming the message and field; so is a conversation the template rejects
// (its raise_exception message is kept). A template construct smol does not
// implement is SMOL_ERR_UNSUPPORTED naming it, never rendered approximately.
SMOL_API smol_status smol_chat_apply_template_ex(const smol_model * model,
                                                 const smol_chat_message * messages, size_t n,
                                                 const smol_chat_params * params, char * buf,
                                                 size_t size, size_t * n_out);

// The simple form: no tools.
SMOL_API smol_status smol_chat_apply_template(const smol_model * model,
                                              const smol_chat_message * messages, size_t n,
                                              bool add_assistant, char * buf, size_t size,
                                              size_t * n_out);

// Tool calls read back from a reply, in the syntax the model's chat
// template teaches: "hermes" (Hermes and Qwen's <tool_call>{...}</tool_call>
// blocks; also for a template that shows none), "llama3" (Llama 3.1's JSON
// object, after <|python_tag|> or alone), "mistral" ([TOOL_CALLS] and a
// list, or name[ARGS]{...}).
SMOL_API const char * smol_chat_tool_syntax(const smol_model * model);
// The reply's text (with special tokens' text: smol_token_to_piece with
// special) as JSON: {"content": "the text without its calls, trimmed",
// "tool_calls": [{"name": "...", "arguments": "JSON text of an object"}]}.
// A call whose JSON does not parse or names no function stays content.
// Buffer as smol_chat_apply_template_ex's.
SMOL_API smol_status smol_chat_parse_tool_calls(const smol_model * model, const char * text,
                                                size_t len, char * buf, size_t size,
                                                size_t * n_out);
// Where a tool call may begin in a reply so far (its opening marker, or a
// tail that may grow into one): text before it can be shown as it comes,
// text from it on waits for the end. -1: no call can begin in it.
SMOL_API int64_t smol_chat_tool_call_start(const smol_model * model, const char * text, size_t len);

// Formats a conversation as smol_chat_apply_template_ex does and tokenizes
// it for the model, safely: special tokens ("<|im_start|>", ...) are parsed
// only in the template's own text, never in what came from the caller
// (roles, contents, names, tool calls, tools_json), so a user cannot open a
// turn or a system prompt by typing its markers. Bos is prepended where
// the model asks for it, unless the template already printed it. A
// conversation without special-token text in the caller's strings gives
// the same tokens as smol_tokenize of the rendered text with add_special
// and parse_special (bos aside). Errors as
// smol_chat_apply_template_ex's; too small a buffer gives
// SMOL_ERR_BUFFER_TOO_SMALL with *n_out the count needed.
SMOL_API smol_status smol_chat_tokenize(const smol_model * model,
                                        const smol_chat_message * messages, size_t n,
                                        const smol_chat_params * params, smol_token * tokens,
                                        int32_t n_max, int32_t * n_out);

// --- context --------------------------------------------------------------

// Where the KV cache's (layer, kv-head) slices live when a device budget is
// set: AUTO keeps as many in device memory as fit and the rest in pinned
// host memory, NONE keeps all in device memory (an error if they do not
// fit), ALL streams every one from host memory.
typedef enum smol_kv_offload {
    SMOL_KV_OFFLOAD_AUTO = 0,
    SMOL_KV_OFFLOAD_NONE = 1,
    SMOL_KV_OFFLOAD_ALL = 2,
} smol_kv_offload;

// How the offloaded slices are attended in a step of up to 8 tokens (a
// decode step, a speculative verify; prompts stream them all): AUTO splits
// them between the two ways so that both finish together (from the link's
// and the host's speeds, measured once; a device with no link to measure
// streams them), DEVICE streams each through the device's staging slots,
// HOST attends each where it lives, on the CPU's threads (n_threads),
// beside the device's work (the step's queries and new keys and values go
// to the host and the heads' outputs come back). Host attention is exact
// math in another summation order: within a stated bound of the device's
// logits, not bit-identical.
typedef enum smol_kv_attend {
    SMOL_KV_ATTEND_AUTO = 0,
    SMOL_KV_ATTEND_DEVICE = 1,
    SMOL_KV_ATTEND_HOST = 2,
} smol_kv_attend;

// Which attention kernel a GPU runs: AUTO chooses by the step's token count;
// the others force one for every step, to compare them (DECODE_WARPS: the
// decode kernel with a warp a kv head; CLASSIC: the one without tensor
// cores, split over the cells). Ignored on the CPU.
typedef enum smol_attn_kernel {
    SMOL_ATTN_AUTO = 0,
    SMOL_ATTN_DECODE = 1,
    SMOL_ATTN_DECODE_WARPS = 2,
    SMOL_ATTN_FLASH = 3,
    SMOL_ATTN_CLASSIC = 4,
} smol_attn_kernel;

// How a context over several devices (a device list: "sim,sim",
// "cuda:0,cuda:1", "cuda:0,cpu") divides the model. LAYER gives each
// device a contiguous range of layers, their weights and their KV cache,
// under its own budget and its own per-head plan (the first device also
// embeds the tokens, the last computes the outputs); a step's hidden
// states pass from each device to the next through host memory. Only
// placement changes, so the logits are those of one device of the kind.
// HEAD divides every layer's kv heads (with their query heads) and MLP rows
// evenly among the devices (Megatron's layout), each device's KV under its
// own budget and plan, the partial outputs of the attention and the MLP
// summed across the devices (an all-reduce, in rank order): within float32
// rounding of one device, not bit-identical (the sums' order differs). It
// needs the kv heads to divide among the devices and the cut columns of
// attn_output and ffn_down on whole blocks of their types. CPU and
// simulated devices all-reduce in the process; GPUs (each listed once)
// through NCCL, in a build that found it; the two kinds do not mix.
typedef enum smol_split {
    SMOL_SPLIT_LAYER = 0,
    SMOL_SPLIT_HEAD = 1,
} smol_split;

// Asked before each chunk of a smol_decode batch; true stops the call.
typedef bool (*smol_abort_fn)(void * user_data);

typedef struct smol_context_params {
    uint32_t n_ctx;      // KV cells shared by all sequences (0: 4096, capped at training)
    uint32_t n_batch;    // most tokens one smol_decode call takes (0: 512, 4096 on a GPU)
    int32_t n_threads;   // CPU threads (0: all cores)
    uint32_t n_seq_max;  // most sequences at once (default 1, at most 128)
    const char * device; // "cpu" (default, NULL too), "sim" (simulated device) or "cuda:N"
                         // (a comma-separated list: the model split over them)
    uint64_t gpu_mem;    // device memory budget in bytes (0: none, every head resident)
    // A device list: how the model is split (LAYER by default, or HEAD),
    // each device's budget (device_mem[i]; NULL: gpu_mem for each), and for
    // a layer split each device's share of the layers, in proportion as
    // llama.cpp's --tensor-split (tensor_split[i]; NULL: in proportion to
    // the budgets when every device has one, else even). Each array has one
    // entry per device.
    smol_split split;
    const uint64_t * device_mem;
    uint32_t n_device_mem;
    const float * tensor_split;
    uint32_t n_tensor_split;
    smol_kv_offload kv_offload;   // default AUTO
    smol_kv_attend kv_attend;     // offloaded slices: streamed or attended on the host (AUTO)
    int32_t head_group;           // kv heads per group (0: the planner chooses)
    smol_type kv_type;            // KV cache: F16 (default); Q8_0, Q4_0 opt-in, approximate
    const char * autotune_file;   // GPU matmul table (NULL: the default; see smol_autotune)
    smol_attn_kernel attn;        // GPU attention kernel (default AUTO)
    bool gpu_fuse;                // GPU: fused norm+matmul, rope+KV store, SwiGLU (true)
    bool gpu_graphs;              // GPU: decode steps replayed as CUDA graphs (true)
    bool gpu_pdl;                 // GPU: programmatic dependent launch, where it has it (true)
    smol_abort_fn abort_callback; // asked before each chunk of smol_decode (NULL: none)
    void * abort_user_data;       // given to abort_callback
    // The outputs are the final hidden states (n_embd floats a token, after
    // the output norm: smol_get_embeddings), not logits (false).
    bool embeddings;
    // Sliding-window layers (Gemma 3's local ones) keep every position, as
    // global ones do (false: only their window plus window_reserve positions
    // per sequence, a fraction of the memory; rolling back further, or reusing
    // a prefix whose window is gone, is then SMOL_ERR_WINDOW_GONE).
    bool swa_full;
    // Positions a sequence may roll back (smol_kv_seq_rm of its newest ones)
    // and go on exactly in the window store, which keeps that many past its
    // heads' windows (0: n_batch). Smaller for many sequences (a serving
    // engine rolls back only its own guesses).
    int32_t window_reserve;
    // Streaming heads (DuoAttention's idea; opt-in, approximate): one flag
    // per (layer, kv head), layer-major, nonzero for a head that attends to
    // the first stream_sink positions and the last stream_window only; such
    // heads keep only those (and n_batch more per sequence for rollbacks),
    // resident, in the window store. smol-heads labels a model's heads from
    // its own behaviour. NULL: none (the default).
    const uint8_t * streaming_heads;
    uint32_t n_streaming_heads; // streaming_heads' length: n_layer * n_head_kv
    int32_t stream_sink;        // positions every streaming head keeps (default 64)
    int32_t stream_window;      // the recent positions it sees (default 256)
} smol_context_params;

SMOL_API smol_context_params smol_context_default_params(void);

SMOL_API smol_status smol_context_create(smol_model * model, const smol_context_params * params,
                                         smol_context ** out);
SMOL_API void smol_context_free(smol_context * ctx);
SMOL_API uint32_t smol_context_n_ctx(const smol_context * ctx);
// The model the context runs.
SMOL_API const smol_model * smol_context_get_model(const smol_context * ctx);
SMOL_API uint32_t smol_context_n_batch(const smol_context * ctx);
SMOL_API uint32_t smol_context_n_seq_max(const smol_context * ctx);

// Memory of a context by placement, from its KV plan and as measured.
typedef struct smol_memory_info {
    uint64_t budget;          // the device budget (0: none)
    uint64_t device_weights;  // planned device bytes per kind
    uint64_t device_compute;  // arena, work space and staging of the largest chunk
    uint64_t device_staging;  // the staging slots
    uint64_t device_kv;       // resident KV
    uint64_t device_planned;  // their sum
    uint64_t device_peak;     // measured: the most device memory held so far
    uint64_t host_kv;         // offloaded KV in host memory
    uint64_t host_pinned;     // host bytes pinned (offloaded KV and staging)
    uint64_t host_pageable;   // host bytes that could not be pinned
    int32_t n_heads;          // (layer, kv head) slices
    int32_t n_heads_resident; // of them in device memory
    int32_t n_heads_host;     // of the others, attended on the host (not streamed)
    // Measured bytes/s (0: not measured) of pinned host-to-device copies and
    // of KV the host's attention reads, each alone and each while the other
    // runs: what kv_attend AUTO chose by.
    double link_rate, host_rate;
    double link_rate_shared, host_rate_shared;
    int32_t head_group; // kv heads per group
    int32_t chunk;      // tokens per prefill chunk
    smol_type kv_type;  // the KV cache's element type
    // The device ("sim", "cuda:1"; the whole context: its device list, as
    // given), its layers [first_layer, first_layer + n_layer) and of each
    // its kv heads [first_kv_head, first_kv_head + n_kv_heads) (a head
    // split's share); the string lives as long as the context.
    const char * device;
    int32_t first_layer, n_layer;
    int32_t first_kv_head, n_kv_heads;
} smol_memory_info;

// The whole context's memory: over several devices, budgets and bytes
// summed (device_peak: the sum of each device's peak), head_group and the
// rates the first device's.
SMOL_API void smol_context_memory(const smol_context * ctx, smol_memory_info * info);
// The devices a context runs on (1 unless a device list split the model)
// and the memory of device i alone, as smol_context_memory's.
SMOL_API int32_t smol_context_n_devices(const smol_context * ctx);
SMOL_API smol_status smol_context_device_memory(const smol_context * ctx, int32_t i,
                                                smol_memory_info * info);
// The KV plan as text (bytes per kind, resident heads per layer, G, chunk;
// over several devices, each device's).
SMOL_API smol_status smol_context_plan_dump(const smol_context * ctx, char * buf, size_t size,
                                            size_t * n_out);
// The program of a step of n_tokens tokens, one instruction a line per
// stream with its events, as the executor would run it after the cache's
// current contents (n_tokens <= 0: one token).
SMOL_API smol_status smol_context_schedule_dump(smol_context * ctx, int32_t n_tokens, char * buf,
                                                size_t size, size_t * n_out);

// What smol_decode keeps of a batch token (smol_batch.logits): nothing, its
// logits (smol_get_logits; any value but 0 and 2 means the same), or only its
// most likely token (smol_get_top_token), which greedy decoding needs. When
// a token keeps its token only, a GPU picks the tokens where the logits are
// and copies back only them and the logits that tokens keep.
typedef enum smol_keep {
    SMOL_KEEP_NONE = 0,
    SMOL_KEEP_LOGITS = 1,
    SMOL_KEEP_TOKEN = 2,
} smol_keep;

// A batch of tokens, each with its position and sequence, as in llama.cpp:
// tokens of several sequences may be mixed, so a serving loop batches them.
typedef struct smol_batch {
    int32_t n_tokens;
    smol_token * token;
    smol_pos * pos;
    smol_seq_id * seq_id;
    int8_t * logits; // per token, a smol_keep (NULL: the last token's logits)
} smol_batch;

// Allocates arrays for n_tokens_max tokens (n_tokens starts at 0).
SMOL_API smol_batch smol_batch_init(int32_t n_tokens_max);
SMOL_API void smol_batch_free(smol_batch * batch);
// Appends one token; returns false if the batch is full.
SMOL_API bool smol_batch_add(smol_batch * batch, int32_t capacity, smol_token token, smol_pos pos,
                             smol_seq_id seq_id, bool logits);

// Runs the model over a batch: stores each token's K and V in the cache and
// computes the logits of the tokens that asked for them. Positions of a
// sequence must continue what the cache holds for it. A long batch runs in
// chunks; when abort_callback says stop before one, the call returns
// SMOL_ERR_ABORTED, and when the backend fails (SMOL_ERR_BACKEND,
// SMOL_ERR_OUT_OF_MEMORY) it returns that; either way the cache is as it
// was before the call (no logits), and the context can go on.
SMOL_API smol_status smol_decode(smol_context * ctx, const smol_batch * batch);

// Logits (n_vocab floats) of batch token i of the last decode; i = -1 is
// the last token that asked for logits. NULL if i kept none (or only its
// token).
SMOL_API const float * smol_get_logits(smol_context * ctx, int32_t i);
// The most likely next token after batch token i of the last decode (the
// first of equal maxima, as greedy sampling takes; i = -1: the last token
// that kept something), for a token that kept its logits or its token; -1
// if it kept neither, or in a context made for embeddings.
SMOL_API smol_token smol_get_top_token(smol_context * ctx, int32_t i);
// In a context made with embeddings: the final hidden state (n_embd floats)
// of the i-th token of the last batch (-1: the last with an output), as
// smol_get_logits gives logits; NULL for a token without one, or in a
// context without embeddings.
SMOL_API const float * smol_get_embeddings(smol_context * ctx, int32_t i);

// Drops the cached tokens of seq_id with positions in [p0, p1) (p1 < 0: to
// the end); seq_id < 0 drops every sequence. A cell shared with other
// sequences stays theirs; it is freed when no sequence holds it.
SMOL_API void smol_kv_seq_rm(smol_context * ctx, smol_seq_id seq_id, smol_pos p0, smol_pos p1);
// Gives dst the cached tokens of src with positions in [p0, p1) (p1 < 0: to
// the end) without copying them: the cells are shared, as a common prompt
// prefix is. dst then continues from there with smol_decode.
SMOL_API void smol_kv_seq_cp(smol_context * ctx, smol_seq_id src, smol_seq_id dst, smol_pos p0,
                             smol_pos p1);
// The number of tokens seq_id holds in the cache.
SMOL_API int32_t smol_kv_seq_len(const smol_context * ctx, smol_seq_id seq_id);
// The lowest position at which sequence seq_id can be decoded further
// exactly: 0 unless its sliding-window layers or streaming heads lost keys
// a later position would see (then decoding below it is
// SMOL_ERR_WINDOW_GONE).
SMOL_API smol_pos smol_kv_seq_pos_exact(smol_context * ctx, smol_seq_id seq_id);
// Free KV cells.
SMOL_API int32_t smol_kv_free_cells(const smol_context * ctx);

typedef struct smol_perf {
    double t_load_ms;
    double t_prompt_ms; // decode calls with more than one token
    double t_eval_ms;   // decode calls with one token
    int64_t n_prompt_tokens;
    int64_t n_eval_tokens;
} smol_perf;

SMOL_API smol_perf smol_context_perf(const smol_context * ctx);
SMOL_API void smol_context_perf_reset(smol_context * ctx);

// --- quantization -----------------------------------------------------------

// One tensor as smol_model_quantize writes it.
typedef struct smol_quantize_tensor {
    const char * name;
    int32_t n_dims;
    int64_t ne[4];
    smol_type type_in, type_out;
    bool fell_back; // the file type's choice does not fit its rows: a fallback
    uint64_t bytes_in, bytes_out;
    int32_t index, count;
} smol_quantize_tensor;

typedef void (*smol_quantize_fn)(const smol_quantize_tensor * tensor, void * user_data);

typedef struct smol_quantize_params {
    // A llama.cpp file type: "Q4_K_M", "Q4_K_S", "Q5_K_M", "Q6_K", "Q3_K_M",
    // "Q2_K", "IQ4_XS", "Q8_0", "Q4_0", "F16", ... (smol_quantize_file_types).
    const char * file_type;
    int32_t n_threads;          // 0: all cores
    smol_quantize_fn on_tensor; // NULL: no reports
    void * user_data;
} smol_quantize_params;

SMOL_API smol_quantize_params smol_quantize_default_params(void); // Q8_0
// The file types smol_model_quantize writes, as "F32, F16, ...".
SMOL_API const char * smol_quantize_file_types(void);
// Writes the model at in_path to out_path as a file of params->file_type:
// each tensor in the type llama.cpp's llama-quantize gives it in such a file
// (more bits for some attn_v and ffn_down layers, the embeddings by their
// own rule, and blocks of 32 where rows are no multiple of 256), quantized
// by smol's reference quantizers from whatever type it has. The file loads
// in llama.cpp too.
SMOL_API smol_status smol_model_quantize(const char * in_path, const char * out_path,
                                         const smol_quantize_params * params);

// --- matmul kernels (GPU) ---------------------------------------------------

typedef void (*smol_log_fn)(const char * line, void * user_data);

// Times every matmul kernel the device offers (GEMV, small-batch and
// split-K tilings, cuBLAS) on the model's weight shapes at each batch size
// of n_tokens (NULL or n = 0: 1, 2, 4, 8, 16, 32, 64, 128, 512), keeps the
// fastest for each and writes the table to path (NULL: the default path, the
// file a context reads when its autotune_file is NULL:
// $XDG_CACHE_HOME/smol/autotune-<gpu>.txt or ~/.cache/smol/..., unless the
// developer override SMOL_AUTOTUNE_FILE names another). Entries the
// file already had for other shapes are kept. Contexts created afterwards
// use it. log (may be NULL) gets one line per measurement. A device without
// a choice of kernels (the CPU) gives SMOL_ERR_UNSUPPORTED.
SMOL_API smol_status smol_autotune(const smol_model * model, const char * device,
                                   const int32_t * n_tokens, int32_t n, const char * path,
                                   smol_log_fn log, void * user_data);

// The matmul kernels the context's last decode launched, one line "TYPE NxK
// M=m: KERNEL" per distinct choice ("" on the CPU); " +kv_store" after a
// GEMV of q, k and v that also stored k and v in the cache. Buffer rules as
// smol_chat_apply_template.
SMOL_API smol_status smol_context_matmul_kernels(const smol_context * ctx, char * buf, size_t size,
                                                 size_t * n_out);

// --- sampler --------------------------------------------------------------

typedef struct smol_sampler_params {
    float temperature;    // <= 0: greedy
    int32_t top_k;        // <= 0: off
    float top_p;          // >= 1: off
    float min_p;          // <= 0: off
    float repeat_penalty; // 1: off
    int32_t repeat_last_n;
    uint64_t seed; // same seed, same output
} smol_sampler_params;

SMOL_API smol_sampler_params smol_sampler_default_params(void);
SMOL_API smol_status smol_sampler_create(const smol_sampler_params * params, smol_sampler ** out);
SMOL_API void smol_sampler_free(smol_sampler * sampler);

// Picks a token from n_vocab logits (not changed). Penalties use the tokens
// given to smol_sampler_accept.
SMOL_API smol_token smol_sampler_sample(smol_sampler * sampler, const float * logits,
                                        int32_t n_vocab);
SMOL_API void smol_sampler_accept(smol_sampler * sampler, smol_token token);
// True when the sampler always picks the logits' first largest (temperature
// <= 0, no penalty, no grammar): smol_get_top_token then gives its token,
// and a batch may keep that alone (SMOL_KEEP_TOKEN).
SMOL_API bool smol_sampler_is_greedy(const smol_sampler * sampler);
// Resets the history, the generator and the grammar's progress.
SMOL_API void smol_sampler_reset(smol_sampler * sampler);

// Constrains the sampler to the text of a GBNF grammar (llama.cpp's format,
// start rule "root") over model's vocabulary: smol_sampler_sample only
// picks tokens whose text may continue a sentence of the grammar (a token
// may end inside a UTF-8 character), and end-of-generation tokens only
// where the text so far is a whole sentence; smol_sampler_accept advances
// the grammar. gbnf NULL removes the grammar. A grammar that does not parse
// is SMOL_ERR_INVALID_ARGUMENT with a message giving the line and column.
SMOL_API smol_status smol_sampler_set_grammar(smol_sampler * sampler, const smol_model * model,
                                              const char * gbnf);
// Does the part of the next draw that needs no logits, so that a caller can
// run it while a device computes them (the engine does, on a GPU): with a
// grammar, the whole token mask of the text's state. smol_sampler_sample
// draws the same token whether or not this ran before it. Touches the
// sampler alone: samplers may be prepared on other threads meanwhile.
SMOL_API void smol_sampler_prepare(smol_sampler * sampler);

// GBNF (start rule "root") for the JSON texts a JSON schema accepts: type,
// properties and required (in the schema's order; optional properties may
// be left out; no other properties beside them), enum, const, items,
// minItems, maxItems, anyOf, oneOf (as anyOf: its branches must not
// overlap), allOf of one schema, local $ref ("#/$defs/..."), minLength,
// maxLength, a minimum of 0 or 1 for integers, and the formats date, time,
// date-time and uuid (other formats: any string). The schema
// {"type": "object"} alone is any JSON object. An unsupported keyword or a
// bad value is SMOL_ERR_INVALID_ARGUMENT naming the schema path;
// SMOL_ERR_BUFFER_TOO_SMALL sets *n_out to the bytes needed (with the
// terminating zero).
SMOL_API smol_status smol_json_schema_to_grammar(const char * schema, char * buf, size_t size,
                                                 size_t * n_out);

// --- speculative decoding -------------------------------------------------
//
// A generator over one sequence (0) of a target context that lets a
// proposer guess the next tokens and has the target check all of them in
// one decode; rejected guesses leave the cache (the draft's too).
// Greedy (sampling.temperature <= 0, the default): the guesses that match
// the target's own argmax are kept and the first mismatch is replaced by
// the target's choice, so the output is the token sequence plain greedy
// decoding gives (on the CPU, bit for bit: a token's logits are the same
// alone and batched).
// Sampling (temperature > 0, with the sampler's top-k, top-p and min-p):
// speculative rejection sampling. A guess x that the draft drew with
// probability q(x) is kept with probability min(1, p(x) / q(x)), p being the
// target's distribution after the same transform; the first rejected guess
// is replaced by a draw from the normalised residual max(0, p - q), and when
// every guess is kept a further token is drawn from p. An n-gram guess is
// certain (q(x) = 1). The tokens so follow the distribution that plain
// sampling with these settings draws from, exactly; the draws come from a
// generator of the spec's own, seeded with sampling.seed, so runs replay.
// Proposers: n-gram lookup in the prompt and the text so far (draft_model
// NULL), or a smaller draft model with the same vocabulary, run in a
// context of its own (greedily, or drawing from its own distribution after
// the same transform), or the target's own model over a window of the text
// (self_window). With tree_budget (a draft model), SpecExec: the
// draft expands the likeliest continuations best first, by their cumulative
// draft probability, into a token tree, and the target verifies the whole
// tree in one decode, each branch a sequence (1, 2, ...) sharing the cells
// of sequence 0's text, its tokens at their positions along the path. The
// path kept is, greedy, the longest of the target's own choices; sampling,
// the one SpecInfer's rule walks: the children of a node are independent
// draws from the draft, tried in turn against the target's distribution
// and, after each rejection, its residual, so the tokens stay exact. The
// other branches leave the cache.

typedef struct smol_spec_params {
    int32_t draft_max;        // most tokens proposed per step (8): a chain proposes one
                              // more than it kept after a rejection, twice as many after
                              // all were kept
    int32_t ngram_min;        // lookup: the shortest suffix matched (2)
    int32_t ngram_max;        // lookup: the longest suffix tried first (4)
    smol_model * draft_model; // NULL: n-gram lookup; not owned
    uint32_t draft_n_threads; // the draft context's threads (0: as the target's default)
    // temperature <= 0: greedy (the default); else exact speculative sampling
    // with top_k, top_p, min_p and seed; repeat_penalty must be 1.
    smol_sampler_params sampling;
    // > 0: a token tree (draft_model) of at most this many tokens in
    // the target's verify batch, each branch counted with the guaranteed
    // token it starts from: at most the batch, at most 128, and the target
    // context needs n_seq_max >= max(1, tree_budget / 2) + 1 (a sequence a branch
    // besides 0). draft_max is then unused. 0: a chain of draft_max (the default).
    int32_t tree_budget;
    // > 0 (no draft_model): self-speculation. The target's own model is the
    // draft, in a context of its own on the target's device, every head
    // resident, whose attention sees the text's first SMOL_SPEC_SELF_SINK
    // tokens and its last self_window: a draft step moves no offloaded KV,
    // and the target verifies against its whole cache. 0: off (the default).
    int32_t self_window;
} smol_spec_params;

// The first tokens of the text a self-speculation draft keeps beside its
// window (attention sinks, as StreamingLLM keeps them).
#define SMOL_SPEC_SELF_SINK 4

typedef struct smol_spec_stats {
    int64_t n_steps;    // target decodes made by smol_spec_next
    int64_t n_drafted;  // tokens proposed
    int64_t n_accepted; // of those, kept
    int64_t n_tokens;   // tokens returned
} smol_spec_stats;

typedef struct smol_spec smol_spec;

SMOL_API smol_spec_params smol_spec_default_params(void);
// The target context must be empty. A draft model whose vocabulary differs
// from the target's is SMOL_ERR_INVALID_ARGUMENT naming the first differing
// token; draft_max beyond the context's batch is refused too.
SMOL_API smol_status smol_spec_create(smol_context * target, const smol_spec_params * params,
                                      smol_spec ** out);
SMOL_API void smol_spec_free(smol_spec * spec);
// Decodes the prompt (n >= 1 tokens) into the target (and the draft). A spec
// that has a text already starts a new one: both caches are emptied first
// (the draft's context is kept, so a spec serves prompt after prompt).
SMOL_API smol_status smol_spec_prompt(smol_spec * spec, const smol_token * tokens, int32_t n);
// The next tokens: at least one, at most n_max (one target decode).
SMOL_API smol_status smol_spec_next(smol_spec * spec, smol_token * out, int32_t n_max,
                                    int32_t * n_out);
SMOL_API smol_spec_stats smol_spec_get_stats(const smol_spec * spec);

// --- serving engine -------------------------------------------------------
//
// Many requests over one model: the engine owns a context whose sequence
// slots it fills from a queue, and each step runs one batch that mixes the
// next token of every running request with bounded chunks of admitted
// prompts (continuous batching, chunked prefill). A prefix cache (a radix
// tree over blocks of tokens) lets a request reuse the KV of any earlier
// request's prefix. When the cache runs out of cells, cached prefixes are
// evicted (least recently used first), then the youngest request is
// preempted: queued again and recomputed later, which gives the same tokens.
// On the CPU a request's logits are the same bits whatever else is batched
// with it, so batching never changes greedy output.
// Speculation (draft_max > 0): a decoding request adds up to draft_max
// guesses after its next token to the step's batch, from n-gram lookup in
// its prompt and output or from a draft model with the same vocabulary
// (run in a context of its own, a sequence per slot); they are checked by
// smol_spec's rule (greedy: the output is plain decoding's; sampling: exact
// speculative rejection sampling, its draws from a generator of the
// request's own, seeded with its sampler's seed) and the rejected ones
// leave both caches. Guesses never take a place a decode token or a prompt
// chunk needs before them in the batch, nor cells another request needs,
// and never reach past max_tokens. A request with a grammar or a repeat
// penalty does not speculate (the mask and the penalty of a guess depend on
// guesses not yet accepted).

typedef struct smol_engine smol_engine;
typedef int64_t smol_request_id;

typedef enum smol_finish_reason {
    SMOL_FINISH_NONE = 0,      // still generating
    SMOL_FINISH_STOP = 1,      // an end-of-generation or stop token
    SMOL_FINISH_LENGTH = 2,    // max_tokens reached
    SMOL_FINISH_CANCELLED = 3, // smol_engine_cancel, or the callback said stop
    SMOL_FINISH_ERROR = 4,     // the engine could not run it (see message)
} smol_finish_reason;

// One event per generated token; the last event of a request has finish set
// (its token is the last one generated, or -1 if none comes with it).
typedef struct smol_engine_event {
    smol_request_id id;
    smol_token token;
    const float * logits; // what token was drawn from (n_vocab); NULL if none
    int32_t n_vocab;
    smol_finish_reason finish;
    int32_t n_prompt;     // prompt tokens
    int32_t n_cached;     // of them, taken from the prefix cache
    int32_t n_generated;  // tokens generated so far, this one included
    const char * message; // with SMOL_FINISH_ERROR, what went wrong
    // Milliseconds from submission: to its first admission into a sequence
    // slot (the queue wait; -1 before), and to its first generated token
    // (-1 before).
    double queue_ms;
    double first_token_ms;
} smol_engine_event;

// Called on the thread that steps the engine; return false to cancel the
// request (its final event follows). Do not step the engine from it.
typedef bool (*smol_engine_event_fn)(const smol_engine_event * event, void * user_data);

typedef struct smol_engine_params {
    smol_context_params context; // n_ctx: cells for all requests; n_seq_max: parallel
                                 // requests (at most 127; one sequence holds the cache)
    uint32_t n_chunk;            // most prompt tokens of one request per step (256)
    uint32_t n_queue_max;        // most requests waiting for a slot (256); more: SMOL_ERR_BUSY
    bool prefix_cache;           // reuse the KV of earlier prefixes (true)
    uint32_t prefix_block;       // tokens per cached block (16)
    bool worker_thread;          // step on an internal thread (false: call step)
    int32_t draft_max;           // most guesses per request and step (0: no speculation)
    int32_t ngram_min;           // lookup: the shortest suffix matched (2)
    int32_t ngram_max;           // lookup: the longest suffix tried first (4)
    // NULL: n-gram lookup; else a draft model with the target's vocabulary
    // and at most its parameters (not owned; outlives the engine).
    smol_model * draft_model;
    uint32_t draft_n_threads; // the draft context's threads (0: as the target's)
} smol_engine_params;

typedef struct smol_request_params {
    const smol_token * prompt; // copied at submission
    int32_t n_prompt;
    smol_sampler_params sampler;
    int32_t max_tokens;             // <= 0: up to the context; prompt + max_tokens <= n_ctx
    const smol_token * stop_tokens; // besides end-of-generation tokens
    int32_t n_stop_tokens;
    bool ignore_eog;      // keep generating through end-of-generation tokens
    const char * grammar; // GBNF the output must follow (smol_sampler_set_grammar); NULL: none
    // Guesses per step: < 0 (the default) the engine's draft_max, 0 none
    // (this request does not speculate), else at most this many.
    int32_t draft_max;
    // Its events need not carry logits (event.logits may be NULL): a greedy
    // request (temperature <= 0, no penalty, grammar or speculation) then
    // keeps only its top token a step (SMOL_KEEP_TOKEN), which a GPU picks
    // where the logits are. false: every event carries them.
    bool skip_event_logits;
    smol_engine_event_fn on_event;
    void * user_data;
} smol_request_params;

typedef struct smol_engine_stats {
    int32_t n_running;
    int32_t n_queued;
    int64_t n_finished;
    int64_t n_prompt_tokens;    // prompt tokens of admitted requests
    int64_t n_prefill_tokens;   // prompt tokens computed (the rest came cached)
    int64_t n_generated_tokens; // tokens generated
    int64_t n_prefix_hit_tokens;
    int64_t n_prefix_hit_requests;
    double prefix_hit_rate; // n_prefix_hit_tokens / n_prompt_tokens
    int32_t n_prefix_blocks;
    int64_t n_preempted;
    int64_t n_steps;
    int32_t n_cells;
    int32_t n_cells_used;
    uint64_t kv_bytes_resident;  // bytes of the cells in use, in resident heads
    uint64_t kv_bytes_offloaded; // bytes of the cells in use, in heads offloaded to host memory
    int64_t n_spec_drafted;      // guesses verified (speculation)
    int64_t n_spec_accepted;     // of them, kept
    int64_t n_spec_verifies;     // request-steps that verified at least one guess
    // Where the engine's steps spent their time, in seconds so far: taking
    // requests in, planning the batch and speculation's guesses (plan), the
    // model's step (decode: on a device its launch and the wait for it), the
    // draws (draw), and moving requests on with their events, the callbacks
    // included (emit).
    double t_plan_s;
    double t_decode_s;
    double t_draw_s;
    double t_emit_s;
} smol_engine_stats;

SMOL_API smol_engine_params smol_engine_default_params(void);
SMOL_API smol_request_params smol_request_default_params(void);
SMOL_API smol_status smol_engine_create(smol_model * model, const smol_engine_params * params,
                                        smol_engine ** out);
// Cancels what is left (final events are not sent) and frees the engine.
SMOL_API void smol_engine_free(smol_engine * engine);
// Queues a request. SMOL_ERR_INVALID_ARGUMENT for an empty prompt, tokens
// outside the vocabulary or prompt + max_tokens beyond n_ctx; SMOL_ERR_BUSY
// when the queue is full.
SMOL_API smol_status smol_engine_submit(smol_engine * engine, const smol_request_params * params,
                                        smol_request_id * out);
// Ends a request early; its final event (SMOL_FINISH_CANCELLED) comes from
// the next step, unless it finished first. SMOL_ERR_INVALID_ARGUMENT for an
// id the engine never gave.
SMOL_API smol_status smol_engine_cancel(smol_engine * engine, smol_request_id id);
// Runs one batch (events are sent from here); *n_active gets the requests
// still running or queued. Not with worker_thread.
SMOL_API smol_status smol_engine_step(smol_engine * engine, int32_t * n_active);
SMOL_API smol_engine_stats smol_engine_get_stats(const smol_engine * engine);

#ifdef __cplusplus
}
#endif

#endif // SMOL_H
