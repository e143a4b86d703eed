// smol-jinja-value.c++ - template values, their Python printing, comparison
// and JSON (smol-jinja-value.h).

#include "smol-jinja-value.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace smol::jinja {

// --- construction ----------------------------------------------------------------

value value::none() {
    value v;
    v.k_ = kind::none;
    return v;
}

value value::undefined(std::string why) {
    value v;
    v.s_ = std::move(why);
    return v;
}

namespace {

uint32_t nested(uint32_t depth) {
    if (depth > k_max_nesting) {
        throw failure("a value nested more than " + std::to_string(k_max_nesting) + " levels deep");
    }
    return depth;
}

} // namespace

value value::list(list_data items) {
    value v;
    v.k_ = kind::list;
    uint32_t deepest = 0;
    for (const value & x : items) deepest = std::max(deepest, x.depth());
    v.nest_ = nested(deepest + 1);
    for (const value & x : items) v.holds_caller_ = v.holds_caller_ || x.holds_caller_data();
    v.l_ = std::make_shared<const list_data>(std::move(items));
    return v;
}

uint32_t value::depth() const {
    switch (k_) {
    case kind::list:
    case kind::tuple:
    case kind::iterator:
        return nest_;
    case kind::dict:
    case kind::ns:
        return m_->nest + 1;
    default:
        return 0;
    }
}

value value::tuple(list_data items) {
    value v = list(std::move(items));
    v.k_ = kind::tuple;
    return v;
}

value value::dict() {
    return dict(std::make_shared<dict_data>());
}

value value::dict(std::shared_ptr<dict_data> d) {
    value v;
    v.k_ = kind::dict;
    v.m_ = std::move(d);
    return v;
}

value value::make_namespace(std::shared_ptr<dict_data> d) {
    value v = dict(std::move(d));
    v.k_ = kind::ns;
    return v;
}

value value::function(std::string name, native_fn fn) {
    value v;
    v.k_ = kind::function;
    v.f_ = std::make_shared<const function_data>(function_data{std::move(name), std::move(fn)});
    return v;
}

value value::markup(std::string s) {
    value v(std::move(s));
    v.markup_ = true;
    return v;
}

value value::iterator(list_data items, std::string python_type, bool is_view) {
    value v = list(std::move(items));
    v.k_ = kind::iterator;
    v.s_ = std::move(python_type);
    v.i_ = is_view;
    if (!is_view) v.consumed_ = std::make_shared<size_t>(0);
    return v;
}

list_data value::consume(size_t most) const {
    const size_t from = consumed_ ? *consumed_ : 0;
    const size_t n = std::min(most, l_->size() - from);
    if (consumed_) *consumed_ = from + n;
    return list_data(l_->begin() + long(from), l_->begin() + long(from + n));
}

const value * dict_data::find(std::string_view key) const {
    for (const auto & kv : items) {
        if (kv.first.is_string() && kv.first.str() == key) return &kv.second;
    }
    return nullptr;
}

const value * dict_data::find(const value & key) const {
    if (key.is_string()) return find(std::string_view(key.str()));
    for (const auto & kv : items) {
        if (!kv.first.is_string() && equals(kv.first, key)) return &kv.second;
    }
    return nullptr;
}

void dict_data::push(value key, value v) {
    nest = std::max(nest, nested(v.depth()));
    caller = caller || key.holds_caller_data() || v.holds_caller_data();
    items.emplace_back(std::move(key), std::move(v));
}

void dict_data::set(const value & key, value v) {
    nest = std::max(nest, nested(v.depth()));
    caller = caller || key.holds_caller_data() || v.holds_caller_data();
    for (auto & kv : items) {
        if (kv.first.is_string() == key.is_string() && equals(kv.first, key)) {
            kv.second = std::move(v);
            return;
        }
    }
    items.emplace_back(key, std::move(v));
}

bool hashable(const value & v) {
    if (v.is_tuple()) {
        for (const value & x : v.items()) {
            if (!hashable(x)) return false;
        }
        return true;
    }
    return v.is_none() || v.is_number() || v.is_string();
}

value call_args::get(size_t index, std::string_view name) const {
    if (index < pos.size()) return pos[index];
    for (const auto & kv : kw) {
        if (kv.first == name) return kv.second;
    }
    return value();
}

bool call_args::has(size_t index, std::string_view name) const {
    if (index < pos.size()) return true;
    for (const auto & kv : kw) {
        if (kv.first == name) return true;
    }
    return false;
}

