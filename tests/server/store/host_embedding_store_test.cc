// Tests of the host-memory table store through the EmbeddingStore interface.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hashing.h"
#include "common/row_init.h"
#include "common/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/store/contract_store.h"
#include "tests/testing/resident_memory.h"
#include "tests/testing/table_specs.h"
#include "kernels/embedding_optimizer.h"
#include "server/store/embedding_store.h"
#include "server/store/id_index.h"
#include "server/store/store_footprint.h"

namespace recps::server {
namespace {

using ::recps::OptimizerKind;
using ::testing::HasSubstr;

config::TableSpec Spec(std::string name, int dim, int64_t num_rows = 0,
                       OptimizerKind kind = OptimizerKind::kSgd, float lr = 0.5f) {
  return testing::TestTableSpec(std::move(name), dim, num_rows, kind, lr);
}

std::unique_ptr<EmbeddingStore> MakeStore(std::vector<config::TableSpec> specs,
                                          StoreOptions options = {}) {
  auto store = CreateContractStore(std::move(specs), options);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

std::vector<float> Initial(const config::TableSpec& s, uint64_t seed, int64_t id) {
  std::vector<float> w(s.dim);
  InitRow(s.init, seed, StableNameKey(s.name), id, s.dim, w.data());
  return w;
}

int64_t Sum(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

TEST(HostEmbeddingStore, LookupCreatesInitialRowsAndKeepsThem) {
  StoreOptions opt;
  opt.seed = 42;
  auto store = MakeStore({Spec("user", 5)}, opt);
  const std::vector<int64_t> ids = {7, 3, 7, 1000};
  std::vector<float> out(ids.size() * 5), again(ids.size() * 5);
  ASSERT_TRUE(store->Lookup(0, ids, out.data()).ok());
  for (size_t p = 0; p < ids.size(); ++p) {
    const auto w = Initial(store->spec(0), 42, ids[p]);
    EXPECT_EQ(std::memcmp(w.data(), &out[p * 5], 5 * sizeof(float)), 0) << p;
  }
  ASSERT_TRUE(store->Lookup(0, ids, again.data()).ok());
  EXPECT_EQ(out, again);
  const TableInfo info = store->Info(0);
  EXPECT_EQ(info.name, "user");
  EXPECT_EQ(info.rows, 3);
  EXPECT_EQ(info.lookup_ids, 8);
  EXPECT_EQ(info.row_bytes, FusedRowStride(OptimizerKind::kSgd, 5) * 4);
  EXPECT_EQ(Sum(store->RowsPerSlot()), 3);
}

TEST(HostEmbeddingStore, FixedTableRefusesOutOfRangeAndCreatesNothing) {
  auto store = MakeStore({Spec("item", 4, /*num_rows=*/10)});
  std::vector<float> out(3 * 4);
  for (int64_t bad : {int64_t{-1}, int64_t{10}}) {
    const std::vector<int64_t> ids = {1, bad, 2};
    const absl::Status s = store->Lookup(0, ids, out.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("id ", bad)));
    EXPECT_THAT(s.message(), HasSubstr("item"));
    EXPECT_EQ(store->Info(0).rows, 0);
  }
  const std::vector<int64_t> ok = {0, 9, 5};
  EXPECT_TRUE(store->Lookup(0, ok, out.data()).ok());
  EXPECT_EQ(store->Info(0).rows, 3);
}

// A fixed table finds its rows through a flat id -> row map (beside the
// slot indexes): reading ids outside the table answers "no row" rather than
// reading past the map, and the index memory it reports counts the map.
TEST(HostEmbeddingStore, FixedTableReadsOutsideItsIdsFindNoRow) {
  auto store = MakeStore({Spec("item", 4, /*num_rows=*/10), Spec("user", 4)});
  std::vector<float> out(4 * FusedRowStride(OptimizerKind::kSgd, 4));
  const std::vector<int64_t> some = {0, 9};
  ASSERT_TRUE(store->Lookup(0, some, out.data()).ok());
  ASSERT_TRUE(store->ReadRows(0, some, out.data()).ok());
  for (int64_t bad : {int64_t{-1}, int64_t{10}, int64_t{1} << 40}) {
    const std::vector<int64_t> ids = {bad};
    EXPECT_EQ(store->ReadRows(0, ids, out.data()).code(), absl::StatusCode::kNotFound)
        << bad;
  }
  const std::vector<int64_t> never = {3};
  EXPECT_EQ(store->ReadRows(0, never, out.data()).code(), absl::StatusCode::kNotFound);
  if (ContractStoreIsHostStore()) {  // the device store has no such map
    auto empty = MakeStore({Spec("item", 4, /*num_rows=*/10), Spec("user", 4)});
    EXPECT_EQ(empty->Info(0).index_bytes - empty->Info(1).index_bytes,
              HostDenseIndexBytes(10));
  }
  EXPECT_EQ(HostDenseIndexBytes(10), 40);
  EXPECT_EQ(HostDenseIndexBytes(0), 0);  // dynamic: none
  EXPECT_EQ(HostDenseIndexBytes(kHostDenseIndexMaxRows + 1), 0);
}

// StoreOptions::prefault_fixed_share commits the memory of that share of a
// fixed table's rows when the store is created, and nothing else changes:
// no row exists until it is used, and a row then starts from its initial
// value, as without.
TEST(HostEmbeddingStore, PrefaultCommitsAFixedTablesShareAndCreatesNoRow) {
  if (!ContractStoreIsHostStore()) GTEST_SKIP() << "host store only: the device store allocates its arena whole";
  {
    void* probe = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(probe, MAP_FAILED);
    const bool supported = madvise(probe, 4096, 23 /*MADV_POPULATE_WRITE*/) == 0;
    munmap(probe, 4096);
    if (!supported) GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux 5.14)";
  }
  constexpr int64_t kRows = 200000;
  const std::vector<config::TableSpec> specs = {Spec("fixed", 64, kRows), Spec("dynamic", 64)};
  const int64_t row_bytes = FusedRowStride(OptimizerKind::kSgd, 64) * 4;
  using ::recps::testing::ResidentBytes;
  int64_t before = ResidentBytes();
  auto lazy = MakeStore(specs);
  const int64_t lazy_growth = ResidentBytes() - before;
  StoreOptions half;
  half.prefault_fixed_share = 0.5;
  before = ResidentBytes();
  auto prefaulted = MakeStore(specs, half);
  const int64_t growth = ResidentBytes() - before;
  std::printf("resident growth: %lld KiB lazily, %lld KiB with half prefaulted\n",
              static_cast<long long>(lazy_growth >> 10), static_cast<long long>(growth >> 10));
  EXPECT_LT(lazy_growth, kRows * row_bytes / 20);
  EXPECT_GE(growth, kRows / 2 * row_bytes);
  EXPECT_LT(growth, kRows * row_bytes * 7 / 10);  // half, not the whole arena
  EXPECT_EQ(prefaulted->Info(0).rows, 0);
  const std::vector<int64_t> ids = {0, 77, kRows - 1};
  std::vector<float> a(ids.size() * 64), b(ids.size() * 64);
  ASSERT_TRUE(lazy->Lookup(0, ids, a.data()).ok());
  ASSERT_TRUE(prefaulted->Lookup(0, ids, b.data()).ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  EXPECT_EQ(prefaulted->Info(0).rows, 3);
}

// The index of the rows copied aside during a snapshot is touched a page
// at a time by pushes (under a stripe lock): it must not fault huge pages
// in. With them, the first push after a cut zeroed (and first compacted)
// 2 MiB per row it copied aside: 90 ms of one push in
// recps_checkpoint_bench --only_stall.
TEST(HostEmbeddingStore, APushDuringASnapshotFaultsInNoHugePage) {
  if (!ContractStoreIsHostStore()) GTEST_SKIP() << "host store only";
  constexpr int64_t kRows = 600000;  // an index of 4.8 MB: three huge pages
  auto store = MakeStore({Spec("fixed", 4, kRows)});
  std::vector<int64_t> all(kRows);
  std::iota(all.begin(), all.end(), 0);
  std::vector<float> rows(all.size() * 4);
  ASSERT_TRUE(store->Lookup(0, all, rows.data()).ok());
  ASSERT_TRUE(store->BeginSnapshot(1).ok());
  const std::vector<int64_t> ids = {0, kRows / 2, kRows - 1};  // three 2 MiB regions
  const std::vector<float> grads(ids.size() * 4, 0.5f);
  const int64_t before = testing::ResidentBytes();
  ASSERT_TRUE(store->ApplyGradients(0, ids, grads.data()).ok());
  const int64_t growth = testing::ResidentBytes() - before;
  store->EndSnapshot();
  std::printf("resident growth of one push after the cut: %lld KiB\n",
              static_cast<long long>(growth >> 10));
  EXPECT_LT(growth, int64_t{1} << 20);
}

TEST(HostEmbeddingStore, SgdUpdateIsExact) {
  auto store = MakeStore({Spec("t", 3, 0, OptimizerKind::kSgd, 0.25f)});
  const std::vector<int64_t> ids = {11, -4};
  const std::vector<float> g = {1, 2, -3, 0.5f, 0, 8};
  ASSERT_TRUE(store->ValidateGradients(0, ids, g.data()).ok());
  ASSERT_TRUE(store->ApplyGradients(0, ids, g.data()).ok());
  std::vector<float> out(6);
  ASSERT_TRUE(store->Lookup(0, ids, out.data()).ok());
  for (size_t p = 0; p < ids.size(); ++p) {
    const auto w = Initial(store->spec(0), 0, ids[p]);
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(out[p * 3 + j], w[j] - 0.25f * g[p * 3 + j]);
    }
  }
  EXPECT_EQ(store->Info(0).update_ids, 2);
}

// A push large enough for the store's threads and for many update blocks
// per stripe (ApplyGradients updates the probed rows in blocks while it
// probes): every row is updated exactly once, with its own gradient.
TEST(HostEmbeddingStore, LargeParallelSgdPushUpdatesEveryRowOnce) {
  ThreadPool pool(3);
  StoreOptions options;
  options.pool = &pool;
  auto store = MakeStore({Spec("t", 4, 0, OptimizerKind::kSgd, 0.25f)}, options);
  // 64 stripes x ~300 ids: several blocks per stripe, and partial ones.
  const int64_t n = 19999;
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = (i * 7919) % 100003 - 50000;
  std::vector<float> g(n * 4);
  for (int64_t i = 0; i < n * 4; ++i) g[i] = static_cast<float>(i % 13) - 6.0f;
  ASSERT_TRUE(store->ValidateGradients(0, ids, g.data()).ok());
  ASSERT_TRUE(store->ApplyGradients(0, ids, g.data()).ok());
  std::vector<float> out(n * 4);
  ASSERT_TRUE(store->Lookup(0, ids, out.data()).ok());
  int64_t wrong = 0;
  for (int64_t p = 0; p < n; ++p) {
    const auto w = Initial(store->spec(0), 0, ids[p]);
    for (int j = 0; j < 4; ++j) {
      wrong += out[p * 4 + j] != w[j] - 0.25f * g[p * 4 + j];
    }
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(store->Info(0).update_ids, n);
}

// A fixed table holding a row for every id has no free row, and still takes
// pushes of every id (pushes skip the create-first pass on fixed tables:
// they cannot fill).
TEST(HostEmbeddingStore, FullyPopulatedFixedTableTakesPushes) {
  auto store = MakeStore({Spec("fixed", 2, 5000, OptimizerKind::kSgd, 0.5f)});
  std::vector<int64_t> ids(5000);
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<float> out(ids.size() * 2);
  ASSERT_TRUE(store->Lookup(0, ids, out.data()).ok());
  ASSERT_EQ(store->Info(0).rows, 5000);
  std::reverse(ids.begin(), ids.end());
  const std::vector<float> g(ids.size() * 2, 1.0f);
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(store->ApplyGradients(0, ids, g.data()).ok());
  }
  ASSERT_TRUE(store->Lookup(0, ids, out.data()).ok());
  for (size_t p = 0; p < ids.size(); p += 997) {
    EXPECT_EQ(out[p * 2], Initial(store->spec(0), 0, ids[p])[0] - 0.5f - 0.5f);
  }
  EXPECT_EQ(store->Info(0).rows, 5000);
  // An id outside the table is still refused before anything changes.
  const std::vector<int64_t> outside = {3, 5000};
  EXPECT_EQ(store->ApplyGradients(0, outside, g.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HostEmbeddingStore, AdagradStateIsStoredInTheRow) {
  auto store = MakeStore({Spec("t", 4, 0, OptimizerKind::kAdagrad, 0.1f)});
  const config::TableSpec& s = store->spec(0);
  const std::vector<int64_t> ids = {5};
  const std::vector<float> g = {1, -2, 0, 3};
  ASSERT_TRUE(store->ApplyGradients(0, ids, g.data()).ok());
  ASSERT_TRUE(store->ApplyGradients(0, ids, g.data()).ok());
  const int64_t stride = FusedRowStride(s.optimizer.kind, 4);
  std::vector<float> row(stride);
  ASSERT_TRUE(store->ReadRows(0, ids, row.data()).ok());
  // The formula of kernels/optimizer.h written out here (weight decay 0),
  // not the kernel's own rule: acc += g*g; w -= lr * g / (sqrt(acc) + eps).
  // These gradients square and sum exactly, so only sqrt, the division and
  // the subtraction round, once each, as in any correct implementation.
  ASSERT_EQ(s.optimizer.weight_decay, 0.0f);
  const float lr = 0.1f;
  const float eps = 1e-8f;
  ASSERT_EQ(s.optimizer.learning_rate, lr);
  ASSERT_EQ(s.optimizer.eps, eps);
  auto w = Initial(s, 0, 5);
  std::vector<float> acc(4, 0.0f);
  for (int step = 0; step < 2; ++step) {
    for (int j = 0; j < 4; ++j) {
      acc[j] = acc[j] + g[j] * g[j];
      const float denom = std::sqrt(acc[j]) + eps;
      w[j] = w[j] - (lr * g[j]) / denom;
    }
  }
  // Two steps: acc is 2 g^2 and each weight with g != 0 moved by
  // lr * sign(g) * (1 + 1/sqrt(2)), about 0.17 (eps is negligible).
  const auto w0 = Initial(s, 0, 5);
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(acc[j], 2 * g[j] * g[j]) << j;
    const double moved = g[j] == 0 ? 0 : 0.1 * (1 + 1 / std::sqrt(2.0));
    EXPECT_NEAR(w0[j] - w[j], g[j] > 0 ? moved : -moved, 1e-5) << j;
  }
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(row[j], w[j]) << j;
    EXPECT_EQ(row[4 + j], acc[j]) << j;
  }
  const std::vector<int64_t> missing = {6};
  const absl::Status st = store->ReadRows(0, missing, row.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(st.message(), HasSubstr("id 6"));
}

TEST(HostEmbeddingStore, ValidateGradientsRefusesBadPushes) {
  auto store = MakeStore({Spec("fixed", 2, 100), Spec("dyn", 2)});
  std::vector<float> g = {1, 2, 3, 4};
  const std::vector<int64_t> pair = {1, 2};
  EXPECT_TRUE(store->ValidateGradients(0, pair, g.data()).ok());

  g[3] = std::numeric_limits<float>::quiet_NaN();
  absl::Status s = store->ValidateGradients(1, pair, g.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("id 2"));
  EXPECT_THAT(s.message(), HasSubstr("column 1"));
  EXPECT_THAT(s.message(), HasSubstr("dyn"));
  g[3] = 4;
  g[0] = -std::numeric_limits<float>::infinity();
  s = store->ValidateGradients(1, pair, g.data());
  EXPECT_THAT(s.message(), HasSubstr("id 1"));
  EXPECT_THAT(s.message(), HasSubstr("column 0"));
  g[0] = 1;

  const std::vector<int64_t> dup = {-9, -9};
  s = store->ValidateGradients(1, dup, g.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("id -9"));
  const std::vector<int64_t> out_of_range = {1, 100};
  s = store->ValidateGradients(0, out_of_range, g.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("id 100"));
  EXPECT_EQ(store->Info(0).rows + store->Info(1).rows, 0);
  EXPECT_EQ(Sum(store->RowsPerSlot()), 0);
}

// Large pushes are checked on the store's threads: the error still names the
// lowest bad position, wherever the threads split the batch.
TEST(HostEmbeddingStore, ParallelGradientCheckNamesTheFirstBadRow) {
  ThreadPool pool(4);
  StoreOptions options;
  options.pool = &pool;
  auto store = MakeStore({Spec("dyn", 8)}, options);
  const int64_t n = 20000;
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = i;
  std::vector<float> g(n * 8, 0.25f);
  EXPECT_TRUE(store->ValidateGradients(0, ids, g.data()).ok());
  g[19000 * 8 + 3] = std::numeric_limits<float>::infinity();
  g[12345 * 8 + 5] = std::numeric_limits<float>::quiet_NaN();
  g[17000 * 8] = std::numeric_limits<float>::quiet_NaN();
  for (int rep = 0; rep < 5; ++rep) {
    const absl::Status s = store->ValidateGradients(0, ids, g.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("id 12345 (position 12345)"));
    EXPECT_THAT(s.message(), HasSubstr("column 5"));
  }
  EXPECT_EQ(store->Info(0).rows, 0);
}

TEST(HostEmbeddingStore, UnknownTableIsNotFound) {
  auto store = MakeStore({Spec("a", 2), Spec("b", 2)});
  auto found = store->FindTable("b");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, 1);
  auto missing = store->FindTable("clicks");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("clicks"));
  const std::vector<int64_t> ids = {1};
  float out[2];
  EXPECT_EQ(store->Lookup(2, ids, out).code(), absl::StatusCode::kNotFound);
}

TEST(HostEmbeddingStore, RefusesBadSpecs) {
  auto bad = [](std::vector<config::TableSpec> specs, const char* what) {
    auto s = CreateContractStore(std::move(specs), {});
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_THAT(s.status().message(), HasSubstr(what));
  };
  bad({Spec("", 4)}, "name");
  bad({Spec("has space", 4)}, "has space");
  bad({Spec(std::string(65, 'x'), 4)}, "name");
  bad({Spec("a", 4), Spec("a", 8)}, "'a'");
  bad({Spec("wide", 4097)}, "dim");
  bad({Spec("flat", 0)}, "dim");
  bad({Spec("neg", 4, -1)}, "num_rows");
  bad({Spec("lr", 4, 0, OptimizerKind::kAdam, -1.0f)}, "learning_rate");
  config::TableSpec u = Spec("uni", 4);
  u.init.a = 1;
  u.init.b = 1;
  bad({u}, "uni");
  config::TableSpec n = Spec("norm", 4);
  n.init.distribution = RowInit::Distribution::kNormal;
  n.init.b = 0;
  bad({n}, "stddev");
}

TEST(HostEmbeddingStore, LargeAndNegativeIdsInDynamicTables) {
  auto store = MakeStore({Spec("dyn", 3)});
  const std::vector<int64_t> ids = {std::numeric_limits<int64_t>::min(),
                                    std::numeric_limits<int64_t>::max(), -1, 0,
                                    int64_t{1} << 62};
  std::vector<float> out(ids.size() * 3);
  ASSERT_TRUE(store->Lookup(0, ids, out.data()).ok());
  std::vector<float> g(ids.size() * 3, 1.0f);
  ASSERT_TRUE(store->ValidateGradients(0, ids, g.data()).ok());
  ASSERT_TRUE(store->ApplyGradients(0, ids, g.data()).ok());
  std::vector<float> rows(ids.size() * 4);
  ASSERT_TRUE(store->ReadRows(0, ids, rows.data()).ok());
  EXPECT_EQ(rows[4 * 1], out[3 * 1] - 0.5f);
  EXPECT_EQ(store->Info(0).rows, 5);
}

TEST(HostEmbeddingStore, FullDynamicTableIsResourceExhausted) {
  StoreOptions opt;
  opt.max_rows_per_table = 4;
  auto store = MakeStore({Spec("small", 2)}, opt);
  std::vector<float> out(5 * 2);
  const std::vector<int64_t> four = {1, 2, 3, 4};
  ASSERT_TRUE(store->Lookup(0, four, out.data()).ok());
  const std::vector<int64_t> five = {1, 2, 3, 4, 5};
  absl::Status s = store->Lookup(0, five, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("small"));
  EXPECT_THAT(s.message(), HasSubstr("4 rows"));
  // A push that does not fit changes no row.
  std::vector<float> before(4 * 4), after(4 * 4);
  ASSERT_TRUE(store->ReadRows(0, four, before.data()).ok());
  const std::vector<float> g(5 * 2, 1.0f);
  s = store->ApplyGradients(0, five, g.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(store->ReadRows(0, four, after.data()).ok());
  EXPECT_EQ(before, after);
  EXPECT_EQ(store->Info(0).rows, 4);
  EXPECT_EQ(Sum(store->RowsPerSlot()), 4);
}

// Ids whose home entries collide: every one maps to the same entry of a
// 16-entry index, so each insert and find walks (and wraps) a probe chain.
std::vector<int64_t> CollidingIds(int n) {
  std::vector<int64_t> ids;
  for (int64_t id = 0; static_cast<int>(ids.size()) < n; ++id) {
    if ((Mix64(static_cast<uint64_t>(id)) & 15) == 15) ids.push_back(id);
  }
  return ids;
}

TEST(IdIndex, CollidingIdsWrapAndStayFindable) {
  IdIndex index;
  EXPECT_EQ(index.capacity(), 0);
  EXPECT_EQ(index.Find(5), -1);
  const std::vector<int64_t> ids = CollidingIds(11);  // 11 fit in 16
  for (size_t k = 0; k < ids.size(); ++k) {
    EXPECT_EQ(index.FindOrInsert(ids[k], [&] { return int64_t(k) * 3; }),
              int64_t(k) * 3);
  }
  EXPECT_EQ(index.capacity(), 16);
  EXPECT_EQ(index.size(), 11);
  for (size_t k = 0; k < ids.size(); ++k) {
    EXPECT_EQ(index.Find(ids[k]), int64_t(k) * 3);
    // Found: make_row is not called again.
    EXPECT_EQ(index.FindOrInsert(ids[k], [] { return int64_t{999}; }),
              int64_t(k) * 3);
  }
  // Absent ids on the same full chain end at the first empty entry.
  EXPECT_EQ(index.Find(CollidingIds(12).back()), -1);
}

TEST(IdIndex, GrowsPastSevenTenthsAndKeepsEveryRow) {
  IdIndex index;
  std::mt19937_64 rng(3);
  std::vector<int64_t> ids(200000);
  for (int64_t& id : ids) id = static_cast<int64_t>(rng());
  ids.push_back(0);
  ids.push_back(-1);
  ids.push_back(std::numeric_limits<int64_t>::min());
  ids.push_back(std::numeric_limits<int64_t>::max());
  for (size_t k = 0; k < ids.size(); ++k) {
    ASSERT_EQ(index.FindOrInsert(ids[k], [&] { return int64_t(k); }),
              int64_t(k));
    ASSERT_EQ(index.capacity(), IdIndex::CapacityForRows(k + 1));
    ASSERT_TRUE(IdIndex::Fits(index.size(), index.capacity()));
  }
  // 200,004 rows: 524,288 entries x 16 B = 8 MiB, past kAlignedBufferBytes,
  // so the last growths went to AlignedBuffers.
  EXPECT_EQ(index.capacity(), 524288);
  for (size_t k = 0; k < ids.size(); ++k)
    ASSERT_EQ(index.Find(ids[k]), int64_t(k));
  EXPECT_EQ(index.Find(12345), -1);
  IdIndex moved = std::move(index);
  EXPECT_EQ(moved.Find(ids[7]), 7);
  EXPECT_EQ(index.capacity(), 0);
}

TEST(IdIndex, RefusedRowInsertsNothing) {
  IdIndex index;
  EXPECT_EQ(index.FindOrInsert(42, [] { return int64_t{-1}; }), -1);
  EXPECT_EQ(index.capacity(), 0);  // a refused first row allocates nothing
  EXPECT_EQ(index.size(), 0);
  EXPECT_EQ(index.FindOrInsert(42, [] { return int64_t{7}; }), 7);
  EXPECT_EQ(index.FindOrInsert(43, [] { return int64_t{-1}; }), -1);
  EXPECT_EQ(index.size(), 1);
  EXPECT_EQ(index.Find(43), -1);
  EXPECT_EQ(index.Find(42), 7);
}

TEST(HostEmbeddingStore, IndexBytesFollowRowsThroughGrowth) {
  if (!ContractStoreIsHostStore()) GTEST_SKIP() << "host store only: the device store allocates its index whole at start";
  StoreOptions opt;
  opt.num_slots = 1;  // one index, so growth steps are visible
  auto store = MakeStore({Spec("t", 2)}, opt);
  const int64_t fixed = HostIndexBytesPerSlot();
  EXPECT_EQ(store->Info(0).index_bytes, fixed);
  std::vector<float> out(2);
  for (int64_t id = 0; id < 1000; ++id) {
    const int64_t one[] = {id * 1000003};
    ASSERT_TRUE(store->Lookup(0, one, out.data()).ok());
    ASSERT_EQ(store->Info(0).index_bytes,
              fixed + HostIndexBytesForRows(id + 1) + HostRowIdBytes(id + 1));
  }
  // 1000 rows: 2048 entries (1433 fit) of 16 bytes, and 8 bytes per row for
  // the row -> id array.
  EXPECT_EQ(store->Info(0).index_bytes, fixed + 2048 * 16 + 1000 * 8);
  std::vector<int64_t> all(1000);
  for (int64_t id = 0; id < 1000; ++id) all[id] = id * 1000003;
  std::vector<float> rows(1000 * 4);
  EXPECT_TRUE(store->ReadRows(0, all, rows.data()).ok());
  EXPECT_EQ(store->RowsPerSlot()[0], 1000);
}

// Runs a fixed mix of lookups and updates; returns every touched row.
std::vector<float> RunWorkload(uint32_t num_slots, ThreadPool* pool) {
  StoreOptions opt;
  opt.seed = 7;
  opt.num_slots = num_slots;
  opt.pool = pool;
  auto store = MakeStore({Spec("adam", 6, 0, OptimizerKind::kAdam, 0.01f),
                          Spec("ada", 5, 50000, OptimizerKind::kAdagrad, 0.1f)},
                         opt);
  std::mt19937_64 rng(1);
  std::vector<int64_t> touched[2];
  for (int step = 0; step < 6; ++step) {
    for (int t = 0; t < 2; ++t) {
      const int dim = store->spec(t).dim;
      // Large enough to take the parallel path (duplicates in the lookup).
      std::vector<int64_t> ids(6000);
      for (int64_t& id : ids) {
        id = t == 0 ? static_cast<int64_t>(rng() % 20000) - 10000
                    : static_cast<int64_t>(rng() % 50000);
      }
      std::vector<float> out(ids.size() * dim);
      EXPECT_TRUE(store->Lookup(t, ids, out.data()).ok());
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      std::shuffle(ids.begin(), ids.end(), rng);
      std::vector<float> g(ids.size() * dim);
      for (float& x : g) x = static_cast<float>(rng() % 2001) / 1000.0f - 1.0f;
      EXPECT_TRUE(store->ValidateGradients(t, ids, g.data()).ok());
      EXPECT_TRUE(store->ApplyGradients(t, ids, g.data()).ok());
      touched[t].insert(touched[t].end(), ids.begin(), ids.end());
    }
  }
  std::vector<float> all;
  for (int t = 0; t < 2; ++t) {
    std::sort(touched[t].begin(), touched[t].end());
    touched[t].erase(std::unique(touched[t].begin(), touched[t].end()),
                     touched[t].end());
    const int64_t stride = store->Info(t).row_bytes / 4;
    std::vector<float> rows(touched[t].size() * stride);
    EXPECT_TRUE(store->ReadRows(t, touched[t], rows.data()).ok());
    all.insert(all.end(), rows.begin(), rows.end());
  }
  EXPECT_EQ(Sum(store->RowsPerSlot()),
            store->Info(0).rows + store->Info(1).rows);
  return all;
}

TEST(HostEmbeddingStore, BitIdenticalAcrossSlotsAndThreads) {
  ThreadPool pool(3);
  const std::vector<float> ref = RunWorkload(1, nullptr);
  for (uint32_t slots : {1u, 4096u}) {
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      const std::vector<float> got = RunWorkload(slots, p);
      ASSERT_EQ(got.size(), ref.size());
      EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0)
          << "slots " << slots << " pool " << (p != nullptr);
    }
  }
}

