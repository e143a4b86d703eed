// smol-jinja-builtins.c++ - Jinja2's filters and tests, Python's str, list
// and dict methods under the immutable sandbox, attribute and item lookup,
// and the globals of HF's chat-template environment
// (smol-jinja-builtins.h).

#include "smol-jinja-builtins.h"

#include "smol-jinja-text.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

namespace smol::jinja {

namespace {

[[noreturn]] void unsupported(const std::string & what) {
    throw failure(what, true);
}

void need_defined(const value & v) {
    if (v.is_undefined()) throw failure(v.str());
}

value str_list(const std::vector<std::string> & parts) {
    list_data out;
    for (const auto & p : parts) out.emplace_back(p);
    return value::list(std::move(out));
}

int64_t int_arg(const value & v, const char * what) {
    if (v.is_int() || v.is_bool()) return v.as_int();
    throw failure(std::string(what) + ": an integer is required, not '" + v.type_name() + "'");
}

const std::string & str_arg(const value & v, const char * what) {
    if (!v.is_string()) {
        need_defined(v);
        throw failure(std::string(what) + ": a string is required, not '" + v.type_name() + "'");
    }
    return v.str();
}

// str.format: {} {0} {name} {name.attr} {x[0]} with !r/!s and the format
// specs [[fill]align][sign][width][.precision][type].
// --- iteration and sorting ---------------------------------------------------------

// The attribute path of sort/map/selectattr ("a.b", "0").
value attr_path(const value & v, const std::string & path) {
    value cur = v;
    size_t i = 0;
    while (i <= path.size()) {
        const size_t j = std::min(path.find('.', i), path.size());
        const std::string part = path.substr(i, j - i);
        const bool num = !part.empty() && std::all_of(part.begin(), part.end(), [](char d) {
            return std::isdigit(uint8_t(d));
        });
        cur = get_item(cur, num ? value(int64_t(std::stoll(part))) : value(part));
        i = j + 1;
    }
    return cur;
}

// The sort key of a value, lower-cased when case does not count.
value sort_key(const value & v, bool case_sensitive) {
    if (!case_sensitive && v.is_string()) return value(lower(v.str()));
    return v;
}

list_data sorted(render_host & h, list_data items, bool reverse, bool case_sensitive,
                 const value & attribute) {
    h.charge(items.size());
    std::vector<std::string> attrs;
    if (attribute.is_string()) {
        for (size_t i = 0; i <= attribute.str().size();) {
            const size_t j = std::min(attribute.str().find(',', i), attribute.str().size());
            attrs.push_back(attribute.str().substr(i, j - i));
            i = j + 1;
        }
    } else if (attribute.is_int()) {
        attrs.push_back(std::to_string(attribute.as_int()));
    }
    std::vector<std::pair<list_data, size_t>> keys;
    for (size_t i = 0; i < items.size(); i++) {
        list_data k;
        if (attrs.empty()) {
            k.push_back(sort_key(items[i], case_sensitive));
        } else {
            for (const auto & a : attrs)
                k.push_back(sort_key(attr_path(items[i], a), case_sensitive));
        }
        keys.emplace_back(std::move(k), i);
    }
    std::stable_sort(keys.begin(), keys.end(), [&](const auto & a, const auto & b) {
        for (size_t i = 0; i < a.first.size(); i++) {
            const int c = compare(a.first[i], b.first[i]);
            if (c != 0) return reverse ? c > 0 : c < 0;
        }
        return false;
    });
    list_data out;
    for (const auto & k : keys) out.push_back(items[k.second]);
    return out;
}

value items_of(const value & v) {
    if (v.is_undefined()) return value::list({});
    if (!v.is_dict()) throw failure("Can only get item pairs from a mapping.");
    list_data out;
    for (const auto & kv : v.entries().items) out.push_back(value::tuple({kv.first, kv.second}));
    return value::list(std::move(out));
}

int64_t length_of(const value & v) {
    switch (v.type()) {
    case value::kind::undefined:
        return 0;
    case value::kind::string:
        return int64_t(utf8_length(v.str()));
    case value::kind::list:
    case value::kind::tuple:
        return int64_t(v.items().size());
    case value::kind::dict:
        return int64_t(v.entries().items.size());
    case value::kind::iterator:
        if (v.is_view()) return int64_t(v.items().size());
        [[fallthrough]];
    default:
        throw failure(std::string("object of type '") + v.type_name() + "' has no len()");
    }
}

// Python's int(str): optional sign, digits and underscores, spaces around.
bool parse_int(const std::string & text, int64_t base, int64_t & out) {
    const std::string s = strip(text, nullptr, true, true);
    if (s.empty()) return false;
    size_t i = 0;
    bool neg = false;
    if (s[i] == '+' || s[i] == '-') neg = s[i++] == '-';
    if (i >= s.size()) return false;
    int64_t v = 0;
    bool digit_before = false;
    for (; i < s.size(); i++) {
        const char c = s[i];
        if (c == '_' && digit_before && i + 1 < s.size() && s[i + 1] != '_') continue;
        int d = std::isdigit(uint8_t(c))   ? c - '0'
                : std::isalpha(uint8_t(c)) ? std::tolower(c) - 'a' + 10
                                           : 99;
        if (d >= base) return false;
        if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v)) return false;
        digit_before = true;
    }
    out = neg ? -v : v;
    return true;
}

bool parse_float(const std::string & text, double & out) {
    const std::string s = strip(text, nullptr, true, true);
    if (s.empty()) return false;
    std::string t;
    for (const char c : s) {
        if (c != '_') t += c;
    }
    char * end = nullptr;
    out = std::strtod(t.c_str(), &end);
    if (end != t.c_str() + t.size()) return false;
    const std::string l = lower(t);
    if (l.find("0x") != std::string::npos) return false; // strtod reads hex, Python does not
    return true;
}

// Python's round(x, n): half to even on the exact binary value, which
// printf's correct rounding gives.
double py_round(double x, int64_t n) {
    if (!std::isfinite(x)) return x;
    if (n > 300) return x;
    if (n < 0) {
        const double p = std::pow(10.0, double(-n));
        double r = std::nearbyint(x / p) * p;
        return r;
    }
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", int(n), x);
    return std::strtod(buf, nullptr);
}

// --- the HF tojson filter ----------------------------------------------------------

