// smol-cuda-steps.cu - the GPU backend's plan of one graph: its steps
// (make_steps, through the fusion planner of smol-cuda-fusion.h), the work
// space they need, the arena's plan (compute_bytes, prepare).

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

// The steps of g (plan_steps, with the backend's kernel choices), and what
// the attention steps among them will launch.
// The ops and options of Gemma 3's graph the GPU kernels do not run yet:
// refused before any step is planned, so nothing runs approximately.
void cuda_backend::make_steps(graph & g) {
    prepared_ = false; // steps_ are remade for g
    fusion_rules r;
    r.fuse = fuse_;
    r.small_mm = [this](const tensor * m) { return small_mm(m); };
    r.blas_fits = [this](const tensor * m) { return blas_fits(m); };
    plan_steps(g, r, steps_);
    // The host's nodes run on the host stream, never as kernels.
    for (step & s : steps_) s.skip = s.skip || s.t->on_host;
    seqs_apart_ = seqs_apart(g.batch);
    kv_quant_ = g.batch.kv && g.batch.kv->type != SMOL_TYPE_F16;
    flash_steps_ = decode_steps_ = false;
    for (const tensor * t : g.nodes()) {
        if (t->kind == OP_ATTENTION && !t->on_host) {
            const attn_kernel k = choose_attention(t).kind;
            flash_steps_ = flash_steps_ || k == attn_kernel::flash;
            decode_steps_ = decode_steps_ || k == attn_kernel::decode;
        }
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
    plan_arena(g, 256, probe_, &extra_reads());
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
    staging += 4 * align_up(size_t(n_tok) * sizeof(int32_t), 256);
    const size_t cells = (g.batch.kv ? cell_table_bytes(g.batch.kv->n_cells) : 0) +
                         (g.batch.local ? cell_table_bytes(g.batch.local->kv->n_cells) : 0);
    size_t fixed = done_.size;
#if defined(SMOL_HAVE_BLAS)
    fixed += blas_ws_.size;
#endif
    return grown(probe_.arena_bytes) + grown(std::max(step_work(), size_t(4) << 20)) + grown(rope) +
           grown(cells) + grown(staging) + fixed;
}

// A fused step reads tensors its node does not list as sources (the input
// of a folded norm or rope, say): the arena plan is told of them, so their
// memory lives long enough.
const std::vector<const tensor *> & cuda_backend::extra_reads() {
    extra_reads_.assign(steps_.size(), nullptr);
    for (size_t i = 0; i < steps_.size(); ++i) {
        if (!steps_[i].skip) extra_reads_[i] = steps_[i].extra;
    }
    return extra_reads_;
}

// Plans the arena.
void cuda_backend::prepare(graph & g) {
    make_steps(g);
    const auto & nodes = g.nodes();
    arena_plan & p = plan_;
    plan_arena(g, 256, p, &extra_reads());
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
    if (g.batch.local) {
        const size_t n = cell_table_bytes(g.batch.local->kv->n_cells);
        if (n > win_cells_.size) grow(win_cells_, n, "window store cell table");
    }
}

} // namespace smol::gpu
