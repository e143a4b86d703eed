// smol-grammar.c++ - GBNF parsing, the incremental matcher and the token
// mask (smol-grammar.h). Repetitions and groups become rules of their own,
// so the matcher only knows sequences, alternatives, rule references and
// character classes. A parse stack is a chain of nodes in a pool (a node
// names a position and the node below it), so stacks share their bottoms
// and the mask walk can take back what it built by shrinking the pool.

#include "smol-grammar.h"

#include "smol-error.h"
#include "smol-llama.h"
#include "smol-unicode.h"
#include "smol-vocab.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <numeric>

namespace smol {

namespace {

using ranges = std::vector<std::pair<uint32_t, uint32_t>>;

constexpr uint32_t max_cpt = 0x10FFFF;
constexpr uint32_t unbounded = UINT32_MAX;
constexpr uint32_t max_repeat = 1 << 16;
// Groups nested deeper are refused, and rules that reach this many others
// before a character make the matcher refuse the text: both bound the
// recursion, and so the stack, on hostile input.
constexpr uint32_t max_nesting = 256;
constexpr uint32_t max_expansion = 1024;
// Expansions a step (or the start) may take: with the two limits above
// alone, a hostile grammar could take max_expansion of them for each of
// 4 x grammar_max_stacks stacks, a fraction of a second for one byte.
constexpr uint32_t max_step_expansions = 64 * grammar_max_stacks;

bool is_end(const gelem * p) {
    return p->type == gtype::end || p->type == gtype::alt;
}

bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

ranges normalize(ranges r, bool negate) {
    std::sort(r.begin(), r.end());
    ranges out;
    for (const auto & x : r) {
        if (!out.empty() && x.first <= out.back().second + 1) {
            out.back().second = std::max(out.back().second, x.second);
        } else {
            out.push_back(x);
        }
    }
    if (!negate) return out;
    ranges neg;
    uint32_t next = 0;
    for (const auto & x : out) {
        if (x.first > next) neg.emplace_back(next, x.first - 1);
        next = x.second + 1;
    }
    if (next <= max_cpt) neg.emplace_back(next, max_cpt);
    return neg;
}

class gbnf_parser {
  public:
    explicit gbnf_parser(std::string_view src) : src_(src) {}

    grammar parse(const std::string & root) {
        space(true);
        while (pos_ < src_.size()) rule();
        for (size_t i = 0; i < g_.rules.size(); ++i) {
            if (!defined_[i]) fail(first_ref_[i], "rule '" + g_.names[i] + "' is not defined");
        }
        const auto it = ids_.find(root);
        if (it == ids_.end())
            throw error(SMOL_ERR_INVALID_ARGUMENT,
                        "grammar: there is no rule '" + root + "' to start from");
        g_.root = it->second;
        check_left_recursion();
        return std::move(g_);
    }

  private:
    [[noreturn]] void fail(size_t at, const std::string & msg) const {
        size_t line = 1, col = 1;
        for (size_t i = 0; i < at && i < src_.size(); ++i) {
            if (src_[i] == '\n') {
                ++line;
                col = 1;
            } else {
                ++col;
            }
        }
        throw error(SMOL_ERR_INVALID_ARGUMENT, "grammar: line " + std::to_string(line) +
                                                   ", column " + std::to_string(col) + ": " + msg);
    }

    bool at_end() const { return pos_ >= src_.size(); }
    char peek() const { return at_end() ? '\0' : src_[pos_]; }

    void space(bool newlines) {
        while (!at_end()) {
            const char c = src_[pos_];
            if (c == ' ' || c == '\t') {
                ++pos_;
            } else if (c == '#') {
                while (!at_end() && src_[pos_] != '\n' && src_[pos_] != '\r') ++pos_;
            } else if (newlines && (c == '\n' || c == '\r')) {
                ++pos_;
            } else {
                break;
            }
        }
    }

    std::string name() {
        const size_t b = pos_;
        while (!at_end() && name_char(src_[pos_])) ++pos_;
        return std::string(src_.substr(b, pos_ - b));
    }

    uint32_t rule_id(const std::string & n, size_t at) {
        const auto it = ids_.find(n);
        if (it != ids_.end()) return it->second;
        const uint32_t id = uint32_t(g_.rules.size());
        ids_[n] = id;
        g_.names.push_back(n);
        g_.rules.emplace_back();
        defined_.push_back(false);
        first_ref_.push_back(at);
        return id;
    }

    uint32_t derived_rule(const std::string & base) {
        std::string n;
        do {
            n = base + "_" + std::to_string(++n_derived_);
        } while (ids_.count(n));
        const uint32_t id = rule_id(n, pos_);
        defined_[id] = true;
        return id;
    }

    void grow(size_t at, size_t n) {
        n_elems_ += n;
        if (n_elems_ > grammar_max_elements)
            fail(at, "the grammar grows past " + std::to_string(grammar_max_elements) +
                         " elements; use smaller repetition counts");
    }

