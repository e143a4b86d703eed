// test-gguf.c++ - the GGUF reader and writer: round trips of every value and
// tensor type with fresh random contents, a table of corrupt and hostile files
// that must fail with a message naming the fault, the real SmolLM2 file, and
// JSON sidecars that scripts/check-gguf.py compares with the python gguf
// package's reading of the same files (the gguf-python-* ctest tests).

#include "gguf-io/gguf.h"
#include "test-seed.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <doctest/doctest.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;

namespace {

// --- test scaffolding ----------------------------------------------------------

// A private directory for the files a test writes, removed afterwards: the
// process id and a count name it apart from other runs' and its siblings.
struct scratch_dir {
    fs::path dir;
    scratch_dir() {
        static int made = 0;
        dir = fs::temp_directory_path() /
              ("smol-test-gguf-" + std::to_string(getpid()) + "-" + std::to_string(++made));
        fs::create_directories(dir);
    }
    ~scratch_dir() {
        std::error_code ec;
        fs::remove_all(dir, ec);
    }
    std::string path(const std::string & name) const { return (dir / name).string(); }
};

// Where sidecars for scripts/check-gguf.py go; ctest passes the build dir.
std::string out_path(const std::string & name) {
#ifdef SMOL_GGUF_OUT_DIR
    return std::string(SMOL_GGUF_OUT_DIR) + "/" + name;
#else
    return (fs::temp_directory_path() / name).string();
#endif
}

void write_bytes(const std::string & path, const void * data, size_t n) {
    // A new file each time: rewriting one in place makes ext4 flush it.
    std::error_code ec;
    fs::remove(path, ec);
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(static_cast<const char *>(data), std::streamsize(n));
    REQUIRE(f.good());
}

std::vector<uint8_t> read_bytes(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

// The message of the gguf::error that opening path throws; "" if it opens.
// Any other exception escapes and fails the test.
std::string open_error(const std::string & path, bool use_mmap) {
    try {
        gguf::file::open(path, use_mmap);
    } catch (const gguf::error & e) {
        return e.what();
    }
    return "";
}

bool contains(const std::string & s, const std::string & part) {
    return s.find(part) != std::string::npos;
}

bool same_bits(double a, double b) {
    return std::memcmp(&a, &b, sizeof a) == 0;
}

// --- random values ----------------------------------------------------------------

constexpr gguf::type all_types[] = {
    gguf::type::UINT8,   gguf::type::INT8,  gguf::type::UINT16,  gguf::type::INT16,
    gguf::type::UINT32,  gguf::type::INT32, gguf::type::FLOAT32, gguf::type::BOOL,
    gguf::type::STRING,  gguf::type::ARRAY, gguf::type::UINT64,  gguf::type::INT64,
    gguf::type::FLOAT64,
};

// A finite float or double from random bits, so every exponent is tried.
template <class F, class U> double random_finite(std::mt19937_64 & rng) {
    for (;;) {
        const U bits = static_cast<U>(rng());
        F x;
        std::memcpy(&x, &bits, sizeof x);
        if (std::isfinite(x)) return static_cast<double>(x);
    }
}

std::string random_bytes_string(std::mt19937_64 & rng, size_t max_len) {
    std::string s(rng() % (max_len + 1), '\0');
    for (char & c : s) c = static_cast<char>(rng()); // any byte, NUL and invalid UTF-8 too
    return s;
}

gguf::value random_value(gguf::type t, std::mt19937_64 & rng, int depth = 0) {
    gguf::value v;
    v.t = t;
    switch (t) {
    case gguf::type::UINT8:
        v.u = uint8_t(rng());
        break;
    case gguf::type::INT8:
        v.i = int8_t(rng());
        break;
    case gguf::type::UINT16:
        v.u = uint16_t(rng());
        break;
    case gguf::type::INT16:
        v.i = int16_t(rng());
        break;
    case gguf::type::UINT32:
        v.u = uint32_t(rng());
        break;
    case gguf::type::INT32:
        v.i = int32_t(rng());
        break;
    case gguf::type::UINT64:
        v.u = rng();
        break;
    case gguf::type::INT64:
        v.i = int64_t(rng());
        break;
    case gguf::type::FLOAT32:
        v.f = random_finite<float, uint32_t>(rng);
        break;
    case gguf::type::FLOAT64:
        v.f = random_finite<double, uint64_t>(rng);
        break;
    case gguf::type::BOOL:
        v.b = rng() & 1;
        break;
    case gguf::type::STRING:
        v.str = random_bytes_string(rng, 40);
        break;
    case gguf::type::ARRAY: {
        // Nested arrays only a few levels deep; the element type is random.
        v.elem = all_types[rng() % std::size(all_types)];
        if (v.elem == gguf::type::ARRAY && depth >= 3) v.elem = gguf::type::FLOAT64;
        const size_t n = rng() % (depth == 0 ? 40 : 6);
        for (size_t k = 0; k < n; ++k) v.arr.push_back(random_value(v.elem, rng, depth + 1));
        break;
    }
    }
    return v;
}

gguf::value array_of(gguf::type elem, std::mt19937_64 & rng, size_t n) {
    std::vector<gguf::value> items;
    for (size_t k = 0; k < n; ++k) items.push_back(random_value(elem, rng, 1));
    return gguf::value::make_array(elem, std::move(items));
}

gguf::value f64(double x) {
    gguf::value v;
    v.t = gguf::type::FLOAT64;
    v.f = x;
    return v;
}

gguf::value integer(gguf::type t, int64_t i, uint64_t u) {
    gguf::value v;
    v.t = t;
    v.i = i;
    v.u = u;
    return v;
}

// Every value type, random contents, nested arrays, and the edge values.
std::vector<gguf::kv> random_metadata(std::mt19937_64 & rng) {
    std::vector<gguf::kv> kvs;
    for (gguf::type t : all_types) {
        kvs.push_back({std::string("test.") + gguf::type_name(t), random_value(t, rng)});
    }
    for (gguf::type t : all_types) {
        kvs.push_back({std::string("test.array_of.") + gguf::type_name(t), array_of(t, rng, 5)});
    }
    kvs.push_back({"test.array_of.array.deep", array_of(gguf::type::ARRAY, rng, 3)});
    kvs.push_back({"test.empty_string", gguf::value::make_str("")});
    kvs.push_back({"test.empty_array", gguf::value::make_array(gguf::type::INT32, {})});
    kvs.push_back({"test.empty_nested",
                   gguf::value::make_array(gguf::type::ARRAY,
                                           {gguf::value::make_array(gguf::type::STRING, {})})});
    kvs.push_back({"test.uint8.max", integer(gguf::type::UINT8, 0, UINT8_MAX)});
    kvs.push_back({"test.int8.min", integer(gguf::type::INT8, INT8_MIN, 0)});
    kvs.push_back({"test.int16.min", integer(gguf::type::INT16, INT16_MIN, 0)});
    kvs.push_back({"test.uint32.max", gguf::value::make_u32(UINT32_MAX)});
    kvs.push_back({"test.int32.min", gguf::value::make_i32(INT32_MIN)});
    kvs.push_back({"test.uint64.max", gguf::value::make_u64(UINT64_MAX)});
    kvs.push_back({"test.int64.min", integer(gguf::type::INT64, INT64_MIN, 0)});
    kvs.push_back({"test.bool.true", gguf::value::make_bool(true)});
    kvs.push_back({"test.bool.false", gguf::value::make_bool(false)});
    const float fspecial[] = {0.0f,
                              -0.0f,
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::denorm_min(),
                              std::numeric_limits<float>::max(),
                              std::numeric_limits<float>::lowest()};
    std::vector<gguf::value> fs;
    for (float x : fspecial) fs.push_back(gguf::value::make_f32(x));
    kvs.push_back({"test.float32.specials", gguf::value::make_array(gguf::type::FLOAT32, fs)});
    kvs.push_back({"test.float64.denorm", f64(std::numeric_limits<double>::denorm_min())});
    kvs.push_back({"test.float64.nan", f64(std::numeric_limits<double>::quiet_NaN())});
    kvs.push_back({"test.strings", gguf::value::make_str_array({"", "a", "Ġthe", "<|im_end|>"})});
    std::vector<gguf::value> big;
    for (int k = 0; k < 3000; ++k) big.push_back(random_value(gguf::type::STRING, rng, 1));
    kvs.push_back({"test.many_strings", gguf::value::make_array(gguf::type::STRING, big)});
    std::shuffle(kvs.begin(), kvs.end(), rng);
    return kvs;
}

// --- random tensors ---------------------------------------------------------------

struct test_tensor {
    std::string name;
    uint32_t type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> data;
};

// One tensor of every type gguf-io knows, random shape and bytes.
std::vector<test_tensor> random_tensors(std::mt19937_64 & rng) {
    std::vector<test_tensor> ts;
    for (uint32_t id = 0; id < 64; ++id) {
        const gguf::tensor_type_traits * tt = gguf::tensor_type_info(id);
        if (!tt) continue;
        test_tensor t;
        t.name = std::string("t.") + tt->name;
        t.type = id;
        const size_t n_dims = 1 + rng() % gguf::max_dims;
        t.ne.push_back(int64_t(tt->block_elems) * int64_t(1 + rng() % 3));
        while (t.ne.size() < n_dims) t.ne.push_back(int64_t(1 + rng() % 3));
        int64_t n = 1;
        for (int64_t e : t.ne) n *= e;
        t.data.resize(size_t(n / tt->block_elems * tt->block_bytes));
        for (uint8_t & b : t.data) b = uint8_t(rng());
        ts.push_back(std::move(t));
    }
    ts.push_back({"t.empty", 0, {8, 0}, {}});
    std::shuffle(ts.begin(), ts.end(), rng);
    return ts;
}

void add_all(gguf::writer & w, const std::vector<gguf::kv> & kvs,
             const std::vector<test_tensor> & ts) {
    for (const gguf::kv & e : kvs) w.set(e.key, e.val);
    for (const test_tensor & t : ts)
        w.add_tensor(t.name, t.type, t.ne, t.data.data(), t.data.size());
}

// Checks that f holds exactly kvs (in order) and ts (data bytes too), laid out
// with every tensor at an aligned offset.
void check_contents(const gguf::file & f, const std::vector<gguf::kv> & kvs,
                    const std::vector<test_tensor> & ts) {
    CHECK(f.version() == 3);
    REQUIRE(f.metadata().size() == kvs.size());
    for (size_t k = 0; k < kvs.size(); ++k) {
        INFO("key ", kvs[k].key);
        CHECK(f.metadata()[k].key == kvs[k].key);
        CHECK(f.metadata()[k].val == kvs[k].val);
    }
    REQUIRE(f.tensors().size() == ts.size());
    CHECK(f.data_offset() % f.alignment() == 0);
    for (size_t k = 0; k < ts.size(); ++k) {
        const gguf::tensor_info & ti = f.tensors()[k];
        INFO("tensor ", ts[k].name);
        CHECK(ti.name == ts[k].name);
        CHECK(ti.type == ts[k].type);
        REQUIRE(ti.n_dims == ts[k].ne.size());
        for (size_t d = 0; d < gguf::max_dims; ++d) {
            CHECK(ti.ne[d] == (d < ts[k].ne.size() ? ts[k].ne[d] : 1));
        }
        CHECK(ti.offset % f.alignment() == 0);
        REQUIRE(ti.nbytes == ts[k].data.size());
        CHECK(f.find_tensor(ts[k].name) == &ti);
        if (ti.nbytes > 0) CHECK(std::memcmp(ti.data, ts[k].data.data(), ti.nbytes) == 0);
    }
}

// --- hand-built files, byte by byte ---------------------------------------------------

struct raw_file {
    std::vector<uint8_t> b;

    raw_file & bytes(const void * p, size_t n) {
        const size_t at = b.size();
        b.resize(at + n);
        if (n) std::memcpy(b.data() + at, p, n);
        return *this;
    }
    template <class T> raw_file & put(T v) { return bytes(&v, sizeof v); }
    raw_file & str(std::string_view s) { return put<uint64_t>(s.size()).bytes(s.data(), s.size()); }
    raw_file & header(uint32_t version, uint64_t n_tensors, uint64_t n_kvs) {
        return bytes("GGUF", 4).put(version).put(n_tensors).put(n_kvs);
    }
    raw_file & kv_str(std::string_view key, std::string_view v) {
        return str(key).put<uint32_t>(8).str(v);
    }
    raw_file & kv_u32(std::string_view key, uint32_t v) { return str(key).put<uint32_t>(4).put(v); }
    raw_file & tensor(std::string_view name, std::vector<int64_t> ne, uint32_t type,
                      uint64_t offset) {
        str(name).put<uint32_t>(uint32_t(ne.size()));
        for (int64_t e : ne) put(e);
        return put(type).put(offset);
    }
    raw_file & pad(size_t align) {
        b.resize((b.size() + align - 1) / align * align, 0);
        return *this;
    }
    raw_file & zeros(size_t n) {
        b.resize(b.size() + n, 0);
        return *this;
    }
};

// A valid file: one kv, one f32 tensor of 32 elements.
raw_file valid_raw() {
    raw_file r;
    r.header(3, 1, 1).kv_str("general.architecture", "llama");
    r.tensor("t", {32}, 0, 0).pad(32).zeros(128);
    return r;
}

constexpr uint64_t huge = uint64_t(1) << 60;

struct bad_file {
    const char * what;
    raw_file file;
    std::vector<std::string> expect; // parts the message must contain
};

std::vector<bad_file> bad_files() {
    std::vector<bad_file> cases;
    auto add = [&](const char * what, raw_file r, std::vector<std::string> expect) {
        cases.push_back({what, std::move(r), std::move(expect)});
    };
    raw_file r;

    r = valid_raw();
    std::memcpy(r.b.data(), "GGML", 4);
    add("bad magic", r, {"not a GGUF file", "\"GGML\"", "magic"});

    r = valid_raw();
    r.b[4] = 2;
    add("version 2", r, {"version 2 is not supported", "v3"});

    r = valid_raw();
    r.b[4] = 1;
    add("version 1", r, {"version 1 is not supported", "v3"});

    r = valid_raw();
    r.b[4] = 0, r.b[7] = 3;
    add("a big-endian file", r, {"version 50331648", "big-endian"});

    add("a huge key length", raw_file().header(3, 0, 1).put(huge).zeros(64),
        {"metadata key #0", "length of 1152921504606846976"});

    add("a huge string value length",
        raw_file().header(3, 0, 1).str("general.name").put<uint32_t>(8).put(huge).zeros(64),
        {"key 'general.name'", "length of 1152921504606846976", "truncated or corrupt"});

    add("a huge array count",
        raw_file()
            .header(3, 0, 1)
            .str("tokenizer.ggml.tokens")
            .put<uint32_t>(9)
            .put<uint32_t>(8)
            .put(huge)
            .zeros(64),
        {"key 'tokenizer.ggml.tokens'", "claims 1152921504606846976 elements of type string"});

    add("a huge count in a nested array",
        raw_file()
            .header(3, 0, 1)
            .str("test.nested")
            .put<uint32_t>(9)
            .put<uint32_t>(9)
            .put<uint64_t>(1)
            .put<uint32_t>(0)
            .put(huge)
            .zeros(64),
        {"key 'test.nested'", "claims 1152921504606846976 elements of type uint8"});

    add("a huge array of 64-bit values",
        raw_file().header(3, 0, 1).str("a").put<uint32_t>(9).put<uint32_t>(10).put(huge / 8).zeros(
            64),
        {"claims 144115188075855872 elements of type uint64"});

    add("a huge tensor count", raw_file().header(3, huge, 0).zeros(64),
        {"claims 1152921504606846976 tensors"});

    add("a huge metadata count", raw_file().header(3, 0, huge).zeros(64),
        {"claims 1152921504606846976 metadata keys"});

    add("an unknown value type", raw_file().header(3, 0, 1).str("a.b").put<uint32_t>(13).zeros(16),
        {"key 'a.b'", "unknown value type 13"});

    add("an unknown array element type",
        raw_file().header(3, 0, 1).str("a.b").put<uint32_t>(9).put<uint32_t>(77).zeros(16),
        {"key 'a.b'", "unknown value type 77"});

    add("a bool that is neither 0 nor 1",
        raw_file().header(3, 0, 1).str("a.b").put<uint32_t>(7).put<uint8_t>(2).zeros(16),
        {"key 'a.b'", "is 2 (must be 0 or 1)"});

    r = raw_file().header(3, 0, 1).str("a.deep").put<uint32_t>(9);
    for (int k = 0; k < 1000; ++k) r.put<uint32_t>(9).put<uint64_t>(1);
    add("arrays nested 1000 deep", r.zeros(16), {"key 'a.deep'", "nested more than"});

    r = raw_file().header(3, 1, 1).kv_str("general.architecture", "llama");
    r.tensor("t", {8, 2, 2, 2, 2}, 0, 0).pad(32).zeros(1024);
    add("n_dims 5", r, {"tensor 't'", "n_dims = 5", "1 to 4"});

    r = raw_file().header(3, 1, 0).tensor("t", {}, 0, 0).pad(32).zeros(64);
    add("n_dims 0", r, {"tensor 't'", "n_dims = 0"});

    r = raw_file().header(3, 1, 0).tensor("t", {32, -3}, 0, 0).pad(32).zeros(64);
    add("a negative dimension", r, {"tensor 't'", "negative size ne[1] = -3"});

    r = raw_file().header(3, 1, 0).tensor("t", {1 << 22, 1 << 22, 1 << 22}, 0, 0).pad(32).zeros(64);
    add("an element count that overflows", r, {"tensor 't'", "64 bits"});

    r = raw_file().header(3, 1, 0).tensor("blk.0.attn_q.weight", {32}, 4, 0).pad(32).zeros(64);
    add("a retired tensor type", r, {"tensor 'blk.0.attn_q.weight'", "unknown tensor type 4"});

    r = raw_file().header(3, 1, 0).tensor("t", {32}, 1000, 0).pad(32).zeros(64);
    add("an unknown tensor type", r, {"unknown tensor type 1000"});

    r = raw_file().header(3, 1, 0).tensor("t", {33}, 8, 0).pad(32).zeros(64);
    add("a row that is not whole blocks", r, {"ne[0] = 33", "q8_0", "block of 32"});

    r = raw_file().header(3, 2, 0).tensor("a", {8}, 0, 0).tensor("b", {8}, 0, 40).pad(32);
    add("a misaligned tensor offset", r.zeros(128),
        {"tensor 'b'", "offset 40 is not a multiple of the alignment 32"});

    r = raw_file().header(3, 1, 0).tensor("blk.0.attn_q.weight", {1024}, 0, 0).pad(32);
    const size_t data_at = r.b.size();
    r.zeros(128);
    add("tensor data past the end of the file", r,
        {"tensor 'blk.0.attn_q.weight' data [" + std::to_string(data_at) + ", " +
             std::to_string(data_at + 4096) + ") extends past the end of the file (" +
             std::to_string(data_at + 128) + " bytes)",
         "truncated"});

    r = raw_file().header(3, 1, 0).tensor("t", {8}, 0, uint64_t(1) << 62).pad(32).zeros(64);
    add("a tensor offset far past the end", r, {"tensor 't'", "past the end of the file"});

    r = raw_file().header(3, 1, 0).tensor("t", {8}, 0, UINT64_MAX - 31).pad(32).zeros(64);
    add("a tensor offset near 2^64", r, {"tensor 't'", "past the end of the file"});

    r = raw_file().header(3, 2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).pad(32);
    add("overlapping tensors", r.zeros(128), {"'a'", "'b'", "overlap"});

    r = raw_file().header(3, 1, 0).tensor("t", {32}, 0, 0);
    add("a file that ends before the data section", r, {"truncated"});

    r = raw_file().header(3, 1, 1).kv_u32("general.alignment", 0);
    add("alignment 0", r.tensor("t", {8}, 0, 0).pad(32).zeros(64),
        {"general.alignment", "uint32 0", "nonzero power of two"});

    r = raw_file().header(3, 1, 1).kv_u32("general.alignment", 3);
    add("alignment 3", r.tensor("t", {8}, 0, 0).pad(32).zeros(64),
        {"general.alignment", "uint32 3", "nonzero power of two"});

    r = raw_file().header(3, 0, 1).kv_str("general.alignment", "32");
    add("an alignment that is a string", r, {"general.alignment", "not an integer"});

    r = raw_file()
            .header(3, 0, 3)
            .kv_str("general.name", "a")
            .kv_u32("x.y", 1)
            .kv_str("general.name", "b");
    add("a duplicate key", r, {"key 'general.name'", "duplicate key"});

    r = raw_file().header(3, 2, 0).tensor("t", {8}, 0, 0).tensor("t", {8}, 0, 32).pad(32);
    add("a duplicate tensor name", r.zeros(64), {"tensor 't'", "duplicate tensor name"});

    add("an empty file", raw_file(), {"empty"});
    return cases;
}

// --- JSON sidecars for scripts/check-gguf.py ------------------------------------------

void json_string(std::string & out, std::string_view s) {
    out += '"';
    for (char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += ch;
        } else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        } else {
            out += ch; // raw bytes: the script reads them with surrogateescape
        }
    }
    out += '"';
}

