// smol-jinja.c++ - the chat-template interpreter (smol-jinja.h): the
// tree-walking renderer, its scopes, step budget and depth limit. The
// parser lives in smol-jinja-parse.c++; filters, tests, methods and
// globals in smol-jinja-builtins.c++.

#include "smol-jinja.h"

#include "smol-error.h"
#include "smol-jinja-builtins.h"
#include "smol-jinja-text.h"
#include "smol-jinja-tree.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace smol::jinja {

namespace {

// --- the renderer ------------------------------------------------------------------

struct frame;
using frame_ptr = std::shared_ptr<frame>;

struct frame {
    std::vector<std::pair<std::string, value>> vars;
    frame_ptr parent;
    const dict_data * root = nullptr; // the caller's variables, below every frame

    explicit frame(frame_ptr p) : parent(std::move(p)) {}
    void set(const std::string & name, value v) {
        for (auto & kv : vars) {
            if (kv.first == name) {
                kv.second = std::move(v);
                return;
            }
        }
        vars.emplace_back(name, std::move(v));
    }
};

enum class flow : uint8_t { normal, break_, continue_ };

class renderer final : public render_host {
  public:
    explicit renderer(const render_options & o) : o_(o) {}
    // A macro holds the frame it was defined in, which holds the macro; a
    // namespace may hold itself. Emptying them frees what the render made.
    ~renderer() override {
        for (const auto & f : macro_frames_) f->vars.clear();
        for (const auto & d : namespaces_) d->items.clear();
    }

    int line = 0;
    // What is running, for the budget's and the depth limit's messages.
    std::string construct = "the template";

    value call(const value & fn, call_args & args) override {
        if (fn.is_function()) return fn.fn().fn(args);
        if (fn.is_undefined()) throw failure(fn.str());
        throw failure(std::string("'") + fn.type_name() + "' object is not callable");
    }
    void charge(size_t n) override {
        steps_ += int64_t(n);
        if (steps_ > o_.max_steps) {
            throw failure("rendering stopped after " + std::to_string(o_.max_steps) +
                          " steps, in " + construct + " (a loop too long or without end?)");
        }
    }
    std::time_t now() const override { return o_.now ? o_.now : std::time(nullptr); }
    size_t max_output() const override { return o_.max_output; }
    void keep_namespace(const std::shared_ptr<dict_data> & d) override { namespaces_.push_back(d); }

    struct deeper {
        renderer & r;
        explicit deeper(renderer & rr) : r(rr) {
            if (++r.depth_ > r.o_.max_depth) {
                throw failure("evaluation nested more than " + std::to_string(r.o_.max_depth) +
                              " levels deep, in " + r.construct +
                              " (a macro calling itself without end?)");
            }
        }
        ~deeper() { --r.depth_; }
    };

    flow exec(const node_body & b, const frame_ptr & f, marked_text & out) {
        for (const auto & s : b.stmts) {
            const flow fl = exec_stmt(*s, f, out);
            if (fl != flow::normal) return fl;
        }
        return flow::normal;
    }

    value lookup(const std::string & n, const frame_ptr & f) {
        for (frame * x = f.get(); x; x = x->parent.get()) {
            for (const auto & kv : x->vars) {
                if (kv.first == n) return kv.second;
            }
            if (x->root) {
                if (const value * v = x->root->find(n)) return *v;
            }
        }
        value g = global(*this, n);
        if (!g.is_undefined()) return g;
        return value::undefined("'" + n + "' is undefined");
    }

    value eval(const expr & e, const frame_ptr & f);

  private:
    const render_options & o_;
    std::vector<frame_ptr> macro_frames_;
    std::vector<std::shared_ptr<dict_data>> namespaces_;
    int64_t steps_ = 0;
    int depth_ = 0;

    void grow(const marked_text & out) const {
        if (out.text.size() > o_.max_output) {
            throw failure("the rendered text passed the limit of " + std::to_string(o_.max_output) +
                          " bytes");
        }
    }

