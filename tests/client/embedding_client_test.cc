#include "client/embedding_client.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "client/routed_batch.h"
#include "common/hashing.h"
#include "common/wire/wire_format.h"
#include "gmock/gmock.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"
#include "tests/client/embedding_client_test_util.h"
#include "tests/client/fake_shard_server.h"

namespace recps::client {
namespace {

using ::recps::client::testing::ExpectFakeRows;
using ::recps::client::testing::FakeRowValue;
using ::recps::client::testing::FakeShardServer;
using ::recps::client::testing::Iota;
using ::recps::client::testing::kItem;
using ::recps::client::testing::kRank;
using ::recps::client::testing::kSlots;
using ::recps::client::testing::kTables;
using ::recps::client::testing::kUser;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAreArray;

// Counts fetches, to check the client refreshes once per round.
class CountingSource final : public ShardMapSource {
 public:
  CountingSource(std::unique_ptr<ShardMapSource> inner, std::atomic<int>* n)
      : inner_(std::move(inner)), n_(n) {}
  absl::StatusOr<ShardMap> Fetch() override {
    ++*n_;
    return inner_->Fetch();
  }

 private:
  std::unique_ptr<ShardMapSource> inner_;
  std::atomic<int>* n_;
};

class EmbeddingClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 3; ++i) {
      servers_.push_back(std::make_unique<FakeShardServer>(kTables));
      addresses_.push_back(servers_.back()->address());
    }
    map_ = ShardMap::Uniform(1, kSlots, addresses_);
    for (auto& s : servers_) {
      s->SetMap(map_);
      s->Expect(kRank, -1);
    }
  }

  void TearDown() override {
    for (auto& s : servers_) {
      s->Shutdown();
      EXPECT_THAT(s->violations(), IsEmpty()) << s->address();
    }
  }

  static EmbeddingClientOptions Options() {
    EmbeddingClientOptions o;
    o.worker_rank = kRank;
    o.rpc_timeout = absl::Seconds(5);
    o.initial_backoff = absl::Milliseconds(1);
    o.max_backoff = absl::Milliseconds(4);
    return o;
  }

  std::unique_ptr<EmbeddingClient> NewClient(EmbeddingClientOptions o) {
    auto client = EmbeddingClient::Create(
        {{"user", 8}, {"item", 4}},
        std::make_unique<CountingSource>(MakeServerShardMapSource(addresses_),
                                         &fetches_),
        o);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // map_ with server 0's slots given to server 1, at epoch 2.
  ShardMap Rebalanced() const {
    v1::ShardMap proto = map_.ToProto();
    proto.set_epoch(2);
    for (int s = 0; s < proto.slot_owner_size(); ++s) {
      if (proto.slot_owner(s) == 0) proto.set_slot_owner(s, 1);
    }
    return *ShardMap::FromProto(proto);
  }

  std::vector<int64_t> OwnedBy(int server, const std::string& table, int n) {
    std::vector<int64_t> ids;
    for (int64_t id = 0; static_cast<int>(ids.size()) < n; ++id) {
      if (map_.OwnerOf(StableNameKey(table), id) == server) ids.push_back(id);
    }
    return ids;
  }

  // out (ids.size() x dim) holds the fake's rows, within rel_tol.
  static void ExpectRows(const std::string& table,
                         const std::vector<int64_t>& ids,
                         const std::vector<float>& out, float rel_tol = 0) {
    ExpectFakeRows(table, ids, out, kTables.at(table), rel_tol);
  }

  std::vector<std::unique_ptr<FakeShardServer>> servers_;
  std::vector<std::string> addresses_;
  ShardMap map_;
  std::atomic<int> fetches_{0};
};