TEST(HostEmbeddingStore, ConcurrentLookupsAndUpdates) {
  ThreadPool pool(3);
  StoreOptions opt;
  opt.pool = &pool;
  opt.num_slots = 256;
  auto store = MakeStore({Spec("t", 8, 0, OptimizerKind::kSgd, 0.5f)}, opt);
  constexpr int kThreads = 4, kIters = 300, kRange = 500;
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      std::vector<float> out, g;
      for (int it = 0; it < kIters; ++it) {
        // Overlapping windows of distinct ids; every 100th batch is large
        // enough to run on the pool.
        const int n = it % 100 == 0 ? 5000 : 64;
        std::vector<int64_t> ids(n);
        for (int k = 0; k < n; ++k) ids[k] = (th * 37 + it * 13 + k) % kRange;
        if (n > kRange) {
          for (int k = 0; k < n; ++k) ids[k] = k;  // distinct, 0..n-1
        }
        out.resize(ids.size() * 8);
        g.assign(ids.size() * 8, 1.0f);
        ASSERT_TRUE(store->Lookup(0, ids, out.data()).ok());
        ASSERT_TRUE(store->ApplyGradients(0, ids, g.data()).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  const int64_t rows = store->Info(0).rows;
  EXPECT_EQ(rows, 5000);
  EXPECT_EQ(Sum(store->RowsPerSlot()), rows);
  // Each update subtracts 0.5 from every weight: a row's value only depends
  // on how many updates it saw, whatever their interleaving.
  std::vector<int> count(5000, 0);
  for (int th = 0; th < kThreads; ++th) {
    for (int it = 0; it < kIters; ++it) {
      if (it % 100 == 0) {
        for (int k = 0; k < 5000; ++k) ++count[k];
      } else {
        for (int k = 0; k < 64; ++k) ++count[(th * 37 + it * 13 + k) % kRange];
      }
    }
  }
  std::vector<int64_t> all(5000);
  std::iota(all.begin(), all.end(), 0);
  std::vector<float> w(5000 * 8);
  ASSERT_TRUE(store->Lookup(0, all, w.data()).ok());
  for (int64_t id : {0, 1, 250, 499, 500, 4999}) {
    float expect = Initial(store->spec(0), 0, id)[3];
    for (int c = 0; c < count[id]; ++c) expect -= 0.5f;
    EXPECT_EQ(w[id * 8 + 3], expect) << id;
  }
}

// Lookups copy rows under the reader side of the stripes and pushes update
// them under the writer side: a looked-up row is always one whole version,
// never half of an update.
TEST(HostEmbeddingStore, LookupNeverSeesAHalfAppliedUpdate) {
  ThreadPool pool(3);
  StoreOptions opt;
  opt.pool = &pool;
  constexpr int kDim = 1024, kRows = 512, kPushes = 200;
  auto store = MakeStore({Spec("t", kDim, 0, OptimizerKind::kSgd, 0.5f)}, opt);
  std::vector<int64_t> ids(kRows);
  std::iota(ids.begin(), ids.end(), 0);
  // version[c]: every row after c pushes of gradient 1 (w -= 0.5 each).
  std::vector<std::vector<float>> version(kPushes + 1);
  version[0].resize(kRows * kDim);
  ASSERT_TRUE(store->Lookup(0, ids, version[0].data()).ok());
  for (int c = 1; c <= kPushes; ++c) {
    version[c] = version[c - 1];
    for (float& w : version[c]) w -= 0.5f;
  }
  std::atomic<bool> done{false};
  std::thread pusher([&] {
    const std::vector<float> g(kRows * kDim, 1.0f);
    for (int c = 0; c < kPushes; ++c) {
      EXPECT_TRUE(store->ApplyGradients(0, ids, g.data()).ok());
    }
    done = true;
  });
  std::vector<float> out(kRows * kDim);
  int lookups = 0;
  while (!done || lookups == 0) {
    ASSERT_TRUE(store->Lookup(0, ids, out.data()).ok());
    ++lookups;
    for (int r = 0; r < kRows; ++r) {
      const size_t at = static_cast<size_t>(r) * kDim;
      int c = 0;
      while (c <= kPushes && version[c][at] != out[at]) ++c;
      ASSERT_LE(c, kPushes) << "row " << r << ": unexpected weight " << out[at];
      ASSERT_EQ(std::memcmp(&out[at], &version[c][at], kDim * sizeof(float)), 0)
          << "row " << r << " is not one version (column 0 after " << c
          << " pushes), lookup " << lookups;
    }
  }
  pusher.join();
}

}  // namespace
}  // namespace recps::server
