// streaming-heads-option.h - streaming heads (opt-in, approximate) for every
// program that makes a context (smol-cli, smol-bench, smol-server,
// smol-perplexity): the labels file smol-heads writes, read and checked
// against the model, and the flags --streaming-heads FILE, --stream-sink N,
// --stream-window N.
//
// The labels file is text: a header line, the shape and the sinks and
// window it was calibrated for, then one line per layer with a character
// per kv head ('S' streaming, '-' full), each line optionally followed by
// the heads' scores after '#':
//
//   smol-heads 1
//   layers 30 kv-heads 3
//   sink 64 window 256
//   0 S-S  # 0.0012 0.0931 0.0007
//   ...

#ifndef SMOL_STREAMING_HEADS_OPTION_H
#define SMOL_STREAMING_HEADS_OPTION_H

#include "smol.h"

#include <CLI/CLI.hpp>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

struct streaming_heads_file {
    int32_t n_layer = 0, n_head_kv = 0, sink = 0, window = 0;
    std::vector<uint8_t> flags; // [layer * n_head_kv + head]
};

// Reads a labels file; false with what is wrong in err.
inline bool read_streaming_heads(const std::string & path, streaming_heads_file & f,
                                 std::string & err) {
    std::ifstream in(path);
    if (!in) {
        err = "cannot read '" + path + "'";
        return false;
    }
    std::string line, word;
    int version = 0;
    auto bad = [&](const std::string & what) {
        err = path + ": " + what + " (a labels file of smol-heads expected)";
        return false;
    };
    if (!std::getline(in, line) || !(std::istringstream(line) >> word >> version) ||
        word != "smol-heads" || version != 1)
        return bad("the first line is not 'smol-heads 1'");
    std::string w1, w2;
    if (!std::getline(in, line) ||
        !(std::istringstream(line) >> w1 >> f.n_layer >> w2 >> f.n_head_kv) || w1 != "layers" ||
        w2 != "kv-heads" || f.n_layer <= 0 || f.n_head_kv <= 0 || f.n_layer > 4096 ||
        f.n_head_kv > 4096)
        return bad("the second line is not 'layers N kv-heads M'");
    if (!std::getline(in, line) || !(std::istringstream(line) >> w1 >> f.sink >> w2 >> f.window) ||
        w1 != "sink" || w2 != "window" || f.sink < 0 || f.window <= 0)
        return bad("the third line is not 'sink N window M'");
    f.flags.assign(size_t(f.n_layer) * size_t(f.n_head_kv), 0);
    for (int32_t l = 0; l < f.n_layer; ++l) {
        int32_t at = -1;
        std::string heads;
        if (!std::getline(in, line) || !(std::istringstream(line) >> at >> heads) || at != l ||
            int32_t(heads.size()) != f.n_head_kv)
            return bad("line " + std::to_string(l + 4) + " is not layer " + std::to_string(l) +
                       " with " + std::to_string(f.n_head_kv) + " heads of S or -");
        for (int32_t h = 0; h < f.n_head_kv; ++h) {
            if (heads[size_t(h)] != 'S' && heads[size_t(h)] != '-')
                return bad("layer " + std::to_string(l) + " has '" + heads.substr(size_t(h), 1) +
                           "' for a head (S or - expected)");
            f.flags[size_t(l) * size_t(f.n_head_kv) + size_t(h)] = heads[size_t(h)] == 'S';
        }
    }
    return true;
}

// Writes a labels file, with each head's score when given.
inline bool write_streaming_heads(const std::string & path, const streaming_heads_file & f,
                                  const std::vector<double> & scores = {}) {
    std::ofstream out(path);
    out << "smol-heads 1\nlayers " << f.n_layer << " kv-heads " << f.n_head_kv << "\nsink "
        << f.sink << " window " << f.window << "\n";
    for (int32_t l = 0; l < f.n_layer; ++l) {
        out << l << ' ';
        for (int32_t h = 0; h < f.n_head_kv; ++h)
            out << (f.flags[size_t(l) * size_t(f.n_head_kv) + size_t(h)] ? 'S' : '-');
        if (!scores.empty()) {
            out << "  #";
            for (int32_t h = 0; h < f.n_head_kv; ++h) {
                char b[32];
                std::snprintf(b, sizeof b, " %.6f",
                              scores[size_t(l) * size_t(f.n_head_kv) + size_t(h)]);
                out << b;
            }
        }
        out << '\n';
    }
    return bool(out);
}

// The flags, and what they set in a context's parameters.
struct streaming_heads_option {
    std::string file;
    int32_t sink = -1, window = 0;       // -1, 0: the file's
    mutable streaming_heads_file labels; // what apply() read

    void add(CLI::App & app) {
        app.add_option("--streaming-heads", file,
                       "streaming heads (approximate): a labels file of smol-heads; those "
                       "heads keep only the text's first and last positions")
            ->option_text("FILE");
        app.add_option("--stream-sink", sink,
                       "positions at the text's start every streaming head keeps (default: "
                       "the file's)")
            ->check(CLI::NonNegativeNumber);
        app.add_option("--stream-window", window,
                       "recent positions a streaming head sees (default: the file's)")
            ->check(CLI::PositiveNumber);
    }

    // Reads the file (when given) for this model and sets p's fields, which
    // point into this object; false with what is wrong in err.
    bool apply(const smol_model * m, smol_context_params & p, std::string & err) const {
        if (file.empty()) {
            if (sink >= 0 || window > 0) {
                err = "--stream-sink and --stream-window need --streaming-heads FILE";
                return false;
            }
            return true;
        }
        if (!read_streaming_heads(file, labels, err)) return false;
        smol_model_info info;
        smol_model_get_info(m, &info);
        if (labels.n_layer != info.n_layer || labels.n_head_kv != info.n_head_kv) {
            err = file + " labels " + std::to_string(labels.n_layer) + " layers of " +
                  std::to_string(labels.n_head_kv) + " kv heads; " + info.name + " has " +
                  std::to_string(info.n_layer) + " of " + std::to_string(info.n_head_kv) +
                  " (label this model with smol-heads)";
            return false;
        }
        p.streaming_heads = labels.flags.data();
        p.n_streaming_heads = uint32_t(labels.flags.size());
        p.stream_sink = sink >= 0 ? sink : labels.sink;
        p.stream_window = window > 0 ? window : labels.window;
        return true;
    }
};

#endif // SMOL_STREAMING_HEADS_OPTION_H
