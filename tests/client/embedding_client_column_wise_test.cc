// The embedding client with column-wise tables: every group of a row asked
// of its owner and written at its column offset.
#include "client/embedding_client.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/hashing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/embedding_client_test_util.h"
#include "tests/client/fake_shard_server.h"

namespace recps::client {
namespace {

using ::recps::client::testing::FakeRowValue;
using ::recps::client::testing::FakeShardServer;
using ::recps::client::testing::Iota;
using ::recps::client::testing::kItem;
using ::recps::client::testing::kRank;
using ::recps::client::testing::kSlots;
using ::recps::client::testing::kUser;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAreArray;

class ColumnWiseClientTest : public ::testing::Test {
 protected:
  static constexpr char kLow[] = "user.cols0-3";
  static constexpr char kHigh[] = "user.cols3-8";

  void SetUp() override {
    for (int i = 0; i < 3; ++i) {
      servers_.push_back(std::make_unique<FakeShardServer>(
          std::map<std::string, int>{{kLow, 3}, {kHigh, 5}, {"item", 4}}));
      addresses_.push_back(servers_.back()->address());
    }
    map_ = Split(1, /*low_owner=*/2, /*high_end=*/8);
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

  ShardMap Split(uint64_t epoch, uint32_t low_owner, uint32_t high_end) const {
    v1::ShardMap p = ShardMap::Uniform(epoch, kSlots, addresses_).ToProto();
    v1::TableRouting* t = p.add_tables();
    t->set_table("user");
    v1::ColumnGroupRouting* low = t->add_column_groups();
    low->set_column_end(3);
    low->set_owner(low_owner);
    v1::ColumnGroupRouting* high = t->add_column_groups();
    high->set_column_begin(3);
    high->set_column_end(high_end);
    high->set_owner(0);
    absl::StatusOr<ShardMap> m = ShardMap::FromProto(p);
    EXPECT_TRUE(m.ok()) << m.status();
    return *m;
  }

  absl::StatusOr<std::unique_ptr<EmbeddingClient>> NewClient() {
    EmbeddingClientOptions o;
    o.worker_rank = kRank;
    o.rpc_timeout = absl::Seconds(5);
    o.initial_backoff = absl::Milliseconds(1);
    o.max_backoff = absl::Milliseconds(4);
    return EmbeddingClient::Create({{"user", 8}, {"item", 4}},
                                   MakeServerShardMapSource(addresses_), o);
  }

  // The fake's value of column c of a user row: from the group that holds c.
  static float UserValue(int64_t id, int c) {
    return c < 3 ? FakeRowValue(kLow, id, c) : FakeRowValue(kHigh, id, c - 3);
  }

  std::vector<std::unique_ptr<FakeShardServer>> servers_;
  std::vector<std::string> addresses_;
  ShardMap map_;
};

TEST_F(ColumnWiseClientTest, LookupAsksEveryGroupAndFillsItsColumns) {
  auto client = NewClient();
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<int64_t> a = {5, -7, 5, 100, 3}, b = {100, 42};
  const std::vector<int64_t> items = Iota(20);
  std::vector<float> out_a(a.size() * 8, -1), out_b(b.size() * 8, -1),
      out_i(items.size() * 4);
  ASSERT_TRUE((*client)
                  ->Lookup(2, {{{kUser, a, out_a.data()},
                                {kItem, items, out_i.data()},
                                {kUser, b, out_b.data()}}})
                  .ok());
  for (auto [ids, out] : {std::pair{&a, &out_a}, {&b, &out_b}}) {
    for (size_t i = 0; i < ids->size(); ++i) {
      for (int c = 0; c < 8; ++c) {
        EXPECT_EQ((*out)[i * 8 + c], UserValue((*ids)[i], c))
            << (*ids)[i] << " col " << c;
      }
    }
  }
  for (size_t i = 0; i < items.size(); ++i) {
    for (int c = 0; c < 4; ++c) {
      EXPECT_EQ(out_i[i * 4 + c], FakeRowValue("item", items[i], c));
    }
  }
  // Each group's owner got every distinct user id once, under the group's
  // name; nobody got "user".
  const std::set<int64_t> distinct = {5, -7, 100, 3, 42};
  std::multiset<int64_t> low, high;
  for (auto& s : servers_) {
    for (const auto& r : s->received()) {
      EXPECT_FALSE(r.ids.count("user"));
      if (r.ids.count(kLow)) low.insert(r.ids.at(kLow).begin(), r.ids.at(kLow).end());
      if (r.ids.count(kHigh)) high.insert(r.ids.at(kHigh).begin(), r.ids.at(kHigh).end());
    }
  }
  EXPECT_THAT(low, UnorderedElementsAreArray(distinct));
  EXPECT_THAT(high, UnorderedElementsAreArray(distinct));
  for (const auto& r : servers_[1]->received()) {
    EXPECT_FALSE(r.ids.count(kLow) || r.ids.count(kHigh));
  }
}

TEST_F(ColumnWiseClientTest, PushSplitsEachRowsColumnsOverTheGroups) {
  auto client = NewClient();
  ASSERT_TRUE(client.ok()) << client.status();
  // 9 repeats across specs: its rows are summed before the split.
  const std::vector<int64_t> first = {9, 1}, second = {2, 9};
  std::vector<float> g1(16), g2(16);
  for (int i = 0; i < 16; ++i) {
    g1[i] = 0.5f * i;
    g2[i] = -0.25f * i + 3;
  }
  ASSERT_TRUE((*client)
                  ->PushGradients(4, {{{kUser, first, g1.data()},
                                       {kUser, second, g2.data()}}})
                  .ok());
  std::map<int64_t, std::vector<float>> want = {
      {9, {}}, {1, {}}, {2, {}}};
  for (int c = 0; c < 8; ++c) {
    want[9].push_back(g1[c] + g2[8 + c]);
    want[1].push_back(g1[8 + c]);
    want[2].push_back(g2[c]);
  }
  const auto low = servers_[2]->grads();
  const auto high = servers_[0]->grads();
  ASSERT_EQ(low.size(), 3u);
  ASSERT_EQ(high.size(), 3u);
  for (const auto& [id, row] : want) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(low.at({kLow, id})[c], row[c]);
    for (int c = 3; c < 8; ++c) EXPECT_EQ(high.at({kHigh, id})[c - 3], row[c]);
  }
  // Every server heard the step, server 1 with an empty push.
  for (auto& s : servers_) EXPECT_EQ(s->received().size(), 1u);
  EXPECT_TRUE(servers_[1]->received()[0].ids.empty());
}

TEST_F(ColumnWiseClientTest, AMovedGroupIsResentAloneToItsNewOwner) {
  auto client = NewClient();
  ASSERT_TRUE(client.ok()) << client.status();
  // Epoch 2 moves the low group to server 1; server 2 knows it already.
  const ShardMap next = Split(2, /*low_owner=*/1, 8);
  servers_[1]->SetMap(next);
  servers_[2]->SetMap(next);
  const std::vector<int64_t> ids = Iota(30);
  std::vector<float> out(ids.size() * 8);
  ASSERT_TRUE((*client)->Lookup(1, {{{kUser, ids, out.data()}}}).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int c = 0; c < 8; ++c) EXPECT_EQ(out[i * 8 + c], UserValue(ids[i], c));
  }
  EXPECT_EQ((*client)->shard_map_epoch(), 2u);
  const auto r1 = servers_[1]->received();
  ASSERT_EQ(r1.size(), 1u);
  EXPECT_THAT(r1[0].ids.at(kLow), UnorderedElementsAreArray(ids));
  EXPECT_FALSE(r1[0].ids.count(kHigh));
}

TEST_F(ColumnWiseClientTest, GroupsThatMissTheWidthAreRefused) {
  for (auto& s : servers_) s->SetMap(Split(1, 2, /*high_end=*/7));
  absl::StatusOr<std::unique_ptr<EmbeddingClient>> client = NewClient();
  EXPECT_EQ(client.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(client.status().message(),
              HasSubstr("cover columns [0, 7) but the table has dim 8"));
}

// RoutedBatch::ConsumeLookup parses responses itself; these feed it
// hand-made wire bytes, cut into small gRPC slices so that varints and rows
// straddle slice boundaries.

}  // namespace
}  // namespace recps::client
