// The device store (CPU twin always; CUDA where a GPU is present) against
// the host store: the same requests give the same rows, optimizer state,
// exports and errors. The twin runs the same kernels on the CPU, so it must
// be bit-identical for every optimizer; the CUDA store bit-identical for SGD
// and within 1e-6 for the others.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <thread>
#include <atomic>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hashing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/embedding_optimizer.h"
#include "server/store/device_store/device_backend.h"
#include "server/store/device_store/device_store.h"
#include "server/store/embedding_store.h"
#include "tests/testing/gpu_test_util.h"
#include "tests/testing/table_specs.h"

namespace recps::kernels {
void PrintTo(OptimizerKind k, std::ostream* os) { *os << static_cast<int>(k); }
}  // namespace recps::kernels

namespace recps::server {
namespace {

using ::recps::OptimizerKind;
using ::recps::RowPrecision;
using ::testing::HasSubstr;
using testing::TestTableSpec;

enum class Backend { kCpuTwin, kCuda };
void PrintTo(Backend b, std::ostream* os) {
  *os << (b == Backend::kCpuTwin ? "cpu-twin" : "cuda");
}

constexpr uint32_t kSlots = 16;
constexpr int64_t kFixedRows = 500;

StoreOptions Options(int64_t max_rows = 1 << 12) {
  StoreOptions o;
  o.seed = 7;
  o.num_slots = kSlots;
  o.max_rows_per_table = max_rows;
  return o;
}

std::vector<config::TableSpec> Specs(
    OptimizerKind kind, RowPrecision precision = RowPrecision::kFp32) {
  // dim 13: a row whose weights are not a multiple of 4 floats (padding,
  // and the GPU's scalar gather path); dim 16: the vector path. 16-bit
  // tables: the dynamic one rounds stochastically.
  auto fixed = TestTableSpec("fixed", 13, kFixedRows, kind, 0.05f);
  auto dynamic = TestTableSpec("dynamic", 16, 0, kind, 0.05f);
  dynamic.stochastic_rounding = precision != RowPrecision::kFp32;
  for (auto* s : {&fixed, &dynamic}) {
    s->precision = precision;
    s->optimizer.beta1 = 0.9f;
    s->optimizer.beta2 = 0.99f;
    s->optimizer.eps = 1e-6f;
    s->optimizer.weight_decay = kind == OptimizerKind::kAdamW ? 0.01f : 0.0f;
  }
  return {fixed, dynamic};
}

// The device store under test; nullptr (and a skip) for CUDA without a GPU.
absl::StatusOr<std::unique_ptr<EmbeddingStore>> MakeDevice(
    Backend backend, std::vector<config::TableSpec> specs,
    const StoreOptions& options) {
  if (backend == Backend::kCpuTwin) {
    return CreateCpuTwinEmbeddingStore(std::move(specs), options);
  }
  StoreOptions o = options;
  o.device = kernels::Device::kCuda;
  o.cuda_device = 0;
  return CreateEmbeddingStore(std::move(specs), o);
}

class DeviceStoreParity
    : public ::testing::TestWithParam<
          std::tuple<Backend, OptimizerKind, RowPrecision>> {
 protected:
  void SetUp() override {
    if (backend() == Backend::kCuda) RECPS_REQUIRE_GPU_OR_SKIP();
    auto host = CreateHostEmbeddingStore(Specs(kind(), precision()), Options());
    ASSERT_TRUE(host.ok()) << host.status();
    host_ = *std::move(host);
    auto dev = MakeDevice(backend(), Specs(kind(), precision()), Options());
    ASSERT_TRUE(dev.ok()) << dev.status();
    dev_ = *std::move(dev);
  }
  Backend backend() const { return std::get<0>(GetParam()); }
  OptimizerKind kind() const { return std::get<1>(GetParam()); }
  RowPrecision precision() const { return std::get<2>(GetParam()); }
  // Exact for the twin and for SGD on CUDA; otherwise 1e-6, or for 16-bit
  // weights one 16-bit step (an fp32 result one bit apart can round the
  // other way).
  double tolerance() const {
    if (backend() == Backend::kCpuTwin || kind() == OptimizerKind::kSgd) {
      return 0.0;
    }
    switch (precision()) {
      case RowPrecision::kFp16:
        return 1.0 / 1024;
      case RowPrecision::kBf16:
        return 1.0 / 128;
      default:
        return 1e-6;
    }
  }

  void ExpectSameFloats(const std::vector<float>& a,
                        const std::vector<float>& b, const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t k = 0; k < a.size(); ++k) {
      if (tolerance() == 0.0) {
        uint32_t x, y;
        std::memcpy(&x, &a[k], 4);
        std::memcpy(&y, &b[k], 4);
        ASSERT_EQ(x, y) << what << " float " << k << ": " << a[k] << " vs "
                        << b[k];
      } else {
        ASSERT_NEAR(a[k], b[k], tolerance() * std::max(1.0f, std::fabs(a[k])))
            << what << " float " << k;
      }
    }
  }

