// GPU test gating: skip cleanly where no GPU is found, FAIL where a GPU is
// installed (/dev/nvidia*) but CUDA cannot initialise.
#ifndef RECPS_TESTS_TESTING_GPU_TEST_UTIL_H_
#define RECPS_TESTS_TESTING_GPU_TEST_UTIL_H_

#include "gtest/gtest.h"
#include "kernels/cuda_util.h"

// In a TEST body: ASSERT-fails on an initialisation error, skips without a
// GPU, goes on with one.
#define RECPS_REQUIRE_GPU_OR_SKIP()                                       \
  do {                                                                    \
    const absl::StatusOr<int> recps_gpus_ = ::recps::kernels::CudaDeviceCount(); \
    ASSERT_TRUE(recps_gpus_.ok()) << recps_gpus_.status();                \
    if (*recps_gpus_ == 0) GTEST_SKIP() << "no CUDA GPU";                 \
  } while (0)

// In a TEST body of a case that checks the behaviour without a GPU (the
// start-up error): skips where a GPU is present. Such cases are named
// ...WithoutAGpu... so that scripts/device-check.sh leaves them out.
#define RECPS_REQUIRE_NO_GPU_OR_SKIP()                                    \
  do {                                                                    \
    const absl::StatusOr<int> recps_gpus_ = ::recps::kernels::CudaDeviceCount(); \
    if (!recps_gpus_.ok() || *recps_gpus_ > 0) GTEST_SKIP() << "a GPU is installed"; \
  } while (0)

#endif  // RECPS_TESTS_TESTING_GPU_TEST_UTIL_H_