void json_number(std::string & out, double x) {
    if (std::isnan(x))
        out += "\"nan\"";
    else if (std::isinf(x))
        out += x > 0 ? "\"inf\"" : "\"-inf\"";
    else {
        char buf[40];
        std::snprintf(buf, sizeof buf, "%.17g", x);
        out += buf;
        // "-0" would read back as the integer 0 and lose its sign.
        if (std::strpbrk(buf, ".en") == nullptr) out += ".0";
    }
}

void json_value(std::string & out, const gguf::value & v) {
    out += "{\"type\":\"";
    out += gguf::type_name(v.t);
    out += "\",";
    switch (v.t) {
    case gguf::type::UINT8:
    case gguf::type::UINT16:
    case gguf::type::UINT32:
    case gguf::type::UINT64:
        out += "\"value\":" + std::to_string(v.u);
        break;
    case gguf::type::INT8:
    case gguf::type::INT16:
    case gguf::type::INT32:
    case gguf::type::INT64:
        out += "\"value\":" + std::to_string(v.i);
        break;
    case gguf::type::FLOAT32:
    case gguf::type::FLOAT64:
        out += "\"value\":";
        json_number(out, v.f);
        break;
    case gguf::type::BOOL:
        out += v.b ? "\"value\":true" : "\"value\":false";
        break;
    case gguf::type::STRING:
        out += "\"value\":";
        json_string(out, v.str);
        break;
    case gguf::type::ARRAY:
        out += "\"elem\":\"";
        out += gguf::type_name(v.elem);
        out += "\",\"items\":[";
        for (size_t k = 0; k < v.arr.size(); ++k) {
            if (k) out += ',';
            json_value(out, v.arr[k]);
        }
        out += ']';
        break;
    }
    out += '}';
}

