// smol-cuda-attn.cu - the GPU backend's attention: the classic kernel
// (split over the cells, streams of a query; the HIP build's only one), the
// decode kernel (tensor cores over warp tiles of the head-major cache, dense
// or by pages), the choice between them and the flash kernel
// (smol-cuda-fattn.cu) with their splits, and the backend's run of an
// attention step.

#include "smol-cuda-attn.cuh"

namespace smol::gpu {

namespace {

// --- attention ------------------------------------------------------------------

// Block (query group, head, split). Warp w serves query w % Q and walks the
// split's cells in tiles of 32 (tile t goes to stream w / Q): each lane
// scores one cell, the warp keeps an online softmax, then accumulates V with
// each lane owning NPL consecutive elements of the head. Streams of one
// query are merged through shared memory. With S splits (decode, Q = 1),
// each block leaves a partial result and the last one to finish merges them.
//
// Over a quantized cache (KT q8_0 or q4_0: blocks of 32 along a row, ggml's
// layout) the queries turn as K did before it was stored, and the output
// is turned back from V's turn by rotate_heads_kernel after it.
template <int KT> __device__ __forceinline__ float kv_elem(const uint8_t * row, int e) {
    const uint8_t * blk = row + (e / 32) * (KT == SMOL_TYPE_Q8_0 ? 34 : 18);
    const float d = f16_to_f32(*reinterpret_cast<const uint16_t *>(blk));
    const int i = e % 32;
    if constexpr (KT == SMOL_TYPE_Q8_0) return d * float(int8_t(blk[2 + i]));
    const uint8_t b = blk[2 + i % 16];
    return d * float((i < 16 ? b & 0xF : b >> 4) - 8);
}

// q . K's row of a quantized cache: each block's sum, then its scale.
template <int KT>
__device__ __forceinline__ float kv_dot(const uint8_t * row, const float * q, int hd) {
    float d = 0.0f;
    for (int b = 0; b < hd / 32; ++b) {
        const uint8_t * blk = row + b * (KT == SMOL_TYPE_Q8_0 ? 34 : 18);
        const float * qb = q + 32 * b;
        float sb = 0.0f;
        if constexpr (KT == SMOL_TYPE_Q8_0) {
            for (int i = 0; i < 32; ++i) sb += float(int8_t(blk[2 + i])) * qb[i];
        } else {
            for (int i = 0; i < 16; ++i) {
                const uint8_t x = blk[2 + i];
                sb += float((x & 0xF) - 8) * qb[i] + float((x >> 4) - 8) * qb[i + 16];
            }
        }
        d += f16_to_f32(*reinterpret_cast<const uint16_t *>(blk)) * sb;
    }
    return d;
}

template <int NPL, int KT = SMOL_TYPE_F16> __global__ void attention_kernel(const attn_params p) {
    extern __shared__ float sm[];
    const int hd = p.hd, half = hd / 2;
    float * qs = sm;            // [Q][hd]
    float * st = sm + p.Q * hd; // [warps][hd + 2]
    const int warp = threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    const int h = p.h0 * p.group + blockIdx.y, s = blockIdx.z, tok0 = blockIdx.x * p.Q;

    for (int e = threadIdx.x; e < p.Q * half; e += blockDim.x) {
        const int qi = e / half, j = e % half;
        float x0, x1;
        load_query_pair(p, tok0 + qi, h, hd, j, x0, x1);
        // The query meets the f16 cache as f16, as on the CPU.
        qs[qi * hd + 2 * j] = f16_to_f32(f32_to_f16(x0));
        qs[qi * hd + 2 * j + 1] = f16_to_f32(f32_to_f16(x1));
    }
    __syncthreads();
    if constexpr (KT != SMOL_TYPE_F16) block_rotate(qs, p.Q * hd, p.rot_k);

    const int qi = warp % p.Q, ws = warp / p.Q, tok = tok0 + qi;
    const bool active = tok < p.n_tok;
    const int n_used = *p.n_used;
    // At least one tile per stream in a split: a short history in few splits.
    const int chunk = max(((n_used + p.S - 1) / p.S + 31) & ~31, 32 * p.W);
    const int c_begin = s * chunk, c_end = min(n_used, c_begin + chunk);
    const int hk = h / p.group - p.h0;
    const uint16_t * K = p.K + hk * p.head_stride;
    const uint16_t * V = p.V + hk * p.head_stride;
    const int my_pos = active ? p.pos[tok] : -1, my_seq = active ? p.seq[tok] : -1;
    const float * q = qs + qi * hd;
    const bool vec16 = hd % 8 == 0;
    const int e_base = lane * NPL;
    const bool lane_full = e_base + NPL <= hd;

    float m = -INFINITY, l = 0.0f, acc[NPL];
#pragma unroll
    for (int e = 0; e < NPL; ++e) acc[e] = 0.0f;

    if (active) {
        for (int base = c_begin + ws * 32; base < c_end; base += p.W * 32) {
            const int c = base + lane;
            bool vis = false;
            if (c < c_end) {
                vis =
                    kv_cell_visible(p.cell_pos[c], cell_mask(p, c), my_seq, my_pos) &&
                    (p.window <= 0 || my_pos - p.cell_pos[c] < p.window || p.cell_pos[c] < p.sink);
            }
            float sc = -INFINITY;
            if (vis && KT != SMOL_TYPE_F16) {
                sc = kv_dot<KT>(reinterpret_cast<const uint8_t *>(K + size_t(c) * p.row_words), q,
                                hd) *
                     p.scale;
            } else if (vis) {
                const uint16_t * kr = K + size_t(c) * hd;
                float d = 0.0f;
                if (vec16) {
                    for (int j = 0; j < hd; j += 8) {
                        const uint4 u = *reinterpret_cast<const uint4 *>(kr + j);
                        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            d += f16_to_f32(uint16_t(w[i] & 0xffff)) * q[j + 2 * i] +
                                 f16_to_f32(uint16_t(w[i] >> 16)) * q[j + 2 * i + 1];
                        }
                    }
                } else {
                    for (int j = 0; j < hd; ++j) d += f16_to_f32(kr[j]) * q[j];
                }
                sc = d * p.scale;
            }
            const float tmax = warp_max(sc);
            if (tmax == -INFINITY) continue; // nothing visible in this tile
            const float m_new = fmaxf(m, tmax);
            const float corr = expf(m - m_new);
            const float pr = vis ? expf(sc - m_new) : 0.0f;
            l = l * corr + warp_sum(pr);
#pragma unroll
            for (int e = 0; e < NPL; ++e) acc[e] *= corr;
            const uint16_t * vr = V + size_t(base) * hd + e_base;
            auto add_row = [&](int j) {
                const float pj = SMOL_SHFL(pr, j);
                float v[NPL];
                if constexpr (KT != SMOL_TYPE_F16) {
                    const uint8_t * row =
                        reinterpret_cast<const uint8_t *>(V + size_t(base + j) * p.row_words);
#pragma unroll
                    for (int e = 0; e < NPL; ++e)
                        v[e] = e_base + e < hd ? kv_elem<KT>(row, e_base + e) : 0.0f;
                } else if (lane_full) {
                    if constexpr (NPL % 2 == 0) {
#pragma unroll
                        for (int e = 0; e < NPL; e += 2) {
                            const uint32_t w =
                                *reinterpret_cast<const uint32_t *>(vr + size_t(j) * hd + e);
                            v[e] = f16_to_f32(uint16_t(w & 0xffff));
                            v[e + 1] = f16_to_f32(uint16_t(w >> 16));
                        }
                    } else {
#pragma unroll
                        for (int e = 0; e < NPL; ++e) v[e] = f16_to_f32(vr[size_t(j) * hd + e]);
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < NPL; ++e) {
                        v[e] = e_base + e < hd ? f16_to_f32(vr[size_t(j) * hd + e]) : 0.0f;
                    }
                }
#pragma unroll
                for (int e = 0; e < NPL; ++e) acc[e] = pj != 0.0f ? acc[e] + pj * v[e] : acc[e];
            };
            // No branch on the weight, so the loads of several rows of V are
            // in flight at once; a zero weight adds nothing (and skips the
            // row's value, as the CPU does, should it not be finite).
            const int n_c = min(32, c_end - base);
            if (n_c == 32) {
#pragma unroll 8
                for (int j = 0; j < 32; ++j) add_row(j);
            } else {
                for (int j = 0; j < n_c; ++j) add_row(j);
            }
            m = m_new;
        }
    }

