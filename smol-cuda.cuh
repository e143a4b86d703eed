// smol-cuda.cuh - the GPU backend's internal header: the cuda_backend class
// and what its files share: the parameters of the kernels (rope, KV store,
// matmul, attention), the matmul kernel choice, a step of a graph's plan,
// the sizes of the cell table and of the cuBLAS work space, the attention
// kernels' shapes, and the host launches of kernels another file owns.
// Each part's members are defined in the file of that part:
// smol-cuda.cu (construction, run), -memory, -steps, -graphs, -autotune,
// -ops, -gemv, -blas, -attn and -fattn.cu.

#ifndef SMOL_CUDA_CUH
#define SMOL_CUDA_CUH

#include "smol-cuda-common.cuh"
#include "smol-cuda-fusion.h"
#include "smol-faults.h"
#include "smol-host-attention.h"
#include "smol-schedule.h"

#if defined(SMOL_NCCL)
#include <nccl.h>
#endif

#include <deque>
#include <memory>
#include <mutex>

namespace smol::gpu {

// Where a kernel finds the angles of a rope: the graph's table of (cos,
// sin) per token and pair when it has one (computed once per run, not once
// per layer), else computed on the spot.
struct rope_params {
    const int32_t * pos = nullptr; // per token; null: no rope
    const float2 * table = nullptr;
    float theta_scale = 0.0f;
    int half = 0;
};

__device__ __forceinline__ void rope_get(const rope_params & r, int tok, int j, float & c,
                                         float & s) {
    if (r.table) {
        const float2 cs = r.table[size_t(tok) * r.half + j];
        c = cs.x;
        s = cs.y;
    } else {
        rope_cs(r.pos[tok], j, r.theta_scale, c, s);
    }
}

struct kv_store_params {
    const float * k;
    const float * v;
    size_t ldk, ldv;
    size_t k_lo = 0, v_lo = 0; // nonzero: k's (v's) element e is k[e] + k[k_lo + e] (kept_)
    uint16_t * K;              // the view's first head
    uint16_t * V;
    size_t head_stride;    // elements between heads: n_cells * hd
    int hd, h0, n_head_kv; // the view's heads [h0, h0 + n_head_kv) of the k, v rows
    const int32_t * cell;  // per token
    rope_params rope;      // non-null pos: rotate k on the way in
    bool vec;              // two pairs a thread: 16-byte rows in, 8-byte pieces out
    // A quantized cache (kv_store_q_kernel): its type, a cell's row in
    // 16-bit words and the Walsh-Hadamard turns of K and V (kv_rot_k/_v).
    int type = SMOL_TYPE_F16, row_words = 0, rot_k = 0, rot_v = 0;
};

// Rows r and r + 1 (r even) of token tok's k (or v) into the token's cache
// cell as f16, where row r's head is one of the view's; k's pair turned by
// the rope first. kv_store_kernel, and the GEMVs that store k and v
// themselves, all store through it.
__device__ __forceinline__ void store_kv_pair(const kv_store_params & p, int tok, size_t cell,
                                              int r, float x0, float x1, bool k) {
    const int e = r % p.hd, h = r / p.hd - p.h0;
    if (h < 0 || h >= p.n_head_kv) return;
    if (k && p.rope.pos) {
        float c, s;
        rope_get(p.rope, tok, e / 2, c, s);
        rope_pair(x0, x1, c, s);
    }
    uint16_t * d = (k ? p.K : p.V) + h * p.head_stride + cell * p.hd + e;
    d[0] = f32_to_f16(x0);
    d[1] = f32_to_f16(x1);
}

// In place, x[0, n) in runs of len (a power of two; 0: none) times the
// orthonormal Walsh-Hadamard matrix, by the block's threads, in the order
// of kv_rotate's butterflies (the same bits).
__device__ inline void block_rotate(float * x, int n, int len) {
    if (len <= 0) return;
    for (int h = 1; h < len; h *= 2) {
        for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
            const int j = (i / h) * 2 * h + i % h; // the pair (j, j + h)
            const float a = x[j], b = x[j + h];
            x[j] = a + b;
            x[j + h] = a - b;
        }
        __syncthreads();
    }
    const float norm = 1.0f / sqrtf(float(len));
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] *= norm;
    __syncthreads();
}

