// smol-jinja-parse.c++ - a chat template's text into its tree
// (smol-jinja-tree.h): the lexer, with Jinja's whitespace control under HF's
// trim_blocks and lstrip_blocks, and a recursive-descent parser with
// jinja2's grammar and a nesting limit.

#include "smol-error.h"
#include "smol-jinja-builtins.h"
#include "smol-jinja-tree.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_set>

namespace smol::jinja {

namespace {

// --- tokens ------------------------------------------------------------------------

enum class tok : uint8_t {
    text,
    var_begin,
    var_end,
    block_begin,
    block_end,
    name,
    string,
    integer,
    real,
    op,
    eof,
};

struct token {
    tok t = tok::eof;
    std::string s; // text, name, operator or the string literal's value
    int64_t i = 0;
    double d = 0;
    int line = 1;
    int col = 1;
};

[[noreturn]] void syntax_fail(const std::string & name, const std::string & what, int line, int col,
                              smol_status status = SMOL_ERR_FORMAT) {
    throw error(status, name + ": " + what + " (line " + std::to_string(line) + ", column " +
                            std::to_string(col) + ")");
}

bool ascii_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Splits a template into text and the tokens of its tags, applying Jinja's
// whitespace control with HF's trim_blocks and lstrip_blocks.
class lexer {
  public:
    lexer(const std::string & source, const std::string & name) : name_(name) {
        // Jinja reads \r\n and \r as \n and drops one trailing newline
        // (keep_trailing_newline is off).
        s_.reserve(source.size());
        for (size_t i = 0; i < source.size(); i++) {
            if (source[i] == '\r') {
                s_ += '\n';
                if (i + 1 < source.size() && source[i + 1] == '\n') i++;
            } else {
                s_ += source[i];
            }
        }
        if (!s_.empty() && s_.back() == '\n') s_.pop_back();
        for (size_t i = 0; i < s_.size(); i++) {
            if (s_[i] == '\n') newlines_.push_back(i);
        }
    }

    std::vector<token> run() {
        bool line_starting = true;
        while (pos_ < s_.size()) {
            const size_t t = find_tag(pos_);
            if (t == std::string::npos) {
                emit_text(pos_, s_.substr(pos_));
                break;
            }
            std::string text = s_.substr(pos_, t - pos_);
            const char kind = s_[t + 1];
            const char sign =
                t + 2 < s_.size() && (s_[t + 2] == '-' || s_[t + 2] == '+') ? s_[t + 2] : 0;
            if (sign == '-') {
                text = rstrip_py(text);
            } else if (sign != '+' && kind != '{') {
                // lstrip_blocks: a block or comment tag alone on its line
                // takes the line's leading whitespace with it.
                const size_t l = text.rfind('\n');
                const size_t l_pos = l == std::string::npos ? 0 : l + 1;
                if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
                    std::all_of(text.begin() + long(l_pos), text.end(), ascii_space)) {
                    text.resize(l_pos);
                }
            }
            emit_text(pos_, text);
            pos_ = t + 2 + (sign ? 1 : 0);
            size_t raw_end = 0;
            if (kind == '%' && raw_begin(pos_, raw_end)) {
                pos_ = raw_end;
                line_starting = lex_raw(t);
            } else if (kind == '#') {
                line_starting = lex_comment(t);
            } else {
                line_starting = lex_tag(t, kind == '{');
            }
        }
        token e;
        e.t = tok::eof;
        locate(s_.size(), e);
        out_.push_back(e);
        return std::move(out_);
    }

  private:
    const std::string & name_;
    std::string s_;
    size_t pos_ = 0;
    std::vector<size_t> newlines_;
    std::vector<token> out_;

    void locate(size_t offset, token & t) const {
        const auto it = std::lower_bound(newlines_.begin(), newlines_.end(), offset);
        t.line = int(it - newlines_.begin()) + 1;
        const size_t start = it == newlines_.begin() ? 0 : *(it - 1) + 1;
        t.col = int(offset - start) + 1;
    }
    [[noreturn]] void fail(const std::string & what, size_t offset) const {
        token t;
        locate(offset, t);
        syntax_fail(name_, what, t.line, t.col);
    }

