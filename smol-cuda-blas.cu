// smol-cuda-blas.cu - the GPU backend's matmuls of larger batches through
// cuBLAS (CUDA only: the HIP build has no BLAS): the weights dequantized to
// f16, or bf16 weights against x as bf16 hi and lo pairs, the input's
// conversion, the pairs' sums, and the backend's run of a cuBLAS step.

#include "smol-cuda.cuh"

#if defined(SMOL_HAVE_BLAS)

namespace smol::gpu {

namespace {

// --- matmul: large batches through cuBLAS ---------------------------------------

template <int T>
__global__ void dequant_f16_kernel(const uint8_t * w, size_t w_row_bytes, int K, int N,
                                   __half * dst) {
    const int n_ch = K / 8;
    const size_t total = size_t(N) * n_ch;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
         i += size_t(gridDim.x) * blockDim.x) {
        const size_t r = i / n_ch;
        const int ch = int(i % n_ch);
        float v[8];
        int e0, e1;
        load_chunk<T>(w + r * w_row_bytes, ch, v, e0, e1);
        // Two runs of four, each one 8-byte store (K is a multiple of 8).
        uint16_t * d = reinterpret_cast<uint16_t *>(dst + r * K);
        store4(d + e0, v[0], v[1], v[2], v[3]);
        store4(d + e1, v[4], v[5], v[6], v[7]);
    }
}

// Rows of x (K a multiple of 4, rows 16-byte aligned) as f16 or bf16_hl
// pairs, four at a time.
template <typename Out>
__global__ void blas_input_kernel(const float * x, size_t ldx, int K, int M, Out * dst) {
    const int k4 = K / 4;
    const size_t total = size_t(M) * k4, ld = std::is_same_v<Out, bf16_hl> ? 2 * size_t(K) : K;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
         i += size_t(gridDim.x) * blockDim.x) {
        const size_t r = i / k4;
        const int c = int(i % k4);
        const float4 v = *reinterpret_cast<const float4 *>(x + r * ldx + 4 * c);
        store4_at(dst + r * ld, 4 * c, K, v.x, v.y, v.z, v.w);
    }
}

// The results of up to three bf16_hl GEMMs of a step: y[m] (ldy apart) =
// W hi + W lo, columns 2m and 2m + 1 of y2 (N apart); block row j sums the
// j-th GEMM's.
struct pair_sums {
    const float * y2[3];
    float * y[3];
    int N[3];
    size_t ldy[3];
    int M;
};
__global__ void blas_pair_sum_kernel(const pair_sums p) {
    const int j = blockIdx.y, N = p.N[j];
    const float * y2 = p.y2[j];
    float * y = p.y[j];
    const size_t ldy = p.ldy[j];
    // Block z takes tokens [8 z, 8 z + 8); a thread four columns (or one
    // where rows are not 16-byte aligned) of each.
    const int m0 = int(blockIdx.z) * 8, m1 = min(p.M, m0 + 8);
    const bool vec = N % 4 == 0 && ldy % 4 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
    const int items = vec ? N / 4 : N;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < items; i += gridDim.x * blockDim.x) {
        for (int m = m0; m < m1; ++m) {
            const float * hi = y2 + 2 * size_t(m) * size_t(N);
            const float * lo = hi + N;
            if (vec) {
                const float4 a = reinterpret_cast<const float4 *>(hi)[i];
                const float4 b = reinterpret_cast<const float4 *>(lo)[i];
                reinterpret_cast<float4 *>(y + size_t(m) * ldy)[i] = add4(a, b);
            } else {
                y[size_t(m) * ldy + i] = hi[i] + lo[i];
            }
        }
    }
}

} // namespace

