// hf-tokenizer.c++ - see hf-tokenizer.h. The rules follow convert_hf_to_gguf
// (get_vocab_base, _set_vocab_gpt2, _create_vocab_sentencepiece) and
// gguf-py's SpecialVocab of the llama.cpp that scripts/peers.sh unpacks:
// ids with no token become "[PAD<id>]" of type UNUSED; added tokens are
// CONTROL when special or when they look special (<|...|>, <unused...>,
// ...), else USER_DEFINED; merges
// given as pairs are joined with a space, a space inside a part written as
// U+0120; special ids come from tokenizer_config.json's *_token texts looked
// up in tokenizer.json's added_tokens, then from config.json's *_token_id.

#include "hf-tokenizer.h"

#include "safetensors.h"
#include "sentencepiece-model.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

namespace smol::convert {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// llama.cpp's llama_token_type.
enum token_type : int32_t {
    NORMAL = 1,
    UNKNOWN = 2,
    CONTROL = 3,
    USER_DEFINED = 4,
    UNUSED = 5,
    BYTE = 6,
};

// SpecialVocab's types, in its order, and the GGUF key of each id.
const char * const special_types[] = {"bos", "eos", "unk", "sep", "pad", "cls", "mask"};
const char * special_key(const std::string & typ) {
    if (typ == "bos") return "tokenizer.ggml.bos_token_id";
    if (typ == "eos") return "tokenizer.ggml.eos_token_id";
    if (typ == "unk") return "tokenizer.ggml.unknown_token_id";
    if (typ == "sep") return "tokenizer.ggml.seperator_token_id"; // llama.cpp's spelling
    if (typ == "pad") return "tokenizer.ggml.padding_token_id";
    if (typ == "cls") return "tokenizer.ggml.cls_token_id";
    return "tokenizer.ggml.mask_token_id";
}

bool starts_with(const std::string & s, const std::string & p) {
    return s.size() >= p.size() && s.compare(0, p.size(), p) == 0;
}
bool ends_with(const std::string & s, const std::string & p) {
    return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// convert_hf_to_gguf's does_token_look_special.
bool looks_special(const std::string & t) {
    if (t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]") return true;
    if (starts_with(t, "<|") && ends_with(t, "|>")) return true;
    if (starts_with(t, "<\xEF\xBD\x9C") && ends_with(t, "\xEF\xBD\x9C>")) return true; // <｜ ｜>
    return starts_with(t, "<unused") && ends_with(t, ">");
}

std::string replace_all(std::string s, const std::string & from, const std::string & to) {
    for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size()))
        s.replace(p, from.size(), to);
    return s;
}

// The pre-tokenizer llama.cpp names, from tokenizer.json's description:
// convert_hf_to_gguf recognises it by hashing the ids of a probe text, which
// needs the tokenizer itself; the description decides the same for the
// pre-tokenizers listed here (llama.cpp runs "smollm" and "starcoder" alike).
std::string recognise_pre(const json & pt, const std::string & path) {
    auto is_bytelevel = [](const json & p) {
        return p.is_object() && p.value("type", "") == "ByteLevel" && p.value("use_regex", true) &&
               !p.value("add_prefix_space", false);
    };
    if (is_bytelevel(pt)) return "gpt-2";
    if (pt.is_object() && pt.value("type", "") == "Sequence" && pt.contains("pretokenizers") &&
        pt["pretokenizers"].is_array() && pt["pretokenizers"].size() == 2) {
        const json & a = pt["pretokenizers"][0];
        const json & b = pt["pretokenizers"][1];
        if (a.is_object() && a.value("type", "") == "Digits" &&
            a.value("individual_digits", false) && is_bytelevel(b))
            return "smollm";
    }
    throw convert_error(
        path + ": pre_tokenizer " + pt.dump().substr(0, 200) +
        " is not one smol-convert recognises (SmolLM2's Digits + ByteLevel, or "
        "GPT-2's ByteLevel); name llama.cpp's tokenizer.ggml.pre for it with --pre");
}