    void rule() {
        const size_t at = pos_;
        const std::string n = name();
        if (n.empty()) fail(at, std::string("expected a rule name, found '") + peek() + "'");
        space(false);
        if (src_.substr(pos_, 3) != "::=") fail(pos_, "expected '::=' after rule name '" + n + "'");
        pos_ += 3;
        space(true);
        const uint32_t id = rule_id(n, at);
        if (defined_[id]) fail(at, "rule '" + n + "' is defined twice");
        defined_[id] = true;
        std::vector<gelem> body;
        alternates(body, n, false);
        body.push_back({gtype::end, 0});
        g_.rules[id] = std::move(body);
        if (!at_end() && src_[pos_] != '\n' && src_[pos_] != '\r')
            fail(pos_, std::string("unexpected '") + src_[pos_] + "' in rule '" + n + "'");
        space(true);
    }

    void alternates(std::vector<gelem> & out, const std::string & rname, bool nested) {
        sequence(out, rname, nested);
        while (peek() == '|') {
            ++pos_;
            out.push_back({gtype::alt, 0});
            space(true);
            sequence(out, rname, nested);
        }
    }

    uint32_t read_hex(size_t digits, size_t at) {
        uint32_t v = 0;
        for (size_t i = 0; i < digits; ++i) {
            const char c = peek();
            int d = -1;
            if (c >= '0' && c <= '9') d = c - '0';
            if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
            if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
            if (d < 0) fail(at, "expected " + std::to_string(digits) + " hex digits in an escape");
            v = v * 16 + uint32_t(d);
            ++pos_;
        }
        if (v > max_cpt) fail(at, "the escape names no Unicode code point");
        return v;
    }

    // One character of a literal or class, escapes read.
    uint32_t read_char() {
        const size_t at = pos_;
        if (src_[pos_] == '\\') {
            ++pos_;
            if (at_end()) fail(at, "an escape at the end of the grammar");
            const char c = src_[pos_++];
            switch (c) {
            case 'n':
                return '\n';
            case 'r':
                return '\r';
            case 't':
                return '\t';
            case '\\':
            case '"':
            case '[':
            case ']':
            case '-':
            case '^':
            case '/':
                return uint8_t(c);
            case 'x':
                return read_hex(2, at);
            case 'u':
                return read_hex(4, at);
            case 'U':
                return read_hex(8, at);
            default:
                fail(at, std::string("unknown escape '\\") + c + "'");
            }
        }
        const unicode::decoded d = unicode::decode_utf8(src_.data() + pos_, src_.size() - pos_);
        pos_ += d.len;
        return d.cpt;
    }

    uint32_t add_class(ranges r) {
        g_.classes.push_back(std::move(r));
        return uint32_t(g_.classes.size() - 1);
    }

    uint32_t read_count(size_t at) {
        uint64_t v = 0;
        if (!(peek() >= '0' && peek() <= '9')) fail(pos_, "expected a number in '{...}'");
        while (peek() >= '0' && peek() <= '9') {
            v = v * 10 + uint64_t(peek() - '0');
            if (v > max_repeat) fail(at, "a repetition count past " + std::to_string(max_repeat));
            ++pos_;
        }
        return uint32_t(v);
    }

    void repeat(std::vector<gelem> & out, size_t start, uint32_t lo, uint32_t hi,
                const std::string & rname, size_t at) {
        std::vector<gelem> x(out.begin() + long(start), out.end());
        out.resize(start);
        if (x.size() > 1) {
            const uint32_t r = derived_rule(rname);
            x.push_back({gtype::end, 0});
            g_.rules[r] = std::move(x);
            x = {{gtype::rule_ref, r}};
        }
        grow(at, size_t(lo) * x.size() + 4);
        for (uint32_t i = 0; i < lo; ++i) out.insert(out.end(), x.begin(), x.end());
        if (hi == unbounded) {
            const uint32_t r = derived_rule(rname);
            std::vector<gelem> body = x;
            body.push_back({gtype::rule_ref, r});
            body.push_back({gtype::alt, 0});
            body.push_back({gtype::end, 0});
            g_.rules[r] = std::move(body);
            out.push_back({gtype::rule_ref, r});
        } else if (hi > lo) {
            grow(at, size_t(hi - lo) * (x.size() + 3));
            uint32_t prev = unbounded;
            for (uint32_t k = lo; k < hi; ++k) {
                const uint32_t r = derived_rule(rname);
                std::vector<gelem> body = x;
                if (prev != unbounded) body.push_back({gtype::rule_ref, prev});
                body.push_back({gtype::alt, 0});
                body.push_back({gtype::end, 0});
                g_.rules[r] = std::move(body);
                prev = r;
            }
            out.push_back({gtype::rule_ref, prev});
        }
    }

