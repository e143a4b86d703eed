// smol-faults.c++ - the armed faults' counters (smol-faults.h).

#include "smol-faults.h"

#include <atomic>

namespace smol::faults {

namespace {

struct armed_site {
    std::atomic<bool> armed{false};
    std::atomic<int64_t> skip{0};  // checks to let pass first
    std::atomic<int64_t> left{0};  // failures still to give (< 0: no end)
    std::atomic<int64_t> fired{0}; // failures given since armed
};
armed_site sites[size_t(site::count)];

} // namespace

const char * site_name(site s) {
    switch (s) {
    case site::device_alloc:
        return "device allocation";
    case site::host_pinned:
        return "pinned host allocation";
    case site::copy:
        return "copy";
    case site::kernel:
        return "kernel";
    case site::count:
        break;
    }
    return "?";
}

void arm(site s, int64_t after, int64_t times) {
    armed_site & a = sites[size_t(s)];
    a.armed.store(false);
    a.skip.store(after);
    a.left.store(times);
    a.fired.store(0);
    a.armed.store(times != 0);
}

void disarm(site s) {
    sites[size_t(s)].armed.store(false);
}

void disarm_all() {
    for (armed_site & a : sites) a.armed.store(false);
}

bool hit(site s) {
    armed_site & a = sites[size_t(s)];
    if (!a.armed.load(std::memory_order_relaxed)) return false;
    if (a.skip.fetch_sub(1) > 0) return false;
    const int64_t left = a.left.load();
    if (left == 0) return false;
    if (left > 0 && a.left.fetch_sub(1) <= 0) return false;
    a.fired.fetch_add(1);
    return true;
}

int64_t hits(site s) {
    return sites[size_t(s)].fired.load();
}

} // namespace smol::faults
