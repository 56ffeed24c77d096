// The admin CLI's reports from hand-made snapshots: percentiles, rates,
// imbalance, health, tables, slot ranges, text and JSON.
#include <string>
#include <vector>

#include "client/admin/cluster_report.h"
#include "common/imbalance.h"
#include "common/wire/shard_map.h"
#include "client/admin/report_text.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace recps::client::admin {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::RpcStats Rpc(const std::string& name, std::vector<int64_t> counts,
                 double sum) {
  v1::RpcStats r;
  r.set_rpc(name);
  for (double b : {0.001, 0.002, 0.004}) r.add_bucket_upper_seconds(b);
  int64_t n = 0;
  for (int64_t c : counts) {
    r.add_bucket_counts(c);
    n += c;
  }
  r.set_count(n);
  r.set_latency_seconds_sum(sum);
  return r;
}

v1::StatsResponse Stats(int64_t rows, int64_t lookup_ids, double uptime,
                        uint64_t epoch = 1) {
  v1::StatsResponse s;
  v1::TableStats* t = s.add_tables();
  t->set_name("user");
  t->set_dim(8);
  t->set_rows(rows);
  t->set_bytes(rows * 32);
  t->set_lookup_ids(lookup_ids);
  s.set_total_rows(rows);
  s.set_row_bytes(rows * 32);
  s.set_resident_bytes(1 << 20);
  s.set_shard_map_epoch(epoch);
  s.set_uptime_seconds(uptime);
  return s;
}

v1::Member ShardMember(const std::string& id, const std::string& address,
                       v1::MemberState state) {
  v1::Member m;
  m.set_member_id(id);
  m.set_role(v1::SHARD_SERVER);
  m.set_address(address);
  m.set_rank(-1);
  m.set_state(state);
  m.set_last_heartbeat_unix_ms(absl::ToUnixMillis(absl::Now()) - 30000);
  return m;
}

// Two servers "a" and "b", 4 slots split 2/2, registered with a
// coordinator.
ClusterSnapshot TwoServers(v1::StatsResponse a, v1::StatsResponse b) {
  ClusterSnapshot s;
  s.coordinator = "coord:1";
  s.map.set_epoch(1);
  s.map.set_num_slots(4);
  s.map.add_servers("a:1");
  s.map.add_servers("b:1");
  for (uint32_t owner : {0, 0, 1, 1}) s.map.add_slot_owner(owner);
  s.members.emplace();
  s.members->set_shard_map_epoch(1);
  s.members->set_expected_shard_servers(2);
  *s.members->add_members() = ShardMember("shard-0", "a:1", v1::ALIVE);
  *s.members->add_members() = ShardMember("shard-1", "b:1", v1::ALIVE);
  s.servers = {"a:1", "b:1"};
  s.stats.push_back(std::move(a));
  s.stats.push_back(std::move(b));
  s.taken = absl::Now();
  return s;
}

TEST(HistogramQuantileTest, InterpolatesInsideTheBucket) {
  const std::vector<double> bounds = {1, 2, 4};
  // 10 in (0,1], 10 in (1,2]: the median is the top of the first bucket.
  EXPECT_DOUBLE_EQ(HistogramQuantile(bounds, {10, 10, 0, 0}, 0.5), 1.0);
  EXPECT_DOUBLE_EQ(HistogramQuantile(bounds, {10, 10, 0, 0}, 0.75), 1.5);
  EXPECT_DOUBLE_EQ(HistogramQuantile(bounds, {0, 0, 4, 0}, 0.5), 3.0);
  // In the overflow bucket: the largest bound.
  EXPECT_DOUBLE_EQ(HistogramQuantile(bounds, {1, 0, 0, 99}, 0.99), 4.0);
  EXPECT_DOUBLE_EQ(HistogramQuantile(bounds, {0, 0, 0, 0}, 0.5), 0.0);
}

TEST(SummarizeRpcTest, SubtractsTheEarlierSample) {
  const v1::RpcStats before = Rpc("Lookup", {10, 0, 0, 0}, 0.005);
  const v1::RpcStats after = Rpc("Lookup", {10, 0, 10, 0}, 0.035);
  const v1::LatencySummary l = SummarizeRpc(&before, after, 2.0);
  EXPECT_EQ(l.count(), 10);
  EXPECT_DOUBLE_EQ(l.per_second(), 5.0);
  EXPECT_DOUBLE_EQ(l.mean_ms(), 3.0);
  EXPECT_DOUBLE_EQ(l.p50_ms(), 3.0);  // middle of (2, 4] ms
  EXPECT_NEAR(l.p99_ms(), 3.98, 1e-9);

  const v1::LatencySummary all = SummarizeRpc(nullptr, after, 0);
  EXPECT_EQ(all.count(), 20);
  EXPECT_EQ(all.per_second(), 0);
  EXPECT_DOUBLE_EQ(all.p50_ms(), 1.0);
}

