// gguf.c++ - GGUF v3 reading and writing (see gguf.h). The reader trusts
// nothing in the file: every count, length, offset and size is checked
// against the bytes that remain before anything is allocated or looped over,
// so a truncated or hostile file ends in a gguf::error, never a crash or a
// huge allocation. The writer produces the layout ggml and llama.cpp expect.

#include "gguf.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <iterator>
#include <limits>
#include <sys/mman.h>
#include <sys/stat.h>
#include <type_traits>
#include <unistd.h>
#include <unordered_set>

// GGUF is little-endian and values are copied straight out of the mapping.
static_assert(std::endian::native == std::endian::little, "gguf-io assumes a little-endian host");

namespace gguf {

namespace {

constexpr uint8_t magic[4] = {'G', 'G', 'U', 'F'};
constexpr uint32_t supported_version = 3;
constexpr uint64_t default_alignment = 32;
constexpr uint32_t n_value_types = 13;
// ggml keeps tensor names in a 64-byte buffer, so llama.cpp rejects longer
// ones; the writer refuses them so that what smol writes loads there.
constexpr size_t max_written_name = 63;
// Nested arrays recurse; a hostile file could nest them millions deep (12
// bytes a level) and overflow the stack. No real file nests at all.
constexpr int max_array_depth = 64;

// --- message formatting --------------------------------------------------

void append(std::string & s, std::string_view v) {
    s.append(v);
}
void append(std::string & s, const char * v) {
    s.append(v);
}
void append(std::string & s, const std::string & v) {
    s.append(v);
}
void append(std::string & s, char v) {
    s.push_back(v);
}
template <class T>
requires std::is_integral_v<T>
void append(std::string & s, T v) {
    s.append(std::to_string(v));
}

template <class... A> std::string cat(const A &... a) {
    std::string s;
    (append(s, a), ...);
    return s;
}

// Bytes a value of type t takes at the least: lets an array's element count
// be checked against the bytes left before it is believed.
uint64_t min_value_bytes(type t) {
    switch (t) {
    case type::UINT8:
    case type::INT8:
    case type::BOOL:
        return 1;
    case type::UINT16:
    case type::INT16:
        return 2;
    case type::UINT32:
    case type::INT32:
    case type::FLOAT32:
        return 4;
    case type::UINT64:
    case type::INT64:
    case type::FLOAT64:
    case type::STRING:
        return 8; // the length, for an empty string
    case type::ARRAY:
        return 12; // element type and count, for an empty array
    }
    return 1;
}

bool is_signed_integer(type t) {
    return t == type::INT8 || t == type::INT16 || t == type::INT32 || t == type::INT64;
}

bool is_unsigned_integer(type t) {
    return t == type::UINT8 || t == type::UINT16 || t == type::UINT32 || t == type::UINT64;
}

// The representable range of an integer value type, widened.
void integer_range(type t, int64_t & lo, uint64_t & hi) {
    switch (t) {
    case type::UINT8:
        lo = 0, hi = UINT8_MAX;
        break;
    case type::INT8:
        lo = INT8_MIN, hi = INT8_MAX;
        break;
    case type::UINT16:
        lo = 0, hi = UINT16_MAX;
        break;
    case type::INT16:
        lo = INT16_MIN, hi = INT16_MAX;
        break;
    case type::UINT32:
        lo = 0, hi = UINT32_MAX;
        break;
    case type::INT32:
        lo = INT32_MIN, hi = INT32_MAX;
        break;
    case type::UINT64:
        lo = 0, hi = UINT64_MAX;
        break;
    default:
        lo = INT64_MIN, hi = INT64_MAX;
        break;
    }
}

std::string describe(const value & v) {
    if (is_unsigned_integer(v.t)) return cat(type_name(v.t), ' ', v.u);
    if (is_signed_integer(v.t)) return cat(type_name(v.t), ' ', v.i);
    if (v.t == type::ARRAY) return cat("array of ", type_name(v.elem));
    return type_name(v.t);
}

bool is_pow2(uint64_t x) {
    return x != 0 && (x & (x - 1)) == 0;
}

// --- tensor types ----------------------------------------------------------

// ggml's type ids with their block sizes (ggml.c type_traits); the gaps are
// ids ggml has retired, which GGUF files must not use.
constexpr tensor_type_traits tensor_types[] = {
    {"f32", 1, 4},        // 0
    {"f16", 1, 2},        // 1
    {"q4_0", 32, 18},     // 2
    {"q4_1", 32, 20},     // 3
    {nullptr, 0, 0},      // 4 q4_2, removed
    {nullptr, 0, 0},      // 5 q4_3, removed
    {"q5_0", 32, 22},     // 6
    {"q5_1", 32, 24},     // 7
    {"q8_0", 32, 34},     // 8
    {"q8_1", 32, 40},     // 9
    {"q2_K", 256, 84},    // 10
    {"q3_K", 256, 110},   // 11
    {"q4_K", 256, 144},   // 12
    {"q5_K", 256, 176},   // 13
    {"q6_K", 256, 210},   // 14
    {"q8_K", 256, 292},   // 15
    {"iq2_xxs", 256, 66}, // 16
    {"iq2_xs", 256, 74},  // 17
    {"iq3_xxs", 256, 98}, // 18
    {"iq1_s", 256, 50},   // 19
    {"iq4_nl", 32, 18},   // 20
    {"iq3_s", 256, 110},  // 21
    {"iq2_s", 256, 82},   // 22
    {"iq4_xs", 256, 136}, // 23
    {"i8", 1, 1},         // 24
    {"i16", 1, 2},        // 25
    {"i32", 1, 4},        // 26
    {"i64", 1, 8},        // 27
    {"f64", 1, 8},        // 28
    {"iq1_m", 256, 56},   // 29
    {"bf16", 1, 2},       // 30
    {nullptr, 0, 0},      // 31 q4_0_4_4, removed from GGUF files
    {nullptr, 0, 0},      // 32 q4_0_4_8, removed
    {nullptr, 0, 0},      // 33 q4_0_8_8, removed
    {"tq1_0", 256, 54},   // 34
    {"tq2_0", 256, 66},   // 35
    {nullptr, 0, 0},      // 36 iq4_nl_4_4, removed
    {nullptr, 0, 0},      // 37 iq4_nl_4_8, removed
    {nullptr, 0, 0},      // 38 iq4_nl_8_8, removed
    {"mxfp4", 32, 17},    // 39
};

// Bytes of a tensor of the given type and shape, or false if ne is negative,
// not a whole number of blocks, or the size overflows. why says which.
bool tensor_nbytes(const tensor_type_traits & tt, uint32_t n_dims, const int64_t * ne,
                   uint64_t & nbytes, std::string & why) {
    int64_t n = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
        if (ne[d] < 0) {
            why = cat("has a negative size ne[", d, "] = ", ne[d]);
            return false;
        }
        if (__builtin_mul_overflow(n, ne[d], &n)) {
            why = "has more elements than fit in 64 bits (its sizes multiply past 2^63)";
            return false;
        }
    }
    if (ne[0] % tt.block_elems != 0) {
        why = cat("has ne[0] = ", ne[0], ", which is not a multiple of ", tt.name, "'s block of ",
                  tt.block_elems, " elements");
        return false;
    }
    const uint64_t blocks = static_cast<uint64_t>(n) / tt.block_elems;
    if (__builtin_mul_overflow(blocks, uint64_t{tt.block_bytes}, &nbytes)) {
        why = "takes more bytes than fit in 64 bits";
        return false;
    }
    return true;
}

// --- the reader -------------------------------------------------------------

// A cursor over the file's bytes. Every read checks the bytes left first;
// failures name the file, what was being read and where.
class parser {
  public:
    parser(const std::string & path, const uint8_t * base, uint64_t size)
        : path_(path), base_(base), size_(size) {}

