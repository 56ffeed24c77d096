// absl::Status <-> grpc::Status, in one place. The codes are the same
// numbers; a status carrying the shard-map epoch payload (kShardMapEpochKey,
// "your map is stale, the current epoch is N") sends it as trailing
// metadata, where the client reads it back.
#ifndef RECPS_COMMON_RPC_STATUS_CONVERSION_H_
#define RECPS_COMMON_RPC_STATUS_CONVERSION_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/wire/wire_format.h"  // kShardMapEpochKey
#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/status.h"

namespace recps::rpc {

// The status as gRPC sends it. An empty message gets the code's name, so
// that no caller ever prints an empty error.
grpc::Status ToGrpcStatus(const absl::Status& status);

// ToGrpcStatus, and the epoch payload (if any) added to `context`'s
// trailing metadata.
grpc::Status ToGrpcStatus(const absl::Status& status,
                          grpc::ServerContextBase* context);

// A finished call as an absl::Status whose message starts with who failed:
// "<peer>: <rpc>: <gRPC's message>" (no "<rpc>: " when rpc is empty).
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view peer,
                            absl::string_view rpc);

// Whether the server answered the call (so it no longer reads or writes
// the call's same-host memory): OK, or a refusal of the request itself. A
// deadline, a cancel or a broken channel may have left it at work.
bool ServerIsDone(const grpc::Status& status);

// Whether a same-host call (common/wire/same_host_memory.h) was refused for
// its memory, not for its request (kSameHostRefusal), or by a server that
// predates it (UNIMPLEMENTED): the caller then sends the bytes.
bool RefusedSameHost(const grpc::Status& status);

// The shard map epoch a server sent in `context`'s trailing metadata, if any.
std::optional<uint64_t> ShardMapEpochOf(const grpc::ClientContext& context);

// The epoch in a kShardMapEpochKey value (decimal digits, as a server
// writes it); nullopt for anything else. What ShardMapEpochOf parses.
std::optional<uint64_t> ParseShardMapEpoch(absl::string_view value);

}  // namespace recps::rpc

#endif  // RECPS_COMMON_RPC_STATUS_CONVERSION_H_
