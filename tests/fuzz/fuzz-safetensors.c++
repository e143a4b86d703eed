// fuzz-safetensors.c++ - libFuzzer target: any bytes as a safetensors file
// through smol-convert's reader (header length, JSON header, dtypes,
// shapes, data_offsets, overlaps). The file is refused with convert_error,
// or it opens and every tensor's first and last byte can be read. A crash,
// another exception, a sanitizer report or a hang is a defect.

#include "fuzz-input.h"
#include "safetensors.h"

#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string & path = fuzz::as_file(data, size, "safetensors");
    try {
        auto f = smol::convert::st_file::open(path);
        volatile uint64_t sink = 0;
        for (const auto & t : f->tensors()) {
            if (t.nbytes > 0) sink = sink + t.data[0] + t.data[t.nbytes - 1];
            sink = sink + uint64_t(t.n_elements()) + t.name.size();
        }
    } catch (const smol::convert::convert_error &) {
    }
    return 0;
}
