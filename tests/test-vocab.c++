// test-vocab.c++ - the tokenizer against llama.cpp on the real SmolLM2 vocabulary
// (tests/fixtures/tokenizer.json) and on llama.cpp's own tokenizer suite (read
// from its sources), byte-exact round trips of random bytes, SentencePiece on
// small vocabularies written for the test, and the refusals.

#include "smol-error.h"
#include "smol-unicode.h"
#include "smol-vocab.h"
#include "test-seed.h"

#include <cmath>
#include <cstdio>
#include <doctest/doctest.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using ids = std::vector<smol_token>;

nlohmann::json read_fixture(const std::string & name, const char * how_to_make) {
    const std::string path = std::string(SMOL_FIXTURES) + "/" + name;
    std::ifstream in(path);
    INFO("missing fixture " << path << ": " << std::string(how_to_make));
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
}

const char * k_make_tokenizer_fixture =
    "it comes from llama.cpp; run scripts/fetch-model.sh, scripts/peers.sh, then "
    "/work/peers/venv/bin/python scripts/make-fixtures.py --only tokenizer";

// The real vocabulary, loaded once for the whole file.
const smol::vocab & real_vocab() {
    static std::unique_ptr<smol::vocab> v;
    if (!v) {
        INFO("the real model is missing: run scripts/fetch-model.sh (looked for " << SMOL_MODEL
                                                                                  << ")");
        REQUIRE(std::filesystem::exists(SMOL_MODEL));
        auto f = gguf::file::open(SMOL_MODEL);
        auto loaded = std::make_unique<smol::vocab>();
        loaded->load(*f);
        v = std::move(loaded);
    }
    return *v;
}

std::string from_hex(const std::string & hex) {
    std::string out;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) {
        out += char(std::stoi(hex.substr(i, 2), nullptr, 16));
    }
    return out;
}

std::string to_hex(std::string_view s) {
    static const char * digits = "0123456789abcdef";
    std::string out;
    for (const char c : s) {
        out += digits[uint8_t(c) >> 4];
        out += digits[uint8_t(c) & 15];
    }
    return out;
}

// How a byte string looks in test output: printable ASCII as is, the rest
// as \xNN.
std::string printable(std::string_view s) {
    std::string out;
    for (const char c : s) {
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            out += c;
        } else {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", uint8_t(c));
            out += buf;
        }
    }
    return out;
}

// --- small vocabularies written for a test ------------------------------------

// A byte-level BPE vocabulary in GGUF form: the 256 byte characters, then
// the extra tokens given, with merges and metadata as the test sets them.
struct tiny_vocab {
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    std::vector<std::string> merges;
    gguf::writer w;

    tiny_vocab() {
        for (int b = 0; b < 256; b++) {
            std::string s;
            smol::unicode::append_utf8(s, smol::unicode::byte_to_cpt(uint8_t(b)));
            tokens.push_back(s);
            types.push_back(1);
        }
        w.set("general.architecture", gguf::value::make_str("llama"));
        w.set("tokenizer.ggml.model", gguf::value::make_str("gpt2"));
        w.set("tokenizer.ggml.pre", gguf::value::make_str("smollm"));
    }
    smol_token add(const std::string & text, int32_t type = 1) {
        tokens.push_back(text);
        types.push_back(type);
        return smol_token(tokens.size() - 1);
    }
    // The id of a single-byte token.
    static smol_token byte(char c) { return smol_token(uint8_t(c)); }

    std::unique_ptr<smol::vocab> load() {
        static int serial = 0;
        const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                           ("smol-test-vocab-" + std::to_string(getpid()) + "-" +
                                            std::to_string(serial++) + ".gguf");
        w.set("tokenizer.ggml.tokens", gguf::value::make_str_array(tokens));
        std::vector<gguf::value> tv;
        for (int32_t t : types) tv.push_back(gguf::value::make_i32(t));
        w.set("tokenizer.ggml.token_type", gguf::value::make_array(gguf::type::INT32, tv));
        w.set("tokenizer.ggml.merges", gguf::value::make_str_array(merges));
        w.write(path.string());
        auto f = gguf::file::open(path.string());
        std::filesystem::remove(path);
        auto v = std::make_unique<smol::vocab>();
        v->load(*f);
        return v;
    }
};

