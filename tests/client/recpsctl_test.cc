// recpsctl against a real cluster: a recps-coordinator and two recps-shard
// processes on 127.0.0.1 that registered with it, with rows created through
// the embedding client. Checks that status, tables and shards show what the
// servers report, that --json parses into the admin messages, and the exit
// codes.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/channels.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/embedding_client.h"
#include "client/launcher/process.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "recps/v1/admin.pb.h"
#include "recps/v1/coordinator.grpc.pb.h"
#include "recps/v1/plan.pb.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "tests/testing/files.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

using ::testing::HasSubstr;
using testing::LocalShard;
using testing::TempDir;

constexpr char kTables[] = R"(
tables { name: "user" dim: 8 optimizer { kind: SGD learning_rate: 0.1 } }
tables { name: "item" dim: 4 num_rows: 1000 optimizer { kind: ADAGRAD learning_rate: 0.1 } }
)";

struct Output {
  int code = -1;
  std::string out;
  std::string err;
};

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// Runs recpsctl with `args` (through sh, to capture its output).
Output RunCtl(const TempDir& dir, const std::vector<std::string>& args,
              const std::string& env = "") {
  std::vector<std::string> quoted;
  for (const std::string& a : args) quoted.push_back(Quote(a));
  // The test cluster is plaintext; commands that reach a cluster need to
  // be told (offline ones take no security flags).
  const bool offline = !args.empty() && (args[0] == "plan" || args[0] == "certs" ||
                                         args[0] == "help" || args[0] == "--help");
  const bool has_security = std::any_of(args.begin(), args.end(), [](const std::string& a) {
    return a.rfind("--tls_", 0) == 0 || a == "--insecure";
  });
  if (!offline && !has_security && env.find("RECPS_TLS_") == std::string::npos) {
    quoted.push_back("--insecure");
  }
  const std::string out = dir.path() + "/out", err = dir.path() + "/err";
  const std::string command =
      absl::StrCat(env, " ", RECPSCTL_BINARY, " ", absl::StrJoin(quoted, " "),
                   " >", out, " 2>", err);
  Output result;
  absl::StatusOr<int> code =
      testing::RunProcess("/bin/sh", {"-c", command}, absl::Seconds(60));
  EXPECT_TRUE(code.ok()) << code.status();
  result.code = code.ok() ? *code : -1;
  result.out = ::recps::testing::ReadAll(out);
  result.err = ::recps::testing::ReadAll(err);
  return result;
}

template <typename M>
M ParseJson(const std::string& json) {
  M message;
  const auto status =
      google::protobuf::util::JsonStringToMessage(json, &message);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return message;
}

v1::StatsResponse ServerStats(const std::string& address) {
  auto stub = v1::ShardAdmin::NewStub(
      rpc::MakeChannel(address, rpc::ChannelKind::kControl));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::StatsResponse stats;
  grpc::Status s = stub->Stats(&ctx, v1::StatsRequest(), &stats);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return stats;
}

class RecpsctlTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto coordinator = LocalShard::Start(
        RECPS_COORDINATOR_BINARY,
        {"--state_dir=" + dir_->path() + "/state", "--num_shards=2",
         "--num_slots=256", "--lease=3s", "--tick=20ms"});
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = coordinator->release();
    const std::string tables = dir_->WriteFile("tables.textproto", kTables);
    shards_ = new std::vector<std::unique_ptr<LocalShard>>();
    for (int i = 0; i < 2; ++i) {
      auto shard = LocalShard::Start(
          RECPS_SHARD_BINARY,
          {"--tables=" + tables, "--num_slots=256", "--threads=1",
           "--consistency=async", "--coordinator=" + coordinator_->address()});
      ASSERT_TRUE(shard.ok()) << shard.status();
      servers_.push_back((*shard)->address());
      shards_->push_back(*std::move(shard));
    }
    // Wait until both servers route by the coordinator's map.
    for (const std::string& address : servers_) {
      ASSERT_TRUE(testing::Eventually(
          [&] { return ServerStats(address).shard_map_epoch() == 1; }))
          << address << " got no shard map";
    }
    // Rows: 300 "user" ids and 100 "item" ids, looked up twice.
    auto client = client::EmbeddingClient::Create(
        {{"user", 8}, {"item", 4}}, client::MakeServerShardMapSource(servers_),
        {});
    ASSERT_TRUE(client.ok()) << client.status();
    std::vector<int64_t> users, items;
    for (int64_t i = 0; i < 300; ++i) users.push_back(i * 7919);
    for (int64_t i = 0; i < 100; ++i) items.push_back(i);
    std::vector<float> user_rows(users.size() * 8), item_rows(items.size() * 4);
    for (int step = 0; step < 2; ++step) {
      absl::Status s = (*client)->Lookup(
          step, {{{0, users, user_rows.data()}, {1, items, item_rows.data()}}});
      ASSERT_TRUE(s.ok()) << s;
    }
  }

  static void TearDownTestSuite() {
    delete shards_;
    delete coordinator_;
    delete dir_;
    servers_.clear();  // --gtest_repeat sets the suite up again
  }

  static TempDir* dir_;
  static LocalShard* coordinator_;
  static std::vector<std::unique_ptr<LocalShard>>* shards_;
  static std::vector<std::string> servers_;
};

