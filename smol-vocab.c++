// smol-vocab.c++ - the tokenizer behind smol-vocab.h: byte-level BPE as GPT-2
// defined it, with the pre-tokenizers llama.cpp applies for the values of
// tokenizer.ggml.pre that smol knows, special-token parsing and
// detokenization. Token ids match llama.cpp's for valid UTF-8.
//
// Invalid UTF-8 is the one place smol departs from llama.cpp on purpose:
// llama.cpp replaces each bad byte by U+FFFD before BPE, so the text cannot
// come back. smol splits the text exactly as llama.cpp does (a bad byte counts
// as one U+FFFD while splitting) but runs BPE on the original bytes, so any
// byte string detokenizes back to itself. The exception is a byte value the
// vocabulary has no token for (SmolLM2 lacks 21, such as 0xFF and 0xF1): no
// id can carry it, and smol drops it as llama.cpp does.

#include "smol-vocab.h"

#include "smol-error.h"
#include "smol-unicode.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace smol {

namespace {

namespace uc = smol::unicode;

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum token_type : int32_t {
    TOKEN_UNDEFINED = 0,
    TOKEN_NORMAL = 1,
    TOKEN_UNKNOWN = 2,
    TOKEN_CONTROL = 3,
    TOKEN_USER_DEFINED = 4,
    TOKEN_UNUSED = 5,
    TOKEN_BYTE = 6,
};

// The regex lists llama.cpp runs for each tokenizer.ggml.pre value smol
// knows, as hand-written scanners.
enum class pre_tokenizer {
    gpt2,     // GPT-2's regex alone
    smollm,   // \p{N} (each digit alone), then GPT-2's regex
    fallback, // llama.cpp's "default": punctuation runs, GPT-2, \p{N}+, [0-9]{3}
    llama3,   // llama-3's regex (numbers in threes, newlines kept together)
};

struct pre_name {
    const char * name;
    pre_tokenizer kind;
};

// The tokenizer.ggml.pre values smol knows; llama.cpp runs the same regex
// list for names of the same kind.
constexpr pre_name k_pre_names[] = {
    {"default", pre_tokenizer::fallback}, {"gpt-2", pre_tokenizer::gpt2},
    {"gpt2", pre_tokenizer::gpt2},        {"smollm", pre_tokenizer::smollm},
    {"starcoder", pre_tokenizer::smollm}, {"refact", pre_tokenizer::smollm},
    {"codeshell", pre_tokenizer::smollm}, {"llama-bpe", pre_tokenizer::llama3},
    {"llama3", pre_tokenizer::llama3},    {"llama-v3", pre_tokenizer::llama3},
};

// Tokens llama.cpp treats as ending generation, found by their text because
// GGUF files do not list them.
constexpr const char * k_eog_texts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\xef\xbd\x9c"
    "end\xe2\x96\x81"
    "of\xe2\x96\x81"
    "sentence\xef\xbd\x9c>", // DeepSeek's
    "[e~[",
};

// A code point range [begin, end) of the fragment being pre-tokenized.
struct span {
    uint32_t begin;
    uint32_t end;
};

// A fragment decoded once: code points, their flags and where each starts
// in the bytes (offs has one extra entry, the fragment's length).
struct decoded_text {
    std::vector<uint32_t> cpt;
    std::vector<uint16_t> flg;
    std::vector<uint32_t> offs;

    void decode(std::string_view s) {
        cpt.clear();
        flg.clear();
        offs.clear();
        for (size_t i = 0; i < s.size();) {
            const auto d = uc::decode_utf8(s.data() + i, s.size() - i);
            cpt.push_back(d.cpt);
            flg.push_back(uc::flags(d.cpt));
            offs.push_back(uint32_t(i));
            i += d.len;
        }
        offs.push_back(uint32_t(s.size()));
    }
    uint32_t size() const { return uint32_t(cpt.size()); }
};

constexpr uint32_t k_outside = 0xFFFFFFFF;

