// A shard server's calls to another shard server: during a slot move (the
// target pulls rows from the source; the source asks the target to finish
// or abort), and a primary's pushes forwarded to a backup (replication). An interface, so ShardServer stays free of gRPC: recps-shard
// gives it the gRPC implementation (shard_peer_grpc.h).
#ifndef RECPS_SERVER_SHARD_SHARD_PEER_H_
#define RECPS_SERVER_SHARD_SHARD_PEER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "recps/v1/shard.pb.h"
#include "recps/v1/shard_admin.pb.h"

namespace recps::server {

class ShardPeer {
 public:
  virtual ~ShardPeer() = default;
  // Streams ShardAdmin.ExportRows from the peer, calling on_chunk for each
  // chunk in order; a non-OK status from on_chunk cancels the stream and is
  // returned. `timeout` bounds the whole stream.
  virtual absl::Status ExportRows(
      const v1::ExportRowsRequest& request, absl::Duration timeout,
      absl::FunctionRef<absl::Status(v1::ExportRowsChunk&)> on_chunk) = 0;
  virtual absl::StatusOr<v1::FinishMoveResponse> FinishMove(
      const v1::FinishMoveRequest& request, absl::Duration timeout) = 0;
  virtual absl::StatusOr<v1::AbortMoveResponse> AbortMove(
      const v1::AbortMoveRequest& request, absl::Duration timeout) = 0;
  // EmbeddingShard.ReplicatePush, asynchronously: done runs once, from a gRPC
  // thread (or here, when the peer was shut down).
  virtual void ReplicatePush(v1::ReplicatePushRequest request,
                             absl::Duration timeout,
                             std::function<void(absl::Status)> done) = 0;
  // Cancels every call in flight (they return CANCELLED); later calls fail
  // at once. For shutdown.
  virtual void Shutdown() = 0;
};

// Makes a peer for a shard server's data-plane address.
using ConnectPeerFn =
    std::function<std::unique_ptr<ShardPeer>(const std::string& address)>;

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_SHARD_PEER_H_
