// test-grammar.c++ - grammars for constrained decoding: GBNF parsing (and
// its errors, with positions), the matcher against std::regex on random
// regular grammars, the token mask against a token-by-token check over the
// real SmolLM2 vocabulary, JSON schemas turned into grammars, and the
// sampler that applies them.

#include "smol-error.h"
#include "smol-grammar.h"
#include "smol-llama.h"
#include "smol.h"
#include "test-seed.h"

#include <algorithm>
#include <cmath>
#include <doctest/doctest.h>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace {

std::shared_ptr<const smol::grammar> parse(const std::string & text) {
    return std::make_shared<const smol::grammar>(smol::parse_gbnf(text));
}

// Whether the whole text is a sentence of the grammar.
bool matches(const std::shared_ptr<const smol::grammar> & g, const std::string & text) {
    smol::grammar_matcher m(g);
    return m.accept(text) && m.complete();
}

// Whether the text is a prefix of some sentence.
bool prefix(const std::shared_ptr<const smol::grammar> & g, const std::string & text) {
    smol::grammar_matcher m(g);
    return m.accept(text);
}

std::string parse_error(const std::string & text) {
    try {
        smol::parse_gbnf(text);
    } catch (const smol::error & e) {
        CHECK(e.status == SMOL_ERR_INVALID_ARGUMENT);
        return e.what();
    }
    return "(parsed)";
}