// Runs load() expecting a smol::error; returns it.
smol::error load_error(tiny_vocab & t) {
    try {
        t.load();
    } catch (const smol::error & e) {
        return e;
    }
    FAIL("load() accepted the vocabulary");
    return smol::error(SMOL_OK, "");
}

bool contains(const std::string & s, const std::string & part) {
    return s.find(part) != std::string::npos;
}

} // namespace

// --- the real vocabulary against llama.cpp -------------------------------------

TEST_CASE("the SmolLM2 vocabulary loads with llama.cpp's special tokens") {
    const smol::vocab & v = real_vocab();
    CHECK(v.n_tokens() == 49152);
    CHECK(v.bos() == 1);
    CHECK(v.eos() == 2);
    CHECK_FALSE(v.add_bos());

    const nlohmann::json fx = read_fixture("tokenizer.json", k_make_tokenizer_fixture);
    REQUIRE(fx.at("n_vocab").get<int>() == v.n_tokens());
    const auto & control = fx.at("control_tokens");
    int n_control = 0;
    for (smol_token t = 0; t < v.n_tokens(); t++) {
        const bool want = control.contains(std::to_string(t));
        if (v.is_control(t) != want) {
            INFO("token " << t << " '" << printable(v.token_to_piece(t, true)) << "'");
            CHECK(v.is_control(t) == want);
        }
        n_control += v.is_control(t);
    }
    CHECK(n_control == int(control.size()));
}

TEST_CASE("generation ends at <|im_end|>, <|endoftext|> and the FIM repo token, as in llama.cpp") {
    const smol::vocab & v = real_vocab();
    CHECK(v.is_eog(2)); // <|im_end|>, also eos
    CHECK(v.is_eog(0)); // <|endoftext|>
    // llama.cpp takes <reponame> as the fill-in-the-middle repo token, which
    // ends generation: a code model starting another repository is done.
    CHECK(v.is_eog(4));
    CHECK_FALSE(v.is_eog(1)); // <|im_start|>
    CHECK_FALSE(v.is_eog(3)); // <repo_name>
    CHECK_FALSE(v.is_eog(v.tokenize("Hello", false, false).at(0)));
    int n_eog = 0;
    for (smol_token t = 0; t < v.n_tokens(); t++) n_eog += v.is_eog(t);
    CHECK(n_eog == 3);
    CHECK_FALSE(v.is_eog(-1));
    CHECK_FALSE(v.is_eog(v.n_tokens()));
}

TEST_CASE("tokenize gives llama.cpp's ids for every fixture case") {
    const smol::vocab & v = real_vocab();
    const nlohmann::json fx = read_fixture("tokenizer.json", k_make_tokenizer_fixture);
    const auto & cases = fx.at("cases");
    REQUIRE(!cases.empty());
    size_t n_match = 0;
    for (const auto & c : cases) {
        const std::string text = c.at("text");
        const bool add_special = c.at("add_special");
        const bool parse_special = c.at("parse_special");
        const ids want = c.at("ids").get<ids>();
        const ids got = v.tokenize(text, add_special, parse_special);
        INFO("text \"" << printable(text) << "\" add_special=" << add_special
                       << " parse_special=" << parse_special);
        CHECK(got == want);
        n_match += got == want;
    }
    MESSAGE(n_match << " of " << cases.size() << " fixture cases give llama.cpp's ids ("
                    << fx.at("engine").get<std::string>() << ")");
}

TEST_CASE("token pieces and detokenized text are llama.cpp's") {
    const smol::vocab & v = real_vocab();
    const nlohmann::json fx = read_fixture("tokenizer.json", k_make_tokenizer_fixture);
    for (const auto & c : fx.at("cases")) {
        const std::string text = c.at("text");
        const ids tokens = c.at("ids").get<ids>();
        INFO("text \"" << printable(text) << "\"");
        const auto & pieces = c.at("pieces");
        REQUIRE(pieces.size() == tokens.size());
        for (size_t i = 0; i < tokens.size(); i++) {
            INFO("token " << tokens[i]);
            CHECK(to_hex(v.token_to_piece(tokens[i], true)) == pieces[i].get<std::string>());
        }
        // special=false hides control tokens, as llama_token_to_piece does.
        const std::string detok = from_hex(c.at("detok_hex"));
        CHECK(v.detokenize(tokens, false) == detok);
        if (detok == text) CHECK(v.detokenize(tokens, false) == text);
    }
}