TEST_F(EmbeddingClientTest, LookupFillsCallerOrderWithDuplicates) {
  auto client = NewClient(Options());
  ASSERT_NE(client, nullptr);
  std::mt19937_64 rng(7);
  std::vector<int64_t> a(500), b(300), c(200);
  for (int64_t& id : a) id = static_cast<int64_t>(rng() % 120) - 20;
  for (int64_t& id : b) id = static_cast<int64_t>(rng() % 200);
  for (int64_t& id : c) id = static_cast<int64_t>(rng() % 50);
  std::vector<float> out_a(a.size() * 8), out_b(b.size() * 8),
      out_c(c.size() * 4);
  // Two specs share the user table: its ids are fetched once.
  const std::vector<LookupSpec> batch = {{kUser, a, out_a.data()},
                                         {kItem, c, out_c.data()},
                                         {kUser, b, out_b.data()}};
  ASSERT_TRUE(client->Lookup(5, batch).ok());
  ExpectRows("user", a, out_a);
  ExpectRows("user", b, out_b);
  ExpectRows("item", c, out_c);

  std::multiset<int64_t> sent_user;
  for (auto& s : servers_) {
    const auto received = s->received();
    ASSERT_EQ(received.size(), 1u) << s->address();
    EXPECT_TRUE(received[0].lookup);
    EXPECT_EQ(received[0].header.shard_map_epoch(), 1u);
    EXPECT_EQ(received[0].header.step(), 5);
    EXPECT_EQ(received[0].header.worker_rank(), kRank);
    for (int64_t id : received[0].ids.at("user")) sent_user.insert(id);
  }
  std::set<int64_t> distinct(a.begin(), a.end());
  distinct.insert(b.begin(), b.end());
  EXPECT_THAT(sent_user, UnorderedElementsAreArray(distinct));
  EXPECT_EQ(fetches_, 1);
}

TEST_F(EmbeddingClientTest, PushReachesEveryServerAndSumsRepeats) {
  auto client = NewClient(Options());
  ASSERT_NE(client, nullptr);
  // Only server 0 owns these ids; 4 and 5 are in both specs.
  const std::vector<int64_t> all = OwnedBy(0, "user", 10);
  const std::vector<int64_t> first(all.begin(), all.begin() + 6);
  const std::vector<int64_t> second(all.begin() + 4, all.end());
  std::vector<float> g1(first.size() * 8), g2(second.size() * 8);
  for (size_t i = 0; i < g1.size(); ++i) g1[i] = 0.5f * i;
  for (size_t i = 0; i < g2.size(); ++i) g2[i] = -0.25f * i;
  const std::vector<PushSpec> batch = {{kUser, first, g1.data()},
                                       {kUser, second, g2.data()}};
  ASSERT_TRUE(client->PushGradients(7, batch).ok());

  for (int s = 0; s < 3; ++s) {
    const auto received = servers_[s]->received();
    ASSERT_EQ(received.size(), 1u) << s;
    EXPECT_FALSE(received[0].lookup);
    EXPECT_EQ(received[0].header.step(), 7);
    EXPECT_EQ(received[0].header.worker_rank(), kRank);
    EXPECT_EQ(received[0].ids.size(), s == 0 ? 1u : 0u);  // empty pushes
  }
  const auto grads = servers_[0]->grads();
  ASSERT_EQ(grads.size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    for (int c = 0; c < 8; ++c) {
      float want = 0;
      if (i < 6) want += g1[i * 8 + c];
      if (i >= 4) want += g2[(i - 4) * 8 + c];
      EXPECT_EQ(grads.at({"user", all[i]})[c], want) << all[i] << " " << c;
    }
  }
}

TEST_F(EmbeddingClientTest, StaleEpochRefreshesOnceAndResendsOnlyRefusedIds) {
  auto client = NewClient(Options());
  ASSERT_NE(client, nullptr);
  // Servers 0 and 1 moved to epoch 2; server 2's slots did not change.
  const ShardMap next = Rebalanced();
  servers_[0]->SetMap(next);
  servers_[1]->SetMap(next);
  const std::vector<int64_t> ids = Iota(200);
  std::vector<float> out(ids.size() * 8);
  ASSERT_TRUE(client->Lookup(1, {{{kUser, ids, out.data()}}}).ok());
  ExpectRows("user", ids, out);
  EXPECT_EQ(client->shard_map_epoch(), 2u);
  EXPECT_EQ(fetches_, 2);  // Create, then one refresh for two refusals

  const auto r0 = servers_[0]->received();
  const auto r1 = servers_[1]->received();
  const auto r2 = servers_[2]->received();
  ASSERT_EQ(r0.size(), 1u);
  ASSERT_EQ(r1.size(), 2u);
  ASSERT_EQ(r2.size(), 1u);
  EXPECT_EQ(r0[0].answer, grpc::StatusCode::ABORTED);
  EXPECT_EQ(r1[0].answer, grpc::StatusCode::ABORTED);
  EXPECT_EQ(r2[0].answer, grpc::StatusCode::OK);
  EXPECT_EQ(r1[1].header.shard_map_epoch(), 2u);
  std::vector<int64_t> refused = r0[0].ids.at("user");
  refused.insert(refused.end(), r1[0].ids.at("user").begin(),
                 r1[0].ids.at("user").end());
  EXPECT_THAT(r1[1].ids.at("user"), UnorderedElementsAreArray(refused));
}

