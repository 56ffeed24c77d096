// A cluster run through the coordinator, as real processes on 127.0.0.1:
// recps-coordinator + 2 recps-shard + 2 recps-worker --coordinator (sync).
// - kill -9 the coordinator mid-training and restart it on the same port and
//   state dir: the workers carry on and the job finishes with a sane loss;
// - kill -9 a worker: the coordinator marks its lease expired, and the
//   surviving worker fails (instead of hanging) naming rank 1;
// - `recps launch` starts two workers of a cluster and the job finishes;
// - `recps launch --max_restarts=1`: a worker killed after a checkpoint
//   makes the launcher restart the node's workers, which resume from the
//   newest checkpoint (the coordinator restores the servers' rows) and
//   finish the job.
#include <signal.h>

#include <filesystem>
#include <regex>

#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/coordinator_client.h"
#include "client/launcher/process.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/files.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

using ::testing::HasSubstr;
using testing::LocalShard;
using testing::TempDir;

std::string Job() { return std::string(RECPS_SOURCE_DIR) + "/examples/small.textproto"; }

using ::recps::testing::Eventually;

// A coordinator for the small example with a short lease, on `port` (0:
// any) with its state in `state`.
absl::StatusOr<std::unique_ptr<LocalShard>> StartCoordinator(const std::string& state,
                                                             int num_shards, int port = 0) {
  std::vector<std::string> args = {"--state_dir=" + state, "--job=" + Job(),
                                   absl::StrCat("--num_shards=", num_shards),
                                   "--lease=2s", "--tick=20ms"};
  if (port != 0) args.push_back(absl::StrCat("--listen=127.0.0.1:", port));
  return LocalShard::Start(RECPS_COORDINATOR_BINARY, args);
}

// Shard servers that register with the coordinator and get its map.
std::vector<std::unique_ptr<LocalShard>> StartShards(const std::string& coordinator,
                                                     int count, int world_size,
                                                     std::vector<std::string> extra = {}) {
  std::vector<std::unique_ptr<LocalShard>> shards;
  for (int i = 0; i < count; ++i) {
    std::vector<std::string> args = {"--job=" + Job(),
                                     absl::StrCat("--world_size=", world_size),
                                     "--threads=1", "--coordinator=" + coordinator};
    args.insert(args.end(), extra.begin(), extra.end());
    auto shard = LocalShard::Start(RECPS_SHARD_BINARY, args);
    EXPECT_TRUE(shard.ok()) << shard.status();
    if (shard.ok()) shards.push_back(*std::move(shard));
  }
  return shards;
}

absl::StatusOr<client::ChildProcess> StartWorker(const TempDir& dir,
                                                 const std::string& coordinator, int rank,
                                                 int world_size, int64_t steps) {
  return client::ChildProcess::Spawn(
      RECPS_WORKER_BINARY,
      {"--coordinator=" + coordinator, absl::StrCat("--rank=", rank),
       absl::StrCat("--world_size=", world_size), absl::StrCat("--steps=", steps),
       "--threads=1", "--collective_timeout=20s", "--progress_every=1s", "--insecure",
       absl::StrCat("--result_json=", dir.path(), "/result", rank, ".json")},
      absl::StrCat(dir.path(), "/worker", rank, ".log"));
}

// The member list, or an empty one when the coordinator does not answer.
v1::ListMembersResponse Members(client::CoordinatorClient& c) {
  absl::StatusOr<v1::ListMembersResponse> m = c.ListMembers();
  return m.ok() ? *m : v1::ListMembersResponse();
}

const v1::Member* FindWorker(const v1::ListMembersResponse& members, int rank) {
  for (const v1::Member& m : members.members()) {
    if (m.role() == v1::WORKER && m.rank() == rank) return &m;
  }
  return nullptr;
}

// The "last_loss" of a worker's --result_json, or NaN.
double LastLoss(const std::string& json) {
  const size_t at = json.find("\"last_loss\":");
  if (at == std::string::npos) return NAN;
  return std::atof(json.c_str() + at + 12);
}

