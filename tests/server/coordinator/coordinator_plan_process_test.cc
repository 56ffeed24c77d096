// A real recps-coordinator with --plan_spec and two real recps-shard
// processes: the coordinator plans epoch 1, pushes it (with a table-wise
// table's routing), serves GetPlan, and a client's lookups of the table-wise
// table all land on its one server.
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/rpc/channels.h"
#include "client/embedding_client.h"
#include "common/wire/shard_map.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "recps/v1/coordinator.grpc.pb.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "tests/testing/local_shard.h"
#include "tests/testing/metrics_scrape.h"

namespace recps {
namespace {

using testing::LocalShard;
using testing::TempDir;

constexpr char kJob[] = R"(
tables { name: "user" dim: 8 optimizer { kind: SGD learning_rate: 0.1 } }
tables { name: "item" dim: 8 num_rows: 1000 optimizer { kind: SGD learning_rate: 0.1 } }
features { name: "f0" table: "user" }
features { name: "f1" table: "item" }
model { bottom_mlp: 8 top_mlp: 1 }
training { batch_size: 32 steps: 10 seed: 7 consistency { mode: ASYNC } eval_batches: 1 eval_interval: 5 dense_optimizer { kind: SGD learning_rate: 0.1 } }
data { synthetic { seed: 1 num_dense: 4 features { id_space: 1000 min_ids_per_bag: 1 max_ids_per_bag: 1 } features { id_space: 1000 min_ids_per_bag: 1 max_ids_per_bag: 1 } } }
)";

constexpr char kSpec[] = R"(
topology { servers { memory_bytes: 1073741824 } num_workers: 1 }
hints { table: "user" expected_distinct_ids: 100000 pinned_type: ROW_WISE }
hints { table: "item" pinned_type: TABLE_WISE }
)";

void SetDeadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(10));
}

using ::recps::testing::Eventually;

// An embedding client for the test job's tables, routed by the servers' map.
absl::StatusOr<std::unique_ptr<client::EmbeddingClient>> ClientFor(
    const std::vector<std::string>& addresses) {
  client::EmbeddingClientOptions options;
  options.rpc_timeout = absl::Seconds(20);
  return client::EmbeddingClient::Create(
      {{"user", 8}, {"item", 8}}, client::MakeServerShardMapSource(addresses), options);
}

// A coordinator that plans from `spec`, and two shard servers that join it.
void StartPlannedCluster(const TempDir& dir, const std::string& job,
                         const std::string& spec, testing::CoordinatedCluster* cluster) {
  auto started = testing::StartCoordinatedCluster(
      RECPS_COORDINATOR_BINARY,
      {"--state_dir=" + dir.path() + "/state", "--num_shards=2", "--num_slots=256",
       "--job=" + job, "--plan_spec=" + spec, "--tick=20ms"},
      RECPS_SHARD_BINARY, {"--job=" + job, "--num_slots=256", "--threads=1"}, 2);
  ASSERT_TRUE(started.ok()) << started.status();
  *cluster = *std::move(started);
}

std::unique_ptr<v1::ShardAdmin::Stub> AdminOf(const std::string& address) {
  return v1::ShardAdmin::NewStub(
      rpc::MakeChannel(address, rpc::ChannelKind::kControl));
}

// Waits until every server installed the planned map (epoch 1) and, when
// `table_routings` >= 0, its map routes that many tables.
void WaitForPlannedMap(const std::vector<std::string>& addresses,
                       int table_routings = -1) {
  for (const std::string& address : addresses) {
    auto admin = AdminOf(address);
    ASSERT_TRUE(Eventually([&] {
      grpc::ClientContext context;
      SetDeadline(&context);
      v1::ShardMap map;
      return admin->GetShardMap(&context, v1::GetShardMapRequest(), &map)
                 .ok() &&
             map.epoch() == 1 &&
             (table_routings < 0 || map.tables_size() == table_routings);
    })) << address;
  }
}

