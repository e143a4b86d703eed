// smol-regex.c++ - the pre-tokenizer regular expressions of smol-regex.h: a
// recursive-descent parser to a small tree, compiled to a program for a
// backtracking machine (threads of program counter and position on an
// explicit stack; lookaheads as sub-programs run in place).

#include "smol-regex.h"

#include "smol-error.h"
#include "smol-unicode.h"

#include <memory>
#include <string>
#include <vector>

namespace smol {

namespace {

namespace uc = smol::unicode;

constexpr uint32_t k_inf = 0xFFFFFFFF;
// A match that backtracks this often is a pattern gone exponential on its
// input; it stops with an error instead of hanging the caller.
constexpr uint64_t k_max_steps = uint64_t(1) << 28;

struct node {
    enum kind { empty, set, cat, alt, repeat, look, text_end } k = empty;
    std::vector<std::unique_ptr<node>> kids;
    int32_t set_id = -1;
    uint32_t min = 0, max = 0; // repeat
    bool negate = false;       // look
};

bool nullable(const node & n) {
    switch (n.k) {
    case node::empty:
    case node::look:
    case node::text_end:
        return true;
    case node::set:
        return false;
    case node::cat:
        for (const auto & k : n.kids) {
            if (!nullable(*k)) return false;
        }
        return true;
    case node::alt:
        for (const auto & k : n.kids) {
            if (nullable(*k)) return true;
        }
        return false;
    case node::repeat:
        return n.min == 0 || nullable(*n.kids[0]);
    }
    return true;
}

class parser {
  public:
    parser(std::string_view p, std::vector<regex::char_set> & sets) : p_(p), sets_(sets) {}

    std::unique_ptr<node> parse() {
        auto n = parse_alt(false);
        if (i_ < p_.size()) fail("an unmatched ')'");
        return n;
    }

  private:
    [[noreturn]] void fail(const std::string & what) const {
        throw error(SMOL_ERR_UNSUPPORTED, "pre-tokenizer regex \"" + std::string(p_) +
                                              "\": " + what + " at offset " + std::to_string(i_) +
                                              " is not supported");
    }
    bool at_end() const { return i_ >= p_.size(); }
    char peek() const { return i_ < p_.size() ? p_[i_] : '\0'; }
    uint32_t next_cpt() {
        const auto d = uc::decode_utf8(p_.data() + i_, p_.size() - i_);
        i_ += d.len;
        return d.cpt;
    }

    std::unique_ptr<node> parse_alt(bool icase) {
        auto first = parse_cat(icase);
        if (peek() != '|') return first;
        auto n = std::make_unique<node>();
        n->k = node::alt;
        n->kids.push_back(std::move(first));
        while (peek() == '|') {
            i_++;
            n->kids.push_back(parse_cat(icase));
        }
        return n;
    }

    std::unique_ptr<node> parse_cat(bool icase) {
        auto n = std::make_unique<node>();
        n->k = node::cat;
        while (!at_end() && peek() != '|' && peek() != ')') n->kids.push_back(parse_repeat(icase));
        return n;
    }

    // {n}, {n,}, {n,m} at i_, or false (then '{' is a literal).
    bool parse_braces(uint32_t & lo, uint32_t & hi) {
        size_t j = i_ + 1;
        const auto number = [&](uint32_t & v) {
            const size_t from = j;
            v = 0;
            while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9' && v < 100000) {
                v = v * 10 + uint32_t(p_[j++] - '0');
            }
            return j > from;
        };
        if (!number(lo)) return false;
        hi = lo;
        if (j < p_.size() && p_[j] == ',') {
            j++;
            if (!number(hi)) hi = k_inf;
        }
        if (j >= p_.size() || p_[j] != '}') return false;
        if (hi < lo) fail("a repeat count {n,m} with m < n");
        if (lo > 1000 || (hi != k_inf && hi > 1000)) fail("a repeat count over 1000");
        i_ = j + 1;
        return true;
    }

