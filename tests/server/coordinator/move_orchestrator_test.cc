// Rebalance plans (pure) and the coordinator's slot-move orchestration with
// fake shard servers (a ShardMoveRpc that keeps each server's map epoch and
// the moves it saw): hand-overs one epoch at a time, roll-backs, refusals,
// and the resolution of moves a restarted coordinator finds in flight.
#include "server/coordinator/move_orchestrator.h"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/wire/replica_placement.h"
#include "common/wire/shard_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_store.h"
#include "server/coordinator/rebalance_plan.h"
#include "tests/server/coordinator/fake_move_shards.h"
#include "tests/testing/local_shard.h"

namespace recps::server {
namespace {

using ::testing::HasSubstr;

constexpr char kA[] = "10.0.0.1:1";
constexpr char kB[] = "10.0.0.2:1";
constexpr char kC[] = "10.0.0.3:1";

// ---- Planner -----------------------------------------------------------

// Stats for `map`'s servers: every slot holds `rows_per_slot` rows of 100
// bytes, and slot s gets `hot_load` ids/s when s < hot_slots.
RebalanceInput Input(const v1::ShardMap& map, int64_t rows_per_slot = 10,
                     int hot_slots = 0, double hot_load = 0) {
  RebalanceInput in;
  in.map = map;
  const ShardMap parsed = *ShardMap::FromProto(map);
  for (int s = 0; s < parsed.num_servers(); ++s) {
    v1::StatsResponse st;
    for (uint32_t slot : parsed.SlotsOf(s)) {
      v1::SlotStats* ss = st.add_slots();
      ss->set_slot(slot);
      ss->set_rows(rows_per_slot);
      ss->set_bytes(rows_per_slot * 100);
      ss->set_lookup_ids_per_second(static_cast<int>(slot) < hot_slots ? hot_load : 0);
      st.set_total_rows(st.total_rows() + rows_per_slot);
      st.set_row_bytes(st.row_bytes() + rows_per_slot * 100);
    }
    st.set_uptime_seconds(10);
    in.stats.push_back(std::move(st));
  }
  return in;
}

TEST(RebalancePlanTest, BalancedClusterMovesNothing) {
  const v1::ShardMap map = ShardMap::Uniform(3, 60, {kA, kB}).ToProto();
  absl::StatusOr<v1::RebalancePlan> plan = PlanRebalance(Input(map));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->moves_size(), 0);
  EXPECT_EQ(plan->base_epoch(), 3u);
  EXPECT_DOUBLE_EQ(plan->before().rows(), 1.0);
  EXPECT_THAT(plan->notes(), ::testing::Contains(HasSubstr("nothing to move")));
}

TEST(RebalancePlanTest, NewServerGetsAThirdAndThePlanIsDeterministic) {
  const v1::ShardMap map = ShardMap::Uniform(1, 60, {kA, kB}).ToProto();
  RebalanceInput in = Input(map);
  in.new_servers = {kC};
  in.move_bytes_per_second = 1000;
  absl::StatusOr<v1::RebalancePlan> plan = PlanRebalance(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->slots_to_move(), 20);
  EXPECT_EQ(plan->bytes_to_move(), 20 * 10 * 100);
  EXPECT_DOUBLE_EQ(plan->estimated_seconds(), 20.0 * 10 * 100 / 1000);
  ASSERT_EQ(plan->moves_size(), 2);
  for (const v1::SlotMove& m : plan->moves()) EXPECT_EQ(m.target(), kC);
  EXPECT_DOUBLE_EQ(plan->before().rows(), 1.5);  // 30,30,0 over 3
  EXPECT_DOUBLE_EQ(plan->after().rows(), 1.0);
  ASSERT_EQ(plan->servers_after_size(), 3);
  EXPECT_TRUE(plan->servers_after(2).new_server());
  EXPECT_EQ(plan->servers_after(2).slots(), 20);
  absl::StatusOr<v1::RebalancePlan> again = PlanRebalance(in);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->SerializeAsString(), plan->SerializeAsString());
}