TempDir* RecpsctlTest::dir_ = nullptr;
LocalShard* RecpsctlTest::coordinator_ = nullptr;
std::vector<std::unique_ptr<LocalShard>>* RecpsctlTest::shards_ = nullptr;
std::vector<std::string> RecpsctlTest::servers_;

TEST_F(RecpsctlTest, StatusJsonShowsWhatTheServersReport) {
  ASSERT_EQ(servers_.size(), 2u);
  const Output r = RunCtl(*dir_, {"status", "--json", "--interval=200ms",
                                  "--coordinator=" + coordinator_->address()});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto status = ParseJson<v1::ClusterStatus>(r.out);
  EXPECT_TRUE(status.healthy());
  EXPECT_EQ(status.coordinator(), coordinator_->address());
  EXPECT_EQ(status.shard_map_epoch(), 1u);
  EXPECT_EQ(status.num_slots(), 256u);
  EXPECT_EQ(status.members_size(), 2);
  EXPECT_GT(status.sample_seconds(), 0.15);
  ASSERT_EQ(status.servers_size(), 2);
  int64_t total = 0;
  std::vector<double> rows;
  for (const v1::ServerStatus& s : status.servers()) {
    const v1::StatsResponse stats = ServerStats(s.address());
    EXPECT_TRUE(s.reachable());
    EXPECT_EQ(s.member_state(), v1::ALIVE);
    EXPECT_THAT(s.member_id(), HasSubstr("shard-"));
    EXPECT_EQ(s.shard_map_epoch(), 1u);
    EXPECT_EQ(s.slots(), 128);
    EXPECT_EQ(s.rows(), stats.total_rows());
    EXPECT_EQ(s.row_bytes(), stats.row_bytes());
    EXPECT_GT(s.resident_bytes(), 0);
    EXPECT_GT(s.rows(), 0);
    EXPECT_TRUE(s.problems().empty());
    total += s.rows();
    rows.push_back(static_cast<double>(s.rows()));
  }
  EXPECT_EQ(total, 400);
  EXPECT_EQ(status.total_rows(), 400);
  const double mean = (rows[0] + rows[1]) / 2;
  EXPECT_DOUBLE_EQ(status.rows_imbalance(), std::max(rows[0], rows[1]) / mean);
}

TEST_F(RecpsctlTest, StatusWithOneSampleReportsLookupsSinceStart) {
  const Output r = RunCtl(*dir_, {"status", "--json", "--interval=0"},
                          "RECPS_COORDINATOR=" + coordinator_->address());
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto status = ParseJson<v1::ClusterStatus>(r.out);
  EXPECT_EQ(status.sample_seconds(), 0);
  int64_t lookups = 0;
  for (const v1::ServerStatus& s : status.servers()) {
    lookups += s.lookup().count();
    EXPECT_GT(s.lookup_ids_per_second(), 0);
    EXPECT_GT(s.lookup().p99_ms(), 0);
    EXPECT_GE(s.lookup().p99_ms(), s.lookup().p50_ms());
  }
  // Two lookups, each sent to both servers (one request per server).
  EXPECT_EQ(lookups, 4);
}

