// smol-collective.h - the all-reduce of a head split, in one process: the
// devices that each hold part of every layer's heads run their graphs side
// by side, and at each ALL_REDUCE node every rank hands its partial sums
// and gets the sum of all ranks', added in rank order so that every rank
// holds the same bits. The stand-in for NCCL's all-reduce on the simulated
// devices and the CPU, whose memory the host reads.

#ifndef SMOL_COLLECTIVE_H
#define SMOL_COLLECTIVE_H

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace smol {

class collective {
  public:
    explicit collective(int n_ranks);
    int size() const { return n_ranks_; }

    // dst[i] = sum over ranks r, in order, of rank r's src[i], for n floats
    // (every rank the same n); returns when every rank has its sum. False,
    // without a sum, when the step was aborted (a rank failed before it
    // came): the caller fails its node.
    bool all_reduce(int rank, const float * src, float * dst, size_t n);
    // A rank failed: every rank waiting in this step, or coming later,
    // throws instead of waiting. reset() before the next step.
    void abort();
    void reset();

  private:
    const int n_ranks_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<const float *> src_;
    std::vector<std::vector<float>> sums_; // each rank's sum before it is written
    int arrived_ = 0, done_ = 0;
    uint64_t round_ = 0; // rounds begun
    bool aborted_ = false;
};

} // namespace smol

#endif // SMOL_COLLECTIVE_H
