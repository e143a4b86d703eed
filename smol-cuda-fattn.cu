// smol-cuda-fattn.cu - the GPU backend's flash attention for prefill (and
// any batch that does not take the decode kernel): a block 64 queries of a
// head, tiles of 64 cells sorted by what the queries see, tensor-core
// products and an online softmax, over an f16 cache or a quantized one
// (q8_0, q4_0) whose tiles are turned to f16 as they land. NVIDIA only
// (mma.sync, ldmatrix).

#include "smol-cuda-attn.cuh"

#if defined(SMOL_FLASH_ATTENTION)

namespace smol::gpu {

namespace {

// --- attention: tensor-core prefill ---------------------------------------------

// Block (tile of 64 queries, head); warp w owns queries 16w..16w+15 of the
// tile. The block walks the cells [0, n_used) in tiles of 64 and sorts each
// tile by the block's bounds (the least position of its queries and the set
// of their sequences): a tile that every query sees whole is computed with no
// masks; one that no query can see is skipped (causal prefill skips about
// half, other sequences' cells are skipped too); the rest are masked per
// (query, cell). The tile's K and V come in with 16-byte loads, and each warp
// computes S = Q K^T with tensor cores, keeps an online softmax in f32, and
// adds P V with P rounded to f16. The query is rounded to f16 as on the CPU;
// unlike the CPU, P is rounded before it is normalised (see the test's
// bound). A masked score weighs exactly zero, so a tile gives the same bits
// masked or not when every query sees all of it.
//
// Over a quantized cache (KT q8_0 or q4_0, blocks of 32 along a row as
// ggml lays them out) the tile's rows come in as they are stored, in two
// buffers (16-byte copies where the rows' bases allow, else 4-byte ones),
// and each is turned to f16 in one more buffer before it is computed;
// the queries take K's Walsh-Hadamard turn first, as the classic kernel
// gives them, and the caller turns the output back from V's.
//
// Fragment layouts (m16n8k16, g = lane / 4, t = lane % 4): A holds rows g
// and g + 8, columns 2t, 2t + 1 (+ 8); B holds rows 2t, 2t + 1 (+ 8) of
// column g; C holds rows g and g + 8, columns 2t and 2t + 1.
template <int HD, int KT>
__global__ void __launch_bounds__(128, 4) flash_attention_kernel(const attn_params p) {
    static_assert(HD % 16 == 0, "head size a multiple of 16");
    constexpr bool quant = KT != SMOL_TYPE_F16;
    static_assert(!quant || HD == 64, "a quantized cache's queries turn by a warp a row");
    constexpr int LD = HD + 8; // f16 a row in shared memory: 16-byte rows, no bank conflicts
    constexpr int half = HD / 2, n_dt = HD / 8;
    constexpr int block_bytes = KT == SMOL_TYPE_Q8_0 ? 34 : 18; // a block of 32 stored
    constexpr int row_bytes = quant ? HD / 32 * block_bytes : 2 * HD;
    __shared__ __align__(16) uint16_t qs[fa_rows * LD];
    // K and V of a tile in two buffers: the next tile's copies are issued
    // before this one is computed, so they arrive while it is. A quantized
    // tile lands in raw (two buffers) and is turned into the one f16 buffer.
    constexpr int n_buf = quant ? 1 : 2;
    __shared__ __align__(16) uint16_t ks[n_buf][fa_cells * LD];
    __shared__ __align__(16) uint16_t vs[n_buf][fa_cells * LD];
    __shared__ __align__(16) uint8_t raw[2][2][quant ? fa_cells * row_bytes : 16]; // [buffer][K, V]
    __shared__ int c_pos[fa_cells], c_seen[fa_cells];
    __shared__ seq_mask c_seq[fa_cells];
    __shared__ int b_min_pos, b_max_pos;
    __shared__ unsigned long long b_seqs[2]; // the words of a seq_mask

    griddep_wait();
    griddep_launch();
    // With S splits, block z takes the z-th run of whole tiles of the cells,
    // a run of at least fa_split_cells: at short contexts fewer splits do
    // the work (one below that many cells), and the blocks past them leave.
    const int n_used = *p.n_used;
    const int chunk =
        p.S == 1
            ? n_used
            : max(fa_split_cells, ((n_used + p.S - 1) / p.S + fa_cells - 1) / fa_cells * fa_cells);
    const int n_split = p.S == 1 ? 1 : max(1, (n_used + chunk - 1) / chunk);
    if (int(blockIdx.z) >= n_split) return;
    const int warp = threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    const int g = lane / 4, t = lane % 4;
    // Block y serves query head h0 * group + y of the view's kv heads.
    const int h = p.h0 * p.group + int(blockIdx.y), hk = h / p.group - p.h0;
    // The last tokens of a causal prompt see the most cells: their tiles start first.
    const int tok0 = int(gridDim.x - 1 - blockIdx.x) * fa_rows;

    if (threadIdx.x == 0) {
        b_min_pos = INT_MAX;
        b_max_pos = -1;
        b_seqs[0] = b_seqs[1] = 0;
    }
    if constexpr (quant) {
        // Warp w turns its own 16 rows, lane l holding elements 2l and
        // 2l + 1: the query rounded to f16 as on the CPU, then K's turn in
        // f32 (each stage's sums as block_rotate makes them), then f16 for
        // the tensor cores.
        for (int r = 0; r < 16; ++r) {
            const int qi = warp * 16 + r;
            float x0, x1;
            load_query_pair(p, tok0 + qi, h, HD, lane, x0, x1);
            x0 = f16_to_f32(f32_to_f16(x0));
            x1 = f16_to_f32(f32_to_f16(x1));
            if (p.rot_k > 1) {
                const float a = x0;
                x0 = a + x1;
                x1 = a - x1;
                for (int hs = 2; hs < p.rot_k; hs *= 2) {
                    const float y0 = SMOL_SHFL_XOR(x0, hs / 2), y1 = SMOL_SHFL_XOR(x1, hs / 2);
                    const bool upper = ((2 * lane) & hs) != 0; // the pair's second element
                    x0 = upper ? y0 - x0 : x0 + y0;
                    x1 = upper ? y1 - x1 : x1 + y1;
                }
                const float norm = 1.0f / sqrtf(float(p.rot_k));
                x0 *= norm;
                x1 *= norm;
            }
            *reinterpret_cast<uint32_t *>(qs + qi * LD + 2 * lane) = pack_f16x2(x0, x1);
        }
    } else {
        for (int e = threadIdx.x; e < fa_rows * half; e += blockDim.x) {
            const int qi = e / half, j = e % half;
            float x0, x1;
            load_query_pair(p, tok0 + qi, h, HD, j, x0, x1);
            // The query meets the f16 cache as f16, as on the CPU.
            *reinterpret_cast<uint32_t *>(qs + qi * LD + 2 * j) = pack_f16x2(x0, x1);
        }
    }
    // This thread's two query rows; a row past the batch sees no cell.
    const int row0 = tok0 + warp * 16 + g, row1 = row0 + 8;
    const int pos0 = row0 < p.n_tok ? p.pos[row0] : -1, seq0 = row0 < p.n_tok ? p.seq[row0] : -1;
    const int pos1 = row1 < p.n_tok ? p.pos[row1] : -1, seq1 = row1 < p.n_tok ? p.seq[row1] : -1;
    // A warp whose rows are all past the batch only helps to load.
    const bool warp_rows = tok0 + warp * 16 < p.n_tok;
    __syncthreads();
    if (threadIdx.x < fa_rows && tok0 + int(threadIdx.x) < p.n_tok) {
        atomicMin(&b_min_pos, p.pos[tok0 + threadIdx.x]);
        atomicMax(&b_max_pos, p.pos[tok0 + threadIdx.x]);
        const int s = p.seq[tok0 + threadIdx.x];
        atomicOr(&b_seqs[s >> 6], 1ull << (s & 63));
    }

    uint32_t qa[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
        const uint16_t * q0 = qs + (warp * 16 + g) * LD + kk * 16 + 2 * t;
        qa[kk][0] = ld_u32(q0);
        qa[kk][1] = ld_u32(q0 + 8 * LD);
        qa[kk][2] = ld_u32(q0 + 8);
        qa[kk][3] = ld_u32(q0 + 8 * LD + 8);
    }
    __syncthreads();
    const int min_pos = b_min_pos, max_pos = b_max_pos;
    const seq_mask seqs{{b_seqs[0], b_seqs[1]}};

    // Scores in log2 units, so exp2 serves as the exponential.
    const float scale = p.scale * log2_e;
    float m0 = -INFINITY, m1 = -INFINITY; // running maxima of rows g and g + 8
    float l0 = 0.0f, l1 = 0.0f;           // this thread's part of their sums
    float o[n_dt][4];
#pragma unroll
    for (int n = 0; n < n_dt; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    // One tile of cells from shared memory; MASKED tiles keep the cells of
    // bit 4j + i (row g sees cell 8j + 2t + i) and bit 4j + 2 + i (row g + 8).
    auto tile = [&](auto masked_tag, uint32_t vis, const uint16_t * ks, const uint16_t * vs) {
        constexpr bool MASKED = decltype(masked_tag)::value;
        auto seen = [&](int bit) { return !MASKED || ((vis >> bit) & 1u) != 0; };
        float s[fa_cells / 8][4];
#pragma unroll
        for (int j = 0; j < fa_cells / 8; ++j) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        }
        // B fragments of K for two cell tiles at once: lanes 0-7 give cells
        // 16j2..+7 at columns 16kk, lanes 8-15 the same cells at 16kk + 8,
        // lanes 16-31 cells 16j2+8..+15 there. k-steps outermost, so the
        // eight accumulators of a step are independent of each other.
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
            for (int j2 = 0; j2 < fa_cells / 16; ++j2) {
                uint32_t b[4];
                ldmatrix_x4(b, ks + (16 * j2 + 8 * (lane / 16) + lane % 8) * LD + kk * 16 +
                                   8 * (lane / 8 % 2));
                mma_f16_16816(s[2 * j2], qa[kk], b[0], b[1]);
                mma_f16_16816(s[2 * j2 + 1], qa[kk], b[2], b[3]);
            }
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < fa_cells / 8; ++j) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                if (!seen(4 * j + i)) s[j][i] = -INFINITY;
            }
            mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
            mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
        }
        // The four lanes of a quad hold one row between them.
        mx0 = fmaxf(mx0, SMOL_SHFL_XOR(mx0, 1));
        mx0 = fmaxf(mx0, SMOL_SHFL_XOR(mx0, 2));
        mx1 = fmaxf(mx1, SMOL_SHFL_XOR(mx1, 1));
        mx1 = fmaxf(mx1, SMOL_SHFL_XOR(mx1, 2));
        // The maxima in log2 units (the scale is positive, so the same
        // scores are largest), and each weight exp2(s * scale - max) from
        // one fused multiply-add.
        const float mn0 = fmaxf(m0, mx0 * scale), mn1 = fmaxf(m1, mx1 * scale);
        // A row that saw nothing yet has nothing to rescale (and -inf - -inf
        // would be NaN).
        const float corr0 = m0 == -INFINITY ? 0.0f : fast_exp2(m0 - mn0);
        const float corr1 = m1 == -INFINITY ? 0.0f : fast_exp2(m1 - mn1);
        m0 = mn0;
        m1 = mn1;
        l0 *= corr0;
        l1 *= corr1;
#pragma unroll
        for (int n = 0; n < n_dt; ++n) {
            o[n][0] *= corr0;
            o[n][1] *= corr0;
            o[n][2] *= corr1;
            o[n][3] *= corr1;
        }
        // P as the A fragments of P V: cells 16kk..16kk+15 are the score
        // tiles 2kk and 2kk + 1. A masked score weighs exactly zero.
        uint32_t pa[fa_cells / 16][4];
#pragma unroll
        for (int j = 0; j < fa_cells / 8; ++j) {
            float pr[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                pr[i] =
                    seen(4 * j + i) ? fast_exp2(fmaf(s[j][i], scale, -(i < 2 ? mn0 : mn1))) : 0.0f;
            }
            l0 += pr[0] + pr[1];
            l1 += pr[2] + pr[3];
            pa[j / 2][(j % 2) * 2 + 0] = pack_f16x2(pr[0], pr[1]);
            pa[j / 2][(j % 2) * 2 + 1] = pack_f16x2(pr[2], pr[3]);
        }
        // B fragments of V for two column tiles at once: lanes 0-7 give rows
        // 16kk..+7 at columns 16n2, lanes 8-15 rows 16kk+8..+15 there, lanes
        // 16-31 the same rows at columns 16n2 + 8.
        const int mi = lane / 8, mr = lane % 8;
#pragma unroll
        for (int kk = 0; kk < fa_cells / 16; ++kk) {
#pragma unroll
            for (int n2 = 0; n2 < HD / 16; ++n2) {
                uint32_t b[4];
                ldmatrix_x4<true>(b, vs + (kk * 16 + mr + 8 * (mi & 1)) * LD + n2 * 16 +
                                         8 * (mi >> 1));
                mma_f16_16816(o[2 * n2], pa[kk], b[0], b[1]);
                mma_f16_16816(o[2 * n2 + 1], pa[kk], b[2], b[3]);
            }
        }
    };

    const int c_begin = int(blockIdx.z) * chunk, c_end = min(n_used, c_begin + chunk);
    const uint16_t * K = p.K + hk * p.head_stride;
    const uint16_t * V = p.V + hk * p.head_stride;
    // Each thread copies the same pieces of every tile, so its own waits
    // order its copies and its stores. A quantized tile's rows are one run
    // of bytes, copied in 16-byte pieces where K, V and the head stride
    // allow (4-byte ones otherwise: a row is a whole number of words).
    const bool wide =
        ((reinterpret_cast<uintptr_t>(K) | reinterpret_cast<uintptr_t>(V) | p.head_stride * 2) &
         15) == 0;
    auto issue = [&](int c, int b) {
        if constexpr (quant) {
            const int bytes = min(fa_cells, c_end - c) * row_bytes;
            const uint8_t * kg = reinterpret_cast<const uint8_t *>(K) + size_t(c) * row_bytes;
            const uint8_t * vg = reinterpret_cast<const uint8_t *>(V) + size_t(c) * row_bytes;
            const int piece = wide ? 16 : 4;
            for (int e = threadIdx.x * piece; e < bytes; e += blockDim.x * piece) {
                if (wide) {
                    cp_async16(raw[b][0] + e, kg + e, min(16, bytes - e));
                    cp_async16(raw[b][1] + e, vg + e, min(16, bytes - e));
                } else {
                    cp_async4(raw[b][0] + e, kg + e);
                    cp_async4(raw[b][1] + e, vg + e);
                }
            }
        } else {
            for (int e = threadIdx.x; e < fa_cells * (HD / 8); e += blockDim.x) {
                const int r = e / (HD / 8), ch = e % (HD / 8);
                if (c + r >= c_end) continue;
                const size_t at = size_t(c + r) * HD + ch * 8;
                cp_async16(ks[b] + r * LD + ch * 8, K + at);
                cp_async16(vs[b] + r * LD + ch * 8, V + at);
            }
        }
        cp_async_commit();
    };
    // A quantized tile from raw buffer b into the f16 one: a thread a
    // block of 32 at a time, each element its block's scale times its
    // integer, as the CPU takes it, rounded to f16. Rows past the cells in
    // use turn into whatever their bytes hold; no query sees them, and a
    // masked tile zeroes them below.
    auto turn = [&](int b) {
        constexpr int n_blk = HD / 32;
        for (int u = threadIdx.x; u < 2 * fa_cells * n_blk; u += blockDim.x) {
            const int which = u / (fa_cells * n_blk), r = u / n_blk % fa_cells, j = u % n_blk;
            const uint8_t * blk = raw[b][which] + r * row_bytes + j * block_bytes;
            uint16_t * dst = (which ? vs[0] : ks[0]) + r * LD + 32 * j;
            const float d = f16_to_f32(*reinterpret_cast<const uint16_t *>(blk));
#pragma unroll
            for (int i = 0; i < 32; i += 8) {
                float x[8];
#pragma unroll
                for (int m = 0; m < 8; ++m) {
                    const int e = i + m;
                    int v;
                    if constexpr (KT == SMOL_TYPE_Q8_0) {
                        v = int8_t(blk[2 + e]);
                    } else {
                        const uint8_t by = blk[2 + e % 16];
                        v = (e < 16 ? by & 0xF : by >> 4) - 8;
                    }
                    x[m] = d * float(v);
                }
                *reinterpret_cast<uint4 *>(dst + i) =
                    make_uint4(pack_f16x2(x[0], x[1]), pack_f16x2(x[2], x[3]),
                               pack_f16x2(x[4], x[5]), pack_f16x2(x[6], x[7]));
            }
        }
        __syncthreads();
    };
    // The cells go by windows of up to 128 tiles: a thread a tile sorts them
    // from the table's tile summaries, then the block walks the tiles that
    // some query may see, the next one's copies in flight while it computes
    // one, with a single barrier for a tile every query sees whole.
    static_assert(fa_cells == cell_tile_cells, "a flash tile is a tile of the cell table");
    constexpr int window = 128;
    __shared__ uint8_t cls[window];
    enum : uint8_t { skip_tile, whole_tile, masked_tile };
    int k = 0; // tiles computed: tile k is in buffers k & 1
    for (int w0 = c_begin; w0 < c_end; w0 += window * fa_cells) {
        const int n_t = min(window, (c_end - w0 + fa_cells - 1) / fa_cells);
        __syncthreads(); // the last window's classes are read
        if (int(threadIdx.x) < n_t) {
            const int c0 = w0 + int(threadIdx.x) * fa_cells;
            const cell_tile ti = p.tiles[c0 / fa_cells];
            uint8_t kind = masked_tile;
            if (tile_unseen(ti, seqs, max_pos)) {
                kind = skip_tile; // no query sees a cell of it
            } else if (c0 + fa_cells <= c_end && ti.n_used == fa_cells && ti.max_pos <= min_pos &&
                       (ti.seq_and & seqs) == seqs) {
                kind = whole_tile;
            }
            cls[threadIdx.x] = kind;
        }
        __syncthreads();
        auto next_tile = [&](int i) {
            for (++i; i < n_t && cls[i] == skip_tile;) ++i;
            return i;
        };
        int i = next_tile(-1);
        if (i < n_t) issue(w0 + i * fa_cells, k & 1);
        for (; i < n_t; ++k) {
            const int c0 = w0 + i * fa_cells, rb = k & 1;
            const bool whole = cls[i] == whole_tile;
            i = next_tile(i);
            cp_async_wait<0>();
            // Every copy of this tile landed, and every warp is done with the
            // last tile, whose buffers the next copies (or the turn) fill.
            __syncthreads();
            if (i < n_t) issue(w0 + i * fa_cells, rb ^ 1);
            int b = rb; // the f16 buffers this tile is computed from
            if constexpr (quant) {
                turn(rb);
                b = 0;
            }
            if (whole) {
                if (warp_rows) tile(std::false_type{}, ~0u, ks[b], vs[b]);
                continue;
            }
            // A tile some queries see in part: masks per (query, cell).
            if (threadIdx.x < fa_cells) {
                const int c = c0 + int(threadIdx.x);
                c_pos[threadIdx.x] = c < c_end ? p.cell_pos[c] : -1;
                c_seq[threadIdx.x] = c < c_end ? cell_mask(p, c) : seq_mask::none();
                c_seen[threadIdx.x] = 0;
            }
            __syncthreads();
            uint32_t vis = 0;
#pragma unroll
            for (int j = 0; j < fa_cells / 8; ++j) {
#pragma unroll
                for (int h2 = 0; h2 < 2; ++h2) {
                    const int col = 8 * j + 2 * t + h2, cp = c_pos[col];
                    const seq_mask cs = c_seq[col];
                    const bool v0 = kv_cell_visible(cp, cs, seq0, pos0);
                    const bool v1 = kv_cell_visible(cp, cs, seq1, pos1);
                    vis |= uint32_t(v0) << (4 * j + h2) | uint32_t(v1) << (4 * j + 2 + h2);
                    if (v0 || v1) c_seen[col] = 1;
                }
            }
            if (!__syncthreads_or(vis != 0)) continue; // no query of the block sees the tile
            // A cell no query sees is read as zeros, so a free cell's stale
            // (perhaps not finite) values cannot reach the sum through 0 * V.
            for (int e = threadIdx.x; e < fa_cells * (HD / 8); e += blockDim.x) {
                const int r = e / (HD / 8), ch = e % (HD / 8);
                if (c_seen[r]) continue;
                *reinterpret_cast<uint4 *>(ks[b] + r * LD + ch * 8) = make_uint4(0, 0, 0, 0);
                *reinterpret_cast<uint4 *>(vs[b] + r * LD + ch * 8) = make_uint4(0, 0, 0, 0);
            }
            __syncthreads();
            if (__any_sync(0xffffffffu, vis != 0)) tile(std::true_type{}, vis, ks[b], vs[b]);
        }
    }
    cp_async_wait<0>();

    l0 += SMOL_SHFL_XOR(l0, 1);
    l0 += SMOL_SHFL_XOR(l0, 2);
    l1 += SMOL_SHFL_XOR(l1, 1);
    l1 += SMOL_SHFL_XOR(l1, 2);
    if (n_split > 1) {
        // This split's (max, sum, unnormalised sum of V) per (token, head).
        auto put = [&](int row, float m, float l, int r) {
            if (row >= p.n_tok) return;
            float * part =
                p.part + ((size_t(row) * gridDim.y + blockIdx.y) * p.S + blockIdx.z) * (HD + 2);
            if (t == 0) {
                part[0] = m;
                part[1] = l;
            }
#pragma unroll
            for (int n = 0; n < n_dt; ++n) {
                part[2 + 8 * n + 2 * t] = o[n][2 * r];
                part[2 + 8 * n + 2 * t + 1] = o[n][2 * r + 1];
            }
        };
        put(row0, m0, l0, 0);
        put(row1, m1, l1, 1);
        // The block that finishes last for this (query tile, head) merges
        // the splits, so no second launch is needed.
        if (!last_split_block(p.done + blockIdx.y * gridDim.x + blockIdx.x, n_split)) return;
        // A warp a row: the splits' weights (maxima in log2 units), then
        // the accumulators summed with independent loads from L2.
        __shared__ float weight[4][64];
        const int rows = min(fa_rows, p.n_tok - tok0);
        for (int r = warp; r < rows; r += 4) {
            const float * pr =
                p.part + (size_t(tok0 + r) * gridDim.y + blockIdx.y) * p.S * (HD + 2);
            const float L = split_weights<true>(pr, n_split, HD + 2, weight[warp]);
            __syncwarp();
            for (int e = lane; e < HD; e += warp_size) {
                float a = 0.0f;
                for (int i = 0; i < n_split; ++i) {
                    const float f = weight[warp][i];
                    if (f != 0.0f) a += SMOL_LOAD_L2(pr + i * (HD + 2) + 2 + e) * f;
                }
                p.out[size_t(tok0 + r) * p.ldo + h * HD + e] = L > 0.0f ? a / L : 0.0f;
            }
            __syncwarp();
        }
        return;
    }
    // A query that sees no cell gets zeros, as from the kernel above.
    const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
