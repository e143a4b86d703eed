// smol-grammar.h - constrained decoding: GBNF grammars (llama.cpp's format)
// parsed into rules of flat elements, an incremental matcher over Unicode
// code points that keeps the set of parse stacks every prefix allows, the
// token mask over a vocabulary (a byte trie of the token texts walked once
// per step with the matcher's state, pruning whole subtrees; tokens that are
// runs of a character class the state takes in one way, such as the inside
// of a JSON string, allowed by their length alone), and JSON schemas turned
// into GBNF. The sampler (smol-sampler.c++) applies the mask.

#ifndef SMOL_GRAMMAR_H
#define SMOL_GRAMMAR_H

#include "smol.h"

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace smol {

class vocab;
struct llama_model;

// --- grammar ------------------------------------------------------------------

enum class gtype : uint8_t {
    end,      // the end of a rule
    alt,      // the end of an alternative, another follows
    rule_ref, // value: the rule's index
    chars,    // value: the index of a character class
};

struct gelem {
    gtype type;
    uint32_t value;
};

struct grammar {
    // Each rule: alternatives of elements separated by alt, closed by end.
    std::vector<std::vector<gelem>> rules;
    std::vector<std::string> names; // repetitions and groups get derived names
    // Sorted, disjoint, inclusive code point ranges.
    std::vector<std::vector<std::pair<uint32_t, uint32_t>>> classes;
    uint32_t root = 0;
};

// Limits that keep a hostile grammar from exhausting memory or time.
constexpr size_t grammar_max_elements = 1 << 20;
constexpr size_t grammar_max_stacks = 4096;

// Parses GBNF text; root names the start rule. Throws smol::error
// (SMOL_ERR_INVALID_ARGUMENT) with "line L, column C: ..." at the fault, or
// naming the rule that is undefined or left-recursive.
grammar parse_gbnf(std::string_view text, const std::string & root = "root");

// --- matcher ------------------------------------------------------------------

// Tokens' bytes in a trie (preorder: a node's subtree is the nodes up to its
// end).
struct grammar_trie {
    struct node {
        uint8_t byte;
        uint32_t end;                // one past the last node of the subtree
        uint32_t depth;              // bytes from the root (the root: 0)
        uint32_t tok_begin, tok_end; // tokens whose text ends here
    };
    std::vector<node> nodes; // nodes[0] is the root (no byte)
    std::vector<smol_token> tokens;
};

// The tokens of a vocabulary whose text is a run of one character class's
// characters (whole UTF-8 characters, each in the class): each token's
// length in characters (0 where it is no such run), and the trie of the
// others. A matcher state that takes every character of the class in one
// way (the state after it is the same whichever character came) allows a
// run by its length alone, so its mask walks only the others.
struct grammar_runs {
    std::vector<uint8_t> len; // n_vocab entries
    uint32_t max_len = 0;
    size_t n_runs = 0;
    bool has_rest = false; // false: too few runs to be worth a trie of the rest
    grammar_trie rest;
};

// Every token of a vocabulary in a trie, with the end-of-generation tokens,
// and the runs of the classes grammars have asked about.
struct grammar_vocab {
    grammar_trie trie;
    std::vector<std::string> pieces; // each token's text
    std::vector<smol_token> eog;
    int32_t n_vocab = 0;

    mutable std::mutex runs_mu;
    mutable std::map<std::vector<std::pair<uint32_t, uint32_t>>,
                     std::shared_ptr<const grammar_runs>>
        runs;
};

// The runs of a class (sorted, disjoint, inclusive code point ranges) over
// v, made when first asked and kept in v for every grammar over it; null
// once v holds grammar_max_run_classes classes.
constexpr size_t grammar_max_run_classes = 64;
std::shared_ptr<const grammar_runs>
vocab_runs(const grammar_vocab & v, const std::vector<std::pair<uint32_t, uint32_t>> & cls);

std::shared_ptr<const grammar_vocab> make_grammar_vocab(const vocab & v);
// The model's trie, made once and shared by every grammar over it.
std::shared_ptr<const grammar_vocab> model_grammar_vocab(const llama_model & m);

// smol_sampler_set_grammar for the library's own callers (the engine):
// throws smol::error.
void sampler_set_grammar(smol_sampler * s, const llama_model & m, const char * gbnf);

// Where a grammar's parse stands: the stacks of positions every parse of
// the text so far can be in (each stack's top a character class), and the
// bytes of a code point not yet complete.
class grammar_matcher {
  public:
    // Throws smol::error if the start rule expands past the limits.
    explicit grammar_matcher(std::shared_ptr<const grammar> g);

    // Feeds bytes; false (and no change) if the grammar rejects them or the
    // stacks grow past grammar_max_stacks (or take too long to list).
    bool accept(std::string_view bytes);
    // Whether accept(bytes) would succeed; changes nothing.
    bool allows(std::string_view bytes);
    // Whether the text so far is a whole sentence of the grammar.
    bool complete() const;
    // Whether any text may follow.
    bool can_continue() const;
    void reset();
    // Writes a key equal for two states of this matcher exactly when they
    // are the same state (the same stacks and partial character), whatever
    // path led there: what the matcher allows from a state depends on the
    // state alone.
    void state_key(std::string & out) const;

    // allowed[t] = 1 if token t's text may follow (end-of-generation tokens:
    // only when complete), else 0; n_vocab entries.
    void mask(const grammar_vocab & v, std::vector<uint8_t> & allowed);
    // Whether token t of v may follow (end-of-generation tokens: only when
    // complete): allows(its text), answered by its length where it is a run
    // of a class this state takes in one way.
    bool allows_token(const grammar_vocab & v, smol_token t);

    const grammar & rules() const { return *g_; }

  private:
    struct snode {
        const gelem * pos; // a position whose element is chars or rule_ref
        int32_t parent;    // -1: the bottom
    };
    struct utf8 {
        uint32_t value = 0;
        uint32_t left = 0; // continuation bytes still to come
        uint32_t min = 0;  // the least code point its length may encode
    };

    int32_t make(const gelem * pos, int32_t parent);
    bool expand(int32_t s, std::vector<int32_t> & out, uint32_t depth);
    // Advances the stacks in[0, n) over one code point into out; false on
    // overflow.
    bool step(const int32_t * in, size_t n, uint32_t cpt, std::vector<int32_t> & out);
    bool may_start(const int32_t * in, size_t n, uint32_t lo, uint32_t hi) const;
    // One byte: the next heads and partial state; false if rejected.
    bool feed(const int32_t * in, size_t n, utf8 u, uint8_t byte, std::vector<int32_t> & out,
              utf8 & u_out, bool & advanced);
    void compact();
    bool advance(std::string_view bytes, bool commit);
    void key_of(const std::vector<int32_t> & heads, utf8 partial, std::string & out) const;
    // The state's runs (null where none): made when first asked.
    const grammar_runs * runs(const grammar_vocab & v);
    // Whether a run of n characters may follow: 1 or 0, or -1 where the
    // states along the run stop taking the class in one way.
    int run_allows(uint32_t n);
    void drop_runs();

    std::shared_ptr<const grammar> g_;
    std::vector<snode> pool_;
    size_t dedup_from_ = 0; // nodes made since this index are shared when equal
    // Nodes below this index stay until reset or compact: those of the
    // committed state and before.
    size_t kept_nodes_ = 0;
    // The last sets of kept stacks whose step overflowed (step's order).
    static constexpr size_t max_overflows_kept = 8;
    std::vector<std::vector<int32_t>> overflowed_;
    std::vector<int32_t> taking_;  // step's buffer
    uint32_t expansions_left_ = 0; // in the step (or start) under way
    std::vector<int32_t> heads_;
    utf8 partial_;
    // The mask walk's buffers, kept between calls.
    std::vector<int32_t> walk_heads_;
    struct level {
        size_t pool_mark, head_begin, head_end;
        utf8 u;
    };
    std::vector<level> levels_;
    std::vector<int32_t> scratch_;
    // The runs of the current state: the class it takes in one way, and the
    // states along a run of it so far (S_0 the current state, S_reach
    // last; their nodes sit in the pool from pool_mark on, dropped when the
    // state changes).
    struct run_chain {
        bool known = false;
        const grammar_vocab * vocab = nullptr;
        std::shared_ptr<const grammar_runs> runs; // null: no such class
        std::vector<std::pair<uint32_t, uint32_t>> cls;
        uint32_t rep = 0;   // a character of the class
        uint32_t reach = 0; // S_0 .. S_reach-1 take the class in one way
        enum { going, ended, fixed, mixed } end = going;
        std::vector<int32_t> heads, next; // S_reach's
        size_t pool_mark = 0;
        std::string key, next_key;
    } run_;
    // state_key's buffers.
    mutable std::vector<uintptr_t> key_flat_;
    mutable std::vector<std::pair<uint32_t, uint32_t>> key_spans_;
};

// --- JSON schema ----------------------------------------------------------------

// Limits on a schema's text and nesting.
constexpr size_t json_schema_max_bytes = 256 * 1024;
constexpr uint32_t json_schema_max_depth = 64;

// GBNF (root rule "root") for the JSON texts a schema accepts: types,
// properties with required (in the schema's order; optional ones may be
// left out), enum, const, items with minItems and maxItems, anyOf and
// oneOf, local $ref into $defs or definitions, minLength and maxLength, and
// the formats date, time, date-time and uuid. additionalProperties is false
// unless the schema says otherwise. Throws smol::error naming the schema
// path of an unsupported keyword or a bad value.
std::string json_schema_to_gbnf(std::string_view schema_json);

// GBNF for any JSON object.
std::string json_object_gbnf();

} // namespace smol

#endif // SMOL_GRAMMAR_H