bool has(const std::string & s, const std::string & part) {
    return s.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("GBNF with every construct parses and matches what it says") {
    const auto g = parse(R"(# a comment line
root ::= greeting ( " " name )? "!"{1,3} tail   # trailing comment
greeting ::= "hi" | "hello" | "h\u00e9"
name ::= [A-Z] [a-z]* | "\"" [^"\n]+ "\""
tail ::= ( [0-9] | . )*
)");
    CHECK(matches(g, "hi!"));
    CHECK(matches(g, "hello Bob!!!"));
    CHECK(matches(g, "h\xc3\xa9 \"x y\"!"));
    CHECK(matches(g, "hi!!x9"));
    CHECK(matches(g, "hi Z!"));
    CHECK_FALSE(matches(g, "hi"));
    CHECK_FALSE(matches(g, "hey!"));
    CHECK_FALSE(matches(g, "hi bob!"));
    CHECK_FALSE(matches(g, "hi \"\"!"));
    CHECK(prefix(g, "hello B"));
    CHECK_FALSE(prefix(g, "hello b"));
    // Newlines inside groups and after '|' continue a rule.
    const auto g2 = parse("root ::= (\n  \"a\"\n  | \"b\"\n) |\n  \"c\"\n");
    CHECK(matches(g2, "a"));
    CHECK(matches(g2, "b"));
    CHECK(matches(g2, "c"));
}

TEST_CASE("repetitions take exactly the counts they name") {
    const auto g = parse("root ::= \"a\"{2,4} \"b\"{3} \"c\"{2,} \"d\"{,1}\n");
    for (int a = 0; a < 6; ++a) {
        for (int c = 0; c < 5; ++c) {
            for (int d = 0; d < 3; ++d) {
                const std::string s = std::string(size_t(a), 'a') + "bbb" +
                                      std::string(size_t(c), 'c') + std::string(size_t(d), 'd');
                INFO(s);
                CHECK(matches(g, s) == (a >= 2 && a <= 4 && c >= 2 && d <= 1));
            }
        }
    }
}

TEST_CASE("escapes and classes read as llama.cpp's GBNF does") {
    const auto g = parse(R"(root ::= "\x41\t\\" [\]\-a-c] [^\x00-\x7F] "\U0001F600")"
                         "\n");
    CHECK(matches(g, "A\t\\]\xc3\xa9\xf0\x9f\x98\x80"));
    CHECK(matches(g, "A\t\\-\xe4\xb8\xad\xf0\x9f\x98\x80"));
    CHECK(matches(g, "A\t\\b\xc3\xa9\xf0\x9f\x98\x80"));
    CHECK_FALSE(matches(g, "A\t\\d\xc3\xa9\xf0\x9f\x98\x80"));
    CHECK_FALSE(matches(g, "A\t\\]e\xf0\x9f\x98\x80"));
}

TEST_CASE("a character may arrive a byte at a time") {
    const auto g = parse("root ::= [\\u00e0-\\u00ff]+ \"\xe2\x82\xac\"\n");
    smol::grammar_matcher m(g);
    const std::string text = "\xc3\xa9\xc3\xa0\xe2\x82\xac";
    for (size_t i = 0; i < text.size(); ++i) {
        INFO("byte ", i);
        REQUIRE(m.accept(text.substr(i, 1)));
        CHECK(m.complete() == (i + 1 == text.size()));
    }
    smol::grammar_matcher n(g);
    // 0xC2 starts U+0080..U+00BF only: none is in the class or the euro.
    CHECK_FALSE(n.accept("\xc2"));
    CHECK(n.accept("\xc3"));
    CHECK_FALSE(n.accept("a"));    // not a continuation byte
    CHECK_FALSE(n.accept("\xff")); // never in UTF-8
}

TEST_CASE("bad grammars are refused at the line and column of the fault") {
    CHECK(has(parse_error("root ::= \"a\"\nx ::= \"b\n"), "line 2, column 7: a string literal"));
    CHECK(has(parse_error("root ::= [a-z\n"), "line 1, column 10: a character class"));
    CHECK(has(parse_error("root ::= ( \"a\" \n"), "line 1, column 10: a '('"));
    CHECK(has(parse_error("root ::= \"a\" | \n  thing\n"),
              "line 2, column 3: rule 'thing' is not defined"));
    CHECK(has(parse_error("root = \"a\"\n"), "line 1, column 6: expected '::='"));
    CHECK(has(parse_error("root ::= \"\\q\"\n"), "line 1, column 11: unknown escape"));
    CHECK(has(parse_error("root ::= * \"a\"\n"), "line 1, column 10: '*' must follow"));
    CHECK(
        has(parse_error("root ::= \"a\"{3,1}\n"), "line 1, column 13: a repetition whose maximum"));
    CHECK(has(parse_error("root ::= [z-a]\n"), "line 1, column 13: a character range"));
    CHECK(has(parse_error("root ::= \"a\" )\n"), "line 1, column 14: unexpected ')'"));
    CHECK(has(parse_error("root ::= \"a\"\nroot ::= \"b\"\n"),
              "line 2, column 1: rule 'root' is defined twice"));
    CHECK(has(parse_error("start ::= \"a\"\n"), "no rule 'root'"));
    CHECK(has(parse_error("root ::= \"a\"{99999}\n"), "a repetition count past"));
    CHECK(has(
        parse_error("root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')') + "\n"),
        "line 1, column 266: groups nest deeper than 256"));
    CHECK(has(parse_error("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"\n"),
              "rule 'expr' is left-recursive"));
    CHECK(has(parse_error("root ::= a\na ::= b? a \"x\"\nb ::= \"b\"\n"),
              "rule 'a' is left-recursive"));
}

TEST_CASE("a chain of rules too long to expand is refused, not followed down") {
    std::string text = "root ::= r0\n";
    for (int i = 0; i < 3000; ++i)
        text += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + " \"x\"\n";
    text += "r3000 ::= \"y\"\n";
    const auto g = parse(text);
    CHECK_THROWS_WITH_AS(smol::grammar_matcher{g},
                         doctest::Contains("rule 'root' cannot start: it reaches over 1024"),
                         smol::error);
    // A short chain is followed.
    CHECK(matches(parse("root ::= a \"2\"\na ::= b \"1\"\nb ::= \"0\"\n"), "012"));
}

TEST_CASE("a start or step that takes too many expansions is refused") {
    // 300 ways to start, each down a chain of rules to "a": each way costs
    // the chain's length in expansions. 100 rules deep the text is read;
    // 1,000 deep (300,000 expansions, under the other limits) the grammar
    // is refused.
    auto chained = [](int depth, const char * first = "") {
        std::string text = std::string("root ::= ") + first + " x\nx ::= r0";
        for (int i = 1; i < 300; ++i) text += " | r0";
        text += "\n";
        for (int i = 0; i < depth; ++i)
            text += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
        return parse(text + "r" + std::to_string(depth) + " ::= \"a\"\n");
    };
    CHECK(matches(chained(100), "a"));
    CHECK_THROWS_WITH_AS(smol::grammar_matcher{chained(1000)},
                         doctest::Contains("or takes over 262144 expansions to list them"),
                         smol::error);
    // The same after a first character: the step that reads it is refused.
    CHECK(matches(chained(100, "\"b\""), "ba"));
    smol::grammar_matcher m(chained(1000, "\"b\""));
    CHECK_FALSE(m.accept("b"));
    CHECK(m.can_continue());
    // A start of over grammar_max_stacks ways is refused as a step would be.
    std::string wide = "root ::= \"a\"";
    for (size_t i = 0; i < smol::grammar_max_stacks; ++i) wide += " | \"a\"";
    CHECK_THROWS_WITH_AS(smol::grammar_matcher{parse(wide + "\n")},
                         doctest::Contains("over 4096 ways to read one"), smol::error);
}

TEST_CASE("an ambiguous grammar keeps its stacks few") {
    const auto g = parse("root ::= ( \"a\" | \"a\" | [a-b] )* \"c\"\n");
    smol::grammar_matcher m(g);
    for (int i = 0; i < 500; ++i) REQUIRE(m.accept("a"));
    CHECK(m.accept("c"));
    CHECK(m.complete());
}

TEST_CASE("a step past the stacks' limit is refused alike each time it is tried") {
    // Each '+' on a '+' doubles the ways to read a character: a dozen
    // characters in, a step takes the stacks past grammar_max_stacks and is
    // refused. The matcher remembers such a step and refuses it again
    // without expanding; a fresh matcher, which remembers nothing, must
    // answer the same, and a refused byte leaves the state as it was.
    const auto g = parse("root ::= \"{\" ( [^\"]{4} " + std::string(39, '+') + " )* \"}\"\n");
    smol::grammar_matcher m(g);
    std::string text = "{";
    REQUIRE(m.accept(text));
    int refused = 0;
    for (int i = 0; i < 40; ++i) {
        const std::string b(1, "ab}"[i % 3]);
        CAPTURE(i);
        smol::grammar_matcher fresh(g);
        REQUIRE(fresh.accept(text));
        const bool want = fresh.allows(b);
        const bool complete = m.complete(), more = m.can_continue();
        CHECK(m.allows(b) == want);
        CHECK(m.accept(b) == want);
        if (want) {
            text += b;
        } else {
            ++refused;
            CHECK(m.complete() == complete);
            CHECK(m.can_continue() == more);
        }
    }
    CHECK(refused > 0);
    // Fed anew, the same text reads the same way.
    m.reset();
    CHECK(m.accept(text));
}

TEST_CASE("the matcher agrees with std::regex on random regular grammars") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    // A random expression as GBNF and as an ECMAScript regex; nullable ones
    // are never repeated (GBNF's matcher refuses that as left recursion).
    struct expr {
        std::string gbnf, re;
        bool nullable;
    };
    std::function<expr(int)> gen = [&](int depth) -> expr {
        const int k = depth > 3 ? int(rng() % 3) : int(rng() % 7);
        switch (k) {
        case 0: {
            const std::string c(1, char('a' + rng() % 3));
            return {"\"" + c + "\"", c, false};
        }
        case 1:
            return {"[ab]", "[ab]", false};
        case 2:
            return {"[^a]", "[bc]", false};
        case 3: { // sequence
            expr a = gen(depth + 1), b = gen(depth + 1);
            return {a.gbnf + " " + b.gbnf, a.re + b.re, a.nullable && b.nullable};
        }
        case 4: { // alternation
            expr a = gen(depth + 1), b = gen(depth + 1);
            return {"( " + a.gbnf + " | " + b.gbnf + " )", "(?:" + a.re + "|" + b.re + ")",
                    a.nullable || b.nullable};
        }
        default: { // repetition
            expr a = gen(depth + 1);
            const std::string ag = "( " + a.gbnf + " )", ar = "(?:" + a.re + ")";
            const int r = int(rng() % 4);
            if (r == 0) return {ag + "?", ar + "?", true};
            if (a.nullable) return {ag + "?", ar + "?", true};
            if (r == 1) return {ag + "*", ar + "*", true};
            if (r == 2) return {ag + "+", ar + "+", false};
            const int lo = int(rng() % 3), hi = lo + int(rng() % 3);
            return {ag + "{" + std::to_string(lo) + "," + std::to_string(hi) + "}",
                    ar + "{" + std::to_string(lo) + "," + std::to_string(hi) + "}", lo == 0};
        }
        }
    };
    int n_checked = 0, n_matched = 0;
    for (int gi = 0; gi < 60; ++gi) {
        const expr e = gen(0);
        INFO("grammar: ", e.gbnf);
        const auto g = parse("root ::= " + e.gbnf + "\n");
        const std::regex re(e.re);
        for (int si = 0; si < 150; ++si) {
            std::string s;
            const size_t len = rng() % 9;
            for (size_t i = 0; i < len; ++i) s += char('a' + rng() % 3);
            INFO("text: ", s);
            const bool want = std::regex_match(s, re);
            CHECK(matches(g, s) == want);
            // A prefix is accepted exactly when some sentence starts with it:
            // at least every prefix of a match is.
            if (want) CHECK(prefix(g, s.substr(0, rng() % (s.size() + 1))));
            ++n_checked;
            n_matched += want;
        }
    }
    MESSAGE(n_checked << " texts checked, " << n_matched << " of them sentences");
}

// --- the token mask over the real vocabulary -----------------------------------

namespace {

struct model_deleter {
    void operator()(smol_model * m) const { smol_model_free(m); }
};
using model_ptr = std::unique_ptr<smol_model, model_deleter>;

bool real_absent() {
    return !std::filesystem::exists(SMOL_MODEL);
}

model_ptr load_real() {
    smol_model * m = nullptr;
    REQUIRE(smol_model_load(SMOL_MODEL, nullptr, &m) == SMOL_OK);
    return model_ptr(m);
}

// The mask by trying each token on its own copy of the matcher.
std::vector<uint8_t> brute_mask(const smol::grammar_matcher & m, const smol::grammar_vocab & v) {
    std::vector<uint8_t> out(size_t(v.n_vocab), 0);
    for (smol_token t = 0; t < v.n_vocab; ++t) {
        if (std::find(v.eog.begin(), v.eog.end(), t) != v.eog.end()) {
            out[size_t(t)] = m.complete();
        } else if (!v.pieces[size_t(t)].empty()) {
            smol::grammar_matcher c = m;
            out[size_t(t)] = c.accept(v.pieces[size_t(t)]);
        }
    }
    return out;
}

} // namespace

TEST_CASE("the token mask equals trying every token of SmolLM2's vocabulary" *
          doctest::skip(real_absent())) {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    model_ptr model = load_real();
    const auto v = smol::model_grammar_vocab(*model->m);
    REQUIRE(v->n_vocab == 49152);
    const std::string schema = R"({"type":"object","properties":{
        "name":{"type":"string","maxLength":12},
        "tags":{"type":"array","items":{"enum":["a b","\u00e9t\u00e9","\u4e2d\u6587"]},"maxItems":3},
        "n":{"type":"integer"}},"required":["name"]})";
    const std::vector<std::string> grammars = {
        smol::json_object_gbnf(),
        smol::json_schema_to_gbnf(schema),
        "root ::= ( [\\u4e00-\\u9fff] | \"\xc3\xa9\" | [ ,.] )+ \"!\"\n",
        "root ::= [^a-z]* \"end\"\n",
    };
    int n_masks = 0;
    long n_allowed = 0;
    for (const std::string & text : grammars) {
        const auto g = parse(text);
        for (int walk = 0; walk < 3; ++walk) {
            smol::grammar_matcher m(g);
            std::vector<uint8_t> fast;
            for (int step = 0; step < 12; ++step) {
                m.mask(*v, fast);
                const std::vector<uint8_t> slow = brute_mask(m, *v);
                INFO("grammar ", &text - grammars.data(), ", walk ", walk, ", step ", step);
                REQUIRE(fast == slow);
                ++n_masks;
                std::vector<smol_token> ok;
                for (smol_token t = 0; t < v->n_vocab; ++t) {
                    if (fast[size_t(t)] && !v->pieces[size_t(t)].empty()) ok.push_back(t);
                }
                n_allowed += long(ok.size());
                if (ok.empty()) break;
                // Prefer short tokens now and then, so that walks also stop
                // inside characters.
                const smol_token t = ok[rng() % ok.size()];
                REQUIRE(m.accept(v->pieces[size_t(t)]));
            }
        }
    }
    MESSAGE(n_masks << " masks over 49152 tokens equal the token-by-token check (" << n_allowed
                    << " tokens allowed in all)");
}

