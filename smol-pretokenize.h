// smol-pretokenize.h - pre-tokenizers: how a vocabulary cuts text into the
// words BPE runs on, as the list of regular expressions its
// tokenizer.ggml.pre names (llama.cpp's table of them), run in order, each
// splitting the pieces the one before left. GPT-2's and Llama 3's patterns,
// the common ones, have hand-written scanners; every other runs on
// smol::regex.

#ifndef SMOL_PRETOKENIZE_H
#define SMOL_PRETOKENIZE_H

#include "smol-regex.h"
#include "smol-unicode.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace smol {

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
            const auto d = unicode::decode_utf8(s.data() + i, s.size() - i);
            cpt.push_back(d.cpt);
            flg.push_back(unicode::flags(d.cpt));
            offs.push_back(uint32_t(i));
            i += d.len;
        }
        offs.push_back(uint32_t(s.size()));
    }
    uint32_t size() const { return uint32_t(cpt.size()); }
};

class pre_tokenizer {
  public:
    // The pre-tokenizer of a tokenizer.ggml.pre value. Throws smol::error
    // SMOL_ERR_UNSUPPORTED for a name smol does not know, listing those
    // it knows.
    static pre_tokenizer find(std::string_view name);
    // Every name find() knows, space-separated.
    static std::string known_names();

    // From a list of patterns (for tests); throws as smol::regex does.
    explicit pre_tokenizer(const std::vector<std::string> & patterns);

    // llama.cpp's settings that go with the name: a word that is a token
    // is taken whole before merging; bos is added by default.
    bool ignore_merges() const { return ignore_merges_; }
    bool add_bos() const { return add_bos_; }

    // The steps, one a line: "scanner gpt2", "scanner llama3" or "regex P".
    std::string describe() const;

    // Cuts t into pieces (out), tmp being scratch space.
    void split(const decoded_text & t, std::vector<span> & out, std::vector<span> & tmp) const;

  private:
    pre_tokenizer() = default;

    enum class scanner { gpt2, llama3, regex };
    struct step {
        scanner kind;
        std::shared_ptr<const regex> re; // for scanner::regex
    };
    std::vector<step> steps_;
    bool ignore_merges_ = false;
    bool add_bos_ = false;
};

} // namespace smol

#endif // SMOL_PRETOKENIZE_H
