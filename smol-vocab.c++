// smol-vocab.c++ - the tokenizers behind smol-vocab.h: byte-level BPE as GPT-2
// defined it (tokenizer.ggml.model "gpt2") after the pre-tokenizer the file
// names (smol-pretokenize.h); SentencePiece's BPE by token scores with byte
// fallback ("llama": Llama 2, Mistral, Phi-3, TinyLlama); BPE over UTF-8 text
// with spaces as U+2581 ("gemma4"); special-token parsing and
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
#include "smol-pretokenize.h"
#include "smol-unicode.h"

#include <algorithm>
#include <cctype>
#include <cmath>
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

// How a vocabulary turns text into tokens (tokenizer.ggml.model).
enum class model_kind {
    bpe_bytes, // "gpt2": BPE over bytes spelled as GPT-2's code points
    bpe_text,  // "gemma4": BPE over UTF-8 text, spaces as U+2581, <0xXX> fallback
    spm,       // "llama": SentencePiece's merges by token score, <0xXX> fallback
};

// Special-token attributes llama.cpp sets by model name: the spaces beside
// such a token go with it when it is parsed out of a text.
enum strip_attr : uint8_t { STRIP_LEFT = 1, STRIP_RIGHT = 2 };

// U+2581, SentencePiece's visible space.
constexpr std::string_view k_space_mark = "\xe2\x96\x81";

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

// One symbol of SentencePiece's merging: bytes [begin, begin + n) of the
// text, n = 0 once merged into its left neighbour.
struct spm_symbol {
    uint32_t begin;
    uint32_t n;
    int32_t prev;
    int32_t next;
};

struct spm_candidate {
    float score;
    int32_t left;
    int32_t right;
    uint32_t size; // bytes of the pair when queued, to spot stale entries

    // Highest score first; among equal scores the leftmost, as llama.cpp.
    bool operator<(const spm_candidate & o) const {
        return score != o.score ? score < o.score : left > o.left;
    }
};

// Per-call scratch space, reused across the words of one text.
struct scratch {
    decoded_text text;
    std::vector<span> pieces;
    std::vector<span> pieces2;
    std::vector<bpe_symbol> symbols;
    std::vector<bpe_candidate> heap;
    std::vector<spm_symbol> spm_symbols;
    std::vector<spm_candidate> spm_heap;
    std::string escaped;
};

// The length of the UTF-8 sequence a byte starts, as llama.cpp reads it (a
// stray continuation byte counts as one).
uint32_t utf8_len(uint8_t b) {
    return b < 0x80             ? 1
           : (b & 0xE0) == 0xC0 ? 2
           : (b & 0xF0) == 0xE0 ? 3
           : (b & 0xF8) == 0xF0 ? 4
                                : 1;
}

void escape_spaces(std::string_view in, std::string & out) {
    out.clear();
    for (const char c : in) {
        if (c == ' ') {
            out += k_space_mark;
        } else {
            out += c;
        }
    }
}

} // namespace

struct vocab::impl {
    // --- the vocabulary ---
    // Token text as stored (byte-mapped for byte-level BPE, U+2581 for
    // spaces otherwise), then the BPE symbols that are no token (ids >=
    // n_tokens): merge parts or results missing from the vocab.
    std::vector<std::string> text;
    std::vector<int32_t> type;      // token_type per token
    std::vector<float> score;       // SentencePiece's merge priority per token
    std::vector<uint8_t> strip;     // strip_attr per token
    std::vector<std::string> piece; // the bytes each token stands for
    string_index text_to_id{text};
    int32_t n_tokens = 0;
    model_kind kind = model_kind::bpe_bytes;

    // --- BPE ---
    merge_map merges;
    // bpe_bytes: the symbol of each byte's mapped character; bpe_text and
    // spm: the token "<0xAB>" of each byte (else the byte's own, else -1).
    int32_t byte_symbol[256];
    std::unique_ptr<pre_tokenizer> pre;
    bool ignore_merges = false; // take a whole word that is a token as is (llama-3)

    // --- SentencePiece ---
    bool add_space_prefix = false; // a space before the text and after special tokens

    // --- special tokens ---
    smol_token bos_id = -1;
    smol_token eos_id = -1;
    smol_token unk_id = -1;
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

