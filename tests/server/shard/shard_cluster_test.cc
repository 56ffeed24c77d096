// Multi-process tests: real recps-shard processes on 127.0.0.1 (OS-picked
// ports) driven through the embedding client library.
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
#include "tests/testing/metrics_scrape.h"

namespace recps {
namespace {

using client::EmbeddingClient;
using client::LookupSpec;
using client::PushSpec;
using testing::LocalShard;
using testing::TempDir;

constexpr int kDim = 8;
constexpr uint32_t kSlots = 256;

constexpr char kTables[] = R"(
tables {
  name: "user"
  dim: 8
  optimizer { kind: ADAGRAD learning_rate: 0.1 }
}
tables {
  name: "item"
  dim: 8
  num_rows: 1000
  optimizer { kind: SGD learning_rate: 0.05 }
}
)";

// S shard servers sharing one shard map, and clients for them.
class Cluster {
 public:
  Cluster(int num_servers, int world_size, const std::string& consistency = "sync") {
    args_ = {"--tables=" + dir_.WriteFile("tables.textproto", kTables),
             absl::StrCat("--world_size=", world_size),
             "--consistency=" + consistency, absl::StrCat("--num_slots=", kSlots),
             "--seed=7", "--step_timeout=20s", "--threads=2"};
    std::vector<std::string> addresses;
    for (int i = 0; i < num_servers; ++i) {
      if (!AddServer()) return;
      addresses.push_back(shards_.back()->address());
    }
    map_ = ShardMap::Uniform(1, kSlots, addresses);
    SetMap(map_);
  }

  // Starts one more server (not in any map yet); false when it fails.
  bool AddServer() {
    auto shard = LocalShard::Start(RECPS_SHARD_BINARY, args_);
    EXPECT_TRUE(shard.ok()) << shard.status();
    if (!shard.ok()) return false;
    shards_.push_back(*std::move(shard));
    return true;
  }

  // Installs `map` on every server.
  void SetMap(const ShardMap& map) {
    for (size_t i = 0; i < shards_.size(); ++i) {
      const grpc::Status s = SetMapOn(i, map.ToProto());
      EXPECT_TRUE(s.ok()) << s.error_message();
    }
  }

  // Sends `map` to server i.
  grpc::Status SetMapOn(size_t i, const v1::ShardMap& map) {
    auto stub = v1::ShardAdmin::NewStub(
        rpc::MakeChannel(shards_[i]->address(), rpc::ChannelKind::kControl));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::SetShardMapRequest req;
    *req.mutable_shard_map() = map;
    req.set_self(shards_[i]->address());
    v1::SetShardMapResponse resp;
    return stub->SetShardMap(&ctx, req, &resp);
  }

  uint64_t EpochOn(size_t i) {
    auto stub = v1::ShardAdmin::NewStub(
        rpc::MakeChannel(shards_[i]->address(), rpc::ChannelKind::kControl));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ShardMap map;
    EXPECT_TRUE(stub->GetShardMap(&ctx, v1::GetShardMapRequest(), &map).ok());
    return map.epoch();
  }

