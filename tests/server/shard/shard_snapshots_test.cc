// ShardSnapshots on its own (no gRPC, no ShardServer): a store, a step clock
// and the map facts a test chooses. The file holds the units the map gives
// the server at the cut, a restore imports the slots it gives now, marks
// and cuts share one sequence, handed-over units are dropped, and a stopped
// writer answers UNAVAILABLE.
#include "server/shard/shard_snapshots.h"

#include <unistd.h>

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/status_macros.h"
#include "common/wire/shard_map.h"
#include "server/checkpoint/checkpoint.h"
#include "server/store/embedding_store.h"
#include "tests/testing/files.h"
#include "tests/testing/table_specs.h"
#include "tests/testing/test_store.h"

namespace recps::server {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kSlots = 16;

std::unique_ptr<LayeredStore> MakeStore() {
  return testing::TestLayeredStore(
      {testing::TestTableSpec("t", 4, 0, OptimizerKind::kAdagrad, 0.1f)}, kSlots,
      /*seed=*/5);
}

// Rows of table 0 in `slot`.
int64_t RowsIn(SlotTransfer& store, uint32_t slot) {
  SlotCursor cursor;
  SlotChunk chunk;
  int64_t n = 0;
  while (!cursor.done) {
    EXPECT_TRUE(store.ExportSlot(0, slot, &cursor, 1 << 20, &chunk).ok());
    n += static_cast<int64_t>(chunk.ids.size());
  }
  return n;
}

absl::Status Call(absl::FunctionRef<void(ShardSnapshots::Done)> start) {
  std::promise<absl::Status> result;
  start([&result](absl::Status s) { result.set_value(std::move(s)); });
  return result.get_future().get();
}

class ShardSnapshotsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = MakeStore();
    std::vector<int64_t> ids(500);
    std::vector<float> out(ids.size() * 4);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 7919);
    ASSERT_TRUE(store_->Lookup(0, ids, out.data()).ok());
    clock_ = std::make_unique<StepClock>(ConsistencyOptions{},
                                         [](GradientPush&) { return absl::OkStatus(); });
  }

  // The map gives this server the even slots.
  ShardSnapshots::MapFacts EvenSlots(bool listed = true) {
    ShardSnapshots::MapFacts facts;
    facts.listed = [listed] { return listed; };
    facts.owns_anything = [] { return false; };  // no step: cut at once
    facts.owned_units = [] {
      std::vector<std::vector<uint8_t>> owned(1, std::vector<uint8_t>(kSlots));
      for (uint32_t s = 0; s < kSlots; s += 2) owned[0][s] = 1;
      return owned;
    };
    facts.restore_slots = [] {
      std::vector<std::vector<uint32_t>> slots(1);
      for (uint32_t s = 0; s < kSlots; s += 2) slots[0].push_back(s);
      return slots;
    };
    return facts;
  }

  absl::Status Save(ShardSnapshots& snapshots, uint64_t step,
                    v1::SaveRowsStatusResponse* status) {
    v1::SaveRowsRequest request;
    request.set_step(step);
    request.set_path(absl::StrCat(dir_.path(), "/rows-", step, ".sst"));
    v1::SaveRowsResponse response;
    RETURN_IF_ERROR(Call([&](ShardSnapshots::Done done) {
      snapshots.SaveRows(&request, &response, std::move(done));
    }));
    // The file is written after the reply: poll its state.
    for (int i = 0; i < 500; ++i) {
      v1::SaveRowsStatusRequest ask;
      ask.set_step(step);
      RETURN_IF_ERROR(snapshots.SaveRowsStatus(ask, status));
      if (status->state() != v1::SaveRowsStatusResponse::WRITING) break;
      usleep(10000);
    }
    return absl::OkStatus();
  }

  testing::TempDir dir_;
  std::unique_ptr<LayeredStore> store_;
  std::unique_ptr<StepClock> clock_;
};

TEST_F(ShardSnapshotsTest, FileHoldsOnlyTheUnitsOwnedAtTheCut) {
  ShardSnapshots snapshots(store_.get(), clock_.get(), nullptr, nullptr, absl::Seconds(5),
                           EvenSlots());
  v1::SaveRowsStatusResponse status;
  ASSERT_TRUE(Save(snapshots, 3, &status).ok());
  ASSERT_EQ(status.state(), v1::SaveRowsStatusResponse::DONE) << status.error();
  int64_t even = 0;
  for (uint32_t s = 0; s < kSlots; s += 2) even += RowsIn(*store_, s);
  ASSERT_GT(even, 0);
  EXPECT_EQ(status.file().rows(), even);

}