    std::unique_ptr<node> parse_repeat(bool icase) {
        auto a = parse_atom(icase);
        for (;;) {
            uint32_t lo = 0, hi = 0;
            const char c = peek();
            if (c == '*') {
                lo = 0, hi = k_inf, i_++;
            } else if (c == '+') {
                lo = 1, hi = k_inf, i_++;
            } else if (c == '?') {
                lo = 0, hi = 1, i_++;
            } else if (c == '{' && parse_braces(lo, hi)) {
            } else {
                return a;
            }
            if (peek() == '?' || peek() == '+') fail("a lazy or possessive quantifier");
            if (hi == k_inf && nullable(*a)) fail("a repeated part that can match nothing");
            auto r = std::make_unique<node>();
            r->k = node::repeat;
            r->min = lo;
            r->max = hi;
            r->kids.push_back(std::move(a));
            a = std::move(r);
        }
    }

    std::unique_ptr<node> set_node(regex::char_set s) {
        sets_.push_back(std::move(s));
        auto n = std::make_unique<node>();
        n->k = node::set;
        n->set_id = int32_t(sets_.size()) - 1;
        return n;
    }

    static regex::set_item range(uint32_t lo, uint32_t hi) { return {lo, hi, 0, false}; }
    static regex::set_item flags(uint16_t mask, bool negated) { return {0, 0, mask, negated}; }

    // \p{X} / \P{X} after the backslash and letter: the category's flags.
    uint16_t category() {
        if (peek() != '{') fail("\\p without {name}");
        const size_t close = p_.find('}', i_);
        if (close == std::string_view::npos) fail("an unterminated \\p{");
        const std::string_view name = p_.substr(i_ + 1, close - i_ - 1);
        uint16_t m = 0;
        if (name == "L") m = uc::LETTER;
        if (name == "N") m = uc::NUMBER;
        if (name == "P") m = uc::PUNCTUATION;
        if (name == "S") m = uc::SYMBOL;
        if (name == "M") m = uc::MARK;
        if (name == "Z") m = uc::SEPARATOR;
        if (name == "C") m = uc::CONTROL | uc::UNDEFINED;
        if (m == 0) fail("the Unicode property \\p{" + std::string(name) + "}");
        i_ = close + 1;
        return m;
    }

    // An escape after its backslash, as set items; false for a literal
    // code point, stored in *lit.
    bool escape(std::vector<regex::set_item> & items, uint32_t * lit) {
        if (at_end()) fail("a trailing backslash");
        const char c = p_[i_++];
        switch (c) {
        case 's':
            items.push_back(flags(uc::WHITESPACE, false));
            return true;
        case 'S':
            items.push_back(flags(uc::WHITESPACE, true));
            return true;
        case 'd':
            items.push_back(range('0', '9'));
            return true;
        case 'p':
            items.push_back(flags(category(), false));
            return true;
        case 'P':
            items.push_back(flags(category(), true));
            return true;
        case 'r':
            *lit = '\r';
            return false;
        case 'n':
            *lit = '\n';
            return false;
        case 't':
            *lit = '\t';
            return false;
        case 'f':
            *lit = '\f';
            return false;
        case 'v':
            *lit = '\v';
            return false;
        default:
            break;
        }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
            i_--;
            fail(std::string("the escape \\") + c);
        }
        i_--;
        *lit = next_cpt();
        return false;
    }

    static void add_literal(regex::char_set & s, uint32_t lo, uint32_t hi) {
        s.items.push_back(range(lo, hi));
    }

    std::unique_ptr<node> parse_class(bool icase) {
        regex::char_set s;
        s.icase = icase;
        if (peek() == '^') {
            s.negated = true;
            i_++;
        }
        bool first = true;
        for (;;) {
            if (at_end()) fail("an unterminated [");
            if (peek() == ']' && !first) {
                i_++;
                break;
            }
            first = false;
            if (peek() == '[') fail("a nested [ (a set operation)");
            uint32_t lo = 0;
            if (peek() == '\\') {
                i_++;
                if (escape(s.items, &lo)) continue;
            } else {
                lo = next_cpt();
            }
            if (peek() == '-' && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
                i_++;
                uint32_t hi = 0;
                if (peek() == '\\') {
                    i_++;
                    std::vector<regex::set_item> none;
                    if (escape(none, &hi)) fail("a class range ending in a class escape");
                } else {
                    hi = next_cpt();
                }
                if (hi < lo) fail("a class range out of order");
                add_literal(s, lo, hi);
            } else {
                add_literal(s, lo, lo);
            }
        }
        return set_node(std::move(s));
    }

