// The device memory seam (kernels/device_memory.h): the CPU path everywhere,
// the refusals of CUDA where there is no GPU or no CUDA build, and the GPU
// path (DeviceMemoryCuda*) where a GPU is present: skipped without one,
// failing when one is present but does not initialise.
#include "kernels/device_memory.h"

#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda_util.h"
#include "tests/testing/gpu_test_util.h"

namespace recps::kernels {
namespace {

using ::testing::HasSubstr;

TEST(DeviceMemory, HostBufferGrowsKeepingContentsAndZeroingTheRest) {
  DeviceBuffer b;
  EXPECT_EQ(b.device(), Device::kCpu);
  EXPECT_EQ(b.size(), 0u);
  ASSERT_TRUE(b.Resize(3).ok());
  ASSERT_NE(b.data(), nullptr);
  for (int i = 0; i < 3; ++i) b.data()[i] = float(i + 1);
  ASSERT_TRUE(b.Resize(2).ok());  // never shrinks
  EXPECT_EQ(b.size(), 3u);
  ASSERT_TRUE(b.Resize(6).ok());
  EXPECT_EQ(std::vector<float>(b.data(), b.data() + 6),
            (std::vector<float>{1, 2, 3, 0, 0, 0}));
  DeviceBuffer moved = std::move(b);
  EXPECT_EQ(moved.size(), 6u);
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(moved.data()[2], 3.0f);
}

TEST(DeviceMemory, HostCopiesAndSynchronize) {
  const ExecContext cpu;
  std::vector<float> src(5);
  std::iota(src.begin(), src.end(), 1.0f);
  std::vector<float> dev(5), back(5), copy(5);
  ASSERT_TRUE(CopyToDevice(dev.data(), src.data(), 5, cpu).ok());
  ASSERT_TRUE(CopyOnDevice(copy.data(), dev.data(), 5, cpu).ok());
  ASSERT_TRUE(CopyToHost(back.data(), copy.data(), 5, cpu).ok());
  ASSERT_TRUE(Synchronize(cpu).ok());
  EXPECT_EQ(back, src);
  ASSERT_TRUE(ZeroOnDevice(back.data() + 1, 3, cpu).ok());
  EXPECT_EQ(back, (std::vector<float>{1, 0, 0, 0, 5}));
  // n = 0 is a no-op even with null pointers; nulls otherwise are refused.
  EXPECT_TRUE(CopyToDevice(static_cast<float*>(nullptr), nullptr, 0, cpu).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(CopyToHost(nullptr, src.data(), 1, cpu)));
  EXPECT_TRUE(absl::IsInvalidArgument(CopyToDevice(dev.data(), nullptr, 1, cpu)));
  EXPECT_TRUE(absl::IsInvalidArgument(ZeroOnDevice(nullptr, 1, cpu)));
}

TEST(DeviceMemory, Int64ArraysAndStridedCopies) {
  const ExecContext cpu;
  DeviceArray<int64_t> ids;
  ASSERT_TRUE(ids.Resize(3).ok());
  const std::vector<int64_t> host = {int64_t{1} << 40, -2, 7};
  ASSERT_TRUE(CopyToDevice(ids.data(), host.data(), 3, cpu).ok());
  EXPECT_EQ(std::vector<int64_t>(ids.data(), ids.data() + 3), host);
  // Column block 1 (width 2) of a 3 x 6 matrix out to a dense 3 x 2 and back.
  std::vector<float> wide(18);
  std::iota(wide.begin(), wide.end(), 0.0f);
  std::vector<float> block(6, -1.0f);
  ASSERT_TRUE(CopyStridedOnDevice(block.data(), 2, wide.data() + 2, 6, 2, 3, cpu).ok());
  EXPECT_EQ(block, (std::vector<float>{2, 3, 8, 9, 14, 15}));
  std::vector<float> back(18, 0.0f);
  ASSERT_TRUE(CopyStridedOnDevice(back.data() + 4, 6, block.data(), 2, 2, 3, cpu).ok());
  EXPECT_EQ(back[4], 2.0f);
  EXPECT_EQ(back[17], 15.0f);
  EXPECT_EQ(back[3], 0.0f);
  EXPECT_TRUE(absl::IsInvalidArgument(
      CopyStridedOnDevice(block.data(), 1, wide.data(), 6, 2, 3, cpu)));
}

TEST(DeviceMemory, CpuResourcesNeedNothing) {
  ThreadPool pool(2);
  auto r = ExecResources::Create(Device::kCpu, 0, &pool);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->ctx().device, Device::kCpu);
  EXPECT_EQ((*r)->ctx().pool, &pool);
  EXPECT_EQ((*r)->ctx().cuda_stream, nullptr);
  EXPECT_EQ((*r)->ctx().cublas_handle, nullptr);
  EXPECT_TRUE(CheckDeviceUsable(Device::kCpu, 0).ok());
}

// Where no GPU can run (this machine, CI): every CUDA entry point says why,
// naming the device, and nothing crashes.
TEST(DeviceMemory, CudaWithoutAGpuIsRefusedNamingTheDevice) {
  RECPS_REQUIRE_NO_GPU_OR_SKIP();
  const absl::Status usable = CheckDeviceUsable(Device::kCuda, 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(usable)) << usable;
  EXPECT_THAT(usable.message(), HasSubstr("device cuda:1"));
#if RECPS_HAVE_CUDA
  EXPECT_THAT(usable.message(), HasSubstr("no CUDA device is visible"));
#else
  EXPECT_THAT(usable.message(), HasSubstr("this build has no CUDA"));
#endif
  auto r = ExecResources::Create(Device::kCuda, 0, nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("device cuda:0"));
#if !RECPS_HAVE_CUDA
  DeviceBuffer b(Device::kCuda, 0);
  EXPECT_TRUE(absl::IsFailedPrecondition(b.Resize(4)));
  EXPECT_EQ(b.size(), 0u);
  ExecContext cuda;
  cuda.device = Device::kCuda;
  float x = 0;
  EXPECT_TRUE(absl::IsFailedPrecondition(CopyToDevice(&x, &x, 1, cuda)));
  EXPECT_TRUE(absl::IsFailedPrecondition(Synchronize(cuda)));
#endif
}

// The GPU path: a round trip through device memory on the resources'
// stream, growth keeping contents, and an out-of-range ordinal refused.
TEST(DeviceMemoryCuda, BufferRoundTripOnTheStream) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  auto r = ExecResources::Create(Device::kCuda, 0, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();  // a GPU is present: must initialise
  const ExecContext& ctx = (*r)->ctx();
  ASSERT_NE(ctx.cuda_stream, nullptr);
  ASSERT_NE(ctx.cublas_handle, nullptr);
  DeviceBuffer b(Device::kCuda, 0);
  ASSERT_TRUE(b.Resize(1000).ok());
  std::vector<float> src(1000);
  std::iota(src.begin(), src.end(), 0.5f);
  ASSERT_TRUE(CopyToDevice(b.data(), src.data(), src.size(), ctx).ok());
  ASSERT_TRUE(Synchronize(ctx).ok());
  ASSERT_TRUE(b.Resize(1500).ok());  // keeps the 1000, zeroes the rest
  DeviceBuffer c(Device::kCuda, 0);
  ASSERT_TRUE(c.Resize(1500).ok());
  ASSERT_TRUE(CopyOnDevice(c.data(), b.data(), 1500, ctx).ok());
  ASSERT_TRUE(ZeroOnDevice(c.data(), 10, ctx).ok());
  std::vector<float> back(1500, -1.0f);
  ASSERT_TRUE(CopyToHost(back.data(), c.data(), 1500, ctx).ok());
  ASSERT_TRUE(Synchronize(ctx).ok());
  for (size_t i = 0; i < 1500; ++i) {
    const float want = i < 10 ? 0.0f : i < 1000 ? src[i] : 0.0f;
    ASSERT_EQ(back[i], want) << i;
  }
  // int64 arrays and the 2D copy of a column block.
  DeviceArray<int64_t> ids(Device::kCuda, 0);
  ASSERT_TRUE(ids.Resize(2).ok());
  const std::vector<int64_t> host_ids = {int64_t{1} << 40, -3};
  ASSERT_TRUE(CopyToDevice(ids.data(), host_ids.data(), 2, ctx).ok());
  DeviceBuffer block(Device::kCuda, 0);
  ASSERT_TRUE(block.Resize(2 * 3).ok());
  // Rows 0..2 of b (stride 500), elements 1..2 of each.
  ASSERT_TRUE(CopyStridedOnDevice(block.data(), 2, b.data() + 1, 500, 2, 3, ctx).ok());
  std::vector<float> got(6);
  ASSERT_TRUE(CopyToHost(got.data(), block.data(), 6, ctx).ok());
  ASSERT_TRUE(Synchronize(ctx).ok());
  EXPECT_EQ(got, (std::vector<float>{src[1], src[2], src[501], src[502], 0.0f, 0.0f}));
  const absl::Status far = CheckDeviceUsable(Device::kCuda, 1023);
  EXPECT_TRUE(absl::IsFailedPrecondition(far)) << far;
  EXPECT_THAT(far.message(), HasSubstr("cuda:1023"));
}

}  // namespace
}  // namespace recps::kernels
