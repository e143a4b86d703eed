// test-cuda.c++ - the CUDA backend's ops against the CPU backend and
// float64 references: every op on fresh random inputs with poisoned
// outputs, attention with every kernel, the matmul for every weight type
// and batch size, the autotune, and fused llama layers. Whole models are
// test-cuda-models.c++'s. Without a GPU only the refusal is checked; every
// other test says it was skipped.

// Its own main (at the end) skips the GPU cases where there is no GPU.
#define DOCTEST_CONFIG_IMPLEMENT
#include "test-cuda.h"

#include "smol-backend.h"
#include "smol-cpu-kernels.h"
#include "smol-error.h"
#include "smol-graph.h"
#include "smol.h"
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
#include <memory>
#include <random>
#include <string>
#include <vector>

using cuda_test::all_types;
using cuda_test::rel_err;

namespace {

using smol::backend;
using smol::graph;
using smol::placement;
using smol::tensor;

// A row width near K that holds whole blocks of t: the 256-element types
// take the next multiple of 256.
int64_t width_for(smol_type t, int64_t K) {
    const int64_t b = smol::type_block_elems(t);
    return (K + b - 1) / b * b;
}

// The GPU backend with these options; main skips the cases that ask for it
// where there is none, so here its absence is a failure.
std::unique_ptr<backend> gpu(const smol::backend_options & options = {}) {
    std::unique_ptr<backend> be;
    try {
        be = smol::make_cuda_backend(0, options);
    } catch (const smol::error & e) {
        FAIL_CHECK("no GPU backend: " << std::string(e.what()));
    }
    REQUIRE(be);
    return be;
}

std::unique_ptr<backend> cpu() {
    return smol::make_backend("cpu", 4);
}

// One graph built the same way for any backend: leaves are copied into the
// backend's memory, int32 inputs stay in host memory (as the model's do) and
// the result is written over poison, so unwritten elements show as NaN.
struct side {
    backend & be;
    graph g{512};
    std::vector<void *> owned;

    explicit side(backend & b) : be(b) {}
    side(const side &) = delete;
    ~side() {
        for (void * p : owned) be.release(p);
    }
    void * copy(const void * host, size_t n) {
        void * p = be.alloc(n);
        owned.push_back(p);
        be.upload(p, host, n);
        return p;
    }
    tensor * leaf(smol_type t, const void * host, int64_t ne0, int64_t ne1 = 1) {
        tensor * x = g.leaf(t, nullptr, ne0, ne1);
        x->data = copy(host, x->nbytes());
        x->where = be.where();
        return x;
    }
    tensor * ints(std::vector<int32_t> & v) {
        tensor * x = g.new_tensor(SMOL_TYPE_F32, int64_t(v.size()));
        x->data = v.data();
        x->where = placement::host;
        return x;
    }
    void poison(tensor * t) {
        void * p = be.alloc(t->nbytes());
        owned.push_back(p);
        be.memset(p, 0xff, t->nbytes());
        t->data = p;
    }
    std::vector<float> read(const tensor * t) {
        std::vector<float> out(t->nbytes() / sizeof(float));
        be.download(out.data(), t->data, t->nbytes());
        return out;
    }
};

std::vector<float> random_floats(std::mt19937 & rng, size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto & x : v) x = d(rng);
    return v;
}

// Rows of f32 in the file layout of type t.
std::vector<uint8_t> to_type(smol_type t, const std::vector<float> & x, int64_t ne0) {
    const auto & k = smol::cpu::kernels_best();
    const int64_t rows = int64_t(x.size()) / ne0;
    const size_t rb = smol::cpu::row_bytes(t, ne0);
    std::vector<uint8_t> out(rb * size_t(rows));
    for (int64_t r = 0; r < rows; ++r)
        k.row_from_f32(t, x.data() + r * ne0, out.data() + r * rb, ne0);
    return out;
}

std::vector<float> from_type(smol_type t, const std::vector<uint8_t> & b, int64_t ne0,
                             int64_t rows) {
    const auto & k = smol::cpu::kernels_best();
    const size_t rb = smol::cpu::row_bytes(t, ne0);
    std::vector<float> out(size_t(ne0 * rows));
    for (int64_t r = 0; r < rows; ++r)
        k.row_to_f32(t, b.data() + r * rb, out.data() + r * ne0, ne0);
    return out;
}

// W x in float64 for the M columns of x (K each): W's N rows of K as
// floats; token m's results at m * N.
std::vector<double> mul_mat_f64(const std::vector<float> & w, const std::vector<float> & x,
                                int64_t K, int64_t N, int64_t M) {
    std::vector<double> y(size_t(M * N));
    for (int64_t m = 0; m < M; ++m)
        for (int64_t r = 0; r < N; ++r) {
            double acc = 0;
            for (int64_t k = 0; k < K; ++k)
                acc += double(w[size_t(r * K + k)]) * double(x[size_t(m * K + k)]);
            y[size_t(m * N + r)] = acc;
        }
    return y;
}

// One mul_mat on be: weights wq (type t, N rows of K) times x (M columns of
// K), written over poison.
std::vector<float> mul_mat_on(backend & be, smol_type t, const std::vector<uint8_t> & wq,
                              const std::vector<float> & x, int64_t K, int64_t N, int64_t M) {
    side s(be);
    tensor * out =
        smol::op_mul_mat(s.g, s.leaf(t, wq.data(), K, N), s.leaf(SMOL_TYPE_F32, x.data(), K, M));
    s.poison(out);
    be.run(s.g);
    return s.read(out);
}

// The largest difference of two f16 arrays relative to the largest value.
double f16_err(const std::vector<uint16_t> & a, const std::vector<uint16_t> & b) {
    std::vector<float> fa(a.size());
    std::vector<double> fb(b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        fa[i] = smol::cpu::fp16_to_fp32(a[i]);
        fb[i] = smol::cpu::fp16_to_fp32(b[i]);
    }
    return rel_err(fa, fb);
}

} // namespace

TEST_CASE("cuda:0 is a device backend, or asking for it says why there is none") {
    try {
        auto be = smol::make_backend("cuda:0", 1);
        CHECK(std::string(be->name()) == "cuda:0");
        CHECK(be->where() == placement::device);
    } catch (const smol::error & e) {
        CHECK(e.status == SMOL_ERR_BACKEND);
        CHECK(std::string(e.what()).find("device") != std::string::npos);
        MESSAGE("no GPU here: " << std::string(e.what()));
    }
    CHECK_THROWS_AS(smol::make_backend("cuda:99", 1), smol::error);
    std::string variants;
    for (const auto * k : smol::cpu::kernels_available()) variants += std::string(" ") + k->name;
    MESSAGE("CPU kernel variants this machine runs:" << variants);
}

// Every case from here on needs a GPU: main skips them where there is none.
TEST_SUITE_BEGIN("gpu");

TEST_CASE("device memory round-trips through upload, memset and download") {
    auto be = gpu();
    std::vector<uint8_t> a(1000), b(1000);
    for (size_t i = 0; i < a.size(); ++i) a[i] = uint8_t(i * 7);
    void * p = be->alloc(a.size());
    be->upload(p, a.data(), a.size());
    be->download(b.data(), p, b.size());
    CHECK(a == b);
    be->memset(p, 0x5a, 100);
    be->download(b.data(), p, b.size());
    CHECK(b[0] == 0x5a);
    CHECK(b[99] == 0x5a);
    CHECK(b[100] == a[100]);
    be->release(p);
}

TEST_CASE("get_rows dequantizes rows of every type as the CPU does") {
    SMOL_TEST_DRAW_SEED(case_seed);
    uint32_t draws = 0; // the seeds of its runs, derived from case_seed
    auto g_be = gpu();
    auto c_be = cpu();
    for (smol_type t : all_types) {
        const uint32_t seed = test::derived_seed(case_seed, draws++);
        const std::string type = smol_type_name(t);
        CAPTURE(type);
        std::mt19937 rng(seed);
        const int64_t K = width_for(t, 576), rows = 50;
        const auto table = to_type(t, random_floats(rng, size_t(K * rows)), K);
        std::vector<int32_t> ids(13);
        for (auto & i : ids) i = int32_t(rng() % rows);
        auto run = [&](backend & be) {
            side s(be);
            tensor * out = smol::op_get_rows(s.g, s.leaf(t, table.data(), K, rows), s.ints(ids));
            s.poison(out);
            be.run(s.g);
            return s.read(out);
        };
        CHECK(rel_err(run(*g_be), run(*c_be)) <= 1e-6);
    }
}