value tojson(const value & v, const call_args & a) {
    json_style st;
    const value indent = a.get(1, "indent");
    if (indent.is_int()) {
        st.indent = int(std::max<int64_t>(0, std::min<int64_t>(indent.as_int(), 1 << 16)));
    } else if (indent.is_string()) {
        st.indent_text = indent.str();
        if (st.indent_text.empty()) st.indent = 0;
    } else if (!indent.is_none() && !indent.is_undefined()) {
        throw failure("tojson: indent must be an integer or a string");
    }
    if (st.indent >= 0 || !st.indent_text.empty()) st.item_sep = ",";
    const value seps = a.get(2, "separators");
    if (seps.is_sequence()) {
        if (seps.items().size() != 2 || !seps.items()[0].is_string() ||
            !seps.items()[1].is_string())
            throw failure("tojson: separators must be a pair of strings");
        st.item_sep = seps.items()[0].str();
        st.key_sep = seps.items()[1].str();
    } else if (!seps.is_none() && !seps.is_undefined()) {
        throw failure("tojson: separators must be a pair of strings");
    }
    const value ensure_ascii = a.get(0, "ensure_ascii");
    st.ensure_ascii = ensure_ascii.truthy();
    st.sort_keys = a.get(3, "sort_keys").truthy();
    for (const auto & kv : a.kw) {
        if (kv.first != "indent" && kv.first != "separators" && kv.first != "sort_keys" &&
            kv.first != "ensure_ascii")
            throw failure("tojson() got an unexpected keyword argument '" + kv.first + "'");
    }
    return value(to_json(v, st));
}

// --- filters -----------------------------------------------------------------------

using filter_fn = value (*)(render_host &, const value &, call_args &);

value f_default(render_host &, const value & v, call_args & a) {
    const bool boolean = a.get(1, "boolean").truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) {
        const value d = a.get(0, "default_value");
        return a.has(0, "default_value") ? d : value("");
    }
    return v;
}

value f_length(render_host &, const value & v, call_args &) {
    return value(length_of(v));
}

// A filter's text result, Markup when its input was (jinja2's soft_str
// keeps Markup, whose methods return Markup).
value like(const value & in, std::string s) {
    return in.is_markup() ? value::markup(std::move(s)) : value(std::move(s));
}

value f_string(render_host &, const value & v, call_args &) {
    if (v.is_string()) return v; // str(s) is s, its caller ranges kept
    return like(v, v.to_str());
}

value f_trim(render_host &, const value & v, call_args & a) {
    const value chars = a.get(0, "chars");
    const std::string * set = chars.is_string() ? &chars.str() : nullptr;
    const std::string text = v.to_str();
    // The stripped text is a substring: keep the caller ranges inside it.
    const size_t begin = text.size() - strip(text, set, true, false).size();
    const size_t end = strip(text, set, false, true).size();
    if (begin >= end) return like(v, std::string());
    const value out = like(v, text.substr(begin, end - begin));
    if (!v.is_string()) return out;
    return out.with_caller(v.caller_within(begin, end));
}

value f_upper(render_host &, const value & v, call_args &) {
    return like(v, upper(v.to_str()));
}
value f_lower(render_host &, const value & v, call_args &) {
    return like(v, lower(v.to_str()));
}
value f_capitalize(render_host &, const value & v, call_args &) {
    return like(v, capitalize(v.to_str()));
}

// Jinja's title filter (not str.title): words begin after -, space, (, {, [ or <.
value f_title(render_host &, const value & v, call_args &) {
    const std::string s = v.to_str();
    std::string out;
    bool start = true;
    for (size_t i = 0; i < s.size(); i = utf8_next(s, i)) {
        const uint32_t c = utf8_decode(s, i);
        const std::string ch = s.substr(i, utf8_next(s, i) - i);
        const bool sep = is_py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
        if (sep) {
            out += ch;
            start = true;
        } else {
            out += start ? upper(ch) : lower(ch);
            start = false;
        }
    }
    return value(out);
}

value f_replace(render_host & h, const value & v, call_args & a) {
    const value count = a.get(2, "count");
    return value(replace_all(v.to_str(), a.get(0, "old").to_str(), a.get(1, "new").to_str(),
                             count.is_int() ? count.as_int() : -1, h.max_output()));
}

value f_join(render_host & h, const value & v, call_args & a) {
    const value d = a.get(0, "d");
    const value sep_value = d.is_string() ? d : value(d.to_str());
    const value attribute = a.get(1, "attribute");
    const list_data items = iterate(v);
    h.charge(items.size());
    marked_text out;
    for (size_t i = 0; i < items.size(); i++) {
        if (i) out.append(sep_value);
        out.append(attribute.is_undefined() || attribute.is_none()
                       ? items[i]
                       : attr_path(items[i], attribute.to_str()));
        if (out.text.size() > h.max_output())
            throw failure("join: the string passed the size limit");
    }
    return out.to_value();
}

value f_list(render_host & h, const value & v, call_args &) {
    list_data items = iterate(v);
    h.charge(items.size());
    return value::list(std::move(items));
}

value f_first(render_host &, const value & v, call_args &) {
    const list_data items = v.is_iterator() ? v.consume(1) : iterate(v);
    return items.empty() ? value::undefined("No first item, sequence was empty.") : items.front();
}

value f_last(render_host &, const value & v, call_args &) {
    if (v.is_iterator() && !v.is_view())
        throw failure(std::string("'") + v.type_name() + "' object is not reversible");
    const list_data items = iterate(v);
    return items.empty() ? value::undefined("No last item, sequence was empty.") : items.back();
}

value f_items(render_host &, const value & v, call_args &) {
    return value::iterator(items_of(v).items(), "generator", false);
}

value f_dictsort(render_host & h, const value & v, call_args & a) {
    if (!v.is_dict()) {
        need_defined(v);
        throw failure("dictsort: a mapping is required");
    }
    const bool case_sensitive = a.get(0, "case_sensitive").truthy();
    const value by = a.get(1, "by");
    const bool reverse = a.get(2, "reverse").truthy();
    int pos = 0;
    if (by.is_string()) {
        if (by.str() == "value") {
            pos = 1;
        } else if (by.str() != "key") {
            throw failure("You can only sort by either \"key\" or \"value\"");
        }
    }
    const list_data pairs = items_of(v).items();
    return value::list(sorted(h, pairs, reverse, case_sensitive, value(int64_t(pos))));
}

value f_tojson(render_host &, const value & v, call_args & a) {
    return tojson(v, a);
}

value f_safe(render_host &, const value & v, call_args &) {
    return value::markup(v.to_str());
}

