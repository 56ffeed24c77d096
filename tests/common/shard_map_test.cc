#include "common/shard_map.h"

#include <map>
#include <vector>

#include "common/hashing.h"
#include "common/row_init.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

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

TEST(ShardMap, TableRoutingOverridesTheGlobalSlotsForThatTableOnly) {
  v1::ShardMap p = ShardMap::Uniform(4, 64, {"a:1", "b:2", "c:3"}).ToProto();
  v1::TableRouting* whole = p.add_tables();
  whole->set_table("pinned");
  whole->set_owner(2);
  v1::TableRouting* own = p.add_tables();
  own->set_table("own");
  for (uint32_t s = 0; s < 64; ++s) own->add_slot_owner(s % 2);
  absl::StatusOr<ShardMap> m = ShardMap::FromProto(p);
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
