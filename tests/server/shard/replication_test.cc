// Replicated shard servers (docs/replication.md): real recps-shard
// processes on 127.0.0.1 whose map gives every slot a backup. A primary
// forwards each push to its backups before it acknowledges it, so a backup
// holds its primary's rows bit for bit and can take over when the primary
// is lost (here the promotion map is installed by hand, as the coordinator
// will).
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/embedding_client.h"
#include "common/hashing.h"
#include "common/rpc/channels.h"
#include "common/wire/replica_placement.h"
#include "common/wire/shard_map.h"
#include "common/wire/wire_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "recps/v1/shard.grpc.pb.h"
#include "tests/server/shard/toy_job.h"
#include "tests/testing/metrics_scrape.h"
#include "tests/testing/shard_cluster.h"

namespace recps {
namespace {

using ::testing::HasSubstr;
using testing::kDim;
using testing::kSlots;
using testing::kTables;

class ReplicatedCluster : public testing::ShardCluster {
 public:
  // `num_servers` servers in sync mode for `world_size` workers, their map
  // (epoch 2) with `replication` copies of each row.
  ReplicatedCluster(int num_servers, int world_size, int replication,
                    bool same_host_rows = true)
      : ShardCluster(RECPS_SHARD_BINARY, kTables,
                     {absl::StrCat("--world_size=", world_size), "--consistency=sync",
                      "--seed=7", "--step_timeout=20s", "--threads=2",
                      absl::StrCat("--same_host_rows=", same_host_rows)},
                     num_servers, kSlots) {
    v1::ShardMap p = shard_map().ToProto();
    p.set_epoch(2);
    absl::StatusOr<ShardMap> m = ShardMap::FromProto(p);
    EXPECT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(AddBackups(replication, {}, &*m).ok());
    SetMap(*m);
  }