// Splits each piece at the matches of a pattern, keeping the text between
// matches as pieces too (llama.cpp's std::regex splitter). match(pos, end)
// is the length of the match starting at pos, 0 for none.
template <typename Match>
void split_matches(const std::vector<span> & in, std::vector<span> & out, Match match) {
    out.clear();
    for (const span & p : in) {
        uint32_t gap = p.begin;
        for (uint32_t pos = p.begin; pos < p.end;) {
            const uint32_t n = match(pos, p.end);
            if (n == 0) {
                pos++;
                continue;
            }
            if (pos > gap) out.push_back({gap, pos});
            out.push_back({pos, pos + n});
            pos += n;
            gap = pos;
        }
        if (p.end > gap) out.push_back({gap, p.end});
    }
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// scanned by hand, as llama.cpp does, each piece on its own (the lookahead
// does not see past the piece's end).
void split_gpt2(const decoded_text & t, const std::vector<span> & in, std::vector<span> & out) {
    out.clear();
    for (const span & p : in) {
        const uint32_t end = p.end;
        const auto cpt_at = [&](uint32_t i) { return i < end ? t.cpt[i] : k_outside; };
        const auto flg_at = [&](uint32_t i) -> uint16_t { return i < end ? t.flg[i] : 0; };
        uint32_t pos = p.begin;
        const auto emit = [&](uint32_t to) {
            if (to > pos) out.push_back({pos, to});
            pos = to;
        };
        while (pos < end) {
            const uint32_t c = t.cpt[pos];
            if (c == '\'' && pos + 1 < end) {
                const uint32_t n1 = cpt_at(pos + 1);
                if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
                    emit(pos + 2);
                    continue;
                }
                const uint32_t n2 = cpt_at(pos + 2);
                if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') ||
                    (n1 == 'l' && n2 == 'l')) {
                    emit(pos + 3);
                    continue;
                }
            }
            const uint32_t start = pos + (c == ' ' ? 1 : 0);
            const uint16_t f2 = flg_at(start);
            if (f2 & uc::LETTER) {
                uint32_t i = start;
                while (flg_at(i) & uc::LETTER) i++;
                emit(i);
                continue;
            }
            if (f2 & uc::NUMBER) {
                uint32_t i = start;
                while (flg_at(i) & uc::NUMBER) i++;
                emit(i);
                continue;
            }
            constexpr uint16_t word = uc::WHITESPACE | uc::LETTER | uc::NUMBER;
            if (f2 != 0 && !(f2 & word)) {
                uint32_t i = start;
                while (flg_at(i) != 0 && !(flg_at(i) & word)) i++;
                emit(i);
                continue;
            }
            uint32_t n_ws = 0;
            while (flg_at(pos + n_ws) & uc::WHITESPACE) n_ws++;
            if (n_ws > 1 && pos + n_ws < end) {
                emit(pos + n_ws - 1); // \s+(?!\S): leave the last one to the word after it
                continue;
            }
            emit(pos + std::max(n_ws, 1u));
        }
    }
}

bool is_cr_lf(uint32_t c) {
    return c == '\r' || c == '\n';
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
void split_llama3(const decoded_text & t, const std::vector<span> & in, std::vector<span> & out) {
    out.clear();
    for (const span & p : in) {
        const uint32_t end = p.end;
        const auto cpt_at = [&](uint32_t i) { return i < end ? t.cpt[i] : k_outside; };
        const auto flg_at = [&](uint32_t i) -> uint16_t { return i < end ? t.flg[i] : 0; };
        // Only ASCII letters fold to the ASCII letters the contractions use.
        const auto lower_at = [&](uint32_t i) {
            const uint32_t c = cpt_at(i);
            return c >= 'A' && c <= 'Z' ? c + 32 : c;
        };
        uint32_t pos = p.begin;
        const auto emit = [&](uint32_t to) {
            if (to > pos) out.push_back({pos, to});
            pos = to;
        };
        while (pos < end) {
            const uint32_t c = t.cpt[pos];
            const uint16_t f = t.flg[pos];
            if (c == '\'' && pos + 1 < end) {
                const uint32_t n1 = lower_at(pos + 1);
                if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
                    emit(pos + 2);
                    continue;
                }
                const uint32_t n2 = lower_at(pos + 2);
                if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') ||
                    (n1 == 'l' && n2 == 'l')) {
                    emit(pos + 3);
                    continue;
                }
            }
            if (!is_cr_lf(c) && !(f & uc::NUMBER) &&
                ((f & uc::LETTER) || (flg_at(pos + 1) & uc::LETTER))) {
                uint32_t i = pos + 1;
                while (flg_at(i) & uc::LETTER) i++;
                emit(i);
                continue;
            }
            if (f & uc::NUMBER) {
                uint32_t i = pos;
                while ((flg_at(i) & uc::NUMBER) && i - pos < 3) i++;
                emit(i);
                continue;
            }
            const uint32_t start = pos + (c == ' ' ? 1 : 0);
            const uint16_t f2 = flg_at(start);
            constexpr uint16_t word = uc::WHITESPACE | uc::LETTER | uc::NUMBER;
            if (!(f2 & word)) {
                uint32_t i = start;
                while (flg_at(i) != 0 && !(flg_at(i) & word)) i++;
                while (is_cr_lf(cpt_at(i))) i++;
                emit(i);
                continue;
            }
            uint32_t n_ws = 0;
            uint32_t last_cr_lf_end = 0;
            while (flg_at(pos + n_ws) & uc::WHITESPACE) {
                if (is_cr_lf(t.cpt[pos + n_ws])) last_cr_lf_end = pos + n_ws + 1;
                n_ws++;
            }
            if (last_cr_lf_end > 0) {
                emit(last_cr_lf_end);
                continue;
            }
            if (n_ws > 1 && pos + n_ws < end) {
                emit(pos + n_ws - 1);
                continue;
            }
            emit(pos + std::max(n_ws, 1u));
        }
    }
}

