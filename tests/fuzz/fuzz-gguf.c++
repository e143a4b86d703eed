// fuzz-gguf.c++ - libFuzzer target: any bytes as a GGUF file through
// gguf-io's reader (header, metadata of every type, tensor infos, data
// bounds), mapped or read. The file is refused with gguf::error, or it opens
// and every value, typed look-up and tensor byte range can be read. A crash,
// a sanitizer report, an allocation past -malloc_limit_mb or a hang is a
// defect.

#include "fuzz-input.h"
#include "gguf.h"

#include <cstdint>

namespace {

uint64_t touch(const gguf::value & v) {
    uint64_t h = v.u ^ uint64_t(v.i) ^ v.str.size();
    for (const auto & e : v.arr) h += touch(e);
    return h;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string & path = fuzz::as_file(data, size, "gguf");
    try {
        auto f = gguf::file::open(path, size % 2 == 0);
        volatile uint64_t sink = 0;
        for (const auto & kv : f->metadata()) {
            sink = sink + touch(kv.val);
            try {
                sink = sink + f->get_u64(kv.key).value_or(0);
            } catch (const gguf::error &) {
            }
            try {
                sink = sink + f->get_str(kv.key).value_or("").size();
            } catch (const gguf::error &) {
            }
        }
        for (const auto & t : f->tensors()) {
            const auto * p = static_cast<const uint8_t *>(t.data);
            if (t.nbytes > 0) sink = sink + p[0] + p[t.nbytes - 1];
            sink = sink + uint64_t(t.n_elements());
        }
    } catch (const gguf::error &) {
    }
    return 0;
}