TEST_CASE("rms_norm (whole rows and per head), add, scale, swiglu and geglu match the CPU to "
          "float rounding") {
    auto g_be = gpu();
    auto c_be = cpu();
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    const int64_t n = 1536, rows = 7, head = 256;
    const auto a = random_floats(rng, size_t(n * rows)), b = random_floats(rng, size_t(n * rows));
    const auto w = random_floats(rng, size_t(n));
    const char * names[] = {"rms_norm", "add", "swiglu", "rms_norm per head", "scale", "geglu"};
    for (int which = 0; which < 6; ++which) {
        CAPTURE(names[which]);
        auto run = [&](backend & be) {
            side s(be);
            tensor * x = s.leaf(SMOL_TYPE_F32, a.data(), n, rows);
            tensor * y = s.leaf(SMOL_TYPE_F32, b.data(), n, rows);
            tensor * out =
                which == 0   ? smol::op_rms_norm(s.g, x, s.leaf(SMOL_TYPE_F32, w.data(), n), 1e-5f)
                : which == 1 ? smol::op_add(s.g, x, y)
                : which == 2 ? smol::op_swiglu(s.g, x, y)
                : which == 3
                    ? smol::op_rms_norm(s.g, x, s.leaf(SMOL_TYPE_F32, w.data(), head), 1e-6f, head)
                : which == 4 ? smol::op_scale(s.g, x, 25.3f)
                             : smol::op_geglu(s.g, x, y);
            s.poison(out);
            be.run(s.g);
            return s.read(out);
        };
        CHECK(rel_err(run(*g_be), run(*c_be)) <= 1e-5);
    }
}

TEST_CASE("argmax picks the first of equal maxima, passing NaNs over, as the CPU does") {
    auto g_be = gpu();
    auto c_be = cpu();
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = INFINITY;
    for (const int64_t n : {int64_t(49152), int64_t(1031)}) {
        CAPTURE(n);
        const int64_t rows = 8;
        std::vector<float> a = random_floats(rng, size_t(n * rows));
        auto row = [&](int64_t r) { return a.data() + r * n; };
        std::uniform_int_distribution<int64_t> at(0, n - 1);
        const int64_t i0 = at(rng), i1 = at(rng);
        row(1)[i0] = row(1)[i1] = 40.0f; // two equal maxima
        for (int k = 0; k < 50; ++k) row(2)[at(rng)] = nan;
        row(2)[0] = nan;
        std::fill_n(row(3), n, -inf);
        std::fill_n(row(4), n, nan);
        for (int64_t i = 0; i < n; ++i) row(5)[i] = -1.0f - std::fabs(row(5)[i]);
        row(5)[std::max(i0, i1)] = -0.0f; // zeros of both signs, equal
        row(5)[std::min(i0, i1)] = 0.0f;
        row(6)[n - 1] = 50.0f;
        row(7)[at(rng)] = inf;
        // The index wanted, found here in plain loops.
        std::vector<int32_t> want(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) {
            float best = -inf;
            for (int64_t i = 0; i < n; ++i)
                if (row(r)[i] > best) best = row(r)[i];
            int32_t w = 0;
            if (best > -inf) {
                while (!(row(r)[w] == best)) ++w;
            }
            want[size_t(r)] = w;
        }
        auto run = [&](backend & be) {
            side s(be);
            tensor * out = smol::op_argmax(s.g, s.leaf(SMOL_TYPE_F32, a.data(), n, rows));
            s.poison(out);
            be.run(s.g);
            const std::vector<float> f = s.read(out);
            std::vector<int32_t> got(f.size());
            std::memcpy(got.data(), f.data(), f.size() * sizeof(float));
            return got;
        };
        CHECK(run(*c_be) == want);
        CHECK(run(*g_be) == want);
    }
}

TEST_CASE("rope turns adjacent pairs, or NeoX's pairs, by the CPU's angles") {
    auto g_be = gpu();
    auto c_be = cpu();
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    for (int hd : {16, 64, 128, 256})
        for (bool neox : {false, true}) {
            CAPTURE(hd);
            CAPTURE(neox);
            const int n_head = 9, n_tok = 7;
            const auto x = random_floats(rng, size_t(n_head * hd * n_tok));
            std::vector<int32_t> pos(n_tok);
            for (auto & p : pos) p = int32_t(rng() % 9000);
            auto run = [&](backend & be) {
                side s(be);
                tensor * out =
                    smol::op_rope(s.g, s.leaf(SMOL_TYPE_F32, x.data(), n_head * hd, n_tok),
                                  s.ints(pos), n_head, hd, 10000.0f, neox);
                s.poison(out);
                be.run(s.g);
                return s.read(out);
            };
            CHECK(rel_err(run(*g_be), run(*c_be)) <= 1e-5);
        }
}

namespace {

// A cache with a random history in two sequences (some cells free, some
// positions after the batch's) and a batch that writes its own cells.
struct attn_setup {
    int n_head, n_head_kv, hd, n_cells, n_tok;
    smol::kv_cache kv;
    std::vector<uint16_t> k_hist, v_hist;
    std::vector<int32_t> pos, seq, cell;
    std::vector<float> q, k, v;

    attn_setup(std::mt19937 & rng, int nh, int nkv, int d, int cells, int tokens)
        : n_head(nh), n_head_kv(nkv), hd(d), n_cells(cells), n_tok(tokens) {
        fill_cache(rng);
        const int history = n_cells - n_tok - 3;
        for (int c = 0; c < history; ++c) {
            if (rng() % 10 == 0) continue; // a free cell
            kv.cell_pos[size_t(c)] = int32_t(rng() % 500);
            kv.cell_seqs[size_t(c)] = smol::seq_mask::of(rng() % 2);
        }
        kv.n_used = history;
        int c = 0;
        for (int i = 0; i < n_tok; ++i) {
            while (kv.cell_pos[size_t(c)] >= 0) ++c;
            pos.push_back(400 + int32_t(rng() % 200));
            seq.push_back(int32_t(rng() % 2));
            cell.push_back(c);
            kv.cell_pos[size_t(c)] = pos.back();
            kv.cell_seqs[size_t(c)] = smol::seq_mask::of(seq.back());
            kv.n_used = std::max(kv.n_used, c + 1);
        }
        fill_batch(rng);
    }

    // A cache as a server leaves it: `history` cells before the batch, one
    // in eight free, the others of three sequences with positions rising per
    // sequence, then a quarter of them swapped so that cells are not in
    // position order. The batch continues sequence 0 (a prompt) with every
    // fifth token continuing sequence 1; it takes the free cells first, then
    // cells past the history.
    struct served {
        int history;
    };
    attn_setup(std::mt19937 & rng, int nh, int nkv, int d, served h, int tokens)
        : n_head(nh), n_head_kv(nkv), hd(d), n_cells(h.history + tokens + 16), n_tok(tokens) {
        fill_cache(rng);
        int next[3] = {0, 0, 0};
        for (int c = 0; c < h.history; ++c) {
            if (rng() % 8 == 0) continue;
            const int s = int(rng() % 3);
            kv.cell_pos[size_t(c)] = next[s]++;
            kv.cell_seqs[size_t(c)] = smol::seq_mask::of(s);
        }
        for (int i = 0; i < h.history / 4; ++i) {
            const size_t a = rng() % size_t(h.history), b = rng() % size_t(h.history);
            std::swap(kv.cell_pos[a], kv.cell_pos[b]);
            std::swap(kv.cell_seqs[a], kv.cell_seqs[b]);
        }
        kv.n_used = h.history;
        int c = 0;
        for (int i = 0; i < n_tok; ++i) {
            while (kv.cell_pos[size_t(c)] >= 0) ++c;
            const int s = i % 5 == 4 ? 1 : 0;
            pos.push_back(next[s]++);
            seq.push_back(s);
            cell.push_back(c);
            kv.cell_pos[size_t(c)] = pos.back();
            kv.cell_seqs[size_t(c)] = smol::seq_mask::of(s);
            kv.n_used = std::max(kv.n_used, c + 1);
        }
        fill_batch(rng);
    }

    // A long prompt in position order, as a chunked prefill leaves the cache:
    // cells 0..history-1 hold sequence 0's positions 0..history-1, the first
    // `shared` of them held by sequence 1 too (a prefix both share). The
    // batch continues sequence 0 at `history`, every fifth token (when
    // shared > 0) continuing sequence 1 after the prefix instead. Most tiles
    // of cells are seen whole by every query of a block of the flash kernel;
    // blocks that mix the two sequences see the shared prefix whole and the
    // rest masked.
    struct prompt {
        int history, shared;
    };
    attn_setup(std::mt19937 & rng, int nh, int nkv, int d, prompt h, int tokens)
        : n_head(nh), n_head_kv(nkv), hd(d), n_cells(h.history + tokens + 5), n_tok(tokens) {
        fill_cache(rng);
        for (int c = 0; c < h.history; ++c) {
            kv.cell_pos[size_t(c)] = c;
            kv.cell_seqs[size_t(c)] = c < h.shared ? smol::seq_mask::of(0) | smol::seq_mask::of(1)
                                                   : smol::seq_mask::of(0);
        }
        int next[2] = {h.history, h.shared};
        for (int i = 0; i < n_tok; ++i) {
            const int s = h.shared > 0 && i % 5 == 4 ? 1 : 0;
            const int c = h.history + i;
            pos.push_back(next[s]++);
            seq.push_back(s);
            cell.push_back(c);
            kv.cell_pos[size_t(c)] = pos.back();
            kv.cell_seqs[size_t(c)] = smol::seq_mask::of(s);
        }
        kv.n_used = h.history + n_tok;
        fill_batch(rng);
    }

