// test-split.c++ - a model split by layers over several devices (simulated
// devices and the CPU, in one process): the logits of one device bit for
// bit, each device's layers, budget and plan its own, a context that only
// the devices together hold, and device lists that are refused with the
// fix.

#include "decode-all.h"
#include "smol.h"
#include "test-seed.h"
#include "tiny-model.h"

#include <cstring>
#include <doctest/doctest.h>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

using test::random_ids;
using test::run_workload;

namespace {

struct model_deleter {
    void operator()(smol_model * m) const { smol_model_free(m); }
};
struct context_deleter {
    void operator()(smol_context * c) const { smol_context_free(c); }
};
using model_ptr = std::unique_ptr<smol_model, model_deleter>;
using context_ptr = std::unique_ptr<smol_context, context_deleter>;

// A llama of five layers (so no split is even) of four kv heads.
tiny::shape split_shape() {
    tiny::shape s;
    s.n_embd = 128;
    s.n_head = 8;
    s.n_head_kv = 4;
    s.n_layer = 5;
    s.wtype = SMOL_TYPE_Q8_0;
    return s;
}

struct tiny_file {
    std::string path;
    model_ptr m;
    explicit tiny_file(uint32_t seed, const tiny::shape & s = split_shape())
        : path((std::filesystem::temp_directory_path() /
                ("smol-split-" + std::to_string(::getpid()) + "-" + std::to_string(seed) + ".gguf"))
                   .string()) {
        tiny::write(path, s, seed);
        smol_model * p = nullptr;
        const smol_status st = smol_model_load(path.c_str(), nullptr, &p);
        INFO(std::string(smol_last_error()));
        REQUIRE(st == SMOL_OK);
        m.reset(p);
    }
    ~tiny_file() { std::filesystem::remove(path); }
};

// A context's placement: its device list, offload mode, head group, and
// each device's budget and share of the layers (empty: none given).
struct split_case {
    const char * name;
    const char * device;
    smol_kv_offload mode = SMOL_KV_OFFLOAD_AUTO;
    int32_t head_group = 0;
    std::vector<uint64_t> budgets;
    std::vector<float> shares;
};

smol_context_params params_of(const split_case & sc, uint32_t n_ctx = 256) {
    smol_context_params p = smol_context_default_params();
    p.n_ctx = n_ctx;
    p.n_batch = 16;
    p.n_seq_max = 2;
    p.n_threads = 2;
    p.device = sc.device;
    p.kv_offload = sc.mode;
    p.head_group = sc.head_group;
    p.device_mem = sc.budgets.empty() ? nullptr : sc.budgets.data();
    p.n_device_mem = uint32_t(sc.budgets.size());
    p.tensor_split = sc.shares.empty() ? nullptr : sc.shares.data();
    p.n_tensor_split = uint32_t(sc.shares.size());
    return p;
}

context_ptr make_context(smol_model * m, const smol_context_params & p) {
    smol_context * c = nullptr;
    const smol_status st = smol_context_create(m, &p, &c);
    INFO(std::string(smol_last_error()));
    REQUIRE(st == SMOL_OK);
    return context_ptr(c);
}

// The status and message of a context that should not be made.
std::pair<smol_status, std::string> refused(smol_model * m, const smol_context_params & p) {
    smol_context * c = nullptr;
    const smol_status st = smol_context_create(m, &p, &c);
    smol_context_free(c);
    return {st, smol_last_error()};
}

std::vector<smol_memory_info> devices_of(const smol_context * c) {
    std::vector<smol_memory_info> out(size_t(smol_context_n_devices(c)));
    for (size_t i = 0; i < out.size(); ++i)
        REQUIRE(smol_context_device_memory(c, int32_t(i), &out[i]) == SMOL_OK);
    return out;
}

std::string dump(const smol_context * c, bool schedule) {
    size_t n = 0;
    auto call = [&](char * buf, size_t size) {
        return schedule
                   ? smol_context_schedule_dump(const_cast<smol_context *>(c), 1, buf, size, &n)
                   : smol_context_plan_dump(c, buf, size, &n);
    };
    call(nullptr, 0);
    std::string s(n + 1, '\0');
    REQUIRE(call(s.data(), s.size()) == SMOL_OK);
    s.resize(n);
    return s;
}

bool same_bits(const std::vector<float> & a, const std::vector<float> & b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

} // namespace

TEST_CASE("a model split by layers over simulated devices and the CPU gives one device's logits "
          "bit for bit") {
    SMOL_TEST_DRAW_SEED(seed);
    const tiny::shape s = split_shape();
    tiny_file f(seed);
    std::mt19937 rng(seed);
    const std::vector<std::vector<int>> prompts = {random_ids(rng, 45, s.n_vocab),
                                                   random_ids(rng, 20, s.n_vocab)};
    const std::vector<int> steps = random_ids(rng, 8, s.n_vocab);
    context_ptr one = make_context(f.m.get(), params_of({"one device", "sim"}));
    const std::vector<float> want = run_workload(one.get(), s.n_vocab, prompts, steps);

    // Each device's fixed bytes and offloaded KV when all its heads stream,
    // for budgets that keep about half of each device's heads resident.
    context_ptr probe =
        make_context(f.m.get(), params_of({"probe", "sim,sim", SMOL_KV_OFFLOAD_ALL, 1}));
    std::vector<uint64_t> half;
    for (const smol_memory_info & d : devices_of(probe.get()))
        half.push_back(d.device_weights + d.device_compute + d.device_staging + d.host_kv / 2);

    const std::vector<split_case> cases = {
        {"two devices", "sim,sim"},
        {"three devices, uneven", "sim,sim,sim", SMOL_KV_OFFLOAD_AUTO, 0, {}, {1, 3, 1}},
        {"the CPU, then a device", "cpu,sim"},
        {"a device, then the CPU", "sim, cpu"},
        {"every head streamed, G = 1", "sim,sim", SMOL_KV_OFFLOAD_ALL, 1},
        {"every head streamed, G = 4", "sim,sim", SMOL_KV_OFFLOAD_ALL, 4},
        {"a budget each, half resident", "sim,sim", SMOL_KV_OFFLOAD_AUTO, 1, half},
    };
    for (const split_case & sc : cases) {
        CAPTURE(sc.name);
        context_ptr c = make_context(f.m.get(), params_of(sc));
        const std::vector<smol_memory_info> devs = devices_of(c.get());
        // Contiguous layer ranges in order, every layer once, each device's
        // heads those of its layers.
        int32_t next = 0, heads = 0;
        for (const smol_memory_info & d : devs) {
            CHECK(d.first_layer == next);
            CHECK(d.n_layer > 0);
            CHECK(d.n_heads == d.n_layer * s.n_head_kv);
            next = d.first_layer + d.n_layer;
            heads += d.n_heads;
        }
        CHECK(next == s.n_layer);
        if (!sc.shares.empty()) {
            REQUIRE(devs.size() == 3);
            CHECK(devs[0].n_layer == 1);
            CHECK(devs[1].n_layer == 3);
            CHECK(devs[2].n_layer == 1);
        }
        smol_memory_info whole{};
        smol_context_memory(c.get(), &whole);
        CHECK(whole.n_heads == heads);
        CHECK(std::string(whole.device) == sc.device);
        if (sc.mode == SMOL_KV_OFFLOAD_ALL) CHECK(whole.n_heads_resident == 0);

        CHECK(same_bits(run_workload(c.get(), s.n_vocab, prompts, steps), want));

        uint64_t peaks = 0;
        for (size_t i = 0; i < devs.size(); ++i) {
            const smol_memory_info d = devices_of(c.get())[i];
            peaks += d.device_peak;
            if (sc.budgets.empty()) continue;
            CAPTURE(i);
            CHECK(d.budget == sc.budgets[i]);
            CHECK(d.n_heads_resident > 0);
            CHECK(d.n_heads_resident < d.n_heads);
            CHECK(d.device_peak <= d.budget);
        }
        smol_context_memory(c.get(), &whole);
        CHECK(whole.device_peak == peaks);
    }
}

TEST_CASE("two devices hold a context that one device under the same budget cannot") {
    SMOL_TEST_DRAW_SEED(seed);
    const tiny::shape s = split_shape();
    tiny_file f(seed);
    const uint32_t n_ctx = 1024;
    // Every head resident: what the whole model and its KV take on one
    // device, and a budget of seven tenths of that for each of two devices
    // (the first holds three of the five layers and the embeddings).
    context_ptr probe = make_context(f.m.get(), params_of({"probe", "sim"}, n_ctx));
    smol_memory_info all{};
    smol_context_memory(probe.get(), &all);
    const uint64_t budget = all.device_planned * 7 / 10;
    split_case one{"one device", "sim", SMOL_KV_OFFLOAD_NONE, 0, {budget}};
    const auto [st, msg] = refused(f.m.get(), params_of(one, n_ctx));
    CHECK(st == SMOL_ERR_OUT_OF_MEMORY);
    split_case two{"two devices", "sim,sim", SMOL_KV_OFFLOAD_NONE, 0, {budget, budget}};
    context_ptr c = make_context(f.m.get(), params_of(two, n_ctx));
    for (const smol_memory_info & d : devices_of(c.get())) {
        CHECK(d.n_heads_resident == d.n_heads);
        CHECK(d.device_planned <= budget);
    }
    // And they compute what one device without a budget does.
    std::mt19937 rng(seed);
    const std::vector<std::vector<int>> prompts = {random_ids(rng, 40, s.n_vocab)};
    const std::vector<int> steps = random_ids(rng, 4, s.n_vocab);
    CHECK(same_bits(run_workload(c.get(), s.n_vocab, prompts, steps),
                    run_workload(probe.get(), s.n_vocab, prompts, steps)));
    for (const smol_memory_info & d : devices_of(c.get())) CHECK(d.device_peak <= budget);
}

TEST_CASE("the plan and the schedule show what each device holds and runs") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(seed);
    context_ptr c =
        make_context(f.m.get(), params_of({"", "sim,sim", SMOL_KV_OFFLOAD_ALL, 1, {}, {2, 3}}));
    const std::string plan = dump(c.get(), false);
    CAPTURE(plan);
    const size_t first = plan.find("device sim: layers 0-1 of 5, the embeddings\n");
    const size_t second = plan.find("device sim: layers 2-4 of 5, the output\n");
    REQUIRE(first != std::string::npos);
    REQUIRE(second != std::string::npos);
    CHECK(first < second);
    // Each device's plan names the model's layers.
    CHECK(plan.find("resident heads per layer: 0-1: 0/4") != std::string::npos);
    CHECK(plan.find("resident heads per layer: 2-4: 0/4") != std::string::npos);
    const std::string sched = dump(c.get(), true);
    CAPTURE(sched);
    CHECK(sched.find("on sim (layers 0-1)") != std::string::npos);
    CHECK(sched.find("on sim (layers 2-4)") != std::string::npos);
}