TEST(Cluster, TrainingSurvivesACoordinatorRestart) {
  TempDir dir;
  const std::string state = dir.path() + "/coordinator";
  auto coordinator = StartCoordinator(state, 2);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string address = (*coordinator)->address();
  const int port = std::atoi(address.substr(address.rfind(':') + 1).c_str());
  auto shards = StartShards(address, 2, 2);
  ASSERT_EQ(shards.size(), 2u);

  constexpr int64_t kSteps = 1500;
  std::vector<client::ChildProcess> workers;
  for (int r = 0; r < 2; ++r) {
    auto w = StartWorker(dir, address, r, 2, kSteps);
    ASSERT_TRUE(w.ok()) << w.status();
    workers.push_back(*std::move(w));
  }
  client::CoordinatorClientOptions quick;
  quick.retry_for = absl::Seconds(1);
  client::CoordinatorClient admin(address, quick);
  ASSERT_TRUE(Eventually([&] {
    const v1::ListMembersResponse m = Members(admin);
    return FindWorker(m, 0) != nullptr && FindWorker(m, 1) != nullptr;
  })) << "the workers did not register";
  // Wait until training runs (rank 0 prints progress), then crash the
  // coordinator in the middle of it.
  ASSERT_TRUE(Eventually([&] {
    return ::recps::testing::ReadAll(dir.path() + "/worker0.log").find("step ") != std::string::npos;
  }, absl::Seconds(60))) << ::recps::testing::ReadAll(dir.path() + "/worker0.log");
  (*coordinator)->Kill();
  for (client::ChildProcess& w : workers) {
    ASSERT_FALSE(w.Poll().ok()) << "a worker finished before the coordinator was "
                                   "killed; the test needs more steps";
  }
  absl::SleepFor(absl::Seconds(1));
  coordinator = StartCoordinator(state, 2, port);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  ASSERT_EQ((*coordinator)->address(), address);

  // The restarted coordinator kept the map and its epoch, and hears from
  // both workers again while they train.
  const int64_t restarted_ms = absl::ToUnixMillis(absl::Now()) + 200;
  v1::ListMembersResponse after;
  EXPECT_TRUE(Eventually([&] {
    after = Members(admin);
    const v1::Member* w0 = FindWorker(after, 0);
    const v1::Member* w1 = FindWorker(after, 1);
    return w0 != nullptr && w1 != nullptr && w0->last_heartbeat_unix_ms() > restarted_ms &&
           w1->last_heartbeat_unix_ms() > restarted_ms;
  })) << after.DebugString();
  EXPECT_EQ(after.shard_map_epoch(), 1u);

  for (int r = 0; r < 2; ++r) {
    absl::StatusOr<int> code = workers[r].Wait(absl::Minutes(4));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0) << ::recps::testing::ReadAll(absl::StrCat(dir.path(), "/worker", r, ".log"));
    const std::string result = ::recps::testing::ReadAll(absl::StrCat(dir.path(), "/result", r, ".json"));
    EXPECT_THAT(result, HasSubstr(absl::StrCat("\"steps\":", kSteps)));
    const double loss = LastLoss(result);
    // Better than chance (log 2 = 0.69) on the small example's labels.
    EXPECT_TRUE(std::isfinite(loss) && loss > 0 && loss < 0.69) << result;
  }
  // Finished workers said goodbye: LEFT, not EXPIRED (which means failed).
  const v1::ListMembersResponse done = Members(admin);
  for (int r = 0; r < 2; ++r) {
    const v1::Member* w = FindWorker(done, r);
    ASSERT_NE(w, nullptr) << done.DebugString();
    EXPECT_EQ(w->state(), v1::LEFT) << done.DebugString();
  }
}

TEST(Cluster, AKilledWorkerIsReportedAndItsPeerFailsNamingIt) {
  TempDir dir;
  auto coordinator = StartCoordinator(dir.path() + "/coordinator", 1);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string address = (*coordinator)->address();
  auto shards = StartShards(address, 1, 2, {"--step_timeout=5s"});
  ASSERT_EQ(shards.size(), 1u);
  std::vector<client::ChildProcess> workers;
  for (int r = 0; r < 2; ++r) {
    auto w = StartWorker(dir, address, r, 2, 100000);
    ASSERT_TRUE(w.ok()) << w.status();
    workers.push_back(*std::move(w));
  }
  ASSERT_TRUE(Eventually([&] {
    return ::recps::testing::ReadAll(dir.path() + "/worker0.log").find("step ") != std::string::npos;
  }, absl::Seconds(60))) << ::recps::testing::ReadAll(dir.path() + "/worker0.log");

  kill(workers[1].pid(), SIGKILL);
  (void)workers[1].Wait(absl::Seconds(10));
  absl::StatusOr<int> code = workers[0].Wait(absl::Seconds(90));
  ASSERT_TRUE(code.ok()) << "the surviving worker hung after its peer died";
  EXPECT_EQ(*code, 1);
  const std::string log = ::recps::testing::ReadAll(dir.path() + "/worker0.log");
  EXPECT_THAT(log, HasSubstr("training failed"));
  EXPECT_THAT(log, HasSubstr("silent at the coordinator since the failure: rank 1 (")) << log;

  // The coordinator expired the dead worker's lease (and kept the other).
  client::CoordinatorClient admin(address);
  v1::ListMembersResponse members;
  EXPECT_TRUE(Eventually([&] {
    members = Members(admin);
    const v1::Member* dead = FindWorker(members, 1);
    return dead != nullptr && dead->state() == v1::EXPIRED;
  })) << members.DebugString();
  EXPECT_GE(members.lease_expirations(), 1);
}