    void sequence(std::vector<gelem> & out, const std::string & rname, bool nested) {
        size_t last = SIZE_MAX; // where the last element (the operand of a postfix) starts
        while (!at_end()) {
            const size_t at = pos_;
            const char c = src_[pos_];
            if (c == '"') {
                last = out.size();
                ++pos_;
                while (!at_end() && src_[pos_] != '"') {
                    const uint32_t cp = read_char();
                    out.push_back({gtype::chars, add_class({{cp, cp}})});
                }
                if (at_end()) fail(at, "a string literal without its closing '\"'");
                ++pos_;
                grow(at, out.size() - last);
            } else if (c == '[') {
                last = out.size();
                ++pos_;
                const bool negate = peek() == '^';
                if (negate) ++pos_;
                ranges r;
                while (!at_end() && src_[pos_] != ']') {
                    const uint32_t lo = read_char();
                    uint32_t hi = lo;
                    if (peek() == '-' && pos_ + 1 < src_.size() && src_[pos_ + 1] != ']') {
                        ++pos_;
                        const size_t hat = pos_;
                        hi = read_char();
                        if (hi < lo) fail(hat, "a character range whose end is before its start");
                    }
                    r.emplace_back(lo, hi);
                }
                if (at_end()) fail(at, "a character class without its closing ']'");
                ++pos_;
                out.push_back({gtype::chars, add_class(normalize(std::move(r), negate))});
                grow(at, 1);
            } else if (c == '.') {
                last = out.size();
                ++pos_;
                out.push_back({gtype::chars, add_class({{0, max_cpt}})});
                grow(at, 1);
            } else if (name_char(c)) {
                last = out.size();
                const std::string n = name();
                out.push_back({gtype::rule_ref, rule_id(n, at)});
                grow(at, 1);
            } else if (c == '(') {
                last = out.size();
                if (++nesting_ > max_nesting)
                    fail(at, "groups nest deeper than " + std::to_string(max_nesting));
                ++pos_;
                space(true);
                const uint32_t r = derived_rule(rname);
                std::vector<gelem> body;
                alternates(body, rname, true);
                if (peek() != ')') fail(at, "a '(' without its closing ')'");
                ++pos_;
                --nesting_;
                body.push_back({gtype::end, 0});
                grow(at, body.size());
                g_.rules[r] = std::move(body);
                out.push_back({gtype::rule_ref, r});
            } else if (c == '*' || c == '+' || c == '?') {
                if (last == SIZE_MAX) fail(at, std::string("'") + c + "' must follow an element");
                ++pos_;
                repeat(out, last, c == '+' ? 1 : 0, c == '?' ? 1 : unbounded, rname, at);
            } else if (c == '{') {
                if (last == SIZE_MAX) fail(at, "'{' must follow an element");
                ++pos_;
                space(false);
                uint32_t lo = 0, hi = unbounded;
                if (peek() != ',') lo = read_count(at);
                space(false);
                if (peek() == ',') {
                    ++pos_;
                    space(false);
                    if (peek() != '}') hi = read_count(at);
                } else {
                    hi = lo;
                }
                space(false);
                if (peek() != '}') fail(pos_, "expected '}' to close the repetition");
                ++pos_;
                if (hi < lo) fail(at, "a repetition whose maximum is below its minimum");
                repeat(out, last, lo, hi, rname, at);
            } else {
                break;
            }
            space(nested);
        }
    }

    // A rule that reaches itself before reading a character would send the
    // matcher round forever.
    void check_left_recursion() const {
        const size_t n = g_.rules.size();
        std::vector<bool> nullable(n, false);
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t r = 0; r < n; ++r) {
                if (nullable[r]) continue;
                bool alt_ok = true;
                for (const gelem & e : g_.rules[r]) {
                    if (is_end(&e)) {
                        if (alt_ok) {
                            nullable[r] = changed = true;
                            break;
                        }
                        alt_ok = true;
                    } else if (e.type == gtype::chars ||
                               (e.type == gtype::rule_ref && !nullable[e.value])) {
                        alt_ok = false;
                    }
                }
            }
        }
        std::vector<std::vector<uint32_t>> first(n);
        for (size_t r = 0; r < n; ++r) {
            bool open = true;
            for (const gelem & e : g_.rules[r]) {
                if (is_end(&e)) {
                    open = true;
                } else if (open) {
                    if (e.type == gtype::rule_ref) first[r].push_back(e.value);
                    if (e.type == gtype::chars || !nullable[e.value]) open = false;
                }
            }
        }
        // Depth-first search for a cycle, without recursion.
        std::vector<uint8_t> color(n, 0);
        for (size_t s = 0; s < n; ++s) {
            if (color[s]) continue;
            std::vector<std::pair<uint32_t, size_t>> st{{uint32_t(s), 0}};
            color[s] = 1;
            while (!st.empty()) {
                auto & top = st.back();
                if (top.second < first[top.first].size()) {
                    const uint32_t next = first[top.first][top.second++];
                    if (color[next] == 1)
                        throw error(SMOL_ERR_INVALID_ARGUMENT,
                                    "grammar: rule '" + g_.names[next] +
                                        "' is left-recursive: it can reach itself before "
                                        "reading a character");
                    if (color[next] == 0) {
                        color[next] = 1;
                        st.emplace_back(next, 0);
                    }
                } else {
                    color[top.first] = 2;
                    st.pop_back();
                }
            }
        }
    }