// An open-addressing map from a pair of symbol ids to the merge that joins
// them: 49k merges are looked up once per BPE step, so this is the hot map.
class merge_map {
  public:
    struct merge {
        int32_t rank = -1;
        int32_t result = -1;
    };

    void reserve(size_t n) {
        size_t cap = 16;
        while (cap < n * 2) cap *= 2;
        keys_.assign(cap, k_empty);
        vals_.assign(cap, merge{});
        mask_ = cap - 1;
    }

    // Keeps the first (lowest-rank) entry for a pair listed twice.
    void insert(int32_t a, int32_t b, merge m) {
        const uint64_t k = key(a, b);
        for (size_t i = hash(k) & mask_;; i = (i + 1) & mask_) {
            if (keys_[i] == k) return;
            if (keys_[i] == k_empty) {
                keys_[i] = k;
                vals_[i] = m;
                return;
            }
        }
    }

    merge find(int32_t a, int32_t b) const {
        if (a < 0 || b < 0 || keys_.empty()) return {};
        const uint64_t k = key(a, b);
        for (size_t i = hash(k) & mask_;; i = (i + 1) & mask_) {
            if (keys_[i] == k) return vals_[i];
            if (keys_[i] == k_empty) return {};
        }
    }

  private:
    static constexpr uint64_t k_empty = ~uint64_t(0);
    static uint64_t key(int32_t a, int32_t b) {
        return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
    }
    static size_t hash(uint64_t k) {
        k ^= k >> 33;
        k *= 0xff51afd7ed558ccdULL;
        k ^= k >> 33;
        return size_t(k);
    }
    std::vector<uint64_t> keys_;
    std::vector<merge> vals_;
    size_t mask_ = 0;
};

// An open-addressing index from symbol text to symbol id, over texts kept
// elsewhere: loading builds it for 49k tokens and looks up every merge's
// parts, and a node-based map spends most of that time on cache misses.
class string_index {
  public:
    explicit string_index(const std::vector<std::string> & texts) : texts_(texts) {}

    void reserve(size_t n) {
        size_t cap = 64;
        while (cap < n * 2) cap *= 2;
        rehash(cap);
    }

    int32_t find(std::string_view s) const {
        if (slots_.empty()) return -1;
        const uint64_t h = hash(s);
        for (size_t i = h & mask_;; i = (i + 1) & mask_) {
            const uint64_t slot = slots_[i];
            if (slot == 0) return -1;
            const int32_t id = int32_t(uint32_t(slot) - 1);
            if ((slot >> 32) == (h >> 32) && texts_[id] == s) return id;
        }
    }

    // Adds texts_[id]; returns the id already holding that text, or -1.
    int32_t insert(int32_t id) {
        if ((count_ + 1) * 2 > slots_.size()) rehash(std::max<size_t>(64, slots_.size() * 2));
        const std::string & s = texts_[id];
        const uint64_t h = hash(s);
        for (size_t i = h & mask_;; i = (i + 1) & mask_) {
            const uint64_t slot = slots_[i];
            if (slot == 0) {
                slots_[i] = (h >> 32 << 32) | (uint32_t(id) + 1);
                count_++;
                return -1;
            }
            const int32_t other = int32_t(uint32_t(slot) - 1);
            if ((slot >> 32) == (h >> 32) && texts_[other] == s) return other;
        }
    }

  private:
    static uint64_t hash(std::string_view s) {
        // 64-bit FNV-1a, then a final mix so that low bits pick the slot.
        uint64_t h = 0xcbf29ce484222325ULL;
        for (const char c : s) h = (h ^ uint8_t(c)) * 0x100000001b3ULL;
        h ^= h >> 29;
        h *= 0xbf58476d1ce4e5b9ULL;
        h ^= h >> 32;
        return h;
    }
    void rehash(size_t cap) {
        std::vector<uint64_t> old;
        old.swap(slots_);
        slots_.assign(cap, 0);
        mask_ = cap - 1;
        for (const uint64_t slot : old) {
            if (slot == 0) continue;
            const uint64_t h = hash(texts_[uint32_t(slot) - 1]);
            size_t i = h & mask_;
            while (slots_[i] != 0) i = (i + 1) & mask_;
            slots_[i] = slot;
        }
    }
    const std::vector<std::string> & texts_;
    std::vector<uint64_t> slots_; // high 32 bits: hash; low: id + 1 (0 = empty)
    size_t mask_ = 0;
    size_t count_ = 0;
};