  void ExpectSameLookup(int t, const std::vector<int64_t>& ids) {
    const int dim = host_->spec(t).dim;
    std::vector<float> a(ids.size() * dim), b(ids.size() * dim, -1.0f);
    ASSERT_TRUE(host_->Lookup(t, ids, a.data()).ok());
    ASSERT_TRUE(dev_->Lookup(t, ids, b.data()).ok());
    ExpectSameFloats(a, b, absl::StrCat("lookup of table ", t));
  }

  // Every slot of every table exported from both, in chunks of 7 rows:
  // same ids in the same order, same whole rows.
  void ExpectSameExports() {
    for (int t = 0; t < host_->num_tables(); ++t) {
      for (uint32_t slot = 0; slot < kSlots; ++slot) {
        SlotCursor ca, cb;
        while (!ca.done) {
          SlotChunk a, b;
          ASSERT_TRUE(host_->ExportSlot(t, slot, &ca, 7, &a).ok());
          ASSERT_TRUE(dev_->ExportSlot(t, slot, &cb, 7, &b).ok());
          ASSERT_EQ(a.row_stride, b.row_stride);
          ASSERT_EQ(a.ids, b.ids) << "table " << t << " slot " << slot;
          ExpectSameFloats(a.rows, b.rows,
                           absl::StrCat("export of table ", t, " slot ", slot));
          ASSERT_EQ(ca.done, cb.done);
        }
      }
    }
    EXPECT_EQ(host_->RowsPerSlot(), dev_->RowsPerSlot());
    EXPECT_EQ(host_->BytesPerSlot(), dev_->BytesPerSlot());
    for (int t = 0; t < host_->num_tables(); ++t) {
      EXPECT_EQ(host_->Info(t).rows, dev_->Info(t).rows);
      EXPECT_EQ(host_->Info(t).row_bytes, dev_->Info(t).row_bytes);
    }
  }

  // A push of n distinct ids (some new) with random gradients to both.
  void Push(int t, int n, std::mt19937_64& rng) {
    const int dim = host_->spec(t).dim;
    const int64_t range = t == 0 ? kFixedRows : 3000;
    std::vector<int64_t> ids;
    std::vector<bool> used(range, false);
    while (static_cast<int>(ids.size()) < n) {
      const int64_t id = static_cast<int64_t>(rng() % range);
      if (used[id]) continue;
      used[id] = true;
      ids.push_back(t == 0 ? id : id * 7919 - 5000);  // negative ids too
    }
    std::normal_distribution<float> g(0.0f, 0.3f);
    std::vector<float> grads(ids.size() * dim);
    for (float& v : grads) v = g(rng);
    ASSERT_TRUE(host_->ValidateGradients(t, ids, grads.data()).ok());
    ASSERT_TRUE(dev_->ValidateGradients(t, ids, grads.data()).ok());
    ASSERT_TRUE(host_->ApplyGradients(t, ids, grads.data()).ok());
    ASSERT_TRUE(dev_->ApplyGradients(t, ids, grads.data()).ok());
  }

