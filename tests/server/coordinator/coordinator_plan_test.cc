// The coordinator with a plan spec: the first shard map comes from the
// sharding planner, the plan is stored (kept across a restart) and served.
#include <memory>
#include <string>

#include "common/wire/shard_map.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_store.h"
#include "tests/testing/local_shard.h"

namespace recps::server {
namespace {

using ::testing::HasSubstr;

class CoordinatorPlanTest : public ::testing::Test {
 protected:
  std::unique_ptr<Coordinator> Open(std::optional<v1::PlanSpec> spec,
                                    Sharding sharding = Sharding::kPlanned,
                                    const std::string& state = "state") {
    auto store = CoordinatorStore::Open(dir_.path() + "/" + state);
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return nullptr;
    CoordinatorOptions options;
    options.num_shards = 2;
    options.num_slots = 64;
    options.plan_spec = std::move(spec);
    options.sharding = sharding;
    auto c = Coordinator::Create(*std::move(store), options, nullptr);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  static v1::JobConfig Job() {
    v1::JobConfig job;
    for (const char* name : {"user", "item"}) {
      v1::TableConfig* t = job.add_tables();
      t->set_name(name);
      t->set_dim(8);
      t->set_num_rows(name[0] == 'i' ? 1000 : 0);
      t->mutable_optimizer()->set_kind(v1::OptimizerConfig::SGD);
      t->mutable_optimizer()->set_learning_rate(0.1f);
    }
    // What config::ValidateJobConfig asks for besides the tables.
    EXPECT_TRUE(google::protobuf::TextFormat::MergeFromString(R"(
      features { name: "f0" table: "user" }
      features { name: "f1" table: "item" }
      model { bottom_mlp: 8 top_mlp: 1 }
      training { steps: 10 eval_batches: 1 eval_interval: 5
                 dense_optimizer { kind: SGD learning_rate: 0.1 } }
      data { synthetic { num_dense: 4
        features { id_space: 1000 min_ids_per_bag: 1 max_ids_per_bag: 1 }
        features { id_space: 1000 min_ids_per_bag: 1 max_ids_per_bag: 1 } } })",
                                                              &job));
    job.mutable_training()->set_batch_size(64);
    return job;
  }

  // Every server 1 GiB (a default entry); item pinned table-wise on b:2.
  static v1::PlanSpec Spec() {
    v1::PlanSpec spec;
    spec.mutable_topology()->add_servers()->set_memory_bytes(int64_t{1} << 30);
    v1::TableHint* user = spec.add_hints();
    user->set_table("user");
    user->set_expected_distinct_ids(100000);
    v1::TableHint* item = spec.add_hints();
    item->set_table("item");
    item->set_pinned_type(v1::TABLE_WISE);
    item->add_pinned_servers("b:2");
    return spec;
  }

  // `memory`: what it reports of itself (0: nothing, an older server).
  static v1::RegisterRequest Shard(const std::string& address, int64_t memory = 0) {
    v1::RegisterRequest r;
    r.set_role(v1::SHARD_SERVER);
    r.set_address(address);
    if (memory > 0) {
      r.mutable_capacity()->set_memory_bytes(memory);
      r.mutable_capacity()->set_device(v1::CPU);
    }
    return r;
  }

  testing::TempDir dir_;
};

TEST_F(CoordinatorPlanTest, FirstMapComesFromThePlanAndThePlanIsKept) {
  {
    auto c = Open(Spec());
    ASSERT_TRUE(c->SetJob(Job()).ok());
    EXPECT_EQ(c->GetPlan().status().code(), absl::StatusCode::kUnavailable);
    ASSERT_TRUE(c->Register(Shard("b:2")).ok());
    ASSERT_TRUE(c->Register(Shard("a:1")).ok());
    absl::StatusOr<v1::ShardingPlan> plan = c->GetPlan();
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->plan_id(), 1u);
    EXPECT_THAT(plan->servers(), ::testing::ElementsAre("a:1", "b:2"));
    absl::StatusOr<v1::ShardMap> proto = c->GetShardMap();
    ASSERT_TRUE(proto.ok()) << proto.status();
    EXPECT_EQ(proto->epoch(), 1u);
    absl::StatusOr<ShardMap> map = ShardMap::FromProto(*proto);
    ASSERT_TRUE(map.ok()) << map.status();
    const TableRoute item = map->RouteOf(StableNameKey("item"));
    EXPECT_EQ(map->servers()[item.single_owner()], "b:2");
  }
  // A restarted coordinator serves the stored plan.
  auto again = Open(Spec());
  absl::StatusOr<v1::ShardingPlan> plan = again->GetPlan();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->plan_id(), 1u);
}