// One BPE symbol of a word: a symbol id (a token id, or an id past the vocab
// for a merge result that is not a token) and the raw bytes it covers.
struct bpe_symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    uint32_t byte_begin;
    uint32_t byte_end;
};

struct bpe_candidate {
    int32_t rank;
    int32_t left;
    int32_t left_id; // the ids the pair had when queued, to spot stale entries
    int32_t right_id;
    int32_t result;

    // Lowest rank first; among equal ranks the leftmost, as llama.cpp.
    bool operator<(const bpe_candidate & o) const {
        return rank != o.rank ? rank > o.rank : left > o.left;
    }
};

// Per-call scratch space, reused across the words of one text.
struct scratch {
    decoded_text text;
    std::vector<span> pieces;
    std::vector<span> pieces2;
    std::vector<bpe_symbol> symbols;
    std::vector<bpe_candidate> heap;
};

} // namespace

struct vocab::impl {
    // --- the vocabulary ---
    // Token text as stored (byte-mapped), then the BPE symbols that are no
    // token (ids >= n_tokens): merge parts or results missing from the vocab.
    std::vector<std::string> text;
    std::vector<int32_t> type;      // token_type per token
    std::vector<std::string> piece; // the bytes each token stands for
    string_index text_to_id{text};
    int32_t n_tokens = 0;

    // --- BPE ---
    merge_map merges;
    int32_t byte_symbol[256]; // symbol of each raw byte's mapped character
    pre_tokenizer pre = pre_tokenizer::fallback;
    bool ignore_merges = false; // take a whole word that is a token as is (llama-3)

    // --- special tokens ---
    smol_token bos_id = -1;
    smol_token eos_id = -1;
    bool add_bos = false;
    bool add_eos = false;
    std::vector<bool> eog;
    std::vector<smol_token> special_by_length; // control / user-defined / unknown

    // The token id of a text, -1 if it is no token.
    int32_t token_id(std::string_view s) const {
        const int32_t id = text_to_id.find(s);
        return id < n_tokens ? id : -1;
    }
    int32_t intern(std::string_view s) {
        const int32_t id = text_to_id.find(s);
        if (id >= 0) return id;
        text.emplace_back(s);
        text_to_id.insert(int32_t(text.size()) - 1);
        return int32_t(text.size()) - 1;
    }

    void load(const gguf::file & f);
    void load_tokens(const gguf::file & f);
    void load_merges(const gguf::file & f);
    void load_special(const gguf::file & f);
    std::string decode_token_text(const std::string & s, int32_t type) const;

    void pre_tokenize(scratch & s) const;
    void bpe_word(scratch & s, std::string_view bytes, span word,
                  std::vector<smol_token> & out) const;
    void tokenize_text(scratch & s, std::string_view bytes, std::vector<smol_token> & out) const;
};

// --- loading ----------------------------------------------------------------

namespace {

const gguf::value * find_array(const gguf::file & f, const char * key, bool integer_elems) {
    const gguf::value * v = f.find(key);
    if (!v) return nullptr;
    const bool ok =
        v->t == gguf::type::ARRAY &&
        (integer_elems ? (v->elem != gguf::type::STRING && v->elem != gguf::type::ARRAY &&
                          v->elem != gguf::type::FLOAT32 && v->elem != gguf::type::FLOAT64 &&
                          v->elem != gguf::type::BOOL)
                       : v->elem == gguf::type::STRING);
    if (!ok) {
        throw error(SMOL_ERR_FORMAT,
                    std::string(f.path()) + ": " + key + " must be an array of " +
                        (integer_elems ? "integers" : "strings") + ", not " +
                        gguf::type_name(v->t) +
                        (v->t == gguf::type::ARRAY ? std::string(" of ") + gguf::type_name(v->elem)
                                                   : std::string()) +
                        "; the file's tokenizer metadata is broken, convert the model again");
    }
    return v;
}

int64_t integer_of(const gguf::value & v) {
    switch (v.t) {
    case gguf::type::UINT8:
    case gguf::type::UINT16:
    case gguf::type::UINT32:
    case gguf::type::UINT64:
        return int64_t(v.u);
    default:
        return v.i;
    }
}

} // namespace