  std::unique_ptr<EmbeddingStore> host_;
  std::unique_ptr<EmbeddingStore> dev_;
};

TEST_P(DeviceStoreParity, LookupsPushesImportsDropsAndSnapshotsMatch) {
  std::mt19937_64 rng(1234);
  // Lookups create rows (with duplicates in one request).
  ExpectSameLookup(0, {0, 1, 2, 1, 499, 0, 250});
  ExpectSameLookup(1, {-5, 1LL << 40, 3, 3, -5, 12});
  for (int step = 0; step < 6; ++step) {
    Push(0, 60, rng);
    Push(1, 80, rng);
    ExpectSameLookup(0, {0, 1, 2, 3, 4, 5, 100, 200, 300, 400});
  }
  ExpectSameExports();

  // A snapshot: pushes after the cut, the snapshot sees the rows at the cut.
  ASSERT_TRUE(host_->BeginSnapshot(10).ok());
  ASSERT_TRUE(dev_->BeginSnapshot(10).ok());
  Push(0, 40, rng);
  Push(1, 40, rng);
  EXPECT_EQ(host_->SnapshotBytes(), dev_->SnapshotBytes());
  for (int t = 0; t < 2; ++t) {
    for (uint32_t slot = 0; slot < kSlots; ++slot) {
      for (uint64_t since : {uint64_t{0}, uint64_t{1}}) {
        SlotCursor ca, cb;
        SlotChunk a, b;
        ASSERT_TRUE(host_->ExportSnapshotSlot(t, slot, since, &ca, 1 << 20, &a).ok());
        ASSERT_TRUE(dev_->ExportSnapshotSlot(t, slot, since, &cb, 1 << 20, &b).ok());
        ASSERT_EQ(a.ids, b.ids);
        ExpectSameFloats(a.rows, b.rows, "snapshot export");
      }
    }
  }
  host_->EndSnapshot();
  dev_->EndSnapshot();
  EXPECT_EQ(dev_->SnapshotBytes(), 0);

  // Marks: the rows changed since the mark.
  ASSERT_TRUE(host_->MarkGeneration(20).ok());
  ASSERT_TRUE(dev_->MarkGeneration(20).ok());
  Push(1, 30, rng);
  for (uint32_t slot = 0; slot < kSlots; ++slot) {
    SlotCursor ca, cb;
    SlotChunk a, b;
    ASSERT_TRUE(host_->ExportChangedSlot(1, slot, 20, &ca, 1 << 20, &a).ok());
    ASSERT_TRUE(dev_->ExportChangedSlot(1, slot, 20, &cb, 1 << 20, &b).ok());
    ASSERT_EQ(a.ids, b.ids);
    ExpectSameFloats(a.rows, b.rows, "changed export");
  }

  // Drops compact the arena; rows of the other slots stay, dropped ids
  // start again from their initial value.
  for (uint32_t slot : {3u, 0u, 15u}) {
    auto a = host_->DropSlot(EmbeddingStore::kAllTables, slot);
    auto b = dev_->DropSlot(EmbeddingStore::kAllTables, slot);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b);
  }
  ExpectSameExports();
  ExpectSameLookup(0, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  Push(0, 50, rng);

  // Imports: a slot of the host store moved into a fresh slot's worth of
  // the device store's (over existing rows and new ones).
  for (int t = 0; t < 2; ++t) {
    for (uint32_t slot : {1u, 3u}) {
      SlotCursor c;
      SlotChunk chunk;
      ASSERT_TRUE(host_->ExportSlot(t, slot, &c, 1 << 20, &chunk).ok());
      // Perturb the rows, so that the import visibly overwrites.
      for (size_t k = 0; k < chunk.ids.size(); ++k) chunk.rows[k * chunk.row_stride] += 0.25f;
      ASSERT_TRUE(host_->ImportRows(t, slot, chunk.ids, chunk.rows.data()).ok());
      ASSERT_TRUE(dev_->ImportRows(t, slot, chunk.ids, chunk.rows.data()).ok());
    }
  }
  ExpectSameExports();

  // Whole rows through ReadRows.
  std::vector<int64_t> ids = {0, 1, 2, 3, 4};
  const int64_t stride = FusedRowStride(kind(), 13);
  std::vector<float> a(ids.size() * stride), b(ids.size() * stride);
  ASSERT_TRUE(host_->ReadRows(0, ids, a.data()).ok());
  ASSERT_TRUE(dev_->ReadRows(0, ids, b.data()).ok());
  ExpectSameFloats(a, b, "ReadRows");
}

TEST_P(DeviceStoreParity, ErrorsHaveTheHostStoresCodes) {
  auto same = [](const absl::Status& a, const absl::Status& b) {
    EXPECT_FALSE(a.ok());
    EXPECT_EQ(a.code(), b.code()) << a << " / " << b;
  };
  std::vector<float> out(16 * 4);
  const std::vector<int64_t> outside = {1, kFixedRows};
  same(host_->Lookup(0, outside, out.data()), dev_->Lookup(0, outside, out.data()));
  same(host_->ValidateGradients(0, outside, out.data()),
       dev_->ValidateGradients(0, outside, out.data()));
  // The refused lookup created no row.
  EXPECT_EQ(dev_->Info(0).rows, 0);

  std::vector<float> grads(16 * 2, 0.1f);
  grads[16 + 3] = std::numeric_limits<float>::quiet_NaN();
  same(host_->ValidateGradients(1, {4, 5}, grads.data()),
       dev_->ValidateGradients(1, {4, 5}, grads.data()));
  grads[16 + 3] = std::numeric_limits<float>::infinity();
  const absl::Status inf = dev_->ValidateGradients(1, {4, 5}, grads.data());
  same(host_->ValidateGradients(1, {4, 5}, grads.data()), inf);
  EXPECT_THAT(std::string(inf.message()), HasSubstr("id 5 (position 1)"));
  same(host_->ValidateGradients(1, {4, 4}, out.data()),
       dev_->ValidateGradients(1, {4, 4}, out.data()));
  same(host_->ReadRows(1, {123456}, out.data()),
       dev_->ReadRows(1, {123456}, out.data()));
  same(host_->FindTable("nope").status(), dev_->FindTable("nope").status());
  same(host_->DropSlot(0, kSlots).status(), dev_->DropSlot(0, kSlots).status());
  same(host_->BeginSnapshot(0), dev_->BeginSnapshot(0));
  SlotCursor c;
  SlotChunk chunk;
  same(host_->ExportSnapshotSlot(0, 0, 0, &c, 10, &chunk),
       dev_->ExportSnapshotSlot(0, 0, 0, &c, 10, &chunk));
  same(host_->ExportSlot(0, 0, &c, 0, &chunk), dev_->ExportSlot(0, 0, &c, 0, &chunk));

  // Imports: wrong slot, non-finite row, negative second moment.
  const int64_t stride = FusedRowStride(kind(), 16);
  const uint64_t key = StableNameKey("dynamic");
  int64_t id = 0;
  while (SlotOf(key, id, kSlots) != 2) ++id;
  std::vector<float> row(stride, 0.0f);
  same(host_->ImportRows(1, 3, {id}, row.data()),
       dev_->ImportRows(1, 3, {id}, row.data()));
  row[0] = std::numeric_limits<float>::infinity();
  same(host_->ImportRows(1, 2, {id}, row.data()),
       dev_->ImportRows(1, 2, {id}, row.data()));
  row[0] = 0;
  if (precision() == RowPrecision::kFp16) {
    row[0] = 70000.0f;  // finite, but past fp16's 65504
    same(host_->ImportRows(1, 2, {id}, row.data()),
         dev_->ImportRows(1, 2, {id}, row.data()));
    row[0] = 0;
  }
  if (kind() != OptimizerKind::kSgd) {
    row[16] = -1.0f;  // Adagrad's sum, or Adam's m (allowed: then v below)
    if (kind() == OptimizerKind::kAdam || kind() == OptimizerKind::kAdamW) {
      row[16] = 0;
      row[32] = -1.0f;
    }
    same(host_->ImportRows(1, 2, {id}, row.data()),
         dev_->ImportRows(1, 2, {id}, row.data()));
  }
  EXPECT_EQ(dev_->Info(1).rows, 0);
}

TEST_P(DeviceStoreParity, FullDynamicTableIsResourceExhaustedAndCreatesNothing) {
  auto dev = MakeDevice(backend(), Specs(kind(), precision()),
                        Options(/*max_rows=*/4));
  ASSERT_TRUE(dev.ok()) << dev.status();
  auto host = CreateHostEmbeddingStore(Specs(kind()), Options(4));
  ASSERT_TRUE(host.ok());
  std::vector<float> out(16 * 6);
  ASSERT_TRUE((*dev)->Lookup(1, {1, 2, 3}, out.data()).ok());
  const std::vector<int64_t> ids = {1, 4, 5, 6};
  const absl::Status a = (*host)->Lookup(1, {1, 2, 3}, out.data());
  ASSERT_TRUE(a.ok());
  const absl::Status hs = (*host)->Lookup(1, ids, out.data());
  const absl::Status ds = (*dev)->Lookup(1, ids, out.data());
  EXPECT_EQ(hs.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ds.code(), absl::StatusCode::kResourceExhausted) << ds;
  EXPECT_THAT(std::string(ds.message()), HasSubstr("'dynamic' is full"));
  EXPECT_EQ((*dev)->Info(1).rows, 3);  // all or nothing
  std::vector<float> grads(16 * 4, 0.1f);
  EXPECT_EQ((*dev)->ApplyGradients(1, ids, grads.data()).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*dev)->Info(1).rows, 3);
}

