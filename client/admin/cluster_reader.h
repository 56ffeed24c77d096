// Reads what the admin CLI reports from a live cluster: members and the
// shard map from the coordinator (or the map from shard servers asked
// directly), then ShardAdmin.Stats from every shard server at once. Each
// RPC has a deadline; a server that does not answer is recorded, not fatal.
#ifndef RECPS_CLIENT_ADMIN_CLUSTER_READER_H_
#define RECPS_CLIENT_ADMIN_CLUSTER_READER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "common/rpc/channels.h"
#include "recps/v1/coordinator.pb.h"
#include "recps/v1/shard_admin.pb.h"
#include "recps/v1/shard_map.pb.h"

namespace recps::client::admin {

struct ClusterReaderOptions {
  // host:port of the coordinator. Empty: ask `servers` directly.
  std::string coordinator;
  // Shard servers to ask directly (only when `coordinator` is empty).
  std::vector<std::string> servers;
  // Deadline of every RPC.
  absl::Duration rpc_timeout = absl::Seconds(5);
  // How channels authenticate (common/rpc/channels.h).
  rpc::TransportSecurity security;
};

// One look at the cluster.
struct ClusterSnapshot {
  // The coordinator asked (empty when servers were asked directly).
  std::string coordinator;
  // From the coordinator; nullopt when servers were asked directly.
  std::optional<v1::ListMembersResponse> members;
  // The coordinator's slot moves (nullopt: asked servers directly, or the
  // coordinator does not serve ListMoves).
  std::optional<v1::ListRebalanceMovesResponse> moves;
  // How the map places the tables, from GetPlan: "planned (plan 1, ...)"
  // or "even (why)"; empty when servers were asked directly.
  std::string sharding;
  // The current map (epoch 0 when there is none yet; `map_error` says why).
  v1::ShardMap map;
  std::string map_error;
  // Servers asked for Stats: the map's servers in map order, then alive
  // shard-server members the map does not list; or the --server list.
  std::vector<std::string> servers;
  // One per entry of `servers`.
  std::vector<absl::StatusOr<v1::StatsResponse>> stats;
  // When the Stats answers came back.
  absl::Time taken;
};

class ClusterReader {
 public:
  // INVALID_ARGUMENT when neither a coordinator nor a server is given.
  static absl::StatusOr<std::unique_ptr<ClusterReader>> Create(
      ClusterReaderOptions options);

  // Fails (with the coordinator's or the servers' error, naming the
  // address) only when the coordinator cannot be asked, or no server asked
  // directly answers. Channels are kept, so a second Read reuses them.
  absl::StatusOr<ClusterSnapshot> Read(bool include_slots);

  // Coordinator.ForgetMember: removes an expired or left member; returns it
  // as it was listed. The coordinator's error (naming the address) when it
  // refuses, e.g. FAILED_PRECONDITION for a live member.
  absl::StatusOr<v1::Member> ForgetMember(const std::string& member_id);

 private:
  explicit ClusterReader(ClusterReaderOptions options)
      : options_(std::move(options)) {}
  std::shared_ptr<grpc::Channel> Channel(const std::string& address);
  absl::Status ReadFromCoordinator(ClusterSnapshot* snapshot);
  absl::Status ReadMapFromServers(ClusterSnapshot* snapshot);
  void ReadStats(bool include_slots, ClusterSnapshot* snapshot);

  const ClusterReaderOptions options_;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_;
};

}  // namespace recps::client::admin

#endif  // RECPS_CLIENT_ADMIN_CLUSTER_READER_H_
