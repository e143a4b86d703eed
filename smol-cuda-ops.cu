// smol-cuda-ops.cu - the GPU backend's small ops: get_rows, the RMS norm
// (with a residual add folded in, or per head), add, scale, SwiGLU and
// GeGLU, rope (adjacent or NeoX-style pairs, and the run's table of rope
// angles) and the KV store into the cache's cells, their kernels and
// launches, and the backend's launch of a step that is none of the fused
// ones (cuda_backend::launch).

#include "smol-cuda.cuh"

namespace smol::gpu {

namespace {

float rope_theta_scale(float base, int hd) {
    return std::pow(base, -2.0f / float(hd));
}

__global__ void rope_table_kernel(const rope_params r, float2 * table) {
    for (int j = threadIdx.x; j < r.half; j += blockDim.x) {
        float c, s;
        rope_cs(r.pos[blockIdx.x], j, r.theta_scale, c, s);
        table[size_t(blockIdx.x) * r.half + j] = make_float2(c, s);
    }
}

// --- small ops ----------------------------------------------------------------

__global__ void get_rows_kernel(int type, const uint8_t * table, size_t row_bytes,
                                const int32_t * ids, float * dst, size_t ld_dst, int n) {
    const size_t r = size_t(ids[blockIdx.x]);
    const uint8_t * row = table + r * row_bytes;
    float * d = dst + blockIdx.x * ld_dst;
    for (int e = threadIdx.x; e < n; e += blockDim.x) d[e] = row_elem(type, row, e);
}

// A block a row; four elements at a time where the row's length and the
// pointers' alignment allow. With b (rows ldb apart), the row normed is
// x + b, which is also stored in h (the residual add before a norm, in one
// pass); with b_lo, b's element e is b[e] + b[b_lo + e] (a cuBLAS step's
// results over bf16_hl pairs, added here in place of blas_pair_sum_kernel).
template <typename Out>
__global__ void rms_norm_kernel(const float * x, const float * b, size_t ldb, size_t b_lo,
                                float * h, size_t ldx, const float * w, Out * dst, size_t ld_dst,
                                int n, float eps) {
    __shared__ double red[32];
    const size_t row = blockIdx.x * ldx;
    const float * xr = x + row;
    const float * br = b ? b + blockIdx.x * ldb : nullptr;
    Out * d = dst + blockIdx.x * ld_dst;
    const uintptr_t at =
        reinterpret_cast<uintptr_t>(xr) | reinterpret_cast<uintptr_t>(w) |
        (b ? reinterpret_cast<uintptr_t>(br) | reinterpret_cast<uintptr_t>(h + row) |
                 reinterpret_cast<uintptr_t>(br + b_lo)
           : 0);
    const bool vec =
        n % 4 == 0 && at % 16 == 0 && reinterpret_cast<uintptr_t>(d) % (4 * sizeof(Out)) == 0;
    double ss = 0.0;
    if (vec) {
        for (int e = 4 * threadIdx.x; e < n; e += 4 * blockDim.x) {
            float4 v = *reinterpret_cast<const float4 *>(xr + e);
            if (b) {
                float4 u = *reinterpret_cast<const float4 *>(br + e);
                if (b_lo) u = add4(u, *reinterpret_cast<const float4 *>(br + b_lo + e));
                v = add4(v, u);
                *reinterpret_cast<float4 *>(h + row + e) = v;
            }
            ss += double(v.x) * double(v.x);
            ss += double(v.y) * double(v.y);
            ss += double(v.z) * double(v.z);
            ss += double(v.w) * double(v.w);
        }
    } else {
        for (int e = threadIdx.x; e < n; e += blockDim.x) {
            float v = xr[e];
            if (b) h[row + e] = v = v + (b_lo ? br[e] + br[b_lo + e] : br[e]);
            ss += double(v) * double(v);
        }
    }
    const float scale = rms_scale(block_sum_f64(ss, red), n, eps);
    // Each thread reads back the sums it stored itself.
    const float * y = b ? h + row : xr;
    if (vec) {
        for (int e = 4 * threadIdx.x; e < n; e += 4 * blockDim.x) {
            const float4 v = *reinterpret_cast<const float4 *>(y + e);
            const float4 g = *reinterpret_cast<const float4 *>(w + e);
            store4_at(d, e, n, (v.x * scale) * g.x, (v.y * scale) * g.y, (v.z * scale) * g.z,
                      (v.w * scale) * g.w);
        }
    } else {
        for (int e = threadIdx.x; e < n; e += blockDim.x) store_at(d, e, n, (y[e] * scale) * w[e]);
    }
}

__global__ void add_kernel(const float * a, const float * b, float * dst, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        dst[i] = a[i] + b[i];
    }
}

// dst = x * c over rows of n (a block row y takes rows y, y + gridDim.y, ...).
__global__ void scale_kernel(const float * x, size_t ldx, float c, float * dst, size_t ld_dst,
                             int n, int rows) {
    for (int r = blockIdx.y; r < rows; r += gridDim.y) {
        for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x)
            dst[size_t(r) * ld_dst + e] = x[size_t(r) * ldx + e] * c;
    }
}

