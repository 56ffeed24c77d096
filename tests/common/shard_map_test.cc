#include "common/wire/shard_map.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hashing.h"
#include "common/row_init.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/column_groups.h"

namespace recps {
namespace {

using ::testing::HasSubstr;

TEST(SlotOf, SpreadsIdsEvenlyAndStaysStable) {
  const uint32_t kSlots = 64;
  std::vector<int> counts(kSlots);
  const uint64_t table = StableNameKey("user_id");
  for (int64_t id = 0; id < 64000; ++id) ++counts[SlotOf(table, id, kSlots)];
  for (int c : counts) EXPECT_NEAR(c, 1000, 150);
  // Pinned values: slot assignment is part of the storage contract.
  EXPECT_EQ(StableNameKey("user_id"), StableNameKey(std::string("user_id")));
  EXPECT_NE(StableNameKey("user_id"), StableNameKey("item_id"));
  EXPECT_EQ(SlotOf(table, 0, 1), 0u);
  const int64_t big = INT64_MAX;
  EXPECT_LT(SlotOf(table, big, 4096), 4096u);
  EXPECT_LT(SlotOf(table, -1, 4096), 4096u);
}

TEST(ShardMap, UniformSplitsSlotsIntoEqualBlocks) {
  ShardMap m = ShardMap::Uniform(7, 10, {"a:1", "b:2", "c:3"});
  EXPECT_EQ(m.epoch(), 7u);
  std::map<int, int> per_server;
  for (uint32_t s = 0; s < 10; ++s) ++per_server[m.OwnerOfSlot(s)];
  EXPECT_EQ(per_server[0] + per_server[1] + per_server[2], 10);
  for (auto& [server, n] : per_server) EXPECT_GE(n, 3);
  EXPECT_EQ(m.SlotsOf(0).front(), 0u);
  EXPECT_EQ(m.IndexOf("b:2"), 1);
  EXPECT_EQ(m.IndexOf("nope"), -1);
}

TEST(ShardMap, ProtoRoundTripAndValidation) {
  ShardMap m = ShardMap::Uniform(3, 16, {"x:1", "y:2"});
  absl::StatusOr<ShardMap> back = ShardMap::FromProto(m.ToProto());
  ASSERT_TRUE(back.ok()) << back.status();
  for (uint32_t s = 0; s < 16; ++s) EXPECT_EQ(back->OwnerOfSlot(s), m.OwnerOfSlot(s));

  v1::ShardMap bad = m.ToProto();
  bad.set_slot_owner(5, 2);
  EXPECT_NE(ShardMap::FromProto(bad).status().message().find("slot 5"),
            std::string::npos);
  bad = m.ToProto();
  bad.add_servers("x:1");
  EXPECT_NE(ShardMap::FromProto(bad).status().message().find("listed twice"),
            std::string::npos);
  bad = m.ToProto();
  bad.mutable_slot_owner()->RemoveLast();
  EXPECT_FALSE(ShardMap::FromProto(bad).ok());
  bad = m.ToProto();
  bad.set_num_slots(0);
  EXPECT_FALSE(ShardMap::FromProto(bad).ok());
}

// 64 global slots over three servers, "pinned" table-wise on server 2 and
// "own" over its own slot owners: owner_of_slot(s) for slot s.
v1::ShardMap RoutedMap(uint32_t (*owner_of_slot)(uint32_t)) {
  v1::ShardMap p = ShardMap::Uniform(4, 64, {"a:1", "b:2", "c:3"}).ToProto();
  v1::TableRouting* whole = p.add_tables();
  whole->set_table("pinned");
  whole->set_owner(2);
  v1::TableRouting* own = p.add_tables();
  own->set_table("own");
  for (uint32_t s = 0; s < 64; ++s) own->add_slot_owner(owner_of_slot(s));
  return p;
}

TEST(ShardMap, TableRoutingOverridesTheGlobalSlotsForThatTableOnly) {
  absl::StatusOr<ShardMap> m =
      ShardMap::FromProto(RoutedMap([](uint32_t s) -> uint32_t { return s % 2; }));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->has_table_routing());
  const uint64_t pinned = StableNameKey("pinned"), mine = StableNameKey("own"),
                 other = StableNameKey("other");
  EXPECT_EQ(m->RouteOf(pinned).single_owner(), 2);
  EXPECT_EQ(m->RouteOf(other).single_owner(), -1);
  for (int64_t id = -1000; id < 1000; ++id) {
    EXPECT_EQ(m->OwnerOf(pinned, id), 2);
    EXPECT_EQ(m->OwnerOf(mine, id), static_cast<int>(SlotOf(mine, id, 64) % 2));
    EXPECT_EQ(m->OwnerOf(other, id), m->OwnerOfSlot(SlotOf(other, id, 64)));
    EXPECT_EQ(m->RouteOf(other).OwnerOf(id), m->OwnerOf(other, id));
  }
  // Round trip keeps the routings.
  absl::StatusOr<ShardMap> back = ShardMap::FromProto(m->ToProto());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToProto().tables_size(), 2);
  EXPECT_EQ(back->OwnerOf(pinned, 12345), 2);
}

