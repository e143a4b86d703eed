// smol-regex.h - the regular expressions of pre-tokenizers: the patterns
// tokenizer.json files split text with (GPT-2's, Qwen's, DeepSeek's ...),
// compiled once and matched over decoded code points with Perl semantics
// (leftmost, ordered alternation, greedy quantifiers with backtracking).
//
// The syntax is the subset those patterns use: literals (UTF-8), escapes
// (\r \n \t \f \v, \s \S \d \D, \p{L} \p{N} \p{P} \p{S} \p{M} \p{Z} \p{C}
// and \P{..}, escaped punctuation), classes with ranges and negation, the
// groups (...) (?:...) (?i:...), lookahead (?=...) (?!...), the quantifiers
// ? * + {n} {n,} {n,m} (greedy), . ^ $ and |. Anything else is refused when
// the pattern is compiled, naming it.

#ifndef SMOL_REGEX_H
#define SMOL_REGEX_H

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace smol {

class regex {
  public:
    // Throws smol::error SMOL_ERR_UNSUPPORTED naming the construct and its
    // offset for a pattern outside the subset.
    explicit regex(std::string_view pattern);

    const std::string & pattern() const { return pattern_; }

    // The length of the preferred non-empty match of the pattern starting
    // at cpt[pos], looking no further than cpt[end] (lookahead and $ see
    // end as the end of the text); 0 when there is none. flg holds each
    // code point's smol::unicode flags.
    uint32_t match(const uint32_t * cpt, const uint16_t * flg, uint32_t pos, uint32_t end) const;

    // The program, for tests and errors.
    std::string dump() const;

    struct set_item {
        uint32_t lo, hi; // a code point range, when mask == 0
        uint16_t mask;   // unicode flags, matched when a code point has one
        bool negated;    // the item matches what it would not (\S, \P{L})
    };
    struct char_set {
        std::vector<set_item> items;
        bool negated = false;
        bool icase = false; // ASCII letters match either case
    };
    enum class op : uint8_t { set, split, jump, match, text_end, look_ahead };
    struct insn {
        op o;
        bool negate = false; // look_ahead: (?!...)
        int32_t x = 0;       // set: its index; split/jump: a target; look_ahead: sub-program
        int32_t y = 0;       // split: the second (less preferred) target
    };

  private:
    bool set_matches(const char_set & s, uint32_t c, uint16_t f) const;
    bool run(int32_t prog, const uint32_t * cpt, const uint16_t * flg, uint32_t pos, uint32_t end,
             uint32_t * len, bool not_null) const;

    std::string pattern_;
    std::vector<char_set> sets_;
    std::vector<std::vector<insn>> progs_; // [0] is the pattern; the rest are lookaheads
};

} // namespace smol

#endif // SMOL_REGEX_H