    // Merge the W streams of each query; warp qi (stream 0) keeps the result.
    bool holder = active;
    if (p.W > 1) {
        float * mine = st + warp * (hd + 2);
        if (lane == 0) {
            mine[0] = m;
            mine[1] = l;
        }
#pragma unroll
        for (int e = 0; e < NPL; ++e) {
            if (e_base + e < hd) mine[2 + e_base + e] = acc[e];
        }
        __syncthreads();
        if (ws == 0) {
            float mx = -INFINITY;
            for (int w = 0; w < p.W; ++w) mx = fmaxf(mx, st[(qi + w * p.Q) * (hd + 2)]);
            float L = 0.0f;
#pragma unroll
            for (int e = 0; e < NPL; ++e) acc[e] = 0.0f;
            if (mx != -INFINITY) {
                for (int w = 0; w < p.W; ++w) {
                    const float * o = st + (qi + w * p.Q) * (hd + 2);
                    if (o[0] == -INFINITY) continue;
                    const float f = expf(o[0] - mx);
                    L += o[1] * f;
#pragma unroll
                    for (int e = 0; e < NPL; ++e) {
                        if (e_base + e < hd) acc[e] += o[2 + e_base + e] * f;
                    }
                }
            }
            m = mx;
            l = L;
        } else {
            holder = false;
        }
    }
    if (p.S == 1) {
        if (!holder) return;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        float * o = p.out + tok * p.ldo + h * hd;
#pragma unroll
        for (int e = 0; e < NPL; ++e) {
            if (e_base + e < hd) o[e_base + e] = acc[e] * inv;
        }
        return;
    }

    // S > 1 (and Q = 1): leave this split's partial result; the block that
    // finishes last for this (token, head) merges all of them, so no second
    // launch is needed (the counter is reset for the next launch or replay).
    const size_t th = size_t(tok0) * p.n_head + h;
    float * part = p.part + th * p.S * (hd + 2);
    if (holder) {
        float * o = part + s * (hd + 2);
        if (lane == 0) {
            o[0] = m;
            o[1] = l;
        }
#pragma unroll
        for (int e = 0; e < NPL; ++e) {
            if (e_base + e < hd) o[2 + e_base + e] = acc[e];
        }
    }
    if (!last_split_block(p.done + th, p.S)) return;
    // Warp 0 reads every split's (max, sum) at once (S <= 64: two a lane)
    // and leaves each split's weight in shared memory; then all threads sum
    // the accumulators, their loads independent of each other. The partials
    // were written by other blocks, so they are read from L2.
    float * weight = st; // S floats; st holds at least 4 * (hd + 2)
    __shared__ float inv_sum;
    if (warp == 0) {
        const float L = split_weights<false>(part, p.S, hd + 2, weight);
        if (lane == 0) inv_sum = L > 0.0f ? 1.0f / L : 0.0f;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float a = 0.0f;
        for (int i = 0; i < p.S; ++i) {
            const float f = weight[i];
            if (f != 0.0f) a += SMOL_LOAD_L2(part + i * (hd + 2) + 2 + e) * f;
        }
        p.out[tok0 * p.ldo + h * hd + e] = a * inv_sum;
    }
}

// Block (token, query head): the head's output turned back from V's turn
// over a quantized cache (its runs of len), in place.
__global__ void rotate_heads_kernel(float * out, size_t ldo, int h0, int hd, int len) {
    extern __shared__ float x[];
    float * o = out + size_t(blockIdx.x) * ldo + size_t(h0 + int(blockIdx.y)) * hd;
    for (int e = threadIdx.x; e < hd; e += blockDim.x) x[e] = o[e];
    __syncthreads();
    block_rotate(x, hd, len);
    for (int e = threadIdx.x; e < hd; e += blockDim.x) o[e] = x[e];
}

} // namespace

#if defined(SMOL_FLASH_ATTENTION)