TEST_F(RecpsctlTest, StatusTextNamesEveryServer) {
  const Output r = RunCtl(*dir_, {"--coordinator", coordinator_->address(),
                                  "status", "--interval", "100ms"});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("healthy"));
  EXPECT_THAT(r.out, HasSubstr("epoch 1, 256 slots"));
  for (const std::string& address : servers_) {
    EXPECT_THAT(r.out, HasSubstr(address));
  }
  EXPECT_THAT(r.out, HasSubstr("400 ("));  // total rows
}

TEST_F(RecpsctlTest, TablesShowRowsPerTableAndServer) {
  const Output r = RunCtl(
      *dir_, {"tables", "--json", "--coordinator=" + coordinator_->address()});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto report = ParseJson<v1::TablesReport>(r.out);
  ASSERT_EQ(report.tables_size(), 2);
  EXPECT_EQ(report.tables(0).name(), "user");
  EXPECT_EQ(report.tables(0).dim(), 8);
  EXPECT_EQ(report.tables(0).rows(), 300);
  EXPECT_EQ(report.tables(0).lookup_ids(), 600);
  EXPECT_EQ(report.tables(1).name(), "item");
  EXPECT_EQ(report.tables(1).rows(), 100);
  for (const v1::TableReport& t : report.tables()) {
    ASSERT_EQ(t.servers_size(), 2);
    for (const v1::TablePlacement& p : t.servers()) {
      const v1::StatsResponse stats = ServerStats(p.server());
      for (const v1::TableStats& ts : stats.tables()) {
        if (ts.name() == t.name()) {
          EXPECT_EQ(p.rows(), ts.rows()) << t.name() << " on " << p.server();
          EXPECT_EQ(p.bytes(), ts.bytes());
        }
      }
    }
  }

  const Output text =
      RunCtl(*dir_, {"tables", "--coordinator=" + coordinator_->address()});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("user"));
  EXPECT_THAT(text.out, HasSubstr("300"));
  EXPECT_THAT(text.out, HasSubstr(servers_[0]));
}

TEST_F(RecpsctlTest, ShardsShowSlotOwners) {
  const Output r = RunCtl(*dir_, {"shards", "--slots", "--json",
                                  "--coordinator=" + coordinator_->address()});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto report = ParseJson<v1::ShardsReport>(r.out);
  EXPECT_EQ(report.shard_map_epoch(), 1u);
  ASSERT_EQ(report.servers_size(), 2);
  int64_t rows = 0;
  for (const v1::ServerShards& s : report.servers()) {
    EXPECT_EQ(s.slot_count(), 128);
    EXPECT_EQ(s.slots_size(), 128);
    int64_t slot_rows = 0;
    for (const v1::SlotStats& slot : s.slots()) slot_rows += slot.rows();
    EXPECT_EQ(slot_rows, s.rows());
    rows += s.rows();
  }
  EXPECT_EQ(rows, 400);
  EXPECT_EQ(report.servers(0).slot_ranges(), "0-127");
  EXPECT_EQ(report.servers(1).slot_ranges(), "128-255");

  const Output text =
      RunCtl(*dir_, {"shards", "--coordinator=" + coordinator_->address()});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("0-127"));
}

TEST_F(RecpsctlTest, ServersCanBeAskedDirectly) {
  const Output r =
      RunCtl(*dir_, {"status", "--json", "--interval=0",
                     "--server=" + servers_[0] + "," + servers_[1]});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const auto status = ParseJson<v1::ClusterStatus>(r.out);
  EXPECT_TRUE(status.coordinator().empty());
  EXPECT_EQ(status.shard_map_epoch(), 1u);
  EXPECT_EQ(status.total_rows(), 400);
}