// --- UTF-8 -------------------------------------------------------------------------

size_t utf8_next(std::string_view s, size_t i) {
    const auto c = uint8_t(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + n > s.size()) return i + 1;
    for (size_t j = 1; j < n; j++) {
        if ((uint8_t(s[i + j]) & 0xc0) != 0x80) return i + 1;
    }
    return i + n;
}

uint32_t utf8_decode(std::string_view s, size_t i) {
    const size_t n = utf8_next(s, i) - i;
    const auto c = uint8_t(s[i]);
    if (n == 1) return c;
    uint32_t cp = c & (0x7f >> n);
    for (size_t j = 1; j < n; j++) cp = (cp << 6) | (uint8_t(s[i + j]) & 0x3f);
    return cp;
}

size_t utf8_length(std::string_view s) {
    size_t n = 0;
    for (size_t i = 0; i < s.size(); i = utf8_next(s, i)) n++;
    return n;
}

std::vector<std::string_view> utf8_chars(std::string_view s) {
    std::vector<std::string_view> out;
    for (size_t i = 0; i < s.size();) {
        const size_t j = utf8_next(s, i);
        out.push_back(s.substr(i, j - i));
        i = j;
    }
    return out;
}

void utf8_append(std::string & out, uint32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xc0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        out += char(0xe0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3f));
        out += char(0x80 | (cp & 0x3f));
    } else {
        out += char(0xf0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3f));
        out += char(0x80 | ((cp >> 6) & 0x3f));
        out += char(0x80 | (cp & 0x3f));
    }
}

// str.isspace(): Unicode's White_Space plus the ASCII separators 0x1c-0x1f.
bool is_py_space(uint32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f);
    return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

// --- printing ----------------------------------------------------------------------

std::string int_str(int64_t v) {
    return std::to_string(v);
}

std::string float_repr(double d) {
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
    char buf[40];
    for (int p = 1; p <= 17; p++) {
        std::snprintf(buf, sizeof buf, "%.*e", p - 1, d);
        if (std::strtod(buf, nullptr) == d) break;
    }
    // buf: [-]D[.DDD]e[+-]XX
    std::string s = buf;
    std::string sign;
    if (s[0] == '-') {
        sign = "-";
        s.erase(0, 1);
    }
    const size_t e = s.find('e');
    const int exp = std::atoi(s.c_str() + e + 1);
    std::string digits = s.substr(0, e);
    digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
    while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
    std::string out;
    if (exp >= -5 && exp < 16) {
        if (exp < 0) {
            out = "0." + std::string(size_t(-exp - 1), '0') + digits;
        } else if (size_t(exp) + 1 >= digits.size()) {
            out = digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
        } else {
            out = digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
        }
        // Python writes 1e-05 for exponents below -4.
        if (exp < -4) out.clear();
    }
    if (out.empty()) {
        out = digits.substr(0, 1);
        if (digits.size() > 1) out += "." + digits.substr(1);
        char eb[16];
        std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
        out += eb;
    }
    return sign + out;
}

namespace {

// Code points str.isprintable() rejects beyond the C0/C1 controls: the
// separators other than space and the common format characters.
bool py_unprintable(uint32_t cp) {
    if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad) return true;
    if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f))
        return true;
    if ((cp >= 0x205f && cp <= 0x206f) || cp == 0x3000 || cp == 0xfeff) return true;
    if ((cp >= 0xe000 && cp <= 0xf8ff) || (cp >= 0xfff9 && cp <= 0xfffb)) return true;
    return false;
}

std::string string_repr(const std::string & s) {
    const bool has_single = s.find('\'') != std::string::npos;
    const bool has_double = s.find('"') != std::string::npos;
    const char q = has_single && !has_double ? '"' : '\'';
    std::string out(1, q);
    for (size_t i = 0; i < s.size();) {
        const size_t j = utf8_next(s, i);
        const uint32_t cp = utf8_decode(s, i);
        char buf[16];
        if (cp == uint32_t(q) || cp == '\\') {
            out += '\\';
            out += char(cp);
        } else if (cp == '\n') {
            out += "\\n";
        } else if (cp == '\r') {
            out += "\\r";
        } else if (cp == '\t') {
            out += "\\t";
        } else if (py_unprintable(cp)) {
            if (cp < 0x100) {
                std::snprintf(buf, sizeof buf, "\\x%02x", cp);
            } else {
                std::snprintf(buf, sizeof buf, "\\u%04x", cp);
            }
            out += buf;
        } else {
            out.append(s, i, j - i);
        }
        i = j;
    }
    out += q;
    return out;
}

} // namespace

