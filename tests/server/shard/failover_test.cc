// Failover of a replicated shard server mid-step (docs/replication.md):
// real recps-shard processes on 127.0.0.1, sync mode, 2 workers, 3 servers,
// replication 2. Server 0 is killed with SIGKILL while the workers train,
// and the map that promotes its backups is installed on the others (what
// the coordinator does when the lost server's lease runs out; its own test
// is in tests/server/coordinator). The workers retry their calls on the
// promoted servers, and the run ends with every row bit-identical to a run
// without the failure: nothing lost, nothing applied twice, no step redone.
// In async mode, where runs are not bit-identical, the rows count the
// pushes applied instead.
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/embedding_client.h"
#include "common/wire/replica_placement.h"
#include "common/wire/shard_map.h"
#include "gtest/gtest.h"
#include "tests/server/shard/toy_job.h"
#include "tests/testing/shard_cluster.h"

namespace recps {
namespace {

using testing::kDim;
using testing::kSlots;
using testing::kTables;

constexpr int kWorld = 2;
constexpr int kSteps = 10;

class Cluster : public testing::ShardCluster {
 public:
  Cluster()
      : ShardCluster(RECPS_SHARD_BINARY, kTables,
                     {absl::StrCat("--world_size=", kWorld), "--consistency=sync", "--seed=7",
                      "--step_timeout=30s", "--threads=2"},
                     3, kSlots) {
    v1::ShardMap p = shard_map().ToProto();
    p.set_epoch(2);
    absl::StatusOr<ShardMap> m = ShardMap::FromProto(p);
    EXPECT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(AddBackups(2, {}, &*m).ok());
    SetMap(*m);
  }

  std::unique_ptr<client::EmbeddingClient> NewClient(int rank) {
    client::EmbeddingClientOptions options;
    options.worker_rank = rank;
    options.rpc_timeout = absl::Seconds(30);
    options.failover_wait = absl::Seconds(30);
    return ShardCluster::NewClient({{"user", kDim}, {"item", kDim}}, options);
  }

  // Server 0 is lost: killed, and its backups promoted on the others.
  void FailOverServer0() {
    shard(0).Kill();
    absl::StatusOr<ShardMap> promoted = PromoteBackups(shard_map(), 0);
    ASSERT_TRUE(promoted.ok()) << promoted.status();
    for (int s : {1, 2}) {
      const grpc::Status set = SetMapOn(s, promoted->ToProto());
      ASSERT_TRUE(set.ok()) << s << ": " << set.error_message();
    }
  }

