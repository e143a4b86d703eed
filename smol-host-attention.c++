// smol-host-attention.c++ - the host's KV_STORE and ATTENTION of host-attended
// head groups (see smol-host-attention.h): visible cells by binary search in
// each sequence's position-sorted list, chunks of them as work items,
// partials merged per query head.

#include "smol-host-attention.h"

#include "smol-cpu-kernels.h"
#include "smol-error.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

namespace smol {

host_attention::host_attention(int n_threads) : pool_(std::max(1, n_threads)) {}

void host_attention::run(tensor * t, const batch_info & b) {
    if (t->kind == OP_KV_STORE) {
        // A few rows: on this thread, without waking the pool.
        if (t->src[0]->ne[1] <= kv_host_max_tokens) {
            kv_store_part(t, b, 0, 1);
        } else {
            pool_.run([&](int ith, int nth) { kv_store_part(t, b, ith, nth); });
        }
        return;
    }
    if (t->kind != OP_ATTENTION) {
        throw error(SMOL_ERR_BACKEND,
                    std::string("host attention cannot run a ") + op_names[t->kind] + " node");
    }
    attend(t, batch_of_view(b, node_kv_view(t, *b.kv)));
}

namespace {

// The first index of list[lo, hi) whose cell's position is above p (the
// list is sorted by position).
int32_t first_above(const kv_cache & kv, const int32_t * list, int32_t lo, int32_t hi, smol_pos p) {
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (kv.cell_pos[size_t(list[mid])] <= p) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

int32_t chunks_of(int32_t n, int32_t c) {
    return (n + c - 1) / c;
}

} // namespace

void host_attention::attend(tensor * t, const batch_info & b) {
    if (!b.seq_cells || !b.seq_begin) {
        throw error(SMOL_ERR_BACKEND, "host attention needs the batch's sequence cell lists "
                                      "(batch_info::seq_cells)");
    }
    const cpu::kernels & k = cpu::kernels_best();
    const kv_cache & kv = *b.kv;
    const tensor * q = t->src[0];
    const kv_view view = node_kv_view(t, kv);
    const int n_head = t->iparams[1], n_head_kv = t->iparams[2], hd = t->iparams[3];
    const int group = n_head / n_head_kv;
    const int n_kv = view.h1 - view.h0;
    const float scale = t->fparams[0] != 0 ? t->fparams[0] : 1.0f / std::sqrt(float(hd));
    const int32_t window = t->iparams[4], sink = t->iparams[5];
    const int32_t n_tok = int32_t(q->ne[1]);
    const int nth = pool_.size();

    // Each token's visible cells: [a0, a1) (the sinks of a window) and
    // [b0, b1) of its sequence's list.
    runs_.resize(size_t(n_tok));
    int32_t max_vis = 0;
    for (int32_t i = 0; i < n_tok; ++i) {
        const smol_pos p = b.pos[i];
        const smol_seq_id s = b.seq[i];
        const int32_t * list = b.seq_cells + b.seq_begin[s];
        const int32_t n_list = b.seq_begin[s + 1] - b.seq_begin[s];
        const int32_t n_vis = first_above(kv, list, 0, n_list, p);
        token_runs & r = runs_[size_t(i)];
        r.a0 = r.a1 = 0;
        r.b0 = 0;
        r.b1 = n_vis;
        if (window > 0) {
            r.a1 = first_above(kv, list, 0, n_vis, sink - 1);
            r.b0 = std::max(r.a1, first_above(kv, list, r.a1, n_vis, p - window));
        }
        max_vis = std::max(max_vis, (r.a1 - r.a0) + (r.b1 - r.b0));
    }
    // Chunks: enough work items to keep every thread busy (a decode step
    // splits each head's cells), none smaller than min_chunk cells.
    constexpr int32_t min_chunk = 256;
    const int64_t items = int64_t(n_tok) * n_kv;
    const int32_t want = int32_t(std::max<int64_t>(1, (4 * int64_t(nth) + items - 1) / items));
    int32_t C = std::max(min_chunk, chunks_of(max_vis, want));
    C = (C + 63) / 64 * 64;
    int32_t n_chunks = 0;
    for (token_runs & r : runs_) {
        r.chunk0 = n_chunks;
        n_chunks += chunks_of(r.a1 - r.a0, C) + chunks_of(r.b1 - r.b0, C);
    }
    runs_.push_back({0, 0, 0, 0, n_chunks}); // the end of the last token's chunks

    const size_t part = size_t(hd) + 2; // largest score, sum, values
    partials_.resize(size_t(n_chunks) * size_t(n_kv) * size_t(group) * part);
    const size_t per_thread = size_t(group) * (size_t(C) + 2 * size_t(hd));
    scratch_.resize(per_thread * size_t(nth));

    pool_.run([&](int ith, int nth_) {
        float * scores = scratch_.data() + per_thread * size_t(ith); // group x C
        float * qh = scores + size_t(group) * size_t(C);             // group x hd
        float * acc = qh + size_t(group) * size_t(hd);               // group x hd
        uint16_t h16[1024];
        float mx[64];
        // Work items (chunk, kv head), dealt out in turn.
        int32_t i = 0;
        for (int64_t w = ith; w < int64_t(n_chunks) * n_kv; w += nth_) {
            const int32_t c = int32_t(w / n_kv);
            const int hk = view.h0 + int(w % n_kv);
            while (runs_[size_t(i) + 1].chunk0 <= c) ++i; // chunks increase with w
            const token_runs & r = runs_[size_t(i)];
            const int32_t * list = b.seq_cells + b.seq_begin[b.seq[i]];
            const int32_t lc = c - r.chunk0;
            const int32_t ca = chunks_of(r.a1 - r.a0, C);
            const int32_t c0 = lc < ca ? r.a0 + lc * C : r.b0 + (lc - ca) * C;
            const int32_t c1 = std::min(lc < ca ? r.a1 : r.b1, c0 + C);
            const int32_t n = c1 - c0;
            for (int g = 0; g < group; ++g) {
                const float * src =
                    reinterpret_cast<const float *>(static_cast<const uint8_t *>(q->data) +
                                                    size_t(i) * q->nb[1]) +
                    size_t(hk * group + g) * size_t(hd);
                k.f32_to_f16(src, h16, hd);
                k.row_to_f32(SMOL_TYPE_F16, h16, qh + g * hd, hd);
                kv_rotate(qh + g * hd, hd, kv.rot_k);
            }
            const uint16_t * K = view.k + size_t(hk - view.h0) * view.head_stride;
            const uint16_t * V = view.v + size_t(hk - view.h0) * view.head_stride;
            if (kv.type == SMOL_TYPE_F16) {
                k.attn_scores(K, list + c0, n, hd, qh, group, scale, scores, C, mx);
            } else {
                k.attn_scores_q(kv.type, K, list + c0, n, hd, qh, group, scale, scores, C, mx);
            }
            float * out =
                partials_.data() +
                ((size_t(c) * size_t(n_kv) + size_t(hk - view.h0)) * size_t(group)) * part;
            for (int g = 0; g < group; ++g) {
                float * sc = scores + size_t(g) * size_t(C);
                k.softmax_exp(sc, sc, mx[g], n);
                double s[4] = {0, 0, 0, 0};
                int32_t j = 0;
                for (; j + 4 <= n; j += 4)
                    for (int l = 0; l < 4; ++l) s[l] += double(sc[j + l]);
                for (; j < n; ++j) s[0] += double(sc[j]);
                out[size_t(g) * part] = mx[g];
                out[size_t(g) * part + 1] = float((s[0] + s[1]) + (s[2] + s[3]));
            }
            if (kv.type == SMOL_TYPE_F16) {
                k.attn_values(V, list + c0, scores, C, group, n, hd, acc);
            } else {
                k.attn_values_q(kv.type, V, list + c0, scores, C, group, n, hd, acc);
            }
            for (int g = 0; g < group; ++g)
                std::memcpy(out + size_t(g) * part + 2, acc + size_t(g) * size_t(hd),
                            size_t(hd) * sizeof(float));
        }
        pool_.barrier();
        // Merge: per (token, query head), its chunks' partials rescaled to
        // the largest score, summed in double, normalised, turned back from
        // V's rotation.
        double o[1024];
        float res[1024];
        for (int64_t w = ith; w < int64_t(n_tok) * n_kv * group; w += nth_) {
            const int32_t ti = int32_t(w / (int64_t(n_kv) * group));
            const int r = int(w % (int64_t(n_kv) * group)); // (kv head, query) in the node
            const token_runs & tr = runs_[size_t(ti)];
            const int32_t e = runs_[size_t(ti) + 1].chunk0;
            float m = -std::numeric_limits<float>::infinity();
            for (int32_t c = tr.chunk0; c < e; ++c)
                m = std::max(
                    m, partials_[(size_t(c) * size_t(n_kv) * size_t(group) + size_t(r)) * part]);
            double l = 0;
            std::fill(o, o + hd, 0.0);
            for (int32_t c = tr.chunk0; c < e; ++c) {
                const float * pc = partials_.data() +
                                   (size_t(c) * size_t(n_kv) * size_t(group) + size_t(r)) * part;
                if (pc[1] == 0) continue;
                const double f = std::exp(double(pc[0]) - double(m));
                l += f * double(pc[1]);
                for (int d = 0; d < hd; ++d) o[d] += f * double(pc[2 + d]);
            }
            for (int d = 0; d < hd; ++d) res[d] = l > 0 ? float(o[d] / l) : 0.0f;
            kv_rotate(res, hd, kv.rot_v);
            const int h = (view.h0 + r / group) * group + r % group;
            float * dst =
                reinterpret_cast<float *>(static_cast<uint8_t *>(t->data) + size_t(ti) * t->nb[1]) +
                size_t(h) * size_t(hd);
            std::memcpy(dst, res, size_t(hd) * sizeof(float));
        }
    });
    runs_.pop_back();
}

double host_attention::measure(int32_t head_dim, int32_t q_per_kv, smol_type type,
                               const std::function<bool()> & more) {
    // Alone: one measurement per (threads, shape, type) in a process:
    // contexts come and go, the host does not change.
    static std::mutex mu;
    static std::map<std::tuple<int, int32_t, int32_t, int>, double> known;
    const auto key = std::make_tuple(pool_.size(), head_dim, q_per_kv, int(type));
    if (!more) {
        std::lock_guard<std::mutex> lock(mu);
        if (auto it = known.find(key); it != known.end()) return it->second;
    }
    // 256 MiB of f16 rows: more than a last-level cache holds.
    constexpr int32_t n_heads = 16, n_cells = 65536;
    kv_cache kv;
    kv.init(1, n_heads, head_dim, n_cells, type);
    const size_t words = size_t(n_heads) * size_t(n_cells) * size_t(kv.row_words);
    // Small numbers of any type: 0x2e66 is an f16 0.1; a quantized row
    // reads it as scales and nibbles alike.
    std::vector<uint16_t> K(words, 0x2e66), V(words, 0x2e66);
    kv.k = K.data();
    kv.v = V.data();
    std::vector<int32_t> cells(static_cast<size_t>(n_cells));
    for (int32_t c = 0; c < n_cells; ++c) {
        cells[size_t(c)] = c;
        kv.cell_pos[size_t(c)] = c;
        kv.cell_seqs[size_t(c)] = seq_mask::of(0);
    }
    kv.n_used = n_cells;
    const int32_t begin[2] = {0, n_cells};
    const smol_pos pos = n_cells - 1;
    const smol_seq_id seq = 0;
    const int32_t cell = n_cells - 1;
    batch_info b;
    b.pos = &pos;
    b.seq = &seq;
    b.cell = &cell;
    b.n_tokens = 1;
    b.kv = &kv;
    b.seq_cells = cells.data();
    b.seq_begin = begin;
    const int32_t n_head = n_heads * q_per_kv;
    std::vector<float> qv(size_t(n_head) * size_t(head_dim), 0.01f), out(qv.size());
    tensor qt, at;
    tensor_set_shape(qt, SMOL_TYPE_F32, int64_t(n_head) * head_dim, 1);
    tensor_set_shape(at, SMOL_TYPE_F32, int64_t(n_head) * head_dim, 1);
    qt.data = qv.data();
    at.data = out.data();
    at.kind = OP_ATTENTION;
    at.src[0] = &qt;
    at.iparams[1] = n_head;
    at.iparams[2] = n_heads;
    at.iparams[3] = head_dim;
    at.kv = kv.layer_view(0);
    at.on_host = true;
    // A first pass brings the pages in; then passes (at least three, or
    // for as long as `more` says), the median's speed.
    attend(&at, b);
    std::vector<double> rates;
    while (rates.size() < 3 || (more && more() && rates.size() < 1000)) {
        const auto t0 = std::chrono::steady_clock::now();
        attend(&at, b);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        rates.push_back(2.0 * double(words) * 2.0 / s);
    }
    std::nth_element(rates.begin(), rates.begin() + long(rates.size() / 2), rates.end());
    const double rate = rates[rates.size() / 2];
    if (!more) {
        std::lock_guard<std::mutex> lock(mu);
        known[key] = rate;
    }
    return rate;
}

} // namespace smol
