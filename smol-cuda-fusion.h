// smol-cuda-fusion.h - the GPU backend's fusion planner: which nodes of a
// graph run as one step (a matmul group sharing an input with its RMS norm,
// gate and up with their SwiGLU, a matmul with its residual add, a rope
// inside the cache store or the attention, k and v stored by the GEMV of q,
// k and v, a cuBLAS input made by the norm or SwiGLU before it, results kept
// as bf16 pairs for their readers). Host C++ with no GPU headers, so its
// rules are tested on any machine (tests/test-cuda-fusion.c++); what the
// device decides (which matmuls take which kernels) comes in as
// fusion_rules.

#ifndef SMOL_CUDA_FUSION_H
#define SMOL_CUDA_FUSION_H

#include "smol-graph.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace smol::gpu {

// What runs at one node. Fused steps stand at the last node of the group
// they replace; the other nodes of the group are skipped, their results
// never written: a caller reads only the graph's last node (the logits).
enum class step_kind : uint8_t { plain, mm, mm_swiglu, kv_store, attention };

struct step {
    step_kind kind = step_kind::plain;
    tensor * t = nullptr; // the node the step stands at; its output is the step's
    tensor * mm[3] = {};  // mm: matmuls that share one input; mm_swiglu: gate, up
    int n_mm = 0;
    tensor * norm = nullptr;  // an RMS_NORM folded into the matmuls' input
    tensor * glu = nullptr;   // a SWIGLU folded into a cuBLAS matmul's input
    tensor * add = nullptr;   // an ADD folded into that norm (cuBLAS matmuls)
    tensor * res = nullptr;   // a residual added to mm[0]'s result (t is the ADD)
    tensor * rope = nullptr;  // a ROPE folded into kv_store (of k) or attention (of q)
    tensor * extra = nullptr; // a result t reads beyond its own sources
    tensor * store = nullptr; // mm of q, k, v: the KV_STORE of k and v its GEMV may do
    bool skip = false;        // computed inside another step
    // cuBLAS over bf16_hl pairs: the results stay hi and lo in the scratch,
    // and the kernels that read them add them (the next step's input kernel,
    // or for q, k and v the cache store and the attention; plan_steps).
    bool keep_pairs = false;
};

// The rows a cache store (k) or an attention (q) step reads: its first
// source's, or the source of the ROPE folded into it.
inline const tensor * unrotated(const step & s) {
    return s.rope ? s.rope->src[0] : s.t->src[0];
}

// Batches of up to this many tokens over bf16 weights take cuBLAS in bf16,
// x as hi and lo columns (bf16_hl): the weights are read once, where the
// dequantized path below writes and reads them again. Larger ones
// dequantize the weights to f16 first, as other types do, where the pairs'
// doubled products cost more than that pass: with the pairs' sums made by
// the next input kernel, batches up to 256 tokens ran faster with pairs
// and 512-token prompts slower.
constexpr int64_t blas_pair_max_m = 256;

// Whether a cuBLAS matmul of M tokens over weights of this type takes
// bf16_hl pairs; a step's matmuls take them when all of them do.
inline bool blas_pairs(int type, int64_t M) {
    return type == SMOL_TYPE_BF16 && M <= blas_pair_max_m;
}
inline bool step_pairs(const step & s) {
    for (int i = 0; i < s.n_mm; ++i) {
        const tensor * m = s.mm[i];
        if (!blas_pairs(m->src[0]->type, m->src[1]->ne[1])) return false;
    }
    return true;
}

// What the planner asks of the backend.
struct fusion_rules {
    bool fuse = true; // false: every node is a step of its own (SMOL_CUDA_FUSE=0)
    // The matmul takes the backend's own kernels (the GEMV or the
    // small-batch kernel), which fold norms, SwiGLU and residuals in.
    std::function<bool(const tensor *)> small_mm;
    // The matmul may go to cuBLAS (never in a build without it).
    std::function<bool(const tensor *)> blas_fits;
};

// The steps of g: steps[i] stands at node i, with the nodes fused into it
// skipped (see step).
void plan_steps(const graph & g, const fusion_rules & r, std::vector<step> & steps);

} // namespace smol::gpu

#endif // SMOL_CUDA_FUSION_H
