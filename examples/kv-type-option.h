// kv-type-option.h - the --kv-type flag, declared once for every program
// that makes a context (smol-cli, smol-bench, smol-server, smol-perplexity):
// the KV cache's element type by name.

#ifndef SMOL_KV_TYPE_OPTION_H
#define SMOL_KV_TYPE_OPTION_H

#include "smol.h"

#include <CLI/CLI.hpp>
#include <map>
#include <string>

inline CLI::Option * add_kv_type_option(CLI::App & app, smol_type & type) {
    static const std::map<std::string, smol_type> names = {
        {"f16", SMOL_TYPE_F16}, {"q8_0", SMOL_TYPE_Q8_0}, {"q4_0", SMOL_TYPE_Q4_0}};
    return app
        .add_option("--kv-type", type,
                    "KV cache type: f16 (default), or q8_0 / q4_0 (approximate: about half / "
                    "a quarter of the bytes)")
        ->transform(CLI::CheckedTransformer(names))
        ->option_text("f16|q8_0|q4_0");
}

#endif // SMOL_KV_TYPE_OPTION_H