    std::string_view src_;
    size_t pos_ = 0;
    grammar g_;
    std::map<std::string, uint32_t> ids_;
    std::vector<bool> defined_;
    std::vector<size_t> first_ref_;
    size_t n_elems_ = 0;
    uint32_t n_derived_ = 0;
    uint32_t nesting_ = 0;
};

bool class_has(const ranges & r, uint32_t c) {
    auto it = std::upper_bound(
        r.begin(), r.end(), c,
        [](uint32_t v, const std::pair<uint32_t, uint32_t> & x) { return v < x.first; });
    if (it == r.begin()) return false;
    --it;
    return c <= it->second;
}

bool class_meets(const ranges & r, uint32_t lo, uint32_t hi) {
    for (const auto & x : r) {
        if (x.second >= lo) return x.first <= hi;
    }
    return false;
}

} // namespace

grammar parse_gbnf(std::string_view text, const std::string & root) {
    return gbnf_parser(text).parse(root);
}

// --- matcher ------------------------------------------------------------------

grammar_matcher::grammar_matcher(std::shared_ptr<const grammar> g) : g_(std::move(g)) {
    reset();
    if (heads_.empty())
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "grammar: rule '" + g_->names[g_->root] + "' cannot start: it reaches over " +
                        std::to_string(max_expansion) + " rules before a character, or over " +
                        std::to_string(grammar_max_stacks) + " ways to read one, or takes over " +
                        std::to_string(max_step_expansions) + " expansions to list them");
}

void grammar_matcher::reset() {
    run_ = {};
    pool_.clear();
    heads_.clear();
    partial_ = {};
    dedup_from_ = 0;
    expansions_left_ = max_step_expansions;
    const std::vector<gelem> & root = g_->rules[g_->root];
    for (const gelem * p = root.data();;) {
        if (is_end(p)) {
            heads_.push_back(-1);
        } else if (!expand(make(p, -1), heads_, 0)) {
            heads_.clear(); // past a limit: no start, rather than some of it
            break;
        }
        while (!is_end(p)) ++p;
        if (p->type == gtype::end) break;
        ++p;
    }
    std::sort(heads_.begin(), heads_.end());
    heads_.erase(std::unique(heads_.begin(), heads_.end()), heads_.end());
    if (heads_.size() > grammar_max_stacks) heads_.clear(); // as a step would refuse
    overflowed_.clear();
    kept_nodes_ = pool_.size();
}

int32_t grammar_matcher::make(const gelem * pos, int32_t parent) {
    // Equal stacks made in one step share their nodes, so that ambiguous
    // grammars do not multiply them.
    const size_t lo = std::max(dedup_from_, pool_.size() > 64 ? pool_.size() - 64 : size_t(0));
    for (size_t i = pool_.size(); i > lo; --i) {
        if (pool_[i - 1].pos == pos && pool_[i - 1].parent == parent) return int32_t(i - 1);
    }
    pool_.push_back({pos, parent});
    return int32_t(pool_.size() - 1);
}

bool grammar_matcher::expand(int32_t s, std::vector<int32_t> & out, uint32_t depth) {
    if (depth > max_expansion || out.size() > 4 * grammar_max_stacks || expansions_left_ == 0)
        return false;
    --expansions_left_;
    if (s < 0 || pool_[size_t(s)].pos->type == gtype::chars) {
        out.push_back(s);
        return true;
    }
    const snode nd = pool_[size_t(s)];
    const gelem * next = nd.pos + 1;
    const int32_t base = is_end(next) ? nd.parent : make(next, nd.parent);
    const std::vector<gelem> & rule = g_->rules[nd.pos->value];
    for (const gelem * p = rule.data();;) {
        if (!expand(is_end(p) ? base : make(p, base), out, depth + 1)) return false;
        while (!is_end(p)) ++p;
        if (p->type == gtype::end) break;
        ++p;
    }
    return true;
}

bool grammar_matcher::step(const int32_t * in, size_t n, uint32_t cpt, std::vector<int32_t> & out) {
    out.clear();
    // The stacks whose top takes cpt: the step's result depends on them
    // alone (nodes do not change once made).
    std::vector<int32_t> & take = taking_;
    take.clear();
    bool kept = true; // every one of them stays in the pool until reset or compact
    for (size_t i = 0; i < n; ++i) {
        if (in[i] < 0 || !class_has(g_->classes[pool_[size_t(in[i])].pos->value], cpt)) continue;
        take.push_back(in[i]);
        kept &= size_t(in[i]) < kept_nodes_;
    }
    // A step that overflowed from the same stacks overflows again: an
    // ambiguous grammar pays for its expansion once, not once for every byte
    // or token tried from the same state.
    if (kept && std::find(overflowed_.begin(), overflowed_.end(), take) != overflowed_.end())
        return false;
    dedup_from_ = pool_.size();
    expansions_left_ = max_step_expansions;
    bool ok = true;
    for (const int32_t s : take) {
        const snode nd = pool_[size_t(s)];
        const gelem * next = nd.pos + 1;
        if (!expand(is_end(next) ? nd.parent : make(next, nd.parent), out, 0)) {
            ok = false;
            break;
        }
    }
    if (ok) {
        std::sort(out.begin(), out.end());
        out.erase(std::unique(out.begin(), out.end()), out.end());
        ok = out.size() <= grammar_max_stacks;
    }
    if (!ok && kept) {
        if (overflowed_.size() == max_overflows_kept) overflowed_.erase(overflowed_.begin());
        overflowed_.push_back(take);
    }
    return ok;
}