TEST_F(ShardSnapshotsTest, RestoreImportsTheSlotsTheMapGivesTheServerNow) {
  // A checkpoint of every slot, as the coordinator's files would hold it.
  checkpoint::CheckpointSpec spec;
  spec.step = 3;
  spec.job_config_digest = "00000000000000aa";
  spec.shard_map = ShardMap::Uniform(1, kSlots, {"a:1"}).ToProto();
  std::vector<uint32_t> all(kSlots);
  for (uint32_t s = 0; s < kSlots; ++s) all[s] = s;
  const std::vector<checkpoint::ShardRows> shards = {{store_.get(), all}};
  absl::StatusOr<checkpoint::CheckpointInfo> written =
      checkpoint::WriteCheckpoint(dir_.path(), spec, shards);
  ASSERT_TRUE(written.ok()) << written.status();

  std::unique_ptr<LayeredStore> fresh = MakeStore();
  StepClock clock(ConsistencyOptions{}, [](GradientPush&) { return absl::OkStatus(); });
  ShardSnapshots restorer(fresh.get(), &clock, nullptr, nullptr, absl::Seconds(5),
                          EvenSlots());
  v1::RestoreRowsRequest restore;
  restore.set_step(3);
  restore.add_checkpoint_dirs(written->dir);
  restore.set_expected_digest(spec.job_config_digest);
  v1::RestoreRowsResponse restored;
  const absl::Status s = Call([&](ShardSnapshots::Done done) {
    restorer.RestoreRows(&restore, &restored, std::move(done));
  });
  ASSERT_TRUE(s.ok()) << s;
  int64_t even = 0;
  for (uint32_t slot = 0; slot < kSlots; ++slot) {
    if (slot % 2 == 0) {
      EXPECT_EQ(RowsIn(*fresh, slot), RowsIn(*store_, slot)) << slot;
      even += RowsIn(*store_, slot);
    } else {
      EXPECT_EQ(RowsIn(*fresh, slot), 0) << slot;
    }
  }
  EXPECT_EQ(restored.rows(), even);
  // The clock resumes at the restored step.
  EXPECT_EQ(clock.applied_step(), 2);
}

TEST_F(ShardSnapshotsTest, AServerNotInTheMapRefusesToSave) {
  ShardSnapshots snapshots(store_.get(), clock_.get(), nullptr, nullptr, absl::Seconds(5),
                           EvenSlots(/*listed=*/false));
  v1::SaveRowsStatusResponse status;
  const absl::Status s = Save(snapshots, 1, &status);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("no shard map"));
}

TEST_F(ShardSnapshotsTest, MarksAndCutsShareOneSequence) {
  ShardSnapshots snapshots(store_.get(), clock_.get(), nullptr, nullptr, absl::Seconds(5),
                           EvenSlots());
  const uint64_t first = snapshots.NextMark();
  const uint64_t second = snapshots.NextMark();
  EXPECT_GT(second, first);
  // A snapshot's cut comes from the same sequence: the store refuses a cut
  // that is not above every mark, so a SaveRows after the marks succeeds
  // only if its cut followed them.
  v1::SaveRowsStatusResponse status;
  ASSERT_TRUE(Save(snapshots, 1, &status).ok());
  EXPECT_EQ(status.state(), v1::SaveRowsStatusResponse::DONE) << status.error();
  EXPECT_GT(snapshots.NextMark(), second + 1);
}

TEST_F(ShardSnapshotsTest, HandedOverUnitsAreDroppedAndKeptUnitsAreNot) {
  ShardSnapshots snapshots(store_.get(), clock_.get(), nullptr, nullptr, absl::Seconds(5),
                           EvenSlots());
  uint32_t a = kSlots, b = kSlots;
  for (uint32_t s = 0; s < kSlots; ++s) {
    if (RowsIn(*store_, s) == 0) continue;
    (a == kSlots ? a : b) = s;
    if (b != kSlots) break;
  }
  ASSERT_LT(b, kSlots);
  snapshots.DropHandedOver({{0, a}});  // no snapshot open: dropped now
  EXPECT_EQ(RowsIn(*store_, a), 0);
  EXPECT_GT(RowsIn(*store_, b), 0);
  EXPECT_GT(DropUnits(*store_, std::vector<StoreUnit>{{0, b}}), 0);
  EXPECT_EQ(RowsIn(*store_, b), 0);
}

TEST_F(ShardSnapshotsTest, AStoppedWriterAnswersUnavailable) {
  ShardSnapshots snapshots(store_.get(), clock_.get(), nullptr, nullptr, absl::Seconds(5),
                           EvenSlots());
  snapshots.Stop();
  v1::SaveRowsStatusResponse status;
  const absl::Status s = Save(snapshots, 1, &status);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

}  // namespace
}  // namespace recps::server
