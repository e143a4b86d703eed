// smol-faults.h - faults a test makes the backends report: a refused device
// or pinned host allocation, a copy or a kernel that fails during a step.
// They take the paths a real failure takes (the same exceptions, fallbacks
// and clean-up), so tests can show what a user sees when a device fails
// without a failing device. Only tests arm them; nothing in the product
// does, and a disarmed site costs one relaxed atomic load.

#ifndef SMOL_FAULTS_H
#define SMOL_FAULTS_H

#include <cstdint>

namespace smol::faults {

enum class site : uint8_t {
    device_alloc, // device memory (an allocation or an arena that grows)
    host_pinned,  // pinning host memory (the backend falls back to pageable)
    copy,         // a copy node between memory spaces
    kernel,       // a compute node
    count
};
const char * site_name(site s);

// The check at s that comes `after` checks from now fails, and so do the
// `times` - 1 after it (times < 0: every later one), until disarmed.
void arm(site s, int64_t after = 0, int64_t times = 1);
void disarm(site s);
void disarm_all();
// Whether this check at s fails; counts the check while s is armed.
bool hit(site s);
// Checks at s that failed since it was last armed.
int64_t hits(site s);

// Disarms every site when it goes out of scope, so that a failing check
// in a test leaves no fault armed for the next case.
struct scope {
    scope() = default;
    scope(const scope &) = delete;
    scope & operator=(const scope &) = delete;
    ~scope() { disarm_all(); }
};

} // namespace smol::faults

#endif // SMOL_FAULTS_H