std::string hex(const void * p, size_t n) {
    static const char digits[] = "0123456789abcdef";
    std::string s;
    s.reserve(2 * n);
    for (size_t k = 0; k < n; ++k) {
        const uint8_t b = static_cast<const uint8_t *>(p)[k];
        s += digits[b >> 4];
        s += digits[b & 15];
    }
    return s;
}

// The expectations check-gguf.py compares with the python reader. Tensor
// bytes are given whole when small, else as their first and last 32 bytes.
std::string sidecar(const std::vector<gguf::kv> & kvs, const std::vector<gguf::tensor_info> & ts,
                    uint64_t alignment, uint64_t data_offset) {
    std::string out = "{\"version\":3,\"alignment\":" + std::to_string(alignment) +
                      ",\"data_offset\":" + std::to_string(data_offset) + ",\n\"kvs\":[\n";
    for (size_t k = 0; k < kvs.size(); ++k) {
        out += k ? ",\n{\"key\":" : "{\"key\":";
        json_string(out, kvs[k].key);
        out += ",\"value\":";
        json_value(out, kvs[k].val);
        out += '}';
    }
    out += "],\n\"tensors\":[\n";
    for (size_t k = 0; k < ts.size(); ++k) {
        const gguf::tensor_info & t = ts[k];
        out += k ? ",\n{\"name\":" : "{\"name\":";
        json_string(out, t.name);
        out += ",\"type\":" + std::to_string(t.type) + ",\"ne\":[";
        for (uint32_t d = 0; d < t.n_dims; ++d) out += (d ? "," : "") + std::to_string(t.ne[d]);
        out +=
            "],\"offset\":" + std::to_string(t.offset) + ",\"nbytes\":" + std::to_string(t.nbytes);
        const auto * bytes = static_cast<const uint8_t *>(t.data);
        if (t.nbytes <= 65536) {
            out += ",\"data\":\"" + hex(bytes, t.nbytes) + "\"";
        } else {
            out += ",\"head\":\"" + hex(bytes, 32) + "\",\"tail\":\"" +
                   hex(bytes + t.nbytes - 32, 32) + "\"";
        }
        out += '}';
    }
    out += "]}\n";
    return out;
}

} // namespace

