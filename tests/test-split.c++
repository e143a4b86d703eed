// test-split.c++ - a model split over several devices (simulated devices
// and the CPU, in one process). By layers: the logits of one device bit
// for bit, each device's layers, budget and plan its own, a context that
// only the devices together hold. By heads: within a stated bound of one
// device and of float64, the same bits in every placement. Device lists
// that cannot work are refused with the fix.

#include "decode-all.h"
#include "smol-faults.h"
#include "smol.h"
#include "test-seed.h"
#include "tiny-model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <doctest/doctest.h>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

using test::decode_all;
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
    CHECK(sched.find("on sim (layers 0-1 of 5)") != std::string::npos);
    CHECK(sched.find("on sim (layers 2-4 of 5)") != std::string::npos);
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
        const std::pair<smol_status, std::string> r = refused(m, params_of(b.sc));
        CAPTURE(r.second);
        CHECK(r.first == b.status);
        CHECK(r.second.find(b.says) != std::string::npos);
    }
    // A head split that would cut w_down's q8_0 blocks (96 MLP rows over
    // two devices: column 48), kv heads that do not divide among the
    // devices, and layer shares for a split by heads.
    smol_context_params p = params_of({"", "sim,sim"});
    p.split = SMOL_SPLIT_HEAD;
    auto [st, msg] = refused(m, p);
    CHECK(st == SMOL_ERR_UNSUPPORTED);
    CHECK(msg.find("cuts blk.0.ffn_down (q8_0, blocks of 32) at column 48, inside a block") !=
          std::string::npos);
    CHECK(msg.find("--split layer") != std::string::npos);
    p = params_of({"", "sim,sim,sim"});
    p.split = SMOL_SPLIT_HEAD;
    std::tie(st, msg) = refused(m, p);
    CHECK(st == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(msg.find("model's 4 do not divide among the 3 devices") != std::string::npos);
    p = params_of({"", "sim,sim", SMOL_KV_OFFLOAD_AUTO, 0, {}, {1, 1}});
    p.split = SMOL_SPLIT_HEAD;
    std::tie(st, msg) = refused(m, p);
    CHECK(st == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(msg.find("tensor_split shares the layers of a layer split") != std::string::npos);
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

namespace {

// A llama whose heads and MLP divide among 2 and 4 devices on q8_0's blocks
// of 32: 4 kv heads (8 query heads of 16), 128 MLP rows.
tiny::shape head_split_shape() {
    tiny::shape s = split_shape();
    s.n_layer = 3;
    s.n_ff = 128;
    return s;
}

// The largest difference of any logit from want's, over want's largest
// magnitude, row by row.
double rel_err(const std::vector<std::vector<float>> & got,
               const std::vector<std::vector<double>> & want) {
    REQUIRE(got.size() == want.size());
    double worst = 0;
    for (size_t t = 0; t < got.size(); ++t) {
        double num = 0, den = 0;
        for (size_t i = 0; i < want[t].size(); ++i) {
            num = std::max(num, std::fabs(double(got[t][i]) - want[t][i]));
            den = std::max(den, std::fabs(want[t][i]));
        }
        worst = std::max(worst, num / den);
    }
    return worst;
}

std::vector<std::vector<double>> widen(const std::vector<std::vector<float>> & x) {
    std::vector<std::vector<double>> out;
    for (const auto & row : x) out.emplace_back(row.begin(), row.end());
    return out;
}

// Decodes a prompt (in chunks of 16, then one token a call) on one device
// and split by heads over two and four ranks in several placements. Every
// placement of the same ranks gives the same bits (only placement differs);
// with f32 weights (bounds) each split is within a float32 rounding of one
// device, and no further from float64 than one device is.
void check_heads_split(const tiny::shape & s, bool bounds, uint32_t seed) {
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("smol-split-heads-" + std::to_string(::getpid()) + ".gguf"))
                                 .string();
    const tiny::model ref = tiny::write(path, s, seed);
    smol_model * raw = nullptr;
    REQUIRE(smol_model_load(path.c_str(), nullptr, &raw) == SMOL_OK);
    model_ptr m(raw);
    std::mt19937 rng(seed);
    const std::vector<int> ids = random_ids(rng, 40, s.n_vocab);
    const std::vector<std::vector<double>> want64 = tiny::reference(ref, ids);
    auto run = [&](const split_case & sc) {
        smol_context_params p = params_of(sc);
        p.split = SMOL_SPLIT_HEAD;
        context_ptr c = make_context(m.get(), p);
        return std::make_pair(decode_all(c.get(), ids, s.n_vocab, 16, 24), std::move(c));
    };
    const auto [one, c1] = run({"one device", "sim"});
    const double err_one = rel_err(one, want64);
    MESSAGE(smol_type_name(s.wtype) << ", one device: " << err_one << " from float64");
    // f32 weights meet float64 but for the f16 cache; q8_0 activations are
    // rounded to 8 bits on their way into every matmul.
    REQUIRE(err_one < (bounds ? 1e-3 : 0.05));

    // Each rank's fixed bytes and offloaded KV with every head streamed, for
    // budgets that keep about half of each rank's heads resident.
    std::vector<uint64_t> half;
    {
        const auto [x, probe] = run({"probe", "sim,sim", SMOL_KV_OFFLOAD_ALL, 1});
        for (const smol_memory_info & d : devices_of(probe.get()))
            half.push_back(d.device_weights + d.device_compute + d.device_staging + d.host_kv / 2);
    }
    const std::vector<std::vector<split_case>> groups = {
        {{"two ranks", "sim,sim"},
         {"two ranks, one the CPU", "cpu,sim"},
         {"two ranks, every head streamed", "sim,sim", SMOL_KV_OFFLOAD_ALL, 1},
         {"two ranks, half resident", "sim,sim", SMOL_KV_OFFLOAD_AUTO, 1, half}},
        {{"four ranks", "sim,sim,sim,sim"},
         {"four ranks, every head streamed", "sim,sim,sim,sim", SMOL_KV_OFFLOAD_ALL, 1}},
    };
    for (const std::vector<split_case> & group : groups) {
        std::vector<std::vector<float>> first;
        for (const split_case & sc : group) {
            CAPTURE(std::string(sc.name));
            const auto [got, c] = run(sc);
            const std::vector<smol_memory_info> devs = devices_of(c.get());
            const int n = int(devs.size());
            int32_t next = 0;
            for (const smol_memory_info & d : devs) {
                CHECK(d.first_layer == 0);
                CHECK(d.n_layer == s.n_layer);
                CHECK(d.first_kv_head == next);
                CHECK(d.n_kv_heads == s.n_head_kv / n);
                next += d.n_kv_heads;
                CHECK(d.n_heads == s.n_layer * s.n_head_kv / n);
                if (sc.budgets.empty()) continue;
                CHECK(d.n_heads_resident > 0);
                CHECK(d.n_heads_resident < d.n_heads);
                CHECK(d.device_peak <= d.budget);
            }
            const double err_split = rel_err(got, want64), apart = rel_err(got, widen(one));
            MESSAGE(std::string(sc.name)
                    << ": " << err_split << " from float64, " << apart << " from one device");
            if (bounds) {
                // The ranks' partial sums of wo and w_down are added in
                // another order than one device's matmul.
                CHECK(apart < 2e-4);
                CHECK(err_split < 2 * err_one + 1e-5);
            } else {
                CHECK(err_split < 0.05);
            }
            // Only placement differs within a group: the same bits.
            if (first.empty()) {
                first = got;
            } else {
                CHECK(got == first);
            }
        }
    }
    std::filesystem::remove(path);
}

} // namespace

TEST_CASE("a model split by heads comes within a bound of one device and of float64, the same "
          "bits in every placement") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny::shape s = head_split_shape();
    s.wtype = SMOL_TYPE_F32;
    check_heads_split(s, true, seed);
}

