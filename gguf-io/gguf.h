// gguf.h - GGUF v3 reading and writing. The reader maps a file, parses every
// metadata value (arrays too) and tensor info, honours general.alignment and
// checks every count, offset and size against the file before use; anything
// wrong throws gguf::error naming the file and the problem. The writer lays
// out a file that reads back identical. No model knowledge lives here.

#ifndef SMOL_GGUF_H
#define SMOL_GGUF_H

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace gguf {

// Thrown for every problem with a file; what() names the file and the fault.
struct error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Metadata value types, numbered as in the GGUF specification.
enum class type : uint32_t {
    UINT8 = 0,
    INT8 = 1,
    UINT16 = 2,
    INT16 = 3,
    UINT32 = 4,
    INT32 = 5,
    FLOAT32 = 6,
    BOOL = 7,
    STRING = 8,
    ARRAY = 9,
    UINT64 = 10,
    INT64 = 11,
    FLOAT64 = 12,
};
const char * type_name(type t); // "uint8", ..., "array"; "unknown" otherwise

// One metadata value. Scalars are kept widened: integers in i (signed) or
// u (unsigned), floats in f, with t saying the stored type so a written file
// keeps it.
struct value {
    type t = type::UINT8;
    type elem = type::UINT8; // element type when t == ARRAY
    uint64_t u = 0;
    int64_t i = 0;
    double f = 0;
    bool b = false;
    std::string str;        // t == STRING
    std::vector<value> arr; // t == ARRAY (every element of type elem)

    static value make_u32(uint32_t v);
    static value make_i32(int32_t v);
    static value make_u64(uint64_t v);
    static value make_f32(float v);
    static value make_bool(bool v);
    static value make_str(std::string v);
    static value make_array(type elem, std::vector<value> items);
    static value make_str_array(const std::vector<std::string> & items);

    bool is_integer() const; // any of the 8 integer types
    bool is_float() const;   // FLOAT32 or FLOAT64
    bool operator==(const value & o) const;
};

struct kv {
    std::string key;
    value val;
};

// Tensor element types (ggml's ids): how many elements a block holds and how
// many bytes it takes. Known for every type GGUF defines, so sizes can be
// validated even for types a model loader will refuse.
struct tensor_type_traits {
    const char * name; // "f32", "q4_1", ...
    uint32_t block_elems;
    uint32_t block_bytes;
};
// nullptr for an id GGUF does not define.
const tensor_type_traits * tensor_type_info(uint32_t ggml_type);

constexpr int max_dims = 4;

struct tensor_info {
    std::string name;
    uint32_t n_dims = 0;
    int64_t ne[max_dims] = {1, 1, 1, 1}; // elements per dimension, 0 fastest
    uint32_t type = 0;                   // ggml type id
    uint64_t offset = 0;                 // from the start of the data section
    uint64_t nbytes = 0;
    const void * data = nullptr; // inside the mapped file (reader only)

    int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

// A GGUF file opened for reading: mapped (or read into memory), parsed and
// validated. Tensor data stays in the mapping; the object owns it.
class file {
  public:
    // Throws gguf::error for a missing, truncated, corrupt, hostile or
    // unsupported-version file; the message names path and fault.
    static std::unique_ptr<file> open(const std::string & path, bool use_mmap = true);
    ~file();
    file(const file &) = delete;
    file & operator=(const file &) = delete;

    const std::string & path() const { return path_; }
    uint32_t version() const { return version_; }
    uint64_t alignment() const { return alignment_; }
    uint64_t size() const { return size_; }
    uint64_t data_offset() const { return data_offset_; }

    const std::vector<kv> & metadata() const { return kvs_; }
    const value * find(std::string_view key) const; // nullptr if absent

    // Typed look-ups: std::nullopt if the key is absent; gguf::error naming
    // the key if present with an incompatible type (integers convert to
    // wider or equal integers when the value fits, and to floats).
    std::optional<uint64_t> get_u64(std::string_view key) const;
    std::optional<int64_t> get_i64(std::string_view key) const;
    std::optional<double> get_f64(std::string_view key) const;
    std::optional<bool> get_bool(std::string_view key) const;
    std::optional<std::string> get_str(std::string_view key) const;
    // An array of strings; nullptr if absent, gguf::error if another type.
    const std::vector<value> * get_array(std::string_view key, type elem) const;

    const std::vector<tensor_info> & tensors() const { return tensors_; }
    const tensor_info * find_tensor(std::string_view name) const; // nullptr if absent

  private:
    file() = default;
    std::string path_;
    uint32_t version_ = 0;
    uint64_t alignment_ = 32;
    uint64_t size_ = 0;
    uint64_t data_offset_ = 0;
    std::vector<kv> kvs_;
    std::vector<tensor_info> tensors_;
    const uint8_t * base_ = nullptr;
    bool mapped_ = false;
    std::vector<uint8_t> owned_; // when not mapped
};

// Builds and writes a GGUF v3 file. Keys keep their insertion order; setting
// a key again replaces its value. Tensor data is referenced, not copied, until
// write(), or produced during write() by a row source; general.alignment (if
// set) decides the padding.
class writer {
  public:
    // Fills dst with rows [row0, row0 + n_rows) of a tensor (a row is ne[0]
    // elements in the tensor's type, so quantized blocks never straddle it).
    using row_source = std::function<void(uint64_t row0, uint64_t n_rows, void * dst)>;

    void set(std::string key, value v);
    // ne has n_dims entries (1..4); nbytes must match type and shape.
    void add_tensor(std::string name, uint32_t ggml_type, const std::vector<int64_t> & ne,
                    const void * data, uint64_t nbytes);
    // A tensor whose data write() asks for, a few MiB of rows at a time, so
    // a file larger than memory can be written without holding it.
    void add_tensor(std::string name, uint32_t ggml_type, const std::vector<int64_t> & ne,
                    row_source source);
    // Writes to path (through a temporary file renamed into place, so a
    // failure never leaves half a file). Throws gguf::error.
    void write(const std::string & path) const;

  private:
    struct pending {
        tensor_info info;
        const void * data;
        row_source source; // set when data is null and the tensor is not empty
    };
    tensor_info check_tensor(std::string name, uint32_t ggml_type,
                             const std::vector<int64_t> & ne) const;
    std::vector<kv> kvs_;
    std::vector<pending> tensors_;
};

} // namespace gguf

#endif // SMOL_GGUF_H