// --- round trips ------------------------------------------------------------------------

TEST_CASE("every metadata value type and tensor type reads back exactly as written") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937_64 rng(seed);
    scratch_dir tmp;

    for (int round = 0; round < 4; ++round) {
        std::vector<gguf::kv> kvs = random_metadata(rng);
        const uint32_t alignments[] = {1, 8, 32, 64, 256};
        if (round > 0) {
            kvs.push_back({"general.alignment", gguf::value::make_u32(alignments[rng() % 5])});
        }
        const std::vector<test_tensor> ts = random_tensors(rng);
        gguf::writer w;
        add_all(w, kvs, ts);
        const std::string path = tmp.path("round-trip.gguf");
        w.write(path);
        CHECK_FALSE(fs::exists(path + ".tmp"));

        for (bool use_mmap : {true, false}) {
            INFO("round ", round, ", use_mmap ", use_mmap);
            auto f = gguf::file::open(path, use_mmap);
            check_contents(*f, kvs, ts);
            const gguf::value * a = f->find("general.alignment");
            CHECK(f->alignment() == (a ? a->u : 32));
            CHECK(f->size() == fs::file_size(path));
            CHECK(f->path() == path);
        }
    }
}

TEST_CASE("floats keep their exact bits, negative zero and denormals included") {
    scratch_dir tmp;
    const float f32s[] = {-0.0f, std::numeric_limits<float>::denorm_min(), 0.1f, -3.0e38f};
    const double f64s[] = {-0.0, std::numeric_limits<double>::denorm_min(), 0.1, -1e308};
    gguf::writer w;
    for (size_t k = 0; k < 4; ++k) {
        w.set("f32." + std::to_string(k), gguf::value::make_f32(f32s[k]));
        w.set("f64." + std::to_string(k), f64(f64s[k]));
    }
    w.write(tmp.path("floats.gguf"));
    auto f = gguf::file::open(tmp.path("floats.gguf"));
    for (size_t k = 0; k < 4; ++k) {
        CHECK(same_bits(f->find("f32." + std::to_string(k))->f, double(f32s[k])));
        CHECK(same_bits(f->find("f64." + std::to_string(k))->f, f64s[k]));
    }
}