void vocab::impl::load(const gguf::file & f) {
    try {
        const auto model = f.get_str("tokenizer.ggml.model");
        if (!model) {
            throw error(SMOL_ERR_FORMAT,
                        f.path() + ": tokenizer.ggml.model is missing, so the file has "
                                   "no tokenizer; use a GGUF converted with its tokenizer");
        }
        if (*model != "gpt2") {
            throw error(SMOL_ERR_UNSUPPORTED,
                        f.path() + ": tokenizer.ggml.model is \"" + *model +
                            "\"; smol supports only byte-level BPE (\"gpt2\"), the tokenizer of "
                            "SmolLM2, Llama 3 and GPT-2 style models");
        }
        const std::string pre_name = f.get_str("tokenizer.ggml.pre").value_or("default");
        bool known = false;
        for (const auto & p : k_pre_names) {
            if (pre_name == p.name) {
                pre = p.kind;
                known = true;
            }
        }
        if (!known) {
            std::string names;
            for (const auto & p : k_pre_names)
                names += std::string(names.empty() ? "" : ", ") + p.name;
            throw error(SMOL_ERR_UNSUPPORTED,
                        f.path() + ": tokenizer.ggml.pre is \"" + pre_name +
                            "\", a pre-tokenizer smol does not know (it knows " + names + ")");
        }
        if (pre == pre_tokenizer::llama3) {
            ignore_merges = true;
            add_bos = true; // llama.cpp's default for these; the file may say otherwise
        }

        load_tokens(f);
        load_merges(f);
        load_special(f);
    } catch (const gguf::error & e) {
        throw error(SMOL_ERR_FORMAT, std::string(e.what()) +
                                         " (while reading the tokenizer; convert the model again)");
    }
}

void vocab::impl::load_tokens(const gguf::file & f) {
    const gguf::value * tokens = find_array(f, "tokenizer.ggml.tokens", false);
    if (!tokens || tokens->arr.empty()) {
        throw error(SMOL_ERR_FORMAT, f.path() + ": tokenizer.ggml.tokens is missing or empty; the "
                                                "file has no vocabulary, convert the model again");
    }
    if (tokens->arr.size() > size_t(INT32_MAX / 2)) {
        throw error(SMOL_ERR_FORMAT, f.path() + ": tokenizer.ggml.tokens has " +
                                         std::to_string(tokens->arr.size()) +
                                         " entries, more than a token id can hold");
    }
    n_tokens = int32_t(tokens->arr.size());
    const gguf::value * types = find_array(f, "tokenizer.ggml.token_type", true);
    if (types && types->arr.size() < tokens->arr.size()) {
        throw error(SMOL_ERR_FORMAT, f.path() + ": tokenizer.ggml.token_type has " +
                                         std::to_string(types->arr.size()) + " entries for " +
                                         std::to_string(n_tokens) +
                                         " tokens; convert the model again");
    }

    text.resize(n_tokens);
    type.resize(n_tokens);
    text_to_id.reserve(size_t(n_tokens) + 1024);
    for (int32_t i = 0; i < n_tokens; i++) {
        text[i] = tokens->arr[i].str;
        if (text[i].empty()) text[i] = "[EMPTY_" + std::to_string(i) + "]"; // as llama.cpp
        type[i] = types ? int32_t(integer_of(types->arr[i])) : TOKEN_NORMAL;
    }
    for (int32_t i = 0; i < n_tokens; i++) {
        if (const int32_t other = text_to_id.insert(i); other >= 0) {
            throw error(SMOL_ERR_FORMAT, f.path() + ": tokenizer.ggml.tokens lists \"" + text[i] +
                                             "\" twice (ids " + std::to_string(other) + " and " +
                                             std::to_string(i) + "); convert the model again");
        }
    }
}

void vocab::impl::load_merges(const gguf::file & f) {
    const gguf::value * list = find_array(f, "tokenizer.ggml.merges", false);
    if (!list) {
        throw error(SMOL_ERR_FORMAT, f.path() +
                                         ": tokenizer.ggml.merges is missing; a BPE "
                                         "tokenizer needs its merges, convert the model again");
    }
    merges.reserve(list->arr.size());
    std::string joined;
    for (size_t rank = 0; rank < list->arr.size(); rank++) {
        const std::string & m = list->arr[rank].str;
        // Split at the first space after the first character, as llama.cpp
        // does, so a merge whose left part is a space character still works.
        const size_t sp = m.find(' ', 1);
        if (sp == std::string::npos) continue; // llama.cpp files it under ("", ""): never used
        const std::string_view a(m.data(), sp);
        const std::string_view b(m.data() + sp + 1, m.size() - sp - 1);
        joined.assign(a);
        joined.append(b);
        const int32_t ia = intern(a);
        const int32_t ib = intern(b);
        merges.insert(ia, ib, {int32_t(rank), intern(joined)});
    }
    for (int i = 0; i < 256; i++) {
        std::string s;
        uc::append_utf8(s, uc::byte_to_cpt(uint8_t(i)));
        byte_symbol[i] = text_to_id.find(s);
    }
}