    uint64_t pos() const { return pos_; }
    uint64_t left() const { return size_ - pos_; }
    void context(std::string c) { ctx_ = std::move(c); }

    [[noreturn]] void fail(const std::string & msg) const {
        throw error(ctx_.empty() ? cat(path_, ": ", msg) : cat(path_, ": ", ctx_, ": ", msg));
    }

    void need(uint64_t n, const char * what) const {
        if (n > left()) {
            fail(cat("the file ends inside ", what, " at byte ", pos_, " (", n, " bytes needed, ",
                     left(), " left of ", size_, "); the file is truncated — download it again"));
        }
    }

    template <class T> T read(const char * what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, base_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }

    std::string_view read_string(const char * what) {
        const uint64_t start = pos_;
        const uint64_t len = read<uint64_t>(what);
        if (len > left()) {
            fail(cat(what, " at byte ", start, " claims a length of ", len, " bytes but only ",
                     left(), " bytes of the file (", size_,
                     " bytes) remain; the file is truncated or corrupt"));
        }
        std::string_view s(reinterpret_cast<const char *>(base_ + pos_), len);
        pos_ += len;
        return s;
    }

    type read_type(const char * what) {
        const uint64_t at = pos_;
        const uint32_t t = read<uint32_t>(what);
        if (t >= n_value_types) {
            fail(cat("unknown value type ", t, " at byte ", at,
                     " (GGUF defines 0 to 12); the file is corrupt"));
        }
        return static_cast<type>(t);
    }

