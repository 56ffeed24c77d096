// 16-bit row storage end to end (issue 21, mixed precision), through
// `recps local` and the real binaries: the shared small job with every table
// `precision: FP16` (or BF16) trains; its final checkpoint holds fp32 rows
// whose weights are exactly 16-bit values; SIGTERM (pre-emption) and
// `recps local --resume` finish the job bit-identically to an uninterrupted
// run, so a checkpoint of a 16-bit table restores exactly.
#include <signal.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "client/launcher/process.h"
#include "common/half.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/local_run.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

using ::recps::testing::Eventually;
using ::recps::testing::LocalRun;
using ::recps::testing::ReadAll;
using ::testing::HasSubstr;

constexpr int kSteps = 200;
constexpr int kEvery = 20;
constexpr int kDim = 16;  // the shared job's tables

// The shared small job with every table stored in `precision`.
void SetPrecision(const LocalRun& run, const std::string& precision) {
  std::string job = ReadAll(run.job);
  const int n = absl::StrReplaceAll(
      {{"dim: 16", absl::StrCat("dim: 16 precision: ", precision)}}, &job);
  ASSERT_GT(n, 0) << job;
  std::ofstream out(run.job, std::ios::trunc);
  out << job;
  out.close();
  ASSERT_TRUE(out.good()) << run.job;
}

class Fp16RowsE2e : public ::testing::TestWithParam<const char*> {};

TEST_P(Fp16RowsE2e, TrainsAndACheckpointRestoresBitIdentically) {
  const std::string precision = GetParam();
  testing::SmallJob spec;
  spec.name = "fp16_rows";
  spec.steps = kSteps;
  spec.checkpoint_every = kEvery;

  LocalRun reference(spec);
  SetPrecision(reference, precision);
  {
    absl::StatusOr<client::ChildProcess> p = reference.Start(1, {});
    ASSERT_TRUE(p.ok()) << p.status();
    absl::StatusOr<int> code = p->Wait(absl::Seconds(180));
    ASSERT_TRUE(code.ok() && *code == 0) << ReadAll(reference.log);
  }
  const testing::RunOutcome want = testing::CollectOutcome(reference);
  ASSERT_FALSE(want.rows.empty());
  // Rows leave the store as fp32 fused rows; the weights are 16-bit values.
  for (const auto& [key, row] : want.rows) {
    ASSERT_GE(row.size(), kDim * sizeof(float));
    for (int j = 0; j < kDim; ++j) {
      float w;
      std::memcpy(&w, row.data() + j * sizeof(float), sizeof(w));
      const float rounded = precision.rfind("FP16", 0) == 0
                                ? HalfToFloat(FloatToHalf(w))
                                                : Bf16ToFloat(FloatToBf16(w));
      ASSERT_EQ(w, rounded) << "column " << j;
    }
  }

  LocalRun run(spec);
  SetPrecision(run, precision);
  {
    absl::StatusOr<client::ChildProcess> p = run.Start(1, {});
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_TRUE(Eventually([&] { return run.LossLines() >= kEvery + kEvery / 2; },
                           absl::Seconds(120)))
        << ReadAll(run.log);
    ASSERT_LT(run.LossLines(), kSteps) << "the run ended before the signal";
    p->Signal(SIGTERM);
    absl::StatusOr<int> code = p->Wait(absl::Seconds(120));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 128 + SIGTERM);
  }
  EXPECT_THAT(ReadAll(run.log), HasSubstr("pre-empted: checkpoint at step"));
  // Resumed onto two shard servers: the rows move through the checkpoint.
  absl::StatusOr<client::ChildProcess> p = run.Start(2, {"--resume"});
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<int> code = p->Wait(absl::Seconds(180));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << ReadAll(run.log);
  EXPECT_THAT(ReadAll(run.log), HasSubstr("--resume: resuming from the checkpoint at step"));
  testing::ExpectSameOutcome(want, testing::CollectOutcome(run), kSteps);
}

// The last: stochastic rounding, whose random bits are hashed from the
// values, so a resumed run still ends bit-identical.
INSTANTIATE_TEST_SUITE_P(Precisions, Fp16RowsE2e,
                         ::testing::Values("FP16", "BF16",
                                           "FP16 stochastic_rounding: true"));

}  // namespace
}  // namespace recps