TEST(RebalancePlanTest, AReplicatedMapIsNotRebalancedYet) {
  ShardMap replicated = ShardMap::Uniform(1, 60, {kA, kB, kC});
  ASSERT_TRUE(AddBackups(2, {}, &replicated).ok());
  RebalanceInput in = Input(replicated.ToProto());
  in.drain = {kB};
  absl::StatusOr<v1::RebalancePlan> plan = PlanRebalance(in);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(plan.status().message(), HasSubstr("slot moves of a replicated map"));
}

TEST(RebalancePlanTest, DrainMovesEverySlotOffAndRefusesTheLastServer) {
  const v1::ShardMap map = ShardMap::Uniform(1, 60, {kA, kB, kC}).ToProto();
  RebalanceInput in = Input(map);
  in.drain = {kB};
  absl::StatusOr<v1::RebalancePlan> plan = PlanRebalance(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->servers_after(1).slots(), 0);
  EXPECT_EQ(plan->servers_after(0).slots(), 30);
  EXPECT_EQ(plan->servers_after(2).slots(), 30);
  for (const v1::SlotMove& m : plan->moves()) EXPECT_EQ(m.source(), kB);
  EXPECT_DOUBLE_EQ(plan->after().rows(), 1.0);

  in.drain = {kA, kB, kC};
  EXPECT_EQ(PlanRebalance(in).status().code(), absl::StatusCode::kFailedPrecondition);
  in.drain = {"10.9.9.9:1"};
  absl::Status unknown = PlanRebalance(in).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.message(), HasSubstr("10.9.9.9:1"));
}

TEST(RebalancePlanTest, HotSlotsSpreadByLoadWithinMaxMoves) {
  // A owns slots 0..29, all hot; B owns 30..59, cold.
  const v1::ShardMap map = ShardMap::Uniform(1, 60, {kA, kB}).ToProto();
  RebalanceInput in = Input(map, 10, 30, 100);
  absl::StatusOr<v1::RebalancePlan> plan = PlanRebalance(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GT(plan->before().load(), 1.9);
  EXPECT_LT(plan->after().load(), plan->before().load());
  EXPECT_GT(plan->slots_to_move(), 0);
  in.max_moves = 3;
  plan = PlanRebalance(in);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->slots_to_move(), 3);
  EXPECT_THAT(plan->notes(), ::testing::Contains(HasSubstr("--max_moves=3")));
  in.max_moves = 0;
  in.max_bytes = 2500;  // two slots of 1000 bytes
  plan = PlanRebalance(in);
  ASSERT_TRUE(plan.ok());
  EXPECT_LE(plan->bytes_to_move(), 2500);
}