bool grammar_matcher::may_start(const int32_t * in, size_t n, uint32_t lo, uint32_t hi) const {
    for (size_t i = 0; i < n; ++i) {
        if (in[i] >= 0 && class_meets(g_->classes[pool_[size_t(in[i])].pos->value], lo, hi))
            return true;
    }
    return false;
}

bool grammar_matcher::feed(const int32_t * in, size_t n, utf8 u, uint8_t byte,
                           std::vector<int32_t> & out, utf8 & u_out, bool & advanced) {
    advanced = false;
    uint32_t value, left, least;
    if (u.left == 0) {
        if (byte < 0x80) {
            value = byte;
            left = 0;
            least = 0;
        } else if ((byte & 0xE0) == 0xC0) {
            value = byte & 0x1Fu;
            left = 1;
            least = 0x80;
        } else if ((byte & 0xF0) == 0xE0) {
            value = byte & 0x0Fu;
            left = 2;
            least = 0x800;
        } else if ((byte & 0xF8) == 0xF0) {
            value = byte & 0x07u;
            left = 3;
            least = 0x10000;
        } else {
            return false;
        }
    } else {
        if ((byte & 0xC0) != 0x80) return false;
        value = (u.value << 6) | (byte & 0x3Fu);
        left = u.left - 1;
        least = u.min;
    }
    if (left > 0) {
        // Only if some character the bytes may still become is allowed
        // (overlong forms and surrogates are not UTF-8).
        const uint32_t lo = std::max(value << (6 * left), least);
        const uint32_t hi = std::min((value << (6 * left)) | ((1u << (6 * left)) - 1), max_cpt);
        if (lo > hi) return false;
        const bool low = lo < 0xD800 && may_start(in, n, lo, std::min(hi, 0xD7FFu));
        if (!low && !(hi > 0xDFFF && may_start(in, n, std::max(lo, 0xE000u), hi))) return false;
        u_out = {value, left, least};
        return true;
    }
    u_out = {};
    if (value > max_cpt || value < least || (value >= 0xD800 && value <= 0xDFFF) ||
        !step(in, n, value, out) || out.empty())
        return false;
    advanced = true;
    return true;
}

bool grammar_matcher::accept(std::string_view bytes) {
    return advance(bytes, true);
}

bool grammar_matcher::allows(std::string_view bytes) {
    return advance(bytes, false);
}

bool grammar_matcher::advance(std::string_view bytes, bool commit) {
    if (commit) drop_runs();
    const size_t mark = pool_.size();
    std::vector<int32_t> cur = heads_, next;
    utf8 u = partial_;
    for (const char c : bytes) {
        bool advanced = false;
        utf8 u2;
        if (!feed(cur.data(), cur.size(), u, uint8_t(c), next, u2, advanced)) {
            pool_.resize(mark);
            dedup_from_ = pool_.size();
            return false;
        }
        if (advanced) cur.swap(next);
        u = u2;
    }
    if (!commit) {
        pool_.resize(mark);
        dedup_from_ = pool_.size();
        return true;
    }
    heads_ = std::move(cur);
    partial_ = u;
    if (pool_.size() > 8 * 1024 && pool_.size() > 4 * heads_.size()) compact();
    kept_nodes_ = pool_.size();
    return true;
}

bool grammar_matcher::complete() const {
    return partial_.left == 0 && std::find(heads_.begin(), heads_.end(), -1) != heads_.end();
}

bool grammar_matcher::can_continue() const {
    return std::any_of(heads_.begin(), heads_.end(), [](int32_t s) { return s >= 0; });
}

void grammar_matcher::state_key(std::string & out) const {
    key_of(heads_, partial_, out);
}

void grammar_matcher::key_of(const std::vector<int32_t> & heads, utf8 partial_now,
                             std::string & out) const {
    // Each stack as its positions from the top, the stacks sorted, since two
    // nodes of the pool may hold equal stacks and the heads' order is the
    // pool's.
    std::vector<uintptr_t> & flat = key_flat_;
    std::vector<std::pair<uint32_t, uint32_t>> & spans = key_spans_;
    flat.clear();
    spans.clear();
    for (const int32_t h : heads) {
        const uint32_t begin = uint32_t(flat.size());
        for (int32_t i = h; i >= 0; i = pool_[size_t(i)].parent)
            flat.push_back(uintptr_t(pool_[size_t(i)].pos));
        spans.emplace_back(begin, uint32_t(flat.size()));
    }
    const auto less = [&flat](std::pair<uint32_t, uint32_t> a, std::pair<uint32_t, uint32_t> b) {
        return std::lexicographical_compare(flat.begin() + a.first, flat.begin() + a.second,
                                            flat.begin() + b.first, flat.begin() + b.second);
    };
    const auto same = [&flat](std::pair<uint32_t, uint32_t> a, std::pair<uint32_t, uint32_t> b) {
        return std::equal(flat.begin() + a.first, flat.begin() + a.second, flat.begin() + b.first,
                          flat.begin() + b.second);
    };
    std::sort(spans.begin(), spans.end(), less);
    spans.erase(std::unique(spans.begin(), spans.end(), same), spans.end());
    out.clear();
    const uint32_t partial[3] = {partial_now.value, partial_now.left, partial_now.min};
    out.append(reinterpret_cast<const char *>(partial), sizeof partial);
    for (const auto & sp : spans) {
        const uint32_t n = sp.second - sp.first;
        out.append(reinterpret_cast<const char *>(&n), sizeof n);
        out.append(reinterpret_cast<const char *>(flat.data() + sp.first), n * sizeof(uintptr_t));
    }
}

