// smol-schedule.c++ - the schedule of a graph over the compute stream, the
// two copy streams and the host stream (make_schedule), its printed program,
// the events one stream records and another waits for, and one copy node run
// on the host.

#include "smol-schedule.h"

#include "smol-graph.h"
#include "smol-plan.h"

#include <array>
#include <cstdio>
#include <cstring>
#include <string>

namespace smol {

// --- schedule ------------------------------------------------------------------------

const char * stream_name(stream_id s) {
    switch (s) {
    case stream_id::compute:
        return "compute";
    case stream_id::h2d:
        return "h2d";
    case stream_id::d2h:
        return "d2h";
    case stream_id::host:
        return "host";
    }
    return "?";
}

stream_id node_stream(const tensor * t) {
    if (t->on_host) return stream_id::host;
    if (t->kind != OP_COPY) return stream_id::compute;
    switch (t->copy.dir) {
    case copy_dir::h2d:
        return stream_id::h2d;
    case copy_dir::d2h:
        return stream_id::d2h;
    case copy_dir::any:
        break;
    }
    return stream_id::compute;
}

void make_schedule(const graph & g, schedule & s) {
    const auto & nodes = g.nodes();
    const size_t n = nodes.size();
    for (auto & p : s.prog) p.clear();
    s.issue.clear();
    s.event_node.clear();
    s.event_pos.clear();
    s.n_events = 0;
    s.node_stream.resize(n);
    s.event_after.assign(n, -1);
    s.needs_event.assign(n, 0);
    for (size_t i = 0; i < n; ++i) s.node_stream[i] = uint8_t(node_stream(nodes[i]));
    // What a node waits for: its sources and its ordering dependencies.
    auto inputs = [](const tensor * t) {
        return std::array<const tensor *, max_src + 2>{t->src[0], t->src[1], t->src[2], t->deps[0],
                                                       t->deps[1]};
    };
    // A node needs an event when a node of another stream depends on it.
    for (size_t i = 0; i < n; ++i) {
        for (const tensor * src : inputs(nodes[i])) {
            if (src && src->kind != OP_NONE && src->node_index >= 0 &&
                s.node_stream[size_t(src->node_index)] != s.node_stream[i]) {
                s.needs_event[size_t(src->node_index)] = 1;
            }
        }
    }
    // waited[a][b]: the last record of stream b that stream a has waited for;
    // a stream's records complete in order, so later ones cover earlier ones.
    int32_t waited[n_streams][n_streams];
    for (auto & row : waited)
        for (int32_t & w : row) w = -1;
    auto emit = [&](int st, schedule::kind k, int32_t node, int32_t event) {
        s.prog[st].push_back({k, node, event});
        s.issue.emplace_back(uint8_t(st), int32_t(s.prog[st].size() - 1));
    };
    for (size_t i = 0; i < n; ++i) {
        const int st = s.node_stream[i];
        for (const tensor * src : inputs(nodes[i])) {
            if (!src || src->kind == OP_NONE || src->node_index < 0) continue;
            const int32_t e = s.event_after[size_t(src->node_index)];
            if (e < 0) continue;
            const int other = s.node_stream[size_t(src->node_index)];
            if (other == st || s.event_pos[size_t(e)] <= waited[st][other]) continue;
            waited[st][other] = s.event_pos[size_t(e)];
            emit(st, schedule::kind::wait, -1, e);
        }
        emit(st, schedule::kind::run, int32_t(i), -1);
        if (s.needs_event[i]) {
            const int32_t e = s.n_events++;
            s.event_after[i] = e;
            s.event_node.push_back(int32_t(i));
            emit(st, schedule::kind::record, -1, e);
            s.event_pos.push_back(int32_t(s.prog[st].size() - 1));
        }
    }
}

// One line's description of a node for the printed program.
std::string describe_node(const tensor * t) {
    char b[160];
    switch (t->kind) {
    case OP_COPY: {
        if (*t->name) { // the host attention's copies
            std::snprintf(b, sizeof b, "%-9s layer %d: %s",
                          t->copy.dir == copy_dir::h2d ? "TO-DEVICE" : "TO-HOST", t->iparams[0],
                          t->name);
            return b;
        }
        const char * what = t->copy.dir == copy_dir::h2d   ? "PREFETCH"
                            : t->copy.dir == copy_dir::d2h ? "OFFLOAD"
                                                           : "COPY";
        std::snprintf(b, sizeof b, "%-9s layer %d group %d %s slot %d: %zu x %s", what,
                      t->iparams[0], t->iparams[1], t->copy.dir == copy_dir::d2h ? "from" : "->",
                      t->iparams[2], t->copy.height, format_bytes(t->copy.width).c_str());
        return b;
    }
    case OP_KV_STORE:
    case OP_ATTENTION: {
        const std::string where = !t->kv.k          ? "cache"
                                  : t->on_host      ? "on the host"
                                  : t->kv.slot >= 0 ? "slot " + std::to_string(t->kv.slot)
                                                    : "resident";
        if (!t->kv.k) {
            std::snprintf(b, sizeof b, "%-9s layer %d, all kv heads (%s)", op_names[t->kind],
                          t->iparams[0], where.c_str());
        } else {
            std::snprintf(b, sizeof b, "%-9s layer %d kv heads %d-%d (%s)", op_names[t->kind],
                          t->iparams[0], t->kv.h0, t->kv.h1 - 1, where.c_str());
        }
        return b;
    }
    default:
        std::snprintf(b, sizeof b, "%-9s [%lld x %lld]", op_names[t->kind], (long long)t->ne[0],
                      (long long)t->ne[1]);
        return b;
    }
}

std::string format_schedule(const graph & g, const schedule & s) {
    std::string out;
    char b[256];
    size_t n_copies = s.prog[1].size() + s.prog[2].size();
    std::snprintf(b, sizeof b,
                  "schedule: %zu nodes, %d events; instructions per stream: compute %zu, h2d %zu, "
                  "d2h %zu (%zu copy instructions)\n",
                  g.nodes().size(), s.n_events, s.prog[0].size(), s.prog[1].size(),
                  s.prog[2].size(), n_copies);
    out += b;
    if (!s.prog[3].empty()) {
        std::snprintf(b, sizeof b, "  host %zu (attention of offloaded heads on the host)\n",
                      s.prog[3].size());
        out += b;
    }
    for (size_t k = 0; k < s.issue.size(); ++k) {
        const auto [st, idx] = s.issue[k];
        const schedule::instr & in = s.prog[st][size_t(idx)];
        const char * sn = stream_name(stream_id(st));
        switch (in.what) {
        case schedule::kind::wait:
            std::snprintf(
                b, sizeof b, "%6zu %-7s %5d   wait   e%d (after #%d on %s)\n", k, sn, idx, in.event,
                s.event_node[size_t(in.event)],
                stream_name(stream_id(s.node_stream[size_t(s.event_node[size_t(in.event)])])));
            break;
        case schedule::kind::record:
            std::snprintf(b, sizeof b, "%6zu %-7s %5d   record e%d\n", k, sn, idx, in.event);
            break;
        case schedule::kind::run:
            std::snprintf(b, sizeof b, "%6zu %-7s %5d   #%-5d %s\n", k, sn, idx, in.node,
                          describe_node(g.nodes()[size_t(in.node)]).c_str());
            break;
        }
        out += b;
    }
    return out;
}

void event_set::reset(int32_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    done_.assign(size_t(n), 0);
    failed_ = false;
}

void event_set::record(int32_t e) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        done_[size_t(e)] = 1;
    }
    cv_.notify_all();
}

bool event_set::wait(int32_t e) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return failed_ || done_[size_t(e)] != 0; });
    return !failed_;
}

void event_set::fail() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        failed_ = true;
    }
    cv_.notify_all();
}

void run_copy_node(const tensor * t) {
    const copy_desc & c = t->copy;
    const uint8_t * src = static_cast<const uint8_t *>(t->src[0]->data) + c.offset;
    uint8_t * dst = static_cast<uint8_t *>(t->data) + c.offset;
    if (c.height == 0) {
        std::memcpy(dst, src, t->src[0]->nbytes());
        return;
    }
    if (c.width == c.dpitch && c.width == c.spitch) {
        std::memcpy(dst, src, c.width * c.height);
        return;
    }
    for (size_t r = 0; r < c.height; ++r)
        std::memcpy(dst + r * c.dpitch, src + r * c.spitch, c.width);
}

} // namespace smol
