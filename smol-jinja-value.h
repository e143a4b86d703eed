// smol-jinja-value.h - the values a chat template computes with: Python's
// None, bool, int, float, str, list, tuple and dict (insertion-ordered, str
// keys), Jinja's undefined, namespaces and callables; how Python prints them
// (str and repr), compares them and writes them as JSON (json.dumps), and a
// small JSON parser for the tools and tool calls callers pass as text.
// Strings carry the byte ranges that came from the caller's data, so that
// the tokenizer never reads a user's "<|im_start|>" as a control token.

#ifndef SMOL_JINJA_VALUE_H
#define SMOL_JINJA_VALUE_H

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace smol::jinja {

// What went wrong while rendering, without the line: the renderer adds the
// template's name and the line of the construct that failed. `unsupported`
// marks what smol does not implement (as opposed to a template error).
struct failure : std::runtime_error {
    bool unsupported = false;
    bool raised = false; // the template's own raise_exception
    explicit failure(const std::string & message, bool is_unsupported = false)
        : std::runtime_error(message), unsupported(is_unsupported) {}
};

class value;
struct dict_data;

// How deep lists and dicts may nest: deeper values would overflow the
// stack when printed, compared or freed.
constexpr uint32_t k_max_nesting = 1000;
struct call_args;
using list_data = std::vector<value>;
using native_fn = std::function<value(call_args &)>;

// Byte ranges [first, second) of a string that hold the caller's data (the
// messages, the tools) rather than the template's own text: sorted, disjoint
// and not touching. Only the template's text may become special tokens.
using byte_ranges = std::vector<std::pair<size_t, size_t>>;

// Appends [begin, end) to ranges that all end at or before begin.
void add_range(byte_ranges & ranges, size_t begin, size_t end);

struct function_data {
    std::string name; // for messages: "macro 'm'", "range"
    native_fn fn;
};

class value {
  public:
    enum class kind : uint8_t {
        undefined,
        none,
        boolean,
        integer,
        real,
        string,
        list,
        tuple,
        dict,
        ns, // namespace(): a dict whose attributes a template may assign
        function,
        // What Python gives as an iterator, not a list: a generator (map,
        // select, ...: always true, no len, iterated once) or a dict view
        // (d.items(): a len, true when not empty); never JSON.
        iterator,
    };

    value() = default; // undefined
    value(bool b) : k_(kind::boolean), i_(b) {}
    value(int v) : k_(kind::integer), i_(v) {}
    value(int64_t v) : k_(kind::integer), i_(v) {}
    value(double v) : k_(kind::real), d_(v) {}
    value(std::string s) : k_(kind::string), s_(std::move(s)) {}
    value(std::string_view s) : k_(kind::string), s_(s) {}
    value(const char * s) : k_(kind::string), s_(s) {}

    static value none();
    // An undefined value that remembers why, for the error its use raises
    // ("'messages' is undefined", "'dict object' has no attribute 'x'").
    static value undefined(std::string why);
    static value list(list_data items);
    static value tuple(list_data items);
    static value dict(); // empty
    static value dict(std::shared_ptr<dict_data> d);
    static value make_namespace(std::shared_ptr<dict_data> d);
    static value function(std::string name, native_fn fn);
    // A Markup string (|safe, |escape): `+` escapes the other operand.
    static value markup(std::string s);
    // python_type: "generator", "dict_items", ... as Python names it.
    static value iterator(list_data items, std::string python_type, bool is_view);

    kind type() const { return k_; }
    bool is_undefined() const { return k_ == kind::undefined; }
    bool is_none() const { return k_ == kind::none; }
    bool is_bool() const { return k_ == kind::boolean; }
    bool is_int() const { return k_ == kind::integer; }
    bool is_real() const { return k_ == kind::real; }
    bool is_number() const {
        return k_ == kind::integer || k_ == kind::real || k_ == kind::boolean;
    }
    bool is_string() const { return k_ == kind::string; }
    bool is_list() const { return k_ == kind::list; }
    bool is_tuple() const { return k_ == kind::tuple; }
    bool is_sequence() const { return k_ == kind::list || k_ == kind::tuple; }
    bool is_dict() const { return k_ == kind::dict; }
    bool is_namespace() const { return k_ == kind::ns; }
    bool is_function() const { return k_ == kind::function; }
    bool is_markup() const { return k_ == kind::string && markup_; }
    bool is_iterator() const { return k_ == kind::iterator; }
    bool is_view() const { return k_ == kind::iterator && i_ != 0; }
    // An iterator's items not yet consumed, at most `most`; a generator
    // gives each item once, as Python's do.
    list_data consume(size_t most = SIZE_MAX) const;

    bool as_bool() const { return i_ != 0; }
    int64_t as_int() const { return i_; } // integer or boolean
    double as_double() const { return k_ == kind::real ? d_ : double(i_); }
    const std::string & str() const { return s_; }    // string; undefined: why
    const list_data & items() const { return *l_; }   // list or tuple
    const dict_data & entries() const { return *m_; } // dict or namespace
    dict_data & mutable_entries() const { return *m_; }
    const function_data & fn() const { return *f_; }

    // Python's bool().
    bool truthy() const;
    // Python's str() and repr().
    std::string to_str() const;
    std::string repr() const;
    // The caller's byte ranges of a string; null when it has none.
    const byte_ranges * caller_ranges() const { return caller_.get(); }
    // The caller ranges inside bytes [begin, end) of a string, counted
    // from begin: what a substring keeps.
    byte_ranges caller_within(size_t begin, size_t end) const;
    // Whether any string in this value (items, keys, values) holds caller
    // data: what a conversion to text must then mark.
    bool holds_caller_data() const;
    // This string (Markup stays Markup) with `ranges` as its caller data.
    value with_caller(byte_ranges ranges) const;
    // This value with every string in it, keys too, wholly caller data: how
    // the render's variables are marked.
    value as_caller_data() const;

    // Levels of lists and dicts in this value (0 for a scalar).
    uint32_t depth() const;
    // The type's name as Python's error messages give it.
    const char * type_name() const;

  private:
    kind k_ = kind::undefined;
    int64_t i_ = 0;
    double d_ = 0;
    std::string s_;
    std::shared_ptr<const list_data> l_;
    std::shared_ptr<dict_data> m_;
    std::shared_ptr<const function_data> f_;
    std::shared_ptr<size_t> consumed_;          // a generator's position
    std::shared_ptr<const byte_ranges> caller_; // a string's; never empty
    uint32_t nest_ = 0;                         // a list's depth()
    bool markup_ = false;
    bool holds_caller_ = false; // a list's holds_caller_data()
};

// Text with its caller ranges, as a render or a string operation builds it.
struct marked_text {
    std::string text;
    byte_ranges caller;
    void append(std::string_view s, bool from_caller);
    // v as str() gives it: a string with its ranges; any other value wholly
    // caller data when it holds some (its repr prints the caller's strings).
    void append(const value & v);
    value to_value() const;
};

// A dict: keys in insertion order, as Python's. Keys are strings for
// everything smol builds; a template's dict literal may use any hashable
// value (an int, a tuple), matched with Python's equality (1 == 1.0 == True).
struct dict_data {
    std::vector<std::pair<value, value>> items;
    uint32_t nest = 0;   // the deepest value held (only grows)
    bool caller = false; // holds caller data (only grows; a namespace may hold itself)
    const value * find(std::string_view key) const;
    const value * find(const std::string & key) const { return find(std::string_view(key)); }
    const value * find(const char * key) const { return find(std::string_view(key)); }
    const value * find(const value & key) const;
    void set(const std::string & key, value v) { set(value(key), std::move(v)); }
    void set(const char * key, value v) { set(value(key), std::move(v)); }
    void set(const value & key, value v);
    // Appends a key known to be new.
    void push(value key, value v);
};

// Whether v may be a dict key (Python's hashable: None, bool, int, float,
// str, tuples of them).
bool hashable(const value & v);

struct call_args {
    std::vector<value> pos;
    std::vector<std::pair<std::string, value>> kw;
    // The argument `name` at position `index` or given by keyword; an
    // undefined value if neither.
    value get(size_t index, std::string_view name) const;
    bool has(size_t index, std::string_view name) const;
};

// Python's ==, and the ordering of <: numbers with numbers, strings with
// strings, lists element by element; anything else fails as Python does.
bool equals(const value & a, const value & b);
int compare(const value & a, const value & b);

// Python's repr(float): the shortest text that reads back to the same
// double, in Python's notation (1.0, 1e-05, 1e+16, inf).
std::string float_repr(double d);
std::string int_str(int64_t v);

// json.dumps(v, ensure_ascii=False, indent=..., separators=..., sort_keys=...)
// with Python's defaults: separators ', ' and ': ' (',' between items when
// indented). indent < 0 means None; indent_text, when not empty, replaces
// the spaces of each level (json.dumps takes a str indent too).
struct json_style {
    int indent = -1;
    std::string indent_text;
    std::string item_sep = ", ";
    std::string key_sep = ": ";
    bool sort_keys = false;
    bool ensure_ascii = false; // non-ASCII as \uXXXX escapes
};
std::string to_json(const value & v, const json_style & style = {});

// Parses JSON text (RFC 8259) into values: objects become dicts in the
// text's order, integers that fit int64 become int, other numbers float.
// Throws failure naming the offset of the first error.
value parse_json(std::string_view text);

// UTF-8 helpers: strings are bytes, but Python counts and slices code points.
// A byte that does not start a valid sequence counts as one code point.
size_t utf8_next(std::string_view s, size_t i);
uint32_t utf8_decode(std::string_view s, size_t i);
size_t utf8_length(std::string_view s);
std::vector<std::string_view> utf8_chars(std::string_view s);
void utf8_append(std::string & out, uint32_t cp);
bool is_py_space(uint32_t cp);

} // namespace smol::jinja

#endif // SMOL_JINJA_VALUE_H