// gguf-py's SpecialVocab: which special tokens are added (from
// tokenizer.json's post-processor, then tokenizer_config.json) and their ids
// (tokenizer_config.json's *_token texts looked up in tokenizer.json's
// added_tokens, then config.json's *_token_id; ids at or past n_vocab
// skipped when n_vocab >= 0), then the chat template. tok is null where
// there is no tokenizer.json.
void add_special_vocab(gguf::writer & w, const std::string & dir, const std::string & tok_path,
                       const json & tok, const json & tc, const json & config, int64_t n_vocab) {
    const std::string cfg_path = (fs::path(dir) / "tokenizer_config.json").string();
    const json added =
        tok.is_object() && tok.contains("added_tokens") && tok["added_tokens"].is_array()
            ? tok["added_tokens"]
            : json::array();
    // Special tokens: which are added (from the post-processor, then
    // tokenizer_config.json) and their ids, each list in the order set.
    std::vector<std::pair<std::string, bool>> add_special;
    std::vector<std::pair<std::string, uint32_t>> special_ids;
    auto set_add = [&](const std::string & typ, bool v, bool overwrite) {
        for (auto & e : add_special) {
            if (e.first == typ) {
                if (overwrite) e.second = v;
                return;
            }
        }
        add_special.emplace_back(typ, v);
    };
    auto set_id = [&](const std::string & typ, const json & id) {
        if (!id.is_number_integer()) return;
        if (id.get<int64_t>() < 0)
            throw convert_error(tok_path + ": the " + typ + " token's id is negative");
        if (n_vocab >= 0 && id.get<int64_t>() >= n_vocab) return;
        for (const auto & e : special_ids)
            if (e.first == typ) return;
        special_ids.emplace_back(typ, uint32_t(id.get<int64_t>()));
    };
    std::string sep_fallback; // the eos text, where the pair template adds it as sep
    auto token_text = [&](const std::string & typ) -> std::string {
        if (typ == "sep" && !sep_fallback.empty()) return sep_fallback;
        if (!tc.is_object() || !tc.contains(typ + "_token")) return "";
        const json & e = tc[typ + "_token"];
        if (e.is_string()) return e.get<std::string>();
        if (e.is_object() && e.contains("content") && e["content"].is_string())
            return e["content"].get<std::string>();
        return "";
    };
    if (tok.is_object() && tok.contains("post_processor") && tok["post_processor"].is_object()) {
        const json & pp = tok["post_processor"];
        const json procs = pp.contains("processors") && pp["processors"].is_array()
                               ? pp["processors"]
                               : json::array({pp});
        for (const json & p : procs) {
            const std::string t = p.is_object() ? p.value("type", "") : "";
            if (t == "ByteLevel") {
                set_add("bos", false, false);
                set_add("eos", false, false);
            } else if (t == "RobertaProcessing") {
                set_add("bos", true, true);
                set_add("eos", true, true);
                set_add("sep", true, true);
            } else if (t == "TemplateProcessing") {
                auto special_of = [](const json & e) -> std::string {
                    if (e.is_object() && e.contains("SpecialToken") &&
                        e["SpecialToken"].is_object())
                        return e["SpecialToken"].value("id", "");
                    return "";
                };
                auto sequence_of = [](const json & e) -> std::string {
                    if (e.is_object() && e.contains("Sequence") && e["Sequence"].is_object())
                        return e["Sequence"].value("id", "");
                    return "";
                };
                const json single = p.contains("single") ? p["single"] : json::array();
                std::string first, last;
                if (single.is_array() && single.size() > 1) {
                    first = special_of(single.front());
                    last = special_of(single.back());
                    if (!first.empty()) set_add("bos", first == token_text("bos"), true);
                    if (!last.empty()) set_add("eos", last == token_text("eos"), true);
                }
                // The pair template, A [sep] [sep] B between the single
                // one's ends, says whether a separator is added.
                json pair = p.contains("pair") && p["pair"].is_array() ? p["pair"] : json::array();
                if (!pair.empty()) {
                    size_t from = !first.empty() && special_of(pair.front()) == first ? 1 : 0;
                    size_t to = pair.size();
                    if (!last.empty() && special_of(pair.back()) == last) --to;
                    if (from < to && sequence_of(pair[from]) == "A" &&
                        sequence_of(pair[to - 1]) == "B" && to - from > 2) {
                        const std::string sep = token_text("sep"), eos = token_text("eos");
                        auto is_sep = [&](const std::string & id) {
                            return !id.empty() && (id == sep || id == eos);
                        };
                        bool add_sep = is_sep(special_of(pair[from + 1])) && last.empty();
                        if (to - from - 2 == 2 && is_sep(special_of(pair[from + 2])))
                            add_sep = true;
                        set_add("sep", add_sep, true);
                        if (add_sep && sep.empty()) sep_fallback = eos;
                    }
                }
            } else {
                throw convert_error(tok_path + ": post_processor of type \"" + t +
                                    "\" is not supported (ByteLevel, TemplateProcessing and "
                                    "RobertaProcessing are)");
            }
        }
    }
    std::string chat_template;
    bool has_template = false;
    if (tc.is_object()) {
        const fs::path jinja = fs::path(dir) / "chat_template.jinja";
        if (tc.contains("chat_template") && tc["chat_template"].is_string()) {
            chat_template = tc["chat_template"].get<std::string>();
            has_template = true;
        } else if (tc.contains("chat_template") && !tc["chat_template"].is_null()) {
            throw convert_error(cfg_path + ": chat_template is not a string (named template "
                                           "lists are not supported)");
        } else if (fs::exists(jinja)) {
            std::ifstream in(jinja, std::ios::binary);
            std::stringstream ss;
            ss << in.rdbuf();
            chat_template = ss.str();
            has_template = true;
        }
        for (const char * typ : special_types) {
            const std::string t = typ;
            if (tc.contains("add_" + t + "_token") && tc["add_" + t + "_token"].is_boolean())
                set_add(t, tc["add_" + t + "_token"].get<bool>(), false);
            const std::string text = token_text(t);
            if (text.empty()) continue;
            for (const json & a : added) {
                if (a.is_object() && a.contains("content") && a["content"] == text &&
                    a.contains("id")) {
                    set_id(t, a["id"]);
                    break;
                }
            }
        }
    }
    for (const char * typ : special_types) {
        const std::string key = std::string(typ) + "_token_id";
        if (config.contains(key)) set_id(typ, config[key]);
    }

    using gguf::value;
    for (const auto & e : special_ids) w.set(special_key(e.first), value::make_u32(e.second));
    for (const auto & e : add_special)
        w.set("tokenizer.ggml.add_" + e.first + "_token", value::make_bool(e.second));
    if (has_template) w.set("tokenizer.chat_template", value::make_str(chat_template));
}

} // namespace

