#include "tests/testing/shard_cluster.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc/channels.h"
#include "gtest/gtest.h"

namespace recps::testing {
namespace {

std::chrono::system_clock::time_point In(std::chrono::seconds d) {
  return std::chrono::system_clock::now() + d;
}

}  // namespace

std::unique_ptr<v1::ShardAdmin::Stub> ShardAdminStub(const std::string& address) {
  return v1::ShardAdmin::NewStub(rpc::MakeChannel(address, rpc::ChannelKind::kControl));
}

ShardCluster::ShardCluster(const std::string& shard_binary,
                           const std::string& tables_text,
                           std::vector<std::string> args, int num_servers,
                           uint32_t num_slots)
    : binary_(shard_binary) {
  args_ = {"--tables=" + dir_.WriteFile("tables.textproto", tables_text),
           absl::StrCat("--num_slots=", num_slots)};
  args_.insert(args_.end(), args.begin(), args.end());
  for (int i = 0; i < num_servers; ++i) {
    if (AddServer() < 0) return;
  }
  SetMap(ShardMap::Uniform(1, num_slots, addresses()));
  ok_ = !::testing::Test::HasFailure();
}

int ShardCluster::AddServer() {
  auto shard = LocalShard::Start(binary_, args_);
  EXPECT_TRUE(shard.ok()) << shard.status();
  if (!shard.ok()) return -1;
  shards_.push_back(*std::move(shard));
  return static_cast<int>(shards_.size()) - 1;
}

bool ShardCluster::Restart(int i) {
  std::vector<std::string> args = args_;
  args.push_back("--listen=" + address(i));
  // The killed process's port is free at once (its socket is gone), but
  // give the kernel a few tries.
  for (int attempt = 0; attempt < 20; ++attempt) {
    auto shard = LocalShard::Start(binary_, args);
    if (shard.ok()) {
      shards_[i] = *std::move(shard);
      return true;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

grpc::Status ShardCluster::SetMapOn(int i, const v1::ShardMap& map) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(std::chrono::seconds(10)));
  v1::SetShardMapRequest req;
  *req.mutable_shard_map() = map;
  req.set_self(address(i));
  v1::SetShardMapResponse resp;
  return ShardAdminStub(address(i))->SetShardMap(&ctx, req, &resp);
}

void ShardCluster::SetMap(const ShardMap& map) {
  const v1::ShardMap proto = map.ToProto();
  for (int i = 0; i < static_cast<int>(shards_.size()); ++i) {
    if (map.IndexOf(address(i)) < 0) continue;
    const grpc::Status s = SetMapOn(i, proto);
    EXPECT_TRUE(s.ok()) << address(i) << ": " << s.error_message();
  }
  map_ = map;
}

uint64_t ShardCluster::EpochOn(int i) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(std::chrono::seconds(10)));
  v1::ShardMap map;
  const grpc::Status s =
      ShardAdminStub(address(i))->GetShardMap(&ctx, v1::GetShardMapRequest(), &map);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return map.epoch();
}

std::unique_ptr<client::EmbeddingClient> ShardCluster::NewClient(
    std::vector<client::TableSchema> tables,
    const client::EmbeddingClientOptions& options) {
  auto c = client::EmbeddingClient::Create(
      std::move(tables), client::MakeServerShardMapSource(addresses()), options);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

std::vector<std::string> ShardCluster::addresses() const {
  std::vector<std::string> out;
  for (const auto& s : shards_) out.push_back(s->address());
  return out;
}

}  // namespace recps::testing
