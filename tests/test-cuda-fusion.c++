// test-cuda-fusion.c++ - the GPU backend's fusion planner (smol-cuda-fusion.h)
// on small graphs made with smol-graph.h's builders: which nodes become one
// step, and which stay apart. Host code only: it runs on any machine.

#include "smol-cuda-fusion.h"
#include "smol-graph.h"

#include <cstdint>
#include <doctest/doctest.h>
#include <vector>

using namespace smol;
using namespace smol::gpu;

namespace {

constexpr int64_t K = 64, N = 64, hd = 16, n_head = 4, n_head_kv = 2;

// Weights and inputs are leaves with memory of their own (never read here).
float bytes[1];
tensor * weight(graph & g, smol_type type, int64_t rows = N) {
    return g.leaf(type, bytes, K, rows);
}
tensor * input(graph & g, int64_t M, int64_t cols = K) {
    return g.leaf(SMOL_TYPE_F32, bytes, cols, M);
}

// The backend's own kernels take every matmul, as for a decode step.
fusion_rules own_kernels() {
    fusion_rules r;
    r.small_mm = [](const tensor *) { return true; };
    r.blas_fits = [](const tensor *) { return false; };
    return r;
}

// cuBLAS takes every matmul, as for a prompt.
fusion_rules blas() {
    fusion_rules r;
    r.small_mm = [](const tensor *) { return false; };
    r.blas_fits = [](const tensor *) { return true; };
    return r;
}

std::vector<step> plan(const graph & g, const fusion_rules & r) {
    std::vector<step> steps;
    plan_steps(g, r, steps);
    REQUIRE(steps.size() == g.nodes().size());
    for (size_t i = 0; i < steps.size(); ++i) CHECK(steps[i].t == g.nodes()[i]);
    return steps;
}

const step & at(const std::vector<step> & steps, const tensor * t) {
    return steps[size_t(t->node_index)];
}

// A layer's attention block: the norm, q, k and v, their ropes, the cache
// store and the attention.
struct attention_block {
    tensor *x, *norm, *q, *k, *v, *rk, *rq, *store, *attn;
    attention_block(graph & g, smol_type type, int64_t M) {
        x = input(g, M);
        tensor * pos = g.leaf(SMOL_TYPE_F32, bytes, M); // positions (never read here)
        norm = op_rms_norm(g, x, input(g, 1), 1e-5f);
        q = op_mul_mat(g, weight(g, type, n_head * hd), norm);
        k = op_mul_mat(g, weight(g, type, n_head_kv * hd), norm);
        v = op_mul_mat(g, weight(g, type, n_head_kv * hd), norm);
        rk = op_rope(g, k, pos, int32_t(n_head_kv), int32_t(hd), 10000.0f);
        rq = op_rope(g, q, pos, int32_t(n_head), int32_t(hd), 10000.0f);
        store = op_kv_store(g, rk, v, 0);
        attn = op_attention(g, rq, store, 0, int32_t(n_head), int32_t(n_head_kv), int32_t(hd));
    }
};

} // namespace

TEST_CASE("q, k and v sharing an input become one step, with the RMS norm before them") {
    graph g;
    const attention_block b(g, SMOL_TYPE_Q8_0, 1);
    const auto steps = plan(g, own_kernels());
    const step & s = at(steps, b.v); // a group stands at its last matmul
    CHECK(s.kind == step_kind::mm);
    REQUIRE(s.n_mm == 3);
    CHECK(s.mm[0] == b.q);
    CHECK(s.mm[1] == b.k);
    CHECK(s.mm[2] == b.v);
    CHECK(s.norm == b.norm);
    CHECK(s.extra == b.x); // the norm's input is read by the step
    CHECK(!s.skip);
    for (const tensor * t : {b.norm, b.q, b.k}) CHECK(at(steps, t).skip);
}