// --- matmul: small batches ----------------------------------------------------

// y[m][r] = dot(W row r, x[m]) for up to three weights that share x and K
// (q, k and v), or silu(gate . x) * (up . x) when SWIGLU. Optionally x is
// RMS-normalized on the fly (norm_w) and a residual is added to the result.
struct mm_params {
    const uint8_t * w[3];
    float * y[3];
    int rows[3];
    int n_w;
    size_t w_row_bytes;
    int K, M;
    const float * x;
    size_t ldx;
    const float * res;
    size_t ldr;
    const float * norm_w;
    float eps;
    bool gelu; // the pair's activation is GeGLU's, not SwiGLU's
    // The weights are no kernel's output, so the GEMV reads its first chunks
    // before it waits (early) and, with prefetch, sends its rows' first 4 KiB
    // to L2 as well.
    bool prefetch, early;
    // Non-null kv.K: the GEMV of q, k and v also stores k (rotated) and v
    // in the cache, as kv_store_kernel would (its k, v and ld unused).
    kv_store_params kv;
};

constexpr int mm_warps = 4; // warps per block of the small-batch kernels

// --- matmul kernel choice ------------------------------------------------------------

// One candidate of the autotune table: the GEMV with MT tokens a block
// (gemv_tokens) and KS warps a group of R rows, the small-batch kernel with
// a token tile MT and KS warps a row, or cuBLAS on tensor cores.
struct mm_choice {
    bool blas = false;
    int mt = 1, ks = 1;
    double us = -1;    // the time the autotune measured, if it did
    int r = 1;         // GEMV rows a warp
    bool kv = false;   // (used, not a table's) the GEMV stored k and v in the cache too
    bool kept = false; // (used) cuBLAS over bf16 pairs whose sums their readers made
    bool tile = false; // the small-batch kernel, not the GEMV
};

constexpr int mm_tiles[] = {2, 4, 8, 16, 32};
constexpr int gemv_tokens[] = {1, 4};
constexpr int mm_splits[] = {1, 2, 4};
constexpr int mm_rows[] = {1, 2, 4};

// --- attention ------------------------------------------------------------------

// What the flash kernel needs of a tile of 64 cells of the cache table to
// sort it without reading its cells: the least and greatest position of its
// cells in use, the union and the intersection of their sequences, and how
// many are in use. The host keeps it with the table (stage).
struct cell_tile {
    seq_mask seq_or, seq_and;
    int32_t min_pos, max_pos, n_used, pad;
};
constexpr int cell_tile_cells = kv_page; // a tile is a page of the cache

struct attn_params {
    const float * q;
    size_t ldq;
    size_t q_lo = 0; // nonzero: q's element e is q[e] + q[q_lo + e] (kept_)
    float * out;
    size_t ldo;
    const uint16_t * K; // the view's first kv head
    const uint16_t * V;
    size_t head_stride;
    int hd, n_head, group, n_tok;
    int h0; // the view's first kv head; block y serves query head h0 * group + y
    float scale;
    int window = 0; // > 0: a query at p sees the cells at p - window + 1 .. p
    int sink = 0;   // with a window: and those at positions below sink
    // A quantized cache: a cell's row in 16-bit words (the classic kernel;
    // the flash kernel knows it from its type), and K's Walsh-Hadamard
    // turn, which the queries take too.
    int row_words = 0, rot_k = 0;
    const int32_t * pos; // per token
    const int32_t * seq;
    const int32_t * cell;     // per token: the cell its k and v went to in this step
    const int32_t * cell_pos; // per cell, [0, n_used)
    // Per cell, the sequences that hold it: two planes of words, the cells'
    // sequences 0-63, then (seq_plane words on) their sequences 64-127.
    const uint64_t * cell_seqs;
    size_t seq_plane;
    const int32_t * n_used;  // device scalar: graphs replayed later read the new value
    const cell_tile * tiles; // per 64 cells
    // The decode kernel over pages: the pages each sequence of the batch
    // holds (cuda_backend::list_seq_pages), staged with the batch.
    const int32_t * seq_pages;
    int n_kv;         // kv heads of the view
    int Q, W, S;      // queries per block, cell streams per query, splits over cells
    float * part;     // S > 1: [token][head][split] of (max, sum, acc[hd])
    int * done;       // S > 1: splits finished per (token, head); left at zero
    rope_params rope; // non-null pos: rotate q as it is loaded
};