namespace {

// A random grammar of bounded runs of classes that meet, contain or miss one
// another, so that states take a class in one way, in several, or not at
// all, with literals and alternatives between them.
std::string random_run_grammar(std::mt19937 & rng) {
    const char * classes[] = {
        "[a-z]", "[a-m0-9]", "[^\"\\\\\\x7F\\x00-\\x1F]",        "[ \\t]",   "[0-9]",
        ".",     "[^a-z]",   "[\\u00e0-\\u00ff\\u4e00-\\u9fff]", "[a-zA-Z ]"};
    const char * literals[] = {"\"\\\"\"", "\"x\"", "\" \"", "\"ab\"", "\"\\u00e9\"", "\",\""};
    const auto pick = [&rng](size_t n) { return size_t(rng() % n); };
    const auto element = [&]() -> std::string {
        if (rng() % 4 == 0) return literals[pick(std::size(literals))];
        const uint32_t lo = rng() % 3, hi = lo + 1 + rng() % 30;
        std::string e = classes[pick(std::size(classes))];
        return e + "{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
    };
    const auto sequence = [&]() {
        std::string s;
        for (int i = 0, n = 1 + int(rng() % 3); i < n; ++i) s += element() + " ";
        return s;
    };
    std::string seq = sequence();
    if (rng() % 2) seq = "( " + seq + " | " + sequence() + ")";
    return "root ::= " + seq + " ( \"\\\"\" " + sequence() + "){0,3} \"!\"\n";
}

// A random JSON schema: an object of bounded strings, integers, enums,
// arrays of bounded strings and a nested object.
std::string random_schema(std::mt19937 & rng) {
    const auto bounded = [&rng]() {
        const uint32_t hi = 1 + rng() % 40;
        std::string s = R"({"type":"string","maxLength":)" + std::to_string(hi);
        if (rng() % 3 == 0) s += R"(,"minLength":)" + std::to_string(rng() % (hi + 1));
        return s + "}";
    };
    std::string props;
    for (int i = 0, n = 1 + int(rng() % 4); i < n; ++i) {
        std::string p;
        switch (rng() % 5) {
        case 0:
            p = R"({"type":"integer"})";
            break;
        case 1:
            p = R"({"enum":["US","FR","a b"]})";
            break;
        case 2:
            p = R"({"type":"array","items":)" + bounded() + R"(,"maxItems":3})";
            break;
        case 3:
            p = R"({"type":"object","properties":{"s":)" + bounded() + R"(},"required":["s"]})";
            break;
        default:
            p = bounded();
        }
        props += std::string(i ? "," : "") + "\"p" + std::to_string(i) + "\":" + p;
    }
    return R"({"type":"object","properties":{)" + props + R"(},"required":["p0"]})";
}

} // namespace