TEST_F(EmbeddingClientTest, StaleEpochPushReachesNewMapOnce) {
  auto client = NewClient(Options());
  ASSERT_NE(client, nullptr);
  const ShardMap next = Rebalanced();
  servers_[0]->SetMap(next);
  servers_[1]->SetMap(next);
  const std::vector<int64_t> ids = Iota(100);
  std::vector<float> g(ids.size() * 8);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i);
  ASSERT_TRUE(client->PushGradients(2, {{{kUser, ids, g.data()}}}).ok());

  // Server 2 accepted in round one and is not pushed again; server 0 owns
  // nothing at epoch 2, so after its refusal it gets nothing more: a server
  // that owns nothing takes part in no step.
  const auto r0 = servers_[0]->received();
  ASSERT_EQ(r0.size(), 1u);
  EXPECT_EQ(r0[0].answer, grpc::StatusCode::ABORTED);
  EXPECT_EQ(servers_[1]->received().size(), 2u);
  EXPECT_EQ(servers_[2]->received().size(), 1u);
  std::map<int64_t, std::vector<float>> got;
  for (auto& s : servers_) {
    for (auto& [key, row] : s->grads()) {
      EXPECT_TRUE(got.emplace(key.second, row).second)
          << "twice: " << key.second;
    }
  }
  ASSERT_EQ(got.size(), ids.size());
  for (int64_t id : ids) {
    for (int c = 0; c < 8; ++c) EXPECT_EQ(got[id][c], g[id * 8 + c]);
  }
}

TEST_F(EmbeddingClientTest, AnOfferedNewerMapIsUsedAtOnce) {
  auto client = NewClient(Options());
  ASSERT_NE(client, nullptr);
  const ShardMap next = Rebalanced();
  for (auto& s : servers_) s->SetMap(next);
  ASSERT_TRUE(client->OfferShardMap(next).ok());
  EXPECT_EQ(client->shard_map_epoch(), 2u);
  // Older or equal epochs change nothing; a map the tables do not fit is
  // refused.
  EXPECT_TRUE(client->OfferShardMap(map_).ok());
  EXPECT_EQ(client->shard_map_epoch(), 2u);
  v1::ShardMap bad = next.ToProto();
  bad.set_epoch(3);
  v1::TableRouting* t = bad.add_tables();
  t->set_table("user");
  v1::ColumnGroupRouting* g = t->add_column_groups();
  g->set_column_end(5);  // user has dim 8
  EXPECT_EQ(client->OfferShardMap(*ShardMap::FromProto(bad)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client->shard_map_epoch(), 2u);
  // The next call routes by epoch 2 without a refusal or a fetch.
  const std::vector<int64_t> ids = Iota(100);
  std::vector<float> out(ids.size() * 8);
  ASSERT_TRUE(client->Lookup(1, {{{kUser, ids, out.data()}}}).ok());
  ExpectRows("user", ids, out);
  EXPECT_EQ(fetches_, 1);
  for (auto& s : servers_) {
    for (const auto& r : s->received()) {
      EXPECT_EQ(r.answer, grpc::StatusCode::OK);
      EXPECT_EQ(r.header.shard_map_epoch(), 2u);
    }
  }
  EXPECT_TRUE(servers_[0]->received().empty());  // owns nothing at epoch 2
}

TEST_F(EmbeddingClientTest, RetriesUnavailableThenSucceeds) {
  auto client = NewClient(Options());
  ASSERT_NE(client, nullptr);
  const grpc::Status starting(grpc::StatusCode::UNAVAILABLE, "starting");
  servers_[1]->Inject({starting, starting});
  const std::vector<int64_t> ids = Iota(60);
  std::vector<float> out(ids.size() * 8);
  ASSERT_TRUE(client->Lookup(0, {{{kUser, ids, out.data()}}}).ok());
  ExpectRows("user", ids, out);
  const auto r1 = servers_[1]->received();
  ASSERT_EQ(r1.size(), 3u);
  EXPECT_EQ(r1[2].ids, r1[0].ids);
  EXPECT_EQ(servers_[0]->received().size(), 1u);
  EXPECT_EQ(servers_[2]->received().size(), 1u);
  EXPECT_EQ(fetches_, 1);
}

TEST_F(EmbeddingClientTest, PersistentUnavailableGivesUpAfterMaxAttempts) {
  EmbeddingClientOptions o = Options();
  o.max_attempts = 3;
  auto client = NewClient(o);
  ASSERT_NE(client, nullptr);
  servers_[1]->FailAlways(
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "going away"));
  const std::vector<int64_t> ids = Iota(60);
  std::vector<float> out(ids.size() * 8);
  const absl::Status status = client->Lookup(0, {{{kUser, ids, out.data()}}});
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(addresses_[1]));
  EXPECT_THAT(status.message(), HasSubstr("going away"));
  EXPECT_THAT(status.message(), HasSubstr("3 attempts"));
  EXPECT_EQ(servers_[1]->received().size(), 3u);
}