// --- attention: tensor-core prefill ---------------------------------------------

constexpr float log2_e = 1.4426950408889634f; // scores in log2 units let exp2f serve as exp
constexpr int fa_rows = 64; // queries a block: four warps of 16 (the work space sizes it too)

// The decode attention kernel's shape (the kernel is below, with the flash one).
constexpr int dec_warps = 8;  // warps a block, each a stream of its own tiles
constexpr int dec_cells = 32; // cells a warp's tile: each lane scores one
// Tiles a warp holds in shared memory, one in flight while it computes the
// other: 134 KiB a block, one block of eight warps an SM, two a scheduler,
// so one warp's arithmetic hides behind another's. It beat four warps of
// four tiles at long contexts; eight warps of three tiles ran no faster.
constexpr int dec_stages = 2;
constexpr int dec_split_cells = 256; // the fewest cells a split takes
constexpr int dec_max_splits = 128;  // splits over the cells, at most
constexpr int dec_max_heads = 4;     // query heads a block serves, all of one kv head
constexpr int dec_list = 512;        // warp tiles a block lists at once when it walks pages
// Batches of up to this many tokens may take the decode kernel (a prompt's
// chunk takes the flash kernel, which reads each cell once for all tokens),
// as may a batch of any size whose tokens are of different sequences.
constexpr int dec_max_tok = 32;

// A block's shared memory: per warp dec_stages tiles of K, V and their
// cells' positions and sequences.
template <int HD> __host__ __device__ constexpr size_t dec_tile_bytes() {
    return dec_cells * (2 * HD * sizeof(uint16_t) + sizeof(int32_t) + sizeof(uint64_t));
}
template <int HD> __host__ __device__ constexpr size_t dec_smem() {
    return size_t(dec_warps) * dec_stages * dec_tile_bytes<HD>();
}

// The decode blocks a kv head's group of query heads takes (a group of up
// to four in one block, a larger one in the fewest blocks of at most four),
// and the query heads each serves (GB).
__host__ __device__ constexpr int decode_subs(int group) {
    return (group + dec_max_heads - 1) / dec_max_heads;
}
__host__ __device__ constexpr int decode_heads(int group) {
    return (group + decode_subs(group) - 1) / decode_subs(group);
}

#if defined(SMOL_FLASH_ATTENTION)

constexpr int fa_cells = 64;        // cells a tile
constexpr int fa_split_cells = 256; // the fewest cells a split of decode takes
// From this many tokens a batch takes the flash kernel: every batch. For
// decode it ran faster than the classic kernel, offloaded head groups
// included.
constexpr int fa_min_tok = 1;

#endif

// --- the plan of one graph (its steps: smol-cuda-fusion.h) ---------------------------

inline size_t align_up(size_t n, size_t a) {
    return (n + a - 1) / a * a;
}

// The device's copy of the cache table: positions, then the sequence masks
// in two planes of words (sequences 0-63 of every cell, then 64-127: the
// decode kernel copies the words of its token's sequence alone, 16 bytes
// at a time, so each plane starts 16-byte aligned), then the tiles of 64
// cells.
inline size_t cell_seqs_offset(int64_t n_cells) {
    return align_up(size_t(n_cells) * sizeof(int32_t), 16);
}
inline size_t seq_plane_words(int64_t n_cells) {
    return align_up(size_t(n_cells), 2);
}
inline size_t cell_tiles_offset(int64_t n_cells) {
    return cell_seqs_offset(n_cells) + 2 * seq_plane_words(n_cells) * sizeof(uint64_t);
}
inline size_t cell_table_bytes(int64_t n_cells) {
    return cell_tiles_offset(n_cells) +
           size_t((n_cells + cell_tile_cells - 1) / cell_tile_cells) * sizeof(cell_tile);
}

