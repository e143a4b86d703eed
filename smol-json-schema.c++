// smol-json-schema.c++ - JSON schemas turned into GBNF (smol-grammar.h):
// one rule per schema that needs its own (objects, arrays, references),
// named for its path, over shared rules for JSON's primitives. What the
// grammar gives always validates against the schema; where a keyword's
// full meaning would cost too much (additionalProperties beside
// properties), the grammar gives a subset. Keywords it cannot honour are
// refused by name, with the schema path.

#include "smol-error.h"
#include "smol-grammar.h"
#include "smol-jinja-value.h"

#include <cstring>
#include <map>
#include <set>

namespace smol {

namespace {

using jinja::value;

const char * const primitives = R"(ws ::= | " " | "\n" [ \t]{0,20}
value ::= object | array | string | number | boolean | null
object ::= "{" ws ( string ":" ws value ws ( "," ws string ":" ws value ws )* )? "}"
array ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" char* "\""
char ::= [^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" ( [0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} ) )
number ::= integer ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
integer ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
boolean ::= "true" | "false"
null ::= "null"
date ::= [0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] )
time ::= ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )
hex ::= [0-9a-f]
uuid ::= hex{8} "-" hex{4} "-" hex{4} "-" hex{4} "-" hex{12}
)";

// Keywords that only describe and never constrain.
const std::set<std::string> annotations = {
    "title",      "description", "default",   "examples", "$schema",     "$id",   "$comment",
    "deprecated", "readOnly",    "writeOnly", "$defs",    "definitions", "format"};

std::string literal(const std::string & text) {
    std::string out = "\"";
    for (const char c : text) {
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
        default:
            if (uint8_t(c) < 0x20) {
                const char * hex = "0123456789abcdef";
                out += "\\x";
                out += hex[uint8_t(c) >> 4];
                out += hex[uint8_t(c) & 15];
            } else {
                out += c;
            }
        }
    }
    return out + "\"";
}

std::string json_text(const value & v) {
    jinja::json_style style;
    style.item_sep = ",";
    style.key_sep = ":";
    return jinja::to_json(v, style);
}

class converter {
  public:
    explicit converter(const value & root) : root_(root) {}

    std::string run() {
        const std::string body = visit(root_, "#", "root", 0);
        std::string out = "root ::= " + body + "\n";
        for (const auto & r : order_) out += r + " ::= " + rules_[r] + "\n";
        return out + primitives;
    }

  private:
    [[noreturn]] static void fail(const std::string & path, const std::string & msg) {
        throw error(SMOL_ERR_INVALID_ARGUMENT, "json schema: " + path + ": " + msg);
    }

    std::string add_rule(const std::string & hint, const std::string & body) {
        std::string base;
        for (const char c : hint) {
            const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                            (c >= '0' && c <= '9') || c == '-';
            base += ok ? c : '-';
        }
        std::string n = base;
        for (int i = 2; rules_.count(n) || reserved(n); ++i) n = base + "-" + std::to_string(i);
        rules_[n] = body;
        order_.push_back(n);
        return n;
    }

    static bool reserved(const std::string & n) {
        static const std::set<std::string> names = {
            "root",    "ws",      "value", "object", "array", "string", "char", "number",
            "integer", "boolean", "null",  "date",   "time",  "hex",    "uuid"};
        return names.count(n) > 0;
    }

    static const value * get(const value & s, const char * key) {
        const value * v = s.entries().find(key);
        return v;
    }

    static uint64_t count(const value & s, const char * key, const std::string & path) {
        const value * v = get(s, key);
        if (!v->is_int() || v->as_int() < 0 || v->is_bool())
            fail(path + "/" + key, "must be a non-negative integer");
        if (v->as_int() > 10000) fail(path + "/" + key, "is past 10000, the most supported");
        return uint64_t(v->as_int());
    }

    static std::string repeat(const std::string & x, uint64_t lo, uint64_t hi) {
        if (hi == UINT64_MAX) return x + "{" + std::to_string(lo) + ",}";
        return x + "{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
    }