value f_escape(render_host &, const value & v, call_args &) {
    return v.is_markup() ? v : value::markup(html_escape(v.to_str()));
}

value f_indent(render_host &, const value & v, call_args & a) {
    const value width = a.get(0, "width");
    std::string ind =
        width.is_string()
            ? width.str()
            : std::string(
                  size_t(std::max<int64_t>(0, width.is_undefined() ? 4 : int_arg(width, "indent"))),
                  ' ');
    const bool first = a.get(1, "first").truthy();
    const bool blank = a.get(2, "blank").truthy();
    const std::string s = v.to_str() + "\n";
    const std::vector<std::string> lines = splitlines(s, false);
    std::string rv;
    if (blank) {
        for (size_t i = 0; i < lines.size(); i++) {
            if (i) rv += "\n" + ind;
            rv += lines[i];
        }
    } else {
        rv = lines.empty() ? "" : lines[0];
        if (lines.size() > 1) {
            rv += "\n";
            for (size_t i = 1; i < lines.size(); i++) {
                if (i > 1) rv += "\n";
                if (!lines[i].empty()) rv += ind;
                rv += lines[i];
            }
        }
    }
    if (first) rv = ind + rv;
    return like(v, rv);
}

value f_int(render_host &, const value & v, call_args & a) {
    const value dflt = a.has(0, "default") ? a.get(0, "default") : value(int64_t(0));
    const value base = a.get(1, "base");
    if (v.is_int() || v.is_bool()) return value(v.as_int());
    if (v.is_real()) {
        if (!std::isfinite(v.as_double())) return dflt;
        return value(int64_t(v.as_double()));
    }
    if (v.is_string()) {
        int64_t out;
        if (parse_int(v.str(), base.is_int() ? base.as_int() : 10, out)) return value(out);
        double d;
        if (parse_float(v.str(), d) && std::isfinite(d)) return value(int64_t(d));
    }
    return dflt;
}

value f_float(render_host &, const value & v, call_args & a) {
    const value dflt = a.has(0, "default") ? a.get(0, "default") : value(0.0);
    if (v.is_number()) return value(v.as_double());
    double d;
    if (v.is_string() && parse_float(v.str(), d)) return value(d);
    return dflt;
}

value f_abs(render_host &, const value & v, call_args &) {
    need_defined(v);
    if (v.is_real()) return value(std::fabs(v.as_double()));
    if (v.is_number()) return value(v.as_int() < 0 ? -v.as_int() : v.as_int());
    throw failure(std::string("bad operand type for abs(): '") + v.type_name() + "'");
}

value f_round(render_host &, const value & v, call_args & a) {
    need_defined(v);
    if (!v.is_number())
        throw failure(std::string("type ") + v.type_name() + " doesn't define __round__ method");
    const value p = a.get(0, "precision");
    const int64_t prec = p.is_undefined() ? 0 : int_arg(p, "round");
    const value method = a.get(1, "method");
    const std::string m = method.is_string() ? method.str() : "common";
    if (m == "common") {
        if (!v.is_real()) return value(v.as_int());
        return value(py_round(v.as_double(), prec));
    }
    if (m != "floor" && m != "ceil") throw failure("method must be common, ceil or floor");
    const double scale = std::pow(10.0, double(prec));
    const double x = v.as_double() * scale;
    return value((m == "floor" ? std::floor(x) : std::ceil(x)) / scale);
}

value f_sum(render_host & h, const value & v, call_args & a) {
    const value attribute = a.get(0, "attribute");
    value total = a.has(1, "start") ? a.get(1, "start") : value(int64_t(0));
    const list_data items = iterate(v);
    h.charge(items.size());
    for (const value & x0 : items) {
        const value x = attribute.is_string() ? attr_path(x0, attribute.str()) : x0;
        if (!x.is_number() || !total.is_number())
            throw failure(std::string("unsupported operand type(s) for +: '") + total.type_name() +
                          "' and '" + x.type_name() + "'");
        if (x.is_real() || total.is_real()) {
            total = value(total.as_double() + x.as_double());
        } else {
            int64_t r;
            if (__builtin_add_overflow(total.as_int(), x.as_int(), &r))
                unsupported("integer overflow in sum");
            total = value(r);
        }
    }
    return total;
}

value min_max(render_host & h, const value & v, call_args & a, bool want_max) {
    const bool case_sensitive = a.get(0, "case_sensitive").truthy();
    const value attribute = a.get(1, "attribute");
    const list_data items = iterate(v);
    h.charge(items.size());
    if (items.empty())
        return value::undefined(std::string("No aggregated item, sequence was empty."));
    size_t best = 0;
    value best_key;
    for (size_t i = 0; i < items.size(); i++) {
        const value k =
            sort_key(attribute.is_string() ? attr_path(items[i], attribute.str()) : items[i],
                     case_sensitive);
        if (i == 0 || (want_max ? compare(k, best_key) > 0 : compare(k, best_key) < 0)) {
            best = i;
            best_key = k;
        }
    }
    return items[best];
}

value f_min(render_host & h, const value & v, call_args & a) {
    return min_max(h, v, a, false);
}
value f_max(render_host & h, const value & v, call_args & a) {
    return min_max(h, v, a, true);
}

value f_unique(render_host & h, const value & v, call_args & a) {
    const bool case_sensitive = a.get(0, "case_sensitive").truthy();
    const value attribute = a.get(1, "attribute");
    const list_data items = iterate(v);
    h.charge(items.size() * items.size() / 16 + items.size());
    list_data out, seen;
    for (const value & x : items) {
        const value k =
            sort_key(attribute.is_string() ? attr_path(x, attribute.str()) : x, case_sensitive);
        if (std::any_of(seen.begin(), seen.end(), [&](const value & s) { return equals(s, k); }))
            continue;
        seen.push_back(k);
        out.push_back(x);
    }
    return value::iterator(std::move(out), "generator", false);
}

value f_sort(render_host & h, const value & v, call_args & a) {
    return value::list(sorted(h, iterate(v), a.get(0, "reverse").truthy(),
                              a.get(1, "case_sensitive").truthy(), a.get(2, "attribute")));
}

