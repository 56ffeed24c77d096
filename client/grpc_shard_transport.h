// The shard transport over gRPC (shard_transport.h): one channel per server,
// callback calls with a deadline, rows of a lookup copied from gRPC's
// buffers straight to the caller's on the thread that received them.
//
// To a server on this host's loopback, a push's bytes and a lookup's answer
// go through the worker's shared memory instead (same-host rows,
// common/wire/same_host_memory.h); the call itself, and everything else,
// stays gRPC. A server that cannot map the memory answers a lookup as usual
// and refuses a shared push, which is then sent as bytes; from then on that
// server gets bytes only (of lookups, of pushes).
#ifndef RECPS_CLIENT_GRPC_SHARD_TRANSPORT_H_
#define RECPS_CLIENT_GRPC_SHARD_TRANSPORT_H_

#include <atomic>
#include <memory>
#include <string>

#include "common/wire/same_host_buffers.h"
#include "client/shard_transport.h"
#include "common/rpc/channels.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "recps/v1/shard.grpc.pb.h"

namespace recps::client::internal {

// A stub for EmbeddingShard.Lookup that hands back the serialized response,
// which the client parses itself (RoutedBatch::ConsumeLookup) so that rows are
// copied once, from gRPC's buffers to the caller's.
using RawLookupStub =
    grpc::TemplatedGenericStub<v1::LookupRequest, grpc::ByteBuffer>;
// The full method name RawLookupStub calls.
const std::string& LookupMethodName();
// A stub for EmbeddingShard.PushGradients that sends a request serialized
// by RoutedBatch::SerializePush (gradient rows copied once, into it).
using RawPushStub =
    grpc::TemplatedGenericStub<grpc::ByteBuffer, v1::PushGradientsResponse>;
const std::string& PushMethodName();
// EmbeddingShard.PushGradientsShared, through RawPushStub.
const std::string& PushSharedMethodName();

class GrpcShardTransport final : public ShardTransport {
 public:
  // Makes the channel to `address` (it connects on the first call).
  // `same_host_rows`: offer same-host rows when `address` is on loopback.
  GrpcShardTransport(const std::string& address,
                     const rpc::TransportSecurity& security,
                     bool same_host_rows = false);

  std::unique_ptr<ShardCall> NewLookup() override;
  std::unique_ptr<ShardCall> NewPush() override;
  bool works_on_caller_thread() const override { return false; }

  // Same-host rows: memory for this server's calls, or null when they are
  // not offered to it.
  SameHostBuffers* same_host() { return same_host_.get(); }
  bool shared_lookups() const { return shared_lookups_.load(std::memory_order_relaxed); }
  bool shared_pushes() const { return shared_pushes_.load(std::memory_order_relaxed); }
  // The server answered a lookup offered memory in bytes: lookups are
  // offered none from now on.
  void StopSharedLookups();
  // A shared push was accepted (said once in the log).
  void NoteSharedPush();
  // The server refused a shared push: pushes go as bytes from now on.
  void StopSharedPushes(absl::string_view why);

 private:
  const std::string address_;
  std::unique_ptr<RawPushStub> raw_push_;
  std::unique_ptr<RawLookupStub> raw_lookup_;
  const std::unique_ptr<SameHostBuffers> same_host_;
  std::atomic<bool> shared_lookups_;
  std::atomic<bool> shared_pushes_;
  std::atomic<bool> shared_push_seen_{false};
};

}  // namespace recps::client::internal

#endif  // RECPS_CLIENT_GRPC_SHARD_TRANSPORT_H_