// A server that stops (after a drain, or shutting down) with a call in
// flight cancels it: CANCELLED that the client did not cause. The client
// looks for a newer map, backs off and retries, here on the slots' new
// owner. (A real recps-shard answers UNAVAILABLE from its own code while
// stopping; gRPC's CANCELLED comes from a race with its shutdown that a
// process test cannot order, so the fake answers it.)
TEST_F(EmbeddingClientTest, ServerCancelledLookupIsRetriedOnTheNewOwner) {
  auto client = NewClient(Options());
  ASSERT_NE(client, nullptr);
  // Server 0 is leaving: epoch 2 gives its slots to server 1.
  const ShardMap next = Rebalanced();
  servers_[1]->SetMap(next);
  servers_[2]->SetMap(next);
  servers_[0]->FailAlways(
      grpc::Status(grpc::StatusCode::CANCELLED, "server is stopping"));
  const std::vector<int64_t> ids = OwnedBy(0, "user", 30);
  std::vector<float> out(ids.size() * 8);
  const absl::Status status = client->Lookup(1, {{{kUser, ids, out.data()}}});
  ASSERT_TRUE(status.ok()) << status;
  ExpectRows("user", ids, out);
  EXPECT_EQ(client->shard_map_epoch(), 2u);
  EXPECT_EQ(fetches_, 2);  // Create, then one refresh after the CANCELLED
  const auto r0 = servers_[0]->received();
  ASSERT_EQ(r0.size(), 1u);
  EXPECT_EQ(r0[0].answer, grpc::StatusCode::CANCELLED);
  const auto r1 = servers_[1]->received();
  ASSERT_EQ(r1.size(), 1u);
  EXPECT_EQ(r1[0].header.shard_map_epoch(), 2u);
  EXPECT_THAT(r1[0].ids.at("user"), UnorderedElementsAreArray(ids));
  EXPECT_TRUE(servers_[2]->received().empty());
}

// The outcome of a cancelled push is unknown, as after UNAVAILABLE: its
// retry keeps the part id, so a server that accepted it drops the repeat.
TEST_F(EmbeddingClientTest, ServerCancelledPushIsResentWithTheSamePart) {
  auto client = NewClient(Options());
  ASSERT_NE(client, nullptr);
  servers_[1]->Inject(
      {grpc::Status(grpc::StatusCode::CANCELLED, "server is stopping")});
  const std::vector<int64_t> ids = Iota(100);
  std::vector<float> g(ids.size() * 8);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i);
  const absl::Status status =
      client->PushGradients(2, {{{kUser, ids, g.data()}}});
  ASSERT_TRUE(status.ok()) << status;
  const auto r1 = servers_[1]->received();
  ASSERT_EQ(r1.size(), 2u);
  EXPECT_EQ(r1[0].answer, grpc::StatusCode::CANCELLED);
  EXPECT_EQ(r1[1].answer, grpc::StatusCode::OK);
  EXPECT_NE(r1[0].header.push_part(), 0u);
  EXPECT_EQ(r1[1].header.push_part(), r1[0].header.push_part());
  EXPECT_EQ(r1[1].ids, r1[0].ids);
  // Servers 0 and 2 accepted in round one and are not pushed again.
  EXPECT_EQ(servers_[0]->received().size(), 1u);
  EXPECT_EQ(servers_[2]->received().size(), 1u);
  EXPECT_EQ(fetches_, 2);  // looked for a newer map; there was none
}

