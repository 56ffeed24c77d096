// Hostile or mistaken input to a real recps-coordinator process: every
// request it refuses gets an error naming the field and the limit, the
// daemon keeps answering, and its state (members, KV entries, job) stays as
// it was.
#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <filesystem>
#include <climits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc/channels.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "recps/v1/coordinator.grpc.pb.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "tests/testing/files.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::LocalShard;
using testing::TempDir;

constexpr char kJob[] = R"(
name: "limits"
tables { name: "t0" dim: 8 num_rows: 1000 optimizer { kind: SGD learning_rate: 0.1 } }
features { name: "f0" table: "t0" }
model { bottom_mlp: 8 top_mlp: 1 }
training { batch_size: 32 steps: 10 seed: 7 eval_batches: 1 eval_interval: 5 dense_optimizer { kind: SGD learning_rate: 0.1 } }
data { synthetic { seed: 1 num_dense: 4 features { id_space: 1000 min_ids_per_bag: 1 max_ids_per_bag: 1 } } }
)";

// A shard server's admin API that answers SetShardMap with `code` and
// reports `epoch` as its current map: a server that refuses a map, or one
// that had it already.
class FakeShardAdmin final : public v1::ShardAdmin::Service {
 public:
  FakeShardAdmin(grpc::StatusCode code, uint64_t epoch) : code_(code), epoch_(epoch) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", rpc::ServerCredentials(rpc::TransportSecurity()),
                             &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~FakeShardAdmin() override { server_->Shutdown(); }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int pushes() { return pushes_.load(); }

  grpc::Status SetShardMap(grpc::ServerContext*, const v1::SetShardMapRequest* request,
                           v1::SetShardMapResponse*) override {
    ++pushes_;
    if (code_ == grpc::StatusCode::OK) return grpc::Status::OK;
    return grpc::Status(code_, absl::StrCat("shard map epoch ", request->shard_map().epoch(),
                                            " would take away slots 0-3 holding 12 rows"));
  }
  grpc::Status GetShardMap(grpc::ServerContext*, const v1::GetShardMapRequest*,
                           v1::ShardMap* map) override {
    map->set_epoch(epoch_);
    return grpc::Status::OK;
  }

 private:
  const grpc::StatusCode code_;
  const uint64_t epoch_;
  std::atomic<int> pushes_{0};
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

class CoordinatorLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override { job_path_ = dir_.WriteFile("job.textproto", kJob); }