    size_t find_tag(size_t from) const {
        for (size_t i = s_.find('{', from); i != std::string::npos; i = s_.find('{', i + 1)) {
            if (i + 1 < s_.size() && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#'))
                return i;
        }
        return std::string::npos;
    }

    void emit_text(size_t offset, std::string text) {
        if (text.empty()) return;
        token t;
        t.t = tok::text;
        t.s = std::move(text);
        locate(offset, t);
        out_.push_back(std::move(t));
    }

    static std::string rstrip_py(const std::string & text) {
        size_t keep = 0;
        for (size_t i = 0; i < text.size();) {
            const size_t j = utf8_next(text, i);
            if (!is_py_space(utf8_decode(text, i))) keep = j;
            i = j;
        }
        return text.substr(0, keep);
    }
    size_t skip_py_space(size_t i) const {
        while (i < s_.size() && is_py_space(utf8_decode(s_, i))) i = utf8_next(s_, i);
        return i;
    }
    size_t skip_ascii_space(size_t i) const {
        while (i < s_.size() && ascii_space(s_[i])) i++;
        return i;
    }
    bool word_at(size_t i, std::string_view w) const {
        return s_.compare(i, w.size(), w) == 0 &&
               (i + w.size() >= s_.size() ||
                !(std::isalnum(uint8_t(s_[i + w.size()])) || s_[i + w.size()] == '_'));
    }

    // After "{%" (and its sign): "raw" and the tag's end; end: past it.
    bool raw_begin(size_t i, size_t & end) const {
        i = skip_ascii_space(i);
        if (!word_at(i, "raw")) return false;
        i = skip_ascii_space(i + 3);
        if (s_.compare(i, 3, "-%}") == 0) {
            end = skip_py_space(i + 3);
            return true;
        }
        if (s_.compare(i, 2, "%}") == 0) {
            end = i + 2;
            return true;
        }
        return false;
    }

    bool lex_raw(size_t start) {
        for (size_t t = s_.find("{%", pos_); t != std::string::npos; t = s_.find("{%", t + 1)) {
            size_t i = t + 2;
            const char sign = i < s_.size() && (s_[i] == '-' || s_[i] == '+') ? s_[i] : 0;
            if (sign) i++;
            i = skip_ascii_space(i);
            if (!word_at(i, "endraw")) continue;
            i = skip_ascii_space(i + 6);
            std::string text = s_.substr(pos_, t - pos_);
            if (sign == '-') {
                text = rstrip_py(text);
            } else if (sign != '+') {
                const size_t l = text.rfind('\n');
                const size_t l_pos = l == std::string::npos ? 0 : l + 1;
                if (l_pos > 0 && l_pos < text.size() &&
                    std::all_of(text.begin() + long(l_pos), text.end(), ascii_space)) {
                    text.resize(l_pos);
                }
            }
            emit_text(pos_, text);
            return end_tag(i, '%', start, "endraw");
        }
        fail("missing end of raw directive: add {% endraw %}", start);
    }

    bool lex_comment(size_t start) {
        const size_t e = s_.find("#}", pos_);
        if (e == std::string::npos) fail("missing end of comment tag: add #}", start);
        const char sign = e > pos_ ? s_[e - 1] : 0;
        pos_ = e + 2;
        return after_end(sign, true);
    }

    // Past a tag's end: "-" takes the whitespace that follows, trim_blocks
    // one newline after a block or comment. Returns whether what the tag
    // consumed ends a line (lstrip_blocks' line_starting).
    bool after_end(char sign, bool block) {
        const size_t from = pos_;
        if (sign == '-') {
            pos_ = skip_py_space(pos_);
        } else if (sign != '+' && block && pos_ < s_.size() && s_[pos_] == '\n') {
            pos_++;
        }
        return pos_ > from && s_[pos_ - 1] == '\n';
    }

    // At i: the end of a "{% ... %}" tag (with its sign).
    bool end_tag(size_t i, char, size_t start, const char * what) {
        char sign = 0;
        if (i < s_.size() && (s_[i] == '-' || s_[i] == '+')) sign = s_[i++];
        if (s_.compare(i, 2, "%}") != 0)
            fail(std::string("expected the end of the '") + what + "' tag", start);
        pos_ = i + 2;
        return after_end(sign, true);
    }

    bool lex_tag(size_t start, bool variable) {
        token begin;
        begin.t = variable ? tok::var_begin : tok::block_begin;
        locate(start, begin);
        out_.push_back(begin);
        std::string brackets;
        while (true) {
            pos_ = skip_ascii_space(pos_);
            if (pos_ >= s_.size()) {
                fail(std::string("unexpected end of template inside a ") +
                         (variable ? "{{ ... }} tag: add }}" : "{% ... %} tag: add %}"),
                     start);
            }
            if (brackets.empty()) {
                const char * end = variable ? "}}" : "%}";
                char sign = 0;
                size_t at = pos_;
                if ((s_[at] == '-' || (!variable && s_[at] == '+')) &&
                    s_.compare(at + 1, 2, end) == 0) {
                    sign = s_[at++];
                }
                if (s_.compare(at, 2, end) == 0) {
                    token t;
                    t.t = variable ? tok::var_end : tok::block_end;
                    locate(pos_, t);
                    out_.push_back(t);
                    pos_ = at + 2;
                    return after_end(sign, !variable);
                }
            }
            lex_token(brackets);
        }
    }

    void lex_token(std::string & brackets) {
        token t;
        locate(pos_, t);
        const char c = s_[pos_];
        if (std::isalpha(uint8_t(c)) || c == '_') {
            size_t e = pos_;
            while (e < s_.size() && (std::isalnum(uint8_t(s_[e])) || s_[e] == '_')) e++;
            t.t = tok::name;
            t.s = s_.substr(pos_, e - pos_);
            pos_ = e;
        } else if (std::isdigit(uint8_t(c))) {
            lex_number(t);
        } else if (c == '\'' || c == '"') {
            lex_string(t);
        } else {
            static const char * ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                         "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                         ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
            for (const char * op : ops) {
                const size_t n = std::strlen(op);
                if (s_.compare(pos_, n, op) == 0) {
                    t.t = tok::op;
                    t.s = op;
                    pos_ += n;
                    break;
                }
            }
            if (t.t != tok::op) fail(std::string("unexpected character '") + c + "'", pos_);
            if (t.s == "(" || t.s == "[" || t.s == "{") {
                brackets += t.s[0];
            } else if (t.s == ")" || t.s == "]" || t.s == "}") {
                const char open = t.s == ")" ? '(' : t.s == "]" ? '[' : '{';
                if (brackets.empty() || brackets.back() != open)
                    fail("unexpected '" + t.s + "'" +
                             (brackets.empty()
                                  ? std::string()
                                  : std::string(": '") + brackets.back() + "' is not closed"),
                         pos_ - 1);
                brackets.pop_back();
            }
        }
        out_.push_back(std::move(t));
    }

    void lex_number(token & t) {
        const bool after_dot = !out_.empty() && out_.back().t == tok::op && out_.back().s == ".";
        size_t e = pos_;
        std::string digits;
        const auto run = [&] {
            while (e < s_.size() &&
                   (std::isdigit(uint8_t(s_[e])) ||
                    (s_[e] == '_' && e + 1 < s_.size() && std::isdigit(uint8_t(s_[e + 1]))))) {
                if (s_[e] != '_') digits += s_[e];
                e++;
            }
        };
        run();
        bool real = false;
        if (!after_dot && e + 1 < s_.size() && s_[e] == '.' && std::isdigit(uint8_t(s_[e + 1]))) {
            real = true;
            digits += '.';
            e++;
            run();
        }
        if (!after_dot && e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
            size_t x = e + 1;
            if (x < s_.size() && (s_[x] == '+' || s_[x] == '-')) x++;
            if (x < s_.size() && std::isdigit(uint8_t(s_[x]))) {
                real = true;
                digits += s_.substr(e, x - e);
                e = x;
                run();
            }
        }
        pos_ = e;
        if (real) {
            t.t = tok::real;
            t.d = std::strtod(digits.c_str(), nullptr);
        } else {
            t.t = tok::integer;
            errno = 0;
            t.i = std::strtoll(digits.c_str(), nullptr, 10);
            if (errno) fail("integer literal " + digits + " is too large for smol (int64)", pos_);
        }
    }

    void lex_string(token & t) {
        const char q = s_[pos_];
        const size_t start = pos_;
        size_t i = pos_ + 1;
        std::string out;
        while (true) {
            if (i >= s_.size()) fail("unterminated string literal", start);
            const char c = s_[i++];
            if (c == q) break;
            if (c != '\\') {
                out += c;
                continue;
            }
            if (i >= s_.size()) fail("unterminated string literal", start);
            const char e = s_[i++];
            const auto hex = [&](int n) {
                uint32_t v = 0;
                for (int k = 0; k < n; k++) {
                    if (i >= s_.size() || !std::isxdigit(uint8_t(s_[i])))
                        fail("truncated \\x, \\u or \\U escape in a string literal", i);
                    const char h = s_[i++];
                    v = v * 16 +
                        uint32_t(std::isdigit(uint8_t(h)) ? h - '0' : std::tolower(h) - 'a' + 10);
                }
                return v;
            };
            switch (e) {
            case '\n':
                break; // a backslash ends the line inside the literal
            case '\\':
                out += '\\';
                break;
            case '\'':
                out += '\'';
                break;
            case '"':
                out += '"';
                break;
            case 'a':
                out += '\a';
                break;
            case 'b':
                out += '\b';
                break;
            case 'f':
                out += '\f';
                break;
            case 'n':
                out += '\n';
                break;
            case 'r':
                out += '\r';
                break;
            case 't':
                out += '\t';
                break;
            case 'v':
                out += '\v';
                break;
            case 'x':
                utf8_append(out, hex(2));
                break;
            case 'u':
                utf8_append(out, hex(4));
                break;
            case 'U':
                utf8_append(out, hex(8));
                break;
            case 'N':
                fail("\\N{...} escapes in string literals are not supported", i - 2);
            default:
                if (e >= '0' && e <= '7') {
                    uint32_t v = uint32_t(e - '0');
                    for (int k = 0; k < 2 && i < s_.size() && s_[i] >= '0' && s_[i] <= '7'; k++)
                        v = v * 8 + uint32_t(s_[i++] - '0');
                    utf8_append(out, v);
                } else {
                    out += '\\';
                    out += e;
                }
            }
        }
        pos_ = i;
        t.t = tok::string;
        t.s = std::move(out);
    }
};

// --- the parser --------------------------------------------------------------------

class parser {
  public:
    parser(std::vector<token> tokens, const std::string & name)
        : t_(std::move(tokens)), name_(name) {}

