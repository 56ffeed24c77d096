#include "client/embedding_client.h"

#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/hashing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/fake_shard_server.h"

namespace recps::client {
namespace {

using ::recps::client::testing::FakeRowValue;
using ::recps::client::testing::FakeShardServer;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAreArray;

constexpr int kRank = 3;
constexpr uint32_t kSlots = 64;
constexpr int kUser = 0;  // table indices in the client's schema
constexpr int kItem = 1;
const std::map<std::string, int> kTables = {{"user", 8}, {"item", 4}};

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

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = i;
  return ids;
}

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
    const int dim = kTables.at(table);
    ASSERT_EQ(out.size(), ids.size() * dim);
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int c = 0; c < dim; ++c) {
        const float want = FakeRowValue(table, ids[i], c);
        ASSERT_NEAR(out[i * dim + c], want, rel_tol * std::fabs(want))
            << table << " id " << ids[i] << " col " << c;
      }
    }
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
  // nothing at epoch 2 but still hears that rank 3 is done with step 2.
  const auto r0 = servers_[0]->received();
  ASSERT_EQ(r0.size(), 2u);
  EXPECT_EQ(r0[1].header.shard_map_epoch(), 2u);
  EXPECT_TRUE(r0[1].ids.empty());
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

class EncodingTest : public EmbeddingClientTest,
                     public ::testing::WithParamInterface<v1::RowEncoding> {};

TEST_P(EncodingTest, RowsAndGradientsRoundTripWithinPrecision) {
  EmbeddingClientOptions o = Options();
  o.encoding = GetParam();
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
  servers_[0]->SetDelay(absl::Milliseconds(600));
  const absl::Time start = absl::Now();
  absl::StatusOr<ShardMap> map = MakeServerShardMapSource(addresses_)->Fetch();
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(400));
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

}  // namespace
}  // namespace recps::client