  // Starts the coordinator on state_dir() with `extra` flags.
  void Start(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--state_dir=" + state_dir(), "--job=" + job_path_,
                                     "--num_slots=256", "--lease=3s", "--tick=20ms"};
    args.insert(args.end(), extra.begin(), extra.end());
    // Through sh, to keep its log: LocalShard's own flags land in "$@".
    args.insert(args.begin(), {"-c", absl::StrCat("exec \"$0\" \"$@\" 2>>", log_path()),
                               RECPS_COORDINATOR_BINARY});
    auto c = LocalShard::Start("/bin/sh", args);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = *std::move(c);
    stub_ = v1::Coordinator::NewStub(
        rpc::MakeChannel(coordinator_->address(), rpc::ChannelKind::kControl));
  }

  std::string state_dir() const { return dir_.path() + "/state"; }
  std::string log_path() const { return dir_.path() + "/coordinator.log"; }

  template <typename Request, typename Response, typename Method>
  grpc::Status Call(Method method, const Request& request, Response* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return (stub_.get()->*method)(&context, request, response);
  }

  v1::ListMembersResponse Members() {
    v1::ListMembersResponse response;
    grpc::Status s =
        Call(&v1::Coordinator::Stub::ListMembers, v1::ListMembersRequest(), &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response;
  }

  // A heartbeat is answered (within Call's deadline): the daemon is up and
  // nothing a refused request did holds its lock. Not a wall-clock bound:
  // a busy machine may take any time short of the deadline.
  bool HeartbeatAnswered(const std::string& member_id) {
    v1::HeartbeatRequest request;
    request.set_member_id(member_id);
    v1::HeartbeatResponse response;
    grpc::Status s = Call(&v1::Coordinator::Stub::Heartbeat, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return s.ok();
  }

  std::string RegisterWorker(int rank) {
    v1::RegisterRequest request;
    request.set_role(v1::WORKER);
    request.set_rank(rank);
    v1::RegisterResponse response;
    grpc::Status s = Call(&v1::Coordinator::Stub::Register, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.member_id();
  }

  grpc::Status KvSet(const std::string& key, const std::string& value) {
    v1::KvSetRequest request;
    request.set_key(key);
    request.set_value(value);
    v1::KvSetResponse response;
    return Call(&v1::Coordinator::Stub::KvSet, request, &response);
  }
  grpc::Status KvGet(const std::string& key, std::string* value) {
    v1::KvGetRequest request;
    request.set_key(key);
    v1::KvGetResponse response;
    grpc::Status s = Call(&v1::Coordinator::Stub::KvGet, request, &response);
    *value = response.value();
    return s;
  }

  // Bytes of the state dir's files.
  int64_t StateBytes() const {
    int64_t bytes = 0;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(state_dir())) {
      if (entry.is_regular_file()) bytes += static_cast<int64_t>(entry.file_size());
    }
    return bytes;
  }

  // Runs the coordinator on state_dir() with `args`, expecting it to refuse
  // to start; returns its exit code and what it logged.
  std::pair<int, std::string> StartRefused(const std::vector<std::string>& args) {
    std::vector<std::string> all = {"--state_dir=" + state_dir()};
    all.insert(all.end(), args.begin(), args.end());
    return RunToExit(RECPS_COORDINATOR_BINARY, all);
  }

  // Runs `command` with bash; returns its exit code and stdout.
  std::pair<int, std::string> RunToExitCommand(const std::string& command) {
    const std::string out = dir_.path() + "/command.out";
    absl::StatusOr<int> code = testing::RunProcess(
        "/bin/bash", {"-c", absl::StrCat("(", command, ") >", out)}, absl::Seconds(20));
    EXPECT_TRUE(code.ok()) << code.status();
    return {code.ok() ? *code : -1, ::recps::testing::ReadAll(out)};
  }

  // Runs `binary` with `args` (on 127.0.0.1, OS-picked ports) until it
  // exits; returns its exit code and what it logged.
  std::pair<int, std::string> RunToExit(const std::string& binary,
                                        const std::vector<std::string>& args) {
    std::string command =
        absl::StrCat(binary, " --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --insecure");
    for (const std::string& a : args) absl::StrAppend(&command, " '", a, "'");
    const std::string log = dir_.path() + "/run.log";
    absl::StrAppend(&command, " 2>", log);
    absl::StatusOr<int> code =
        testing::RunProcess("/bin/sh", {"-c", command}, absl::Seconds(30));
    EXPECT_TRUE(code.ok()) << code.status();
    return {code.ok() ? *code : -1, ::recps::testing::ReadAll(log)};
  }

  v1::JobConfig Job() {
    v1::GetJobResponse response;
    grpc::Status s = Call(&v1::Coordinator::Stub::GetJob, v1::GetJobRequest(), &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.job();
  }

  TempDir dir_;
  std::string job_path_;
  std::unique_ptr<LocalShard> coordinator_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

TEST_F(CoordinatorLimitsTest, BarrierCountsAreBoundedByTheWorldSize) {
  Start({"--world_size=4"});
  const std::string worker = RegisterWorker(0);
  for (int32_t count : {20000000, INT_MAX, 5}) {
    v1::BarrierRequest request;
    request.set_name("init");
    request.set_count(count);
    request.set_rank(0);
    request.set_timeout_ms(60000);
    v1::BarrierResponse response;
    // Refused at once: a parked barrier would end in DEADLINE_EXCEEDED at
    // Call's 10 s deadline (its own timeout is 60 s), not in this status.
    grpc::Status s = Call(&v1::Coordinator::Stub::Barrier, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << count;
    EXPECT_THAT(s.error_message(),
                AllOf(HasSubstr(absl::StrCat("count ", count)), HasSubstr("limit 4"),
                      HasSubstr("--world_size")));
    EXPECT_TRUE(HeartbeatAnswered(worker));
  }
  // A barrier within the world size still works.
  for (int rank = 0; rank < 2; ++rank) {
    v1::BarrierRequest request;
    request.set_name("pair");
    request.set_count(1);
    request.set_rank(0);
    v1::BarrierResponse response;
    EXPECT_TRUE(Call(&v1::Coordinator::Stub::Barrier, request, &response).ok());
  }
}

TEST_F(CoordinatorLimitsTest, BarrierCountsWithoutAWorldSizeAreBoundedByMaxMembers) {
  Start({"--max_members=64"});
  const std::string worker = RegisterWorker(0);
  v1::BarrierRequest request;
  request.set_name("init");
  request.set_count(INT_MAX);
  request.set_rank(0);
  v1::BarrierResponse response;
  grpc::Status s = Call(&v1::Coordinator::Stub::Barrier, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), AllOf(HasSubstr("limit 64"), HasSubstr("--max_members")));
  EXPECT_TRUE(HeartbeatAnswered(worker));
  EXPECT_EQ(Members().members_size(), 1);
}

TEST_F(CoordinatorLimitsTest, RegisterChecksRankAddressAndTheMemberTableSize) {
  Start({"--world_size=2", "--max_members=3"});
  auto refused = [&](v1::MemberRole role, const std::string& address, int rank) {
    v1::RegisterRequest request;
    request.set_role(role);
    request.set_address(address);
    request.set_rank(rank);
    v1::RegisterResponse response;
    grpc::Status s = Call(&v1::Coordinator::Stub::Register, request, &response);
    EXPECT_FALSE(s.ok()) << address << " rank " << rank;
    return s;
  };
  grpc::Status s = refused(v1::WORKER, "", -404490680);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), AllOf(HasSubstr("rank -404490680"),
                                       HasSubstr("[0, 2)"), HasSubstr("--world_size")));
  s = refused(v1::WORKER, "", 2);
  EXPECT_THAT(s.error_message(), HasSubstr("rank 2 is outside [0, 2)"));
  for (const std::string address :
       {"../../../../etc/passwd", "10.0.0.1:99999", "10.0.0.1:0", "host:", ":7000",
        "host:70x0", "bad_host:7000", "-host:7000", "[zz::1]:7000", "[::1]:-1"}) {
    s = refused(v1::SHARD_SERVER, address, -1);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << address;
    EXPECT_THAT(s.error_message(), AllOf(HasSubstr("address"), HasSubstr("1..65535")))
        << address;
  }
  EXPECT_EQ(Members().members_size(), 0);

  // Well-formed addresses of every kind are taken.
  for (const std::string address : {"shard-a.example.com:7000", "[::1]:65535"}) {
    v1::RegisterRequest request;
    request.set_role(v1::SHARD_SERVER);
    request.set_address(address);
    request.set_rank(-1);
    v1::RegisterResponse response;
    s = Call(&v1::Coordinator::Stub::Register, request, &response);
    EXPECT_TRUE(s.ok()) << address << ": " << s.error_message();
  }
  RegisterWorker(1);
  // The table is full: a new member is refused, a known one re-registers.
  s = refused(v1::SHARD_SERVER, "10.0.0.9:7000", -1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), AllOf(HasSubstr("3 members"), HasSubstr("limit is 3"),
                                       HasSubstr("--max_members"),
                                       HasSubstr("recpsctl members forget")));
  EXPECT_EQ(RegisterWorker(1), "worker-0");
  EXPECT_EQ(Members().members_size(), 3);
}