bool value::truthy() const {
    switch (k_) {
    case kind::undefined:
    case kind::none:
        return false;
    case kind::boolean:
    case kind::integer:
        return i_ != 0;
    case kind::real:
        return d_ != 0;
    case kind::string:
        return !s_.empty();
    case kind::list:
    case kind::tuple:
        return !l_->empty();
    case kind::dict:
        return !m_->items.empty();
    case kind::ns:
    case kind::function:
        return true;
    case kind::iterator:
        return i_ ? !l_->empty() : true;
    }
    return false;
}

// --- caller data --------------------------------------------------------------------

void add_range(byte_ranges & ranges, size_t begin, size_t end) {
    if (begin >= end) return;
    if (!ranges.empty() && ranges.back().second >= begin) {
        ranges.back().second = std::max(ranges.back().second, end);
        return;
    }
    ranges.emplace_back(begin, end);
}

byte_ranges value::caller_within(size_t begin, size_t end) const {
    byte_ranges out;
    if (!caller_) return out;
    for (const auto & [b, e] : *caller_) {
        if (e <= begin) continue;
        if (b >= end) break;
        add_range(out, std::max(b, begin) - begin, std::min(e, end) - begin);
    }
    return out;
}

bool value::holds_caller_data() const {
    switch (k_) {
    case kind::string:
        return caller_ != nullptr;
    case kind::list:
    case kind::tuple:
    case kind::iterator:
        return holds_caller_;
    case kind::dict:
    case kind::ns:
        return m_->caller;
    default:
        return false;
    }
}

value value::with_caller(byte_ranges ranges) const {
    value v = *this;
    if (ranges.empty()) {
        v.caller_.reset();
    } else {
        v.caller_ = std::make_shared<const byte_ranges>(std::move(ranges));
    }
    return v;
}

value value::as_caller_data() const {
    switch (k_) {
    case kind::string:
        return s_.empty() ? *this : with_caller({{0, s_.size()}});
    case kind::list:
    case kind::tuple: {
        list_data items;
        items.reserve(l_->size());
        for (const value & x : *l_) items.push_back(x.as_caller_data());
        return k_ == kind::list ? list(std::move(items)) : tuple(std::move(items));
    }
    case kind::dict: {
        auto d = std::make_shared<dict_data>();
        for (const auto & kv : m_->items)
            d->push(kv.first.as_caller_data(), kv.second.as_caller_data());
        return dict(d);
    }
    default:
        return *this;
    }
}

void marked_text::append(std::string_view s, bool from_caller) {
    if (from_caller) add_range(caller, text.size(), text.size() + s.size());
    text += s;
}

void marked_text::append(const value & v) {
    if (v.is_string()) {
        const size_t base = text.size();
        if (const byte_ranges * r = v.caller_ranges()) {
            for (const auto & [b, e] : *r) add_range(caller, base + b, base + e);
        }
        text += v.str();
        return;
    }
    append(v.to_str(), v.holds_caller_data());
}

value marked_text::to_value() const {
    return value(text).with_caller(caller);
}

std::string value::to_str() const {
    switch (k_) {
    case kind::undefined:
        return "";
    case kind::string:
        return s_;
    default:
        return repr();
    }
}

std::string value::repr() const {
    // A namespace may hold itself; the nesting limit bounds every other value.
    thread_local uint32_t level = 0;
    struct deeper {
        deeper() {
            if (++level > k_max_nesting + 1) {
                level = 0;
                throw failure("a value that holds itself (or nests too deep) cannot be printed",
                              true);
            }
        }
        ~deeper() {
            if (level) --level;
        }
    } d;
    switch (k_) {
    case kind::undefined:
        return "";
    case kind::none:
        return "None";
    case kind::boolean:
        return i_ ? "True" : "False";
    case kind::integer:
        return int_str(i_);
    case kind::real:
        return float_repr(d_);
    case kind::string:
        return markup_ ? "Markup(" + string_repr(s_) + ")" : string_repr(s_);
    case kind::list:
    case kind::tuple: {
        std::string out = k_ == kind::list ? "[" : "(";
        for (size_t i = 0; i < l_->size(); i++) {
            if (i) out += ", ";
            out += (*l_)[i].repr();
        }
        if (k_ == kind::tuple && l_->size() == 1) out += ",";
        return out + (k_ == kind::list ? "]" : ")");
    }
    case kind::dict:
    case kind::ns: {
        std::string out = k_ == kind::ns ? "<Namespace {" : "{";
        bool first = true;
        for (const auto & kv : m_->items) {
            if (!first) out += ", ";
            first = false;
            out += kv.first.repr() + ": " + kv.second.repr();
        }
        return out + (k_ == kind::ns ? "}>" : "}");
    }
    case kind::function:
        return "<function " + f_->name + ">";
    case kind::iterator:
        if (i_) {
            std::string out = s_ + "([";
            for (size_t i = 0; i < l_->size(); i++) out += (i ? ", " : "") + (*l_)[i].repr();
            return out + "])";
        }
        // Python prints the object's address, which no template means to.
        throw failure("printing a " + s_ +
                          " (what map, select, reverse and the like give) is not supported: "
                          "Python would print a memory address (add |list)",
                      true);
    }
    return "";
}

