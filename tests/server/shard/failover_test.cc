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
#include <algorithm>
#include <cstring>
#include <atomic>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/embedding_client.h"
#include "common/wire/replica_placement.h"
#include "common/wire/shard_map.h"
#include "gmock/gmock.h"
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

  std::vector<float> ReadAll(int steps = kSteps) {
    auto reader = NewClient(0);
    return testing::ReadAll(*reader, kWorld, steps);
  }
};

void Train(Cluster& cluster, const std::vector<testing::WorkerHooks>& hooks,
           int steps = kSteps) {
  std::vector<std::unique_ptr<client::EmbeddingClient>> clients;
  for (int r = 0; r < kWorld; ++r) clients.push_back(cluster.NewClient(r));
  std::vector<std::thread> workers;
  for (int r = 0; r < kWorld; ++r) {
    workers.emplace_back([&, r] { testing::RunWorker(*clients[r], r, steps, hooks[r]); });
  }
  for (auto& w : workers) w.join();
}

std::vector<float> RowsWithoutFailure(int steps = kSteps) {
  Cluster cluster;
  EXPECT_TRUE(cluster.ok());
  Train(cluster, {{}, {}}, steps);
  return cluster.ReadAll(steps);
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

// ShardAdmin calls as the coordinator makes them (re-replication).
grpc::Status AllowExport(const std::string& source, const BackupCopy& copy,
                         const std::string& move_id) {
  v1::AllowExportRequest grant;
  grant.set_move_id(move_id);
  for (uint32_t s : copy.slots) grant.add_slots(s);
  for (const std::string& t : copy.tables) grant.add_tables(t);
  grant.set_ttl_ms(60000);
  grant.set_for_backup(true);
  v1::AllowExportResponse granted;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return testing::ShardAdminStub(source)->AllowExport(&ctx, grant, &granted);
}

// Re-replication of `copy` (MigrateIn as_backup on the new backup, HandOver
// add_backup on the owner) from `map`; the new map, or the failed call's
// status.
absl::StatusOr<ShardMap> AddBackup(const ShardMap& map,
                                   const BackupCopy& copy, const std::string& move_id) {
  const std::string& owner = map.servers()[copy.owner];
  const std::string& backup = map.servers()[copy.backup];
  const auto failed = [](const char* what, const grpc::Status& s) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat(what, ": ", s.error_message()));
  };
  if (grpc::Status s = AllowExport(owner, copy, move_id); !s.ok()) {
    return failed("AllowExport", s);
  }
  v1::MigrateInRequest in;
  in.set_move_id(move_id);
  in.set_source(owner);
  for (uint32_t s : copy.slots) in.add_slots(s);
  for (const std::string& t : copy.tables) in.add_tables(t);
  in.set_epoch(map.epoch());
  in.set_as_backup(true);
  {
    v1::MigrateInResponse copied;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    if (grpc::Status s = testing::ShardAdminStub(backup)->MigrateIn(&ctx, in, &copied); !s.ok()) {
      return failed("MigrateIn", s);
    }
  }
  absl::StatusOr<ShardMap> next = AddBackupToMap(map, copy, map.epoch() + 1);
  if (!next.ok()) return next.status();
  v1::HandOverRequest over;
  over.set_move_id(move_id);
  over.set_target(backup);
  *over.mutable_new_map() = next->ToProto();
  over.set_self(owner);
  over.set_add_backup(true);
  v1::HandOverResponse handed;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  if (grpc::Status s = testing::ShardAdminStub(owner)->HandOver(&ctx, over, &handed); !s.ok()) {
    return failed("HandOver", s);
  }
  return next;
}