namespace {

// --- attention: decode --------------------------------------------------------

// Block (token, kv head x part of its query heads, split). The split's cells
// go to the block's eight warps in tiles of 32, round robin; each warp keeps
// its own online softmax over its tiles and the block merges them at the end.
// A warp copies (cp.async) each tile's K and V rows and its cells' positions
// and sequences as one group, dec_stages - 1 tiles ahead: which cells the
// token sees is read once a tile has landed, so no copy waits on memory and
// a short history costs one trip to it. The scores and the weighted sum of V
// are tensor-core products, as in the flash kernel, taken transposed: the
// block's query heads are columns of an 8-column fragment (the query
// rounded to f16, as on the CPU) and the weights go to the second product
// as f16, so the kernel is held to the flash kernel's bound against the CPU.
// With S splits the last block of a (token, kv head) merges the partials.
// Over a cache of several sequences (pages) the block walks the pages its
// token's sequence holds, listed with the batch, split as the cells of a
// cache of that sequence alone would be, in windows of dec_list tiles:
// another sequence's page costs nothing. When a batch's (token,
// kv head) pairs are more blocks than the GPU holds at once, each warp of a
// block serves a kv head of its own over the whole list (warp_pages, one
// split): the token's list is made once for eight kv heads, and a short
// history is one pass of a warp, not one block of mostly idle warps.
enum class dec_form : uint8_t { dense, pages, warp_pages };

template <int HD, int GB, dec_form F>
__global__ void __launch_bounds__(dec_warps * warp_size)
    decode_attention_kernel(const attn_params p) {
    static_assert(HD % warp_size == 0 && HD >= 64, "whole lanes, at least eight pieces a row");
    static_assert(GB <= 8 && dec_cells == 32,
                  "query heads in rows 0-7 of a fragment, a cell a lane");
    constexpr bool Pages = F != dec_form::dense, WU = F == dec_form::warp_pages;
    constexpr int pieces = HD / 8;
    constexpr int rows_at_once = warp_size / pieces; // cells a warp's copy instruction covers
    extern __shared__ __align__(16) uint16_t dec_sm[];
    __shared__ __align__(16) uint32_t qs[WU ? dec_warps : 1][GB][HD / 2]; // f16 pairs
    __shared__ float st[dec_warps][GB][HD + 2];

    // The count of cells in use was copied in before the step's first kernel
    // began, so the splits a short history leaves without cells may leave
    // before the wait: their slots go to the kernels that follow.
    const int n_used = *p.n_used;
    const int tok = blockIdx.x;
    const int my_pos = p.pos[tok], my_seq = p.seq[tok];
    // The cells walked: the cache's first n_used, or over pages the pages
    // of the token's sequence one after another (listed with the batch):
    // cell v of the walk is cell v % kv_page of page my_pages[v / kv_page].
    const int32_t * my_pages = nullptr;
    int n_walk = n_used;
    if constexpr (Pages) {
        const int l0 = p.seq_pages[my_seq], l1 = p.seq_pages[my_seq + 1];
        my_pages = p.seq_pages + (kv_max_seqs + 1) + l0;
        n_walk = (l1 - l0) * cell_tile_cells;
    }
    // Whole warp tiles a split, the cells shared as evenly as that allows.
    const int chunk = p.S == 1 ? n_walk
                               : max(dec_split_cells, ((n_walk + p.S - 1) / p.S + dec_cells - 1) /
                                                          dec_cells * dec_cells);
    const int n_split = p.S == 1 ? 1 : max(1, (n_walk + chunk - 1) / chunk);
    if (int(blockIdx.z) >= n_split) return;
    const int warp = threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    const int n_sub = decode_subs(p.group);
    // The (kv head, part of its query heads) the block serves, or with
    // warp_pages this warp; a warp past the last has no tiles.
    const int n_units = p.n_kv * n_sub, mine = WU ? int(blockIdx.y) * dec_warps + warp : 0;
    const bool active = !WU || mine < n_units;
    const int unit = WU ? min(mine, n_units - 1) : int(blockIdx.y);
    const int hk = unit / n_sub, sub = unit % n_sub;
    const int h_first = (p.h0 + hk) * p.group + sub * GB;
    const int n_here = min(GB, p.group - sub * GB);
    const uint16_t * K = p.K + hk * p.head_stride;
    const uint16_t * V = p.V + hk * p.head_stride;
    // A row's 16-byte pieces sit at piece ^ (row % 8), so that the eight rows
    // of a matrix ldmatrix reads meet no bank conflict.
    constexpr int NS = dec_stages;
    uint16_t * ks = dec_sm + warp * NS * 2 * dec_cells * HD; // [NS][dec_cells][HD], swizzled
    uint16_t * vs = ks + NS * dec_cells * HD;                // [NS][dec_cells][HD], swizzled
    // Where piece `piece` of row r of buffer b lies in ks or vs.
    auto piece_at = [](int b, int r, int piece) {
        return (b * dec_cells + r) * HD + (piece ^ (r % 8)) * 8;
    };
    // The tiles' cells, after every warp's K and V: [NS][dec_cells]
    // positions of each warp, then the same of sequences.
    int32_t * cpos = reinterpret_cast<int32_t *>(dec_sm + dec_warps * NS * 2 * dec_cells * HD);
    uint64_t * cseq = reinterpret_cast<uint64_t *>(cpos + dec_warps * NS * dec_cells);
    cpos += warp * NS * dec_cells;
    cseq += warp * NS * dec_cells;

    // The split's part of the walk, [c_begin, c_end), in windows [w0, w1).
    const int c_begin = int(blockIdx.z) * chunk, c_end = min(n_walk, c_begin + chunk);
    const uint64_t * my_words = seq_words(p, my_seq);
    // The cells of the cache that exist for this walk: rows at or past edge
    // are copied as zeros, of no sequence. Over pages that is n_used (a
    // sequence's last page may end past it; only the walk's last tile can
    // begin past it, so the loops below, which stop at the first tile at or
    // past edge, miss nothing).
    const int edge = Pages ? n_used : c_end;
    // The first cells of a window's tiles: every tile's, or over pages the
    // listed ones; past the last, edge (nothing to copy, no cell seen).
    __shared__ int listed[Pages ? dec_list : 1];
    int w0 = c_begin, w1 = Pages ? min(c_end, c_begin + dec_list * dec_cells) : c_end, n_wt = 0;
    auto tile_at = [&](int i) { return i >= n_wt ? edge : Pages ? listed[i] : w0 + i * dec_cells; };
    // Lists the window's tiles: where each of its warp tiles lies in the
    // cache.
    auto list_tiles = [&]() {
        n_wt = (w1 - w0) / dec_cells;
        for (int j = int(threadIdx.x); j < n_wt; j += int(blockDim.x)) {
            const int v = w0 + j * dec_cells;
            listed[j] = my_pages[v / cell_tile_cells] * cell_tile_cells + v % cell_tile_cells;
        }
        __syncthreads();
    };
    if constexpr (!Pages) n_wt = (c_end - c_begin + dec_cells - 1) / dec_cells;
    // The warp's tiles: first, first + stride, ... of the window's.
    constexpr int stride = WU ? 1 : dec_warps;
    const int first = WU ? (active ? 0 : dec_list) : warp;
    // Copies of the tile at c into buffer b, as one group: piece lane %
    // pieces of its rows, rows_at_once rows an instruction, and its cells'
    // positions and sequences. What lies past the window's end becomes
    // zeros (a cell of no sequence, rows no stale NaN can come from), read
    // from nowhere. Nothing here waits for memory, so a warp keeps NS - 1
    // tiles in flight.
    auto issue = [&](int c, int b) {
        const int from = (lane / pieces) * HD + (lane % pieces) * 8;
        const uint16_t * kg = K + size_t(c) * HD + from;
        const uint16_t * vg = V + size_t(c) * HD + from;
        // A whole tile (all but a window's last) tests no row, so its
        // copies' addresses are two registers and offsets.
        auto rows = [&](auto whole) {
#pragma unroll
            for (int i = 0; i < dec_cells / rows_at_once; ++i) {
                const int r = i * rows_at_once + lane / pieces;
                const bool on = decltype(whole)::value || c + r < edge;
                const int at = piece_at(b, r, lane % pieces);
                cp_async16(ks + at, on ? kg + i * rows_at_once * HD : K, on ? 16 : 0);
                cp_async16(vs + at, on ? vg + i * rows_at_once * HD : V, on ? 16 : 0);
            }
        };
        if (c + dec_cells <= edge) {
            rows(std::true_type{});
        } else {
            rows(std::false_type{});
        }
        // Lanes 0-7 copy four positions each, lanes 8-23 the words of two
        // cells that hold the token's sequence's bit.
        if (lane < 24) {
            const bool pos_part = lane < 8;
            const int size = pos_part ? 4 : 8, per = 16 / size;
            const int c0 = c + (pos_part ? lane : lane - 8) * per;
            const int bytes = max(0, min(per, edge - c0)) * size;
            void * dst = pos_part ? static_cast<void *>(cpos + b * dec_cells + c0 - c)
                                  : static_cast<void *>(cseq + b * dec_cells + c0 - c);
            const void * from = bytes == 0 ? static_cast<const void *>(K)
                                : pos_part ? static_cast<const void *>(p.cell_pos + c0)
                                           : static_cast<const void *>(my_words + c0);
            cp_async16(dst, from, bytes);
        }
        cp_async_commit();
    };
    // A warp's first NS - 1 tiles, as soon as the window is known (a short
    // history costs one trip to memory).
    auto start = [&]() {
#pragma unroll
        for (int s = 0; s < NS - 1; ++s) issue(tile_at(first + s * stride), s);
    };
    // The positions, sequences and page lists were staged before the
    // step began too: the list is made while the kernel before ends. Over
    // one sequence the first tiles are on their way by then: every cell but
    // those of this step's tokens was written by an earlier step, and those
    // are read again once the kernel that stored them has ended (refetch).
    if constexpr (Pages) list_tiles();
    if constexpr (!Pages) start();
    // The cells of the step's first warp_size tokens, staged before the step
    // began like the count: the refetch below needs them once the wait returns.
    const int first_cell = lane < p.n_tok ? p.cell[lane] : -1;
    griddep_launch(); // before the wait (see griddep_wait)
    griddep_wait();
    // Rows of tile `base` in buffer b that this step's tokens wrote, read
    // again (a 16-byte piece a lane, K's then V's), in place of what the
    // copy issued before the wait may have found.
    auto refetch = [&](int base, int b) {
        static_assert(2 * pieces <= warp_size, "a lane a piece of a K or V row");
        for (int t0 = 0; t0 < p.n_tok; t0 += warp_size) {
            const int c = t0 == 0 ? first_cell : t0 + lane < p.n_tok ? p.cell[t0 + lane] : -1;
            for (uint32_t hit =
                     __ballot_sync(0xffffffffu, c >= base && c < min(base + dec_cells, edge));
                 hit; hit &= hit - 1) {
                const int cc = __shfl_sync(0xffffffffu, c, __ffs(hit) - 1), r = cc - base;
                if (lane < 2 * pieces) {
                    const int pc = lane % pieces;
                    const uint16_t * src = (lane < pieces ? K : V) + size_t(cc) * HD + pc * 8;
                    uint16_t * dst = (lane < pieces ? ks : vs) + piece_at(b, r, pc);
                    *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
                }
            }
        }
        __syncwarp();
    };

    uint32_t(*q)[HD / 2] = qs[WU ? warp : 0];
    for (int e = WU ? lane : int(threadIdx.x); e < GB * (HD / 2);
         e += WU ? warp_size : int(blockDim.x)) {
        const int g = e / (HD / 2), j = e % (HD / 2);
        float x0 = 0.0f, x1 = 0.0f;
        if (g < n_here) load_query_pair(p, tok, h_first + g, HD, j, x0, x1);
        // The query meets the f16 cache as f16, as on the CPU.
        q[g][j] = pack_f16x2(x0, x1);
    }
    __syncthreads();
    // The products are taken transposed, cells and dimensions as the 16
    // rows of a fragment and the block's query heads as its 8 columns, so
    // no product spends half its rows on nothing: S^T = K Q^T, then
    // O^T = V^T P^T. Lane l holds columns 2 (l % 4) and 2 (l % 4) + 1 (query
    // heads qc, qc + 1) of rows l / 4 and l / 4 + 8; Q^T's B fragments are
    // query head l / 4's pairs (zero past the block's heads).
    const int qg = lane / 4, qt = lane % 4, qc = 2 * qt;
    uint32_t qb[HD / 16][2];
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
        qb[kk][0] = qg < GB ? q[qg][8 * kk + qt] : 0u;
        qb[kk][1] = qg < GB ? q[qg][8 * kk + 4 + qt] : 0u;
    }