// The default: planned from what the servers report, no spec needed.
TEST_F(CoordinatorPlanTest, WithoutASpecTheServersReportsArePlanned) {
  auto c = Open(std::nullopt);
  ASSERT_TRUE(c->SetJob(Job()).ok());
  ASSERT_TRUE(c->Register(Shard("a:1", int64_t{1} << 30)).ok());
  ASSERT_TRUE(c->Register(Shard("b:2", int64_t{1} << 30)).ok());
  absl::StatusOr<v1::ShardingPlan> plan = c->GetPlan();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->servers(), ::testing::ElementsAre("a:1", "b:2"));
  absl::StatusOr<v1::ShardMap> map = c->GetShardMap();
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->epoch(), 1u);
}

// A cluster always starts: servers that report nothing, or too little
// memory for any plan, get the even spread, and GetPlan says why.
TEST_F(CoordinatorPlanTest, WhatNoPlanFitsGetsTheEvenSpreadSayingWhy) {
  for (const int64_t memory : {int64_t{0}, int64_t{1024}}) {
    auto c = Open(std::nullopt, Sharding::kPlanned, absl::StrCat("state", memory));
    ASSERT_TRUE(c->SetJob(Job()).ok());
    ASSERT_TRUE(c->Register(Shard("a:1", memory)).ok());
    ASSERT_TRUE(c->Register(Shard("b:2", memory)).ok());
    absl::StatusOr<v1::ShardMap> map = c->GetShardMap();
    ASSERT_TRUE(map.ok()) << map.status();
    EXPECT_EQ(map->SerializeAsString(),
              ShardMap::Uniform(1, 64, {"a:1", "b:2"}).ToProto().SerializeAsString())
        << memory;
    absl::StatusOr<v1::ShardingPlan> plan = c->GetPlan();
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kNotFound) << memory;
    EXPECT_THAT(plan.status().message(), HasSubstr("spreads slots evenly"));
    EXPECT_THAT(plan.status().message(),
                HasSubstr(memory == 0 ? "reported no memory" : "user"));
  }
}

TEST_F(CoordinatorPlanTest, EvenShardingNeverPlans) {
  auto c = Open(std::nullopt, Sharding::kEven);
  ASSERT_TRUE(c->SetJob(Job()).ok());
  ASSERT_TRUE(c->Register(Shard("a:1", int64_t{1} << 30)).ok());
  ASSERT_TRUE(c->Register(Shard("b:2", int64_t{1} << 30)).ok());
  EXPECT_TRUE(c->GetShardMap().ok());
  absl::StatusOr<v1::ShardingPlan> plan = c->GetPlan();
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(plan.status().message(), HasSubstr("--sharding=even"));
}

TEST_F(CoordinatorPlanTest, AColumnWisePinBecomesColumnGroupsInTheMap) {
  v1::PlanSpec spec = Spec();
  spec.mutable_hints(1)->clear_pinned_servers();
  spec.mutable_hints(1)->set_pinned_type(v1::COLUMN_WISE);
  auto c = Open(spec);
  ASSERT_TRUE(c->SetJob(Job()).ok());
  ASSERT_TRUE(c->Register(Shard("a:1")).ok());
  ASSERT_TRUE(c->Register(Shard("b:2")).ok());
  absl::StatusOr<v1::ShardMap> proto = c->GetShardMap();
  ASSERT_TRUE(proto.ok()) << proto.status();
  absl::StatusOr<ShardMap> map = ShardMap::FromProto(*proto);
  ASSERT_TRUE(map.ok()) << map.status();
  const absl::Span<const ColumnGroup> groups =
      map->ColumnGroupsOf(StableNameKey("item"));
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].end, 4);
  EXPECT_NE(groups[0].owner, groups[1].owner);
  EXPECT_TRUE(map->CheckWidth("item", 8).ok());
}

TEST_F(CoordinatorPlanTest, APlanThatCannotBeMadeLeavesNoMapAndSaysWhy) {
  // A hint that contradicts the table config's precision (FP32).
  v1::PlanSpec spec = Spec();
  spec.mutable_hints(1)->set_precision(v1::FP16);
  auto c = Open(spec);
  ASSERT_TRUE(c->SetJob(Job()).ok());
  ASSERT_TRUE(c->Register(Shard("a:1")).ok());
  ASSERT_TRUE(c->Register(Shard("b:2")).ok());
  EXPECT_FALSE(c->GetShardMap().ok());
  EXPECT_THAT(c->GetPlan().status().message(), HasSubstr("FP16"));
}

TEST_F(CoordinatorPlanTest, ServersMissingFromTheSpecAreNamed) {
  v1::PlanSpec spec = Spec();
  spec.mutable_topology()->mutable_servers(0)->set_address("a:1");
  auto c = Open(spec);
  ASSERT_TRUE(c->SetJob(Job()).ok());
  ASSERT_TRUE(c->Register(Shard("a:1")).ok());
  ASSERT_TRUE(c->Register(Shard("b:2")).ok());
  EXPECT_THAT(c->GetShardMap().status().message(),
              HasSubstr("no servers entry for b:2"));
}

}  // namespace
}  // namespace recps::server
