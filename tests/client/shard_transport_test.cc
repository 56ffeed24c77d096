// Which transport each server of a shard map gets (client/shard_transport.h):
// the in-process server's address goes to the in-process transport, every
// other address over gRPC, and one client call uses both at once.
#include "client/shard_transport.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "client/embedding_client.h"
#include "client/grpc_shard_transport.h"
#include "client/in_process_shard.h"
#include "client/in_process_shard_transport.h"
#include "common/hashing.h"
#include "common/wire/shard_map.h"
#include "common/wire/wire_format.h"
#include "gmock/gmock.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"
#include "tests/client/embedding_client_test_util.h"
#include "tests/client/fake_shard_server.h"

namespace recps::client {
namespace {

using ::recps::client::testing::ExpectFakeRows;
using ::recps::client::testing::FakeRowValue;
using ::recps::client::testing::FakeShardServer;
using ::recps::client::testing::kItem;
using ::recps::client::testing::kRank;
using ::recps::client::testing::kSlots;
using ::recps::client::testing::kTables;
using ::recps::client::testing::kUser;
using ::testing::IsEmpty;

// Nothing listens here: a call sent over gRPC to it would fail.
constexpr char kInProcessAddress[] = "127.0.0.1:9";

// An in-process server that answers with the fake rows and records the ids
// of every request, by table, and which way rows went.
class FakeInProcessShard final : public InProcessShard {
 public:
  const std::string& address() const override { return address_; }

  void Lookup(const v1::LookupRequest* request, grpc::ByteBuffer* response,
              absl::Time, Done done) override {
    ++lookups_in_bytes;
    v1::LookupResponse answer;
    for (const v1::TableIds& t : request->tables()) {
      const std::vector<int64_t> ids = Record(t.table(), t.ids());
      std::vector<float> values = Rows(t.table(), ids);
      v1::TableRows* rows = answer.add_tables();
      rows->set_table(t.table());
      rows->set_dim(kTables.at(t.table()));
      EncodeRows(values.data(), values.size(), request->row_encoding(),
                 rows->mutable_rows());
    }
    grpc::Slice slice(answer.SerializeAsString());
    *response = grpc::ByteBuffer(&slice, 1);
    std::move(done)(absl::OkStatus());
  }
  void PushGradients(const v1::PushGradientsRequest* request,
                     v1::PushGradientsResponse*, Done done) override {
    ++pushes;
    for (const v1::TableGradients& t : request->tables()) {
      Record(t.table(), t.ids());
    }
    std::move(done)(absl::OkStatus());
  }
  void LookupInto(const v1::LookupRequest* request,
                  absl::Span<float* const> rows, uint64_t* incarnation,
                  int64_t* applied_step, absl::Time, Done done) override {
    ++lookups_in_place;
    for (int i = 0; i < request->tables_size(); ++i) {
      const v1::TableIds& t = request->tables(i);
      const std::vector<int64_t> ids = Record(t.table(), t.ids());
      const std::vector<float> values = Rows(t.table(), ids);
      std::copy(values.begin(), values.end(), rows[i]);
    }
    *incarnation = 0;
    *applied_step = -1;
    std::move(done)(absl::OkStatus());
  }
  void PushGradientsFrom(const v1::PushGradientsRequest* request,
                         absl::Span<const float* const>,
                         v1::PushGradientsResponse* response,
                         Done done) override {
    PushGradients(request, response, std::move(done));
  }

  std::map<std::string, std::vector<int64_t>> ids() const {
    absl::MutexLock lock(&mu_);
    return ids_;
  }
  std::atomic<int> lookups_in_bytes{0};
  std::atomic<int> lookups_in_place{0};
  std::atomic<int> pushes{0};

 private:
  std::vector<int64_t> Record(const std::string& table,
                              const std::string& bytes) {
    std::vector<int64_t> scratch;
    absl::Span<const int64_t> span;
    EXPECT_TRUE(DecodeIds(bytes, "ids", &scratch, &span).ok());
    absl::MutexLock lock(&mu_);
    std::vector<int64_t>& all = ids_[table];
    all.insert(all.end(), span.begin(), span.end());
    return std::vector<int64_t>(span.begin(), span.end());
  }
  static std::vector<float> Rows(const std::string& table,
                                 const std::vector<int64_t>& ids) {
    const int dim = kTables.at(table);
    std::vector<float> values;
    for (const int64_t id : ids) {
      for (int c = 0; c < dim; ++c) values.push_back(FakeRowValue(table, id, c));
    }
    return values;
  }

  const std::string address_ = kInProcessAddress;
  mutable absl::Mutex mu_;
  std::map<std::string, std::vector<int64_t>> ids_ ABSL_GUARDED_BY(mu_);
};

class FixedSource final : public ShardMapSource {
 public:
  explicit FixedSource(ShardMap map) : map_(std::move(map)) {}
  absl::StatusOr<ShardMap> Fetch() override { return map_; }

