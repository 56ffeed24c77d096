// Slot moves between real recps-shard processes (127.0.0.1, OS-picked
// ports): MigrateIn on the target, HandOver on the source, AbortMove,
// ListMoves, while clients train through the embedding client library.
// Push parts are in push_parts_test.cc.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "client/embedding_client.h"
#include "common/hashing.h"
#include "common/rpc/channels.h"
#include "common/wire/shard_map.h"
#include "common/wire/wire_format.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "recps/v1/shard.grpc.pb.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "tests/server/shard/migration_cluster.h"
#include "tests/server/shard/shard_stats.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

using client::EmbeddingClient;
using client::LookupSpec;
using client::PushSpec;
using testing::Eventually;
using testing::In;
using testing::LocalShard;
using testing::StatsOf;
using testing::TempDir;
using testing::AbortMove;
using testing::ShardAdminStub;
using testing::Cluster;
using testing::EpochOf;
using testing::HandOver;
using testing::kDim;
using testing::kSlots;
using testing::ListMoves;
using testing::MigrateIn;
using testing::Moved;
using testing::SlotsOf;
using testing::TotalRows;
using testing::UpdateIds;

std::vector<int64_t> UserIds(int step, int rank) {
  std::vector<int64_t> ids;
  for (int i = 0; i < 40; ++i) {
    ids.push_back(static_cast<int64_t>(Mix64(step * 131 + rank * 17 + i) % 97) - 48 +
                  (i % 3 == 0 ? (int64_t{1} << 40) : 0));
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}
std::vector<int64_t> ItemIds(int step, int rank) {
  std::vector<int64_t> ids;
  for (int i = 0; i < 25; ++i) ids.push_back((step * 7 + rank * 3 + i * 11) % 1000);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// One step of the toy job for `rank`: look up, push a gradient computed
// from the rows seen. Returns the gradient rows pushed.
int64_t Step(EmbeddingClient& client, int rank, int step) {
  std::vector<int64_t> users = UserIds(step, rank), items = ItemIds(step, rank);
  std::vector<float> u(users.size() * kDim), it(items.size() * kDim);
  absl::Status s = client.Lookup(step, {{{0, users, u.data()}, {1, items, it.data()}}});
  EXPECT_TRUE(s.ok()) << s;
  if (!s.ok()) return 0;
  for (float& v : u) v = v * 0.5f + 0.01f * (rank + 1);
  for (float& v : it) v = v * -0.25f + 0.02f;
  s = client.PushGradients(step, {{{0, users, u.data()}, {1, items, it.data()}}});
  EXPECT_TRUE(s.ok()) << s;
  return s.ok() ? static_cast<int64_t>(users.size() + items.size()) : 0;
}

std::vector<float> ReadAll(EmbeddingClient& client, int world, int steps) {
  std::vector<int64_t> users, items;
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < world; ++r) {
      for (int64_t id : UserIds(s, r)) users.push_back(id);
      for (int64_t id : ItemIds(s, r)) items.push_back(id);
    }
  }
  std::sort(users.begin(), users.end());
  users.erase(std::unique(users.begin(), users.end()), users.end());
  std::sort(items.begin(), items.end());
  items.erase(std::unique(items.begin(), items.end()), items.end());
  std::vector<float> out((users.size() + items.size()) * kDim);
  const absl::Status s = client.Lookup(
      steps, {{{0, users, out.data()}, {1, items, out.data() + users.size() * kDim}}});
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// Trains `steps` sync steps with `world` workers on `servers` servers.
// With `move`: worker 1 waits before step 8 until a third of server 0's
// slots were copied to server 1 (so the copy sees steps 0-7), then the
// hand-over runs while both train on: it must carry the rows changed since.
std::vector<float> RunSync(int servers, int world, int steps, bool move) {
  Cluster cluster(servers, world, "sync");
  std::vector<std::unique_ptr<EmbeddingClient>> clients;
  for (int r = 0; r < world; ++r) clients.push_back(cluster.NewClient(r));
  absl::Notification copied;
  constexpr int kGate = 8;
  std::vector<std::thread> workers;
  for (int r = 0; r < world; ++r) {
    workers.emplace_back([&, r] {
      for (int s = 0; s < steps; ++s) {
        if (move && r == 1 && s == kGate) copied.WaitForNotification();
        Step(*clients[r], r, s);
      }
    });
  }
  if (move) {
    EXPECT_TRUE(Eventually([&] {
      absl::StatusOr<v1::StatsResponse> st = StatsOf(cluster.address(0));
      return st.ok() && st->applied_step() >= kGate - 1;
    }));
    const std::vector<uint32_t> slots = SlotsOf(cluster.map(), 0, 3);
    v1::MigrateInRequest in;
    in.set_move_id("m1");
    in.set_source(cluster.address(0));
    for (uint32_t s : slots) in.add_slots(s);
    in.set_epoch(1);
    v1::MigrateInResponse copy;
    const grpc::Status c = MigrateIn(cluster.address(1), in, &copy);
    EXPECT_TRUE(c.ok()) << c.error_message();
    EXPECT_GT(copy.rows(), 0);
    copied.Notify();
    v1::HandOverRequest over;
    over.set_move_id("m1");
    over.set_target(cluster.address(1));
    *over.mutable_new_map() = Moved(cluster.map(), slots, 1, 2);
    v1::HandOverResponse handed;
    const grpc::Status h = HandOver(cluster.address(0), over, &handed);
    EXPECT_TRUE(h.ok()) << h.error_message();
    // Worker 0 was parked at step kGate + 1 when the hold began, so steps
    // kGate and kGate + 1 were applied after the copy: the hand-over sent
    // what they changed.
    EXPECT_GT(handed.delta_rows(), 0);
    EXPECT_EQ(EpochOf(cluster.address(0)), 2u);
    EXPECT_EQ(EpochOf(cluster.address(1)), 2u);
  }
  for (auto& w : workers) w.join();
  return ReadAll(*clients[0], world, steps);
}

TEST(SlotMigration, SyncMoveDuringTrainingEndsBitIdenticalToNoMove) {
  const std::vector<float> still = RunSync(1, 2, 16, false);
  const std::vector<float> moved = RunSync(2, 2, 16, true);
  ASSERT_EQ(still.size(), moved.size());
  EXPECT_EQ(0, std::memcmp(still.data(), moved.data(), still.size() * sizeof(float)));
}

// Scale out and drain while a sync job trains (the late-join bug): a third
// server started mid-run is listed owning nothing (as the coordinator's
// orchestrator does before a move), gets a third of server 0's slots, then
// some of server 1's, then is drained again and stopped. Its step clock
// starts at -1: before the fix every worker pushed (empty) to it once a map
// listed it and it refused the step as ahead of its window. The workers
// train on while the first two moves hand over (live steps: ranks route a
// step by different maps), wait together at step 24 for the drain and the
// stop (a gate of one rank alone could hold a step a hand-over waits for),
// and the tables end bit-identical to a run on one server.
std::vector<float> RunLateJoin(int world, int steps,
                               const std::string& consistency = "sync",
                               std::vector<std::string> extra = {}) {
  Cluster cluster(2, world, consistency, extra);
  std::vector<std::unique_ptr<EmbeddingClient>> clients;
  for (int r = 0; r < world; ++r) clients.push_back(cluster.NewClient(r));
  absl::Notification copied, drained;
  constexpr int kGate = 8;
  // Steps each worker began and ended (see the drain below).
  std::vector<std::atomic<int>> began(world), ended(world);
  std::vector<std::thread> workers;
  for (int r = 0; r < world; ++r) {
    workers.emplace_back([&, r] {
      for (int s = 0; s < steps; ++s) {
        if (r == 1 && s == kGate) copied.WaitForNotification();
        if (s == 3 * kGate) drained.WaitForNotification();
        ++began[r];
        Step(*clients[r], r, s);
        ++ended[r];
      }
    });
  }
  EXPECT_TRUE(Eventually([&] {
    absl::StatusOr<v1::StatsResponse> st = StatsOf(cluster.address(0));
    return st.ok() && st->applied_step() >= kGate - 1;
  }));
  const int late = cluster.AddServer();
  EXPECT_EQ(late, 2);
  if (late != 2) {
    copied.Notify();
    drained.Notify();
    for (auto& w : workers) w.join();
    return {};
  }
  // Epoch 2 lists the new server, owning nothing.
  v1::ShardMap map = cluster.map();
  map.set_epoch(2);
  map.add_servers(cluster.address(late));
  for (int i = 0; i < 3; ++i) cluster.Install(i, map);
  // Server 0 -> the new one (whose clock joins at the source's step).
  const std::vector<uint32_t> from0 = SlotsOf(map, 0, 3);
  v1::MigrateInRequest in;
  in.set_move_id("late1");
  in.set_source(cluster.address(0));
  for (uint32_t s : from0) in.add_slots(s);
  in.set_epoch(2);
  grpc::Status st = MigrateIn(cluster.address(late), in);
  EXPECT_TRUE(st.ok()) << st.error_message();
  copied.Notify();
  v1::HandOverRequest over;
  over.set_move_id("late1");
  over.set_target(cluster.address(late));
  *over.mutable_new_map() = Moved(map, from0, late, 3);
  st = HandOver(cluster.address(0), over);
  EXPECT_TRUE(st.ok()) << st.error_message();
  map = over.new_map();
  cluster.Install(1, map);
  absl::StatusOr<v1::StatsResponse> joined = StatsOf(cluster.address(late));
  if (consistency != "async") {
    EXPECT_TRUE(joined.ok() && joined->applied_step() >= kGate - 1)
        << "the new server's clock did not join at the source's step";
  }
  // Server 1 -> the new one, which now owns slots (an ordinary move).
  map = cluster.Move("late2", map, 1, late, SlotsOf(map, 1, 3));
  cluster.Install(0, map);
  // Drain it again: it owns nothing, the workers stop pushing to it, and
  // once stopped training goes on without it.
  map = cluster.Move("late3", map, late, 0, SlotsOf(map, late, 1));
  cluster.Install(1, map);
  EXPECT_TRUE(ShardMap::FromProto(map).ok() &&
              !ShardMap::FromProto(map)->OwnsAnything(late));
  // Before the drained server stops, every client routes by the map that
  // leaves it out (as the coordinator's map watcher would tell them) and
  // every step begun by an older map has ended: in async mode a worker runs
  // ahead, and a push still on its way to the server when it stops was
  // cancelled by its shutdown (CI, once).
  for (auto& c : clients) {
    absl::StatusOr<ShardMap> final_map = ShardMap::FromProto(map);
    EXPECT_TRUE(final_map.ok() && c->OfferShardMap(*std::move(final_map)).ok());
  }
  std::vector<int> in_flight(world);
  for (int r = 0; r < world; ++r) in_flight[r] = began[r].load();
  EXPECT_TRUE(Eventually([&] {
    for (int r = 0; r < world; ++r) {
      if (ended[r].load() < in_flight[r]) return false;
    }
    return true;
  }));
  absl::StatusOr<int> stopped = cluster.shard(late).Terminate();
  EXPECT_TRUE(stopped.ok()) << stopped.status();
  drained.Notify();
  for (auto& w : workers) w.join();
  return ReadAll(*clients[0], world, steps);
}

TEST(LateJoin, ServerStartedMidRunTakesSlotsAndIsDrainedBitIdentical) {
  const std::vector<float> still = RunSync(1, 2, 40, false);
  const std::vector<float> joined = RunLateJoin(2, 40);
  ASSERT_EQ(still.size(), joined.size());
  EXPECT_EQ(0, std::memcmp(still.data(), joined.data(), still.size() * sizeof(float)));
}

// Bounded and async: not bit-exact runs, but every lookup and push of the
// workers succeeds (Step checks) through the join, the move and the drain.
TEST(LateJoin, BoundedAndAsyncJobsScaleOutAndDrainWithoutErrors) {
  EXPECT_FALSE(RunLateJoin(2, 40, "bounded", {"--staleness=2"}).empty());
  EXPECT_FALSE(RunLateJoin(2, 40, "async").empty());
}

TEST(SlotMigration, MovedRowsLiveOnlyOnTheTargetAfterwards) {
  Cluster cluster(2, 1, "sync");
  auto client = cluster.NewClient(0);
  for (int s = 0; s < 4; ++s) Step(*client, 0, s);
  const int64_t rows_before = TotalRows(cluster.address(0)) + TotalRows(cluster.address(1));
  const std::vector<uint32_t> slots = SlotsOf(cluster.map(), 0, 1);  // all of 0's
  cluster.Move("all", cluster.map(), 0, 1, slots);
  EXPECT_EQ(TotalRows(cluster.address(0)), 0);
  EXPECT_EQ(TotalRows(cluster.address(1)), rows_before);
  const std::vector<v1::MoveState> src = ListMoves(cluster.address(0));
  const std::vector<v1::MoveState> dst = ListMoves(cluster.address(1));
  ASSERT_EQ(src.size(), 1u);
  ASSERT_EQ(dst.size(), 1u);
  EXPECT_EQ(src[0].phase(), v1::MoveState::HANDED_OVER);
  EXPECT_EQ(src[0].role(), "source");
  EXPECT_EQ(dst[0].phase(), v1::MoveState::HANDED_OVER);
  EXPECT_EQ(dst[0].role(), "target");
  EXPECT_GT(dst[0].rows(), 0);
  // Training goes on against the target (the client re-routes).
  for (int s = 4; s < 6; ++s) Step(*client, 0, s);
  EXPECT_EQ(TotalRows(cluster.address(0)), 0);
  // Per-slot bytes (what a plan moves) add up to the server's row bytes.
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(10)));
  v1::StatsRequest with_slots;
  with_slots.set_include_slots(true);
  v1::StatsResponse stats;
  ASSERT_TRUE(ShardAdminStub(cluster.address(1))->Stats(&ctx, with_slots, &stats).ok());
  int64_t slot_bytes = 0;
  for (const auto& slot : stats.slots()) slot_bytes += slot.bytes();
  EXPECT_GT(slot_bytes, 0);
  EXPECT_EQ(slot_bytes, stats.row_bytes());
}

