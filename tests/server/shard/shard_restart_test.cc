// A shard server restarted on the same port (a new process, its rows gone)
// is reported to the embedding client as DATA_LOSS naming the server and
// both incarnations, at once (docs/shard-server.md, Incarnation), through
// real recps-shard processes. In sync mode the restarted server's fresh
// step clock never reaches the job's step: before the request named its
// incarnation, a lookup waited there until a timeout (DEADLINE_EXCEEDED
// after 60 s) and a push was refused as "ahead of the sync window"; a
// server without a map yet answered UNAVAILABLE until retries ran out.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/embedding_client.h"
#include "gtest/gtest.h"
#include "tests/server/shard/shard_stats.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

using client::EmbeddingClient;
using testing::LocalShard;
using testing::StatsOf;
using testing::TempDir;

constexpr uint32_t kSlots = 64;
constexpr int kDim = 8;
// Well below the shard's step timeout and the client's RPC timeout: the
// report must not wait for either.
constexpr absl::Duration kPrompt = absl::Seconds(5);

constexpr char kTables[] = R"(
tables {
  name: "user"
  dim: 8
  optimizer { kind: SGD learning_rate: 0.1 }
}
)";

std::vector<std::string> ShardArgs(const TempDir& dir) {
  return {"--tables=" + dir.WriteFile("tables.textproto", kTables),
          "--consistency=sync", "--world_size=1", "--step_timeout=30s",
          "--max_rows_per_table=10000", "--threads=2", "--store_threads=1"};
}

client::EmbeddingClientOptions Options() {
  client::EmbeddingClientOptions options;
  // Short enough that the test fails in reasonable time where the client
  // waits for a timeout instead of reporting the restart.
  options.rpc_timeout = absl::Seconds(15);
  options.max_backoff = absl::Milliseconds(200);
  return options;
}

// Trains steps [0, steps) in sync mode: a lookup and a push each.
void Train(EmbeddingClient& client, int64_t steps) {
  std::vector<int64_t> ids = {1, 2, 3, 40, 41};
  std::vector<float> rows(ids.size() * kDim), grads(ids.size() * kDim, 0.5f);
  for (int64_t step = 0; step < steps; ++step) {
    ASSERT_TRUE(client.Lookup(step, {{{0, ids, rows.data()}}}).ok()) << step;
    ASSERT_TRUE(client.PushGradients(step, {{{0, ids, grads.data()}}}).ok()) << step;
  }
}

uint64_t IncarnationOf(const std::string& address) {
  absl::StatusOr<v1::StatsResponse> stats = StatsOf(address);
  EXPECT_TRUE(stats.ok()) << stats.status();
  return stats.ok() ? stats->incarnation() : 0;
}

void ExpectNamesTheRestart(const absl::Status& s, const std::string& address,
                           uint64_t before, uint64_t after) {
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  for (const std::string& part :
       {address, absl::StrCat(absl::Hex(before, absl::kZeroPad16)),
        absl::StrCat(absl::Hex(after, absl::kZeroPad16)), std::string("restarted"),
        std::string("lost"), std::string("checkpoint")}) {
    EXPECT_NE(s.message().find(part), absl::string_view::npos) << part << ": " << s;
  }
}

struct Restarted {
  std::unique_ptr<LocalShard> shard;
  std::string address;
  uint64_t before = 0;
  uint64_t after = 0;
};

// Kills `shard` (a crash) and starts a fresh process with `args` on the
// same port.
Restarted Restart(std::unique_ptr<LocalShard> shard, std::vector<std::string> args) {
  Restarted r;
  r.address = shard->address();
  r.before = IncarnationOf(r.address);
  shard->Kill();
  args.push_back("--listen=" + r.address);
  absl::StatusOr<std::unique_ptr<LocalShard>> again =
      LocalShard::Start(RECPS_SHARD_BINARY, args);
  EXPECT_TRUE(again.ok()) << again.status();
  if (!again.ok()) return r;
  r.shard = *std::move(again);
  r.after = IncarnationOf(r.address);
  EXPECT_NE(r.before, 0u);
  EXPECT_NE(r.after, 0u);
  EXPECT_NE(r.after, r.before);
  return r;
}

// A standalone server (the restarted process has its map at once) and a
// client that trained `steps` steps on it before it was killed and
// restarted on the same port.
struct TrainedThenRestarted {
  TempDir dir;
  std::unique_ptr<EmbeddingClient> client;
  Restarted r;
  std::string address;
};
void TrainThenRestart(int64_t steps, TrainedThenRestarted* t) {
  std::vector<std::string> args = ShardArgs(t->dir);
  args.push_back("--standalone");
  auto shard = LocalShard::Start(RECPS_SHARD_BINARY, args);
  ASSERT_TRUE(shard.ok()) << shard.status();
  t->address = (*shard)->address();
  auto client = EmbeddingClient::Create(
      {{"user", kDim}}, client::MakeServerShardMapSource({t->address}), Options());
  ASSERT_TRUE(client.ok()) << client.status();
  t->client = *std::move(client);
  Train(*t->client, steps);
  t->r = Restart(*std::move(shard), args);
  ASSERT_NE(t->r.shard, nullptr);
}