TEST_CASE("masks and checks by runs of a class equal trying every token on random grammars" *
          doctest::skip(real_absent())) {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    model_ptr model = load_real();
    const auto v = smol::model_grammar_vocab(*model->m);
    int n_masks = 0, n_grammars = 0;
    long n_checks = 0;
    for (int round = 0; round < 16; ++round) {
        const std::string text =
            round % 2 ? random_run_grammar(rng) : smol::json_schema_to_gbnf(random_schema(rng));
        INFO("grammar:\n", text);
        const auto g = parse(text);
        ++n_grammars;
        smol::grammar_matcher m(g);
        std::vector<uint8_t> fast;
        for (int step = 0; step < 14; ++step) {
            INFO("step ", step);
            // The slow way: each token's text through allows() alone.
            std::vector<uint8_t> slow(size_t(v->n_vocab), 0);
            {
                smol::grammar_matcher c = m;
                for (smol_token t = 0; t < v->n_vocab; ++t) {
                    if (std::find(v->eog.begin(), v->eog.end(), t) != v->eog.end()) {
                        slow[size_t(t)] = c.complete();
                    } else if (!v->pieces[size_t(t)].empty()) {
                        slow[size_t(t)] = c.allows(v->pieces[size_t(t)]);
                    }
                }
            }
            // Checks one token at a time, before any mask, on a copy, and
            // the mask after them on the matcher itself.
            {
                smol::grammar_matcher c = m;
                for (int k = 0; k < 3000; ++k) {
                    const smol_token t = smol_token(rng() % uint32_t(v->n_vocab));
                    INFO("token ", t, " '", v->pieces[size_t(t)], "'");
                    REQUIRE(c.allows_token(*v, t) == bool(slow[size_t(t)]));
                    ++n_checks;
                }
            }
            m.mask(*v, fast);
            for (smol_token t = 0; t < v->n_vocab; ++t) {
                INFO("token ", t, " '", v->pieces[size_t(t)], "'");
                REQUIRE(fast[size_t(t)] == slow[size_t(t)]);
            }
            ++n_masks;
            std::vector<smol_token> ok;
            for (smol_token t = 0; t < v->n_vocab; ++t) {
                if (fast[size_t(t)] && !v->pieces[size_t(t)].empty()) ok.push_back(t);
            }
            if (ok.empty()) break;
            // Often the longest allowed token, so that walks reach the ends
            // of bounded runs; else any.
            smol_token t = ok[rng() % ok.size()];
            if (rng() % 2) {
                for (const smol_token u : ok) {
                    if (v->pieces[size_t(u)].size() > v->pieces[size_t(t)].size()) t = u;
                }
            }
            REQUIRE(m.accept(v->pieces[size_t(t)]));
        }
    }
    MESSAGE(n_masks << " masks and " << n_checks << " checks on " << n_grammars
                    << " random grammars equal the token-by-token check");
}