 private:
  const ShardMap map_;
};

TEST(Transports, TheInProcessServersAddressGetsTheInProcessTransport) {
  FakeInProcessShard local;
  internal::Transports transports(rpc::TransportSecurity::Insecure(), &local,
                                  /*same_host_rows=*/true);
  internal::ShardTransport* in_process = transports.For(kInProcessAddress);
  internal::ShardTransport* remote = transports.For("127.0.0.1:10");
  EXPECT_NE(dynamic_cast<internal::InProcessShardTransport*>(in_process),
            nullptr);
  EXPECT_NE(dynamic_cast<internal::GrpcShardTransport*>(remote), nullptr);
  EXPECT_TRUE(in_process->works_on_caller_thread());
  EXPECT_FALSE(remote->works_on_caller_thread());
  // Kept per address: a later map reuses the channel.
  EXPECT_EQ(transports.For("127.0.0.1:10"), remote);
  EXPECT_EQ(transports.For(kInProcessAddress), in_process);
  EXPECT_NE(transports.For("127.0.0.1:11"), remote);
}

TEST(Transports, WithoutAnInProcessServerEveryAddressGoesOverGrpc) {
  internal::Transports transports(rpc::TransportSecurity::Insecure(), nullptr,
                                  /*same_host_rows=*/true);
  EXPECT_NE(dynamic_cast<internal::GrpcShardTransport*>(
                transports.For(kInProcessAddress)),
            nullptr);
}

// Shared memory is offered to a server on this host's loopback only, and
// not at all when the client is told not to.
TEST(Transports, SameHostRowsAreOfferedToLoopbackServersOnly) {
  auto same_host = [](internal::Transports& t, const std::string& address) {
    return dynamic_cast<internal::GrpcShardTransport*>(t.For(address))->same_host() != nullptr;
  };
  internal::Transports on(rpc::TransportSecurity::Insecure(), nullptr, true);
  EXPECT_TRUE(same_host(on, "127.0.0.1:10"));
  EXPECT_TRUE(same_host(on, "localhost:10"));
  EXPECT_FALSE(same_host(on, "10.1.2.3:10"));
  EXPECT_FALSE(same_host(on, "shard-1.recps:10"));
  internal::Transports off(rpc::TransportSecurity::Insecure(), nullptr, false);
  EXPECT_FALSE(same_host(off, "127.0.0.1:10"));
}

class MixedTransportsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    map_ = ShardMap::Uniform(1, kSlots, {remote_.address(), kInProcessAddress});
    remote_.SetMap(map_);
    remote_.Expect(kRank, -1);
    EmbeddingClientOptions o;
    o.worker_rank = kRank;
    o.rpc_timeout = absl::Seconds(5);
    o.max_attempts = 1;  // a call sent the wrong way fails at once
    o.in_process_shard = &local_;
    auto client = EmbeddingClient::Create({{"user", 8}, {"item", 4}},
                                          std::make_unique<FixedSource>(map_), o);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }
  void TearDown() override {
    remote_.Shutdown();
    EXPECT_THAT(remote_.violations(), IsEmpty());
  }

  // The first n ids of `table` that server `server` owns.
  std::vector<int64_t> OwnedBy(int server, const std::string& table,
                               int n) const {
    std::vector<int64_t> ids;
    for (int64_t id = 0; static_cast<int>(ids.size()) < n; ++id) {
      if (map_.OwnerOf(StableNameKey(table), id) == server) ids.push_back(id);
    }
    return ids;
  }

  FakeShardServer remote_{kTables};
  FakeInProcessShard local_;
  ShardMap map_;
  std::unique_ptr<EmbeddingClient> client_;
};

TEST_F(MixedTransportsTest, EachServerOfTheMapIsReachedByItsOwnTransport) {
  // Each server's ids together, so that the in-process server's rows lie
  // contiguous in the caller's buffers.
  std::vector<int64_t> user = OwnedBy(0, "user", 100);
  const std::vector<int64_t> local_user = OwnedBy(1, "user", 100);
  user.insert(user.end(), local_user.begin(), local_user.end());
  const std::vector<int64_t> item = OwnedBy(1, "item", 50);
  std::vector<float> out_user(user.size() * 8), out_item(item.size() * 4);
  const LookupSpec lookup[] = {{kUser, user, out_user.data(), true},
                               {kItem, item, out_item.data(), true}};
  ASSERT_TRUE(client_->Lookup(3, lookup).ok());
  ExpectFakeRows("user", user, out_user, 8);
  ExpectFakeRows("item", item, out_item, 4);

  // Distinct fp32 ids into one buffer each: in place, no response bytes.
  EXPECT_EQ(local_.lookups_in_place, 1);
  EXPECT_EQ(local_.lookups_in_bytes, 0);
  const auto local_ids = local_.ids();
  ASSERT_EQ(local_ids.count("user"), 1u);
  ASSERT_EQ(local_ids.count("item"), 1u);
  EXPECT_EQ(local_ids.at("user"), local_user);
  EXPECT_EQ(local_ids.at("item"), item);
  // The gRPC fake refuses (a violation) any id it does not own.
  const auto remote_requests = remote_.received();
  ASSERT_EQ(remote_requests.size(), 1u);
  EXPECT_TRUE(remote_requests[0].lookup);
  EXPECT_EQ(remote_requests[0].ids.at("user").size(), 100u);
  EXPECT_EQ(remote_requests[0].ids.count("item"), 0u);

  std::vector<float> grads(user.size() * 8, 0.5f);
  const PushSpec push[] = {{kUser, user, grads.data(), true}};
  ASSERT_TRUE(client_->PushGradients(3, push).ok());
  EXPECT_EQ(local_.pushes, 1);
  ASSERT_EQ(remote_.received().size(), 2u);
  EXPECT_FALSE(remote_.received()[1].lookup);
}

TEST_F(MixedTransportsTest, RepeatedIdsReachTheInProcessServerAsBytes) {
  std::vector<int64_t> user = OwnedBy(1, "user", 3);
  user.insert(user.end(), user.begin(), user.end());
  std::vector<float> out(user.size() * 8);
  const LookupSpec lookup[] = {{kUser, user, out.data()}};
  ASSERT_TRUE(client_->Lookup(0, lookup).ok());
  ExpectFakeRows("user", user, out, 8);
  // A repeated id's row goes to several places: the response is parsed.
  EXPECT_EQ(local_.lookups_in_place, 0);
  EXPECT_EQ(local_.lookups_in_bytes, 1);
}

}  // namespace
}  // namespace recps::client