json read_json(const std::string & path, bool required) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        if (!required && !fs::exists(path)) return json();
        throw convert_error(path + ": cannot be read (a Hugging Face model directory has it)");
    }
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) throw convert_error(path + ": is not valid JSON");
    if (!j.is_object()) throw convert_error(path + ": is not a JSON object");
    return j;
}

void add_tokenizer(gguf::writer & w, const std::string & dir, const json & config, int64_t n_vocab,
                   const std::string & pre) {
    const std::string tok_path = (fs::path(dir) / "tokenizer.json").string();
    const std::string cfg_path = (fs::path(dir) / "tokenizer_config.json").string();
    if (!fs::exists(tok_path)) {
        throw convert_error(tok_path +
                            ": is missing; smol-convert reads byte-level BPE tokenizers from "
                            "tokenizer.json (" +
                            (fs::exists(fs::path(dir) / "tokenizer.model")
                                 ? "tokenizer.model, a SentencePiece tokenizer, is not supported"
                                 : "no tokenizer.model either") +
                            ")");
    }
    const json tok = read_json(tok_path, true);
    const json tc = read_json(cfg_path, false);

    const json & model = tok.contains("model") ? tok["model"] : json();
    if (!model.is_object()) throw convert_error(tok_path + ": model is missing or not an object");
    const std::string model_type = model.value("type", "");
    if (model_type != "BPE")
        throw convert_error(tok_path + ": model.type is \"" + model_type +
                            "\"; smol-convert converts byte-level BPE tokenizers only");
    if (tok.contains("normalizer") && !tok["normalizer"].is_null())
        throw convert_error(tok_path + ": normalizer " + tok["normalizer"].dump().substr(0, 120) +
                            " is not supported (byte-level BPE tokenizers have none)");
    const std::string pre_name =
        pre.empty()
            ? recognise_pre(tok.contains("pre_tokenizer") ? tok["pre_tokenizer"] : json(), tok_path)
            : pre;

    // id -> text, model vocabulary then added tokens.
    if (!model.contains("vocab") || !model["vocab"].is_object())
        throw convert_error(tok_path + ": model.vocab is missing or not an object");
    std::vector<std::string> tokens(static_cast<size_t>(n_vocab));
    std::vector<int32_t> types(size_t(n_vocab), UNUSED);
    std::vector<bool> have(size_t(n_vocab), false);
    auto place = [&](const std::string & text, const json & id, const char * field) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0)
            throw convert_error(tok_path + ": " + field + " gives \"" + text +
                                "\" an id that is not a non-negative integer");
        const int64_t i = id.get<int64_t>();
        if (i >= n_vocab)
            throw convert_error(tok_path + ": " + field + " gives \"" + text + "\" id " +
                                std::to_string(i) + ", past config.json's vocab_size " +
                                std::to_string(n_vocab));
        tokens[size_t(i)] = text;
        types[size_t(i)] = NORMAL;
        have[size_t(i)] = true;
        return i;
    };
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it)
        place(it.key(), it.value(), "model.vocab");
    const json added = tok.contains("added_tokens") && tok["added_tokens"].is_array()
                           ? tok["added_tokens"]
                           : json::array();
    for (const json & a : added) {
        if (!a.is_object() || !a.contains("content") || !a["content"].is_string() ||
            !a.contains("id"))
            throw convert_error(tok_path + ": added_tokens has an entry without content and id");
        std::string text = a["content"].get<std::string>();
        const int64_t i = place(text, a["id"], "added_tokens");
        if (a.value("special", false) || looks_special(text)) {
            types[size_t(i)] = CONTROL;
        } else {
            // User-defined spaces pre-normalised, as llama.cpp expects them.
            tokens[size_t(i)] = replace_all(text, "\xE2\x96\x81", " ");
            types[size_t(i)] = USER_DEFINED;
        }
    }
    for (int64_t i = 0; i < n_vocab; ++i) {
        if (!have[size_t(i)]) tokens[size_t(i)] = "[PAD" + std::to_string(i) + "]";
    }

    // Merges, "a b" or ["a", "b"].
    std::vector<std::string> merges;
    if (model.contains("merges") && model["merges"].is_array()) {
        for (const json & m : model["merges"]) {
            if (m.is_string()) {
                merges.push_back(m.get<std::string>());
            } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
                merges.push_back(replace_all(m[0].get<std::string>(), " ", "\xC4\xA0") + " " +
                                 replace_all(m[1].get<std::string>(), " ", "\xC4\xA0"));
            } else {
                throw convert_error(tok_path + ": model.merges has an entry " +
                                    m.dump().substr(0, 80) +
                                    " that is neither \"a b\" nor [\"a\", \"b\"]");
            }
        }
    }
    if (merges.empty())
        throw convert_error(tok_path + ": model.merges is missing or empty; a BPE tokenizer "
                                       "needs its merges");

    using gguf::value;
    if (tc.is_object() && tc.contains("add_prefix_space") && tc["add_prefix_space"].is_boolean())
        w.set("tokenizer.ggml.add_space_prefix",
              value::make_bool(tc["add_prefix_space"].get<bool>()));
    w.set("tokenizer.ggml.model", value::make_str("gpt2"));
    w.set("tokenizer.ggml.pre", value::make_str(pre_name));
    w.set("tokenizer.ggml.tokens", value::make_str_array(tokens));
    std::vector<value> type_values;
    type_values.reserve(types.size());
    for (int32_t t : types) type_values.push_back(value::make_i32(t));
    w.set("tokenizer.ggml.token_type", value::make_array(gguf::type::INT32, type_values));
    w.set("tokenizer.ggml.merges", value::make_str_array(merges));
    add_special_vocab(w, dir, tok_path, tok, tc, config, -1);
}