    // Sequences decoded together, as smol's own cell allocation leaves them:
    // n_seqs sequences of about `history` positions each, taken a token at a
    // time in a random order through kv_cache::find_cell (pages of their
    // own), after a first page of sequence 0 that every sequence shares (a
    // common prefix); one cell in sixteen freed after. The batch is one
    // token of each sequence.
    struct paged {
        int n_seqs, history;
    };
    attn_setup(std::mt19937 & rng, int nh, int nkv, int d, paged h)
        : n_head(nh), n_head_kv(nkv), hd(d),
          n_cells((h.history * 3 / 2 + 2 * smol::kv_page) * h.n_seqs + smol::kv_page),
          n_tok(h.n_seqs) {
        fill_cache(rng);
        // Every sequence's newest cell is the shared page's last.
        std::vector<int32_t> tail(size_t(h.n_seqs), smol::kv_page - 1),
            next(size_t(h.n_seqs), smol::kv_page);
        smol::seq_mask all = smol::seq_mask::none();
        for (int s = 0; s < h.n_seqs; ++s) all |= smol::seq_mask::of(s);
        for (int c = 0; c < smol::kv_page; ++c) {
            kv.cell_pos[size_t(c)] = c;
            kv.cell_seqs[size_t(c)] = all;
        }
        std::vector<int> order;
        for (int s = 0; s < h.n_seqs; ++s) {
            const int n = h.history / 2 + int(rng() % uint32_t(h.history));
            order.insert(order.end(), size_t(n), s);
        }
        std::shuffle(order.begin(), order.end(), rng);
        auto take = [&](int s) {
            int32_t page_from = 0, cell_from = 0;
            const int32_t c = kv.find_cell(tail[size_t(s)], page_from, cell_from);
            REQUIRE(c >= 0);
            kv.cell_pos[size_t(c)] = next[size_t(s)]++;
            kv.cell_seqs[size_t(c)] = smol::seq_mask::of(s);
            kv.n_used = std::max(kv.n_used, c + 1);
            tail[size_t(s)] = c;
            return c;
        };
        kv.n_used = smol::kv_page;
        for (int s : order) take(s);
        for (int c = smol::kv_page; c < kv.n_used; ++c) {
            if (rng() % 16 != 0) continue;
            kv.cell_pos[size_t(c)] = -1;
            kv.cell_seqs[size_t(c)] = smol::seq_mask::none();
        }
        for (int s = 0; s < h.n_seqs; ++s) {
            const int32_t p = next[size_t(s)];
            cell.push_back(take(s));
            pos.push_back(p);
            seq.push_back(s);
        }
        fill_batch(rng);
    }

    void fill_cache(std::mt19937 & rng) {
        kv.init(2, n_head_kv, hd, n_cells);
        const size_t n = kv.bytes_per_tensor() / 2;
        std::vector<float> kh = random_floats(rng, n), vh = random_floats(rng, n);
        k_hist.resize(n);
        v_hist.resize(n);
        for (size_t i = 0; i < n; ++i) {
            k_hist[i] = smol::cpu::fp32_to_fp16(kh[i]);
            v_hist[i] = smol::cpu::fp32_to_fp16(vh[i]);
        }
    }
    void fill_batch(std::mt19937 & rng) {
        q = random_floats(rng, size_t(n_head * hd * n_tok));
        k = random_floats(rng, size_t(n_head_kv * hd * n_tok));
        v = random_floats(rng, size_t(n_head_kv * hd * n_tok));
    }

    // Runs kv_store then attention (with rope on q and k when asked) on be;
    // returns the attention output and the cache's K and V.
    struct result {
        std::vector<float> out;
        std::vector<uint16_t> K, V;
    };
    // G > 0: the kv heads in groups of G (n_head_kv a multiple of G); opts:
    // a sliding window and a scale; neox: the rope's pairs half a head apart.
    result run(backend & be, bool rope, int G = 0, smol::attn_opts opts = {}, bool neox = false) {
        side s(be);
        smol::kv_cache c = kv;
        c.k = static_cast<uint16_t *>(s.copy(k_hist.data(), kv.bytes_per_tensor()));
        c.v = static_cast<uint16_t *>(s.copy(v_hist.data(), kv.bytes_per_tensor()));
        tensor * tq = s.leaf(SMOL_TYPE_F32, q.data(), n_head * hd, n_tok);
        tensor * tk = s.leaf(SMOL_TYPE_F32, k.data(), n_head_kv * hd, n_tok);
        tensor * tv = s.leaf(SMOL_TYPE_F32, v.data(), n_head_kv * hd, n_tok);
        if (rope) {
            tensor * tp = s.ints(pos);
            tq = smol::op_rope(s.g, tq, tp, n_head, hd, 10000.0f, neox);
            tk = smol::op_rope(s.g, tk, tp, n_head_kv, hd, 10000.0f, neox);
        }
        tensor * out = nullptr;
        if (G == 0) {
            tensor * stored = smol::op_kv_store(s.g, tk, tv, 1);
            out = smol::op_attention(s.g, tq, stored, 1, n_head, n_head_kv, hd, opts);
            s.poison(out);
        } else {
            // The layer's kv heads in groups of G, a store and an attention
            // node each over a view of the cache, as a plan with head groups
            // builds; every group writes its heads into the first's output.
            for (int h0 = 0; h0 < n_head_kv; h0 += G) {
                smol::kv_view v;
                v.head_stride = size_t(n_cells) * size_t(hd);
                const size_t at = (size_t(n_head_kv) + size_t(h0)) * v.head_stride; // layer 1
                v.k = c.k + at;
                v.v = c.v + at;
                v.h0 = h0;
                v.h1 = h0 + G;
                tensor * stored = smol::op_kv_store_heads(s.g, tk, tv, 1, v, nullptr);
                out = smol::op_attention_heads(s.g, tq, stored, 1, n_head, n_head_kv, hd, v, out,
                                               opts);
            }
        }
        s.g.batch = smol::batch_info{pos.data(), seq.data(), cell.data(), n_tok, &c};
        be.run(s.g);
        result r;
        r.out = s.read(out);
        r.K.resize(kv.bytes_per_tensor() / 2);
        r.V.resize(r.K.size());
        be.download(r.K.data(), c.k, kv.bytes_per_tensor());
        be.download(r.V.data(), c.v, kv.bytes_per_tensor());
        return r;
    }
};

} // namespace

TEST_CASE("kv_store and attention match the CPU for decode and prefill shapes") {
    SMOL_TEST_DRAW_SEED(case_seed);
    uint32_t draws = 0; // the seeds of its runs, derived from case_seed
    auto g_be = gpu();
    auto c_be = cpu();
    struct shape {
        int n_head, n_head_kv, hd, n_cells, n_tok;
    };
    // SmolLM2-135M's heads for decode, a few tokens and a prompt; the tiny
    // test models' 16-wide heads; 128 and 256-wide heads without GQA.
    const shape shapes[] = {{9, 3, 64, 300, 1}, {9, 3, 64, 300, 7},   {9, 3, 64, 700, 64},
                            {4, 2, 16, 64, 5},  {8, 8, 128, 1000, 1}, {4, 1, 256, 200, 3},
                            {9, 3, 64, 4000, 1}};
    for (const shape & sh : shapes) {
        for (bool rope : {false, true}) {
            const uint32_t seed = test::derived_seed(case_seed, draws++);
            CAPTURE(sh.hd);
            CAPTURE(sh.n_tok);
            CAPTURE(sh.n_cells);
            CAPTURE(rope);
            std::mt19937 rng(seed);
            attn_setup a(rng, sh.n_head, sh.n_head_kv, sh.hd, sh.n_cells, sh.n_tok);
            const auto want = a.run(*c_be, rope);
            const auto got = a.run(*g_be, rope);
            // The cache holds the same f16 bits (both round to nearest even);
            // with rope, a cos or sin that rounds differently may move one.
            CHECK(got.V == want.V);
            if (rope) {
                CHECK(f16_err(got.K, want.K) <= 1e-3);
            } else {
                CHECK(got.K == want.K);
            }
            // The CPU rounds the softmax weights to f16 (as llama.cpp does);
            // the GPU keeps them in f32.
            CHECK(rel_err(got.out, want.out) <= 2e-3);
        }
    }
}

