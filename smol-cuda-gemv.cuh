// smol-cuda-gemv.cuh - the GPU backend's matmul kernels of up to 32 tokens
// (the GEMV of decode and the small-batch kernel) and launch_mm_type, which
// launches them by weight type and choice. Two objects instantiate it, one
// for plain matmuls (smol-cuda-gemv.cu) and one for SwiGLU's gate and up
// (smol-cuda-gemv-swiglu.cu): the kernels of every weight type, split, tile
// and token count are most of the backend's compile time, and two objects
// compile side by side. Included by those two files only.

#ifndef SMOL_CUDA_GEMV_CUH
#define SMOL_CUDA_GEMV_CUH

#include "smol-cuda.cuh"

namespace smol::gpu {

namespace {

// --- matmul: small batches ----------------------------------------------------

// Row r of a launch's weights (q, k and v one after another; with SWIGLU,
// gate's rows, up's read alongside) and where its result goes: r becomes
// the row within weight number `which`. Selected with branches: a run-time
// index into the parameter arrays would copy them to local memory.
template <bool SWIGLU>
__device__ __forceinline__ void mm_select(const mm_params & p, int & r, const uint8_t *& w,
                                          float *& y, int & rows, int & which) {
    w = p.w[0];
    y = p.y[0];
    rows = p.rows[0];
    which = 0;
    if (!SWIGLU && r >= rows && p.n_w > 1) {
        r -= rows;
        w = p.w[1];
        y = p.y[1];
        rows = p.rows[1];
        which = 1;
        if (r >= rows && p.n_w > 2) {
            r -= rows;
            w = p.w[2];
            y = p.y[2];
            rows = p.rows[2];
            which = 2;
        }
    }
}

// The GEMV of decode: R weight rows a warp and KS warps a group of R rows
// (mm_warps / KS groups a block); block y takes MT tokens of the batch
// (one for single-token decode; a few, such as a speculative verify, read
// each weight once for all of them). The lanes of a group's warps split K
// in units (gemv_unit: chunks of 8, or spans of 32 of q4_K and q6_K
// super-blocks); each lane loads its unit of x once for the R rows, so the
// group keeps R chunks of weights in flight for each of x's (two rows a
// warp read much closer to the memory's rate than one). The fused weights'
// row counts are multiples of R. A token's sums run in the same order for
// every MT, so its results are the bits of a launch of its own.
//
// A folded RMS norm scales x by its weights on the way in and multiplies
// the dot by 1 / rms at the end; the sum of squares is taken from the same
// loads, so the weights' loads never wait for the norm (a first pass over
// x made the GEMVs slower).
//
// PAIR (float weights): each lane has two chunks of a row and reads both
// at once (see gemv_pair).
template <int T, bool SWIGLU, int KS, int R, bool PAIR = false, int MT = 1>
__global__ void __launch_bounds__(mm_warps * warp_size) gemv_kernel(const mm_params p) {
    static_assert(mm_warps % KS == 0, "the warps of a block split into whole groups");
    constexpr int groups_per_block = mm_warps / KS;
    const int warp = threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    const int ks = warp % KS, m0 = blockIdx.y * MT;
    // The block's tokens (fewer than MT in the batch's last tile).
    const int nt = MT == 1 ? 1 : min(MT, p.M - m0);
    int r = (blockIdx.x * groups_per_block + warp / KS) * R;
    const uint8_t * w;
    float * y;
    int rows, which;
    mm_select<SWIGLU>(p, r, w, y, rows, which);
    // Past the last row: with KS > 1 the warp still takes part in the
    // block's reduction, with nothing to add.
    const bool valid = r < rows;
    const size_t rb = p.w_row_bytes;
    const uint8_t * wr = w + size_t(r) * rb;
    const uint8_t * wu = SWIGLU ? p.w[1] + size_t(r) * rb : nullptr;
    // A GEMV launched early sends its weights to L2 while the kernel before
    // it still runs (see run_mm).
    if (p.prefetch && valid && ks == 0 && size_t(lane) * 128 < rb) {
#pragma unroll
        for (int j = 0; j < R; ++j) {
            prefetch_l2(wr + j * rb + size_t(lane) * 128);
            if constexpr (SWIGLU) prefetch_l2(wu + j * rb + size_t(lane) * 128);
        }
    }
    // With one row a warp, a quantized GEMV reads U chunks a lane at once:
    // its blocks are read in 2 and 4-byte pieces, and one chunk at a time
    // kept too few bytes in flight. Float weights are read 16 bytes a chunk;
    // with more rows than one, the rows are in flight together and U = 1
    // measured fastest for every type, but where a lane's share of a row is
    // two chunks (PAIR) it takes both at once. Several tokens keep the lane
    // busy between loads: U = 1. U leaves the order of the sums as it is.
    // A span of 32 (gemv_unit) is four chunks' weights: two spans a row at
    // a time with up to two rows a warp, one with more.
    static_assert(!PAIR || float_weights(T), "pairs of float chunks");
    using unit = gemv_unit<T>;
    constexpr bool span = unit::width == 32;
    constexpr int U = PAIR                        ? 2
                      : MT > 1                    ? 1
                      : span                      ? (R > 2 ? 1 : 2)
                      : R > 1 || float_weights(T) ? 1
                      : SWIGLU                    ? 2
                                                  : 4;
    const int n_ch = valid ? p.K / unit::width : 0, stride = KS * warp_size;
    // U chunks of each row at a time (past the row's end a lane reads its
    // last chunk again and drops it, so the loads stay unconditional and fly
    // together). The first are read before the wait: weights are no
    // kernel's output (p.early), so they stream while the kernel before
    // this one ends.
    typename unit::raw w_raw[U][R], u_raw[U][SWIGLU ? R : 1];
    auto fetch = [&](int c0) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int ch = min(c0 + u * stride, n_ch - 1);
#pragma unroll
            for (int j = 0; j < R; ++j) {
                w_raw[u][j].load(wr + j * rb, ch);
                if constexpr (SWIGLU) u_raw[u][j].load(wu + j * rb, ch);
            }
        }
    };
    const int c_first = ks * warp_size + lane;
    if (p.early && c_first < n_ch) fetch(c_first);
    griddep_launch(); // before the wait (see griddep_wait)
    griddep_wait();
    if (KS == 1 && !valid) return;
    if (!p.early && c_first < n_ch) fetch(c_first);

