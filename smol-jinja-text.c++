// smol-jinja-text.c++ - Python's str for chat templates (smol-jinja-text.h):
// case mapping, whitespace, strip/split/splitlines/replace, str.format and
// printf-style %, and markupsafe's escape.

#include "smol-jinja-text.h"

#include "smol-jinja-builtins.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace smol::jinja {

namespace {

[[noreturn]] void unsupported(const std::string & what) {
    throw failure(what, true);
}

} // namespace

// --- case mapping ------------------------------------------------------------------

// Simple case pairs of the scripts chat templates and their users write:
// ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic, Armenian, fullwidth.
uint32_t upper_cp(uint32_t c) {
    if (c < 0x80) return c >= 'a' && c <= 'z' ? c - 32 : c;
    if (c == 0xb5) return 0x39c;
    if ((c >= 0xe0 && c <= 0xfe && c != 0xf7)) return c - 32;
    if (c == 0xff) return 0x178;
    if (c >= 0x100 && c <= 0x17f) {
        if (c == 0x131) return 'I';
        if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) return c % 2 == 0 ? c - 1 : c;
        if (c == 0x17f) return 'S';
        if (c != 0x138 && c != 0x149) return c % 2 == 1 ? c - 1 : c;
        return c;
    }
    if (c >= 0x3b1 && c <= 0x3c9) return c == 0x3c2 ? 0x3a3 : c - 32;
    if (c == 0x3ac) return 0x386;
    if (c >= 0x3ad && c <= 0x3af) return c - 37;
    if (c == 0x3cc) return 0x38c;
    if (c == 0x3cd || c == 0x3ce) return c - 63;
    if (c >= 0x430 && c <= 0x44f) return c - 32;
    if (c >= 0x450 && c <= 0x45f) return c - 80;
    if ((c >= 0x460 && c <= 0x481) || (c >= 0x48a && c <= 0x4bf)) return c % 2 == 1 ? c - 1 : c;
    if (c >= 0x561 && c <= 0x586) return c - 48;
    if (c >= 0xff41 && c <= 0xff5a) return c - 32;
    return c;
}

uint32_t lower_cp(uint32_t c) {
    if (c < 0x80) return c >= 'A' && c <= 'Z' ? c + 32 : c;
    if ((c >= 0xc0 && c <= 0xde && c != 0xd7)) return c + 32;
    if (c == 0x178) return 0xff;
    if (c >= 0x100 && c <= 0x17f) {
        if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) return c % 2 == 1 ? c + 1 : c;
        if (c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17f)
            return c % 2 == 0 ? c + 1 : c;
        return c;
    }
    if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 32;
    if (c == 0x386) return 0x3ac;
    if (c >= 0x388 && c <= 0x38a) return c + 37;
    if (c == 0x38c) return 0x3cc;
    if (c == 0x38e || c == 0x38f) return c + 63;
    if (c >= 0x410 && c <= 0x42f) return c + 32;
    if (c >= 0x400 && c <= 0x40f) return c + 80;
    if ((c >= 0x460 && c <= 0x481) || (c >= 0x48a && c <= 0x4bf)) return c % 2 == 0 ? c + 1 : c;
    if (c >= 0x531 && c <= 0x556) return c + 48;
    if (c >= 0xff21 && c <= 0xff3a) return c + 32;
    return c;
}

bool is_cased_letter(uint32_t c) {
    return upper_cp(c) != c || lower_cp(c) != c || c == 0xdf;
}
bool is_alpha_cp(uint32_t c) {
    return (c < 0x80 && std::isalpha(int(c))) || (c >= 0x80 && (is_cased_letter(c) || c >= 0x4e00));
}

static std::string map_case(const std::string & s, bool upper) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size(); i = utf8_next(s, i)) {
        const uint32_t c = utf8_decode(s, i);
        if (c < 0x80) {
            out += char(upper ? upper_cp(c) : lower_cp(c));
        } else if (upper && c == 0xdf) {
            out += "SS";
        } else if (!upper && c == 0x130) {
            out += "i\xcc\x87";
        } else {
            utf8_append(out, upper ? upper_cp(c) : lower_cp(c));
        }
    }
    return out;
}

std::string upper(const std::string & s) {
    return map_case(s, true);
}
std::string lower(const std::string & s) {
    return map_case(s, false);
}

// str.capitalize(): the first character upper case, the rest lower.
std::string capitalize(const std::string & s) {
    if (s.empty()) return s;
    const size_t j = utf8_next(s, 0);
    return upper(s.substr(0, j)) + lower(s.substr(j));
}

