// The staleness a lookup saw (client::LookupInfo, from
// LookupResponse.applied_step) with two workers whose pushes the test
// orders: what each consistency mode allows, over gRPC and in process
// (LookupInto). Rank 1 lags; rank 0 runs ahead as far as its mode lets it.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/embedding_client.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "server/shard/shard_process.h"
#include "server/shard/shard_server.h"
#include "tests/testing/local_shard.h"  // Eventually

namespace recps::server {
namespace {

constexpr int kStaleness = 2;  // bounded mode's k

std::unique_ptr<ShardProcess> StartShard(ConsistencyMode mode) {
  ShardProcessOptions o;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(tables {
             name: "a"
             dim: 8
             num_rows: 1000
             optimizer { kind: SGD learning_rate: 0.1 }
           })pb",
      &o.tables));
  o.consistency.mode = mode;
  o.consistency.staleness = kStaleness;
  o.consistency.world_size = 2;
  o.standalone = true;
  o.threads = 2;
  o.store_threads = 1;
  absl::StatusOr<std::unique_ptr<ShardProcess>> p = ShardProcess::Create(std::move(o));
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return nullptr;
  EXPECT_TRUE((*p)->Serve().ok());
  return *std::move(p);
}

// Rank `rank`'s client of `shard`, over gRPC or handing requests to it.
std::unique_ptr<client::EmbeddingClient> MakeClient(ShardProcess& shard, int rank,
                                                    bool in_process) {
  client::EmbeddingClientOptions options;
  options.worker_rank = rank;
  options.in_process_shard = in_process ? shard.endpoint() : nullptr;
  options.security = rpc::TransportSecurity::Insecure();
  absl::StatusOr<std::unique_ptr<client::EmbeddingClient>> c =
      client::EmbeddingClient::Create(
          {{"a", 8}},
          client::MakeServerShardMapSource({shard.address()},
                                           rpc::TransportSecurity::Insecure()),
          options);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

const std::vector<int64_t> kIds = {1, 2, 3};

// The staleness of a lookup of `step` (-2 when it failed).
int64_t LookupStaleness(client::EmbeddingClient& c, int64_t step) {
  std::vector<float> rows(kIds.size() * 8);
  const client::LookupSpec spec[] = {{0, kIds, rows.data(), /*distinct=*/true}};
  client::LookupInfo info;
  const absl::Status s = c.Lookup(step, spec, &info);
  EXPECT_TRUE(s.ok()) << s;
  return s.ok() ? info.staleness_steps : -2;
}

void Push(client::EmbeddingClient& c, int64_t step) {
  const std::vector<float> grads(kIds.size() * 8, 0.01f);
  const client::PushSpec spec[] = {{0, kIds, grads.data(), /*distinct=*/true}};
  const absl::Status s = c.PushGradients(step, spec);
  EXPECT_TRUE(s.ok()) << "step " << step << ": " << s;
}

int ParkedLookups(ShardProcess& shard) {
  v1::StatsResponse stats;
  EXPECT_TRUE(shard.server().Stats(v1::StatsRequest(), &stats).ok());
  return stats.parked_lookups();
}

// Starts rank 0's lookup of `step` beside the test and checks that the
// server parks it (its mode does not let it run yet); `release` then pushes
// what it waits for. Returns the lookup's staleness.
template <typename Release>
int64_t ParkedThenReleased(ShardProcess& shard, client::EmbeddingClient& c, int64_t step,
                           Release release) {
  int64_t staleness = -2;
  std::thread lookup([&] { staleness = LookupStaleness(c, step); });
  EXPECT_TRUE(::recps::testing::Eventually([&] { return ParkedLookups(shard) == 1; }))
      << "the lookup of step " << step << " was not held back";
  release();
  lookup.join();
  return staleness;
}

class LookupStalenessTest : public ::testing::TestWithParam<bool> {
 protected:
  // Starts the server in `mode` and both ranks' clients.
  void Start(ConsistencyMode mode) {
    shard_ = StartShard(mode);
    ASSERT_NE(shard_, nullptr);
    for (int r = 0; r < 2; ++r) {
      clients_[r] = MakeClient(*shard_, r, /*in_process=*/GetParam());
      ASSERT_NE(clients_[r], nullptr);
    }
  }
  std::unique_ptr<ShardProcess> shard_;
  std::unique_ptr<client::EmbeddingClient> clients_[2];
};

// Sync: a lookup of step t runs once step t-1 is applied, every worker's
// push of it summed: never stale.
TEST_P(LookupStalenessTest, SyncLookupsAreNeverStale) {
  Start(ConsistencyMode::kSync);
  client::EmbeddingClient& fast = *clients_[0];
  client::EmbeddingClient& slow = *clients_[1];
  EXPECT_EQ(LookupStaleness(fast, 0), 0);
  EXPECT_EQ(LookupStaleness(slow, 0), 0);
  Push(fast, 0);
  EXPECT_EQ(ParkedThenReleased(*shard_, fast, 1, [&] { Push(slow, 0); }), 0);
  EXPECT_EQ(LookupStaleness(slow, 1), 0);
}

// Bounded k: rank 0 reads up to k steps of rank 1's pushes missing, and a
// lookup that would miss more waits until it would not.
TEST_P(LookupStalenessTest, BoundedLookupsAreAtMostKStepsStale) {
  Start(ConsistencyMode::kBounded);
  client::EmbeddingClient& fast = *clients_[0];
  client::EmbeddingClient& slow = *clients_[1];
  for (int64_t step = 0; step <= kStaleness; ++step) {
    EXPECT_EQ(LookupStaleness(fast, step), step);  // steps 0..step-1 missing
    Push(fast, step);
  }
  // Step k+1 would miss k+1 steps: held until rank 1's step 0 is in.
  EXPECT_EQ(ParkedThenReleased(*shard_, fast, kStaleness + 1, [&] { Push(slow, 0); }),
            kStaleness);
  EXPECT_EQ(LookupStaleness(slow, 1), 0);
}

// Async: nothing waits; rank 0's rows miss every push rank 1 has not made.
TEST_P(LookupStalenessTest, AsyncLookupsSeeHowFarTheSlowestWorkerLags) {
  Start(ConsistencyMode::kAsync);
  client::EmbeddingClient& fast = *clients_[0];
  client::EmbeddingClient& slow = *clients_[1];
  for (int64_t step = 0; step < 5; ++step) Push(fast, step);
  EXPECT_EQ(LookupStaleness(fast, 5), 5);  // rank 1 pushed nothing
  EXPECT_EQ(ParkedLookups(*shard_), 0);
  for (int64_t step = 0; step < 3; ++step) Push(slow, step);
  EXPECT_EQ(LookupStaleness(fast, 5), 2);  // rank 1's steps 3 and 4 missing
  EXPECT_EQ(LookupStaleness(slow, 3), 0);  // everything before step 3 is in
}

INSTANTIATE_TEST_SUITE_P(GrpcAndInProcess, LookupStalenessTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "InProcess" : "Grpc";
                         });

}  // namespace
}  // namespace recps::server
