// smol-host-memory.c++ - the aligned host allocation of the CPU-side
// backends (smol-host-memory.h holds the rest).

#include "smol-host-memory.h"

#include "smol-error.h"
#include "smol-plan.h"

#include <algorithm>
#include <cstdlib>

namespace smol {

void * host_alloc(size_t bytes, const char * what) {
    void * p = std::aligned_alloc(64, align64(std::max<size_t>(bytes, 1)));
    if (!p) {
        throw error(SMOL_ERR_OUT_OF_MEMORY,
                    "cannot allocate " + format_bytes(bytes) + " of " + what);
    }
    return p;
}

} // namespace smol