// str.title(): a cased letter after an uncased character starts a word.
std::string py_title(const std::string & s) {
    std::string out;
    bool prev_cased = false;
    for (size_t i = 0; i < s.size(); i = utf8_next(s, i)) {
        const uint32_t c = utf8_decode(s, i);
        const std::string ch = s.substr(i, utf8_next(s, i) - i);
        out += prev_cased ? lower(ch) : upper(ch);
        prev_cased = is_cased_letter(c);
    }
    return out;
}

// --- strings -----------------------------------------------------------------------

static bool in_chars(uint32_t c, const std::string * chars) {
    if (!chars) return is_py_space(c);
    for (size_t i = 0; i < chars->size(); i = utf8_next(*chars, i)) {
        if (utf8_decode(*chars, i) == c) return true;
    }
    return false;
}

std::string strip(const std::string & s, const std::string * chars, bool left, bool right) {
    size_t b = 0, e = s.size();
    if (left) {
        while (b < e && in_chars(utf8_decode(s, b), chars)) b = utf8_next(s, b);
    }
    if (right) {
        size_t keep = b;
        for (size_t i = b; i < e; i = utf8_next(s, i)) {
            if (!in_chars(utf8_decode(s, i), chars)) keep = utf8_next(s, i);
        }
        e = keep;
    }
    return s.substr(b, e - b);
}

std::vector<std::string> split_ws(const std::string & s, int64_t maxsplit) {
    std::vector<std::string> out;
    size_t i = 0;
    while (true) {
        while (i < s.size() && is_py_space(utf8_decode(s, i))) i = utf8_next(s, i);
        if (i >= s.size()) break;
        if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
            std::string rest = s.substr(i);
            out.push_back(strip(rest, nullptr, false, true));
            break;
        }
        size_t j = i;
        while (j < s.size() && !is_py_space(utf8_decode(s, j))) j = utf8_next(s, j);
        out.push_back(s.substr(i, j - i));
        i = j;
    }
    return out;
}

std::vector<std::string> split_sep(const std::string & s, const std::string & sep,
                                   int64_t maxsplit) {
    if (sep.empty()) throw failure("empty separator");
    std::vector<std::string> out;
    size_t i = 0;
    while (true) {
        const size_t j = s.find(sep, i);
        if (j == std::string::npos || (maxsplit >= 0 && int64_t(out.size()) == maxsplit)) break;
        out.push_back(s.substr(i, j - i));
        i = j + sep.size();
    }
    out.push_back(s.substr(i));
    return out;
}

std::vector<std::string> rsplit_sep(const std::string & s, const std::string & sep,
                                    int64_t maxsplit) {
    if (maxsplit < 0) return split_sep(s, sep, -1);
    if (sep.empty()) throw failure("empty separator");
    std::vector<std::string> out;
    size_t end = s.size();
    while (int64_t(out.size()) < maxsplit) {
        if (end < sep.size()) break;
        const size_t j = s.rfind(sep, end - sep.size());
        if (j == std::string::npos) break;
        out.push_back(s.substr(j + sep.size(), end - j - sep.size()));
        end = j;
    }
    out.push_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
}

// str.splitlines(): every line boundary Python knows.
std::vector<std::string> splitlines(const std::string & s, bool keepends) {
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t i = 0; i < s.size();) {
        const uint32_t c = utf8_decode(s, i);
        size_t j = utf8_next(s, i);
        const bool nl = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c ||
                        c == 0x1d || c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
        if (!nl) {
            i = j;
            continue;
        }
        if (c == '\r' && j < s.size() && s[j] == '\n') j++;
        out.push_back(s.substr(start, (keepends ? j : i) - start));
        start = i = j;
    }
    if (start < s.size()) out.push_back(s.substr(start));
    return out;
}

std::string replace_all(const std::string & s, const std::string & from, const std::string & to,
                        int64_t count, size_t limit) {
    std::string out;
    if (from.empty()) {
        // Python inserts `to` around every character.
        int64_t n = 0;
        for (size_t i = 0; i <= s.size(); i = i < s.size() ? utf8_next(s, i) : i + 1) {
            if (count < 0 || n < count) {
                out += to;
                n++;
            }
            if (i < s.size()) out.append(s, i, utf8_next(s, i) - i);
        }
        return out;
    }
    size_t i = 0;
    int64_t n = 0;
    while (count < 0 || n < count) {
        const size_t j = s.find(from, i);
        if (j == std::string::npos) break;
        out.append(s, i, j - i);
        out += to;
        if (out.size() > limit) throw failure("replace: the string passed the size limit");
        i = j + from.size();
        n++;
    }
    out.append(s, i, std::string::npos);
    return out;
}