void GetStats(const std::string& address, v1::StatsResponse* stats) {
  grpc::ClientContext context;
  SetDeadline(&context);
  ASSERT_TRUE(AdminOf(address)->Stats(&context, v1::StatsRequest(), stats).ok())
      << address;
}

TEST(CoordinatorPlanProcessTest, PlannedMapRoutesATableWiseTableToItsServer) {
  TempDir dir;
  const std::string job = dir.WriteFile("job.textproto", kJob);
  const std::string spec = dir.WriteFile("plan.textproto", kSpec);
  testing::CoordinatedCluster cluster;
  ASSERT_NO_FATAL_FAILURE(StartPlannedCluster(dir, job, spec, &cluster));
  const std::vector<std::string>& addresses = cluster.addresses;
  auto stub = v1::Coordinator::NewStub(rpc::MakeChannel(cluster.coordinator->address(), rpc::ChannelKind::kControl));

  v1::GetPlanResponse plan;
  ASSERT_TRUE(Eventually([&] {
    grpc::ClientContext context;
    SetDeadline(&context);
    return stub->GetPlan(&context, v1::GetPlanRequest(), &plan).ok();
  }));
  EXPECT_EQ(plan.plan().plan_id(), 1u);
  const v1::TablePlan* item = nullptr;
  for (const v1::TablePlan& t : plan.plan().tables()) {
    if (t.table() == "item") item = &t;
  }
  ASSERT_NE(item, nullptr);
  ASSERT_EQ(item->type(), v1::TABLE_WISE);
  const std::string owner = plan.plan().servers(item->server());

  // Both shards installed the planned map.
  ASSERT_NO_FATAL_FAILURE(WaitForPlannedMap(addresses, /*table_routings=*/1));

  auto c = ClientFor(addresses);
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<int64_t> ids(1000);
  for (int i = 0; i < 1000; ++i) ids[i] = i;
  std::vector<float> rows(ids.size() * 8);
  absl::Status s =
      (*c)->Lookup(0, {{{1, ids, rows.data()}, {0, ids, rows.data()}}});
  ASSERT_TRUE(s.ok()) << s;

  for (const std::string& address : addresses) {
    v1::StatsResponse stats;
    ASSERT_NO_FATAL_FAILURE(GetStats(address, &stats));
    for (const v1::TableStats& t : stats.tables()) {
      if (t.name() == "item") {
        EXPECT_EQ(t.rows(), address == owner ? 1000 : 0) << address;
      }
      if (t.name() == "user") {
        EXPECT_GT(t.rows(), 300) << address;
      }
    }
  }
}

