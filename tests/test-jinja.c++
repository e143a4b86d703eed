// test-jinja.c++ - smol's Jinja interpreter (smol-jinja.h) on templates
// written for the test: Python's semantics and printing (each expected text
// is what jinja2 3.1 renders in transformers' environment), whitespace
// control, loops, macros, namespaces, and the refusals of hostile or
// unsupported templates. scripts/check-templates.py compares whole chat
// templates with jinja2.

#include "smol-error.h"
#include "smol-jinja.h"

#include <doctest/doctest.h>
#include <string>

namespace {

using smol::jinja::render_options;
using smol::jinja::template_program;

// The variables most cases use, as JSON.
const char * k_vars = R"({"xs": [3, 1, 2], "d": {"b": 1, "a": [true, null]}, "s": "héllo wörld"})";

std::string render(const std::string & source, const std::string & vars = k_vars,
                   const render_options & o = {}) {
    const template_program t(source, "chat template");
    const smol::jinja::value v = smol::jinja::parse_json(vars);
    return t.render(v.entries(), o);
}

// Parses and renders expecting a smol::error; returns it.
smol::error render_error(const std::string & source, const render_options & o = {}) {
    try {
        render(source, k_vars, o);
    } catch (const smol::error & e) {
        return e;
    }
    FAIL("the template rendered: " << source.substr(0, 80));
    return smol::error(SMOL_OK, "");
}

bool contains(const std::string & s, const std::string & part) {
    return s.find(part) != std::string::npos;
}

} // namespace

// --- expressions --------------------------------------------------------------------

TEST_CASE("arithmetic follows Python: floor division, modulo, powers, precedence") {
    CHECK(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ -7 % 3 }} {{ 2 ** 10 }} "
                 "{{ 2 ** -1 }} {{ 7 / 2 }} {{ 6 / 2 }} {{ 2**3**2 }} {{ -2**2 }} "
                 "{{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1 + 2 * 3 - 4 }} {{ 10 - 2 - 3 }}") ==
          "3 -4 -2 2 1024 0.5 3.5 3.0 64 4 3.0 0.5 3 5");
}

TEST_CASE("values print as Python's str and repr print them") {
    CHECK(render("{{ 1.0 }} {{ True }} {{ none }} {{ [1, \"a\", None] }} {{ d }} {{ (\"x\",) "
                 "}} {{ [\"it's\"] }} {{ [\"a\\\"b\", \"c'd\"] }}") ==
          "1.0 True None [1, 'a', None] {'b': 1, 'a': [True, None]} ('x',) [\"it's\"] "
          "['a\"b', \"c'd\"]");
}

TEST_CASE("floats print as Python's repr: shortest round trip, exponents past 1e16") {
    CHECK(render("{{ 1e-5 }} {{ 1e16 }} {{ 0.1 + 0.2 }} {{ 1e308 * 10 }} {{ 123456789.0 }} "
                 "{{ 0.0001 }} {{ -0.0 }} {{ 3.0e15 }}") ==
          "1e-05 1e+16 0.30000000000000004 inf 123456789.0 0.0001 -0.0 3000000000000000.0");
}

TEST_CASE("tojson writes json.dumps with HF's defaults, keys in insertion order") {
    CHECK(render("{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ d|tojson(separators=(\",\", "
                 "\":\")) }}|{{ d|tojson(sort_keys=true) }}|{{ \"é\\n\\\"\\\\\\x01\"|tojson "
                 "}}|{{ [1.5, 2, \"x\"]|tojson }}|{{ \"é\"|tojson(ensure_ascii=true) }}") ==
          "{\"b\": 1, \"a\": [true, null]}|{\n  \"b\": 1,\n  \"a\": [\n    true,\n    null\n  "
          "]\n}|{\"b\":1,\"a\":[true,null]}|{\"a\": [true, null], \"b\": 1}|\"é\\n\\\"\\\\\\u0001\""
          "|[1.5, 2, \"x\"]|\"\\u00e9\"");
}

TEST_CASE("comparisons chain, membership works on str, list and dict, and/or return operands") {
    CHECK(render("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ \"b\" in \"abc\" }} {{ 2 in xs }} "
                 "{{ \"a\" in d }} {{ 4 not in xs }} {{ 0 or \"x\" }} {{ 1 and [] }} "
                 "{{ not none }} {{ 1 == 1.0 }} {{ [1,2] == [1,2] }} {{ \"a\" ~ 1 ~ none }}") ==
          "True False True True True True x [] True True True a1None");
}