// --- JSON schemas ----------------------------------------------------------------

namespace {

std::shared_ptr<const smol::grammar> schema(const std::string & s) {
    return parse(smol::json_schema_to_gbnf(s));
}

std::string schema_error(const std::string & s) {
    try {
        smol::json_schema_to_gbnf(s);
    } catch (const smol::error & e) {
        CHECK(e.status == SMOL_ERR_INVALID_ARGUMENT);
        return e.what();
    }
    return "(converted)";
}

} // namespace

TEST_CASE("an object schema takes its properties in order, required ones always") {
    const auto g = schema(R"({"type":"object","properties":{
        "city":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]},
        "days":{"type":"integer","minimum":1}},"required":["city"]})");
    CHECK(matches(g, R"({"city":"Paris"})"));
    CHECK(matches(g, R"({"city": "Paris", "unit": "celsius", "days": 3})"));
    CHECK(matches(g, R"({"city":"Paris","days":10})"));
    CHECK(matches(g, "{\n  \"city\": \"P\\u00e9\\n\"\n}"));
    CHECK_FALSE(matches(g, R"({"unit":"celsius"})"));                // city is required
    CHECK_FALSE(matches(g, R"({"city":"Paris","unit":"kelvin"})"));  // not in the enum
    CHECK_FALSE(matches(g, R"({"unit":"celsius","city":"Paris"})")); // out of order
    CHECK_FALSE(matches(g, R"({"city":"Paris","days":0})"));         // minimum 1
    CHECK_FALSE(matches(g, R"({"city":"Paris","country":"FR"})"));   // no extra keys
    CHECK_FALSE(matches(g, R"({"city":"Paris",})"));
    CHECK_FALSE(matches(g, "{\"city\":\"a\nb\"}")); // a raw newline in a string
}