TEST_F(RecpsctlTest, HelpAndUsageErrors) {
  for (const char* command : {"status", "tables", "shards"}) {
    const Output help = RunCtl(*dir_, {command, "--help"});
    EXPECT_EQ(help.code, 0) << command;
    EXPECT_THAT(help.out, HasSubstr(absl::StrCat("Usage: recpsctl ", command)));
    EXPECT_THAT(help.out, HasSubstr("Exit codes"));
  }
  const Output top = RunCtl(*dir_, {"--help"});
  EXPECT_EQ(top.code, 0);
  EXPECT_THAT(top.out, HasSubstr("status"));

  EXPECT_EQ(RunCtl(*dir_, {}).code, 2);
  EXPECT_EQ(RunCtl(*dir_, {"frobnicate"}).code, 2);
  const Output bad_flag =
      RunCtl(*dir_, {"status", "--frobnicate", "--coordinator=x:1"});
  EXPECT_EQ(bad_flag.code, 2);
  EXPECT_THAT(bad_flag.err, HasSubstr("--frobnicate"));
  EXPECT_EQ(
      RunCtl(*dir_, {"tables", "--interval=1s", "--coordinator=x:1"}).code, 2);
  EXPECT_EQ(
      RunCtl(*dir_, {"status", "--interval=soon", "--coordinator=x:1"}).code,
      2);
  const Output nowhere = RunCtl(*dir_, {"status"}, "env -u RECPS_COORDINATOR");
  EXPECT_EQ(nowhere.code, 2);
  EXPECT_THAT(nowhere.err, HasSubstr("--coordinator"));
}

TEST_F(RecpsctlTest, AddressesArePortCheckedAndTheWrongServiceIsNamed) {
  // gRPC would wrap port 99999 to 34463 and ask whatever listens there.
  Output r = RunCtl(*dir_, {"status", "--coordinator=127.0.0.1:99999"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("has port '99999', not 1..65535"));
  r = RunCtl(*dir_, {"status", "--coordinator=" + coordinator_->address()},
             "RECPS_COORDINATOR=127.0.0.1:0");
  EXPECT_EQ(r.code, 0) << r.err;  // the flag wins over the environment
  r = RunCtl(*dir_, {"status"}, "RECPS_COORDINATOR=127.0.0.1:0");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("RECPS_COORDINATOR=127.0.0.1:0: address '127.0.0.1:0' has port '0'"));
  r = RunCtl(*dir_, {"shards", "--server=" + servers_[0] + ",127.0.0.1:65536"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--server=127.0.0.1:65536"));
  EXPECT_EQ(RunCtl(*dir_, {"status", "--coordinator=localhost"}).code, 2);

  // A shard server's port is not a coordinator: say so, not "".
  r = RunCtl(*dir_, {"status", "--coordinator=" + servers_[0]});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr(servers_[0] + " answered but is not a coordinator"));
  EXPECT_THAT(r.err, HasSubstr("UNIMPLEMENTED"));
  r = RunCtl(*dir_, {"shards", "--server=" + coordinator_->address()});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("is not a shard server"));
}

