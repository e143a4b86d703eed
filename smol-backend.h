// smol-backend.h - the interface a compute backend implements: a memory
// space (allocation under an optional byte limit, copies in and out of it),
// host memory it copies from fast (pinned), and a way to run a graph whose
// tensors live in that space, its copy nodes on their own streams. The CPU
// backend (smol-cpu.c++) and the simulated device (smol-sim.c++) run graphs
// on the CPU's executor; the CUDA backend (smol-cuda.cu) and its HIP build
// implement the same table.

#ifndef SMOL_BACKEND_H
#define SMOL_BACKEND_H

#include "smol-graph.h"
#include "smol-plan.h"

#include <iterator>
#include <memory>
#include <string>
#include <vector>

namespace smol {

// A matmul as a device backend's kernel table sees it: the weight type, the
// rows N of the launch (all weights of a fused launch together; gate and up
// of a fused SwiGLU count twice), the width K, and the batch bucket M, the
// smallest of mm_buckets that holds the batch's tokens.
struct mm_key {
    smol_type type = SMOL_TYPE_F32;
    int64_t n = 0, k = 0;
    int m = 1;
    bool operator<(const mm_key & o) const {
        if (type != o.type) return type < o.type;
        if (n != o.n) return n < o.n;
        if (k != o.k) return k < o.k;
        return m < o.m;
    }
    bool operator==(const mm_key & o) const = default;
};
inline constexpr int mm_buckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 512};
inline int mm_bucket(int64_t n_tokens) {
    for (int b : mm_buckets) {
        if (n_tokens <= b) return b;
    }
    return mm_buckets[std::size(mm_buckets) - 1];
}
// What a backend's memory holds now and at most, in bytes.
struct memory_stats {
    size_t limit = 0;  // device bytes allowed (0: no limit)
    size_t in_use = 0; // device bytes held now: allocations, arena, work space
    size_t peak = 0;   // the most in_use has been
    size_t host_pinned = 0;
    size_t host_pageable = 0; // asked for pinned, got pageable
};

// What a backend that reruns graphs keeps of its last run: a graph handed
// over again (graph::rerun) is run as that run left it only when it is that
// graph still (generations are never repeated) and that run ended well.
struct last_run {
    uint64_t generation = 0; // 0: no run to take again
    bool again(const graph & g) const { return g.rerun && generation == g.generation(); }
    void forget() { generation = 0; }
    void ended(const graph & g) { generation = g.generation(); }
};

// Which attention kernel a device runs: by the step's token count
// (automatic), or one for every step, so that they can be compared on one
// device. decode_warps is the decode kernel with a warp a kv head over any
// cache of several sequences (automatic takes it for large batches).
enum class attn_kernel : uint8_t { automatic, decode, decode_warps, flash, classic };

// How a device backend runs, fixed when it is created. Each default is what
// a backend does unless told otherwise; the CPU backend has none of these.
// A context fills them from smol_context_params; the developer overrides
// of the environment (smol-overrides.c++) go on top in make_backend.
struct backend_options {
    bool fuse = true;   // fused launches: norm+matmul, rope+KV store, SwiGLU
    bool graphs = true; // decode steps captured once and replayed as graphs
    bool pdl = true;    // programmatic dependent launch, where the GPU has it
    attn_kernel attn = attn_kernel::automatic;
    std::string autotune_file; // the matmul table; "": the default path
    int host_threads = 1;      // the host's attention of offloaded KV
};

class backend {
  public:
    virtual ~backend() = default;
    virtual const char * name() const = 0; // "cpu", "cuda:0"
    virtual placement where() const = 0;
    // Tokens one decode call takes when the caller leaves n_batch at 0:
    // what keeps this backend's prompt matmuls efficient.
    virtual uint32_t default_batch() const { return 512; }
    // Whether attention reads each sequence's cells as a list sorted by
    // position (batch_info::seq_cells; the CPU's kernels), which costs the
    // host a pass over the cache a step. A GPU reads the cell table.
    virtual bool wants_seq_cells() const { return true; }
    // Whether its KV_STORE and ATTENTION follow a local view to the window
    // store's batch (batch_info::local, kv_view::local). Without, a context
    // keeps every position for sliding-window layers (as swa_full).
    virtual bool supports_window_store() const { return true; }
    // Whether its ATTENTION kernels see a window's sinks (attn_opts::sink):
    // streaming heads.
    virtual bool supports_attention_sinks() const { return true; }
    // Whether run() may be given the graph of its last run again, neither
    // cleared nor changed but for its batch (positions, sequences, cells),
    // and run it as before. Elsewhere a decode step builds its graph anew.
    virtual bool reruns_graphs() const { return false; }
    // Whether this backend multiplies with (and gathers rows of) weights of
    // type t; a context refuses a model with others before allocating.
    virtual bool supports_weights(smol_type) const { return true; }
    // Whether its KV_STORE and ATTENTION kernels take a cache of type t
    // (kv_cache::type: F16, Q8_0 or Q4_0).
    virtual bool supports_kv_type(smol_type) const { return true; }
    // Whether it runs ALL_REDUCE nodes (a head split's rank), and how: over
    // the host memory its graphs live in, with the graph's in-process
    // collective (smol-collective.h: the CPU and the simulated device), or
    // on a GPU with its group's communicator (join_gpu_group: NCCL).
    virtual bool supports_all_reduce() const { return false; }
    virtual bool reduces_in_process() const { return false; }