    void read_value(type t, value & v, int depth) {
        v.t = t;
        switch (t) {
        case type::UINT8:
            v.u = read<uint8_t>("a uint8 value");
            break;
        case type::INT8:
            v.i = read<int8_t>("an int8 value");
            break;
        case type::UINT16:
            v.u = read<uint16_t>("a uint16 value");
            break;
        case type::INT16:
            v.i = read<int16_t>("an int16 value");
            break;
        case type::UINT32:
            v.u = read<uint32_t>("a uint32 value");
            break;
        case type::INT32:
            v.i = read<int32_t>("an int32 value");
            break;
        case type::UINT64:
            v.u = read<uint64_t>("a uint64 value");
            break;
        case type::INT64:
            v.i = read<int64_t>("an int64 value");
            break;
        case type::FLOAT32:
            v.f = read<float>("a float32 value");
            break;
        case type::FLOAT64:
            v.f = read<double>("a float64 value");
            break;
        case type::BOOL: {
            const uint8_t b = read<uint8_t>("a bool value");
            if (b > 1) fail(cat("bool value at byte ", pos_ - 1, " is ", b, " (must be 0 or 1)"));
            v.b = b != 0;
            break;
        }
        case type::STRING:
            v.str = read_string("a string value");
            break;
        case type::ARRAY:
            read_array(v, depth);
            break;
        }
    }

    void read_array(value & v, int depth) {
        if (depth >= max_array_depth) {
            fail(cat("arrays are nested more than ", max_array_depth,
                     " deep; the file is corrupt or hostile"));
        }
        const uint64_t start = pos_;
        v.elem = read_type("an array's element type");
        const uint64_t count = read<uint64_t>("an array's element count");
        const uint64_t each = min_value_bytes(v.elem);
        if (count > left() / each) {
            fail(cat("array at byte ", start, " claims ", count, " elements of type ",
                     type_name(v.elem), " (at least ", each, " bytes each) but only ", left(),
                     " bytes of the file remain; the file is truncated or corrupt"));
        }
        v.arr.resize(count);
        for (value & e : v.arr) read_value(v.elem, e, depth + 1);
    }