// A block a row: each row's argmax, as the CPU's (the first of equal
// maxima, NaNs passed over, 0 where nothing is above -infinity). A thread
// keeps the first of its own maxima; pairs merge by value, then index.
constexpr int argmax_threads = 1024;

__global__ void __launch_bounds__(argmax_threads)
    argmax_kernel(const float * x, size_t ldx, int n, int32_t * dst) {
    const float * row = x + size_t(blockIdx.x) * ldx;
    float best = -INFINITY;
    int at = INT_MAX;
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        const float v = row[e];
        if (v > best) {
            best = v;
            at = e;
        }
    }
    auto merge = [&](float b, int i) {
        if (b > best || (b == best && i < at)) {
            best = b;
            at = i;
        }
    };
#pragma unroll
    for (int o = warp_size / 2; o > 0; o /= 2) merge(SMOL_SHFL_XOR(best, o), SMOL_SHFL_XOR(at, o));
    __shared__ float wb[argmax_threads / warp_size];
    __shared__ int wi[argmax_threads / warp_size];
    const int warp = threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    if (lane == 0) {
        wb[warp] = best;
        wi[warp] = at;
    }
    __syncthreads();
    if (warp != 0) return;
    const int n_warps = blockDim.x / warp_size;
    best = lane < n_warps ? wb[lane] : -INFINITY;
    at = lane < n_warps ? wi[lane] : INT_MAX;
#pragma unroll
    for (int o = warp_size / 2; o > 0; o /= 2) merge(SMOL_SHFL_XOR(best, o), SMOL_SHFL_XOR(at, o));
    if (lane == 0) dst[blockIdx.x] = best > -INFINITY ? at : 0;
}

// silu(g) * u of M rows of K (g's and u's rows ld apart; with lo, each of
// their elements is the sum of it and the one lo further: a cuBLAS step's
// results over bf16_hl pairs, added here in place of blas_pair_sum_kernel),
// four at a time where K and the pointers' alignment allow. Block row y
// takes rows y, y + gridDim.y, ...
// With GELU, the GeGLU gelu(g) * u instead.
template <typename Out, bool GELU = false>
__global__ void swiglu_kernel(const float * g, const float * u, size_t ld, size_t lo, Out * dst,
                              int K, int M) {
    const auto glu = [](float a, float b) { return GELU ? gelu_mul(a, b) : silu_mul(a, b); };
    constexpr bool hl = std::is_same_v<Out, bf16_hl>;
    const size_t ld_dst = hl ? 2 * size_t(K) : size_t(K);
    const int e0 = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
    const uintptr_t at = reinterpret_cast<uintptr_t>(g) | reinterpret_cast<uintptr_t>(u) |
                         reinterpret_cast<uintptr_t>(dst);
    const bool vec = K % 4 == 0 && ld % 4 == 0 && lo % 4 == 0 && at % 16 == 0;
    for (int r = blockIdx.y; r < M; r += gridDim.y) {
        const float * gr = g + size_t(r) * ld;
        const float * ur = u + size_t(r) * ld;
        Out * d = dst + size_t(r) * ld_dst;
        if (vec) {
            for (int e = 4 * e0; e < K; e += 4 * stride) {
                float4 a = *reinterpret_cast<const float4 *>(gr + e);
                float4 b = *reinterpret_cast<const float4 *>(ur + e);
                if (lo) {
                    a = add4(a, *reinterpret_cast<const float4 *>(gr + lo + e));
                    b = add4(b, *reinterpret_cast<const float4 *>(ur + lo + e));
                }
                store4_at(d, e, K, glu(a.x, b.x), glu(a.y, b.y), glu(a.z, b.z), glu(a.w, b.w));
            }
        } else {
            for (int e = e0; e < K; e += stride) {
                const float a = lo ? gr[e] + gr[lo + e] : gr[e];
                const float b = lo ? ur[e] + ur[lo + e] : ur[e];
                store_at(d, e, K, glu(a, b));
            }
        }
    }
}
dim3 swiglu_grid(int K, int M) {
    return dim3(unsigned((K + 1023) / 1024), unsigned(std::min(M, 65535)));
}