// The share of a table's ids a server owns: what it commits memory for.
TEST(ShardMap, ShareOfFollowsEachTablesRouting) {
  absl::StatusOr<ShardMap> m = ShardMap::FromProto(
      RoutedMap([](uint32_t s) -> uint32_t { return s % 4 == 0 ? 1 : 0; }));
  ASSERT_TRUE(m.ok()) << m.status();
  const uint64_t pinned = StableNameKey("pinned"), mine = StableNameKey("own"),
                 other = StableNameKey("other");
  EXPECT_EQ(m->ShareOf(2, pinned), 1.0);
  EXPECT_EQ(m->ShareOf(0, pinned), 0.0);
  EXPECT_EQ(m->ShareOf(0, mine), 0.75);
  EXPECT_EQ(m->ShareOf(1, mine), 0.25);
  EXPECT_EQ(m->ShareOf(2, mine), 0.0);
  // Global slots: 64 in blocks of 22, 21, 21.
  EXPECT_DOUBLE_EQ(m->ShareOf(0, other) + m->ShareOf(1, other) + m->ShareOf(2, other), 1.0);
  EXPECT_DOUBLE_EQ(m->ShareOf(1, other), 21.0 / 64);
}

TEST(ShardMap, BadTableRoutingsAreRefused) {
  const v1::ShardMap base = ShardMap::Uniform(1, 8, {"a:1", "b:2"}).ToProto();
  v1::ShardMap p = base;
  p.add_tables()->set_table("t");
  p.mutable_tables(0)->set_owner(2);
  EXPECT_THAT(ShardMap::FromProto(p).status().message(), HasSubstr("server index 2"));
  p = base;
  p.add_tables()->set_table("t");
  p.add_tables()->set_table("t");
  EXPECT_THAT(ShardMap::FromProto(p).status().message(), HasSubstr("routed twice"));
  p = base;
  p.add_tables()->set_table("t");
  p.mutable_tables(0)->add_slot_owner(0);
  EXPECT_THAT(ShardMap::FromProto(p).status().message(), HasSubstr("1 slot owners for 8"));
  p = base;
  p.add_tables();
  EXPECT_THAT(ShardMap::FromProto(p).status().message(), HasSubstr("no table name"));
}

// A map over `servers` servers (8 slots) with table `t` split at `bounds`
// (column boundaries, first 0) and group g owned by owners[g].
v1::ShardMap SplitMap(int servers, const std::vector<uint32_t>& bounds,
                      const std::vector<uint32_t>& owners) {
  std::vector<std::string> names;
  for (int s = 0; s < servers; ++s) names.push_back(absl::StrCat("h:", s));
  v1::ShardMap p = ShardMap::Uniform(5, 8, names).ToProto();
  testing::AddColumnGroups(&p, "t", bounds, owners);
  return p;
}

TEST(ShardMap, ColumnGroupsRouteEachGroupTableToItsOwner) {
  absl::StatusOr<ShardMap> m = ShardMap::FromProto(SplitMap(3, {0, 4, 10, 16}, {2, 0, 2}));
  ASSERT_TRUE(m.ok()) << m.status();
  const uint64_t t = StableNameKey("t");
  const absl::Span<const ColumnGroup> groups = m->ColumnGroupsOf(t);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[1].begin, 4);
  EXPECT_EQ(groups[1].end, 10);
  EXPECT_EQ(groups[1].owner, 0);
  EXPECT_EQ(groups[1].table, ColumnGroupTableName("t", 4, 10));
  EXPECT_EQ(groups[1].table, "t.cols4-10");
  EXPECT_EQ(groups[1].key, StableNameKey("t.cols4-10"));
  // The split table itself has no owner; each group is held whole.
  const TableRoute whole = m->RouteOf(t);
  EXPECT_TRUE(whole.column_split());
  EXPECT_FALSE(whole.column_group());
  for (int64_t id = -50; id < 50; ++id) EXPECT_EQ(whole.OwnerOf(id), -1);
  for (const ColumnGroup& g : groups) {
    const TableRoute r = m->RouteOf(g.key);
    EXPECT_TRUE(r.column_group());
    EXPECT_FALSE(r.column_split());
    EXPECT_EQ(r.single_owner(), g.owner);
    for (int64_t id = -50; id < 50; ++id) EXPECT_EQ(m->OwnerOf(g.key, id), g.owner);
  }
  // Other tables: global slots, no groups.
  const uint64_t other = StableNameKey("other");
  EXPECT_TRUE(m->ColumnGroupsOf(other).empty());
  EXPECT_FALSE(m->RouteOf(other).column_split());
  EXPECT_EQ(m->OwnerOf(other, 7), m->OwnerOfSlot(SlotOf(other, 7, 8)));
  EXPECT_TRUE(m->CheckWidth("t", 16).ok());
  EXPECT_TRUE(m->CheckWidth("other", 3).ok());
  EXPECT_THAT(m->CheckWidth("t", 17).message(),
              HasSubstr("cover columns [0, 16) but the table has dim 17"));
  // Round trip: one routing with three groups (the groups' own entries are
  // derived, not written).
  const v1::ShardMap proto = m->ToProto();
  ASSERT_EQ(proto.tables_size(), 1);
  EXPECT_EQ(proto.tables(0).column_groups_size(), 3);
  absl::StatusOr<ShardMap> back = ShardMap::FromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToProto().SerializeAsString(), proto.SerializeAsString());
  EXPECT_EQ(back->ColumnGroupsOf(t).size(), 3u);
}

