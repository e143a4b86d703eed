// safetensors.c++ - see safetensors.h. The format: 8 bytes of little-endian
// header length N, N bytes of JSON ({"name": {"dtype", "shape",
// "data_offsets": [begin, end]}, "__metadata__": {...}}), then the data
// section, to which the offsets are relative.

#include "safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

// safetensors is little-endian and values are read straight from the mapping.
static_assert(std::endian::native == std::endian::little,
              "the safetensors reader assumes a little-endian host");

namespace smol::convert {

namespace {

// No real header comes near this; a larger one is a lie about its length.
constexpr uint64_t max_header = uint64_t(1) << 28;

// dtypes the format defines that a conversion does not read, so a message
// can tell an unsupported dtype from a corrupt one.
const char * const other_dtypes[] = {"F64",     "I64", "I32",     "I16",     "I8",      "U64",
                                     "U32",     "U16", "U8",      "BOOL",    "F8_E4M3", "F8_E5M2",
                                     "F8_E8M0", "F4",  "F6_E2M3", "F6_E3M2", "C64"};

[[noreturn]] void fail(const std::string & path, const std::string & what) {
    throw convert_error(path + ": " + what);
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t & out) {
    if (a != 0 && b > UINT64_MAX / a) return true;
    out = a * b;
    return false;
}

} // namespace

const char * st_dtype_name(st_dtype t) {
    switch (t) {
    case st_dtype::F32:
        return "F32";
    case st_dtype::F16:
        return "F16";
    case st_dtype::BF16:
        return "BF16";
    }
    return "?";
}

size_t st_dtype_size(st_dtype t) {
    return t == st_dtype::F32 ? 4 : 2;
}

int64_t st_tensor::n_elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

st_file::~st_file() {
    if (base_) munmap(const_cast<uint8_t *>(base_), size_);
}

std::unique_ptr<st_file> st_file::open(const std::string & path) {
    std::unique_ptr<st_file> f(new st_file);
    f->path_ = path;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(path, "is not a regular file");
    }
    f->size_ = uint64_t(st.st_size);
    if (f->size_ < 8) {
        ::close(fd);
        fail(path, "is " + std::to_string(f->size_) +
                       " bytes, shorter than the 8-byte header length: not a safetensors file, "
                       "or truncated");
    }
    void * p = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) fail(path, std::string("cannot map: ") + std::strerror(errno));
    f->base_ = static_cast<const uint8_t *>(p);

    uint64_t n_header = 0;
    std::memcpy(&n_header, f->base_, 8);
    if (n_header > max_header || n_header > f->size_ - 8) {
        fail(path, "the header length says " + std::to_string(n_header) +
                       " bytes but the file has " + std::to_string(f->size_ - 8) +
                       " after it: not a safetensors file, or truncated");
    }
    const char * text = reinterpret_cast<const char *>(f->base_ + 8);
    const nlohmann::json header =
        nlohmann::json::parse(text, text + n_header, nullptr, /*allow_exceptions=*/false);
    if (header.is_discarded()) fail(path, "the header is not valid JSON");
    if (!header.is_object()) fail(path, "the header is not a JSON object");
    const uint64_t data_start = 8 + n_header;
    const uint64_t data_size = f->size_ - data_start;

    struct span {
        uint64_t begin, end;
        size_t index;
    };
    std::vector<span> spans;
    for (auto it = header.begin(); it != header.end(); ++it) {
        const std::string & name = it.key();
        if (name == "__metadata__") {
            if (!it->is_object()) fail(path, "__metadata__ is not an object");
            continue;
        }
        const std::string where = "tensor '" + name + "': ";
        const nlohmann::json & e = it.value();
        if (!e.is_object()) fail(path, where + "the entry is not an object");
        if (!e.contains("dtype") || !e["dtype"].is_string())
            fail(path, where + "dtype is missing or not a string");
        const std::string dt = e["dtype"].get<std::string>();
        st_tensor t;
        t.name = name;
        if (dt == "F32") {
            t.dtype = st_dtype::F32;
        } else if (dt == "F16") {
            t.dtype = st_dtype::F16;
        } else if (dt == "BF16") {
            t.dtype = st_dtype::BF16;
        } else {
            const bool known = std::any_of(std::begin(other_dtypes), std::end(other_dtypes),
                                           [&](const char * o) { return dt == o; });
            fail(path, where + "dtype " + dt +
                           (known ? " is not supported (F32, F16 and BF16 are)"
                                  : " is not a safetensors dtype"));
        }
        if (!e.contains("shape") || !e["shape"].is_array())
            fail(path, where + "shape is missing or not an array");
        if (e["shape"].size() > 8) fail(path, where + "shape has more than 8 dimensions");
        uint64_t n = 1;
        for (const auto & d : e["shape"]) {
            if (!d.is_number_unsigned())
                fail(path, where + "shape " + e["shape"].dump() +
                               " has an entry that is not a non-negative integer");
            const uint64_t v = d.get<uint64_t>();
            if (v > uint64_t(INT64_MAX) || mul_overflows(n, v, n))
                fail(path, where + "shape " + e["shape"].dump() + " overflows");
            t.shape.push_back(int64_t(v));
        }
        uint64_t nbytes = 0;
        if (mul_overflows(n, st_dtype_size(t.dtype), nbytes))
            fail(path, where + "shape " + e["shape"].dump() + " overflows");
        const nlohmann::json & off =
            e.contains("data_offsets") ? e["data_offsets"] : nlohmann::json();
        if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
            !off[1].is_number_unsigned())
            fail(path, where + "data_offsets is missing or not two non-negative integers");
        const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
        if (begin > end)
            fail(path, where + "data_offsets [" + std::to_string(begin) + ", " +
                           std::to_string(end) + "] ends before it begins");
        if (end > data_size)
            fail(path, where + "data_offsets end " + std::to_string(end) +
                           " lies past the data section's " + std::to_string(data_size) +
                           " bytes: the file is truncated or its header lies");
        if (end - begin != nbytes)
            fail(path, where + "data_offsets [" + std::to_string(begin) + ", " +
                           std::to_string(end) + "] hold " + std::to_string(end - begin) +
                           " bytes but dtype " + dt + " and shape " + e["shape"].dump() + " need " +
                           std::to_string(nbytes));
        t.data = f->base_ + data_start + begin;
        t.nbytes = nbytes;
        spans.push_back({begin, end, f->tensors_.size()});
        f->tensors_.push_back(std::move(t));
    }
    std::sort(spans.begin(), spans.end(), [](const span & a, const span & b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    for (size_t i = 1; i < spans.size(); ++i) {
        const span & a = spans[i - 1];
        const span & b = spans[i];
        if (b.begin < a.end && b.end > b.begin && a.end > a.begin)
            fail(path, "tensors '" + f->tensors_[a.index].name + "' and '" +
                           f->tensors_[b.index].name + "' overlap (data_offsets [" +
                           std::to_string(a.begin) + ", " + std::to_string(a.end) + "] and [" +
                           std::to_string(b.begin) + ", " + std::to_string(b.end) + "])");
    }
    std::sort(f->tensors_.begin(), f->tensors_.end(),
              [](const st_tensor & a, const st_tensor & b) { return a.name < b.name; });
    return f;
}

} // namespace smol::convert