    // Scores in log2 units, so exp2 serves as the exponential.
    const float scale = p.scale * log2_e;
    constexpr int n_dt = HD / 16;
    // Query heads qc and qc + 1: running maxima, this lane's parts of the sums.
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float o[n_dt][4]; // O^T: dimensions 16n + qg (+ 8) of query heads qc, qc + 1
#pragma unroll
    for (int n = 0; n < n_dt; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    for (;;) {
        if constexpr (Pages) start();
        for (int k = 0, ti = first, base = tile_at(ti); base < edge; ++k) {
            const int b = k % NS;
            // The tile NS - 1 ahead (past the last: an empty group), then this one.
            issue(tile_at(ti + (NS - 1) * stride), (k + NS - 1) % NS);
            cp_async_wait<NS - 1>();
            __syncwarp();
            if constexpr (!Pages) {
                if (k < NS - 1) refetch(base, b); // issued before the wait
            }
            const uint32_t seen = __ballot_sync(
                0xffffffffu, kv_cell_visible(cpos[b * dec_cells + lane],
                                             cseq + b * dec_cells + lane, my_seq, my_pos));
            const uint16_t * kt = ks + b * dec_cells * HD;
            const uint16_t * vt = vs + b * dec_cells * HD;
            if (const uint32_t unseen = __ballot_sync(0xffffffffu, base + lane < edge) & ~seen) {
                // Rows the token does not see that were copied: zero V rows,
                // since 0 times a NaN is NaN.
#pragma unroll
                for (int i = 0; i < dec_cells / rows_at_once; ++i) {
                    const int r = i * rows_at_once + lane / pieces;
                    if ((unseen >> r) & 1u) {
                        *reinterpret_cast<uint4 *>(vs + (b * dec_cells + r) * HD +
                                                   (lane % pieces) * 8) = make_uint4(0, 0, 0, 0);
                    }
                }
                __syncwarp();
            }
            if (seen) {
                // S^T = K Q^T: A fragments of K for 16 cells (matrices of
                // cells 0-7 and 8-15 at columns 16kk, then the same at 16kk + 8).
                float s[dec_cells / 16][4];
#pragma unroll
                for (int j = 0; j < dec_cells / 16; ++j)
                    s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
                    for (int j = 0; j < dec_cells / 16; ++j) {
                        const int r = 16 * j + 8 * (lane / 8 % 2) + lane % 8;
                        const int piece = 2 * kk + lane / 16;
                        uint32_t af[4];
                        ldmatrix_x4(af, kt + r * HD + (piece ^ (lane % 8)) * 8);
                        mma_f16_16816(s[j], af, qb[kk][0], qb[kk][1]);
                    }
                }
                // Lane l has cells 16j + l / 4 (+ 8) of query heads qc, qc + 1;
                // a cell the token does not see scores -inf and weighs zero.
                float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
                for (int j = 0; j < dec_cells / 16; ++j) {
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        if (!((seen >> (16 * j + qg + 8 * (i / 2))) & 1u)) s[j][i] = -INFINITY;
                        mx[i % 2] = fmaxf(mx[i % 2], s[j][i]);
                    }
                }
                float corr[2], mn[2];
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    mx[i] = fmaxf(mx[i], SMOL_SHFL_XOR(mx[i], 4));
                    mx[i] = fmaxf(mx[i], SMOL_SHFL_XOR(mx[i], 8));
                    mx[i] = fmaxf(mx[i], SMOL_SHFL_XOR(mx[i], 16));
                    // Finite: the token sees a cell (the scale is positive,
                    // so the same scores are largest).
                    mn[i] = fmaxf(m[i], mx[i] * scale);
                    corr[i] = m[i] == -INFINITY ? 0.0f : fast_exp2(m[i] - mn[i]);
                    m[i] = mn[i];
                    l[i] *= corr[i];
                }
#pragma unroll
                for (int n = 0; n < n_dt; ++n) {
                    o[n][0] *= corr[0];
                    o[n][1] *= corr[1];
                    o[n][2] *= corr[0];
                    o[n][3] *= corr[1];
                }
                // P^T as f16 8x8 matrices (cells by query heads), turned into
                // P's: the B fragments of O^T = V^T P^T for cells 16j..16j+15.
                uint32_t pb[dec_cells / 16][2];
#pragma unroll
                for (int j = 0; j < dec_cells / 16; ++j) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const float p0 = fast_exp2(fmaf(s[j][2 * h], scale, -mn[0]));
                        const float p1 = fast_exp2(fmaf(s[j][2 * h + 1], scale, -mn[1]));
                        l[0] += p0;
                        l[1] += p1;
                        pb[j][h] = movmatrix_trans(pack_f16x2(p0, p1));
                    }
                }
                // O^T += V^T P^T: A fragments of V^T for 16 dimensions by 16
                // cells (V's matrices transposed: cells 0-7 at dimensions
                // 16n, then 16n + 8, then cells 8-15 at both).
                const int mi = lane / 8, mr = lane % 8;