std::string Name(const ::testing::TestParamInfo<
                 std::tuple<Backend, OptimizerKind, RowPrecision>>& info) {
  static const char* const kKinds[] = {"Sgd", "Adagrad", "RowWiseAdagrad",
                                       "Adam", "AdamW"};
  const RowPrecision p = std::get<2>(info.param);
  return absl::StrCat(
      std::get<0>(info.param) == Backend::kCpuTwin ? "CpuTwin" : "Cuda",
      kKinds[static_cast<int>(std::get<1>(info.param))],
      p == RowPrecision::kFp32 ? "" : (p == RowPrecision::kFp16 ? "Fp16" : "Bf16"));
}

INSTANTIATE_TEST_SUITE_P(
    All, DeviceStoreParity,
    ::testing::Combine(::testing::Values(Backend::kCpuTwin, Backend::kCuda),
                       ::testing::Values(OptimizerKind::kSgd,
                                         OptimizerKind::kAdagrad,
                                         OptimizerKind::kRowWiseAdagrad,
                                         OptimizerKind::kAdam,
                                         OptimizerKind::kAdamW),
                       ::testing::Values(RowPrecision::kFp32)),
    Name);

// 16-bit weights (fp32 state): the rows are stored, rounded, widened,
// exported and imported as the host store does them.
INSTANTIATE_TEST_SUITE_P(
    Sixteen, DeviceStoreParity,
    ::testing::Combine(::testing::Values(Backend::kCpuTwin, Backend::kCuda),
                       ::testing::Values(OptimizerKind::kSgd,
                                         OptimizerKind::kAdagrad,
                                         OptimizerKind::kRowWiseAdagrad,
                                         OptimizerKind::kAdam),
                       ::testing::Values(RowPrecision::kFp16,
                                         RowPrecision::kBf16)),
    Name);