    // Per token: the rows' sums and x's sum of squares (ss).
    float acc[MT][R], acc_u[MT][SWIGLU ? R : 1], ss[MT];
#pragma unroll
    for (int t = 0; t < MT; ++t) {
        ss[t] = 0.0f;
#pragma unroll
        for (int j = 0; j < R; ++j) acc[t][j] = 0.0f;
#pragma unroll
        for (int j = 0; j < (SWIGLU ? R : 1); ++j) acc_u[t][j] = 0.0f;
    }
    for (int c0 = c_first; c0 < n_ch; c0 += U * stride) {
        if (c0 != c_first) fetch(c0);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (c0 + u * stride >= n_ch) continue;
            // The unit's weights made ready once for the block's tokens.
            typename unit::weights wt[R], ut[SWIGLU ? R : 1];
#pragma unroll
            for (int j = 0; j < R; ++j) {
                unit::ready(w_raw[u][j], wt[j]);
                if constexpr (SWIGLU) unit::ready(u_raw[u][j], ut[j]);
            }
#pragma unroll
            for (int t = 0; t < MT; ++t) {
                if (t < nt) { // (no break: the loop stays unrolled)
                    typename unit::acts xa;
                    unit::load_x(p.x + size_t(m0 + t) * p.ldx, p.norm_w, c0 + u * stride, xa,
                                 ss[t]);
#pragma unroll
                    for (int j = 0; j < R; ++j) {
                        acc[t][j] += unit::dot(wt[j], xa);
                        if constexpr (SWIGLU) acc_u[t][j] += unit::dot(ut[j], xa);
                    }
                }
            }
        }
    }
    double ssd[MT];