  std::unique_ptr<EmbeddingClient> NewClient(int rank) {
    std::vector<std::string> addresses;
    for (const auto& s : shards_) addresses.push_back(s->address());
    client::EmbeddingClientOptions options;
    options.worker_rank = rank;
    options.rpc_timeout = absl::Seconds(30);
    auto c = EmbeddingClient::Create({{"user", kDim}, {"item", kDim}},
                                     client::MakeServerShardMapSource(addresses),
                                     options);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  std::vector<std::unique_ptr<LocalShard>>& shards() { return shards_; }
  const ShardMap& map() const { return map_; }

 private:
  TempDir dir_;
  std::vector<std::string> args_;
  std::vector<std::unique_ptr<LocalShard>> shards_;
  ShardMap map_;
};

// Ids of a deterministic toy job: step s, worker r.
std::vector<int64_t> UserIds(int step, int rank) {
  std::vector<int64_t> ids;
  for (int i = 0; i < 40; ++i) {
    ids.push_back(static_cast<int64_t>(Mix64(step * 131 + rank * 17 + i) % 97) -
                  48 + (i % 3 == 0 ? (int64_t{1} << 40) : 0));
  }
  return ids;
}
std::vector<int64_t> ItemIds(int step, int rank) {
  std::vector<int64_t> ids;
  for (int i = 0; i < 25; ++i) ids.push_back((step * 7 + rank * 3 + i * 11) % 1000);
  return ids;
}

std::vector<int64_t> Unique(std::vector<int64_t> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// Runs `steps` steps of the toy job for worker `rank`: look up, push a
// gradient that depends on the rows it saw.
void RunWorker(EmbeddingClient& client, int rank, int steps) {
  for (int step = 0; step < steps; ++step) {
    std::vector<int64_t> users = Unique(UserIds(step, rank));
    std::vector<int64_t> items = Unique(ItemIds(step, rank));
    std::vector<float> user_rows(users.size() * kDim), item_rows(items.size() * kDim);
    std::vector<LookupSpec> lookups = {{0, users, user_rows.data()},
                                       {1, items, item_rows.data()}};
    ASSERT_TRUE(client.Lookup(step, lookups).ok());
    // Gradient = row * 0.5 + 0.01 * (rank + 1): deterministic in the rows.
    for (float& v : user_rows) v = v * 0.5f + 0.01f * (rank + 1);
    for (float& v : item_rows) v = v * -0.25f + 0.02f;
    std::vector<PushSpec> pushes = {{0, users, user_rows.data()},
                                    {1, items, item_rows.data()}};
    absl::Status s = client.PushGradients(step, pushes);
    ASSERT_TRUE(s.ok()) << s;
  }
}

// Every row the job touched, read at step `steps` (after the last step).
std::vector<float> ReadAll(EmbeddingClient& client, int world, int steps) {
  std::vector<int64_t> users, items;
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < world; ++r) {
      for (int64_t id : UserIds(s, r)) users.push_back(id);
      for (int64_t id : ItemIds(s, r)) items.push_back(id);
    }
  }
  users = Unique(users);
  items = Unique(items);
  std::vector<float> out((users.size() + items.size()) * kDim);
  std::vector<LookupSpec> lookups = {{0, users, out.data()},
                                     {1, items, out.data() + users.size() * kDim}};
  EXPECT_TRUE(client.Lookup(steps, lookups).ok());
  return out;
}

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

std::chrono::system_clock::time_point In(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d);
}

absl::StatusOr<v1::StatsResponse> StatsOf(const std::string& address) {
  auto stub = v1::ShardAdmin::NewStub(
      rpc::MakeChannel(address, rpc::ChannelKind::kControl));
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(10)));
  v1::StatsResponse stats;
  const grpc::Status s = stub->Stats(&ctx, v1::StatsRequest(), &stats);
  if (!s.ok()) return absl::UnavailableError(s.error_message());
  return stats;
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
  ASSERT_TRUE(cluster.AddServer());
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

// --- Hardening: bad input through a real process --------------------------

constexpr char kWideTables[] = R"(
tables {
  name: "wide"
  dim: 4096
  optimizer { kind: SGD learning_rate: 0.1 }
}
tables {
  name: "user"
  dim: 8
  optimizer { kind: SGD learning_rate: 0.1 }
}
)";

// One standalone server (every slot, epoch 1) serving kWideTables.
std::unique_ptr<LocalShard> StartStandalone(const TempDir& dir,
                                            std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {
      "--tables=" + dir.WriteFile("wide.textproto", kWideTables),
      "--standalone", "--max_rows_per_table=10000", "--threads=2",
      "--store_threads=1"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto shard = LocalShard::Start(RECPS_SHARD_BINARY, args);
  EXPECT_TRUE(shard.ok()) << shard.status();
  return shard.ok() ? *std::move(shard) : nullptr;
}


std::string EncodedIds(int64_t first, int64_t n) {
  std::string bytes(n * sizeof(int64_t), '\0');
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = first + i;
    std::memcpy(bytes.data() + i * sizeof(int64_t), &id, sizeof(id));
  }
  return bytes;
}