// One block per token; pairs (2j, 2j+1) of every head, or with neox
// (j, j + hd / 2).
__global__ void rope_kernel(const float * x, size_t ldx, const rope_params r, float * dst,
                            size_t ld_dst, int n_head, int hd, bool neox) {
    const int half = hd / 2, stride = neox ? 1 : 2, other = neox ? half : 1;
    const float * src = x + blockIdx.x * ldx;
    float * d = dst + blockIdx.x * ld_dst;
    for (int e = threadIdx.x; e < n_head * half; e += blockDim.x) {
        const int h = e / half, j = e % half, at = h * hd + stride * j;
        float c, s;
        rope_get(r, int(blockIdx.x), j, c, s);
        float x0 = src[at], x1 = src[at + other];
        rope_pair(x0, x1, c, s);
        d[at] = x0;
        d[at + other] = x1;
    }
}

// A block a token, a warp a head (at most 32 heads): the head's RMS norm
// (weight w of hd elements), then the rope turns it, with the float
// operations of the two kernels above in turn.
__global__ void norm_rope_kernel(const float * x, size_t ldx, const float * w, float eps,
                                 const rope_params r, float * dst, size_t ld_dst, int n_head,
                                 int hd, bool neox) {
    const int h = int(threadIdx.x) / warp_size, lane = int(threadIdx.x) % warp_size;
    if (h >= n_head) return;
    const float * src = x + blockIdx.x * ldx + size_t(h) * hd;
    float * d = dst + blockIdx.x * ld_dst + size_t(h) * hd;
    double ss = 0.0;
    for (int e = lane; e < hd; e += warp_size) ss += double(src[e]) * double(src[e]);
    ss = warp_sum_f64(ss);
    const float scale = rms_scale(ss, hd, eps);
    const int half = hd / 2, stride = neox ? 1 : 2, other = neox ? half : 1;
    for (int j = lane; j < half; j += warp_size) {
        const int a = stride * j, b = a + other;
        float x0 = (src[a] * scale) * w[a], x1 = (src[b] * scale) * w[b];
        float c, sn;
        rope_get(r, int(blockIdx.x), j, c, sn);
        rope_pair(x0, x1, c, sn);
        d[a] = x0;
        d[b] = x1;
    }
}

// A block a row: dst = res + the RMS norm of x (weight w), with the float
// operations of the norm's kernel and the add's in turn.
__global__ void norm_add_kernel(const float * x, size_t ldx, const float * w, float eps,
                                const float * res, size_t ldr, float * dst, size_t ld_dst, int n) {
    __shared__ double red[32];
    const float * xr = x + blockIdx.x * ldx;
    double ss = 0.0;
    for (int e = threadIdx.x; e < n; e += blockDim.x) ss += double(xr[e]) * double(xr[e]);
    const float scale = rms_scale(block_sum_f64(ss, red), n, eps);
    const float * rr = res + blockIdx.x * ldr;
    float * d = dst + blockIdx.x * ld_dst;
    for (int e = threadIdx.x; e < n; e += blockDim.x) d[e] = rr[e] + (xr[e] * scale) * w[e];
}