TEST_CASE("a rope folds into the cache store (k) and the attention (q)") {
    graph g;
    const attention_block b(g, SMOL_TYPE_Q8_0, 4);
    const auto steps = plan(g, own_kernels());
    const step & st = at(steps, b.store);
    CHECK(st.kind == step_kind::kv_store);
    CHECK(st.rope == b.rk);
    CHECK(st.extra == b.k);
    CHECK(unrotated(st) == b.k);
    const step & at_ = at(steps, b.attn);
    CHECK(at_.kind == step_kind::attention);
    CHECK(at_.rope == b.rq);
    CHECK(unrotated(at_) == b.q);
    CHECK(at(steps, b.rk).skip);
    CHECK(at(steps, b.rq).skip);
}

TEST_CASE("the GEMV of q, k and v may store k and v when nothing else reads them") {
    graph g;
    const attention_block b(g, SMOL_TYPE_Q8_0, 1);
    CHECK(at(plan(g, own_kernels()), b.v).store == b.store);

    // A second reader of v: the cache store does it.
    graph g2;
    const attention_block c(g2, SMOL_TYPE_Q8_0, 1);
    op_add(g2, c.v, c.v);
    CHECK(at(plan(g2, own_kernels()), c.v).store == nullptr);
}

TEST_CASE("a lone matmul takes its input's RMS norm, unless the norm has other readers") {
    graph g;
    tensor * x = input(g, 2);
    tensor * n = op_rms_norm(g, x, input(g, 1), 1e-5f);
    tensor * m = op_mul_mat(g, weight(g, SMOL_TYPE_F16), n);
    auto steps = plan(g, own_kernels());
    CHECK(at(steps, m).kind == step_kind::mm);
    CHECK(at(steps, m).n_mm == 1);
    CHECK(at(steps, m).norm == n);
    CHECK(at(steps, n).skip);

    graph g2;
    x = input(g2, 2);
    n = op_rms_norm(g2, x, input(g2, 1), 1e-5f);
    m = op_mul_mat(g2, weight(g2, SMOL_TYPE_F16), n);
    tensor * other = op_add(g2, n, n);
    steps = plan(g2, own_kernels());
    CHECK(at(steps, m).norm == nullptr);
    CHECK(!at(steps, n).skip);
    CHECK(at(steps, other).kind == step_kind::plain);
}

TEST_CASE("gate and up with their SwiGLU become one step, with the norm before them") {
    graph g;
    tensor * x = input(g, 1);
    tensor * n = op_rms_norm(g, x, input(g, 1), 1e-5f);
    tensor * gate = op_mul_mat(g, weight(g, SMOL_TYPE_Q4_1), n);
    tensor * up = op_mul_mat(g, weight(g, SMOL_TYPE_Q4_1), n);
    tensor * glu = op_swiglu(g, gate, up);
    const auto steps = plan(g, own_kernels());
    const step & s = at(steps, glu);
    CHECK(s.kind == step_kind::mm_swiglu);
    CHECK(s.n_mm == 2);
    CHECK(s.mm[0] == gate);
    CHECK(s.mm[1] == up);
    CHECK(s.norm == n);
    CHECK(s.extra == x);
    for (const tensor * t : {n, gate, up}) {
        CHECK(at(steps, t).skip);
        CHECK(at(steps, t).kind == step_kind::plain);
    }
}

TEST_CASE("a matmul and the residual added to it become one step") {
    graph g;
    tensor * x = input(g, 3);
    tensor * h = input(g, 3, N);
    tensor * m = op_mul_mat(g, weight(g, SMOL_TYPE_BF16), x);
    tensor * sum = op_add(g, h, m);
    const auto steps = plan(g, own_kernels());
    const step & s = at(steps, sum);
    CHECK(s.kind == step_kind::mm);
    CHECK(s.mm[0] == m);
    CHECK(s.res == h);
    CHECK(s.extra == x);
    CHECK(at(steps, m).skip);
}