TEST_CASE("every fixture text comes back from detokenize with special tokens shown") {
    const smol::vocab & v = real_vocab();
    const nlohmann::json fx = read_fixture("tokenizer.json", k_make_tokenizer_fixture);
    for (const auto & c : fx.at("cases")) {
        const std::string text = c.at("text");
        const bool parse_special = c.at("parse_special");
        INFO("text \"" << printable(text) << "\" parse_special=" << parse_special);
        CHECK(v.detokenize(v.tokenize(text, false, parse_special), true) == text);
    }
}

TEST_CASE("special tokens are matched in the text only with parse_special") {
    const smol::vocab & v = real_vocab();
    CHECK(v.tokenize("<|im_start|>", false, true) == ids{1});
    const ids plain = v.tokenize("<|im_start|>", false, false);
    CHECK(plain.size() > 1);
    CHECK(v.detokenize(plain, false) == "<|im_start|>");
    CHECK(v.tokenize("a<|im_end|>b", false, true) ==
          ids{v.tokenize("a", false, false)[0], 2, v.tokenize("b", false, false)[0]});
}

TEST_CASE("control tokens print only when special is asked for") {
    const smol::vocab & v = real_vocab();
    CHECK(v.token_to_piece(2, false) == "");
    CHECK(v.token_to_piece(2, true) == "<|im_end|>");
    CHECK(v.detokenize({1, 2}, false) == "");
    CHECK(v.detokenize({1, 2}, true) == "<|im_start|><|im_end|>");
    try {
        v.token_to_piece(v.n_tokens(), true);
        FAIL("an id past the vocabulary was accepted");
    } catch (const smol::error & e) {
        CHECK(e.status == SMOL_ERR_INVALID_ARGUMENT);
    }
}

// --- bytes, valid or not ---------------------------------------------------------

// The bytes that have a token of their own. SmolLM2's vocabulary lacks 21
// byte values (some C0 controls, 0xC0, 0xC1, 0xF1, 0xF2, 0xF5..0xFF): no
// token sequence can spell them, so no engine can give them back.
std::vector<bool> spellable_bytes(const smol::vocab & v) {
    std::vector<bool> ok(256);
    for (int b = 0; b < 256; b++)
        ok[b] = !v.tokenize(std::string(1, char(b)), false, false).empty();
    return ok;
}

TEST_CASE("random byte strings come back byte for byte from tokenize and detokenize") {
    const smol::vocab & v = real_vocab();
    const std::vector<bool> spellable = spellable_bytes(v);
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    const auto pick = [&](uint32_t lo, uint32_t hi) {
        return std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
    };
    const char * pieces[] = {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_",
                             "'ll",          "  ",         "\r\n",          "\xef\xbf\xbd"};
    for (int n = 0; n < 3000; n++) {
        std::string s;
        const uint32_t len = pick(0, 48);
        for (uint32_t i = 0; i < len; i++) {
            switch (pick(0, 5)) {
            case 0: // any byte, so invalid UTF-8 of every kind turns up
                s += char(pick(0, 255));
                break;
            case 1:
                s += char(pick(0x20, 0x7e));
                break;
            case 2:
                s += char(pick(0, 9) + '0');
                break;
            case 3:
                s += pieces[pick(0, std::size(pieces) - 1)];
                break;
            default: { // a code point of any plane, surrogates included
                const uint32_t plane = pick(0, 3);
                const uint32_t cpt = plane == 0   ? pick(0x80, 0x7ff)
                                     : plane == 1 ? pick(0x800, 0xffff)
                                                  : pick(0x10000, 0x10ffff);
                smol::unicode::append_utf8(s, cpt);
            }
            }
        }
        // Every byte the vocabulary can spell comes back, in order; the others
        // are dropped, as llama.cpp drops them.
        std::string want;
        for (const char c : s) {
            if (spellable[uint8_t(c)]) want += c;
        }
        const bool parse_special = pick(0, 1);
        const ids tokens = v.tokenize(s, false, parse_special);
        INFO("bytes \"" << printable(s) << "\" parse_special=" << parse_special);
        REQUIRE(v.detokenize(tokens, true) == want);
        if (!parse_special) REQUIRE(v.detokenize(tokens, false) == want);
    }
}