#pragma unroll
                for (int kk = 0; kk < dec_cells / 16; ++kk) {
#pragma unroll
                    for (int n = 0; n < n_dt; ++n) {
                        const int r = 16 * kk + 8 * (mi >> 1) + mr, piece = 2 * n + (mi & 1);
                        uint32_t af[4];
                        ldmatrix_x4<true>(af, vt + r * HD + (piece ^ mr) * 8);
                        mma_f16_16816(o[n], af, pb[kk][0], pb[kk][1]);
                    }
                }
            }
            __syncwarp(); // the buffer is read before a later tile fills it
            ti += stride;
            base = tile_at(ti);
        }
        if (w1 >= c_end) break;
        // The next window of a long split: every warp is done with the list.
        cp_async_wait<0>();
        __syncthreads();
        w0 = w1;
        w1 = min(c_end, w0 + dec_list * dec_cells);
        list_tiles();
        __syncthreads();
    }
    cp_async_wait<0>();
    // A query head's sum: the eight lanes of a column hold its cells between them.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += SMOL_SHFL_XOR(l[i], 4);
        l[i] += SMOL_SHFL_XOR(l[i], 8);
        l[i] += SMOL_SHFL_XOR(l[i], 16);
    }

    if constexpr (WU) {
        // A warp's state is its kv head's whole answer (one split).
        if (!active) return;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            if (qc + i >= n_here) continue;
            float * out = p.out + size_t(tok) * p.ldo + (h_first + qc + i) * HD + qg;
            const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
            for (int n = 0; n < n_dt; ++n) {
                out[16 * n] = o[n][i] * inv;
                out[16 * n + 8] = o[n][2 + i] * inv;
            }
        }
    } else {
        // The warps' states, then the block's: max, sum and the weighted sum of
        // V for each query head.
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            if (qc + i >= GB) continue;
            float * sw = st[warp][qc + i];
            if (qg == 0) {
                sw[0] = m[i];
                sw[1] = l[i];
            }
#pragma unroll
            for (int n = 0; n < n_dt; ++n) {
                sw[2 + 16 * n + qg] = o[n][i];
                sw[2 + 16 * n + qg + 8] = o[n][2 + i];
            }
        }
        __syncthreads();
        // This block's partials: [block][GB][S] of (max, sum, acc[HD]).
        float * part_of_block =
            p.part + (size_t(blockIdx.x) * gridDim.y + blockIdx.y) * GB * p.S * (HD + 2);
        for (int i = threadIdx.x; i < GB * HD; i += blockDim.x) {
            const int g = i / HD, e = i % HD;
            if (g >= n_here) continue;
            float mx = -INFINITY;
#pragma unroll
            for (int w = 0; w < dec_warps; ++w) mx = fmaxf(mx, st[w][g][0]);
            float L = 0.0f, a = 0.0f;
            if (mx != -INFINITY) {
#pragma unroll
                for (int w = 0; w < dec_warps; ++w) {
                    const float f = st[w][g][0] == -INFINITY ? 0.0f : exp2f(st[w][g][0] - mx);
                    L += st[w][g][1] * f;
                    a += st[w][g][2 + e] * f;
                }
            }
            const int h = h_first + g;
            if (n_split == 1) {
                p.out[size_t(tok) * p.ldo + h * HD + e] = L > 0.0f ? a / L : 0.0f;
            } else {
                float * part = part_of_block + (size_t(g) * p.S + blockIdx.z) * (HD + 2);
                if (e == 0) {
                    part[0] = mx;
                    part[1] = L;
                }
                part[2 + e] = a;
            }
        }
        if (n_split == 1) return;

        // The block that finishes last for this (token, kv head, part) merges
        // the splits.
        if (!last_split_block(p.done + blockIdx.x * gridDim.y + blockIdx.y, n_split)) return;
        // The block's partials, [GB][S] of (max, sum, acc[HD]), into the
        // tiles' shared memory (free now) in 16-byte copies that wait on
        // nothing: one trip to L2, where loads of eight splits at a time made
        // several. The merge runs while every other SM of the launch waits.
        const size_t at = size_t(part_of_block - p.part), a0 = at & ~size_t(3);
        const size_t n_pieces = (at + size_t(n_here) * p.S * (HD + 2) - a0 + 3) / 4;
        float * ps = reinterpret_cast<float *>(dec_sm);
        static_assert(dec_max_heads * dec_max_splits * (HD + 2) * sizeof(float) + 16 <=
                          dec_smem<HD>(),
                      "the partials fit where the tiles were");
        for (size_t k = threadIdx.x; k < n_pieces; k += blockDim.x)
            cp_async16(ps + 4 * k, p.part + a0 + 4 * k);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        const float * pb = ps + (at - a0);
        __shared__ float weight[GB][dec_max_splits];
        __shared__ float inv_sum[GB];
        for (int g = warp; g < n_here; g += dec_warps) {
            const float L = split_weights<true, dec_max_splits / warp_size, true>(
                pb + size_t(g) * p.S * (HD + 2), n_split, HD + 2, weight[g]);
            if (lane == 0) inv_sum[g] = L > 0.0f ? 1.0f / L : 0.0f;
        }
        __syncthreads();
        // Each output's splits are summed by `ways` threads (every ways-th
        // split each, in the splits' order), whose sums then meet in shared
        // memory.
        const int n_out = n_here * HD, ways = max(1, int(blockDim.x) / n_out);
        float * red = &st[0][0][0]; // ways * n_out <= blockDim.x floats when ways > 1
        for (int it = threadIdx.x; it < ways * n_out; it += blockDim.x) {
            const int way = it / n_out, o = it % n_out, g = o / HD;
            const float * pr = pb + size_t(g) * p.S * (HD + 2) + 2 + o % HD;
            float a = 0.0f;
            for (int i = way; i < n_split; i += ways) {
                const float f = weight[g][i], x = pr[i * (HD + 2)];
                a = f != 0.0f ? a + x * f : a;
            }
            if (ways == 1) {
                p.out[size_t(tok) * p.ldo + h_first * HD + o] = a * inv_sum[g];
            } else {
                red[it] = a;
            }
        }
        if (ways > 1) {
            __syncthreads();
            for (int o = threadIdx.x; o < n_out; o += blockDim.x) {
                float a = 0.0f;
                for (int w = 0; w < ways; ++w) a += red[w * n_out + o];
                p.out[size_t(tok) * p.ldo + h_first * HD + o] = a * inv_sum[o / HD];
            }
        }
    }
}

