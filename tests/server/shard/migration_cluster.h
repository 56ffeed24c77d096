// Slot-move test clusters: real recps-shard processes (127.0.0.1,
// OS-picked ports) of two tables, a uniform shard map installed on each,
// embedding clients for them, and the ShardAdmin calls of a move
// (MigrateIn, HandOver, AbortMove, ListMoves) and of the tests' checks.
// Shared by slot_migration_test.cc and push_parts_test.cc.
#ifndef RECPS_TESTS_SERVER_SHARD_MIGRATION_CLUSTER_H_
#define RECPS_TESTS_SERVER_SHARD_MIGRATION_CLUSTER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/embedding_client.h"
#include "common/rpc/channels.h"
#include "common/wire/shard_map.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "tests/server/shard/shard_stats.h"
#include "tests/testing/local_shard.h"
#include "tests/testing/shard_cluster.h"

namespace recps::testing {

inline constexpr int kDim = 8;
inline constexpr uint32_t kSlots = 64;

inline constexpr char kTables[] = R"(
tables {
  name: "user"
  dim: 8
  optimizer { kind: ADAGRAD learning_rate: 0.1 }
}
tables {
  name: "item"
  dim: 8
  num_rows: 1000
  optimizer { kind: ADAM learning_rate: 0.05 }
}
)";

grpc::Status MigrateIn(const std::string& target, const v1::MigrateInRequest& request,
                       v1::MigrateInResponse* response = nullptr);

grpc::Status HandOver(const std::string& source, const v1::HandOverRequest& request,
                      v1::HandOverResponse* response = nullptr);

grpc::Status AbortMove(const std::string& target, const std::string& id,
                       v1::AbortMoveResponse* response = nullptr);

std::vector<v1::MoveState> ListMoves(const std::string& address);

uint64_t EpochOf(const std::string& address);

int64_t TotalRows(const std::string& address);

int64_t UpdateIds(const std::string& address);

// `map` with `slots` given to server index `to`, at `epoch`.
v1::ShardMap Moved(const v1::ShardMap& map, const std::vector<uint32_t>& slots,
                   uint32_t to, uint64_t epoch);

// Slots of `map` owned by server index `owner`: every `every`-th of them.
std::vector<uint32_t> SlotsOf(const v1::ShardMap& map, uint32_t owner, int every);

class Cluster : public ShardCluster {
 public:
  Cluster(int num_servers, int world_size, const std::string& consistency,
          std::vector<std::string> extra = {})
      : ShardCluster(RECPS_SHARD_BINARY, kTables,
                     Flags(world_size, consistency, std::move(extra)), num_servers,
                     kSlots),
        map_(shard_map().ToProto()) {}

  std::unique_ptr<client::EmbeddingClient> NewClient(int rank) {
    client::EmbeddingClientOptions options;
    options.worker_rank = rank;
    options.rpc_timeout = absl::Seconds(30);
    options.max_attempts = 50;
    return ShardCluster::NewClient({{"user", kDim}, {"item", kDim}}, options);
  }

  // SetShardMap(`map`) on server index `i`; a refusal is a test failure.
  void Install(int i, const v1::ShardMap& map) {
    const grpc::Status st = SetMapOn(i, map);
    EXPECT_TRUE(st.ok()) << address(i) << ": " << st.error_message();
  }

  // The first map, in proto form (moves build the next ones from it).
  const v1::ShardMap& map() const { return map_; }

  // MigrateIn on `to` of `slots` from `from`, then HandOver on `from` with
  // the map moving them: the whole move, as the coordinator drives it.
  // Returns the new map.
  v1::ShardMap Move(const std::string& id, const v1::ShardMap& map, int from,
                    int to, const std::vector<uint32_t>& slots) {
    v1::MigrateInRequest in;
    in.set_move_id(id);
    in.set_source(address(from));
    for (uint32_t s : slots) in.add_slots(s);
    in.set_epoch(map.epoch());
    grpc::Status st = MigrateIn(address(to), in);
    EXPECT_TRUE(st.ok()) << st.error_message();
    v1::ShardMap next = Moved(map, slots, to, map.epoch() + 1);
    v1::HandOverRequest over;
    over.set_move_id(id);
    over.set_target(address(to));
    *over.mutable_new_map() = next;
    over.set_self(address(from));
    v1::HandOverResponse response;
    st = HandOver(address(from), over, &response);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return next;
  }

 private:
  static std::vector<std::string> Flags(int world_size, const std::string& consistency,
                                        std::vector<std::string> extra) {
    std::vector<std::string> flags = {absl::StrCat("--world_size=", world_size),
                                      "--consistency=" + consistency, "--seed=7",
                                      "--step_timeout=20s", "--threads=2"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return flags;
  }

  const v1::ShardMap map_;
};

}  // namespace recps::testing

#endif  // RECPS_TESTS_SERVER_SHARD_MIGRATION_CLUSTER_H_
