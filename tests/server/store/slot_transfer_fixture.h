// The slot-transfer tests' helpers (slot_transfer_test.cc and
// slot_drop_test.cc): stores of one table per optimizer kind, trained with
// deterministic gradients, and what the tests compare them with (initial
// rows, every row read back, whole-slot exports). They go through the
// EmbeddingStore interface only, on the store contract_store.h names (the
// host store, or the device store's CPU twin).
#ifndef RECPS_TESTS_SERVER_SHARD_SLOT_TRANSFER_FIXTURE_H_
#define RECPS_TESTS_SERVER_SHARD_SLOT_TRANSFER_FIXTURE_H_

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
#include "tests/server/store/contract_store.h"
#include "tests/testing/resident_memory.h"
#include "tests/testing/table_specs.h"
#include "kernels/embedding_optimizer.h"
#include "server/store/embedding_store.h"
#include "server/store/layered_store.h"

namespace recps::server::slot_transfer_testing {

using ::recps::OptimizerKind;
using ::testing::HasSubstr;

inline constexpr uint64_t kSeed = 7;
inline constexpr uint32_t kSlots = 16;

inline config::TableSpec Spec(std::string name, int dim, int64_t num_rows = 0,
                       OptimizerKind kind = OptimizerKind::kSgd, float lr = 0.5f) {
  return testing::TestTableSpec(std::move(name), dim, num_rows, kind, lr);
}

// One table per optimizer kind; "fixed" has num_rows, the others are
// dynamic.
inline std::vector<config::TableSpec> AllKinds() {
  return {Spec("sgd", 8, 0, OptimizerKind::kSgd, 0.5f),
          Spec("fixed", 5, 3000, OptimizerKind::kAdagrad, 0.1f),
          Spec("rowwise", 7, 0, OptimizerKind::kRowWiseAdagrad, 0.2f),
          Spec("adam", 6, 0, OptimizerKind::kAdam, 0.01f)};
}

inline StoreOptions Options(uint32_t num_slots = kSlots) {
  StoreOptions o;
  o.seed = kSeed;
  o.num_slots = num_slots;
  o.max_rows_per_table = 1 << 20;
  return o;
}

inline std::unique_ptr<EmbeddingStore> MakeStore(std::vector<config::TableSpec> specs,
                                          StoreOptions options = Options()) {
  auto store = CreateContractStore(std::move(specs), options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

inline int64_t Stride(const EmbeddingStore& s, int table) {
  return FusedRowStride(s.spec(table).optimizer.kind,
                                 s.spec(table).dim);
}

inline uint32_t SlotOfId(const EmbeddingStore& s, int table, int64_t id,
                  uint32_t num_slots = kSlots) {
  return SlotOf(StableNameKey(s.spec(table).name), id, num_slots);
}

inline std::vector<float> Initial(const EmbeddingStore& s, int table, int64_t id) {
  const config::TableSpec& spec = s.spec(table);
  std::vector<float> w(spec.dim);
  InitRow(spec.init, kSeed, StableNameKey(spec.name), id, spec.dim, w.data());
  return w;
}

// The ids the workload touches in `table`: spread over the int64 range for
// dynamic tables (negative ones too), [0, num_rows) for fixed ones.
inline std::vector<int64_t> Ids(const EmbeddingStore& s, int table, int n) {
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

inline float Grad(int64_t id, int step, int j) {
  return static_cast<float>(((id * 31 + step * 7 + j) % 17 + 17) % 17 - 8) *
         0.01f;
}

// `steps` rounds of: look up a shuffled half of `ids`, push gradients for
// them. Deterministic: two stores given the same calls end identical.
inline void Train(EmbeddingStore& store, int table, const std::vector<int64_t>& ids,
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

inline std::vector<float> ReadAll(const EmbeddingStore& store, int table,
                           const std::vector<int64_t>& ids) {
  std::vector<float> rows(ids.size() * Stride(store, table));
  const absl::Status s = store.ReadRows(table, ids, rows.data());
  EXPECT_TRUE(s.ok()) << s;
  return rows;
}

inline bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Exported {
  std::vector<int64_t> ids;
  std::vector<float> rows;
  int chunks = 0;
};

// The whole slot, chunk after chunk; checks every chunk's bounds and order.
inline Exported ExportWhole(const EmbeddingStore& store, int table, uint32_t slot,
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
inline std::vector<int64_t> IdsOfSlot(const EmbeddingStore& store, int table,
                               const std::vector<int64_t>& ids, uint32_t slot,
                               uint32_t num_slots = kSlots) {
  std::vector<int64_t> out;
  for (int64_t id : ids) {
    if (SlotOfId(store, table, id, num_slots) == slot) out.push_back(id);
  }
  std::sort(out.begin(), out.end());
  return out;
}

using ::recps::testing::ResidentBytes;

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

}  // namespace recps::server::slot_transfer_testing

#endif  // RECPS_TESTS_SERVER_SHARD_SLOT_TRANSFER_FIXTURE_H_