// Calls f(std::integral_constant<int, GB>) for the decode kernel's GB of 1
// to dec_max_heads query heads a block.
template <typename F> void with_dec_heads(int gb, F && f) {
    switch (gb) {
    case 1:
        return f(std::integral_constant<int, 1>{});
    case 2:
        return f(std::integral_constant<int, 2>{});
    case 3:
        return f(std::integral_constant<int, 3>{});
    default:
        return f(std::integral_constant<int, 4>{});
    }
}

} // namespace

int decode_block_slots(int n_sm) {
    // The fewest block slots any of its dense forms has (they split long
    // histories of one sequence to fill the GPU once; the forms that walk
    // pages serve batches of many sequences).
    int slots = INT_MAX;
    for (int gb = 1; gb <= dec_max_heads; ++gb) {
        with_dec_heads(gb, [&](auto g) {
            constexpr int GB = decltype(g)::value;
            for (const auto kernel : {decode_attention_kernel<64, GB, dec_form::dense>,
                                      decode_attention_kernel<64, GB, dec_form::pages>,
                                      decode_attention_kernel<64, GB, dec_form::warp_pages>}) {
                SMOL_GPU_CHECK(cudaFuncSetAttribute(
                    kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dec_smem<64>())));
            }
            int per_sm = 0;
            SMOL_GPU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                &per_sm, decode_attention_kernel<64, GB, dec_form::dense>, dec_warps * warp_size,
                dec_smem<64>()));
            slots = std::min(slots, std::max(1, per_sm) * n_sm);
        });
    }
    return slots;
}

