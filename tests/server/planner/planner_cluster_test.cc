// The planner against real recps-shard processes (127.0.0.1, OS-picked
// ports): a plan's table-wise table really is served by its one server, and
// the planner's bytes-stored estimate matches what a server reports.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/channels.h"
#include "client/embedding_client.h"
#include "common/hashing.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/store/store_footprint.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "server/planner/cost_model.h"
#include "server/planner/planner.h"
#include "common/config/table_config.h"
#include "tests/testing/local_shard.h"
#include "tests/testing/shard_cluster.h"

namespace recps {
namespace {

using testing::LocalShard;
using testing::TempDir;

std::unique_ptr<v1::ShardAdmin::Stub> Admin(const std::string& address) {
  return v1::ShardAdmin::NewStub(
      rpc::MakeChannel(address, rpc::ChannelKind::kControl));
}

std::chrono::system_clock::time_point Deadline() {
  return std::chrono::system_clock::now() + std::chrono::seconds(20);
}

void Install(const std::vector<std::unique_ptr<LocalShard>>& shards,
             const v1::ShardMap& map) {
  for (const auto& shard : shards) {
    grpc::ClientContext ctx;
    ctx.set_deadline(Deadline());
    v1::SetShardMapRequest req;
    *req.mutable_shard_map() = map;
    req.set_self(shard->address());
    v1::SetShardMapResponse resp;
    grpc::Status s = Admin(shard->address())->SetShardMap(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
}

v1::StatsResponse Stats(const std::string& address) {
  grpc::ClientContext ctx;
  ctx.set_deadline(Deadline());
  v1::StatsResponse resp;
  grpc::Status s = Admin(address)->Stats(&ctx, v1::StatsRequest(), &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

const v1::TableStats* TableStatsOf(const v1::StatsResponse& stats,
                                   const std::string& name) {
  for (const v1::TableStats& t : stats.tables()) {
    if (t.name() == name) return &t;
  }
  return nullptr;
}

struct Cluster : testing::ShardCluster {
  v1::TablesConfig tables;
  std::vector<std::string> addresses;

  Cluster(const std::string& tables_text, int count, uint32_t num_slots,
          std::vector<std::string> more_flags = {})
      : ShardCluster(RECPS_SHARD_BINARY, tables_text,
                     Flags({"--world_size=1", "--consistency=async", "--seed=3",
                            "--threads=2"},
                           std::move(more_flags)),
                     count, num_slots),
        addresses(ShardCluster::addresses()) {
    EXPECT_TRUE(
        google::protobuf::TextFormat::ParseFromString(tables_text, &tables));
  }

  static std::vector<std::string> Flags(std::vector<std::string> a,
                                        const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  std::unique_ptr<client::EmbeddingClient> NewClient() {
    std::vector<client::TableSchema> schemas;
    for (const v1::TableConfig& t : tables.tables())
      schemas.push_back({t.name(), t.dim()});
    return ShardCluster::NewClient(std::move(schemas));
  }
};

absl::Status LookupAll(client::EmbeddingClient& c, int table, int dim,
                       const std::vector<int64_t>& ids) {
  std::vector<float> rows(ids.size() * dim);
  return c.Lookup(0, {{{table, ids, rows.data()}}});
}

std::vector<int64_t> DynamicIds(int64_t n, uint64_t salt) {
  std::vector<int64_t> ids;
  ids.reserve(n);
  for (int64_t i = 0; i < n; ++i)
    ids.push_back(static_cast<int64_t>(Mix64(i * 977 + salt)));
  return ids;
}

std::vector<int64_t> FixedIds(int64_t n) {
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = i;
  return ids;
}

constexpr char kRoutingTables[] = R"(
tables { name: "user" dim: 8 optimizer { kind: ADAGRAD learning_rate: 0.1 } }
tables { name: "item" dim: 8 num_rows: 1000 optimizer { kind: SGD learning_rate: 0.1 } }
)";

TEST(PlannerCluster, TableWiseTableIsServedByItsOneServer) {
  constexpr uint32_t kSlots = 128;
  Cluster cluster(kRoutingTables, 3, kSlots);
  ASSERT_EQ(cluster.shards().size(), 3u);
  planner::PlannerInput in;
  in.tables.assign(cluster.tables.tables().begin(),
                   cluster.tables.tables().end());
  for (const std::string& a : cluster.addresses) {
    v1::ServerSpec* s = in.topology.add_servers();
    s->set_address(a);
    s->set_memory_bytes(int64_t{1} << 30);
  }
  in.topology.set_num_workers(1);
  in.topology.set_batch_size(256);
  in.topology.set_num_slots(kSlots);
  v1::TableHint* user = &in.hints.emplace_back();
  user->set_table("user");
  user->set_expected_distinct_ids(100000);
  user->set_pinned_type(v1::ROW_WISE);
  v1::TableHint* item = &in.hints.emplace_back();
  item->set_table("item");
  item->set_pinned_type(v1::TABLE_WISE);
  item->add_pinned_servers(cluster.addresses[1]);
  absl::StatusOr<v1::ShardingPlan> plan = planner::PlanSharding(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<v1::ShardMap> map = planner::PlanToShardMap(*plan, 2);
  ASSERT_TRUE(map.ok()) << map.status();
  ASSERT_EQ(map->tables_size(), 1);
  Install(cluster.shards(), *map);

  auto c = cluster.NewClient();
  ASSERT_NE(c, nullptr);
  // Every id of item goes to server 1 (a server refuses ids it does not
  // own, so success alone proves the routing), user's spread as before.
  ASSERT_TRUE(LookupAll(*c, 1, 8, FixedIds(1000)).ok());
  ASSERT_TRUE(LookupAll(*c, 0, 8, DynamicIds(3000, 1)).ok());
  EXPECT_EQ(c->shard_map_epoch(), 2u);
  for (int s = 0; s < 3; ++s) {
    const v1::StatsResponse stats = Stats(cluster.addresses[s]);
    EXPECT_EQ(stats.shard_map_epoch(), 2u);
    const v1::TableStats* it = TableStatsOf(stats, "item");
    const v1::TableStats* us = TableStatsOf(stats, "user");
    ASSERT_NE(it, nullptr);
    ASSERT_NE(us, nullptr);
    EXPECT_EQ(it->rows(), s == 1 ? 1000 : 0) << cluster.addresses[s];
    EXPECT_GT(us->rows(), 500) << cluster.addresses[s];
  }
}

constexpr char kByteTables[] = R"(
tables { name: "sgd16" dim: 16 optimizer { kind: SGD learning_rate: 0.1 } }
tables { name: "adagrad32" dim: 32 num_rows: 30000 optimizer { kind: ADAGRAD learning_rate: 0.1 } }
tables { name: "rowwise64" dim: 64 optimizer { kind: ROWWISE_ADAGRAD learning_rate: 0.1 } }
tables { name: "adam8" dim: 8 optimizer { kind: ADAM learning_rate: 0.1 } }
)";

TEST(PlannerCluster, BytesStoredEstimateIsWithinTenPercentOfTheServersStats) {
  constexpr uint32_t kSlots = 1024;
  constexpr int64_t kIds = 30000;
  Cluster cluster(kByteTables, 1, kSlots);
  ASSERT_EQ(cluster.shards().size(), 1u);
  auto c = cluster.NewClient();
  ASSERT_NE(c, nullptr);
  for (int t = 0; t < cluster.tables.tables_size(); ++t) {
    const v1::TableConfig& tc = cluster.tables.tables(t);
    const std::vector<int64_t> ids =
        tc.num_rows() > 0 ? FixedIds(kIds) : DynamicIds(kIds, t);
    ASSERT_TRUE(LookupAll(*c, t, tc.dim(), ids).ok()) << tc.name();
  }
  const v1::StatsResponse stats = Stats(cluster.addresses[0]);

  planner::PlannerInput in;
  in.tables.assign(cluster.tables.tables().begin(),
                   cluster.tables.tables().end());
  v1::ServerSpec* s = in.topology.add_servers();
  s->set_address(cluster.addresses[0]);
  s->set_memory_bytes(int64_t{1} << 32);
  in.topology.set_num_workers(1);
  in.topology.set_batch_size(1024);
  in.topology.set_num_slots(kSlots);
  for (const v1::TableConfig& tc : cluster.tables.tables()) {
    if (tc.num_rows() > 0) continue;
    v1::TableHint& h = in.hints.emplace_back();
    h.set_table(tc.name());
    h.set_expected_distinct_ids(kIds);
  }
  absl::StatusOr<v1::ShardingPlan> plan = planner::PlanSharding(in);
  ASSERT_TRUE(plan.ok()) << plan.status();

  double reported_total = 0;
  for (const v1::TablePlan& tp : plan->tables()) {
    const v1::TableStats* ts = TableStatsOf(stats, tp.table());
    ASSERT_NE(ts, nullptr) << tp.table();
    EXPECT_EQ(ts->rows(), kIds);
    const double reported =
        static_cast<double>(ts->bytes() + ts->index_bytes());
    // The table's estimate plus the per-slot bookkeeping every table has
    // (and a fixed table's id -> row map).
    planner::TableModel model;
    for (const v1::TableConfig& tc : cluster.tables.tables()) {
      if (tc.name() == tp.table()) {
        model.dense_index_bytes =
            static_cast<double>(server::HostDenseIndexBytes(tc.num_rows()));
      }
    }
    const double estimated = static_cast<double>(tp.estimate().bytes_stored()) +
                             planner::FixedTableBytes(model, kSlots);
    EXPECT_NEAR(estimated, reported, 0.10 * reported)
        << tp.table() << ": rows+state " << ts->bytes() << " index "
        << ts->index_bytes() << "; estimate "
        << tp.estimate().ShortDebugString();
    // Rows and state alone are exact.
    EXPECT_EQ(tp.estimate().weight_bytes() + tp.estimate().optimizer_bytes(),
              ts->bytes())
        << tp.table();
    reported_total += reported;
  }
  const double server_estimate =
      static_cast<double>(plan->server_estimates(0).load().bytes_stored());
  EXPECT_NEAR(server_estimate, reported_total, 0.10 * reported_total);
  std::printf(
      "bytes stored: server reports %.0f, planner estimates %.0f (%+.2f%%)\n",
      reported_total, server_estimate,
      100 * (server_estimate - reported_total) / reported_total);
}

// A plan gives servers uneven shares of a table: here all of "big" to
// server 1. With --prefault_fixed_tables above 0, each map installed
// commits the memory of the share of each fixed table it gives the server:
// half of "big" each under the fixture's uniform map, then the other half
// on server 1, so that the rows it creates in the steps do not fault their
// pages in there. (Before, a server committed an expected share at start
// and kept it: rows past it faulted in inside the steps, 12% of the CPU of
// the U-var service form.)
TEST(PlannerCluster, APlannedShareOfAFixedTableIsCommittedAhead) {
  constexpr char kBig[] = R"(
tables { name: "big" dim: 64 num_rows: 400000 optimizer { kind: SGD learning_rate: 0.1 } }
tables { name: "user" dim: 8 optimizer { kind: ADAGRAD learning_rate: 0.1 } }
)";
  constexpr uint32_t kSlots = 64;
  Cluster cluster(kBig, 2, kSlots, {"--prefault_fixed_tables=0.5"});
  ASSERT_TRUE(cluster.ok());
  const int64_t half =
      server::HostRowBytes(OptimizerKind::kSgd, 64, RowPrecision::kFp32) * 200000;
  // The commit runs beside the server's requests: poll what it reports
  // committed of "big", then the process's resident bytes, which hold it.
  const auto big_committed = [&](int server) {
    const v1::StatsResponse stats = Stats(cluster.addresses[server]);
    for (const v1::TableStats& t : stats.tables()) {
      if (t.name() == "big") return t.committed_bytes();
    }
    return int64_t{-1};
  };
  const auto committed_reaches = [&](int server, int64_t bytes) {
    int64_t now = 0;
    for (int i = 0; i < 400; ++i) {
      now = big_committed(server);
      if (now >= bytes) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return now;
  };
  // The uniform map's half (by slot, so about half).
  ASSERT_GT(committed_reaches(0, half * 9 / 10), half * 9 / 10);
  ASSERT_GT(committed_reaches(1, half * 9 / 10), half * 9 / 10);
  const int64_t committed0 = big_committed(0);
  const int64_t before0 = Stats(cluster.addresses[0]).resident_bytes();
  const int64_t before1 = Stats(cluster.addresses[1]).resident_bytes();

  v1::ShardMap map = ShardMap::Uniform(2, kSlots, cluster.addresses).ToProto();
  v1::TableRouting* big = map.add_tables();
  big->set_table("big");
  big->set_owner(1);
  Install(cluster.shards(), map);

  EXPECT_EQ(committed_reaches(1, 2 * half), 2 * half) << "server 1 owns all of big now";
  EXPECT_GE(Stats(cluster.addresses[1]).resident_bytes() - before1, half * 8 / 10);
  // Server 0 owns none of it now: nothing more (the first map's half stays).
  EXPECT_EQ(big_committed(0), committed0);
  EXPECT_LT(Stats(cluster.addresses[0]).resident_bytes() - before0, half / 4);
}

}  // namespace
}  // namespace recps
