// safetensors.h - a safetensors file mapped read-only: its JSON header
// parsed and every entry checked against the file before any byte of data
// is read (dtype, shape, data_offsets inside the data section, sizes that
// agree with dtype and shape, no two tensors overlapping). Anything wrong
// throws convert_error naming the file, the tensor and the field.

#ifndef SMOL_CONVERT_SAFETENSORS_H
#define SMOL_CONVERT_SAFETENSORS_H

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace smol::convert {

// Every failure of a conversion; what() names the file and the field.
struct convert_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The element types a checkpoint's weights can be converted from.
enum class st_dtype { F32, F16, BF16 };
const char * st_dtype_name(st_dtype t); // "F32", "F16", "BF16"
size_t st_dtype_size(st_dtype t);

struct st_tensor {
    std::string name;
    st_dtype dtype = st_dtype::F32;
    std::vector<int64_t> shape;     // outermost first, as the file (and torch) give it
    const uint8_t * data = nullptr; // inside the mapping; no alignment is promised
    uint64_t nbytes = 0;
    int64_t n_elements() const;
};

class st_file {
  public:
    // Throws convert_error for a missing, truncated or lying file.
    static std::unique_ptr<st_file> open(const std::string & path);
    ~st_file();
    st_file(const st_file &) = delete;
    st_file & operator=(const st_file &) = delete;

    const std::string & path() const { return path_; }
    uint64_t size() const { return size_; }
    // Sorted by name.
    const std::vector<st_tensor> & tensors() const { return tensors_; }

  private:
    st_file() = default;
    std::string path_;
    const uint8_t * base_ = nullptr;
    uint64_t size_ = 0;
    std::vector<st_tensor> tensors_;
};

} // namespace smol::convert

#endif // SMOL_CONVERT_SAFETENSORS_H