// ---- Selection, memory check, device errors (CPU everywhere) ----

TEST(DeviceStoreFactory, CudaWithoutAGpuIsFailedPreconditionNamingTheDevice) {
  const absl::StatusOr<int> gpus = kernels::CudaDeviceCount();
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  StoreOptions o = Options();
  o.device = kernels::Device::kCuda;
  o.cuda_device = *gpus;  // one past the last GPU: refused on any machine
  auto store = CreateEmbeddingStore(Specs(OptimizerKind::kSgd), o);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr(absl::StrCat("device cuda:", *gpus, ": ")));
  if (*gpus > 0) {
    EXPECT_THAT(std::string(store.status().message()), HasSubstr("out of range"));
  }
}

TEST(DeviceStoreFactory, FootprintIsRowsTimesPaddedRowPlusIndex) {
  StoreOptions o = Options(/*max_rows=*/1000);
  const DeviceFootprint f =
      ComputeDeviceFootprint(Specs(OptimizerKind::kAdam), o, 4096);
  ASSERT_EQ(f.tables.size(), 2u);
  EXPECT_EQ(f.tables[0].rows, kFixedRows);
  EXPECT_EQ(f.tables[1].rows, 1000);
  // Adam, dim 13: 13 + 13 + 13 + 1 = 40 floats; dim 16: 49 -> 52.
  EXPECT_EQ(f.tables[0].row_bytes, 40 * 4);
  EXPECT_EQ(f.tables[1].row_bytes, 52 * 4);
  // 500 rows -> 1024 entries (<= 7/10 full), 1000 -> 2048; 16 B each.
  EXPECT_EQ(f.tables[0].index_bytes, 1024 * 16);
  EXPECT_EQ(f.tables[1].index_bytes, 2048 * 16);
  EXPECT_EQ(f.total_bytes,
            4096 + 500 * 160 + 1024 * 16 + 1000 * 208 + 2048 * 16);
}

