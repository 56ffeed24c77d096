// Re-replication by the coordinator with fake shard servers: after a
// failover the units that lost a backup are copied to live servers as
// add_backup moves; units promoted at the failover, dead servers and
// refused exports are left alone; failed copies are tried again.
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/wire/replica_placement.h"
#include "common/wire/shard_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_store.h"
#include "server/coordinator/move_orchestrator.h"
#include "tests/server/coordinator/fake_move_shards.h"
#include "tests/testing/local_shard.h"

namespace recps::server {
namespace {

using ::testing::HasSubstr;

constexpr char kA[] = "10.0.1.1:1";
constexpr char kB[] = "10.0.1.2:1";
constexpr char kC[] = "10.0.1.3:1";
constexpr char kD[] = "10.0.1.4:1";
constexpr char kE[] = "10.0.1.5:1";  // listed in a map, never registered

class ReReplicationTest : public ::testing::Test {
 protected:
  // A coordinator building a map of 4 servers, 12 slots, 2 copies, once
  // they registered; `servers` register now (with `zones`, if given).
  // `start`: the orchestrator runs.
  std::unique_ptr<Coordinator> Open(const std::vector<std::string>& servers, bool start = true,
                                    const std::vector<std::string>& zones = {}) {
    auto store = CoordinatorStore::Open(dir_.path() + "/state");
    EXPECT_TRUE(store.ok()) << store.status();
    CoordinatorOptions options;
    options.num_shards = 4;
    options.num_slots = 12;
    options.replication = 2;
    options.sharding = Sharding::kEven;
    options.lease = absl::Seconds(10);
    // Real time (the orchestrator waits in it) plus what the test skips.
    options.clock = [this] {
      absl::MutexLock lock(&clock_mu_);
      return absl::Now() + skew_;
    };
    options.moves.rpc = shards_;
    options.moves.retry_interval = absl::Milliseconds(5);
    options.moves.max_parallel_copies = 2;
    auto c = Coordinator::Create(*std::move(store), options, nullptr);
    EXPECT_TRUE(c.ok()) << c.status();
    (*c)->SetMapPusher([this](const std::string& address, const v1::ShardMap& map) {
      absl::MutexLock lock(&shards_->mu);
      if (shards_->maps[address].epoch() < map.epoch()) shards_->maps[address] = map;
    });
    for (size_t i = 0; i < servers.size(); ++i) {
      v1::RegisterRequest r;
      r.set_role(v1::SHARD_SERVER);
      r.set_address(servers[i]);
      if (i < zones.size()) {
        r.mutable_capacity()->set_address(servers[i]);
        r.mutable_capacity()->set_memory_bytes(int64_t{1} << 30);
        r.mutable_capacity()->set_zone(zones[i]);
      }
      absl::StatusOr<v1::RegisterResponse> registered = (*c)->Register(r);
      EXPECT_TRUE(registered.ok()) << registered.status();
      if (registered.ok()) ids_[servers[i]] = registered->member_id();
    }
    if (start) {
      EXPECT_TRUE((*c)->moves().Start().ok());
    }
    return *std::move(c);
  }

  void Skip(absl::Duration d) {
    absl::MutexLock lock(&clock_mu_);
    skew_ += d;
  }

  // `lost` goes silent, the others heartbeat; its lease runs out and the
  // coordinator fails it over. The slots that changed owner (promoted).
  std::set<uint32_t> FailOver(Coordinator& c, const std::string& lost) {
    const ShardMap before = *ShardMap::FromProto(*c.GetShardMap());
    const auto heartbeat_others = [&] {
      for (const auto& [address, id] : ids_) {
        if (address == lost) continue;
        v1::HeartbeatRequest hb;
        hb.set_member_id(id);
        EXPECT_TRUE(c.Heartbeat(hb).ok()) << address;
      }
    };
    Skip(absl::Seconds(6));
    heartbeat_others();
    Skip(absl::Seconds(6));
    c.Tick();
    heartbeat_others();
    const ShardMap after = *ShardMap::FromProto(*c.GetShardMap());
    EXPECT_EQ(after.epoch(), before.epoch() + 1) << "no failover of " << lost;
    std::set<uint32_t> promoted;
    for (uint32_t s = 0; s < after.num_slots(); ++s) {
      if (before.servers()[before.OwnerOfSlot(s)] != after.servers()[after.OwnerOfSlot(s)]) {
        promoted.insert(s);
      }
    }
    EXPECT_FALSE(promoted.empty());
    return promoted;
  }

