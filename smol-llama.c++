// smol-llama.c++ - runs batches through a loaded model (smol-llama-load.c++
// loads it): a context's stages, one per device of a layer or head split,
// cell assignment in the KV cache, the graph of one forward pass, logits.

#include "smol-llama.h"

#include "smol-collective.h"
#include "smol-cpu-kernels.h"
#include "smol-cpu.h"
#include "smol-error.h"
#include "smol-quant.h"
#include "smol-schedule.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

namespace smol {

namespace {

double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

} // namespace

// --- context ----------------------------------------------------------------------

static int default_threads() {
    const unsigned n = std::thread::hardware_concurrency();
    return n ? int(n) : 1;
}

// The device options a context's parameters ask for; checks the enums the
// caller set (before any backend is made).
static backend_options backend_options_of(const smol_context_params & p) {
    const int offload = c_enum(p.kv_offload);
    if (offload != SMOL_KV_OFFLOAD_AUTO && offload != SMOL_KV_OFFLOAD_NONE &&
        offload != SMOL_KV_OFFLOAD_ALL) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "kv_offload " + std::to_string(offload) +
                        " is none of SMOL_KV_OFFLOAD_AUTO, _NONE or _ALL");
    }
    const int attend = c_enum(p.kv_attend);
    if (attend != SMOL_KV_ATTEND_AUTO && attend != SMOL_KV_ATTEND_DEVICE &&
        attend != SMOL_KV_ATTEND_HOST) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "kv_attend " + std::to_string(attend) +
                        " is none of SMOL_KV_ATTEND_AUTO, _DEVICE or _HOST");
    }
    backend_options o;
    o.fuse = p.gpu_fuse;
    o.graphs = p.gpu_graphs;
    o.pdl = p.gpu_pdl;
    switch (c_enum(p.attn)) {
    case SMOL_ATTN_AUTO:
        o.attn = attn_kernel::automatic;
        break;
    case SMOL_ATTN_DECODE:
        o.attn = attn_kernel::decode;
        break;
    case SMOL_ATTN_DECODE_WARPS:
        o.attn = attn_kernel::decode_warps;
        break;
    case SMOL_ATTN_FLASH:
        o.attn = attn_kernel::flash;
        break;
    case SMOL_ATTN_CLASSIC:
        o.attn = attn_kernel::classic;
        break;
    default:
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "attn " + std::to_string(c_enum(p.attn)) +
                        " names no attention kernel; use SMOL_ATTN_AUTO, _DECODE, "
                        "_DECODE_WARPS, _FLASH or _CLASSIC");
    }
    if (p.autotune_file) o.autotune_file = p.autotune_file;
    return o;
}

// The KV cache's type: f16, or q8_0 / q4_0 blocks of 32 along a head.
static void check_kv_type(smol_type t, int32_t head_dim, const backend & be) {
    const int v = c_enum(t);
    if (v != SMOL_TYPE_F16 && v != SMOL_TYPE_Q8_0 && v != SMOL_TYPE_Q4_0) {
        const char * name = smol_type_name(t);
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "kv_type " + (name ? std::string(name) : std::to_string(v)) +
                        " is not a KV cache type; use SMOL_TYPE_F16, _Q8_0 or _Q4_0 "
                        "(--kv-type f16, q8_0 or q4_0)");
    }
    if (v != SMOL_TYPE_F16 && head_dim % 32 != 0) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    std::string("kv_type ") + smol_type_name(t) + " stores blocks of 32 along a " +
                        "head, and this model's heads have " + std::to_string(head_dim) +
                        " elements; use --kv-type f16");
    }
    if (!be.supports_kv_type(t)) {
        throw error(SMOL_ERR_UNSUPPORTED, std::string(be.name()) + " has no kernels for a " +
                                              smol_type_name(t) +
                                              " KV cache yet; use --kv-type f16 or run on "
                                              "the CPU (device \"cpu\")");
    }
}

// One device's part of a context: layers [l0, l1), their weights and their
// KV under the device's budget and plan; the first stage also embeds the
// tokens, the last computes the outputs, and every other takes the hidden
// states the one before it handed over. Torn down in reverse: the
// placement before the backend it releases its memory through.
struct llama_context::stage {
    stage(const kv_cache & kv, std::unique_ptr<backend> b, int32_t first_layer, int32_t end_layer,
          int32_t n_head_kv)
        : be(std::move(b)), l0(first_layer), l1(end_layer), place(kv, plan),
          g(64 + size_t(end_layer - first_layer) * (32 + 8 * size_t(n_head_kv))) {}
    ~stage() {
        for (void * p : owned) be->release(p);
        if (hidden) be->release_host(hidden);
    }
    stage(const stage &) = delete;
    stage & operator=(const stage &) = delete;

    std::unique_ptr<backend> be;
    std::string name; // as the device list gives it
    int32_t l0 = 0, l1 = 0;
    bool first = true, last = true;
    // A head split's rank (-1: a layer split's stage, or one device): it
    // holds kv heads [kv0, kv1) of every layer with their query heads, and
    // rows [ff0, ff1) of the MLP; the others are the whole model's.
    int32_t rank = -1;
    int32_t kv0 = 0, kv1 = 0, ff0 = 0, ff1 = 0;
    uint64_t budget = 0;
    kv_plan plan;
    kv_placement place; // the KV storage by the plan and a step's copies
    // The weights as this stage's backend sees them: the embeddings (first
    // stage), the output's (last), its layers'.
    weight tok_embd, output_norm, output;
    std::vector<llama_layer> layers;
    std::vector<void *> owned; // backend memory of the weights
    // A rank's column slices of wo and w_down, copied out of the file.
    std::vector<std::vector<uint8_t>> sliced;
    graph g;
    // The shape g was built for, while its generation is built_gen.
    step_shape built{};
    uint64_t built_gen = ~uint64_t(0);
    // g's last node: the outputs (last stage) or the hidden states the next
    // stage takes.
    tensor * out = nullptr;
    tensor * out_logits = nullptr; // beside top tokens, the logits they were picked from
    // Stages after the first: the hidden states of a chunk's tokens, host
    // memory of this stage's backend that the one before downloads into.
    float * hidden = nullptr;
};

// The names of a device list: "sim,sim" -> {"sim", "sim"}.
static std::vector<std::string> device_names(const std::string & list) {
    std::vector<std::string> out;
    for (size_t a = 0;;) {
        const size_t b = list.find(',', a);
        std::string name = list.substr(a, b == std::string::npos ? std::string::npos : b - a);
        name.erase(0, name.find_first_not_of(' '));
        name.erase(name.find_last_not_of(' ') + 1);
        if (name.empty()) {
            throw error(SMOL_ERR_INVALID_ARGUMENT,
                        "the device list '" + list +
                            "' has an empty entry; name each device once, such as "
                            "\"cuda:0,cuda:1\"");
        }
        out.push_back(name);
        if (b == std::string::npos) return out;
        a = b + 1;
    }
}