// Replication: the coordinator gives every unit of its map a backup on a
// server of another zone (each shard server's --zone), and refuses to build
// a map the zones cannot hold (docs/replication.md).
TEST(CoordinatorPlanProcessTest, ReplicasGoToServersOfOtherZones) {
  TempDir dir;
  const std::string job = dir.WriteFile("job.textproto", kJob);
  auto started = testing::StartCoordinatedCluster(
      RECPS_COORDINATOR_BINARY,
      {"--state_dir=" + dir.path() + "/state", "--num_shards=4", "--num_slots=256",
       "--job=" + job, "--replication=2", "--tick=20ms"},
      RECPS_SHARD_BINARY, {"--job=" + job, "--num_slots=256", "--threads=1"}, 4,
      [](int i) { return std::vector<std::string>{i < 2 ? "--zone=rack-a" : "--zone=rack-b"}; });
  ASSERT_TRUE(started.ok()) << started.status();
  const testing::CoordinatedCluster& cluster = *started;
  std::map<std::string, std::string> zone_of;
  for (int i = 0; i < 4; ++i) zone_of[cluster.addresses[i]] = i < 2 ? "rack-a" : "rack-b";
  v1::ShardMap map;
  ASSERT_TRUE(Eventually([&] {
    grpc::ClientContext context;
    SetDeadline(&context);
    return AdminOf(cluster.addresses[0])
               ->GetShardMap(&context, v1::GetShardMapRequest(), &map)
               .ok() &&
           map.epoch() == 1;
  }));
  EXPECT_EQ(map.replication(), 2u);
  absl::StatusOr<ShardMap> parsed = ShardMap::FromProto(map);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  std::map<uint32_t, int> backed;  // server index -> slots it backs
  for (uint32_t slot = 0; slot < parsed->num_slots(); ++slot) {
    const int owner = parsed->OwnerOfSlot(slot);
    ASSERT_EQ(parsed->BackupsOfSlot(slot).size(), 1u);
    const uint32_t backup = parsed->BackupsOfSlot(slot)[0];
    ASSERT_LT(backup, 4u);
    EXPECT_NE(zone_of[parsed->servers()[backup]], zone_of[parsed->servers()[owner]])
        << "slot " << slot;
    ++backed[backup];
  }
  EXPECT_EQ(backed.size(), 4u) << "every server backs up a share";
  const std::string metrics = testing::ScrapeMetrics(cluster.coordinator->metrics_port());
  EXPECT_EQ(testing::MetricValue(metrics, "recps_coordinator_replication"), 2);
  EXPECT_EQ(testing::MetricValue(metrics, "recps_coordinator_under_replicated_units"), 0);

  // Replication 3 with two zones: no map, and the coordinator says why.
  TempDir other;
  auto refused = testing::StartCoordinatedCluster(
      RECPS_COORDINATOR_BINARY,
      {"--state_dir=" + other.path() + "/state", "--num_shards=3", "--num_slots=256",
       "--job=" + job, "--replication=3", "--tick=20ms"},
      RECPS_SHARD_BINARY, {"--job=" + job, "--num_slots=256", "--threads=1"}, 3,
      [](int i) { return std::vector<std::string>{i < 2 ? "--zone=rack-a" : "--zone=rack-b"}; });
  ASSERT_TRUE(refused.ok()) << refused.status();
  auto stub = v1::Coordinator::NewStub(
      rpc::MakeChannel(refused->coordinator->address(), rpc::ChannelKind::kControl));
  ASSERT_TRUE(Eventually([&] {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::GetCoordinatorShardMapResponse none;
    const grpc::Status s =
        stub->GetShardMap(&context, v1::GetCoordinatorShardMapRequest(), &none);
    return absl::StrContains(s.error_message(),
                             "cannot place the replicas: replication 3 needs 3 zones");
  }));
}

// A shard server of a replicated map killed and started again at its
// address well within its lease (as Kubernetes restarts a pod): the
// coordinator sees another incarnation register and fails the old process
// over at once (the new one would otherwise renew the old one's lease,
// and the map would route to a server without its rows); the restarted
// server, owning nothing, then becomes a backup by re-replication.
TEST(CoordinatorPlanProcessTest, AShardServerRestartedWithinItsLeaseIsFailedOverAndRejoins) {
  TempDir dir;
  const std::string job = dir.WriteFile("job.textproto", kJob);
  const std::vector<std::string> shard_args = {"--job=" + job, "--num_slots=256",
                                               "--threads=1"};
  auto started = testing::StartCoordinatedCluster(
      RECPS_COORDINATOR_BINARY,
      {"--state_dir=" + dir.path() + "/state", "--num_shards=3", "--num_slots=256",
       "--job=" + job, "--replication=2", "--tick=20ms", "--lease=60s"},
      RECPS_SHARD_BINARY, shard_args, 3);
  ASSERT_TRUE(started.ok()) << started.status();
  testing::CoordinatedCluster& cluster = *started;
  auto coordinator = v1::Coordinator::NewStub(
      rpc::MakeChannel(cluster.coordinator->address(), rpc::ChannelKind::kControl));
  const auto current_map = [&]() -> absl::StatusOr<ShardMap> {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::GetCoordinatorShardMapResponse got;
    const grpc::Status s =
        coordinator->GetShardMap(&context, v1::GetCoordinatorShardMapRequest(), &got);
    if (!s.ok()) return absl::UnavailableError(s.error_message());
    return ShardMap::FromProto(got.shard_map());
  };
  ASSERT_TRUE(Eventually([&] {
    absl::StatusOr<ShardMap> m = current_map();
    return m.ok() && m->epoch() == 1;
  }));
  const std::string address = cluster.addresses[1];
  cluster.shards[1]->Kill();
  std::vector<std::string> args = shard_args;
  args.push_back("--coordinator=" + cluster.coordinator->address());
  args.push_back("--listen=" + address);
  absl::StatusOr<std::unique_ptr<LocalShard>> restarted = LocalShard::Start(RECPS_SHARD_BINARY, args);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  // Seconds, not the 60 s lease.
  const absl::Time start = absl::Now();
  std::string last;
  ASSERT_TRUE(Eventually(
      [&] {
        absl::StatusOr<ShardMap> m = current_map();
        if (!m.ok()) return false;
        const int index = m->IndexOf(address);
        last = absl::StrCat("epoch ", m->epoch(), ", owns ", m->OwnsAnything(index),
                            ", backs ", m->BacksAnything(index));
        return index >= 0 && !m->OwnsAnything(index) && m->BacksAnything(index);
      },
      absl::Seconds(30)))
      << last;
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  const std::string metrics = testing::ScrapeMetrics(cluster.coordinator->metrics_port());
  EXPECT_EQ(testing::MetricValue(metrics, "recps_coordinator_failovers_total{result=\"promoted\"}"),
            1);
}