TEST_CASE("SmolLM2's vocabulary spells all but 21 byte values") {
    const std::vector<bool> spellable = spellable_bytes(real_vocab());
    std::string missing;
    for (int b = 0; b < 256; b++) {
        if (!spellable[b]) missing += printable(std::string(1, char(b)));
    }
    CHECK(missing == "\\x04\\x06\\x13\\x14\\x16\\x1d\\xc0\\xc1\\xf1\\xf2\\xf5\\xf6\\xf7\\xf8\\xf9"
                     "\\xfa\\xfb\\xfc\\xfd\\xfe\\xff");
}

TEST_CASE("invalid UTF-8 splits like U+FFFD but keeps its own bytes") {
    const smol::vocab & v = real_vocab();
    // A stray continuation byte separates words as U+FFFD would (a symbol),
    // and comes back as itself.
    const ids got = v.tokenize("a\x80"
                               "b",
                               false, false);
    REQUIRE(got.size() == 3);
    CHECK(v.token_to_piece(got[0], false) == "a");
    CHECK(v.token_to_piece(got[1], false) == "\x80");
    CHECK(v.token_to_piece(got[2], false) == "b");
    // Truncated sequences, overlong forms, surrogates and code points past
    // U+10FFFF keep their bytes too.
    for (const std::string & s : {std::string("x\xe4\xb8"), std::string("\xe0\x80\x80 y"),
                                  std::string("\xed\xa0\x80"), std::string("\xf4\x90\x80\x80")}) {
        INFO("bytes \"" << printable(s) << "\"");
        CHECK(v.detokenize(v.tokenize(s, false, false), false) == s);
    }
}

TEST_CASE("a byte the vocabulary cannot spell is dropped, as llama.cpp drops it") {
    const smol::vocab & v = real_vocab();
    const ids got = v.tokenize("a\xff"
                               "b",
                               false, false);
    CHECK(got == ids{v.tokenize("a", false, false)[0], v.tokenize("b", false, false)[0]});
}

TEST_CASE("100 KB of text tokenizes to the ids of its pieces and comes back whole") {
    const smol::vocab & v = real_vocab();
    // Long single words and whitespace runs are the inputs a quadratic BPE
    // or scanner would choke on: they must finish (within ctest's timeout)
    // and give the right ids, not merely some ids. The prose repeats a
    // sentence whose copies meet at a word's leading space, where the
    // pre-tokenizer splits, so its ids are the sentence's ids repeated.
    const std::string sentence = "The quick brown fox jumps over the lazy dog; 12345 café 中文 😀";
    std::string prose = sentence;
    ids prose_ids = v.tokenize(sentence, false, true);
    const ids again = v.tokenize(" " + sentence, false, true);
    while (prose.size() < 100000) {
        prose += " " + sentence;
        prose_ids.insert(prose_ids.end(), again.begin(), again.end());
    }
    CHECK(v.tokenize(prose, false, true) == prose_ids);
    const std::string one_word(100000, 'a');
    const std::string spaces(100000, ' ');
    for (const std::string * s :
         std::initializer_list<const std::string *>{&prose, &one_word, &spaces}) {
        const ids tokens = v.tokenize(*s, false, true);
        MESSAGE(s->size() << " bytes -> " << tokens.size() << " tokens");
        CHECK(v.detokenize(tokens, true) == *s);
    }
    // A run of one byte merges pairwise from the left, level by level, so
    // its ids are its first token's repeated, then those of what is left.
    for (const std::string * s : std::initializer_list<const std::string *>{&one_word, &spaces}) {
        const ids tokens = v.tokenize(*s, false, true);
        REQUIRE(!tokens.empty());
        const size_t unit = v.detokenize(ids{tokens[0]}, true).size();
        ids want(s->size() / unit, tokens[0]);
        const ids rest = v.tokenize(s->substr(0, s->size() % unit), false, true);
        want.insert(want.end(), rest.begin(), rest.end());
        CHECK(tokens == want);
    }
}