// Whether the model divides among n devices of a head split: the kv heads
// evenly (each device whole GQA groups), and wo and w_down (whose columns
// the devices share) cut on whole blocks of their types.
static void check_head_split(const llama_model & m, int32_t n, const std::string & list) {
    const llama_hparams & hp = m.hp;
    if (hp.n_head_kv % n != 0) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "a head split gives each device as many kv heads, and the model's " +
                        std::to_string(hp.n_head_kv) + " do not divide among the " +
                        std::to_string(n) + " devices of '" + list +
                        "'; give a number of devices that divides them, or split by layers "
                        "(--split layer)");
    }
    for (int32_t l = 0; l < hp.n_layer; ++l) {
        const llama_layer & L = m.layers[size_t(l)];
        for (const auto & [name, w] :
             {std::pair<const char *, const weight *>{"attn_output", &L.wo},
              {"ffn_down", &L.w_down}}) {
            const int64_t blk = type_block_elems(w->type);
            for (int32_t r = 1; r < n; ++r) {
                const int64_t c = w->ne0 * r / n;
                if (blk > 0 && c % blk == 0) continue;
                throw error(SMOL_ERR_UNSUPPORTED,
                            "a head split over " + std::to_string(n) + " devices cuts blk." +
                                std::to_string(l) + "." + name + " (" + smol_type_name(w->type) +
                                ", blocks of " + std::to_string(blk) + ") at column " +
                                std::to_string(c) +
                                ", inside a block; split by layers (--split layer), use another "
                                "number of devices, or a type of smaller blocks (smol-quantize)");
            }
        }
    }
}

// Each device's first layer, and n_layer last: contiguous ranges in
// proportion to the shares, none empty.
static std::vector<int32_t> layer_bounds(int32_t n_layer, const std::vector<double> & shares,
                                         const std::vector<std::string> & names) {
    double total = 0;
    for (const double s : shares) total += s;
    std::vector<int32_t> bounds(shares.size() + 1, 0);
    double sum = 0;
    for (size_t i = 0; i < shares.size(); ++i) {
        sum += shares[i];
        bounds[i + 1] =
            i + 1 == shares.size() ? n_layer : int32_t(std::lround(double(n_layer) * sum / total));
        if (bounds[i + 1] <= bounds[i]) {
            throw error(SMOL_ERR_INVALID_ARGUMENT,
                        "device " + std::to_string(i) + " (" + names[i] +
                            ") gets none of the model's " + std::to_string(n_layer) +
                            " layers by its share; give it a larger share (tensor_split, "
                            "--tensor-split) or leave it out of the device list");
        }
    }
    return bounds;
}

// Streaming heads from the parameters: checked, and copied (the caller
// owns the array).
void llama_context::take_streaming_heads(bool has_swa) {
    const smol_context_params p = params;
    params.streaming_heads = nullptr; // not kept
    if (!p.streaming_heads) return;
    const llama_hparams & hp = model.hp;
    const size_t n = size_t(hp.n_layer) * size_t(hp.n_head_kv);
    if (p.n_streaming_heads != n) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "streaming_heads has " + std::to_string(p.n_streaming_heads) +
                        " flags and this model " + std::to_string(n) + " kv heads (" +
                        std::to_string(hp.n_layer) + " layers x " + std::to_string(hp.n_head_kv) +
                        "); label this model's heads with smol-heads");
    }
    if (p.stream_sink < 0 || p.stream_window <= 0) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "stream_sink " + std::to_string(p.stream_sink) + " must not be negative and " +
                        "stream_window " + std::to_string(p.stream_window) + " must be positive");
    }
    if (has_swa) {
        throw error(SMOL_ERR_UNSUPPORTED, "streaming heads on a model with sliding-window layers "
                                          "are not supported; leave --streaming-heads off");
    }
    for (const auto & st : stages_) {
        if (st->be->supports_attention_sinks()) continue;
        throw error(SMOL_ERR_UNSUPPORTED, std::string(st->be->name()) +
                                              " has no streaming-head attention yet; leave "
                                              "--streaming-heads off or run on the CPU");
    }
    streaming.assign(n, 0);
    for (size_t i = 0; i < n; ++i) streaming[i] = p.streaming_heads[i] ? 1 : 0;
    if (std::find(streaming.begin(), streaming.end(), uint8_t(1)) == streaming.end()) {
        streaming.clear();
        return;
    }
    stream_sink = p.stream_sink;
    stream_window = p.stream_window;
}

