// smol-vocab.h - the tokenizer read from a GGUF file's tokenizer.ggml.*
// metadata (tokens, scores, merges, token types, bos/eos/eot): byte-level
// BPE after the pre-tokenizer the file names, SentencePiece BPE, Gemma 4's
// BPE; special-token parsing and detokenization that round-trips bytes.

#ifndef SMOL_VOCAB_H
#define SMOL_VOCAB_H

#include "gguf.h"
#include "smol.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace smol {

class vocab {
  public:
    // Reads the tokenizer from GGUF metadata. Throws smol::error
    // (SMOL_ERR_UNSUPPORTED for a tokenizer model or pre-tokenizer smol does
    // not know, SMOL_ERR_FORMAT for inconsistent arrays or scores), naming
    // the key.
    void load(const gguf::file & f);

    int32_t n_tokens() const;
    smol_token bos() const; // -1 if none
    smol_token eos() const; // -1 if none
    bool add_bos() const;   // tokenizer.ggml.add_bos_token
    bool is_eog(smol_token t) const;
    bool is_control(smol_token t) const;

    // As llama.cpp's llama_tokenize: add_special prepends bos when add_bos();
    // parse_special matches the text of control/user-defined tokens.
    std::vector<smol_token> tokenize(std::string_view text, bool add_special,
                                     bool parse_special) const;
    // Byte ranges [first, second) of a text, sorted and disjoint.
    using byte_ranges = std::vector<std::pair<size_t, size_t>>;
    // As tokenize with parse_special, except inside the `plain` ranges (a
    // chat's caller data), which are tokenized as without it: a user's
    // "<|im_start|>" stays text. A special token is found only wholly
    // outside them; the text between special tokens is then tokenized as
    // one, so text without special tokens in its ranges tokenizes exactly
    // as with parse_special.
    std::vector<smol_token> tokenize(std::string_view text, bool add_special,
                                     const byte_ranges & plain) const;
    // The bytes of a token; control tokens give "" unless special.
    std::string token_to_piece(smol_token t, bool special) const;
    std::string detokenize(const std::vector<smol_token> & tokens, bool special) const;

  private:
    struct impl;
    std::shared_ptr<impl> impl_;
};

} // namespace smol

#endif // SMOL_VOCAB_H
