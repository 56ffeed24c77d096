#include "common/shard_map.h"

#include <map>
#include <vector>

#include "common/hashing.h"
#include "common/row_init.h"
#include "gtest/gtest.h"

namespace recps {
namespace {

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