llama_context::llama_context(const llama_model & m, const smol_context_params & p)
    : model(m), params(p) {
    const llama_hparams & hp = m.hp;
    device_list_ = p.device && *p.device ? p.device : "cpu";
    const std::vector<std::string> names = device_names(device_list_);
    const size_t n_dev = names.size();
    const int split = c_enum(p.split);
    if (split != SMOL_SPLIT_LAYER && split != SMOL_SPLIT_HEAD) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "split " + std::to_string(split) + " is neither SMOL_SPLIT_LAYER nor _HEAD");
    }
    by_heads_ = n_dev > 1 && split == SMOL_SPLIT_HEAD;
    if (by_heads_ && p.tensor_split) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "tensor_split shares the layers of a layer split; a head split divides "
                    "every layer's heads evenly: leave it out (--tensor-split) or split by "
                    "layers (--split layer)");
    }
    if (by_heads_) check_head_split(m, int32_t(n_dev), device_list_);
    auto check_list = [&](const char * what, const void * a, uint32_t n) {
        if (n == 0 && !a) return;
        if (!a || n != n_dev) {
            throw error(SMOL_ERR_INVALID_ARGUMENT,
                        std::string(what) + " has " + std::to_string(a ? n : 0) +
                            " entries for the " + std::to_string(n_dev) + " device(s) of '" +
                            device_list_ + "'; give one per device");
        }
    };
    check_list("device_mem", p.device_mem, p.n_device_mem);
    check_list("tensor_split", p.tensor_split, p.n_tensor_split);
    if (!by_heads_ && n_dev > size_t(hp.n_layer)) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "the device list '" + device_list_ + "' names " + std::to_string(n_dev) +
                        " devices and the model has " + std::to_string(hp.n_layer) +
                        " layers; give at most one device a layer");
    }
    std::vector<uint64_t> budgets(n_dev, p.gpu_mem);
    if (p.device_mem) budgets.assign(p.device_mem, p.device_mem + n_dev);
    std::vector<double> shares(n_dev, 1.0);
    if (p.tensor_split) {
        for (size_t i = 0; i < n_dev; ++i) {
            const double s = p.tensor_split[i];
            if (!std::isfinite(s) || s < 0) {
                throw error(SMOL_ERR_INVALID_ARGUMENT,
                            "tensor_split[" + std::to_string(i) + "] is " + std::to_string(s) +
                                "; a device's share of the layers is a number >= 0");
            }
            shares[i] = s;
        }
    } else if (std::all_of(budgets.begin(), budgets.end(), [](uint64_t b) { return b > 0; })) {
        for (size_t i = 0; i < n_dev; ++i) shares[i] = double(budgets[i]);
    }
    const std::vector<int32_t> bounds =
        by_heads_ ? std::vector<int32_t>() : layer_bounds(hp.n_layer, shares, names);
    if (params.n_threads <= 0) params.n_threads = default_threads();
    const backend_options options = backend_options_of(p);
    for (size_t i = 0; i < n_dev; ++i) {
        auto be = make_backend(names[i], params.n_threads, options);
        if (by_heads_ && !be->supports_all_reduce()) {
            throw error(SMOL_ERR_UNSUPPORTED,
                        std::string(be->name()) +
                            " cannot all-reduce a head split's partial sums in this build (a "
                            "GPU needs NCCL, found when smol is configured; AMD GPUs have "
                            "none yet); split by layers (SMOL_SPLIT_LAYER, --split layer)");
        }
        if (by_heads_ && i > 0 &&
            be->reduces_in_process() != stages_.front()->be->reduces_in_process()) {
            throw error(SMOL_ERR_UNSUPPORTED,
                        "the head split over '" + device_list_ +
                            "' mixes GPUs (which all-reduce through NCCL) with devices in host "
                            "memory (cpu, sim); list one kind, or split by layers (--split "
                            "layer)");
        }
        auto st = std::make_unique<stage>(kv, std::move(be), by_heads_ ? 0 : bounds[i],
                                          by_heads_ ? hp.n_layer : bounds[i + 1], hp.n_head_kv);
        st->name = names[i];
        st->budget = budgets[i];
        st->first = by_heads_ || i == 0;
        st->last = by_heads_ ? i == 0 : i + 1 == n_dev;
        st->kv1 = hp.n_head_kv;
        st->ff1 = hp.n_ff;
        if (by_heads_) {
            const int32_t D = int32_t(n_dev), r = int32_t(i);
            st->rank = r;
            st->kv0 = hp.n_head_kv * r / D;
            st->kv1 = hp.n_head_kv * (r + 1) / D;
            st->ff0 = hp.n_ff * r / D;
            st->ff1 = hp.n_ff * (r + 1) / D;
        }
        stages_.push_back(std::move(st));
    }
    if (by_heads_) {
        comm_ = std::make_unique<collective>(int32_t(n_dev));
        ranks_ = std::make_unique<thread_pool>(int32_t(n_dev));
        for (const auto & st : stages_) {
            st->g.comm = comm_.get();
            st->g.rank = st->rank;
        }
        gpu_group_ = !stages_.front()->be->reduces_in_process();
        if (gpu_group_) join_gpu_group(rank_backends());
    }
    const backend & be0 = *stages_.front()->be;
    auto all_stages = [&](auto && can) {
        return std::all_of(stages_.begin(), stages_.end(),
                           [&](const std::unique_ptr<stage> & st) { return can(*st->be); });
    };

    if (params.n_ctx == 0) params.n_ctx = uint32_t(std::min(4096, hp.n_ctx_train));
    if (params.n_batch == 0) params.n_batch = be0.default_batch();
    params.n_batch = std::min(params.n_batch, params.n_ctx);
    if (params.n_seq_max == 0) params.n_seq_max = 1;
    if (params.n_seq_max > uint32_t(kv_max_seqs)) {
        throw error(SMOL_ERR_INVALID_ARGUMENT, "n_seq_max " + std::to_string(params.n_seq_max) +
                                                   " is above " + std::to_string(kv_max_seqs) +
                                                   ", the most sequences a KV cell can hold");
    }
    // Not kept: the caller owns the strings and arrays.
    params.device = nullptr;
    params.autotune_file = nullptr;
    params.device_mem = nullptr;
    params.n_device_mem = 0;
    params.tensor_split = nullptr;
    params.n_tensor_split = 0;
    if (params.n_ctx > (1u << 24)) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "n_ctx " + std::to_string(params.n_ctx) + " is too large for the CPU cache");
    }
    for (const auto & st : stages_) check_kv_type(params.kv_type, hp.head_dim, *st->be);
    kv.init(hp.n_layer, hp.n_head_kv, hp.head_dim, int32_t(params.n_ctx), params.kv_type);
    const size_t nb = params.n_batch;
    tokens_.resize(nb);
    positions_.resize(nb);
    seqs_.resize(nb);
    cells_.resize(nb);
    batch_cells_.resize(nb);
    out_ids_.resize(nb);
    out_row_.resize(nb);
    out_logits_.resize(nb);
    slots_.resize(nb);
    reserve_logits(size_t(out_width()));
    const bool has_swa =
        hp.n_swa > 0 && std::find(hp.swa.begin(), hp.swa.end(), true) != hp.swa.end();
    take_streaming_heads(has_swa);
    if (params.window_reserve < 0) {
        throw error(SMOL_ERR_INVALID_ARGUMENT, "window_reserve " +
                                                   std::to_string(params.window_reserve) +
                                                   " is negative; give 0 for n_batch");
    }
    const int32_t reserve =
        params.window_reserve > 0 ? params.window_reserve : int32_t(params.n_batch);
    // Sliding-window layers, or streaming heads, keep their window plus a
    // reserve of window_reserve positions per sequence (kv_window), unless
    // asked to keep all, or a backend cannot, or that would be no smaller.
    const int32_t window = has_swa && !params.swa_full ? hp.n_swa : stream_window;
    const int32_t sink = has_swa ? 0 : stream_sink;
    if (window > 0 && all_stages([](const backend & be) { return be.supports_window_store(); })) {
        const int32_t n_slots = kv_window::slots_needed(
            kv.n_cells, int32_t(params.n_seq_max), window, reserve, int32_t(params.n_batch), sink);
        if (n_slots < kv.n_cells) win.init(kv, window, reserve, n_slots, sink);
    }

    // Each device's weights (their slices for a head split), once; a type
    // a device does not compute with is refused before anything is placed,
    // naming the first such tensor.
    for (const auto & st : stages_) {
        stage_weights(*st);
        std::vector<std::pair<std::string, const weight *>> ws;
        if (st->first) ws.push_back({"token_embd", &st->tok_embd});
        if (st->last) {
            ws.push_back({"output_norm", &st->output_norm});
            ws.push_back({"output", &st->output});
        }
        for (size_t i = 0; i < st->layers.size(); ++i) {
            st->layers[i].each([&](const char * name, const weight & w) {
                ws.push_back({"blk." + std::to_string(st->l0 + int32_t(i)) + "." + name, &w});
            });
        }
        for (const auto & [what, w] : ws) {
            if (st->be->supports_weights(w->type)) continue;
            throw error(SMOL_ERR_UNSUPPORTED,
                        std::string(st->be->name()) + " does not compute with " +
                            smol_type_name(w->type) + " weights yet (" + what +
                            " is one); run this model on the CPU (device \"cpu\"), or convert "
                            "it with smol-quantize to a type the device supports");
        }
    }

    // Plan each device before allocating anything. A step's chunk is the
    // smallest of the plans' (every device runs the same chunks): a device
    // that planned a larger one plans again for it.
    for (const auto & st : stages_) plan_stage(*st, int32_t(params.n_batch));
    chunk_ = int32_t(params.n_batch);
    for (const auto & st : stages_) chunk_ = std::min(chunk_, st->plan.chunk);
    for (const auto & st : stages_) {
        if (st->plan.chunk > chunk_) plan_stage(*st, chunk_);
    }
    for (const auto & st : stages_) place_stage(*st);
}

static uint64_t bytes_of(const weight & w) {
    return cpu::row_bytes(w.type, w.ne0) * size_t(w.ne1);
}

// The weights a stage holds, as views of the file's: its layers' whole, or
// for a head split's rank the rows of its heads in wq, wk, wv and of its
// MLP rows in the gate and up, and the same columns of wo and w_down,
// copied out (a row's columns are not contiguous); norms and embeddings
// whole.
void llama_context::stage_weights(stage & st) {
    const llama_model & m = model;
    const llama_hparams & hp = m.hp;
    st.tok_embd = m.tok_embd;
    st.output_norm = m.output_norm;
    st.output = m.output;
    st.layers.assign(m.layers.begin() + st.l0, m.layers.begin() + st.l1);
    st.sliced.clear();
    if (st.rank < 0) return;
    const int64_t hd = hp.head_dim, per_q = hp.n_head / hp.n_head_kv;
    const int64_t q0 = st.kv0 * per_q * hd, q1 = st.kv1 * per_q * hd;
    auto rows = [](const weight & w, int64_t r0, int64_t r1) {
        weight s = w;
        s.ne1 = r1 - r0;
        s.data = static_cast<const uint8_t *>(w.data) + size_t(r0) * bytes_of({w.type, w.ne0});
        return s;
    };
    auto cols = [&](const weight & w, int64_t c0, int64_t c1) {
        const size_t row = bytes_of({w.type, w.ne0}), from = bytes_of({w.type, c0}),
                     n = bytes_of({w.type, c1 - c0});
        std::vector<uint8_t> & out = st.sliced.emplace_back(n * size_t(w.ne1));
        const auto * src = static_cast<const uint8_t *>(w.data);
        for (int64_t r = 0; r < w.ne1; ++r)
            std::memcpy(out.data() + size_t(r) * n, src + size_t(r) * row + from, n);
        weight s = w;
        s.ne0 = c1 - c0;
        s.data = out.data();
        return s;
    };
    for (llama_layer & L : st.layers) {
        L.wq = rows(L.wq, q0, q1);
        L.wk = rows(L.wk, st.kv0 * hd, st.kv1 * hd);
        L.wv = rows(L.wv, st.kv0 * hd, st.kv1 * hd);
        L.wo = cols(L.wo, q0, q1);
        L.w_gate = rows(L.w_gate, st.ff0, st.ff1);
        L.w_up = rows(L.w_up, st.ff0, st.ff1);
        L.w_down = cols(L.w_down, st.ff0, st.ff1);
    }
}