    void bpe_word(scratch & s, std::string_view bytes, span word,
                  std::vector<smol_token> & out) const;
    void bpe_text(scratch & s, std::string_view bytes, std::vector<smol_token> & out) const;
    void spm_text(scratch & s, std::string_view bytes, std::vector<smol_token> & out) const;
    void emit_bytes(std::string_view bytes, std::vector<smol_token> & out) const;
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
        std::string pre_name = f.get_str("tokenizer.ggml.pre").value_or("default");
        if (*model == "gpt2") {
            kind = model_kind::bpe_bytes;
        } else if (*model == "gemma4") {
            kind = model_kind::bpe_text;
            pre_name = "gemma4"; // as llama.cpp: the model implies its pre-tokenizer
        } else if (*model == "llama") {
            kind = model_kind::spm;
            add_space_prefix = true;
            add_bos = true;
        } else {
            throw error(SMOL_ERR_UNSUPPORTED,
                        f.path() + ": tokenizer.ggml.model is \"" + *model +
                            "\", a tokenizer smol does not run; smol runs byte-level BPE "
                            "(\"gpt2\": SmolLM2, Llama 3, Qwen, GPT-2 and the like), "
                            "SentencePiece BPE (\"llama\": Llama 2, Mistral, Phi-3) and "
                            "Gemma 4's BPE (\"gemma4\")");
        }
        if (kind != model_kind::spm) {
            try {
                pre = std::make_unique<pre_tokenizer>(pre_tokenizer::find(pre_name));
            } catch (const error & e) {
                throw error(e.status, f.path() + ": " + e.what());
            }
            ignore_merges = pre->ignore_merges();
            // llama.cpp's default for these; the file may say otherwise.
            add_bos = pre->add_bos();
        }
        add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix").value_or(add_space_prefix);

        load_tokens(f);
        if (kind != model_kind::spm) load_merges(f);
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

    // SentencePiece merges by these; llama.cpp takes float32 or int32 ones.
    const gguf::value * scores = f.find("tokenizer.ggml.scores");
    if (scores) {
        const bool ok = scores->t == gguf::type::ARRAY &&
                        (scores->elem == gguf::type::FLOAT32 || scores->elem == gguf::type::INT32);
        if (!ok || scores->arr.size() < tokens->arr.size()) {
            throw error(SMOL_ERR_FORMAT, f.path() +
                                             ": tokenizer.ggml.scores must be an array of "
                                             "float32 or int32, one per token (" +
                                             std::to_string(n_tokens) +
                                             "); convert the model again");
        }
    }
    score.assign(n_tokens, 0.0f);
    if (scores) {
        for (int32_t i = 0; i < n_tokens; i++) {
            const gguf::value & v = scores->arr[i];
            score[i] = scores->elem == gguf::type::FLOAT32 ? float(v.f) : float(v.i);
            if (std::isnan(score[i])) {
                throw error(SMOL_ERR_FORMAT, f.path() + ": tokenizer.ggml.scores[" +
                                                 std::to_string(i) +
                                                 "] is NaN; convert the model again");
            }
        }
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
    if (kind != model_kind::bpe_bytes) return;
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
        if (kind != model_kind::bpe_bytes) { // U+2581 stands for a space
            for (size_t i = 0; i < s.size();) {
                if (s.compare(i, k_space_mark.size(), k_space_mark) == 0) {
                    out += ' ';
                    i += k_space_mark.size();
                } else {
                    out += s[i++];
                }
            }
            return out;
        }
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
    unk_id = read_id("tokenizer.ggml.unknown_token_id");
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

    if (kind != model_kind::bpe_bytes) {
        static const char * hex = "0123456789ABCDEF";
        for (int b = 0; b < 256; b++) {
            const char name[7] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0};
            byte_symbol[b] = token_id(name);
            if (byte_symbol[b] < 0) byte_symbol[b] = token_id(std::string(1, char(b)));
        }
    }

    piece.resize(n_tokens);
    strip.assign(n_tokens, 0);
    for (int32_t i = 0; i < n_tokens; i++) {
        piece[i] = decode_token_text(text[i], type[i]);
        if (type[i] == TOKEN_CONTROL || type[i] == TOKEN_USER_DEFINED || type[i] == TOKEN_UNKNOWN) {
            special_by_length.push_back(i);
        }
    }
    // Phi-3's special tokens take the spaces after them, as llama.cpp sets
    // by the model's name (its tokenizer strips them).
    std::string name = f.get_str("general.name").value_or("");
    std::transform(name.begin(), name.end(), name.begin(),
                   [](char c) { return char(std::tolower(uint8_t(c))); });
    if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
        for (const smol_token t : special_by_length) strip[t] |= STRIP_RIGHT;
        if (const smol_token t = token_id("</s>"); t >= 0) strip[t] |= STRIP_RIGHT;
        for (const char * keep : {"<unk>", "<s>", "<|endoftext|>"}) {
            if (const smol_token t = token_id(keep); t >= 0) strip[t] &= uint8_t(~STRIP_RIGHT);
        }
    }
    // Longest first, so that a special token containing another wins.
    std::stable_sort(special_by_length.begin(), special_by_length.end(),
                     [&](smol_token a, smol_token b) { return text[a].size() > text[b].size(); });
}

