// sentencepiece-model.c++ - see sentencepiece-model.h. Only ModelProto's
// field 1 (repeated SentencePiece) is read; inside it, field 1 (piece),
// 2 (score, a fixed32 float) and 3 (type, a varint enum). Unknown fields of
// wire types 0 (varint), 1 (fixed64), 2 (length-delimited) and 5 (fixed32)
// are skipped, as protobuf skips them.

#include "sentencepiece-model.h"

#include "safetensors.h"

#include <cstring>
#include <fstream>
#include <iterator>

namespace smol::convert {

namespace {

struct reader {
    const uint8_t * p;
    const uint8_t * end;
    const std::string & name;
    const char * where; // "ModelProto" or "a SentencePiece"

    [[noreturn]] void fail(const std::string & why) const {
        throw convert_error(name + ": is not a SentencePiece model: " + why + " in " + where);
    }
    bool done() const { return p == end; }
    uint64_t varint() {
        uint64_t v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            if (p == end) fail("a varint runs past the end");
            const uint8_t b = *p++;
            if (shift == 63 && (b & 0x7e)) fail("a varint overflows 64 bits");
            v |= uint64_t(b & 0x7f) << shift;
            if (!(b & 0x80)) return v;
        }
        fail("a varint is longer than 10 bytes");
    }
    const uint8_t * take(uint64_t n, const char * what) {
        if (n > uint64_t(end - p))
            fail(std::string(what) + " of " + std::to_string(n) + " bytes runs past the end");
        const uint8_t * at = p;
        p += n;
        return at;
    }
    void skip(uint32_t wire) {
        switch (wire) {
        case 0:
            varint();
            return;
        case 1:
            take(8, "a fixed64 field");
            return;
        case 2:
            take(varint(), "a length-delimited field");
            return;
        case 5:
            take(4, "a fixed32 field");
            return;
        default:
            fail("wire type " + std::to_string(wire) + " is not one protobuf writes");
        }
    }
};

sp_piece parse_piece(const uint8_t * data, size_t size, const std::string & name, size_t index) {
    const std::string where = "piece " + std::to_string(index);
    reader r{data, data + size, name, where.c_str()};
    sp_piece out;
    while (!r.done()) {
        const uint64_t key = r.varint();
        const uint64_t field = key >> 3;
        const uint32_t wire = uint32_t(key & 7);
        if (field == 1 && wire == 2) {
            const uint64_t n = r.varint();
            const uint8_t * s = r.take(n, "the piece text");
            out.piece.assign(reinterpret_cast<const char *>(s), size_t(n));
        } else if (field == 2 && wire == 5) {
            const uint8_t * s = r.take(4, "the score");
            const uint32_t bits =
                uint32_t(s[0]) | uint32_t(s[1]) << 8 | uint32_t(s[2]) << 16 | uint32_t(s[3]) << 24;
            std::memcpy(&out.score, &bits, 4);
        } else if (field == 3 && wire == 0) {
            const uint64_t t = r.varint();
            if (t < 1 || t > 6)
                r.fail("type " + std::to_string(t) + " is not a SentencePiece type (1 to 6)");
            out.type = sp_type(t);
        } else if (field >= 1 && field <= 3) {
            r.fail("field " + std::to_string(field) + " has wire type " + std::to_string(wire));
        } else {
            r.skip(wire);
        }
    }
    return out;
}

} // namespace

std::vector<sp_piece> parse_sentencepiece_model(const uint8_t * data, size_t size,
                                                const std::string & name) {
    reader r{data, data + size, name, "ModelProto"};
    std::vector<sp_piece> pieces;
    while (!r.done()) {
        const uint64_t key = r.varint();
        const uint64_t field = key >> 3;
        const uint32_t wire = uint32_t(key & 7);
        if (field == 0) r.fail("field number 0");
        if (field == 1) {
            if (wire != 2) r.fail("field 1 (pieces) has wire type " + std::to_string(wire));
            const uint64_t n = r.varint();
            const uint8_t * s = r.take(n, "a piece");
            pieces.push_back(parse_piece(s, size_t(n), name, pieces.size()));
        } else {
            r.skip(wire);
        }
    }
    if (pieces.empty()) r.fail("there are no pieces");
    return pieces;
}

std::vector<sp_piece> read_sentencepiece_model(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw convert_error(path + ": cannot be read");
    const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in),
                                     std::istreambuf_iterator<char>()};
    if (in.bad()) throw convert_error(path + ": reading it failed");
    return parse_sentencepiece_model(bytes.data(), bytes.size(), path);
}

} // namespace smol::convert
