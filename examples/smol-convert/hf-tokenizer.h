// hf-tokenizer.h - a Hugging Face tokenizer (byte-level BPE from
// tokenizer.json, or SentencePiece from tokenizer.model; tokenizer_config.json,
// the special-token ids of config.json) as GGUF
// tokenizer.* metadata, with the keys, values and order llama.cpp's
// convert_hf_to_gguf.py and gguf-py's SpecialVocab give them.

#ifndef SMOL_CONVERT_HF_TOKENIZER_H
#define SMOL_CONVERT_HF_TOKENIZER_H

#include "gguf.h"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace smol::convert {

// A JSON file parsed, or convert_error naming it; null JSON when the file is
// absent and not required.
nlohmann::json read_json(const std::string & path, bool required);

// Sets tokenizer.* in w for a vocabulary of n_vocab ids (config.json's
// vocab_size). pre names tokenizer.ggml.pre; empty: recognised from the
// pre-tokenizer tokenizer.json describes, or convert_error saying to name it.
void add_tokenizer(gguf::writer & w, const std::string & dir, const nlohmann::json & config,
                   int64_t n_vocab, const std::string & pre);

// Sets tokenizer.* in w from a SentencePiece tokenizer.model (with
// added_tokens.json and tokenizer_config.json's added_tokens_decoder over
// it), as convert_hf_to_gguf's _set_vocab_sentencepiece writes them:
// n_vocab ids (config.json's vocab_size), those without a piece
// "[PAD<id>]". tokenizer.json, where present, gives special ids and
// post-processor only.
void add_tokenizer_sentencepiece(gguf::writer & w, const std::string & dir,
                                 const nlohmann::json & config, int64_t n_vocab);

} // namespace smol::convert

#endif // SMOL_CONVERT_HF_TOKENIZER_H