// Item pinned column-wise: the coordinator plans two column groups, the
// shards create them when the map arrives, and a client's lookups return
// the same rows as a standalone shard holding the table whole.
TEST(CoordinatorPlanProcessTest, APlannedColumnWiseTableIsServedByItsGroups) {
  TempDir dir;
  const std::string job = dir.WriteFile("job.textproto", kJob);
  const std::string spec = dir.WriteFile("plan.textproto", R"(
topology { servers { memory_bytes: 1073741824 } num_workers: 1 }
hints { table: "user" expected_distinct_ids: 100000 pinned_type: ROW_WISE }
hints { table: "item" column_groups: 2 }
)");
  testing::CoordinatedCluster cluster;
  ASSERT_NO_FATAL_FAILURE(StartPlannedCluster(dir, job, spec, &cluster));
  const std::vector<std::string>& addresses = cluster.addresses;
  ASSERT_NO_FATAL_FAILURE(WaitForPlannedMap(addresses));

  auto c = ClientFor(addresses);
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<int64_t> ids(1000);
  for (int i = 0; i < 1000; ++i) ids[i] = (i * 7) % 1000;
  std::vector<float> rows(ids.size() * 8);
  absl::Status s = (*c)->Lookup(0, {{{1, ids, rows.data()}}});
  ASSERT_TRUE(s.ok()) << s;

  // Each server holds one group of 4 columns, with every row.
  std::set<std::string> groups;
  for (const std::string& address : addresses) {
    v1::StatsResponse stats;
    ASSERT_NO_FATAL_FAILURE(GetStats(address, &stats));
    for (const v1::TableStats& t : stats.tables()) {
      if (t.name().rfind("item.cols", 0) == 0) {
        groups.insert(t.name());
        EXPECT_EQ(t.dim(), 4);
        EXPECT_EQ(t.rows(), 1000);
      }
      if (t.name() == "item") {
        EXPECT_EQ(t.rows(), 0);
      }
    }
  }
  EXPECT_EQ(groups, (std::set<std::string>{"item.cols0-4", "item.cols4-8"}));

  // The same rows as the unsplit table (same job seed).
  auto whole = LocalShard::Start(RECPS_SHARD_BINARY,
                                 {"--job=" + job, "--num_slots=256",
                                  "--threads=1", "--standalone"});
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto w = ClientFor({(*whole)->address()});
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<float> want(rows.size());
  ASSERT_TRUE((*w)->Lookup(0, {{{1, ids, want.data()}}}).ok());
  EXPECT_EQ(rows, want);
}

}  // namespace
}  // namespace recps