value f_reverse(render_host &, const value & v, call_args &) {
    if (v.is_string()) {
        auto chars = utf8_chars(v.str());
        std::string out;
        for (size_t i = chars.size(); i-- > 0;) out += chars[i];
        return value(out);
    }
    // reversed() of a list is an iterator; of a generator it fails, and
    // jinja2 falls back to a reversed list.
    const bool lazy = v.is_iterator() && !v.is_view();
    list_data items = iterate(v);
    std::reverse(items.begin(), items.end());
    if (lazy) return value::list(std::move(items));
    return value::iterator(std::move(items),
                           v.is_dict() ? "dict_reversekeyiterator" : "list_reverseiterator", false);
}

value f_map(render_host & h, const value & v, call_args & a) {
    // jinja2 maps nothing over a false value (None included).
    const list_data items = v.truthy() ? iterate(v) : list_data{};
    h.charge(items.size());
    list_data out;
    bool by_attribute = false;
    value attribute, dflt;
    for (const auto & kv : a.kw) {
        if (kv.first == "attribute") {
            by_attribute = true;
            attribute = kv.second;
        } else if (kv.first == "default") {
            dflt = kv.second;
        }
    }
    if (by_attribute) {
        for (const value & x : items) {
            value r = attr_path(x, attribute.to_str());
            if (r.is_undefined() && !dflt.is_undefined()) r = dflt;
            out.push_back(r);
        }
        return value::iterator(std::move(out), "generator", false);
    }
    if (a.pos.empty()) throw failure("map requires a filter argument");
    const std::string name = a.pos[0].to_str();
    if (!has_filter(name)) unsupported("filter '" + name + "' is not supported");
    call_args rest;
    rest.pos.assign(a.pos.begin() + 1, a.pos.end());
    rest.kw = a.kw;
    for (const value & x : items) {
        call_args r = rest;
        out.push_back(apply_filter(h, name, x, r));
    }
    return value::iterator(std::move(out), "generator", false);
}

value select_common(render_host & h, const value & v, call_args & a, bool attr, bool keep) {
    const list_data items = v.truthy() ? iterate(v) : list_data{};
    h.charge(items.size());
    size_t at = 0;
    std::string attribute;
    if (attr) {
        if (a.pos.empty()) throw failure("selectattr and rejectattr need an attribute");
        attribute = a.pos[at++].to_str();
    }
    std::string test;
    if (at < a.pos.size()) {
        test = a.pos[at++].to_str();
        if (!has_test(test)) unsupported("test '" + test + "' is not supported");
    }
    call_args rest;
    rest.pos.assign(a.pos.begin() + long(std::min(at, a.pos.size())), a.pos.end());
    rest.kw = a.kw;
    list_data out;
    for (const value & x : items) {
        const value subject = attr ? attr_path(x, attribute) : x;
        bool ok;
        if (test.empty()) {
            ok = subject.truthy();
        } else {
            call_args r = rest;
            ok = apply_test(h, test, subject, r);
        }
        if (ok == keep) out.push_back(x);
    }
    return value::iterator(std::move(out), "generator", false);
}

value f_select(render_host & h, const value & v, call_args & a) {
    return select_common(h, v, a, false, true);
}
value f_reject(render_host & h, const value & v, call_args & a) {
    return select_common(h, v, a, false, false);
}
value f_selectattr(render_host & h, const value & v, call_args & a) {
    return select_common(h, v, a, true, true);
}
value f_rejectattr(render_host & h, const value & v, call_args & a) {
    return select_common(h, v, a, true, false);
}

value f_batch(render_host & h, const value & v, call_args & a) {
    const int64_t n = int_arg(a.get(0, "linecount"), "batch");
    if (n <= 0) throw failure("batch: linecount must be positive");
    const bool fill = a.has(1, "fill_with");
    const value with = a.get(1, "fill_with");
    const list_data items = iterate(v);
    h.charge(items.size());
    list_data out, cur;
    for (const value & x : items) {
        cur.push_back(x);
        if (int64_t(cur.size()) == n) {
            out.push_back(value::list(std::move(cur)));
            cur.clear();
        }
    }
    if (!cur.empty()) {
        while (fill && int64_t(cur.size()) < n) cur.push_back(with);
        out.push_back(value::list(std::move(cur)));
    }
    return value::iterator(std::move(out), "generator", false);
}

value f_wordcount(render_host &, const value & v, call_args &) {
    const std::string s = v.to_str();
    int64_t n = 0;
    bool in_word = false;
    for (size_t i = 0; i < s.size(); i = utf8_next(s, i)) {
        const uint32_t c = utf8_decode(s, i);
        const bool w = c == '_' || (c < 0x80 ? std::isalnum(int(c)) != 0 : is_alpha_cp(c));
        if (w && !in_word) n++;
        in_word = w;
    }
    return value(n);
}

value f_center(render_host &, const value & v, call_args & a) {
    const value w = a.get(0, "width");
    const int64_t width = w.is_undefined() ? 80 : int_arg(w, "center");
    const std::string s = v.to_str();
    const int64_t len = int64_t(utf8_length(s));
    if (width <= len) return like(v, s);
    const int64_t pad = width - len;
    // CPython's rule for where the odd space goes.
    const int64_t left = pad / 2 + (pad & width & 1);
    return like(v, std::string(size_t(left), ' ') + s + std::string(size_t(pad - left), ' '));
}

value f_striptags(render_host &, const value & v, call_args &) {
    std::string s = v.to_str(), out;
    for (size_t i = 0; i < s.size();) {
        if (s.compare(i, 4, "<!--") == 0) {
            const size_t e = s.find("-->", i + 4);
            if (e != std::string::npos) {
                i = e + 3;
                continue;
            }
        }
        if (s[i] == '<') {
            const size_t e = s.find('>', i + 1);
            if (e != std::string::npos) {
                i = e + 1;
                continue;
            }
        }
        out += s[i++];
    }
    const std::vector<std::string> words = split_ws(out, -1);
    std::string joined;
    for (size_t i = 0; i < words.size(); i++) joined += (i ? " " : "") + words[i];
    const std::pair<const char *, const char *> entities[] = {{"&lt;", "<"},    {"&gt;", ">"},
                                                              {"&quot;", "\""}, {"&#34;", "\""},
                                                              {"&#39;", "'"},   {"&amp;", "&"}};
    for (const auto & e : entities) joined = replace_all(joined, e.first, e.second, -1, size_t(-1));
    return value(joined);
}

value f_format(render_host &, const value & v, call_args & a) {
    if (!a.kw.empty() && !a.pos.empty())
        throw failure("can't handle positional and keyword arguments at the same time");
    if (!a.kw.empty()) unsupported("the format filter with keyword arguments is not supported");
    return value(percent_format(v.to_str(), value::tuple(a.pos)));
}