// --- tokenizing ---------------------------------------------------------------

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
        } else {
            emit_bytes(bytes.substr(from, to - from), out);
        }
    };

    const bool byte_level = kind == model_kind::bpe_bytes;
    if (byte_level && b1 - b0 == 1) {
        emit(byte_symbol[uint8_t(bytes[b0])], b0, b1);
        return;
    }
    const std::string_view word_bytes = bytes.substr(b0, b1 - b0);
    // Gemma 4 takes a run of newlines whole when it is a token.
    const bool newlines = !byte_level && word_bytes.find_first_not_of('\n') == std::string::npos;
    if (ignore_merges || newlines) {
        int32_t id = -1;
        if (byte_level) {
            std::string mapped;
            for (const char c : word_bytes) uc::append_utf8(mapped, uc::byte_to_cpt(uint8_t(c)));
            id = token_id(mapped);
        } else {
            id = token_id(word_bytes);
        }
        if (id >= 0) {
            out.push_back(id);
            return;
        }
    }

    // The first symbols: bytes (byte-level) or characters.
    auto & sym = s.symbols;
    sym.clear();
    for (uint32_t i = b0; i < b1;) {
        const uint32_t len = byte_level ? 1 : std::min(utf8_len(uint8_t(bytes[i])), b1 - i);
        const int32_t id =
            byte_level ? byte_symbol[uint8_t(bytes[i])] : text_to_id.find(bytes.substr(i, len));
        const int32_t n = int32_t(sym.size());
        sym.push_back({id, n - 1, i + len < b1 ? n + 1 : -1, i, i + len});
        i += len;
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

void vocab::impl::emit_bytes(std::string_view bytes, std::vector<smol_token> & out) const {
    for (const char c : bytes) {
        const int32_t bt = byte_symbol[uint8_t(c)];
        if (bt >= 0 && bt < n_tokens) {
            out.push_back(bt);
        } else if (kind == model_kind::spm && unk_id >= 0) {
            out.push_back(unk_id);
        }
    }
}

void vocab::impl::bpe_text(scratch & s, std::string_view bytes,
                           std::vector<smol_token> & out) const {
    if (kind == model_kind::bpe_text) {
        escape_spaces(bytes, s.escaped);
        bytes = s.escaped;
    }
    s.text.decode(bytes);
    pre->split(s.text, s.pieces, s.pieces2);
    for (const span & w : s.pieces) bpe_word(s, bytes, w, out);
}

// SentencePiece's BPE as llama.cpp runs it: characters merged pairwise,
// the pair whose joined text is the token of highest score first, until no
// adjacent pair is a token; what is left and no token goes out as bytes.
void vocab::impl::spm_text(scratch & s, std::string_view text,
                           std::vector<smol_token> & out) const {
    escape_spaces(text, s.escaped);
    const std::string_view t = s.escaped;
    auto & sym = s.spm_symbols;
    sym.clear();
    for (uint32_t i = 0; i < t.size();) {
        const uint32_t len = std::min(utf8_len(uint8_t(t[i])), uint32_t(t.size()) - i);
        const int32_t n = int32_t(sym.size());
        sym.push_back({i, len, n - 1, i + len < t.size() ? n + 1 : -1});
        i += len;
    }
    auto & heap = s.spm_heap;
    heap.clear();
    const auto consider = [&](int32_t left, int32_t right) {
        if (left < 0 || right < 0) return;
        const uint32_t size = sym[left].n + sym[right].n;
        const int32_t id = token_id(t.substr(sym[left].begin, size));
        if (id < 0) return;
        heap.push_back({score[id], left, right, size});
        std::push_heap(heap.begin(), heap.end());
    };
    for (int32_t i = 1; i < int32_t(sym.size()); i++) consider(i - 1, i);
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end());
        const spm_candidate c = heap.back();
        heap.pop_back();
        spm_symbol & l = sym[c.left];
        spm_symbol & r = sym[c.right];
        if (l.n == 0 || r.n == 0 || l.n + r.n != c.size) continue;
        l.n += r.n;
        r.n = 0;
        l.next = r.next;
        if (r.next >= 0) sym[r.next].prev = c.left;
        consider(l.prev, c.left);
        consider(c.left, l.next);
    }
    if (sym.empty()) return;
    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        const std::string_view piece = t.substr(sym[i].begin, sym[i].n);
        const int32_t id = token_id(piece);
        if (id >= 0) {
            out.push_back(id);
        } else {
            emit_bytes(piece, out);
        }
    }
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
    if (parse_special || text.empty()) return tokenize(text, add_special, byte_ranges{});
    return tokenize(text, add_special, byte_ranges{{0, text.size()}});
}

