// The host store with fp16 / bf16 weights (fp32 optimizer state): lookups
// widen, pushes round once per update, rows leave and enter as fp32 fused
// rows (exact on the way out, rounded on the way in), row bytes shrink.
// recps_device_store_contract_test runs these on the device store's CPU
// twin as well.
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "common/half.h"
#include "common/hashing.h"
#include "common/row_init.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/embedding_optimizer.h"
#include "server/store/embedding_store.h"
#include "server/store/store_footprint.h"
#include "tests/server/store/contract_store.h"
#include "tests/testing/table_specs.h"

namespace recps::server {
namespace {

using ::recps::OptimizerKind;
using ::recps::RowPrecision;
using ::testing::HasSubstr;

constexpr RowPrecision kSixteen[] = {RowPrecision::kFp16, RowPrecision::kBf16};

config::TableSpec Spec(std::string name, int dim, RowPrecision precision,
                       OptimizerKind kind = OptimizerKind::kSgd,
                       float lr = 0.5f) {
  config::TableSpec s = testing::TestTableSpec(std::move(name), dim, 0, kind, lr);
  s.precision = precision;
  return s;
}

std::unique_ptr<EmbeddingStore> MakeStore(std::vector<config::TableSpec> specs,
                                          StoreOptions options = {}) {
  auto store = CreateContractStore(std::move(specs), options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

float Round(RowPrecision p, float v) {
  return p == RowPrecision::kFp16 ? HalfToFloat(FloatToHalf(v))
                                  : Bf16ToFloat(FloatToBf16(v));
}

std::vector<int64_t> Ids(int n) {
  std::vector<int64_t> ids(n);
  std::iota(ids.begin(), ids.end(), int64_t{1000});
  return ids;
}

// Every row of table 0, exported slot by slot (ids ascending per slot).
SlotChunk ExportAll(const EmbeddingStore& store, uint32_t num_slots) {
  SlotChunk all;
  for (uint32_t slot = 0; slot < num_slots; ++slot) {
    SlotCursor cursor;
    while (!cursor.done) {
      SlotChunk chunk;
      EXPECT_TRUE(store.ExportSlot(0, slot, &cursor, 1000, &chunk).ok());
      all.row_stride = chunk.row_stride;
      all.ids.insert(all.ids.end(), chunk.ids.begin(), chunk.ids.end());
      all.rows.insert(all.rows.end(), chunk.rows.begin(), chunk.rows.end());
    }
  }
  return all;
}

// Imports an export into `store`, slot by slot.
void ImportAll(EmbeddingStore& store, const SlotChunk& all,
               uint32_t num_slots) {
  for (size_t k = 0; k < all.ids.size(); ++k) {
    const uint32_t slot =
        SlotOf(StableNameKey(store.spec(0).name), all.ids[k], num_slots);
    ASSERT_TRUE(store
                    .ImportRows(0, slot, absl::MakeConstSpan(&all.ids[k], 1),
                                all.rows.data() + k * all.row_stride)
                    .ok());
  }
}

TEST(HostStore16, LookupsGiveTheRoundedInitialRows) {
  for (RowPrecision p : kSixteen) {
    SCOPED_TRACE(RowPrecisionName(p));
    StoreOptions opt;
    opt.seed = 9;
    const int dim = 13;
    auto store = MakeStore({Spec("t", dim, p)}, opt);
    const std::vector<int64_t> ids = Ids(300);
    std::vector<float> out(ids.size() * dim), again(ids.size() * dim);
    ASSERT_TRUE(store->Lookup(0, ids, out.data()).ok());  // creates
    ASSERT_TRUE(store->Lookup(0, ids, again.data()).ok());  // finds
    EXPECT_EQ(out, again);
    std::vector<float> w(dim);
    for (size_t k = 0; k < ids.size(); ++k) {
      InitRow(store->spec(0).init, 9, StableNameKey("t"), ids[k], dim, w.data());
      for (int j = 0; j < dim; ++j) {
        ASSERT_EQ(out[k * dim + j], Round(p, w[j])) << k << " " << j;
      }
    }
  }
}

// Peak memory: a stored row is HostRowBytes (what the planner uses), half
// of fp32 for SGD and a little over for stateful optimizers.
TEST(HostStore16, RowBytesAreTheSixteenBitLayout) {
  const int dim = 64;
  for (OptimizerKind k : {OptimizerKind::kSgd, OptimizerKind::kAdagrad,
                          OptimizerKind::kRowWiseAdagrad, OptimizerKind::kAdam}) {
    auto fp32 = MakeStore({Spec("t", dim, RowPrecision::kFp32, k)});
    const std::vector<int64_t> ids = Ids(10);
    std::vector<float> out(ids.size() * dim);
    ASSERT_TRUE(fp32->Lookup(0, ids, out.data()).ok());
    const int64_t fp32_bytes = fp32->Info(0).row_bytes;
    EXPECT_EQ(fp32_bytes, HostRowBytes(k, dim, RowPrecision::kFp32));
    for (RowPrecision p : kSixteen) {
      auto store = MakeStore({Spec("t", dim, p, k)});
      ASSERT_TRUE(store->Lookup(0, ids, out.data()).ok());
      const TableInfo info = store->Info(0);
      EXPECT_EQ(info.row_bytes, HostRowBytes(k, dim, p));
      EXPECT_EQ(fp32_bytes - info.row_bytes, dim * 2);  // the weights halve
      if (k == OptimizerKind::kSgd) {
        EXPECT_EQ(info.row_bytes * 2, fp32_bytes);
      }
      // BytesPerSlot (what rebalancing reads) counts the same rows.
      const std::vector<int64_t> per_slot = store->BytesPerSlot();
      EXPECT_EQ(std::accumulate(per_slot.begin(), per_slot.end(), int64_t{0}),
                10 * info.row_bytes);
    }
  }
}

// Adagrad without weight decay: the state does not depend on the weights,
// so it equals an fp32 table's exactly; the weights are the fp32 update of
// the stored weights rounded once per push.
TEST(HostStore16, PushesUpdateInFp32AndRoundOncePerStep) {
  for (RowPrecision p : kSixteen) {
    SCOPED_TRACE(RowPrecisionName(p));
    const int dim = 24;
    const auto kind = OptimizerKind::kAdagrad;
    auto store = MakeStore({Spec("t", dim, p, kind, 0.05f)});
    auto ref = MakeStore({Spec("t", dim, RowPrecision::kFp32, kind, 0.05f)});
    const std::vector<int64_t> ids = Ids(5000);  // the parallel path too
    const int64_t stride = FusedRowStride(kind, dim);
    std::vector<float> out(ids.size() * dim);
    ASSERT_TRUE(store->Lookup(0, ids, out.data()).ok());
    // The fp32 reference starts from the same (rounded) rows.
    std::vector<float> rows(ids.size() * stride);
    ASSERT_TRUE(store->ReadRows(0, ids, rows.data()).ok());
    for (size_t k = 0; k < ids.size(); ++k) {
      const uint32_t slot = SlotOf(StableNameKey("t"), ids[k], 4096);
      ASSERT_TRUE(ref->ImportRows(0, slot, absl::MakeConstSpan(&ids[k], 1),
                                  rows.data() + k * stride)
                      .ok());
    }
    for (int step = 0; step < 3; ++step) {
      std::vector<float> grads(ids.size() * dim);
      for (size_t i = 0; i < grads.size(); ++i) {
        grads[i] = std::sin(0.37f * static_cast<float>(i + 11 * step));
      }
      ASSERT_TRUE(store->ApplyGradients(0, ids, grads.data()).ok());
      ASSERT_TRUE(ref->ApplyGradients(0, ids, grads.data()).ok());
      // Round the reference's weights, as the 16-bit store does per step.
      std::vector<float> want(ids.size() * stride);
      ASSERT_TRUE(ref->ReadRows(0, ids, want.data()).ok());
      for (size_t k = 0; k < ids.size(); ++k) {
        for (int j = 0; j < dim; ++j) {
          want[k * stride + j] = Round(p, want[k * stride + j]);
        }
        const uint32_t slot = SlotOf(StableNameKey("t"), ids[k], 4096);
        ASSERT_TRUE(ref->ImportRows(0, slot, absl::MakeConstSpan(&ids[k], 1),
                                    want.data() + k * stride)
                        .ok());
      }
      std::vector<float> got(ids.size() * stride);
      ASSERT_TRUE(store->ReadRows(0, ids, got.data()).ok());
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(),
                               sizeof(float) * got.size()))
          << "step " << step;
    }
    EXPECT_EQ(store->Info(0).update_ids, 3 * 5000);
  }
}

// Export widens exactly, so export -> import into a 16-bit table -> export
// is bit-identical; the same rows imported into an fp32 table look up the
// same. fp32 rows imported into a 16-bit table round to nearest even.
TEST(HostStore16, ExportAndImportRoundTripsAreExact) {
  for (RowPrecision p : kSixteen) {
    for (OptimizerKind k : {OptimizerKind::kSgd, OptimizerKind::kRowWiseAdagrad,
                            OptimizerKind::kAdam}) {
      SCOPED_TRACE(::testing::Message() << RowPrecisionName(p) << " "
                                        << OptimizerName(k));
      const int dim = 9;
      StoreOptions opt;
      opt.num_slots = 16;
      auto src = MakeStore({Spec("t", dim, p, k, 0.01f)}, opt);
      const std::vector<int64_t> ids = Ids(200);
      std::vector<float> grads(ids.size() * dim, 0.25f), out(ids.size() * dim);
      ASSERT_TRUE(src->ApplyGradients(0, ids, grads.data()).ok());
      const SlotChunk first = ExportAll(*src, opt.num_slots);
      ASSERT_EQ(first.ids.size(), ids.size());
      EXPECT_EQ(first.row_stride, FusedRowStride(k, dim));

      auto same = MakeStore({Spec("t", dim, p, k, 0.01f)}, opt);
      ImportAll(*same, first, opt.num_slots);
      const SlotChunk second = ExportAll(*same, opt.num_slots);
      EXPECT_EQ(second.ids, first.ids);
      ASSERT_EQ(0, std::memcmp(second.rows.data(), first.rows.data(),
                               sizeof(float) * first.rows.size()));

      auto wide = MakeStore({Spec("t", dim, RowPrecision::kFp32, k, 0.01f)}, opt);
      ImportAll(*wide, first, opt.num_slots);
      const SlotChunk third = ExportAll(*wide, opt.num_slots);
      ASSERT_EQ(0, std::memcmp(third.rows.data(), first.rows.data(),
                               sizeof(float) * first.rows.size()));

      // fp32 -> 16-bit: weights rounded, state as is.
      std::vector<float> bumped = third.rows;
      for (size_t r = 0; r < third.ids.size(); ++r) {
        for (int j = 0; j < dim; ++j) bumped[r * third.row_stride + j] += 1e-4f;
      }
      SlotChunk fp32_rows = third;
      fp32_rows.rows = bumped;
      auto narrow = MakeStore({Spec("t", dim, p, k, 0.01f)}, opt);
      ImportAll(*narrow, fp32_rows, opt.num_slots);
      const SlotChunk fourth = ExportAll(*narrow, opt.num_slots);
      for (size_t i = 0; i < bumped.size(); ++i) {
        const bool weight = static_cast<int64_t>(i % third.row_stride) < dim;
        ASSERT_EQ(fourth.rows[i], weight ? Round(p, bumped[i]) : bumped[i]) << i;
      }
    }
  }
}

TEST(HostStore16, Fp16ImportRefusesWeightsPastItsRange) {
  const int dim = 4;
  StoreOptions opt;
  opt.num_slots = 1;
  const int64_t stride = FusedRowStride(OptimizerKind::kSgd, dim);
  std::vector<float> row(stride, 0.0f);
  row[2] = 70000.0f;
  const int64_t id = 5;
  auto fp16 = MakeStore({Spec("t", dim, RowPrecision::kFp16)}, opt);
  const absl::Status s =
      fp16->ImportRows(0, 0, absl::MakeConstSpan(&id, 1), row.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("65504"));
  EXPECT_THAT(s.message(), HasSubstr("column 2"));
  EXPECT_EQ(fp16->Info(0).rows, 0);
  // 65504 itself fits; bf16 has fp32's range.
  row[2] = 65504.0f;
  EXPECT_TRUE(fp16->ImportRows(0, 0, absl::MakeConstSpan(&id, 1), row.data()).ok());
  row[2] = 1e30f;
  auto bf16 = MakeStore({Spec("t", dim, RowPrecision::kBf16)}, opt);
  EXPECT_TRUE(bf16->ImportRows(0, 0, absl::MakeConstSpan(&id, 1), row.data()).ok());
}

// Snapshots copy stored rows aside and export them widened; DropSlot moves
// 16-bit rows intact.
TEST(HostStore16, SnapshotsAndDroppedSlotsKeepRowsExact) {
  for (RowPrecision p : kSixteen) {
    SCOPED_TRACE(RowPrecisionName(p));
    const int dim = 10;
    StoreOptions opt;
    opt.num_slots = 8;
    auto store = MakeStore({Spec("t", dim, p, OptimizerKind::kAdagrad)}, opt);
    const std::vector<int64_t> ids = Ids(400);
    std::vector<float> grads(ids.size() * dim, 0.5f), before(ids.size() * dim);
    ASSERT_TRUE(store->ApplyGradients(0, ids, grads.data()).ok());
    ASSERT_TRUE(store->Lookup(0, ids, before.data()).ok());
    const SlotChunk at_cut = ExportAll(*store, opt.num_slots);

    ASSERT_TRUE(store->BeginSnapshot(1).ok());
    ASSERT_TRUE(store->ApplyGradients(0, ids, grads.data()).ok());
    SlotChunk snap;
    for (uint32_t slot = 0; slot < opt.num_slots; ++slot) {
      SlotCursor cursor;
      SlotChunk chunk;
      ASSERT_TRUE(store->ExportSnapshotSlot(0, slot, 0, &cursor, 1000, &chunk).ok());
      snap.ids.insert(snap.ids.end(), chunk.ids.begin(), chunk.ids.end());
      snap.rows.insert(snap.rows.end(), chunk.rows.begin(), chunk.rows.end());
    }
    store->EndSnapshot();
    EXPECT_EQ(snap.ids, at_cut.ids);
    ASSERT_EQ(0, std::memcmp(snap.rows.data(), at_cut.rows.data(),
                             sizeof(float) * snap.rows.size()));

    const SlotChunk live = ExportAll(*store, opt.num_slots);
    ASSERT_TRUE(store->DropSlot(0, 3).ok());
    const SlotChunk after = ExportAll(*store, opt.num_slots);
    const int64_t stride = live.row_stride;
    size_t a = 0;
    for (size_t k = 0; k < live.ids.size(); ++k) {
      if (SlotOf(StableNameKey("t"), live.ids[k], opt.num_slots) == 3) continue;
      ASSERT_LT(a, after.ids.size());
      ASSERT_EQ(after.ids[a], live.ids[k]);
      ASSERT_EQ(0, std::memcmp(after.rows.data() + a * stride,
                               live.rows.data() + k * stride,
                               sizeof(float) * stride));
      ++a;
    }
    EXPECT_EQ(a, after.ids.size());
  }
}

// TableSpec.stochastic_rounding reaches the update: updates below half
// an ulp move no weight with nearest even, some stochastically.
TEST(HostStore16, StochasticRoundingKeepsTinyUpdates) {
  for (RowPrecision p : kSixteen) {
    SCOPED_TRACE(RowPrecisionName(p));
    const int dim = 16;
    config::TableSpec plain = Spec("t", dim, p, OptimizerKind::kSgd, 1.0f);
    // Weights in [0.2, 0.25): a 1e-5 step is below half an ulp there.
    plain.init = RowInit{RowInit::Distribution::kUniform, 0.2f, 0.25f};
    config::TableSpec sr = plain;
    sr.stochastic_rounding = true;
    const std::vector<int64_t> ids = Ids(512);
    std::vector<float> before(ids.size() * dim), after(ids.size() * dim);
    std::vector<float> grads(ids.size() * dim, 1e-5f);
    int moved[2] = {0, 0};
    int k = 0;
    for (const config::TableSpec& spec : {plain, sr}) {
      auto store = MakeStore({spec});
      ASSERT_TRUE(store->Lookup(0, ids, before.data()).ok());
      ASSERT_TRUE(store->ApplyGradients(0, ids, grads.data()).ok());
      ASSERT_TRUE(store->Lookup(0, ids, after.data()).ok());
      for (size_t i = 0; i < before.size(); ++i) {
        moved[k] += before[i] != after[i];
      }
      ++k;
    }
    EXPECT_EQ(moved[0], 0);
    EXPECT_GT(moved[1], 0);
  }
}

}  // namespace
}  // namespace recps::server