TEST_CASE("attention over a sliding window with its own scale, after a NeoX rope, matches the "
          "CPU") {
    SMOL_TEST_DRAW_SEED(case_seed);
    uint32_t draws = 0; // the seeds of its runs, derived from case_seed
    auto g_be = gpu();
    auto c_be = cpu();
    struct shape {
        int n_head, n_head_kv, hd, n_cells, n_tok;
    };
    // Gemma 3 270M's heads (4 over 1 of 256) for decode and a prompt chunk;
    // SmolLM2-135M's, whose head size the faster kernels take without a
    // window.
    const shape shapes[] = {
        {4, 1, 256, 300, 1}, {4, 1, 256, 700, 40}, {9, 3, 64, 700, 1}, {9, 3, 64, 700, 64}};
    for (const shape & sh : shapes) {
        for (int window : {1, 16, 150}) {
            const uint32_t seed = test::derived_seed(case_seed, draws++);
            CAPTURE(sh.hd);
            CAPTURE(sh.n_tok);
            CAPTURE(window);
            std::mt19937 rng(seed);
            attn_setup a(rng, sh.n_head, sh.n_head_kv, sh.hd, sh.n_cells, sh.n_tok);
            const smol::attn_opts opts{window, 0.3f / std::sqrt(float(sh.hd))};
            const auto want = a.run(*c_be, true, 0, opts, true);
            const auto got = a.run(*g_be, true, 0, opts, true);
            CHECK(got.V == want.V);
            CHECK(f16_err(got.K, want.K) <= 1e-3);
            CHECK(rel_err(got.out, want.out) <= 2e-3);
            // The window and the scale change the result: a run without them
            // is far from it (so neither was dropped on the way).
            const auto plain = a.run(*g_be, true, 0, {}, true);
            CHECK(rel_err(plain.out, want.out) > 1e-2);
        }
    }
}

namespace {

// A GPU backend that runs this attention kernel.
std::unique_ptr<backend> gpu_attention(smol::attn_kernel kernel) {
    smol::backend_options o;
    o.attn = kernel;
    return gpu(o);
}

// The largest |got - want| of an attention output, and where: token, head
// and element. An unwritten (NaN) element counts as infinite.
struct attn_err {
    double err = 0;
    size_t at = 0;
    std::string where(const attn_setup & a, const std::vector<float> & got,
                      const std::vector<float> & want) const {
        const size_t row = size_t(a.n_head * a.hd);
        return "token " + std::to_string(at / row) + " (pos " + std::to_string(a.pos[at / row]) +
               ", seq " + std::to_string(a.seq[at / row]) + "), head " +
               std::to_string(at % row / size_t(a.hd)) + ", element " +
               std::to_string(at % size_t(a.hd)) + ": got " + std::to_string(got[at]) + ", want " +
               std::to_string(want[at]);
    }
};

attn_err worst(const std::vector<float> & got, const std::vector<float> & want) {
    REQUIRE(got.size() == want.size());
    attn_err w;
    for (size_t i = 0; i < got.size(); ++i) {
        const double e =
            std::isfinite(got[i]) ? std::fabs(double(got[i]) - double(want[i])) : double(INFINITY);
        if (e > w.err) {
            w.err = e;
            w.at = i;
        }
    }
    return w;
}

// The largest finite |x| (a cell may hold NaN or infinity that no token
// sees; it must not loosen the bound).
double max_abs_f16(const std::vector<uint16_t> & x) {
    double m = 0;
    for (uint16_t h : x) {
        const double v = std::fabs(double(smol::cpu::fp16_to_fp32(h)));
        if (std::isfinite(v)) m = std::max(m, v);
    }
    return m;
}

} // namespace

// The output is sum_c p_c V_c with sum_c p_c = 1. The CPU rounds each
// normalised p_c to f16 before the sum; the flash kernel rounds p_c * l / e^m
// (relative to a running maximum, so at most 1) to f16 and divides by l after
// the sum. A normal f16 is within 2^-11 of its value (relative) and a
// subnormal within 2^-25 (absolute, which the division by l >= 1 does not
// enlarge), so each side is within (2^-11 + n_cells 2^-25) max|V| of the
// exact sum, and the two within twice that: 1.1e-3 max|V| for 2,200 cells.
// Scores summed in another order and exp2 against exp move p_c by about
// 1e-6 relative. Hence 1.5e-3 max|V| per element; the decode kernel rounds
// p_c as the flash kernel does, and the classic kernel, which keeps p_c in
// f32, is held to the same bound.
constexpr double flash_attn_tol = 1.5e-3;

// Batches of up to this many tokens may take the decode kernel by default
// (smol-cuda.cu's dec_max_tok: while a block per token and kv head fits the
// GPU at once), the rest the flash kernel, unless every token is of a
// sequence of its own; one token always takes it here.
constexpr int decode_max_tok = 32;

namespace {

// Whether the default kernel's output is the one the decode or the flash
// kernel gave, as the batch's size allows.
bool default_kernel_ran(int n_tok, const std::vector<float> & au, const std::vector<float> & dec,
                        const std::vector<float> & flash) {
    if (n_tok == 1) return au == dec;
    if (n_tok <= decode_max_tok) return au == dec || au == flash;
    return au == flash;
}

struct kernel_result {
    const char * name;
    const attn_setup::result & r;
};

// Each kernel's output against the CPU's within flash_attn_tol max|V|,
// saying where the largest error of each lies.
void check_attention(const attn_setup & a, const attn_setup::result & want,
                     std::initializer_list<kernel_result> got) {
    const double v_max = max_abs_f16(want.V);
    for (const kernel_result & k : got) {
        const attn_err e = worst(k.r.out, want.out);
        INFO(std::string(k.name) << " kernel's largest error " << e.err / v_max << " max|V| at "
                                 << e.where(a, k.r.out, want.out));
        CHECK(e.err <= flash_attn_tol * v_max);
    }
}

} // namespace

TEST_CASE("flash attention matches the CPU for prompts over served caches, with GQA") {
    SMOL_TEST_DRAW_SEED(case_seed);
    uint32_t draws = 0; // the seeds of its runs, derived from case_seed
    auto flash = gpu_attention(smol::attn_kernel::flash);
    auto decode = gpu_attention(smol::attn_kernel::decode);
    auto classic = gpu_attention(smol::attn_kernel::classic);
    auto automatic = gpu_attention(smol::attn_kernel::automatic);
    auto c_be = cpu();
    struct heads {
        int n_head, n_head_kv;
        std::vector<int> n_toks;
    };
    // GQA groups of 1, 3 (SmolLM2-135M's 9 / 3) and 5; SmolLM2-1.7B's 32
    // heads. On an H200 (132 SMs) every batch but 1.7B's 1,100 tokens (576
    // blocks, over the 528 it aims at) is split over the cells and merged.
    const heads hs[] = {{4, 4, {1, 5, 17, 64, 100, 512}},
                        {9, 3, {1, 5, 17, 64, 100, 512}},
                        {10, 2, {17, 100, 512}},
                        {32, 32, {64, 1100}}};
    int run = 0;
    for (const heads & H : hs) {
        for (int n_tok : H.n_toks) {
            for (int history : {0, 37, 1000}) {
                const bool rope = ++run % 2 == 0;
                const uint32_t seed = test::derived_seed(case_seed, draws++);
                CAPTURE(H.n_head);
                CAPTURE(H.n_head_kv);
                CAPTURE(n_tok);
                CAPTURE(history);
                CAPTURE(rope);
                std::mt19937 rng(seed);
                attn_setup a(rng, H.n_head, H.n_head_kv, 64, attn_setup::served{history}, n_tok);
                const auto want = a.run(*c_be, rope);
                const auto f = a.run(*flash, rope);
                const auto d = a.run(*decode, rope);
                const auto c = a.run(*classic, rope);
                const auto au = a.run(*automatic, rope);
                check_attention(a, want, {{"flash", f}, {"decode", d}, {"classic", c}});
                // Each override ran its own kernel (they round differently),
                // and without one a batch took the decode or the flash kernel
                // by its size.
                if (n_tok > 1 || history > 0) {
                    CHECK_MESSAGE(f.out != c.out, "attn flash ran the classic kernel");
                    CHECK_MESSAGE(d.out != f.out, "attn decode ran the flash kernel");
                    CHECK_MESSAGE(d.out != c.out, "attn decode ran the classic kernel");
                }
                CHECK_MESSAGE(default_kernel_ran(n_tok, au.out, d.out, f.out),
                              "with attn automatic a batch of "
                                  << n_tok
                                  << " tokens took neither the decode nor the flash kernel");
            }
        }
    }
}