TEST_F(EmbeddingClientTest, PersistentServerCancelledGivesUpAfterMaxAttempts) {
  EmbeddingClientOptions o = Options();
  o.max_attempts = 3;
  auto client = NewClient(o);
  ASSERT_NE(client, nullptr);
  servers_[1]->FailAlways(
      grpc::Status(grpc::StatusCode::CANCELLED, "server is stopping"));
  const std::vector<int64_t> ids = Iota(60);
  std::vector<float> out(ids.size() * 8);
  const absl::Status status = client->Lookup(0, {{{kUser, ids, out.data()}}});
  EXPECT_TRUE(absl::IsCancelled(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(addresses_[1]));
  EXPECT_THAT(status.message(), HasSubstr("server is stopping"));
  EXPECT_THAT(status.message(), HasSubstr("3 attempts"));
  EXPECT_EQ(servers_[1]->received().size(), 3u);
}

TEST_F(EmbeddingClientTest, OtherErrorsSurfaceWithServerMessage) {
  auto client = NewClient(Options());
  ASSERT_NE(client, nullptr);
  servers_[2]->FailAlways(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                       "table user: id 42 out of range"));
  const std::vector<int64_t> ids = Iota(60);
  std::vector<float> out(ids.size() * 8);
  absl::Status status = client->Lookup(0, {{{kUser, ids, out.data()}}});
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(addresses_[2]));
  EXPECT_THAT(status.message(), HasSubstr("table user: id 42 out of range"));
  EXPECT_EQ(servers_[2]->received().size(), 1u);

  status = client->PushGradients(0, {{{kUser, ids, out.data()}}});
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(addresses_[2]));
  EXPECT_EQ(servers_[2]->received().size(), 2u);
}

TEST_F(EmbeddingClientTest, DeadlineExceededIsNotRetried) {
  EmbeddingClientOptions o = Options();
  o.rpc_timeout = absl::Milliseconds(100);
  auto client = NewClient(o);
  ASSERT_NE(client, nullptr);
  servers_[0]->SetDelay(absl::Milliseconds(300));
  const std::vector<int64_t> ids = Iota(60);
  std::vector<float> out(ids.size() * 8);
  const absl::Status status = client->Lookup(0, {{{kUser, ids, out.data()}}});
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(addresses_[0]));
  servers_[0]->Shutdown();  // lets the slow handler finish and record
  EXPECT_EQ(servers_[0]->received().size(), 1u);
}

TEST_F(EmbeddingClientTest, EveryCallCarriesTheDeadline) {
  auto client = NewClient(Options());
  ASSERT_NE(client, nullptr);
  const std::vector<int64_t> ids = Iota(30);
  std::vector<float> rows(ids.size() * 8);
  ASSERT_TRUE(client->Lookup(0, {{{kUser, ids, rows.data()}}}).ok());
  ASSERT_TRUE(client->PushGradients(0, {{{kUser, ids, rows.data()}}}).ok());
  for (auto& s : servers_) {
    for (const auto& r : s->received()) {
      ASSERT_TRUE(r.deadline_left.has_value()) << s->address();
      // gRPC sends the timeout rounded up to a few digits.
      EXPECT_GT(*r.deadline_left, absl::Seconds(4));
      EXPECT_LE(*r.deadline_left, absl::Seconds(5) + absl::Milliseconds(100));
    }
  }
}

// Distinct (table, id) pairs of a batch, as each server owns them in `map`.
int OwnedCount(const ShardMap& map, int server,
               const std::map<std::string, std::set<int64_t>>& ids) {
  int n = 0;
  for (const auto& [table, set] : ids) {
    for (int64_t id : set) {
      if (map.OwnerOf(StableNameKey(table), id) == server) ++n;
    }
  }
  return n;
}

int CeilDiv(int a, int b) { return (a + b - 1) / b; }

// Ids of a request over all its tables.
size_t IdsIn(const FakeShardServer::Received& r) {
  size_t n = 0;
  for (const auto& [table, ids] : r.ids) n += ids.size();
  return n;
}

