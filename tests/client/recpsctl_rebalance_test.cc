// recpsctl rebalance / drain / moves against a real recps-coordinator and
// real recps-shard processes on 127.0.0.1 (two in the map, a third that
// registered late and owns nothing): the plan from live load gives the new
// server its share, --json parses into the admin messages, bad requests are
// refused with clear errors and move nothing. Carrying plans out needs the
// shard servers' MigrateIn/HandOver: tests/e2e/rebalance_e2e_test.cc.
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/coordinator_client.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "recps/v1/admin.pb.h"
#include "recps/v1/coordinator.pb.h"
#include "tests/testing/files.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

using ::testing::HasSubstr;
using testing::LocalShard;
using testing::TempDir;

constexpr char kTables[] = R"(
tables { name: "user" dim: 8 optimizer { kind: SGD learning_rate: 0.1 } }
)";

struct Output {
  int code = -1;
  std::string out;
  std::string err;
};

Output RunCtl(const TempDir& dir, const std::vector<std::string>& args) {
  std::vector<std::string> quoted;
  for (const std::string& a : args) quoted.push_back("'" + a + "'");
  quoted.push_back("--insecure");  // the test's daemons are plaintext
  const std::string out = dir.path() + "/out", err = dir.path() + "/err";
  const std::string command = absl::StrCat(RECPSCTL_BINARY, " ", absl::StrJoin(quoted, " "),
                                           " >", out, " 2>", err);
  Output result;
  absl::StatusOr<int> code = testing::RunProcess("/bin/sh", {"-c", command}, absl::Seconds(60));
  EXPECT_TRUE(code.ok()) << code.status();
  result.code = code.ok() ? *code : -1;
  result.out = ::recps::testing::ReadAll(out);
  result.err = ::recps::testing::ReadAll(err);
  return result;
}

template <typename M>
M ParseJson(const std::string& json) {
  M message;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &message);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return message;
}

class RecpsctlRebalanceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto coordinator = LocalShard::Start(
        RECPS_COORDINATOR_BINARY, {"--state_dir=" + dir_->path() + "/state", "--num_shards=2",
                                   "--num_slots=60", "--lease=3s", "--tick=20ms"});
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = coordinator->release();
    const std::string tables = dir_->WriteFile("tables.textproto", kTables);
    shards_ = new std::vector<std::unique_ptr<LocalShard>>();
    for (int i = 0; i < 3; ++i) {
      auto shard = LocalShard::Start(
          RECPS_SHARD_BINARY, {"--tables=" + tables, "--num_slots=60", "--threads=1",
                               "--consistency=async", "--coordinator=" + coordinator_->address()});
      ASSERT_TRUE(shard.ok()) << shard.status();
      servers_.push_back((*shard)->address());
      shards_->push_back(*std::move(shard));
      if (i == 1) {
        // The map is built over the first two; the third joins late.
        client::CoordinatorClient c(coordinator_->address());
        ASSERT_TRUE(testing::Eventually([&] { return c.GetShardMap().ok(); },
                                        absl::Seconds(30)));
      }
    }
    // Wait until the third is a member.
    client::CoordinatorClient c(coordinator_->address());
    ASSERT_TRUE(testing::Eventually(
        [&] {
          absl::StatusOr<v1::ListMembersResponse> m = c.ListMembers();
          return m.ok() && m->members_size() == 3;
        },
        absl::Seconds(30)));
  }
  static void TearDownTestSuite() {
    delete shards_;
    delete coordinator_;
    delete dir_;
  }
  static std::string Coord() { return "--coordinator=" + coordinator_->address(); }

  static TempDir* dir_;
  static LocalShard* coordinator_;
  static std::vector<std::unique_ptr<LocalShard>>* shards_;
  static std::vector<std::string> servers_;
};

TempDir* RecpsctlRebalanceTest::dir_ = nullptr;
LocalShard* RecpsctlRebalanceTest::coordinator_ = nullptr;
std::vector<std::unique_ptr<LocalShard>>* RecpsctlRebalanceTest::shards_ = nullptr;
std::vector<std::string> RecpsctlRebalanceTest::servers_;