  std::unique_ptr<client::EmbeddingClient> NewClient(int rank, absl::Duration timeout) {
    client::EmbeddingClientOptions options;
    options.worker_rank = rank;
    options.rpc_timeout = timeout;
    return ShardCluster::NewClient({{"user", kDim}, {"item", kDim}}, options);
  }
};

// Runs the toy job's `steps` steps on `world` workers (threads).
void Train(ReplicatedCluster& cluster, int world, int steps) {
  std::vector<std::unique_ptr<client::EmbeddingClient>> clients;
  for (int r = 0; r < world; ++r) clients.push_back(cluster.NewClient(r, absl::Seconds(30)));
  std::vector<std::thread> workers;
  for (int r = 0; r < world; ++r) {
    workers.emplace_back([&, r] { testing::RunWorker(*clients[r], r, steps); });
  }
  for (auto& w : workers) w.join();
}

// Forwards through the socket (--same_host_rows=false) and through the
// primary's shared memory (same-host rows, the default on one host).
class ReplicationForms : public ::testing::TestWithParam<bool> {};

TEST_P(ReplicationForms, ABackupHoldsItsPrimarysRowsBitForBit) {
  constexpr int kWorld = 2, kSteps = 6;
  const bool same_host = GetParam();
  ReplicatedCluster cluster(3, kWorld, /*replication=*/2, same_host);
  ASSERT_TRUE(cluster.ok());
  Train(cluster, kWorld, kSteps);
  // Server 1 backs up server 0: the forwards went the way asked.
  const double shared = testing::MetricValue(
      testing::ScrapeMetrics(cluster.shard(1).metrics_port()),
      "recps_shard_same_host_bytes_total{rpc=\"ReplicatePush\"");
  if (same_host) {
    EXPECT_GT(shared, 0);
  } else {
    EXPECT_LE(shared, 0);
  }
  // The metrics of both sides: every step's pushes reached the backup,
  // and the primary's pushes waited for it.
  const std::string backup = testing::ScrapeMetrics(cluster.shard(1).metrics_port());
  EXPECT_GE(testing::MetricValue(backup, "recps_shard_replica_pushes_total"), kWorld * kSteps);
  EXPECT_GE(testing::MetricValue(backup, "recps_shard_replica_lag_steps"), 0);
  EXPECT_GE(testing::MetricValue(testing::ScrapeMetrics(cluster.shard(0).metrics_port()),
                                 "recps_shard_forward_wait_seconds_count"),
            kWorld * kSteps);
  std::vector<float> before;
  {
    auto reader = cluster.NewClient(0, absl::Seconds(30));
    before = testing::ReadAll(*reader, kWorld, kSteps);
  }
  // Server 0 is lost; its backup (server 1) is promoted in epoch 3.
  cluster.shard(0).Kill();
  absl::StatusOr<ShardMap> promoted = PromoteBackups(cluster.shard_map(), 0);
  ASSERT_TRUE(promoted.ok()) << promoted.status();
  for (int s : {1, 2}) {
    const grpc::Status set = cluster.SetMapOn(s, promoted->ToProto());
    ASSERT_TRUE(set.ok()) << s << ": " << set.error_message();
  }
  auto reader = cluster.NewClient(0, absl::Seconds(30));
  const std::vector<float> after = testing::ReadAll(*reader, kWorld, kSteps);
  EXPECT_EQ(reader->shard_map_epoch(), 3u);
  ASSERT_EQ(before.size(), after.size());
  EXPECT_EQ(0, std::memcmp(before.data(), after.data(), before.size() * sizeof(float)))
      << "the promoted backup's rows differ from its primary's";
}

INSTANTIATE_TEST_SUITE_P(SocketAndSameHost, ReplicationForms, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "SameHostRows" : "Socket";
                         });

TEST(Replication, APushIsNotAcknowledgedWhileABackupCannotTakeIt) {
  ReplicatedCluster cluster(3, /*world_size=*/1, /*replication=*/2);
  ASSERT_TRUE(cluster.ok());
  cluster.shard(1).Kill();  // the backup of server 0's slots
  // The default failover_wait (30 s): with a short one the last attempt
  // can end at that deadline, under load, instead of with the refusal.
  auto client = cluster.NewClient(0, absl::Seconds(3));
  // Ids of server 0's slots only (the others' pushes are not the point).
  const uint64_t item = StableNameKey("item");
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 1000 && ids.size() < 8; ++id) {
    if (cluster.shard_map().OwnerOf(item, id) == 0) ids.push_back(id);
  }
  std::vector<float> rows(ids.size() * kDim, 0.5f);
  ASSERT_TRUE(client->Lookup(0, {{1, ids, rows.data()}}).ok());
  const absl::Status pushed = client->PushGradients(0, {{1, ids, rows.data()}});
  ASSERT_FALSE(pushed.ok()) << "acknowledged with its backup down";
  EXPECT_THAT(pushed.message(), HasSubstr("did not take the push"));
}

TEST(Replication, AForwardedPushOfIdsTheServerDoesNotBackIsRefused) {
  ReplicatedCluster cluster(3, /*world_size=*/1, /*replication=*/2);
  ASSERT_TRUE(cluster.ok());
  const uint64_t item = StableNameKey("item");
  int64_t id = 0;
  while (cluster.shard_map().OwnerOf(item, id) != 0) ++id;
  v1::ReplicatePushRequest request;
  v1::PushGradientsRequest* push = request.mutable_push();
  push->mutable_header()->set_shard_map_epoch(2);
  v1::TableGradients* t = push->add_tables();
  t->set_table("item");
  EncodeIds({id}, t->mutable_ids());
  t->mutable_grads()->assign(kDim * sizeof(float), '\0');
  const auto send = [&](int server, const std::string& primary) {
    request.set_primary(primary);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::PushGradientsResponse response;
    return v1::EmbeddingShard::NewStub(
               rpc::MakeChannel(cluster.address(server), rpc::ChannelKind::kData))
        ->ReplicatePush(&context, request, &response);
  };
  // Server 2 backs up server 1, not server 0.
  grpc::Status s = send(2, cluster.address(0));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("as a backup"));
  s = send(1, "10.9.9.9:1");  // not a server of the map
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("not another server"));
  // Server 1 is server 0's backup: taken.
  s = send(1, cluster.address(0));
  EXPECT_TRUE(s.ok()) << s.error_message();
}

}  // namespace
}  // namespace recps