void grammar_matcher::compact() {
    std::vector<int32_t> map(pool_.size(), -1);
    std::vector<snode> kept;
    std::vector<int32_t> chain;
    for (int32_t & h : heads_) {
        chain.clear();
        for (int32_t s = h; s >= 0 && map[size_t(s)] < 0; s = pool_[size_t(s)].parent)
            chain.push_back(s);
        for (size_t i = chain.size(); i-- > 0;) {
            const snode nd = pool_[size_t(chain[i])];
            kept.push_back({nd.pos, nd.parent < 0 ? -1 : map[size_t(nd.parent)]});
            map[size_t(chain[i])] = int32_t(kept.size() - 1);
        }
        if (h >= 0) h = map[size_t(h)];
    }
    pool_ = std::move(kept);
    dedup_from_ = pool_.size();
    overflowed_.clear(); // the nodes are numbered anew (advance sets kept_nodes_)
}

void grammar_matcher::mask(const grammar_vocab & v, std::vector<uint8_t> & allowed) {
    allowed.assign(size_t(v.n_vocab), 0);
    const bool done = complete();
    for (const smol_token t : v.eog) allowed[size_t(t)] = done;
    if (!can_continue()) return;
    const grammar_trie * trie = &v.trie;
    const grammar_runs * r = runs(v);
    if (r && r->has_rest && run_allows(r->max_len) >= 0) {
        // The runs by their length, the walk over the others.
        const uint32_t n = run_.end == run_chain::ended ? run_.reach : r->max_len;
        const uint8_t * len = r->len.data();
        uint8_t * out = allowed.data();
        for (size_t t = 0; t < size_t(v.n_vocab); ++t) out[t] |= (len[t] != 0) & (len[t] <= n);
        trie = &r->rest;
    }
    if (trie->nodes.size() < 2) return;
    const size_t base = pool_.size();
    walk_heads_ = heads_;
    levels_.assign(1, {base, 0, walk_heads_.size(), partial_});
    for (size_t i = 1; i < trie->nodes.size();) {
        const grammar_trie::node & nd = trie->nodes[i];
        const level up = levels_[nd.depth - 1];
        // Along a path each level's heads are its parent's or follow them:
        // what the parent's level ends at is all the path holds.
        pool_.resize(up.pool_mark);
        walk_heads_.resize(up.head_end);
        utf8 u2;
        bool advanced = false;
        if (!feed(walk_heads_.data() + up.head_begin, up.head_end - up.head_begin, up.u, nd.byte,
                  scratch_, u2, advanced)) {
            i = nd.end;
            continue;
        }
        level here = {0, up.head_begin, up.head_end, u2};
        if (advanced) {
            here.head_begin = walk_heads_.size();
            walk_heads_.insert(walk_heads_.end(), scratch_.begin(), scratch_.end());
            here.head_end = walk_heads_.size();
        }
        here.pool_mark = pool_.size();
        if (levels_.size() <= nd.depth) levels_.resize(nd.depth + 1);
        levels_[nd.depth] = here;
        for (uint32_t k = nd.tok_begin; k < nd.tok_end; ++k) allowed[size_t(trie->tokens[k])] = 1;
        ++i;
    }
    pool_.resize(base);
    dedup_from_ = pool_.size();
}

bool grammar_matcher::allows_token(const grammar_vocab & v, smol_token t) {
    if (t < 0 || t >= v.n_vocab) return false;
    if (std::find(v.eog.begin(), v.eog.end(), t) != v.eog.end()) return complete();
    // A run's text is not read: its length answers.
    if (const grammar_runs * r = runs(v)) {
        if (r->len[size_t(t)] > 0) {
            const int ok = run_allows(r->len[size_t(t)]);
            if (ok >= 0) return ok != 0;
        }
    }
    const std::string & piece = v.pieces[size_t(t)];
    return !piece.empty() && allows(piece);
}

// --- runs -------------------------------------------------------------------------

