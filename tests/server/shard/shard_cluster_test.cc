// Multi-process tests: real recps-shard processes on 127.0.0.1 (OS-picked
// ports) driven through the embedding client library. Bad input through a
// real process: shard_hardening_test.cc.
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/rpc/channels.h"
#include "client/embedding_client.h"
#include "client/launcher/process.h"
#include "common/hashing.h"
#include "common/wire/shard_map.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "recps/v1/shard.grpc.pb.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "tests/testing/column_groups.h"
#include "tests/testing/local_shard.h"
#include "tests/testing/shard_cluster.h"
#include "tests/server/shard/shard_stats.h"
#include "tests/server/shard/toy_job.h"

namespace recps {
namespace {

using client::EmbeddingClient;
using client::LookupSpec;
using client::PushSpec;
using testing::LocalShard;
using testing::StatsOf;
using testing::TempDir;
using testing::kDim;
using testing::kSlots;
using testing::kTables;
using testing::ReadAll;
using testing::RunWorker;

// S shard servers sharing one shard map, and clients for them.
class Cluster : public testing::ShardCluster {
 public:
  Cluster(int num_servers, int world_size, const std::string& consistency = "sync")
      : ShardCluster(RECPS_SHARD_BINARY, kTables,
                     {absl::StrCat("--world_size=", world_size),
                      "--consistency=" + consistency, "--seed=7",
                      "--step_timeout=20s", "--threads=2"},
                     num_servers, kSlots) {}

