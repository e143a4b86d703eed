// test-cuda.h - what test-cuda's two files share: the weight types every
// kernel is checked for and the error measure. test-cuda.c++ checks the
// CUDA backend's ops and kernels against the CPU and float64, and holds
// main, which skips the "gpu" suite where there is no GPU;
// test-cuda-models.c++ checks whole models through the C API.

#ifndef SMOL_TEST_CUDA_H
#define SMOL_TEST_CUDA_H

#include "smol.h"

#include <algorithm>
#include <cmath>
#include <doctest/doctest.h>
#include <vector>

namespace cuda_test {

constexpr smol_type all_types[] = {
    SMOL_TYPE_F32,  SMOL_TYPE_F16,  SMOL_TYPE_BF16, SMOL_TYPE_Q8_0,   SMOL_TYPE_Q4_0,
    SMOL_TYPE_Q4_1, SMOL_TYPE_Q5_0, SMOL_TYPE_Q5_1, SMOL_TYPE_IQ4_NL, SMOL_TYPE_Q2_K,
    SMOL_TYPE_Q3_K, SMOL_TYPE_Q4_K, SMOL_TYPE_Q5_K, SMOL_TYPE_Q6_K,   SMOL_TYPE_IQ4_XS};

// max |a - b| / max |b|: an error relative to the output's scale. Any NaN
// or infinity in a (an unwritten element) makes it infinite.
template <class B> double rel_err(const std::vector<float> & a, const std::vector<B> & b) {
    REQUIRE(a.size() == b.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        if (!std::isfinite(a[i])) return INFINITY;
        num = std::max(num, std::fabs(double(a[i]) - double(b[i])));
        den = std::max(den, std::fabs(double(b[i])));
    }
    return den > 0 ? num / den : num;
}

} // namespace cuda_test

#endif