TEST_F(CoordinatorLimitsTest, InvalidJobsAreRefusedAndAnUnstartedJobCanBeReplaced) {
  const std::string valid = kJob;
  const std::vector<std::pair<std::string, std::string>> invalid = {
      {"name: \"x\" tables { name: \"t0\" dim: 8 optimizer { kind: SGD learning_rate: 1 } }",
       "features"},
      {valid + "\nfeatures { name: \"f1\" table: \"nope\" }", "features[1].table"},
      {valid + "\ntables { name: \"t0\" dim: 8 optimizer { kind: SGD } }", "tables[1]"},
      {valid.substr(0, valid.find("batch_size: 32")) + "batch_size: 0" +
           valid.substr(valid.find("batch_size: 32") + 14),
       "training.batch_size"},
  };
  for (const auto& [text, field] : invalid) {
    const std::string path = dir_.WriteFile("bad.textproto", text);
    const auto [code, log] = StartRefused({"--job=" + path});
    EXPECT_EQ(code, 2) << log;
    EXPECT_THAT(log, HasSubstr(field)) << text;
  }
  // Nothing was stored: the state has no job, and a valid one is taken.
  Start();
  EXPECT_EQ(Job().name(), "limits");
  ASSERT_TRUE(KvSet("old-job-key", "v").ok());
  ASSERT_TRUE(coordinator_->Terminate().ok());

  // Another job on the same state: refused, saying --replace_job would do.
  std::string other = kJob;
  other.replace(other.find("name: \"limits\""), 15, "name: \"second\"");
  const std::string other_path = dir_.WriteFile("other.textproto", other);
  {
    const auto [code, log] = StartRefused({"--job=" + other_path});
    EXPECT_EQ(code, 2);
    EXPECT_THAT(log, AllOf(HasSubstr("holds a different job"), HasSubstr("name"),
                           HasSubstr("no training progress"), HasSubstr("--replace_job")));
  }
  job_path_ = other_path;
  Start({"--replace_job"});
  EXPECT_EQ(Job().name(), "second");
  std::string value;
  EXPECT_EQ(KvGet("old-job-key", &value).error_code(), grpc::StatusCode::NOT_FOUND);

  // Once a worker registered, the job may have trained: no replacing.
  RegisterWorker(0);
  ASSERT_TRUE(coordinator_->Terminate().ok());
  const std::string first_path = dir_.WriteFile("first.textproto", kJob);
  {
    const auto [code, log] = StartRefused({"--job=" + first_path, "--replace_job"});
    EXPECT_EQ(code, 2);
    EXPECT_THAT(log, AllOf(HasSubstr("training progressed"), HasSubstr("worker-0 (rank 0)"),
                           HasSubstr("fresh --state_dir")));
  }
  Start();  // the stored job is kept as it was
  EXPECT_EQ(Job().name(), "second");
}

