// The rates a worker reports (worker/result_json.h): the timed one leaves
// the warm-up steps and the evaluations out, the job's is the workers'
// sum, and the whole-run one keeps everything; the JSON carries each.
#include "worker/result_json.h"

#include <string>

#include "absl/strings/str_format.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recps::worker {
namespace {

using ::testing::HasSubstr;

TEST(TimedRate, LeavesTheWarmUpOutAndCountsEachStepsSamples) {
  TrainResult r;
  // 100 steps: the first 10 slow (warm-up), then 0.01 s each; the last
  // batch short.
  for (int i = 0; i < 100; ++i) {
    r.step_seconds.push_back(i < 10 ? 1.0 : 0.01);
    r.step_samples.push_back(i == 99 ? 256 : 512);
  }
  r.steps = 100;
  r.samples = 99 * 512 + 256;
  r.seconds = 10 + 0.9 + 5.0;  // the steps, and 5 s of evaluations
  const TimedRate t = TimedRateOf(r);
  EXPECT_EQ(t.warmup_steps, 10);
  EXPECT_EQ(t.steps, 90);
  EXPECT_EQ(t.samples, 89 * 512 + 256);
  EXPECT_NEAR(t.seconds, 0.9, 1e-9);
  EXPECT_NEAR(t.samples_per_second, (89 * 512 + 256) / 0.9, 1e-6);

  const std::string json = ResultJson(r, /*world_size=*/2);
  EXPECT_THAT(json, HasSubstr("\"warmup_steps\":10,\"timed_steps\":90,"));
  EXPECT_THAT(json, HasSubstr("\"world_size\":2,"));
  EXPECT_THAT(json, HasSubstr(absl::StrFormat("\"timed_samples_per_second\":%.1f,",
                                              t.samples_per_second)));
  EXPECT_THAT(json, HasSubstr(absl::StrFormat("\"job_timed_samples_per_second\":%.1f,",
                                              2 * t.samples_per_second)));
  // The whole run: warm-up and evaluations in.
  EXPECT_THAT(json, HasSubstr(absl::StrFormat("\"samples_per_second\":%.1f,",
                                              r.samples / r.seconds)));
}

TEST(TimedRate, ShortRunsTimeEveryStepAndNoStepsGiveZero) {
  TrainResult r;
  for (int i = 0; i < 5; ++i) {
    r.step_seconds.push_back(0.5);
    r.step_samples.push_back(100);
  }
  TimedRate t = TimedRateOf(r);
  EXPECT_EQ(t.warmup_steps, 0);
  EXPECT_EQ(t.steps, 5);
  EXPECT_NEAR(t.samples_per_second, 200.0, 1e-9);
  t = TimedRateOf(TrainResult());
  EXPECT_EQ(t.steps, 0);
  EXPECT_EQ(t.samples_per_second, 0);
}

// The most steps of pushes a training lookup missed (the e2e tests read
// it); -1 when the servers did not say.
TEST(ResultJson, CarriesTheMaxLookupStaleness) {
  TrainResult r;
  EXPECT_THAT(ResultJson(r), HasSubstr("\"max_lookup_staleness_steps\":-1}"));
  r.max_lookup_staleness = 2;
  EXPECT_THAT(ResultJson(r), HasSubstr("\"max_lookup_staleness_steps\":2}"));
}

}  // namespace
}  // namespace recps::worker