const char * value::type_name() const {
    switch (k_) {
    case kind::undefined:
        return "Undefined";
    case kind::none:
        return "NoneType";
    case kind::boolean:
        return "bool";
    case kind::integer:
        return "int";
    case kind::real:
        return "float";
    case kind::string:
        return "str";
    case kind::list:
        return "list";
    case kind::tuple:
        return "tuple";
    case kind::dict:
        return "dict";
    case kind::ns:
        return "Namespace";
    case kind::function:
        return "function";
    case kind::iterator:
        return s_.c_str();
    }
    return "?";
}

// --- comparison --------------------------------------------------------------------

bool equals(const value & a, const value & b) {
    using k = value::kind;
    if (a.is_number() && b.is_number()) {
        if (a.is_real() || b.is_real()) return a.as_double() == b.as_double();
        return a.as_int() == b.as_int();
    }
    if (a.is_sequence() && b.is_sequence()) {
        if (a.type() != b.type() || a.items().size() != b.items().size()) return false;
        for (size_t i = 0; i < a.items().size(); i++) {
            if (!equals(a.items()[i], b.items()[i])) return false;
        }
        return true;
    }
    if (a.type() != b.type()) return false;
    switch (a.type()) {
    case k::undefined:
    case k::none:
        return true;
    case k::string:
        return a.str() == b.str();
    case k::dict: {
        const auto & x = a.entries().items;
        if (x.size() != b.entries().items.size()) return false;
        for (const auto & kv : x) {
            const value * o = b.entries().find(kv.first);
            if (!o || !equals(kv.second, *o)) return false;
        }
        return true;
    }
    case k::ns:
        return &a.entries() == &b.entries();
    case k::function:
        return &a.fn() == &b.fn();
    case k::iterator:
        return &a.items() == &b.items();
    default:
        return false;
    }
}

int compare(const value & a, const value & b) {
    if (a.is_number() && b.is_number()) {
        if (a.is_real() || b.is_real()) {
            const double x = a.as_double(), y = b.as_double();
            return x < y ? -1 : x > y ? 1 : 0;
        }
        return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    }
    if (a.is_string() && b.is_string()) {
        // Byte order of UTF-8 is code point order, as Python compares.
        const int c = a.str().compare(b.str());
        return c < 0 ? -1 : c > 0 ? 1 : 0;
    }
    if (a.is_sequence() && a.type() == b.type()) {
        const auto & x = a.items();
        const auto & y = b.items();
        for (size_t i = 0; i < x.size() && i < y.size(); i++) {
            if (!equals(x[i], y[i])) return compare(x[i], y[i]);
        }
        return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
    }
    if (a.is_undefined() || b.is_undefined()) {
        throw failure((a.is_undefined() ? a : b).str());
    }
    throw failure(std::string("'<' not supported between instances of '") + a.type_name() +
                  "' and '" + b.type_name() + "'");
}

// --- JSON --------------------------------------------------------------------------