// 16-bit tables are budgeted with the 16-bit row, as the store keeps it.
TEST(DeviceStoreFactory, FootprintOfSixteenBitTablesUsesTheirRow) {
  const DeviceFootprint f = ComputeDeviceFootprint(
      Specs(OptimizerKind::kAdam, RowPrecision::kBf16), Options(1000), 0);
  ASSERT_EQ(f.tables.size(), 2u);
  // Adam, dim 13: 7 words of weights + 27 of state = 34 -> 36; dim 16:
  // 8 + 33 = 41 -> 44.
  EXPECT_EQ(f.tables[0].row_bytes, 36 * 4);
  EXPECT_EQ(f.tables[1].row_bytes, 44 * 4);
  auto twin = CreateCpuTwinEmbeddingStore(
      Specs(OptimizerKind::kAdam, RowPrecision::kBf16), Options(1000));
  ASSERT_TRUE(twin.ok()) << twin.status();
  EXPECT_EQ((*twin)->Info(1).row_bytes, f.tables[1].row_bytes);
}

TEST(DeviceStoreFactory, AStoreThatDoesNotFitNamesTheNeedAndTheFix) {
  const DeviceFootprint f =
      ComputeDeviceFootprint(Specs(OptimizerKind::kSgd), Options(1 << 20), 0);
  EXPECT_TRUE(CheckDeviceFits(f, "cuda:0", f.total_bytes, f.total_bytes).ok());
  const absl::Status s =
      CheckDeviceFits(f, "cuda:0", f.total_bytes - 1, int64_t{80} << 30);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("device cuda:0: the store does not fit: it needs"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("table 'dynamic': 1048576 rows of 64 B"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("--max_rows_per_table"));
}

TEST(DeviceStoreFactory, CudaStoreTooBigForTheGpuFailsAtStart) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  StoreOptions o = Options(int64_t{1} << 40);
  o.device = kernels::Device::kCuda;
  auto store = CreateEmbeddingStore(Specs(OptimizerKind::kSgd), o);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("does not fit"));
}

TEST(DeviceStoreCuda, ConcurrentLookupsOnSeparateLanesMatchTheTwin) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  auto twin = CreateCpuTwinEmbeddingStore(Specs(OptimizerKind::kAdagrad), Options());
  auto cuda = MakeDevice(Backend::kCuda, Specs(OptimizerKind::kAdagrad), Options());
  ASSERT_TRUE(twin.ok() && cuda.ok()) << cuda.status();
  std::vector<int64_t> ids(4000);
  for (size_t k = 0; k < ids.size(); ++k) ids[k] = static_cast<int64_t>(k * 31 % 3001);
  std::vector<float> a(ids.size() * 16), b(ids.size() * 16);
  ASSERT_TRUE((*twin)->Lookup(1, ids, a.data()).ok());
  ASSERT_TRUE((*cuda)->Lookup(1, ids, b.data()).ok());
  ASSERT_EQ(a, b);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      std::vector<float> c(ids.size() * 16);
      for (int i = 0; i < 20; ++i) {
        if (!(*cuda)->Lookup(1, ids, c.data()).ok() || c != a) ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

// The gather has a compile-time instance for rows of 4, 8, 16 and 32
// float4s and a generic one for the rest: lookups (weights) and snapshots
// (whole rows) of each match the twin after a push.
TEST(DeviceStoreCuda, EveryGatherWidthMatchesTheTwin) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  for (int dim : {16, 32, 64, 128, 24}) {
    SCOPED_TRACE(::testing::Message() << "dim " << dim);
    std::vector<config::TableSpec> specs = {
        TestTableSpec("t", dim, 0, OptimizerKind::kAdagrad, 0.05f)};
    auto twin = CreateCpuTwinEmbeddingStore(specs, Options());
    auto cuda = MakeDevice(Backend::kCuda, specs, Options());
    ASSERT_TRUE(twin.ok() && cuda.ok()) << cuda.status();
    std::vector<int64_t> ids(3000);
    for (size_t k = 0; k < ids.size(); ++k) ids[k] = static_cast<int64_t>(k * 7919 % 100003);
    std::vector<float> grads(ids.size() * dim);
    for (size_t k = 0; k < grads.size(); ++k) grads[k] = 0.01f * static_cast<float>(k % 13);
    for (auto* store : {&*twin, &*cuda}) {
      ASSERT_TRUE((*store)->ApplyGradients(0, ids, grads.data()).ok());
    }
    std::vector<float> a(ids.size() * dim), b(ids.size() * dim, -1.0f);
    ASSERT_TRUE((*twin)->Lookup(0, ids, a.data()).ok());
    ASSERT_TRUE((*cuda)->Lookup(0, ids, b.data()).ok());
    for (size_t k = 0; k < a.size(); ++k) {
      ASSERT_NEAR(a[k], b[k], 1e-6 * std::max(1.0f, std::fabs(a[k]))) << k;
    }
    for (uint32_t slot : {0u, 3u}) {
      SlotCursor ca, cb;
      SlotChunk x, y;
      ASSERT_TRUE((*twin)->ExportSlot(0, slot, &ca, 1 << 20, &x).ok());
      ASSERT_TRUE((*cuda)->ExportSlot(0, slot, &cb, 1 << 20, &y).ok());
      ASSERT_EQ(x.ids, y.ids);
      ASSERT_EQ(x.rows.size(), y.rows.size());
      for (size_t k = 0; k < x.rows.size(); ++k) {
        ASSERT_NEAR(x.rows[k], y.rows[k], 1e-6 * std::max(1.0f, std::fabs(x.rows[k])))
            << "slot " << slot << " float " << k;
      }
    }
  }
}

