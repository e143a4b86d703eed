// test-regex.c++ - the pre-tokenizers' regular expressions (smol-regex.h):
// Perl's matching rules on hand-checked cases, the regex engine against the
// hand-written GPT-2 and Llama 3 scanners on random text (two independent
// implementations of the same patterns), every pattern of the table
// compiling, and the refusals: constructs outside the subset, patterns that
// match nothing, and a match that backtracks without end.

#include "smol-error.h"
#include "smol-pretokenize.h"
#include "smol-regex.h"
#include "test-seed.h"

#include <doctest/doctest.h>
#include <random>
#include <string>
#include <vector>

namespace {

bool contains(const std::string & s, const std::string & part) {
    return s.find(part) != std::string::npos;
}

// The length of the match at code point pos of text.
uint32_t match_at(const smol::regex & re, const std::string & text, uint32_t pos = 0) {
    smol::decoded_text t;
    t.decode(text);
    return re.match(t.cpt.data(), t.flg.data(), pos, t.size());
}

std::vector<std::string> pieces(const smol::pre_tokenizer & p, const std::string & text) {
    smol::decoded_text t;
    t.decode(text);
    std::vector<smol::span> out, tmp;
    p.split(t, out, tmp);
    std::vector<std::string> s;
    for (const smol::span & sp : out) {
        s.push_back(text.substr(t.offs[sp.begin], t.offs[sp.end] - t.offs[sp.begin]));
    }
    return s;
}

smol::error compile_error(const std::string & pattern) {
    try {
        smol::regex re(pattern);
    } catch (const smol::error & e) {
        return e;
    }
    FAIL("the pattern compiled: " << pattern);
    return smol::error(SMOL_ERR_UNSUPPORTED, "");
}

// GPT-2's and Llama 3's patterns as their tokenizer.json files give them.
const std::string k_gpt2 =
    R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))re";
const std::string k_llama3 =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

} // namespace

TEST_CASE("alternatives are tried in order and the first that matches wins, as in Perl") {
    CHECK(match_at(smol::regex("a|ab"), "abc") == 1);
    CHECK(match_at(smol::regex("ab|a"), "abc") == 2);
    CHECK(match_at(smol::regex("x|y"), "abc") == 0);
}

TEST_CASE("quantifiers are greedy and give back what the rest needs") {
    CHECK(match_at(smol::regex("a+"), "aaab") == 3);
    CHECK(match_at(smol::regex("a+ab"), "aaab") == 4);
    CHECK(match_at(smol::regex("a{1,2}"), "aaaa") == 2);
    CHECK(match_at(smol::regex("a{3}"), "aa") == 0);
    CHECK(match_at(smol::regex("a{2,}b"), "aaaab") == 5);
    CHECK(match_at(smol::regex("\\s+(?!\\S)"), "   x") == 2);
    CHECK(match_at(smol::regex("\\s+(?!\\S)"), "   ") == 3);
}

TEST_CASE("lookahead looks without consuming, and stops at the text's end") {
    CHECK(match_at(smol::regex("a(?=b)"), "ab") == 1);
    CHECK(match_at(smol::regex("a(?=b)"), "ac") == 0);
    CHECK(match_at(smol::regex("a(?!b)"), "ac") == 1);
    CHECK(match_at(smol::regex("a(?!b)"), "a") == 1);
    CHECK(match_at(smol::regex("a+$"), "aa") == 2);
    CHECK(match_at(smol::regex("a+$"), "aab") == 0);
}

TEST_CASE("classes take ranges, negation, Unicode categories and case folding") {
    CHECK(match_at(smol::regex("[a-c]+"), "abcd") == 3);
    CHECK(match_at(smol::regex("[^a-c]+"), "xyza") == 3);
    CHECK(match_at(smol::regex("\\p{L}+"), "caf\xc3\xa9!") == 4); // é is a letter
    CHECK(match_at(smol::regex("\\p{N}+"), "\xd9\xa3"
                                           "2a") == 2); // Arabic-Indic three
    CHECK(match_at(smol::regex("[^\\s\\p{L}]+"), "!?x") == 2);
    CHECK(match_at(smol::regex("\\s+"), "\xc2\xa0\t x") == 3);          // no-break space
    CHECK(match_at(smol::regex("[\\p{L}\\p{M}]+"), "e\xcc\x81x") == 3); // a combining accent
    CHECK(match_at(smol::regex("(?i:'re)"), "'RE") == 3);
    CHECK(match_at(smol::regex("'re"), "'RE") == 0);
    CHECK(match_at(smol::regex("[\xe4\xb8\x80-\xe9\xbe\xa5]+"), "\xe4\xb8\xad\xe6\x96\x87"
                                                                "a") == 2);
    CHECK(match_at(smol::regex("."), "\n") == 0);
}

