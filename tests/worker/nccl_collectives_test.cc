// NCCL collectives on one GPU (world size 1); skipped without a GPU.
#include "worker/collectives/nccl_collectives.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda_util.h"
#include "worker/collectives/kv_store.h"
#include "tests/testing/gpu_test_util.h"

#if defined(RECPS_HAVE_NCCL)
#include <cuda_runtime.h>
#endif

namespace recps::worker {
namespace {

TEST(NcclCollectivesTest, OneRankOnOneGpu) {
  RECPS_REQUIRE_GPU_OR_SKIP();
#if !defined(RECPS_HAVE_NCCL)
  FAIL() << "a GPU is present but this build has no NCCL (CMake refuses a "
            "CUDA tree without NCCL; how was this built?)";
#else
  InMemoryKeyValueStore store;
  absl::StatusOr<std::unique_ptr<Collectives>> c =
      CreateNcclCollectives(store, "nccl-test", 0, 1, 0, absl::Seconds(60));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(store.Get("nccl-test/nccl/unique_id", absl::ZeroDuration()).ok());

  const size_t n = 1000003;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = float(i % 101);
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(
      cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice),
      cudaSuccess);
  EXPECT_TRUE((*c)->AllReduceSum(absl::MakeSpan(dev, n)).ok());
  EXPECT_TRUE(AllReduceInBuckets(**c, absl::MakeSpan(dev, n), 1 << 16).ok());
  EXPECT_TRUE((*c)->Broadcast(absl::MakeSpan(dev, n), 0).ok());
  EXPECT_TRUE((*c)->Barrier().ok());
  std::vector<float> out(n);
  ASSERT_EQ(
      cudaMemcpy(out.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost),
      cudaSuccess);
  EXPECT_EQ(out, host);  // sum over one rank is the identity

  // Host memory is refused, not dereferenced on the device.
  EXPECT_TRUE(
      absl::IsInvalidArgument((*c)->AllReduceSum(absl::MakeSpan(host))));
  EXPECT_TRUE(
      absl::IsInvalidArgument((*c)->Broadcast(absl::MakeSpan(dev, n), 1)));
  // Still usable after refused arguments.
  EXPECT_TRUE((*c)->Barrier().ok());
  cudaFree(dev);
#endif
}

TEST(NcclCollectivesTest, MissingRankZeroTimesOut) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  InMemoryKeyValueStore store;
  absl::StatusOr<std::unique_ptr<Collectives>> c =
      CreateNcclCollectives(store, "nccl-missing", 1, 2, 0, absl::Seconds(1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(c.status())) << c.status();
}

}  // namespace
}  // namespace recps::worker
