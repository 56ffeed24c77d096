// Replicas in the shard map: backups per unit, their checks, the placement
// rule, and the proto round trip (common/wire/replica_placement.h).
#include "common/wire/replica_placement.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/hashing.h"
#include "common/wire/shard_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recps {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(PlaceBackups, NextServersInRingOrder) {
  auto placed = PlaceBackups(2, 3, {});
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_THAT(*placed, ElementsAre(ElementsAre(1u), ElementsAre(2u), ElementsAre(0u)));
  placed = PlaceBackups(3, 4, {});
  ASSERT_TRUE(placed.ok());
  std::multiset<uint32_t> chosen;
  for (int owner = 0; owner < 4; ++owner) {
    const std::vector<uint32_t>& b = (*placed)[owner];
    ASSERT_EQ(b.size(), 2u);
    EXPECT_NE(b[0], b[1]);
    EXPECT_NE(b[0], static_cast<uint32_t>(owner));
    EXPECT_NE(b[1], static_cast<uint32_t>(owner));
    chosen.insert(b.begin(), b.end());
  }
  for (uint32_t s = 0; s < 4; ++s) EXPECT_EQ(chosen.count(s), 2u) << s;
  placed = PlaceBackups(1, 4, {});
  ASSERT_TRUE(placed.ok());
  for (const auto& b : *placed) EXPECT_TRUE(b.empty());
}

TEST(PlaceBackups, KeepsReplicasOfAUnitInDifferentZones) {
  // Servers 0, 1 in zone a; 2, 3 in zone b: a unit of server 0 is backed
  // up on 2 (the next server of another zone), never on 1.
  const std::vector<std::string> zones = {"a", "a", "b", "b"};
  auto placed = PlaceBackups(2, 4, zones);
  ASSERT_TRUE(placed.ok()) << placed.status();
  for (int owner = 0; owner < 4; ++owner) {
    ASSERT_EQ((*placed)[owner].size(), 1u);
    EXPECT_NE(zones[(*placed)[owner][0]], zones[owner]) << "owner " << owner;
  }
  // Every server backs up the same amount: each is chosen once.
  std::multiset<uint32_t> chosen;
  for (const auto& b : *placed) chosen.insert(b.begin(), b.end());
  for (uint32_t s = 0; s < 4; ++s) EXPECT_EQ(chosen.count(s), 1u) << s;
}

