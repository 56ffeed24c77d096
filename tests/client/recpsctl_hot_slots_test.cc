// Load-aware rebalancing through real processes: a coordinator, two
// recps-shard servers with even rows, and an embedding client whose lookups
// go mostly to two slots of the first server (skewed ids). The servers count
// ids per slot (ShardAdmin.Stats: lookup_ids_per_second), so `recpsctl
// rebalance` sees the first server as the hot one and plans to move a hot
// slot to the other; with no per-slot rates it saw two even servers.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/coordinator_client.h"
#include "client/embedding_client.h"
#include "common/hashing.h"
#include "common/wire/shard_map.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "recps/v1/coordinator.pb.h"
#include "tests/testing/files.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

using testing::LocalShard;
using testing::TempDir;

constexpr uint32_t kSlots = 16;
constexpr int kDim = 8;

std::string RebalanceJson(const TempDir& dir, const std::string& coordinator) {
  const std::string out = dir.path() + "/plan.json";
  const std::string command = absl::StrCat(RECPSCTL_BINARY, " rebalance --json --insecure",
                                           " --coordinator=", coordinator, " >", out);
  absl::StatusOr<int> code = testing::RunProcess("/bin/sh", {"-c", command}, absl::Seconds(60));
  EXPECT_TRUE(code.ok() && *code == 0) << (code.ok() ? absl::StrCat("exit ", *code)
                                                      : code.status().ToString());
  return testing::ReadAll(out);
}

TEST(RecpsctlHotSlots, AHotSlotMovesByItsLoad) {
  TempDir dir;
  auto coordinator = LocalShard::Start(
      RECPS_COORDINATOR_BINARY, {"--state_dir=" + dir.path() + "/state", "--num_shards=2",
                                 "--num_slots=" + std::to_string(kSlots), "--lease=3s",
                                 "--tick=20ms"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string tables = dir.WriteFile(
      "tables.textproto",
      "tables { name: \"user\" dim: 8 optimizer { kind: SGD learning_rate: 0.1 } }\n");
  std::vector<std::unique_ptr<LocalShard>> shards;
  for (int i = 0; i < 2; ++i) {
    auto shard = LocalShard::Start(
        RECPS_SHARD_BINARY, {"--tables=" + tables, "--num_slots=" + std::to_string(kSlots),
                             "--threads=1", "--consistency=async",
                             "--coordinator=" + (*coordinator)->address()});
    ASSERT_TRUE(shard.ok()) << shard.status();
    shards.push_back(*std::move(shard));
  }
  client::CoordinatorClient coord((*coordinator)->address());
  absl::StatusOr<v1::ShardMap> proto;
  ASSERT_TRUE(testing::Eventually([&] { return (proto = coord.GetShardMap()).ok(); }));
  absl::StatusOr<ShardMap> map = ShardMap::FromProto(*proto);
  ASSERT_TRUE(map.ok()) << map.status();
  std::vector<std::string> servers = map->servers();
  auto embedding = client::EmbeddingClient::Create(
      {{"user", kDim}}, client::MakeServerShardMapSource(servers),
      client::EmbeddingClientOptions());
  ASSERT_TRUE(embedding.ok()) << embedding.status();

  // Rows in every slot, evenly: the servers hold about the same bytes.
  std::vector<int64_t> all(4000);
  for (int64_t i = 0; i < 4000; ++i) all[i] = i;
  std::vector<float> rows(all.size() * kDim);
  client::LookupSpec fill{0, all, rows.data()};
  ASSERT_TRUE((*embedding)->Lookup(0, {&fill, 1}).ok());
  // Skewed traffic: ids of two slots of the first server, again and again.
  const uint64_t key = StableNameKey("user");
  const std::vector<uint32_t> first_slots = map->SlotsOf(0);
  ASSERT_GE(first_slots.size(), 2u);
  const uint32_t hot[] = {first_slots[0], first_slots[1]};
  std::vector<int64_t> hot_ids;
  for (int64_t id : all) {
    const uint32_t slot = SlotOf(key, id, kSlots);
    if (slot == hot[0] || slot == hot[1]) hot_ids.push_back(id);
  }
  client::LookupSpec spec{0, hot_ids, rows.data()};
  for (int i = 0; i < 100; ++i) ASSERT_TRUE((*embedding)->Lookup(0, {&spec, 1}).ok());

  v1::RebalancePlan plan;
  const std::string json = RebalanceJson(dir, (*coordinator)->address());
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &plan).ok()) << json;
  ASSERT_EQ(plan.servers_before_size(), 2);
  const int first = plan.servers_before(0).address() == servers[0] ? 0 : 1;
  const double hot_load = plan.servers_before(first).load();
  const double cold_load = plan.servers_before(1 - first).load();
  EXPECT_GT(hot_load, 10 * cold_load) << json;
  EXPECT_GT(hot_load, 0) << json;
  // A hot slot leaves the hot server (the planner may send a cold one
  // back to keep the bytes even).
  bool moved_hot = false;
  for (const v1::SlotMove& m : plan.moves()) {
    if (m.source() != servers[0]) continue;
    for (uint32_t slot : m.slots()) moved_hot |= slot == hot[0] || slot == hot[1];
  }
  EXPECT_TRUE(moved_hot) << "no hot slot moves: " << json;
  EXPECT_LT(plan.after().load(), plan.before().load()) << json;
}

}  // namespace
}  // namespace recps