TEST_F(CoordinatorLimitsTest, AShardThatDisagreesWithTheClusterIsRefusedAndExits) {
  Start({"--num_shards=1"});
  const std::string where = "--coordinator=" + coordinator_->address();
  // Other slots: refused on both sides, naming the two counts.
  auto [code, log] = RunToExit(RECPS_SHARD_BINARY,
                               {"--job=" + job_path_, "--num_slots=128", "--threads=1", where});
  EXPECT_EQ(code, 2) << log;
  EXPECT_THAT(log, AllOf(HasSubstr("refused"), HasSubstr("--num_slots=128"),
                         HasSubstr("the cluster has 256")));
  EXPECT_THAT(::recps::testing::ReadAll(log_path()), AllOf(HasSubstr("refused shard server"),
                                       HasSubstr("--num_slots=128")));
  // Other tables: the missing, the extra and the changed one are named.
  const std::string tables = dir_.WriteFile("tables.textproto", R"(
tables { name: "t1" dim: 8 optimizer { kind: SGD learning_rate: 0.1 } }
)");
  std::tie(code, log) = RunToExit(
      RECPS_SHARD_BINARY, {"--tables=" + tables, "--num_slots=256", "--threads=1", where});
  EXPECT_EQ(code, 2) << log;
  EXPECT_THAT(log, AllOf(HasSubstr("lacks the job's table 't0'"),
                         HasSubstr("serves table 't1'")));
  const std::string wide = dir_.WriteFile("wide.textproto", R"(
tables { name: "t0" dim: 16 num_rows: 1000 optimizer { kind: SGD learning_rate: 0.1 } }
)");
  std::tie(code, log) = RunToExit(
      RECPS_SHARD_BINARY, {"--tables=" + wide, "--num_slots=256", "--threads=1", where});
  EXPECT_EQ(code, 2) << log;
  EXPECT_THAT(log, HasSubstr("table 't0' has dim 16, the job's has 8"));
  EXPECT_THAT(::recps::testing::ReadAll(log_path()), HasSubstr("table 't0' has dim 16, the job's has 8"));
  EXPECT_EQ(Members().members_size(), 0);

  // A shard that agrees registers and gets the map.
  auto shard = LocalShard::Start(RECPS_SHARD_BINARY,
                                 {"--job=" + job_path_, "--num_slots=256", "--threads=1", where});
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_TRUE(testing::Eventually([&] { return Members().shard_map_epoch() == 1; }));
  auto shard_code = (*shard)->Terminate();
  ASSERT_TRUE(shard_code.ok());
  EXPECT_EQ(*shard_code, 0);
}

