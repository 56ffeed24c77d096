#include "worker/data/prefetch.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/testing/local_shard.h"  // Eventually
#include "tests/worker/data_test_util.h"
#include "worker/data/synthetic.h"

namespace recps::worker {
namespace {

using ::recps::worker::data_testing::ExpectBatchEq;

SyntheticConfig Config() {
  SyntheticConfig config;
  config.seed = 21;
  config.num_dense = 3;
  config.features = {{100, 1.0, 0, 4}, {1 << 20, 1.05, 1, 1}};
  return config;
}

// Yields `batches` one-sample batches whose dense value is their index, then
// `end` (OK for the end of data); counts the batches it returned (in
// `returned`, when given) and notices its destruction.
class FakeSource : public BatchSource {
 public:
  FakeSource(int batches, absl::Status end, std::atomic<bool>* destroyed,
             std::chrono::milliseconds delay = std::chrono::milliseconds(0),
             std::atomic<int>* returned = nullptr)
      : batches_(batches), end_(end), destroyed_(destroyed), delay_(delay),
        returned_(returned) {}
  ~FakeSource() override { *destroyed_ = true; }

  absl::StatusOr<bool> Next(Batch* batch) override {
    std::this_thread::sleep_for(delay_);  // a slow source, not a wait
    if (next_ == batches_) {
      if (!end_.ok()) return end_;
      return false;
    }
    ResetBatch(1, 0, batch);
    batch->dense.push_back(static_cast<float>(next_++));
    batch->labels.push_back(0);
    batch->size = 1;
    if (returned_ != nullptr) ++*returned_;
    return true;
  }

 private:
  const int batches_;
  const absl::Status end_;
  std::atomic<bool>* destroyed_;
  const std::chrono::milliseconds delay_;
  std::atomic<int>* returned_;
  int next_ = 0;
};

TEST(PrefetchingSource, YieldsTheInnerSequence) {
  for (int depth : {1, 4}) {
    auto direct = MakeSyntheticSource(Config(), 1, 2, 32, 25);
    auto prefetched = MakePrefetchingSource(
        MakeSyntheticSource(Config(), 1, 2, 32, 25), depth);
    Batch want, got;
    int batches = 0;
    while (*direct->Next(&want)) {
      ASSERT_TRUE(*prefetched->Next(&got));
      ExpectBatchEq(got, want);
      ++batches;
    }
    EXPECT_EQ(batches, 25);
    EXPECT_FALSE(*prefetched->Next(&got));
    EXPECT_FALSE(*prefetched->Next(&got));
  }
}

TEST(PrefetchingSource, PropagatesAnErrorAfterTheBatchesBeforeIt) {
  std::atomic<bool> destroyed{false};
  auto source = MakePrefetchingSource(
      std::make_unique<FakeSource>(3, absl::DataLossError("disk"), &destroyed),
      2);
  Batch batch;
  for (int i = 0; i < 3; ++i) {
    const absl::StatusOr<bool> more = source->Next(&batch);
    ASSERT_TRUE(more.ok()) << more.status();
    ASSERT_TRUE(*more);
    EXPECT_EQ(batch.dense, std::vector<float>{static_cast<float>(i)});
  }
  for (int i = 0; i < 2; ++i) {
    const absl::StatusOr<bool> more = source->Next(&batch);
    EXPECT_EQ(more.status().code(), absl::StatusCode::kDataLoss);
  }
  source.reset();
  EXPECT_TRUE(destroyed);
}

TEST(PrefetchingSource, StopsCleanlyWhenDestroyedMidStream) {
  // A source without end and a full queue: the thread read the two batches
  // taken and three more, and waits for room; it reads no further.
  {
    std::atomic<bool> destroyed{false};
    std::atomic<int> returned{0};
    auto source = MakePrefetchingSource(
        std::make_unique<FakeSource>(1 << 30, absl::OkStatus(), &destroyed,
                                     std::chrono::milliseconds(0), &returned),
        3);
    Batch batch;
    ASSERT_TRUE(*source->Next(&batch));
    ASSERT_TRUE(*source->Next(&batch));
    ASSERT_TRUE(testing::Eventually([&] { return returned == 5; }));
    source.reset();
    EXPECT_TRUE(destroyed);
    EXPECT_EQ(returned, 5);
  }
  // Destroyed before any Next, and while the thread is inside a slow Next.
  for (int reads : {0, 1}) {
    std::atomic<bool> destroyed{false};
    auto source = MakePrefetchingSource(
        std::make_unique<FakeSource>(1000, absl::OkStatus(), &destroyed,
                                     std::chrono::milliseconds(5)),
        1);
    Batch batch;
    for (int i = 0; i < reads; ++i) ASSERT_TRUE(*source->Next(&batch));
    source.reset();
    EXPECT_TRUE(destroyed);
  }
}

TEST(PrefetchingSource, DeliversEverySampleOnceWithAShallowQueue) {
  auto source =
      MakePrefetchingSource(MakeSyntheticSource(Config(), 0, 1, 256, 40), 2);
  Batch batch;
  int64_t samples = 0;
  while (*source->Next(&batch)) samples += batch.size;
  EXPECT_EQ(samples, 40 * 256);
}

}  // namespace
}  // namespace recps::worker
