// UnitHolds on its own: a hold parks the requests that touch its units (a
// lookup's ids, a push's parts, or every push for a target that owns
// nothing yet) from its step on, and releasing it runs them on the queue.
#include "server/shard/unit_holds.h"

#include <future>
#include <memory>
#include <vector>

#include "common/hashing.h"
#include "common/wire/wire_format.h"
#include "gtest/gtest.h"
#include "server/store/embedding_store.h"
#include "tests/testing/table_specs.h"
#include "tests/testing/test_store.h"

namespace recps::server {
namespace {

constexpr uint32_t kSlots = 8;

class UnitHoldsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = testing::TestLayeredStore({testing::TestTableSpec("t", 4)}, kSlots);
    ASSERT_NE(store_, nullptr);
    holds_ = std::make_unique<UnitHolds>(store_.get(), kSlots, &work_);
    // An id in slot 0 and one in another slot.
    const uint64_t key = StableNameKey("t");
    for (int64_t id = 0; held_id_ < 0 || free_id_ < 0; ++id) {
      (SlotOf(key, id, kSlots) == 0 ? held_id_ : free_id_) = id;
    }
  }

  std::shared_ptr<UnitHolds::Hold> HoldSlotZero(bool all_pushes = false) {
    auto hold = std::make_shared<UnitHolds::Hold>();
    hold->held = {std::vector<uint8_t>(kSlots, 0)};
    hold->held[0][0] = 1;
    hold->all_pushes = all_pushes;
    return hold;
  }

  static v1::RequestHeader Header(int64_t step) {
    v1::RequestHeader h;
    h.set_step(step);
    return h;
  }

  bool ParkLookup(int64_t step, int64_t id, std::promise<void>* resumed) {
    google::protobuf::RepeatedPtrField<v1::TableIds> tables;
    v1::TableIds* t = tables.Add();
    t->set_table("t");
    const std::vector<int64_t> ids = {id};
    EncodeIds(ids, t->mutable_ids());
    return holds_->ParkIfHeld(Header(step), &tables, nullptr, [resumed] {
      return absl::AnyInvocable<void() &&>([resumed] { resumed->set_value(); });
    });
  }

  bool ParkPush(int64_t step, int64_t id) {
    GradientPush push;
    TableGradients tg;
    tg.table = 0;
    tg.dim = 4;
    tg.ids = {id};
    push.push_back(std::move(tg));
    return holds_->ParkIfHeld(Header(step), nullptr, &push, [] {
      return absl::AnyInvocable<void() &&>([] {});
    });
  }

  WorkQueue work_{1};
  std::unique_ptr<LayeredStore> store_;
  std::unique_ptr<UnitHolds> holds_;
  int64_t held_id_ = -1;
  int64_t free_id_ = -1;
};

TEST_F(UnitHoldsTest, ParksRequestsOfHeldUnitsFromItsStepAndReleasesThem) {
  holds_->NoteRequestStep(4);
  auto hold = HoldSlotZero();
  EXPECT_EQ(holds_->Add(hold, /*async=*/false), 4);  // L: the newest step seen
  EXPECT_TRUE(holds_->any());
  std::promise<void> resumed;
  EXPECT_FALSE(ParkLookup(4, held_id_, &resumed));  // step L: must still run
  EXPECT_FALSE(ParkLookup(5, free_id_, &resumed));  // another slot
  EXPECT_FALSE(ParkPush(5, free_id_));
  EXPECT_TRUE(ParkPush(5, held_id_));
  EXPECT_TRUE(ParkLookup(5, held_id_, &resumed));
  holds_->Release(hold);
  EXPECT_FALSE(holds_->any());
  resumed.get_future().get();  // ran on the work queue
  EXPECT_FALSE(ParkPush(6, held_id_));
}

TEST_F(UnitHoldsTest, AllPushesHoldsEveryPushAndAsyncHoldsEveryStep) {
  auto every_push = HoldSlotZero(/*all_pushes=*/true);
  holds_->Add(every_push, /*async=*/false);
  EXPECT_TRUE(ParkPush(0, free_id_));
  holds_->Release(every_push);
  holds_->NoteRequestStep(9);
  auto async = HoldSlotZero();
  EXPECT_EQ(holds_->Add(async, /*async=*/true), 9);
  EXPECT_TRUE(ParkPush(0, held_id_));  // from_step 0
  holds_->Release(async);
}

}  // namespace
}  // namespace recps::server