TEST_F(RecpsctlRebalanceTest, PlanGivesTheLateServerItsShare) {
  const Output json = RunCtl(*dir_, {"rebalance", Coord(), "--json"});
  ASSERT_EQ(json.code, 0) << json.err;
  const v1::RebalancePlan plan = ParseJson<v1::RebalancePlan>(json.out);
  EXPECT_EQ(plan.base_epoch(), 1u);
  EXPECT_EQ(plan.slots_to_move(), 20);
  ASSERT_EQ(plan.servers_after_size(), 3);
  EXPECT_EQ(plan.servers_after(2).address(), servers_[2]);
  EXPECT_TRUE(plan.servers_after(2).new_server());
  EXPECT_EQ(plan.servers_after(2).slots(), 20);
  for (const v1::SlotMove& m : plan.moves()) EXPECT_EQ(m.target(), servers_[2]);

  const Output text = RunCtl(*dir_, {"rebalance", Coord()});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("imbalance (max/mean)"));
  EXPECT_THAT(text.out, HasSubstr(servers_[2] + " (new)"));
  EXPECT_THAT(text.out, HasSubstr("add --apply"));
}

TEST_F(RecpsctlRebalanceTest, DrainPlansEverySlotOff) {
  const Output r = RunCtl(*dir_, {"drain", servers_[0], Coord(), "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const v1::RebalancePlan plan = ParseJson<v1::RebalancePlan>(r.out);
  int drained = 0;
  for (const v1::ServerLoad& s : plan.servers_after()) {
    if (s.address() != servers_[0]) continue;
    ++drained;
    EXPECT_EQ(s.slots(), 0);
    EXPECT_TRUE(s.draining());
  }
  EXPECT_EQ(drained, 1);
  EXPECT_EQ(plan.slots_to_move(), 30);
  for (const v1::SlotMove& m : plan.moves()) EXPECT_EQ(m.source(), servers_[0]);
}

TEST_F(RecpsctlRebalanceTest, BadRequestsAreRefusedAndMoveNothing) {
  Output r = RunCtl(*dir_, {"drain", "127.0.0.1:1", Coord(), "--apply"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("'127.0.0.1:1' is not a server of shard map epoch 1"));
  r = RunCtl(*dir_, {"rebalance", Coord(), "--max_moves=-3"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--max_moves=-3"));
  r = RunCtl(*dir_, {"rebalance", Coord(), "--max_bytes=lots"});
  EXPECT_EQ(r.code, 2);
  r = RunCtl(*dir_, {"drain", Coord()});
  EXPECT_EQ(r.code, 2);
  r = RunCtl(*dir_, {"moves", "--server=" + servers_[0]});
  EXPECT_EQ(r.code, 2);
  // Through the API: a move to itself, a slot out of range, an unknown
  // target, a stale plan.
  client::CoordinatorClient c(coordinator_->address());
  v1::ApplyRebalanceRequest bad;
  bad.mutable_plan()->set_base_epoch(1);
  v1::SlotMove* m = bad.mutable_plan()->add_moves();
  m->set_source(servers_[0]);
  m->set_target(servers_[0]);
  m->add_slots(0);
  EXPECT_THAT(c.ApplyRebalance(bad).status().message(), HasSubstr("both"));
  m->set_target(servers_[1]);
  m->set_slots(0, 60);
  EXPECT_THAT(c.ApplyRebalance(bad).status().message(), HasSubstr("out of range"));
  m->set_slots(0, 0);
  m->set_target("127.0.0.1:1");
  EXPECT_THAT(c.ApplyRebalance(bad).status().message(), HasSubstr("127.0.0.1:1"));
  m->set_target(servers_[1]);
  bad.mutable_plan()->set_base_epoch(7);
  EXPECT_THAT(c.ApplyRebalance(bad).status().message(), HasSubstr("plan again"));
  // Nothing moved.
  absl::StatusOr<v1::ShardMap> map = c.GetShardMap();
  ASSERT_TRUE(map.ok());
  EXPECT_EQ(map->epoch(), 1u);
  const Output moves = RunCtl(*dir_, {"moves", Coord(), "--json"});
  ASSERT_EQ(moves.code, 0) << moves.err;
  EXPECT_TRUE(ParseJson<v1::ListRebalanceMovesResponse>(moves.out).moves().empty());
  const Output text = RunCtl(*dir_, {"moves", Coord()});
  EXPECT_THAT(text.out, HasSubstr("no moves yet"));
  const Output status = RunCtl(*dir_, {"status", Coord(), "--interval=0", "--json"});
  EXPECT_TRUE(ParseJson<v1::ClusterStatus>(status.out).moves_in_flight().empty());
}

}  // namespace
}  // namespace recps