    node_body parse_template() {
        node_body b = parse_body({}, nullptr);
        if (cur().t != tok::eof) fail("unexpected tag");
        check_names(b, false);
        return b;
    }

  private:
    // Like jinja2's compiler, an unknown filter or test fails the template
    // as a whole, unless it sits in an if statement or a conditional
    // expression ("soft" code), where it fails only if evaluated.
    void check_names(const expr * e, bool soft) const {
        if (!e) return;
        if (e->k == ex::cond) soft = true;
        if (!soft && ((e->k == ex::filter && !has_filter(e->name)) ||
                      (e->k == ex::test && !has_test(e->name)))) {
            syntax_fail(name_,
                        std::string(e->k == ex::filter ? "filter '" : "test '") + e->name +
                            "' is not supported",
                        e->line, e->col, SMOL_ERR_UNSUPPORTED);
        }
        for (const auto & k : e->kids) check_names(k.get(), soft);
    }
    void check_names(const node_body & b, bool soft) const {
        for (const auto & s : b.stmts) {
            // Loops, macros, calls and with blocks get a frame of their own,
            // which is not soft.
            const bool inner = s->k == st::for_ || s->k == st::macro || s->k == st::call_block ||
                               s->k == st::with_;
            const bool here = s->k == st::if_ ? true : soft;
            for (const auto & e : s->exprs) check_names(e.get(), here);
            for (const auto & body : s->bodies) check_names(body, inner ? false : here);
        }
    }