TEST_CASE("the writer keeps keys in insertion order and setting a key again replaces it") {
    scratch_dir tmp;
    gguf::writer w;
    w.set("b", gguf::value::make_u32(1));
    w.set("a", gguf::value::make_str("first"));
    w.set("c", gguf::value::make_bool(true));
    w.set("a", gguf::value::make_str("second"));
    w.write(tmp.path("order.gguf"));
    auto f = gguf::file::open(tmp.path("order.gguf"));
    REQUIRE(f->metadata().size() == 3);
    CHECK(f->metadata()[0].key == "b");
    CHECK(f->metadata()[1].key == "a");
    CHECK(f->metadata()[2].key == "c");
    CHECK(f->get_str("a") == "second");
    CHECK(f->tensors().empty());
}

TEST_CASE("the writer pads the header and every tensor to general.alignment") {
    scratch_dir tmp;
    std::vector<uint8_t> a(3 * 4, 0xaa), b(5 * 4, 0xbb);
    gguf::writer w;
    w.set("general.alignment", gguf::value::make_u32(64));
    w.add_tensor("a", 0, {3}, a.data(), a.size());
    w.add_tensor("b", 0, {5}, b.data(), b.size());
    w.write(tmp.path("aligned.gguf"));
    auto f = gguf::file::open(tmp.path("aligned.gguf"));
    CHECK(f->alignment() == 64);
    CHECK(f->data_offset() % 64 == 0);
    CHECK(f->find_tensor("a")->offset == 0);
    CHECK(f->find_tensor("b")->offset == 64);
    // ggml pads after the last tensor too; llama.cpp reads padded sizes.
    CHECK(f->size() == f->data_offset() + 128);
    const std::vector<uint8_t> bytes = read_bytes(tmp.path("aligned.gguf"));
    for (size_t k = f->data_offset() + 12; k < f->data_offset() + 64; ++k) CHECK(bytes[k] == 0);
}

TEST_CASE("a tensor from a row source is written as if its data had been given") {
    scratch_dir tmp;
    // q8_0 rows of 64 elements (2 blocks, 68 bytes), more than one of the
    // writer's 16 MiB chunks of rows.
    const int64_t ne0 = 64, rows = 300000;
    const uint64_t row_bytes = 68;
    std::vector<uint8_t> data(size_t(rows * row_bytes));
    for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 31 + i / 68);
    std::vector<std::pair<uint64_t, uint64_t>> asked;
    gguf::writer a, b;
    a.add_tensor("t", 8, {ne0, rows}, data.data(), data.size());
    b.add_tensor("t", 8, {ne0, rows}, [&](uint64_t r0, uint64_t n, void * dst) {
        asked.push_back({r0, n});
        std::memcpy(dst, data.data() + r0 * row_bytes, size_t(n * row_bytes));
    });
    a.write(tmp.path("data.gguf"));
    b.write(tmp.path("rows.gguf"));
    CHECK(read_bytes(tmp.path("data.gguf")) == read_bytes(tmp.path("rows.gguf")));
    REQUIRE(asked.size() == 2); // 20.4 MB in chunks of about 16 MiB
    CHECK(asked[0].first == 0);
    CHECK(asked[1].first == asked[0].second);
    CHECK(asked[0].second + asked[1].second == uint64_t(rows));

    // A source that throws leaves no file behind.
    gguf::writer c;
    c.add_tensor("t", 8, {ne0, rows},
                 [](uint64_t, uint64_t, void *) { throw std::runtime_error("no more rows"); });
    CHECK_THROWS_AS(c.write(tmp.path("failed.gguf")), std::runtime_error);
    CHECK_FALSE(fs::exists(tmp.path("failed.gguf")));
    CHECK_FALSE(fs::exists(tmp.path("failed.gguf.tmp")));
    gguf::writer d;
    CHECK_THROWS_AS(d.add_tensor("t", 8, {ne0, rows}, gguf::writer::row_source{}), gguf::error);
}