namespace {

bool class_within(const ranges & a, const ranges & b) {
    size_t j = 0;
    for (const auto & x : a) {
        while (j < b.size() && b[j].second < x.first) ++j;
        if (j == b.size() || b[j].first > x.first || b[j].second < x.second) return false;
    }
    return true;
}

bool class_apart(const ranges & a, const ranges & b) {
    size_t i = 0, j = 0;
    while (i < a.size() && j < b.size()) {
        if (a[i].second < b[j].first) {
            ++i;
        } else if (b[j].second < a[i].first) {
            ++j;
        } else {
            return false;
        }
    }
    return true;
}

ranges class_minus(const ranges & a, const ranges & b) {
    ranges out;
    size_t j = 0;
    for (auto x : a) {
        while (j < b.size() && b[j].second < x.first) ++j;
        size_t k = j;
        while (k < b.size() && b[k].first <= x.second) {
            if (b[k].first > x.first) out.emplace_back(x.first, b[k].first - 1);
            if (b[k].second >= x.second) {
                x.first = x.second + 1; // nothing left
                break;
            }
            x.first = b[k].second + 1;
            ++k;
        }
        if (x.first <= x.second) out.push_back(x);
    }
    return out;
}

uint64_t class_size(const ranges & r) {
    uint64_t n = 0;
    for (const auto & x : r) n += uint64_t(x.second - x.first) + 1;
    return n;
}

// A character of the class that UTF-8 can hold (no surrogate); UINT32_MAX if
// none.
uint32_t class_rep(const ranges & r) {
    for (const auto & x : r) {
        if (x.first < 0xD800 || x.first > 0xDFFF) return x.first;
        if (x.second > 0xDFFF) return 0xE000;
    }
    return UINT32_MAX;
}

// The token's length in characters if its text is whole UTF-8 characters
// (as the matcher reads them: no overlong forms, surrogates or values past
// U+10FFFF) each in the class, else 0.
// ascii: which of the code points below 0x80 the class holds.
uint32_t run_length(const std::string & text, const ranges & cls, const uint64_t ascii[2]) {
    uint32_t n = 0;
    for (size_t i = 0; i < text.size();) {
        const uint8_t b = uint8_t(text[i]);
        uint32_t value, left, least;
        if (b < 0x80) {
            if (!((ascii[b >> 6] >> (b & 63)) & 1)) return 0;
            ++i;
            ++n;
            continue;
        } else if ((b & 0xE0) == 0xC0) {
            value = b & 0x1Fu, left = 1, least = 0x80;
        } else if ((b & 0xF0) == 0xE0) {
            value = b & 0x0Fu, left = 2, least = 0x800;
        } else if ((b & 0xF8) == 0xF0) {
            value = b & 0x07u, left = 3, least = 0x10000;
        } else {
            return 0;
        }
        if (i + left >= text.size()) return 0;
        for (uint32_t k = 1; k <= left; ++k) {
            const uint8_t c = uint8_t(text[i + k]);
            if ((c & 0xC0) != 0x80) return 0;
            value = (value << 6) | (c & 0x3Fu);
        }
        if (value < least || value > max_cpt || (value >= 0xD800 && value <= 0xDFFF) ||
            !class_has(cls, value))
            return 0;
        i += left + 1;
        ++n;
    }
    return n;
}

void build_trie(grammar_trie & tr, const std::vector<std::string> & pieces,
                const std::vector<smol_token> & order, size_t a, size_t b, uint32_t depth,
                uint8_t byte);

} // namespace

std::shared_ptr<const grammar_runs> vocab_runs(const grammar_vocab & v, const ranges & cls) {
    std::lock_guard<std::mutex> lock(v.runs_mu);
    const auto it = v.runs.find(cls);
    if (it != v.runs.end()) return it->second;
    // A bound on memory against grammars of many classes: past it, states
    // take the slow way.
    if (v.runs.size() >= grammar_max_run_classes) return nullptr;
    auto & slot = v.runs[cls];
    auto r = std::make_shared<grammar_runs>();
    r->len.assign(size_t(v.n_vocab), 0);
    uint64_t ascii[2] = {0, 0};
    for (uint32_t c = 0; c < 0x80; ++c) ascii[c >> 6] |= uint64_t(class_has(cls, c)) << (c & 63);
    for (size_t t = 0; t < size_t(v.n_vocab); ++t) {
        const uint32_t n = run_length(v.pieces[t], cls, ascii);
        if (n == 0 || n > 255) continue;
        r->len[t] = uint8_t(n);
        r->max_len = std::max(r->max_len, n);
        ++r->n_runs;
    }
    // Too few runs and the rest is nearly the whole trie.
    r->has_rest = r->n_runs * 8 >= v.trie.tokens.size();
    if (r->has_rest) {
        // The trie's tokens are in the order of their texts, as a trie of
        // the rest wants them.
        std::vector<smol_token> rest;
        for (const smol_token t : v.trie.tokens) {
            if (r->len[size_t(t)] == 0) rest.push_back(t);
        }
        build_trie(r->rest, v.pieces, rest, 0, rest.size(), 0, 0);
    }
    slot = std::move(r);
    return slot;
}