    std::vector<token> t_;
    size_t p_ = 0;
    const std::string & name_;
    int depth_ = 0;
    std::vector<stmt *> macros_; // macros being parsed (varargs, kwargs, caller)
    // Nesting of the tree: recursion (parentheses, blocks) and the left
    // spines that loops build (a + b + c ...) both count, so that neither
    // parsing, nor evaluation, nor freeing the tree can run out of stack.
    static constexpr int k_max_depth = 400;

    struct nest {
        parser & p;
        explicit nest(parser & pp) : p(pp) {
            if (++p.depth_ > k_max_depth) {
                p.fail("the template nests more than " + std::to_string(k_max_depth) +
                       " levels deep (parentheses, brackets or blocks)");
            }
        }
        ~nest() { --p.depth_; }
    };
    // One more node on a left spine, for as long as the loop building it runs.
    struct spine {
        parser & p;
        int n = 0;
        explicit spine(parser & pp) : p(pp) {}
        void grow() {
            if (++p.depth_ > k_max_depth) {
                p.fail("an expression nests more than " + std::to_string(k_max_depth) +
                       " levels deep (operators, filters or subscripts in a row)");
            }
            n++;
        }
        ~spine() { p.depth_ -= n; }
    };

    const token & cur() const { return t_[p_]; }
    const token & peek(size_t n = 1) const { return t_[std::min(p_ + n, t_.size() - 1)]; }
    [[noreturn]] void fail(const std::string & what, smol_status s = SMOL_ERR_FORMAT) const {
        syntax_fail(name_, what, cur().line, cur().col, s);
    }
    static std::string describe(const token & t) {
        switch (t.t) {
        case tok::eof:
            return "end of template";
        case tok::var_end:
            return "'}}'";
        case tok::block_end:
            return "'%}'";
        case tok::text:
            return "text";
        case tok::string:
            return "a string";
        case tok::integer:
        case tok::real:
            return "a number";
        default:
            return "'" + t.s + "'";
        }
    }
    bool is_op(const char * op) const { return cur().t == tok::op && cur().s == op; }
    bool is_name(const char * n) const { return cur().t == tok::name && cur().s == n; }
    bool skip_op(const char * op) {
        if (!is_op(op)) return false;
        p_++;
        return true;
    }
    bool skip_name(const char * n) {
        if (!is_name(n)) return false;
        p_++;
        return true;
    }
    void expect_op(const char * op) {
        if (!skip_op(op)) fail(std::string("expected '") + op + "', found " + describe(cur()));
    }
    std::string expect_name() {
        if (cur().t != tok::name) fail("expected a name, found " + describe(cur()));
        return t_[p_++].s;
    }
    void expect_block_end(const char * tag) {
        if (cur().t != tok::block_end)
            fail(std::string("expected the end of the '") + tag + "' tag, found " +
                 describe(cur()));
        p_++;
    }

