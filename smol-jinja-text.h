// smol-jinja-text.h - Python's str as chat templates use it: strings are
// UTF-8 bytes, but case, whitespace and positions are Python's, on code
// points. Case mapping covers ASCII, Latin-1, Latin Extended-A, Greek,
// Cyrillic, Armenian and fullwidth Latin; other scripts keep their case.

#ifndef SMOL_JINJA_TEXT_H
#define SMOL_JINJA_TEXT_H

#include "smol-jinja-value.h"

#include <cstdint>
#include <string>
#include <vector>

namespace smol::jinja {

uint32_t upper_cp(uint32_t c);
uint32_t lower_cp(uint32_t c);
bool is_cased_letter(uint32_t c);
bool is_alpha_cp(uint32_t c);

// str.upper(), str.lower(), str.capitalize(), str.title().
std::string upper(const std::string & s);
std::string lower(const std::string & s);
std::string capitalize(const std::string & s);
std::string py_title(const std::string & s);

// str.strip(chars) from the left, the right or both; chars null: whitespace.
std::string strip(const std::string & s, const std::string * chars, bool left, bool right);
// str.split() (whitespace), str.split(sep), str.rsplit(sep); maxsplit < 0: all.
std::vector<std::string> split_ws(const std::string & s, int64_t maxsplit);
std::vector<std::string> split_sep(const std::string & s, const std::string & sep,
                                   int64_t maxsplit);
std::vector<std::string> rsplit_sep(const std::string & s, const std::string & sep,
                                    int64_t maxsplit);
std::vector<std::string> splitlines(const std::string & s, bool keepends);
// str.replace(from, to, count); count < 0: all. Fails past `limit` bytes.
std::string replace_all(const std::string & s, const std::string & from, const std::string & to,
                        int64_t count, size_t limit);
// A byte offset as a code-point index (str.find's answer).
int64_t cp_index(const std::string & s, size_t byte);

// str.format(*args, **kwargs): {} {0} {name} {x.attr} {x[0]}, !r and !s,
// and [[fill]align][sign][0][width][.precision][type] specs.
std::string str_format(const std::string & fmt, const call_args & a);
// Python's printf-style `fmt % args` (a tuple: several arguments).
std::string percent_format(const std::string & fmt, const value & args);
// markupsafe's escape: & < > " ' as HTML entities.
std::string html_escape(const std::string & s);

} // namespace smol::jinja

#endif // SMOL_JINJA_TEXT_H