// --- BPE on a vocabulary made for the test ---------------------------------------

TEST_CASE("BPE applies the lowest-ranked merge first, wherever it is in the word") {
    tiny_vocab t;
    const smol_token ab = t.add("ab");
    const smol_token bc = t.add("bc");
    const smol_token abc = t.add("abc");
    t.merges = {"b c", "a b", "a bc"};
    auto v = t.load();
    CHECK(v->tokenize("abc", false, false) == ids{abc}); // (b c) before (a b)
    CHECK(v->tokenize("abab", false, false) == ids{ab, ab});
    CHECK(v->tokenize("bcb", false, false) == ids{bc, tiny_vocab::byte('b')});
    CHECK(v->tokenize("ca", false, false) == ids{tiny_vocab::byte('c'), tiny_vocab::byte('a')});
}

TEST_CASE("the longest special token wins where special tokens overlap") {
    tiny_vocab t;
    const smol_token x = t.add("<x>", 3);
    const smol_token xy = t.add("<x>y", 3);
    auto v = t.load();
    CHECK(v->tokenize("<x>y<x>", false, true) == ids{xy, x});
    CHECK(v->tokenize("<x>", false, false).size() == 3);
}

TEST_CASE("bos is added only where the file asks for it") {
    tiny_vocab t;
    const smol_token bos = t.add("<s>", 3);
    t.w.set("tokenizer.ggml.bos_token_id", gguf::value::make_u32(uint32_t(bos)));
    t.w.set("tokenizer.ggml.add_bos_token", gguf::value::make_bool(true));
    auto v = t.load();
    CHECK(v->add_bos());
    CHECK(v->tokenize("a", true, false) == ids{bos, tiny_vocab::byte('a')});
    CHECK(v->tokenize("a", false, false) == ids{tiny_vocab::byte('a')});
    CHECK(v->tokenize("", true, false) == ids{bos});
}

// --- refusals ----------------------------------------------------------------------

TEST_CASE("a vocab used before load says so") {
    const smol::vocab v;
    CHECK(v.n_tokens() == 0);
    CHECK(v.bos() == -1);
    CHECK_FALSE(v.is_eog(0));
    try {
        v.tokenize("x", false, false);
        FAIL("tokenize worked without a vocabulary");
    } catch (const smol::error & e) {
        CHECK(e.status == SMOL_ERR_INVALID_ARGUMENT);
        CHECK(contains(e.what(), "load"));
    }
}

TEST_CASE("an unknown pre-tokenizer is refused, naming it") {
    tiny_vocab t;
    t.w.set("tokenizer.ggml.pre", gguf::value::make_str("no-such-pre"));
    const smol::error e = load_error(t);
    CHECK(e.status == SMOL_ERR_UNSUPPORTED);
    CHECK(contains(e.what(), "tokenizer.ggml.pre"));
    CHECK(contains(e.what(), "no-such-pre"));
}

TEST_CASE("the gpt-2, default and llama-bpe pre-tokenizers are accepted") {
    for (const char * pre : {"gpt-2", "default", "llama-bpe", "smollm"}) {
        tiny_vocab t;
        t.w.set("tokenizer.ggml.pre", gguf::value::make_str(pre));
        if (std::string(pre) == "llama-bpe") {
            t.w.set("tokenizer.ggml.add_bos_token", gguf::value::make_bool(false));
        }
        auto v = t.load();
        INFO("pre-tokenizer " << pre);
        CHECK(v->detokenize(v->tokenize("Hello, world 123!", false, false), false) ==
              "Hello, world 123!");
    }
}