TEST_CASE("schemas of every supported kind accept what they should") {
    struct sample {
        const char * schema;
        std::vector<const char *> good, bad;
    };
    const std::vector<sample> cases = {
        {R"({"type":"array","items":{"type":"number"},"minItems":1,"maxItems":3})",
         {"[1]", "[1, -2.5, 3e10]", "[0.5,1E-3]"},
         {"[]", "[1,2,3,4]", "[01]", "[1.]", "[\"1\"]"}},
        {R"({"type":"string","minLength":2,"maxLength":3})",
         {"\"ab\"", "\"a\\nb\"", "\"\xc3\xa9\xc3\xa9\xc3\xa9\""},
         {"\"a\"", "\"abcd\"", "ab"}},
        {R"({"anyOf":[{"type":"integer"},{"type":"null"},{"type":"boolean"}]})",
         {"1", "-20", "null", "true"},
         {"1.5", "\"x\"", "nul"}},
        {R"({"type":["string","null"]})", {"\"x\"", "null"}, {"1"}},
        {R"({"const":{"a":[1,"x"]}})", {"{\"a\":[1,\"x\"]}"}, {"{\"a\":[1,\"y\"]}"}},
        {R"({"type":"string","format":"date"})", {"\"2024-02-29\""}, {"\"2024-13-01\"", "\"x\""}},
        {R"({"type":"string","format":"date-time"})",
         {"\"2024-02-29T12:30:00Z\"", "\"2024-02-29T12:30:00.5+02:00\""},
         {"\"2024-02-29 12:30:00Z\""}},
        {R"({"type":"string","format":"uuid"})",
         {"\"123e4567-e89b-12d3-a456-426614174000\""},
         {"\"123e4567e89b12d3a456426614174000\""}},
        {R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
             "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},
             "$ref":"#/$defs/node"})",
         {"{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[]}]}"},
         {"{\"kids\":[]}", "{\"v\":1,\"kids\":[{}]}"}},
        {R"({"type":"object"})", {"{}", "{\"a\":{\"b\":[1,null]}}"}, {"[]", "{\"a\"}"}},
        {R"({"type":"object","additionalProperties":{"type":"integer"}})",
         {"{}", "{\"a\":1,\"b\":2}"},
         {"{\"a\":\"x\"}"}},
        {R"({"type":"object","properties":{"a":{"type":"boolean"},"b":{"type":"null"}}})",
         {"{}", "{\"a\":true}", "{\"b\":null}", "{\"a\":false,\"b\":null}"},
         {"{,\"b\":null}", "{\"b\":null,\"a\":true}"}},
        {"true", {"1", "[]", "{\"x\":\"y\"}"}, {"", "x"}},
    };
    for (const sample & c : cases) {
        INFO("schema: ", c.schema);
        const auto g = schema(c.schema);
        for (const char * s : c.good) {
            INFO("good: ", s);
            CHECK(matches(g, s));
        }
        for (const char * s : c.bad) {
            INFO("bad: ", s);
            CHECK_FALSE(matches(g, s));
        }
    }
}