// A worker that meets its owner's new process before the failover's map
// (the restarted server has no map yet, and refuses the old incarnation
// with DATA_LOSS) waits for that map under a replicated map, as for a
// server that does not answer: it is a failover on its way (the
// coordinator fails a restarted server over as soon as it registers), not
// the loss of the job. Before, the lookup failed at once and the worker
// failed every later call.
TEST(Failover, AWorkerThatMeetsARestartedOwnerBeforeTheFailoverWaitsForIt) {
  Cluster cluster;
  ASSERT_TRUE(cluster.ok());
  std::vector<std::unique_ptr<client::EmbeddingClient>> clients;
  for (int r = 0; r < kWorld; ++r) clients.push_back(cluster.NewClient(r));
  {
    std::vector<std::thread> workers;
    for (int r = 0; r < kWorld; ++r) {
      workers.emplace_back([&, r] { testing::RunWorker(*clients[r], r, 2); });
    }
    for (auto& w : workers) w.join();
  }
  cluster.shard(0).Kill();
  ASSERT_TRUE(cluster.Restart(0));  // no map yet
  constexpr absl::Duration kFailoverAfter = absl::Milliseconds(500);
  absl::Status looked;
  absl::Duration took;
  std::thread lookup([&] {
    std::vector<int64_t> users = testing::Unique(testing::UserIds(2, 0));
    std::vector<float> rows(users.size() * kDim);
    const absl::Time start = absl::Now();
    looked = clients[0]->Lookup(2, {{0, users, rows.data()}});
    took = absl::Now() - start;
  });
  absl::SleepFor(kFailoverAfter);
  absl::StatusOr<ShardMap> promoted = PromoteBackups(cluster.shard_map(), 0);
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  for (int s : {1, 2, 0}) ASSERT_TRUE(cluster.SetMapOn(s, promoted->ToProto()).ok()) << s;
  lookup.join();
  EXPECT_TRUE(looked.ok()) << looked;
  EXPECT_GE(took, kFailoverAfter) << "it waited for the map";
}

// A lost backup replaced (re-replication) carries a second failure: server
// 1 dies (its units promoted to server 2; server 0's lose their backup)
// and is restarted at its address with no rows, as Kubernetes does. The
// units server 2 took over step on server 1's clock there, and cannot get
// a backup, until both workers pushed to server 2 after the failover: then
// that lineage is merged into server 2's own clock. Every unit without a
// backup is copied between two steps (to the restarted server 1 and to
// server 0), then server 2, owner of its own units and of server 1's old
// ones, dies too, and servers 0 and 1 take them over from those copies
// (the workers, who knew the lost process at server 1's address, take the
// new one for what it is). The run ends with the rows of a run without
// any failure.
TEST(ReReplication, ARestartedServerRejoinsAsABackupAndCarriesASecondFailover) {
  const std::vector<float> want = RowsWithoutFailure();
  Cluster cluster;
  ASSERT_TRUE(cluster.ok());
  ShardMap map = cluster.shard_map();
  absl::Mutex mu;
  int at_barrier = 0;
  std::vector<testing::WorkerHooks> hooks(kWorld);
  absl::Notification copied, lost, restarted;
  // Step 2: server 1 is lost (and restarted by the test's thread: a child
  // process dies with the thread that started it). Step 4, both ranks
  // pushed it: re-replication. Step 6, between the ranks' pushes: server 2
  // is lost.
  hooks[0].after_push = [&](int step) {
    if (step == 2) {
      absl::Cleanup notify = [&] { lost.Notify(); };
      cluster.shard(1).Kill();
      absl::StatusOr<ShardMap> promoted = PromoteBackups(map, 1);
      ASSERT_TRUE(promoted.ok()) << promoted.status();
      map = *promoted;
      for (int s : {0, 2}) ASSERT_TRUE(cluster.SetMapOn(s, map.ToProto()).ok()) << s;
      // Server 1's old units, now on server 2, step on server 1's clock
      // there (no push since the failover merged it yet): a new backup
      // could not follow them, and server 2 says so.
      BackupCopy promoted_units;
      promoted_units.owner = 2;
      promoted_units.backup = 0;
      for (uint32_t slot = 0; slot < testing::kSlots; ++slot) {
        if (cluster.shard_map().OwnerOfSlot(slot) == 1) promoted_units.slots.push_back(slot);
      }
      const grpc::Status refused = AllowExport(map.servers()[2], promoted_units, "m0");
      EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
      EXPECT_THAT(refused.error_message(), ::testing::HasSubstr("lost primary"));
    }
    if (step == 4) {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(+[](int* n) { return *n == 1; }, &at_barrier));
    }
    if (step == 4) {
      // Both workers pushed steps 3 and 4 to server 2: server 1's clock is
      // merged into its own, and every unit without a backup can get one.
      const std::vector<BackupCopy> plan =
          PlanReReplication(map, {true, false, true}, {}, nullptr);
      ASSERT_EQ(plan.size(), 2u);
      // Server 1 back at its address, owning and backing nothing: the
      // least loaded server, it takes some of the copies.
      ASSERT_TRUE(restarted.WaitForNotificationWithTimeout(absl::Seconds(60)));
      const std::vector<BackupCopy> rejoined =
          PlanReReplication(map, {true, true, true}, {}, nullptr);
      ASSERT_FALSE(rejoined.empty());
      EXPECT_TRUE(std::any_of(rejoined.begin(), rejoined.end(),
                              [](const BackupCopy& c) { return c.backup == 1; }));
      for (const BackupCopy& c : rejoined) {
        absl::StatusOr<ShardMap> next =
            AddBackup(map, c, absl::StrCat("m-", c.owner, "-", c.backup));
        ASSERT_TRUE(next.ok()) << next.status();
        map = *next;
        // As the coordinator does after each: the others get the map too.
        for (int s : {0, 1, 2}) {
          if (cluster.EpochOn(s) < map.epoch()) {
            ASSERT_TRUE(cluster.SetMapOn(s, map.ToProto()).ok()) << s;
          }
        }
      }
      EXPECT_EQ(map.UnderReplicatedUnits(), 0);
      // Once more: the backup has the copy now, and refuses a second one.
      absl::StatusOr<ShardMap> again = AddBackup(map, rejoined[0], "m2");
      EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(again.status().message(), ::testing::HasSubstr("has a copy on this server"));
      for (int s : {0, 1, 2}) EXPECT_EQ(cluster.EpochOn(s), map.epoch()) << s;
      copied.Notify();
    }
    if (step == 6) {
      cluster.shard(2).Kill();
      absl::StatusOr<ShardMap> promoted = PromoteBackups(map, 2);
      ASSERT_TRUE(promoted.ok()) << promoted.status() << " (the re-replicated copies)";
      map = *promoted;
      for (int s : {0, 1}) ASSERT_TRUE(cluster.SetMapOn(s, map.ToProto()).ok()) << s;
    }
  };
  hooks[1].after_push = [&](int step) {
    if (step != 4) return;
    {
      absl::MutexLock lock(&mu);
      ++at_barrier;
    }
    ASSERT_TRUE(copied.WaitForNotificationWithTimeout(absl::Seconds(120)));
  };
  std::thread trainer([&] { Train(cluster, hooks); });
  if (lost.WaitForNotificationWithTimeout(absl::Seconds(60))) {
    EXPECT_TRUE(cluster.Restart(1));
    EXPECT_TRUE(cluster.SetMapOn(1, map.ToProto()).ok());  // map: rank 0 waits for this
  }
  restarted.Notify();
  trainer.join();
  ASSERT_TRUE(copied.HasBeenNotified());
  const std::vector<float> got = cluster.ReadAll();
  ExpectSameBits(want, got);
}