// A table-wise table moves whole. Column groups never move: the shard
// servers refuse to (MigrateIn: UNIMPLEMENTED), so a plan that moved one
// failed halfway; a drain that would have to move one is refused up front,
// naming it.
TEST(RebalancePlanTest, TableWiseTablesMoveWholeAndColumnGroupsNever) {
  v1::ShardMap map = ShardMap::Uniform(1, 8, {kA, kB}).ToProto();
  v1::TableRouting* tw = map.add_tables();
  tw->set_table("big");
  tw->set_owner(0);
  v1::TableRouting* cw = map.add_tables();
  cw->set_table("wide");
  for (int g = 0; g < 2; ++g) {
    v1::ColumnGroupRouting* group = cw->add_column_groups();
    group->set_column_begin(g * 4);
    group->set_column_end(g * 4 + 4);
    group->set_owner(0);
  }
  RebalanceInput in = Input(map, 0);
  for (const char* name : {"big", "wide.cols0-4", "wide.cols4-8"}) {
    v1::TableStats* t = in.stats[0].add_tables();
    t->set_name(name);
    t->set_rows(1000);
    t->set_bytes(100000);
  }
  in.new_servers = {kC};
  absl::StatusOr<v1::RebalancePlan> plan = PlanRebalance(in);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const v1::SlotMove& m : plan->moves()) {
    for (const std::string& t : m.tables()) {
      EXPECT_EQ(t.find("wide"), std::string::npos) << "planned a column-group move: " << t;
    }
  }
  EXPECT_GE(plan->tables_to_move(), 1);  // "big" evens the load out
  bool noted = false;
  for (const std::string& note : plan->notes()) {
    noted |= note.find("column groups are not moved") != std::string::npos;
  }
  EXPECT_TRUE(noted);
  absl::StatusOr<v1::ShardMap> after =
      ApplyMovesToMap(map, {plan->moves().begin(), plan->moves().end()}, 2);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->tables(1).column_groups(0).owner(), 0u);
  EXPECT_EQ(after->tables(1).column_groups(1).owner(), 0u);

  in.drain = {kA};
  const absl::Status drain = PlanRebalance(in).status();
  EXPECT_EQ(drain.code(), absl::StatusCode::kFailedPrecondition) << drain;
  EXPECT_THAT(std::string(drain.message()), HasSubstr("wide.cols0-4"));
}

TEST(RebalancePlanTest, CheckPlanRefusesBadPlans) {
  const v1::ShardMap map = ShardMap::Uniform(4, 8, {kA, kB}).ToProto();
  auto plan_with = [&](const std::string& source, const std::string& target,
                       std::vector<uint32_t> slots) {
    v1::RebalancePlan p;
    p.set_base_epoch(4);
    v1::SlotMove* m = p.add_moves();
    m->set_source(source);
    m->set_target(target);
    for (uint32_t s : slots) m->add_slots(s);
    return p;
  };
  EXPECT_TRUE(CheckPlan(plan_with(kA, kB, {0, 1}), map, {}).ok());
  EXPECT_TRUE(CheckPlan(plan_with(kA, kC, {0}), map, {kC}).ok());
  struct Case {
    v1::RebalancePlan plan;
    absl::StatusCode code;
    std::string says;
  };
  v1::RebalancePlan stale = plan_with(kA, kB, {0});
  stale.set_base_epoch(3);
  v1::RebalancePlan twice = plan_with(kA, kB, {0});
  *twice.add_moves() = twice.moves(0);
  for (const Case& c : std::vector<Case>{
           {plan_with(kA, kC, {0}), absl::StatusCode::kInvalidArgument, "10.0.0.3:1"},
           {plan_with("x:1", kB, {0}), absl::StatusCode::kInvalidArgument, "x:1"},
           {plan_with(kA, kB, {8}), absl::StatusCode::kInvalidArgument, "out of range"},
           {plan_with(kA, kA, {0}), absl::StatusCode::kInvalidArgument, "both"},
           {plan_with(kA, kB, {7}), absl::StatusCode::kInvalidArgument, "belongs to"},
           {stale, absl::StatusCode::kFailedPrecondition, "plan again"},
           {twice, absl::StatusCode::kInvalidArgument, "twice"},
           {v1::RebalancePlan(), absl::StatusCode::kFailedPrecondition, "epoch"},
       }) {
    absl::Status s = CheckPlan(c.plan, map, {});
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.says));
  }
}

// ---- Orchestration with fake servers ------------------------------------