TEST_CASE("without fusion every node is its own step") {
    graph g;
    const attention_block b(g, SMOL_TYPE_Q8_0, 1);
    fusion_rules off = own_kernels();
    off.fuse = false;
    for (const step & s : plan(g, off)) {
        CHECK(!s.skip);
        CHECK(s.norm == nullptr);
        CHECK(s.rope == nullptr);
        CHECK(s.store == nullptr);
        CHECK(s.kind == (s.t->kind == OP_MUL_MAT ? step_kind::mm : step_kind::plain));
        CHECK(s.n_mm == (s.t->kind == OP_MUL_MAT ? 1 : 0));
    }
}

TEST_CASE("matmuls that neither the backend's kernels nor cuBLAS take fold nothing") {
    graph g;
    const attention_block b(g, SMOL_TYPE_Q8_0, 1);
    fusion_rules neither = own_kernels();
    neither.small_mm = [](const tensor *) { return false; };
    const auto steps = plan(g, neither);
    for (const tensor * m : {b.q, b.k, b.v}) {
        CHECK(!at(steps, m).skip);
        CHECK(at(steps, m).n_mm == 1);
        CHECK(at(steps, m).norm == nullptr);
        CHECK(at(steps, m).store == nullptr);
    }
    CHECK(!at(steps, b.norm).skip);
    CHECK(at(steps, b.store).rope == b.rk); // the rope folds all the same
}

TEST_CASE("matmuls of different weight types or inputs stay apart") {
    graph g;
    tensor * x = input(g, 1);
    tensor * a = op_mul_mat(g, weight(g, SMOL_TYPE_Q8_0), x);
    tensor * b = op_mul_mat(g, weight(g, SMOL_TYPE_Q4_1), x);
    tensor * c = op_mul_mat(g, weight(g, SMOL_TYPE_Q4_1), input(g, 1));
    const auto steps = plan(g, own_kernels());
    for (const tensor * m : {a, b, c}) {
        CHECK(!at(steps, m).skip);
        CHECK(at(steps, m).n_mm == 1);
    }
}

TEST_CASE("a cuBLAS step's input is made by the residual add and the norm before it, and bf16 "
          "results stay pairs for that input's kernel") {
    graph g;
    const int64_t M = 64;
    tensor * x = input(g, M);
    tensor * h = input(g, M, N);
    tensor * o = op_mul_mat(g, weight(g, SMOL_TYPE_BF16), x);
    tensor * sum = op_add(g, h, o);
    tensor * n = op_rms_norm(g, sum, input(g, 1), 1e-5f);
    tensor * gate = op_mul_mat(g, weight(g, SMOL_TYPE_BF16), n);
    tensor * up = op_mul_mat(g, weight(g, SMOL_TYPE_BF16), n);
    const auto steps = plan(g, blas());
    const step & s = at(steps, up);
    CHECK(s.kind == step_kind::mm);
    CHECK(s.n_mm == 2);
    CHECK(s.norm == n);
    CHECK(s.add == sum);
    for (const tensor * t : {sum, n, gate}) CHECK(at(steps, t).skip);
    // o's results are read only by the add that up's input kernel makes.
    CHECK(at(steps, o).keep_pairs);
    CHECK(!s.keep_pairs);

    // Past blas_pair_max_m tokens bf16 takes f16 like the other types.
    graph g2;
    tensor * x2 = input(g2, blas_pair_max_m + 1);
    tensor * o2 = op_mul_mat(g2, weight(g2, SMOL_TYPE_BF16), x2);
    tensor * n2 =
        op_rms_norm(g2, op_add(g2, input(g2, blas_pair_max_m + 1, N), o2), input(g2, 1), 1e-5f);
    op_mul_mat(g2, weight(g2, SMOL_TYPE_BF16), n2);
    CHECK(!at(plan(g2, blas()), o2).keep_pairs);
}