// The same under load: the copy and its hand-over run from a thread of
// their own while both workers train (the owner holds every push of the
// steps after its L, which the workers send again by the new map), and
// server 0 is killed at a moment of its own once the copy is done.
TEST(ReReplication, ACopyMadeWhileTheWorkersTrainCarriesASecondFailover) {
  const std::vector<float> want = RowsWithoutFailure();
  Cluster cluster;
  ASSERT_TRUE(cluster.ok());
  ShardMap map = cluster.shard_map();
  absl::Mutex mu;  // map, across the threads
  std::vector<testing::WorkerHooks> hooks(kWorld);
  std::thread copier, killer;
  hooks[0].before_push = [&](int step) {
    if (step >= 3) absl::SleepFor(absl::Milliseconds(15));  // a run long enough
  };
  hooks[0].after_push = [&](int step) {
    if (step != 1) return;
    absl::MutexLock lock(&mu);
    cluster.shard(1).Kill();
    absl::StatusOr<ShardMap> promoted = PromoteBackups(map, 1);
    ASSERT_TRUE(promoted.ok()) << promoted.status();
    map = *promoted;
    for (int s : {0, 2}) ASSERT_TRUE(cluster.SetMapOn(s, map.ToProto()).ok()) << s;
    copier = std::thread([&, lost = map] {
      const std::vector<BackupCopy> plan = PlanReReplication(
          lost, {true, false, true}, {}, [&](int, const std::string&, uint32_t slot) {
            return cluster.shard_map().OwnerOfSlot(slot) == 1;
          });
      ASSERT_EQ(plan.size(), 1u);
      absl::StatusOr<ShardMap> next = AddBackup(lost, plan[0], "m1");
      ASSERT_TRUE(next.ok()) << next.status();
      {
        absl::MutexLock lock(&mu);
        map = *next;
      }
      killer = std::thread([&] {
        absl::SleepFor(absl::Milliseconds(20));
        absl::MutexLock lock(&mu);
        cluster.shard(0).Kill();
        absl::StatusOr<ShardMap> promoted = PromoteBackups(map, 0);
        ASSERT_TRUE(promoted.ok()) << promoted.status() << " (the re-replicated copy)";
        map = *promoted;
        ASSERT_TRUE(cluster.SetMapOn(2, map.ToProto()).ok());
      });
    });
  };
  Train(cluster, hooks);
  if (copier.joinable()) copier.join();
  if (killer.joinable()) killer.join();
  EXPECT_EQ(cluster.EpochOn(2), 5u) << "two failovers and a re-replication";
  ExpectSameBits(want, cluster.ReadAll());
}