TEST(Cluster, LaunchStartsTwoWorkersOfACluster) {
  TempDir dir;
  auto coordinator = StartCoordinator(dir.path() + "/coordinator", 1);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string address = (*coordinator)->address();
  auto shards = StartShards(address, 1, 2);
  ASSERT_EQ(shards.size(), 1u);
  absl::StatusOr<int> code = testing::RunProcess(
      RECPS_LAUNCHER_BINARY,
      {"launch", "--nproc-per-node=2", "--nnodes=1", "--coordinator=" + address,
       "--gpus=none", "--log_dir=" + dir.path() + "/logs", "--insecure", "--", "--steps=40",
       "--threads=1", "--result_json=" + dir.path() + "/result.json"},
      absl::Minutes(4));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << ::recps::testing::ReadAll(dir.path() + "/logs/worker0.log")
                      << ::recps::testing::ReadAll(dir.path() + "/logs/worker1.log");
  EXPECT_THAT(::recps::testing::ReadAll(dir.path() + "/logs/worker1.log"), HasSubstr("rank 1 of 2"));
  EXPECT_THAT(::recps::testing::ReadAll(dir.path() + "/result.json"), HasSubstr("\"steps\":40"));
}

TEST(Cluster, LaunchFailsNamingTheRankThatFailed) {
  TempDir dir;
  const std::string out = dir.path() + "/launch.log";
  // The workers register, then fail on the job file that does not exist.
  auto coordinator = StartCoordinator(dir.path() + "/coordinator", 1);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string address = (*coordinator)->address();
  absl::StatusOr<client::ChildProcess> launch = client::ChildProcess::Spawn(
      RECPS_LAUNCHER_BINARY,
      {"launch", "--nproc_per_node=2", "--coordinator=" + address, "--gpus=none", "--insecure",
       "--",
       "--config=" + dir.path() + "/missing.textproto"},
      out);
  ASSERT_TRUE(launch.ok()) << launch.status();
  absl::StatusOr<int> code = launch->Wait(absl::Minutes(3));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_NE(*code, 0);
  EXPECT_THAT(::recps::testing::ReadAll(out), ::testing::ContainsRegex("rank [01] \\(local rank [01]\\) failed"));
}