TEST_CASE("a tokenizer model smol does not run is refused, naming it") {
    for (const char * model : {"bert", "t5", "rwkv"}) {
        tiny_vocab t;
        t.w.set("tokenizer.ggml.model", gguf::value::make_str(model));
        const smol::error e = load_error(t);
        INFO(model);
        CHECK(e.status == SMOL_ERR_UNSUPPORTED);
        CHECK(contains(e.what(), "tokenizer.ggml.model"));
        CHECK(contains(e.what(), model));
    }
}

// A SentencePiece vocabulary: <unk> <s> </s>, the 256 byte tokens, then the
// pieces given with their scores.
std::unique_ptr<smol::vocab> tiny_spm(const std::vector<std::pair<std::string, float>> & pieces) {
    tiny_vocab t;
    t.tokens = {"<unk>", "<s>", "</s>"};
    t.types = {2, 3, 3};
    std::vector<gguf::value> sc(3, gguf::value::make_f32(0));
    for (int b = 0; b < 256; b++) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        t.tokens.push_back(name);
        t.types.push_back(6);
        sc.push_back(gguf::value::make_f32(0));
    }
    for (const auto & [text, score] : pieces) {
        t.tokens.push_back(text);
        t.types.push_back(1);
        sc.push_back(gguf::value::make_f32(score));
    }
    t.w.set("tokenizer.ggml.model", gguf::value::make_str("llama"));
    t.w.set("tokenizer.ggml.scores", gguf::value::make_array(gguf::type::FLOAT32, sc));
    t.w.set("tokenizer.ggml.bos_token_id", gguf::value::make_u32(1));
    t.w.set("tokenizer.ggml.unknown_token_id", gguf::value::make_u32(0));
    return t.load();
}

const std::string k_sp = "\xe2\x96\x81"; // U+2581

TEST_CASE("SentencePiece merges the pair whose token scores highest first") {
    // "ab" is read as "\u2581ab": the pairs "\u2581a" and "ab" compete.
    const smol_token first = 259;
    {
        const auto v = tiny_spm({{k_sp, 0}, {"a", 0}, {"b", 0}, {k_sp + "a", -1}, {"ab", -2}});
        CHECK(v->tokenize("ab", false, false) == ids{first + 3, first + 2});
    }
    {
        const auto v = tiny_spm({{k_sp, 0}, {"a", 0}, {"b", 0}, {k_sp + "a", -2}, {"ab", -1}});
        CHECK(v->tokenize("ab", false, false) == ids{first, first + 4});
    }
}

TEST_CASE("SentencePiece spells a character it has no token for in byte tokens") {
    const auto v = tiny_spm({{k_sp, 0}, {"a", 0}});
    // "a\xc3\xa9": \u2581, a, then the bytes 0xC3 0xA9 as <0xC3> <0xA9>.
    CHECK(v->tokenize("a\xc3\xa9", false, false) == ids{259, 260, 3 + 0xC3, 3 + 0xA9});
    CHECK(v->detokenize(v->tokenize("a\xc3\xa9", false, false), false) == "a\xc3\xa9");
}

TEST_CASE("SentencePiece puts a space before the text and after each special token") {
    const auto v = tiny_spm({{k_sp, 0}, {"a", 0}, {k_sp + "a", 1}});
    const smol_token sa = 261; // "\u2581a"
    CHECK(v->tokenize("a", true, false) == ids{1, sa});
    CHECK(v->tokenize("a</s>a", false, true) == ids{sa, 2, sa});
    CHECK(v->tokenize("a a", false, false) == ids{sa, sa});
}

// --- llama.cpp's tokenizer suite ----------------------------------------------------

// The vocabularies of llama.cpp's suite (models/ggml-vocab-*.gguf with .inp
// and .out) that smol claims: every text model's. bert-bge is an embedding
// model's WordPiece, which smol refuses.
const char * const k_suite_claimed[] = {
    "command-r", "deepseek-coder", "deepseek-llm", "falcon",    "gemma-4",
    "gpt-2",     "llama-bpe",      "llama-spm",    "mpt",       "phi-3",
    "qwen2",     "qwen35",         "refact",       "starcoder",
};

struct suite_case {
    std::string text;
    ids expected;
};