  private:
    const std::string & path_;
    const uint8_t * base_;
    uint64_t size_;
    uint64_t pos_ = 0;
    std::string ctx_;
};

std::string errno_text() {
    return std::strerror(errno);
}

// What parse() finds, moved into the file object by file::open.
struct parsed {
    uint32_t version = 0;
    uint64_t alignment = default_alignment;
    uint64_t data_offset = 0;
    std::vector<kv> kvs;
    std::vector<tensor_info> tensors;
};

parsed parse(const std::string & path, const uint8_t * base, uint64_t size) {
    parser p(path, base, size);
    parsed r;

    if (size < 4 || std::memcmp(base, magic, 4) != 0) {
        std::string seen;
        for (uint64_t k = 0; k < std::min<uint64_t>(size, 4); ++k) {
            const uint8_t c = base[k];
            if (c >= 0x20 && c < 0x7f)
                seen += static_cast<char>(c);
            else
                seen += cat("\\x", int(c));
        }
        p.fail(cat("not a GGUF file: it starts with \"", seen,
                   "\" where the magic \"GGUF\" should be"));
    }
    p.read<uint32_t>("the magic");

    r.version = p.read<uint32_t>("the version");
    if (r.version != supported_version) {
        const char * hint = "";
        if (__builtin_bswap32(r.version) == supported_version) {
            hint = " (this looks like a big-endian GGUF file)";
        } else if (r.version < supported_version) {
            hint = "; convert the model again with a current llama.cpp";
        }
        p.fail(cat("GGUF version ", r.version, " is not supported; smol reads GGUF v3 only", hint));
    }

    const uint64_t n_tensors = p.read<uint64_t>("the tensor count");
    const uint64_t n_kvs = p.read<uint64_t>("the metadata count");

    // A key-value pair takes at least 13 bytes (key length, type, one byte of
    // value); a tensor info at least 32 (name length, n_dims, one ne, type,
    // offset). Counts the file could not hold are rejected before allocating.
    if (n_kvs > p.left() / 13) {
        p.fail(cat("the header claims ", n_kvs, " metadata keys but only ", p.left(),
                   " bytes follow (at least 13 bytes each); the file is truncated or corrupt"));
    }
    if (n_tensors > p.left() / 32) {
        p.fail(cat("the header claims ", n_tensors, " tensors but only ", p.left(),
                   " bytes follow (at least 32 bytes each); the file is truncated or corrupt"));
    }

    // Views into the file's bytes, which stay put while the vectors grow.
    std::unordered_set<std::string_view> seen;
    seen.reserve(n_kvs);
    r.kvs.resize(n_kvs);
    for (uint64_t k = 0; k < n_kvs; ++k) {
        p.context(cat("metadata key #", k));
        const std::string_view key = p.read_string("a metadata key");
        p.context(cat("key '", key, "'"));
        if (!seen.insert(key).second) p.fail("duplicate key; each key may appear only once");
        r.kvs[k].key = key;
        p.read_value(p.read_type("a value type"), r.kvs[k].val, 0);
    }

    for (const kv & e : r.kvs) {
        if (e.key != "general.alignment") continue;
        p.context("key 'general.alignment'");
        const value & a = e.val;
        if (!a.is_integer()) p.fail(cat("is a ", describe(a), ", not an integer"));
        const bool negative = is_signed_integer(a.t) && a.i < 0;
        const uint64_t align = is_signed_integer(a.t) ? static_cast<uint64_t>(a.i) : a.u;
        if (negative || !is_pow2(align)) {
            p.fail(cat("is ", describe(a), ", but the alignment must be a nonzero power of two"));
        }
        r.alignment = align;
    }

    seen.clear();
    seen.reserve(n_tensors);
    r.tensors.resize(n_tensors);
    for (uint64_t k = 0; k < n_tensors; ++k) {
        tensor_info & ti = r.tensors[k];
        p.context(cat("tensor info #", k));
        const std::string_view name = p.read_string("a tensor name");
        p.context(cat("tensor '", name, "'"));
        if (!seen.insert(name).second) {
            p.fail("duplicate tensor name; each tensor may appear only once");
        }
        ti.name = name;
        ti.n_dims = p.read<uint32_t>("the tensor's n_dims");
        if (ti.n_dims < 1 || ti.n_dims > max_dims) {
            p.fail(cat("has n_dims = ", ti.n_dims, "; GGUF tensors have 1 to ", max_dims,
                       " dimensions"));
        }
        for (uint32_t d = 0; d < ti.n_dims; ++d) ti.ne[d] = p.read<int64_t>("the tensor's shape");
        ti.type = p.read<uint32_t>("the tensor's type");
        const tensor_type_traits * tt = tensor_type_info(ti.type);
        if (!tt) p.fail(cat("has unknown tensor type ", ti.type, " (not a ggml type id)"));
        std::string why;
        if (!tensor_nbytes(*tt, ti.n_dims, ti.ne, ti.nbytes, why)) {
            p.fail(cat("the ", tt->name, " tensor ", why));
        }
        ti.offset = p.read<uint64_t>("the tensor's offset");
        if (ti.offset % r.alignment != 0) {
            p.fail(cat("data offset ", ti.offset, " is not a multiple of the alignment ",
                       r.alignment, "; the file is corrupt"));
        }
    }
    p.context("");

    // The data section starts at the next aligned byte after the infos.
    const uint64_t pad = (r.alignment - p.pos() % r.alignment) % r.alignment;
    r.data_offset = p.pos() + std::min(pad, p.left());
    if (n_tensors == 0) return r; // nothing follows, so the padding may be absent
    if (pad > p.left()) {
        p.fail(cat("the tensor data section should start at byte ", p.pos() + pad,
                   ", past the end of the file (", size,
                   " bytes); the file is truncated — download it again"));
    }

    const uint64_t data_size = size - r.data_offset;
    for (tensor_info & ti : r.tensors) {
        if (ti.offset > data_size) {
            throw error(cat(path, ": tensor '", ti.name, "' data offset ", ti.offset,
                            " lies past the end of the file (", size, " bytes, of which ",
                            data_size, " are tensor data); the file is truncated or corrupt"));
        }
        const uint64_t start = r.data_offset + ti.offset;
        if (ti.nbytes > data_size - ti.offset) {
            uint64_t end = 0;
            const std::string to = __builtin_add_overflow(start, ti.nbytes, &end)
                                       ? cat(start, " + ", ti.nbytes)
                                       : cat(end);
            throw error(cat(path, ": tensor '", ti.name, "' data [", start, ", ", to,
                            ") extends past the end of the file (", size,
                            " bytes); the file is truncated — download it again"));
        }
        ti.data = base + start;
    }

    // Zero-byte tensors occupy nothing, so they cannot overlap anything.
    std::vector<const tensor_info *> order;
    order.reserve(r.tensors.size());
    for (const tensor_info & ti : r.tensors) {
        if (ti.nbytes > 0) order.push_back(&ti);
    }
    std::sort(order.begin(), order.end(),
              [](const tensor_info * a, const tensor_info * b) { return a->offset < b->offset; });
    for (size_t k = 1; k < order.size(); ++k) {
        const tensor_info & a = *order[k - 1];
        const tensor_info & b = *order[k];
        if (a.offset + a.nbytes > b.offset) {
            const uint64_t at = r.data_offset;
            throw error(cat(path, ": the data of tensors '", a.name, "' [", at + a.offset, ", ",
                            at + a.offset + a.nbytes, ") and '", b.name, "' [", at + b.offset, ", ",
                            at + b.offset + b.nbytes, ") overlap; the file is corrupt"));
        }
    }
    return r;
}

} // namespace