value f_count(render_host & h, const value & v, call_args & a) {
    return f_length(h, v, a);
}

const std::unordered_map<std::string_view, filter_fn> & filters() {
    static const std::unordered_map<std::string_view, filter_fn> table = {
        {"abs", f_abs},
        {"batch", f_batch},
        {"capitalize", f_capitalize},
        {"center", f_center},
        {"count", f_count},
        {"d", f_default},
        {"default", f_default},
        {"dictsort", f_dictsort},
        {"e", f_escape},
        {"escape", f_escape},
        {"first", f_first},
        {"float", f_float},
        {"format", f_format},
        {"indent", f_indent},
        {"int", f_int},
        {"items", f_items},
        {"join", f_join},
        {"last", f_last},
        {"length", f_length},
        {"list", f_list},
        {"lower", f_lower},
        {"map", f_map},
        {"max", f_max},
        {"min", f_min},
        {"reject", f_reject},
        {"rejectattr", f_rejectattr},
        {"replace", f_replace},
        {"reverse", f_reverse},
        {"round", f_round},
        {"safe", f_safe},
        {"select", f_select},
        {"selectattr", f_selectattr},
        {"sort", f_sort},
        {"string", f_string},
        {"striptags", f_striptags},
        {"sum", f_sum},
        {"title", f_title},
        {"tojson", f_tojson},
        {"trim", f_trim},
        {"unique", f_unique},
        {"upper", f_upper},
        {"wordcount", f_wordcount},
    };
    return table;
}

// --- tests -------------------------------------------------------------------------

using test_fn = bool (*)(render_host &, const value &, call_args &);

bool t_defined(render_host &, const value & v, call_args &) {
    return !v.is_undefined();
}
bool t_undefined(render_host &, const value & v, call_args &) {
    return v.is_undefined();
}
bool t_none(render_host &, const value & v, call_args &) {
    return v.is_none();
}
bool t_string(render_host &, const value & v, call_args &) {
    return v.is_string();
}
bool t_number(render_host &, const value & v, call_args &) {
    return v.is_number();
}
bool t_integer(render_host &, const value & v, call_args &) {
    return v.is_int();
}
bool t_float(render_host &, const value & v, call_args &) {
    return v.is_real();
}
bool t_boolean(render_host &, const value & v, call_args &) {
    return v.is_bool();
}
bool t_true(render_host &, const value & v, call_args &) {
    return v.is_bool() && v.as_bool();
}
bool t_false(render_host &, const value & v, call_args &) {
    return v.is_bool() && !v.as_bool();
}
bool t_mapping(render_host &, const value & v, call_args &) {
    return v.is_dict();
}
// Jinja's undefined has __iter__, __len__ and __getitem__.
bool t_iterable(render_host &, const value & v, call_args &) {
    return v.is_string() || v.is_sequence() || v.is_dict() || v.is_undefined() || v.is_iterator();
}
// A sequence has a len and items by index; iterators and views have not.
bool t_sequence(render_host &, const value & v, call_args &) {
    return v.is_string() || v.is_sequence() || v.is_dict() || v.is_undefined();
}
bool t_callable(render_host &, const value & v, call_args &) {
    return v.is_function() || v.is_undefined();
}
bool t_lower(render_host &, const value & v, call_args &) {
    const std::string s = v.to_str();
    return s == lower(s) && s != upper(s);
}
bool t_upper(render_host &, const value & v, call_args &) {
    const std::string s = v.to_str();
    return s == upper(s) && s != lower(s);
}
int64_t mod_of(const value & v, int64_t m) {
    need_defined(v);
    if (!v.is_int() && !v.is_bool()) {
        if (v.is_real()) return int64_t(std::fmod(v.as_double(), double(m)) != 0);
        throw failure(std::string("unsupported operand type(s) for %: '") + v.type_name() +
                      "' and 'int'");
    }
    const int64_t r = v.as_int() % m;
    return r < 0 ? r + m : r;
}
bool t_odd(render_host &, const value & v, call_args &) {
    return mod_of(v, 2) == 1;
}
bool t_even(render_host &, const value & v, call_args &) {
    return mod_of(v, 2) == 0;
}
bool t_divisibleby(render_host &, const value & v, call_args & a) {
    const int64_t n = int_arg(a.get(0, "num"), "divisibleby");
    if (n == 0) throw failure("integer division or modulo by zero");
    return mod_of(v, n < 0 ? -n : n) == 0;
}
bool t_eq(render_host &, const value & v, call_args & a) {
    return equals(v, a.get(0, "other"));
}
bool t_ne(render_host &, const value & v, call_args & a) {
    return !equals(v, a.get(0, "other"));
}
bool t_lt(render_host &, const value & v, call_args & a) {
    return compare(v, a.get(0, "other")) < 0;
}
bool t_le(render_host &, const value & v, call_args & a) {
    return compare(v, a.get(0, "other")) <= 0;
}
bool t_gt(render_host &, const value & v, call_args & a) {
    return compare(v, a.get(0, "other")) > 0;
}
bool t_ge(render_host &, const value & v, call_args & a) {
    return compare(v, a.get(0, "other")) >= 0;
}
bool t_in(render_host &, const value & v, call_args & a) {
    const value seq = a.get(0, "seq");
    if (seq.is_string()) return v.is_string() && seq.str().find(v.str()) != std::string::npos;
    for (const value & x : iterate(seq)) {
        if (equals(x, v)) return true;
    }
    return false;
}
bool t_sameas(render_host &, const value & v, call_args & a) {
    const value o = a.get(0, "other");
    if (v.is_none() || o.is_none()) return v.is_none() && o.is_none();
    if (v.is_bool() || o.is_bool()) return v.is_bool() && o.is_bool() && v.as_bool() == o.as_bool();
    unsupported("the sameas test is supported for None, True and False only");
}
bool t_filter(render_host &, const value & v, call_args &) {
    return v.is_string() && has_filter(v.str());
}
bool t_test(render_host &, const value & v, call_args &) {
    return v.is_string() && has_test(v.str());
}

