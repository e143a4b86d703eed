// smol-host-memory.h - host memory of the backends that compute on the CPU
// (the CPU backend and the simulated device): 64-byte aligned allocations,
// the host blocks they hand out as pinned memory, and the ledger of their
// allocations against a byte limit.

#ifndef SMOL_HOST_MEMORY_H
#define SMOL_HOST_MEMORY_H

#include "smol-backend.h"
#include "smol-error.h"
#include "smol-faults.h"
#include "smol-plan.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <unordered_map>

namespace smol {

inline size_t align64(size_t n) {
    return (n + 63) & ~size_t(63);
}

// 64-byte aligned host memory for `what`; throws smol::error (out of memory,
// naming what and the size) rather than returning null.
void * host_alloc(size_t bytes, const char * what);

// The host blocks a CPU-side backend hands out through alloc_host (its
// "pinned" memory, or pageable where pinning was refused), counted in its
// stats; what a caller left is freed with the backend.
class host_blocks {
  public:
    host_blocks() = default;
    host_blocks(const host_blocks &) = delete;
    host_blocks & operator=(const host_blocks &) = delete;
    ~host_blocks() {
        for (auto & b : blocks_) std::free(b.first);
    }
    void * alloc(size_t bytes, const char * what, memory_stats & st, bool pinned = true) {
        void * p = host_alloc(bytes, (std::string("host memory for ") + what).c_str());
        blocks_[p] = {bytes, pinned};
        (pinned ? st.host_pinned : st.host_pageable) += bytes;
        return p;
    }
    void release(void * p, memory_stats & st) {
        const auto it = blocks_.find(p);
        if (it != blocks_.end()) {
            (it->second.pinned ? st.host_pinned : st.host_pageable) -= it->second.bytes;
            blocks_.erase(it);
        }
        std::free(p);
    }

  private:
    struct block {
        size_t bytes;
        bool pinned;
    };
    std::unordered_map<void *, block> blocks_;
};

// Allocations by address and the bytes they hold, against an optional limit.
// The blocks (host_alloc's) a caller never released, such as those of a
// context whose making failed halfway, are freed with the ledger.
class memory_ledger {
  public:
    memory_ledger() = default;
    memory_ledger(const memory_ledger &) = delete;
    memory_ledger & operator=(const memory_ledger &) = delete;
    ~memory_ledger() {
        for (auto & b : sizes_) std::free(b.first);
    }
    void add(void * p, size_t n) {
        sizes_[p] = n;
        stats_.in_use += n;
        stats_.peak = std::max(stats_.peak, stats_.in_use);
    }
    size_t remove(void * p) {
        const auto it = sizes_.find(p);
        if (it == sizes_.end()) return 0;
        const size_t n = it->second;
        stats_.in_use -= n;
        sizes_.erase(it);
        return n;
    }
    // Throws, with the numbers, when n more bytes would pass the limit (or
    // a test refuses the allocation: smol-faults.h).
    void check(const char * space, size_t n, const char * what) const {
        if (faults::hit(faults::site::device_alloc)) {
            throw error(SMOL_ERR_OUT_OF_MEMORY, std::string(space) + ": cannot allocate " +
                                                    format_bytes(n) + " of " + what +
                                                    ": refused (an injected fault)");
        }
        if (stats_.limit && stats_.in_use + n > stats_.limit) {
            throw error(SMOL_ERR_OUT_OF_MEMORY, std::string(space) + ": cannot allocate " +
                                                    format_bytes(n) + " of " + what + ": " +
                                                    format_bytes(stats_.in_use) + " of its " +
                                                    format_bytes(stats_.limit) + " are in use");
        }
    }
    // The executor's buffers, which grow in place of one another.
    void set_compute(const char * space, size_t n) {
        if (n > compute_) {
            stats_.in_use -= compute_;
            check(space, n, "compute memory");
            stats_.in_use += n;
            compute_ = n;
            stats_.peak = std::max(stats_.peak, stats_.in_use);
        }
    }
    memory_stats stats_;

  private:
    std::unordered_map<void *, size_t> sizes_;
    size_t compute_ = 0;
};

} // namespace smol

#endif // SMOL_HOST_MEMORY_H
