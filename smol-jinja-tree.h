// smol-jinja-tree.h - the parsed form of a chat template: expressions and
// statements as smol-jinja-parse.c++ builds them and the renderer
// (smol-jinja.c++) walks them.

#ifndef SMOL_JINJA_TREE_H
#define SMOL_JINJA_TREE_H

#include "smol-jinja-value.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace smol::jinja {

struct expr;
using expr_ptr = std::unique_ptr<expr>;

enum class ex : uint8_t {
    literal,
    name,
    list,
    tuple,
    dict,
    attr,
    item,
    slice,
    call,
    filter,
    test,
    not_,
    neg,
    pos,
    binop,
    compare,
    and_,
    or_,
    cond,
};

enum class bop : uint8_t { add, sub, mul, div, floordiv, mod, pow, concat };

struct expr {
    ex k;
    int line = 0;
    int col = 0; // filter, test
    value lit;
    std::string name; // name, attribute, filter, test
    bop op = bop::add;
    bool negate = false;
    // call: callee then arguments; filter/test: subject (null in a filter
    // block) then arguments; the last kw.size() arguments are keywords.
    std::vector<expr_ptr> kids;
    std::vector<std::string> kw;
    std::vector<std::string> ops; // compare: one per operand after the first
    expr(ex kind, int at) : k(kind), line(at) {}
};

enum class st : uint8_t {
    text,
    output,
    if_,
    for_,
    set,
    set_block,
    macro,
    call_block,
    filter_block,
    break_,
    continue_,
    with_,
    generation,
};

struct stmt;

struct node_body {
    std::vector<std::unique_ptr<stmt>> stmts;
};

struct stmt {
    st k;
    int line = 0;
    std::string text;               // text; set/macro: the name
    std::vector<std::string> names; // for/set/with targets; macro parameters
    std::string attr;               // set ns.attr
    bool unpack = false;            // for/set: a tuple target
    // output: [e]; if: the conditions; for: [iter, cond?]; set: [value];
    // set_block/filter_block: [filter chain or null]; macro: defaults
    // (null: none); call_block: [call, caller defaults...]; with: values.
    std::vector<expr_ptr> exprs;
    std::vector<node_body> bodies; // if: branches then else; for: body, else
    bool uses_varargs = false, uses_kwargs = false, uses_caller = false;
    stmt(st kind, int at) : k(kind), line(at) {}
};

// Parses a template (smol-jinja-parse.c++); throws smol::error naming
// `name`, the line and the column.
node_body parse_template(const std::string & source, const std::string & name);

} // namespace smol::jinja

#endif // SMOL_JINJA_TREE_H