std::string vocab::impl::decode_token_text(const std::string & s, int32_t t) const {
    switch (t) {
    case TOKEN_CONTROL:
    case TOKEN_UNKNOWN:
    case TOKEN_USER_DEFINED:
        return s; // stored as the text they stand for
    case TOKEN_NORMAL: {
        std::string out;
        for (size_t i = 0; i < s.size();) {
            const auto d = uc::decode_utf8(s.data() + i, s.size() - i);
            const int byte = uc::byte_from_cpt(d.cpt);
            if (byte >= 0) {
                out += char(byte);
            } else {
                out.append(s, i, d.len); // not byte-mapped: keep it as written
            }
            i += d.len;
        }
        return out;
    }
    case TOKEN_BYTE: // "<0xAB>"
        if (s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>' &&
            std::isxdigit(uint8_t(s[3])) && std::isxdigit(uint8_t(s[4]))) {
            return std::string(1, char(std::stoi(s.substr(3, 2), nullptr, 16)));
        }
        return s;
    default:
        return {}; // unused / undefined: nothing to print, as llama.cpp
    }
}

void vocab::impl::load_special(const gguf::file & f) {
    const auto read_id = [&](const char * key) -> smol_token {
        const auto v = f.get_i64(key);
        if (!v) return -1;
        if (*v < 0 || *v >= n_tokens) {
            throw error(SMOL_ERR_FORMAT, f.path() + ": " + key + " is " + std::to_string(*v) +
                                             " but the vocabulary has " + std::to_string(n_tokens) +
                                             " tokens; fix the key or convert the model again");
        }
        return smol_token(*v);
    };
    bos_id = read_id("tokenizer.ggml.bos_token_id");
    eos_id = read_id("tokenizer.ggml.eos_token_id");
    const smol_token eot_id = read_id("tokenizer.ggml.eot_token_id");
    const smol_token eom_id = read_id("tokenizer.ggml.eom_token_id");
    add_bos = f.get_bool("tokenizer.ggml.add_bos_token").value_or(add_bos);
    add_eos = f.get_bool("tokenizer.ggml.add_eos_token").value_or(add_eos);
    if (add_bos && bos_id < 0) {
        throw error(SMOL_ERR_FORMAT, f.path() + ": tokenizer.ggml.add_bos_token is true but "
                                                "tokenizer.ggml.bos_token_id is not set");
    }
    if (add_eos && eos_id < 0) {
        throw error(SMOL_ERR_FORMAT, f.path() + ": tokenizer.ggml.add_eos_token is true but "
                                                "tokenizer.ggml.eos_token_id is not set");
    }

    eog.assign(n_tokens, false);
    const auto mark_eog = [&](smol_token t) {
        if (t < 0) return;
        eog[t] = true;
        // llama.cpp makes such a token a control token if the file did not.
        if (type[t] != TOKEN_CONTROL) type[t] = TOKEN_CONTROL;
    };
    for (const char * s : k_eog_texts) {
        mark_eog(token_id(s));
    }
    // Fill-in-the-middle pad, repo-name and file-separator tokens end
    // generation too (a code model starting another file is done with this
    // one): the ids the file gives, else the first token with a known name.
    const auto fim = [&](const char * key, std::initializer_list<const char *> names) {
        const smol_token id = read_id(key);
        if (id >= 0) return id;
        for (const char * s : names) {
            if (const smol_token id = token_id(s); id >= 0) return id;
        }
        return smol_token(-1);
    };
    mark_eog(fim("tokenizer.ggml.fim_pad_token_id",
                 {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}));
    mark_eog(fim("tokenizer.ggml.fim_rep_token_id",
                 {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}));
    mark_eog(fim("tokenizer.ggml.fim_sep_token_id", {"<|file_sep|>"}));
    if (eos_id >= 0) eog[eos_id] = true;
    if (eot_id >= 0) eog[eot_id] = true;
    if (eom_id >= 0) eog[eom_id] = true;

    piece.resize(n_tokens);
    for (int32_t i = 0; i < n_tokens; i++) {
        piece[i] = decode_token_text(text[i], type[i]);
        if (type[i] == TOKEN_CONTROL || type[i] == TOKEN_USER_DEFINED || type[i] == TOKEN_UNKNOWN) {
            special_by_length.push_back(i);
        }
    }
    // Longest first, so that a special token containing another wins.
    std::stable_sort(special_by_length.begin(), special_by_length.end(),
                     [&](smol_token a, smol_token b) { return text[a].size() > text[b].size(); });
}

// --- tokenizing ---------------------------------------------------------------