  std::unique_ptr<EmbeddingClient> NewClient(int rank) {
    client::EmbeddingClientOptions options;
    options.worker_rank = rank;
    options.rpc_timeout = absl::Seconds(30);
    return ShardCluster::NewClient({{"user", kDim}, {"item", kDim}}, options);
  }
  const ShardMap& map() const { return shard_map(); }
};

// `map` with "user" (Adagrad) split column-wise into [0, 3) [3, 5) [5, 8)
// and "item" (SGD) into [0, 4) [4, 8), over three servers, at `epoch`.
ShardMap ColumnSplit(const ShardMap& map, uint64_t epoch) {
  v1::ShardMap p = map.ToProto();
  p.set_epoch(epoch);
  testing::AddColumnGroups(&p, "user", {0, 3, 5, 8}, {2, 0, 1});
  testing::AddColumnGroups(&p, "item", {0, 4, 8}, {1, 2});
  absl::StatusOr<ShardMap> m = ShardMap::FromProto(p);
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

std::vector<float> RunJob(int num_servers, int world, int steps,
                          bool column_split = false) {
  Cluster cluster(num_servers, world);
  if (column_split) cluster.SetMap(ColumnSplit(cluster.map(), 2));
  std::vector<std::unique_ptr<EmbeddingClient>> clients;
  for (int r = 0; r < world; ++r) clients.push_back(cluster.NewClient(r));
  std::vector<std::thread> workers;
  for (int r = 0; r < world; ++r) {
    workers.emplace_back([&, r] { RunWorker(*clients[r], r, steps); });
  }
  for (auto& w : workers) w.join();
  return ReadAll(*clients[0], world, steps);
}

TEST(ShardCluster, OneAndThreeShardsEndWithBitIdenticalRows) {
  const std::vector<float> one = RunJob(1, 2, 6);
  const std::vector<float> three = RunJob(3, 2, 6);
  ASSERT_EQ(one.size(), three.size());
  EXPECT_EQ(0, std::memcmp(one.data(), three.data(), one.size() * sizeof(float)));
}

TEST(ShardCluster, ColumnWiseTablesEndBitIdenticalToOneShard) {
  // Two workers in sync mode, both tables split column-wise over three
  // servers, against one server holding them whole.
  const std::vector<float> one = RunJob(1, 2, 6);
  const std::vector<float> split = RunJob(3, 2, 6, /*column_split=*/true);
  ASSERT_EQ(one.size(), split.size());
  EXPECT_EQ(0, std::memcmp(one.data(), split.data(), one.size() * sizeof(float)));
}

TEST(ShardCluster, ColumnGroupsLiveOnTheirOwnersOnly) {
  Cluster cluster(3, 1);
  const ShardMap split = ColumnSplit(cluster.map(), 2);
  cluster.SetMap(split);
  auto client = cluster.NewClient(0);
  ASSERT_NE(client, nullptr);
  std::vector<int64_t> ids = {1, 2, 3, 4, 5};
  std::vector<float> rows(ids.size() * kDim);
  ASSERT_TRUE(client->Lookup(0, {{{0, ids, rows.data()}, {1, ids, rows.data()}}}).ok());
  EXPECT_EQ(client->shard_map_epoch(), 2u);
  // Which group tables each server holds, with their rows.
  for (int s = 0; s < 3; ++s) {
    auto admin = v1::ShardAdmin::NewStub(rpc::MakeChannel(cluster.shards()[s]->address(), rpc::ChannelKind::kControl));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::StatsResponse stats;
    ASSERT_TRUE(admin->Stats(&ctx, v1::StatsRequest(), &stats).ok());
    std::map<std::string, std::pair<int, int64_t>> tables;  // dim, rows
    for (const v1::TableStats& t : stats.tables()) {
      tables[t.name()] = {t.dim(), t.rows()};
    }
    // The whole tables stay empty; each server has exactly its groups.
    EXPECT_EQ(tables["user"].second, 0);
    EXPECT_EQ(tables["item"].second, 0);
    std::map<std::string, std::pair<int, int64_t>> want;
    for (uint64_t key : {StableNameKey("user"), StableNameKey("item")}) {
      for (const ColumnGroup& g : split.ColumnGroupsOf(key)) {
        if (g.owner == s) want[g.table] = {g.end - g.begin, 5};
      }
    }
    tables.erase("user");
    tables.erase("item");
    EXPECT_EQ(tables, want) << "server " << s;
  }
}

TEST(ShardCluster, LookupsComeBackInCallerOrderAcrossThreeServers) {
  Cluster cluster(3, 1);
  auto client = cluster.NewClient(0);
  ASSERT_NE(client, nullptr);
  std::vector<int64_t> ids = {5, -5, 5, int64_t{1} << 62, 0, 5};
  std::vector<float> rows(ids.size() * kDim);
  ASSERT_TRUE(client->Lookup(0, {{{0, ids, rows.data()}}}).ok());
  // Duplicates get the same row; distinct ids differ.
  EXPECT_EQ(0, std::memcmp(&rows[0], &rows[2 * kDim], kDim * 4));
  EXPECT_EQ(0, std::memcmp(&rows[0], &rows[5 * kDim], kDim * 4));
  EXPECT_NE(0, std::memcmp(&rows[0], &rows[1 * kDim], kDim * 4));
  // The ids really are spread over several servers.
  std::set<int> owners;
  for (int64_t id : ids) owners.insert(cluster.map().OwnerOf(StableNameKey("user"), id));
  EXPECT_GE(owners.size(), 2u);
}

TEST(ShardCluster, StaleEpochIsRefreshedAndRetried) {
  Cluster cluster(3, 1);
  auto client = cluster.NewClient(0);
  std::vector<int64_t> ids = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> rows(ids.size() * kDim), again(ids.size() * kDim);
  ASSERT_TRUE(client->Lookup(0, {{{1, ids, rows.data()}}}).ok());
  EXPECT_EQ(client->shard_map_epoch(), 1u);
  // A new epoch (same owners): the client's next call is refused as stale,
  // refreshes the map and succeeds.
  std::vector<std::string> addresses = cluster.map().servers();
  cluster.SetMap(ShardMap::Uniform(2, kSlots, addresses));
  ASSERT_TRUE(client->Lookup(0, {{{1, ids, again.data()}}}).ok());
  EXPECT_EQ(client->shard_map_epoch(), 2u);
  EXPECT_EQ(rows, again);
}


TEST(ShardCluster, SyncModeWithTwoWorkersAppliesEachStepOnce) {
  Cluster cluster(2, 2);
  auto c0 = cluster.NewClient(0);
  auto c1 = cluster.NewClient(1);
  std::vector<int64_t> ids = {42};
  std::vector<float> w0(kDim), w1(kDim);
  ASSERT_TRUE(c0->Lookup(0, {{{1, ids, w0.data()}}}).ok());
  std::vector<float> g0(kDim, 1.0f), g1(kDim, 3.0f);
  ASSERT_TRUE(c0->PushGradients(0, {{{1, ids, g0.data()}}}).ok());
  // Worker 1's step-1 lookup waits for worker 1's step-0 push; run it in a
  // thread and push from here.
  std::thread late([&] { ASSERT_TRUE(c1->Lookup(1, {{{1, ids, w1.data()}}}).ok()); });
  // Push only once a server holds that lookup parked.
  ASSERT_TRUE(testing::Eventually([&] {
    int64_t parked = 0;
    for (auto& shard : cluster.shards()) {
      absl::StatusOr<v1::StatsResponse> stats = StatsOf(shard->address());
      if (stats.ok()) parked += stats->parked_lookups();
    }
    return parked == 1;
  }));
  ASSERT_TRUE(c1->PushGradients(0, {{{1, ids, g1.data()}}}).ok());
  late.join();
  // SGD lr 0.05 on the summed gradient 1 + 3.
  for (int j = 0; j < kDim; ++j) EXPECT_FLOAT_EQ(w1[j], w0[j] - 0.05f * 4.0f);
}

TEST(ShardCluster, SigtermStopsTheServerCleanly) {
  Cluster cluster(1, 1);
  auto client = cluster.NewClient(0);
  std::vector<int64_t> ids = {1, 2, 3};
  std::vector<float> rows(ids.size() * kDim);
  ASSERT_TRUE(client->Lookup(0, {{{0, ids, rows.data()}}}).ok());
  absl::StatusOr<int> code = cluster.shards()[0]->Terminate();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

TEST(ShardCluster, MetricsAreServedOverHttp) {
  Cluster cluster(1, 1);
  auto client = cluster.NewClient(0);
  std::vector<int64_t> ids = {1, 2, 3};
  std::vector<float> rows(ids.size() * kDim);
  ASSERT_TRUE(client->Lookup(0, {{{0, ids, rows.data()}}}).ok());
  const int port = cluster.shards()[0]->metrics_port();
  ASSERT_GT(port, 0);
  const std::string cmd = absl::StrCat("curl -sf http://127.0.0.1:", port, "/metrics");
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string body;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) body.append(buf, n);
  pclose(pipe);
  EXPECT_NE(body.find("recps_shard_requests_total{code=\"OK\",rpc=\"Lookup\"} 1"),
            std::string::npos) << body.substr(0, 2000);
  EXPECT_NE(body.find("recps_shard_lookup_ids_total 3"), std::string::npos);
}

TEST(ShardCluster, MapMovingSlotsWithRowsIsRefusedAndRowsStay) {
  Cluster cluster(2, 1);
  auto client = cluster.NewClient(0);
  ASSERT_NE(client, nullptr);
  // Rows on both servers, trained one step.
  std::vector<int64_t> ids = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> rows(ids.size() * kDim), grads(ids.size() * kDim, 1.0f);
  ASSERT_TRUE(client->Lookup(0, {{{0, ids, rows.data()}}}).ok());
  ASSERT_TRUE(client->PushGradients(0, {{{0, ids, grads.data()}}}).ok());
  std::vector<float> trained(ids.size() * kDim);
  ASSERT_TRUE(client->Lookup(1, {{{0, ids, trained.data()}}}).ok());
  const uint64_t user = StableNameKey("user");
  std::set<uint32_t> row_slots;
  for (int64_t id : ids) row_slots.insert(SlotOf(user, id, kSlots));
  uint32_t slot0 = kSlots;  // a slot of server 0 with rows
  for (uint32_t slot : row_slots) {
    if (cluster.map().OwnerOfSlot(slot) == 0) {
      slot0 = slot;
      break;
    }
  }
  ASSERT_LT(slot0, kSlots);
  const std::string& s1 = cluster.shards()[1]->address();

  // Epoch 2 swaps the servers' slots: both hold rows that would reset.
  v1::ShardMap swapped = cluster.map().ToProto();
  swapped.set_epoch(2);
  for (int s = 0; s < swapped.slot_owner_size(); ++s) {
    swapped.set_slot_owner(s, 1 - swapped.slot_owner(s));
  }
  const grpc::Status refused = cluster.SetMapOn(0, swapped);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(refused.error_message().find(absl::StrCat("slot ", slot0, " (")),
            std::string::npos) << refused.error_message();
  EXPECT_NE(refused.error_message().find("-> " + s1), std::string::npos)
      << refused.error_message();
  EXPECT_EQ(cluster.EpochOn(0), 1u);

  // Epoch 2 adds a third server that takes only slots without rows.
  ASSERT_GE(cluster.AddServer(), 0);
  const std::string& s2 = cluster.shards()[2]->address();
  v1::ShardMap grown = cluster.map().ToProto();
  grown.set_epoch(2);
  grown.add_servers(s2);
  int given = 0;
  for (uint32_t s = 0; s < kSlots; ++s) {
    if (row_slots.count(s) == 0 && s % 3 == 0) {
      grown.set_slot_owner(static_cast<int>(s), 2);
      ++given;
    }
  }
  ASSERT_GT(given, 0);
  for (size_t i = 0; i < 3; ++i) {
    const grpc::Status s = cluster.SetMapOn(i, grown);
    EXPECT_TRUE(s.ok()) << i << ": " << s.error_message();
    EXPECT_EQ(cluster.EpochOn(i), 2u);
  }
  // The same map again is a retry (OK); the old epoch is ALREADY_EXISTS.
  EXPECT_TRUE(cluster.SetMapOn(0, grown).ok());
  EXPECT_EQ(cluster.SetMapOn(0, cluster.map().ToProto()).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  // The trained rows are still there (the client refreshes to epoch 2).
  std::vector<float> after(ids.size() * kDim);
  ASSERT_TRUE(client->Lookup(1, {{{0, ids, after.data()}}}).ok());
  EXPECT_EQ(client->shard_map_epoch(), 2u);
  EXPECT_EQ(trained, after);
  EXPECT_NE(trained, rows);
}

}  // namespace
}  // namespace recps
