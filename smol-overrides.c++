// smol-overrides.c++ - what the library reads from the environment
// (smol-overrides.h); no other library source reads it.

#include "smol-overrides.h"

#include "smol-backend.h"
#include "smol-error.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace smol {

namespace {

// The variable's value, or null when it is unset or empty.
const char * env(const char * name) {
    const char * v = std::getenv(name);
    return v && *v ? v : nullptr;
}

// A switch as the backend has read them: a number, nonzero for on.
void env_switch(const char * name, bool & on) {
    if (const char * v = env(name)) on = std::atoi(v) != 0;
}

} // namespace

void apply_env_overrides(backend_options & o) {
    env_switch("SMOL_CUDA_FUSE", o.fuse);
    env_switch("SMOL_CUDA_GRAPHS", o.graphs);
    env_switch("SMOL_CUDA_PDL", o.pdl);
    if (const char * v = env("SMOL_ATTN")) {
        if (std::strcmp(v, "auto") == 0) {
            o.attn = attn_kernel::automatic;
        } else if (std::strcmp(v, "decode") == 0) {
            o.attn = attn_kernel::decode;
        } else if (std::strcmp(v, "decode-warps") == 0) {
            o.attn = attn_kernel::decode_warps;
        } else if (std::strcmp(v, "flash") == 0) {
            o.attn = attn_kernel::flash;
        } else if (std::strcmp(v, "classic") == 0) {
            o.attn = attn_kernel::classic;
        } else {
            throw error(SMOL_ERR_INVALID_ARGUMENT, std::string("SMOL_ATTN=") + v +
                                                       " names no attention kernel; use auto, "
                                                       "decode, decode-warps, flash or classic");
        }
    }
    if (const char * v = env("SMOL_AUTOTUNE_FILE")) o.autotune_file = v;
}

std::string cache_dir() {
    if (const char * x = env("XDG_CACHE_HOME")) return (std::filesystem::path(x) / "smol").string();
    if (const char * h = env("HOME"))
        return (std::filesystem::path(h) / ".cache" / "smol").string();
    return (std::filesystem::temp_directory_path() / "smol").string();
}

std::string cpu_kernels_override() {
    const char * v = env("SMOL_CPU_KERNELS");
    return v ? v : "";
}

int cpu_prefetch_override() {
    const char * v = env("SMOL_CPU_PREFETCH");
    if (!v) return -1;
    return std::strcmp(v, "0") != 0 ? 1 : 0;
}

} // namespace smol