// The coordinator's re-replication, done by the test: every unit without
// a backup is copied to a live server. A unit taken over at a failover is
// refused until its owner merged the lost primary's clock into its own
// (the workers pushed to both since), and is tried again. False after
// `wait`.
bool ReReplicateAll(Cluster& cluster, ShardMap& map, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  static int moves = 0;
  while (map.UnderReplicatedUnits() > 0) {
    if (absl::Now() > deadline) return false;
    bool refused = false;
    const std::vector<bool> alive(map.num_servers(), true);
    for (const BackupCopy& c : PlanReReplication(map, alive, {}, nullptr)) {
      absl::StatusOr<ShardMap> next = AddBackup(map, c, absl::StrCat("chaos-", ++moves));
      if (!next.ok()) {
        EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition) << next.status();
        if (!absl::IsFailedPrecondition(next.status())) return false;
        refused = true;
        continue;
      }
      map = *next;
      for (int s = 0; s < map.num_servers(); ++s) {
        if (cluster.EpochOn(s) < map.epoch() && !cluster.SetMapOn(s, map.ToProto()).ok()) {
          return false;
        }
      }
    }
    if (refused) absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// Chaos: 30 kills of random shard servers at random moments of a sync
// run, each restarted at its address (as Kubernetes does) and failed over,
// and every unit re-replicated before the next kill (so that no kill
// finds a unit without a copy: a second loss before that is the
// checkpoint restart). The run ends with the rows of a run without them.
// It found five bugs (docs/replication.md, "What the chaos test found").
// Not in CI yet: under load (two at once, or beside a build) its harness
// has yet to prove itself (one run in 26 failed to give a just-restarted
// server its map). Run it with --gtest_also_run_disabled_tests
// --gtest_filter='Chaos.*'.
TEST(Chaos, DISABLED_ThirtyKillsAndRestartsEndWithTheRowsOfARunWithoutThem) {
  constexpr int kKills = 30;
  constexpr int kLongRun = 2000;  // steps; the kills pace the first ones
  const std::vector<float> want = RowsWithoutFailure(kLongRun);
  Cluster cluster;
  ASSERT_TRUE(cluster.ok());
  ShardMap map = cluster.shard_map();
  std::atomic<bool> chaos_done{false}, trained{false};
  std::vector<testing::WorkerHooks> hooks(kWorld);
  for (testing::WorkerHooks& h : hooks) {
    h.before_push = [&](int) {
      if (!chaos_done.load()) absl::SleepFor(absl::Milliseconds(1));
    };
  }
  std::thread trainer([&] {
    Train(cluster, hooks, kLongRun);
    trained = true;
  });
  std::mt19937 rng(20261208);
  int kills = 0;
  for (; kills < kKills && !trained.load(); ++kills) {
    absl::SleepFor(absl::Milliseconds(rng() % 20));
    const int victim = static_cast<int>(rng() % map.num_servers());
    cluster.shard(victim).Kill();
    absl::StatusOr<ShardMap> promoted = PromoteBackups(map, victim);
    ASSERT_TRUE(promoted.ok()) << promoted.status() << " (kill " << kills << ")";
    map = *promoted;
    for (int s = 0; s < map.num_servers(); ++s) {
      if (s != victim) {
        ASSERT_TRUE(cluster.SetMapOn(s, map.ToProto()).ok()) << s;
      }
    }
    ASSERT_TRUE(cluster.Restart(victim)) << "kill " << kills;
    const grpc::Status set = cluster.SetMapOn(victim, map.ToProto());
    ASSERT_TRUE(set.ok()) << "kill " << kills << ": " << set.error_message();
    ASSERT_TRUE(ReReplicateAll(cluster, map, absl::Seconds(60))) << "kill " << kills;
  }
  chaos_done = true;
  trainer.join();
  EXPECT_EQ(kills, kKills) << "the run ended first";
  ExpectSameBits(want, cluster.ReadAll(kLongRun));
}

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