void vocab::impl::pre_tokenize(scratch & s) const {
    const decoded_text & t = s.text;
    std::vector<span> & a = s.pieces;
    std::vector<span> & b = s.pieces2;
    a.assign(1, span{0, t.size()});
    const auto is_number = [&](uint32_t pos, uint32_t) -> uint32_t {
        return (t.flg[pos] & uc::NUMBER) ? 1 : 0;
    };
    switch (pre) {
    case pre_tokenizer::gpt2:
        split_gpt2(t, a, b);
        std::swap(a, b);
        break;
    case pre_tokenizer::smollm:
        split_matches(a, b, is_number);
        split_gpt2(t, b, a);
        break;
    case pre_tokenizer::llama3:
        split_llama3(t, a, b);
        std::swap(a, b);
        break;
    case pre_tokenizer::fallback: {
        // [\p{P}\$\+<=>\^~\|]+
        const auto punct = [&](uint32_t c, uint16_t fl) {
            return (fl & uc::PUNCTUATION) || c == '$' || c == '+' || c == '<' || c == '=' ||
                   c == '>' || c == '^' || c == '~' || c == '|';
        };
        split_matches(a, b, [&](uint32_t pos, uint32_t end) -> uint32_t {
            uint32_t i = pos;
            while (i < end && punct(t.cpt[i], t.flg[i])) i++;
            return i - pos;
        });
        split_gpt2(t, b, a);
        split_matches(a, b, [&](uint32_t pos, uint32_t end) -> uint32_t { // \p{N}+
            uint32_t i = pos;
            while (i < end && (t.flg[i] & uc::NUMBER)) i++;
            return i - pos;
        });
        split_matches(b, a, [&](uint32_t pos, uint32_t end) -> uint32_t { // [0-9]{3}
            if (end - pos < 3) return 0;
            for (uint32_t i = pos; i < pos + 3; i++) {
                if (t.cpt[i] < '0' || t.cpt[i] > '9') return 0;
            }
            return 3;
        });
        break;
    }
    }
}

void vocab::impl::bpe_word(scratch & s, std::string_view bytes, span word,
                           std::vector<smol_token> & out) const {
    const uint32_t b0 = s.text.offs[word.begin];
    const uint32_t b1 = s.text.offs[word.end];
    if (b1 == b0) return;

    // Emits a symbol: its token, or when it is no token, the tokens of its
    // bytes one by one (llama.cpp drops what has no token; so does smol).
    const auto emit = [&](int32_t id, uint32_t from, uint32_t to) {
        if (id >= 0 && id < n_tokens) {
            out.push_back(id);
            return;
        }
        for (uint32_t i = from; i < to; i++) {
            const int32_t bt = byte_symbol[uint8_t(bytes[i])];
            if (bt >= 0 && bt < n_tokens) out.push_back(bt);
        }
    };

    if (b1 - b0 == 1) {
        emit(byte_symbol[uint8_t(bytes[b0])], b0, b1);
        return;
    }
    if (ignore_merges) {
        std::string mapped;
        for (uint32_t i = b0; i < b1; i++)
            uc::append_utf8(mapped, uc::byte_to_cpt(uint8_t(bytes[i])));
        if (const int32_t id = token_id(mapped); id >= 0) {
            out.push_back(id);
            return;
        }
    }

    auto & sym = s.symbols;
    sym.clear();
    for (uint32_t i = b0; i < b1; i++) {
        const int32_t n = int32_t(sym.size());
        sym.push_back({byte_symbol[uint8_t(bytes[i])], n - 1, i + 1 < b1 ? n + 1 : -1, i, i + 1});
    }
    auto & heap = s.heap;
    heap.clear();
    const auto consider = [&](int32_t left) {
        if (left < 0) return;
        const int32_t right = sym[left].next;
        if (right < 0) return;
        const auto m = merges.find(sym[left].id, sym[right].id);
        if (m.rank < 0) return;
        heap.push_back({m.rank, left, sym[left].id, sym[right].id, m.result});
        std::push_heap(heap.begin(), heap.end());
    };
    for (int32_t i = 0; i + 1 < int32_t(sym.size()); i++) consider(i);

    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end());
        const bpe_candidate c = heap.back();
        heap.pop_back();
        bpe_symbol & l = sym[c.left];
        // A merged-away symbol has id -2; a changed pair has other ids.
        if (l.id != c.left_id || l.next < 0) continue;
        bpe_symbol & r = sym[l.next];
        if (r.id != c.right_id) continue;
        l.id = c.result;
        l.byte_end = r.byte_end;
        l.next = r.next;
        if (r.next >= 0) sym[r.next].prev = c.left;
        r.id = -2;
        consider(l.prev);
        consider(c.left);
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next)
        emit(sym[i].id, sym[i].byte_begin, sym[i].byte_end);
}

