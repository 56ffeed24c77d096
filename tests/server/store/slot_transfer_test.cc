// Tests of the store's slot transfer (ExportSlot, ImportRows; DropSlot is in
// slot_drop_test.cc), through the EmbeddingStore interface only. Expected
// values come from the test's own bookkeeping: which ids it touched, SlotOf of each, the initial
// row (common/row_init.h) and ReadRows, never from the transfer code.
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/store/slot_transfer_fixture.h"

namespace recps::server {
namespace {

using slot_transfer_testing::Spec;
using slot_transfer_testing::AllKinds;
using slot_transfer_testing::Options;
using slot_transfer_testing::MakeStore;
using slot_transfer_testing::Stride;
using slot_transfer_testing::SlotOfId;
using slot_transfer_testing::Train;
using slot_transfer_testing::ReadAll;
using slot_transfer_testing::BitEqual;
using slot_transfer_testing::Exported;
using slot_transfer_testing::ExportWhole;
using slot_transfer_testing::IdsOfSlot;
using slot_transfer_testing::SlotTransferTest;
using slot_transfer_testing::kSlots;
using ::recps::OptimizerKind;
using ::testing::HasSubstr;

TEST_F(SlotTransferTest, ExportImportGivesBitIdenticalRowsAndState) {
  CopyAToB(/*max_rows=*/1 << 20);
  ExpectIdentical("after the import");
  // The state really was carried: Adam rows hold a non-zero step count.
  const int adam = 3;
  const std::vector<float> rows = ReadAll(*b_, adam, ids_[adam]);
  uint32_t most_steps = 0;
  for (size_t p = 0; p < ids_[adam].size(); ++p) {
    uint32_t steps = 0;  // after w, m, v
    std::memcpy(&steps, &rows[p * Stride(*b_, adam) + 3 * 6], sizeof(steps));
    most_steps = std::max(most_steps, steps);
  }
  EXPECT_GE(most_steps, 3u);
  // Identical pushes keep them identical (optimizer state included).
  for (int t = 0; t < a_->num_tables(); ++t) {
    Train(*a_, t, ids_[t], 3, 100 + t);
    Train(*b_, t, ids_[t], 3, 100 + t);
  }
  ExpectIdentical("after more pushes");
}

// A bulk import sizes each slot's index once (IdIndex::Reserve) to exactly
// what row-by-row creation reaches, so the planner's memory estimate from
// row counts still holds after a restore; and it does so both for a whole
// slot at once and in small batches.
TEST_F(SlotTransferTest, BulkImportIndexIsSizedAsRowByRowCreation) {
  CopyAToB(/*max_rows=*/1 << 20);
  for (int t = 0; t < a_->num_tables(); ++t) {
    EXPECT_EQ(b_->Info(t).index_bytes, a_->Info(t).index_bytes)
        << a_->spec(t).name;
  }
  b_ = MakeStore(AllKinds());
  CopyAToB(/*max_rows=*/7);
  for (int t = 0; t < a_->num_tables(); ++t) {
    EXPECT_EQ(b_->Info(t).index_bytes, a_->Info(t).index_bytes)
        << a_->spec(t).name;
  }
  ExpectIdentical("after imports of 7 rows at a time");
}

// The import's branch-free validation takes -0.0 as >= 0 (second moments,
// Adagrad sums) and -0.0 or tiny negatives as finite weights, as the
// column-by-column check did.
TEST_F(SlotTransferTest, ImportAcceptsNegativeZeroStateAndSubnormals) {
  const uint32_t slot = 1;
  for (int t = 0; t < a_->num_tables(); ++t) {
    SCOPED_TRACE(a_->spec(t).name);
    Exported e = ExportWhole(*a_, t, slot, 1 << 20);
    ASSERT_FALSE(e.ids.empty());
    const int64_t stride = Stride(*a_, t);
    const int dim = a_->spec(t).dim;
    const int64_t used =
        dim + FusedRowStateWidth(a_->spec(t).optimizer.kind, dim);
    for (size_t p = 0; p < e.ids.size(); ++p) {
      float* row = e.rows.data() + p * stride;
      row[0] = -std::numeric_limits<float>::denorm_min();
      // Every state column -0.0, except Adam's step count (not a float).
      const bool adam = a_->spec(t).optimizer.kind == OptimizerKind::kAdam ||
                        a_->spec(t).optimizer.kind == OptimizerKind::kAdamW;
      const int64_t state_end = adam ? 3 * dim : used;
      for (int64_t c = dim; c < state_end; ++c) row[c] = -0.0f;
    }
    const absl::Status s = b_->ImportRows(t, slot, e.ids, e.rows.data());
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST_F(SlotTransferTest, SmallChunksGiveTheSameRowsInAscendingOrder) {
  for (int t = 0; t < a_->num_tables(); ++t) {
    for (uint32_t slot = 0; slot < kSlots; slot += 5) {
      const Exported whole = ExportWhole(*a_, t, slot, 1 << 20);
      EXPECT_EQ(whole.chunks, 1);
      for (int64_t max_rows : {1, 7, 64}) {
        const Exported chunked = ExportWhole(*a_, t, slot, max_rows);
        EXPECT_EQ(chunked.ids, whole.ids);
        EXPECT_TRUE(BitEqual(chunked.rows, whole.rows));
        // The last chunk may be full, then one more empty chunk says done.
        const int64_t n = static_cast<int64_t>(whole.ids.size());
        EXPECT_GE(chunked.chunks, (n + max_rows - 1) / max_rows);
        EXPECT_LE(chunked.chunks, n / max_rows + 1);
      }
      EXPECT_TRUE(std::is_sorted(whole.ids.begin(), whole.ids.end()));
      // Exported rows are what ReadRows says.
      EXPECT_TRUE(BitEqual(whole.rows, ReadAll(*a_, t, whole.ids)));
    }
  }
  CopyAToB(/*max_rows=*/3);
  ExpectIdentical("after a chunked import");
}

TEST_F(SlotTransferTest, ImportOverwritesAndLookupServesImportedWeights) {
  CopyAToB(1 << 20);
  // Push only to B, then import A's rows again: B is A again.
  for (int t = 0; t < b_->num_tables(); ++t) Train(*b_, t, ids_[t], 2, 55);
  CopyAToB(1 << 20);
  ExpectIdentical("after overwriting");
  const int t = 0;
  const std::vector<float> rows = ReadAll(*a_, t, ids_[t]);
  const int dim = a_->spec(t).dim;
  std::vector<float> out(ids_[t].size() * dim);
  ASSERT_TRUE(b_->Lookup(t, ids_[t], out.data()).ok());
  for (size_t p = 0; p < ids_[t].size(); ++p) {
    ASSERT_EQ(std::memcmp(&out[p * dim], &rows[p * Stride(*a_, t)],
                          dim * sizeof(float)),
              0)
        << p;
  }
}

TEST_F(SlotTransferTest, CursorResumesAndSeesRowsCreatedAboveIt) {
  const int t = 0;
  const uint32_t slot = 3;
  const std::vector<int64_t> before = IdsOfSlot(*a_, t, ids_[t], slot);
  ASSERT_GE(before.size(), 4u);
  SlotCursor cursor;
  SlotChunk chunk;
  ASSERT_TRUE(a_->ExportSlot(t, slot, &cursor, 2, &chunk).ok());
  EXPECT_EQ(chunk.ids,
            std::vector<int64_t>(before.begin(), before.begin() + 2));
  EXPECT_FALSE(cursor.done);
  // New ids of this slot: one below the cursor (missed by this export), one
  // above every id so far (seen).
  int64_t below = 0, above = 0;
  for (int64_t id = before[0] - 1; below == 0; --id) {
    if (SlotOfId(*a_, t, id) == slot) below = id;
  }
  for (int64_t id = before.back() + 1; above == 0; ++id) {
    if (SlotOfId(*a_, t, id) == slot) above = id;
  }
  std::vector<float> out(2 * a_->spec(t).dim);
  const std::vector<int64_t> fresh = {below, above};
  ASSERT_TRUE(a_->Lookup(t, fresh, out.data()).ok());
  std::vector<int64_t> rest;
  while (!cursor.done) {
    ASSERT_TRUE(a_->ExportSlot(t, slot, &cursor, 2, &chunk).ok());
    rest.insert(rest.end(), chunk.ids.begin(), chunk.ids.end());
  }
  std::vector<int64_t> expected(before.begin() + 2, before.end());
  expected.push_back(above);
  EXPECT_EQ(rest, expected);
  // A finished cursor gives empty chunks.
  ASSERT_TRUE(a_->ExportSlot(t, slot, &cursor, 2, &chunk).ok());
  EXPECT_TRUE(chunk.ids.empty());
}

TEST_F(SlotTransferTest, BadArgumentsAreRefused) {
  SlotCursor cursor;
  SlotChunk chunk;
  EXPECT_EQ(a_->ExportSlot(9, 0, &cursor, 10, &chunk).code(),
            absl::StatusCode::kNotFound);
  absl::Status s = a_->ExportSlot(0, kSlots, &cursor, 10, &chunk);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("slot ", kSlots)));
  s = a_->ExportSlot(0, 0, &cursor, 0, &chunk);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("max_rows"));
  EXPECT_EQ(a_->DropSlot(0, kSlots).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->DropSlot(9, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(cursor.started);
}

// Import validation: each bad import is refused with a message naming what
// is wrong, and leaves the store exactly as it was (the bad row comes last,
// so a partial import would show).
TEST_F(SlotTransferTest, BadImportsChangeNothing) {
  struct Case {
    int table;
    const char* what;
    // Breaks a valid import (ids and rows of one slot of `table`).
    std::function<void(std::vector<int64_t>&, std::vector<float>&, int64_t)>
        corrupt;
    std::vector<std::string> message;
    absl::StatusCode code = absl::StatusCode::kInvalidArgument;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const uint32_t slot = 2;
  std::vector<Case> cases = {
      {0, "NaN weight",
       [&](auto& ids, auto& rows, int64_t stride) {
         rows[(ids.size() - 1) * stride + 3] = nan;
       },
       {"'sgd'", "weight", "column 3", "position"}},
      {1, "negative Adagrad sum",
       [&](auto& ids, auto& rows, int64_t stride) {
         rows[(ids.size() - 1) * stride + 5 + 1] = -1;
       },
       {"'fixed'", "Adagrad sum of squares", "column 6"}},
      {2, "negative row-wise sum",
       [&](auto& ids, auto& rows, int64_t stride) {
         rows[(ids.size() - 1) * stride + 7] = -0.5f;
       },
       {"'rowwise'", "sum of mean squares"}},
      {3, "infinite Adam m",
       [&](auto& ids, auto& rows, int64_t stride) {
         rows[(ids.size() - 1) * stride + 6] = inf;
       },
       {"'adam'", "first moment"}},
      {3, "negative Adam v",
       [&](auto& ids, auto& rows, int64_t stride) {
         rows[(ids.size() - 1) * stride + 12 + 2] = -1e-3f;
       },
       {"'adam'", "second moment", "column 14"}},
      {0, "id of another slot",
       [&](auto& ids, auto&, int64_t) {
         int64_t id = ids.back() + 1;
         while (SlotOfId(*a_, 0, id) == slot) ++id;
         ids.back() = id;
       },
       {"belongs to slot", absl::StrCat("not to slot ", slot)}},
      {0, "repeated id",
       [&](auto& ids, auto&, int64_t) { ids.back() = ids.front(); },
       {"appears twice", "positions 0 and"}},
      {1, "id outside the fixed table",
       [&](auto& ids, auto&, int64_t) {
         int64_t id = 3000;
         while (SlotOfId(*a_, 1, id) != slot) ++id;
         ids.back() = id;
       },
       {"'fixed'", "outside [0, 3000)"}},
  };
  for (Case& c : cases) {
    SCOPED_TRACE(c.what);
    const int t = c.table;
    Exported e = ExportWhole(*a_, t, slot, 1 << 20);
    ASSERT_GE(e.ids.size(), 2u);
    // Valid changes first: every row's first weight moves, so a partial
    // import would be visible.
    const int64_t stride = Stride(*a_, t);
    for (size_t p = 0; p < e.ids.size(); ++p) e.rows[p * stride] += 1.0f;
    c.corrupt(e.ids, e.rows, stride);
    const std::vector<int64_t> per_slot = a_->RowsPerSlot();
    const int64_t rows_before = a_->Info(t).rows;
    const std::vector<float> before = ReadAll(*a_, t, ids_[t]);
    const absl::Status s = a_->ImportRows(t, slot, e.ids, e.rows.data());
    EXPECT_EQ(s.code(), c.code) << s;
    for (const std::string& m : c.message) {
      EXPECT_THAT(s.message(), HasSubstr(m));
    }
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("id ", e.ids.back())));
    EXPECT_EQ(a_->RowsPerSlot(), per_slot);
    EXPECT_EQ(a_->Info(t).rows, rows_before);
    EXPECT_TRUE(BitEqual(ReadAll(*a_, t, ids_[t]), before));
  }
}

TEST(SlotTransfer, ImportIntoAFullTableIsResourceExhaustedAndChangesNothing) {
  StoreOptions o = Options();
  o.max_rows_per_table = 100;
  auto store = MakeStore({Spec("dyn", 4, 0, OptimizerKind::kSgd, 0.1f)}, o);
  auto source = MakeStore({Spec("dyn", 4, 0, OptimizerKind::kSgd, 0.1f)});
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 90; ++id) ids.push_back(id);
  std::vector<float> out(ids.size() * 4);
  ASSERT_TRUE(store->Lookup(0, ids, out.data()).ok());
  // 20 new rows of one slot (and one that exists: an overwrite).
  const uint32_t slot = SlotOfId(*store, 0, 0);
  std::vector<int64_t> more = {0};
  for (int64_t id = 1000; more.size() < 21; ++id) {
    if (SlotOfId(*store, 0, id) == slot) more.push_back(id);
  }
  std::vector<float> rows(more.size() * 4);
  ASSERT_TRUE(source->Lookup(0, more, rows.data()).ok());
  for (float& v : rows) v += 1;
  const std::vector<int64_t> per_slot = store->RowsPerSlot();
  const std::vector<float> before = ReadAll(*store, 0, ids);
  const absl::Status s = store->ImportRows(0, slot, more, rows.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("'dyn' is full"));
  EXPECT_THAT(s.message(), HasSubstr("20 new rows"));
  EXPECT_EQ(store->RowsPerSlot(), per_slot);
  EXPECT_EQ(store->Info(0).rows, 90);
  EXPECT_TRUE(BitEqual(ReadAll(*store, 0, ids), before));
  // Ten fit.
  more.resize(11);
  EXPECT_TRUE(store->ImportRows(0, slot, more, rows.data()).ok());
  EXPECT_EQ(store->Info(0).rows, 100);
}

}  // namespace
}  // namespace recps::server
