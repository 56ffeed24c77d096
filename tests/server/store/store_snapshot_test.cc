// The store's snapshots (EmbeddingStore::BeginSnapshot / ExportSnapshotSlot
// / EndSnapshot): the cut's rows stay readable, bit for bit, while pushes,
// imports, lookups that create rows and drops go on; generations select the
// rows of an increment. Host store and layered store.
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/embedding_optimizer.h"
#include "server/store/embedding_store.h"
#include "server/store/layered_store.h"
#include "tests/server/store/contract_store.h"
#include "tests/testing/table_specs.h"

namespace recps::server {
namespace {

using ::recps::OptimizerKind;

constexpr uint32_t kSlots = 16;

std::unique_ptr<EmbeddingStore> MakeStore() {
  StoreOptions o;
  o.seed = 7;
  o.num_slots = kSlots;
  o.max_rows_per_table = 1 << 16;
  auto store = CreateContractStore(
      {testing::TestTableSpec("adam", 6, 0, OptimizerKind::kAdam, 0.01f),
       testing::TestTableSpec("sgd", 4, 0, OptimizerKind::kSgd, 0.5f)},
      o);
  EXPECT_TRUE(store.ok()) << store.status();
  return *std::move(store);
}

using Rows = std::map<int64_t, std::vector<float>>;

Rows Export(const EmbeddingStore& s, int table, bool snapshot,
            uint64_t since = 0) {
  Rows out;
  for (uint32_t slot = 0; slot < kSlots; ++slot) {
    SlotCursor cursor;
    SlotChunk chunk;
    while (!cursor.done) {
      // Small chunks: the cursor must work across pre-images too.
      const absl::Status st =
          snapshot ? s.ExportSnapshotSlot(table, slot, since, &cursor, 3, &chunk)
                   : s.ExportSlot(table, slot, &cursor, 3, &chunk);
      EXPECT_TRUE(st.ok()) << st;
      if (!st.ok()) return out;
      for (size_t i = 0; i < chunk.ids.size(); ++i) {
        out[chunk.ids[i]].assign(chunk.rows.begin() + i * chunk.row_stride,
                                 chunk.rows.begin() + (i + 1) * chunk.row_stride);
      }
    }
  }
  return out;
}

void Push(EmbeddingStore& s, int table, const std::vector<int64_t>& ids,
          float g) {
  std::vector<float> grads(ids.size() * s.spec(table).dim, g);
  ASSERT_TRUE(s.ApplyGradients(table, ids, grads.data()).ok());
}

std::vector<int64_t> Range(int64_t b, int64_t e) {
  std::vector<int64_t> v;
  for (int64_t i = b; i < e; ++i) v.push_back(i);
  return v;
}

void ExpectSnapshotSurvivesWrites(EmbeddingStore& s) {
  Push(s, 0, Range(0, 200), 0.3f);
  Push(s, 1, Range(0, 100), -0.2f);
  const Rows cut0 = Export(s, 0, false);
  const Rows cut1 = Export(s, 1, false);
  ASSERT_TRUE(s.BeginSnapshot(1).ok());
  EXPECT_EQ(s.BeginSnapshot(2).code(), absl::StatusCode::kFailedPrecondition);
  // Writes after the cut: pushes (twice on some rows), new rows by lookup
  // and by push, an import overwriting rows.
  Push(s, 0, Range(50, 150), 0.7f);
  Push(s, 0, Range(100, 120), 0.1f);
  Push(s, 0, Range(1000, 1010), 0.1f);
  std::vector<float> out(20 * 4);
  ASSERT_TRUE(s.Lookup(1, Range(500, 520), out.data()).ok());
  SlotChunk chunk;
  SlotCursor cursor;
  ASSERT_TRUE(s.ExportSlot(1, 3, &cursor, 1000, &chunk).ok());
  for (float& f : chunk.rows) f = 0.5f;
  ASSERT_TRUE(s.ImportRows(1, 3, chunk.ids, chunk.rows.data()).ok());
  EXPECT_GT(s.SnapshotBytes(), 0);
  EXPECT_EQ(Export(s, 0, true), cut0);
  EXPECT_EQ(Export(s, 1, true), cut1);
  s.EndSnapshot();
  EXPECT_EQ(s.SnapshotBytes(), 0);
  SlotCursor fresh;
  EXPECT_EQ(s.ExportSnapshotSlot(0, 0, 0, &fresh, 1, &chunk).code(),
            absl::StatusCode::kFailedPrecondition);

  // An increment: rows changed since cut 1, as they are at cut 2.
  EXPECT_EQ(s.BeginSnapshot(1).code(), absl::StatusCode::kInvalidArgument);
  const Rows now0 = Export(s, 0, false);
  ASSERT_TRUE(s.BeginSnapshot(2).ok());
  Push(s, 0, Range(0, 300), 1.0f);  // after cut 2: not in it
  const Rows inc = Export(s, 0, true, /*since=*/1);
  Rows want;
  for (int64_t id : Range(50, 150)) want[id] = now0.at(id);
  for (int64_t id : Range(1000, 1010)) want[id] = now0.at(id);
  EXPECT_EQ(inc, want);
  EXPECT_EQ(Export(s, 0, true, 0), now0);
  s.EndSnapshot();
}

TEST(StoreSnapshotTest, HostStoreKeepsTheCutWhileWritesGoOn) {
  auto s = MakeStore();
  ExpectSnapshotSurvivesWrites(*s);
}

// Thousands of rows copied aside in one stripe (more than one block of
// pre-images): every cut value is still exported bit for bit.
TEST(StoreSnapshotTest, ManyPreImagesPerStripeKeepTheCut) {
  auto s = MakeStore();
  Push(*s, 0, Range(0, 40000), 0.3f);  // ~2500 rows per slot
  const Rows cut = Export(*s, 0, false);
  ASSERT_TRUE(s->BeginSnapshot(1).ok());
  Push(*s, 0, Range(0, 40000), 0.7f);
  Push(*s, 0, Range(0, 40000), -0.1f);  // second change: no second copy
  EXPECT_EQ(s->SnapshotBytes(),
            int64_t{40000} * s->Info(0).row_bytes);
  EXPECT_EQ(Export(*s, 0, true), cut);
  s->EndSnapshot();
  EXPECT_NE(Export(*s, 0, false), cut);
}

TEST(StoreSnapshotTest, LayeredStoreSpansItsLayers) {
  LayeredStore layered(MakeStore());
  ExpectSnapshotSurvivesWrites(layered);
  // A layer added after cut 2: its rows are newer than every cut.
  StoreOptions o;
  o.seed = 7;
  o.num_slots = kSlots;
  auto extra = CreateContractStore(
      {testing::TestTableSpec("late", 4, 0, OptimizerKind::kSgd, 0.5f)}, o);
  ASSERT_TRUE(extra.ok());
  ASSERT_TRUE(layered.Add(*std::move(extra)).ok());
  Push(layered, 2, Range(0, 10), 0.5f);
  ASSERT_TRUE(layered.BeginSnapshot(3).ok());
  EXPECT_EQ(Export(layered, 2, true, /*since=*/2).size(), 10u);
  layered.EndSnapshot();
}

TEST(StoreSnapshotTest, DropSlotKeepsGenerationsWithTheirRows) {
  auto s = MakeStore();
  Push(*s, 1, Range(0, 400), 0.2f);
  ASSERT_TRUE(s->BeginSnapshot(1).ok());
  s->EndSnapshot();
  Push(*s, 1, Range(0, 10), 0.2f);
  // Compaction moves rows from the end into the freed places.
  ASSERT_TRUE(s->DropSlot(1, 0).ok());
  ASSERT_TRUE(s->BeginSnapshot(2).ok());
  const Rows inc = Export(*s, 1, true, /*since=*/1);
  const Rows all = Export(*s, 1, false);
  for (const auto& [id, row] : inc) EXPECT_LT(id, 10);
  size_t touched_left = 0;
  for (int64_t id : Range(0, 10)) touched_left += all.count(id);
  EXPECT_EQ(inc.size(), touched_left);
  s->EndSnapshot();
}

// A slot dropped while a snapshot is open (the shard server defers drops
// until the snapshot ends; the store does not rely on it): rows move down
// into its places and keep their pre-images; rows made afterwards, in
// those places or past them, are new since the cut and have none.
TEST(StoreSnapshotTest, DropSlotDuringASnapshotKeepsTheCutOfTheOtherSlots) {
  auto s = MakeStore();
  Push(*s, 1, Range(0, 400), 0.2f);
  const Rows before = Export(*s, 1, false);
  SlotCursor cursor;
  SlotChunk slot0;
  ASSERT_TRUE(s->ExportSlot(1, 0, &cursor, 1000, &slot0).ok());
  ASSERT_FALSE(slot0.ids.empty());
  Rows want = before;
  for (int64_t id : slot0.ids) want.erase(id);
  ASSERT_TRUE(s->BeginSnapshot(1).ok());
  Push(*s, 1, Range(0, 200), 0.5f);  // half the rows copied aside
  ASSERT_TRUE(s->DropSlot(1, 0).ok());
  // Slot 0's ids come back as new rows, with others new since the cut.
  Push(*s, 1, Range(0, 400), 0.5f);
  Push(*s, 1, Range(1000, 1100), 0.3f);
  EXPECT_EQ(Export(*s, 1, true), want);
  s->EndSnapshot();
}

}  // namespace
}  // namespace recps::server