TEST_F(EmbeddingClientTest, LargeLookupIsSplitIntoChunksPerServer) {
  EmbeddingClientOptions o = Options();
  o.max_ids_per_lookup_request = 1000;
  auto client = NewClient(o);
  ASSERT_NE(client, nullptr);
  // 10k ids over two tables, so chunks cross from one table to the next;
  // the second user spec repeats ids of the first.
  std::mt19937_64 rng(11);
  const std::vector<int64_t> users = Iota(6000);
  std::vector<int64_t> again(500);
  for (int64_t& id : again) id = static_cast<int64_t>(rng() % 6000);
  std::vector<int64_t> items = Iota(4000);
  std::shuffle(items.begin(), items.end(), rng);
  std::vector<float> out_u(users.size() * 8), out_a(again.size() * 8),
      out_i(items.size() * 4);
  ASSERT_TRUE(client
                  ->Lookup(4, {{kUser, users, out_u.data()},
                               {kItem, items, out_i.data()},
                               {kUser, again, out_a.data()}})
                  .ok());
  ExpectRows("user", users, out_u);
  ExpectRows("user", again, out_a);
  ExpectRows("item", items, out_i);

  const std::map<std::string, std::set<int64_t>> distinct = {
      {"user", {users.begin(), users.end()}},
      {"item", {items.begin(), items.end()}}};
  for (int s = 0; s < 3; ++s) {
    const int owned = OwnedCount(map_, s, distinct);
    ASSERT_GT(owned, 1000) << s;
    const auto received = servers_[s]->received();
    ASSERT_EQ(received.size(), static_cast<size_t>(CeilDiv(owned, 1000))) << s;
    std::map<std::string, std::multiset<int64_t>> sent;
    size_t smallest = owned, largest = 0;
    for (const auto& r : received) {
      EXPECT_TRUE(r.lookup);
      EXPECT_EQ(r.answer, grpc::StatusCode::OK);
      EXPECT_EQ(r.header.step(), 4);
      EXPECT_EQ(r.header.shard_map_epoch(), 1u);
      smallest = std::min(smallest, IdsIn(r));
      largest = std::max(largest, IdsIn(r));
      for (const auto& [table, ids] : r.ids) {
        EXPECT_FALSE(ids.empty());  // no empty table entries
        sent[table].insert(ids.begin(), ids.end());
      }
    }
    EXPECT_LE(largest, 1000u) << s;
    EXPECT_LE(largest - smallest, 1u) << s;  // near-equal chunks
    // Every owned id exactly once over the chunks.
    for (const auto& [table, set] : distinct) {
      std::multiset<int64_t> want;
      for (int64_t id : set) {
        if (map_.OwnerOf(StableNameKey(table), id) == s) want.insert(id);
      }
      EXPECT_EQ(sent[table], want) << s << " " << table;
    }
  }
  EXPECT_EQ(fetches_, 1);
}

TEST_F(EmbeddingClientTest, SmallPartsStayOneRequestPerServer) {
  EmbeddingClientOptions o = Options();
  o.max_ids_per_lookup_request = 1000;
  auto client = NewClient(o);
  ASSERT_NE(client, nullptr);
  // About 900 ids per server: under the chunk size.
  const std::vector<int64_t> ids = Iota(2700);
  std::vector<float> out(ids.size() * 8);
  ASSERT_TRUE(client->Lookup(0, {{{kUser, ids, out.data()}}}).ok());
  ExpectRows("user", ids, out);
  for (int s = 0; s < 3; ++s) {
    const int owned = OwnedCount(map_, s, {{"user", {ids.begin(), ids.end()}}});
    ASSERT_LE(owned, 1000) << s;
    ASSERT_EQ(servers_[s]->received().size(), 1u) << s;
    EXPECT_EQ(IdsIn(servers_[s]->received()[0]), static_cast<size_t>(owned));
  }
}

TEST_F(EmbeddingClientTest, UnavailableChunkIsResentAlone) {
  EmbeddingClientOptions o = Options();
  o.max_ids_per_lookup_request = 1000;
  auto client = NewClient(o);
  ASSERT_NE(client, nullptr);
  servers_[1]->Inject(
      {grpc::Status(grpc::StatusCode::UNAVAILABLE, "overloaded")});
  const std::vector<int64_t> ids = Iota(10000);
  std::vector<float> out(ids.size() * 8);
  ASSERT_TRUE(client->Lookup(0, {{{kUser, ids, out.data()}}}).ok());
  ExpectRows("user", ids, out);

  const std::map<std::string, std::set<int64_t>> distinct = {
      {"user", {ids.begin(), ids.end()}}};
  for (int s : {0, 2}) {
    EXPECT_EQ(servers_[s]->received().size(),
              static_cast<size_t>(CeilDiv(OwnedCount(map_, s, distinct), 1000)))
        << s;
  }
  const auto r1 = servers_[1]->received();
  const size_t chunks1 = CeilDiv(OwnedCount(map_, 1, distinct), 1000);
  ASSERT_GT(chunks1, 1u);
  ASSERT_EQ(r1.size(), chunks1 + 1);  // the refused chunk once more
  std::vector<int64_t> refused;
  int refusals = 0;
  for (size_t i = 0; i < chunks1; ++i) {
    if (r1[i].answer == grpc::StatusCode::UNAVAILABLE) {
      ++refusals;
      refused = r1[i].ids.at("user");
    }
  }
  ASSERT_EQ(refusals, 1);
  EXPECT_EQ(r1.back().answer, grpc::StatusCode::OK);
  EXPECT_EQ(r1.back().ids.at("user"), refused);
  EXPECT_EQ(fetches_, 1);
}

