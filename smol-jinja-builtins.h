// smol-jinja-builtins.h - what Jinja2 gives a template beside its syntax:
// filters, tests, the methods of str, list and dict, attribute and item
// lookup, and the globals HF adds. Shared by the interpreter
// (smol-jinja.c++) and their home (smol-jinja-builtins.c++).

#ifndef SMOL_JINJA_BUILTINS_H
#define SMOL_JINJA_BUILTINS_H

#include "smol-jinja-value.h"

#include <ctime>
#include <string_view>

namespace smol::jinja {

// What a builtin needs from the render it runs in.
struct render_host {
    virtual ~render_host() = default;
    // Calls a template callable (a macro, a global, a method).
    virtual value call(const value & fn, call_args & args) = 0;
    // Counts work against the step budget (n items of a filter's loop).
    virtual void charge(size_t n) = 0;
    virtual std::time_t now() const = 0;
    virtual size_t max_output() const = 0;
    // A namespace made during the render: emptied at its end, since a
    // namespace may hold itself (ns.self = ns) and would never be freed.
    virtual void keep_namespace(const std::shared_ptr<dict_data> & d) = 0;
};

bool has_filter(std::string_view name);
bool has_test(std::string_view name);
value apply_filter(render_host & h, std::string_view name, const value & subject, call_args & args);
bool apply_test(render_host & h, std::string_view name, const value & subject, call_args & args);

// Jinja's environment.getattr (x.name: the attribute, then the item) and
// getitem (x[key]: the item, then the attribute). Of an undefined value both
// fail; a missing one is undefined.
value get_attr(const value & obj, const std::string & name);
value get_item(const value & obj, const value & key);

// The global of that name, or undefined.
value global(render_host & h, std::string_view name);

// A Python iteration over v (list, tuple, dict keys, str code points,
// undefined: nothing); anything else fails as Python does.
list_data iterate(const value & v);

} // namespace smol::jinja

#endif // SMOL_JINJA_BUILTINS_H