TEST_CASE("the writer uses an alignment of 32 when general.alignment is not set") {
    scratch_dir tmp;
    std::vector<uint8_t> a(4, 1);
    gguf::writer w;
    w.set("k", gguf::value::make_str("x"));
    w.add_tensor("a", 24, {4}, a.data(), a.size());
    w.add_tensor("b", 24, {4}, a.data(), a.size());
    w.write(tmp.path("default.gguf"));
    auto f = gguf::file::open(tmp.path("default.gguf"));
    CHECK(f->alignment() == 32);
    CHECK(f->data_offset() % 32 == 0);
    CHECK(f->find_tensor("b")->offset == 32);
}

TEST_CASE("the writer refuses tensors and values that would make a bad file") {
    scratch_dir tmp;
    std::vector<uint8_t> d(1024);
    gguf::writer w;
    CHECK_THROWS_WITH_AS(w.add_tensor("t", 0, {4}, d.data(), 15),
                         doctest::Contains("15 bytes given"), gguf::error);
    CHECK_THROWS_WITH_AS(w.add_tensor("t", 4, {32}, d.data(), 18),
                         doctest::Contains("unknown ggml type 4"), gguf::error);
    CHECK_THROWS_WITH_AS(w.add_tensor("t", 0, {1, 1, 1, 1, 1}, d.data(), 4),
                         doctest::Contains("5 dimensions"), gguf::error);
    CHECK_THROWS_WITH_AS(w.add_tensor("t", 0, {}, d.data(), 4), doctest::Contains("0 dimensions"),
                         gguf::error);
    CHECK_THROWS_WITH_AS(w.add_tensor("t", 8, {33}, d.data(), 34),
                         doctest::Contains("not a multiple of q8_0's block of 32"), gguf::error);
    CHECK_THROWS_WITH_AS(w.add_tensor("t", 0, {-1}, d.data(), 0), doctest::Contains("negative"),
                         gguf::error);
    CHECK_THROWS_WITH_AS(w.add_tensor(std::string(64, 'n'), 0, {1}, d.data(), 4),
                         doctest::Contains("at most 63"), gguf::error);
    w.add_tensor("t", 0, {4}, d.data(), 16);
    CHECK_THROWS_WITH_AS(w.add_tensor("t", 0, {4}, d.data(), 16), doctest::Contains("added twice"),
                         gguf::error);

    gguf::writer mixed;
    mixed.set("mixed", gguf::value::make_array(gguf::type::INT32, {gguf::value::make_u32(1)}));
    CHECK_THROWS_WITH_AS(mixed.write(tmp.path("mixed.gguf")),
                         doctest::Contains("an array of int32 holds a uint32"), gguf::error);
    CHECK_FALSE(fs::exists(tmp.path("mixed.gguf")));

    gguf::writer narrow;
    narrow.set("narrow", integer(gguf::type::UINT8, 0, 300));
    CHECK_THROWS_WITH_AS(narrow.write(tmp.path("narrow.gguf")),
                         doctest::Contains("uint8 300 does not fit"), gguf::error);

    gguf::writer odd;
    odd.set("general.alignment", gguf::value::make_u32(24));
    CHECK_THROWS_WITH_AS(odd.write(tmp.path("odd.gguf")), doctest::Contains("nonzero power of two"),
                         gguf::error);
}

TEST_CASE("a failed write leaves neither the file nor its temporary behind") {
    scratch_dir tmp;
    gguf::writer w;
    w.set("k", gguf::value::make_u32(1));
    const std::string path = tmp.path("no-such-dir/out.gguf");
    CHECK_THROWS_WITH_AS(w.write(path), doctest::Contains("out.gguf.tmp: cannot create"),
                         gguf::error);
    CHECK_FALSE(fs::exists(path));

    // A write over an existing file replaces it whole.
    const std::string good = tmp.path("replace.gguf");
    write_bytes(good, "old", 3);
    w.write(good);
    CHECK(gguf::file::open(good)->get_u64("k") == 1u);
    CHECK_FALSE(fs::exists(good + ".tmp"));
}

// --- typed look-ups --------------------------------------------------------------------