// --- values -------------------------------------------------------------------

const char * type_name(type t) {
    switch (t) {
    case type::UINT8:
        return "uint8";
    case type::INT8:
        return "int8";
    case type::UINT16:
        return "uint16";
    case type::INT16:
        return "int16";
    case type::UINT32:
        return "uint32";
    case type::INT32:
        return "int32";
    case type::FLOAT32:
        return "float32";
    case type::BOOL:
        return "bool";
    case type::STRING:
        return "string";
    case type::ARRAY:
        return "array";
    case type::UINT64:
        return "uint64";
    case type::INT64:
        return "int64";
    case type::FLOAT64:
        return "float64";
    }
    return "unknown";
}

value value::make_u32(uint32_t v) {
    value r;
    r.t = type::UINT32;
    r.u = v;
    return r;
}

value value::make_i32(int32_t v) {
    value r;
    r.t = type::INT32;
    r.i = v;
    return r;
}

value value::make_u64(uint64_t v) {
    value r;
    r.t = type::UINT64;
    r.u = v;
    return r;
}

value value::make_f32(float v) {
    value r;
    r.t = type::FLOAT32;
    r.f = v;
    return r;
}

value value::make_bool(bool v) {
    value r;
    r.t = type::BOOL;
    r.b = v;
    return r;
}

value value::make_str(std::string v) {
    value r;
    r.t = type::STRING;
    r.str = std::move(v);
    return r;
}

value value::make_array(type elem, std::vector<value> items) {
    value r;
    r.t = type::ARRAY;
    r.elem = elem;
    r.arr = std::move(items);
    return r;
}

value value::make_str_array(const std::vector<std::string> & items) {
    std::vector<value> arr;
    arr.reserve(items.size());
    for (const std::string & s : items) arr.push_back(make_str(s));
    return make_array(type::STRING, std::move(arr));
}

bool value::is_integer() const {
    return is_signed_integer(t) || is_unsigned_integer(t);
}

bool value::is_float() const {
    return t == type::FLOAT32 || t == type::FLOAT64;
}

bool value::operator==(const value & o) const {
    if (t != o.t) return false;
    if (is_unsigned_integer(t)) return u == o.u;
    if (is_signed_integer(t)) return i == o.i;
    switch (t) {
    // NaN equals NaN here: a value read back must equal the one written.
    case type::FLOAT32:
    case type::FLOAT64:
        return f == o.f || (std::isnan(f) && std::isnan(o.f));
    case type::BOOL:
        return b == o.b;
    case type::STRING:
        return str == o.str;
    case type::ARRAY:
        return elem == o.elem && arr == o.arr;
    default:
        return false;
    }
}

const tensor_type_traits * tensor_type_info(uint32_t ggml_type) {
    if (ggml_type >= std::size(tensor_types) || tensor_types[ggml_type].name == nullptr) {
        return nullptr;
    }
    return &tensor_types[ggml_type];
}

// --- file ---------------------------------------------------------------------