// A code-point index into a byte offset (Python's str.find and friends).
int64_t cp_index(const std::string & s, size_t byte) {
    return int64_t(utf8_length(std::string_view(s).substr(0, byte)));
}

static std::string format_spec(const value & v, const std::string & spec) {
    if (spec.empty()) return v.to_str();
    size_t i = 0;
    char fill = ' ', align = 0;
    if (spec.size() >= 2 && std::strchr("<>^=", spec[1])) {
        fill = spec[0];
        align = spec[1];
        i = 2;
    } else if (std::strchr("<>^=", spec[0])) {
        align = spec[0];
        i = 1;
    }
    std::string sign;
    if (i < spec.size() && std::strchr("+- ", spec[i])) sign = spec[i++];
    if (i < spec.size() && spec[i] == '0' && !align) {
        fill = '0';
        align = '=';
        i++;
    }
    size_t width = 0;
    while (i < spec.size() && std::isdigit(uint8_t(spec[i])))
        width = width * 10 + size_t(spec[i++] - '0');
    int prec = -1;
    if (i < spec.size() && spec[i] == '.') {
        prec = 0;
        i++;
        while (i < spec.size() && std::isdigit(uint8_t(spec[i])))
            prec = prec * 10 + (spec[i++] - '0');
    }
    char type = i < spec.size() ? spec[i++] : 0;
    if (i != spec.size()) unsupported("format spec '" + spec + "' is not supported");
    std::string body;
    char buf[512];
    if (type == 'd' || (type == 0 && (v.is_int() || v.is_bool()) && prec < 0)) {
        if (!v.is_int() && !v.is_bool())
            throw failure("Unknown format code 'd' for " + std::string(v.type_name()));
        std::snprintf(buf, sizeof buf, ("%" + sign + "lld").c_str(), (long long)v.as_int());
        body = buf;
    } else if (type == 'f' || type == 'F' || type == 'e' || type == 'E' || type == '%' ||
               (type == 'g' && v.is_number())) {
        if (!v.is_number())
            throw failure("Unknown format code '" + std::string(1, type) + "' for " +
                          v.type_name());
        const double d = v.as_double() * (type == '%' ? 100 : 1);
        const char t = type == '%' ? 'f' : type;
        std::snprintf(buf, sizeof buf,
                      ("%" + sign + "." + std::to_string(prec < 0 ? 6 : prec) + t).c_str(), d);
        body = buf;
        if (type == '%') body += '%';
    } else if (type == 0 || type == 's') {
        if (type == 's' && !v.is_string())
            throw failure("Unknown format code 's' for " + std::string(v.type_name()));
        body = v.is_real() && type == 0 ? v.to_str() : v.to_str();
        if (prec >= 0) {
            const auto chars = utf8_chars(body);
            std::string cut;
            for (size_t k = 0; k < chars.size() && k < size_t(prec); k++) cut += chars[k];
            body = cut;
        }
    } else {
        unsupported("format spec '" + spec + "' is not supported");
    }
    const size_t len = utf8_length(body);
    if (len >= width) return body;
    const size_t pad = width - len;
    if (!align) align = v.is_number() ? '>' : '<';
    const std::string f(1, fill);
    std::string padding;
    for (size_t k = 0; k < pad; k++) padding += f;
    if (align == '<') return body + padding;
    if (align == '>') return padding + body;
    if (align == '=') {
        if (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' '))
            return body.substr(0, 1) + padding + body.substr(1);
        return padding + body;
    }
    std::string left, right;
    for (size_t k = 0; k < pad / 2; k++) left += f;
    for (size_t k = 0; k < pad - pad / 2; k++) right += f;
    return left + body + right;
}