TEST_CASE("typed getters convert integers that fit and name the key when the type is wrong") {
    scratch_dir tmp;
    gguf::writer w;
    w.set("u8", integer(gguf::type::UINT8, 0, 200));
    w.set("i8", integer(gguf::type::INT8, -5, 0));
    w.set("i16.pos", integer(gguf::type::INT16, 7, 0));
    w.set("u64.big", gguf::value::make_u64(uint64_t(1) << 63));
    w.set("f32", gguf::value::make_f32(0.5f));
    w.set("flag", gguf::value::make_bool(true));
    w.set("name", gguf::value::make_str("smol"));
    w.set("tokens", gguf::value::make_str_array({"a", "b", "c"}));
    w.set("ids", gguf::value::make_array(gguf::type::INT32, {gguf::value::make_i32(-1)}));
    const std::string path = tmp.path("getters.gguf");
    w.write(path);
    auto f = gguf::file::open(path);

    CHECK(f->get_u64("u8") == 200u);
    CHECK(f->get_i64("u8") == 200);
    CHECK(f->get_f64("u8") == 200.0);
    CHECK(f->get_i64("i8") == -5);
    CHECK(f->get_f64("i8") == -5.0);
    CHECK(f->get_u64("i16.pos") == 7u);
    CHECK(f->get_u64("u64.big") == uint64_t(1) << 63);
    CHECK(f->get_f64("f32") == 0.5);
    CHECK(f->get_bool("flag") == true);
    CHECK(f->get_str("name") == "smol");
    REQUIRE(f->get_array("tokens", gguf::type::STRING) != nullptr);
    CHECK(f->get_array("tokens", gguf::type::STRING)->at(2).str == "c");
    CHECK(f->get_array("ids", gguf::type::INT32)->at(0).i == -1);

    CHECK_FALSE(f->get_u64("missing").has_value());
    CHECK_FALSE(f->get_i64("missing").has_value());
    CHECK_FALSE(f->get_f64("missing").has_value());
    CHECK_FALSE(f->get_bool("missing").has_value());
    CHECK_FALSE(f->get_str("missing").has_value());
    CHECK(f->get_array("missing", gguf::type::STRING) == nullptr);
    CHECK(f->find("missing") == nullptr);
    CHECK(f->find_tensor("missing") == nullptr);

    const auto wrong = [&](auto && get, const char * key, const char * part) {
        INFO("key ", key);
        try {
            get(key);
            FAIL("no error for key ", key);
        } catch (const gguf::error & e) {
            CHECK(contains(e.what(), path));
            CHECK(contains(e.what(), std::string("'") + key + "'"));
            CHECK(contains(e.what(), part));
        }
    };
    wrong([&](const char * k) { f->get_u64(k); }, "i8", "int8 -5");
    wrong([&](const char * k) { f->get_i64(k); }, "u64.big", "does not fit int64");
    wrong([&](const char * k) { f->get_u64(k); }, "f32", "not an unsigned integer");
    wrong([&](const char * k) { f->get_i64(k); }, "name", "not an integer");
    wrong([&](const char * k) { f->get_f64(k); }, "flag", "not a number");
    wrong([&](const char * k) { f->get_bool(k); }, "u8", "not a bool");
    wrong([&](const char * k) { f->get_str(k); }, "tokens", "not a string");
    wrong([&](const char * k) { f->get_array(k, gguf::type::INT32); }, "tokens",
          "array of string, not an array of int32");
    wrong([&](const char * k) { f->get_array(k, gguf::type::STRING); }, "name",
          "not an array of string");
}

TEST_CASE("values compare by type and contents") {
    using gguf::value;
    CHECK(value::make_u32(5) == value::make_u32(5));
    CHECK_FALSE(value::make_u32(5) == value::make_u64(5));
    CHECK_FALSE(value::make_u32(5) == value::make_i32(5));
    CHECK(value::make_f32(std::nanf("")) == value::make_f32(std::nanf("")));
    CHECK(value::make_str_array({"a", "b"}) ==
          value::make_array(gguf::type::STRING, {value::make_str("a"), value::make_str("b")}));
    CHECK_FALSE(value::make_str_array({"a"}) == value::make_array(gguf::type::INT32, {}));
    CHECK(value::make_u32(1).is_integer());
    CHECK(value::make_f32(1).is_float());
    CHECK_FALSE(value::make_bool(true).is_integer());
    CHECK(std::string(gguf::type_name(gguf::type::FLOAT64)) == "float64");
    CHECK(std::string(gguf::type_name(static_cast<gguf::type>(99))) == "unknown");
}

TEST_CASE("tensor_type_info knows ggml's block sizes and no retired ids") {
    struct expect {
        uint32_t id;
        const char * name;
        uint32_t elems, bytes;
    };
    const expect known[] = {{0, "f32", 1, 4},       {1, "f16", 1, 2},       {2, "q4_0", 32, 18},
                            {3, "q4_1", 32, 20},    {8, "q8_0", 32, 34},    {10, "q2_K", 256, 84},
                            {12, "q4_K", 256, 144}, {14, "q6_K", 256, 210}, {24, "i8", 1, 1},
                            {28, "f64", 1, 8},      {30, "bf16", 1, 2},     {39, "mxfp4", 32, 17}};
    for (const expect & e : known) {
        const gguf::tensor_type_traits * tt = gguf::tensor_type_info(e.id);
        REQUIRE(tt != nullptr);
        CHECK(std::string(tt->name) == e.name);
        CHECK(tt->block_elems == e.elems);
        CHECK(tt->block_bytes == e.bytes);
    }
    for (uint32_t retired : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 1000u, UINT32_MAX}) {
        CHECK(gguf::tensor_type_info(retired) == nullptr);
    }
    // Every id is checked against the python gguf package's table by
    // gguf-python-reads-written, which holds one tensor of each type.
}

// --- corrupt and hostile files ------------------------------------------------------------

TEST_CASE("a hand-built valid file opens, so each corrupt variant fails for its own fault") {
    scratch_dir tmp;
    const raw_file r = valid_raw();
    write_bytes(tmp.path("valid.gguf"), r.b.data(), r.b.size());
    auto f = gguf::file::open(tmp.path("valid.gguf"));
    CHECK(f->get_str("general.architecture") == "llama");
    CHECK(f->find_tensor("t")->nbytes == 128);
}

TEST_CASE("corrupt and hostile files fail with a message naming the file and the fault") {
    scratch_dir tmp;
    for (const bad_file & c : bad_files()) {
        const std::string path = tmp.path("bad.gguf");
        write_bytes(path, c.file.b.data(), c.file.b.size());
        for (bool use_mmap : {true, false}) {
            INFO(std::string(c.what), ", use_mmap ", use_mmap);
            const std::string msg = open_error(path, use_mmap);
            INFO("message: ", msg);
            REQUIRE_FALSE(msg.empty());
            CHECK(msg.rfind(path + ": ", 0) == 0);
            for (const std::string & part : c.expect) CHECK(contains(msg, part));
        }
    }
}

TEST_CASE("a missing file fails with its path and the reason") {
    scratch_dir tmp;
    const std::string msg = open_error(tmp.path("absent.gguf"), true);
    CHECK(contains(msg, tmp.path("absent.gguf")));
    CHECK(contains(msg, "No such file"));
    CHECK(contains(open_error(tmp.dir.string(), true), "not a regular file"));
}