TEST_CASE("strings index, slice and count code points, not bytes") {
    CHECK(render("{{ s|length }} {{ s[1] }} {{ s[::-1] }} {{ s[-5:] }} {{ s[1:4] }} "
                 "{{ xs[::2] }} {{ xs[-1] }} {{ s.upper() }} {{ s|title }} {{ s.title() }}") ==
          "11 é dlröw olléh wörld éll [3, 2] 2 HÉLLO WÖRLD Héllo Wörld Héllo Wörld");
}

TEST_CASE("a conditional expression without else gives undefined, which prints empty") {
    CHECK(render("[{{ 'a' if false }}][{{ 'a' if xs else 'b' }}]") == "[][a]");
}

TEST_CASE("dict literals take any hashable key, matched as Python matches keys") {
    CHECK(render("{% set d2 = {1: \"a\", 2.0: \"b\", True: \"c\", (1, 2): \"t\", none: "
                 "\"n\"} %}{{ d2 }}|{{ d2[1] }}{{ d2[2] }}{{ d2[(1,2)] }}{{ d2[none] }}|{{ {3: "
                 "1, 1: 2}|dictsort }}|{{ {1: \"x\", \"a\": [1]}|tojson }}|{{ 1 in d2 }}|{{ "
                 "d2.get(2) }}") == "{1: 'c', 2.0: 'b', (1, 2): 't', None: 'n'}|cbtn|[(1, 2), (3, "
                                    "1)]|{\"1\": \"x\", \"a\": [1]}|True|b");
    CHECK(contains(render_error("{{ {[1]: 2} }}").what(), "unhashable type: 'list'"));
}