// The work space of cuBLAS matmuls: their input (f16, or bf16_hl pairs),
// then room for one dequantized weight, or for each of the step's pairs'
// two columns of results a token.
inline size_t blas_input_bytes(bool pairs, int64_t K, int64_t M) {
    return align_up(size_t(K) * size_t(M) * 2 * (pairs ? 2 : 1), 256);
}
// Where the scratch starts (N: the step's widest output): past the input,
// and with pairs past any input of N columns too, which the next step's
// input kernel writes while it reads this step's kept results.
inline size_t blas_scratch_offset(bool pairs, int64_t K, int64_t N, int64_t M) {
    return blas_input_bytes(pairs, pairs ? std::max(K, N) : K, M);
}
inline size_t blas_pair_bytes(int64_t N, int64_t M) {
    return align_up(size_t(N) * size_t(M) * 2 * sizeof(float), 256);
}
inline size_t blas_scratch_bytes(int type, bool pairs, int64_t N, int64_t K, int64_t M) {
    return pairs ? blas_pair_bytes(N, M)
           : type == SMOL_TYPE_F32 || type == SMOL_TYPE_F16
               ? 0
               : align_up(size_t(N) * size_t(K) * 2, 256);
}
inline size_t blas_work_bytes(int type, bool pairs, int64_t N, int64_t K, int64_t M) {
    return blas_scratch_offset(pairs, K, N, M) + blas_scratch_bytes(type, pairs, N, K, M);
}

inline int grid_for(size_t n, int threads) {
    return int(std::min<size_t>((n + threads - 1) / threads, 4096));
}

template <class T> T * data_of(const tensor * t) {
    return static_cast<T *>(t->data);
}

// Calls f(std::integral_constant<int, T>) for a weight type T known at run
// time, so each kernel template is instantiated once per type and chosen here.
template <typename F> void with_weight_type(int type, F && f) {
    switch (type) {
    case SMOL_TYPE_F32:
        f(std::integral_constant<int, SMOL_TYPE_F32>{});
        break;
    case SMOL_TYPE_F16:
        f(std::integral_constant<int, SMOL_TYPE_F16>{});
        break;
    case SMOL_TYPE_BF16:
        f(std::integral_constant<int, SMOL_TYPE_BF16>{});
        break;
    case SMOL_TYPE_Q8_0:
        f(std::integral_constant<int, SMOL_TYPE_Q8_0>{});
        break;
    case SMOL_TYPE_Q4_0:
        f(std::integral_constant<int, SMOL_TYPE_Q4_0>{});
        break;
    case SMOL_TYPE_Q4_1:
        f(std::integral_constant<int, SMOL_TYPE_Q4_1>{});
        break;
    case SMOL_TYPE_Q5_0:
        f(std::integral_constant<int, SMOL_TYPE_Q5_0>{});
        break;
    case SMOL_TYPE_Q5_1:
        f(std::integral_constant<int, SMOL_TYPE_Q5_1>{});
        break;
    case SMOL_TYPE_IQ4_NL:
        f(std::integral_constant<int, SMOL_TYPE_IQ4_NL>{});
        break;
    case SMOL_TYPE_Q2_K:
        f(std::integral_constant<int, SMOL_TYPE_Q2_K>{});
        break;
    case SMOL_TYPE_Q3_K:
        f(std::integral_constant<int, SMOL_TYPE_Q3_K>{});
        break;
    case SMOL_TYPE_Q4_K:
        f(std::integral_constant<int, SMOL_TYPE_Q4_K>{});
        break;
    case SMOL_TYPE_Q5_K:
        f(std::integral_constant<int, SMOL_TYPE_Q5_K>{});
        break;
    case SMOL_TYPE_Q6_K:
        f(std::integral_constant<int, SMOL_TYPE_Q6_K>{});
        break;
    case SMOL_TYPE_IQ4_XS:
        f(std::integral_constant<int, SMOL_TYPE_IQ4_XS>{});
        break;
    default:
        break;
    }
}

// --- launches of kernels that another file owns ----------------------------------
//
// Kernels stay private to their file; the backend's parts reach the ones
// another file owns through these, which launch them as that file does.

// smol-cuda-ops.cu: the run's table of rope angles, one block a token.
void launch_rope_table(const rope_params & r, unsigned n_tok, float2 * table, cudaStream_t st);
// smol-cuda-ops.cu: the RMS norm (a block a row) and the SwiGLU that make a
// cuBLAS step's input as f16 (uint16_t) or bf16_hl pairs.
template <typename Out>
void launch_rms_norm(unsigned rows, cudaStream_t st, const float * x, const float * b, size_t ldb,
                     size_t b_lo, float * h, size_t ldx, const float * w, Out * dst, size_t ld_dst,
                     int n, float eps);