TEST_CASE("attention leaves out the cells no token sees, even those holding NaN or infinity") {
    SMOL_TEST_DRAW_SEED(case_seed);
    uint32_t draws = 0; // the seeds of its runs, derived from case_seed
    // A zero softmax weight times NaN is NaN, so a kernel that multiplies
    // every copied row of V by its weight must not meet such a row: the CPU
    // reads only the cells a token sees. Sequence 2's cells, among the
    // served history, get NaN or infinity in K and V; the batch continues
    // sequences 0 and 1, so no token sees them.
    auto flash = gpu_attention(smol::attn_kernel::flash);
    auto decode = gpu_attention(smol::attn_kernel::decode);
    auto classic = gpu_attention(smol::attn_kernel::classic);
    auto c_be = cpu();
    for (int n_tok : {1, 5, 100}) {
        for (int history : {40, 3000}) {
            const uint32_t seed = test::derived_seed(case_seed, draws++);
            CAPTURE(n_tok);
            CAPTURE(history);
            std::mt19937 rng(seed);
            attn_setup a(rng, 9, 3, 64, attn_setup::served{history}, n_tok);
            int poisoned = 0;
            for (int c = 0; c < a.kv.n_used; ++c) {
                if (a.kv.cell_seqs[size_t(c)] != smol::seq_mask::of(2)) continue;
                const uint16_t bad = c % 2 ? 0x7e00 : 0x7c00; // f16 NaN, +infinity
                for (int h = 0; h < a.n_head_kv; ++h) {
                    // Layer 1's rows, as run() attends.
                    const size_t at =
                        ((size_t(a.n_head_kv) + size_t(h)) * size_t(a.n_cells) + size_t(c)) * 64;
                    std::fill_n(a.k_hist.begin() + ptrdiff_t(at), 64, bad);
                    std::fill_n(a.v_hist.begin() + ptrdiff_t(at), 64, bad);
                }
                ++poisoned;
            }
            REQUIRE(poisoned > 0);
            const auto want = a.run(*c_be, false);
            const auto f = a.run(*flash, false);
            const auto d = a.run(*decode, false);
            const auto c = a.run(*classic, false);
            check_attention(a, want, {{"flash", f}, {"decode", d}, {"classic", c}});
        }
    }
}

TEST_CASE("flash attention over a long prompt's cells matches the CPU: whole, masked and "
          "skipped tiles") {
    SMOL_TEST_DRAW_SEED(case_seed);
    uint32_t draws = 0; // the seeds of its runs, derived from case_seed
    // Tiles that every query of a block sees whole run unmasked, those none
    // can see are skipped: a prompt continued in chunks after its own
    // history, alone or beside a second sequence that shares its prefix;
    // decode and prompt batches, whole caches and head groups' views.
    auto automatic = gpu_attention(smol::attn_kernel::automatic);
    auto flash = gpu_attention(smol::attn_kernel::flash);
    auto decode = gpu_attention(smol::attn_kernel::decode);
    auto classic = gpu_attention(smol::attn_kernel::classic);
    auto c_be = cpu();
    struct heads {
        int n_head, n_head_kv, G;
    };
    const heads hs[] = {{9, 3, 0}, {9, 3, 1}, {32, 32, 4}};
    int run = 0;
    for (const heads & H : hs) {
        for (int n_tok : {1, 3, 64, 200}) {
            for (int history : {0, 64, 1000, 3000}) {
                for (bool share : {false, true}) {
                    if (share && history == 0) continue;
                    const int shared = share ? history / 2 : 0;
                    const bool rope = ++run % 2 == 0;
                    const uint32_t seed = test::derived_seed(case_seed, draws++);
                    CAPTURE(H.n_head);
                    CAPTURE(H.n_head_kv);
                    CAPTURE(H.G);
                    CAPTURE(n_tok);
                    CAPTURE(history);
                    CAPTURE(shared);
                    std::mt19937 rng(seed);
                    attn_setup a(rng, H.n_head, H.n_head_kv, 64,
                                 attn_setup::prompt{history, shared}, n_tok);
                    const auto want = a.run(*c_be, rope);
                    const auto au = a.run(*automatic, rope, H.G);
                    const auto f = a.run(*flash, rope, H.G);
                    const auto d = a.run(*decode, rope, H.G);
                    const auto c = a.run(*classic, rope, H.G);
                    check_attention(a, want, {{"flash", f}, {"decode", d}, {"classic", c}});
                    CHECK(default_kernel_ran(n_tok, au.out, d.out, f.out));
                    // (One token over its own cell alone is V in all.)
                    if (n_tok > 1 || history > 0)
                        CHECK_MESSAGE(f.out != c.out, "the default kernel was the classic one");
                }
            }
        }
    }
}

TEST_CASE("decode attention over head groups' views matches the CPU with every kernel") {
    SMOL_TEST_DRAW_SEED(case_seed);
    uint32_t draws = 0; // the seeds of its runs, derived from case_seed
    // What an offloaded plan runs: per group of kv heads, a node over a view
    // (a resident slice or a staging slot), for one-token and small batches
    // after long histories.
    auto automatic = gpu_attention(smol::attn_kernel::automatic);
    auto decode = gpu_attention(smol::attn_kernel::decode);
    auto flash = gpu_attention(smol::attn_kernel::flash);
    auto classic = gpu_attention(smol::attn_kernel::classic);
    auto c_be = cpu();
    struct heads {
        int n_head, n_head_kv;
        std::vector<int> groups;
    };
    const heads hs[] = {{9, 3, {1, 3}}, {32, 32, {1, 4, 32}}, {10, 2, {1}}};
    int run = 0;
    for (const heads & H : hs) {
        for (int G : H.groups) {
            for (int n_tok : {1, 2, 7}) {
                for (int history : {37, 1000, 5000}) {
                    const bool rope = ++run % 2 == 0;
                    const uint32_t seed = test::derived_seed(case_seed, draws++);
                    CAPTURE(H.n_head);
                    CAPTURE(H.n_head_kv);
                    CAPTURE(G);
                    CAPTURE(n_tok);
                    CAPTURE(history);
                    std::mt19937 rng(seed);
                    attn_setup a(rng, H.n_head, H.n_head_kv, 64, attn_setup::served{history},
                                 n_tok);
                    const auto want = a.run(*c_be, rope);
                    const auto au = a.run(*automatic, rope, G);
                    const auto d = a.run(*decode, rope, G);
                    const auto f = a.run(*flash, rope, G);
                    const auto c = a.run(*classic, rope, G);
                    check_attention(a, want, {{"decode", d}, {"flash", f}, {"classic", c}});
                    CHECK(default_kernel_ran(n_tok, au.out, d.out, f.out));
                    CHECK_MESSAGE(d.out != f.out, "attn decode ran the flash kernel");
                    CHECK_MESSAGE(d.out != c.out, "attn decode ran the classic kernel");
                    // The groups' stores filled the cache as one store does.
                    const auto whole = a.run(*decode, rope);
                    CHECK(d.K == whole.K);
                    CHECK(d.V == whole.V);
                }
            }
        }
    }
}

TEST_CASE("decode attention over sequences in pages of their own matches the CPU and is the "
          "default") {
    SMOL_TEST_DRAW_SEED(case_seed);
    uint32_t draws = 0; // the seeds of its runs, derived from case_seed
    // Tokens of many sequences at once: the decode kernel lists the pages
    // its token's sequence holds (in windows of 512 tiles over a long
    // split) and skips the rest; 1.7B's 32 kv heads at 32, 64 and 128
    // sequences are more blocks than the GPU holds at once (a warp serves
    // each kv head then), and 48 and 100 sequences more tokens than a
    // decode-sized batch, and all still take it. Sequences from 64 up are
    // the second word of a cell's mask. attn decode_warps takes the warp form for every
    // shape here, with kv heads that leave warps of a block idle (3, 5).
    auto automatic = gpu_attention(smol::attn_kernel::automatic);
    auto decode = gpu_attention(smol::attn_kernel::decode);
    auto warps = gpu_attention(smol::attn_kernel::decode_warps);
    auto flash = gpu_attention(smol::attn_kernel::flash);
    auto c_be = cpu();
    struct shape {
        int n_head, n_head_kv, n_seqs, history;
    };
    const shape shapes[] = {{16, 8, 32, 640},  {32, 32, 32, 120}, {32, 32, 64, 90},
                            {9, 3, 5, 300},    {8, 4, 48, 100},   {15, 5, 7, 2000},
                            {32, 32, 128, 40}, {9, 3, 100, 120}};
    for (const shape & sh : shapes) {
        const uint32_t seed = test::derived_seed(case_seed, draws++);
        CAPTURE(sh.n_head_kv);
        CAPTURE(sh.n_seqs);
        std::mt19937 rng(seed);
        attn_setup a(rng, sh.n_head, sh.n_head_kv, 64, attn_setup::paged{sh.n_seqs, sh.history});
        MESSAGE(sh.n_seqs << " sequences over " << a.kv.n_used << " cells");
        const bool rope = seed % 2 == 0;
        const auto want = a.run(*c_be, rope);
        const auto au = a.run(*automatic, rope);
        const auto d = a.run(*decode, rope);
        const auto w = a.run(*warps, rope);
        const auto f = a.run(*flash, rope);
        check_attention(a, want,
                        {{"decode", d}, {"decode-warps", w}, {"flash", f}, {"automatic", au}});
        CHECK_MESSAGE(au.out == d.out, "tokens of different sequences took another kernel");
        CHECK_MESSAGE(d.out != f.out, "attn decode ran the flash kernel");
        CHECK_MESSAGE(w.out != f.out, "attn decode-warps ran the flash kernel");
    }
}