#if defined(RECPS_HAVE_CUDA)
// Lanes of 64 KiB: every call is cut into many chunks (a 64k-id lookup of
// width 16 is ~80 chunks), and one lane serialises concurrent callers.
TEST(DeviceStoreCuda, BatchesLargerThanALaneGoInChunks) {
  RECPS_REQUIRE_GPU_OR_SKIP();
  auto backend = device_store::CreateCudaBackend(0, /*lanes=*/1, 64 << 10);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto cuda = CreateDeviceEmbeddingStore(Specs(OptimizerKind::kAdam),
                                         Options(1 << 17), *std::move(backend));
  auto twin = CreateCpuTwinEmbeddingStore(Specs(OptimizerKind::kAdam),
                                          Options(1 << 17));
  ASSERT_TRUE(cuda.ok() && twin.ok()) << cuda.status();
  std::vector<int64_t> ids(65536);
  for (size_t k = 0; k < ids.size(); ++k) ids[k] = static_cast<int64_t>(k) * 3 - 7;
  std::vector<float> a(ids.size() * 16), b(ids.size() * 16);
  ASSERT_TRUE((*twin)->Lookup(1, ids, a.data()).ok());
  ASSERT_TRUE((*cuda)->Lookup(1, ids, b.data()).ok());
  ASSERT_EQ(a, b);
  std::vector<float> grads(ids.size() * 16);
  for (size_t k = 0; k < grads.size(); ++k) grads[k] = 0.001f * static_cast<float>(k % 97);
  ASSERT_TRUE((*twin)->ApplyGradients(1, ids, grads.data()).ok());
  ASSERT_TRUE((*cuda)->ApplyGradients(1, ids, grads.data()).ok());
  ASSERT_TRUE((*twin)->Lookup(1, ids, a.data()).ok());
  ASSERT_TRUE((*cuda)->Lookup(1, ids, b.data()).ok());
  for (size_t k = 0; k < a.size(); ++k) {
    ASSERT_NEAR(a[k], b[k], 1e-6 * std::max(1.0f, std::fabs(a[k]))) << k;
  }
  auto da = (*twin)->DropSlot(1, 5);
  auto db = (*cuda)->DropSlot(1, 5);
  ASSERT_TRUE(da.ok() && db.ok());
  EXPECT_EQ(*da, *db);
  for (uint32_t slot : {0u, 5u, 9u}) {
    SlotCursor ca, cb;
    SlotChunk x, y;
    ASSERT_TRUE((*twin)->ExportSlot(1, slot, &ca, 1 << 20, &x).ok());
    ASSERT_TRUE((*cuda)->ExportSlot(1, slot, &cb, 1 << 20, &y).ok());
    ASSERT_EQ(x.ids, y.ids);
    ASSERT_EQ(x.rows.size(), y.rows.size());
    for (size_t k = 0; k < x.rows.size(); ++k) {
      ASSERT_NEAR(x.rows[k], y.rows[k], 1e-6 * std::max(1.0f, std::fabs(x.rows[k])));
    }
  }
}
#endif

}  // namespace
}  // namespace recps::server