TEST(PlaceBackups, RefusesMoreReplicasThanServersOrZones) {
  auto placed = PlaceBackups(3, 2, {});
  ASSERT_FALSE(placed.ok());
  EXPECT_EQ(placed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(placed.status().message(), HasSubstr("needs at least 3 shard servers"));
  placed = PlaceBackups(2, 3, std::vector<std::string>{"a", "a", "a"});
  ASSERT_FALSE(placed.ok());
  EXPECT_THAT(placed.status().message(), HasSubstr("needs 2 zones"));
  EXPECT_FALSE(PlaceBackups(0, 3, {}).ok());
  EXPECT_FALSE(PlaceBackups(2, 3, std::vector<std::string>{"a", "b"}).ok());
}

TEST(ShardMapReplicas, EveryUnitGetsItsOwnersBackupsAndRoundTrips) {
  ShardMap m = ShardMap::Uniform(3, 12, {"a:1", "b:2", "c:3"});
  v1::ShardMap p = m.ToProto();
  v1::TableRouting* wise = p.add_tables();  // table-wise on server 2
  wise->set_table("wise");
  wise->set_owner(2);
  v1::TableRouting* own = p.add_tables();  // its own slot owners, all on 1
  own->set_table("own");
  for (int s = 0; s < 12; ++s) own->add_slot_owner(1);
  v1::TableRouting* split = p.add_tables();  // two column groups
  split->set_table("split");
  v1::ColumnGroupRouting* g0 = split->add_column_groups();
  g0->set_column_begin(0);
  g0->set_column_end(8);
  g0->set_owner(0);
  v1::ColumnGroupRouting* g1 = split->add_column_groups();
  g1->set_column_begin(8);
  g1->set_column_end(16);
  g1->set_owner(2);
  auto planned = ShardMap::FromProto(p);
  ASSERT_TRUE(planned.ok()) << planned.status();
  ASSERT_TRUE(AddBackups(2, {}, &*planned).ok());
  EXPECT_EQ(planned->replication(), 2);
  for (uint32_t slot = 0; slot < 12; ++slot) {
    EXPECT_THAT(planned->BackupsOfSlot(slot),
                ElementsAre(static_cast<uint32_t>((planned->OwnerOfSlot(slot) + 1) % 3)));
  }
  EXPECT_THAT(planned->RouteOf(StableNameKey("wise")).BackupsOf(5), ElementsAre(0u));
  EXPECT_THAT(planned->RouteOf(StableNameKey("own")).BackupsOf(5), ElementsAre(2u));
  EXPECT_THAT(planned->RouteOf(StableNameKey(ColumnGroupTableName("split", 8, 16)))
                  .BackupsOf(5),
              ElementsAre(0u));
  EXPECT_TRUE(planned->RouteOf(StableNameKey("split")).BackupsOf(5).empty());
  const uint64_t plain = StableNameKey("plain");
  const TableRoute route = planned->RouteOf(plain);
  for (int64_t id = 0; id < 100; ++id) {
    EXPECT_THAT(route.BackupsOf(id),
                ElementsAre(static_cast<uint32_t>((route.OwnerOf(id) + 1) % 3)));
  }
  for (int s = 0; s < 3; ++s) EXPECT_TRUE(planned->BacksAnything(s));
  // Whom each primary forwards its pushes to.
  EXPECT_THAT(planned->BackupServersOf(0), ElementsAre(1u));
  EXPECT_THAT(planned->BackupServersOf(1), ElementsAre(2u));
  EXPECT_THAT(planned->BackupServersOf(2), ElementsAre(0u));

  // The proto carries it all, and a reader gets the same map back.
  const v1::ShardMap again = planned->ToProto();
  EXPECT_EQ(again.replication(), 2u);
  EXPECT_EQ(again.slot_backups_size(), 12);
  auto read = ShardMap::FromProto(again);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->ToProto().SerializeAsString(), again.SerializeAsString());

  // Without replication, nothing changes and nothing is backed up.
  ShardMap one = ShardMap::Uniform(1, 12, {"a:1", "b:2"});
  EXPECT_EQ(one.replication(), 1);
  EXPECT_TRUE(one.BackupsOfSlot(3).empty());
  EXPECT_TRUE(one.RouteOf(plain).BackupsOf(3).empty());
  EXPECT_FALSE(one.BacksAnything(0));
  EXPECT_EQ(one.ToProto().replication(), 0u);
}

TEST(ShardMapReplicas, RefusesBadBackups) {
  v1::ShardMap p = ShardMap::Uniform(1, 4, {"a:1", "b:2", "c:3"}).ToProto();
  p.set_replication(2);
  auto refused = [&](const v1::ShardMap& bad, const std::string& why) {
    auto m = ShardMap::FromProto(bad);
    ASSERT_FALSE(m.ok()) << why;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(m.status().message(), HasSubstr(why));
  };
  refused(p, "has 0 backups where replication 2 needs 4");
  // slot_owner is {0, 0, 1, 2}.
  for (uint32_t b : {1u, 1u, 2u, 0u}) p.add_slot_backups(b);
  ASSERT_TRUE(ShardMap::FromProto(p).ok());
  v1::ShardMap self = p;
  self.set_slot_backups(0, 0);
  refused(self, "both the owner and a backup of slot 0");
  v1::ShardMap outside = p;
  outside.set_slot_backups(1, 7);
  refused(outside, "is server index 7 of 3");
  v1::ShardMap lost = p;  // a backup lost and not yet replaced
  lost.set_slot_backups(2, kNoBackup);
  auto m = ShardMap::FromProto(lost);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT(m->BackupsOfSlot(2), ElementsAre(kNoBackup));
  v1::ShardMap three = p;
  three.set_replication(3);
  three.clear_slot_backups();
  for (uint32_t b : {1u, 1u, 2u, 2u, 2u, 0u, 0u, 1u}) three.add_slot_backups(b);
  refused(three, "is a backup of slot 0 twice");
  v1::ShardMap huge = p;
  huge.set_replication(1000);
  refused(huge, "replication 1000 is above");
  v1::ShardMap wise = p;
  v1::TableRouting* t = wise.add_tables();
  t->set_table("wise");
  t->set_owner(1);
  refused(wise, "table wise has 0 backups");
  t->add_backups(1);
  refused(wise, "both the owner and a backup of table wise");
}