// Batches of up to this many tokens over bf16 weights reach cuBLAS as bf16
// hi and lo columns (smol-cuda.cu's blas_pair_max_m); larger ones as f16.
constexpr int64_t bf16_pair_max_m = 256;

// The activations a matmul of M tokens over weights of type t multiplies:
// the GPU's own kernels take them as f32; cuBLAS as f16 (f32 weights stay
// f32), or over bf16 weights up to bf16_pair_max_m tokens as two bf16
// columns, hi and lo (about 16 bits of each). Its bound against float64.
enum class acts { f32, f16, bf16_pairs };
acts acts_of(smol_type t, int64_t M, bool blas) {
    if (!blas || t == SMOL_TYPE_F32) return acts::f32;
    return t == SMOL_TYPE_BF16 && M <= bf16_pair_max_m ? acts::bf16_pairs : acts::f16;
}
double bound_of(acts a) {
    return a == acts::f16 ? 2e-3 : a == acts::bf16_pairs ? 5e-5 : 2e-5;
}

TEST_CASE("mul_mat matches float64 for every weight type, batch size and width") {
    SMOL_TEST_DRAW_SEED(case_seed);
    uint32_t draws = 0; // the seeds of its runs, derived from case_seed
    auto g_be = gpu();
    auto c_be = cpu();
    double worst_f32_act = 0, worst_f16_act = 0, worst_pairs = 0;
    for (smol_type t : all_types) {
        for (int64_t K : {width_for(t, 576), int64_t(1536)}) {
            for (int64_t M : {1, 2, 7, 32, 33, 128, 256, 257}) {
                const uint32_t seed = test::derived_seed(case_seed, draws++);
                const std::string type = smol_type_name(t);
                CAPTURE(type);
                CAPTURE(K);
                CAPTURE(M);
                std::mt19937 rng(seed);
                const int64_t N = 200; // not a multiple of the rows per block
                const auto wq = to_type(t, random_floats(rng, size_t(N * K)), K);
                const auto w = from_type(t, wq, K, N);
                const auto x = random_floats(rng, size_t(M * K));
                const auto want = mul_mat_f64(w, x, K, N, M);
                auto run = [&](backend & be) { return mul_mat_on(be, t, wq, x, K, N, M); };
                const auto got = run(*g_be);
                const double e = rel_err(got, want);
                // cuBLAS runs float weights from 4 tokens, any weights above 32.
                const acts a = acts_of(t, M, g_be->mm_used().find("cublas") != std::string::npos);
                const bool f16_act = a == acts::f16;
                CHECK(e <= bound_of(a));
                double & worst = f16_act                 ? worst_f16_act
                                 : a == acts::bf16_pairs ? worst_pairs
                                                         : worst_f32_act;
                worst = std::max(worst, e);
                // The CPU rounds activations to f16 (f16 weights) or 8 bits
                // (quantized weights); against it the bound is its own error.
                double cpu_tol = t == SMOL_TYPE_F32 || t == SMOL_TYPE_BF16 ? 1e-4
                                 : t == SMOL_TYPE_F16                      ? 3e-3
                                                                           : 3e-2;
                if (f16_act) cpu_tol = std::max(cpu_tol, 3e-3);
                CHECK(rel_err(got, run(*c_be)) <= cpu_tol);
            }
        }
    }
    MESSAGE("largest error against float64: " << worst_f32_act << " (f32 activations), "
                                              << worst_f16_act << " (f16 activations), "
                                              << worst_pairs << " (bf16 hi and lo)");
    CHECK(worst_pairs > 0); // bf16 batches of up to 256 tokens took cuBLAS
}

TEST_CASE("every matmul kernel the autotune may choose matches float64") {
    SMOL_TEST_DRAW_SEED(case_seed);
    uint32_t draws = 0; // the seeds of its runs, derived from case_seed
    auto g_be = gpu();
    size_t n_run = 0;
    double worst = 0;
    for (smol_type t : all_types) {
        // Over float weights, K = 576 with ks=2 and K = 1536 with ks=4 give
        // each lane two chunks of a row, which the GEMV reads at once
        // (gemv_pair); the other splits one chunk at a time.
        for (int64_t K : {width_for(t, 576), int64_t(1536)}) {
            for (int64_t M : {1, 3, 8, 17, 32, 40, 128}) {
                const int64_t N = 200; // not a multiple of any rows-per-block
                const smol::mm_key key{t, N, K, smol::mm_bucket(M)};
                const auto cands = g_be->mm_candidates(key);
                // Rows of an odd number of q3_K or q6_K super-blocks are no
                // multiple of 4 bytes: only the scalar kernel takes them.
                if (smol::type_row_bytes(t, K) % 4 != 0) {
                    CHECK(cands.empty());
                    continue;
                }
                REQUIRE(!cands.empty());
                const uint32_t seed = test::derived_seed(case_seed, draws++);
                std::mt19937 rng(seed);
                const auto wq = to_type(t, random_floats(rng, size_t(N * K)), K);
                const auto w = from_type(t, wq, K, N);
                const auto x = random_floats(rng, size_t(M * K));
                const auto want = mul_mat_f64(w, x, K, N, M);
                for (const std::string & c : cands) {
                    const std::string type = smol_type_name(t);
                    CAPTURE(type);
                    CAPTURE(K);
                    CAPTURE(M);
                    CAPTURE(c);
                    g_be->mm_choose(key, c, -1);
                    const auto got = mul_mat_on(*g_be, t, wq, x, K, N, M);
                    // The backend says it launched the candidate it was given.
                    CHECK(g_be->mm_used().find(": " + c + "\n") != std::string::npos);
                    const double e = rel_err(got, want);
                    const acts a = acts_of(t, M, c == "cublas");
                    CHECK(e <= bound_of(a));
                    worst = std::max(worst, a == acts::f32 ? e : 0.0);
                    ++n_run;
                }
            }
        }
    }
    MESSAGE(n_run << " (type, shape, batch, kernel) runs; largest f32-activation error " << worst);
}

// The GEMV of up to 4 tokens reads each weight once for all of them and
// sums each token's products in the order of a launch of that token alone:
// a speculative verify's matmuls give each token the bits of its decode.
TEST_CASE("the GEMV gives each of up to 4 tokens the bits of a launch of its own") {
    SMOL_TEST_DRAW_SEED(case_seed);
    uint32_t draws = 0; // the seeds of its runs, derived from case_seed
    auto be = gpu();
    size_t n_run = 0;
    for (smol_type t : all_types) {
        const int64_t K = width_for(t, 1536), N = 200;
        if (smol::type_row_bytes(t, K) % 4 != 0) continue; // the scalar kernel's alone
        const uint32_t seed = test::derived_seed(case_seed, draws++);
        std::mt19937 rng(seed);
        const auto wq = to_type(t, random_floats(rng, size_t(N * K)), K);
        const int M = 2 + int(rng() % 3u); // 2 to 4 tokens
        const auto x = random_floats(rng, size_t(M * K));
        const int mt = 4;
        const smol::mm_key one{t, N, K, 1}, many{t, N, K, smol::mm_bucket(M)};
        for (int r : {1, 2, 4}) {
            for (int ks : {1, 2, 4}) {
                const std::string type = smol_type_name(t);
                const std::string rows = r > 1 ? " r=" + std::to_string(r) : "";
                const std::string c1 = "gemv mt=1 ks=" + std::to_string(ks) + rows;
                const std::string cm =
                    "gemv mt=" + std::to_string(mt) + " ks=" + std::to_string(ks) + rows;
                CAPTURE(type);
                CAPTURE(M);
                CAPTURE(cm);
                be->mm_choose(many, cm, -1);
                const auto got = mul_mat_on(*be, t, wq, x, K, N, M);
                REQUIRE(be->mm_used().find(": " + cm + "\n") != std::string::npos);
                be->mm_choose(one, c1, -1);
                for (int m = 0; m < M; ++m) {
                    CAPTURE(m);
                    const std::vector<float> xm(x.begin() + m * K, x.begin() + (m + 1) * K);
                    const auto alone = mul_mat_on(*be, t, wq, xm, K, N, 1);
                    CHECK(std::memcmp(alone.data(), got.data() + size_t(m) * N,
                                      size_t(N) * sizeof(float)) == 0);
                }
                ++n_run;
            }
        }
    }
    MESSAGE(n_run << " (type, rows, split) runs");
}

