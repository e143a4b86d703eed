// fuzz-tokenizer.c++ - libFuzzer target: any bytes through a real
// vocabulary's tokenizer (SmolLM2-135M-Instruct's byte-level BPE from the
// model file; SMOL_FUZZ_MODEL names another GGUF). The first byte picks
// add_special and parse_special, the rest is the text. Checks:
// - every id is in the vocabulary, and a buffer one short is refused with
//   the size the text needs;
// - the ids give back the text, byte for byte, but for the bytes no token
//   can carry (found once at start-up, one byte at a time): smol's
//   tokenizer round-trips any bytes, valid UTF-8 or not, and special tokens
//   parsed out of the text come back as their text;
// - ids read from the input, in range or not, give a piece or a refusal.
// A crash, a sanitizer report or a failed check traps.

#include "smol.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

const smol_model * model = nullptr;
int32_t n_vocab = 0;
bool representable[256];

void fail(const char * what) {
    std::fprintf(stderr, "fuzz-tokenizer: %s\n", what);
    __builtin_trap();
}

std::vector<smol_token> tokenize(const std::string & text, bool add_special, bool parse_special) {
    std::vector<smol_token> ids(text.size() + 4);
    int32_t n = 0;
    smol_status st = smol_tokenize(model, text.data(), text.size(), add_special, parse_special,
                                   ids.data(), int32_t(ids.size()), &n);
    if (st != SMOL_OK) fail("smol_tokenize refused a text with room for it");
    ids.resize(size_t(n));
    return ids;
}

std::string piece(smol_token t, bool special) {
    char buf[256];
    size_t n = 0;
    if (smol_token_to_piece(model, t, special, buf, sizeof buf, &n) != SMOL_OK)
        fail("smol_token_to_piece refused an id of the vocabulary");
    return std::string(buf, n);
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    const char * path = std::getenv("SMOL_FUZZ_MODEL");
    if (!path) path = SMOL_MODEL;
    smol_model_params p = smol_model_default_params();
    smol_model * m = nullptr;
    if (smol_model_load(path, &p, &m) != SMOL_OK) {
        std::fprintf(stderr, "fuzz-tokenizer: cannot load %s: %s (scripts/fetch-model.sh)\n", path,
                     smol_last_error());
        std::exit(1);
    }
    model = m;
    smol_model_info info;
    smol_model_get_info(model, &info);
    n_vocab = info.n_vocab;
    for (int b = 0; b < 256; ++b) {
        const std::string one(1, char(b));
        std::string back;
        for (smol_token t : tokenize(one, false, false)) back += piece(t, false);
        representable[b] = back == one;
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    if (size == 0) return 0;
    const bool add_special = data[0] & 1, parse_special = data[0] & 2;
    const std::string text(reinterpret_cast<const char *>(data + 1), size - 1);

    std::vector<smol_token> ids = tokenize(text, add_special, parse_special);
    for (smol_token t : ids)
        if (t < 0 || t >= n_vocab) fail("an id outside the vocabulary");
    if (!ids.empty()) {
        std::vector<smol_token> small(ids.size() - 1);
        int32_t n = 0;
        const smol_status st =
            smol_tokenize(model, text.data(), text.size(), add_special, parse_special, small.data(),
                          int32_t(small.size()), &n);
        if (st != SMOL_ERR_BUFFER_TOO_SMALL || n != int32_t(ids.size()))
            fail("a buffer one short was not refused with the size needed");
    }

    // add_special may prepend a bos (whose text can also be in the text):
    // the ids without it are the text's.
    size_t from = 0;
    if (add_special) {
        const size_t plain = tokenize(text, false, parse_special).size();
        if (ids.size() == plain + 1 && ids[0] == smol_token_bos(model)) {
            from = 1;
        } else if (ids.size() != plain) {
            fail("add_special added something other than one bos");
        }
    }
    std::string back;
    for (size_t i = from; i < ids.size(); ++i) back += piece(ids[i], parse_special);
    std::string want;
    for (char c : text)
        if (representable[uint8_t(c)]) want += c;
    if (back != want) fail("the ids do not give back the text");

    // Ids from the raw bytes, many of them out of range.
    for (size_t i = 0; i + 4 <= size && i < 64; i += 4) {
        int32_t t;
        std::memcpy(&t, data + i, 4);
        char buf[8];
        size_t n = 0;
        const smol_status st = smol_token_to_piece(model, t, true, buf, sizeof buf, &n);
        if ((t < 0 || t >= n_vocab) != (st == SMOL_ERR_INVALID_ARGUMENT) &&
            st != SMOL_ERR_BUFFER_TOO_SMALL)
            fail("smol_token_to_piece: an id out of range not refused, or one in range refused");
    }
    return 0;
}