#pragma unroll
    for (int n = 0; n < n_dt; ++n) {
        const int col = h * HD + 8 * n + 2 * t;
        if (row0 < p.n_tok) {
            float * d = p.out + size_t(row0) * p.ldo + col;
            d[0] = o[n][0] * inv0;
            d[1] = o[n][1] * inv0;
        }
        if (row1 < p.n_tok) {
            float * d = p.out + size_t(row1) * p.ldo + col;
            d[0] = o[n][2] * inv1;
            d[1] = o[n][3] * inv1;
        }
    }
}

} // namespace

void launch_flash_attention(dim3 grid, cudaStream_t st, bool pdl, const attn_params & p,
                            smol_type kv_type) {
    const dim3 block(4 * warp_size);
    if (kv_type == SMOL_TYPE_Q8_0) {
        launch_kernel(flash_attention_kernel<64, SMOL_TYPE_Q8_0>, grid, block, st, pdl, p);
    } else if (kv_type == SMOL_TYPE_Q4_0) {
        launch_kernel(flash_attention_kernel<64, SMOL_TYPE_Q4_0>, grid, block, st, pdl, p);
    } else {
        launch_kernel(flash_attention_kernel<64, SMOL_TYPE_F16>, grid, block, st, pdl, p);
    }
}

} // namespace smol::gpu

#endif // SMOL_FLASH_ATTENTION