    // A GBNF expression (for a sequence position) for the values schema s
    // accepts.
    std::string visit(const value & s, const std::string & path, const std::string & hint,
                      uint32_t depth) {
        if (depth > json_schema_max_depth)
            fail(path, "nests deeper than " + std::to_string(json_schema_max_depth) + " levels");
        if (s.is_bool()) {
            if (s.as_bool()) return "value";
            fail(path, "the schema false accepts nothing");
        }
        if (!s.is_dict()) fail(path, "a schema must be an object or a boolean");
        for (const auto & kv : s.entries().items) {
            if (!kv.first.is_string()) fail(path, "a key that is not a string");
            const std::string & k = kv.first.str();
            static const std::set<std::string> known = {
                "type",     "properties", "required",  "additionalProperties",
                "enum",     "const",      "items",     "minItems",
                "maxItems", "anyOf",      "oneOf",     "allOf",
                "$ref",     "minLength",  "maxLength", "minimum"};
            if (!known.count(k) && !annotations.count(k))
                fail(path + "/" + k, "the keyword '" + k + "' is not supported");
        }
        if (const value * r = get(s, "$ref")) return ref(*r, path + "/$ref", depth);
        if (const value * c = get(s, "const")) return literal(json_text(*c));
        if (const value * e = get(s, "enum")) {
            if (!e->is_list() || e->items().empty())
                fail(path + "/enum", "must be a non-empty array");
            std::string alts;
            for (const value & x : e->items())
                alts += (alts.empty() ? "" : " | ") + literal(json_text(x));
            return "( " + alts + " )";
        }
        for (const char * key : {"anyOf", "oneOf"}) {
            if (const value * a = get(s, key)) {
                if (!a->is_list() || a->items().empty())
                    fail(path + "/" + key, "must be a non-empty array");
                std::string alts;
                for (size_t i = 0; i < a->items().size(); ++i) {
                    alts += (i ? " | " : "") + visit(a->items()[i],
                                                     path + "/" + key + "/" + std::to_string(i),
                                                     hint + "-" + std::to_string(i), depth + 1);
                }
                return "( " + alts + " )";
            }
        }
        if (const value * a = get(s, "allOf")) {
            if (!a->is_list() || a->items().size() != 1)
                fail(path + "/allOf", "only an allOf of one schema is supported");
            return visit(a->items()[0], path + "/allOf/0", hint, depth + 1);
        }
        const value * type = get(s, "type");
        if (!type) {
            for (const char * k : {"minimum", "minLength", "maxLength", "minItems", "maxItems"})
                if (get(s, k)) fail(path + "/" + k, "needs a \"type\" beside it");
            if (get(s, "properties")) return object(s, path, hint, depth);
            if (get(s, "items")) return array(s, path, hint, depth);
            return "value";
        }
        if (type->is_list()) {
            std::string alts;
            for (const value & t : type->items()) {
                if (!t.is_string()) fail(path + "/type", "must name types");
                alts += (alts.empty() ? "" : " | ") + typed(s, t.str(), path, hint, depth);
            }
            if (alts.empty()) fail(path + "/type", "names no type");
            return "( " + alts + " )";
        }
        if (!type->is_string()) fail(path + "/type", "must be a string or an array of strings");
        return typed(s, type->str(), path, hint, depth);
    }

    std::string typed(const value & s, const std::string & type, const std::string & path,
                      const std::string & hint, uint32_t depth) {
        if (type == "object") return object(s, path, hint, depth);
        if (type == "array") return array(s, path, hint, depth);
        if (type == "string") return string(s, path);
        if (type == "integer") {
            if (const value * m = get(s, "minimum")) {
                if (!m->is_number() || m->is_bool()) fail(path + "/minimum", "must be a number");
                if (m->as_double() == 0) return "( \"0\" | [1-9] [0-9]{0,15} )";
                if (m->as_double() == 1) return "( [1-9] [0-9]{0,15} )";
                fail(path + "/minimum", "only a minimum of 0 or 1 is supported");
            }
            return "integer";
        }
        if (type == "number") {
            if (get(s, "minimum")) fail(path + "/minimum", "is supported for integers only");
            return "number";
        }
        if (type == "boolean") return "boolean";
        if (type == "null") return "null";
        fail(path + "/type", "unknown type '" + type + "'");
    }

