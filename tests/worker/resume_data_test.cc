// Resuming a data stream at batch N (BatchSource::Skip): the synthetic
// source jumps, the default reads and drops, and the prefetch wrapper keeps
// yielding exactly the inner stream after a skip.
#include <memory>

#include "gtest/gtest.h"
#include "tests/worker/data_test_util.h"
#include "worker/data/prefetch.h"
#include "worker/data/synthetic.h"

namespace recps::worker {
namespace {

using ::recps::worker::data_testing::ExpectBatchEq;

SyntheticConfig Config() {
  SyntheticConfig config;
  config.seed = 5;
  config.num_dense = 3;
  config.features = {{100, 1.0, 0, 4}, {1 << 20, 1.05, 1, 1}};
  return config;
}

// Reads and drops through Next only (the default Skip).
class NextOnly : public BatchSource {
 public:
  explicit NextOnly(std::unique_ptr<BatchSource> inner) : inner_(std::move(inner)) {}
  absl::StatusOr<bool> Next(Batch* batch) override { return inner_->Next(batch); }

 private:
  std::unique_ptr<BatchSource> inner_;
};

// After Skip(n), the stream continues with what batch n of a fresh stream is.
void ExpectResumesAt(BatchSource& skipped, int64_t n, int rank, int world) {
  auto fresh = MakeSyntheticSource(Config(), rank, world, 16, 20);
  Batch expected, got;
  for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(*fresh->Next(&expected));
  for (int64_t i = n; i < 20; ++i) {
    ASSERT_TRUE(*fresh->Next(&expected));
    ASSERT_TRUE(*skipped.Next(&got)) << "batch " << i;
    ExpectBatchEq(expected, got);
  }
  EXPECT_FALSE(*skipped.Next(&got));
}

TEST(ResumeData, SyntheticSkipJumpsToBatchN) {
  for (int64_t n : {0, 1, 7, 19}) {
    auto source = MakeSyntheticSource(Config(), 1, 3, 16, 20);
    absl::StatusOr<int64_t> skipped = source->Skip(n);
    ASSERT_TRUE(skipped.ok());
    EXPECT_EQ(*skipped, n);
    ExpectResumesAt(*source, n, 1, 3);
  }
}

TEST(ResumeData, SkipPastTheEndStopsAtTheEnd) {
  auto source = MakeSyntheticSource(Config(), 0, 1, 16, 20);
  EXPECT_EQ(*source->Skip(25), 20);
  Batch b;
  EXPECT_FALSE(*source->Next(&b));
  NextOnly slow(MakeSyntheticSource(Config(), 0, 1, 16, 20));
  EXPECT_EQ(*slow.Skip(25), 20);
}

TEST(ResumeData, DefaultSkipReadsAndDrops) {
  NextOnly source(MakeSyntheticSource(Config(), 0, 2, 16, 20));
  ASSERT_EQ(*source.Skip(6), 6);
  ExpectResumesAt(source, 6, 0, 2);
}

TEST(ResumeData, PrefetchAfterASkipYieldsTheRest) {
  // As the worker does it: skip on the reader, then wrap it.
  auto inner = MakeSyntheticSource(Config(), 1, 2, 16, 20);
  ASSERT_EQ(*inner->Skip(9), 9);
  auto prefetched = MakePrefetchingSource(std::move(inner), 3);
  ExpectResumesAt(*prefetched, 9, 1, 2);
  // And skipping through the wrapper itself (reads and drops).
  auto wrapped = MakePrefetchingSource(MakeSyntheticSource(Config(), 1, 2, 16, 20), 2);
  ASSERT_EQ(*wrapped->Skip(4), 4);
  ExpectResumesAt(*wrapped, 4, 1, 2);
}

}  // namespace
}  // namespace recps::worker