TEST(PromoteBackups, ALostServersUnitsGoToTheirFirstBackup) {
  ShardMap m = ShardMap::Uniform(4, 12, {"a:1", "b:2", "c:3"});
  ASSERT_TRUE(AddBackups(2, {}, &m).ok());
  auto promoted = PromoteBackups(m, 0);
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  EXPECT_EQ(promoted->epoch(), 5u);
  for (uint32_t slot = 0; slot < 12; ++slot) {
    const int before = m.OwnerOfSlot(slot);
    const int after = promoted->OwnerOfSlot(slot);
    if (before == 0) {
      EXPECT_EQ(after, 1) << "slot " << slot << ": server 0's backup";
      EXPECT_THAT(promoted->BackupsOfSlot(slot), ElementsAre(kNoBackup));
    } else {
      EXPECT_EQ(after, before);
      // Server 2's slots were backed up on server 0: lost too.
      EXPECT_THAT(promoted->BackupsOfSlot(slot),
                  ElementsAre(before == 2 ? kNoBackup : m.BackupsOfSlot(slot)[0]));
    }
  }
  EXPECT_FALSE(promoted->OwnsAnything(0));
  EXPECT_FALSE(promoted->BacksAnything(0));
  EXPECT_TRUE(promoted->BackupServersOf(0).empty());
  EXPECT_THAT(promoted->BackupServersOf(1), ElementsAre(2u));
  EXPECT_TRUE(promoted->BackupServersOf(2).empty());
  // Losing server 1 too: the slots it took over have no copy left.
  auto twice = PromoteBackups(*promoted, 1);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(twice.status().message(), HasSubstr("has no copy left"));
  // Without replication only a server that owns nothing can go.
  ShardMap one = ShardMap::Uniform(1, 12, {"a:1", "b:2"});
  EXPECT_EQ(PromoteBackups(one, 0).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(PromoteBackups(one, 5).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PromoteBackups, APromotedUnitLetsItsOtherBackupsGo) {
  // Replication 3: the second backup of a promoted unit followed the lost
  // primary's clock; the promoted server steps the unit on its own copy of
  // that clock and forwards nothing of it, so the unit keeps no backup.
  ShardMap m = ShardMap::Uniform(4, 12, {"a:1", "b:2", "c:3", "d:4"});
  ASSERT_TRUE(AddBackups(3, {}, &m).ok());
  auto promoted = PromoteBackups(m, 0);
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  for (uint32_t slot = 0; slot < 12; ++slot) {
    if (m.OwnerOfSlot(slot) != 0) continue;
    EXPECT_EQ(promoted->OwnerOfSlot(slot), static_cast<int>(m.BackupsOfSlot(slot)[0]));
    EXPECT_THAT(promoted->BackupsOfSlot(slot), ElementsAre(kNoBackup, kNoBackup));
  }
  EXPECT_GT(promoted->UnderReplicatedUnits(), 0);
}

TEST(ReReplication, EachLostBackupGetsALiveServerAndTheMapTakesIt) {
  // Server 0 of four lost (failed over): the units it backed need a new
  // backup, the units it owned (promoted) too unless skipped.
  ShardMap m = ShardMap::Uniform(4, 12, {"a:1", "b:2", "c:3", "d:4"});
  v1::ShardMap p = m.ToProto();
  v1::TableRouting* wise = p.add_tables();  // table-wise on server 2
  wise->set_table("wise");
  wise->set_owner(2);
  auto planned = ShardMap::FromProto(p);
  ASSERT_TRUE(planned.ok()) << planned.status();
  ASSERT_TRUE(AddBackups(2, {}, &*planned).ok());
  auto promoted = PromoteBackups(*planned, 0);
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  const std::vector<bool> alive = {false, true, true, true};
  // Slots promoted from server 0 step on its clock: skipped here.
  const auto promoted_unit = [&](int owner, const std::string& table, uint32_t slot) {
    return table.empty() && planned->OwnerOfSlot(slot) == 0;
  };
  const std::vector<BackupCopy> copies =
      PlanReReplication(*promoted, alive, {}, promoted_unit);
  ASSERT_FALSE(copies.empty());
  ShardMap next = *promoted;
  for (const BackupCopy& c : copies) {
    EXPECT_NE(c.backup, 0) << "a dead server";
    EXPECT_NE(c.backup, c.owner);
    auto added = AddBackupToMap(next, c, next.epoch() + 1);
    ASSERT_TRUE(added.ok()) << added.status();
    next = *added;
  }
  for (uint32_t slot = 0; slot < 12; ++slot) {
    if (planned->OwnerOfSlot(slot) == 0) {
      EXPECT_THAT(next.BackupsOfSlot(slot), ElementsAre(kNoBackup)) << "skipped slot " << slot;
    } else {
      EXPECT_NE(next.BackupsOfSlot(slot)[0], kNoBackup) << "slot " << slot;
      EXPECT_NE(static_cast<int>(next.BackupsOfSlot(slot)[0]), next.OwnerOfSlot(slot));
    }
  }
  EXPECT_NE(next.RouteOf(StableNameKey("wise")).BackupsOf(5)[0], kNoBackup);
  int skipped = 0;
  for (uint32_t slot = 0; slot < 12; ++slot) skipped += planned->OwnerOfSlot(slot) == 0;
  EXPECT_EQ(next.UnderReplicatedUnits(), skipped);
  // Nothing left to do but the skipped units; with them, every unit.
  EXPECT_TRUE(PlanReReplication(next, alive, {}, promoted_unit).empty());
  EXPECT_FALSE(PlanReReplication(next, alive, {}, nullptr).empty());
  // Zones: a backup never shares a zone with another copy of its unit.
  const std::vector<std::string> zones = {"z0", "z1", "z1", "z2"};
  for (const BackupCopy& c : PlanReReplication(*promoted, alive, zones, nullptr)) {
    EXPECT_NE(zones[c.owner], zones[c.backup]);
  }
  // Only dead servers or one zone left: nothing to plan.
  EXPECT_TRUE(PlanReReplication(*promoted, {false, true, false, false}, {}, nullptr).empty());
  EXPECT_TRUE(
      PlanReReplication(*promoted, alive, {"z0", "z1", "z1", "z1"}, nullptr).empty());
}

TEST(ReReplication, AddBackupToMapRefusesWhatIsNotALostBackup) {
  ShardMap m = ShardMap::Uniform(4, 12, {"a:1", "b:2", "c:3"});
  ASSERT_TRUE(AddBackups(2, {}, &m).ok());
  const uint32_t slot0_owner = static_cast<uint32_t>(m.OwnerOfSlot(0));
  const auto refused = [&](const BackupCopy& c, absl::StatusCode code, const std::string& what) {
    auto r = AddBackupToMap(m, c, m.epoch() + 1);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(what));
  };
  BackupCopy full;  // every slot still has its backup
  full.owner = static_cast<int>(slot0_owner);
  full.backup = static_cast<int>((slot0_owner + 2) % 3);
  full.slots = {0};
  refused(full, absl::StatusCode::kFailedPrecondition, "has all its 1 backup(s)");
  BackupCopy other = full;  // not its owner
  other.owner = static_cast<int>((slot0_owner + 1) % 3);
  refused(other, absl::StatusCode::kFailedPrecondition, "is owned by");
  BackupCopy self = full;
  self.backup = self.owner;
  refused(self, absl::StatusCode::kInvalidArgument, "must be two servers");
  BackupCopy table = full;
  table.slots.clear();
  table.tables = {"nope"};
  refused(table, absl::StatusCode::kInvalidArgument, "not a table-wise table");
  ShardMap one = ShardMap::Uniform(1, 12, {"a:1", "b:2"});
  EXPECT_EQ(AddBackupToMap(one, BackupCopy{0, 1, {0}, {}}, 2).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace recps
