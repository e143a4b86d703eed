// smol-overrides.h - what the library reads from the environment, the one
// place it does: developer overrides (SMOL_* variables, to steer a backend
// or the CPU kernels without rebuilding a program; users set options in
// smol_context_params instead, and these go on top of them) and the
// user's cache folder.

#ifndef SMOL_OVERRIDES_H
#define SMOL_OVERRIDES_H

#include <string>

namespace smol {

struct backend_options; // smol-backend.h

// Applies SMOL_CUDA_FUSE, SMOL_CUDA_GRAPHS, SMOL_CUDA_PDL (0 or 1), SMOL_ATTN (auto, decode,
// decode-warps, flash, classic) and SMOL_AUTOTUNE_FILE (a path) to options, where set and not
// empty. Throws smol::error (SMOL_ERR_INVALID_ARGUMENT) for a SMOL_ATTN it does not know.
void apply_env_overrides(backend_options & options);

// smol's folder for files it keeps between runs: $XDG_CACHE_HOME/smol,
// else ~/.cache/smol, else smol in the temporary folder.
std::string cache_dir();

// SMOL_CPU_KERNELS: the CPU kernel variant to force ("": none).
std::string cpu_kernels_override();
// SMOL_CPU_PREFETCH: 1 forces decode's software prefetch on, 0 off, -1 unset.
int cpu_prefetch_override();

} // namespace smol

#endif // SMOL_OVERRIDES_H
