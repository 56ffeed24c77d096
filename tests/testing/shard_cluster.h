// Real recps-shard processes (127.0.0.1, OS-picked ports) sharing one
// shard map, embedding clients for them, and the ShardAdmin calls of a
// map change. The one fixture of the shard-server process tests
// (shard_cluster_test.cc, the slot-move tests, the planner's cluster
// test); each adds only its flags and its own checks.
#ifndef RECPS_TESTS_TESTING_SHARD_CLUSTER_H_
#define RECPS_TESTS_TESTING_SHARD_CLUSTER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/embedding_client.h"
#include "common/wire/shard_map.h"
#include "grpcpp/grpcpp.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "tests/testing/files.h"
#include "tests/testing/local_shard.h"

namespace recps::testing {

// A ShardAdmin stub of the server at `address` (plaintext, control channel).
std::unique_ptr<v1::ShardAdmin::Stub> ShardAdminStub(const std::string& address);

class ShardCluster {
 public:
  // Starts `num_servers` of `shard_binary` with --tables=<tables_text as a
  // file>, --num_slots and `args`, then installs the uniform map of epoch
  // 1 over them. Failures are test failures (check ok()).
  ShardCluster(const std::string& shard_binary, const std::string& tables_text,
               std::vector<std::string> args, int num_servers, uint32_t num_slots);

  // Every server started and the first map installed.
  bool ok() const { return ok_; }

  // Starts one more server with the same flags, in no map yet; its index,
  // or -1 (a test failure) when it does not start.
  int AddServer();
  // Starts server `i` again at its address (after Kill: a crashed server
  // restarted, as Kubernetes does, with none of its rows). False when it
  // does not serve.
  bool Restart(int i);
  // SetShardMap(`map`) on server `i`, as that server (request.self).
  grpc::Status SetMapOn(int i, const v1::ShardMap& map);
  // SetMapOn every server; each refusal is a test failure. Records `map`.
  void SetMap(const ShardMap& map);
  // The epoch server `i` serves.
  uint64_t EpochOn(int i);

  // A client of every server's map (MakeServerShardMapSource over all).
  std::unique_ptr<client::EmbeddingClient> NewClient(
      std::vector<client::TableSchema> tables,
      const client::EmbeddingClientOptions& options = {});

  const std::string& address(int i) const { return shards_[i]->address(); }
  std::vector<std::string> addresses() const;
  LocalShard& shard(int i) { return *shards_[i]; }
  std::vector<std::unique_ptr<LocalShard>>& shards() { return shards_; }
  // The map the fixture installed last (SetMap, or the first one).
  const ShardMap& shard_map() const { return map_; }

 private:
  const std::string binary_;
  TempDir dir_;
  std::vector<std::string> args_;
  std::vector<std::unique_ptr<LocalShard>> shards_;
  ShardMap map_;
  bool ok_ = false;
};

}  // namespace recps::testing

#endif  // RECPS_TESTS_TESTING_SHARD_CLUSTER_H_
