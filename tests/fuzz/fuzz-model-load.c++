// fuzz-model-load.c++ - libFuzzer target: any bytes as a model file through
// smol_model_load (the GGUF reader, the llama loader's metadata and tensor
// checks, the tokenizer's tables). A file that loads is asked for its info
// and tokenizes a short text; a refused one must leave a message. A crash, a
// sanitizer report, an allocation past -malloc_limit_mb or a hang is a
// defect.

#include "fuzz-input.h"
#include "smol.h"

#include <cstdint>
#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::string & path = fuzz::as_file(data, size, "model");
    smol_model_params p = smol_model_default_params();
    p.use_mmap = size % 2 == 0;
    smol_model * m = nullptr;
    if (smol_model_load(path.c_str(), &p, &m) != SMOL_OK) {
        if (m != nullptr || std::strlen(smol_last_error()) == 0) __builtin_trap();
        return 0;
    }
    smol_model_info info;
    smol_model_get_info(m, &info);
    smol_token tokens[64];
    int32_t n = 0;
    const char text[] = "Hello, world! <|im_start|>user";
    (void)smol_tokenize(m, text, sizeof text - 1, true, true, tokens, 64, &n);
    smol_model_free(m);
    return 0;
}