namespace {

void json_string(std::string & out, const std::string & s, bool ensure_ascii) {
    out += '"';
    for (size_t i = 0; i < s.size(); i++) {
        const char c = s[i];
        if (ensure_ascii && uint8_t(c) >= 0x80) {
            uint32_t cp = utf8_decode(s, i);
            i = utf8_next(s, i) - 1;
            char buf[16];
            if (cp >= 0x10000) {
                cp -= 0x10000;
                std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + (cp >> 10),
                              0xdc00 + (cp & 0x3ff));
            } else {
                std::snprintf(buf, sizeof buf, "\\u%04x", cp);
            }
            out += buf;
            continue;
        }
        switch (c) {
        case '"':
            out += "\\\"";
            break;
        case '\\':
            out += "\\\\";
            break;
        case '\n':
            out += "\\n";
            break;
        case '\r':
            out += "\\r";
            break;
        case '\t':
            out += "\\t";
            break;
        case '\b':
            out += "\\b";
            break;
        case '\f':
            out += "\\f";
            break;
        default:
            if (uint8_t(c) < 0x20) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(uint8_t(c)));
                out += buf;
            } else {
                out += c;
            }
        }
    }
    out += '"';
}

// json.dumps turns the keys it accepts into strings.
std::string json_key(const value & k) {
    switch (k.type()) {
    case value::kind::string:
        return k.str();
    case value::kind::integer:
        return int_str(k.as_int());
    case value::kind::boolean:
        return k.as_bool() ? "true" : "false";
    case value::kind::none:
        return "null";
    case value::kind::real:
        return float_repr(k.as_double());
    default:
        throw failure(std::string("keys must be str, int, float, bool or None, not ") +
                      k.type_name());
    }
}

void json_write(std::string & out, const value & v, const json_style & st, int level) {
    using k = value::kind;
    const bool indented = st.indent >= 0 || !st.indent_text.empty();
    const auto newline = [&](int lvl) {
        out += '\n';
        for (int i = 0; i < lvl; i++) {
            if (!st.indent_text.empty()) {
                out += st.indent_text;
            } else {
                out.append(size_t(st.indent), ' ');
            }
        }
    };
    if (level > 1000) throw failure("tojson: the value nests more than 1000 levels deep");
    switch (v.type()) {
    case k::none:
        out += "null";
        return;
    case k::boolean:
        out += v.as_bool() ? "true" : "false";
        return;
    case k::integer:
        out += int_str(v.as_int());
        return;
    case k::real: {
        const double d = v.as_double();
        out += std::isnan(d)   ? "NaN"
               : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity")
                               : float_repr(d);
        return;
    }
    case k::string:
        json_string(out, v.str(), st.ensure_ascii);
        return;
    case k::list:
    case k::tuple: {
        if (v.items().empty()) {
            out += "[]";
            return;
        }
        out += '[';
        bool first = true;
        for (const value & x : v.items()) {
            if (!first) out += st.item_sep;
            first = false;
            if (indented) newline(level + 1);
            json_write(out, x, st, level + 1);
        }
        if (indented) newline(level);
        out += ']';
        return;
    }
    case k::dict: {
        if (v.entries().items.empty()) {
            out += "{}";
            return;
        }
        std::vector<const std::pair<value, value> *> items;
        for (const auto & kv : v.entries().items) items.push_back(&kv);
        if (st.sort_keys) {
            std::stable_sort(items.begin(), items.end(),
                             [](auto * a, auto * b) { return compare(a->first, b->first) < 0; });
        }
        out += '{';
        bool first = true;
        for (const auto * kv : items) {
            if (!first) out += st.item_sep;
            first = false;
            if (indented) newline(level + 1);
            json_string(out, json_key(kv->first), st.ensure_ascii);
            out += st.key_sep;
            json_write(out, kv->second, st, level + 1);
        }
        if (indented) newline(level);
        out += '}';
        return;
    }
    default:
        throw failure(std::string("Object of type ") + v.type_name() + " is not JSON serializable");
    }
}

struct json_parser {
    std::string_view s;
    size_t i = 0;
    int depth = 0;

