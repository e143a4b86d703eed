// smol-collective.c++ - the in-process all-reduce of a head split.

#include "smol-collective.h"

#include <algorithm>

namespace smol {

collective::collective(int n_ranks)
    : n_ranks_(n_ranks), src_(size_t(n_ranks), nullptr), sums_(size_t(n_ranks)) {}

// A round has two meetings: every rank brings its partial's address; each
// sums every rank's partial into a buffer of its own; every rank meets
// again, and only then writes its output, which may be its partial's
// memory (the arena reuses a source's bytes for its last reader's result):
// no rank writes before every rank has read.
bool collective::all_reduce(int rank, const float * src, float * dst, size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    if (aborted_) return false;
    const uint64_t round = round_;
    src_[size_t(rank)] = src;
    if (++arrived_ == n_ranks_) cv_.notify_all();
    cv_.wait(lock, [&] { return aborted_ || arrived_ == n_ranks_ || round_ != round; });
    if (aborted_) return false;
    lock.unlock();
    std::vector<float> & sum = sums_[size_t(rank)];
    sum.resize(n);
    for (size_t i = 0; i < n; ++i) {
        float x = src_[0][i];
        for (int r = 1; r < n_ranks_; ++r) x += src_[size_t(r)][i];
        sum[i] = x;
    }
    lock.lock();
    if (++done_ == n_ranks_) {
        arrived_ = done_ = 0;
        ++round_;
        cv_.notify_all();
    } else {
        cv_.wait(lock, [&] { return aborted_ || round_ != round; });
        if (round_ == round) return false; // aborted before every rank had read
    }
    lock.unlock();
    std::copy(sum.begin(), sum.end(), dst);
    return true;
}

void collective::abort() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        aborted_ = true;
    }
    cv_.notify_all();
}

void collective::reset() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = false;
    arrived_ = done_ = 0;
    ++round_;
}

} // namespace smol