  // `address`'s heartbeat saying how many lost primaries' clocks step its
  // units under map `epoch` (what a shard server reports).
  void ReportLineage(Coordinator& c, const std::string& address, uint64_t epoch, int clocks) {
    v1::HeartbeatRequest hb;
    hb.set_member_id(ids_[address]);
    hb.set_shard_map_epoch(epoch);
    hb.set_lost_primary_clocks(clocks);
    EXPECT_TRUE(c.Heartbeat(hb).ok()) << address;
  }

  // The owners of `slots` in the current map.
  static std::set<std::string> OwnersOf(Coordinator& c, const std::set<uint32_t>& slots) {
    const ShardMap map = *ShardMap::FromProto(*c.GetShardMap());
    std::set<std::string> out;
    for (uint32_t s : slots) out.insert(map.servers()[map.OwnerOfSlot(s)]);
    return out;
  }

  // The slots of `map` without a full set of backups.
  static std::set<uint32_t> Unbacked(const v1::ShardMap& proto) {
    const ShardMap map = *ShardMap::FromProto(proto);
    std::set<uint32_t> out;
    for (uint32_t s = 0; s < map.num_slots(); ++s) {
      for (uint32_t b : map.BackupsOfSlot(s)) {
        if (b == kNoBackup) out.insert(s);
      }
    }
    return out;
  }

  // Waits until the map lacks backups for `want` only and nothing runs.
  static bool SettlesAt(Coordinator& c, const std::set<uint32_t>& want) {
    return testing::Eventually(
               [&] { return Unbacked(*c.GetShardMap()) == want && c.moves().InFlight() == 0; },
               absl::Seconds(10)) &&
           c.moves().WaitIdle(absl::Seconds(10));
  }