#endif // SMOL_FLASH_ATTENTION

// The split of one attention node: queries per block Q, cell streams per
// query W, and S splits over the cells (S > 1 only when the heads and
// tokens alone do not fill the GPU).
size_t cuda_backend::attn_splits(const tensor * t, int & Q, int & W) const {
    // The node's own query heads: a head group's launch must fill the GPU
    // by itself (groups run one after another). Resident and streamed groups
    // of one plan share G, so they split alike and sum in the same order.
    const int64_t group = t->iparams[1] / t->iparams[2];
    const int64_t n_q = t->kv.k ? int64_t(t->kv.h1 - t->kv.h0) * group : t->iparams[1];
    const int64_t n_tok = t->ne[1], queries = n_tok * n_q;
    // Few queries: a block each, its four warps splitting the cells. Many:
    // four queries a block, sharing the cells' loads through L1.
    Q = queries < 4 * n_sm_ ? 1 : 4;
    W = Q == 1 ? 4 : 1;
    if (Q > 1 || queries >= n_sm_) return 1;
    return size_t(std::min<int64_t>(64, (2 * n_sm_ + queries - 1) / queries));
}

// The flash kernel's splits over the cells for an attention node, or 0 where
// the classic kernel runs it. It splits only while the query tiles and heads
// alone leave SMs short of work: a prompt chunk after a long history, a
// small model.
int cuda_backend::flash_splits(const tensor * t) const {
#if defined(SMOL_FLASH_ATTENTION)
    const int n_tok = int(t->ne[1]), n_head = t->iparams[1], hd = t->iparams[3];
    const bool flash =
        hd == 64 && t->iparams[4] <= 0 &&
        (attn_ == attn_kernel::flash || (attn_ == attn_kernel::automatic && n_tok >= fa_min_tok));
    if (!flash) return 0;
    // Four blocks an SM keep enough loads in flight for a decode-sized batch
    // at long contexts.
    // A head group's node covers only its own query heads.
    const int n_q = t->kv.k ? (t->kv.h1 - t->kv.h0) * (n_head / t->iparams[2]) : n_head;
    const int blocks = (n_tok + fa_rows - 1) / fa_rows * n_q;
    int fs = std::min(64, std::max(1, (4 * n_sm_ + blocks - 1) / blocks));
    // A prompt's partials stay within n_tok x the layer's heads, the work
    // space the planner reserved before it chose the head groups.
    if (n_tok >= fa_rows) fs = std::min(fs, std::max(1, n_head / n_q));
    return fs;
#else
    (void)t;
    return 0;
#endif
}

// The decode kernel's splits over the cells for an attention node, or 0
// where another kernel runs it. Whether it runs is the whole layer's choice,
// so every head group of a plan takes the same kernel.
int cuda_backend::decode_splits(const tensor * t) const {
#if defined(SMOL_FLASH_ATTENTION)
    const int n_tok = int(t->ne[1]), n_head = t->iparams[1], n_head_kv = t->iparams[2];
    const int n_sub = decode_subs(n_head / n_head_kv);
    const int blocks = n_tok * n_head_kv * n_sub;
    // Each token's blocks read its cells alone, so the kernel pays for a
    // decode-sized batch while its blocks fit the GPU at once, and for any
    // batch whose tokens are of different sequences: each then reads only
    // its own sequence's pages, where the flash kernel's tile of queries
    // would read every page for one of them.
    const bool dec = t->iparams[3] == 64 && t->iparams[4] <= 0 &&
                     (attn_ == attn_kernel::decode || attn_ == attn_kernel::decode_warps ||
                      (attn_ == attn_kernel::automatic &&
                       ((n_tok <= dec_max_tok && blocks <= dec_slots_) || seqs_apart_)));
    if (!dec) return 0;
    // As many splits as fill the GPU's block slots once (a second, partial
    // wave of blocks would leave most SMs idle while it ran), counting the
    // node's own kv heads: a head group's launch must fill the GPU by itself.
    // Resident and streamed groups of one plan share G, so they split alike
    // and sum in the same order.
    return std::clamp(dec_slots_ / decode_blocks(t), 1, dec_max_splits);
#else
    (void)t;
    return 0;
#endif
}

// The decode kernel's blocks for an attention node's own kv heads, a block
// a (token, kv head, part of its query heads).
int cuda_backend::decode_blocks(const tensor * t) const {
    const int n_kv = t->kv.k ? t->kv.h1 - t->kv.h0 : t->iparams[2];
    return int(t->ne[1]) * n_kv * decode_subs(t->iparams[1] / t->iparams[2]);
}

// The kernel an attention node takes, with its launch shape: the decode
// kernel for decode-sized batches, tensor cores for the rest of head size
// 64 (SMOL_ATTN=classic takes neither), the classic kernel otherwise and
// for a sliding window. Over
// a cache of several sequences the decode kernel gives each warp a kv head
// where a block each would not fit the GPU at once (SMOL_ATTN=decode-warps:
// always); whether the cache holds several is known when a graph is staged.
cuda_backend::attn_choice cuda_backend::choose_attention(const tensor * t) const {
    attn_choice c;
    // The decode kernel reads f16 only: over a quantized cache the flash
    // kernel, which turns each tile to f16 as it lands, takes decode steps
    // too.
    if (!kv_quant_ && (c.S = decode_splits(t)) > 0) {
        c.kind = attn_kernel::decode;
        c.warps = attn_ == attn_kernel::decode_warps || decode_blocks(t) > dec_slots_;
    } else if ((c.S = flash_splits(t)) > 0) {
        c.kind = attn_kernel::flash;
    } else {
        c.S = int(attn_splits(t, c.Q, c.W));
    }
    return c;
}