TEST(SlotMigration, AsyncMovesLoseNoPushAndApplyNoneTwice) {
  Cluster cluster(2, 2, "async");
  std::vector<std::unique_ptr<EmbeddingClient>> clients;
  for (int r = 0; r < 2; ++r) clients.push_back(cluster.NewClient(r));
  std::atomic<bool> stop{false};
  std::atomic<int64_t> pushed{0};
  std::atomic<int> steps_done{0};
  std::vector<std::thread> workers;
  for (int r = 0; r < 2; ++r) {
    workers.emplace_back([&, r] {
      for (int s = 0; !stop.load(); ++s) {
        pushed += Step(*clients[r], r, s);
        ++steps_done;
      }
    });
  }
  ASSERT_TRUE(Eventually([&] { return steps_done.load() >= 10; }));
  v1::ShardMap map = cluster.map();
  const std::vector<uint32_t> a = SlotsOf(map, 0, 2);
  map = cluster.Move("a1", map, 0, 1, a);
  int at = steps_done.load();
  ASSERT_TRUE(Eventually([&] { return steps_done.load() >= at + 6; }));
  map = cluster.Move("a2", map, 1, 0, a);  // and back
  at = steps_done.load();
  ASSERT_TRUE(Eventually([&] { return steps_done.load() >= at + 6; }));
  const std::vector<uint32_t> b = SlotsOf(map, 1, 3);
  map = cluster.Move("a3", map, 1, 0, b);
  at = steps_done.load();
  ASSERT_TRUE(Eventually([&] { return steps_done.load() >= at + 6; }));
  stop = true;
  for (auto& w : workers) w.join();
  EXPECT_EQ(UpdateIds(cluster.address(0)) + UpdateIds(cluster.address(1)),
            pushed.load());
}

