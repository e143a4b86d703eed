// random-model.h - writes GGUF files with seeded random weights of
// SmolLM2's exact shapes (135M, 360M, 1.7B, architecture llama) and Gemma 3
// 270M's (gemma3-270m), for benchmarks of sizes and machines the real
// weights cannot reach. The tokenizer metadata is copied from a real
// file (or, without one, a small byte-level vocabulary is made up), so
// smol, llama.cpp and HF transformers load the result like a real model.
// The data is produced row by row while the file is written: a 3.4 GB f16
// file never sits in memory.

#ifndef SMOL_RANDOM_MODEL_H
#define SMOL_RANDOM_MODEL_H

#include "gguf.h"
#include "smol-recipe.h"
#include "smol.h"

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace smol::random_model {

struct shape {
    std::string name; // "135M", "360M", "1.7B", or anything for a custom shape
    int n_vocab = 49152;
    int n_embd = 576;
    int n_layer = 30;
    int n_head = 9;
    int n_head_kv = 3;
    int n_ff = 1536;
    int n_ctx = 8192;
    float rope_base = 100000.0f;
    float eps = 1e-5f;
    // Gemma 3 (architecture gemma3): heads of their own size, a sliding
    // window on five layers of six with their own rope base.
    bool gemma = false;
    int head_dim = 0; // 0: n_embd / n_head
    int n_swa = 0;
    float rope_base_swa = 10000.0f;
};

// SmolLM2-135M, -360M and -1.7B and Gemma 3 270M as their config.json
// files give them (all with tied embeddings); nullptr for another name.
const shape * find_shape(std::string_view name);
std::string shape_names(); // "135M, 360M, 1.7B"

// llama.cpp's llama_ftype for a file whose matmul weights are of type t.
uint32_t llama_ftype(smol_type t);

struct options {
    shape s;
    smol_type type = SMOL_TYPE_F16; // of every 2-D weight; norms stay f32
    // A llama.cpp file type whose rules choose each weight's type instead
    // (smol-recipe.h), as llama-quantize would for the same model.
    const smol::recipe * mix = nullptr;
    uint64_t seed = 1;
    float std = 0.02f; // of the weights (norms are 1 + std * noise)
    // Where the tokenizer.* metadata comes from; null: a made-up
    // byte-level vocabulary of s.n_vocab tokens.
    const gguf::file * vocab_from = nullptr;
    int n_threads = 1;
    // Called after each chunk of rows with the tensor being written, its
    // index and count, and the bytes of tensor data written so far and in all.
    std::function<void(const std::string & tensor, size_t index, size_t n_tensors,
                       uint64_t bytes_done, uint64_t bytes_total)>
        progress;
};

// Writes the model to path (through a temporary file renamed into place).
// Throws gguf::error for I/O problems and std::invalid_argument for a shape
// or vocabulary that does not fit.
void write(const std::string & path, const options & o);

} // namespace smol::random_model

#endif // SMOL_RANDOM_MODEL_H
