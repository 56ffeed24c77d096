// A real recps-coordinator and two real recps-shard processes on 127.0.0.1:
// the shards register, the coordinator builds epoch 1 over them, pushes it
// and streams it; it survives kill -9 with the same map; SIGTERM stops all.
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/channels.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "recps/v1/coordinator.grpc.pb.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "tests/testing/local_shard.h"
#include "tests/testing/metrics_scrape.h"

namespace recps {
namespace {

using ::testing::ElementsAreArray;
using testing::LocalShard;
using testing::TempDir;

// A job the workers' validator (config::ValidateJobConfig) accepts.
constexpr char kJob[] = R"(
tables { name: "user" dim: 8 optimizer { kind: SGD learning_rate: 0.1 } }
features { name: "f0" table: "user" }
model { bottom_mlp: 8 top_mlp: 1 }
training { batch_size: 32 steps: 10 seed: 7 eval_batches: 1 eval_interval: 5 dense_optimizer { kind: SGD learning_rate: 0.1 } }
data { synthetic { seed: 1 num_dense: 4 features { id_space: 1000 min_ids_per_bag: 1 max_ids_per_bag: 1 } } }
)";

void SetDeadline(grpc::ClientContext* context, int seconds = 10) {
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
}

std::unique_ptr<v1::Coordinator::Stub> CoordinatorStub(const std::string& address) {
  return v1::Coordinator::NewStub(
      rpc::MakeChannel(address, rpc::ChannelKind::kControl));
}

absl::StatusOr<std::unique_ptr<LocalShard>> StartCoordinator(
    const std::string& state_dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--state_dir=" + state_dir, "--num_shards=2",
                                   "--num_slots=256", "--lease=3s", "--tick=20ms"};
  args.insert(args.end(), extra.begin(), extra.end());
  return LocalShard::Start(RECPS_COORDINATOR_BINARY, args);
}

using ::recps::testing::Eventually;