// What a stage holds, for messages and the plan: "layers 3-4 of 5", or a
// head split's "rank 1 of 2: kv heads 2-3 of 4, MLP rows 48-95 of 96".
std::string llama_context::stage_text(const stage & st) const {
    const llama_hparams & hp = model.hp;
    if (st.rank < 0) {
        return "layers " + std::to_string(st.l0) + "-" + std::to_string(st.l1 - 1) + " of " +
               std::to_string(hp.n_layer);
    }
    return "rank " + std::to_string(st.rank) + " of " + std::to_string(stages_.size()) +
           ": kv heads " + std::to_string(st.kv0) + "-" + std::to_string(st.kv1 - 1) + " of " +
           std::to_string(hp.n_head_kv) + ", MLP rows " + std::to_string(st.ff0) + "-" +
           std::to_string(st.ff1 - 1) + " of " + std::to_string(hp.n_ff);
}

// The plan of one device: its layers' KV under its budget, with the
// weights it holds (stage_weights, not yet placed) and the compute memory
// its backend measures on its graph (built here over them, all heads
// resident).
void llama_context::plan_stage(stage & st, int32_t n_batch) {
    const llama_hparams & hp = model.hp;
    const llama_model & m = model;
    const int32_t n_layer = st.l1 - st.l0, n_head_kv = st.kv1 - st.kv0;
    uint64_t weight_bytes = 0;
    if (st.be->where() != placement::host) {
        if (st.first) weight_bytes += bytes_of(st.tok_embd);
        if (st.last) {
            weight_bytes += bytes_of(st.output_norm);
            if (!st.first || m.output.data != m.tok_embd.data) weight_bytes += bytes_of(st.output);
        }
        for (const llama_layer & L : st.layers)
            L.each([&](const char *, const weight & w) { weight_bytes += bytes_of(w); });
    }
    // The stage's (layer, kv head) flags: its layers' heads [kv0, kv1).
    auto heads_of = [&](const std::vector<uint8_t> & all) {
        std::vector<uint8_t> mine;
        for (int32_t l = st.l0; l < st.l1; ++l) {
            const auto at = all.begin() + ptrdiff_t(l) * hp.n_head_kv;
            mine.insert(mine.end(), at + st.kv0, at + st.kv1);
        }
        return mine;
    };
    kv_plan & plan = st.plan;
    plan = kv_plan{};
    plan.n_layer = n_layer;
    plan.n_head_kv = n_head_kv;
    plan.n_cells = kv.n_cells;
    plan.head_dim = hp.head_dim;
    plan.kv_type = kv.type;
    plan.first_layer = st.l0;
    plan_input in;
    in.n_layer = n_layer;
    in.first_layer = st.l0;
    in.n_head_kv = n_head_kv;
    in.head_dim = hp.head_dim;
    in.n_cells = kv.n_cells;
    in.kv_type = kv.type;
    in.n_batch = uint32_t(n_batch);
    in.budget = st.budget;
    in.mode = params.kv_offload;
    in.attend = params.kv_attend;
    in.head_group = params.head_group;
    in.weight_bytes = weight_bytes;
    if (win.on() && !streaming.empty()) {
        in.windowed = heads_of(streaming);
    } else if (win.on()) {
        for (int32_t l = st.l0; l < st.l1; ++l)
            in.windowed.insert(in.windowed.end(), size_t(n_head_kv), uint8_t(hp.swa[size_t(l)]));
    }
    in.window_cells = win.on() ? win.table.n_cells : 0;
    if (!streaming.empty()) {
        in.streaming = heads_of(streaming);
        in.streaming_sink = stream_sink;
        in.streaming_window = stream_window;
    }
    // The most of one head group per layer and of single heads (whose k and
    // v stay live across more nodes), as many tokens keeping their logits as
    // a chunk may.
    in.compute_bytes = [&](int32_t n) -> uint64_t {
        uint64_t most = 0;
        for (int32_t G : {n_head_kv, 1}) {
            plan.G = G;
            plan.n_group = n_head_kv / G;
            plan.chunk = n;
            plan.resident.assign(size_t(n_layer) * size_t(plan.n_group), 1);
            st.g.clear();
            st.g.batch.kv = &kv;
            set_local_batch(st.g, false);
            build_graph(st, shape_of(st, n, std::min(n, chunk_outputs)));
            most = std::max<uint64_t>(most, st.be->compute_bytes(st.g));
        }
        return most;
    };
    try {
        plan = make_plan(in);
        if (plan.n_offloaded_groups() > 0 && params.kv_attend != SMOL_KV_ATTEND_DEVICE) {
            // auto splits offloaded groups by the measured speeds (a backend
            // with no link to measure streams them all); host keeps them to
            // show its floor.
            in.rates = st.be->attend_speeds(hp.head_dim, hp.n_head / hp.n_head_kv, kv.type);
            if (params.kv_attend == SMOL_KV_ATTEND_AUTO && in.rates.measured()) {
                plan = make_plan(in);
            } else {
                plan.rates = in.rates;
            }
        }
    } catch (const error & e) {
        if (stages_.size() == 1) throw;
        throw error(e.status, "device " + st.name + " (" + stage_text(st) + "): " + e.what() +
                                  (by_heads_ ? std::string()
                                             : "; or give this device a smaller share of the "
                                               "layers (tensor_split, --tensor-split)"));
    }
    st.g.clear();
}

// Places a planned stage: its budget, its weights, its KV and the memory of
// its largest graph, so that no later step allocates. Under a budget the
// largest keeps as many logits as a chunk may, as the plan counted.
void llama_context::place_stage(stage & st) {
    const llama_model & m = model;
    backend & be = *st.be;
    if (st.budget > 0) be.set_memory_limit(st.budget);
    // Weights stay in the mapped file for the CPU; other backends get a copy.
    auto place = [&](const weight & w) {
        weight c = w;
        if (be.where() == placement::host) return c;
        const size_t n = bytes_of(w);
        void * p = be.alloc(n);
        st.owned.push_back(p);
        be.upload(p, w.data, n);
        c.data = p;
        return c;
    };
    const bool tied = m.output.data == m.tok_embd.data;
    if (st.first) st.tok_embd = place(st.tok_embd);
    if (st.last) {
        st.output_norm = place(st.output_norm);
        st.output = st.first && tied ? st.tok_embd : place(st.output);
    }
    for (llama_layer & L : st.layers) L.each([&](const char *, weight & w) { w = place(w); });
    // The column slices: uploaded by now on a device, the weights themselves
    // on the CPU.
    if (be.where() != placement::host) st.sliced.clear();
    st.place.alloc(be, (st.kv1 - st.kv0) * (m.hp.n_head / m.hp.n_head_kv));
    if (!st.first) {
        bool pinned = false;
        st.hidden =
            static_cast<float *>(be.alloc_host(size_t(chunk_) * size_t(m.hp.n_embd) * sizeof(float),
                                               pinned, "the hidden states between devices"));
    }
    st.g.clear();
    st.g.batch.kv = &kv;
    set_local_batch(st.g, false);
    build_graph(st, shape_of(st, chunk_, st.budget > 0 ? std::min(chunk_, chunk_outputs) : 1));
    be.reserve(st.g);
}