TEST_F(EmbeddingClientTest, StaleEpochOnSomeChunksReroutesOnlyThose) {
  EmbeddingClientOptions o = Options();
  o.max_ids_per_lookup_request = 1000;
  auto client = NewClient(o);
  ASSERT_NE(client, nullptr);
  const std::vector<int64_t> ids = Iota(10000);
  const std::map<std::string, std::set<int64_t>> distinct = {
      {"user", {ids.begin(), ids.end()}}};
  std::vector<size_t> chunks;
  for (int s = 0; s < 3; ++s) {
    chunks.push_back(CeilDiv(OwnedCount(map_, s, distinct), 1000));
  }
  ASSERT_GT(chunks[0], 2u);
  // Server 0's slots move to server 1 after server 0 served two chunks;
  // servers 1 and 2 take the new map once they served all of theirs.
  const ShardMap next = Rebalanced();
  servers_[0]->SetMapAfter(2, next);
  servers_[1]->SetMapAfter(static_cast<int>(chunks[1]), next);
  servers_[2]->SetMapAfter(static_cast<int>(chunks[2]), next);
  std::vector<float> out(ids.size() * 8);
  ASSERT_TRUE(client->Lookup(1, {{{kUser, ids, out.data()}}}).ok());
  ExpectRows("user", ids, out);
  EXPECT_EQ(client->shard_map_epoch(), 2u);
  EXPECT_EQ(fetches_, 2);  // Create, then one refresh for all refusals

  const auto r0 = servers_[0]->received();
  ASSERT_EQ(r0.size(), chunks[0]);
  std::multiset<int64_t> refused;
  int ok = 0;
  for (const auto& r : r0) {
    if (r.answer == grpc::StatusCode::OK) {
      ++ok;
    } else {
      EXPECT_EQ(r.answer, grpc::StatusCode::ABORTED);
      refused.insert(r.ids.at("user").begin(), r.ids.at("user").end());
    }
  }
  EXPECT_EQ(ok, 2);
  // The refused ids, and only they, went to their new owner at epoch 2.
  const auto r1 = servers_[1]->received();
  ASSERT_EQ(r1.size(), chunks[1] + CeilDiv(refused.size(), 1000));
  std::multiset<int64_t> resent;
  for (size_t i = 0; i < r1.size(); ++i) {
    EXPECT_EQ(r1[i].answer, grpc::StatusCode::OK);
    EXPECT_EQ(r1[i].header.shard_map_epoch(), i < chunks[1] ? 1u : 2u);
    if (i >= chunks[1]) {
      resent.insert(r1[i].ids.at("user").begin(), r1[i].ids.at("user").end());
    }
  }
  EXPECT_EQ(resent, refused);
  EXPECT_EQ(servers_[2]->received().size(), chunks[2]);
}

TEST_F(EmbeddingClientTest, PushIsNeverChunked) {
  EmbeddingClientOptions o = Options();
  o.max_ids_per_lookup_request = 100;
  auto client = NewClient(o);
  ASSERT_NE(client, nullptr);
  const std::vector<int64_t> ids = Iota(3000);
  std::vector<float> g(ids.size() * 8, 0.5f);
  ASSERT_TRUE(client->PushGradients(3, {{{kUser, ids, g.data()}}}).ok());
  size_t total = 0;
  for (auto& s : servers_) {
    const auto received = s->received();
    ASSERT_EQ(received.size(), 1u) << s->address();
    total += IdsIn(received[0]);
  }
  EXPECT_EQ(total, ids.size());
}

class EncodingTest : public EmbeddingClientTest,
                     public ::testing::WithParamInterface<v1::RowEncoding> {};