TEST(CoordinatorProcessTest, ShardsRegisterGetTheMapAndItSurvivesARestart) {
  TempDir dir;
  const std::string state = dir.path() + "/state";
  const std::string job = dir.WriteFile("job.textproto", kJob);
  auto coordinator = StartCoordinator(state, {"--job=" + job});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string coordinator_address = (*coordinator)->address();
  auto stub = CoordinatorStub(coordinator_address);

  // Watch from before the map exists: the stream waits for epoch 1.
  grpc::ClientContext watch_context;
  SetDeadline(&watch_context, 30);
  v1::WatchShardMapRequest watch_request;
  auto watch = stub->WatchShardMap(&watch_context, watch_request);

  std::vector<std::unique_ptr<LocalShard>> shards;
  const std::string tables = dir.WriteFile("tables.textproto", R"(
tables { name: "user" dim: 8 optimizer { kind: SGD learning_rate: 0.1 } })");
  for (int i = 0; i < 2; ++i) {
    auto shard = LocalShard::Start(RECPS_SHARD_BINARY,
                                   {"--tables=" + tables, "--num_slots=256", "--threads=1",
                                    "--coordinator=" + coordinator_address});
    ASSERT_TRUE(shard.ok()) << shard.status();
    shards.push_back(*std::move(shard));
  }
  std::vector<std::string> addresses = {shards[0]->address(), shards[1]->address()};
  std::sort(addresses.begin(), addresses.end());

  v1::ListMembersResponse members;
  ASSERT_TRUE(Eventually([&] {
    grpc::ClientContext context;
    SetDeadline(&context);
    if (!stub->ListMembers(&context, v1::ListMembersRequest(), &members).ok()) return false;
    return members.members_size() == 2 && members.shard_map_epoch() == 1;
  })) << members.DebugString();
  for (const v1::Member& m : members.members()) {
    EXPECT_EQ(m.role(), v1::SHARD_SERVER);
    EXPECT_EQ(m.state(), v1::ALIVE);
  }

  v1::GetCoordinatorShardMapResponse map;
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    grpc::Status s = stub->GetShardMap(&context, v1::GetCoordinatorShardMapRequest(), &map);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(map.shard_map().epoch(), 1u);
  EXPECT_EQ(map.shard_map().num_slots(), 256u);
  EXPECT_THAT(map.shard_map().servers(), ElementsAreArray(addresses));

  v1::ShardMap watched;
  ASSERT_TRUE(watch->Read(&watched));
  EXPECT_EQ(watched.SerializeAsString(), map.shard_map().SerializeAsString());

  // The coordinator pushed the map to both shards.
  for (const auto& shard : shards) {
    auto admin = v1::ShardAdmin::NewStub(
        rpc::MakeChannel(shard->address(), rpc::ChannelKind::kControl));
    EXPECT_TRUE(Eventually([&] {
      grpc::ClientContext context;
      SetDeadline(&context);
      v1::ShardMap on_shard;
      return admin->GetShardMap(&context, v1::GetShardMapRequest(), &on_shard).ok() &&
             on_shard.epoch() == 1;
    })) << shard->address();
  }

  // Rendezvous over RPC: a waiting KvGet finishes when the key is set.
  std::string value;
  std::thread getter([&] {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::KvGetRequest request;
    request.set_key("nccl/uid");
    request.set_wait_ms(10000);
    v1::KvGetResponse response;
    if (stub->KvGet(&context, request, &response).ok()) value = response.value();
  });
  // Set the key only once the coordinator holds the get parked.
  ASSERT_TRUE(Eventually([&] {
    return testing::MetricValue(
               testing::ScrapeMetrics((*coordinator)->metrics_port()),
               "recps_coordinator_kv_pending_waits") == 1;
  }));
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::KvSetRequest request;
    request.set_key("nccl/uid");
    request.set_value("opaque-id");
    v1::KvSetResponse response;
    ASSERT_TRUE(stub->KvSet(&context, request, &response).ok());
  }
  getter.join();
  EXPECT_EQ(value, "opaque-id");

  // Crash the coordinator; the open stream ends.
  (*coordinator)->Kill();
  EXPECT_FALSE(watch->Read(&watched));
  watch->Finish().IgnoreError();

  // Restarted on the same state dir (no --job: the state has it).
  coordinator = StartCoordinator(state);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  stub = CoordinatorStub((*coordinator)->address());
  v1::GetCoordinatorShardMapResponse again;
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    ASSERT_TRUE(stub->GetShardMap(&context, v1::GetCoordinatorShardMapRequest(), &again).ok());
  }
  EXPECT_EQ(again.shard_map().SerializeAsString(), map.shard_map().SerializeAsString());
  {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::GetJobResponse job_response;
    ASSERT_TRUE(stub->GetJob(&context, v1::GetJobRequest(), &job_response).ok());
    EXPECT_EQ(job_response.job().training().batch_size(), 32);
    v1::ListMembersResponse list;
    grpc::ClientContext list_context;
    SetDeadline(&list_context);
    ASSERT_TRUE(stub->ListMembers(&list_context, v1::ListMembersRequest(), &list).ok());
    EXPECT_EQ(list.members_size(), 2);
    EXPECT_EQ(list.shard_map_epoch(), 1u);
  }

  // SIGTERM with a watch stream open: it ends, and every process exits 0.
  grpc::ClientContext watch2_context;
  SetDeadline(&watch2_context, 30);
  auto watch2 = stub->WatchShardMap(&watch2_context, watch_request);
  ASSERT_TRUE(watch2->Read(&watched));
  EXPECT_EQ(watched.epoch(), 1u);
  auto code = (*coordinator)->Terminate(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  EXPECT_FALSE(watch2->Read(&watched));
  EXPECT_EQ(watch2->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  for (auto& shard : shards) {
    auto shard_code = shard->Terminate(absl::Seconds(10));
    ASSERT_TRUE(shard_code.ok()) << shard_code.status();
    EXPECT_EQ(*shard_code, 0);
  }
}

}  // namespace
}  // namespace recps