llama_context::~llama_context() {
    if (logits_) output_stage().be->release_host(logits_);
}

std::vector<backend *> llama_context::rank_backends() const {
    std::vector<backend *> out;
    for (const auto & st : stages_) out.push_back(st->be.get());
    return out;
}

// The stage that computes the outputs: the last of a layer split, a head
// split's rank 0.
llama_context::stage & llama_context::output_stage() const {
    return by_heads_ ? *stages_.front() : *stages_.back();
}

// Room for n logits; what the rows held before need not survive (a batch
// writes its own). Grows by doubling: pinning is slow, batches vary.
void llama_context::reserve_logits(size_t n) {
    if (n <= logits_cap_) return;
    backend & be = *output_stage().be;
    const size_t cap = std::max(n, 2 * logits_cap_);
    bool pinned = false;
    void * p = be.alloc_host(cap * sizeof(float), pinned, "the logits");
    if (logits_) be.release_host(logits_);
    logits_ = static_cast<float *>(p);
    logits_cap_ = cap;
}

const backend & llama_context::device(int32_t d) const {
    return *stages_[size_t(d)]->be;
}
const kv_plan & llama_context::plan(int32_t d) const {
    return stages_[size_t(d)]->plan;
}
const graph & llama_context::last_graph(int32_t d) const {
    return stages_[size_t(d)]->g;
}
int32_t llama_context::n_host_heads() const {
    int32_t n = 0;
    for (const auto & st : stages_) n += st->plan.n_host_groups() * st->plan.G;
    return n;
}

llama_context::step_shape llama_context::shape_of(const stage & st, int32_t n, int32_t n_out,
                                                  bool tops) const {
    return {n, st.last ? n_out : 0, tops && st.last && n_out > 0,
            st.place.copies_of(cells_.data(), n)};
}

// A stage's part of the forward pass: the embeddings (first stage) or the
// hidden states handed over; per layer RMSNorm, q, k, v and RoPE, then per
// kv-head group the store of the new k, v and the attention over the
// group's view (kv_placement adds the copies of offloaded groups around
// them), the output projection and the MLP; the output head (last stage),
// else the hidden states for the next.
void llama_context::build_graph(stage & st, const step_shape & shape) {
    const llama_hparams & hp = model.hp;
    graph & g = st.g;
    const int32_t n = shape.n, n_out = shape.n_out;
    const placement where = st.be->where();
    // The stage's heads: a head split's rank has its share, else all.
    const int32_t n_head_kv = st.kv1 - st.kv0, n_head = n_head_kv * (hp.n_head / hp.n_head_kv);
    auto W = [&](const weight & w) {
        tensor * t = g.leaf(w.type, const_cast<void *>(w.data), w.ne0, w.ne1);
        t->where = where;
        return t;
    };
    // Inputs stay in host memory; a device backend copies them in.
    auto ints = [&](std::vector<int32_t> & v, int32_t count) {
        tensor * t = g.new_tensor(SMOL_TYPE_F32, count);
        t->data = v.data(); // int32 ids travel in 4-byte elements
        t->where = placement::host;
        return t;
    };

    tensor * pos = ints(positions_, n);
    kv_placement & place = st.place;
    place.begin(g, shape.copies);
    const bool gemma = hp.arch == llama_arch::gemma3;
    tensor * x = nullptr;
    if (st.first) {
        x = op_get_rows(g, W(st.tok_embd), ints(tokens_, n));
        if (hp.embd_scale != 1.0f) x = op_scale(g, x, hp.embd_scale);
    } else {
        x = g.new_tensor(SMOL_TYPE_F32, hp.n_embd, n);
        x->data = st.hidden;
        x->where = placement::host;
    }
    for (int32_t l = st.l0; l < st.l1; ++l) {
        const int32_t ll = l - st.l0; // the stage's own index: its plan's and placement's
        const llama_layer & L = st.layers[size_t(ll)];
        const bool local = !hp.swa.empty() && hp.swa[size_t(l)];
        const float base = local ? hp.rope_base_swa : hp.rope_base;
        tensor * cur = op_rms_norm(g, x, W(L.attn_norm), hp.rms_eps);
        tensor * q = op_mul_mat(g, W(L.wq), cur);
        tensor * k = op_mul_mat(g, W(L.wk), cur);
        tensor * v = op_mul_mat(g, W(L.wv), cur);
        if (gemma) {
            q = op_rms_norm(g, q, W(L.q_norm), hp.rms_eps, hp.head_dim);
            k = op_rms_norm(g, k, W(L.k_norm), hp.rms_eps, hp.head_dim);
        }
        q = op_rope(g, q, pos, n_head, hp.head_dim, base, gemma);
        k = op_rope(g, k, pos, n_head_kv, hp.head_dim, base, gemma);
        const attn_opts layer_opts{local ? hp.n_swa : 0, hp.attn_scale};
        tensor * att = nullptr;
        for (int32_t gr = 0; gr < st.plan.n_group; ++gr) {
            if (place.on_host(ll, gr)) continue;
            // A group's heads stream or not alike (the planner's G).
            const bool streams =
                !streaming.empty() && streaming[size_t(l) * size_t(hp.n_head_kv) + size_t(st.kv0) +
                                                size_t(gr) * size_t(st.plan.G)];
            const attn_opts opts =
                streams ? attn_opts{stream_window, hp.attn_scale, stream_sink} : layer_opts;
            const kv_placement::group_io io = place.group(ll, gr);
            tensor * stored = op_kv_store_heads(g, k, v, l, io.view, io.ready);
            place.after_store(ll, gr);
            att = op_attention_heads(g, q, stored, l, n_head, n_head_kv, hp.head_dim, io.view, att,
                                     opts);
            place.after_attention(ll, gr, att, stored);
        }
        // The host's groups: its copies read q, k and v after the device's
        // last reader in the graph's order, so the arena keeps them for the
        // copies; the host's work still runs beside the device's.
        att = place.host_layer(ll, q, k, v, layer_opts, att);
        // A head split's rank holds its heads' part of the projection: the
        // ranks' parts summed (Megatron's layout), and the same for the MLP.
        tensor * o = op_mul_mat(g, W(L.wo), att);
        if (st.rank >= 0) o = op_all_reduce(g, o);
        if (gemma) o = op_rms_norm(g, o, W(L.post_attn_norm), hp.rms_eps);
        x = op_add(g, x, o);
        cur = op_rms_norm(g, x, W(L.ffn_norm), hp.rms_eps);
        tensor * gate = op_mul_mat(g, W(L.w_gate), cur);
        tensor * up = op_mul_mat(g, W(L.w_up), cur);
        tensor * d =
            op_mul_mat(g, W(L.w_down), gemma ? op_geglu(g, gate, up) : op_swiglu(g, gate, up));
        if (st.rank >= 0) d = op_all_reduce(g, d);
        if (gemma) d = op_rms_norm(g, d, W(L.post_ffw_norm), hp.rms_eps);
        x = op_add(g, x, d);
    }
    if (!st.last) {
        st.out = x;
        return;
    }
    if (n_out == 0) return;
    if (n_out < n) x = op_get_rows(g, x, ints(out_ids_, n_out));
    x = op_rms_norm(g, x, W(st.output_norm), hp.rms_eps);
    st.out = params.embeddings ? x : op_mul_mat(g, W(st.output), x);
    st.out_logits = nullptr;
    if (shape.tokens) {
        // The argmax is the graph's last node, so the logits it reads are
        // where they were when the step ends, for the rows some outputs keep.
        st.out_logits = st.out;
        st.out = op_argmax(g, st.out);
    }
}

