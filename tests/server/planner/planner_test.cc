// The planner end to end with fake topologies: which type each table gets,
// pins, errors, and the shard map a plan becomes.
#include "server/planner/planner.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "common/wire/shard_map.h"
#include "common/config/text_proto.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/planner/proposer.h"
#include "server/planner/table_model.h"

namespace recps::planner {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kSlots = 256;
constexpr int64_t kMiB = 1 << 20;

v1::TableConfig Table(
    const std::string& name, int dim, int64_t num_rows,
    v1::OptimizerConfig::Kind kind = v1::OptimizerConfig::SGD) {
  v1::TableConfig t;
  t.set_name(name);
  t.set_dim(dim);
  t.set_num_rows(num_rows);
  t.mutable_optimizer()->set_kind(kind);
  t.mutable_optimizer()->set_learning_rate(0.1f);
  return t;
}

v1::Topology Servers(int n, int64_t memory_bytes, int workers = 8,
                     int64_t batch = 4096) {
  v1::Topology topo;
  for (int i = 0; i < n; ++i) {
    v1::ServerSpec* s = topo.add_servers();
    s->set_address(absl::StrCat("10.0.0.", i, ":7000"));
    s->set_memory_bytes(memory_bytes);
  }
  topo.set_num_workers(workers);
  topo.set_batch_size(batch);
  topo.set_num_slots(kSlots);
  return topo;
}

v1::TableHint& Hint(PlannerInput& in, const std::string& table) {
  in.hints.emplace_back();
  in.hints.back().set_table(table);
  return in.hints.back();
}

const v1::TablePlan& TableIn(const v1::ShardingPlan& plan,
                             const std::string& name) {
  for (const v1::TablePlan& t : plan.tables()) {
    if (t.table() == name) return t;
  }
  ADD_FAILURE() << "no table " << name;
  static const v1::TablePlan* none = new v1::TablePlan();
  return *none;
}

void ExpectFits(const v1::ShardingPlan& plan) {
  for (const v1::ServerEstimate& s : plan.server_estimates()) {
    EXPECT_LE(s.load().bytes_stored(), s.usable_bytes()) << s.address();
  }
}

TEST(Planner, ATableTooBigForAnyOneServerGoesRowWise) {
  PlannerInput in;
  in.memory_reserve_fraction = 0;
  // 100k rows x (16 B + ~41 B index and row id) plus the slots' fixed
  // index = ~6.2 MiB; servers hold 2 MiB each.
  in.tables.push_back(Table("big", 4, 0));
  Hint(in, "big").set_expected_distinct_ids(100000);
  in.topology = Servers(4, 2 * kMiB);
  absl::StatusOr<v1::ShardingPlan> plan = PlanSharding(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const v1::TablePlan& big = TableIn(*plan, "big");
  EXPECT_EQ(big.type(), v1::ROW_WISE);
  EXPECT_EQ(big.slot_owner_size(), 0);  // the plan's global layout
  EXPECT_EQ(big.reason(), "only row-wise fits");
  EXPECT_EQ(big.estimate().rows(), 100000);
  ExpectFits(*plan);
  for (const v1::ServerEstimate& s : plan->server_estimates()) {
    EXPECT_NEAR(s.load().rows(), 25000, 1);
  }
}

TEST(Planner, HugeTableIsSpreadWhileSmallOnesStayWholeAndBalanced) {
  PlannerInput in;
  in.tables.push_back(Table("huge", 64, 0, v1::OptimizerConfig::ADAGRAD));
  Hint(in, "huge").set_expected_distinct_ids(2000000);
  for (int i = 0; i < 16; ++i)
    in.tables.push_back(Table(absl::StrCat("small", i), 16, 100));
  in.topology = Servers(4, 2048 * kMiB);
  // 100 Gbit/s: rows touched, not the network, bound the step (a
  // network-bound step would not care where the small tables go).
  for (v1::ServerSpec& server : *in.topology.mutable_servers()) {
    server.set_network_bytes_per_s(12.5e9);
  }
  absl::StatusOr<v1::ShardingPlan> plan = PlanSharding(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(TableIn(*plan, "huge").type(), v1::ROW_WISE);
  std::set<uint32_t> used;
  std::vector<int> per_server(4, 0);
  for (int i = 0; i < 16; ++i) {
    const v1::TablePlan& t = TableIn(*plan, absl::StrCat("small", i));
    EXPECT_EQ(t.type(), v1::TABLE_WISE) << t.table();
    used.insert(t.server());
    ++per_server[t.server()];
  }
  // Balanced: every server takes some of the small tables.
  EXPECT_EQ(used.size(), 4u);
  for (int n : per_server) EXPECT_EQ(n, 4);
  ExpectFits(*plan);
  // And that beats spreading everything.
  PlannerInput rw = in;
  for (int i = 0; i < 16; ++i)
    Hint(rw, absl::StrCat("small", i)).set_pinned_type(v1::ROW_WISE);
  absl::StatusOr<v1::ShardingPlan> all_rw = PlanSharding(rw);
  ASSERT_TRUE(all_rw.ok()) << all_rw.status();
  // 1.72 ms for huge + 4 x 0.24 ms of small tables per server, against
  // 1.72 ms + 16 x 0.12 ms (docs/planner.md, Example).
  EXPECT_NEAR(plan->predicted_step_seconds(), 2.68e-3, 0.02e-3)
      << FormatPlan(*plan);
  // (A little more: 100 rows hash unevenly over the servers' slots.)
  EXPECT_GE(all_rw->predicted_step_seconds(), 3.64e-3) << FormatPlan(*all_rw);
  EXPECT_LT(all_rw->predicted_step_seconds(), 3.80e-3) << FormatPlan(*all_rw);
}

TEST(Planner, TheServersRowCapForDynamicTablesIsAConstraint) {
  PlannerInput in;
  in.tables.push_back(Table("dyn", 8, 0));
  Hint(in, "dyn").set_expected_distinct_ids(3000);
  in.topology = Servers(4, 1024 * kMiB);
  for (v1::ServerSpec& s : *in.topology.mutable_servers())
    s.set_max_rows_per_table(1000);
  absl::StatusOr<v1::ShardingPlan> plan = PlanSharding(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(TableIn(*plan, "dyn").type(), v1::ROW_WISE);  // 750 rows each
  in.hints[0].set_expected_distinct_ids(5000);            // 1250 rows each
  plan = PlanSharding(in);
  ASSERT_FALSE(plan.ok());
  EXPECT_THAT(plan.status().message(), HasSubstr("max_rows_per_table (1000)"));
}

TEST(Planner, FewWideRowsGoColumnWise) {
  PlannerInput in;
  // 7 rows hash unevenly over 4 servers (one holds 2 or more), while 4
  // column groups split every row evenly.
  in.tables.push_back(Table("wide", 2048, 7, v1::OptimizerConfig::ADAM));
  in.topology = Servers(4, 64 * kMiB);
  absl::StatusOr<v1::ShardingPlan> plan = PlanSharding(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const v1::TablePlan& wide = TableIn(*plan, "wide");
  ASSERT_EQ(wide.type(), v1::COLUMN_WISE) << FormatPlan(*plan);
  ASSERT_EQ(wide.column_groups_size(), 4);
  std::set<uint32_t> servers;
  int next = 0;
  for (const v1::ColumnGroupPlan& g : wide.column_groups()) {
    EXPECT_EQ(g.column_begin(), next);
    next = g.column_end();
    servers.insert(g.server());
    EXPECT_EQ(g.estimate().rows(), 7);
  }
  EXPECT_EQ(next, 2048);
  EXPECT_EQ(servers.size(), 4u);
  // The map carries the groups: each a table of its own on its server.
  absl::StatusOr<v1::ShardMap> proto = PlanToShardMap(*plan, 1);
  ASSERT_TRUE(proto.ok()) << proto.status();
  absl::StatusOr<ShardMap> map = ShardMap::FromProto(*proto);
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_TRUE(map->CheckWidth("wide", 2048).ok());
  const absl::Span<const ColumnGroup> groups =
      map->ColumnGroupsOf(StableNameKey("wide"));
  ASSERT_EQ(groups.size(), 4u);
  for (int g = 0; g < 4; ++g) {
    EXPECT_EQ(groups[g].begin, wide.column_groups(g).column_begin());
    EXPECT_EQ(groups[g].end, wide.column_groups(g).column_end());
    EXPECT_EQ(groups[g].owner, static_cast<int>(wide.column_groups(g).server()));
    EXPECT_EQ(map->RouteOf(groups[g].key).single_owner(), groups[g].owner);
  }
  EXPECT_TRUE(map->RouteOf(StableNameKey("wide")).column_split());
}

TEST(Planner, RowWiseAdagradIsNeverSplitColumnWise) {
  PlannerInput in;
  // FewWideRowsGoColumnWise's table, with row-wise Adagrad.
  in.tables.push_back(Table("wide", 2048, 7, v1::OptimizerConfig::ROWWISE_ADAGRAD));
  in.topology = Servers(4, 64 * kMiB);
  absl::StatusOr<v1::ShardingPlan> plan = PlanSharding(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(TableIn(*plan, "wide").type(), v1::COLUMN_WISE) << FormatPlan(*plan);
  // A pin says why not.
  Hint(in, "wide").set_pinned_type(v1::COLUMN_WISE);
  plan = PlanSharding(in);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("row-wise Adagrad"));
  in.hints[0].set_pinned_type(v1::SHARDING_TYPE_UNSPECIFIED);
  in.hints[0].set_column_groups(2);
  EXPECT_THAT(PlanSharding(in).status().message(), HasSubstr("row-wise Adagrad"));
}

TEST(Planner, PinnedTypeAndServersAreHonoured) {
  PlannerInput in;
  in.tables.push_back(Table("a", 16, 0));
  in.tables.push_back(Table("b", 16, 1000));
  in.tables.push_back(Table("c", 16, 5000));
  in.topology = Servers(4, 1024 * kMiB);
  // a would go row-wise; pin it table-wise on server 2.
  v1::TableHint& a = Hint(in, "a");
  a.set_expected_distinct_ids(1000000);
  a.set_pinned_type(v1::TABLE_WISE);
  a.add_pinned_servers("10.0.0.2:7000");
  // c row-wise over servers 0 and 1 only.
  v1::TableHint& c = Hint(in, "c");
  c.set_pinned_type(v1::ROW_WISE);
  c.add_pinned_servers("10.0.0.1:7000");
  c.add_pinned_servers("10.0.0.0:7000");
  absl::StatusOr<v1::ShardingPlan> plan = PlanSharding(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const v1::TablePlan& pa = TableIn(*plan, "a");
  EXPECT_EQ(pa.type(), v1::TABLE_WISE);
  EXPECT_EQ(plan->servers(pa.server()), "10.0.0.2:7000");
  EXPECT_THAT(pa.reason(), HasSubstr("pinned"));
  const v1::TablePlan& pc = TableIn(*plan, "c");
  EXPECT_EQ(pc.type(), v1::ROW_WISE);
  ASSERT_EQ(pc.slot_owner_size(), static_cast<int>(kSlots));
  std::set<uint32_t> owners(pc.slot_owner().begin(), pc.slot_owner().end());
  EXPECT_EQ(owners, (std::set<uint32_t>{0, 1}));
  EXPECT_EQ(pc.estimate().rows(), 5000);
  // Server 2 holds all of a.
  EXPECT_GE(plan->server_estimates(2).load().rows(), 1000000);

  // The map routes a to its one server and c by its own slots.
  absl::StatusOr<v1::ShardMap> proto = PlanToShardMap(*plan, 5);
  ASSERT_TRUE(proto.ok()) << proto.status();
  absl::StatusOr<ShardMap> map = ShardMap::FromProto(*proto);
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->epoch(), 5u);
  const TableRoute ra = map->RouteOf(StableNameKey("a"));
  const TableRoute rc = map->RouteOf(StableNameKey("c"));
  for (int64_t id = -500; id < 500; ++id) {
    EXPECT_EQ(map->servers()[ra.OwnerOf(id)], "10.0.0.2:7000");
    EXPECT_LT(rc.OwnerOf(id), 2);
  }
}

TEST(Planner, APinThatCannotFitSaysWhy) {
  PlannerInput in;
  in.memory_reserve_fraction = 0;
  in.tables.push_back(Table("big", 4, 0));
  v1::TableHint& h = Hint(in, "big");
  h.set_expected_distinct_ids(100000);
  h.set_pinned_type(v1::TABLE_WISE);
  in.topology = Servers(4, 3 * kMiB / 2);
  absl::StatusOr<v1::ShardingPlan> plan = PlanSharding(in);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(), HasSubstr("table 'big' does not fit"));
  EXPECT_THAT(plan.status().message(), HasSubstr("pinned table-wise"));
  EXPECT_THAT(plan.status().message(), HasSubstr("row-wise over all servers"));
}

TEST(Planner, AnImpossibleRequestNamesTheTableTheShortfallAndTheFixes) {
  PlannerInput in;
  in.memory_reserve_fraction = 0;
  in.tables.push_back(Table("small", 8, 1000));
  in.tables.push_back(Table("giant", 32, 0, v1::OptimizerConfig::ADAM));
  Hint(in, "giant").set_expected_distinct_ids(10000000);  // ~4.05 GiB
  in.topology = Servers(2, 512 * kMiB);
  absl::StatusOr<v1::ShardingPlan> plan = PlanSharding(in);
  ASSERT_FALSE(plan.ok());
  const std::string msg(plan.status().message());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(msg, HasSubstr("table 'giant' does not fit"));
  EXPECT_THAT(msg, HasSubstr("10000000 rows of 400 B"));
  EXPECT_THAT(msg, HasSubstr("short by"));
  EXPECT_THAT(msg, HasSubstr("add at least 7 more server(s) of 512.00 MiB"));
  EXPECT_THAT(msg, HasSubstr("FP16"));
}

TEST(Planner, SixteenBitTablesArePlannedAndApplied) {
  for (v1::StoragePrecision p : {v1::FP16, v1::BF16}) {
    PlannerInput in;
    in.tables.push_back(Table("t", 16, 1000));
    in.tables.back().set_precision(p);
    Hint(in, "t").set_precision(p);  // repeating the config is fine
    in.topology = Servers(2, 64 * kMiB);
    absl::StatusOr<v1::ShardingPlan> plan = PlanSharding(in);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(TableIn(*plan, "t").precision(), p);
    EXPECT_EQ(TableIn(*plan, "t").estimate().weight_bytes(), 1000 * 16 * 2);
    absl::StatusOr<v1::ShardMap> map = PlanToShardMap(*plan, 1);
    EXPECT_TRUE(map.ok()) << map.status();
  }
}

TEST(Planner, AHintCannotChangeTheConfiguredPrecision) {
  PlannerInput in;
  in.tables.push_back(Table("t", 16, 1000));
  Hint(in, "t").set_precision(v1::FP16);
  in.topology = Servers(2, 64 * kMiB);
  absl::StatusOr<v1::ShardingPlan> plan = PlanSharding(in);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("precision: FP16"));
  EXPECT_THAT(plan.status().message(), HasSubstr("table config"));
}

TEST(Planner, AColumnWisePinThatCannotSplitSaysSo) {
  PlannerInput in;
  in.tables.push_back(Table("narrow", 6, 100));
  Hint(in, "narrow").set_pinned_type(v1::COLUMN_WISE);
  in.topology = Servers(4, 64 * kMiB);
  absl::StatusOr<v1::ShardingPlan> plan = PlanSharding(in);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("cannot be split"));
  // An explicit group count is honoured even below 4 columns.
  in.hints[0].set_column_groups(3);
  plan = PlanSharding(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(TableIn(*plan, "narrow").column_groups_size(), 3);
}

TEST(Planner, BadInputsNameWhatIsWrong) {
  PlannerInput in;
  in.tables.push_back(Table("dyn", 8, 0));
  in.topology = Servers(2, kMiB);
  EXPECT_THAT(PlanSharding(in).status().message(),
              HasSubstr("expected_distinct_ids"));
  Hint(in, "dyn").set_expected_distinct_ids(10);
  Hint(in, "nope");
  EXPECT_THAT(PlanSharding(in).status().message(),
              HasSubstr("'nope': no such table"));
  in.hints.pop_back();
  in.hints[0].add_pinned_servers("elsewhere:1");
  EXPECT_THAT(PlanSharding(in).status().message(), HasSubstr("'elsewhere:1'"));
  in.hints[0].clear_pinned_servers();
  in.topology.mutable_servers(1)->set_memory_bytes(0);
  EXPECT_THAT(PlanSharding(in).status().message(), HasSubstr("memory_bytes"));
  in.topology = Servers(2, kMiB, /*workers=*/0);
  EXPECT_THAT(PlanSharding(in).status().message(), HasSubstr("num_workers"));
}

TEST(Planner, PlanIsVersionedAndSummarisesItsInputs) {
  PlannerInput in;
  in.tables.push_back(Table("t", 16, 1000));
  in.topology = Servers(3, 64 * kMiB, 4, 128);
  absl::StatusOr<v1::ShardingPlan> plan = PlanSharding(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->format_version(), kPlanFormatVersion);
  EXPECT_EQ(plan->num_slots(), kSlots);
  EXPECT_EQ(plan->slot_owner_size(), static_cast<int>(kSlots));
  EXPECT_EQ(plan->inputs().num_servers(), 3);
  EXPECT_EQ(plan->inputs().num_workers(), 4);
  EXPECT_EQ(plan->inputs().batch_size(), 128);
  EXPECT_EQ(plan->inputs().total_rows(), 1000);
  EXPECT_GT(plan->predicted_step_seconds(), 0);
  EXPECT_THAT(FormatPlan(*plan), HasSubstr("t "));
  v1::ShardingPlan newer = *plan;
  newer.set_format_version(kPlanFormatVersion + 1);
  EXPECT_EQ(PlanToShardMap(newer, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Planner, InputFromJobTakesPoolingAndIdSpaceFromItsData) {
  v1::JobConfig job;
  *job.add_tables() = Table("user", 8, 0);
  *job.add_tables() = Table("item", 8, 500);
  for (const char* f : {"u1", "u2", "i1"}) {
    v1::FeatureConfig* fc = job.add_features();
    fc->set_name(f);
    fc->set_table(f[0] == 'u' ? "user" : "item");
    v1::SyntheticFeatureConfig* sf =
        job.mutable_data()->mutable_synthetic()->add_features();
    sf->set_id_space(f[1] == '1' ? 1000 : 3000);
    sf->set_min_ids_per_bag(1);
    sf->set_max_ids_per_bag(3);
  }
  v1::PlanSpec spec;
  *spec.mutable_topology() = Servers(2, 64 * kMiB);
  spec.set_memory_reserve_fraction(0.2);
  const PlannerInput in = PlannerInputFromJob(job, spec);
  EXPECT_EQ(in.tables.size(), 2u);
  EXPECT_DOUBLE_EQ(in.memory_reserve_fraction, 0.2);
  ASSERT_EQ(in.default_pooling.size(), 2u);
  EXPECT_EQ(in.default_pooling[0],
            (std::pair<std::string, double>{"user", 4.0}));
  EXPECT_EQ(in.default_pooling[1],
            (std::pair<std::string, double>{"item", 2.0}));
  ASSERT_EQ(in.default_distinct_ids.size(), 2u);
  EXPECT_EQ(in.default_distinct_ids[0].second, 3000);
  absl::StatusOr<v1::ShardingPlan> plan = PlanSharding(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(TableIn(*plan, "user").estimate().rows(), 3000);
  EXPECT_EQ(TableIn(*plan, "item").estimate().rows(), 500);
}

TEST(Planner, ManyTablesOnManyServersFitAndUseEveryServer) {
  PlannerInput in;
  for (int i = 0; i < 300; ++i) {
    in.tables.push_back(Table(absl::StrCat("t", i), 16 << (i % 3),
                              i % 2 ? 50000 : 0,
                              i % 4 ? v1::OptimizerConfig::ROWWISE_ADAGRAD
                                    : v1::OptimizerConfig::ADAM));
    if (i % 2 == 0)
      Hint(in, absl::StrCat("t", i))
          .set_expected_distinct_ids(100000 * (i % 7 + 1));
  }
  in.topology = Servers(32, 1024 * kMiB);
  in.topology.set_num_slots(4096);
  absl::StatusOr<v1::ShardingPlan> plan = PlanSharding(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectFits(*plan);
  for (const v1::ServerEstimate& s : plan->server_estimates()) {
    EXPECT_GT(s.load().rows(), 0) << s.address();
  }
}

TEST(Planner, TheExampleSpecPlansTheSmallJob) {
  v1::JobConfig job;
  v1::PlanSpec spec;
  ASSERT_TRUE(
      ReadTextProto(RECPS_SOURCE_DIR "/examples/small.textproto", &job).ok());
  ASSERT_TRUE(
      ReadTextProto(RECPS_SOURCE_DIR "/examples/plan_spec.textproto", &spec)
          .ok());
  // The coordinator fills in the addresses and the job's batch size.
  v1::ServerSpec server = spec.topology().servers(0);
  spec.mutable_topology()->clear_servers();
  for (const char* a : {"127.0.0.1:7001", "127.0.0.1:7002"}) {
    *spec.mutable_topology()->add_servers() = server;
    spec.mutable_topology()->mutable_servers()->rbegin()->set_address(a);
  }
  spec.mutable_topology()->set_batch_size(job.training().batch_size());
  absl::StatusOr<v1::ShardingPlan> plan =
      PlanSharding(PlannerInputFromJob(job, spec));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(TableIn(*plan, "t7").type(), v1::TABLE_WISE);
  EXPECT_EQ(TableIn(*plan, "t0").estimate().rows(), 100000);
  EXPECT_TRUE(PlanToShardMap(*plan, 1).ok());
  std::printf("%s", FormatPlan(*plan).c_str());
}

}  // namespace
}  // namespace recps::planner