TEST(ShardRestart, SyncLookupAfterARestartIsDataLossAtOnce) {
  TrainedThenRestarted t;
  ASSERT_NO_FATAL_FAILURE(TrainThenRestart(3, &t));
  // Step 3 waits for step 2, which the fresh clock never applies.
  std::vector<int64_t> ids = {1, 2, 3};
  std::vector<float> rows(ids.size() * kDim), grads(ids.size() * kDim, 0.5f);
  const absl::Time start = absl::Now();
  const absl::Status s = t.client->Lookup(3, {{{0, ids, rows.data()}}});
  EXPECT_LT(absl::Now() - start, kPrompt) << s;
  ExpectNamesTheRestart(s, t.address, t.r.before, t.r.after);
  // Every later call fails the same way, pushes included, without asking.
  const absl::Status push = t.client->PushGradients(3, {{{0, ids, grads.data()}}});
  EXPECT_EQ(push.code(), absl::StatusCode::kDataLoss) << push;
  // A new client (the job restored from a checkpoint) works with it.
  auto fresh = EmbeddingClient::Create(
      {{"user", kDim}}, client::MakeServerShardMapSource({t.address}), Options());
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE((*fresh)->Lookup(0, {{{0, ids, rows.data()}}}).ok());
}

TEST(ShardRestart, SyncPushAfterARestartIsDataLossNotAheadOfTheWindow) {
  TrainedThenRestarted t;
  ASSERT_NO_FATAL_FAILURE(TrainThenRestart(3, &t));
  // A worker whose lookup of step 3 was answered before the crash pushes
  // step 3 next: the fresh clock would refuse it as ahead of its window.
  std::vector<int64_t> ids = {1, 2, 3};
  std::vector<float> grads(ids.size() * kDim, 0.5f);
  const absl::Time start = absl::Now();
  const absl::Status s = t.client->PushGradients(3, {{{0, ids, grads.data()}}});
  EXPECT_LT(absl::Now() - start, kPrompt) << s;
  ExpectNamesTheRestart(s, t.address, t.r.before, t.r.after);
}

TEST(ShardRestart, RestartedServerWithoutAMapYetIsDataLossAtOnce) {
  TempDir dir;
  // A cluster server: the restarted process waits for the coordinator's
  // map and answers UNAVAILABLE until then, which clients retry.
  auto cluster = testing::StartShardCluster(RECPS_SHARD_BINARY, ShardArgs(dir), 1, kSlots);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string address = (*cluster)[0]->address();
  client::EmbeddingClientOptions options = Options();
  options.max_attempts = 50;  // 50 rounds of UNAVAILABLE: about 10 s
  auto client = EmbeddingClient::Create(
      {{"user", kDim}}, client::MakeServerShardMapSource({address}), options);
  ASSERT_TRUE(client.ok()) << client.status();
  Train(**client, 2);

  std::vector<std::string> args = ShardArgs(dir);
  args.push_back(absl::StrCat("--num_slots=", kSlots));
  Restarted r = Restart(std::move((*cluster)[0]), args);
  ASSERT_NE(r.shard, nullptr);
  std::vector<int64_t> ids = {1, 2, 3};
  std::vector<float> rows(ids.size() * kDim);
  const absl::Time start = absl::Now();
  const absl::Status s = (*client)->Lookup(2, {{{0, ids, rows.data()}}});
  EXPECT_LT(absl::Now() - start, kPrompt) << s;
  ExpectNamesTheRestart(s, address, r.before, r.after);
}

// A server restarted at its address after a map that gives it nothing
// (a failover of a replicated map does that) is no loss to a client that
// still routes by the older map: the request is refused as stale first,
// the client takes the new map and forgets the old process. Before, the
// old incarnation was checked first and a retry in flight when the server
// came back failed the job with DATA_LOSS.
TEST(ShardRestart, ARequestRoutedByAnOlderMapToARestartedServerIsStaleNotDataLoss) {
  TempDir dir;
  auto cluster = testing::StartShardCluster(RECPS_SHARD_BINARY, ShardArgs(dir), 2, kSlots);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string lost = (*cluster)[0]->address();
  const std::string kept = (*cluster)[1]->address();
  auto client = EmbeddingClient::Create(
      {{"user", kDim}}, client::MakeServerShardMapSource({lost, kept}), Options());
  ASSERT_TRUE(client.ok()) << client.status();
  Train(**client, 2);
  std::vector<std::string> args = ShardArgs(dir);
  args.push_back(absl::StrCat("--num_slots=", kSlots));
  Restarted r = Restart(std::move((*cluster)[0]), args);
  ASSERT_NE(r.shard, nullptr);
  // Epoch 2: every slot on the kept server, the restarted one listed.
  v1::ShardMap next;
  next.set_epoch(2);
  next.set_num_slots(kSlots);
  next.add_servers(lost);
  next.add_servers(kept);
  for (uint32_t slot = 0; slot < kSlots; ++slot) next.add_slot_owner(1);
  for (const std::string& address : {lost, kept}) {
    v1::SetShardMapRequest request;
    *request.mutable_shard_map() = next;
    request.set_self(address);
    v1::SetShardMapResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status set = v1::ShardAdmin::NewStub(rpc::MakeChannel(
                                 address, rpc::ChannelKind::kControl))
                                 ->SetShardMap(&context, request, &response);
    ASSERT_TRUE(set.ok()) << address << ": " << set.error_message();
  }
  std::vector<int64_t> ids = {1, 2, 3, 40, 41};
  std::vector<float> rows(ids.size() * kDim);
  const absl::Status s = (*client)->Lookup(2, {{{0, ids, rows.data()}}});
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ((*client)->shard_map_epoch(), 2u);
}

}  // namespace
}  // namespace recps