void grammar_matcher::drop_runs() {
    if (!run_.known) return;
    if (run_.pool_mark <= pool_.size()) pool_.resize(run_.pool_mark);
    dedup_from_ = pool_.size();
    run_.known = false;
    run_.runs.reset();
}

const grammar_runs * grammar_matcher::runs(const grammar_vocab & v) {
    if (run_.known && run_.vocab == &v) return run_.runs.get();
    drop_runs();
    run_.known = true;
    run_.vocab = &v;
    run_.pool_mark = pool_.size();
    if (partial_.left != 0) return nullptr;
    // The largest class a head takes, less the classes of the heads that
    // take only part of it: every head takes all of what is left or none.
    const ranges * big = nullptr;
    uint64_t big_size = 0;
    for (const int32_t h : heads_) {
        if (h < 0) continue;
        const ranges & c = g_->classes[pool_[size_t(h)].pos->value];
        const uint64_t n = class_size(c);
        if (n > big_size) big = &c, big_size = n;
    }
    if (!big || big_size < 2) return nullptr;
    ranges cls = *big;
    for (const int32_t h : heads_) {
        if (h < 0) continue;
        const ranges & c = g_->classes[pool_[size_t(h)].pos->value];
        if (&c != big && !class_within(*big, c)) cls = class_minus(cls, c);
    }
    const uint32_t rep = class_rep(cls);
    if (rep == UINT32_MAX) return nullptr;
    run_.cls = std::move(cls);
    run_.runs = vocab_runs(v, run_.cls);
    if (!run_.runs || run_.runs->n_runs == 0) {
        run_.runs.reset();
        return nullptr;
    }
    run_.rep = rep;
    run_.reach = 0;
    run_.end = run_chain::going;
    run_.heads = heads_;
    key_of(run_.heads, {}, run_.key);
    return run_.runs.get();
}

int grammar_matcher::run_allows(uint32_t n) {
    run_chain & r = run_;
    while (r.reach < n && r.end == run_chain::going) {
        // S_reach takes the class in one way, or none of it.
        bool takes = false, mixed = false;
        for (const int32_t h : r.heads) {
            if (h < 0) continue;
            const ranges & c = g_->classes[pool_[size_t(h)].pos->value];
            if (class_within(r.cls, c)) {
                takes = true;
            } else if (!class_apart(r.cls, c)) {
                mixed = true;
            }
        }
        if (mixed) {
            r.end = run_chain::mixed;
        } else if (!takes) {
            r.end = run_chain::ended;
        } else if (!step(r.heads.data(), r.heads.size(), r.rep, r.next) || r.next.empty()) {
            r.end = run_chain::mixed; // past the limits: the slow way says
        } else {
            r.heads.swap(r.next);
            ++r.reach;
            key_of(r.heads, {}, r.next_key);
            if (r.next_key == r.key) r.end = run_chain::fixed;
            r.key.swap(r.next_key);
        }
    }
    if (n <= r.reach || r.end == run_chain::fixed) return 1;
    return r.end == run_chain::ended ? 0 : -1;
}

// --- vocabulary trie ------------------------------------------------------------

namespace {

void build_trie(grammar_trie & tr, const std::vector<std::string> & pieces,
                const std::vector<smol_token> & order, size_t a, size_t b, uint32_t depth,
                uint8_t byte) {
    const size_t me = tr.nodes.size();
    tr.nodes.push_back({byte, 0, depth, uint32_t(tr.tokens.size()), 0});
    while (a < b && pieces[size_t(order[a])].size() == depth) tr.tokens.push_back(order[a++]);
    tr.nodes[me].tok_end = uint32_t(tr.tokens.size());
    while (a < b) {
        const uint8_t c = uint8_t(pieces[size_t(order[a])][depth]);
        size_t e = a;
        while (e < b && uint8_t(pieces[size_t(order[e])][depth]) == c) ++e;
        build_trie(tr, pieces, order, a, e, depth + 1, c);
        a = e;
    }
    tr.nodes[me].end = uint32_t(tr.nodes.size());
}

} // namespace

std::shared_ptr<const grammar_vocab> make_grammar_vocab(const vocab & voc) {
    auto v = std::make_shared<grammar_vocab>();
    v->n_vocab = voc.n_tokens();
    v->pieces.resize(size_t(v->n_vocab));
    std::vector<smol_token> order;
    for (smol_token t = 0; t < v->n_vocab; ++t) {
        if (voc.is_eog(t)) {
            v->eog.push_back(t);
            continue;
        }
        v->pieces[size_t(t)] = voc.token_to_piece(t, false);
        if (!v->pieces[size_t(t)].empty()) order.push_back(t);
    }
    std::stable_sort(order.begin(), order.end(), [&](smol_token x, smol_token y) {
        return v->pieces[size_t(x)] < v->pieces[size_t(y)];
    });
    build_trie(v->trie, v->pieces, order, 0, order.size(), 0, 0);
    return v;
}

std::shared_ptr<const grammar_vocab> model_grammar_vocab(const llama_model & m) {
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    if (!m.grammar_trie) m.grammar_trie = make_grammar_vocab(m.vocab);
    return m.grammar_trie;
}

} // namespace smol
