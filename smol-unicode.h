// smol-unicode.h - what the tokenizer needs to know about Unicode: the
// general-category flags of a code point (the \p{L}, \p{N}, \p{P} ... and \s
// of the pre-tokenizer regexes), a UTF-8 decoder that never fails, and GPT-2's
// byte <-> code point map. The tables live in smol-unicode.c++, which
// scripts/gen-unicode.py generates.

#ifndef SMOL_UNICODE_H
#define SMOL_UNICODE_H

#include <cstddef>
#include <cstdint>
#include <string>

namespace smol::unicode {

// Every code point has exactly one category flag; WHITESPACE may be added.
enum flag : uint16_t {
    UNDEFINED = 0x0001,   // Cn, and anything past U+10FFFF
    NUMBER = 0x0002,      // \p{N}
    LETTER = 0x0004,      // \p{L}
    SEPARATOR = 0x0008,   // \p{Z}
    MARK = 0x0010,        // \p{M}
    PUNCTUATION = 0x0020, // \p{P}
    SYMBOL = 0x0040,      // \p{S}
    CONTROL = 0x0080,     // Cc, Cf, Co, Cs
    WHITESPACE = 0x0100,  // the White_Space property: what \s matches
};

uint16_t flags(uint32_t cpt);
const char * version(); // the Unicode version the tables were made from

// GPT-2's bytes_to_unicode: each byte value has a printable code point, and
// byte-level BPE vocabularies spell their tokens with them.
uint32_t byte_to_cpt(uint8_t byte);
int byte_from_cpt(uint32_t cpt); // -1 for a code point no byte maps to

constexpr uint32_t replacement = 0xFFFD;

struct decoded {
    uint32_t cpt;
    uint32_t len; // bytes read, at least 1
};

// Decodes one character at s[0..n), n >= 1. Decodes exactly as llama.cpp
// does, leniently (overlong forms and surrogates pass, as do 4-byte forms past
// U+10FFFF), so that text splits into the same pieces; a byte that starts no
// sequence, or a truncated sequence, reads as one byte of U+FFFD.
inline decoded decode_utf8(const char * s, size_t n) {
    const auto b = [s](size_t i) { return static_cast<uint8_t>(s[i]); };
    const auto cont = [&](size_t i) { return i < n && (b(i) & 0xC0) == 0x80; };
    const uint8_t c = b(0);
    if (c < 0x80) return {c, 1};
    if ((c & 0xE0) == 0xC0 && cont(1)) return {(uint32_t(c & 0x1F) << 6) | (b(1) & 0x3F), 2};
    if ((c & 0xF0) == 0xE0 && cont(1) && cont(2)) {
        return {(uint32_t(c & 0x0F) << 12) | (uint32_t(b(1) & 0x3F) << 6) | (b(2) & 0x3F), 3};
    }
    if ((c & 0xF8) == 0xF0 && cont(1) && cont(2) && cont(3)) {
        return {(uint32_t(c & 0x07) << 18) | (uint32_t(b(1) & 0x3F) << 12) |
                    (uint32_t(b(2) & 0x3F) << 6) | (b(3) & 0x3F),
                4};
    }
    return {replacement, 1};
}

inline void append_utf8(std::string & out, uint32_t cpt) {
    if (cpt < 0x80) {
        out += char(cpt);
    } else if (cpt < 0x800) {
        out += char(0xC0 | (cpt >> 6));
        out += char(0x80 | (cpt & 0x3F));
    } else if (cpt < 0x10000) {
        out += char(0xE0 | (cpt >> 12));
        out += char(0x80 | ((cpt >> 6) & 0x3F));
        out += char(0x80 | (cpt & 0x3F));
    } else {
        out += char(0xF0 | ((cpt >> 18) & 0x07));
        out += char(0x80 | ((cpt >> 12) & 0x3F));
        out += char(0x80 | ((cpt >> 6) & 0x3F));
        out += char(0x80 | (cpt & 0x3F));
    }
}

} // namespace smol::unicode

#endif // SMOL_UNICODE_H