TEST(SlotMigration, TargetKilledMidCopyLeavesTheSourceOwningAndServing) {
  Cluster cluster(2, 1, "sync");
  auto client = cluster.NewClient(0);
  // Enough rows that a copy at 64 KiB/s takes seconds.
  std::vector<int64_t> ids(20000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i) * 7919;
  std::vector<float> rows(ids.size() * kDim);
  ASSERT_TRUE(client->Lookup(0, {{{0, ids, rows.data()}}}).ok());
  // Step 0 done: a hand-over waits for the steps whose lookups were served.
  for (float& v : rows) v = 0.001f;
  ASSERT_TRUE(client->PushGradients(0, {{{0, ids, rows.data()}}}).ok());
  const int64_t rows0 = TotalRows(cluster.address(0));
  const std::vector<uint32_t> slots = SlotsOf(cluster.map(), 0, 1);
  v1::MigrateInRequest in;
  in.set_move_id("slow");
  in.set_source(cluster.address(0));
  for (uint32_t s : slots) in.add_slots(s);
  in.set_max_bytes_per_second(64 << 10);
  grpc::Status copy_status;
  std::thread copy([&] { copy_status = MigrateIn(cluster.address(1), in); });
  ASSERT_TRUE(Eventually([&] {
    for (const auto& m : ListMoves(cluster.address(1))) {
      if (m.phase() == v1::MoveState::COPYING && m.rows() > 0) return true;
    }
    return false;
  }));
  cluster.shard(1).Kill();
  copy.join();
  EXPECT_FALSE(copy_status.ok());
  // The source still owns every slot at epoch 1 and serves them.
  EXPECT_EQ(EpochOf(cluster.address(0)), 1u);
  EXPECT_EQ(TotalRows(cluster.address(0)), rows0);
  // Only server 0's ids: the client would also need server 1 otherwise.
  std::vector<int64_t> mine;
  for (int64_t id : ids) {
    if (cluster.map().slot_owner(SlotOf(StableNameKey("user"), id, kSlots)) == 0) {
      mine.push_back(id);
    }
  }
  ASSERT_FALSE(mine.empty());
  auto stub = v1::EmbeddingShard::NewStub(
      rpc::MakeChannel(cluster.address(0), rpc::ChannelKind::kData));
  v1::LookupRequest request;
  request.mutable_header()->set_shard_map_epoch(1);
  request.mutable_header()->set_step(0);
  v1::TableIds* t = request.add_tables();
  t->set_table("user");
  EncodeIds(mine, t->mutable_ids());
  v1::LookupResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(10)));
  const grpc::Status s = stub->Lookup(&ctx, request, &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  // A hand-over to the dead target fails and changes nothing.
  v1::HandOverRequest over;
  over.set_move_id("slow");
  over.set_target(cluster.address(1));
  *over.mutable_new_map() = Moved(cluster.map(), slots, 1, 2);
  const grpc::Status h = HandOver(cluster.address(0), over);
  EXPECT_FALSE(h.ok());
  EXPECT_EQ(EpochOf(cluster.address(0)), 1u);
  EXPECT_EQ(TotalRows(cluster.address(0)), rows0);
}