// As llama.cpp's test-tokenizer-0 reads the files: inputs separated by
// "\n__ggml_vocab_test__\n", one line of ids per input.
std::vector<suite_case> read_suite(const std::string & base) {
    std::ifstream inp(base + ".inp", std::ios::binary);
    std::ifstream outf(base + ".out", std::ios::binary);
    REQUIRE(inp.good());
    REQUIRE(outf.good());
    const std::string raw((std::istreambuf_iterator<char>(inp)), std::istreambuf_iterator<char>());
    std::vector<std::string> texts;
    const std::string sep = "\n__ggml_vocab_test__\n";
    for (size_t pos = 0; pos < raw.size();) {
        const size_t next = raw.find(sep, pos);
        if (next == std::string::npos) {
            texts.push_back(raw.substr(pos));
            break;
        }
        texts.push_back(raw.substr(pos, next - pos));
        pos = next + sep.size();
    }
    std::vector<suite_case> cases;
    std::string line;
    for (const std::string & t : texts) {
        REQUIRE(std::getline(outf, line));
        suite_case c{t, {}};
        std::istringstream in(line);
        for (smol_token id; in >> id;) c.expected.push_back(id);
        cases.push_back(std::move(c));
    }
    return cases;
}

std::string suite_dir() {
    return std::string(SMOL_LLAMA_CPP_SOURCE) + "/models";
}

// The suite is read from llama.cpp's sources (scripts/peers.sh --sources);
// without them its cases are skipped and counted so.
bool suite_absent() {
    return !std::filesystem::exists(suite_dir() + "/ggml-vocab-llama-spm.gguf");
}

TEST_CASE("llama.cpp's tokenizer suite: every vocabulary smol claims gives its ids" *
          doctest::skip(suite_absent())) {
    int n_vocabs = 0;
    int n_cases = 0;
    for (const char * name : k_suite_claimed) {
        const std::string base = suite_dir() + "/ggml-vocab-" + name + ".gguf";
        INFO("vocabulary " << std::string(name));
        const auto f = gguf::file::open(base);
        smol::vocab v;
        v.load(*f);
        int ok = 0;
        const auto cases = read_suite(base);
        for (const suite_case & c : cases) {
            const ids got = v.tokenize(c.text, false, false);
            INFO("text \"" << c.text << "\"");
            CHECK(got == c.expected);
            ok += got == c.expected;
        }
        MESSAGE(std::string(name) << ": " << ok << " of " << cases.size() << " cases");
        n_vocabs++;
        n_cases += int(cases.size());
    }
    MESSAGE(n_vocabs << " vocabularies, " << n_cases << " cases");
}

TEST_CASE("a vocabulary of llama.cpp's suite that smol does not claim is refused by name" *
          doctest::skip(suite_absent())) {
    const std::string path = suite_dir() + "/ggml-vocab-bert-bge.gguf";
    const auto f = gguf::file::open(path);
    smol::vocab v;
    try {
        v.load(*f);
        FAIL("bert-bge's WordPiece vocabulary was accepted");
    } catch (const smol::error & e) {
        CHECK(e.status == SMOL_ERR_UNSUPPORTED);
        CHECK(contains(e.what(), "\"bert\""));
    }
}