    flow exec_stmt(const stmt & s, const frame_ptr & f, marked_text & out);
    flow exec_for(const stmt & s, const frame_ptr & f, marked_text & out);
    void assign(const stmt & s, const frame_ptr & f, value v);
    value make_macro(const stmt & s, const frame_ptr & f, const std::string & name);
    value eval_call(const expr & e, const frame_ptr & f);
    value eval_binop(const expr & e, const frame_ptr & f);
    value eval_compare(const expr & e, const frame_ptr & f);
    value eval_slice(const expr & e, const frame_ptr & f);
    void eval_args(const expr & e, size_t from, const frame_ptr & f, call_args & a) {
        const size_t n_kw = e.kw.size();
        for (size_t i = from; i < e.kids.size(); i++) {
            value v = eval(*e.kids[i], f);
            if (i + n_kw >= e.kids.size()) {
                a.kw.emplace_back(e.kw[i + n_kw - e.kids.size()], std::move(v));
            } else {
                a.pos.push_back(std::move(v));
            }
        }
    }
    value apply_filters(const expr & chain, value subject, const frame_ptr & f) {
        // A filter chain of a block: the innermost filter takes the text.
        if (!chain.kids.empty() && chain.kids[0])
            subject = apply_filters(*chain.kids[0], subject, f);
        call_args a;
        eval_args(chain, 1, f, a);
        line = chain.line;
        return apply_filter(*this, chain.name, subject, a);
    }
};

// Python's `in`.
bool contains(const value & container, const value & item) {
    if (container.is_string()) {
        if (!item.is_string()) {
            if (item.is_undefined()) throw failure(item.str());
            throw failure(std::string("'in <string>' requires string as left operand, not ") +
                          item.type_name());
        }
        return container.str().find(item.str()) != std::string::npos;
    }
    if (container.is_sequence()) {
        for (const value & x : container.items()) {
            if (equals(x, item)) return true;
        }
        return false;
    }
    if (container.is_dict() || container.is_namespace()) {
        if (!hashable(item))
            throw failure(std::string("unhashable type: '") + item.type_name() + "'");
        return container.entries().find(item) != nullptr;
    }
    if (container.is_iterator()) {
        for (const value & x : iterate(container)) {
            if (equals(x, item)) return true;
        }
        return false;
    }
    if (container.is_undefined()) return false;
    throw failure(std::string("argument of type '") + container.type_name() + "' is not iterable");
}

value renderer::eval(const expr & e, const frame_ptr & f) {
    deeper d(*this);
    charge(1);
    line = e.line;
    switch (e.k) {
    case ex::literal:
        return e.lit;
    case ex::name:
        return lookup(e.name, f);
    case ex::list:
    case ex::tuple: {
        list_data items;
        items.reserve(e.kids.size());
        for (const auto & k : e.kids) items.push_back(eval(*k, f));
        return e.k == ex::list ? value::list(std::move(items)) : value::tuple(std::move(items));
    }
    case ex::dict: {
        auto d = std::make_shared<dict_data>();
        for (size_t i = 0; i + 1 < e.kids.size(); i += 2) {
            const value k = eval(*e.kids[i], f);
            if (!hashable(k))
                throw failure(std::string("unhashable type: '") + k.type_name() + "'");
            d->set(k, eval(*e.kids[i + 1], f));
        }
        return value::dict(d);
    }
    case ex::attr: {
        const value obj = eval(*e.kids[0], f);
        line = e.line;
        return get_attr(obj, e.name);
    }
    case ex::item: {
        const value obj = eval(*e.kids[0], f);
        const value key = eval(*e.kids[1], f);
        line = e.line;
        return get_item(obj, key);
    }
    case ex::slice:
        return eval_slice(e, f);
    case ex::call:
        return eval_call(e, f);
    case ex::filter: {
        const value subject = eval(*e.kids[0], f);
        call_args a;
        eval_args(e, 1, f, a);
        line = e.line;
        return apply_filter(*this, e.name, subject, a);
    }
    case ex::test: {
        const value subject = eval(*e.kids[0], f);
        call_args a;
        eval_args(e, 1, f, a);
        line = e.line;
        return value(apply_test(*this, e.name, subject, a) != e.negate);
    }
    case ex::not_:
        return value(!eval(*e.kids[0], f).truthy());
    case ex::neg:
    case ex::pos: {
        const value v = eval(*e.kids[0], f);
        line = e.line;
        if (v.is_undefined()) throw failure(v.str());
        if (!v.is_number()) {
            throw failure(std::string("bad operand type for unary ") +
                          (e.k == ex::neg ? "-" : "+") + ": '" + v.type_name() + "'");
        }
        if (e.k == ex::pos) return v.is_bool() ? value(v.as_int()) : v;
        if (v.is_real()) return value(-v.as_double());
        if (v.as_int() == INT64_MIN) throw failure("integer overflow", true);
        return value(-v.as_int());
    }
    case ex::binop:
        return eval_binop(e, f);
    case ex::compare:
        return eval_compare(e, f);
    case ex::and_: {
        value a = eval(*e.kids[0], f);
        if (!a.truthy()) return a;
        return eval(*e.kids[1], f);
    }
    case ex::or_: {
        value a = eval(*e.kids[0], f);
        if (a.truthy()) return a;
        return eval(*e.kids[1], f);
    }
    case ex::cond: {
        if (eval(*e.kids[1], f).truthy()) return eval(*e.kids[0], f);
        if (e.kids[2]) return eval(*e.kids[2], f);
        return value::undefined("the conditional expression had no else branch");
    }
    }
    return value();
}

value renderer::eval_slice(const expr & e, const frame_ptr & f) {
    const value obj = eval(*e.kids[0], f);
    int64_t bound[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int i = 0; i < 3; i++) {
        if (!e.kids[size_t(i) + 1]) continue;
        const value v = eval(*e.kids[size_t(i) + 1], f);
        if (v.is_none()) continue;
        if (!v.is_int() && !v.is_bool()) {
            throw failure("slice indices must be integers or None");
        }
        bound[i] = v.as_int();
        given[i] = true;
    }
    line = e.line;
    if (obj.is_undefined()) throw failure(obj.str());
    if (bound[2] == 0) throw failure("slice step cannot be zero");
    std::vector<std::string_view> chars;
    size_t n = 0;
    if (obj.is_string()) {
        chars = utf8_chars(obj.str());
        n = chars.size();
    } else if (obj.is_sequence()) {
        n = obj.items().size();
    } else {
        return value::undefined(std::string("'") + obj.type_name() +
                                "' object is not subscriptable");
    }
    const int64_t len = int64_t(n), step = bound[2];
    const auto clamp = [&](int64_t v, bool is_given, int64_t dflt) {
        if (!is_given) return dflt;
        if (v < 0) v += len;
        if (step > 0) return std::clamp<int64_t>(v, 0, len);
        return std::clamp<int64_t>(v, -1, len - 1);
    };
    const int64_t start = clamp(bound[0], given[0], step > 0 ? 0 : len - 1);
    const int64_t stop = clamp(bound[1], given[1], step > 0 ? len : -1);
    std::vector<size_t> idx;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) idx.push_back(size_t(i));
    charge(idx.size());
    if (obj.is_string()) {
        std::string out;
        byte_ranges caller;
        for (size_t i : idx) {
            const size_t at = size_t(chars[i].data() - obj.str().data());
            for (const auto & [b, e] : obj.caller_within(at, at + chars[i].size()))
                add_range(caller, out.size() + b, out.size() + e);
            out += chars[i];
        }
        const value v = obj.is_markup() ? value::markup(std::move(out)) : value(std::move(out));
        return v.with_caller(std::move(caller));
    }
    list_data out;
    for (size_t i : idx) out.push_back(obj.items()[i]);
    return obj.is_list() ? value::list(std::move(out)) : value::tuple(std::move(out));
}