TEST(ShardHardening, PushOfIdsWithoutGradientsIsRefusedBeforeAllocating) {
  TempDir dir;
  auto shard = StartStandalone(dir);
  ASSERT_NE(shard, nullptr);
  // 4M ids (32 MB) and no gradients on a dim-4096 table: sizing the
  // gradients from the ids would take 64 GiB.
  v1::PushGradientsRequest request;
  request.mutable_header()->set_shard_map_epoch(1);
  v1::TableGradients* t = request.add_tables();
  t->set_table("wide");
  t->set_ids(EncodedIds(0, int64_t{1} << 22));
  auto stub = v1::EmbeddingShard::NewStub(
      rpc::MakeChannel(shard->address(), rpc::ChannelKind::kData));
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  v1::PushGradientsResponse response;
  const grpc::Status s = stub->PushGradients(&ctx, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("tables[0].grads (table wide)"),
            std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("got 0"), std::string::npos);
  // A lookup of those ids would answer 64 GiB of rows: refused before the
  // response or a row is made.
  v1::LookupRequest lookup;
  *lookup.mutable_header() = request.header();
  v1::TableIds* ids = lookup.add_tables();
  ids->set_table("wide");
  ids->set_ids(t->ids());
  grpc::ClientContext lookup_ctx;
  lookup_ctx.set_deadline(In(absl::Seconds(30)));
  v1::LookupResponse rows;
  const grpc::Status l = stub->Lookup(&lookup_ctx, lookup, &rows);
  EXPECT_EQ(l.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << l.error_message();
  // Still up, no rows, and its memory did not grow by the 64 GiB.
  absl::StatusOr<v1::StatsResponse> stats = StatsOf(shard->address());
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->total_rows(), 0);
  EXPECT_LT(stats->resident_bytes(), int64_t{1} << 30);
}

// Runs recps-shard with `args` to its exit (at most 30 s); its output goes
// to `log`. Returns the exit code, -1 when it did not exit in time.
int RunShardToExit(const TempDir& dir, const std::vector<std::string>& args,
                   std::string* log) {
  const std::string log_path = dir.path() + "/exit.log";
  std::remove(log_path.c_str());
  absl::StatusOr<pid_t> pid =
      client::SpawnProcess(RECPS_SHARD_BINARY, args, log_path);
  EXPECT_TRUE(pid.ok()) << pid.status();
  if (!pid.ok()) return -1;
  int status = 0;
  const bool exited = testing::Eventually(
      [&] { return waitpid(*pid, &status, WNOHANG) == *pid; }, absl::Seconds(30));
  if (!exited) {
    kill(*pid, SIGKILL);
    waitpid(*pid, nullptr, 0);
    return -1;
  }
  std::ifstream in(log_path);
  log->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(ShardHardening, NumericFlagsOutOfRangeExitTwoNamingTheFlag) {
  TempDir dir;
  const std::string tables = "--tables=" + dir.WriteFile("t.textproto", kWideTables);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"--max_message_mb=4096", "[1, 2047]"},
      {"--max_message_mb=0", "[1, 2047]"},
      {"--world_size=0", "[1, 65536]"},
      {"--staleness=-5", "[-1, "},
      {"--step_timeout=0s", "--step_timeout=0"},
      {"--num_slots=0", "--num_slots=0"},
      {"--max_rows_per_table=-1", "--max_rows_per_table=-1"},
      {"--max_ids_per_request=0", "--max_ids_per_request=0"},
      {"--threads=-3", "--threads=-3"},
      {"--store_threads=100000", "--store_threads=100000"},
      {"--grace_period=-1s", "--grace_period=-1s"},
  };
  for (const auto& [flag, says] : bad) {
    std::string log;
    EXPECT_EQ(RunShardToExit(dir, {tables, "--standalone", flag}, &log), 2)
        << flag << ": " << log;
    EXPECT_NE(log.find(says), std::string::npos) << flag << ": " << log;
    EXPECT_NE(log.find("out of range"), std::string::npos) << flag << ": " << log;
  }
  // The largest message size allowed starts and serves.
  auto shard = StartStandalone(dir, {"--max_message_mb=2047"});
  ASSERT_NE(shard, nullptr);
  EXPECT_TRUE(StatsOf(shard->address()).ok());
}