template <typename Out>
void launch_swiglu(cudaStream_t st, const float * g, const float * u, size_t ld, size_t lo,
                   Out * dst, int K, int M);
// smol-cuda-gemv.cu: a matmul of up to 32 tokens through the GEMV or the
// small-batch kernel that c names.
template <bool SWIGLU>
void launch_mm_type(int type, const mm_params & p, int rows, const mm_choice & c, cudaStream_t st,
                    bool pdl = false);
#if !defined(SMOL_HIP)
// smol-cuda-gemv.cu: the PTX version the GEMV was compiled from.
int gemv_ptx_version();
#endif
#if defined(SMOL_FLASH_ATTENTION)
// smol-cuda-fattn.cu: the flash attention kernel, a block 64 queries of a head.
void launch_flash_attention(dim3 grid, cudaStream_t st, bool pdl, const attn_params & p,
                            smol_type kv_type);
// smol-cuda-attn.cu: the decode attention kernel's blocks the GPU holds at
// once (its shared memory is set up on the way).
int decode_block_slots(int n_sm);
#endif
// smol-cuda-autotune.cu: where the table of this GPU lives.
std::string default_table_path(const std::string & gpu);
// smol-cuda-steps.cu: every token of the batch is of a sequence of its own.
bool seqs_apart(const batch_info & b);

// --- the backend ----------------------------------------------------------------

class cuda_backend final : public backend {
  public:
    // The options as given (make_backend puts the environment's overrides on).
    cuda_backend(int device, const backend_options & options);
    ~cuda_backend() override;
    const char * name() const override { return name_.c_str(); }
    placement where() const override { return placement::device; }
    // Prompts of a few thousand tokens fill the GPU in one pass: a long
    // prompt decoded in one call runs faster than in chunks of 512.
    uint32_t default_batch() const override { return 4096; }
    bool wants_seq_cells() const override { return false; }
    bool reruns_graphs() const override { return true; }
    // The types with_weight_type dispatches: every type smol loads.
    bool supports_weights(smol_type t) const override { return traits_of(t) != nullptr; }
    // Quantized KV has no kernels here yet.
    bool supports_kv_type(smol_type t) const override {
        return t == SMOL_TYPE_F16 || t == SMOL_TYPE_Q8_0 || t == SMOL_TYPE_Q4_0;
    }
#if defined(SMOL_NCCL)
    // A head split's ALL_REDUCE over NCCL, once join_gpu_group gave this
    // GPU its communicator.
    bool supports_all_reduce() const override {
        return true;
    }
    int device() const {
        return device_;
    }
    // join_gpu_group's communicator: set (replacing one joined before),
    // aborted by abort_gpu_group, destroyed with the backend. Either drops
    // the graphs captured with the old one.
    void set_nccl(ncclComm_t c) {
        if (nccl_) (void)ncclCommDestroy(nccl_);
        nccl_ = c;
        drop_graphs();
    }
    void abort_nccl() {
        if (nccl_) (void)ncclCommAbort(nccl_);
        nccl_ = nullptr;
        drop_graphs();
    }
#endif
    void * alloc(size_t bytes) override;
    void release(void * p) override;
    void upload(void * dst, const void * src, size_t bytes) override;
    void download(void * dst, const void * src, size_t bytes) override;
    void memset(void * dst, int value, size_t bytes) override;
    void * alloc_host(size_t bytes, bool & pinned, const char * what) override;
    void release_host(void * p) override;
    void set_memory_limit(size_t bytes) override {
        mem_.limit = bytes;
    }
    memory_stats memory() const override {
        return mem_;
    }
    size_t compute_bytes(graph & g) override;
    void run(graph & g) override;
    void reserve(graph & g) override;

    std::vector<std::string> mm_candidates(const mm_key & key) const override;
    double mm_time(const mm_key & key, const std::string & candidate) override;
    void mm_choose(const mm_key & key, const std::string & candidate, double us) override;
    std::string mm_table_save(const std::string & path) const override;
    std::string mm_used() const override;
    attend_rates attend_speeds(int32_t head_dim, int32_t q_per_kv, smol_type t) override;