TEST_CASE("a file truncated at any byte fails with an error, never a crash") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937_64 rng(seed);
    scratch_dir tmp;

    gguf::writer w;
    w.set("general.architecture", gguf::value::make_str("llama"));
    w.set("a.u32", gguf::value::make_u32(7));
    w.set("a.tokens", gguf::value::make_str_array({"x", "yy", "zzz"}));
    w.set("a.nested", random_value(gguf::type::ARRAY, rng, 2));
    w.set("a.f32", gguf::value::make_f32(1.5f));
    std::vector<uint8_t> q(34 * 2), f32(64);
    for (uint8_t & b : q) b = uint8_t(rng());
    w.add_tensor("q", 8, {32, 2}, q.data(), q.size());
    // A last tensor of whole alignment units: the file ends with its data, so
    // every shorter prefix lacks bytes the reader needs.
    w.add_tensor("f", 0, {16}, f32.data(), f32.size());
    const std::string full = tmp.path("full.gguf");
    w.write(full);
    const std::vector<uint8_t> bytes = read_bytes(full);
    REQUIRE(gguf::file::open(full)->tensors().size() == 2);

    const std::string path = tmp.path("cut.gguf");
    for (size_t n = 0; n < bytes.size(); ++n) {
        write_bytes(path, bytes.data(), n);
        for (bool use_mmap : {true, false}) {
            INFO("truncated to ", n, " of ", bytes.size(), " bytes, use_mmap ", use_mmap);
            const std::string msg = open_error(path, use_mmap);
            INFO("message: ", msg);
            REQUIRE_FALSE(msg.empty());
            CHECK(contains(msg, path));
            if (n >= 8) CHECK(contains(msg, "truncated"));
        }
    }
}

TEST_CASE("a file with random bytes changed either opens or fails with gguf::error") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937_64 rng(seed);
    scratch_dir tmp;

    gguf::writer w;
    for (const gguf::kv & e : random_metadata(rng)) {
        if (e.key != "test.many_strings") w.set(e.key, e.val);
    }
    std::vector<uint8_t> d(34 * 4);
    w.add_tensor("a", 8, {64, 2}, d.data(), d.size());
    w.add_tensor("b", 0, {8}, d.data(), 32);
    w.write(tmp.path("base.gguf"));
    const std::vector<uint8_t> base = read_bytes(tmp.path("base.gguf"));

    const std::string path = tmp.path("mutant.gguf");
    int opened = 0;
    for (int k = 0; k < 1500; ++k) {
        std::vector<uint8_t> b = base;
        const int flips = 1 + int(rng() % 4);
        for (int j = 0; j < flips; ++j) {
            // Aim most changes at the header and metadata, where the counts are.
            const size_t limit = rng() % 4 ? std::min<size_t>(b.size(), 512) : b.size();
            b[rng() % limit] = rng() % 3 ? uint8_t(rng()) : 0xff;
        }
        write_bytes(path, b.data(), b.size());
        INFO("mutant ", k);
        if (open_error(path, true).empty()) ++opened;
    }
    CHECK(opened < 1500); // most changes must have been caught
}

// --- the real model -----------------------------------------------------------------------

TEST_CASE("the real SmolLM2-135M file reads with its known metadata and tensors") {
    const std::string path = SMOL_MODEL;
    if (!fs::exists(path)) {
        FAIL("the model ", path, " is missing; run scripts/fetch-model.sh to download it");
    }
    for (bool use_mmap : {true, false}) {
        INFO("use_mmap ", use_mmap);
        auto f = gguf::file::open(path, use_mmap);
        CHECK(f->version() == 3);
        CHECK(f->alignment() == 32);
        CHECK(f->metadata().size() == 33);
        CHECK(f->tensors().size() == 272);
        CHECK(f->get_str("general.architecture") == "llama");
        CHECK(f->get_u64("llama.block_count") == 30u);
        CHECK(f->get_u64("llama.embedding_length") == 576u);
        CHECK(f->get_u64("llama.attention.head_count") == 9u);
        CHECK(f->get_u64("llama.attention.head_count_kv") == 3u);
        CHECK(f->get_str("tokenizer.ggml.model") == "gpt2");
        const auto * tokens = f->get_array("tokenizer.ggml.tokens", gguf::type::STRING);
        REQUIRE(tokens != nullptr);
        CHECK(tokens->size() == 49152);
        CHECK(f->get_array("tokenizer.ggml.merges", gguf::type::STRING)->size() == 48900);
        CHECK(f->get_array("tokenizer.ggml.token_type", gguf::type::INT32)->size() == 49152);

        const gguf::tensor_info * emb = f->find_tensor("token_embd.weight");
        REQUIRE(emb != nullptr);
        CHECK(emb->type == 8);
        CHECK(emb->n_dims == 2);
        CHECK(emb->ne[0] == 576);
        CHECK(emb->ne[1] == 49152);
        CHECK(emb->nbytes == 576 * 49152 / 32 * 34);
        const gguf::tensor_info * norm = f->find_tensor("blk.0.attn_norm.weight");
        REQUIRE(norm != nullptr);
        CHECK(norm->type == 0);
        CHECK(norm->n_elements() == 576);
        CHECK(f->find_tensor("blk.29.ffn_down.weight") != nullptr);
    }
}

// --- sidecars for scripts/check-gguf.py ------------------------------------------------------

TEST_CASE("a file with every value and tensor type is written for the python gguf reader") {
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937_64 rng(seed);

    std::vector<gguf::kv> kvs = random_metadata(rng);
    // The python reader insists on a uint32 alignment; 64 tests the padding.
    kvs.insert(kvs.begin(), {"general.alignment", gguf::value::make_u32(64)});
    const std::vector<test_tensor> ts = random_tensors(rng);
    gguf::writer w;
    add_all(w, kvs, ts);
    const std::string path = out_path("written.gguf");
    w.write(path);

    auto f = gguf::file::open(path);
    check_contents(*f, kvs, ts);
    // The expectations come from what was asked for, the tensor layout from
    // the reader (the script checks offsets and bytes independently).
    const std::string json = sidecar(kvs, f->tensors(), f->alignment(), f->data_offset());
    const std::string json_path = out_path("written.json");
    write_bytes(json_path, json.data(), json.size());
}

TEST_CASE("the real model's metadata and tensor infos are written for the python gguf reader") {
    const std::string path = SMOL_MODEL;
    if (!fs::exists(path)) {
        FAIL("the model ", path, " is missing; run scripts/fetch-model.sh to download it");
    }
    auto f = gguf::file::open(path);
    const std::string json = sidecar(f->metadata(), f->tensors(), f->alignment(), f->data_offset());
    write_bytes(out_path("model.json"), json.data(), json.size());
}