TEST(SlotMigration, ATargetStopsPromptlyWhileCopying) {
  Cluster cluster(2, 1, "sync");
  auto client = cluster.NewClient(0);
  std::vector<int64_t> ids(20000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i) * 7919;
  std::vector<float> rows(ids.size() * kDim);
  ASSERT_TRUE(client->Lookup(0, {{{0, ids, rows.data()}}}).ok());
  v1::MigrateInRequest in;
  in.set_move_id("stopping");
  in.set_source(cluster.address(0));
  for (uint32_t s : SlotsOf(cluster.map(), 0, 1)) in.add_slots(s);
  in.set_max_bytes_per_second(16 << 10);  // minutes for these rows
  grpc::Status copy_status;
  std::thread copy([&] { copy_status = MigrateIn(cluster.address(1), in); });
  ASSERT_TRUE(Eventually([&] {
    for (const auto& m : ListMoves(cluster.address(1))) {
      if (m.phase() == v1::MoveState::COPYING && m.rows() > 0) return true;
    }
    return false;
  }));
  const absl::Time start = absl::Now();
  const absl::StatusOr<int> code = cluster.shard(1).Terminate(absl::Seconds(15));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  copy.join();
  EXPECT_FALSE(copy_status.ok());
}

TEST(SlotMigration, HandOverRefusedByTheTargetKeepsTheSource) {
  Cluster cluster(2, 1, "sync");
  auto client = cluster.NewClient(0);
  for (int s = 0; s < 3; ++s) Step(*client, 0, s);
  const int64_t rows0 = TotalRows(cluster.address(0));
  const std::vector<uint32_t> slots = SlotsOf(cluster.map(), 0, 2);
  // No MigrateIn: the target has nothing to finish.
  v1::HandOverRequest over;
  over.set_move_id("never-copied");
  over.set_target(cluster.address(1));
  *over.mutable_new_map() = Moved(cluster.map(), slots, 1, 2);
  const grpc::Status h = HandOver(cluster.address(0), over);
  EXPECT_FALSE(h.ok());
  EXPECT_NE(h.error_message().find("keeps the slots"), std::string::npos)
      << h.error_message();
  EXPECT_EQ(EpochOf(cluster.address(0)), 1u);
  EXPECT_EQ(EpochOf(cluster.address(1)), 1u);
  EXPECT_EQ(TotalRows(cluster.address(0)), rows0);
  // Held requests were released: training goes on.
  for (int s = 3; s < 5; ++s) Step(*client, 0, s);
}