class MoveOrchestratorTest : public ::testing::Test {
 protected:
  std::unique_ptr<Coordinator> Open(std::vector<std::string> servers = {kA, kB},
                                    bool auto_rebalance = false) {
    auto store = CoordinatorStore::Open(dir_.path() + "/state");
    EXPECT_TRUE(store.ok()) << store.status();
    CoordinatorOptions options;
    options.num_shards = 2;
    options.num_slots = 12;
    options.moves.rpc = shards_;
    options.moves.retry_interval = absl::Milliseconds(5);
    options.moves.max_parallel_copies = 2;
    options.moves.auto_rebalance_new_servers = auto_rebalance;
    auto c = Coordinator::Create(*std::move(store), options, nullptr);
    EXPECT_TRUE(c.ok()) << c.status();
    // The fake servers learn every map the coordinator pushes.
    (*c)->SetMapPusher([this](const std::string& address, const v1::ShardMap& map) {
      absl::MutexLock lock(&shards_->mu);
      if (shards_->maps[address].epoch() < map.epoch()) shards_->maps[address] = map;
    });
    for (const std::string& address : servers) {
      v1::RegisterRequest r;
      r.set_role(v1::SHARD_SERVER);
      r.set_address(address);
      EXPECT_TRUE((*c)->Register(r).ok());
    }
    EXPECT_TRUE((*c)->moves().Start().ok());
    return *std::move(c);
  }

  static v1::RebalancePlan Plan(Coordinator& c, std::vector<std::string> drain = {}) {
    v1::PlanRebalanceRequest request;
    for (const std::string& d : drain) request.add_drain(d);
    absl::StatusOr<v1::PlanRebalanceResponse> r = c.moves().Plan(request);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->plan() : v1::RebalancePlan();
  }

  static absl::StatusOr<v1::ApplyRebalanceResponse> Apply(Coordinator& c,
                                                          const v1::RebalancePlan& plan) {
    v1::ApplyRebalanceRequest request;
    *request.mutable_plan() = plan;
    return c.moves().Apply(request);
  }

  testing::TempDir dir_;
  std::shared_ptr<FakeMoveShards> shards_ = std::make_shared<FakeMoveShards>();
};

TEST_F(MoveOrchestratorTest, NewServerTakesAThirdOneEpochPerMove) {
  auto c = Open({kA, kB, kC});  // kC registers after the map is built
  ASSERT_EQ(c->shard_map_epoch(), 1u);
  const v1::RebalancePlan plan = Plan(*c);
  ASSERT_EQ(plan.moves_size(), 2);
  EXPECT_EQ(plan.slots_to_move(), 4);
  ASSERT_TRUE(Apply(*c, plan).ok());
  ASSERT_TRUE(c->moves().WaitIdle(absl::Seconds(10)));
  // A map that lists the new server (owning nothing), then one map per
  // move, each one epoch newer.
  EXPECT_EQ(c->shard_map_epoch(), 4u);
  const ShardMap map = *ShardMap::FromProto(*c->GetShardMap());
  ASSERT_EQ(map.num_servers(), 3);
  EXPECT_EQ(map.SlotsOf(2).size(), 4u);
  EXPECT_EQ(map.SlotsOf(0).size(), 4u);
  EXPECT_EQ(map.SlotsOf(1).size(), 4u);
  absl::MutexLock lock(&shards_->mu);
  ASSERT_EQ(shards_->handovers.size(), 2u);
  EXPECT_EQ(shards_->handovers[0].second.new_map().epoch(), 3u);
  EXPECT_EQ(shards_->handovers[1].second.new_map().epoch(), 4u);
  for (const auto& [address, h] : shards_->handovers) {
    EXPECT_EQ(h.self(), address);
    EXPECT_EQ(h.target(), kC);
  }
  for (const auto& [address, m] : shards_->migrate_ins) EXPECT_EQ(address, kC);
  EXPECT_EQ(shards_->maps[kA].epoch(), 4u);  // pushed to the others
  const v1::ListRebalanceMovesResponse list = c->moves().List();
  ASSERT_EQ(list.moves_size(), 2);
  for (const v1::MoveRecord& r : list.moves()) {
    EXPECT_EQ(r.state(), v1::MoveRecord::DONE);
    EXPECT_EQ(r.delta_rows(), 3);
    EXPECT_FALSE(r.has_new_map());
  }
  EXPECT_THAT(list.last_outcome(), HasSubstr("2 of 2 move(s) done"));
  EXPECT_GT(list.move_bytes_per_second(), 0);
}