// A block a token, a thread a pair of elements of one of its kv heads, or
// two pairs where the rows allow (all of them at once, up to 1024 threads):
// converts k and v to f16 in the token's cache cell. Looping a block's 128
// threads over the heads was slow for one token of many heads; a block a
// (token, head) pair made a long prompt's launch a six-figure count of
// one-warp blocks, and prefill slower.
__global__ void kv_store_kernel(const kv_store_params p) {
    griddep_wait();
    griddep_launch();
    const int i = blockIdx.x, half = p.hd / 2;
    const size_t cell = size_t(p.cell[i]);
    const float * k = p.k + i * p.ldk;
    const float * v = p.v + i * p.ldv;
    if (p.vec) {
        const int quads = p.hd / 4;
        for (int e = threadIdx.x; e < p.n_head_kv * quads; e += blockDim.x) {
            const int h = e / quads, j = 2 * (e % quads), hr = p.h0 + h;
            float4 kq = *reinterpret_cast<const float4 *>(k + hr * p.hd + 2 * j);
            float4 vq = *reinterpret_cast<const float4 *>(v + hr * p.hd + 2 * j);
            if (p.k_lo)
                kq = add4(kq, *reinterpret_cast<const float4 *>(k + p.k_lo + hr * p.hd + 2 * j));
            if (p.v_lo)
                vq = add4(vq, *reinterpret_cast<const float4 *>(v + p.v_lo + hr * p.hd + 2 * j));
            if (p.rope.pos) {
                float c, s;
                rope_get(p.rope, i, j, c, s);
                rope_pair(kq.x, kq.y, c, s);
                rope_get(p.rope, i, j + 1, c, s);
                rope_pair(kq.z, kq.w, c, s);
            }
            const size_t at = h * p.head_stride + cell * p.hd + 2 * j;
            store4(p.K + at, kq.x, kq.y, kq.z, kq.w);
            store4(p.V + at, vq.x, vq.y, vq.z, vq.w);
        }
        return;
    }
    for (int e = threadIdx.x; e < p.n_head_kv * half; e += blockDim.x) {
        const int r = (p.h0 + e / half) * p.hd + 2 * (e % half);
        float k0 = k[r], k1 = k[r + 1], v0 = v[r], v1 = v[r + 1];
        if (p.k_lo) k0 += k[p.k_lo + r], k1 += k[p.k_lo + r + 1];
        if (p.v_lo) v0 += v[p.v_lo + r], v1 += v[p.v_lo + r + 1];
        store_kv_pair(p, i, cell, r, k0, k1, true);
        store_kv_pair(p, i, cell, r, v0, v1, false);
    }
}

// One block of 32 of a quantized row from a warp's lanes (lane l holds
// element l), by ggml's reference rules as smol-quant.c++ has them: q8_0
// d = amax / 127, q4_0 d = the signed maximum / -8.
__device__ __forceinline__ void quantize_block(int type, float x, uint8_t * blk) {
    const int lane = threadIdx.x % warp_size;
    const float amax = warp_max(fabsf(x));
    if (type == SMOL_TYPE_Q8_0) {
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        if (lane == 0) *reinterpret_cast<uint16_t *>(blk) = f32_to_f16(d);
        blk[2 + lane] = uint8_t(int8_t(roundf(__fmul_rn(x, id))));
        return;
    }
    // q4_0: the first lane of the largest magnitude gives the sign.
    int first = fabsf(x) == amax ? lane : warp_size;
    for (int o = warp_size / 2; o > 0; o /= 2) first = min(first, SMOL_SHFL_XOR(first, o));
    const float d = SMOL_SHFL(x, first) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    // Multiplied, then added, as the CPU does: no fused multiply-add.
    const int q = min(15, int(int8_t(__fadd_rn(__fmul_rn(x, id), 8.5f))));
    const int hi = SMOL_SHFL(q, (lane + 16) % warp_size);
    if (lane == 0) *reinterpret_cast<uint16_t *>(blk) = f32_to_f16(d);
    if (lane < 16) blk[2 + lane] = uint8_t(q | (hi << 4));
}

