// smol-backend.h - the interface a compute backend implements: a memory
// space (allocation and copies in and out of it) and a way to run a graph
// whose tensors live in that space. The CPU backend is smol.c++'s executor;
// the CUDA backend (smol-cuda.cu) and its HIP build implement the same table.

#ifndef SMOL_BACKEND_H
#define SMOL_BACKEND_H

#include "smol-graph.h"

#include <memory>
#include <string>

namespace smol {

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

    // Places the graph's intermediate tensors in this backend's arena (grows
    // it if needed), then runs every node in order. Leaves (weights, inputs,
    // the KV cache) must already live in this backend's memory; g.batch's
    // arrays are host memory the backend reads or copies as it needs.
    virtual void run(graph & g) = 0;
    // Sizes the arena for g without running it, so the first run of a graph
    // no larger than g allocates nothing.
    virtual void reserve(graph & g) = 0;
};

// "cpu", or "cuda" / "cuda:N" where built with SMOL_CUDA; throws smol::error
// (SMOL_ERR_UNSUPPORTED or SMOL_ERR_BACKEND) saying why a device is not there.
std::unique_ptr<backend> make_backend(const std::string & device, int n_threads);
// Defined by smol-cuda.cu in a CUDA build, else refuses with the reason.
std::unique_ptr<backend> make_cuda_backend(int device);

} // namespace smol

#endif // SMOL_BACKEND_H