TEST_CASE("device lists, budgets and shares that cannot work are refused with the fix") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(seed);
    smol_model * m = f.m.get();
    struct bad {
        split_case sc;
        smol_status status;
        const char * says;
    };
    const std::vector<bad> cases = {
        {{"empty entry", "sim,,sim"}, SMOL_ERR_INVALID_ARGUMENT, "has an empty entry"},
        {{"more devices than layers", "sim,sim,sim,sim,sim,sim"},
         SMOL_ERR_INVALID_ARGUMENT,
         "names 6 devices and the model has 5 layers"},
        {{"budgets for too few", "sim,sim", SMOL_KV_OFFLOAD_AUTO, 0, {1ull << 30}},
         SMOL_ERR_INVALID_ARGUMENT,
         "device_mem has 1 entries for the 2 device(s)"},
        {{"shares for too many", "sim,sim", SMOL_KV_OFFLOAD_AUTO, 0, {}, {1, 1, 1}},
         SMOL_ERR_INVALID_ARGUMENT,
         "tensor_split has 3 entries for the 2 device(s)"},
        {{"a negative share", "sim,sim", SMOL_KV_OFFLOAD_AUTO, 0, {}, {1, -1}},
         SMOL_ERR_INVALID_ARGUMENT,
         "a device's share of the layers is a number >= 0"},
        {{"a share of no layer", "sim,sim", SMOL_KV_OFFLOAD_AUTO, 0, {}, {1, 0.01f}},
         SMOL_ERR_INVALID_ARGUMENT,
         "device 1 (sim) gets none of the model's 5 layers"},
        {{"an unknown device", "sim,tpu"}, SMOL_ERR_INVALID_ARGUMENT, "unknown device 'tpu'"},
        {{"a budget too small for the second",
          "sim,sim",
          SMOL_KV_OFFLOAD_AUTO,
          0,
          {1ull << 30, 4096},
          {3, 2}},
         SMOL_ERR_OUT_OF_MEMORY,
         "device sim (layers 3-4 of 5): "},
    };
    for (const bad & b : cases) {
        CAPTURE(b.sc.name);
        const auto [st, msg] = refused(m, params_of(b.sc));
        CAPTURE(msg);
        CHECK(st == b.status);
        CHECK(msg.find(b.says) != std::string::npos);
    }
    // Heads split over devices is not built: refused, pointing at layers.
    smol_context_params p = params_of({"", "sim,sim"});
    p.split = SMOL_SPLIT_HEAD;
    auto [st, msg] = refused(m, p);
    CHECK(st == SMOL_ERR_UNSUPPORTED);
    CHECK(msg.find("--split layer") != std::string::npos);
    p.split = smol_split(7);
    std::tie(st, msg) = refused(m, p);
    CHECK(st == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(msg.find("split 7") != std::string::npos);
    // One device with a head split is one device: nothing to split.
    p = params_of({"", "sim"});
    p.split = SMOL_SPLIT_HEAD;
    context_ptr c = make_context(m, p);
    CHECK(smol_context_n_devices(c.get()) == 1);
    smol_memory_info mi{};
    CHECK(smol_context_device_memory(c.get(), 1, &mi) == SMOL_ERR_INVALID_ARGUMENT);
}