// A quantized cache's store: block i takes token i, each of the view's
// heads in turn, k (roped) and v rotated in shared memory, then each block
// of 32 quantized by a warp, as the CPU's run_kv_store does.
__global__ void kv_store_q_kernel(const kv_store_params p) {
    griddep_wait();
    griddep_launch();
    extern __shared__ float row[]; // [2][hd]: k and v
    const int i = blockIdx.x, hd = p.hd;
    const size_t cell = size_t(p.cell[i]);
    const float * k = p.k + i * p.ldk;
    const float * v = p.v + i * p.ldv;
    const int warp = threadIdx.x / warp_size, n_warps = blockDim.x / warp_size;
    const int blocks = hd / 32, blk_bytes = p.type == SMOL_TYPE_Q8_0 ? 34 : 18;
    for (int h = 0; h < p.n_head_kv; ++h) {
        const int hr = p.h0 + h;
        for (int j = threadIdx.x; j < hd / 2; j += blockDim.x) {
            float k0 = k[hr * hd + 2 * j], k1 = k[hr * hd + 2 * j + 1];
            float v0 = v[hr * hd + 2 * j], v1 = v[hr * hd + 2 * j + 1];
            if (p.k_lo) k0 += k[p.k_lo + hr * hd + 2 * j], k1 += k[p.k_lo + hr * hd + 2 * j + 1];
            if (p.v_lo) v0 += v[p.v_lo + hr * hd + 2 * j], v1 += v[p.v_lo + hr * hd + 2 * j + 1];
            if (p.rope.pos) {
                float c, s;
                rope_get(p.rope, i, j, c, s);
                rope_pair(k0, k1, c, s);
            }
            row[2 * j] = k0;
            row[2 * j + 1] = k1;
            row[hd + 2 * j] = v0;
            row[hd + 2 * j + 1] = v1;
        }
        __syncthreads();
        block_rotate(row, hd, p.rot_k);
        block_rotate(row + hd, hd, p.rot_v);
        for (int b = warp; b < 2 * blocks; b += n_warps) {
            const bool is_v = b >= blocks;
            const int bb = is_v ? b - blocks : b;
            uint16_t * base = (is_v ? p.V : p.K) + size_t(h) * p.head_stride + cell * p.row_words;
            quantize_block(p.type, row[(is_v ? hd : 0) + bb * 32 + threadIdx.x % warp_size],
                           reinterpret_cast<uint8_t *>(base) + bb * blk_bytes);
        }
        __syncthreads();
    }
}

} // namespace

void launch_rope_table(const rope_params & r, unsigned n_tok, float2 * table, cudaStream_t st) {
    rope_table_kernel<<<n_tok, 64, 0, st>>>(r, table);
}

template <typename Out>
void launch_rms_norm(unsigned rows, cudaStream_t st, const float * x, const float * b, size_t ldb,
                     size_t b_lo, float * h, size_t ldx, const float * w, Out * dst, size_t ld_dst,
                     int n, float eps) {
    rms_norm_kernel<Out><<<rows, 256, 0, st>>>(x, b, ldb, b_lo, h, ldx, w, dst, ld_dst, n, eps);
}

template <typename Out>
void launch_swiglu(cudaStream_t st, const float * g, const float * u, size_t ld, size_t lo,
                   Out * dst, int K, int M) {
    swiglu_kernel<Out><<<swiglu_grid(K, M), 256, 0, st>>>(g, u, ld, lo, dst, K, M);
}

#if defined(SMOL_HAVE_BLAS)
template void launch_rms_norm<uint16_t>(unsigned, cudaStream_t, const float *, const float *,
                                        size_t, size_t, float *, size_t, const float *, uint16_t *,
                                        size_t, int, float);
template void launch_rms_norm<bf16_hl>(unsigned, cudaStream_t, const float *, const float *, size_t,
                                       size_t, float *, size_t, const float *, bf16_hl *, size_t,
                                       int, float);
template void launch_swiglu<uint16_t>(cudaStream_t, const float *, const float *, size_t, size_t,
                                      uint16_t *, int, int);
template void launch_swiglu<bf16_hl>(cudaStream_t, const float *, const float *, size_t, size_t,
                                     bf16_hl *, int, int);
#endif