void llama_context::decode(const smol_batch & b) {
    const llama_hparams & hp = model.hp;
    const int32_t n = b.n_tokens;
    if (n <= 0 || !b.token || !b.pos || !b.seq_id) {
        throw error(SMOL_ERR_INVALID_ARGUMENT, "smol_decode: the batch is empty");
    }
    if (uint32_t(n) > params.n_batch) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "smol_decode: the batch has " + std::to_string(n) +
                        " tokens, more than n_batch = " + std::to_string(params.n_batch) +
                        "; split it or raise n_batch");
    }
    // Check the whole batch before touching the cache. Each sequence's
    // newest position and cell are kept across decodes; a change to the
    // cache by other means (kv.version) has them found again. Until this
    // decode succeeds they are not trusted.
    std::vector<smol_pos> & seq_max = seq_max_;
    if (seq_version_ != kv.version) {
        seq_max.assign(kv_max_seqs, -1);
        seq_tail_.assign(kv_max_seqs, -1);
        for (int32_t c = 0; c < kv.n_used; ++c) {
            if (kv.cell_pos[c] < 0) continue;
            for (seq_mask m = kv.cell_seqs[c]; m; m = m.rest()) {
                const int s = m.first();
                if (kv.cell_pos[c] > seq_max[size_t(s)]) {
                    seq_max[size_t(s)] = kv.cell_pos[c];
                    seq_tail_[size_t(s)] = c;
                }
            }
        }
    }
    seq_version_ = ~uint64_t(0);
    if (win.on() && win.synced != kv.version) win.sync(kv);
    for (int32_t i = 0; i < n; ++i) {
        if (b.token[i] < 0 || b.token[i] >= hp.n_vocab) {
            throw error(SMOL_ERR_INVALID_ARGUMENT,
                        "smol_decode: token " + std::to_string(b.token[i]) + " at batch index " +
                            std::to_string(i) + " is outside the vocabulary [0, " +
                            std::to_string(hp.n_vocab) + ")");
        }
        const smol_seq_id s = b.seq_id[i];
        if (s < 0 || uint32_t(s) >= params.n_seq_max) {
            throw error(SMOL_ERR_INVALID_ARGUMENT, "smol_decode: sequence id " + std::to_string(s) +
                                                       " is outside [0, n_seq_max = " +
                                                       std::to_string(params.n_seq_max) + ")");
        }
        if (b.pos[i] <= seq_max[size_t(s)]) {
            throw error(SMOL_ERR_INVALID_ARGUMENT,
                        "smol_decode: position " + std::to_string(b.pos[i]) + " of sequence " +
                            std::to_string(s) + " does not follow the " +
                            std::to_string(seq_max[size_t(s)]) +
                            " it already holds; remove those positions first (smol_kv_seq_rm)");
        }
        if (win.on() && b.pos[i] < win.first_exact(s)) {
            const bool heads = !streaming.empty();
            throw error(SMOL_ERR_WINDOW_GONE,
                        "smol_decode: position " + std::to_string(b.pos[i]) + " of sequence " +
                            std::to_string(s) + " would attend to position " +
                            std::to_string(win.lost[size_t(s)]) + ", whose keys the " +
                            (heads ? "streaming heads" : "sliding-window layers") +
                            " no longer keep (they keep " +
                            (heads ? "the first " + std::to_string(win.sink) + ", " : "") +
                            std::to_string(win.window) + " positions and a reserve of " +
                            std::to_string(win.reserve) +
                            " (window_reserve)); recompute the sequence from position 0, roll "
                            "back at most " +
                            std::to_string(win.reserve) + " tokens, or " +
                            (heads ? "leave streaming heads off"
                                   : "create the context with swa_full (--swa-full)"));
        }
        seq_max[size_t(s)] = b.pos[i];
    }
    if (!kv.has_free(n)) {
        const int32_t n_free = kv.n_free();
        throw error(SMOL_ERR_CONTEXT_FULL,
                    "the KV cache is full: the batch needs " + std::to_string(n) + " cells, " +
                        std::to_string(n_free) + " of n_ctx = " + std::to_string(kv.n_cells) +
                        " are free; raise the context size or drop finished sequences");
    }

    // Which tokens keep logits, or their top token only (without flags,
    // the last one's logits). When some keep only their token, the graph
    // picks every output's top token, and only the tokens, and the logits
    // rows from the first to the last output that keeps them, leave the
    // last device (each chunk's). Until the buffer is there, the last
    // batch's outputs are none.
    int32_t n_out = 0, n_logits = 0;
    for (int32_t i = 0; i < n; ++i) {
        const int8_t keep = b.logits ? b.logits[i] : int8_t(i == n - 1);
        const bool token = keep == SMOL_KEEP_TOKEN && !params.embeddings;
        out_row_[size_t(i)] = keep != SMOL_KEEP_NONE ? n_out++ : -1;
        out_logits_[size_t(i)] = int8_t(keep != SMOL_KEEP_NONE && !token);
        n_logits += out_logits_[size_t(i)];
    }
    n_last_ = 0;
    last_out_ = -1;
    tops_ = n_logits < n_out;
    n_out_ = n_out;
    reserve_logits(size_t(logits_row(n_logits > 0 ? n_out : 0) - logits_));
    n_last_ = n;
    for (int32_t i = n - 1; i >= 0 && last_out_ < 0; --i)
        if (out_row_[size_t(i)] >= 0) last_out_ = i;

    // A long batch runs in chunks of the plan's size, each ending early at
    // its chunk_outputs-th token with logits; each chunk attends to the
    // cells of the chunks before it.
    //
    // The abort callback is asked before every chunk, the first included. A
    // stop, or a chunk that fails (the backend's error), hands back every
    // cell the call took (they were free before: find_cell takes only free
    // cells), so the cache is as it was before the call, and keeps no
    // logits. That counts as a change of the cache (kv_cache::version), so a
    // backend compares its whole copy of the cell table at the next step.
    const double t0 = now_ms();
    const int32_t n_used_before = kv.n_used;
    std::fill_n(batch_cells_.begin(), n, -1);
    try {
        for (int32_t i0 = 0, out_base = 0, m = 0; i0 < n; i0 += m) {
            if (params.abort_callback && params.abort_callback(params.abort_user_data)) {
                throw error(SMOL_ERR_ABORTED,
                            "smol_decode: the abort callback stopped the batch after " +
                                std::to_string(i0) + " of its " + std::to_string(n) +
                                " tokens; the cache is left as it was before the call");
            }
            int32_t outs = 0;
            for (m = 0; m < std::min(chunk_, n - i0) && outs < chunk_outputs; ++m)
                outs += out_row_[size_t(i0 + m)] >= 0;
            run_chunk(b, i0, m, out_base);
            out_base += outs;
        }
    } catch (...) {
        for (int32_t i = 0; i < n; ++i) {
            const int32_t c = batch_cells_[size_t(i)];
            if (c < 0) continue;
            kv.cell_pos[size_t(c)] = -1;
            kv.cell_seqs[size_t(c)] = seq_mask::none();
        }
        kv.n_used = n_used_before;
        n_last_ = 0;
        last_out_ = -1;
        kv.touch();
        throw;
    }
    seq_version_ = kv.version;
    const double dt = now_ms() - t0;
    if (n > 1) {
        perf.t_prompt_ms += dt;
        perf.n_prompt_tokens += n;
    } else {
        perf.t_eval_ms += dt;
        perf.n_eval_tokens += n;
    }
}