    [[noreturn]] void fail(const std::string & what) const {
        throw failure("invalid JSON at offset " + std::to_string(i) + ": " + what);
    }
    void ws() {
        while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    }
    bool literal(std::string_view word) {
        if (s.substr(i, word.size()) != word) return false;
        i += word.size();
        return true;
    }
    uint32_t hex4() {
        if (i + 4 > s.size()) fail("a \\u escape needs 4 hex digits");
        uint32_t v = 0;
        for (int k = 0; k < 4; k++) {
            const char c = s[i++];
            v <<= 4;
            if (c >= '0' && c <= '9') {
                v |= uint32_t(c - '0');
            } else if (c >= 'a' && c <= 'f') {
                v |= uint32_t(c - 'a' + 10);
            } else if (c >= 'A' && c <= 'F') {
                v |= uint32_t(c - 'A' + 10);
            } else {
                fail("a \\u escape needs 4 hex digits");
            }
        }
        return v;
    }
    std::string string() {
        i++; // the opening quote
        std::string out;
        while (true) {
            if (i >= s.size()) fail("unterminated string");
            const char c = s[i++];
            if (c == '"') return out;
            if (uint8_t(c) < 0x20) fail("a control character inside a string");
            if (c != '\\') {
                out += c;
                continue;
            }
            if (i >= s.size()) fail("unterminated string");
            const char e = s[i++];
            switch (e) {
            case '"':
                out += '"';
                break;
            case '\\':
                out += '\\';
                break;
            case '/':
                out += '/';
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
            case 'u': {
                uint32_t cp = hex4();
                if (cp >= 0xd800 && cp < 0xdc00 && s.substr(i, 2) == "\\u") {
                    const size_t save = i;
                    i += 2;
                    const uint32_t lo = hex4();
                    if (lo >= 0xdc00 && lo < 0xe000) {
                        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    } else {
                        i = save;
                    }
                }
                utf8_append(out, cp);
                break;
            }
            default:
                fail(std::string("unknown escape \\") + e);
            }
        }
    }
    value number() {
        const size_t start = i;
        bool real = false;
        if (s[i] == '-') i++;
        if (i >= s.size() || !std::isdigit(uint8_t(s[i]))) fail("a number needs digits");
        while (i < s.size() && std::isdigit(uint8_t(s[i]))) i++;
        if (i < s.size() && s[i] == '.') {
            real = true;
            i++;
            if (i >= s.size() || !std::isdigit(uint8_t(s[i]))) fail("a fraction needs digits");
            while (i < s.size() && std::isdigit(uint8_t(s[i]))) i++;
        }
        if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
            real = true;
            i++;
            if (i < s.size() && (s[i] == '+' || s[i] == '-')) i++;
            if (i >= s.size() || !std::isdigit(uint8_t(s[i]))) fail("an exponent needs digits");
            while (i < s.size() && std::isdigit(uint8_t(s[i]))) i++;
        }
        const std::string text(s.substr(start, i - start));
        if (!real) {
            errno = 0;
            const long long v = std::strtoll(text.c_str(), nullptr, 10);
            if (errno == 0) return value(int64_t(v));
        }
        return value(std::strtod(text.c_str(), nullptr));
    }
    value parse() {
        ws();
        if (i >= s.size()) fail("unexpected end of text");
        if (++depth > 512) fail("nested more than 512 levels deep");
        value out;
        const char c = s[i];
        if (c == '{') {
            i++;
            auto d = std::make_shared<dict_data>();
            ws();
            if (i < s.size() && s[i] == '}') {
                i++;
            } else {
                while (true) {
                    ws();
                    if (i >= s.size() || s[i] != '"') fail("an object key must be a string");
                    std::string key = string();
                    ws();
                    if (i >= s.size() || s[i] != ':') fail("expected ':' after an object key");
                    i++;
                    d->set(key, parse());
                    ws();
                    if (i < s.size() && s[i] == ',') {
                        i++;
                        continue;
                    }
                    if (i < s.size() && s[i] == '}') {
                        i++;
                        break;
                    }
                    fail("expected ',' or '}' in an object");
                }
            }
            out = value::dict(d);
        } else if (c == '[') {
            i++;
            list_data items;
            ws();
            if (i < s.size() && s[i] == ']') {
                i++;
            } else {
                while (true) {
                    items.push_back(parse());
                    ws();
                    if (i < s.size() && s[i] == ',') {
                        i++;
                        continue;
                    }
                    if (i < s.size() && s[i] == ']') {
                        i++;
                        break;
                    }
                    fail("expected ',' or ']' in an array");
                }
            }
            out = value::list(std::move(items));
        } else if (c == '"') {
            out = value(string());
        } else if (c == '-' || std::isdigit(uint8_t(c))) {
            out = number();
        } else if (literal("true")) {
            out = value(true);
        } else if (literal("false")) {
            out = value(false);
        } else if (literal("null")) {
            out = value::none();
        } else {
            fail(std::string("unexpected character '") + c + "'");
        }
        depth--;
        return out;
    }
};

} // namespace

std::string to_json(const value & v, const json_style & style) {
    std::string out;
    json_write(out, v, style, 0);
    return out;
}

value parse_json(std::string_view text) {
    json_parser p{text};
    value v = p.parse();
    p.ws();
    if (p.i != text.size()) p.fail("extra text after the value");
    return v;
}

} // namespace smol::jinja