void cuda_backend::launch(const step & s, const batch_info & b) {
    tensor * t = s.t;
    switch (s.kind) {
    case step_kind::mm:
    case step_kind::mm_swiglu:
        run_mm(s, b);
        return;
    case step_kind::kv_store:
        run_kv_store(s, b);
        return;
    case step_kind::attention:
        run_attention(s, b);
        return;
    case step_kind::plain:
        break;
    }
    const tensor * a = t->src[0];
    if (t->kind != OP_KV_STORE && t->kind != OP_COPY && t->nbytes() == 0) return; // no work
    switch (t->kind) {
    case OP_NONE:
        return;
    case OP_GET_ROWS: {
        const int n = int(a->ne[0]);
        get_rows_kernel<<<unsigned(t->ne[1]), 256, 0, stream_>>>(
            int(a->type), data_of<const uint8_t>(a), a->nb[1], data_of<const int32_t>(t->src[1]),
            data_of<float>(t), t->nb[1] / 4, n);
        check_launch("get_rows");
        return;
    }
    case OP_RMS_NORM: {
        // Per head (iparams[0] elements a group): each head a row of its own.
        const int n = t->iparams[0] > 0 ? t->iparams[0] : int(a->ne[0]);
        const bool whole = n == a->ne[0];
        if (!whole && (a->nb[1] != size_t(a->ne[0]) * 4 || t->nb[1] != size_t(t->ne[0]) * 4)) {
            throw error(SMOL_ERR_UNSUPPORTED,
                        name_ + ": an RMS norm per head needs rows without gaps");
        }
        const unsigned rows = unsigned(whole ? t->nrows() : t->nrows() * (a->ne[0] / n));
        rms_norm_kernel<float><<<rows, whole ? 256 : 128, 0, stream_>>>(
            data_of<const float>(a), nullptr, 0, 0, nullptr, whole ? a->nb[1] / 4 : size_t(n),
            data_of<const float>(t->src[1]), data_of<float>(t), whole ? t->nb[1] / 4 : size_t(n), n,
            t->fparams[0]);
        check_launch("rms_norm");
        return;
    }
    case OP_ADD: {
        if (s.norm) { // the norm of one source folded in
            const tensor * x = s.norm->src[0];
            norm_add_kernel<<<unsigned(t->nrows()), 256, 0, stream_>>>(
                data_of<const float>(x), x->nb[1] / 4, data_of<const float>(s.norm->src[1]),
                s.norm->fparams[0], data_of<const float>(s.res), s.res->nb[1] / 4,
                data_of<float>(t), t->nb[1] / 4, int(t->ne[0]));
            check_launch("norm_add");
            return;
        }
        const size_t n = size_t(t->ne[0]) * size_t(t->nrows());
        add_kernel<<<grid_for(n, 256), 256, 0, stream_>>>(
            data_of<const float>(a), data_of<const float>(t->src[1]), data_of<float>(t), n);
        check_launch("add");
        return;
    }
    case OP_SWIGLU: {
        const int K = int(t->ne[0]), M = int(t->nrows());
        swiglu_kernel<float><<<swiglu_grid(K, M), 256, 0, stream_>>>(
            data_of<const float>(a), data_of<const float>(t->src[1]), size_t(K), 0,
            data_of<float>(t), K, M);
        check_launch("swiglu");
        return;
    }
    case OP_ROPE:
        if (s.norm) { // the norm per head folded in
            const tensor * x = s.norm->src[0];
            norm_rope_kernel<<<unsigned(t->ne[1]), unsigned(t->iparams[0] * warp_size), 0,
                               stream_>>>(data_of<const float>(x), x->nb[1] / 4,
                                          data_of<const float>(s.norm->src[1]), s.norm->fparams[0],
                                          rope_for(t), data_of<float>(t), t->nb[1] / 4,
                                          t->iparams[0], t->iparams[1], t->iparams[2] != 0);
            check_launch("norm_rope");
            return;
        }
        rope_kernel<<<unsigned(t->ne[1]), 128, 0, stream_>>>(
            data_of<const float>(a), a->nb[1] / 4, rope_for(t), data_of<float>(t), t->nb[1] / 4,
            t->iparams[0], t->iparams[1], t->iparams[2] != 0);
        check_launch("rope");
        return;
    case OP_SCALE: {
        const int n = int(t->ne[0]), rows = int(t->nrows());
        scale_kernel<<<dim3(unsigned((n + 255) / 256), unsigned(std::min(rows, 65535))), 256, 0,
                       stream_>>>(data_of<const float>(a), a->nb[1] / 4, t->fparams[0],
                                  data_of<float>(t), t->nb[1] / 4, n, rows);
        check_launch("scale");
        return;
    }
    case OP_GEGLU: {
        const int K = int(t->ne[0]), M = int(t->nrows());
        swiglu_kernel<float, true><<<swiglu_grid(K, M), 256, 0, stream_>>>(
            data_of<const float>(a), data_of<const float>(t->src[1]), size_t(K), 0,
            data_of<float>(t), K, M);
        check_launch("geglu");
        return;
    }
    case OP_KV_STORE:
        run_kv_store(s, b);
        return;
    case OP_ATTENTION:
        run_attention(s, b);
        return;
    case OP_COPY:
        copy_on(t, stream_);
        return;
    case OP_ALL_REDUCE:
#if defined(SMOL_NCCL)
        if (nccl_) {
            // The sum of every rank's partials, on this GPU's stream (NCCL
            // gives every rank the same bits).
            const ncclResult_t r = ncclAllReduce(a->data, t->data, size_t(a->ne[0]) * a->nrows(),
                                                 ncclFloat, ncclSum, nccl_, stream_);
            if (r != ncclSuccess) {
                throw error(SMOL_ERR_BACKEND,
                            name_ + ": NCCL's all-reduce failed: " + ncclGetErrorString(r));
            }
            return;
        }
#endif
        break;
    case OP_ARGMAX:
        argmax_kernel<<<unsigned(a->nrows()), argmax_threads, 0, stream_>>>(
            data_of<const float>(a), a->nb[1] / 4, int(a->ne[0]), data_of<int32_t>(t));
        check_launch("argmax");
        return;
    case OP_MUL_MAT:
    case OP_COUNT:
        break;
    }
    throw error(SMOL_ERR_UNSUPPORTED,
                std::string(name_) + ": no kernel for op " + op_names[t->kind]);
}