TEST(ShardMap, BadColumnGroupsAreRefused) {
  EXPECT_THAT(ShardMap::FromProto(SplitMap(2, {0, 4, 8}, {0, 2})).status().message(),
              HasSubstr("owned by server index 2 of 2"));
  // A gap, an overlap, a start past 0 and an empty group.
  v1::ShardMap p = SplitMap(2, {0, 4, 8}, {0, 1});
  p.mutable_tables(0)->mutable_column_groups(1)->set_column_begin(5);
  EXPECT_THAT(ShardMap::FromProto(p).status().message(),
              HasSubstr("column group [5, 8) where [4, ...) was due"));
  p.mutable_tables(0)->mutable_column_groups(1)->set_column_begin(3);
  EXPECT_FALSE(ShardMap::FromProto(p).ok());
  EXPECT_THAT(ShardMap::FromProto(SplitMap(2, {1, 4, 8}, {0, 1})).status().message(),
              HasSubstr("start at column 0"));
  EXPECT_FALSE(ShardMap::FromProto(SplitMap(2, {0, 4, 4}, {0, 1})).ok());
  // Groups and slot owners at once.
  p = SplitMap(2, {0, 4, 8}, {0, 1});
  for (int s = 0; s < 8; ++s) p.mutable_tables(0)->add_slot_owner(0);
  EXPECT_THAT(ShardMap::FromProto(p).status().message(),
              HasSubstr("both column groups and slot owners"));
  // A table routed under a group's name.
  p = SplitMap(2, {0, 4, 8}, {0, 1});
  v1::TableRouting* clash = p.add_tables();
  clash->set_table("t.cols0-4");
  clash->set_owner(1);
  EXPECT_THAT(ShardMap::FromProto(p).status().message(),
              HasSubstr("same name key"));
}

TEST(RowInit, ColumnGroupsStartAsTheUnsplitRowsColumns) {
  const uint64_t t = StableNameKey("t");
  for (RowInit whole : {RowInit{}, RowInit{RowInit::Distribution::kNormal, 0.1f, 0.5f}}) {
    std::vector<float> row(13);
    InitRow(whole, 7, t, -99, 13, row.data());
    // Odd boundaries split Box-Muller pairs.
    for (auto [begin, end] : {std::pair{0, 5}, {5, 6}, {6, 13}, {3, 10}}) {
      RowInit group = whole;
      group.source_key = t;
      group.column_offset = begin;
      std::vector<float> part(end - begin);
      // The group's own key is ignored for its values.
      InitRow(group, 7, StableNameKey(ColumnGroupTableName("t", begin, end)), -99,
              end - begin, part.data());
      for (int c = begin; c < end; ++c) EXPECT_EQ(part[c - begin], row[c]) << c;
    }
  }
}

TEST(RowInit, IsAPureFunctionOfSeedTableIdColumn) {
  RowInit init;  // uniform [-0.05, 0.05)
  const uint64_t t = StableNameKey("t");
  std::vector<float> a(33), b(33), c(33), d(40);
  InitRow(init, 1, t, 42, 33, a.data());
  InitRow(init, 1, t, 42, 33, b.data());
  InitRow(init, 1, t, 43, 33, c.data());
  InitRow(init, 1, t, 42, 40, d.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Column j's value does not depend on the row width.
  for (int j = 0; j < 33; ++j) EXPECT_EQ(a[j], d[j]);
  for (float v : a) {
    EXPECT_GE(v, -0.05f);
    EXPECT_LT(v, 0.05f);
  }
  std::vector<float> other_seed(33);
  InitRow(init, 2, t, 42, 33, other_seed.data());
  EXPECT_NE(a, other_seed);
}

TEST(RowInit, NormalHasTheRequestedMoments) {
  RowInit init{RowInit::Distribution::kNormal, 0.5f, 2.0f};
  std::vector<float> row(64);
  double sum = 0, sq = 0;
  const int kRows = 2000;
  for (int64_t id = 0; id < kRows; ++id) {
    InitRow(init, 9, StableNameKey("n"), id, 64, row.data());
    for (float v : row) {
      sum += v;
      sq += double(v) * v;
    }
  }
  const double n = kRows * 64.0;
  const double mean = sum / n;
  EXPECT_NEAR(mean, 0.5, 0.03);
  EXPECT_NEAR(std::sqrt(sq / n - mean * mean), 2.0, 0.03);
}

}  // namespace
}  // namespace recps