void llama_context::run_chunk(const smol_batch & b, int32_t i0, int32_t n, int32_t out_base) {
    // Sequences take cells in pages of their own (kv_cache::find_cell), so
    // attention on the GPU skips other sequences' pages whole. (A step of
    // several sequences then writes cells far apart: an offloaded group's
    // OFFLOAD copies the range between them.)
    int32_t page_from = 0, cell_from = 0, n_out = 0;
    int32_t span0 = -1, span1 = -1; // the first and last of the chunk's outputs keeping logits
    if (win.on()) win.release_old(kv);
    for (int32_t j = 0; j < n; ++j) {
        const int32_t i = i0 + j;
        int32_t & tail = seq_tail_[size_t(b.seq_id[i])];
        const int32_t c = kv.find_cell(tail, page_from, cell_from);
        tail = c;
        cells_[size_t(j)] = c;
        kv.cell_pos[c] = b.pos[i];
        kv.cell_seqs[c] = seq_mask::of(b.seq_id[i]);
        kv.n_used = std::max(kv.n_used, c + 1);
        batch_cells_[size_t(i)] = c;
        if (win.on()) {
            slots_[size_t(j)] = win.take(c, b.pos[i], b.seq_id[i]);
            // slots_needed's bound makes this a programmer's error.
            SMOL_ASSERT_MSG(slots_[size_t(j)] >= 0, "the window store has no free slot");
        }
        tokens_[size_t(j)] = b.token[i];
        positions_[size_t(j)] = b.pos[i];
        seqs_[size_t(j)] = b.seq_id[i];
        if (out_row_[size_t(i)] < 0) continue;
        if (out_logits_[size_t(i)]) {
            if (span0 < 0) span0 = n_out;
            span1 = n_out;
        }
        out_ids_[size_t(n_out++)] = j;
    }
    // The host's attention reads the lists whatever the device's does.
    bool lists = n_host_heads() > 0;
    for (const auto & st : stages_) lists = lists || st->be->wants_seq_cells();
    if (lists) list_seq_cells(n, kv, seq_cells_, seq_begin_);
    if (lists && win.on()) list_seq_cells(n, win.table, seq_slots_, seq_slot_begin_);
    const batch_info batch{positions_.data(),
                           seqs_.data(),
                           cells_.data(),
                           n,
                           &kv,
                           lists ? seq_cells_.data() : nullptr,
                           lists ? seq_begin_.data() : nullptr};
    // Each device's graph for the step. A backend that runs a graph again
    // gets its last one, unless the step's shape changed or the graph was
    // rebuilt for something else since.
    for (const auto & sp : stages_) {
        stage & st = *sp;
        const step_shape shape = shape_of(st, n, n_out, tops_);
        const bool again =
            st.be->reruns_graphs() && st.g.generation() == st.built_gen && shape == st.built;
        if (!again) {
            st.g.clear();
            st.out = st.out_logits = nullptr;
        }
        st.g.batch = batch;
        set_local_batch(st.g, lists);
        if (!again) {
            build_graph(st, shape);
            st.built = shape;
            st.built_gen = st.g.generation();
        }
        st.g.rerun = again;
    }
    float * dst = tops_ ? logits_ + out_base : logits_row(out_base);
    // The stage that computes the outputs writes them to dst; beside top
    // tokens, the logits rows of the chunk's outputs from the first to the
    // last that keeps them are copied to their rows after the tokens.
    auto run_outputs = [&](stage & st) {
        if (st.out && st.be->where() == placement::host) st.out->data = dst;
        st.be->run(st.g);
        if (st.out && st.out->data != dst) st.be->download(dst, st.out->data, st.out->nbytes());
        if (st.out_logits && span0 >= 0) {
            const size_t row = st.out_logits->nb[1];
            st.be->download(logits_row(out_base + span0),
                            static_cast<const uint8_t *>(st.out_logits->data) + size_t(span0) * row,
                            size_t(span1 - span0 + 1) * row);
        }
    };
    if (!by_heads_) {
        // Each device in turn over its layers, handing its hidden states to
        // the next through the next one's host memory.
        for (size_t d = 0; d + 1 < stages_.size(); ++d) {
            stage & st = *stages_[d];
            st.be->run(st.g);
            st.be->download(stages_[d + 1]->hidden, st.out->data, st.out->nbytes());
        }
        run_outputs(*stages_.back());
        return;
    }
    // A head split's ranks side by side, meeting at each all-reduce. The
    // first rank that fails aborts the collective (or the GPUs' group, which
    // is joined again before the next step), so the others stop at their
    // next all-reduce instead of waiting; its error is the one reported.
    if (regroup_) {
        join_gpu_group(rank_backends());
        regroup_ = false;
    }
    std::mutex mu;
    std::exception_ptr first;
    ranks_->run([&](int r, int) {
        try {
            stage & st = *stages_[size_t(r)];
            if (st.last) {
                run_outputs(st);
            } else {
                st.be->run(st.g);
            }
        } catch (...) {
            std::lock_guard<std::mutex> lock(mu);
            if (first) return;
            first = std::current_exception();
            comm_->abort();
            if (gpu_group_) {
                abort_gpu_group(rank_backends());
                regroup_ = true;
            }
        }
    });
    comm_->reset();
    if (first) std::rethrow_exception(first);
}

smol_memory_info llama_context::memory_info(int32_t d) const {
    auto of = [&](const stage & s) {
        const kv_plan & plan = s.plan;
        smol_memory_info m{};
        m.budget = s.budget;
        m.device_weights = plan.weight_bytes;
        m.device_compute = plan.compute_bytes;
        m.device_staging = uint64_t(plan.n_slots) * plan.slot_bytes();
        m.device_kv = plan.resident_kv_bytes();
        m.device_planned = plan.device_bytes();
        m.device_peak = s.be->memory().peak;
        m.host_kv = plan.host_kv_bytes();
        m.host_pinned = s.place.host_pinned();
        m.host_pageable = s.place.host_pageable();
        m.n_heads = plan.n_layer * plan.n_head_kv;
        m.n_heads_resident = plan.n_resident_groups() * plan.G;
        m.n_heads_host = plan.n_host_groups() * plan.G;
        m.link_rate = plan.rates.link;
        m.host_rate = plan.rates.host;
        m.link_rate_shared = plan.rates.link_shared;
        m.host_rate_shared = plan.rates.host_shared;
        m.head_group = plan.G;
        m.chunk = chunk_;
        m.kv_type = kv.type;
        m.device = s.name.c_str();
        m.first_layer = s.l0;
        m.n_layer = s.l1 - s.l0;
        m.first_kv_head = s.kv0;
        m.n_kv_heads = s.kv1 - s.kv0;
        return m;
    };
    if (d >= 0) return of(*stages_[size_t(d)]);
    smol_memory_info m = of(*stages_.front());
    for (size_t i = 1; i < stages_.size(); ++i) {
        const smol_memory_info o = of(*stages_[i]);
        for (auto f : {&smol_memory_info::budget, &smol_memory_info::device_weights,
                       &smol_memory_info::device_compute, &smol_memory_info::device_staging,
                       &smol_memory_info::device_kv, &smol_memory_info::device_planned,
                       &smol_memory_info::device_peak, &smol_memory_info::host_kv,
                       &smol_memory_info::host_pinned, &smol_memory_info::host_pageable})
            m.*f += o.*f;
        m.n_heads += o.n_heads;
        m.n_heads_resident += o.n_heads_resident;
        m.n_heads_host += o.n_heads_host;
    }
    m.device = device_list_.c_str();
    m.first_layer = 0;
    m.n_layer = model.hp.n_layer;
    m.first_kv_head = 0;
    m.n_kv_heads = model.hp.n_head_kv;
    return m;
}