TEST_CASE("undefined values print empty, are false, and fail on attribute access") {
    CHECK(render("[{{ nope }}]{{ nope is defined }}{{ nope|default(\"dflt\") }}{{ nope|length "
                 "}}{% if not nope %}F{% endif %}{{ d.missing is defined }}[{{ d.missing }}]") ==
          "[]Falsedflt0FFalse[]");
    const smol::error e = render_error("{{ nope.attr }}");
    CHECK(e.status == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(contains(e.what(), "'nope' is undefined"));
}

TEST_CASE("tests answer as jinja2's") {
    CHECK(render("{{ xs is iterable }}{{ xs is sequence }}{{ d is mapping }}{{ 3 is odd }}"
                 "{{ 4 is divisibleby 2 }}{{ none is none }}{{ \"a\" is string }}{{ 1 is number "
                 "}}{{ true is boolean }}{{ 1.5 is float }}{{ 1 is integer }}{{ \"ab\" is lower "
                 "}}{{ 2 is in xs }}{{ 1 is eq 1 }}{{ xs is callable }}") ==
          "TrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalse");
}

TEST_CASE("str methods behave as Python's") {
    CHECK(render("{{ \"  a b  \".strip() }}|{{ \"a,b,,c\".split(\",\") }}|{{ \" a  b \".split() "
                 "}}|{{ \"a-b-c\".rsplit(\"-\", 1) }}|{{ \"abc\".startswith((\"x\", \"a\")) }}|"
                 "{{ \"hello\".replace(\"l\", \"L\", 1) }}|{{ \"hello\".find(\"l\") }}|"
                 "{{ \"{} and {name}\".format(1, name=\"n\") }}|{{ \"-\".join([\"a\",\"b\"]) }}|"
                 "{{ \"a\\nb\\r\\nc\".splitlines() }}|{{ \"xxhixx\".lstrip(\"x\") }}|"
                 "{{ \"ab\".count(\"\") }}") ==
          "a b|['a', 'b', '', 'c']|['a', 'b']|['a-b', 'c']|True|heLlo|2|1 and n|a-b|['a', 'b', "
          "'c']|hixx|3");
}

TEST_CASE("filters give jinja2's results") {
    CHECK(
        render("{{ xs|sort }}|{{ xs|sort(reverse=true)|join(\",\") }}|{{ "
               "[{\"n\":\"b\",\"v\":2},{\"n\":\"a\",\"v\":1}]|sort(attribute=\"n\")|map(attribute="
               "\"v\")|list }}|{{ xs|max }}{{ xs|min }}{{ xs|sum }}|{{ [\"A\",\"a\",\"b\"]|unique|"
               "list }}|{{ d|dictsort }}|{{ d|items|list }}|{{ xs|map(\"string\")|join }}|{{ "
               "xs|select(\"odd\")|list }}|{{ xs|reject(\"odd\")|list }}|{{ "
               "[{\"a\":1},{\"a\":0}]|selectattr(\"a\")|list }}|{{ xs|batch(2)|list }}|{{ \"x y "
               "z\"|wordcount }}|{{ \"ab\"|center(6) }}|{{ \"<b>hi</b> &amp; x\"|striptags }}|{{ "
               "\"%s-%03d\"|format(\"a\", 7) }}|{{ \"a\\nb\"|indent(2, first=true) }}|{{ "
               "\"42\"|int + \"2.5\"|float }}|{{ -3|abs }}|{{ 2.5|round }}|{{ 3.14159|round(2) "
               "}}|{{ \"hello world\"|capitalize }}|{{ xs|first }}{{ xs|last }}|{{ "
               "xs|reverse|list }}|{{ \"<&>\"|e }}|{{ xs|list|length }}{{ xs|count }}|{{ "
               "none|default(\"n\", true) }}") ==
        "[1, 2, 3]|3,2,1|[1, 2]|316|['A', 'b']|[('a', [True, None]), ('b', 1)]|[('b', 1), "
        "('a', [True, None])]|312|[3, 1]|[2]|[{'a': 1}]|[[3, 1], [2]]|3|  ab  |hi & x|a-007|  "
        "a\n  b|44.5|3|2.0|3.14|Hello world|32|[2, 1, 3]|&lt;&amp;&gt;|33|n");
}

TEST_CASE("map and select give generators: true, iterated once, not JSON") {
    CHECK(render("{% set g = xs|select('>', 5) %}{{ 'yes' if g }}|{% for x in xs|map('string') "
                 "%}{{ x }}{% endfor %}") == "yes|312");
    const smol::error e = render_error("{{ [1, 2]|map('string')|tojson }}");
    CHECK(contains(e.what(), "generator is not JSON serializable"));
}

TEST_CASE("Markup from |safe escapes the plain string added to it") {
    CHECK(render("{{ '<b>'|safe + '<i>' }}|{{ '<b>' ~ '<i>'|safe }}") == "<b>&lt;i&gt;|<b><i>");
}

// --- statements ---------------------------------------------------------------------

TEST_CASE("trim_blocks and lstrip_blocks take a block tag's line, as HF's environment does") {
    CHECK(render("<ul>\n  {% for x in xs %}\n    <li>{{ x }}</li>\n  {% endfor %}\n</ul>\n") ==
          "<ul>\n    <li>3</li>\n    <li>1</li>\n    <li>2</li>\n</ul>");
}

TEST_CASE("- strips whitespace around a tag and + keeps it") {
    CHECK(render("a  {%- if true -%}  b  {%- endif -%}  c {{- \" d \" -}} e {# note #}\n  {%+ "
                 "if true %}f{% endif %}\n") == "abc d e   f");
}

TEST_CASE("loop variables count, look around and cycle") {
    CHECK(render("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ "
                 "loop.revindex0 }}{{ loop.first|int }}{{ loop.last|int }}{{ loop.length }}{{ "
                 "loop.previtem|default(\"-\") }}{{ loop.nextitem|default(\"-\") }}{{ "
                 "loop.cycle(\"a\",\"b\") }};{% endfor %}") == "1032103-1a;212100332b;32100131-a;");
}

TEST_CASE("for loops unpack, filter, fall back to else, break and continue") {
    CHECK(render("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}|{% for x in xs if x > "
                 "1 %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}|{% for x in [] %}{% else "
                 "%}empty{% endfor %}|{% for x in xs %}{% if x == 1 %}{% continue %}{% endif %}"
                 "{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}") ==
          "b=1,a=[True, None],|3222|empty|3");
}

TEST_CASE("a set inside a loop stays in the loop, a namespace's attribute does not") {
    CHECK(render("{% set y = 1 %}{% for x in xs %}{% set y = x %}{% endfor %}{{ y }}|{% set ns = "
                 "namespace(y=1) %}{% for x in xs %}{% set ns.y = ns.y + x %}{% endfor %}{{ ns.y "
                 "}}") == "1|7");
}

TEST_CASE("macros take defaults, keywords, varargs, kwargs and a caller") {
    CHECK(render("{% macro m(a, b=2, c=\"c\") %}{{ a }}{{ b }}{{ c }}{{ varargs }}{{ kwargs }}{% "
                 "endmacro %}{{ m(1) }}|{{ m(1, c=3) }}|{{ m(1, 2, 3, 4, z=5) }}|{% macro w() "
                 "%}[{{ caller() }}]{% endmacro %}{% call w() %}inner{% endcall %}") ==
          "12c(){}|123(){}|123(4,){'z': 5}|[inner]");
}

TEST_CASE("block set and filter blocks capture their body") {
    CHECK(render("{% set t %}  body {{ 1 + 1 }}{% endset %}[{{ t }}]|{% filter upper %}abc {{ "
                 "\"d\" }}{% endfilter %}|{% set u | trim %}  x  {% endset %}[{{ u }}]") ==
          "[  body 2]|ABC D|[x]");
}

TEST_CASE("raw blocks and generation blocks print their body") {
    CHECK(render("{% raw %}{{ x }}{% endraw %}|{% generation %}{{ 1 }}{% endgeneration %}") ==
          "{{ x }}|1");
}

TEST_CASE("raise_exception stops the render with the template's message") {
    const smol::error e = render_error("{{ raise_exception('roles must alternate') }}");
    CHECK(e.status == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(contains(e.what(), "roles must alternate"));
}

// --- refusals -----------------------------------------------------------------------

TEST_CASE("a loop over range(10**9) is refused as the sandbox refuses it") {
    const smol::error e = render_error("{% for i in range(10**9) %}x{% endfor %}");
    CHECK(e.status == SMOL_ERR_INVALID_ARGUMENT);
    CHECK(contains(e.what(), "range"));
}

TEST_CASE("a render past its step budget stops, naming the loop") {
    const smol::error e = render_error(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
    CHECK(contains(e.what(), "10000000 steps, in a 'for' loop"));
    render_options small;
    small.max_steps = 100;
    CHECK(contains(render_error("{% for i in range(1000) %}{{ i }}{% endfor %}", small).what(),
                   "100 steps"));
}

TEST_CASE("a macro calling itself without end is an error, not a stack overflow") {
    const smol::error e = render_error("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}");
    CHECK(contains(e.what(), "nested more than"));
    CHECK(contains(e.what(), "in macro 'm'"));
}

TEST_CASE("deeply nested parentheses are a parse error, not a stack overflow") {
    const std::string deep =
        "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
    const smol::error e = render_error(deep);
    CHECK(e.status == SMOL_ERR_FORMAT);
    CHECK(contains(e.what(), "nests more than"));
    CHECK(contains(e.what(), "line 1"));
}

TEST_CASE("long chains of operators, filters and attributes are parse errors, not deep trees") {
    std::string sum = "{{ 1", chain = "{{ 'a'";
    for (int i = 0; i < 100000; i++) {
        sum += " + 1";
        chain += "|trim";
    }
    for (const std::string & source : {sum + " }}", chain + " }}"}) {
        const smol::error e = render_error(source);
        CHECK(e.status == SMOL_ERR_FORMAT);
        CHECK(contains(e.what(), "an expression nests more than"));
    }
}

TEST_CASE("values nested past the limit are refused, and a namespace holding itself") {
    CHECK(contains(render_error("{% set ns = namespace(x=none) %}{% for i in range(100000) %}"
                                "{% set ns.x = [ns.x] %}{% endfor %}")
                       .what(),
                   "a value nested more than 1000 levels deep"));
    CHECK(contains(render_error("{% set ns = namespace() %}{% set ns.s = ns %}{{ ns }}").what(),
                   "holds itself"));
}

TEST_CASE("an unknown filter is refused naming it and its line") {
    const smol::error e = render_error("\n\n{{ d|xmlattr }}");
    CHECK(e.status == SMOL_ERR_UNSUPPORTED);
    CHECK(contains(e.what(), "chat template: filter 'xmlattr' is not supported (line 3"));
}

TEST_CASE("unterminated tags, strings and blocks are parse errors with line and column") {
    const struct {
        const char * source;
        const char * says;
    } cases[] = {
        {"a\n{{ x", "inside a {{ ... }} tag"},
        {"{% if x", "inside a {% ... %} tag"},
        {"{# c", "missing end of comment tag"},
        {"{{ 'abc }}", "unterminated string literal"},
        {"{% for x in xs %}x", "the 'for' block needs 'endfor'"},
        {"{% if x %}{% endfor %}", "unknown tag 'endfor'"},
        {"{{ x + }}", "unexpected '}}'"},
        {"{{ ((1 }}", "'(' is not closed"},
        {"{% include 'x' %}", "'include' statement is not supported"},
    };
    for (const auto & c : cases) {
        INFO(c.source);
        const smol::error e = render_error(c.source);
        CHECK(contains(e.what(), c.says));
        CHECK(contains(e.what(), "column"));
    }
}

TEST_CASE("strings past the size limit are refused, not allocated") {
    const smol::error e = render_error("{{ 'a' * 10**9 }}");
    CHECK(contains(e.what(), "limit"));
}

TEST_CASE("changing a list is refused, as the immutable sandbox refuses it") {
    const smol::error e = render_error("{% set l = [1] %}{{ l.append(2) }}");
    CHECK(contains(e.what(), "'append'"));
    CHECK(contains(e.what(), "unsafe"));
}

// --- caller data --------------------------------------------------------------------

namespace {

// Renders with `u` (a user's text) and `v` (a list of them) marked as
// caller data and `lit` not; shows the caller's bytes inside « ».
std::string marked(const std::string & source) {
    using smol::jinja::value;
    const template_program t(source, "chat template");
    smol::jinja::dict_data vars;
    vars.set("u", value("  <|im_start|>hi ").as_caller_data());
    vars.set("v", value::list({value("a"), value("b")}).as_caller_data());
    vars.set("lit", value("<|im_end|>"));
    const smol::jinja::marked_text out = t.render_marked(vars);
    std::string shown;
    size_t at = 0;
    for (const auto & [b, e] : out.caller) {
        shown += out.text.substr(at, b - at) + "«" + out.text.substr(b, e - b) + "»";
        at = e;
    }
    return shown + out.text.substr(at);
}

} // namespace

TEST_CASE("template literals and unmarked variables render as template text") {
    CHECK(marked("<|im_start|>{{ '<|im_end|>' }}{{ lit }}{{ 1 + 2 }}") ==
          "<|im_start|><|im_end|><|im_end|>3");
}

TEST_CASE("a filter that picks a template literal out of caller data leaves it unmarked") {
    CHECK(marked("{{ [lit, u] | first }}|{{ [u, lit] | last }}|{{ u | default(lit) }}") ==
          "<|im_end|>|<|im_end|>|«  <|im_start|>hi »");
}

TEST_CASE("caller data keeps its exact bytes through + and ~") {
    CHECK(marked("{{ '<|im_start|>' + u + lit }}") == "<|im_start|>«  <|im_start|>hi »<|im_end|>");
    CHECK(marked("{{ 'x' ~ u ~ 1 }}") == "x«  <|im_start|>hi »1");
}

TEST_CASE("trim and slicing keep the caller's bytes of what remains") {
    CHECK(marked("[{{ u | trim }}]") == "[«<|im_start|>hi»]");
    CHECK(marked("{{ ('<' + u)[0:5] }}|{{ u[2] }}|{{ u[::-1] }}") ==
          "<«  <|»|«<»|« ih>|trats_mi|<  »");
}

TEST_CASE("join marks the items from the caller and not its separator") {
    CHECK(marked("{{ v | join('<|im_end|>') }}") == "«a»<|im_end|>«b»");
    CHECK(marked("{{ [lit, u] | join }}") == "<|im_end|>«  <|im_start|>hi »");
}

TEST_CASE("transforming filters and methods mark all of a result made from caller data") {
    CHECK(marked("{{ u | upper }}|{{ (lit + u) | replace('x', 'y') }}") ==
          "«  <|IM_START|>HI »|«<|im_end|>  <|im_start|>hi »");
    CHECK(marked("{{ v | tojson }}-{{ v }}-{{ u.strip() }}-{{ '%s!' % u }}") ==
          "«[\"a\", \"b\"]»-«['a', 'b']»-«<|im_start|>hi»-«  <|im_start|>hi !»");
    CHECK(marked("{{ lit | upper }}") == "<|IM_END|>");
    CHECK(marked("{{ strftime_now(u) }}") == "«  <|im_start|>hi »");
}

TEST_CASE("caller data stays marked through set blocks, macros and loops") {
    CHECK(marked("{% set x %}<{{ u }}>{% endset %}{{ x }}") == "<«  <|im_start|>hi »>");
    CHECK(marked("{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m(u) }}") == "[«  <|im_start|>hi »]");
    CHECK(marked("{% for c in v %}<{{ c }}>{% endfor %}") == "<«a»><«b»>");
}