std::unique_ptr<file> file::open(const std::string & path, bool use_mmap) {
    std::unique_ptr<file> f(new file());
    f->path_ = path;

    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw error(cat(path, ": cannot open: ", errno_text()));
    struct fd_closer {
        int fd;
        ~fd_closer() { ::close(fd); }
    } closer{fd};

    struct stat st {};
    if (fstat(fd, &st) != 0) throw error(cat(path, ": cannot stat: ", errno_text()));
    if (!S_ISREG(st.st_mode)) throw error(cat(path, ": not a regular file"));
    f->size_ = static_cast<uint64_t>(st.st_size);
    if (f->size_ == 0) {
        throw error(cat(path, ": the file is empty (0 bytes), not a GGUF file; if it is a "
                              "model, download it again"));
    }

    if (use_mmap) {
        void * p = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED)
            throw error(cat(path, ": cannot map ", f->size_, " bytes: ", errno_text()));
        f->base_ = static_cast<const uint8_t *>(p);
        f->mapped_ = true;
    } else {
        f->owned_.resize(f->size_);
        uint64_t done = 0;
        while (done < f->size_) {
            const ssize_t n = ::read(fd, f->owned_.data() + done, f->size_ - done);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) throw error(cat(path, ": cannot read: ", errno_text()));
            if (n == 0) {
                throw error(cat(path, ": the file shrank while being read (", done, " of ",
                                f->size_, " bytes)"));
            }
            done += static_cast<uint64_t>(n);
        }
        f->base_ = f->owned_.data();
    }
    parsed r = parse(path, f->base_, f->size_);
    f->version_ = r.version;
    f->alignment_ = r.alignment;
    f->data_offset_ = r.data_offset;
    f->kvs_ = std::move(r.kvs);
    f->tensors_ = std::move(r.tensors);
    return f;
}

file::~file() {
    if (mapped_) munmap(const_cast<uint8_t *>(base_), size_);
}

const value * file::find(std::string_view key) const {
    for (const kv & e : kvs_) {
        if (e.key == key) return &e.val;
    }
    return nullptr;
}

std::optional<uint64_t> file::get_u64(std::string_view key) const {
    const value * v = find(key);
    if (!v) return std::nullopt;
    if (is_unsigned_integer(v->t)) return v->u;
    if (is_signed_integer(v->t) && v->i >= 0) return static_cast<uint64_t>(v->i);
    if (is_signed_integer(v->t)) {
        throw error(cat(path_, ": key '", key, "' is ", describe(*v),
                        ", which does not fit an unsigned integer"));
    }
    throw error(cat(path_, ": key '", key, "' is a ", describe(*v), ", not an unsigned integer"));
}

std::optional<int64_t> file::get_i64(std::string_view key) const {
    const value * v = find(key);
    if (!v) return std::nullopt;
    if (is_signed_integer(v->t)) return v->i;
    if (is_unsigned_integer(v->t) && v->u <= uint64_t{INT64_MAX}) return static_cast<int64_t>(v->u);
    if (is_unsigned_integer(v->t)) {
        throw error(
            cat(path_, ": key '", key, "' is ", describe(*v), ", which does not fit int64"));
    }
    throw error(cat(path_, ": key '", key, "' is a ", describe(*v), ", not an integer"));
}

std::optional<double> file::get_f64(std::string_view key) const {
    const value * v = find(key);
    if (!v) return std::nullopt;
    if (v->is_float()) return v->f;
    if (is_unsigned_integer(v->t)) return static_cast<double>(v->u);
    if (is_signed_integer(v->t)) return static_cast<double>(v->i);
    throw error(cat(path_, ": key '", key, "' is a ", describe(*v), ", not a number"));
}

std::optional<bool> file::get_bool(std::string_view key) const {
    const value * v = find(key);
    if (!v) return std::nullopt;
    if (v->t != type::BOOL) {
        throw error(cat(path_, ": key '", key, "' is a ", describe(*v), ", not a bool"));
    }
    return v->b;
}

std::optional<std::string> file::get_str(std::string_view key) const {
    const value * v = find(key);
    if (!v) return std::nullopt;
    if (v->t != type::STRING) {
        throw error(cat(path_, ": key '", key, "' is a ", describe(*v), ", not a string"));
    }
    return v->str;
}

const std::vector<value> * file::get_array(std::string_view key, type elem) const {
    const value * v = find(key);
    if (!v) return nullptr;
    if (v->t != type::ARRAY || v->elem != elem) {
        throw error(cat(path_, ": key '", key, "' is a ", describe(*v), ", not an array of ",
                        type_name(elem)));
    }
    return &v->arr;
}

const tensor_info * file::find_tensor(std::string_view name) const {
    for (const tensor_info & t : tensors_) {
        if (t.name == name) return &t;
    }
    return nullptr;
}

// --- writer -------------------------------------------------------------------

namespace {

class byte_sink {
  public:
    std::vector<uint8_t> bytes;

