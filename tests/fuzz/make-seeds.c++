// make-seeds.c++ - writes the fuzz targets' seed corpus: small llama GGUF
// files with random weights (tests/tiny-model.h), one per weight type, so
// that the fuzzers start from files that load and mutate them from there.
// Generated, never committed.

#include "tiny-model.h"

#include <cstdio>
#include <string>

int main(int argc, char ** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: make-seeds DIR\n");
        return 2;
    }
    const std::string dir = argv[1];
    int i = 0;
    for (smol_type t : {SMOL_TYPE_F32, SMOL_TYPE_F16, SMOL_TYPE_Q8_0, SMOL_TYPE_Q4_1}) {
        tiny::shape s;
        s.n_embd = 32;
        s.n_head = 2;
        s.n_head_kv = 1;
        s.n_ff = 32;
        s.n_layer = 1;
        s.wtype = t;
        tiny::write(dir + "/seed-" + std::to_string(i) + ".gguf", s, uint32_t(i + 1));
        ++i;
    }
    return 0;
}