std::string str_format(const std::string & fmt, const call_args & a) {
    std::string out;
    size_t auto_index = 0;
    for (size_t i = 0; i < fmt.size(); i++) {
        const char c = fmt[i];
        if (c == '}') {
            if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
                out += '}';
                i++;
                continue;
            }
            throw failure("Single '}' encountered in format string");
        }
        if (c != '{') {
            out += c;
            continue;
        }
        if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
            out += '{';
            i++;
            continue;
        }
        const size_t close = fmt.find('}', i);
        if (close == std::string::npos) throw failure("Single '{' encountered in format string");
        std::string field = fmt.substr(i + 1, close - i - 1);
        i = close;
        std::string spec, conv;
        const size_t colon = field.find(':');
        if (colon != std::string::npos) {
            spec = field.substr(colon + 1);
            field.resize(colon);
        }
        const size_t bang = field.find('!');
        if (bang != std::string::npos) {
            conv = field.substr(bang + 1);
            field.resize(bang);
        }
        // The first part of the field names the argument; .attr and [key] follow.
        size_t end = field.find_first_of(".[");
        const std::string head = field.substr(0, end);
        value v;
        if (head.empty()) {
            if (auto_index >= a.pos.size())
                throw failure("Replacement index " + std::to_string(auto_index) +
                              " out of range for positional args tuple");
            v = a.pos[auto_index++];
        } else if (std::all_of(head.begin(), head.end(),
                               [](char d) { return std::isdigit(uint8_t(d)); })) {
            const size_t k = size_t(std::stoul(head));
            if (k >= a.pos.size())
                throw failure("Replacement index " + head +
                              " out of range for positional args tuple");
            v = a.pos[k];
        } else {
            bool found = false;
            for (const auto & kv : a.kw) {
                if (kv.first == head) {
                    v = kv.second;
                    found = true;
                }
            }
            if (!found) throw failure("'" + head + "'");
        }
        while (end != std::string::npos && end < field.size()) {
            if (field[end] == '.') {
                const size_t next = field.find_first_of(".[", end + 1);
                v = get_attr(v, field.substr(end + 1, next - end - 1));
                end = next;
            } else {
                const size_t rb = field.find(']', end);
                if (rb == std::string::npos) throw failure("Missing ']' in format string");
                const std::string key = field.substr(end + 1, rb - end - 1);
                const bool num = !key.empty() && std::all_of(key.begin(), key.end(), [](char d) {
                    return std::isdigit(uint8_t(d));
                });
                v = get_item(v, num ? value(int64_t(std::stoll(key))) : value(key));
                end = rb + 1;
            }
        }
        if (conv == "r") {
            v = value(v.repr());
        } else if (conv == "s") {
            v = value(v.to_str());
        } else if (!conv.empty()) {
            unsupported("format conversion '!" + conv + "' is not supported");
        }
        out += format_spec(v, spec);
    }
    return out;
}

std::string percent_format(const std::string & fmt, const value & args) {
    list_data items = args.is_tuple() ? args.items() : list_data{args};
    size_t next = 0;
    std::string out;
    for (size_t i = 0; i < fmt.size(); i++) {
        if (fmt[i] != '%') {
            out += fmt[i];
            continue;
        }
        if (++i >= fmt.size()) throw failure("incomplete format");
        if (fmt[i] == '%') {
            out += '%';
            continue;
        }
        std::string spec = "%";
        while (i < fmt.size() && std::strchr("-+ 0#", fmt[i])) spec += fmt[i++];
        while (i < fmt.size() && std::isdigit(uint8_t(fmt[i]))) spec += fmt[i++];
        if (i < fmt.size() && fmt[i] == '.') {
            spec += fmt[i++];
            while (i < fmt.size() && std::isdigit(uint8_t(fmt[i]))) spec += fmt[i++];
        }
        if (i >= fmt.size()) throw failure("incomplete format");
        const char c = fmt[i];
        if (next >= items.size()) throw failure("not enough arguments for format string");
        const value & v = items[next++];
        char buf[512];
        if (c == 's' || c == 'r') {
            const std::string s = c == 's' ? v.to_str() : v.repr();
            spec += 's';
            std::snprintf(buf, sizeof buf, spec.c_str(), "");
            if (spec == "%s") {
                out += s;
            } else {
                std::string w = spec;
                std::snprintf(buf, sizeof buf, w.c_str(), s.c_str());
                out += buf;
            }
        } else if (c == 'd' || c == 'i' || c == 'x' || c == 'X' || c == 'o') {
            if (!v.is_number()) throw failure("%d format: a real number is required");
            spec += "ll";
            spec += c == 'i' ? 'd' : c;
            std::snprintf(buf, sizeof buf, spec.c_str(),
                          (long long)(v.is_real() ? int64_t(v.as_double()) : v.as_int()));
            out += buf;
        } else if (std::strchr("feEgG", c)) {
            if (!v.is_number())
                throw failure("must be real number, not " + std::string(v.type_name()));
            spec += c;
            std::snprintf(buf, sizeof buf, spec.c_str(), v.as_double());
            out += buf;
        } else {
            throw failure(std::string("format conversion '%") + c + "' is not supported", true);
        }
    }
    if (next < items.size() && args.is_tuple())
        throw failure("not all arguments converted during string formatting");
    return out;
}

std::string html_escape(const std::string & s) {
    std::string out;
    for (const char c : s) {
        switch (c) {
        case '&':
            out += "&amp;";
            break;
        case '<':
            out += "&lt;";
            break;
        case '>':
            out += "&gt;";
            break;
        case '"':
            out += "&#34;";
            break;
        case '\'':
            out += "&#39;";
            break;
        default:
            out += c;
        }
    }
    return out;
}

} // namespace smol::jinja