    // Parses until a block tag whose name is in `ends`, leaving the parser
    // at that name.
    node_body parse_body(std::initializer_list<const char *> ends, const char * open) {
        nest n(*this);
        node_body b;
        while (true) {
            const token & c = cur();
            if (c.t == tok::eof) {
                if (ends.size() == 0) return b;
                std::string want;
                for (const char * e : ends)
                    want += (want.empty() ? "'" : " or '") + std::string(e) + "'";
                fail(std::string("unexpected end of template: the '") + open + "' block needs " +
                     want);
            }
            if (c.t == tok::text) {
                auto s = std::make_unique<stmt>(st::text, c.line);
                s->text = c.s;
                b.stmts.push_back(std::move(s));
                p_++;
            } else if (c.t == tok::var_begin) {
                p_++;
                auto s = std::make_unique<stmt>(st::output, c.line);
                s->exprs.push_back(parse_tuple(true));
                if (cur().t != tok::var_end) fail("expected '}}', found " + describe(cur()));
                p_++;
                b.stmts.push_back(std::move(s));
            } else if (c.t == tok::block_begin) {
                const token & n = peek();
                if (n.t == tok::name) {
                    for (const char * e : ends) {
                        if (n.s == e) {
                            p_++;
                            return b;
                        }
                    }
                }
                p_++;
                b.stmts.push_back(parse_statement());
            } else {
                fail("unexpected " + describe(c));
            }
        }
    }

    std::unique_ptr<stmt> parse_statement() {
        const int line = cur().line;
        if (cur().t != tok::name) fail("expected a statement name, found " + describe(cur()));
        const std::string word = cur().s;
        p_++;
        if (word == "if") {
            auto s = std::make_unique<stmt>(st::if_, line);
            s->exprs.push_back(parse_tuple(false));
            expect_block_end("if");
            while (true) {
                s->bodies.push_back(parse_body({"elif", "else", "endif"}, "if"));
                if (skip_name("elif")) {
                    s->exprs.push_back(parse_tuple(false));
                    expect_block_end("elif");
                } else if (skip_name("else")) {
                    expect_block_end("else");
                    s->bodies.push_back(parse_body({"endif"}, "if"));
                    p_++;
                    expect_block_end("endif");
                    return s;
                } else {
                    p_++;
                    expect_block_end("endif");
                    return s;
                }
            }
        }
        if (word == "for") {
            auto s = std::make_unique<stmt>(st::for_, line);
            parse_targets(*s, false);
            if (!skip_name("in")) fail("expected 'in' in the 'for' tag, found " + describe(cur()));
            s->exprs.push_back(parse_tuple(false, true));
            if (skip_name("if")) s->exprs.push_back(parse_expression(true));
            if (is_name("recursive"))
                fail("recursive for loops are not supported", SMOL_ERR_UNSUPPORTED);
            expect_block_end("for");
            s->bodies.push_back(parse_body({"endfor", "else"}, "for"));
            if (skip_name("else")) {
                expect_block_end("else");
                s->bodies.push_back(parse_body({"endfor"}, "for"));
            }
            p_++;
            expect_block_end("endfor");
            return s;
        }
        if (word == "set") {
            auto s = std::make_unique<stmt>(st::set, line);
            parse_targets(*s, true);
            if (skip_op("=")) {
                s->exprs.push_back(parse_tuple(true));
                expect_block_end("set");
                return s;
            }
            if (s->unpack || !s->attr.empty()) fail("a block set takes one plain name");
            s->k = st::set_block;
            s->text = s->names[0];
            s->exprs.push_back(is_op("|") ? parse_filter_chain(nullptr, false) : nullptr);
            expect_block_end("set");
            s->bodies.push_back(parse_body({"endset"}, "set"));
            p_++;
            expect_block_end("endset");
            return s;
        }
        if (word == "macro") {
            auto s = std::make_unique<stmt>(st::macro, line);
            s->text = expect_name();
            parse_signature(*s);
            expect_block_end("macro");
            macros_.push_back(s.get());
            s->bodies.push_back(parse_body({"endmacro"}, "macro"));
            macros_.pop_back();
            p_++;
            if (cur().t == tok::name) p_++; // {% endmacro name %}
            expect_block_end("endmacro");
            return s;
        }
        if (word == "call") {
            auto s = std::make_unique<stmt>(st::call_block, line);
            s->exprs.push_back(nullptr);
            if (is_op("(")) parse_signature(*s);
            expr_ptr call = parse_expression(true);
            if (call->k != ex::call) fail("the 'call' tag needs a macro call");
            s->exprs[0] = std::move(call);
            expect_block_end("call");
            s->text = "caller";
            macros_.push_back(s.get());
            s->bodies.push_back(parse_body({"endcall"}, "call"));
            macros_.pop_back();
            p_++;
            expect_block_end("endcall");
            return s;
        }
        if (word == "filter") {
            auto s = std::make_unique<stmt>(st::filter_block, line);
            s->exprs.push_back(parse_filter_chain(nullptr, true));
            expect_block_end("filter");
            s->bodies.push_back(parse_body({"endfilter"}, "filter"));
            p_++;
            expect_block_end("endfilter");
            return s;
        }
        if (word == "with") {
            auto s = std::make_unique<stmt>(st::with_, line);
            while (cur().t != tok::block_end) {
                if (!s->names.empty()) expect_op(",");
                s->names.push_back(expect_name());
                expect_op("=");
                s->exprs.push_back(parse_expression(true));
            }
            expect_block_end("with");
            s->bodies.push_back(parse_body({"endwith"}, "with"));
            p_++;
            expect_block_end("endwith");
            return s;
        }
        if (word == "generation") {
            // transformers' AssistantTracker: the body renders as it is.
            auto s = std::make_unique<stmt>(st::generation, line);
            expect_block_end("generation");
            s->bodies.push_back(parse_body({"endgeneration"}, "generation"));
            p_++;
            expect_block_end("endgeneration");
            return s;
        }
        if (word == "break" || word == "continue") {
            auto s = std::make_unique<stmt>(word == "break" ? st::break_ : st::continue_, line);
            expect_block_end(word.c_str());
            return s;
        }
        static const std::unordered_set<std::string> known = {
            "include", "import", "from", "extends", "block", "autoescape", "trans", "do"};
        p_--;
        if (known.count(word))
            fail("the '" + word + "' statement is not supported in chat templates",
                 SMOL_ERR_UNSUPPORTED);
        fail("unknown tag '" + word + "'");
    }