  testing::TempDir dir_;
  std::shared_ptr<FakeMoveShards> shards_ = std::make_shared<FakeMoveShards>();
  std::map<std::string, std::string> ids_;  // address -> member id
  absl::Mutex clock_mu_;
  absl::Duration skew_ ABSL_GUARDED_BY(clock_mu_);
};

TEST_F(ReReplicationTest, LostBackupsAreCopiedToLiveServersButPromotedUnitsWait) {
  auto c = Open({kA, kB, kC, kD});
  // kE is listed (owning nothing) but never registered: no lease.
  v1::ShardMap listed = *c->GetShardMap();
  listed.add_servers(kE);
  listed.set_epoch(listed.epoch() + 1);
  ASSERT_TRUE(c->SetShardMap(listed).ok());
  ASSERT_TRUE(c->moves().WaitIdle(absl::Seconds(10)));
  const std::set<uint32_t> promoted = FailOver(*c, kD);
  const v1::ShardMap failed_over = *c->GetShardMap();
  ASSERT_GT(Unbacked(failed_over).size(), promoted.size());  // kD backed some units too
  // Everything but the promoted units gets a new backup.
  ASSERT_TRUE(SettlesAt(*c, promoted));

  std::map<std::string, v1::MoveRecord> records;
  const v1::ListRebalanceMovesResponse list = c->moves().List();
  for (const v1::MoveRecord& r : list.moves()) records[r.move_id()] = r;
  ASSERT_FALSE(records.empty());
  for (const auto& [id, r] : records) {
    EXPECT_TRUE(r.add_backup()) << id;
    EXPECT_EQ(r.state(), v1::MoveRecord::DONE) << id << ": " << r.error();
    EXPECT_THAT(r.rebalance_id(), HasSubstr("re-replication-"));
  }
  absl::MutexLock lock(&shards_->mu);
  for (const auto& [address, grant] : shards_->grants) {
    EXPECT_TRUE(grant.for_backup());
    for (uint32_t s : grant.slots()) EXPECT_EQ(promoted.count(s), 0u) << "slot " << s;
  }
  ASSERT_FALSE(shards_->migrate_ins.empty());
  for (const auto& [address, m] : shards_->migrate_ins) {
    EXPECT_TRUE(m.as_backup());
    EXPECT_NE(address, kD);  // its lease ran out
    EXPECT_NE(address, kE);  // never registered
  }
  // Each hand-over's map is AddBackupToMap of the map before it.
  v1::ShardMap base = failed_over;
  ASSERT_EQ(shards_->handovers.size(), records.size());
  for (const auto& [address, h] : shards_->handovers) {
    EXPECT_TRUE(h.add_backup());
    const v1::MoveRecord& r = records[h.move_id()];
    EXPECT_EQ(address, r.source());
    EXPECT_EQ(h.target(), r.target());
    const ShardMap parsed = *ShardMap::FromProto(base);
    BackupCopy copy;
    copy.owner = parsed.IndexOf(r.source());
    copy.backup = parsed.IndexOf(r.target());
    copy.slots.assign(r.slots().begin(), r.slots().end());
    copy.tables.assign(r.tables().begin(), r.tables().end());
    absl::StatusOr<ShardMap> want = AddBackupToMap(parsed, copy, base.epoch() + 1);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(h.new_map().SerializeAsString(), want->ToProto().SerializeAsString());
    base = h.new_map();
  }
  EXPECT_EQ(c->GetShardMap()->SerializeAsString(), base.SerializeAsString());
}

// A promoted unit waits until its owner's heartbeat says, under the map
// that promoted it or a newer one, that it merged the lost primary's clock
// into its own: then it is copied like any other.
TEST_F(ReReplicationTest, PromotedUnitsAreCopiedOnceTheirOwnerSaysItsLineageIsMerged) {
  auto c = Open({kA, kB, kC, kD});
  const std::set<uint32_t> promoted = FailOver(*c, kD);
  const uint64_t promoted_at = c->GetShardMap()->epoch();
  ASSERT_TRUE(SettlesAt(*c, promoted));
  const std::set<std::string> owners = OwnersOf(*c, promoted);
  for (const std::string& owner : owners) {
    ReportLineage(*c, owner, promoted_at, 1);                 // not merged yet
    ReportLineage(*c, owner, promoted_at - 1, 0);             // an older map's word
  }
  absl::SleepFor(absl::Milliseconds(50));  // 10 retry intervals
  EXPECT_EQ(Unbacked(*c->GetShardMap()), promoted);
  EXPECT_EQ(c->PromotedUnits().size(), promoted.size());
  for (const std::string& owner : owners) ReportLineage(*c, owner, c->GetShardMap()->epoch(), 0);
  EXPECT_TRUE(c->PromotedUnits().empty());
  ASSERT_TRUE(SettlesAt(*c, {}));
}

TEST_F(ReReplicationTest, NewBackupsKeepToOtherZonesThanTheOwners) {
  auto c = Open({kA, kB, kC, kD}, true, {"z1", "z1", "z2", "z2"});
  const std::set<uint32_t> promoted = FailOver(*c, kD);
  ASSERT_TRUE(SettlesAt(*c, promoted));
  // What kD (z2) backed is owned in z1; kC is the only live server in z2.
  absl::MutexLock lock(&shards_->mu);
  ASSERT_FALSE(shards_->migrate_ins.empty());
  for (const auto& [address, m] : shards_->migrate_ins) EXPECT_EQ(address, kC);
}

TEST_F(ReReplicationTest, AnExportRefusedForABackupIsNotTriedAgain) {
  // The failover happens before this coordinator's orchestrator runs (as
  // with a restarted coordinator): it cannot know what was promoted.
  std::set<uint32_t> promoted;
  std::string owner;
  {
    auto c = Open({kA, kB, kC, kD}, /*start=*/false);
    promoted = FailOver(*c, kD);
    const ShardMap map = *ShardMap::FromProto(*c->GetShardMap());
    owner = map.servers()[map.OwnerOfSlot(*promoted.begin())];
  }
  {
    absl::MutexLock lock(&shards_->mu);
    shards_->promoted[owner] = promoted;
  }
  ids_.erase(kD);
  auto c = Open({kA, kB, kC});
  ASSERT_TRUE(SettlesAt(*c, promoted));
  const auto refused = [&] {
    absl::MutexLock lock(&shards_->mu);
    int n = 0;
    for (const auto& [address, grant] : shards_->grants) {
      for (uint32_t s : grant.slots()) n += promoted.count(s) > 0;
    }
    return n;
  };
  EXPECT_EQ(refused(), static_cast<int>(promoted.size()));  // one try
  absl::SleepFor(absl::Milliseconds(100));  // 20 retry intervals
  EXPECT_EQ(refused(), static_cast<int>(promoted.size()));
  // The refused copies failed (the promoted slots may go to several new
  // backups: one copy each); the others went through.
  std::set<uint32_t> failed;
  int done = 0;
  const v1::ListRebalanceMovesResponse list = c->moves().List();
  for (const v1::MoveRecord& r : list.moves()) {
    done += r.state() == v1::MoveRecord::DONE;
    if (r.state() != v1::MoveRecord::FAILED) continue;
    failed.insert(r.slots().begin(), r.slots().end());
    EXPECT_EQ(r.source(), owner);
    EXPECT_THAT(r.error(), HasSubstr("lost primary"));
  }
  EXPECT_EQ(failed, promoted);
  EXPECT_GE(done, 1);
  // The owner merges the lineage and says so: the units are copied now.
  {
    absl::MutexLock lock(&shards_->mu);
    shards_->promoted.clear();
  }
  ReportLineage(*c, owner, c->GetShardMap()->epoch(), 0);
  ASSERT_TRUE(SettlesAt(*c, {}));
}

TEST_F(ReReplicationTest, AFailedCopyIsTriedAgainOnALaterRound) {
  auto c = Open({kA, kB, kC, kD});
  {
    absl::MutexLock lock(&shards_->mu);
    shards_->fail_copy = {kA, kB, kC};
  }
  const std::set<uint32_t> promoted = FailOver(*c, kD);
  const auto failed = [&] {
    int n = 0;
    const v1::ListRebalanceMovesResponse list = c->moves().List();
    for (const v1::MoveRecord& r : list.moves()) {
      n += r.state() == v1::MoveRecord::FAILED;
    }
    return n;
  };
  ASSERT_TRUE(testing::Eventually([&] { return failed() >= 2; }, absl::Seconds(10)));
  {
    absl::MutexLock lock(&shards_->mu);
    shards_->fail_copy.clear();
    EXPECT_FALSE(shards_->aborts.empty());  // the targets dropped what they had
    EXPECT_TRUE(shards_->handovers.empty());
  }
  ASSERT_TRUE(SettlesAt(*c, promoted));
  const v1::ListRebalanceMovesResponse list = c->moves().List();
  EXPECT_EQ(list.moves(list.moves_size() - 1).state(), v1::MoveRecord::DONE);
  for (const v1::MoveRecord& r : list.moves()) {
    if (r.state() == v1::MoveRecord::FAILED) {
      EXPECT_THAT(r.error(), HasSubstr("disk full"));
    }
  }
}

// A new backup that died during its hand-over: the owner, which alone
// decides where it forwards, ended the hand-over without the new map, so
// the move is rolled back at once instead of waiting for the dead server
// (which would hold every later re-replication and rebalance back).
TEST_F(ReReplicationTest, AHandOverWhoseNewBackupDiedIsRolledBackOnTheOwnersWord) {
  {
    absl::MutexLock lock(&shards_->mu);
    shards_->handover_error = absl::UnavailableError("the new backup stopped answering");
    shards_->target_dies_at_handover = true;
  }
  auto c = Open({kA, kB, kC, kD});
  ASSERT_TRUE(c->moves().WaitIdle(absl::Seconds(10)));
  FailOver(*c, kD);
  ASSERT_TRUE(testing::Eventually(
      [&] {
        absl::MutexLock lock(&shards_->mu);
        return !shards_->handovers.empty();
      },
      absl::Seconds(10)));
  {
    absl::MutexLock lock(&shards_->mu);
    shards_->handover_error = absl::OkStatus();  // later rounds go through
  }
  ASSERT_TRUE(c->moves().WaitIdle(absl::Seconds(10)));
  const v1::ListRebalanceMovesResponse list = c->moves().List();
  ASSERT_FALSE(list.moves().empty());
  const v1::MoveRecord& first = list.moves(0);
  EXPECT_EQ(first.state(), v1::MoveRecord::ABORTED) << first.error();
  EXPECT_THAT(first.resolved(), HasSubstr("the owner ended its hand-over without the new map"));
}

}  // namespace
}  // namespace recps::server