    // The speeds by which a plan splits offloaded groups between streaming
    // and the host's attention (smol-host-attention.h) over a cache of this
    // shape and type, measured once; none: nothing to measure (a device with
    // no link streams every offloaded group unless told otherwise).
    virtual attend_rates attend_speeds(int32_t /*head_dim*/, int32_t /*q_per_kv*/, smol_type) {
        return {};
    }

    // Memory of this backend. alloc throws smol::error (out of memory, with
    // the sizes) rather than returning null.
    virtual void * alloc(size_t bytes) = 0;
    virtual void release(void * p) = 0;
    // Synchronous copies between host memory and this backend's memory.
    virtual void upload(void * dst, const void * src, size_t bytes) = 0;
    virtual void download(void * dst, const void * src, size_t bytes) = 0;
    virtual void memset(void * dst, int value, size_t bytes) = 0;

    // Host memory that copies to and from the device use (offloaded KV,
    // the logits a step downloads), pinned where the device has such a
    // thing so copies run at the link's speed; `pinned` says whether it is,
    // `what` names the use in messages. Large blocks: callers take arenas,
    // not one block per tensor.
    virtual void * alloc_host(size_t bytes, bool & pinned, const char * what) = 0;
    virtual void release_host(void * p) = 0;
    // Caps device memory: an allocation past it throws with the numbers.
    virtual void set_memory_limit(size_t bytes) = 0;
    virtual memory_stats memory() const = 0;
    // The device bytes a run of g holds beyond its leaves (arena, work
    // space, staging), without allocating them.
    virtual size_t compute_bytes(graph & g) = 0;

    // Places the graph's intermediate tensors in this backend's arena (grows
    // it if needed), then runs every node in order. Leaves (weights, inputs,
    // the KV cache) must already live in this backend's memory; g.batch's
    // arrays are host memory the backend reads or copies as it needs.
    virtual void run(graph & g) = 0;
    // Sizes the arena for g without running it, so the first run of a graph
    // no larger than g allocates nothing.
    virtual void reserve(graph & g) = 0;

    // Matmul kernel choice, for backends that have one (the CPU has none).
    // A candidate is named as the autotune table writes it ("gemv mt=1
    // ks=2", "smallbatch mt=8 ks=1", "cublas").
    virtual std::vector<std::string> mm_candidates(const mm_key &) const { return {}; }
    // Microseconds one launch of a candidate takes on synthetic weights of
    // the key's shape (and M = the bucket's tokens).
    virtual double mm_time(const mm_key &, const std::string & /*candidate*/) { return -1; }
    // Makes this backend's table choose a candidate for a key.
    virtual void mm_choose(const mm_key &, const std::string & /*candidate*/, double /*us*/) {}
    // Writes the table to path ("": the file the backend reads at start-up)
    // and returns where it went.
    virtual std::string mm_table_save(const std::string & /*path*/) const { return {}; }
    // The matmul kernels of the last graph run: one "type NxK M=m: kernel"
    // line for each distinct choice.
    virtual std::string mm_used() const { return {}; }
};

// "cpu", "sim" (a simulated device: a second memory space under a byte
// limit, computed by the CPU, copies on a thread of its own), or "cuda" /
// "cuda:N" where built with SMOL_CUDA; throws smol::error
// (SMOL_ERR_UNSUPPORTED or SMOL_ERR_BACKEND) saying why a device is not there.
// For a GPU, the environment's developer overrides (apply_env_overrides) go
// on top of options here, for every backend a context or smol_autotune makes.
std::unique_ptr<backend> make_backend(const std::string & device, int n_threads,
                                      const backend_options & options = {});
// Defined by smol-cuda.cu in a CUDA build, else refuses with the reason.
// Takes options as they are (no environment).
std::unique_ptr<backend> make_cuda_backend(int device, const backend_options & options = {});
// The simulated device (smol-sim.c++), for make_backend's "sim".
std::unique_ptr<backend> make_sim_backend(int n_threads);

// The GPUs of a head split (their backends, in rank order) as one group for
// their ALL_REDUCE nodes: an NCCL communicator each, NVLink multicast off.
// Throws smol::error saying why not (a GPU listed twice, a build without
// NCCL). abort_gpu_group, when a rank failed a step, stops the others'
// all-reduces (NCCL's abort) and leaves the group to be joined again.
// Defined by smol-cuda.cu in a CUDA build.
void join_gpu_group(const std::vector<backend *> & ranks);
void abort_gpu_group(const std::vector<backend *> & ranks);

} // namespace smol

#endif // SMOL_BACKEND_H
