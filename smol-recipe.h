// smol-recipe.h - quantization recipes: the type each tensor of a model gets
// in a file of a llama.cpp file type ("Q4_K_M", "Q6_K", "IQ4_XS", ...), by
// llama.cpp's llama-quantize rules (more bits for some attn_v and ffn_down
// layers, the embeddings and output by their own rule, and the fallbacks
// for rows that are no multiple of a type's block), and the writing of such
// a file, which smol_model_quantize and smol-quantize run.

#ifndef SMOL_RECIPE_H
#define SMOL_RECIPE_H

#include "gguf.h"
#include "smol.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace smol {

struct recipe {
    const char * name; // as llama-quantize names it: "Q4_K_M"
    uint32_t ftype;    // llama.cpp's llama_ftype, written as general.file_type
    smol_type base;    // the type of most matmul weights
};
// The recipe of a name (any case; "Q4_K" is Q4_K_M, "Q3_K" Q3_K_M and "Q5_K"
// Q5_K_M, as llama-quantize reads them), or nullptr.
const recipe * find_recipe(const std::string & name);
// "F32, F16, BF16, Q8_0, ..." for messages.
std::string recipe_names();

// What the rules read of a model besides its tensors.
struct recipe_model {
    int32_t n_layer = 0;
    int32_t n_head = 0, n_head_kv = 0;
};

// A tensor as the rules see it.
struct tensor_desc {
    std::string name;
    uint32_t n_dims;
    int64_t ne0;    // elements a row
    smol_type type; // as it is now
};
struct tensor_choice {
    smol_type type;
    bool fell_back; // the recipe's type does not fit the rows: a fallback
};
// The type of each tensor, in the given order, under recipe r.
std::vector<tensor_choice> choose_types(const recipe & r, const std::vector<tensor_desc> & ts,
                                        const recipe_model & m);

// The order llama-quantize takes and writes tensors in: non-layer tensors
// first, then by layer number, then by name (indices into ts).
std::vector<size_t> quantize_order(const std::vector<tensor_desc> & ts);

// What quantize_model reports of each tensor as it is written.
struct quantized_tensor {
    const gguf::tensor_info * in;
    smol_type type;
    bool fell_back;
    uint64_t bytes_out;
    size_t index, count;
};

// Writes in_path's model to out_path with recipe r: matmul weights through
// f32 into the chosen types (rows spread over n_threads), 1-D tensors in
// f32, the rest as they are, the metadata with general.file_type set.
// Throws smol::error naming the tensor a conversion cannot read.
void quantize_model(const std::string & in_path, const std::string & out_path, const recipe & r,
                    int n_threads, const std::function<void(const quantized_tensor &)> & on_tensor);

} // namespace smol

#endif // SMOL_RECIPE_H
