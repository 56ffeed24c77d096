// ShardServer without gRPC, column-wise: a table split into column groups
// trains bit-identically to the unsplit table, and the split table and
// bad groups are refused.
#include "server/shard/shard_server.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/hashing.h"
#include "common/wire/wire_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/shard/shard_server_calls.h"
#include "tests/testing/column_groups.h"

namespace recps::server {
namespace {

using shard_calls::Floats;
using shard_calls::Ids;
using shard_calls::kSelf;
using shard_calls::Lookup;
using shard_calls::LookupSync;
using shard_calls::Push;
using shard_calls::PushSync;
using shard_calls::RowsOf;

constexpr uint32_t kSlots = 64;

// Column-wise: table "wide" (dim 10, Adam, normal init) split into columns
// [0, 3) and [7, 10) on kSelf and [3, 7) on kOther.
constexpr char kOther[] = "127.0.0.1:2";

config::TableSpec WideSpec() {
  config::TableSpec wide;
  wide.name = "wide";
  wide.dim = 10;
  wide.optimizer.kind = OptimizerKind::kAdam;
  wide.optimizer.learning_rate = 0.01f;
  wide.optimizer.beta1 = 0.9f;
  wide.optimizer.beta2 = 0.999f;
  wide.optimizer.eps = 1e-8f;
  wide.init = RowInit{RowInit::Distribution::kNormal, 0.0f, 0.3f};
  return wide;
}

std::unique_ptr<ShardServer> MakeWideServer(const std::string& self,
                                            ShardMap map,
                                            bool factory = true) {
  StoreOptions store_options;
  store_options.seed = 17;
  store_options.num_slots = kSlots;
  store_options.max_rows_per_table = 1000;
  auto store = CreateHostEmbeddingStore({WideSpec()}, store_options);
  EXPECT_TRUE(store.ok()) << store.status();
  ShardServerOptions options;
  options.self_address = self;
  options.num_slots = kSlots;
  options.consistency.world_size = 1;
  options.consistency.step_timeout = absl::Seconds(5);
  options.work_threads = 2;
  if (factory) {
    options.create_store = [store_options](std::vector<config::TableSpec> specs) {
      return CreateHostEmbeddingStore(std::move(specs), store_options);
    };
  }
  auto server =
      ShardServer::Create(*std::move(store), std::move(map), options, nullptr);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// Epoch `epoch` over kSelf and kOther with "wide" split at `bounds`, group g
// owned by owners[g].
v1::ShardMap WideSplit(uint64_t epoch, std::vector<uint32_t> bounds,
                       std::vector<uint32_t> owners) {
  v1::ShardMap p = ShardMap::Uniform(epoch, kSlots, {kSelf, kOther}).ToProto();
  testing::AddColumnGroups(&p, "wide", bounds, owners);
  return p;
}

v1::LookupRequest LookupAt(const std::string& table, std::vector<int64_t> ids,
                           int64_t step, uint64_t epoch) {
  v1::LookupRequest req = Lookup(table, std::move(ids), step);
  req.mutable_header()->set_shard_map_epoch(epoch);
  return req;
}

v1::PushGradientsRequest PushAt(const std::string& table,
                                std::vector<int64_t> ids,
                                std::vector<float> grads, int64_t step,
                                uint64_t epoch) {
  v1::PushGradientsRequest req =
      Push(table, std::move(ids), std::move(grads), step);
  req.mutable_header()->set_shard_map_epoch(epoch);
  return req;
}

TEST(LayeredStore, AddedTablesFollowTheBaseOnesAndNamesStayUnique) {
  config::TableSpec a = WideSpec();
  a.name = "a";
  config::TableSpec b = a;
  b.name = "b";
  StoreOptions store_options;
  store_options.num_slots = kSlots;
  store_options.max_rows_per_table = 100;
  LayeredStore store(*CreateHostEmbeddingStore({a, b}, store_options));
  EXPECT_EQ(store.num_tables(), 2);
  EXPECT_EQ(*store.FindTable("b"), 1);
  EXPECT_FALSE(store.FindTable("c").ok());
  config::TableSpec c = a;
  c.name = "c";
  c.dim = 3;
  ASSERT_TRUE(store.Add(*CreateHostEmbeddingStore({c}, store_options)).ok());
  EXPECT_EQ(store.num_tables(), 3);
  EXPECT_EQ(store.num_base_tables(), 2);
  ASSERT_EQ(*store.FindTable("c"), 2);
  EXPECT_EQ(store.spec(2).dim, 3);
  std::vector<float> row(3);
  ASSERT_TRUE(store.Lookup(2, {7}, row.data()).ok());
  EXPECT_EQ(store.Info(2).rows, 1);
  int64_t rows = 0;
  for (int64_t n : store.RowsPerSlot()) rows += n;
  EXPECT_EQ(rows, 1);
  // A taken name (base or added) is refused and nothing is added.
  for (const char* taken : {"a", "c"}) {
    config::TableSpec again = a;
    again.name = taken;
    EXPECT_EQ(store.Add(*CreateHostEmbeddingStore({again}, store_options)).code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(store.num_tables(), 3);
  EXPECT_EQ(store.Lookup(3, {1}, row.data()).code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(store.FindTable("zz").status().message()),
              ::testing::HasSubstr("a, b, c"));
}

TEST(ShardServerColumnWise, GroupsTrainBitIdenticalToTheUnsplitTable) {
  auto whole = MakeWideServer(kSelf, ShardMap::Uniform(3, kSlots, {kSelf}));
  // Groups arrive with a map, as from the coordinator.
  auto a = MakeWideServer(kSelf, ShardMap());
  auto b = MakeWideServer(kOther, ShardMap());
  v1::SetShardMapRequest set;
  *set.mutable_shard_map() = WideSplit(4, {0, 3, 7, 10}, {0, 1, 0});
  ASSERT_TRUE(a->SetShardMap(set).ok());
  ASSERT_TRUE(b->SetShardMap(set).ok());
  struct Group {
    ShardServer* server;
    int begin, end;
    std::string name;
  };
  const std::vector<Group> groups = {{a.get(), 0, 3, "wide.cols0-3"},
                                     {b.get(), 3, 7, "wide.cols3-7"},
                                     {a.get(), 7, 10, "wide.cols7-10"}};
  for (const Group& g : groups) {
    absl::StatusOr<int> t = g.server->store().FindTable(g.name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(g.server->store().spec(*t).dim, g.end - g.begin);
  }
  EXPECT_FALSE(b->store().FindTable("wide.cols0-3").ok());  // not b's

  const std::vector<int64_t> ids = {3, -8, 1000000007, 42};
  for (int64_t step = 0; step < 4; ++step) {
    v1::LookupResponse full;
    ASSERT_TRUE(LookupSync(*whole, LookupAt("wide", ids, step, 3), &full).ok());
    const std::vector<float> want = RowsOf(full);
    for (const Group& g : groups) {
      v1::LookupResponse part;
      ASSERT_TRUE(
          LookupSync(*g.server, LookupAt(g.name, ids, step, 4), &part).ok());
      const std::vector<float> got = RowsOf(part);
      const int w = g.end - g.begin;
      for (size_t i = 0; i < ids.size(); ++i) {
        for (int c = g.begin; c < g.end; ++c) {
          ASSERT_EQ(got[i * w + c - g.begin], want[i * 10 + c])
              << "step " << step << " id " << ids[i] << " col " << c;
        }
      }
    }
    // The same gradients, each group its columns (a row of 0 for id 42 at
    // even steps: Adam still counts the step).
    std::vector<float> grads(ids.size() * 10);
    for (size_t k = 0; k < grads.size(); ++k) {
      grads[k] = (k / 10 == 3 && step % 2 == 0)
                     ? 0.0f
                     : std::sin(0.37f * static_cast<float>(k + 11 * step));
    }
    ASSERT_TRUE(PushSync(*whole, PushAt("wide", ids, grads, step, 3)).ok());
    // One push per server and step (a second is taken for a retry), with
    // all of its groups, as the client sends it.
    v1::PushGradientsRequest to_a = PushAt("wide", {}, {}, step, 4);
    v1::PushGradientsRequest to_b = to_a;
    to_a.clear_tables();
    to_b.clear_tables();
    for (const Group& g : groups) {
      std::vector<float> part;
      for (size_t i = 0; i < ids.size(); ++i) {
        part.insert(part.end(), grads.begin() + i * 10 + g.begin,
                    grads.begin() + i * 10 + g.end);
      }
      v1::TableGradients* t =
          (g.server == a.get() ? to_a : to_b).add_tables();
      t->set_table(g.name);
      t->set_ids(Ids(ids));
      t->set_grads(Floats(part));
    }
    ASSERT_TRUE(PushSync(*a, to_a).ok());
    ASSERT_TRUE(PushSync(*b, to_b).ok());
  }
  // Weights, both moments and the step count match column by column.
  auto read = [](ShardServer& s, const std::string& table, int dim) {
    const int t = *s.store().FindTable(table);
    const int64_t stride = FusedRowStride(OptimizerKind::kAdam, dim);
    std::vector<float> rows(4 * stride);
    EXPECT_TRUE(s.store().ReadRows(t, {3, -8, 1000000007, 42}, rows.data()).ok());
    return std::make_pair(rows, stride);
  };
  const auto [full, full_stride] = read(*whole, "wide", 10);
  for (const Group& g : groups) {
    const int w = g.end - g.begin;
    const auto [part, stride] = read(*g.server, g.name, w);
    for (int i = 0; i < 4; ++i) {
      const float* f = full.data() + i * full_stride;
      const float* p = part.data() + i * stride;
      for (int k = 0; k < 3; ++k) {  // weights, m, v
        for (int c = g.begin; c < g.end; ++c) {
          ASSERT_EQ(p[k * w + c - g.begin], f[k * 10 + c]) << k << " " << c;
        }
      }
      uint32_t full_step, part_step;
      std::memcpy(&full_step, f + 30, 4);
      std::memcpy(&part_step, p + 3 * w, 4);
      EXPECT_EQ(full_step, 4u);
      EXPECT_EQ(part_step, 4u);
    }
  }
}

TEST(ShardServerColumnWise, TheSplitTableAndBadGroupsAreRefused) {
  auto a = MakeWideServer(kSelf, ShardMap());
  v1::SetShardMapRequest set;
  // Groups that stop short of the dim: refused, no map installed.
  *set.mutable_shard_map() = WideSplit(4, {0, 5, 9}, {0, 1});
  absl::Status s = a->SetShardMap(set);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("has dim 10"), absl::string_view::npos) << s;
  EXPECT_EQ(a->GetShardMap().epoch(), 0u);
  // A configured table already named like a group.
  {
    StoreOptions store_options;
    store_options.num_slots = kSlots;
    config::TableSpec clash = WideSpec();
    clash.name = "wide.cols0-5";
    auto store = CreateHostEmbeddingStore({WideSpec(), clash}, store_options);
    ASSERT_TRUE(store.ok()) << store.status();
    ShardServerOptions options;
    options.self_address = kSelf;
    options.num_slots = kSlots;
    options.create_store = [store_options](std::vector<config::TableSpec> specs) {
      return CreateHostEmbeddingStore(std::move(specs), store_options);
    };
    auto server = ShardServer::Create(*std::move(store), ShardMap(), options, nullptr);
    ASSERT_TRUE(server.ok()) << server.status();
    *set.mutable_shard_map() = WideSplit(4, {0, 5, 10}, {0, 1});
    s = (*server)->SetShardMap(set);
    EXPECT_NE(s.message().find("name of a configured table"), absl::string_view::npos) << s;
  }
  // A server without a store factory cannot take a group.
  auto bare = MakeWideServer(kSelf, ShardMap(), /*factory=*/false);
  *set.mutable_shard_map() = WideSplit(4, {0, 5, 10}, {0, 1});
  s = bare->SetShardMap(set);
  EXPECT_NE(s.message().find("create_store"), absl::string_view::npos) << s;
  // The whole table is no longer served; the group is.
  ASSERT_TRUE(a->SetShardMap(set).ok());
  v1::LookupResponse resp;
  s = LookupSync(*a, LookupAt("wide", {1}, 0, 4), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("split column-wise"), absl::string_view::npos) << s;
  EXPECT_TRUE(LookupSync(*a, LookupAt("wide.cols0-5", {1}, 0, 4), &resp).ok());
  // A later map that moves nothing keeps the group's rows.
  *set.mutable_shard_map() = WideSplit(5, {0, 5, 10}, {0, 1});
  ASSERT_TRUE(a->SetShardMap(set).ok());
  EXPECT_EQ(a->store().Info(*a->store().FindTable("wide.cols0-5")).rows, 1);
  // The group table shows in the stats.
  v1::StatsResponse stats;
  ASSERT_TRUE(a->Stats(v1::StatsRequest(), &stats).ok());
  EXPECT_EQ(stats.tables_size(), 2);
  EXPECT_EQ(stats.total_rows(), 1);
}

}  // namespace
}  // namespace recps::server