value renderer::eval_call(const expr & e, const frame_ptr & f) {
    const value fn = eval(*e.kids[0], f);
    call_args a;
    eval_args(e, 1, f, a);
    line = e.line;
    if (fn.is_undefined() && e.kids[0]->k == ex::name) {
        throw failure("'" + e.kids[0]->name + "' is undefined: smol's chat templates know " +
                      "the functions range, namespace, dict, raise_exception, strftime_now, " +
                      "joiner and cycler");
    }
    return call(fn, a);
}

[[noreturn]] void unsupported_markup(const char * op) {
    throw failure(std::string("'") + op + "' on a Markup string (from |safe or |escape) is not " +
                      "supported",
                  true);
}

void overflow(bool happened) {
    if (happened) throw failure("integer overflow (smol's integers are 64-bit)", true);
}

value renderer::eval_binop(const expr & e, const frame_ptr & f) {
    const value a = eval(*e.kids[0], f);
    const value b = eval(*e.kids[1], f);
    line = e.line;
    if (e.op == bop::concat) {
        marked_text s;
        s.append(a);
        s.append(b);
        if (s.text.size() > o_.max_output) {
            throw failure("a string passed the limit of " + std::to_string(o_.max_output) +
                          " bytes");
        }
        return s.to_value();
    }
    // What a string operation that does not keep byte positions gives: all
    // of it the caller's when any input held the caller's data.
    const auto derived = [&](value v) {
        return a.holds_caller_data() || b.holds_caller_data() ? v.as_caller_data() : v;
    };
    if (a.is_undefined()) throw failure(a.str());
    if (b.is_undefined()) throw failure(b.str());
    static const char * symbols[] = {"+", "-", "*", "/", "//", "%", "**", "~"};
    const auto type_error = [&]() -> failure {
        return failure(std::string("unsupported operand type(s) for ") + symbols[int(e.op)] +
                       ": '" + a.type_name() + "' and '" + b.type_name() + "'");
    };
    if (a.is_number() && b.is_number()) {
        const bool ints = !a.is_real() && !b.is_real();
        const int64_t x = a.as_int(), y = b.as_int();
        const double p = a.as_double(), q = b.as_double();
        int64_t r = 0;
        switch (e.op) {
        case bop::add:
            if (!ints) return value(p + q);
            overflow(__builtin_add_overflow(x, y, &r));
            return value(r);
        case bop::sub:
            if (!ints) return value(p - q);
            overflow(__builtin_sub_overflow(x, y, &r));
            return value(r);
        case bop::mul:
            if (!ints) return value(p * q);
            overflow(__builtin_mul_overflow(x, y, &r));
            return value(r);
        case bop::div:
            if (q == 0) throw failure("division by zero");
            return value(p / q);
        case bop::floordiv:
        case bop::mod:
            if (ints) {
                if (y == 0) throw failure("integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) throw failure("integer overflow", true);
                int64_t div = x / y, mod = x % y;
                if (mod != 0 && ((mod < 0) != (y < 0))) {
                    div -= 1;
                    mod += y;
                }
                return value(e.op == bop::floordiv ? div : mod);
            } else {
                if (q == 0) throw failure("float division by zero");
                double mod = std::fmod(p, q);
                if (mod != 0 && ((mod < 0) != (q < 0))) mod += q;
                if (e.op == bop::mod) return value(mod == 0 ? std::copysign(0.0, q) : mod);
                return value(std::floor((p - mod) / q + 0.0));
            }
        case bop::pow:
            if (ints && y >= 0) {
                int64_t out = 1, base = x;
                for (int64_t k = y; k > 0; k >>= 1) {
                    if (k & 1) overflow(__builtin_mul_overflow(out, base, &out));
                    if (k > 1) overflow(__builtin_mul_overflow(base, base, &base));
                }
                return value(out);
            }
            if (p == 0 && q < 0) throw failure("0.0 cannot be raised to a negative power");
            return value(std::pow(p, q));
        default:
            break;
        }
    }
    if (e.op == bop::add) {
        if (a.is_string() && b.is_string()) {
            if (a.str().size() + b.str().size() > o_.max_output) {
                throw failure("a string passed the limit of " + std::to_string(o_.max_output) +
                              " bytes");
            }
            // Markup escapes a plain str it is added to (markupsafe).
            if (a.is_markup() || b.is_markup()) {
                return derived(value::markup((a.is_markup() ? a.str() : html_escape(a.str())) +
                                             (b.is_markup() ? b.str() : html_escape(b.str()))));
            }
            marked_text s;
            s.append(a);
            s.append(b);
            return s.to_value();
        }
        if (a.is_sequence() && a.type() == b.type()) {
            list_data out = a.items();
            out.insert(out.end(), b.items().begin(), b.items().end());
            charge(out.size());
            return a.is_list() ? value::list(std::move(out)) : value::tuple(std::move(out));
        }
    }
    if (e.op == bop::mul && (a.is_int() || b.is_int())) {
        const value & seq = a.is_int() ? b : a;
        const int64_t n = std::max<int64_t>(0, a.is_int() ? a.as_int() : b.as_int());
        if (seq.is_string()) {
            if (uint64_t(n) * seq.str().size() > o_.max_output) {
                throw failure("a string passed the limit of " + std::to_string(o_.max_output) +
                              " bytes");
            }
            marked_text out;
            for (int64_t i = 0; i < n; i++) out.append(seq);
            const value v = seq.is_markup() ? value::markup(out.text) : value(out.text);
            return v.with_caller(std::move(out.caller));
        }
        if (seq.is_sequence()) {
            if (uint64_t(n) * seq.items().size() > o_.max_output) {
                throw failure("a list passed the limit of " + std::to_string(o_.max_output) +
                              " items");
            }
            charge(size_t(n) * seq.items().size());
            list_data out;
            for (int64_t i = 0; i < n; i++)
                out.insert(out.end(), seq.items().begin(), seq.items().end());
            return seq.is_list() ? value::list(std::move(out)) : value::tuple(std::move(out));
        }
    }
    if (e.op == bop::mod && a.is_string()) {
        if (a.is_markup()) unsupported_markup("%");
        return derived(value(percent_format(a.str(), b)));
    }
    throw type_error();
}

value renderer::eval_compare(const expr & e, const frame_ptr & f) {
    value a = eval(*e.kids[0], f);
    for (size_t i = 0; i < e.ops.size(); i++) {
        value b = eval(*e.kids[i + 1], f);
        line = e.line;
        const std::string & op = e.ops[i];
        bool r;
        if (op == "==") {
            r = equals(a, b);
        } else if (op == "!=") {
            r = !equals(a, b);
        } else if (op == "in") {
            r = contains(b, a);
        } else if (op == "notin") {
            r = !contains(b, a);
        } else {
            const int c = compare(a, b);
            r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
        }
        if (!r) return value(false);
        a = std::move(b);
    }
    return value(true);
}

void renderer::assign(const stmt & s, const frame_ptr & f, value v) {
    if (!s.attr.empty()) {
        const value ns = lookup(s.names[0], f);
        if (!ns.is_namespace()) {
            throw failure("cannot assign attribute '" + s.attr + "' on '" + s.names[0] +
                          "', which is not a namespace()");
        }
        ns.mutable_entries().set(s.attr, std::move(v));
        return;
    }
    if (!s.unpack) {
        f->set(s.names[0], std::move(v));
        return;
    }
    const list_data items = iterate(v);
    if (items.size() != s.names.size()) {
        throw failure(
            items.size() < s.names.size()
                ? "not enough values to unpack (expected " + std::to_string(s.names.size()) +
                      ", got " + std::to_string(items.size()) + ")"
                : "too many values to unpack (expected " + std::to_string(s.names.size()) + ")");
    }
    for (size_t i = 0; i < items.size(); i++) f->set(s.names[i], items[i]);
}

value renderer::make_macro(const stmt & s, const frame_ptr & f, const std::string & name) {
    const stmt * m = &s;
    renderer * r = this;
    frame_ptr closure = f;
    return value::function("macro '" + name + "'", [r, m, closure, name](call_args & a) {
        deeper d(*r);
        auto mf = std::make_shared<frame>(closure);
        const size_t first_default = m->k == st::call_block ? 1 : 0;
        const size_t n = m->names.size();
        if (a.pos.size() > n && !m->uses_varargs) {
            throw failure("macro '" + name + "' takes not more than " + std::to_string(n) +
                          " argument(s)");
        }
        std::vector<bool> bound(n, false);
        for (size_t i = 0; i < n && i < a.pos.size(); i++) {
            mf->set(m->names[i], a.pos[i]);
            bound[i] = true;
        }
        auto kwargs = std::make_shared<dict_data>();
        value caller;
        for (auto & kv : a.kw) {
            const auto it = std::find(m->names.begin(), m->names.end(), kv.first);
            if (it != m->names.end()) {
                mf->set(kv.first, kv.second);
                bound[size_t(it - m->names.begin())] = true;
            } else if (kv.first == "caller" && m->uses_caller) {
                caller = kv.second;
            } else if (m->uses_kwargs) {
                kwargs->set(kv.first, kv.second);
            } else {
                throw failure("macro '" + name + "' takes no keyword argument '" + kv.first + "'");
            }
        }
        for (size_t i = 0; i < n; i++) {
            if (bound[i]) continue;
            const expr * dflt = m->exprs[i + first_default].get();
            mf->set(m->names[i], dflt ? r->eval(*dflt, mf)
                                      : value::undefined("'" + m->names[i] + "' is undefined"));
        }
        list_data extra;
        for (size_t i = n; i < a.pos.size(); i++) extra.push_back(a.pos[i]);
        mf->set("varargs", value::tuple(std::move(extra)));
        mf->set("kwargs", value::dict(kwargs));
        if (m->uses_caller) mf->set("caller", caller);
        marked_text out;
        std::string saved = std::move(r->construct);
        r->construct = "macro '" + name + "'";
        r->exec(m->bodies[0], mf, out);
        r->construct = std::move(saved);
        return out.to_value();
    });
}

flow renderer::exec_for(const stmt & s, const frame_ptr & f, marked_text & out) {
    const value seq = eval(*s.exprs[0], f);
    line = s.line;
    if (seq.is_none()) throw failure("'NoneType' object is not iterable");
    list_data items = iterate(seq);
    if (s.exprs.size() > 1) {
        list_data kept;
        for (const value & v : items) {
            auto tf = std::make_shared<frame>(f);
            assign(s, tf, v);
            if (eval(*s.exprs[1], tf).truthy()) kept.push_back(v);
        }
        items = std::move(kept);
    }
    if (items.empty()) {
        if (s.bodies.size() > 1) return exec(s.bodies[1], std::make_shared<frame>(f), out);
        return flow::normal;
    }
    const int64_t n = int64_t(items.size());
    for (int64_t i = 0; i < n; i++) {
        charge(1);
        auto lf = std::make_shared<frame>(f);
        assign(s, lf, items[size_t(i)]);
        auto loop = std::make_shared<dict_data>();
        loop->items.reserve(12);
        loop->push("index", value(i + 1));
        loop->push("index0", value(i));
        loop->push("revindex", value(n - i));
        loop->push("revindex0", value(n - i - 1));
        loop->push("first", value(i == 0));
        loop->push("last", value(i == n - 1));
        loop->push("length", value(n));
        loop->push("depth", value(1));
        loop->push("depth0", value(0));
        loop->push("previtem",
                   i > 0 ? items[size_t(i - 1)] : value::undefined("there is no previous item"));
        loop->push("nextitem",
                   i + 1 < n ? items[size_t(i + 1)] : value::undefined("there is no next item"));
        loop->push("cycle", value::function("loop.cycle", [i](call_args & a) {
                       if (a.pos.empty()) throw failure("no items for cycling given");
                       return a.pos[size_t(i) % a.pos.size()];
                   }));
        lf->set("loop", value::dict(loop));
        const flow fl = exec(s.bodies[0], lf, out);
        if (fl == flow::break_) break;
    }
    return flow::normal;
}

flow renderer::exec_stmt(const stmt & s, const frame_ptr & f, marked_text & out) {
    deeper d(*this);
    charge(1);
    line = s.line;
    switch (s.k) {
    case st::text:
        out.append(s.text, false);
        break;
    case st::output: {
        const value v = eval(*s.exprs[0], f);
        out.append(v);
        break;
    }
    case st::if_:
        for (size_t i = 0; i < s.exprs.size(); i++) {
            if (eval(*s.exprs[i], f).truthy()) return exec(s.bodies[i], f, out);
        }
        if (s.bodies.size() > s.exprs.size()) return exec(s.bodies.back(), f, out);
        break;
    case st::for_: {
        std::string saved = construct;
        construct = "a 'for' loop";
        const flow fl = exec_for(s, f, out);
        construct = std::move(saved);
        return fl;
    }
    case st::set:
        assign(s, f, eval(*s.exprs[0], f));
        break;
    case st::set_block: {
        marked_text text;
        exec(s.bodies[0], f, text);
        value v = text.to_value();
        if (s.exprs[0]) v = apply_filters(*s.exprs[0], v, f);
        f->set(s.text, std::move(v));
        break;
    }
    case st::macro:
        macro_frames_.push_back(f);
        f->set(s.text, make_macro(s, f, s.text));
        break;
    case st::call_block: {
        const expr & c = *s.exprs[0];
        const value fn = eval(*c.kids[0], f);
        call_args a;
        eval_args(c, 1, f, a);
        a.kw.emplace_back("caller", make_macro(s, f, "caller"));
        line = s.line;
        out.append(call(fn, a));
        break;
    }
    case st::filter_block: {
        marked_text text;
        exec(s.bodies[0], f, text);
        out.append(apply_filters(*s.exprs[0], text.to_value(), f));
        break;
    }
    case st::break_:
        return flow::break_;
    case st::continue_:
        return flow::continue_;
    case st::with_: {
        auto wf = std::make_shared<frame>(f);
        for (size_t i = 0; i < s.names.size(); i++) wf->set(s.names[i], eval(*s.exprs[i], f));
        return exec(s.bodies[0], wf, out);
    }
    case st::generation:
        return exec(s.bodies[0], f, out);
    }
    grow(out);
    return flow::normal;
}

} // namespace

// --- the program -------------------------------------------------------------------

template_program::template_program(const std::string & source, std::string name)
    : name_(std::move(name)) {
    body_ = std::make_unique<node_body>(parse_template(source, name_));
}

template_program::~template_program() = default;

std::string template_program::render(const dict_data & vars, const render_options & options) const {
    return render_marked(vars, options).text;
}

marked_text template_program::render_marked(const dict_data & vars,
                                            const render_options & options) const {
    renderer r(options);
    auto root = std::make_shared<frame>(nullptr);
    root->root = &vars;
    marked_text out;
    try {
        r.exec(*body_, root, out);
    } catch (const failure & f) {
        const smol_status status = f.unsupported ? SMOL_ERR_UNSUPPORTED : SMOL_ERR_INVALID_ARGUMENT;
        const std::string where = " (line " + std::to_string(r.line) + ")";
        if (f.raised) throw error(status, name_ + " raised an exception: " + f.what() + where);
        throw error(status, name_ + ": " + f.what() + where);
    }
    return out;
}

} // namespace smol::jinja