TEST_CASE("a q8_0 model split by heads gives the same bits in every placement") {
    SMOL_TEST_DRAW_SEED(seed);
    check_heads_split(head_split_shape(), false, seed);
}

TEST_CASE("the plan of a head split shows each rank's heads and MLP rows") {
    SMOL_TEST_DRAW_SEED(seed);
    tiny_file f(seed, head_split_shape());
    smol_context_params p = params_of({"", "sim,sim", SMOL_KV_OFFLOAD_ALL, 1});
    p.split = SMOL_SPLIT_HEAD;
    context_ptr c = make_context(f.m.get(), p);
    const std::string plan = dump(c.get(), false);
    CAPTURE(plan);
    CHECK(plan.find("device sim: rank 0 of 2: kv heads 0-1 of 4, MLP rows 0-63 of 128, the "
                    "output\n") != std::string::npos);
    CHECK(plan.find("device sim: rank 1 of 2: kv heads 2-3 of 4, MLP rows 64-127 of 128\n") !=
          std::string::npos);
    CHECK(plan.find("resident heads per layer: 0-2: 0/2") != std::string::npos);
    const std::string sched = dump(c.get(), true);
    CAPTURE(sched);
    CHECK(sched.find("ALL_REDUCE") != std::string::npos);
}

TEST_CASE("a rank that fails a step fails the call, the others stop, and the next call runs") {
    SMOL_TEST_DRAW_SEED(seed);
    const tiny::shape s = head_split_shape();
    tiny_file f(seed, s);
    std::mt19937 rng(seed);
    const std::vector<int> ids = random_ids(rng, 30, s.n_vocab);
    smol_context_params p = params_of({"", "sim,sim", SMOL_KV_OFFLOAD_ALL, 1});
    p.split = SMOL_SPLIT_HEAD;
    // The same split without faults: a head split's own logits are the
    // same bits run after run.
    context_ptr clean = make_context(f.m.get(), p);
    const std::vector<std::vector<float>> want = decode_all(clean.get(), ids, s.n_vocab, 16, 20);
    context_ptr c = make_context(f.m.get(), p);
    smol::faults::scope armed;
    smol_batch b = smol_batch_init(16);
    std::vector<std::vector<float>> got;
    // Each call fails once at a kernel of either rank, early, midway or late
    // in the step, then runs again whole.
    int64_t at = 0;
    for (size_t i0 = 0; i0 < ids.size();) {
        const size_t n = i0 < 20 ? std::min<size_t>(16, 20 - i0) : 1;
        b.n_tokens = 0;
        for (size_t i = i0; i < i0 + n; ++i) smol_batch_add(&b, 16, ids[i], smol_pos(i), 0, true);
        smol::faults::arm(smol::faults::site::kernel, at);
        at = (at * 7 + 11) % 60;
        const smol_status st = smol_decode(c.get(), &b);
        const std::string msg = smol_last_error();
        smol::faults::disarm_all();
        CAPTURE(msg);
        CHECK(st == SMOL_ERR_BACKEND);
        CHECK(msg.find("a kernel failed") != std::string::npos);
        CHECK(smol_kv_seq_len(c.get(), 0) == int32_t(i0));
        REQUIRE(smol_decode(c.get(), &b) == SMOL_OK);
        for (int i = 0; i < b.n_tokens; ++i) {
            const float * l = smol_get_logits(c.get(), i);
            REQUIRE(l != nullptr);
            got.emplace_back(l, l + s.n_vocab);
        }
        i0 += n;
    }
    smol_batch_free(&b);
    CHECK(got == want);
}
