// sentencepiece-model.h - the pieces of a SentencePiece tokenizer.model
// (its ModelProto, protobuf's wire format) read without protobuf: each
// piece's text, score and type; every other field skipped. Hostile input
// (truncated fields, overlong varints, lengths past the end, wire types
// protobuf no longer uses) is refused with convert_error naming the file.

#ifndef SMOL_CONVERT_SENTENCEPIECE_MODEL_H
#define SMOL_CONVERT_SENTENCEPIECE_MODEL_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace smol::convert {

// SentencePiece's ModelProto.SentencePiece.Type.
enum class sp_type : int32_t {
    NORMAL = 1,
    UNKNOWN = 2,
    CONTROL = 3,
    USER_DEFINED = 4,
    UNUSED = 5,
    BYTE = 6,
};

struct sp_piece {
    std::string piece;
    float score = 0.0f;             // absent: 0, as protobuf's default
    sp_type type = sp_type::NORMAL; // absent: NORMAL, as the .proto says
};

// The pieces of a serialized ModelProto; name is the file, for errors.
std::vector<sp_piece> parse_sentencepiece_model(const uint8_t * data, size_t size,
                                                const std::string & name);

// The pieces of the tokenizer.model at path.
std::vector<sp_piece> read_sentencepiece_model(const std::string & path);

} // namespace smol::convert

#endif // SMOL_CONVERT_SENTENCEPIECE_MODEL_H