    // for/set targets: a name, names separated by commas (optionally in
    // parentheses), or with `attribute` a namespace's ns.attr.
    void parse_targets(stmt & s, bool attribute) {
        const bool paren = skip_op("(");
        s.names.push_back(expect_name());
        if (attribute && !paren && skip_op(".")) {
            s.attr = expect_name();
            return;
        }
        while (skip_op(",")) {
            if (cur().t != tok::name) break;
            s.names.push_back(expect_name());
            s.unpack = true;
        }
        if (paren) {
            expect_op(")");
            s.unpack = true;
        }
    }

    void parse_signature(stmt & s) {
        expect_op("(");
        while (!is_op(")")) {
            if (!s.names.empty()) expect_op(",");
            if (is_op(")")) break;
            s.names.push_back(expect_name());
            s.exprs.push_back(skip_op("=") ? parse_expression(true) : nullptr);
        }
        expect_op(")");
    }

    // --- expressions

    expr_ptr parse_tuple(bool with_condexpr, bool for_iter = false) {
        const int line = cur().line;
        std::vector<expr_ptr> items;
        bool comma = false;
        while (true) {
            if (!items.empty()) {
                if (!skip_op(",")) break;
                comma = true;
            }
            const token & c = cur();
            if (!items.empty() &&
                (c.t == tok::var_end || c.t == tok::block_end || (c.t == tok::op && c.s == ")") ||
                 (for_iter && c.t == tok::name && (c.s == "if" || c.s == "recursive"))))
                break;
            items.push_back(parse_expression(with_condexpr));
        }
        if (items.size() == 1 && !comma) return std::move(items[0]);
        auto e = std::make_unique<expr>(ex::tuple, line);
        e->kids = std::move(items);
        return e;
    }

    expr_ptr parse_expression(bool with_condexpr) {
        nest n(*this);
        if (!with_condexpr) return parse_or();
        const int line = cur().line;
        expr_ptr e = parse_or();
        while (skip_name("if")) {
            auto c = std::make_unique<expr>(ex::cond, line);
            expr_ptr test = parse_or();
            expr_ptr other = skip_name("else") ? parse_expression(true) : nullptr;
            c->kids.push_back(std::move(e));
            c->kids.push_back(std::move(test));
            c->kids.push_back(std::move(other));
            e = std::move(c);
        }
        return e;
    }

    expr_ptr binary(ex k, expr_ptr a, expr_ptr b, int line) {
        auto e = std::make_unique<expr>(k, line);
        e->kids.push_back(std::move(a));
        e->kids.push_back(std::move(b));
        return e;
    }

