// smol-pretokenize.c++ - the pre-tokenizers of smol-pretokenize.h: llama.cpp's
// table of tokenizer.ggml.pre values and the patterns each runs (the patterns
// of the models' own tokenizer.json files), and the scanners for GPT-2's and
// Llama 3's patterns.

#include "smol-pretokenize.h"

#include "smol-error.h"

#include <algorithm>
#include <string>
#include <vector>

namespace smol {

namespace {

namespace uc = smol::unicode;

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

// The regexes of GPT-2 and Llama 3, which the scanners above run.
constexpr const char * k_gpt2 =
    R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))re";
constexpr const char * k_llama3 =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

struct pre_spec {
    const char * names; // tokenizer.ggml.pre values, space-separated
    bool ignore_merges;
    bool add_bos;
    std::vector<const char *> patterns;
};

// llama.cpp's table (src/llama-vocab.cpp), less the pre-tokenizers of
// embedding models and those needing more than smol::regex has (Unicode
// subcategories, \b, script properties, custom digit grouping).
const std::vector<pre_spec> & pre_specs() {
    static const std::vector<pre_spec> specs = {
        {"default",
         false,
         false,
         {R"re([\p{P}\$\+<=>\^~\|]+)re",
          R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))re",
          R"re(\p{N}+)re", R"re([0-9][0-9][0-9])re"}},
        {"minicpm5",
         true,
         false,
         {R"re(\p{N}{1,3})re",
          R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"}},
        {"llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2",
         true,
         true,
         {R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"}},
        {"deepseek-llm",
         false,
         false,
         {R"re([\r\n])re",
          R"re(\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+)re",
          R"re(\s?[!-/:-~！-／：-～‘-‟　-。]+)re", R"re(\s+$)re", R"re([一-龥ࠀ-一가-퟿]+)re",
          R"re(\p{N}+)re"}},
        {"deepseek-coder",
         false,
         false,
         {R"re([\r\n])re", R"re(\s?\p{L}+)re", R"re(\s?\p{P}+)re",
          R"re([一-龥ࠀ-一가-퟿]+)re", R"re(\p{N})re"}},
        {"deepseek-v3 hunyuan-dense hy_v4 joyai-llm",
         false,
         false,
         {R"re(\p{N}{1,3})re", R"re([一-龥぀-ゟ゠-ヿ]+)re",
          R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"}},
        {"spark2_5",
         false,
         false,
         {R"re(\p{N}{1,3})re", R"re([一-龥぀-ゟ゠-ヿ]+)re",
          R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+)re",
          R"re(\p{N})re"}},
        {"falcon",
         false,
         false,
         {R"re([\p{P}\$\+<=>\^~\|`]+)re",
          R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))re",
          R"re([0-9][0-9][0-9])re"}},
        {"mpt gpt-2 gpt2 phi-2 gigachat a.x-4.0 mellum olmo jais exaone4 trillion granite-docling",
         false,
         false,
         {R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))re"}},
        {"starcoder refact command-r smollm codeshell exaone minerva-7b mellum2",
         false,
         false,
         {R"re(\p{N})re",
          R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))re"}},
        {"jais-2",
         false,
         false,
         {R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1})re"}},
        {"gemma4", false, false, {R"re([^\n]+|[\n]+)re"}},
        {"qwen2 deepseek-r1-qwen kormo f2llmv2 stablelm2 megrez hunyuan grok-2 solar-open",
         false,
         false,
         {R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"}},
        {"qwen35",
         false,
         false,
         {R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"}},
        {"dbrx smaug-bpe chatglm-bpe",
         false,
         false,
         {R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"}},
        {"poro-chat bloom gpt3-finnish", false, false, {R"re( ?[^(\s|.,!?…。，、।۔،)]+)re"}},
        {"glm4 glm5",
         true,
         false,
         {R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"}},
        {"viking", false, false, {R"re( ?[^(\s|.,!?…。，、।۔،)]+)re", R"re(\p{N})re"}},
        {"tekken",
         true,
         true,
         {R"re([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"}},
        {"exaone-moe",
         false,
         false,
         {R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+)re"}},
        {"gpt-4o llama4 kanana2 talkie minimax-m2", false, false, {R"re([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"}},
        {"bailingmoe bailingmoe2 llada-moe",
         false,
         false,
         {R"re('(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)re"}},
        {"seed-coder",
         false,
         false,
         {R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)re"}},
        {"ufakzeka",
         false,
         false,
         {R"re([^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"}},
        {"laguna",
         false,
         false,
         {R"re([^\n]+|[\n]+)re",
          R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"}},
    };
    return specs;
}

} // namespace

pre_tokenizer::pre_tokenizer(const std::vector<std::string> & patterns) {
    for (const std::string & p : patterns) {
        if (p == k_gpt2) {
            steps_.push_back({scanner::gpt2, nullptr});
        } else if (p == k_llama3) {
            steps_.push_back({scanner::llama3, nullptr});
        } else {
            steps_.push_back({scanner::regex, std::make_shared<const regex>(p)});
        }
    }
}

pre_tokenizer pre_tokenizer::find(std::string_view name) {
    for (const pre_spec & s : pre_specs()) {
        std::string_view names = s.names;
        for (size_t at = 0; at <= names.size();) {
            size_t sp = names.find(' ', at);
            if (sp == std::string_view::npos) sp = names.size();
            if (names.substr(at, sp - at) == name) {
                pre_tokenizer p(std::vector<std::string>(s.patterns.begin(), s.patterns.end()));
                p.ignore_merges_ = s.ignore_merges;
                p.add_bos_ = s.add_bos;
                return p;
            }
            at = sp + 1;
        }
    }
    throw error(SMOL_ERR_UNSUPPORTED, "tokenizer.ggml.pre is \"" + std::string(name) +
                                          "\", a pre-tokenizer smol does not know (it knows " +
                                          known_names() + ")");
}

std::string pre_tokenizer::known_names() {
    std::string out;
    for (const pre_spec & s : pre_specs()) {
        if (!out.empty()) out += ' ';
        out += s.names;
    }
    return out;
}

std::string pre_tokenizer::describe() const {
    std::string out;
    for (const step & s : steps_) {
        out += s.kind == scanner::gpt2     ? "scanner gpt2"
               : s.kind == scanner::llama3 ? "scanner llama3"
                                           : "regex " + s.re->pattern();
        out += '\n';
    }
    return out;
}

void pre_tokenizer::split(const decoded_text & t, std::vector<span> & out,
                          std::vector<span> & tmp) const {
    out.assign(1, span{0, t.size()});
    for (const step & s : steps_) {
        switch (s.kind) {
        case scanner::gpt2:
            split_gpt2(t, out, tmp);
            break;
        case scanner::llama3:
            split_llama3(t, out, tmp);
            break;
        case scanner::regex: {
            const regex & re = *s.re;
            split_matches(out, tmp, [&](uint32_t pos, uint32_t end) {
                return re.match(t.cpt.data(), t.flg.data(), pos, end);
            });
            break;
        }
        }
        std::swap(out, tmp);
    }
}

} // namespace smol
