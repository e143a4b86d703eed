// smol-cuda-steps.cu - the GPU backend's plan of one graph: the steps that
// fuse a decode step's small ops into the kernels around them (make_steps),
// the work space they need, the arena's plan (compute_bytes, prepare).

#include "smol-cuda.cuh"

namespace smol::gpu {

// Whether every token of a batch is of a sequence of its own.
bool seqs_apart(const batch_info & b) {
    bool apart = b.seq && b.n_tokens > 1;
    seq_mask seen = seq_mask::none();
    for (int32_t i = 0; apart && i < b.n_tokens; ++i) {
        const seq_mask bit = seq_mask::of(b.seq[i]);
        apart = !(seen & bit);
        seen |= bit;
    }
    return apart;
}

void cuda_backend::make_steps(graph & g) {
    const auto & nodes = g.nodes();
    const size_t n = nodes.size();
    std::vector<int> uses(n, 0);
    for (const tensor * t : nodes) {
        for (const tensor * s : t->src) {
            if (s && s->kind != OP_NONE && s->node_index >= 0) ++uses[size_t(s->node_index)];
        }
    }
    if (n > 0) ++uses[n - 1]; // the caller reads the last node
    prepared_ = false;        // steps_ are remade for g
    steps_.assign(n, step{});
    for (size_t i = 0; i < n; ++i) steps_[i].t = nodes[i];
    seqs_apart_ = seqs_apart(g.batch);
    flash_steps_ = decode_steps_ = false;
    for (size_t i = 0; i < n; ++i) {
        if (nodes[i]->kind == OP_MUL_MAT) {
            steps_[i].kind = step_kind::mm;
            steps_[i].mm[0] = nodes[i];
            steps_[i].n_mm = 1;
        }
        if (nodes[i]->kind == OP_ATTENTION) {
            const attn_kernel k = choose_attention(nodes[i]).kind;
            flash_steps_ = flash_steps_ || k == attn_kernel::flash;
            decode_steps_ = decode_steps_ || k == attn_kernel::decode;
        }
    }
    if (!fuse_) return;

    auto is = [&](const tensor * x, op k) { return x && x->kind == k && x->node_index >= 0; };
    auto only_use = [&](const tensor * x, int n_uses) {
        return uses[size_t(x->node_index)] == n_uses && !steps_[size_t(x->node_index)].skip;
    };
    auto fold_norm = [&](step & s, tensor * x, int n_uses) {
        if (is(x, OP_RMS_NORM) && only_use(x, n_uses) && !x->data &&
            x->src[0]->ne[0] == s.mm[0]->src[0]->ne[0] && x->src[0]->nb[1] % 16 == 0) {
            s.norm = x;
            steps_[size_t(x->node_index)].skip = true;
        }
    };
    auto same_shape = [](const tensor * a, const tensor * b) {
        return a->ne[0] == b->ne[0] && a->ne[1] == b->ne[1] && a->nb[1] == b->nb[1];
    };

    for (size_t i = 0; i < n; ++i) {
        tensor * t = nodes[i];
        step & s = steps_[i];
        if (t->src[2]) continue;
        if ((t->kind == OP_KV_STORE || t->kind == OP_ATTENTION) && is(t->src[0], OP_ROPE) &&
            only_use(t->src[0], 1) && !t->src[0]->data) {
            // kv_store rotates k on its way into the cache, attention rotates
            // q as it loads it.
            s.kind = t->kind == OP_KV_STORE ? step_kind::kv_store : step_kind::attention;
            s.rope = t->src[0];
            s.extra = s.rope->src[0];
            steps_[size_t(s.rope->node_index)].skip = true;
        } else if (t->kind == OP_SWIGLU && is(t->src[0], OP_MUL_MAT) && is(t->src[1], OP_MUL_MAT)) {
            tensor * gt = t->src[0];
            tensor * up = t->src[1];
            if (only_use(gt, 1) && only_use(up, 1) && gt->src[1] == up->src[1] &&
                gt->src[0]->type == up->src[0]->type && same_shape(gt->src[0], up->src[0]) &&
                small_mm(gt) && !gt->data && !up->data) {
                s.kind = step_kind::mm_swiglu;
                s.mm[0] = gt;
                s.mm[1] = up;
                s.n_mm = 2;
                for (tensor * m : {gt, up}) {
                    steps_[size_t(m->node_index)].skip = true;
                    steps_[size_t(m->node_index)].kind = step_kind::plain;
                }
                fold_norm(s, gt->src[1], 2);
                s.extra = s.norm ? s.norm->src[0] : gt->src[1];
            }
        } else if (t->kind == OP_ADD) {
            for (int which : {1, 0}) {
                tensor * m = t->src[which];
                if (is(m, OP_MUL_MAT) && only_use(m, 1) && small_mm(m) && !m->data &&
                    same_shape(m, t) && same_shape(m, t->src[1 - which])) {
                    s.kind = step_kind::mm;
                    s.mm[0] = m;
                    s.n_mm = 1;
                    s.res = t->src[1 - which];
                    steps_[size_t(m->node_index)].skip = true;
                    steps_[size_t(m->node_index)].kind = step_kind::plain;
                    fold_norm(s, m->src[1], 1);
                    s.extra = s.norm ? s.norm->src[0] : m->src[1];
                    break;
                }
            }
        }
    }
    // Matmuls next to each other that read one input (q, k, v) run as one
    // launch, or through cuBLAS from one f16 copy of the input; a lone
    // matmul may still take its input's RMS norm. A cuBLAS matmul (not of f32
    // weights, which read f32) makes its f16 input from the norm or the
    // SwiGLU before it in one kernel.
    auto blas_f16 = [&](const tensor * m) {
        return !small_mm(m) && blas_fits(m) && m->src[0]->type != SMOL_TYPE_F32;
    };
    for (size_t i = 0; i < n; ++i) {
        tensor * t = nodes[i];
        if (steps_[i].kind != step_kind::mm || steps_[i].skip || steps_[i].res || t->src[2])
            continue;
        const bool blas = blas_f16(t);
        if (!blas && !small_mm(t)) continue;
        size_t j = i + 1;
        while (j < n && j < i + 3) {
            const tensor * u = nodes[j];
            if (steps_[j].kind != step_kind::mm || steps_[j].skip || steps_[j].res ||
                u->src[1] != t->src[1] || u->src[0]->type != t->src[0]->type ||
                u->src[0]->ne[0] != t->src[0]->ne[0] || u->src[0]->nb[1] != t->src[0]->nb[1] ||
                u->src[2] || nodes[j - 1]->data || (blas && !blas_f16(u))) {
                break;
            }
            ++j;
        }
        step & s = steps_[j - 1];
        s.n_mm = int(j - i);
        for (size_t k = i; k < j; ++k) {
            s.mm[k - i] = nodes[k];
            if (k + 1 < j) {
                steps_[k].skip = true;
                steps_[k].kind = step_kind::plain;
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
                steps_[size_t(x->node_index)].kind != step_kind::plain ||
                steps_[size_t(x->node_index)].skip || !same_shape(x, x->src[0]) ||
                !same_shape(x, x->src[1])) {
                return false;
            }
            steps_[size_t(x->node_index)].skip = true;
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
#if defined(SMOL_HAVE_BLAS)
    // A cuBLAS step over bf16 pairs keeps its results as hi and lo, for the
    // kernels that read them to add as they load them (in place of a sum
    // launch), when those are all that read them and run right after it:
    // the next step's input kernel (the output projection's and down's
    // results through the residual add before its norm, gate's and up's
    // through its SwiGLU), or for q, k and v the cache store (rotating k)
    // and the attention after it (rotating q), whose partials then go past
    // them in the work space.
    auto next = [&](size_t i) {
        while (++i < n && steps_[i].skip) {
        }
        return i;
    };
    auto only = [&](const tensor * m) { return uses[size_t(m->node_index)] == 1; };
    for (size_t i = 0; i < n; ++i) {
        step & s = steps_[i];
        if (s.skip || s.kind != step_kind::mm || !blas_f16(s.mm[0]) || !step_pairs(s)) continue;
        const size_t j = next(i);
        if (j == n) continue;
        const size_t k = next(j);
        const step & u = steps_[j];
        const tensor * m = s.mm[0];
        if (s.n_mm == 1 && u.kind == step_kind::mm && u.add && only(m)) {
            s.keep_pairs = (u.add->src[0] == m) != (u.add->src[1] == m);
        } else if (s.n_mm == 2 && u.kind == step_kind::mm && u.glu && only(m) && only(s.mm[1])) {
            const tensor * g = u.glu->src[0];
            const tensor * up = u.glu->src[1];
            s.keep_pairs = (g == m && up == s.mm[1]) || (g == s.mm[1] && up == m);
        } else if (s.n_mm == 3 && k < n && u.kind == step_kind::kv_store &&
                   steps_[k].kind == step_kind::attention) {
            const tensor * read[3] = {unrotated(u), u.t->src[1], unrotated(steps_[k])};
            s.keep_pairs = true;
            for (const tensor * x : s.mm)
                s.keep_pairs =
                    s.keep_pairs && only(x) && std::count(std::begin(read), std::end(read), x) == 1;
        }
    }
#endif
    // The GEMV of q, k and v may store k and v in the cache itself: the
    // KV_STORE whose k (through its rope) and v are the launch's second and
    // third results, when nothing else reads them.
    for (size_t i = 0; i < n; ++i) {
        step & s = steps_[i];
        if (s.skip || s.kind != step_kind::kv_store || !s.rope) continue;
        const tensor * k = s.rope->src[0];
        const tensor * v = s.t->src[1];
        // (The matmuls' own steps are skipped: the launch stands at v.)
        if (!is(k, OP_MUL_MAT) || !is(v, OP_MUL_MAT) || uses[size_t(k->node_index)] != 1 ||
            uses[size_t(v->node_index)] != 1) {
            continue;
        }
        step & q = steps_[size_t(v->node_index)];
        if (q.kind == step_kind::mm && !q.skip && q.n_mm == 3 && q.mm[1] == k && q.mm[2] == v)
            q.store = s.t;
    }
}

// Work space of the planned steps: attention's split partials, cuBLAS's
// dequantized weights and f16 inputs.
size_t cuda_backend::step_work() const {
    size_t work = 0;
    size_t kept = 0; // where the results a step kept end (attention's partials go past them)
    for (const step & s : steps_) {
        if (s.skip) continue;
        const tensor * t = s.t;
        if (t->kind == OP_ATTENTION) {
            // Partials of (max, sum, accumulators) per (token, query head, split).
            const attn_choice a = choose_attention(t);
            const size_t n_tok = size_t(t->ne[1]), n_head = size_t(t->iparams[1]);
            const size_t partial = size_t(t->iparams[3] + 2) * sizeof(float);
            size_t part = 0;
            if (a.kind == attn_kernel::decode && a.S > 1) {
                // Blocks x splits stay within the GPU's block slots (or the
                // blocks alone, unsplit), whatever head group a node serves.
                const int group = t->iparams[1] / t->iparams[2];
                const size_t blocks = n_tok * size_t(t->iparams[2]) * size_t(decode_subs(group));
                // (The merge copies whole 16-byte pieces: up to 12 bytes past the end.)
                part =
                    std::max(size_t(dec_slots_), blocks) * size_t(decode_heads(group)) * partial +
                    16;
            } else if (a.kind == attn_kernel::flash && (a.S > 1 || n_tok >= size_t(fa_rows))) {
                // (query heads x splits) stays within the layer's heads for
                // prompts (see flash_splits), so one bound serves any head
                // grouping the planner may choose later.
                const size_t heads = n_tok >= size_t(fa_rows) ? n_head : n_head * size_t(a.S);
                part = n_tok * heads * partial;
            } else if (a.kind == attn_kernel::classic && a.S > 1) {
                part = n_tok * n_head * size_t(a.S) * partial;
            }
            work = std::max(work, kept + part);
        }
#if defined(SMOL_HAVE_BLAS)
        if (s.kind == step_kind::mm && !small_mm(s.mm[0])) {
            // One input; one dequantized weight at a time, or every GEMM's
            // two columns until the one launch that adds them (blas_gemms).
            const bool pairs = step_pairs(s);
            const int64_t K = s.mm[0]->src[0]->ne[0], M = s.mm[0]->src[1]->ne[1];
            size_t scratch = 0;
            int64_t widest = 0;
            for (int i = 0; i < s.n_mm; ++i) {
                const tensor * w = s.mm[i]->src[0];
                const size_t b = blas_scratch_bytes(w->type, pairs, w->ne[1], K, M);
                scratch = pairs ? scratch + b : std::max(scratch, b);
                widest = std::max(widest, w->ne[1]);
            }
            const size_t end = blas_scratch_offset(pairs, K, widest, M) + scratch;
            work = std::max(work, end);
            kept = s.keep_pairs ? end : 0;
        }
#endif
    }
    return work;
}

// What run(g) would hold: the arena, the work space, the rope table, the
// cell table and input staging, and the buffers made once (cuBLAS's work
// space, attention's counters).
size_t cuda_backend::compute_bytes(graph & g) {
    make_steps(g);
    for (step & s : steps_) {
        if (!s.skip && s.extra && s.extra->kind != OP_NONE) s.t->src[2] = s.extra;
    }
    plan_arena(g, 256, probe_);
    for (step & s : steps_) {
        if (!s.skip && s.extra && s.extra->kind != OP_NONE) s.t->src[2] = nullptr;
    }
    const size_t granule = size_t(1) << 16;
    auto grown = [&](size_t n) { return align_up(n, granule); };
    int64_t n_tok = 0;
    size_t rope = 0, staging = 256;
    for (const tensor * t : g.nodes()) {
        n_tok = std::max(n_tok, t->ne[1]);
        if (t->kind == OP_ROPE && rope == 0)
            rope = size_t(t->ne[1]) * size_t(t->iparams[1] / 2) * sizeof(float2);
        for (const tensor * src : t->src) {
            if (src && src->kind == OP_NONE && src->where == placement::host)
                staging += align_up(src->nbytes(), 256);
        }
    }
    staging += 3 * align_up(size_t(n_tok) * sizeof(int32_t), 256);
    const size_t cells = g.batch.kv ? cell_table_bytes(g.batch.kv->n_cells) : 0;
    size_t fixed = done_.size;
#if defined(SMOL_HAVE_BLAS)
    fixed += blas_ws_.size;
#endif
    return grown(probe_.arena_bytes) + grown(std::max(step_work(), size_t(4) << 20)) + grown(rope) +
           grown(cells) + grown(staging) + fixed;
}

// Plans the arena. A fused step reads tensors its node does not list as
// sources (the input of a folded norm or rope, say); it is given them as an
// extra source while plan_arena runs, so their memory lives long enough.
void cuda_backend::prepare(graph & g) {
    make_steps(g);
    const auto & nodes = g.nodes();
    for (step & s : steps_) {
        if (!s.skip && s.extra && s.extra->kind != OP_NONE) s.t->src[2] = s.extra;
    }
    arena_plan & p = plan_;
    plan_arena(g, 256, p);
    for (step & s : steps_) {
        if (!s.skip && s.extra && s.extra->kind != OP_NONE) s.t->src[2] = nullptr;
    }
    grow(arena_, p.arena_bytes, "compute memory");
    for (size_t i = 0; i < nodes.size(); ++i) {
        if (p.offset[i] != SIZE_MAX)
            nodes[i]->data = static_cast<uint8_t *>(arena_.p) + p.offset[i];
    }
    grow(work_, step_work(), "work space");
    // A counter per (token, head) of every attention split over cells (per
    // (query tile, head) for the flash kernel); a head group's launch may
    // split with more tokens than a whole layer's.
    size_t counters = 0;
    for (const step & s : steps_) {
        if (s.skip || s.t->kind != OP_ATTENTION) continue;
        const attn_choice a = choose_attention(s.t);
        if (a.S == 1) continue;
        const size_t n_tok = size_t(s.t->ne[1]), n_head = size_t(s.t->iparams[1]);
        const size_t rows = a.kind == attn_kernel::flash ? (n_tok + fa_rows - 1) / fa_rows : n_tok;
        counters = std::max(counters, rows * n_head);
    }
    if (counters * sizeof(int) > done_.size) {
        grow(done_, counters * sizeof(int), "attention counters");
        SMOL_GPU_CHECK(cudaMemsetAsync(done_.p, 0, done_.size, stream_));
    }
    // One table of rope angles serves every ROPE node that shares the first
    // one's positions, head size and base (in a llama, all of them).
    rope_key_ = nullptr;
    for (const tensor * t : nodes) {
        if (t->kind == OP_ROPE) {
            rope_key_ = t;
            break;
        }
    }
    if (rope_key_) {
        grow(rope_, size_t(rope_key_->ne[1]) * size_t(rope_key_->iparams[1] / 2) * sizeof(float2),
             "rope table");
    }
    if (g.batch.kv) {
        const size_t n = cell_table_bytes(g.batch.kv->n_cells);
        if (n > cells_.size) {
            grow(cells_, n, "cache cell table");
            shadow_kv_ = nullptr; // the device copy of the table is gone
        }
    }
}

} // namespace smol::gpu
