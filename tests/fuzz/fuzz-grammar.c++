// fuzz-grammar.c++ - libFuzzer target: bytes as a GBNF grammar and a text,
// or as a JSON schema. The first byte picks: even, the rest is the grammar,
// a zero byte, then the text fed to the grammar's matcher a byte at a time;
// odd, the rest is a JSON schema. Checks:
// - a grammar is parsed or refused with smol::error, never anything else;
// - a byte the matcher refuses leaves it as it was;
// - the GBNF a schema is turned into always parses.
// A crash, a sanitizer report or a failed check traps.

#include "smol-error.h"
#include "smol-grammar.h"

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

namespace {

void fail(const char * what) {
    std::fprintf(stderr, "fuzz-grammar: %s\n", what);
    __builtin_trap();
}

void grammar_and_text(const std::string & in) {
    const size_t cut = in.find('\0');
    const std::string gbnf = in.substr(0, cut);
    const std::string text = cut == std::string::npos ? std::string() : in.substr(cut + 1);
    std::unique_ptr<smol::grammar_matcher> mp;
    try {
        mp = std::make_unique<smol::grammar_matcher>(
            std::make_shared<const smol::grammar>(smol::parse_gbnf(gbnf)));
    } catch (const smol::error &) {
        return;
    }
    smol::grammar_matcher & m = *mp;
    for (const char c : text) {
        const bool complete = m.complete(), more = m.can_continue();
        if (!m.accept(std::string(1, c))) {
            if (m.complete() != complete || m.can_continue() != more)
                fail("a refused byte changed the matcher");
        }
    }
}

void schema(const std::string & in) {
    std::string gbnf;
    try {
        gbnf = smol::json_schema_to_gbnf(in);
    } catch (const smol::error &) {
        return;
    }
    try {
        smol::parse_gbnf(gbnf);
    } catch (const smol::error & e) {
        std::fprintf(stderr, "%s\n%s\n", e.what(), gbnf.c_str());
        fail("a schema's grammar does not parse");
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    if (size == 0) return 0;
    const std::string in(reinterpret_cast<const char *>(data) + 1, size - 1);
    if (data[0] % 2 == 0) {
        grammar_and_text(in);
    } else {
        schema(in);
    }
    return 0;
}