void vocab::impl::tokenize_text(scratch & s, std::string_view bytes,
                                std::vector<smol_token> & out) const {
    s.text.decode(bytes);
    pre_tokenize(s);
    for (const span & w : s.pieces) bpe_word(s, bytes, w, out);
}

// --- the public class ---------------------------------------------------------

void vocab::load(const gguf::file & f) {
    auto p = std::make_shared<impl>();
    p->load(f);
    impl_ = std::move(p);
}

namespace {

// The loaded tokenizer, or an error for a vocab that was never loaded. (A
// template, so that it can reach vocab's private impl type without naming it.)
template <typename Impl> const Impl & loaded(const std::shared_ptr<Impl> & p) {
    if (!p) {
        throw error(SMOL_ERR_INVALID_ARGUMENT,
                    "smol::vocab used before load(); load it from the model's GGUF file first");
    }
    return *p;
}

} // namespace

int32_t vocab::n_tokens() const {
    return impl_ ? impl_->n_tokens : 0;
}
smol_token vocab::bos() const {
    return impl_ ? impl_->bos_id : -1;
}
smol_token vocab::eos() const {
    return impl_ ? impl_->eos_id : -1;
}
bool vocab::add_bos() const {
    return impl_ && impl_->add_bos;
}

bool vocab::is_eog(smol_token t) const {
    return impl_ && t >= 0 && t < impl_->n_tokens && impl_->eog[t];
}

bool vocab::is_control(smol_token t) const {
    return impl_ && t >= 0 && t < impl_->n_tokens && impl_->type[t] == TOKEN_CONTROL;
}

std::vector<smol_token> vocab::tokenize(std::string_view text, bool add_special,
                                        bool parse_special) const {
    const impl & v = loaded(impl_);
    if (text.size() >= UINT32_MAX) {
        // Offsets inside a text are 32-bit; 4 GiB is far past any context.
        throw error(SMOL_ERR_INVALID_ARGUMENT, "tokenize: the text is " +
                                                   std::to_string(text.size()) +
                                                   " bytes; split texts of 4 GiB or more");
    }
    std::vector<smol_token> out;
    out.reserve(text.size() / 3 + 2);
    if (add_special && v.add_bos) out.push_back(v.bos_id);

    // Cut the text at special tokens, longest first, as llama.cpp does; text
    // parts have token -1. Without parse_special only user-defined tokens cut.
    struct fragment {
        smol_token token;
        size_t begin;
        size_t end;
    };
    std::vector<fragment> frags;
    if (!text.empty()) frags.push_back({-1, 0, text.size()});
    std::vector<fragment> next;
    for (const smol_token sp : v.special_by_length) {
        const int32_t ty = v.type[sp];
        if (!parse_special && ty != TOKEN_USER_DEFINED) continue;
        const std::string_view needle = v.text[sp];
        bool any = false;
        for (const fragment & fr : frags) {
            if (fr.token < 0 &&
                text.substr(fr.begin, fr.end - fr.begin).find(needle) != std::string_view::npos) {
                any = true;
                break;
            }
        }
        if (!any) continue;
        next.clear();
        for (const fragment & fr : frags) {
            if (fr.token >= 0) {
                next.push_back(fr);
                continue;
            }
            size_t pos = fr.begin;
            while (pos < fr.end) {
                const size_t at = text.substr(0, fr.end).find(needle, pos);
                if (at == std::string_view::npos) break;
                if (at > pos) next.push_back({-1, pos, at});
                next.push_back({sp, at, at + needle.size()});
                pos = at + needle.size();
            }
            if (pos < fr.end) next.push_back({-1, pos, fr.end});
        }
        std::swap(frags, next);
    }

    scratch s;
    for (const fragment & fr : frags) {
        if (fr.token >= 0) {
            out.push_back(fr.token);
        } else {
            v.tokenize_text(s, text.substr(fr.begin, fr.end - fr.begin), out);
        }
    }
    if (add_special && v.add_eos) out.push_back(v.eos_id);
    return out;
}

std::string vocab::token_to_piece(smol_token t, bool special) const {
    const impl & v = loaded(impl_);
    if (t < 0 || t >= v.n_tokens) {
        throw error(SMOL_ERR_INVALID_ARGUMENT, "token id " + std::to_string(t) +
                                                   " is outside the vocabulary (0.." +
                                                   std::to_string(v.n_tokens - 1) + ")");
    }
    if (!special && (v.type[t] == TOKEN_CONTROL || v.type[t] == TOKEN_UNKNOWN)) return {};
    return v.piece[t];
}

std::string vocab::detokenize(const std::vector<smol_token> & tokens, bool special) const {
    loaded(impl_);
    // No clean-up of spaces: the bytes come back as they went in.
    std::string out;
    for (const smol_token t : tokens) out += token_to_piece(t, special);
    return out;
}

} // namespace smol
