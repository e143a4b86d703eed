// smol-cuda-fusion.c++ - the GPU backend's fusion planner (see
// smol-cuda-fusion.h): the rules that make a graph's nodes into steps.

#include "smol-cuda-fusion.h"

#include <algorithm>
#include <iterator>

namespace smol::gpu {

void plan_steps(const graph & g, const fusion_rules & r, std::vector<step> & steps) {
    const auto & nodes = g.nodes();
    const size_t n = nodes.size();
    std::vector<int> uses(n, 0);
    for (const tensor * t : nodes) {
        for (const tensor * s : t->src) {
            if (s && s->kind != OP_NONE && s->node_index >= 0) ++uses[size_t(s->node_index)];
        }
    }
    if (n > 0) ++uses[n - 1]; // the caller reads the last node
    steps.assign(n, step{});
    for (size_t i = 0; i < n; ++i) steps[i].t = nodes[i];
    for (size_t i = 0; i < n; ++i) {
        if (nodes[i]->kind == OP_MUL_MAT) {
            steps[i].kind = step_kind::mm;
            steps[i].mm[0] = nodes[i];
            steps[i].n_mm = 1;
        }
    }
    if (!r.fuse) return;

    auto is = [&](const tensor * x, op k) { return x && x->kind == k && x->node_index >= 0; };
    auto only_use = [&](const tensor * x, int n_uses) {
        return uses[size_t(x->node_index)] == n_uses && !steps[size_t(x->node_index)].skip;
    };
    auto fold_norm = [&](step & s, tensor * x, int n_uses) {
        if (is(x, OP_RMS_NORM) && x->iparams[0] == 0 && only_use(x, n_uses) && !x->data &&
            x->src[0]->ne[0] == s.mm[0]->src[0]->ne[0] && x->src[0]->nb[1] % 16 == 0) {
            s.norm = x;
            steps[size_t(x->node_index)].skip = true;
        }
    };
    auto same_shape = [](const tensor * a, const tensor * b) {
        return a->ne[0] == b->ne[0] && a->ne[1] == b->ne[1] && a->nb[1] == b->nb[1];
    };

    for (size_t i = 0; i < n; ++i) {
        tensor * t = nodes[i];
        step & s = steps[i];
        if (t->src[2]) continue;
        if ((t->kind == OP_KV_STORE || t->kind == OP_ATTENTION) && is(t->src[0], OP_ROPE) &&
            t->src[0]->iparams[2] == 0 && only_use(t->src[0], 1) && !t->src[0]->data) {
            // kv_store rotates k on its way into the cache, attention rotates
            // q as it loads it (adjacent pairs: a NeoX-style rope runs alone).
            s.kind = t->kind == OP_KV_STORE ? step_kind::kv_store : step_kind::attention;
            s.rope = t->src[0];
            s.extra = s.rope->src[0];
            steps[size_t(s.rope->node_index)].skip = true;
        } else if (t->kind == OP_ROPE && is(t->src[0], OP_RMS_NORM) &&
                   t->src[0]->iparams[0] == t->iparams[1] && t->iparams[0] <= 32 &&
                   only_use(t->src[0], 1) && !t->src[0]->data &&
                   t->src[0]->src[0]->nb[1] == size_t(t->ne[0]) * 4 &&
                   t->nb[1] == size_t(t->ne[0]) * 4) {
            // A norm per head before a rope (Gemma's q and k): one kernel
            // norms each head and turns it.
            s.norm = t->src[0];
            s.extra = s.norm->src[0];
            steps[size_t(s.norm->node_index)].skip = true;
        } else if ((t->kind == OP_SWIGLU || t->kind == OP_GEGLU) && is(t->src[0], OP_MUL_MAT) &&
                   is(t->src[1], OP_MUL_MAT)) {
            tensor * gt = t->src[0];
            tensor * up = t->src[1];
            if (only_use(gt, 1) && only_use(up, 1) && gt->src[1] == up->src[1] &&
                gt->src[0]->type == up->src[0]->type && same_shape(gt->src[0], up->src[0]) &&
                r.small_mm(gt) && !gt->data && !up->data) {
                s.kind = step_kind::mm_swiglu;
                s.mm[0] = gt;
                s.mm[1] = up;
                s.n_mm = 2;
                for (tensor * m : {gt, up}) {
                    steps[size_t(m->node_index)].skip = true;
                    steps[size_t(m->node_index)].kind = step_kind::plain;
                }
                fold_norm(s, gt->src[1], 2);
                s.extra = s.norm ? s.norm->src[0] : gt->src[1];
            }
        } else if (t->kind == OP_ADD) {
            for (int which : {1, 0}) {
                tensor * m = t->src[which];
                if (is(m, OP_MUL_MAT) && only_use(m, 1) && r.small_mm(m) && !m->data &&
                    same_shape(m, t) && same_shape(m, t->src[1 - which])) {
                    s.kind = step_kind::mm;
                    s.mm[0] = m;
                    s.n_mm = 1;
                    s.res = t->src[1 - which];
                    steps[size_t(m->node_index)].skip = true;
                    steps[size_t(m->node_index)].kind = step_kind::plain;
                    fold_norm(s, m->src[1], 1);
                    s.extra = s.norm ? s.norm->src[0] : m->src[1];
                    break;
                }
            }
            // A norm of a result added to the residual (Gemma's norms after
            // attention and the MLP): the add's kernel norms it first.
            for (int which : {1, 0}) {
                tensor * nm = t->src[which];
                if (s.kind != step_kind::plain || !is(nm, OP_RMS_NORM) || nm->iparams[0] != 0 ||
                    !only_use(nm, 1) || nm->data || !same_shape(nm, t) ||
                    !same_shape(nm->src[0], t) || !same_shape(t->src[1 - which], t)) {
                    continue;
                }
                s.norm = nm;
                s.res = t->src[1 - which];
                s.extra = nm->src[0];
                steps[size_t(nm->node_index)].skip = true;
                break;
            }
        }
    }
    // Matmuls next to each other that read one input (q, k, v) run as one
    // launch, or through cuBLAS from one f16 copy of the input; a lone
    // matmul may still take its input's RMS norm. A cuBLAS matmul (not of f32
    // weights, which read f32) makes its f16 input from the norm or the
    // SwiGLU before it in one kernel.
    auto blas_f16 = [&](const tensor * m) {
        return !r.small_mm(m) && r.blas_fits(m) && m->src[0]->type != SMOL_TYPE_F32;
    };
    for (size_t i = 0; i < n; ++i) {
        tensor * t = nodes[i];
        if (steps[i].kind != step_kind::mm || steps[i].skip || steps[i].res || t->src[2]) continue;
        const bool blas = blas_f16(t);
        if (!blas && !r.small_mm(t)) continue;
        size_t j = i + 1;
        while (j < n && j < i + 3) {
            const tensor * u = nodes[j];
            if (steps[j].kind != step_kind::mm || steps[j].skip || steps[j].res ||
                u->src[1] != t->src[1] || u->src[0]->type != t->src[0]->type ||
                u->src[0]->ne[0] != t->src[0]->ne[0] || u->src[0]->nb[1] != t->src[0]->nb[1] ||
                u->src[2] || nodes[j - 1]->data || (blas && !blas_f16(u))) {
                break;
            }
            ++j;
        }
        step & s = steps[j - 1];
        s.n_mm = int(j - i);
        for (size_t k = i; k < j; ++k) {
            s.mm[k - i] = nodes[k];
            if (k + 1 < j) {
                steps[k].skip = true;
                steps[k].kind = step_kind::plain;
            }
        }
        fold_norm(s, t->src[1], s.n_mm);
        if (s.norm) s.extra = s.norm->src[0];
        // An element-wise node of kind k just before node `at`, which the
        // cuBLAS step's input kernel computes instead: the residual add
        // before the norm (the norm's kernel stores its sum) or the SwiGLU
        // before the matmul. Its sources are read before the matmuls write,
        // so they need live no longer than it.
        auto fold_before = [&](tensor * x, op k, size_t at) {
            if (!blas || !is(x, k) || size_t(x->node_index) + 1 != at || x->data || x->src[2] ||
                steps[size_t(x->node_index)].kind != step_kind::plain ||
                steps[size_t(x->node_index)].skip || steps[size_t(x->node_index)].norm ||
                !same_shape(x, x->src[0]) || !same_shape(x, x->src[1])) {
                return false;
            }
            steps[size_t(x->node_index)].skip = true;
            return true;
        };
        if (s.norm && fold_before(s.norm->src[0], OP_ADD, size_t(s.norm->node_index)))
            s.add = s.norm->src[0];
        tensor * glu = t->src[1];
        if (!s.norm && s.n_mm == 1 && is(glu, OP_SWIGLU) && only_use(glu, 1) &&
            glu->nb[1] == size_t(glu->ne[0]) * sizeof(float) && fold_before(glu, OP_SWIGLU, i))
            s.glu = glu;
        i = j - 1;
    }
    // A cuBLAS step over bf16 pairs keeps its results as hi and lo (never
    // without cuBLAS: no matmul fits it), for the
    // kernels that read them to add as they load them (in place of a sum
    // launch), when those are all that read them and run right after it:
    // the next step's input kernel (the output projection's and down's
    // results through the residual add before its norm, gate's and up's
    // through its SwiGLU), or for q, k and v the cache store (rotating k)
    // and the attention after it (rotating q), whose partials then go past
    // them in the work space.
    auto next = [&](size_t i) {
        while (++i < n && steps[i].skip) {
        }
        return i;
    };
    auto only = [&](const tensor * m) { return uses[size_t(m->node_index)] == 1; };
    for (size_t i = 0; i < n; ++i) {
        step & s = steps[i];
        if (s.skip || s.kind != step_kind::mm || !blas_f16(s.mm[0]) || !step_pairs(s)) continue;
        const size_t j = next(i);
        if (j == n) continue;
        const size_t k = next(j);
        const step & u = steps[j];
        const tensor * m = s.mm[0];
        if (s.n_mm == 1 && u.kind == step_kind::mm && u.add && only(m)) {
            s.keep_pairs = (u.add->src[0] == m) != (u.add->src[1] == m);
        } else if (s.n_mm == 2 && u.kind == step_kind::mm && u.glu && only(m) && only(s.mm[1])) {
            const tensor * g = u.glu->src[0];
            const tensor * up = u.glu->src[1];
            s.keep_pairs = (g == m && up == s.mm[1]) || (g == s.mm[1] && up == m);
        } else if (s.n_mm == 3 && k < n && u.kind == step_kind::kv_store &&
                   steps[k].kind == step_kind::attention) {
            const tensor * read[3] = {unrotated(u), u.t->src[1], unrotated(steps[k])};
            s.keep_pairs = true;
            for (const tensor * x : s.mm)
                s.keep_pairs =
                    s.keep_pairs && only(x) && std::count(std::begin(read), std::end(read), x) == 1;
        }
    }
    // The GEMV of q, k and v may store k and v in the cache itself: the
    // KV_STORE whose k (through its rope) and v are the launch's second and
    // third results, when nothing else reads them.
    for (size_t i = 0; i < n; ++i) {
        step & s = steps[i];
        if (s.skip || s.kind != step_kind::kv_store || !s.rope) continue;
        const tensor * k = s.rope->src[0];
        const tensor * v = s.t->src[1];
        // (The matmuls' own steps are skipped: the launch stands at v.)
        if (!is(k, OP_MUL_MAT) || !is(v, OP_MUL_MAT) || uses[size_t(k->node_index)] != 1 ||
            uses[size_t(v->node_index)] != 1) {
            continue;
        }
        step & q = steps[size_t(v->node_index)];
        if (q.kind == step_kind::mm && !q.skip && q.n_mm == 3 && q.mm[1] == k && q.mm[2] == v)
            q.store = s.t;
    }
}

} // namespace smol::gpu