    std::string string(const value & s, const std::string & path) {
        const bool has_len = get(s, "minLength") || get(s, "maxLength");
        if (const value * f = get(s, "format")) {
            if (!f->is_string()) fail(path + "/format", "must be a string");
            const std::string & fm = f->str();
            std::string body;
            if (fm == "date") body = "date";
            if (fm == "time") body = "time";
            if (fm == "date-time") body = "date \"T\" time";
            if (fm == "uuid") body = "uuid";
            if (!body.empty()) {
                if (has_len)
                    fail(path + "/format", "a format with a length limit is not supported");
                return "\"\\\"\" " + body + " \"\\\"\"";
            }
        }
        if (!has_len) return "string";
        const uint64_t lo = get(s, "minLength") ? count(s, "minLength", path) : 0;
        const uint64_t hi = get(s, "maxLength") ? count(s, "maxLength", path) : UINT64_MAX;
        if (hi < lo) fail(path + "/maxLength", "is below minLength");
        return "\"\\\"\" " + repeat("char", lo, hi) + " \"\\\"\"";
    }

    std::string array(const value & s, const std::string & path, const std::string & hint,
                      uint32_t depth) {
        std::string item = "value";
        if (const value * it = get(s, "items"))
            item = visit(*it, path + "/items", hint + "-item", depth + 1);
        const uint64_t lo = get(s, "minItems") ? count(s, "minItems", path) : 0;
        const uint64_t hi = get(s, "maxItems") ? count(s, "maxItems", path) : UINT64_MAX;
        if (hi < lo) fail(path + "/maxItems", "is below minItems");
        std::string body;
        if (hi == 0) {
            body = "\"[\" ws \"]\"";
        } else {
            const std::string more = "( \",\" ws " + item + " ws )";
            const std::string tail =
                repeat(more, lo > 0 ? lo - 1 : 0, hi == UINT64_MAX ? hi : hi - 1);
            const std::string list = item + " ws " + tail;
            body = "\"[\" ws " + (lo > 0 ? list : "( " + list + " )?") + " \"]\"";
        }
        return add_rule(hint, body);
    }

    std::string object(const value & s, const std::string & path, const std::string & hint,
                       uint32_t depth) {
        const value * props = get(s, "properties");
        const value * req = get(s, "required");
        const value * add = get(s, "additionalProperties");
        if (props && !props->is_dict()) fail(path + "/properties", "must be an object");
        std::set<std::string> required;
        if (req) {
            if (!req->is_list()) fail(path + "/required", "must be an array of names");
            for (const value & r : req->items()) {
                if (!r.is_string()) fail(path + "/required", "must be an array of names");
                required.insert(r.str());
                if (!props || !props->entries().find(r.str()))
                    fail(path + "/required",
                         "names '" + r.str() + "', which has no schema in properties");
            }
        }
        if (!props || props->entries().items.empty()) {
            // A map: any keys, values of additionalProperties' schema.
            if (add && add->is_bool() && !add->as_bool()) return "\"{\" ws \"}\"";
            if (!add || (add->is_bool() && add->as_bool())) return "object";
            const std::string v =
                visit(*add, path + "/additionalProperties", hint + "-value", depth + 1);
            const std::string kv = "string \":\" ws " + v + " ws";
            return add_rule(hint, "\"{\" ws ( " + kv + " ( \",\" ws " + kv + " )* )? \"}\"");
        }
        if (add && !add->is_bool() && !add->is_dict())
            fail(path + "/additionalProperties", "must be a boolean or a schema");
        // Properties in the schema's order; head(i): the first one written
        // is at i or later; tail(i): those after one written, from i on.
        struct prop {
            std::string kv;
            bool required;
        };
        std::vector<prop> ps;
        for (const auto & kv : props->entries().items) {
            const std::string & key = kv.first.str();
            const std::string v =
                visit(kv.second, path + "/properties/" + key, hint + "-" + key, depth + 1);
            ps.push_back({literal(json_text(value(key))) + " \":\" ws " + v + " ws",
                          required.count(key) > 0});
        }
        const size_t n = ps.size();
        std::vector<std::string> tails(n + 1);
        tails[n] = "";
        for (size_t i = n; i-- > 0;) {
            const std::string item = "\",\" ws " + ps[i].kv;
            std::string body =
                ps[i].required ? item + " " + tails[i + 1] : "( " + item + " )? " + tails[i + 1];
            tails[i] = add_rule(hint + "-tail", body);
        }
        std::string head; // the alternatives for the first property written
        bool all_optional = true;
        for (size_t i = 0; i < n; ++i) {
            head += (head.empty() ? "" : " | ") + ps[i].kv + " " + tails[i + 1];
            if (ps[i].required) {
                all_optional = false;
                break;
            }
        }
        const std::string body = "\"{\" ws ( " + head + " )" + (all_optional ? "?" : "") + " \"}\"";
        return add_rule(hint, body);
    }

