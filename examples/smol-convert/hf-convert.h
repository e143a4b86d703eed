// hf-convert.h - a Hugging Face Llama or Gemma 3 model directory
// (config.json, safetensors weights in one file or in shards named by
// model.safetensors.index.json, tokenizer.json or tokenizer.model,
// tokenizer_config.json) to a GGUF file that llama.cpp and smol load:
// tensor names, metadata keys and their order as llama.cpp's
// convert_hf_to_gguf.py writes them, Llama's Q and K rows permuted from
// HF's half-split RoPE to GGUF's interleaved one, Gemma's norm weights
// shifted by one, and every matmul weight written in the type a llama.cpp
// file type gives it (smol-recipe.h), in the same pass: f32, f16, bf16 and
// q8_0 files as convert_hf_to_gguf.py writes them, the other types as
// llama-quantize writes its requantization of convert_hf_to_gguf.py's f32
// file. Everything is read and checked before the output is written
// (through a temporary file), so a bad input never leaves a file behind.

#ifndef SMOL_CONVERT_HF_CONVERT_H
#define SMOL_CONVERT_HF_CONVERT_H

#include "safetensors.h"
#include "smol-recipe.h"
#include "smol.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace smol::convert {

// The architectures (config.json "architectures") that convert.
std::string supported_architectures(); // "LlamaForCausalLM, Gemma3ForCausalLM"

// What is reported of each tensor once it is written.
struct tensor_report {
    std::string name;        // in the GGUF file: "blk.0.attn_q.weight"
    std::string source;      // in the checkpoint: "model.layers.0.self_attn.q_proj.weight"
    std::vector<int64_t> ne; // GGUF order, fastest first
    st_dtype type_in;
    smol_type type_out;
    bool fell_back; // rows no multiple of the recipe's block: its fallback type
    uint64_t bytes_in, bytes_out;
    size_t index, count;
};

struct options {
    std::string model_dir;
    std::string out_path;
    const smol::recipe * to = nullptr; // null: F16
    std::string name;                  // general.name; empty: the directory's name
    std::string pre;                   // tokenizer.ggml.pre; empty: recognised from tokenizer.json
    int n_threads = 1;
    std::function<void(const tensor_report &)> on_tensor;
};

struct summary {
    std::string architecture; // as config.json names it
    size_t n_tensors = 0;
    uint64_t n_params = 0;
    uint64_t bytes_in = 0, bytes_out = 0;
};

// Converts o.model_dir to o.out_path. Throws convert_error naming the file
// and the field at fault (and gguf::error for a failed write).
summary convert_model(const options & o);

} // namespace smol::convert

#endif // SMOL_CONVERT_HF_CONVERT_H
