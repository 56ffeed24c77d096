// ShardMapKeeper on its own: the install rules (epochs only grow, a retry
// is OK, the map must list this server, no slot holding rows is given
// away unless a hand-over sent it) and the units it says this server owns.
#include "server/shard/shard_map_keeper.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hashing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/embedding_store.h"
#include "tests/testing/table_specs.h"
#include "tests/testing/test_store.h"

namespace recps::server {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kSlots = 8;
constexpr char kSelf[] = "a:1";

class ShardMapKeeperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = testing::TestLayeredStore({testing::TestTableSpec("t", 4)}, kSlots);
    ASSERT_NE(store_, nullptr);
    keeper_ = std::make_unique<ShardMapKeeper>(
        store_.get(), kSlots, ShardMap::Uniform(1, kSlots, {kSelf, "b:2"}), kSelf,
        nullptr, [this] { ++installs_; });
  }

  static v1::SetShardMapRequest Request(const ShardMap& map) {
    v1::SetShardMapRequest r;
    *r.mutable_shard_map() = map.ToProto();
    return r;
  }

  // Creates a row of table 0 in a slot this server owns now; its slot.
  uint32_t RowInOwnSlot() {
    const uint64_t key = StableNameKey("t");
    for (int64_t id = 0;; ++id) {
      const uint32_t slot = SlotOf(key, id, kSlots);
      if (keeper_->OwnedUnits()[0][slot] == 0) continue;
      float out[4];
      EXPECT_TRUE(store_->Lookup(0, {&id, 1}, out).ok());
      return slot;
    }
  }

  std::unique_ptr<LayeredStore> store_;
  std::unique_ptr<ShardMapKeeper> keeper_;
  int installs_ = 0;
};

TEST_F(ShardMapKeeperTest, EpochsOnlyGrowAndARetryIsOk) {
  const ShardMap two = ShardMap::Uniform(2, kSlots, {kSelf, "b:2"});
  ASSERT_TRUE(keeper_->Install(Request(two)).ok());
  EXPECT_EQ(keeper_->Current()->map.epoch(), 2u);
  EXPECT_EQ(installs_, 1);
  EXPECT_TRUE(keeper_->Install(Request(two)).ok());  // the same map again
  const absl::Status older =
      keeper_->Install(Request(ShardMap::Uniform(1, kSlots, {kSelf, "b:2"})));
  EXPECT_EQ(older.code(), absl::StatusCode::kAlreadyExists) << older;
  const absl::Status jump = keeper_->Install(
      Request(ShardMap::Uniform(2 + kMaxShardMapEpochStep + 1, kSlots, {kSelf, "b:2"})));
  EXPECT_EQ(jump.code(), absl::StatusCode::kInvalidArgument) << jump;
  EXPECT_EQ(keeper_->Current()->map.epoch(), 2u);
}

TEST_F(ShardMapKeeperTest, AMapThatDoesNotListThisServerIsRefused) {
  const absl::Status s =
      keeper_->Install(Request(ShardMap::Uniform(2, kSlots, {"c:3", "b:2"})));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(kSelf));
  EXPECT_EQ(keeper_->Current()->self, 0);
}

TEST_F(ShardMapKeeperTest, ASlotHoldingRowsMovesOnlyByAHandOver) {
  const uint32_t slot = RowInOwnSlot();
  // The next map gives every slot to b.
  v1::SetShardMapRequest request =
      Request(ShardMap::Uniform(2, kSlots, {"b:2", kSelf}));
  request.mutable_shard_map()->clear_slot_owner();
  for (uint32_t s = 0; s < kSlots; ++s) request.mutable_shard_map()->add_slot_owner(0);
  const absl::Status refused = keeper_->Install(request);
  ASSERT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr(absl::StrCat("slot ", slot)));
  EXPECT_EQ(keeper_->Current()->map.epoch(), 1u);
  // Handed over: allowed.
  const absl::flat_hash_set<StoreUnit> handed = {{0, slot}};
  EXPECT_TRUE(keeper_->Install(request, &handed).ok());
  EXPECT_EQ(keeper_->Current()->map.epoch(), 2u);
}

TEST_F(ShardMapKeeperTest, OwnedUnitsAndRestoreSlotsFollowTheMap) {
  const ShardMap map = keeper_->Current()->map;
  const std::vector<uint32_t> mine = map.SlotsOf(0);
  const std::vector<std::vector<uint8_t>> owned = keeper_->OwnedUnits();
  ASSERT_EQ(owned.size(), 1u);
  for (uint32_t s = 0; s < kSlots; ++s) {
    const bool listed = std::find(mine.begin(), mine.end(), s) != mine.end();
    EXPECT_EQ(owned[0][s] != 0, listed) << s;
  }
  EXPECT_EQ(keeper_->RestoreSlots()[0], mine);
  EXPECT_EQ(keeper_->UnitOwner(map, map.ToProto(), {0, mine[0]}), kSelf);
}

}  // namespace
}  // namespace recps::server