TEST_CASE("random bytes through every claimed vocabulary give ids in range; SentencePiece's "
          "come back" *
          doctest::skip(suite_absent())) {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    const std::vector<std::string> parts = {
        "a",
        " ",
        "  ",
        "\n",
        "\t",
        "1",
        "'s",
        "\xc3\xa9",
        "\xe4\xb8\xad",
        "\xf0\x9f\xa6\x99",
        "\xe2\x96\x81",
        "\xff",
        "\xe2",
        "\x80",
        "<s>",
        "</s>",
        "<|endoftext|>",
        "!",
        "\r\n",
    };
    for (const char * name : k_suite_claimed) {
        const auto f = gguf::file::open(suite_dir() + "/ggml-vocab-" + name + ".gguf");
        smol::vocab v;
        v.load(*f);
        INFO("vocabulary " << std::string(name));
        for (int iter = 0; iter < 300; iter++) {
            std::string text;
            const int n = int(rng() % 40);
            for (int i = 0; i < n; i++) text += parts[rng() % parts.size()];
            const bool special = rng() & 1;
            INFO("text \"" << text << "\", parse_special " << special);
            const ids got = v.tokenize(text, rng() & 1, special);
            for (const smol_token t : got) REQUIRE((t >= 0 && t < v.n_tokens()));
            // SentencePiece round-trips valid UTF-8 without special-token
            // texts (a stray byte can swallow part of an escaped space, and
            // merges may spell a control token, as in llama.cpp).
            const bool plain_text = text.find_first_of("<\xff\x80") == std::string::npos && [&] {
                for (size_t i = 0; (i = text.find('\xe2', i)) != std::string::npos; i++) {
                    if (i + 1 >= text.size() || (uint8_t(text[i + 1]) & 0xC0) != 0x80) return false;
                }
                return true;
            }();
            if (std::string(name) == "llama-spm" && plain_text) {
                // Every byte has a token; U+2581 reads as the space it stands for.
                std::string want;
                for (size_t i = 0; i < text.size();) {
                    if (text.compare(i, 3, "\xe2\x96\x81") == 0) {
                        want += ' ';
                        i += 3;
                    } else {
                        want += text[i++];
                    }
                }
                ids plain = v.tokenize(text, false, false);
                CHECK(v.detokenize(plain, false) == want);
            }
        }
    }
}

TEST_CASE("SentencePiece text comes back from detokenize, its added space dropped" *
          doctest::skip(suite_absent())) {
    const std::string path = suite_dir() + "/ggml-vocab-llama-spm.gguf";
    const auto f = gguf::file::open(path);
    smol::vocab v;
    v.load(*f);
    CHECK(v.add_bos());
    const ids with_bos = v.tokenize("Hello world", true, false);
    REQUIRE(!with_bos.empty());
    CHECK(with_bos[0] == v.bos());
    for (const std::string text :
         {"Hello world", " two  spaces", "tabs\tand\nnewlines", "caf\xc3\xa9 \xf0\x9f\xa6\x99"}) {
        INFO(text);
        CHECK(v.detokenize(v.tokenize(text, false, false), false) == text);
    }
}

TEST_CASE("inconsistent tokenizer arrays are format errors naming the key") {
    SUBCASE("token types shorter than the tokens") {
        tiny_vocab t;
        t.types.resize(10);
        const smol::error e = load_error(t);
        CHECK(e.status == SMOL_ERR_FORMAT);
        CHECK(contains(e.what(), "tokenizer.ggml.token_type"));
    }
    SUBCASE("scores shorter than the tokens") {
        tiny_vocab t;
        t.w.set("tokenizer.ggml.scores",
                gguf::value::make_array(gguf::type::FLOAT32, {gguf::value::make_f32(0)}));
        const smol::error e = load_error(t);
        CHECK(e.status == SMOL_ERR_FORMAT);
        CHECK(contains(e.what(), "tokenizer.ggml.scores"));
    }
    SUBCASE("a score that is NaN") {
        tiny_vocab t;
        std::vector<gguf::value> sc(t.tokens.size(), gguf::value::make_f32(0));
        sc[7] = gguf::value::make_f32(std::nanf(""));
        t.w.set("tokenizer.ggml.scores", gguf::value::make_array(gguf::type::FLOAT32, sc));
        const smol::error e = load_error(t);
        CHECK(e.status == SMOL_ERR_FORMAT);
        CHECK(contains(e.what(), "tokenizer.ggml.scores[7]"));
    }
    SUBCASE("a token listed twice") {
        tiny_vocab t;
        t.add("a");
        const smol::error e = load_error(t);
        CHECK(e.status == SMOL_ERR_FORMAT);
        CHECK(contains(e.what(), "tokenizer.ggml.tokens"));
    }
    SUBCASE("an eos id past the vocabulary") {
        tiny_vocab t;
        t.w.set("tokenizer.ggml.eos_token_id", gguf::value::make_u32(100000));
        const smol::error e = load_error(t);
        CHECK(e.status == SMOL_ERR_FORMAT);
        CHECK(contains(e.what(), "tokenizer.ggml.eos_token_id"));
    }
}