#pragma unroll
    for (int t = 0; t < MT; ++t) {
#pragma unroll
        for (int j = 0; j < R; ++j) {
            acc[t][j] = warp_sum(acc[t][j]);
            if constexpr (SWIGLU) acc_u[t][j] = warp_sum(acc_u[t][j]);
        }
        ssd[t] = p.norm_w ? warp_sum_f64(double(ss[t])) : 0.0;
    }
    if constexpr (KS > 1) {
        // The group's first warp adds the others' sums, always in one order.
        constexpr int n_part = SWIGLU ? 2 * R : R;
        __shared__ float part[mm_warps][MT * n_part];
        __shared__ double part_ss[mm_warps][MT];
        if (lane == 0) {
#pragma unroll
            for (int t = 0; t < MT; ++t) {
#pragma unroll
                for (int j = 0; j < R; ++j) {
                    part[warp][t * n_part + j] = acc[t][j];
                    if constexpr (SWIGLU) part[warp][t * n_part + R + j] = acc_u[t][j];
                }
                part_ss[warp][t] = ssd[t];
            }
        }
        __syncthreads();
        if (ks != 0 || !valid) return;
#pragma unroll
        for (int t = 0; t < MT; ++t) {
#pragma unroll
            for (int j = 0; j < R; ++j) {
                for (int i = 1; i < KS; ++i) {
                    acc[t][j] += part[warp + i][t * n_part + j];
                    if constexpr (SWIGLU) acc_u[t][j] += part[warp + i][t * n_part + R + j];
                }
            }
            for (int i = 1; i < KS; ++i) ssd[t] += part_ss[warp + i][t];
        }
    }
#pragma unroll
    for (int t = 0; t < MT; ++t) {
        if (t < nt) {
            const int m = m0 + t;
            // Lane j writes row r + j.
            float val = acc[t][0], val_u = SWIGLU ? acc_u[t][0] : 0.0f;
#pragma unroll
            for (int j = 1; j < R; ++j) {
                if (lane == j) {
                    val = acc[t][j];
                    if constexpr (SWIGLU) val_u = acc_u[t][j];
                }
            }
            if (p.norm_w) {
                const float s = rms_scale(ssd[t], p.K, p.eps);
                val *= s;
                val_u *= s;
            }
            if constexpr (SWIGLU) val = p.gelu ? gelu_mul(val, val_u) : silu_mul(val, val_u);
            if (p.res && lane < R) val = p.res[size_t(m) * p.ldr + r + lane] + val;
            if (lane < R) y[size_t(m) * rows + r + lane] = val;
            if constexpr (!SWIGLU && R % 2 == 0) {
                // k and v into the token's cache cell, a pair of rows (lanes 2i
                // and 2i + 1) by the even lane, as kv_store_kernel stores them.
                const float other = SMOL_SHFL_XOR(val, 1);
                const kv_store_params & kv = p.kv;
                if (kv.K && which > 0 && lane < R && lane % 2 == 0)
                    store_kv_pair(kv, m, size_t(kv.cell[m]), r + lane, val, other, which == 1);
            }
        }
    }
}