// One `recps launch --max_restarts=1` of the small example (checkpoints
// every 20 steps) against its own coordinator and shard server; with
// `kill_rank1`, rank 1 is killed once the step-40 checkpoint is complete.
// Returns rank 0's and rank 1's result JSON, concatenated (empty on
// failure, with the test failed).
std::string LaunchWithRestarts(const TempDir& dir, bool kill_rank1) {
  std::string job = ::recps::testing::ReadAll(Job());
  const size_t training = job.find("\ntraining {");
  EXPECT_NE(training, std::string::npos);
  if (training == std::string::npos) return "";
  const std::string checkpoints = dir.path() + "/checkpoints";
  job.insert(training + 11, "\n  checkpoint { dir: \"" + checkpoints + "\" every_steps: 20 }");
  const std::string job_file = dir.WriteFile("job.textproto", job);
  auto coordinator = LocalShard::Start(
      RECPS_COORDINATOR_BINARY, {"--state_dir=" + dir.path() + "/coordinator", "--job=" + job_file,
                                 "--num_shards=1", "--world_size=2", "--lease=2s", "--tick=20ms"});
  EXPECT_TRUE(coordinator.ok()) << coordinator.status();
  if (!coordinator.ok()) return "";
  const std::string address = (*coordinator)->address();
  auto shard = LocalShard::Start(RECPS_SHARD_BINARY, {"--job=" + job_file, "--world_size=2",
                                                      "--threads=1", "--coordinator=" + address});
  EXPECT_TRUE(shard.ok()) << shard.status();
  if (!shard.ok()) return "";
  const std::string log = dir.path() + "/launch.log";
  // {rank}: each rank its own file (they evaluate their own data).
  const std::string result = dir.path() + "/result{rank}.json";
  const std::string result0 = dir.path() + "/result0.json";
  absl::StatusOr<client::ChildProcess> launch = client::ChildProcess::Spawn(
      RECPS_LAUNCHER_BINARY,
      {"launch", "--nproc-per-node=2", "--nnodes=1", "--coordinator=" + address, "--gpus=none",
       "--max_restarts=1", "--log_dir=" + dir.path() + "/logs", "--insecure", "--", "--steps=400",
       "--threads=1", "--result_json=" + result},
      log);
  EXPECT_TRUE(launch.ok()) << launch.status();
  if (!launch.ok()) return "";
  if (kill_rank1) {
    // Once the step-40 checkpoint is complete: kill rank 1 (its pid from
    // the launcher's log).
    const std::string step40 = checkpoints + "/step-000000000040/MANIFEST";
    EXPECT_TRUE(Eventually([&] { return std::filesystem::exists(step40); }, absl::Minutes(3)))
        << ::recps::testing::ReadAll(log);
    std::smatch m;
    const std::string text = ::recps::testing::ReadAll(log);
    EXPECT_TRUE(
        std::regex_search(text, m, std::regex(R"(rank 1 \(local rank 1, [^)]*\): pid (\d+))")))
        << text;
    EXPECT_FALSE(std::filesystem::exists(result0)) << "the job ended before the kill";
    if (m.empty() || std::filesystem::exists(result0)) return "";
    EXPECT_EQ(kill(std::stoi(m[1].str()), SIGKILL), 0);
  }
  absl::StatusOr<int> code = launch->Wait(absl::Minutes(4));
  EXPECT_TRUE(code.ok()) << code.status();
  const std::string after = ::recps::testing::ReadAll(log);
  const std::string worker0 = ::recps::testing::ReadAll(dir.path() + "/logs/worker0.log");
  EXPECT_EQ(code.value_or(-1), 0) << after << worker0;
  if (kill_rank1) {
    EXPECT_THAT(after, HasSubstr("restart 1/1 after"));
    EXPECT_THAT(worker0, HasSubstr("resuming at step"));
  }
  EXPECT_TRUE(std::filesystem::exists(checkpoints + "/step-000000000400/MANIFEST"));
  return ::recps::testing::ReadAll(result0) + ::recps::testing::ReadAll(dir.path() + "/result1.json");
}

// The last evaluation of each result JSON in `results` ("evals":[...,{...}]).
std::string LastEvals(const std::string& results) {
  std::string last_evals;
  for (size_t evals = results.find("\"evals\":["); evals != std::string::npos;
       evals = results.find("\"evals\":[", evals + 1)) {
    const size_t end = results.find("]", evals);
    const size_t last = results.rfind("{\"step\"", end);
    if (end == std::string::npos || last == std::string::npos || last < evals) return "";
    absl::StrAppend(&last_evals, results.substr(last, end - last), "\n");
  }
  return last_evals;
}

// The servers hold rows of steps past the checkpoint when the workers
// restart: the coordinator rolls them back in place, and the restarted run
// ends exactly where an uninterrupted one does (sync mode is
// deterministic).
TEST(Cluster, LaunchMaxRestartsResumesTheNodeFromTheNewestCheckpoint) {
  TempDir reference_dir, restarted_dir;
  const std::string reference = LaunchWithRestarts(reference_dir, false);
  const std::string restarted = LaunchWithRestarts(restarted_dir, true);
  ASSERT_FALSE(HasFailure());
  EXPECT_THAT(restarted, HasSubstr("\"steps\":400"));
  ASSERT_THAT(LastEvals(reference), ::testing::ContainsRegex("step.:400.*\n.*step.:400"))
      << reference;
  EXPECT_EQ(LastEvals(restarted), LastEvals(reference));
}

}  // namespace
}  // namespace recps
