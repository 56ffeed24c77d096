// Push parts (RequestHeader.push_part) through raw requests to real
// recps-shard processes: a retried part is dropped, a second part is merged
// bit-exactly, an async retry is applied once.
#include <cstdint>
#include <string>
#include <vector>

#include "common/rpc/channels.h"
#include "common/wire/wire_format.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "recps/v1/shard.grpc.pb.h"
#include "tests/server/shard/migration_cluster.h"

namespace recps {
namespace {

using testing::In;
using testing::Cluster;
using testing::kDim;
using testing::UpdateIds;

grpc::Status Push(const std::string& address, int rank, int64_t step, uint64_t part,
                  const std::vector<int64_t>& ids, float value) {
  v1::PushGradientsRequest request;
  request.mutable_header()->set_shard_map_epoch(1);
  request.mutable_header()->set_step(step);
  request.mutable_header()->set_worker_rank(rank);
  request.mutable_header()->set_push_part(part);
  v1::TableGradients* t = request.add_tables();
  t->set_table("user");
  EncodeIds(ids, t->mutable_ids());
  std::vector<float> grads(ids.size() * kDim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = value + 0.001f * i;
  t->set_grads(std::string(reinterpret_cast<const char*>(grads.data()),
                           grads.size() * sizeof(float)));
  auto stub = v1::EmbeddingShard::NewStub(
      rpc::MakeChannel(address, rpc::ChannelKind::kData));
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(10)));
  v1::PushGradientsResponse response;
  return stub->PushGradients(&ctx, request, &response);
}

std::string LookupBytes(const std::string& address, int64_t step,
                        const std::vector<int64_t>& ids) {
  auto stub = v1::EmbeddingShard::NewStub(
      rpc::MakeChannel(address, rpc::ChannelKind::kData));
  v1::LookupRequest request;
  request.mutable_header()->set_shard_map_epoch(1);
  request.mutable_header()->set_step(step);
  v1::TableIds* t = request.add_tables();
  t->set_table("user");
  EncodeIds(ids, t->mutable_ids());
  v1::LookupResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(10)));
  const grpc::Status s = stub->Lookup(&ctx, request, &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return response.tables_size() > 0 ? response.tables(0).rows() : "";
}

TEST(PushParts, RetryIsDroppedAndASecondPartIsMergedBitExactly) {
  // Two single-server clusters of world size 2: one gets rank 0's push in
  // two parts (and a retry of the first), the other in one.
  Cluster split(1, 2, "sync");
  Cluster whole(1, 2, "sync");
  const std::vector<int64_t> a = {1, 2, 3}, b = {4, 5}, ab = {1, 2, 3, 4, 5};
  ASSERT_TRUE(Push(split.address(0), 0, 0, 11, a, 0.5f).ok());
  ASSERT_TRUE(Push(split.address(0), 0, 0, 11, a, 0.5f).ok());  // retry
  ASSERT_TRUE(Push(split.address(0), 0, 0, 12, b, 0.25f).ok());  // second part
  // An id in two parts of one rank is refused.
  EXPECT_EQ(Push(split.address(0), 0, 0, 13, {3}, 1.0f).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(Push(split.address(0), 1, 0, 21, ab, -0.5f).ok());
  // The same gradients as one part each.
  std::vector<float> merged;
  {
    // rank 0's rows: a with value 0.5, b with 0.25 (offsets restart per part).
    v1::PushGradientsRequest request;
    request.mutable_header()->set_shard_map_epoch(1);
    request.mutable_header()->set_worker_rank(0);
    request.mutable_header()->set_push_part(31);
    v1::TableGradients* t = request.add_tables();
    t->set_table("user");
    EncodeIds(ab, t->mutable_ids());
    std::vector<float> grads;
    for (size_t i = 0; i < a.size() * kDim; ++i) grads.push_back(0.5f + 0.001f * i);
    for (size_t i = 0; i < b.size() * kDim; ++i) grads.push_back(0.25f + 0.001f * i);
    t->set_grads(std::string(reinterpret_cast<const char*>(grads.data()),
                             grads.size() * sizeof(float)));
    auto stub = v1::EmbeddingShard::NewStub(
        rpc::MakeChannel(whole.address(0), rpc::ChannelKind::kData));
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(10)));
    v1::PushGradientsResponse response;
    ASSERT_TRUE(stub->PushGradients(&ctx, request, &response).ok());
  }
  ASSERT_TRUE(Push(whole.address(0), 1, 0, 41, ab, -0.5f).ok());
  const std::string x = LookupBytes(split.address(0), 1, ab);
  const std::string y = LookupBytes(whole.address(0), 1, ab);
  ASSERT_FALSE(x.empty());
  EXPECT_EQ(x, y);
  EXPECT_EQ(UpdateIds(split.address(0)), 5);
  // A retry of an accepted part after its step was applied is still OK
  // (dropped); a new part of an applied step is refused.
  EXPECT_TRUE(Push(split.address(0), 0, 0, 12, b, 0.25f).ok());
  EXPECT_EQ(Push(split.address(0), 0, 0, 14, {9}, 0.25f).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(UpdateIds(split.address(0)), 5);
}

TEST(PushParts, AsyncRetryOfAPartIsAppliedOnce) {
  Cluster cluster(1, 1, "async");
  ASSERT_TRUE(Push(cluster.address(0), 0, 0, 5, {1, 2}, 0.5f).ok());
  ASSERT_TRUE(Push(cluster.address(0), 0, 0, 5, {1, 2}, 0.5f).ok());
  ASSERT_TRUE(Push(cluster.address(0), 0, 0, 6, {3}, 0.5f).ok());
  EXPECT_EQ(UpdateIds(cluster.address(0)), 3);
}

}  // namespace
}  // namespace recps