    void put_bytes(const void * p, size_t n) {
        const size_t at = bytes.size();
        bytes.resize(at + n);
        if (n > 0) std::memcpy(bytes.data() + at, p, n);
    }
    template <class T> void put(T v) { put_bytes(&v, sizeof(T)); }
    void put_str(std::string_view s) {
        put<uint64_t>(s.size());
        put_bytes(s.data(), s.size());
    }
};

// Serialises one value; what names it in errors ("key 'x'").
void put_value(byte_sink & out, const value & v, const std::string & what, int depth) {
    if (is_signed_integer(v.t) || is_unsigned_integer(v.t)) {
        int64_t lo;
        uint64_t hi;
        integer_range(v.t, lo, hi);
        const bool fits = is_unsigned_integer(v.t) ? v.u <= hi : (v.i >= lo && v.i <= int64_t(hi));
        if (!fits) {
            throw error(cat(what, ": ", describe(v), " does not fit its type"));
        }
    }
    switch (v.t) {
    case type::UINT8:
        out.put(static_cast<uint8_t>(v.u));
        break;
    case type::INT8:
        out.put(static_cast<int8_t>(v.i));
        break;
    case type::UINT16:
        out.put(static_cast<uint16_t>(v.u));
        break;
    case type::INT16:
        out.put(static_cast<int16_t>(v.i));
        break;
    case type::UINT32:
        out.put(static_cast<uint32_t>(v.u));
        break;
    case type::INT32:
        out.put(static_cast<int32_t>(v.i));
        break;
    case type::UINT64:
        out.put(v.u);
        break;
    case type::INT64:
        out.put(v.i);
        break;
    case type::FLOAT32:
        out.put(static_cast<float>(v.f));
        break;
    case type::FLOAT64:
        out.put(v.f);
        break;
    case type::BOOL:
        out.put(static_cast<uint8_t>(v.b ? 1 : 0));
        break;
    case type::STRING:
        out.put_str(v.str);
        break;
    case type::ARRAY:
        if (static_cast<uint32_t>(v.elem) >= n_value_types) {
            throw error(cat(what, ": unknown array element type ", static_cast<uint32_t>(v.elem)));
        }
        if (depth >= max_array_depth) {
            throw error(cat(what, ": arrays nested more than ", max_array_depth, " deep"));
        }
        out.put(static_cast<uint32_t>(v.elem));
        out.put<uint64_t>(v.arr.size());
        for (const value & e : v.arr) {
            if (e.t != v.elem) {
                throw error(
                    cat(what, ": an array of ", type_name(v.elem), " holds a ", type_name(e.t)));
            }
            put_value(out, e, what, depth + 1);
        }
        break;
    default:
        throw error(cat(what, ": unknown value type ", static_cast<uint32_t>(v.t)));
    }
}

// Writes all of [p, p+n) to fd; false with errno set on failure.
bool write_all(int fd, const void * p, uint64_t n) {
    const uint8_t * b = static_cast<const uint8_t *>(p);
    while (n > 0) {
        const ssize_t w = ::write(fd, b, std::min<uint64_t>(n, 1u << 30));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        b += w;
        n -= static_cast<uint64_t>(w);
    }
    return true;
}

} // namespace

void writer::set(std::string key, value v) {
    for (kv & e : kvs_) {
        if (e.key == key) {
            e.val = std::move(v);
            return;
        }
    }
    kvs_.push_back({std::move(key), std::move(v)});
}

tensor_info writer::check_tensor(std::string name, uint32_t ggml_type,
                                 const std::vector<int64_t> & ne) const {
    const std::string what = cat("gguf writer: tensor '", name, "'");
    if (name.empty()) throw error("gguf writer: a tensor needs a name");
    if (name.size() > max_written_name) {
        throw error(cat(what, ": the name is ", name.size(), " bytes; ggml allows at most ",
                        max_written_name));
    }
    for (const pending & t : tensors_) {
        if (t.info.name == name) throw error(cat(what, " was added twice"));
    }
    if (ne.empty() || ne.size() > max_dims) {
        throw error(cat(what, ": has ", ne.size(), " dimensions; GGUF allows 1 to ", max_dims));
    }
    const tensor_type_traits * tt = tensor_type_info(ggml_type);
    if (!tt) throw error(cat(what, ": unknown ggml type ", ggml_type));

    tensor_info info;
    info.name = std::move(name);
    info.n_dims = static_cast<uint32_t>(ne.size());
    info.type = ggml_type;
    std::copy(ne.begin(), ne.end(), info.ne);
    std::string why;
    if (!tensor_nbytes(*tt, info.n_dims, info.ne, info.nbytes, why)) {
        throw error(cat(what, ": ", tt->name, " tensor ", why));
    }
    return info;
}

void writer::add_tensor(std::string name, uint32_t ggml_type, const std::vector<int64_t> & ne,
                        const void * data, uint64_t nbytes) {
    tensor_info info = check_tensor(std::move(name), ggml_type, ne);
    const std::string what = cat("gguf writer: tensor '", info.name, "'");
    if (nbytes != info.nbytes) {
        throw error(cat(what, ": ", nbytes, " bytes given but a ",
                        tensor_type_info(ggml_type)->name, " tensor of this shape takes ",
                        info.nbytes));
    }
    if (nbytes > 0 && data == nullptr) throw error(cat(what, ": no data"));
    tensors_.push_back({std::move(info), data, nullptr});
}