TEST(SlotMigration, AbortMoveDropsTheCopyAndTheHandOverThenFails) {
  Cluster cluster(2, 1, "sync");
  auto client = cluster.NewClient(0);
  for (int s = 0; s < 3; ++s) Step(*client, 0, s);
  const int64_t rows1 = TotalRows(cluster.address(1));
  const std::vector<uint32_t> slots = SlotsOf(cluster.map(), 0, 1);
  v1::MigrateInRequest in;
  in.set_move_id("ab");
  in.set_source(cluster.address(0));
  for (uint32_t s : slots) in.add_slots(s);
  v1::MigrateInResponse copied;
  ASSERT_TRUE(MigrateIn(cluster.address(1), in, &copied).ok());
  EXPECT_GT(copied.rows(), 0);
  EXPECT_EQ(TotalRows(cluster.address(1)), rows1 + copied.rows());
  v1::AbortMoveResponse aborted;
  ASSERT_TRUE(AbortMove(cluster.address(1), "ab", &aborted).ok());
  EXPECT_EQ(aborted.rows(), copied.rows());
  EXPECT_EQ(TotalRows(cluster.address(1)), rows1);
  EXPECT_EQ(ListMoves(cluster.address(1)).back().phase(), v1::MoveState::ABORTED);
  v1::HandOverRequest over;
  over.set_move_id("ab");
  over.set_target(cluster.address(1));
  *over.mutable_new_map() = Moved(cluster.map(), slots, 1, 2);
  EXPECT_FALSE(HandOver(cluster.address(0), over).ok());
  EXPECT_EQ(EpochOf(cluster.address(0)), 1u);
  // Unknown move.
  EXPECT_EQ(AbortMove(cluster.address(1), "nope").error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST(SlotMigration, BadMoveRequestsAreRefusedAndChangeNothing) {
  Cluster cluster(2, 1, "sync");
  auto client = cluster.NewClient(0);
  for (int s = 0; s < 2; ++s) Step(*client, 0, s);
  const int64_t rows1 = TotalRows(cluster.address(1));
  const std::vector<uint32_t> mine = SlotsOf(cluster.map(), 0, 1);
  const std::vector<uint32_t> theirs = SlotsOf(cluster.map(), 1, 1);
  auto request = [&](const std::string& id, std::vector<uint32_t> slots,
                     const std::string& source) {
    v1::MigrateInRequest in;
    in.set_move_id(id);
    in.set_source(source);
    for (uint32_t s : slots) in.add_slots(s);
    return in;
  };
  grpc::Status s = MigrateIn(cluster.address(1), request("x", {kSlots}, cluster.address(0)));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("out of range"), std::string::npos);
  s = MigrateIn(cluster.address(1), request("x", {theirs[0]}, cluster.address(0)));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("not by"), std::string::npos);
  s = MigrateIn(cluster.address(1), request("x", {theirs[0]}, cluster.address(1)));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("move to self"), std::string::npos);
  s = MigrateIn(cluster.address(1), request("x", {mine[0]}, "127.0.0.1:1"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(TotalRows(cluster.address(1)), rows1);
  // Two moves of one slot.
  ASSERT_TRUE(MigrateIn(cluster.address(1), request("first", {mine[0]}, cluster.address(0))).ok());
  s = MigrateIn(cluster.address(1), request("second", {mine[0], mine[1]}, cluster.address(0)));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("first"), std::string::npos);
  // A hand-over whose map moves other slots too, or to self.
  v1::HandOverRequest over;
  over.set_move_id("first");
  over.set_target(cluster.address(1));
  v1::ShardMap bad = Moved(cluster.map(), {mine[0]}, 1, 2);
  bad.set_slot_owner(static_cast<int>(theirs[0]), 0);
  *over.mutable_new_map() = bad;
  s = HandOver(cluster.address(0), over);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  over.set_target(cluster.address(0));
  *over.mutable_new_map() = Moved(cluster.map(), {mine[0]}, 1, 2);
  s = HandOver(cluster.address(0), over);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(EpochOf(cluster.address(0)), 1u);
  EXPECT_EQ(EpochOf(cluster.address(1)), 1u);
  // The plain SetShardMap still refuses to take slots with rows away.
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(10)));
  v1::SetShardMapRequest set;
  *set.mutable_shard_map() = Moved(cluster.map(), mine, 1, 2);
  set.set_self(cluster.address(0));
  v1::SetShardMapResponse resp;
  EXPECT_EQ(ShardAdminStub(cluster.address(0))->SetShardMap(&ctx, set, &resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

int64_t TableRows(const std::string& address, const std::string& table) {
  absl::StatusOr<v1::StatsResponse> stats = StatsOf(address);
  EXPECT_TRUE(stats.ok()) << stats.status();
  if (!stats.ok()) return -1;
  for (const auto& t : stats->tables()) {
    if (t.name() == table) return t.rows();
  }
  return -1;
}

// Sets `map` on the first `servers` servers of `cluster`.
void InstallMap(Cluster& cluster, const v1::ShardMap& map, int servers) {
  for (int i = 0; i < servers; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(10)));
    v1::SetShardMapRequest set;
    *set.mutable_shard_map() = map;
    set.set_self(cluster.address(i));
    v1::SetShardMapResponse resp;
    ASSERT_TRUE(ShardAdminStub(cluster.address(i))->SetShardMap(&ctx, set, &resp).ok());
  }
}