// The small-batch GEMM: KS warps per weight row (mm_warps / KS rows per
// block); the lanes of the row's warps split K in chunks of 8, dequantize
// each chunk once and use it for all MT tokens of this block's column of
// the batch, then reduce across the warp and (KS > 1, split-K) across the
// row's warps. A folded RMS norm: the block's warps take each token's
// 1 / rms first (sums in the loop would cost registers the tile needs).
template <int T, int MT, bool SWIGLU, int KS>
__global__ void __launch_bounds__(mm_warps * warp_size) mm_small_kernel(const mm_params p) {
    static_assert(mm_warps % KS == 0, "the warps of a block split into whole rows");
    constexpr int rows_per_block = mm_warps / KS;
    const int warp = threadIdx.x / warp_size, lane = threadIdx.x % warp_size;
    const int ks = warp % KS;
    const int m0 = blockIdx.y * MT;
    int r = blockIdx.x * rows_per_block + warp / KS;
    const uint8_t * w;
    float * y;
    int rows, which;
    mm_select<SWIGLU>(p, r, w, y, rows, which);
    const bool valid = r < rows;
    const uint8_t * wr = w + size_t(r) * p.w_row_bytes;
    const uint8_t * wu = SWIGLU ? p.w[1] + size_t(r) * p.w_row_bytes : nullptr;

    __shared__ float inv_rms[MT];
    if (p.norm_w) {
        for (int m = warp; m < MT; m += mm_warps) {
            double sq = 0.0;
            if (m0 + m < p.M) {
                const float * xr = p.x + size_t(m0 + m) * p.ldx;
                for (int k = lane; k < p.K; k += warp_size) sq += double(xr[k]) * double(xr[k]);
            }
            sq = warp_sum_f64(sq);
            if (lane == 0) inv_rms[m] = rms_scale(sq, p.K, p.eps);
        }
        __syncthreads();
    }
    if (KS == 1 && !valid) return;

    float acc[MT], acc_u[SWIGLU ? MT : 1];
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[m] = 0.0f;
#pragma unroll
    for (int m = 0; m < (SWIGLU ? MT : 1); ++m) acc_u[m] = 0.0f;
    const int n_ch = valid ? p.K / 8 : 0, stride = KS * warp_size;
    for (int ch = ks * warp_size + lane; ch < n_ch; ch += stride) {
        float v[8], vu[8];
        int e0, e1;
        load_chunk<T>(wr, ch, v, e0, e1);
        if constexpr (SWIGLU) load_chunk<T>(wu, ch, vu, e0, e1);
        float4 na = make_float4(1, 1, 1, 1), nb = na;
        if (p.norm_w) {
            na = *reinterpret_cast<const float4 *>(p.norm_w + e0);
            nb = *reinterpret_cast<const float4 *>(p.norm_w + e1);
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if (m0 + m < p.M) {
                const float * xr = p.x + size_t(m0 + m) * p.ldx;
                float4 a = *reinterpret_cast<const float4 *>(xr + e0);
                float4 b = *reinterpret_cast<const float4 *>(xr + e1);
                if (p.norm_w) {
                    const float sc = inv_rms[m];
                    a = make_float4((a.x * sc) * na.x, (a.y * sc) * na.y, (a.z * sc) * na.z,
                                    (a.w * sc) * na.w);
                    b = make_float4((b.x * sc) * nb.x, (b.y * sc) * nb.y, (b.z * sc) * nb.z,
                                    (b.w * sc) * nb.w);
                }
                acc[m] += dot8(v, a, b);
                if constexpr (SWIGLU) acc_u[m] += dot8(vu, a, b);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        acc[m] = warp_sum(acc[m]);
        if constexpr (SWIGLU) acc_u[m] = warp_sum(acc_u[m]);
    }
    if constexpr (KS > 1) {
        // The row's first warp adds the others' sums, always in one order.
        __shared__ float part[mm_warps][SWIGLU ? 2 * MT : MT];
        if (lane == 0) {
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                part[warp][m] = acc[m];
                if constexpr (SWIGLU) part[warp][MT + m] = acc_u[m];
            }
        }
        __syncthreads();
        if (ks != 0 || !valid) return;
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            for (int j = 1; j < KS; ++j) {
                acc[m] += part[warp + j][m];
                if constexpr (SWIGLU) acc_u[m] += part[warp + j][MT + m];
            }
        }
    }
    if (lane == 0) {
        const size_t ldy = size_t(rows);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if (m0 + m < p.M) {
                float val = acc[m];
                if constexpr (SWIGLU)
                    val = p.gelu ? gelu_mul(val, acc_u[m]) : silu_mul(val, acc_u[m]);
                if (p.res) val = p.res[size_t(m0 + m) * p.ldr + r] + val;
                y[size_t(m0 + m) * ldy + r] = val;
            }
        }
    }
}

// Whether a GEMV over K columns, KS warps a row group, gives each lane
// exactly two chunks of a row. Over float weights, one or two rows a warp,
// it then reads both at once: one trip to memory where there were two,
// before the wait too. That shortened the small models' GEMVs; the
// 1.7B's, whose lanes have four chunks or more, read them as before, since
// reading all of a lane's chunks at once made them slower.
inline bool gemv_pair(int K, int KS) {
    return (K / 8 + KS * warp_size - 1) / (KS * warp_size) == 2;
}