void llama_context::kv_bytes_held(int32_t cells, int32_t slots, uint64_t & resident,
                                  uint64_t & offloaded) const {
    // K and V of one head's cell.
    const uint64_t head_cell = uint64_t(kv.row_words) * 2 * sizeof(uint16_t);
    resident = offloaded = 0;
    for (const auto & st : stages_) {
        const kv_plan & p = st->plan;
        for (int32_t l = 0; l < p.n_layer; ++l) {
            for (int32_t g = 0; g < p.n_group; ++g) {
                const uint64_t n = uint64_t(p.is_windowed(l, g) ? slots : cells);
                (p.is_resident(l, g) ? resident : offloaded) += n * head_cell * uint64_t(p.G);
            }
        }
    }
}

std::string llama_context::plan_text() const {
    if (stages_.size() == 1) return stages_.front()->plan.format();
    std::string out;
    for (const auto & st : stages_) {
        out += "device " + st->name + ": " + stage_text(*st) +
               (st->first && !by_heads_ ? ", the embeddings" : "") +
               (st->last ? ", the output" : "") + "\n";
        out += st->plan.format();
    }
    return out;
}

std::string llama_context::schedule_text(int32_t n) {
    if (n <= 0) n = 1;
    n = std::min({n, chunk_, kv.n_free()});
    if (n <= 0) throw error(SMOL_ERR_CONTEXT_FULL, "the KV cache has no free cell for a step");
    // The cells the step would take: each marked taken while the next is
    // found, all given back before the graph is built.
    const int32_t n_used = kv.n_used;
    int32_t page_from = 0, cell_from = 0;
    for (int32_t j = 0; j < n; ++j) {
        const int32_t c = kv.find_cell(j > 0 ? cells_[size_t(j - 1)] : -1, page_from, cell_from);
        cells_[size_t(j)] = c;
        kv.cell_pos[size_t(c)] = 0;
        tokens_[size_t(j)] = 0;
        positions_[size_t(j)] = 0;
        seqs_[size_t(j)] = 0;
        kv.n_used = std::max(kv.n_used, c + 1);
    }
    for (int32_t j = 0; j < n; ++j) kv.cell_pos[size_t(cells_[size_t(j)])] = -1;
    for (int32_t j = 0; j < n; ++j) slots_[size_t(j)] = win.on() ? j % win.table.n_cells : 0;
    std::string out;
    for (const auto & st : stages_) {
        st->g.clear();
        st->g.batch = batch_info{positions_.data(), seqs_.data(), cells_.data(), n, &kv};
        set_local_batch(st->g, false);
        build_graph(*st, shape_of(*st, n, 1));
        schedule s;
        make_schedule(st->g, s);
        out += "step of " + std::to_string(n) + " token(s) on " + st->be->name() +
               (stages_.size() > 1 ? " (" + stage_text(*st) + ")" : std::string()) + " after " +
               std::to_string(n_used) + " used cells\n";
        out += format_schedule(st->g, s);
    }
    kv.n_used = n_used;
    return out;
}

// The window store's batch beside g.batch (its tokens, their slots).
void llama_context::set_local_batch(graph & g, bool lists) {
    if (!win.on()) return;
    local_batch_ = g.batch;
    local_batch_.kv = &win.table;
    local_batch_.cell = slots_.data();
    local_batch_.seq_cells = lists ? seq_slots_.data() : nullptr;
    local_batch_.seq_begin = lists ? seq_slot_begin_.data() : nullptr;
    g.batch.local = &local_batch_;
}

smol_pos llama_context::seq_pos_exact(smol_seq_id seq) {
    if (!win.on() || seq < 0 || seq >= kv_max_seqs) return 0;
    if (win.synced != kv.version) win.sync(kv);
    return win.first_exact(seq);
}

bool llama_context::window_kept(const int32_t * cells, int32_t n) const {
    if (!win.on() || n <= 0) return true;
    const int32_t w = std::min(n, win.window - 1);
    return win.holds(cells, std::min(n, win.sink)) && win.holds(cells + (n - w), w);
}

// Lists, for each sequence of the batch, the cells of table (the cache's or
// the window store's) it holds sorted by position (two passes: count, then
// place; no allocation once warm).
void llama_context::list_seq_cells(int32_t n, const kv_cache & table, std::vector<int32_t> & cells,
                                   std::vector<int32_t> & begin) {
    seq_mask in_batch = seq_mask::none();
    for (int32_t i = 0; i < n; ++i) in_batch |= seq_mask::of(seqs_[i]);
    // One pass over the cells finds those a sequence of the batch holds (a
    // cell no sequence holds is free): a prefix cache may hold many more
    // cells than the batch's sequences do, and this runs every step.
    hits_.clear();
    const uint64_t b0 = in_batch.w[0], b1 = in_batch.w[1];
    const seq_mask * held = table.cell_seqs.data();
    for (int32_t c = 0; c < table.n_used; ++c) {
        if (((held[c].w[0] & b0) | (held[c].w[1] & b1)) != 0) hits_.push_back(c);
    }
    group_by_seq(
        int32_t(hits_.size()), [&](int32_t i) { return held[hits_[size_t(i)]] & in_batch; },
        [&](int32_t i) { return hits_[size_t(i)]; }, begin, cells, fill_);
    // A sequence takes cells in rising order, so a list is usually sorted
    // already (a page freed below its others breaks that).
    const auto by_pos = [&table](int32_t x, int32_t y) {
        return table.cell_pos[x] < table.cell_pos[y];
    };
    for (int32_t s = 0; s < kv_max_seqs; ++s) {
        int32_t * b = cells.data() + begin[size_t(s)];
        int32_t * e = cells.data() + begin[size_t(s) + 1];
        if (!std::is_sorted(b, e, by_pos)) std::sort(b, e, by_pos);
    }
}

float * llama_context::logits_row(int32_t row) const {
    // After the top tokens, if any, up to a 64-byte boundary.
    const size_t tops = tops_ ? (size_t(n_out_) + 15) / 16 * 16 : 0;
    return logits_ + tops + size_t(row) * size_t(out_width());
}

const float * llama_context::logits(int32_t i) const {
    if (i < 0) i = last_out_;
    if (i < 0 || i >= n_last_ || !out_logits_[size_t(i)]) return nullptr;
    return logits_row(out_row_[size_t(i)]);
}

smol_token llama_context::top_token(int32_t i) const {
    if (i < 0) i = last_out_;
    if (params.embeddings || i < 0 || i >= n_last_ || out_row_[size_t(i)] < 0) return -1;
    if (tops_) return reinterpret_cast<const int32_t *>(logits_)[out_row_[size_t(i)]];
    return smol_token(cpu::kernels_best().argmax(logits_row(out_row_[size_t(i)]), out_width()));
}

} // namespace smol
