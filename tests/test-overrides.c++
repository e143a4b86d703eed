// test-overrides.c++ - the developer overrides of the environment
// (smol-overrides.c++): each variable sets what it names on top of the
// options, an unset or empty one leaves them, and a value they do not know
// is refused with a clear message; and the cache folder. The only suite
// that sets the environment.

#include "smol-backend.h"
#include "smol-error.h"
#include "smol-overrides.h"

#include <cstdlib>
#include <doctest/doctest.h>
#include <memory>
#include <string>
#include <utility>

namespace {

const char * const all_vars[] = {"SMOL_CUDA_FUSE",   "SMOL_CUDA_GRAPHS",   "SMOL_CUDA_PDL",
                                 "SMOL_ATTN",        "SMOL_AUTOTUNE_FILE", "SMOL_CPU_KERNELS",
                                 "SMOL_CPU_PREFETCH"};

// Unsets every override when made and when gone, so cases do not leak.
struct clean_env {
    clean_env() { clear(); }
    ~clean_env() { clear(); }
    static void clear() {
        for (const char * v : all_vars) unsetenv(v);
    }
};

smol::backend_options overridden(smol::backend_options o = {}) {
    smol::apply_env_overrides(o);
    return o;
}

} // namespace

TEST_CASE("with no overrides set the options stay as given") {
    clean_env env;
    const smol::backend_options d = overridden();
    CHECK(d.fuse);
    CHECK(d.graphs);
    CHECK(d.pdl);
    CHECK(d.attn == smol::attn_kernel::automatic);
    CHECK(d.autotune_file.empty());
    smol::backend_options given;
    given.fuse = false;
    given.graphs = false;
    given.attn = smol::attn_kernel::flash;
    given.autotune_file = "/tmp/given.txt";
    const smol::backend_options o = overridden(given);
    CHECK_FALSE(o.fuse);
    CHECK_FALSE(o.graphs);
    CHECK(o.pdl);
    CHECK(o.attn == smol::attn_kernel::flash);
    CHECK(o.autotune_file == "/tmp/given.txt");
    CHECK(smol::cpu_kernels_override().empty());
    CHECK(smol::cpu_prefetch_override() == -1);
}

TEST_CASE("SMOL_CUDA_FUSE, SMOL_CUDA_GRAPHS and SMOL_CUDA_PDL switch what they name") {
    clean_env env;
    setenv("SMOL_CUDA_FUSE", "0", 1);
    setenv("SMOL_CUDA_GRAPHS", "0", 1);
    setenv("SMOL_CUDA_PDL", "0", 1);
    smol::backend_options o = overridden();
    CHECK_FALSE(o.fuse);
    CHECK_FALSE(o.graphs);
    CHECK_FALSE(o.pdl);
    smol::backend_options off;
    off.fuse = off.graphs = off.pdl = false;
    setenv("SMOL_CUDA_FUSE", "1", 1);
    setenv("SMOL_CUDA_GRAPHS", "", 1); // empty: not set
    o = overridden(off);
    CHECK(o.fuse);
    CHECK_FALSE(o.graphs);
    CHECK_FALSE(o.pdl);
}

TEST_CASE("SMOL_ATTN names the attention kernel, and a bad name is refused clearly") {
    clean_env env;
    const std::pair<const char *, smol::attn_kernel> names[] = {
        {"auto", smol::attn_kernel::automatic},
        {"decode", smol::attn_kernel::decode},
        {"decode-warps", smol::attn_kernel::decode_warps},
        {"flash", smol::attn_kernel::flash},
        {"classic", smol::attn_kernel::classic},
    };
    for (const auto & entry : names) {
        const char * name = entry.first;
        const smol::attn_kernel kind = entry.second;
        CAPTURE(std::string(name));
        setenv("SMOL_ATTN", name, 1);
        smol::backend_options given;
        given.attn = smol::attn_kernel::classic;
        if (kind == smol::attn_kernel::classic) given.attn = smol::attn_kernel::flash;
        CHECK(overridden(given).attn == kind);
    }
    setenv("SMOL_ATTN", "fast", 1);
    try {
        overridden();
        FAIL("SMOL_ATTN=fast was taken");
    } catch (const smol::error & e) {
        CHECK(e.status == SMOL_ERR_INVALID_ARGUMENT);
        const std::string m = e.what();
        CHECK(m.find("SMOL_ATTN=fast names no attention kernel") != std::string::npos);
        CHECK(m.find("decode-warps") != std::string::npos);
    }
}

TEST_CASE("SMOL_AUTOTUNE_FILE replaces the autotune file the options name") {
    clean_env env;
    setenv("SMOL_AUTOTUNE_FILE", "/tmp/from-env.txt", 1);
    CHECK(overridden().autotune_file == "/tmp/from-env.txt");
    smol::backend_options given;
    given.autotune_file = "/tmp/given.txt";
    CHECK(overridden(given).autotune_file == "/tmp/from-env.txt");
}

TEST_CASE("SMOL_CPU_KERNELS and SMOL_CPU_PREFETCH are read as the CPU kernels read them") {
    clean_env env;
    setenv("SMOL_CPU_KERNELS", "generic", 1);
    CHECK(smol::cpu_kernels_override() == "generic");
    setenv("SMOL_CPU_PREFETCH", "1", 1);
    CHECK(smol::cpu_prefetch_override() == 1);
    setenv("SMOL_CPU_PREFETCH", "0", 1);
    CHECK(smol::cpu_prefetch_override() == 0);
    setenv("SMOL_CPU_PREFETCH", "yes", 1); // anything but "0" is on, as before
    CHECK(smol::cpu_prefetch_override() == 1);
    setenv("SMOL_CPU_PREFETCH", "", 1);
    CHECK(smol::cpu_prefetch_override() == -1);
}

TEST_CASE("make_backend puts the overrides on a GPU's options, and a bad one stops it clearly") {
    clean_env env;
    setenv("SMOL_ATTN", "fast", 1);
    // Read before any device is opened, so this holds with or without a GPU.
    std::string message;
    try {
        smol::make_backend("cuda:0", 1);
    } catch (const smol::error & e) {
        CHECK(e.status == SMOL_ERR_INVALID_ARGUMENT);
        message = e.what();
    }
    INFO(message);
    CHECK(message.find("SMOL_ATTN=fast") != std::string::npos);
    CHECK(message.find("flash") != std::string::npos);
    // The CPU has none of these options, and does not read them.
    CHECK(smol::make_backend("cpu", 1) != nullptr);
    CHECK(smol::make_backend("sim", 1) != nullptr);
}

TEST_CASE("the cache folder is XDG_CACHE_HOME's, else HOME's .cache, else the temporary one") {
    const char * xdg = std::getenv("XDG_CACHE_HOME");
    const char * home = std::getenv("HOME");
    const std::string saved_xdg = xdg ? xdg : "", saved_home = home ? home : "";
    setenv("XDG_CACHE_HOME", "/x/cache", 1);
    setenv("HOME", "/h", 1);
    CHECK(smol::cache_dir() == "/x/cache/smol");
    setenv("XDG_CACHE_HOME", "", 1); // empty: not set
    CHECK(smol::cache_dir() == "/h/.cache/smol");
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    CHECK(smol::cache_dir().size() > std::string("smol").size());
    CHECK(smol::cache_dir().find("/h/") == std::string::npos);
    if (xdg) setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1);
    if (home) setenv("HOME", saved_home.c_str(), 1);
}