    std::string ref(const value & r, const std::string & path, uint32_t depth) {
        if (!r.is_string()) fail(path, "must be a string");
        const std::string & p = r.str();
        const auto it = refs_.find(p);
        if (it != refs_.end()) return it->second;
        if (p.rfind("#", 0) != 0) fail(path, "only local references (\"#/...\") are supported");
        const value * at = &root_;
        std::string hint = "ref";
        size_t i = 1;
        while (i < p.size()) {
            if (p[i] != '/') fail(path, "'" + p + "' is not a JSON pointer");
            size_t j = p.find('/', i + 1);
            if (j == std::string::npos) j = p.size();
            std::string key = p.substr(i + 1, j - i - 1);
            std::string unescaped;
            for (size_t k = 0; k < key.size(); ++k) {
                if (key[k] == '~' && k + 1 < key.size()) {
                    unescaped += key[k + 1] == '1' ? '/' : '~';
                    ++k;
                } else {
                    unescaped += key[k];
                }
            }
            if (!at->is_dict() || !at->entries().find(unescaped))
                fail(path, "'" + p + "' names nothing in the schema");
            at = at->entries().find(unescaped);
            hint = unescaped;
            i = j;
        }
        // The rule is named before its body is made, so a schema may refer
        // to itself.
        const std::string name = add_rule(hint, "");
        refs_[p] = name;
        rules_[name] = visit(*at, p, hint, depth + 1);
        return name;
    }

    const value & root_;
    std::map<std::string, std::string> rules_;
    std::vector<std::string> order_;
    std::map<std::string, std::string> refs_;
};

} // namespace

std::string json_schema_to_gbnf(std::string_view schema_json) {
    if (schema_json.size() > json_schema_max_bytes)
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "json schema: larger than " + std::to_string(json_schema_max_bytes) + " bytes");
    value root;
    try {
        root = jinja::parse_json(schema_json);
    } catch (const jinja::failure & e) {
        throw error(SMOL_ERR_INVALID_ARGUMENT, std::string("json schema: not JSON: ") + e.what());
    }
    return converter(root).run();
}

std::string json_object_gbnf() {
    return std::string("root ::= object\n") + primitives;
}

} // namespace smol

extern "C" smol_status smol_json_schema_to_grammar(const char * schema, char * buf, size_t size,
                                                   size_t * n_out) {
    if (!schema || !n_out || (!buf && size > 0)) {
        smol::set_last_error("smol_json_schema_to_grammar: schema and n_out must not be NULL");
        return SMOL_ERR_INVALID_ARGUMENT;
    }
    std::string g;
    const smol_status s = smol::guard([&] { g = smol::json_schema_to_gbnf(schema); });
    if (s != SMOL_OK) return s;
    *n_out = g.size() + 1;
    if (size < g.size() + 1) {
        smol::set_last_error("smol_json_schema_to_grammar: the grammar needs " +
                             std::to_string(g.size() + 1) + " bytes");
        return SMOL_ERR_BUFFER_TOO_SMALL;
    }
    std::memcpy(buf, g.c_str(), g.size() + 1);
    return SMOL_OK;
}
