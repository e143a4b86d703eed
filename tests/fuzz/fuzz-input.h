// fuzz-input.h - what the fuzz targets share: the input bytes written to a
// file of this process's own, since the GGUF reader and the model loader
// take a path.

#ifndef SMOL_FUZZ_INPUT_H
#define SMOL_FUZZ_INPUT_H

#include <cstdint>
#include <cstdio>
#include <string>
#include <unistd.h>

namespace fuzz {

// Writes the input to a file of this process (rewritten for every input)
// and returns its path.
inline const std::string & as_file(const uint8_t * data, size_t size, const char * name) {
    static const std::string path =
        std::string("/tmp/smol-fuzz-") + name + "-" + std::to_string(getpid()) + ".gguf";
    FILE * f = std::fopen(path.c_str(), "wb");
    if (!f) __builtin_trap(); // the fuzzer's machine, not the input, is at fault
    if (size > 0 && std::fwrite(data, 1, size, f) != size) __builtin_trap();
    std::fclose(f);
    return path;
}

} // namespace fuzz

#endif // SMOL_FUZZ_INPUT_H
