// smol-host-attention.h - attention of offloaded KV where it lives: the
// host's threads run the KV_STORE and ATTENTION nodes of a device's graph
// that work on head groups held in host memory (tensor::on_host), beside the
// device's own work. Defined in smol-host-attention.c++.
//
// A decode step attends few heads, each over many cells, so the attention
// splits every head's visible cells into chunks: each chunk gives a partial
// result (its scores' largest value, the sum of their exponentials and the
// weighted sum of V), and the partials of a query head are merged as
// flash-decoding merges them. That is exact math in another summation
// order than the device's kernels: host-attended heads agree with the
// device within a stated bound, not bit for bit. It needs the batch's
// sequence cell lists (batch_info::seq_cells).

#ifndef SMOL_HOST_ATTENTION_H
#define SMOL_HOST_ATTENTION_H

#include "smol-cpu.h"
#include "smol-graph.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace smol {

class host_attention {
  public:
    explicit host_attention(int n_threads);
    int n_threads() { return pool_.size(); }
    // Runs one host node (KV_STORE or ATTENTION) of a graph whose batch is
    // b, on this object's threads; returns when it is done. Throws
    // smol::error for a node it cannot run.
    void run(tensor * t, const batch_info & b);
    // Bytes of an f16 (or `type`) cache that this object's attention reads a
    // second: one token's attention over 64 Ki cells of 16 heads, the
    // median of several passes (the planner's host rate), once per process;
    // or, with `more`, passes for as long as it returns true (the speed
    // while something else runs, such as the link's copies), not kept.
    double measure(int32_t head_dim, int32_t q_per_kv, smol_type type,
                   const std::function<bool()> & more = {});

  private:
    void attend(tensor * t, const batch_info & b);
    thread_pool pool_;
    // Per work item (token, query head, chunk): the chunk's largest score,
    // its sum of exponentials, head_dim weighted values.
    std::vector<float> partials_;
    // Per thread: scores of a chunk for a kv head's queries, the queries.
    std::vector<float> scratch_;
    // Per token: where its visible cells are (two runs of its sequence's
    // list: the sinks, then the rest) and how its chunks number.
    struct token_runs {
        int32_t a0, a1, b0, b1; // [a0, a1) and [b0, b1) in the sequence's list
        int32_t chunk0;         // its first chunk among the step's
    };
    std::vector<token_runs> runs_;
};

} // namespace smol

#endif // SMOL_HOST_ATTENTION_H