TEST_CASE("the regex engine cuts random text exactly as the GPT-2 and Llama 3 scanners do") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937_64 rng(seed);
    const std::vector<std::string> alphabet = {
        "a",
        "Z",
        "k",
        "\xc3\xa9",
        "\xd0\x96",
        "\xe4\xb8\xad",
        "\xe0\xa4\x95", // letters
        "0",
        "7",
        "\xd9\xa3",
        "\xe2\x85\xa2", // numbers
        ".",
        ",",
        "!",
        "$",
        "+",
        "<",
        "\xe2\x80\x94",
        "\xf0\x9f\xa6\x99", // punct, symbols
        " ",
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "\xc2\xa0",
        "\xe3\x80\x80", // whitespace
        "'",
        "'s",
        "'S",
        "'ll",
        "'Re",
        "'d",
        "\xcc\x81",
        "\x01", // the rest
    };
    for (const auto & named :
         {std::pair<std::string, std::string>{"gpt-2", k_gpt2}, {"llama-bpe", k_llama3}}) {
        const std::string & name = named.first;
        const std::string & pattern = named.second;
        const smol::pre_tokenizer fast = smol::pre_tokenizer::find(name);
        REQUIRE(contains(fast.describe(), "scanner"));
        // The same pattern in a group: the same language, but no scanner.
        const smol::pre_tokenizer slow({"(?:" + pattern + ")"});
        REQUIRE(contains(slow.describe(), "regex"));
        for (int iter = 0; iter < 3000; iter++) {
            std::string text;
            const int n = int(rng() % 24);
            for (int i = 0; i < n; i++) text += alphabet[rng() % alphabet.size()];
            INFO(name << ": text \"" << text << "\"");
            REQUIRE(pieces(fast, text) == pieces(slow, text));
        }
    }
}

TEST_CASE("every pre-tokenizer of the table compiles") {
    const std::string names = smol::pre_tokenizer::known_names();
    int n = 0;
    for (size_t at = 0; at < names.size();) {
        size_t sp = names.find(' ', at);
        if (sp == std::string::npos) sp = names.size();
        const std::string name = names.substr(at, sp - at);
        INFO(name);
        const smol::pre_tokenizer p = smol::pre_tokenizer::find(name);
        CHECK(!pieces(p, "Hello, world! 12345 \xe4\xb8\xad\xe6\x96\x87  x\n").empty());
        n++;
        at = sp + 1;
    }
    CHECK(n > 40);
}

TEST_CASE("constructs outside the subset are refused, naming them") {
    const std::pair<const char *, const char *> cases[] = {
        {"\\p{Lu}+", "\\p{Lu}"},
        {"a\\b", "\\b"},
        {"a*?", "lazy"},
        {"(?<=a)b", "(?<"},
        {"[[a]]", "nested"},
        {"(a", "unterminated ("},
        {"^a", "^"},
        {"a)", "unmatched"},
        {"[a", "unterminated ["},
        {"(?:a*)*b", "nothing"},
        {"a{5,2}", "m < n"},
        {"\\w+", "\\w"},
    };
    for (const auto & c : cases) {
        const char * pattern = c.first;
        const char * what = c.second;
        INFO(pattern);
        const smol::error e = compile_error(pattern);
        CHECK(e.status == SMOL_ERR_UNSUPPORTED);
        CHECK(contains(e.what(), what));
        CHECK(contains(e.what(), pattern));
    }
}

TEST_CASE("a pattern that can match nothing is refused: it would cut where no piece starts") {
    for (const char * p : {"a*", "(?=a)", "a|", "(?:\\d{3})?"}) {
        INFO(p);
        CHECK(contains(compile_error(p).what(), "match nothing"));
    }
}

TEST_CASE("deep nesting is refused, not a stack overflow") {
    const std::string deep = std::string(100000, '(') + "a" + std::string(100000, ')');
    CHECK(contains(compile_error(deep).what(), "nesting"));
}

TEST_CASE("a match that backtracks without end stops with an error") {
    const smol::regex re("(?:a|a)+$");
    const std::string text = std::string(40, 'a') + "b";
    try {
        match_at(re, text);
        FAIL("the match returned");
    } catch (const smol::error & e) {
        CHECK(e.status == SMOL_ERR_UNSUPPORTED);
        CHECK(contains(e.what(), "backtracks"));
    }
}
