// ShardPeer over gRPC (ShardAdmin on the peer's address).
#ifndef RECPS_SERVER_SHARD_SHARD_PEER_GRPC_H_
#define RECPS_SERVER_SHARD_SHARD_PEER_GRPC_H_

#include <memory>
#include <string>

#include "common/rpc/channels.h"
#include "server/shard/shard_peer.h"

namespace recps::server {

std::unique_ptr<ShardPeer> ConnectGrpcShardPeer(
    const std::string& address,
    const rpc::TransportSecurity& security = rpc::TransportSecurity());

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_SHARD_PEER_GRPC_H_
