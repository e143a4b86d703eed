// smol-cpu-kernels.h - the CPU backend's kernels: f16 and bf16 conversion,
// row (de)quantization, the matmul with on-the-fly dequantization, and the
// vector primitives that attention and the small ops use (the block layouts
// are smol-quant.h's). Two sources (smol-cpu-kernels.c++, smol-cpu-matmul.c++) are compiled
// once per instruction set (generic, AVX2+FMA+F16C, AVX-512 with VNNI and
// BF16); the best variant the running CPU supports is chosen once at run time.

#ifndef SMOL_CPU_KERNELS_H
#define SMOL_CPU_KERNELS_H

#include "smol-quant.h"
#include "smol.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace smol::cpu {

// Activations are quantized to this block before an integer dot product with
// the 32-element types' weights (not a file format; like ggml's q8_1); for
// the 256-element types, to block_q8_K.
struct block_q8_act {
    float d;       // scale: x ~= d * qs, rounded to f16 precision as ggml's q8_1
    float s;       // d * sum(qs) at f16 precision, for the q4_1 minimum
    int8_t qs[32]; // round(x / d), |qs| <= 127
};
static_assert(sizeof(block_q8_act) == 40);

// --- scalar conversions (exact, portable) -----------------------------------

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f); // round to nearest even, inf/nan kept
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f); // round to nearest even, nan kept

// Bytes of one row of n elements of type t (n a multiple of the block size).
size_t row_bytes(smol_type t, int64_t n);
// Elements per block: 1 for f32/f16/bf16, 32 or 256 for the quantized types.
int64_t block_elems(smol_type t);

// --- the kernel table -------------------------------------------------------

struct kernels {
    const char * name; // "generic", "avx2", "avx512"

    // Row conversions for type t: GGUF layout <-> f32 (n elements).
    void (*row_to_f32)(smol_type t, const void * src, float * dst, int64_t n);
    void (*row_from_f32)(smol_type t, const float * src, void * dst, int64_t n);

    // Activations for weight type t: converts one row of K floats to the
    // format matmul multiplies with t (f32 for f32/bf16, f32 rounded to f16
    // for f16, block_q8_act for the quantized types). act_bytes(t, K) says
    // its size.
    void (*act_from_f32)(smol_type t, const float * x, void * act, int64_t K);

    // y[i * ldy + r] = sum_k W[r][k] * X[i][k] for r in [r0, r1) and token i
    // in [0, n_tok). W rows are w_row_bytes apart, activation rows
    // act_row_bytes apart. Blocks over rows and tokens so weights are
    // unpacked once per group of tokens. Must be safe to call concurrently
    // on disjoint row ranges.
    void (*matmul)(smol_type t, const void * w, size_t w_row_bytes, int64_t K, int64_t r0,
                   int64_t r1, const void * act, size_t act_row_bytes, int64_t n_tok, float * y,
                   int64_t ldy);

    // Tokens whose activations for weight type t stay in a core's L2 while
    // one thread's row chunks of a matmul sweep them: the executor hands out
    // (token chunk, row chunk) items token chunk by token chunk. The
    // quantized kernels' activations are small and their packed panels cost
    // a pass per token chunk: for them, every token at once.
    int64_t (*token_chunk)(smol_type t, int64_t K);

    // f32 to f16, round to nearest even (the KV cache's rows).
    void (*f32_to_f16)(const float * x, uint16_t * y, int64_t n);

    // f32 vector primitives.
    float (*dot_f32)(const float * a, const float * b, int64_t n);
    float (*sum_sq)(const float * x, int64_t n);
    void (*scale)(float * y, const float * x, float s, int64_t n);          // y = s * x
    void (*mul)(float * y, const float * a, const float * b, int64_t n);    // y = a * b
    void (*add)(float * y, const float * a, const float * b, int64_t n);    // y = a + b
    void (*swiglu)(float * y, const float * g, const float * u, int64_t n); // y = silu(g) * u
    // y[i] = exp(x[i] - max) for i < n; returns the sum.
    float (*softmax_exp)(float * y, const float * x, float max, int64_t n);
    // The first index of the largest of x[0, n) (a NaN is never the
    // largest; 0 when nothing exceeds -inf): greedy decoding's draw.
    int64_t (*argmax)(const float * x, int64_t n);

    // Attention of nq queries (of one kv head) over a sequence's cells:
    // rows hd long in an f16 cache, at cells[j] * hd. attn_scores:
    // out[g * ldo + j] = (K row . q_g) * scale for j < n, q_g = q + g * hd,
    // and mx[g] the largest. attn_values: acc[g * hd + d] = sum of
    // p[g * ldp + j] * V row[d] over j < n in increasing j, one FMA per
    // element and cell, cells with p == 0 skipped. Each output is computed
    // the same way whatever the other cells and queries are.
    void (*attn_scores)(const uint16_t * k, const int32_t * cells, int32_t n, int64_t hd,
                        const float * q, int nq, float scale, float * out, int64_t ldo, float * mx);
    void (*attn_values)(const uint16_t * v, const int32_t * cells, const float * p, int64_t ldp,
                        int nq, int32_t n, int64_t hd, float * acc);
    // The same over a quantized cache (t: Q8_0 or Q4_0, hd a multiple of 32
    // and at most 1024): rows of hd / 32 blocks, row_bytes(t, hd) apart,
    // met in f32 (the generic variant dequantizes a row, then a dot per
    // query and a multiply-add per element; AVX2 takes a block's integers
    // times q, times its scale, and adds p times the scale times the
    // integers, cells in increasing j), so the results are f32 sums over
    // exactly the stored values within the f16 kernels' bounds.
    void (*attn_scores_q)(smol_type t, const void * k, const int32_t * cells, int32_t n, int64_t hd,
                          const float * q, int nq, float scale, float * out, int64_t ldo,
                          float * mx);
    void (*attn_values_q)(smol_type t, const void * v, const int32_t * cells, const float * p,
                          int64_t ldp, int nq, int32_t n, int64_t hd, float * acc);
};

size_t act_bytes(smol_type t, int64_t K);

// Whether decode's matmuls ask for the weight rows ahead of them (software
// prefetch): on AMD CPUs, where it was tuned and the hardware prefetcher
// alone left bandwidth unused, not on Intel's, where it slowed F16 decode
// (BENCHMARKS.md, CPU).
// SMOL_CPU_PREFETCH=0|1 overrides. Chosen once.
bool decode_prefetch();

// The best variant for this CPU, chosen once (SMOL_CPU_KERNELS=generic|avx2|
// avx512 forces one, for tests and comparisons).
const kernels & kernels_best();
// Every variant this build has that the running CPU supports, generic first.
std::vector<const kernels *> kernels_available();

} // namespace smol::cpu

#endif // SMOL_CPU_KERNELS_H
