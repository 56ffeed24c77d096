// Tests of the store's slot transfer (ExportSlot, ImportRows, DropSlot),
// through the EmbeddingStore interface only. Expected values come from the
// test's own bookkeeping: which ids it touched, SlotOf of each, the initial
// row (common/row_init.h) and ReadRows, never from the transfer code.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/hashing.h"
#include "common/row_init.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/table_specs.h"
#include "kernels/embedding_optimizer.h"
#include "server/shard/embedding_store.h"
#include "server/shard/layered_store.h"

namespace recps::server {
namespace {

using ::recps::kernels::OptimizerKind;
using ::testing::HasSubstr;

constexpr uint64_t kSeed = 7;
constexpr uint32_t kSlots = 16;

config::TableSpec Spec(std::string name, int dim, int64_t num_rows = 0,
                       OptimizerKind kind = OptimizerKind::kSgd, float lr = 0.5f) {
  return testing::TestTableSpec(std::move(name), dim, num_rows, kind, lr);
}

// One table per optimizer kind; "fixed" has num_rows, the others are
// dynamic.
std::vector<config::TableSpec> AllKinds() {
  return {Spec("sgd", 8, 0, OptimizerKind::kSgd, 0.5f),
          Spec("fixed", 5, 3000, OptimizerKind::kAdagrad, 0.1f),
          Spec("rowwise", 7, 0, OptimizerKind::kRowWiseAdagrad, 0.2f),
          Spec("adam", 6, 0, OptimizerKind::kAdam, 0.01f)};
}

StoreOptions Options(uint32_t num_slots = kSlots) {
  StoreOptions o;
  o.seed = kSeed;
  o.num_slots = num_slots;
  o.max_rows_per_table = 1 << 20;
  return o;
}

std::unique_ptr<EmbeddingStore> MakeStore(std::vector<config::TableSpec> specs,
                                          StoreOptions options = Options()) {
  auto store = CreateHostEmbeddingStore(std::move(specs), options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

int64_t Stride(const EmbeddingStore& s, int table) {
  return kernels::FusedRowStride(s.spec(table).optimizer.kind,
                                 s.spec(table).dim);
}

uint32_t SlotOfId(const EmbeddingStore& s, int table, int64_t id,
                  uint32_t num_slots = kSlots) {
  return SlotOf(StableNameKey(s.spec(table).name), id, num_slots);
}

std::vector<float> Initial(const EmbeddingStore& s, int table, int64_t id) {
  const config::TableSpec& spec = s.spec(table);
  std::vector<float> w(spec.dim);
  InitRow(spec.init, kSeed, StableNameKey(spec.name), id, spec.dim, w.data());
  return w;
}

// The ids the workload touches in `table`: spread over the int64 range for
// dynamic tables (negative ones too), [0, num_rows) for fixed ones.
std::vector<int64_t> Ids(const EmbeddingStore& s, int table, int n) {
  std::vector<int64_t> ids;
  const int64_t num_rows = s.spec(table).num_rows;
  for (int k = 0; k < n; ++k) {
    ids.push_back(num_rows > 0 ? (k * 7) % num_rows
                               : (k % 2 == 0 ? 1 : -1) * (k * 1000003LL + 11));
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

float Grad(int64_t id, int step, int j) {
  return static_cast<float>(((id * 31 + step * 7 + j) % 17 + 17) % 17 - 8) *
         0.01f;
}

// `steps` rounds of: look up a shuffled half of `ids`, push gradients for
// them. Deterministic: two stores given the same calls end identical.
void Train(EmbeddingStore& store, int table, const std::vector<int64_t>& ids,
           int steps, uint32_t rng_seed) {
  std::mt19937 rng(rng_seed);
  const int dim = store.spec(table).dim;
  {
    // Every id gets a row.
    std::vector<float> out(ids.size() * dim);
    ASSERT_TRUE(store.Lookup(table, ids, out.data()).ok());
  }
  for (int step = 0; step < steps; ++step) {
    std::vector<int64_t> batch = ids;
    std::shuffle(batch.begin(), batch.end(), rng);
    batch.resize(std::max<size_t>(1, batch.size() / 2));
    std::vector<float> out(batch.size() * dim), g(batch.size() * dim);
    ASSERT_TRUE(store.Lookup(table, batch, out.data()).ok());
    for (size_t p = 0; p < batch.size(); ++p) {
      for (int j = 0; j < dim; ++j) g[p * dim + j] = Grad(batch[p], step, j);
    }
    ASSERT_TRUE(store.ValidateGradients(table, batch, g.data()).ok());
    ASSERT_TRUE(store.ApplyGradients(table, batch, g.data()).ok());
  }
}

std::vector<float> ReadAll(const EmbeddingStore& store, int table,
                           const std::vector<int64_t>& ids) {
  std::vector<float> rows(ids.size() * Stride(store, table));
  const absl::Status s = store.ReadRows(table, ids, rows.data());
  EXPECT_TRUE(s.ok()) << s;
  return rows;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Exported {
  std::vector<int64_t> ids;
  std::vector<float> rows;
  int chunks = 0;
};

// The whole slot, chunk after chunk; checks every chunk's bounds and order.
Exported ExportWhole(const EmbeddingStore& store, int table, uint32_t slot,
                     int64_t max_rows) {
  Exported e;
  SlotCursor cursor;
  while (!cursor.done) {
    SlotChunk chunk;
    const absl::Status s =
        store.ExportSlot(table, slot, &cursor, max_rows, &chunk);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) break;
    EXPECT_EQ(chunk.row_stride, Stride(store, table));
    EXPECT_LE(static_cast<int64_t>(chunk.ids.size()), max_rows);
    EXPECT_EQ(chunk.rows.size(), chunk.ids.size() * chunk.row_stride);
    for (size_t k = 0; k < chunk.ids.size(); ++k) {
      if (!e.ids.empty() || k > 0) {
        const int64_t prev = k > 0 ? chunk.ids[k - 1] : e.ids.back();
        EXPECT_LT(prev, chunk.ids[k]) << "slot " << slot << " chunk "
                                      << e.chunks;
      }
    }
    if (!chunk.ids.empty()) {
      EXPECT_EQ(cursor.last_id, chunk.ids.back());
    }
    e.ids.insert(e.ids.end(), chunk.ids.begin(), chunk.ids.end());
    e.rows.insert(e.rows.end(), chunk.rows.begin(), chunk.rows.end());
    ++e.chunks;
    if (e.chunks > 1000000) {
      ADD_FAILURE() << "export of slot " << slot << " does not end";
      break;
    }
  }
  return e;
}

// ids of `ids` whose slot is `slot`, ascending.
std::vector<int64_t> IdsOfSlot(const EmbeddingStore& store, int table,
                               const std::vector<int64_t>& ids, uint32_t slot,
                               uint32_t num_slots = kSlots) {
  std::vector<int64_t> out;
  for (int64_t id : ids) {
    if (SlotOfId(store, table, id, num_slots) == slot) out.push_back(id);
  }
  std::sort(out.begin(), out.end());
  return out;
}

int64_t ResidentBytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  const int n = std::fscanf(f, "%ld %ld", &pages, &resident);
  std::fclose(f);
  return n == 2 ? static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE) : -1;
}

// Store A after training, store B empty with the same specs.
class SlotTransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = MakeStore(AllKinds());
    b_ = MakeStore(AllKinds());
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    for (int t = 0; t < a_->num_tables(); ++t) {
      ids_.push_back(Ids(*a_, t, 1500));
      Train(*a_, t, ids_[t], /*steps=*/6, /*rng_seed=*/t + 1);
    }
  }

  // Exports every slot of every table of A in chunks of max_rows and
  // imports them into B.
  void CopyAToB(int64_t max_rows) {
    for (int t = 0; t < a_->num_tables(); ++t) {
      for (uint32_t slot = 0; slot < kSlots; ++slot) {
        const Exported e = ExportWhole(*a_, t, slot, max_rows);
        ASSERT_EQ(e.ids, IdsOfSlot(*a_, t, ids_[t], slot))
            << a_->spec(t).name << " slot " << slot;
        const absl::Status s =
            b_->ImportRows(t, slot, e.ids, e.rows.data());
        ASSERT_TRUE(s.ok()) << s;
      }
    }
  }

  void ExpectIdentical(const char* when) {
    for (int t = 0; t < a_->num_tables(); ++t) {
      EXPECT_TRUE(BitEqual(ReadAll(*a_, t, ids_[t]), ReadAll(*b_, t, ids_[t])))
          << a_->spec(t).name << " " << when;
      EXPECT_EQ(a_->Info(t).rows, b_->Info(t).rows) << when;
    }
    EXPECT_EQ(a_->RowsPerSlot(), b_->RowsPerSlot()) << when;
  }

  std::unique_ptr<EmbeddingStore> a_, b_;
  std::vector<std::vector<int64_t>> ids_;  // per table, ascending
};

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
        dim + kernels::FusedRowStateWidth(a_->spec(t).optimizer.kind, dim);
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

TEST_F(SlotTransferTest, DropSlotRemovesItsRowsAndKeepsTheOthers) {
  std::vector<std::vector<float>> before;
  for (int t = 0; t < a_->num_tables(); ++t) {
    before.push_back(ReadAll(*a_, t, ids_[t]));
  }
  const uint32_t dropped_slot = 5;
  int64_t expected = 0;
  for (int t = 0; t < a_->num_tables(); ++t) {
    expected += IdsOfSlot(*a_, t, ids_[t], dropped_slot).size();
  }
  ASSERT_GT(expected, 0);
  const std::vector<int64_t> per_slot = a_->RowsPerSlot();
  EXPECT_EQ(per_slot[dropped_slot], expected);
  auto dropped = a_->DropSlot(EmbeddingStore::kAllTables, dropped_slot);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(*dropped, expected);
  const std::vector<int64_t> after = a_->RowsPerSlot();
  EXPECT_EQ(after[dropped_slot], 0);
  for (uint32_t s = 0; s < kSlots; ++s) {
    if (s != dropped_slot) {
      EXPECT_EQ(after[s], per_slot[s]) << s;
    }
  }
  for (int t = 0; t < a_->num_tables(); ++t) {
    SCOPED_TRACE(a_->spec(t).name);
    const int64_t stride = Stride(*a_, t);
    std::vector<int64_t> kept, gone;
    std::vector<float> kept_rows;
    for (size_t p = 0; p < ids_[t].size(); ++p) {
      if (SlotOfId(*a_, t, ids_[t][p]) == dropped_slot) {
        gone.push_back(ids_[t][p]);
      } else {
        kept.push_back(ids_[t][p]);
        kept_rows.insert(kept_rows.end(), before[t].begin() + p * stride,
                         before[t].begin() + (p + 1) * stride);
      }
    }
    EXPECT_EQ(a_->Info(t).rows, static_cast<int64_t>(kept.size()));
    EXPECT_TRUE(BitEqual(ReadAll(*a_, t, kept), kept_rows));
    std::vector<float> row(stride);
    const std::vector<int64_t> one = {gone[0]};
    EXPECT_EQ(a_->ReadRows(t, one, row.data()).code(),
              absl::StatusCode::kNotFound);
    SlotChunk chunk;
    SlotCursor cursor;
    ASSERT_TRUE(a_->ExportSlot(t, dropped_slot, &cursor, 10, &chunk).ok());
    EXPECT_TRUE(chunk.ids.empty());
    EXPECT_TRUE(cursor.done);
    // A dropped id starts again from its initial value, with fresh state.
    const int dim = a_->spec(t).dim;
    std::vector<float> out(gone.size() * dim);
    ASSERT_TRUE(a_->Lookup(t, gone, out.data()).ok());
    for (size_t p = 0; p < gone.size(); ++p) {
      const std::vector<float> w = Initial(*a_, t, gone[p]);
      ASSERT_EQ(std::memcmp(&out[p * dim], w.data(), dim * sizeof(float)), 0)
          << gone[p];
    }
    const std::vector<float> fresh = ReadAll(*a_, t, gone);
    for (size_t p = 0; p < gone.size(); ++p) {
      for (int64_t c = dim; c < stride; ++c) {
        ASSERT_EQ(fresh[p * stride + c], 0.0f) << gone[p] << " column " << c;
      }
    }
    // And the kept rows are still as they were.
    EXPECT_TRUE(BitEqual(ReadAll(*a_, t, kept), kept_rows));
  }
  EXPECT_EQ(a_->RowsPerSlot(), per_slot);
}

TEST_F(SlotTransferTest, DroppingEverySlotOneByOneKeepsTheRest) {
  std::vector<std::vector<float>> before;
  for (int t = 0; t < a_->num_tables(); ++t) {
    before.push_back(ReadAll(*a_, t, ids_[t]));
  }
  // Per table this time, every slot in a scattered order.
  for (uint32_t k = 0; k < kSlots; ++k) {
    const uint32_t slot = (k * 7 + 3) % kSlots;
    for (int t = 0; t < a_->num_tables(); ++t) {
      auto n = a_->DropSlot(t, slot);
      ASSERT_TRUE(n.ok()) << n.status();
      EXPECT_EQ(*n, static_cast<int64_t>(
                        IdsOfSlot(*a_, t, ids_[t], slot).size()));
      EXPECT_EQ(*a_->DropSlot(t, slot), 0);  // twice: nothing left
      // Every row of a slot not dropped yet is intact.
      const int64_t stride = Stride(*a_, t);
      std::vector<int64_t> kept;
      std::vector<float> kept_rows;
      for (size_t p = 0; p < ids_[t].size(); ++p) {
        const uint32_t s = SlotOfId(*a_, t, ids_[t][p]);
        bool gone = false;
        for (uint32_t j = 0; j <= k; ++j) gone |= s == (j * 7 + 3) % kSlots;
        if (gone) continue;
        kept.push_back(ids_[t][p]);
        kept_rows.insert(kept_rows.end(), before[t].begin() + p * stride,
                         before[t].begin() + (p + 1) * stride);
      }
      ASSERT_TRUE(BitEqual(ReadAll(*a_, t, kept), kept_rows))
          << a_->spec(t).name << " after dropping slot " << slot;
      EXPECT_EQ(a_->Info(t).rows, static_cast<int64_t>(kept.size()));
    }
  }
  for (int t = 0; t < a_->num_tables(); ++t) EXPECT_EQ(a_->Info(t).rows, 0);
  for (int64_t n : a_->RowsPerSlot()) EXPECT_EQ(n, 0);
  for (uint32_t slot = 0; slot < kSlots; ++slot) {
    EXPECT_TRUE(ExportWhole(*a_, 0, slot, 10).ids.empty());
  }
  // The emptied store takes rows again.
  Train(*a_, 0, ids_[0], 2, 9);
  EXPECT_EQ(a_->Info(0).rows, static_cast<int64_t>(ids_[0].size()));
}

// Export and drop while two threads look up and push on the same slots.
// The SGD table is pushed only gradients of -1 (lr 1), so every column of
// a whole row has moved by the same integer: a torn row would show. Adam
// rows must keep finite m, v >= 0 and a step count no larger than the
// pushes made.
TEST(SlotTransfer, ExportAndDropWhileServing) {
  std::vector<config::TableSpec> specs = {
      Spec("sgd", 16, 0, OptimizerKind::kSgd, 1.0f),
      Spec("adam", 8, 0, OptimizerKind::kAdam, 0.01f)};
  auto store = MakeStore(specs);
  const int kIds = 4000;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> pushes{0};
  auto worker = [&](uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int64_t> pick(0, kIds - 1);
    std::vector<float> out(256 * 16), grads(256 * 16, -1.0f);
    int rounds = 0;
    while (!stop.load() || rounds < 20) {
      for (int t = 0; t < 2; ++t) {
        std::set<int64_t> distinct;
        while (distinct.size() < 256) distinct.insert(pick(rng));
        const std::vector<int64_t> ids(distinct.begin(), distinct.end());
        ASSERT_TRUE(store->Lookup(t, ids, out.data()).ok());
        ASSERT_TRUE(store->ApplyGradients(t, ids, grads.data()).ok());
      }
      pushes.fetch_add(1);
      ++rounds;
    }
  };
  auto check_sgd_row = [&](int64_t id, const float* row) {
    const std::vector<float> w = Initial(*store, 0, id);
    const double moved = std::round(row[0] - w[0]);
    for (int j = 0; j < 16; ++j) {
      ASSERT_EQ(std::round(row[j] - w[j]), moved)
          << "id " << id << " column " << j << ": a torn row";
    }
  };
  std::thread w1(worker, 1), w2(worker, 2);
  int64_t exported = 0;
  // Until the workers have pushed a good many times during the exports.
  for (int round = 0; round < 4 || pushes.load() < 300; ++round) {
    ASSERT_LT(round, 100000) << "the workers do not get on";
    for (uint32_t slot = 0; slot < kSlots; ++slot) {
      for (int t = 0; t < 2; ++t) {
        SlotCursor cursor;
        int64_t last = std::numeric_limits<int64_t>::min();
        while (!cursor.done) {
          SlotChunk chunk;
          ASSERT_TRUE(store->ExportSlot(t, slot, &cursor, 16, &chunk).ok());
          for (size_t k = 0; k < chunk.ids.size(); ++k) {
            const int64_t id = chunk.ids[k];
            const float* row = &chunk.rows[k * chunk.row_stride];
            ASSERT_GT(id, last);
            last = id;
            ASSERT_EQ(SlotOfId(*store, t, id), slot);
            ++exported;
            if (t == 0) {
              check_sgd_row(id, row);
              continue;
            }
            for (int j = 0; j < 8; ++j) {
              ASSERT_TRUE(std::isfinite(row[j]) && std::isfinite(row[8 + j]));
              ASSERT_GE(row[16 + j], 0.0f);
            }
            uint32_t steps;
            std::memcpy(&steps, &row[24], sizeof(steps));
            ASSERT_LE(steps, static_cast<uint32_t>(pushes.load() + 2));
          }
        }
      }
    }
    // Drops compact the arena under the workers' feet.
    ASSERT_TRUE(
        store->DropSlot(EmbeddingStore::kAllTables, (round * 3) % kSlots)
            .ok());
  }
  stop.store(true);
  w1.join();
  w2.join();
  EXPECT_GT(exported, 0);
  std::printf("%lld rows exported during %lld pushes\n",
              static_cast<long long>(exported),
              static_cast<long long>(pushes.load()));
  // Every row left is whole.
  std::vector<int64_t> all(kIds);
  for (int64_t id = 0; id < kIds; ++id) all[id] = id;
  for (int64_t id : all) {
    std::vector<float> row(16);
    const std::vector<int64_t> one = {id};
    if (store->ReadRows(0, one, row.data()).ok()) check_sgd_row(id, row.data());
  }
  int64_t total = 0;
  for (int64_t n : store->RowsPerSlot()) total += n;
  EXPECT_EQ(total, store->Info(0).rows + store->Info(1).rows);
}

// A large drop gives its memory back: 200k rows of dim 64 (~51 MB of rows).
TEST(SlotTransfer, DropReturnsMemory) {
#if defined(RECPS_DEVICE_STORE_CONTRACT)
  GTEST_SKIP() << "host store only: the device store keeps its arena allocated whole (GPU memory)";
#endif
  constexpr uint32_t kTwoSlots = 2;
  auto store = MakeStore({Spec("big", 64, 0, OptimizerKind::kSgd, 0.1f)},
                         Options(kTwoSlots));
  constexpr int64_t kRows = 400000;
  std::vector<int64_t> ids(kRows);
  for (int64_t id = 0; id < kRows; ++id) ids[id] = id;
  std::vector<float> out(64 * 8192);
  for (int64_t begin = 0; begin < kRows; begin += 8192) {
    const int64_t n = std::min<int64_t>(8192, kRows - begin);
    ASSERT_TRUE(store
                    ->Lookup(0, absl::MakeConstSpan(ids).subspan(begin, n),
                             out.data())
                    .ok());
  }
  const std::vector<int64_t> kept = IdsOfSlot(*store, 0, ids, 1, kTwoSlots);
  const std::vector<float> kept_rows = ReadAll(*store, 0, kept);
  const int64_t dropped_rows = store->RowsPerSlot()[0];
  ASSERT_GT(dropped_rows, 150000);
  const int64_t row_bytes = store->Info(0).row_bytes;
  ASSERT_EQ(row_bytes, 64 * 4);
  const int64_t rss_before = ResidentBytes();
  auto dropped = store->DropSlot(0, 0);
  const int64_t rss_after = ResidentBytes();
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(*dropped, dropped_rows);
  ASSERT_GT(rss_before, 0);
  const int64_t freed = rss_before - rss_after;
  const int64_t expected = dropped_rows * row_bytes;
  std::printf("dropped %lld rows (%lld row bytes): RSS %lld -> %lld MB, "
              "%lld MB returned\n",
              static_cast<long long>(dropped_rows),
              static_cast<long long>(expected),
              static_cast<long long>(rss_before >> 20),
              static_cast<long long>(rss_after >> 20),
              static_cast<long long>(freed >> 20));
  EXPECT_GE(freed, expected * 9 / 10);
  EXPECT_EQ(store->RowsPerSlot()[0], 0);
  EXPECT_EQ(store->Info(0).rows, kRows - dropped_rows);
  EXPECT_TRUE(BitEqual(ReadAll(*store, 0, kept), kept_rows));
}

// LayeredStore hands each call to the store that holds the table.
TEST(SlotTransfer, LayeredStoreDelegates) {
  LayeredStore layered(MakeStore({Spec("base", 4, 0, OptimizerKind::kSgd, 1)}));
  ASSERT_TRUE(
      layered
          .Add(MakeStore({Spec("added", 6, 0, OptimizerKind::kAdam, 0.1f)}))
          .ok());
  auto plain = MakeStore({Spec("added", 6, 0, OptimizerKind::kAdam, 0.1f)});
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 200; ++id) ids.push_back(id);
  for (int t = 0; t < 2; ++t) Train(layered, t, ids, 2, 3);
  Train(*plain, 0, ids, 2, 3);
  // Export from the added table of the layered store into a plain store.
  auto copy = MakeStore({Spec("added", 6, 0, OptimizerKind::kAdam, 0.1f)});
  for (uint32_t slot = 0; slot < kSlots; ++slot) {
    const Exported e = ExportWhole(layered, 1, slot, 16);
    ASSERT_TRUE(copy->ImportRows(0, slot, e.ids, e.rows.data()).ok());
  }
  EXPECT_TRUE(BitEqual(ReadAll(*copy, 0, ids), ReadAll(*plain, 0, ids)));
  // And back into the layered store, after dropping it there.
  const uint32_t slot = SlotOfId(layered, 1, 0);
  const int64_t in_both = layered.RowsPerSlot()[slot];
  auto n = layered.DropSlot(EmbeddingStore::kAllTables, slot);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, in_both);
  EXPECT_EQ(layered.RowsPerSlot()[slot], 0);
  const Exported e = ExportWhole(*copy, 0, slot, 1000);
  ASSERT_TRUE(layered.ImportRows(1, slot, e.ids, e.rows.data()).ok());
  EXPECT_TRUE(BitEqual(ReadAll(layered, 1, ids), ReadAll(*plain, 0, ids)));
  EXPECT_EQ(layered.ImportRows(2, 0, e.ids, e.rows.data()).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(layered.DropSlot(2, 0).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace recps::server