    std::unique_ptr<node> parse_atom(bool icase) {
        if (++depth_ > 200) fail("nesting deeper than 200");
        struct leave {
            int & d;
            ~leave() { d--; }
        } guard{depth_};
        const char c = peek();
        if (c == '(') {
            i_++;
            bool group_icase = icase;
            std::unique_ptr<node> n;
            if (peek() == '?') {
                i_++;
                const char k = p_.size() > i_ ? p_[i_++] : '\0';
                if (k == ':') {
                } else if (k == 'i' && peek() == ':') {
                    i_++;
                    group_icase = true;
                } else if (k == '=' || k == '!') {
                    auto l = std::make_unique<node>();
                    l->k = node::look;
                    l->negate = k == '!';
                    l->kids.push_back(parse_alt(icase));
                    n = std::move(l);
                } else {
                    fail(std::string("the group (?") + k);
                }
            }
            if (!n) n = parse_alt(group_icase);
            if (peek() != ')') fail("an unterminated (");
            i_++;
            return n;
        }
        if (c == '[') {
            i_++;
            return parse_class(icase);
        }
        if (c == '.') {
            i_++;
            regex::char_set s;
            s.negated = true;
            add_literal(s, '\n', '\n');
            return set_node(std::move(s));
        }
        if (c == '$') {
            i_++;
            auto n = std::make_unique<node>();
            n->k = node::text_end;
            return n;
        }
        if (c == '^') fail("the anchor ^");
        if (c == '*' || c == '+' || c == '?') fail("a quantifier with nothing to repeat");
        regex::char_set s;
        s.icase = icase;
        uint32_t lit = 0;
        if (c == '\\') {
            i_++;
            if (escape(s.items, &lit)) return set_node(std::move(s));
        } else {
            lit = next_cpt();
        }
        add_literal(s, lit, lit);
        return set_node(std::move(s));
    }

    std::string_view p_;
    size_t i_ = 0;
    int depth_ = 0;
    std::vector<regex::char_set> & sets_;
};

} // namespace

namespace {

using insn = regex::insn;
using op = regex::op;

struct compiler {
    std::vector<std::vector<insn>> & progs;

    int32_t here(int32_t p) const { return int32_t(progs[p].size()); }
    int32_t emit(int32_t p, insn i) {
        progs[p].push_back(i);
        return here(p) - 1;
    }

    void compile(int32_t p, const node & n) {
        switch (n.k) {
        case node::empty:
            return;
        case node::set:
            emit(p, {op::set, false, n.set_id, 0});
            return;
        case node::text_end:
            emit(p, {op::text_end, false, 0, 0});
            return;
        case node::cat:
            for (const auto & k : n.kids) compile(p, *k);
            return;
        case node::alt: {
            std::vector<int32_t> jumps;
            for (size_t i = 0; i < n.kids.size(); i++) {
                if (i + 1 < n.kids.size()) {
                    const int32_t split = emit(p, {op::split, false, 0, 0});
                    progs[p][split].x = here(p);
                    compile(p, *n.kids[i]);
                    jumps.push_back(emit(p, {op::jump, false, 0, 0}));
                    progs[p][split].y = here(p);
                } else {
                    compile(p, *n.kids[i]);
                }
            }
            for (const int32_t j : jumps) progs[p][j].x = here(p);
            return;
        }
        case node::repeat: {
            const node & body = *n.kids[0];
            for (uint32_t i = 0; i < n.min; i++) compile(p, body);
            if (n.max == k_inf) {
                const int32_t split = emit(p, {op::split, false, 0, 0});
                progs[p][split].x = here(p);
                compile(p, body);
                emit(p, {op::jump, false, split, 0});
                progs[p][split].y = here(p);
                return;
            }
            std::vector<int32_t> splits;
            for (uint32_t i = n.min; i < n.max; i++) {
                const int32_t split = emit(p, {op::split, false, 0, 0});
                progs[p][split].x = here(p);
                splits.push_back(split);
                compile(p, body);
            }
            for (const int32_t s : splits) progs[p][s].y = here(p);
            return;
        }
        case node::look: {
            const int32_t sub = int32_t(progs.size());
            progs.emplace_back();
            compile(sub, *n.kids[0]);
            emit(sub, {op::match, false, 0, 0});
            emit(p, {op::look_ahead, n.negate, sub, 0});
            return;
        }
        }
    }
};

} // namespace