TEST_CASE("the autotune table is saved, read back by a new backend, and ignored for another GPU") {
    auto be = gpu();
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("smol-test-cuda-" + std::to_string(::getpid()) + "-autotune.txt"))
                                 .string();
    // Not the built-in choice for 200 rows, which splits K on a GPU of
    // more than 8 SMs.
    const smol::mm_key key{SMOL_TYPE_Q8_0, 200, 576, 1};
    be->mm_choose(key, "gemv mt=1 ks=1", 1.5);
    CHECK(be->mm_table_save(path) == path);
    CHECK_THROWS_AS(be->mm_choose(key, "gemv mt=3 ks=1", 1), smol::error);
    SMOL_TEST_DRAW_SEED(seed);
    std::mt19937 rng(seed);
    const auto wq = to_type(SMOL_TYPE_Q8_0, random_floats(rng, 200 * 576), 576);
    const auto x = random_floats(rng, 576);
    auto kernel_of = [&](backend & b) {
        mul_mat_on(b, SMOL_TYPE_Q8_0, wq, x, 576, 200, 1);
        return b.mm_used();
    };
    smol::backend_options from_path;
    from_path.autotune_file = path;
    auto again = gpu(from_path);
    CHECK(kernel_of(*again) == "q8_0 200x576 M=1: gemv mt=1 ks=1\n");
    // The same table for another GPU: the built-in choice.
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    const size_t at = text.find("\ngpu ");
    REQUIRE(at != std::string::npos);
    text = text.substr(0, at) + "\ngpu Some Other GPU" + text.substr(text.find('\n', at + 1));
    std::ofstream(path, std::ios::trunc) << text;
    auto other = gpu(from_path);
    const std::string other_kernel = kernel_of(*other);
    CHECK(other_kernel != "q8_0 200x576 M=1: gemv mt=1 ks=1\n");
    // A missing file: the built-in choice too.
    smol::backend_options absent;
    absent.autotune_file = path + ".absent";
    auto none = gpu(absent);
    CHECK(kernel_of(*none) == other_kernel);
    std::filesystem::remove(path);
}

TEST_CASE("a GEMV of more rows a warp than divide a weight's rows takes one row a warp") {
    SMOL_TEST_DRAW_SEED(case_seed);
    uint32_t draws = 0; // the seeds of its runs, derived from case_seed
    auto be = gpu();
    const int64_t N = 202, K = 576; // even, no multiple of 4
    const smol::mm_key key{SMOL_TYPE_F16, N, K, 1};
    for (const std::string c : {"gemv mt=1 ks=2 r=2", "gemv mt=1 ks=2 r=4"}) {
        CAPTURE(c);
        const uint32_t seed = test::derived_seed(case_seed, draws++);
        std::mt19937 rng(seed);
        const auto wq = to_type(SMOL_TYPE_F16, random_floats(rng, size_t(N * K)), K);
        const auto w = from_type(SMOL_TYPE_F16, wq, K, N);
        const auto x = random_floats(rng, size_t(K));
        const auto want = mul_mat_f64(w, x, K, N, 1);
        be->mm_choose(key, c, -1);
        const auto got = mul_mat_on(*be, SMOL_TYPE_F16, wq, x, K, N, 1);
        const bool divides = c.find("r=2") != std::string::npos;
        CHECK(be->mm_used() ==
              "f16 202x576 M=1: " + std::string(divides ? c : "gemv mt=1 ks=2") + "\n");
        CHECK(rel_err(got, want) <= 2e-5);
    }
    // The autotune offers only the row counts that divide.
    const auto cands = be->mm_candidates(key);
    CHECK(std::find(cands.begin(), cands.end(), "gemv mt=1 ks=1 r=2") != cands.end());
    CHECK(std::find(cands.begin(), cands.end(), "gemv mt=1 ks=1 r=4") == cands.end());
}

TEST_CASE("the autotune times every candidate of a shape, and the one it keeps runs") {
    SMOL_TEST_DRAW_SEED(case_seed);
    uint32_t draws = 0; // the seeds of its runs, derived from case_seed
    auto be = gpu();
    for (const smol::mm_key key :
         {smol::mm_key{SMOL_TYPE_F16, 200, 576, 1}, smol::mm_key{SMOL_TYPE_Q4_1, 200, 576, 8}}) {
        const std::string type = smol_type_name(key.type);
        CAPTURE(type);
        CAPTURE(key.m);
        const auto candidates = be->mm_candidates(key);
        REQUIRE(candidates.size() >= 3);
        std::string best;
        double best_us = 1e30;
        for (const std::string & c : candidates) {
            CAPTURE(c);
            const double us = be->mm_time(key, c);
            // A measured time; how long it is depends on the GPU and its
            // load, so only that it is one is checked.
            CHECK(std::isfinite(us));
            CHECK(us > 0.0);
            if (us < best_us) best_us = us, best = c;
        }
        be->mm_choose(key, best, best_us);
        const uint32_t seed = test::derived_seed(case_seed, draws++);
        std::mt19937 rng(seed);
        const auto wq = to_type(key.type, random_floats(rng, 200 * 576), 576);
        const auto x = random_floats(rng, size_t(576 * key.m));
        mul_mat_on(*be, key.type, wq, x, 576, 200, key.m);
        CHECK(be->mm_used().find(best) != std::string::npos);
    }
}

TEST_CASE("mul_mat handles float weights whose width is not a multiple of 8") {
    SMOL_TEST_DRAW_SEED(case_seed);
    uint32_t draws = 0; // the seeds of its runs, derived from case_seed
    auto g_be = gpu();
    for (smol_type t : {SMOL_TYPE_F32, SMOL_TYPE_F16, SMOL_TYPE_BF16}) {
        for (int64_t M : {1, 40}) {
            const uint32_t seed = test::derived_seed(case_seed, draws++);
            const std::string type = smol_type_name(t);
            CAPTURE(type);
            CAPTURE(M);
            std::mt19937 rng(seed);
            const int64_t K = 100, N = 37;
            const auto wq = to_type(t, random_floats(rng, size_t(N * K)), K);
            const auto w = from_type(t, wq, K, N);
            const auto x = random_floats(rng, size_t(M * K));
            CHECK(rel_err(mul_mat_on(*g_be, t, wq, x, K, N, M), mul_mat_f64(w, x, K, N, M)) <=
                  2e-5);
        }
    }
}

namespace {

// One llama layer and the output head, built like smol-llama.c++ does, on
// any backend; returns the logits.
struct layer_setup {
    // SmolLM2-135M's widths unless given (heads of 64).
    int E, n_head, n_head_kv, hd = 64, F, V = 1000;
    smol_type wt;
    std::vector<uint8_t> wq, wk, wv, wo, wg, wu, wd, wout;
    std::vector<float> n1, n2, n3, x;
    attn_setup a;

    layer_setup(std::mt19937 & rng, smol_type t, int n_tok, int e = 576, int nh = 9, int nkv = 3,
                int f = 1536)
        : E(e), n_head(nh), n_head_kv(nkv), F(f), wt(t), a(rng, nh, nkv, 64, 400, n_tok) {
        const float s = 1.0f / std::sqrt(float(E));
        wq = to_type(t, random_floats(rng, size_t(E * E), s), E);
        wk = to_type(t, random_floats(rng, size_t(E * n_head_kv * hd), s), E);
        wv = to_type(t, random_floats(rng, size_t(E * n_head_kv * hd), s), E);
        wo = to_type(t, random_floats(rng, size_t(E * E), s), E);
        wg = to_type(t, random_floats(rng, size_t(E * F), s), E);
        wu = to_type(t, random_floats(rng, size_t(E * F), s), E);
        wd = to_type(t, random_floats(rng, size_t(F * E), 1.0f / std::sqrt(float(F))), F);
        wout = to_type(t, random_floats(rng, size_t(E * V), s), E);
        for (auto * n : {&n1, &n2, &n3}) {
            *n = random_floats(rng, size_t(E), 0.1f);
            for (auto & v : *n) v += 1.0f;
        }
        x = random_floats(rng, size_t(E * n_tok));
    }

