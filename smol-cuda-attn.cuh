// smol-cuda-attn.cuh - the device side that the attention kernels of
// smol-cuda-attn.cu (classic, decode) and smol-cuda-fattn.cu (flash) share:
// which cells and tiles a query sees, a query's loads, the merge of split
// partials, and (NVIDIA only) the tensor-core and async-copy instructions
// of the flash and decode kernels.

#ifndef SMOL_CUDA_ATTN_CUH
#define SMOL_CUDA_ATTN_CUH

#include "smol-cuda.cuh"

namespace smol::gpu {

// Whether no query of the sequences `seqs` at positions up to max_pos can
// see a cell of the tile (so an attention kernel skips it unread).
__device__ __forceinline__ bool tile_unseen(const cell_tile & t, seq_mask seqs, int max_pos) {
    return t.n_used == 0 || t.min_pos > max_pos || !(t.seq_or & seqs);
}

// Cell c's sequences, and the plane of words that holds sequence seq's bit.
__device__ __forceinline__ seq_mask cell_mask(const attn_params & p, int c) {
    return {{p.cell_seqs[c], p.cell_seqs[p.seq_plane + c]}};
}
__device__ __forceinline__ const uint64_t * seq_words(const attn_params & p, int seq) {
    return p.cell_seqs + size_t(seq >> 6) * p.seq_plane;
}

// Elements 2j and 2j + 1 of query head h of token tok (hd apart per head),
// turned by the rope when the kernel applies it; zeros past the batch.
__device__ __forceinline__ void load_query_pair(const attn_params & p, int tok, int h, int hd,
                                                int j, float & x0, float & x1) {
    x0 = x1 = 0.0f;
    if (tok >= p.n_tok) return;
    const float * src = p.q + tok * p.ldq + h * hd;
    x0 = src[2 * j];
    x1 = src[2 * j + 1];
    if (p.q_lo) x0 += src[p.q_lo + 2 * j], x1 += src[p.q_lo + 2 * j + 1];
    if (p.rope.pos) {
        float c, sn;
        rope_get(p.rope, tok, j, c, sn);
        rope_pair(x0, x1, c, sn);
    }
}

// Whether this block is the last of n_split to count itself on *done, which
// it then leaves at zero for the next launch or replay: each block's writes
// are visible before it counts, so the last one sees every split's partial.
// Every thread of the block calls it.
static __device__ bool last_split_block(int * done, int n_split) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(done, 1) == n_split - 1;
    __syncthreads();
    const bool is_last = last;
    if (is_last) {
        __threadfence();
        if (threadIdx.x == 0) *done = 0;
    }
    return is_last;
}

// The merge of S <= 32 PER_LANE split partials laid out `stride` floats
// apart, each (max, sum, accumulators...): a warp reads every split's (max,
// sum) at once (PER_LANE a lane), leaves split i's weight in w[i] and returns
// the sum of the weighted sums. Maxima are in natural-log units, or log2
// units with LOG2; a split that saw nothing has max -inf and weighs zero.
// Other blocks wrote the partials during this launch, so they are read from
// L2, or with SHARED from shared memory, where the caller copied them.
template <bool LOG2, int PER_LANE = 2, bool SHARED = false>
__device__ float split_weights(const float * part, int S, int stride, float * w) {
    const int lane = threadIdx.x % warp_size;
    auto load = [&](const float * x) { return SHARED ? *x : SMOL_LOAD_L2(x); };
    float mi[PER_LANE], li[PER_LANE];
#pragma unroll
    for (int k = 0; k < PER_LANE; ++k) {
        const int i = lane + warp_size * k;
        mi[k] = i < S ? load(part + i * stride) : -INFINITY;
        li[k] = i < S ? load(part + i * stride + 1) : 0.0f;
    }
    float mx = mi[0];
#pragma unroll
    for (int k = 1; k < PER_LANE; ++k) mx = fmaxf(mx, mi[k]);
    mx = warp_max(mx);
    float L = 0.0f;
#pragma unroll
    for (int k = 0; k < PER_LANE; ++k) {
        const float d = mi[k] - mx;
        const float f = mi[k] == -INFINITY ? 0.0f : LOG2 ? exp2f(d) : expf(d);
        L += li[k] * f;
        if (lane + warp_size * k < S) w[lane + warp_size * k] = f;
    }
    return warp_sum(L);
}

#if defined(SMOL_FLASH_ATTENTION)

// D += A B for one 16x16 (row) by 16x8 (column) product of f16 with f32
// accumulators, the fragments in the layout the PTX ISA gives for m16n8k16.
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 f16 matrices from shared memory: lanes 8i..8i+7 give the rows of
// matrix i; register i of lane l gets row l / 4, columns 2 (l % 4) and
// 2 (l % 4) + 1 of matrix i (the B fragment of a column-major operand), or
// with Trans column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1 (the B fragment
// of a row-major operand).
template <bool Trans = false>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t * row) {
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
    if constexpr (Trans) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr)
                     : "memory");
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr)
                     : "memory");
    }
}

// The transpose of an 8x8 f16 matrix held as a fragment (lane l: row l / 4,
// columns 2 (l % 4) and 2 (l % 4) + 1), in the same layout: a matrix of
// products turned into the B fragment of a product by its transpose.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
    uint32_t y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

// 16 bytes from global to shared memory without a register, in the group
// the next commit closes: the first `bytes` (0 to 16) read from gmem, the
// rest zeros (gmem must be a valid address even when nothing is read);
// wait<N> returns once at most N groups are in flight.
__device__ __forceinline__ void cp_async16(void * smem, const void * gmem, int bytes = 16) {
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(gmem),
                 "r"(bytes)
                 : "memory");
}

// 4 bytes from global to shared memory the same way (both 4-byte aligned).
__device__ __forceinline__ void cp_async4(void * smem, const void * gmem) {
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(addr), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ uint32_t ld_u32(const uint16_t * p) {
    return *reinterpret_cast<const uint32_t *>(p);
}

// 2^x in one instruction (the special function unit's, as exp2f uses, without
// exp2f's care for results below 2^-126, which a softmax weight may lose).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

#endif

} // namespace smol::gpu

#endif // SMOL_CUDA_ATTN_CUH
