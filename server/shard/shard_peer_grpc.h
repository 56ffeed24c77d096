// ShardPeer over gRPC (ShardAdmin on the peer's address).
#ifndef RECPS_SERVER_SHARD_SHARD_PEER_GRPC_H_
#define RECPS_SERVER_SHARD_SHARD_PEER_GRPC_H_

#include <memory>
#include <string>

#include "common/rpc/channels.h"
#include "server/shard/shard_peer.h"

namespace recps::server {

// `same_host_rows`: pushes forwarded to a peer on loopback go through
// shared memory (common/wire/same_host_memory.h) until it refuses them.
std::unique_ptr<ShardPeer> ConnectGrpcShardPeer(
    const std::string& address,
    const rpc::TransportSecurity& security = rpc::TransportSecurity(),
    bool same_host_rows = false);

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_SHARD_PEER_GRPC_H_