// A lookup sent asynchronously; its context and response live here until
// the reply (or the cancellation) comes back.
struct PendingLookup {
  grpc::ClientContext ctx;
  v1::LookupRequest request;
  v1::LookupResponse response;
  grpc::Status status;
  absl::Notification done;
};

std::unique_ptr<PendingLookup> SendLookup(v1::EmbeddingShard::Stub& stub,
                                          int64_t step, int64_t first_id,
                                          int64_t n) {
  auto p = std::make_unique<PendingLookup>();
  p->ctx.set_deadline(In(absl::Seconds(60)));
  p->request.mutable_header()->set_shard_map_epoch(1);
  p->request.mutable_header()->set_step(step);
  v1::TableIds* t = p->request.add_tables();
  t->set_table("user");
  t->set_ids(EncodedIds(first_id, n));
  PendingLookup* raw = p.get();
  stub.async()->Lookup(&raw->ctx, &raw->request, &raw->response,
                       [raw](grpc::Status s) {
                         raw->status = std::move(s);
                         raw->done.Notify();
                       });
  return p;
}

TEST(ShardHardening, ParkedLookupsAreBoundedAndDroppedWhenCancelled) {
  TempDir dir;
  // Sync, two workers: a lookup for step 1 waits for both step-0 pushes.
  auto shard = StartStandalone(dir, {"--world_size=2", "--consistency=sync",
                                     "--step_timeout=300s",
                                     "--max_parked_lookups=3",
                                     "--max_parked_ids=2000"});
  ASSERT_NE(shard, nullptr);
  auto stub = v1::EmbeddingShard::NewStub(
      rpc::MakeChannel(shard->address(), rpc::ChannelKind::kData));
  auto parked_are = [&](int64_t lookups, int64_t ids) {
    absl::StatusOr<v1::StatsResponse> stats = StatsOf(shard->address());
    return stats.ok() && stats->parked_lookups() == lookups &&
           stats->parked_ids() == ids;
  };
  std::vector<std::unique_ptr<PendingLookup>> parked;
  parked.push_back(SendLookup(*stub, 1, 0, 1000));
  ASSERT_TRUE(testing::Eventually([&] { return parked_are(1, 1000); }));
  // Past the ids limit: refused at once, not parked.
  auto too_many_ids = SendLookup(*stub, 1, 0, 1001);
  ASSERT_TRUE(too_many_ids->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(too_many_ids->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(too_many_ids->status.error_message().find("--max_parked_ids=2000"),
            std::string::npos) << too_many_ids->status.error_message();
  parked.push_back(SendLookup(*stub, 1, 0, 10));
  parked.push_back(SendLookup(*stub, 1, 0, 10));
  ASSERT_TRUE(testing::Eventually([&] { return parked_are(3, 1020); }));
  // Past the count limit.
  auto fourth = SendLookup(*stub, 1, 0, 10);
  ASSERT_TRUE(fourth->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(fourth->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(fourth->status.error_message().find("--max_parked_lookups=3"),
            std::string::npos) << fourth->status.error_message();
  // The clients give up: the server drops them long before the 300 s step
  // timeout.
  for (auto& p : parked) p->ctx.TryCancel();
  for (auto& p : parked) {
    ASSERT_TRUE(p->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  }
  EXPECT_TRUE(testing::Eventually([&] { return parked_are(0, 0); },
                                  absl::Seconds(10)));
  // Still serving: the step completes and a lookup runs.
  absl::StatusOr<v1::StatsResponse> stats = StatsOf(shard->address());
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->total_rows(), 0);
}

TEST(ShardHardening, RestartedShardFailsTheJobNamingBothIncarnations) {
  TempDir dir;
  auto shard = StartStandalone(dir, {"--consistency=async"});
  ASSERT_NE(shard, nullptr);
  const std::string address = shard->address();
  absl::StatusOr<v1::StatsResponse> before = StatsOf(address);
  ASSERT_TRUE(before.ok());
  ASSERT_NE(before->incarnation(), 0u);
  client::EmbeddingClientOptions options;
  options.max_attempts = 50;  // rides over the restart's UNAVAILABLE
  options.max_backoff = absl::Milliseconds(100);
  auto client = EmbeddingClient::Create(
      {{"user", 8}}, client::MakeServerShardMapSource({address}), options);
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<int64_t> ids = {1, 2, 3};
  std::vector<float> rows(ids.size() * 8), grads(ids.size() * 8, 1.0f);
  ASSERT_TRUE((*client)->Lookup(0, {{{0, ids, rows.data()}}}).ok());
  ASSERT_TRUE((*client)->PushGradients(0, {{{0, ids, grads.data()}}}).ok());

  // A crash, and a fresh process on the same port: same map epoch, rows
  // back at their initial values.
  shard->Kill();
  auto again = StartStandalone(dir, {"--consistency=async", "--listen=" + address});
  ASSERT_NE(again, nullptr);
  absl::StatusOr<v1::StatsResponse> after = StatsOf(address);
  ASSERT_TRUE(after.ok());
  ASSERT_NE(after->incarnation(), before->incarnation());
  const absl::Status s = (*client)->Lookup(1, {{{0, ids, rows.data()}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  for (const std::string& part :
       {address, absl::StrCat(absl::Hex(before->incarnation(), absl::kZeroPad16)),
        absl::StrCat(absl::Hex(after->incarnation(), absl::kZeroPad16)),
        std::string("lost"), std::string("checkpoint")}) {
    EXPECT_NE(s.message().find(part), absl::string_view::npos) << part << ": " << s;
  }
  // Every later call fails too, pushes included.
  EXPECT_EQ((*client)->PushGradients(1, {{{0, ids, grads.data()}}}).code(),
            absl::StatusCode::kDataLoss);
  // A new client (a job restored from a checkpoint) works with it.
  auto fresh = EmbeddingClient::Create(
      {{"user", 8}}, client::MakeServerShardMapSource({address}), options);
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE((*fresh)->Lookup(0, {{{0, ids, rows.data()}}}).ok());
}

// grpc.health.v1.Health/Check for the whole server (empty request), sent
// as raw bytes: the status (1 SERVING, 2 NOT_SERVING), or -1 on error.
int HealthOf(const std::string& address) {
  grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer> stub(
      rpc::MakeChannel(address, rpc::ChannelKind::kControl));
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(10)));
  grpc::ByteBuffer request(nullptr, 0), response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                 &request, &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  // HealthCheckResponse { ServingStatus status = 1; }: 0x08 <varint>.
  if (bytes.empty()) return 0;
  if (bytes.size() != 2 || bytes[0] != 0x08) return -1;
  return bytes[1];
}

TEST(ShardHardening, HealthIsNotServingUntilAMapIsInstalled) {
  TempDir dir;
  auto shard = LocalShard::Start(
      RECPS_SHARD_BINARY,
      {"--tables=" + dir.WriteFile("t.textproto", kWideTables),
       absl::StrCat("--num_slots=", kSlots), "--threads=2"});
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(HealthOf((*shard)->address()), 2);  // NOT_SERVING
  ASSERT_TRUE(testing::InstallShardMap({(*shard)->address()}, 1, kSlots).ok());
  EXPECT_EQ(HealthOf((*shard)->address()), 1);  // SERVING
  // A standalone server installs its own map before it serves.
  auto standalone = StartStandalone(dir);
  ASSERT_NE(standalone, nullptr);
  EXPECT_EQ(HealthOf(standalone->address()), 1);
}

using testing::MetricValue;
using testing::ScrapeMetrics;

TEST(ShardHardening, ResidentBytesMetricFollowsTheProcess) {
  TempDir dir;
  auto shard = StartStandalone(dir);
  ASSERT_NE(shard, nullptr);
  auto client = EmbeddingClient::Create(
      {{"wide", 4096}}, client::MakeServerShardMapSource({shard->address()}),
      client::EmbeddingClientOptions());
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<int64_t> ids(2000);
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<float> rows(ids.size() * 4096), grads(ids.size() * 4096, 0.5f);
  ASSERT_TRUE((*client)->Lookup(0, {{{0, ids, rows.data()}}}).ok());
  ASSERT_TRUE((*client)->PushGradients(0, {{{0, ids, grads.data()}}}).ok());
  // 2000 rows of 16 KiB: the process holds more than 32 MB, and the metric
  // says so without anyone calling Stats.
  std::string body;
  EXPECT_TRUE(testing::Eventually([&] {
    body = ScrapeMetrics(shard->metrics_port());
    return MetricValue(body, "recps_shard_resident_bytes") > 32e6;
  }, absl::Seconds(10))) << body.substr(0, 3000);
  absl::StatusOr<v1::StatsResponse> stats = StatsOf(shard->address());
  ASSERT_TRUE(stats.ok());
  const double scraped = MetricValue(ScrapeMetrics(shard->metrics_port()),
                                     "recps_shard_resident_bytes");
  EXPECT_NEAR(scraped, stats->resident_bytes(), 0.25 * stats->resident_bytes());
}

TEST(ShardHardening, FloodOfBadRequestsIsCountedAndBarelyLogged) {
  TempDir dir;
  const std::string log = dir.path() + "/shard.log";
  // Through a shell, to catch the server's stdout and stderr in `log`.
  auto shard = LocalShard::Start(
      "/bin/sh",
      {"-c", "exec \"$0\" \"$@\" >>" + log + " 2>&1", RECPS_SHARD_BINARY,
       "--tables=" + dir.WriteFile("t.textproto", kWideTables), "--standalone",
       "--threads=2"});
  ASSERT_TRUE(shard.ok()) << shard.status();
  grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer> raw(
      rpc::MakeChannel((*shard)->address(), rpc::ChannelKind::kData));
  // LookupRequest { tables { table: "\xff\xfe" } }: invalid UTF-8 in a
  // string field, which protobuf logs an error for on every parse.
  const std::string malformed("\x12\x04\x0a\x02\xff\xfe", 6);
  constexpr int kBad = 1000;
  int refused = 0;
  for (int i = 0; i < kBad; ++i) {
    grpc::Slice slice(malformed.data(), malformed.size());
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(10)));
    absl::Notification done;
    grpc::Status status;
    raw.UnaryCall(&ctx, "/recps.v1.EmbeddingShard/Lookup", grpc::StubOptions(),
                  &request, &response, [&](grpc::Status s) {
                    status = std::move(s);
                    done.Notify();
                  });
    done.WaitForNotification();
    if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) ++refused;
  }
  EXPECT_EQ(refused, kBad);
  // Counted, by method and reason.
  const std::string body = ScrapeMetrics((*shard)->metrics_port());
  EXPECT_EQ(MetricValue(body,
                        "recps_shard_bad_requests_total{reason=\"malformed\","
                        "rpc=\"Lookup\"}"),
            kBad) << body.substr(0, 3000);
  // Still serving.
  EXPECT_TRUE(StatsOf((*shard)->address()).ok());
  // A few lines, not one or two per request.
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  EXPECT_LT(text.size(), 16u * 1024) << text.substr(0, 4000);
  EXPECT_NE(text.find("bad Lookup request (malformed)"), std::string::npos)
      << text.substr(0, 4000);
}

}  // namespace
}  // namespace recps
