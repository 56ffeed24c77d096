// The cost model's parts: row bytes, index bytes, distinct ids, loads and
// step time, against the shard server's own layout.
#include "server/planner/cost_model.h"

#include <cmath>

#include "gtest/gtest.h"
#include "kernels/embedding_optimizer.h"
#include "server/store/store_footprint.h"
#include "server/store/id_index.h"
#include "server/planner/table_model.h"

namespace recps::planner {
namespace {

using ::recps::OptimizerKind;

TEST(CostModel, StoredRowBytesIsTheStoresFusedRow) {
  for (OptimizerKind k : {OptimizerKind::kSgd, OptimizerKind::kAdagrad,
                          OptimizerKind::kRowWiseAdagrad, OptimizerKind::kAdam,
                          OptimizerKind::kAdamW}) {
    for (int dim : {1, 3, 16, 64, 129}) {
      EXPECT_EQ(StoredRowBytes(k, dim, v1::FP32),
                FusedRowStride(k, dim) * 4)
          << OptimizerName(k) << " dim " << dim;
      // Rows pad to 16 bytes, so narrow rows may not shrink.
      EXPECT_LE(StoredRowBytes(k, dim, v1::FP16),
                StoredRowBytes(k, dim, v1::FP32));
      // The store's own formula (TableInfo.row_bytes), bf16 as fp16.
      EXPECT_EQ(StoredRowBytes(k, dim, v1::FP16),
                server::HostRowBytes(k, dim, RowPrecision::kFp16));
      EXPECT_EQ(StoredRowBytes(k, dim, v1::BF16),
                StoredRowBytes(k, dim, v1::FP16));
      if (dim >= 16) {
        EXPECT_LT(StoredRowBytes(k, dim, v1::FP16),
                  StoredRowBytes(k, dim, v1::FP32));
      }
    }
  }
  // SGD keeps weights only; Adagrad doubles them.
  EXPECT_EQ(StoredRowBytes(OptimizerKind::kSgd, 16, v1::FP32), 64);
  EXPECT_EQ(StoredRowBytes(OptimizerKind::kAdagrad, 16, v1::FP32), 128);
  EXPECT_EQ(WeightRowBytes(16, v1::FP16), 32);
}

TEST(CostModel, IndexBytesFollowTheRealIndexGrowth) {
  server::IdIndex index;
  for (int64_t n = 1; n <= 5000; ++n) {
    index.FindOrInsert(n * 7919, [&] { return n; });
    ASSERT_EQ(server::HostIndexBytesForRows(n),
              server::HostIndexAllocBytes(index.capacity()))
        << "rows " << n << " capacity " << index.capacity();
  }
  EXPECT_EQ(server::HostIndexBytesForRows(0), 0);
}

TEST(CostModel, ExpectedIndexBytesAveragesOverPoissonSlots) {
  EXPECT_EQ(ExpectedIndexBytesPerSlot(0), 0);
  // Far from a growth step (capacity 256 holds 90..179 rows) the average
  // is that step's size.
  const double at_130 = ExpectedIndexBytesPerSlot(130);
  EXPECT_NEAR(at_130,
              server::HostIndexBytesForRows(130) + server::HostRowIdBytes(130),
              0.01 * at_130);
  // Huge means are sampled, still within a percent of the step they sit on
  // (capacity 2^30 holds 375,809,639..751,619,276 rows).
  const double huge = ExpectedIndexBytesPerSlot(7e8);
  EXPECT_NEAR(huge,
              server::HostIndexBytesForRows(700000000) +
                  server::HostRowIdBytes(700000000),
              0.01 * huge);
  // It grows with the rows.
  EXPECT_LT(ExpectedIndexBytesPerSlot(10), ExpectedIndexBytesPerSlot(40));
}

TEST(CostModel, ExpectedDistinctSaturatesAtTheRowCount) {
  EXPECT_NEAR(ExpectedDistinct(10, 1e9), 10, 1e-6);
  EXPECT_NEAR(ExpectedDistinct(1e6, 100), 100, 1e-6);
  EXPECT_NEAR(ExpectedDistinct(100, 100), 100 * (1 - std::exp(-1.0)), 1e-9);
}

TableModel Table(int64_t rows, int dim, double ids_per_step) {
  TableModel t;
  t.name = "t";
  t.dim = dim;
  t.rows = rows;
  t.ids_per_step = ids_per_step;
  t.num_workers = 2;
  t.index_bytes_per_slot =
      ExpectedIndexBytesPerSlot(static_cast<double>(rows) / 16);
  t.index_bytes = t.index_bytes_per_slot * 16;
  return t;
}

TEST(CostModel, UnitLoadSplitsRowsAndTrafficBySlots) {
  const TableModel t = Table(1600, 8, 1000);
  const Load whole = WholeUnitLoad(t, 0, 8);
  EXPECT_DOUBLE_EQ(whole.rows, 1600);
  EXPECT_DOUBLE_EQ(whole.weight_bytes, 1600 * 32);
  EXPECT_DOUBLE_EQ(whole.optimizer_bytes, 0);
  EXPECT_DOUBLE_EQ(whole.lookup_ids, 1000);
  EXPECT_DOUBLE_EQ(whole.lookup_bytes, 1000 * (8 + 32));
  EXPECT_DOUBLE_EQ(whole.update_bytes, 1000 * (8 + 32));
  EXPECT_DOUBLE_EQ(whole.rows_touched, 2000);
  EXPECT_DOUBLE_EQ(whole.table_parts, 4);  // 2 workers x (lookup + push)
  const Load quarter = UnitLoad(t, 0, 8, {0, 1, 2, 3}, 16);
  EXPECT_DOUBLE_EQ(quarter.rows, 400);
  EXPECT_DOUBLE_EQ(quarter.lookup_ids, 250);
  EXPECT_NEAR(quarter.index_bytes, whole.index_bytes / 4, 1e-6);
  // A column group moves its own columns and every id.
  const Load half_cols = WholeUnitLoad(t, 0, 4);
  EXPECT_DOUBLE_EQ(half_cols.weight_bytes, 1600 * 16);
  EXPECT_DOUBLE_EQ(half_cols.lookup_bytes, 1000 * (8 + 16));
}

TEST(CostModel, StepTimeIsTheSlowerOfNetworkAndRows) {
  ServerModel s;
  s.network_bytes_per_s = 1e9;
  s.row_seconds = 1e-7;
  s.table_request_seconds = 1e-5;
  Load l;
  l.lookup_bytes = 3e6;
  l.update_bytes = 1e6;    // 4 ms of network
  l.rows_touched = 10000;  // 1 ms of rows
  l.table_parts = 10;      // 0.1 ms of request overhead
  StepTime t = StepTimeOf(l, s);
  EXPECT_DOUBLE_EQ(t.network_seconds, 4e-3);
  EXPECT_DOUBLE_EQ(t.compute_seconds, 1.1e-3);
  EXPECT_DOUBLE_EQ(t.step_seconds, 4e-3);
  l.rows_touched = 100000;  // now 10 ms of rows
  EXPECT_DOUBLE_EQ(StepTimeOf(l, s).step_seconds, 10.1e-3);
}

}  // namespace
}  // namespace recps::planner
