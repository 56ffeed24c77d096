// A worker's embedding client following the coordinator's shard map
// (ShardMapWatcher -> EmbeddingClient::OfferShardMap): against an in-process
// coordinator whose epoch is bumped, and fake shard servers that record
// whether a request was ever refused as stale.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/coordinator_client.h"
#include "client/embedding_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/fake_shard_server.h"
#include "tests/testing/in_process_coordinator.h"
#include "tests/testing/local_shard.h"

namespace recps::client {
namespace {

using ::recps::client::testing::FakeRowValue;
using ::recps::client::testing::FakeShardServer;
using ::recps::testing::InProcessCoordinator;
using ::recps::testing::TempDir;

constexpr uint32_t kSlots = 64;

using ::recps::testing::Eventually;

// `base` at `epoch` with every slot owned by server index `owner`.
ShardMap AllTo(const v1::ShardMap& base, uint64_t epoch, uint32_t owner) {
  v1::ShardMap p = base;
  p.set_epoch(epoch);
  for (int s = 0; s < p.slot_owner_size(); ++s) p.set_slot_owner(s, owner);
  return *ShardMap::FromProto(p);
}

TEST(ShardMapWatch, ANewEpochReachesTheClientBeforeAnyServerRefuses) {
  TempDir dir;
  const std::string state = dir.path() + "/state";
  std::vector<std::unique_ptr<FakeShardServer>> servers;
  server::CoordinatorOptions options;
  options.num_shards = 2;
  options.num_slots = kSlots;
  auto coordinator = InProcessCoordinator::Start(state, 0, options);
  ASSERT_NE(coordinator, nullptr);
  for (int i = 0; i < 2; ++i) {
    servers.push_back(std::make_unique<FakeShardServer>(
        std::map<std::string, int>{{"user", 8}}));
    v1::RegisterRequest r;
    r.set_role(v1::SHARD_SERVER);
    r.set_address(servers.back()->address());
    ASSERT_TRUE(coordinator->coordinator().Register(r).ok());
  }
  absl::StatusOr<v1::ShardMap> first = coordinator->coordinator().GetShardMap();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->epoch(), 1u);
  for (auto& s : servers) s->SetMap(*ShardMap::FromProto(*first));

  CoordinatorClient members(coordinator->address());
  EmbeddingClientOptions client_options;
  client_options.rpc_timeout = absl::Seconds(10);
  auto client = EmbeddingClient::Create(
      {{"user", 8}}, MakeCoordinatorShardMapSource(&members), client_options);
  ASSERT_TRUE(client.ok()) << client.status();
  EmbeddingClient* c = client->get();
  std::atomic<int> refused{0};
  ShardMapWatcher watcher(&members, c->shard_map_epoch(), [&](ShardMap map) {
    if (!c->OfferShardMap(std::move(map)).ok()) ++refused;
  });

  // Epoch 2 gives every slot to server 1; the servers know it first (as
  // the coordinator pushes it to them), then the coordinator publishes it.
  const ShardMap second = AllTo(*first, 2, 1);
  for (auto& s : servers) s->SetMap(second);
  ASSERT_TRUE(coordinator->coordinator().SetShardMap(second.ToProto()).ok());
  ASSERT_TRUE(Eventually([&] { return c->shard_map_epoch() == 2; }));
  const std::vector<int64_t> ids = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> rows(ids.size() * 8);
  ASSERT_TRUE(c->Lookup(0, {{{0, ids, rows.data()}}}).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(rows[i * 8 + 2], FakeRowValue("user", ids[i], 2));
  }
  // Routed by epoch 2 from the start: nothing went to server 0, nothing was
  // refused as stale.
  const ShardMap& routed = second;
  const int owner = routed.IndexOf(servers[1]->address());
  const int other = 1 - owner;
  EXPECT_TRUE(servers[other]->received().empty());
  for (const auto& r : servers[owner]->received()) {
    EXPECT_EQ(r.answer, grpc::StatusCode::OK);
    EXPECT_EQ(r.header.shard_map_epoch(), 2u);
  }

  // A coordinator restart (same port and state) ends the stream; the
  // watcher re-opens it and follows epoch 3.
  const int port = coordinator->port();
  coordinator.reset();
  coordinator = InProcessCoordinator::Start(state, port, options);
  ASSERT_NE(coordinator, nullptr);
  const ShardMap third = AllTo(*first, 3, 0);
  for (auto& s : servers) s->SetMap(third);
  ASSERT_TRUE(coordinator->coordinator().SetShardMap(third.ToProto()).ok());
  ASSERT_TRUE(Eventually([&] { return c->shard_map_epoch() == 3; }));
  EXPECT_EQ(watcher.epoch(), 3u);
  EXPECT_EQ(refused, 0);
  // An older epoch offered late is ignored.
  EXPECT_TRUE(c->OfferShardMap(second).ok());
  EXPECT_EQ(c->shard_map_epoch(), 3u);
}

TEST(ShardMapWatch, TheCoordinatorRefusesMapsThatAreNotNewer) {
  TempDir dir;
  server::CoordinatorOptions options;
  options.num_shards = 1;
  options.num_slots = kSlots;
  auto coordinator = InProcessCoordinator::Start(dir.path() + "/state", 0, options);
  ASSERT_NE(coordinator, nullptr);
  server::Coordinator& c = coordinator->coordinator();
  const ShardMap map = ShardMap::Uniform(2, kSlots, {"a:1"});
  EXPECT_EQ(c.SetShardMap(map.ToProto()).code(),
            absl::StatusCode::kFailedPrecondition);  // no first map yet
  v1::RegisterRequest r;
  r.set_role(v1::SHARD_SERVER);
  r.set_address("a:1");
  ASSERT_TRUE(c.Register(r).ok());
  EXPECT_EQ(c.SetShardMap(ShardMap::Uniform(1, kSlots, {"a:1"}).ToProto()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.SetShardMap(ShardMap::Uniform(2, 32, {"a:1"}).ToProto()).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(c.SetShardMap(map.ToProto()).ok());
  EXPECT_EQ(c.shard_map_epoch(), 2u);
}

}  // namespace
}  // namespace recps::client
