// Helpers shared by the kernel tests: seeded random data, element-wise
// comparison with a useful failure message, and one ExecContext per CPU path.
#ifndef RECPS_TESTS_KERNELS_TEST_UTIL_H_
#define RECPS_TESTS_KERNELS_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/cpu_features.h"
#include "gtest/gtest.h"
#include "kernels/exec_context.h"

namespace recps::kernels::testing {

inline std::vector<float> RandomFloats(size_t n, uint64_t seed,
                                       float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// |a - b| <= atol + rtol * |b| for every element; reports the first few
// mismatches with their positions.
inline ::testing::AssertionResult AllNear(const float* a, const float* b,
                                          size_t n, double atol,
                                          double rtol = 0.0) {
  int bad = 0;
  std::string msg;
  for (size_t i = 0; i < n; ++i) {
    const double diff = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (!(diff <= atol + rtol * std::fabs(static_cast<double>(b[i])))) {
      if (bad < 5) {
        msg += " [" + std::to_string(i) + "] " + std::to_string(a[i]) +
               " vs " + std::to_string(b[i]) + ";";
      }
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << n << " elements differ:" << msg;
}

inline ::testing::AssertionResult AllNear(const std::vector<float>& a,
                                          const std::vector<float>& b,
                                          double atol, double rtol = 0.0) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: " << a.size() << " vs " << b.size();
  }
  return AllNear(a.data(), b.data(), a.size(), atol, rtol);
}

// One context per CPU vector path this machine supports (portable first),
// each on the calling thread; pair with a pool to test the threaded split.
inline std::vector<ExecContext> EveryCpuIsa(ThreadPool* pool = nullptr) {
  std::vector<ExecContext> out;
  for (CpuIsa isa : SupportedCpuIsas()) {
    ExecContext ctx;
    ctx.pool = pool;
    ctx.isa = isa;
    out.push_back(ctx);
  }
  return out;
}

}  // namespace recps::kernels::testing

#endif  // RECPS_TESTS_KERNELS_TEST_UTIL_H_
