// smol-backend.h - the interface a compute backend implements: a memory
// space (allocation under an optional byte limit, copies in and out of it),
// host memory it copies from fast (pinned), and a way to run a graph whose
// tensors live in that space, its copy nodes on their own streams. The CPU
// backend and the simulated device are smol.c++'s executor; the CUDA backend
// (smol-cuda.cu) and its HIP build implement the same table.

#ifndef SMOL_BACKEND_H
#define SMOL_BACKEND_H

#include "smol-graph.h"

#include <memory>
#include <string>

namespace smol {

// What a backend's memory holds now and at most, in bytes.
struct memory_stats {
    size_t limit = 0;  // device bytes allowed (0: no limit)
    size_t in_use = 0; // device bytes held now: allocations, arena, work space
    size_t peak = 0;   // the most in_use has been
    size_t host_pinned = 0;
    size_t host_pageable = 0; // asked for pinned, got pageable
};

class backend {
  public:
    virtual ~backend() = default;
    virtual const char * name() const = 0; // "cpu", "cuda:0"
    virtual placement where() const = 0;

    // Memory of this backend. alloc throws smol::error (out of memory, with
    // the sizes) rather than returning null.
    virtual void * alloc(size_t bytes) = 0;
    virtual void release(void * p) = 0;
    // Synchronous copies between host memory and this backend's memory.
    virtual void upload(void * dst, const void * src, size_t bytes) = 0;
    virtual void download(void * dst, const void * src, size_t bytes) = 0;
    virtual void memset(void * dst, int value, size_t bytes) = 0;

    // Host memory for offloaded KV, pinned where the device has such a
    // thing so copies run at the link's speed; `pinned` says whether it is.
    // Large blocks: callers take arenas, not one block per tensor.
    virtual void * alloc_host(size_t bytes, bool & pinned) = 0;
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
};

// "cpu", "sim" (a simulated device: a second memory space under a byte
// limit, computed by the CPU, copies on a thread of its own), or "cuda" /
// "cuda:N" where built with SMOL_CUDA; throws smol::error
// (SMOL_ERR_UNSUPPORTED or SMOL_ERR_BACKEND) saying why a device is not there.
std::unique_ptr<backend> make_backend(const std::string & device, int n_threads);
// Defined by smol-cuda.cu in a CUDA build, else refuses with the reason.
std::unique_ptr<backend> make_cuda_backend(int device);

} // namespace smol

#endif // SMOL_BACKEND_H
