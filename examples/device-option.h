// device-option.h - where a context runs, declared once for every program
// that makes one (smol-cli, smol-bench, smol-server, smol-perplexity):
// --device (one device, or a comma-separated list the model's layers are
// split over), --gpu-mem (one budget for every device, or a list with one
// for each), --split and --tensor-split.

#ifndef SMOL_DEVICE_OPTION_H
#define SMOL_DEVICE_OPTION_H

#include "smol.h"

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

struct device_options {
    std::string device; // "": the library's default (the CPU)
    std::string gpu_mem;
    std::string split = "layer";
    std::vector<float> tensor_split;
    // --gpu-mem's list, parsed: what the parameters point at.
    mutable std::vector<uint64_t> budgets;

    // Sets p's device fields; false with what is wrong in err. p points at
    // this object's strings and lists: it must outlive p's use.
    bool apply(smol_context_params & p, std::string & err) const {
        if (!device.empty()) p.device = device.c_str();
        budgets.clear();
        for (size_t a = 0; !gpu_mem.empty();) {
            const size_t b = gpu_mem.find(',', a);
            const std::string one = gpu_mem.substr(a, b == std::string::npos ? b : b - a);
            uint64_t bytes = 0;
            if (smol_parse_size(one.c_str(), &bytes) != SMOL_OK) {
                err = "--gpu-mem: " + std::string(smol_last_error());
                return false;
            }
            budgets.push_back(bytes);
            if (b == std::string::npos) break;
            a = b + 1;
        }
        if (budgets.size() == 1) {
            p.gpu_mem = budgets[0];
        } else if (!budgets.empty()) {
            p.device_mem = budgets.data();
            p.n_device_mem = uint32_t(budgets.size());
        }
        p.split = split == "head" ? SMOL_SPLIT_HEAD : SMOL_SPLIT_LAYER;
        if (!tensor_split.empty()) {
            p.tensor_split = tensor_split.data();
            p.n_tensor_split = uint32_t(tensor_split.size());
        }
        return true;
    }
};

inline void add_device_options(CLI::App & app, device_options & o) {
    app.add_option("--device", o.device,
                   "where to run: cpu, sim (a simulated device) or cuda:N; a list such as "
                   "cuda:0,cuda:1 splits the model's layers over the devices (default: cpu)");
    app.add_option("--gpu-mem", o.gpu_mem,
                   "device memory budget, such as 24GiB, for each device; or a list with one "
                   "per device, such as 8GiB,24GiB (default: none, all KV resident)");
    app.add_option("--split", o.split,
                   "several devices: layer (each holds a range of layers, their weights and "
                   "KV; exact) or head (each holds a share of every layer's heads and MLP, "
                   "their partial sums added across the devices; GPUs through NCCL)")
        ->capture_default_str()
        ->check(CLI::IsMember({"layer", "head"}));
    app.add_option("--tensor-split", o.tensor_split,
                   "several devices: each one's share of the layers, such as 3,1 (default: in "
                   "proportion to their --gpu-mem, else even)")
        ->delimiter(',');
}

// One line per device of a context over several: its layers and kv heads,
// budget, planned and peak device memory, resident heads and host KV.
inline std::string device_lines(const smol_context * ctx) {
    std::string out;
    const int32_t n = smol_context_n_devices(ctx);
    for (int32_t i = 0; n > 1 && i < n; ++i) {
        smol_memory_info m{};
        if (smol_context_device_memory(ctx, i, &m) != SMOL_OK) break;
        char line[320];
        std::snprintf(line, sizeof line,
                      "  device %d %s: layers %d-%d, kv heads %d-%d, budget %s, planned %.1f "
                      "MiB, peak %.1f MiB, %d of %d kv heads resident, host KV %.1f MiB\n",
                      i, m.device, m.first_layer, m.first_layer + m.n_layer - 1, m.first_kv_head,
                      m.first_kv_head + m.n_kv_heads - 1,
                      m.budget ? (std::to_string(m.budget >> 20) + " MiB").c_str() : "none",
                      double(m.device_planned) / 1048576.0, double(m.device_peak) / 1048576.0,
                      m.n_heads_resident, m.n_heads, double(m.host_kv) / 1048576.0);
        out += line;
    }
    return out;
}

#endif // SMOL_DEVICE_OPTION_H
