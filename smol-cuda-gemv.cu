// smol-cuda-gemv.cu - the GPU backend's matmuls of up to 32 tokens: the
// GEMV of decode (rows a warp, split K, a folded RMS norm, SwiGLU, the
// residual, and k and v into the cache), the small-batch kernel (both in
// smol-cuda-gemv.cuh; this file instantiates their plain matmuls,
// smol-cuda-gemv-swiglu.cu SwiGLU's), the scalar kernel for odd shapes, and
// the backend's run of a matmul step (cuda_backend::run_mm), which hands
// larger batches to cuBLAS (smol-cuda-blas.cu).

#include "smol-cuda-gemv.cuh"

namespace smol::gpu {

namespace {

// Any K and alignment: one warp per (row, token), element by element. Only
// float weights whose K is not a multiple of 8 come here.
__global__ void mm_scalar_kernel(int type, const uint8_t * w, size_t w_row_bytes, int K, int N,
                                 const float * x, size_t ldx, float * y, int M) {
    const int warp = threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    const int r = blockIdx.x * mm_warps + warp, m = blockIdx.y;
    if (r >= N || m >= M) return;
    const uint8_t * wr = w + size_t(r) * w_row_bytes;
    const float * xr = x + size_t(m) * ldx;
    float acc = 0.0f;
    for (int k = lane; k < K; k += warp_size) acc += row_elem(type, wr, k) * xr[k];
    acc = warp_sum(acc);
    if (lane == 0) y[size_t(m) * N + r] = acc;
}

} // namespace

template void launch_mm_type<false>(int type, const mm_params & p, int rows, const mm_choice & c,
                                    cudaStream_t st, bool pdl);

#if !defined(SMOL_HIP)
// Only kernels compiled with the waits (sm_90 and up) may launch early: code
// JIT-compiled from older PTX has none (see griddep_wait).
int gemv_ptx_version() {
    cudaFuncAttributes fa{};
    SMOL_GPU_CHECK(cudaFuncGetAttributes(&fa, gemv_kernel<SMOL_TYPE_F16, false, 1, 1>));
    return fa.ptxVersion;
}
#endif

void cuda_backend::run_mm(const step & s, const batch_info & b) {
    const tensor * m0 = s.mm[0];
    const tensor * w = m0->src[0];
    const tensor * x = s.norm ? s.norm->src[0] : m0->src[1];
    const int K = int(w->ne[0]), M = int(m0->src[1]->ne[1]);
    if (!small_mm(m0)) {
        const mm_key key = key_of(m0);
#if defined(SMOL_HAVE_BLAS)
        if (blas_fits(m0)) {
            run_blas(s, x, K, M);
            return;
        }
#endif
        // Odd shapes: the scalar kernel, one launch per matmul.
        note_used(key, mm_choice{false, 0, 0, -1});
        for (int i = 0; i < s.n_mm; ++i) {
            const tensor * mi = s.mm[i];
            const tensor * wi = mi->src[0];
            const dim3 grid(unsigned((wi->ne[1] + mm_warps - 1) / mm_warps), unsigned(M));
            mm_scalar_kernel<<<grid, mm_warps * warp_size, 0, stream_>>>(
                int(wi->type), data_of<const uint8_t>(wi), wi->nb[1], K, int(wi->ne[1]),
                data_of<const float>(mi->src[1]), mi->src[1]->nb[1] / 4, data_of<float>(mi), M);
            check_launch("mm_scalar");
        }
        return;
    }
    mm_params p{};
    p.n_w = s.kind == step_kind::mm_swiglu ? 2 : s.n_mm;
    int total_rows = 0;
    for (int i = 0; i < p.n_w; ++i) {
        p.w[i] = data_of<const uint8_t>(s.mm[i]->src[0]);
        p.rows[i] = int(s.mm[i]->src[0]->ne[1]);
        p.y[i] = data_of<float>(s.mm[i]);
        total_rows += p.rows[i];
    }
    if (s.kind == step_kind::mm_swiglu || s.res) p.y[0] = data_of<float>(s.t);
    p.w_row_bytes = w->nb[1];
    p.K = K;
    p.M = M;
    p.x = data_of<const float>(x);
    p.ldx = x->nb[1] / 4;
    p.res = s.res ? data_of<const float>(s.res) : nullptr;
    p.ldr = s.res ? s.res->nb[1] / 4 : 0;
    p.norm_w = s.norm ? data_of<const float>(s.norm->src[1]) : nullptr;
    p.eps = s.norm ? s.norm->fparams[0] : 0.0f;
    p.gelu = s.kind == step_kind::mm_swiglu && s.t->kind == OP_GEGLU;
    // Weights are leaves of the graph, copied in before any step.
    p.early = true;
    for (int i = 0; i < p.n_w; ++i) p.early = p.early && s.mm[i]->src[0]->kind == OP_NONE;
    // A GEMV's prefetch pays where its weights take a small part of L2:
    // then the whole matrix is on its way while the kernel before ends
    // (the 135M model's GEMVs). The 1.7B model's matrices, many times
    // larger, decoded slower with it: they push each other out of L2.
    p.prefetch = p.early && gemv_prefetch(size_t(total_rows) * w->nb[1]);
    // The launch's own key (all its rows), else the first matmul's, else
    // the default tile: a fused launch cannot go to cuBLAS.
    mm_key key{w->type, total_rows, K, mm_bucket(M)};
    mm_choice c = choose(key);
    if (c.blas) {
        key = key_of(m0);
        c = choose(key);
        if (c.blas) c = default_small(key);
    }
    // The GEMV's rows a warp must divide every weight's rows.
    for (int i = 0; i < p.n_w; ++i) {
        if (p.rows[i] % c.r != 0) c.r = 1;
    }
    // With rows in pairs (k's rope pairs), no copy program to order the
    // cache's copies after kv_store and an f16 cache, the GEMV stores k and
    // v itself.
    if (s.store && !c.tile && c.r % 2 == 0 && !sched_.has_side_work() &&
        b.kv->type == SMOL_TYPE_F16) {
        p.kv = kv_store_of(steps_[size_t(s.store->node_index)], *b.kv);
        stored_ = s.store;
        c.kv = true;
    }
    note_used(mm_key{w->type, total_rows, K, mm_bucket(M)}, c);
    if (s.kind == step_kind::mm_swiglu) {
        launch_mm_type<true>(int(w->type), p, p.rows[0], c, stream_, pdl_now_);
    } else {
        launch_mm_type<false>(int(w->type), p, total_rows, c, stream_, pdl_now_);
    }
    check_launch("mul_mat");
}

} // namespace smol::gpu