TEST(SlotMigration, ATableWiseTableMovesWhole) {
  Cluster cluster(2, 1, "sync");
  // Epoch 2, before any row: "item" lives whole on server 0.
  v1::ShardMap table_wise = cluster.map();
  table_wise.set_epoch(2);
  v1::TableRouting* routing = table_wise.add_tables();
  routing->set_table("item");
  routing->set_owner(0);
  InstallMap(cluster, table_wise, 2);
  auto client = cluster.NewClient(0);
  for (int s = 0; s < 3; ++s) Step(*client, 0, s);
  const int64_t items = TableRows(cluster.address(0), "item");
  ASSERT_GT(items, 0);
  ASSERT_EQ(TableRows(cluster.address(1), "item"), 0);
  v1::MigrateInRequest in;
  in.set_move_id("item");
  in.set_source(cluster.address(0));
  in.add_tables("item");
  v1::MigrateInResponse copied;
  ASSERT_TRUE(MigrateIn(cluster.address(1), in, &copied).ok());
  EXPECT_EQ(copied.rows(), items);
  v1::ShardMap next = table_wise;
  next.set_epoch(3);
  next.mutable_tables(0)->set_owner(1);
  v1::HandOverRequest over;
  over.set_move_id("item");
  over.set_target(cluster.address(1));
  *over.mutable_new_map() = next;
  const grpc::Status h = HandOver(cluster.address(0), over);
  ASSERT_TRUE(h.ok()) << h.error_message();
  EXPECT_EQ(TableRows(cluster.address(0), "item"), 0);
  EXPECT_EQ(TableRows(cluster.address(1), "item"), items);
  for (int s = 3; s < 5; ++s) Step(*client, 0, s);
  EXPECT_EQ(TableRows(cluster.address(0), "item"), 0);
}