const std::unordered_map<std::string_view, test_fn> & tests() {
    static const std::unordered_map<std::string_view, test_fn> table = {
        {"defined", t_defined},
        {"undefined", t_undefined},
        {"none", t_none},
        {"string", t_string},
        {"number", t_number},
        {"integer", t_integer},
        {"float", t_float},
        {"boolean", t_boolean},
        {"true", t_true},
        {"false", t_false},
        {"mapping", t_mapping},
        {"iterable", t_iterable},
        {"sequence", t_sequence},
        {"callable", t_callable},
        {"lower", t_lower},
        {"upper", t_upper},
        {"odd", t_odd},
        {"even", t_even},
        {"divisibleby", t_divisibleby},
        {"eq", t_eq},
        {"equalto", t_eq},
        {"==", t_eq},
        {"ne", t_ne},
        {"!=", t_ne},
        {"lt", t_lt},
        {"lessthan", t_lt},
        {"<", t_lt},
        {"le", t_le},
        {"<=", t_le},
        {"gt", t_gt},
        {"greaterthan", t_gt},
        {">", t_gt},
        {"ge", t_ge},
        {">=", t_ge},
        {"in", t_in},
        {"sameas", t_sameas},
        {"filter", t_filter},
        {"test", t_test},
    };
    return table;
}

// --- methods -----------------------------------------------------------------------

// ImmutableSandboxedEnvironment refuses the methods that modify a list or
// dict; jinja2 raises SecurityError on the call.
value forbidden(const value & obj, const std::string & name) {
    const std::string type = obj.type_name();
    return value::function(name, [type, name](call_args &) -> value {
        throw failure("access to attribute '" + name + "' of '" + type +
                      "' object is unsafe (the sandbox forbids changing a " + type + ")");
    });
}

value not_implemented(const value & obj, const std::string & name) {
    const std::string type = obj.type_name();
    return value::function(name, [type, name](call_args &) -> value {
        unsupported("method '" + type + "." + name + "' is not supported");
    });
}

value str_method(const value & self, const std::string & name) {
    const std::string s = self.str();
    const auto m = [&](native_fn fn) { return value::function("str." + name, std::move(fn)); };
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const bool l = name != "rstrip", r = name != "lstrip";
        return m([s, l, r](call_args & a) {
            const value chars = a.get(0, "chars");
            return value(strip(s, chars.is_string() ? &chars.str() : nullptr, l, r));
        });
    }
    if (name == "split" || name == "rsplit") {
        const bool right = name == "rsplit";
        return m([s, right](call_args & a) {
            const value sep = a.get(0, "sep");
            const value max = a.get(1, "maxsplit");
            const int64_t n = max.is_undefined() ? -1 : int_arg(max, "split");
            if (sep.is_undefined() || sep.is_none()) {
                if (right && n >= 0)
                    unsupported(
                        "str.rsplit without a separator and with maxsplit is not supported");
                return str_list(split_ws(s, n));
            }
            const std::string & p = str_arg(sep, "split");
            return str_list(right ? rsplit_sep(s, p, n) : split_sep(s, p, n));
        });
    }
    if (name == "startswith" || name == "endswith") {
        const bool start = name == "startswith";
        return m([s, start](call_args & a) {
            const value p = a.get(0, "prefix");
            if (a.pos.size() > 1)
                unsupported("str." + std::string(start ? "startswith" : "endswith") +
                            " with start or end is not supported");
            const list_data opts = p.is_tuple() ? p.items() : list_data{p};
            for (const value & o : opts) {
                const std::string & x = str_arg(o, start ? "startswith" : "endswith");
                if (x.size() <= s.size() &&
                    (start ? s.compare(0, x.size(), x) == 0
                           : s.compare(s.size() - x.size(), x.size(), x) == 0))
                    return value(true);
            }
            return value(false);
        });
    }
    if (name == "upper") return m([s](call_args &) { return value(upper(s)); });
    if (name == "lower") return m([s](call_args &) { return value(lower(s)); });
    if (name == "title") return m([s](call_args &) { return value(py_title(s)); });
    if (name == "capitalize") return m([s](call_args &) { return value(capitalize(s)); });
    if (name == "replace") {
        return m([s](call_args & a) {
            const value c = a.get(2, "count");
            return value(replace_all(
                s, str_arg(a.get(0, "old"), "replace"), str_arg(a.get(1, "new"), "replace"),
                c.is_undefined() ? -1 : int_arg(c, "replace"), size_t(64) << 20));
        });
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "rindex" ||
        name == "count") {
        return m([s, name](call_args & a) {
            if (a.pos.size() > 1)
                unsupported("str." + name + " with start or end is not supported");
            const value sub_arg = a.get(0, "sub"); // str_arg refers into it
            const std::string & sub = str_arg(sub_arg, name.c_str());
            if (name == "count") {
                if (sub.empty()) return value(int64_t(utf8_length(s) + 1));
                int64_t n = 0;
                for (size_t i = s.find(sub); i != std::string::npos;
                     i = s.find(sub, i + sub.size()))
                    n++;
                return value(n);
            }
            const size_t at = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
            if (at == std::string::npos) {
                if (name == "index" || name == "rindex") throw failure("substring not found");
                return value(int64_t(-1));
            }
            return value(cp_index(s, at));
        });
    }
    if (name == "format") return m([s](call_args & a) { return value(str_format(s, a)); });
    if (name == "join") {
        return m([s](call_args & a) {
            std::string out;
            bool first = true;
            for (const value & x : iterate(a.get(0, "iterable"))) {
                if (!x.is_string())
                    throw failure(std::string("sequence item: expected str instance, ") +
                                  x.type_name() + " found");
                if (!first) out += s;
                first = false;
                out += x.str();
            }
            return value(out);
        });
    }
    if (name == "splitlines") {
        return m(
            [s](call_args & a) { return str_list(splitlines(s, a.get(0, "keepends").truthy())); });
    }
    if (name == "removeprefix" || name == "removesuffix") {
        const bool prefix = name == "removeprefix";
        return m([s, prefix](call_args & a) {
            const value arg = a.get(0, "prefix"); // str_arg refers into it
            const std::string & x = str_arg(arg, "removeprefix");
            if (x.size() <= s.size()) {
                if (prefix && s.compare(0, x.size(), x) == 0) return value(s.substr(x.size()));
                if (!prefix && s.compare(s.size() - x.size(), x.size(), x) == 0)
                    return value(s.substr(0, s.size() - x.size()));
            }
            return value(s);
        });
    }
    if (name == "isdigit" || name == "isnumeric" || name == "isdecimal" || name == "isalpha" ||
        name == "isalnum" || name == "isspace" || name == "islower" || name == "isupper") {
        return m([s, name](call_args &) {
            if (s.empty()) return value(false);
            if (name == "islower" || name == "isupper") {
                const bool want_lower = name == "islower";
                bool cased = false;
                for (size_t i = 0; i < s.size(); i = utf8_next(s, i)) {
                    const uint32_t c = utf8_decode(s, i);
                    if (!is_cased_letter(c)) continue;
                    cased = true;
                    if (want_lower ? lower_cp(c) != c : upper_cp(c) != c) return value(false);
                }
                return value(cased);
            }
            for (size_t i = 0; i < s.size(); i = utf8_next(s, i)) {
                const uint32_t c = utf8_decode(s, i);
                bool ok;
                if (c >= 0x80 && name != "isspace" && name != "isalpha")
                    unsupported("str." + name + " on non-ASCII text is not supported");
                if (name == "isspace") {
                    ok = is_py_space(c);
                } else if (name == "isalpha") {
                    ok = is_alpha_cp(c);
                } else if (name == "isalnum") {
                    ok = std::isalnum(int(c)) != 0;
                } else {
                    ok = std::isdigit(int(c)) != 0;
                }
                if (!ok) return value(false);
            }
            return value(true);
        });
    }
    static const char * python_str_methods[] = {
        "casefold",     "center",      "encode",   "expandtabs", "format_map", "isascii",
        "isidentifier", "isprintable", "istitle",  "ljust",      "maketrans",  "partition",
        "rjust",        "rpartition",  "swapcase", "translate",  "zfill"};
    for (const char * p : python_str_methods) {
        if (name == p) return not_implemented(self, name);
    }
    return value::undefined("'str object' has no attribute '" + name + "'");
}