std::vector<smol_token> vocab::tokenize(std::string_view text, bool add_special,
                                        const byte_ranges & plain) const {
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
    // parts have token -1. Inside the plain ranges only user-defined tokens
    // cut, as without parse_special. Each plain range starts as a fragment
    // of its own, so a special token never spans a range's edge.
    struct fragment {
        smol_token token;
        size_t begin;
        size_t end;
        bool special; // special tokens are parsed here
    };
    std::vector<fragment> frags;
    size_t edge = 0;
    for (const auto & [b, e] : plain) {
        if (b >= e || e > text.size() || b < edge) {
            throw error(SMOL_ERR_INVALID_ARGUMENT,
                        "tokenize: the plain text ranges must be sorted, disjoint and inside "
                        "the text of " +
                            std::to_string(text.size()) + " bytes");
        }
        if (b > edge) frags.push_back({-1, edge, b, true});
        frags.push_back({-1, b, e, false});
        edge = e;
    }
    if (edge < text.size()) frags.push_back({-1, edge, text.size(), true});
    std::vector<fragment> next;
    for (const smol_token sp : v.special_by_length) {
        const int32_t ty = v.type[sp];
        const auto cuts = [&](const fragment & fr) {
            return fr.token < 0 && (fr.special || ty == TOKEN_USER_DEFINED);
        };
        const std::string_view needle = v.text[sp];
        bool any = false;
        for (const fragment & fr : frags) {
            if (cuts(fr) &&
                text.substr(fr.begin, fr.end - fr.begin).find(needle) != std::string_view::npos) {
                any = true;
                break;
            }
        }
        if (!any) continue;
        next.clear();
        for (const fragment & fr : frags) {
            if (!cuts(fr)) {
                next.push_back(fr);
                continue;
            }
            const auto space = [&](size_t i) { return std::isspace(uint8_t(text[i])) != 0; };
            size_t pos = fr.begin;
            while (pos < fr.end) {
                const size_t at = text.substr(0, fr.end).find(needle, pos);
                if (at == std::string_view::npos) break;
                size_t left_end = at;
                if (v.strip[sp] & STRIP_LEFT) {
                    while (left_end > pos && space(left_end - 1)) left_end--;
                }
                if (left_end > pos) next.push_back({-1, pos, left_end, fr.special});
                next.push_back({sp, at, at + needle.size(), fr.special});
                pos = at + needle.size();
                if (v.strip[sp] & STRIP_RIGHT) {
                    while (pos < fr.end && space(pos)) pos++;
                }
            }
            if (pos < fr.end) next.push_back({-1, pos, fr.end, fr.special});
        }
        std::swap(frags, next);
    }
    // Text between two special tokens is one text again, whichever side of a
    // range's edge it came from: the plain ranges decide only where special
    // tokens are found, and an ordinary chat tokenizes as its whole text.
    next.clear();
    for (const fragment & fr : frags) {
        if (fr.token < 0 && !next.empty() && next.back().token < 0 && next.back().end == fr.begin) {
            next.back().end = fr.end;
        } else {
            next.push_back(fr);
        }
    }
    std::swap(frags, next);

    scratch s;
    // SentencePiece puts a space before the text and after each special token.
    bool after_special = true;
    std::string spaced;
    for (const fragment & fr : frags) {
        const std::string_view part = text.substr(fr.begin, fr.end - fr.begin);
        if (fr.token >= 0) {
            out.push_back(fr.token);
            after_special = true;
        } else if (v.kind == model_kind::spm) {
            spaced.assign(v.add_space_prefix && after_special ? " " : "");
            spaced.append(part);
            v.spm_text(s, spaced, out);
            after_special = false;
        } else {
            v.bpe_text(s, part, out);
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
    const impl & v = loaded(impl_);
    // No clean-up of spaces: the bytes come back as they went in, less the
    // space SentencePiece put before the text (llama.cpp drops it too).
    std::string out;
    for (size_t i = 0; i < tokens.size(); i++) {
        std::string p = token_to_piece(tokens[i], special);
        if (i == 0 && v.add_space_prefix && !p.empty() && p[0] == ' ') p.erase(0, 1);
        out += p;
    }
    return out;
}

} // namespace smol