TEST_F(CoordinatorLimitsTest, ARefusedMapPushIsLoggedCountedAndListed) {
  Start({"--num_shards=2"});
  // One server refuses epoch 1 while it has none; the other answers
  // FAILED_PRECONDITION too, but has epoch 1 already: delivered.
  FakeShardAdmin refusing(grpc::StatusCode::FAILED_PRECONDITION, 0);
  FakeShardAdmin has_it(grpc::StatusCode::FAILED_PRECONDITION, 1);
  for (const FakeShardAdmin* shard : {&refusing, &has_it}) {
    v1::RegisterRequest request;
    request.set_role(v1::SHARD_SERVER);
    request.set_address(shard->address());
    v1::RegisterResponse response;
    ASSERT_TRUE(Call(&v1::Coordinator::Stub::Register, request, &response).ok());
  }
  v1::ListMembersResponse members;
  ASSERT_TRUE(testing::Eventually([&] {
    members = Members();
    return members.map_push_refusals_size() == 1 && has_it.pushes() > 0;
  })) << members.DebugString();
  const v1::MapPushRefusal& refusal = members.map_push_refusals(0);
  EXPECT_EQ(refusal.address(), refusing.address());
  EXPECT_EQ(refusal.epoch(), 1u);
  EXPECT_THAT(refusal.message(), HasSubstr("would take away slots 0-3 holding 12 rows"));
  const std::string log = ::recps::testing::ReadAll(log_path());
  EXPECT_THAT(log, HasSubstr(absl::StrCat(" E recps-coordinator] shard server ",
                                          refusing.address(), " refused shard map epoch 1: ",
                                          "shard map epoch 1 would take away")));
  EXPECT_THAT(log, ::testing::Not(HasSubstr(absl::StrCat("epoch 1 is on ", refusing.address()))));
  EXPECT_THAT(log, HasSubstr(absl::StrCat("epoch 1 is on ", has_it.address(),
                                          " (it had it already)")));
  EXPECT_EQ(refusing.pushes(), 1);  // a refusal is not retried
  // The metric counts it.
  const auto [code, metrics] = RunToExitCommand(absl::StrCat(
      "exec 3<>/dev/tcp/127.0.0.1/", coordinator_->metrics_port(),
      "; printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3"));
  EXPECT_THAT(metrics, HasSubstr("recps_coordinator_shard_map_push_refusals_total 1"));
}

TEST_F(CoordinatorLimitsTest, KvKeysValuesAndKeyCountAreBounded) {
  Start({"--max_kv_keys=5"});
  ASSERT_TRUE(KvSet("kept", "value").ok());
  const int64_t state_before = StateBytes();

  grpc::Status s = KvSet(std::string(257, 'k'), "v");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), AllOf(HasSubstr("257 bytes"), HasSubstr("limit is 256"),
                                       HasSubstr("--max_kv_key_bytes")));
  // 50 values of 3 MB once added 225 MB to the state.
  for (int i = 0; i < 50; ++i) {
    s = KvSet(absl::StrCat("big/", i), std::string(3'000'000, 'x'));
    ASSERT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  EXPECT_THAT(s.error_message(),
              AllOf(HasSubstr("'big/49'"), HasSubstr("3000000 bytes"),
                    HasSubstr("limit is 1048576"), HasSubstr("--max_kv_value_bytes")));
  s = KvSet("just-too-big", std::string((1 << 20) + 1, 'x'));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  ASSERT_TRUE(KvSet("largest", std::string(1 << 20, 'x')).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(KvSet(absl::StrCat("k", i), "v").ok());
  s = KvSet("one-too-many", "v");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), AllOf(HasSubstr("5 keys"), HasSubstr("limit is 5"),
                                       HasSubstr("--max_kv_keys")));
  // Overwriting a key adds none.
  EXPECT_TRUE(KvSet("k0", "again").ok());

  // Nothing refused was kept; the accepted 1 MiB is all the state grew by.
  std::string value;
  EXPECT_EQ(KvGet("big/0", &value).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(KvGet("one-too-many", &value).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_LT(StateBytes() - state_before, 8 << 20);
  ASSERT_TRUE(KvGet("kept", &value).ok());
  EXPECT_EQ(value, "value");

  // The limits hold across a restart: the stored keys count.
  ASSERT_TRUE(coordinator_->Terminate().ok());
  Start({"--max_kv_keys=5"});
  EXPECT_EQ(KvSet("one-too-many", "v").error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  ASSERT_TRUE(KvGet("k0", &value).ok());
  EXPECT_EQ(value, "again");
}

}  // namespace
}  // namespace recps