void cuda_backend::run_attention(const step & s, const batch_info & b) {
    const tensor * t = s.t;
    const kv_cache & kv = *b.kv;
    const tensor * q = unrotated(s);
    attn_params p;
    const source qs = source_of(q);
    p.q = qs.p;
    p.ldq = qs.ld;
    p.q_lo = qs.lo;
    p.out = data_of<float>(t);
    p.ldo = t->nb[1] / 4;
    // The node covers the query heads of its view's kv heads, with K and V
    // from the view's bases (a resident slice or a staging slot).
    const kv_view view = node_kv_view(t, kv);
    p.K = view.k;
    p.V = view.v;
    p.head_stride = view.head_stride;
    p.h0 = view.h0;
    p.n_kv = view.h1 - view.h0;
    p.n_head = t->iparams[1];
    p.group = t->iparams[1] / t->iparams[2];
    p.hd = t->iparams[3];
    p.n_tok = int(t->ne[1]);
    p.scale = t->fparams[0] != 0 ? t->fparams[0] : 1.0f / std::sqrt(float(p.hd));
    p.window = t->iparams[4];
    p.sink = t->iparams[5];
    p.row_words = kv.row_words;
    p.rot_k = kv.rot_k;
    p.pos = d_pos_;
    p.seq = d_seq_;
    // A window store's view (sliding-window layers, the classic kernel)
    // walks its slots' table, not the cache's.
    const bool local = view.local && b.local;
    p.cell = local ? d_slot_ : d_cell_;
    p.cell_pos = local ? d_win_pos_ : d_cell_pos_;
    p.cell_seqs = local ? d_win_seqs_ : d_cell_seqs_;
    p.seq_plane = seq_plane_words(local ? b.local->kv->n_cells : kv.n_cells);
    p.tiles = local ? nullptr : d_cell_tiles_;
    p.seq_pages = local ? nullptr : d_seq_pages_;
    p.n_used = local ? d_params_ + 2 : d_params_;
    const attn_choice a = choose_attention(t);
    p.S = a.S;
    p.Q = a.Q;
    p.W = a.W;
    // The partials go past any kept q, k and v in the work space.
    p.part = reinterpret_cast<float *>(static_cast<uint8_t *>(work_.p) + kept_end_);
    p.done = static_cast<int *>(done_.p);
    p.rope = s.rope ? rope_for(s.rope) : rope_params{};
    const int n_q = (view.h1 - view.h0) * p.group;
    // Over a quantized cache the output comes in V's turn: turned back.
    auto turn_output = [&] {
        if (kv.type == SMOL_TYPE_F16 || kv.rot_v <= 0) return;
        rotate_heads_kernel<<<dim3(unsigned(p.n_tok), unsigned(n_q)), 64,
                              size_t(p.hd) * sizeof(float), stream_>>>(p.out, p.ldo, p.h0 * p.group,
                                                                       p.hd, kv.rot_v);
        check_launch("attention output turn");
    };
#if defined(SMOL_FLASH_ATTENTION)
    if (a.kind == attn_kernel::decode) {
        const int units = p.n_kv * decode_subs(p.group);
        const dec_form form = !pages_   ? dec_form::dense
                              : a.warps ? dec_form::warp_pages
                                        : dec_form::pages;
        if (form == dec_form::warp_pages) p.S = 1;
        const int ys = form == dec_form::warp_pages ? (units + dec_warps - 1) / dec_warps : units;
        const dim3 dgrid(unsigned(p.n_tok), unsigned(ys), unsigned(p.S));
        with_dec_heads(decode_heads(p.group), [&](auto g) {
            constexpr int gb = decltype(g)::value;
            launch_kernel_smem(
                form == dec_form::dense   ? decode_attention_kernel<64, gb, dec_form::dense>
                : form == dec_form::pages ? decode_attention_kernel<64, gb, dec_form::pages>
                                          : decode_attention_kernel<64, gb, dec_form::warp_pages>,
                dgrid, dim3(dec_warps * warp_size), dec_smem<64>(), stream_, pdl_now_, p);
        });
        check_launch("decode attention");
        return;
    }
    if (a.kind == attn_kernel::flash) {
        const dim3 fgrid(unsigned((p.n_tok + fa_rows - 1) / fa_rows), unsigned(n_q), unsigned(p.S));
        launch_flash_attention(fgrid, stream_, pdl_now_, p, kv.type);
        check_launch("flash attention");
        turn_output();
        return;
    }
#endif
    const dim3 grid(unsigned((p.n_tok + p.Q - 1) / p.Q), unsigned(n_q), unsigned(p.S));
    const int threads = p.Q * p.W * warp_size;
    // Room for the streams' states, and for the split weights of the merge.
    const size_t smem = size_t(p.Q * p.hd + std::max(p.Q * p.W * (p.hd + 2), 64)) * sizeof(float);
    const int npl = (p.hd + 31) / 32;
    if (kv.type != SMOL_TYPE_F16) {
        // Blocks of 32 along a row: hd is a multiple of 32 (kv_row_bytes).
        auto quant = [&](auto kt) {
            constexpr int KT = decltype(kt)::value;
            if (npl <= 2) {
                attention_kernel<2, KT><<<grid, threads, smem, stream_>>>(p);
            } else if (npl <= 4) {
                attention_kernel<4, KT><<<grid, threads, smem, stream_>>>(p);
            } else {
                attention_kernel<8, KT><<<grid, threads, smem, stream_>>>(p);
            }
        };
        if (kv.type == SMOL_TYPE_Q8_0) {
            quant(std::integral_constant<int, SMOL_TYPE_Q8_0>{});
        } else {
            quant(std::integral_constant<int, SMOL_TYPE_Q4_0>{});
        }
        check_launch("attention (quantized cache)");
        turn_output();
        return;
    }
    if (npl <= 1) {
        attention_kernel<1><<<grid, threads, smem, stream_>>>(p);
    } else if (npl <= 2) {
        attention_kernel<2><<<grid, threads, smem, stream_>>>(p);
    } else if (npl <= 4) {
        attention_kernel<4><<<grid, threads, smem, stream_>>>(p);
    } else if (npl <= 8) {
        attention_kernel<8><<<grid, threads, smem, stream_>>>(p);
    } else {
        throw error(SMOL_ERR_UNSUPPORTED, name_ + ": attention with head size " +
                                              std::to_string(p.hd) +
                                              " is not supported (at most 256)");
    }
    check_launch("attention");
}

} // namespace smol::gpu