// A planned map that keeps every table whole still has slot owners: a
// drain hands them over, as a move that copies no row (it failed twice:
// MigrateIn refused slots holding no row-wise table, and HandOver found that
// the new map "moves nothing").
TEST(SlotMigration, SlotsThatRouteNoRowMoveAsRoutingOnly) {
  Cluster cluster(2, 1, "sync");
  v1::ShardMap whole = cluster.map();
  whole.set_epoch(2);
  for (const char* table : {"user", "item"}) {
    v1::TableRouting* routing = whole.add_tables();
    routing->set_table(table);
    routing->set_owner(1);
  }
  InstallMap(cluster, whole, 2);
  auto client = cluster.NewClient(0);
  for (int s = 0; s < 2; ++s) Step(*client, 0, s);
  v1::MigrateInRequest in;
  in.set_move_id("routing");
  in.set_source(cluster.address(0));
  v1::ShardMap next = whole;
  next.set_epoch(3);
  for (int slot = 0; slot < whole.slot_owner_size(); ++slot) {
    if (whole.slot_owner(slot) != 0) continue;
    in.add_slots(static_cast<uint32_t>(slot));
    next.set_slot_owner(slot, 1);
  }
  ASSERT_GT(in.slots_size(), 0);
  v1::MigrateInResponse copied;
  const grpc::Status m = MigrateIn(cluster.address(1), in, &copied);
  ASSERT_TRUE(m.ok()) << m.error_message();
  EXPECT_EQ(copied.rows(), 0);
  v1::HandOverRequest over;
  over.set_move_id("routing");
  over.set_target(cluster.address(1));
  *over.mutable_new_map() = next;
  const grpc::Status h = HandOver(cluster.address(0), over);
  ASSERT_TRUE(h.ok()) << h.error_message();
  for (int s = 2; s < 4; ++s) Step(*client, 0, s);
}

