// Tests of the store's DropSlot (and of slot transfer while serving and
// through a LayeredStore), through the EmbeddingStore interface only, with
// the helpers of slot_transfer_fixture.h.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/layered_store.h"
#include "tests/server/store/contract_store.h"
#include "tests/server/store/slot_transfer_fixture.h"

namespace recps::server {
namespace {

using slot_transfer_testing::Spec;
using slot_transfer_testing::Options;
using slot_transfer_testing::MakeStore;
using slot_transfer_testing::Stride;
using slot_transfer_testing::SlotOfId;
using slot_transfer_testing::Initial;
using slot_transfer_testing::Train;
using slot_transfer_testing::ReadAll;
using slot_transfer_testing::BitEqual;
using slot_transfer_testing::Exported;
using slot_transfer_testing::ExportWhole;
using slot_transfer_testing::IdsOfSlot;
using slot_transfer_testing::ResidentBytes;
using slot_transfer_testing::SlotTransferTest;
using slot_transfer_testing::kSlots;
using ::recps::OptimizerKind;

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
  if (!ContractStoreIsHostStore()) GTEST_SKIP() << "host store only: the device store keeps its arena allocated whole (GPU memory)";
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