TEST_CASE("a cuBLAS step's input is made by the SwiGLU before it") {
    graph g;
    tensor * x = input(g, 64);
    tensor * gate = op_mul_mat(g, weight(g, SMOL_TYPE_Q8_0), x);
    tensor * up = op_mul_mat(g, weight(g, SMOL_TYPE_Q8_0), x);
    tensor * glu = op_swiglu(g, gate, up);
    tensor * down = op_mul_mat(g, weight(g, SMOL_TYPE_Q8_0), glu);
    const auto steps = plan(g, blas());
    CHECK(at(steps, down).glu == glu);
    CHECK(at(steps, glu).skip);
    // gate and up share x: one cuBLAS step over one f16 copy of it.
    CHECK(at(steps, up).n_mm == 2);
}

TEST_CASE("Gemma 3's per-head norms fold into their NeoX ropes, its post norms into the residual "
          "adds, and GeGLU into gate and up") {
    graph g;
    const int64_t M = 1;
    tensor * x = input(g, M);
    tensor * pos = g.leaf(SMOL_TYPE_F32, bytes, M);
    tensor * norm = op_rms_norm(g, x, input(g, 1), 1e-6f);
    tensor * q = op_mul_mat(g, weight(g, SMOL_TYPE_Q8_0, n_head * hd), norm);
    tensor * k = op_mul_mat(g, weight(g, SMOL_TYPE_Q8_0, n_head_kv * hd), norm);
    tensor * v = op_mul_mat(g, weight(g, SMOL_TYPE_Q8_0, n_head_kv * hd), norm);
    tensor * qn = op_rms_norm(g, q, input(g, 1, hd), 1e-6f, int32_t(hd));
    tensor * kn = op_rms_norm(g, k, input(g, 1, hd), 1e-6f, int32_t(hd));
    tensor * rq = op_rope(g, qn, pos, int32_t(n_head), int32_t(hd), 1e6f, true);
    tensor * rk = op_rope(g, kn, pos, int32_t(n_head_kv), int32_t(hd), 1e6f, true);
    tensor * store = op_kv_store(g, rk, v, 0);
    tensor * attn = op_attention(g, rq, store, 0, int32_t(n_head), int32_t(n_head_kv), int32_t(hd),
                                 attn_opts{8, 0.25f});
    tensor * o = op_mul_mat(g, weight(g, SMOL_TYPE_Q8_0, N), attn);
    tensor * on = op_rms_norm(g, o, input(g, 1), 1e-6f);
    tensor * h = op_add(g, x, on);
    tensor * fn = op_rms_norm(g, h, input(g, 1), 1e-6f);
    tensor * gate = op_mul_mat(g, weight(g, SMOL_TYPE_Q8_0, N), fn);
    tensor * up = op_mul_mat(g, weight(g, SMOL_TYPE_Q8_0, N), fn);
    tensor * glu = op_geglu(g, gate, up);
    const auto steps = plan(g, own_kernels());
    // Norm and rope: the rope's step norms first; the norm never runs.
    for (tensor * r : {rq, rk}) {
        CHECK(at(steps, r).norm == r->src[0]);
        CHECK(at(steps, r).extra == r->src[0]->src[0]);
        CHECK(at(steps, r->src[0]).skip);
    }
    // A NeoX rope stays out of the cache store and the attention.
    CHECK(at(steps, store).rope == nullptr);
    CHECK(at(steps, attn).rope == nullptr);
    CHECK_FALSE(at(steps, rk).skip);
    // The post-attention norm is the add's.
    CHECK(at(steps, h).norm == on);
    CHECK(at(steps, h).res == x);
    CHECK(at(steps, on).skip);
    // Gate, up and GeGLU are one step, with the norm before them.
    CHECK(at(steps, glu).kind == step_kind::mm_swiglu);
    CHECK(at(steps, glu).norm == fn);
    CHECK(at(steps, gate).skip);
    // Under cuBLAS the residual's norm still folds, and the norm's input
    // kernel does not take the add (which the add's own step makes).
    const auto bsteps = plan(g, blas());
    CHECK(at(bsteps, h).norm == on);
    CHECK_FALSE(at(bsteps, h).skip);
}