    std::vector<float> run(backend & be) {
        side s(be);
        graph & g = s.g;
        smol::kv_cache c = a.kv;
        c.k = static_cast<uint16_t *>(s.copy(a.k_hist.data(), c.bytes_per_tensor()));
        c.v = static_cast<uint16_t *>(s.copy(a.v_hist.data(), c.bytes_per_tensor()));
        auto W = [&](const std::vector<uint8_t> & b, int64_t ne0) {
            return s.leaf(wt, b.data(), ne0, int64_t(b.size() / smol::cpu::row_bytes(wt, ne0)));
        };
        auto N = [&](const std::vector<float> & v) { return s.leaf(SMOL_TYPE_F32, v.data(), E); };
        tensor * pos = s.ints(a.pos);
        tensor * h = s.leaf(SMOL_TYPE_F32, x.data(), E, a.n_tok);
        tensor * cur = smol::op_rms_norm(g, h, N(n1), 1e-5f);
        tensor * q = smol::op_mul_mat(g, W(wq, E), cur);
        tensor * k = smol::op_mul_mat(g, W(wk, E), cur);
        tensor * v = smol::op_mul_mat(g, W(wv, E), cur);
        q = smol::op_rope(g, q, pos, n_head, hd, 10000.0f);
        k = smol::op_rope(g, k, pos, n_head_kv, hd, 10000.0f);
        tensor * stored = smol::op_kv_store(g, k, v, 1);
        tensor * att = smol::op_attention(g, q, stored, 1, n_head, n_head_kv, hd);
        h = smol::op_add(g, h, smol::op_mul_mat(g, W(wo, E), att));
        cur = smol::op_rms_norm(g, h, N(n2), 1e-5f);
        tensor * ff = smol::op_swiglu(g, smol::op_mul_mat(g, W(wg, E), cur),
                                      smol::op_mul_mat(g, W(wu, E), cur));
        h = smol::op_add(g, h, smol::op_mul_mat(g, W(wd, F), ff));
        tensor * out = smol::op_mul_mat(g, W(wout, E), smol::op_rms_norm(g, h, N(n3), 1e-5f));
        s.poison(out);
        g.batch = smol::batch_info{a.pos.data(), a.seq.data(), a.cell.data(), a.n_tok, &c};
        be.run(g);
        return s.read(out);
    }
};

} // namespace

TEST_CASE("a fused llama layer gives the logits of the unfused ops and of the CPU") {
    SMOL_TEST_DRAW_SEED(case_seed);
    uint32_t draws = 0; // the seeds of its runs, derived from case_seed
    smol::backend_options unfused;
    unfused.fuse = false;
    auto fused = gpu();
    auto plain = gpu(unfused);
    auto c_be = cpu();
    for (smol_type t :
         {SMOL_TYPE_F32, SMOL_TYPE_F16, SMOL_TYPE_BF16, SMOL_TYPE_Q8_0, SMOL_TYPE_Q4_1}) {
        for (int n_tok : {1, 3, 5, 32, 40, 300}) {
            const uint32_t seed = test::derived_seed(case_seed, draws++);
            const std::string type = smol_type_name(t);
            CAPTURE(type);
            CAPTURE(n_tok);
            std::mt19937 rng(seed);
            layer_setup L(rng, t, n_tok);
            // Two rows a warp for q, k, v whatever a table on this machine says.
            if (n_tok == 1)
                fused->mm_choose(smol::mm_key{t, 960, 576, 1}, "gemv mt=1 ks=1 r=2", -1);
            const auto a = L.run(*fused), b = L.run(*plain), c = L.run(*c_be);
            const std::string used = fused->mm_used();
            CAPTURE(used);
            // Fusion only reorders the norm: the fused matmul sums the
            // squares from its own loads and applies 1 / rms after its dot
            // (about K * 2^-24 relative a dot, as for split-K).
            CHECK(rel_err(a, b) <= 1e-4);
            // Where every matmul goes to cuBLAS (past 32 tokens all of them),
            // the fused run makes its input in one kernel from the norm or
            // the SwiGLU before it (and once for q, k, v): the same
            // roundings, so the same bits. Over bf16 weights up to
            // bf16_pair_max_m tokens that input is bf16 hi and lo, made the
            // same way, and the hi and lo results are added where they are
            // read (q, k and v by the cache store and the attention, the
            // rest by the next input's kernel), in the same order as the
            // unfused run's own launch for them.
            const bool blas = used.find("gemv") == std::string::npos &&
                              used.find("smallbatch") == std::string::npos &&
                              used.find("scalar") == std::string::npos;
            if (n_tok > 32 || blas) CHECK(a == b);
            const bool pairs = t == SMOL_TYPE_BF16 && n_tok <= bf16_pair_max_m;
            const bool kept = used.find(" +sums where read") != std::string::npos;
            if (kept) CHECK(pairs);
            if (blas && pairs) CHECK(kept);
            CHECK(rel_err(a, c) <= (t == SMOL_TYPE_F32 ? 5e-3 : 5e-2));
            // A GEMV of q, k and v (an even number of rows a warp), for one
            // token or a few, stores k and v in the cache itself; the
            // unfused run's kv_store gave b.
            // (cuBLAS takes q, k and v apart: no launch of 960 rows.)
            const size_t at = used.find(" 960x576 M=");
            const std::string qkv =
                at == std::string::npos ? "" : used.substr(at, used.find('\n', at) - at);
            const bool pairs_gemv =
                qkv.find(": gemv") != std::string::npos &&
                (qkv.find(" r=2") != std::string::npos || qkv.find(" r=4") != std::string::npos);
            CHECK(pairs_gemv == (n_tok <= 4));
            CHECK((qkv.find(" +kv_store") != std::string::npos) == pairs_gemv);
        }
    }
}

TEST_CASE("split-K and several-row GEMVs in a fused llama layer give the logits of the plain "
          "kernels") {
    SMOL_TEST_DRAW_SEED(case_seed);
    uint32_t draws = 0; // the seeds of its runs, derived from case_seed
    auto tuned = gpu();
    auto plain = gpu();
    for (smol_type t : {SMOL_TYPE_F16, SMOL_TYPE_Q4_1}) {
        for (int n_tok : {1, 5, 32}) {
            // Splits of K, and for the GEMV rows a warp (with and without a split).
            std::vector<std::string> variants = {"ks=2", "ks=4"};
            if (n_tok == 1) variants.insert(variants.end(), {"ks=1 r=2", "ks=2 r=2", "ks=4 r=4"});
            for (const std::string & variant : variants) {
                const uint32_t seed = test::derived_seed(case_seed, draws++);
                const std::string type = smol_type_name(t);
                CAPTURE(type);
                CAPTURE(n_tok);
                CAPTURE(variant);
                // Every launch of the layer (q, k, v together; output with
                // the residual; gate and up as SwiGLU; down; the head).
                const int b = smol::mm_bucket(n_tok);
                // The reference takes the same kernels, one row a warp, no split.
                const std::string family =
                    b == 1 ? "gemv mt=1" : "smallbatch mt=" + std::to_string(b);
                for (auto [n, k] : {std::pair<int64_t, int64_t>{960, 576},
                                    {576, 576},
                                    {3072, 576},
                                    {576, 1536},
                                    {1000, 576}}) {
                    tuned->mm_choose(smol::mm_key{t, n, k, b}, family + " " + variant, -1);
                    plain->mm_choose(smol::mm_key{t, n, k, b}, family + " ks=1", -1);
                }
                std::mt19937 rng(seed);
                layer_setup L(rng, t, n_tok);
                const auto a = L.run(*tuned), ref = L.run(*plain);
                CHECK(tuned->mm_used().find(variant + "\n") != std::string::npos);
                // Split-K sums the same products in another order: each
                // dot of K <= 1536 terms may move by about K * 2^-24
                // relative (1e-4), far below what a wrong split would do.
                CHECK(rel_err(a, ref) <= 1e-4);
            }
        }
    }
}

TEST_SUITE_END();

namespace {

// ctest's SKIP_RETURN_CODE for test-cuda (tests/CMakeLists.txt).
constexpr int exit_skipped = 77;

// Whether cuda:0 opens: probed once, before any case runs.
bool gpu_present() {
    try {
        smol::make_cuda_backend(0);
        return true;
    } catch (const smol::error & e) {
        std::printf("no GPU (%s): the GPU cases are skipped\n", e.what());
        return false;
    }
}

} // namespace

// Without a GPU only the refusal case runs and, when it passes, the run
// exits with exit_skipped, so ctest counts test-cuda as skipped, not passed.
int main(int argc, char ** argv) {
    doctest::Context ctx(argc, argv);
    const bool gpu = gpu_present();
    if (!gpu) ctx.addFilter("test-suite-exclude", "gpu");
    const int rc = ctx.run();
    if (ctx.shouldExit() || rc != 0 || gpu) return rc;
    return exit_skipped;
}