value dict_method(const value & self, const std::string & name) {
    if (name == "items")
        return value::function("dict.items", [self](call_args &) {
            return value::iterator(items_of(self).items(), "dict_items", true);
        });
    if (name == "keys" || name == "values") {
        const bool keys = name == "keys";
        return value::function("dict." + name, [self, keys](call_args &) {
            list_data out;
            for (const auto & kv : self.entries().items) out.push_back(keys ? kv.first : kv.second);
            return value::iterator(std::move(out), keys ? "dict_keys" : "dict_values", true);
        });
    }
    if (name == "get") {
        return value::function("dict.get", [self](call_args & a) {
            const value k = a.get(0, "key");
            const value * v = self.entries().find(k);
            if (v) return *v;
            return a.has(1, "default") ? a.get(1, "default") : value::none();
        });
    }
    if (name == "copy") {
        return value::function("dict.copy", [self](call_args &) {
            return value::dict(std::make_shared<dict_data>(self.entries()));
        });
    }
    if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" ||
        name == "clear")
        return forbidden(self, name);
    if (name == "fromkeys") return not_implemented(self, name);
    return value();
}

value list_method(const value & self, const std::string & name) {
    if (name == "index" || name == "count") {
        const bool index = name == "index";
        return value::function("list." + name, [self, index](call_args & a) {
            const value x = a.get(0, "value");
            int64_t n = 0;
            for (size_t i = 0; i < self.items().size(); i++) {
                if (!equals(self.items()[i], x)) continue;
                if (index) return value(int64_t(i));
                n++;
            }
            if (index) throw failure(x.repr() + " is not in list");
            return value(n);
        });
    }
    if (name == "copy" && self.is_list()) {
        return value::function("list.copy",
                               [self](call_args &) { return value::list(self.items()); });
    }
    if (self.is_list() &&
        (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
         name == "remove" || name == "reverse" || name == "sort" || name == "clear"))
        return forbidden(self, name);
    return value();
}

} // namespace

// --- the interface -----------------------------------------------------------------

bool has_filter(std::string_view name) {
    return filters().count(name) != 0;
}
bool has_test(std::string_view name) {
    return tests().count(name) != 0;
}

namespace {

// What a builtin's result is when its inputs held caller data: a result
// that carries no caller ranges of its own was made from them in ways that
// do not keep byte positions (replace, upper, tojson, split, format), so all
// of it is the caller's.
value derived(const value & out, const value & subject, const call_args & args) {
    if (out.holds_caller_data()) return out;
    bool from_caller = subject.holds_caller_data();
    for (const value & v : args.pos) from_caller = from_caller || v.holds_caller_data();
    for (const auto & kv : args.kw) from_caller = from_caller || kv.second.holds_caller_data();
    return from_caller ? out.as_caller_data() : out;
}

// A str method whose result is marked as derived() marks a filter's.
value marking(value method, const value & self) {
    if (!method.is_function()) return method;
    const std::string name = method.fn().name;
    return value::function(
        name, [method, self](call_args & a) { return derived(method.fn().fn(a), self, a); });
}

} // namespace

value apply_filter(render_host & h, std::string_view name, const value & subject,
                   call_args & args) {
    const auto it = filters().find(name);
    if (it == filters().end()) unsupported("filter '" + std::string(name) + "' is not supported");
    const value out = it->second(h, subject, args);
    // Filters that give back their input's own values (or substrings that
    // iterate marks exactly) need no marking; marking them would turn a
    // template literal picked from a list into caller data.
    static const std::unordered_set<std::string_view> passing = {
        "default", "d",      "first",  "last",       "min",  "max",
        "list",    "select", "reject", "selectattr", "sort", "rejectattr",
        "unique",  "map",    "batch",  "dictsort",   "items"};
    if (passing.count(name)) return out;
    return derived(out, subject, args);
}

bool apply_test(render_host & h, std::string_view name, const value & subject, call_args & args) {
    const auto it = tests().find(name);
    if (it == tests().end()) unsupported("test '" + std::string(name) + "' is not supported");
    return it->second(h, subject, args);
}

list_data iterate(const value & v) {
    switch (v.type()) {
    case value::kind::undefined:
        return {};
    case value::kind::list:
    case value::kind::tuple:
        return v.items();
    case value::kind::dict: {
        list_data out;
        for (const auto & kv : v.entries().items) out.push_back(kv.first);
        return out;
    }
    case value::kind::string: {
        list_data out;
        for (const auto c : utf8_chars(v.str())) {
            const size_t at = size_t(c.data() - v.str().data());
            out.push_back(value(c).with_caller(v.caller_within(at, at + c.size())));
        }
        return out;
    }
    case value::kind::iterator:
        return v.consume();
    default:
        throw failure(std::string("'") + v.type_name() + "' object is not iterable");
    }
}