regex::regex(std::string_view pattern) : pattern_(pattern) {
    parser ps(pattern, sets_);
    const auto tree = ps.parse();
    if (nullable(*tree)) {
        // A split at every empty match would cut where no piece starts.
        throw error(SMOL_ERR_UNSUPPORTED,
                    "pre-tokenizer regex \"" + pattern_ +
                        "\" can match nothing; such a pattern is not supported");
    }
    progs_.emplace_back();
    compiler c{progs_};
    c.compile(0, *tree);
    c.emit(0, {op::match, false, 0, 0});
}

bool regex::set_matches(const char_set & s, uint32_t c, uint16_t f) const {
    bool in = false;
    for (const set_item & it : s.items) {
        bool m;
        if (it.mask != 0) {
            m = ((f & it.mask) != 0) != it.negated;
        } else {
            m = c >= it.lo && c <= it.hi;
            if (!m && s.icase && c < 128) {
                const uint32_t other = (c >= 'a' && c <= 'z')   ? c - 32
                                       : (c >= 'A' && c <= 'Z') ? c + 32
                                                                : c;
                m = other >= it.lo && other <= it.hi;
            }
        }
        if (m) {
            in = true;
            break;
        }
    }
    return in != s.negated;
}

bool regex::run(int32_t prog, const uint32_t * cpt, const uint16_t * flg, uint32_t pos,
                uint32_t end, uint32_t * len, bool not_null) const {
    struct thread {
        int32_t pc;
        uint32_t pos;
    };
    // One stack per OS thread, shared by the lookaheads run inside a match:
    // each run uses the part above where it found it, and leaves it so.
    thread_local std::vector<thread> stack;
    const size_t base = stack.size();
    struct restore {
        std::vector<thread> & s;
        size_t n;
        ~restore() { s.resize(n); }
    } guard{stack, base};
    stack.push_back({0, pos});
    const std::vector<insn> & code = progs_[prog];
    uint64_t steps = 0;
    while (stack.size() > base) {
        thread t = stack.back();
        stack.pop_back();
        for (;;) {
            if (++steps > k_max_steps) {
                throw error(SMOL_ERR_UNSUPPORTED,
                            "pre-tokenizer regex \"" + pattern_ +
                                "\" backtracks without end on this text; split the text");
            }
            const insn & in = code[t.pc];
            bool ok = true;
            switch (in.o) {
            case op::set:
                ok = t.pos < end && set_matches(sets_[in.x], cpt[t.pos], flg[t.pos]);
                if (ok) {
                    t.pos++;
                    t.pc++;
                }
                break;
            case op::split:
                stack.push_back({in.y, t.pos});
                t.pc = in.x;
                break;
            case op::jump:
                t.pc = in.x;
                break;
            case op::text_end:
                ok = t.pos == end;
                t.pc++;
                break;
            case op::look_ahead: {
                uint32_t n = 0;
                const bool m = run(in.x, cpt, flg, t.pos, end, &n, false);
                ok = m != in.negate;
                t.pc++;
                break;
            }
            case op::match:
                if (not_null && t.pos == pos) {
                    ok = false;
                    break;
                }
                *len = t.pos - pos;
                return true;
            }
            if (!ok) break;
        }
    }
    return false;
}

uint32_t regex::match(const uint32_t * cpt, const uint16_t * flg, uint32_t pos,
                      uint32_t end) const {
    uint32_t n = 0;
    return run(0, cpt, flg, pos, end, &n, true) ? n : 0;
}

std::string regex::dump() const {
    std::string out;
    for (size_t p = 0; p < progs_.size(); p++) {
        out += "program " + std::to_string(p) + "\n";
        for (size_t i = 0; i < progs_[p].size(); i++) {
            const insn & in = progs_[p][i];
            static const char * names[] = {"set",   "split",    "jump",
                                           "match", "text_end", "look_ahead"};
            out += "  " + std::to_string(i) + " " + names[int(in.o)] + " " + std::to_string(in.x) +
                   " " + std::to_string(in.y) + (in.negate ? " !" : "") + "\n";
        }
    }
    return out;
}

} // namespace smol
