// fuzz-sentencepiece.c++ - libFuzzer target: any bytes as a SentencePiece
// tokenizer.model through smol-convert's protobuf reader (varints, lengths,
// wire types, pieces, scores, types). The bytes are refused with
// convert_error, or every piece read has a type of 1 to 6. A crash, another
// exception, a sanitizer report or a hang is a defect.

#include "safetensors.h"
#include "sentencepiece-model.h"

#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    try {
        const auto pieces = smol::convert::parse_sentencepiece_model(data, size, "fuzz.model");
        for (const auto & p : pieces) {
            const int t = int(p.type);
            if (t < 1 || t > 6) std::abort();
        }
    } catch (const smol::convert::convert_error &) {
    }
    return 0;
}