void writer::add_tensor(std::string name, uint32_t ggml_type, const std::vector<int64_t> & ne,
                        row_source source) {
    tensor_info info = check_tensor(std::move(name), ggml_type, ne);
    if (info.nbytes > 0 && !source) {
        throw error(cat("gguf writer: tensor '", info.name, "': no row source"));
    }
    tensors_.push_back({std::move(info), nullptr, std::move(source)});
}

void writer::write(const std::string & path) const {
    uint64_t alignment = default_alignment;
    for (const kv & e : kvs_) {
        if (e.key != "general.alignment") continue;
        // llama.cpp and the python gguf reader accept only a uint32 here.
        const value & a = e.val;
        if (a.t != type::UINT32 || !is_pow2(a.u) || a.u > UINT32_MAX) {
            throw error(cat(path, ": general.alignment is ", describe(a),
                            "; it must be a uint32 that is a nonzero power of two"));
        }
        alignment = a.u;
    }
    auto padding = [alignment](uint64_t at) { return (alignment - at % alignment) % alignment; };

    byte_sink out;
    out.put_bytes(magic, sizeof magic);
    out.put(supported_version);
    out.put<uint64_t>(tensors_.size());
    out.put<uint64_t>(kvs_.size());
    for (const kv & e : kvs_) {
        out.put_str(e.key);
        out.put(static_cast<uint32_t>(e.val.t));
        put_value(out, e.val, cat(path, ": key '", e.key, "'"), 0);
    }
    uint64_t offset = 0;
    for (const pending & t : tensors_) {
        out.put_str(t.info.name);
        out.put(t.info.n_dims);
        for (uint32_t d = 0; d < t.info.n_dims; ++d) out.put(t.info.ne[d]);
        out.put(t.info.type);
        out.put(offset);
        offset += t.info.nbytes + padding(t.info.nbytes);
    }
    out.bytes.resize(out.bytes.size() + padding(out.bytes.size()), 0);

    const std::string tmp = path + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw error(cat(tmp, ": cannot create: ", errno_text()));
    auto fail = [&](const char * doing) {
        const std::string why = errno_text();
        ::close(fd);
        ::unlink(tmp.c_str());
        throw error(cat(tmp, ": cannot ", doing, ": ", why));
    };

    if (!write_all(fd, out.bytes.data(), out.bytes.size())) fail("write");
    static const uint8_t zeros[256] = {};
    // Row sources fill one buffer of whole rows, about 16 MiB, at a time.
    constexpr uint64_t chunk_bytes = uint64_t(16) << 20;
    std::vector<uint8_t> chunk;
    for (const pending & t : tensors_) {
        if (t.data || t.info.nbytes == 0) {
            if (!write_all(fd, t.data, t.info.nbytes)) fail("write");
        } else {
            const uint64_t rows = uint64_t(t.info.n_elements() / t.info.ne[0]);
            const uint64_t row_bytes = t.info.nbytes / rows;
            const uint64_t per_chunk = std::max<uint64_t>(1, chunk_bytes / row_bytes);
            chunk.resize(
                std::max<size_t>(chunk.size(), size_t(std::min(rows, per_chunk) * row_bytes)));
            for (uint64_t r = 0; r < rows; r += per_chunk) {
                const uint64_t n = std::min(per_chunk, rows - r);
                try {
                    t.source(r, n, chunk.data());
                } catch (...) {
                    ::close(fd);
                    ::unlink(tmp.c_str());
                    throw;
                }
                if (!write_all(fd, chunk.data(), n * row_bytes)) fail("write");
            }
        }
        // ggml pads after every tensor, the last included, and llama.cpp
        // reads the data section in padded sizes.
        for (uint64_t pad = padding(t.info.nbytes); pad > 0;) {
            const uint64_t n = std::min<uint64_t>(pad, sizeof zeros);
            if (!write_all(fd, zeros, n)) fail("write");
            pad -= n;
        }
    }
    if (::close(fd) != 0) {
        const std::string why = errno_text();
        ::unlink(tmp.c_str());
        throw error(cat(tmp, ": cannot write: ", why));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string why = errno_text();
        ::unlink(tmp.c_str());
        throw error(cat(path, ": cannot rename ", tmp, " into place: ", why));
    }
}

} // namespace gguf