    expr_ptr parse_or() {
        expr_ptr e = parse_and();
        spine sp(*this);
        while (is_name("or")) {
            sp.grow();
            const int line = cur().line;
            p_++;
            e = binary(ex::or_, std::move(e), parse_and(), line);
        }
        return e;
    }
    expr_ptr parse_and() {
        expr_ptr e = parse_not();
        spine sp(*this);
        while (is_name("and")) {
            sp.grow();
            const int line = cur().line;
            p_++;
            e = binary(ex::and_, std::move(e), parse_not(), line);
        }
        return e;
    }
    expr_ptr parse_not() {
        if (is_name("not")) {
            nest n(*this);
            auto e = std::make_unique<expr>(ex::not_, cur().line);
            p_++;
            e->kids.push_back(parse_not());
            return e;
        }
        return parse_compare();
    }
    expr_ptr parse_compare() {
        const int line = cur().line;
        expr_ptr first = parse_math1();
        std::unique_ptr<expr> cmp;
        while (true) {
            std::string op;
            const token & c = cur();
            if (c.t == tok::op && (c.s == "==" || c.s == "!=" || c.s == "<" || c.s == "<=" ||
                                   c.s == ">" || c.s == ">=")) {
                op = c.s;
                p_++;
            } else if (c.t == tok::name && c.s == "in") {
                op = "in";
                p_++;
            } else if (c.t == tok::name && c.s == "not" && peek().t == tok::name &&
                       peek().s == "in") {
                op = "notin";
                p_ += 2;
            } else {
                break;
            }
            if (!cmp) {
                cmp = std::make_unique<expr>(ex::compare, line);
                cmp->kids.push_back(std::move(first));
            }
            cmp->ops.push_back(op);
            cmp->kids.push_back(parse_math1());
        }
        return cmp ? std::move(cmp) : std::move(first);
    }
    expr_ptr arith(bop op, expr_ptr a, expr_ptr b, int line) {
        auto e = binary(ex::binop, std::move(a), std::move(b), line);
        e->op = op;
        return e;
    }
    expr_ptr parse_math1() {
        expr_ptr e = parse_concat();
        spine sp(*this);
        while (is_op("+") || is_op("-")) {
            sp.grow();
            const bop op = cur().s == "+" ? bop::add : bop::sub;
            const int line = cur().line;
            p_++;
            e = arith(op, std::move(e), parse_concat(), line);
        }
        return e;
    }
    expr_ptr parse_concat() {
        expr_ptr e = parse_math2();
        spine sp(*this);
        while (is_op("~")) {
            sp.grow();
            const int line = cur().line;
            p_++;
            e = arith(bop::concat, std::move(e), parse_math2(), line);
        }
        return e;
    }
    expr_ptr parse_math2() {
        expr_ptr e = parse_pow();
        spine sp(*this);
        while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
            sp.grow();
            const std::string & s = cur().s;
            const bop op = s == "*"    ? bop::mul
                           : s == "/"  ? bop::div
                           : s == "//" ? bop::floordiv
                                       : bop::mod;
            const int line = cur().line;
            p_++;
            e = arith(op, std::move(e), parse_pow(), line);
        }
        return e;
    }
    expr_ptr parse_pow() {
        expr_ptr e = parse_unary(true);
        spine sp(*this);
        while (is_op("**")) {
            sp.grow();
            const int line = cur().line;
            p_++;
            e = arith(bop::pow, std::move(e), parse_unary(true), line);
        }
        return e;
    }
    expr_ptr parse_unary(bool with_filter) {
        nest n(*this);
        expr_ptr e;
        if (is_op("-") || is_op("+")) {
            e = std::make_unique<expr>(is_op("-") ? ex::neg : ex::pos, cur().line);
            p_++;
            e->kids.push_back(parse_unary(false));
        } else {
            e = parse_primary();
        }
        e = parse_postfix(std::move(e));
        if (with_filter) e = parse_filter_expr(std::move(e));
        return e;
    }
    expr_ptr parse_primary() {
        const token & c = cur();
        const int line = c.line;
        if (c.t == tok::name) {
            auto e = std::make_unique<expr>(ex::literal, line);
            if (c.s == "true" || c.s == "True") {
                e->lit = value(true);
            } else if (c.s == "false" || c.s == "False") {
                e->lit = value(false);
            } else if (c.s == "none" || c.s == "None") {
                e->lit = value::none();
            } else {
                e->k = ex::name;
                e->name = c.s;
                if (!macros_.empty()) {
                    if (c.s == "varargs") macros_.back()->uses_varargs = true;
                    if (c.s == "kwargs") macros_.back()->uses_kwargs = true;
                    if (c.s == "caller") macros_.back()->uses_caller = true;
                }
            }
            p_++;
            return e;
        }
        if (c.t == tok::string) {
            std::string s;
            while (cur().t == tok::string) s += t_[p_++].s;
            auto e = std::make_unique<expr>(ex::literal, line);
            e->lit = value(std::move(s));
            return e;
        }
        if (c.t == tok::integer || c.t == tok::real) {
            auto e = std::make_unique<expr>(ex::literal, line);
            e->lit = c.t == tok::integer ? value(c.i) : value(c.d);
            p_++;
            return e;
        }
        if (skip_op("(")) {
            nest n(*this);
            if (skip_op(")")) {
                auto e = std::make_unique<expr>(ex::tuple, line);
                return e;
            }
            expr_ptr e = parse_tuple(true);
            expect_op(")");
            return e;
        }
        if (skip_op("[")) {
            nest n(*this);
            auto e = std::make_unique<expr>(ex::list, line);
            while (!is_op("]")) {
                if (!e->kids.empty()) expect_op(",");
                if (is_op("]")) break;
                e->kids.push_back(parse_expression(true));
            }
            expect_op("]");
            return e;
        }
        if (skip_op("{")) {
            nest n(*this);
            auto e = std::make_unique<expr>(ex::dict, line);
            while (!is_op("}")) {
                if (!e->kids.empty()) expect_op(",");
                if (is_op("}")) break;
                e->kids.push_back(parse_expression(true));
                expect_op(":");
                e->kids.push_back(parse_expression(true));
            }
            expect_op("}");
            return e;
        }
        fail("unexpected " + describe(c));
    }
    expr_ptr parse_postfix(expr_ptr e) {
        spine sp(*this);
        while (true) {
            sp.grow();
            const int line = cur().line;
            if (skip_op(".")) {
                if (cur().t == tok::name) {
                    auto a = std::make_unique<expr>(ex::attr, line);
                    a->name = t_[p_++].s;
                    a->kids.push_back(std::move(e));
                    e = std::move(a);
                } else if (cur().t == tok::integer) {
                    auto a = std::make_unique<expr>(ex::item, line);
                    auto k = std::make_unique<expr>(ex::literal, line);
                    k->lit = value(t_[p_++].i);
                    a->kids.push_back(std::move(e));
                    a->kids.push_back(std::move(k));
                    e = std::move(a);
                } else {
                    fail("expected an attribute name after '.', found " + describe(cur()));
                }
            } else if (skip_op("[")) {
                nest n(*this);
                e = parse_subscript(std::move(e), line);
            } else if (is_op("(")) {
                e = parse_call(std::move(e));
            } else {
                return e;
            }
        }
    }
    expr_ptr parse_subscript(expr_ptr obj, int line) {
        std::vector<expr_ptr> parts(3);
        int colons = 0;
        if (!is_op(":")) parts[0] = parse_expression(true);
        while (skip_op(":")) {
            if (++colons > 2) fail("a slice takes at most two ':'");
            if (!is_op(":") && !is_op("]")) parts[size_t(colons)] = parse_expression(true);
        }
        if (colons == 0 && is_op(",")) {
            fail("subscripts with several keys are not supported", SMOL_ERR_UNSUPPORTED);
        }
        expect_op("]");
        auto e = std::make_unique<expr>(colons ? ex::slice : ex::item, line);
        e->kids.push_back(std::move(obj));
        if (colons) {
            for (auto & p : parts) e->kids.push_back(std::move(p));
        } else {
            e->kids.push_back(std::move(parts[0]));
        }
        return e;
    }
    // ( args ) into e's kids and kw.
    void parse_args(expr & e) {
        nest n(*this);
        expect_op("(");
        bool first = true;
        while (!is_op(")")) {
            if (!first) expect_op(",");
            first = false;
            if (is_op(")")) break;
            if (is_op("*") || is_op("**"))
                fail("*args and **kwargs in calls are not supported", SMOL_ERR_UNSUPPORTED);
            if (cur().t == tok::name && peek().t == tok::op && peek().s == "=") {
                e.kw.push_back(cur().s);
                p_ += 2;
                e.kids.push_back(parse_expression(true));
            } else {
                if (!e.kw.empty()) fail("a positional argument follows a keyword argument");
                e.kids.push_back(parse_expression(true));
            }
        }
        expect_op(")");
    }
    expr_ptr parse_call(expr_ptr callee) {
        auto e = std::make_unique<expr>(ex::call, cur().line);
        e->kids.push_back(std::move(callee));
        parse_args(*e);
        return e;
    }
    expr_ptr parse_filter_expr(expr_ptr e) {
        spine sp(*this);
        while (true) {
            sp.grow();
            if (is_op("|")) {
                e = parse_filter_chain(std::move(e), false);
            } else if (is_name("is")) {
                e = parse_test(std::move(e));
            } else if (is_op("(")) {
                e = parse_call(std::move(e));
            } else {
                return e;
            }
        }
    }
    std::string dotted_name() {
        std::string n = expect_name();
        while (is_op(".") && peek().t == tok::name) {
            p_++;
            n += '.';
            n += expect_name();
        }
        return n;
    }
    expr_ptr parse_filter_chain(expr_ptr subject, bool start_inline) {
        spine sp(*this);
        while (is_op("|") || start_inline) {
            sp.grow();
            if (!start_inline) p_++;
            start_inline = false;
            const int line = cur().line;
            const int col = cur().col;
            auto f = std::make_unique<expr>(ex::filter, line);
            f->col = col;
            f->name = dotted_name();
            f->kids.push_back(std::move(subject));
            if (is_op("(")) parse_args(*f);
            subject = std::move(f);
        }
        return subject;
    }
    expr_ptr parse_test(expr_ptr subject) {
        const int line = cur().line;
        p_++; // is
        auto e = std::make_unique<expr>(ex::test, line);
        e->negate = skip_name("not");
        const int col = cur().col;
        e->col = col;
        e->name = dotted_name();
        e->kids.push_back(std::move(subject));
        const token & c = cur();
        if (is_op("(")) {
            parse_args(*e);
        } else if ((c.t == tok::name || c.t == tok::string || c.t == tok::integer ||
                    c.t == tok::real || (c.t == tok::op && (c.s == "[" || c.s == "{"))) &&
                   !(c.t == tok::name &&
                     (c.s == "else" || c.s == "or" || c.s == "and" || c.s == "is"))) {
            nest n(*this);
            e->kids.push_back(parse_postfix(parse_primary()));
        }
        return e;
    }
};

} // namespace

node_body parse_template(const std::string & source, const std::string & name) {
    lexer lx(source, name);
    parser ps(lx.run(), name);
    return ps.parse_template();
}

} // namespace smol::jinja