  private:
    struct buffer {
        void * p = nullptr;
        size_t size = 0;
    };
    void grow(buffer & b, size_t bytes, const char * what);
    void grow_host(size_t bytes);
    void activate() const {
        SMOL_GPU_CHECK(cudaSetDevice(device_));
    }

    void make_steps(graph & g);
    const std::vector<const tensor *> & extra_reads(); // per node, of steps_ (plan_arena)
    void prepare(graph & g);
    void stage(graph & g);
    void list_seq_pages(const batch_info & b, const kv_cache & kv);
    void restore_leaves();
    void structure(const graph & g);
    void signature();
    void launch_all(graph & g);
    void fail_if_injected();
    void launch_program(graph & g);
    void launch(const step & s, const batch_info & b);
    void copy_on(const tensor * t, cudaStream_t st);
    // The host stream's nodes (host attention): each a host function on
    // host_stream_ that runs the node on host()'s threads with the batch of
    // the run in flight.
    host_attention & host();
    struct host_job {
        cuda_backend * be;
        int32_t node;
    };
    static void CUDART_CB run_host_job(void * job);
    void launch_host_node(int32_t node);
    void finish_host_nodes();
    double link_rate();
    size_t step_work() const;
    // Counts n more device bytes, or throws with the numbers past the limit.
    void charge(size_t n, const char * what);

    void run_mm(const step & s, const batch_info & b);
    template <class F> cudaGraphExec_t capture_graph(bool pdl, F && launches);
#if defined(SMOL_HAVE_BLAS)
    void blas_gemm(int type, bool pairs, const uint8_t * w, size_t w_row_bytes, int N, int K, int M,
                   float * y, size_t ldy, uint8_t * scratch);
    void blas_mm(int type, const uint8_t * w, size_t w_row_bytes, int N, int K, const float * x,
                 size_t ldx, int M, float * y, size_t ldy);
    // A cuBLAS step's input at the start of the work space, then its
    // scratch (see blas_work_bytes).
    void * blas_input() const {
        return work_.p;
    }
    uint8_t * blas_scratch(bool pairs, int K, int N, int M) const {
        return static_cast<uint8_t *>(work_.p) + blas_scratch_offset(pairs, K, N, M);
    }
    void blas_input_of(bool pairs, const float * x, size_t ldx, int K, int M);
    // A GEMM of blas_gemms: its weights and its output; with pairs left
    // unsummed, where its hi and lo results went (hl).
    struct blas_out {
        int type;
        const uint8_t * w;
        size_t w_row_bytes;
        int N;
        float * y;
        size_t ldy;
        const float * hl = nullptr;
    };
    uint8_t * blas_gemms(bool pairs, bool sum, int K, int M, blas_out * o, int n);
    void run_blas(const step & s, const tensor * x, int K, int M);
#endif
    // The results a cuBLAS step kept as hi and lo (step::keep_pairs) for the
    // kernels that read them: mm t's token m at p + 2 m N, its lo N further.
    // None without cuBLAS.
    struct kept_pair {
        const tensor * t;
        const float * p;
        int N;
    };
    kept_pair kept_[3];
    int n_kept_ = 0;
    size_t kept_end_ = 0; // bytes of the work space the kept results reach
    // A tensor's rows, or where the step before kept them as hi and lo
    // (rows ld apart, lo further).
    struct source {
        const float * p;
        size_t ld, lo;
    };
    source source_of(const tensor * t) const {
        for (int i = 0; i < n_kept_; ++i) {
            const kept_pair & k = kept_[i];
            if (k.t == t) return source{k.p, 2 * size_t(k.N), size_t(k.N)};
        }
        return source{static_cast<const float *>(t->data), t->nb[1] / 4, 0};
    }
    rope_params rope_for(const tensor * rope) const;
    void run_attention(const step & s, const batch_info & b);
    void run_kv_store(const step & s, const batch_info & b);
    kv_store_params kv_store_of(const step & s, const kv_cache & kv) const;
    const tensor * stored_ = nullptr; // the KV_STORE a GEMV of q, k, v has just done
    // Whether a GEMV of these weight bytes prefetches them (see run_mm).
    bool gemv_prefetch(size_t weight_bytes) const {
        return weight_bytes <= l2_bytes_ / 8;
    }
    bool small_mm(const tensor * mm) const;
    bool blas_fits(const tensor * mm) const;
    static mm_key key_of(const tensor * mm);
    mm_choice choose(const mm_key & key) const;
    mm_choice default_small(const mm_key & key) const;
    void note_used(const mm_key & key, const mm_choice & c);
    void load_table();
    size_t attn_splits(const tensor * t, int & Q, int & W) const;
    int flash_splits(const tensor * t) const;
    int decode_splits(const tensor * t) const;
    int decode_blocks(const tensor * t) const;
    struct attn_choice {
        attn_kernel kind = attn_kernel::classic; // decode, flash or classic
        int S = 1, Q = 1, W = 1; // splits over the cells; classic: queries a block, streams a query
        bool warps = false;      // decode over pages: a warp a kv head, unsplit
    };
    attn_choice choose_attention(const tensor * t) const;
    void check_launch(const char * what) const {
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) gpu_fail(e, what);
    }

    int device_;
    std::string name_;