TEST(RecpsctlPlanLimitsTest, CountFlagsAreBoundedAndSayTheLimit) {
  TempDir dir;
  const std::string job = std::string(RECPS_SOURCE_DIR) + "/examples/small.textproto";
  // Once grew to 7.9 GB and died; 100000 ran past a minute. Each is refused
  // with the limit it broke, before any planning (RunCtl kills a run past
  // 60 s).
  for (const char* servers : {"--servers=100000000", "--servers=100000"}) {
    const Output r = RunCtl(dir, {"plan", job, servers, "--memory=1GiB"});
    EXPECT_EQ(r.code, 2) << servers;
    EXPECT_THAT(r.err, HasSubstr("the limit is 4096"));
  }
  Output r = RunCtl(dir, {"plan", job, "--servers=2", "--memory=1GiB",
                          "--workers=1000000000"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--workers=1000000000: the limit is 65536"));
  r = RunCtl(dir, {"plan", job, "--servers=2", "--memory=1GiB", "--batch_size=99999999999"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--batch_size=99999999999: the limit is"));
  r = RunCtl(dir, {"status", "--coordinator=127.0.0.1:1", "--timeout=1000h"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("the limit is 1h"));
  // The largest allowed plan still runs.
  r = RunCtl(dir, {"plan", job, "--servers=4096", "--memory=1GiB"});
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(RecpsctlTest, UnreachableCoordinatorFailsFastWithExitCode1) {
  // Port 1: nothing listens there. A refused connection fails the call; it
  // must not wait for the deadline (an hour: RunCtl would kill it first).
  const Output r =
      RunCtl(*dir_, {"status", "--coordinator=127.0.0.1:1", "--timeout=1h"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("cannot ask the coordinator 127.0.0.1:1"));
  EXPECT_THAT(r.err, HasSubstr("Connection refused"));
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("Deadline")));
  EXPECT_TRUE(r.out.empty());
}

// gRPC's log of a channel's connect attempts (GRPC_VERBOSITY=info): one
// "connect failed (... Connection refused ...), backing off for N ms" line
// per refused attempt.
int Refusals(const std::string& log) {
  int n = 0;
  for (size_t at = log.find("connect failed ("); at != std::string::npos;
       at = log.find("connect failed (", at + 1)) {
    ++n;
  }
  return n;
}
std::vector<int> Backoffs(const std::string& log) {
  std::vector<int> ms;
  const std::string key = "backing off for ";
  for (size_t at = log.find(key); at != std::string::npos; at = log.find(key, at + 1)) {
    ms.push_back(std::atoi(log.c_str() + at + key.size()));
  }
  return ms;
}

// A coordinator that is down when recpsctl first dials it and back a moment
// later (kill -9, restarted in place as `recps local` does) is reached as
// soon as it serves. Control channels back off from 100 ms growing to 1 s
// (gRPC's default: 1 s growing to 2 min); gRPC 1.51 advances a connection
// attempt that no call polls only from its backup poller, every 5 s by
// default (common/rpc/channels.cc sets 100 ms): each try after the first
// refusal stalled that long, and a test that polled `recpsctl moves` during
// a coordinator restart saw nothing for 5-10 s. The test checks the retry
// schedule recpsctl logs and that it connects at its first try after the
// coordinator serves; how long that takes is not checked here (a wall-clock
// bound on real processes; nothing benchmarks it).
TEST(RecpsctlRestartTest, ACoordinatorBackFromACrashIsReachedAtOnce) {
  TempDir dir;
  const std::vector<std::string> args = {"--state_dir=" + dir.path() + "/state",
                                         "--num_shards=2", "--num_slots=256"};
  auto coordinator = LocalShard::Start(RECPS_COORDINATOR_BINARY, args);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string address = (*coordinator)->address();
  (*coordinator)->Kill();
  const std::string log_path = dir.path() + "/recpsctl.log";
  absl::StatusOr<client::ChildProcess> ctl = client::ChildProcess::Spawn(
      RECPSCTL_BINARY, {"moves", "--coordinator=" + address, "--insecure", "--timeout=60s"},
      log_path, {"GRPC_VERBOSITY=info"});
  ASSERT_TRUE(ctl.ok()) << ctl.status();
  // Its first three tries are refused (with gRPC's default backoff the
  // second wait would be over 1 s).
  ASSERT_TRUE(testing::Eventually(
      [&] { return Refusals(::recps::testing::ReadAll(log_path)) >= 3; }))
      << ::recps::testing::ReadAll(log_path);
  std::vector<std::string> again = args;
  again.push_back("--listen=" + address);
  coordinator = LocalShard::Start(RECPS_COORDINATOR_BINARY, again);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const int refused_before_serving = Refusals(::recps::testing::ReadAll(log_path));
  absl::StatusOr<int> code = ctl->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok()) << code.status();
  const std::string log = ::recps::testing::ReadAll(log_path);
  EXPECT_EQ(*code, 0) << log;
  // At most the attempt under way while the coordinator started was
  // refused: the next one connected.
  EXPECT_LE(Refusals(log), refused_before_serving + 1) << log;
  // Every wait between tries was at most the 1 s maximum plus gRPC's 20%
  // jitter.
  const std::vector<int> backoffs = Backoffs(log);
  EXPECT_GE(backoffs.size(), 3u) << log;
  for (int ms : backoffs) EXPECT_LE(ms, 1200) << log;
}

TEST_F(RecpsctlTest, AServerThatDoesNotAnswerMakesTheClusterUnhealthy) {
  const Output r =
      RunCtl(*dir_, {"status", "--interval=0", "--server=" + servers_[0],
                     "--server=127.0.0.1:1"});
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("UNHEALTHY"));
  EXPECT_THAT(r.out, HasSubstr("127.0.0.1:1: unreachable"));

  const Output json = RunCtl(
      *dir_,
      {"shards", "--json", "--server=" + servers_[0], "--server=127.0.0.1:1"});
  EXPECT_EQ(json.code, 3) << json.err;
  const auto report = ParseJson<v1::ShardsReport>(json.out);
  ASSERT_EQ(report.servers_size(), 2);
  EXPECT_TRUE(report.servers(0).error().empty());
  EXPECT_FALSE(report.servers(1).error().empty());
}

// `plan` needs no cluster: the example job on two planned servers.
TEST(RecpsctlPlanTest, PlansTheExampleJobOffline) {
  TempDir dir;
  const std::string job =
      std::string(RECPS_SOURCE_DIR) + "/examples/small.textproto";
  const Output text =
      RunCtl(dir, {"plan", job, "--servers=2", "--memory=256MiB"});
  ASSERT_EQ(text.code, 0) << text.out << text.err;
  EXPECT_THAT(text.out, HasSubstr("server-0"));
  EXPECT_THAT(text.out, HasSubstr("server-1"));

  const Output json = RunCtl(dir, {"plan", job, "--servers", "2", "--memory",
                                   "256MiB", "--workers=4", "--json"});
  ASSERT_EQ(json.code, 0) << json.out << json.err;
  const auto plan = ParseJson<v1::ShardingPlan>(json.out);
  EXPECT_EQ(plan.servers_size(), 2);
  EXPECT_GT(plan.tables_size(), 0);
  EXPECT_EQ(plan.server_estimates_size(), 2);
  EXPECT_EQ(plan.inputs().num_workers(), 4);
  EXPECT_GT(plan.predicted_step_seconds(), 0);

  // The example spec's server entry is a template for --servers.
  const Output spec = RunCtl(dir, {"plan", job,
                                   "--spec=" + std::string(RECPS_SOURCE_DIR) +
                                       "/examples/plan_spec.textproto",
                                   "--servers=3", "--json"});
  ASSERT_EQ(spec.code, 0) << spec.out << spec.err;
  EXPECT_EQ(ParseJson<v1::ShardingPlan>(spec.out).servers_size(), 3);

  EXPECT_EQ(RunCtl(dir, {"plan", "--help"}).code, 0);
  const Output no_servers = RunCtl(dir, {"plan", job, "--memory=1GiB"});
  EXPECT_EQ(no_servers.code, 2);
  EXPECT_THAT(no_servers.err, HasSubstr("--servers"));
  EXPECT_EQ(RunCtl(dir, {"plan", job, "--servers=2", "--memory=lots"}).code, 2);
  EXPECT_EQ(RunCtl(dir, {"plan", dir.path() + "/missing.textproto",
                         "--servers=2", "--memory=1GiB"})
                .code,
            2);
  EXPECT_EQ(RunCtl(dir, {"plan", job, "--servers=2", "--memory=1GiB",
                         "--coordinator=x:1"})
                .code,
            2);
  const Output too_small =
      RunCtl(dir, {"plan", job, "--servers=2", "--memory=64KiB"});
  EXPECT_EQ(too_small.code, 1) << too_small.out;
  EXPECT_FALSE(too_small.err.empty());
}

// A shard server that dies: its lease expires and status says so, exit 3.
TEST(RecpsctlHealthTest, ADeadShardServerMakesStatusExit3) {
  TempDir dir;
  auto coordinator = LocalShard::Start(
      RECPS_COORDINATOR_BINARY,
      {"--state_dir=" + dir.path() + "/state", "--num_shards=1",
       "--num_slots=64", "--lease=1s", "--tick=20ms"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string tables = dir.WriteFile("tables.textproto", kTables);
  auto shard =
      LocalShard::Start(RECPS_SHARD_BINARY,
                        {"--tables=" + tables, "--num_slots=64", "--threads=1",
                         "--coordinator=" + (*coordinator)->address()});
  ASSERT_TRUE(shard.ok()) << shard.status();
  const std::string address = (*shard)->address();
  const std::string where = "--coordinator=" + (*coordinator)->address();
  Output r;
  ASSERT_TRUE(testing::Eventually([&] {
    r = RunCtl(dir, {"status", "--interval=0", where});
    return r.code == 0;
  })) << r.out << r.err;

  (*shard)->Kill();
  v1::ClusterStatus status;
  ASSERT_TRUE(testing::Eventually([&] {
    r = RunCtl(dir,
               {"status", "--interval=0", "--json", "--timeout=2s", where});
    status = ParseJson<v1::ClusterStatus>(r.out);
    return status.servers_size() == 1 &&
           status.servers(0).member_state() == v1::EXPIRED;
  })) << r.out << r.err;
  EXPECT_EQ(r.code, 3);
  EXPECT_FALSE(status.healthy());
  EXPECT_FALSE(status.servers(0).reachable());
  EXPECT_THAT(status.servers(0).problems(),
              ::testing::ElementsAre(HasSubstr("lease expired"),
                                     HasSubstr("unreachable")));

  const Output text =
      RunCtl(dir, {"status", "--interval=0", "--timeout=2s", where});
  EXPECT_EQ(text.code, 3);
  EXPECT_THAT(text.out, HasSubstr("UNHEALTHY (2 problems)"));
  EXPECT_THAT(text.out, HasSubstr(address + ": lease expired"));
  EXPECT_EQ(RunCtl(dir, {"tables", "--timeout=2s", where}).code, 3);
}

// `members forget` removes expired members (fakes included) for good, and
// refuses a live one.
TEST(RecpsctlMembersTest, ForgetRemovesAnExpiredMemberAndRefusesALiveOne) {
  TempDir dir;
  const std::vector<std::string> args = {"--state_dir=" + dir.path() + "/state",
                                         "--lease=500ms", "--tick=20ms"};
  auto coordinator = LocalShard::Start(RECPS_COORDINATOR_BINARY, args);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto stub = v1::Coordinator::NewStub(
      rpc::MakeChannel((*coordinator)->address(), rpc::ChannelKind::kControl));
  auto list = [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ListMembersResponse members;
    EXPECT_TRUE(stub->ListMembers(&ctx, v1::ListMembersRequest(), &members).ok());
    return members;
  };
  std::string fake_id;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::RegisterRequest request;
    request.set_role(v1::SHARD_SERVER);
    request.set_address("10.1.2.3:7000");  // nobody there: it never heartbeats
    v1::RegisterResponse response;
    ASSERT_TRUE(stub->Register(&ctx, request, &response).ok());
    fake_id = response.member_id();
  }
  const std::string where = "--coordinator=" + (*coordinator)->address();
  // Alive: refused, and it stays.
  Output out = RunCtl(dir, {"members", "forget", fake_id, where});
  EXPECT_EQ(out.code, 1) << out.err;
  EXPECT_THAT(out.err, HasSubstr("is alive"));
  EXPECT_EQ(list().members_size(), 1);

  ASSERT_TRUE(testing::Eventually([&] {
    const v1::ListMembersResponse members = list();
    return members.members_size() == 1 && members.members(0).state() == v1::EXPIRED;
  }));
  out = RunCtl(dir, {"status", "--interval=0", "--json", where});
  EXPECT_EQ(out.code, 3);
  EXPECT_THAT(absl::StrJoin(ParseJson<v1::ClusterStatus>(out.out).problems(), "; "),
              HasSubstr(fake_id));
  out = RunCtl(dir, {"members", "forget", fake_id, where});
  EXPECT_EQ(out.code, 0) << out.err;
  EXPECT_THAT(out.out, HasSubstr("forgot " + fake_id));
  EXPECT_EQ(list().members_size(), 0);
  out = RunCtl(dir, {"members", "forget", fake_id, where});
  EXPECT_EQ(out.code, 1);
  EXPECT_THAT(out.err, HasSubstr("no member"));
  EXPECT_EQ(RunCtl(dir, {"members", "drop", fake_id, where}).code, 2);

  // Gone from the state too: a restart does not bring it back.
  ASSERT_TRUE((*coordinator)->Terminate().ok());
  coordinator = LocalShard::Start(RECPS_COORDINATOR_BINARY, args);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  stub = v1::Coordinator::NewStub(
      rpc::MakeChannel((*coordinator)->address(), rpc::ChannelKind::kControl));
  EXPECT_EQ(list().members_size(), 0);
  out = RunCtl(dir, {"status", "--interval=0", "--json",
                     "--coordinator=" + (*coordinator)->address()});
  EXPECT_THAT(absl::StrJoin(ParseJson<v1::ClusterStatus>(out.out).problems(), "; "),
              ::testing::Not(HasSubstr(fake_id)));
}

}  // namespace
}  // namespace recps