TEST_P(EncodingTest, RowsAndGradientsRoundTripWithinPrecision) {
  EmbeddingClientOptions o = Options();
  o.encoding = GetParam();
  o.max_ids_per_lookup_request = 16;  // several chunks per server
  // Relative rounding error: 2^-11 for fp16, 2^-8 for bf16.
  const float tol =
      GetParam() == v1::ROW_ENCODING_FLOAT16 ? 1.0f / 2048 : 1.0f / 256;
  auto client = NewClient(o);
  ASSERT_NE(client, nullptr);
  std::vector<int64_t> ids = Iota(100);
  ids.push_back(7);  // a repeat
  std::vector<float> out(ids.size() * 4);
  ASSERT_TRUE(client->Lookup(0, {{{kItem, ids, out.data()}}}).ok());
  ExpectRows("item", ids, out, tol);

  ids.pop_back();
  std::vector<float> g(ids.size() * 4);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.37f * i - 50.0f;
  ASSERT_TRUE(client->PushGradients(0, {{{kItem, ids, g.data()}}}).ok());
  std::map<int64_t, std::vector<float>> got;
  for (auto& s : servers_) {
    for (auto& [key, row] : s->grads()) got[key.second] = row;
  }
  ASSERT_EQ(got.size(), ids.size());
  for (int64_t id : ids) {
    for (int c = 0; c < 4; ++c) {
      const float want = g[id * 4 + c];
      EXPECT_NEAR(got[id][c], want, tol * std::fabs(want)) << id;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Compressed, EncodingTest,
                         ::testing::Values(v1::ROW_ENCODING_FLOAT16,
                                           v1::ROW_ENCODING_BFLOAT16));

TEST_F(EmbeddingClientTest, CreateAndCallsValidateInput) {
  auto make = [&](std::vector<TableSchema> tables, EmbeddingClientOptions o) {
    return EmbeddingClient::Create(std::move(tables),
                                   MakeServerShardMapSource(addresses_), o)
        .status();
  };
  EXPECT_TRUE(absl::IsInvalidArgument(make({{"a", 4}, {"a", 8}}, Options())));
  EXPECT_TRUE(absl::IsInvalidArgument(make({{"a", 0}}, Options())));
  EmbeddingClientOptions bad = Options();
  bad.max_attempts = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(make({{"a", 4}}, bad)));
  bad = Options();
  bad.max_ids_per_lookup_request = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(make({{"a", 4}}, bad)));
  EXPECT_TRUE(absl::IsInvalidArgument(
      EmbeddingClient::Create({{"a", 4}}, nullptr, Options()).status()));

  auto client = NewClient(Options());
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->FindTable("item"), kItem);
  EXPECT_EQ(client->FindTable("nope"), -1);
  const std::vector<int64_t> ids = {1, 2};
  std::vector<float> out(16);
  EXPECT_TRUE(
      absl::IsInvalidArgument(client->Lookup(0, {{{5, ids, out.data()}}})));
  EXPECT_TRUE(absl::IsInvalidArgument(
      client->Lookup(-1, {{{kUser, ids, out.data()}}})));
  EXPECT_TRUE(
      absl::IsInvalidArgument(client->Lookup(0, {{{kUser, ids, nullptr}}})));
  EXPECT_TRUE(
      client->Lookup(0, {{{kUser, {}, nullptr}}}).ok());  // nothing to send
  for (auto& s : servers_) EXPECT_THAT(s->received(), IsEmpty());
}

TEST_F(EmbeddingClientTest, ServerSourceTakesNewestMapAndSkipsDeadServers) {
  std::vector<std::string> dead;
  for (int i = 0; i < 2; ++i) {
    FakeShardServer gone(kTables);
    dead.push_back(gone.address());
  }
  v1::ShardMap newer = map_.ToProto();
  newer.set_epoch(5);
  servers_[2]->SetMap(*ShardMap::FromProto(newer));
  auto source = MakeServerShardMapSource(
      {dead[0], addresses_[0], addresses_[1], addresses_[2]});
  absl::StatusOr<ShardMap> map = source->Fetch();
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->epoch(), 5u);
  EXPECT_EQ(map->servers(), addresses_);

  map = MakeServerShardMapSource({dead[1]})->Fetch();
  EXPECT_TRUE(absl::IsUnavailable(map.status())) << map.status();
  EXPECT_THAT(map.status().message(), HasSubstr(dead[1]));
}

TEST_F(EmbeddingClientTest, ServerSourceDoesNotWaitForSlowServers) {
  // The margin is wide (answer long before the slow server would) so that a
  // loaded machine does not fail it; waiting would take the full 3 s.
  servers_[0]->SetDelay(absl::Seconds(3));
  const absl::Time start = absl::Now();
  absl::StatusOr<ShardMap> map = MakeServerShardMapSource(addresses_)->Fetch();
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(map->epoch(), 1u);
}

TEST_F(EmbeddingClientTest, ConcurrentCallsShareOneClient) {
  auto client = NewClient(Options());
  ASSERT_NE(client, nullptr);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int round = 0; round < 10; ++round) {
        std::vector<int64_t> ids(64);
        for (int64_t& id : ids) id = static_cast<int64_t>(rng() % 500);
        std::vector<float> out(ids.size() * 8);
        if (!client->Lookup(round, {{{kUser, ids, out.data()}}}).ok())
          ++failures;
        for (size_t i = 0; i < ids.size(); ++i) {
          if (out[i * 8 + 3] != FakeRowValue("user", ids[i], 3)) ++failures;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures, 0);
}

// Table "user" (dim 8) split column-wise: columns [0, 3) on server 2,
// [3, 8) on server 0; "item" by the global slots.
}  // namespace
}  // namespace recps::client