#if defined(SMOL_NCCL)
    ncclComm_t nccl_ = nullptr;
#endif
    int n_sm_ = 1;
    size_t l2_bytes_ = 0;
    bool fuse_ = true;
    bool graphs_ = true;
    bool pdl_ = false;     // kernels may launch while the one before ends (see griddep_wait)
    bool pdl_now_ = false; // ... in the launches being issued now (a decode step's capture)

    attn_kernel attn_ = attn_kernel::automatic;
    int dec_slots_ = 1;             // blocks of the decode attention kernel the GPU holds at once
    cudaStream_t stream_ = nullptr; // compute
    cudaStream_t h2d_ = nullptr;    // PREFETCH copies
    cudaStream_t d2h_ = nullptr;    // OFFLOAD copies
    cudaStream_t host_stream_ = nullptr; // host attention's nodes, as host functions
    cudaEvent_t staged_ = nullptr;       // the last staging copies are done with the pinned buffer
    cudaEvent_t fork_ = nullptr;         // the copy streams start after the compute stream's past
    cudaEvent_t join_[3] = {};           // and the compute stream ends after theirs
    int host_threads_ = 1;
    std::unique_ptr<host_attention> host_att_; // made when first needed
    std::deque<host_job> host_jobs_;           // per node index; addresses stay
    batch_info host_batch_;                    // the batch of the run in flight
    std::mutex host_mu_;
    std::string host_error_; // the run's first failed host node
    // Recorded at the end of a step with host nodes and waited on asleep:
    // a thread spinning in a sync would take a core from the host's pool.
    cudaEvent_t host_done_ = nullptr;
    std::vector<cudaEvent_t> events_; // the schedule's events
    schedule sched_;
    arena_plan probe_;
    memory_stats mem_;
    std::unordered_map<void *, size_t> sizes_;                 // device allocations
    std::unordered_map<void *, std::pair<size_t, bool>> host_; // host: bytes, pinned

    buffer arena_, work_, dyn_, cells_;
    buffer rope_;                       // the run's table of rope angles
    const tensor * rope_key_ = nullptr; // the ROPE node whose angles it holds
    buffer done_;                       // attention's split counters, zero between launches
    void * host_stage_ = nullptr;
    size_t host_stage_size_ = 0;

    // Device addresses of the batch, valid during run.
    int32_t * d_params_ = nullptr; // [0] = n_used
    int32_t * d_pos_ = nullptr;
    int32_t * d_seq_ = nullptr;
    int32_t * d_cell_ = nullptr;
    int32_t * d_cell_pos_ = nullptr;
    uint64_t * d_cell_seqs_ = nullptr; // two planes of n_cells words (attn_params)
    cell_tile * d_cell_tiles_ = nullptr;
    int32_t * d_seq_pages_ = nullptr; // list_seq_pages' lists, when staged
    // The window store's table (batch_info::local, kv_window) and each
    // token's slot: small, staged whole each step; the sliding-window
    // attention that reads it is the classic kernel's, which reads no tile
    // summaries. Its n_used is d_params_[2].
    buffer win_cells_;
    int32_t * d_slot_ = nullptr;
    int32_t * d_win_pos_ = nullptr;
    uint64_t * d_win_seqs_ = nullptr;

    // What the device holds of the cache's cell table, to upload only changes.
    // While the cache's version stays shadow_version_, only the cells a
    // batch takes change (kv_cache::version), so a step compares those, not
    // the whole table; held_ is then the union of the used cells' sequences.
    const kv_cache * shadow_kv_ = nullptr;
    std::vector<int32_t> shadow_pos_;
    std::vector<seq_mask> shadow_seqs_;
    uint64_t shadow_version_ = 0;
    seq_mask held_ = seq_mask::none();
    // Cells whose tile summaries the device lacks: they are made when a
    // graph whose attention reads them is staged: the flash kernel's
    // (flash_steps_, set with the steps), or the decode kernel's over a
    // cache of several sequences.
    int32_t tiles_lo_ = INT32_MAX, tiles_hi_ = 0;
    std::vector<cell_tile> tiles_;                        // the summaries as the device has them
    std::vector<int32_t> pages_begin_, seq_pages_, fill_; // list_seq_pages' lists, scratch
    bool flash_steps_ = false, decode_steps_ = false;
    // Every token of the batch is of a sequence of its own (set with the
    // steps): the decode kernel then walks only each token's pages, and may
    // take more blocks than the GPU holds at once.
    bool seqs_apart_ = false;
    bool kv_quant_ = false; // the planned graph's cache is quantized: never the decode kernel
    // The cache holds cells of several sequences (set when staged): the
    // decode kernel's form that walks pages runs.
    bool pages_ = false;

    std::vector<step> steps_;
    arena_plan plan_;                                  // reused from step to step
    std::vector<const tensor *> extra_reads_;          // what extra_reads() returns
    std::vector<std::pair<tensor *, void *>> swapped_; // host leaves and their host data
    // A graph's structure (structure()), then with the addresses a replay
    // bakes in (signature()). steps_, plan_ and sched_ were made for the
    // graph of the last run, of structure prep_sig_ (while prepared_): a
    // decode step that reruns it (last_) takes them as they are, unless its
    // batch's sequences came apart or together (ran_apart_).
    std::vector<uint64_t> sig_, prev_sig_, prep_sig_;
    bool prepared_ = false;
    last_run last_;
    bool ran_apart_ = false;
    struct captured {
        std::vector<uint64_t> sig;
        cudaGraphExec_t exec;
        uint64_t last_used;
        std::vector<std::pair<mm_key, mm_choice>> mm_used;
    };
    std::vector<captured> execs_;
    uint64_t clock_ = 0;
    void drop_graphs();

    // The matmul kernel table (autotuned, or empty: the defaults) and the
    // kernels the last launched graph used; a replayed graph used what it
    // used when it was captured.
    std::string gpu_name_;
    std::string table_path_;
    std::map<mm_key, mm_choice> table_;
    std::vector<std::pair<mm_key, mm_choice>> used_;
    int replayed_ = -1; // the index in execs_ of the graph the last run replayed
    // Synthetic operands that mm_time launches on.
    buffer tune_w_, tune_x_, tune_y_;
    mm_key tune_w_key_{};
    int tune_x_m_ = 0, tune_x_k_ = 0; // the shape of the activations in tune_x_

#if defined(SMOL_HAVE_BLAS)
    cublasHandle_t blas_ = nullptr;
    buffer blas_ws_;
#endif
};

// What launches() issues on stream_, captured into an instantiated graph; the
// GEMV, KV store and attention kernels launch early if pdl.
template <class F> cudaGraphExec_t cuda_backend::capture_graph(bool pdl, F && launches) {
    SMOL_GPU_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t cg = nullptr;
    pdl_now_ = pdl;
    try {
        launches();
        pdl_now_ = false;
    } catch (...) {
        pdl_now_ = false;
        (void)cudaStreamEndCapture(stream_, &cg);
        if (cg) (void)cudaGraphDestroy(cg);
        (void)cudaGetLastError();
        throw;
    }
    SMOL_GPU_CHECK(cudaStreamEndCapture(stream_, &cg));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, cg, 0);
    (void)cudaGraphDestroy(cg);
    if (e != cudaSuccess) gpu_fail(e, "cudaGraphInstantiate");
    return exec;
}

} // namespace smol::gpu

#endif // SMOL_CUDA_CUH