TEST_F(MoveOrchestratorTest, DrainEmptiesAServerAndRefusesTheLast) {
  auto c = Open({kA, kB});
  const v1::RebalancePlan plan = Plan(*c, {kB});
  ASSERT_EQ(plan.moves_size(), 1);
  ASSERT_TRUE(Apply(*c, plan).ok());
  ASSERT_TRUE(c->moves().WaitIdle(absl::Seconds(10)));
  const ShardMap map = *ShardMap::FromProto(*c->GetShardMap());
  EXPECT_TRUE(map.SlotsOf(map.IndexOf(kB)).empty());
  v1::PlanRebalanceRequest all;
  all.add_drain(kA);
  all.add_drain(kB);
  EXPECT_EQ(c->moves().Plan(all).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(MoveOrchestratorTest, SecondPlanWhileOneRunsIsRefusedAndNothingMoves) {
  auto c = Open({kA, kB, kC});
  {
    absl::MutexLock lock(&shards_->mu);
    shards_->block_handover = true;
  }
  const v1::RebalancePlan plan = Plan(*c);
  ASSERT_TRUE(Apply(*c, plan).ok());
  absl::Status second = Apply(*c, plan).status();
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.message(), HasSubstr("is running"));
  {
    absl::MutexLock lock(&shards_->mu);
    shards_->block_handover = false;
  }
  ASSERT_TRUE(c->moves().WaitIdle(absl::Seconds(10)));
  // The old plan is stale now.
  EXPECT_EQ(Apply(*c, plan).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(MoveOrchestratorTest, FailedCopyRollsBackOnTheTarget) {
  auto c = Open({kA, kB, kC});
  {
    absl::MutexLock lock(&shards_->mu);
    shards_->fail_copy.insert(kC);
  }
  ASSERT_TRUE(Apply(*c, Plan(*c)).ok());
  ASSERT_TRUE(c->moves().WaitIdle(absl::Seconds(10)));
  // Only the map that lists the new server: nothing changed owner.
  EXPECT_EQ(c->shard_map_epoch(), 2u);
  const ShardMap map = *ShardMap::FromProto(*c->GetShardMap());
  EXPECT_TRUE(map.SlotsOf(map.IndexOf(kC)).empty());
  const v1::ListRebalanceMovesResponse list = c->moves().List();
  for (const v1::MoveRecord& r : list.moves()) {
    EXPECT_EQ(r.state(), v1::MoveRecord::FAILED);
    EXPECT_THAT(r.error(), HasSubstr("disk full"));
  }
  absl::MutexLock lock(&shards_->mu);
  EXPECT_EQ(shards_->aborts.size(), 2u);
  EXPECT_TRUE(shards_->handovers.empty());
}

TEST_F(MoveOrchestratorTest, FailedHandOverIsAbortedOrCompletedByTheTargetsEpoch) {
  auto c = Open({kA, kB});
  {
    absl::MutexLock lock(&shards_->mu);
    shards_->handover_error = absl::UnavailableError("source gone");
  }
  v1::RebalancePlan plan = Plan(*c, {kB});
  ASSERT_TRUE(Apply(*c, plan).ok());
  ASSERT_TRUE(c->moves().WaitIdle(absl::Seconds(10)));
  EXPECT_EQ(c->shard_map_epoch(), 1u);  // the target never took them
  EXPECT_EQ(c->moves().List().moves(0).state(), v1::MoveRecord::ABORTED);
  // Now the target installs the map although the source's answer is lost.
  {
    absl::MutexLock lock(&shards_->mu);
    shards_->target_installs_anyway = true;
    shards_->aborts.clear();
  }
  plan = Plan(*c, {kB});
  ASSERT_TRUE(Apply(*c, plan).ok());
  ASSERT_TRUE(c->moves().WaitIdle(absl::Seconds(10)));
  EXPECT_EQ(c->shard_map_epoch(), 2u);
  const v1::MoveRecord last = c->moves().List().moves(1);
  EXPECT_EQ(last.state(), v1::MoveRecord::DONE);
  EXPECT_THAT(last.resolved(), HasSubstr("the target holds the new map"));
  absl::MutexLock lock(&shards_->mu);
  EXPECT_TRUE(shards_->aborts.empty());
}

TEST_F(MoveOrchestratorTest, RestartedCoordinatorResolvesMovesLeftInFlight) {
  v1::ShardMap new_map;
  {
    auto c = Open({kA, kB});
    new_map = *c->GetShardMap();
  }
  // What a coordinator killed mid-move leaves: a copy and a hand-over.
  {
    auto store = CoordinatorStore::Open(dir_.path() + "/state");
    ASSERT_TRUE(store.ok());
    v1::MoveRecord copying;
    copying.set_move_id("r000001-1-m000");
    copying.set_source(kA);
    copying.set_target(kB);
    copying.add_slots(0);
    copying.set_state(v1::MoveRecord::COPYING);
    v1::MoveRecord handing = copying;
    handing.set_move_id("r000001-1-m001");
    handing.clear_slots();
    handing.add_slots(1);
    handing.set_state(v1::MoveRecord::HANDING_OVER);
    new_map.set_epoch(2);
    new_map.set_slot_owner(1, 1);
    *handing.mutable_new_map() = new_map;
    handing.set_epoch(2);
    ASSERT_TRUE((*store)->Put("move/r000001-1-m000", copying.SerializeAsString()).ok());
    ASSERT_TRUE((*store)->Put("move/r000001-1-m001", handing.SerializeAsString()).ok());
  }
  // The target shows the new map, but is down at first: unresolved.
  {
    absl::MutexLock lock(&shards_->mu);
    shards_->maps[kB] = new_map;
    shards_->down.insert(kB);
  }
  auto c = Open({kA, kB});
  EXPECT_FALSE(c->moves().WaitIdle(absl::Milliseconds(100)));
  v1::RebalancePlan plan;
  plan.set_base_epoch(1);
  EXPECT_THAT(Apply(*c, plan).status().message(), HasSubstr("not resolved"));
  {
    absl::MutexLock lock(&shards_->mu);
    shards_->down.clear();
  }
  ASSERT_TRUE(c->moves().WaitIdle(absl::Seconds(10)));
  EXPECT_EQ(c->shard_map_epoch(), 2u);
  const v1::ListRebalanceMovesResponse list = c->moves().List();
  ASSERT_EQ(list.moves_size(), 2);
  EXPECT_EQ(list.moves(0).state(), v1::MoveRecord::ABORTED);
  EXPECT_EQ(list.moves(1).state(), v1::MoveRecord::DONE);
  EXPECT_THAT(list.moves(1).resolved(), HasSubstr("restarted"));
}

TEST_F(MoveOrchestratorTest, AutoRebalanceBringsALateServerIntoUse) {
  auto c = Open({kA, kB, kC}, /*auto_rebalance=*/true);
  ASSERT_TRUE(testing::Eventually(
      [&] {
        const ShardMap map = *ShardMap::FromProto(*c->GetShardMap());
        return map.IndexOf(kC) >= 0 && map.SlotsOf(map.IndexOf(kC)).size() == 4;
      },
      absl::Seconds(10)));
  ASSERT_TRUE(c->moves().WaitIdle(absl::Seconds(10)));
  EXPECT_EQ(c->moves().List().moves_size(), 2);
}

TEST_F(MoveOrchestratorTest, UnreachableServerFailsThePlanNamingIt) {
  auto c = Open({kA, kB});
  {
    absl::MutexLock lock(&shards_->mu);
    shards_->down.insert(kB);
  }
  absl::Status s = c->moves().Plan(v1::PlanRebalanceRequest()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr(kB));
}

}  // namespace
}  // namespace recps::server