// y[M][N] = x[M][K] . W[N][K]^T on tensor cores, x from blas_input(), f32
// accumulation and result. With pairs (bf16 weights, M <= blas_pair_max_m) the weights are
// read as they are and x comes as bf16_hl pairs: y gets 2 M columns of
// results, for blas_gemms to add. Otherwise the operands are
// f16 (weights other than f16 dequantized into the scratch first; a bf16
// weight beyond f16's range would overflow, and trained llama weights stay
// far below it).
void cuda_backend::blas_gemm(int type, bool pairs, const uint8_t * w, size_t w_row_bytes, int N,
                             int K, int M, float * y, size_t ldy, uint8_t * scratch) {
    const float one = 1.0f, zero = 0.0f;
    const void * xin = blas_input();
    const void * wh = w;
    int ldw = int(w_row_bytes / 2);
    if (pairs) {
        SMOL_BLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, 2 * M, K, &one, w,
                                     CUDA_R_16BF, ldw, xin, CUDA_R_16BF, K, &zero, y, CUDA_R_32F,
                                     int(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return;
    }
    if (type != SMOL_TYPE_F16) {
        __half * d = reinterpret_cast<__half *>(scratch);
        const size_t chunks = size_t(N) * size_t(K / 8);
        const unsigned grid = unsigned(grid_for(chunks, 256));
        with_weight_type(type, [&](auto t) {
            constexpr int T = decltype(t)::value;
            if constexpr (T != SMOL_TYPE_F32 && T != SMOL_TYPE_F16)
                dequant_f16_kernel<T><<<grid, 256, 0, stream_>>>(w, w_row_bytes, K, N, d);
        });
        check_launch("dequant_f16");
        wh = d;
        ldw = K;
    }
    SMOL_BLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, wh, CUDA_R_16F,
                                 ldw, xin, CUDA_R_16F, K, &zero, y, CUDA_R_32F, int(ldy),
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// The same from f32 x, converted into the work space first; f32 weights
// through cublasSgemm.
void cuda_backend::blas_mm(int type, const uint8_t * w, size_t w_row_bytes, int N, int K,
                           const float * x, size_t ldx, int M, float * y, size_t ldy) {
    if (type == SMOL_TYPE_F32) {
        const float one = 1.0f, zero = 0.0f;
        SMOL_BLAS_CHECK(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one,
                                    reinterpret_cast<const float *>(w), int(w_row_bytes / 4), x,
                                    int(ldx), &zero, y, int(ldy)));
        return;
    }
    const bool pairs = blas_pairs(type, M);
    blas_input_of(pairs, x, ldx, K, M);
    blas_out o{type, w, w_row_bytes, N, y, ldy};
    blas_gemms(pairs, true, K, M, &o, 1);
}

// n GEMMs over the input at blas_input(), each into its output; with pairs
// each into two columns a token of its own in the scratch, then (with sum)
// all added into the outputs in one launch (blas_pair_sum_kernel) after the
// last, or else left there for the kernels that read them to add. Returns
// the end of the scratch the pairs' results took.
uint8_t * cuda_backend::blas_gemms(bool pairs, bool sum, int K, int M, blas_out * o, int n) {
    int widest = 0;
    for (int i = 0; i < n; ++i) widest = std::max(widest, o[i].N);
    uint8_t * scratch = blas_scratch(pairs, K, widest, M);
    pair_sums ps{};
    ps.M = M;
    for (int i = 0; i < n; ++i) {
        float * y = o[i].y;
        size_t ldy = o[i].ldy;
        if (pairs) {
            ps.y2[i] = reinterpret_cast<const float *>(scratch);
            ps.y[i] = y;
            ps.N[i] = o[i].N;
            ps.ldy[i] = ldy;
            y = reinterpret_cast<float *>(scratch);
            ldy = size_t(o[i].N);
            o[i].hl = y;
            scratch += blas_pair_bytes(o[i].N, M);
        }
        blas_gemm(o[i].type, pairs, o[i].w, o[i].w_row_bytes, o[i].N, K, M, y, ldy, scratch);
    }
    if (!pairs || !sum) return scratch;
    const dim3 grid(unsigned(grid_for(size_t(widest + 3) / 4, 256)), unsigned(n),
                    unsigned((M + 7) / 8));
    blas_pair_sum_kernel<<<grid, 256, 0, stream_>>>(ps);
    check_launch("blas_pair_sum");
    return scratch;
}

// x[M][K] as f16, or as bf16_hl pairs, at the start of the work space.
void cuda_backend::blas_input_of(bool pairs, const float * x, size_t ldx, int K, int M) {
    const unsigned grid = unsigned(grid_for(size_t(M) * K / 4, 256));
    if (pairs) {
        blas_input_kernel<<<grid, 256, 0, stream_>>>(x, ldx, K, M,
                                                     static_cast<bf16_hl *>(blas_input()));
    } else {
        blas_input_kernel<<<grid, 256, 0, stream_>>>(x, ldx, K, M,
                                                     static_cast<uint16_t *>(blas_input()));
    }
    check_launch("blas_input");
}

// A step's cuBLAS matmuls: their one input made once (converted, or from
// the folded RMS norm or SwiGLU), then a GEMM each.
void cuda_backend::run_blas(const step & s, const tensor * x, int K, int M) {
    for (int i = 0; i < s.n_mm; ++i) {
        mm_choice c{true, 1, 1, -1};
        c.kept = s.keep_pairs;
        note_used(key_of(s.mm[i]), c);
    }
    const tensor * w0 = s.mm[0]->src[0];
    // f32 weights take x as it is, through cublasSgemm (blas_mm).
    const bool f32 = w0->type == SMOL_TYPE_F32;
    const bool pairs = step_pairs(s);
    // The input's producer, for f16 or for bf16_hl pairs.
    auto make = [&](auto * xin) {
        using Out = std::remove_pointer_t<decltype(xin)>;
        const size_t ld = size_t(K) * (pairs ? 2 : 1);
        if (s.norm) {
            // With a folded add, x is the add's result, made here from its
            // sources (kept results as b: x + b = b + x).
            const tensor * a = s.add ? s.add->src[0] : x;
            const tensor * b = s.add ? s.add->src[1] : nullptr;
            if (b && source_of(a).lo) std::swap(a, b);
            const source bs = b ? source_of(b) : source{nullptr, 0, 0};
            launch_rms_norm<Out>(unsigned(M), stream_, data_of<const float>(a), bs.p, bs.ld, bs.lo,
                                 s.add ? data_of<float>(s.add) : nullptr, a->nb[1] / 4,
                                 data_of<const float>(s.norm->src[1]), xin, ld, K,
                                 s.norm->fparams[0]);
            check_launch("rms_norm (cuBLAS input)");
        } else if (s.glu) {
            // Gate and up are both kept or both tensors (make_steps).
            const source g = source_of(s.glu->src[0]), u = source_of(s.glu->src[1]);
            launch_swiglu<Out>(stream_, g.p, u.p, g.ld, g.lo, xin, K, M);
            check_launch("swiglu (cuBLAS input)");
        } else {
            blas_input_of(pairs, data_of<const float>(x), x->nb[1] / 4, K, M);
        }
    };
    if (!f32 && pairs) make(static_cast<bf16_hl *>(blas_input()));
    if (!f32 && !pairs) make(static_cast<uint16_t *>(blas_input()));
    // What the step before kept, only the input's kernel read: from here
    // on the work space is this step's (as step_work counts it).
    n_kept_ = 0;
    kept_end_ = 0;
    if (f32) {
        blas_mm(int(w0->type), data_of<const uint8_t>(w0), w0->nb[1], int(w0->ne[1]), K,
                data_of<const float>(x), x->nb[1] / 4, M, data_of<float>(s.mm[0]),
                s.mm[0]->nb[1] / 4);
        return;
    }
    blas_out o[3];
    for (int i = 0; i < s.n_mm; ++i) {
        const tensor * m = s.mm[i];
        const tensor * w = m->src[0];
        o[i] = {int(w->type),  data_of<const uint8_t>(w), w->nb[1],
                int(w->ne[1]), data_of<float>(m),         m->nb[1] / 4};
    }
    const uint8_t * end = blas_gemms(pairs, !s.keep_pairs, K, M, o, s.n_mm);
    if (!s.keep_pairs) return;
    for (int i = 0; i < s.n_mm; ++i) kept_[i] = {s.mm[i], o[i].hl, o[i].N};
    n_kept_ = s.n_mm;
    kept_end_ = size_t(end - static_cast<const uint8_t *>(work_.p));
}

} // namespace smol::gpu

#endif // SMOL_HAVE_BLAS
