// End to end: one real recps-shard process and one real recps-worker process
// train the small example job (800 steps of 512 samples) on synthetic data;
// the model must learn.
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

// The "auc" values of the worker's result JSON, in order.
std::vector<double> Aucs(const std::string& json) {
  std::vector<double> out;
  for (size_t pos = json.find("\"auc\":"); pos != std::string::npos;
       pos = json.find("\"auc\":", pos + 1)) {
    out.push_back(std::stod(json.substr(pos + 6)));
  }
  return out;
}

// Trains the small example (800 steps) in `mode` with one shard server and
// one worker; returns the held-out AUCs.
std::vector<double> TrainSmall(const std::string& mode) {
  testing::TempDir dir;
  std::stringstream text;
  text << std::ifstream(std::string(RECPS_SOURCE_DIR) + "/examples/small.textproto").rdbuf();
  std::string job_text = text.str();
  const std::string sync = "consistency { mode: SYNC }";
  job_text.replace(job_text.find(sync), sync.size(),
                   "consistency { mode: " + mode + " staleness: 2 }");
  const std::string job = dir.WriteFile("job.textproto", job_text);
  auto shard = testing::LocalShard::Start(
      RECPS_SHARD_BINARY, {"--job=" + job, "--standalone", "--world_size=1"});
  EXPECT_TRUE(shard.ok()) << shard.status();
  if (!shard.ok()) return {};
  const std::string result = dir.path() + "/result.json";
  absl::StatusOr<int> code = testing::RunProcess(
      RECPS_WORKER_BINARY,
      {"--config=" + job, "--shards=" + (*shard)->address(), "--steps=800",
       "--result_json=" + result},
      absl::Minutes(5));
  EXPECT_TRUE(code.ok() && *code == 0) << code.status();
  std::stringstream json;
  json << std::ifstream(result).rdbuf();
  return Aucs(json.str());
}

TEST(WorkerEndToEnd, BoundedAndAsyncReachTheAucOfSync) {
  const std::vector<double> sync = TrainSmall("SYNC");
  ASSERT_FALSE(sync.empty());
  for (const char* mode : {"BOUNDED", "ASYNC"}) {
    const std::vector<double> aucs = TrainSmall(mode);
    ASSERT_FALSE(aucs.empty()) << mode;
    EXPECT_NEAR(aucs.back(), sync.back(), 0.01) << mode;
  }
}

TEST(WorkerEndToEnd, SmallExampleLearns) {
  const std::string job = std::string(RECPS_SOURCE_DIR) + "/examples/small.textproto";
  auto shard = testing::LocalShard::Start(
      RECPS_SHARD_BINARY, {"--job=" + job, "--standalone", "--world_size=1"});
  ASSERT_TRUE(shard.ok()) << shard.status();
  testing::TempDir dir;
  const std::string result = dir.path() + "/result.json";
  absl::StatusOr<int> code = testing::RunProcess(
      RECPS_WORKER_BINARY,
      {"--config=" + job, "--shards=" + (*shard)->address(), "--rank=0",
       "--world_size=1", "--steps=800", "--result_json=" + result},
      absl::Minutes(5));
  ASSERT_TRUE(code.ok()) << code.status();
  ASSERT_EQ(*code, 0);
  std::stringstream json;
  json << std::ifstream(result).rdbuf();
  const std::vector<double> aucs = Aucs(json.str());
  ASSERT_GE(aucs.size(), 2u) << json.str();
  EXPECT_GE(aucs.back(), 0.7) << json.str();
  EXPECT_GE(aucs.back(), aucs.front() + 0.1) << json.str();
}

}  // namespace
}  // namespace recps