TEST_CASE("unsupported or bad schemas are refused naming the schema path") {
    CHECK(has(
        schema_error(R"({"type":"object","properties":{"a":{"type":"string","pattern":"x+"}}})"),
        "#/properties/a/pattern: the keyword 'pattern' is not supported"));
    CHECK(has(schema_error(R"({"type":"array","items":{"type":"strin"}})"),
              "#/items/type: unknown type 'strin'"));
    CHECK(has(schema_error(R"({"$ref":"#/$defs/missing"})"),
              "#/$ref: '#/$defs/missing' names nothing"));
    CHECK(has(schema_error(R"({"$ref":"http://x/y.json"})"), "only local references"));
    CHECK(has(schema_error(R"({"type":"object","properties":{"a":{}},"required":["b"]})"),
              "#/required: names 'b'"));
    CHECK(has(schema_error(R"({"type":"string","maxLength":1,"minLength":2})"),
              "#/maxLength: is below minLength"));
    CHECK(has(schema_error(R"({"type":"integer","minimum":5})"), "#/minimum"));
    CHECK(has(schema_error("{\"type\":"), "not JSON"));
    std::string deep = "{\"type\":\"string\"}";
    for (int i = 0; i < 100; ++i) deep = "{\"type\":\"array\",\"items\":" + deep + "}";
    CHECK(has(schema_error(deep), "nests deeper than"));
}

// --- the sampler ------------------------------------------------------------------

TEST_CASE("a sampler with a grammar only draws what the grammar allows" *
          doctest::skip(real_absent())) {
    SMOL_TEST_DRAW_SEED(seed);
    model_ptr model = load_real();
    smol_model_info info;
    smol_model_get_info(model.get(), &info);
    smol_sampler_params p = smol_sampler_default_params();
    p.seed = seed;
    p.temperature = 1.5f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    smol_sampler * s = nullptr;
    REQUIRE(smol_sampler_create(&p, &s) == SMOL_OK);
    std::unique_ptr<smol_sampler, void (*)(smol_sampler *)> hold(s, smol_sampler_free);
    CHECK(smol_sampler_set_grammar(s, model.get(), "root ::= \"x\" (") ==
          SMOL_ERR_INVALID_ARGUMENT);
    CHECK(has(smol_last_error(), "line 1, column 14"));
    {
        // A greedy sampler with a grammar no longer takes the plain argmax.
        smol_sampler_params g = p;
        g.temperature = 0.0f;
        smol_sampler * greedy = nullptr;
        REQUIRE(smol_sampler_create(&g, &greedy) == SMOL_OK);
        std::unique_ptr<smol_sampler, void (*)(smol_sampler *)> hold_g(greedy, smol_sampler_free);
        CHECK(smol_sampler_is_greedy(greedy));
        REQUIRE(smol_sampler_set_grammar(greedy, model.get(), "root ::= \"x\"") == SMOL_OK);
        CHECK_FALSE(smol_sampler_is_greedy(greedy));
    }
    REQUIRE(smol_sampler_set_grammar(s, model.get(),
                                     "root ::= (\"yes\" | \"no\") \" \"? [0-9]{1,3}\n") == SMOL_OK);
    const auto g = parse("root ::= (\"yes\" | \"no\") \" \"? [0-9]{1,3}\n");
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 3.0f);
    std::vector<float> logits(size_t(info.n_vocab));
    for (int run = 0; run < 20; ++run) {
        smol_sampler_reset(s);
        std::string text;
        for (int i = 0; i < 10; ++i) {
            for (float & x : logits) x = d(rng);
            const smol_token t = smol_sampler_sample(s, logits.data(), info.n_vocab);
            REQUIRE(t >= 0);
            if (smol_token_is_eog(model.get(), t)) break;
            char buf[256];
            size_t n = 0;
            REQUIRE(smol_token_to_piece(model.get(), t, false, buf, sizeof buf, &n) == SMOL_OK);
            text.append(buf, n);
            smol_sampler_accept(s, t);
        }
        INFO("text: ", text);
        CHECK(matches(g, text));
    }
}

namespace {

struct sampler_deleter {
    void operator()(smol_sampler * s) const { smol_sampler_free(s); }
};
using sampler_ptr = std::unique_ptr<smol_sampler, sampler_deleter>;

sampler_ptr make_sampler(const smol_sampler_params & p) {
    smol_sampler * s = nullptr;
    REQUIRE(smol_sampler_create(&p, &s) == SMOL_OK);
    return sampler_ptr(s);
}

} // namespace

// Steps a sampling case takes: under an emulator (the ARM cross build under
// qemu, where test-grammar is the slowest test and this its slowest case) a
// third of them, the same checks.
#if defined(SMOL_TEST_EMULATED)
constexpr int sampled_steps = 20;
#else
constexpr int sampled_steps = 60;
#endif

TEST_CASE("greedy and top-k with a grammar draw what plain sampling of masked logits draws, "
          "the mask made ahead or not" *
          doctest::skip(real_absent())) {
    SMOL_TEST_DRAW_SEED(seed);
    model_ptr model = load_real();
    const auto v = smol::model_grammar_vocab(*model->m);
    // The second grammar stays in one state for most of its text, so the
    // sampler answers from what it remembers of that state.
    const std::string gbnfs[] = {
        smol::json_schema_to_gbnf(
            R"({"type":"object","properties":{"a":{"type":"string","maxLength":8},
            "b":{"type":"array","items":{"type":"integer"},"maxItems":4}},"required":["a"]})"),
        R"(root ::= "\"" [^"\\]* "\"")"};
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 2.0f);
    int n_steps = 0, n_ended = 0, n_fast = 0;
    for (const std::string & gbnf : gbnfs)
        for (const int32_t top_k : {0, 5, 40}) {
            const auto g = parse(gbnf);
            smol_sampler_params p = smol_sampler_default_params();
            p.seed = seed;
            p.temperature = top_k == 0 ? 0.0f : 0.9f;
            p.top_k = top_k;
            p.top_p = 0.9f;
            p.min_p = 0.05f;
            sampler_ptr with = make_sampler(p), plain = make_sampler(p), prepared = make_sampler(p);
            REQUIRE(smol_sampler_set_grammar(with.get(), model.get(), gbnf.c_str()) == SMOL_OK);
            REQUIRE(smol_sampler_set_grammar(prepared.get(), model.get(), gbnf.c_str()) == SMOL_OK);
            smol::grammar_matcher m(g);
            std::vector<float> logits(size_t(v->n_vocab)), masked;
            for (int step = 0; step < sampled_steps; ++step) {
                for (float & x : logits) x = d(rng);
                const std::vector<uint8_t> allowed = brute_mask(m, *v);
                // Now and then the best tokens are all ones the grammar allows
                // (what the sampler checks first then suffices), else some are
                // not (it needs the mask).
                std::vector<smol_token> ok;
                for (smol_token t = 0; t < v->n_vocab; ++t) {
                    if (allowed[size_t(t)]) ok.push_back(t);
                }
                const int boost = int(rng() % 3);
                for (int k = 0; k < 50 && boost > 0; ++k) {
                    logits[size_t(boost == 1 ? ok[rng() % ok.size()] : rng() % logits.size())] +=
                        12.0f;
                }
                masked = logits;
                for (size_t t = 0; t < masked.size(); ++t) {
                    if (!allowed[t]) masked[t] = -INFINITY;
                }
                // The mask made ahead on another thread (twice now and then),
                // as the engine makes it while a device runs the step.
                std::thread ahead([&] {
                    for (int k = 0; k < 1 + step % 2; ++k) smol_sampler_prepare(prepared.get());
                });
                const smol_token a = smol_sampler_sample(with.get(), logits.data(), v->n_vocab);
                n_fast += boost == 1;
                const smol_token b = smol_sampler_sample(plain.get(), masked.data(), v->n_vocab);
                ahead.join();
                const smol_token c = smol_sampler_sample(prepared.get(), logits.data(), v->n_vocab);
                INFO("top_k ", top_k, ", step ", step);
                REQUIRE(a == b);
                REQUIRE(c == a);
                ++n_steps;
                if (std::find(v->eog.begin(), v->eog.end(), a) != v->eog.end()) {
                    ++n_ended;
                    break;
                }
                smol_sampler_accept(with.get(), a);
                smol_sampler_accept(plain.get(), b);
                smol_sampler_accept(prepared.get(), c);
                REQUIRE(m.accept(v->pieces[size_t(a)]));
            }
        }
    MESSAGE(n_steps << " steps drew the same token (" << n_fast << " with allowed tokens best), "
                    << n_ended << " of 6 runs ended");
}

TEST_CASE("temperature with a grammar draws from the masked softmax" *
          doctest::skip(real_absent())) {
    SMOL_TEST_DRAW_SEED(seed);
    model_ptr model = load_real();
    const auto v = smol::model_grammar_vocab(*model->m);
    smol_sampler_params p = smol_sampler_default_params();
    p.seed = seed;
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    sampler_ptr s = make_sampler(p);
    REQUIRE(smol_sampler_set_grammar(s.get(), model.get(), "root ::= [a-c]\n") == SMOL_OK);
    std::vector<smol_token> abc;
    for (const char * piece : {"a", "b", "c"}) {
        const auto it = std::find(v->pieces.begin(), v->pieces.end(), piece);
        REQUIRE(it != v->pieces.end());
        abc.push_back(smol_token(it - v->pieces.begin()));
    }
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> logits(size_t(v->n_vocab));
    for (float & x : logits) x = d(rng);
    // Most draws of the unmasked softmax are refused, some are not: both
    // the redraws and the whole mask are taken.
    logits[size_t(abc[0])] = 10.0f;
    logits[size_t(abc[1])] = 9.0f;
    logits[size_t(abc[2])] = 7.0f;
    double z = 0;
    for (smol_token t : abc) z += std::exp(double(logits[size_t(t)]));
    const int n = 20000;
    std::vector<int> got(3, 0);
    for (int i = 0; i < n; ++i) {
        const smol_token t = smol_sampler_sample(s.get(), logits.data(), v->n_vocab);
        const auto it = std::find(abc.begin(), abc.end(), t);
        REQUIRE(it != abc.end());
        ++got[size_t(it - abc.begin())];
    }
    for (size_t k = 0; k < 3; ++k) {
        const double q = std::exp(double(logits[size_t(abc[k])])) / z;
        const double sigma = std::sqrt(n * q * (1 - q));
        INFO("token ", k, ": ", got[k], " draws, expected ", n * q);
        CHECK(std::abs(got[k] - n * q) < 5 * sigma + 1);
    }
}