value get_attr(const value & obj, const std::string & name) {
    switch (obj.type()) {
    case value::kind::undefined:
        throw failure(obj.str());
    case value::kind::string:
        if (obj.is_markup()) {
            // Markup's methods escape their arguments; smol does not model that.
            return value::function(name, [name](call_args &) -> value {
                unsupported("method '" + name +
                            "' of a Markup string (from |safe or |escape) "
                            "is not supported");
            });
        }
        return marking(str_method(obj, name), obj);
    case value::kind::dict: {
        value m = dict_method(obj, name);
        if (!m.is_undefined()) return m;
        if (const value * v = obj.entries().find(name)) return *v;
        return value::undefined("'dict object' has no attribute '" + name + "'");
    }
    case value::kind::ns: {
        if (const value * v = obj.entries().find(name)) return *v;
        return value::undefined("'Namespace object' has no attribute '" + name + "'");
    }
    case value::kind::iterator:
        return value::undefined("'" + std::string(obj.type_name()) + " object' has no attribute '" +
                                name + "'");
    case value::kind::list:
    case value::kind::tuple: {
        value m = list_method(obj, name);
        if (!m.is_undefined()) return m;
        break;
    }
    default:
        break;
    }
    return value::undefined("'" + std::string(obj.type_name()) + " object' has no attribute '" +
                            name + "'");
}

value get_item(const value & obj, const value & key) {
    switch (obj.type()) {
    case value::kind::undefined:
        throw failure(obj.str());
    case value::kind::dict:
    case value::kind::ns:
        if (const value * v = obj.entries().find(key)) return *v;
        if (key.is_string()) {
            if (obj.is_dict()) {
                value m = dict_method(obj, key.str());
                if (!m.is_undefined()) return m;
            }
        }
        return value::undefined("'dict object' has no attribute " + key.repr());
    case value::kind::list:
    case value::kind::tuple:
    case value::kind::string: {
        if (key.is_int() || key.is_bool()) {
            int64_t i = key.as_int();
            if (obj.is_string()) {
                const auto chars = utf8_chars(obj.str());
                const int64_t n = int64_t(chars.size());
                if (i < 0) i += n;
                if (i >= 0 && i < n) {
                    const std::string_view c = chars[size_t(i)];
                    const size_t at = size_t(c.data() - obj.str().data());
                    return like(obj, std::string(c))
                        .with_caller(obj.caller_within(at, at + c.size()));
                }
            } else {
                const int64_t n = int64_t(obj.items().size());
                if (i < 0) i += n;
                if (i >= 0 && i < n) return obj.items()[size_t(i)];
            }
            return value::undefined(std::string(obj.type_name()) + " object has no element " +
                                    key.repr());
        }
        if (key.is_string()) return get_attr(obj, key.str());
        break;
    }
    default:
        break;
    }
    return value::undefined("'" + std::string(obj.type_name()) + " object' has no attribute " +
                            key.repr());
}

value global(render_host & h, std::string_view name) {
    if (name == "range") {
        return value::function("range", [&h](call_args & a) {
            if (!a.kw.empty()) throw failure("range() takes no keyword arguments");
            if (a.pos.empty() || a.pos.size() > 3) throw failure("range expected 1 to 3 arguments");
            int64_t start = 0, stop, step = 1;
            if (a.pos.size() == 1) {
                stop = int_arg(a.pos[0], "range");
            } else {
                start = int_arg(a.pos[0], "range");
                stop = int_arg(a.pos[1], "range");
                if (a.pos.size() == 3) step = int_arg(a.pos[2], "range");
            }
            if (step == 0) throw failure("range() arg 3 must not be zero");
            const long double count =
                std::max<long double>(0, std::ceil((long double)(stop - start) / step));
            // Jinja's sandbox caps range at 100,000 items (MAX_RANGE).
            if (count > 100000) {
                throw failure("range of " + std::to_string((long long)count) +
                              " items is too big: the sandbox allows at most 100000");
            }
            h.charge(size_t(count));
            list_data out;
            for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
            return value::list(std::move(out));
        });
    }
    if (name == "namespace" || name == "dict") {
        const bool ns = name == "namespace";
        return value::function(std::string(name), [ns, &h](call_args & a) {
            auto d = std::make_shared<dict_data>();
            for (const value & p : a.pos) {
                if (p.is_dict() || p.is_namespace()) {
                    for (const auto & kv : p.entries().items) d->set(kv.first, kv.second);
                } else {
                    for (const value & pair : iterate(p)) {
                        const list_data kv = iterate(pair);
                        if (kv.size() != 2 || !hashable(kv[0]))
                            throw failure("dict(): each element must be a (key, value) pair");
                        d->set(kv[0], kv[1]);
                    }
                }
            }
            for (const auto & kv : a.kw) d->set(kv.first, kv.second);
            if (!ns) return value::dict(d);
            h.keep_namespace(d);
            return value::make_namespace(d);
        });
    }
    if (name == "raise_exception") {
        return value::function("raise_exception", [](call_args & a) -> value {
            failure f(a.get(0, "message").to_str());
            f.raised = true;
            throw f;
        });
    }
    if (name == "strftime_now") {
        return value::function("strftime_now", [&h](call_args & a) {
            const std::string fmt = str_arg(a.get(0, "format"), "strftime_now");
            const std::time_t t = h.now();
            std::tm tm{};
            localtime_r(&t, &tm);
            char buf[512];
            const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
            if (n == 0 && !fmt.empty())
                throw failure("strftime_now: the format gives no text or too much");
            // A format from the caller's data passes its text through.
            return derived(value(std::string(buf, n)), value(), a);
        });
    }
    if (name == "joiner") {
        return value::function("joiner", [](call_args & a) {
            const std::string sep = a.has(0, "sep") ? a.get(0, "sep").to_str() : ", ";
            auto used = std::make_shared<bool>(false);
            return value::function("joiner", [sep, used](call_args &) {
                if (!*used) {
                    *used = true;
                    return value("");
                }
                return value(sep);
            });
        });
    }
    if (name == "cycler") {
        return value::function("cycler", [](call_args & a) {
            auto items = std::make_shared<list_data>(a.pos);
            auto pos = std::make_shared<size_t>(0);
            auto d = std::make_shared<dict_data>();
            d->set("next", value::function("cycler.next", [items, pos](call_args &) {
                       if (items->empty()) return value();
                       const value v = (*items)[*pos % items->size()];
                       ++*pos;
                       return v;
                   }));
            return value::make_namespace(d);
        });
    }
    return value();
}

} // namespace smol::jinja