  std::vector<float> ReadAll() {
    auto reader = NewClient(0);
    return testing::ReadAll(*reader, kWorld, kSteps);
  }
};

void Train(Cluster& cluster, const std::vector<testing::WorkerHooks>& hooks) {
  std::vector<std::unique_ptr<client::EmbeddingClient>> clients;
  for (int r = 0; r < kWorld; ++r) clients.push_back(cluster.NewClient(r));
  std::vector<std::thread> workers;
  for (int r = 0; r < kWorld; ++r) {
    workers.emplace_back([&, r] { testing::RunWorker(*clients[r], r, kSteps, hooks[r]); });
  }
  for (auto& w : workers) w.join();
}

std::vector<float> RowsWithoutFailure() {
  Cluster cluster;
  EXPECT_TRUE(cluster.ok());
  Train(cluster, {{}, {}});
  return cluster.ReadAll();
}

void ExpectSameBits(const std::vector<float>& want, const std::vector<float>& got) {
  ASSERT_EQ(want.size(), got.size());
  size_t differ = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    differ += std::memcmp(&want[i], &got[i], sizeof(float)) != 0;
  }
  EXPECT_EQ(differ, 0u) << "of " << want.size() << " values differ from the run without a "
                        << "failure";
}

// Where in the run server 0 dies.
enum class KillAt {
  // Rank 0 pushed step 4 (acknowledged: forwarded to the backups); rank 1
  // pushes step 4 only after the promotion, to the promoted servers, whose
  // clocks of server 0 hold rank 0's half of the step.
  kBetweenTwoRanksPushes,
  // Right after rank 0's push of step 4, with rank 1 running on.
  kAfterOneRanksPush,
  // At a moment of its own, from another thread: calls in flight.
  kAnyMoment,
};

class FailoverMidStep : public ::testing::TestWithParam<KillAt> {};

TEST_P(FailoverMidStep, TheRunEndsWithTheRowsOfARunWithoutIt) {
  const std::vector<float> want = RowsWithoutFailure();
  Cluster cluster;
  ASSERT_TRUE(cluster.ok());
  constexpr int kKillStep = 4;
  absl::Notification promoted;
  std::vector<testing::WorkerHooks> hooks(kWorld);
  std::thread killer;
  switch (GetParam()) {
    case KillAt::kBetweenTwoRanksPushes:
      hooks[0].after_push = [&](int step) {
        if (step != kKillStep) return;
        cluster.FailOverServer0();
        promoted.Notify();
      };
      hooks[1].before_push = [&](int step) {
        if (step == kKillStep) promoted.WaitForNotification();
      };
      break;
    case KillAt::kAfterOneRanksPush:
      hooks[0].after_push = [&](int step) {
        if (step == kKillStep) cluster.FailOverServer0();
      };
      break;
    case KillAt::kAnyMoment:
      hooks[0].after_push = [&](int step) {
        if (step != kKillStep - 2) return;
        killer = std::thread([&] {
          absl::SleepFor(absl::Milliseconds(15));
          cluster.FailOverServer0();
        });
      };
      break;
  }
  Train(cluster, hooks);
  if (killer.joinable()) killer.join();
  EXPECT_EQ(cluster.EpochOn(1), 3u);
  const std::vector<float> got = cluster.ReadAll();
  ExpectSameBits(want, got);
}

INSTANTIATE_TEST_SUITE_P(Kills, FailoverMidStep,
                         ::testing::Values(KillAt::kBetweenTwoRanksPushes,
                                           KillAt::kAfterOneRanksPush, KillAt::kAnyMoment),
                         [](const ::testing::TestParamInfo<KillAt>& info) {
                           switch (info.param) {
                             case KillAt::kBetweenTwoRanksPushes:
                               return "BetweenTwoRanksPushes";
                             case KillAt::kAfterOneRanksPush:
                               return "AfterOneRanksPush";
                             case KillAt::kAnyMoment:
                               return "AnyMoment";
                           }
                           return "";
                         });

// Async mode under steady pushes, two kills: every worker pushes a
// gradient of 1 for its items at each step (SGD: each applied push moves a
// row by exactly -learning_rate, whatever the order), so the final rows
// count the pushes applied. Each must be applied exactly once: the pushes
// acknowledged are the gradient rows on the surviving replicas, none lost
// at the kill, none applied twice by the retries that follow it.
TEST(FailoverAsync, EveryAcknowledgedPushIsAppliedOnceAcrossKills) {
  constexpr int kServers = 4, kAsyncSteps = 12;
  testing::ShardCluster cluster(RECPS_SHARD_BINARY, kTables,
                                {absl::StrCat("--world_size=", kWorld), "--consistency=async",
                                 "--seed=7", "--threads=2"},
                                kServers, kSlots);
  ASSERT_TRUE(cluster.ok());
  {
    v1::ShardMap p = cluster.shard_map().ToProto();
    p.set_epoch(2);
    absl::StatusOr<ShardMap> m = ShardMap::FromProto(p);
    ASSERT_TRUE(m.ok());
    ASSERT_TRUE(AddBackups(2, {}, &*m).ok());  // server i's rows on server i + 1
    cluster.SetMap(*m);
  }
  const auto new_client = [&](int rank) {
    client::EmbeddingClientOptions options;
    options.worker_rank = rank;
    options.rpc_timeout = absl::Seconds(30);
    return cluster.ShardCluster::NewClient({{"user", kDim}, {"item", kDim}}, options);
  };
  std::vector<int64_t> all(1000);
  for (int64_t i = 0; i < 1000; ++i) all[i] = i;
  std::vector<float> initial(all.size() * kDim);
  ASSERT_TRUE(new_client(0)->Lookup(0, {{1, all, initial.data()}}).ok());
  // Server 0 and then server 2 are lost, each its backup promoted.
  ShardMap map = cluster.shard_map();
  const auto fail_over = [&](int lost) {
    cluster.shard(lost).Kill();
    absl::StatusOr<ShardMap> promoted = PromoteBackups(map, lost);
    ASSERT_TRUE(promoted.ok()) << promoted.status();
    map = *promoted;
    for (int s = 0; s < kServers; ++s) {
      if (s == 0 || s == lost) continue;
      const grpc::Status set = cluster.SetMapOn(s, map.ToProto());
      ASSERT_TRUE(set.ok()) << s << ": " << set.error_message();
    }
  };
  std::vector<std::thread> workers;
  for (int r = 0; r < kWorld; ++r) {
    workers.emplace_back([&, r] {
      auto client = new_client(r);
      for (int step = 0; step < kAsyncSteps; ++step) {
        const std::vector<int64_t> items = testing::Unique(testing::ItemIds(step, r));
        const std::vector<float> ones(items.size() * kDim, 1.0f);
        const absl::Status pushed = client->PushGradients(step, {{1, items, ones.data()}});
        ASSERT_TRUE(pushed.ok()) << pushed;
        if (r == 0 && step == 3) fail_over(0);
        if (r == 0 && step == 7) fail_over(2);
      }
    });
  }
  for (auto& w : workers) w.join();
  std::vector<float> want = initial;
  for (int step = 0; step < kAsyncSteps; ++step) {
    for (int r = 0; r < kWorld; ++r) {
      for (int64_t id : testing::Unique(testing::ItemIds(step, r))) {
        for (int c = 0; c < kDim; ++c) want[id * kDim + c] -= 0.05f;  // "item": SGD 0.05
      }
    }
  }
  std::vector<float> got(all.size() * kDim);
  ASSERT_TRUE(new_client(0)->Lookup(kAsyncSteps, {{1, all, got.data()}}).ok());
  ExpectSameBits(want, got);
}

}  // namespace
}  // namespace recps
