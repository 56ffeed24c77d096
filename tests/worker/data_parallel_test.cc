// Data-parallel equivalence with real processes: shard servers, and workers
// that allreduce their dense gradients with Gloo (meeting in a shared
// directory). Sync mode makes W workers with batch B train like one worker
// with batch W x B, and the shard count must not change a single bit.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "client/embedding_client.h"
#include "common/rpc/channels.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/testing/files.h"
#include "tests/testing/local_shard.h"

extern char** environ;

namespace recps {
namespace {

constexpr int kSteps = 40;
constexpr uint32_t kSlots = 256;

std::vector<double> Losses(const std::string& json) {
  std::vector<double> out;
  size_t pos = json.find("\"losses\":[");
  if (pos == std::string::npos) return out;
  std::stringstream s(json.substr(pos + 10));
  double v;
  char sep;
  while (s >> v) {
    out.push_back(v);
    if (!(s >> sep) || sep != ',') break;
  }
  return out;
}

struct RunResult {
  std::vector<std::vector<double>> losses;  // per worker
  std::string dense;                        // rank 0's parameters, raw bytes
  std::vector<float> rows;                  // rows of ids 0..99 of every table
};

// Trains the small example for kSteps steps with `workers` workers of
// `batch` samples each over `shards` shard servers; `worker_flags` go to
// every worker.
RunResult Train(int workers, int shards, int batch,
                const std::vector<std::string>& worker_flags = {}) {
  testing::TempDir dir;
  std::string job = ::recps::testing::ReadAll(std::string(RECPS_SOURCE_DIR) + "/examples/small.textproto");
  job = absl::StrReplaceAll(job, {{"batch_size: 512", absl::StrCat("batch_size: ", batch)}});
  const std::string job_path = dir.WriteFile("job.textproto", job);
  RunResult result;
  auto cluster = testing::StartShardCluster(
      RECPS_SHARD_BINARY, {"--job=" + job_path, absl::StrCat("--world_size=", workers)},
      shards, kSlots);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (!cluster.ok()) return result;
  std::string addresses;
  for (const auto& s : *cluster) absl::StrAppend(&addresses, addresses.empty() ? "" : ",", s->address());

  std::vector<std::thread> threads;
  std::vector<absl::StatusOr<int>> codes(workers, absl::UnknownError("not run"));
  for (int r = 0; r < workers; ++r) {
    threads.emplace_back([&, r] {
      std::vector<std::string> args = {
          "--config=" + job_path, "--shards=" + addresses, absl::StrCat("--rank=", r),
          absl::StrCat("--world_size=", workers), absl::StrCat("--steps=", kSteps),
          "--threads=1", "--rendezvous_dir=" + dir.path() + "/rendezvous",
          absl::StrCat("--result_json=", dir.path(), "/result", r, ".json"),
          absl::StrCat("--dense_out=", dir.path(), "/dense", r, ".bin")};
      args.insert(args.end(), worker_flags.begin(), worker_flags.end());
      codes[r] = testing::RunProcess(RECPS_WORKER_BINARY, args, absl::Minutes(3));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < workers; ++r) {
    EXPECT_TRUE(codes[r].ok() && *codes[r] == 0) << "worker " << r << ": " << codes[r].status();
    result.losses.push_back(Losses(::recps::testing::ReadAll(absl::StrCat(dir.path(), "/result", r, ".json"))));
  }
  result.dense = ::recps::testing::ReadAll(dir.path() + "/dense0.bin");

  // The rows of the hottest ids (Zipf ranks are ids) after the last step.
  std::vector<client::TableSchema> tables;
  for (int t = 0; t < 8; ++t) tables.push_back({absl::StrCat("t", t), 16});
  client::EmbeddingClientOptions options;
  auto reader = client::EmbeddingClient::Create(
      tables, client::MakeServerShardMapSource({(*cluster)[0]->address()}), options);
  EXPECT_TRUE(reader.ok()) << reader.status();
  std::vector<int64_t> ids(100);
  for (int i = 0; i < 100; ++i) ids[i] = i;
  result.rows.resize(8 * 100 * 16);
  std::vector<client::LookupSpec> specs;
  for (int t = 0; t < 8; ++t) specs.push_back({t, ids, result.rows.data() + t * 100 * 16});
  const absl::Status s = (*reader)->Lookup(kSteps, specs);
  EXPECT_TRUE(s.ok()) << s;
  return result;
}

TEST(DataParallel, TwoWorkersTwoShardsMatchOneWorkerWithTheGlobalBatch) {
  const RunResult one = Train(1, 1, 256);
  const RunResult two = Train(2, 2, 128);
  ASSERT_EQ(one.losses.size(), 1u);
  ASSERT_EQ(two.losses.size(), 2u);
  ASSERT_EQ(one.losses[0].size(), static_cast<size_t>(kSteps));
  for (int step = 0; step < kSteps; ++step) {
    // The global loss is the mean of the workers' losses (equal batches).
    const double global = (two.losses[0][step] + two.losses[1][step]) / 2;
    EXPECT_NEAR(global, one.losses[0][step], 1e-4 * std::abs(one.losses[0][step]))
        << "step " << step;
  }
  ASSERT_EQ(one.rows.size(), two.rows.size());
  for (size_t i = 0; i < one.rows.size(); ++i) {
    ASSERT_NEAR(one.rows[i], two.rows[i], 1e-5) << "row value " << i;
  }
}

TEST(DataParallel, OneAndThreeShardsGiveBitIdenticalRowsAndDenseParameters) {
  const RunResult one = Train(2, 1, 128);
  const RunResult three = Train(2, 3, 128);
  ASSERT_FALSE(one.dense.empty());
  EXPECT_EQ(one.dense, three.dense);
  ASSERT_EQ(one.rows.size(), three.rows.size());
  EXPECT_EQ(0, std::memcmp(one.rows.data(), three.rows.data(), one.rows.size() * 4));
  EXPECT_EQ(one.losses, three.losses);
}

// Sync mode's overlap: step t+1's rows are read during step t and only the
// rows step t updated (by either worker) are read again after it. The
// result must be exactly that of looking everything up after the push:
// losses, dense parameters and rows bit for bit, two workers sharing hot
// ids over two shard servers.
TEST(DataParallel, SyncPrefetchIsBitIdenticalToLookingUpAfterThePush) {
  const RunResult plain = Train(2, 2, 128, {"--sync_prefetch=false"});
  const RunResult overlapped = Train(2, 2, 128, {"--sync_prefetch=true"});
  ASSERT_EQ(plain.losses.size(), 2u);
  ASSERT_EQ(plain.losses[0].size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(plain.losses, overlapped.losses);
  ASSERT_FALSE(plain.dense.empty());
  EXPECT_EQ(plain.dense, overlapped.dense);
  ASSERT_EQ(plain.rows.size(), overlapped.rows.size());
  EXPECT_EQ(0, std::memcmp(plain.rows.data(), overlapped.rows.data(),
                           plain.rows.size() * 4));
}

// The mechanism under it, through a real recps-shard: after step 0 pushed
// ids 1 and 2, an updated_only lookup of step 1 rewrites exactly those rows
// in the caller's buffer and leaves id 3's row as the caller had it.
TEST(DataParallel, LookupUpdatedRewritesOnlyTheRowsTheLastStepUpdated) {
  testing::TempDir dir;
  const std::string job_path = dir.WriteFile(
      "job.textproto",
      ::recps::testing::ReadAll(std::string(RECPS_SOURCE_DIR) + "/examples/small.textproto"));
  auto cluster = testing::StartShardCluster(
      RECPS_SHARD_BINARY, {"--job=" + job_path, "--world_size=1"}, 1, kSlots);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<client::TableSchema> tables;
  for (int t = 0; t < 8; ++t) tables.push_back({absl::StrCat("t", t), 16});
  auto client = client::EmbeddingClient::Create(
      tables, client::MakeServerShardMapSource({(*cluster)[0]->address()}), {});
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<int64_t> ids = {1, 2, 3};
  std::vector<float> before(3 * 16);
  ASSERT_TRUE((*client)->Lookup(0, {{0, ids, before.data()}}).ok());
  const std::vector<int64_t> pushed = {1, 2};
  const std::vector<float> grads(2 * 16, 0.5f);
  std::vector<client::PushSpec> push = {{0, pushed, grads.data()}};
  for (int t = 1; t < 8; ++t) push.push_back({t, {}, nullptr});
  ASSERT_TRUE((*client)->PushGradients(0, push).ok());

  std::vector<float> corrected(3 * 16, 777.0f);
  const absl::Status s = (*client)->LookupUpdated(1, {{0, ids, corrected.data()}});
  ASSERT_TRUE(s.ok()) << s;
  std::vector<float> after(3 * 16);
  ASSERT_TRUE((*client)->Lookup(1, {{0, ids, after.data()}}).ok());
  for (int k = 0; k < 2 * 16; ++k) {
    EXPECT_EQ(corrected[k], after[k]) << k;
    EXPECT_NE(after[k], before[k]) << k;  // the push changed rows 1 and 2
  }
  for (int k = 2 * 16; k < 3 * 16; ++k) EXPECT_EQ(corrected[k], 777.0f) << k;
}

// A worker that dies mid-training makes its peer fail with a clear error
// (the allreduce loses its peer, or the sync step times out naming the
// missing rank) instead of hanging.
TEST(DataParallel, KilledWorkerMakesThePeerFailInsteadOfHanging) {
  testing::TempDir dir;
  const std::string job = std::string(RECPS_SOURCE_DIR) + "/examples/small.textproto";
  auto cluster = testing::StartShardCluster(
      RECPS_SHARD_BINARY, {"--job=" + job, "--world_size=2", "--step_timeout=5s"}, 1,
      kSlots);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string shards = (*cluster)[0]->address();
  auto start = [&](int rank) {
    std::vector<std::string> args = {
        RECPS_WORKER_BINARY, "--config=" + job, "--shards=" + shards,
        absl::StrCat("--rank=", rank), "--world_size=2", "--steps=100000", "--threads=1",
        "--collective_timeout=10s", "--rendezvous_dir=" + dir.path() + "/rendezvous",
        "--insecure"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    posix_spawn(&pid, args[0].c_str(), nullptr, nullptr, argv.data(), environ);
    return pid;
  };
  const pid_t survivor = start(0);
  const pid_t victim = start(1);
  // Kill the victim only once both ranks train: in sync mode the shard
  // applies gradient rows only after every rank pushed its step.
  auto admin = v1::ShardAdmin::NewStub(
      rpc::MakeChannel(shards, rpc::ChannelKind::kControl));
  auto rows_updated = [&] {
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(5), &context);
    v1::StatsRequest request;
    v1::StatsResponse stats;
    if (!admin->Stats(&context, request, &stats).ok()) return false;
    int64_t updated = 0;
    for (const v1::TableStats& t : stats.tables()) updated += t.update_ids();
    return updated > 0;
  };
  ASSERT_TRUE(testing::Eventually(rows_updated, absl::Seconds(60)))
      << "the two workers never completed a step together";
  kill(victim, SIGKILL);
  waitpid(victim, nullptr, 0);
  int status = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (waitpid(survivor, &status, WNOHANG) != survivor) {
    if (absl::Now() > deadline) {
      kill(survivor, SIGKILL);
      waitpid(survivor, nullptr, 0);
      FAIL() << "the surviving worker hung after its peer died";
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
}

}  // namespace
}  // namespace recps
