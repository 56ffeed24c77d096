// Channels and credentials: every recps process makes its gRPC channels and
// listening ports here, and nowhere else, so that transport security (mutual
// TLS, identities) changes this file only.
#ifndef RECPS_COMMON_RPC_CHANNELS_H_
#define RECPS_COMMON_RPC_CHANNELS_H_

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace recps::rpc {

// How a process authenticates its peers. Today every channel is plaintext;
// the TLS files and the caller's identity will be fields here.
struct TransportSecurity {
  // Plaintext gRPC. The only mode so far.
  bool insecure = true;
};

// What kind of peer a channel reaches: sets the reconnect and message-size
// arguments that suit it.
enum class ChannelKind {
  // Control plane (coordinator, admin): small messages, reconnect within a
  // second after the peer restarts (gRPC's default backoff grows to two
  // minutes).
  kControl,
  // Data plane (shard lookups and pushes): no message size limit on our
  // side (the server enforces its own), default reconnect pacing.
  kData,
};

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(
    const TransportSecurity& security);
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(
    const TransportSecurity& security);

// A channel to `address` ("host:port"). Never fails: gRPC connects lazily,
// and a bad address surfaces as UNAVAILABLE on the first call.
std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& address, ChannelKind kind,
    const TransportSecurity& security = TransportSecurity());

// Sets a call's deadline `timeout` from now (every client call has one).
void SetTimeout(absl::Duration timeout, grpc::ClientContext* context);
void SetDeadline(absl::Time deadline, grpc::ClientContext* context);

}  // namespace recps::rpc

#endif  // RECPS_COMMON_RPC_CHANNELS_H_