TEST(MaxOverMeanTest, IsTheLargestOverTheMean) {
  EXPECT_DOUBLE_EQ(MaxOverMean({1, 1, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(MaxOverMean({3, 1}), 1.5);
  EXPECT_DOUBLE_EQ(MaxOverMean({0, 0}), 0.0);
  EXPECT_DOUBLE_EQ(MaxOverMean({}), 0.0);
}

TEST(SlotRangesTest, CollapsesRuns) {
  EXPECT_EQ(SlotRanges({0, 1, 2, 3, 7, 9, 10}), "0-3,7,9-10");
  EXPECT_EQ(SlotRanges({}), "");
}

TEST(BuildClusterStatusTest, RatesLatencyAndImbalanceOverTheInterval) {
  v1::StatsResponse a0 = Stats(100, 1000, 10.0), b0 = Stats(300, 1000, 10.0);
  v1::StatsResponse a1 = Stats(100, 1200, 12.0), b1 = Stats(300, 1600, 12.0);
  *a0.add_rpcs() = Rpc("Lookup", {5, 0, 0, 0}, 0.004);
  *a1.add_rpcs() = Rpc("Lookup", {5, 4, 0, 0}, 0.010);
  ClusterSnapshot before = TwoServers(a0, b0);
  ClusterSnapshot after = TwoServers(a1, b1);
  after.taken = before.taken + absl::Seconds(2);

  const v1::ClusterStatus status = BuildClusterStatus(&before, after);
  EXPECT_TRUE(status.healthy()) << status.DebugString();
  EXPECT_DOUBLE_EQ(status.sample_seconds(), 2.0);
  ASSERT_EQ(status.servers_size(), 2);
  const v1::ServerStatus& a = status.servers(0);
  EXPECT_EQ(a.member_id(), "shard-0");
  EXPECT_EQ(a.slots(), 2);
  EXPECT_DOUBLE_EQ(a.lookup_ids_per_second(), 100.0);
  EXPECT_EQ(a.lookup().count(), 4);
  EXPECT_DOUBLE_EQ(a.lookup().per_second(), 2.0);
  EXPECT_DOUBLE_EQ(a.lookup().mean_ms(), 1.5);
  EXPECT_DOUBLE_EQ(status.servers(1).lookup_ids_per_second(), 300.0);
  EXPECT_EQ(status.total_rows(), 400);
  EXPECT_DOUBLE_EQ(status.rows_imbalance(), 1.5);
  EXPECT_DOUBLE_EQ(status.lookup_imbalance(), 1.5);
}

TEST(BuildClusterStatusTest, SaysHowTheMapPlacesTheTables) {
  ClusterSnapshot after = TwoServers(Stats(100, 1000, 10.0), Stats(300, 1000, 10.0));
  after.sharding = "planned (plan 1, table-wise-after-0): predicted step 1.462 ms";
  const v1::ClusterStatus status = BuildClusterStatus(nullptr, after);
  EXPECT_EQ(status.sharding(), after.sharding);
  EXPECT_THAT(FormatClusterStatus(status),
              ::testing::ContainsRegex("sharding +planned \\(plan 1, table-wise-after-0\\)"));
}

TEST(BuildClusterStatusTest, ShowsCopiesBackupsAndUnderReplicatedSlots) {
  ClusterSnapshot s = TwoServers(Stats(1, 0, 1.0), Stats(1, 0, 1.0));
  s.map.set_replication(2);
  // a's slots 0-1 backed up on b; b's slot 2 on a, slot 3's backup lost.
  for (uint32_t b : {1u, 1u, 0u, kNoBackup}) s.map.add_slot_backups(b);
  const v1::ClusterStatus status = BuildClusterStatus(nullptr, s);
  EXPECT_EQ(status.replication(), 2u);
  EXPECT_EQ(status.under_replicated_units(), 1);
  EXPECT_EQ(status.servers(0).backup_slots(), 1);
  EXPECT_EQ(status.servers(1).backup_slots(), 2);
  EXPECT_FALSE(status.healthy());
  const std::string text = FormatClusterStatus(status);
  EXPECT_THAT(text, HasSubstr("2 copies of each row (1 units under-replicated)"));
  EXPECT_THAT(text, HasSubstr("1 units (slots, tables) have fewer than 2 copies"));

  const v1::ShardsReport shards = BuildShardsReport(s);
  EXPECT_EQ(shards.servers(1).backup_slot_ranges(), "0-1");
  EXPECT_EQ(shards.servers(0).backup_slot_ranges(), "2");
  EXPECT_THAT(FormatShardsReport(shards, false), ::testing::ContainsRegex("BACKUP OF SLOTS"));
}

TEST(BuildClusterStatusTest, SpareServersAreNotPartOfTheBalance) {
  ClusterSnapshot s = TwoServers(Stats(100, 0, 1.0), Stats(300, 0, 1.0));
  *s.members->add_members() = ShardMember("shard-2", "c:1", v1::ALIVE);
  s.servers.push_back("c:1");
  s.stats.push_back(Stats(0, 0, 1.0));
  const v1::ClusterStatus status = BuildClusterStatus(nullptr, s);
  ASSERT_EQ(status.servers_size(), 3);
  EXPECT_EQ(status.servers(2).slots(), 0);
  EXPECT_DOUBLE_EQ(status.rows_imbalance(), 1.5);
  EXPECT_TRUE(status.healthy());
}

TEST(BuildClusterStatusTest, ARestartedServerCountsFromItsStart) {
  ClusterSnapshot before =
      TwoServers(Stats(1, 1000, 100.0), Stats(1, 0, 100.0));
  ClusterSnapshot after = TwoServers(Stats(1, 40, 4.0), Stats(1, 0, 101.0));
  const v1::ClusterStatus status = BuildClusterStatus(&before, after);
  EXPECT_DOUBLE_EQ(status.servers(0).lookup_ids_per_second(), 10.0);
}

TEST(BuildClusterStatusTest, WorkersThatLeftAreNotAProblem) {
  ClusterSnapshot s = TwoServers(Stats(1, 0, 1.0), Stats(1, 0, 1.0));
  v1::Member* worker = s.members->add_members();
  worker->set_member_id("worker-0");
  worker->set_role(v1::WORKER);
  worker->set_rank(0);
  worker->set_state(v1::LEFT);  // its job finished and it said goodbye
  const v1::ClusterStatus status = BuildClusterStatus(nullptr, s);
  EXPECT_TRUE(status.healthy());
  EXPECT_THAT(status.problems(), ::testing::IsEmpty());
  EXPECT_THAT(FormatClusterStatus(status), HasSubstr("1 left"));
}

TEST(BuildClusterStatusTest, ARefusedMapPushIsAProblem) {
  ClusterSnapshot s = TwoServers(Stats(1, 0, 1.0), Stats(1, 0, 1.0));
  v1::MapPushRefusal* r = s.members->add_map_push_refusals();
  r->set_address("b:2");
  r->set_epoch(2);
  r->set_message("epoch 2 would take away slots 3-4 holding 12 rows");
  const v1::ClusterStatus status = BuildClusterStatus(nullptr, s);
  EXPECT_FALSE(status.healthy());
  EXPECT_THAT(status.problems(),
              ::testing::Contains(HasSubstr(
                  "shard server b:2 refused shard map epoch 2: epoch 2 would take away")));
}

TEST(BuildClusterStatusTest, ProblemsMakeItUnhealthy) {
  ClusterSnapshot s =
      TwoServers(Stats(1, 0, 1.0, /*epoch=*/0), Stats(1, 0, 1.0));
  s.stats[1] = absl::UnavailableError("connection refused");
  s.members->mutable_members(1)->set_state(v1::EXPIRED);
  v1::Member* worker = s.members->add_members();
  worker->set_member_id("worker-0");
  worker->set_role(v1::WORKER);
  worker->set_rank(0);
  worker->set_state(v1::EXPIRED);

  const v1::ClusterStatus status = BuildClusterStatus(nullptr, s);
  EXPECT_FALSE(status.healthy());
  ASSERT_EQ(status.servers_size(), 2);
  EXPECT_THAT(status.servers(0).problems(),
              ElementsAre(HasSubstr("routes by shard map epoch 0")));
  EXPECT_FALSE(status.servers(1).reachable());
  EXPECT_THAT(
      status.servers(1).problems(),
      ElementsAre(HasSubstr("lease expired"), HasSubstr("unreachable")));
  EXPECT_THAT(status.problems(),
              ElementsAre(HasSubstr("worker-0 (worker rank 0)")));

  const std::string text = FormatClusterStatus(status);
  EXPECT_THAT(text, HasSubstr("UNHEALTHY (4 problems)"));
  EXPECT_THAT(text, HasSubstr("b:1: unreachable: connection refused"));
}

TEST(BuildClusterStatusTest, NoMapYet) {
  ClusterSnapshot s = TwoServers(Stats(0, 0, 1.0, 0), Stats(0, 0, 1.0, 0));
  s.map.Clear();
  s.map_error = "waiting for 1 more shard server";
  const v1::ClusterStatus status = BuildClusterStatus(nullptr, s);
  EXPECT_FALSE(status.healthy());
  EXPECT_THAT(status.problems(),
              ElementsAre("no shard map yet: waiting for 1 more shard server"));
}

TEST(BuildTablesReportTest, SumsOverServersAndListsTheSilentOnes) {
  ClusterSnapshot s = TwoServers(Stats(100, 5, 1.0), Stats(300, 7, 1.0));
  s.servers.push_back("c:1");
  s.stats.push_back(absl::UnavailableError("down"));
  const v1::TablesReport report = BuildTablesReport(s);
  ASSERT_EQ(report.tables_size(), 1);
  EXPECT_EQ(report.tables(0).rows(), 400);
  EXPECT_EQ(report.tables(0).bytes(), 400 * 32);
  EXPECT_EQ(report.tables(0).lookup_ids(), 12);
  ASSERT_EQ(report.tables(0).servers_size(), 2);
  EXPECT_EQ(report.tables(0).servers(1).server(), "b:1");
  EXPECT_EQ(report.tables(0).servers(1).rows(), 300);
  EXPECT_THAT(report.unreachable(), ElementsAre("c:1"));
  EXPECT_THAT(FormatTablesReport(report), HasSubstr("75.0%"));
}

TEST(BuildShardsReportTest, SlotRangesPerServer) {
  const v1::ShardsReport report =
      BuildShardsReport(TwoServers(Stats(100, 0, 1.0), Stats(300, 0, 1.0)));
  ASSERT_EQ(report.servers_size(), 2);
  EXPECT_EQ(report.servers(0).slot_ranges(), "0-1");
  EXPECT_EQ(report.servers(1).slot_ranges(), "2-3");
  EXPECT_EQ(report.servers(1).index(), 1);
  EXPECT_EQ(report.servers(1).rows(), 300);
  EXPECT_TRUE(report.routed_tables().empty());
}

TEST(BuildShardsReportTest, TablesWithTheirOwnRouting) {
  ClusterSnapshot s = TwoServers(Stats(1, 0, 1.0), Stats(1, 0, 1.0));
  v1::TableRouting* whole = s.map.add_tables();
  whole->set_table("t7");
  whole->set_owner(1);
  v1::TableRouting* own = s.map.add_tables();
  own->set_table("big");
  for (uint32_t o : {1, 0, 1, 1}) own->add_slot_owner(o);
  const v1::ShardsReport report = BuildShardsReport(s);
  ASSERT_EQ(report.routed_tables_size(), 2);
  EXPECT_EQ(report.routed_tables(0).layout(), "table-wise");
  EXPECT_THAT(report.routed_tables(0).servers(), ElementsAre("b:1"));
  EXPECT_EQ(report.routed_tables(1).layout(), "own slots");
  EXPECT_THAT(report.routed_tables(1).servers(), ElementsAre("a:1", "b:1"));
  EXPECT_THAT(FormatShardsReport(report, false),
              HasSubstr("t7     table-wise  b:1"));
}

TEST(TextTableTest, AlignsColumnsAndRightAlignsNumbers) {
  TextTable t({"NAME", "ROWS"});
  t.AddRow({"user", "5"});
  t.AddRow({"item", "1200"});
  EXPECT_EQ(t.Render(), "NAME  ROWS\nuser     5\nitem  1200\n");

  // Addresses are not numbers; sizes with units and "-" are.
  TextTable u({"SERVER", "RSS"});
  u.AddRow({"127.0.0.1:7000", "1.50 KiB"});
  u.AddRow({"10.0.0.2:7000", "-"});
  EXPECT_EQ(u.Render(),
            "SERVER               RSS\n127.0.0.1:7000  1.50 KiB\n10.0.0.2:7000 "
            "         -\n");
}

TEST(HumanBytesTest, BinaryUnits) {
  EXPECT_EQ(HumanBytes(512), "512 B");
  EXPECT_EQ(HumanBytes(1536), "1.50 KiB");
  EXPECT_EQ(HumanBytes(int64_t{3} << 30), "3.00 GiB");
}

TEST(ToJsonTest, RoundTripsWithEveryField) {
  v1::ClusterStatus status;
  status.set_shard_map_epoch(7);
  status.add_servers()->set_address("a:1");
  absl::StatusOr<std::string> json = ToJson(status);
  ASSERT_TRUE(json.ok());
  EXPECT_THAT(*json, HasSubstr("\"shard_map_epoch\": \"7\""));
  EXPECT_THAT(*json, HasSubstr("\"healthy\": false"));  // defaults printed
  v1::ClusterStatus back;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*json, &back).ok());
  EXPECT_EQ(back.SerializeAsString(), status.SerializeAsString());
}

}  // namespace
}  // namespace recps::client::admin