// The parameters of the KV_STORE step s (with the rope make_steps folded
// into it, if any).
kv_store_params cuda_backend::kv_store_of(const step & s, const kv_cache & kv) const {
    const tensor & t = *s.t;
    const tensor * k = unrotated(s);
    const tensor * v = t.src[1];
    kv_store_params p;
    const source ks = source_of(k), vs = source_of(v);
    p.k = ks.p;
    p.v = vs.p;
    p.ldk = ks.ld;
    p.ldv = vs.ld;
    p.k_lo = ks.lo;
    p.v_lo = vs.lo;
    const kv_view view = node_kv_view(&t, kv);
    p.K = view.k;
    p.V = view.v;
    p.head_stride = view.head_stride;
    p.hd = kv.head_dim;
    p.h0 = view.h0;
    p.n_head_kv = view.h1 - view.h0;
    p.cell = view.local ? d_slot_ : d_cell_; // a window store's rows are slots
    p.rope = s.rope ? rope_for(s.rope) : rope_params{};
    p.type = kv.type;
    p.row_words = kv.row_words;
    p.rot_k = kv.rot_k;
    p.rot_v = kv.rot_v;
    const auto at = [](const void * q) { return reinterpret_cast<uintptr_t>(q); };
    p.vec = p.hd % 4 == 0 && p.ldk % 4 == 0 && p.ldv % 4 == 0 && p.k_lo % 4 == 0 &&
            p.v_lo % 4 == 0 && p.head_stride % 4 == 0 && (at(p.k) | at(p.v)) % 16 == 0 &&
            (at(p.K) | at(p.V)) % 8 == 0;
    return p;
}

void cuda_backend::run_kv_store(const step & s, const batch_info & b) {
    if (stored_ == s.t) { // the GEMV of q, k and v did it
        stored_ = nullptr;
        return;
    }
    const kv_store_params p = kv_store_of(s, *b.kv);
    const int n_tok = int(s.t->src[1]->ne[1]);
    if (p.type != SMOL_TYPE_F16) {
        launch_kernel_smem(kv_store_q_kernel, dim3(unsigned(n_tok)), dim3(128),
                           size_t(2 * p.hd) * sizeof(float), stream_, pdl_now_, p);
        check_launch("kv_store (quantized)");
        return;
    }
    const int pairs = p.n_head_kv * (p.hd / 2) / (p.vec ? 2 : 1);
    const unsigned threads =
        unsigned(std::min(1024, (pairs + warp_size - 1) / warp_size * warp_size));
    launch_kernel(kv_store_kernel, dim3(unsigned(n_tok)), dim3(threads), stream_, pdl_now_, p);
    check_launch("kv_store");
}

// The angles of a ROPE node: from the run's table when the node's positions,
// head size and base are the table's.
rope_params cuda_backend::rope_for(const tensor * rope) const {
    rope_params r;
    r.pos = data_of<const int32_t>(rope->src[1]);
    r.half = rope->iparams[1] / 2;
    r.theta_scale = rope_theta_scale(rope->fparams[0], rope->iparams[1]);
    if (rope_key_ && rope->src[1] == rope_key_->src[1] &&
        rope->iparams[1] == rope_key_->iparams[1] && rope->fparams[0] == rope_key_->fparams[0]) {
        r.table = static_cast<const float2 *>(rope_.p);
    }
    return r;
}

} // namespace smol::gpu