void add_tokenizer_sentencepiece(gguf::writer & w, const std::string & dir, const json & config,
                                 int64_t n_vocab) {
    const std::string model_path = (fs::path(dir) / "tokenizer.model").string();
    const std::string tok_path = (fs::path(dir) / "tokenizer.json").string();
    const std::string cfg_path = (fs::path(dir) / "tokenizer_config.json").string();
    const std::string added_path = (fs::path(dir) / "added_tokens.json").string();
    if (!fs::exists(model_path))
        throw convert_error(model_path + ": is missing; smol-convert reads this model's "
                                         "SentencePiece tokenizer from it");
    const std::vector<sp_piece> pieces = read_sentencepiece_model(model_path);

    // config.json's vocab_size ids: the pieces, the rest "[PAD<id>]".
    std::vector<std::string> tokens(static_cast<size_t>(n_vocab));
    std::vector<float> scores(size_t(n_vocab), -10000.0f);
    std::vector<int32_t> types(size_t(n_vocab), UNUSED);
    for (int64_t i = 0; i < n_vocab; ++i) tokens[size_t(i)] = "[PAD" + std::to_string(i) + "]";
    for (size_t i = 0; i < pieces.size() && int64_t(i) < n_vocab; ++i) {
        // As convert_hf_to_gguf asks sentencepiece: unknown, control,
        // unused and byte pieces keep their type; user-defined ones are
        // NORMAL.
        int32_t t = NORMAL;
        switch (pieces[i].type) {
        case sp_type::UNKNOWN:
            t = UNKNOWN;
            break;
        case sp_type::CONTROL:
            t = CONTROL;
            break;
        case sp_type::UNUSED:
            t = UNUSED;
            break;
        case sp_type::BYTE:
            t = BYTE;
            break;
        case sp_type::NORMAL:
        case sp_type::USER_DEFINED:
            break;
        }
        tokens[i] = pieces[i].piece;
        scores[i] = pieces[i].score;
        types[i] = t;
    }
    const json added_file = read_json(added_path, false);
    if (added_file.is_object()) {
        for (auto it = added_file.begin(); it != added_file.end(); ++it) {
            if (!it->is_number_integer() || it->get<int64_t>() < 0)
                throw convert_error(added_path + ": \"" + it.key() +
                                    "\" has an id that is not a non-negative integer");
            const int64_t i = it->get<int64_t>();
            if (i >= n_vocab) continue;
            tokens[size_t(i)] = it.key();
            scores[size_t(i)] = -1000.0f;
            types[size_t(i)] = USER_DEFINED;
        }
    }
    const json tc = read_json(cfg_path, false);
    if (tc.is_object() && tc.contains("added_tokens_decoder") &&
        tc["added_tokens_decoder"].is_object()) {
        const json & dec = tc["added_tokens_decoder"];
        for (auto it = dec.begin(); it != dec.end(); ++it) {
            int64_t i = -1;
            try {
                size_t used = 0;
                i = std::stoll(it.key(), &used);
                if (used != it.key().size()) i = -1;
            } catch (const std::exception &) {
                i = -1;
            }
            if (i < 0)
                throw convert_error(cfg_path + ": added_tokens_decoder has key \"" + it.key() +
                                    "\", not a token id");
            if (!it->is_object() || !it->contains("content") || !(*it)["content"].is_string())
                throw convert_error(cfg_path + ": added_tokens_decoder entry " + it.key() +
                                    " has no content");
            if (i >= n_vocab) continue;
            const std::string text = (*it)["content"].get<std::string>();
            const bool special = it->contains("special") && (*it)["special"].is_boolean() &&
                                 (*it)["special"].get<bool>();
            if (special || looks_special(text)) {
                tokens[size_t(i)] = text;
                types[size_t(i)] = CONTROL;
            } else {
                tokens[size_t(i)] = replace_all(text, "\xE2\x96\x81", " ");
                types[size_t(i)] = USER_DEFINED;
            }
            scores[size_t(i)] = -1000.0f;
        }
    }

    using gguf::value;
    w.set("tokenizer.ggml.model", value::make_str("llama"));
    w.set("tokenizer.ggml.pre", value::make_str("default"));
    w.set("tokenizer.ggml.tokens", value::make_str_array(tokens));
    std::vector<value> score_values, type_values;
    score_values.reserve(scores.size());
    type_values.reserve(types.size());
    for (float f : scores) score_values.push_back(value::make_f32(f));
    for (int32_t t : types) type_values.push_back(value::make_i32(t));
    w.set("tokenizer.ggml.scores", value::make_array(gguf::type::FLOAT32, score_values));
    w.set("tokenizer.ggml.token_type", value::make_array(gguf::type::INT32, type_values));
    const json tok = read_json(tok_path, false);
    add_special_vocab(w, dir, tok_path, tok, tc, config, n_vocab);
}

} // namespace smol::convert