// Rows of the checkpoint file `server` writes for `step` (SaveRows, then
// SaveRowsStatus until DONE).
int64_t CheckpointRows(const std::string& server, uint64_t step,
                       const std::string& path) {
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(20)));
    v1::SaveRowsRequest request;
    request.set_step(step);
    request.set_path(path);
    v1::SaveRowsResponse response;
    const grpc::Status s = ShardAdminStub(server)->SaveRows(&ctx, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (!s.ok()) return -1;
  }
  v1::SaveRowsStatusResponse status;
  EXPECT_TRUE(Eventually([&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(10)));
    v1::SaveRowsStatusRequest request;
    request.set_step(step);
    return ShardAdminStub(server)->SaveRowsStatus(&ctx, request, &status).ok() &&
           status.state() == v1::SaveRowsStatusResponse::DONE;
  }));
  return status.file().rows();
}

TEST(SlotMigration, CheckpointsHoldOnlyTheUnitsOwnedAtTheCut) {
  TempDir dir;
  Cluster cluster(2, 1, "sync");
  auto client = cluster.NewClient(0);
  for (int s = 0; s < 3; ++s) Step(*client, 0, s);
  const int64_t rows0 = TotalRows(cluster.address(0));
  const int64_t rows1 = TotalRows(cluster.address(1));
  const std::vector<uint32_t> slots = SlotsOf(cluster.map(), 0, 1);
  v1::MigrateInRequest in;
  in.set_move_id("ck");
  in.set_source(cluster.address(0));
  for (uint32_t s : slots) in.add_slots(s);
  v1::MigrateInResponse copied;
  ASSERT_TRUE(MigrateIn(cluster.address(1), in, &copied).ok());
  ASSERT_EQ(copied.rows(), rows0);
  // The target holds server 0's rows as a copy: not in its file.
  EXPECT_EQ(CheckpointRows(cluster.address(1), 3, dir.path() + "/a/shard-1.sst"), rows1);
  EXPECT_EQ(CheckpointRows(cluster.address(0), 3, dir.path() + "/a/shard-0.sst"), rows0);
  // After the hand-over the target's file has them, the source's not.
  v1::HandOverRequest over;
  over.set_move_id("ck");
  over.set_target(cluster.address(1));
  *over.mutable_new_map() = Moved(cluster.map(), slots, 1, 2);
  ASSERT_TRUE(HandOver(cluster.address(0), over).ok());
  Step(*client, 0, 3);
  EXPECT_EQ(CheckpointRows(cluster.address(1), 4, dir.path() + "/b/shard-1.sst"),
            TotalRows(cluster.address(1)));
  EXPECT_EQ(CheckpointRows(cluster.address(0), 4, dir.path() + "/b/shard-0.sst"), 0);
}

}  // namespace
}  // namespace recps
