// grammar-mask-lab.c++ - what a whole token mask costs in the states a JSON
// schema's text passes through: the inside of a bounded string (each
// position a state of its own), after a number, after an object's '{'.
// Each mask is first checked against allows() of every token of the real
// vocabulary (exit status 1 on any difference), then timed: the best of
// three masks a state, averaged over the states of the walk.
//
// g++ -O2 -std=c++20 -I. -Igguf-io scripts/playground/grammar-mask-lab.c++ \
//     build/libsmol.a build/libsmol-gguf.a -lpthread -o build/grammar-mask-lab
// build/grammar-mask-lab [MODEL [SCHEMA]]

#include "smol-grammar.h"
#include "smol-llama.h"
#include "smol.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

int main(int argc, char ** argv) {
    const char * model = argc > 1 ? argv[1] : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    const char * schema_path = argc > 2 ? argv[2] : "examples/smol-bench/user-schema.json";
    smol_model * m = nullptr;
    if (smol_model_load(model, nullptr, &m) != SMOL_OK) {
        std::fprintf(stderr, "cannot load %s: %s\n", model, smol_last_error());
        return 2;
    }
    std::ifstream f(schema_path);
    const std::string schema((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const auto g =
        std::make_shared<const smol::grammar>(smol::parse_gbnf(smol::json_schema_to_gbnf(schema)));
    const auto v = smol::model_grammar_vocab(*m->m);
    struct walk {
        const char *name, *prefix, *step;
        int states;
    };
    const walk walks[] = {
        {"inside \"name\" (maxLength 30)", "{\"name\": \"", "a", 31},
        {"after a number", "{\"name\": \"Jo\", \"age\": 3", "", 1},
        {"after '{' of \"address\"",
         "{\"name\": \"a\", \"age\": 1, \"role\": \"admin\", \"address\": {", "", 1},
    };
    std::vector<uint8_t> fast;
    int status = 0;
    for (const walk & w : walks) {
        smol::grammar_matcher mt(g);
        if (!mt.accept(w.prefix)) {
            std::fprintf(stderr, "the grammar refuses %s\n", w.prefix);
            return 2;
        }
        double total_us = 0;
        long n_allowed = 0;
        for (int s = 0; s < w.states; ++s) {
            const smol::grammar_matcher base = mt; // nothing of this state known yet
            mt.mask(*v, fast);                     // the first: the vocabulary's run tables made
            smol::grammar_matcher slow = mt;
            for (smol_token t = 0; t < v->n_vocab; ++t) {
                const bool eog = std::find(v->eog.begin(), v->eog.end(), t) != v->eog.end();
                const std::string & piece = v->pieces[size_t(t)];
                const bool want = eog ? slow.complete() : !piece.empty() && slow.allows(piece);
                if (bool(fast[size_t(t)]) != want) {
                    std::fprintf(stderr, "%s, state %d: token %d differs\n", w.name, s, t);
                    status = 1;
                }
                n_allowed += want;
            }
            double best = 1e30;
            for (int r = 0; r < 3; ++r) {
                smol::grammar_matcher fresh = base;
                const auto t0 = std::chrono::steady_clock::now();
                fresh.mask(*v, fast);
                const auto t1 = std::chrono::steady_clock::now();
                best = std::min(best, std::chrono::duration<double, std::micro>(t1 - t0).count());
            }
            total_us += best;
            if (w.step[0] && !mt.accept(w.step)) break;
        }
        std::printf("%-40s %3d states  %8.1f us a mask  %7.0f tokens allowed a state\n", w.name,
                    w.states, total_us / w.states, double(n_allowed) / w.states);
    }
    smol_model_free(m);
    return status;
}