// Calls f(std::integral_constant<int, N>) for N = 1, 2 or 4 (n above 4
// as 4): a split of K over warps, a GEMV's rows a warp.
template <typename F> void with_1_2_4(int n, F && f) {
    if (n >= 4) {
        f(std::integral_constant<int, 4>{});
    } else if (n == 2) {
        f(std::integral_constant<int, 2>{});
    } else {
        f(std::integral_constant<int, 1>{});
    }
}

// Launches the GEMV (MT tokens a block) or mm_small_kernel for weight
// type T with the rows a warp, tokens, tile and split of a choice. Every
// weight's row count is a multiple of the GEMV's c.r (run_mm sees to it).
template <int T, bool SWIGLU>
void launch_mm_small(const mm_params & p, int total_rows, const mm_choice & c, cudaStream_t stream,
                     bool pdl) {
    const int threads = mm_warps * warp_size;
    if (!c.tile) {
        auto gemv = [&](auto mt) {
            constexpr int MT = decltype(mt)::value;
            with_1_2_4(c.r, [&](auto r) {
                with_1_2_4(c.ks, [&](auto ks) {
                    constexpr int R = decltype(r)::value, KS = decltype(ks)::value;
                    constexpr int rows_per_block = R * (mm_warps / KS);
                    const dim3 grid(unsigned((total_rows + rows_per_block - 1) / rows_per_block),
                                    unsigned((p.M + MT - 1) / MT));
                    if constexpr (MT == 1 && float_weights(T) && R <= 2) {
                        if (gemv_pair(p.K, KS)) {
                            launch_kernel(gemv_kernel<T, SWIGLU, KS, R, true>, grid, dim3(threads),
                                          stream, pdl, p);
                            return;
                        }
                    }
                    launch_kernel(gemv_kernel<T, SWIGLU, KS, R, false, MT>, grid, dim3(threads),
                                  stream, pdl, p);
                });
            });
        };
        if (c.mt <= 1) {
            gemv(std::integral_constant<int, 1>{});
        } else {
            gemv(std::integral_constant<int, 4>{});
        }
        return;
    }
    auto split = [&](auto mt) {
        with_1_2_4(c.ks, [&](auto ks) {
            constexpr int MT = decltype(mt)::value, KS = decltype(ks)::value;
            constexpr int rows_per_block = mm_warps / KS;
            const dim3 grid(unsigned((total_rows + rows_per_block - 1) / rows_per_block),
                            unsigned((p.M + MT - 1) / MT));
            // Batch tiles launched early measured slower: only the GEMV is.
            launch_kernel(mm_small_kernel<T, MT, SWIGLU, KS>, grid, dim3(threads), stream, false,
                          p);
        });
    };
    if (c.mt <= 2) {
        split(std::integral_constant<int, 2>{});
    } else if (c.mt <= 4) {
        split(std::integral_constant<int, 4>{});
    } else if (c.mt <= 8) {
        split(std::integral_constant<int, 8>{});
    } else if (c.mt <= 16) {
        split(std::integral_constant<int, 16>{});
    } else {
        split(std::integral_constant<int, 32>{});
    }
}

} // namespace

template <bool SWIGLU>
void launch_mm_type(int type, const mm_params & p, int rows, const mm_choice & c, cudaStream_t st,
                    bool pdl) {
    with_weight_type(
        type, [&](auto t) { launch_mm_small<decltype(t)::value, SWIGLU>(p, rows, c, st, pdl); });
}

// Each made in its own object only (see above), never where it is called.
extern template void launch_mm_type<false>(int type, const mm_params & p, int rows,
                                           const mm_choice & c, cudaStream_t st, bool pdl);
extern template void launch_mm_type<true>(int type, const mm_params & p, int rows,
                                          const mm_choice & c, cudaStream_t st, bool pdl);

} // namespace smol::gpu

#endif // SMOL_CUDA_GEMV_CUH
